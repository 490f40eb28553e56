"""Structured control flow (lax.cond, switch, while_loop, fori_loop, scan): values against plain Python loops and
ifs over numpy (and jax.lax where installed), eagerly, under jit and on every backend; grad and jvp against finite
differences, hand-derived gradients and Python-unrolled versions; vmap against the per-example loop; the errors
the constructors raise; and a long scan that stays one node in the graph."""
import functools
import os
import subprocess
import sys

import numpy as np
import pytest
from hypothesis import given, strategies as st

import fnx
from assertions import assert_tree_close
import fnx.numpy as jnp
from fnx import lax, tree_util

MODES = {"eager": lambda f: f, "jit": fnx.jit}


@pytest.fixture(params=list(MODES))
def mode(request):
    """Run the function as it is, or under fnx.jit."""
    return MODES[request.param]


def floats(shape, seed: int = 0, dtype=np.float32) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal(shape).astype(dtype)


def central_difference(f, x: np.ndarray, direction: np.ndarray, eps: float = 1e-6) -> float:
    """Directional derivative of scalar-valued f at x (float64)."""
    return (float(np.asarray(f(x + eps * direction))) - float(np.asarray(f(x - eps * direction)))) / (2 * eps)


# ---- cond ----

PREDICATES = [True, False, np.bool_(True), np.bool_(False), 0, 3, -1]


@pytest.mark.parametrize("pred", PREDICATES, ids=repr)
def test_cond_predicates(pred, mode, device):
    x = floats((3,))
    f = mode(lambda p, a: lax.cond(p, lambda v: v * 2.0, lambda v: v - 1.0, a))
    expected = x * 2.0 if pred else x - 1.0
    assert_tree_close(f(pred, jnp.asarray(x)), expected)


@pytest.mark.parametrize("pred", [True, False])
def test_cond_traced_scalar_predicate(pred, mode, device):
    x = floats((4,), 1)

    def f(a, threshold):
        return lax.cond(a.sum() > threshold, lambda v: jnp.sin(v), lambda v: v * v, a)
    threshold = x.sum() - 1 if pred else x.sum() + 1
    assert_tree_close(mode(f)(jnp.asarray(x), np.float32(threshold)), np.sin(x) if pred else x * x)


def test_cond_pytrees_in_and_out_with_closures(mode, device):
    x, y, w = floats((3,), 2), floats((2, 3), 3), floats((3,), 4)

    def f(p, a, b, w):
        def true_fun(ops):
            a, b = ops["a"], ops["b"]
            return {"sum": a + w, "pair": (b * a, a.sum())}

        def false_fun(ops):
            a, b = ops["a"], ops["b"]
            return {"sum": a - w, "pair": (b - 1.0, (a * w).sum())}
        return lax.cond(p, true_fun, false_fun, {"a": a, "b": b})
    for p in (True, False):
        expected = ({"sum": x + w, "pair": (y * x, x.sum())} if p else
                    {"sum": x - w, "pair": (y - 1.0, (x * w).sum())})
        assert_tree_close(mode(f)(p, jnp.asarray(x), jnp.asarray(y), jnp.asarray(w)), expected)


def test_cond_several_operands_and_integer_values(mode, device):
    f = mode(lambda p, i, x: lax.cond(p, lambda i, x: (i + 1, x * i), lambda i, x: (i - 1, x), i, x))
    assert_tree_close(f(True, np.int32(3), jnp.asarray([1.0, 2.0])), (np.int32(4), np.array([3.0, 6.0])))
    assert_tree_close(f(False, np.int32(3), jnp.asarray([1.0, 2.0])), (np.int32(2), np.array([1.0, 2.0])))


@given(st.floats(-4, 4, width=32), st.floats(-4, 4, width=32))
def test_cond_matches_jax(x, threshold):
    jax = pytest.importorskip("jax")

    def f(lib_lax, lib_np, x, t):
        return lib_lax.cond(x > t, lambda v: lib_np.sin(v) * t, lambda v: v * v + t, x)
    expected = f(jax.lax, jax.numpy, np.float32(x), np.float32(threshold))
    assert_tree_close(fnx.jit(lambda a, b: f(lax, jnp, a, b))(np.float32(x), np.float32(threshold)), expected)


# ---- switch ----

@pytest.mark.parametrize("index", [-3, 0, 1, 2, 7])
def test_switch_clamps_the_index(index, mode, device):
    x = floats((3,), 5)
    branches = [lambda v: v + 1.0, lambda v: v * 3.0, lambda v: jnp.sin(v)]
    reference = [x + 1.0, x * 3.0, np.sin(x)]
    out = mode(lambda i, v: lax.switch(i, branches, v))(np.int32(index), jnp.asarray(x))
    assert_tree_close(out, reference[min(max(index, 0), 2)])


def test_switch_two_branches_pytree(mode, device):
    f = mode(lambda i, a: lax.switch(i, [lambda a: (a, a.sum()), lambda a: (-a, a.max())], a))
    x = floats((4,), 6)
    assert_tree_close(f(np.int32(1), jnp.asarray(x)), (-x, x.max()))


# ---- while_loop ----

@given(st.integers(-3, 20))
def test_while_counting_loop(n):
    def reference(n):
        i, acc = 0, np.float32(1.0)
        while i < n: i, acc = i + 1, acc * np.float32(1.5)
        return np.int32(i), acc
    f = lambda n: lax.while_loop(lambda c: c[0] < n, lambda c: (c[0] + 1, c[1] * 1.5), (0, 1.0))  # noqa: E731
    assert_tree_close(f(np.int32(n)), reference(n), rtol=1e-6)
    assert_tree_close(fnx.jit(f)(np.int32(n)), reference(n), rtol=1e-6)


def test_while_closures_in_cond_and_body_pytree_carry(mode, device):
    limit, step = np.float32(10.0), floats((3,), 7) ** 2 + 0.5

    def f(limit, step, x0):
        def cond_fun(c):
            return c["x"].sum() < limit
        def body_fun(c):
            return {"x": c["x"] + step, "n": c["n"] + 1}
        return lax.while_loop(cond_fun, body_fun, {"x": x0, "n": np.int32(0)})
    x, n = np.zeros(3, np.float32), 0
    while x.sum() < limit: x, n = x + step, n + 1
    assert_tree_close(mode(f)(limit, jnp.asarray(step), jnp.zeros(3)), {"n": np.int32(n), "x": x})


def test_while_zero_trips(mode, device):
    f = mode(lambda x: lax.while_loop(lambda c: c > 100.0, lambda c: c * 2.0, x))
    assert_tree_close(f(jnp.asarray(3.0)), np.float32(3.0))


def test_while_matches_jax():
    jax = pytest.importorskip("jax")

    def f(lib_lax, x):
        return lib_lax.while_loop(lambda c: c[1] < 1000.0, lambda c: (c[0] + 1, c[1] * 1.7 + c[0]), (0, x))
    assert_tree_close(fnx.jit(lambda x: f(lax, x))(np.float32(0.3)), f(jax.lax, np.float32(0.3)))


# ---- fori_loop ----

def _fori_reference(lo: int, hi: int, x: np.ndarray) -> np.ndarray:
    for i in range(lo, hi): x = x * np.float32(0.9) + np.float32(i)
    return x


@pytest.mark.parametrize("bounds", [(0, 5), (2, 7), (3, 3), (5, 2)])
def test_fori_static_bounds_is_a_scan(bounds, mode, device):
    lo, hi = bounds
    x = floats((3,), 8)
    f = lambda x: lax.fori_loop(lo, hi, lambda i, c: c * 0.9 + i, x)  # noqa: E731
    assert_tree_close(mode(f)(jnp.asarray(x)), _fori_reference(lo, hi, x))
    if hi > lo:
        assert any(u.op.name == "SCAN" for u in fnx.make_graph(f)(jnp.asarray(x)).fn.toposort)


@pytest.mark.parametrize("bounds", [(0, 5), (2, 7), (5, 2)])
def test_fori_traced_bounds_is_a_while(bounds, device):
    lo, hi = bounds
    x = floats((3,), 9)
    f = lambda lo, hi, x: lax.fori_loop(lo, hi, lambda i, c: c * 0.9 + i, x)  # noqa: E731
    assert_tree_close(fnx.jit(f)(np.int32(lo), np.int32(hi), jnp.asarray(x)), _fori_reference(lo, hi, x))
    ops = {u.op.name for u in fnx.make_graph(f)(np.int32(lo), np.int32(hi), jnp.asarray(x)).fn.toposort}
    assert "WHILE" in ops and "SCAN" not in ops


# ---- scan ----

def _scan_reference(f, init, xs, length=None, reverse=False):
    """jax.lax.scan's semantics as a Python loop over numpy."""
    n = length if xs is None else len(tree_util.tree_leaves(xs)[0])
    carry, ys = init, [None] * n
    for t in (range(n - 1, -1, -1) if reverse else range(n)):
        x = None if xs is None else tree_util.tree_map(lambda a: a[t], xs)
        carry, ys[t] = f(carry, x)
    stacked = None if ys[0] is None else tree_util.tree_map(lambda *v: np.stack(v), *ys)
    return carry, stacked


@pytest.mark.parametrize("reverse", [False, True])
def test_scan_pytree_carry_and_xs(reverse, mode, device):
    xs = {"a": floats((5, 3), 10), "b": floats((5,), 11)}
    init = (np.zeros(3, np.float32), np.float32(1.0))

    def step(lib):
        def f(carry, x):
            s, p = carry
            new = (s + x["a"] * x["b"], p * 0.5 + x["b"])
            return new, {"s": new[0], "prod": lib.sin(x["a"]) * p}
        return f
    expected = _scan_reference(step(np), init, xs, reverse=reverse)
    out = mode(lambda init, xs: lax.scan(step(jnp), init, xs, reverse=reverse))(
        tuple(jnp.asarray(v) for v in init), {k: jnp.asarray(v) for k, v in xs.items()})
    assert_tree_close(out, expected, rtol=1e-5)


def test_scan_without_xs_and_without_ys(mode, device):
    f = mode(lambda c: lax.scan(lambda c, _: (c * 2.0 + 1.0, None), c, None, length=6))
    carry, ys = f(jnp.asarray([0.0, 1.0]))
    assert ys is None
    assert_tree_close(carry, _scan_reference(lambda c, _: (c * 2.0 + 1.0, None), np.array([0.0, 1.0]), None, 6)[0])


def test_scan_closures_over_outer_arrays(mode, device):
    w, b, xs = floats((3, 3), 12) * 0.5, floats((3,), 13), floats((4, 3), 14)

    def f(w, b, xs):
        return lax.scan(lambda h, x: (jnp.sin(h @ w + x + b), h.sum()), jnp.zeros(3), xs)
    expected = _scan_reference(lambda h, x: (np.sin(h @ w + x + b), h.sum()), np.zeros(3, np.float32), xs)
    assert_tree_close(mode(f)(jnp.asarray(w), jnp.asarray(b), jnp.asarray(xs)), expected, rtol=1e-5)


def test_scan_integer_carry_and_length_with_xs(mode, device):
    xs = np.arange(5, dtype=np.int32)
    f = mode(lambda xs: lax.scan(lambda c, x: (c + x, c * x), np.int32(0), xs, length=5))
    assert_tree_close(f(jnp.asarray(xs)), _scan_reference(lambda c, x: (c + x, c * x), np.int32(0), xs))


@given(st.integers(1, 8), st.booleans())
def test_scan_matches_jax(n, reverse):
    jax = pytest.importorskip("jax")
    xs = floats((n, 2), n)

    def f(lib_lax, lib_np, xs):
        return lib_lax.scan(lambda c, x: (lib_np.sin(c) + x, c * x), lib_np.ones(2, np.float32), xs, reverse=reverse)
    assert_tree_close(fnx.jit(lambda xs: f(lax, jnp, xs))(jnp.asarray(xs)), f(jax.lax, jax.numpy, xs), rtol=1e-5)


# ---- library functions and nested control flow inside bodies ----

LIBRARY_FUNCTIONS = {"exp": (jnp.exp, np.exp), "log": (lambda v: jnp.log(v * v + 1.0), lambda v: np.log(v * v + 1.0)),
                     "tanh": (jnp.tanh, np.tanh), "cos": (jnp.cos, np.cos),
                     "softmax": (lambda v: fnx.nn.softmax(v), lambda v: np.exp(v) / np.exp(v).sum())}


@pytest.mark.parametrize("name", list(LIBRARY_FUNCTIONS))
def test_library_functions_inside_bodies(name, mode, device):
    fn, ref = LIBRARY_FUNCTIONS[name]
    x, xs = floats((3,), 40), floats((4, 3), 41) * 0.5
    assert_tree_close(mode(lambda a: lax.cond(True, fn, lambda v: v, a))(jnp.asarray(x)), ref(x), rtol=1e-5)
    assert_tree_close(mode(lambda xs: lax.scan(lambda c, x: (fn(c * 0.5 + x), None), jnp.zeros(3), xs)[0])(
        jnp.asarray(xs)), _scan_reference(lambda c, x: (ref(c * 0.5 + x), None), np.zeros(3, np.float32), xs)[0],
        rtol=1e-5)
    assert_tree_close(mode(lambda a: lax.while_loop(lambda c: c[0] < 2, lambda c: (c[0] + 1, fn(c[1])), (0, a)))(
        jnp.asarray(x)), (np.int32(2), ref(ref(x))), rtol=1e-5)


def test_nested_control_flow(mode, device):
    xs = floats((4, 3), 42)

    def f(xs):
        def outer(c, x):
            inner, _ = lax.scan(lambda d, y: (d * 0.5 + y, None), c, x)
            chosen = lax.cond(inner > 0.0, lambda v: v * 2.0, lambda v: v - 1.0, inner)
            return lax.while_loop(lambda v: v > 3.0, lambda v: v * 0.5, chosen), inner
        return lax.scan(outer, np.float32(0.5), xs)

    def reference(xs):
        c, ins = np.float32(0.5), []
        for x in xs:
            for y in x: c = c * np.float32(0.5) + y
            ins.append(c)
            c = c * np.float32(2.0) if c > 0 else c - np.float32(1.0)
            while c > 3.0: c = c * np.float32(0.5)
        return c, np.stack(ins)
    assert_tree_close(mode(f)(jnp.asarray(xs)), reference(xs))
    assert_tree_close(mode(lambda i, a: lax.switch(i, [lambda v: v, lambda v: v * 2.0, lambda v: -v], a))(
        np.int32(2), jnp.asarray(xs)), -xs)


# ---- reverse mode ----

def _sin_recurrence(w, h0, xs):
    """h <- sin(h * w + x) over xs, and d h_T / d w by forward accumulation in numpy (float64)."""
    h, dh = np.asarray(h0, np.float64), np.zeros_like(np.asarray(w, np.float64))
    for x in xs:
        pre = h * w + x
        dh = np.cos(pre) * (h + w * dh)
        h = np.sin(pre)
    return h, dh


def _scan_loss(w, h0, xs):
    return lax.scan(lambda h, x: (jnp.sin(h * w + x), None), h0, xs)[0].sum()


def _unrolled_loss(w, h0, xs):
    h = h0
    for t in range(xs.shape[0]): h = jnp.sin(h * w + xs[t])
    return h.sum()


@pytest.mark.usefixtures("x64")
def test_grad_of_scan_against_hand_derivation_unrolling_and_finite_differences():
    w, h0, xs = floats((3,), 15, np.float64), floats((3,), 16, np.float64), floats((6, 3), 17, np.float64)
    g = fnx.grad(_scan_loss)(w, h0, xs)
    assert np.asarray(g).dtype == np.float64
    np.testing.assert_allclose(np.asarray(g), _sin_recurrence(w, h0, xs)[1], rtol=1e-10)
    np.testing.assert_allclose(np.asarray(g), np.asarray(fnx.grad(_unrolled_loss)(w, h0, xs)), rtol=1e-10)
    for argnum, arg in enumerate((w, h0, xs)):
        direction = floats(arg.shape, 18 + argnum, np.float64)
        analytic = np.sum(np.asarray(fnx.grad(_scan_loss, argnums=argnum)(w, h0, xs)) * direction)

        def along(a, argnum=argnum):
            args = [w, h0, xs]
            args[argnum] = a
            return _scan_loss(*args)
        np.testing.assert_allclose(analytic, central_difference(along, arg, direction), rtol=1e-6)


@pytest.mark.usefixtures("x64")
def test_grad_of_scan_through_ys_and_carry_pytrees():
    xs = floats((5, 2), 20, np.float64)

    def loss(params):
        def step(carry, x):
            a, b = carry
            new = (a * params["w"] + x, b + jnp.sin(a) * params["v"])
            return new, (new[0] * new[1]).sum()
        (a, b), ys = lax.scan(step, (jnp.ones(2, dtype=jnp.float64), jnp.zeros(2, dtype=jnp.float64)), xs)
        return (a * b).sum() + (ys ** 2).sum()

    def unrolled(params):
        a, b, total = jnp.ones(2, dtype=jnp.float64), jnp.zeros(2, dtype=jnp.float64), 0.0
        for t in range(xs.shape[0]):
            a, b = a * params["w"] + xs[t], b + jnp.sin(a) * params["v"]
            total = total + ((a * b).sum()) ** 2
        return (a * b).sum() + total
    params = {"w": np.float64(0.7), "v": np.array([0.3, -0.2])}
    assert_tree_close(fnx.grad(loss)(params), fnx.grad(unrolled)(params), rtol=1e-10)


@pytest.mark.parametrize("branch", [True, False])
@pytest.mark.usefixtures("x64")
def test_grad_of_cond_both_branches(branch, device):
    x, w = floats((3,), 21, np.float64), np.float64(1.3)

    def f(x, w):
        return lax.cond(x.sum() > (-100.0 if branch else 100.0),
                        lambda x: (jnp.sin(x) * w).sum(), lambda x: (x * x).sum() * w, x)
    gx, gw = fnx.grad(f, argnums=(0, 1))(x, w)
    if branch:
        assert_tree_close((gx, gw), (np.cos(x) * w, np.sin(x).sum()), rtol=1e-10)
    else:
        assert_tree_close((gx, gw), (2 * x * w, (x * x).sum()), rtol=1e-10)
    assert_tree_close(fnx.jit(fnx.grad(f, argnums=(0, 1)))(x, w), (gx, gw), rtol=1e-10)


@pytest.mark.usefixtures("x64")
def test_grad_of_fori_loop_with_static_bounds():
    def f(w):
        return lax.fori_loop(0, 4, lambda i, c: c * w + i, np.float64(1.0))
    # c4 = w^4 + 0 w^3 + 1 w^2 + 2 w + 3, so dc4/dw = 4 w^3 + 2 w + 2
    w = np.float64(0.6)
    np.testing.assert_allclose(float(np.asarray(fnx.grad(f)(w))), 4 * w ** 3 + 2 * w + 2, rtol=1e-12)
    np.testing.assert_allclose(float(np.asarray(fnx.jit(fnx.grad(f))(w))), 4 * w ** 3 + 2 * w + 2, rtol=1e-12)


@pytest.mark.usefixtures("x64")
def test_grad_of_nested_scan_and_cond():
    xs = floats((4, 3), 22, np.float64)

    def f(w):
        def outer(c, x):
            inner, _ = lax.scan(lambda d, y: (d * w + y, None), c, x)
            return lax.cond(inner > 0.0, lambda v: v * w, lambda v: jnp.sin(v), inner), inner
        return lax.scan(outer, np.float64(0.5), xs)[0]

    def unrolled(w):
        c = 0.5
        for x in xs:
            for y in x: c = c * w + y
            c = c * w if float(np.asarray(c)) > 0 else jnp.sin(c)
        return c
    w = np.float64(0.8)
    assert_tree_close(f(w), unrolled(w), rtol=1e-10)
    assert_tree_close(fnx.grad(f)(w), fnx.grad(unrolled)(w), rtol=1e-10)
    np.testing.assert_allclose(float(np.asarray(fnx.grad(f)(w))), central_difference(f, w, 1.0), rtol=1e-6)


def test_reverse_mode_of_while_loop_raises():
    def f(x):
        return lax.while_loop(lambda c: c[0] < 3, lambda c: (c[0] + 1, c[1] * x), (0, 1.0))[1]
    with pytest.raises(TypeError, match="while_loop"):
        fnx.grad(f)(0.5)
    with pytest.raises(TypeError, match="while_loop"):
        fnx.grad(lambda x: lax.fori_loop(0, jnp.asarray(3), lambda i, c: c * x, 1.0))(0.5)


@pytest.mark.parametrize("name", ["scan", "cond", "fori"])
def test_jit_of_grad_equals_grad(name, device):
    xs = jnp.asarray(floats((5,), 23))
    fns = {"scan": lambda w: lax.scan(lambda c, x: (jnp.sin(c * w) + x, c), 0.1, xs)[1].sum(),
           "cond": lambda w: lax.cond(w > 0, lambda v: v ** 3, lambda v: -v, w),
           "fori": lambda w: lax.fori_loop(0, 5, lambda i, c: c * w + xs[i], 0.0)}
    w = np.float32(0.7)
    assert_tree_close(fnx.jit(fnx.grad(fns[name]))(w), fnx.grad(fns[name])(w), rtol=1e-5)


# ---- forward mode ----

@pytest.mark.usefixtures("x64")
def test_jvp_of_cond_scan_and_while_against_finite_differences():
    xs = floats((5,), 24, np.float64)
    fns = {
        "cond": lambda w: lax.cond(w > 0.0, lambda v: jnp.sin(v) * v, lambda v: v ** 3, w),
        "scan": lambda w: lax.scan(lambda c, x: (jnp.sin(c * w + x), c), np.float64(0.2), xs)[0],
        "scan ys": lambda w: lax.scan(lambda c, x: (jnp.sin(c * w + x), c * w), np.float64(0.2), xs)[1].sum(),
        "while": lambda w: lax.while_loop(lambda c: c[0] < 4, lambda c: (c[0] + 1, jnp.sin(c[1] * w) + 1.0),
                                          (0, np.float64(0.3)))[1],
    }
    for name, f in fns.items():
        for w in (np.float64(0.7), np.float64(-0.4)):
            primal, tangent = fnx.jvp(f, (w,), (np.float64(1.0),))
            np.testing.assert_allclose(float(np.asarray(primal)), float(np.asarray(f(w))), rtol=1e-12, err_msg=name)
            np.testing.assert_allclose(float(np.asarray(tangent)), central_difference(f, w, 1.0), rtol=1e-6,
                                       err_msg=name)


@pytest.mark.usefixtures("x64")
def test_jvp_of_scan_with_pytree_tangents():
    xs = floats((4, 2), 25, np.float64)

    def f(init):
        return lax.scan(lambda c, x: ({"a": c["a"] * c["b"] + x, "b": c["b"]}, c["a"].sum()), init, xs)
    init = {"a": np.array([0.5, -0.2]), "b": np.array([1.1, 0.9])}
    t = {"a": np.array([1.0, 0.0]), "b": np.array([0.3, -0.5])}
    _, tangent = fnx.jvp(f, (init,), (t,))
    eps = 1e-6
    plus = f(tree_util.tree_map(lambda p, d: p + eps * d, init, t))
    minus = f(tree_util.tree_map(lambda p, d: p - eps * d, init, t))
    expected = tree_util.tree_map(lambda a, b: (np.asarray(a) - np.asarray(b)) / (2 * eps), plus, minus)
    assert_tree_close(tangent, expected, rtol=1e-6, atol=1e-8)


# ---- vmap ----

def test_vmap_cond_batched_predicate_selects_per_example(device):
    x, preds = floats((5, 3), 26), np.array([True, False, False, True, False])

    def f(p, x):
        return lax.cond(p, lambda v: (jnp.sin(v), v.sum()), lambda v: (v * 2.0, v.max()), x)
    expected = tree_util.tree_map(lambda *v: np.stack(v), *[
        (np.sin(x[i]), x[i].sum()) if preds[i] else (x[i] * 2.0, x[i].max()) for i in range(5)])
    assert_tree_close(fnx.vmap(f)(jnp.asarray(preds), jnp.asarray(x)), expected)
    assert_tree_close(fnx.jit(fnx.vmap(f))(jnp.asarray(preds), jnp.asarray(x)), expected)


def test_vmap_cond_traced_batched_predicate_from_data(device):
    x = floats((6, 3), 27)
    f = fnx.vmap(lambda v: lax.cond(v.sum() > 0, lambda v: v + 1.0, lambda v: -v, v))
    expected = np.stack([v + 1.0 if v.sum() > 0 else -v for v in x])
    assert_tree_close(f(jnp.asarray(x)), expected)


def test_vmap_cond_unbatched_predicate(device):
    x = floats((4, 3), 28)
    for p in (True, False):
        f = fnx.vmap(lambda v, p: lax.cond(p, lambda v: v * 3.0, lambda v: v - 3.0, v), in_axes=(0, None))
        assert_tree_close(f(jnp.asarray(x), p), x * 3.0 if p else x - 3.0)


def test_vmap_while_runs_until_every_lane_is_done(device):
    limits = np.array([0, 3, 1, 7, 5], np.int32)
    starts = np.array([1.0, 2.0, -1.0, 0.5, 3.0], np.float32)

    def f(n, x):
        return lax.while_loop(lambda c: c[0] < n, lambda c: (c[0] + 1, c[1] * 1.5 + 1.0), (0, x))

    def reference(n, x):
        i = 0
        while i < n: i, x = i + 1, x * np.float32(1.5) + np.float32(1.0)
        return np.int32(i), x
    expected = tree_util.tree_map(lambda *v: np.stack(v), *[reference(n, x) for n, x in zip(limits, starts)])
    assert_tree_close(fnx.vmap(f)(jnp.asarray(limits), jnp.asarray(starts)), expected)
    assert_tree_close(fnx.jit(fnx.vmap(f))(jnp.asarray(limits), jnp.asarray(starts)), expected)


def test_vmap_while_batched_carry_only(device):
    starts = np.array([0.0, 3.0, 7.0, 4.5], np.float32)
    f = fnx.vmap(lambda x: lax.while_loop(lambda c: c < 5.0, lambda c: c + 1.0, x))
    expected = np.array([5.0, 5.0, 7.0, 5.5], np.float32)
    assert_tree_close(f(jnp.asarray(starts)), expected)


@pytest.mark.parametrize("batched", ["xs", "init", "both"])
def test_vmap_scan(batched, device):
    xs, init = floats((4, 6, 3), 29), floats((4, 3), 30)

    def f(init, xs):
        return lax.scan(lambda c, x: (jnp.sin(c + x), (c * x).sum()), init, xs)
    in_axes = {"xs": (None, 0), "init": (0, None), "both": (0, 0)}[batched]
    expected = tree_util.tree_map(lambda *v: np.stack(v), *[_scan_reference(
        lambda c, x: (np.sin(c + x), (c * x).sum()),
        init[i] if in_axes[0] == 0 else init[0], xs[i] if in_axes[1] == 0 else xs[0]) for i in range(4)])
    args = (jnp.asarray(init if in_axes[0] == 0 else init[0]), jnp.asarray(xs if in_axes[1] == 0 else xs[0]))
    assert_tree_close(fnx.vmap(f, in_axes=in_axes)(*args), expected, rtol=1e-5)
    assert_tree_close(fnx.jit(fnx.vmap(f, in_axes=in_axes))(*args), expected, rtol=1e-5)


@pytest.mark.usefixtures("x64")
def test_vmap_of_grad_of_scan_gives_per_example_gradients(device):
    w, h0, xs = floats((3,), 31, np.float64), floats((3,), 32, np.float64), floats((5, 6, 3), 33, np.float64)
    per_example = fnx.vmap(fnx.grad(_scan_loss), in_axes=(None, None, 0))
    expected = np.stack([_sin_recurrence(w, h0, x)[1] for x in xs])
    np.testing.assert_allclose(np.asarray(per_example(w, h0, xs)), expected, rtol=1e-10)
    np.testing.assert_allclose(np.asarray(fnx.jit(per_example)(w, h0, xs)), expected, rtol=1e-10)


def test_vmap_scan_matches_jax():
    jax = pytest.importorskip("jax")
    xs = floats((3, 5, 2), 34)

    def f(lib_lax, lib_np, xs):
        return lib_lax.scan(lambda c, x: (c * 0.5 + lib_np.sin(x), c), lib_np.zeros(2, np.float32), xs)
    expected = jax.vmap(lambda xs: f(jax.lax, jax.numpy, xs))(xs)
    assert_tree_close(fnx.jit(fnx.vmap(lambda xs: f(lax, jnp, xs)))(jnp.asarray(xs)), expected, rtol=1e-5)


# ---- errors ----

def test_cond_branches_with_different_shapes_or_dtypes_raise():
    x = jnp.ones(3)
    with pytest.raises(TypeError, match=r"float32\[3\].*float32\[\]"):
        lax.cond(True, lambda a: a, lambda a: a.sum(), x)
    with pytest.raises(TypeError, match=r"float32\[3\].*int32\[3\]"):
        lax.cond(True, lambda a: a, lambda a: a.astype(jnp.int32), x)
    with pytest.raises(TypeError, match="cond"):
        lax.cond(True, lambda a: (a, a), lambda a: a, x)
    with pytest.raises(TypeError, match=r"float32\[3\].*int32\[3\]"):
        fnx.jit(lambda x: lax.switch(1, [lambda a: a, lambda a: a.astype(jnp.int32)], x))(x)


def test_loop_carry_that_changes_type_raises():
    with pytest.raises(TypeError, match=r"while_loop.*float32\[\].*int32\[\]"):
        lax.while_loop(lambda c: c < 3, lambda c: c + 1.5, 0)
    with pytest.raises(TypeError, match="while_loop"):
        lax.while_loop(lambda c: c.sum() < 3, lambda c: jnp.concatenate([c, c]), jnp.ones(2))
    with pytest.raises(TypeError, match=r"scan.*int32\[\].*float32\[\]"):
        lax.scan(lambda c, x: (c.astype(jnp.int32), c), 1.0, jnp.ones(3))
    with pytest.raises(TypeError, match="scan"):
        lax.scan(lambda c, x: (jnp.stack([c, x]), c), 1.0, jnp.ones(3))
    with pytest.raises(TypeError, match="scan"):
        fnx.jit(lambda x: lax.fori_loop(0, 3, lambda i, c: c.astype(jnp.int32), x))(jnp.ones(2))


def test_scan_xs_of_different_lengths_raise():
    with pytest.raises(ValueError, match=r"\[3, 4\]"):
        lax.scan(lambda c, x: (c, c), 1.0, (jnp.ones(3), jnp.ones(4)))
    with pytest.raises(ValueError, match=r"\[3, 5\]"):
        lax.scan(lambda c, x: (c, c), 1.0, jnp.ones(3), length=5)
    with pytest.raises(ValueError, match="length"):
        lax.scan(lambda c, x: (c, c), 1.0, None)


def test_cond_non_scalar_or_float_predicate_raises():
    with pytest.raises(TypeError, match=r"bool\[2\]"):
        lax.cond(jnp.asarray([True, False]), lambda a: a, lambda a: a, 1.0)
    with pytest.raises(TypeError, match="predicate"):
        lax.cond(1.5, lambda a: a, lambda a: a, 1.0)
    with pytest.raises(TypeError, match="predicate"):
        fnx.jit(lambda p: lax.cond(p, lambda a: a, lambda a: a, 1.0))(jnp.ones((1,), jnp.bool_))


def test_while_cond_fun_must_return_a_scalar_bool():
    with pytest.raises(TypeError, match="scalar bool"):
        lax.while_loop(lambda c: c, lambda c: c + 1.0, jnp.ones(2))


# ---- long loops stay one node ----

def _geometric_scan(length: int):
    return lambda c: lax.scan(lambda c, _: (c * 0.999 + 1.0, c), c, None, length=length)


@pytest.mark.usefixtures("x64")
def test_long_scan_is_one_node_and_runs_under_jit(device):
    short = fnx.make_graph(_geometric_scan(10))(np.float64(0.0)).fn
    long = fnx.make_graph(_geometric_scan(10_000))(np.float64(0.0)).fn
    assert len(long.toposort) == len(short.toposort)
    carry, ys = fnx.jit(_geometric_scan(10_000))(np.float64(0.0))
    n, r = np.arange(10_001), 0.999
    geometric = (1 - r ** n) / (1 - r)  # c_t after t steps
    np.testing.assert_allclose(float(np.asarray(carry)), geometric[-1], rtol=1e-10)
    np.testing.assert_allclose(np.asarray(ys), geometric[:-1], rtol=1e-10, atol=1e-12)


def test_long_fori_loop_is_one_node():
    def f(steps):
        return lambda x: lax.fori_loop(0, steps, lambda i, c: c + i, x)
    short = fnx.make_graph(f(10))(np.int32(0)).fn
    long = fnx.make_graph(f(10_000))(np.int32(0)).fn
    assert len(long.toposort) == len(short.toposort)
    assert int(np.asarray(fnx.jit(f(10_000))(np.int32(0)))) == 10_000 * 9_999 // 2


def test_graph_with_control_flow_prints():
    text = str(fnx.make_graph(_geometric_scan(3))(np.float32(0.0)))
    assert "SCAN" in text.upper()


# ---- the first control-flow op of a process (no earlier traces to shift the counters) ----

FIRST_OP_PROGRAM = """
import fnx
from fnx import lax
f = lambda w: lax.scan(lambda c, _: (c * w, None), 1.0, None, length=3)[0]
print(float(fnx.jvp(f, (0.5,), (1.0,))[1]), float(fnx.grad(f)(0.5)))
"""


def test_grad_of_the_first_scan_in_a_fresh_process():
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    out = subprocess.run([sys.executable, "-c", FIRST_OP_PROGRAM], cwd=root, capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    tangent, gradient = map(float, out.stdout.split())
    assert (tangent, gradient) == pytest.approx((0.75, 0.75))  # d(w^3)/dw at 0.5


def test_tracing_the_same_loop_again_builds_the_same_graph():
    """A control node's tag is the one every node of its content gets, so tracing the same loop again (a new
    function object, the same content) builds the same graph, and an eager op holding a loop (gcd's, a
    factorization's) finds its compiled loop instead of lowering and compiling it again (gcd of 64 ints: 64 ms a
    call); loops of other content keep their own tags, and one loop body on two operands gives each its result."""
    x, y = np.arange(1, 9, dtype=np.int32), np.arange(20, 28, dtype=np.int32)
    graph = lambda k: fnx.make_graph(lambda p: lax.fori_loop(0, 5, lambda i, v: v * k + i, p))(x).fn  # noqa: E731
    assert graph(2) is graph(2)
    assert graph(2) is not graph(3)
    body = lambda i, v: v * 2 + i  # noqa: E731
    want = lambda v, k: functools.reduce(lambda acc, i: acc * k + i, range(5), v)  # noqa: E731
    both = fnx.jit(lambda p, q: (lax.fori_loop(0, 5, body, p), lax.fori_loop(0, 5, lambda i, v: v * 2 + i, q),
                                 lax.fori_loop(0, 5, lambda i, v: v * 3 + i, p)))(x, y)
    for got, expected in zip(both, (want(x, 2), want(y, 2), want(x, 3))):
        np.testing.assert_array_equal(np.asarray(got), expected)
    a, b = np.arange(1, 65, dtype=np.int32), np.arange(3, 67, dtype=np.int32)
    np.testing.assert_array_equal(np.asarray(jnp.gcd(a, b)), np.gcd(a, b))
    np.testing.assert_array_equal(np.asarray(jnp.gcd(b, a[::-1])), np.gcd(b, a[::-1]))
