"""The cpu runtime: host memory reused across calls (HostPool), donated arguments written in place, asynchronous
dispatch on one ordered worker per device, and the checks the fast dispatch path must keep. Results are
compared with numpy."""
import ctypes
import gc
import os
import subprocess
import sys
import threading
import warnings

import numpy as np
import pytest

import fnx
import fnx.numpy as jnp
from fnx.backends.device import ALIGN, Buffer, HostPool
from fnx.backends.device import _free as device_free
from fnx.lower.memory import donation_aliases

F32 = np.dtype(np.float32)


def _executable(jitted, *args):
    return jitted.lower(*args).executable


def _queued(monkeypatch, jitted, *args):
    """Make the executable behind `jitted(*args)` queue its calls even when small (async is for large work)."""
    executable = _executable(jitted, *args)
    monkeypatch.setattr(executable, "queue_when_idle", True)
    return executable


# ---- the pool ----

def test_pool_evicts_a_free_block_behind_one_in_use():
    """Eviction removed entries with list.remove, which compares entries (lists holding arrays) with == and raised
    once the free block was not the first of its size (10 large-reduction tests hit it)."""
    pool = HostPool(per_size=4, max_bytes=3 * 4000)
    busy, _ = pool.array(F32, 1000)
    free_address = pool.array(F32, 1000)[1]  # dropped at once: the second block of this size is free
    assert len(pool.blocks[4000]) == 2
    pool.array(F32, 1500)  # 6000 more bytes than the cap allows: the free block goes
    assert [e[2] for e in pool.blocks[4000]] != [] and free_address not in [e[2] for e in pool.blocks[4000]]
    assert busy.base is not None and pool.kept_bytes <= pool.max_bytes

def test_large_blocks_start_at_different_offsets_in_a_page():
    """Blocks of one size all came out of mmap at one page offset, so a kernel streaming from one into another had
    loads and stores a multiple of 4 KiB apart (4K aliasing: gelu from one pool block into another ran 1.4x
    slower). Large blocks are staggered; every block stays ALIGN-aligned."""
    pool = HostPool()
    held = [pool.array(F32, 1 << 20) for _ in range(4)]
    offsets = {address % 4096 for _, address in held}
    assert len(offsets) == 4 and all(address % ALIGN == 0 for _, address in held)
    for host, address in held:
        assert host.ctypes.data == address and host.size == 1 << 20
        lo, hi = host.base.ctypes.data, host.base.ctypes.data + host.base.nbytes
        assert lo <= address and address + host.nbytes <= hi

def test_pool_hands_a_block_back_only_when_nothing_sees_it():
    pool = HostPool()
    host, address = pool.array(F32, 1000)
    assert address % ALIGN == 0 and not host.flags.writeable
    del host
    again, same = pool.array(F32, 1000)
    assert same == address  # free: reused
    view = again.reshape(10, 100)  # a user's view of an output keeps the block busy
    del again
    other, elsewhere = pool.array(F32, 1000)
    assert elsewhere != address
    del view
    assert pool.array(F32, 1000)[1] in (address, elsewhere)


def test_a_pool_whose_blocks_are_all_held_looks_at_a_few_and_never_hands_a_held_one_out():
    """A loop that keeps every result (`losses.append(loss)`) holds all of a size's blocks: a request looks at
    POOL_SCAN of them, from where the last free one was, then makes a block. No block anyone holds is handed out
    again, and once the results are dropped the kept blocks are found again."""
    from fnx.backends import device
    pool = HostPool(per_size=8)
    held = []
    for i in range(40):
        host, address = pool.array(F32, 16)
        assert address not in [a for _, a in held]  # (never a block in use)
        held.append((host, address))
    assert len(pool.blocks[64]) == 8
    looked = []
    original = device._free
    try:
        device._free = lambda entry: looked.append(entry) or original(entry)
        pool.array(F32, 16)
    finally:
        device._free = original
    assert len(looked) == device.POOL_SCAN
    kept = {e[2] for e in pool.blocks[64]}
    del held, host
    assert {pool.array(F32, 16)[1] for _ in range(3)} <= kept


def test_new_python_numbers_in_eager_ops_keep_no_pool_block():
    """Eager `x * v` keeps v's buffer in a cache (jit._number_buffer), as scalar constants are kept: such tiny
    copies are arrays of their own (device.TINY_BYTES). In the pool, those of 300 new values held every 4-byte
    block, so each scalar result after them made a block the pool could not keep. Values are numpy's."""
    from fnx.backends.device import TINY_BYTES, get_device
    memory = get_device("cpu:0").memory
    x = jnp.asarray(np.arange(8, dtype=np.float32))
    before = sum(not device_free(e) for e in memory.blocks.get(4, ()))
    for i in range(300):
        v = i / 7 + 0.25
        np.testing.assert_array_equal(np.asarray(x * v), np.arange(8, dtype=np.float32) * np.float32(v))
        assert float(x.sum() > v) == float(28 > np.float32(v))
    assert sum(not device_free(e) for e in memory.blocks.get(4, ())) <= before
    assert TINY_BYTES >= 16  # (a complex128 scalar)
    pool = HostPool(per_size=2)
    held = [pool.array(F32, 1) for _ in range(5)]  # beyond the kept blocks: arrays of their own, distinct
    assert len(pool.blocks[4]) == 2 and len({a for _, a in held}) == 5


@pytest.mark.parametrize("dtype", ["bool", "int8", "uint8", "int32", "int64", "uint32", "float16", "bfloat16",
                                   "float32", "float64", "complex64", "complex128"])
def test_a_scalar_buffer_holds_what_numpy_holds(dtype):
    """Allocator.scalar (an eager op's new Python number): the bits numpy stores for the value, at an address
    aligned for its loads (kernels load it `align itemsize`), read-only, for every dtype a scalar can have, on the cpu and the base Allocator path."""
    from fnx import dtypes
    from fnx.backends import device
    from fnx.backends.device import get_device
    from fnx.uop import scalar_of
    dt = dtypes.from_numpy(np.dtype(dtype) if dtype != "bfloat16" else dtypes.bfloat16.np)
    allocator = get_device("cpu:0").allocator
    for value in (0, 1, -1, 3, 2.5, -0.0, 1e-3, 300, True, 1 + 2j):
        if isinstance(value, complex) and not dt.is_complex: continue
        v = scalar_of(value, dt)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            want = np.array(v, dt.np).reshape(1)
            got = allocator.scalar(v, dt)
            base = device.Allocator.scalar(allocator, v, dt)
        for buf in (got, base):
            assert buf.size == 1 and buf.dtype == dt and buf.ptr % dt.itemsize == 0
            assert buf.host.tobytes() == want.tobytes(), (dtype, value)
            assert not buf.host.flags.writeable


def test_pool_is_bounded():
    pool = HostPool(per_size=2, max_bytes=4 * 4000)
    held = [pool.array(F32, 1000) for _ in range(5)]  # 5 in use at once: only 2 of this size are kept
    assert len(pool.blocks[4000]) == 2 and pool.kept_bytes == 8000
    held += [pool.array(F32, 500 + i) for i in range(4)]  # other sizes until the byte cap
    assert pool.kept_bytes <= pool.max_bytes
    del held
    gc.collect()
    assert pool.in_use() == 0
    pool.array(F32, 3000)  # a new size evicts free blocks instead of growing past the cap
    assert pool.kept_bytes <= pool.max_bytes


def test_outputs_reuse_memory_across_calls_but_never_memory_a_user_holds():
    f = fnx.jit(lambda x: x * 1.5 + 0.1)
    x_np = np.random.default_rng(0).standard_normal(1 << 16).astype(np.float32)
    x = jnp.asarray(x_np)
    first = f(x)._buffer.ptr
    assert f(x)._buffer.ptr == first  # the previous result was dropped: its block comes back
    held = [np.asarray(f(x * float(i))) for i in range(6)]  # views keep their blocks from being reused
    assert len({h.ctypes.data for h in held}) == len(held)
    for i, h in enumerate(held):
        # (x * 1.5 + 0.1 is one fused multiply-add, as XLA's: near 0 it differs from numpy's two roundings)
        np.testing.assert_allclose(h, x_np * float(i) * 1.5 + 0.1, rtol=1e-6, atol=1e-6 * (i + 1))


def test_intermediates_go_back_to_the_pool_after_the_call():
    def chain(x):
        for _ in range(4):
            x = x - x.mean(axis=-1, keepdims=True)
            x = x / (jnp.sqrt((x * x).mean(axis=-1, keepdims=True)) + 1.0)
        return x
    x = np.random.default_rng(1).standard_normal((64, 256)).astype(np.float32)
    f = fnx.jit(chain)
    executable = _executable(f, x)
    assert executable.slot_bytes  # the memory plan has slots to take from the pool
    before = executable.memory.in_use()
    out = f(x)
    assert executable.memory.in_use() == before + 1  # only the output stays in use
    want = x.astype(np.float64)
    for _ in range(4):
        want = want - want.mean(-1, keepdims=True)
        want = want / (np.sqrt((want * want).mean(-1, keepdims=True)) + 1.0)
    np.testing.assert_allclose(np.asarray(out), want, rtol=1e-4, atol=1e-5)


# ---- donation ----

def _sgd_momentum(params, velocity, grads):
    velocity = {k: 0.9 * velocity[k] + grads[k] for k in params}
    return {k: params[k] - 0.1 * velocity[k] for k in params}, velocity


def _tree(seed):
    rng = np.random.default_rng(seed)
    return {"w": rng.standard_normal((64, 32)).astype(np.float32), "b": rng.standard_normal(32).astype(np.float32)}


def test_donated_update_matches_and_writes_into_the_donated_memory():
    params, velocity, grads = _tree(0), _tree(1), _tree(2)
    plain_params, plain_velocity = fnx.jit(_sgd_momentum)(params, velocity, grads)
    donated = fnx.jit(_sgd_momentum, donate_argnums=(0, 1))
    p = {k: jnp.asarray(v) for k, v in params.items()}
    v = {k: jnp.asarray(v) for k, v in velocity.items()}
    addresses = {k: (p[k]._buffer.ptr, v[k]._buffer.ptr) for k in p}
    new_p, new_v = donated(p, v, grads)
    for k in params:
        np.testing.assert_allclose(np.asarray(new_p[k]), np.asarray(plain_params[k]), rtol=1e-6)
        np.testing.assert_allclose(np.asarray(new_v[k]), np.asarray(plain_velocity[k]), rtol=1e-6)
        np.testing.assert_allclose(np.asarray(new_v[k]), 0.9 * velocity[k] + grads[k], rtol=1e-6, atol=1e-6)
        assert (new_p[k]._buffer.ptr, new_v[k]._buffer.ptr) == addresses[k]
        assert p[k].is_deleted() and v[k].is_deleted()
    with pytest.raises(RuntimeError, match="deleted.*donated"):
        np.asarray(p["w"])
    with pytest.raises(RuntimeError, match="deleted.*donated"):
        p["b"] + 1.0
    with pytest.raises(RuntimeError, match="deleted.*donated"):
        donated(p, v, grads)
    for _ in range(3):  # steps feed each other through donated memory
        new_p, new_v = donated(new_p, new_v, grads)
    want_p, want_v = params, velocity
    for _ in range(4):
        want_p, want_v = _sgd_momentum(want_p, want_v, grads)
    for k in params:
        np.testing.assert_allclose(np.asarray(new_p[k]), want_p[k], rtol=1e-5, atol=1e-6)


def test_donation_is_skipped_while_a_numpy_view_or_another_argument_shares_the_memory():
    f = fnx.jit(lambda x, y: x * 2.0 + y, donate_argnums=0)
    x_np = np.arange(8, dtype=np.float32)
    x = jnp.asarray(x_np) * 1.0
    view = np.asarray(x)
    out = f(x, x)
    assert not x.is_deleted() and out._buffer.ptr != x._buffer.ptr
    np.testing.assert_array_equal(view, x_np)  # the view still shows x, not the output
    np.testing.assert_array_equal(np.asarray(out), x_np * 3)
    del view
    out = f(x, x)  # passed twice: writing one would change the other
    assert not x.is_deleted()
    np.testing.assert_array_equal(np.asarray(out), x_np * 3)


def test_donating_a_reshape_or_an_identity_result_keeps_the_array_it_came_from():
    """A reshape (eager or jitted) and jit(lambda x: x) return their input's memory; donating the result leaves
    the original valid, and donating the original leaves the result valid, as in JAX, where they are distinct
    arrays. (They shared one Buffer, and the donation deleted both.)"""
    double = fnx.jit(lambda x: x * 2.0, donate_argnums=0)
    same = fnx.jit(lambda x: x)
    x_np = np.arange(6, dtype=np.float32)
    for make in (lambda x: x.reshape(2, 3), lambda x: fnx.jit(lambda x: x.reshape(3, 2))(x), same):
        x = jnp.asarray(x_np) * 1.0
        view = make(x)
        out = double(view)
        np.testing.assert_array_equal(np.asarray(out).reshape(-1), x_np * 2)
        np.testing.assert_array_equal(np.asarray(x), x_np)
        np.testing.assert_array_equal(np.asarray(view).reshape(-1), x_np)
        x = jnp.asarray(x_np) * 1.0
        view = make(x)
        out = double(x)
        np.testing.assert_array_equal(np.asarray(view).reshape(-1), x_np)
        np.testing.assert_array_equal(np.asarray(out), x_np * 2)
    x = jnp.asarray(x_np) * 1.0
    double(x)
    assert x.is_deleted()  # (nothing else shares it: donated)


@pytest.mark.parametrize("fun", [
    lambda x: x[::-1] + 1.0,                            # reads another element than it writes
    lambda x: x.T * 2.0,                                 # a transpose reads across the output
    lambda x: jnp.concatenate([x[1:], x[:1]]) - x,
    lambda x: (x - x.mean(axis=0)) * x.sum(),            # reductions read x before the in-place kernel
    lambda x: jnp.cumsum(x, axis=0),
    lambda x: x @ x,
], ids=["flip", "transpose", "roll", "reductions", "cumsum", "matmul"])
def test_donation_never_changes_results(fun):
    x_np = np.random.default_rng(3).standard_normal((16, 16)).astype(np.float32)
    want = np.asarray(fnx.jit(fun)(x_np))
    f = fnx.jit(fun, donate_argnums=0)
    x = jnp.asarray(x_np) * 1.0
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # some of these cannot use the donation
        out = f(x)
    np.testing.assert_allclose(np.asarray(out), want, rtol=1e-5, atol=1e-5)


def test_donation_rule_on_schedules():
    """In place only where each element is read where it is written: elementwise yes, a flip or a transpose no."""
    x = np.ones((8, 8), np.float32)
    for fun, usable in [(lambda x: x * 2.0 + 1.0, True), (lambda x: x[::-1] * 2.0, False),
                        (lambda x: x.T + 1.0, False), (lambda x: jnp.maximum(x, 0.0) * x, True)]:
        lowering = fnx.jit(fun).lower(x).executable.lowering
        steps = [k for k, _ in lowering.kernels]
        assert bool(donation_aliases(lowering.schedule, steps, (0,))) == usable
    # a vector loop with a masked remainder (1000 floats in vectors of 16) stores through a gate: still in place
    # (it warned "not usable" before), and a flip stays out
    y = np.arange(1000, dtype=np.float32)
    for fun, usable in [(lambda x: x * 2.0 + 1.0, True), (lambda x: x[::-1] * 2.0, False)]:
        lowering = fnx.jit(fun).lower(y).executable.lowering
        assert bool(donation_aliases(lowering.schedule, [k for k, _ in lowering.kernels], (0,))) == usable
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        donated = jnp.asarray(y) * 1.0
        out = fnx.jit(lambda x: x * 2.0 + 1.0, donate_argnums=0)(donated)
    np.testing.assert_array_equal(np.asarray(out), y * 2 + 1)
    assert donated.is_deleted()


def test_unusable_donation_warns_and_keeps_the_argument():
    f = fnx.jit(lambda x: x.sum(), donate_argnums=0)
    x = jnp.asarray(np.arange(4, dtype=np.float32)) * 1.0
    with pytest.warns(UserWarning, match="donated buffers were not usable: float32\\[4\\]"):
        assert float(f(x)) == 6.0
    assert not x.is_deleted()


# ---- asynchronous dispatch ----

def test_queued_calls_feed_each_other_and_reads_wait(monkeypatch):
    f = fnx.jit(lambda x: x * 0.5 + 1.0)
    x_np = np.random.default_rng(4).standard_normal(4096).astype(np.float32)
    _queued(monkeypatch, f, x_np)
    x, want = jnp.asarray(x_np), x_np
    results = []
    for i in range(200):
        x = f(x)
        want = want * np.float32(0.5) + np.float32(1.0)
        if i % 50 == 0:
            assert x._buffer.ready is not None  # returned before anyone waited for it
            results.append((x, want.copy()))
        if i % 70 == 0:
            x = jnp.sin(x)  # an eager op (inline) on a queued result keeps the order
            want = np.sin(want)
    for value, expected in results:
        np.testing.assert_allclose(np.asarray(value), expected, rtol=1e-5)
    np.testing.assert_allclose(float(x.sum()), want.sum(), rtol=1e-4)
    assert x.block_until_ready() is x and x._buffer.ready is None


def test_a_queued_call_keeps_its_inputs_alive(monkeypatch):
    f = fnx.jit(lambda x: x + 1.0)
    _queued(monkeypatch, f, np.zeros(1 << 16, np.float32))
    outs = []
    for i in range(20):
        x = jnp.asarray(np.full(1 << 16, float(i), np.float32))
        outs.append(f(x))
        del x
        gc.collect()
    for i, out in enumerate(outs):
        np.testing.assert_array_equal(np.asarray(out), np.full(1 << 16, i + 1.0, np.float32))


def test_an_error_in_queued_work_surfaces_at_the_next_read(monkeypatch):
    f = fnx.jit(lambda x: x * 3.0)
    x = np.arange(16, dtype=np.float32)
    executable = _queued(monkeypatch, f, x)

    def broken(*args):
        raise ValueError("kernel failed")
    good = executable.launches
    monkeypatch.setattr(executable, "launches", [(k, broken, a, w, c) for k, _, a, w, c in good])
    failed = f(x)  # returns: the error is raised by whoever reads the result, or a result computed from it
    later = fnx.jit(lambda y: y + 1.0)(failed)
    with pytest.raises(ValueError, match="kernel failed"):
        np.asarray(failed)
    with pytest.raises(ValueError, match="kernel failed"):
        later.block_until_ready()
    monkeypatch.setattr(executable, "launches", good)
    np.testing.assert_array_equal(np.asarray(f(x)), x * 3)  # the stream keeps working


def test_control_flow_after_queued_work(monkeypatch):
    f = fnx.jit(lambda x: x * 2.0)
    x = np.ones(64, np.float32)
    _queued(monkeypatch, f, x)
    y = f(f(x))
    g = fnx.jit(lambda y: fnx.lax.while_loop(lambda c: c[1] < 3, lambda c: (c[0] + y, c[1] + 1), (y, 0))[0])
    np.testing.assert_array_equal(np.asarray(g(y)), np.full(64, 16.0, np.float32))


def test_two_threads_dispatching_at_once(monkeypatch):
    f = fnx.jit(lambda x: x * 0.5 + 1.0)
    _queued(monkeypatch, f, np.zeros(1024, np.float32))
    finals, errors = {}, []

    def work(seed):
        try:
            x_np = np.random.default_rng(seed).standard_normal(1024).astype(np.float32)
            x, want = jnp.asarray(x_np), x_np
            for _ in range(100):
                x, want = f(x), want * np.float32(0.5) + np.float32(1.0)
            finals[seed] = (np.asarray(x), want)
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(e)
    threads = [threading.Thread(target=work, args=(s,)) for s in range(2)]
    for t in threads: t.start()
    for t in threads: t.join(timeout=120)
    assert not errors and len(finals) == 2
    for got, want in finals.values():
        np.testing.assert_allclose(got, want, rtol=1e-5)


SCRIPT = """
import numpy as np, fnx, fnx.numpy as jnp
from fnx.backends import cpu_llvm
f = fnx.jit(lambda x: x * 0.5 + 1.0)
x_np = np.random.default_rng(0).standard_normal((512, 1024)).astype(np.float32)
f.lower(x_np).executable.queue_when_idle = True
x, want = jnp.asarray(x_np), x_np
for _ in range(30):
    x, want = f(x), want * np.float32(0.5) + np.float32(1.0)
np.testing.assert_allclose(np.asarray(x), want, rtol=1e-5)
print("ok", fnx.jit(lambda x: x.sum()).lower(x_np).executable.threads)
"""


def test_one_cpu_thread():
    env = dict(os.environ, FNX_CPU_THREADS="1")
    done = subprocess.run([sys.executable, "-c", SCRIPT], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["ok", "1"]


# ---- the checks the fast path keeps ----

def test_fast_path_still_checks_arguments():
    f = fnx.jit(lambda x, y: x + y)
    a, b = jnp.ones(3), jnp.ones(3)
    np.testing.assert_array_equal(np.asarray(f(a, b)), np.full(3, 2.0))
    with pytest.raises((TypeError, ValueError), match="3.*4|4.*3"):
        f(a, jnp.ones(4))
    assert np.asarray(f(a, jnp.ones(3, jnp.int32))).dtype == np.float32  # a new dtype retraces
    assert f.trace_count() == 2


def test_buffers_are_read_only_on_the_host():
    out = fnx.jit(lambda x: x + 1.0)(np.zeros(4, np.float32))
    with pytest.raises(ValueError, match="read-only"):
        np.asarray(out)[0] = 5.0
    assert not Buffer.from_numpy("cpu:0", np.zeros(3)).host.flags.writeable


FORK_SCRIPT = """
import os, numpy as np, fnx, fnx.numpy as jnp
f = fnx.jit(lambda x: x + 1.0)
x = np.zeros(256, np.float32)
f.lower(x).executable.queue_when_idle = True
y = f(f(x))
pid = os.fork()  # waits for the queued calls; the child starts with an empty queue and a new worker
if pid == 0:  # ... and its own LLVM thread: a function first compiled in the child compiles and runs
    g = fnx.jit(lambda x: jnp.exp(x) * 2)
    os._exit(0 if np.asarray(f(y))[0] == 3.0 and np.asarray(g(y))[0] == np.float32(np.exp(2.0) * 2) else 1)
_, status = os.waitpid(pid, 0)
print("ok" if status == 0 and np.asarray(y)[0] == 2.0 else "bad", status)
"""


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_fork_after_queued_calls():
    done = subprocess.run([sys.executable, "-c", FORK_SCRIPT], capture_output=True, text=True, timeout=300)
    assert done.stdout.split()[:1] == ["ok"], done.stdout + done.stderr


def test_kernels_compile_in_several_modules_while_lowering_runs():
    """The LLVM thread compiles modules of finished kernels while later ones are lowered: a program with many
    kernels gets several modules, every kernel is found in one, and the assembly covers all of them. One engine
    links the modules' object code (an engine per module cost ~1.7 ms each)."""
    from assertions import mlp_step
    rng = np.random.default_rng(0)
    p = {"w1": rng.standard_normal((64, 96)).astype(np.float32) * 0.1, "b1": np.zeros(96, np.float32),
         "w2": rng.standard_normal((96, 10)).astype(np.float32) * 0.1, "b2": np.zeros(10, np.float32)}
    x, onehot = rng.standard_normal((32, 64)).astype(np.float32), np.eye(10, dtype=np.float32)[rng.integers(0, 10, 32)]
    lowered = fnx.jit(mlp_step).lower(p, x, onehot)
    exe = lowered.executable
    assert len(exe.modules) > 1 and len(exe.engines) == 1
    names = [k.name for k, lines in exe.lowering.kernels if lines is not None]
    assert all(f"define void @{n}(" in lowered.as_text("llvm") for n in names)
    asm = lowered.as_text("asm")
    assert all(n in asm for n in names)
    with fnx.default_device("interp"):
        want = fnx.jit(mlp_step)(p, x, onehot)
    for g, w in zip(fnx.tree_util.tree_leaves(lowered.compile()(p, x, onehot)), fnx.tree_util.tree_leaves(want)):
        np.testing.assert_allclose(np.asarray(g), np.asarray(w), rtol=1e-4, atol=1e-5)


def test_small_calls_take_the_lean_path_and_keep_earlier_results():
    """A small single-output call runs through the executable's lean path (jit's fast path); results handed out
    earlier keep their values (the pool never reuses a block an Array still holds), and an input still being
    computed sends the call down the general path."""
    f = fnx.jit(lambda x, y: x * 2 + y)
    x, y = jnp.arange(5, dtype=jnp.float32), jnp.ones(5)
    lowered = f.lower(x, y)
    assert lowered.fast is not None
    outs = [f(x + i, y) for i in range(20)]
    for i, out in enumerate(outs):
        np.testing.assert_array_equal(np.asarray(out), (np.arange(5) + i) * 2 + 1)
    assert fnx.jit(lambda x: (x, x + 1)).lower(x).fast is None  # two outputs: the general path
    g = fnx.jit(lambda x: x + 1.0)
    big = np.zeros(1 << 20, np.float32)
    g.lower(big).executable.queue_when_idle = True  # queued: its result is pending when the next call reads it
    pending = g(big)
    np.testing.assert_array_equal(np.asarray(f(pending[:5], y)), np.full(5, 3.0))


def test_programs_compiled_on_several_llvm_threads_at_once():
    """Modules compile on several LLVM threads at once (each in its own LLVM context, outside llvmlite's lock):
    twelve different programs jitted from four threads at once all compute what numpy does, and so do the
    modules the compiler is handed directly, all at once."""
    from fnx.backends import cpu_llvm
    rng = np.random.default_rng(7)
    x_np = rng.standard_normal((24, 40)).astype(np.float32)
    scales = rng.uniform(0.5, 2.0, 12).astype(np.float32)  # (new constants each run: new modules, not cache hits)
    results, errors = {}, []

    def work(ks):
        try:
            for k in ks:
                f = fnx.jit(lambda x, s=float(scales[k]): jnp.tanh(x * s) @ x.T + jnp.exp(-x).sum())
                results[k] = np.asarray(f(jnp.asarray(x_np)))
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(e)
    threads = [threading.Thread(target=work, args=(range(i, 12, 4),)) for i in range(4)]
    for t in threads: t.start()
    for t in threads: t.join(timeout=300)
    assert not errors and sorted(results) == list(range(12))
    x64 = x_np.astype(np.float64)
    for k, got in results.items():
        want = np.tanh(x64 * scales[k]) @ x64.T + np.exp(-x64).sum()
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-3)

    compiler = cpu_llvm._compiler()
    sources = [f"define i64 @f{i}(i64 %x) {{\n  %y = mul i64 %x, {i + 3 + int(rng.integers(1 << 20))}\n"
               f"  ret i64 %y\n}}\n" for i in range(8)]
    jobs = [compiler.submit(s) for s in sources]
    for source, job in zip(sources, jobs):
        engine, _ = job.result()
        name = source.split("@")[1].split("(")[0]
        multiply = int(source.split("mul i64 %x, ")[1].split("\n")[0])
        function = ctypes.CFUNCTYPE(ctypes.c_int64, ctypes.c_int64)(engine.get_function_address(name))
        assert function(5) == 5 * multiply


def _trunc_div(a: np.ndarray, b: int) -> np.ndarray:
    """a / b rounded toward zero, exactly (numpy's // rounds toward minus infinity)."""
    q = np.floor_divide(a, b)
    return np.where((np.remainder(a, b) != 0) & ((a < 0) != (b < 0)), q + 1, q).astype(a.dtype)


@pytest.mark.parametrize("dtype", [np.int8, np.int32, np.int64, np.uint8, np.uint32])
def test_integer_division_by_constants(dtype):
    """A constant divisor other than 0 and -1 divides without the zero/overflow guard, unsigned where the dividend
    is never negative (an index): C-style div and rem, and numpy's floor_divide and remainder, of data with the
    type's extremes and of an iota, against exact integer references."""
    info = np.iinfo(dtype)
    rng = np.random.default_rng(3)
    data = np.concatenate([[info.min, info.min + 1, info.max, 0, 1], rng.integers(info.min, info.max, 300,
                                                                                   endpoint=True)]).astype(dtype)
    divisors = [1, 2, 3, 7, 64, 100] + ([-2, -3, -64] if info.min < 0 else [])
    for c in divisors:
        c = int(np.array(c).astype(dtype))
        got = fnx.jit(lambda x: (fnx.lax.div(x, dtype(c)), fnx.lax.rem(x, dtype(c)), x // dtype(c),
                                 x % dtype(c)))(data)
        q = _trunc_div(data, c)
        want = (q, (data - q * dtype(c)).astype(dtype), np.floor_divide(data, dtype(c)), np.remainder(data, dtype(c)))
        for g, w in zip(got, want): np.testing.assert_array_equal(np.asarray(g), w, err_msg=f"{dtype} by {c}")
    index = fnx.jit(lambda x: (jnp.arange(1000, dtype=jnp.int32) // 7 + x, jnp.arange(1000) % 64 + x))
    assert "udiv" in index.lower(np.int32(1)).as_text("llvm")
    i, j = index(np.int32(1))
    np.testing.assert_array_equal(np.asarray(i), np.arange(1000) // 7 + 1)
    np.testing.assert_array_equal(np.asarray(j), np.arange(1000) % 64 + 1)
