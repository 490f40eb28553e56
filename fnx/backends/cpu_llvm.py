"""The `cpu` backend: lowered kernels rendered to LLVM IR, compiled by llvmlite for the host CPU, run through
ctypes on host buffers. A kernel whose outer loop is thread-split runs in chunks on a thread pool (ctypes releases
the GIL while native code runs)."""
from __future__ import annotations

import contextlib
import ctypes
import operator
import os
import sys
import threading
import time
from concurrent import futures
from concurrent.futures import ThreadPoolExecutor

import llvmlite
import llvmlite.binding as llvm
from llvmlite.binding import ffi
import numpy as np

from fnx.backends.device import (Buffer, Device, Executable, HostAllocator, HostCall, HostPool, Launch, LRUCache,
                                 ObjectCache,
                                 Pending, Program, RemoteDevice, Renderer, Runtime, Stream, Transfer, check_platform,
                                 get_device, processes, register_runtime)
from fnx import events
from fnx.backends import native_pool
from fnx.backends.cpu_beam import kernel_timers
from fnx.backends.chain_driver import render_driver
from fnx.backends.cpu_target import host_target
from fnx.backends.control import run_control
from fnx.backends.scan_loop import compile_cond, compile_scan, compile_while
from fnx.backends.shared_libraries import Library, SharedLibraries
from fnx.backends.llvm_render import module_source, render_function
from fnx.backends.lowering_cache import LoweringCache
from fnx.config import config, usable_cpus
from fnx.lower import chain as row_chains
from fnx.lower.memory import donation_aliases
from fnx.lower.optimize import overriding
from fnx.lower.pipeline import STAGES, lower
from fnx.lower.rangeify import HostStep, TransferStep
from fnx.lower.target import Target
from fnx.uop import Ops, UOp


ASYNC_MIN_WORK = 1 << 22  # loop iterations from which a call on an idle stream is queued (see CPUExecutable)
_BYTES = np.dtype(np.uint8)
PIPELINE = "O2 slp-vectorize"  # part of every cache key: change it when the pass pipeline changes


def _llvm_workers() -> int:
    """Threads compiling LLVM modules at once: one per core (LLVM's optimizer and code generator release the GIL,
    and a cold program's modules are independent), at most 4 (more only contend with lowering's own thread)."""
    return max(1, min(4, usable_cpus()))


class _LLVMThreads:
    """The threads every LLVM call of fnx runs on. Each module is parsed into an LLVM context of its own, so
    modules compile at once on several threads and no two threads ever share a context: LLVM contexts are not
    thread-safe, and a module freed later (on whatever thread drops the last reference) touches only its own.
    `idle` waits for every call in flight (before a fork: a child must not inherit LLVM mid-call)."""

    def __init__(self):
        self.pool = ThreadPoolExecutor(_llvm_workers(), thread_name_prefix="fnx-llvm")
        self.in_flight: set = set()
        self.lock = threading.Lock()

    def submit(self, fn, *args):
        future = self.pool.submit(fn, *args)
        with self.lock: self.in_flight.add(future)
        future.add_done_callback(self._done)
        return future

    def _done(self, future) -> None:
        with self.lock: self.in_flight.discard(future)

    def idle(self) -> None:
        with self.lock: pending = list(self.in_flight)
        futures.wait(pending)  # (an error stays in its future, for its caller)


_llvm_thread = _LLVMThreads()


def _llvm_idle() -> None:
    """Before a fork: let the LLVM threads finish what they run."""
    try:
        _llvm_thread.idle()
    except RuntimeError:  # the interpreter is shutting down: nothing runs there any more
        pass


def _llvm_restart() -> None:
    """In a forked child: the parent's LLVM threads are not there; start others."""
    global _llvm_thread
    _llvm_thread = _LLVMThreads()


if hasattr(os, "register_at_fork"): os.register_at_fork(before=_llvm_idle, after_in_child=_llvm_restart)


class LLVMCompiler:
    """llvmlite: parse, optimize at O2 with the SLP vectorizer, and JIT for the CPU of its `target` (the host's
    unless FNX_CPU_TARGET names another); machine code is kept in the on-disk ObjectCache (FNX_CACHE_DIR), so a
    warm process skips LLVM's optimizer and code generator.

    All of it runs on LLVM threads of its own (`submit` returns a future): LLVM compiles modules while the caller
    lowers the next kernels (the ctypes calls into LLVM release the GIL), one module per thread at a time, each
    in its own LLVM context with its thread's own target machine. Setting LLVM up for the host CPU is the first
    job (loading its library is part of `import fnx`, as loading XLA is part of `import jax`).
    """

    def __init__(self, target: Target):
        self.target = target
        self._local = threading.local()  # per LLVM thread: its target machine for the optimizer
        self._ready = _llvm_thread.submit(self._setup)

    def _setup(self) -> None:
        llvm.initialize_native_target()
        llvm.initialize_native_asmprinter()
        try:  # without F16C, LLVM converts float16 by calling libgcc's __extendhfsf2/__truncsfhf2, and JIT code
            llvm.load_library_permanently("libgcc_s.so.1")  # finds only libraries loaded so (else it calls 0)
        except RuntimeError:  # no libgcc (macOS: those are in libSystem, already loaded)
            pass
        self.llvm = llvm
        triple, cpu, features = self.target.triple, self.target.name, self.target.features
        self.llvm_target = llvm.Target.from_triple(triple)
        self.machine_options = dict(cpu=cpu, features=features, opt=3)
        # (the target's other facts shaped the IR, which the key hashes too)
        target_id = (f"{triple} {cpu} {features} llvmlite {llvmlite.__version__} llvm {llvm.llvm_version_info} "
                     f"{PIPELINE}")
        self._cache = ObjectCache(config.cache_dir, target_id)
        self._libraries = SharedLibraries(config.cache_dir, target_id)

    @property
    def _machine(self):
        """This thread's target machine (LLVM's TargetMachine is not shared between threads)."""
        if (machine := getattr(self._local, "machine", None)) is None:
            machine = self._local.machine = self.llvm_target.create_target_machine(**self.machine_options)
        return machine

    @property
    def cache(self) -> ObjectCache:
        self._ready.result()
        return self._cache

    def compile(self, source: str):
        """(engine, module) of LLVM IR `source`, compiled on an LLVM thread."""
        return self.submit(source).result()

    def submit(self, source: str, report: bool = True):
        """A future of `compile(source)`; `report=False` for work ahead of need (no event: FNX_DEBUG would print it
        whenever it finished, in the middle of the program's own output)."""
        return _llvm_thread.submit(self._compiled, source, events.current_name() if report else None)

    def submit_object(self, source: str):
        """A future of (object code, module) of LLVM IR `source`, compiled on an LLVM thread; `link` makes the
        objects of several modules one engine."""
        return _llvm_thread.submit(self._timed_object, source, events.current_name())

    def library(self, sources: list[str]) -> Library | None:
        """The shared library an earlier process linked from the modules of `sources`, when the cache has it
        (fnx/backends/shared_libraries.py)."""
        self._ready.result()
        return self._libraries.open(self._library_key(sources))

    def keep_library(self, sources: list[str], objects: list[bytes]) -> None:
        """Have the modules of `sources`, compiled to `objects`, linked into a shared library at exit."""
        self._libraries.keep(self._library_key(sources), objects)

    def _library_key(self, sources: list[str]) -> str:
        return self._libraries.key([self._cache.key(source) for source in sources])

    def link(self, objects: list[bytes]):
        """One engine holding the machine code of every object (linking each module's in an engine of its own
        costs ~1.7 ms a module: a target machine, an engine and a finalize each)."""
        return _llvm_thread.submit(self._engine, objects).result()

    def _compiled(self, source: str, name: str):
        obj, module = self._timed_object(source, name)
        return self._engine([obj]), module

    def _timed_object(self, source: str, name: str | None):
        """`_object` on an LLVM thread, reported as one event per module under the name of whose it is (None: not
        reported)."""
        if name is None or not events.active: return self._object(source)[:2]
        with events.span("llvm", f"{name}: LLVM module", chars=len(source)) as found:
            obj, module, hit = self._object(source)
            found.update(object_cache="hit" if hit else "miss")
        return obj, module

    def assembly(self, modules: list) -> str:
        """The assembly of compiled modules; a module linked from the disk cache is its IR source (it was never
        parsed), compiled again here as it was the first time."""
        def text(module) -> str:
            if isinstance(module, str):
                module = self._optimized(self.llvm.parse_assembly(module, self.llvm.create_context()))
            return self._machine.emit_assembly(module)
        return _llvm_thread.submit(lambda: "\n".join(text(m) for m in modules)).result()

    def _optimized(self, module):
        """`module` through LLVM's optimizer (outside llvmlite's lock: see `_unlocked`)."""
        llvm = self.llvm
        # vectors are explicit in the IR (the optimizer's lanes): LLVM's loop vectorizer is not needed, and O2
        # compiles about 15% faster than O3 with no measured loss; SLP still packs unrolled scalar code
        tuning = llvm.create_pipeline_tuning_options(speed_level=2)
        tuning.loop_vectorization, tuning.slp_vectorization = False, True
        builder = llvm.create_pass_builder(self._machine, tuning)  # (one a module: a run leaves callbacks in it)
        passes = builder.getModulePassManager()
        try:
            _unlocked("LLVMPY_RunNewModulePassManager")(passes, module, builder)
        finally:
            _dispose_pass_manager(passes)
        return module

    def _object(self, source: str) -> tuple:
        """(object code, module, whether the object code came from the disk cache). Object code found in the cache
        is used as it is: its IR is not even parsed (parsing was most of a warm module's cost), and the module
        handed back is then the IR source."""
        self._ready.result()
        llvm = self.llvm
        key = self._cache.key(source)
        obj = self._cache.load(key)
        hit = obj is not None
        if hit:
            self._cache.hits += 1
            module = source
        else:
            self._cache.misses += 1
            module = llvm.parse_assembly(source, llvm.create_context())
            module.verify()
            obj = _object_code(self._machine, self._optimized(module))
            self._cache.store(key, obj)
        return obj, module, hit

    def _engine(self, objects: list[bytes]):
        """An engine that links the object code (into an empty module of its own); it owns the target machine it
        is given and destroys it with itself: give each its own."""
        llvm = self.llvm
        engine = llvm.create_mcjit_compiler(llvm.parse_assembly("", llvm.create_context()),
                                            self.llvm_target.create_target_machine(**self.machine_options))
        for obj in objects: engine.add_object_file(llvm.ObjectFileRef.from_data(obj))
        engine.finalize_object()
        return engine


def _unlocked(name: str):
    """llvmlite's C function `name` without the lock llvmlite takes around every call into LLVM (one call at a time
    in the whole process). fnx calls its two long ones so, the optimizer and the code generator: each call works on
    a module in an LLVM context of its own with its thread's own target machine, which LLVM allows on several
    threads at once (as its own parallel code generation does), and ctypes releases the GIL meanwhile. Where
    llvmlite no longer wraps its functions so, this is the function itself."""
    function = getattr(ffi.lib, name)
    return getattr(function, "_cfn", function)


def _dispose_pass_manager(passes) -> None:
    """Free a module pass manager. llvmlite 0.50's ModulePassManager never frees its pipeline: the no-op
    ObjectRef._dispose comes before NewPassManager's in its bases, so closing it or dropping it leaks the whole
    O2 pipeline, 30 KB a module (eager code on ever new shapes grew by 100 KB a shape; with this, 2 KB)."""
    if type(passes)._dispose is ffi.ObjectRef._dispose:
        ffi.lib.LLVMPY_DisposeNewModulePassManger(passes)
        passes.detach()
    else:  # (an llvmlite that frees it itself)
        passes.close()


def _object_code(machine, module) -> bytes:
    """The module's ELF object code from `machine` (TargetMachine.emit_object, outside llvmlite's lock)."""
    with ffi.OutputString() as error:
        buffer = _unlocked("LLVMPY_TargetMachineEmitToMemory")(machine, module, 1, error)
        if not buffer: raise RuntimeError(f"LLVM code generation failed: {error}")
    try:
        return ctypes.string_at(ffi.lib.LLVMPY_GetBufferStart(buffer), ffi.lib.LLVMPY_GetBufferSize(buffer))
    finally:
        ffi.lib.LLVMPY_DisposeMemoryBuffer(buffer)


_handoffs = {"depth": 0, "saved": 0.005}
_handoffs_lock = threading.Lock()


@contextlib.contextmanager
def _quick_gil_handoffs(interval: float = 0.001):
    """While lowering runs Python on this thread, the LLVM thread returns from each call into LLVM needing the
    GIL back: a 1 ms switch interval instead of Python's 5 ms lets it continue sooner (measured: the first call of
    the MLP step 0.25 -> 0.23 s). Nested and concurrent compiles restore the interval once, at the end."""
    with _handoffs_lock:
        if _handoffs["depth"] == 0:
            _handoffs["saved"] = sys.getswitchinterval()
            sys.setswitchinterval(min(interval, _handoffs["saved"]))
        _handoffs["depth"] += 1
    try:
        yield
    finally:
        with _handoffs_lock:
            _handoffs["depth"] -= 1
            if _handoffs["depth"] == 0: sys.setswitchinterval(_handoffs["saved"])


class LLVMRenderer(Renderer):
    """Linear kernels -> one LLVM IR module (fnx/backends/llvm_render.py); `kernel` renders one, so the CPU
    backend can cut a function's kernels into modules of a size that compiles well."""

    def kernel(self, kernel, lines) -> tuple[str, set]:
        return render_function(kernel, lines)

    def module(self, pieces: list[tuple[str, set]]) -> str:
        return module_source(pieces)

    def render(self, kernels: list) -> str:
        return self.module([self.kernel(k, lines) for k, lines in kernels])


class CPUProgram(Program):
    """One compiled kernel: `program(*buffers, dims=(lo, hi))` runs iterations lo..hi of its outer loop. The
    executable calls `func` directly with addresses (the lean path); `packed` is the entry point the native
    worker pool calls (0 when the kernel never runs in chunks)."""

    def __init__(self, name: str, engine, nargs: int, packed: bool):
        self.name, self.engine = name, engine  # the engine owns the code: it lives as long as the program
        proto = ctypes.CFUNCTYPE(None, *([ctypes.c_void_p] * nargs), ctypes.c_int64, ctypes.c_int64)
        self.func = proto(engine.get_function_address(name))
        self.packed = engine.get_function_address(f"{name}_packed") if packed else 0

    def __call__(self, *buffers: Buffer, dims: tuple = (0, 1)) -> None:
        self.func(*([b.ptr for b in buffers] or [0]), *dims)


class _Modules:
    """Kernels rendered as lowering finishes them and compiled a module at a time on the LLVM thread."""
    CHUNK = 16_000  # characters of IR per module: a module costs ~2.5 ms of fixed LLVM work

    def __init__(self, compiler: LLVMCompiler, renderer: LLVMRenderer):
        self.compiler, self.renderer, self.pending, self.size = compiler, renderer, [], 0
        self.jobs: list[tuple[list[str], object]] = []   # (kernel names, future of (object code, module) or None)
        self.sources: list[str] = []
        self.library: Library | None = None  # every module's code, linked by an earlier process (no jobs then)
        self.objects: tuple[bytes, ...] = ()  # the object code that `finish` linked with MCJIT

    def add(self, kernels: list) -> None:
        for kernel, lines in kernels:
            if lines is None or kernel.code: continue  # (a copy runs its original's function)
            text, declares = self.renderer.kernel(kernel, lines)
            self.pending.append((kernel.name, text, declares))
            self.size += len(text)
        if self.size >= self.CHUNK: self.flush()

    def flush(self) -> None:
        if not self.pending: return
        source = self.renderer.module([(t, d) for _, t, d in self.pending])
        self.sources.append(source)
        self.jobs.append(([name for name, _, _ in self.pending], self.compiler.submit_object(source)))
        self.pending, self.size = [], 0

    def finish(self) -> tuple[dict, list]:
        """{kernel name: its engine} and the modules, once every module is compiled: one engine links them all
        (or the library an earlier process linked them into)."""
        self.flush()
        if not self.jobs: return {}, []
        if self.library is not None: return {n: self.library for names, _ in self.jobs for n in names}, self.sources
        self.objects, modules = zip(*(job.result() for _, job in self.jobs))
        engine = self.compiler.link(list(self.objects))
        return {n: engine for names, _ in self.jobs for n in names}, list(modules)

    def keep(self) -> None:
        """Have the modules MCJIT linked here linked into a library at exit, for later processes (whose lowering
        comes from the disk cache)."""
        if self.library is None and self.objects: self.compiler.keep_library(self.sources, list(self.objects))


_lowerings = LRUCache(256)


def _alias(buf: Buffer) -> Buffer:
    """An output that is one of the inputs (a reshape, an identity) as a Buffer of its own over a numpy view of
    the same memory: donating either Array later sees the other (Allocator.unshared counts views), so neither is
    deleted with the other. (As one Buffer, `jit(f, donate_argnums=0)(x.reshape(-1))` deleted x too; in JAX a
    reshape is a new array.)"""
    host = buf._host
    if type(buf) is not Buffer or host is None: return buf
    return Buffer(buf.device, buf.dtype, buf.size, host.view(), buf.ptr, buf.ready)


def _run_chunks(func, values: tuple, chunks: tuple) -> None:
    for lo, hi in chunks: func(*values, lo, hi)


def _lowered(fn: UOp, device: CPUDevice) -> tuple:
    """(lowering, {kernel: engine}, modules, source) of `fn` for the device's target, shared by the cpu devices of
    equal targets: the program every device of a mesh runs is lowered and compiled once, not once per device (its
    PARAMs name no device, so nothing in it differs between them)."""
    key = (fn, device.target)
    if (found := _lowerings.get(key)) is not None: return found
    modules = _Modules(device.compiler, device.renderer)  # LLVM compiles the first kernels while later are lowered
    disk = _lowering_cache(device.target)
    disk_key = disk.key(fn) if not config.beam and not overriding() else None
    with _quick_gil_handoffs():
        start = time.perf_counter()
        def link(sources):  # lowered by an earlier process: its modules' object code is in the compile cache too,
            modules.library = device.compiler.library([source for _, source in sources])  # maybe a library of it
            for names, source in sources:  # (else read on the LLVM threads while the kernels are decoded)
                modules.sources.append(source)
                modules.jobs.append((names, None if modules.library else device.compiler.submit_object(source)))
        hit = disk.load(disk_key, fn, link) if disk_key is not None else None
        if hit is not None and events.active:
            events.finished("lower", events.current_name(), start, lowering_cache="hit",
                            kernels=sum(lines is not None for _, lines in hit[0].kernels))
        if hit is not None:
            lowering = hit[0]
        else:
            modules.sources.clear()  # (an entry that failed to decode after its modules were submitted)
            modules.jobs.clear()
            modules.library = None
            lowering = lower(fn, device.target, emit=modules.add, measure=device.kernel_timers(), chains=True)
            if lowering.chains:  # (their drivers call the kernels through addresses: a module of their own)
                source = module_source([render_driver(c) for c in lowering.chains])
                modules.sources.append(source)
                modules.jobs.append(([c.name for c in lowering.chains], device.compiler.submit_object(source)))
        if any(k.thread_range >= 0 for k, lines in lowering.kernels if lines is not None):
            native_pool.start(device.compiler, device.threads - 1)  # (while LLVM finishes: the first run uses it)
        engine_of, compiled = modules.finish()
    if hit is None and disk_key is not None:
        if disk.store(disk_key, lowering, [(names, source) for (names, _), source in zip(modules.jobs,
                                                                                        modules.sources)]):
            modules.keep()
    elif hit is not None:
        modules.keep()
    found = (lowering, engine_of, compiled, "\n\n".join(modules.sources))
    if all(p.device is None for p in fn.src[1:]): _lowerings.put(key, found)  # (others are per device anyway)
    return found


_disk_lowerings: dict = {}


def _lowering_cache(target: Target) -> LoweringCache:
    """The on-disk lowering cache of `target` (fnx/backends/lowering_cache.py)."""
    if (found := _disk_lowerings.get((target, config.cache_dir))) is None:
        found = _disk_lowerings[(target, config.cache_dir)] = LoweringCache(target, PIPELINE)
    return found


QUEUE_MIN_WORK = 1 << 16  # loop iterations from which call_async hands a call to the device's stream


class CPUExecutable(Executable):
    """Runs the kernels of one FUNCTION in order on host buffers.

    Per call: output buffers come from the device's `HostPool` (so a 64 MB result does not page-fault in fresh
    memory each call), the memory plan's slots come from it too and go back when the call ends, and donated
    inputs hold the outputs `donation_aliases` allows.

    Dispatch is asynchronous where it does not cost: a call is queued on the device's `Stream` and returns at
    once when its loops run at least ASYNC_MIN_WORK iterations, or when earlier calls are still queued (order
    is what keeps results right); its outputs carry a `Pending` that every host read waits for, and an error
    it raises is raised by that read. Anything smaller runs inline on an idle stream: handing a call to the
    worker thread measured 20-70 us (a 1-element call went from 8 to 35-50 us), while at 4M iterations
    (about 1 ms) queued and inline calls time the same within noise, on 2 cores. Calls with host control
    steps (loops that read values) and transfers to other devices run inline once the queue has drained.

    `items` records the schedule (fnx.backends.device: Launch, Transfer, HostCall); `launches` is the same list
    prepared for replaying it fast.
    """

    def __init__(self, fn: UOp, device: CPUDevice):
        self.fn, self.device, self.pool, self.threads = fn, device.name, device.pool, device.threads
        self.memory, self.stream, compiler = device.memory, device.stream, device.compiler
        self.target = device.target
        self.lowering, engine_of, self.modules, self.source = _lowered(fn, device)
        if config.debug >= 3:
            for stage in STAGES: print(f"--- {stage} ---\n{self.lowering.as_text(stage)}")
        if config.debug >= 4: print(self.source)
        self.engines = list(dict.fromkeys(engine_of.values()))  # the code must live as long as this executable
        # per step: (kernel, ctypes function or None for a host step, its argument addresses from a call's list of
        # addresses, its whole loop range when it runs as one piece, else None, and its thread chunks)
        self.launches: list[tuple] = []
        self.packed: dict[str, int] = {}
        self.programs: dict[str, CPUProgram] = {}
        self.compiler = compiler
        threads = self.threads
        schedule = self.lowering.schedule
        self.buffers, self.output_ids = schedule.buffers, list(schedule.outputs)
        self.items: list = []
        self.tables: list = []
        chains = {c.first: c for c in self.lowering.chains}
        skip = 0
        for i, (kernel, lines) in enumerate(self.lowering.kernels):
            if (chain := chains.get(i)) is not None:
                self._add_chain(chain, engine_of)
                skip = len(chain.members)
            if skip:  # (a member of a chain: its driver calls it)
                skip -= 1
                continue
            if lines is None:  # a control-flow step or a transfer: done on the host
                self.launches.append((kernel, None, None, None, ()))
                self.items.append(self._host_item(kernel))
                continue
            outer = kernel.thread_size
            split = kernel.thread_range >= 0 and threads > 1  # (chunks the threads take in turn: native_pool)
            step = -(-outer // (threads * row_chains.CHUNKS_PER_THREAD)) if split else outer
            chunks = tuple((lo, min(lo + step, outer)) for lo in range(0, outer, max(step, 1))) or ((0, 0),)
            args = tuple(kernel.args) or (-1,)  # -1: the 0 at the end of the list of addresses
            addresses = operator.itemgetter(*args) if len(args) > 1 else lambda ptrs, b=args[0]: (ptrs[b],)
            # (the native pool calls a kernel that runs in chunks through its packed entry point)
            code = kernel.code or kernel.name
            program = CPUProgram(code, engine_of[code], max(len(kernel.args), 1), len(chunks) > 1)
            self.programs[kernel.name] = program
            if program.packed: self.packed[kernel.name] = program.packed
            self.launches.append((kernel, program.func, addresses, chunks[0] if len(chunks) == 1 else None, chunks))
            self.items.append(Launch(kernel.name, self._device_of(kernel), tuple(kernel.args), chunks))
        check_platform(self.items, self.device)
        self.has_control = any(func is None for _, func, _, _, _ in self.launches)
        self.work = sum(k.work for k, func, _, _, _ in self.launches if func is not None)
        self.queue_when_idle = self.work >= ASYNC_MIN_WORK and not self.has_control
        plan = self.lowering.memory
        loop_outputs = {b for k, _ in self.lowering.kernels if isinstance(k, HostStep) for b in k.outputs}
        # what each call allocates, worked out once: outputs (buffer id, dtype, numpy dtype, size, device, its
        # memory) and the memory plan's slots; `ptrs` holds every buffer's address in a call (plus a 0 for
        # argument-less kernels). An output computed after a COPY lives on the COPY's device.
        self.outputs = [(i, spec.dtype, spec.dtype.np, spec.size, *self._memory_of(spec))
                        for i, spec in enumerate(schedule.buffers) if spec.kind == "output" and i not in loop_outputs]
        ninputs = sum(spec.kind == "input" for spec in schedule.buffers)
        self.no_addresses = [0] * (len(schedule.buffers) + 1)
        self.no_buffers = [None] * (len(schedule.buffers) - ninputs)
        self.outputs_in_order = self.output_ids == [i for i, *_ in self.outputs]  # each output computed, once
        self.slot_bytes = list(plan.slot_bytes)
        simple = not self.has_control and not self.queue_when_idle and not self.slot_bytes and all(
            whole is not None for _, _, _, whole, _ in self.launches)
        self.inline = [(func, addresses, whole) for _, func, addresses, whole, _ in self.launches] if simple else None
        self.slotted = [(i, slot, schedule.buffers[i].dtype, schedule.buffers[i].size)
                        for i, slot in plan.slot_of.items()]
        self._aliases: dict[tuple[int, ...], dict[int, int]] = {}

    def _add_chain(self, chain, engine_of: dict) -> None:
        """The launch of a row chain's driver (fnx/backends/chain_driver.py), given the member kernels' addresses
        in a table this executable keeps."""
        fns = (ctypes.c_void_p * len(chain.members))(*[engine_of[k.code or k.name].get_function_address(
            k.code or k.name) for k in chain.members])
        table = ctypes.addressof(fns)
        engine = engine_of[chain.name]
        proto = ctypes.CFUNCTYPE(None, *([ctypes.c_void_p] * (len(chain.args) + 1)), ctypes.c_int64, ctypes.c_int64)
        func = proto(engine.get_function_address(chain.name))
        self.packed[chain.name] = engine.get_function_address(f"{chain.name}_packed")
        self.tables.append((fns, func))  # (both must live as long as the executable)
        getter = operator.itemgetter(*chain.args)
        chunks = tuple((lo, min(lo + chain.step, chain.rows)) for lo in range(0, chain.rows, chain.step))
        self.launches.append((chain, func, lambda ptrs: (table, *getter(ptrs)), chunks[0] if len(chunks) == 1
                              else None, chunks))
        self.items.append(Launch(chain.name, self.device, tuple(chain.args), chunks))

    def _memory_of(self, spec) -> tuple[str, object]:
        """(device name, its pool's `array`) for a buffer of the schedule."""
        if spec.device in (None, self.device): return self.device, self.memory.array
        return spec.device, get_device(spec.device).memory.array

    def _device_of(self, kernel) -> str:
        """The device a kernel computes for: its output buffer's (after a COPY, the COPY's device). The cpu
        devices share one address space, so this executable's threads run it."""
        return self.buffers[kernel.output].device or self.device

    def _host_item(self, step: HostStep):
        if isinstance(step, TransferStep):
            source = self.buffers[step.inputs[0]].device or self.device
            return Transfer(step.outputs[0], step.inputs[0], step.device, source)
        return HostCall(step.name, self.device, tuple(step.inputs), tuple(step.outputs))

    def aliases(self, donated: tuple[int, ...]) -> dict[int, int]:
        """Which outputs may be written into which donated inputs: {output buffer id: input index}."""
        if donated not in self._aliases:
            self._aliases[donated] = donation_aliases(self.lowering.schedule, self.lowering.steps(), donated)
        return self._aliases[donated]

    def __call__(self, inputs: list[Buffer], donated: tuple[int, ...] = (), queue: bool = False) -> list[Buffer]:
        """Run on `inputs` (one Buffer per PARAM); returns the output Buffers, possibly before they are computed.

        `donated`: indices of inputs the caller gives up; each one `aliases` allows and that no numpy view or
        other input shares is deleted and its memory holds an output. `queue`: hand even a small call to the
        device's stream (what `call_async` does, so that several devices work at once).
        """
        if self.inline is not None and not donated and not queue and (outs := self._call_inline(inputs)) is not None:
            return outs
        stream = self.stream
        if self.has_control:  # host steps read values: run here, once everything queued before has run
            stream.drain()
            queued = False
        elif stream.finished == stream.submitted:  # idle
            queued = self.queue_when_idle or queue
        else:  # keep the order; a call made by the worker itself (from a host step) runs inline
            queued = not stream.on_worker()
        ptrs = self.no_addresses.copy()
        waits: list[Buffer] = []
        for k, buf in enumerate(inputs):
            ptr = ptrs[k] = buf.ptr
            if not ptr: raise buf.deleted_error()  # only a deleted buffer has address 0
            if buf.ready is not None: waits.append(buf)
        if waits and not queued:
            settled = all((r := buf.ready) is None or r.succeeded() for buf in waits)  # another thread may clear it
            if settled or self.has_control or stream.on_worker():
                for buf in waits: buf.wait()
                waits = []
            else:  # an input failed (or is another device's): the worker hands its error on to the outputs
                queued = True
        pending = Pending() if queued else None
        given = {o: self._donate(inputs, p) for o, p in self.aliases(donated).items()} if donated else None
        buffers = inputs + self.no_buffers
        for i, dtype, np_dtype, size, device, array in self.outputs:
            host, ptr = (given and given.get(i)) or array(np_dtype, size)
            buffers[i] = Buffer(device, dtype, size, host, ptr, pending)
            ptrs[i] = ptr
        if queued:
            stream.submit(lambda: self._run(ptrs, buffers, waits), pending)
        else:
            self._run(ptrs, buffers, waits)
        n = len(inputs)
        return [buffers[b] if b >= n else _alias(inputs[b]) for b in self.output_ids]

    def call_async(self, inputs: list[Buffer]) -> list[Buffer]:
        """Queue the call when its loops are long enough to repay the hand-off to the stream's thread (20-70 us;
        QUEUE_MIN_WORK iterations take about as long): a smaller one runs here, before the next device's."""
        return self(inputs, queue=self.work >= QUEUE_MIN_WORK)

    def _call_inline(self, inputs: list) -> list[Buffer] | None:
        """The lean path of a small call (most of W6's dispatch time): every kernel runs whole on this thread, no
        memory-plan slots. None (nothing done) unless the stream is idle and every input is computed (an entry of
        `inputs` may be None: an Array with no buffer yet)."""
        stream = self.stream
        if stream.finished != stream.submitted or self.queue_when_idle or events.active: return None
        ptrs = self.no_addresses.copy()
        k = 0
        for buf in inputs:
            if buf is None or buf.ready is not None or not buf.ptr: return None  # pending or deleted: general path
            ptrs[k] = buf.ptr
            k += 1
        outs = []
        for i, dtype, np_dtype, size, device, array in self.outputs:
            host, ptr = array(np_dtype, size)
            outs.append(Buffer(device, dtype, size, host, ptr))
            ptrs[i] = ptr
        for func, addresses, whole in self.inline: func(*addresses(ptrs), *whole)
        if self.outputs_in_order: return outs
        by_id = {i: b for (i, *_), b in zip(self.outputs, outs)}
        return [by_id[b] if b in by_id else _alias(inputs[b]) for b in self.output_ids]

    def single_output_call(self):
        """For jit's fast path: a function from the argument Arrays to the one output Buffer through the lean path
        (`_call_inline`), or None where that path does not apply (then call the executable). None when this
        executable never can (several outputs, slots, threads, control flow)."""
        if self.inline is None or len(self.outputs) != 1 or not self.outputs_in_order: return None

        def call(arrays) -> Buffer | None:
            outs = self._call_inline([a._buffer for a in arrays])
            return None if outs is None else outs[0]
        return call

    def _donate(self, inputs: list[Buffer], index: int) -> tuple[np.ndarray, int] | None:
        """The host memory and address of donated input `index` when nothing else can see it (it is then
        deleted); None when it is shared (a numpy view, another argument, another device)."""
        buf = inputs[index]
        if buf.device != self.device or sum(x is buf for x in inputs) > 1 or not self.memory.unshared(buf):
            return None
        ptr = buf.ptr
        return buf.delete(), ptr

    def _run(self, ptrs: list[int], buffers: list, waits) -> None:
        """Run every step; `buffers` keeps inputs and outputs alive until the last kernel is done."""
        for buf in waits: buf.wait()  # queued: done by now unless another device's, or raises a failed call's error
        if self.slot_bytes:
            slots = [self.memory.array(_BYTES, n) for n in self.slot_bytes]
            for i, slot, dtype, size in self.slotted:
                ptrs[i] = slots[slot][1]
                if self.has_control:  # host steps read buffers, not addresses
                    buffers[i] = Buffer(self.device, dtype, size, slots[slot][0][:size * dtype.itemsize].view(
                        dtype.np), ptrs[i])
        for kernel, func, addresses, whole, chunks in self.launches:
            if func is None:
                self._control(kernel, buffers, ptrs)
                continue
            if reporting := events.active: start = time.perf_counter()
            values = addresses(ptrs)
            if whole is not None:
                func(*values, *whole)
            elif not self._run_on_native_workers(kernel, func, values, chunks):
                # the native workers are busy or absent: a share of the chunks runs here while the thread pool
                # runs the others' shares
                shares = [chunks[i::self.threads] for i in range(min(self.threads, len(chunks)))]
                jobs = [self.pool.submit(_run_chunks, func, values, share) for share in shares[1:]]
                _run_chunks(func, values, shares[0])
                for job in jobs: job.result()
            if reporting: self.kernel_event(kernel, start)

    def _run_on_native_workers(self, kernel, func, values: tuple, chunks: tuple) -> bool:
        """Run the chunks with the native worker pool (the first on this thread); False when it is not available."""
        native = native_pool.pool(self.compiler, self.threads - 1)
        return native is not None and native.run(self.packed[kernel.name], values, chunks)

    def _control(self, step, buffers: list[Buffer], ptrs: list[int]) -> None:
        """Run a host step: a transfer, or a control-flow node whose bodies are compiled functions called from a
        host loop."""
        start = time.perf_counter()
        if isinstance(step, TransferStep):
            source, target = buffers[step.inputs[0]], get_device(step.device).allocator
            copy = target.alloc(source.dtype, source.size)
            if not target.transfer(copy, source):
                target.copyin(copy, get_device(source.device).allocator.copyout(source))
            buffers[step.outputs[0]], ptrs[step.outputs[0]] = copy, copy.ptr
            if events.active: self.transfer_event(source, step.device, start)
            return

        def prepare(fn: UOp):
            exe, shapes, device = get_device(self.device).compile(fn), [o.shape for o in fn.src[0].src], self.device
            return lambda values: [b.numpy(s) for b, s in zip(exe([Buffer.from_numpy(device, v) for v in values]),
                                                               shapes)]
        inputs = [buffers[i].numpy(step.node.operands[j].shape) for j, i in enumerate(step.inputs)]
        if step.node not in _scans:  # small bodies loop natively, small branches run from a driver (scan_loop.py)
            _scans[step.node] = _NATIVE[step.node.op](step.node, _compiler())
        program = _scans.get(step.node)
        values = program.run(inputs, prepare) if program is not None else run_control(step.node, inputs, prepare)
        for out_id, value in zip(step.outputs, values):
            buffers[out_id] = Buffer.from_numpy(self.device, value)
            ptrs[out_id] = buffers[out_id].ptr
        events.finished("host", f"{self.label}:{step.name}", start, device=self.device)

    def as_text(self, stage: str | None = None) -> str:
        if stage in STAGES: return self.lowering.as_text(stage)
        if stage == "items": return self.items_text()
        if stage == "llvm": return self.source
        if stage == "asm": return self.compiler_asm()
        stages = [f"--- {s} ---\n{self.lowering.as_text(s)}" for s in STAGES]
        return "\n\n".join(stages + [f"--- items ---\n{self.items_text()}", f"--- llvm ---\n{self.source}"])

    def compiler_asm(self) -> str:
        return _compiler().assembly(self.modules)


_state: dict = {}
_scans: dict = {}   # SCAN node -> its compiled native loop (None: runs from the host loop)


_state_lock = threading.Lock()


def _compiler() -> LLVMCompiler:
    with _state_lock:
        if "compiler" not in _state:
            _state["compiler"] = LLVMCompiler(host_target(config.cpu_threads, config.cpu_target))
    return _state["compiler"]


_NATIVE = {Ops.SCAN: compile_scan, Ops.WHILE: compile_while, Ops.COND: compile_cond}
_thread_pool: list[ThreadPoolExecutor] = []


def _workers() -> ThreadPoolExecutor:
    """The worker threads every cpu device's kernels split across (each device uses its share of them)."""
    with _state_lock:
        if not _thread_pool:
            _thread_pool.append(ThreadPoolExecutor(max_workers=config.cpu_threads, thread_name_prefix="fnx-cpu"))
    return _thread_pool[0]


class CPUDevice(Device):
    """cpu:i of FNX_CPU_DEVICES: host memory of its own (a HostPool), its own ordered Stream, and an equal share
    of the FNX_CPU_THREADS worker threads. All cpu devices share one LLVM compiler and its code."""

    def __init__(self, ordinal: int, count: int):
        self.memory, self.threads = HostPool(), max(1, config.cpu_threads // count)
        super().__init__("cpu", ordinal, HostAllocator(f"cpu:{ordinal}", self.memory),
                         target=host_target(self.threads, config.cpu_target),
                         renderer=LLVMRenderer(), compiler=_compiler())
        self.stream, self.pool = Stream(self.name), _workers()
        native_pool.prepare(self.compiler, self.threads - 1)

    def executable(self, fn: UOp) -> CPUExecutable:
        return CPUExecutable(fn, self)

    def kernel_timers(self):
        return kernel_timers(self.compiler)


def _cpu_device(ordinal: int) -> Device:
    """cpu:i. Under fnx.distributed the cpu devices span the processes: process r owns cpu:r*L .. cpu:r*L+L-1
    (L = FNX_CPU_DEVICES, each process's count) and the others are placeholders of other processes' devices."""
    owner = ordinal // config.cpu_devices
    if owner != processes.index: return RemoteDevice("cpu", ordinal, owner)
    return CPUDevice(ordinal, config.cpu_devices)


register_runtime(Runtime("cpu", lambda: config.cpu_devices * processes.count, _cpu_device,
                         first_local=lambda: processes.index * config.cpu_devices))
