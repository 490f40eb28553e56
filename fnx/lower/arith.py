"""Float arithmetic once a kernel's schedule is fixed (the loops' order and the vector lanes are known), on the CPU:
a division by a value computed outside the inner loop becomes one reciprocal and a multiply per element, a
power-of-two constant times such a product scales the outside value instead, and a product added to something
becomes one fused multiply-add.

**Division.** `x / sqrt(var)` in a layernorm, `x / x.sum(-1, keepdims=True)`, `x / 3.0`: the divisor is computed
outside the loop (or the vector lanes) that walks x, yet a division per element costs as much as ten multiplies (a
16-lane vdivps ~6 cycles of one port; W10's eight layernorms spent 40% of their time there). Such a DIV becomes
`(x * recip(b * f)) * f`, the reciprocal placed with b, outside the loop, by the linearizer.

f is 1 for a divisor whose reciprocal is a normal number, so the result is RN(x * RN(1/b)): within 2 ulp of the
exact quotient (a division rounds once; JAX on the CPU divides the same way). For a divisor too small or too large
for its reciprocal to be normal (|b| < 2^-126 or > 2^126 in float32), f is 2^64 or 2^-64, exact scalings that
keep `1/(b f)` normal, so 1e-30 / 1e-39 is 1e9 and 1e38 / 3e38 is 0.33 (JAX gives inf and 0). Zeros, infinities
and NaNs come out as a division's: 0 and inf divisors through f, NaN through every step.

**Contraction.** `a * b + c`, where the product has no other use and c is not itself a product, is one fused
multiply-add (the ADD marked "contract", rendered as llvm.fmuladd): rounded once instead of twice, one op instead
of two (W10's `x + 0.5 * y`; `a * b - c` too). XLA on the CPU contracts the same way. Not when c is a product or
a negated one: `a*b - c*d` would round one product and not the other (z * conj(z) would get an imaginary part).

**Power-of-two scalings.** `c * (a * s)`, c a power of two and s computed outside the product's loop (a row's
reciprocal), is `a * (c * s)`: c·s once per row, a multiply fewer per element, and the product can then fuse with
an add (W10's `x + 0.5 * y`, y = d·r: a multiply and a multiply-add an element become one multiply-add; 3-4% of
W10 on one thread). Scaling by a power of two is exact, so without the fusion the result is bitwise the same,
barring overflow and underflow of a·s (`0.5 * (a * s)` with a·s just past the largest float is inf; the moved
form gives the finite exact result, as the reciprocals' scaling does above). Not c = -1: a negation stays one,
which the contraction below knows.

Only float32 and float64 (a 16-bit float rounds each op's result, which the oracle of its tests does step by step),
and not on grid devices (their kernels are memory-bound and keep plain ops).
"""
from __future__ import annotations

import math
from dataclasses import replace

from fnx import dtypes
from fnx.lower.linearize import range_deps
from fnx.lower.rangeify import Kernel
from fnx.uop import Ops, UOp, with_src

MOVE_SCALINGS = 1  # `_scalings_moved` on (0: off, for bench/ab.py)
# dtype -> (the smallest |b| whose reciprocal is normal, the scaling of the divisors outside the normal range)
_RANGE = {dtypes.float32: (2.0 ** -126, 64), dtypes.float64: (2.0 ** -1022, 512)}


def float_arithmetic(k: Kernel) -> Kernel:
    """`k` with each float DIV whose divisor is computed outside the DIV's innermost loop or its vector lanes made a
    multiply by the divisor's reciprocal, each power-of-two scaling of a product by such a value moved onto that
    value, then each product added to a non-product with no other use contracted (module doc). A kernel with none
    of them is returned as it is."""
    divs = [u for u in k.sink.toposort if u.op is Ops.DIV and u.dtype in _RANGE]
    deps = range_deps(k.sink, frozenset(k.ranges)) if divs else {}
    hoisted = {u for u in divs if _outside(k, deps[u], deps[u.src[1]])}
    sink = _contracted(_scalings_moved(k, _rebuilt(k.sink, {u: _by_reciprocal for u in hoisted})))
    return k if sink is k.sink else replace(k, sink=sink)


def _rebuilt(sink: UOp, rules: dict) -> UOp:
    """`sink` with each node in `rules` made by its rule from its rebuilt sources (a kernel's graph has no bodies:
    one walk rebuilds it); `sink` itself when there is none."""
    if not rules: return sink
    new: dict[UOp, UOp] = {}
    for u in sink.toposort:
        src = tuple(new[s] for s in u.src)
        new[u] = rules[u](*src) if u in rules else with_src(u, src)
    return new[sink]


def _contracted(sink: UOp) -> UOp:
    order, uses = sink.toposort, {}
    for u in order:
        for s in u.src: uses[s] = uses.get(s, 0) + 1

    def negation(u: UOp) -> UOp | None:  # (x - y is x + y * -1: a negation has nothing to round)
        c = next((s for s in u.src if s.op is Ops.CONST and s.arg.value == -1), None)
        return None if c is None else u.src[0] if u.src[1] is c else u.src[1]

    def product(u: UOp) -> bool:  # a product whose rounding an add may skip, or a negated product
        if u.op is not Ops.MUL: return False
        return (neg := negation(u)) is None or neg.op is Ops.MUL

    def fused(p: int):  # the ADD with its product first (the renderer fuses the first source)
        return lambda *src: UOp(Ops.ADD, src[p].dtype, (src[p], src[1 - p]), "contract")

    rules = {}
    for u in order:
        if u.op is not Ops.ADD or u.arg is not None or u.dtype not in _RANGE: continue
        products = [i for i, s in enumerate(u.src) if product(s)]
        if len(products) == 1 and uses[p := u.src[products[0]]] == 1 and negation(p) is None:
            rules[u] = fused(products[0])
    return _rebuilt(sink, rules)


def _power_of_two(u: UOp) -> bool:
    if u.op is not Ops.CONST or u.dtype not in _RANGE: return False
    m, _ = math.frexp(u.arg.value)  # (0, inf and NaN give 0.0, inf and nan: not powers of two)
    return abs(m) == 0.5 and abs(u.arg.value) != 1  # (a negation, x * -1, stays one: `_contracted` knows it)


def _scalings_moved(k: Kernel, sink: UOp) -> UOp:
    """`sink` with each `c * (a * s)`, c a power-of-two constant and s computed outside the product's innermost loop
    or lanes (a layernorm's reciprocal), made `a * (c * s)`: c·s is one multiply outside the loop, and the product
    left, `a * (c s)`, can fuse with an add (W10's `x + 0.5 * (d * r)` becomes one multiply-add where it was a
    multiply and a multiply-add). The same number as before the fusion: scaling by a power of two is exact, so
    RN(a·(c·s)) = c·RN(a·s), barring overflow and underflow (where the moved form is the closer one: `0.5 * (a * s)`
    with a·s just past the float's largest is inf, `a * (0.5 * s)` is not)."""
    order = sink.toposort
    muls = [u for u in order if u.op is Ops.MUL and u.dtype in _RANGE and any(map(_power_of_two, u.src))]
    if not muls or not MOVE_SCALINGS: return sink
    uses: dict[UOp, int] = {}
    for u in order:
        for s in u.src: uses[s] = uses.get(s, 0) + 1
    deps, rules = range_deps(sink, frozenset(k.ranges)), {}
    for u in muls:
        c, p = u.src if _power_of_two(u.src[0]) else u.src[::-1]
        if p.op is not Ops.MUL or uses[p] != 1 or _power_of_two(p.src[0]) or _power_of_two(p.src[1]): continue
        s = next((s for s in p.src if _outside(k, deps[p], deps[s])), None)
        if s is None: continue
        a = p.src[1] if s is p.src[0] else p.src[0]
        rules[u] = lambda *_, a=a, s=s, c=c: a * (s * c)
    return _rebuilt(sink, rules)


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
    """`x / b` as `x * recip(b f) * f` (module doc), or `x * recip(b)` where f is always 1: a constant whose
    reciprocal is normal, or a square root. A float32 square root is at most 2^64 and, of a positive number, at
    least 2^-74.5 (of the smallest subnormal), so its reciprocal is normal; zeros, infinities and NaNs give a
    division's result as they are (x * inf, x * 0, NaN). That drops a multiply per element from `x / sqrt(var +
    eps)`: one of the five ops a layernorm's output pass spends on an element (float64 alike: 2^512, 2^-537)."""
    tiny, bits = _RANGE[b.dtype]
    if b.op is Ops.CONST and tiny <= abs(b.arg.value) <= 1 / tiny or b.op is Ops.SQRT:
        return x * b.alu(Ops.RECIP)  # (f is 1: see _by_reciprocal's doc)
    one = UOp.const(b.dtype, 1.0)
    small = ((b < tiny).alu(Ops.AND, b.const_like(-tiny) < b))  # |b| < tiny, -0 and subnormals included
    big = (b.const_like(1 / tiny) < b).alu(Ops.OR, b < -1 / tiny)
    f = small.alu(Ops.WHERE, 2.0 ** bits, big.alu(Ops.WHERE, 2.0 ** -bits, one))
    return x * (b * f).alu(Ops.RECIP) * f


__all__ = ["float_arithmetic"]
