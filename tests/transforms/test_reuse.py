"""One wrapped function called several times inside one loss, with different weights each time, under every
transform and their nesting, against JAX running the same program in float64.

A checkpointed / custom_jvp / custom_vjp / jitted / control-flow block is traced once and its body is shared
(hash-consed) by every call; a transform that binds one call's PARAMs must leave the other calls alone (the
bug: every call after the first got a zero or wrong gradient)."""
import pytest

jax = pytest.importorskip("jax")

import jax.numpy as jjnp  # noqa: E402
import numpy as np  # noqa: E402

import fnx  # noqa: E402
import fnx.numpy as jnp  # noqa: E402


pytestmark = pytest.mark.usefixtures("x64")  # fnx and JAX in float64


LIBS = {"fnx": (fnx, jnp), "jax": (jax, jjnp)}


def _layer(m, w, h):
    z = h @ w
    return m.tanh(z) * m.sin(z) + 0.5 * h


def _layer_jvp(m, primals, tangents):
    (w, h), (tw, th) = primals, tangents
    z, tz = h @ w, th @ w + h @ tw
    out = m.tanh(z) * m.sin(z) + 0.5 * h
    dz = (1 - m.tanh(z) ** 2) * m.sin(z) + m.tanh(z) * m.cos(z)
    return out, dz * tz + 0.5 * th


def _blocks(lib: str) -> dict:
    """The same block wrapped each way, in `lib`."""
    t, m = LIBS[lib]
    plain = lambda w, h: _layer(m, w, h)  # noqa: E731

    cjvp = t.custom_jvp(plain)
    cjvp.defjvp(lambda p, tg: _layer_jvp(m, p, tg))

    cvjp = t.custom_vjp(plain)

    def fwd(w, h): return plain(w, h), (w, h)

    def bwd(res, g):
        w, h = res
        z = h @ w
        dz = g * ((1 - m.tanh(z) ** 2) * m.sin(z) + m.tanh(z) * m.cos(z))
        return h.T @ dz, dz @ w.T + 0.5 * g
    cvjp.defvjp(fwd, bwd)

    def cond(w, h):
        return t.lax.cond(m.sum(h) > -1e9, plain, lambda w, h: h * 0.0, w, h)

    def scan(w, h):
        return t.lax.scan(lambda c, _: (plain(w, c), None), h, None, length=2)[0]

    return {"checkpoint": t.checkpoint(plain), "custom_jvp": cjvp, "custom_vjp": cvjp, "jit": t.jit(plain),
            "cond": cond, "scan": scan, "checkpoint_of_jit": t.checkpoint(t.jit(plain)),
            "jit_of_checkpoint": t.jit(t.checkpoint(plain)), "checkpoint_in_scan":
            lambda w, h: t.lax.scan(lambda c, _: (t.checkpoint(plain)(w, c), None), h, None, length=2)[0]}


KINDS = list(_blocks("jax"))


def _loss(lib, kind):
    block = _blocks(lib)[kind]
    m = LIBS[lib][1]

    def loss(ws, h):
        for w in ws: h = block(w, h)
        return m.sum(h ** 2)
    return loss


rng = np.random.default_rng(11)
WS = [rng.standard_normal((4, 4)) * 0.7 for _ in range(3)]
H = rng.standard_normal((2, 4))
TWS = [rng.standard_normal((4, 4)) for _ in range(3)]
HB = rng.standard_normal((3, 2, 4))


def _transforms(lib, kind) -> dict:
    t = LIBS[lib][0]
    loss = _loss(lib, kind)
    grad = t.grad(loss)
    return {
        "grad": lambda: grad(WS, H),
        "jit_grad": lambda: t.jit(grad)(WS, H),
        "grad_h": lambda: t.grad(loss, argnums=1)(WS, H),
        "jvp": lambda: t.jvp(lambda ws: loss(ws, H), (WS,), (TWS,)),
        "vmap_grad": lambda: t.vmap(grad, in_axes=(None, 0))(WS, HB),
        "jit_vmap_grad": lambda: t.jit(t.vmap(grad, in_axes=(None, 0)))(WS, HB),
        "grad_grad": lambda: t.grad(lambda h: sum(LIBS[lib][1].sum(g * g) for g in grad(WS, h)))(H),
        "jacfwd": lambda: t.jacfwd(loss, argnums=1)(WS, H),
    }


CASES = [(k, tr) for k in KINDS for tr in _transforms("jax", "jit")]
# custom_vjp has no forward mode (as in JAX)
CASES = [(k, tr) for k, tr in CASES if not (k == "custom_vjp" and tr in ("jvp", "grad_grad", "jacfwd"))]


@pytest.mark.parametrize("kind,transform", CASES)
def test_block_called_three_times(kind, transform):
    expected = jax.tree_util.tree_leaves(_transforms("jax", kind)[transform]())
    got = fnx.tree_util.tree_leaves(_transforms("fnx", kind)[transform]())
    assert len(got) == len(expected)
    for g, e in zip(got, expected):
        np.testing.assert_allclose(np.asarray(g), np.asarray(e), rtol=1e-9, atol=1e-10)
        assert np.abs(np.asarray(e)).max() > 1e-3  # a gradient that is zero would hide the bug


def test_custom_vjp_forward_mode_raises():
    loss = _loss("fnx", "custom_vjp")
    with pytest.raises(TypeError, match="custom_vjp"):
        fnx.jvp(lambda ws: loss(ws, H), (WS,), (TWS,))
