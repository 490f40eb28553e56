"""The remaining jax.numpy names: array-API aliases (acos, pow, ...), spacing, fabs, windows, poly / polydiv /
polyfit, vectorize, apply_along_axis / apply_over_axes, packbits / unpackbits, printing and files; against
jax.numpy and numpy, eagerly and under jit."""
import numpy as np
import pytest

import fnx
import fnx.numpy as jnp

jax = pytest.importorskip("jax")
J = jax.numpy

RNG = np.random.default_rng(17)


def _close(ours, theirs, tol=1e-6):
    ours, theirs = np.asarray(ours), np.asarray(theirs)
    assert ours.shape == theirs.shape, (ours.shape, theirs.shape)
    np.testing.assert_allclose(ours.astype(np.float64), theirs.astype(np.float64), rtol=tol, atol=tol)


def test_aliases_spacing_fabs_and_constants():
    x = np.array([0.5, -0.25, 1e-3, 0.0, -0.0, 3e-40], np.float32)
    for name in ("acos", "asin", "atan", "fabs", "spacing"):
        _close(getattr(jnp, name)(x), getattr(J, name)(x), 2e-7)
    _close(jnp.atan2(x, x[::-1] + 1), J.atan2(x, x[::-1] + 1), 2e-7)
    _close(jnp.pow(np.arange(4), 3), J.pow(np.arange(4), 3))
    assert jnp.fabs(np.array([-2, 3], np.int32)).dtype == np.float32 and jnp.euler_gamma == J.euler_gamma
    _close(fnx.jit(jnp.spacing)(x), np.spacing(x))


@pytest.mark.parametrize("m", [0, 1, 2, 7, 16])
def test_windows_match_jax(m):
    for name in ("hanning", "hamming", "blackman", "bartlett"):
        _close(getattr(jnp, name)(m), getattr(J, name)(m), 2e-6)  # (fnx: float64 rounded once; JAX: float32)
    _close(jnp.kaiser(m, 3.5), J.kaiser(m, 3.5), 1e-6)


def test_polynomials_match_jax():
    roots = np.array([1.0, -2.0, 0.5], np.float32)
    _close(jnp.poly(roots), J.poly(roots), 1e-6)
    symmetric = np.array([[2.0, 1.0], [1.0, 3.0]], np.float32)
    _close(jnp.poly(symmetric), J.poly(symmetric), 1e-5)
    for u, v in (([1.0, -6, 11, -6], [1.0, -1]), ([2.0, 3.0], [1.0, 0, 1]), ([4.0, 0, 2, 1], [2.0, 1])):
        u, v = np.array(u, np.float32), np.array(v, np.float32)
        for ours, theirs in zip(jnp.polydiv(u, v), J.polydiv(u, v)): _close(ours, theirs, 1e-5)
    x = np.linspace(-1, 1, 25).astype(np.float32)
    y = (2 * x ** 3 - x + 0.25 + 0.01 * RNG.standard_normal(25)).astype(np.float32)
    _close(jnp.polyfit(x, y, 3), J.polyfit(x, y, 3), 1e-4)
    _close(fnx.jit(lambda x, y: jnp.polyfit(x, y, 2, w=np.linspace(1, 2, 25)))(x, y),
           J.polyfit(x, y, 2, w=np.linspace(1, 2, 25)), 1e-4)


def test_vectorize_and_applies():
    f = lambda a, b: a * b + 1  # noqa: E731
    a, b = np.arange(3.0, dtype=np.float32), np.ones((2, 1), np.float32)
    _close(jnp.vectorize(f)(a, b), J.vectorize(f)(a, b))
    dot = lambda u, v: (u * v).sum()  # noqa: E731
    u, v = RNG.standard_normal((4, 5, 3)).astype(np.float32), RNG.standard_normal(3).astype(np.float32)
    _close(jnp.vectorize(dot, signature="(n),(n)->()")(u, v), J.vectorize(dot, signature="(n),(n)->()")(u, v), 1e-5)
    _close(fnx.jit(jnp.vectorize(dot, signature="(n),(n)->()"))(u, v), np.einsum("abn,n->ab", u, v), 1e-5)
    scaled = jnp.vectorize(lambda x, k: x * k, excluded={1})
    _close(scaled(np.arange(3.0), 2.0), np.arange(3.0) * 2)
    x = RNG.standard_normal((2, 3, 4)).astype(np.float32)
    for axis in (0, 1, 2, -1):
        flipped = np.apply_along_axis(lambda r: r[::-1] * 2, axis, x)
        _close(jnp.apply_along_axis(lambda r: r[::-1] * 2, axis, x), flipped)
        _close(jnp.apply_along_axis(lambda r: r.sum(), axis, x), np.apply_along_axis(lambda r: r.sum(), axis, x), 1e-5)
    _close(jnp.apply_over_axes(jnp.sum, x, [0, 2]), np.apply_over_axes(np.sum, x, [0, 2]), 1e-5)
    with pytest.raises(TypeError, match="signature"):
        jnp.vectorize(dot, signature="(n),(n)->()")(u)


@pytest.mark.parametrize("axis", [None, 0, 1])
@pytest.mark.parametrize("bitorder", ["big", "little"])
def test_packbits_and_unpackbits_match_numpy(axis, bitorder):
    bits = RNG.integers(0, 2, (3, 11)).astype(np.uint8)
    packed = np.packbits(bits, axis=axis, bitorder=bitorder)
    np.testing.assert_array_equal(np.asarray(jnp.packbits(bits, axis=axis, bitorder=bitorder)), packed)
    np.testing.assert_array_equal(np.asarray(jnp.packbits(bits.astype(bool), axis=axis, bitorder=bitorder)), packed)
    for count in (None, 5, -3):
        np.testing.assert_array_equal(np.asarray(jnp.unpackbits(packed, axis=axis, count=count, bitorder=bitorder)),
                                      np.unpackbits(packed, axis=axis, count=count, bitorder=bitorder))
    with pytest.raises(TypeError, match="unpackbits: needs uint8"):
        jnp.unpackbits(bits.astype(np.int32))


def test_printing_files_and_einsum_path(tmp_path):
    x = jnp.arange(6.0).reshape(2, 3)
    assert jnp.array_repr(x) == np.array_repr(np.arange(6.0, dtype=np.float32).reshape(2, 3))
    assert jnp.array_str(x) == np.array_str(np.asarray(x))
    with jnp.printoptions(precision=2):
        assert jnp.get_printoptions()["precision"] == 2
    jnp.save(tmp_path / "x.npy", x)
    loaded = jnp.load(tmp_path / "x.npy")
    assert isinstance(loaded, fnx.Array) and np.array_equal(np.asarray(loaded), np.asarray(x))
    jnp.savez(tmp_path / "both.npz", a=x, b=x * 2)
    np.testing.assert_array_equal(np.load(tmp_path / "both.npz")["b"], np.asarray(x) * 2)
    path, text = jnp.einsum_path("ij,jk,kl->il", np.ones((2, 3)), np.ones((3, 4)), np.ones((4, 5)))
    assert path == np.einsum_path("ij,jk,kl->il", np.ones((2, 3)), np.ones((3, 4)), np.ones((4, 5)))[0]
