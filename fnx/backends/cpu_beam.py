"""How the CPU backend times a schedule for BEAM (fnx/lower/search.py): lowering asks for a timer through the
`measure` it is given (`kernel_timers(compiler)`), and never imports a backend itself."""
from __future__ import annotations

import ctypes
import functools
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace

import numpy as np

from fnx.backends.llvm_render import render_module
from fnx.lower.linearize import linearize
from fnx.lower.rangeify import Kernel
from fnx.lower.target import Target
from fnx.uop import Ops

REPEATS = 3


class KernelTimer:
    """Compiles one schedule of a kernel (with its init kernel) and times it on random buffers, its thread-split
    loop in `target.threads` chunks."""

    def __init__(self, kernel: Kernel, target: Target, compiler):
        self.compiler, self.threads = compiler, target.threads
        self.pool = _pool(self.threads) if self.threads > 1 else None
        self.rng, self.buffers = np.random.default_rng(0), []
        self._allocate(kernel)

    def _allocate(self, kernel: Kernel) -> None:
        """Random host buffers for the kernel's arguments that have none yet, or too small a one (PACK's panels
        come last, and their size depends on the schedule)."""
        params = {u.arg.slot: u for u in kernel.sink.toposort if u.op is Ops.PARAM}
        self.buffers += [np.zeros(1, np.float32)] * (max(len(kernel.args), 1) - len(self.buffers))
        for i, p in params.items():
            size, dtype = p.arg.shape[0], p.dtype
            if self.buffers[i].size >= size and self.buffers[i].dtype == dtype.np: continue
            host = self.rng.standard_normal(size) if dtype.is_float else self.rng.integers(0, 2, size)
            self.buffers[i] = np.ascontiguousarray(host.astype(dtype.np))

    def __call__(self, kernels: list[Kernel]) -> float:
        """The best of REPEATS runs of `kernels` in order, in seconds (after one warm-up run)."""
        kernels = [replace(k, name=f"beam{i}") for i, k in enumerate(kernels)]
        for k in kernels: self._allocate(k)
        engine, _ = self.compiler.compile(render_module([(k, linearize(k)) for k in kernels]))
        launches = []
        for k in kernels:
            proto = ctypes.CFUNCTYPE(None, *([ctypes.c_void_p] * max(len(k.args), 1)), ctypes.c_int64, ctypes.c_int64)
            func = proto(engine.get_function_address(k.name))
            outer = k.ranges[k.thread_range].arg.size if k.thread_range >= 0 else 1
            args = [self.buffers[i].ctypes.data for i in range(max(len(k.args), 1))]
            launches.append((func, args, outer, k.thread_range >= 0))
        best = float("inf")
        for _ in range(REPEATS + 1):
            start = time.perf_counter()
            for func, args, outer, threaded in launches:
                if threaded and self.pool is not None:
                    chunk = -(-outer // self.threads)
                    jobs = [self.pool.submit(func, *args, lo, min(lo + chunk, outer)) for lo in range(0, outer, chunk)]
                    for job in jobs: job.result()
                else:
                    func(*args, 0, outer)
            best = min(best, time.perf_counter() - start)
        self._keep = engine  # the code must outlive the calls above
        return best


def kernel_timers(compiler):
    """The `measure` BEAM takes: `measure(kernel, target)` is a KernelTimer compiling with `compiler`."""
    return functools.partial(KernelTimer, compiler=compiler)


_pools: dict[int, ThreadPoolExecutor] = {}


def _pool(threads: int) -> ThreadPoolExecutor:
    if threads not in _pools: _pools[threads] = ThreadPoolExecutor(threads, thread_name_prefix="fnx-beam")
    return _pools[threads]


__all__ = ["KernelTimer", "kernel_timers"]
