"""Keyword arguments of jax.numpy functions that JAX code passes: precision= / preferred_element_type= on the
products, nonzero/where(size=, fill_value=) under jit, var/std(correction=, where=), sum/prod(promote_integers=),
astype(copy=, device=). Values and dtypes against JAX (the oracle where JAX defines the semantics) and numpy."""
import numpy as np
import pytest

import fnx
import fnx.numpy as jnp

jax = pytest.importorskip("jax")
jjnp = pytest.importorskip("jax.numpy")

A = np.arange(6, dtype=np.int8).reshape(2, 3) - 2
B = np.arange(6, dtype=np.int8).reshape(3, 2) + 100  # int8 products overflow unless accumulated wider


@pytest.mark.parametrize("preferred", [None, np.int32, np.float32])
@pytest.mark.parametrize("name, args, kwargs", [
    ("matmul", (A, B), {}), ("dot", (A, B), {}), ("tensordot", (A, B), {"axes": 1}), ("inner", (A, A), {}),
    ("vdot", (A, A), {}), ("dot", (np.int8(3), A), {})])
def test_products_take_precision_and_preferred_element_type(device, name, args, kwargs, preferred):
    kwargs = dict(kwargs, precision="highest", preferred_element_type=preferred)
    want = getattr(jjnp, name)(*args, **kwargs)
    for got in (getattr(jnp, name)(*args, **kwargs), fnx.jit(lambda *a: getattr(jnp, name)(*a, **kwargs))(*args)):
        assert got.dtype == want.dtype, (name, got.dtype, want.dtype)
        np.testing.assert_array_equal(np.asarray(got), np.asarray(want))


def test_linalg_matmul_and_tensordot(device):
    x, y = np.random.default_rng(0).standard_normal((2, 3, 4)).astype(np.float32), np.ones((4, 2), np.float32)
    np.testing.assert_allclose(np.asarray(jnp.linalg.matmul(x, y)), x @ y, rtol=1e-6)
    np.testing.assert_allclose(np.asarray(jnp.linalg.tensordot(x, y, axes=1, precision="high")), x @ y, rtol=1e-6)


@pytest.mark.parametrize("kwargs", [{"size": 2}, {"size": 5}, {"size": 5, "fill_value": -1},
                                    {"size": 5, "fill_value": (7, 8)}, {"size": 0}])
def test_nonzero_and_where_with_size_under_jit(device, kwargs):
    x = np.array([[0, 3, 0], [4, 0, 5]], np.float32)
    want = jjnp.nonzero(x, **kwargs)
    for got in (jnp.nonzero(x, **kwargs), fnx.jit(lambda v: jnp.nonzero(v, **kwargs))(x),
                fnx.jit(lambda v: jnp.where(v != 0, **kwargs))(x)):
        assert len(got) == 2
        for g, w in zip(got, want):
            assert g.dtype == w.dtype
            np.testing.assert_array_equal(np.asarray(g), np.asarray(w))


def test_nonzero_size_errors():
    with pytest.raises(ValueError, match="0-d"):
        jnp.nonzero(jnp.ones(()), size=1)
    with pytest.raises(ValueError, match="one-argument form"):
        jnp.where(jnp.ones(2) > 0, 1.0, 2.0, size=2)


@pytest.mark.parametrize("name", ["var", "std"])
@pytest.mark.parametrize("kwargs", [{"correction": 1}, {"axis": 1, "where": "mask"},
                                    {"axis": 0, "where": "mask", "correction": 1, "keepdims": True},
                                    {"where": "mask", "ddof": 2}])
def test_var_std_correction_and_where(device, name, kwargs):
    rng = np.random.default_rng(1)
    x, mask = rng.standard_normal((4, 5)).astype(np.float32), rng.random((4, 5)) > 0.3
    kwargs = {k: (mask if v == "mask" else v) for k, v in kwargs.items()}
    want = getattr(jjnp, name)(x, **kwargs)
    # float64 reference from numpy's own where=/ddof (correction is ddof)
    ref = getattr(np, name)(x.astype(np.float64), **{("ddof" if k == "correction" else k): v for k, v in
                                                      kwargs.items()})
    for got in (getattr(jnp, name)(x, **kwargs), fnx.jit(lambda v: getattr(jnp, name)(v, **kwargs))(x)):
        assert got.dtype == want.dtype and got.shape == want.shape
        np.testing.assert_allclose(np.asarray(got), ref, rtol=2e-6, atol=1e-6)
    with pytest.raises(ValueError, match="ddof and correction"):
        getattr(jnp, name)(x, ddof=1, correction=1)


@pytest.mark.parametrize("name", ["sum", "prod"])
@pytest.mark.parametrize("dtype", [np.uint8, np.int8, np.int16, np.bool_])
def test_promote_integers_false_keeps_the_dtype(device, name, dtype):
    x = np.array([200, 100, 3], np.uint8).astype(dtype)
    for promote in (True, False):
        want = getattr(jjnp, name)(x, promote_integers=promote)
        got = getattr(jnp, name)(x, promote_integers=promote)
        assert got.dtype == want.dtype, (promote, got.dtype, want.dtype)
        np.testing.assert_array_equal(np.asarray(got), np.asarray(want))


def test_astype_copy_and_device():
    x = jnp.arange(4)
    y = x.astype(np.float32, copy=True, device=fnx.devices()[0])
    assert y.dtype == np.float32 and y.devices() == {fnx.devices()[0]}
    np.testing.assert_array_equal(np.asarray(jnp.astype(x, np.int8, copy=False)), np.arange(4, dtype=np.int8))
