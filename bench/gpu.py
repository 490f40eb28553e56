"""fnx on a CUDA GPU beside JAX on the same GPU, against the GPU's own limits, measured in one run.

    python bench/gpu.py                  # on cuda:0
    python bench/gpu.py --json out.json  # also write every result as JSON
    python bench/gpu.py --device cpu --small   # a smoke test of this script where there is no GPU

The limits are measured here, not quoted: the device-to-device copy bandwidth (cuMemcpyDtoD of 1 GiB on the fnx
device's stream, read + write counted) and, where JAX sees the GPU, the bf16 matrix rate of an 8192^3 product
(what the tensor cores reach). Each workload is timed as a queue of `number` calls ended by one wait (fnx and JAX
both dispatch asynchronously), best of `repeat` queues; every fnx result is first checked against numpy.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")  # JAX must leave the GPU's memory to fnx

import ml_dtypes  # noqa: E402
import numpy as np  # noqa: E402

import fnx  # noqa: E402
import fnx.numpy as jnp  # noqa: E402

try:
    import jax
    import jax.numpy as jjnp
except ImportError:  # JAX is an optional comparison, never a dependency
    jax = None


def queued(fn, wait, number: int, repeat: int = 5) -> float:
    """Seconds per call: best of `repeat` queues of `number` calls, each queue ended by one `wait` of the last."""
    wait(fn())
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        for _ in range(number): out = fn()
        wait(out)
        times.append((time.perf_counter() - start) / number)
    return min(times)


def fnx_wait(x):
    return fnx.block_until_ready(x)


def jax_wait(x):
    return jax.block_until_ready(x)


def copy_bandwidth(device, nbytes: int) -> float:
    """GB/s of a device-to-device copy of `nbytes` on the device's own stream (read + write counted)."""
    if device.platform != "cuda":  # (the smoke test: the host's copy)
        a = np.ones(nbytes // 4, np.float32)
        b = np.empty_like(a)
        return 2 * nbytes / queued(lambda: np.copyto(b, a), lambda _: None, 3) / 1e9
    from fnx.dtypes import float32
    src, dst = device.allocator.alloc(float32, nbytes // 4), device.allocator.alloc(float32, nbytes // 4)
    driver = device.driver

    def copy():
        driver.cuMemcpyDtoDAsync(dst.ptr, src.ptr, nbytes, device.stream)
    return 2 * nbytes / queued(copy, lambda _: device.synchronize(), 10) / 1e9


def jax_bf16_peak(n: int) -> float | None:
    """TFLOP/s of JAX's n^3 bf16 product on its default device (the tensor cores' reachable rate), or None."""
    if jax is None or jax.default_backend() != "gpu": return None
    a = jax.device_put(np.ones((n, n), ml_dtypes.bfloat16))
    f = jax.jit(lambda a: a @ a)
    return 2 * n ** 3 / queued(lambda: f(a), jax_wait, 10) / 1e12


class Bench:
    def __init__(self, device: str, small: bool):
        self.device, self.small, self.rows = device, small, []

    def run(self, name: str, fnx_fn, jax_fn, args: list[np.ndarray], want, number: int, bytes_moved: int = 0,
            flops: int = 0, rtol: float = 1e-4, atol: float = 1e-5) -> None:
        """Time fnx_fn(*args) on the device (checked against `want`) and jax_fn(*args) on JAX's device."""
        dev_args = [fnx.device_put(a, self.device) for a in args]
        got = np.asarray(fnx_fn(*dev_args)).astype(np.float64)
        np.testing.assert_allclose(got, np.asarray(want, np.float64), rtol=rtol, atol=atol, err_msg=name)
        res = {"fnx": queued(lambda: fnx_fn(*dev_args), fnx_wait, number)}
        if jax is not None:
            jax_args = [jax.device_put(a) for a in args]
            res["jax"] = queued(lambda: jax_fn(*jax_args), jax_wait, number)
        line = f"{name:36s} fnx {res['fnx'] * 1e3:8.3f} ms"
        if "jax" in res: line += f" | jax {res['jax'] * 1e3:8.3f} ms ({res['jax'] / res['fnx']:5.2f}x)"
        for impl, t in res.items():
            row = {"workload": name, "implementation": impl, "seconds": t, "device": self.device}
            if bytes_moved: row["GB/s"] = bytes_moved / t / 1e9
            if flops: row["TFLOP/s"] = flops / t / 1e12
            self.rows.append(row)
        rates = [r for r in self.rows[-len(res):]]
        if bytes_moved: line += "  GB/s " + " | ".join(f"{r['implementation']} {r['GB/s']:.0f}" for r in rates)
        if flops: line += "  TFLOP/s " + " | ".join(f"{r['implementation']} {r['TFLOP/s']:.2f}" for r in rates)
        print(line, flush=True)


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda:0")
    parser.add_argument("--small", action="store_true", help="small sizes (a smoke test of this script)")
    parser.add_argument("--json", metavar="PATH")
    args = parser.parse_args(argv)
    device = fnx.devices(args.device.split(":")[0])[int(args.device.partition(":")[2] or 0)]
    print(f"fnx gpu bench on {device} ({device.device_kind}); jax "
          f"{jax.__version__ + ' on ' + str(jax.devices()[0]) if jax else 'not installed'}", flush=True)
    bandwidth = copy_bandwidth(device, (16 if args.small else 1024) << 20)
    peak = jax_bf16_peak(8192) if not args.small else None
    print(f"device copy bandwidth {bandwidth:.0f} GB/s; JAX bf16 8192^3 product "
          f"{f'{peak:.0f} TFLOP/s' if peak else 'not measured'}", flush=True)
    b, rng = Bench(args.device, args.small), np.random.default_rng(0)

    n = 1 << (20 if args.small else 26)
    x = rng.standard_normal(n).astype(np.float32)

    def gelu(lib, x):
        y = x * np.float32(1.5) + np.float32(0.1)
        return 0.5 * y * (1 + lib.tanh(np.float32(0.7978845608) * (y + np.float32(0.044715) * y * y * y)))
    b.run(f"W1 gelu(x*a+b) {n >> 20}M f32", fnx.jit(lambda x: gelu(jnp, x)),
          jax and jax.jit(lambda x: gelu(jjnp, x)), [x], gelu(np, x), 20, bytes_moved=2 * x.nbytes)
    b.run(f"W1 streaming x*a+b {n >> 20}M f32", fnx.jit(lambda x: x * 1.5 + 0.1),
          jax and jax.jit(lambda x: x * 1.5 + 0.1), [x], x * np.float32(1.5) + np.float32(0.1), 20,
          bytes_moved=2 * x.nbytes)
    for size, dtype, tol in ((1024, np.float32, 1e-3), (4096, np.float32, 1e-3), (4096, ml_dtypes.bfloat16, 2e-2)):
        size = min(size, 256) if args.small else size
        a_np, c_np = rng.standard_normal((2, size, size)).astype(dtype)
        want = a_np.astype(np.float32) @ c_np.astype(np.float32)
        b.run(f"W2 matmul {size}^2 {np.dtype(dtype).name}", fnx.jit(lambda a, c: a @ c),
              jax and jax.jit(lambda a, c: a @ c), [a_np, c_np], want, 5 if size >= 4096 else 20,
              flops=2 * size ** 3, rtol=tol, atol=tol * np.sqrt(size))
    rows_n = 1024 if args.small else 8192
    s = rng.standard_normal((rows_n, rows_n)).astype(np.float32)
    e = np.exp(s - s.max(-1, keepdims=True))
    b.run(f"W3 softmax ({rows_n},{rows_n}) f32", fnx.jit(lambda x: fnx.nn.softmax(x, axis=-1)),
          jax and jax.jit(lambda x: jax.nn.softmax(x, axis=-1)), [s], e / e.sum(-1, keepdims=True), 20,
          bytes_moved=2 * s.nbytes, atol=1e-7)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"device": str(device), "device_kind": device.device_kind, "copy_GB/s": bandwidth,
                       "jax_bf16_TFLOP/s": peak, "jax": jax.__version__ if jax else None, "results": b.rows}, f,
                      indent=1)


if __name__ == "__main__":
    main(sys.argv[1:])
