"""The `cpu` backend: lowered kernels rendered to LLVM IR, compiled by llvmlite for the host CPU, run through
ctypes on host buffers. A kernel whose outer loop is thread-split runs in chunks on a thread pool (ctypes releases
the GIL while native code runs)."""
from __future__ import annotations

import ctypes
import hashlib
import os
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from fnx.backends.device import Backend, Buffer, Executable
from fnx.backends.llvm_render import render_module
from fnx.config import config
from fnx.lower.pipeline import STAGES, Lowering, lower
from fnx.uop import UOp


PIPELINE = "O3 loop-vectorize slp-vectorize"  # part of every cache key: change it when the pass pipeline changes


class ObjectCache:
    """Compiled machine code on disk, content-addressed by the LLVM IR, the target and the LLVM version.

    A file is `MAGIC + sha256(object) + object`, written to a temporary name and renamed (atomic), and checked
    against its digest when read: a damaged file is ignored and recompiled. Nothing is ever unpickled.
    """
    MAGIC = b"fnx-object-1\n"

    def __init__(self, directory: str | None, target_id: str):
        self.directory, self.target_id = directory, target_id
        self.hits = self.misses = 0

    def key(self, source: str) -> str:
        return hashlib.sha256(f"{self.target_id}\n{source}".encode()).hexdigest()

    def path(self, key: str) -> str:
        return os.path.join(self.directory, key[:2], key + ".o")

    def load(self, key: str) -> bytes | None:
        if self.directory is None: return None
        try:
            with open(self.path(key), "rb") as f: data = f.read()
        except OSError:
            return None
        n = len(self.MAGIC)
        head, digest, obj = data[:n], data[n:n + 32], data[n + 32:]
        return obj if head == self.MAGIC and hashlib.sha256(obj).digest() == digest else None

    def store(self, key: str, obj: bytes) -> None:
        if self.directory is None: return
        path = self.path(key)
        try:
            os.makedirs(os.path.dirname(path), exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=os.path.dirname(path), prefix=".tmp-")
            with os.fdopen(fd, "wb") as f: f.write(self.MAGIC + hashlib.sha256(obj).digest() + obj)
            os.replace(tmp, path)
        except OSError:  # a read-only or full disk only costs the cache
            pass


class LLVMCompiler:
    """llvmlite: parse, optimize at O3 with the loop and SLP vectorizers, and JIT for the host CPU; machine code
    is kept in the on-disk ObjectCache (FNX_CACHE_DIR), so a warm process skips LLVM's optimizer and code
    generator."""

    def __init__(self):
        import llvmlite
        import llvmlite.binding as llvm
        llvm.initialize_native_target()
        llvm.initialize_native_asmprinter()
        self.llvm = llvm
        target = llvm.Target.from_default_triple()
        cpu, features = llvm.get_host_cpu_name(), llvm.get_host_cpu_features().flatten()
        self.target, self.machine_options = target, dict(cpu=cpu, features=features, opt=3)
        self.machine = target.create_target_machine(**self.machine_options)
        self.cache = ObjectCache(config.cache_dir, f"{llvm.get_default_triple()} {cpu} {features} llvmlite "
                                                   f"{llvmlite.__version__} llvm {llvm.llvm_version_info} {PIPELINE}")

    def compile(self, source: str):
        llvm = self.llvm
        module = llvm.parse_assembly(source)
        module.verify()
        key = self.cache.key(source)
        cached = self.cache.load(key)
        if cached is None:
            self.cache.misses += 1
            tuning = llvm.create_pipeline_tuning_options(speed_level=3)
            tuning.loop_vectorization = tuning.slp_vectorization = True
            builder = llvm.create_pass_builder(self.machine, tuning)
            builder.getModulePassManager().run(module, builder)
        else:
            self.cache.hits += 1
        # the engine owns the target machine it is given and destroys it with itself: give each its own
        engine = llvm.create_mcjit_compiler(module, self.target.create_target_machine(**self.machine_options))
        engine.set_object_cache(notify_func=lambda _, obj: self.cache.store(key, obj) if cached is None else None,
                                getbuffer_func=lambda _: cached)
        engine.finalize_object()
        return engine, module


class CPUExecutable(Executable):
    def __init__(self, fn: UOp, device: str, compiler: LLVMCompiler, pool: ThreadPoolExecutor, threads: int):
        self.fn, self.device, self.pool, self.threads = fn, device, pool, threads
        self.lowering: Lowering = lower(fn, threads)
        compiled = [(k, lines) for k, lines in self.lowering.kernels if lines is not None]
        self.source = render_module(compiled) if compiled else ""
        if config.debug >= 3:
            for stage in STAGES: print(f"--- {stage} ---\n{self.lowering.as_text(stage)}")
        if config.debug >= 4: print(self.source)
        self.engine, self.module = compiler.compile(self.source) if self.source else (None, None)
        self.launches = []
        for kernel, lines in self.lowering.kernels:
            if lines is None:  # a control-flow step: run on the host
                self.launches.append((kernel, None, 0))
                continue
            nargs = max(len(kernel.args), 1)
            proto = ctypes.CFUNCTYPE(None, *([ctypes.c_void_p] * nargs), ctypes.c_int64, ctypes.c_int64)
            func = proto(self.engine.get_function_address(kernel.name))
            outer = kernel.ranges[kernel.thread_range].arg[1] if kernel.thread_range >= 0 else 1
            self.launches.append((kernel, func, outer))
        schedule, plan = self.lowering.schedule, self.lowering.memory
        # what each call allocates: (buffer id, dtype, size, memory-plan slot or None), worked out once
        self.allocations = [(i, spec.dtype, spec.size, plan.slot_of.get(i))
                            for i, spec in enumerate(schedule.buffers) if spec.kind != "input"]

    def __call__(self, inputs: list[Buffer]) -> list[Buffer]:
        schedule = self.lowering.schedule
        buffers: list[Buffer | None] = list(inputs) + [None] * (len(schedule.buffers) - len(inputs))
        slots = [np.empty(n, np.uint8) for n in self.lowering.memory.slot_bytes]  # shared by disjoint lifetimes
        for i, dtype, size, slot in self.allocations:
            host = None if slot is None else slots[slot][:size * dtype.itemsize].view(dtype.np)
            buffers[i] = Buffer(self.device, dtype, size, host)
        for kernel, func, outer in self.launches:
            if func is None:
                self._control(kernel, buffers)
                continue
            args = [buffers[b].ptr for b in kernel.args] or [0]
            start = time.perf_counter() if config.debug else 0.0
            if kernel.thread_range >= 0:
                chunk = -(-outer // self.threads)
                jobs = [self.pool.submit(func, *args, lo, min(lo + chunk, outer)) for lo in range(0, outer, chunk)]
                for job in jobs: job.result()
            else:
                func(*args, 0, outer)
            if config.debug:
                detail = f" {kernel.name} loops={[r.arg[1] for r in kernel.ranges + kernel.reduce_ranges]}" \
                    if config.debug >= 2 else ""
                print(f"fnx: kernel{detail} {1e6 * (time.perf_counter() - start):.1f} us")
        return [buffers[b] for b in schedule.outputs]

    def _control(self, step, buffers: list[Buffer]) -> None:
        """Run a control-flow node: its bodies are compiled functions called from a host loop."""
        from fnx.backends.control import run_control
        from fnx.trace import compile_function

        def prepare(fn: UOp):
            exe, shapes, device = compile_function(fn, self.device), [o.shape for o in fn.src[0].src], self.device
            return lambda values: [b.numpy(s) for b, s in zip(exe([Buffer.from_numpy(device, v) for v in values]),
                                                               shapes)]
        inputs = [buffers[i].numpy(step.node.operands[j].shape) for j, i in enumerate(step.inputs)]
        for out_id, value in zip(step.outputs, run_control(step.node, inputs, prepare)):
            buffers[out_id] = Buffer.from_numpy(self.device, value)

    def as_text(self, stage: str | None = None) -> str:
        if stage in STAGES: return self.lowering.as_text(stage)
        if stage == "llvm": return self.source
        if stage == "asm": return self.compiler_asm()
        stages = [f"--- {s} ---\n{self.lowering.as_text(s)}" for s in STAGES]
        return "\n\n".join(stages + [f"--- llvm ---\n{self.source}"])

    def compiler_asm(self) -> str:
        return _compiler().machine.emit_assembly(self.module) if self.module is not None else ""


_state: dict = {}


def _compiler() -> LLVMCompiler:
    if "compiler" not in _state: _state["compiler"] = LLVMCompiler()
    return _state["compiler"]


def backend() -> Backend:
    threads = config.cpu_threads
    pool = ThreadPoolExecutor(max_workers=threads, thread_name_prefix="fnx-cpu")
    return Backend("cpu", lambda fn, device: CPUExecutable(fn, device, _compiler(), pool, threads))

