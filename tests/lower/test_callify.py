"""callify: every call is inlined, at every depth, in one walk, and the program computes what it did as calls
(against numpy in float64 and the interp backend)."""
import numpy as np

import fnx
import fnx.numpy as jnp
from fnx import lax
from fnx.lower.pipeline import callify
from fnx.uop import Ops


def _calls_left(fn) -> list:
    return [u for u in fn.src[0].toposort if u.op in (Ops.CALL, Ops.FUNCTION)]


def _nested(depth: int):
    """A checkpointed block of two outputs calling the next one `depth` deep, each depth used twice (rangeify took
    20 s over this at depth 3, its choice of buffers walking every pair of values one above the other)."""
    def block(level):
        if level == depth: return lambda a, b: (jnp.sin(a) * b, a + jnp.cos(b))
        inner = fnx.checkpoint(block(level + 1))

        def f(a, b):
            p, q = inner(a * 0.5, b + 1.0)
            r, s = inner(q, p)  # the same callee on other arguments
            return p * s + r, q - r
        return f
    return fnx.checkpoint(block(0))


def _nested_numpy(depth: int, a, b):
    def block(level, a, b):
        if level == depth: return np.sin(a) * b, a + np.cos(b)
        p, q = block(level + 1, a * 0.5, b + 1.0)
        r, s = block(level + 1, q, p)
        return p * s + r, q - r
    return block(0, a, b)


def test_nested_checkpoints_inline_completely_and_compute_the_same():
    depth = 4
    rng = np.random.default_rng(3)
    a, b = (rng.uniform(-1, 1, 16).astype(np.float32) for _ in range(2))
    f = _nested(depth)
    fn = callify(fnx.make_graph(lambda a, b: f(a, b))(a, b).fn)
    assert _calls_left(fn) == []
    want = _nested_numpy(depth, a.astype(np.float64), b.astype(np.float64))
    got = fnx.jit(f)(a, b)
    for g, w in zip(got, want): np.testing.assert_allclose(np.asarray(g), w, rtol=1e-4, atol=1e-5)
    with fnx.default_device("interp"):
        oracle = fnx.jit(f)(a, b)
    for g, w in zip(got, oracle): np.testing.assert_allclose(np.asarray(g), np.asarray(w), rtol=1e-5, atol=1e-6)


def test_gradient_through_checkpoints_inside_a_scan():
    """A checkpointed callee inside a scan body inside a checkpoint: the scan's body keeps its own PARAMs while the
    calls around and inside it are inlined."""
    inner = fnx.checkpoint(lambda c, x: jnp.tanh(c * x + 0.1))

    def step(c, x):
        c = inner(c, x)
        return c, c * 2.0

    outer = fnx.checkpoint(lambda c0, xs: lax.scan(step, c0, xs)[1].sum())
    c0 = np.float32(0.3)
    xs = np.linspace(-1, 1, 7).astype(np.float32)

    def loss_numpy(c):
        total = 0.0
        for x in xs.astype(np.float64):
            c = np.tanh(c * x + 0.1)
            total += 2 * c
        return total

    value, grad = fnx.jit(fnx.value_and_grad(outer))(c0, xs)
    eps = 1e-6
    np.testing.assert_allclose(float(value), loss_numpy(0.3), rtol=1e-5)
    np.testing.assert_allclose(float(grad), (loss_numpy(0.3 + eps) - loss_numpy(0.3 - eps)) / (2 * eps), rtol=1e-3)
