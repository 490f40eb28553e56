"""Arrays, their operators, tracing and eager execution.

An `Array` wraps a UOp. A concrete array's UOp is a BUFFER (a device allocation); under a trace (jit, make_graph)
arrays wrap lazy graphs over PARAMs. `trace(f, ...)` turns a Python function on pytrees into
FUNCTION(TUPLE(outputs...), inputs...) where every BUFFER the function closed over became an extra PARAM.

The end of this module turns user values into Arrays (`to_array`, `as_array`) and builds the elementwise
functions behind Array's operators (`add`, `less`, ...) directly from primitives, with numpy's broadcasting and
JAX's type promotion; fnx.lax and fnx.numpy build on the same helpers (`promote`, `broadcast_array`, `elementwise`).

Outside any trace, each `fnx.numpy` function runs eagerly: `eager_op` builds its graph lazily, then `realize`
compiles it once per (graph over PARAMs, device) and runs it.
"""
from __future__ import annotations

import contextlib
import functools
import inspect
import itertools
import math
import operator
import threading
import warnings
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import numpy as np

from fnx import dtypes, tree_util
from fnx.backends import dlpack
from fnx.backends.device import (Buffer, Device, Executable, LRUCache, SingleDeviceSharding, device_of,
                                 get_device)
from fnx.config import config
from fnx.dtypes import DType
from fnx.errors import (ConcretizationError, ShapeError, TracerArrayConversionError, TracerBoolConversionError,
                        TracerIntegerConversionError, UnexpectedTracerError, at_user_line, user_frame)
from fnx.rewrite import substitute
from fnx.uop import BufferArg, GroupOp, Ops, ParamArg, UOp, with_src


class _State(threading.local):
    """The trace state of one thread (each thread traces and runs on its own, as with JAX's thread-local trace
    contexts); a new thread starts eager, on the process's default device (FNX_DEVICE)."""

    def __init__(self):
        self.depth = 0              # how deep we are in op building: 0 means eager (each call realizes its result)
        self.tracing = 0            # > 0 inside a trace whose values are abstract (jit, make_graph)
        self.default_device = config.device if ":" in config.device else f"{config.device}:0"  # checked on use
        self.bindings: dict = {}    # PARAM -> concrete value, for transforms traced outside jit (Python `if` works)
        self.axis_sizes: dict = {}  # named axes of the enclosing vmaps -> their sizes (for collectives)
        self.trace: TraceInfo | None = None  # the innermost open trace: values built under it belong to it


class TraceInfo:
    """One trace (jit, a transform, a control-flow body): the values built under it are valid while it is open."""
    __slots__ = ("kind", "where", "closed")

    def __init__(self, kind: str, where: str):
        self.kind, self.where, self.closed = kind, where, False


state = _State()


@contextlib.contextmanager
def building(tracing: bool = False):
    """Build ops lazily inside this block (and mark values abstract when `tracing`)."""
    state.depth += 1
    state.tracing += tracing
    try:
        yield
    finally:
        state.depth -= 1
        state.tracing -= tracing


class Array:
    """An immutable n-dimensional array on a device (or a traced value under jit).

    Its operators are defined here: `+ - * /`, the comparisons, `& | ^ ~ << >>` and unary `-`/`+` build primitives
    directly (the elementwise functions at the end of this module: numpy broadcasting, JAX promotion). The rest of
    the numpy API is numpy algorithms, so fnx.numpy installs it when imported (`import fnx` does): indexing
    (`x[i]`, iteration, `.at[...]` updates), `//`, `%`, `**`, `@`, `abs()`, `.T` and the methods (`sum`, `mean`,
    `reshape`, ...) listed in `NUMPY_METHODS`.

    A concrete array holds its device `Buffer`; its BUFFER UOp is only built when a graph needs it (`uop`), so
    returning results from a jitted call makes no IR nodes. Its value may still be being computed (asynchronous
    dispatch): reading it on the host (np.asarray, printing, float(), block_until_ready) waits.
    """
    __slots__ = ("_uop", "_buffer", "_shape", "_dtype", "weak_type", "_trace", "__weakref__")
    __array_priority__ = 100

    def __init__(self, uop: UOp, weak_type: bool = False):
        self.uop, self.weak_type = uop, weak_type

    @classmethod
    def from_buffer(cls, buffer: Buffer, shape: tuple[int, ...], weak_type: bool = False) -> Array:
        """A concrete array of `shape` over `buffer` (no UOp is built until one is needed)."""
        array = object.__new__(cls)
        array._uop, array._buffer, array._shape = None, buffer, shape
        array._dtype, array.weak_type, array._trace = buffer.dtype, weak_type, None
        return array

    @property
    def uop(self) -> UOp:
        """The array's graph: a BUFFER for a concrete array, a lazy graph over PARAMs under a trace."""
        if self._uop is None: self._uop = UOp(Ops.BUFFER, self._dtype, (), BufferArg(self._buffer, self._shape))
        elif self._trace is not None and self._trace.closed: self._escaped()
        return self._uop

    @uop.setter
    def uop(self, uop: UOp) -> None:
        self._uop, self._shape, self._dtype = uop, uop.shape, uop.dtype
        self._buffer = uop.arg.buffer if uop.op is Ops.BUFFER else None
        self._trace = state.trace if self._buffer is None and uop.op is not Ops.CONST else None

    def _escaped(self):
        trace = self._trace
        raise UnexpectedTracerError(at_user_line(
            f"encountered an unexpected tracer: a value of shape {self._shape} and dtype {self._dtype} built "
            f"inside {trace.kind} (traced at {trace.where}) was used after that trace ended. It escaped through a "
            "side effect (a global, a list, an attribute, a closure); return it from the function instead"))

    shape = property(lambda self: self._shape)
    dtype = property(lambda self: self._dtype.np)
    ndim = property(lambda self: len(self._shape))
    size = property(lambda self: math.prod(self._shape))

    @property
    def aval(self) -> tuple[tuple[int, ...], DType, bool]:
        return (self._shape, self._dtype, self.weak_type)

    @property
    def device(self) -> Device:
        """The Device holding this array (a traced value: the device its graph computes on); ValueError for an
        array spread over several devices, as in JAX (read `.devices()` or `.sharding`)."""
        if self._sharded:
            raise ValueError(f"this array is spread over {len(self._buffer.shards)} devices: read .devices() or "
                             ".sharding")
        name = self._buffer.device if self._buffer is not None else self.uop.device
        return get_device(name or state.default_device)

    @property
    def _sharded(self) -> bool:
        return self._buffer is not None and self._buffer.is_sharded

    def devices(self) -> set[Device]:
        """The set of devices holding this array."""
        return self._buffer.sharding.device_set if self._sharded else {self.device}

    @property
    def sharding(self) -> Any:
        """A SingleDeviceSharding, or the NamedSharding of an array laid out over a mesh."""
        return self._buffer.sharding if self._sharded else SingleDeviceSharding(self.device)

    @property
    def addressable_shards(self) -> list[Shard]:
        """This process's pieces of the array: one Shard (device, index, replica_id, data) per device."""
        if not self._sharded:
            self.block_until_ready()
            return [Shard(self.device, tuple(slice(0, n) for n in self._shape), 0, self)]
        buffer, out, seen = self._buffer, [], {}
        for device in buffer.mesh.flat_devices:
            if device.name not in buffer.shards: continue
            index = buffer.index_of(device)
            key = tuple((i.start, i.stop) for i in index)
            replica = seen[key] = seen.get(key, -1) + 1
            out.append(Shard(device, index, replica, Array.from_buffer(buffer.shards[device.name], buffer.local_shape,
                                                                       self.weak_type)))
        return out

    @property
    def is_fully_addressable(self) -> bool:
        return not self._sharded or self._buffer.sharding.is_fully_addressable

    @property
    def is_fully_replicated(self) -> bool:
        return not self._sharded or not any(self._buffer.dims)

    @property
    def is_concrete(self) -> bool:
        return self._buffer is not None

    def block_until_ready(self) -> Array:
        """Wait until the value is computed (raises the error of the call that computes it, if it failed)."""
        if self._buffer is not None: self._buffer.wait()
        return self

    def is_deleted(self) -> bool:
        """True once the array was donated to a jitted call (donate_argnums) that reused its memory."""
        return self._buffer is not None and self._buffer.is_deleted

    def _value(self, error: type[ConcretizationError] = ConcretizationError) -> np.ndarray:
        """The value as a numpy array (runs pending work; raises `error`, a ConcretizationError, under a trace)."""
        if self._buffer is None:
            if self._trace is not None and self._trace.closed: self._escaped()
            if state.tracing:
                raise error(at_user_line(
                    f"a traced value of shape {self.shape} and dtype {self._dtype} was used where a concrete "
                    "value is needed (bool(), int(), float(), np.asarray, or a Python `if`). Under jit, use "
                    "fnx.numpy.where or fnx.lax.cond for value-dependent choices, or mark the argument static "
                    "with static_argnums"))
            if state.bindings:  # (a transform of concrete values: the outer trace's inputs have values)
                bound = substitute(self.uop, state.bindings)
                if any(u.op is Ops.PARAM for u in bound.toposort):  # an inner trace's input (checkpoint, custom_vjp)
                    raise error(at_user_line(
                        f"a value of shape {self.shape} and dtype {self._dtype} traced inside checkpoint (or another "
                        "transform that traces its function) was used where a concrete value is needed (bool(), "
                        "int(), float(), np.asarray, or a Python `if`); its value is not known while that function "
                        "is traced. Use fnx.numpy.where or fnx.lax.cond, or compute it outside"))
                return np.asarray(Array(realize([bound])[0]).__array__())
            self.uop = realize([self.uop])[0]
        buffer = self._buffer  # read back through its device's allocator (host memory: a read-only view, no copy)
        if buffer.is_deleted: raise buffer.deleted_error(self._shape)
        if buffer.is_sharded: return buffer.assemble()
        return device_of(buffer).allocator.copyout(buffer).reshape(self._shape)

    def __array__(self, dtype=None, copy=None) -> np.ndarray:
        value = self._value(TracerArrayConversionError)
        return value.astype(dtype) if dtype is not None else value.copy() if copy else value

    def item(self) -> Any: return self._value().item()
    def tolist(self) -> Any: return self._value().tolist()
    def __bool__(self) -> bool: return bool(self._scalar_value("bool", TracerBoolConversionError))
    def __int__(self) -> int: return int(self._scalar_value("int"))
    def __float__(self) -> float: return float(self._scalar_value("float"))
    def __complex__(self) -> complex: return complex(self._scalar_value("complex"))

    def __index__(self) -> int:
        if not self._dtype.is_int and not self._dtype.is_bool:
            raise TypeError(at_user_line(f"only integer arrays can be used as an index, got {self._dtype}"))
        return int(self._scalar_value("index", TracerIntegerConversionError))

    def _scalar_value(self, what: str, error: type[ConcretizationError] = ConcretizationError) -> Any:
        value = self._value(error)  # under jit this raises `error` first, whatever the shape
        if what == "bool" and self.size != 1:  # numpy's and JAX's ValueError
            raise ValueError(at_user_line("The truth value of an empty array is ambiguous. Use `array.size > 0` to "
                                          "check that an array is not empty." if self.size == 0 else
                                          "The truth value of an array with more than one element is ambiguous. "
                                          "Use a.any() or a.all()"))
        if self.size != 1:
            raise TypeError(at_user_line(f"{what}() of an array of shape {self.shape} is ambiguous; "
                                         "it needs exactly one element (use .any() or .all())"))
        return value.reshape(())[()]

    def __len__(self) -> int:
        if not self.shape: raise TypeError("len() of unsized object (a 0-d array)")
        return self.shape[0]

    def __iter__(self):
        if not self.shape: raise TypeError("iteration over a 0-d array")
        return (self[i] for i in range(self.shape[0]))

    __hash__ = None  # arrays are not hashable, as in numpy and JAX

    # ---- operators: the elementwise functions at the end of this module (fnx.numpy exports them as add, less,
    # ...); an operand that is not array-like gives NotImplemented, so `x == None` is False ----
    def __add__(self, other): return apply_operator(add, self, other)
    def __radd__(self, other): return apply_operator(add, other, self)
    def __sub__(self, other): return apply_operator(subtract, self, other)
    def __rsub__(self, other): return apply_operator(subtract, other, self)
    def __mul__(self, other): return apply_operator(multiply, self, other)
    def __rmul__(self, other): return apply_operator(multiply, other, self)
    def __truediv__(self, other): return apply_operator(divide, self, other)
    def __rtruediv__(self, other): return apply_operator(divide, other, self)
    def __and__(self, other): return apply_operator(bitwise_and, self, other)
    def __rand__(self, other): return apply_operator(bitwise_and, other, self)
    def __or__(self, other): return apply_operator(bitwise_or, self, other)
    def __ror__(self, other): return apply_operator(bitwise_or, other, self)
    def __xor__(self, other): return apply_operator(bitwise_xor, self, other)
    def __rxor__(self, other): return apply_operator(bitwise_xor, other, self)
    def __lshift__(self, other): return apply_operator(left_shift, self, other)
    def __rlshift__(self, other): return apply_operator(left_shift, other, self)
    def __rshift__(self, other): return apply_operator(right_shift, self, other)
    def __rrshift__(self, other): return apply_operator(right_shift, other, self)
    def __lt__(self, other): return apply_operator(less, self, other)
    def __le__(self, other): return apply_operator(less_equal, self, other)
    def __gt__(self, other): return apply_operator(greater, self, other)
    def __ge__(self, other): return apply_operator(greater_equal, self, other)
    def __eq__(self, other): return apply_operator(equal, self, other)  # type: ignore[override]
    def __ne__(self, other): return apply_operator(not_equal, self, other)  # type: ignore[override]
    def __neg__(self): return negative(self)
    def __pos__(self): return positive(self)
    def __invert__(self): return invert(self)

    def astype(self, dtype: Any, copy: bool = False, device: Any = None) -> Array:
        """This array converted to `dtype` (floats to ints truncate toward zero; to bool is x != 0), on `device`
        when given (`copy` changes nothing: arrays are immutable)."""
        return astype(self, dtype, copy=copy, device=device)

    def copy(self) -> Array: return self  # arrays are immutable: a copy is the array itself
    def conj(self) -> Array: return eager_op(conjugate)(self) if self._dtype.is_complex else self
    conjugate = conj
    real = property(lambda self: eager_op(real_part)(self) if self._dtype.is_complex else self)
    imag = property(lambda self: eager_op(imag_part)(self))

    # The part of the numpy API that is numpy algorithms (indexing, floor division, powers, matmul, reductions,
    # shapes): fnx.numpy installs exactly these names with `install_numpy_methods` when it is imported.
    NUMPY_METHODS = ("__getitem__", "at", "__floordiv__", "__rfloordiv__", "__mod__", "__rmod__", "__pow__",
                     "__rpow__", "__matmul__", "__rmatmul__", "__abs__", "T", "mT", "reshape", "transpose", "flatten",
                     "ravel", "squeeze", "swapaxes", "repeat", "sum", "mean", "prod", "max", "min", "argmax",
                     "argmin", "var", "std", "all", "any", "cumsum", "cumprod", "clip", "round", "dot", "take",
                     "nonzero")

    @classmethod
    def install_numpy_methods(cls, methods: dict[str, Any]) -> None:
        """Install fnx.numpy's part of the Array API: a method (or property) for each name in `NUMPY_METHODS`."""
        if set(methods) != set(cls.NUMPY_METHODS):
            raise TypeError(f"Array.install_numpy_methods: expected the names in Array.NUMPY_METHODS; missing "
                            f"{sorted(set(cls.NUMPY_METHODS) - set(methods))}, unknown "
                            f"{sorted(set(methods) - set(cls.NUMPY_METHODS))}")
        for name, method in methods.items(): setattr(cls, name, method)

    def __repr__(self) -> str:
        if self._buffer is None and (state.tracing or (self._trace is not None and self._trace.closed)):
            return f"Traced<{self._dtype}{list(self.shape)}>"
        value, prefix = self._value(), "Array("  # JAX's layout: the dtype always shown, weak types marked
        dtype = f"dtype={self._dtype}" + (", weak_type=True" if self.weak_type else "")
        width = np.get_printoptions()["linewidth"]
        body = f"[], shape={self.shape}" if value.size == 0 else np.array2string(
            value, prefix=prefix, suffix=",", separator=", ", max_line_width=width)
        separator = " " * len(prefix) if len(body) - body.rfind("\n") + 1 + len(dtype) + 2 > width else " "
        return f"{prefix}{body},{separator}{dtype})"

    def __str__(self) -> str:
        return str(self._value()) if self._buffer is not None or not state.tracing else repr(self)

    def __dlpack__(self, *, stream: int | None = None, max_version: tuple[int, int] | None = None,
                   dl_device: tuple[int, int] | None = None, copy: bool | None = None):
        """A DLPack capsule of the value (docs/RUNTIME.md): a CUDA array's own GPU memory, marked read-only (an
        Array is immutable); otherwise host memory, an OpenCL array copied there. A consumer that cannot take
        DLPack 1.0's read-only flag gets a writable copy."""
        buffer, export, device = self._dlpack_source()
        if export is not None and dl_device in (None, device):
            return export(buffer, self._shape, stream=stream, max_version=max_version, copy=copy)
        if buffer is not None and copy is False and not buffer.in_host_memory:
            raise BufferError(f"__dlpack__: an array on {buffer.device} reaches the host only as a copy, and "
                              "copy=False was asked")
        kwargs = {k: v for k, v in (("max_version", max_version), ("dl_device", dl_device), ("copy", copy)) if
                  v is not None}
        value = self._value()
        try:
            return value.__dlpack__(**kwargs)
        except BufferError:
            if copy is False: raise
            return np.array(value).__dlpack__(**kwargs)

    def __dlpack_device__(self) -> tuple[int, int]:
        """(kDLCUDA, ordinal) for an array on a GPU; (kDLCPU, 0) for the rest (exported through host memory)."""
        return self._dlpack_source()[2]

    def _dlpack_source(self) -> tuple[Buffer | None, Any, tuple[int, int]]:
        """(the single-device buffer holding the value, None for a sharded array; its device's zero-copy DLPack
        export, None where the value goes through host memory; the DLPack device). The value is computed first
        where it is lazy; raises under a trace, where there is no value."""
        if self._buffer is None: self._value()
        buffer = self._buffer
        if buffer is None or buffer.is_sharded: return None, None, (dlpack.CPU, 0)
        device = device_of(buffer)
        export = getattr(device.allocator, "dlpack_export", None)
        return buffer, export, (dlpack.CUDA, device.id) if export is not None else (dlpack.CPU, 0)


# ---- eager execution ----

def compile_function(fn: UOp, device: str) -> Executable:
    """The cached Executable of FUNCTION `fn` on `device` (compiled on first use; see Device.compile)."""
    return get_device(device).compile(fn)


def parameterize(outs: list[UOp]) -> tuple[UOp, list[UOp]]:
    """FUNCTION(TUPLE(outs)) with every BUFFER under `outs` replaced by a PARAM; also returns those BUFFERs."""
    body = UOp(Ops.TUPLE, dtypes.bool_, tuple(outs))
    buffers = [u for u in body.toposort if u.op is Ops.BUFFER]
    params = {b: UOp(Ops.PARAM, b.dtype, (), ParamArg(i, b.shape, b.device)) for i, b in enumerate(buffers)}
    new_body = substitute(body, params) if params else body
    return UOp(Ops.FUNCTION, dtypes.bool_, (new_body, *buffers)), buffers


@dataclass
class Shard:
    """One device's piece of an array: `data[...]` is `array[index]`; replica_id counts equal pieces."""
    device: Device
    index: tuple[slice, ...]
    replica_id: int
    data: Array


sharded_runner: list = [None]  # fnx.sharding.spmd's runner of eager ops on sharded arrays (set when it is imported)


def realize(outs: list[UOp]) -> list[UOp]:
    """Compute lazy graphs over BUFFERs; returns one BUFFER UOp per output."""
    pending = [u for u in outs if u.op is not Ops.BUFFER]
    if not pending: return outs
    fn, buffers = parameterize(pending)
    if any(b.arg.buffer.is_sharded for b in buffers) or any(  # over a mesh: the partitioner runs it
            u.op is Ops.CALL and getattr(u.arg, "kind", None) == "shard_map" for u in fn.src[0].toposort):
        results = iter(sharded_runner[0](fn, [b.arg.buffer for b in buffers]))
        return [u if u.op is Ops.BUFFER else next(results) for u in outs]
    devices = {b.device for b in buffers}
    if len(devices) > 1:
        raise ValueError(at_user_line(f"an operation mixes arrays on different devices: {sorted(devices)}; "
                                      "move them with fnx.device_put first"))
    device = devices.pop() if devices else state.default_device
    fn, constants = _lift_constants(fn, device)
    inputs = [b.arg.buffer for b in buffers] + [constant_buffer(c, device) for c in constants]
    results = iter(run_function(fn, inputs, device))
    return [u if u.op is Ops.BUFFER else next(results) for u in outs]


def _lift_constants(fn: UOp, device: str) -> tuple[UOp, list[UOp]]:
    """FUNCTION `fn` with the constants that meet data in its body (not in nested bodies) read from PARAMs of shape
    () that follow the existing ones, and those constants. An eager op then compiles once per shape and dtype, not
    once per Python scalar (`x * float(i)` in a loop compiled and kept one kernel per i), as JAX passes a scalar to
    its compiled primitive as an argument. (jit keeps constants in the code, also as JAX does.)

    Two kinds stay in the code, where the compiler folds them: constants that only meet other constants (a
    shift's guard `amount < 32 ? amount : 0` of a constant amount), and shift amounts themselves. A rotation by
    a constant is one instruction; by an argument it is a guarded variable shift, and the threefry rounds of an
    eager random op built so took LLVM three times as long."""
    body = fn.src[0]
    constant: set[UOp] = set()  # nodes whose value is an expression of constants alone
    lifted: dict[UOp, None] = {}
    for u in body.graph:
        if u.op is Ops.CONST or (u.src and (u.op in GroupOp.ALU or u.op in GroupOp.Movement)
                                 and all(s in constant for s in u.src)):
            constant.add(u)
            continue
        for i, s in enumerate(u.src):
            if s.op is Ops.CONST and not (i == 1 and u.op in (Ops.SHL, Ops.SHR)): lifted[s] = None
    if not lifted: return fn, []
    scalars = list(dict.fromkeys(UOp.const(c.dtype, c.arg.value) for c in lifted))
    slot = {c: UOp(Ops.PARAM, c.dtype, (), ParamArg(len(fn.src) - 1 + i, (), device)) for i, c in enumerate(scalars)}
    memo: dict[UOp, UOp] = {}
    for u in body.graph:
        if u in lifted:
            p = slot[UOp.const(u.dtype, u.arg.value)]
            memo[u] = p if not u.shape else UOp(Ops.EXPAND, u.dtype, (
                UOp(Ops.RESHAPE, u.dtype, (p,), (1,) * len(u.shape)),), u.shape)
        else:  # bodies of calls and control nodes are never in memo: they keep their own constants
            src = tuple(memo.get(s, s) for s in u.src)
            memo[u] = with_src(u, src)
    return UOp(Ops.FUNCTION, fn.dtype, (memo[body], *fn.src[1:], *slot.values())), scalars


_constant_buffers = LRUCache(4096)


def constant_buffer(c: UOp, device: str) -> Buffer:
    """A device buffer holding scalar constant `c` (shared: buffers are immutable)."""
    key = (c, device)
    if (buf := _constant_buffers.get(key)) is None:
        buf = _constant_buffers.put(key, get_device(device).allocator.from_numpy(np.array(c.arg.value, c.dtype.np)))
    return buf


def double(value: float) -> Array:
    """A Python number as a float64 Array argument, with x64 on or off: fnx's own float64 work (`linspace`'s
    bounds) takes it exactly, where a weakly typed argument would be rounded to float32 on the way."""
    buffer = get_device(state.default_device).allocator.from_numpy(np.array(value, np.float64))
    return Array.from_buffer(buffer, ())  # (its own buffer, freed after the call: no cache of ever new bounds)


def host_scalar(value: Any) -> Array | None:
    """A Python bool, int or float as a concrete scalar Array of its default dtype (weakly typed but a bool),
    its buffer filled on the host: built as a constant and realized, `jnp.array(0.5)` took 75 us (JAX 13). None
    inside a trace, for other values, and for an int the default int cannot hold (the caller's path raises)."""
    if type(value) not in (bool, int, float) or state.depth: return None
    try:
        dtype, weak = dtypes.canonicalize_scalar(value)
    except OverflowError:
        return None
    buffer = get_device(state.default_device).allocator.from_numpy(np.array(value, dtype.np))
    return Array.from_buffer(buffer, (), weak)


def run_function(fn: UOp, inputs: list[Buffer], device: str) -> list[UOp]:
    """Run FUNCTION `fn` on `inputs`; returns BUFFER UOps of its outputs."""
    exe = compile_function(fn, device)
    return [UOp(Ops.BUFFER, out.dtype, (), BufferArg(buf, out.shape))
            for out, buf in zip(fn.src[0].src, exe(inputs))]


def _realize_tree(tree: Any) -> Any:
    leaves, treedef = tree_util.tree_flatten(tree)
    lazy = [x for x in leaves if isinstance(x, Array) and x._buffer is None]
    if lazy:
        for a, u in zip(lazy, realize([a.uop for a in lazy])):
            a.uop = u
    return tree


def special_values(tree: Any, what: str) -> str | None:
    """With debug_nans / debug_infs on (JAX's jax_debug_nans / jax_debug_infs): JAX's message for the first float
    result in `tree` that holds a NaN / an infinity, computed by `what`; else None."""
    for x in tree_util.tree_leaves(tree):
        if not isinstance(x, Array) or x._buffer is None or not x.uop.dtype.is_float: continue
        value = np.asarray(x)
        value = value.astype(np.float32) if value.dtype.itemsize == 2 else value  # (ml_dtypes' bfloat16 too)
        if config.debug_nans and np.isnan(value).any(): return f"invalid value (nan) encountered in {what}"
        if config.debug_infs and np.isinf(value).any(): return f"invalid value (inf) encountered in {what}"
    return None


def eager_op(fn: Callable) -> Callable:
    """Decorator for array-API functions: outside a trace, build the whole call lazily, then run it as one FUNCTION.
    With debug_nans / debug_infs on, a NaN / infinity in its result is a FloatingPointError naming the function and
    the user's line."""
    name = getattr(fn, "__name__", "an operation")

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        if state.depth: return fn(*args, **kwargs)
        with building():
            out = fn(*args, **kwargs)
        out = _realize_tree(out)
        if (config.debug_nans or config.debug_infs) and (bad := special_values(out, name)) is not None:
            raise FloatingPointError(at_user_line(bad))
        return out
    return wrapper


# ---- tracing ----

@dataclass
class Traced:
    """A traced function: `fn` is FUNCTION(TUPLE(outs), args...) whose first PARAMs are the flat arguments and whose
    remaining PARAMs are the arrays it closed over (`consts`)."""
    fn: UOp
    in_tree: Any
    out_tree: Any
    consts: list[UOp]          # BUFFER UOps the function closed over, passed after the arguments
    out_weak: list[bool]

    @property
    def body(self) -> UOp:
        return self.fn.src[0]


def abstract_leaf(x: Any) -> tuple[tuple[int, ...], DType, bool]:
    """(shape, dtype, weak_type) of an argument leaf: an Array, a numpy array or scalar, or a Python scalar."""
    if isinstance(x, Array): return x.aval
    if isinstance(x, (bool, int, float)) and not isinstance(x, np.generic):
        dtype, weak = dtypes.canonicalize_scalar(x)
        return ((), dtype, weak)
    if isinstance(x, (np.ndarray, np.generic)):  # (x64 off: numpy's 64-bit values enter as 32-bit, as in JAX)
        return (tuple(np.shape(x)), dtypes.canonicalize(dtypes.from_numpy(np.asarray(x).dtype)), False)
    raise TypeError(at_user_line(f"argument of type {type(x).__name__} is not a valid fnx array "
                                 "(expected an Array, a numpy array or a Python scalar)"))


_tags = itertools.count()


def fresh_tag() -> int:
    """A tag no other traced body has: transform traces, control-flow bodies and rebuilt bodies share it."""
    return next(_tags)


def trace(f: Callable, args: tuple, device: str | None = None, avals: list | None = None,
          transform: bool = False, tag: tuple | None = None, abstract: bool = False, kind: str | None = None) -> Traced:
    """Trace `f(*args)` into a FUNCTION over one PARAM per array leaf of `args`.

    jit traces (transform=False) are abstract and hoist closed-over arrays to extra PARAMs. Transforms
    (transform=True) get PARAMs of their own (tagged, so they never collide with an enclosing trace's), keep
    closed-over arrays as constants, and, outside jit, bind their PARAMs to the concrete arguments so Python
    control flow on values works as in JAX.

    Values built while `f` runs belong to this trace: one used after it returns (kept in a global or a list)
    raises UnexpectedTracerError naming `kind` and the line that started the trace.
    """
    opened = TraceInfo(kind or f"a {'transform' if transform else 'jit'} of {getattr(f, '__name__', 'a function')}",
                       user_frame())
    outer, state.trace = state.trace, opened
    try:
        return _trace(f, args, device, avals, transform, tag, abstract)
    finally:
        opened.closed, state.trace = True, outer


def _trace(f: Callable, args: tuple, device: str | None, avals: list | None, transform: bool, tag: tuple | None,
           abstract: bool) -> Traced:
    leaves, in_tree = tree_util.tree_flatten(args)
    avals = [abstract_leaf(x) for x in leaves] if avals is None else avals
    device = device or state.default_device
    tag = (tag if tag is not None else (fresh_tag(),)) if transform else ()
    # a transform's PARAM lives where its argument does (a jit's arguments all live on `device`)
    places = [(_device_of(x) or device) if transform else device for x in leaves] if leaves else []
    params = [Array(UOp(Ops.PARAM, dtype, (), ParamArg(i, shape, places[i] if i < len(places) else device, tag)), weak)
              for i, (shape, dtype, weak) in enumerate(avals)]
    concrete = transform and not abstract and not state.tracing  # vmap's values are batches: abstract
    bound = {p.uop: _leaf_uop(x, p.uop) for p, x in zip(params, leaves)} if concrete else {}
    previous = state.bindings
    state.bindings = {**previous, **bound}
    try:
        with building(tracing=not concrete):
            out = f(*tree_util.tree_unflatten(in_tree, params))
    finally:
        state.bindings = previous
    out_leaves, out_tree = tree_util.tree_flatten(out)
    with building(tracing=True):
        out_arrays = [to_array(o) for o in out_leaves]
    if transform:
        body = UOp(Ops.TUPLE, dtypes.bool_, tuple(a.uop for a in out_arrays))
        return Traced(UOp(Ops.FUNCTION, dtypes.bool_, (body, *[p.uop for p in params])), in_tree, out_tree, [],
                      [a.weak_type for a in out_arrays])
    fn, consts = _hoist_constants([a.uop for a in out_arrays], [p.uop for p in params])
    return Traced(fn, in_tree, out_tree, consts, [a.weak_type for a in out_arrays])


def _device_of(x: Any) -> str | None:
    if not isinstance(x, Array): return None
    return x._buffer.device if x._buffer is not None else x._uop.device


def _leaf_uop(x: Any, param: UOp) -> UOp:
    """The UOp of an argument leaf (an Array's graph, or a host value as a constant of the PARAM's dtype)."""
    return x.uop if isinstance(x, Array) else to_array(np.asarray(x, dtype=param.dtype.np)).uop


def inline(traced: Traced, outs: list[UOp], args: list[Any], memo: dict | None = None) -> list[UOp]:
    """Graphs in terms of a transform trace's PARAMs, with the PARAMs replaced by the actual argument leaves.
    `memo`, when given, keeps what each node became, for a later call on the same arguments (vjp's backward
    pass holds its forward graph: the walk stops where the forward's ended)."""
    mapping = {p: _leaf_uop(x, p) for p, x in zip(traced.fn.src[1:], args)}
    if memo: mapping = {p: memo.get(p, u) for p, u in mapping.items()}  # (a host value's constant: the same one)
    root = substitute(UOp(Ops.TUPLE, dtypes.bool_, tuple(outs)), mapping, memo)
    return list(root.src)


def _hoist_constants(outs: list[UOp], params: list[UOp]) -> tuple[UOp, list[UOp]]:
    """FUNCTION(TUPLE(outs), params..., consts...) with closed-over BUFFERs replaced by PARAMs numbered after the
    arguments' PARAMs."""
    body = UOp(Ops.TUPLE, dtypes.bool_, tuple(outs))
    consts = [u for u in body.toposort if u.op is Ops.BUFFER]
    mapping = {b: UOp(Ops.PARAM, b.dtype, (), ParamArg(len(params) + i, b.shape, b.device))
               for i, b in enumerate(consts)}
    if mapping: body = substitute(body, mapping)
    return UOp(Ops.FUNCTION, dtypes.bool_, (body, *params, *mapping.values())), consts


# ---- user values into Arrays ----

def is_python_scalar(x: Any) -> bool:
    """True for a Python bool, int, float or complex (weakly typed in promotion), not for numpy scalars."""
    return isinstance(x, (bool, int, float, complex)) and not isinstance(x, np.generic)


def to_array(x: Any, dtype: DType | None = None) -> Array:
    """An Array for `x` (an Array, numpy array or scalar, or a nested list/tuple of them); Python scalars become
    weakly typed constants, numpy values keep their dtype (fnx.lax's conversion; fnx.numpy's is `as_operand`)."""
    if isinstance(x, Array):
        return x if dtype is None or x.uop.dtype == dtype else cast(x, dtype)
    if isinstance(x, (bool, int, float, complex)) and not isinstance(x, np.generic):
        scalar_dtype, weak = dtypes.canonicalize_scalar(x)
        return Array(UOp.const(dtype or scalar_dtype, x), weak and dtype is None)
    if isinstance(x, (np.ndarray, np.generic)) or hasattr(x, "__array__"):
        value = np.asarray(x)
        if value.dtype == np.dtype("O"):
            raise TypeError(at_user_line(f"cannot convert an object array to an fnx array: {x!r}"))
        if dtype is not None and value.dtype != dtype.np:
            value = value.astype(dtype.np)
        return constant_array(value)
    if isinstance(x, (list, tuple)):
        return to_array(np.asarray(x) if not any(isinstance(e, Array) for e in _flat(x)) else _stack_nested(x), dtype)
    raise TypeError(at_user_line(f"cannot convert {type(x).__name__} to an fnx array: {x!r}"))


def _flat(x: list | tuple):
    for e in x:
        yield from (_flat(e) if isinstance(e, (list, tuple)) else [e])


def _stack_nested(x: list | tuple) -> Array:
    """A nested list/tuple holding Arrays as one Array: its rows stacked as jnp.stack does."""
    return stack_arrays([_stack_nested(e) if isinstance(e, (list, tuple)) else as_operand(e, "stack") for e in x])


def constant_array(value: np.ndarray) -> Array:
    """A concrete Array holding a copy of a numpy array on the default device."""
    dtype = dtypes.canonicalize(dtypes.from_numpy(value.dtype))
    if dtype.np != value.dtype: value = value.astype(dtype.np)  # x64 off: numpy's 64-bit values enter as 32-bit
    if value.size == 1 or value.ndim == 0:  # small constants stay in the graph, where rewrites can fold them
        scalar = value.reshape(-1)[0].item() if value.size else 0
        return Array(UOp.const(dtype, scalar, value.shape))
    buf = get_device(state.default_device).allocator.from_numpy(value)  # a copy: the caller may change `value`
    return Array(UOp(Ops.BUFFER, dtype, (), BufferArg(buf, tuple(value.shape))))


def _canonical_host(value: np.ndarray) -> np.ndarray:
    """Python lists and scalars in the default dtypes (float32 / int32, or float64 / int64 with x64 on), as in JAX;
    an int that does not fit is an OverflowError, as in JAX."""
    if value.dtype == np.float64: return value.astype(dtypes.default_float().np)
    if value.dtype == np.complex128: return value.astype(dtypes.default_complex().np)
    if value.dtype == np.int64 and not dtypes.x64_enabled():
        if value.size and (value.min() < -2**31 or value.max() >= 2**31):
            big = value.max() if value.max() >= 2**31 else value.min()
            raise OverflowError(at_user_line(f"Python int {big} too large to convert to int32 (64-bit ints need "
                                             "fnx.config.update('jax_enable_x64', True))"))
        return value.astype(np.int32)
    return value


def as_array(x: Any, dtype: DType | None = None) -> Array:
    """`x` as an Array, as jax.numpy.asarray converts it (fnx.numpy.array adds `ndmin` and runs eagerly).

    Args:
      x: an Array, a numpy array or scalar, a Python scalar, or a (nested) list/tuple of those; lists holding
        Arrays are stacked.
      dtype: the result's dtype (default: Python floats/ints give float32/int32, int64 only when the values need
        it; numpy values keep theirs).

    Returns:
      An Array, weakly typed when `x` is a Python int or float (or a weakly typed Array) and no dtype is given.
      Example: `as_array([1, 2])` is int32 [1, 2].
    """
    if isinstance(x, Array):
        out = x
    elif isinstance(x, (list, tuple)) and any(isinstance(v, Array) for v in _flat(x)):
        out = stack_arrays([as_array(v) for v in x])
    else:
        from_python = isinstance(x, (list, tuple)) or is_python_scalar(x)
        value = np.asarray(x, dtype=dtype.np if dtype is not None else None)
        if value.dtype == np.dtype("O") or value.dtype.kind in "US":
            raise TypeError(at_user_line(f"array: cannot convert {type(x).__name__} {x!r} to an fnx array"))
        out = constant_array(_canonical_host(value) if from_python and dtype is None else value)
    out = cast(out, dtype) if dtype is not None else out
    weak = dtype is None and (x.weak_type if isinstance(x, Array) else is_python_scalar(x))
    return with_weak(out, weak and not out.uop.dtype.is_bool)


def as_operand(x: Any, name: str = "asarray") -> Array:
    """An argument of array function `name` as an Array: Python scalars stay weakly typed constants (`to_array`),
    anything else converts as `as_array`; a conversion error names `name`.

    A list or tuple is a TypeError, as JAX's jnp functions raise (`jnp.sum([1, 2])`: wrap it in jnp.array), except
    where JAX converts one: `asarray` (the default name, used for values like pad's constant_values) and `.at[]`
    updates."""
    if isinstance(x, Array): return x
    if isinstance(x, (list, tuple)) and name != "asarray" and not name.startswith("at[]"):
        raise TypeError(at_user_line(f"{name} requires ndarray or scalar arguments, got {type(x)}; convert a "
                                     "list with fnx.numpy.array first, as in JAX"))
    try:
        return to_array(x) if is_python_scalar(x) else as_array(x)
    except TypeError as err:
        message = f"{name}: {err}"
        raise TypeError(message if "\n  at " in message else at_user_line(message)) from None


# ---- dtypes, shapes and nodes: what fnx.lax and fnx.numpy build their ops from ----

def with_weak(a: Array, weak: bool) -> Array:
    """`a` with its weak-type flag set to `weak` (the same graph)."""
    return a if a.weak_type == weak else Array(a.uop, weak)


def cast(a: Array, dtype: DType) -> Array:
    """`a` converted to `dtype` (float -> int truncates toward zero, anything -> bool is x != 0), or `a` itself when
    it has that dtype. Casts of constants fold here, so weak scalars promote without a kernel."""
    if a.uop.dtype == dtype: return a
    if a.uop.dtype.is_complex != dtype.is_complex: return _cast_complex(a, dtype)
    if a.uop.op is Ops.CONST:
        value = a.uop.arg.value
        if dtype.is_bool: value = value != 0
        elif dtype.is_int and isinstance(value, float):
            value = int(value) if math.isfinite(value) else 0
        return Array(UOp.const(dtype, value, a.shape))
    return Array(UOp(Ops.CAST, dtype, (a.uop,)))


def _cast_complex(a: Array, dtype: DType) -> Array:
    """A cast between real and complex: a real value is the real part (the imaginary part 0); a complex value
    casts to bool as z != 0 and to any other real type through its real part, with numpy's ComplexWarning."""
    if dtype.is_complex:
        re = cast(a, dtype.component)
        return make_complex(re, Array(UOp.const(dtype.component, 0.0, a.shape)))
    re, im = real_part(a), imag_part(a)
    if dtype.is_bool: return alu(Ops.OR, alu(Ops.CMPNE, re, _filled(re, 0)), alu(Ops.CMPNE, im, _filled(im, 0)))
    warnings.warn("Casting complex values to real discards the imaginary part", np.exceptions.ComplexWarning,
                  stacklevel=3)
    return cast(re, dtype)


def make_complex(re: Array, im: Array) -> Array:
    """The complex array re + i im from two float arrays of one shape and dtype (COMPLEX)."""
    return Array(UOp(Ops.COMPLEX, dtypes.complex_of(re.uop.dtype), (re.uop, im.uop)))


def real_part(z: Array) -> Array:
    """The real part of a complex array (REAL; the operand of a COMPLEX without a node); a real array itself."""
    u = z.uop
    if not u.dtype.is_complex: return z
    if u.op is Ops.COMPLEX: return Array(u.src[0])
    if u.op is Ops.CONST: return Array(UOp.const(u.dtype.component, u.arg.value.real, u.shape))
    return Array(UOp(Ops.REAL, u.dtype.component, (u,)))


def imag_part(z: Array) -> Array:
    """The imaginary part of a complex array (IMAG); zeros of its dtype for a real array."""
    u = z.uop
    if not u.dtype.is_complex: return Array(UOp.const(u.dtype, 0, u.shape))
    if u.op is Ops.COMPLEX: return Array(u.src[1])
    if u.op is Ops.CONST: return Array(UOp.const(u.dtype.component, u.arg.value.imag, u.shape))
    return Array(UOp(Ops.IMAG, u.dtype.component, (u,)))


def conjugate(z: Array) -> Array:
    """The complex conjugate of a complex array."""
    return make_complex(real_part(z), negate(imag_part(z)))


def inexact_dtype(dtype: DType) -> DType:
    """The float dtype an operation that needs floats computes in: float64 for 64-bit integers, float32 for the
    others (with x64 on too, as JAX's); complex types stay."""
    if dtype.is_inexact: return dtype
    return dtypes.float64 if dtype.itemsize == 8 else dtypes.float32


def promote(arrays: Sequence[Array], to_float: bool = False, numeric: bool = False) -> tuple[list[Array], bool]:
    """`arrays` cast to the dtype they promote to on JAX's lattice (weakly typed values adapt to the others), and
    whether that result is weakly typed. `to_float`: integers compute in floats (`inexact_dtype`); `numeric`: bools
    compute as int32 (JAX's numeric promotion: `True // True` is int32 1)."""
    dtype = arrays[0].uop.dtype if arrays else None
    if all(a.uop.dtype == dtype for a in arrays) and not all(a.weak_type for a in arrays):
        weak = False  # one dtype, some operand strong: that dtype (the lattice's join; most traced ops)
    else:
        dtype, weak = dtypes.result_type(*[(a.uop.dtype, a.weak_type) for a in arrays])
    if to_float: dtype = inexact_dtype(dtype)
    if numeric and dtype.is_bool: dtype, weak = dtypes.int32, False  # (int32 with x64 on too, as JAX)
    return [cast(a, dtype) for a in arrays], weak


def shape_str(*arrays: Array) -> str:
    """`float32[2, 3], int32[3]`: the operands of an op, for its error messages."""
    return ", ".join(f"{a.uop.dtype}{list(a.shape)}" for a in arrays)


def check_operand(name: str, a: Array, ok: bool, what: str) -> None:
    """Raise TypeError `{name} needs {what}, got <a's dtype and shape>` unless `ok`."""
    if not ok: raise TypeError(at_user_line(f"{name} needs {what}, got {shape_str(a)}"))


def normalize_axes(axes: Sequence[int] | int, ndim: int, name: str) -> tuple[int, ...]:
    """`axes` (an int or a sequence, possibly negative) as axes of a rank-`ndim` array, raising a ValueError that
    names the op `name` for out-of-range or repeated ones (TypeError for non-integers)."""
    out = []
    for a in (axes if isinstance(axes, (tuple, list)) or np.ndim(axes) else [axes]):
        try:
            a = operator.index(a)
        except TypeError:
            raise TypeError(at_user_line(f"{name}: axis must be an integer, got {a!r}")) from None
        if not -ndim <= a < ndim:
            raise ValueError(at_user_line(f"{name}: axis {a} is out of bounds for an array of rank {ndim}"))
        out.append(a % ndim if ndim else 0)
    if len(set(out)) != len(out):
        raise ValueError(at_user_line(f"{name}: repeated axis in {tuple(axes)}"))
    return tuple(out)


def broadcast_shapes(*shapes: Sequence[int], name: str = "broadcast_shapes") -> tuple[int, ...]:
    """The numpy broadcast of several shapes; raises ShapeError (a TypeError) naming `name` when they do not fit."""
    longest = max(shapes, key=len, default=())
    if all(s == longest or not s for s in shapes): return tuple(longest)  # (the common case, every traced op)
    ndim = len(longest)
    out = []
    for i in range(ndim):
        sizes = {s[len(s) - ndim + i] for s in shapes if len(s) - ndim + i >= 0} - {1}
        if len(sizes) > 1:
            raise ShapeError(at_user_line(f"{name}: incompatible shapes for broadcasting: "
                                          f"{', '.join(str(tuple(s)) for s in shapes)}"))
        out.append(sizes.pop() if sizes else 1)
    return tuple(out)


def movement(op: Ops, a: Array, arg: Any) -> Array:
    """One movement node (RESHAPE, EXPAND, PERMUTE, PAD, SHRINK, FLIP) over `a`; keeps its dtype and weak type."""
    return Array(UOp(op, a.uop.dtype, (a.uop,), arg), a.weak_type)


def broadcast_array(a: Array, shape: tuple[int, ...], name: str = "broadcast_to") -> Array:
    """`a` broadcast to `shape` with numpy's rules (RESHAPE to add leading axes, EXPAND); ShapeError naming `name`
    when it does not fit. A constant stays a constant."""
    if a.shape == shape: return a
    if broadcast_shapes(a.shape, shape, name=name) != shape:
        raise ShapeError(at_user_line(f"{name}: cannot broadcast {shape_str(a)} to shape {shape}"))
    if a.uop.op is Ops.CONST: return Array(UOp.const(a.uop.dtype, a.uop.arg.value, shape), a.weak_type)
    ranked = (1,) * (len(shape) - a.ndim) + a.shape
    out = a if ranked == a.shape else movement(Ops.RESHAPE, a, ranked)
    return out if ranked == shape else movement(Ops.EXPAND, out, shape)


def alu(op: Ops, *srcs: Array, weak: bool = False) -> Array:
    """One elementwise node over operands of one shape and dtype (WHERE: after its bool predicate); comparisons
    give bool."""
    dtype = dtypes.bool_ if op in GroupOp.Comparison else srcs[-1].uop.dtype
    return Array(UOp(op, dtype, tuple(s.uop for s in srcs)), weak)


def _filled(like: Array, value: Any) -> Array:
    return Array(UOp.const(like.uop.dtype, value, like.shape))


def negate(a: Array) -> Array:
    """-a as a multiply by -1, so unsigned integers wrap as in numpy (-1 is the all-ones value)."""
    return alu(Ops.MUL, a, _filled(a, -1), weak=a.weak_type)


def _not(a: Array) -> Array:
    """~a for bools and integers: xor with all ones."""
    return alu(Ops.XOR, a, _filled(a, True if a.uop.dtype.is_bool else -1))


def join(arrays: Sequence[Array], axis: int) -> Array:
    """Arrays of one dtype and rank, equal off `axis`, concatenated along it (the caller checks them) as a balanced
    tree of PAD + WHERE (no scatter)."""
    if len(arrays) == 1: return arrays[0]
    left, right = join(arrays[:len(arrays) // 2], axis), join(arrays[len(arrays) // 2:], axis)
    n_left, n_right = left.shape[axis], right.shape[axis]
    if n_left == 0 or n_right == 0: return right if n_left == 0 else left
    widths_left = tuple((0, n_right) if i == axis else (0, 0) for i in range(left.ndim))
    widths_right = tuple((n_left, 0) if i == axis else (0, 0) for i in range(left.ndim))
    in_right = movement(Ops.PAD, Array(UOp.const(dtypes.bool_, True, right.shape)), widths_right)
    return alu(Ops.WHERE, in_right, movement(Ops.PAD, right, widths_right), movement(Ops.PAD, left, widths_left),
               weak=left.weak_type and right.weak_type)


def stack_arrays(arrays: Sequence[Array], axis: int = 0) -> Array:
    """Arrays of one shape, promoted to one dtype, joined along a new `axis` (jax.numpy.stack)."""
    if not arrays: raise ValueError(at_user_line("stack: needs at least one array"))
    arrays, weak = promote(arrays)
    if any(a.shape != arrays[0].shape for a in arrays):
        raise ShapeError(at_user_line(f"stack: all input arrays must have the same shape, got {shape_str(*arrays)}"))
    shape = arrays[0].shape
    axis = normalize_axes(axis, len(shape) + 1, "stack")[0]
    rows = [movement(Ops.RESHAPE, a, shape[:axis] + (1,) + shape[axis:]) for a in arrays]
    return with_weak(join(rows, axis), weak)


# ---- elementwise functions: numpy broadcasting and JAX promotion over primitives ----

def prepare(name: str, *xs: Any, to_float: bool = False, numeric: bool = False) -> tuple[list[Array], bool]:
    """The arguments of elementwise function `name` converted (`as_operand`), promoted to one dtype (`promote`) and
    broadcast to one shape; returns them and whether the result is weakly typed."""
    arrays, weak = promote([as_operand(x, name) for x in xs], to_float=to_float, numeric=numeric)
    shape = broadcast_shapes(*[a.shape for a in arrays], name=name)
    return [broadcast_array(a, shape, name) for a in arrays], weak


def elementwise(name: str, compute: Callable, to_float: bool = False, numeric: bool = False,
                doc: str = "") -> Callable:
    """The public elementwise function `name`: `prepare` the arguments, then `compute` on operands of one shape and
    dtype; eager outside a trace. The result is weakly typed when the promotion was and `compute` kept the dtype."""
    def fn(*args):
        arrays, weak = prepare(name, *args, to_float=to_float, numeric=numeric)
        if arrays and arrays[0].uop.dtype.is_complex:
            out = complex_ufunc(name)(*arrays)
            return with_weak(out, weak and out.uop.dtype == arrays[0].uop.dtype)
        out = compute(*arrays)
        return with_weak(out, weak and out.uop.dtype == arrays[0].uop.dtype)
    fn.__name__ = fn.__qualname__ = name
    fn.__doc__ = doc or f"Elementwise {name} with numpy broadcasting and JAX type promotion. Returns an Array."
    fn.__signature__ = _ufunc_signature(compute)
    return jitted_elementwise(eager_op(fn))


_WIDE_FLOATS = frozenset({dtypes.float32, dtypes.float64, dtypes.complex64, dtypes.complex128})
_SINGLE_FLOATS = frozenset({dtypes.float32, dtypes.complex64})  # (x64 off: a weak float is float32)


def jitted_elementwise(fn: Callable) -> Callable:
    """An elementwise function whose eager calls run `jit` of it, as JAX's eager ops run a compiled primitive: a
    call with operands of shapes and dtypes seen before traces nothing. Built and realized op by op, an eager
    `x * 2.0` on (64, 128) took 53 us a call and an eager exp of 1,024 floats 1.3 ms (its range reduction and
    polynomial traced again each time), against JAX's 11 and 10 us; as jit 8 and 7 us.

    Only calls whose operands are concrete Arrays and Python numbers take the jit; anything else (numpy values, a
    list, a value left over from a finished trace), a call inside a trace and one under fnx.disable_jit run `fn`
    as before. A Python number is a weakly typed argument, so `x * float(i)` in a loop compiles once, as JAX
    passes it to its primitive. It must meet only arrays of a float or complex dtype as wide as the weak float
    (float32, or float64 with x64 on), where converting it at run time gives what converting the constant op by
    op gave; a narrower array's would convert through the weak type's int32 or float32, and a float64 array's
    with x64 off through float32 (a float16 array times 1 + 2**-11 + 2**-40: 1.001 from the double,
    1.0 through float32, JAX's answer), so those calls stay op by op and keep their results."""
    jitted: list = []

    @functools.wraps(fn)
    def wrapper(*args):
        if state.depth or (hook := jit_hook[0]) is None or not _jit_operands(args): return fn(*args)
        jit, jit_state = hook
        if jit_state.disabled: return fn(*args)
        if not jitted: jitted.append(jit(fn))
        return jitted[0](*args)
    return wrapper


jit_hook: list = [None]  # (fnx.transforms.jit's jit and its thread state, set when it is imported)


def _jit_operands(args: tuple) -> bool:
    """Whether eager elementwise operands may be jit arguments (jitted_elementwise)."""
    for a in args:
        if type(a) is Array:
            if a._buffer is None: return False
        elif type(a) not in (float, int, bool):
            return False
    return bool(args) and numbers_convert_exactly(args)


def numbers_convert_exactly(values: Any) -> bool:
    """Whether the Python numbers among `values` (operands that promote together) may be passed to a jitted
    function as weakly typed arguments: False when one meets an array of an integer, bool or 16-bit float dtype,
    or a 64-bit one with x64 off, which converts a constant straight from the Python value, not through the weak
    type's int32 or float32 (jitted_elementwise: nn's erfc, in float64 internally, lost its constants' low bits),
    or a numpy array, or when an int is outside int32 (x64 on: int64)."""
    numbers, narrow = False, False
    wide = _WIDE_FLOATS if dtypes.x64_enabled() else _SINGLE_FLOATS
    for a in values:
        if type(a) is Array:
            narrow = narrow or a._dtype not in wide
        elif isinstance(a, (np.ndarray, np.generic)):
            narrow = True
        elif type(a) is float:
            numbers = True
        elif type(a) is int:
            if not (-2 ** 31 <= a < 2 ** 31 or (dtypes.x64_enabled() and -2 ** 63 <= a < 2 ** 63)): return False
            numbers = True
    return not (numbers and narrow)


def refuse_complex(namespace: dict, names: Sequence[str], module: str) -> None:
    """Wrap each function `namespace[name]` so that a complex argument (an Array, numpy array or Python scalar)
    is a TypeError naming `module.name`: for the functions whose algorithms are real-only (fnx's linear algebra),
    which would otherwise cast a complex input to floats and drop its imaginary part."""
    for name in names:
        fn = namespace[name]

        def guarded(*args, _fn=fn, _name=name, **kwargs):
            if any(_is_complex_value(x) for x in itertools.chain(args, kwargs.values())):
                raise TypeError(at_user_line(f"{module}.{_name} does not support complex arrays in fnx yet"))
            return _fn(*args, **kwargs)
        namespace[name] = functools.wraps(fn)(guarded)


def _is_complex_value(x: Any) -> bool:
    if isinstance(x, Array): return x._dtype.is_complex
    if isinstance(x, (np.ndarray, np.generic)): return x.dtype.kind == "c"
    return isinstance(x, complex)


# the complex forms of the elementwise functions, by name: fnx/numpy_complex.py fills it
COMPLEX_UFUNCS: dict[str, Callable] = {}


def complex_ufunc(name: str) -> Callable:
    """The complex form of elementwise function `name`; a TypeError naming it when it has none (as JAX's for
    `less` and the other functions that are not defined on complex numbers)."""
    rule = COMPLEX_UFUNCS.get(name)
    if rule is None:
        raise TypeError(at_user_line(f"{name} does not accept complex arguments in fnx (it is not defined on complex "
                                     "numbers, or fnx has no complex form of it yet)"))
    return rule


def _ufunc_signature(compute: Callable) -> inspect.Signature | None:
    """`(x, /)` or `(x1, x2, /)`, as numpy's and JAX's ufuncs, from the arity of `compute` (None when it takes
    *args: help() then shows that)."""
    try:
        params = list(inspect.signature(compute).parameters.values())
    except (TypeError, ValueError):
        return None
    if any(p.kind is p.VAR_POSITIONAL for p in params): return None
    params = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD) and p.default is p.empty]
    if not params: return None
    names = ["x"] if len(params) == 1 else [f"x{i + 1}" for i in range(len(params))]
    return inspect.Signature([inspect.Parameter(n, inspect.Parameter.POSITIONAL_ONLY) for n in names])


_ARRAY_LIKE = (Array, np.ndarray, np.generic, bool, int, float, complex, list, tuple)


def apply_operator(fn: Callable, x: Any, y: Any) -> Any:
    """`fn(x, y)` for a binary operator of Array, or NotImplemented when an operand is not array-like (Python then
    asks the other operand; `x == None` is False)."""
    return fn(x, y) if isinstance(x, _ARRAY_LIKE) and isinstance(y, _ARRAY_LIKE) else NotImplemented


def _subtract(a: Array, b: Array) -> Array:
    check_operand("subtract", a, not a.uop.dtype.is_bool, "numeric operands (use logical_xor for bools)")
    return alu(Ops.ADD, a, negate(b))


def _negative(a: Array) -> Array:
    check_operand("negative", a, not a.uop.dtype.is_bool, "a numeric operand (use logical_not for bools)")
    return negate(a)


def _equal(a: Array, b: Array) -> Array:
    return _not(alu(Ops.CMPNE, a, b))


def _less_equal(a: Array, b: Array) -> Array:
    """a <= b: `a < b or a == b` for floats (NaN compares false), `not b < a` otherwise."""
    if a.uop.dtype.is_float: return alu(Ops.OR, alu(Ops.CMPLT, a, b), _equal(a, b))
    return _not(alu(Ops.CMPLT, b, a))


def _invert(a: Array) -> Array:
    check_operand("invert", a, not a.uop.dtype.is_float, "an integer or bool operand")
    return _not(a)


def _bitwise(op: Ops, name: str, symbol: str) -> Callable:
    def compute(a: Array, b: Array) -> Array:
        check_operand(name, a, not a.uop.dtype.is_float, "integer or bool operands")
        return alu(op, a, b)
    return elementwise(name, compute, doc=f"Elementwise {symbol} of integer or bool arrays.")


def _shift(op: Ops, name: str) -> Callable:
    def compute(a: Array, b: Array) -> Array:
        check_operand(name, a, a.uop.dtype.is_int, "integer operands")
        return alu(op, a, b)
    return elementwise(name, compute, numeric=True, doc=f"Elementwise {name} of integer arrays.")


add = elementwise("add", lambda a, b: alu(Ops.ADD, a, b))
subtract = elementwise("subtract", _subtract)
multiply = elementwise("multiply", lambda a, b: alu(Ops.MUL, a, b))
divide = elementwise("divide", lambda a, b: alu(Ops.DIV, a, b), to_float=True,
                     doc="x1 / x2 as floats (integers -> float32).")
negative = elementwise("negative", _negative, doc="-x elementwise (unsigned integers wrap).")
positive = elementwise("positive", lambda a: a)
equal = elementwise("equal", _equal)
not_equal = elementwise("not_equal", lambda a, b: alu(Ops.CMPNE, a, b))
less = elementwise("less", lambda a, b: alu(Ops.CMPLT, a, b))
greater = elementwise("greater", lambda a, b: alu(Ops.CMPLT, b, a))
less_equal = elementwise("less_equal", _less_equal)
greater_equal = elementwise("greater_equal", lambda a, b: _less_equal(b, a))
bitwise_and = _bitwise(Ops.AND, "bitwise_and", "&")
bitwise_or = _bitwise(Ops.OR, "bitwise_or", "|")
bitwise_xor = _bitwise(Ops.XOR, "bitwise_xor", "^")
invert = elementwise("invert", _invert, doc="Elementwise ~ (bitwise not; logical not for bools).")
left_shift = _shift(Ops.SHL, "left_shift")
right_shift = _shift(Ops.SHR, "right_shift")


def astype(x: Any, dtype: Any, /, *, copy: bool = False, device: Any = None) -> Array:
    """`x` converted to `dtype` (floats to ints truncate toward zero; to bool is x != 0), strongly typed; then put
    on `device` when one is given (`fnx.device_put`). `copy` changes nothing: arrays are immutable. An eager
    call on a concrete Array runs jit of the conversion to that dtype (one per dtype), as jitted_elementwise."""
    if (device is None and type(x) is Array and x._buffer is not None and not state.depth
            and (hook := jit_hook[0]) is not None and not hook[1].disabled):
        target = dtypes.requested(dtype, "astype")
        if (f := _astype_jits.get(target)) is None:
            f = _astype_jits[target] = hook[0](functools.partial(_astype, dtype=target))
            f._name = "astype"
        return f(x)
    return _astype_eager(x, dtype, device)


_astype_jits: dict = {}  # dtype -> the jit of the eager conversion to it


def _astype(x: Any, dtype: Any) -> Array:
    return with_weak(cast(as_operand(x, "astype"), dtypes.requested(dtype, "astype")), False)


@eager_op
def _astype_eager(x: Any, dtype: Any, device: Any) -> Array:
    out = _astype(x, dtype)
    return out if device is None else device_put_hook(out, device)


def device_put_hook(x: Any, device: Any) -> Any:
    """fnx.device_put, installed by fnx.devices when it is imported (it builds on this module)."""
    raise RuntimeError("fnx.devices is not imported")
