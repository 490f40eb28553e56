"""fnx/lax_ops.py: the jax.lax functions composed from fnx's primitives, against jax.lax (the oracle that defines
their semantics), scipy and numpy; eager, under jit and vmap, and their gradients against jax.grad."""
import numpy as np
import pytest

import fnx
from fnx import lax

jax = pytest.importorskip("jax")
jl = jax.lax
jnp = jax.numpy

RNG = np.random.default_rng(7)


def close(actual, expected, rtol=2e-6, atol=1e-6):
    a, e = np.asarray(actual), np.asarray(expected)
    assert a.shape == e.shape, (a.shape, e.shape)
    assert a.dtype == e.dtype, (a.dtype, e.dtype)
    if np.issubdtype(e.dtype, np.floating):
        np.testing.assert_allclose(a.astype(np.float64), e.astype(np.float64), rtol=rtol, atol=atol, equal_nan=True)
    else:
        np.testing.assert_array_equal(a, e)


def floats(shape, dtype=np.float32, low=-3.0, high=3.0):
    return RNG.uniform(low, high, size=shape).astype(dtype)


# ---- unary elementwise ops ----

# name, domain, relative tolerance in float32 (the oracle's own float32 error included)
UNARY = [("exp", (-5, 5), 2e-6), ("expm1", (-2, 2), 2e-6), ("log", (0.01, 50), 2e-6), ("log1p", (-0.9, 5), 2e-6),
         ("tanh", (-4, 4), 2e-6), ("logistic", (-8, 8), 2e-6), ("cos", (-6, 6), 2e-6), ("tan", (-1.4, 1.4), 4e-6),
         ("asin", (-0.99, 0.99), 2e-6), ("acos", (-0.99, 0.99), 2e-6), ("atan", (-9, 9), 2e-6),
         ("sinh", (-5, 5), 2e-6), ("cosh", (-5, 5), 2e-6), ("asinh", (-1e4, 1e4), 2e-6),
         ("acosh", (1, 1e4), 2e-6), ("atanh", (-0.99, 0.99), 2e-6), ("rsqrt", (0.01, 100), 2e-6),
         ("cbrt", (-1e3, 1e3), 2e-6), ("floor", (-9, 9), 0), ("ceil", (-9, 9), 0), ("round", (-9, 9), 0),
         ("is_finite", (-9, 9), 0), ("abs", (-9, 9), 0), ("sign", (-9, 9), 0), ("square", (-9, 9), 2e-7),
         ("erf", (-4, 4), 2e-6), ("erfc", (-2, 8), 4e-6), ("erf_inv", (-0.999, 0.999), 4e-6),
         ("lgamma", (-9.5, 30), 1e-5), ("digamma", (-9.5, 30), 1e-5), ("reciprocal", (0.1, 9), 2e-7)]


@pytest.mark.parametrize("name,domain,rtol", UNARY, ids=[u[0] for u in UNARY])
def test_unary_matches_jax(name, domain, rtol):
    x = floats((3, 17), low=domain[0], high=domain[1])
    if name in ("round", "floor", "ceil"): x[0, :4] = [0.5, -2.5, 1.5, -0.5]  # ties
    ours, theirs = getattr(lax, name)(x), getattr(jl, name)(x)
    close(ours, theirs, rtol=rtol, atol=rtol)
    close(getattr(lax, name)(x[:, :0]), getattr(jl, name)(x[:, :0]))  # empty
    close(getattr(lax, name)(x[0, 3]), getattr(jl, name)(x[0, 3]), rtol=rtol, atol=rtol)  # 0-d


SPECIAL = {"erf": "erf", "erfc": "erfc", "erf_inv": "erfinv", "lgamma": "gammaln", "digamma": "psi"}


@pytest.mark.parametrize("name", sorted(SPECIAL))
@pytest.mark.usefixtures("x64")
def test_special_functions_float64_against_scipy(name):
    special = pytest.importorskip("scipy.special")
    domain = {"erf_inv": (-0.9999, 0.9999), "erfc": (-3, 20), "erf": (-5, 5)}.get(name, (-20.5, 200))
    x = np.concatenate([RNG.uniform(*domain, 400), [0.0, 1e-300, -1e-12, 0.3, 0.7, 3.5]])
    if name in ("lgamma", "digamma"): x = np.concatenate([x, [1e-8, -0.5, -3.25, 1e6]])
    if name == "digamma": x = x[x != 0]  # (JAX gives NaN at 0, scipy -inf)
    expected = getattr(special, SPECIAL[name])(x)
    ours = np.asarray(getattr(lax, name)(x))
    assert ours.dtype == np.float64
    keep = np.abs(expected) > 1e-3 if name in ("lgamma", "digamma") else slice(None)  # (near roots: absolute)
    np.testing.assert_allclose(ours[keep], expected[keep], rtol=1e-12 if name != "erf_inv" else 5e-12)
    np.testing.assert_allclose(ours, expected, rtol=1e-12, atol=1e-13 if name in ("lgamma", "digamma") else 0)


def test_special_function_edges():
    close(lax.erf_inv(np.float32([1, -1, 1.5, np.nan])), np.float32([np.inf, -np.inf, np.nan, np.nan]))
    close(lax.lgamma(np.float32([0, -1, -2, np.inf])), jl.lgamma(np.float32([0, -1, -2, np.inf])))
    close(lax.digamma(np.float32([0, -1, -2, np.inf])), jl.digamma(np.float32([0, -1, -2, np.inf])))
    close(lax.erf(np.float32([np.inf, -np.inf, 0])), np.float32([1, -1, 0]))
    close(lax.cbrt(np.float32([0, -0.0, np.inf, -np.inf, -8, 1e-40])), jl.cbrt(np.float32([0, -0.0, np.inf, -np.inf,
                                                                                            -8, 1e-40])))
    close(lax.asinh(np.float32([3e38, -3e38, 0])), jl.asinh(np.float32([3e38, -3e38, 0])))
    close(lax.acosh(np.float32([3e38, 0.5])), jl.acosh(np.float32([3e38, 0.5])))


def test_unary_float16_rounds_like_jax():
    x = floats((40,), np.float16, -2, 2)
    for name in ("exp", "tanh", "asinh", "atanh", "cbrt", "erf", "erf_inv", "logistic", "round", "sign"):
        y = np.clip(x, -0.99, 0.99) if name in ("atanh", "erf_inv") else x
        ours, theirs = getattr(lax, name)(y), getattr(jl, name)(y)
        assert np.asarray(ours).dtype == np.float16, name
        np.testing.assert_allclose(np.asarray(ours, np.float32), np.asarray(theirs, np.float32), rtol=1e-3, atol=1e-3,
                                   err_msg=name)


def test_round_methods():
    x = np.float32([0.5, 1.5, 2.5, -0.5, -1.5, 0.49999997, 2.4, -7.7])
    for method in (0, 1, lax.RoundingMethod.TO_NEAREST_EVEN, lax.RoundingMethod.AWAY_FROM_ZERO):
        close(lax.round(x, method), jl.round(x, int(method)))
    close(lax.round(x, rounding_method=lax.RoundingMethod.TO_NEAREST_EVEN), np.round(x))


@pytest.mark.parametrize("name", ["exp", "log", "sin", "sqrt", "erf", "lgamma", "floor", "round", "is_finite",
                                  "logistic", "cbrt", "rsqrt"])
def test_float_only_unary_rejects_integers(name):
    with pytest.raises(TypeError, match=f"{name}.*int32"):
        getattr(lax, name)(np.int32([1, 2]))
    with pytest.raises(TypeError):
        getattr(jl, name)(np.int32([1, 2]))


def test_unary_dtype_rules():
    with pytest.raises(TypeError, match="abs.*uint32"): lax.abs(np.uint32([1]))
    with pytest.raises(TypeError, match="square.*bool"): lax.square(np.bool_([True]))
    with pytest.raises(TypeError, match="bitwise_not.*float32"): lax.bitwise_not(np.float32([1]))
    with pytest.raises(TypeError, match="population_count.*float32"): lax.population_count(np.float32([1]))
    close(lax.abs(np.int8([-3, 4, -128])), jl.abs(np.int8([-3, 4, -128])))
    close(lax.sign(np.int32([-3, 0, 5])), jl.sign(np.int32([-3, 0, 5])))
    close(lax.sign(np.uint32([0, 5])), jl.sign(np.uint32([0, 5])))
    close(lax.square(np.int8([3, -12])), jl.square(np.int8([3, -12])))
    close(lax.bitwise_not(np.array([True, False])), jl.bitwise_not(np.array([True, False])))
    close(lax.bitwise_not(np.uint32([0, 7])), jl.bitwise_not(np.uint32([0, 7])))
    out = lax.exp(2.0)
    assert out.weak_type and out.dtype == np.float32 and np.isclose(float(out), np.exp(2.0))


# ---- binary elementwise ops and the dtype rule ----

BINARY = ["add", "sub", "mul", "div", "rem", "max", "min", "atan2", "pow", "nextafter", "eq", "ne", "lt", "le",
          "gt", "ge"]


@pytest.mark.parametrize("name", BINARY)
@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_binary_float_matches_jax(name, dtype):
    x, y = floats((4, 5), dtype, 0.5, 3), floats((4, 5), dtype, -3, 3)
    y[0, :2] = x[0, :2]  # ties for the comparisons and min/max
    close(getattr(lax, name)(x, y), getattr(jl, name)(x, y), rtol=1e-3 if dtype == np.float16 else 3e-6)
    close(getattr(lax, name)(x[0, 0], y), getattr(jl, name)(x[0, 0], y), rtol=1e-3 if dtype == np.float16 else 3e-6)
    close(getattr(lax, name)(x[:0], y[:0]), getattr(jl, name)(x[:0], y[:0]))


@pytest.mark.parametrize("name", ["add", "sub", "mul", "div", "rem", "max", "min", "eq", "ne", "lt", "le", "gt", "ge",
                                  "bitwise_and", "bitwise_or", "bitwise_xor"])
@pytest.mark.parametrize("dtype", [np.int8, np.uint32, np.int32])
def test_binary_integer_matches_jax(name, dtype):
    info = np.iinfo(dtype)
    x = RNG.integers(builtin_max(info.min, -100), builtin_min(info.max, 100), (3, 7)).astype(dtype)
    y = RNG.integers(1, builtin_min(info.max, 50), (3, 7)).astype(dtype)
    if info.min < 0: y[0] = -y[0]
    close(getattr(lax, name)(x, y), getattr(jl, name)(x, y))


builtin_max, builtin_min = max, min


@pytest.mark.parametrize("name", ["max", "min", "eq", "ne", "lt", "le", "gt", "ge", "bitwise_and", "bitwise_or",
                                  "bitwise_xor"])
def test_binary_bool_matches_jax(name):
    x, y = np.array([True, True, False, False]), np.array([True, False, True, False])
    close(getattr(lax, name)(x, y), getattr(jl, name)(x, y))


@pytest.mark.parametrize("name", ["add", "sub", "mul", "div"])
def test_arithmetic_rejects_bool(name):
    with pytest.raises(TypeError, match=f"{name}.*bool"):
        getattr(lax, name)(np.array([True]), np.array([False]))


@pytest.mark.parametrize("name", BINARY + ["bitwise_and", "shift_left", "shift_right_logical", "select", "clamp"])
def test_mismatched_dtypes_are_a_type_error_naming_both(name):
    i32, f32 = np.ones(3, np.int32), np.ones(3, np.float32)
    args = {"select": (np.ones(3, bool), i32, f32), "clamp": (i32, f32, f32), "pow": (np.ones(3, np.float16), f32),
            "bitwise_and": (i32, np.ones(3, np.uint32)), "shift_left": (i32, np.ones(3, np.int8)),
            "shift_right_logical": (np.ones(3, np.uint8), i32)}.get(name, (i32, f32))
    with pytest.raises(TypeError) as ours:
        getattr(lax, name)(*args)
    with pytest.raises(TypeError):
        getattr(jl, name)(*args)
    for a in args[-2:]:
        assert str(a.dtype) in str(ours.value)


def test_mismatch_inside_jit_and_vmap():
    with pytest.raises(TypeError, match="int32, float32"):
        fnx.jit(lambda a, b: lax.add(a, b))(np.ones(3, np.int32), np.ones(3, np.float32))
    with pytest.raises(TypeError, match="float16, float32"):
        fnx.vmap(lax.mul)(np.ones(3, np.float16), np.ones(3, np.float32))


def test_python_scalars_are_weak():
    f16 = np.ones(3, np.float16)
    close(lax.add(np.ones(3, np.float32), 2.0), jl.add(np.ones(3, np.float32), 2.0))
    out = lax.mul(f16, 2.0)  # a weak float fits float16 (JAX 0.10 refuses; older JAX and jnp allow it)
    assert out.dtype == np.float16 and not out.weak_type
    close(lax.add(np.uint8([250]), 10), np.uint8([4]))
    both = lax.add(1.0, 2.0)
    assert both.weak_type and float(both) == 3.0
    with pytest.raises(TypeError, match="int32, float32"):
        lax.add(np.ones(3, np.int32), 2.5)
    with pytest.raises(TypeError, match="bool"):
        lax.add(np.ones(3, bool), 1)


def test_shapes_must_match():
    with pytest.raises(TypeError, match=r"add.*\[3\].*\[2, 3\]"):
        lax.add(np.ones(3, np.float32), np.ones((2, 3), np.float32))
    with pytest.raises(TypeError):
        jl.add(np.ones(3, np.float32), np.ones((2, 3), np.float32))


def test_pow_integer_exponent_and_integer_pow():
    x = floats((5,), np.float32, 0.5, 2)
    close(lax.pow(x, np.int32([0, 1, 2, -3, 5])), jl.pow(x, np.int32([0, 1, 2, -3, 5])), rtol=3e-6)
    close(lax.pow(x, 2), jl.pow(x, 2), rtol=3e-6)
    close(lax.integer_pow(np.int8([2, -3]), 3), jl.integer_pow(np.int8([2, -3]), 3))
    with pytest.raises(TypeError, match="pow.*int32"):
        lax.pow(np.int32([2]), np.int32([2]))


def test_nextafter_edges():
    x = np.float32([0, 0, 1, -1, 1, np.inf, np.nan, 3e38])
    y = np.float32([1, -1, 0, -2, 1, 0, 1, np.inf])
    close(lax.nextafter(x, y), jl.nextafter(x, y), rtol=0, atol=0)
    x64 = np.float64([1, -1, 0])
    with fnx.enable_x64():
        np.testing.assert_array_equal(np.asarray(lax.nextafter(x64, np.float64([2, 0, -1]))),
                                      np.nextafter(x64, np.float64([2, 0, -1])), strict=True)


@pytest.mark.parametrize("dtype", [np.int8, np.uint8, np.int32, np.uint32, np.int16])
def test_bit_ops_match_jax(dtype):
    info = np.iinfo(dtype)
    x = RNG.integers(info.min, info.max, 40, endpoint=True).astype(dtype)
    x[:3] = [0, info.max, info.min if info.min else 1]
    close(lax.population_count(x), jl.population_count(x))
    close(lax.clz(x), jl.clz(x))
    bits = 8 * np.dtype(dtype).itemsize
    s = np.arange(40).astype(dtype) % (bits + 3)  # includes shifts >= bits
    if info.min < 0: s[-3:] = -1
    for name in ("shift_left", "shift_right_logical", "shift_right_arithmetic"):
        close(getattr(lax, name)(x, s), getattr(jl, name)(x, s))


def test_select_n_and_clamp():
    cases = [floats((2, 3)) for _ in range(3)]
    which = np.int32([[0, 1, 2], [2, 0, 1]])
    close(lax.select_n(which, *cases), jl.select_n(which, *cases))
    mask = np.array([[True, False, True], [False, False, True]])
    close(lax.select_n(mask, *cases[:2]), jl.select_n(mask, *cases[:2]))
    close(lax.select_n(np.int32(1), *cases), jl.select_n(np.int32(1), *cases))
    close(lax.select(True, cases[0], cases[1]), jl.select(True, cases[0], cases[1]))
    close(lax.clamp(np.float32(-0.5), cases[0], np.float32(0.5)), jl.clamp(np.float32(-0.5), cases[0], np.float32(0.5)))
    close(lax.clamp(cases[1], cases[0], cases[2] + 3), jl.clamp(cases[1], cases[0], cases[2] + 3))
    close(lax.clamp(np.int8(0), np.int8([-5, 3, 9]), np.int8(4)), jl.clamp(np.int8(0), np.int8([-5, 3, 9]), np.int8(4)))
    with pytest.raises(TypeError, match="bool"):
        lax.select_n(np.array([True]), *[np.ones(1, np.float32)] * 3)


@pytest.mark.parametrize("bits", [(5, 10), (8, 7), (4, 3), (8, 23), (11, 52)])
def test_reduce_precision_matches_jax(bits):
    x = np.concatenate([floats(50, low=-70000, high=70000), floats(50, low=-1, high=1),
                        np.float32([0, -0.0, np.inf, -np.inf, np.nan, 1e-6, 6.1e-5, 65504, 65520, 3e38, 1.5])])
    close(lax.reduce_precision(x, *bits), jl.reduce_precision(x, *bits), rtol=0, atol=0)
    if bits == (5, 10):
        np.testing.assert_array_equal(np.asarray(lax.reduce_precision(x[50:100], *bits)),
                                      x[50:100].astype(np.float16).astype(np.float32))


# ---- transforms over the elementwise ops ----

GRAD_UNARY = [("exp", (-2, 2)), ("tanh", (-2, 2)), ("logistic", (-4, 4)), ("asinh", (-5, 5)), ("acosh", (1.2, 9)),
              ("atanh", (-0.9, 0.9)), ("cbrt", (0.2, 9)), ("erf", (-2, 2)), ("erfc", (-2, 2)), ("erf_inv", (-0.9, 0.9)),
              ("lgamma", (-3.7, 9)), ("digamma", (0.3, 9)), ("rsqrt", (0.3, 9)), ("tan", (-1, 1)), ("square", (-3, 3))]


@pytest.mark.parametrize("name,domain", GRAD_UNARY, ids=[g[0] for g in GRAD_UNARY])
def test_unary_grad_jit_vmap(name, domain):
    x = floats((6,), low=domain[0], high=domain[1])
    ours = fnx.grad(lambda v: getattr(lax, name)(v).sum())(x)
    theirs = jax.grad(lambda v: getattr(jl, name)(v).sum())(x)
    close(ours, theirs, rtol=3e-5, atol=1e-5)
    eager = np.asarray(getattr(lax, name)(x))
    np.testing.assert_array_equal(np.asarray(fnx.vmap(getattr(lax, name))(x)), eager)
    np.testing.assert_allclose(np.asarray(fnx.jit(getattr(lax, name))(x)), eager, rtol=1e-6, atol=1e-7)


def test_binary_grads():
    x, y = floats((5,), low=0.5, high=2), floats((5,), low=-2, high=2)
    for name in ("atan2", "pow", "max", "min", "div", "sub"):
        ours = fnx.grad(lambda a, b: getattr(lax, name)(a, b).sum(), (0, 1))(x, y)
        theirs = jax.grad(lambda a, b: getattr(jl, name)(a, b).sum(), (0, 1))(x, y)
        for o, t in zip(ours, theirs): close(o, t, rtol=1e-5, atol=1e-6)
    lo, hi = np.float32(-1), np.float32(1)
    close(fnx.grad(lambda v: lax.clamp(lo, v, hi).sum())(y), jax.grad(lambda v: jl.clamp(lo, v, hi).sum())(y))


def test_binary_under_jit_and_vmap():
    x, y = floats((4, 3)), floats((4, 3))
    for name in ("add", "atan2", "nextafter", "min", "le"):
        eager = np.asarray(getattr(lax, name)(x, y))
        np.testing.assert_array_equal(np.asarray(fnx.jit(getattr(lax, name))(x, y)), eager)
        np.testing.assert_array_equal(np.asarray(fnx.vmap(getattr(lax, name))(x, y)), eager)
    i = RNG.integers(-100, 100, (4, 3)).astype(np.int32)
    s = np.int32([[1, 2, 3]] * 4)
    np.testing.assert_array_equal(np.asarray(fnx.vmap(lax.shift_right_arithmetic, (0, None))(i, s[0])),
                                  np.asarray(jl.shift_right_arithmetic(i, s)))
    np.testing.assert_array_equal(np.asarray(fnx.jit(lax.population_count)(i)), np.asarray(jl.population_count(i)))


# ---- scans ----

def _affine(a, b):  # associative and not commutative
    return a[0] * b[0], a[1] * b[0] + b[1]


@pytest.mark.parametrize("n", [0, 1, 2, 5, 8, 13])
@pytest.mark.parametrize("reverse", [False, True])
def test_associative_scan_matches_jax(n, reverse):
    m, c = floats((3, n), low=0.5, high=1.5), floats((3, n))
    ours = lax.associative_scan(_affine, (m, c), reverse=reverse, axis=1)
    theirs = jl.associative_scan(_affine, (m, c), reverse=reverse, axis=1)
    for o, t in zip(ours, theirs): close(o, t, rtol=1e-5, atol=1e-5)
    d = {"a": floats((n, 2))}

    def ours_dict(x, y): return {"a": lax.add(x["a"], y["a"])}

    def theirs_dict(x, y): return {"a": jl.add(x["a"], y["a"])}
    close(lax.associative_scan(ours_dict, d, reverse=reverse)["a"],
          jl.associative_scan(theirs_dict, d, reverse=reverse)["a"], rtol=1e-5, atol=1e-5)


def test_associative_scan_grad_jit_vmap():
    m, c = floats((7,), low=0.5, high=1.5), floats((7,))
    for reverse in (False, True):
        def ours(m, c): return (lax.associative_scan(_affine, (m, c), reverse=reverse)[1] ** 2).sum()
        def theirs(m, c): return (jl.associative_scan(_affine, (m, c), reverse=reverse)[1] ** 2).sum()
        for o, t in zip(fnx.grad(ours, (0, 1))(m, c), jax.grad(theirs, (0, 1))(m, c)): close(o, t, 1e-5, 1e-5)
    eager = lax.associative_scan(lax.mul, m)
    np.testing.assert_allclose(np.asarray(fnx.jit(lambda v: lax.associative_scan(lax.mul, v))(m)), np.asarray(eager),
                               rtol=1e-6)
    batch = floats((3, 7))
    close(fnx.vmap(lambda v: lax.associative_scan(lax.add, v))(batch), jl.associative_scan(jl.add, batch, axis=1),
          rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("name", ["cumsum", "cumprod", "cummax", "cummin", "cumlogsumexp"])
@pytest.mark.parametrize("axis,reverse", [(0, False), (1, True), (1, False), (0, True)])
def test_cumulative_values_and_grads(name, axis, reverse):
    x = floats((5, 6), low=0.5, high=2) * np.where(RNG.random((5, 6)) < 0.5, -1, 1).astype(np.float32)
    close(getattr(lax, name)(x, axis=axis, reverse=reverse), getattr(jl, name)(x, axis=axis, reverse=reverse),
          rtol=1e-5, atol=1e-5)
    w = floats((5, 6))

    def ours(v): return (getattr(lax, name)(v, axis=axis, reverse=reverse) * w).sum()

    def theirs(v): return (getattr(jl, name)(v, axis=axis, reverse=reverse) * w).sum()
    close(fnx.grad(ours)(x), jax.grad(theirs)(x), rtol=1e-4, atol=1e-5)
    close(fnx.jit(ours)(x), ours(x), rtol=1e-5, atol=1e-5)  # (float32 sums: jit may fuse in another order)


@pytest.mark.parametrize("dtype", [np.int8, np.uint32, np.bool_, np.float16])
def test_cumulative_dtypes(dtype):
    x = RNG.integers(0, 2 if dtype == np.bool_ else 50, (3, 9)).astype(dtype)
    if dtype == np.bool_:
        with pytest.raises(TypeError, match="cummax.*bool"):
            lax.cummax(x)
        return
    for name in ("cummax", "cummin") + (("cumlogsumexp",) if dtype == np.float16 else ()):
        close(getattr(lax, name)(x, axis=1), getattr(jl, name)(x, axis=1), rtol=2e-3)
    close(lax.cummax(x[:, :0], axis=1), jl.cummax(x[:, :0], axis=1))
    close(lax.cummin(x, axis=-1), jl.cummin(x, axis=1))  # (fnx also takes negative axes)
    if dtype != np.float16:
        with pytest.raises(TypeError, match="cumlogsumexp"):
            lax.cumlogsumexp(x)


def test_cumlogsumexp_infinities():
    x = np.float32([-np.inf, -np.inf, 0.0, np.inf, 1.0])
    close(lax.cumlogsumexp(x), jl.cumlogsumexp(x))


def test_map_with_and_without_batches():
    xs = {"a": floats((7, 3)), "b": np.arange(7, dtype=np.int32)}

    def f(d): return d["a"].sum() * d["b"], d["a"] * 2

    theirs = jl.map(f, xs)
    for batch_size in (None, 1, 3, 7, 10):
        ours = lax.map(f, xs, batch_size=batch_size)
        for o, t in zip(ours, theirs): close(o, t, rtol=1e-6)
    jitted = fnx.jit(lambda v: lax.map(lambda r: lax.exp(r).sum(), v, batch_size=2))(xs["a"])
    close(jitted, np.exp(xs["a"]).sum(1), rtol=1e-5)
    g = fnx.grad(lambda v: lax.map(lambda r: (r * r).sum(), v, batch_size=3).sum())(xs["a"])
    close(g, 2 * xs["a"], rtol=1e-6)


# ---- reductions ----

@pytest.mark.parametrize("dtype", [np.float32, np.int8, np.uint32, np.bool_])
def test_reduce_monoids_match_jax(dtype):
    x = RNG.integers(0, 2, (3, 4, 5)).astype(dtype) if dtype == np.bool_ else \
        RNG.integers(0 if dtype == np.uint32 else -9, 9, (3, 4, 5)).astype(dtype)
    ops = [(lax.max, jl.max, dtype(np.iinfo(dtype).min if dtype not in (np.float32, np.bool_) else 0)),
           (lax.min, jl.min, dtype(1 if dtype == np.bool_ else 100))]
    if dtype != np.bool_: ops += [(lax.add, jl.add, dtype(0)), (lax.mul, jl.mul, dtype(1))]
    if dtype != np.float32: ops += [(lax.bitwise_or, jl.bitwise_or, dtype(0)),
                                    (lax.bitwise_and, jl.bitwise_and, dtype(1 if dtype == np.bool_ else -1)
                                     if dtype != np.uint32 else np.uint32(0xFFFFFFFF))]
    for ours, theirs, init in ops:
        for dims in [(1,), (0, 2), ()]:
            close(lax.reduce(x, init, ours, dims), jl.reduce(x, init, theirs, dims))
    if dtype != np.float32:
        for name in ("reduce_and", "reduce_or", "reduce_xor", "reduce_min"):
            close(getattr(lax, name)(x, (0, 2)), getattr(jl, name)(x, (0, 2)))


def test_reduce_errors_and_grad():
    x = floats((3, 4))
    with pytest.raises(NotImplementedError, match="reduce.*monoid"):
        lax.reduce(x, 0.0, lambda a, b: a + 2 * b, (0,))
    with pytest.raises(NotImplementedError, match="reduce"):
        lax.reduce((x, x), (0.0, 0.0), lax.add, (0,))
    close(lax.reduce(x, 1.0, lax.add, (0,)), jl.reduce(x, 1.0, jl.add, (0,)), rtol=1e-6)
    close(fnx.grad(lambda v: lax.reduce(v, -np.inf, lax.max, (1,)).sum())(x),
          jax.grad(lambda v: jl.reduce(v, -np.inf, jl.max, (1,)).sum())(x))
    close(fnx.jit(lambda v: lax.reduce(v, 0.0, lax.add, (1,)))(x), x.sum(1), rtol=1e-6)


WINDOWS = [((2,), (1,), "VALID", None, None), ((3,), (2,), "SAME", None, None), ((2,), (1,), ((1, 2),), (2,), None),
           ((2,), (2,), "VALID", None, (3,)), ((2, 3), (1, 2), "SAME", None, None),
           ((2, 2), (2, 1), ((0, 1), (1, 1)), (1, 2), (2, 1)), ((1, 1), (1, 1), "VALID", None, None)]


@pytest.mark.parametrize("window,strides,padding,base,dilation", WINDOWS)
def test_reduce_window_matches_jax(window, strides, padding, base, dilation):
    x = floats((6, 7)[:len(window)] if len(window) == 2 else (9,))
    for ours, theirs, init in [(lax.max, jl.max, -np.inf), (lax.add, jl.add, 0.0), (lax.min, jl.min, np.inf)]:
        args = (window, strides, padding, base, dilation)
        close(lax.reduce_window(x, np.float32(init), ours, *args), jl.reduce_window(x, np.float32(init), theirs, *args),
              rtol=1e-6, atol=1e-6)
    assert lax.reduce_window_shape_tuple(x.shape, window, strides, padding, base, dilation) == \
        jl.reduce_window(x, np.float32(0), jl.add, window, strides, padding, base, dilation).shape
    w = floats(jl.reduce_window(x, np.float32(0), jl.add, window, strides, padding, base, dilation).shape)
    for ours, theirs, init in [(lax.max, jl.max, -np.inf), (lax.add, jl.add, 0.0)][dilation is not None:]:
        g = fnx.grad(lambda v: (lax.reduce_window(v, np.float32(init), ours, window, strides, padding, base,
                                                  dilation) * w).sum())(x)
        h = jax.grad(lambda v: (jl.reduce_window(v, np.float32(init), theirs, window, strides, padding, base,
                                                 dilation) * w).sum())(x)
        close(g, h, rtol=1e-5, atol=1e-6)


TILED = [((2, 2), (7, 9)), ((1, 2, 2, 1), (3, 8, 8, 2)), ((3,), (10,)), ((2, 3), (4, 9)), ((1, 1), (3, 3))]


@pytest.mark.parametrize("window,shape", TILED)
def test_tiled_windows_match_jax_with_ties(window, shape):
    """Windows that tile the operand (max and average pooling) take one REDUCE: values, grads (the first maximum of a
    window gets it, as JAX's select_and_scatter; the data has ties: relu's zeros), jvp, vmap, jit, uncovered edges."""
    x = np.maximum(floats(shape), 0).astype(np.float32)  # about half zeros: windows of equal maxima
    for ours, theirs, init in [(lax.max, jl.max, -np.inf), (lax.min, jl.min, np.inf), (lax.add, jl.add, 0.0),
                               (lax.mul, jl.mul, 1.0)]:
        f = lambda v: lax.reduce_window(v, np.float32(init), ours, window, window, "VALID")  # noqa: E731
        j = lambda v: jl.reduce_window(v, np.float32(init), theirs, window, window, "VALID")  # noqa: E731
        close(f(x), j(x), rtol=1e-6)
        close(fnx.jit(f)(x), j(x), rtol=1e-6)
        w = floats(j(x).shape)
        if theirs is not jl.mul:  # (JAX has no reverse-mode rule for a window product)
            close(fnx.grad(lambda v: (f(v) * w).sum())(x), jax.grad(lambda v: (j(v) * w).sum())(x), rtol=1e-5)
        t = floats(shape)
        close(fnx.jvp(f, (x,), (t,))[1], jax.jvp(j, (x,), (t,))[1], rtol=1e-5, atol=1e-6)
        batch = np.stack([x, x[::-1].copy()])
        close(fnx.vmap(f)(batch), jax.vmap(j)(batch), rtol=1e-6)


def test_tiled_windows_float16_and_integers():
    x16 = floats((4, 6)).astype(np.float16)
    close(lax.reduce_window(x16, np.float16(-np.inf), lax.max, (2, 2), (2, 2), "VALID"),
          jl.reduce_window(x16, np.float16(-np.inf), jl.max, (2, 2), (2, 2), "VALID"))
    xi = RNG.integers(-50, 50, (6, 4)).astype(np.int32)
    close(lax.reduce_window(xi, np.int32(0), lax.add, (3, 2), (3, 2), "VALID"),
          jl.reduce_window(xi, np.int32(0), jl.add, (3, 2), (3, 2), "VALID"))
    # a custom computation keeps the general path (and its answer)
    x = floats((4, 4))
    close(lax.reduce_window(x, np.float32(0), lambda a, b: a + b, (2, 2), (2, 2), "VALID"),
          jl.reduce_window(x, np.float32(0), lambda a, b: a + b, (2, 2), (2, 2), "VALID"), rtol=1e-6)


def test_reduce_window_integers_and_jit():
    x = RNG.integers(-50, 50, (5, 6)).astype(np.int8)
    close(lax.reduce_window(x, np.int8(-128), lax.max, (2, 2), (1, 2), "VALID"),
          jl.reduce_window(x, np.int8(-128), jl.max, (2, 2), (1, 2), "VALID"))
    f = floats((4, 5))
    jitted = fnx.jit(lambda v: lax.reduce_window(v, 0.0, lax.add, (2, 2), (1, 1), "SAME"))(f)
    close(jitted, jl.reduce_window(f, 0.0, jl.add, (2, 2), (1, 1), "SAME"), rtol=1e-6, atol=1e-6)
    with pytest.raises(TypeError, match="reduce_window.*int8.*float32"):
        lax.reduce_window(x, np.float32(0), lax.add, (2, 2), (1, 1), "VALID")


# ---- shapes, slices and products ----

def test_shape_functions_match_jax():
    x = floats((2, 1, 3, 1))
    for ours, theirs in [
            (lax.squeeze(x, (1, 3)), jl.squeeze(x, (1, 3))), (lax.squeeze(x, (-1,)), jl.squeeze(x, (-1,))),
            (lax.expand_dims(x, (0, 5)), jl.expand_dims(x, (0, 5))),
            (lax.expand_dims(x, (-1,)), jl.expand_dims(x, (-1,))),
            (lax.broadcast(x, (2, 3)), jl.broadcast(x, (2, 3))), (lax.broadcast(np.float32(2), (4,)),
                                                                  jl.broadcast(np.float32(2), (4,))),
            (lax.broadcast_to_rank(x, 6), jl.broadcast_to_rank(x, 6)), (lax.broadcast_to_rank(x, 2),
                                                                        jl.broadcast_to_rank(x, 2)),
            (lax.collapse(x, 1, 3), jl.collapse(x, 1, 3)), (lax.collapse(x, 0), jl.collapse(x, 0)),
            (lax.reshape(x, (3, 2), (2, 0, 1, 3)), jl.reshape(x, (3, 2), (2, 0, 1, 3))),
            (lax.reshape(x, (6,)), jl.reshape(x, (6,))),
            (lax.index_in_dim(x, -1, 2), jl.index_in_dim(x, -1, 2)),
            (lax.index_in_dim(x, 1, 0, keepdims=False), jl.index_in_dim(x, 1, 0, keepdims=False)),
            (lax.slice_in_dim(x, -2, None, axis=2), jl.slice_in_dim(x, -2, None, axis=2)),
            (lax.slice_in_dim(x, None, 3, 2, 2), jl.slice_in_dim(x, None, 3, 2, 2)),
            (lax.full_like(x, 3), jl.full_like(x, 3)), (lax.full_like(x, 2, np.int8, (4,)),
                                                        jl.full_like(x, 2, np.int8, (4,)))]:
        close(ours, theirs)
    for o, t in zip(lax.split(x, (1, 0, 2), axis=2), jl.split(x, (1, 0, 2), axis=2)): close(o, t)
    with pytest.raises(ValueError, match="squeeze"): lax.squeeze(x, (0,))
    with pytest.raises(ValueError, match="split"): lax.split(x, (1, 1), axis=2)
    with pytest.raises(IndexError, match="index_in_dim"): lax.index_in_dim(x, 2, 0)
    with pytest.raises(TypeError, match="reshape"): lax.reshape(x, (5,))


def test_dynamic_slices_match_jax():
    x = floats((5, 6))
    for starts, sizes in [((1, 2), (2, 3)), ((4, 5), (3, 3)), ((-1, -7), (2, 2)), ((0, 0), (5, 6)), ((2, 2), (0, 1))]:
        close(lax.dynamic_slice(x, starts, sizes), jl.dynamic_slice(x, starts, sizes))
        close(lax.dynamic_slice(x, np.int32(starts), sizes), jl.dynamic_slice(x, np.int32(starts), sizes))
        u = floats(sizes)
        close(lax.dynamic_update_slice(x, u, starts), jl.dynamic_update_slice(x, u, starts))
    for index in (0, 3, -2, 9):
        close(lax.dynamic_index_in_dim(x, index, 1), jl.dynamic_index_in_dim(x, index, 1))
        close(lax.dynamic_index_in_dim(x, index, 0, False), jl.dynamic_index_in_dim(x, index, 0, False))
        close(lax.dynamic_slice_in_dim(x, index, 2, 1), jl.dynamic_slice_in_dim(x, index, 2, 1))
    row = floats((6,))
    close(lax.dynamic_update_index_in_dim(x, row, 3, 0), jl.dynamic_update_index_in_dim(x, row, 3, 0))
    close(lax.dynamic_update_index_in_dim(x, row[None], -1, 0), jl.dynamic_update_index_in_dim(x, row[None], -1, 0))
    close(lax.dynamic_slice(np.int8([[1, 2], [3, 4]]), (1, 0), (1, 2)), np.int8([[3, 4]]))
    with pytest.raises(TypeError, match="dynamic_slice"): lax.dynamic_slice(x, (0, 0), (6, 1))
    with pytest.raises(TypeError, match="dynamic_update_slice.*int32.*float32"):
        lax.dynamic_update_slice(x, np.ones((1, 1), np.int32), (0, 0))


def test_dynamic_update_slice_in_dim_matches_jax():
    x, u = floats((5, 6)), floats((2, 6))
    for index in (0, 3, -2, 9):
        close(lax.dynamic_update_slice_in_dim(x, u, index, 0), jl.dynamic_update_slice_in_dim(x, u, index, 0))


def test_dynamic_slices_traced_vmapped_and_differentiated():
    x, u = floats((5, 6)), floats((2, 3))
    sliced = fnx.jit(lambda v, i, j: lax.dynamic_slice(v, (i, j), (2, 3)))
    for i, j in [(0, 0), (3, 4), (-1, 2), (7, -9)]:
        close(sliced(x, np.int32(i), np.int32(j)), jl.dynamic_slice(x, (i, j), (2, 3)))
    idx = np.int32([0, 4, 2, -1, 1])
    close(fnx.vmap(lambda v, i: lax.dynamic_slice_in_dim(v, i, 2))(x, idx),
          jax.vmap(lambda v, i: jl.dynamic_slice_in_dim(v, i, 2))(x, idx))
    close(fnx.vmap(lambda i: lax.dynamic_update_slice(x, u, (i, i)))(idx),
          jax.vmap(lambda i: jl.dynamic_update_slice(x, u, (i, i)))(idx))

    def ours(v, w, i): return (lax.dynamic_update_slice(v, w * w, (i, 2)) ** 2).sum() + lax.dynamic_slice(v, (i, 1),
                                                                                                      (2, 2)).sum()

    def theirs(v, w, i): return (jl.dynamic_update_slice(v, w * w, (i, 2)) ** 2).sum() + jl.dynamic_slice(v, (i, 1),
                                                                                                     (2, 2)).sum()
    for i in (1, 4):
        for o, t in zip(fnx.grad(ours, (0, 1))(x, u, np.int32(i)), jax.grad(theirs, (0, 1))(x, u, np.int32(i))):
            close(o, t, rtol=1e-6)


def test_dot_and_batch_matmul_match_jax():
    a, b, v = floats((3, 4)), floats((4, 5)), floats((4,))
    for ours, theirs in [(lax.dot(a, b), jl.dot(a, b)), (lax.dot(a, v), jl.dot(a, v)), (lax.dot(v, v), jl.dot(v, v)),
                         (lax.dot(v, b), jl.dot(v, b)),
                         (lax.dot(a, a, dimension_numbers=(((1,), (1,)), ((), ()))),
                          jl.dot(a, a, dimension_numbers=(((1,), (1,)), ((), ()))))]:
        close(ours, theirs, rtol=1e-5, atol=1e-5)
    close(lax.dot(a.astype(np.float16), b.astype(np.float16), preferred_element_type=np.float32),
          jl.dot(a.astype(np.float16), b.astype(np.float16), preferred_element_type=np.float32), rtol=1e-3)
    x, y = floats((2, 3, 4)), floats((2, 4, 5))
    close(lax.batch_matmul(x, y), jl.batch_matmul(x, y), rtol=1e-5, atol=1e-5)
    close(fnx.grad(lambda p: lax.batch_matmul(p, y).sum())(x), jax.grad(lambda p: jl.batch_matmul(p, y).sum())(x),
          rtol=1e-5, atol=1e-5)
    with pytest.raises(TypeError, match="dot"): lax.dot(a, a)
    with pytest.raises(ValueError, match="batch_matmul"): lax.batch_matmul(x, floats((3, 4, 5)))


def test_tiled_windows_on_two_to_the_26_elements():
    """Pooling a 2^26-element array (8192 x 8192 float32, 256 MB): max is exact, the average pool's sums within
    float32 rounding of a float64 reference (no int32 index overflow, no lost rows)."""
    x = np.random.default_rng(26).standard_normal((1 << 13, 1 << 13)).astype(np.float32)
    pooled = fnx.jit(lambda v: lax.reduce_window(v, -np.inf, lax.max, (2, 4), (2, 4), "VALID"))(x)
    np.testing.assert_array_equal(np.asarray(pooled), x.reshape(4096, 2, 2048, 4).max(axis=(1, 3)))
    summed = fnx.jit(lambda v: lax.reduce_window(v, 0.0, lax.add, (4, 2), (4, 2), "VALID"))(x)
    np.testing.assert_allclose(np.asarray(summed), x.astype(np.float64).reshape(2048, 4, 4096, 2).sum(axis=(1, 3)),
                               rtol=1e-6, atol=1e-5)
