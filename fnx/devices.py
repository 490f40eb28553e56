"""Devices and placement: `fnx.devices()`, `fnx.device_put`, `fnx.default_device`.

The Device objects are the runtime's (fnx/backends/device.py): `fnx.devices()[3]` is the one whose memory holds
the arrays placed there. Moving an array between devices is a COPY in the graph, which lowering keeps as a
transfer item of the executable, so a program over several devices is one schedule, not host-side glue.
"""
from __future__ import annotations

import contextlib
from typing import Any

import numpy as np

from fnx import dtypes, events, tree_util
from fnx.backends.device import Device, SingleDeviceSharding, canonical_device, get_device, platform_devices
from fnx.backends.device import platform_of, processes
from fnx.errors import at_user_line
from fnx.sharding.sharding import NamedSharding, PartitionSpec, as_named, shard_host_value
from fnx import trace as _trace
from fnx.trace import Array, realize, state, to_array
from fnx.uop import Ops, UOp

__all__ = ["Device", "SingleDeviceSharding", "default_device", "device_count", "device_name", "device_put",
           "devices", "local_device_count", "local_devices"]


def devices(backend: str | None = None) -> list[Device]:
    """The devices of a platform (default: the default device's platform), in ordinal order: `cpu:0..N-1` with
    FNX_CPU_DEVICES=N; under fnx.distributed, those of every process (cpu:0..P*N-1)."""
    return platform_devices(backend or platform_of(state.default_device))


def local_devices(process_index: int | None = None, backend: str | None = None) -> list[Device]:
    """The devices of process `process_index` (default: this one): all of `devices()` unless fnx.distributed
    runs several processes."""
    owner = processes.index if process_index is None else process_index
    return [d for d in devices(backend) if d.process_index == owner]


def device_count(backend: str | None = None) -> int:
    """How many devices the platform has, over every process."""
    return len(devices(backend))


def local_device_count(backend: str | None = None) -> int:
    """How many devices this process owns."""
    return len(local_devices(backend=backend))


def device_name(device: Any) -> str:
    """The canonical name ('cpu:0') of a Device or a device name ('cpu', 'interp:0'); ValueError for unknown
    platforms and for ordinals the platform does not have."""
    return device.name if isinstance(device, Device) else canonical_device(str(device))


def device_put(x: Any, device: Any = None) -> Any:
    """Place the arrays of pytree `x` on `device` (a Device or a name like 'cpu:1'; default: the default device),
    or lay them out over a mesh by a NamedSharding (or a PartitionSpec inside `with mesh:`).

    An Array already there is returned as is. One on another device is copied there: a COPY node, which eager
    code runs at once as a transfer and jit keeps in the graph. numpy arrays and Python scalars are copied from
    the host (the caller may change them afterwards).
    """
    if isinstance(device, (NamedSharding, PartitionSpec)):
        sharding = as_named(device, "device_put")
        return tree_util.tree_map(lambda leaf: _put_sharded(leaf, sharding), x)
    try:
        target = device_name(device) if device is not None else state.default_device
    except ValueError as err:
        raise ValueError(at_user_line(f"device_put: {err}")) from None

    def put(leaf):
        if isinstance(leaf, Array):
            source = leaf._buffer.device if leaf._buffer is not None else leaf.uop.device
            if source in (None, target) and (leaf._buffer is not None or state.depth): return leaf
            if source in (None, target):  # a lazy value of this device (or of none): compute it there
                with default_device(target):
                    return Array(realize([leaf.uop])[0], leaf.weak_type)
            moved = Array(UOp(Ops.COPY, leaf.uop.dtype, (leaf.uop,), target), leaf.weak_type)
            if state.depth: return moved
            return Array(realize([moved.uop])[0], leaf.weak_type)
        if not hasattr(leaf, "shape") and not isinstance(leaf, (bool, int, float, complex, np.generic)):
            leaf = to_array(leaf)  # lists and other array-likes: the same conversion as everywhere else
            if isinstance(leaf, Array): return put(leaf)
        value = np.array(leaf, copy=True)
        narrow = dtypes.canonicalize(dtypes.from_numpy(value.dtype))  # x64 off: 64-bit host values enter as 32-bit
        if narrow.np != value.dtype: value = value.astype(narrow.np)
        weak = isinstance(leaf, (bool, int, float)) and not isinstance(leaf, np.generic)
        array = to_array(leaf) if weak else None  # Python scalars keep their weak type and canonical dtype
        if array is not None: value = np.asarray(value, dtype=array.dtype)
        with events.span("transfer", f"host -> {target}", bytes=value.nbytes, src="host", dst=target):
            buf = get_device(target).allocator.from_numpy(value)
        return Array.from_buffer(buf, tuple(value.shape), weak)
    return tree_util.tree_map(put, x)


def _put_sharded(leaf: Any, sharding: NamedSharding) -> Array:
    """`leaf` laid out over a mesh: a COPY to the sharding under a trace (the partitioner reshards there), else
    each device gets a copy of its shard."""
    if state.depth:
        a = to_array(leaf)
        try:
            sharding.check(a.shape, "device_put")
        except ValueError as err:
            raise ValueError(at_user_line(str(err))) from None
        return Array(UOp(Ops.COPY, a.uop.dtype, (a.uop,), sharding), a.weak_type)
    if isinstance(leaf, Array):
        buffer = leaf._buffer
        if buffer is not None and buffer.is_sharded and buffer.sharding == sharding: return leaf
        value, weak = np.asarray(leaf), leaf.weak_type
    else:
        array = to_array(leaf) if not hasattr(leaf, "shape") else None
        value = np.asarray(array) if array is not None else np.array(leaf, copy=True)
        weak = array.weak_type if array is not None else False
    try:
        sharded = shard_host_value(value, sharding)
    except ValueError as err:
        raise ValueError(at_user_line(str(err))) from None
    return Array.from_buffer(sharded, tuple(value.shape), weak)


@contextlib.contextmanager
def default_device(device: Any):
    """Within this block, new arrays and computations go to `device`."""
    previous, state.default_device = state.default_device, device_name(device)
    try:
        yield
    finally:
        state.default_device = previous


_trace.device_put_hook = device_put  # (astype(device=) in fnx.trace, which cannot import this module)
