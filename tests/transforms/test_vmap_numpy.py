"""vmap of every fnx.numpy and fnx.nn function of the API: `vmap(f)(xs)` equals f run per example and stacked
(with fnx, and with numpy where numpy has the function), with every argument batched along axis 0, and with
the first argument batched along its last axis and the others shared, on each backend."""
import numpy as np
import pytest
from test_vmap import args_of, batch, bools, check_vmap, ints, normal, positive

import fnx.numpy as jnp
from fnx import nn

X, V, M = (3, 4), (4,), (4, 2)


def np_softmax(x, axis=-1):
    e = np.exp(x - x.max(axis, keepdims=True))
    return e / e.sum(axis, keepdims=True)


def np_logsumexp(x, axis=None):
    m = x.max(axis, keepdims=True)
    return np.squeeze(m, axis) + np.log(np.exp(x - m).sum(axis)) if axis is not None else \
        m.reshape(()) + np.log(np.exp(x - m).sum())


def np_gelu(x):
    return 0.5 * x * (1 + np.tanh(np.sqrt(2 / np.pi) * (x + 0.044715 * x ** 3)))


def np_at(op):
    def fn(x, i, v):
        out = np.array(x, copy=True)
        getattr(np, op).at(out, i, v) if op != "set" else out.__setitem__(i, v)
        return out
    return fn


# (name, fn, numpy reference or None, make one example's args)
FUNCTIONS = [
    # elementwise
    ("add", jnp.add, np.add, args_of(normal(X), normal(V))),
    ("subtract", jnp.subtract, np.subtract, args_of(normal(X), normal(X))),
    ("multiply_int", jnp.multiply, np.multiply, args_of(ints(X), ints(V))),
    ("divide", jnp.divide, np.divide, args_of(normal(X), positive(X))),
    ("floor_divide", jnp.floor_divide, np.floor_divide, args_of(ints(X, -20, 20), ints(V, 1, 5))),
    ("mod", jnp.mod, np.mod, args_of(normal(X), positive(X))),
    ("power", jnp.power, np.power, args_of(positive(X), normal(X))),
    ("negative_abs_sign", lambda x: -jnp.abs(x) * jnp.sign(x), lambda x: -np.abs(x) * np.sign(x), args_of(normal(X))),
    ("exp_log", lambda x: jnp.exp(x) + jnp.log(x), lambda x: np.exp(x) + np.log(x), args_of(positive(X))),
    ("exp2_log2_log1p_expm1", lambda x: jnp.exp2(x) + jnp.log2(x) + jnp.log1p(x) + jnp.expm1(x),
     lambda x: np.exp2(x) + np.log2(x) + np.log1p(x) + np.expm1(x), args_of(positive(X))),
    ("sqrt_rsqrt_square", lambda x: jnp.sqrt(x) + jnp.reciprocal(jnp.sqrt(x)) + jnp.square(x),
     lambda x: np.sqrt(x) + 1 / np.sqrt(x) + x * x, args_of(positive(X))),
    ("trig", lambda x: jnp.sin(x) + jnp.cos(x) + jnp.tan(x * 0.5), lambda x: np.sin(x) + np.cos(x) + np.tan(x * 0.5),
     args_of(normal(X))),
    ("hyperbolic", lambda x: jnp.tanh(x) + jnp.sinh(x) + jnp.cosh(x), lambda x: np.tanh(x) + np.sinh(x) + np.cosh(x),
     args_of(normal(X))),
    ("inverse_trig", lambda x: jnp.arcsin(x) + jnp.arccos(x) + jnp.arctan(x),
     lambda x: np.arcsin(x) + np.arccos(x) + np.arctan(x), args_of(lambda r: r.uniform(-0.9, 0.9, X).astype("f4"))),
    ("arctan2", jnp.arctan2, np.arctan2, args_of(normal(X), normal(X))),
    ("rounding", lambda x: jnp.floor(x) + jnp.ceil(x) * 2 + jnp.round(x * 3),
     lambda x: np.floor(x) + np.ceil(x) * 2 + np.round(x * 3), args_of(normal(X))),
    ("clip", lambda x: jnp.clip(x, -0.5, 0.5), lambda x: np.clip(x, -0.5, 0.5), args_of(normal(X))),
    ("clip_array_bounds", lambda x, lo: jnp.clip(x, lo, lo + 1), lambda x, lo: np.clip(x, lo, lo + 1),
     args_of(normal(X), normal(V))),
    ("maximum_minimum", lambda x, y: jnp.maximum(x, y) - jnp.minimum(x, y),
     lambda x, y: np.maximum(x, y) - np.minimum(x, y), args_of(normal(X), normal(X))),
    ("where", jnp.where, np.where, args_of(bools(X), normal(X), normal(V))),
    ("logical", lambda a, b: jnp.logical_and(a, b) ^ jnp.logical_or(a, jnp.logical_not(b)),
     lambda a, b: np.logical_and(a, b) ^ np.logical_or(a, np.logical_not(b)), args_of(bools(X), bools(X))),
    ("comparisons", lambda x, y: jnp.stack([x == y, x != y, x < y, x <= y, x > y, x >= y]),
     lambda x, y: np.stack([x == y, x != y, x < y, x <= y, x > y, x >= y]), args_of(ints(X, 0, 3), ints(X, 0, 3))),
    ("isnan_isinf_isfinite", lambda x: jnp.stack([jnp.isnan(x), jnp.isinf(x), jnp.isfinite(x)]),
     lambda x: np.stack([np.isnan(x), np.isinf(x), np.isfinite(x)]),
     args_of(lambda r: r.choice(np.array([0.0, 1.0, np.inf, -np.inf, np.nan], "f4"), X))),
    ("astype", lambda x: x.astype(jnp.int32) + x.astype(jnp.bool_), None, args_of(normal(X))),
    # reductions
    ("sum_axis", lambda x: jnp.sum(x, axis=1), lambda x: x.sum(1), args_of(normal(X))),
    ("sum_keepdims", lambda x: jnp.sum(x, axis=0, keepdims=True), lambda x: x.sum(0, keepdims=True),
     args_of(normal(X))),
    ("mean_all", jnp.mean, np.mean, args_of(normal(X))),
    ("prod", lambda x: jnp.prod(x, axis=-1), lambda x: x.prod(-1), args_of(positive(X))),
    ("max_min", lambda x: jnp.max(x, axis=0) - jnp.min(x), lambda x: x.max(0) - x.min(), args_of(normal(X))),
    ("argmax", lambda x: jnp.argmax(x, axis=1), lambda x: x.argmax(1).astype(np.int32), args_of(normal(X))),
    ("argmin_flat", jnp.argmin, lambda x: np.int32(x.argmin()), args_of(ints(X, 0, 4))),
    ("var_std", lambda x: jnp.var(x, axis=1) + jnp.std(x, axis=0, keepdims=True).sum(),
     lambda x: x.var(1) + x.std(0, keepdims=True).sum(), args_of(normal(X))),
    ("all_any", lambda x: jnp.stack([jnp.all(x, axis=1), jnp.any(x, axis=1)]),
     lambda x: np.stack([x.all(1), x.any(1)]), args_of(bools(X))),
    ("cumsum", lambda x: jnp.cumsum(x, axis=1), lambda x: np.cumsum(x, axis=1), args_of(normal(X))),
    ("cumprod_int", lambda x: jnp.cumprod(x, axis=0), lambda x: np.cumprod(x, axis=0, dtype=np.int32),
     args_of(ints(X, -3, 4))),
    # shapes
    ("reshape", lambda x: jnp.reshape(x, (2, -1)), lambda x: x.reshape(2, -1), args_of(normal(X))),
    ("ravel_transpose_T", lambda x: jnp.ravel(x) + jnp.ravel(jnp.transpose(x).T),
     lambda x: x.ravel() * 2, args_of(normal(X))),
    ("swapaxes_moveaxis", lambda x: jnp.swapaxes(x, 0, 2) + jnp.moveaxis(x, 0, -1).transpose(1, 0, 2),
     lambda x: np.swapaxes(x, 0, 2) + np.moveaxis(x, 0, -1).transpose(1, 0, 2), args_of(normal((2, 3, 2)))),
    ("expand_dims_squeeze", lambda x: jnp.squeeze(jnp.expand_dims(x, (0, 2)), 0),
     lambda x: np.expand_dims(x, 1), args_of(normal(X))),
    ("broadcast_to", lambda x: jnp.broadcast_to(x, (2, 3, 4)), lambda x: np.broadcast_to(x, (2, 3, 4)),
     args_of(normal(V))),
    ("concatenate", lambda x, y: jnp.concatenate([x, y, x], axis=1), lambda x, y: np.concatenate([x, y, x], axis=1),
     args_of(normal(X), normal((3, 2)))),
    ("stack", lambda x, y: jnp.stack([x, y], axis=-1), lambda x, y: np.stack([x, y], axis=-1),
     args_of(normal(X), normal(X))),
    ("split", lambda x: jnp.split(x, [1, 3], axis=1), lambda x: np.split(x, [1, 3], axis=1), args_of(normal(X))),
    ("tile_repeat", lambda x: (jnp.tile(x, (2, 1)), jnp.repeat(x, 2, axis=1)),
     lambda x: (np.tile(x, (2, 1)), np.repeat(x, 2, axis=1)), args_of(normal(X))),
    ("pad", lambda x: jnp.pad(x, ((1, 0), (2, 1)), constant_values=3.0),
     lambda x: np.pad(x, ((1, 0), (2, 1)), constant_values=3.0), args_of(normal(X))),
    ("pad_edge", lambda x: jnp.pad(x, 1, mode="edge"), lambda x: np.pad(x, 1, mode="edge"), args_of(normal(X))),
    ("flip", lambda x: jnp.flip(x, 1), lambda x: np.flip(x, 1), args_of(normal(X))),
    # creation inside the function
    ("like_creation", lambda x: jnp.zeros_like(x) + jnp.ones_like(x) * 2 + jnp.full_like(x, 3.0),
     lambda x: np.full_like(x, 5.0), args_of(normal(X))),
    ("arange_linspace_eye", lambda x: x + jnp.arange(4) + jnp.linspace(0, 1, 4) + jnp.eye(3, 4),
     lambda x: x + np.arange(4) + np.linspace(0, 1, 4, dtype="f4") + np.eye(3, 4, dtype="f4"), args_of(normal(X))),
    # indexing
    ("basic_index", lambda x: x[1], lambda x: x[1], args_of(normal(X))),
    ("slices", lambda x: x[None, 1:, ::2], lambda x: x[None, 1:, ::2], args_of(normal(X))),
    ("negative_step_ellipsis", lambda x: x[..., ::-2], lambda x: x[..., ::-2], args_of(normal(X))),
    ("array_index", lambda x, i: x[i], lambda x, i: x[i], args_of(normal(X), ints((2,), -3, 3))),
    ("array_index_second_axis", lambda x, i: x[:, i], lambda x, i: x[:, i], args_of(normal(X), ints((2, 2), -4, 4))),
    ("advanced_pair", lambda x, i, j: x[i, j], lambda x, i, j: x[i, j],
     args_of(normal(X), ints((3,), 0, 3), ints((3,), 0, 4))),
    ("advanced_separated", lambda x, i, j: x[i, :, j], lambda x, i, j: x[i, :, j],
     args_of(normal((3, 2, 4)), ints((2,), 0, 3), ints((2,), 0, 4))),
    ("scalar_array_index", lambda x, i: x[i], lambda x, i: x[i], args_of(normal(X), ints((), 0, 3))),
    ("take", lambda x, i: jnp.take(x, i, axis=1), lambda x, i: np.take(x, i, axis=1),
     args_of(normal(X), ints((3,), 0, 4))),
    ("take_along_axis", lambda x, i: jnp.take_along_axis(x, i, axis=1), lambda x, i: np.take_along_axis(x, i, axis=1),
     args_of(normal(X), ints((3, 2), 0, 4))),
    ("at_set", lambda x, i, v: x.at[i].set(v), np_at("set"), args_of(normal(X), ints((), 0, 3), normal(V))),
    ("at_add", lambda x, i, v: x.at[i].add(v), np_at("add"), args_of(normal(X), ints((3,), 0, 3), normal((3, 4)))),
    ("at_multiply", lambda x, i, v: x.at[i].multiply(v), np_at("multiply"),
     args_of(normal(X), ints((2,), 0, 3), normal((2, 4)))),
    ("at_min", lambda x, i, v: x.at[i].min(v), np_at("minimum"), args_of(normal(X), ints((2,), 0, 3), normal(V))),
    ("at_max", lambda x, i, v: x.at[:, i].max(v), lambda x, i, v: np_at("maximum")(x.T, i, v).T,
     args_of(normal(X), ints((), 0, 4), normal((3,)))),
    # linear algebra
    ("matmul", jnp.matmul, np.matmul, args_of(normal(X), normal(M))),
    ("matmul_vector", lambda a, b: a @ b, np.matmul, args_of(normal(V), normal(M))),
    ("dot_vdot_outer", lambda a, b: jnp.dot(a, b) + jnp.vdot(a, b) + jnp.outer(a, b).sum(),
     lambda a, b: np.dot(a, b) + np.vdot(a, b) + np.outer(a, b).sum(), args_of(normal(V), normal(V))),
    ("tensordot", lambda a, b: jnp.tensordot(a, b, axes=([1], [0])), lambda a, b: np.tensordot(a, b, axes=([1], [0])),
     args_of(normal(X), normal(M))),
    ("einsum", lambda a, b: jnp.einsum("ij,jk->ki", a, b), lambda a, b: np.einsum("ij,jk->ki", a, b),
     args_of(normal(X), normal(M))),
    ("einsum_trace_reduce", lambda a: jnp.einsum("ii->", a[:, :3]) + jnp.einsum("ij->j", a).sum(),
     lambda a: np.einsum("ii->", a[:, :3]) + np.einsum("ij->j", a).sum(), args_of(normal(X))),
    # nn
    ("relu_sigmoid", lambda x: nn.relu(x) + nn.sigmoid(x), lambda x: np.maximum(x, 0) + 1 / (1 + np.exp(-x)),
     args_of(normal(X))),
    ("gelu_silu_softplus", lambda x: nn.gelu(x) + nn.silu(x) + nn.softplus(x),
     lambda x: np_gelu(x) + x / (1 + np.exp(-x)) + np.log1p(np.exp(x)), args_of(normal(X))),
    ("nn_tanh", nn.tanh, np.tanh, args_of(normal(X))),
    ("softmax", nn.softmax, np_softmax, args_of(normal(X))),
    ("softmax_axis0", lambda x: nn.softmax(x, axis=0), lambda x: np_softmax(x, 0), args_of(normal(X))),
    ("log_softmax", nn.log_softmax, lambda x: np.log(np_softmax(x)), args_of(normal(X))),
    ("logsumexp", nn.logsumexp, np_logsumexp, args_of(normal(X))),
    ("logsumexp_axis", lambda x: nn.logsumexp(x, axis=1), lambda x: np_logsumexp(x, 1), args_of(normal(X))),
    ("one_hot", lambda i: nn.one_hot(i, 5), lambda i: np.eye(5, dtype="f4")[i], args_of(ints(V, 0, 5))),
    ("standardize", nn.standardize, lambda x: (x - x.mean(-1, keepdims=True)) / np.sqrt(x.var(-1, keepdims=True)
                                                                                           + 1e-5),
     args_of(normal(X))),
]


@pytest.mark.parametrize("pattern", ["all_axis0", "first_last_axis"])
@pytest.mark.parametrize("case", FUNCTIONS, ids=[c[0] for c in FUNCTIONS])
def test_numpy_function_under_vmap(case, pattern, device):
    name, fn, reference, make = case
    n_args = len(make(np.random.default_rng(0)))
    in_axes = [0] * n_args if pattern == "all_axis0" else [-1] + [None] * (n_args - 1)
    rng = np.random.default_rng(abs(hash(name)) % 2**32)
    check_vmap(fn, batch(make, in_axes, 3, rng), in_axes, 0, reference, rtol=1e-5, atol=1e-5)


def test_methods_and_operators_under_vmap(device):
    xs = np.random.default_rng(1).standard_normal((3, 2, 4)).astype(np.float32)
    f = lambda x: (x.sum(0) * 2 - x.mean(1).max() + x.T.reshape(-1)[:2].sum() / 3) ** 2  # noqa: E731
    check_vmap(f, [xs], [0])
    check_vmap(lambda x: x.at[0, 1:3].set(jnp.float32(7.0)).T, [xs], [1])
