"""Derivatives of fnx.numpy: check_grads (forward against finite differences, reverse against forward, to second
order) for every differentiable function on small float64 inputs where it is smooth, and finite, correct
gradients at special points where a naive formula would hide a NaN or overflow behind a `where`."""
import numpy as np
import pytest
from check_grads import check_grads
from hypothesis import given, strategies as st

import fnx
import fnx.numpy as jnp
from fnx import lax

pytestmark = pytest.mark.usefixtures("x64")  # float64 inputs and derivatives

rng = np.random.default_rng(4)
A = rng.standard_normal((3, 4))                 # any sign
B = rng.standard_normal((3, 4))
P = rng.uniform(0.5, 2.0, (3, 4))               # positive
U = rng.uniform(-0.8, 0.8, (3, 4))              # inside (-1, 1)
AWAY = np.where(A < 0, A - 0.3, A + 0.3)        # at least 0.3 from zero
DISTINCT = rng.permutation(12).reshape(3, 4) / 4.0 - 1.5   # no ties
V4 = rng.standard_normal(4)
W = rng.standard_normal((4, 2))
T = rng.standard_normal((2, 3, 4))
IDX = np.array([2, 0, 2])


def logsumexp(x, axis=-1):
    m = lax.stop_gradient(jnp.max(x, axis=axis, keepdims=True))
    return jnp.squeeze(m, axis) + jnp.log(jnp.sum(jnp.exp(x - m), axis=axis))


def softmax_cross_entropy(logits, labels):
    return -(labels * (logits - logsumexp(logits)[:, None])).sum()


CASES = [
    # elementwise arithmetic
    ("add", jnp.add, (A, B)),
    ("subtract", jnp.subtract, (A, B)),
    ("multiply", jnp.multiply, (A, B)),
    ("divide", jnp.divide, (A, P)),
    ("power", jnp.power, (P, B)),
    ("power_int", lambda x: x ** 3, (A,)),
    ("power_half", lambda x: x ** 0.5, (P,)),
    ("square", jnp.square, (A,)),
    ("negative_reciprocal", lambda x: -jnp.reciprocal(x), (P,)),
    ("broadcasting", lambda x, v: x * v + v, (A, V4)),
    # transcendental
    ("exp", jnp.exp, (A,)),
    ("exp2", jnp.exp2, (A,)),
    ("log", jnp.log, (P,)),
    ("log2", jnp.log2, (P,)),
    ("log1p", jnp.log1p, (P - 0.4,)),
    ("expm1", jnp.expm1, (A,)),
    ("sqrt", jnp.sqrt, (P,)),
    ("rsqrt", lambda x: lax.recip(jnp.sqrt(x)), (P,)),
    ("sin", jnp.sin, (A,)),
    ("cos", jnp.cos, (A,)),
    ("tan", jnp.tan, (U,)),
    ("tanh", jnp.tanh, (A,)),
    ("sinh", jnp.sinh, (A,)),
    ("cosh", jnp.cosh, (A,)),
    ("arcsin", jnp.arcsin, (U,)),
    ("arccos", jnp.arccos, (U,)),
    ("arctan", jnp.arctan, (A * 2,)),
    ("arctan2", jnp.arctan2, (A, P)),
    ("arctan2_left_half_plane", jnp.arctan2, (AWAY, -P)),
    ("abs", jnp.abs, (AWAY,)),
    # choices
    ("maximum", jnp.maximum, (A, A + np.where(B < 0, -0.3, 0.3))),
    ("minimum", jnp.minimum, (A, A + np.where(B < 0, -0.3, 0.3))),
    ("where", lambda x, y: jnp.where(x > 0, x * y, jnp.sin(y)), (AWAY, B)),
    ("clip", lambda x: jnp.clip(x, -0.5, 0.5) * x, (np.clip(AWAY, -1.0, 1.0) * 0.9,)),
    # reductions
    ("sum", lambda x: jnp.sum(x * x, axis=1), (A,)),
    ("sum_all", lambda x: jnp.sum(jnp.sin(x)), (A,)),
    ("mean", lambda x: jnp.mean(x * x, axis=0), (A,)),
    ("prod", lambda x: jnp.prod(x, axis=1), (A,)),
    ("max", lambda x: jnp.max(x, axis=1), (DISTINCT,)),
    ("min", lambda x: jnp.min(x), (DISTINCT,)),
    ("var", lambda x: jnp.var(x, axis=1), (A,)),
    ("std", lambda x: jnp.std(x, axis=0, ddof=1), (A,)),
    ("cumsum", lambda x: jnp.cumsum(x, axis=1), (A,)),
    ("cumprod", lambda x: jnp.cumprod(x, axis=1), (A,)),
    ("logsumexp", logsumexp, (A,)),
    ("cross_entropy", softmax_cross_entropy, (A, np.eye(4)[[0, 3, 1]])),
    # contractions
    ("matmul", jnp.matmul, (A, W)),
    ("matmul_batched", lambda t, w: t @ w, (T, W)),
    ("dot", jnp.dot, (A, V4)),
    ("tensordot", lambda t, x: jnp.tensordot(t, x, axes=([1, 2], [0, 1])), (T, A)),
    ("einsum", lambda t, x: jnp.einsum("bij,ij->bi", t, x), (T, A)),
    ("outer", jnp.outer, (V4, V4[::-1].copy())),
    # shapes
    ("reshape", lambda x: jnp.reshape(x, (2, 6)) * 2.0, (A,)),
    ("transpose", lambda t: jnp.transpose(t, (1, 2, 0)), (T,)),
    ("swapaxes", lambda t: jnp.swapaxes(t, 0, 2), (T,)),
    ("moveaxis", lambda t: jnp.moveaxis(t, 0, -1), (T,)),
    ("expand_dims_squeeze", lambda x: jnp.squeeze(jnp.expand_dims(x, 1) * 2.0, 1), (A,)),
    ("broadcast_to", lambda v: jnp.broadcast_to(v, (3, 4)) * A, (V4,)),
    ("concatenate", lambda x, y: jnp.concatenate([x, y * y, x], axis=1), (A, B)),
    ("stack", lambda x, y: jnp.stack([x, y * x], axis=1), (A, B)),
    ("split", lambda x: jnp.split(x, [1, 3], axis=1)[1] * jnp.split(x, 3)[0][:, :2], (A,)),
    ("tile", lambda v: jnp.tile(v, (2, 2)), (V4,)),
    ("repeat", lambda x: jnp.repeat(x, 2, axis=0), (A,)),
    ("pad", lambda x: jnp.pad(x, ((1, 0), (2, 1))), (A,)),
    ("pad_edge", lambda x: jnp.pad(x, ((1, 1), (0, 2)), mode="edge"), (A,)),
    ("flip", lambda x: jnp.flip(x, 1) * x, (A,)),
    ("ravel", lambda x: jnp.ravel(x)[::2], (A,)),
    # indexing and updates
    ("take", lambda x: jnp.take(x, IDX, axis=1), (A,)),
    ("take_along_axis", lambda x: jnp.take_along_axis(x, np.array([[0, 3], [1, 1], [2, 0]]), axis=1), (A,)),
    ("basic_index", lambda x: x[1:, ::2] * x[0, 1], (A,)),
    ("advanced_index", lambda x: x[IDX, 1:] + x[:, np.array([3, 3])].sum(), (A,)),
    ("mixed_index", lambda t: t[np.array([1, 0]), :, np.array([3, 2])], (T,)),
    ("negative_index", lambda x: x[np.array([-1, 0])], (A,)),
    ("bool_mask_const", lambda x: jnp.where(np.array([True, False, True, False]), x, 0.0), (A,)),
    ("at_set", lambda x, v: jnp.asarray(x).at[np.array([0, 2]), 1].set(v[:2] * v[:2]), (A, V4)),
    ("at_add", lambda x, v: jnp.asarray(x).at[np.array([1, 1, 2])].add(v[None, :] * np.ones((3, 1))), (A, V4)),
    ("at_slice_set", lambda x, y: jnp.asarray(x).at[:, 1:3].set(jnp.sin(y[:, :2])), (A, B)),
]


@pytest.mark.parametrize("name,f,args", CASES, ids=[c[0] for c in CASES])
def test_check_grads(name, f, args):
    check_grads(f, args, order=2)


def test_mlp_loss():
    params = {"w1": rng.standard_normal((4, 5)) * 0.5, "b1": np.zeros(5), "w2": rng.standard_normal((5, 3))}

    def loss(p, x, labels):
        h = jnp.tanh(x @ p["w1"] + p["b1"])
        return softmax_cross_entropy(h @ p["w2"], labels) / x.shape[0]
    check_grads(lambda p: loss(p, A, np.eye(3)), (params,), order=1)


# ---- special points: the function is smooth there, so the gradient must be finite and right ----

SPECIAL = [
    ("tanh", jnp.tanh, 0.0, 1.0),
    ("tanh", jnp.tanh, 30.0, 0.0),
    ("tanh", jnp.tanh, -30.0, 0.0),
    ("tanh", jnp.tanh, 1e-8, 1.0),
    ("arctan", jnp.arctan, 0.0, 1.0),
    ("arctan", jnp.arctan, 1e8, 1e-16),
    ("sinh", jnp.sinh, 0.0, 1.0),
    ("cosh", jnp.cosh, 0.0, 0.0),
    ("exp", jnp.exp, -100.0, np.exp(-100.0)),
    ("exp", jnp.exp, 0.0, 1.0),
    ("expm1", jnp.expm1, 0.0, 1.0),
    ("log1p", jnp.log1p, 0.0, 1.0),
    ("log", jnp.log, 1.0, 1.0),
    ("sin", jnp.sin, 0.0, 1.0),
    ("cos", jnp.cos, 0.0, 0.0),
    ("tan", jnp.tan, 0.0, 1.0),
    ("arcsin", jnp.arcsin, 0.0, 1.0),
    ("arccos", jnp.arccos, 0.0, -1.0),
    ("sqrt", jnp.sqrt, 1.0, 0.5),
    ("abs", jnp.abs, 0.0, None),             # not differentiable at 0: any finite subgradient (JAX gives 1)
    ("abs", jnp.abs, -2.0, -1.0),
    ("arctan2_at_x_axis", lambda y: jnp.arctan2(y, 1.0), 0.0, 1.0),
    ("arctan2_on_y_axis", lambda x: jnp.arctan2(1.0, x), 0.0, -1.0),
    ("logsumexp_large", lambda x: logsumexp(jnp.stack([x, x * 0.0])), 800.0, 1.0),
    ("softplus_large", lambda x: jnp.log1p(jnp.exp(-jnp.abs(x))) + jnp.maximum(x, 0.0), 50.0, 1.0),
    ("power_at_zero", lambda x: x ** 2, 0.0, 0.0),
    ("float_power_at_zero", lambda x: x ** 2.0, 0.0, 0.0),      # JAX: 0; the log2|x| formula gives NaN
    ("float_power_2.5_at_zero", lambda x: jnp.power(x, 2.5), 0.0, 0.0),
    ("power_exponent_at_zero_base", lambda y: jnp.power(0.0, y + 2.0), 0.0, 0.0),
    ("sqrt_of_square_sum", lambda x: jnp.sqrt(x * x + 1.0), 0.0, 0.0),
]


@pytest.mark.parametrize("name,f,x,expected", SPECIAL, ids=[f"{s[0]}({s[2]})" for s in SPECIAL])
def test_gradient_is_finite_at_special_points(name, f, x, expected):
    for x64 in (np.float64(x), np.float32(x)):
        g = np.asarray(fnx.grad(f)(x64))
        assert np.isfinite(g), f"grad of {name} at {x} ({x64.dtype}) is {g}"
        if expected is not None:
            np.testing.assert_allclose(g, expected, rtol=1e-5, atol=1e-30 if x64.dtype == np.float64 else 1e-37)
        tangent = np.asarray(fnx.jvp(f, (x64,), (np.ones_like(x64),))[1])
        assert np.isfinite(tangent), f"jvp of {name} at {x} ({x64.dtype}) is {tangent}"


def test_second_derivatives_are_finite_at_zero():
    for f in (jnp.tanh, jnp.arctan, jnp.sinh, jnp.sin, jnp.expm1, jnp.log1p):
        assert np.isfinite(np.asarray(fnx.grad(fnx.grad(f))(np.float64(0.0)))), f.__name__


def test_gradient_of_a_vector_with_special_values_is_finite():
    x = np.array([0.0, 1e-30, -30.0, 30.0, 1.0])
    for f in (jnp.tanh, jnp.arctan, jnp.sinh, jnp.cosh, jnp.sin, jnp.exp):
        g = np.asarray(fnx.grad(lambda v: f(v).sum())(x))
        assert np.all(np.isfinite(g)), f"{f.__name__}: {g}"


@given(st.lists(st.floats(-5, 5), min_size=4, max_size=4))
def test_tanh_and_arctan_gradients_at_random_points(values):
    x = np.array(values)
    np.testing.assert_allclose(np.asarray(fnx.grad(lambda v: jnp.tanh(v).sum())(x)), 1 - np.tanh(x) ** 2,
                               rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(np.asarray(fnx.grad(lambda v: jnp.arctan(v).sum())(x)), 1 / (1 + x * x),
                               rtol=1e-10, atol=1e-12)
