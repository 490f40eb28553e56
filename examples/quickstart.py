"""A tour of fnx: one jitted function, its graph and kernels, then where fnx is fast and where it is not.

    python examples/quickstart.py

Every workload runs in fnx (jitted), in numpy and, when it is installed, in JAX (`pip install jax`), in this one
process, and every fnx result is checked against numpy first. Times are medians of repeated calls; the ratios are
other / fnx (above 1: fnx is faster). The closing summary is computed from this run's numbers, on this machine.
"""
from __future__ import annotations

import inspect
import os
import subprocess
import sys
import textwrap
import time

import numpy as np

import fnx
import fnx.numpy as jnp

try:
    import jax
    import jax.numpy as jjnp
except ImportError:  # JAX is an optional comparison, never a dependency
    jax = None

REPEATS = 9
EVEN = 0.1   # within 10% either way counts as even (a shared machine varies more than that between runs)
SETTLE = 0.3  # seconds of quiet before each timing (see median_time)


def median_time(fn, number: int = 1, repeat: int = REPEATS) -> float:
    """Median seconds per call of fn over `repeat` timings of `number` calls each, after one warm-up call.

    It first waits a moment: BLAS's and XLA's worker threads keep spinning for a while after their last call, and
    would take cores away from whatever is timed next (an fnx matmul timed right after numpy's ran 2x slower)."""
    time.sleep(SETTLE)
    fn()
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        for _ in range(number): fn()
        times.append((time.perf_counter() - start) / number)
    return float(np.median(times))


def ready(x):
    """Wait for a result: fnx and numpy through np.asarray, JAX through block_until_ready."""
    return x.block_until_ready() if hasattr(x, "block_until_ready") and not isinstance(x, fnx.Array) else np.asarray(x)


def gelu(lib, x):
    return 0.5 * x * (1 + lib.tanh(0.7978845608 * (x + 0.044715 * x * x * x)))


def softmax(lib, x):
    e = lib.exp(x - x.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def mlp_step(lib, log_softmax, value_and_grad):
    """One SGD step of a 784-512-10 MLP's cross-entropy, written once for fnx and JAX."""
    def loss(p, x, onehot):
        h = lib.maximum(x @ p["w1"] + p["b1"], 0)
        return -lib.mean(lib.sum(log_softmax(h @ p["w2"] + p["b2"]) * onehot, axis=-1))

    def step(p, x, onehot):
        value, g = value_and_grad(loss)(p, x, onehot)
        return {k: p[k] - 0.01 * g[k] for k in p}, value
    return step


def numpy_mlp_step(p, x, onehot):
    """The same step with the backward pass written by hand (numpy has no autodiff)."""
    pre = x @ p["w1"] + p["b1"]
    h = np.maximum(pre, 0)
    logits = h @ p["w2"] + p["b2"]
    shifted = logits - logits.max(axis=-1, keepdims=True)
    logp = shifted - np.log(np.exp(shifted).sum(axis=-1, keepdims=True))
    d_logits = (np.exp(logp) - onehot) / x.shape[0]
    d_h = (d_logits @ p["w2"].T) * (pre > 0)
    g = {"w2": h.T @ d_logits, "b2": d_logits.sum(0), "w1": x.T @ d_h, "b1": d_h.sum(0)}
    return {k: p[k] - 0.01 * g[k] for k in p}, -np.mean(np.sum(logp * onehot, axis=-1))


def compare(name: str, fnx_fn, numpy_fn, jax_fn=None, number: int = 1) -> dict:
    """Check fnx's result against numpy's, then time all three."""
    got, want = np.asarray(fnx_fn(), np.float64), np.asarray(numpy_fn(), np.float64)
    assert np.allclose(got, want, rtol=2e-3, atol=2e-4), f"{name}: fnx disagrees with numpy"
    row = {"workload": name, "fnx": median_time(lambda: ready(fnx_fn()), number),
           "numpy": median_time(numpy_fn, number)}
    if jax_fn is not None: row["jax"] = median_time(lambda: ready(jax_fn()), number)
    print(f"  measured {name}", flush=True)
    return row


FIRST_CALL = """
import time, numpy as np
{imports}
{mlp_step}
step = jit(mlp_step(lib, log_softmax, value_and_grad))
rng = np.random.default_rng(0)
p = {{"w1": rng.standard_normal((784, 512), np.float32) * 0.05, "b1": np.zeros(512, np.float32),
      "w2": rng.standard_normal((512, 10), np.float32) * 0.05, "b2": np.zeros(10, np.float32)}}
p = {{k: lib.asarray(v) for k, v in p.items()}}
x = lib.asarray(rng.standard_normal((256, 784), np.float32))
onehot = lib.asarray(np.eye(10, dtype=np.float32)[rng.integers(0, 10, 256)])
np.asarray((lib.ones(3) + 1).sum())  # the runtime started, as in a program that has run anything before
start = time.perf_counter()
np.asarray(step(p, x, onehot)[1])
print(time.perf_counter() - start)
"""


def first_call(imports: str, env: dict) -> float:
    """Seconds of the first call (trace + compile + run) of the MLP step in a fresh process."""
    program = FIRST_CALL.format(imports=imports, mlp_step=inspect.getsource(mlp_step))
    out = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, timeout=300,
                         env={**os.environ, **env})
    if out.returncode != 0: raise RuntimeError(f"the first-call measurement failed:\n{out.stderr}")
    return float(out.stdout.split()[-1])


def tour() -> None:
    """One function: its graph, its kernels, its value against numpy."""
    @fnx.jit
    def f(x, w, b):
        return jnp.tanh(x @ w + b).sum(axis=-1)

    rng = np.random.default_rng(0)
    x_np = rng.standard_normal((256, 512)).astype(np.float32)
    w_np = (rng.standard_normal((512, 128)) / np.sqrt(512)).astype(np.float32)
    b_np = np.zeros(128, np.float32)
    x, w, b = jnp.asarray(x_np), jnp.asarray(w_np), jnp.asarray(b_np)
    print("traced graph of f(x, w) = tanh(x @ w + b).sum(-1):")
    print(fnx.make_graph(f)(x, w, b))
    kernels = f.lower(x, w, b).executable.lowering.kernels
    print(f"\ncompiled into {len(kernels)} kernel(s): {[k.name for k, _ in kernels]}")
    err = np.max(np.abs(np.asarray(f(x, w, b)) - np.tanh(x_np @ w_np + b_np).sum(axis=-1)))
    print(f"max |fnx - numpy| = {err:.2e}")
    assert err < 1e-3, "fnx disagrees with numpy"


def measure() -> list[dict]:
    rng = np.random.default_rng(0)
    rows = []

    x_np = rng.standard_normal(1 << 22).astype(np.float32)  # 4M floats
    f, x = fnx.jit(lambda x: gelu(jnp, x)), jnp.asarray(x_np)
    jf, jx = (jax.jit(lambda x: gelu(jjnp, x)), jjnp.asarray(x_np)) if jax else (None, None)
    rows.append(compare("gelu, 4M f32 (fused chain)", lambda: f(x), lambda: gelu(np, x_np),
                        jax and (lambda: jf(jx))))

    f, jf = fnx.jit(jnp.sin), (jax.jit(jjnp.sin) if jax else None)
    rows.append(compare("sin, 4M f32 (one transcendental)", lambda: f(x), lambda: np.sin(x_np),
                        jax and (lambda: jf(jx))))

    a_np, b_np = rng.standard_normal((2, 1024, 1024)).astype(np.float32)
    f, a, b = fnx.jit(jnp.matmul), jnp.asarray(a_np), jnp.asarray(b_np)
    jf, ja, jb = (jax.jit(jjnp.matmul), jjnp.asarray(a_np), jjnp.asarray(b_np)) if jax else (None,) * 3
    rows.append(compare("matmul 1024x1024 f32", lambda: f(a, b), lambda: a_np @ b_np, jax and (lambda: jf(ja, jb))))

    s_np = rng.standard_normal((1024, 4096)).astype(np.float32)
    f, s = fnx.jit(lambda x: softmax(jnp, x)), jnp.asarray(s_np)
    jf, js = (jax.jit(lambda x: softmax(jjnp, x)), jjnp.asarray(s_np)) if jax else (None, None)
    rows.append(compare("softmax over rows (1024,4096)", lambda: f(s), lambda: softmax(np, s_np),
                        jax and (lambda: jf(js))))

    params_np = {"w1": (rng.standard_normal((784, 512)) * 0.05).astype(np.float32), "b1": np.zeros(512, np.float32),
                 "w2": (rng.standard_normal((512, 10)) * 0.05).astype(np.float32), "b2": np.zeros(10, np.float32)}
    xb_np = rng.standard_normal((256, 784)).astype(np.float32)
    onehot_np = np.eye(10, dtype=np.float32)[rng.integers(0, 10, 256)]
    step = fnx.jit(mlp_step(jnp, fnx.nn.log_softmax, fnx.value_and_grad))
    p, xb, onehot = {k: jnp.asarray(v) for k, v in params_np.items()}, jnp.asarray(xb_np), jnp.asarray(onehot_np)
    jax_step = None
    if jax:
        jstep = jax.jit(mlp_step(jjnp, jax.nn.log_softmax, jax.value_and_grad))
        jp, jxb, jo = {k: jjnp.asarray(v) for k, v in params_np.items()}, jjnp.asarray(xb_np), jjnp.asarray(onehot_np)
        jax_step = lambda: jstep(jp, jxb, jo)[1]  # noqa: E731
    rows.append(compare("MLP value_and_grad step b256", lambda: step(p, xb, onehot)[1],
                        lambda: numpy_mlp_step(params_np, xb_np, onehot_np)[1], jax_step))

    one_np = np.ones(1, np.float32)
    one = jnp.asarray(one_np)
    jone = jjnp.asarray(one_np) if jax else None
    rows.append(compare("eager x + 1, one element", lambda: one + 1, lambda: one_np + 1,
                        jax and (lambda: jone + 1), number=500))
    f = fnx.jit(lambda x: x + 1)
    jf = jax.jit(lambda x: x + 1) if jax else None
    rows.append(compare("jitted x + 1, one element", lambda: f(one), lambda: one_np + 1,
                        jax and (lambda: jf(jone)), number=500))

    fnx_cold = first_call("import fnx.numpy as lib\nfrom fnx import jit, value_and_grad\n"
                          "from fnx.nn import log_softmax", {"FNX_CACHE_DIR": ""})
    row = {"workload": "first call of the MLP step (compile)", "fnx": fnx_cold}
    if jax:
        row["jax"] = first_call("import jax.numpy as lib\nfrom jax import jit, value_and_grad\n"
                                "from jax.nn import log_softmax", {})
    print("  measured first calls", flush=True)
    rows.append(row)
    return rows


def seconds(t: float | None) -> str:
    if t is None: return "-"
    return f"{t * 1e6:.1f} µs" if t < 1e-3 else f"{t * 1e3:.2f} ms" if t < 1 else f"{t:.2f} s"


def ratio(row: dict, other: str) -> str:
    return f"{row[other] / row['fnx']:.2f}x" if other in row else "-"


def summary(rows: list[dict], other: str, label: str) -> str:
    """Which workloads fnx was faster, even or slower on against `other`, from the measured ratios."""
    faster = [r["workload"] for r in rows if other in r and r[other] / r["fnx"] > 1 + EVEN]
    slower = [r["workload"] for r in rows if other in r and r[other] / r["fnx"] < 1 - EVEN]
    even = [r["workload"] for r in rows if other in r and r["workload"] not in faster + slower]
    parts = [f"fnx is faster than {label} on: {', '.join(faster) or 'nothing measured'}"]
    if even: parts.append(f"about even (within {EVEN:.0%}) on: {', '.join(even)}")
    parts.append(f"slower on: {', '.join(slower) or 'nothing measured'}")
    return "; ".join(parts) + "."


def main() -> None:
    start = time.perf_counter()
    tour()
    print(f"\ntiming on {os.cpu_count()} core(s), median of {REPEATS} runs each"
          + ("" if jax else " (JAX is not installed: its column is left out; `pip install jax` to add it)"))
    rows = measure()
    header = ["workload", "fnx", "numpy", "numpy/fnx"] + (["JAX", "JAX/fnx"] if jax else [])
    table = [[r["workload"], seconds(r["fnx"]), seconds(r.get("numpy")), ratio(r, "numpy")]
             + ([seconds(r.get("jax")), ratio(r, "jax")] if jax else []) for r in rows]
    widths = [max(len(str(line[i])) for line in table + [header]) for i in range(len(header))]
    print()
    for line in [header, ["-" * w for w in widths]] + table:
        print("  ".join(str(c).ljust(w) if i == 0 else str(c).rjust(w) for i, (c, w) in enumerate(zip(line, widths))))
    print("\n(x above 1: fnx is faster; the first call is timed in a fresh process: fnx with its compile cache off, "
          "numpy has none)\n")
    for other, label in [("numpy", "numpy")] + ([("jax", "JAX")] if jax else []):
        print(textwrap.fill(summary(rows, other, label), 110), end="\n\n")
    print(textwrap.fill(
        "What decides these numbers: a jitted chain of elementwise ops and row reductions is one fused loop over "
        "memory on all cores (numpy makes a pass and a temporary per op, JAX fuses too); a matmul is bound by "
        "arithmetic, where BLAS is the bar; a tiny op measures dispatch: an eager fnx op runs as jit of itself, as "
        "JAX's do (indexing with ints and slices included: the index is an argument, so x[i] in a loop compiles "
        "once). Timings on a shared machine vary by 10-30% between runs.", 110))
    print(f"\ndone in {time.perf_counter() - start:.1f} s")


if __name__ == "__main__":
    main()
