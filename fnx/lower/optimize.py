"""optimize: the per-kernel schedule, as a list of actions applied to the kernel's loops.

An action is `Opt(op, axis, amount)`; `axis` indexes the kernel's current loops, output loops first
(`kernel.ranges`, outermost first) then reduce loops (`kernel.reduce_ranges`). Actions compose left to right:

- VECTORIZE(axis, W): split the loop into (n/W, W) and compute the inner W as vector lanes (`kernel.lanes`). On an
  output loop every lane is one output element; on a reduce loop the accumulator is a vector reduced across lanes
  at the end. A size that W does not divide gets a lane mask (masked loads and stores) on the last chunk.
- UPCAST(axis, k): split an output loop by k and unroll the inner k: k outputs per iteration, each with its own
  accumulator when the kernel reduces (register blocking). When k does not divide the loop, the last block
  computes the loop's last iteration again in its extra rows (their index clamped, once per row, outside every
  reduce loop) and their stores are gated off, so a register block keeps the row count the target wants.
- UNROLL(axis, k): split a reduce loop by k (k divides it) and unroll the inner k into one update.
- THREAD(axis): split the output loop across the CPU's worker threads (its iterations are independent). On a
  grid device (OpenCL, CUDA) its iterations are the launch grid: one work item each, or one work-group each when
  the kernel has LOCAL/GROUP ranges.
- LOCAL(axis, L): (grid devices) split an output loop by L and give the inner L iterations to the L work items of
  a work-group (the work item's local index); the outer loop runs in each of them. L is a power of two, one for
  the kernel; a remainder is masked.
- GROUP(axis, L): (grid devices) split a reduce loop by L likewise: each work item of the group accumulates every
  L-th iteration, then the group combines its L partials in a tree in local memory, with a barrier per level
  (GROUP_REDUCE). Stores that do not vary within the group are made by its first work item. No value may vary
  along two LOCAL/GROUP ranges (they are the same index).
- SWAP(axis, other): exchange two output loops (their nesting order).
- SPLIT(axis, k): split a loop into an outer loop of n/k and an inner loop of k (k divides n): with SWAP, tiling.
- PACK(axis, P): copy the matmul operand that walks output loop `axis` and the reduce loop (B of a @ b, or of
  a @ b.T: then the copy transposes; A, along the rows; one set per batch of a batched product) into panels of P
  columns, [n // P][k][n % P], in a kernel that runs first,
  and read the panels instead: a panel is one contiguous block, so a large power-of-two row stride no longer
  maps every row of it to the same cache sets, and the hardware prefetcher sees one stream. Comes before every
  other action.
- SEPARATE: compute the kernel's one reduction (a matmul under an epilogue: `w - lr * x.T @ g`) into a buffer of its
  own by a kernel that runs first and gets a schedule of its own (k-slabs: ACCUMULATE needs a bare sum); the
  kernel, now elementwise, reads it. Comes before every other action.
- PARTIALS(axis, P): (a kernel with no output loop: a whole-array reduction) split reduce loop `axis` into P
  chunks whose reductions a kernel that runs first computes into a buffer of P partials, its chunk loop an output
  loop the heuristics thread-split; the kernel, with the same epilogue, reduces the P partials. Comes before every
  other action.
- ACCUMULATE(axis): move a reduce loop outermost and accumulate into the output buffer across its iterations
  (its first pass starts from the reduction's identity, not the output's contents). With SPLIT of the reduce loop
  this is cache blocking of matmul's k loop: each pass reads a k-slab of the operands that stays in cache. A float
  sum allows FLAT_SUM_MAX passes at most (each adds into the output in a row).
- TC: (grid devices with tensor cores) compute a float16/bfloat16 matmul-like kernel with warp-level matrix
  instructions, tiled as fnx/lower/tensor_core.py says; the only action of its kernel (axis and amount 0).

`heuristic_opts` chooses actions by hand rules, reading the machine (vector width and registers, L2, threads)
from a `Target` (fnx/lower/target.py); `FNX_BEAM` (fnx/lower/search.py) searches the same actions by timing.
After the actions, whichever they were, long float sums become levels of short partial sums
(`block_sums`: their rounding error stays near a pairwise sum's), then loads and stores whose index walks memory
one element per lane become single vector instructions (their `arg` names the lane range) and the rest
gathers/scatters (the devectorize step). The whole design, with the heuristics' measurements, is in
docs/LOWERING.md.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, replace

from fnx import dtypes
from fnx.lower.cost import _ranges_in, kernel_flops
from fnx.lower.arith import float_arithmetic
from fnx.lower.linearize import range_deps
from fnx.lower.rangeify import INDEX, Kernel, linear_index, reduce_identity
from fnx.lower.symbolic import build, simplify_kernel, terms
from fnx.lower.target import Target
from fnx.lower.tensor_core import NotTensorCore, is_tensor_core, tensor_core_tile
from fnx.rewrite import substitute
from fnx.uop import Ops, ParamArg, RangeArg, UOp, with_src

MIN_PARALLEL_WORK = 1 << 20   # below this a thread hand-off (~6 us on the native pool, and an uneven split of
                              # register blocks) costs more than it saves: 128 x 256 x 10 product, 12.6 us on one
                              # thread, 17-24 us on two (AVX-512 Xeon)
MIN_PARALLEL_ELEMENTS = 1 << 17  # ... except in a kernel with no reduction: from 2^17 elements (float32 in and out
                                 # are 1 MB) memory traffic is most of it (x*2+1 on 2^18: 49 -> 25 us, 2^19: 151 ->
                                 # 63 us on two threads; 2^16: 10.5 vs 13.4 us)
MIN_PARALLEL_FLOPS = 1 << 23  # ... unless each iteration is heavy: 8M weighted ops are ~1 ms of scalar code


@dataclass(frozen=True)
class Opt:
    op: str        # VECTORIZE UPCAST UNROLL THREAD SWAP SPLIT ACCUMULATE PACK SEPARATE PARTIALS LOCAL GROUP TC
    axis: int
    amount: int = 0

    def __repr__(self) -> str:
        return f"{self.op}({self.axis}, {self.amount})"


class OptError(ValueError):
    """An action that does not apply to this kernel (wrong axis kind, size not divisible, ...)."""


def _rebuild(sink: UOp, fn) -> UOp:
    memo: dict[UOp, UOp] = {}
    for u in sink.toposort:
        new = tuple(memo[s] for s in u.src)
        memo[u] = fn(u, new)
    return memo[sink]


def _next_id(k: Kernel) -> int:
    return 1 + max((u.arg.number for u in k.sink.toposort if u.op is Ops.RANGE), default=-1)


MERGE_MAX_INNER = 64  # iterations of the inner loop of two that merge_batch_loops merges, at most: heads are few,
                      # and a longer loop is more likely a sequence, whose merge with the batch would give the
                      # kernels over (b * h, t, t) rows of b * h * t (the chain of attention's kernels broke)


def merge_batch_loops(k: Kernel) -> Kernel:
    """`k` with its first two output loops merged into one, when it has three or more, the inner one has at most
    MERGE_MAX_INNER iterations, and every load and store walks the two as one loop (the outer one's stride is the
    inner one's times its size: the batch and head loops of attention over contiguous (b, h, t, t) and (b, h, t, d)
    arrays). The iteration order is the same; what changes is that the outermost loop, the one threads split and
    row chains block, has b * h rows instead of b: the W12 attention step's chain of nine kernels, blocked by one
    batch of 8 heads, held 7.3 MB of scratch a chunk, far beyond L2; by one (batch, head) it holds 0.9 MB, and the
    step took 0.88-0.92x the time (interleaved A/B; the W4 and W9 steps within noise). The kernels over (b, h, t)
    and (b, h, t, t) merge alike, and as those of (b * h, 1, ...) arrays are, so they still chain. Loops that
    anything else reads (a gate, a computed value), or that an index uses otherwise, stay as they are."""
    if k.row_ranges is not None or k.opts or k.thread_candidate != 0: return k
    if len(k.ranges) >= 3 and k.ranges[1].arg.size <= MERGE_MAX_INNER:
        outer, inner = k.ranges[0], k.ranges[1]
        merged = UOp(Ops.RANGE, INDEX, (), RangeArg(_next_id(k), outer.arg.size * inner.arg.size))
        indices: dict[UOp, UOp] = {}
        for u in k.sink.toposort:
            if u.op not in (Ops.LOAD, Ops.STORE) or u.src[1] in indices: continue
            parts, constant = terms(u.src[1])
            c_outer = sum(c for t, c in parts if t is outer)
            c_inner = sum(c for t, c in parts if t is inner)
            rest = [(t, c) for t, c in parts if t is not outer and t is not inner]
            if c_outer != c_inner * inner.arg.size or any({outer, inner} & set(t.toposort) for t, _ in rest):
                return k
            indices[u.src[1]] = build(u.src[1].dtype, rest + [(merged, c_inner)], constant)
        sink = _rebuild(k.sink, lambda u, src: with_src(u, (src[0], indices[u.src[1]], *src[2:]))
                        if u.op in (Ops.LOAD, Ops.STORE) else with_src(u, src))
        if {outer, inner} & set(sink.toposort): return k  # (a gate or a value reads one of them)
        k = replace(k, sink=sink, ranges=[merged] + k.ranges[2:])
    return k


def _and(gate: UOp | None, valid: UOp) -> UOp:
    return valid if gate is None else gate.alu(Ops.AND, valid)


def _split_ranges(k: Kernel, r: UOp, amount: int) -> tuple[UOp, UOp]:
    """The (outer, inner) loops that split loop r by `amount`: ceil(n / amount) x amount, with fresh numbers."""
    nid = _next_id(k)
    return (UOp(Ops.RANGE, INDEX, (), RangeArg(nid, -(-r.arg.size // amount))),
            UOp(Ops.RANGE, INDEX, (), RangeArg(nid + 1, amount)))


def _replaced(loops: list[UOp], r: UOp, outer: UOp, inner: UOp) -> list[UOp]:
    """`loops` with loop r replaced by its two parts, outer then inner."""
    return [p for s in loops for p in ((outer, inner) if s is r else (s,))]


def _split(k: Kernel, r: UOp, amount: int) -> tuple[Kernel, UOp, UOp]:
    """Split loop r into outer * amount + inner; a remainder is masked (gates on loads/stores, identity in reduces)."""
    n = r.arg.size
    outer, inner = _split_ranges(k, r, amount)
    idx = outer * amount + inner
    valid = idx < n if n % amount else None

    def fn(u: UOp, src: tuple) -> UOp:
        if u is r: return idx
        if u.op is Ops.REDUCE and r in u.src[1:]:
            x = src[0]
            if valid is not None: x = valid.alu(Ops.WHERE, x, UOp.const(u.dtype, reduce_identity(u.arg.op, u.dtype)))
            ranges = tuple(p for s in u.src[1:] for p in ((outer, inner) if s is r else (s,)))
            return UOp(Ops.REDUCE, u.dtype, (x, *ranges), u.arg)
        out = with_src(u, src)
        # (an index that reads a sum over r, not r itself, as a median's gather of its count, needs no mask)
        if valid is not None and u.op in (Ops.LOAD, Ops.STORE) and inner in range_deps(out.src[1])[out.src[1]]:
            gate_at = 2 if u.op is Ops.LOAD else 3
            gate = out.src[gate_at] if len(out.src) > gate_at else None
            out = UOp(u.op, u.dtype, out.src[:gate_at] + (_and(gate, valid),), u.arg)
        return out

    sink = simplify_kernel(_rebuild(k.sink, fn))
    init, ordered = k.init, k.ordered
    if r in init: init = init - {r} | {outer, inner}  # both parts still run in order
    if ordered is not None and r in ordered: ordered = ordered - {r} | {outer, inner}
    return (replace(k, sink=sink, ranges=_replaced(k.ranges, r, outer, inner),
                    reduce_ranges=_replaced(k.reduce_ranges, r, outer, inner), init=init, ordered=ordered),
            outer, inner)


def _split_clamped(k: Kernel, r: UOp, amount: int) -> tuple[Kernel, UOp, UOp]:
    """Split output loop r into outer * amount + inner when amount does not divide it (UPCAST's remainder): the
    iterations past the end compute again the last one (every index of r is clamped to it, a choice made once per
    row, outside any reduce loop) and their stores are gated off. Clamping instead of gating the loads keeps the
    inner loops free of masks: a 6-row register block of a 1024-row matmul computes 2 extra rows of 1026."""
    n = r.arg.size
    outer, inner = _split_ranges(k, r, amount)
    idx = outer * amount + inner
    valid = idx < n
    clamped = valid.alu(Ops.WHERE, idx, UOp.const(INDEX, n - 1))

    def fn(u: UOp, src: tuple) -> UOp:
        if u is r: return clamped
        out = with_src(u, src)
        if u.op is Ops.STORE:
            gate = out.src[3] if len(out.src) > 3 else None
            out = UOp(Ops.STORE, u.dtype, out.src[:3] + (_and(gate, valid),), u.arg)
        return out

    return (replace(k, sink=simplify_kernel(_rebuild(k.sink, fn)), ranges=_replaced(k.ranges, r, outer, inner)),
            outer, inner)


def _unroll_output(k: Kernel, inner: UOp) -> Kernel:
    """One copy of every store per value of `inner` (less those gated off for good: a clamped remainder's)."""
    stores = [simplify_kernel(_substitute_range(st, inner, i)) for i in range(inner.arg.size) for st in k.sink.src]
    stores = [st for st in stores if not (len(st.src) > 3 and st.src[3].op is Ops.CONST and not st.src[3].arg.value)]
    sink = UOp(Ops.SINK, dtypes.bool_, tuple(dict.fromkeys(stores)))
    return replace(k, sink=sink, ranges=[r for r in k.ranges if r is not inner])


def _unroll_reduce(k: Kernel, inner: UOp) -> Kernel:
    """REDUCE over (..., inner) becomes REDUCE over (...) of the combined copies of its input."""
    def fn(u: UOp, src: tuple) -> UOp:
        if u.op is Ops.REDUCE and inner in u.src[1:]:
            copies = [_substitute_range(src[0], inner, i) for i in range(inner.arg.size)]
            while len(copies) > 1:  # a balanced tree keeps the dependency chain short
                copies = [copies[j].alu(u.arg.op, copies[j + 1]) if j + 1 < len(copies) else copies[j]
                          for j in range(0, len(copies), 2)]
            rest = tuple(s for s in u.src[1:] if s is not inner)
            return UOp(Ops.REDUCE, u.dtype, (copies[0], *rest), u.arg) if rest else copies[0]
        return with_src(u, src)
    sink = simplify_kernel(_rebuild(k.sink, fn))
    return replace(k, sink=sink, reduce_ranges=[r for r in k.reduce_ranges if r is not inner])


def _substitute_range(root: UOp, r: UOp, value: int) -> UOp:
    return substitute(root, {r: UOp.const(INDEX, value)})


def _free_loop(k: Kernel, r: UOp) -> bool:
    """Whether r is a loop of a kernel that runs in order (a scatter) whose iterations write other elements (the
    window of an update: the columns of a scattered row), so its lanes and threads cannot reorder two writes of
    one element."""
    return not k.parallel and k.ordered is not None and r not in k.ordered


def _store_buffers_read(k: Kernel) -> bool:
    """Whether the kernel reads a buffer it writes other than at the index it writes (then iterations are not
    independent; reading the element being updated, as an accumulation does, is fine)."""
    written = {(st.src[0], st.src[1]) for st in k.sink.src}
    buffers = {b for b, _ in written}
    return any(u.op is Ops.LOAD and u.src[0] in buffers and (u.src[0], u.src[1]) not in written
               for u in k.sink.toposort)


def _accumulate(k: Kernel, r: UOp) -> Kernel:
    """Reduce loop r becomes the outermost (sequential) loop; each store adds its partial reduction to the output."""
    if r not in k.reduce_ranges or k.thread_range >= 0 or k.init or k.lanes:
        raise OptError("ACCUMULATE: needs a reduce loop, before THREAD/VECTORIZE")
    stores = []
    for st in k.sink.src:
        red = st.src[2]
        if (red.op is not Ops.REDUCE or r not in red.src[1:] or len(st.src) != 3
                or (red.dtype.is_float and red.dtype.itemsize == 2)):  # 16-bit floats accumulate in float32 registers
            raise OptError("ACCUMULATE: every store must write a reduction over the loop")
        if red.arg.op is Ops.ADD and red.dtype.is_float and r.arg.size > FLAT_SUM_MAX:
            # each pass adds into the output in a row, where block_sums cannot block them
            raise OptError(f"ACCUMULATE: {r.arg.size} passes of a float sum (at most {FLAT_SUM_MAX})")
        rest = tuple(x for x in red.src[1:] if x is not r)
        part = UOp(Ops.REDUCE, red.dtype, (red.src[0], *rest), red.arg) if rest else red.src[0]
        # the first pass starts from the identity instead of the output's old contents (no kernel that sets the
        # output first: at 1024² that was 80 us of a 5.3 ms matmul, a pass over the output). Its load is gated off
        # there, not only discarded: nothing reads an output before writing it (a read of fresh memory maps the
        # zero page, and the store then faults the page in again)
        later = UOp(Ops.LOAD, red.dtype, (st.src[0], st.src[1], r.const_like(0) < r))
        old = (r < 1).alu(Ops.WHERE, UOp.const(red.dtype, reduce_identity(red.arg.op, red.dtype)), later)
        stores.append(UOp(Ops.STORE, dtypes.bool_, (st.src[0], st.src[1], old.alu(red.arg.op, part))))
    return replace(k, sink=UOp(Ops.SINK, dtypes.bool_, tuple(stores)), ranges=[r] + k.ranges,
                   reduce_ranges=[x for x in k.reduce_ranges if x is not r], init=frozenset((r,)))


def _operand(k: Kernel, axis: int) -> UOp | None:
    """The factor of a matmul-like kernel's product that walks output loop `axis` and the reduce loop and no other
    loop but batch loops, which the other factor walks as well (B of a @ b for the unit-stride output loop, a relu
    mask and all; of a batched product, one B per batch), or None."""
    if not 0 <= axis < len(k.ranges) or len(k.reduce_ranges) != 1: return None
    n, red = k.ranges[axis], k.reduce_ranges[0]
    reductions = [u for u in k.sink.toposort if u.op is Ops.REDUCE]
    if len(reductions) != 1 or reductions[0].arg.op is not Ops.ADD: return None
    body = reductions[0].src[0]
    while body.op is Ops.CAST: body = body.src[0]
    if body.op is not Ops.MUL: return None
    walking = [f for f in body.src if n in _ranges_in(f)]
    if len(walking) != 1 or not {n, red} <= _ranges_in(walking[0]): return None
    other = set().union(*(_ranges_in(f) for f in body.src if f is not walking[0]))
    if not _ranges_in(walking[0]) - {n, red} <= other & set(k.ranges): return None  # (batch loops only)
    return walking[0]


def _pack(k: Kernel, opt: Opt) -> Kernel:
    """PACK(axis, P): the factor of the product that walks output loop n = `axis` and the reduce loop (_operand)
    is computed into panels [n // P][k][n % P] by a prelude kernel; the kernel reads those instead."""
    if any(o.op != "PACK" for o in k.opts) or k.lanes or k.init or k.thread_range >= 0 or not k.reduce_ranges:
        raise OptError(f"{opt}: PACK comes before every other action")
    if (b := _operand(k, opt.axis)) is None:
        raise OptError(f"{opt}: no factor of a product walks loop {opt.axis} and the reduce loop alone")
    n, red, width = k.ranges[opt.axis], k.reduce_ranges[0], opt.amount
    if not 2 <= width <= n.arg.size: raise OptError(f"{opt}: amount must be in [2, {n.arg.size}]")
    n_panels, depth = -(-n.arg.size // width), red.arg.size
    batch = [r for r in k.ranges if r in _ranges_in(b) and r is not n]  # one set of panels per batch
    size, pos = math.prod(r.arg.size for r in batch) * n_panels * width * depth, len(k.args)
    panels = UOp(Ops.PARAM, b.dtype, (), ParamArg(pos, (size,), None))
    jo, kk, p = (UOp(Ops.RANGE, INDEX, (), RangeArg(i, s)) for i, s in enumerate((n_panels, depth, width)))
    copies = [UOp(Ops.RANGE, INDEX, (), RangeArg(3 + i, r.arg.size)) for i, r in enumerate(batch)]
    column = jo * width + p
    value = substitute(b, {n: column, red: kk, **dict(zip(batch, copies))})
    if n.arg.size % width:  # the last panel is padded with zeros, and no load reads past the operand's columns
        valid = column < n.arg.size

        def gate(u: UOp, src: tuple) -> UOp:
            out = with_src(u, src)
            if u.op is not Ops.LOAD: return out
            return UOp(Ops.LOAD, u.dtype, (*out.src[:2], _and(out.src[2] if len(out.src) > 2 else None, valid)), u.arg)
        value = valid.alu(Ops.WHERE, _rebuild(value, gate), UOp.const(b.dtype, 0))
    def offset(ranges: list[UOp]) -> UOp:  # the batch's panels: [batch...][n // P][k][n % P]
        flat = UOp.const(INDEX, 0)
        for r in ranges: flat = flat * r.arg.size + r
        return flat * (n_panels * width * depth)
    copy = UOp(Ops.SINK, dtypes.bool_, (UOp(Ops.STORE, dtypes.bool_, (
        panels, offset(copies) + (jo * depth + kk) * width + p, value)),))
    args = k.args + [_placeholder(k)]  # optimize() gives the panels a buffer of the schedule
    # the copy reads the operand in memory order: k outermost when the panel's columns are its unit-stride loop
    # (B of a @ b: one stream per panel), else panel by panel and column by column (A, whose rows walk k: each
    # panel, P rows, is written within a few KiB that stay in L1)
    rows_first = any(_stride(ld.src[1], n) == 1 for ld in b.toposort if ld.op is Ops.LOAD)
    order = [kk, jo, p] if rows_first or not any(_stride(ld.src[1], red) == 1 for ld in b.toposort
                                                 if ld.op is Ops.LOAD) else [jo, p, kk]
    pack = Kernel(f"{k.name}_pack{len(k.prelude)}", simplify_kernel(copy), args, copies + order, [])
    read = UOp(Ops.LOAD, b.dtype, (panels, offset(batch) + (n // width * depth + red) * width + n % width))
    return replace(k, sink=simplify_kernel(substitute(k.sink, {b: read})), args=args, prelude=k.prelude + (pack,))


def _two_operands(k: Kernel) -> bool:
    """Whether the kernel's one reduction sums products of two factors that each vary along an output loop the
    other does not (a matmul, not a column sum)."""
    reduces = [u for u in k.sink.toposort if u.op is Ops.REDUCE]
    if len(reduces) != 1 or reduces[0].src[0].op is not Ops.MUL: return False
    a, b = (_ranges_in(s) & set(k.ranges) for s in reduces[0].src[0].src)
    return bool(a - b) and bool(b - a)


def _applied(k: Kernel, opt: Opt) -> Kernel | None:
    """k after `opt`, or None where it does not apply."""
    try:
        return apply_opt(k, opt)
    except OptError:
        return None


def _placeholder(k: Kernel) -> int:
    """A buffer id for a prelude kernel's output, below every placeholder the kernel already has (optimize() maps
    them to buffers of the schedule)."""
    return min([a for a in k.args if a < 0], default=0) - 1


def _separate(k: Kernel, opt: Opt) -> Kernel:
    """SEPARATE: the kernel's one REDUCE, which must vary along every output loop, computed by a prelude kernel
    into a buffer [output loops...]; the kernel reads it there."""
    if k.opts or k.init or k.prelude or k.row_ranges is not None:
        raise OptError(f"{opt}: SEPARATE comes before every other action")
    reduces = [u for u in k.sink.toposort if u.op is Ops.REDUCE]
    if len(reduces) != 1 or not k.ranges: raise OptError(f"{opt}: not one reduction")
    red = reduces[0]
    if range_deps(k.sink)[red] != frozenset(k.ranges) or k.sink.src[0].src[2] is red:
        raise OptError(f"{opt}: the reduction is not the operand of an epilogue at every output element")
    pos, size = len(k.args), math.prod(r.arg.size for r in k.ranges)
    buffer = UOp(Ops.PARAM, red.dtype, (), ParamArg(pos, (size,), None))
    index = linear_index(tuple(k.ranges), tuple(r.arg.size for r in k.ranges))
    args = k.args + [_placeholder(k)]
    total = Kernel(f"{k.name}_sum", UOp(Ops.SINK, dtypes.bool_, (UOp(Ops.STORE, dtypes.bool_, (buffer, index, red)),)),
                   args, list(k.ranges), list(k.reduce_ranges))
    sink = simplify_kernel(substitute(k.sink, {red: UOp(Ops.LOAD, red.dtype, (buffer, index))}))
    return replace(k, sink=sink, args=args, reduce_ranges=[], prelude=(total,), opts=(opt,))


def _outer_reduction(sink: UOp, r: UOp) -> UOp | None:
    """The kernel's one reduction over loop `r` when every other reduction is computed inside it (a row's sum
    inside a sum over the rows: `x.sum(-1).mean()`), else None."""
    reductions = [u for u in sink.toposort if u.op is Ops.REDUCE]
    over = [u for u in reductions if r in u.src[1:]]
    if len(over) != 1: return None
    inside = set(over[0].src[0].toposort)
    return over[0] if all(u is over[0] or u in inside for u in reductions) else None


def _partials(k: Kernel, opt: Opt) -> Kernel:
    """PARTIALS: the kernel's one reduction over reduce loop `opt.axis` (n iterations) computed in `opt.amount`
    chunks of ceil(n / amount) (the last masked) by a prelude kernel, one partial per chunk, into a buffer the
    kernel then reduces."""
    if k.opts or k.init or k.prelude or k.row_ranges is not None or k.ranges:
        raise OptError(f"{opt}: PARTIALS comes first, in a kernel without output loops")
    r, parts = k.reduce_ranges[opt.axis], opt.amount
    if len(k.sink.src) != 1 or _outer_reduction(k.sink, r) is None:
        raise OptError(f"{opt}: not one store of one reduction over loop {opt.axis} (others inside it)")
    if not 2 <= parts <= r.arg.size // 2: raise OptError(f"{opt}: amount must be in [2, {r.arg.size // 2}]")
    k, chunk, within = _split(k, r, -(-r.arg.size // parts))
    red = _outer_reduction(k.sink, chunk)
    if red is None: raise OptError(f"{opt}: the reduction does not run over loop {opt.axis}")
    part = UOp(Ops.REDUCE, red.dtype, (red.src[0], *(s for s in red.src[1:] if s is not chunk)), red.arg)
    buffer = UOp(Ops.PARAM, red.dtype, (), ParamArg(len(k.args), (chunk.arg.size,), None))
    args = k.args + [_placeholder(k)]
    store = UOp(Ops.STORE, dtypes.bool_, (buffer, chunk, part))
    prelude = Kernel(f"{k.name}_partials", UOp(Ops.SINK, dtypes.bool_, (store,)), args, [chunk],
                     [s for s in k.reduce_ranges if s is not chunk])
    each = UOp(Ops.RANGE, INDEX, (), RangeArg(_next_id(k), chunk.arg.size))
    total = UOp(Ops.REDUCE, red.dtype, (UOp(Ops.LOAD, red.dtype, (buffer, each)), each), red.arg)
    sink = simplify_kernel(substitute(k.sink, {red: total}))
    return replace(k, sink=sink, args=args, reduce_ranges=[each], prelude=(prelude,), opts=(opt,))


def apply_opt(k: Kernel, opt: Opt) -> Kernel:
    axes = k.ranges + k.reduce_ranges
    if not 0 <= opt.axis < len(axes): raise OptError(f"{opt}: kernel has {len(axes)} loops")
    r, is_output = axes[opt.axis], opt.axis < len(k.ranges)
    if opt.op == "PACK": return replace(_pack(k, opt), opts=k.opts + (opt,))
    if opt.op == "SEPARATE": return _separate(k, opt)
    if opt.op == "PARTIALS": return _partials(k, opt)
    if opt.op == "TC":
        try:
            tensor_core_tile(k)
        except NotTensorCore as err:
            raise OptError(f"{opt}: {err}") from None
        return replace(k, opts=k.opts + (opt,))
    if is_tensor_core(k): raise OptError(f"{opt}: a tensor-core kernel takes no other action")
    if opt.op != "VECTORIZE" and (summed := _row_sum_loops(k)) and (r in summed or opt.op == "SWAP" and (
            k.ranges[opt.amount % len(k.ranges)] in summed)):
        # a carried row sum's loops stay innermost and whole in one thread (fnx/lower/row_sums.py): their lanes only
        raise OptError(f"{opt}: the loop carries a row sum")
    k = replace(k, opts=k.opts + (opt,))
    rows = k.row_ranges
    if rows is not None and ((r in rows) != (opt.op == "THREAD") or opt.op == "SWAP" and (
            {k.ranges[opt.axis], k.ranges[opt.amount % len(k.ranges)]} & set(rows))):
        raise OptError(f"{opt}: the kernel's row loops stay outermost, and only they are thread-split")
    if r in k.init and opt.op in ("THREAD", "UPCAST", "VECTORIZE"):
        raise OptError(f"{opt}: the accumulation loop runs in order")
    if opt.op == "THREAD":
        if not is_output or not (k.parallel or _free_loop(k, r)):
            raise OptError(f"{opt}: not an independent output loop")
        return replace(k, thread_range=opt.axis)
    if opt.op == "SWAP":
        if not is_output or not 0 <= opt.amount < len(k.ranges): raise OptError(f"{opt}: not two output loops")
        if not k.parallel and not (_free_loop(k, r) or _free_loop(k, k.ranges[opt.amount])):
            raise OptError(f"{opt}: both loops run in order")
        ranges = list(k.ranges)
        ranges[opt.axis], ranges[opt.amount] = ranges[opt.amount], ranges[opt.axis]
        thread = k.thread_range
        if thread in (opt.axis, opt.amount): thread = opt.amount if thread == opt.axis else opt.axis
        return replace(k, ranges=ranges, thread_range=thread)
    if opt.op == "ACCUMULATE":
        if k.locals: raise OptError(f"{opt}: the kernel has work-group ranges")
        return _accumulate(k, r)
    if k.thread_range >= 0 and opt.axis == k.thread_range:
        raise OptError(f"{opt}: the loop is split across threads")
    if opt.op in ("LOCAL", "GROUP"): return _work_group(k, opt, r, is_output)
    if k.locals and opt.op == "VECTORIZE": raise OptError(f"{opt}: the kernel has work-group ranges")
    amount = opt.amount
    most = 2 * r.arg.size - 1 if opt.op == "VECTORIZE" else r.arg.size  # lanes may overhang the loop (masked)
    if amount < 2 or amount > most: raise OptError(f"{opt}: amount must be in [2, {most}]")
    if opt.op == "VECTORIZE":
        if k.lanes and k.lanes[0].arg.size != amount:
            raise OptError(f"{opt}: the kernel's lanes are {k.lanes[0].arg.size} wide")
        if not (k.parallel or _free_loop(k, r)) or _store_buffers_read(k):
            raise OptError(f"{opt}: iterations are not independent")
        k, _, inner = _split(k, r, amount)
        deps = [d for u, d in range_deps(k.sink).items() if u.op is not Ops.SINK]  # (the SINK joins every store)
        if k.lanes and any(len(d & {inner, *k.lanes}) > 1 for d in deps):
            raise OptError(f"{opt}: a value would vary along two lane ranges")
        k = replace(k, ranges=[x for x in k.ranges if x is not inner],
                    reduce_ranges=[x for x in k.reduce_ranges if x is not inner], lanes=k.lanes + (inner,))
    elif opt.op == "SPLIT":
        if r.arg.size % amount: raise OptError(f"{opt}: {amount} does not divide {r.arg.size}")
        k, _, _ = _split(k, r, amount)
    elif opt.op in ("UPCAST", "UNROLL"):
        if (opt.op == "UPCAST") != is_output: raise OptError(f"{opt}: wrong kind of loop")
        if opt.op == "UNROLL" and any(r in d for u, d in range_deps(k.sink).items() if u.op is Ops.STORE):
            raise OptError(f"{opt}: a store runs inside this reduce loop (a stash)")
        if r.arg.size % amount and (opt.op == "UNROLL" or k.row_ranges is not None):
            raise OptError(f"{opt}: {amount} does not divide {r.arg.size}")
        if opt.op == "UPCAST" and (not (k.parallel or _free_loop(k, r)) or _store_buffers_read(k)):
            raise OptError(f"{opt}: iterations are not independent")
        k, _, inner = _split(k, r, amount) if r.arg.size % amount == 0 else _split_clamped(k, r, amount)
        k = _unroll_output(k, inner) if opt.op == "UPCAST" else _unroll_reduce(k, inner)
    else:
        raise OptError(f"unknown action {opt.op}")
    return k  # a split puts the outer loop where the old one was: other loops keep their axis numbers


def _work_group(k: Kernel, opt: Opt, r: UOp, is_output: bool) -> Kernel:
    """LOCAL (an output loop) or GROUP (a reduce loop): the inner `opt.amount` iterations become the work item's
    index in its work-group."""
    amount = opt.amount
    if (opt.op == "LOCAL") != is_output: raise OptError(f"{opt}: wrong kind of loop")
    if amount < 2 or amount & (amount - 1): raise OptError(f"{opt}: the work-group size must be a power of two")
    if k.locals and k.locals[0].arg.size != amount:
        raise OptError(f"{opt}: the kernel's work-groups are {k.locals[0].arg.size} wide")
    if k.lanes or k.init or k.prelude or k.row_ranges is not None or not k.parallel or _store_buffers_read(k):
        raise OptError(f"{opt}: only for kernels of independent iterations without lanes, accumulation or stash")
    k, _, inner = _split(k, r, amount)
    if any(len(d & {inner, *k.locals}) > 1 for u, d in range_deps(k.sink).items() if u.op is not Ops.SINK):
        raise OptError(f"{opt}: a value would vary along two work-group ranges")
    return replace(k, ranges=[x for x in k.ranges if x is not inner],
                   reduce_ranges=[x for x in k.reduce_ranges if x is not inner], locals=k.locals + (inner,))


def devectorize(k: Kernel) -> Kernel:
    """Loads and stores whose index moves one element per lane become vector accesses (arg = the lane RANGE)."""
    if not k.lanes: return k

    def fn(u: UOp, src: tuple) -> UOp:
        out = with_src(u, src)
        if u.op not in (Ops.LOAD, Ops.STORE) or u.arg is not None: return out
        parts, const = terms(out.src[1])
        for lanes in k.lanes:
            if sum(c for t, c in parts if t is lanes) != 1: continue
            rest = [(t, c) for t, c in parts if t is not lanes]
            if any(lane in t.toposort for t, _ in rest for lane in k.lanes): continue
            return UOp(u.op, u.dtype, (out.src[0], simplify_kernel(build(INDEX, rest, const)), *out.src[2:]), lanes)
        return out
    return replace(k, sink=_rebuild(k.sink, fn))


# ---- blocked float sums: the last step of every schedule ----

FLAT_SUM_MAX = 256  # a float sum with at most this many additions in a row per accumulator keeps one loop nest
SUM_BLOCK = 16      # additions in a row per level of a blocked float sum
SUM_BLOCK_WIDE = 64  # ... in its innermost level when the loop nest updates WIDE_NEST or more accumulators
WIDE_NEST = 4        # (register blocking: there every level's exit costs as many adds and spills, and 16
                     # iterations did not pay for them: 1024x1024x256 and 256x4096x64 matmuls lost 5-15%)


def _loops(k: Kernel, red: UOp) -> tuple[UOp, ...]:
    """The loops of a REDUCE's nest, outermost first: its ranges less the vector lanes and work-group ranges."""
    return tuple(r for r in red.src[1:] if r not in k.lanes and r not in k.locals)


def _long_float_sum(k: Kernel, u: UOp) -> bool:
    # (not a carried row sum over output loops, fnx/lower/row_sums.py: its rows are short enough)
    return (u.op is Ops.REDUCE and u.arg.op is Ops.ADD and u.dtype.is_float
            and math.prod(r.arg.size for r in _loops(k, u)) > FLAT_SUM_MAX
            and not any(r in k.ranges for r in u.src[1:]))


def _row_sum_loops(k: Kernel) -> set[UOp]:
    """The output loops that carried row sums run over (fnx/lower/row_sums.py)."""
    return {r for st in k.sink.src for u in st.src[2].toposort if u.op is Ops.REDUCE for r in u.src[1:]
            if r in k.ranges}


def _row_sum(k: Kernel, st: UOp) -> bool:
    """Whether STORE st stores what carried row sums give (REDUCEs over output loops: fnx/lower/row_sums.py)."""
    return any(u.op is Ops.REDUCE and any(r in k.ranges for r in u.src[1:]) for u in st.src[2].toposort)


def _inner_level(loops: tuple[UOp, ...], block: int) -> tuple[int, int]:
    """Where the innermost level of at most `block` iterations starts: (j, 0) when loops[j:] make it, or
    (i, d) when loop i must first be split by d (its inner d iterations close the level)."""
    size = 1
    for i in range(len(loops) - 1, -1, -1):
        n = loops[i].arg.size
        if size * n <= block:
            size *= n
            continue
        room = block // size
        d = _largest_divisor(n, room) if room >= 2 else 1
        if d >= max(2, room // 4): return i, d
        return (i + 1, 0) if size > 1 else (i, room)  # a loop with no fitting divisor is split with a masked tail
    raise AssertionError("_inner_level: the loops fit one level")


def _nest(k: Kernel, loops: tuple[UOp, ...], j: int) -> Kernel:
    """Every REDUCE over `loops` becomes a REDUCE over loops[:j] (and its lanes) of a REDUCE over loops[j:] that
    starts from the identity on each iteration: a level of the blocked sum. 16-bit floats sum in float32."""
    inner_loops = set(loops[j:])

    def fn(u: UOp, src: tuple) -> UOp:
        out = with_src(u, src)
        if u.op is not Ops.REDUCE or _loops(k, u) != loops: return out
        wide = u.dtype.is_float and u.dtype.itemsize == 2
        dtype, x = (dtypes.float32, out.src[0].cast(dtypes.float32)) if wide else (u.dtype, out.src[0])
        inner = UOp(Ops.REDUCE, dtype, (x, *loops[j:]), u.arg)
        outer = UOp(Ops.REDUCE, dtype, (inner, *(r for r in u.src[1:] if r not in inner_loops)), u.arg)
        return outer.cast(u.dtype) if wide else outer
    return replace(k, sink=_rebuild(k.sink, fn))


def block_sums(k: Kernel) -> Kernel:
    """Every float sum with more than FLAT_SUM_MAX additions in a row per accumulator becomes levels of at most
    SUM_BLOCK (the innermost of SUM_BLOCK_WIDE in a register-blocked nest): each level sums the partial sums of
    the level inside it, each from a fresh zero. The rounding error grows with the additions in a row, so this
    bounds it by ~(SUM_BLOCK * levels) ulps instead of n / lanes (docs/LOWERING.md). Other reductions over the
    same loops are nested alike (exactly), so one loop nest still computes them all."""
    while (red := next((u for u in k.sink.toposort if _long_float_sum(k, u)), None)) is not None:
        loops = _loops(k, red)
        accumulators = sum(1 for u in k.sink.toposort if u.op is Ops.REDUCE and _loops(k, u) == loops)
        block = SUM_BLOCK_WIDE if accumulators >= WIDE_NEST else SUM_BLOCK
        while math.prod(r.arg.size for r in loops) > block:
            i, d = _inner_level(loops, block)
            if d:
                k, outer, inner = _split(k, loops[i], d)
                loops = loops[:i] + (outer, inner) + loops[i + 1:]
                continue
            k = _nest(k, loops, i)
            loops, block = loops[:i], SUM_BLOCK
    return k


# ---- the hand heuristics ----

def _stride(index: UOp, r: UOp) -> int | None:
    """The coefficient of r in an affine index (None when r appears non-linearly)."""
    parts, _ = terms(index)
    if any(r in t.toposort and t is not r for t, _ in parts): return None
    return sum(c for t, c in parts if t is r)


def _lane_bytes(k: Kernel) -> int:
    """Register bytes of one lane: the kernel's widest value, at least 4 (16-bit floats compute in float32
    registers; narrower integers get as many lanes as float32)."""
    sizes = [(u.src[2] if u.op is Ops.STORE else u).dtype.itemsize for u in k.sink.toposort
             if u.op in (Ops.LOAD, Ops.STORE, Ops.REDUCE) or (u.op is Ops.CAST and u.dtype.is_float)]
    return max([4, *sizes])


def _lane_width(k: Kernel, target: Target) -> int:
    """Lanes of one vector register (at least 4: LLVM splits a wider vector over registers)."""
    return max(4, target.vector_bytes // _lane_bytes(k))


def _block_rows(target: Target, vectors: int) -> int:
    """The most output rows of a register block whose rows hold `vectors` vector accumulators each: at most
    MAX_ACCUMULATORS of them, with room beside them for a row's B vectors and a broadcast of A. 32 registers
    (AVX-512, where the matmul comments were measured): 12 rows of one vector, 8 of two, 4 of four; 16 (AVX2):
    12, 6 (the classic 6 x 16 floats) and 2."""
    accumulators = min(MAX_ACCUMULATORS, target.vector_registers - vectors - 1)
    return max(1, min(MAX_BLOCK_ROWS, accumulators // vectors))


FMA_IN_FLIGHT = 10  # independent FMAs a core needs in flight to keep its FMA units busy: latency x units, 4-5 cycles
                    # x 2 on x86 cores of the last decade; fewer accumulators than this leave the units idle


def _row_block(rows: int, most: int, vectors: int) -> int:
    """Rows of a matmul's register block: the largest divisor of `rows` up to `most`, or `most` itself with a
    clamped remainder (_split_clamped) when that is faster by the estimate that a block costs, per k step, its
    FMAs, its loads (a broadcast per row, a load per vector) or the FMAs in flight, whichever is most. On AVX2,
    6 rows x 2 vectors for 1024 rows (171 blocks, the last computing 2 rows again) beat 4 rows: 157 vs 124
    GFLOP/s at 1024²."""
    divisor = _largest_divisor(rows, most)
    cost = lambda x: -(-rows // x) * max(x * vectors, x + vectors, FMA_IN_FLIGHT)  # noqa: E731
    return most if cost(most) < cost(divisor) else divisor


COLUMN_BLOCK_MAX = 256 << 10  # bytes of B's k-slab per column block at most (the largest measured on the Xeon)


def _block_cost(target: Target, rows: int, vectors: int, per_row: int) -> int:
    """The estimated cost of a matmul whose output is `rows` x `vectors` registers, in register blocks of
    `per_row` vectors a row (and _row_block's rows), per k step (see _row_block)."""
    up = _row_block(rows, _block_rows(target, per_row), per_row)
    return -(-rows // up) * (vectors // per_row) * max(up * per_row, up + per_row, FMA_IN_FLIGHT)


def _column_block(target: Target, panel_bytes: int) -> int:
    """Vector panels of B per column block (a power of two): the block's k-slab, ACC_K rows of `panel_bytes` per
    panel, fills half of L2, at most COLUMN_BLOCK_MAX, so it stays there while every row block walks it; each row
    block's A slab then serves the whole block from L1 (its first panel's misses are shared by more panels). On
    the AVX2 EPYC (512 KiB L2, 4096²): 4 panels 102, 8 147, 16 160, 32 166 GFLOP/s; on the 2 MiB Xeon 8 panels
    of 32 floats (256 KiB) were measured."""
    panels = max(1, min(target.l2_bytes // 2, COLUMN_BLOCK_MAX) // (ACC_K * panel_bytes))
    return 1 << (panels.bit_length() - 1)


SUM_VECTORS = 4  # vectors of lanes a horizontal sum accumulates in, each its own chain of adds: latency x units of
                 # the add (3-4 cycles x 2) want about 8 in flight; the row's elementwise pass gets as many lanes.
                 # Layernorm rows of 1024 floats on the AVX2 EPYC, in cache: 8 lanes 272 ns a row, 16 201, 32 155,
                 # 64 162


ROW_PAIRS = 2    # rows of a (rows, n) kernel whose reductions run along its rows, horizontally, this many at a time
                 # (0: one; a layernorm): each row is a chain of dependent steps (a sum, its horizontal add, the next
                 # pass over the row, a square root...), and two independent ones overlap (W10's layernorms with their
                 # blocks in L1: 2.15-2.22 -> 1.68-1.84 ms; four took 1.28-1.36x as long on the Zen 4 of stop 51).
                 # Not heavy ones (softmax's exp: enough work in flight)

HEAVY_ELEMENT = 10  # weighted ops an element from which an elementwise kernel's lanes span SUM_VECTORS vectors too: a
                   # transcendental's polynomial is a long chain of dependent FMAs


def _sum_vectors(sizes: list[int], w: int) -> int:
    """Vectors of `w` lanes per lane group of a kernel with horizontal reductions: SUM_VECTORS, or fewer where
    that many would leave a masked remainder on one of the vectorized loops (`sizes`)."""
    return next((v for v in (SUM_VECTORS, 2) if all(s % (v * w) == 0 for s in sizes)), 1)


def _loads(k: Kernel) -> list[UOp]:
    return [u for u in k.sink.toposort if u.op is Ops.LOAD]


def _largest_divisor(n: int, limit: int) -> int:
    return max(d for d in range(1, limit + 1) if n % d == 0)


STREAM_LINES = 1     # lanes of a streamed output span a cache line (heuristic_opts)
ACC_K = 256          # the k-slab when accumulating in the output
CACHE_LINE = 64      # bytes: x86 and most ARM cores (Apple's are 128; the rule using it is then only cautious)
MAX_BLOCK_ROWS = 12  # rows of a register block (_block_rows)
MAX_ACCUMULATORS = 16  # vector accumulators of a register block: half of AVX-512's registers
PACK_PASSES = 40     # register blocks of rows, each reading all of B, from which B is packed into panels first: the
                     # copy is then a small part of the matmul (AVX-512 Xeon, 8-row blocks: 512..4096 rows won 15-100%,
                     # 256 rows, 32 passes, lost; AVX2 EPYC, 6-row blocks: 256 rows, 43 passes, won: the W4 step 3.12 ->
                     # 3.04 ms, W12 25.3 -> 24.3 ms)
PACK_A_REUSE = 8     # column blocks that read A's k-slab again: from here A is packed too, a register block's rows
                     # interleaved ([rows / R][k][R]: one stream instead of R rows a row stride apart); on the AVX2
                     # EPYC 4096² (16 blocks) went 160 -> 178 GFLOP/s, 1024² (4 blocks) gained nothing net


def _rows(k: Kernel) -> int:
    """How many times a matmul-like kernel reads B: the iterations of its output loops outside the last, less
    the batch loops along which B changes (each batch's B is read by that batch's rows only)."""
    b = _operand(k, len(k.ranges) - 1)
    walked = _ranges_in(b) if b is not None else set()
    return math.prod(r.arg.size for r in k.ranges[:-1] if r not in walked)


def _transposed_operand(k: Kernel) -> UOp | None:
    """B of a matmul-like kernel when it walks the output's unit-stride loop with another stride (B of a @ b.T)
    and nothing else walks that loop contiguously: packing it into panels makes it a plain matmul."""
    if len(k.sink.src) != 1 or (b := _operand(k, len(k.ranges) - 1)) is None: return None
    inner = k.ranges[-1]
    if _stride(k.sink.src[0].src[1], inner) != 1: return None
    loads = [u for u in b.toposort if u.op is Ops.LOAD]
    if any(_stride(ld.src[1], inner) == 1 for ld in loads) or not loads: return None
    return b


def _packs_b(k: Kernel, target: Target) -> bool:
    """Whether B is worth packing for matmul-like `k`: its rows make PACK_PASSES register blocks (of two vectors a
    row) or more, each reading all of B."""
    return _rows(k) >= PACK_PASSES * _block_rows(target, 2)


def _pack_first(k: Kernel, target: Target, opts: list[Opt], pack_always: bool) -> list[Opt]:
    """`opts` with PACK of B in front when it applies and pays (`_packs_b`), in panels of the lanes."""
    axis = len(k.ranges) - 1
    lanes = [o.amount for o in opts if o.op == "VECTORIZE"]  # a matmul's one: along B's output loop
    if not lanes or not (pack_always or _packs_b(k, target)): return opts
    try:
        apply_opt(k, Opt("PACK", axis, lanes[0]))
    except OptError:
        return opts
    return [Opt("PACK", axis, lanes[0])] + opts


def heuristic_opts(k: Kernel, target: Target, *, packed: bool = False) -> list[Opt]:
    """Hand-chosen actions for `target`: vector lanes on the unit-stride loop, register blocking, cache blocking
    and packing of B for matmul-like reductions, threads on the outermost independent loop. `packed`: the kernel is
    scheduled as the matmul it becomes once its transposed B is packed (a @ b.T)."""
    opts: list[Opt] = []
    if target.grid: return _grid_opts(k, target)
    if not k.parallel and not _store_buffers_read(k): return _window_opts(k, target)
    if not k.parallel or not k.ranges and not k.reduce_ranges or _store_buffers_read(k): return opts
    if (not k.ranges and target.threads > 1 and k.work >= MIN_PARALLEL_WORK
            and k.reduce_ranges[0].arg.size % target.threads == 0):
        # a whole-array reduction has no output loop to thread-split: a chunk's partial per thread, computed first
        # (sum(x * x) over 2^24 floats, AVX-512 Xeon: 2.2 -> 1.2 ms; a loop the threads do not divide is left to
        # one thread: its chunks' masked loads made 2^24 + 1 floats take 2.6 ms)
        if (split := _applied(k, Opt("PARTIALS", 0, target.threads))) is not None:  # (None: several reductions)
            return [Opt("PARTIALS", 0, target.threads)] + heuristic_opts(split, target)
    if (b := _transposed_operand(k)) is not None and _rows(k) >= 8:
        # `a @ b.T`: schedule it as the matmul it becomes once B is packed (a transposing copy into panels)
        red, inner = k.reduce_ranges[0], k.ranges[-1]
        some = next(u for u in b.toposort if u.op is Ops.LOAD)
        row_major = UOp(Ops.LOAD, b.dtype, (some.src[0], red * inner.arg.size + inner))
        plain = replace(k, sink=substitute(k.sink, {b: row_major}))
        opts = heuristic_opts(plain, target, packed=True)
        if any(o.op == "PACK" for o in opts): return opts
        if (with_pack := _pack_first(k, target, opts, pack_always=True)) is not opts: return with_pack
        opts = []
    # (a stash's walk the reductions; a carried row sum's store, once a row, is not what the lanes are for)
    stores = [st for st in (k.sink.src[:1] if k.row_ranges is not None else k.sink.src) if not _row_sum(k, st)]
    w, lane_bytes = _lane_width(k, target), _lane_bytes(k)
    inner = k.ranges[-1] if k.ranges else None
    store_unit = inner is not None and all(_stride(st.src[1], inner) == 1 for st in stores)
    red = k.reduce_ranges[-1] if k.reduce_ranges else None
    loads = _loads(k)
    thread_axis, pack_a = 0, 0
    # matmul-like: every reduction walks some operand with a stride while the output loop walks it contiguously
    # (one matmul, or several summed in one kernel as in h @ wh + x @ wx): lanes along the output loop
    matmul = (red is not None and len(stores) == 1 and store_unit
              and all(any(_stride(ld.src[1], inner) == 1 and _stride(ld.src[1], r) not in (0, 1) for ld in loads)
                      for r in k.reduce_ranges))
    narrow = [a for a, r in enumerate(k.ranges[:-1]) if r.arg.size >= w and any(
        _stride(ld.src[1], r) == 1 and _stride(ld.src[1], red) not in (None, 0) for ld in loads)] if matmul else []
    if matmul and inner.arg.size < w and narrow and len(k.reduce_ranges) == 1:
        # a product with few columns (h.T @ g with 10 classes) whose A walks another output loop contiguously:
        # lanes there and every column unrolled, so A's elementwise producers compute in vectors instead of
        # once per element and broadcast (the W4 step's dW2: 1.92 -> 1.85 ms); the store scatters, once per output
        opts.append(Opt("VECTORIZE", narrow[-1], w))
        if inner.arg.size > 1: opts.append(Opt("UPCAST", len(k.ranges) - 1, inner.arg.size))
        thread_axis = 0
    elif matmul and inner.arg.size >= 8:
        n_out = len(k.ranges)
        slab = red.arg.size * inner.arg.size * stores[0].src[2].dtype.itemsize
        kc = max((d for d in range(ACC_K // 4, ACC_K + 1) if red.arg.size % d == 0), default=0)
        # B's k x n slab over half of L2 (beside A's rows and the output) does not stay there: split it in k
        slabs = (slab > target.l2_bytes // 2 and kc and kc < red.arg.size <= kc * FLAT_SUM_MAX
                 and len(k.reduce_ranges) == 1)  # (more k-slabs would add into the output too many times in a row)
        if (slabs and stores[0].src[2].op is not Ops.REDUCE and stores[0].src[2].dtype.itemsize == lane_bytes
                and _two_operands(k)):
            # under an epilogue (the SGD update fused into a weight gradient), the sum cannot accumulate in the
            # output: computed apart, it takes k-slabs, and the epilogue becomes a pass over the output (x.T @ g
            # - SGD, 256 x 2048 x 1024 on the AVX2 EPYC: 47 -> 113 GFLOP/s; the W9 step 33.1 -> 31.5 ms)
            if (separated := _applied(k, Opt("SEPARATE", 0, 0))) is not None:
                return [Opt("SEPARATE", 0, 0)] + heuristic_opts(separated, target)
        if slabs and stores[0].src[2].op is Ops.REDUCE:
            opts += [Opt("SPLIT", n_out, kc), Opt("ACCUMULATE", n_out)]  # k-slabs, outermost loop
            n_out += 1
            thread_axis = 1
        # two vectors per row inside k-slabs (measured 186 vs 166 GFLOP/s at 1024²); one without them (122 vs 89:
        # unblocked, the wider panel's rows thrash L1 when B's row stride is a multiple of 2 KiB)
        # from contiguous panels (PACK) without k-slabs: the vectors a row that _block_cost finds cheapest (dW1 of
        # the W4 step: on AVX-512 four vectors x four rows, the step 2.11 -> 1.87 ms; on AVX2 two x six, 3.8 ->
        # 3.4 ms); with k-slabs four lose (1024² on AVX-512: 338 vs 351 GFLOP/s)
        pack = packed or _packs_b(k, target)
        if thread_axis and inner.arg.size % (2 * w) == 0: w *= 2
        elif (pack or slab <= target.l2_bytes // 2) and lane_bytes == 4 and n_out >= 2 and inner.arg.size % w == 0:
            # (B in L2 too: the W8 RNN cell's 16 x 64 product took 7.9 us a step in 8 x 1 blocks, 4.6 in 6 x 2)
            widths = [v for v in (4, 2, 1) if inner.arg.size % (v * w) == 0]
            w *= min(widths, key=lambda v: _block_cost(target, k.ranges[-2].arg.size, inner.arg.size // w, v))
        elif inner.arg.size < w: w = 1 << (inner.arg.size - 1).bit_length()  # one masked vector per row
        elif lane_bytes == 4 and n_out >= 2 and (widths := [v for v in (4, 2) if inner.arg.size % (v * w) == 0
                                                           and v * target.vector_bytes <= CACHE_LINE]):
            # B unpacked and beyond L2: a row of the block reads at most a cache line of B's row per k step (wider,
            # rows a multiple of 2 KiB apart thrash L1: 89 vs 122 GFLOP/s with two 64-byte vectors on AVX-512). On
            # AVX2 two vectors are one line and beat one (x.T @ g + SGD, 128 x 1024 x 512: 118 vs 93 GFLOP/s)
            w *= min(widths + [1], key=lambda v: _block_cost(target, k.ranges[-2].arg.size, inner.arg.size // w, v))
        opts.append(Opt("VECTORIZE", n_out - 1, w))
        if n_out - thread_axis >= 2:
            vectors = -(-w * lane_bytes // target.vector_bytes)  # registers a row of the block accumulates in
            up = _row_block(k.ranges[-2].arg.size, _block_rows(target, vectors), vectors)
            if up > 1: opts.append(Opt("UPCAST", n_out - 2, up))
            panels = -(-inner.arg.size // w)
            block = _column_block(target, w * stores[0].src[2].dtype.itemsize)
            if thread_axis and 2 <= block < panels and panels % block == 0:
                # column blocks: the k-slab of B for `block` panels stays in L2 while every row block walks it
                opts += [Opt("SPLIT", n_out - 1, block), Opt("SWAP", n_out - 2, n_out - 1)]
                thread_axis = n_out - 1
                pack_a = up if up > 1 and panels // block >= PACK_A_REUSE else 0
        opts = _pack_first(k, target, opts, pack_always=packed)
        if pack_a and opts[0].op == "PACK":
            try:
                apply_opt(apply_opt(k, opts[0]), Opt("PACK", len(k.ranges) - 2, pack_a))
                opts.insert(1, Opt("PACK", len(k.ranges) - 2, pack_a))
            except OptError:
                pass
    else:
        # lanes on every reduce loop that walks memory contiguously (horizontal reductions) and on the unit-stride
        # output loop, all of one width, as long as no value would vary along two of them (rows of softmax and
        # layernorm: each reduction and the elementwise pass over the row are vectorized)
        rows = [r.arg.size for r in k.reduce_ranges if any(_stride(ld.src[1], r) == 1 for ld in loads)]
        if rows and all(w // 2 < n < w for n in rows) and len(set(rows)) == 1:
            # rows shorter than a vector but over half of one (10 classes on AVX-512's 16 lanes): lanes as wide as
            # the row (LLVM splits the odd vector into whole registers), not scalar code (W5's softmax 15 -> 6.4 us)
            w = rows[0]
        wanted = [len(k.ranges) + i for i, r in enumerate(k.reduce_ranges)
                  if r.arg.size >= w and any(_stride(ld.src[1], r) == 1 for ld in loads)]
        # where lanes along one of them leave every load contiguous or broadcast, not that one along which only a
        # row's value is (the mean of a loss's row sums, `(x * y).sum(-1).mean()`, read a row's max contiguously:
        # lanes across rows gathered x and y, 5.8 ms for 4096 x 1000)
        if clean := [a for a in wanted if all(_stride(ld.src[1], k.reduce_ranges[a - len(k.ranges)]) in (0, 1)
                                              for ld in loads)]:
            wanted = clean
        if not wanted and red is not None and store_unit and inner.arg.size >= w:
            wanted = []  # a strided reduction: lanes along the output
        gathers = any(_stride(ld.src[1], inner) not in (0, 1) for ld in loads) if inner is not None else True
        if store_unit and inner.arg.size >= 4 and not (k.reduce_ranges and gathers):
            wanted.append(len(k.ranges) - 1)  # (lanes whose reduction loop gathers every load lose to scalar code)
        loops = k.ranges + k.reduce_ranges
        if any(a >= len(k.ranges) for a in wanted):
            w *= _sum_vectors([loops[a].arg.size for a in wanted], w)
        elif store_unit:
            w = min(w, inner.arg.size)
            # a row of between one and two vectors (10 classes of 8 lanes): lanes as wide as the row, one vector
            # of odd length that LLVM splits into whole registers, instead of a masked remainder (masked stores
            # are microcoded on AMD: W5's per-example outer products 175 -> 76 us on the AVX2 EPYC)
            if w < inner.arg.size < 2 * w: w = inner.arg.size
            elif k.work and kernel_flops(k) >= HEAVY_ELEMENT * k.work:
                w *= _sum_vectors([inner.arg.size], w)  # independent polynomials in flight (W1 gelu 14.1 -> 11.0 ms)
            # an output stored past the caches (`Kernel.stream`) is stored a whole line at a time, the only
            # non-temporal store there is: lanes of at least a line (AVX2's 8 floats are half of one; the streamed
            # x * a + b over 16M floats on the AVX2 EPYC: 4.9 -> 3.5 ms)
            sizes = [st.src[2].dtype.itemsize for st in stores if st.src[0].arg.slot in k.stream]
            line = CACHE_LINE // min(sizes) if sizes else 0
            if STREAM_LINES and w < line and inner.arg.size % line == 0: w = line
        probe = k
        for axis in wanted:
            try:
                probe = apply_opt(probe, Opt("VECTORIZE", axis, w))
                opts.append(Opt("VECTORIZE", axis, w))
            except OptError:
                pass
        if not k.reduce_ranges and len(k.ranges) - 1 in wanted and (up := _transpose_upcast(probe, w)):
            opts.append(up)
        if (ROW_PAIRS and any(a >= len(k.ranges) for a in wanted) and len(k.ranges) == 2 and thread_axis == 0
                and len(k.ranges) - 1 in wanted  # (the row is written elementwise too: not a row of sums)
                and all(r.arg.size == k.ranges[1].arg.size for r in k.reduce_ranges) and k.ranges[1].arg.size >= 2 * w
                and k.ranges[0].arg.size % ROW_PAIRS == 0 and k.ranges[0].arg.size >= 2 * ROW_PAIRS * target.threads
                and not (k.work and kernel_flops(k) >= HEAVY_ELEMENT * k.work)):
            try:  # ROW_PAIRS rows an iteration
                apply_opt(probe, Opt("UPCAST", 0, ROW_PAIRS))
                opts.append(Opt("UPCAST", 0, ROW_PAIRS))
            except OptError:
                pass
    big = k.work >= (MIN_PARALLEL_ELEMENTS if not k.reduce_ranges else MIN_PARALLEL_WORK)
    # (on one thread, a kernel that is not a matmul still marks its rows thread-split, as one chunk: row chains need
    # that loop, and W10's eight layernorms then run by blocks of rows on one core too, 10.5 -> 5.2 ms)
    if (target.threads > 1 or not matmul) and k.ranges and (big or kernel_flops(k) >= MIN_PARALLEL_FLOPS):
        sizes = _output_loop_sizes(k, opts)
        if len(sizes) > thread_axis and sizes[thread_axis] > 1 and _threadable(k, opts, thread_axis):
            opts.append(Opt("THREAD", thread_axis))
    return opts


def _grid_opts(k: Kernel, target: Target) -> list[Opt]:
    """A grid device's schedule. The grid (THREAD) is the longest independent output loop that every reduction
    indexes (a reduction it did not index would be computed again by every work item); on a tie the inner one, and
    with reductions not the innermost loop when another qualifies (that one goes to the work-group, below).
    Elementwise kernels stop there: one work item per grid iteration, neighbours in memory. With reductions, the
    work-groups: when the outputs alone cannot fill the device (fewer than its compute units times the work-group
    size), each reduction long enough is split across the work-group first (GROUP); otherwise the innermost other
    output loop is (LOCAL: the group's work items walk it together, their loads neighbours); then the other one
    where it still applies. Vector lanes only where the grid loop is the stores' contiguous one in an elementwise
    kernel (_grid_lanes)."""
    if not k.parallel or _store_buffers_read(k): return []
    if target.tensor_cores and (tc := _tensor_cores(k, target)): return tc
    deps, opts, probe = range_deps(k.sink), [], k
    reduces = [u for u in k.sink.toposort if u.op is Ops.REDUCE]
    eligible = [a for a in range(len(k.ranges)) if all(k.ranges[a] in deps[u] for u in reduces)]
    if reduces and len(eligible) > 1: eligible = [a for a in eligible if a != len(k.ranges) - 1]
    for axis in sorted(eligible, key=lambda a: (-k.ranges[a].arg.size, -a)):
        try:
            probe = apply_opt(k, Opt("THREAD", axis))
        except OptError:
            continue
        opts = [Opt("THREAD", axis)]
        break
    if opts and not reduces: return _grid_lanes(k, target, opts[0].axis) or opts
    if target.local_size < 2 or not reduces: return opts
    width = 1 << (target.local_size.bit_length() - 1)  # (a power of two: the group's combine is a tree)
    if opts and (blocked := _grid_register_blocks(k, target, opts[0].axis, width)): return blocked
    groups = [Opt("GROUP", len(k.ranges) + i, width) for i, r in reversed(list(enumerate(k.reduce_ranges)))
              if r.arg.size >= width]  # (innermost first: it walks memory contiguously, the group's loads neighbour)
    inner = [a for a in reversed(range(len(k.ranges))) if a != probe.thread_range and k.ranges[a].arg.size > 1]
    local = [Opt("LOCAL", a, width if groups or k.ranges[a].arg.size >= width
                 else 1 << (k.ranges[a].arg.size - 1).bit_length()) for a in inner]
    outputs = math.prod(r.arg.size for r in k.ranges)
    for choice in ([groups, local] if outputs < target.cores * width else [local, groups]):
        for opt in choice:
            try:
                probe = apply_opt(probe, opt)
            except OptError:
                continue
            opts.append(opt)
            if opt.op == "LOCAL": break  # (one output loop walks the group)
    return opts


GRID_VECTOR_BYTES = 16  # the widest load or store one work item makes: 128 bits, the widest GPU memory instruction


def _grid_lanes(k: Kernel, target: Target, axis: int) -> list[Opt] | None:
    """A light elementwise kernel (under HEAVY_ELEMENT weighted ops an element: memory bound) whose grid loop walks
    every store contiguously: W consecutive elements a work item as vector lanes (its contiguous loads and stores
    one access of up to 128 bits: a quarter of the memory instructions for float32), where W divides the loop and
    the grid keeps at least a work-group per compute unit. Lanes are at most 4 (CUDA's vector types) and as many as
    16 bytes of the widest element allow. On PoCL (the AVX2 EPYC): W1's x*a+b 22.0 -> 15.0 ms; W1's gelu, heavy,
    took 43.5 -> 49.3 ms with lanes (4 copies of its polynomials per work item), so heavy kernels get none."""
    r = k.ranges[axis]
    if not all(st.op is Ops.STORE and _stride(st.src[1], r) == 1 for st in k.sink.src): return None
    if not k.work or kernel_flops(k) >= HEAVY_ELEMENT * k.work: return None
    widest = max(u.src[0].dtype.itemsize for u in k.sink.toposort if u.op in (Ops.LOAD, Ops.STORE))
    w = min(4, GRID_VECTOR_BYTES // widest)
    if w < 2 or r.arg.size % w or r.arg.size // w < target.cores * max(target.local_size, 1): return None
    opts = [Opt("VECTORIZE", axis, w), Opt("THREAD", axis)]
    try:
        apply_opts(k, opts)
    except OptError:
        return None
    return opts


TRANSPOSE_UPCAST = 1  # a loop that a gathered load walks contiguously is unrolled by the lanes (`_transpose_upcast`)
PACK_COPY_THREADS = 1 << 16  # elements of a PACK copy from which it is split across threads: a copy that gathers
                             # runs at 1-8 GB/s, far below the bandwidth a second core adds


def _window_opts(k: Kernel, target: Target) -> list[Opt]:
    """A kernel that runs in order (a scatter): lanes on its innermost loop that is free (`_free_loop`) where the
    store walks it contiguously, and threads on its outermost free loop when there is enough work. Each thread
    and lane then owns its elements, whose writes stay in order (scattering 4096 rows of 256 floats: 1.7 ms
    scalar on one thread)."""
    free = [a for a, r in enumerate(k.ranges) if _free_loop(k, r)]
    if not free or len(k.sink.src) != 1: return []
    opts, w, a = [], _lane_width(k, target), free[-1]
    if _stride(k.sink.src[0].src[1], k.ranges[a]) == 1 and k.ranges[a].arg.size >= w:
        opts.append(Opt("VECTORIZE", a, w))
    sizes = _output_loop_sizes(k, opts)
    if target.threads > 1 and k.work >= MIN_PARALLEL_ELEMENTS and sizes[free[0]] >= 2 * target.threads:
        opts.append(Opt("THREAD", free[0]))
    try:
        apply_opts(k, opts)
    except OptError:
        return []
    return opts


def _transpose_upcast(k: Kernel, w: int) -> Opt | None:
    """UPCAST(a, w) of the output loop `a` along which a load is contiguous where the vector lanes (`w` of them,
    on the innermost loop) gather it: the w unrolled copies then read a w x w block, which the LLVM renderer
    loads as w contiguous rows and transposes in registers (`transposed_blocks`); None where there is no such
    loop. `x.T + 1` over 4096 x 4096 floats gathered every lane from its own line and page: 61 ms, numpy 9.6."""
    if not TRANSPOSE_UPCAST: return None
    inner = k.ranges[-1]
    for ld in _loads(k):
        if _stride(ld.src[1], inner) in (None, 0, 1) or len(ld.src) > 2: continue
        for a, r in enumerate(k.ranges[:-1]):
            if _stride(ld.src[1], r) == 1 and r.arg.size % w == 0 and _applied(k, Opt("UPCAST", a, w)):
                return Opt("UPCAST", a, w)
    return None


def _pack_copy_opts(k: Kernel, target: Target) -> list[Opt] | None:
    """A PACK copy's schedule (None: the heuristics'): lanes along the panel's columns, its contiguous stores
    innermost, whatever order the loads walk (a transposing copy gathers them). The W9 step's attention operands
    (64 batches of 64 x 64) were copied scalar, a column at a time, at 2.7 GB/s: with these, 2 x 1.15 ms of copy
    and product became 2 x 0.76 ms, the step's kernels 32.8 -> 31.3 ms."""
    if target.grid: return None
    stride1 = [a for a, r in enumerate(k.ranges) if _stride(k.sink.src[0].src[1], r) == 1]
    w = _lane_width(k, target)
    if not stride1 or k.ranges[stride1[0]].arg.size % w: return None
    a, last = stride1[0], len(k.ranges) - 1
    opts = ([Opt("SWAP", a, last)] if a != last else []) + [Opt("VECTORIZE", last, w)]
    probe = k
    for opt in opts: probe = _applied(probe, opt) if probe is not None else None
    if probe is not None and (up := _transpose_upcast(probe, w)): opts.append(up)
    if k.work >= PACK_COPY_THREADS and target.threads > 1: opts.append(Opt("THREAD", 0))
    try:
        apply_opts(k, opts)
    except OptError:
        return None
    return opts


def _tensor_cores(k: Kernel, target: Target) -> list[Opt] | None:
    """[TC] for a 16-bit matmul-like kernel of a type the device's tensor cores take (fnx/lower/tensor_core.py)."""
    try:
        tile = tensor_core_tile(k)
    except NotTensorCore:
        return None
    return [Opt("TC", 0, 0)] if tile.dtype.name in target.tensor_cores else None


def _grid_register_blocks(k: Kernel, target: Target, t: int, width: int) -> list[Opt] | None:
    """A matmul-like kernel on a grid (every reduction indexes the grid loop `t` and the innermost output loop,
    and each load depends on only one of them): each work item computes a block of R rows (UPCAST of the grid
    loop) by C columns spaced a work-group apart (LOCAL, then UPCAST), so every load feeds several accumulators.
    R keeps at least 4 work-groups per compute unit; a group walks the columns `width // 4` at a time (measured on
    PoCL, 1024² float32: 1.8 s unblocked, 83 ms with R = 16, 16 columns a group, C = 4)."""
    if len(k.ranges) < 2 or t == len(k.ranges) - 1: return None
    a, deps = len(k.ranges) - 1, range_deps(k.sink)
    rows, cols = k.ranges[t], k.ranges[a]
    if not all(rows in deps[u] and cols in deps[u] for u in k.sink.toposort if u.op is Ops.REDUCE): return None
    if any(rows in deps[ld] and cols in deps[ld] for ld in _loads(k)): return None  # (nothing to reuse)
    r = max((d for d in range(1, 17) if rows.arg.size % d == 0 and rows.arg.size // d >= 4 * target.cores),
            default=1)
    group = max(2, min(width, max(8, width // 4)))
    c = 4 if cols.arg.size % (4 * group) == 0 else 1
    opts = [Opt("SPLIT", t, r), Opt("THREAD", t), Opt("UPCAST", t + 1, r)] if r > 1 else [Opt("THREAD", t)]
    a += 1 if r > 1 and a > t else 0
    opts += [Opt("LOCAL", a, group)] + ([Opt("UPCAST", a, c)] if c > 1 else [])
    try:
        apply_opts(k, opts)
    except OptError:
        return None
    return opts


def _threadable(k: Kernel, opts: list[Opt], axis: int) -> bool:
    """Whether THREAD(axis) applies after `opts` (a kernel with a stash threads only its row loops)."""
    if k.row_ranges is None: return True
    try:
        apply_opt(apply_opts(k, opts), Opt("THREAD", axis))
    except OptError:
        return False
    return True


def _output_loop_sizes(k: Kernel, opts: list[Opt]) -> list[int]:
    """The output loops' sizes after `opts` (worked out without rewriting the kernel's graph)."""
    out, red = [r.arg.size for r in k.ranges], [r.arg.size for r in k.reduce_ranges]
    for o in opts:
        sizes, i = (out, o.axis) if o.axis < len(out) else (red, o.axis - len(out))
        if o.op in ("VECTORIZE", "UPCAST", "UNROLL"): sizes[i] = -(-sizes[i] // o.amount)
        elif o.op == "SPLIT": sizes[i:i + 1] = [sizes[i] // o.amount, o.amount]
        elif o.op == "SWAP": out[o.axis], out[o.amount] = out[o.amount], out[o.axis]
        elif o.op == "ACCUMULATE": out.insert(0, red.pop(i))
    return out


def apply_opts(k: Kernel, opts: list[Opt]) -> Kernel:
    """`opts` applied in order, then the float sums blocked (whatever the schedule) and the accesses devectorized."""
    for opt in opts: k = apply_opt(k, opt)
    return k if is_tensor_core(k) else devectorize(block_sums(k))  # (the tensor cores sum in their own order)


_overrides: list = []   # test hooks: callables (kernel, target) -> actions, innermost last


class schedule_override:
    """`with schedule_override(choose): ...` lowers every kernel with the actions `choose(kernel, target)` returns
    (tests use it to run arbitrary schedules against the oracle)."""

    def __init__(self, choose):
        self.choose = choose

    def __enter__(self):
        _overrides.append(self.choose)

    def __exit__(self, *exc):
        _overrides.remove(self.choose)


def overriding() -> bool:
    """Whether a schedule_override is in effect (its choices may differ between equal kernels)."""
    return bool(_overrides)


def overridden_opts(kernel: Kernel, target: Target) -> list[Opt] | None:
    """The actions the innermost schedule_override chooses for `kernel`, or None (no override, or none for it)."""
    return _overrides[-1](kernel, target) if _overrides else None


def optimize(kernel: Kernel, target: Target, opts: list[Opt] | None = None, new_buffer=None) -> list[Kernel]:
    """The schedule of one kernel for `target`: `opts` when given (a test's override, BEAM's choice), else the
    hand heuristics. Returns the kernels to run in order: PACK's copies, then the kernel
    itself. `new_buffer(dtype, size) -> buffer id` gives PACK's panels a buffer of the schedule (without it they
    keep placeholder ids, -1 and down, at the end of the arguments)."""
    if opts is None: opts = heuristic_opts(kernel, target)
    k = apply_opts(kernel, opts)
    # PACK's copies (no reduce loop) by _pack_copy_opts; a separated sum by the heuristics (its own PACK, init)
    out = [x for p in k.prelude for x in optimize(p, target, None if p.reduce_ranges else _pack_copy_opts(p, target))]
    out.append(replace(k, name=f"{kernel.name}_acc" if k.init else k.name, init=frozenset(), prelude=()))
    if not target.grid: out = [float_arithmetic(x) for x in out]
    if new_buffer is None or not any(a < 0 for x in out for a in x.args): return out
    ids = {}
    for x in out:  # each placeholder is the output of the prelude kernel that writes it
        st = x.sink.src[0]
        if (a := x.args[st.src[0].arg.slot]) < 0 and a not in ids:
            ids[a] = new_buffer(st.src[2].dtype, st.src[0].arg.shape[0])
    return [replace(x, args=[ids.get(a, a) for a in x.args]) for x in out]


__all__ = ["Opt", "OptError", "apply_opt", "apply_opts", "heuristic_opts", "optimize", "devectorize",
           "schedule_override", "overridden_opts", "overriding"]
