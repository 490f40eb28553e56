"""fnx.numpy.fft: discrete Fourier transforms, as jax.numpy.fft (numpy's names, arguments and normalizations).

A transform of length n along an axis is Cooley-Tukey over matrix products: n = n1 * n2 with n1 the largest
factor of n up to `DIRECT` (64), a transform of length n2 of every residue class (recursively), a twiddle
multiply, and a product with the n1 x n1 DFT matrix. A length up to DIRECT, or a prime, is one product with its
DFT matrix (so a large prime factor p costs O(n p)). The work stays on the real and imaginary parts as float
arrays (a real input has no imaginary products) and joins them once at the end, so the compiler sees matrix
products and elementwise work, and jit, vmap and grad follow from those (grad with JAX's complex convention,
docs/COMPLEX.md). The DFT matrices and twiddles are built in the graph from the exact angle (j k mod n), so they
live on whatever device the transform runs on.
"""
from __future__ import annotations

import enum
import math
import operator
import sys
from typing import Any, Sequence

import numpy as np

from fnx import dtypes
from fnx import lax as _lax
from fnx import numpy as jnp
from fnx.errors import at_user_line
from fnx.trace import Array, as_operand, imag_part, make_complex, real_part
from fnx.transforms.jit import jitted_op

__all__ = ["fft", "ifft", "rfft", "irfft", "hfft", "ihfft", "fft2", "ifft2", "rfft2", "irfft2", "fftn", "ifftn",
           "rfftn", "irfftn", "fftfreq", "rfftfreq", "fftshift", "ifftshift"]

DIRECT = 64  # transforms up to this length are one product with their DFT matrix


# ---- the transform along the last axis, on (real part, imaginary part or None) ----

def _roots(rows: int, cols: int, n: int, inverse: bool, dtype: dtypes.DType) -> tuple[Array, Array]:
    """cos and sin of -+2 pi j k / n for j < rows, k < cols: the DFT matrix (rows = cols = n) or the twiddles.
    Built in the graph from iotas, so they live wherever the transform runs; j k is reduced mod n to (-n/2, n/2]
    first, so the angle is at most pi and rounds once."""
    index = dtypes.int64 if (rows - 1) * (cols - 1) >= 2 ** 31 else dtypes.int32
    j = _lax.broadcasted_iota(index, (rows, cols), 0)
    k = _lax.broadcasted_iota(index, (rows, cols), 1)
    m = (j * k) % n
    m = jnp.where(2 * m > n, m - n, m)
    angle = m.astype(dtype) * ((2 if inverse else -2) * math.pi / n)
    return jnp.cos(angle), jnp.sin(angle)


def _split(n: int) -> int:
    """The outer factor n1 of a length that is not transformed directly: its largest factor up to DIRECT
    (1 for a prime)."""
    return next((d for d in range(min(DIRECT, n - 1), 1, -1) if n % d == 0), 1)


def _times(re: Array, im: Array | None, cr: Any, ci: Any, product) -> tuple[Array, Array]:
    """(re + i im) times (cr + i ci), each product taken with `product` (a matmul or an elementwise multiply)."""
    if im is None: return product(re, cr), product(re, ci)
    return product(re, cr) - product(im, ci), product(re, ci) + product(im, cr)


def _transform(re: Array, im: Array | None, inverse: bool) -> tuple[Array, Array]:
    """The unnormalized DFT (inverse: with e^{+2 pi i jk/n}) of re + i im along the last axis."""
    n, dtype = re.shape[-1], re.uop.dtype
    n1 = 1 if n <= DIRECT else _split(n)
    if n1 == 1: return _times(re, im, *_roots(n, n, n, inverse, dtype), jnp.matmul)
    n2, lead = n // n1, re.shape[:-1]
    # x[j1 + n1 j2] as [..., j1, j2]: transform each residue class j1 over j2 (length n2)
    classes = [None if p is None else jnp.swapaxes(p.reshape(lead + (n2, n1)), -1, -2) for p in (re, im)]
    yr, yi = _transform(classes[0], classes[1], inverse)
    yr, yi = _times(yr, yi, *_roots(n1, n2, n, inverse, dtype), operator.mul)
    # [..., k2, j1] times the n1-point DFT matrix gives [..., k2, k1], which is X[k2 + n2 k1]
    zr, zi = _times(jnp.swapaxes(yr, -1, -2), jnp.swapaxes(yi, -1, -2), *_roots(n1, n1, n1, inverse, dtype),
                    jnp.matmul)
    return (jnp.swapaxes(zr, -1, -2).reshape(lead + (n,)), jnp.swapaxes(zi, -1, -2).reshape(lead + (n,)))


# ---- arguments ----

def _operand(a: Any, name: str, real_input: bool = False) -> Array:
    x = as_operand(a, name)
    dt = x.uop.dtype
    if real_input:
        if dt.is_complex:
            raise TypeError(at_user_line(f"{name} requires real input, got {dt}; use fft for complex input"))
        return x.astype(dtypes.float64 if dt is dtypes.float64 else dtypes.float32)
    if dt.is_complex: return x
    return x.astype(dtypes.complex128 if dt is dtypes.float64 else dtypes.complex64)


def _norm_scale(norm: str | None, n: int, inverse: bool, name: str) -> float:
    if norm in (None, "backward"): return 1.0 / n if inverse else 1.0
    if norm == "ortho": return 1.0 / math.sqrt(n)
    if norm == "forward": return 1.0 if inverse else 1.0 / n
    raise ValueError(at_user_line(f"{name}: invalid norm {norm!r}: expected 'backward', 'ortho' or 'forward'"))


def _resized(x: Array, n: int | None, axis: int, name: str) -> Array:
    """`x` cut or zero-padded to length n along `axis` (numpy's `n` argument)."""
    if n is None: return x
    n = operator.index(n)
    if n < 1: raise ValueError(at_user_line(f"{name}: invalid number of data points ({n}) specified"))
    size = x.shape[axis]
    if n < size: return _lax.slice_in_dim(x, 0, n, axis=axis)
    if n > size:
        widths = [(0, 0)] * x.ndim
        widths[axis] = (0, n - size)
        return jnp.pad(x, widths)
    return x


def _axis(axis: int, ndim: int, name: str) -> int:
    if not -ndim <= axis < ndim:
        raise ValueError(at_user_line(f"{name}: axis {axis} is out of bounds for an array of rank {ndim}"))
    return axis % ndim


def _along(x: Array, axis: int, inverse: bool, scale: float, real_input: bool = False) -> Array:
    """The complex DFT of `x` along `axis`, scaled."""
    if x.shape[axis] < 1:
        raise ValueError(at_user_line(f"fft: invalid number of data points ({x.shape[axis]}) along axis {axis}"))
    moved = jnp.moveaxis(x, axis, -1)
    re, im = (moved, None) if real_input else (real_part(moved), imag_part(moved))
    out_re, out_im = _transform(re, im, inverse)
    if scale != 1.0: out_re, out_im = out_re * scale, out_im * scale
    return jnp.moveaxis(make_complex(out_re, out_im), -1, axis)


# ---- one-dimensional transforms ----

def _one_dimensional(name: str, inverse: bool, doc: str):
    def transform(a: Any, n: int | None = None, axis: int = -1, norm: str | None = None) -> Array:
        x = _operand(a, name)
        axis = _axis(axis, x.ndim, name)
        x = _resized(x, n, axis, name)
        return _along(x, axis, inverse, _norm_scale(norm, x.shape[axis], inverse, name))
    transform.__name__ = transform.__qualname__ = name
    transform.__doc__ = doc
    return jitted_op("n", "axis", "norm")(transform)


fft = _one_dimensional("fft", False, "The discrete Fourier transform along `axis` (length n: cut or zero-padded), "
                                     "as numpy.fft.fft.")
ifft = _one_dimensional("ifft", True, "The inverse discrete Fourier transform along `axis`, as numpy.fft.ifft.")


@jitted_op("n", "axis", "norm")
def rfft(a: Any, n: int | None = None, axis: int = -1, norm: str | None = None) -> Array:
    """The transform of a real input: its first n // 2 + 1 frequencies (the rest are their conjugates)."""
    x = _operand(a, "rfft", real_input=True)
    axis = _axis(axis, x.ndim, "rfft")
    x = _resized(x, n, axis, "rfft")
    size = x.shape[axis]
    full = _along(x, axis, False, _norm_scale(norm, size, False, "rfft"), real_input=True)
    return _lax.slice_in_dim(full, 0, size // 2 + 1, axis=axis)


@jitted_op("n", "axis", "norm")
def irfft(a: Any, n: int | None = None, axis: int = -1, norm: str | None = None) -> Array:
    """The inverse of rfft: a real signal of length n (default 2 (m - 1) for m input frequencies), the
    spectrum's upper half being the conjugates of its lower half."""
    x = _operand(a, "irfft")
    axis = _axis(axis, x.ndim, "irfft")
    n = 2 * (x.shape[axis] - 1) if n is None else operator.index(n)
    if n < 1: raise ValueError(at_user_line(f"irfft: invalid number of data points ({n}) specified"))
    half = _resized(x, n // 2 + 1, axis, "irfft")
    upper = jnp.flip(_lax.slice_in_dim(half, 1, n - n // 2, axis=axis), axis)  # X[n - k], k = n//2+1 .. n-1
    full = jnp.concatenate([half, jnp.conj(upper)], axis=axis)
    return jnp.real(_along(full, axis, True, _norm_scale(norm, n, True, "irfft")))


@jitted_op("n", "axis", "norm")
def hfft(a: Any, n: int | None = None, axis: int = -1, norm: str | None = None) -> Array:
    """The transform of a signal with Hermitian symmetry (given by its first half): a real spectrum."""
    x = _operand(a, "hfft")
    m = 2 * (x.shape[_axis(axis, x.ndim, "hfft")] - 1) if n is None else operator.index(n)
    inverse_norm = {None: "forward", "backward": "forward", "forward": "backward", "ortho": "ortho"}.get(norm, norm)
    return irfft(jnp.conj(x), m, axis, inverse_norm)


@jitted_op("n", "axis", "norm")
def ihfft(a: Any, n: int | None = None, axis: int = -1, norm: str | None = None) -> Array:
    """The inverse of hfft: the first half of the conjugate-symmetric spectrum of a real signal."""
    inverse_norm = {None: "forward", "backward": "forward", "forward": "backward", "ortho": "ortho"}.get(norm, norm)
    return jnp.conj(rfft(a, n, axis, inverse_norm))


# ---- n-dimensional transforms ----

def _axes_and_sizes(x: Array, s: Sequence[int] | None, axes: Sequence[int] | None, name: str,
                    default_last: int | None = None) -> tuple[list[int], list[int | None]]:
    if axes is None:
        count = len(s) if s is not None else (default_last if default_last is not None else x.ndim)
        axes = list(range(x.ndim - count, x.ndim))
    axes = [_axis(operator.index(a), x.ndim, name) for a in axes]
    if s is not None and len(s) != len(axes):
        raise ValueError(at_user_line(f"{name}: s and axes must have the same length, got {len(s)} and {len(axes)}"))
    return axes, (list(s) if s is not None else [None] * len(axes))


def _nd(name: str, inverse: bool):
    def transform(a: Any, s: Sequence[int] | None = None, axes: Sequence[int] | None = None,
                  norm: str | None = None) -> Array:
        x = _operand(a, name)
        axes_, sizes = _axes_and_sizes(x, s, axes, name)
        for axis, size in zip(axes_, sizes):
            x = _resized(x, size, axis, name)
            x = _along(x, axis, inverse, _norm_scale(norm, x.shape[axis], inverse, name))
        return x
    transform.__name__ = transform.__qualname__ = name
    transform.__doc__ = f"The {'inverse ' if inverse else ''}discrete Fourier transform over `axes` (default: all, " \
                        f"or the last len(s)), as numpy.fft.{name}."
    return jitted_op("s", "axes", "norm")(transform)


fftn, ifftn = _nd("fftn", False), _nd("ifftn", True)


@jitted_op("s", "axes", "norm")
def rfftn(a: Any, s: Sequence[int] | None = None, axes: Sequence[int] | None = None, norm: str | None = None) -> Array:
    """rfft over the last of `axes`, then fft over the others, as numpy.fft.rfftn."""
    x = _operand(a, "rfftn", real_input=True)
    axes_, sizes = _axes_and_sizes(x, s, axes, "rfftn")
    x = rfft(x, sizes[-1], axes_[-1], norm)
    return fftn(x, [x.shape[a] if n is None else n for a, n in zip(axes_[:-1], sizes[:-1])] or None, axes_[:-1],
                norm) if axes_[:-1] else x


@jitted_op("s", "axes", "norm")
def irfftn(a: Any, s: Sequence[int] | None = None, axes: Sequence[int] | None = None,
           norm: str | None = None) -> Array:
    """ifft over all but the last of `axes`, then irfft over the last, as numpy.fft.irfftn."""
    x = _operand(a, "irfftn")
    axes_, sizes = _axes_and_sizes(x, s, axes, "irfftn")
    if axes_[:-1]:
        x = ifftn(x, [x.shape[a] if n is None else n for a, n in zip(axes_[:-1], sizes[:-1])], axes_[:-1], norm)
    return irfft(x, sizes[-1], axes_[-1], norm)


@jitted_op("s", "axes", "norm")
def fft2(a: Any, s: Sequence[int] | None = None, axes: Sequence[int] = (-2, -1), norm: str | None = None) -> Array:
    """fftn over two axes (the last two by default)."""
    return fftn(a, s, axes, norm)


@jitted_op("s", "axes", "norm")
def ifft2(a: Any, s: Sequence[int] | None = None, axes: Sequence[int] = (-2, -1), norm: str | None = None) -> Array:
    """ifftn over two axes (the last two by default)."""
    return ifftn(a, s, axes, norm)


@jitted_op("s", "axes", "norm")
def rfft2(a: Any, s: Sequence[int] | None = None, axes: Sequence[int] = (-2, -1), norm: str | None = None) -> Array:
    """rfftn over two axes (the last two by default)."""
    return rfftn(a, s, axes, norm)


@jitted_op("s", "axes", "norm")
def irfft2(a: Any, s: Sequence[int] | None = None, axes: Sequence[int] = (-2, -1), norm: str | None = None) -> Array:
    """irfftn over two axes (the last two by default)."""
    return irfftn(a, s, axes, norm)


# ---- frequencies and shifts ----

def fftfreq(n: int, d: float = 1.0, *, dtype: Any = None, device: Any = None) -> Array:
    """The sample frequencies of an n-point transform with sample spacing d: [0, 1, ..., -1] / (d n)."""
    n = operator.index(n)
    k = np.concatenate([np.arange((n + 1) // 2), np.arange(-(n // 2), 0)])
    return _on(jnp.asarray(k / (d * n), dtype=dtype or dtypes.default_float().np), device)


def rfftfreq(n: int, d: float = 1.0, *, dtype: Any = None, device: Any = None) -> Array:
    """The sample frequencies of rfft's outputs: [0, 1, ..., n // 2] / (d n)."""
    n = operator.index(n)
    return _on(jnp.asarray(np.arange(n // 2 + 1) / (d * n), dtype=dtype or dtypes.default_float().np), device)


def _on(x: Array, device: Any) -> Array:
    if device is None: return x
    from fnx.devices import device_put
    return device_put(x, device)


def _shift(x: Any, axes: Any, name: str, sign: int) -> Array:
    a = as_operand(x, name)
    axes = tuple(range(a.ndim)) if axes is None else (axes,) if isinstance(axes, int) else tuple(axes)
    return jnp.roll(a, tuple(sign * (a.shape[ax] // 2) for ax in axes), axes)


def fftshift(x: Any, axes: Any = None) -> Array:
    """The zero frequency moved to the middle of `axes` (all by default)."""
    return _shift(x, axes, "fftshift", 1)


def ifftshift(x: Any, axes: Any = None) -> Array:
    """The inverse of fftshift."""
    return _shift(x, axes, "ifftshift", -1)


# ---- jax.lax.fft ----

class FftType(enum.IntEnum):
    """The kind of transform lax.fft computes (jax.lax.FftType)."""
    FFT = 0
    IFFT = 1
    RFFT = 2
    IRFFT = 3


def _lax_fft(x: Any, fft_type: FftType | str, fft_lengths: Sequence[int]) -> Array:
    """The transform `fft_type` over the last len(fft_lengths) axes: FFT / IFFT of a complex array, RFFT of a
    real one, IRFFT back to a real array whose last axis has length fft_lengths[-1] (jax.lax.fft)."""
    kind = FftType[fft_type.upper()] if isinstance(fft_type, str) else FftType(int(fft_type))
    lengths = [operator.index(n) for n in fft_lengths]
    a = as_operand(x, "lax.fft")
    axes = list(range(a.ndim - len(lengths), a.ndim))
    if kind is FftType.IRFFT: return irfftn(a, lengths, axes)
    if kind is not FftType.RFFT and any(a.shape[ax] != n for ax, n in zip(axes, lengths)):
        raise ValueError(at_user_line(f"lax.fft: fft_lengths {tuple(lengths)} must equal the last axes of "
                                      f"{a.shape}"))
    if kind is FftType.RFFT: return rfftn(a, lengths, axes)
    return fftn(a, None, axes) if kind is FftType.FFT else ifftn(a, None, axes)


_lax_fft.__name__ = _lax_fft.__qualname__ = "fft"


def __getattr__(name: str):
    from fnx.jax_names import missing
    raise missing("fnx.numpy.fft", name)


jnp._extend({"fft": sys.modules[__name__]})
_lax._extend({"fft": _lax_fft, "FftType": FftType})
