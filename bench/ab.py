"""A/B of compiler settings on one workload, interleaved in one process:

    python bench/ab.py W10 fnx.lower.pipeline.STREAM_MIN_CACHES=1000000 fnx.lower.pipeline.STREAM_MIN_CACHES=1
    python bench/ab.py W2 base fnx.lower.optimize.ACC_K=512 --calls 20
    python bench/ab.py W12 base fnx.lower.optimize.ROW_PAIRS=0,fnx.lower.optimize.PACK_PASSES=4
    python bench/ab.py MM784x256x512 base fnx.lower.optimize.ACC_K=128   # any (m, k) @ (k, n) float32 product

Each variant is a comma-separated list of `module.CONSTANT=integer` settings (`base`: none). The workload's program
is built and compiled once per variant, with the setting in force while it lowers, the in-process compile caches
emptied and the on-disk lowering cache off (its entries do not know these settings), so each variant is its own
code; then the variants are called in turn, round after round, and each reports its min, first quartile and
median per call. Their outputs must agree.

Why interleaved: on a shared VM the same build timed in two processes a minute apart moved by more than most
changes are worth (W12 15.8-37 ms, W10 2.0-3.0 ms); calls of both builds alternating within one process see the
same moment of the machine. bench/run.py remains the report against numpy and JAX; this is for deciding a change.
"""
from __future__ import annotations

import argparse
import importlib
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # (run as a script: bench.run)
import fnx  # noqa: E402
import fnx.numpy as jnp  # noqa: E402
from bench import run  # noqa: E402
from fnx.backends import cpu_llvm  # noqa: E402
from fnx.config import config  # noqa: E402


def _w10():
    x = jnp.asarray(np.random.default_rng(0).standard_normal((4096, 1024)).astype(np.float32))

    def f(x):
        for _ in range(8):
            mean = x.mean(-1, keepdims=True)
            x = x + 0.5 * ((x - mean) / jnp.sqrt(((x - mean) ** 2).mean(-1, keepdims=True) + 1e-5))
        return x
    return f, (x,)


def _w1():
    x = jnp.asarray(np.random.default_rng(0).standard_normal(1 << 24).astype(np.float32))
    return (lambda x: 0.5 * x * (1 + jnp.tanh(0.7978845608 * (x + 0.044715 * x * x * x)))), (x,)


def _w1_streaming():
    x = jnp.asarray(np.random.default_rng(0).standard_normal(1 << 24).astype(np.float32))
    return (lambda x: x * 1.5 + 0.1), (x,)


def _w2(n: int):
    a, b = (jnp.asarray(m) for m in np.random.default_rng(0).standard_normal((2, n, n)).astype(np.float32))
    return (lambda a, b: a @ b), (a, b)


def _matmul(shape: str):
    """`MMmxkxn`: an (m, k) @ (k, n) float32 product, for blocking decisions at shapes W2 does not cover."""
    m, k, n = (int(v) for v in shape.split("x"))
    rng = np.random.default_rng(0)
    a, b = (jnp.asarray(rng.standard_normal(s).astype(np.float32)) for s in ((m, k), (k, n)))
    return (lambda a, b: a @ b), (a, b)


def _program(workload: str):
    if workload.startswith("MM"): return _matmul(workload[2:])
    return PROGRAMS[workload]()


def _w3():
    x = jnp.asarray(np.random.default_rng(0).standard_normal((4096, 4096)).astype(np.float32))
    return (lambda x: fnx.nn.softmax(x, axis=-1)), (x,)


def _w4():
    params, x, y = run._mlp_data()
    args = ({k: jnp.asarray(v) for k, v in params.items()}, jnp.asarray(x),
            jnp.asarray(np.eye(10, dtype=np.float32)[y]))
    return run._mlp_step(jnp, fnx.nn, fnx.value_and_grad), args


def _w9():
    rng = np.random.default_rng(0)
    params = {k: jnp.asarray(v) for k, v in run._gpt_params(rng).items()}
    data = rng.integers(0, run.GPT["vocab"], (run.GPT["batch"], run.GPT["seq"] + 1)).astype(np.int32)
    return run._gpt_step(jnp, fnx.nn, fnx.value_and_grad), (params, jnp.asarray(data[:, :-1]),
                                                              jnp.asarray(data[:, 1:]))


def _w12():
    b, h, t, d = (run.ATTENTION[k] for k in ("batch", "heads", "seq", "head_dim"))
    rng = np.random.default_rng(0)
    args = tuple(jnp.asarray(rng.standard_normal((b, h, t, d)).astype(np.float32)) for _ in range(4))
    return run._attention_step(jnp, fnx.nn, fnx.value_and_grad), args


PROGRAMS = {"W1": _w1, "W1-streaming": _w1_streaming, "W2": lambda: _w2(1024), "W2-4096": lambda: _w2(4096),
            "W3": _w3, "W4": _w4, "W9": _w9, "W10": _w10, "W12": _w12}


def _settings(variant: str) -> list[tuple[object, str, int]]:
    if variant == "base": return []
    out = []
    for item in variant.split(","):
        path, _, value = item.partition("=")
        module, _, name = path.rpartition(".")
        mod = importlib.import_module(module)
        if not hasattr(mod, name): raise SystemExit(f"{module} has no {name}")
        out.append((mod, name, int(value)))
    return out


def _build(workload: str, variant: str):
    """The workload's program compiled under `variant`'s settings (restored afterwards), and its arguments. It is
    the compiled executable that is kept and called: a jitted function looks its executable up again after the
    next variant's build has emptied the caches, and then finds that variant's lowering under the same graph
    (every variant ran the last one's code, so each A/B compared a build with itself)."""
    settings = _settings(variant)
    saved = [(mod, name, getattr(mod, name)) for mod, name, _ in settings] + [(config, "cache_dir", config.cache_dir)]
    for mod, name, value in settings: setattr(mod, name, value)
    config.cache_dir = None  # (the on-disk lowerings are keyed by graph and fnx's source, not by these settings)
    try:
        fnx.clear_caches()
        cpu_llvm._lowerings.entries.clear()  # (the backend's lowerings by graph: clear_caches keeps them)
        fn, args = _program(workload)
        compiled = fnx.jit(fn).lower(*args).compile()
        fnx.block_until_ready(compiled(*args))
    finally:
        for mod, name, value in saved: setattr(mod, name, value)
    return compiled, args


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("workload", help=f"one of {sorted(PROGRAMS)}, or MMmxkxn: an (m, k) @ (k, n) product")
    parser.add_argument("variants", nargs="+", help="'base' or module.CONSTANT=int[,module.CONSTANT=int...]")
    parser.add_argument("--calls", type=int, default=60, help="rounds (each calls every variant once)")
    opts = parser.parse_args()
    built = [_build(opts.workload, v) for v in opts.variants]
    outs = [_leaves(f(*args)) for f, args in built]
    for other in outs[1:]:
        for x, y in zip(outs[0], other): np.testing.assert_allclose(x, y, rtol=1e-3, atol=1e-3)
    times: list[list[float]] = [[] for _ in built]
    for _ in range(opts.calls):
        for i, (f, args) in enumerate(built):
            start = time.perf_counter()
            fnx.block_until_ready(f(*args))
            times[i].append(time.perf_counter() - start)
    first = None
    for variant, ts in zip(opts.variants, times):
        ts.sort()
        median = ts[len(ts) // 2]
        first = first or median
        print(f"{opts.workload} {variant}: min {ts[0] * 1e3:.3f} ms, p25 {ts[len(ts) // 4] * 1e3:.3f}, "
              f"median {median * 1e3:.3f} ({median / first:.3f}x the first's)")


def _leaves(tree) -> list[np.ndarray]:
    """The arrays of a result pytree, as numpy arrays (for comparing the variants' outputs)."""
    return [np.asarray(x) for x in fnx.tree_util.tree_leaves(tree)]


if __name__ == "__main__":
    sys.exit(main())
