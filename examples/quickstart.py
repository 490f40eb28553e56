"""The main job for now: a jitted computation on the CPU, checked against numpy, with eager/jit/numpy timings."""
import time

import numpy as np

import fnx
import fnx.numpy as jnp


@fnx.jit
def f(x, w, b):
    return jnp.tanh(x @ w + b).sum(axis=-1)


def best_of(fn, repeat=5):
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        out = fn()
        np.asarray(out)
        times.append(time.perf_counter() - start)
    return min(times), out


def main():
    rng = np.random.default_rng(0)
    x_np = rng.standard_normal((256, 512)).astype(np.float32)
    w_np = (rng.standard_normal((512, 128)) / np.sqrt(512)).astype(np.float32)
    b_np = np.zeros(128, np.float32)
    x, w, b = jnp.asarray(x_np), jnp.asarray(w_np), jnp.asarray(b_np)

    print("traced graph:")
    print(fnx.make_graph(f)(x, w, b))
    kernels = f.lower(x, w, b).executable.lowering.kernels
    print(f"\ncompiled into {len(kernels)} kernel(s): {[k.name for k, _ in kernels]}")

    want = np.tanh(x_np @ w_np + b_np).sum(axis=-1)
    got = np.asarray(f(x, w, b))
    err = np.max(np.abs(got - want))
    print(f"\nmax |fnx - numpy| = {err:.2e}")
    assert np.allclose(got, want, rtol=1e-4, atol=1e-4), "fnx disagrees with numpy"

    eager = lambda: jnp.tanh(x @ w + b).sum(axis=-1)  # noqa: E731
    t_jit, _ = best_of(lambda: f(x, w, b))
    t_eager, _ = best_of(eager)
    t_numpy, _ = best_of(lambda: np.tanh(x_np @ w_np + b_np).sum(axis=-1))
    print(f"\ntimings (best of 5): jit {t_jit * 1e3:.2f} ms · eager {t_eager * 1e3:.2f} ms · "
          f"numpy {t_numpy * 1e3:.2f} ms")
    y = jnp.exp(x) * 2
    print(f"eager jnp.exp(x) * 2 -> {y.shape} {y.dtype}, first value {float(y[0, 0]):.4f} "
          f"(numpy {np.exp(x_np[0, 0]) * 2:.4f})")
    print("ok")


if __name__ == "__main__":
    main()
