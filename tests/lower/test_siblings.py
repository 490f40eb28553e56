"""Sibling kernels (fnx/lower/siblings.py): elementwise kernels over the same loops that read an element in
common become one kernel with several stores. Each test counts the kernels of the lowered program (so it fails
if nothing merged, or if what must not merge did) and checks the values against numpy."""
from __future__ import annotations

import numpy as np
import pytest

from assertions import from_threads
import fnx
import fnx.numpy as jnp
from fnx.lower import siblings

RNG = np.random.default_rng(3)


def _kernels(f, *args) -> list[str]:
    return [line for line in fnx.jit(f).lower(*args).as_text("optimize").splitlines() if line.startswith("kernel")]


def _adam(p, g, mu, nu):
    mu = {k: 0.9 * mu[k] + 0.1 * g[k] for k in p}
    nu = {k: 0.999 * nu[k] + 0.001 * g[k] ** 2 for k in p}
    return {k: p[k] - 1e-3 * mu[k] / (jnp.sqrt(nu[k]) + 1e-8) for k in p}, mu, nu


def _adam_numpy(p, g, mu, nu):
    mu = {k: 0.9 * mu[k] + 0.1 * g[k] for k in p}
    nu = {k: 0.999 * nu[k] + 0.001 * g[k] ** 2 for k in p}
    return {k: p[k] - 1e-3 * mu[k] / (np.sqrt(nu[k]) + 1e-8) for k in p}, mu, nu


def _state(shapes):
    p = {f"w{i}": RNG.standard_normal(s).astype(np.float32) for i, s in enumerate(shapes)}
    g = {k: RNG.standard_normal(v.shape).astype(np.float32) for k, v in p.items()}
    mu = {k: RNG.standard_normal(v.shape).astype(np.float32) * 0.1 for k, v in p.items()}
    nu = {k: np.abs(RNG.standard_normal(v.shape)).astype(np.float32) for k, v in p.items()}
    return p, g, mu, nu


def _close(got, want):
    for a, b in zip(fnx.tree_util.tree_leaves(got), fnx.tree_util.tree_leaves(want)):
        np.testing.assert_allclose(np.asarray(a), b.astype(np.float64), rtol=2e-6, atol=1e-7)


def test_an_optimizer_step_is_one_kernel_a_tensor():
    """Adam's new parameter, first and second moment of each tensor (20 tensors, several shapes, one of them
    odd): one kernel each, not three, with the values of numpy's float64 step; twice, and from four threads."""
    state = _state([(512, 512), (512,), (37, 70), (64, 3, 3)] * 5)
    assert len(_kernels(_adam, *state)) == 20
    want = _adam_numpy(*[{k: v.astype(np.float64) for k, v in s.items()} for s in state])
    f = fnx.jit(_adam)
    results = from_threads(lambda: f(*state))
    for got in results: _close(got, want)


def test_a_donated_optimizer_state_merges_and_stays_right():
    """With the parameters and moments donated (a training loop's step), the merged kernels write where they
    read; five steps in a row match numpy's."""
    p, g, mu, nu = _state([(256, 384), (384,)])
    f = fnx.jit(_adam, donate_argnums=(0, 2, 3))
    want = [{k: v.astype(np.float64) for k, v in s.items()} for s in (p, g, mu, nu)]
    state = [{k: jnp.asarray(v) for k, v in s.items()} for s in (p, mu, nu)]
    for _ in range(5):
        state = list(f(state[0], g, state[1], state[2]))
        want[0], want[2], want[3] = _adam_numpy(*want)
    _close(state, [want[0], want[2], want[3]])


def test_what_must_not_merge_does_not():
    """Different loop sizes, a transposed store, and a kernel that reads another's output at other elements stay
    apart; a value computed from another output merges with it (its kernel computes that output again, at the
    same element); values exact."""
    x, y = RNG.standard_normal((64, 48)).astype(np.float32), RNG.standard_normal((48, 64)).astype(np.float32)
    assert len(_kernels(lambda x, y: (x * 2, y * 3), x, y)) == 2  # (nothing read in common)
    assert len(_kernels(lambda x: (x * 2, x.T * 3), x)) == 2      # (one stores transposed)
    assert len(_kernels(lambda x: (x * 2, x[:32] * 3), x)) == 2   # (other loop sizes)
    f = lambda x: (x * 2, x * 2 + x, jnp.exp(x))  # noqa: E731
    assert len(_kernels(f, x)) == 1
    for got, want in zip(fnx.jit(f)(x), (x * 2, x * 2 + x, np.exp(x))):
        np.testing.assert_allclose(np.asarray(got), want, rtol=1e-6)
    shift = lambda x: (x * 2, jnp.roll(x * 2, 1, axis=0) + jnp.cumsum(x, axis=0))  # noqa: E731
    np.testing.assert_allclose(np.asarray(fnx.jit(shift)(x)[1]), np.roll(x * 2, 1, axis=0) + np.cumsum(x, axis=0),
                               rtol=1e-5, atol=1e-5)


def test_at_most_max_stores_outputs_a_kernel():
    x = RNG.standard_normal((128, 96)).astype(np.float32)
    f = lambda x: tuple(x * k for k in range(1, 7))  # noqa: E731
    assert len(_kernels(f, x)) == -(-6 // siblings.MAX_STORES)
    for k, got in enumerate(fnx.jit(f)(x), start=1): np.testing.assert_array_equal(np.asarray(got), x * np.float32(k))


def test_a_loop_between_siblings_keeps_their_order():
    """A kernel after a while_loop that reads the loop's result cannot move before the loop into its sibling;
    one that does not read it can."""
    x = RNG.standard_normal((32, 40)).astype(np.float32)

    def f(x):
        a = x * 2
        s = fnx.lax.while_loop(lambda c: c[0] < 3, lambda c: (c[0] + 1, c[1] * 1.5), (0, x))[1]
        return a, s + x, x + 1
    got = fnx.jit(f)(x)
    for g, w in zip(got, (x * 2, x * np.float32(1.5) ** 3 + x, x + 1)):
        np.testing.assert_allclose(np.asarray(g), w, rtol=1e-6)


@pytest.mark.parametrize("merge", [0, 1])
def test_grad_of_a_merged_program_matches_jax(merge, monkeypatch):
    """The gradient of a function with several elementwise outputs of one input (their backward pass sums
    siblings) is JAX's, with and without merging."""
    jax = pytest.importorskip("jax")
    from fnx.lower import pipeline
    monkeypatch.setattr(pipeline, "MERGE_SIBLINGS", merge)
    x = RNG.standard_normal((96, 80)).astype(np.float32)

    def loss(lib):
        return lambda x: (lib.tanh(x) * lib.exp(-x * x)).sum() + (x * lib.sin(x)).mean()
    got = fnx.jit(fnx.grad(loss(jnp)))(x)
    want = jax.jit(jax.grad(loss(jax.numpy)))(x)
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-5, atol=1e-6)


def test_an_output_stored_over_an_input_that_a_sibling_still_reads_is_not():
    """A merged kernel stored tanh(z) over z (z's last reader, in place), then computed sin(z) for its next output:
    its arguments are `noalias`, and LLVM read z's lanes for the `sin` from memory again, after the store (the
    gradient of three jitted blocks came out wrong). The memory plan now writes an output over an input only when
    every op reading that input feeds the output (`chain.used_before`); the gradient is JAX's."""
    jax = pytest.importorskip("jax")
    rng = np.random.default_rng(11)
    ws = [rng.standard_normal((4, 4)).astype(np.float32) * 0.7 for _ in range(3)]
    h = rng.standard_normal((2, 4)).astype(np.float32)

    def loss(t, m):
        block = t.jit(lambda w, h: m.tanh(h @ w) * m.sin(h @ w) + 0.5 * h)

        def f(ws, h):
            for w in ws: h = block(w, h)
            return m.sum(h ** 2)
        return f
    f = fnx.jit(fnx.grad(loss(fnx, jnp)))
    assert len(_kernels(fnx.grad(loss(fnx, jnp)), ws, h)) < 17  # (siblings merged)
    want = jax.grad(loss(jax, jax.numpy))(ws, h)
    for _ in range(2):
        for a, b in zip(f(ws, h), want): np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=1e-6)
