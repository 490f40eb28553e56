"""Ulp sweeps of every transcendental over the whole float range (TESTING.md, pattern 5).

Each function runs on a geometric sweep of float32 from the smallest subnormal to the largest finite value
(evenly spaced bit patterns, both signs), on +-0, +-inf and NaN, and on a dense uniform grid over its main
range. The oracle is numpy in float64 (the math module for erfc), rounded to float32. The error is the distance
between the float32 bit patterns ordered as integers (1 = neighbouring floats, -0 = +0), so it means the same
for subnormal, normal and overflowing results: every function stays within 4 ulp. NaN must meet NaN, and an
infinite result the same infinity (the largest finite float next to a rounded-up overflow counts as 1 ulp).

float64 inputs are checked on a sparser sweep against numpy float64 (no higher-precision oracle here: the bound,
8 ulp, also absorbs numpy's own error), with the exceptions in F64_EXCEPTIONS. float16 and bfloat16 inputs are
checked exhaustively, within 1 ulp of the float64 result, for the functions that compute in float32 and round
once (the fnx.nn compositions round after every 16-bit op, as in JAX).
"""
import decimal
import math

import ml_dtypes
import numpy as np
import pytest

import fnx
import fnx.nn as nn
import fnx.numpy as jnp

F16, F32, F64, BF16 = np.float16, np.float32, np.float64, ml_dtypes.bfloat16
BITS = {F16: np.int16, BF16: np.int16, F32: np.int32, F64: np.int64}
MAX_ULP = {F32: 4, F64: 8, F16: 1, BF16: 1}  # float64: looser, numpy is the oracle there (see the docstring)


def magnitude_and_sign(a: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """A float's bits without the sign, as an int64 that counts the representable values up from 0, and the sign."""
    i = a.view(BITS[a.dtype.type]).astype(np.int64)
    return i & np.int64(np.iinfo(BITS[a.dtype.type]).max), i < 0


def ulp_errors(got: np.ndarray, want: np.ndarray) -> np.ndarray:
    """Per element: the number of floats between got and want (-0.0 and 0.0 are one); inf where exactly one is
    NaN, 0 where both are. Exact below 2**53 (float64 rounds only distances that large)."""
    got_nan, want_nan = np.isnan(got), np.isnan(want)
    (m_got, s_got), (m_want, s_want) = (magnitude_and_sign(np.where(nan, 0, a).astype(a.dtype))
                                        for a, nan in ((got, got_nan), (want, want_nan)))
    err = np.where(s_got == s_want, np.abs(m_got - m_want).astype(F64), m_got.astype(F64) + m_want.astype(F64))
    return np.where(got_nan != want_nan, np.inf, np.where(got_nan, 0.0, err))


def specials(dtype) -> np.ndarray:
    return np.array([0.0, -0.0, np.inf, -np.inf, np.nan], dtype)


def geometric(dtype, n: int) -> np.ndarray:
    """n evenly spaced bit patterns from the smallest subnormal to the largest finite value, with both signs."""
    top = np.array(np.finfo(dtype).max, dtype).view(BITS[dtype]).astype(np.int64)
    bits = np.unique(np.linspace(1, top, n).astype(np.int64)).astype(BITS[dtype])
    pos = bits.view(dtype)
    return np.concatenate([pos, -pos])


def sweep(dtype, lo: float, hi: float, n: int = 500_000, n_uniform: int = 500_000) -> np.ndarray:
    """The geometric sweep, the specials and a uniform grid on [lo, hi] (with its ends)."""
    grid = np.linspace(lo, hi, n_uniform).astype(dtype)
    return np.concatenate([specials(dtype), geometric(dtype, n), grid])


def reference(ref, dtype, *xs: np.ndarray) -> np.ndarray:
    with np.errstate(all="ignore"):
        return np.asarray(ref(*(x.astype(F64) for x in xs))).astype(dtype)


def worst(got: np.ndarray, want: np.ndarray, *xs: np.ndarray) -> tuple[float, str]:
    """The largest error and a line naming the input where it occurs."""
    err = ulp_errors(got, want)
    k = int(np.argmax(err))
    where = ", ".join(repr(x.flat[k]) for x in xs)
    return float(err.flat[k]), f"{err.flat[k]} ulp at ({where}): got {got.flat[k]!r}, want {want.flat[k]!r}"


_erfc = np.vectorize(math.erfc, otypes=[F64])


def _softplus(x):
    return np.logaddexp(0.0, x)


def _sigmoid(x):
    e = np.exp(-np.abs(x))
    return np.where(x < 0, e, 1.0) / (1 + e)


def _silu(x):
    h = np.exp(-np.abs(x) / 2)  # x * e^-|x| as (x * h) * h: e^-|x| alone is subnormal past |x| = 708
    return np.where(x < 0, (x * h) * h, x) / (1 + h * h)


_C = 1 / math.sqrt(2)
_C_LO = float(decimal.Decimal(1) / decimal.Decimal(2).sqrt() - decimal.Decimal(_C))  # 1/sqrt(2) - _C


def _product_error(a, b):
    """a * b - fl(a * b), exactly (Dekker's splitting; |a| well below the overflow threshold)."""
    def split(v):
        t = v * 134217729.0
        hi = t - (t - v)
        return hi, v - hi
    (a_hi, a_lo), (b_hi, b_lo), p = split(a), split(b), a * b
    return ((a_hi * b_hi - p) + a_hi * b_lo + a_lo * b_hi) + a_lo * b_lo


def _gelu(x):
    """x erfc(-x/sqrt 2) / 2 with erfc at the exact -x/sqrt 2: erfc magnifies the rounding of its argument z by
    2 z^2, so erfc(z) is corrected to first order by that rounding."""
    z = -x * _C
    with np.errstate(all="ignore"):
        rounding = np.where(np.abs(x) < 1e300, _product_error(-x, _C) + -x * _C_LO, 0.0)
    return x * ((_erfc(z) - 2 / math.sqrt(math.pi) * np.exp(-z * z) * rounding) / 2)


# name: (fnx function, float64 reference, main range, float64 supported)
UNARY = {
    "sin": (jnp.sin, np.sin, (-10, 10)),
    "cos": (jnp.cos, np.cos, (-10, 10)),
    "tan": (jnp.tan, np.tan, (-10, 10)),
    "arcsin": (jnp.arcsin, np.arcsin, (-1, 1)),
    "arccos": (jnp.arccos, np.arccos, (-1, 1)),
    "arctan": (jnp.arctan, np.arctan, (-10, 10)),
    "sinh": (jnp.sinh, np.sinh, (-90, 90)),
    "cosh": (jnp.cosh, np.cosh, (-90, 90)),
    "tanh": (jnp.tanh, np.tanh, (-10, 10)),
    "exp": (jnp.exp, np.exp, (-105, 89)),
    "exp2": (jnp.exp2, np.exp2, (-150, 128)),
    "expm1": (jnp.expm1, np.expm1, (-20, 89)),
    "log": (jnp.log, np.log, (0, 10)),
    "log2": (jnp.log2, np.log2, (0, 10)),
    "log10": (jnp.log10, np.log10, (0, 10)),
    "log1p": (jnp.log1p, np.log1p, (-1, 10)),
    "sqrt": (jnp.sqrt, np.sqrt, (0, 10)),
    "rsqrt": (jnp.rsqrt, lambda x: 1 / np.sqrt(x), (0, 10)),
    "sigmoid": (nn.sigmoid, _sigmoid, (-100, 100)),
    "softplus": (nn.softplus, _softplus, (-100, 100)),
    "log_sigmoid": (nn.log_sigmoid, lambda x: -_softplus(-x), (-100, 100)),
    "silu": (nn.silu, _silu, (-100, 100)),
    "gelu_exact": (lambda x: nn.gelu(x, approximate=False), _gelu, (-15, 15)),
    "erfc": (nn._erfc, _erfc, (-5, 11)),
    "elu": (nn.elu, lambda x: np.where(x > 0, x, np.expm1(x)), (-20, 20)),
}


# float64 limits, each with its reason: (largest |x| checked, max ulp)
F64_EXCEPTIONS = {
    # float64 cos/tan come from the SIN primitive at x and 2x; past 2**1023, where 2x overflows, x/2 stands in,
    # whose cos formula has an absolute error only (~1e-16: relatively worse where cos x is near 0)
    "cos": (2.0 ** 1023, MAX_ULP[F64]), "tan": (2.0 ** 1023, MAX_ULP[F64]),
    # erfc is e^(-x^2) (two exps) times a series or continued fraction: up to 7 ulp on a dense grid, math.erfc's
    # own error included (for float32 it all happens in float64)
    "erfc": (np.inf, 12), "gelu_exact": (np.inf, 12),
}
# fnx.nn compositions: several float16 ops, each rounded (checked in float32 and float64 only)
F16_SKIP = {"sigmoid", "softplus", "log_sigmoid", "silu", "elu"}


def check(name: str, got: np.ndarray, want: np.ndarray, max_ulp: float, *xs: np.ndarray) -> None:
    assert got.dtype == want.dtype, (name, got.dtype, want.dtype)
    err, line = worst(got, want, *xs)
    assert err <= max_ulp, f"{name}: {line}"


@pytest.mark.parametrize("name", list(UNARY))
def test_unary_float32(name):
    fn, ref, (lo, hi) = UNARY[name]
    x = sweep(F32, lo, hi)
    check(name, np.asarray(fn(jnp.asarray(x))), reference(ref, F32, x), MAX_ULP[F32], x)


@pytest.mark.parametrize("name", ["cos", "tan", "exp", "tanh"])
def test_unary_float32_jit(name):
    fn, ref, (lo, hi) = UNARY[name]
    x = sweep(F32, lo, hi, n=50_000, n_uniform=50_000)
    check(name, np.asarray(fnx.jit(fn)(jnp.asarray(x))), reference(ref, F32, x), MAX_ULP[F32], x)


@pytest.mark.parametrize("name", list(UNARY))
@pytest.mark.usefixtures("x64")
def test_unary_float64(name):
    fn, ref, (lo, hi) = UNARY[name]
    largest, max_ulp = F64_EXCEPTIONS.get(name, (np.inf, MAX_ULP[F64]))
    x = sweep(F64, lo, hi, n=50_000, n_uniform=50_000)
    x = x[~(np.abs(x) >= largest)]
    check(name, np.asarray(fn(jnp.asarray(x))), reference(ref, F64, x), max_ulp, x)


@pytest.mark.parametrize("dtype", [F16, BF16], ids=["float16", "bfloat16"])
@pytest.mark.parametrize("name", [n for n in UNARY if n not in F16_SKIP])
def test_unary_16_bit_exhaustive(name, dtype):
    fn, ref, _ = UNARY[name]
    x = np.arange(-(1 << 15), 1 << 15).astype(np.int16).view(dtype)
    check(name, np.asarray(fn(jnp.asarray(x))), reference(ref, dtype, x), MAX_ULP[dtype], x)


def test_float32_tanh_is_one_formula_within_three_ulp():
    """float32 tanh is e / (e + 2) with e = expm1(2|x|) over the whole range (fnx/numpy.py `_tanh`): within 3
    ulp of the rounded float64 result (2.33 from the exact one) on every 61st float32 bit pattern from 0 to 10,
    both signs, eager and jitted alike; the sign of zeros and NaNs kept."""
    pos = np.arange(0, np.array(10.0, F32).view(np.int32), 61, dtype=np.int32).view(F32)
    x = np.concatenate([pos, -pos, specials(F32)])
    want = reference(np.tanh, F32, x)
    eager, jitted = np.asarray(jnp.tanh(jnp.asarray(x))), np.asarray(fnx.jit(jnp.tanh)(jnp.asarray(x)))
    check("tanh", eager, want, 3, x)
    np.testing.assert_array_equal(jitted, eager)
    np.testing.assert_array_equal(np.signbit(eager[-5:]), np.signbit(x[-5:]))


def test_known_large_arguments():
    """The issue's cases: float32 cos and tan far from zero."""
    x = np.array([42356.52, 1e30, -1e30, 3.4e38, 16367173 * 2.0 ** 72], F32)
    for name in ("sin", "cos", "tan"):
        fn, ref, _ = UNARY[name]
        check(name, np.asarray(fn(jnp.asarray(x))), reference(ref, F32, x), 1, x)


def pairs(dtype, n: int) -> tuple[np.ndarray, np.ndarray]:
    """Every pair from a short geometric sweep with the specials and a few round values."""
    a = np.concatenate([specials(dtype), geometric(dtype, n), np.array([1.0, -1.0, 2.0, 0.5, 3.0], dtype)])
    y, x = np.meshgrid(a, a, indexing="ij")
    return y.ravel(), x.ravel()


def test_arctan2_float32():
    y, x = pairs(F32, 400)
    angle = np.linspace(-4, 4, 100_001)
    y = np.concatenate([y, np.sin(angle).astype(F32)])
    x = np.concatenate([x, np.cos(angle).astype(F32)])
    check("arctan2", np.asarray(jnp.arctan2(jnp.asarray(y), jnp.asarray(x))), reference(np.arctan2, F32, y, x),
          MAX_ULP[F32], y, x)


@pytest.mark.parametrize("dtype", [F32, F64], ids=["float32", "float64"])
def test_power(dtype):
    """Every base of a sweep against round, huge and random exponents, and bases near 1 to exponents near +-1500,
    where y log2|x| is largest for a finite result (float64 carries it in two floats)."""
    x, _ = pairs(dtype, 300)
    x = np.unique(x)
    rng = np.random.default_rng(0)
    exponents = np.concatenate([specials(dtype), np.arange(-6, 7), [0.5, -0.5, 1.5, 1 / 3, 1e10, -1e10],
                                [np.finfo(dtype).max, 2.0 ** 24 + 2, 2.0 ** 53 + 2], rng.uniform(-40, 40, 100)])
    exponents = exponents.astype(dtype)
    xs, ys = (v.ravel() for v in np.meshgrid(x, exponents, indexing="ij"))
    xs = np.concatenate([xs, rng.uniform(0.5, 2, 100_000).astype(dtype)])
    ys = np.concatenate([ys, rng.uniform(-1500, 1500, 100_000).astype(dtype)])
    check("power", np.asarray(jnp.power(jnp.asarray(xs), jnp.asarray(ys))), reference(np.power, dtype, xs, ys),
          MAX_ULP[dtype], xs, ys)


def test_special_inputs_exactly(device):
    """+-0, +-inf and NaN give numpy's value, the sign of a zero result included, on every backend."""
    x = specials(F32)
    for name, (fn, ref, _) in UNARY.items():
        got, want = np.asarray(fn(jnp.asarray(x))), reference(ref, F32, x)
        same = (got == want) & (np.signbit(got) == np.signbit(want)) | (np.isnan(got) & np.isnan(want))
        assert same.all(), f"{name}({x[~same]}) = {got[~same]}, want {want[~same]}"
