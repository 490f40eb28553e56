"""The OpenCL backend (pyopencl): `opencl:N` for each device of the first platform that has any (PoCL gives one
on the CPU; a GPU driver gives the GPU).

- memory: `CLBuffer`s (a cl.Buffer each) through `CLAllocator`; copies to and from the host are blocking
  enqueue_copy calls on the device's in-order queue, so they see every kernel queued before;
- code: fnx/backends/c_render.py's OpenCL C (one code-for-op table shared with CUDA); `CLCompiler` builds it with
  the device's compiler and caches the program binary on disk (`ObjectCache`, keyed by source and device);
- kernels: `CLProgram` launches a kernel over the grid of its thread-split loop ((hi - lo) work items, rounded
  up to the work-group size; or (hi - lo) work-groups of the kernel's size when it has work-group ranges) on the
  queue, asynchronously; the generic ReplayExecutable runs the schedule;
- the Target says `grid`: the optimizer gives each kernel's outermost independent loop to the grid.
pyopencl is an optional extra (`pip install 'fnx[opencl]'`): without it, or without a device, the platform reports
no devices and `opencl` is an unknown device only when used.
"""
from __future__ import annotations

import atexit
import contextlib
import os
import shutil
import tempfile
import threading
import weakref

import numpy as np

from fnx.backends import grid_beam
from fnx.backends.c_render import OPENCL, CRenderer
from fnx.backends.device import (POOL_MAX_BYTES, POOL_PER_SIZE, Allocator, Buffer, Compiler, Device, ObjectCache,
                                 Program, Runtime, register_runtime)
from fnx.backends.replay import ReplayExecutable
from fnx.config import config
from fnx.dtypes import DType
from fnx.lower.target import Target
from fnx.uop import UOp


_devices_lock = threading.Lock()
_devices: list | None = None


def _cl_devices() -> list:
    """The OpenCL devices of the first platform that has any ([] without pyopencl or a driver); found once, by the
    first thread that asks (the others wait: one PoCL cache directory a process)."""
    global _devices
    with _devices_lock:
        if _devices is None: _devices = _find_devices()
        return _devices


def _find_devices() -> list:
    try:
        import pyopencl as cl
        with _private_pocl_cache():
            for platform in cl.get_platforms():
                found = platform.get_devices()
                if found: return list(found)
    except Exception:  # noqa: BLE001  (no ICD loader, no platform: no devices)
        return []
    return []


POCL_SLOTS = 64  # PoCL cache directories under fnx's cache, one per live process (`_private_pocl_cache`)
_pocl_slot: list[int] = []  # the open lock file of this process's directory (held until exit)


@contextlib.contextmanager
def _private_pocl_cache():
    """PoCL's kernel cache, one directory per user, is not safe between processes that build the same source at
    once (pocl/pocl#1480): three processes building the same 150 programs crashed one of four times (a segfault
    or a failed build), and a test worker of `pytest -n 2` once crashed in PoCL. So each process takes a directory
    no other live process uses: the first of fnx's cache's `pocl/<n>` whose lock it gets (held until it exits;
    the next process finds the directory warm: PoCL keeps there the machine code of each kernel's work-group
    size, which a program binary from fnx's own cache does not carry), or without a cache (or a lock) one of its
    own, removed at exit. A POCL_CACHE_DIR the user set is used as it is. PoCL reads the variable when it finds
    its devices; it is restored afterwards, so that a child process picks its own."""
    if "POCL_CACHE_DIR" in os.environ:
        yield
        return
    path = _locked_slot()
    if path is None:
        path, owner = tempfile.mkdtemp(prefix="fnx-pocl-"), os.getpid()
        atexit.register(lambda: os.getpid() == owner and shutil.rmtree(path, ignore_errors=True))
    os.environ["POCL_CACHE_DIR"] = path
    try:
        yield
    finally:
        del os.environ["POCL_CACHE_DIR"]


def _locked_slot() -> str | None:
    """The first of `<fnx cache>/pocl/<n>` (n < POCL_SLOTS) whose lock file this process could lock, or None."""
    try:
        import fcntl
    except ImportError:  # (not POSIX)
        return None
    if not config.cache_dir: return None
    for n in range(POCL_SLOTS):
        path = os.path.join(config.cache_dir, "pocl", str(n))
        try:
            os.makedirs(path, exist_ok=True)
            fd = os.open(os.path.join(path, ".lock"), os.O_CREAT | os.O_RDWR, 0o600)
        except OSError:
            return None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:  # another live process uses it
            os.close(fd)
            continue
        _pocl_slot.append(fd)
        return path
    return None


class CLBuffer(Buffer):
    """A device allocation: `handle` is the cl.Buffer (at least one byte: OpenCL has no empty buffers)."""
    __slots__ = ("handle",)
    in_host_memory = False

    def __init__(self, device: str, dtype: DType, size: int, handle):
        self.device, self.dtype, self.size, self.ready, self.handle = device, dtype, size, None, handle
        self._host, self.ptr = None, 1  # (not host memory: no address; 1 so that `not ptr` means deleted)

    @property
    def is_deleted(self) -> bool:
        return self.handle is None

    def __del__(self):
        if self.handle is None or not _allocators: return  # (at interpreter exit the module's globals are gone)
        if (allocator := _allocators.get(self.device)) is not None: allocator.release(self.handle)

    def wait(self) -> None:
        """Until the device has run everything queued so far (kernels are enqueued asynchronously)."""
        _allocators[self.device].queue.finish()

    @property
    def host(self) -> np.ndarray:
        raise TypeError(f"{self.device}: device memory has no host view; read it with its allocator's copyout")

    def numpy(self, shape: tuple[int, ...]) -> np.ndarray:
        return _allocators[self.device].copyout(self).reshape(shape)


_allocators: dict[str, CLAllocator] = {}


class CLAllocator(Allocator):
    def __init__(self, device: str, context, queue):
        import pyopencl as cl
        self.cl, self.device, self.context, self.queue = cl, device, context, queue
        self.free: dict[int, list] = {}  # byte size -> cl.Buffers of dead CLBuffers
        self.kept_bytes = 0
        _allocators[device] = self

    def alloc(self, dtype: DType, size: int) -> CLBuffer:
        nbytes = max(1, size * dtype.itemsize)
        kept = self.free.get(nbytes)
        if kept:
            self.kept_bytes -= nbytes
            return CLBuffer(self.device, dtype, size, kept.pop())
        handle = self.cl.Buffer(self.context, self.cl.mem_flags.READ_WRITE, nbytes)
        return CLBuffer(self.device, dtype, size, handle)

    def release(self, handle) -> None:
        """A dead buffer's memory, kept for the next allocation of its size (a new cl.Buffer of 64 MiB cost PoCL
        more than the kernel writing it: W1's 16M-float x*a+b took 34 ms unpooled). The queue is in order, so a
        kernel queued before still reads or writes it before any later user."""
        kept = self.free.setdefault(handle.size, [])
        if len(kept) < POOL_PER_SIZE and self.kept_bytes + handle.size <= POOL_MAX_BYTES:
            kept.append(handle)
            self.kept_bytes += handle.size

    def copyin(self, dst: Buffer, host: np.ndarray) -> None:
        if dst.size: self.cl.enqueue_copy(self.queue, dst.handle, np.ascontiguousarray(host), is_blocking=True)

    def copyout(self, src: Buffer) -> np.ndarray:
        out = np.empty(src.size, src.dtype.np)
        if src.size: self.cl.enqueue_copy(self.queue, out, src.handle, is_blocking=True)
        out.flags.writeable = False
        return out

    def copy(self, dst: Buffer, src: Buffer) -> None:
        if src.size: self.cl.enqueue_copy(self.queue, dst.handle, src.handle, byte_count=src.size * src.dtype.itemsize)

    def transfer(self, dst: Buffer, src: Buffer) -> bool:
        """A copy between buffers of this device (other devices go through the host)."""
        if src.device != self.device or not isinstance(src, CLBuffer): return False
        self.copy(dst, src)
        return True


SOURCE_MAGIC = b"fnx-opencl-source\n"  # a "binary" that is the program's source (`CLCompiler.keeps_source`)


class CLCompiler(Compiler):
    """OpenCL C -> the device's program binary (cached on disk by source and device).

    On PoCL the "binary" is the source itself (`SOURCE_MAGIC` + source), built again when a kernel of it is first
    launched: asking PoCL for a program's binary has it generate machine code for every kernel of the program
    (2 s for a 9x9 Hessenberg program's, 10 of the test's 24 s), code that no launch runs (PoCL compiles each
    kernel again for the work-group size it is launched with). The program built here is handed to the launch
    that follows (`last`), so that it is not built twice (0.14 s a build even when PoCL's cache has it)."""

    def __init__(self, cache: ObjectCache, context, device):
        super().__init__(cache)
        self.context, self.device = context, device
        self.keeps_source = device.platform.name == "Portable Computing Language"
        self.last: tuple = (None, None)  # (binary, its built program): the latest built from source, until launched

    def compile_uncached(self, source: str) -> bytes:
        program = build(self.context, source, self.device.name)
        if self.keeps_source:
            binary = SOURCE_MAGIC + source.encode()
            self.last = (binary, program)
            return binary
        import pyopencl as cl
        return bytes(program.get_info(cl.program_info.BINARIES)[0])


def build(context, source: str, device_name: str):
    """The program of OpenCL C `source`, built (a failed build raises naming the device and the compiler's log)."""
    import pyopencl as cl
    try:
        return cl.Program(context, source).build(options=["-cl-std=CL1.2"])
    except cl.RuntimeError as err:
        raise RuntimeError(f"OpenCL build failed on {device_name}: {err}") from None


class CLProgram(Program):
    """One kernel of a built program: `program(*buffers, dims=(lo, hi))` runs iterations lo..hi of its grid loop."""

    def __init__(self, name: str, kernel, queue, local: int, built=None):
        self.name, self.kernel, self.queue, self.local = name, kernel, queue, local
        self.built = built  # the built program, alive while a kernel of it is (CLDevice._built holds it weakly)

    def __call__(self, *buffers: Buffer, dims: tuple = (0, 1)) -> None:
        lo, hi, *group = dims  # (group: the kernel's work-group size; one group per iteration of the grid loop)
        count = max(hi - lo, 1)
        local = group[0] if group else min(self.local, count)
        size = count * local if group else -(-count // local) * local
        self.kernel(self.queue, (size,), (local,), *[b.handle for b in buffers], np.int64(lo), np.int64(hi))


def _target(device) -> Target:
    """The grid device's facts, read from it."""
    import pyopencl as cl
    return Target(device.name, "", "", vector_bytes=4, vector_registers=16, fma=True,
                  l1_bytes=int(device.get_info(cl.device_info.LOCAL_MEM_SIZE)),
                  l2_bytes=int(device.get_info(cl.device_info.GLOBAL_MEM_CACHE_SIZE) or 0), l3_bytes=0,
                  cores=int(device.get_info(cl.device_info.MAX_COMPUTE_UNITS)), threads=1, grid=True,
                  local_size=max(1, min(64, int(device.get_info(cl.device_info.MAX_WORK_GROUP_SIZE)))))


class CLDevice(Device):
    def __init__(self, ordinal: int):
        import pyopencl as cl
        device = _cl_devices()[ordinal]
        self.cl_device = device
        self.context = cl.Context([device])
        self.queue = cl.CommandQueue(self.context, device)
        name = f"opencl:{ordinal}"
        target = _target(device)
        key = f"opencl {device.platform.name} {device.name} {device.version} {device.driver_version} {target.key}"
        super().__init__("opencl", ordinal, CLAllocator(name, self.context, self.queue), target=target,
                         renderer=CRenderer(OPENCL),
                         compiler=CLCompiler(ObjectCache(config.cache_dir, key, suffix=".clbin"), self.context, device))
        # built programs by binary, while an executable uses them: a dict kept every program the process ever built
        # (about a megabyte each on PoCL: gigabytes over the test suite)
        self._built: weakref.WeakValueDictionary = weakref.WeakValueDictionary()

    def executable(self, fn: UOp) -> ReplayExecutable:
        return ReplayExecutable(fn, self)

    def synchronize(self) -> None:
        self.queue.finish()

    def kernel_timers(self):
        return grid_beam.kernel_timers(self)

    def program(self, name: str, binary: bytes) -> CLProgram:
        import pyopencl as cl
        built = self._built.get(binary)
        if built is None: built = self._built[binary] = self._build(binary)
        return CLProgram(name, cl.Kernel(built, name), self.queue, self.target.local_size, built)

    def _build(self, binary: bytes):
        """The built program of a binary: the compiler's latest build when it is that one (taken: the executable
        holds it now, and it dies with the executable), else built from the source or the driver's binary."""
        import pyopencl as cl
        last_binary, last = self.compiler.last
        if last_binary == binary:
            self.compiler.last = (None, None)
            return last
        if binary.startswith(SOURCE_MAGIC): return build(self.context, binary[len(SOURCE_MAGIC):].decode(),
                                                         self.cl_device.name)
        return cl.Program(self.context, [self.cl_device], [binary]).build()


register_runtime(Runtime("opencl", lambda: len(_cl_devices()), CLDevice))
