"""cost: estimated FLOPs and memory traffic of a kernel, used by rangeify to decide the kernel split.

FLOPs count the scalar ops on values (never address arithmetic), each weighted by `OP_FLOPS` and multiplied by
the iterations of the loops it runs in. Weights are rough instruction counts on a CPU after lowering:
EXP2/LOG2/SIN become a range reduction and a polynomial (~10 ops), SQRT, DIV, RECIP and MOD have long latency
(~4), CAST and BITCAST are free (but a rounding to bfloat16: `BF16_ROUNDING`), every other op counts 1. A REDUCE
counts its combining op once per iteration. A node runs where linearize puts it: in every output loop up to the innermost one it depends on (loop-invariant
work is hoisted) and inside the loop nest of each REDUCE whose ranges it depends on.

Bytes count what a kernel moves to and from memory, assuming caches hold what the kernel re-reads: a buffer read
at an index that does not depend on some loop is counted once per distinct element, not once per iteration (a row
broadcast over a column loop, the row a fused reduction reads again). Distinct elements of a load are
approximated by the product of the extents of the ranges its index depends on, capped at the buffer's size; several
loads of one buffer count the largest. This undercounts traffic when a re-read set does not fit in cache (a matmul
operand re-read across a long loop) and ignores gates (a padded load counts its whole range).
"""
from __future__ import annotations

import math
from typing import TYPE_CHECKING

from fnx import dtypes
from fnx.lower.linearize import range_deps
from fnx.uop import GroupOp, Ops, UOp

if TYPE_CHECKING:
    from fnx.lower.rangeify import Kernel

# Weighted ops a CPU core does while it moves one byte to or from memory: ~2 for scalar code (a few ops per cycle
# against ~1 byte per cycle of memory bandwidth per core), ~16x more when vectorized. Recomputed work lands in
# extra loop nests, which the optimizer does not vectorize yet (one lane range per kernel), so the scalar figure.
FLOPS_PER_BYTE = 2
OP_FLOPS = {Ops.EXP2: 10, Ops.LOG2: 10, Ops.SIN: 10, Ops.SQRT: 4, Ops.DIV: 4, Ops.RECIP: 4, Ops.MOD: 4,
            Ops.CAST: 0, Ops.BITCAST: 0}


BF16_ROUNDING = 4  # a cast to bfloat16 from a wider float: round to nearest even in integer ops (no instruction)


def op_flops(op: Ops) -> int:
    """The weight of one scalar `op` (see the module docstring); 0 for anything that is not ALU work."""
    return OP_FLOPS.get(op, 1) if op in GroupOp.ALU else 0


def node_flops(u: UOp) -> int:
    """op_flops of u's op, and BF16_ROUNDING for a cast that rounds a wider float to bfloat16: counted free, a
    bfloat16 matmul's A (`a.astype(bfloat16) @ ...`) was rounded again for every column panel inside the product's
    loop (1024²: 25 ms; rounded once into a buffer, 11)."""
    if u.op is Ops.CAST and u.dtype == dtypes.bfloat16 and u.src[0].dtype.is_float and u.src[0].dtype.itemsize > 2:
        return BF16_ROUNDING
    return op_flops(u.op)


def element_flops(u: UOp, stop: set | dict, limit: float = math.inf, walked: set | None = None) -> float:
    """Weighted ALU ops to compute one element of frontend node `u` when fused into a kernel.

    A node behind an EXPAND is computed once per element of its own (smaller) shape, since linearize hoists it
    out of the broadcast loops: it counts that fraction of its weight. The walk does not enter `stop` (values
    already in buffers) nor REDUCEs: a fused reduction is computed once per kernel, not once per consumer element.

    Args:
      u: a node of a FUNCTION body (movement ops are free).
      stop: nodes whose value is loaded from a buffer.
      limit: stop counting once the total exceeds this (the callers only compare against a threshold).
      walked: when given, receives the nodes counted: the count is the same for any `stop` that adds none of them.
    Returns:
      the weighted op count of u's cone, each node counted once (or a number above `limit`).

    Example: `element_flops(exp2(x * 2.0), stop={x})` is 11; a row mean `sum / n` broadcast over 32 columns
    adds 4/32 to each element.
    """
    total, seen, todo = 0.0, set() if walked is None else walked, [(u, 1.0)]
    while todo and total <= limit:
        n, share = todo.pop()
        if n in seen or n in stop: continue
        seen.add(n)
        total += node_flops(n) * share
        if n.op is Ops.EXPAND: share *= n.src[0].size / max(n.size, 1)
        if n.op is not Ops.REDUCE: todo.extend((s, share) for s in n.src)
    return total


def recompute_costs_more(u: UOp, copies: int, stop: set | dict, walked: set | None = None) -> bool:
    """Whether computing fused value `u` in `copies` loop nests costs more than writing it once and reading it back.

    Recomputing costs (copies - 1) * element_flops(u); a buffer costs one write and one read per element, at
    FLOPS_PER_BYTE. Example: `x - mean` (about 2 weighted ops) computed twice is cheaper than a float32 buffer
    (16); jnp.exp (about 43, a polynomial) is not.
    """
    buffer_cost = FLOPS_PER_BYTE * 2 * u.dtype.itemsize
    return copies > 1 and (copies - 1) * element_flops(u, stop, buffer_cost / (copies - 1), walked) > buffer_cost


def _ranges_in(u: UOp) -> frozenset[UOp]:
    """The RANGEs under u (cached on the node: UOps are immutable and hash-consed; lowering asks this of every
    index it builds)."""
    cached = u.__dict__.get("_ranges")
    if cached is None:
        cached = u.__dict__["_ranges"] = frozenset(n for n in u.toposort if n.op is Ops.RANGE)
    return cached


def _loop_iterations(kernel: Kernel):
    """A function from a node of the kernel to how many times it runs (where linearize places it)."""
    deps = range_deps(kernel.sink)
    owner = {r: u for u in kernel.sink.toposort if u.op is Ops.REDUCE for r in u.src[1:]}
    position = {r: i for i, r in enumerate(kernel.ranges)}

    def iterations(ranges: frozenset) -> int:
        open_loops, todo = set(), list(ranges)
        while todo:  # a reduce range's loop nest sits inside the loops its REDUCE depends on
            r = todo.pop()
            if r in open_loops: continue
            open_loops.add(r)
            if r in owner: todo.extend(deps[owner[r]])
        innermost = max((position[r] for r in open_loops if r in position), default=-1)
        open_loops.update(kernel.ranges[:innermost + 1])
        return math.prod(r.arg.size for r in open_loops)

    return lambda u: iterations(deps[u] | set(u.src[1:])) if u.op is Ops.REDUCE else iterations(deps[u])


def _value_nodes(kernel: Kernel) -> list[UOp]:
    """Nodes that compute stored values: everything under the STOREs' values, not LOAD/STORE addresses or gates."""
    out, seen, todo = [], set(), [st.src[2] for st in kernel.sink.src if st.op is Ops.STORE]
    while todo:
        n = todo.pop()
        if n in seen: continue
        seen.add(n)
        out.append(n)
        if n.op is not Ops.LOAD: todo.extend(n.src[:1] if n.op is Ops.REDUCE else n.src)
    return out


def kernel_flops(kernel: Kernel) -> int:
    """Estimated weighted FLOPs of one run of `kernel` (see the module docstring).

    Example: an (M, K) @ (K, N) matmul kernel gives 2 * M * N * K (one MUL and one ADD per reduce iteration).
    """
    runs = _loop_iterations(kernel)
    total = 0
    for u in _value_nodes(kernel):
        weight = op_flops(u.arg.op) if u.op is Ops.REDUCE else node_flops(u)
        if weight: total += weight * runs(u)
    return total


def kernel_bytes(kernel: Kernel) -> int:
    """Estimated bytes one run of `kernel` loads plus stores (see the module docstring for the approximation)."""
    loaded: dict[UOp, int] = {}
    stored: dict[UOp, int] = {}
    for u in kernel.sink.toposort:
        if u.op not in (Ops.LOAD, Ops.STORE): continue
        buf, index = u.src[0], u.src[1]
        elements = min(buf.arg.shape[0], math.prod(r.arg.size for r in _ranges_in(index)))
        seen = loaded if u.op is Ops.LOAD else stored
        seen[buf] = max(seen.get(buf, 0), elements)
    return sum(b.dtype.itemsize * n for seen in (loaded, stored) for b, n in seen.items())


def describe(kernel: Kernel) -> str:
    """One line with the kernel's estimated cost, e.g. `k0_E_64_32: 2.0 kFLOP, 16.4 kB, 0.12 FLOP/B`."""
    flops, moved = kernel_flops(kernel), kernel_bytes(kernel)
    return (f"{kernel.name}: {_si(flops)}FLOP, {_si(moved)}B, "
            f"{flops / moved if moved else math.inf:.2f} FLOP/B")


def _si(x: float) -> str:
    for unit in ("", "k", "M", "G", "T"):
        if abs(x) < 1000: return f"{x:.3g} {unit}" if unit else f"{x:.3g} "
        x /= 1000
    return f"{x:.3g} P"
