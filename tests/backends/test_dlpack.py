"""DLPack capsules made and read by fnx/backends/dlpack.py (the CUDA backend's zero-copy exchange), checked on
host memory against numpy, an independent producer and consumer: numpy reads the capsules fnx makes (values,
address, read-only flag, strides), fnx reads numpy's (both protocol versions), deleters run exactly when the
protocol says, from several threads at once. The GPU half is in test_cuda.py (it runs where a GPU is)."""
import ctypes
import gc
import threading
import weakref

import numpy as np
import pytest

import fnx
import fnx.numpy as jnp
from fnx import dtypes
from fnx.backends import dlpack


class Producer:
    """What a library's array looks like to a DLPack consumer: `__dlpack__` hands out a capsule made here."""

    def __init__(self, capsule, device=(dlpack.CPU, 0)):
        self.capsule, self.device, self.asked = capsule, device, None

    def __dlpack__(self, **kwargs):
        self.asked = kwargs
        return self.capsule

    def __dlpack_device__(self):
        return self.device


def _values(dtype):
    return (np.arange(12) % 3 - (dtype.kind != "u" and dtype.kind != "b")).astype(dtype.np).reshape(3, 4)


def _memory(address: int, count: int, dtype: np.dtype) -> np.ndarray:
    """The `count` elements at `address`, read in place (no copy)."""
    return np.frombuffer((ctypes.c_char * (count * dtype.itemsize)).from_address(address), dtype)


@pytest.mark.parametrize("versioned", [True, False], ids=["dlpack1.0", "legacy"])
@pytest.mark.parametrize("dtype", [d for d in dtypes.ALL_DTYPES if d != dtypes.bfloat16], ids=str)
def test_numpy_reads_the_capsules_fnx_makes_in_place(dtype, versioned):
    host = _values(dtype)
    flags = dlpack.READ_ONLY if versioned else 0
    capsule = dlpack.export(host.ctypes.data, dtype, host.shape, (dlpack.CPU, 0), host, versioned, flags)
    got = np.from_dlpack(Producer(capsule))
    assert got.dtype == host.dtype and got.shape == host.shape
    np.testing.assert_array_equal(got, host)
    assert got.ctypes.data == host.ctypes.data  # (the same memory)
    if versioned: assert not got.flags.writeable
    assert dlpack.exports_alive() == 1
    del got, capsule
    gc.collect()
    assert dlpack.exports_alive() == 0  # numpy called the deleter when its array went


def test_strided_exports_and_every_dtype_round_trip():
    host = np.arange(12, dtype=np.float32).reshape(3, 4)
    transposed = dlpack.export(host.ctypes.data, dtypes.float32, (4, 3), (dlpack.CPU, 0), host, True,
                               strides=(1, 4))
    np.testing.assert_array_equal(np.from_dlpack(Producer(transposed)), host.T)
    for dtype in dtypes.ALL_DTYPES:  # (bfloat16 too, which numpy's DLPack does not read)
        values = _values(dtype)
        tensor = dlpack.Borrowed(dlpack.export(values.ctypes.data, dtype, values.shape, (dlpack.CUDA, 3), values,
                                               True, dlpack.READ_ONLY))
        assert (tensor.dtype, tensor.shape, tensor.strides, tensor.device) == (dtype, (3, 4), (4, 1),
                                                                               (dlpack.CUDA, 3))
        assert tensor.address == values.ctypes.data and tensor.read_only
        np.testing.assert_array_equal(_memory(tensor.address, 12, dtype.np).reshape(3, 4), values)
        tensor.release()
        tensor.release()  # (a second release does nothing: the deleter runs once)
    assert dlpack.exports_alive() == 0


@pytest.mark.parametrize("versioned", [True, False], ids=["dlpack1.0", "legacy"])
def test_fnx_reads_numpy_capsules_and_releases_them_once(versioned):
    base = np.arange(20.0)
    view = base[2:12]
    view.flags.writeable = not versioned  # (numpy exports a read-only array only with DLPack 1.0's flag)
    kept = weakref.ref(base)
    capsule = view.__dlpack__(max_version=(1, 0)) if versioned else view.__dlpack__()
    tensor = dlpack.Borrowed(capsule)
    assert tensor.address == view.ctypes.data and tensor.shape == (10,) and tensor.dtype == dtypes.float64
    assert tensor.read_only == versioned  # (the older struct has no flags)
    np.testing.assert_array_equal(_memory(tensor.address, 10, np.dtype(np.float64)), view)
    with pytest.raises(BufferError, match="no unused DLPack capsule"):
        dlpack.Borrowed(capsule)  # (consumed: renamed, so its destructor leaves the tensor to us)
    del base, view, capsule
    gc.collect()
    assert kept() is not None  # the producer keeps its memory until the consumer releases it
    tensor.release()
    gc.collect()
    assert kept() is None


def test_an_unused_capsule_lets_go_of_its_owner():
    owner = np.ones(5)
    kept = weakref.ref(owner)
    capsule = dlpack.export(owner.ctypes.data, dtypes.float64, (5,), (dlpack.CPU, 0), owner, True)
    del owner
    gc.collect()
    assert kept() is not None and dlpack.exports_alive() == 1
    del capsule
    gc.collect()
    assert kept() is None and dlpack.exports_alive() == 0


@pytest.mark.parametrize("strides", [(8, 1), (-1, 4), (0, 1), (1, 2), (-8, -2), (3, 0)])
def test_span_locates_strided_broadcast_and_reversed_elements(strides):
    memory = np.arange(64, dtype=np.int32)
    shape = (3, 4)
    start = 40  # (room for the negative strides below it)
    want = np.lib.stride_tricks.as_strided(memory[start:], shape, [s * 4 for s in strides])
    tensor = dlpack.Borrowed(dlpack.export(memory.ctypes.data + 4 * start, dtypes.int32, shape, (dlpack.CPU, 0),
                                           memory, True, strides=strides))
    low, extent, index = tensor.span()
    flat = _memory(tensor.address + 4 * low, extent, np.dtype(np.int32))
    assert index is not None and index.min() == 0 and index.max() == extent - 1
    np.testing.assert_array_equal(flat[index], want)
    tensor.release()
    compact = dlpack.Borrowed(dlpack.export(memory.ctypes.data, dtypes.int32, (1, 5), (dlpack.CPU, 0), memory,
                                            True, strides=(99, 1)))
    assert compact.span() == (0, 5, None)  # (a length-1 axis's stride does not matter)
    compact.release()


def test_newer_versions_and_unknown_types_are_refused_and_deleted():
    owner = np.zeros(4, np.float32)
    capsule = dlpack.export(owner.ctypes.data, dtypes.float32, (4,), (dlpack.CPU, 0), owner, True)
    struct = dlpack._ManagedVersioned.from_address(dlpack._pointer(id(capsule), b"dltensor_versioned"))
    struct.version.major = 2
    with pytest.raises(BufferError, match="DLPack 2.0; fnx reads version 1"):
        dlpack.Borrowed(capsule)
    assert dlpack.exports_alive() == 0  # (the spec: the consumer deletes what it cannot read)
    capsule = dlpack.export(owner.ctypes.data, dtypes.float32, (4,), (dlpack.CPU, 0), owner, False)
    dlpack._Managed.from_address(dlpack._pointer(id(capsule), b"dltensor")).dl_tensor.dtype.code = 3
    with pytest.raises(BufferError, match="no dtype for DLPack type code 3, 32 bits"):
        dlpack.Borrowed(capsule)
    assert dlpack.exports_alive() == 0


def test_capsules_made_and_released_from_many_threads():
    host = np.arange(1000, dtype=np.float32)
    errors = []

    def work():
        try:
            for i in range(300):
                capsule = dlpack.export(host.ctypes.data + 4 * i, dtypes.float32, (10,), (dlpack.CPU, 0), host,
                                        i % 2 == 0, dlpack.READ_ONLY)
                if i % 3 == 0: continue  # (dropped unused)
                np.testing.assert_array_equal(np.from_dlpack(Producer(capsule)), host[i:i + 10])
        except Exception as err:  # noqa: BLE001
            errors.append(err)
    threads = [threading.Thread(target=work) for _ in range(4)]
    for t in threads: t.start()
    for t in threads: t.join()
    gc.collect()
    assert not errors and dlpack.exports_alive() == 0


def test_arrays_say_where_they_are_and_refuse_what_they_cannot_do():
    a = jnp.arange(6.0).reshape(2, 3)
    assert a.__dlpack_device__() == (dlpack.CPU, 0)
    view = np.from_dlpack(a)  # (numpy asks for DLPack 1.0: a read-only view of the buffer, no copy)
    assert not view.flags.writeable and np.shares_memory(view, np.asarray(a))
    tensor = dlpack.Borrowed(a.__dlpack__(max_version=(1, 0), copy=False))
    assert tensor.address == np.asarray(a).ctypes.data and tensor.read_only
    tensor.release()
    with pytest.raises(fnx.errors.ConcretizationError):
        fnx.jit(lambda x: x.__dlpack_device__())(a)
    on_gpu = Producer(None, device=(dlpack.CUDA, 0))
    gpus = [d for d in fnx.devices("cuda") if not d.compile_only]
    if not gpus:
        with pytest.raises(BufferError, match=r"Producer is on CUDA GPU 0, which fnx cannot use \(its GPUs: none"):
            jnp.from_dlpack(on_gpu)
    with pytest.raises(BufferError, match="CUDA GPU 7, which fnx cannot use"):
        jnp.from_dlpack(Producer(None, device=(dlpack.CUDA, 7)))


@pytest.mark.skipif(not fnx.devices("opencl"), reason="no OpenCL device (CI requires PoCL: FNX_REQUIRE_OPENCL)")
def test_opencl_arrays_reach_dlpack_through_the_host():
    on_cl = fnx.device_put(np.arange(5, dtype=np.float32), fnx.devices("opencl")[0])
    assert on_cl.__dlpack_device__() == (dlpack.CPU, 0)
    np.testing.assert_array_equal(np.from_dlpack(on_cl), np.arange(5, dtype=np.float32))
    with pytest.raises(BufferError, match="reaches the host only as a copy, and copy=False"):
        on_cl.__dlpack__(max_version=(1, 0), copy=False)
