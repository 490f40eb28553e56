"""The native worker pool that runs thread-split kernel chunks (fnx/backends/native_pool.py)."""
import os
import threading
import time

import numpy as np
import pytest

import fnx
import fnx.numpy as jnp
from fnx.backends import cpu_llvm, native_pool


def _threaded(fn, *args):
    """fn jitted, with a check that its lowering has a thread-split kernel (so the pool is exercised)."""
    jitted = fnx.jit(fn)
    assert "thread-split loop 0" in jitted.lower(*args).as_text("optimize")
    return jitted


@pytest.fixture
def pool():
    compiler = cpu_llvm._compiler()
    p = native_pool.pool(compiler, 1)
    if p is None: pytest.skip("the native pool needs an x86-64 CPU")
    return p


def test_chunks_run_on_the_native_worker(pool):
    x = np.random.default_rng(0).standard_normal(1 << 21).astype(np.float32)
    xa, want = jnp.asarray(x), np.tanh(x) * 2 + 1
    f = _threaded(lambda x: jnp.tanh(x) * 2 + 1, xa)
    before = int(pool.ctrls[0][0])
    deadline = time.monotonic() + 20  # a bound, not a timing: the worker may wait for a core other tests hold
    while time.monotonic() < deadline:
        # back to back: a worker that fell asleep in the pause before is called back by the first call and
        # takes its chunk in the next ones (checking results in between would give it time to sleep again)
        outs = [f(xa) for _ in range(4)]
        if int(pool.ctrls[0][0]) > before: break
    assert int(pool.ctrls[0][0]) > before and int(pool.ctrls[0][1]) == int(pool.ctrls[0][0])
    for out in outs: np.testing.assert_allclose(np.asarray(out), want, rtol=1e-6, atol=1e-6)


def test_callers_on_several_threads_get_right_results(pool):
    """Only one caller holds the pool at a time; the others fall back to the thread pool."""
    rng = np.random.default_rng(1)
    xs = [rng.standard_normal(1 << 20).astype(np.float32) for _ in range(4)]
    f = _threaded(lambda x: jnp.exp(-x * x) + x, jnp.asarray(xs[0]))
    results, errors = {}, []

    def work(i):
        try:
            for _ in range(5): results[i] = np.asarray(f(jnp.asarray(xs[i])))
        except Exception as e:  # surfaced below
            errors.append(e)
    threads = [threading.Thread(target=work, args=(i,)) for i in range(4)]
    for t in threads: t.start()
    for t in threads: t.join()
    assert not errors
    for i, x in enumerate(xs):
        np.testing.assert_allclose(results[i], np.exp(-x * x) + x, rtol=1e-6, atol=1e-6)


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_a_forked_child_starts_its_own_workers(pool):
    x = np.arange(1 << 21, dtype=np.float32)
    f = _threaded(lambda x: x * 3 - 1, jnp.asarray(x))
    np.asarray(f(jnp.asarray(x)))
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # child: the parent's worker threads are gone
        ok = np.array_equal(np.asarray(f(jnp.asarray(x))), x * 3 - 1)
        os.write(write, b"1" if ok else b"0")
        os._exit(0)
    os.close(write)
    answer = os.read(read, 1)
    os.waitpid(pid, 0)
    assert answer == b"1"


def test_the_workers_code_is_compiled_when_the_device_is_made_and_used_by_the_pool():
    """A fresh process: making the cpu device submits the workers' code to the LLVM thread (no worker thread yet);
    the first thread-split program's pool takes that code, and its results are right."""
    import subprocess
    import sys
    program = """
import threading, numpy as np
import fnx, fnx.numpy as jnp
from fnx.backends import native_pool
x = jnp.asarray(np.arange(1 << 21, dtype=np.float32))
threads = fnx.backends.cpu_llvm._cpu_device(0).threads
if threads > 1:
    assert len(native_pool._code) == 1 and not native_pool._pools
    assert not any(t.name == "fnx-native" for t in threading.enumerate())
got = np.asarray(fnx.jit(lambda x: x * 3 - 1)(x))
assert np.array_equal(got, np.arange(1 << 21, dtype=np.float32) * 3 - 1)
if threads > 1: assert not native_pool._code and native_pool._pools
print("ok", threads)
"""
    env = dict(os.environ, FNX_CPU_THREADS="2")
    done = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, timeout=120, env=env)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["ok", "2"]


@pytest.mark.skipif(not hasattr(os, "sched_setaffinity"), reason="needs CPU affinity (Linux)")
@pytest.mark.parametrize("threads", ["", "2"])
def test_a_process_limited_to_one_cpu(threads):
    """`taskset -c 0` (or a container's cpuset): by default fnx uses the one CPU it may run on, not the machine's
    count; with FNX_CPU_THREADS=2 forced, the worker shares the caller's core and the results stay right (its
    waits and the caller's yield, so each hand-off does not wait for a time slice)."""
    import subprocess
    import sys
    program = """
import numpy as np
import fnx, fnx.numpy as jnp
x = np.random.default_rng(0).standard_normal(1 << 21).astype(np.float32)
f = fnx.jit(lambda x: jnp.tanh(x) * 2 + 1)
xa = jnp.asarray(x)
outs = [np.asarray(f(xa)) for _ in range(30)]
for out in outs: np.testing.assert_allclose(out, np.tanh(x) * 2 + 1, rtol=1e-6, atol=1e-6)
print("ok", fnx.backends.cpu_llvm._cpu_device(0).threads)
"""
    cpu = min(os.sched_getaffinity(0))
    env = dict(os.environ, FNX_CPU_THREADS=threads)
    done = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, timeout=300, env=env,
                          preexec_fn=lambda: os.sched_setaffinity(0, {cpu}))
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["ok", threads or "1"]


def test_the_threads_take_every_chunk_once_from_the_queue(pool):
    """A thread-split loop runs as CHUNKS_PER_THREAD chunks a thread that the caller and the workers take from one
    queue: the chunks tile the loop (an odd length: the last is short), the queue is empty after each call, and
    every call's result is numpy's."""
    from fnx.lower.chain import CHUNKS_PER_THREAD
    x = np.random.default_rng(3).standard_normal((1 << 21) + 7).astype(np.float32)
    f = _threaded(lambda x: jnp.sin(x) * 3 - 1, jnp.asarray(x))
    exe = f.lower(jnp.asarray(x)).executable
    [chunks] = [item.dims for item in exe.items if len(item.dims) > 1]
    assert len(chunks) == exe.threads * CHUNKS_PER_THREAD and len({hi - lo for lo, hi in chunks[:-1]}) == 1
    assert chunks[0][0] == 0 and all(a[1] == b[0] for a, b in zip(chunks, chunks[1:]))
    want = np.sin(x.astype(np.float64)) * 3 - 1
    for _ in range(10):
        np.testing.assert_allclose(np.asarray(f(jnp.asarray(x))), want, rtol=1e-5, atol=1e-5)
        if pool.queue[1] == len(chunks): assert pool.queue[0] >= pool.queue[1]  # (taken natively: all of it)
