"""The IR node: hash-consing, derived shapes (checked against numpy), construction errors, toposort, and index
bounds (checked against brute-force evaluation over every value of the RANGEs)."""
import itertools
import math
import pickle
import struct
import sys

import numpy as np
import pytest
from hypothesis import given, strategies as st

from fnx import dtypes
from fnx.backends import interp
from fnx.backends.device import Buffer
from fnx.errors import ShapeError
from fnx.rewrite import substitute
from fnx.uop import ARG_TYPES, BufferArg, GroupOp, IotaArg, Ops, ParamArg, RangeArg, ReduceArg, ScatterArg, UOp

F32, I32, I64 = dtypes.float32, dtypes.int32, dtypes.int64


def param(shape, dtype=F32, slot=0) -> UOp:
    return UOp(Ops.PARAM, dtype, (), ParamArg(slot, tuple(shape), None))


def rng_node(size: int, axis_id: int) -> UOp:
    return UOp(Ops.RANGE, I64, (), RangeArg(axis_id, size))


shapes = st.lists(st.integers(0, 4), min_size=1, max_size=4).map(tuple)
nonempty_shapes = st.lists(st.integers(1, 4), min_size=1, max_size=4).map(tuple)


# ---- hash-consing ----

def test_equal_structure_is_the_same_object():
    x, y = param((2, 3)), param((2, 3))
    assert x is y
    a = UOp(Ops.ADD, F32, (x, UOp.const(F32, 1.0, (2, 3))))
    b = UOp(Ops.ADD, F32, (y, UOp.const(F32, 1.0, (2, 3))))
    assert a is b
    assert UOp(Ops.SIN, F32, (a,)) is UOp(Ops.SIN, F32, (b,))


def test_different_structure_is_a_different_object():
    x = param((2, 3))
    assert param((2, 3), slot=1) is not x
    assert param((3, 2)) is not x
    assert param((2, 3), I32) is not x
    assert UOp(Ops.ADD, F32, (x, x)) is not UOp(Ops.MUL, F32, (x, x))
    assert UOp(Ops.RESHAPE, F32, (x,), (6,)) is not UOp(Ops.RESHAPE, F32, (x,), (3, 2))


def test_const_zero_and_negative_zero_are_distinct():
    pos, neg = UOp.const(F32, 0.0), UOp.const(F32, -0.0)
    assert pos is not neg
    assert math.copysign(1.0, pos.const_value) == 1.0
    assert math.copysign(1.0, neg.const_value) == -1.0
    assert UOp.const(F32, -0.0) is neg


def test_nan_consts_merge():
    a, b = UOp.const(F32, float("nan")), UOp.const(F32, float("nan"))
    assert a is b
    assert math.isnan(a.const_value)


def test_nan_consts_of_opposite_signs_stay_apart():
    # (a bitcast reads the sign: a sort's keys put -nan first; float.hex() once keyed both as "nan")
    neg = UOp.const(F32, -math.nan)
    pos = UOp.const(F32, math.nan)
    assert pos is not neg and math.copysign(1.0, pos.const_value) == 1.0
    assert math.copysign(1.0, neg.const_value) == -1.0 and UOp.const(F32, -math.nan) is neg


def test_complex_consts_keep_signed_zero_and_nan_parts_apart():
    c64 = dtypes.complex64
    values = [complex(-1, 0.0), complex(-1, -0.0), complex(0.0, 1), complex(-0.0, 1), complex(math.nan, 0),
              complex(-math.nan, 0)]
    nodes = [UOp.const(c64, v) for v in values]
    assert len({id(n) for n in nodes}) == len(values)
    for n, v in zip(nodes, values):
        assert struct.pack("<dd", n.const_value.real, n.const_value.imag) == struct.pack("<dd", v.real, v.imag)
    assert UOp.const(c64, complex(math.nan, 0)) is nodes[4]  # (equal bits merge, as for floats)


def test_consts_of_different_dtype_or_shape_are_distinct():
    assert UOp.const(F32, 1.0) is not UOp.const(dtypes.float64, 1.0)
    assert UOp.const(F32, 1.0) is not UOp.const(F32, 1.0, (2,))
    assert UOp.const(I32, 1) is UOp.const(I32, 1)


def test_const_values_wrap_like_numpy():
    for dtype in (dtypes.int8, dtypes.uint8, dtypes.int32, dtypes.uint32):
        for value in (-1, 2 ** 31 + 5, 300, -129):
            assert UOp.const(dtype, value).const_value == np.array(value).astype(dtype.np).item()


def test_usable_as_dict_key():
    x = param((4,))
    cache = {UOp(Ops.SIN, F32, (x,)): "sin"}
    assert cache[UOp(Ops.SIN, F32, (param((4,)),))] == "sin"


# ---- node arguments: named tuples, read by field ----

@pytest.mark.parametrize("op", sorted(ARG_TYPES, key=lambda op: op.name))
def test_a_plain_tuple_arg_is_rejected(op):
    # a tuple equals the named tuple with its fields, so it would be interned as that node: rejected when new
    plain = tuple(range(9170, 9170 + len(ARG_TYPES[op]._fields)))
    with pytest.raises(TypeError, match=ARG_TYPES[op].__name__):
        UOp(op, I32, (), plain)


def test_a_plain_tuple_equal_to_an_existing_arg_finds_that_node():
    p = UOp(Ops.PARAM, F32, (), ParamArg(3, (2,), None, (41,)))
    assert UOp(Ops.PARAM, F32, (), (3, (2,), None, (41,))) is p
    assert p.arg.slot == 3 and p.arg.tag == (41,)
    assert param((2,)).arg.tag == ()  # untagged: a FUNCTION's own argument


def test_pickle_keeps_named_args_and_interning():
    p = UOp(Ops.PARAM, F32, (), ParamArg(0, (4, 3), None, ("call", 7)))
    red = UOp(Ops.REDUCE, F32, (UOp(Ops.MUL, F32, (p, UOp.const(F32, -0.0, (4, 3)))),), ReduceArg(Ops.MAX, (1,)))
    again = pickle.loads(pickle.dumps(red))
    assert again is red
    assert type(again.arg) is ReduceArg and again.src[0].src[0].arg.tag == ("call", 7)


# ---- derived shapes, against numpy as the oracle ----

@given(shapes, st.data())
def test_movement_shapes_match_numpy(shape, data):
    x = param(shape)
    value = np.empty(shape)
    # reshape: to a random shape with the same size
    flat = math.prod(shape)
    target = data.draw(st.sampled_from([(flat,), (1, flat), shape[::-1] if flat else (0,), shape + (1,)]))
    assert UOp(Ops.RESHAPE, F32, (x,), target).shape == value.reshape(target).shape
    perm = tuple(data.draw(st.permutations(range(len(shape)))))
    assert UOp(Ops.PERMUTE, F32, (x,), perm).shape == np.transpose(value, perm).shape
    pads = tuple(data.draw(st.tuples(st.integers(0, 3), st.integers(0, 3))) for _ in shape)
    assert UOp(Ops.PAD, F32, (x,), pads).shape == np.pad(value, pads).shape
    bounds = []
    for s in shape:
        b = data.draw(st.integers(0, s))
        bounds.append((b, data.draw(st.integers(b, s))))
    bounds = tuple(bounds)
    assert UOp(Ops.SHRINK, F32, (x,), bounds).shape == value[tuple(slice(b, e) for b, e in bounds)].shape
    flips = tuple(data.draw(st.booleans()) for _ in shape)
    assert UOp(Ops.FLIP, F32, (x,), flips).shape == shape


@given(nonempty_shapes, st.data())
def test_expand_shape_matches_numpy(shape, data):
    ones = tuple(1 if data.draw(st.booleans()) else s for s in shape)
    x = param(ones)
    target = tuple(data.draw(st.integers(0, 4)) if s == 1 else s for s in ones)
    assert UOp(Ops.EXPAND, F32, (x,), target).shape == np.broadcast_to(np.empty(ones), target).shape


@given(shapes, st.data())
def test_reduce_shape_matches_numpy_keepdims(shape, data):
    axes = tuple(sorted(data.draw(st.sets(st.integers(0, len(shape) - 1)))))
    for reduce_op in (Ops.ADD, Ops.MAX, Ops.MUL):
        u = UOp(Ops.REDUCE, F32, (param(shape),), ReduceArg(reduce_op, axes))
        assert u.shape == np.sum(np.empty(shape), axis=axes, keepdims=True).shape


@given(nonempty_shapes, st.lists(st.integers(0, 3), max_size=2).map(tuple), st.data())
def test_gather_and_scatter_shapes_match_numpy(shape, idx_shape, data):
    axis = data.draw(st.integers(0, len(shape) - 1))
    x, idx = param(shape), param(idx_shape, I32, slot=1)
    gathered = UOp(Ops.INDEX, F32, (x, idx), axis)
    want = np.take(np.empty(shape), np.zeros(idx_shape, np.int64), axis=axis).shape
    assert gathered.shape == want
    updates = param(want, slot=2)
    assert UOp(Ops.SCATTER, F32, (x, idx, updates), ScatterArg(axis, "add")).shape == shape


@given(shapes)
def test_elementwise_and_marker_shapes(shape):
    x, y = param(shape), param(shape, slot=1)
    cond = param(shape, dtypes.bool_, slot=2)
    for op in (Ops.SIN, Ops.SQRT, Ops.RECIP, Ops.EXP2, Ops.LOG2, Ops.TRUNC):
        assert UOp(op, F32, (x,)).shape == shape
    for op in (Ops.ADD, Ops.MUL, Ops.MAX, Ops.DIV, Ops.MOD):
        assert UOp(op, F32, (x, y)).shape == shape
    for op in GroupOp.Comparison:
        assert UOp(op, dtypes.bool_, (x, y)).shape == shape
    assert UOp(Ops.WHERE, F32, (cond, x, y)).shape == shape
    assert UOp(Ops.CAST, dtypes.int8, (x,)).shape == shape
    assert UOp(Ops.BITCAST, I32, (x,)).shape == shape
    for op in GroupOp.Marker:
        assert UOp(op, F32, (x,), "cpu:0" if op is Ops.COPY else None).shape == shape


def test_source_shapes():
    buf = Buffer.from_numpy("cpu:0", np.zeros(6, np.float32))
    assert UOp(Ops.BUFFER, F32, (), BufferArg(buf, (2, 3))).shape == (2, 3)
    assert UOp.const(F32, 1.0, (4, 1)).shape == (4, 1)
    assert param((5,)).shape == (5,)
    iota = UOp(Ops.IOTA, I32, (), IotaArg((3, 4), 1))
    assert iota.shape == (3, 4)
    np.testing.assert_array_equal(interp.evaluate(iota, {}), np.broadcast_to(np.arange(4), (3, 4)))


def test_call_group_shapes():
    x, y = param((2, 3)), param((4,), slot=1)
    body = UOp(Ops.TUPLE, dtypes.bool_, (UOp(Ops.SIN, F32, (x,)), y))
    fn = UOp(Ops.FUNCTION, dtypes.bool_, (body, x, y))
    assert body.shape is None and fn.shape is None
    assert UOp(Ops.GETTUPLE, F32, (body,), 0).shape == (2, 3)
    assert UOp(Ops.GETTUPLE, F32, (fn,), 1).shape == (4,)


def test_lowering_ops_are_scalar():
    r = rng_node(8, 0)
    assert r.shape == ()
    assert (r * 2 + 1).shape == ()


# ---- construction errors ----

X = param((2, 3))
XI = param((2, 3), I32, slot=1)
Y = param((3, 2), slot=2)

BAD = [
    (Ops.RESHAPE, "float32[2, 3]", lambda: UOp(Ops.RESHAPE, F32, (X,), (4, 2))),
    (Ops.RESHAPE, "float32[2, 3]", lambda: UOp(Ops.RESHAPE, F32, (X,), (-2, -3))),
    (Ops.PERMUTE, "float32[2, 3]", lambda: UOp(Ops.PERMUTE, F32, (X,), (0, 0))),
    (Ops.PERMUTE, "float32[2, 3]", lambda: UOp(Ops.PERMUTE, F32, (X,), (0, 1, 2))),
    (Ops.EXPAND, "float32[2, 3]", lambda: UOp(Ops.EXPAND, F32, (X,), (4, 3))),
    (Ops.EXPAND, "float32[2, 3]", lambda: UOp(Ops.EXPAND, F32, (X,), (2, 3, 1))),
    (Ops.EXPAND, "float32[1, 3]", lambda: UOp(Ops.EXPAND, F32, (param((1, 3)),), (-1, 3))),
    (Ops.PAD, "float32[2, 3]", lambda: UOp(Ops.PAD, F32, (X,), ((0, 0), (-1, 0)))),
    (Ops.PAD, "float32[2, 3]", lambda: UOp(Ops.PAD, F32, (X,), ((0, 0),))),
    (Ops.SHRINK, "float32[2, 3]", lambda: UOp(Ops.SHRINK, F32, (X,), ((0, 2), (1, 4)))),
    (Ops.SHRINK, "float32[2, 3]", lambda: UOp(Ops.SHRINK, F32, (X,), ((1, 0), (0, 3)))),
    (Ops.FLIP, "float32[2, 3]", lambda: UOp(Ops.FLIP, F32, (X,), (True,))),
    (Ops.REDUCE, "float32[2, 3]", lambda: UOp(Ops.REDUCE, F32, (X,), ReduceArg(Ops.ADD, (2,)))),
    (Ops.REDUCE, "float32[2, 3]", lambda: UOp(Ops.REDUCE, F32, (X,), ReduceArg(Ops.ADD, (1, 1)))),
    (Ops.REDUCE, "float32[2, 3]", lambda: UOp(Ops.REDUCE, F32, (X,), ReduceArg(Ops.SIN, (0,)))),
    (Ops.INDEX, "float32[3, 2]", lambda: UOp(Ops.INDEX, F32, (X, Y), 0)),
    (Ops.INDEX, "float32[2, 3]", lambda: UOp(Ops.INDEX, F32, (X, XI), 2)),
    (Ops.SCATTER, "float32[3, 2]", lambda: UOp(Ops.SCATTER, F32, (X, XI, Y), ScatterArg(0, "set"))),
    (Ops.ADD, "float32[3, 2]", lambda: UOp(Ops.ADD, F32, (X, Y))),
    (Ops.ADD, "int32[2, 3]", lambda: UOp(Ops.ADD, F32, (X, XI))),
    (Ops.MUL, "float32[2, 3]", lambda: UOp(Ops.MUL, I32, (X, X))),
    (Ops.CMPLT, "float32[2, 3]", lambda: UOp(Ops.CMPLT, F32, (X, X))),
    (Ops.WHERE, "float32[2, 3]", lambda: UOp(Ops.WHERE, F32, (X, X, X))),
    (Ops.WHERE, "int32[2, 3]", lambda: UOp(Ops.WHERE, F32, (UOp(Ops.CMPLT, dtypes.bool_, (X, X)), X, XI))),
    (Ops.BITCAST, "float32[2, 3]", lambda: UOp(Ops.BITCAST, dtypes.int16, (X,))),
    (Ops.SHL, "float32[2, 3]", lambda: UOp(Ops.SHL, F32, (X, X))),
    (Ops.AND, "float32[2, 3]", lambda: UOp(Ops.AND, F32, (X, X))),
    (Ops.SIN, "int32[2, 3]", lambda: UOp(Ops.SIN, I32, (XI,))),
    (Ops.IOTA, "", lambda: UOp(Ops.IOTA, I32, (), IotaArg((3, 4), 2))),
    (Ops.IOTA, "", lambda: UOp(Ops.IOTA, F32, (), IotaArg((3, 4), 0))),
    (Ops.GETTUPLE, "", lambda: UOp(Ops.GETTUPLE, F32, (UOp(Ops.TUPLE, dtypes.bool_, (X,)),), 1)),
]


@pytest.mark.parametrize("op,shape_text,build", BAD, ids=[f"{op.name}-{i}" for i, (op, _, _) in enumerate(BAD)])
def test_bad_nodes_raise_shape_error_naming_op_shapes_and_line(op, shape_text, build):
    with pytest.raises(ShapeError) as info:
        build()
    assert isinstance(info.value, TypeError)
    message = str(info.value)
    assert message.startswith(f"{op.name}:"), message
    assert shape_text in message
    assert f"{__file__}:{build.__code__.co_firstlineno}" in message


def test_shape_error_names_the_callers_line():
    line = sys._getframe().f_lineno + 2
    with pytest.raises(ShapeError) as info:
        UOp(Ops.RESHAPE, F32, (X,), (7,))
    assert f"{__file__}:{line} (test_shape_error_names_the_callers_line)" in str(info.value)


def test_bad_node_is_not_interned():
    with pytest.raises(ShapeError):
        UOp(Ops.RESHAPE, F32, (X,), (5,))
    with pytest.raises(ShapeError):  # a second try raises again instead of returning a half-built node
        UOp(Ops.RESHAPE, F32, (X,), (5,))


# ---- toposort ----

def _random_dag(draw_ints, n_nodes: int) -> list[UOp]:
    nodes = [param((3,), slot=0), param((3,), slot=1)]
    for k in draw_ints[:n_nodes]:
        a, b = nodes[k % len(nodes)], nodes[(k // 7) % len(nodes)]
        nodes.append(UOp(Ops.ADD if k % 2 else Ops.MUL, F32, (a, b)))
    return nodes


@given(st.lists(st.integers(0, 10_000), min_size=1, max_size=30))
def test_toposort_lists_each_node_once_sources_first(choices):
    nodes = _random_dag(choices, len(choices))
    root = UOp(Ops.TUPLE, dtypes.bool_, tuple(nodes[-3:]))
    order = root.toposort
    assert len(order) == len(set(order))
    assert order[-1] is root
    position = {u: i for i, u in enumerate(order)}
    for u in order:
        for s in u.src:
            assert position[s] < position[u]
    # exactly the reachable nodes
    reachable, stack = set(), [root]
    while stack:
        u = stack.pop()
        if u not in reachable:
            reachable.add(u)
            stack.extend(u.src)
    assert set(order) == reachable


def test_toposort_of_a_deep_chain_does_not_recurse():
    u = param((), slot=0)
    for _ in range(5000):
        u = UOp(Ops.SIN, F32, (u,))
    assert len(u.toposort) == 5001


# ---- bounds of index expressions, against brute force ----

def evaluate_scalar(expr: UOp, assignment: dict[UOp, int]) -> int:
    """The value of an index expression with each RANGE replaced by a constant (interp backend semantics)."""
    bound = substitute(expr, {r: UOp.const(r.dtype, v) for r, v in assignment.items()})
    fn = UOp(Ops.FUNCTION, dtypes.bool_, (UOp(Ops.TUPLE, dtypes.bool_, (bound,)),))
    return interp.run(fn, [])[0].item()


def all_assignments(ranges: list[UOp]):
    for values in itertools.product(*(range(r.arg.size) for r in ranges)):
        yield dict(zip(ranges, values))


@st.composite
def index_exprs(draw, ranges: list[UOp], depth: int = 4) -> UOp:
    """ADD, MUL by a constant, DIV and MOD by a positive constant over RANGE nodes and constants."""
    if depth == 0 or draw(st.integers(0, 4)) == 0:
        if draw(st.integers(0, 4)) == 0: return UOp.const(I64, draw(st.integers(-5, 20)))
        return draw(st.sampled_from(ranges))
    kind = draw(st.sampled_from(["add", "mul", "div", "mod"]))
    x = draw(index_exprs(ranges, depth - 1))
    if kind == "add": return x + draw(index_exprs(ranges, depth - 1))
    if kind == "mul": return x * draw(st.integers(-4, 6))
    return x // draw(st.integers(1, 8)) if kind == "div" else x % draw(st.integers(1, 8))


@st.composite
def ranges_and_expr(draw):
    sizes = draw(st.lists(st.integers(1, 6), min_size=1, max_size=3))
    ranges = [rng_node(s, i) for i, s in enumerate(sizes)]
    return ranges, draw(index_exprs(ranges))


@given(ranges_and_expr())
def test_bounds_contain_every_value(case):
    ranges, expr = case
    lo, hi = expr.bounds
    for node in expr.toposort:  # every sub-expression's interval holds too
        nlo, nhi = node.bounds
        values = {evaluate_scalar(node, a) for a in all_assignments(ranges)}
        assert nlo <= min(values) and max(values) <= nhi, (node, (nlo, nhi), sorted(values))


@given(ranges_and_expr())
def test_bounds_are_tight_for_sums_of_ranges(case):
    ranges, _ = case
    total = ranges[0]
    for r in ranges[1:]: total = total + r * 2
    values = [evaluate_scalar(total, a) for a in all_assignments(ranges)]
    assert total.bounds == (min(values), max(values))


def test_bounds_of_range_div_mod():
    r = rng_node(10, 0)
    assert r.bounds == (0, 9)
    assert (r // 3).bounds == (0, 3)
    assert (r % 4).bounds == (0, 3)
    assert (r % 20).bounds == (0, 9)
    assert (r * -2).bounds == (-18, 0)


def test_bounds_of_a_cast_hold_every_value():
    """uint32 values above 2**31 become negative int32 values: the cast's interval must include them."""
    x = param((), dtypes.uint32)
    cast = UOp(Ops.CAST, I32, (x,))
    values = interp.evaluate(cast, {x: np.array([0, 5, 2 ** 31, 2 ** 32 - 1], np.uint32)})
    lo, hi = cast.bounds
    assert lo <= values.min() and values.max() <= hi


def test_bounds_hold_when_integer_addition_wraps():
    """int32 arithmetic wraps (as in numpy and JAX); an interval past the dtype's range is not a bound."""
    x = param((), I32)
    plus = x + 1
    lo, hi = plus.bounds
    value = interp.evaluate(plus, {x: np.array(2 ** 31 - 1, np.int32), plus.src[1]: np.array(1, np.int32)})
    assert lo <= value <= hi


def test_bounds_of_a_float_clamp_hold_every_value():
    """where(x < 2.5, x, 0.0) can be 2.4: for floats, `x < c` does not mean `x <= c - 1`."""
    x = param((), F32)
    clamp = UOp(Ops.WHERE, F32, (UOp(Ops.CMPLT, dtypes.bool_, (x, UOp.const(F32, 2.5))), x, UOp.const(F32, 0.0)))
    lo, hi = clamp.bounds
    assert lo <= 2.4 <= hi


def test_the_collector_is_paused_while_graphs_are_built_and_back_after():
    """jit's trace and lowering run with the cyclic collector off (collector_paused): it is back on after a
    call, after a trace that raised, after nested and concurrent pauses; one the user had turned off stays off.
    Results are unchanged (numpy's)."""
    import gc
    import threading
    import fnx
    import fnx.numpy as jnp
    from fnx.uop import collector_paused
    seen = []

    def f(x):
        seen.append(gc.isenabled())
        return jnp.tanh(x) * 2
    x = np.linspace(-1, 1, 7, dtype=np.float32)
    assert gc.isenabled()
    np.testing.assert_allclose(np.asarray(fnx.jit(f)(x)), np.tanh(x.astype(np.float64)) * 2, rtol=1e-6)
    assert seen == [False] and gc.isenabled()
    with pytest.raises(TypeError):
        fnx.jit(lambda x: x + "a")(x)
    assert gc.isenabled()
    inside, go = [], threading.Barrier(4)

    def nested():
        with collector_paused():
            go.wait()
            with collector_paused(): inside.append(gc.isenabled())
            go.wait()
    threads = [threading.Thread(target=nested) for _ in range(4)]
    for t in threads: t.start()
    for t in threads: t.join()
    assert inside == [False] * 4 and gc.isenabled()
    gc.disable()
    try:
        with collector_paused(): pass
        assert not gc.isenabled()
    finally:
        gc.enable()


def test_device_of_a_deep_chain_does_not_recurse():
    """A node's device is found through its sources iteratively: a chain thousands of nodes deep (a jitted
    unrolled loop) overflowed Python's stack when a custom rule asked its argument's device."""
    base = UOp(Ops.PARAM, F32, (), ParamArg(0, (), "cpu:3"))
    u = base
    for _ in range(5000):
        u = UOp(Ops.SIN, F32, (u,))
    assert u.device == "cpu:3"
    assert UOp(Ops.SIN, F32, (param((), slot=1),)).device is None  # no device named anywhere below
    top = UOp(Ops.ADD, F32, (UOp(Ops.SIN, F32, (param((), slot=2),)), u))  # the first source with one decides
    assert top.device == "cpu:3"
