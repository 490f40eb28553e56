"""Shardings: how an array's elements are laid out over the devices of a mesh.

`NamedSharding(mesh, P("data", None))` splits axis 0 of an array over the mesh axis "data" and replicates it over
the other mesh axes. An array with such a sharding holds a `ShardedBuffer`: one device Buffer per mesh device, each
with that device's shard (devices that differ only along unnamed mesh axes hold equal copies).

Inside fnx a sharding of an n-d value is kept as `dims`: for each array axis, the tuple of mesh axes it is split
over, major first (`(("data",), ())` for P("data", None) on a matrix).
"""
from __future__ import annotations

import math
from typing import Any, Callable, Sequence

import numpy as np

from fnx import dtypes
from fnx.backends.device import Buffer, Device, device_of
from fnx.dtypes import DType
from fnx.sharding.mesh import Mesh, current_mesh

Dims = tuple[tuple[str, ...], ...]


class PartitionSpec(tuple):
    """One entry per array axis: None (not split), a mesh axis name, or a tuple of names (split over all of them,
    the first major). Axes past the spec's length are not split. `P` is the usual short name."""

    UNCONSTRAINED = "unconstrained"

    def __new__(cls, *entries: Any):
        for e in entries:
            ok = e is None or isinstance(e, str) or (isinstance(e, tuple) and all(isinstance(n, str) for n in e))
            if not ok:
                raise TypeError(f"PartitionSpec entries are None, a mesh axis name or a tuple of names; got {e!r}")
        return super().__new__(cls, entries)

    def __repr__(self) -> str:
        return f"PartitionSpec({', '.join(repr(e) for e in self)})"

    def __reduce__(self):
        return (PartitionSpec, tuple(self))


P = PartitionSpec


def spec_dims(spec: PartitionSpec | Sequence, ndim: int) -> Dims:
    """The per-axis tuples of mesh axes of `spec` for an array of rank `ndim` (ValueError if the spec is longer)."""
    if len(spec) > ndim:
        raise ValueError(f"PartitionSpec {PartitionSpec(*spec)!r} has {len(spec)} entries, for an array of rank "
                         f"{ndim}")
    entries = [() if e is None or e == PartitionSpec.UNCONSTRAINED else (e,) if isinstance(e, str) else tuple(e)
               for e in spec]
    return tuple(entries) + ((),) * (ndim - len(entries))


def dims_spec(dims: Dims) -> PartitionSpec:
    """The PartitionSpec of `dims`, trailing unsplit axes left out (as JAX prints them)."""
    entries = [None if not d else d[0] if len(d) == 1 else tuple(d) for d in dims]
    while entries and entries[-1] is None: entries.pop()
    return PartitionSpec(*entries)


def check_dims(mesh: Mesh, dims: Dims, shape: tuple[int, ...], what: str) -> None:
    """ValueError naming `what`, the spec and the shape unless every split axis divides evenly over mesh axes
    that exist, each used once."""
    used = [a for d in dims for a in d]
    for name in used:
        if name not in mesh.axis_names:
            raise ValueError(f"{what}: PartitionSpec {dims_spec(dims)!r} names mesh axis {name!r}, which the mesh "
                             f"{mesh} does not have")
    if len(set(used)) != len(used):
        raise ValueError(f"{what}: PartitionSpec {dims_spec(dims)!r} uses a mesh axis twice")
    for i, (size, axes) in enumerate(zip(shape, dims)):
        parts = math.prod(mesh.axis_size(a) for a in axes)
        if size % parts:
            raise ValueError(f"{what}: axis {i} of shape {shape} (size {size}) is split over mesh axes {axes} of "
                             f"{parts} devices by PartitionSpec {dims_spec(dims)!r}, which does not divide it")


def shard_shape(mesh: Mesh, dims: Dims, shape: tuple[int, ...]) -> tuple[int, ...]:
    return tuple(s // math.prod(mesh.axis_size(a) for a in d) for s, d in zip(shape, dims))


def shard_index(mesh: Mesh, dims: Dims, shape: tuple[int, ...], device: Device) -> tuple[slice, ...]:
    """The slice of the global array that `device` holds."""
    coords = mesh.coords(device)
    local = shard_shape(mesh, dims, shape)
    index = []
    for axes, size in zip(dims, local):
        block = 0
        for a in axes: block = block * mesh.axis_size(a) + coords[a]
        index.append(slice(block * size, (block + 1) * size))
    return tuple(index)


class NamedSharding:
    """A sharding by mesh axis names: `NamedSharding(mesh, P("data", None))`.

    Example:
      >>> s = NamedSharding(mesh, P("data"))
      >>> x = fnx.device_put(np.arange(8.0), s)      # with a mesh axis "data" of 4 devices: 2 elements each
      >>> x.addressable_shards[1].data               # Array([2., 3.])
    """

    def __init__(self, mesh: Mesh, spec: PartitionSpec | Sequence = PartitionSpec(), *, memory_kind: str | None = None):
        if not isinstance(mesh, Mesh): raise TypeError(f"NamedSharding: expected a Mesh, got {type(mesh).__name__}")
        self.mesh, self.spec, self.memory_kind = mesh, PartitionSpec(*spec), memory_kind
        for name in (a for d in spec_dims(self.spec, len(self.spec)) for a in d):
            if name not in mesh.axis_names:
                raise ValueError(f"NamedSharding: PartitionSpec {self.spec!r} names mesh axis {name!r}, which the "
                                 f"mesh {mesh} does not have")

    def dims(self, ndim: int) -> Dims:
        return spec_dims(self.spec, ndim)

    def check(self, shape: tuple[int, ...], what: str) -> Dims:
        """The dims of this sharding for an array of `shape`, checked (ValueError naming `what`)."""
        try:
            dims = self.dims(len(shape))
        except ValueError as err:
            raise ValueError(f"{what}: {err}") from None
        check_dims(self.mesh, dims, shape, what)
        return dims

    # ---- what JAX's Sharding answers ----
    def shard_shape(self, global_shape: Sequence[int]) -> tuple[int, ...]:
        shape = tuple(global_shape)
        return shard_shape(self.mesh, self.check(shape, "shard_shape"), shape)

    def devices_indices_map(self, global_shape: Sequence[int]) -> dict[Device, tuple[slice, ...]]:
        shape = tuple(global_shape)
        dims = self.check(shape, "devices_indices_map")
        return {d: shard_index(self.mesh, dims, shape, d) for d in self.mesh.flat_devices}

    def addressable_devices_indices_map(self, global_shape: Sequence[int]) -> dict[Device, tuple[slice, ...]]:
        return {d: i for d, i in self.devices_indices_map(global_shape).items() if d in self.addressable_devices}

    @property
    def device_set(self) -> set[Device]:
        return set(self.mesh.flat_devices)

    @property
    def addressable_devices(self) -> set[Device]:
        return set(self.mesh.local_devices)

    @property
    def is_fully_addressable(self) -> bool:
        return len(self.mesh.local_devices) == self.mesh.size

    @property
    def is_fully_replicated(self) -> bool:
        return not any(self.spec_axes)

    @property
    def spec_axes(self) -> list[str]:
        return [a for d in spec_dims(self.spec, len(self.spec)) for a in d]

    @property
    def num_devices(self) -> int:
        return self.mesh.size

    def is_equivalent_to(self, other: Any, ndim: int) -> bool:
        if isinstance(other, NamedSharding):
            return self.mesh == other.mesh and self.dims(ndim) == other.dims(ndim)
        return False

    def with_spec(self, spec: PartitionSpec | Sequence) -> NamedSharding:
        return NamedSharding(self.mesh, spec, memory_kind=self.memory_kind)

    @property
    def _normal(self) -> PartitionSpec:
        return dims_spec(spec_dims(self.spec, len(self.spec)))

    def __eq__(self, other) -> bool:
        return isinstance(other, NamedSharding) and self.mesh == other.mesh and self._normal == other._normal

    def __hash__(self) -> int:
        return hash((self.mesh, self._normal))

    def __repr__(self) -> str:
        return f"NamedSharding(mesh={self.mesh}, spec={self.spec!r})"


def as_named(sharding: Any, what: str) -> NamedSharding:
    """A NamedSharding from a NamedSharding or a bare PartitionSpec (under `with mesh:`)."""
    if isinstance(sharding, NamedSharding): return sharding
    if isinstance(sharding, PartitionSpec):
        mesh = current_mesh()
        if mesh is None:
            raise ValueError(f"{what}: a bare PartitionSpec {sharding!r} needs a mesh: use NamedSharding(mesh, spec) "
                             "or a `with mesh:` block")
        return NamedSharding(mesh, sharding)
    raise TypeError(f"{what}: expected a NamedSharding or a PartitionSpec, got {type(sharding).__name__}")


class ShardedBuffer:
    """The memory of a sharded array of global `shape`: `shards[device name]` is that device's Buffer (for the
    devices this process owns), laid out by `sharding` (its `dims` for this shape)."""
    is_sharded = True
    __slots__ = ("sharding", "dims", "shape", "dtype", "shards", "__weakref__")

    def __init__(self, sharding: NamedSharding, dims: Dims, shape: tuple[int, ...], dtype: DType,
                 shards: dict[str, Buffer]):
        self.sharding, self.dims, self.shape, self.dtype, self.shards = sharding, dims, shape, dtype, shards

    @property
    def device(self) -> NamedSharding:  # what jit keys its cache on, like a device name for a single buffer
        return self.sharding

    @property
    def mesh(self) -> Mesh:
        return self.sharding.mesh

    @property
    def local_shape(self) -> tuple[int, ...]:
        return shard_shape(self.mesh, self.dims, self.shape)

    def wait(self) -> None:
        for b in self.shards.values(): b.wait()

    def index_of(self, device: Device) -> tuple[slice, ...]:
        return shard_index(self.mesh, self.dims, self.shape, device)

    @property
    def is_deleted(self) -> bool:
        return any(b.is_deleted for b in self.shards.values())

    def deleted_error(self, shape: tuple[int, ...] | None = None) -> RuntimeError:
        return next(b for b in self.shards.values() if b.is_deleted).deleted_error(shape)

    def shard_value(self, device: Device) -> np.ndarray:
        """Device `device`'s shard as a (read-only) numpy array."""
        buffer = self.shards[device.name]
        return device_of(buffer).allocator.copyout(buffer).reshape(self.local_shape)

    def assemble(self) -> np.ndarray:
        """The global value on the host, put together from one copy of each shard; every block must have a copy in
        this process (always on one process; under fnx.distributed, e.g. a replicated array, as JAX reads one)."""
        out = np.empty(self.shape, self.dtype.np)
        here = {}
        for device in self.mesh.flat_devices:
            index = shard_index(self.mesh, self.dims, self.shape, device)
            key = tuple((s.start, s.stop) for s in index)
            if device.name in self.shards:
                if here.get(key) is None: here[key] = (index, device)
            else:
                here.setdefault(key, None)
        if any(v is None for v in here.values()):
            raise RuntimeError(f"the value of an array sharded over {self.mesh.size} devices of several processes "
                               f"cannot be read in one process (this one holds {len(self.shards)} shards, not every "
                               "block): read its addressable_shards, or lay it out replicated (P()) first")
        for index, device in here.values(): out[index] = self.shard_value(device)
        out.flags.writeable = False
        return out


def shard_host_value(value: np.ndarray, sharding: NamedSharding, what: str = "device_put") -> ShardedBuffer:
    """A ShardedBuffer holding host array `value` laid out by `sharding` (each device gets a copy of its slice)."""
    dtype = dtypes.canonicalize(dtypes.from_numpy(value.dtype))  # x64 off: 64-bit host values enter as 32-bit
    if dtype.np != value.dtype: value = value.astype(dtype.np)
    return shard_pieces(sharding, tuple(value.shape), dtype, lambda index: value[index], what)


def shard_pieces(sharding: NamedSharding, shape: tuple[int, ...], dtype: DType,
                 piece: Callable[[tuple[slice, ...]], Any], what: str) -> ShardedBuffer:
    """A ShardedBuffer of global `shape` laid out by `sharding` whose devices of this process each hold a copy of
    `piece(index)`, the host value of the slice `index` of the global array (asked once per distinct slice)."""
    dims = sharding.check(shape, what)
    shards, pieces = {}, {}
    for device in sharding.mesh.local_devices:
        index = shard_index(sharding.mesh, dims, shape, device)
        key = tuple((s.start, s.stop) for s in index)
        if key not in pieces:
            value = np.asarray(piece(index), dtype=dtype.np)
            if value.shape != shard_shape(sharding.mesh, dims, shape):
                raise ValueError(f"{what}: the piece for {device.name} (index {index}) has shape {value.shape}, "
                                 f"and a shard of {shape} laid out by {sharding.spec!r} has shape "
                                 f"{shard_shape(sharding.mesh, dims, shape)}")
            pieces[key] = value
        shards[device.name] = device.allocator.from_numpy(pieces[key])
    return ShardedBuffer(sharding, dims, shape, dtype, shards)
