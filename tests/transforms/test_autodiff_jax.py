"""JAX as the oracle: fnx.grad / jvp / vjp / jacrev / jacfwd / hessian equal jax's on the same float64 inputs for
~40 jnp functions, and on an MLP loss with dict parameters. Each case is written once against a numpy-like module
`m` (fnx.numpy or jax.numpy)."""
import pytest

jax = pytest.importorskip("jax")

import jax.numpy as jjnp  # noqa: E402
import numpy as np  # noqa: E402

import fnx  # noqa: E402
import fnx.numpy as jnp  # noqa: E402


pytestmark = pytest.mark.usefixtures("x64")  # fnx and JAX in float64


rng = np.random.default_rng(5)
X = rng.standard_normal((2, 3))
POS = rng.uniform(0.5, 2.0, (2, 3))
UNIT = rng.uniform(-0.8, 0.8, (2, 3))
AWAY = np.where(X < 0, X - 0.3, X + 0.3)
DISTINCT = rng.permutation(6).reshape(2, 3) / 3.0 - 1.0


def logsumexp(m, x):
    top = x.max(axis=-1, keepdims=True)
    return (top + m.log(m.sum(m.exp(x - top), axis=-1, keepdims=True)))[..., 0]


def softmax(m, x):
    e = m.exp(x - x.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


CASES = [
    ("sin", lambda m, x: m.sin(x), X),
    ("cos", lambda m, x: m.cos(x), X),
    ("tan", lambda m, x: m.tan(x), UNIT),
    ("exp", lambda m, x: m.exp(x), X),
    ("log", lambda m, x: m.log(x), POS),
    ("log1p", lambda m, x: m.log1p(x), POS),
    ("expm1", lambda m, x: m.expm1(x), X),
    ("sqrt", lambda m, x: m.sqrt(x), POS),
    ("tanh", lambda m, x: m.tanh(x), X),
    ("sinh", lambda m, x: m.sinh(x), X),
    ("cosh", lambda m, x: m.cosh(x), X),
    ("arcsin", lambda m, x: m.arcsin(x), UNIT),
    ("arccos", lambda m, x: m.arccos(x), UNIT),
    ("arctan", lambda m, x: m.arctan(x), X),
    ("arctan2", lambda m, x: m.arctan2(x, x[::-1] + 3.0), X),
    ("abs", lambda m, x: m.abs(x), AWAY),
    ("power", lambda m, x: m.power(x, x[::-1]), POS),
    ("integer_power", lambda m, x: x ** 3, X),
    ("divide", lambda m, x: m.sin(x) / (x * x + 1.0), X),
    ("maximum", lambda m, x: m.maximum(x, x[::-1]), DISTINCT),
    ("minimum", lambda m, x: m.minimum(x, 0.1), AWAY),
    ("where", lambda m, x: m.where(x > 0, m.exp(x), x * x), AWAY),
    ("clip", lambda m, x: m.clip(x, -0.5, 0.5), AWAY * 0.3),
    ("sum", lambda m, x: m.sum(x * x, axis=0), X),
    ("prod", lambda m, x: m.prod(x, axis=1), X),
    ("max", lambda m, x: m.max(x, axis=1), DISTINCT),
    ("min", lambda m, x: m.min(x), DISTINCT),
    ("var", lambda m, x: m.var(x, axis=1), X),
    ("std", lambda m, x: m.std(x), X),
    ("cumprod", lambda m, x: m.cumprod(x, axis=1), X),
    ("matmul", lambda m, x: x @ x.T, X),
    ("einsum", lambda m, x: m.einsum("ij,kj->ik", x, m.sin(x)), X),
    ("tensordot", lambda m, x: m.tensordot(x, m.cos(x), axes=([1], [1])), X),
    ("concatenate", lambda m, x: m.concatenate([x, x * x], axis=0), X),
    ("stack", lambda m, x: m.stack([x, m.sin(x)], axis=-1), X),
    ("pad", lambda m, x: m.pad(x * x, ((1, 1), (0, 2))), X),
    ("take", lambda m, x: m.take(x, np.array([2, 0, 2]), axis=1), X),
    ("advanced_index", lambda m, x: x[np.array([1, 0, 1]), np.array([2, 2, 0])] * x[:, 1:].sum(), X),
    ("at_add", lambda m, x: x.at[np.array([0, 0]), 1].add(x[1, :2] ** 2), X),
    ("at_set", lambda m, x: x.at[1, 1:].set(m.sin(x[0, :2])), X),
    ("logsumexp", logsumexp, X),
    ("softmax", softmax, X),
]
IDS = [c[0] for c in CASES]


def both(f):
    """(fnx version, jax version) of a case function."""
    return (lambda *a: f(jnp, *a)), (lambda *a: f(jjnp, *a))


def assert_close(actual, expected, rtol=1e-10, atol=1e-12):
    a, e = fnx.tree_util.tree_leaves(actual), jax.tree_util.tree_leaves(expected)
    assert len(a) == len(e)
    for x, y in zip(a, e):
        np.testing.assert_allclose(np.asarray(x), np.asarray(y), rtol=rtol, atol=atol)


SECOND_ORDER = {"sin", "tanh", "log", "arctan2", "power", "where", "prod", "max", "var", "cumprod", "matmul", "einsum",
                "take", "at_set", "logsumexp", "softmax"}


def jax_derivatives(theirs, second_order, x, tangent, cotangent):
    """JAX's derivatives of one case, compiled as one function (JAX's op-by-op mode is slow)."""
    total = lambda v: theirs(v).sum()  # noqa: E731
    out = {"grad": jax.grad(total)(x), "jvp": jax.jvp(theirs, (x,), (tangent,)),
           "vjp": jax.vjp(theirs, x)[1](cotangent)}
    if second_order:
        out.update(jacrev=jax.jacrev(theirs)(x), hessian=jax.hessian(total)(x))
    return out


@pytest.mark.parametrize("name,f,x", CASES, ids=IDS)
def test_derivatives_match_jax(name, f, x):
    ours, theirs = both(f)
    out_shape = jax.eval_shape(theirs, x).shape
    tangent = np.cos(np.arange(x.size)).reshape(x.shape)
    cotangent = np.sin(np.arange(int(np.prod(out_shape)))).reshape(out_shape)
    expected = jax.jit(jax_derivatives, static_argnums=(0, 1))(theirs, name in SECOND_ORDER, x, tangent, cotangent)
    assert_close(fnx.grad(lambda v: ours(v).sum())(x), expected["grad"])
    assert_close(fnx.jvp(ours, (x,), (tangent,)), expected["jvp"])
    assert_close(fnx.vjp(ours, x)[1](cotangent), expected["vjp"])
    if name in SECOND_ORDER:
        assert_close(fnx.jacrev(ours)(x), expected["jacrev"])
        assert_close(fnx.hessian(lambda v: ours(v).sum())(x), expected["hessian"], rtol=1e-9, atol=1e-10)


@pytest.mark.parametrize("name", ["tanh", "matmul", "softmax", "at_set"])
def test_jacfwd_matches_jax(name):
    _, f, x = CASES[IDS.index(name)]
    ours, theirs = both(f)
    assert_close(fnx.jacfwd(ours)(x), jax.jit(jax.jacfwd(theirs))(x))


def test_several_arguments_and_argnums_match_jax():
    f = lambda m, x, y: (m.sin(x) * m.exp(y)).sum() + (x @ y.T).prod()  # noqa: E731
    y = rng.standard_normal((2, 3))
    ours, theirs = both(f)
    for argnums in (0, 1, (0, 1), (1, 0), -1):
        assert_close(fnx.grad(ours, argnums=argnums)(X, y), jax.jit(jax.grad(theirs, argnums=argnums))(X, y))
    assert_close(fnx.jacrev(ours, argnums=(0, 1))(X, y), jax.jit(jax.jacrev(theirs, argnums=(0, 1)))(X, y))
    assert_close(fnx.hessian(ours, argnums=1)(X, y), jax.jit(jax.hessian(theirs, argnums=1))(X, y))


def mlp_loss(m, params, x, labels):
    h = m.tanh(x @ params["w1"] + params["b1"])
    logits = h @ params["w2"] + params["b2"]
    return -(labels * (logits - logsumexp(m, logits)[:, None])).sum() / x.shape[0]


def test_mlp_loss_with_dict_params_matches_jax():
    params = {"w1": rng.standard_normal((3, 8)) * 0.5, "b1": rng.standard_normal(8) * 0.1,
              "w2": rng.standard_normal((8, 4)) * 0.5, "b2": np.zeros(4)}
    x, labels = rng.standard_normal((5, 3)), np.eye(4)[[0, 3, 1, 1, 2]]
    ours, theirs = both(mlp_loss)
    value, grads = fnx.value_and_grad(ours)(params, x, labels)
    jax_value, jax_grads = jax.jit(jax.value_and_grad(theirs))(params, x, labels)
    assert set(grads) == set(params)
    np.testing.assert_allclose(float(value), float(jax_value), rtol=1e-12)
    assert_close(grads, jax_grads)
    assert_close(fnx.jit(fnx.grad(ours))(params, x, labels), jax_grads)
    assert_close(fnx.grad(ours, argnums=1)(params, x, labels),
                 jax.jit(jax.grad(theirs, argnums=1))(params, x, labels))
    b2_loss = lambda m: lambda b: mlp_loss(m, {**params, "b2": b}, x, labels)  # noqa: E731
    assert_close(fnx.hessian(b2_loss(jnp))(params["b2"]), jax.jit(jax.hessian(b2_loss(jjnp)))(params["b2"]),
                 rtol=1e-9, atol=1e-10)
