"""The opencl backend beyond the op suite (which every device-parametrized test runs on it): copies between cpu and
opencl, the generated OpenCL C, a training step equal to cpu's, 16-bit floats, empty and large arrays, and the
errors of mixing devices. Skipped, with the reason, only where no OpenCL device exists (CI requires one)."""
import numpy as np
import pytest

import fnx
import fnx.numpy as jnp
from fnx.backends.opencl import _cl_devices

pytestmark = pytest.mark.skipif(not _cl_devices(), reason="no OpenCL device (apt-get install pocl-opencl-icd; "
                                                          "pip install 'fnx[opencl]')")


def test_device_put_between_cpu_and_opencl():
    host = np.arange(24, dtype=np.float32).reshape(4, 6)
    on_cl = fnx.device_put(jnp.asarray(host), "opencl:0")
    assert on_cl.device.platform == "opencl"
    np.testing.assert_array_equal(np.asarray(on_cl), host)
    back = fnx.device_put(on_cl * 2, "cpu:0")
    assert back.device.platform == "cpu"
    np.testing.assert_array_equal(np.asarray(back), host * 2)
    with pytest.raises(ValueError, match="different devices"):
        fnx.jit(lambda a, b: a + b)(on_cl, jnp.asarray(host))


def test_generated_source_is_opencl_c():
    x = fnx.device_put(jnp.ones((8, 8)), "opencl:0")
    text = fnx.jit(lambda x: jnp.exp(x) @ x).lower(x).as_text("source")
    assert "__kernel void" in text and "__global float*" in text
    assert "get_group_id(0)" in text  # (the work items of a group walk the output's columns together)
    wide = fnx.device_put(jnp.ones((4, 256)), "opencl:0")
    total = fnx.jit(lambda x: jnp.exp(x).sum()).lower(wide).as_text("source")
    assert "barrier(CLK_LOCAL_MEM_FENCE)" in total and "__local float" in total  # (the group splits the sum)
    elementwise = fnx.jit(lambda x: jnp.exp(x) * 2).lower(x).as_text("source")
    assert "get_global_id(0)" in elementwise and "barrier" not in elementwise


def test_training_step_equals_cpu():
    rng = np.random.default_rng(0)
    w1, w2 = rng.standard_normal((16, 32)).astype(np.float32) * 0.1, rng.standard_normal((32, 4)).astype(
        np.float32) * 0.1
    x, y = rng.standard_normal((64, 16)).astype(np.float32), rng.integers(0, 4, 64).astype(np.int32)

    def loss(p, x, y):
        logits = jnp.tanh(x @ p["w1"]) @ p["w2"]
        return -jnp.mean(jnp.sum(fnx.nn.log_softmax(logits) * fnx.nn.one_hot(y, 4), axis=-1))
    step = fnx.jit(lambda p, x, y: fnx.tree_util.tree_map(lambda a, g: a - 0.5 * g, p, fnx.grad(loss)(p, x, y)))
    results = {}
    for device in ("cpu:0", "opencl:0"):
        p = fnx.device_put({"w1": w1, "w2": w2}, device)
        xs, ys = fnx.device_put(x, device), fnx.device_put(y, device)
        for _ in range(5): p = step(p, xs, ys)
        results[device] = (float(loss(p, xs, ys)), np.asarray(p["w1"]))
    assert results["opencl:0"][0] < float(loss({"w1": w1, "w2": w2}, x, y))
    np.testing.assert_allclose(results["opencl:0"][0], results["cpu:0"][0], rtol=1e-5)
    np.testing.assert_allclose(results["opencl:0"][1], results["cpu:0"][1], rtol=1e-4, atol=1e-6)


def test_float16_empty_and_large_arrays():
    with fnx.default_device("opencl"):
        h = jnp.asarray(np.array([1.5, -2.25, 65504, 6e-8, np.nan], np.float16))
        np.testing.assert_array_equal(np.asarray(h * 2), np.array([3, -4.5, np.inf, 1.2e-7, np.nan], np.float16))
        assert np.asarray(jnp.zeros((0, 3)) + 1).shape == (0, 3)
        big = jnp.ones(1 << 20)
        assert float(jnp.sum(big)) == float(1 << 20)
        assert float(jnp.mean(jnp.arange(1 << 16, dtype=jnp.float32))) == pytest.approx((1 << 16) / 2 - 0.5)


def test_memory_of_dead_buffers_is_reused_in_queue_order():
    """A dead buffer's cl.Buffer serves the next allocation of its size; kernels queued before still see their own
    data (the queue is in order), so chained calls that recycle memory give numpy's values."""
    from fnx.backends.device import get_device
    allocator = get_device("opencl:0").allocator
    first = allocator.alloc(fnx.dtypes.float32, 1000)
    handle = first.handle
    del first
    again = allocator.alloc(fnx.dtypes.float32, 1000)
    assert again.handle is handle
    x = np.random.default_rng(2).standard_normal(100_000).astype(np.float32)
    f = fnx.jit(lambda v: v * 2 + 1)
    value, expected = fnx.device_put(jnp.asarray(x), "opencl:0"), x
    for _ in range(5):  # (every intermediate dies and is recycled while later kernels are queued)
        value, expected = f(value), expected * np.float32(2) + np.float32(1)
    np.testing.assert_array_equal(np.asarray(value), expected)


def test_programs_are_freed_with_their_executables():
    """A built program lives while an executable uses it: the device kept every program it ever built (about a
    megabyte each on PoCL), and the test suite's workers grew past the machine's memory."""
    import gc
    import weakref
    x = np.ones(16, np.float32)
    device = fnx.devices("opencl")[0]
    before = set(device._built.keys())
    with fnx.default_device("opencl"):
        for k in range(5):
            np.testing.assert_allclose(np.asarray(fnx.jit(lambda a, k=k: a * (k + 0.5) + k)(x)), x * (k + 0.5) + k)
    built_here = [weakref.ref(p) for key, p in device._built.items() if key not in before]
    assert built_here
    fnx.clear_caches()
    gc.collect()
    assert not [r for r in built_here if r() is not None]
    with fnx.default_device("opencl"):  # and a program built again after its executable was dropped still runs
        np.testing.assert_allclose(np.asarray(fnx.jit(lambda a: a * 0.5)(x)), x * 0.5)


_BUILDS = """
import glob, os, sys, tempfile
import numpy as np
import fnx, fnx.numpy as jnp
import threading
from fnx.backends import opencl
asking = [threading.Thread(target=opencl._cl_devices) for _ in range(4)]  # (threads finding the devices at once)
for t in asking: t.start()
for t in asking: t.join()
assert len(opencl._pocl_slot) <= 1, opencl._pocl_slot  # one directory a process
x = fnx.device_put(jnp.arange(16.0), "opencl:0")
for k in range(int(sys.argv[1])):  # distinct programs, the same in each process: PoCL builds each one
    np.testing.assert_allclose(np.asarray(fnx.jit(lambda x: jnp.sin(x) * k + 1)(x)), np.sin(np.arange(16.0)) * k + 1,
                               rtol=1e-5, atol=1e-5)
slot = os.path.dirname(os.readlink(f"/proc/self/fd/{opencl._pocl_slot[0]}")) if opencl._pocl_slot else "-"
own = [d for d in glob.glob(os.path.join(tempfile.gettempdir(), "fnx-pocl-*")) if os.listdir(d)]
print(slot, len(own), os.environ.get("POCL_CACHE_DIR"))
"""


def test_processes_building_the_same_programs_at_once_keep_apart(tmp_path):
    """PoCL's kernel cache is one directory per user, unsafe between processes building the same source at once (a
    segfault or a failed build in one of four runs of three such processes). Each fnx process takes a directory
    of fnx's cache that no other live process holds (`pocl/<n>`, locked), which the next process finds warm;
    without fnx's cache, one of its own, removed at exit; the environment its children inherit is left as it
    was; a directory the user chose is used as it is."""
    import os
    import subprocess
    import sys
    cache = tmp_path / "cache"
    env = dict(os.environ, FNX_CACHE_DIR=str(cache), TMPDIR=str(tmp_path))
    env.pop("POCL_CACHE_DIR", None)

    def run(programs, **extra):
        return subprocess.Popen([sys.executable, "-c", _BUILDS, str(programs)], env=dict(env, **extra),
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

    def result(process):
        out, err = process.communicate(timeout=600)
        assert process.returncode == 0, err
        return out.split()
    at_once = [result(p) for p in [run(3) for _ in range(3)]]
    assert sorted(slot for slot, _, _ in at_once) == [str(cache / "pocl" / str(n)) for n in range(3)], at_once
    assert all(rest == ["0", "None"] for _, *rest in at_once), at_once  # no directory of its own; variable unset
    assert all(len(os.listdir(slot)) > 1 for slot, _, _ in at_once)  # (PoCL's files beside the lock)
    from fnx.backends.opencl import SOURCE_MAGIC
    binaries = [f.read_bytes() for f in cache.rglob("*.clbin")]  # on PoCL a program is cached as its source
    assert len(binaries) == 3 and all(SOURCE_MAGIC in b and b"__kernel" in b for b in binaries)
    assert result(run(1)) == [str(cache / "pocl" / "0"), "0", "None"]  # the first directory is free again
    assert result(run(1, FNX_CACHE_DIR="")) == ["-", "1", "None"]  # its own directory, built in ...
    assert not list(tmp_path.glob("fnx-pocl-*"))  # ... and removed at exit
    chosen = tmp_path / "chosen"
    assert result(run(1, POCL_CACHE_DIR=str(chosen))) == ["-", "0", str(chosen)] and list(chosen.iterdir())
