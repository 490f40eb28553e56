"""The rewrite engine: UPat matching, PatternMatcher rule order and ctx, graph_rewrite to a fixed point, substitute.
Rewritten graphs are checked against the interp backend evaluating the original."""
import numpy as np
from hypothesis import given, strategies as st

from fnx import dtypes
from fnx.backends import interp
from fnx.rewrite import PatternMatcher, UPat, graph_rewrite, substitute
from fnx.uop import GroupOp, Ops, ParamArg, UOp

F32, I32 = dtypes.float32, dtypes.int32


def param(slot, dtype=F32, shape=(3,)) -> UOp:
    return UOp(Ops.PARAM, dtype, (), ParamArg(slot, shape, None))


def const(value, dtype=F32, shape=(3,)) -> UOp:
    return UOp.const(dtype, value, shape)


def matches(pat: UPat, u: UOp) -> dict | None:
    bindings: dict = {}
    return bindings if pat.match(u, bindings) else None


X, Y = param(0), param(1)
XI = param(2, I32)


# ---- UPat ----

def test_match_by_op_and_op_set():
    add = UOp(Ops.ADD, F32, (X, Y))
    assert matches(UPat(Ops.ADD), add) is not None
    assert matches(UPat(Ops.MUL), add) is None
    assert matches(UPat({Ops.MUL, Ops.ADD}), add) is not None
    assert matches(UPat(GroupOp.Unary), add) is None
    assert matches(UPat(), add) is not None


def test_match_by_dtype():
    assert matches(UPat(dtype=F32), X) is not None
    assert matches(UPat(dtype=I32), X) is None
    assert matches(UPat(dtype={I32, F32}), XI) is not None


def test_match_by_arg():
    r = UOp(Ops.RESHAPE, F32, (X,), (3, 1))
    assert matches(UPat(Ops.RESHAPE, arg=(3, 1)), r) is not None
    assert matches(UPat(Ops.RESHAPE, arg=(1, 3)), r) is None


def test_named_bindings():
    sin = UOp(Ops.SIN, F32, (X,))
    got = matches(UPat(Ops.SIN, name="s", src=(UPat.var("x"),)), sin)
    assert got == {"s": sin, "x": X}


def test_repeated_name_must_bind_the_same_node():
    same = UPat(Ops.ADD, src=(UPat.var("x"), UPat.var("x")))
    assert matches(same, UOp(Ops.ADD, F32, (X, X))) == {"x": X}
    assert matches(same, UOp(Ops.ADD, F32, (X, Y))) is None


def test_commutative_matching_tries_both_orders():
    pat = UPat(Ops.ADD, src=(UPat.var("x"), UPat.cvar("c")), commutative=True)
    one = const(1.0)
    assert matches(pat, UOp(Ops.ADD, F32, (X, one))) == {"x": X, "c": one}
    assert matches(pat, UOp(Ops.ADD, F32, (one, X))) == {"x": X, "c": one}
    ordered = UPat(Ops.ADD, src=(UPat.var("x"), UPat.cvar("c")))
    assert matches(ordered, UOp(Ops.ADD, F32, (one, X))) is None


def test_failed_commutative_order_leaves_no_stale_bindings():
    # the first order binds x=X before failing on c; the second order must start from clean bindings
    pat = UPat(Ops.MUL, src=(UPat.var("x"), UPat(Ops.SIN, src=(UPat.var("x"),))), commutative=True)
    sin_y = UOp(Ops.SIN, F32, (Y,))
    assert matches(pat, UOp(Ops.MUL, F32, (sin_y, Y))) == {"x": Y}
    assert matches(pat, UOp(Ops.MUL, F32, (X, sin_y))) is None


def test_nested_src():
    inner = UOp(Ops.MUL, F32, (X, const(2.0)))
    outer = UOp(Ops.ADD, F32, (inner, Y))
    pat = UPat(Ops.ADD, src=(UPat(Ops.MUL, src=(UPat.var("a"), UPat.cvar("k"))), UPat.var("b")))
    assert matches(pat, outer) == {"a": X, "k": const(2.0), "b": Y}
    assert matches(pat, UOp(Ops.ADD, F32, (Y, inner))) is None


def test_source_count_must_agree():
    assert matches(UPat(Ops.ADD, src=(UPat(),)), UOp(Ops.ADD, F32, (X, Y))) is None


def test_single_upat_src_must_match_every_source():
    every_param = UPat(Ops.ADD, src=UPat(Ops.PARAM))
    assert matches(every_param, UOp(Ops.ADD, F32, (X, Y))) is not None
    assert matches(every_param, UOp(Ops.ADD, F32, (X, const(1.0)))) is None


def test_predicate():
    big = UPat(Ops.CONST, predicate=lambda u: u.const_value > 10)
    assert matches(big, const(11.0)) is not None
    assert matches(big, const(3.0)) is None


def test_const_pattern():
    assert matches(UPat.const(0), const(0.0)) is not None
    assert matches(UPat.const(0), const(0, I32)) is not None
    assert matches(UPat.const(0), const(1.0)) is None
    # a bool False is not the number 0
    assert matches(UPat.const(0), UOp.const(dtypes.bool_, False)) is None
    assert matches(UPat.const(True), UOp.const(dtypes.bool_, True)) is not None


# ---- PatternMatcher ----

def test_first_matching_rule_wins():
    sin = UOp(Ops.SIN, F32, (X,))
    pm = PatternMatcher([(UPat(Ops.SIN, name="s"), lambda s: X), (UPat(Ops.SIN, name="s"), lambda s: Y)])
    assert pm.rewrite(sin) is X
    pm = PatternMatcher([(UPat(Ops.SIN, name="s"), lambda s: Y), (UPat(Ops.SIN, name="s"), lambda s: X)])
    assert pm.rewrite(sin) is Y


def test_rule_returning_none_falls_through_to_the_next():
    sin = UOp(Ops.SIN, F32, (X,))
    tried = []
    pm = PatternMatcher([(UPat(Ops.SIN, name="s"), lambda s: tried.append(1)),
                         (UPat(Ops.SIN, name="s"), lambda s: s),           # returning the node itself: no rewrite
                         (UPat(Ops.SIN, name="s"), lambda s: Y)])
    assert pm.rewrite(sin) is Y
    assert tried == [1]


def test_no_rule_matches():
    pm = PatternMatcher([(UPat(Ops.SIN), lambda: X)])
    assert pm.rewrite(UOp(Ops.SQRT, F32, (X,))) is None


def test_ctx_is_passed_to_rules_that_ask_for_it():
    seen = []
    pm = PatternMatcher([(UPat(Ops.SIN, src=(UPat.var("x"),)), lambda ctx, x: seen.append((ctx, x))),
                         (UPat(Ops.SIN, src=(UPat.var("x"),)), lambda x: x)])
    assert pm.rewrite(UOp(Ops.SIN, F32, (Y,)), ctx="the ctx") is Y
    assert seen == [("the ctx", Y)]


def test_matchers_concatenate_in_order():
    sin = UOp(Ops.SIN, F32, (X,))
    a = PatternMatcher([(UPat(Ops.SIN), lambda: X)])
    b = PatternMatcher([(UPat(Ops.SIN), lambda: Y)])
    assert (a + b).rewrite(sin) is X
    assert (b + a).rewrite(sin) is Y


# ---- graph_rewrite ----

def run(root: UOp, params: list[UOp], args: list[np.ndarray]) -> np.ndarray:
    fn = UOp(Ops.FUNCTION, dtypes.bool_, (UOp(Ops.TUPLE, dtypes.bool_, (root,)), *params))
    return interp.run(fn, args)[0]


def test_rewrite_reaches_a_fixed_point():
    countdown = PatternMatcher([(UPat(Ops.CONST, dtype=I32, name="c", predicate=lambda u: u.const_value > 0),
                                 lambda c: UOp.const(I32, c.const_value - 1, c.shape))])
    out = graph_rewrite(UOp(Ops.ADD, I32, (XI, const(40, I32))), countdown)
    assert out is UOp(Ops.ADD, I32, (XI, const(0, I32)))


def test_rewrite_is_bottom_up_and_rebuilds_parents():
    double = PatternMatcher([(UPat(Ops.ADD, src=(UPat.var("x"), UPat.var("x"))),
                              lambda x: UOp(Ops.MUL, x.dtype, (x, UOp.const(x.dtype, 2.0, x.shape))))])
    s = UOp(Ops.ADD, F32, (X, X))
    root = UOp(Ops.ADD, F32, (UOp(Ops.SIN, F32, (s,)), UOp(Ops.SIN, F32, (s,))))
    out = graph_rewrite(root, double)
    two = const(2.0)
    assert out is UOp(Ops.MUL, F32, (UOp(Ops.SIN, F32, (UOp(Ops.MUL, F32, (X, two)),)), two))


def test_nodes_created_by_rules_are_rewritten_too():
    # rule 1 turns SQRT(x) into ADD(MUL(x, 1), 0); rules 2 and 3 must then clean up what rule 1 made
    pm = PatternMatcher([
        (UPat(Ops.SQRT, src=(UPat.var("x"),)),
         lambda x: UOp(Ops.ADD, F32, (UOp(Ops.MUL, F32, (x, const(1.0))), const(0.0)))),
        (UPat(Ops.MUL, src=(UPat.var("x"), UPat.const(1))), lambda x: x),
        (UPat(Ops.ADD, src=(UPat.var("x"), UPat.const(0))), lambda x: x),
    ])
    assert graph_rewrite(UOp(Ops.SIN, F32, (UOp(Ops.SQRT, F32, (X,)),)), pm) is UOp(Ops.SIN, F32, (X,))


def test_ctx_reaches_graph_rewrite_rules():
    seen = []
    pm = PatternMatcher([(UPat(Ops.PARAM, name="p"), lambda ctx, p: ctx.append(p.arg.slot))])
    graph_rewrite(UOp(Ops.ADD, F32, (X, Y)), pm, ctx=seen)
    assert sorted(seen) == [0, 1]


def test_shared_nodes_are_rewritten_once():
    calls = []
    pm = PatternMatcher([(UPat(Ops.SIN, name="s"), lambda s: calls.append(s))])
    shared = UOp(Ops.SIN, F32, (X,))
    graph_rewrite(UOp(Ops.ADD, F32, (shared, UOp(Ops.MUL, F32, (shared, shared)))), pm)
    assert len(calls) == 1


_OPS = [Ops.ADD, Ops.MUL, Ops.MAX]


@st.composite
def float_exprs(draw, depth=4):
    if depth == 0 or draw(st.integers(0, 3)) == 0:
        return draw(st.sampled_from([X, Y, const(0.0), const(1.0), const(2.5)]))
    if draw(st.booleans()):
        return UOp(Ops.SIN, F32, (draw(float_exprs(depth - 1)),))
    return UOp(draw(st.sampled_from(_OPS)), F32, (draw(float_exprs(depth - 1)), draw(float_exprs(depth - 1))))


IDENTITIES = PatternMatcher([
    (UPat(Ops.ADD, src=(UPat.var("x"), UPat.const(0)), commutative=True), lambda x: x),
    (UPat(Ops.MUL, src=(UPat.var("x"), UPat.const(1)), commutative=True), lambda x: x),
    (UPat(Ops.MAX, src=(UPat.var("x"), UPat.var("x"))), lambda x: x),
    # x + x -> x * 2 creates a MUL the MUL rules must see
    (UPat(Ops.ADD, src=(UPat.var("x"), UPat.var("x"))), lambda x: UOp(Ops.MUL, F32, (x, const(2.0)))),
])


@given(float_exprs())
def test_graph_rewrite_preserves_values_and_leaves_nothing_to_rewrite(expr):
    out = graph_rewrite(expr, IDENTITIES)
    for u in out.toposort:
        assert IDENTITIES.rewrite(u) is None, u
    args = [np.array([-1.5, 0.25, 3.0], np.float32), np.array([2.0, -0.5, 0.0], np.float32)]
    np.testing.assert_allclose(run(out, [X, Y], args), run(expr, [X, Y], args), rtol=1e-6)


# ---- substitute ----

def test_substitute_replaces_and_rebuilds():
    z = param(5)
    sin = UOp(Ops.SIN, F32, (X,))
    root = UOp(Ops.ADD, F32, (sin, UOp(Ops.MUL, F32, (Y, sin))))
    out = substitute(root, {X: z})
    new_sin = UOp(Ops.SIN, F32, (z,))
    assert out is UOp(Ops.ADD, F32, (new_sin, UOp(Ops.MUL, F32, (Y, new_sin))))


def test_substitute_keeps_untouched_subgraphs():
    untouched = UOp(Ops.MUL, F32, (Y, Y))
    root = UOp(Ops.ADD, F32, (X, untouched))
    out = substitute(root, {X: param(7)})
    assert out.src[1] is untouched
    assert substitute(root, {param(9): X}) is root


def test_substitute_an_inner_node_does_not_descend_below_it():
    inner = UOp(Ops.SIN, F32, (X,))
    root = UOp(Ops.ADD, F32, (inner, X))
    out = substitute(root, {inner: Y})
    assert out is UOp(Ops.ADD, F32, (Y, X))


@given(float_exprs(), st.lists(st.floats(-4, 4, width=32), min_size=3, max_size=3))
def test_substituting_a_param_matches_passing_the_value(expr, values):
    """expr with X := sin(Y) evaluates like expr given sin(y) for x."""
    y = np.array(values, np.float32)
    sin_y = UOp(Ops.SIN, F32, (Y,))
    unused = np.full(3, np.nan, np.float32)
    want = run(expr, [X, Y], [run(sin_y, [X, Y], [unused, y]), y])
    np.testing.assert_array_equal(run(substitute(expr, {X: sin_y}), [X, Y], [unused, y]), want)
