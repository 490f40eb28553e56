"""The MLP training step of the main job: its compiled kernel count is recorded here so regressions show, and
one jitted step equals the same step run eagerly and a hand-written numpy forward/backward pass."""
import numpy as np

import fnx
import fnx.numpy as jnp
from assertions import mlp_step as _step
from fnx.backends import cpu_llvm
from fnx.lower import row_sums

# kernels in the compiled step (forward, backward and the SGD update of a 2-layer MLP); change it on purpose only:
MLP_STEP_KERNELS = 14  # 27 with no fusion of reductions, 15 before matmuls took their elementwise epilogues,
#                        13 before exp got cheaper (the cost model then fuses the log-softmax pieces differently),
#                        12 before the optimizer's PACK: g @ w2.T now reads w2 from panels a small copy kernel writes,
#                        13 before an operand of a reduction that would be recomputed for every output column got
#                        a buffer when that costs less (dh = g @ w2.T * relu'(h), read by w1's gradient),
#                        and 13 where the target carries row sums (fnx/lower/row_sums.py: 32 vector registers), the
#                        log-softmax's sum of exps then stored by the kernel writing them


def _numpy_step(p, x, onehot):
    pre = x @ p["w1"] + p["b1"]
    h = np.maximum(pre, 0)
    logits = h @ p["w2"] + p["b2"]
    logp = logits - logits.max(-1, keepdims=True)
    logp = logp - np.log(np.exp(logp).sum(-1, keepdims=True))
    d_logits = (np.exp(logp) - onehot) / x.shape[0]
    d_h = (d_logits @ p["w2"].T) * (pre > 0)
    grads = {"w2": h.T @ d_logits, "b2": d_logits.sum(0), "w1": x.T @ d_h, "b1": d_h.sum(0)}
    return {k: p[k] - 0.1 * grads[k] for k in p}, -np.mean(np.sum(logp * onehot, -1))


def _data():
    rng = np.random.default_rng(0)
    p = {"w1": rng.standard_normal((20, 16)) * 0.3, "b1": rng.standard_normal(16) * 0.1,
         "w2": rng.standard_normal((16, 5)) * 0.3, "b2": np.zeros(5)}
    p = {k: v.astype(np.float32) for k, v in p.items()}
    x = rng.standard_normal((8, 20)).astype(np.float32)
    onehot = np.eye(5, dtype=np.float32)[rng.integers(0, 5, 8)]
    return p, x, onehot


def test_jitted_step_matches_numpy_and_eager():
    p, x, onehot = _data()
    args = ({k: jnp.asarray(v) for k, v in p.items()}, jnp.asarray(x), jnp.asarray(onehot))
    new_jit, loss_jit = fnx.jit(_step)(*args)
    new_eager, loss_eager = _step(*args)
    new_np, loss_np = _numpy_step(p, x, onehot)
    np.testing.assert_allclose(float(loss_jit), loss_np, rtol=1e-5)
    np.testing.assert_allclose(float(loss_eager), loss_np, rtol=1e-5)
    for k in p:
        np.testing.assert_allclose(np.asarray(new_jit[k]), new_np[k], rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(np.asarray(new_eager[k]), new_np[k], rtol=1e-5, atol=1e-6)


def test_step_kernel_count_is_recorded():
    p, x, onehot = _data()
    args = ({k: jnp.asarray(v) for k, v in p.items()}, jnp.asarray(x), jnp.asarray(onehot))
    kernels = fnx.jit(_step).lower(*args).executable.lowering.kernels
    carries = cpu_llvm._compiler().target.vector_registers >= row_sums.MIN_REGISTERS
    assert len(kernels) == MLP_STEP_KERNELS - carries, [k.name for k, _ in kernels]
