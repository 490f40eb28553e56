"""fnx.numpy.fft and lax.fft: values against numpy's pocketfft in float64 (relative to the spectrum's size),
dtypes against JAX, gradients against JAX, on every device, under jit and vmap."""
import numpy as np
import pytest

import fnx
import fnx.numpy as jnp
from fnx import lax

jax = pytest.importorskip("jax")
J = jax.numpy

RNG = np.random.default_rng(0)
# lengths: tiny, direct (<= 64), composite (64 * n2, recursion), with a large prime factor (131 * 2), prime
LENGTHS = [1, 2, 3, 8, 17, 64, 100, 128, 262, 1024, 1031]


def _signal(shape, real=False):
    x = RNG.standard_normal(shape)
    return (x if real else x + 1j * RNG.standard_normal(shape)).astype(np.float32 if real else np.complex64)


def _near(got, want, tol=2e-6):
    """Error relative to the largest value (a float32 FFT's error grows with the spectrum, not per element)."""
    got, want = np.asarray(got), np.asarray(want)
    assert got.shape == want.shape, (got.shape, want.shape)
    scale = max(np.abs(want).max(), 1e-30)
    assert np.abs(got - want).max() <= tol * scale, np.abs(got - want).max() / scale


@pytest.mark.parametrize("n", LENGTHS)
def test_one_dimensional_transforms_match_numpy(n):
    x, r = _signal((3, n)), _signal((3, n), real=True)
    x64, r64 = x.astype(np.complex128), r.astype(np.float64)
    _near(jnp.fft.fft(x), np.fft.fft(x64))
    _near(jnp.fft.ifft(x), np.fft.ifft(x64))
    _near(jnp.fft.rfft(r), np.fft.rfft(r64))
    spectrum = np.fft.rfft(r64)
    _near(jnp.fft.irfft(spectrum.astype(np.complex64), n), np.fft.irfft(spectrum, n))
    assert np.asarray(jnp.fft.fft(x)).dtype == np.complex64 and np.asarray(jnp.fft.irfft(x, n)).dtype == np.float32


@pytest.mark.parametrize("norm", [None, "backward", "ortho", "forward"])
def test_norms_lengths_and_axes(norm):
    x, r = _signal((4, 6, 10)), _signal((4, 6, 10), real=True)
    x64, r64 = x.astype(np.complex128), r.astype(np.float64)
    _near(jnp.fft.fft(x, n=7, axis=1, norm=norm), np.fft.fft(x64, n=7, axis=1, norm=norm))
    _near(jnp.fft.ifft(x, n=13, axis=0, norm=norm), np.fft.ifft(x64, n=13, axis=0, norm=norm))
    _near(jnp.fft.rfft(r, n=9, norm=norm), np.fft.rfft(r64, n=9, norm=norm))
    _near(jnp.fft.irfft(x, n=11, axis=1, norm=norm), np.fft.irfft(x64, n=11, axis=1, norm=norm))
    _near(jnp.fft.hfft(x, norm=norm), np.fft.hfft(x64, norm=norm))
    _near(jnp.fft.ihfft(r, norm=norm), np.fft.ihfft(r64, norm=norm))
    _near(jnp.fft.fftn(x, norm=norm), np.fft.fftn(x64, norm=norm))
    _near(jnp.fft.ifftn(x, axes=(0, 2), norm=norm), np.fft.ifftn(x64, axes=(0, 2), norm=norm))
    _near(jnp.fft.fft2(x, s=(5, 12), norm=norm), np.fft.fft2(x64, s=(5, 12), norm=norm))
    _near(jnp.fft.ifft2(x, norm=norm), np.fft.ifft2(x64, norm=norm))
    _near(jnp.fft.rfftn(r, norm=norm), np.fft.rfftn(r64, norm=norm))
    _near(jnp.fft.rfft2(r, s=(5, 12), norm=norm), np.fft.rfft2(r64, s=(5, 12), norm=norm))
    _near(jnp.fft.irfftn(x, s=(4, 6, 9), norm=norm), np.fft.irfftn(x64, s=(4, 6, 9), norm=norm))
    _near(jnp.fft.irfft2(x, norm=norm), np.fft.irfft2(x64, norm=norm))


def test_round_trips_and_a_long_transform():
    x = _signal((1 << 16,))
    _near(jnp.fft.ifft(jnp.fft.fft(x)), x.astype(np.complex128))
    r = _signal((3, 500), real=True)
    _near(jnp.fft.irfft(jnp.fft.rfft(r), 500), r.astype(np.float64))
    _near(jnp.fft.fft(x), np.fft.fft(x.astype(np.complex128)), tol=3e-6)


def test_frequencies_and_shifts_match_numpy():
    for n in (1, 4, 5):
        np.testing.assert_allclose(np.asarray(jnp.fft.fftfreq(n, 0.1)), np.fft.fftfreq(n, 0.1), rtol=1e-6)
        np.testing.assert_allclose(np.asarray(jnp.fft.rfftfreq(n, 2.0)), np.fft.rfftfreq(n, 2.0), rtol=1e-6)
    a = np.arange(30).reshape(5, 6)
    for axes in (None, 0, (1,)):
        np.testing.assert_array_equal(np.asarray(jnp.fft.fftshift(a, axes)), np.fft.fftshift(a, axes))
        np.testing.assert_array_equal(np.asarray(jnp.fft.ifftshift(a, axes)), np.fft.ifftshift(a, axes))


def test_dtypes_match_jax():
    for dtype in (np.float32, np.float16, np.int32, np.complex64, np.bool_):
        x = np.ones(4, dtype)
        assert np.asarray(jnp.fft.fft(x)).dtype == np.asarray(J.fft.fft(x)).dtype
    assert np.asarray(jnp.fft.rfft(np.ones(4, np.int32))).dtype == np.asarray(J.fft.rfft(np.ones(4, np.int32))).dtype
    with fnx.enable_x64():
        x = _signal((2, 12)).astype(np.complex128)
        got = jnp.fft.fft(x)
        assert np.asarray(got).dtype == np.complex128
        _near(got, np.fft.fft(x), tol=1e-14)
        assert np.asarray(jnp.fft.rfft(x.real)).dtype == np.complex128


def test_every_device(device):
    x, r = _signal((2, 100)), _signal((2, 30), real=True)
    _near(jnp.fft.fft(x), np.fft.fft(x.astype(np.complex128)))
    _near(jnp.fft.irfft(jnp.fft.rfft(r), 30), r)


def test_jit_vmap_and_lax_fft():
    x, r = _signal((5, 24)), _signal((5, 24), real=True)
    _near(fnx.jit(fnx.vmap(jnp.fft.fft))(x), np.fft.fft(x.astype(np.complex128)))
    _near(fnx.vmap(jnp.fft.rfft, in_axes=1, out_axes=1)(r), np.fft.rfft(r.astype(np.float64), axis=0))
    _near(lax.fft(x, "FFT", (5, 24)), np.asarray(jax.lax.fft(x, jax.lax.FftType.FFT, (5, 24))))
    _near(lax.fft(x, lax.FftType.IFFT, (24,)), np.asarray(jax.lax.fft(x, jax.lax.FftType.IFFT, (24,))))
    _near(lax.fft(r, "RFFT", (24,)), np.asarray(jax.lax.fft(r, jax.lax.FftType.RFFT, (24,))))
    spectrum = np.fft.rfft(r).astype(np.complex64)
    _near(lax.fft(spectrum, "IRFFT", (24,)), np.asarray(jax.lax.fft(spectrum, jax.lax.FftType.IRFFT, (24,))))


LOSSES = {
    "power spectrum": lambda m: lambda x: m.sum(m.abs(m.fft.fft(x * m.arange(12.0))) ** 2 * m.arange(12.0)),
    "filter": lambda m: lambda r: m.sum(m.fft.irfft(m.fft.rfft(r) * m.arange(7.0), 12) ** 3),
    "2-d": lambda m: lambda x: m.real(m.sum(m.fft.ifft2(m.fft.fft2(x) * m.exp(1j * m.arange(12.0))) * m.conj(x))),
}


@pytest.mark.parametrize("name", LOSSES)
def test_gradients_match_jax(name):
    x = _signal((3, 12), real=(name == "filter"))
    want = np.asarray(jax.grad(LOSSES[name](J))(x))
    _near(fnx.grad(LOSSES[name](jnp))(x), want, tol=1e-5)
    _near(fnx.jit(fnx.grad(LOSSES[name](jnp)))(x), want, tol=1e-5)


def test_bad_arguments_are_clear_errors():
    with pytest.raises(ValueError, match="invalid number of data points"):
        jnp.fft.fft(np.ones(4), n=0)
    with pytest.raises(ValueError, match="norm"):
        jnp.fft.fft(np.ones(4), norm="sideways")
    with pytest.raises(ValueError, match="axis 2"):
        jnp.fft.fft(np.ones((2, 2)), axis=2)
    with pytest.raises(TypeError, match="real input"):
        jnp.fft.rfft(np.ones(4, np.complex64))
    with pytest.raises(ValueError, match="invalid number of data points"):
        jnp.fft.fft(np.ones((3, 0)))
