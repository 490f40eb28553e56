"""Meshes: devices laid out on a grid with named axes, as in `jax.sharding.Mesh`.

    mesh = Mesh(np.array(fnx.devices()).reshape(2, 4), ("data", "model"))
    mesh = fnx.make_mesh((2, 4), ("data", "model"))      # the same, from the default platform's devices

A collective over axis "model" runs within each group of devices that share their "data" coordinate
(`groups("model")`); `with mesh:` makes the mesh the default of shard_map and of bare PartitionSpecs.
"""
from __future__ import annotations

import math
import threading
from collections import OrderedDict
from typing import Any, Sequence

import numpy as np

from fnx.backends.device import Device, get_device, platform_devices, platform_of
from fnx.trace import state


class _MeshContext(threading.local):
    def __init__(self):
        self.stack: list[Mesh] = []


_context = _MeshContext()


class Mesh:
    """An n-d array of distinct devices with one name per axis.

    Args:
      devices: an array (or nested list) of Devices or device names; its shape is the mesh's shape.
      axis_names: one distinct name per axis of `devices`.
    """

    def __init__(self, devices: Any, axis_names: str | Sequence[str], *, axis_types: Any = None):
        names = (axis_names,) if isinstance(axis_names, str) else tuple(axis_names)
        array = np.array(devices, dtype=object)
        if array.ndim != len(names):
            raise ValueError(f"Mesh: {len(names)} axis names {names} for a device array of shape {array.shape}")
        if len(set(names)) != len(names) or not all(isinstance(n, str) for n in names):
            raise ValueError(f"Mesh: axis names must be distinct strings, got {names}")
        flat = [d if isinstance(d, Device) else get_device(str(d)) for d in array.reshape(-1)]
        if len({d.name for d in flat}) != len(flat):
            raise ValueError(f"Mesh: a device appears twice in {[d.name for d in flat]}")
        if len({platform_of(d.name) for d in flat}) > 1:
            raise ValueError(f"Mesh: the devices span several platforms: {[d.name for d in flat]}")
        self.devices = np.empty(array.shape, dtype=object)
        self.devices.reshape(-1)[:] = flat
        self.axis_names = names
        self.axis_types = axis_types
        self._key = (tuple(d.name for d in flat), array.shape, names)

    # ---- what JAX's Mesh answers ----
    @property
    def shape(self) -> OrderedDict:
        return OrderedDict(zip(self.axis_names, self.devices.shape))

    @property
    def axis_sizes(self) -> tuple[int, ...]:
        return tuple(self.devices.shape)

    @property
    def size(self) -> int:
        return self.devices.size

    @property
    def device_ids(self) -> np.ndarray:
        return np.vectorize(lambda d: d.id, otypes=[int])(self.devices)

    @property
    def flat_devices(self) -> list[Device]:
        """The devices in row-major order: the order shards are kept in."""
        return list(self.devices.reshape(-1))

    @property
    def local_devices(self) -> list[Device]:
        """The devices this process owns (all of them, but under fnx.distributed)."""
        return [d for d in self.flat_devices if getattr(d, "addressable", True)]

    @property
    def empty(self) -> bool:
        return self.size == 0

    def axis_size(self, name: str) -> int:
        if name not in self.axis_names:
            raise NameError(f"mesh axis {name!r} is not one of the mesh's axes {self.axis_names}")
        return self.devices.shape[self.axis_names.index(name)]

    def coords(self, device: Device) -> dict[str, int]:
        """The device's index along each mesh axis."""
        index = self._key[0].index(device.name)
        return {name: int(i) for name, i in zip(self.axis_names, np.unravel_index(index, self.devices.shape))}

    def groups(self, axes: str | Sequence[str]) -> list[list[Device]]:
        """The groups of devices a collective over `axes` runs in: devices equal in every other coordinate, each
        group ordered by its row-major index over `axes` (the order of axis_index)."""
        axes = (axes,) if isinstance(axes, str) else tuple(axes)
        for name in axes: self.axis_size(name)
        order = [self.axis_names.index(a) for a in axes]
        rest = [i for i in range(len(self.axis_names)) if i not in order]
        moved = np.transpose(self.devices, rest + order)
        return [list(g) for g in moved.reshape(-1, math.prod(self.devices.shape[i] for i in order))]

    # ---- identity, printing, context ----
    def __eq__(self, other) -> bool:
        return isinstance(other, Mesh) and self._key == other._key

    def __hash__(self) -> int:
        return hash(self._key)

    def __repr__(self) -> str:
        axes = ", ".join(f"'{n}': {s}" for n, s in self.shape.items())
        return f"Mesh({axes})"

    def __enter__(self) -> Mesh:
        _context.stack.append(self)
        return self

    def __exit__(self, *exc) -> None:
        _context.stack.pop()


def current_mesh() -> Mesh | None:
    """The mesh of the innermost `with mesh:` block (or `use_mesh`), else None."""
    return _context.stack[-1] if _context.stack else None


class use_mesh:  # (JAX's name for `with mesh:`)
    """`with fnx.sharding.use_mesh(mesh):` is `with mesh:`."""

    def __init__(self, mesh: Mesh):
        self.mesh = mesh

    def __enter__(self) -> Mesh:
        return self.mesh.__enter__()

    def __exit__(self, *exc) -> None:
        self.mesh.__exit__(*exc)


def make_mesh(axis_shapes: Sequence[int], axis_names: Sequence[str], *, devices: Sequence[Device] | None = None,
              axis_types: Any = None) -> Mesh:
    """A mesh of `axis_shapes` over the first prod(axis_shapes) of `devices` (default: the default platform's
    devices), in order, as jax.make_mesh does on hosts.

    Example:
      >>> mesh = fnx.make_mesh((2, 4), ("data", "model"))     # with FNX_CPU_DEVICES=8
    """
    shape = tuple(int(s) for s in axis_shapes)
    pool = list(devices) if devices is not None else platform_devices(platform_of(state.default_device))
    need = math.prod(shape)
    if need > len(pool) or any(s <= 0 for s in shape):
        raise ValueError(f"make_mesh: a mesh of shape {shape} needs {need} devices, and {len(pool)} are available "
                         f"({[d.name for d in pool]}); FNX_CPU_DEVICES sets how many cpu devices there are")
    return Mesh(np.array(pool[:need], dtype=object).reshape(shape), tuple(axis_names), axis_types=axis_types)
