"""optimize: the per-kernel schedule. Today's heuristics: split the outermost output loop across CPU threads
when the kernel has enough work; LLVM's loop vectorizer then widens the innermost unit-stride loop."""
from __future__ import annotations

from fnx.lower.rangeify import Kernel

MIN_PARALLEL_WORK = 1 << 15   # below this, waking threads costs more than it saves


def optimize(kernel: Kernel, threads: int) -> Kernel:
    if kernel.parallel and kernel.ranges and threads > 1 and kernel.work >= MIN_PARALLEL_WORK:
        kernel.thread_range = 0
    return kernel
