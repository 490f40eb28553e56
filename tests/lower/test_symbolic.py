"""Simplification rules keep values: random graphs evaluated by the interp backend before and after
simplify_graph, and index expressions evaluated by brute force over every RANGE value before and after
simplify_kernel. Also checks that the rules remove what they should."""
import itertools
import math

import numpy as np
from hypothesis import given, strategies as st

from fnx import dtypes
from fnx.backends import interp
from fnx.lower.symbolic import simplify_graph, simplify_kernel
from fnx.rewrite import substitute
from fnx.uop import GroupOp, Ops, ParamArg, RangeArg, ReduceArg, UOp

F32, I32, I64, BOOL = dtypes.float32, dtypes.int32, dtypes.int64, dtypes.bool_
SHAPE = (2, 3)


def param(slot, dtype, shape=SHAPE) -> UOp:
    return UOp(Ops.PARAM, dtype, (), ParamArg(slot, shape, None))


def run(root: UOp, params: list[UOp], args: list[np.ndarray]) -> np.ndarray:
    fn = UOp(Ops.FUNCTION, BOOL, (UOp(Ops.TUPLE, BOOL, (root,)), *params))
    return interp.run(fn, args)[0]


# ---- random array graphs ----

def movement_round_trip(draw, x: UOp) -> UOp:
    """A value of x's shape (2, 3) built through a chain of movement ops the rules should merge or drop."""
    kind = draw(st.sampled_from(["reshape", "permute", "expand", "identity", "cast"]))
    dt = x.dtype
    if kind == "reshape":
        mid = draw(st.sampled_from([(6,), (3, 2), (1, 6), (2, 1, 3)]))
        return UOp(Ops.RESHAPE, dt, (UOp(Ops.RESHAPE, dt, (x,), mid),), SHAPE)
    if kind == "permute":
        once = UOp(Ops.PERMUTE, dt, (x,), (1, 0))
        return UOp(Ops.PERMUTE, dt, (once,), (1, 0))
    if kind == "expand":
        # (2, 3) -> (2, 1, 1, 3) -> expand (2, 2, 1, 3) -> expand (2, 2, 3, 3) -> max over axes 1, 2 -> (2, 3)
        r = UOp(Ops.RESHAPE, dt, (x,), (2, 1, 1, 3))
        e = UOp(Ops.EXPAND, dt, (UOp(Ops.EXPAND, dt, (r,), (2, 2, 1, 3)),), (2, 2, 3, 3))
        return UOp(Ops.RESHAPE, dt, (UOp(Ops.REDUCE, dt, (e,), ReduceArg(Ops.MAX, (1, 2))),), SHAPE)
    if kind == "identity":
        same = draw(st.sampled_from([Ops.RESHAPE, Ops.EXPAND, Ops.PERMUTE, Ops.FLIP]))
        arg = {Ops.RESHAPE: SHAPE, Ops.EXPAND: SHAPE, Ops.PERMUTE: (0, 1), Ops.FLIP: (False, False)}[same]
        return UOp(same, dt, (x,), arg)
    return UOp(Ops.CAST, dt, (x,))


@st.composite
def graphs(draw, dtype, leaves, depth=4):
    """Random ALU graphs over `leaves` and constants, sprinkled with identities and constant subtrees."""
    if depth == 0 or draw(st.integers(0, 4)) == 0:
        if draw(st.integers(0, 2)) == 0:
            value = draw(st.sampled_from([0, 1, 2, 3, -1, 7]))
            return UOp.const(dtype, value, SHAPE)
        return draw(st.sampled_from(leaves))
    sub = lambda: draw(graphs(dtype, leaves, depth - 1))  # noqa: E731
    kinds = ["binary", "binary", "identity", "const_subtree", "movement", "where"]
    kinds += ["unary"] if dtype.is_float else ["bitwise"]
    kind = draw(st.sampled_from(kinds))
    if kind == "binary":
        op = draw(st.sampled_from([Ops.ADD, Ops.MUL, Ops.MAX, Ops.DIV, Ops.MOD]))
        return UOp(op, dtype, (sub(), sub()))
    if kind == "unary":
        return UOp(draw(st.sampled_from([Ops.SIN, Ops.SQRT, Ops.EXP2, Ops.RECIP, Ops.TRUNC])), dtype, (sub(),))
    if kind == "bitwise":
        return UOp(draw(st.sampled_from([Ops.AND, Ops.OR, Ops.XOR])), dtype, (sub(), sub()))
    if kind == "where":
        a, b = sub(), sub()
        return UOp(Ops.WHERE, dtype, (UOp(Ops.CMPLT, BOOL, (a, b)), a, b))
    if kind == "identity":
        x = sub()
        which = draw(st.sampled_from(["mul1", "add0", "1mul", "0add", "div1", "mul0", "where_same"]))
        one, zero = UOp.const(dtype, 1, SHAPE), UOp.const(dtype, 0, SHAPE)
        if which == "mul1": return UOp(Ops.MUL, dtype, (x, one))
        if which == "1mul": return UOp(Ops.MUL, dtype, (one, x))
        if which == "add0": return UOp(Ops.ADD, dtype, (x, zero))
        if which == "0add": return UOp(Ops.ADD, dtype, (zero, x))
        if which == "div1": return UOp(Ops.DIV, dtype, (x, one))
        if which == "mul0": return UOp(Ops.MUL, dtype, (x, zero))
        return UOp(Ops.WHERE, dtype, (UOp(Ops.CMPLT, BOOL, (x, one)), x, x))
    if kind == "const_subtree":
        a = UOp.const(dtype, draw(st.integers(-3, 9)), SHAPE)
        b = UOp.const(dtype, draw(st.integers(1, 5)), SHAPE)
        folded = UOp(draw(st.sampled_from([Ops.ADD, Ops.MUL, Ops.MAX, Ops.DIV, Ops.MOD])), dtype, (a, b))
        return UOp(Ops.ADD, dtype, (sub(), UOp(Ops.MUL, dtype, (folded, UOp.const(dtype, 2, SHAPE)))))
    return movement_round_trip(draw, sub())


FP, FQ = param(0, F32), param(1, F32)
IP, IQ = param(0, I32), param(1, I32)


def left_over(root: UOp) -> list[UOp]:
    """Nodes the rules should not leave behind."""
    bad = []
    for u in root.toposort:
        if u.op in GroupOp.ALU and u.src and all(s.op is Ops.CONST for s in u.src): bad.append(u)
        if u.op in (Ops.RESHAPE, Ops.PERMUTE, Ops.EXPAND) and u.src[0].op is u.op: bad.append(u)
        if u.op in (Ops.RESHAPE, Ops.EXPAND) and u.arg == u.src[0].shape: bad.append(u)
        if u.op is Ops.PERMUTE and u.arg == tuple(range(len(u.arg))): bad.append(u)
        if u.op is Ops.CAST and u.dtype == u.src[0].dtype: bad.append(u)
        if u.op in GroupOp.Movement and u.src[0].op is Ops.CONST and u.op is not Ops.PAD: bad.append(u)
        if u.op is Ops.MUL and any(s.op is Ops.CONST and s.const_value == 1 for s in u.src): bad.append(u)
        if u.op is Ops.ADD and any(s.op is Ops.CONST and s.const_value == 0 and  # x + 0.0 stays: -0.0 + 0.0 = 0.0
                                   (not u.dtype.is_float or math.copysign(1.0, s.const_value) < 0) for s in u.src):
            bad.append(u)
        if u.op is Ops.WHERE and u.src[1] is u.src[2]: bad.append(u)
    return bad


float_values = st.lists(st.sampled_from([-2.5, -1.0, -0.0, 0.0, 0.5, 1.0, 3.0, 7.25]), min_size=6, max_size=6)
int_values = st.lists(st.integers(-50, 50), min_size=6, max_size=6)


@given(graphs(F32, [FP, FQ]), float_values, float_values)
def test_simplify_graph_preserves_float_values(expr, a, b):
    args = [np.array(a, np.float32).reshape(SHAPE), np.array(b, np.float32).reshape(SHAPE)]
    simple = simplify_graph(expr)
    np.testing.assert_allclose(run(simple, [FP, FQ], args), run(expr, [FP, FQ], args), rtol=1e-6, equal_nan=True)
    assert not left_over(simple)
    assert len(simple.toposort) <= len(expr.toposort)


@given(graphs(I32, [IP, IQ]), int_values, int_values)
def test_simplify_graph_preserves_int_values(expr, a, b):
    args = [np.array(a, np.int32).reshape(SHAPE), np.array(b, np.int32).reshape(SHAPE)]
    simple = simplify_graph(expr)
    np.testing.assert_array_equal(run(simple, [IP, IQ], args), run(expr, [IP, IQ], args))
    assert not left_over(simple)
    assert len(simple.toposort) <= len(expr.toposort)


def test_simplify_graph_merges_movement_chains():
    x = FP
    rr = UOp(Ops.RESHAPE, F32, (UOp(Ops.RESHAPE, F32, (x,), (3, 2)),), (6,))
    assert simplify_graph(rr) is UOp(Ops.RESHAPE, F32, (x,), (6,))
    back = UOp(Ops.RESHAPE, F32, (UOp(Ops.RESHAPE, F32, (x,), (6,)),), SHAPE)
    assert simplify_graph(back) is x
    three = param(0, F32, (2, 3, 4))
    pp = UOp(Ops.PERMUTE, F32, (UOp(Ops.PERMUTE, F32, (three,), (1, 2, 0)),), (2, 0, 1))
    assert simplify_graph(pp) is three
    pq = UOp(Ops.PERMUTE, F32, (UOp(Ops.PERMUTE, F32, (three,), (1, 2, 0)),), (1, 0, 2))
    simple = simplify_graph(pq)
    assert simple.op is Ops.PERMUTE and simple.src[0] is three
    value = np.arange(24, dtype=np.float32).reshape(2, 3, 4)
    np.testing.assert_array_equal(run(simple, [three], [value]), value.transpose(1, 2, 0).transpose(1, 0, 2))
    col = param(3, F32, (2, 1, 1))
    ee = UOp(Ops.EXPAND, F32, (UOp(Ops.EXPAND, F32, (col,), (2, 3, 1)),), (2, 3, 4))
    assert simplify_graph(ee) is UOp(Ops.EXPAND, F32, (col,), (2, 3, 4))


def test_simplify_graph_folds_constants_through_movement():
    c = UOp.const(F32, 2.0, (3,))
    moved = UOp(Ops.EXPAND, F32, (UOp(Ops.RESHAPE, F32, (c,), (1, 3)),), (4, 3))
    out = simplify_graph(UOp(Ops.MUL, F32, (moved, UOp.const(F32, 1.5, (4, 3)))))
    assert out is UOp.const(F32, 3.0, (4, 3))
    padded = UOp(Ops.PAD, F32, (c,), ((1, 1),))
    np.testing.assert_array_equal(run(simplify_graph(padded), [], []), [0, 2, 2, 2, 0])


def test_float_mul_by_zero_is_kept():
    """x * 0 is not 0 for floats (inf, nan): only integer multiplies by zero fold."""
    out = simplify_graph(UOp(Ops.MUL, F32, (FP, UOp.const(F32, 0.0, SHAPE))))
    value = np.array([np.inf, np.nan, 1, -1, 0, 2], np.float32).reshape(SHAPE)
    with np.errstate(invalid="ignore"):
        want = value * np.float32(0)
    np.testing.assert_array_equal(run(out, [FP], [value]), want)
    assert simplify_graph(UOp(Ops.MUL, I32, (IP, UOp.const(I32, 0, SHAPE)))) is UOp.const(I32, 0, SHAPE)


# ---- index expressions over RANGEs: brute force before and after simplify_kernel ----

def rng(axis: int, size: int) -> UOp:
    return UOp(Ops.RANGE, I64, (), RangeArg(axis, size))


def evaluate(expr: UOp, assignment: dict[UOp, int]):
    bound = substitute(expr, {r: UOp.const(r.dtype, v) for r, v in assignment.items()})
    return run(bound, [], []).item()


def assert_same_everywhere(expr: UOp, simple: UOp, ranges: list[UOp]) -> None:
    for values in itertools.product(*(range(r.arg.size) for r in ranges)):
        assignment = dict(zip(ranges, values))
        assert evaluate(simple, assignment) == evaluate(expr, assignment), values


@st.composite
def index_exprs(draw, ranges, depth=4):
    if depth == 0 or draw(st.integers(0, 4)) == 0:
        if draw(st.integers(0, 4)) == 0: return UOp.const(I64, draw(st.integers(-4, 24)))
        return draw(st.sampled_from(ranges))
    x = draw(index_exprs(ranges, depth - 1))
    kind = draw(st.sampled_from(["add", "add", "mul", "div", "mod", "max", "clamp", "lt"]))
    if kind == "add": return x + draw(index_exprs(ranges, depth - 1))
    if kind == "mul": return x * draw(st.integers(-3, 12))
    if kind == "div": return x // draw(st.integers(1, 12))
    if kind == "mod": return x % draw(st.integers(1, 12))
    if kind == "max": return x.alu(Ops.MAX, draw(st.integers(-3, 6)))
    c = draw(st.integers(-2, 30))
    if kind == "clamp": return (x < c).alu(Ops.WHERE, x, c - 1)   # min(x, c - 1), as a gather clamp is built
    other = draw(index_exprs(ranges, depth - 1))
    return (x < c).alu(Ops.WHERE, other, x)


@st.composite
def range_cases(draw):
    sizes = draw(st.lists(st.integers(1, 5), min_size=1, max_size=3))
    ranges = [rng(i, s) for i, s in enumerate(sizes)]
    return ranges, draw(index_exprs(ranges))


@given(range_cases())
def test_simplify_kernel_preserves_index_values(case):
    ranges, expr = case
    assert_same_everywhere(expr, simplify_kernel(expr), ranges)


@given(st.integers(2, 6), st.integers(2, 6), st.integers(2, 6))
def test_simplify_kernel_of_reshaped_indices(a, b, c):
    """Un-flattening a flattened index (what a reshape lowers to) gives back the original ranges."""
    r0, r1, r2 = rng(0, a), rng(1, b), rng(2, c)
    flat = r0 * (b * c) + r1 * c + r2
    parts = [flat // (b * c), (flat // c) % b, flat % c]
    simple = [simplify_kernel(p) for p in parts]
    for p, s in zip(parts, simple):
        assert_same_everywhere(p, s, [r0, r1, r2])
    assert simple == [r0, r1, r2]


def count(root: UOp, ops) -> int:
    return sum(u.op in ops for u in root.toposort)


def test_div_mod_of_split_index_is_removed():
    r, s = rng(0, 5), rng(1, 4)
    e = (r * 4 + s) // 4
    assert simplify_kernel(e) is r
    assert simplify_kernel((r * 4 + s) % 4) is s
    both = (r * 4 + s) // 4 * 100 + (r * 4 + s) % 4
    simple = simplify_kernel(both)
    assert count(both, {Ops.DIV, Ops.MOD}) == 2 and count(simple, {Ops.DIV, Ops.MOD}) == 0
    assert_same_everywhere(both, simple, [r, s])


def test_nested_div_merges():
    r = rng(0, 50)
    e = (r // 3) // 4
    simple = simplify_kernel(e)
    assert count(simple, {Ops.DIV}) == 1
    assert_same_everywhere(e, simple, [r])


def test_div_mod_factor_out_what_a_register_block_leaves_under_them():
    """Row 6 * b + i of a (4, 16, 8) input read as 64 rows of 8 (register blocks of 6 rows, which do not divide
    16): (48 * b + 8 * i + k) // 128 and % 128 keep a division, but none that depends on the reduce loop k."""
    b, k = rng(0, 11), rng(1, 8)
    for i in range(6):
        flat = b * 48 + (k + 8 * i)
        for e in (flat // 128, flat % 128, flat // 128 * 128 + flat % 128):
            simple = simplify_kernel(e)
            assert_same_everywhere(e, simple, [b, k])
            assert not any(u.op in (Ops.DIV, Ops.MOD) and k in u.toposort for u in simple.toposort), (i, e)


def test_div_mod_keep_what_they_must():
    r, s = rng(0, 5), rng(1, 6)
    e = (r * 4 + s) // 4     # s can reach 5: the division stays
    simple = simplify_kernel(e)
    assert count(simple, {Ops.DIV}) == 1
    assert_same_everywhere(e, simple, [r, s])


def test_comparisons_and_clamps_resolved_by_bounds():
    r = rng(0, 5)
    assert simplify_kernel(r < 10) is UOp.const(BOOL, True)
    assert simplify_kernel(r < 0) is UOp.const(BOOL, False)
    assert simplify_kernel(r.alu(Ops.MAX, 0)) is r
    assert simplify_kernel((r < 5).alu(Ops.WHERE, r, 4)) is r
    kept = (r < 3).alu(Ops.WHERE, r, 2)
    assert count(simplify_kernel(kept), {Ops.WHERE}) == 1
    assert_same_everywhere(kept, simplify_kernel(kept), [r])


def test_like_terms_merge():
    r, s = rng(0, 4), rng(1, 3)
    e = (r + s) + (r * 2 + 5) + (s * -1)
    simple = simplify_kernel(e)
    assert count(simple, {Ops.RANGE}) == 1 and s not in simple.toposort
    assert_same_everywhere(e, simple, [r, s])


# ---- simplify_kernel on values at the edges of their dtype ----

def scalar_param(slot, dtype) -> UOp:
    return UOp(Ops.PARAM, dtype, (), ParamArg(slot, (), None))


def assert_simplify_kernel_keeps(expr: UOp, p: UOp, values) -> None:
    simple = simplify_kernel(expr)
    for v in values:
        arg = np.array(v, p.dtype.np)
        assert run(simple, [p], [arg]).item() == run(expr, [p], [arg]).item(), v


def test_simplify_kernel_keeps_float_clamp_chains():
    x = scalar_param(0, F32)
    clamped = (x < 2.5).alu(Ops.WHERE, x, 0.0)
    expr = (clamped < 2.0).alu(Ops.WHERE, clamped, 7.0)
    assert_simplify_kernel_keeps(expr, x, [1.0, 2.4, 3.0, -1.0])


def test_simplify_kernel_keeps_wrapping_int32_addition():
    x = scalar_param(0, I32)
    expr = (x + 1) < int(np.iinfo(np.int32).min) + 1
    assert_simplify_kernel_keeps(expr, x, [0, 5, 2 ** 31 - 1])


def test_simplify_kernel_keeps_sign_of_unsigned_to_signed_cast():
    x = scalar_param(0, dtypes.uint32)
    expr = UOp(Ops.CAST, I32, (x,)) < 0
    assert_simplify_kernel_keeps(expr, x, [5, 2 ** 31, 2 ** 32 - 1])


# ---- reductions of constant arrays fold (a jit of jnp.ones((10**6, 10**6)).sum() ran for minutes) ----

@given(st.sampled_from([F32, dtypes.float16, I32, dtypes.uint8, dtypes.int8]),
       st.sampled_from([Ops.ADD, Ops.MAX, Ops.MUL]), st.sampled_from([(0,), (1,), (0, 1)]),
       st.sampled_from([0.1, -3.0, 2.0, 7.0, -0.0, 1e30, math.nan, math.inf]))
def test_reduce_of_a_constant_folds_to_the_interpreters_value(dtype, op, axes, value):
    if not dtype.is_float: value = int(value) % 97 if math.isfinite(value) else 5
    shape = (37, 11)
    const = UOp.const(dtype, value, shape)
    reduce = UOp(Ops.REDUCE, dtype, (const,), ReduceArg(op, axes))
    folded = simplify_graph(reduce)
    assert folded.op is Ops.CONST
    host = np.full(shape, value, dtype=np.float64 if dtype.is_float else np.int64)
    exact = {Ops.ADD: np.sum, Ops.MAX: np.max, Ops.MUL: np.prod}[op](host, axis=axes, keepdims=True)
    if dtype.is_float:
        with np.errstate(over="ignore", invalid="ignore"):
            want = exact.astype(dtype.np)
    else:  # integers wrap like the loop: the interpreter's answer in the dtype
        want = run(reduce, [], [])
    np.testing.assert_array_equal(run(folded, [], []), want)


def test_huge_constant_reductions_fold_under_jit():
    import fnx
    import fnx.numpy as jnp
    f = fnx.jit(lambda: (jnp.ones((10**6, 10**6)) * 2).sum() + jnp.full((10**6, 10**6), 3, jnp.int32).sum())
    assert "loops [] reduce []" in f.lower().as_text("rangeify")  # no loop left to run
    assert float(f()) == float(np.float32(2e12) + np.float32(np.int32(np.int64(3 * 10**12) % 2**32 - 2**32)))


# ---- gated loads: the index may change only where the gate is false ----

def _gated_load(index: UOp, gate: UOp) -> UOp:
    return UOp(Ops.LOAD, F32, (param(0, F32, (1 << 12,)), index, gate))


@st.composite
def gated_cases(draw):
    sizes = draw(st.lists(st.integers(1, 6), min_size=1, max_size=3))
    ranges = [rng(i, s) for i, s in enumerate(sizes)]
    linear = lambda: sum((r * draw(st.integers(-3, 8)) for r in ranges), UOp.const(I64, draw(st.integers(-6, 6))))  # noqa: E731
    gate = None
    for _ in range(draw(st.integers(1, 3))):
        x, c = linear(), draw(st.integers(-4, 20))
        clause = (x < c) if draw(st.booleans()) else (x < c).alu(Ops.CMPNE, True)
        gate = clause if gate is None else gate.alu(Ops.AND, clause)
    flat = linear() + draw(st.integers(0, 40))
    index = draw(st.sampled_from([flat // draw(st.integers(1, 9)), flat % draw(st.integers(1, 9)),
                                  (flat // draw(st.integers(1, 5))) * 7 + flat % draw(st.integers(1, 5))]))
    return ranges, index, gate


@given(gated_cases())
def test_gated_load_index_is_kept_wherever_the_gate_holds(case):
    """symbolic._load_given_gate against brute force: at every loop value the gate lets through, the simplified
    load reads the element the original did (and the gate itself is never changed)."""
    ranges, index, gate = case
    load = _gated_load(index, gate)
    simple = simplify_kernel(load)
    assert simple.op is Ops.LOAD and simplify_kernel(gate) is simple.src[2] or simple.src[2] is gate
    for values in itertools.product(*(range(r.arg.size) for r in ranges)):
        assignment = dict(zip(ranges, values))
        if evaluate(gate, assignment): assert evaluate(simple.src[1], assignment) == evaluate(index, assignment)


def test_gated_ranges_are_sound_and_tight_for_one_loop():
    """_gated_ranges: every loop value of a satisfying assignment lies inside what it returns, and a clause on
    one loop alone gives exactly its interval."""
    from fnx.lower.symbolic import _gated_ranges
    r0, r1 = rng(0, 12), rng(1, 32)
    c = r0 * 32 + r1
    gate = (c < 256).alu(Ops.CMPNE, True).alu(Ops.AND, c < 352)
    found = _gated_ranges(gate)
    assert found == {r0: (8, 10)}  # 32 * r0 + r1 in [256, 352) with r1 in [0, 32)
    single = _gated_ranges((r1 < 5).alu(Ops.CMPNE, True).alu(Ops.AND, r1 * 2 < 40))
    assert single == {r1: (5, 19)}


def test_padded_pieces_of_a_reshaped_gradient_read_without_divisions():
    """The gradient of slicing q, k, v out of one (.., 3 * h * d) projection pads each piece back into its
    columns; each piece is a reshape of (.., h, d): its loads must index without division or remainder, and the
    result must equal numpy's."""
    import fnx
    rng_ = np.random.default_rng(0)
    b, t, h, d = 4, 8, 2, 16
    x = rng_.standard_normal((b, t, 3 * h * d)).astype(np.float32)
    g = rng_.standard_normal((b, h, t, d)).astype(np.float32)

    def f(x):
        q, k, v = (x[..., i * h * d:(i + 1) * h * d].reshape(b, t, h, d).transpose(0, 2, 1, 3) for i in range(3))
        return (q * g).sum() + (k * g * 2.0).sum() + (v * g * 3.0).sum()
    got = np.asarray(fnx.jit(fnx.grad(f))(x))
    piece = g.transpose(0, 2, 1, 3).reshape(b, t, h * d)
    np.testing.assert_allclose(got, np.concatenate([piece, 2 * piece, 3 * piece], -1), rtol=1e-6)
    lowering = fnx.jit(fnx.grad(f)).lower(x).executable.lowering
    for kernel, _ in lowering.kernels:  # (a division of vector lanes alone is a constant per lane)
        loops = set(kernel.ranges + kernel.reduce_ranges)
        for ld in (u for u in kernel.sink.toposort if u.op is Ops.LOAD):
            divisions = [n for n in ld.src[1].toposort if n.op in (Ops.DIV, Ops.MOD)]
            assert not [n for n in divisions if loops & {r for r in n.toposort if r.op is Ops.RANGE}], kernel.name


@given(st.integers(1, 9), st.integers(-3, 5), st.integers(-40, 40), st.integers(-3, 3))
def test_quotient_and_remainder_recombine(c, b, shift, extra):
    """b c (x // c) + b (x % c) is b x for C's truncating division, negative x included (x = r - shift); a pair
    whose coefficients are not in that ratio stays as it is. Checked at every value of the range."""
    r, s = rng(0, 60), rng(1, 3)
    x = r + UOp.const(I64, -shift) + s * 7
    pair = x // c * (b * c) + x % c * b + s * extra
    simple = simplify_kernel(pair)
    assert_same_everywhere(pair, simple, [r, s])
    if b and c > 1: assert count(simple, {Ops.DIV, Ops.MOD}) == 0
    odd = x // c * (b * c + 1) + x % c * b
    assert_same_everywhere(odd, simplify_kernel(odd), [r, s])


def test_padding_a_negative_zero_constant_is_not_folded_to_a_constant():
    # PAD fills with +0.0: a PAD of a -0.0 constant (equal to 0 in Python) was folded into a -0.0 constant of the
    # padded shape, so the padding came out -0.0
    import fnx
    import fnx.numpy as jnp
    for dtype, value in ((np.float32, -0.0), (np.float32, 0.0), (np.float64, -0.0), (np.int32, 0)):
        x = np.full(5, value, dtype)
        want = x + np.pad(np.full(3, value, dtype), 1)
        got = np.asarray(fnx.jit(lambda v: v + jnp.pad(jnp.full(3, value, dtype), 1))(x))
        np.testing.assert_array_equal(got.view(np.uint8), want.astype(got.dtype).view(np.uint8))


@given(st.integers(-30, 30), st.integers(0, 25), st.integers(-2 ** 31, 2 ** 31 - 1))
def test_int32_index_sums_widen_where_their_bounds_show_no_wrap(c, top, big):
    """int64(int32(r) + start) is r + int64(start) when the bounds show the int32 sum cannot wrap, with start a
    clamp built as min(x, top) = ~max(~x, ~top) (a dynamic slice's): then a load's index is the loop's lane plus a
    uniform offset. A sum that may wrap (a large constant) keeps its int32 arithmetic. Brute force over the
    ranges checks the values either way."""
    r, s = rng(0, 40), rng(1, 3)
    x = (s * 7 + c).cast(I32).alu(Ops.MAX, 0)
    start = x.alu(Ops.XOR, -1).alu(Ops.MAX, -top - 1).alu(Ops.XOR, -1)
    index = (r.cast(I32) + start).cast(I64)
    simple = simplify_kernel(index)
    assert_same_everywhere(index, simple, [r, s])
    assert not [u for u in simple.toposort if u.op is Ops.CAST and r in u.toposort]  # r is added in int64
    wrapping = (r.cast(I32) + UOp.const(I32, big)).cast(I64)
    simple = simplify_kernel(wrapping)
    assert_same_everywhere(wrapping, simple, [r])
    if big > 2 ** 31 - 41: assert [u for u in simple.toposort if u.op is Ops.CAST and r in u.toposort]
