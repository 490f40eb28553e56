"""fnx.nn against numpy references (float64 math, rounded to the tested dtype), eagerly and under fnx.jit, on every
backend of the `device` fixture; then against jax.nn where jax is installed; initializers by their statistics and,
when fnx.random gives JAX's bits, value for value against jax.nn.initializers.

Inputs mix random values with extremes (+-100, +-inf, +-0, tiny); softmax-family rows include all -inf and +inf
rows. Tolerances (rtol, atol): float32 (5e-6, 1e-6) and float64 (1e-12, 1e-13) for elementwise functions; the
reductions (softmax, log_softmax, logsumexp, standardize) allow a few more float32 ulps.
"""
import decimal
import math

import numpy as np
import pytest
from hypothesis import given, strategies as st
from hypothesis.extra import numpy as hnp

import fnx
import fnx.nn as nn
import fnx.numpy as jnp
from assertions import wide_inputs

F32, F64 = np.float32, np.float64
TOL = {F32: (5e-6, 1e-6), F64: (1e-12, 1e-13)}
RED = {F32: (2e-5, 2e-6), F64: (1e-12, 1e-13)}
EXTREMES = [-np.inf, -100.0, -30.0, -5.0, -1.0, -1e-3, -0.0, 0.0, 1e-30, 1e-3, 0.5, 1.0, 3.0, 6.0, 30.0, 100.0,
            np.inf]


def inputs(dtype, n=48, seed=0):
    """EXTREMES followed by random values spread over [-12, 12]."""
    rng = np.random.default_rng(seed)
    return np.concatenate([EXTREMES, rng.uniform(-12, 12, n)]).astype(dtype)


def run(fn, *args):
    """fn on fnx arrays made from `args`, eagerly and under fnx.jit: two results (pytrees of numpy arrays). 64-bit
    inputs run with x64 on (`wide_inputs`)."""
    with fnx.enable_x64(wide_inputs(*args)):
        arrays = [jnp.asarray(a) if isinstance(a, np.ndarray) else a for a in args]
        return [fnx.tree_util.tree_map(np.asarray, r) for r in (fn(*arrays), fnx.jit(fn)(*arrays))]


def check(got, want, tol, dtype):
    got, want = np.asarray(got), np.asarray(want)
    assert got.shape == want.shape, (got.shape, want.shape)
    assert got.dtype == np.dtype(dtype), (got.dtype, dtype)
    np.testing.assert_allclose(got.astype(F64), want.astype(dtype).astype(F64), rtol=tol[0], atol=tol[1],
                               equal_nan=True)


def check_both(fn, ref, *args, tol, dtype):
    with np.errstate(all="ignore"):
        want = ref(*[a.astype(F64) if isinstance(a, np.ndarray) else a for a in args])
    for got in run(fn, *args):
        if isinstance(want, tuple):
            for g, w in zip(got, want): check(g, w, tol, dtype)
        else:
            check(got, want, tol, dtype)


# ---- numpy references, in float64 ----

_erfc = np.vectorize(math.erfc, otypes=[F64])  # math.erfc is correctly rounded to ~1 ulp, also where erfc is tiny


def _sigmoid(x): return 1 / (1 + np.exp(-x))


def _elu(x, alpha=1.0): return np.where(x > 0, x, alpha * np.expm1(np.minimum(x, 0)))


ELEMENTWISE = {
    "relu": (nn.relu, lambda x: np.maximum(x, 0)),
    "relu6": (nn.relu6, lambda x: np.clip(x, 0, 6)),
    "sigmoid": (nn.sigmoid, _sigmoid),
    "log_sigmoid": (nn.log_sigmoid, lambda x: -np.logaddexp(0, -x)),
    "softplus": (nn.softplus, lambda x: np.logaddexp(x, 0)),
    "silu": (nn.silu, lambda x: x * _sigmoid(x)),
    "swish": (nn.swish, lambda x: x * _sigmoid(x)),
    "gelu_tanh": (nn.gelu, lambda x: 0.5 * x * (1 + np.tanh(np.sqrt(2 / np.pi) * (x + 0.044715 * x ** 3)))),
    "gelu_erf": (lambda x: nn.gelu(x, approximate=False), lambda x: x * _erfc(-x / np.sqrt(2)) / 2),
    "tanh": (nn.tanh, np.tanh),
    "elu": (nn.elu, _elu),
    "elu_alpha": (lambda x: nn.elu(x, 0.5), lambda x: _elu(x, 0.5)),
    "celu": (lambda x: nn.celu(x, 2.0), lambda x: np.maximum(x, 0) + 2.0 * np.expm1(np.minimum(x, 0) / 2.0)),
    "selu": (nn.selu, lambda x: 1.0507009873554805 * _elu(x, 1.6732632423543772)),
    "leaky_relu": (nn.leaky_relu, lambda x: np.where(x >= 0, x, 0.01 * x)),
    "leaky_relu_slope": (lambda x: nn.leaky_relu(x, 0.2), lambda x: np.where(x >= 0, x, 0.2 * x)),
    "hard_tanh": (nn.hard_tanh, lambda x: np.clip(x, -1, 1)),
    "hard_sigmoid": (nn.hard_sigmoid, lambda x: np.clip(x + 3, 0, 6) / 6),
    "hard_silu": (nn.hard_silu, lambda x: x * np.clip(x + 3, 0, 6) / 6),
    "soft_sign": (nn.soft_sign, lambda x: x / (np.abs(x) + 1)),
}
# the tanh form of gelu cancels (1 + tanh(z) with tanh(z) near -1): its float64 error is absolute, not relative
ATOL = {"gelu_tanh": {F32: 1e-6, F64: 1e-12}}


@pytest.mark.parametrize("dtype", [F32, F64])
@pytest.mark.parametrize("name", sorted(ELEMENTWISE))
def test_elementwise(device, name, dtype):
    fn, ref = ELEMENTWISE[name]
    rtol, atol = TOL[dtype]
    check_both(fn, ref, inputs(dtype), tol=(rtol, ATOL.get(name, {}).get(dtype, atol)), dtype=dtype)


def test_gelu_erf_tail_is_relatively_accurate():
    """Far in the negative tail gelu(x) = x * erfc(|x|/sqrt 2) / 2 is tiny; it must still be accurate relatively.
    erfc amplifies an error in its argument z by 2 z^2, so the reference is erfc at the exact |x|/sqrt 2: z in
    float64 for float32; for float64, erfc at z rounded plus the first-order term for the rounding (in Decimal)."""
    for dtype, tol in ((F32, 3e-6), (F64, 2e-14)):
        x = -np.linspace(0, 13 if dtype is F32 else 37, 400).astype(dtype)
        z = -x.astype(F64) / math.sqrt(2)
        rounding = [float(decimal.Decimal(float(-v)) / decimal.Decimal(2).sqrt() - decimal.Decimal(float(w)))
                    for v, w in zip(x, z)]
        want = x.astype(F64) * (_erfc(z) - 2 / math.sqrt(math.pi) * np.exp(-z * z) * np.array(rounding)) / 2
        with fnx.enable_x64(wide_inputs(x)):
            got = np.asarray(nn.gelu(jnp.asarray(x), approximate=False)).astype(F64)
        normal = np.abs(want) > np.finfo(dtype).tiny
        np.testing.assert_allclose(got[normal], want[normal], rtol=tol)


def test_integer_inputs_promote_to_float32():
    x = jnp.array([-2, 0, 3])
    for fn in (nn.sigmoid, nn.softplus, nn.silu, nn.gelu, nn.elu, nn.log_softmax, nn.softmax):
        assert fn(x).dtype == np.float32, fn.__name__
    assert nn.relu(x).dtype == np.int32  # relu keeps the dtype, as in JAX


# ---- softmax family ----

def _rows(dtype, seed=0):
    """A (7, 6) matrix: random rows, a row with +-100s, an all -inf row, a row with some -inf, a +inf row."""
    rng = np.random.default_rng(seed)
    x = rng.normal(0, 4, (7, 6))
    x[2] = [100, -100, 99, 0, -3, 100]
    x[3] = -np.inf
    x[4, [0, 3]] = -np.inf
    x[5, 1] = np.inf
    return x.astype(dtype)


def _max_shift(x, axis):
    return np.max(x, axis=axis, keepdims=True)


def _softmax(x, axis=-1):
    e = np.exp(x - _max_shift(x, axis))
    return e / e.sum(axis=axis, keepdims=True)


def _log_softmax(x, axis=-1):
    shifted = x - _max_shift(x, axis)
    return shifted - np.log(np.exp(shifted).sum(axis=axis, keepdims=True))


def _logsumexp(x, axis=None, keepdims=False):
    m = np.max(x, axis=axis, keepdims=True)
    m = np.where(np.isfinite(m), m, 0)
    out = np.log(np.sum(np.exp(x - m), axis=axis, keepdims=True)) + m
    return out if keepdims else np.squeeze(out, axis=axis)


@pytest.mark.parametrize("dtype", [F32, F64])
@pytest.mark.parametrize("axis", [-1, 0, None, (0, 1)])
def test_softmax_family(device, dtype, axis):
    x = _rows(dtype)
    check_both(lambda a: nn.softmax(a, axis=axis), lambda a: _softmax(a, axis), x, tol=RED[dtype], dtype=dtype)
    check_both(lambda a: nn.log_softmax(a, axis=axis), lambda a: _log_softmax(a, axis), x, tol=RED[dtype],
               dtype=dtype)
    for keepdims in (False, True):
        check_both(lambda a: nn.logsumexp(a, axis=axis, keepdims=keepdims),
                   lambda a: _logsumexp(a, axis, keepdims), x, tol=RED[dtype], dtype=dtype)


def test_softmax_family_extreme_rows():
    """The documented values on the special rows: -inf entries get probability 0; an all -inf row gives NaN from
    softmax (as in JAX) and -inf from logsumexp; huge entries do not overflow."""
    x = jnp.asarray(_rows(F32))
    p, lse = np.asarray(nn.softmax(x)), np.asarray(nn.logsumexp(x, axis=-1))
    assert np.isnan(p[3]).all() and lse[3] == -np.inf
    assert (p[4, [0, 3]] == 0).all() and np.isclose(p[4].sum(), 1)
    np.testing.assert_allclose(p[2], [0.4223188, 0, 0.1553624, 0, 0, 0.4223188], rtol=1e-5, atol=1e-30)
    np.testing.assert_allclose(lse[2], 100 + np.log(2 + np.exp(-1)), rtol=1e-6)
    assert lse[5] == np.inf
    assert np.asarray(nn.logsumexp(jnp.full((3,), -np.inf))) == -np.inf


@given(hnp.arrays(F64, hnp.array_shapes(min_dims=1, max_dims=3, min_side=1, max_side=4),
                  elements=st.floats(-50, 50)), st.booleans())
@pytest.mark.usefixtures("x64")
def test_softmax_sums_to_one(x, keepdims):
    axis = -1
    p = np.asarray(nn.softmax(jnp.asarray(x), axis=axis))
    np.testing.assert_allclose(p.sum(axis=axis), 1.0, rtol=1e-12)
    np.testing.assert_allclose(np.asarray(nn.logsumexp(jnp.asarray(x), axis=axis, keepdims=keepdims)),
                               _logsumexp(x, axis, keepdims), rtol=1e-12, atol=1e-12)


def test_softmax_where():
    x = np.array([[1.0, 2.0, 3.0], [0.0, -1.0, 5.0]], F32)
    mask = np.array([[True, False, True], [True, True, False]])
    p = np.asarray(nn.softmax(jnp.asarray(x), where=jnp.asarray(mask)))
    want = np.where(mask, np.exp(x), 0)
    np.testing.assert_allclose(p, want / want.sum(-1, keepdims=True), rtol=1e-6)
    lp = np.asarray(nn.log_softmax(jnp.asarray(x), where=jnp.asarray(mask)))
    np.testing.assert_allclose(lp[mask], x[mask] - np.log(want.sum(-1, keepdims=True)).repeat(3, 1)[mask], rtol=1e-6)
    assert (lp[~mask] == -np.inf).all()
    lse = np.asarray(nn.logsumexp(jnp.asarray(x), axis=-1, where=jnp.asarray(mask)))
    np.testing.assert_allclose(lse, np.log(want.sum(-1)), rtol=1e-6)


@pytest.mark.usefixtures("x64")
def test_logsumexp_weights_and_sign(device):
    a = np.array([[0.0, 1.0, 2.0], [3.0, 3.0, -1.0]], F64)
    b = np.array([1.0, -2.0, 0.5])
    total = (np.exp(a) * b).sum(-1)
    out, sign = nn.logsumexp(jnp.asarray(a), axis=-1, b=jnp.asarray(b), return_sign=True)
    np.testing.assert_allclose(np.asarray(out), np.log(np.abs(total)), rtol=1e-12)
    np.testing.assert_array_equal(np.asarray(sign), np.sign(total))
    plain = np.asarray(nn.logsumexp(jnp.asarray(a), axis=-1, b=jnp.asarray(b)))
    np.testing.assert_array_equal(np.isnan(plain), total < 0)


# ---- one_hot and standardize ----

@pytest.mark.parametrize("axis", [-1, 0, 1])
def test_one_hot(device, axis):
    labels = np.array([[0, 3, -1], [2, 4, 1]], np.int32)  # 4 is out of range, -1 negative: all zeros
    want = np.moveaxis((labels[..., None] == np.arange(4)).astype(F32), -1, axis)
    for got in run(lambda x: nn.one_hot(x, 4, axis=axis), labels):
        check(got, want, (0, 0), F32)
    got = np.asarray(nn.one_hot(jnp.asarray(labels), 4, dtype=jnp.int32, axis=axis))
    assert got.dtype == np.int32 and (got == want).all()


@pytest.mark.parametrize("dtype", [F32, F64])
@pytest.mark.parametrize("algorithm", ["fast", "stable"])
def test_standardize(device, dtype, algorithm):
    x = np.random.default_rng(1).normal(2, 3, (4, 6)).astype(dtype)
    x[1] = 100 * np.sign(x[1])

    def ref(a, axis):
        m = a.mean(axis, keepdims=True)
        return (a - m) / np.sqrt(a.var(axis, keepdims=True) + 1e-5)
    tol = (1e-4, 1e-5) if dtype is F32 else (1e-10, 1e-12)
    for axis in (-1, 0, None):
        check_both(lambda a: nn.standardize(a, axis=axis, algorithm=algorithm), lambda a: ref(a, axis), x,
                   tol=tol, dtype=dtype)
    mean, var = np.float32(1.5), np.float32(4.0)
    got = np.asarray(nn.standardize(jnp.asarray(x), mean=mean, variance=var, epsilon=0.0))
    np.testing.assert_allclose(got, (x - 1.5) / 2, rtol=tol[0], atol=tol[1])


def test_glu():
    x = np.arange(12, dtype=F32).reshape(3, 4) / 4
    got = np.asarray(nn.glu(jnp.asarray(x)))
    np.testing.assert_allclose(got, x[:, :2] * _sigmoid(x[:, 2:]), rtol=1e-6)
    with pytest.raises(ValueError, match="even"):
        nn.glu(jnp.ones((2, 3)))


def test_eager_calls_trace_once_per_signature():
    """An eager fnx.nn call runs jit of the function, as jax.nn's are jitted: a second call on other values of the
    same shapes (a Python number included) traces nothing, and a new axis, flag or dtype is a new trace, as a
    static argument is. Op by op, each eager softmax traced all its ops again: 0.77 ms a call on (64, 128) against
    0.02 ms now. The second calls' values match float64 numpy."""
    from fnx import events
    rng = np.random.default_rng(5)
    x, y = (rng.standard_normal((3, 13, 6)).astype(F32) for _ in range(2))  # (a shape no other test uses)
    labels = np.array([[0, 4, 2], [1, 1, 9]])
    traces = []

    def calls(a, i):
        a = jnp.asarray(a)
        return [nn.softmax(a), nn.softmax(a, axis=0), nn.gelu(a, approximate=False), nn.elu(a, 0.5 + i),
                nn.leaky_relu(a, negative_slope=0.1 * (i + 1)), nn.logsumexp(a, axis=(0, 2), keepdims=True),
                nn.standardize(a, epsilon=1e-5 * (i + 1)), nn.one_hot(jnp.asarray(labels + i), 5, dtype=jnp.int32),
                nn.tanh(a)]
    stop = events.listen(lambda e: traces.append(e.name) if e.cat == "trace" else None)
    try:
        calls(x, 0)
        before = len(traces)
        assert {"softmax", "gelu", "elu", "logsumexp", "one_hot"} <= set(traces), traces
        second = calls(y, 1)
        assert len(traces) == before, traces[before:]
    finally:
        stop()
    y64 = y.astype(F64)
    e = np.exp(y64 - y64.max(-1, keepdims=True))
    np.testing.assert_allclose(np.asarray(second[0]), e / e.sum(-1, keepdims=True), rtol=2e-6, atol=1e-7)
    e0 = np.exp(y64 - y64.max(0, keepdims=True))
    np.testing.assert_allclose(np.asarray(second[1]), e0 / e0.sum(0, keepdims=True), rtol=2e-6, atol=1e-7)
    gelu = np.array([v * math.erfc(-v / math.sqrt(2)) / 2 for v in y64.ravel()]).reshape(y.shape)
    np.testing.assert_allclose(np.asarray(second[2]), gelu, rtol=2e-6, atol=1e-7)
    np.testing.assert_allclose(np.asarray(second[3]), np.where(y64 > 0, y64, 1.5 * np.expm1(y64)), rtol=2e-6)
    np.testing.assert_allclose(np.asarray(second[4]), np.where(y64 >= 0, y64, 0.2 * y64), rtol=2e-6)
    np.testing.assert_allclose(np.asarray(second[5]), np.log(np.exp(y64).sum((0, 2), keepdims=True)), rtol=2e-6)
    z = (y64 - y64.mean(-1, keepdims=True)) / np.sqrt(y64.var(-1, keepdims=True) + 2e-5)
    np.testing.assert_allclose(np.asarray(second[6]), z, rtol=2e-5, atol=2e-6)
    hot = np.asarray(second[7])
    assert hot.dtype == np.int32
    np.testing.assert_array_equal(hot, (labels + 1)[..., None] == np.arange(5))
    np.testing.assert_allclose(np.asarray(second[8]), np.tanh(y64), rtol=3e-7, atol=1e-7)


# ---- against jax.nn ----

JAX_NAMES = ["relu", "relu6", "sigmoid", "log_sigmoid", "softplus", "silu", "gelu", "tanh", "elu", "celu", "selu",
             "leaky_relu", "hard_tanh", "hard_sigmoid", "hard_silu", "soft_sign"]


@pytest.mark.parametrize("dtype", [F32, F64])
def test_matches_jax(dtype):
    jax = pytest.importorskip("jax")
    x64 = jax.config.jax_enable_x64
    jax.config.update("jax_enable_x64", True)
    try:
        _compare_with_jax(jax, dtype)
    finally:
        jax.config.update("jax_enable_x64", x64)


def _compare_with_jax(jax, dtype):
    x = inputs(dtype, seed=3)
    rtol, atol = TOL[dtype]
    for name in JAX_NAMES:
        np.testing.assert_allclose(np.asarray(getattr(nn, name)(jnp.asarray(x))),
                                   np.asarray(getattr(jax.nn, name)(x)), rtol=10 * rtol,
                                   atol=1e-12 if name == "gelu" and dtype is F64 else atol, equal_nan=True,
                                   err_msg=name)
    finite = np.where(np.isfinite(x), x, 0)  # XLA's erf is an approximation; compare on finite inputs
    np.testing.assert_allclose(np.asarray(nn.gelu(jnp.asarray(finite), approximate=False)),
                               np.asarray(jax.nn.gelu(finite, approximate=False)), rtol=1e-5 if dtype is F32
                               else 1e-12, atol=atol)
    rows = _rows(dtype)
    for name, kwargs in (("softmax", {}), ("log_softmax", {}), ("logsumexp", {"axis": -1}), ("logsumexp", {}),
                         ("standardize", {})):
        np.testing.assert_allclose(np.asarray(getattr(nn, name)(jnp.asarray(rows), **kwargs)),
                                   np.asarray(getattr(jax.nn, name)(rows, **kwargs)), rtol=RED[dtype][0] * 10,
                                   atol=RED[dtype][1], equal_nan=True, err_msg=name)
    labels = np.array([0, 2, 5, -1, 1])
    np.testing.assert_array_equal(np.asarray(nn.one_hot(jnp.asarray(labels), 3, axis=0)),
                                  np.asarray(jax.nn.one_hot(labels, 3, axis=0)))


# ---- initializers ----



def test_fans_and_errors():
    init = nn.initializers
    assert init._fans((3, 5), -2, -1, ()) == (3, 5)
    assert init._fans((2, 2, 3, 5), -2, -1, ()) == (12, 20)                # receptive field 2*2
    assert init._fans((7, 2, 3, 5), -2, -1, 0) == (6, 10)                  # batch axis left out
    assert init._fans((2, 3, 5), (0, 1), -1, ()) == (6, 5)
    with pytest.raises(ValueError, match="at least 2-d"):
        init.glorot_uniform()(None, (5,))
    with pytest.raises(ValueError, match="mode"):
        init.variance_scaling(1.0, "fan_sum", "normal")
    z = init.zeros(None, (2, 3))
    assert z.shape == (2, 3) and z.dtype == np.float32 and not np.asarray(z).any()
    assert (np.asarray(init.ones(None, (4,), jnp.float64)) == 1).all()
    assert (np.asarray(init.constant(-7)(None, (2, 2))) == -7).all()


# (initializer, fan used, scale, distribution) for a (4, 3, 100, 200) kernel: fan_in = 4*3*100, fan_out = 4*3*200
SHAPE = (4, 3, 100, 200)
FAN_IN, FAN_OUT = 4 * 3 * 100, 4 * 3 * 200
STATS = {
    "glorot_uniform": (2 / (FAN_IN + FAN_OUT), "uniform"),
    "glorot_normal": (2 / (FAN_IN + FAN_OUT), "truncated_normal"),
    "lecun_normal": (1 / FAN_IN, "truncated_normal"),
    "lecun_uniform": (1 / FAN_IN, "uniform"),
    "he_normal": (2 / FAN_IN, "truncated_normal"),
    "he_uniform": (2 / FAN_IN, "uniform"),
}


@pytest.mark.parametrize("name", sorted(STATS))
def test_variance_scaling_statistics(name):
    from fnx import random
    variance, distribution = STATS[name]
    w = np.asarray(getattr(nn.initializers, name)()(random.PRNGKey(0), SHAPE)).astype(F64)
    assert w.shape == SHAPE
    std = math.sqrt(variance)
    assert abs(w.mean()) < 0.01 * std
    assert abs(w.std() / std - 1) < 0.01
    bound = math.sqrt(3) * std if distribution == "uniform" else 2 * std / 0.87962566103423978
    assert np.abs(w).max() <= bound * (1 + 1e-6)


def test_normal_uniform_truncated_statistics():
    from fnx import random
    key = random.PRNGKey(1)
    w = np.asarray(nn.initializers.normal(0.5)(key, (200, 500))).astype(F64)
    assert abs(w.mean()) < 0.005 and abs(w.std() - 0.5) < 0.005
    with fnx.enable_x64():
        u = np.asarray(nn.initializers.uniform(3.0)(key, (200, 500), jnp.float64))
    assert u.dtype == np.float64 and u.min() >= 0 and u.max() < 3 and abs(u.mean() - 1.5) < 0.02
    t = np.asarray(nn.initializers.truncated_normal(2.0)(key, (200, 500))).astype(F64)
    assert np.abs(t).max() <= 4 * (1 + 1e-6) and abs(t.std() - 2 * 0.87962566103423978) < 0.02


@pytest.mark.parametrize("name,args", [("glorot_uniform", ()), ("glorot_normal", ()), ("he_normal", ()),
                                       ("he_uniform", ()), ("lecun_normal", ()), ("normal", (0.3,)),
                                       ("uniform", (2.0,)), ("truncated_normal", (0.7,)),
                                       ("variance_scaling", (0.5, "fan_out", "normal"))])
def test_initializers_match_jax(name, args):
    from fnx import random
    jax = pytest.importorskip("jax")
    shape = (3, 16, 24)
    got = np.asarray(getattr(nn.initializers, name)(*args)(random.PRNGKey(7), shape))
    want = np.asarray(getattr(jax.nn.initializers, name)(*args)(jax.random.PRNGKey(7), shape, jnp.float32))
    np.testing.assert_allclose(got, want, rtol=2e-6, atol=1e-7)


def test_initializers_under_jit():
    from fnx import random
    init = nn.initializers.he_normal()
    eager = np.asarray(init(random.PRNGKey(3), (8, 4)))
    jitted = np.asarray(fnx.jit(lambda k: init(k, (8, 4)))(random.PRNGKey(3)))
    np.testing.assert_allclose(jitted, eager, rtol=1e-6)
