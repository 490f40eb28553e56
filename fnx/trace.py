"""Arrays, tracing and eager execution.

An `Array` wraps a UOp. A concrete array's UOp is a BUFFER (a device allocation); under a trace (jit, make_graph)
arrays wrap lazy graphs over PARAMs. `trace(f, ...)` turns a Python function on pytrees into
FUNCTION(TUPLE(outputs...), inputs...) where every BUFFER the function closed over became an extra PARAM.

Outside any trace, each `fnx.numpy` function runs eagerly: `eager_op` builds its graph lazily, then `realize`
compiles it once per (graph over PARAMs, device) and runs it.
"""
from __future__ import annotations

import collections
import contextlib
import functools
import importlib
import itertools
import math
import threading
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

from fnx import dtypes, tree_util
from fnx.backends.device import Buffer, Executable, canonical_device, get_backend
from fnx.config import config
from fnx.dtypes import DType
from fnx.errors import ConcretizationError, UnexpectedTracerError, at_user_line, user_frame
from fnx.uop import Ops, UOp


class _State(threading.local):
    """The trace state of one thread (each thread traces and runs on its own, as with JAX's thread-local trace
    contexts); a new thread starts eager, on the process's default device (FNX_DEVICE)."""

    def __init__(self):
        self.depth = 0              # how deep we are in op building: 0 means eager (each call realizes its result)
        self.tracing = 0            # > 0 inside a trace whose values are abstract (jit, make_graph)
        self.default_device = canonical_device(config.device)
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

    Arrays support numpy-style operators, indexing, `.at[...]` updates and the reduction methods; see fnx.numpy.

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
        if self._uop is None: self._uop = UOp(Ops.BUFFER, self._dtype, (), (self._buffer, self._shape))
        elif self._trace is not None and self._trace.closed: self._escaped()
        return self._uop

    @uop.setter
    def uop(self, uop: UOp) -> None:
        self._uop, self._shape, self._dtype = uop, uop.shape, uop.dtype
        self._buffer = uop.arg[0] if uop.op is Ops.BUFFER else None
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
    def device(self) -> Any:
        device = self._buffer.device if self._buffer is not None else self.uop.device
        return importlib.import_module("fnx.devices").device_object(device or state.default_device)

    @property
    def sharding(self) -> Any:
        return importlib.import_module("fnx.devices").SingleDeviceSharding(self.device)

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

    def _value(self) -> np.ndarray:
        """The value as a numpy array (runs pending work; raises ConcretizationError under a trace)."""
        if self._buffer is None:
            if self._trace is not None and self._trace.closed: self._escaped()
            if state.tracing:
                raise ConcretizationError(at_user_line(
                    f"a traced value of shape {self.shape} and dtype {self._dtype} was used where a concrete "
                    "value is needed (bool(), int(), float(), np.asarray, or a Python `if`). Under jit, use "
                    "fnx.numpy.where or fnx.lax.cond for value-dependent choices, or mark the argument static "
                    "with static_argnums"))
            if state.bindings:
                from fnx.rewrite import substitute
                return np.asarray(Array(realize([substitute(self.uop, state.bindings)])[0]).__array__())
            self.uop = realize([self.uop])[0]
        return self._buffer.numpy(self._shape)  # read-only, as every buffer's host array: arrays are immutable

    def __array__(self, dtype=None, copy=None) -> np.ndarray:
        value = self._value()
        return value.astype(dtype) if dtype is not None else value.copy() if copy else value

    def item(self) -> Any: return self._value().item()
    def tolist(self) -> Any: return self._value().tolist()
    def __bool__(self) -> bool: return bool(self._scalar_value("bool"))
    def __int__(self) -> int: return int(self._scalar_value("int"))
    def __float__(self) -> float: return float(self._scalar_value("float"))
    def __complex__(self) -> complex: return complex(self._scalar_value("complex"))

    def __index__(self) -> int:
        if not self._dtype.is_int and not self._dtype.is_bool:
            raise TypeError(at_user_line(f"only integer arrays can be used as an index, got {self._dtype}"))
        return int(self._scalar_value("index"))

    def _scalar_value(self, what: str) -> Any:
        value = self._value()  # under jit this raises ConcretizationError first, whatever the shape
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

    def __dlpack__(self, *args, **kwargs):
        return self._value().__dlpack__(*args, **kwargs)

    def __dlpack_device__(self):
        return self._value().__dlpack_device__()


# ---- eager execution ----

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


_executables = LRUCache(config.executables)


def compile_function(fn: UOp, device: str) -> Executable:
    """The cached Executable of FUNCTION `fn` on `device` (compiled on first use; the cache is an LRUCache)."""
    key = (fn.src[0], tuple((a.dtype, a.shape) for a in fn.src[1:]), device)  # unused inputs count too
    if (exe := _executables.get(key)) is None:
        exe = _executables.put(key, get_backend(device).compile(fn, device))
    return exe


def parameterize(outs: list[UOp]) -> tuple[UOp, list[UOp]]:
    """FUNCTION(TUPLE(outs)) with every BUFFER under `outs` replaced by a PARAM; also returns those BUFFERs."""
    from fnx.rewrite import substitute
    body = UOp(Ops.TUPLE, dtypes.bool_, tuple(outs))
    buffers = [u for u in body.toposort if u.op is Ops.BUFFER]
    params = {b: UOp(Ops.PARAM, b.dtype, (), (i, b.shape, b.device)) for i, b in enumerate(buffers)}
    new_body = substitute(body, params) if params else body
    return UOp(Ops.FUNCTION, dtypes.bool_, (new_body, *buffers)), buffers


def realize(outs: list[UOp]) -> list[UOp]:
    """Compute lazy graphs over BUFFERs; returns one BUFFER UOp per output."""
    pending = [u for u in outs if u.op is not Ops.BUFFER]
    if not pending: return outs
    fn, buffers = parameterize(pending)
    devices = {b.device for b in buffers}
    if len(devices) > 1:
        raise ValueError(at_user_line(f"an operation mixes arrays on different devices: {sorted(devices)}; "
                                      "move them with fnx.device_put first"))
    device = devices.pop() if devices else state.default_device
    fn, constants = _lift_constants(fn, device)
    inputs = [b.arg[0] for b in buffers] + [_constant_buffer(c, device) for c in constants]
    results = iter(run_function(fn, inputs, device))
    return [u if u.op is Ops.BUFFER else next(results) for u in outs]


def _lift_constants(fn: UOp, device: str) -> tuple[UOp, list[UOp]]:
    """FUNCTION `fn` with every constant of its body (not of nested bodies) read from a PARAM of shape () that
    follows the existing ones, and those constants. An eager op then compiles once per shape and dtype, not once
    per Python scalar (`x * float(i)` in a loop compiled and kept one kernel per i), as JAX passes a scalar to its
    compiled primitive as an argument. (jit keeps constants in the code, also as JAX does.)"""
    body = fn.src[0]
    found = [u for u in body.graph if u.op is Ops.CONST]
    if not found: return fn, []
    scalars = list(dict.fromkeys(UOp.const(c.dtype, c.arg[0]) for c in found))
    slot = {c: UOp(Ops.PARAM, c.dtype, (), (len(fn.src) - 1 + i, (), device)) for i, c in enumerate(scalars)}
    memo: dict[UOp, UOp] = {}
    for u in body.graph:
        if u.op is Ops.CONST:
            p = slot[UOp.const(u.dtype, u.arg[0])]
            memo[u] = p if not u.shape else UOp(Ops.EXPAND, u.dtype, (
                UOp(Ops.RESHAPE, u.dtype, (p,), (1,) * len(u.shape)),), u.shape)
        else:  # bodies of calls and control nodes are never in memo: they keep their own constants
            src = tuple(memo.get(s, s) for s in u.src)
            memo[u] = u if all(a is b for a, b in zip(src, u.src)) else UOp(u.op, u.dtype, src, u.arg)
    return UOp(Ops.FUNCTION, fn.dtype, (memo[body], *fn.src[1:], *slot.values())), scalars


_constant_buffers = LRUCache(4096)


def _constant_buffer(c: UOp, device: str) -> Buffer:
    """A device buffer holding scalar constant `c` (shared: buffers are immutable)."""
    key = (c, device)
    if (buf := _constant_buffers.get(key)) is None:
        buf = _constant_buffers.put(key, Buffer.from_numpy(device, np.array(c.arg[0], dtype=c.dtype.np)))
    return buf


def run_function(fn: UOp, inputs: list[Buffer], device: str) -> list[UOp]:
    """Run FUNCTION `fn` on `inputs`; returns BUFFER UOps of its outputs."""
    exe = compile_function(fn, device)
    return [UOp(Ops.BUFFER, out.dtype, (), (buf, out.shape))
            for out, buf in zip(fn.src[0].src, exe(inputs))]


def _realize_tree(tree: Any) -> Any:
    leaves, treedef = tree_util.tree_flatten(tree)
    lazy = [x for x in leaves if isinstance(x, Array) and x._buffer is None]
    if lazy:
        for a, u in zip(lazy, realize([a.uop for a in lazy])):
            a.uop = u
    return tree


def eager_op(fn: Callable) -> Callable:
    """Decorator for array-API functions: outside a trace, build the whole call lazily, then run it as one FUNCTION."""
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        if state.depth: return fn(*args, **kwargs)
        with building():
            out = fn(*args, **kwargs)
        return _realize_tree(out)
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
    if isinstance(x, (np.ndarray, np.generic)):
        return (tuple(np.shape(x)), dtypes.from_numpy(np.asarray(x).dtype), False)
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
    params = [Array(UOp(Ops.PARAM, dtype, (), (i, shape, device) + tag), weak)
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
    from fnx.lax import to_array
    out_leaves, out_tree = tree_util.tree_flatten(out)
    with building(tracing=True):
        out_arrays = [to_array(o) for o in out_leaves]
    if transform:
        body = UOp(Ops.TUPLE, dtypes.bool_, tuple(a.uop for a in out_arrays))
        return Traced(UOp(Ops.FUNCTION, dtypes.bool_, (body, *[p.uop for p in params])), in_tree, out_tree, [],
                      [a.weak_type for a in out_arrays])
    fn, consts = _hoist_constants([a.uop for a in out_arrays], [p.uop for p in params])
    return Traced(fn, in_tree, out_tree, consts, [a.weak_type for a in out_arrays])


def _leaf_uop(x: Any, param: UOp) -> UOp:
    """The UOp of an argument leaf (an Array's graph, or a host value as a constant of the PARAM's dtype)."""
    from fnx.lax import to_array
    return x.uop if isinstance(x, Array) else to_array(np.asarray(x, dtype=param.dtype.np)).uop


def inline(traced: Traced, outs: list[UOp], args: list[Any]) -> list[UOp]:
    """Graphs in terms of a transform trace's PARAMs, with the PARAMs replaced by the actual argument leaves."""
    from fnx.rewrite import substitute
    mapping = {p: _leaf_uop(x, p) for p, x in zip(traced.fn.src[1:], args)}
    root = substitute(UOp(Ops.TUPLE, dtypes.bool_, tuple(outs)), mapping)
    return list(root.src)


def _hoist_constants(outs: list[UOp], params: list[UOp]) -> tuple[UOp, list[UOp]]:
    """FUNCTION(TUPLE(outs), params..., consts...) with closed-over BUFFERs replaced by PARAMs numbered after the
    arguments' PARAMs."""
    from fnx.rewrite import substitute
    body = UOp(Ops.TUPLE, dtypes.bool_, tuple(outs))
    consts = [u for u in body.toposort if u.op is Ops.BUFFER]
    mapping = {b: UOp(Ops.PARAM, b.dtype, (), (len(params) + i, b.shape, b.device)) for i, b in enumerate(consts)}
    if mapping: body = substitute(body, mapping)
    return UOp(Ops.FUNCTION, dtypes.bool_, (body, *params, *mapping.values())), consts
