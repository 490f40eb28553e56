"""The backend interface: devices, buffers, and the `Backend` that compiles a FUNCTION into an `Executable`.

A backend supplies an allocator (host-visible flat buffers here) and `compile(fn)`, where `fn` is a
FUNCTION(TUPLE(outputs...)) over PARAMs 0..n-1. The `Executable` it returns maps n input buffers to the outputs.

Host-memory backends share three pieces defined here: `HostPool` (blocks reused across calls), `Pending` (the
completion of queued work, carried by the buffers it writes) and `Stream` (one ordered worker thread per device,
which is what makes dispatch asynchronous).
"""
from __future__ import annotations

import atexit
import os
import queue
import sys
import threading
from dataclasses import dataclass
from typing import Callable

import numpy as np

from fnx import dtypes
from fnx.dtypes import DType
from fnx.uop import UOp

ALIGN = 64                   # block alignment in bytes: one cache line, one AVX-512 vector
POOL_PER_SIZE = 4            # blocks of one byte size a pool keeps
POOL_MAX_BYTES = 1 << 30     # bytes a pool keeps in all (free or in use); beyond it numpy's allocator serves
STREAM_DEPTH = 8             # calls queued on a stream before the caller waits (bounds memory held by the queue)


class Pending:
    """Work queued on a `Stream`: `wait()` returns when it has run and raises what it raised."""
    __slots__ = ("done", "error")

    def __init__(self):
        self.done, self.error = threading.Event(), None

    def wait(self) -> None:
        self.done.wait()
        if self.error is not None: raise self.error

    def succeeded(self) -> bool:
        return self.done.is_set() and self.error is None


class Buffer:
    """A flat device allocation of `size` elements of `dtype`. CPU-like devices keep it as a numpy array.

    The numpy array is read-only (kernels write through `ptr`; whoever passes `host` passes a read-only one),
    so host reads hand out views without copying and no one can change an Array's value behind its back.
    `ready` is None once the contents are computed, else the `Pending` work that writes them: `host` and
    `numpy()` wait for it (and raise the error that work raised). A buffer donated to a jitted call is
    deleted: its memory now belongs to that call's output, and reading it raises RuntimeError.
    """
    __slots__ = ("device", "dtype", "size", "_host", "ptr", "ready", "__weakref__")

    def __init__(self, device: str, dtype: DType, size: int, host: np.ndarray | None = None, ptr: int | None = None,
                 ready: Pending | None = None):
        self.device, self.dtype, self.size, self.ready = device, dtype, size, ready
        if host is None:
            host = np.empty(size, dtype=dtype.np)
            host.flags.writeable = False
        self._host = host
        self.ptr: int = host.ctypes.data if ptr is None else ptr  # the address kernels receive

    @staticmethod
    def from_numpy(device: str, array: np.ndarray) -> Buffer:
        flat = np.ascontiguousarray(array).reshape(-1)  # a new view even when no copy is needed
        flat.flags.writeable = False
        return Buffer(device, dtypes.from_numpy(flat.dtype), flat.size, flat)

    @property
    def host(self) -> np.ndarray:
        """The flat host array (read-only), once the work writing it has finished."""
        if self.ready is not None: self.wait()
        if self._host is None: raise self.deleted_error()
        return self._host

    def numpy(self, shape: tuple[int, ...]) -> np.ndarray:
        """A read-only numpy view of the contents in `shape`, once the work writing them has finished."""
        if self.ready is not None: self.wait()
        if self._host is None: raise self.deleted_error(shape)
        return self._host.reshape(shape)

    def wait(self) -> None:
        """Block until the contents are computed; raises the error of the work that computes them."""
        ready = self.ready
        if ready is not None:
            ready.wait()
            self.ready = None

    @property
    def is_deleted(self) -> bool:
        return self._host is None

    def delete(self) -> np.ndarray:
        """Give up the memory (donation): returns the host array, after which this buffer raises when read."""
        host, self._host, self.ptr = self._host, None, 0
        return host

    def deleted_error(self, shape: tuple[int, ...] | None = None) -> RuntimeError:
        what = f"{self.dtype}{list(shape) if shape is not None else [self.size]}"
        return RuntimeError(f"Array has been deleted with shape={what}: it was donated to a jitted call "
                            "(donate_argnums), which reused its memory for an output; use that output instead")

    def __repr__(self) -> str:
        return f"Buffer({self.device}, {self.dtype}, {self.size})"


_probe = [np.empty(0)]
_FREE_REFS = sys.getrefcount(_probe[0])  # what getrefcount(entry[i]) says of an object only its pool entry holds
del _probe


def _free(entry: list) -> bool:
    """Whether a pool entry is unreferenced: its array held by the entry alone, its block by the entry and the
    array (every other view of the block holds the block)."""
    return sys.getrefcount(entry[1]) == _FREE_REFS and sys.getrefcount(entry[0]) == _FREE_REFS + 1


class HostPool:
    """Host memory reused across calls, in blocks keyed by byte size.

    A fresh numpy allocation of a large array comes from mmap, so every call would page-fault its outputs in
    again (writing 64 MB into fresh memory costs about twice as much as into memory touched before); small ones
    pay numpy's allocation and a slow address lookup. An entry is `[block, array, address, dtype, size]`: the
    raw block, the read-only typed array over it that buffers hold (made again only when the type changes),
    and its address. The entry is free when nothing but the pool references the array, and the block only
    through the array: every numpy view of a block (a user's np.asarray of an output) holds the block itself,
    so reference counts tell exactly, and memory a user can still see is never handed out again.

    The pool keeps at most `per_size` blocks of one size and `max_bytes` in all, counting blocks in use; a
    request beyond that is served by numpy and forgotten. Blocks are `ALIGN`-byte aligned.
    """

    def __init__(self, per_size: int = POOL_PER_SIZE, max_bytes: int = POOL_MAX_BYTES):
        self.per_size, self.max_bytes = per_size, max_bytes
        self.blocks: dict[int, list[list]] = {}  # nbytes -> entries
        self.kept_bytes = 0
        self.lock = threading.Lock()

    def array(self, dtype: np.dtype, size: int) -> tuple[np.ndarray, int]:
        """An uninitialized read-only flat array of `size` elements of numpy `dtype`, and its address."""
        nbytes = size * dtype.itemsize
        with self.lock:  # the caller's reference must exist before another thread looks at the entry
            kept = self.blocks.get(nbytes)
            if kept is not None:
                for entry in kept:
                    if _free(entry):
                        if entry[3] is not dtype or entry[4] != size: self._retype(entry, dtype, size)
                        return entry[1], entry[2]
            entry = self._new(nbytes, dtype, size, kept)
            return entry[1], entry[2]

    @staticmethod
    def _retype(entry: list, dtype: np.dtype, size: int) -> None:
        block, offset = entry[0], entry[2] - entry[0].ctypes.data
        entry[1], entry[3], entry[4] = block[offset:offset + size * dtype.itemsize].view(dtype), dtype, size

    def _new(self, nbytes: int, dtype: np.dtype, size: int, kept: list | None) -> list:
        block = np.empty(nbytes + ALIGN, np.uint8)
        block.flags.writeable = False
        start = block.ctypes.data
        entry = [block, None, start + -start % ALIGN, None, 0]
        self._retype(entry, dtype, size)
        if len(kept or ()) >= self.per_size: return entry
        if self.kept_bytes + nbytes > self.max_bytes and not self._evict(self.kept_bytes + nbytes - self.max_bytes):
            return entry
        self.blocks.setdefault(nbytes, []).append(entry)
        self.kept_bytes += nbytes
        return entry

    def _evict(self, need: int) -> bool:
        """Forget free blocks until `need` bytes are released; False when not enough are free."""
        for nbytes, kept in list(self.blocks.items()):
            for entry in [e for e in kept if _free(e)]:
                if need <= 0: break
                kept.remove(entry)
                self.kept_bytes -= nbytes
                need -= nbytes
            if not kept: del self.blocks[nbytes]
        return need <= 0

    def unshared(self, buf: Buffer) -> bool:
        """True when nothing but `buf` (and this pool) can see its memory: no numpy view of it is alive.

        Counted on the buffer's array: the buffer, this function's local, getrefcount's argument, and this pool's
        entry when the pool keeps it; on its base (views of views share the base): the array's reference, the
        local, the argument and the pool's entry again.
        """
        host = buf._host
        if host is None or not host.flags.c_contiguous: return False
        kept = any(entry[1] is host for entry in self.blocks.get(host.nbytes, ()))
        if sys.getrefcount(host) != 3 + kept: return False
        base = host.base
        if base is None: return True
        return isinstance(base, np.ndarray) and base.base is None and sys.getrefcount(base) == 3 + kept

    def in_use(self) -> int:
        """How many kept blocks something still references (for tests and debugging)."""
        with self.lock:
            return sum(not _free(e) for kept in self.blocks.values() for e in kept)


class Stream:
    """One ordered worker thread per device: queued calls run one after another, in the order they were queued.

    Order is what makes it safe: a call reading an earlier call's output runs after it, so only host reads
    (`Buffer.host`, `numpy()`, `wait()`) ever wait. At most `depth` calls are queued; the caller waits beyond.
    """

    def __init__(self, name: str, depth: int = STREAM_DEPTH):
        self.name, self.depth = name, depth
        self._start_empty()
        atexit.register(self.drain)
        os.register_at_fork(before=self.drain, after_in_child=self._start_empty)  # a child has no worker thread

    def _start_empty(self) -> None:
        self.jobs, self.slots = queue.SimpleQueue(), threading.BoundedSemaphore(self.depth)
        self.submitted = self.finished = 0   # finished is written by the worker only, submitted under the lock
        self.lock = threading.Lock()
        self.thread: threading.Thread | None = None

    def idle(self) -> bool:
        return self.finished == self.submitted

    def on_worker(self) -> bool:
        return self.thread is threading.current_thread()

    def submit(self, work: Callable[[], None], pending: Pending) -> None:
        """Queue `work`; `pending` is set when it has run (with its exception, if any)."""
        self.slots.acquire()
        with self.lock:
            if self.thread is None:
                self.thread = threading.Thread(target=self._serve, name=f"fnx-{self.name}", daemon=True)
                self.thread.start()
            self.submitted += 1
            self.jobs.put((work, pending))

    def drain(self) -> None:
        """Wait until everything queued so far has run."""
        if self.idle() or self.on_worker(): return
        done = Pending()
        self.submit(lambda: None, done)
        done.done.wait()

    def _serve(self) -> None:
        while True:
            work, pending = self.jobs.get()
            try:
                work()
            except BaseException as e:  # noqa: BLE001 - handed to whoever reads the results
                pending.error = e
            del work  # drops the call's buffers: its intermediates go back to the pool
            self.finished += 1
            pending.done.set()
            self.slots.release()


class Executable:
    """A compiled FUNCTION: call it with one Buffer per PARAM; it returns one Buffer per output.

    A backend that can write outputs into donated inputs takes `donated` (input indices) in `__call__` and says
    which outputs may go where in `aliases`; the default reuses nothing, and callers pass `donated` only when
    `aliases` is not empty.
    """
    fn: UOp

    def __call__(self, inputs: list[Buffer]) -> list[Buffer]: raise NotImplementedError

    def aliases(self, donated: tuple[int, ...]) -> dict[int, int]:
        """{output buffer id: input index} for the outputs that may be written into donated inputs."""
        return {}

    def as_text(self, stage: str | None = None) -> str: raise NotImplementedError


@dataclass
class Backend:
    name: str
    compile: Callable[[UOp, str], Executable]   # (FUNCTION, device name) -> Executable


_backends: dict[str, Callable[[], Backend]] = {}
_loaded: dict[str, Backend] = {}
_loading = threading.Lock()


def register_backend(platform: str, loader: Callable[[], Backend]) -> None:
    _backends[platform] = loader


def platform_of(device: str) -> str:
    return device.split(":")[0]


def get_backend(device: str) -> Backend:
    """The backend for a device name such as 'cpu', 'cpu:0' or 'interp'."""
    platform = platform_of(device)
    if (loaded := _loaded.get(platform)) is not None: return loaded
    if platform not in _backends:
        raise ValueError(f"unknown device {device!r}; known platforms: {sorted(_backends)}")
    with _loading:  # two threads' first ops: one backend (one thread pool, one memory pool per device)
        if platform not in _loaded: _loaded[platform] = _backends[platform]()
    return _loaded[platform]


def canonical_device(device: str) -> str:
    """'cpu' -> 'cpu:0'; checks that the platform exists (without loading its backend)."""
    if platform_of(device) not in _backends:
        raise ValueError(f"unknown device {device!r}; known platforms: {sorted(_backends)}")
    return device if ":" in device else f"{device}:0"


def _load_cpu() -> Backend:
    from fnx.backends import cpu_llvm
    return cpu_llvm.backend()


def _load_interp() -> Backend:
    from fnx.backends import interp
    return interp.backend()


register_backend("cpu", _load_cpu)
register_backend("interp", _load_interp)
