"""The runtime interface every backend implements (docs/RUNTIME.md says how to add one).

A `Device` ('cpu:3') names a runtime and an ordinal and owns an `Allocator` (its memory), a `Renderer` (linear
kernels -> source), a `Compiler` (source -> binary, cached on disk by source and target), `Program`s (a binary's
kernels, launched with recorded dimensions) and a `Target` (what the lowering reads). `device.executable(fn)`
turns a FUNCTION(TUPLE(outputs...)) over PARAMs 0..n-1 into an `Executable`: a recorded schedule of items
(kernel launches, transfers, host steps) over numbered buffers that the runtime replays.

A backend module registers a `Runtime` (how many devices its platform has, and how to make one) when imported;
nothing here imports a backend. Host-memory backends share `HostPool` (blocks reused across calls), `Pending`
(the completion of queued work, carried by the buffers it writes) and `Stream` (one ordered worker thread per
device, which is what makes dispatch asynchronous).
"""
from __future__ import annotations

import atexit
import collections
import ctypes
import hashlib
import os
import queue
import sys
import threading
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

from fnx import dtypes, events
from fnx.lower.chain import RowChain
from fnx.cache_files import write_atomically
from fnx.config import config
from fnx.dtypes import DType
from fnx.errors import UnsupportedError
from fnx.uop import UOp

ALIGN = 64                   # block alignment in bytes: one cache line, one AVX-512 vector
PAGE = 4096                  # large blocks start at staggered offsets within a page (HostPool._new)
STAGGER_MIN = 1 << 16        # bytes from which a block is staggered
POOL_PER_SIZE = 32           # blocks of one byte size a pool keeps (a sharded step holds many alike)
POOL_SCAN = 4                # entries of a size a request looks at before making a block: a loop that keeps every
                             # result (`losses.append(loss)`) holds all of them, and each call looked at all 32
                             # (a jitted scalar loss 3.7 us a call, 10.3 when kept); from where the last free one
                             # was, which a loop that drops its results finds first
POOL_MAX_BYTES = 1 << 30     # bytes a pool keeps in all (free or in use); beyond it numpy's allocator serves
TINY_BYTES = ALIGN           # a copy of host data this small (a scalar constant, an eager op's Python number) is an
                             # array of its own, not a pool block: kept by the constant caches, they held every
                             # block of their size, and each new value then made a block the pool could not keep
                             # (8.7 us of an eager `x > i / 100`'s 38; numpy's own array 2 us)
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
    is_sharded = False  # (a fnx.sharding.ShardedBuffer is the memory of an array laid out over a mesh)
    in_host_memory = True  # (False for a GPU's or an OpenCL device's memory, read only through copyout)

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
        self.cursor: dict[int, int] = {}  # nbytes -> the entry a request of that size looks at first
        self.kept_bytes = 0
        self.made = 0  # blocks made so far (their stagger)
        self.lock = threading.Lock()

    def array(self, dtype: np.dtype, size: int) -> tuple[np.ndarray, int]:
        """An uninitialized read-only flat array of `size` elements of numpy `dtype`, and its address."""
        nbytes = size * dtype.itemsize
        with self.lock:  # the caller's reference must exist before another thread looks at the entry
            kept = self.blocks.get(nbytes)
            if kept:  # (at most POOL_SCAN entries, from where the last free one was: see POOL_SCAN)
                n, start = len(kept), self.cursor.get(nbytes, 0)
                for k in range(min(n, POOL_SCAN)):
                    entry = kept[(start + k) % n]
                    if _free(entry):
                        self.cursor[nbytes] = (start + k) % n
                        if entry[3] is not dtype or entry[4] != size: self._retype(entry, dtype, size)
                        return entry[1], entry[2]
                self.cursor[nbytes] = (start + POOL_SCAN) % n
            if nbytes <= TINY_BYTES and len(kept or ()) >= self.per_size:  # (one the pool would not keep: plain
                return _tiny(dtype, size)                                  # numpy, not an aligned block)
            entry = self._new(nbytes, dtype, size, kept)
            return entry[1], entry[2]

    @staticmethod
    def _retype(entry: list, dtype: np.dtype, size: int) -> None:
        block, offset = entry[0], entry[2] - entry[0].ctypes.data
        entry[1], entry[3], entry[4] = block[offset:offset + size * dtype.itemsize].view(dtype), dtype, size

    def _new(self, nbytes: int, dtype: np.dtype, size: int, kept: list | None) -> list:
        """A new block. Large ones start at different offsets within a page: blocks of one size all came out of
        mmap at one offset, so a kernel streaming from one into another (every chained call: its input is an
        earlier output) had loads and stores 4 KiB apart, which the CPU takes for a possible store-to-load
        dependency (4K aliasing): gelu over 16M floats from one pool block into another took 11.3 ms instead of
        8.2 ms from a fresh array. Consecutive blocks start 5 cache lines apart within a page, wherever the
        allocator put them (glibc serves large blocks from its heap, at any offset, once frees raised its mmap
        threshold)."""
        stagger = nbytes >= STAGGER_MIN
        block = np.empty(nbytes + ALIGN + (PAGE if stagger else 0), np.uint8)
        block.flags.writeable = False
        start = block.ctypes.data
        self.made += 1
        first = start + -start % ALIGN
        if stagger: first += (5 * ALIGN * self.made - first) % PAGE  # (an ALIGN multiple: both terms are)
        entry = [block, None, first, None, 0]
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
                del kept[next(i for i, e in enumerate(kept) if e is entry)]  # (== on entries compares arrays)
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


class LRUCache:
    """A mapping bounded to `size` entries that forgets the least recently used one first: compiled code costs
    memory (an LLVM engine per executable), and a process that keeps making new graphs must not keep them all.
    (functools.lru_cache memoizes a function of its arguments; here the key is not the whole argument.)"""

    def __init__(self, size: int):
        self.size, self.entries, self.lock = size, collections.OrderedDict(), threading.Lock()

    def get(self, key: Any) -> Any:
        with self.lock:
            value = self.entries.get(key)
            if value is not None: self.entries.move_to_end(key)
            return value

    def put(self, key: Any, value: Any) -> Any:
        with self.lock:
            self.entries[key] = value
            self.entries.move_to_end(key)
            while len(self.entries) > self.size: self.entries.popitem(last=False)
            return value

    def __len__(self) -> int:
        return len(self.entries)


# ---- the pieces a device is made of ----

class Allocator:
    """A device's memory: allocation, host transfers, and copies between buffers.

    `alloc` returns an uninitialized buffer; `copyin` fills one from host memory, `copyout` returns its contents
    as a read-only host array; `copy` copies between two buffers of this device; `transfer` is the fast path for
    a copy from another device's buffer where the runtime has one (it returns False when it has none: the caller
    then goes through the host).
    """
    device: str

    def alloc(self, dtype: DType, size: int) -> Buffer: raise NotImplementedError
    def copyin(self, dst: Buffer, host: np.ndarray) -> None: raise NotImplementedError
    def copyout(self, src: Buffer) -> np.ndarray: raise NotImplementedError
    def copy(self, dst: Buffer, src: Buffer) -> None: raise NotImplementedError

    def transfer(self, dst: Buffer, src: Buffer) -> bool:
        return False

    def from_numpy(self, array: np.ndarray) -> Buffer:
        """A new buffer holding a copy of `array`."""
        flat = np.ascontiguousarray(array).reshape(-1)
        buf = self._copy_target(dtypes.from_numpy(flat.dtype), flat.size)
        self.copyin(buf, flat)
        return buf

    def _copy_target(self, dtype: DType, size: int) -> Buffer:
        """The buffer `from_numpy` fills: an ordinary allocation."""
        return self.alloc(dtype, size)

    def scalar(self, value: bool | int | float | complex, dtype: DType) -> Buffer:
        """A new one-element buffer holding `value` (already a value of `dtype`: uop.scalar_of) as `dtype`."""
        return self.from_numpy(np.array(value, dtype.np))


_SCALAR = ctypes.c_double * 2  # room for any scalar (complex128), aligned for it


def _tiny(dtype: np.dtype, size: int) -> tuple[np.ndarray, int]:
    """An uninitialized read-only array of its own (numpy aligns it for any scalar load) and its address."""
    host = np.empty(size, dtype)
    host.flags.writeable = False
    return host, host.ctypes.data


class HostAllocator(Allocator):
    """Host memory (the cpu devices, interp, test backends): a buffer's storage is a read-only numpy array and
    kernels write through its address. Blocks come from the device's `HostPool` when it has one."""

    def __init__(self, device: str, pool: HostPool | None = None):
        self.device, self.pool = device, pool

    def alloc(self, dtype: DType, size: int) -> Buffer:
        if self.pool is None: return Buffer(self.device, dtype, size)
        host, ptr = self.pool.array(dtype.np, size)
        return Buffer(self.device, dtype, size, host, ptr)

    def _copy_target(self, dtype: DType, size: int) -> Buffer:
        if size * dtype.itemsize > TINY_BYTES: return self.alloc(dtype, size)
        return Buffer(self.device, dtype, size, *_tiny(dtype.np, size))  # (not a pool block: see TINY_BYTES)

    def scalar(self, value: bool | int | float | complex, dtype: DType) -> Buffer:
        # an eager op's new Python number (see TINY_BYTES): 16 bytes of ctypes' own, whose address is one call
        # away (a numpy array's `ctypes.data` took 1.2 of the 1.9 us)
        raw = _SCALAR()
        address = ctypes.addressof(raw)
        if address % dtype.itemsize: return super().scalar(value, dtype)  # (kernels load it `align itemsize`)
        host = np.frombuffer(raw, dtype.np, 1)
        host[0] = value
        host.flags.writeable = False
        return Buffer(self.device, dtype, 1, host, address)

    def copyin(self, dst: Buffer, host: np.ndarray) -> None:
        src = np.ascontiguousarray(host, dtype=dst.dtype.np).reshape(-1)
        if src.size != dst.size: raise ValueError(f"copyin: {src.size} elements into a buffer of {dst.size}")
        if not dst.ptr: raise dst.deleted_error()
        ctypes.memmove(dst.ptr, src.ctypes.data, src.nbytes)

    def copyout(self, src: Buffer) -> np.ndarray:
        return src.host

    def copy(self, dst: Buffer, src: Buffer) -> None:
        self.copyin(dst, src.host)

    def transfer(self, dst: Buffer, src: Buffer) -> bool:
        """Between devices of one host-memory platform (cpu:0 -> cpu:3) a transfer is a memcpy; from another
        platform, whose memory this allocator knows nothing of, the caller goes through its copyout."""
        if platform_of(src.device) != platform_of(self.device): return False
        self.copyin(dst, src.host)
        return True


class Renderer:
    """Linear kernels -> source text of the device's language (one source may hold several kernels)."""

    def render(self, kernels: list) -> str: raise NotImplementedError


class Compiler:
    """Source -> binary, with the content-addressed disk cache (`ObjectCache`) keyed by source and target."""

    def __init__(self, cache: ObjectCache):
        self.cache = cache

    def compile(self, source: str) -> bytes:
        key = self.cache.key(source)
        binary = self.cache.load(key)
        if binary is None:
            self.cache.misses += 1
            binary = self.compile_uncached(source)
            self.cache.store(key, binary)
        else:
            self.cache.hits += 1
        return binary

    def compile_uncached(self, source: str) -> bytes: raise NotImplementedError


class Program:
    """One kernel of a binary, ready to launch: `program(*buffers, dims=...)` with the launch dimensions the
    schedule recorded (the CPU's: the range of the outer loop a call runs)."""
    name: str

    def __call__(self, *buffers: Buffer, dims: tuple = ()) -> None: raise NotImplementedError


class ObjectCache:
    """Compiled code on disk, content-addressed by the source and the target (and the compiler's version).

    A file is `MAGIC + key + sha256(key + object) + object`, written to a temporary name and renamed (atomic).
    A read checks the digest and that the key it carries is the one asked for (the key hashes the target and the
    source), so a damaged file, or a valid one stored under another key's name, is ignored and recompiled instead
    of being run. Nothing is ever unpickled.
    """
    MAGIC = b"fnx-object-2\n"

    def __init__(self, directory: str | None, target_id: str, suffix: str = ".o"):
        self.directory, self.target_id, self.suffix = directory, target_id, suffix
        self.hits = self.misses = 0

    def key(self, source: str) -> str:
        return hashlib.sha256(f"{self.target_id}\n{source}".encode()).hexdigest()

    def path(self, key: str) -> str:
        return os.path.join(self.directory, key[:2], key + self.suffix)

    def load(self, key: str) -> bytes | None:
        if self.directory is None: return None
        try:
            with open(self.path(key), "rb") as f: data = f.read()
        except OSError:
            return None
        head = self.MAGIC + key.encode()
        n = len(head)
        digest, obj = data[n:n + 32], data[n + 32:]
        return obj if data[:n] == head and hashlib.sha256(head + obj).digest() == digest else None

    def store(self, key: str, obj: bytes) -> None:
        head = self.MAGIC + key.encode()
        if self.directory is None: return
        write_atomically(self.path(key), head + hashlib.sha256(head + obj).digest() + obj)


# ---- executables: recorded schedules ----

@dataclass(frozen=True)
class Launch:
    """Run kernel `kernel` of `device` on schedule buffers `buffers`, over launch dimensions `dims`."""
    kernel: str
    device: str
    buffers: tuple[int, ...]
    dims: tuple

    def text(self) -> str:
        return f"launch {self.kernel} on {self.device} buffers {list(self.buffers)} dims {list(self.dims)}"


@dataclass(frozen=True)
class Transfer:
    """Copy buffer `src` (on `src_device`) into buffer `dst` (on `device`)."""
    dst: int
    src: int
    device: str
    src_device: str

    def text(self) -> str:
        return f"copy buffer {self.src} ({self.src_device}) -> buffer {self.dst} ({self.device})"


@dataclass(frozen=True)
class HostCall:
    """A step the runtime does on the host: a control-flow node whose bodies are compiled functions."""
    name: str
    device: str
    inputs: tuple[int, ...]
    outputs: tuple[int, ...]

    def text(self) -> str:
        return f"host {self.name} on {self.device} buffers {list(self.inputs)} -> {list(self.outputs)}"


def check_platform(items: list, device: str) -> None:
    """An executable's kernels run on its own platform: a COPY to another platform inside one compiled function may
    only feed the function's outputs (its kernels would otherwise be compiled for the wrong device)."""
    for item in items:
        if isinstance(item, Launch) and platform_of(item.device) != platform_of(device):
            raise UnsupportedError(f"a function compiled for {device} computes on {item.device} after a device_put "
                                   f"(kernel {item.kernel}): a compiled function runs its kernels on one platform; "
                                   f"call device_put outside the jitted function and compute on {item.device} "
                                   "there")


class Executable:
    """A compiled FUNCTION: a recorded schedule of `items` (Launch, Transfer, HostCall) over numbered buffers, which
    the device's runtime replays. Call it with one Buffer per PARAM; it returns one Buffer per output.

    `buffers` describes every buffer of a call (its BufferSpec: dtype, size, kind, device); inputs come first.
    A backend that can write outputs into donated inputs takes `donated` (input indices) in `__call__` and says
    which outputs may go where in `aliases`; the default reuses nothing, and callers pass `donated` only when
    `aliases` is not empty.
    """
    fn: UOp
    device: str
    items: list = []
    buffers: list = []
    output_ids: list[int] = []
    label: str = "eager"  # whose program it is in FNX_DEBUG and the profiler: the jitted function's name

    def kernel_event(self, kernel: Any, start: float) -> None:
        """Report one launch of `kernel` (a lowered Kernel) that began at `start` and has finished: its name within
        this executable's function, shape, estimated bytes and FLOPs (see fnx.events)."""
        flops, moved = self.lowering.cost(kernel)
        if isinstance(kernel, RowChain):  # (its kernels run interleaved: one event)
            events.finished("kernel", f"{self.label}:{kernel.name}", start, device=self.device, bytes=moved,
                            flops=flops, loops=[kernel.rows], actions=[f"ROW_CHAIN({len(kernel.members)}, "
                                                                       f"{kernel.block})"])
            return
        events.finished("kernel", f"{self.label}:{kernel.name}", start, device=self.device, bytes=moved,
                        flops=flops, loops=[r.arg.size for r in kernel.ranges + kernel.reduce_ranges],
                        actions=list(kernel.opts))

    def transfer_event(self, source: Buffer, device: str, start: float) -> None:
        events.finished("transfer", f"{self.label}: {source.device} -> {device}", start,
                        bytes=source.size * source.dtype.itemsize, src=source.device, dst=device)

    def __call__(self, inputs: list[Buffer]) -> list[Buffer]: raise NotImplementedError

    def aliases(self, donated: tuple[int, ...]) -> dict[int, int]:
        """{output buffer id: input index} for the outputs that may be written into donated inputs."""
        return {}

    def call_async(self, inputs: list[Buffer]) -> list[Buffer]:
        """Like a call, but handing the work to the device's queue even when it is small: the caller is about to
        start other devices' work (a mesh's stage) and wants them to run at once. The default runs the call."""
        return self(inputs)

    def items_text(self) -> str:
        """The recorded schedule, one item per line, after the buffers it uses."""
        lines = [f"executable on {self.device}: {len(self.buffers)} buffers, outputs {list(self.output_ids)}"]
        lines += [f"  buffer {i}: {spec.kind} {spec.dtype}[{spec.size}]" + (f" on {spec.device}" if spec.device not in (
            None, self.device) else "") for i, spec in enumerate(self.buffers)]
        lines += [f"  {item.text()}" for item in self.items]
        return "\n".join(lines)

    def as_text(self, stage: str | None = None) -> str: raise NotImplementedError


# ---- devices and the runtimes that provide them ----

@dataclass
class Processes:
    """Which of the processes of a run this one is: `index` of `count` (0 of 1, unless fnx.distributed.initialize
    found more under mpirun). A runtime that spans processes numbers its devices over all of them."""
    index: int = 0
    count: int = 1


processes = Processes()


class Device:
    """One device: a runtime (`platform`) and an ordinal (`id`), named like 'cpu:3'.

    It owns an `allocator` (its memory), a `target` (what the lowering reads: vector width, caches, threads; None
    for a device that does not lower, like interp) and, for a device that compiles kernels, a `renderer` and a
    `compiler`. `executable(fn)` builds the Executable of a FUNCTION; `compile(fn)` is the cached form every
    caller uses (an LRU of config.executables entries shared by all devices). `process_index` is the process that
    owns it and `addressable` whether that is this one (a `RemoteDevice` stands for another process's device).
    """
    addressable = True

    def __init__(self, platform: str, ordinal: int, allocator: Allocator, target: Any = None,
                 renderer: Renderer | None = None, compiler: Any = None):
        self.platform, self.id, self.allocator, self.target = platform, ordinal, allocator, target
        self.renderer, self.compiler = renderer, compiler
        self.name = f"{platform}:{ordinal}"
        self.process_index = processes.index

    device_kind = property(lambda self: self.platform)

    def executable(self, fn: UOp) -> Executable:
        """The Executable of FUNCTION `fn` (uncached; fnx.backends.replay.ReplayExecutable is the generic one)."""
        raise NotImplementedError

    def program(self, name: str, binary: Any) -> Program:
        """Kernel `name` of a binary the compiler made (used by the generic replay)."""
        raise NotImplementedError

    def synchronize(self) -> None:
        """Wait until the work queued on this device has finished (the profiler times kernels so); host devices
        run their kernels synchronously."""

    def kernel_timers(self) -> Callable | None:
        """What FNX_BEAM times schedules with: `measure(kernel, target)` returns `timer(kernels) -> seconds` that
        runs them on this device; None when the device cannot time kernels (BEAM then keeps the heuristics)."""
        return None

    def compile(self, fn: UOp) -> Executable:
        """The cached Executable of FUNCTION `fn` on this device (compiled on first use)."""
        key = (fn.src[0], tuple((a.dtype, a.shape) for a in fn.src[1:]), self.name)  # unused inputs count too
        if (exe := _executables.get(key)) is not None:
            if events.active: events.instant("cache", f"{events.current_name()} on {self.name}: compiled program "
                                             "reused (same graph)")
            return exe
        cache = getattr(self.compiler, "cache", None)
        hits, misses = (cache.hits, cache.misses) if cache is not None else (0, 0)
        with events.span("compile", f"{events.current_name()} on {self.name}") as found:
            exe = self.executable(fn)
            exe.label = events.current_name()
            kernels = [item for item in exe.items if isinstance(item, Launch)]
            found.update(kernels=len(kernels))
            if cache is not None: found.update(cache_hits=cache.hits - hits, cache_misses=cache.misses - misses)
        return _executables.put(key, exe)

    def __repr__(self) -> str:
        return f"{self.platform.capitalize()}Device(id={self.id})"

    def __reduce__(self):  # a device pickles as its name (a process has one object per device)
        return (get_device, (self.name,))


_executables = LRUCache(config.executables)


class RemoteDevice(Device):
    """A device of another process (fnx.distributed): it has a name, an ordinal and an owner, and takes part in
    meshes, but its memory and its computations belong to its process, so using either here raises ValueError."""
    addressable = False
    target = renderer = compiler = None

    def __init__(self, platform: str, ordinal: int, process_index: int):
        self.platform, self.id, self.process_index = platform, ordinal, process_index
        self.name = f"{platform}:{ordinal}"

    def _not_here(self, what: str) -> ValueError:
        return ValueError(f"{self.name} belongs to process {self.process_index} and this is process "
                          f"{processes.index}: {what} only on this process's devices (fnx.local_devices()); an array "
                          "over several processes is laid out by a NamedSharding over a mesh")

    @property
    def allocator(self) -> Allocator:
        raise self._not_here("arrays can be placed")

    def executable(self, fn: UOp) -> Executable:
        raise self._not_here("computations can run")

    def compile(self, fn: UOp) -> Executable:
        raise self._not_here("computations can run")

    def program(self, name: str, binary: Any) -> Program:
        raise self._not_here("kernels can run")


@dataclass(frozen=True)
class SingleDeviceSharding:
    """The sharding of an array that lives whole on one device."""
    device: Device

    @property
    def device_set(self) -> set[Device]:
        return {self.device}


class Runtime:
    """A platform's devices: `count()` of them (known without starting the runtime), made on first use by
    `load(ordinal)`. A backend module registers one with `register_runtime` when it is imported. A runtime whose
    devices span processes says which is this process's first (`first_local()`: what a bare 'cpu' names)."""

    def __init__(self, platform: str, count: Callable[[], int], load: Callable[[int], Device],
                 first_local: Callable[[], int] = lambda: 0):
        self.platform, self.count, self._load, self.first_local = platform, count, load, first_local
        self._devices: dict[int, Device] = {}
        self._lock = threading.Lock()

    def started(self) -> bool:
        """Whether a device of this platform was made (something has used it)."""
        return bool(self._devices)

    def device(self, ordinal: int) -> Device:
        if (found := self._devices.get(ordinal)) is not None: return found
        with self._lock:  # two threads' first ops: one device (one memory pool, one queue)
            if ordinal not in self._devices: self._devices[ordinal] = self._load(ordinal)
        return self._devices[ordinal]


_runtimes: dict[str, Runtime] = {}


def register_runtime(runtime: Runtime) -> None:
    _runtimes[runtime.platform] = runtime


def platform_of(device: str) -> str:
    return device.split(":")[0]


def canonical_device(device: str) -> str:
    """'cpu' -> 'cpu:0' (this process's first cpu device under fnx.distributed); ValueError for an unknown platform
    or an ordinal the platform does not have (checked without starting the platform's runtime)."""
    platform, _, ordinal = device.partition(":")
    runtime = _runtimes.get(platform)
    if runtime is None:
        raise ValueError(f"unknown device {device!r}; known platforms: {sorted(_runtimes)}")
    if not ordinal: return f"{platform}:{runtime.first_local()}"
    count = runtime.count()
    if not ordinal.isdigit() or int(ordinal) >= count:
        more = " (FNX_CPU_DEVICES sets how many cpu devices there are)" if platform == "cpu" else ""
        raise ValueError(f"device {device!r} does not exist: {platform} has {count} device"
                         f"{'s' if count != 1 else ''} ({', '.join(f'{platform}:{i}' for i in range(count))}){more}")
    return f"{platform}:{int(ordinal)}"


def get_device(device: str) -> Device:
    """The Device for a name such as 'cpu', 'cpu:3' or 'interp' (starting its runtime on first use)."""
    name = canonical_device(device)
    platform, _, ordinal = name.partition(":")
    return _runtimes[platform].device(int(ordinal))


_holding: dict[str, Device] = {}


def device_of(buffer: Buffer) -> Device:
    """The Device whose memory holds `buffer` (it exists: the buffer was made there; looked up once per name)."""
    device = _holding.get(buffer.device)
    if device is None: device = _holding[buffer.device] = get_device(buffer.device)
    return device


def platform_devices(platform: str) -> list[Device]:
    """Every device of a platform, in ordinal order."""
    if platform not in _runtimes:
        raise ValueError(f"unknown backend {platform!r}; known platforms: {sorted(_runtimes)}")
    runtime = _runtimes[platform]
    return [runtime.device(i) for i in range(runtime.count())]


def started_platforms() -> list[str]:
    """The platforms some device of which was made (something has placed an array or run a computation there)."""
    return sorted(p for p, runtime in _runtimes.items() if runtime.started())


def platforms() -> list[str]:
    return sorted(_runtimes)
