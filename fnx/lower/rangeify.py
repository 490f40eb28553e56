"""rangeify: decide the kernel split of a FUNCTION and turn each kernel into loops over scalar computation.

Which values get their own buffer (are *realized*): the function's outputs, every REDUCE, SCATTER and CONTIGUOUS,
and any fused value that would otherwise be recomputed too often: one read at several indices (stencils, scans),
or an expensive one broadcast across loops it does not depend on. Everything else fuses into its consumers:
elementwise chains compute in registers and movement ops (reshape, permute, expand, pad, shrink, flip, gather)
become index arithmetic on the loads, never copies.

A kernel here is loops (RANGE) over one realized value: LOADs from buffers, scalar ALU ops, an optional REDUCE
over the innermost ranges, and a STORE.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

from fnx import dtypes
from fnx.dtypes import DType
from fnx.lower.symbolic import simplify_kernel
from fnx.uop import GroupOp, Ops, UOp

INDEX = dtypes.int64
_EXPENSIVE = {Ops.EXP2, Ops.LOG2, Ops.SIN, Ops.SQRT, Ops.DIV, Ops.RECIP, Ops.MOD}


@dataclass
class BufferSpec:
    dtype: DType
    size: int
    kind: str          # 'input' | 'intermediate' | 'output'
    param: int = -1    # input slot for kind 'input'


@dataclass
class Kernel:
    """One kernel: `sink` is SINK(STORE) over scalar ops; args[i] is the schedule buffer behind kernel PARAM i."""
    name: str
    sink: UOp
    args: list[int]
    ranges: list[UOp]            # output loops, outermost first
    reduce_ranges: list[UOp]     # reduction loops, innermost last
    parallel: bool = True        # False when iterations must run in order (scatter)
    thread_candidate: int = 0    # index into ranges of a loop whose iterations are independent
    thread_range: int = -1       # index into ranges split across threads (-1: none), set by optimize
    lanes: UOp | None = None     # a RANGE computed as vector lanes, not a loop (set by optimize)
    opts: tuple = ()             # the optimization actions applied (set by optimize)
    init: tuple = ()             # a kernel that sets the outputs before an accumulating kernel runs (optimize)

    @property
    def work(self) -> int:
        return math.prod(r.arg[1] for r in self.ranges + self.reduce_ranges)


@dataclass
class Schedule:
    kernels: list[Kernel]
    buffers: list[BufferSpec]
    outputs: list[int]            # buffer id of each output
    realized: dict[UOp, int] = field(default_factory=dict)


def strides_of(shape: tuple[int, ...]) -> list[int]:
    out, acc = [], 1
    for s in reversed(shape):
        out.append(acc if s != 1 else 0)
        acc *= s
    return out[::-1]


def linear_index(idx: tuple[UOp, ...], shape: tuple[int, ...]) -> UOp:
    total = UOp.const(INDEX, 0)
    for i, st in zip(idx, strides_of(shape)):
        if st: total = total + i * st
    return total


def reshape_index(idx: tuple[UOp, ...], new_shape: tuple[int, ...], old_shape: tuple[int, ...]) -> tuple[UOp, ...]:
    """Indices into `old_shape` of the element at `idx` of its reshape to `new_shape`."""
    if tuple(s for s in new_shape if s != 1) == tuple(s for s in old_shape if s != 1):  # only size-1 axes change
        kept = iter(i for i, s in zip(idx, new_shape) if s != 1)
        return tuple(next(kept) if s != 1 else UOp.const(INDEX, 0) for s in old_shape)
    flat = linear_index(idx, new_shape)
    out = []
    for s, st in zip(old_shape, strides_of(old_shape)):
        out.append(UOp.const(INDEX, 0) if s == 1 else (flat // st) % s if st else flat % s)
    return tuple(out)


class _Realize(Exception):
    """Raised while building a kernel when a fused value turns out to need its own buffer."""
    def __init__(self, node: UOp):
        self.node = node


def _cost(u: UOp, realized: dict[UOp, int]) -> int:
    """ALU work of the fused cone of u (transcendentals count 10), stopping at realized values."""
    total, seen, stack = 0, set(), [u]
    while stack:
        n = stack.pop()
        if n in seen or n in realized: continue
        seen.add(n)
        total += 10 if n.op in _EXPENSIVE else 1 if n.op in GroupOp.ALU and n.op is not Ops.CAST else 0
        stack.extend(n.src)
    return total


class KernelBuilder:
    """Builds the scalar graph of one kernel: `value(node, idx, gate)` is node's element at index tuple idx."""

    def __init__(self, schedule: Schedule, all_ranges: list[UOp]):
        self.schedule, self.all_ranges = schedule, set(all_ranges)
        self.args: list[int] = []
        self.memo: dict[tuple, UOp] = {}
        self.seen_at: dict[UOp, set] = {}

    def buffer_arg(self, buf_id: int) -> UOp:
        if buf_id not in self.args: self.args.append(buf_id)
        spec = self.schedule.buffers[buf_id]
        return UOp(Ops.PARAM, spec.dtype, (), (self.args.index(buf_id), (spec.size,), None))

    def load(self, buf_id: int, index: UOp, gate: UOp | None) -> UOp:
        src = (self.buffer_arg(buf_id), index) + ((gate,) if gate is not None else ())
        return UOp(Ops.LOAD, self.schedule.buffers[buf_id].dtype, src)

    def value(self, u: UOp, idx: tuple[UOp, ...], gate: UOp | None = None) -> UOp:
        key = (u, idx, gate)
        if (hit := self.memo.get(key)) is not None: return hit
        if (buf := self.schedule.realized.get(u)) is not None:
            out = self.load(buf, linear_index(idx, u.shape), gate)
        else:
            out = self.compute(u, idx, gate)
        self.memo[key] = out
        return out

    def _check_fusion(self, u: UOp, idx: tuple[UOp, ...]) -> None:
        if u.op not in GroupOp.ALU: return
        seen = self.seen_at.setdefault(u, set())
        seen.add(idx)
        if len(seen) > 1 and _cost(u, self.schedule.realized) > 1: raise _Realize(u)
        used = {r for i in idx for r in i.toposort if r.op is Ops.RANGE}
        if used != self.all_ranges and _cost(u, self.schedule.realized) > 8 and u.size > 1: raise _Realize(u)

    def compute(self, u: UOp, idx: tuple[UOp, ...], gate: UOp | None = None) -> UOp:
        """Node u's element at idx from its sources (the kernel's own root is computed, never loaded)."""
        if u.op in _ALWAYS_REALIZED or _is_control_output(u): raise _Realize(u)
        self._check_fusion(u, idx)
        op, src = u.op, u.src
        if op is Ops.CONST: return UOp.const(u.dtype, u.arg[0])
        if op is Ops.IOTA: return idx[u.arg[1]].cast(u.dtype)
        if op in GroupOp.ALU: return UOp(op, u.dtype, tuple(self.value(s, idx, gate) for s in src), u.arg)
        x = src[0]
        if op is Ops.RESHAPE: return self.value(x, reshape_index(idx, u.shape, x.shape), gate)
        if op is Ops.PERMUTE:
            inverse = [0] * len(idx)
            for i, p in enumerate(u.arg): inverse[p] = idx[i]
            return self.value(x, tuple(inverse), gate)
        if op is Ops.EXPAND:
            return self.value(x, tuple(UOp.const(INDEX, 0) if s == 1 else i for i, s in zip(idx, x.shape)), gate)
        if op is Ops.SHRINK: return self.value(x, tuple(i + b for i, (b, _) in zip(idx, u.arg)), gate)
        if op is Ops.FLIP:
            return self.value(x, tuple(UOp.const(INDEX, s - 1) + i * -1 if f else i
                                       for i, s, f in zip(idx, x.shape, u.arg)), gate)
        if op is Ops.PAD: return self._pad(u, idx, gate)
        if op is Ops.INDEX:
            axis, k = u.arg, src[1].ndim
            target = self.value(src[1], idx[axis:axis + k], gate).cast(INDEX)
            n = x.shape[axis]
            clamped = target.alu(Ops.MAX, 0)
            clamped = clamped.alu(Ops.CMPLT, n).alu(Ops.WHERE, clamped, n - 1)
            return self.value(x, idx[:axis] + (clamped,) + idx[axis + k:], gate)
        raise NotImplementedError(f"rangeify: no rule for {op}")

    def _pad(self, u: UOp, idx: tuple[UOp, ...], gate: UOp | None) -> UOp:
        x, valid, inner = u.src[0], None, []
        for i, s, (b, _) in zip(idx, x.shape, u.arg):
            inner.append(i + (-b))
            if i.bounds[0] >= b and i.bounds[1] < b + s: continue
            ok = simplify_kernel((i < b).alu(Ops.CMPNE, True).alu(Ops.AND, i < b + s))
            valid = ok if valid is None else valid.alu(Ops.AND, ok)
        if valid is None: return self.value(x, tuple(inner), gate)
        inner_gate = valid if gate is None else gate.alu(Ops.AND, valid)
        return valid.alu(Ops.WHERE, self.value(x, tuple(inner), inner_gate), UOp.const(u.dtype, 0))


def _ranges(shape: tuple[int, ...], first_id: int) -> tuple[tuple[UOp, ...], list[UOp]]:
    idx, ranges = [], []
    for s in shape:
        if s == 1:
            idx.append(UOp.const(INDEX, 0))
        else:
            r = UOp(Ops.RANGE, INDEX, (), (first_id + len(ranges), s))
            idx.append(r)
            ranges.append(r)
    return tuple(idx), ranges


_INIT = {Ops.ADD: 0, Ops.MUL: 1}


def reduce_identity(op: Ops, dtype: DType):
    if op in _INIT: return _INIT[op] if not dtype.is_bool else op is Ops.MUL
    return -math.inf if dtype.is_float else dtype.min if not dtype.is_bool else False


def _store(builder: KernelBuilder, buf_id: int, index: UOp, value: UOp, gate: UOp | None = None) -> UOp:
    src = (builder.buffer_arg(buf_id), index, value) + ((gate,) if gate is not None else ())
    return UOp(Ops.STORE, dtypes.bool_, src)


def _kernel_for(u: UOp, buf_id: int, schedule: Schedule) -> list[Kernel]:
    """The kernel(s) computing realized node u into buffer buf_id."""
    if u.op is Ops.SCATTER: return _scatter_kernels(u, buf_id, schedule)
    if u.op is Ops.REDUCE:
        (reduce_op, axes), x = u.arg, u.src[0]
        out_idx, ranges = _ranges(u.shape, 0)
        full, reduce_ranges = [], []
        for i, s in enumerate(x.shape):
            if i in axes and s > 1:
                r = UOp(Ops.RANGE, INDEX, (), (len(ranges) + len(reduce_ranges), s))
                reduce_ranges.append(r)
                full.append(r)
            else:
                full.append(UOp.const(INDEX, 0) if i in axes else out_idx[i])
        builder = KernelBuilder(schedule, ranges + reduce_ranges)
        if x.size == 0:
            value = UOp.const(u.dtype, reduce_identity(reduce_op, u.dtype))
        else:
            inner = builder.value(x, tuple(full))
            value = UOp(Ops.REDUCE, u.dtype, (inner, *reduce_ranges), (reduce_op, ())) if reduce_ranges else inner
    else:
        out_idx, ranges = _ranges(u.shape, 0)
        reduce_ranges = []
        builder = KernelBuilder(schedule, ranges)
        if not u.size: value = UOp.const(u.dtype, 0)
        elif u.op is Ops.CONTIGUOUS: value = builder.value(u.src[0], out_idx)
        else: value = builder.compute(u, out_idx)
    sink = UOp(Ops.SINK, dtypes.bool_, (_store(builder, buf_id, linear_index(out_idx, u.shape), value),))
    name = f"{'r' if reduce_ranges else 'E'}_{'_'.join(map(str, u.shape)) or 'scalar'}"
    return [Kernel(name, simplify_kernel(sink), builder.args, ranges, reduce_ranges)]


def _scatter_kernels(u: UOp, buf_id: int, schedule: Schedule) -> list[Kernel]:
    """Copy the operand into the output, then apply the updates in order (one sequential kernel)."""
    x, ind, upd = u.src
    axis, mode = u.arg
    copy = UOp(Ops.CONTIGUOUS, u.dtype, (x,))
    kernels = _kernel_for(copy, buf_id, schedule) if x.size else []
    idx, ranges = _ranges(upd.shape, 0)
    builder = KernelBuilder(schedule, ranges)
    if upd.size == 0: return kernels
    k = ind.ndim
    target = builder.value(ind, idx[axis:axis + k]).cast(INDEX)
    n = x.shape[axis]
    gate = (target < 0).alu(Ops.CMPNE, True).alu(Ops.AND, target < n)
    index = linear_index(idx[:axis] + (target,) + idx[axis + k:], x.shape)
    new = builder.value(upd, idx)
    if mode != "set":
        old = builder.load(buf_id, index, gate)
        combine = {"add": Ops.ADD, "mul": Ops.MUL, "max": Ops.MAX}.get(mode)
        new = old.alu(combine, new) if combine else new.alu(Ops.CMPLT, old).alu(Ops.WHERE, new, old)
        if mode == "min" and u.dtype.is_float:  # NaN propagates, as in numpy.minimum
            new = old.alu(Ops.CMPNE, old).alu(Ops.WHERE, old, new)
    sink = UOp(Ops.SINK, dtypes.bool_, (_store(builder, buf_id, index, new, gate),))
    return kernels + [Kernel(f"S_{'_'.join(map(str, upd.shape))}", simplify_kernel(sink), builder.args, ranges, [],
                             parallel=False)]


_ALWAYS_REALIZED = (Ops.REDUCE, Ops.SCATTER, Ops.CONTIGUOUS)


def _is_control_output(u: UOp) -> bool:
    return u.op is Ops.GETTUPLE and u.src[0].op in GroupOp.Control


def _must_realize(body: UOp) -> list[UOp]:
    return [u for u in body.graph if u.op in _ALWAYS_REALIZED or _is_control_output(u)]


@dataclass
class ControlStep:
    """A control-flow node run on the host: its inputs (COND: predicate first) and one buffer per output."""
    node: UOp
    inputs: list[int]
    outputs: list[int]
    name: str = "control"


def _control_step(node: UOp, schedule: Schedule) -> ControlStep:
    """Buffers for every output of a control node, fed by its (already realized) operands."""
    values = list(node.operands)  # COND: the predicate, then the operands
    missing = [v for v in values if v not in schedule.realized]
    if missing: raise _Realize(missing[0])
    body = node.src[0]
    outputs = []
    for i in range(len(body.src)):
        g = UOp(Ops.GETTUPLE, body.src[i].dtype, (node,), i)
        schedule.buffers.append(BufferSpec(g.dtype, g.size, "intermediate"))
        schedule.realized[g] = len(schedule.buffers) - 1
        outputs.append(len(schedule.buffers) - 1)
    return ControlStep(node, [schedule.realized[v] for v in values], outputs, f"{node.op.name.lower()}")


def rangeify(fn: UOp) -> Schedule:
    """Split FUNCTION `fn` (over PARAMs) into kernels; see the module docstring."""
    body = fn.src[0]
    params = sorted((u for u in body.graph if u.op is Ops.PARAM), key=lambda p: p.arg[0])
    nparams = max(len(fn.src) - 1, max((p.arg[0] for p in params), default=-1) + 1)
    buffers = [BufferSpec(dtypes.bool_, 0, "input", i) for i in range(nparams)]
    schedule = Schedule([], buffers, [])
    for p in params:
        buffers[p.arg[0]] = BufferSpec(p.dtype, p.size, "input", p.arg[0])
        schedule.realized[p] = p.arg[0]
    pending = _must_realize(body) + [o for o in body.src if o.op is not Ops.PARAM]
    done: set[UOp] = set()
    while pending:
        u = pending.pop(0)
        if u in done: continue
        if _is_control_output(u):
            if u not in schedule.realized:
                try:
                    schedule.kernels.append(_control_step(u.src[0], schedule))
                except _Realize as need:
                    pending[:0] = [need.node, u]
                    continue
            done.add(u)
            continue
        if u.op is Ops.RESHAPE and (u.src[0] in schedule.realized or u.src[0].op in _ALWAYS_REALIZED):
            if u.src[0] not in schedule.realized:  # a reshape of a buffer is the same buffer: realize the base
                pending[:0] = [u.src[0], u]
                continue
            schedule.realized[u] = schedule.realized[u.src[0]]
            done.add(u)
            continue
        buf_id = len(buffers)
        buffers.append(BufferSpec(u.dtype, u.size, "intermediate"))
        schedule.realized[u] = buf_id
        try:
            kernels = _kernel_for(u, buf_id, schedule)
        except _Realize as need:
            del schedule.realized[u]
            buffers.pop()
            pending[:0] = [need.node, u]  # realize the dependency first, then retry
            continue
        schedule.kernels.extend(kernels)
        done.add(u)
    for o in body.src:
        if o not in schedule.realized and o.op is Ops.PARAM: schedule.realized[o] = o.arg[0]
        buf_id = schedule.realized[o]
        schedule.outputs.append(buf_id)
        if buffers[buf_id].kind == "intermediate": buffers[buf_id].kind = "output"
    return schedule
