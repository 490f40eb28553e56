"""Scans whose body runs as one native loop (fnx/backends/scan_loop.py) against a Python loop over numpy."""
import numpy as np
import pytest

import fnx
import fnx.numpy as jnp
from fnx.backends import cpu_llvm, scan_loop


def _native_programs():
    return {node: prog for node, prog in cpu_llvm._scans.items()}


def _python_scan(step, carry, xs, reverse=False):
    ys, order = [], range(len(xs) - 1, -1, -1) if reverse else range(len(xs))
    out = [None] * len(xs)
    for t in order:
        carry, y = step(carry, xs[t])
        out[t] = y
    ys = out
    return carry, np.stack(ys) if ys else np.zeros((0,))


@pytest.mark.parametrize("length", [1, 2, 7, 64])
@pytest.mark.parametrize("reverse", [False, True])
def test_rnn_cell_matches_a_python_loop(length, reverse):
    rng = np.random.default_rng(length)
    h0 = rng.standard_normal((4, 8)).astype(np.float32)
    xs = rng.standard_normal((length, 4, 3)).astype(np.float32)
    wh, wx = rng.standard_normal((8, 8)).astype(np.float32) * 0.3, rng.standard_normal((3, 8)).astype(np.float32)

    def run(h, xs, wh, wx):
        return fnx.lax.scan(lambda h, x: (jnp.tanh(h @ wh + x @ wx), (h * 2).sum(axis=1)), h, xs, reverse=reverse)
    before = set(_native_programs())
    carry, ys = fnx.jit(run)(*map(jnp.asarray, (h0, xs, wh, wx)))
    want_carry, want_ys = _python_scan(lambda h, x: (np.tanh(h @ wh + x @ wx), (h * 2).sum(axis=1)), h0, xs, reverse)
    np.testing.assert_allclose(np.asarray(carry), want_carry, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(np.asarray(ys), want_ys, rtol=1e-5, atol=1e-5)
    new = {n: p for n, p in _native_programs().items() if n not in before}
    assert any(p is not None for p in new.values()), "the body should have run as a native loop"


def test_several_carries_of_several_dtypes_and_scalar_outputs():
    xs = np.arange(10, dtype=np.int32)

    def step(c, x):
        total, flag, count = c
        total = total + x.astype(jnp.float32) * 0.5
        return (total, flag ^ (x % 3 == 0), count + 1), total.sum()
    out = fnx.jit(lambda xs: fnx.lax.scan(step, (jnp.zeros(3), jnp.asarray(False), jnp.asarray(0)), xs))(
        jnp.asarray(xs))
    (total, flag, count), ys = out
    t, f, want_ys = np.zeros(3, np.float32), False, []
    for x in xs:
        t = t + np.float32(x) * 0.5
        f = f ^ (x % 3 == 0)
        want_ys.append(t.sum())
    np.testing.assert_allclose(np.asarray(total), t)
    assert bool(np.asarray(flag)) == f and int(np.asarray(count)) == 10
    np.testing.assert_allclose(np.asarray(ys), want_ys, rtol=1e-6)


def test_a_body_that_passes_a_carry_through_falls_back_to_the_host_loop():
    def step(c, x):
        a, b = c
        return (a, b + x * a), b  # `a` is returned unchanged: an output that is an operand
    xs = np.linspace(0, 1, 5).astype(np.float32)
    (a, b), ys = fnx.jit(lambda xs: fnx.lax.scan(step, (jnp.asarray(2.0), jnp.asarray(1.0)), xs))(jnp.asarray(xs))
    want_b, want_ys = 1.0, []
    for x in xs:
        want_ys.append(want_b)
        want_b = want_b + x * 2.0
    assert float(np.asarray(a)) == 2.0
    np.testing.assert_allclose(float(np.asarray(b)), want_b, rtol=1e-6)
    np.testing.assert_allclose(np.asarray(ys), want_ys, rtol=1e-6)


def test_closed_over_arrays_are_operands_not_their_broadcasts():
    """The body closes over `w` itself; its broadcast for the batched matmul stays inside the body."""
    w = jnp.ones((8, 8))
    run = fnx.jit(lambda h, xs: fnx.lax.scan(lambda h, x: (h @ w + x, None), h, xs)[0])
    text = run.lower(jnp.zeros((2, 8)), jnp.zeros((3, 2, 8))).as_text("optimize")
    assert "E_2_8_8" not in text  # no kernel materializes w broadcast over the batch


# ---- while_loop: the body and the condition on its result in one native loop ----

@pytest.mark.parametrize("n", [0, 1, 2, 5, 300])
def test_while_loop_matches_a_python_loop_natively(n):
    """Carries of three dtypes, a closed-over matrix (a carry the body passes through), even and odd step counts
    (the carries swap buffers every step) and zero steps (the condition fails on the initial carry)."""
    rng = np.random.default_rng(n)
    w = (rng.standard_normal((5, 5)) * 0.4).astype(np.float32)
    x0 = rng.standard_normal(5).astype(np.float32)

    def run(x, w, n):
        def body(c):
            i, v, flag = c
            return i + 1, jnp.tanh(w @ v + 0.5), flag ^ (v[0] > 0)
        return fnx.lax.while_loop(lambda c: c[0] < n, body, (jnp.asarray(0), x, jnp.asarray(False)))
    cpu_llvm._scans.clear()  # (n is an argument: every n traces the same loop, one node that the first n compiled)
    before = set(_native_programs())
    i, v, flag = fnx.jit(run)(jnp.asarray(x0), jnp.asarray(w), n)
    want_v, want_flag = x0.astype(np.float64), False
    for _ in range(n):
        want_flag ^= bool(want_v[0] > 0)
        want_v = np.tanh(w.astype(np.float64) @ want_v + 0.5)
    assert int(i) == n and bool(flag) == want_flag
    np.testing.assert_allclose(np.asarray(v), want_v, rtol=2e-5, atol=2e-5)
    new = {node: p for node, p in _native_programs().items() if node not in before}
    assert any(isinstance(p, scan_loop.WhileProgram) for p in new.values()), "the loop should have run natively"


def test_while_loop_with_a_data_dependent_stop_under_vmap_and_twice():
    """Newton's square root until converged: the step count depends on the value; vmapped (the batched predicate)
    and called twice (the compiled loop is reused, its buffers fresh)."""
    def sqrt_newton(a):
        def body(c):
            x, k = c
            return 0.5 * (x + a / x), k + 1
        return fnx.lax.while_loop(lambda c: (jnp.abs(c[0] * c[0] - a) > 1e-5 * a) & (c[1] < 100), body,
                                  (a, jnp.asarray(0)))
    a = np.array([2.0, 9.0, 1e4, 0.25], np.float32)
    f = fnx.jit(fnx.vmap(sqrt_newton))
    for _ in range(2):
        x, k = f(jnp.asarray(a))
        np.testing.assert_allclose(np.asarray(x), np.sqrt(a), rtol=1e-5)
        assert np.all(np.asarray(k) > 0) and np.all(np.asarray(k) < 100)
    one, k_one = fnx.jit(sqrt_newton)(jnp.asarray(np.float32(1e4)))
    np.testing.assert_allclose(float(one), 100.0, rtol=1e-5)


def test_cond_runs_its_branch_from_a_native_driver():
    """Both branches in one module, picked by the predicate per call: values against numpy for either branch,
    called several times, and under vmap (where the batched predicate makes it a select of both)."""
    f = fnx.jit(lambda p, x, w: fnx.lax.cond(p, lambda x, w: (x @ w * 2.0, x.sum()),
                                             lambda x, w: (jnp.tanh(x) - 1.0 + w.sum(0), x.max()), x, w))
    rng = np.random.default_rng(3)
    x, w = rng.standard_normal((4, 6)).astype(np.float32), rng.standard_normal((6, 6)).astype(np.float32)
    before = set(_native_programs())
    for p in (True, False, False, True):
        a, b = f(p, jnp.asarray(x), jnp.asarray(w))
        want = (x @ w * 2, x.sum()) if p else (np.tanh(x) - 1 + w.sum(0), x.max())
        np.testing.assert_allclose(np.asarray(a), want[0], rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(float(b), want[1], rtol=1e-5)
    new = {node: p for node, p in _native_programs().items() if node not in before}
    assert any(isinstance(p, scan_loop.CondProgram) for p in new.values()), "the branches should run natively"
    batched = fnx.vmap(lambda p, x: fnx.lax.cond(p, lambda x: x * 2.0, lambda x: -x, x))
    got = batched(jnp.asarray([True, False, True]), jnp.asarray(x[:3]))
    np.testing.assert_allclose(np.asarray(got), np.where([[True], [False], [True]], x[:3] * 2, -x[:3]))
