"""Many devices on one host: FNX_CPU_DEVICES=N gives cpu:0..N-1, each with its own memory, stream and share of
the worker threads; device_put copies (a COPY in the graph, a transfer item in the executable); a jitted function
runs on its arguments' device; mixing devices, and devices that do not exist, are clear errors. Every value is
checked against numpy."""
import os
import subprocess
import sys

import numpy as np
import pytest

import fnx
import fnx.numpy as jnp
from fnx.backends.device import Launch, Transfer, get_device
from fnx.config import config


@pytest.fixture
def eight_cpus(monkeypatch):
    """Eight cpu devices in this process (as FNX_CPU_DEVICES=8 gives; the devices past cpu:0 are made on first
    use with one worker thread each)."""
    monkeypatch.setattr(config, "cpu_devices", 8)
    yield fnx.devices("cpu")


def test_devices_lists_every_cpu_device(eight_cpus):
    assert [d.name for d in eight_cpus] == [f"cpu:{i}" for i in range(8)]
    assert [d.id for d in eight_cpus] == list(range(8))
    assert fnx.device_count("cpu") == 8
    assert repr(eight_cpus[3]) == "CpuDevice(id=3)" and eight_cpus[3].platform == "cpu"
    assert get_device("cpu:3") is eight_cpus[3]  # one object per device


def test_device_put_copies_to_another_device(eight_cpus):
    host = np.arange(12, dtype=np.float32).reshape(3, 4)
    x = jnp.asarray(host)
    y = fnx.device_put(x, eight_cpus[5])
    assert y.device is eight_cpus[5] and y.devices() == {eight_cpus[5]} and x.device is eight_cpus[0]
    assert y.sharding.device_set == {eight_cpus[5]}
    np.testing.assert_array_equal(np.asarray(y), host)
    assert y._buffer is not x._buffer and y._buffer.ptr != x._buffer.ptr  # a copy, in the other device's memory
    assert fnx.device_put(y, "cpu:5") is y  # already there
    z = fnx.device_put(host, "cpu:2")  # from the host
    assert z.device.name == "cpu:2" and z.dtype == np.float32
    np.testing.assert_array_equal(np.asarray(z), host)
    tree = fnx.device_put({"a": x, "b": [1.5, host]}, "cpu:7")
    assert {leaf.device.name for leaf in fnx.tree_util.tree_leaves(tree)} == {"cpu:7"}
    assert tree["b"][0].weak_type and float(tree["b"][0]) == 1.5


def test_eager_ops_run_on_their_operands_device(eight_cpus):
    host = np.linspace(-2, 2, 33, dtype=np.float32)
    x = fnx.device_put(host, "cpu:4")
    y = jnp.tanh(x) * 2 + x.sum()
    assert y.device.name == "cpu:4"
    np.testing.assert_allclose(np.asarray(y), np.tanh(host) * 2 + host.sum(), rtol=1e-5, atol=1e-6)


def test_mixing_devices_in_one_op_names_both(eight_cpus):
    x, y = fnx.device_put(jnp.ones(3), "cpu:1"), fnx.device_put(jnp.ones(3), "cpu:6")
    with pytest.raises(ValueError, match=r"cpu:1.*cpu:6"):
        x + y
    with pytest.raises(ValueError, match=r"different devices, cpu:1 and cpu:6"):
        fnx.jit(lambda a, b: a * b)(x, y)


def test_a_device_that_does_not_exist_is_a_clear_error(eight_cpus):
    with pytest.raises(ValueError, match=r"'cpu:8' does not exist: cpu has 8 devices .*FNX_CPU_DEVICES"):
        fnx.device_put(jnp.ones(2), "cpu:8")
    with pytest.raises(ValueError, match=r"unknown device 'tpu:0'"):
        fnx.device_put(jnp.ones(2), "tpu:0")
    with pytest.raises(ValueError, match=r"does not exist"):
        fnx.jit(lambda a: a, device="cpu:99")
    with pytest.raises(ValueError, match=r"does not exist"):
        with fnx.default_device("cpu:-1"):
            pass


def test_jit_runs_on_its_arguments_device(eight_cpus):
    host = np.arange(6, dtype=np.float32)
    f = fnx.jit(lambda a, b: a * b + 1)
    for name in ("cpu:0", "cpu:3", "cpu:7"):
        x = fnx.device_put(host, name)
        out = f(x, 2.0)
        assert out.device.name == name
        np.testing.assert_array_equal(np.asarray(out), host * 2 + 1)
        assert f.lower(x, 2.0).executable.device == name
    assert f.trace_count() == 3  # one compiled executable per device


def test_copy_inside_jit_is_a_transfer_item(eight_cpus):
    host = np.arange(8, dtype=np.float32)

    def f(a):
        b = fnx.device_put(a * 2, "cpu:6")  # computed on the argument's device, then moved
        return b + 1, jnp.exp(b).sum()

    x = fnx.device_put(host, "cpu:2")
    out, total = fnx.jit(f)(x)
    assert out.device.name == "cpu:6" and total.device.name == "cpu:6"
    np.testing.assert_array_equal(np.asarray(out), host * 2 + 1)
    np.testing.assert_allclose(float(total), np.exp(host.astype(np.float64) * 2).sum(), rtol=1e-6)
    exe = fnx.jit(f).lower(x).executable
    transfers = [item for item in exe.items if isinstance(item, Transfer)]
    assert len(transfers) == 1 and (transfers[0].src_device, transfers[0].device) == ("cpu:2", "cpu:6")
    launches = [item for item in exe.items if isinstance(item, Launch)]
    assert [item.device for item in launches][0] == "cpu:2" and all(i.device == "cpu:6" for i in launches[1:])
    assert "copy buffer" in exe.as_text("items") and "(cpu:2) -> buffer" in exe.as_text("items")


def test_eager_device_put_of_a_lazy_graph_and_grad_through_a_copy(eight_cpus):
    host = np.linspace(0.5, 1.5, 5, dtype=np.float32)
    x = fnx.device_put(host, "cpu:1")
    loss = lambda a: (fnx.device_put(jnp.sin(a), "cpu:3") ** 2).sum()  # noqa: E731
    value, grad = fnx.value_and_grad(loss)(x)
    np.testing.assert_allclose(float(value), (np.sin(host.astype(np.float64)) ** 2).sum(), rtol=1e-6)
    np.testing.assert_allclose(np.asarray(grad), 2 * np.sin(host) * np.cos(host), rtol=1e-5)
    assert grad.device.name == "cpu:1"  # the cotangent goes back to the argument's device
    jitted = fnx.jit(fnx.grad(loss))(x)
    np.testing.assert_allclose(np.asarray(jitted), np.asarray(grad), rtol=1e-6)
    assert jitted.device.name == "cpu:1"


def test_each_device_has_its_own_memory_and_stream(eight_cpus):
    a, b = get_device("cpu:1"), get_device("cpu:2")
    assert a.allocator is not b.allocator and a.memory is not b.memory and a.stream is not b.stream
    assert a.threads == max(1, config.cpu_threads // 8)


def test_interp_outputs_land_on_the_copy_device():
    x = fnx.device_put(np.arange(4.0, dtype=np.float32), "interp")
    out = fnx.jit(lambda a: fnx.device_put(a + 1, "cpu:0"))(x)
    assert out.device.name == "cpu:0"
    np.testing.assert_array_equal(np.asarray(out), np.arange(4.0) + 1)


EIGHT = """
import numpy as np, fnx, fnx.numpy as jnp
devs = fnx.devices()
assert [d.name for d in devs] == [f"cpu:{i}" for i in range(8)], devs
rng = np.random.default_rng(0)
w = rng.standard_normal((16, 4)).astype(np.float32)
xs = rng.standard_normal((8, 32, 16)).astype(np.float32)
loss = fnx.jit(fnx.value_and_grad(lambda w, x: jnp.tanh(x @ w).mean()))
for d, x in zip(devs, xs):   # the same step on every device, each with its own copy of w
    value, g = loss(fnx.device_put(w, d), fnx.device_put(x, d))
    assert value.device == d and g.device == d
    t = np.tanh(x.astype(np.float64) @ w)
    np.testing.assert_allclose(float(value), t.mean(), rtol=1e-5)
    np.testing.assert_allclose(np.asarray(g), x.T.astype(np.float64) @ ((1 - t ** 2) / t.size), rtol=1e-4, atol=1e-6)
ring = fnx.device_put(jnp.arange(5.0), devs[0])
for d in devs[1:] + devs[:1]: ring = fnx.device_put(ring + 1, d)   # around the ring and back
assert ring.device == devs[0] and np.array_equal(np.asarray(ring), np.arange(5.0) + 8)
print("ok")
"""


def test_fnx_cpu_devices_eight_in_a_fresh_process():
    run = subprocess.run([sys.executable, "-c", EIGHT], capture_output=True, text=True, timeout=300,
                         env={**os.environ, "FNX_CPU_DEVICES": "8"})
    assert run.returncode == 0 and run.stdout.strip() == "ok", run.stderr[-3000:]


def test_bad_fnx_cpu_devices_is_a_clear_error():
    run = subprocess.run([sys.executable, "-c", "import fnx"], capture_output=True, text=True, timeout=120,
                         env={**os.environ, "FNX_CPU_DEVICES": "zero"})
    assert run.returncode != 0 and "FNX_CPU_DEVICES='zero': expected a positive integer" in run.stderr


@pytest.mark.parametrize("dtype", [np.float32, np.float16, np.int8, np.uint16, np.bool_])
def test_dlpack_round_trips_with_numpy_and_jax(dtype):
    import jax
    host = (np.arange(24) % 5).astype(dtype).reshape(4, 6)
    ours = jnp.asarray(host)
    np.testing.assert_array_equal(np.from_dlpack(ours), host)            # (DLPack 1.0 consumer: read-only view)
    np.testing.assert_array_equal(np.asarray(jax.numpy.from_dlpack(ours)), host)  # (an older one: a copy)
    back = jnp.from_dlpack(jax.numpy.asarray(host))
    assert back.dtype == host.dtype and back.shape == host.shape
    np.testing.assert_array_equal(np.asarray(back), host)
    strided = host[::2, ::-3]  # (a non-contiguous producer)
    np.testing.assert_array_equal(np.asarray(jnp.from_dlpack(strided)), strided)
    assert jnp.from_dlpack(np.zeros((0, 3), dtype)).shape == (0, 3)


def test_dlpack_errors_and_devices(eight_cpus):
    with pytest.raises(TypeError, match="from_dlpack: list has no __dlpack__"):
        jnp.from_dlpack([1, 2])
    placed = jnp.from_dlpack(np.arange(4.0), device=fnx.devices("cpu")[1])
    assert placed.device == fnx.devices("cpu")[1]
    np.testing.assert_array_equal(np.asarray(placed), np.arange(4.0))
