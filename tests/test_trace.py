"""Tracing and eager execution: make_graph text, the eager compile cache, and the Array's Python protocol
(repr/str/numpy/item/tolist/len/iter/bool/hash/DLPack) checked against numpy."""
import numpy as np
import pytest
from hypothesis import given, strategies as st

import fnx
import fnx.trace
from fnx import lax
from fnx.trace import Array
from fnx.uop import Ops


# ---- make_graph ----

def test_make_graph_lists_params_and_names_ops():
    def f(x, i):
        y = lax.sin(lax.add(x, 1.0))
        return lax.reduce_sum(y, (1,)), lax.convert_element_type(i, np.float32)
    x, i = np.ones((2, 3), np.float32), np.arange(4, dtype=np.int32)
    text = str(fnx.make_graph(f)(x, i))
    assert text.startswith("function(p0: f32[2,3], p1: i32[4]):")
    for name in ("add", "sin", "reduce", "cast to float32", "return ("):
        assert name in text, (name, text)
    assert text.rstrip().splitlines()[-1].strip().startswith("return (")


def test_make_graph_is_a_function_over_params():
    graph = fnx.make_graph(lambda x, y: lax.mul(x, y))(np.ones(3, np.float32), np.ones(3, np.float32))
    fn = graph.fn
    assert fn.op is Ops.FUNCTION and fn.src[0].op is Ops.TUPLE
    assert [p.op for p in fn.src[1:]] == [Ops.PARAM, Ops.PARAM]
    (out,) = fn.src[0].src
    assert out.op is Ops.MUL and set(out.src) == set(fn.src[1:])


def test_make_graph_with_static_argnums():
    graph = fnx.make_graph(lambda x, n: lax.mul(x, float(n)), static_argnums=1)(np.ones(2, np.float32), 3)
    text = str(graph)
    assert text.startswith("function(p0: f32[2]):") and "3.0" in text


def test_make_graph_of_python_scalars():
    text = str(fnx.make_graph(lambda a, b: lax.add(a, b))(1, 2.0))
    assert text.startswith("function(p0: i32[], p1: f32[]):")


# ---- eager execution ----

def test_eager_op_compiles_once_per_signature(device):
    rng = np.random.default_rng(0)
    shape = (3, 5, 7)
    a, b, c, d = (rng.standard_normal(shape).astype(np.float32) for _ in range(4))
    before = len(fnx.backends.device._executables)
    first = lax.max(a, b)
    after_first = len(fnx.backends.device._executables)
    second = lax.max(c, d)
    after_second = len(fnx.backends.device._executables)
    assert after_first - before <= 1
    assert after_second == after_first
    np.testing.assert_array_equal(np.asarray(first), np.maximum(a, b))
    np.testing.assert_array_equal(np.asarray(second), np.maximum(c, d))


def test_eager_scalars_that_meet_data_are_arguments_shift_amounts_stay_in_the_code(device):
    """An eager op reads the constants that meet data from arguments (one compiled op for every Python scalar),
    but keeps in its code the shift amounts and the constants that meet only constants (a shift's guard of a
    constant amount): a rotation by a constant is one instruction, by an argument a guarded variable shift."""
    rotl = lambda x: lax.shift_left(x, np.uint32(13)) | lax.shift_right_logical(x, np.uint32(19)) ^ (x * np.uint32(5))  # noqa: E731
    x = np.arange(1, 9, dtype=np.uint32) * np.uint32(0x9E3779B9)
    fn = fnx.make_graph(rotl)(x).fn
    _, lifted = fnx.trace._lift_constants(fn, device)
    assert sorted(c.arg.value for c in lifted) == [0, 5]  # the guards' zero fill and the multiplier
    want = (x << np.uint32(13)) | ((x >> np.uint32(19)) ^ (x * np.uint32(5)))
    np.testing.assert_array_equal(np.asarray(rotl(x)), want)
    before = len(fnx.backends.device._executables)
    y = lax.mul(x, np.uint32(7))
    np.asarray(lax.mul(x, np.uint32(11)))
    assert len(fnx.backends.device._executables) - before <= 1  # (a new scalar is an argument, not a new op)
    np.testing.assert_array_equal(np.asarray(y), x * np.uint32(7))


def test_eager_results_are_concrete(device):
    out = lax.mul(np.arange(3, dtype=np.float32), 2.0)
    assert isinstance(out, Array) and out.is_concrete
    np.testing.assert_array_equal(np.asarray(out), [0, 2, 4])


@given(st.lists(st.integers(1, 4), min_size=1, max_size=3).map(tuple))
def test_eager_chain_matches_numpy(device, shape):
    x = np.random.default_rng(1).standard_normal(shape).astype(np.float32)
    y = lax.sqrt(lax.add(lax.mul(x, x), 1.0))
    np.testing.assert_allclose(np.asarray(y), np.sqrt(x.astype(np.float64) ** 2 + 1), rtol=1e-6)
    assert y.shape == shape and y.dtype == np.float32


# ---- the Array's Python protocol ----

def make(values, dtype=np.float32) -> Array:
    out = lax.add(np.asarray(values, dtype), np.asarray(0, dtype))
    return lax.reshape(out, np.shape(values))


def test_repr_and_str(device):
    a = make([[1.5, 2.0], [3.0, 4.0]])
    assert repr(a).startswith("Array(") and "1.5" in repr(a)
    assert str(a) == str(np.array([[1.5, 2.0], [3.0, 4.0]], np.float32))
    assert "dtype=int32" in repr(make([1, 2], np.int64))  # (x64 off: int64 values enter as int32, as in JAX)
    with fnx.enable_x64():
        assert "dtype=int64" in repr(make([1, 2], np.int64))
    assert repr(make([1, 2], np.int32)) == "Array([1, 2], dtype=int32)"  # JAX always shows the dtype


def test_numpy_conversion(device):
    values = np.arange(12, dtype=np.float32).reshape(3, 4)
    a = make(values)
    np.testing.assert_array_equal(np.asarray(a), values)
    assert np.asarray(a).dtype == np.float32 and np.asarray(a).shape == (3, 4)
    np.testing.assert_array_equal(np.asarray(a, dtype=np.float64), values.astype(np.float64))
    np.testing.assert_array_equal(np.array(a), values)
    assert a.shape == (3, 4) and a.ndim == 2 and a.size == 12 and a.dtype == np.float32


def test_numpy_view_cannot_change_the_array(device):
    """Arrays are immutable: writing through np.asarray's result must not change the Array."""
    a = make([1.0, 2.0, 3.0])
    view = np.asarray(a)
    try:
        view[0] = 100.0
    except ValueError:  # a read-only view, as JAX gives
        pass
    np.testing.assert_array_equal(np.asarray(a), [1.0, 2.0, 3.0])


def test_item_and_tolist(device):
    assert make(2.5).item() == 2.5
    assert make([[7]], np.int32).item() == 7
    assert make([[1, 2], [3, 4]], np.int32).tolist() == [[1, 2], [3, 4]]
    assert make([1.5, 2.5]).tolist() == [1.5, 2.5]
    with pytest.raises(ValueError):
        make([1.0, 2.0]).item()


def test_len_and_iter(device):
    values = np.arange(6, dtype=np.float32).reshape(3, 2)
    a = make(values)
    assert len(a) == 3
    rows = list(a)
    assert len(rows) == 3
    for row, want in zip(rows, values):
        np.testing.assert_array_equal(np.asarray(row), want)
    with pytest.raises(TypeError):
        len(make(1.0))
    with pytest.raises(TypeError):
        iter(make(1.0))


def test_scalar_conversions(device):
    assert bool(make(1.0)) is True and bool(make(0.0)) is False
    assert bool(make([[3]], np.int32)) is True
    assert float(make(2.5)) == 2.5 and int(make(7, np.int32)) == 7
    assert int(make(-2.7)) == int(np.float32(-2.7))
    assert [10, 20, 30][make(1, np.int32)] == 20


def test_bool_of_many_elements_raises(device):
    with pytest.raises(ValueError, match="ambiguous"):  # (JAX's ValueError)
        bool(make([1.0, 2.0]))
    with pytest.raises(ValueError):
        bool(make(np.zeros((0,), np.float32)))


def test_arrays_are_not_hashable(device):
    a = make([1.0])
    with pytest.raises(TypeError):
        hash(a)
    with pytest.raises(TypeError):
        {a: 1}


def test_block_until_ready(device):
    a = make([1.0, 2.0])
    assert a.block_until_ready() is a
    tree = {"a": a, "b": [a]}
    assert fnx.block_until_ready(tree) is tree


def test_dlpack_round_trip(device):
    values = np.arange(10, dtype=np.float32).reshape(2, 5) * 0.5
    a = make(values)
    back = np.from_dlpack(a)
    np.testing.assert_array_equal(back, values)
    assert back.dtype == np.float32 and back.shape == (2, 5)
    ints = np.from_dlpack(make([1, 2, 3], np.int64))
    np.testing.assert_array_equal(ints, [1, 2, 3])


def test_device_and_sharding(device):
    a = make([1.0, 2.0])
    assert a.device.platform == device
    assert a.sharding.device_set == {a.device}


_SHAPES = st.lists(st.integers(0, 3), max_size=4).map(tuple)


@given(st.lists(st.one_of(_SHAPES, st.just(())), min_size=1, max_size=4))
def test_broadcast_shapes_is_numpys(shapes):
    """fnx's broadcast of shapes (its fast path for equal and scalar shapes included) is numpy's, and refuses
    exactly what numpy refuses."""
    try:
        want = np.broadcast_shapes(*shapes)
    except ValueError:
        with pytest.raises(TypeError, match="incompatible shapes"):
            fnx.trace.broadcast_shapes(*shapes)
        return
    assert fnx.trace.broadcast_shapes(*shapes) == want
    assert fnx.trace.broadcast_shapes(*[list(s) for s in shapes]) == want
