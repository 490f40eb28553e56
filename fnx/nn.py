"""fnx.nn: jax.nn's activation functions, softmax family, one_hot and standardize, composed from fnx.numpy.

Every function is a `jitted_op`, as jax.nn's are jitted: outside a trace a call runs `jit` of the function, so a
second call on arrays of the same shapes traces and compiles nothing (axes, flags and dtypes are its static
arguments; arrays and Python numbers its dynamic ones, except a number that meets a 16-bit or integer input,
which runs op by op: see jitted_op's `promoted`); inside a trace it is traced in place. Each computes in
the input's float dtype, as jax.nn does. The initializers live in `fnx.initializers`, re-exported here as
`fnx.nn.initializers`.

    >>> import fnx.numpy as jnp, fnx.nn
    >>> fnx.nn.softmax(jnp.array([0.0, 1.0, 2.0]))
    Array([0.09003057, 0.24472848, 0.66524094], dtype=float32)
"""
from __future__ import annotations

import math
import operator
from typing import Any

import numpy as np

from fnx import dtypes, initializers
from fnx import lax
from fnx import numpy as jnp
from fnx.errors import at_user_line
from fnx.trace import Array
from fnx.transforms.jit import jitted_op
from fnx.transforms.custom import custom_jvp, pure  # JAX gives relu, relu6 and softplus their own derivatives

__all__ = ["celu", "dot_product_attention", "elu", "gelu", "glu", "hard_sigmoid", "hard_silu", "hard_swish",
           "hard_tanh", "identity", "initializers", "leaky_relu", "log1mexp", "log_sigmoid", "log_softmax",
           "logmeanexp", "logsumexp", "mish", "one_hot", "relu", "relu6", "selu", "sigmoid", "silu", "soft_sign",
           "softmax", "softplus", "sparse_plus", "sparse_sigmoid", "squareplus", "standardize", "swish", "tanh"]


def _as_float(x: Any) -> Array:
    """`x` as an Array of a float dtype (integers and bools promote as `x * 1.0` would)."""
    x = jnp.asarray(x)
    dtype = jnp.result_type(x, 1.0)
    return x if x.dtype == dtype else x.astype(dtype)


# ---- the error function (no erf in fnx.numpy or fnx.lax yet) ----

_SQRT_PI = math.sqrt(math.pi)
# Computed in float64, to the precision of the input's width: |x| below which erf's Taylor series is used (and its
# number of terms), the |x| from which the continued fraction is (and its depth; between the two, erfcx's series at
# 1 and its number of terms), the |x| past which erfc underflows to 0 (a cap that keeps x*x finite), and the grid
# that splits x so that x_hi**2 is exact.
_ERFC_SPLIT = {4: (1.0, 15, 1.0, 30, 0, 12.0, 64.0), 8: (0.5, 12, 1.5, 50, 24, 30.0, 4096.0)}


def _erfcx_taylor_at_1(terms: int) -> list[float]:
    """Taylor coefficients at 1 of erfcx(y) = e^(y^2) erfc(y), highest power first: erfcx' = 2y erfcx - 2/sqrt(pi)
    gives a_(n+1) = 2 (a_n + a_(n-1)) / (n + 1) (float64 suffices: the terms it loses precision on are tiny)."""
    a = [math.erfc(1.0) * math.e, 2 * math.erfc(1.0) * math.e - 2 / _SQRT_PI]
    for n in range(1, terms - 1): a.append(2 * (a[n] + a[n - 1]) / (n + 1))
    return a[:terms][::-1]


def _erf_taylor(terms: int) -> list[float]:
    """Taylor coefficients of erf(x) / x in z = x*x: 2/sqrt(pi) * (-1)**n / (n! (2n + 1)), highest power first."""
    return [2 / _SQRT_PI * (-1) ** n / (math.factorial(n) * (2 * n + 1)) for n in reversed(range(terms))]


def _exp_minus_square(x: Array, grid: float, square_scale: float) -> Array:
    """exp(-square_scale * x*x) without the error of rounding x*x: x = hi + lo with hi on a coarse grid, so hi*hi
    is exact (and so is its product with square_scale, a power of two)."""
    hi = jnp.floor(x * grid) / grid
    return jnp.exp(-square_scale * (hi * hi)) * jnp.exp(-square_scale * ((x - hi) * (x + hi)))


def _erfc(x: Array, scale: float = 1.0) -> Array:
    """The complementary error function 1 - erf(scale * x) (see _erfc_wide), in x's dtype."""
    return _erfc_wide(x, scale).astype(x.dtype)


def _erfc_wide(x: Array, scale: float = 1.0) -> Array:
    """1 - erf(scale * x) in float64, accurate to a few ulps of x's dtype (relative) also where it is tiny.
    scale * scale must be a power of two (gelu's -1/sqrt(2)): erfc(y) carries e^(-y^2), whose relative error is
    2 y^2 times that of y, so e^(-scale^2 x^2) is computed from x itself, never from the rounded y.

    |y| < cut: 1 - erf(y) from erf's Taylor series. From cf_from: erfc(|y|) = exp(-y^2) / sqrt(pi) * y / (y^2 + 1/2
    - 1*2/4 / (y^2 + 5/2 - 3*4/4 / (y^2 + 9/2 - ...))), the even part of Laplace's continued fraction, evaluated
    from a fixed depth. Between (float64 inputs): exp(-y^2) times erfcx's Taylor series at 1, where 1 - erf(y)
    would cancel up to 20-fold. Negative y use erfc(y) = 2 - erfc(-y). Narrower floats compute in float64 too: up
    to their cut 1 - erf(y) cancels five-fold, which float64 absorbs. NaN stays NaN.
    """
    cut, terms, cf_from, depth, mid_terms, cap, grid = _ERFC_SPLIT[8 if x.dtype.itemsize >= 8 else 4]
    x = x.astype(dtypes.float64)  # (fnx's DType: float64 also with x64 off)
    y = x * scale
    z = y * y
    coeffs = _erf_taylor(terms)
    acc = jnp.full_like(y, coeffs[0])
    for c in coeffs[1:]: acc = acc * z + c
    near_zero = 1 - y * acc
    a = jnp.clip(jnp.abs(y), cf_from, cap)
    a2 = a * a
    # the fraction t = a2 + 1/2 - 1*2/4 / (a2 + 5/2 - ...) as p / q, bottom up: multiplies and one division
    p, q = a2 + (0.5 + 2 * depth), jnp.ones_like(a2)
    for k in range(depth, 0, -1):
        p, q = (a2 + (0.5 + 2 * (k - 1))) * p - ((2 * k - 1) * k / 2) * q, p
    unscaled = jnp.clip(jnp.abs(x), cut / abs(scale), cap / abs(scale))
    square_scale = 2.0 ** round(math.log2(scale * scale))  # exact: (1/sqrt 2)**2 is 0.5000000000000001 in floats
    exp_factor = _exp_minus_square(unscaled, grid, square_scale)
    tail = exp_factor * (a * q / p) / _SQRT_PI
    if mid_terms:
        h = jnp.abs(y) - 1
        series = jnp.full_like(h, 0.0)
        for c in _erfcx_taylor_at_1(mid_terms): series = series * h + c
        tail = jnp.where(jnp.abs(y) < cf_from, exp_factor * series, tail)
    tail = jnp.where(jnp.abs(y) >= cap, 0.0, tail)  # (so that gelu(-inf) is -inf * 0 = NaN, as in JAX)
    far = jnp.where(y < 0, 2 - tail, tail)
    return jnp.where(jnp.abs(y) < cut, near_zero, jnp.where(jnp.isnan(y), y, far))


# ---- activations ----

def _with_tangent(fun, tangent):
    """`fun` of one array with JAX's custom derivative: the output tangent is `tangent(x, t)`."""
    wrapped = pure(custom_jvp(fun))

    @wrapped.defjvp
    def jvp(primals, tangents):
        (x,), (t,) = primals, tangents
        return wrapped(x), tangent(x, t)
    return wrapped


def _passes_where(keep):
    """A tangent rule passing the tangent where `keep(x)` and 0 elsewhere: relu's derivative is 0 at 0 in JAX, not
    the 0.5 that maximum's tie rule gives."""
    return lambda x, t: jnp.where(keep(x), t, jnp.zeros_like(t))


_relu = _with_tangent(lambda x: jnp.maximum(x, 0), _passes_where(lambda x: x > 0))
_relu6 = _with_tangent(lambda x: jnp.minimum(jnp.maximum(x, 0), 6), _passes_where(lambda x: (x > 0) & (x < 6)))
# softplus' derivative is sigmoid(x), also at 0 (the stable formula below has a maximum and an abs that tie there)
_softplus = _with_tangent(lambda x: jnp.maximum(x, 0) + jnp.log1p(jnp.exp(-jnp.abs(x))),
                          lambda x, t: t / (1 + jnp.exp(-x)))


@jitted_op()
def identity(x: Any) -> Array:
    """The identity activation: returns `x` as an Array.

    Args:
      x: input array.

    Returns:
      `x` unchanged.
    """
    return jnp.asarray(x)


@jitted_op()
def relu(x: Any) -> Array:
    """Rectified linear unit, max(x, 0) elementwise (NaN propagates).

    Args:
      x: input array.

    Returns:
      An array of the same shape and dtype as `x`.

    Example:
      >>> fnx.nn.relu(jnp.array([-2.0, 0.0, 3.0]))
      Array([0., 0., 3.], dtype=float32)

    Its derivative is 0 at 0, as in JAX.
    """
    return _relu(jnp.asarray(x))


@jitted_op()
def relu6(x: Any) -> Array:
    """ReLU capped at 6: min(max(x, 0), 6) elementwise.

    Args:
      x: input array.

    Returns:
      An array of the same shape and dtype as `x`.

    Example:
      >>> fnx.nn.relu6(jnp.array([-1.0, 3.0, 9.0]))
      Array([0., 3., 6.], dtype=float32)
    """
    return _relu6(jnp.asarray(x))


@jitted_op()
def sigmoid(x: Any) -> Array:
    """The logistic sigmoid 1 / (1 + exp(-x)) elementwise; exactly 0 and 1 at -inf and inf.

    Args:
      x: input array (integers promote to float32).

    Returns:
      An array of the same shape as `x`, with values in [0, 1].

    Example:
      >>> fnx.nn.sigmoid(jnp.array([0.0]))
      Array([0.5], dtype=float32)
    """
    x = _as_float(x)
    e = jnp.exp(-jnp.abs(x))  # in (0, 1]: never overflows, so far-negative x keep their tiny (subnormal) results
    s = 1 / (1 + e)
    return jnp.where(x < 0, e * s, s)


@jitted_op()
def softplus(x: Any) -> Array:
    """log(1 + exp(x)) elementwise, computed as max(x, 0) + log1p(exp(-|x|)) so large |x| neither overflow nor
    lose precision.

    Args:
      x: input array (integers promote to float32).

    Returns:
      An array of the same shape as `x`.

    Example:
      >>> fnx.nn.softplus(jnp.array([0.0, 1000.0]))
      Array([6.9314718e-01, 1.0000000e+03], dtype=float32)
    """
    return _softplus(_as_float(x))


@jitted_op()
def log_sigmoid(x: Any) -> Array:
    """log(sigmoid(x)) elementwise, computed as -softplus(-x) (stable for large |x|).

    Args:
      x: input array (integers promote to float32).

    Returns:
      An array of the same shape as `x`, with values <= 0.

    Example:
      >>> fnx.nn.log_sigmoid(jnp.array([-1000.0]))
      Array([-1000.], dtype=float32)
    """
    return -softplus(-_as_float(x))


@jitted_op()
def silu(x: Any) -> Array:
    """SiLU (swish): x * sigmoid(x) elementwise.

    Args:
      x: input array (integers promote to float32).

    Returns:
      An array of the same shape as `x`.

    Example:
      >>> fnx.nn.silu(jnp.array([0.0, 1.0]))
      Array([0.       , 0.7310586], dtype=float32)
    """
    x = _as_float(x)
    # x / (1 + e^-x) with e = e^-|x|: x e / (1 + e) for x < 0. Far out e is subnormal and would lose the bits of
    # the result, which is still normal: there one exp gives h = e^(x/2) instead, and x e = (x h) h.
    deep = x < (-700.0 if x.dtype == np.float64 else -80.0)
    v = jnp.exp(jnp.where(deep, 0.5 * x, -jnp.abs(x)))
    numerator = jnp.where(deep, (x * v) * v, jnp.where(x < 0, x * v, x))
    return numerator / (1 + jnp.where(deep, v * v, v))


swish = silu


@jitted_op()
def tanh(x: Any) -> Array:
    """Hyperbolic tangent elementwise (the same function as fnx.numpy.tanh).

    Args:
      x: input array.

    Returns:
      An array of the same shape as `x`, with values in [-1, 1].
    """
    return jnp.tanh(x)


@jitted_op("approximate")
def gelu(x: Any, approximate: bool = True) -> Array:
    """Gaussian error linear unit, x * Phi(x) with Phi the standard normal CDF.

    Args:
      x: input array (integers promote to float32).
      approximate: True (the default, like JAX) uses the tanh form
        0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))); False uses the exact x * erfc(-x / sqrt(2)) / 2.

    Returns:
      An array of the same shape as `x`.

    Example:
      >>> fnx.nn.gelu(jnp.array([1.0]), approximate=False)
      Array([0.8413447], dtype=float32)
    """
    x = _as_float(x)
    if approximate:
        return x * (0.5 * (1 + jnp.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * (x * x * x)))))
    # the product in float64: a narrower erfc would round into the subnormals first
    return (x.astype(dtypes.float64) * (_erfc_wide(x, -1 / math.sqrt(2)) * 0.5)).astype(x.dtype)


@jitted_op(promoted=("x", "alpha"))
def elu(x: Any, alpha: Any = 1.0) -> Array:
    """Exponential linear unit: x where x > 0, alpha * (exp(x) - 1) elsewhere.

    Args:
      x: input array.
      alpha: the scale of the negative part.

    Returns:
      An array of the same shape as `x`.

    Example:
      >>> fnx.nn.elu(jnp.array([-1.0, 2.0]))
      Array([-0.63212055,  2.        ], dtype=float32)
    """
    x = _as_float(x)
    positive = x > 0
    return jnp.where(positive, x, alpha * jnp.expm1(jnp.where(positive, 0, x)))


@jitted_op(promoted=("x", "alpha"))
def celu(x: Any, alpha: Any = 1.0) -> Array:
    """Continuously differentiable ELU: max(x, 0) + alpha * min(exp(x / alpha) - 1, 0).

    Args:
      x: input array.
      alpha: the scale of the negative part.

    Returns:
      An array of the same shape as `x`.
    """
    x = _as_float(x)
    return jnp.maximum(x, 0) + alpha * jnp.expm1(jnp.minimum(x, 0) / alpha)


@jitted_op()
def selu(x: Any) -> Array:
    """Scaled ELU: scale * elu(x, alpha) with the self-normalizing constants alpha = 1.67326..., scale = 1.05070...

    Args:
      x: input array.

    Returns:
      An array of the same shape as `x`.
    """
    return 1.0507009873554804934193349852946 * elu(x, 1.6732632423543772848170429916717)


@jitted_op(promoted=("x", "negative_slope"))
def leaky_relu(x: Any, negative_slope: Any = 1e-2) -> Array:
    """Leaky ReLU: x where x >= 0, negative_slope * x elsewhere.

    Args:
      x: input array.
      negative_slope: the slope for negative inputs.

    Returns:
      An array of the same shape as `x`.

    Example:
      >>> fnx.nn.leaky_relu(jnp.array([-2.0, 2.0]))
      Array([-0.02,  2.  ], dtype=float32)
    """
    x = jnp.asarray(x)
    return jnp.where(x >= 0, x, negative_slope * x)


@jitted_op()
def hard_tanh(x: Any) -> Array:
    """clip(x, -1, 1) elementwise.

    Args:
      x: input array.

    Returns:
      An array of the same shape as `x`.
    """
    x = jnp.asarray(x)
    return jnp.where(x > 1, 1, jnp.where(x < -1, -1, x))  # as jax.nn: the derivative at +-1 is 1


@jitted_op()
def hard_sigmoid(x: Any) -> Array:
    """relu6(x + 3) / 6, a piecewise-linear sigmoid.

    Args:
      x: input array.

    Returns:
      An array of the same shape as `x`, with values in [0, 1].
    """
    return relu6(_as_float(x) + 3.0) / 6.0


@jitted_op()
def hard_silu(x: Any) -> Array:
    """x * hard_sigmoid(x) (also called hard_swish).

    Args:
      x: input array.

    Returns:
      An array of the same shape as `x`.
    """
    x = _as_float(x)
    return x * hard_sigmoid(x)


hard_swish = hard_silu


@jitted_op()
def soft_sign(x: Any) -> Array:
    """x / (|x| + 1) elementwise.

    Args:
      x: input array.

    Returns:
      An array of the same shape as `x`, with values in (-1, 1).
    """
    x = _as_float(x)
    return x / (jnp.abs(x) + 1)


@jitted_op("axis")
def glu(x: Any, axis: int = -1) -> Array:
    """Gated linear unit: splits `x` in two halves along `axis` and returns first * sigmoid(second).

    Args:
      x: input array; its size along `axis` must be even.
      axis: the axis to split.

    Returns:
      An array with half the size of `x` along `axis`.
    """
    x = jnp.asarray(x)
    size = x.shape[axis]
    if size % 2:
        raise ValueError(at_user_line(f"glu: axis {axis} of an input of shape {x.shape} must have an even size"))
    first, second = jnp.split(x, 2, axis=axis)
    return first * sigmoid(second)


# ---- softmax family ----

def _masked_max(x: Array, axis: Any, where: Any) -> Array:
    """max over `axis` (kept as size-1 axes) ignoring masked-out elements, with the gradient stopped."""
    return lax.stop_gradient(jnp.max(x, axis=axis, keepdims=True, where=where, initial=-jnp.inf))


@jitted_op("axis")
def softmax(x: Any, axis: Any = -1, where: Any = None) -> Array:
    """exp(x) / sum(exp(x)) over `axis`, computed after subtracting the maximum so nothing overflows.

    Like JAX, entries that are -inf get probability 0, a row that is all -inf gives NaN, and elements masked out by
    `where` give 0.

    Args:
      x: input array.
      axis: the axis or axes to normalize over (None: all).
      where: optional boolean mask of the elements to include.

    Returns:
      An array of the same shape as `x` that sums to 1 over `axis`.

    Example:
      >>> fnx.nn.softmax(jnp.array([1.0, 1.0]))
      Array([0.5, 0.5], dtype=float32)
    """
    x = _as_float(x)
    unnormalized = jnp._exp_nonpositive(x - _masked_max(x, axis, where))
    if where is not None: unnormalized = jnp.where(where, unnormalized, 0)
    # one reciprocal per row and a multiply per element (a vector division costs ~10x a multiply)
    return unnormalized * lax.recip(jnp.sum(unnormalized, axis=axis, keepdims=True, where=where))


@jitted_op("axis")
def log_softmax(x: Any, axis: Any = -1, where: Any = None) -> Array:
    """x - logsumexp(x) over `axis`, computed after subtracting the (gradient-stopped) maximum.

    Args:
      x: input array.
      axis: the axis or axes to normalize over (None: all).
      where: optional boolean mask of the elements to include; masked-out elements give -inf.

    Returns:
      An array of the same shape as `x` whose exp sums to 1 over `axis`.

    Example:
      >>> fnx.nn.log_softmax(jnp.array([0.0, 0.0]))
      Array([-0.6931472, -0.6931472], dtype=float32)
    """
    x = _as_float(x)
    shifted = x - _masked_max(x, axis, where)
    total = jnp.sum(jnp._exp_nonpositive(shifted), axis=axis, keepdims=True, where=where)
    out = shifted - jnp.log(total)
    return out if where is None else jnp.where(where, out, -jnp.inf)


@jitted_op("axis", "keepdims", "return_sign", promoted=("a", "b"))
def logsumexp(a: Any, axis: Any = None, b: Any = None, keepdims: bool = False, return_sign: bool = False,
              where: Any = None) -> Array | tuple[Array, Array]:
    """log(sum(b * exp(a))) over `axis`, without overflow; a row that is all -inf gives -inf.

    Args:
      a: input array.
      axis: the axis or axes to reduce (None: all).
      b: optional weights, broadcast against `a`; may be negative.
      keepdims: keep the reduced axes with size 1.
      return_sign: also return the sign of the sum (then the first result is log|sum|).
      where: optional boolean mask of the elements to include.

    Returns:
      The log of the sum; with `return_sign`, a pair (log|sum|, sign). Without it, a negative sum gives NaN.

    Example:
      >>> fnx.nn.logsumexp(jnp.array([1000.0, 1000.0]))
      Array(1000.6931, dtype=float32)
    """
    a = _as_float(a)
    if b is not None: a, b = jnp.broadcast_arrays(a, b)
    peak = _masked_max(a, axis, where)
    peak = jnp.where(jnp.isfinite(peak), peak, 0)  # all -inf (or +inf) rows: shift by 0 instead of NaN
    terms = jnp.exp(a - peak)
    if b is not None: terms = terms * b
    total = jnp.sum(terms, axis=axis, keepdims=True, where=where)
    sign = jnp.sign(total)
    out = jnp.log(jnp.abs(total)) + peak
    if not keepdims:
        axes = tuple(range(a.ndim)) if axis is None else axis
        out, sign = jnp.squeeze(out, axes), jnp.squeeze(sign, axes)
    if return_sign: return out, sign
    return jnp.where(sign < 0, jnp.nan, out) if b is not None else out


@jitted_op("num_classes", "dtype", "axis")
def one_hot(x: Any, num_classes: int, *, dtype: Any = jnp.float32, axis: int = -1) -> Array:
    """One-hot encode integer labels: out[..., i, ...] = (x == i) for i in range(num_classes).

    Labels outside [0, num_classes) (negative ones included) encode as all zeros, like JAX.

    Args:
      x: array of labels.
      num_classes: the size of the new axis.
      dtype: the result's dtype (default float32).
      axis: where the new axis goes in the result.

    Returns:
      An array of shape x.shape with `num_classes` inserted at `axis`.

    Example:
      >>> fnx.nn.one_hot(jnp.array([0, 2, 5]), 3)
      Array([[1., 0., 0.],
             [0., 0., 1.],
             [0., 0., 0.]], dtype=float32)
    """
    x = jnp.asarray(x)
    try:
        num_classes = operator.index(num_classes)
    except TypeError:
        raise TypeError(at_user_line(f"one_hot: num_classes must be an integer, got {num_classes!r}")) from None
    out_ndim = x.ndim + 1
    if not -out_ndim <= axis < out_ndim:
        raise ValueError(at_user_line(f"one_hot: axis {axis} is out of bounds for a result of {out_ndim} dims"))
    axis %= out_ndim
    labels = jnp.expand_dims(x, axis)
    classes = lax.broadcasted_iota(jnp.int32, [num_classes if i == axis else 1 for i in range(out_ndim)], axis)
    return jnp.equal(labels, classes).astype(dtype)


@jitted_op("axis", "algorithm", promoted=("x", "mean", "variance", "epsilon"))
def standardize(x: Any, axis: Any = -1, mean: Any = None, variance: Any = None, epsilon: Any = 1e-5,
                where: Any = None, *, algorithm: str = "fast") -> Array:
    """(x - mean) / sqrt(variance + epsilon), with mean and variance over `axis` unless given.

    Args:
      x: input array.
      axis: the axis or axes to standardize over (None: all).
      mean: optional mean to use instead of x's.
      variance: optional variance to use instead of x's.
      epsilon: added to the variance.
      where: optional boolean mask of the elements that count towards the mean and variance.
      algorithm: how to compute the variance: "fast" (JAX's default) as mean(x^2) - mean^2, or "stable" as
        mean((x - mean)^2).

    Returns:
      An array of the same shape as `x`.

    Example:
      >>> fnx.nn.standardize(jnp.array([1.0, 3.0]))
      Array([-0.999995,  0.999995], dtype=float32)
    """
    if algorithm not in ("fast", "stable"):
        raise ValueError(at_user_line(f"standardize: algorithm must be 'fast' or 'stable', got {algorithm!r}"))
    x = _as_float(x)
    if mean is None: mean = jnp.mean(x, axis, keepdims=True, where=where)
    if variance is None:
        if algorithm == "fast":
            variance = jnp.mean(jnp.square(x), axis, keepdims=True, where=where) - jnp.square(mean)
        else:
            variance = jnp.mean(jnp.square(x - mean), axis, keepdims=True, where=where)
    return (x - mean) * jnp.rsqrt(variance + epsilon)


@jitted_op()
def mish(x: Any) -> Array:
    """Mish: x * tanh(softplus(x)) elementwise.

    Example:
      >>> fnx.nn.mish(jnp.array([0.0, 1.0]))
      Array([0.       , 0.8650984], dtype=float32)
    """
    x = _as_float(x)
    return x * jnp.tanh(softplus(x))


@jitted_op(promoted=("x", "b"))
def squareplus(x: Any, b: Any = 4) -> Array:
    """Squareplus: (x + sqrt(x^2 + b)) / 2, a smooth relu.

    Example:
      >>> fnx.nn.squareplus(jnp.array([0.0]))
      Array([1.], dtype=float32)
    """
    x = _as_float(x)
    return (x + jnp.sqrt(x * x + b)) / 2


@jitted_op()
def sparse_plus(x: Any) -> Array:
    """Sparse plus: 0 for x <= -1, (x + 1)^2 / 4 between -1 and 1, x from 1 on.

    Example:
      >>> fnx.nn.sparse_plus(jnp.array([-2.0, 0.0, 2.0]))
      Array([0.  , 0.25, 2.  ], dtype=float32)
    """
    x = _as_float(x)
    return jnp.where(x <= -1, 0.0, jnp.where(x >= 1, x, (x + 1) ** 2 / 4)).astype(x.dtype)


@jitted_op()
def sparse_sigmoid(x: Any) -> Array:
    """Sparse sigmoid, the derivative of sparse_plus: 0, then (x + 1) / 2 between -1 and 1, then 1.

    Example:
      >>> fnx.nn.sparse_sigmoid(jnp.array([-2.0, 0.0, 2.0]))
      Array([0. , 0.5, 1. ], dtype=float32)
    """
    x = _as_float(x)
    return jnp.clip((x + 1) / 2, 0, 1).astype(x.dtype)


@jitted_op()
def log1mexp(x: Any) -> Array:
    """log(1 - exp(-x)) for x > 0, accurate at both ends (log1p(-exp(-x)) above log 2, log(-expm1(-x)) below).

    Example:
      >>> fnx.nn.log1mexp(jnp.array([1e-6, 30.0]))
      Array([-1.3815511e+01, -9.3576230e-14], dtype=float32)
    """
    x = _as_float(x)
    return jnp.where(x > math.log(2), jnp.log1p(-jnp.exp(-x)), jnp.log(-jnp.expm1(-x)))


@jitted_op("axis", "keepdims")
def logmeanexp(x: Any, axis: Any = None, where: Any = None, keepdims: bool = False) -> Array:
    """log(mean(exp(x))) over `axis` without overflow: logsumexp less the log of the count (of `where`'s
    elements when given).

    Example:
      >>> fnx.nn.logmeanexp(jnp.array([1000.0, 1000.0]))
      Array(1000., dtype=float32)
    """
    x = _as_float(x)
    total = logsumexp(x, axis=axis, keepdims=keepdims, where=where)
    ones = jnp.ones(x.shape, x.dtype) if where is None else jnp.where(where, 1.0, 0.0).astype(x.dtype)
    return total - jnp.log(jnp.sum(ones, axis=axis, keepdims=keepdims))


@jitted_op("is_causal", "local_window_size", "implementation", promoted=("query", "scale"))
def dot_product_attention(query: Any, key: Any, value: Any, bias: Any = None, mask: Any = None, *,
                          scale: float | None = None, is_causal: bool = False, query_seq_lengths: Any = None,
                          key_value_seq_lengths: Any = None, local_window_size: Any = None,
                          implementation: str | None = None) -> Array:
    """Scaled dot-product attention, softmax(q k^T * scale + bias, masked) v, in JAX's layout.

    Args:
      query: [B, T, N, H] (or [T, N, H]): B batches, T query positions, N heads of size H.
      key, value: [B, S, K, H]; K divides N (grouped-query attention: each of K heads serves N // K query heads).
      bias: optional, broadcastable to the logits [B, N, T, S]; added after scaling.
      mask: optional boolean, broadcastable to [B, N, T, S]; False drops the pair.
      scale: the logits' scale (default 1 / sqrt(H)).
      is_causal: query t attends to keys s <= t only.
      query_seq_lengths, key_value_seq_lengths: optional int [B]: positions past them are dropped.
      local_window_size: int or (left, right): query t attends to keys in [t - left, t + right].
      implementation: None or 'xla' (the only one here: fnx's compiler fuses it; 'cudnn' is a ValueError).

    Returns:
      [B, T, N, H] (the query's shape), in the query's dtype; the softmax runs in float32 at least.

    Example:
      >>> q = jnp.ones((1, 2, 1, 4)); fnx.nn.dot_product_attention(q, q, q).shape
      (1, 2, 1, 4)
    """
    if implementation not in (None, "xla"):
        raise ValueError(f"dot_product_attention: implementation={implementation!r} is not available in fnx "
                         "(None or 'xla')")
    query, key, value = jnp.asarray(query), jnp.asarray(key), jnp.asarray(value)
    shapes = f"query {query.shape}, key {key.shape} and value {value.shape}"
    unbatched = query.ndim == 3
    if unbatched: query, key, value = query[None], key[None], value[None]
    if query.ndim != 4 or key.ndim != 4 or value.ndim != 4 or key.shape != value.shape or (
            query.shape[0], query.shape[3]) != (key.shape[0], key.shape[3]) or query.shape[2] % key.shape[2]:
        raise ValueError(f"dot_product_attention: {shapes} must be [B, T, N, H], [B, S, K, H], [B, S, K, H] (or "
                         "without B) with K dividing N")
    batch, t, heads, size = query.shape
    s, groups = key.shape[1], query.shape[2] // key.shape[2]
    if groups > 1: key, value = jnp.repeat(key, groups, axis=2), jnp.repeat(value, groups, axis=2)
    wide = jnp.promote_types(query.dtype, jnp.float32)
    q = jnp.transpose(query, (0, 2, 1, 3)).astype(wide)  # [B, N, T, H]
    k = jnp.transpose(key, (0, 2, 3, 1)).astype(wide)    # [B, N, H, S]
    logits = jnp.matmul(q, k) * (1 / math.sqrt(size) if scale is None else scale)
    if bias is not None: logits = logits + jnp.asarray(bias).astype(wide)
    keep = None
    rows, cols = lax.broadcasted_iota(jnp.int32, (t, s), 0), lax.broadcasted_iota(jnp.int32, (t, s), 1)

    def both(a, b): return b if a is None else a & b
    if mask is not None: keep = both(keep, jnp.asarray(mask, dtype=bool))
    if is_causal: keep = both(keep, cols <= rows)
    if local_window_size is not None:
        left, right = (local_window_size, local_window_size) if isinstance(local_window_size, int) \
            else local_window_size
        keep = both(keep, (cols >= rows - left) & (cols <= rows + right))
    valid = None  # (query rows past their length give 0, as in JAX)
    if query_seq_lengths is not None:
        valid = rows[None, None] < jnp.asarray(query_seq_lengths)[:, None, None, None]
        keep = both(keep, valid)
    if key_value_seq_lengths is not None:
        keep = both(keep, cols[None, None] < jnp.asarray(key_value_seq_lengths)[:, None, None, None])
    if keep is not None: logits = jnp.where(keep, logits, 0.7 * float(jnp.finfo(wide).min))
    weights = softmax(logits, axis=-1)
    out = jnp.matmul(weights, jnp.transpose(value, (0, 2, 1, 3)).astype(wide))  # [B, N, T, H]
    if valid is not None: out = jnp.where(valid[..., :1], out, 0)
    out = jnp.transpose(out, (0, 2, 1, 3)).astype(query.dtype)
    return out[0] if unbatched else out


def __getattr__(name: str):
    from fnx.jax_names import missing
    raise missing("fnx.nn", name)
