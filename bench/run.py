"""Side-by-side benchmarks: fnx vs numpy (and JAX when installed), measured in one run.

    python bench/run.py              # every workload
    python bench/run.py W1 W6        # some of them

Each line reports the best-of-N wall time per call and the ratio other/fnx (> 1 means fnx is faster).
"""
from __future__ import annotations

import sys
import time

import numpy as np

import fnx
import fnx.numpy as jnp

try:
    import jax
    import jax.numpy as jjnp
except ImportError:  # JAX is an optional comparison, never a dependency
    jax = None


def best(fn, repeat: int = 7, number: int = 1) -> float:
    """Best-of-`repeat` seconds per call of fn (each timing runs it `number` times)."""
    fn()
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        for _ in range(number): fn()
        times.append((time.perf_counter() - start) / number)
    return min(times)


def block(x):
    """Wait for a result: np.asarray for fnx, block_until_ready for JAX."""
    return x.block_until_ready() if hasattr(x, "block_until_ready") and not isinstance(x, fnx.Array) else np.asarray(x)


def memory_bandwidth() -> float:
    """Measured host copy bandwidth in GB/s (read + write of a 256 MiB array)."""
    a = np.ones(1 << 26, np.float32)
    b = np.empty_like(a)
    t = best(lambda: np.copyto(b, a), repeat=5)
    return 2 * a.nbytes / t / 1e9


def report(name: str, results: dict[str, float], note: str = "") -> None:
    base = results["fnx"]
    parts = [f"fnx {base * 1e3:9.3f} ms"]
    for other, t in results.items():
        if other != "fnx": parts.append(f"{other} {t * 1e3:9.3f} ms ({t / base:5.2f}x)")
    print(f"{name:34s} " + " | ".join(parts) + (f"  {note}" if note else ""))


def w1_gelu():
    n = 1 << 24
    x_np = np.random.default_rng(0).standard_normal(n).astype(np.float32)
    a, b = np.float32(1.5), np.float32(0.1)

    def gelu(lib, x):
        y = x * a + b
        return 0.5 * y * (1 + lib.tanh(0.7978845608 * (y + 0.044715 * y * y * y)))
    f = fnx.jit(lambda x: gelu(jnp, x))
    x = jnp.asarray(x_np)
    res = {"fnx": best(lambda: block(f(x))), "numpy": best(lambda: gelu(np, x_np))}
    if jax:
        jf, jx = jax.jit(lambda x: gelu(jjnp, x)), jjnp.asarray(x_np)
        res["jax"] = best(lambda: jf(jx).block_until_ready())
    gbs = 2 * x_np.nbytes / res["fnx"] / 1e9
    report("W1 gelu(x*a+b) 16M f32", res, f"fnx {gbs:.1f} GB/s")


def w3_softmax():
    x_np = np.random.default_rng(0).standard_normal((4096, 4096)).astype(np.float32)

    def softmax_np(x):
        e = np.exp(x - x.max(axis=-1, keepdims=True))
        return e / e.sum(axis=-1, keepdims=True)
    f = fnx.jit(lambda x: fnx.nn.softmax(x, axis=-1)) if hasattr(fnx, "nn") else fnx.jit(
        lambda x: (lambda e: e / e.sum(axis=-1, keepdims=True))(jnp.exp(x - x.max(axis=-1, keepdims=True))))
    x = jnp.asarray(x_np)
    res = {"fnx": best(lambda: block(f(x))), "numpy": best(lambda: softmax_np(x_np))}
    if jax:
        jf, jx = jax.jit(lambda x: jax.nn.softmax(x, axis=-1)), jjnp.asarray(x_np)
        res["jax"] = best(lambda: jf(jx).block_until_ready())
    report("W3 softmax (4096,4096) f32", res, f"fnx {2 * x_np.nbytes / res['fnx'] / 1e9:.1f} GB/s")


def w6_dispatch():
    f = fnx.jit(lambda x: x + 1)
    x = jnp.ones((1,), jnp.float32)
    x_np = np.ones((1,), np.float32)
    res = {"fnx": best(lambda: f(x), number=2000), "numpy": best(lambda: x_np + 1, number=2000)}
    if jax:
        jf, jx = jax.jit(lambda x: x + 1), jjnp.ones((1,), jjnp.float32)
        res["jax"] = best(lambda: jf(jx), number=2000)
    report("W6 jitted x+1 dispatch (1 elem)", res, f"fnx {res['fnx'] * 1e6:.1f} us/call")


def _mlp_data():
    rng = np.random.default_rng(0)
    params = {"w1": (rng.standard_normal((784, 512)) * 0.05).astype(np.float32), "b1": np.zeros(512, np.float32),
              "w2": (rng.standard_normal((512, 10)) * 0.05).astype(np.float32), "b2": np.zeros(10, np.float32)}
    x = rng.standard_normal((256, 784)).astype(np.float32)
    y = rng.integers(0, 10, 256)
    return params, x, y


def _mlp_step(lib, nn_lib, grad_fn):
    def loss(p, x, onehot):
        h = lib.maximum(x @ p["w1"] + p["b1"], 0)
        logits = h @ p["w2"] + p["b2"]
        return -lib.mean(lib.sum(nn_lib.log_softmax(logits) * onehot, axis=-1))

    def step(p, x, onehot):
        value, g = grad_fn(loss)(p, x, onehot)
        return {k: p[k] - 0.01 * g[k] for k in p}, value
    return step


def _numpy_mlp_step(p, x, onehot):
    """A hand-written numpy forward and backward pass of the same step (the numpy baseline)."""
    pre = x @ p["w1"] + p["b1"]
    h = np.maximum(pre, 0)
    logits = h @ p["w2"] + p["b2"]
    shifted = logits - logits.max(axis=-1, keepdims=True)
    logp = shifted - np.log(np.exp(shifted).sum(axis=-1, keepdims=True))
    loss = -np.mean(np.sum(logp * onehot, axis=-1))
    d_logits = (np.exp(logp) - onehot) / x.shape[0]
    d_h = (d_logits @ p["w2"].T) * (pre > 0)
    g = {"w2": h.T @ d_logits, "b2": d_logits.sum(0), "w1": x.T @ d_h, "b1": d_h.sum(0)}
    return {k: p[k] - 0.01 * g[k] for k in p}, loss


def w4_mlp_step():
    params, x_np, y = _mlp_data()
    onehot_np = np.eye(10, dtype=np.float32)[y]
    f = fnx.jit(_mlp_step(jnp, fnx.nn, fnx.value_and_grad))
    p, x, onehot = {k: jnp.asarray(v) for k, v in params.items()}, jnp.asarray(x_np), jnp.asarray(onehot_np)
    res = {"fnx": best(lambda: block(f(p, x, onehot)[1])),
           "numpy": best(lambda: _numpy_mlp_step(params, x_np, onehot_np))}
    if jax:
        jf = jax.jit(_mlp_step(jjnp, jax.nn, jax.value_and_grad))
        jp, jx, jo = ({k: jjnp.asarray(v) for k, v in params.items()}, jjnp.asarray(x_np), jjnp.asarray(onehot_np))
        res["jax"] = best(lambda: jf(jp, jx, jo)[1].block_until_ready())
    report("W4 MLP train step 784-512-10 b256", res, f"fnx {1 / res['fnx']:.0f} steps/s")


def _linear_loss(lib, nn_lib):
    def loss(w, x, onehot):
        return -lib.sum(nn_lib.log_softmax(x @ w) * onehot)
    return loss


def _numpy_per_example_grads(w, x, onehot):
    """Per-example gradients of the softmax cross-entropy of x_i @ w: outer(x_i, softmax(x_i w) - onehot_i)."""
    logits = x @ w
    e = np.exp(logits - logits.max(axis=-1, keepdims=True))
    return x[:, :, None] * (e / e.sum(axis=-1, keepdims=True) - onehot)[:, None, :]


def w5_per_example_grads():
    rng = np.random.default_rng(0)
    w_np = (rng.standard_normal((256, 10)) * 0.05).astype(np.float32)
    x_np = rng.standard_normal((128, 256)).astype(np.float32)
    onehot_np = np.eye(10, dtype=np.float32)[rng.integers(0, 10, 128)]
    f = fnx.jit(fnx.vmap(fnx.grad(_linear_loss(jnp, fnx.nn)), in_axes=(None, 0, 0)))
    w, x, onehot = jnp.asarray(w_np), jnp.asarray(x_np), jnp.asarray(onehot_np)
    expected = _numpy_per_example_grads(w_np, x_np, onehot_np)
    np.testing.assert_allclose(np.asarray(f(w, x, onehot)), expected, rtol=1e-4, atol=1e-6)
    res = {"fnx": best(lambda: block(f(w, x, onehot))), "numpy": best(lambda: _numpy_per_example_grads(w_np, x_np,
                                                                                                     onehot_np))}
    if jax:
        jf = jax.jit(jax.vmap(jax.grad(_linear_loss(jjnp, jax.nn)), in_axes=(None, 0, 0)))
        jw, jx, jo = jjnp.asarray(w_np), jjnp.asarray(x_np), jjnp.asarray(onehot_np)
        np.testing.assert_allclose(np.asarray(jf(jw, jx, jo)), expected, rtol=1e-4, atol=1e-6)
        res["jax"] = best(lambda: jf(jw, jx, jo).block_until_ready())
    report("W5 per-example grads 256->10 b128", res, f"fnx {128 / res['fnx']:.0f} examples/s")


def _rnn(lib, lax_lib):
    def run(h, xs, wh, wx):
        return lax_lib.scan(lambda h, x: (lib.tanh(h @ wh + x @ wx), None), h, xs)[0]
    return run


def _numpy_rnn(h, xs, wh, wx):
    for x in xs: h = np.tanh(h @ wh + x @ wx)
    return h


def w8_scan_rnn():
    steps, batch, hidden, inputs = 1000, 16, 64, 32
    rng = np.random.default_rng(0)
    h_np = np.zeros((batch, hidden), np.float32)
    xs_np = rng.standard_normal((steps, batch, inputs)).astype(np.float32)
    wh_np = (rng.standard_normal((hidden, hidden)) * 0.1).astype(np.float32)
    wx_np = (rng.standard_normal((inputs, hidden)) * 0.1).astype(np.float32)
    args = [jnp.asarray(a) for a in (h_np, xs_np, wh_np, wx_np)]
    f = fnx.jit(_rnn(jnp, fnx.lax))
    expected = _numpy_rnn(h_np, xs_np, wh_np, wx_np)
    np.testing.assert_allclose(np.asarray(f(*args)), expected, rtol=1e-4, atol=1e-5)
    res = {"fnx": best(lambda: block(f(*args)), repeat=3) / steps,
           "numpy": best(lambda: _numpy_rnn(h_np, xs_np, wh_np, wx_np), repeat=3) / steps}
    if jax:
        jf = jax.jit(_rnn(jjnp, jax.lax))
        jargs = [jjnp.asarray(a) for a in (h_np, xs_np, wh_np, wx_np)]
        np.testing.assert_allclose(np.asarray(jf(*jargs)), expected, rtol=1e-4, atol=1e-5)
        res["jax"] = best(lambda: jf(*jargs).block_until_ready(), repeat=3) / steps
    report("W8 scan RNN 1000 steps, per step", res, f"fnx {res['fnx'] * 1e6:.1f} us/step")
    for n in (10, 10_000):  # tracing and compiling must not grow with the length: the body is traced once
        xs = jnp.asarray(rng.standard_normal((n, batch, inputs)).astype(np.float32))
        start = time.perf_counter()
        fnx.jit(_rnn(jnp, fnx.lax)).lower(args[0], xs, args[2], args[3])
        print(f"{'':34s} fnx first call (trace+compile) of a {n:>6}-step scan: "
              f"{(time.perf_counter() - start) * 1e3:8.1f} ms")


W7_PROGRAM = """
import time, numpy as np
start = time.perf_counter()
import fnx, fnx.numpy as jnp
from bench.run import _mlp_data, _mlp_step
params, x, y = _mlp_data()
f = fnx.jit(_mlp_step(jnp, fnx.nn, fnx.value_and_grad))
t0 = time.perf_counter()
onehot = jnp.asarray(np.eye(10, dtype=np.float32)[y])
np.asarray(f({k: jnp.asarray(v) for k, v in params.items()}, jnp.asarray(x), onehot)[1])
print(time.perf_counter() - t0)
"""

W7_JAX = """
import time, numpy as np, jax, jax.numpy as jnp
from bench.run import _mlp_data, _mlp_step
params, x, y = _mlp_data()
f = jax.jit(_mlp_step(jnp, jax.nn, jax.value_and_grad))
t0 = time.perf_counter()
onehot = jnp.asarray(np.eye(10, dtype=np.float32)[y])
f({k: jnp.asarray(v) for k, v in params.items()}, jnp.asarray(x), onehot)[1].block_until_ready()
print(time.perf_counter() - t0)
"""


def w7_first_call():
    """Trace + compile + first run of the W4 step in a fresh process: with an empty compile cache (cold), then
    again with the cache that run filled (warm: LLVM is skipped)."""
    import os
    import subprocess
    import tempfile
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

    def run(program, cache_dir):
        env = dict(os.environ, FNX_CACHE_DIR=cache_dir)
        out = subprocess.run([sys.executable, "-c", program], cwd=root, capture_output=True, text=True, timeout=300,
                             env=env)
        return float(out.stdout.strip().splitlines()[-1])
    with tempfile.TemporaryDirectory() as cache_dir:
        res = {"fnx": run(W7_PROGRAM, cache_dir)}
        warm = run(W7_PROGRAM, cache_dir)
    if jax: res["jax"] = run(W7_JAX, "")
    report("W7 first call of the W4 step", res, f"fnx {res['fnx']:.2f} s cold, {warm:.2f} s with a warm cache")


WORKLOADS = {"W1": w1_gelu, "W3": w3_softmax, "W4": w4_mlp_step, "W5": w5_per_example_grads, "W6": w6_dispatch,
             "W7": w7_first_call, "W8": w8_scan_rnn}


def main(argv: list[str]) -> None:
    chosen = [w for w in argv if w in WORKLOADS] or list(WORKLOADS)
    print(f"fnx bench: {time.strftime('%Y-%m-%d')}, numpy {np.__version__}, "
          f"jax {jax.__version__ if jax else 'not installed'}, host copy bandwidth {memory_bandwidth():.1f} GB/s")
    for name in chosen:
        WORKLOADS[name]()


if __name__ == "__main__":
    main(sys.argv[1:])
