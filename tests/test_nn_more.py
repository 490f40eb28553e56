"""jax.nn's newer names (mish, squareplus, sparse_plus/sparse_sigmoid, log1mexp, logmeanexp, dot_product_attention)
against jax.nn, eager and under jit and vmap, with grads against jax.grad."""
import numpy as np
import pytest

import fnx
import fnx.numpy as jnp

jax = pytest.importorskip("jax")

RNG = np.random.default_rng(11)
POINTS = np.array([-30.0, -3.0, -1.0, -0.5, 0.0, 0.3, 1.0, 2.5, 40.0], np.float32)

ELEMENTWISE = ["mish", "squareplus", "sparse_plus", "sparse_sigmoid"]


@pytest.mark.parametrize("name", ELEMENTWISE + ["log1mexp"])
def test_elementwise_match_jax(name):
    x = np.abs(POINTS) + np.float32(1e-6) if name == "log1mexp" else POINTS
    ours, theirs = getattr(fnx.nn, name), getattr(jax.nn, name)
    want = np.asarray(theirs(x))
    np.testing.assert_allclose(np.asarray(ours(x)), want, rtol=2e-6, atol=1e-7)
    np.testing.assert_allclose(np.asarray(fnx.jit(ours)(x)), want, rtol=2e-6, atol=1e-7)
    np.testing.assert_allclose(np.asarray(fnx.vmap(ours)(x.reshape(3, 3))), want.reshape(3, 3), rtol=2e-6, atol=1e-7)
    inside = x[(np.abs(x) > 1e-3) & (np.abs(np.abs(x) - 1) > 1e-3)]  # (away from the kinks)
    grad = fnx.vmap(fnx.grad(ours))(inside)
    np.testing.assert_allclose(np.asarray(grad), np.asarray(jax.vmap(jax.grad(theirs))(inside)), rtol=1e-5,
                               atol=1e-6)


def test_elementwise_keep_16_bit_dtypes():
    x = POINTS.astype(np.float16)
    for name in ELEMENTWISE:
        out = getattr(fnx.nn, name)(x)
        assert out.dtype == jnp.float16
        np.testing.assert_allclose(np.asarray(out, np.float32), np.asarray(getattr(jax.nn, name)(x), np.float32),
                                   rtol=2e-3, atol=2e-3)


@pytest.mark.parametrize("axis,keepdims,where", [(None, False, None), (1, True, None), (0, False, "mask")])
def test_logmeanexp_matches_jax(axis, keepdims, where):
    x = RNG.standard_normal((4, 6)).astype(np.float32) * 30
    mask = RNG.random((4, 6)) > 0.3 if where else None
    want = jax.nn.logmeanexp(x, axis=axis, keepdims=keepdims, where=mask)
    got = fnx.nn.logmeanexp(x, axis=axis, keepdims=keepdims, where=mask)
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-6, atol=1e-5)


ATTENTION = {
    "plain": {},
    "causal": {"is_causal": True},
    "mask": {"mask": RNG.random((2, 1, 5, 7)) > 0.3},
    "bias_scale": {"bias": RNG.standard_normal((2, 4, 5, 7)).astype(np.float32), "scale": 0.1},
    "window": {"local_window_size": (1, 2)},
    "lengths": {"query_seq_lengths": np.array([5, 2], np.int32), "key_value_seq_lengths": np.array([3, 7], np.int32)},
    "masked_row": {"mask": np.arange(7)[None, None, None, :] < np.array([0, 7, 7, 7, 7])[None, None, :, None]},
}


@pytest.mark.parametrize("case", sorted(ATTENTION))
def test_dot_product_attention_matches_jax(case):
    q = RNG.standard_normal((2, 5, 4, 8)).astype(np.float32)
    k, v = RNG.standard_normal((2, 2, 7, 2, 8)).astype(np.float32)  # (grouped: 2 key heads for 4 query heads)
    kwargs = ATTENTION[case]
    if case in ("causal", "window"): k, v = k[:, :5], v[:, :5]
    want = np.asarray(jax.nn.dot_product_attention(q, k, v, **kwargs))
    np.testing.assert_allclose(np.asarray(fnx.nn.dot_product_attention(q, k, v, **kwargs)), want, rtol=1e-5,
                               atol=1e-6)
    jitted = fnx.jit(lambda q, k, v: fnx.nn.dot_product_attention(q, k, v, **kwargs))
    np.testing.assert_allclose(np.asarray(jitted(q, k, v)), want, rtol=1e-5, atol=1e-6)


def test_dot_product_attention_grad_unbatched_and_errors():
    q, k, v = RNG.standard_normal((3, 6, 2, 4)).astype(np.float32)

    def loss(nn):
        return lambda q, k, v: (nn.dot_product_attention(q, k, v, is_causal=True) ** 2).sum()
    ours = fnx.grad(loss(fnx.nn), argnums=(0, 1, 2))(q, k, v)
    theirs = jax.grad(loss(jax.nn), argnums=(0, 1, 2))(q, k, v)
    for a, b in zip(ours, theirs): np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-4, atol=1e-5)
    with pytest.raises(ValueError, match=r"query \(6, 2, 4\), key \(6, 3, 4\)"):
        fnx.nn.dot_product_attention(q, np.ones((6, 3, 4), np.float32), np.ones((6, 3, 4), np.float32))
    with pytest.raises(ValueError, match="implementation='cudnn'"):
        fnx.nn.dot_product_attention(q, k, v, implementation="cudnn")
