"""Division by a value that does not vary along the inner loop: one reciprocal per value, a multiply per element.

`x / sqrt(var)` in a layernorm, `x / x.sum(-1, keepdims=True)`, `x / 3.0`: the divisor is computed outside the
loop (or the vector lanes) that walks x, yet a division per element costs as much as ten multiplies (a 16-lane
vdivps ~6 cycles of one port; W10's eight layernorms spent 40% of their time there). After the schedule is fixed
(the loops' order and the vector lanes are known), such a DIV becomes `(x * recip(b * f)) * f`, the reciprocal
placed with b, outside the loop, by the linearizer.

f is 1 for a divisor whose reciprocal is a normal number, so the result is RN(x * RN(1/b)): within 2 ulp of the
exact quotient (a division rounds once; JAX on the CPU divides the same way). For a divisor too small or too large
for its reciprocal to be normal (|b| < 2^-126 or > 2^126 in float32), f is 2^64 or 2^-64, exact scalings that
keep `1/(b f)` normal, so 1e-30 / 1e-39 is 1e9 and 1e38 / 3e38 is 0.33 (JAX gives inf and 0). Zeros, infinities
and NaNs come out as a division's: 0 and inf divisors through f, NaN through every step.

Only float32 and float64 (a 16-bit float rounds each op's result, and the reciprocal's rounding would add to the
quotient's), on the CPU (a grid device's kernels are memory-bound and keep the division).
"""
from __future__ import annotations

from dataclasses import replace

from fnx import dtypes
from fnx.lower.linearize import range_deps
from fnx.lower.rangeify import Kernel
from fnx.uop import Ops, UOp, with_src

# dtype -> (the smallest |b| whose reciprocal is normal, the scaling of the divisors outside the normal range)
_RANGE = {dtypes.float32: (2.0 ** -126, 64), dtypes.float64: (2.0 ** -1022, 512)}


def hoist_divisions(k: Kernel) -> Kernel:
    """`k` with each float DIV whose divisor is computed outside the DIV's innermost loop or its vector lanes
    made a multiply by the divisor's reciprocal (module doc). Kernels without one are returned as they are."""
    divs = [u for u in k.sink.toposort if u.op is Ops.DIV and u.dtype in _RANGE]
    if not divs: return k
    deps = range_deps(k.sink, frozenset(k.ranges))
    hoisted = {u for u in divs if _outside(k, deps[u], deps[u.src[1]])}
    if not hoisted: return k
    new: dict[UOp, UOp] = {}
    for u in k.sink.toposort:  # (a kernel's graph has no bodies: one walk rebuilds it)
        src = tuple(new[s] for s in u.src)
        new[u] = _by_reciprocal(*src) if u in hoisted else with_src(u, src)
    return replace(k, sink=new[k.sink])


def _outside(k: Kernel, div: frozenset, divisor: frozenset) -> bool:
    """Whether a divisor with ranges `divisor` is computed outside a loop (or the lanes) of the DIV, ranges `div`,
    that runs inside every loop of the divisor's: then each reciprocal serves that loop's iterations."""
    lanes = set(k.lanes)
    if div & lanes and not divisor & lanes: return True  # one scalar for a vector of quotients
    order = {r: i for i, r in enumerate(k.ranges)}
    loops = [r for r in divisor if r not in lanes and r not in k.locals]
    if any(r not in order for r in loops): return False  # a divisor inside a reduce loop: its nesting varies
    outer = max((order[r] for r in loops), default=-1)
    return any(r not in lanes and r not in k.locals and order.get(r, len(order)) > outer for r in div - divisor)


def _by_reciprocal(x: UOp, b: UOp) -> UOp:
    tiny, bits = _RANGE[b.dtype]
    if b.op is Ops.CONST and tiny <= abs(b.arg.value) <= 1 / tiny: return x * b.alu(Ops.RECIP)  # (f is 1)
    one = UOp.const(b.dtype, 1.0)
    small = ((b < tiny).alu(Ops.AND, b.const_like(-tiny) < b))  # |b| < tiny, -0 and subnormals included
    big = (b.const_like(1 / tiny) < b).alu(Ops.OR, b < -1 / tiny)
    f = small.alu(Ops.WHERE, 2.0 ** bits, big.alu(Ops.WHERE, 2.0 ** -bits, one))
    return x * (b * f).alu(Ops.RECIP) * f


__all__ = ["hoist_divisions"]
