"""Float arithmetic after the schedule (fnx/lower/arith.py): a division by a value computed outside the inner loop
becomes a multiply by its reciprocal, and a product added to a non-product one fused multiply-add.

The oracle is float64 numpy rounded to the dtype: quotients within 2 ulp, and exactly a division's result for
zeros, infinities, NaNs and divisors whose reciprocal is not a normal number; a contracted `x * y + z` is the
float64 sum of the exact product rounded once. Each test also checks, in the kernel's text, that the rewrite
happened (or did not), so none passes without exercising it."""
from __future__ import annotations

import numpy as np
import pytest

import fnx
import fnx.numpy as jnp

RNG = np.random.default_rng(11)

# per-row divisors: ordinary ones, then the edges of float32's reciprocal range and the special values
EDGES32 = [3.0, -7.25, 1e-3, 0.1, 2.0 ** -126, 1e-39, -1e-39, 1e-45, 2.0 ** 126, 3e38, -3e38, 1.7e38, 0.0, -0.0,
           np.inf, -np.inf, np.nan]


def _ops(fn, *args) -> str:
    return fnx.jit(fn).lower(*map(jnp.asarray, args)).as_text("linearize")


def _ulps(got: np.ndarray, want: np.ndarray) -> np.ndarray:
    """Distance in units in the last place between two arrays of one float dtype (finite, same-sign values)."""
    bits = {np.float32: np.int32, np.float64: np.int64}[got.dtype.type]
    g, w = got.view(bits).astype(np.int64), want.view(bits).astype(np.int64)
    return np.abs(g - w)


def _check_quotients(got: np.ndarray, x: np.ndarray, b: np.ndarray) -> None:
    with np.errstate(all="ignore"):
        want = (x.astype(np.float64) / b.astype(np.float64)).astype(x.dtype)  # (float64 holds every float32 quotient)
        exact = x / b
    special = ~np.isfinite(want) | (want == 0) | ~np.isfinite(x) | ~np.isfinite(b) | (b == 0)
    np.testing.assert_array_equal(got[special], exact[special])  # NaN == NaN here, and the signs of zeros count
    signed = special & ~np.isnan(exact)  # (a NaN's sign bit means nothing: x86 makes the "default NaN" negative)
    assert (np.signbit(got[signed]) == np.signbit(exact[signed])).all()
    assert _ulps(got[~special], want[~special]).max(initial=0) <= 2


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_row_divisor_is_one_reciprocal_per_row(dtype):
    """x / b with b (rows, 1): one reciprocal per row, a multiply per element (the kernel has no division left)."""
    edges = EDGES32 + ([1e-310, -1e-310, 2.0 ** 1022, 1.7e308, 2.0 ** -1022] if dtype == np.float64 else [])
    b = np.array(edges + list(RNG.standard_normal(40) * 10.0 ** RNG.integers(-30, 30, 40)), dtype)[:, None]
    x = (RNG.standard_normal((len(b), 100)) * 10.0 ** RNG.integers(-35, 35, (len(b), 100))).astype(dtype)
    x[:, :6] = [0.0, -0.0, np.inf, -np.inf, np.nan, 1e-30]
    fn = lambda x, b: x / b  # noqa: E731
    text = _ops(fn, x, b)
    assert " recip " in text and " div " not in text
    _check_quotients(np.asarray(fnx.jit(fn)(x, b)), x, b)


def test_small_divisors_keep_their_quotient():
    """1e-30 / 1e-39 is 1e9 and 1e38 / 3e38 is 0.33: the reciprocal of a divisor outside the normal range is taken
    of a scaled divisor (JAX on the CPU gives inf and 0)."""
    x = np.array([[1e-30] * 16, [1e38] * 16, [1e-20] * 16], np.float32)
    b = np.array([[1e-39], [3e38], [2.0 ** -140]], np.float32)
    got = np.asarray(fnx.jit(lambda x, b: x / b)(x, b))
    np.testing.assert_allclose(got[:, 0], (x[:, 0].astype(np.float64) / b[:, 0]), rtol=3e-7)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_a_square_root_divisor_needs_no_scaling(dtype):
    """x / sqrt(v): a square root's reciprocal is always a normal number (or 0, inf, NaN, which a multiply handles as
    the division does), so the kernel multiplies by it without the scaling (no select on the divisor's range);
    every edge of v, subnormals and zeros of both signs included, gives a division's quotient."""
    edges = [0.0, -0.0, 1e-45, 1e-40, 2.0 ** -126, 1e-20, 1.0, 3e38, np.inf, np.nan, -1.0, 2.0 ** 127]
    edges += [5e-324, 1e-310, 1e300, 1.7e308] if dtype == np.float64 else []
    v = np.array(edges + list(10.0 ** RNG.uniform(-30, 30, 20)), dtype)[:, None]
    x = (RNG.standard_normal((len(v), 64)) * 10.0 ** RNG.integers(-30, 30, (len(v), 64))).astype(dtype)
    x[:, :6] = [0.0, -0.0, np.inf, -np.inf, np.nan, 1e-30]
    fn = lambda x, v: x / jnp.sqrt(v)  # noqa: E731
    text = _ops(fn, x, v)
    assert " recip " in text and " div " not in text and " where " not in text
    with np.errstate(invalid="ignore"):
        _check_quotients(np.asarray(fnx.jit(fn)(x, v)), x, np.sqrt(v))


def test_layernorm_divides_once_per_row_and_matches_float64():
    """W10's step: (x - mean) / sqrt(var + eps), vectorized along the row, the divisor a scalar per row."""
    x = RNG.standard_normal((64, 1024)).astype(np.float32)

    def f(x):
        mean = x.mean(-1, keepdims=True)
        return (x - mean) / jnp.sqrt(((x - mean) ** 2).mean(-1, keepdims=True) + 1e-5)
    assert " div " not in _ops(f, x)
    w = x.astype(np.float64)
    want = (w - w.mean(-1, keepdims=True)) / np.sqrt(w.var(-1, keepdims=True) + 1e-5)
    np.testing.assert_allclose(np.asarray(fnx.jit(f)(x)), want, rtol=2e-6, atol=2e-6)


def test_constant_divisor():
    x = (RNG.standard_normal(1000) * 1e3).astype(np.float32)
    x[:4] = [0.0, -0.0, np.inf, np.nan]
    fn = lambda x: x / 3.0  # noqa: E731
    assert " div " not in _ops(fn, x)
    _check_quotients(np.asarray(fnx.jit(fn)(x)), x, np.full_like(x, 3.0))


def test_a_divisor_that_varies_along_the_inner_loop_keeps_the_division():
    """Elementwise divisors and a divisor per column (it varies along the vectorized row): a reciprocal would be
    one more op per element, so these stay divisions, correctly rounded (bitwise numpy's)."""
    x = RNG.standard_normal((33, 70)).astype(np.float32)
    for b in (RNG.standard_normal((33, 70)).astype(np.float32), RNG.standard_normal(70).astype(np.float32)):
        fn = lambda x, b: x / b  # noqa: E731
        assert " div " in _ops(fn, x, b)
        np.testing.assert_array_equal(np.asarray(fnx.jit(fn)(x, b)), x / b)


def test_half_precision_keeps_the_division():
    """float16 rounds every op's result: a reciprocal's rounding would add to the quotient's, so it divides."""
    x = RNG.standard_normal((8, 64)).astype(np.float16)
    b = RNG.standard_normal((8, 1)).astype(np.float16)
    fn = lambda x, b: x / b  # noqa: E731
    assert " div " in _ops(fn, x, b)
    np.testing.assert_array_equal(np.asarray(fnx.jit(fn)(x, b)), x / b)


def test_divisor_outside_a_reduce_loop():
    """sum(x / s) over rows, s a scalar per row: the division inside the reduce loop, its reciprocal outside."""
    x = RNG.standard_normal((16, 300)).astype(np.float32)
    s = (RNG.random((16, 1)) + 0.5).astype(np.float32)
    fn = lambda x, s: (x / s).sum(-1)  # noqa: E731
    assert " div " not in _ops(fn, x, s)
    np.testing.assert_allclose(np.asarray(fnx.jit(fn)(x, s)), (x.astype(np.float64) / s).sum(-1), rtol=1e-5,
                               atol=1e-5)


def _llvm(fn, *args) -> str:
    return fnx.jit(fn).lower(*map(jnp.asarray, args)).compile().as_text("llvm")


def test_product_plus_value_is_one_fused_multiply_add():
    """x * y + z rounds once: the float64 sum of the exact float32 product, rounded to float32 (as XLA's CPU
    contraction gives); rounding the product first differs on about a quarter of random inputs."""
    x, y, z = (RNG.standard_normal(4096).astype(np.float32) for _ in range(3))
    fn = lambda x, y, z: x * y + z  # noqa: E731
    assert "fmuladd" in _llvm(fn, x, y, z)
    fused = (x.astype(np.float64) * y + z).astype(np.float32)  # (the product is exact in float64)
    got = np.asarray(fnx.jit(fn)(x, y, z))
    assert _ulps(got, fused).max() <= 1 and (got == fused).mean() > 0.999
    assert (x * y + z != fused).mean() > 0.1  # (the two roundings are told apart by these inputs)
    minus = lambda x, y, z: x * y - z  # noqa: E731  (x * y + z * -1: a negation is not a product)
    assert "fmuladd" in _llvm(minus, x, y, z)
    got, fused = np.asarray(fnx.jit(minus)(x, y, z)), (x.astype(np.float64) * y - z).astype(np.float32)
    assert _ulps(got, fused).max() <= 1 and (got == fused).mean() > 0.999


def test_a_difference_of_products_is_not_contracted():
    """a*b - b*a is exactly 0, and z * conj(z) has no imaginary part: neither product is fused."""
    a, b = (RNG.standard_normal(512).astype(np.float32) for _ in range(2))
    fn = lambda a, b: a * b - b * a  # noqa: E731
    assert "fmuladd" not in _llvm(fn, a, b)
    assert (np.asarray(fnx.jit(fn)(a, b)) == 0).all()
    zc = (a + 1j * b).astype(np.complex64)
    assert (np.asarray(fnx.jit(lambda z: z * jnp.conj(z))(zc)).imag == 0).all()


def test_a_product_with_another_use_is_rounded_once_for_both():
    """(x*y + z) + x*y: the one product node feeds both adds, so it is rounded once and neither add is fused."""
    x, y, z = (RNG.standard_normal(256).astype(np.float32) for _ in range(3))
    fn = lambda x, y, z: (x * y + z) + x * y  # noqa: E731
    assert "fmuladd" not in _llvm(fn, x, y, z)
    np.testing.assert_array_equal(np.asarray(fnx.jit(fn)(x, y, z)), (x * y + z) + x * y)


def test_half_precision_product_rounds_before_the_add():
    """float16 rounds every op (TESTING.md: numpy float16 step by step is the oracle), so no fused multiply-add."""
    x, y, z = (RNG.standard_normal(256).astype(np.float16) for _ in range(3))
    fn = lambda x, y, z: x * y + z  # noqa: E731
    np.testing.assert_array_equal(np.asarray(fnx.jit(fn)(x, y, z)), x * y + z)


def test_dividing_2_to_the_26_elements_by_their_max_twice_and_from_threads():
    """x / x.max() over 2^26 elements (threads and vectors split it; the divisor is one scalar): within 2 ulp of
    numpy's correctly rounded quotient, on the first call and on a cached one, and from 4 threads at once."""
    import threading
    x = RNG.standard_normal(1 << 26).astype(np.float32)
    want = x / x.max()
    fn = fnx.jit(lambda x: x / x.max())
    assert " div " not in fn.lower(jnp.asarray(x)).as_text("linearize")
    xs = jnp.asarray(x)
    for _ in range(2): assert _ulps(np.asarray(fn(xs)), want).max() <= 2
    small = [RNG.standard_normal(1 << 16).astype(np.float32) for _ in range(4)]
    got = [None] * 4

    def work(i):
        got[i] = np.asarray(fn(jnp.asarray(small[i])))
    threads = [threading.Thread(target=work, args=(i,)) for i in range(4)]
    for t in threads: t.start()
    for t in threads: t.join()
    for s, g in zip(small, got): assert _ulps(g, s / s.max()).max() <= 2


def test_a_power_of_two_times_a_row_scaled_product_scales_the_row_factor():
    """c * (x * s), c a power of two and s a scalar per row: c * s once per row, one multiply per element, and
    bitwise numpy's step-by-step float32 result (scaling by a power of two is exact); 0.3 is not a power of two
    and stays a multiply per element, bitwise numpy's too."""
    x = RNG.standard_normal((48, 200)).astype(np.float32)
    s = (RNG.standard_normal((48, 1)) * 10.0 ** RNG.integers(-3, 3, (48, 1))).astype(np.float32)
    for c, moved in ((0.25, True), (0.5, True), (4.0, True), (-2.0, True), (0.3, False)):
        fn = lambda x, s, c=c: c * (x * s)  # noqa: E731
        text = _llvm(fn, x, s)
        splat = f"splat (float 0x{np.float64(np.float32(c)).view(np.uint64):016X})"
        assert (splat not in text) == moved, (c, moved)
        np.testing.assert_array_equal(np.asarray(fnx.jit(fn)(x, s)), np.float32(c) * (x * s))


def test_a_layernorm_residual_is_one_fused_multiply_add_per_element():
    """W10's `x + 0.5 * ((x - m) * r)`, r a scalar per row: `x + (x - m) * (0.5 r)`, one fused multiply-add per
    element, within 1 ulp of the float64 sum of the exact product rounded once (and equal to it almost always);
    rounding the product first differs on some inputs."""
    x = RNG.standard_normal((64, 512)).astype(np.float32)
    m = RNG.standard_normal((64, 1)).astype(np.float32)
    r = (RNG.random((64, 1)) + 0.5).astype(np.float32)
    fn = lambda x, m, r: x + 0.5 * ((x - m) * r)  # noqa: E731
    text = _llvm(fn, x, m, r)
    assert "fmuladd" in text and "splat (float 0x3FE0000000000000)" not in text
    d = (x - m).astype(np.float64)
    fused = (x.astype(np.float64) + d * np.float32(0.5 * r).astype(np.float64)).astype(np.float32)
    got = np.asarray(fnx.jit(fn)(x, m, r))
    assert _ulps(got, fused).max() <= 1 and (got == fused).mean() > 0.999
    assert (x + np.float32(0.5) * ((x - m) * r) != fused).any()


def test_a_moved_scaling_keeps_a_product_past_the_largest_float():
    """0.5 * (x * s) with x * s just past float32's largest: the moved form, x * (0.5 s), is the finite exact
    result (JAX rounds the product to inf first), as the reciprocal's scaling keeps 1e-30 / 1e-39 finite."""
    x = np.full((4, 64), 3e38, np.float32)
    s = np.full((4, 1), 1.5, np.float32)
    got = np.asarray(fnx.jit(lambda x, s: 0.5 * (x * s))(x, s))
    np.testing.assert_array_equal(got, np.float32(2.25e38))
