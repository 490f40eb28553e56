"""jax.lax's array builders (tile, stack, unstack, empty, dtype, broadcast_like) and the top-level names JAX code
uses (custom_gradient, linear_transpose, checkpoint_policies, default_matmul_precision, host_ids,
print_environment_info), against JAX; and a custom_vjp whose bwd returns a cotangent of the wrong shape is an error,
never a gradient of that shape."""
import numpy as np
import pytest

import fnx
import fnx.numpy as jnp
from fnx import lax

jax = pytest.importorskip("jax")
jjnp = pytest.importorskip("jax.numpy")
jlax = jax.lax

X = np.arange(6, dtype=np.float32).reshape(2, 3)


@pytest.mark.parametrize("name, args", [
    ("tile", (X, (2, 3))), ("stack", ([X, X + 1], 1)), ("stack", ([X, X * 2, X], -1)),
    ("broadcast_like", (np.float32([1, 2, 3]), np.ones((4, 2, 3)))),
    ("broadcast_like", (np.ones((2, 1), np.int32), np.ones((2, 3))))])
def test_lax_builders_match_jax(device, name, args):
    want = getattr(jlax, name)(*args)
    operands, rest = args[0], args[1:]  # (under jit the first argument is traced, the others are static)
    jitted = fnx.jit(lambda a: getattr(lax, name)(a, *rest))(operands)
    for got in (getattr(lax, name)(*args), jitted):
        assert got.shape == want.shape and got.dtype == want.dtype
        np.testing.assert_array_equal(np.asarray(got), np.asarray(want))


def test_unstack_stack_round_trip_under_jit(device):
    for axis in (0, 1, -1):
        want = jlax.unstack(X, axis)
        got = lax.unstack(X, axis)
        assert len(got) == len(want)
        for g, w in zip(got, want): np.testing.assert_array_equal(np.asarray(g), np.asarray(w))
        np.testing.assert_array_equal(np.asarray(fnx.jit(lambda a: lax.stack(lax.unstack(a, axis), axis))(X)), X)


def test_empty_and_dtype():
    assert lax.empty((2, 3), np.int16).shape == (2, 3) and lax.empty((2, 3), np.int16).dtype == np.int16
    for value in (1.0, 1, True, np.ones(2), np.int16, "bfloat16", np.float64):
        assert lax.dtype(value) == jlax.dtype(value), value


def test_lax_builder_errors():
    with pytest.raises(TypeError, match="reps length"):
        lax.tile(X, (2,))
    with pytest.raises(TypeError, match="one shape and dtype"):
        lax.stack([X, X[:1]])
    with pytest.raises(ValueError, match="0-d"):
        lax.unstack(np.float32(1))
    with pytest.raises(fnx.errors.ShapeError, match="broadcast_like"):
        lax.broadcast_like(np.ones(3), np.ones((2, 2)))


def _custom(lib, m):
    @lib.custom_gradient
    def f(x, y):
        return m.sin(x) * y, lambda g: ((g * 2.0).sum(), g * 3.0 * m.cos(x))
    return f


def test_custom_gradient_matches_jax():
    x, y = np.float32(0.5), np.array([1.0, 2.0], np.float32)
    f, jf = _custom(fnx, jnp), _custom(jax, jjnp)
    np.testing.assert_allclose(np.asarray(f(x, y)), np.asarray(jf(x, y)), rtol=1e-6)
    loss, jloss = (lambda a, b: f(a, b).sum()), (lambda a, b: jf(a, b).sum())
    for got in (fnx.grad(loss, argnums=(0, 1))(x, y), fnx.jit(fnx.grad(loss, argnums=(0, 1)))(x, y)):
        want = jax.grad(jloss, argnums=(0, 1))(x, y)
        for g, w in zip(got, want): np.testing.assert_allclose(np.asarray(g), np.asarray(w), rtol=1e-6)
    # the custom rule, not the function's own derivative: d/dx is 2 * sum(g), not cos(x) * sum(y)
    assert float(fnx.grad(loss)(x, y)) == pytest.approx(4.0)


def test_custom_gradient_wrong_count_is_an_error():
    @fnx.custom_gradient
    def f(x, y):
        return x * y, lambda g: (g,)
    with pytest.raises(TypeError, match="1 cotangents for a function of 2"):
        fnx.grad(f)(1.0, 2.0)


def test_linear_transpose_matches_jax():
    a = np.ones(2, np.float32)
    cases = [(lambda v: 2 * v[0] - v[1], (a,), np.float32(1.5)),
             (lambda u, v: 3 * u + jnp.flip(v), (a, a), np.array([1.0, -2.0], np.float32)),
             (lambda m: m @ np.array([[1.0, 2.0], [3.0, 4.0]], np.float32), (np.ones((3, 2), np.float32),),
              np.arange(6, dtype=np.float32).reshape(3, 2))]
    jcases = [lambda v: 2 * v[0] - v[1], lambda u, v: 3 * u + jjnp.flip(v),
              lambda m: m @ np.array([[1.0, 2.0], [3.0, 4.0]], np.float32)]
    for (f, primals, ct), jf in zip(cases, jcases):
        got, want = fnx.linear_transpose(f, *primals)(ct), jax.linear_transpose(jf, *primals)(ct)
        assert len(got) == len(want)
        for g, w in zip(got, want): np.testing.assert_allclose(np.asarray(g), np.asarray(w), rtol=1e-6)
    shapes = fnx.linear_transpose(lambda v: v * 2, fnx.ShapeDtypeStruct((3,), np.float32))(np.ones(3, np.float32))
    np.testing.assert_array_equal(np.asarray(shapes[0]), [2, 2, 2])


def test_checkpoint_policies_and_precision_are_accepted():
    assert set(dir(jax.checkpoint_policies)) - set(dir(fnx.checkpoint_policies)) == set()
    for policy in (fnx.checkpoint_policies.dots_saveable, fnx.checkpoint_policies.save_only_these_names("h")):
        f = fnx.checkpoint(lambda v: jnp.sin(v) * v, policy=policy)
        assert float(fnx.grad(f)(1.0)) == pytest.approx(np.cos(1.0) + np.sin(1.0), rel=1e-6)
    with fnx.default_matmul_precision("highest"):
        np.testing.assert_allclose(np.asarray(jnp.ones((2, 2)) @ jnp.ones((2, 2))), 2 * np.ones((2, 2)))
    with pytest.raises(ValueError, match="unknown precision"):
        with fnx.default_matmul_precision("fast-ish"):
            pass


def test_environment_info_and_host_ids():
    text = fnx.print_environment_info(return_string=True)
    assert f"fnx:      {fnx.__version__}" in text and "numpy:" in text and "cpu" in text.lower()
    assert fnx.host_ids() == list(range(fnx.process_count()))


def test_custom_vjp_cotangent_shape_is_checked():
    @fnx.custom_vjp
    def g(x): return x
    g.defvjp(lambda x: (x, None), lambda r, ct: (jnp.ones(3),))
    with pytest.raises(ValueError, match=r"bwd's cotangent 0 has shape \[3\] where its argument has shape \[\]"):
        fnx.grad(g)(1.0)

    @fnx.custom_vjp
    def h(x, y): return x * y["a"]
    h.defvjp(lambda x, y: (x * y["a"], (x, y)), lambda r, ct: (None, {"a": ct * r[0]}))
    gx, gy = fnx.grad(h, argnums=(0, 1))(2.0, {"a": 3.0})
    assert float(gx) == 0.0 and float(gy["a"]) == 2.0  # None is a zero cotangent, as in JAX
