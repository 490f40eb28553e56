"""Many processes over MPI: `fnx.distributed.initialize()` under `mpirun -n P`, as jax.distributed.initialize.

    mpirun -n 2 env FNX_CPU_DEVICES=2 python train.py       # in train.py: fnx.distributed.initialize() first

Each process owns FNX_CPU_DEVICES = L cpu devices; process r owns cpu:r*L .. cpu:r*L+L-1 of the P*L global ones.
`fnx.devices()` lists all of them (another process's are `RemoteDevice` placeholders: `addressable` False, no memory
of their own here), `fnx.local_devices()` this process's, and a mesh may span processes. An array over such a mesh
holds only this process's shards; every process runs the same program on its own ones, and a collective whose
group has devices of several processes moves host copies of the shards with MPI (mpi4py over the system's MPI):

    psum, pmax, pmin   allgather of every member's value, then each process reduces them in group order
    all_gather         allgather
    psum_scatter       alltoall of the chunks (chunk k of every member goes to member k), reduced in group order
    all_to_all         alltoall of the chunks
    ppermute           a send and a receive per (source, destination) pair between processes; local pairs copy

Reductions never use an MPI reduction operation: every process adds the same values in the same order (member 0,
1, 2, ... of the group; 16-bit floats in float32, as fnx reduces them), so all processes hold the same bits.

Every wait is a non-blocking MPI request polled against a deadline of FNX_DISTRIBUTED_TIMEOUT seconds: a process that
hangs or left makes the others raise DistributedError naming the collective, the mesh axis, the processes that did
not answer (when a point-to-point exchange tells) and the timeout. Requests that never completed cannot be taken
back, so after such an error (or any exception no one caught) the process aborts the MPI job when it exits
(MPI_Abort: mpirun then stops every process and exits nonzero), instead of waiting in MPI_Finalize for the others.
"""
from __future__ import annotations

import atexit
import sys
import threading
import time
import zlib
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import numpy as np

from fnx import dtypes, reference
from fnx.backends.device import (Buffer, SingleDeviceSharding, device_of, get_device, platform_of, processes,
                                 started_platforms)
from fnx.config import config
from fnx.errors import DistributedError
from fnx.sharding.sharding import NamedSharding, shard_pieces
from fnx.trace import Array, state
from fnx.uop import CollectiveArg, Ops

__all__ = ["initialize", "is_initialized", "make_array_from_callback", "process_count", "process_index", "shutdown"]

POLL_FIRST, POLL_MOST = 1e-5, 2e-3  # seconds between two tests of pending requests: short at first, then doubling
TAG_HANDSHAKE, TAG_CREATE, TAG_PPERMUTE = 11, 12, 13  # point-to-point tags on fnx's own communicators


class _World:
    """This process's MPI state: `comm` (fnx's duplicate of COMM_WORLD), the communicators of the process sets
    collectives ran over (created on first use), and the lock that keeps one exchange at a time."""

    def __init__(self, mpi: Any, comm: Any):
        self.mpi, self.comm = mpi, comm
        self.rank, self.size = comm.Get_rank(), comm.Get_size()
        self.comms: dict[tuple[int, ...], Any] = {}
        self.lock = threading.Lock()
        self.broken: str | None = None  # why exchanges can no longer run (an earlier one failed)

    def fail(self, message: str) -> DistributedError:
        """The error to raise for a failed exchange: the job is aborted when this process exits."""
        self.broken = message
        _abort[:] = [self.comm, message]
        return DistributedError(message)

    def wait(self, requests: list, what: str, peers: Sequence[int | None], group: Sequence[int],
             timeout: float | None = None) -> None:
        """Poll `requests` until all complete; DistributedError after the timeout. `peers[i]` is the process request
        i waits for (None for a collective, which does not tell who is missing), `group` the processes taking part."""
        timeout = config.distributed_timeout if timeout is None else timeout
        deadline, pause = time.monotonic() + timeout, POLL_FIRST
        try:
            while not self.mpi.Request.Testall(requests):
                if time.monotonic() > deadline:
                    missing = sorted({p for r, p in zip(requests, peers) if p is not None and not r.Test()})
                    others = [p for p in group if p != self.rank]
                    who = (f"process{'es' if len(missing) > 1 else ''} {', '.join(map(str, missing))} did not "
                           "answer" if missing else
                           f"at least one of processes {others} (the others in it) did not take part")
                    raise self.fail(f"fnx.distributed: {what}: process {self.rank} of {self.size} waited {timeout:g} "
                                    f"s (FNX_DISTRIBUTED_TIMEOUT) and {who}: a process that hangs, has exited or "
                                    "runs its collectives in another order stops the others. The MPI job is "
                                    "aborted when this process exits")
                time.sleep(pause)
                pause = min(2 * pause, POLL_MOST)
        except self.mpi.Exception as err:
            raise self.fail(f"fnx.distributed: {what}: process {self.rank}: MPI failed: {err}") from None

    def communicator(self, ranks: tuple[int, ...], what: str) -> Any:
        """The communicator of processes `ranks` (ascending; its rank i is process ranks[i]), made on first use.
        Making one waits for every member without a deadline, so the members first greet each other with
        point-to-point messages that do have one (and that say which process is missing)."""
        comm = self.comms.get(ranks)
        if comm is None:
            key = np.array([len(ranks), zlib.crc32(np.array(ranks, np.int64).tobytes())], np.int64)
            others = [p for p in ranks if p != self.rank]
            heard = [np.zeros(2, np.int64) for _ in others]
            requests = [self.comm.Isend(key, dest=p, tag=TAG_HANDSHAKE) for p in others]
            requests += [self.comm.Irecv(h, source=p, tag=TAG_HANDSHAKE) for h, p in zip(heard, others)]
            self.wait(requests, f"{what}: connecting processes {list(ranks)}", others + others, ranks)
            for h, p in zip(heard, others):
                if not np.array_equal(h, key):
                    raise self.fail(f"fnx.distributed: {what}: process {p} runs a collective over another set of "
                                    f"processes than process {self.rank} (over {list(ranks)}) at this point: every "
                                    "process must run the same computations over the same meshes in the same order")
            group = self.comm.Get_group().Incl(list(ranks))
            comm = self.comms[ranks] = self.comm.Create_group(group, tag=TAG_CREATE)
            group.Free()
        return comm


_world: _World | None = None
_abort: list = []  # [communicator, reason] once the job must be aborted at exit


def _abort_at_exit() -> None:
    """At exit, after a failed exchange or an uncaught exception: MPI_Abort, which makes mpirun stop every process
    (the others may be waiting for this one) and exit nonzero."""
    if not _abort: return
    comm, reason = _abort
    sys.stdout.flush()
    first = reason.splitlines()[0] if reason else ""
    sys.stderr.write(f"fnx.distributed: process {processes.index} aborts the MPI job after: "
                     f"{first if len(first) <= 200 else first[:200] + '...'}\n")
    sys.stderr.flush()
    comm.Abort(1)


def _aborting_hook(previous: Callable) -> Callable:
    """sys.excepthook under fnx.distributed: an exception no one caught also aborts the job at exit (the other
    processes would wait for this one until their timeout), as `python -m mpi4py` does."""
    def hook(kind, value, traceback) -> None:
        previous(kind, value, traceback)
        if _world is not None and _world.size > 1 and not _abort:
            _abort[:] = [_world.comm, f"uncaught {kind.__name__}: {value}"]
    return hook


# ---- initialize, shutdown ----

def initialize(coordinator_address: str | None = None, num_processes: int | None = None,
               process_id: int | None = None, local_device_ids: int | Sequence[int] | None = None,
               cluster_detection_method: str | None = None, initialization_timeout: float | None = None,
               coordinator_bind_address: str | None = None) -> None:
    """Join the processes that mpirun started, as jax.distributed.initialize with cluster detection by mpi4py.

    Call it once, first (before any array is placed or computation runs). Afterwards `fnx.devices()` spans the
    processes (process r owns cpu:r*L .. cpu:r*L+L-1, L = FNX_CPU_DEVICES, the same in every process),
    `fnx.local_devices()` is this process's, the default device is this process's first cpu device and a mesh of
    `fnx.devices()` spans all processes.

    Args:
      coordinator_address, coordinator_bind_address: accepted for JAX compatibility; MPI connects the processes.
      num_processes, process_id: when given, checked against what MPI says (ValueError if they differ).
      local_device_ids: when given, must be this process's local cpu ordinals 0..L-1.
      cluster_detection_method: None or "mpi4py" (the only one).
      initialization_timeout: seconds to wait for the other processes (default FNX_DISTRIBUTED_TIMEOUT).

    Raises RuntimeError if called twice or after fnx ran something, ImportError without mpi4py, DistributedError
    when the processes do not all join in time or own different numbers of devices.

    Example:
      >>> fnx.distributed.initialize()        # under `mpirun -n 2`, with FNX_CPU_DEVICES=2
      >>> fnx.process_index(), len(fnx.devices()), [d.id for d in fnx.local_devices()]
      (1, 4, [2, 3])                           # in the second process
    """
    global _world
    if _world is not None or processes.count > 1:
        raise RuntimeError("fnx.distributed.initialize should only be called once")
    if started := started_platforms():
        raise RuntimeError(f"fnx.distributed.initialize must be called before fnx runs anything: devices of "
                           f"{started} are already in use (fnx.devices() listed them, an array was placed or a "
                           "computation ran); call it first in the program, as jax.distributed.initialize")
    if cluster_detection_method not in (None, "mpi4py"):
        raise ValueError(f"fnx.distributed.initialize: cluster_detection_method={cluster_detection_method!r}; fnx "
                         "finds its processes through MPI only ('mpi4py')")
    try:
        from mpi4py import MPI  # (here, not at import: `import fnx` must not start MPI)
    except (ImportError, RuntimeError, OSError) as err:  # (mpi4py's wheels load the MPI library when imported)
        raise ImportError(f"fnx.distributed needs mpi4py and an MPI library ({err}): pip install 'fnx[mpi]' "
                          "(mpi4py) and, on Debian, apt-get install openmpi-bin libopenmpi-dev") from None
    world = MPI.COMM_WORLD
    rank, size, local = world.Get_rank(), world.Get_size(), config.cpu_devices
    if num_processes is not None and num_processes != size:
        raise ValueError(f"fnx.distributed.initialize: num_processes={num_processes}, and MPI started {size} "
                         f"process{'es' if size != 1 else ''} (mpirun -n {size})")
    if process_id is not None and process_id != rank:
        raise ValueError(f"fnx.distributed.initialize: process_id={process_id}, and MPI says this is process {rank}")
    if local_device_ids is not None:
        ids = [local_device_ids] if isinstance(local_device_ids, int) else list(local_device_ids)
        if ids != list(range(local)):
            raise ValueError(f"fnx.distributed.initialize: local_device_ids={ids}; a process owns all of its "
                             f"{local} cpu device{'s' if local != 1 else ''} (ids {list(range(local))}): "
                             "FNX_CPU_DEVICES sets how many")
    atexit.register(_abort_at_exit)
    joining = _World(MPI, world)
    counts = np.zeros(size, np.int64)
    request = world.Iallgather(np.array([local], np.int64), counts)
    joining.wait([request], "initialize", [None], list(range(size)),
                 timeout=config.distributed_timeout if initialization_timeout is None else initialization_timeout)
    if (counts != local).any():
        raise DistributedError(f"fnx.distributed.initialize: the processes own different numbers of cpu devices "
                               f"(FNX_CPU_DEVICES per process: {counts.tolist()}); give every process the same")
    _world = _World(MPI, world.Dup())
    processes.index, processes.count = rank, size
    platform, _, ordinal = config.device.partition(":")
    if platform == "cpu":  # the default device: this process's own (FNX_DEVICE=cpu:k names its k-th)
        first = rank * local + (int(ordinal) if ordinal.isdigit() else 0)
        config.device = f"cpu:{first}"  # (what new threads start on)
        if platform_of(state.default_device) == "cpu": state.default_device = config.device
    sys.excepthook = _aborting_hook(sys.excepthook)


def is_initialized() -> bool:
    """Whether initialize() ran (and shutdown() did not)."""
    return _world is not None


def shutdown() -> None:
    """Leave the multi-process run: wait (up to FNX_DISTRIBUTED_TIMEOUT) until every process calls shutdown, then
    free fnx's MPI communicators. Nothing happens if initialize() was not called. The devices keep their numbering;
    a collective across processes raises afterwards."""
    global _world
    world = _world
    if world is None: return
    if world.broken is None:
        world.wait([world.comm.Ibarrier()], "shutdown", [None], list(range(world.size)))
        for comm in world.comms.values(): comm.Free()
        world.comm.Free()
    _world = None


def process_index(backend: str | None = None) -> int:
    """This process's index: 0 .. process_count() - 1 (0 unless fnx.distributed runs several)."""
    return processes.index


def process_count(backend: str | None = None) -> int:
    """How many processes run this program (1 unless fnx.distributed runs several)."""
    return processes.count


# ---- arrays built from each process's pieces ----

def make_array_from_callback(shape: Sequence[int], sharding: Any, data_callback: Callable[[tuple], Any],
                             dtype: Any = None) -> Array:
    """An array of global `shape` laid out by `sharding`, each of this process's devices holding
    `data_callback(index)`: its slice `index` (a tuple of slices) of the global array, as jax.make_array_from_callback.
    Every process builds its own shards only: the way to make an array over a mesh that spans processes.

    Example:
      >>> x = fnx.make_array_from_callback((8, 4), NamedSharding(mesh, P("data")), lambda index: host[index])
    """
    shape = tuple(int(n) for n in shape)
    if isinstance(sharding, SingleDeviceSharding):
        whole = tuple(slice(0, n) for n in shape)
        value = np.asarray(data_callback(whole), dtype=dtype)
        if value.shape != shape:
            raise ValueError(f"make_array_from_callback: the callback returned shape {value.shape} for the index "
                             f"{whole} of an array of shape {shape}")
        return Array.from_buffer(sharding.device.allocator.from_numpy(value), shape)
    if not isinstance(sharding, NamedSharding):
        raise TypeError(f"make_array_from_callback: expected a NamedSharding or SingleDeviceSharding, got "
                        f"{type(sharding).__name__}")
    pieces: dict[tuple, np.ndarray] = {}

    def piece(index: tuple[slice, ...]) -> np.ndarray:
        key = tuple((s.start, s.stop) for s in index)
        if key not in pieces: pieces[key] = np.asarray(data_callback(index), dtype=dtype)
        return pieces[key].astype(exact.np, copy=False) if exact is not None else pieces[key]
    exact = None  # (the dtype the pieces enter as, once known: 32-bit with x64 off)
    locals_ = sharding.addressable_devices_indices_map(shape)
    if dtype is None:
        if not locals_:
            raise ValueError("make_array_from_callback: this process owns no device of the mesh: pass dtype=")
        dtype = piece(next(iter(locals_.values()))).dtype
    exact = dtypes.canonicalize(dtypes.from_numpy(np.dtype(dtype)))
    buffer = shard_pieces(sharding, shape, exact, piece, "make_array_from_callback")
    return Array.from_buffer(buffer, shape)


def make_array_from_single_device_arrays(shape: Sequence[int], sharding: Any, arrays: Sequence[Any], *,
                                         dtype: Any = None) -> Array:
    """An array of global `shape` laid out by `sharding` from one array per addressable device, each already on
    its device and holding that device's slice, as jax.make_array_from_single_device_arrays. (The slices pass
    through host memory on their way into the sharded array.)

    Raises:
      ValueError: for an array on a device outside the sharding, with the wrong shape for its slice, two arrays on
        one device, or a device of the sharding with no array.
    """
    shape = tuple(int(n) for n in shape)
    if not isinstance(sharding, NamedSharding):
        raise TypeError(f"make_array_from_single_device_arrays: expected a NamedSharding, got "
                        f"{type(sharding).__name__}")
    index_of = sharding.addressable_devices_indices_map(shape)
    slices: dict[tuple, np.ndarray] = {}
    for a in arrays:
        device = a.device
        if device not in index_of:
            raise ValueError(f"make_array_from_single_device_arrays: an array on {device}, which holds no shard of "
                             f"{sharding} (devices {sorted(d.name for d in index_of)})")
        index = index_of[device]
        want = tuple(len(range(*s.indices(n))) for s, n in zip(index, shape))
        if tuple(a.shape) != want:
            raise ValueError(f"make_array_from_single_device_arrays: the array on {device} has shape "
                             f"{tuple(a.shape)}, and its shard {index} of {shape} has shape {want}")
        slices[tuple((s.start, s.stop) for s in index)] = np.asarray(a)
    given = [a.device for a in arrays]
    if (twice := sorted({d.name for d in given if given.count(d) > 1})):
        raise ValueError(f"make_array_from_single_device_arrays: several arrays on {twice}")
    if (missing := [d.name for d in index_of if d not in given]):
        raise ValueError(f"make_array_from_single_device_arrays: no array for the devices {sorted(missing)}")
    return make_array_from_callback(shape, sharding, lambda index: slices[tuple((s.start, s.stop) for s in index)],
                                    dtype=dtype if dtype is not None else arrays[0].dtype)


# ---- collectives across processes ----

@dataclass
class _Group:
    """One group of a collective: its device names in group order, the process owning each, the processes
    (ascending: rank i of the group's communicator is process ranks[i]) and the positions this process owns."""
    members: list[str]
    owners: list[int]
    ranks: tuple[int, ...] = field(init=False)
    mine: list[int] = field(init=False)

    def __post_init__(self):
        self.ranks = tuple(sorted(set(self.owners)))
        self.mine = [j for j, p in enumerate(self.owners) if p == processes.index]

    def owned_by(self, process: int) -> list[int]:
        return [j for j, p in enumerate(self.owners) if p == process]


def _host(buffer: Buffer, shape: tuple[int, ...]) -> np.ndarray:
    return device_of(buffer).allocator.copyout(buffer).reshape(shape)


def _bytes(x: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(x).reshape(-1).view(np.uint8)


def _from_bytes(raw: np.ndarray, dtype: np.dtype, shape: tuple[int, ...]) -> np.ndarray:
    return raw.view(dtype).reshape(shape)


def _reduce(kind: str, xs: list[np.ndarray]) -> np.ndarray:
    """psum / pmax / pmin of `xs`, member 0 first, then 1, 2, ...: the same bits on every process. 16-bit floats
    add in float32 and round once, as fnx's reductions do; pmin is pmax under an order-reversing map (negation,
    bitwise not), as in fnx.sharding.collectives."""
    dtype = xs[0].dtype
    if kind == "psum":
        wide = dtype.itemsize < 4 and dtypes.from_numpy(dtype).is_float
        acc = xs[0].astype(np.float32) if wide else xs[0]
        for x in xs[1:]: acc = reference.binary(Ops.ADD, acc, x.astype(np.float32) if wide else x)
        return np.asarray(acc).astype(dtype)
    flip = (np.negative if dtypes.from_numpy(dtype).is_float else np.invert) if kind == "pmin" else (lambda x: x)
    acc = flip(xs[0])
    for x in xs[1:]: acc = reference.binary(Ops.MAX, acc, flip(x))
    return np.asarray(flip(acc)).astype(dtype)


def _chunk(x: np.ndarray, axis: int, k: int, n: int) -> np.ndarray:
    size = x.shape[axis] // n
    return np.take(x, np.arange(k * size, (k + 1) * size), axis=axis)


@dataclass
class _Exchange:
    """One group's part of a collective: its MPI requests (started), the process each waits for (None: not known),
    `finish()`, which turns what arrived into this process's results, and the buffers MPI reads until then."""
    requests: list
    peers: list
    finish: Callable[[], dict[int, np.ndarray]]
    buffers: list = field(default_factory=list)


def _gathered(world: _World, comm: Any, group: _Group, xs: dict[int, np.ndarray]) -> tuple[list, Callable]:
    """Allgather every member's value: the request and its buffers, and a function returning the values in group
    order."""
    nbytes = next(iter(xs.values())).nbytes
    counts = [nbytes * len(group.owned_by(p)) for p in group.ranks]
    offsets = np.concatenate([[0], np.cumsum(counts)[:-1]]).astype(int).tolist()
    send = np.concatenate([_bytes(xs[j]) for j in group.mine])
    received = np.empty(sum(counts), np.uint8)
    request = comm.Iallgatherv([send, world.mpi.BYTE], [received, counts, offsets, world.mpi.BYTE])
    like = next(iter(xs.values()))

    def values() -> list[np.ndarray]:
        out: list = [None] * len(group.members)
        for p, offset in zip(group.ranks, offsets):
            for i, j in enumerate(group.owned_by(p)):
                out[j] = _from_bytes(received[offset + i * nbytes:offset + (i + 1) * nbytes], like.dtype, like.shape)
        return out
    return [request, send, received], values


def _alltoall(world: _World, comm: Any, group: _Group, xs: dict[int, np.ndarray], split: int) -> tuple[list, Callable]:
    """Alltoall of chunks: chunk k (along `split`) of member j's value goes to member k. The request and its
    buffers, and a function returning {k: [the chunk from member j, for j in group order]} for this process's
    members k."""
    n = len(group.members)
    like = _chunk(next(iter(xs.values())), split, 0, n)
    size = like.nbytes
    chunks = {j: [_chunk(x, split, k, n) for k in range(n)] for j, x in xs.items()}
    send_parts, send_counts, receive_counts = [], [], []
    for p in group.ranks:  # to process p: for each of its members k, for each of mine j: chunk k of x_j
        send_parts += [_bytes(chunks[j][k]) for k in group.owned_by(p) for j in group.mine]
        send_counts.append(size * len(group.owned_by(p)) * len(group.mine))
        receive_counts.append(size * len(group.mine) * len(group.owned_by(p)))
    send = np.concatenate(send_parts) if send_parts else np.empty(0, np.uint8)
    received = np.empty(sum(receive_counts), np.uint8)
    offsets = lambda counts: np.concatenate([[0], np.cumsum(counts)[:-1]]).astype(int).tolist()  # noqa: E731
    receive_offsets = offsets(receive_counts)
    request = comm.Ialltoallv([send, send_counts, offsets(send_counts), world.mpi.BYTE],
                              [received, receive_counts, receive_offsets, world.mpi.BYTE])

    def pieces() -> dict[int, list[np.ndarray]]:
        out: dict[int, list] = {k: [None] * n for k in group.mine}
        for p, offset in zip(group.ranks, receive_offsets):  # from process p: for each of my k, for each of its j
            at = offset
            for k in group.mine:
                for j in group.owned_by(p):
                    out[k][j] = _from_bytes(received[at:at + size], like.dtype, like.shape)
                    at += size
        return out
    return [request, send, received], pieces


def _start(world: _World, arg: CollectiveArg, group: _Group, xs: dict[int, np.ndarray], what: str) -> _Exchange:
    """Start collective `arg` over `group`; `xs[j]` is the value of member j, for this process's members."""
    comm = world.communicator(group.ranks, what)
    kind = arg.kind
    if kind in ("psum", "pmax", "pmin", "all_gather"):
        (request, *buffers), values = _gathered(world, comm, group, xs)
        if kind == "all_gather":
            return _Exchange([request], [None], lambda: dict.fromkeys(group.mine, np.stack(values(), arg.axis)),
                             buffers)
        return _Exchange([request], [None], lambda: dict.fromkeys(group.mine, _reduce(kind, values())), buffers)
    if kind in ("psum_scatter", "all_to_all"):
        (request, *buffers), pieces = _alltoall(world, comm, group, xs,
                                                arg.axis if kind == "psum_scatter" else arg.split_axis)
        if kind == "psum_scatter":
            return _Exchange([request], [None], lambda: {k: _reduce("psum", p) for k, p in pieces().items()}, buffers)
        return _Exchange([request], [None], lambda: {k: np.concatenate(p, arg.axis) for k, p in pieces().items()},
                         buffers)
    if kind == "ppermute":
        return _ppermute(comm, arg.perm, group, xs)
    raise ValueError(f"no collective {kind!r}")


def _ppermute(comm: Any, perm: tuple, group: _Group, xs: dict[int, np.ndarray]) -> _Exchange:
    """ppermute: member dst gets member src's value for each pair; a pair within this process is a copy, one
    between processes a send and a receive (posted in the order of `perm` on both sides, which MPI keeps)."""
    like = next(iter(xs.values()))
    out = {k: np.zeros_like(like) for k in group.mine}
    requests, peers, keep = [], [], []
    for src, dst in perm:
        here_src, here_dst = group.owners[src] == processes.index, group.owners[dst] == processes.index
        if here_src and here_dst:
            out[dst] = xs[src]
        elif here_src:
            keep.append(np.ascontiguousarray(xs[src]))
            requests.append(comm.Isend(_bytes(keep[-1]), dest=group.ranks.index(group.owners[dst]), tag=TAG_PPERMUTE))
            peers.append(group.owners[dst])
        elif here_dst:
            out[dst] = np.empty_like(like)
            requests.append(comm.Irecv(_bytes(out[dst]), source=group.ranks.index(group.owners[src]),
                                       tag=TAG_PPERMUTE))
            peers.append(group.owners[src])
    return _Exchange(requests, peers, lambda: out, keep)


def run_collective(arg: CollectiveArg, shape: tuple[int, ...], dtype: Any, groups: list[list[str]],
                   values: dict[str, Buffer]) -> dict[str, Buffer]:
    """Collective `arg` within each group of device names whose members live in several processes (what
    fnx.sharding.collectives.run hands over); `values` holds this process's members' Buffers. Returns this process's
    members' results. Every group with a member here is started before any is waited for."""
    world = _world
    what = f"{arg.kind} over mesh axis {arg.axis_name!r}"
    if world is None:
        raise DistributedError(f"fnx.distributed: {what} spans devices of several processes, and fnx.distributed is "
                               "not initialized (or was shut down)")
    if world.broken is not None:
        raise DistributedError(f"fnx.distributed: {what}: an earlier exchange failed, so no other can run: "
                               f"{world.broken}")
    mine = [_Group(list(g), [get_device(d).process_index for d in g]) for g in groups]
    mine = [g for g in mine if g.mine]
    with world.lock:
        started = []
        for group in mine:
            xs = {j: _host(values[group.members[j]], shape) for j in group.mine}
            started.append((group, _start(world, arg, group, xs, f"{what} (devices {group.members})")))
        requests = [r for _, ex in started for r in ex.requests]
        peers = [p for _, ex in started for p in ex.peers]
        involved = sorted({p for g in mine for p in g.ranks})
        world.wait(requests, f"{what} (groups {[g.members for g in mine]})", peers, involved)
    out = {}
    for group, exchange in started:
        for j, value in exchange.finish().items():
            name = group.members[j]
            out[name] = get_device(name).allocator.from_numpy(np.asarray(value, dtype=np.dtype(dtype.np)))
    return out
