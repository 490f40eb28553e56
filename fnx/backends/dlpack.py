"""DLPack capsules over device memory, made and read with ctypes (DLPack 1.0's C structs: dlpack.h).

numpy makes and reads capsules of host memory, and fnx uses it there; no library on fnx's dependency list does
it for device memory (torch and cupy do, but neither is a dependency), so this module holds the structs.

- `export(...)` makes a capsule of memory at a device address: DLPack 1.0's versioned one ("dltensor_versioned",
  for consumers that pass max_version) or the older one ("dltensor"). It holds `owner` (the buffer) until the
  consumer calls the tensor's deleter, or until the capsule is dropped unused.
- `Borrowed(capsule)` consumes a capsule (renames it "used_...", as the protocol says) and reads the tensor's
  address, dtype, shape and strides; `release()` calls the producer's deleter, once.

Deleters may be called from any thread, with or without the GIL: ctypes callbacks take it.
"""
from __future__ import annotations

import ctypes
import threading

import numpy as np

from fnx import dtypes
from fnx.dtypes import DType

CPU, CUDA, CUDA_HOST, OPENCL = 1, 2, 3, 4  # DLDeviceType values fnx meets
READ_ONLY, IS_COPIED = 1, 2                # DLManagedTensorVersioned.flags bits
VERSION = (1, 0)                           # the DLPack version of the structs below

_CODES = {"i": 0, "u": 1, "f": 2, "c": 5, "b": 6}  # DLDataTypeCode by numpy kind (bfloat16: code 4)
_BFLOAT = 4


class _Device(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class _DataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class _Tensor(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("device", _Device), ("ndim", ctypes.c_int32), ("dtype", _DataType),
                ("shape", ctypes.POINTER(ctypes.c_int64)), ("strides", ctypes.POINTER(ctypes.c_int64)),
                ("byte_offset", ctypes.c_uint64)]


_DELETER = ctypes.CFUNCTYPE(None, ctypes.c_void_p)  # void (*)(DLManagedTensor[Versioned] *self)


class _Managed(ctypes.Structure):
    _fields_ = [("dl_tensor", _Tensor), ("manager_ctx", ctypes.c_void_p), ("deleter", _DELETER)]


class _Version(ctypes.Structure):
    _fields_ = [("major", ctypes.c_uint32), ("minor", ctypes.c_uint32)]


class _ManagedVersioned(ctypes.Structure):
    _fields_ = [("version", _Version), ("manager_ctx", ctypes.c_void_p), ("deleter", _DELETER),
                ("flags", ctypes.c_uint64), ("dl_tensor", _Tensor)]


# the CPython capsule API, as function objects of our own (argtypes set here do not touch ctypes.pythonapi's)
_api = ctypes.PyDLL(ctypes.pythonapi._name, handle=ctypes.pythonapi._handle)
_DESTRUCTOR = ctypes.CFUNCTYPE(None, ctypes.c_void_p)  # void (*)(PyObject *capsule)
_new, _valid, _pointer, _rename = _api.PyCapsule_New, _api.PyCapsule_IsValid, _api.PyCapsule_GetPointer, \
    _api.PyCapsule_SetName
_new.argtypes, _new.restype = [ctypes.c_void_p, ctypes.c_char_p, _DESTRUCTOR], ctypes.py_object
_valid.argtypes, _valid.restype = [ctypes.c_void_p, ctypes.c_char_p], ctypes.c_int
_pointer.argtypes, _pointer.restype = [ctypes.c_void_p, ctypes.c_char_p], ctypes.c_void_p
_rename.argtypes, _rename.restype = [ctypes.py_object, ctypes.c_char_p], ctypes.c_int

# capsule names: C strings that outlive every capsule
_NAMES = {True: ctypes.c_char_p(b"dltensor_versioned"), False: ctypes.c_char_p(b"dltensor")}
_USED = {True: ctypes.c_char_p(b"used_dltensor_versioned"), False: ctypes.c_char_p(b"used_dltensor")}

_alive: dict[int, tuple] = {}  # a live export's struct address -> (the struct, its shape and strides, owner)
_lock = threading.Lock()


def _drop(address: int) -> None:
    with _lock:
        _alive.pop(address, None)


@_DELETER
def _delete(address):
    """The deleter of every tensor `export` makes: lets go of the struct and of what it keeps alive."""
    _drop(address)


@_DESTRUCTOR
def _destroy(capsule):
    """A capsule's destructor: a capsule no one consumed still owns its tensor (a consumed one was renamed)."""
    for versioned in (True, False):
        if _valid(capsule, _NAMES[versioned]):
            _drop(_pointer(capsule, _NAMES[versioned]))


def data_type(dtype: DType) -> tuple[int, int]:
    """(DLDataTypeCode, bits) of an fnx dtype."""
    if dtype == dtypes.bfloat16: return _BFLOAT, 16
    if dtype.kind not in _CODES: raise BufferError(f"DLPack has no type for {dtype}")
    return _CODES[dtype.kind], 8 * dtype.itemsize


def from_data_type(code: int, bits: int, lanes: int) -> DType:
    """The fnx dtype of a DLDataType; BufferError for one fnx does not have."""
    for dtype in dtypes.ALL_DTYPES:
        if lanes == 1 and data_type(dtype) == (code, bits): return dtype
    raise BufferError(f"from_dlpack: fnx has no dtype for DLPack type code {code}, {bits} bits, {lanes} lanes")


def export(address: int, dtype: DType, shape: tuple[int, ...], device: tuple[int, int], owner: object,
           versioned: bool, flags: int = 0, strides: tuple[int, ...] | None = None) -> object:
    """A capsule of the array of `dtype` and `shape` at `address` on DLPack device `device` ((device_type,
    device_id)), holding `owner` until the consumer deletes it. `versioned`: DLPack 1.0's struct with `flags`
    (READ_ONLY, IS_COPIED); else the older struct, which has no flags. `strides` in elements (row-major ones by
    default)."""
    ndim = len(shape)
    sizes = (ctypes.c_int64 * max(ndim, 1))(*shape)
    strides = (ctypes.c_int64 * max(ndim, 1))(*(row_major(shape) if strides is None else strides))
    code, bits = data_type(dtype)
    tensor = _Tensor(address, _Device(*device), ndim, _DataType(code, bits, 1), sizes, strides, 0)
    if versioned:
        managed = _ManagedVersioned(_Version(*VERSION), None, _delete, flags, tensor)
    else:
        managed = _Managed(tensor, None, _delete)
    struct = ctypes.addressof(managed)
    with _lock:
        _alive[struct] = (managed, sizes, strides, owner)
    return _new(struct, _NAMES[versioned], _destroy)


def exports_alive() -> int:
    """How many exported tensors no consumer has deleted yet (for tests of the deleters)."""
    return len(_alive)


class Borrowed:
    """The tensor of a DLPack capsule, consumed: `address` (data plus byte offset), `device` ((type, id)),
    `dtype`, `shape`, `strides` (elements; row-major ones when the producer gave none) and `read_only`.
    `release()` calls the producer's deleter (once; dropping a Borrowed does not)."""

    def __init__(self, capsule: object):
        versioned = next((v for v in (True, False) if _valid(id(capsule), _NAMES[v])), None)
        if versioned is None:
            raise BufferError("from_dlpack: __dlpack__ returned no unused DLPack capsule (one is consumed once)")
        struct = _pointer(id(capsule), _NAMES[versioned])
        managed = (_ManagedVersioned if versioned else _Managed).from_address(struct)
        if versioned and managed.version.major != VERSION[0]:  # (the spec: a newer major one is deleted unread)
            version = f"{managed.version.major}.{managed.version.minor}"
            _rename(capsule, _USED[versioned])
            if managed.deleter: managed.deleter(struct)
            raise BufferError(f"from_dlpack: the producer gave DLPack {version}; fnx reads version {VERSION[0]}")
        _rename(capsule, _USED[versioned])
        self._struct, self._managed = struct, managed
        tensor = managed.dl_tensor
        self.address = (tensor.data or 0) + tensor.byte_offset
        self.device = (tensor.device.device_type, tensor.device.device_id)
        self.shape = tuple(tensor.shape[i] for i in range(tensor.ndim))
        self.strides = tuple(tensor.strides[i] for i in range(tensor.ndim)) if tensor.strides else \
            row_major(self.shape)
        self.read_only = bool(versioned and managed.flags & READ_ONLY)
        try:
            self.dtype = from_data_type(tensor.dtype.code, tensor.dtype.bits, tensor.dtype.lanes)
        except BufferError:
            self.release()
            raise

    @property
    def size(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64))

    def span(self) -> tuple[int, int, np.ndarray | None]:
        """Where the elements lie: (the lowest one's offset from `address` in elements, how many elements from
        it to the highest one, each element's index counted from the lowest one, or None where they are all of
        the span in row-major order). Strides may be zero (broadcast) or negative (reversed)."""
        if self.size == 0 or all(n == 1 or s == r for n, s, r in zip(self.shape, self.strides,
                                                                     row_major(self.shape))):
            return 0, self.size, None
        low = sum((n - 1) * s for n, s in zip(self.shape, self.strides) if s < 0)
        high = sum((n - 1) * s for n, s in zip(self.shape, self.strides) if s > 0)
        index = np.full(self.shape, -low, np.int64)
        for axis, (n, s) in enumerate(zip(self.shape, self.strides)):
            index += (np.arange(n, dtype=np.int64) * s).reshape((n,) + (1,) * (len(self.shape) - axis - 1))
        return low, high - low + 1, index

    def release(self) -> None:
        managed, self._managed = self._managed, None
        if managed is not None and managed.deleter: managed.deleter(self._struct)


def row_major(shape: tuple[int, ...]) -> tuple[int, ...]:
    """Row-major strides in elements."""
    return tuple(int(np.prod(shape[i + 1:], dtype=np.int64)) for i in range(len(shape)))
