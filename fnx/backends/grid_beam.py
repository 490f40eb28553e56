"""How a grid device (OpenCL, CUDA) times a schedule for BEAM (fnx/lower/search.py): the device's own renderer,
compiler and programs run the candidate kernels on random buffers in its memory, as the schedule would launch
them, and the device's queue is waited on for each run. Device-agnostic: any Device with a renderer, a compiler,
`program(name, binary)` and an allocator whose buffers `wait()` gets BEAM through `kernel_timers`."""
from __future__ import annotations

import functools
import time
from dataclasses import replace

import numpy as np

from fnx import dtypes
from fnx.lower.linearize import linearize
from fnx.lower.rangeify import Kernel
from fnx.lower.target import Target
from fnx.uop import Ops

REPEATS = 3


class GridKernelTimer:
    """Compiles one schedule of a kernel and times its launches on `device` (best of REPEATS after a warm-up)."""

    def __init__(self, kernel: Kernel, target: Target, device):
        self.device, self.buffers, self.rng = device, {}, np.random.default_rng(0)

    def _buffer(self, dtype, size: int):
        """A device buffer of random values, shared by every candidate that needs one of that dtype and size."""
        key = (dtype, size)
        if key not in self.buffers:
            host = self.rng.standard_normal(size) if dtype.is_float else self.rng.integers(0, 2, size)
            self.buffers[key] = self.device.allocator.from_numpy(np.ascontiguousarray(host.astype(dtype.np)))
        return self.buffers[key]

    def __call__(self, kernels: list[Kernel]) -> float:
        kernels = [replace(k, name=f"beam{i}") for i, k in enumerate(kernels)]
        source = self.device.renderer.render([(k, linearize(k)) for k in kernels])
        binary = self.device.compiler.compile_uncached(source)  # (candidates stay out of the disk cache)
        launches = []
        for k in kernels:
            params = {u.arg.slot: u for u in k.sink.toposort if u.op is Ops.PARAM}
            args = [self._buffer(params[i].dtype, params[i].arg.shape[0]) if i in params else
                    self._buffer(dtypes.uint8, 1) for i in range(max(len(k.args), 1))]  # (unused: one byte)
            outer = k.ranges[k.thread_range].arg.size if k.thread_range >= 0 else 1
            dims = (0, outer) + ((k.locals[0].arg.size,) if k.locals else ())
            launches.append((self.device.program(k.name, binary), args, dims))
        best = float("inf")
        for _ in range(REPEATS + 1):
            start = time.perf_counter()
            for program, args, dims in launches: program(*args, dims=dims)
            launches[-1][1][0].wait()
            best = min(best, time.perf_counter() - start)
        return best


def kernel_timers(device):
    """The `measure` BEAM takes on a grid device: `measure(kernel, target)` is a GridKernelTimer on `device`."""
    return functools.partial(GridKernelTimer, device=device)


__all__ = ["GridKernelTimer", "kernel_timers"]
