"""The backend interface: devices, buffers, and the `Backend` that compiles a FUNCTION into an `Executable`.

A backend supplies an allocator (host-visible flat buffers here) and `compile(fn)`, where `fn` is a
FUNCTION(TUPLE(outputs...)) over PARAMs 0..n-1. The `Executable` it returns maps n input buffers to the outputs.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np

from fnx import dtypes
from fnx.dtypes import DType
from fnx.uop import UOp


class Buffer:
    """A flat device allocation of `size` elements of `dtype`. CPU-like devices keep it as a numpy array."""
    __slots__ = ("device", "dtype", "size", "host", "ptr", "__weakref__")

    def __init__(self, device: str, dtype: DType, size: int, host: np.ndarray | None = None):
        self.device, self.dtype, self.size = device, dtype, size
        self.host = np.empty(size, dtype=dtype.np) if host is None else host
        self.ptr: int = self.host.ctypes.data  # the address kernels receive

    @staticmethod
    def from_numpy(device: str, array: np.ndarray) -> Buffer:
        flat = np.ascontiguousarray(array).reshape(-1)
        return Buffer(device, dtypes.from_numpy(flat.dtype), flat.size, flat)

    def numpy(self, shape: tuple[int, ...]) -> np.ndarray:
        return self.host.reshape(shape)

    def __repr__(self) -> str:
        return f"Buffer({self.device}, {self.dtype}, {self.size})"


class Executable:
    """A compiled FUNCTION: call it with one Buffer per PARAM; it returns one Buffer per output."""
    fn: UOp

    def __call__(self, inputs: list[Buffer]) -> list[Buffer]: raise NotImplementedError

    def as_text(self, stage: str | None = None) -> str: raise NotImplementedError


@dataclass
class Backend:
    name: str
    compile: Callable[[UOp, str], Executable]   # (FUNCTION, device name) -> Executable


_backends: dict[str, Callable[[], Backend]] = {}
_loaded: dict[str, Backend] = {}


def register_backend(platform: str, loader: Callable[[], Backend]) -> None:
    _backends[platform] = loader


def platform_of(device: str) -> str:
    return device.split(":")[0]


def get_backend(device: str) -> Backend:
    """The backend for a device name such as 'cpu', 'cpu:0' or 'interp'."""
    platform = platform_of(device)
    if platform not in _loaded:
        if platform not in _backends:
            raise ValueError(f"unknown device {device!r}; known platforms: {sorted(_backends)}")
        _loaded[platform] = _backends[platform]()
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
