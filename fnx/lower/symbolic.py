"""Algebraic simplification as rewrite rules: constant folding, identities, movement-op merging (on array graphs),
and integer index arithmetic with value bounds (on kernel graphs)."""
from __future__ import annotations

import math

import numpy as np

from fnx import dtypes
from fnx.reference import primitive
from fnx.rewrite import PatternMatcher, UPat, graph_rewrite, substitute
from fnx.uop import GroupOp, Ops, RangeArg, UOp, scalar_of


def _fold(u: UOp) -> UOp | None:
    """Evaluate an ALU node whose sources are all constants (with the interp backend's exact semantics)."""
    if not all(s.op is Ops.CONST for s in u.src): return None
    value = primitive(u, [np.array(s.arg.value, dtype=s.dtype.np) for s in u.src])
    return UOp.const(u.dtype, np.asarray(value).reshape(()).item(), u.shape)


def _const(u: UOp, value) -> UOp:
    return UOp.const(u.dtype, value, u.shape)


def _is_int(u: UOp) -> bool:
    return not u.dtype.is_float


def _reshape_merge(x: UOp, r: UOp) -> UOp | None:
    return UOp(Ops.RESHAPE, r.dtype, (x.src[0],), r.arg) if x.src[0].shape != r.arg else x.src[0]


def _movement_of_const(m: UOp, c: UOp) -> UOp | None:
    # PAD fills with +0: a constant of other bits (-0.0 too: it equals 0) is not the same everywhere once padded
    # (hash-consing keys floats by their bits, so only +0 itself is that node)
    if m.op is Ops.PAD and c is not UOp.const(c.dtype, 0, c.shape): return None
    return UOp.const(c.dtype, c.arg.value, m.shape)


# rules that hold for array graphs and kernel graphs alike
algebra = PatternMatcher([
    (UPat(GroupOp.ALU, name="u"), _fold),
    (UPat(Ops.ADD, src=(UPat.var("x"), UPat.const(0, "z")), commutative=True),  # -0.0 + 0.0 is 0.0: keep for floats
     lambda x, z: x if not x.dtype.is_float or math.copysign(1.0, z.arg.value) < 0 else None),
    (UPat(Ops.MUL, src=(UPat.var("x"), UPat.const(1)), commutative=True), lambda x: x),
    (UPat(Ops.MUL, src=(UPat.var("x"), UPat.const(0, "z")), commutative=True),
     lambda x, z: z if _is_int(x) else None),
    (UPat(Ops.DIV, src=(UPat.var("x"), UPat.const(1))), lambda x: x if _is_int(x) else None),
    (UPat(Ops.WHERE, src=(UPat.cvar("c"), UPat.var("a"), UPat.var("b"))), lambda c, a, b: a if c.arg.value else b),
    (UPat(Ops.WHERE, src=(UPat(), UPat.var("a"), UPat.var("b")), predicate=lambda u: u.src[1] is u.src[2]),
     lambda a, b: a),
    (UPat(Ops.CAST, name="c", predicate=lambda u: u.dtype == u.src[0].dtype), lambda c: c.src[0]),
    (UPat(Ops.AND, src=(UPat.var("x"), UPat.const(True)), commutative=True),
     lambda x: x if x.dtype.is_bool else None),
    (UPat(Ops.AND, src=(UPat.var("x"), UPat.const(False, "f")), commutative=True),
     lambda x, f: f if x.dtype.is_bool and x.shape == f.shape else None),
    # a bool cast to a number and compared with zero is the bool itself (where(x > 0, ...) on float masks)
    (UPat(Ops.CMPNE, src=(UPat(Ops.CAST, name="c"), UPat.const(0))),
     lambda c: c.src[0] if c.src[0].dtype.is_bool else None),
])

def _reduce_of_broadcast(r: UOp, e: UOp) -> UOp | None:
    """A reduction of an array broadcast along axes it keeps is the reduction of the smaller array, broadcast:
    each output element reduces the same values in the same order, once instead of once per copy (the cotangent
    of a sum, ones @ w.T, reduced every row of w again for each of the batch's rows)."""
    x, axes = e.src[0], r.arg.axes
    if any(x.shape[a] != e.shape[a] for a in axes): return None  # a reduced axis is broadcast: not this rule
    small = UOp(Ops.REDUCE, r.dtype, (x,), r.arg)
    return UOp(Ops.EXPAND, r.dtype, (small,), r.shape)


def _reduce_of_const(r: UOp, c: UOp) -> UOp | None:
    """A reduction of a constant array is a constant: n copies of v sum to n * v, rounded once (as JAX folds
    `jnp.ones((10**6, 10**6)).sum()` instead of running 10^12 additions); integers wrap as the loop would."""
    op, axes = r.arg.op, r.arg.axes
    n = math.prod(c.shape[a] for a in axes)
    v = c.arg.value
    if n == 0 or c.dtype.is_bool: return None
    if op is Ops.MAX: return _const(r, v)
    if c.dtype.is_float:
        try:
            exact = v * n if op is Ops.ADD else math.pow(v, n)
        except OverflowError:
            exact = math.inf if v > 0 or n % 2 == 0 else -math.inf
        with np.errstate(over="ignore"):
            return _const(r, np.array(exact, dtype=c.dtype.np).item())
    bits = 8 * c.dtype.itemsize
    return _const(r, scalar_of(v * n if op is Ops.ADD else pow(v, n, 1 << bits), c.dtype))


# rules for array graphs: merge and drop movement ops, fold movement of constants
movement = PatternMatcher([
    (UPat(Ops.REDUCE, src=(UPat.cvar("c"),), name="r"), _reduce_of_const),
    (UPat(Ops.REDUCE, src=(UPat(Ops.EXPAND, name="e"),), name="r"), _reduce_of_broadcast),
    (UPat(GroupOp.Movement, src=(UPat.cvar("c"),), name="m"), _movement_of_const),
    (UPat(Ops.RESHAPE, src=(UPat(Ops.RESHAPE, name="x"),), name="r"), _reshape_merge),
    (UPat({Ops.RESHAPE, Ops.EXPAND}, name="r", predicate=lambda u: u.arg == u.src[0].shape), lambda r: r.src[0]),
    (UPat(Ops.PERMUTE, name="p", predicate=lambda u: u.arg == tuple(range(len(u.arg)))), lambda p: p.src[0]),
    (UPat(Ops.PERMUTE, src=(UPat(Ops.PERMUTE, name="q"),), name="p"),
     lambda p, q: UOp(Ops.PERMUTE, p.dtype, (q.src[0],), tuple(q.arg[i] for i in p.arg))),
    (UPat(Ops.EXPAND, src=(UPat(Ops.EXPAND, name="x"),), name="e"),
     lambda e, x: UOp(Ops.EXPAND, e.dtype, x.src, e.arg)),
    (UPat(Ops.DETACH, name="d"), lambda d: d.src[0]),
    # a COPY stays only where it moves a value between devices (a transfer item of the executable)
    (UPat(Ops.COPY, name="d", predicate=lambda u: u.src[0].device in (None, u.arg)), lambda d: d.src[0]),
    (UPat(Ops.FLIP, name="f", predicate=lambda u: not any(u.arg)), lambda f: f.src[0]),
])


def simplify_graph(root: UOp, memo: dict[UOp, UOp] | None = None) -> UOp:
    """Array-level simplification of a graph (a FUNCTION body or any node); `memo` receives what each node
    became."""
    return graph_rewrite(root, _array_rules, memo=memo)


# ---- index arithmetic on kernel graphs (integers, scalar) ----

def terms(u: UOp) -> tuple[list[tuple[UOp, int]], int]:
    """Write an integer expression as sum(coef * term) + constant (flattening ADD chains and MUL by constants)."""
    if u.op is Ops.CONST: return [], u.arg.value
    if u.op is Ops.ADD:
        (a, ca), (b, cb) = terms(u.src[0]), terms(u.src[1])
        return a + b, ca + cb
    if u.op is Ops.MUL and u.src[1].op is Ops.CONST:
        inner, c = terms(u.src[0])
        k = u.src[1].arg.value
        return [(t, coef * k) for t, coef in inner], c * k
    return [(u, 1)], 0


def build(dtype: dtypes.DType, parts: list[tuple[UOp, int]], constant: int) -> UOp:
    out = None
    for t, coef in parts:
        if coef == 0: continue
        term = t if coef == 1 else UOp(Ops.MUL, dtype, (t, UOp.const(dtype, coef)))
        out = term if out is None else UOp(Ops.ADD, dtype, (out, term))
    if out is None: return UOp.const(dtype, constant)
    return out if constant == 0 else UOp(Ops.ADD, dtype, (out, UOp.const(dtype, constant)))


def row_stride(index: UOp, row: UOp, lanes: int) -> int | None:
    """S when `index` (of a `lanes`-wide access) is `row * S + rest` with `0 <= rest` and `rest + lanes <= S`,
    else None."""
    parts, const = terms(index)
    strides = [c for t, c in parts if t is row]
    rest = [(t, c) for t, c in parts if t is not row]
    if len(strides) != 1 or strides[0] <= 0 or any(row in t.toposort for t, _ in rest): return None
    lo, hi = build(index.dtype, rest, const).bounds
    return strides[0] if lo >= 0 and hi + lanes <= strides[0] else None


def _bounds_of(parts: list[tuple[UOp, int]], constant: int) -> tuple[int, int]:
    lo = hi = constant
    for t, coef in parts:
        a, b = t.bounds
        lo, hi = lo + min(a * coef, b * coef), hi + max(a * coef, b * coef)
    return lo, hi


def _div_mod(x: UOp, d: UOp, mod: bool) -> UOp | None:
    """(sum c_i t_i + k) // d or % d for a positive constant d and non-negative x."""
    dv = d.arg.value
    if dv <= 0 or x.bounds[0] < 0: return None
    if dv == 1: return UOp.const(x.dtype, 0) if mod else x
    parts, constant = terms(x)
    lo, hi = _bounds_of(parts, constant)
    if 0 <= lo and hi < dv: return x if mod else UOp.const(x.dtype, 0)
    whole = [(t, c // dv) for t, c in parts if c % dv == 0]
    rest = [(t, c) for t, c in parts if c % dv != 0]
    k_whole, k_rest = divmod(constant, dv)
    rlo, rhi = _bounds_of(rest, k_rest)
    if not (0 <= rlo and rhi < dv):
        if (x.op is Ops.DIV) and not mod and x.src[1].op is Ops.CONST and x.src[0].bounds[0] >= 0:
            return UOp(Ops.DIV, x.dtype, (x.src[0], UOp.const(x.dtype, x.src[1].arg.value * dv)))
        if whole and all(c > 0 for _, c in rest) and rlo >= 0:
            # split: the divisible part passes through; keep the rest under the op
            rest_expr = build(x.dtype, rest, k_rest)
            if mod: return UOp(Ops.MOD, x.dtype, (rest_expr, d)) if rest_expr is not x else None
            return build(x.dtype, whole + [(UOp(Ops.DIV, x.dtype, (rest_expr, d)), 1)], k_whole)
        return _factored_div_mod(x.dtype, parts, constant, dv, mod)
    if mod: return build(x.dtype, rest, k_rest)
    return build(x.dtype, whole, k_whole)


def _factored_div_mod(dtype, parts: list[tuple[UOp, int]], constant: int, dv: int, mod: bool) -> UOp | None:
    """(g * y + z) // d = y // (d / g) and % d = (y % (d / g)) * g + z, where g divides d, the constant and the
    coefficients of the terms with the largest coefficients (y: those terms and the constant over g), and the
    other terms z stay within [0, g). The row of a (16, 64, 128) input read as 1024 rows in register blocks of 6:
    (768 * block + 128 * i + k) // 8192 becomes (6 * block + i) // 64, free of the reduce loop's k and so hoisted
    out of it."""
    ordered = sorted(parts, key=lambda p: -abs(p[1]))
    for j in range(len(ordered) - 1, 0, -1):
        big, small = ordered[:j], ordered[j:]
        g = math.gcd(dv, constant, *(c for _, c in big))
        lo, hi = _bounds_of(small, 0)
        if g > 1 and 0 <= lo and hi < g:
            y = build(dtype, [(t, c // g) for t, c in big], constant // g)
            if not mod: return UOp(Ops.DIV, dtype, (y, UOp.const(dtype, dv // g)))
            return build(dtype, [(UOp(Ops.MOD, dtype, (y, UOp.const(dtype, dv // g))), g)] + small, 0)
    return None


def _lt_const(x: UOp, c: UOp) -> UOp | None:
    lo, hi = x.bounds
    if hi < c.arg.value: return UOp.const(dtypes.bool_, True)
    if lo >= c.arg.value: return UOp.const(dtypes.bool_, False)
    return None


def _like_terms(u: UOp) -> tuple[dict[UOp, int], int]:
    """An integer sum's terms with like terms merged {term: coefficient}, and its constant."""
    parts, constant = terms(u)
    merged: dict[UOp, int] = {}
    for t, c in parts: merged[t] = merged.get(t, 0) + c
    return merged, constant


def _sorted_sum(dtype: dtypes.DType, merged: dict[UOp, int], constant: int) -> UOp:
    return build(dtype, sorted(merged.items(), key=lambda p: _order(p[0])), constant)


def _canonical_sum(u: UOp) -> UOp | None:
    """Merge like terms and constants of an ADD chain, so equal indices become the same node."""
    merged, constant = _like_terms(u)
    _recombine(merged)
    out = _sorted_sum(u.dtype, merged, constant)
    return out if out is not u else None


def _recombine(merged: dict[UOp, int]) -> bool:
    """In a sum's terms {term: coefficient}, b c (x // c) + b (x % c) becomes b x (C's division and remainder make
    x = c (x // c) + x % c for every x). A reshape merged into a reduction's loop (the GPT step's (B, T) rows summed
    in a weight gradient) left that pair in the inner loop. Whether any pair was found."""
    quotients = {t.src: (t, c) for t, c in merged.items() if t.op is Ops.DIV and t.src[1].op is Ops.CONST and c}
    found = False
    for t, b in list(merged.items()):
        if t.op is Ops.MOD and b and (q := quotients.get(t.src)) is not None and q[1] == b * t.src[1].arg.value:
            del merged[t], merged[q[0]]
            merged[t.src[0]] = merged.get(t.src[0], 0) + b
            found = True
    return found


def _recombined(u: UOp) -> UOp | None:
    """A sum of two terms (the chains are _canonical_sum's) with a quotient and remainder pair (`_recombine`)."""
    if u.src[0].op is Ops.ADD or not any(s.op is Ops.MOD or s.op is Ops.MUL and s.src[0].op is Ops.MOD for s in u.src):
        return None  # (no remainder among the terms: most sums, left without walking them)
    merged, constant = _like_terms(u)
    return _sorted_sum(u.dtype, merged, constant) if _recombine(merged) else None


def _order(u: UOp) -> tuple:
    return (0, u.arg.number) if u.op is Ops.RANGE else (1, id(u))


_INT = {dtypes.int64, dtypes.int32}


def _gate_clauses(gate: UOp) -> list[tuple[UOp, int, bool]]:
    """The comparisons of an AND of them with constants: (x, c, True) for x >= c (`(x < c) != True`), (x, c,
    False) for x < c."""
    out, todo = [], [gate]
    while todo:
        g = todo.pop()
        if g.op is Ops.AND and g.dtype.is_bool: todo.extend(g.src)
        elif g.op is Ops.CMPLT and g.src[1].op is Ops.CONST and g.src[0].dtype in _INT:
            out.append((g.src[0], g.src[1].arg.value, False))
        elif (g.op is Ops.CMPNE and g.src[1].op is Ops.CONST and g.src[1].arg.value is True
              and g.src[0].op is Ops.CMPLT and g.src[0].src[1].op is Ops.CONST and g.src[0].src[0].dtype in _INT):
            out.append((g.src[0].src[0], g.src[0].src[1].arg.value, True))
    return out


def _gated_ranges(gate: UOp) -> dict[UOp, tuple[int, int]]:
    """Loops whose values the gate's comparisons confine to less than their whole range: {RANGE: (lo, hi)}.
    From a*v + rest >= c, v >= ceil((c - max(rest)) / a) when a > 0 (and the mirror images)."""
    found: dict[UOp, tuple[int, int]] = {}
    for x, c, at_least in _gate_clauses(gate):
        parts, k = terms(x)
        merged: dict[UOp, int] = {}
        for t, coef in parts: merged[t] = merged.get(t, 0) + coef
        for v, a in merged.items():
            if v.op is not Ops.RANGE or a == 0: continue
            lo, hi = found.get(v, (0, v.arg.size - 1))
            rest_lo, rest_hi = _bounds_of([(t, b) for t, b in merged.items() if t is not v], k)
            if at_least:  # a * v >= c - rest_hi
                t = c - rest_hi
                if a > 0: lo = max(lo, -(-t // a))
                else: hi = min(hi, t // a)
            else:  # a * v <= c - 1 - rest_lo
                t = c - 1 - rest_lo
                if a > 0: hi = min(hi, t // a)
                else: lo = max(lo, -(-t // a))
            found[v] = (lo, hi)
    return {v: (lo, hi) for v, (lo, hi) in found.items() if lo <= hi and (lo, hi) != (0, v.arg.size - 1)}


_NARROWED = 1 << 20  # loop numbers of the stand-ins for narrowed loops (a kernel's own are small)


def _divisions(u: UOp) -> int:
    """How much division an index does: the loops under each of its DIV and MOD nodes, summed."""
    return sum(sum(r.op is Ops.RANGE for r in n.toposort) for n in u.toposort if n.op in (Ops.DIV, Ops.MOD))


def _load_given_gate(ld: UOp) -> UOp | None:
    """A gated load's index simplified for the loop values its gate lets through (it reads nothing elsewhere).

    A loop the gate confines to [lo, hi] stands in as `lo + v'` with v' a loop over [0, hi - lo]; the index is
    simplified so and v' put back as `v - lo`. The columns 256..383 of the GPT step's qkv gradient read the
    value gradient as (b * 8192 + t * 128 + c - 256) // 8192 and so on: over every c that spans negative
    numbers and divides per element, over the gate's it is b, t and c - 256. Kept only when it divides less (fewer
    loops under its divisions and remainders: it cannot rewrite forever)."""
    if len(ld.src) < 3: return None
    idx, gate = ld.src[1], ld.src[2]
    loops = {n for n in idx.toposort if n.op is Ops.RANGE}
    narrowed = {v: b for v, b in _gated_ranges(gate).items() if v in loops}
    if not narrowed: return None
    stand_in = {v: UOp(Ops.RANGE, v.dtype, (), RangeArg(_NARROWED + v.arg.number, hi - lo + 1))
                for v, (lo, hi) in narrowed.items()}
    inner = simplify_kernel(substitute(idx, {v: stand_in[v] + lo for v, (lo, _) in narrowed.items()}))
    out = simplify_kernel(substitute(inner, {stand_in[v]: v + (-lo) for v, (lo, _) in narrowed.items()}))
    if out is idx or _divisions(out) >= _divisions(idx): return None
    return UOp(Ops.LOAD, ld.dtype, (ld.src[0], out, *ld.src[2:]), ld.arg)

def _widened(c: UOp) -> UOp | None:
    """int64(int32 x + y) as int64(x) + int64(y), and int64(int32(x)) of an int64 x as x, where the value
    bounds show that the int32 arithmetic cannot wrap: a dynamic slice's index (an int32 iota plus a start) is
    then the loop's lane plus a uniform offset, a contiguous vector load, not a gather (an eager x[:, i:i + k]
    took 2.4 ms on (4096, 1024) against a static slice's 0.5)."""
    x = c.src[0]
    if c.dtype not in _INT or x.dtype not in _INT or c.dtype.itemsize <= x.dtype.itemsize: return None
    if x.op is Ops.CAST and x.src[0].dtype == c.dtype:
        lo, hi = x.src[0].bounds
        return x.src[0] if x.dtype.min <= lo <= hi <= x.dtype.max else None
    if x.op is Ops.ADD and x.shape == ():
        lo, hi = x.bounds
        if (lo, hi) == (x.dtype.min, x.dtype.max): return None  # (it may wrap)
        return x.src[0].cast(c.dtype) + x.src[1].cast(c.dtype)
    return None


index = PatternMatcher([
    (UPat(Ops.CAST, name="c", src=(UPat(),)), _widened),
    (UPat(Ops.DIV, dtype=_INT, src=(UPat.var("x"), UPat.cvar("d"))), lambda x, d: _div_mod(x, d, False)),
    (UPat(Ops.MOD, dtype=_INT, src=(UPat.var("x"), UPat.cvar("d"))), lambda x, d: _div_mod(x, d, True)),
    (UPat(Ops.CMPLT, src=(UPat.var("x", _INT), UPat.cvar("c"))), _lt_const),
    (UPat(Ops.ADD, dtype=_INT, name="u", src=(UPat(Ops.ADD), UPat())), _canonical_sum),
    (UPat(Ops.ADD, dtype=_INT, name="u"), _recombined),
    (UPat(Ops.MAX, dtype=_INT, src=(UPat.var("x"), UPat.cvar("c")), commutative=True),
     lambda x, c: x if x.bounds[0] >= c.arg.value else None),
    (UPat(Ops.WHERE, src=(UPat(Ops.CMPLT, src=(UPat.var("x", _INT), UPat.cvar("c"))), UPat.var("a"), UPat.var("b"))),
     lambda x, c, a, b: a if a is x and x.bounds[1] < c.arg.value else None),
    (UPat(Ops.LOAD, name="ld"), _load_given_gate),
])


_memo: dict[UOp, UOp] = {}  # node -> its simplified form, shared by every call (see simplify_kernel)
MEMO_MAX = 1 << 16


def simplify_kernel(root: UOp) -> UOp:
    """`root` with the kernel rules applied to a fixed point. The rules are pure functions of the (hash-consed)
    nodes, so what a node simplifies to is remembered across calls: optimize simplifies a kernel after every
    action, and the nodes an action did not touch are then looked up, not rewritten again (a third of W4's
    lowering was these rewrites). The memo is replaced, not cleared, when it grows large (a rewrite on another
    thread keeps using the one it started with)."""
    global _memo
    if len(_memo) > MEMO_MAX: _memo = {}
    return graph_rewrite(root, _kernel_rules, memo=_memo)


_array_rules, _kernel_rules = algebra + movement, algebra + index  # built once: a matcher indexes its rules by op
