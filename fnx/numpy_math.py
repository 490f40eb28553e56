"""fnx.numpy's math room: the elementwise math, NaN-aware reductions, statistics, products, differences,
polynomials, convolution and binning functions of jax.numpy that fnx.numpy's core (fnx/numpy.py) does not define.

Every function is composed of fnx.lax and fnx.numpy functions, so it runs eagerly, under jit and vmap, and is
differentiable wherever its pieces are (a few carry JAX's explicit derivatives: logaddexp, sinc, cbrt). Nothing
here sorts: functions that need sorted data (median, percentile, unique, interp's `period`) are elsewhere or
raise UnsupportedError. Shapes that decide a result's shape (bincount's `length`, histogram's `bins`, polymul's
`trim_leading_zeros`) must be static; under jit a missing one raises ConcretizationError, as in JAX.
"""
from __future__ import annotations

import functools

import builtins
import math
import operator
from typing import Any, Callable, Sequence

import numpy as np

from fnx import dtypes, lax
from fnx.dtypes import DType
from fnx.errors import ConcretizationError, UnsupportedError, at_user_line
from fnx.numpy import (_abs, _as_bool, _broadcast, _concrete, _copysign, _dt, _float_bits, _float_math, _float_ufunc,
                       _full, _log, _reduce_axes, _signbit, _slice_axis, _sum_dtype, all, argmax, argmin, array,
                       concatenate, cumprod, cumsum, equal, exp, exp2, expand_dims, floor_divide, invert, isinf, isnan,
                       left_shift, linspace, log1p, matmul, max, maximum, mean, min, minimum, mod, moveaxis, power,
                       prod, ravel, reshape, right_shift, sin, sqrt, stack, sum, transpose, where, zeros)
from fnx.trace import (Array, as_operand, broadcast_shapes, cast, check_operand, eager_op, elementwise, inexact_dtype,
                       normalize_axes, prepare, promote, shape_str, state, with_weak)

_PI = np.pi
_LN2 = 0.6931471805599453
_select = where  # (for the reductions whose `where` argument hides fnx.numpy.where)


def _inexact(x: Array) -> Array:
    """x cast to the float dtype an operation that needs floats computes in (keeping its weak type)."""
    return with_weak(cast(x, inexact_dtype(_dt(x))), x.weak_type)


def _promote_inexact(name: str, *xs: Any) -> tuple[list[Array], bool]:
    """The arguments converted and promoted to one float dtype, not broadcast."""
    arrays, weak = promote([as_operand(x, name) for x in xs], to_float=True)
    return [with_weak(a, weak) for a in arrays], weak


def _broadcast_all(name: str, *xs: Array) -> list[Array]:
    shape = broadcast_shapes(*[x.shape for x in xs], name=name)
    return [_broadcast(x, shape, name) for x in xs]


def _int_arg(value: Any, name: str, what: str) -> int:
    try:
        return operator.index(value)
    except TypeError:
        raise TypeError(at_user_line(f"{name}: {what} must be an integer, got {value!r}")) from None


# ---- elementwise math ----

def _replace_posinf(x: Array) -> Array:
    return where(x == np.inf, _full(x, 0.0), x)


def _logaddexp(x1: Array, x2: Array) -> Array:
    big = maximum(x1, x2)
    delta = x1 - x2
    return where(isnan(delta), x1 + x2, big + log1p(exp(lax.neg(_abs(delta)))))


def _logaddexp2(x1: Array, x2: Array) -> Array:
    big = maximum(x1, x2)
    delta = x1 - x2
    return where(isnan(delta), x1 + x2, big + log1p(exp2(lax.neg(_abs(delta)))) * (1 / _LN2))


# as in JAX, the derivative is e^(x_i - out) with +inf read as 0, so logaddexp(-inf, x) has slope 0 in x's partner
logaddexp = _float_ufunc("logaddexp", _logaddexp, "log(exp(x1) + exp(x2)) elementwise, without overflow.",
                         lambda x1, x2, y: (exp(_replace_posinf(x1) - _replace_posinf(y)),
                                            exp(_replace_posinf(x2) - _replace_posinf(y))))
logaddexp2 = _float_ufunc("logaddexp2", _logaddexp2, "log2(2**x1 + 2**x2) elementwise, without overflow.",
                          lambda x1, x2, y: (exp2(_replace_posinf(x1) - _replace_posinf(y)),
                                             exp2(_replace_posinf(x2) - _replace_posinf(y))))


def _hypot(x1: Array, x2: Array) -> Array:
    a, b = _abs(x1), _abs(x2)
    hi, lo = maximum(a, b), lax._order_reversed(maximum(lax._order_reversed(a), lax._order_reversed(b)))
    safe = where(hi == 0, _full(hi, 1.0), hi)
    ratio = lo / safe
    out = where(hi == 0, hi, hi * sqrt(1 + ratio * ratio))  # scaled by the larger: no overflow of x1**2
    return where(isinf(a) | isinf(b), _full(out, np.inf), out)


hypot = elementwise("hypot", _hypot, to_float=True, doc="sqrt(x1**2 + x2**2) elementwise, without overflow.")
copysign = elementwise("copysign", _copysign, to_float=True,
                       doc="|x1| with the sign bit of x2 elementwise (-0.0 and negative NaNs count as negative).")


def _sinc(x: Array) -> Array:
    t = x * _PI
    safe = where(x == 0, _full(x, 1.0), t)
    return where(x == 0, _full(x, 1.0), sin(safe) / safe)


def _cos_pi(x: Array) -> Array:
    return sin((x + 0.5) * _PI)


# d/dx sinc = (cos(pi x) - sinc x) / x, which is 0 at 0 and ~ -pi^2/3 x next to it: that form there keeps the second
# derivative at 0 right (-pi^2/3), as JAX's
sinc = _float_ufunc("sinc", _sinc, "sin(pi x) / (pi x) elementwise, 1 at x = 0.",
                    lambda x, y: (where(x == 0, x * (-_PI * _PI / 3), (_cos_pi(x) - y) / where(x == 0, _full(x, 1.0),
                                                                                                  x)),))
deg2rad = radians = elementwise("deg2rad", lambda x: x * (_PI / 180), to_float=True,
                                doc="Degrees to radians elementwise.")
rad2deg = degrees = elementwise("rad2deg", lambda x: x * (180 / _PI), to_float=True,
                                doc="Radians to degrees elementwise.")


def _cbrt(x: Array) -> Array:
    """The cube root of |x| from exp2(log2|x| / 3) in float64, one Newton step, x's sign put back."""
    dt = _dt(x)
    a = cast(_abs(x), dtypes.float64)
    safe = where((a == 0) | isinf(a), _full(a, 1.0), a)
    r = lax.exp2(lax.log2(safe) * (1 / 3))
    r = r - (r * r * r - safe) / (3 * r * r)
    r = where((a == 0) | isinf(a) | isnan(a), a, r)
    return cast(where(_signbit(x), lax.neg(cast(r, dt)), cast(r, dt)), dt)


cbrt = _float_ufunc("cbrt", _cbrt, "The real cube root elementwise.", lambda x, y: (1 / (3 * y * y),))


@eager_op
def float_power(x: Any, y: Any, /) -> Array:
    """x ** y elementwise, computed in floats (integers promote to the default float, as in JAX)."""
    (a, b), weak = prepare("float_power", x, y, to_float=True)
    return with_weak(power(a, b), weak)


def _nan_ignoring(pick_first: Callable) -> Callable:
    """fmax/fmin: x1 where it wins (or x2 is NaN), else x2; NaN only where both are NaN."""
    def compute(x1: Array, x2: Array) -> Array:
        take = pick_first(x1, x2)
        if _dt(x1).is_float: take = take | isnan(x2)
        return where(take, x1, x2)
    return compute


fmax = elementwise("fmax", _nan_ignoring(lambda a, b: a > b), doc="Elementwise maximum ignoring NaNs.")
fmin = elementwise("fmin", _nan_ignoring(lambda a, b: a < b), doc="Elementwise minimum ignoring NaNs.")


def _fmod(x1: Array, x2: Array) -> Array:
    if _dt(x1).is_float: return lax.rem(x1, x2)
    zero = x2 == 0
    return where(zero, _full(x1, 0), lax.rem(x1, where(zero, _full(x2, 1), x2)))  # (x % 0 is 0, as in JAX)


fmod = elementwise("fmod", _fmod, numeric=True, doc="C's fmod elementwise: the remainder has the sign of x1.")


@eager_op
def divmod(x1: Any, x2: Any, /) -> tuple[Array, Array]:  # noqa: A001
    """(floor_divide(x1, x2), mod(x1, x2))."""
    return floor_divide(x1, x2), mod(x1, x2)


@eager_op
def modf(x: Any, /, out: None = None) -> tuple[Array, Array]:
    """(fractional part, integral part) of x elementwise, both with x's sign; integers give floats."""
    (a,), weak = prepare("modf", x, to_float=True)
    whole = lax.trunc(a)
    return with_weak(a - whole, weak), with_weak(whole, weak)


_MANTISSA_BITS = {2: 10, 4: 23, 8: 52}


def _frexp_parts(a: Array) -> tuple[Array, Array]:
    """(mantissa in [0.5, 1) with a's sign, int32 exponent) for float32/float64 a; 0, inf and NaN give (a, 0)."""
    dt = _dt(a)
    mant_bits = _MANTISSA_BITS[dt.itemsize]
    bias = (1 << (8 * dt.itemsize - 2 - mant_bits)) - 1
    tiny = _abs(a) < dtypes.finfo(dt.np).tiny
    scaled = where(tiny, a * float(2 ** (mant_bits + 1)), a)  # subnormals: normal first, exponent fixed below
    bits, _ = _float_bits(scaled)
    exponent_field = lax.bitwise_and(lax.shift_right(bits, mant_bits), (1 << (8 * dt.itemsize - 1 - mant_bits)) - 1)
    exponent = cast(exponent_field, dtypes.int32) - (bias - 1) - where(tiny, _full(exponent_field, mant_bits + 1,
                                                                                    dtypes.int32),
                                                                       _full(exponent_field, 0, dtypes.int32))
    keep = ~(((1 << (8 * dt.itemsize - 1 - mant_bits)) - 1) << mant_bits)  # the sign and fraction bits
    mant_bits_value = lax.bitwise_or(lax.bitwise_and(bits, keep), (bias - 1) << mant_bits)
    mantissa = lax.bitcast_convert_type(mant_bits_value, dt)
    special = (a == 0) | isinf(a) | isnan(a)
    return where(special, a, mantissa), where(special, _full(exponent, 0), exponent)


@eager_op
def frexp(x: Any, /) -> tuple[Array, Array]:
    """(mantissa, exponent) with x = mantissa * 2**exponent, |mantissa| in [0.5, 1) and an int32 exponent; 0,
    inf and NaN give (x, 0)."""
    a = as_operand(x, "frexp")
    check_operand("frexp", a, not _dt(a).is_bool, "a numeric operand")
    a = cast(a, inexact_dtype(_dt(a)))
    dt = _dt(a)
    work = cast(a, dtypes.float32) if dt.itemsize < 4 else a
    mantissa, exponent = _frexp_parts(work)
    return cast(mantissa, dt), exponent


def _ldexp(x: Array, e: Array) -> Array:
    """x * 2**e rounded once: float32 and narrower scale in float64 (where every such product is exact); float64
    scales by three powers of two of e's sign, each in the normal range."""
    dt = _dt(x)
    e = cast(e, dtypes.int32)
    if dt.itemsize < 8:
        e = where(e > 400, _full(e, 400), where(e < -400, _full(e, -400), e))
        return cast(cast(x, dtypes.float64) * _pow2_f64(e), dt)
    e = where(e > 2200, _full(e, 2200), where(e < -2200, _full(e, -2200), e))
    first = lax.div(e, 3)
    second = lax.div(e - first, 2)
    return x * _pow2_f64(first) * _pow2_f64(second) * _pow2_f64(e - first - second)


def _pow2_f64(n: Array) -> Array:
    """2.0 ** n for int32 n in [-1022, 1023], built from the exponent bits."""
    bits = lax.shift_left(cast(n, dtypes.int64) + 1023, 52)
    return lax.bitcast_convert_type(bits, dtypes.float64)


@eager_op
def ldexp(x1: Any, x2: Any, /) -> Array:
    """x1 * 2**x2 elementwise for integer x2, exact but for the final rounding."""
    a, b = as_operand(x1, "ldexp"), as_operand(x2, "ldexp")
    if not _dt(b).is_int or _dt(a).is_bool:
        raise ValueError(at_user_line(f"ldexp: not supported for input types {shape_str(a, b)} (x2 must be "
                                      "integers)"))
    (a,), weak = prepare("ldexp", a, to_float=True)
    a, b = _broadcast_all("ldexp", a, b)
    return with_weak(_ldexp(a, b), weak)


def _nextafter(x: Array, y: Array) -> Array:
    dt = _dt(x)
    bits, _ = _float_bits(x)
    one = _full(bits, 1)
    away = (y > x) == (x > 0)  # moving away from zero: the magnitude's bits grow by one
    stepped = lax.bitcast_convert_type(where(away, bits + one, bits - one), dt)
    smallest = lax.bitcast_convert_type(one, dt)
    at_zero = where(y > 0, smallest, lax.neg(smallest))
    out = where(x == 0, at_zero, stepped)
    return where(x == y, y, where(isnan(x) | isnan(y), x + y, out))


nextafter = elementwise("nextafter", _nextafter, to_float=True,
                        doc="The next float after x1 towards x2 elementwise (exact, in x1's dtype).")


def _signbit_any(x: Array) -> Array:
    dt = _dt(x)
    if dt.is_float: return _signbit(x)
    if dt.is_bool or dt.is_unsigned: return _full(x, False, dtypes.bool_)
    return x < 0


signbit = elementwise("signbit", _signbit_any, doc="True where x is negative (its sign bit is set: -0.0 too).")


def _heaviside(x1: Array, x2: Array) -> Array:
    inner = where(x1 > 0, _full(x1, 1.0), where(isnan(x1), x1, x2))
    return where(x1 < 0, _full(x1, 0.0), inner)


heaviside = elementwise("heaviside", _heaviside, to_float=True,
                        doc="0 where x1 < 0, 1 where x1 > 0, x2 where x1 == 0 (NaN stays NaN).")


def _euclid_steps(dt: DType) -> int:
    """Enough Euclid steps for any pair of `dt` values (the worst case is consecutive Fibonacci numbers)."""
    return int(8 * dt.itemsize * 1.45) + 2


def _gcd(x1: Array, x2: Array) -> Array:
    def step(_, pair):
        a, b = pair
        zero = b == 0
        safe = where(zero, _full(b, 1), b)
        return where(zero, a, b), where(zero, b, lax.rem(a, safe))
    a, b = lax.fori_loop(0, _euclid_steps(_dt(x1)), step, (_abs(x1), _abs(x2)))
    # |MIN| wraps to MIN, so a pair with one walks through negative remainders (gcd(-127, -128) ended at -1): the
    # magnitude of the last one is the divisor; gcd(MIN, MIN or 0) stays MIN, as numpy's
    return _abs(a)


def _integer_ufunc(name: str, compute: Callable, doc: str) -> Callable:
    def checked(x1: Array, x2: Array) -> Array:
        if not _dt(x1).is_int:
            raise ValueError(at_user_line(f"{name}: arguments must be integers, got {shape_str(x1, x2)}"))
        return compute(x1, x2)
    return elementwise(name, checked, doc=doc)


def _lcm(x1: Array, x2: Array) -> Array:
    g = _gcd(x1, x2)
    safe = where(g == 0, _full(g, 1), g)
    return where(g == 0, _full(g, 0), lax.div(_abs(x1), safe) * _abs(x2))  # (wraps on overflow, as in JAX)


gcd = _integer_ufunc("gcd", _gcd, "Greatest common divisor of |x1| and |x2| elementwise (gcd(0, 0) = 0).")
lcm = _integer_ufunc("lcm", _lcm, "Least common multiple of |x1| and |x2| elementwise (0 if either is 0).")

bitwise_invert = invert
bitwise_left_shift = left_shift
bitwise_right_shift = right_shift


def _bitwise_count(x: Array) -> Array:
    dt = _dt(x)
    check_operand("bitwise_count", x, dt.is_int or dt.is_bool, "an integer or bool operand")
    if dt.is_bool: return cast(x, dtypes.uint8)
    magnitude = _abs(x)
    count = _full(x, 0)
    for bit in range(8 * dt.itemsize):
        count = count + lax.bitwise_and(lax.shift_right(magnitude, bit), _full(x, 1))
    return cast(count, dtypes.uint8)


bitwise_count = elementwise("bitwise_count", _bitwise_count, doc="The number of 1 bits of |x| elementwise (uint8).")
isposinf = elementwise("isposinf", lambda x: x == np.inf if _dt(x).is_float else _full(x, False, dtypes.bool_),
                       doc="True where x is +inf.")
isneginf = elementwise("isneginf", lambda x: x == -np.inf if _dt(x).is_float else _full(x, False, dtypes.bool_),
                       doc="True where x is -inf.")


@eager_op
def nan_to_num(x: Any, copy: bool = True, nan: Any = 0.0, posinf: Any = None, neginf: Any = None) -> Array:
    """x with NaN replaced by `nan`, +inf by `posinf` (default: the largest finite value) and -inf by `neginf`
    (default: the most negative finite value); integers and bools are returned unchanged."""
    a = as_operand(x, "nan_to_num")
    dt = _dt(a)
    if not dt.is_float: return a
    info = dtypes.finfo(dt.np)
    out = where(isnan(a), _full(a, 0.0) + cast(as_operand(nan), dt), a)
    out = where(out == np.inf, _full(a, 0.0) + cast(as_operand(float(info.max) if posinf is None else posinf), dt),
                out)
    out = where(out == -np.inf, _full(a, 0.0) + cast(as_operand(float(info.min) if neginf is None else neginf), dt),
                out)
    return with_weak(out, a.weak_type)


def _asinh(x: Array) -> Array:
    a = _abs(x)
    huge = a > 1e18  # a*a would overflow; asinh(a) = log(2a) to the last bit there
    safe = where(huge, _full(a, 1.0), a)
    small = log1p(safe + safe * safe / (1 + sqrt(1 + safe * safe)))
    r = where(huge, _log(where(huge, a, _full(a, 1.0))) + _LN2, small)
    return where(_signbit(x), lax.neg(r), r)


def _acosh(x: Array) -> Array:
    huge = x > 1e18
    safe = where(huge, _full(x, 2.0), x)
    t = safe - 1
    r = log1p(t + sqrt(t * (safe + 1)))
    r = where(x < 1, _full(x, np.nan), r)
    return where(huge, _log(where(huge, x, _full(x, 1.0))) + _LN2, r)


def _atanh(x: Array) -> Array:
    a = _abs(x)
    r = 0.5 * log1p(2 * a / (1 - a))
    return where(x == 0, x, where(_signbit(x), lax.neg(r), r))


arcsinh = asinh = _float_ufunc("arcsinh", _asinh, "Inverse hyperbolic sine elementwise.",
                               lambda x, y: (1 / sqrt(x * x + 1),))
arccosh = acosh = _float_ufunc("arccosh", _acosh, "Inverse hyperbolic cosine elementwise (NaN below 1).",
                               lambda x, y: (1 / sqrt((x - 1) * (x + 1)),))
arctanh = atanh = _float_ufunc("arctanh", _atanh, "Inverse hyperbolic tangent elementwise (NaN outside [-1, 1]).",
                               lambda x, y: (1 / ((1 - x) * (1 + x)),))


def _i0(x: Array) -> Array:
    """I0 in float64: its power series sum (x^2/4)^k / k!^2 below 15, its asymptotic series
    e^a / sqrt(2 pi a) * sum ((2k-1)!!)^2 / (k! (8a)^k) above (both to below float64's rounding)."""
    dt = _dt(x)
    a = cast(_abs(x), dtypes.float64)
    small_a = where(a < 15, a, _full(a, 0.0))
    z = small_a * small_a * 0.25
    series = _full(z, 0.0)
    for k in range(60, -1, -1): series = series * z + 1 / math.factorial(k) ** 2
    big_a = where(a < 15, _full(a, 15.0), a)
    inv = 1 / (8 * big_a)
    tail = _full(a, 0.0)
    coeffs = [1.0]
    for k in range(1, 30): coeffs.append(coeffs[-1] * (2 * k - 1) ** 2 / k)
    for c in reversed(coeffs): tail = tail * inv + c
    half = exp(big_a * 0.5)  # e^a as a square: finite up to where I0 itself overflows in float64
    asymptotic = half * (half / sqrt(2 * _PI * big_a)) * tail
    return cast(where(a < 15, series, asymptotic), dt)


i0 = elementwise("i0", _float_math(_i0), to_float=True, doc="The modified Bessel function of the first kind, order 0.")


# ---- comparisons of whole arrays ----

def _namespace_abs(x: Array) -> Array:
    import fnx.numpy as namespace  # (abs with its complex form: the elementwise function, not _abs)
    return namespace.abs(x)


@eager_op
def isclose(a: Any, b: Any, rtol: Any = 1e-05, atol: Any = 1e-08, equal_nan: bool = False) -> Array:
    """|a - b| <= atol + rtol * |b| elementwise for floats (infinities equal only to themselves; NaNs equal each
    other with `equal_nan`); integers and bools compare exactly, as in JAX."""
    (x, y), _ = prepare("isclose", a, b)
    if not _dt(x).is_inexact: return equal(x, y)
    dt = _dt(x).component  # (complex values: the moduli compare)
    rtol, atol = cast(as_operand(rtol, "isclose"), dt), cast(as_operand(atol, "isclose"), dt)
    close = _namespace_abs(x - y) <= atol + rtol * _namespace_abs(y)
    out = where(isinf(x) | isinf(y), x == y, close)
    if equal_nan: out = out | (isnan(x) & isnan(y))
    return out


@eager_op
def allclose(a: Any, b: Any, rtol: Any = 1e-05, atol: Any = 1e-08, equal_nan: bool = False) -> Array:
    """Whether isclose holds for every element (a 0-d bool Array)."""
    return all(isclose(a, b, rtol, atol, equal_nan))


@eager_op
def array_equal(a1: Any, a2: Any, equal_nan: bool = False) -> Array:
    """Whether a1 and a2 have the same shape and elements (a 0-d bool Array; NaNs equal with `equal_nan`)."""
    x, y = as_operand(a1, "array_equal"), as_operand(a2, "array_equal")
    if x.shape != y.shape: return array(False)
    (x, y), _ = prepare("array_equal", x, y)
    same = x == y
    if equal_nan and _dt(x).is_float: same = same | (isnan(x) & isnan(y))
    return all(same)


@eager_op
def array_equiv(a1: Any, a2: Any) -> Array:
    """Whether a1 and a2 are equal after broadcasting (TypeError, as in JAX, when they do not broadcast)."""
    return all(equal(a1, a2))


# ---- NaN-aware reductions ----

def _nan_replaced(x: Array, value: float) -> Array:
    return where(isnan(x), _full(x, value), x) if _dt(x).is_inexact else x


@eager_op
def nansum(a: Any, axis: Any = None, dtype: Any = None, out: None = None, keepdims: bool = False,
           initial: Any = None, where: Any = None) -> Array:
    """sum, with NaNs counted as zero."""
    x = as_operand(a, "nansum")
    return sum(_nan_replaced(x, 0.0), axis=axis, dtype=dtype, keepdims=keepdims, initial=initial, where=where)


@eager_op
def nanprod(a: Any, axis: Any = None, dtype: Any = None, out: None = None, keepdims: bool = False,
            initial: Any = None, where: Any = None) -> Array:
    """prod, with NaNs counted as one."""
    x = as_operand(a, "nanprod")
    return prod(_nan_replaced(x, 1.0), axis=axis, dtype=dtype, keepdims=keepdims, initial=initial, where=where)


def _nan_extreme(name: str, reduce: Callable, fill: float) -> Callable:
    def fn(a: Any, axis: Any = None, out: None = None, keepdims: bool = False, initial: Any = None,
           where: Any = None) -> Array:
        x = as_operand(a, name)
        if not _dt(x).is_float:
            return reduce(x, axis=axis, keepdims=keepdims, initial=initial, where=where)
        best = reduce(_nan_replaced(x, fill), axis=axis, keepdims=keepdims, initial=initial, where=where)
        if initial is not None: return best  # (an all-NaN slice gives `initial`, as in JAX)
        every_nan = all(isnan(x), axis=axis, keepdims=keepdims)
        return _select(every_nan, _full(best, np.nan), best)
    fn.__name__ = fn.__qualname__ = name
    fn.__doc__ = (f"{reduce.__name__} ignoring NaNs (NaN where a slice is all NaN). Raises ValueError for an empty "
                  "reduction without `initial`.")
    return eager_op(fn)


nanmax = _nan_extreme("nanmax", max, -np.inf)
nanmin = _nan_extreme("nanmin", min, np.inf)


def _nan_arg(name: str, reduce: Callable, fill: float) -> Callable:
    def fn(a: Any, axis: int | None = None, out: None = None, keepdims: bool | None = None) -> Array:
        x = as_operand(a, name)
        keepdims = bool(keepdims)
        if not _dt(x).is_float: return reduce(x, axis=axis, keepdims=keepdims)
        index = reduce(_nan_replaced(x, fill), axis=axis, keepdims=keepdims)
        every_nan = all(isnan(x), axis=axis, keepdims=keepdims)
        return where(every_nan, _full(index, -1), index)
    fn.__name__ = fn.__qualname__ = name
    fn.__doc__ = f"{reduce.__name__} ignoring NaNs; -1 where a slice is all NaN."
    return eager_op(fn)


nanargmax = _nan_arg("nanargmax", argmax, -np.inf)
nanargmin = _nan_arg("nanargmin", argmin, np.inf)


def _nan_mask(x: Array, where_mask: Any) -> Array:
    """True where an element takes part in a NaN-aware mean (not NaN, and inside `where`)."""
    mask = ~isnan(x) if _dt(x).is_inexact else _full(x, True, dtypes.bool_)
    return mask if where_mask is None else mask & _broadcast(_as_bool(as_operand(where_mask)), x.shape)


@eager_op
def nanmean(a: Any, axis: Any = None, dtype: Any = None, out: None = None, keepdims: bool = False,
            where: Any = None) -> Array:
    """mean of the elements that are not NaN (NaN where there are none)."""
    x = as_operand(a, "nanmean")
    dt = dtypes.requested(dtype, "nanmean") if dtype is not None else inexact_dtype(_dt(x))
    work = dtypes.float32 if dt.itemsize < 4 else dt
    mask = _nan_mask(x, where)
    total = sum(_select(mask, cast(x, work), _full(x, 0.0, work)), axis=axis, keepdims=keepdims)
    count = sum(mask, axis=axis, dtype=work, keepdims=keepdims)
    return cast(total / count, dt)


@eager_op
def nanvar(a: Any, axis: Any = None, dtype: Any = None, out: None = None, ddof: int = 0, keepdims: bool = False,
           where: Any = None, mean: Any = None) -> Array:
    """var of the elements that are not NaN: sum(|x - mean|**2) / (count - ddof), NaN where count <= ddof."""
    x = as_operand(a, "nanvar")
    dt = dtypes.requested(dtype, "nanvar") if dtype is not None else inexact_dtype(_dt(x))
    work = dtypes.float32 if dt.itemsize < 4 else dt
    mask = _nan_mask(x, where)
    xw = cast(x, work)
    center = nanmean(xw, axis=axis, keepdims=True, where=where) if mean is None else cast(as_operand(mean), work)
    centered = _select(mask, xw - center, _full(xw, 0.0))
    count = sum(mask, axis=axis, dtype=work, keepdims=keepdims)
    divisor = count - ddof
    total = sum(centered * centered, axis=axis, keepdims=keepdims)
    return cast(_select(divisor > 0, total / _select(divisor > 0, divisor, _full(divisor, 1.0)),
                       _full(total, np.nan)), dt)


@eager_op
def nanstd(a: Any, axis: Any = None, dtype: Any = None, out: None = None, ddof: int = 0, keepdims: bool = False,
           where: Any = None, mean: Any = None) -> Array:
    """sqrt(nanvar)."""
    return sqrt(nanvar(a, axis=axis, dtype=dtype, ddof=ddof, keepdims=keepdims, where=where, mean=mean))


@eager_op
def nancumsum(a: Any, axis: int | None = None, dtype: Any = None, out: None = None) -> Array:
    """cumsum, with NaNs counted as zero."""
    return cumsum(_nan_replaced(as_operand(a, "nancumsum"), 0.0), axis=axis, dtype=dtype)


@eager_op
def nancumprod(a: Any, axis: int | None = None, dtype: Any = None, out: None = None) -> Array:
    """cumprod, with NaNs counted as one."""
    return cumprod(_nan_replaced(as_operand(a, "nancumprod"), 1.0), axis=axis, dtype=dtype)


def _cumulative(name: str, running: Callable, identity: int, widen: bool) -> Callable:
    def fn(x: Any, /, *, axis: int | None = None, dtype: Any = None, include_initial: bool = False) -> Array:
        arr = as_operand(x, name)
        if arr.ndim == 0: raise ValueError(at_user_line(f"{name}: needs an array of rank >= 1, got {shape_str(arr)}"))
        if axis is None:
            if arr.ndim != 1:
                raise ValueError(at_user_line(f"{name}: axis must be given for an array of rank {arr.ndim} "
                                              f"({shape_str(arr)})"))
            axis = 0
        axis = normalize_axes(axis, arr.ndim, name)[0]
        if widen and dtype is None and (_dt(arr).is_bool or (_dt(arr).is_int and _dt(arr).itemsize < 4)):
            dtype = _sum_dtype(_dt(arr))  # JAX widens sums, not products
        out = running(arr, axis=axis, dtype=dtype)
        if not include_initial: return out
        start = lax.full(out.shape[:axis] + (1,) + out.shape[axis + 1:], identity, _dt(out))
        return concatenate([start, out], axis=axis)
    fn.__name__ = fn.__qualname__ = name
    fn.__doc__ = (f"Running {name[11:]} along `axis` (which may be omitted only for 1-D input); with "
                  f"`include_initial`, starting with the identity {identity}.")
    return eager_op(fn)


cumulative_sum = _cumulative("cumulative_sum", cumsum, 0, True)
cumulative_prod = _cumulative("cumulative_prod", cumprod, 1, False)


# ---- statistics ----

@eager_op
def ptp(a: Any, axis: Any = None, out: None = None, keepdims: bool = False) -> Array:
    """max - min over `axis` (the peak-to-peak range), in a's dtype."""
    x = as_operand(a, "ptp")
    return max(x, axis=axis, keepdims=keepdims) - min(x, axis=axis, keepdims=keepdims)


@eager_op
def count_nonzero(a: Any, axis: Any = None, keepdims: bool = False) -> Array:
    """The number of nonzero (true) elements over `axis`, as int32."""
    return sum(_as_bool(as_operand(a, "count_nonzero")), axis=axis, keepdims=keepdims, dtype=dtypes.default_int())


@eager_op
def average(a: Any, axis: Any = None, weights: Any = None, returned: bool = False,
            keepdims: bool = False) -> Array | tuple[Array, Array]:
    """The (weighted) mean over `axis`. `weights` has a's shape, or is 1-D along an int `axis`. With `returned`,
    also the sum of the weights (broadcast to the result's shape)."""
    x = as_operand(a, "average")
    if weights is None:
        avg = mean(x, axis=axis, keepdims=keepdims)
        count = math.prod(x.shape[i] for i in _reduce_axes(x, axis, "average"))
        return (avg, lax.full(avg.shape, count, _dt(avg))) if returned else avg
    w = as_operand(weights, "average")
    (x, w), _ = _promote_inexact("average", x, w)
    if x.shape != w.shape:
        if axis is None:
            raise ValueError(at_user_line(f"average: axis must be specified when shapes of a and weights differ "
                                          f"({shape_str(x, w)})"))
        if isinstance(axis, (tuple, list)) or w.ndim != 1:
            raise ValueError(at_user_line(f"average: 1-D weights need one int axis, got {shape_str(x, w)} and "
                                          f"axis={axis}"))
        ax = normalize_axes(axis, x.ndim, "average")[0]
        if w.shape[0] != x.shape[ax]:
            raise ValueError(at_user_line(f"average: shape of weights must be consistent with shape of a along "
                                          f"axis {ax} ({shape_str(x, w)})"))
        w = _broadcast(reshape(w, (1,) * ax + w.shape + (1,) * (x.ndim - ax - 1)), x.shape)
    total_weight = sum(w, axis=axis, keepdims=keepdims)
    avg = sum(x * w, axis=axis, keepdims=keepdims) / total_weight
    return (avg, _broadcast(total_weight, avg.shape)) if returned else avg


def _observations(m: Any, rowvar: bool, name: str) -> Array:
    x = as_operand(m, name)
    if x.ndim > 2: raise ValueError(at_user_line(f"{name}: m has more than 2 dimensions ({shape_str(x)})"))
    x = reshape(x, (1, x.size)) if x.ndim < 2 else x
    return transpose(x) if not rowvar and x.shape[0] != 1 else x


@eager_op
def cov(m: Any, y: Any = None, rowvar: bool = True, bias: bool = False, ddof: int | None = None,
        fweights: Any = None, aweights: Any = None, dtype: Any = None) -> Array:
    """The covariance matrix of the variables in m's rows (columns when not `rowvar`), as numpy.cov: optional
    frequency (`fweights`) and reliability (`aweights`) weights; divisor N - ddof (ddof = 0 if `bias` else 1)."""
    x = _observations(m, rowvar, "cov")
    if y is not None: x = concatenate([x, _observations(y, rowvar, "cov")], axis=0)
    x = cast(x, dtypes.requested(dtype, "cov") if dtype is not None else inexact_dtype(_dt(x)))
    ddof = (0 if bias else 1) if ddof is None else _int_arg(ddof, "cov", "ddof")
    n = x.shape[1]
    w = None
    for name, weight in (("fweights", fweights), ("aweights", aweights)):
        if weight is None: continue
        wa = as_operand(weight, "cov")
        if wa.ndim != 1 or wa.shape[0] != n:
            raise ValueError(at_user_line(f"cov: {name} must be 1-D with one value per observation ({n}), got "
                                          f"{shape_str(wa)}"))
        if name == "fweights" and not (_dt(wa).is_int or _dt(wa).is_bool):
            raise TypeError(at_user_line(f"cov: fweights must be integers, got {shape_str(wa)}"))
        wa = cast(wa, _dt(x))
        w = wa if w is None else w * wa
    avg, w_sum = average(x, axis=1, weights=w, returned=True)
    w_sum = w_sum[0]
    if w is None: fact = _full(w_sum, n - ddof)
    elif ddof == 0: fact = w_sum
    elif aweights is None: fact = w_sum - ddof
    else: fact = w_sum - ddof * sum(w * cast(as_operand(aweights), _dt(x))) / w_sum
    fact = maximum(fact, 0)
    centered = x - avg[:, None]
    weighted = centered if w is None else centered * w
    return reshape(matmul(centered, transpose(weighted)) / fact, () if x.shape[0] == 1 else (x.shape[0],) * 2)


@eager_op
def corrcoef(x: Any, y: Any = None, rowvar: bool = True, dtype: Any = None) -> Array:
    """Pearson correlation coefficients: cov normalized by the standard deviations, clipped to [-1, 1]."""
    c = cov(x, y, rowvar, dtype=dtype)
    if c.ndim == 0: return c / c
    d = sqrt(_diagonal(c))
    return maximum(minimum(c / d[:, None] / d[None, :], 1.0), -1.0)


def _diagonal(c: Array) -> Array:
    n = c.shape[0]
    return reshape(c, (n * n,))[:: n + 1] if n else reshape(c, (0,))


# ---- products ----

@eager_op
def cross(a: Any, b: Any, axisa: int = -1, axisb: int = -1, axisc: int = -1, axis: int | None = None) -> Array:
    """The cross product of 2- or 3-vectors along `axisa` of a and `axisb` of b (`axis` sets all three); the
    other axes broadcast. Two 2-vectors give the scalar z-component."""
    (x, y), weak = promote([as_operand(a, "cross"), as_operand(b, "cross")])
    if axis is not None: axisa = axisb = axisc = axis
    if x.ndim == 0 or y.ndim == 0:
        raise ValueError(at_user_line(f"cross: operands must be at least 1-D, got {shape_str(x, y)}"))
    x = moveaxis(x, normalize_axes(axisa, x.ndim, "cross")[0], -1)
    y = moveaxis(y, normalize_axes(axisb, y.ndim, "cross")[0], -1)
    if x.shape[-1] not in (2, 3) or y.shape[-1] not in (2, 3):
        raise ValueError(at_user_line(f"cross: incompatible dimensions for cross product (dimension must be 2 or 3), "
                                      f"got {shape_str(x, y)}"))
    batch = broadcast_shapes(x.shape[:-1], y.shape[:-1])
    xs = [_broadcast(x[..., i], batch, "cross") for i in range(x.shape[-1])]
    ys = [_broadcast(y[..., i], batch, "cross") for i in range(y.shape[-1])]
    if len(xs) == 2 and len(ys) == 2: return with_weak(xs[0] * ys[1] - xs[1] * ys[0], weak)
    zero = _full(xs[0], 0)
    if len(xs) == 2: xs.append(zero)
    if len(ys) == 2: ys.append(zero)
    out = stack([xs[1] * ys[2] - xs[2] * ys[1], xs[2] * ys[0] - xs[0] * ys[2], xs[0] * ys[1] - xs[1] * ys[0]], -1)
    return with_weak(moveaxis(out, -1, normalize_axes(axisc, out.ndim, "cross")[0]), weak)


@eager_op
def kron(a: Any, b: Any) -> Array:
    """The Kronecker product: blocks a[i, j, ...] * b, in a's arrangement."""
    (x, y), weak = promote([as_operand(a, "kron"), as_operand(b, "kron")])
    nd = builtins.max(x.ndim, y.ndim)
    xs, ys = (1,) * (nd - x.ndim) + x.shape, (1,) * (nd - y.ndim) + y.shape
    x = reshape(x, tuple(v for s in xs for v in (s, 1)))
    y = reshape(y, tuple(v for s in ys for v in (1, s)))
    return with_weak(reshape(x * y, tuple(p * q for p, q in zip(xs, ys))), weak)


def _contract_last(x: Array, y: Array, name: str, preferred_element_type: Any = None) -> Array:
    """sum(x * y, axis=-1) as a dot_general over the broadcast leading axes (keeping dot's dtype rules)."""
    if x.shape[-1] != y.shape[-1]:
        raise ValueError(at_user_line(f"{name}: axes to contract must have equal size, got {shape_str(x, y)}"))
    batch = broadcast_shapes(x.shape[:-1], y.shape[:-1])
    x, y = _broadcast(x, batch + x.shape[-1:], name), _broadcast(y, batch + y.shape[-1:], name)
    dims = tuple(range(len(batch)))
    return lax.dot_general(x, y, (((len(batch),), (len(batch),)), (dims, dims)),
                           preferred_element_type=preferred_element_type)


@eager_op
def vecdot(x1: Any, x2: Any, /, *, axis: int = -1, precision: Any = None,
           preferred_element_type: Any = None) -> Array:
    """The dot product of vectors along `axis` (of each operand), the other axes broadcast."""
    (x, y), weak = promote([as_operand(x1, "vecdot"), as_operand(x2, "vecdot")])
    if x.ndim == 0 or y.ndim == 0:
        raise ValueError(at_user_line(f"vecdot: operands must be at least 1-D, got {shape_str(x, y)}"))
    x = moveaxis(x, normalize_axes(axis, x.ndim, "vecdot")[0], -1)
    y = moveaxis(y, normalize_axes(axis, y.ndim, "vecdot")[0], -1)
    return with_weak(_contract_last(x, y, "vecdot", preferred_element_type), weak)


@eager_op
def matvec(x1: Any, x2: Any, /) -> Array:
    """Matrix-vector products: x1 (..., m, n) times x2 (..., n) gives (..., m); leading axes broadcast."""
    (x, y), weak = promote([as_operand(x1, "matvec"), as_operand(x2, "matvec")])
    if x.ndim < 2 or y.ndim < 1:
        raise ValueError(at_user_line(f"matvec: needs a matrix and a vector, got {shape_str(x, y)}"))
    return with_weak(_contract_last(x, expand_dims(y, -2), "matvec"), weak)


@eager_op
def vecmat(x1: Any, x2: Any, /) -> Array:
    """Vector-matrix products: x1 (..., n) times x2 (..., n, m) gives (..., m); leading axes broadcast."""
    (x, y), weak = promote([as_operand(x1, "vecmat"), as_operand(x2, "vecmat")])
    if x.ndim < 1 or y.ndim < 2:
        raise ValueError(at_user_line(f"vecmat: needs a vector and a matrix, got {shape_str(x, y)}"))
    return with_weak(_contract_last(expand_dims(x, -2), moveaxis(y, -1, -2), "vecmat"), weak)


# ---- differences and integrals ----

def _edge(value: Any, x: Array, axis: int, name: str) -> Array:
    v = as_operand(value, name)
    if v.ndim == 0: return _broadcast(v, x.shape[:axis] + (1,) + x.shape[axis + 1:], name)
    return v


@eager_op
def diff(a: Any, n: int = 1, axis: int = -1, prepend: Any = None, append: Any = None) -> Array:
    """The n-th discrete difference along `axis` (out[i] = a[i + 1] - a[i], n times); bools give a[i+1] != a[i].
    `prepend`/`append` values (scalars broadcast) are joined to a first."""
    x = as_operand(a, "diff")
    n = _int_arg(n, "diff", "n")
    if n < 0: raise ValueError(at_user_line(f"diff: order must be non-negative, got n={n}"))
    if x.ndim == 0: raise ValueError(at_user_line(f"diff: needs an array of rank >= 1, got {shape_str(x)}"))
    axis = normalize_axes(axis, x.ndim, "diff")[0]
    if prepend is not None or append is not None:
        parts = ([_edge(prepend, x, axis, "diff")] if prepend is not None else []) + [x] + \
            ([_edge(append, x, axis, "diff")] if append is not None else [])
        x = concatenate(parts, axis=axis)
    for _ in range(n):
        length = x.shape[axis]
        if length == 0: break
        hi, lo = _slice_axis(x, 1, length, axis), _slice_axis(x, 0, length - 1, axis)
        x = hi != lo if _dt(x).is_bool else hi - lo
    return x


@eager_op
def ediff1d(ary: Any, to_end: Any = None, to_begin: Any = None) -> Array:
    """Differences of consecutive elements of the flattened array, with `to_begin` and `to_end` (flattened,
    cast to its dtype) joined around them."""
    d = diff(ravel(as_operand(ary, "ediff1d")))
    parts = [cast(ravel(as_operand(to_begin, "ediff1d")), _dt(d))] if to_begin is not None else []
    parts.append(d)
    if to_end is not None: parts.append(cast(ravel(as_operand(to_end, "ediff1d")), _dt(d)))
    return concatenate(parts) if len(parts) > 1 else d


def _along(v: Array, axis: int, ndim: int) -> Array:
    """A 1-D array shaped to broadcast along `axis` of a rank-`ndim` array."""
    return reshape(v, (1,) * axis + v.shape + (1,) * (ndim - axis - 1))


def _gradient_axis(f: Array, spacing: Array, axis: int) -> Array:
    n = f.shape[axis]
    if n < 2:
        raise ValueError(at_user_line(f"gradient: shape of array too small to calculate a numerical gradient, at "
                                      f"least 2 elements are required along axis {axis} ({shape_str(f)})"))
    part = lambda lo, hi: _slice_axis(f, lo, n + hi if hi <= 0 else hi, axis)  # noqa: E731
    if spacing.ndim == 0:
        first, last = (part(1, 2) - part(0, 1)) / spacing, (part(n - 1, 0) - part(n - 2, -1)) / spacing
        inner = (part(2, 0) - part(0, -2)) / (2 * spacing)
    else:
        if spacing.shape != (n,):
            raise ValueError(at_user_line(f"gradient: coordinates of shape {spacing.shape} do not match axis {axis} "
                                          f"of {shape_str(f)}"))
        dx = _along(diff(spacing), axis, f.ndim)
        d1, d2 = _slice_axis(dx, 0, n - 2, axis), _slice_axis(dx, 1, n - 1, axis)
        inner = (part(0, -2) * (-d2 / (d1 * (d1 + d2))) + part(1, -1) * ((d2 - d1) / (d1 * d2))
                 + part(2, 0) * (d1 / (d2 * (d1 + d2))))
        first = (part(1, 2) - part(0, 1)) / _slice_axis(dx, 0, 1, axis)
        last = (part(n - 1, 0) - part(n - 2, -1)) / _slice_axis(dx, n - 2, n - 1, axis)
    return concatenate([first, inner, last], axis=axis) if n > 2 else concatenate([first, last], axis=axis)


@eager_op
def gradient(f: Any, *varargs: Any, axis: Any = None, edge_order: int | None = None) -> Array | list[Array]:
    """The gradient of sampled values by central differences inside and one-sided ones at the edges, along each
    of `axis` (default all). `varargs`: one spacing for all axes, or one per axis (a scalar or the sample
    coordinates). One array for one axis, else a list."""
    if edge_order is not None:
        raise NotImplementedError(at_user_line("gradient: the 'edge_order' argument is not supported"))
    x = as_operand(f, "gradient")
    x = cast(x, inexact_dtype(_dt(x)))
    axes = tuple(range(x.ndim)) if axis is None else normalize_axes(axis, x.ndim, "gradient")
    if len(varargs) == 0: spacings = [1.0] * len(axes)
    elif len(varargs) == 1 and np.ndim(varargs[0]) == 0: spacings = list(varargs) * len(axes)
    elif len(varargs) == len(axes): spacings = list(varargs)
    else:
        raise TypeError(at_user_line(f"gradient: {len(varargs)} spacings for {len(axes)} axes"))
    outs = [_gradient_axis(x, cast(as_operand(s, "gradient"), _dt(x)), ax) for s, ax in zip(spacings, axes)]
    return outs[0] if len(outs) == 1 else outs


@eager_op
def trapezoid(y: Any, x: Any = None, dx: Any = 1.0, axis: int = -1) -> Array:
    """The integral of samples `y` along `axis` by the trapezoid rule, at coordinates `x` (1-D, or of y's
    shape) or with uniform spacing `dx`."""
    (ya, xa), _ = _promote_inexact("trapezoid", y, dx if x is None else x)
    step = xa
    if ya.ndim == 0: raise ValueError(at_user_line(f"trapezoid: y must be at least 1-D, got {shape_str(ya)}"))
    axis = normalize_axes(axis, ya.ndim, "trapezoid")[0]
    if x is not None and xa.ndim:
        step = _along(diff(xa), axis, ya.ndim) if xa.ndim == 1 else diff(xa, axis=axis)
    n = ya.shape[axis]
    pairs = _slice_axis(ya, 1, n, axis) + _slice_axis(ya, 0, builtins.max(n - 1, 0), axis)
    return sum(pairs * step, axis=axis) * 0.5


@eager_op
def unwrap(p: Any, discont: Any = None, axis: int = -1, period: Any = 2 * np.pi) -> Array:
    """p with jumps larger than `discont` (default period / 2) along `axis` changed by multiples of `period`."""
    (x,), _ = _promote_inexact("unwrap", p)
    axis = normalize_axes(axis, x.ndim, "unwrap")[0]
    n = x.shape[axis]
    if n < 2: return x
    half = as_operand(period, "unwrap") / 2
    limit = half if discont is None else maximum(as_operand(discont, "unwrap"), half)
    d = diff(x, axis=axis)
    wrapped = mod(d + half, period) - half
    wrapped = where((wrapped == -half) & (d > 0), half + 0 * wrapped, wrapped)
    correction = where(_abs(d) < limit, _full(d, 0.0), wrapped - d)
    return concatenate([_slice_axis(x, 0, 1, axis), _slice_axis(x, 1, n, axis) + cumsum(correction, axis=axis)],
                       axis=axis)


# ---- polynomials and convolution ----

def _poly_1d(p: Any, name: str) -> Array:
    x = as_operand(p, name)
    if x.ndim != 1: raise ValueError(at_user_line(f"{name}: needs 1-D coefficients, got {shape_str(x)}"))
    return x


@eager_op
def polyval(p: Any, x: Any, *, unroll: int = 16) -> Array:
    """The polynomial with coefficients p (highest power first) at x, by Horner's rule."""
    (c, v), weak = promote([as_operand(p, "polyval"), as_operand(x, "polyval")])
    if c.ndim == 0: raise ValueError(at_user_line(f"polyval: p must be at least 1-D, got {shape_str(c)}"))
    shape = broadcast_shapes(v.shape, c.shape[1:], name="polyval")
    y = _broadcast(_full(v, 0), shape, "polyval")
    for i in range(c.shape[0]): y = y * v + c[i]
    return with_weak(y, weak)


def _pad_front(x: Array, n: int) -> Array:
    return concatenate([lax.full((n - x.shape[0],), 0, _dt(x)), x]) if x.shape[0] < n else x


@eager_op
def polyadd(a1: Any, a2: Any) -> Array:
    """The sum of two polynomials (coefficients highest power first; the shorter is aligned at the end)."""
    (x, y), weak = promote([_poly_1d(a1, "polyadd"), _poly_1d(a2, "polyadd")])
    n = builtins.max(x.shape[0], y.shape[0])
    return with_weak(_pad_front(x, n) + _pad_front(y, n), weak)


@eager_op
def polysub(a1: Any, a2: Any) -> Array:
    """The difference of two polynomials (coefficients highest power first)."""
    (x, y), weak = promote([_poly_1d(a1, "polysub"), _poly_1d(a2, "polysub")])
    n = builtins.max(x.shape[0], y.shape[0])
    return with_weak(_pad_front(x, n) - _pad_front(y, n), weak)


def _trim_leading_zeros(x: Array, name: str) -> Array:
    values = _concrete(x, name)
    nonzero = np.flatnonzero(values)
    return x[int(nonzero[0]):] if nonzero.size else x[-1:]


@eager_op
def polymul(a1: Any, a2: Any, *, trim_leading_zeros: bool = False) -> Array:
    """The product of two polynomials (their coefficients' full convolution), in floats."""
    (x, y), weak = _promote_inexact("polymul", _poly_1d(a1, "polymul"), _poly_1d(a2, "polymul"))
    if trim_leading_zeros: x, y = _trim_leading_zeros(x, "polymul"), _trim_leading_zeros(y, "polymul")
    if x.shape[0] == 0: x = lax.full((1,), 0, _dt(x))
    if y.shape[0] == 0: y = lax.full((1,), 0, _dt(y))
    return with_weak(_correlate_full(x, lax.rev(y, (0,)), 0, x.shape[0] + y.shape[0] - 1), weak)


@eager_op
def polyder(p: Any, m: int = 1) -> Array:
    """The m-th derivative of a polynomial (coefficients highest power first), in floats."""
    (c,), weak = _promote_inexact("polyder", _poly_1d(p, "polyder"))
    m = _int_arg(m, "polyder", "m")
    if m < 0: raise ValueError(at_user_line(f"polyder: order of derivative must be non-negative, got m={m}"))
    for _ in range(m):
        n = c.shape[0]
        if n == 0: break
        c = c[:-1] * _powers_descending(n - 1, _dt(c))
    return with_weak(c, weak)


def _powers_descending(n: int, dt: DType) -> Array:
    return cast(lax.iota(dtypes.int32, n) * -1 + n, dt)


@eager_op
def polyint(p: Any, m: int = 1, k: Any = None) -> Array:
    """The m-th antiderivative of a polynomial (coefficients highest power first), in floats, with integration
    constants k (a scalar for all, or m values; default 0)."""
    (c,), weak = _promote_inexact("polyint", _poly_1d(p, "polyint"))
    m = _int_arg(m, "polyint", "m")
    if m < 0: raise ValueError(at_user_line(f"polyint: order of integral must be non-negative, got m={m}"))
    if m == 0: return c
    ks = cast(ravel(as_operand(0 if k is None else k, "polyint")), _dt(c))
    if ks.shape[0] == 1: ks = _broadcast(ks, (m,))
    if ks.shape[0] != m:
        raise ValueError(at_user_line(f"polyint: k must be a scalar or have m={m} values, got {shape_str(ks)}"))
    for i in range(m):
        n = c.shape[0]
        c = concatenate([c / _powers_descending(n, _dt(c)), ks[i:i + 1]])
    return with_weak(c, weak)


@eager_op
def vander(x: Any, N: int | None = None, increasing: bool = False) -> Array:
    """The Vandermonde matrix: column j is x ** (N - 1 - j) (x ** j when `increasing`), by repeated products."""
    v = as_operand(x, "vander")
    if v.ndim != 1: raise ValueError(at_user_line(f"vander: x must be a one-dimensional array, got {shape_str(v)}"))
    n = v.shape[0] if N is None else _int_arg(N, "vander", "N")
    if n < 0: raise ValueError(at_user_line(f"vander: N must be non-negative, got {n}"))
    cols, col = [], _full(v, 1)
    for _ in range(n):
        cols.append(col)
        col = col * v
    if not cols: return lax.full((v.shape[0], 0), 0, _dt(v))
    out = stack(cols if increasing else cols[::-1], axis=1)
    return with_weak(out, v.weak_type)


def _correlate_full(a: Array, v: Array, start: int, length: int, preferred_element_type: Any = None) -> Array:
    """Entries start .. start + length of the full correlation c[k] = sum_j a[k - (M - 1) + j] * v[j] (a is zero
    outside its range): a padded, its sliding windows gathered, then one matrix-vector product."""
    m = v.shape[0]
    padded = lax.pad(a, cast(as_operand(0), _dt(a)), [(m - 1, m - 1, 0)])
    index = np.arange(start, start + length, dtype=np.int32)[:, None] + np.arange(m, dtype=np.int32)[None, :]
    windows = lax.gather_axis(padded, lax.constant_array(index), 0) if length else lax.full((0, m), 0, _dt(a))
    return lax.dot_general(windows, v, (((1,), (0,)), ((), ())), preferred_element_type=preferred_element_type)


def _correlation(name: str, a: Any, v: Any, mode: str, flip: bool, preferred_element_type: Any) -> Array:
    (x, y), weak = _promote_inexact(name, a, v)
    if x.ndim != 1 or y.ndim != 1:
        raise ValueError(at_user_line(f"{name}: only 1-dimensional inputs are supported, got {shape_str(x, y)}"))
    if x.shape[0] == 0 or y.shape[0] == 0:
        raise ValueError(at_user_line(f"{name}: inputs cannot be empty, got {shape_str(x, y)}"))
    if flip:
        if y.shape[0] > x.shape[0]: x, y = y, x  # convolution commutes: slide the shorter one
        y = lax.rev(y, (0,))
    n, m = x.shape[0], y.shape[0]
    short = builtins.min(n, m)
    if mode == "full": start, length = 0, n + m - 1
    elif mode == "valid": start, length = short - 1, builtins.max(n, m) - short + 1
    elif mode == "same":
        # numpy centres the window; correlating a shorter a means sliding it the other way, which rounds up
        start = (short - 1) // 2 if n >= m else (short - 1) - (short - 1) // 2
        length = builtins.max(n, m)
    else:
        raise ValueError(at_user_line(f"{name}: mode must be 'full', 'same' or 'valid', got {mode!r}"))
    return with_weak(_correlate_full(x, y, start, length, preferred_element_type), weak)


@eager_op
def convolve(a: Any, v: Any, mode: str = "full", *, precision: Any = None,
             preferred_element_type: Any = None) -> Array:
    """The discrete linear convolution of 1-D a and v, mode 'full' (default), 'same' or 'valid'; in floats."""
    return _correlation("convolve", a, v, mode, True, preferred_element_type)


@eager_op
def correlate(a: Any, v: Any, mode: str = "valid", *, precision: Any = None,
              preferred_element_type: Any = None) -> Array:
    """The cross-correlation c[k] = sum_n a[n + k] * v[n] of 1-D a and v, mode 'valid' (default), 'same' or
    'full'; in floats."""
    return _correlation("correlate", a, v, mode, False, preferred_element_type)


@eager_op
def piecewise(x: Any, condlist: Any, funclist: Sequence[Any], *args: Any, **kw: Any) -> Array:
    """funclist[i] (a function of x, applied to all of x, or a constant) where condlist[i] holds, the last true
    condition winning; one extra function (or constant) is the default, else 0. The result has x's dtype."""
    arr = as_operand(x, "piecewise")
    conds = [_broadcast(_as_bool(as_operand(c, "piecewise")), arr.shape, "piecewise") for c in
             (condlist if isinstance(condlist, (list, tuple)) else
              ([condlist] if as_operand(condlist).ndim <= arr.ndim else list(condlist)))]
    funcs = list(funclist)
    if len(funcs) == len(conds) + 1: default, funcs = funcs[-1], funcs[:-1]
    elif len(funcs) == len(conds): default = 0
    else:
        raise ValueError(at_user_line(f"piecewise: with {len(conds)} condition(s), either {len(conds)} or "
                                      f"{len(conds) + 1} functions are needed, got {len(funcs)}"))

    def value(fn: Any) -> Array:
        out = fn(arr, *args, **kw) if callable(fn) else fn
        return _broadcast(cast(as_operand(out, "piecewise"), _dt(arr)), arr.shape, "piecewise")
    out = value(default)
    for cond, fn in zip(conds, funcs): out = where(cond, value(fn), out)
    return with_weak(out, arr.weak_type)


# ---- counting, binning and interpolation ----

@eager_op
def bincount(x: Any, weights: Any = None, minlength: int = 0, *, length: int | None = None,
             out_sharding: Any = None) -> Array:
    """Counts (or summed `weights`) of each value of the non-negative ints x, for values 0 .. length - 1
    (negative values count as 0, larger ones are dropped, as in JAX). `length` defaults to
    max(max(x) + 1, minlength), which needs concrete x (not under jit)."""
    v = as_operand(x, "bincount")
    if not (_dt(v).is_int or _dt(v).is_bool):
        raise TypeError(at_user_line(f"bincount: x must have an integer type, got {shape_str(v)}"))
    if v.ndim != 1: raise ValueError(at_user_line(f"bincount: only 1-dimensional input is supported, got "
                                                  f"{shape_str(v)}"))
    minlength = _int_arg(minlength, "bincount", "minlength")
    if minlength < 0: raise ValueError(at_user_line(f"bincount: minlength must be non-negative, got {minlength}"))
    if length is None:
        if state.tracing and not v.is_concrete:
            raise ConcretizationError(at_user_line(f"bincount: the output length depends on the values of a traced "
                                                   f"{shape_str(v)}; pass length= under jit"))
        values = np.asarray(v)
        length = builtins.max(minlength, int(values.max()) + 1 if values.size else 0)
    length = _int_arg(length, "bincount", "length")
    w = lax.full(v.shape, 1, dtypes.default_int()) if weights is None else as_operand(weights, "bincount")
    if weights is not None: w = _broadcast(w, v.shape, "bincount")
    index = cast(v, dtypes.int32)
    index = where(index < 0, _full(index, 0), index)
    return zeros(length, _dt(w)).at[index].add(w)


def _count_at_or_below(x: Array, edges: Array, strict: bool) -> Array:
    """For each element of x, the number of edges e with e <= x (e < x when `strict`); NaN counts past all."""
    below = ~(x[..., None] <= edges) if strict else ~(x[..., None] < edges)
    return sum(below, axis=-1, dtype=dtypes.int32)


@eager_op
def digitize(x: Any, bins: Any, right: bool = False, *, method: str | None = None) -> Array:
    """The index of the bin of each x for monotonic 1-D `bins` (increasing or decreasing), as numpy.digitize,
    by comparing with every edge (no sort)."""
    v, edges = as_operand(x, "digitize"), as_operand(bins, "digitize")
    if edges.ndim != 1: raise ValueError(at_user_line(f"digitize: bins must be 1-D, got {shape_str(edges)}"))
    n = edges.shape[0]
    if n == 0: return lax.full(v.shape, 0, dtypes.int32)
    (v, edges), _ = promote([v, edges])
    count = _count_at_or_below(v, edges, right)
    increasing = edges[-1] >= edges[0]
    return where(increasing, count, n - count)


def _bin_count(bins: Any, name: str) -> int | None:
    if isinstance(bins, Array) or np.ndim(bins) != 0: return None
    count = _int_arg(bins, name, "bins")
    if count < 1: raise ValueError(at_user_line(f"{name}: bins must be positive, got {count}"))
    return count


@eager_op
def histogram_bin_edges(a: Any, bins: Any = 10, range: Any = None, weights: Any = None) -> Array:  # noqa: A002
    """The edges of `bins` equal bins over `range` (default: a's min to max, widened by 1/2 each way when they are
    equal); array bins are returned as given."""
    x = as_operand(a, "histogram_bin_edges")
    count = _bin_count(bins, "histogram_bin_edges")
    if count is None: return as_operand(bins, "histogram_bin_edges")
    dt = inexact_dtype(_dt(x))
    if range is None:
        lo, hi = cast(min(x), dt), cast(max(x), dt)
    else:
        if np.shape(range) != (2,):
            raise ValueError(at_user_line(f"histogram_bin_edges: range must be (min, max), got {range!r}"))
        lo, hi = (cast(as_operand(r, "histogram_bin_edges"), dt) for r in range)
    same = lo == hi
    lo, hi = where(same, lo - 0.5, lo), where(same, hi + 0.5, hi)
    return linspace(lo, hi, count + 1, dtype=dt)


@eager_op
def histogram(a: Any, bins: Any = 10, range: Any = None, weights: Any = None,  # noqa: A002
              density: bool | None = None) -> tuple[Array, Array]:
    """(counts, bin edges) of a's values: bin i holds edges[i] <= v < edges[i + 1] (the last bin includes its
    right edge); values outside are not counted. `weights` sum instead of counting; `density` normalizes to a
    density."""
    x = ravel(as_operand(a, "histogram"))
    edges = histogram_bin_edges(x, bins, range)
    if edges.ndim != 1: raise ValueError(at_user_line(f"histogram: bins must be 1-D, got {shape_str(edges)}"))
    w = _ones_float(x) if weights is None else ravel(as_operand(weights, "histogram"))
    if w.shape != x.shape:
        raise ValueError(at_user_line(f"histogram: weights must have a's shape, got {shape_str(x, w)}"))
    (xe, edges_p), _ = promote([x, edges])
    index = _count_at_or_below(xe, edges_p, False)
    n = edges.shape[0]
    index = where(xe == edges_p[-1], _full(index, n - 1), index)
    counts = zeros(n, _dt(w)).at[index].add(w)[1:]
    if density:
        widths = diff(cast(edges, inexact_dtype(_dt(edges))))
        counts = counts / widths / sum(counts)
    return counts, edges


def _ones_float(x: Array) -> Array:
    return lax.full(x.shape, 1, inexact_dtype(_dt(x)))


@eager_op
def interp(x: Any, xp: Any, fp: Any, left: Any = None, right: Any = None, period: Any = None) -> Array:
    """Piecewise-linear interpolation of the points (xp, fp) (xp increasing, 1-D) at x; `left`/`right` (default
    fp[0]/fp[-1], or 'extrapolate') outside. `period` needs a sort and is not supported."""
    if period is not None:
        raise UnsupportedError(at_user_line("interp: period= needs sorting, which fnx.numpy_math does not do"))
    (v, xs, fs), _ = _promote_inexact("interp", x, xp, fp)
    if xs.ndim != 1 or fs.ndim != 1 or xs.shape != fs.shape or xs.shape[0] == 0:
        raise ValueError(at_user_line(f"interp: xp and fp must be 1-D of one non-zero length, got "
                                      f"{shape_str(xs, fs)}"))
    n = xs.shape[0]
    if n == 1:
        out = _broadcast(fs[0], v.shape)
    else:
        i = _count_at_or_below(v, xs, False)
        i = where(i < 1, _full(i, 1), where(i > n - 1, _full(i, n - 1), i))
        x0, x1, f0, f1 = xs[i - 1], xs[i], fs[i - 1], fs[i]
        dx = x1 - x0
        flat = _abs(dx) <= dtypes.finfo(_dt(dx).np).eps
        out = where(flat, f0, f0 + (v - x0) / where(flat, _full(dx, 1.0), dx) * (f1 - f0))
    for bound, outside, edge in ((left, v < xs[0], fs[0]), (right, v > xs[-1], fs[-1])):
        if isinstance(bound, str):
            if bound != "extrapolate":
                raise ValueError(at_user_line(f"interp: the only string value of left/right is 'extrapolate', got "
                                              f"{bound!r}"))
            continue
        out = where(outside, edge if bound is None else cast(as_operand(bound, "interp"), _dt(out)), out)
    return out


__all__ = [
    "logaddexp", "logaddexp2", "hypot", "copysign", "sinc", "deg2rad", "radians", "rad2deg", "degrees", "cbrt",
    "float_power", "fmax", "fmin", "fmod", "divmod", "modf", "frexp", "ldexp", "nextafter", "signbit", "heaviside",
    "gcd", "lcm", "bitwise_invert", "bitwise_left_shift", "bitwise_right_shift", "bitwise_count", "isposinf",
    "isneginf", "nan_to_num", "arcsinh", "asinh", "arccosh", "acosh", "arctanh", "atanh", "i0",
    "isclose", "allclose", "array_equal", "array_equiv",
    "nansum", "nanprod", "nanmax", "nanmin", "nanargmax", "nanargmin", "nanmean", "nanvar", "nanstd", "nancumsum",
    "nancumprod", "cumulative_sum", "cumulative_prod",
    "ptp", "count_nonzero", "average", "cov", "corrcoef",
    "cross", "kron", "vecdot", "matvec", "vecmat",
    "diff", "ediff1d", "gradient", "trapezoid", "unwrap",
    "polyval", "polyadd", "polysub", "polymul", "polyder", "polyint", "vander", "convolve", "correlate", "piecewise",
    "bincount", "digitize", "histogram_bin_edges", "histogram", "interp",
    "acos", "asin", "atan", "atan2", "pow", "euler_gamma", "fabs", "spacing", "hanning", "hamming", "blackman",
    "bartlett", "kaiser", "poly", "polydiv", "polyfit",
]


# ---- the array API's names for existing functions, constants, windows, more polynomials ----

def _alias(name: str, target: str) -> Any:
    import fnx.numpy as namespace  # (a name fnx.numpy defines before this module joins it)
    function = getattr(namespace, target)

    @functools.wraps(function)  # (help() shows the target's signature)
    def alias(*args: Any, **kwargs: Any) -> Any:
        return function(*args, **kwargs)
    alias.__name__, alias.__qualname__ = name, name
    alias.__doc__ = f"fnx.numpy.{target} under the array API's name (jax.numpy.{name})."
    return alias


acos, asin, atan, atan2 = (_alias(n, t) for n, t in (("acos", "arccos"), ("asin", "arcsin"), ("atan", "arctan"),
                                                   ("atan2", "arctan2")))
pow = _alias("pow", "power")  # noqa: A001
euler_gamma = 0.5772156649015329


@eager_op
def fabs(x: Any, /) -> Array:
    """|x| elementwise for real inputs, always in a float dtype (integers become floats, as numpy)."""
    return _abs(_inexact(as_operand(x, "fabs")))


@eager_op
def spacing(x: Any, /) -> Array:
    """The distance from x to the next float away from zero (numpy.spacing), in x's float dtype."""
    x = _inexact(as_operand(x, "spacing"))
    away = where(_signbit(x), -np.inf, np.inf).astype(x.dtype)
    return nextafter(x, away) - x


def _window(name: str, m: int, terms: Sequence[float]) -> Array:
    """A cosine-sum window of m points: sum of (-1)^k a_k cos(2 pi k n / (m - 1))."""
    if int(m) != m: raise TypeError(at_user_line(f"{name}: M must be an integer, got {m!r}"))
    m = int(m)
    if m < 1: return zeros((0,))
    if m == 1: return array([1.0])
    n = np.arange(m, dtype=np.float64)
    values = builtins.sum(((-1) ** k) * a * np.cos(2 * np.pi * k * n / (m - 1)) for k, a in enumerate(terms))
    return array(values.astype(np.float32))


def hanning(M: int) -> Array:
    """The Hann window (0.5 - 0.5 cos(2 pi n / (M - 1))), float32."""
    return _window("hanning", M, (0.5, 0.5))


def hamming(M: int) -> Array:
    """The Hamming window (0.54 - 0.46 cos(2 pi n / (M - 1))), float32."""
    return _window("hamming", M, (0.54, 0.46))


def blackman(M: int) -> Array:
    """The Blackman window (0.42 - 0.5 cos(2 pi n / (M - 1)) + 0.08 cos(4 pi n / (M - 1))), float32."""
    return _window("blackman", M, (0.42, 0.5, 0.08))


def bartlett(M: int) -> Array:
    """The triangular Bartlett window, float32."""
    if int(M) != M: raise TypeError(at_user_line(f"bartlett: M must be an integer, got {M!r}"))
    m = int(M)
    if m < 1: return zeros((0,))
    if m == 1: return array([1.0])
    n = np.arange(m, dtype=np.float64)
    return array((1 - np.abs(2 * n / (m - 1) - 1)).astype(np.float32))


@eager_op
def kaiser(M: int, beta: Any) -> Array:
    """The Kaiser window i0(beta sqrt(1 - (2 n / (M - 1) - 1)^2)) / i0(beta), float32 (beta may be traced)."""
    if int(M) != M: raise TypeError(at_user_line(f"kaiser: M must be an integer, got {M!r}"))
    m = int(M)
    if m < 1: return zeros((0,))
    if m == 1: return array([1.0])
    ratio = array((2 * np.arange(m) / (m - 1) - 1).astype(np.float32))
    beta = as_operand(beta, "kaiser").astype(np.float32)
    return i0(beta * sqrt(1 - ratio * ratio)) / i0(beta)


@eager_op
def poly(seq_of_zeros: Any) -> Array:
    """The coefficients (highest power first) of the monic polynomial with the given roots; a square matrix gives
    its characteristic polynomial's (from its eigenvalues: symmetric matrices only here)."""
    roots = as_operand(seq_of_zeros, "poly")
    if roots.ndim == 2 and roots.shape[0] == roots.shape[1] and roots.shape[0]:
        import fnx.numpy as namespace
        roots = namespace.linalg.eigvalsh(roots)
    elif roots.ndim != 1:
        raise ValueError(at_user_line(f"poly: needs 1-d roots or a square matrix, got shape {roots.shape}"))
    roots = _inexact(roots)
    coefficients = array(np.ones(1, roots.dtype))
    for k in range(roots.shape[0]):  # (times (x - r_k): a static loop over the roots)
        shifted = concatenate([coefficients, zeros((1,), roots.dtype)])
        lowered = concatenate([zeros((1,), roots.dtype), coefficients * roots[k]])
        coefficients = shifted - lowered
    return coefficients


@eager_op
def polydiv(u: Any, v: Any, *, trim_leading_zeros: bool = False) -> tuple[Array, Array]:
    """(quotient, remainder) of polynomial u / v (coefficients highest power first) by long division; v's leading
    coefficient must be nonzero (as JAX: no trimming under jit)."""
    (u, v), _ = _promote_inexact("polydiv", u, v)
    if u.ndim != 1 or v.ndim != 1 or not v.shape[0]:
        raise ValueError(at_user_line(f"polydiv: needs 1-d coefficient arrays, v non-empty; got {u.shape}, {v.shape}"))
    m, n = u.shape[0] - 1, v.shape[0] - 1
    scale = 1.0 / v[0]
    quotient = zeros((builtins.max(m - n + 1, 1),), u.dtype)
    remainder = u
    for k in range(0, m - n + 1):  # (a static loop over the quotient's terms)
        d = scale * remainder[k]
        quotient = quotient.at[k].set(d)
        remainder = remainder.at[k:k + n + 1].add(-d * v)
    return quotient, remainder


@eager_op
def polyfit(x: Any, y: Any, deg: int, rcond: Any = None, full: bool = False, w: Any = None,
            cov: bool = False) -> Any:
    """Least-squares polynomial coefficients of degree `deg` (highest power first) through points (x, y), by the
    SVD least squares of the (scaled) Vandermonde matrix; `w` weights the residuals."""
    import fnx.numpy as namespace
    (x, y), _ = _promote_inexact("polyfit", x, y)
    if full or cov:
        raise NotImplementedError("polyfit: full= and cov= are not implemented in fnx yet")
    if x.ndim != 1 or y.ndim not in (1, 2) or y.shape[0] != x.shape[0]:
        raise ValueError(at_user_line(f"polyfit: x must be 1-d and y have x's length, got {x.shape} and {y.shape}"))
    lhs = vander(x, int(deg) + 1)
    rhs = y
    if w is not None:
        weights = as_operand(w, "polyfit").astype(x.dtype)
        lhs, rhs = lhs * weights[:, None], (rhs * weights if rhs.ndim == 1 else rhs * weights[:, None])
    scale = sqrt(sum(lhs * lhs, axis=0))
    scale = where(scale == 0, 1, scale)
    solution = namespace.linalg.lstsq(lhs / scale, rhs, rcond=rcond)[0]
    return (solution.T / scale).T

from fnx import numpy as _numpy  # noqa: E402  (the namespace these names join)

_numpy._extend({name: globals()[name] for name in __all__})
