"""Side-by-side benchmarks: fnx vs numpy (and JAX when installed), measured in one run.

    python bench/run.py                          # every workload
    python bench/run.py W1 W6                    # some of them
    python bench/run.py --json out.json          # also write every result as JSON
    python bench/run.py --markdown               # also print a table for the README's Performance section

Each line reports the best-of-N wall time per call and the ratio other/fnx (> 1 means fnx is faster). Memory-bound
workloads also report GB/s against this machine's measured copy bandwidth, matmuls GFLOP/s against the cores'
measured FMA peak; both references are measured at the start of the run.
"""
from __future__ import annotations

import argparse
import ctypes
import datetime
import functools
import itertools
import json
import math
import os
import platform
import sys
import time

import numpy as np

import fnx
import fnx.numpy as jnp

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # (run as a script: bench.models)
from bench.models import GPT, _gpt_params, _gpt_step, _mlp_data, _mlp_step, _sgd_step  # noqa: E402, F401

try:
    import jax
    import jax.numpy as jjnp
except ImportError:  # JAX is an optional comparison, never a dependency
    jax = None


SETTLE_S = 0.3  # idle time before each measurement: OpenBLAS's workers spin ~0.1 s after numpy's last matmul
WARM_S = 0.15  # then calls, untimed, for this long: after an idle spell the cores run slow for tens of ms (a 2-core
               # Zen 4 VM: numpy's 16M-element multiply 4.6 ms on the first call after 1 s idle, 2.5 ms from the
               # tenth; fnx's W10 3-6 ms on the first calls, 2.0 ms from the fifteenth), which a best of 7 short
               # calls straight after the idle spell did not get past


def best(fn, repeat: int = 7, number: int = 1) -> float:
    """Best-of-`repeat` seconds per call of fn (each timing runs it `number` times).

    It first idles SETTLE_S, so that the last library timed leaves no worker threads spinning on the cores: right
    after numpy's 1024² matmul (its own check of the result), fnx's took 9.4-17 ms against 5.3 ms after a sleep,
    while fnx's and JAX's workers slept at once. Then it calls fn (the first call compiles) and goes on calling it
    for WARM_S before timing, the same for every library, so that each is timed in its steady state."""
    time.sleep(SETTLE_S)
    fn()
    warm_until = time.perf_counter() + WARM_S
    while time.perf_counter() < warm_until: fn()
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        for _ in range(number): fn()
        times.append((time.perf_counter() - start) / number)
    return min(times)


def block(x):
    """Wait for a result: np.asarray for fnx, block_until_ready for JAX."""
    return x.block_until_ready() if hasattr(x, "block_until_ready") and not isinstance(x, fnx.Array) else np.asarray(x)


_BANDWIDTHS: list[float] = []  # every measurement of this process (`measure_bandwidth`)


def measure_bandwidth() -> float:
    """Measure the host copy bandwidth again (GB/s): a 256 MiB copy counts 512 MiB moved (read + write), far beyond
    any cache."""
    a = np.ones(1 << 26, np.float32)
    b = np.empty_like(a)
    t = best(lambda: np.copyto(b, a), repeat=5)
    _BANDWIDTHS.append(2 * a.nbytes / t / 1e9)
    return _BANDWIDTHS[-1]


def memory_bandwidth() -> float:
    """The machine's copy bandwidth in GB/s: the best of this process's measurements (one when there is none).
    `main` measures again before every round and once after the last: on a shared VM one measurement moved 13.8 -
    26.3 GB/s between runs minutes apart (another tenant's traffic), and a fraction of a low one flattered the
    memory-bound rows (W10 at 129%)."""
    if not _BANDWIDTHS: measure_bandwidth()
    return max(_BANDWIDTHS)


FMA_CHAINS = 12  # independent accumulators: enough to cover FMA latency x pipes on current x86 cores


def _peak_loops_ir(lanes: int) -> str:
    """LLVM IR of `fma_loop(n)`: n iterations of FMA_CHAINS independent `lanes`-wide FMAs, and (x86 only)
    `add_loop(n)`: n iterations of 4 dependent register adds, hidden from the optimizer in inline asm."""
    vec = f"<{lanes} x float>"
    const = lambda v: f"<{', '.join([f'float {v}'] * lanes)}>"
    chains = ([f"  %a{k} = phi {vec} [{const(float(k))}, %entry], [%b{k}, %loop]" for k in range(FMA_CHAINS)]
              + [f"  %b{k} = call {vec} @llvm.fma.v{lanes}f32({vec} %a{k}, {vec} {const(0.5)}, {vec} {const(0.25)})"
                 for k in range(FMA_CHAINS)])
    sums = [f"  %s{k} = fadd {vec} %s{k - 1}, %b{k}" for k in range(1, FMA_CHAINS)]  # keeps every chain live
    counted = "  %i1 = add i64 %i, 1\n  %done = icmp eq i64 %i1, %n\n  br i1 %done, label %exit, label %loop"
    ir = f"""declare {vec} @llvm.fma.v{lanes}f32({vec}, {vec}, {vec})
define float @fma_loop(i64 %n) {{
entry:
  br label %loop
loop:
  %i = phi i64 [0, %entry], [%i1, %loop]
{chr(10).join(chains)}
{counted}
exit:
  %s0 = fadd {vec} %b0, %b0
{chr(10).join(sums)}
  %r = extractelement {vec} %s{FMA_CHAINS - 1}, i64 0
  ret float %r
}}
"""
    if platform.machine() not in ("x86_64", "AMD64"): return ir
    # a register-register add: recent Intel cores fold add-immediate chains at rename (several per cycle)
    adds = [f'  %x{k + 1} = call i64 asm "add $0, $0", "=r,0,~{{flags}}"(i64 %x{k})' for k in range(4)]
    return ir + f"""define i64 @add_loop(i64 %n) {{
entry:
  br label %loop
loop:
  %i = phi i64 [0, %entry], [%i1, %loop]
  %x0 = phi i64 [0, %entry], [%x4, %loop]
{chr(10).join(adds)}
{counted}
exit:
  ret i64 %x4
}}
"""


def _cpuinfo(field: str) -> str:
    """The first value of `field` in /proc/cpuinfo, or "" where there is none."""
    try:
        with open("/proc/cpuinfo") as f:
            return next((line.split(":", 1)[1].strip() for line in f if line.split(":")[0].strip() == field), "")
    except OSError:
        return ""


@functools.cache
def core_peak() -> tuple[float, list[str]]:
    """Estimated float32 peak of all cores in GFLOP/s, and the lines that say how it was obtained; measured once.

    One core's FMA rate is timed on a JIT-compiled loop of independent vector FMAs (best of many short runs, so
    other processes on the machine rarely land inside one) and multiplied by os.cpu_count(). The clock, timed on
    a chain of dependent adds (one cycle each on x86), turns that rate into flop/cycle, a cross-check against the
    textbook 2 FMA pipes x lanes x 2."""
    import llvmlite.binding as llvm  # fnx's own compiler dependency
    llvm.initialize_native_target()
    llvm.initialize_native_asmprinter()
    llvm.initialize_native_asmparser()  # for the inline asm of add_loop
    lanes = 16 if "avx512f" in _cpuinfo("flags").split() else 8
    machine = llvm.Target.from_default_triple().create_target_machine(
        cpu=llvm.get_host_cpu_name(), features=llvm.get_host_cpu_features().flatten(), opt=3)
    module = llvm.parse_assembly(_peak_loops_ir(lanes))
    module.verify()
    engine = llvm.create_mcjit_compiler(module, machine)
    engine.finalize_object()
    kernel = lambda name, result: ctypes.CFUNCTYPE(result, ctypes.c_int64)(engine.get_function_address(name))
    cores, n = os.cpu_count() or 1, 200_000
    fma_loop = kernel("fma_loop", ctypes.c_float)
    per_core = 2 * lanes * FMA_CHAINS * n / best(lambda: fma_loop(n), repeat=200) / 1e9
    how = [f"{cores} cores x {per_core:.1f} GFLOP/s per core (timed {FMA_CHAINS} independent {lanes}-lane FMA "
           f"chains on one core) = {cores * per_core:.0f} GFLOP/s"]
    mhz = _cpuinfo("cpu MHz")
    if engine.get_function_address("add_loop"):
        add_loop = kernel("add_loop", ctypes.c_int64)
        clock = 4 * n / best(lambda: add_loop(n), repeat=200) / 1e9
        textbook = 2 * lanes * 2
        how.append(f"= {per_core / clock:.1f} flop/cycle at {clock:.2f} GHz (timed dependent-add loop; "
                   f"/proc/cpuinfo says {mhz or '?'} MHz)")
        if per_core / clock < 0.75 * textbook:
            how.append(f"(the textbook 2 FMA pipes x {lanes} lanes x 2 = {textbook} flop/cycle would claim "
                       f"{cores * textbook * clock:.0f}: {lanes * 32}-bit FMAs run at half rate here, as on Zen 4)")
    return cores * per_core, how


def report(name: str, results: dict[str, float], note: str = "", bytes_moved: int = 0,
           flops: int = 0) -> list[dict]:
    """Print one line of times (and, with bytes_moved or flops, one of rates); return one JSON row per
    implementation."""
    base = results["fnx"]
    parts = [f"fnx {base * 1e3:9.3f} ms"]
    for other, t in results.items():
        if other != "fnx": parts.append(f"{other} {t * 1e3:9.3f} ms ({t / base:5.2f}x)")
    print(f"{name:34s} " + " | ".join(parts) + (f"  {note}" if note else ""))
    workload, description = name.split(" ", 1)
    rows = [{"workload": workload, "description": description, "implementation": impl, "seconds": t}
            for impl, t in results.items()]
    if note: rows[0]["note"] = note
    if bytes_moved:
        for row in rows:
            row["GB/s"] = bytes_moved / row["seconds"] / 1e9
            row["fraction_of_bandwidth"] = row["GB/s"] / memory_bandwidth()
        print(f"{'':34s} GB/s moving {bytes_moved / 2**20:.0f} MiB (the minimum): " + " | ".join(
            f"{row['implementation']} {row['GB/s']:5.1f} ({row['fraction_of_bandwidth']:4.0%})" for row in rows)
            + f" of the measured {memory_bandwidth():.1f}")
    if flops:
        for row in rows:
            row["GFLOP/s"] = flops / row["seconds"] / 1e9
            row["fraction_of_peak"] = row["GFLOP/s"] / core_peak()[0]
        print(f"{'':34s} GFLOP/s: " + " | ".join(
            f"{row['implementation']} {row['GFLOP/s']:6.1f} ({row['fraction_of_peak']:4.0%})" for row in rows)
            + f" of the estimated peak {core_peak()[0]:.0f}"
            + (f"; fnx/BLAS {results['numpy'] / base:.2f}" if "numpy" in results else ""))
    return rows


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
    rows = report("W1 gelu(x*a+b) 16M f32", res, bytes_moved=2 * x_np.nbytes)  # read x, write the result
    # the same traffic with almost no arithmetic: how close a purely streaming kernel comes to the bandwidth
    g = fnx.jit(lambda x: x * a + b)
    res = {"fnx": best(lambda: block(g(x))), "numpy": best(lambda: x_np * a + b)}
    if jax:
        jg = jax.jit(lambda x: x * a + b)
        res["jax"] = best(lambda: jg(jx).block_until_ready())
    return rows + report("W1 streaming x*a+b 16M f32", res, bytes_moved=2 * x_np.nbytes)


def w2_matmul():
    rows = []
    for n, repeat in ((1024, 7), (4096, 2)):  # one 4096² numpy call takes about a second here
        a_np, b_np = np.random.default_rng(0).standard_normal((2, n, n)).astype(np.float32)
        f = fnx.jit(lambda a, b: a @ b)
        a, b = jnp.asarray(a_np), jnp.asarray(b_np)
        np.testing.assert_allclose(np.asarray(f(a, b)), a_np @ b_np, rtol=1e-3, atol=1e-3 * np.sqrt(n))
        res = {"fnx": best(lambda: block(f(a, b)), repeat), "numpy": best(lambda: a_np @ b_np, repeat)}
        if jax:
            jf, ja, jb = jax.jit(lambda a, b: a @ b), jjnp.asarray(a_np), jjnp.asarray(b_np)
            res["jax"] = best(lambda: jf(ja, jb).block_until_ready(), repeat)
        rows += report(f"W2 matmul {n}x{n} f32", res, flops=2 * n ** 3)
    return rows


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
    return report("W3 softmax (4096,4096) f32", res, bytes_moved=2 * x_np.nbytes)  # read x once, write once


def w6_dispatch():
    f = fnx.jit(lambda x: x + 1)
    x = jnp.ones((1,), jnp.float32)
    x_np = np.ones((1,), np.float32)
    res = {"fnx": best(lambda: f(x), number=2000), "numpy": best(lambda: x_np + 1, number=2000)}
    if jax:
        jf, jx = jax.jit(lambda x: x + 1), jjnp.ones((1,), jjnp.float32)
        res["jax"] = best(lambda: jf(jx), number=2000)
    return report("W6 jitted x+1 dispatch (1 elem)", res, f"fnx {res['fnx'] * 1e6:.1f} us/call")


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
    return report("W4 MLP train step 784-512-10 b256", res, f"fnx {1 / res['fnx']:.0f} steps/s")


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
    return report("W5 per-example grads 256->10 b128", res, f"fnx {128 / res['fnx']:.0f} examples/s")


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
    rows = report("W8 scan RNN 1000 steps, per step", res, f"fnx {res['fnx'] * 1e6:.1f} us/step")
    for n in (10, 10_000):  # tracing and compiling must not grow with the length: the body is traced once
        xs = jnp.asarray(rng.standard_normal((n, batch, inputs)).astype(np.float32))
        start = time.perf_counter()
        fnx.jit(_rnn(jnp, fnx.lax)).lower(args[0], xs, args[2], args[3])
        seconds = time.perf_counter() - start
        print(f"{'':34s} fnx first call (trace+compile) of a {n:>6}-step scan: {seconds * 1e3:8.1f} ms")
        rows.append({"workload": "W8", "description": f"trace+compile of a {n}-step scan", "implementation": "fnx",
                     "seconds": seconds})
    return rows


W7_PROGRAM = """
import time, numpy as np
start = time.perf_counter()
import fnx, fnx.numpy as jnp
from bench.models import _mlp_data, _mlp_step
params, x, y = _mlp_data()
f = fnx.jit(_mlp_step(jnp, fnx.nn, fnx.value_and_grad))
t0 = time.perf_counter()
onehot = jnp.asarray(np.eye(10, dtype=np.float32)[y])
np.asarray(f({k: jnp.asarray(v) for k, v in params.items()}, jnp.asarray(x), onehot)[1])
print(time.perf_counter() - t0)
"""

W7_JAX = """
import time, numpy as np, jax, jax.numpy as jnp
from bench.models import _mlp_data, _mlp_step
params, x, y = _mlp_data()
f = jax.jit(_mlp_step(jnp, jax.nn, jax.value_and_grad))
t0 = time.perf_counter()
onehot = jnp.asarray(np.eye(10, dtype=np.float32)[y])
f({k: jnp.asarray(v) for k, v in params.items()}, jnp.asarray(x), onehot)[1].block_until_ready()
print(time.perf_counter() - t0)
"""


W7_PROCESSES = 5  # fresh processes per measurement, their median reported: one process's first call on a shared VM
                  # moved 16-28 ms between back-to-back runs


def w7_first_call():
    """Trace + compile + first run of the W4 step in a fresh process: with an empty compile cache (cold), then
    again with the cache such a run filled (warm: LLVM is skipped); each the median of W7_PROCESSES processes."""
    import os
    import statistics
    import subprocess
    import tempfile
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

    def run(program, cache_dir):
        env = dict(os.environ, FNX_CACHE_DIR=cache_dir)
        out = subprocess.run([sys.executable, "-c", program], cwd=root, capture_output=True, text=True, timeout=300,
                             env=env)
        return float(out.stdout.strip().splitlines()[-1])
    cold, warm = [], []
    for _ in range(W7_PROCESSES):
        with tempfile.TemporaryDirectory() as cache_dir:
            cold.append(run(W7_PROGRAM, cache_dir))
            warm.append(run(W7_PROGRAM, cache_dir))
    res = {"fnx": statistics.median(cold)}
    warm = statistics.median(warm)
    if jax: res["jax"] = statistics.median(run(W7_JAX, "") for _ in range(W7_PROCESSES))
    rows = report("W7 first call of the W4 step", res, f"fnx {res['fnx']:.2f} s cold, {warm:.2f} s with a warm cache")
    return rows + [{"workload": "W7", "description": "first call of the W4 step, warm compile cache",
                    "implementation": "fnx", "seconds": warm}]


def w9_gpt_step():
    rng = np.random.default_rng(0)
    params = _gpt_params(rng)
    data = rng.integers(0, GPT["vocab"], (GPT["batch"], GPT["seq"] + 1)).astype(np.int32)
    tokens, targets = data[:, :-1], data[:, 1:]
    f = fnx.jit(_gpt_step(jnp, fnx.nn, fnx.value_and_grad))
    p = {k: jnp.asarray(v) for k, v in params.items()}
    res = {"fnx": best(lambda: block(f(p, jnp.asarray(tokens), jnp.asarray(targets))[1]), repeat=5)}
    if jax:
        jf = jax.jit(_gpt_step(jjnp, jax.nn, jax.value_and_grad))
        jp = {k: jjnp.asarray(v) for k, v in params.items()}
        jt, jy = jjnp.asarray(tokens), jjnp.asarray(targets)
        np.testing.assert_allclose(float(f(p, jnp.asarray(tokens), jnp.asarray(targets))[1]),
                                   float(jf(jp, jt, jy)[1]), rtol=1e-4)
        res["jax"] = best(lambda: jf(jp, jt, jy)[1].block_until_ready(), repeat=5)
    shape = "{layers} layers d={d} {heads} heads seq {seq} b{batch}".format(**GPT)
    return report(f"W9 GPT train step {shape}", res, f"fnx {1 / res['fnx']:.0f} steps/s")


def w10_layernorm_chain():
    """Eight layernorm + residual steps on (4096, 1024): each 4 KB row of all eight fits in L1, so the chain needs
    one read and one write of the array (32 MB) if fused row by row."""
    x_np = np.random.default_rng(0).standard_normal((4096, 1024)).astype(np.float32)

    def chain(lib):
        def f(x):
            for _ in range(8):
                mean = x.mean(-1, keepdims=True)
                y = (x - mean) / lib.sqrt(((x - mean) ** 2).mean(-1, keepdims=True) + 1e-5)
                x = x + 0.5 * y
            return x
        return f
    f = fnx.jit(chain(jnp))
    x = jnp.asarray(x_np)
    res = {"fnx": best(lambda: block(f(x))), "numpy": best(lambda: chain(np)(x_np), repeat=3)}
    if jax:
        jf, jx = jax.jit(chain(jjnp)), jjnp.asarray(x_np)
        res["jax"] = best(lambda: jf(jx).block_until_ready())
    return report("W10 layernorm+residual x8 (4096,1024)", res, bytes_moved=2 * x_np.nbytes)


def _convnet_params(rng) -> dict:
    """Two 3x3 conv layers (1 -> 16 -> 32 channels, NHWC/HWIO), each followed by relu and 2x2 max pooling, then a
    dense layer to 10 classes."""
    normal = lambda *shape, scale: (rng.standard_normal(shape) * scale).astype(np.float32)  # noqa: E731
    return {"c1": normal(3, 3, 1, 16, scale=0.3), "b1": np.zeros(16, np.float32),
            "c2": normal(3, 3, 16, 32, scale=0.08), "b2": np.zeros(32, np.float32),
            "w": normal(7 * 7 * 32, 10, scale=0.03), "b": np.zeros(10, np.float32)}


def _convnet_step(lib, lax_lib, nn_lib, grad_fn):
    """One SGD step of a small convnet's cross-entropy on 28x28 images, written once for fnx and JAX."""
    def conv(x, w, b):
        y = lax_lib.conv_general_dilated(x, w, (1, 1), "SAME", dimension_numbers=("NHWC", "HWIO", "NHWC"))
        return nn_lib.relu(y + b)

    def pool(x):
        return lax_lib.reduce_window(x, -lib.inf, lax_lib.max, (1, 2, 2, 1), (1, 2, 2, 1), "VALID")

    def loss(p, images, onehot):
        h = pool(conv(pool(conv(images, p["c1"], p["b1"])), p["c2"], p["b2"]))
        logits = h.reshape(h.shape[0], -1) @ p["w"] + p["b"]
        return -lib.mean(lib.sum(nn_lib.log_softmax(logits) * onehot, axis=-1))

    return _sgd_step(loss, grad_fn, 0.05)


def w11_convnet_step():
    rng = np.random.default_rng(0)
    params = _convnet_params(rng)
    images = rng.standard_normal((64, 28, 28, 1)).astype(np.float32)
    onehot = np.eye(10, dtype=np.float32)[rng.integers(0, 10, 64)]
    f = fnx.jit(_convnet_step(jnp, fnx.lax, fnx.nn, fnx.value_and_grad))
    p, x, y = {k: jnp.asarray(v) for k, v in params.items()}, jnp.asarray(images), jnp.asarray(onehot)
    res = {"fnx": best(lambda: block(f(p, x, y)[1]), repeat=7)}
    if jax:
        jf = jax.jit(_convnet_step(jjnp, jax.lax, jax.nn, jax.value_and_grad))
        jp, jx, jy = {k: jjnp.asarray(v) for k, v in params.items()}, jjnp.asarray(images), jjnp.asarray(onehot)
        np.testing.assert_allclose(float(f(p, x, y)[1]), float(jf(jp, jx, jy)[1]), rtol=1e-4)
        res["jax"] = best(lambda: jf(jp, jx, jy)[1].block_until_ready(), repeat=7)
    return report("W11 convnet train step 28x28 b64", res, f"fnx {1 / res['fnx']:.0f} steps/s")


ATTENTION = dict(batch=8, heads=8, seq=256, head_dim=64)


def _attention_step(lib, nn_lib, grad_fn):
    """Causal attention, softmax(q kᵀ / √d, masked) v, and its gradient with respect to q, k and v (of the output
    against a fixed cotangent), written once for fnx and JAX."""
    t, d = ATTENTION["seq"], ATTENTION["head_dim"]

    def block(q, k, v, g):
        mask = lib.arange(t)[:, None] >= lib.arange(t)[None, :]
        scores = lib.where(mask, q @ k.transpose(0, 1, 3, 2) / math.sqrt(d), -1e9)
        return lib.sum((nn_lib.softmax(scores, axis=-1) @ v) * g)
    return grad_fn(block, argnums=(0, 1, 2))


def w12_attention_block():
    """The attention block of the performance issue (QKᵀ -> mask -> softmax -> ·V) forward and backward: six
    (t x t x d) products, 12 b h t² d FLOPs, reported against the FMA peak."""
    b, h, t, d = (ATTENTION[k] for k in ("batch", "heads", "seq", "head_dim"))
    rng = np.random.default_rng(0)
    q, k, v, g = (rng.standard_normal((b, h, t, d)).astype(np.float32) for _ in range(4))
    f = fnx.jit(_attention_step(jnp, fnx.nn, fnx.value_and_grad))
    args = [jnp.asarray(a) for a in (q, k, v, g)]
    res = {"fnx": best(lambda: block(f(*args)[1][0]), repeat=5)}
    if jax:
        jf = jax.jit(_attention_step(jjnp, jax.nn, jax.value_and_grad))
        jargs = [jjnp.asarray(a) for a in (q, k, v, g)]
        got, want = f(*args), jf(*jargs)
        for x, y in zip(got[1], want[1]): np.testing.assert_allclose(np.asarray(x), np.asarray(y), rtol=2e-3, atol=2e-3)
        res["jax"] = best(lambda: jf(*jargs)[1][0].block_until_ready(), repeat=5)
    return report(f"W12 attention fwd+bwd b{b} h{h} t{t} d{d} causal", res, flops=12 * b * h * t * t * d)


W13_PROGRAM = """
import sys, time, numpy as np
from bench import models as bench
bench.GPT["layers"] = {layers}
if {use_jax}:
    import jax, jax.numpy as lib
    lib_nn, grad, jit = jax.nn, jax.value_and_grad, jax.jit
else:
    import fnx, fnx.numpy as lib
    lib_nn, grad, jit = fnx.nn, fnx.value_and_grad, fnx.jit
rng = np.random.default_rng(0)
params = bench._gpt_params(rng)
data = rng.integers(0, bench.GPT["vocab"], (bench.GPT["batch"], bench.GPT["seq"] + 1)).astype(np.int32)
f = jit(bench._gpt_step(lib, lib_nn, grad))
t0 = time.perf_counter()
p = {{k: lib.asarray(v) for k, v in params.items()}}
np.asarray(f(p, lib.asarray(data[:, :-1]), lib.asarray(data[:, 1:]))[1])
print(time.perf_counter() - t0)
"""


def w13_gpt_first_call():
    """Trace + compile + first run of the W9 step with 1, 2 and 4 layers, each in a fresh process with an empty
    compile cache: compile time should grow with the depth by a small constant (JAX's is the reference)."""
    import os
    import subprocess
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

    def run(layers: int, use_jax: bool) -> float:
        env = dict(os.environ, FNX_CACHE_DIR="")
        program = W13_PROGRAM.format(layers=layers, use_jax=use_jax)
        out = subprocess.run([sys.executable, "-c", program], cwd=root, capture_output=True, text=True, timeout=600,
                             env=env)
        if out.returncode: raise RuntimeError(out.stderr[-2000:])
        return float(out.stdout.strip().splitlines()[-1])
    rows = []
    for layers in (1, 2, 4):
        res = {"fnx": run(layers, False)}
        if jax: res["jax"] = run(layers, True)
        rows += report(f"W13 first call of the GPT step, {layers} layer{'s' if layers > 1 else ''}", res,
                       f"fnx {res['fnx']:.2f} s")
    return rows


def _set_row(x, i):
    """x.at[i].set(0.0) (a copy of numpy's x with row i zeroed)."""
    if isinstance(x, np.ndarray):
        x = x.copy()
        x[i] = 0.0
        return x
    return x.at[i].set(0.0)


def w14_eager_ops():
    """Eager (not jitted) calls on a (64, 128) float32 array, each blocked on: the per-op cost of notebook-style
    code. One row per op, fnx against numpy and JAX's eager op."""
    x_np = np.random.default_rng(0).standard_normal((64, 128)).astype(np.float32)
    ops = {"x * 2.0": lambda lib, nn, x: x * 2.0,
           "x * v, a new float v each call": lambda lib, nn, x, i=itertools.count(): x * (0.5 + next(i) / 4096),
           "mean(-1)": lambda lib, nn, x: x.mean(-1),
           "where(x > 0, x, 0.0)": lambda lib, nn, x: lib.where(x > 0, x, 0.0),
           "x @ x.T": lambda lib, nn, x: x @ x.T, "softmax": lambda lib, nn, x: nn.softmax(x),
           "gelu": lambda lib, nn, x: nn.gelu(x), "x.reshape(128, 64)": lambda lib, nn, x: x.reshape(128, 64),
           "x[i], i = 0..63": lambda lib, nn, x, i=itertools.count(): x[next(i) % 64],
           "x.at[i].set(0.0), i = 0..63": lambda lib, nn, x, i=itertools.count(): _set_row(x, next(i) % 64)}

    def np_softmax(x):
        e = np.exp(x - x.max(-1, keepdims=True))
        return e / e.sum(-1, keepdims=True)
    np_nn = type("np_nn", (), {"softmax": staticmethod(np_softmax), "gelu": staticmethod(
        lambda x: 0.5 * x * (1 + np.tanh(0.7978845608028654 * (x + 0.044715 * x ** 3))))})
    x = jnp.asarray(x_np)
    rows = []
    for name, op in ops.items():
        res = {"fnx": best(lambda: op(jnp, fnx.nn, x).block_until_ready(), number=200),
               "numpy": best(lambda: op(np, np_nn, x_np), number=200)}
        if jax:
            jx = jjnp.asarray(x_np)
            res["jax"] = best(lambda: op(jjnp, jax.nn, jx).block_until_ready(), number=200)
        rows += report(f"W14 eager {name} (64,128)", res, f"fnx {res['fnx'] * 1e6:.1f} us/call")
    return rows


def _adam(lib):
    def update(p, g, mu, nu):
        mu = {k: 0.9 * mu[k] + 0.1 * g[k] for k in p}
        nu = {k: 0.999 * nu[k] + 0.001 * g[k] ** 2 for k in p}
        return {k: p[k] - 1e-3 * mu[k] / (lib.sqrt(nu[k]) + 1e-8) for k in p}, mu, nu
    return update


def _xent(lib, nn, grad):
    return lambda x, y: grad(lambda x: -(nn.log_softmax(x) * y).sum(-1).mean())(x)


def _xent_np(x, y):
    e = np.exp(x - x.max(-1, keepdims=True))
    s = e.sum(-1, keepdims=True)
    return -((x - x.max(-1, keepdims=True) - np.log(s)) * y).sum(-1).mean(), (e / s - y) / len(x)


def _embedding(lib, grad):
    return lambda table, ids, w: grad(lambda t: ((t[ids] @ w) ** 2).mean())(table)


def _embedding_np(table, ids, w):
    h = table[ids] @ w
    g = np.zeros_like(table)
    np.add.at(g, ids, (2 / h.size) * h @ w.T)
    return (h ** 2).mean(), g


def _top_k_np(x, k):
    part = np.argpartition(-x, k, axis=-1)[:, :k]
    order = np.take_along_axis(part, np.argsort(-np.take_along_axis(x, part, -1), axis=-1, kind="stable"), -1)
    return np.take_along_axis(x, order, -1), order


def w15_everyday_ops():
    """Ops of everyday models outside W1-W14, each where fnx once fell far behind JAX: an Adam update over 20
    tensors (2.2M parameters), softmax cross-entropy with its gradient, an embedding lookup's gradient (a scatter of
    a product), a transpose, top_k of a few entries, a bfloat16 matmul. fnx and JAX jitted, numpy as written by hand
    (the bfloat16 matmul: no numpy)."""
    rng = np.random.default_rng(0)
    rows = []

    def run(name, fn_fnx, fn_np, fn_jax, args, note="", bytes_moved=0, flops=0):
        fx = fnx.jit(fn_fnx)
        fa = fnx.tree_util.tree_map(jnp.asarray, args)
        res = {"fnx": best(lambda: fnx.block_until_ready(fx(*fa)))}
        if fn_np is not None: res["numpy"] = best(lambda: fn_np(*args))
        if jax:
            jf, ja = jax.jit(fn_jax), jax.tree_util.tree_map(jjnp.asarray, args)
            res["jax"] = best(lambda: jax.block_until_ready(jf(*ja)))
        return report(name, res, note, bytes_moved=bytes_moved, flops=flops)
    shapes = [(512, 512), (512,), (1024, 256), (256,), (64, 64, 3, 3)] * 4
    p = {f"p{i}": rng.standard_normal(sh).astype(np.float32) for i, sh in enumerate(shapes)}
    state = (p, {k: rng.standard_normal(v.shape).astype(np.float32) for k, v in p.items()},
             {k: np.zeros_like(v) for k, v in p.items()}, {k: np.abs(rng.standard_normal(v.shape)).astype(np.float32)
                                                            for k, v in p.items()})
    size = sum(v.nbytes for v in p.values())
    rows += run("W15 Adam update, 20 tensors (2.2M)", _adam(jnp), _adam(np), _adam(jjnp) if jax else None, state,
                bytes_moved=7 * size)  # (reads p, g, mu, nu; writes p, mu, nu)
    x = rng.standard_normal((4096, 1000)).astype(np.float32)
    y = np.eye(1000, dtype=np.float32)[rng.integers(0, 1000, 4096)]
    rows += run("W15 softmax xent + grad (4096,1000)", _xent(jnp, fnx.nn, fnx.value_and_grad), _xent_np,
                _xent(jjnp, jax.nn, jax.value_and_grad) if jax else None, (x, y), bytes_moved=3 * x.nbytes)
    table = (rng.standard_normal((50000, 256)) * 0.02).astype(np.float32)
    ids, w = rng.integers(0, 50000, 4096).astype(np.int32), rng.standard_normal((256, 64)).astype(np.float32)
    rows += run("W15 embedding grad 50k x 256, 4096 ids", _embedding(jnp, fnx.value_and_grad), _embedding_np,
                _embedding(jjnp, jax.value_and_grad) if jax else None, (table, ids, w))
    x = rng.standard_normal((4096, 4096)).astype(np.float32)
    rows += run("W15 x.T + 1 (4096,4096)", lambda x: x.T + 1, lambda x: np.add(x.T, 1, order="C"), lambda x: x.T + 1,
                (x,), bytes_moved=2 * x.nbytes)
    x = rng.standard_normal((1024, 4096)).astype(np.float32)
    rows += run("W15 top_k 8 of (1024,4096)", lambda x: fnx.lax.top_k(x, 8), lambda x: _top_k_np(x, 8),
                (lambda x: jax.lax.top_k(x, 8)) if jax else None, (x,))
    a, b = (rng.standard_normal((1024, 1024)).astype(np.float32) for _ in range(2))

    def bf16_product(lib):
        return lambda a, b: (a.astype(lib.bfloat16) @ b.astype(lib.bfloat16)).astype(lib.float32)
    rows += run("W15 bfloat16 matmul 1024x1024", bf16_product(jnp), None, bf16_product(jjnp) if jax else None,
                (a, b), flops=2 * 1024 ** 3)
    return rows


WORKLOADS = {"W1": w1_gelu, "W2": w2_matmul, "W3": w3_softmax, "W4": w4_mlp_step, "W5": w5_per_example_grads,
             "W6": w6_dispatch, "W7": w7_first_call, "W8": w8_scan_rnn, "W9": w9_gpt_step, "W10": w10_layernorm_chain,
             "W11": w11_convnet_step, "W12": w12_attention_block, "W13": w13_gpt_first_call, "W14": w14_eager_ops,
             "W15": w15_everyday_ops}


def _time_cell(seconds: float, base: float | None) -> str:
    text = (f"{seconds * 1e6:.1f} µs" if seconds < 1e-3 else f"{seconds * 1e3:.1f} ms" if seconds < 1
            else f"{seconds:.2f} s")
    return text + (f" ({seconds / base:.2f}x)" if base else "")


def markdown(rows: list[dict], header: str) -> str:
    """A README table: one line per (workload, description), fnx | numpy | JAX times (ratio other/fnx), notes."""
    lines = [header, "", "| workload | fnx | numpy | JAX | notes |", "|---|---|---|---|---|"]
    groups: dict[tuple[str, str, str], dict[str, dict]] = {}  # (one line per device fnx ran on: --devices)
    for row in rows:
        key = (row["workload"], row["description"], row.get("device", "cpu"))
        groups.setdefault(key, {})[row["implementation"]] = row
    for (workload, description, device), impls in groups.items():
        base = impls["fnx"]["seconds"]
        cells = [_time_cell(impls[i]["seconds"], None if i == "fnx" else base) if i in impls else ""
                 for i in ("fnx", "numpy", "jax")]
        fnx_row = impls["fnx"]
        note = (f"fnx {fnx_row['GB/s']:.1f} GB/s ({fnx_row['fraction_of_bandwidth']:.0%} of measured bandwidth)"
                if "GB/s" in fnx_row else f"fnx {fnx_row['GFLOP/s']:.1f} GFLOP/s ({fnx_row['fraction_of_peak']:.0%} of "
                "estimated peak)" if "GFLOP/s" in fnx_row else fnx_row.get("note", ""))
        where = "" if device == "cpu" else f" on {device}"
        lines.append(f"| {workload} {description}{where} | " + " | ".join(cells) + f" | {note} |")
    return "\n".join(lines)


def best_rows(rows: list[dict]) -> list[dict]:
    """One row per (device, workload, description, implementation): the fastest of the rounds' (its rates and
    note are that round's), in the order of the first round."""
    best: dict[tuple, dict] = {}
    for row in rows:
        key = (row["device"], row["workload"], row["description"], row["implementation"])
        if key not in best or row["seconds"] < best[key]["seconds"]: best[key] = row
    return list(best.values())


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("workloads", nargs="*", metavar="W", help=f"some of {', '.join(WORKLOADS)} (default: all)")
    parser.add_argument("--json", metavar="PATH", help="write every result (seconds, GB/s, GFLOP/s) as JSON")
    parser.add_argument("--markdown", action="store_true", help="print a markdown table for the README")
    parser.add_argument("--devices", default="cpu", help="fnx devices to run each workload on, one after another "
                                                         "(e.g. cpu,opencl; numpy and JAX run beside each)")
    parser.add_argument("--rounds", type=int, default=1, help="run every workload this many times, round after "
                        "round, and report each implementation's best (a shared machine's busy minutes then hit "
                        "one round of a workload, not the table)")
    args = parser.parse_args(argv)
    unknown = [w for w in args.workloads if w.upper() not in WORKLOADS]
    if unknown: parser.error(f"unknown workload(s) {', '.join(unknown)}; choose from {', '.join(WORKLOADS)}")
    chosen = [w.upper() for w in args.workloads] or list(WORKLOADS)
    date = datetime.date.today().isoformat()
    versions = f"numpy {np.__version__}, jax {jax.__version__ if jax else 'not installed'}"
    print(f"fnx bench: {date}, {versions}")
    print(f"host copy bandwidth: {memory_bandwidth():.1f} GB/s (256 MiB np.copyto, read + write counted)")
    peak, how = core_peak()
    print(f"float32 peak estimate: {how[0]}")
    for line in how[1:]: print(f"{'':23s}{line}")
    rows = []
    for round_ in range(max(args.rounds, 1)):
        if args.rounds > 1: print(f"--- round {round_ + 1} of {args.rounds} ---")
        if round_: print(f"host copy bandwidth now: {measure_bandwidth():.1f} GB/s (the best so far: "
                         f"{memory_bandwidth():.1f})")
        for device in args.devices.split(","):
            if device != "cpu": print(f"--- fnx on {device} ({fnx.devices(device.split(':')[0])[0]}) ---")
            with fnx.default_device(device):
                for name in chosen:
                    for row in WORKLOADS[name]():
                        rows.append({**row, "device": device})
    print(f"host copy bandwidth at the end: {measure_bandwidth():.1f} GB/s; the fractions below are of the best of "
          f"the run's {len(_BANDWIDTHS)} measurements, {memory_bandwidth():.1f} GB/s")
    rows = best_rows(rows)
    for row in rows:  # (each printed as it ran against the best measured by then)
        if "GB/s" in row: row["fraction_of_bandwidth"] = row["GB/s"] / memory_bandwidth()
    command = " ".join(["python", "bench/run.py", *argv])
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"date": date, "command": command, "numpy": np.__version__,
                       "jax": jax.__version__ if jax else None, "memory_bandwidth_GB/s": memory_bandwidth(),
                       "peak_GFLOP/s": peak, "peak_how": how, "results": rows}, f, indent=1)
    if args.markdown:
        print("\n" + markdown(rows, f"Measured {date} with `{command}` on {os.cpu_count()} cores, {versions}; "
                                    f"host copy bandwidth {memory_bandwidth():.1f} GB/s (the best of "
                                    f"{len(_BANDWIDTHS)} measurements), float32 peak estimate {peak:.0f} GFLOP/s; "
                                    "\"x\" is other / fnx (above 1: fnx is faster)."))


if __name__ == "__main__":
    main(sys.argv[1:])
