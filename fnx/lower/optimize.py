"""optimize: the per-kernel schedule, chosen by hand heuristics.

- Loop order for reductions: when the reduction walks memory with a stride but the innermost output loop walks it
  contiguously (the `k` loop of a matmul), the reduction moves outside that output loop and accumulates in the
  output buffer: `out[m, n] = init; for k: for n: out[m, n] += a[m, k] * b[k, n]`. The inner loop becomes unit
  stride and vectorizes; the summation order per element is unchanged, so results are bit-identical.
- Threads: the outermost independent loop is split across CPU threads when the kernel has enough work.
LLVM's loop vectorizer then widens the innermost unit-stride loop.
"""
from __future__ import annotations

from dataclasses import replace

from fnx import dtypes
from fnx.lower.rangeify import Kernel, reduce_identity
from fnx.lower.symbolic import terms
from fnx.uop import Ops, UOp

MIN_PARALLEL_WORK = 1 << 18   # below this, waking threads costs more than it saves (measured: ~50-100 us)


def _stride(index: UOp, r: UOp) -> int:
    return sum(c for t, c in terms(index)[0] if t is r)


def _accumulate_in_output(kernel: Kernel) -> list[Kernel] | None:
    """Split a strided reduction into an init kernel and an accumulate-into-output kernel (see module doc)."""
    if not kernel.reduce_ranges or not kernel.ranges or len(kernel.sink.src) != 1: return None
    store = kernel.sink.src[0]
    red = store.src[2]
    if red.op is not Ops.REDUCE or len(store.src) != 3: return None
    if red.dtype.is_float and red.dtype.itemsize == 2: return None  # 16-bit floats accumulate in float32 registers
    inner, innermost_reduce = kernel.ranges[-1], kernel.reduce_ranges[-1]
    loads = [u for u in red.src[0].toposort if u.op is Ops.LOAD]
    if _stride(store.src[1], inner) != 1: return None
    # worth it when some load walks memory with a stride along the reduction but contiguously along `inner`
    if not any(_stride(ld.src[1], inner) == 1 and _stride(ld.src[1], innermost_reduce) not in (0, 1) for ld in loads):
        return None
    buf, index = store.src[0], store.src[1]
    init = UOp(Ops.STORE, dtypes.bool_, (buf, index, UOp.const(red.dtype, reduce_identity(red.arg[0], red.dtype))))
    acc = UOp(Ops.LOAD, red.dtype, (buf, index))
    update = UOp(Ops.STORE, dtypes.bool_, (buf, index, acc.alu(red.arg[0], red.src[0])))
    sink = lambda st: UOp(Ops.SINK, dtypes.bool_, (st,))  # noqa: E731
    order = kernel.ranges[:-1] + kernel.reduce_ranges + [inner]
    return [replace(kernel, name=f"{kernel.name}_init", sink=sink(init), reduce_ranges=[]),
            replace(kernel, name=f"{kernel.name}_acc", sink=sink(update), ranges=order, reduce_ranges=[],
                    thread_candidate=0 if len(kernel.ranges) > 1 else len(order) - 1)]


def optimize(kernel: Kernel, threads: int) -> list[Kernel]:
    """The schedule of one kernel (possibly split into several) for a CPU with `threads` worker threads."""
    kernels = _accumulate_in_output(kernel) or [kernel]
    for k in kernels:
        if k.parallel and k.ranges and threads > 1 and k.work >= MIN_PARALLEL_WORK:
            k.thread_range = k.thread_candidate
    return kernels
