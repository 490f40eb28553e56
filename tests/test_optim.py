"""fnx.optim against closed forms: each optimizer's first three updates for a fixed gradient sequence, written as
sums over the gradients (not as the recurrences the library uses), in float64; schedules against their formulas;
everything eagerly and under fnx.jit with dict-of-array params; optax as a second oracle where it is installed.
"""
import math

import numpy as np
import pytest

import fnx
import fnx.numpy as jnp
import fnx.optim as optim

LR, B1, B2, EPS, DECAY, WD = 0.1, 0.9, 0.999, 1e-8, 0.9, 0.01
P0 = {"w": np.array([1.0, -2.0, 3.0]), "b": np.array([0.5, -0.25])}
GRADS = [{"w": np.array([0.3, -1.2, 2.0]), "b": np.array([0.1, 0.0])},
         {"w": np.array([-0.5, 0.7, 1.5]), "b": np.array([-0.2, 0.4])},
         {"w": np.array([0.9, 0.1, -3.0]), "b": np.array([0.05, -0.6])}]


def ema(gs, decay, t, power=1):
    """(1 - decay) * sum_k decay^(t-k) g_k^power over steps k = 1..t: a moving average started from zero."""
    return (1 - decay) * sum(decay ** (t - k) * gs[k - 1] ** power for k in range(1, t + 1))


def momentum_trace(gs, beta, t):
    return sum(beta ** (t - k) * gs[k - 1] for k in range(1, t + 1))


# closed-form update at step t (1-based) of one leaf, from that leaf's gradients gs and its value p before the step
CLOSED = {
    "sgd": (lambda: optim.sgd(LR), lambda gs, t, p: -LR * gs[t - 1]),
    "momentum": (lambda: optim.sgd(LR, momentum=0.9), lambda gs, t, p: -LR * momentum_trace(gs, 0.9, t)),
    "momentum_fn": (lambda: optim.momentum(LR, beta=0.8), lambda gs, t, p: -LR * momentum_trace(gs, 0.8, t)),
    "nesterov": (lambda: optim.sgd(LR, momentum=0.9, nesterov=True),
                 lambda gs, t, p: -LR * (gs[t - 1] + 0.9 * momentum_trace(gs, 0.9, t))),
    "adam": (lambda: optim.adam(LR),
             lambda gs, t, p: -LR * (ema(gs, B1, t) / (1 - B1 ** t))
             / (np.sqrt(ema(gs, B2, t, 2) / (1 - B2 ** t)) + EPS)),
    "adam_eps_root": (lambda: optim.adam(LR, eps=1e-3, eps_root=1e-2),
                      lambda gs, t, p: -LR * (ema(gs, B1, t) / (1 - B1 ** t))
                      / (np.sqrt(ema(gs, B2, t, 2) / (1 - B2 ** t) + 1e-2) + 1e-3)),
    "nadam": (lambda: optim.nadam(LR),
              lambda gs, t, p: -LR * (B1 * ema(gs, B1, t) / (1 - B1 ** (t + 1)) + (1 - B1) * gs[t - 1] / (1 - B1 ** t))
              / (np.sqrt(ema(gs, B2, t, 2) / (1 - B2 ** t)) + EPS)),
    "adamw": (lambda: optim.adamw(LR, weight_decay=WD),
              lambda gs, t, p: -LR * ((ema(gs, B1, t) / (1 - B1 ** t))
                                      / (np.sqrt(ema(gs, B2, t, 2) / (1 - B2 ** t)) + EPS) + WD * p)),
    "rmsprop": (lambda: optim.rmsprop(LR, decay=DECAY),
                lambda gs, t, p: -LR * gs[t - 1] / np.sqrt(ema(gs, DECAY, t, 2) + EPS)),
    "rmsprop_eps_outside": (lambda: optim.rmsprop(LR, decay=DECAY, eps=1e-3, eps_in_sqrt=False),
                            lambda gs, t, p: -LR * gs[t - 1] / (np.sqrt(ema(gs, DECAY, t, 2)) + 1e-3)),
    "rmsprop_centered": (lambda: optim.rmsprop(LR, decay=DECAY, eps=1e-3, centered=True),
                         lambda gs, t, p: -LR * gs[t - 1]
                         / np.sqrt(ema(gs, DECAY, t, 2) - ema(gs, DECAY, t) ** 2 + 1e-3)),
    "rmsprop_momentum": (lambda: optim.rmsprop(LR, decay=DECAY, momentum=0.5),
                         lambda gs, t, p: -LR * sum(0.5 ** (t - k) * gs[k - 1] / np.sqrt(ema(gs, DECAY, k, 2) + EPS)
                                                    for k in range(1, t + 1))),
    "adagrad": (lambda: optim.adagrad(LR),
                lambda gs, t, p: -LR * gs[t - 1] / np.sqrt(0.1 + sum(g ** 2 for g in gs[:t]) + 1e-7)),
}


def _tree(fn, *trees):
    return {k: fn(*(t[k] for t in trees)) for k in trees[0]}


def _expected(name, steps=3):
    """The closed-form params after each of `steps` updates."""
    _, closed = CLOSED[name]
    params, out = dict(P0), []
    for t in range(1, steps + 1):
        params = {k: params[k] + closed([g[k] for g in GRADS], t, params[k]) for k in params}
        out.append(params)
    return out


def _run(opt, dtype, jit):
    """The params after each step, with x64 on for a 64-bit `dtype`."""
    with fnx.enable_x64(np.dtype(dtype).itemsize == 8):
        params = {k: jnp.asarray(v.astype(dtype)) for k, v in P0.items()}
        state = opt.init(params)

        def step(params, state, grads):
            updates, state = opt.update(grads, state, params)
            return optim.apply_updates(params, updates), state
        step = fnx.jit(step) if jit else step
        out = []
        for g in GRADS:
            params, state = step(params, state, {k: jnp.asarray(v.astype(dtype)) for k, v in g.items()})
            out.append({k: np.asarray(v) for k, v in params.items()})
        return out, state


@pytest.mark.parametrize("jit", [False, True])
@pytest.mark.parametrize("name", sorted(CLOSED))
def test_closed_form_float64(name, jit):
    got, _ = _run(CLOSED[name][0](), np.float64, jit)
    for g, w in zip(got, _expected(name)):
        for k in w:
            assert g[k].dtype == np.float64
            np.testing.assert_allclose(g[k], w[k], rtol=1e-10, atol=1e-12, err_msg=f"{name} {k}")


@pytest.mark.parametrize("name", sorted(CLOSED))
def test_closed_form_float32_jit(device, name):
    got, state = _run(CLOSED[name][0](), np.float32, jit=True)
    for g, w in zip(got, _expected(name)):
        for k in w:
            assert g[k].dtype == np.float32
            np.testing.assert_allclose(g[k], w[k], rtol=2e-5, atol=2e-5, err_msg=f"{name} {k}")
    counts = [leaf for leaf in fnx.tree_util.tree_leaves(state) if np.asarray(leaf).dtype == np.int32]
    assert all(int(c) == 3 for c in counts)


def test_adamw_mask_and_schedule():
    mask = {"w": True, "b": False}
    schedule = optim.linear_schedule(LR, 0.0, 4)
    opt = optim.adamw(schedule, weight_decay=WD, mask=mask)
    got, _ = _run(opt, np.float64, jit=True)
    params = dict(P0)
    for t in range(1, 4):
        lr = LR * (1 - (t - 1) / 4)
        for k in params:
            gs = [g[k] for g in GRADS]
            adam = (ema(gs, B1, t) / (1 - B1 ** t)) / (np.sqrt(ema(gs, B2, t, 2) / (1 - B2 ** t)) + EPS)
            params[k] = params[k] - lr * (adam + (WD * params[k] if mask[k] else 0))
        for k in params:
            np.testing.assert_allclose(got[t - 1][k], params[k], rtol=1e-7)  # schedules compute in float32
    assert np.allclose(_run(optim.adamw(LR, weight_decay=WD, mask=lambda p: mask), np.float64, False)[0][0]["b"],
                       _expected("adam")[0]["b"])


def test_add_decayed_weights_needs_params():
    opt = optim.add_decayed_weights(0.1)
    with pytest.raises(ValueError, match="params"):
        opt.update({"w": jnp.ones(2)}, opt.init(None))


def test_clip_by_global_norm(device):
    clipper = optim.clip_by_global_norm(1.0)
    grads = {"a": jnp.array([3.0, 0.0]), "b": jnp.array([[4.0]])}   # global norm 5
    for fn in (clipper.update, fnx.jit(clipper.update)):
        clipped, _ = fn(grads, clipper.init(grads))
        np.testing.assert_allclose(np.asarray(clipped["a"]), [0.6, 0.0], rtol=1e-6)
        np.testing.assert_allclose(np.asarray(clipped["b"]), [[0.8]], rtol=1e-6)
    small = {"a": jnp.array([0.3, 0.0]), "b": jnp.array([[0.4]])}
    kept, _ = clipper.update(small, clipper.init(small))
    np.testing.assert_array_equal(np.asarray(kept["a"]), np.float32([0.3, 0.0]))
    np.testing.assert_allclose(float(optim.global_norm(grads)), 5.0)
    # clipping first, then sgd: one step moves by lr * (clipped gradient)
    opt = optim.chain(optim.clip_by_global_norm(1.0), optim.sgd(0.5))
    updates, _ = opt.update(grads, opt.init(grads))
    np.testing.assert_allclose(np.asarray(updates["a"]), [-0.3, 0.0], rtol=1e-6)


def test_scale_clip_identity():
    g = {"x": jnp.array([-3.0, 0.5, 2.0])}
    np.testing.assert_allclose(np.asarray(optim.scale(-2.0).update(g, optim.EmptyState())[0]["x"]), [6.0, -1.0, -4.0])
    np.testing.assert_allclose(np.asarray(optim.clip(1.0).update(g, optim.EmptyState())[0]["x"]), [-1.0, 0.5, 1.0])
    assert optim.identity().update(g, optim.EmptyState())[0] is g


# ---- schedules ----

COUNTS = [0, 1, 5, 10, 15, 20, 99, 100, 150]

SCHEDULES = {
    "constant": (optim.constant_schedule(0.3), lambda c: 0.3),
    "linear": (optim.linear_schedule(1.0, 0.1, 20, transition_begin=5),
               lambda c: 1.0 + (0.1 - 1.0) * min(max(c - 5, 0), 20) / 20),
    "polynomial": (optim.polynomial_schedule(2.0, 0.5, 2, 100),
                   lambda c: (2.0 - 0.5) * (1 - min(c, 100) / 100) ** 2 + 0.5),
    "exponential": (optim.exponential_decay(1.0, 10, 0.5), lambda c: 0.5 ** (c / 10)),
    "exponential_staircase": (optim.exponential_decay(1.0, 10, 0.5, transition_begin=5, staircase=True,
                                                      end_value=0.01),
                              lambda c: 1.0 if c <= 5 else max(0.5 ** math.floor((c - 5) / 10), 0.01)),
    "cosine": (optim.cosine_decay_schedule(1.0, 100, alpha=0.1),
               lambda c: 0.9 * 0.5 * (1 + math.cos(math.pi * min(c, 100) / 100)) + 0.1),
    "cosine_exponent": (optim.cosine_decay_schedule(2.0, 50, exponent=2.0),
                        lambda c: 2.0 * (0.5 * (1 + math.cos(math.pi * min(c, 50) / 50))) ** 2),
    "warmup_cosine": (optim.warmup_cosine_decay_schedule(0.0, 1.0, 10, 100, end_value=0.05),
                      lambda c: c / 10 if c < 10 else
                      0.05 + 0.95 * 0.5 * (1 + math.cos(math.pi * min(c - 10, 90) / 90))),
    "piecewise": (optim.piecewise_constant_schedule(1.0, {10: 0.5, 20: 0.1}),
                  lambda c: 1.0 * (0.5 if c >= 10 else 1) * (0.1 if c >= 20 else 1)),
}


@pytest.mark.parametrize("name", sorted(SCHEDULES))
def test_schedules(name):
    schedule, formula = SCHEDULES[name]
    want = [formula(c) for c in COUNTS]
    eager = [float(schedule(c)) for c in COUNTS]
    batched = np.asarray(fnx.jit(lambda c: jnp.broadcast_to(schedule(c), c.shape))(jnp.asarray(COUNTS, jnp.int32)))
    np.testing.assert_allclose(eager, want, rtol=2e-6, atol=1e-7)
    np.testing.assert_allclose(batched, want, rtol=2e-6, atol=1e-7)


def test_schedule_as_learning_rate_under_jit():
    schedule = optim.piecewise_constant_schedule(1.0, {2: 0.1})
    got, _ = _run(optim.sgd(schedule), np.float64, jit=True)
    p = dict(P0)
    for t, g in enumerate(GRADS):
        p = _tree(lambda a, b: a - (1.0 if t < 2 else 0.1) * b, p, g)
    np.testing.assert_allclose(got[-1]["w"], p["w"], rtol=1e-7)  # schedules compute in float32


def test_degenerate_schedules():
    with pytest.warns(UserWarning):
        assert optim.linear_schedule(0.5, 0.0, 0)(10) == 0.5
    with pytest.raises(ValueError):
        optim.cosine_decay_schedule(1.0, 0)
    with pytest.raises(ValueError):
        optim.piecewise_constant_schedule(1.0, {5: -1.0})


def test_apply_updates_keeps_dtype():
    params = {"a": jnp.ones(2, jnp.bfloat16), "b": jnp.zeros(3, jnp.int32) + 2.0}
    new = optim.apply_updates(params, {"a": jnp.full(2, 0.5, jnp.float32), "b": jnp.full(3, 0.25)})
    assert new["a"].dtype == jnp.bfloat16 and new["b"].dtype == params["b"].dtype


# ---- against optax ----

@pytest.mark.parametrize("name,args", [("sgd", (LR, 0.9)), ("adam", (LR,)), ("adamw", (LR,)),
                                       ("rmsprop", (LR,)), ("adagrad", (LR,))])
def test_matches_optax(name, args):
    optax = pytest.importorskip("optax")
    ours, _ = _run(getattr(optim, name)(*args), np.float32, jit=False)
    opt = getattr(optax, name)(*args)
    params = {k: v.astype(np.float32) for k, v in P0.items()}
    state = opt.init(params)
    for g, mine in zip(GRADS, ours):
        updates, state = opt.update({k: v.astype(np.float32) for k, v in g.items()}, state, params)
        params = optax.apply_updates(params, updates)
        for k in params:
            np.testing.assert_allclose(mine[k], np.asarray(params[k]), rtol=1e-5, atol=1e-6)
