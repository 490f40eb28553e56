"""Threads that trace and run: every result checked against numpy, with the interpreter's thread switch interval
shortened so that traces interleave at every few bytecodes. Trace state is per thread; caches are shared."""
import os
import subprocess
import sys
import threading

import numpy as np
import pytest

import fnx
import fnx.numpy as jnp


def loss(w, x):
    return jnp.sum(jnp.tanh(x @ w))


def _loss_grad(w, x):
    return x.T @ (1 - np.tanh(x @ w) ** 2)


jit_grad = fnx.jit(fnx.grad(loss))  # one jitted function shared by every thread (its cache too)
per_row = fnx.vmap(lambda row, w: jnp.sin(row @ w) * 2.0, in_axes=(0, None))


def _run_threads(work, n: int) -> list:
    errors: list = []

    def guarded(t):
        try:
            work(t)
        except BaseException as e:  # noqa: BLE001 - reported below with the thread's number
            errors.append((t, repr(e)))
    previous = sys.getswitchinterval()
    sys.setswitchinterval(1e-5)
    try:
        threads = [threading.Thread(target=guarded, args=(t,)) for t in range(n)]
        for t in threads: t.start()
        for t in threads: t.join()
    finally:
        sys.setswitchinterval(previous)
    return errors


def test_eight_threads_grad_jit_vmap_eager():
    checked = [0] * 8

    def work(t):
        rng = np.random.default_rng(t)
        rows = 3 + t % 3  # some threads compile new shapes while others run
        for _ in range(20):
            w = rng.standard_normal((8, 4)).astype(np.float32)
            x = rng.standard_normal((rows, 8)).astype(np.float32)
            expected = _loss_grad(w.astype(np.float64), x.astype(np.float64))
            np.testing.assert_allclose(np.asarray(fnx.grad(loss)(jnp.asarray(w), jnp.asarray(x))), expected,
                                       rtol=1e-4, atol=1e-4)
            np.testing.assert_allclose(np.asarray(jit_grad(w, x)), expected, rtol=1e-4, atol=1e-4)
            np.testing.assert_allclose(np.asarray(per_row(x, w)), np.sin(x.astype(np.float64) @ w) * 2,
                                       rtol=1e-4, atol=1e-4)
            scale = float(rng.integers(1, 100))  # an eager op while other threads trace
            np.testing.assert_allclose(np.asarray(jnp.exp(jnp.asarray(w)) * scale), np.exp(w) * scale, rtol=1e-5)
            checked[t] += 1
    assert _run_threads(work, 8) == []
    assert checked == [20] * 8


def test_jit_traced_in_one_thread_eager_in_another():
    """An eager op in one thread while another is inside a jit trace is concrete (it raised ConcretizationError)."""
    inside, release = threading.Event(), threading.Event()

    @fnx.jit
    def slow(x):
        inside.set()
        release.wait(10)
        return x * 2

    results = {}

    def tracer(_):
        results["jit"] = np.asarray(slow(jnp.arange(3.0)))

    def eager(_):
        inside.wait(10)
        results["eager"] = float(jnp.sum(jnp.arange(4.0)))  # float() needs a concrete value
        release.set()
    errors: list = []
    threads = [threading.Thread(target=lambda f=f: errors.extend(_run_threads(f, 1))) for f in (tracer, eager)]
    for t in threads: t.start()
    for t in threads: t.join()
    assert errors == []
    assert results["eager"] == 6.0
    np.testing.assert_array_equal(results["jit"], [0.0, 2.0, 4.0])


def test_default_device_is_per_thread():
    seen = {}
    with fnx.default_device("interp"):
        t = threading.Thread(target=lambda: seen.setdefault("other", jnp.ones(2).device.platform))
        t.start()
        t.join()
        seen["this"] = jnp.ones(2).device.platform
    assert seen == {"this": "interp", "other": "cpu"}


@pytest.mark.parametrize("threads", [2, 4])
def test_first_large_eager_ops_at_once(threads):
    """Several threads starting the CPU backend and its native worker pool together (it segfaulted 2 runs in 3):
    in a child process, so that a crash fails this test instead of the suite."""
    code = f"""
import threading, numpy as np, fnx.numpy as jnp
out = {{}}
def work(t): out[t] = float(np.asarray(jnp.full((1 << 21,), float(t))).sum())
ts = [threading.Thread(target=work, args=(t,)) for t in range({threads})]
for t in ts: t.start()
for t in ts: t.join()
assert out == {{t: float(t << 21) for t in range({threads})}}, out
print("ok")
"""
    for _ in range(3):
        run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                             env={**os.environ, "FNX_CACHE_DIR": ""})
        assert run.returncode == 0 and run.stdout.strip() == "ok", (run.returncode, run.stderr[-2000:])
