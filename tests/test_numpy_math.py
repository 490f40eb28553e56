"""fnx.numpy_math (jax.numpy's math, NaN-aware reductions, statistics, polynomials, binning) against jax.numpy
(float32, the same promotion) and numpy in float64, eager, under fnx.jit and under fnx.vmap; gradients against
jax.grad; wrong inputs raise JAX's exception types.

Tolerances: exact for integers, bools and bit-level functions (frexp, ldexp, nextafter, signbit, copysign);
float32 rtol 2e-6 / atol 1e-6 for elementwise math, 1e-5 for reductions and products; float16 1e-2.
"""
import math

import numpy as np
import pytest

import fnx
import fnx.numpy as fnp

jax = pytest.importorskip("jax")
jnp = jax.numpy

F32 = (2e-6, 1e-6)
RED = (1e-5, 1e-5)
F16 = (1e-2, 1e-2)
rng = np.random.default_rng(0)


def to_np(tree):
    return jax.tree_util.tree_map(np.asarray, tree, is_leaf=lambda x: hasattr(x, "shape"))


def close(got, want, tol=F32, dtype=True):
    """got (fnx) equals want (jax/numpy): same structure, shape and dtype; floats within tol (NaN == NaN)."""
    if isinstance(want, (tuple, list)):
        assert isinstance(got, (tuple, list)) and len(got) == len(want), (got, want)
        for g, w in zip(got, want): close(g, w, tol, dtype)
        return
    g, w = np.asarray(got), np.asarray(want)
    assert g.shape == w.shape, (g.shape, w.shape)
    if dtype: assert g.dtype == w.dtype, (g.dtype, w.dtype)
    if w.dtype.kind in "biu" and g.dtype.kind in "biu":
        np.testing.assert_array_equal(g, w)
    else:
        np.testing.assert_allclose(g.astype(np.float64), w.astype(np.float64), rtol=tol[0], atol=tol[1],
                                   equal_nan=True)


def check(name, *args, tol=F32, vmap=True, exact=False, **kw):
    """fnx.numpy.<name> vs jax.numpy.<name> on `args`: eager and under jit (numpy-array arguments traced, the
    others static); and under vmap over the first array argument stacked with its reverse."""
    f, j = getattr(fnp, name), getattr(jnp, name)
    tol = (0, 0) if exact else tol
    want = to_np(j(*args, **kw))
    traced = [i for i, a in enumerate(args) if isinstance(a, np.ndarray)]

    def call(*arrays, fill=None):
        merged = list(args)
        for i, a in zip(fill if fill is not None else traced, arrays): merged[i] = a
        return f(*merged, **kw)
    eager = call(*[fnp.asarray(args[i]) for i in traced])
    close(eager, want, tol)
    close(fnx.jit(call)(*[args[i] for i in traced]), to_np(eager), tol)
    batchable = [i for i in traced if args[i].ndim > 0]
    if vmap and batchable:
        i = batchable[0]
        stacked = np.stack([args[i], args[i][::-1]])
        batched = fnx.vmap(lambda x: call(x, fill=[i]))(stacked)
        for b in range(2):
            row = to_np(j(*[stacked[b] if k == i else a for k, a in enumerate(args)], **kw))
            close(jax.tree_util.tree_map(lambda x: np.asarray(x)[b], batched), row, tol)
    return eager


def grad_check(name, *args, argnum=0, tol=(1e-4, 1e-5), **kw):
    """fnx.grad of sum(f(...)) against jax.grad, eager and under jit."""
    f, j = getattr(fnp, name), getattr(jnp, name)

    def loss_f(*a): return fnp.sum(f(*a, **kw))

    def loss_j(*a): return jnp.sum(j(*a, **kw))
    want = np.asarray(jax.grad(loss_j, argnums=argnum)(*args))
    close(fnx.grad(loss_f, argnums=argnum)(*args), want, tol)
    close(fnx.jit(fnx.grad(loss_f, argnums=argnum))(*args), want, tol)


SPECIAL = np.array([0.0, -0.0, 1.0, -1.0, 0.5, -2.5, 3.0, 1e-30, -1e30, np.inf, -np.inf, np.nan], np.float32)


def floats(shape, lo=-5, hi=5, dtype=np.float32):
    return rng.uniform(lo, hi, shape).astype(dtype)


# ---- elementwise ----

UNARY = ["sinc", "deg2rad", "radians", "rad2deg", "degrees", "cbrt", "signbit", "isposinf", "isneginf", "nan_to_num",
         "arcsinh", "arccosh", "arctanh", "i0"]
BINARY = ["logaddexp", "logaddexp2", "hypot", "copysign", "float_power", "fmax", "fmin", "fmod", "heaviside",
          "nextafter", "divmod"]


@pytest.mark.parametrize("name", UNARY)
def test_unary_float32_specials_and_shapes(name):
    exact = name in ("signbit", "isposinf", "isneginf", "nan_to_num", "deg2rad", "rad2deg", "radians", "degrees")
    tol = (5e-6, 1e-6) if name == "i0" else F32
    check(name, SPECIAL, exact=exact, tol=tol)
    for shape in [(), (0,), (3, 0), (2, 3, 4)]:
        lo = 1.0 if name == "arccosh" else (-0.99 if name == "arctanh" else -20)
        hi = 0.99 if name == "arctanh" else 20
        check(name, floats(shape, lo, hi), exact=exact, tol=tol)


@pytest.mark.parametrize("name", UNARY)
def test_unary_other_dtypes(name):
    for x in [np.array([-3, 0, 2, 7], np.int32), np.array([0.5, -1.5, 2.0, 100.0], np.float16)]:
        if name == "arccosh": x = np.abs(x) + x.dtype.type(1)
        if name == "arctanh": x = (x / x.dtype.type(200)).astype(x.dtype)
        check(name, x, tol=F16 if x.dtype == np.float16 else F32)
    check(name, np.array([True, False]), tol=F32)
    check(name, 2.0, vmap=False)  # a weakly typed Python scalar stays float32 and weak


def test_unary_float64_reference():
    x = np.geomspace(1e-6, 1e6, 200)
    x = np.concatenate([x, -x]).astype(np.float32)
    x64 = x.astype(np.float64)
    close(fnp.cbrt(x), np.cbrt(x64).astype(np.float32), (1.2e-7, 0))  # correctly rounded but for ties
    close(fnp.arcsinh(x), np.arcsinh(x64).astype(np.float32), (3e-7, 0))
    close(fnp.hypot(x, x[::-1]), np.hypot(x64, x64[::-1]).astype(np.float32), (2.5e-7, 0))
    close(fnp.logaddexp(x, x[::-1]), np.logaddexp(x64, x64[::-1]).astype(np.float32), (3e-7, 1e-30))
    y = np.linspace(-700, 700, 301)
    y32 = y.astype(np.float32)
    close(fnp.i0(y32), np.i0(y32.astype(np.float64)).astype(np.float32), (1e-6, 0))
    with fnx.enable_x64():  # float64 inputs stay float64 with x64 on
        close(fnp.i0(y), np.i0(y), (1e-13, 0))
        close(fnp.cbrt(x64), np.cbrt(x64), (4.5e-16, 0))  # within 2 ulp (1.7 ulp seen on some CPUs)
        close(fnp.frexp(x64), np.frexp(x64), (0, 0))


@pytest.mark.parametrize("name", BINARY)
def test_binary_specials_broadcast_dtypes(name):
    a = np.repeat(SPECIAL, len(SPECIAL))
    b = np.tile(SPECIAL, len(SPECIAL))
    exact = name in ("copysign", "fmax", "fmin", "nextafter", "heaviside", "fmod", "divmod")
    check(name, a, b, exact=exact, tol=(4e-6, 1e-6))
    check(name, floats((2, 1, 3)), floats((4, 1)), exact=exact)
    check(name, floats((0, 3)), floats((3,)), exact=exact)
    check(name, np.array([5, -5, 7, 0], np.int32), np.array([3, 3, -2, 4], np.int32), exact=exact)
    check(name, floats((3,)).astype(np.float16), 2.0, tol=F16, vmap=False)
    check(name, 1.5, 2, vmap=False, exact=exact)


def test_ldexp_frexp_exact():
    x = np.concatenate([SPECIAL, np.array([1e-45, -3e-40, 3.4e38, 1.17e-38], np.float32)])
    e = np.array([-200, -150, -126, -1, 0, 1, 127, 128, 300, 5, -5, 2, 3, 4, 1, 0], np.int32)
    normal = np.abs(x) >= np.finfo(np.float32).tiny
    check("ldexp", x[normal], e[normal], exact=True)  # (JAX's ldexp is off for subnormal x: numpy is the oracle)
    close(fnp.ldexp(x[:, None], e[None, :]), np.ldexp(x[:, None], e[None, :]), (0, 0))
    close(fnx.jit(fnp.ldexp)(x, e), np.ldexp(x, e), (0, 0))
    check("frexp", x[normal], exact=True)
    close(fnp.frexp(x), np.frexp(x), (0, 0))  # (JAX's frexp is off for some subnormals)
    check("frexp", floats((2, 3)).astype(np.float16), exact=True)
    check("frexp", np.array([1, -4, 0], np.int32), exact=True)
    m, ex = fnp.frexp(x)
    close(fnp.ldexp(m, ex), x, (0, 0))
    with pytest.raises(ValueError, match="ldexp"):
        fnp.ldexp(np.ones(2, np.float32), np.ones(2, np.float32))


def test_nextafter_steps_one_ulp():
    x = floats((50,), -1e3, 1e3)
    check("nextafter", x, np.full(50, np.inf, np.float32), exact=True)
    check("nextafter", np.float32([0, -0.0, 1e-45]), np.float32([-1, 1, 0]), exact=True)
    check("nextafter", x.astype(np.float16), np.float16(0), exact=True)


def test_modf_gcd_lcm_bitwise():
    check("modf", SPECIAL, exact=True)
    check("modf", np.array([3, -4], np.int32), exact=True)
    a = rng.integers(-10**6, 10**6, 60).astype(np.int32)
    b = rng.integers(-10**6, 10**6, 60).astype(np.int32)
    b[:5] = 0
    a[3:7] = 0
    for name in ("gcd", "lcm"):
        check(name, a % 10000, b % 10000, exact=True)
        check(name, np.array([832040, 0, -7], np.int32), np.array([514229, 0, 7], np.int32), exact=True)
        check(name, a.astype(np.int8), np.int8(6), exact=True, vmap=False)
        with pytest.raises(ValueError, match=name):
            getattr(fnp, name)(np.ones(2, np.float32), np.ones(2, np.float32))
    for dt in (np.int8, np.int32, np.uint8):  # the type's extremes (numpy the oracle: JAX's gcd loops forever on
        info = np.iinfo(dt)                   # MIN); |MIN| wraps to MIN, and gcd(-127, -128) came out -1
        vals = np.array(sorted({info.min, info.min + 1, 0, 1, 6, info.max - 1, info.max} |
                               ({-7, -6, -1} if info.min else set())), dt)
        x1, x2 = (m.ravel() for m in np.meshgrid(vals, vals))
        for name in ("gcd", "lcm"):
            for f in (getattr(fnp, name), fnx.jit(getattr(fnp, name))):
                np.testing.assert_array_equal(np.asarray(f(x1, x2)), getattr(np, name)(x1, x2))
    check("bitwise_count", np.array([-3, 7, 0, -128, 127], np.int8), exact=True)
    check("bitwise_count", np.array([2**31 - 1, -2**31, 5], np.int32), exact=True)
    check("bitwise_count", np.array([255, 0], np.uint8), exact=True)
    for name in ("bitwise_invert", "bitwise_left_shift", "bitwise_right_shift"):
        assert getattr(fnp, name) is not None
    close(fnp.bitwise_left_shift(np.int32([1, 2]), 3), np.int32([8, 16]), (0, 0))
    with pytest.raises(TypeError):
        fnp.bitwise_count(np.ones(2, np.float32))


def test_closeness_and_equality():
    a = np.array([1.0, np.nan, np.inf, -np.inf, 1e-9, 1.0], np.float32)
    b = np.array([1.0 + 1e-6, np.nan, np.inf, np.inf, 0.0, 1.1], np.float32)
    for eq in (False, True):
        check("isclose", a, b, exact=True, equal_nan=eq)
        check("allclose", a[[0, 4]], b[[0, 4]], exact=True, vmap=False, equal_nan=eq)
        check("array_equal", a, a, exact=True, vmap=False, equal_nan=eq)
    check("isclose", np.array([1, 2], np.int32), np.array([1, 3], np.int32), exact=True)
    check("isclose", a, b, exact=True, rtol=0.2, atol=0.0)
    assert not bool(fnp.array_equal(np.ones(2), np.ones(3)))
    assert bool(fnp.array_equal(np.ones((2, 0)), np.ones((2, 0))))
    assert not bool(fnp.allclose(a, b))
    check("array_equiv", np.ones((2, 3), np.float32), np.ones(3, np.float32), exact=True, vmap=False)
    check("array_equiv", np.ones((2, 3), np.float32), np.zeros(3, np.float32), exact=True, vmap=False)
    with pytest.raises(TypeError):
        fnp.array_equiv(np.ones(2), np.ones(3))


# ---- NaN-aware reductions ----

NAN_REDUCTIONS = ["nansum", "nanprod", "nanmax", "nanmin", "nanmean", "nanvar", "nanstd", "nanargmax", "nanargmin"]


def _with_nans(shape, frac=0.3):
    x = floats(shape)
    x[rng.random(shape) < frac] = np.nan
    return x


@pytest.mark.parametrize("name", NAN_REDUCTIONS)
def test_nan_reductions(name):
    x = _with_nans((3, 4, 5))
    x[0, 0, :] = np.nan  # an all-NaN slice
    arg = name.startswith("nanarg")
    for axis in ([None, 0, -1, 1] if arg else [None, 0, -1, (0, 2)]):
        check(name, x, axis=axis, tol=RED)
        check(name, x, axis=axis, keepdims=True, tol=RED)
    check(name, np.array([1, 5, 2], np.int32), tol=RED)
    check(name, np.float32(2.5), tol=RED, vmap=False)
    check(name, _with_nans((4, 3)).astype(np.float16), axis=0, tol=F16)
    if not arg and name not in ("nanmax", "nanmin"):
        check(name, np.zeros((0, 3), np.float32), axis=0, tol=RED)
    if name in ("nanvar", "nanstd"):
        check(name, x, axis=1, ddof=1, tol=RED)
        check(name, x, axis=2, ddof=4, tol=RED)
    if name in ("nansum", "nanmean", "nanmax", "nanmin", "nanprod"):
        mask = rng.random((3, 4, 5)) < 0.7
        extra = {"initial": -100.0} if name in ("nanmax", "nanmin") else {}
        check(name, x, axis=1, where=mask, tol=RED, **extra)
    if name in ("nanmax", "nanmin"):
        with pytest.raises(ValueError):
            getattr(fnp, name)(np.zeros((0,), np.float32))


@pytest.mark.parametrize("name", ["nancumsum", "nancumprod", "cumulative_sum", "cumulative_prod"])
def test_cumulative(name):
    x = _with_nans((3, 4)) if name.startswith("nan") else floats((3, 4), -2, 2)
    for axis in (0, -1):
        check(name, x, axis=axis, tol=RED)
    if name.startswith("nan"):
        check(name, x, tol=RED)
        check(name, np.array([1, 2, 3], np.int8), exact=True)
    else:
        check(name, x[0], tol=RED)
        check(name, x, axis=1, include_initial=True, tol=RED)
        check(name, np.array([True, True, False]), exact=True)
        check(name, np.array([1, 2, 3], np.int8), exact=True, include_initial=True)
        check(name, np.zeros((2, 0), np.float32), axis=1, include_initial=True)
        with pytest.raises(ValueError):
            getattr(fnp, name)(np.ones((2, 2), np.float32))


def test_nan_reduction_grads_ignore_nans():
    x = _with_nans((4, 5))
    x[1, 2] = x[1, 3] = 7.0  # a tie in nanmax
    for name in ("nansum", "nanmean", "nanvar", "nanstd", "nanmax", "nanmin", "nanprod", "nancumsum"):
        kw = {} if name in ("nancumsum",) else {"axis": 1}
        grad_check(name, x, **kw)


# ---- statistics ----

def test_ptp_count_nonzero_average():
    x = floats((3, 4, 2))
    for axis in (None, 0, -1, (0, 2)):
        check("ptp", x, axis=axis, tol=RED)
        check("count_nonzero", np.round(x), axis=axis, exact=True)
        check("average", x, axis=axis, tol=RED)
        check("average", x, axis=axis, returned=True, tol=RED)
    check("ptp", np.array([1, 5], np.int8), exact=True)
    check("count_nonzero", np.array([True, False, True]), exact=True)
    w = floats((3, 4, 2), 0.1, 2)
    check("average", x, weights=w, tol=RED)
    check("average", x, axis=1, weights=w[0, :, 0], returned=True, keepdims=True, tol=RED)
    check("average", np.array([1, 2, 3], np.int32), weights=np.array([1, 0, 1], np.int32), tol=RED)
    with pytest.raises(ValueError):
        fnp.average(x, weights=w[0, :, 0])
    with pytest.raises(ValueError):
        fnp.average(x, axis=0, weights=w[0, :, 0])
    close(fnx.grad(lambda v: fnp.sum(fnp.average(x, 1, v) ** 2))(w),
          jax.grad(lambda v: jnp.sum(jnp.average(x, 1, v) ** 2))(w), RED)
    grad_check("ptp", x, axis=0)


def test_cov_corrcoef():
    m = floats((3, 7))
    y = floats((2, 7))
    fw = rng.integers(1, 4, 7).astype(np.int32)
    aw = floats((7,), 0.5, 2)
    check("cov", m, tol=RED, vmap=False)
    check("cov", m, y, tol=RED, vmap=False)
    check("cov", m.T, rowvar=False, tol=RED, vmap=False)
    check("cov", m, bias=True, tol=RED, vmap=False)
    check("cov", m, ddof=2, fweights=fw, aweights=aw, tol=RED, vmap=False)
    check("cov", m, fweights=fw, tol=RED, vmap=False)
    check("cov", m, aweights=aw, tol=RED, vmap=False)
    check("cov", m[0], tol=RED, vmap=False)
    check("cov", np.array([[1, 2, 4], [1, 3, 2]], np.int32), tol=RED, vmap=False)
    check("corrcoef", m, tol=RED, vmap=False)
    check("corrcoef", m, y, tol=RED, vmap=False)
    check("corrcoef", m[0], tol=RED, vmap=False)
    close(fnp.cov(m, ddof=0), np.cov(m.astype(np.float64), ddof=0), RED, dtype=False)
    batched = fnx.vmap(fnp.cov)(np.stack([m, y[:, :7].repeat(2, 0)[:3]]))
    close(batched[0], np.cov(m), RED, dtype=False)
    with pytest.raises(ValueError):
        fnp.cov(np.ones((2, 2, 2)))


# ---- products ----

def test_cross_kron_vecdot_matvec_vecmat():
    a3, b3, a2, b2 = floats((4, 3)), floats((3,)), floats((4, 2)), floats((2,))
    for a, b in [(a3, b3), (a2, b2), (a3, b2), (a2, b3)]:
        check("cross", a, b, tol=RED)
    check("cross", floats((3, 5)), floats((5, 3)), axisa=0, axisb=1, axisc=0, tol=RED, vmap=False)
    check("cross", floats((3, 2)), floats((3, 2)), axis=0, tol=RED, vmap=False)
    check("cross", np.array([1, 2, 3], np.int32), np.array([4, 5, 6], np.int32), exact=True)
    with pytest.raises(ValueError):
        fnp.cross(floats((4,)), floats((4,)))
    for a, b in [(floats((2, 3)), floats((3, 1, 2))), (floats((2,)), floats((3,))), (np.float32(2), floats((2, 2))),
                 (np.arange(4, dtype=np.int32).reshape(2, 2), np.ones((0, 3), np.int32))]:
        check("kron", a, b, tol=RED, vmap=False)
    check("vecdot", floats((2, 1, 5)), floats((3, 5)), tol=RED)
    check("vecdot", floats((5, 2)), floats((5, 2)), axis=0, tol=RED)
    check("vecdot", np.ones((2, 3), np.int8), np.ones(3, np.int8), exact=True)
    check("matvec", floats((2, 3, 4)), floats((4,)), tol=RED)
    check("matvec", floats((3, 4)), floats((2, 4)), tol=RED)
    check("vecmat", floats((4,)), floats((2, 4, 3)), tol=RED)
    check("vecmat", floats((2, 4)), floats((4, 3)), tol=RED)
    with pytest.raises(ValueError):
        fnp.vecdot(floats((3,)), floats((4,)))
    grad_check("cross", a3, b3, argnum=1)
    grad_check("kron", floats((2, 3)), floats((2,)), argnum=0)
    grad_check("vecdot", floats((2, 3)), floats((3,)), argnum=1)
    grad_check("matvec", floats((2, 3)), floats((3,)))


# ---- differences and integrals ----

def test_diff_ediff1d_gradient_trapezoid_unwrap():
    x = floats((3, 5))
    for n in (0, 1, 2, 6):
        check("diff", x, n=n, tol=RED)
    check("diff", x, axis=0, prepend=0.5, append=np.ones((1, 5), np.float32), tol=RED)
    check("diff", np.array([True, False, False]), exact=True)
    check("diff", np.array([1, 5, 2], np.uint8), exact=True)
    check("diff", np.zeros((0,), np.float32))
    with pytest.raises(ValueError):
        fnp.diff(np.float32(1))
    with pytest.raises(ValueError):
        fnp.diff(x, n=-1)
    check("ediff1d", np.array([[1, 2], [4, 8]], np.int32), exact=True, to_begin=0, to_end=np.array([7, 9]))
    check("ediff1d", x, tol=RED)
    check("gradient", x, tol=RED, vmap=False)
    check("gradient", x[0], 0.5, tol=RED)
    check("gradient", x, 2.0, axis=-1, tol=RED)
    coords = np.cumsum(floats((5,), 0.1, 1))
    check("gradient", x, 1.0, coords, tol=(1e-4, 1e-4), vmap=False)
    check("gradient", x, axis=(0,), tol=RED)
    check("gradient", np.array([1, 2, 4, 8], np.int32), tol=RED)
    with pytest.raises(NotImplementedError):
        fnp.gradient(x, edge_order=2)
    with pytest.raises(ValueError):
        fnp.gradient(np.ones((1, 3), np.float32))
    check("trapezoid", x, tol=RED)
    check("trapezoid", x, dx=0.3, axis=0, tol=RED)
    check("trapezoid", x, coords, tol=RED)
    check("trapezoid", x, np.cumsum(floats((3, 5), 0, 1), axis=0), axis=0, tol=RED)
    check("trapezoid", np.array([1, 2, 3], np.int32), tol=RED)
    p = np.cumsum(floats((20,), -4, 4))
    check("unwrap", p, tol=(1e-5, 1e-4))
    check("unwrap", p.reshape(4, 5), axis=0, tol=(1e-5, 1e-4), discont=4.0)
    check("unwrap", p, period=3.0, tol=(1e-5, 1e-4))
    grad_check("diff", x, n=2)
    grad_check("gradient", x[0])
    grad_check("trapezoid", x, coords, argnum=1)


# ---- polynomials and convolution ----

def test_polynomials():
    p, q = floats((4,)), floats((2,))
    x = floats((3, 2))
    check("polyval", p, x, tol=RED)
    check("polyval", np.array([1, 2], np.int32), np.array([3, 4], np.int32), exact=True)
    check("polyval", floats((3, 2)), floats((2,)), tol=RED)
    for name in ("polyadd", "polysub", "polymul"):
        check(name, p, q, tol=RED)
        check(name, q, p, tol=RED)
        check(name, np.array([1, 2], np.int32), np.array([1], np.int32), tol=RED)
    a, b = np.array([0.0, 0, 1, 2], np.float32), np.array([0.0, 3], np.float32)
    close(fnp.polymul(a, b, trim_leading_zeros=True), jnp.polymul(a, b, trim_leading_zeros=True))
    with pytest.raises(fnx.errors.ConcretizationError):
        fnx.jit(lambda u: fnp.polymul(u, b, trim_leading_zeros=True))(a)
    for m in (0, 1, 2, 5):
        check("polyder", p, m=m, tol=RED)
        check("polyint", p, m=m, tol=RED)
    check("polyder", np.array([1, 2, 3], np.int32), tol=RED)
    check("polyint", p, m=2, k=np.array([1.0, 2.0], np.float32), tol=RED, vmap=False)
    check("polyint", p, m=2, k=3.0, tol=RED)
    for N, inc in [(None, False), (5, True), (0, False), (1, True)]:
        check("vander", p, N=N, increasing=inc, tol=RED)
    check("vander", np.array([1, 2, 3], np.int32), exact=True)
    with pytest.raises(ValueError):
        fnp.vander(floats((2, 2)))
    with pytest.raises(ValueError):
        fnp.polyder(p, m=-1)
    grad_check("polyval", p, x, argnum=0)
    grad_check("polyval", p, x, argnum=1)
    grad_check("polymul", p, q)
    grad_check("polyint", p, m=2)


@pytest.mark.parametrize("name", ["convolve", "correlate"])
def test_convolve_correlate(name):
    for n, m in [(7, 3), (3, 7), (5, 5), (1, 4), (6, 1), (4, 2), (2, 5)]:
        a, v = floats((n,)), floats((m,))
        for mode in ("full", "same", "valid"):
            check(name, a, v, mode, tol=RED)
            np_want = getattr(np, name)(a.astype(np.float64), v.astype(np.float64), mode)
            close(getattr(fnp, name)(a, v, mode), np_want, RED, dtype=False)
    check(name, np.array([1, 2, 3], np.int32), np.array([1, 1], np.int32), tol=RED)
    with pytest.raises(ValueError):
        getattr(fnp, name)(floats((0,)), floats((3,)))
    with pytest.raises(ValueError):
        getattr(fnp, name)(floats((2, 3)), floats((3,)))
    with pytest.raises(ValueError):
        getattr(fnp, name)(floats((3,)), floats((3,)), "bogus")
    grad_check(name, floats((6,)), floats((3,)), mode="same")
    grad_check(name, floats((6,)), floats((3,)), argnum=1)


def test_piecewise():
    x = floats((3, 4))
    conds = [x < -1, (x >= -1) & (x < 2)]
    check("piecewise", x, conds, [lambda t: -t, lambda t: t * t, 5.0], vmap=False)
    check("piecewise", x, conds, [np.float32(1), lambda t: fnp.sin(t) if isinstance(t, fnx.Array) else jnp.sin(t)],
          vmap=False)
    check("piecewise", np.array([-2, 0, 3], np.int32), [np.array([True, False, True])], [lambda t: t * 2, 7],
          exact=True, vmap=False)
    with pytest.raises(ValueError):
        fnp.piecewise(x, conds, [1.0])
    f = fnx.vmap(lambda t: fnp.piecewise(t, [t < 0], [lambda s: -s, lambda s: s * 3]))
    close(f(x), np.where(x < 0, -x, 3 * x), F32)
    g = fnx.grad(lambda t: fnp.sum(fnp.piecewise(t, [t < 0], [lambda s: s * s, lambda s: 3 * s])))(x)
    close(g, np.where(x < 0, 2 * x, 3.0), F32)


# ---- counting, binning, interpolation ----

def test_bincount():
    x = rng.integers(-2, 9, 40).astype(np.int32)
    w = floats((40,))
    check("bincount", x, length=6, exact=True)
    check("bincount", x, w, length=10, tol=RED)
    for v, kw in [(np.abs(x), {}), (np.abs(x), {"minlength": 20}), (np.zeros((0,), np.int32), {"minlength": 3})]:
        close(fnp.bincount(v, **kw), jnp.bincount(v, **kw), (0, 0))
    close(fnx.jit(lambda v: fnp.bincount(v, length=12))(np.abs(x)), np.bincount(np.abs(x), minlength=12), (0, 0),
          dtype=False)
    with pytest.raises(fnx.errors.ConcretizationError):
        fnx.jit(fnp.bincount)(np.abs(x))
    with pytest.raises(TypeError):
        fnp.bincount(w)
    with pytest.raises(ValueError):
        fnp.bincount(np.ones((2, 2), np.int32))
    grad_check("bincount", np.abs(x), w, argnum=1, length=10)


def test_digitize_histogram_interp():
    bins = np.array([-2.0, -0.5, 0.0, 1.0, 3.0], np.float32)
    x = np.concatenate([floats((30,)), bins, [np.nan, np.inf, -np.inf]]).astype(np.float32)
    for right in (False, True):
        check("digitize", x, bins, right=right, exact=True)
        check("digitize", x, bins[::-1].copy(), right=right, exact=True)
        close(fnp.digitize(x, bins, right=right), np.digitize(x, bins, right=right), (0, 0), dtype=False)
    check("digitize", np.array([1, 5, 3], np.int32), np.array([0, 2, 4], np.int32), exact=True)
    check("digitize", x, np.zeros((0,), np.float32), exact=True)
    data = floats((50,))
    for bins_arg, rng_arg in [(10, None), (3, (-1.0, 2.0)), (np.array([-3.0, 0.0, 0.5, 4.0], np.float32), None)]:
        check("histogram", data, bins_arg, rng_arg, tol=RED, vmap=not isinstance(bins_arg, np.ndarray))
        if rng_arg is not None:
            check("histogram", data, bins_arg, rng_arg, weights=floats((50,), 0, 1), density=True, tol=RED,
                  vmap=False)
        counts, edges = np.histogram(data.astype(np.float64), bins_arg, rng_arg)
        close(fnp.histogram(data, bins_arg, rng_arg)[0], counts, (0, 0), dtype=False)
    check("histogram_bin_edges", data, 4, tol=RED, vmap=False)
    check("histogram", np.array([2.0, 2.0], np.float32), 2, tol=RED, vmap=False)
    check("histogram", np.array([1, 2, 2, 7], np.int32), 3, tol=RED, vmap=False)
    xp = np.cumsum(floats((8,), 0.1, 1))
    fp = floats((8,))
    xs = floats((3, 20), -1, 8)
    check("interp", xs, xp, fp, tol=RED)
    check("interp", xs, xp, fp, left=-7.0, right=9.0, tol=RED)
    check("interp", xs, xp, fp, left="extrapolate", right="extrapolate", tol=(1e-5, 1e-4))
    check("interp", np.float32(0.3), np.array([0.0, 1.0], np.float32), np.array([1, 3], np.int32), tol=RED,
          vmap=False)
    close(fnp.interp(xs, xp, fp), np.interp(xs.astype(np.float64), xp, fp), RED, dtype=False)
    with pytest.raises(ValueError):
        fnp.interp(xs, xp, fp[:-1])
    with pytest.raises(ValueError):
        fnp.digitize(x, np.ones((2, 2), np.float32))
    grad_check("interp", xs, xp, fp, argnum=0)
    grad_check("interp", xs, xp, fp, argnum=2)


# ---- gradients of the elementwise functions ----

@pytest.mark.parametrize("name", ["logaddexp", "logaddexp2", "hypot", "copysign", "fmax", "fmin", "float_power",
                                  "fmod", "heaviside"])
def test_binary_grads(name):
    a, b = floats((3, 4), 0.5, 3), floats((4,), -3, -0.5)
    grad_check(name, a, b, argnum=0)
    grad_check(name, a, b, argnum=1)


@pytest.mark.parametrize("name", ["sinc", "cbrt", "deg2rad", "rad2deg", "arcsinh", "arccosh", "arctanh", "i0",
                                  "nan_to_num"])
def test_unary_grads(name):
    x = floats((10,), 1.1, 3) if name == "arccosh" else floats((10,), -0.9, 0.9) if name == "arctanh" \
        else floats((10,), -30, 30)
    grad_check(name, x)


def _pairs(make):
    """(fnx function, jax function) from one recipe written against a numpy-like module."""
    return make(fnp), make(jnp)


def test_special_point_grads_match_jax():
    recipes = [(lambda m: lambda t: m.logaddexp(t, -np.inf), -np.inf),
               (lambda m: lambda t: m.logaddexp(t, 1.0), -np.inf),
               (lambda m: lambda t: m.logaddexp(t, t), 2.0), (lambda m: lambda t: m.logaddexp2(t, np.inf), np.inf),
               (lambda m: m.sinc, 0.0), (lambda m: m.cbrt, 0.0), (lambda m: lambda t: m.fmax(t, 1.0), 1.0),
               (lambda m: m.i0, 0.0), (lambda m: lambda t: m.hypot(t, 2.0), 0.0),
               (lambda m: lambda t: m.nanmax(m.stack([t, t, 1.0])), 1.0)]
    for make, x in recipes:
        f, jf = _pairs(make)
        close(fnx.grad(f)(np.float32(x)), jax.grad(jf)(np.float32(x)), (1e-6, 1e-6), dtype=False)
    close(fnx.grad(fnx.grad(fnp.sinc))(np.float32(0)), jax.grad(jax.grad(jnp.sinc))(np.float32(0)), (1e-6, 1e-6))
    close(fnx.grad(fnx.grad(fnp.sinc))(np.float32(0.3)), jax.grad(jax.grad(jnp.sinc))(np.float32(0.3)), (1e-4, 1e-5))


def test_vmap_of_grad_and_grad_of_vmap():
    a, b = floats((4, 3)), floats((4, 3))
    loss = lambda x, y: fnp.sum(fnp.logaddexp(x, y) * fnp.hypot(x, y))  # noqa: E731
    jloss = lambda x, y: jnp.sum(jnp.logaddexp(x, y) * jnp.hypot(x, y))  # noqa: E731
    close(fnx.vmap(fnx.grad(loss))(a, b), jax.vmap(jax.grad(jloss))(a, b), RED)
    want = jax.grad(lambda x: jnp.sum(jax.vmap(jnp.nanvar)(x)))(a)
    close(fnx.grad(lambda x: fnp.sum(fnx.vmap(fnp.nanvar)(x)))(a), want, RED)


def test_errors_name_the_function():
    with pytest.raises(ValueError, match="gcd"):
        fnp.gcd(1.0, 2.0)
    with pytest.raises(TypeError, match="bincount"):
        fnp.bincount(np.ones(3, np.float32))
    with pytest.raises(ValueError, match="convolve"):
        fnp.convolve(np.ones((2, 2), np.float32), np.ones(2, np.float32))
    with pytest.raises(TypeError, match="hypot"):
        fnp.hypot(np.ones(2), np.ones(3))
    with pytest.raises(ValueError, match="cumulative_sum"):
        fnp.cumulative_sum(np.ones((2, 2)))
    with pytest.raises(fnx.errors.UnsupportedError, match="interp"):
        fnp.interp(1.0, np.ones(2), np.ones(2), period=1.0)
    assert math.isnan(float(fnp.nanmean(np.array([np.nan], np.float32))))


def test_eager_float_functions_trace_once_per_signature():
    """An eager exp / tanh / log1p (functions of many ops) runs as jit of itself, as JAX's do: a second call with
    other values of the same shapes traces nothing, and Python numbers are weakly typed arguments, not constants
    (`exp(0.5)` then `exp(1.5)` trace once). Each eager call traced all the ops again: exp of 1,024 floats took
    1.3 ms a call. The values match numpy in float64, and the dtypes JAX's rules give."""
    from fnx import events
    rng = np.random.default_rng(11)
    x, y = (rng.standard_normal((3, 17, 5)).astype(np.float32) for _ in range(2))  # (a shape no other test uses)
    traces = []
    stop = events.listen(lambda e: traces.append(e.name) if e.cat == "trace" else None)
    try:
        first = [fnp.exp(fnp.asarray(x)), fnp.tanh(fnp.asarray(x)), fnp.log1p(fnp.abs(fnp.asarray(x))),
                 fnp.exp(np.float32(0.25)), fnp.exp(0.5), fnp.tanh(True)]
        before = len(traces)  # (the first calls traced each function once: a jit, not op by op)
        assert {"exp", "tanh", "log1p"} <= set(traces), traces
        second = [fnp.exp(fnp.asarray(y)), fnp.tanh(fnp.asarray(y)), fnp.log1p(fnp.abs(fnp.asarray(y))),
                  fnp.exp(np.float32(-3.0)), fnp.exp(1.5), fnp.tanh(False)]
        assert len(traces) == before, traces[before:]
    finally:
        stop()
    for a, b in zip(first, second): assert a.dtype == b.dtype == np.float32
    np.testing.assert_allclose(np.asarray(second[0]), np.exp(y.astype(np.float64)), rtol=2e-7)
    np.testing.assert_allclose(np.asarray(second[1]), np.tanh(y.astype(np.float64)), rtol=3e-7, atol=1e-7)
    np.testing.assert_allclose(np.asarray(second[2]), np.log1p(np.abs(y.astype(np.float64))), rtol=3e-7)
    np.testing.assert_allclose([float(second[3]), float(second[4]), float(second[5])],
                               [np.exp(-3.0), np.exp(1.5), 0.0], rtol=2e-7)
    assert second[4].weak_type and not second[3].weak_type  # (a Python float stays weakly typed)
    with fnx.disable_jit():  # op by op, the same values
        np.testing.assert_array_equal(np.asarray(fnp.exp(fnp.asarray(y))), np.asarray(second[0]))
