"""The CUDA backend: `cuda:N` for each NVIDIA GPU, through NVRTC and the driver API (pip `cuda-bindings` and
`nvidia-cuda-nvrtc-cu12`: `pip install 'fnx[cuda]'`).

- code: fnx/backends/c_render.py's CUDA C (one code-for-op table shared with OpenCL); `CUDACompiler` compiles it
  with NVRTC for the GPU's own architecture (`sm_90` on an H100/H200) into a CUBIN, which any driver of the same
  CUDA major version loads without a JIT step, and caches it on disk (`ObjectCache`, keyed by the source, the
  architecture, the options and NVRTC's version). `--fmad=false`: a product and a sum stay two rounded ops, as on
  every other backend;
- memory: `CUDABuffer`s (a device pointer each) from the device's stream-ordered pool (cuMemAllocAsync /
  cuMemFreeAsync), copies to and from the host and within the device queued on the device's stream; `copyout`
  waits for the stream, so it sees every kernel queued before;
- kernels: `CUDAProgram` launches a kernel over the grid of its thread-split loop, ceil((hi - lo) / block) blocks
  of `target.local_size` threads, asynchronously on the stream; the generic ReplayExecutable runs the schedule;
- the Target says `grid` (the optimizer gives each kernel's outermost independent loop to the grid), and the
  SM count, shared memory and L2 read from the device.

Without a GPU (no driver, or no device) but with NVRTC installed, the platform has one **compile-only** device,
`cuda:0`: it lowers, renders and compiles for `FNX_CUDA_ARCH` (default sm_90) into PTX, so
`fnx.jit(f, backend="cuda").lower(x).as_text("source")` (or `"ptx"`) works on any machine, and CI compiles every
kernel with NVRTC; placing an array on it or running anything raises RuntimeError. `device.compile_only` says
which kind a device is. Without NVRTC and without a GPU, `cuda` has no devices. Nothing here starts the driver
at import.
"""
from __future__ import annotations

import ctypes
import functools
import hashlib
import re
import threading
import weakref

import numpy as np

from fnx.backends import dlpack, grid_beam
from fnx.backends.c_render import CUDA, CRenderer
from fnx.backends.device import (Allocator, Buffer, Compiler, Device, ObjectCache, Program, Runtime,
                                 register_runtime)
from fnx.backends.replay import ReplayExecutable
from fnx.config import config
from fnx.dtypes import DType
from fnx.lower.target import Target
from fnx.uop import UOp

LOCAL_SIZE = 128   # threads per block: enough warps per SM to hide latency, and small grids still fill the SMs
OPTIONS = ("-default-device", "--fmad=false")  # plain functions are device code; no contraction of a*b+c

# a compile-only device's facts: an H100/H200 (sm_90) — 132 SMs, 48 KiB shared memory per block, 50 MiB L2
_DEFAULT_SMS, _DEFAULT_SHARED, _DEFAULT_L2 = 132, 48 << 10, 50 << 20


# ---- what this machine has: NVRTC, the driver, GPUs ----

@functools.lru_cache(maxsize=1)
def nvrtc_version() -> tuple[int, int] | None:
    """NVRTC's (major, minor), or None when cuda-bindings or the NVRTC library is missing."""
    try:
        from cuda.bindings import nvrtc
        err, major, minor = nvrtc.nvrtcVersion()
    except Exception:  # noqa: BLE001  (no cuda-bindings, or no libnvrtc for it to load)
        return None
    return (major, minor) if int(err) == 0 else None


@functools.lru_cache(maxsize=1)
def _gpus() -> tuple[int, str]:
    """(how many CUDA GPUs the driver sees, why there are none): cuInit on first use, never at import."""
    try:
        from cuda.bindings import driver
        err, = driver.cuInit(0)
        if int(err) != 0: return 0, f"cuInit failed with {_error_name(err)}"
        err, count = driver.cuDeviceGetCount()
    except ImportError:
        return 0, "cuda-bindings is not installed"
    except Exception:  # noqa: BLE001  (cuda-bindings found no driver library to load)
        return 0, "the NVIDIA driver library (libcuda) could not be loaded"
    if int(err) != 0 or count == 0: return 0, "the driver sees no GPU"
    return count, ""


def _count() -> int:
    """GPUs, or one compile-only device where there is none but NVRTC is installed."""
    gpus = _gpus()[0]
    return gpus or (1 if nvrtc_version() is not None else 0)


def _error_name(err) -> str:
    from cuda.bindings import driver
    found, name = driver.cuGetErrorName(err)
    return name.decode() if int(found) == 0 else f"CUresult {int(err)}"


def _check(result: tuple, what: str):
    """A driver call's result tuple: RuntimeError naming the call and the error, else its value."""
    if int(result[0]) != 0: raise RuntimeError(f"cuda: {what} failed: {_error_name(result[0])}")
    return result[1] if len(result) > 1 else None


def parse_arch(text: str) -> str:
    """'sm_90', 'compute_90', '90', '9.0' or 'sm_90a' -> '90' (or '90a'): the architecture NVRTC's options name."""
    found = re.fullmatch(r"(?:sm_|compute_)?(\d+)([af]?)", text.strip()) or re.fullmatch(r"(\d+)\.(\d)", text)
    if found is None:
        raise ValueError(f"FNX_CUDA_ARCH={text!r}: expected a GPU architecture such as 'sm_90', 'sm_80' or '9.0'")
    return "".join(found.groups())


# ---- compiling: CUDA C -> PTX or CUBIN with NVRTC ----

class CUDACompiler(Compiler):
    """CUDA C -> a CUBIN for a real architecture (`sm_XX`: what a GPU loads), or PTX for a virtual one
    (`compute_XX`: a compile-only device, or a GPU newer than this NVRTC, whose driver then JIT-compiles it).
    Cached on disk by the source, the options and NVRTC's version; a failed compile is a RuntimeError with
    NVRTC's log."""

    def __init__(self, arch: str, cubin: bool):
        version = nvrtc_version()
        if version is None:
            raise RuntimeError("cuda: NVRTC is not installed, so CUDA kernels cannot be compiled: pip install "
                               "'fnx[cuda]' (cuda-bindings and nvidia-cuda-nvrtc-cu12)")
        self.arch, self.cubin = arch, cubin
        self.options = (f"--gpu-architecture={'sm' if cubin else 'compute'}_{arch}",) + OPTIONS
        key = f"cuda nvrtc {version[0]}.{version[1]} {' '.join(self.options)}"
        super().__init__(ObjectCache(config.cache_dir, key, suffix=".cubin" if cubin else ".ptx"))

    def compile_uncached(self, source: str) -> bytes:
        return nvrtc_compile(source, self.options, self.cubin)

    def ptx(self, source: str) -> str:
        """The PTX of `source` for this compiler's architecture (what `as_text('ptx')` shows)."""
        ptx = self.compile(source) if not self.cubin else nvrtc_compile(
            source, (f"--gpu-architecture=compute_{self.arch}",) + OPTIONS, cubin=False)
        return ptx.rstrip(b"\0").decode()


def nvrtc_compile(source: str, options: tuple[str, ...], cubin: bool) -> bytes:
    """Compile CUDA C with NVRTC: the CUBIN, or the PTX (NUL-terminated, as cuModuleLoadData reads it)."""
    from cuda.bindings import nvrtc
    err, program = nvrtc.nvrtcCreateProgram(source.encode(), b"fnx.cu", 0, [], [])
    if int(err) != 0: raise RuntimeError(f"cuda: nvrtcCreateProgram failed: {err}")
    try:
        err, = nvrtc.nvrtcCompileProgram(program, len(options), [o.encode() for o in options])
        if int(err) != 0:
            _, size = nvrtc.nvrtcGetProgramLogSize(program)
            log = bytearray(size)
            nvrtc.nvrtcGetProgramLog(program, log)
            kernels, text = re.findall(r"void (\w+)\(", source), bytes(log).rstrip(b"\0").decode(errors="replace")
            raise RuntimeError(f"cuda: NVRTC ({' '.join(options)}) could not compile the CUDA C of kernels "
                               f"{kernels}:\n{text}")
        size_of, get = (nvrtc.nvrtcGetCUBINSize, nvrtc.nvrtcGetCUBIN) if cubin else (nvrtc.nvrtcGetPTXSize,
                                                                                     nvrtc.nvrtcGetPTX)
        _, size = size_of(program)
        out = bytearray(size)
        err, = get(program, out)
        if int(err) != 0: raise RuntimeError(f"cuda: NVRTC could not return the {'CUBIN' if cubin else 'PTX'}: {err}")
        return bytes(out)
    finally:
        nvrtc.nvrtcDestroyProgram(program)


# ---- the runtime: memory, modules and launches through the driver API ----

_thread = threading.local()  # the context current on this thread (the driver's is per thread)


def _use(context) -> None:
    """Make `context` current on this thread (driver calls act on the current context)."""
    handle = int(context)
    if getattr(_thread, "context", None) != handle:
        from cuda.bindings import driver
        _check(driver.cuCtxSetCurrent(context), "cuCtxSetCurrent")
        _thread.context = handle


class CUDABuffer(Buffer):
    """A device allocation: `ptr` is the device pointer (at least one byte), freed on the stream when the buffer
    is dropped (after every kernel queued before that reads it). A buffer over another library's memory
    (`borrowed`, a consumed DLPack tensor: `CUDAAllocator.borrow`) gives it back instead, once the kernels queued
    so far have run."""
    __slots__ = ("allocator", "borrowed")
    in_host_memory = False

    def __init__(self, allocator: CUDAAllocator, dtype: DType, size: int, ptr: int,
                 borrowed: dlpack.Borrowed | None = None):
        self.device, self.dtype, self.size, self.ready, self.allocator = allocator.device, dtype, size, None, allocator
        self._host, self.ptr, self.borrowed = None, ptr, borrowed

    @property
    def is_deleted(self) -> bool:
        return not self.ptr and self.borrowed is None

    @property
    def host(self) -> np.ndarray:
        raise TypeError(f"{self.device}: device memory has no host view; read it with its allocator's copyout")

    def numpy(self, shape: tuple[int, ...]) -> np.ndarray:
        return self.allocator.copyout(self).reshape(shape)

    def wait(self) -> None:
        """Until the GPU has run everything queued on the device's stream so far (launches return at once)."""
        super().wait()
        _use(self.allocator.context)
        _check(self.allocator.driver.cuStreamSynchronize(self.allocator.stream), f"{self.device}: cuStreamSynchronize")

    def __del__(self):
        if self.borrowed is not None: self.allocator.give_back(self.borrowed)
        elif self.ptr: self.allocator.free(self.ptr)


class CUDAAllocator(Allocator):
    """Stream-ordered memory of one GPU: allocations, frees and copies are queued on the device's stream."""

    def __init__(self, device: str, context, stream):
        from cuda.bindings import driver
        self.driver, self.device, self.context, self.stream = driver, device, context, stream
        self.ordinal = int(device.partition(":")[2])

    def alloc(self, dtype: DType, size: int) -> CUDABuffer:
        nbytes = max(1, size * dtype.itemsize)
        _use(self.context)
        ptr = _check(self.driver.cuMemAllocAsync(nbytes, self.stream), f"{self.device}: allocating {nbytes} bytes")
        return CUDABuffer(self, dtype, size, int(ptr))

    def free(self, ptr: int) -> None:
        try:
            _use(self.context)
            self.driver.cuMemFreeAsync(ptr, self.stream)
        except Exception:  # noqa: BLE001  (at interpreter exit the driver may be gone: the process frees it all)
            pass

    def copyin(self, dst: Buffer, host: np.ndarray) -> None:
        src = np.ascontiguousarray(host, dtype=dst.dtype.np).reshape(-1)
        if src.size != dst.size: raise ValueError(f"copyin: {src.size} elements into a buffer of {dst.size}")
        if not dst.ptr: raise dst.deleted_error()
        if not src.nbytes: return
        _use(self.context)  # (from pageable memory: staged before the call returns, so `src` may go)
        _check(self.driver.cuMemcpyHtoDAsync(dst.ptr, src.ctypes.data, src.nbytes, self.stream), "cuMemcpyHtoDAsync")

    def copyout(self, src: Buffer) -> np.ndarray:
        if not src.ptr: raise src.deleted_error()
        out = np.empty(src.size, src.dtype.np)
        _use(self.context)
        if out.nbytes:
            _check(self.driver.cuMemcpyDtoHAsync(out.ctypes.data, src.ptr, out.nbytes, self.stream),
                   "cuMemcpyDtoHAsync")
        _check(self.driver.cuStreamSynchronize(self.stream), "cuStreamSynchronize (a kernel before this read)")
        out.flags.writeable = False
        return out

    def copy(self, dst: Buffer, src: Buffer) -> None:
        if not src.size: return
        _use(self.context)
        _check(self.driver.cuMemcpyDtoDAsync(dst.ptr, src.ptr, src.size * src.dtype.itemsize, self.stream),
               "cuMemcpyDtoDAsync")

    def transfer(self, dst: Buffer, src: Buffer) -> bool:
        """A copy from a buffer of this GPU or another one (peer to peer); host memory goes through copyin."""
        if not isinstance(src, CUDABuffer): return False
        if src.allocator is self:
            self.copy(dst, src)
            return True
        other = src.allocator
        self._after(other)  # the copy waits for the work writing `src`, and `src` is freed only after the copy
        if src.size:
            _check(self.driver.cuMemcpyPeerAsync(dst.ptr, self.context, src.ptr, other.context,
                                                 src.size * src.dtype.itemsize, self.stream), "cuMemcpyPeerAsync")
        other._after(self)
        return True

    def _after(self, other: CUDAAllocator) -> None:
        """Order this stream's next work after everything queued so far on `other`'s stream."""
        _order(self.driver, other.context, other.stream, self.context, self.stream)

    # ---- DLPack: zero-copy exchange of device memory with other libraries (docs/RUNTIME.md) ----

    def dlpack_export(self, buffer: CUDABuffer, shape: tuple[int, ...], *, stream: int | None = None,
                      max_version: tuple[int, int] | None = None, copy: bool | None = None) -> object:
        """A DLPack capsule of `buffer` (an array of `shape`) for a consumer whose work goes on CUDA stream
        `stream` (the protocol's numbers: None or 1 the legacy default stream, 2 the per-thread one, -1 none to
        order, else a stream's handle): that stream waits for the kernels writing the buffer.

        A DLPack 1.0 consumer (`max_version` >= (1, 0)) gets the buffer itself, marked read-only (an Array is
        immutable); one that predates the flag, or asks `copy=True`, gets a copy of its own on the GPU
        (`copy=False` then raises BufferError)."""
        versioned = max_version is not None and tuple(max_version) >= dlpack.VERSION
        if copy is False and not versioned:
            raise BufferError(f"__dlpack__: {self.device} shares memory only with DLPack 1.0 consumers (which can "
                              "be told an Array is read-only); this one asked for no copy without max_version")
        if stream == 0 or (stream is not None and stream < -1):
            raise BufferError(f"__dlpack__: stream={stream} is not a CUDA stream the DLPack protocol allows")
        Buffer.wait(buffer)
        if copy or not versioned:
            fresh = self.alloc(buffer.dtype, buffer.size)
            self.copy(fresh, buffer)
            buffer = fresh
        if stream != -1:
            _order(self.driver, self.context, self.stream, self.context, self.driver.CUstream(stream or 1))
        flags = dlpack.IS_COPIED if copy or not versioned else dlpack.READ_ONLY
        return dlpack.export(buffer.ptr, buffer.dtype, shape, (dlpack.CUDA, self.ordinal), buffer, versioned, flags)

    def borrow(self, tensor: dlpack.Borrowed) -> tuple[CUDABuffer, np.ndarray | None]:
        """A buffer over another library's memory on this GPU (no copy) and where the tensor's elements lie in
        it: None when they are its elements in row-major order, else each one's index (a strided, broadcast or
        reversed tensor; the caller gathers them)."""
        if tensor.device != (dlpack.CUDA, self.ordinal):
            tensor.release()
            raise BufferError(f"from_dlpack: the tensor is on DLPack device {tensor.device}, not {self.device}")
        if tensor.size == 0:  # (its address may be NULL, which a buffer never has)
            tensor.release()
            return self.alloc(tensor.dtype, 0), None
        low, extent, index = tensor.span()
        address = tensor.address + low * tensor.dtype.itemsize
        return CUDABuffer(self, tensor.dtype, extent, address, tensor), index

    def give_back(self, tensor: dlpack.Borrowed) -> None:
        """The producer's memory is released once every kernel queued so far (which may read it) has run."""
        try:
            _use(self.context)
            self.driver.cuStreamSynchronize(self.stream)
        except Exception:  # noqa: BLE001  (at interpreter exit the driver may be gone)
            pass
        tensor.release()


def _order(driver, first_context, first, then_context, then) -> None:
    """Order stream `then`'s next work after everything queued so far on stream `first` (each of its context)."""
    _use(first_context)
    event = _check(driver.cuEventCreate(driver.CUevent_flags.CU_EVENT_DISABLE_TIMING), "cuEventCreate")
    _check(driver.cuEventRecord(event, first), "cuEventRecord")
    _use(then_context)
    _check(driver.cuStreamWaitEvent(then, event, 0), "cuStreamWaitEvent")
    driver.cuEventDestroy(event)  # (released once the wait is done)


class _Module:
    """A loaded binary; unloaded when the last program using it is dropped (its executable left the cache)."""

    def __init__(self, device: CUDADevice, binary: bytes):
        self.device = device
        _use(device.context)
        self.handle = _check(device.driver.cuModuleLoadData(binary), "cuModuleLoadData")

    def __del__(self):
        try:
            _use(self.device.context)
            self.device.driver.cuStreamSynchronize(self.device.stream)  # (no launch of it may still be queued)
            self.device.driver.cuModuleUnload(self.handle)
        except Exception:  # noqa: BLE001  (at interpreter exit the driver may be gone)
            pass


class CUDAProgram(Program):
    """One kernel of a loaded module: `program(*buffers, dims=(lo, hi))` runs iterations lo..hi of its grid loop,
    one thread each, asynchronously on the device's stream. Its arguments: the buffer pointers, then lo and hi."""

    def __init__(self, name: str, module: _Module, block: int):
        device = module.device
        self.name, self.module, self.block = name, module, block
        self.driver, self.context, self.stream = device.driver, device.context, device.stream
        self.function = _check(device.driver.cuModuleGetFunction(module.handle, name.encode()),
                               f"cuModuleGetFunction({name})")

    def __call__(self, *buffers: Buffer, dims: tuple = (0, 1)) -> None:
        lo, hi, *group = dims  # (group: the kernel's block size; one block per iteration of the grid loop)
        count = max(hi - lo, 1)
        block = group[0] if group else min(self.block, count)
        blocks = count if group else -(-count // block)
        for b in buffers:
            if not b.ptr: raise b.deleted_error()
        pointers = (ctypes.c_uint64 * max(len(buffers), 1))(*[b.ptr for b in buffers])  # (none: one unused)
        bounds = (ctypes.c_int64 * 2)(lo, hi)
        params = (ctypes.c_void_p * (len(pointers) + 2))(
            *[ctypes.addressof(pointers) + 8 * i for i in range(len(pointers))],
            ctypes.addressof(bounds), ctypes.addressof(bounds) + 8)  # (copied by the launch call)
        _use(self.context)
        _check(self.driver.cuLaunchKernel(self.function, blocks, 1, 1, block, 1, 1, 0, self.stream,
                                          ctypes.addressof(params), 0), f"cuLaunchKernel({self.name})")


class CompileOnly(Allocator, Program):
    """The memory and the kernels of a compile-only device: each use raises RuntimeError saying why."""

    def __init__(self, device: str, why: str, name: str = ""):
        self.device, self.why, self.name = device, why, name

    def _raise(self, *args, **kwargs):
        raise RuntimeError(f"{self.device} is compile-only ({self.why}): it lowers and compiles CUDA kernels "
                           "(fnx.jit(f, backend='cuda').lower(x).as_text('source') or 'ptx'), but it cannot hold "
                           "arrays or run them; run on a machine with an NVIDIA GPU and driver")

    alloc = copyin = copyout = copy = from_numpy = __call__ = _raise


# ---- the device and the platform ----

class CUDAExecutable(ReplayExecutable):
    """The generic replay, plus `as_text('ptx')`: the PTX NVRTC makes of the kernels' CUDA C."""

    def as_text(self, stage: str | None = None) -> str:
        if stage == "ptx": return self._device.compiler.ptx(self.source) if self.source else ""
        return super().as_text(stage)


def _target(name: str, arch: str, sms: int, shared: int, l2: int, threads_per_block: int) -> Target:
    """A GPU's target; compute capability 8.0 and later multiplies float16 and bfloat16 on tensor cores
    (`mma.m16n8k16`, fnx/lower/tensor_core.py)."""
    tensor_cores = ("float16", "bfloat16") if int(arch.rstrip("af")) >= 80 else ()
    return Target(name, "", "", vector_bytes=4, vector_registers=16, fma=True, l1_bytes=shared, l2_bytes=l2,
                  l3_bytes=0, cores=sms, threads=1, grid=True, local_size=min(LOCAL_SIZE, threads_per_block),
                  tensor_cores=tensor_cores)


def compile_only_target(arch: str) -> Target:
    """What a compile-only device lowers for: a GPU of architecture `arch` ('90') with an H100/H200's resources."""
    return _target(f"compile-only sm_{arch}", arch, _DEFAULT_SMS, _DEFAULT_SHARED, _DEFAULT_L2, 1024)


class CUDADevice(Device):
    """`cuda:N`: GPU N (its primary context and one stream), or, where there is no GPU, the compile-only cuda:0."""

    def __init__(self, ordinal: int):
        name = f"cuda:{ordinal}"
        gpus, why = _gpus()
        self.compile_only = gpus == 0
        if self.compile_only:
            arch = parse_arch(config.cuda_arch)
            target = compile_only_target(arch)
            self.gpu_name = target.name
            self.unavailable = CompileOnly(name, why)
            super().__init__("cuda", ordinal, self.unavailable, target=target, renderer=CRenderer(CUDA),
                             compiler=CUDACompiler(arch, cubin=False))
            return
        from cuda.bindings import driver
        self.driver = driver
        self.handle = _check(driver.cuDeviceGet(ordinal), "cuDeviceGet")
        self.context = _check(driver.cuDevicePrimaryCtxRetain(self.handle), "cuDevicePrimaryCtxRetain")
        _use(self.context)
        self.stream = _check(driver.cuStreamCreate(driver.CUstream_flags.CU_STREAM_NON_BLOCKING), "cuStreamCreate")
        pool = _check(driver.cuDeviceGetDefaultMemPool(self.handle), "cuDeviceGetDefaultMemPool")
        _check(driver.cuMemPoolSetAttribute(pool, driver.CUmemPool_attribute.CU_MEMPOOL_ATTR_RELEASE_THRESHOLD,
                                            driver.cuuint64_t(2 ** 64 - 1)), "cuMemPoolSetAttribute")  # keep freed
        attr = lambda a: _check(driver.cuDeviceGetAttribute(getattr(driver.CUdevice_attribute,  # noqa: E731
                                                                    f"CU_DEVICE_ATTRIBUTE_{a}"), self.handle), a)
        arch = f"{attr('COMPUTE_CAPABILITY_MAJOR')}{attr('COMPUTE_CAPABILITY_MINOR')}"
        self.gpu_name = _check(driver.cuDeviceGetName(256, self.handle), "cuDeviceGetName").split(b"\0")[0].decode()
        target = _target(f"{self.gpu_name} sm_{arch}", arch, attr("MULTIPROCESSOR_COUNT"),
                         attr("MAX_SHARED_MEMORY_PER_BLOCK"), attr("L2_CACHE_SIZE"), attr("MAX_THREADS_PER_BLOCK"))
        super().__init__("cuda", ordinal, CUDAAllocator(name, self.context, self.stream), target=target,
                         renderer=CRenderer(CUDA), compiler=_gpu_compiler(arch))
        self._modules: weakref.WeakValueDictionary = weakref.WeakValueDictionary()

    @property
    def device_kind(self) -> str:
        return self.gpu_name

    def executable(self, fn: UOp) -> CUDAExecutable:
        return CUDAExecutable(fn, self)

    def synchronize(self) -> None:
        if not self.compile_only: _check(self.driver.cuStreamSynchronize(self.stream), "cuStreamSynchronize")

    def kernel_timers(self):
        return None if self.compile_only else grid_beam.kernel_timers(self)  # (compile-only: nothing to time)

    def program(self, name: str, binary: bytes) -> Program:
        if self.compile_only: return CompileOnly(self.name, self.unavailable.why, name)
        key = hashlib.sha256(binary).digest()
        module = self._modules.get(key)
        if module is None: module = self._modules[key] = _Module(self, binary)
        return CUDAProgram(name, module, self.target.local_size)

    def __repr__(self) -> str:
        return f"CudaDevice(id={self.id}{', compile_only' if self.compile_only else ''})"


def _gpu_compiler(arch: str) -> CUDACompiler:
    """A CUBIN for the GPU's own architecture; PTX for the newest one NVRTC knows when the GPU is newer than it."""
    from cuda.bindings import nvrtc
    known = nvrtc.nvrtcGetSupportedArchs()[1] if nvrtc_version() is not None else []
    if not known or int(arch) in known: return CUDACompiler(arch, cubin=True)  # (none known: CUDACompiler raises)
    older = [a for a in known if a < int(arch)]
    return CUDACompiler(str(max(older)) if older else arch, cubin=False)


register_runtime(Runtime("cuda", _count, CUDADevice))
