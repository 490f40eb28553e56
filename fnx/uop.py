"""The IR: `Ops` and the hash-consed, immutable `UOp` node with its derived shape and device.

A UOp is `(op, dtype, src, arg)`. Structurally equal UOps are the same object, so `is` is equality, common
subexpressions merge for free and a UOp can key a cache. Construction checks its sources and raises
`ShapeError` naming the op, the shapes and the user's source line.

An op whose arg is a record takes it as a named tuple (`ParamArg`, `ScanArg`, ... below, listed in `ARG_TYPES`),
read by field: `p.arg.slot`, `node.arg.ncarry`. Other args are plain values (an axis, a shape, a device).
"""
from __future__ import annotations

import contextlib
import gc
import math
import struct
import threading
import weakref
from functools import cached_property
from typing import Any, NamedTuple

from fnx import dtypes
from fnx.dtypes import DType
from fnx.errors import ShapeError, at_user_line


class _Op:
    """A placeholder in Ops's class body: the class makes each one its member of that name."""


class _OpsType(type):
    """Ops's metaclass: like an Enum's (members are the class's own singletons; `Ops[name]`, iteration in order,
    `.name`, `.value`), without EnumType's `__getattr__`. In Python 3.11 a metaclass with one makes every class
    attribute read go through a Python-level hook: `Ops.RANGE` took 0.16 us instead of 0.03, and the lowering
    reads such members millions of times."""

    def __new__(mcs, name, bases, namespace):
        cls = super().__new__(mcs, name, bases, {k: v for k, v in namespace.items() if not isinstance(v, _Op)})
        members = []
        for key, value in namespace.items():
            if isinstance(value, _Op):
                member = object.__new__(cls)
                object.__setattr__(member, "name", key)
                object.__setattr__(member, "value", len(members) + 1)
                members.append(member)
                type.__setattr__(cls, key, member)
        type.__setattr__(cls, "_members", tuple(members))
        type.__setattr__(cls, "_by_name", {m.name: m for m in members})
        return cls

    def __iter__(cls): return iter(cls._members)
    def __len__(cls) -> int: return len(cls._members)
    def __getitem__(cls, name: str): return cls._by_name[name]

    def __setattr__(cls, name, value):
        raise AttributeError(f"cannot reassign {cls.__name__}.{name}")


class Ops(metaclass=_OpsType):
    # source
    BUFFER = _Op(); PARAM = _Op(); CONST = _Op(); IOTA = _Op()  # noqa: E702
    # movement (shapes are static tuples in arg); INDEX gathers along one axis with an integer index array
    RESHAPE = _Op(); PERMUTE = _Op(); EXPAND = _Op(); PAD = _Op()  # noqa: E702
    SHRINK = _Op(); FLIP = _Op(); INDEX = _Op()  # noqa: E702
    # reduce: REDUCE(ReduceArg(op in ADD/MAX/MUL, axes)); SCATTER writes updates into a copy of its operand
    REDUCE = _Op(); SCATTER = _Op()  # noqa: E702
    # elementwise unary
    RECIP = _Op(); SQRT = _Op(); EXP2 = _Op(); LOG2 = _Op(); SIN = _Op()  # noqa: E702
    TRUNC = _Op(); CAST = _Op(); BITCAST = _Op()  # noqa: E702
    # elementwise binary
    ADD = _Op(); MUL = _Op(); DIV = _Op(); MAX = _Op(); MOD = _Op()  # noqa: E702
    CMPLT = _Op(); CMPNE = _Op()  # noqa: E702
    AND = _Op(); OR = _Op(); XOR = _Op(); SHL = _Op(); SHR = _Op()  # noqa: E702
    # elementwise ternary
    WHERE = _Op()
    # call
    FUNCTION = _Op(); CALL = _Op(); TUPLE = _Op(); GETTUPLE = _Op()  # noqa: E702
    # structured control flow (call family): bodies are TUPLEs over PARAMs tagged with the node's arg.tag
    COND = _Op(); WHILE = _Op(); SCAN = _Op()  # noqa: E702
    # markers
    CONTIGUOUS = _Op(); DETACH = _Op(); COPY = _Op()  # noqa: E702
    # collectives over a named (vmapped) axis: arg = CollectiveArg(kind, axis_name, size, axis, perm, split_axis)
    COLLECTIVE = _Op()
    # complex numbers: COMPLEX(re, im) builds one from two floats, REAL/IMAG take its parts (docs/COMPLEX.md); the
    # compiler sees complex values only in these, in movement ops, ADD, REDUCE(ADD), WHERE, CAST and markers
    COMPLEX = _Op(); REAL = _Op(); IMAG = _Op()  # noqa: E702
    # lowering only: never seen by transforms
    RANGE = _Op(); LOAD = _Op(); STORE = _Op(); ACC = _Op()  # noqa: E702
    ENDRANGE = _Op(); SINK = _Op()  # noqa: E702

    __slots__ = ("name", "value")
    # members are singletons compared and hashed by identity, in C (every hash-consed node's key holds one)

    def __repr__(self) -> str: return f"Ops.{self.name}"
    __str__ = __repr__

    def __setattr__(self, name, value):
        raise AttributeError(f"{self!r} is read-only")

    def __reduce__(self):
        return (getattr, (Ops, self.name))  # (unpickled and copied members are the class's own)


class GroupOp:
    Source = {Ops.BUFFER, Ops.PARAM, Ops.CONST, Ops.IOTA}
    Movement = {Ops.RESHAPE, Ops.PERMUTE, Ops.EXPAND, Ops.PAD, Ops.SHRINK, Ops.FLIP}
    Unary = {Ops.RECIP, Ops.SQRT, Ops.EXP2, Ops.LOG2, Ops.SIN, Ops.TRUNC, Ops.CAST, Ops.BITCAST}
    Binary = {Ops.ADD, Ops.MUL, Ops.DIV, Ops.MAX, Ops.MOD, Ops.CMPLT, Ops.CMPNE,
                        Ops.AND, Ops.OR, Ops.XOR, Ops.SHL, Ops.SHR}
    Ternary = {Ops.WHERE}
    ALU = Unary | Binary | Ternary
    Comparison = {Ops.CMPLT, Ops.CMPNE}
    Commutative = {Ops.ADD, Ops.MUL, Ops.MAX, Ops.CMPNE, Ops.AND, Ops.OR, Ops.XOR}
    Call = {Ops.FUNCTION, Ops.CALL, Ops.TUPLE, Ops.GETTUPLE}
    Control = {Ops.COND, Ops.WHILE, Ops.SCAN}
    Marker = {Ops.CONTIGUOUS, Ops.DETACH, Ops.COPY}
    Lowering = {Ops.RANGE, Ops.LOAD, Ops.STORE, Ops.ACC, Ops.ENDRANGE, Ops.SINK}
    Complex = {Ops.COMPLEX, Ops.REAL, Ops.IMAG}
    # the ops that may take or give complex values (every other one is on real types)
    ComplexSafe = Movement | Complex | Marker | {Ops.ADD, Ops.WHERE, Ops.CAST, Ops.REDUCE, Ops.INDEX, Ops.CONST,
                                                 Ops.BUFFER, Ops.PARAM, Ops.COLLECTIVE}
    # the frontend primitives: every transform has exactly one rule for each of these
    Primitives = Source | Movement | {Ops.INDEX, Ops.REDUCE, Ops.SCATTER, Ops.COLLECTIVE} | ALU | Call | Control \
        | Marker | Complex


Shape = tuple[int, ...]


# ---- node arguments: a named tuple per op whose arg is a record (docs/IR.md lists them beside the ops) ----

class BufferArg(NamedTuple):
    """BUFFER: a device allocation (fnx.backends' Buffer; the IR does not import backends) viewed with `shape`."""
    buffer: Any
    shape: Shape


class ParamArg(NamedTuple):
    """PARAM: argument `slot` of the FUNCTION, call or control body that binds `tag` (`()`: a FUNCTION's own,
    `(t,)`: control node t's, `("custom", n)`: a custom call's, `("call", n)`: a call vmap or shard_map built; see
    `UOp.binds`), living on `device`."""
    slot: int
    shape: Shape
    device: str | None
    tag: tuple = ()


class ConstArg(NamedTuple):
    """CONST: the Python scalar `value` (held as the node's dtype holds it) broadcast to `shape`."""
    value: bool | int | float
    shape: Shape


class IotaArg(NamedTuple):
    """IOTA: an integer array of `shape` whose value is its index along `axis`."""
    shape: Shape
    axis: int


class ReduceArg(NamedTuple):
    """REDUCE: reduce with `op` (ADD, MAX or MUL) over `axes` (kept with size 1); inside a kernel `axes` is ()
    and the loops reduced over are the node's RANGE sources."""
    op: Ops
    axes: tuple[int, ...]


class ScatterArg(NamedTuple):
    """SCATTER: combine the updates into a copy of the operand along `axis`; mode set/add/mul/min/max."""
    axis: int
    mode: str


class ControlArg(NamedTuple):
    """COND and WHILE: the tag their bodies' PARAMs carry (as `ParamArg.tag == (tag,)`)."""
    tag: int


class ScanArg(NamedTuple):
    """SCAN: body tag; the operands are `ncarry` carries, then `nxs` arrays scanned along their leading axis of
    `length` (last to first when `reverse`), then closed-over values."""
    tag: int
    ncarry: int
    length: int
    reverse: bool
    nxs: int


class CollectiveArg(NamedTuple):
    """COLLECTIVE: `kind` (psum, pmax, pmin, all_gather, axis_index, psum_scatter, ppermute, all_to_all) over the
    named axis `axis_name` of `size` examples. `axis` is where all_gather puts the gathered axis, the axis
    psum_scatter splits into `size` chunks and the axis all_to_all concatenates along (0 for the others);
    `perm` holds ppermute's (source, destination) pairs and `split_axis` the axis all_to_all splits. psum_scatter
    and all_to_all are the tiled forms: fnx.lax builds the untiled ones from them."""
    kind: str
    axis_name: str
    size: int
    axis: int
    perm: tuple = ()
    split_axis: int = 0


class RangeArg(NamedTuple):
    """RANGE (lowering only): loop `number` (unique within a kernel), running over [0, size)."""
    number: int
    size: int


# the arg class each of these ops must be built with: a plain tuple with the same fields would be hash-consed
# into the same node (a named tuple equals that tuple), so construction rejects one (checked on a cache miss)
ARG_TYPES: dict[Ops, type] = {Ops.BUFFER: BufferArg, Ops.PARAM: ParamArg, Ops.CONST: ConstArg, Ops.IOTA: IotaArg,
                              Ops.REDUCE: ReduceArg, Ops.SCATTER: ScatterArg, Ops.COND: ControlArg,
                              Ops.WHILE: ControlArg, Ops.SCAN: ScanArg, Ops.COLLECTIVE: CollectiveArg,
                              Ops.RANGE: RangeArg}


def prod(xs) -> int:
    return math.prod(xs)


def _fail(op: Ops, message: str, *srcs: UOp) -> ShapeError:
    shapes = ", ".join(f"{s.dtype}{list(s.shape) if s.shape is not None else '(tuple)'}" for s in srcs)
    return ShapeError(at_user_line(f"{op.name}: {message} (operands: {shapes})"))


_float_bits = struct.Struct("<d").pack


def _const_key(arg: ConstArg) -> tuple:
    # 0.0 == -0.0 and nan != nan in Python: key floats by their bits so hash-consing keeps them apart / together
    # (all 64 of them: float.hex() writes every NaN as "nan", and a -nan constant alive elsewhere would stand in for
    # a +nan one: its sign is what a bitcast reads, e.g. the sort's keys)
    value, shape = arg  # (unpacked, not read by field: a plain tuple gets as far as UOp.__new__'s TypeError)
    if isinstance(value, float): return (_float_bits(value), shape)
    if isinstance(value, complex): return (_float_bits(value.real), _float_bits(value.imag), shape)
    return ((type(value), value), shape)


class UOp:
    """An immutable, hash-consed IR node: `UOp(op, dtype, src, arg)`; equal structure gives the same object."""
    __slots__ = ("op", "dtype", "src", "arg", "shape", "__weakref__", "__dict__")
    _interned: weakref.WeakValueDictionary = weakref.WeakValueDictionary()

    op: Ops
    dtype: DType
    src: tuple[UOp, ...]
    arg: Any
    shape: Shape | None

    def __new__(cls, op: Ops, dtype: DType, src: tuple[UOp, ...] = (), arg: Any = None) -> UOp:
        key = (op, dtype, src, _const_key(arg) if op is Ops.CONST else arg)
        # (the dictionary's own weak references, read directly: WeakValueDictionary.get cost 1.4 us a lookup, a
        # tenth of lowering; a reference whose node is gone reads None and the node is made again)
        if (ref := _interned_refs.get(key)) is not None and (found := ref()) is not None:
            return found
        if (want := ARG_TYPES.get(op)) is not None and type(arg) is not want:
            raise TypeError(f"{op.name} takes a {want.__name__} arg, got {arg!r}")
        u = object.__new__(cls)
        u.op, u.dtype, u.src, u.arg = op, dtype, src, arg
        u.shape = _infer_shape(u)
        _intern(key, u)
        return u

    @classmethod
    def scalar(cls, op: Ops, dtype: DType, src: tuple[UOp, ...], arg: Any) -> UOp:
        """`UOp(op, dtype, src, arg)` for a node of a kernel's scalar graph (shape (), every source scalar) that fnx
        built before and trusts (a lowering read back from its cache): no checks and no shape inference."""
        key = (op, dtype, src, _const_key(arg) if op is Ops.CONST else arg)
        if (ref := _interned_refs.get(key)) is not None and (found := ref()) is not None:
            return found
        u = object.__new__(cls)
        u.op, u.dtype, u.src, u.arg, u.shape = op, dtype, src, arg, ()
        _intern(key, u)
        return u

    def __reduce__(self):
        return (UOp, (self.op, self.dtype, self.src, self.arg))

    def __repr__(self) -> str:
        arg = "" if self.arg is None else f", arg={self.arg!r}"
        return f"UOp({self.op}, {self.dtype}, shape={self.shape}, nsrc={len(self.src)}{arg})"

    # ---- derived properties ----
    @property
    def ndim(self) -> int: return len(self.shape)

    @property
    def size(self) -> int: return prod(self.shape)

    @cached_property
    def device(self) -> str | None:
        """The device a PARAM, BUFFER or COPY names, else the first device found among the sources (TUPLEs
        skipped), None if none; computed once a node, sources first without recursion (a jitted chain of 500 ops
        before a jnp.exp overflowed Python's stack here)."""
        if (d := _own_device(self)) is not _UNKNOWN: return d  # (the common case: the sources' are known)
        for u in postorder(self, _device_children):
            if u is not self: u.__dict__["device"] = _own_device(u)
        return _own_device(self)

    @cached_property
    def toposort(self) -> list[UOp]:
        """Every node reachable from this one, sources before users (iterative: graphs can be deep)."""
        return postorder(self)

    @property
    def operands(self) -> tuple[UOp, ...]:
        """The sources that are values: a call's or control node's bodies excluded (COND: predicate first)."""
        if self.op in (Ops.FUNCTION, Ops.CALL, Ops.SCAN): return self.src[1:]
        if self.op in (Ops.COND, Ops.WHILE): return self.src[2:]
        return self.src

    @property
    def binds(self) -> tuple | None:
        """The tag of the PARAMs this node's bodies bind (a custom call's or a control node's), else None."""
        if self.op is Ops.CALL: return getattr(self.arg, "tag", None)
        if self.op in GroupOp.Control: return (self.arg.tag,)
        return None

    @cached_property
    def graph(self) -> list[UOp]:
        """Like toposort, but without entering the bodies of calls and control nodes."""
        return postorder(self, lambda u: u.src if u is self and u.op is Ops.TUPLE else u.operands)

    @cached_property
    def bounds(self) -> tuple[int | float, int | float]:
        """An interval that holds every value of this (integer, scalar) node; used to simplify index arithmetic."""
        return _bounds(self)

    # ---- construction helpers (used by the lowering for scalar index arithmetic) ----
    @staticmethod
    def const(dtype: DType, value: Any, shape: Shape = ()) -> UOp:
        if type(value) is int and not shape and (found := _int_consts.get((dtype, value))) is not None:
            return found  # (index arithmetic makes tens of thousands of small integer constants a lowering)
        u = UOp(Ops.CONST, dtype, (), ConstArg(scalar_of(value, dtype), tuple(shape)))
        if type(value) is int and not shape and len(_int_consts) < INT_CONSTS: _int_consts[(dtype, value)] = u
        return u

    def const_like(self, value: Any) -> UOp:
        return UOp.const(self.dtype, value, self.shape)

    def alu(self, op: Ops, *others: UOp | int | float) -> UOp:
        like = next((o for o in others if isinstance(o, UOp)), self) if op is Ops.WHERE else self
        srcs = (self,) + tuple(o if isinstance(o, UOp) else like.const_like(o) for o in others)
        dtype = dtypes.bool_ if op in GroupOp.Comparison else srcs[-1].dtype if op is Ops.WHERE else self.dtype
        return UOp(op, dtype, srcs)

    def cast(self, dtype: DType) -> UOp:
        return self if dtype == self.dtype else UOp(Ops.CAST, dtype, (self,))

    def __add__(self, other): return self.alu(Ops.ADD, other)
    def __radd__(self, other): return self.alu(Ops.ADD, other)
    def __mul__(self, other): return self.alu(Ops.MUL, other)
    def __rmul__(self, other): return self.alu(Ops.MUL, other)
    def __floordiv__(self, other): return self.alu(Ops.DIV, other)
    def __mod__(self, other): return self.alu(Ops.MOD, other)
    def __lt__(self, other): return self.alu(Ops.CMPLT, other)
    # (== and hash are object's: identity, which hash-consing makes structural equality, computed in C)

    @property
    def const_value(self) -> Any:
        return self.arg.value if self.op is Ops.CONST else None


_UNKNOWN = object()


def _direct_device(u: UOp):
    """u's device when it needs no walk (it names one, is a leaf, or has it computed already), else _UNKNOWN."""
    if u.op is Ops.PARAM: return u.arg.device
    if u.op is Ops.BUFFER: return u.arg.buffer.device
    if u.op is Ops.COPY: return u.arg
    if not u.src: return None
    return u.__dict__.get("device", _UNKNOWN)


def _device_children(u: UOp) -> tuple[UOp, ...]:
    """The sources whose devices u's depends on and that need a walk."""
    if u.op in (Ops.PARAM, Ops.BUFFER, Ops.COPY): return ()
    return tuple(s for s in u.src if s.op is not Ops.TUPLE and _direct_device(s) is _UNKNOWN)


def _own_device(u: UOp):
    """u's device from its sources' (the first one that has one), or _UNKNOWN when a source's needed is not known
    yet."""
    if u.op in (Ops.PARAM, Ops.BUFFER, Ops.COPY) or not u.src: return _direct_device(u)
    for s in u.src:
        if s.op is not Ops.TUPLE and (d := _direct_device(s)) is not None: return d
    return None


_interned_refs = UOp._interned.data  # key -> weak reference (see UOp.__new__)
INT_CONSTS = 1 << 14  # scalar integer constants UOp.const keeps alive and finds by (dtype, value)
_int_consts: dict[tuple, UOp] = {}


def _intern(key: tuple, u: UOp, interned=UOp._interned, ref=weakref.KeyedRef) -> None:
    """`UOp._interned[key] = u`, without WeakValueDictionary.__setitem__'s call overhead."""
    if interned._pending_removals: interned._commit_removals()
    interned.data[key] = ref(u, interned._remove, key)


def with_src(u: UOp, src: tuple[UOp, ...]) -> UOp:
    """u with sources `src`: u itself when they are its own (a rewrite that changed nothing below u)."""
    return u if all(a is b for a, b in zip(src, u.src)) else UOp(u.op, u.dtype, src, u.arg)


def postorder(root: UOp, children=None, stop: set | dict = frozenset()) -> list[UOp]:
    """The nodes under `root` (not below those in `stop`), each after its `children(node)` (its sources when None);
    iterative."""
    order: list[UOp] = []
    seen: set[UOp] = set()  # (`stop` is looked into, not copied: graph_rewrite passes its whole memo each call)
    stack: list[tuple[UOp, bool]] = [(root, False)]
    pop, push, visit, emit = stack.pop, stack.append, seen.add, order.append  # (the lowering's hottest loop)
    while stack:
        u, expanded = pop()
        if expanded:
            emit(u)
            continue
        if u in seen or u in stop: continue
        visit(u)
        push((u, True))
        for s in reversed(u.src if children is None else children(u)):
            if s not in seen and s not in stop: push((s, False))
    return order


def scalar_of(value: Any, dtype: DType) -> bool | int | float:
    """A Python scalar holding `value` as `dtype` holds it (integers wrap as two's complement, like numpy)."""
    if dtype.is_bool: return bool(value)
    if dtype.is_float: return float(value)
    if dtype.is_complex: return complex(value)
    bits, v = 8 * dtype.itemsize, int(value)
    v &= (1 << bits) - 1
    return v - (1 << bits) if not dtype.is_unsigned and v >= 1 << (bits - 1) else v


def _bounds(u: UOp) -> tuple[int | float, int | float]:
    if u.dtype.is_inexact: return (-math.inf, math.inf)
    lo, hi = (u.dtype.min, u.dtype.max) if not u.dtype.is_bool else (0, 1)
    out = _int_bounds(u)
    # a result that can leave the dtype's range wraps around: then nothing narrower than the range is known
    return out if out is not None and lo <= out[0] <= out[1] <= hi else (lo, hi)


def _int_bounds(u: UOp) -> tuple[int, int] | None:
    if u.op is Ops.CONST: return (u.arg.value, u.arg.value)
    if u.op is Ops.RANGE: return (0, u.arg.size - 1)
    if u.op is Ops.CAST and not u.src[0].dtype.is_float: return u.src[0].bounds
    if len(u.src) == 2 and u.op in (Ops.ADD, Ops.MUL, Ops.MAX, Ops.DIV, Ops.MOD):
        (a, b), (c, d) = u.src[0].bounds, u.src[1].bounds
        if u.op is Ops.ADD: return (a + c, b + d)
        if u.op is Ops.MAX: return (max(a, c), max(b, d))
        if u.op is Ops.MUL:
            corners = [x * y for x in (a, b) for y in (c, d)]
            return (min(corners), max(corners))
        if u.op is Ops.DIV and c == d and c > 0 and a >= 0: return (a // c, b // c)
        if u.op is Ops.MOD and c == d and c > 0 and a >= 0: return (0, min(b, c - 1))
    if u.op is Ops.XOR and u.dtype.is_int and not u.dtype.is_unsigned and (ones := next(
            (i for i, s in enumerate(u.src) if s.op is Ops.CONST and s.arg.value == -1), None)) is not None:
        a, b = u.src[1 - ones].bounds  # ~x = -x - 1 (how min(x, y) = ~max(~x, ~y) is built)
        return (-b - 1, -a - 1)
    if u.op is Ops.WHERE:
        (a, b), (c, d) = u.src[1].bounds, u.src[2].bounds
        cond = u.src[0]
        if cond.op is Ops.CMPLT and cond.src[0] is u.src[1] and cond.src[1].op is Ops.CONST:  # min(x, c - 1)
            b = min(b, cond.src[1].arg.value - 1)
        return (min(a, c), max(b, d))
    return None


# ---- shape inference: one function per op group, each raising ShapeError with the op and shapes ----

def _check_axes(op: Ops, axes: tuple[int, ...], ndim: int, x: UOp) -> None:
    if any(not 0 <= a < ndim for a in axes) or len(set(axes)) != len(axes):
        raise _fail(op, f"axes {axes} out of range or repeated for rank {ndim}", x)


def _infer_shape(u: UOp) -> Shape | None:
    op, src, arg = u.op, u.src, u.arg
    if op in (Ops.CONST, Ops.BUFFER, Ops.PARAM): return tuple(arg.shape)
    if op is Ops.IOTA:  # the index along `axis`
        if not 0 <= arg.axis < len(arg.shape) or not u.dtype.is_int:
            raise _fail(op, f"bad iota along axis {arg.axis} of shape {arg.shape} of {u.dtype}")
        return tuple(arg.shape)
    if op in GroupOp.Lowering: return ()
    if op is Ops.COLLECTIVE: return _collective_shape(op, src, arg)
    if op in (Ops.TUPLE, Ops.FUNCTION, Ops.CALL) or op in GroupOp.Control: return None
    if op is Ops.GETTUPLE:
        body = src[0] if src[0].op is Ops.TUPLE else src[0].src[0]
        if not 0 <= arg < len(body.src):
            raise _fail(op, f"index {arg} out of range for a tuple of {len(body.src)}", src[0])
        if (shapes := getattr(src[0].arg, "out_shapes", None)) is not None: return shapes[arg]  # shard_map: global
        if src[0].op is Ops.SCAN and arg >= src[0].arg.ncarry:  # per-step outputs are stacked along a new axis
            return (src[0].arg.length,) + body.src[arg].shape
        return body.src[arg].shape
    x = src[0]
    if op in GroupOp.Movement: return _movement_shape(op, x, arg)
    if op is Ops.INDEX:
        axis, idx = arg, src[1]
        if not idx.dtype.is_int: raise _fail(op, "indices must be integers", x, idx)
        _check_axes(op, (axis,), x.ndim, x)
        if x.shape[axis] == 0 and idx.size: raise _fail(op, f"cannot gather from an empty axis {axis}", x, idx)
        return x.shape[:axis] + idx.shape + x.shape[axis + 1:]
    if op is Ops.SCATTER:
        axis, idx, upd = arg.axis, src[1], src[2]
        _check_axes(op, (axis,), x.ndim, x)
        if upd.shape != x.shape[:axis] + idx.shape + x.shape[axis + 1:] or not idx.dtype.is_int or upd.dtype != x.dtype:
            raise _fail(op, f"updates must have shape operand[:{axis}] + indices.shape + operand[{axis}+1:]",
                        x, idx, upd)
        return x.shape
    if op is Ops.REDUCE:
        reduce_op, axes = arg.op, arg.axes
        if reduce_op not in (Ops.ADD, Ops.MAX, Ops.MUL): raise _fail(op, f"cannot reduce with {reduce_op}", x)
        if x.dtype.is_complex and reduce_op is not Ops.ADD:
            raise _fail(op, f"cannot reduce complex values with {reduce_op}", x)
        _check_axes(op, axes, x.ndim, x)
        return tuple(1 if i in axes else s for i, s in enumerate(x.shape))
    if op in GroupOp.ALU: return _alu_shape(u)
    if op in GroupOp.Marker: return x.shape
    if op in GroupOp.Complex: return _complex_shape(u)
    raise _fail(op, "no shape rule for this op", *src)


def _complex_shape(u: UOp) -> Shape:
    op, src = u.op, u.src
    if op is Ops.COMPLEX:
        re, im = src
        if re.shape != im.shape or not re.dtype.is_float or im.dtype != re.dtype or u.dtype.component != re.dtype \
                or not u.dtype.is_complex:
            raise _fail(op, f"needs two floats of one shape and dtype, giving the complex type of theirs ({u.dtype})",
                        *src)
        return re.shape
    if not src[0].dtype.is_complex or u.dtype != src[0].dtype.component:
        raise _fail(op, f"needs a complex operand and gives its parts' type ({u.dtype})", *src)
    return src[0].shape


def _collective_shape(op: Ops, src: tuple[UOp, ...], arg: CollectiveArg) -> Shape:
    if arg.kind == "axis_index": return ()
    x = src[0]
    if arg.kind == "all_gather": return x.shape[:arg.axis] + (arg.size,) + x.shape[arg.axis:]
    if arg.kind not in ("psum_scatter", "all_to_all"): return x.shape
    # the tiled forms: one axis split into `size` chunks (all_to_all concatenates them along `axis`)
    split = arg.split_axis if arg.kind == "all_to_all" else arg.axis
    _check_axes(op, tuple({split, arg.axis}), x.ndim, x)  # (the two may be the same axis)
    if x.shape[split] % arg.size:
        raise _fail(op, f"{arg.kind}: axis {split} of shape {x.shape} does not split into {arg.size} chunks (the "
                        f"size of axis name {arg.axis_name!r})", x)
    out = list(x.shape)
    out[split] //= arg.size
    if arg.kind == "all_to_all": out[arg.axis] *= arg.size
    return tuple(out)


def _movement_shape(op: Ops, x: UOp, arg: Any) -> Shape:
    shape = x.shape
    if op is Ops.RESHAPE:
        if any(s < 0 for s in arg) or prod(arg) != prod(shape): raise _fail(op, f"cannot reshape to {arg}", x)
        return tuple(arg)
    if op is Ops.PERMUTE:
        if sorted(arg) != list(range(len(shape))): raise _fail(op, f"{arg} is not a permutation of the axes", x)
        return tuple(shape[i] for i in arg)
    if op is Ops.EXPAND:
        if len(arg) != len(shape) or any(s != t and s != 1 or t < 0 for s, t in zip(shape, arg)):
            raise _fail(op, f"cannot broadcast to {arg}", x)
        return tuple(arg)
    if len(arg) != len(shape): raise _fail(op, f"needs one (begin, end) pair per axis, got {arg}", x)
    if op is Ops.PAD:
        if any(b < 0 or e < 0 for b, e in arg): raise _fail(op, f"negative padding {arg}", x)
        return tuple(s + b + e for s, (b, e) in zip(shape, arg))
    if op is Ops.SHRINK:
        if any(not 0 <= b <= e <= s for s, (b, e) in zip(shape, arg)): raise _fail(op, f"bounds {arg} out of range", x)
        return tuple(e - b for b, e in arg)
    return shape  # FLIP: arg is one bool per axis


_CHECKED = frozenset({Ops.WHERE, Ops.CAST, Ops.BITCAST, Ops.SHL, Ops.SHR, Ops.AND, Ops.OR, Ops.XOR, Ops.RECIP,
                      Ops.SQRT, Ops.EXP2, Ops.LOG2, Ops.SIN})  # ops with rules beyond equal operand dtypes


def _alu_shape(u: UOp) -> Shape:
    op, src = u.op, u.src
    shape, first = src[0].shape, src[0].dtype
    for s in src:  # (plain loops and identity tests first: every node of every kernel graph comes through here)
        if s.shape != shape: raise _fail(op, "elementwise operands must have equal shapes (broadcast first)", *src)
    if (u.dtype.kind == "c" or any(s.dtype.kind == "c" for s in src)) and op not in GroupOp.ComplexSafe:
        raise _fail(op, "is not defined on complex values (fnx computes them on their real and imaginary parts)",
                    *src)
    if op not in _CHECKED and all(s.dtype is first for s in src) and u.dtype is (
            dtypes.bool_ if op in GroupOp.Comparison else first):
        return shape
    if op is Ops.WHERE:
        if not src[0].dtype.is_bool or src[1].dtype != src[2].dtype or u.dtype != src[1].dtype:
            raise _fail(op, "needs a bool condition and two branches of the result's dtype", *src)
    elif op is Ops.CAST:
        if u.dtype.is_complex != src[0].dtype.is_complex:
            raise _fail(op, f"cannot cast between real and complex ({u.dtype}): use COMPLEX / REAL", *src)
    elif op is Ops.BITCAST:
        if u.dtype.itemsize != src[0].dtype.itemsize: raise _fail(op, f"cannot bitcast to {u.dtype}", *src)
    elif op is not Ops.CAST:
        if any(s.dtype != src[0].dtype for s in src): raise _fail(op, "operands must have the same dtype", *src)
        want = dtypes.bool_ if op in GroupOp.Comparison else src[0].dtype
        if u.dtype != want: raise _fail(op, f"result dtype {u.dtype} should be {want}", *src)
        if op in (Ops.SHL, Ops.SHR) and not src[0].dtype.is_int: raise _fail(op, "shifts need integer operands", *src)
        if op in (Ops.AND, Ops.OR, Ops.XOR) and src[0].dtype.is_float:
            raise _fail(op, "needs integer or bool operands", *src)
        if op in (Ops.RECIP, Ops.SQRT, Ops.EXP2, Ops.LOG2, Ops.SIN) and not src[0].dtype.is_float:
            raise _fail(op, "needs floating-point operands", *src)
    return src[0].shape


_pause = {"depth": 0, "resume": False}
_pause_lock = threading.Lock()


@contextlib.contextmanager
def collector_paused():
    """Python's cyclic garbage collector off while graphs are built (a trace, its lowering, a cached lowering read
    back): that makes tens of thousands of small objects, each counting towards the collector's next run, and a
    full collection walks every object of the process (1-2 ms with ~100k of them, several times a trace). UOps
    hold no cycles; cycles made meanwhile are collected afterwards. Nested and from several threads at once, the
    collector comes back on when the last one ends, if it was on. Measured: the W4 step's first call 0.20-0.23 ->
    0.17-0.19 s, the W9 GPT step's 0.96-1.07 -> 0.88-0.94 s."""
    with _pause_lock:
        if _pause["depth"] == 0:
            _pause["resume"] = gc.isenabled()
            gc.disable()
        _pause["depth"] += 1
    try:
        yield
    finally:
        with _pause_lock:
            _pause["depth"] -= 1
            if _pause["depth"] == 0 and _pause["resume"]: gc.enable()
