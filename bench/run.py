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


WORKLOADS = {"W1": w1_gelu, "W3": w3_softmax, "W6": w6_dispatch}


def main(argv: list[str]) -> None:
    chosen = [w for w in argv if w in WORKLOADS] or list(WORKLOADS)
    print(f"fnx bench: {time.strftime('%Y-%m-%d')}, numpy {np.__version__}, "
          f"jax {jax.__version__ if jax else 'not installed'}, host copy bandwidth {memory_bandwidth():.1f} GB/s")
    for name in chosen:
        WORKLOADS[name]()


if __name__ == "__main__":
    main(sys.argv[1:])
