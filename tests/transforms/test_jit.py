"""jit: results equal eager execution and the interp oracle; the trace cache; static, donated and pytree
arguments; closed-over arrays; Python scalars; lowering text; concretization errors; nesting."""
import sys

import numpy as np
import pytest
from hypothesis import given, strategies as st

import fnx
from fnx import lax
from fnx.errors import ConcretizationError
from fnx.uop import Ops

shapes = st.lists(st.integers(1, 5), min_size=0, max_size=3).map(tuple)


def f_math(x, y):
    z = lax.add(lax.mul(x, y), 1.0)
    return lax.max(lax.sin(z), lax.mul(lax.sqrt(lax.mul(z, z)), 0.25))


def f_numpy(x, y):
    z = x.astype(np.float64) * y + 1.0
    return np.maximum(np.sin(z), np.abs(z) * 0.25)


def on(device, f, *args):
    with fnx.default_device(device):
        return f(*args)


def arrays(shape, seed=0, dtype=np.float32):
    rng = np.random.default_rng(seed)
    return [rng.standard_normal(shape).astype(dtype) for _ in range(2)]


@given(shapes)
def test_jit_matches_eager_and_interp(device, shape):
    x, y = arrays(shape)
    jitted = np.asarray(fnx.jit(f_math)(x, y))
    eager = np.asarray(f_math(x, y))
    oracle = np.asarray(on("interp", fnx.jit(f_math), x, y))
    np.testing.assert_allclose(jitted, oracle, rtol=2e-6, atol=1e-6)
    np.testing.assert_allclose(jitted, eager, rtol=2e-6, atol=1e-6)
    np.testing.assert_allclose(jitted, f_numpy(x, y), rtol=1e-5, atol=1e-5)
    assert jitted.shape == shape and jitted.dtype == np.float32


def test_jit_accepts_fnx_arrays_and_lazy_values(device):
    x, y = arrays((3, 4), seed=1)
    ax = lax.add(x, 0.0)                  # a concrete Array
    jitted = fnx.jit(f_math)
    np.testing.assert_allclose(np.asarray(jitted(ax, y)), f_numpy(x, y), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(np.asarray(jitted(ax, lax.add(y, 0.0))), f_numpy(x, y), rtol=1e-5, atol=1e-5)


# ---- the trace cache ----

def test_same_avals_reuse_the_trace(device):
    jitted = fnx.jit(lambda x, y: f_math(x, y))  # (a new function: f_math's traces are shared by every jit of it)
    x, y = arrays((2, 3))
    jitted(x, y)
    jitted(*arrays((2, 3), seed=5))
    jitted(lax.add(x, 0.0), lax.add(y, 0.0))
    assert jitted.trace_count() == 1


def test_new_shape_or_dtype_retraces(device):
    jitted = fnx.jit(lambda x: lax.mul(x, 2))
    jitted(np.ones(3, np.float32))
    jitted(np.ones(4, np.float32))
    assert jitted.trace_count() == 2
    out = jitted(np.ones(4, np.int32))
    assert jitted.trace_count() == 3
    assert np.asarray(out).dtype == np.int32
    np.testing.assert_array_equal(np.asarray(out), [2, 2, 2, 2])
    jitted(np.ones(4, np.float32))
    assert jitted.trace_count() == 3


def test_python_scalars_are_weakly_typed_and_traced(device):
    jitted = fnx.jit(lambda x, s: lax.mul(x, s))
    x = np.array([1, 2, 3], np.float32)
    out2 = jitted(x, 2)
    out3 = jitted(x, 3)
    assert jitted.trace_count() == 1          # the scalar is an argument, not a constant
    assert np.asarray(out2).dtype == np.float32  # a weak int does not widen a float32 array
    np.testing.assert_array_equal(np.asarray(out2), x * 2)
    np.testing.assert_array_equal(np.asarray(out3), x * 3)
    jitted(x, 2.5)                             # a float is another aval
    assert jitted.trace_count() == 2
    both = jitted(2, 3)
    assert np.asarray(both).dtype == np.int32 and both.item() == 6
    assert both.weak_type and both.weak_type == lax.mul(2, 3).weak_type   # as eager, and as JAX
    x16 = np.array([1, 2], np.float16)
    assert np.asarray(jitted(x16, 2.5)).dtype == np.float16


# ---- static and donated arguments ----

def scale_by(x, n):
    out = x
    for _ in range(n): out = lax.add(out, x)   # n is a Python int: it must be static
    return out


def test_static_argnums_retrace_per_value(device):
    jitted = fnx.jit(scale_by, static_argnums=1)
    x = np.arange(4, dtype=np.float32)
    np.testing.assert_array_equal(np.asarray(jitted(x, 2)), x * 3)
    np.testing.assert_array_equal(np.asarray(jitted(x, 3)), x * 4)
    assert jitted.trace_count() == 2
    np.testing.assert_array_equal(np.asarray(jitted(x, 2)), x * 3)
    assert jitted.trace_count() == 2
    np.testing.assert_array_equal(np.asarray(jitted(x, n=4)), x * 5)  # bound to its position by name


def test_static_argnames_by_keyword(device):
    jitted = fnx.jit(scale_by, static_argnames="n")
    x = np.arange(4, dtype=np.float32)
    np.testing.assert_array_equal(np.asarray(jitted(x, n=2)), x * 3)
    np.testing.assert_array_equal(np.asarray(jitted(x, n=1)), x * 2)
    assert jitted.trace_count() == 2


def test_static_argnames_passed_by_position(device):
    jitted = fnx.jit(scale_by, static_argnames=("n",))
    x = np.arange(4, dtype=np.float32)
    np.testing.assert_array_equal(np.asarray(jitted(x, 2)), x * 3)


def test_unhashable_static_argument_raises():
    jitted = fnx.jit(lambda x, cfg: x, static_argnums=1)
    with pytest.raises(ValueError, match="hashable"):
        jitted(np.ones(2, np.float32), [1, 2])


def test_donate_argnums_is_accepted(device):
    jitted = fnx.jit(lambda x, y: lax.add(x, y), donate_argnums=(0,))
    x, y = arrays((5,))
    np.testing.assert_allclose(np.asarray(jitted(x, y)), x + y, rtol=1e-6)
    jitted2 = fnx.jit(lambda x: lax.mul(x, 2.0), donate_argnums=0)
    np.testing.assert_allclose(np.asarray(jitted2(x)), x * 2, rtol=1e-6)


# ---- pytrees ----

def test_pytrees_in_and_out(device):
    def f(params, batch):
        w, b = params["w"], params["b"]
        h = lax.add(lax.mul(batch[0], w), b)
        return {"h": h, "pair": (lax.sin(h), None), "list": [batch[1], lax.mul(batch[1], 2.0)]}
    w, b = arrays((3,))
    u, v = arrays((3,), seed=2)
    params, batch = {"w": w, "b": b}, (u, v)
    out = fnx.jit(f)(params, batch)
    assert set(out) == {"h", "pair", "list"}
    assert out["pair"][1] is None and isinstance(out["pair"], tuple) and isinstance(out["list"], list)
    want = u * w + b
    np.testing.assert_allclose(np.asarray(out["h"]), want, rtol=1e-6)
    np.testing.assert_allclose(np.asarray(out["pair"][0]), np.sin(want), rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(np.asarray(out["list"][0]), v)
    np.testing.assert_array_equal(np.asarray(out["list"][1]), v * 2)
    eager = f(params, batch)
    np.testing.assert_allclose(np.asarray(out["pair"][0]), np.asarray(eager["pair"][0]), rtol=1e-6, atol=1e-6)


def test_pytree_structure_is_part_of_the_key(device):
    jitted = fnx.jit(lambda d: lax.add(d["a"], 1.0))
    x = np.ones(2, np.float32)
    jitted({"a": x})
    jitted({"a": x, "unused": x})
    assert jitted.trace_count() == 2


def test_constant_and_passthrough_outputs(device):
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    out = fnx.jit(lambda x: (x, 2.0, lax.reshape(x, (6,)), lax.transpose(x, (1, 0))))(x)
    np.testing.assert_array_equal(np.asarray(out[0]), x)
    assert float(out[1]) == 2.0
    np.testing.assert_array_equal(np.asarray(out[2]), x.reshape(6))
    np.testing.assert_array_equal(np.asarray(out[3]), x.T)


def test_outputs_do_not_alias_the_callers_numpy_input(device):
    """fnx arrays are immutable: mutating the numpy array passed in must not change an output."""
    x = np.arange(3, dtype=np.float32)
    same = fnx.jit(lambda x: x)(x)
    reshaped = fnx.jit(lambda x: lax.reshape(x, (3, 1)))(x)
    x[0] = 99.0
    np.testing.assert_array_equal(np.asarray(same), [0, 1, 2])
    np.testing.assert_array_equal(np.asarray(reshaped).ravel(), [0, 1, 2])


# ---- closed-over arrays ----

def test_closed_over_arrays_become_extra_inputs(device):
    c = lax.add(np.array([10, 20, 30], np.float32), 0.0)
    f = lambda x: lax.add(x, c)  # noqa: E731
    x = np.array([1, 2, 3], np.float32)
    graph = fnx.make_graph(f)(x)
    params = sorted((u for u in graph.fn.src[0].toposort if u.op is Ops.PARAM), key=lambda p: p.arg.slot)
    assert [p.arg.slot for p in params] == [0, 1]
    assert len(graph.traced.consts) == 1
    assert "p1: f32[3]" in str(graph)
    assert not any(u.op is Ops.BUFFER for u in graph.fn.src[0].toposort)
    np.testing.assert_array_equal(np.asarray(fnx.jit(f)(x)), [11, 22, 33])


def test_closed_over_values_are_captured_at_trace_time(device):
    held = {"c": np.array([1, 1], np.float32)}
    jitted = fnx.jit(lambda x: lax.mul(x, held["c"]))
    x = np.array([3, 4], np.float32)
    np.testing.assert_array_equal(np.asarray(jitted(x)), [3, 4])
    held["c"] = np.array([5, 5], np.float32)      # as in JAX: the cached trace keeps the value it saw
    np.testing.assert_array_equal(np.asarray(jitted(x)), [3, 4])
    assert jitted.trace_count() == 1
    np.testing.assert_array_equal(np.asarray(fnx.jit(lambda x: lax.mul(x, held["c"]))(x)), [15, 20])


def test_unused_arguments(device):
    x, y = arrays((4,))
    jitted = fnx.jit(lambda x, y, z: lax.mul(x, 2.0))
    np.testing.assert_allclose(np.asarray(jitted(x, y, np.ones(7, np.int32))), x * 2, rtol=1e-6)
    graph = fnx.make_graph(lambda x, y: x)(x, y)
    assert "p0: f32[4], p1: f32[4]" in str(graph)


# ---- lowering ----

def test_lower_as_text_and_compile():
    x, y = arrays((3, 4))
    with fnx.default_device("cpu"):
        lowered = fnx.jit(f_math).lower(x, y)
        text = lowered.as_text()
        assert "function(p0: f32[3,4], p1: f32[3,4]):" in text
        assert "sin" in text and "define void" in text
        assert "define void" in lowered.as_text("llvm")
        assert "define void" not in lowered.as_text("graph")
        compiled = lowered.compile()
        np.testing.assert_allclose(np.asarray(compiled(x, y)), f_numpy(x, y), rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(np.asarray(compiled(*arrays((3, 4), seed=9))), f_numpy(*arrays((3, 4), seed=9)),
                                   rtol=1e-5, atol=1e-5)


def test_lower_on_interp_shows_the_graph():
    with fnx.default_device("interp"):
        text = fnx.jit(f_math).lower(*arrays((2,))).as_text()
    assert "function(p0: f32[2], p1: f32[2]):" in text and "sin" in text


# ---- concretization ----

def test_python_branch_on_a_tracer_raises_concretization_error(device):
    lines = []

    def f(x):
        lines.append(sys._getframe().f_lineno + 1)
        if lax.lt(0.0, lax.reduce_sum(x, (0,))):
            return x
        return lax.mul(x, -1.0)

    x = np.array([1, 2], np.float32)
    with pytest.raises(ConcretizationError) as info:
        fnx.jit(f)(x)
    message = str(info.value)
    assert f"{__file__}:{lines[-1]}" in message
    assert "where" in message
    assert isinstance(info.value, TypeError)
    np.testing.assert_array_equal(np.asarray(f(x)), x)   # eagerly the same code branches fine


def test_float_of_a_tracer_raises_concretization_error(device):
    with pytest.raises(ConcretizationError):
        fnx.jit(lambda x: lax.mul(x, float(x)))(np.float32(2.0))
    with pytest.raises(ConcretizationError):
        fnx.jit(lambda x: np.asarray(x))(np.ones(3, np.float32))


# ---- nesting ----

def test_nested_jit_is_inlined(device):
    inner = fnx.jit(lambda x: lax.sin(lax.mul(x, 2.0)))
    outer = fnx.jit(lambda x: lax.add(inner(x), inner(lax.add(x, 1.0))))
    x = np.linspace(-1, 1, 5, dtype=np.float32)
    want = np.sin(2 * x.astype(np.float64)) + np.sin(2 * (x.astype(np.float64) + 1))
    np.testing.assert_allclose(np.asarray(outer(x)), want, rtol=1e-5, atol=1e-6)
    assert inner.trace_count() == 0
    graph = fnx.make_graph(lambda x: lax.add(inner(x), 1.0))(x)
    ops = {u.op for u in graph.fn.src[0].toposort}
    assert Ops.SIN in ops and not ops & {Ops.FUNCTION, Ops.CALL, Ops.GETTUPLE}


# ---- compiled selects and comparisons at value edges, against the interp oracle ----

def test_float_clamp_chain_matches_interp(device):
    def f(x):
        y = lax.select(lax.lt(x, 2.5), x, lax.full(x.shape, 0.0))
        return lax.select(lax.lt(y, 2.0), y, lax.full(x.shape, 7.0))
    x = np.array([1.0, 2.4, 3.0, -1.0], np.float32)
    want = np.where(np.where(x < 2.5, x, 0) < 2.0, np.where(x < 2.5, x, 0), 7.0)
    np.testing.assert_array_equal(np.asarray(fnx.jit(f)(x)), want)
    np.testing.assert_array_equal(np.asarray(on("interp", fnx.jit(f), x)), want)


def test_integer_edges_match_interp(device):
    lo = int(np.iinfo(np.int32).min)
    wrap = lambda x: lax.lt(lax.add(x, np.int32(1)), np.int32(lo + 1))  # noqa: E731
    x = np.array([2 ** 31 - 1, 5], np.int32)
    np.testing.assert_array_equal(np.asarray(fnx.jit(wrap)(x)), np.asarray(on("interp", fnx.jit(wrap), x)))
    sign = lambda u: lax.lt(lax.convert_element_type(u, np.int32), 0)  # noqa: E731
    u = np.array([4_000_000_000, 5], np.uint32)
    np.testing.assert_array_equal(np.asarray(fnx.jit(sign)(u)), u.astype(np.int32) < 0)
