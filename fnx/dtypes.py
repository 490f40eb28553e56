"""Data types and type promotion for fnx.

fnx supports 15 dtypes: ``bool_``, signed and unsigned integers of 8-64 bits,
``float16``, ``bfloat16``, ``float32``, ``float64``, ``complex64`` and ``complex128`` (complex values are pairs of
floats; docs/COMPLEX.md says how the compiler carries them).

64-bit types follow JAX's ``jax_enable_x64`` flag (``fnx.config.update("jax_enable_x64", True)``, the
``JAX_ENABLE_X64`` / ``FNX_ENABLE_X64`` environment variables, or the ``fnx.enable_x64(True)`` context manager):

* x64 off (the default, as in JAX): values entering fnx are canonicalized to 32 bits -- numpy float64 / int64 /
  uint64 arrays and scalars become float32 / int32 / uint32 silently, an explicitly requested 64-bit ``dtype=``
  becomes its 32-bit type with JAX's UserWarning, and a Python int beyond int32 is an OverflowError. Python
  scalars and creation functions default to ``float32`` / ``int32``.
* x64 on: 64-bit types are kept, and Python scalars and creation functions default to ``float64`` / ``int64``.

In both modes a Python ``int`` / ``float`` is weakly typed (it adapts to the other operand), a Python ``bool`` is a
strong ``bool_``, and numpy scalars are strongly typed. Promotion is JAX's lattice; with x64 off a result no operand
asked to be 64-bit is narrowed to 32 bits (``int32 + uint32`` is ``int32``), as JAX canonicalizes it. (fnx's own
code may still build 64-bit values with x64 off, e.g. float64 accumulators; those promote as with x64 on.)
"""
from __future__ import annotations

import contextlib
import functools
import threading
import warnings
from dataclasses import dataclass
from typing import Any, Iterator

import ml_dtypes
import numpy as np

from fnx.config import config

__all__ = [
    "DType", "DTYPES", "COMPLEX_DTYPES", "ALL_DTYPES", "bool_", "int8", "int16", "int32", "int64", "uint8", "uint16",
    "uint32", "uint64", "float16", "bfloat16", "float32", "float64", "complex64", "complex128", "to_dtype",
    "from_numpy", "promote_types", "result_type", "canonicalize_scalar", "finfo", "iinfo", "default_int",
    "default_float", "default_complex", "complex_of", "x64_enabled", "enable_x64", "canonicalize", "requested",
]


_interned: dict[tuple, DType] = {}


@dataclass(frozen=True, eq=True)
class DType:
    """An fnx element type.

    Args:
      name: canonical name, e.g. ``"float32"``.
      itemsize: size of one element in bytes.
      kind: ``'b'`` (bool), ``'i'`` (signed int), ``'u'`` (unsigned int), ``'f'`` (float) or ``'c'`` (complex).
    """

    name: str
    itemsize: int
    kind: str

    # one object per (name, itemsize, kind): DType(...) gives back the one made first, and so do copies and
    # unpickling (__reduce__). Equal dtypes are then one object and hashing is identity's, in C: every hash-consed
    # node's key holds a dtype (a Python __hash__ was a tenth of decoding a cached lowering)
    def __new__(cls, name: str, itemsize: int, kind: str):
        if (found := _interned.get((name, itemsize, kind))) is None:
            found = _interned[(name, itemsize, kind)] = super().__new__(cls)
        return found

    __hash__ = object.__hash__

    def __reduce__(self):
        return (DType, (self.name, self.itemsize, self.kind))

    def __repr__(self) -> str:
        return self.name

    def __str__(self) -> str:
        return self.name

    @property
    def np(self) -> np.dtype:
        """The equivalent numpy dtype (``ml_dtypes.bfloat16`` for bfloat16)."""
        return _NP_OF[self.name]

    @property
    def is_float(self) -> bool:
        return self.kind == "f"

    @property
    def is_complex(self) -> bool:
        return self.kind == "c"

    @property
    def is_inexact(self) -> bool:
        """Floats and complex numbers: the values that carry derivatives."""
        return self.kind in "fc"

    @property
    def is_64bit(self) -> bool:
        """The types that exist only with x64 on (complex128 is two float64s; complex64 is not 64-bit)."""
        return self.name in _NARROW

    @property
    def component(self) -> DType:
        """The real type of a complex type's parts (complex64 -> float32); a real type's is itself."""
        return _COMPONENT.get(self.name, self)

    @property
    def is_int(self) -> bool:
        """True for signed and unsigned integers (not bool)."""
        return self.kind in "iu"

    @property
    def is_unsigned(self) -> bool:
        return self.kind == "u"

    @property
    def is_bool(self) -> bool:
        return self.kind == "b"

    @property
    def bits(self) -> int:
        return 8 * self.itemsize

    @property
    def min(self) -> bool | int | float:
        """Smallest representable value as a Python number (``-inf`` for floats)."""
        if self.kind == "f":
            return float("-inf")
        return False if self.kind == "b" else int(np.iinfo(self.np).min)

    @property
    def max(self) -> bool | int | float:
        """Largest representable value as a Python number (``inf`` for floats)."""
        if self.kind == "f":
            return float("inf")
        return True if self.kind == "b" else int(np.iinfo(self.np).max)


bool_ = DType("bool", 1, "b")
# JAX's float0: the dtype of an integer input's gradient (grad(..., allow_int=True)), a numpy dtype of no bytes;
# such gradients are numpy arrays, never fnx Arrays, as in JAX
float0 = np.dtype([("float0", np.void, 0)])
int8 = DType("int8", 1, "i")
int16 = DType("int16", 2, "i")
int32 = DType("int32", 4, "i")
int64 = DType("int64", 8, "i")
uint8 = DType("uint8", 1, "u")
uint16 = DType("uint16", 2, "u")
uint32 = DType("uint32", 4, "u")
uint64 = DType("uint64", 8, "u")
float16 = DType("float16", 2, "f")
bfloat16 = DType("bfloat16", 2, "f")
float32 = DType("float32", 4, "f")
float64 = DType("float64", 8, "f")
complex64 = DType("complex64", 8, "c")
complex128 = DType("complex128", 16, "c")

# the real types (the element types of the kernels); complex values are pairs of floats to the compiler
DTYPES: tuple[DType, ...] = (
    bool_, int8, int16, int32, int64, uint8, uint16, uint32, uint64, float16, bfloat16, float32, float64)
COMPLEX_DTYPES: tuple[DType, ...] = (complex64, complex128)
ALL_DTYPES = DTYPES + COMPLEX_DTYPES
_COMPONENT = {"complex64": float32, "complex128": float64}


def complex_of(dtype: DType) -> DType:
    """The complex type whose parts are `dtype`'s floats: float64 -> complex128, any other -> complex64."""
    if dtype.is_complex: return dtype
    return complex128 if dtype is float64 else complex64

class _X64Override(threading.local):
    """`enable_x64(...)` blocks: a per-thread override of config.enable_x64 (None: none). A class attribute, so
    that a thread that never set one reads None without a failed instance lookup (getattr with a default on a
    bare threading.local raised and caught an AttributeError: 0.66 us of W6's dispatch)."""
    value: bool | None = None


_x64_local = _X64Override()


def x64_enabled() -> bool:
    """Whether 64-bit types are on: the innermost `enable_x64` block of this thread, else the global flag."""
    override = _x64_local.value
    return config.enable_x64 if override is None else override


@contextlib.contextmanager
def enable_x64(new_val: bool = True) -> Iterator[None]:
    """Turns 64-bit types on (or off) inside the block, in this thread only, as `jax.enable_x64(True)`."""
    previous = _x64_local.value
    _x64_local.value = bool(new_val)
    try:
        yield
    finally:
        _x64_local.value = previous


def default_int() -> DType:
    """The dtype of Python ints and integer creation functions: int64 with x64 on, else int32."""
    return int64 if x64_enabled() else int32


def default_float() -> DType:
    """The dtype of Python floats and float creation functions: float64 with x64 on, else float32."""
    return float64 if x64_enabled() else float32


def default_complex() -> DType:
    """The dtype of Python complex numbers: complex128 with x64 on, else complex64."""
    return complex128 if x64_enabled() else complex64


_NARROW = {"int64": int32, "uint64": uint32, "float64": float32, "complex128": complex64}


def canonicalize(dtype: DType) -> DType:
    """`dtype` as it exists now: its 32-bit type when it is 64-bit and x64 is off (JAX's canonicalize_dtype)."""
    if not dtype.is_64bit or x64_enabled(): return dtype
    return _NARROW[dtype.name]


def requested(x: Any, where: str = "") -> DType:
    """A dtype the user asked for (a `dtype=` argument, `astype`): `to_dtype(x)`, narrowed to 32 bits with JAX's
    UserWarning when it is 64-bit and x64 is off; `where` names the function in the warning. An fnx `DType` object
    is taken as it is: fnx's own code passes `dtypes.float64` for its float64 work (users pass numpy's types or
    names, `jnp.float64` being numpy's)."""
    dtype = to_dtype(x)
    if isinstance(x, DType): return dtype  # fnx's own DType objects (its code's float64 work) mean what they say
    narrow = canonicalize(dtype)
    if narrow is not dtype:
        place = f"requested in {where} " if where else ""
        warnings.warn(f"Explicitly requested dtype {dtype} {place}is not available, "
                      f"and will be truncated to dtype {narrow}. To enable more dtypes, set the jax_enable_x64 "
                      "configuration option or the JAX_ENABLE_X64 shell environment variable (fnx.config.update("
                      "\"jax_enable_x64\", True)).", UserWarning, stacklevel=3)
    return narrow

def narrowed(x: Any) -> bool:
    """Whether `requested(x)` narrows a 64-bit dtype (and warns); True for what is no dtype at all (its caller
    then runs the code that raises the error)."""
    if x is None or isinstance(x, DType): return False
    try:
        dtype = to_dtype(x)
    except Exception:  # noqa: BLE001 (any error: the caller's own path raises it properly)
        return True
    return canonicalize(dtype) is not dtype


_NP_OF = {d.name: np.dtype(ml_dtypes.bfloat16 if d is bfloat16 else d.name) for d in ALL_DTYPES}
_BY_NAME = {d.name: d for d in ALL_DTYPES} | {"bool_": bool_}
_BY_NP = {_NP_OF[d.name]: d for d in ALL_DTYPES}


def from_numpy(np_dtype: Any) -> DType:
    """Returns the fnx dtype exactly matching a numpy dtype (no width canonicalization).

    Args:
      np_dtype: a ``numpy.dtype`` or anything ``numpy.dtype()`` accepts.

    Returns:
      The matching :class:`DType`; ``float64`` stays ``float64``.

    Raises:
      TypeError: if the dtype has no fnx equivalent (complex, object, strings, ...).
    """
    try:
        dt = np.dtype(np_dtype)
    except Exception as e:
        raise TypeError(f"Cannot interpret {np_dtype!r} as a dtype") from e
    if dt.byteorder not in "=|":  # byte-swapped dtypes carry the same values
        dt = dt.newbyteorder("=")
    try:
        return _BY_NP[dt]
    except KeyError:
        kind = "complex" if dt.kind == "c" else repr(dt)
        raise TypeError(f"fnx does not support dtype {kind} (from {np_dtype!r})") from None


def to_dtype(x: Any) -> DType:
    """Converts a dtype specifier to a :class:`DType`.

    Args:
      x: a :class:`DType`; a numpy dtype or scalar type (``np.float32``,
        ``np.dtype('int64')``, ``ml_dtypes.bfloat16``); a string (``'float32'``,
        ``'bfloat16'``, ``'bool'``, ``'f4'``, ...); an object with a ``dtype``
        attribute; or a Python type, where ``bool -> bool_``, ``int -> int32``
        and ``float -> float32``.

    Returns:
      The corresponding :class:`DType`.

    Raises:
      TypeError: for complex types and anything that is not a supported dtype.
    """
    if isinstance(x, DType):
        return x
    if x is bool:
        return bool_
    if x is int:
        return default_int()
    if x is float:
        return default_float()
    if x is complex:
        return default_complex()
    if isinstance(x, str):
        if x in _BY_NAME:
            return _BY_NAME[x]
        return from_numpy(x)
    if isinstance(x, np.dtype) or (isinstance(x, type) and issubclass(x, np.generic)):
        return from_numpy(x)
    dt = getattr(x, "dtype", None)  # arrays and scalars; checked last so types above win
    if dt is not None and not isinstance(x, type):
        return to_dtype(dt)
    raise TypeError(f"Cannot interpret {x!r} as an fnx dtype")


# ---------------------------------------------------------------------------
# Type promotion lattice (JAX's). With x64 off, a result that no operand asked to be 64-bit
# is narrowed to 32 bits afterwards (`_narrow`), as JAX canonicalizes it: uint32 with int32 joins at int64 on the
# lattice and is int32 with x64 off.

_CODE = {
    bool_: "b1", uint8: "u1", uint16: "u2", uint32: "u4", uint64: "u8", int8: "i1", int16: "i2", int32: "i4",
    int64: "i8", bfloat16: "bf", float16: "f2", float32: "f4", float64: "f8", complex64: "c8", complex128: "c16"}
_OF_CODE = {c: d for d, c in _CODE.items()}
_EDGES = {
    "b1": ["i*"], "i*": ["u1", "i1"], "u1": ["u2", "i2"], "u2": ["u4", "i4"], "u4": ["u8", "i8"], "u8": ["f*"],
    "i1": ["i2"], "i2": ["i4"], "i4": ["i8"], "i8": ["f*"], "f*": ["bf", "f2", "c*"], "bf": ["f4"], "f2": ["f4"],
    "f4": ["f8", "c8"], "f8": ["c16"], "c*": ["c8"], "c8": ["c16"], "c16": []}


def _upper_set(node: str) -> frozenset[str]:
    """All nodes reachable from ``node`` (itself included)."""
    return frozenset([node]).union(*(_upper_set(n) for n in _EDGES[node]))


_UPPER = {n: _upper_set(n) for n in _EDGES}


@functools.cache
def _join(a: str, b: str) -> str:
    """Least upper bound of two lattice nodes: the common ancestor whose upper set is the whole intersection."""
    common = _UPPER[a] & _UPPER[b]
    (lub,) = [n for n in common if _UPPER[n] == common]
    return lub


def _node(dtype: DType, weak: bool) -> str:
    if weak and dtype.kind != "b":  # a weak bool is just a bool, as in JAX
        return "c*" if dtype.is_complex else "f*" if dtype.is_float else "i*"
    return _CODE[dtype]


def promote_types(a: Any, b: Any) -> DType:
    """Returns the dtype to which a binary operation on strongly typed ``a`` and ``b`` promotes.

    Both arguments are converted with :func:`to_dtype` and treated as strongly
    typed; use :func:`result_type` for weakly typed values and Python scalars.
    When the lattice join is the weak float node (``uint64`` with a signed
    integer) the result is ``float64``, matching ``jax.numpy.promote_types``.

    Args:
      a: a dtype specifier.
      b: a dtype specifier.

    Returns:
      The promoted :class:`DType`.

    Examples:
      >>> promote_types(int8, uint8)
      int16
      >>> promote_types(bfloat16, float16)
      float32
      >>> promote_types(uint64, int64)
      float64
    """
    da, db = to_dtype(a), to_dtype(b)
    j = _join(_CODE[da], _CODE[db])
    wide = da.is_64bit or db.is_64bit
    return (float64 if wide else default_float()) if j == "f*" else _narrow(_OF_CODE[j], wide)


def _narrow(dtype: DType, wide: bool) -> DType:
    """A promotion result: narrowed to 32 bits when x64 is off and no operand was 64-bit."""
    return dtype if wide else canonicalize(dtype)


def canonicalize_scalar(x: Any) -> tuple[DType, bool]:
    """Returns ``(dtype, weak_type)`` for a Python or numpy scalar.

    Python ``bool`` is strongly typed ``bool_``; Python ``int`` and ``float`` are
    weakly typed at the default width (:func:`default_int`, :func:`default_float`).
    Numpy scalars are strongly typed with their dtype (canonicalized: see :func:`canonicalize`).

    Raises:
      TypeError: for complex and non-scalar values.
      OverflowError: for a Python int outside the default int's range (int32 with x64 off, as in JAX).
    """
    if isinstance(x, np.generic):
        return canonicalize(from_numpy(x.dtype)), False
    if isinstance(x, bool):
        return bool_, False
    if isinstance(x, int):
        dt = default_int()
        if dt.min <= x <= dt.max:
            return dt, True
        hint = "" if x64_enabled() else " (64-bit ints need fnx.config.update('jax_enable_x64', True))"
        raise OverflowError(f"Python int {x} too large to convert to {dt}{hint}")
    if isinstance(x, float):
        return default_float(), True
    if isinstance(x, complex):
        return default_complex(), True
    raise TypeError(f"Expected a Python or numpy scalar, got {x!r}")


def _operand(x: Any) -> tuple[DType, bool]:
    if isinstance(x, tuple) and len(x) == 2 and isinstance(x[1], (bool, np.bool_)):
        return to_dtype(x[0]), bool(x[1])
    if isinstance(x, (bool, int, float, complex, np.generic)):
        return canonicalize_scalar(x)
    if x is int or x is float:  # Python types stand for Python scalars, as in jax.numpy.promote_types
        return to_dtype(x), True
    if hasattr(x, "dtype") and not isinstance(x, type):  # array-likes may carry a weak_type flag
        return to_dtype(x.dtype), bool(getattr(x, "weak_type", False))
    return to_dtype(x), False


def result_type(*operands: Any) -> tuple[DType, bool]:
    """Applies JAX's type promotion to the operands of an operation.

    Args:
      *operands: each a ``(dtype, weak_type)`` pair, a Python or numpy scalar
        (see :func:`canonicalize_scalar`), an object with ``dtype`` (and
        optionally ``weak_type``) attributes, or a dtype specifier (strong).

    Returns:
      ``(dtype, weak_type)``: the join of the operands on the promotion lattice,
      weak iff the join is the weak int or weak float node. A weak result
      materializes as ``int32`` / ``float32`` unless 64 bits are demanded (see
      the module docstring).

    Examples:
      >>> result_type((int8, False), 1)
      (int8, False)
      >>> result_type((int32, False), 1.0)
      (float32, True)
      >>> result_type((uint64, False), (int64, False))
      (float64, True)
    """
    if not operands:
        raise ValueError("result_type requires at least one operand")
    ops = [_operand(x) for x in operands]
    nodes = [_node(d, w) for d, w in ops]
    lub = functools.reduce(_join, nodes)
    # a 64-bit operand (weak or strong; with x64 off only fnx's own code makes one) keeps the x64 answer
    wide = any(d.is_64bit for d, _ in ops)
    if lub not in ("i*", "f*", "c*"):
        return _narrow(_OF_CODE[lub], wide), False
    if lub == "c*":
        return (complex128 if wide else default_complex()), True
    if lub == "f*":
        return (float64 if wide else default_float()), True
    return (int64 if wide else default_int()), True


def finfo(dtype: Any) -> Any:
    """Machine limits for a floating point dtype (``numpy.finfo``; ``ml_dtypes.finfo`` for bfloat16)."""
    d = to_dtype(dtype).component  # (a complex type's are its parts', as numpy's finfo)
    if not d.is_float:
        raise TypeError(f"finfo requires a floating point dtype, got {d}")
    return ml_dtypes.finfo(d.np) if d is bfloat16 else np.finfo(d.np)


def iinfo(dtype: Any) -> np.iinfo:
    """Machine limits for an integer dtype (``numpy.iinfo``)."""
    d = to_dtype(dtype)
    if not d.is_int:
        raise TypeError(f"iinfo requires an integer dtype, got {d}")
    return np.iinfo(d.np)
