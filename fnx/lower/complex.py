"""Complex values out of a FUNCTION before rangeify: each becomes a float array with a trailing axis of 2.

The frontend computes on complex numbers through their parts (REAL, IMAG, COMPLEX; docs/COMPLEX.md), so a graph
holds complex values only in the ops that move or add them: inputs, constants, movement ops, INDEX, SCATTER (set,
add), ADD, REDUCE(ADD), WHERE, CAST, markers and collectives (the ones transforms build: a cotangent accumulates
with ADD, a broadcast's transposes to a REDUCE). Each of those is the same op on the value's (..., 2) float view,
numpy's memory layout of a complex array (real part first), so the kernel compiler and every backend see floats
only.

`split_complex` rewrites the top level of a FUNCTION; `complex_buffers` then gives the schedule's buffers of
complex inputs and outputs their complex type back (the same bytes), so callers pass and receive complex arrays.
"""
from __future__ import annotations

from fnx import dtypes
from fnx.errors import UnsupportedError
from fnx.lower.rangeify import Schedule
from fnx.uop import GroupOp, Ops, ReduceArg, UOp


def split_complex(fn: UOp) -> tuple[UOp, set[int], set[int]]:
    """FUNCTION `fn` computing on float pairs instead of complex values; also the slots of its complex inputs and
    the positions of its complex outputs (empty sets, and `fn` itself, when it has none)."""
    body = fn.src[0]
    nodes = body.graph
    if not any(u.dtype.is_complex for u in nodes): return fn, set(), set()
    split = _Split()
    for u in nodes:
        if u is not body: split.visit(u)
    outs = tuple(split.pairs[o] if o.dtype.is_complex else split.real(o) for o in body.src)
    outputs = {i for i, o in enumerate(body.src) if o.dtype.is_complex}
    return UOp(Ops.FUNCTION, fn.dtype, (UOp(Ops.TUPLE, body.dtype, outs, body.arg), *fn.src[1:])), split.inputs, outputs


def complex_buffers(schedule: Schedule, inputs: set[int], outputs: set[int]) -> None:
    """Give the buffers of complex inputs (by slot) and outputs (by position) their complex type back."""
    fixed: set[int] = set()
    ids = [i for i, spec in enumerate(schedule.buffers) if spec.kind == "input" and spec.param in inputs]
    for i in ids + [schedule.outputs[j] for j in outputs]:
        if i in fixed: continue
        fixed.add(i)
        spec = schedule.buffers[i]
        spec.dtype, spec.size = dtypes.complex_of(spec.dtype), spec.size // 2


class _Split:
    """The rewrite: `pairs` maps each complex node to its float view, `memo` each real node to its new node."""

    def __init__(self):
        self.pairs: dict[UOp, UOp] = {}
        self.memo: dict[UOp, UOp] = {}
        self.inputs: set[int] = set()

    def real(self, u: UOp) -> UOp:
        return self.memo.get(u, u)

    def visit(self, u: UOp) -> None:
        if u.dtype.is_complex:
            self.pairs[u] = self.pair(u)
            return
        if u.op in (Ops.REAL, Ops.IMAG):
            z = self.pairs[u.src[0]]
            part = 0 if u.op is Ops.REAL else 1
            bounds = tuple((0, s) for s in u.shape) + ((part, part + 1),)
            self.memo[u] = UOp(Ops.RESHAPE, u.dtype, (UOp(Ops.SHRINK, u.dtype, (z,), bounds),), u.shape)
            return
        if any(s.dtype.is_complex for s in u.src):
            raise UnsupportedError(f"{u.op.name} with a complex operand: complex values cannot cross control flow or "
                                   "calls yet (pass their real and imaginary parts)")
        src = tuple(self.real(s) for s in u.src)
        if any(a is not b for a, b in zip(src, u.src)): self.memo[u] = UOp(u.op, u.dtype, src, u.arg)

    def pair(self, u: UOp) -> UOp:
        op, arg, shape, comp = u.op, u.arg, u.shape, u.dtype.component
        view = shape + (2,)
        if op is Ops.PARAM:
            if arg.tag == (): self.inputs.add(arg.slot)
            return UOp(Ops.PARAM, comp, (), arg._replace(shape=view))
        if op is Ops.CONST:
            value = complex(arg.value)
            return _stack(UOp.const(comp, value.real, shape), UOp.const(comp, value.imag, shape))
        if op is Ops.COMPLEX: return _stack(self.real(u.src[0]), self.real(u.src[1]))
        if op in GroupOp.Movement: return UOp(op, comp, (self.pairs[u.src[0]],), _movement_arg(op, arg, len(shape)))
        if op is Ops.INDEX: return UOp(op, comp, (self.pairs[u.src[0]], self.real(u.src[1])), arg)
        if op is Ops.ADD: return UOp(op, comp, (self.pairs[u.src[0]], self.pairs[u.src[1]]))
        if op is Ops.SCATTER and arg.mode in ("set", "add"):
            return UOp(op, comp, (self.pairs[u.src[0]], self.real(u.src[1]), self.pairs[u.src[2]]), arg)
        if op is Ops.REDUCE and arg.op is Ops.ADD:
            return UOp(op, comp, (self.pairs[u.src[0]],), ReduceArg(Ops.ADD, arg.axes))
        if op is Ops.WHERE:
            cond = self.real(u.src[0])
            wide = UOp(Ops.EXPAND, cond.dtype, (UOp(Ops.RESHAPE, cond.dtype, (cond,), shape + (1,)),), view)
            return UOp(op, comp, (wide, self.pairs[u.src[1]], self.pairs[u.src[2]]))
        if op is Ops.CAST: return UOp(op, comp, (self.pairs[u.src[0]],))
        if op in GroupOp.Marker or op is Ops.COLLECTIVE: return UOp(op, comp, (self.pairs[u.src[0]],), arg)
        raise UnsupportedError(f"the compiler has no rule for complex {op.name} (complex values reach it only "
                               "through movement ops, ADD, REDUCE(ADD), WHERE, CAST and their parts)")


def _stack(re: UOp, im: UOp) -> UOp:
    """Two float arrays of one shape as one with a trailing axis of 2 (re first). The lanes are selected (PAD +
    WHERE), not added: PAD fills with +0.0, and -0.0 + 0.0 is +0.0, so a sum lost every negative zero part (x + x
    for x = 0-0j came out 0+0j; the sign picks sqrt's and log's branch)."""
    shape, n = re.shape, len(re.shape)
    zero = UOp.const(re.dtype, 0.0, shape)  # (the padding itself: a +0.0 part needs no lane of its own)
    padded = []
    for part, widths in ((re, (0, 1)), (im, (1, 0))):
        column = UOp(Ops.RESHAPE, part.dtype, (part,), shape + (1,))
        padded.append(None if part is zero else UOp(Ops.PAD, part.dtype, (column,), ((0, 0),) * n + (widths,)))
    if padded[0] is None or padded[1] is None:
        return padded[0] or padded[1] or UOp.const(re.dtype, 0.0, shape + (2,))
    lane = UOp(Ops.RESHAPE, dtypes.bool_, (UOp.const(dtypes.bool_, True, shape),), shape + (1,))
    is_im = UOp(Ops.PAD, dtypes.bool_, (lane,), ((0, 0),) * n + ((1, 0),))
    return UOp(Ops.WHERE, re.dtype, (is_im, padded[1], padded[0]))


def _movement_arg(op: Ops, arg, ndim: int):
    """A movement op's argument for the view with one more (trailing, untouched) axis of 2."""
    if op in (Ops.RESHAPE, Ops.EXPAND): return tuple(arg) + (2,)
    if op is Ops.PERMUTE: return tuple(arg) + (ndim,)
    if op in (Ops.PAD, Ops.SHRINK): return tuple(arg) + (((0, 0),) if op is Ops.PAD else ((0, 2),))
    return tuple(arg) + (False,)  # FLIP
