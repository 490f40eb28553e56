"""Device objects and placement: `fnx.devices()`, `fnx.device_put`, `fnx.default_device`."""
from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any

import numpy as np

from fnx.backends.device import Buffer, canonical_device, platform_of
from fnx.trace import Array, state
from fnx.uop import Ops, UOp


@dataclass(frozen=True)
class Device:
    """One device: `platform` ('cpu', 'interp', ...) and `id`."""
    platform: str
    id: int

    @property
    def name(self) -> str:
        return f"{self.platform}:{self.id}"

    def __repr__(self) -> str:
        return f"{self.platform.capitalize()}Device(id={self.id})"


@dataclass(frozen=True)
class SingleDeviceSharding:
    device: Device

    @property
    def device_set(self) -> set[Device]:
        return {self.device}


def device_object(name: str) -> Device:
    name = canonical_device(name)
    return Device(platform_of(name), int(name.split(":")[1]))


def devices(backend: str | None = None) -> list[Device]:
    """The devices of a platform (default: the default device's platform)."""
    platform = backend or platform_of(state.default_device)
    return [device_object(f"{platform}:0")]


local_devices = devices


def device_count(backend: str | None = None) -> int:
    return len(devices(backend))


def device_name(device: Any) -> str:
    """The canonical name ('cpu:0') of a Device or a device name ('cpu', 'interp:0'); ValueError for unknown ones."""
    return device.name if isinstance(device, Device) else canonical_device(str(device))


def device_put(x: Any, device: Any = None) -> Any:
    """Place arrays (a pytree of them) on `device` (a Device or a name like 'cpu' or 'interp'); copies host data."""
    from fnx import tree_util
    from fnx.lax import to_array
    target = device_name(device) if device is not None else state.default_device

    def put(leaf):
        value = np.asarray(leaf) if not isinstance(leaf, Array) else np.asarray(leaf)
        if isinstance(leaf, Array) and leaf.is_concrete and leaf.uop.device == target: return leaf
        if not isinstance(leaf, Array) and not hasattr(leaf, "shape"): leaf = to_array(leaf)
        buf = Buffer.from_numpy(target, np.array(value, copy=True))
        return Array(UOp(Ops.BUFFER, buf.dtype, (), (buf, tuple(value.shape))), getattr(leaf, "weak_type", False))
    return tree_util.tree_map(put, x)


@contextlib.contextmanager
def default_device(device: Any):
    """Within this block, new arrays and computations go to `device`."""
    previous, state.default_device = state.default_device, device_name(device)
    try:
        yield
    finally:
        state.default_device = previous
