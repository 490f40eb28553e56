"""Sibling kernels: elementwise kernels over the same loops that read the same elements become one kernel that
stores each of their outputs (horizontal fusion, after rangeify).

rangeify gives every realized value its own kernel and fuses each value's cone into it, so outputs that share
inputs are computed apart: an Adam step's new parameter, first moment and second moment are three kernels, the
parameter's computing both moments again, reading four arrays and writing one, each moment's two and one (11
passes over memory a tensor where one kernel reading 4 and writing 3 does with 7). Merged, the shared loads and
arithmetic are one (the graph is hash-consed: once both kernels' loops and buffers are the same nodes, what
they compute alike is one node).

A later kernel B merges into an earlier kernel A when both are elementwise (parallel, no reduction, nothing
optimize or row sums added), run over loops of the same sizes, store at the same element, read an element in
common, and B can run where A does: nothing after A up to B writes a buffer B reads, and what B reads of A's
outputs it reads at the element A stores (the merged kernel then uses A's value: `y = x * 2; z = y + x` reads
x once and stores y and z). At most MAX_STORES outputs a kernel (each one more stream of stores and of
registers).
"""
from __future__ import annotations

from dataclasses import replace

from fnx import dtypes
from fnx.lower.rangeify import HostStep, Kernel, Schedule
from fnx.rewrite import substitute
from fnx.uop import Ops, UOp

MAX_STORES = 4     # outputs of a merged kernel at most
LOOK_BACK = 64     # steps before a kernel where its sibling is looked for (an optimizer step's outputs come tensor by
                   # tensor: a parameter's moments 20 and 40 kernels after it for 20 tensors)


def _elementwise(k) -> bool:
    return (isinstance(k, Kernel) and k.parallel and not k.reduce_ranges and k.row_ranges is None
            and not k.prelude and not k.init and not k.lanes and not k.locals and k.thread_range < 0
            and all(st.op is Ops.STORE for st in k.sink.src)
            and not any(u.op is Ops.REDUCE for u in k.sink.toposort))


def _written(step) -> set[int]:
    return set(step.outputs) if isinstance(step, HostStep) else step.buffers(Ops.STORE)


def _read(step) -> set[int]:
    return set(step.inputs) if isinstance(step, HostStep) else step.buffers(Ops.LOAD)


def _merged(a: Kernel, b: Kernel) -> Kernel | None:
    """b's stores added to a's, b's loops and buffers renamed to a's; None unless they store at one element and
    b reads an element a reads."""
    if [r.arg.size for r in a.ranges] != [r.arg.size for r in b.ranges]: return None
    if len(a.sink.src) + len(b.sink.src) > MAX_STORES: return None
    params = {a.args[u.arg.slot]: u for u in a.sink.toposort if u.op is Ops.PARAM}
    args, mapping = list(a.args), dict(zip(b.ranges, a.ranges))
    for u in b.sink.toposort:
        if u.op is not Ops.PARAM: continue
        buf = b.args[u.arg.slot]
        if (mine := params.get(buf)) is not None:
            if mine.dtype != u.dtype or mine.arg.shape != u.arg.shape: return None
            mapping[u] = mine
        else:
            mapping[u] = UOp(Ops.PARAM, u.dtype, (), u.arg._replace(slot=len(args)))
            args.append(buf)
    stores = [substitute(st, mapping) for st in b.sink.src]
    if {st.src[1] for st in stores} != {st.src[1] for st in a.sink.src}: return None
    # what b reads of a's outputs it reads at the element a stores: a's value, in the register (else not siblings)
    written = {st.src[0]: st for st in a.sink.src}
    reads = [u for st in stores for u in st.toposort if u.op is Ops.LOAD and u.src[0] in written]
    if any(len(u.src) > 2 or u.src[1] is not written[u.src[0]].src[1] or len(written[u.src[0]].src) > 3
           for u in reads):
        return None
    if reads: stores = [substitute(st, {u: written[u.src[0]].src[2] for u in reads}) for st in stores]
    mine = set(a.sink.toposort)
    if not any(u.op is Ops.LOAD and u in mine for st in stores for u in st.toposort): return None
    sink = UOp(Ops.SINK, dtypes.bool_, (*a.sink.src, *stores))
    return replace(a, sink=sink, args=args, sources=a.sources + b.sources)


def merge_siblings(schedule: Schedule) -> None:
    """Merge sibling kernels of `schedule` in place (module docstring)."""
    steps: list = []
    for step in schedule.kernels:
        if not (_elementwise(step) and _merged_into(steps, step)): steps.append(step)
    schedule.kernels = steps


def _merged_into(steps: list, k: Kernel) -> bool:
    """Whether kernel `k` merged into one of the last LOOK_BACK `steps` (replaced by the merged kernel)."""
    reads, later = _read(k), set()
    for i in range(len(steps) - 1, max(-1, len(steps) - 1 - LOOK_BACK), -1):
        if reads & later: return False  # (k reads what a step after this one writes: it runs after that)
        if _elementwise(steps[i]) and (merged := _merged(steps[i], k)) is not None:
            steps[i] = merged
            return True
        later |= _written(steps[i])
    return False


__all__ = ["merge_siblings", "MAX_STORES"]
