"""float16 and bfloat16 round after every op, as numpy and JAX do: chains of ops, eager and under jit, against numpy
computing step by step in the same dtype (ml_dtypes for bfloat16). A float32 op rounded to a 16-bit float is
correctly rounded for + - * / sqrt (24 >= 2 * 11 + 2), so those chains must match bit for bit."""
import types

import ml_dtypes
import numpy as np
import pytest
from hypothesis import given, strategies as st

import fnx
import fnx.numpy as jnp
from fnx import lax

HALF = {"float16": np.dtype(np.float16), "bfloat16": np.dtype(ml_dtypes.bfloat16)}


def _sum(x, axis):  # JAX sums 16-bit floats in float32 and rounds once
    return np.sum(x.astype(np.float32), axis=axis).astype(x.dtype)


def numpy_in(dtype: np.dtype):
    """numpy for the oracle: Python constants become `dtype` (as fnx's weak scalars do), sums accumulate in float32."""
    return types.SimpleNamespace(**{n: getattr(np, n) for n in _FUNCTIONS}, sum=_sum, k=lambda v: dtype.type(v))


_FUNCTIONS = ("sin", "exp", "sqrt", "minimum", "maximum", "where")
FNX = types.SimpleNamespace(**{n: getattr(jnp, n) for n in _FUNCTIONS}, sum=jnp.sum, k=lambda v: v)

# chains of ops correctly rounded in float32: bit for bit
EXACT = {
    "a*b+c": lambda m, a, b, c: a * b + c,
    "(a+b)*c-a": lambda m, a, b, c: (a + b) * c - a,
    "a*a*a": lambda m, a, b, c: a * a * a,
    "a/b+c*0.1": lambda m, a, b, c: a / b + c * m.k(0.1),
    "a+b+c+a*b": lambda m, a, b, c: a + b + c + a * b,
    "sqrt(a*a+b*b)": lambda m, a, b, c: m.sqrt(a * a + b * b),
    "where chain": lambda m, a, b, c: m.where(a < b, a * b, b - c) * m.k(1.1) + c,
    "max-min": lambda m, a, b, c: m.maximum(a * b, c) - m.minimum(a + c, b),
    "a*b+c<b-a": lambda m, a, b, c: (a * b + c) < (b - a),
}
# one op that float32 computes within an ulp of float32, last in its chain: within one ulp of the dtype
ONE_ULP = {
    "sin(a*b+c)": lambda m, a, b, c: m.sin(a * b + c),
    "exp(a-b)": lambda m, a, b, c: m.exp(a - b),
    # scaled so that no order of float32 partial sums of bfloat16 terms overflows (as some would near 3.4e38)
    "sum((a*b+c)/1024)": lambda m, a, b, c: m.sum((a * b + c) * m.k(2.0 ** -10), axis=-1),
}


def ordered(x: np.ndarray) -> np.ndarray:
    """16-bit float bit patterns as integers in the order of the values (-0 and +0 both 0)."""
    bits = x.view(np.uint16).astype(np.int32)
    return np.where(bits & 0x8000, -(bits & 0x7FFF), bits)


def assert_ulps(got, want, ulps: int, what: str) -> None:
    got, want = np.asarray(got), np.asarray(want)
    assert got.dtype == want.dtype and got.shape == want.shape, (what, got.dtype, want.dtype, got.shape, want.shape)
    if got.dtype == np.bool_:
        bad = got != want
    else:
        nan_got, nan_want = np.isnan(got.astype(np.float32)), np.isnan(want.astype(np.float32))
        same = np.abs(ordered(got) - ordered(want)) <= ulps  # -0 and +0 alike: max(-0, +0) differs from numpy's
        bad = (nan_got != nan_want) | (~nan_want & ~same)
    where = np.flatnonzero(bad)[:5]
    assert not bad.any(), (f"{what}: {int(bad.sum())} of {bad.size} differ by more than {ulps} ulp, "
                           f"got {got.reshape(-1)[where]} want {want.reshape(-1)[where]}")


def check(name: str, chain, ulps: int, dtype: str, a: np.ndarray, b: np.ndarray, c: np.ndarray) -> None:
    want = chain(numpy_in(HALF[dtype]), a, b, c)
    args = [jnp.asarray(v) for v in (a, b, c)]
    eager = chain(FNX, *args)
    jitted = fnx.jit(lambda *v: chain(FNX, *v))(*args)
    assert_ulps(eager, want, ulps, f"{name} {dtype} eager")
    assert_ulps(jitted, want, ulps, f"{name} {dtype} jit")


def every_value(dtype: str, seed: int) -> np.ndarray:
    """All 65536 bit patterns of the dtype (subnormals, values near overflow, inf, NaN), shuffled."""
    return np.random.default_rng(seed).permutation(np.arange(1 << 16, dtype=np.uint32)).astype(np.uint16) \
        .view(HALF[dtype])


CHAINS = [(n, f, 0) for n, f in EXACT.items()] + [(n, f, 1) for n, f in ONE_ULP.items()]


@pytest.mark.parametrize("dtype", HALF)
@pytest.mark.parametrize("name,chain,ulps", CHAINS, ids=[n for n, _, _ in CHAINS])
def test_chain_every_value(device, name, chain, ulps, dtype):
    a, b, c = (every_value(dtype, seed).reshape(256, 256) for seed in range(3))
    with np.errstate(all="ignore"):
        check(name, chain, ulps, dtype, a, b, c)


def _halves(dtype: str, n: int):
    """n values of the dtype: any bit pattern, or ordinary magnitudes, or ones near overflow or subnormal."""
    info = ml_dtypes.finfo(HALF[dtype])
    scales = [1.0, 1e-3, float(info.max) / 4, float(info.smallest_normal) * 4]
    ordinary = st.tuples(st.floats(-4, 4), st.sampled_from(scales)).map(lambda p: p[0] * p[1])
    bits = st.integers(0, 0xFFFF).map(lambda i: float(np.array(i, np.uint16).view(HALF[dtype])))
    return st.lists(st.one_of(ordinary, bits), min_size=n, max_size=n).map(
        lambda v: np.array(v, np.float32).astype(HALF[dtype]))


@pytest.mark.parametrize("dtype", HALF)
@pytest.mark.parametrize("name,chain,ulps", CHAINS, ids=[n for n, _, _ in CHAINS])
@given(data=st.data())
def test_chain_drawn(name, chain, ulps, dtype, data):
    rows, cols = data.draw(st.sampled_from([(1, 1), (3, 17), (2, 64)]))  # scalar code, vectors with a tail, vectors
    a, b, c = (data.draw(_halves(dtype, rows * cols)).reshape(rows, cols) for _ in range(3))
    with np.errstate(all="ignore"):
        check(name, chain, ulps, dtype, a, b, c)


def near_midpoints(dtype: str) -> np.ndarray:
    """float64 values at and next to every midpoint between neighbouring finite values of a 16-bit float."""
    bits = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16)
    with np.errstate(invalid="ignore"):  # NaN patterns
        low = bits.view(HALF[dtype]).astype(np.float64)
        high = (bits + np.uint16(1)).view(HALF[dtype]).astype(np.float64)  # the neighbour away from zero
    ok = np.isfinite(low) & np.isfinite(high) & (bits & 0x7FFF != 0x7FFF)
    mid = (low[ok] + high[ok]) / 2
    return np.concatenate([mid, np.nextafter(mid, np.inf), np.nextafter(mid, -np.inf)])


def rounded_once(x: np.ndarray, dtype: str) -> np.ndarray:
    """x (finite, exact in float64) to the 16-bit float nearest it, ties to the even bit pattern: the oracle for
    casts, found among every finite value of the dtype. (Not x.astype: ml_dtypes before 0.7 casts float64 and
    32-bit integers to bfloat16 through float32, rounding twice.)"""
    bits = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16)
    with np.errstate(invalid="ignore"):
        values = bits.view(HALF[dtype]).astype(np.float64)
    keep = np.isfinite(values) & (bits != 0x8000)  # one zero: +0
    order = np.argsort(values[keep])
    table, table_bits = values[keep][order], bits[keep][order]
    w = x.astype(np.float64)
    hi = np.clip(np.searchsorted(table, w), 1, len(table) - 1)
    lo = hi - 1
    below, above = w - table[lo], table[hi] - w
    pick = np.where(below < above, lo, np.where(above < below, hi, np.where(table_bits[lo] % 2 == 0, lo, hi)))
    out = table_bits[pick].view(HALF[dtype]).copy()
    top = float(table[-1])
    half_ulp = (top - float(table[-2])) / 2  # at or beyond the largest finite value plus half its ulp: infinity
    out[w >= top + half_ulp] = np.inf
    out[w <= -(top + half_ulp)] = -np.inf
    return out


@pytest.mark.parametrize("dtype", HALF)
@pytest.mark.parametrize("source", ["float64", "float32", "int32", "uint32", "int16"])
def test_cast_rounds_once(device, dtype, source):
    """A cast to a 16-bit float rounds once: a float64 or a 32-bit integer rounded to float32 first could land on a
    16-bit midpoint and then round the wrong way."""
    x = near_midpoints(dtype)
    if source[0] in "iu":  # integers at and next to the integral midpoints
        info = np.iinfo(source)
        x = x[x == np.round(x)]
        x = np.concatenate([x - 1, x, x + 1])
        x = x[(x >= info.min) & (x <= info.max)].astype(source)
    elif source != "float64":
        x = x[np.abs(x) <= np.finfo(source).max].astype(source)
    want = rounded_once(x, dtype)
    cast = lambda v: v.astype(dtype)  # noqa: E731
    assert_ulps(cast(jnp.asarray(x)), want, 0, f"{source} -> {dtype} eager")
    assert_ulps(fnx.jit(cast)(jnp.asarray(x)), want, 0, f"{source} -> {dtype} jit")


def test_oracle_casts_64_bit_integers_to_bfloat16_once():
    """The interp oracle's cast (fnx.reference.cast) of int64 values beyond 2**53, where float64 rounds too: one
    past a bfloat16 midpoint rounds away from it, a midpoint itself to the even neighbour."""
    from fnx import dtypes, reference
    m = np.arange(128, 256, dtype=np.int64)  # bfloat16 holds m * 2**53 (8 significant bits) near 2**60
    mid = (2 * m + 1) << 52
    even = np.where(m % 2 == 0, m, m + 1)
    x = np.concatenate([mid + 1, mid - 1, mid, -(mid + 1)])
    want = np.concatenate([m + 1, m, even, -(m + 1)]).astype(np.float64) * 2.0 ** 53
    got = reference.cast(x, dtypes.from_numpy(np.dtype(ml_dtypes.bfloat16)))
    np.testing.assert_array_equal(got.astype(np.float64), want)


@pytest.mark.parametrize("dtype", HALF)
def test_contracted_add_rounds_the_product(device, dtype):
    """An ADD marked "contract" fuses with a product into one multiply-add only where no 16-bit rounding sits
    between them."""
    a, b, c = (every_value(dtype, seed) for seed in range(3))
    with np.errstate(all="ignore"):
        want = a * b + c
    got = fnx.jit(lambda a, b, c: lax._fusable_add(a * b, c))(*(jnp.asarray(v) for v in (a, b, c)))
    assert_ulps(got, want, 0, f"contracted add {dtype}")


def test_sin_minimum_jit_equals_eager(device):
    """The reported case: minimum(sin(x), x) == x kept float32 between the ops under jit."""
    f = lambda x: jnp.minimum(jnp.sin(x), x) == x  # noqa: E731
    x_np = np.linspace(-10, 10, 4001).astype(np.float16)
    x = jnp.asarray(x_np)
    eager, jitted = np.asarray(f(x)), np.asarray(fnx.jit(f)(x))
    np.testing.assert_array_equal(jitted, eager)
    np.testing.assert_array_equal(eager, np.minimum(np.sin(x_np), x_np) == x_np)


@pytest.mark.parametrize("dtype", HALF)
def test_constants_round_to_dtype(device, dtype):
    """Python constants and folded constant expressions take the 16-bit value (0.1 is not float32's 0.1)."""
    x_np = every_value(dtype, 0)
    k = HALF[dtype].type
    with np.errstate(invalid="ignore"):  # inf * 0.1 + ...
        want = x_np * k(0.1) + (k(0.1) * k(3.0) + k(1e-3))
    got = fnx.jit(lambda x: x * 0.1 + (jnp.asarray(0.1, dtype) * 3.0 + 1e-3))(jnp.asarray(x_np))
    assert_ulps(got, want, 0, f"constants {dtype}")


def test_a_bfloat16_matmul_rounds_its_operands_once():
    """`a.astype(bfloat16) @ b.astype(bfloat16)`: rounding to bfloat16 is integer work (no instruction), so the
    cost model counts it (fnx/lower/cost.py `node_flops`) and A's rounding gets a buffer instead of running inside
    the product's loop once per column panel; the product is the float32 sum of the rounded operands, rounded once
    to bfloat16 (JAX's), within a float32 sum's error."""
    rng = np.random.default_rng(9)
    a, b = rng.standard_normal((256, 384)).astype(np.float32), rng.standard_normal((384, 320)).astype(np.float32)
    f = fnx.jit(lambda a, b: (a.astype(jnp.bfloat16) @ b.astype(jnp.bfloat16)).astype(jnp.float32))
    kernels = [ln for ln in f.lower(a, b).as_text("optimize").splitlines() if ln.startswith("kernel")]
    assert sum("cast" in ln and "dot" not in ln for ln in kernels) == 2, kernels  # (both operands rounded apart)
    bf = HALF["bfloat16"]
    want = (a.astype(bf).astype(np.float64) @ b.astype(bf).astype(np.float64)).astype(np.float32)
    got = np.asarray(f(a, b))
    np.testing.assert_allclose(got, want.astype(bf).astype(np.float32), rtol=2 ** -7, atol=1e-3)
