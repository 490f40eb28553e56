"""fnx.numpy: a jax.numpy-like array API, composed from fnx.lax and fnx.trace's elementwise functions.

Every public function is an `eager_op`: outside a trace it builds its whole graph lazily and runs it as one compiled
function; under jit it just adds to the graph. Binary functions broadcast with numpy's rules and promote with JAX's
lattice (Python scalars are weakly typed: `int8_array + 1` stays int8). numpy appears here only for static shape and
dtype logic and for converting host values; the arithmetic is always done by the generated code.

Out-of-range indices behave as in JAX: gathers (`x[10]`, `x[int_array]`, `.at[].get()`) clamp, updates
(`.at[].set/add/...`) drop them, `take`/`take_along_axis` fill. Integer `/` and `mean` give float32 except for
64-bit integers (float64), and the 1-argument `where`/`nonzero` and boolean-mask indexing need concrete values (they
raise ConcretizationError under jit). The departures that remain are listed, with reasons, in
docs/JAX_DIFFERENCES.md.
"""
from __future__ import annotations

import builtins
import functools
import math
import operator
from fractions import Fraction
from typing import Any, Sequence

import ml_dtypes
import numpy as np

from fnx import dtypes, lax, tree_util
from fnx.backends import dlpack
from fnx import trace as _trace
from fnx.dtypes import DType
from fnx.errors import ConcretizationError, NonConcreteBooleanIndexError, ShapeError, UnsupportedError, at_user_line
from fnx.trace import (Array, apply_operator, as_array, as_operand, broadcast_array, broadcast_shapes, cast,
                       check_operand, eager_op, elementwise, imag_part, inexact_dtype, is_python_scalar, make_complex,
                       normalize_axes, prepare, promote, real_part, shape_str, stack_arrays, state, with_weak)
from fnx.transforms.custom import custom_jvp, pure
from fnx.transforms.jit import eager_jit, jit_state, jitted_op

# ---- dtype names and constants ----

class _ScalarType(type):
    """The type of fnx.numpy's scalar types: an instance of numpy's type is an instance of fnx's, and the two types
    are equal (`jnp.float32 == np.float32`, one dictionary key)."""

    def __instancecheck__(cls, obj) -> bool:
        return isinstance(obj, cls.numpy_type)

    def __subclasscheck__(cls, sub) -> bool:
        return issubclass(sub, cls.numpy_type)

    def __eq__(cls, other) -> bool:
        return other is cls or other is cls.numpy_type

    def __hash__(cls) -> int:
        return hash(cls.numpy_type)


def scalar_type(base: type) -> type:
    """fnx.numpy's `base` (a numpy scalar type), as JAX's: a subclass, so that it is a dtype wherever numpy's is
    (`x.dtype == jnp.float32`, `np.zeros(3, jnp.float32)`), and a conversion when called: `jnp.float32(x)` of an
    array (fnx's, a traced value under jit included, or numpy's of rank >= 1) is `jnp.asarray(x, jnp.float32)`. Of
    a scalar it is numpy's scalar (JAX gives a 0-d array there: a numpy scalar keeps host arithmetic on constants
    cheap)."""
    def __new__(cls, *value):
        if value and builtins.any(isinstance(leaf, Array) or (isinstance(leaf, np.ndarray) and leaf.ndim)
                                  for leaf in tree_util.tree_leaves(value[0])):
            return asarray(value[0], dtype=base)
        return base(*value)
    return _ScalarType(base.__name__, (base,), {"__new__": __new__, "numpy_type": base, "__module__": __name__,
                                                "__doc__": f"The {np.dtype(base).name} scalar type; called on an "
                                                           f"fnx array, a conversion to {np.dtype(base).name}."})


bool_, int8, int16, int32, int64 = (scalar_type(t) for t in (np.bool_, np.int8, np.int16, np.int32, np.int64))
uint8, uint16, uint32, uint64 = (scalar_type(t) for t in (np.uint8, np.uint16, np.uint32, np.uint64))
float16, float32, float64 = (scalar_type(t) for t in (np.float16, np.float32, np.float64))
bfloat16 = ml_dtypes.bfloat16  # (ml_dtypes' own: JAX and ml_dtypes recognize it by identity, so a subclass is no
                               # bfloat16 to them; jnp.bfloat16(x) is ml_dtypes' conversion, of scalars)
dtype = np.dtype
ndarray = Array
finfo, iinfo = dtypes.finfo, dtypes.iinfo
pi, e, inf, nan, newaxis = np.pi, np.e, np.inf, np.nan, None

_LOG2E, _LN2 = 1.4426950408889634, 0.6931471805599453


# ---- conversion, promotion, broadcasting ----

def _dt(a: Array) -> DType:
    return a.uop.dtype


def _full(like: Array, value: Any, dt: DType | None = None) -> Array:
    """A constant with the shape (and by default the dtype) of `like`."""
    return lax.full(like.shape, value, dt or _dt(like))


def _broadcast(a: Array, shape: Any, name: str = "broadcast_to") -> Array:
    """`a` broadcast to a user's `shape` (checked as one) with numpy's rules."""
    return broadcast_array(a, lax.canonical_shape(shape, name), name)


def _float_math(compute):
    """Run a float approximation in float32 for float16/bfloat16 inputs (then round back)."""
    def run(*arrs: Array) -> Array:
        dt = _dt(arrs[0])
        if dt.itemsize >= 4: return compute(*arrs)
        return cast(compute(*(cast(a, dtypes.float32) for a in arrs)), dt)
    return functools.update_wrapper(run, compute)  # (its signature is compute's)


# ---- creation ----

def array(object: Any, dtype: Any = None, copy: bool = True, order: str | None = None, ndmin: int = 0) -> Array:
    """Create an Array from an Array, numpy array, Python scalar or (nested) list/tuple of those.

    Args:
      object: the values. Python floats/ints default to float32/int32; numpy arrays keep their dtype.
      dtype: optional result dtype.
      ndmin: minimum number of dimensions (leading axes of size 1 are added).

    Returns:
      An Array. Example: `array([1, 2])` -> int32 [1, 2]. As in JAX, it is weakly typed when `object` is a
      Python int or float (or a weakly typed Array) and no `dtype` is given: `array(2.0) * float16_array` stays
      float16.
    """
    if dtype is None and ndmin == 0 and (made := _trace.host_scalar(object)) is not None: return made
    return _array(object, dtype, ndmin)


@eager_op
def _array(object: Any, dtype: Any, ndmin: int) -> Array:
    out = as_array(object, None if dtype is None else dtypes.requested(dtype, "array"))
    return lax.reshape(out, (1,) * (ndmin - out.ndim) + out.shape) if out.ndim < ndmin else out


def asarray(a: Any, dtype: Any = None, order: str | None = None, copy: bool | None = None) -> Array:
    """Like `array`; Arrays are immutable, so no copy is ever made."""
    return array(a, dtype=dtype)


def from_dlpack(x: Any, /, *, device: Any = None, copy: bool | None = None) -> Array:
    """An Array of the values of `x`, any object with `__dlpack__` (docs/RUNTIME.md), placed on `device` when
    given (else where `x` is: a GPU's memory stays on that GPU, the rest goes to the default device).

    A tensor in host memory (numpy, torch or JAX on the CPU) is copied: fnx owns its host buffers. A tensor on a
    GPU that fnx runs (`cuda:N`; torch, CuPy, JAX on CUDA) is used in place, with no copy, unless `copy=True`:
    the Array then shares memory with `x` (JAX's behaviour; writing to `x` later changes it). A strided one is
    gathered into a new buffer on that GPU."""
    if not hasattr(x, "__dlpack__"):
        raise TypeError(f"from_dlpack: {type(x).__name__} has no __dlpack__ method")
    kind, ordinal = x.__dlpack_device__() if hasattr(x, "__dlpack_device__") else (dlpack.CPU, 0)
    out = _from_gpu_dlpack(x, int(ordinal), copy) if kind == dlpack.CUDA else array(np.from_dlpack(x))
    if device is None: return out
    from fnx.devices import device_put
    return device_put(out, device)


def _from_gpu_dlpack(x: Any, ordinal: int, copy: bool | None) -> Array:
    """The Array over CUDA tensor `x`'s memory (a copy on the same GPU where `copy`)."""
    from fnx.devices import device_put, devices
    gpus = [d for d in devices("cuda") if not d.compile_only]
    gpu = next((d for d in gpus if d.id == ordinal), None)
    if gpu is None:
        raise BufferError(f"from_dlpack: the {type(x).__name__} is on CUDA GPU {ordinal}, which fnx cannot use "
                          f"(its GPUs: {[str(d) for d in gpus] or 'none'}; docs/CUDA.md)")
    allocator = gpu.allocator
    stream = int(allocator.stream)  # (the producer orders its writes before our stream's next work)
    try:
        capsule = x.__dlpack__(stream=stream, max_version=dlpack.VERSION)
    except TypeError:  # (a producer that predates DLPack 1.0's keywords)
        capsule = x.__dlpack__(stream=stream)
    tensor = dlpack.Borrowed(capsule)
    shape = tensor.shape
    buffer, index = allocator.borrow(tensor)
    if index is not None:
        flat = Array.from_buffer(buffer, (buffer.size,))
        return take(flat, device_put(index, gpu))
    out = Array.from_buffer(buffer, shape)
    if not copy: return out
    fresh = allocator.alloc(buffer.dtype, buffer.size)
    allocator.copy(fresh, buffer)
    return Array.from_buffer(fresh, shape)


def _shape_arg(shape: Any, name: str) -> tuple[int, ...]:
    return lax.canonical_shape(shape, name)


def full(shape: Any, fill_value: Any, dtype: Any = None) -> Array:
    """An array of `shape` filled with `fill_value` (a scalar or an array broadcastable to `shape`).
    The dtype defaults to that of `fill_value` (Python int -> int32, float -> float32).

    Outside a trace this runs as jit of itself, the fill value its argument, except where a Python number would
    be rounded twice on its way (0.1 into float16 goes straight from the double, as in JAX)."""
    if _fill_argument(fill_value, dtype): return _full_jitted(shape, fill_value, dtype)
    return _full_eager(shape, fill_value, dtype)


def _full_body(shape: Any, fill_value: Any, dtype: Any = None) -> Array:
    shape = _shape_arg(shape, "full")
    value = array(fill_value, dtype=dtype)
    return _broadcast(value, shape, "full")


_full_jitted = jitted_op("shape", "dtype")(_full_body)
_full_eager = eager_op(_full_body)


def _fill_argument(value: Any, dtype: Any) -> bool:
    """Whether fill value `value` can be a jit argument: an array, or a Python bool, int or float that reaches
    `dtype` (None: its own) unrounded or rounded once, as a constant would, that is whose weakly typed
    argument has that dtype. (A complex number is no jit argument.)"""
    if isinstance(value, (Array, np.ndarray, np.generic)): return True
    if type(value) not in (bool, int, float): return False
    try:
        return dtype is None or dtypes.canonicalize_scalar(value)[0] is dtypes.to_dtype(dtype)
    except (TypeError, ValueError, OverflowError):
        return False


@jitted_op("shape", "dtype")
def zeros(shape: Any, dtype: Any = None) -> Array:
    """An array of zeros (float32 unless `dtype` is given)."""
    dt = dtypes.requested(dtype, "zeros") if dtype is not None else dtypes.default_float()
    return lax.full(_shape_arg(shape, "zeros"), 0, dt)


@jitted_op("shape", "dtype")
def ones(shape: Any, dtype: Any = None) -> Array:
    """An array of ones (float32 unless `dtype` is given)."""
    dt = dtypes.requested(dtype, "ones") if dtype is not None else dtypes.default_float()
    return lax.full(_shape_arg(shape, "ones"), 1, dt)


@jitted_op("shape", "dtype")
def empty(shape: Any, dtype: Any = None) -> Array:
    """An array of `shape`; as in JAX, its values are zeros (arrays are never uninitialized)."""
    return zeros(shape, dtype)


def _like(a: Any, dtype: Any, shape: Any) -> tuple[tuple[int, ...], Any]:
    a = as_operand(a)
    return (a.shape if shape is None else _shape_arg(shape, "like")), (_dt(a) if dtype is None else dtype)


def _weak_like(out: Array, a: Any, dtype: Any) -> Array:
    """The *_like functions keep `a`'s weak type when no dtype is given, as in JAX."""
    return with_weak(out, dtype is None and isinstance(a, Array) and a.weak_type)


@jitted_op("dtype", "shape")
def zeros_like(a: Any, dtype: Any = None, shape: Any = None) -> Array:
    """Zeros with the shape and dtype of `a` (overridable)."""
    return _weak_like(zeros(*_like(a, dtype, shape)), a, dtype)


@jitted_op("dtype", "shape")
def ones_like(a: Any, dtype: Any = None, shape: Any = None) -> Array:
    """Ones with the shape and dtype of `a` (overridable)."""
    return _weak_like(ones(*_like(a, dtype, shape)), a, dtype)


@jitted_op("dtype", "shape")
def empty_like(a: Any, dtype: Any = None, shape: Any = None) -> Array:
    """Zeros with the shape and dtype of `a` (overridable), as `jax.numpy.empty_like`."""
    return _weak_like(zeros(*_like(a, dtype, shape)), a, dtype)


def full_like(a: Any, fill_value: Any, dtype: Any = None, shape: Any = None) -> Array:
    """`fill_value` with the shape and dtype of `a` (overridable); as `full`, jit of itself outside a trace where
    `a` is an Array and a Python fill value reaches the dtype unrounded or rounded once."""
    if type(a) is Array and _fill_argument(fill_value, a.dtype if dtype is None else dtype):
        return _full_like(a, fill_value, dtype, shape)
    return _full_like_eager(a, fill_value, dtype, shape)


def _full_like_body(a: Any, fill_value: Any, dtype: Any = None, shape: Any = None) -> Array:
    shape, dt = _like(a, dtype, shape)
    return _weak_like(_full_body(shape, fill_value, dt), a, dtype)


_full_like = jitted_op("dtype", "shape")(_full_like_body)
_full_like_eager = eager_op(_full_like_body)


def _static_scalar(x: Any, name: str) -> Any:
    if isinstance(x, Array):
        if state.tracing and not x.is_concrete:
            raise ConcretizationError(at_user_line(f"{name}: needs static (Python) bounds, got a traced "
                                                   f"{shape_str(x)}"))
        return x.item()
    return x


@jitted_op("start", "stop", "step", "dtype")  # (all static: a concrete array bound is unhashable, so op by op)
def arange(start: Any, stop: Any = None, step: Any = None, dtype: Any = None) -> Array:
    """Evenly spaced values in [start, stop) with `step` (static bounds). Python floats give float32, ints int32.

    Example: `arange(5)` -> [0, 1, 2, 3, 4]; `arange(0, 1, 0.25)` -> [0., 0.25, 0.5, 0.75].
    """
    start, stop, step = (_static_scalar(v, "arange") for v in (start, stop, step))
    if stop is None: start, stop = 0, start
    step = 1 if step is None else step
    if step == 0: raise ValueError(at_user_line("arange: step must not be zero"))
    dt = dtypes.requested(dtype, "arange") if dtype is not None else dtypes.result_type(start, stop, step)[0]
    n = builtins.max(0, math.ceil((stop - start) / step))
    if dt.is_float:  # float64 index arithmetic, rounded once to the result dtype
        values = lax.add(lax.mul(lax.iota(dtypes.float64, n), float(step)), float(start))
        return cast(values, dt)
    return lax.add(lax.mul(lax.iota(dt, n), step), start)


def linspace(start: Any, stop: Any, num: int = 50, endpoint: bool = True, retstep: bool = False,
             dtype: Any = None, axis: int = 0) -> Array | tuple[Array, Array]:
    """`num` evenly spaced values from `start` to `stop` (inclusive when `endpoint`), along a new `axis`.

    start/stop may be arrays (broadcast together). Returns the values (and the step when `retstep`).

    The values are computed in float64 and rounded once to the result's dtype, so they are numpy's rounded (JAX
    computes in the result's dtype: its values may differ from numpy's by a unit in the last place). Outside a
    trace this runs as jit of itself, Python bounds its float64 arguments: each new bound compiled a program (11
    ms a call) while they were constants in it.
    """
    if (_double_bound(start) and _double_bound(stop) and not (_trace.state.depth or jit_state.disabled)
            and not dtypes.narrowed(dtype)):
        dt = dtypes.requested(dtype, "linspace") if dtype is not None else dtypes.default_float()
        return _linspace(_trace.double(start), _trace.double(stop), num, endpoint, retstep, dt, axis)
    if is_python_scalar(start) or is_python_scalar(stop):  # (taken exactly, as constants, only op by op)
        return _linspace_eager(start, stop, num, endpoint, retstep, dtype, axis)
    return _linspace(start, stop, num, endpoint, retstep, dtype, axis)


def _double_bound(v: Any) -> bool:
    """Whether `v` is a Python float, or an int the default int holds (a larger one is an OverflowError, as in
    JAX, from the path that converts it): a bound `linspace` takes as a float64 argument."""
    return type(v) is float or type(v) is int and -2 ** 31 <= v < 2 ** 31


def _linspace_body(start: Any, stop: Any, num: int, endpoint: bool, retstep: bool, dtype: Any, axis: int
                   ) -> Array | tuple[Array, Array]:
    (num,) = lax.canonical_shape(num, "linspace", nonnegative=False)
    if num < 0: raise ValueError(at_user_line(f"linspace: number of samples {num} must be non-negative"))
    (lo, hi), _ = prepare("linspace", start, stop)
    dt = dtypes.requested(dtype, "linspace") if dtype is not None else inexact_dtype(_dt(lo))
    work = dtypes.float64
    lo, hi = cast(lo, work), cast(hi, work)
    div = num - 1 if endpoint else num
    step = (hi - lo) / div if div > 0 else _full(lo, np.nan)
    shape = (num,) + lo.shape
    index = lax.broadcasted_iota(work, shape, 0)
    values = _broadcast(lo, shape) + index * _broadcast(step, shape) if div > 0 else _broadcast(lo, shape)
    if endpoint and num > 1: values = where(index == num - 1, _broadcast(hi, shape), values)
    values = moveaxis(values, 0, axis)
    values = cast(values if dt.is_float else floor(values), dt)
    return (values, cast(step, dt if dt.is_float else dtypes.default_float())) if retstep else values


_linspace = jitted_op("num", "endpoint", "retstep", "dtype", "axis")(_linspace_body)
_linspace_eager = eager_op(_linspace_body)


@jitted_op("N", "M", "k", "dtype")
def eye(N: int, M: int | None = None, k: int = 0, dtype: Any = None) -> Array:
    """A 2-D array with ones on the k-th diagonal and zeros elsewhere (float32 by default)."""
    shape = lax.canonical_shape((N, N if M is None else M), "eye")
    rows, cols = lax.broadcasted_iota(dtypes.int32, shape, 0), lax.broadcasted_iota(dtypes.int32, shape, 1)
    diagonal = lax.add(rows, operator.index(k)) == cols
    return cast(diagonal, dtypes.requested(dtype, "eye") if dtype is not None else dtypes.default_float())


@jitted_op("n", "dtype")
def identity(n: int, dtype: Any = None) -> Array:
    """The n x n identity matrix."""
    return eye(n, dtype=dtype)


# ---- elementwise arithmetic ----

def _int_floor_div(a: Array, b: Array) -> Array:
    q = lax.div(a, b)
    if _dt(a).is_unsigned: return q
    r = lax.rem(a, b)
    fix = (r != 0) & ((r < 0) != (b < 0))
    return where(fix, q - 1, q)


def _float_divmod(a: Array, b: Array) -> tuple[Array, Array]:
    """numpy's floor division and modulo for floats: the remainder takes the divisor's sign."""
    mod = lax.rem(a, b)
    div = (a - mod) / b
    fix = (mod != 0) & ((b < 0) != (mod < 0))
    mod, div = where(fix, mod + b, mod), where(fix, div - 1, div)
    floor_div = _floor(div)
    floor_div = where(div - floor_div > 0.5, floor_div + 1, floor_div)
    zero = _full(a, 0.0)
    floor_div = where(div == 0, _copysign(zero, a / b), floor_div)
    mod = where(mod == 0, _copysign(zero, b), mod)
    return where(b == 0, a / b, floor_div), mod


def _floor_divide(a: Array, b: Array) -> Array:
    if _dt(a).is_bool: return a & b
    return _float_divmod(a, b)[0] if _dt(a).is_float else _int_floor_div(a, b)


def _mod(a: Array, b: Array) -> Array:
    check_operand("mod", a, not _dt(a).is_bool, "numeric operands")
    if _dt(a).is_float: return _float_divmod(a, b)[1]
    r = lax.rem(a, b)
    if _dt(a).is_unsigned: return r
    return where((r != 0) & ((r < 0) != (b < 0)), r + b, r)


def _float_bits(x: Array) -> tuple[Array, int]:
    """x's bits as a signed integer of its width, and the sign bit's mask."""
    signed = {2: dtypes.int16, 4: dtypes.int32, 8: dtypes.int64}[_dt(x).itemsize]
    return lax.bitcast_convert_type(x, signed), -(1 << (8 * _dt(x).itemsize - 1))


def _signbit(x: Array) -> Array:
    """True where the sign bit of a float is set (also for -0.0 and negative NaNs)."""
    return _float_bits(x)[0] < 0


def _copysign(magnitude: Array, sign: Array) -> Array:
    mag = _abs(magnitude)
    return where(_signbit(sign), lax.neg(mag), mag)


def _abs(x: Array) -> Array:
    dt = _dt(x)
    if dt.is_float:  # + 0.0 turns -0.0 into 0.0; a select keeps it differentiable (d|x|/dx = 1 at 0, as in JAX)
        return where(x >= 0, x + 0.0, lax.neg(x))
    if dt.is_unsigned or dt.is_bool: return x
    return where(x < 0, lax.neg(x), x)


def _sign(x: Array) -> Array:
    dt = _dt(x)
    if dt.is_bool: return x
    one, zero = _full(x, 1), _full(x, 0)
    positive = where(x > 0, one, lax.stop_gradient(x) if dt.is_float else zero)  # keeps +-0 and NaN; slope 0
    return positive if dt.is_unsigned else where(x < 0, _full(x, -1), positive)


def _maximum(a: Array, b: Array) -> Array:
    return lax.max(a, b)  # MAX propagates NaN (the interp oracle's np.maximum semantics)


def _minimum(a: Array, b: Array) -> Array:
    return lax._order_reversed(lax.max(lax._order_reversed(a), lax._order_reversed(b)))


def _int_power(x: Array, y: Array) -> Array:
    """Square-and-multiply over the bits of an integer exponent array; negative exponents give 0 (or +-1 for
    bases +-1), as integer division would."""
    acc, base = _full(x, 1), x
    for bit in range(8 * _dt(y).itemsize - (0 if _dt(y).is_unsigned else 1)):
        acc = where(lax.bitwise_and(lax.shift_right(y, bit), 1) != 0, acc * base, acc)
        base = base * base
    if _dt(y).is_unsigned: return acc
    odd = lax.bitwise_and(y, 1) != 0
    negative = where(x == 1, _full(x, 1), where(x == -1, where(odd, _full(x, -1), _full(x, 1)), _full(x, 0)))
    return where(y < 0, negative, acc)


def _two_product(a: Array, b: Array) -> tuple[Array, Array]:
    """(p, e) with p = a * b rounded and a * b = p + e exactly: Dekker's 26-bit halves, no fused multiply-add
    needed (float64, |a| and |b| below 2**996)."""
    def halves(v: Array) -> tuple[Array, Array]:
        t = v * 134217729.0  # 2**27 + 1
        hi = t - (t - v)
        return hi, v - hi
    (a_hi, a_lo), (b_hi, b_lo), p = halves(a), halves(b), a * b
    return p, ((a_hi * b_hi - p) + a_hi * b_lo + a_lo * b_hi) + a_lo * b_lo


_INV_LN2_HI, _INV_LN2_LO = 1.4426950408889634, 2.0355273740931033e-17  # 1/ln 2 = hi + lo
_ATANH_SERIES = tuple(2 / (2 * k + 1) for k in range(13, 1, -1))  # 2 atanh(s) = 2s + 2/3 s^3 + s^5 (2/5 + ...)
_TWO_THIRDS_HI, _TWO_THIRDS_LO = 2 / 3, float(Fraction(2, 3) - Fraction(2 / 3))  # 2/3 = hi + lo


def _log2_hi_lo(a: Array) -> tuple[Array, Array]:
    """log2 a for float64 a >= 0 as hi + lo, to ~2**-60 relative: a = 2^e m with m in [sqrt(1/2), sqrt(2)),
    ln m = 2 atanh(s) with s = (m - 1) / (m + 1) carried as two floats, times 1/ln 2 carried as two floats."""
    tiny = a < 2.0 ** -1022
    scaled = where(tiny, a * 2.0 ** 54, a)
    bits = _float_bits(scaled)[0]
    e = cast(lax.bitwise_and(lax.shift_right(bits, 52), 0x7FF) - 1023, dtypes.float64)
    # (int64 constants, not Python ints: with x64 off a Python int beyond int32 is an OverflowError)
    mantissa = lax.bitwise_and(bits, _full(bits, (1 << 52) - 1))
    m = lax.bitcast_convert_type(lax.bitwise_or(mantissa, _full(bits, 1023 << 52)), dtypes.float64)
    big = m > math.sqrt(2.0)
    m = where(big, m * 0.5, m)
    e = e + where(big, _full(e, 1.0), _full(e, 0.0)) - where(tiny, _full(e, 54.0), _full(e, 0.0))
    f = m - 1
    u_hi = f + 2
    u_lo = f - (u_hi - 2)
    s_hi = f / u_hi
    p_hi, p_lo = _two_product(s_hi, u_hi)
    s_lo = (((f - p_hi) - p_lo) - s_hi * u_lo) / u_hi
    z_hi, z_lo = _two_product(s_hi, s_hi)
    cube_hi, cube_lo = _two_product(s_hi, z_hi)
    third_hi, third_lo = _two_product(cube_hi, _full(cube_hi, _TWO_THIRDS_HI))  # 2/3 s^3 in two floats: it is up
    third_lo = third_lo + (cube_hi * _TWO_THIRDS_LO + (cube_lo + s_hi * z_lo) * _TWO_THIRDS_HI)  # to 1% of ln m
    ln_hi, ln_lo = _fast_two_sum(2 * s_hi, third_hi)
    ln_lo = ln_lo + (third_lo + 2 * s_lo * (1 + z_hi) + cube_hi * z_hi * _horner(z_hi, _ATANH_SERIES))
    q_hi, q_lo = _two_product(ln_hi, _full(ln_hi, _INV_LN2_HI))
    q_lo = q_lo + (ln_lo * _INV_LN2_HI + ln_hi * _INV_LN2_LO)
    hi = e + q_hi
    hi, lo = _fast_two_sum(hi, (q_hi - (hi - e)) + q_lo)  # (|e| >= 1 > |q_hi|, or e = 0: exact error term)
    special = (a == 0) | isinf(a) | isnan(a)
    return where(special, lax.log2(a), hi), where(special, _full(a, 0.0), lo)


def _fast_two_sum(a: Array, b: Array) -> tuple[Array, Array]:
    """(s, e) with s = a + b rounded and a + b = s + e exactly, for |a| >= |b|."""
    s = a + b
    return s, b - (s - a)


def _float_power(x: Array, y: Array) -> Array:
    """x ** y = 2 ** (y * log2|x|) with numpy's special cases: float32 computes it in float64; float64 carries
    log2|x| and its product with y in two floats each (else results near 2**1000 lose 10 bits)."""
    dt = _dt(x)
    if dt.itemsize < 8: x, y = cast(x, dtypes.float64), cast(y, dtypes.float64)
    if dt.itemsize < 8: magnitude = lax.exp2(y * lax.log2(_abs(x)))
    else:
        log_hi, log_lo = _log2_hi_lo(_abs(x))
        p_hi, p_lo = _two_product(y, log_hi)
        p_lo = p_lo + y * log_lo
        finite = (_abs(p_hi) < 2048) & isfinite(p_lo)  # (else the result is 0, inf or NaN without a correction)
        p_hi, p_lo = _fast_two_sum(p_hi, where(finite, p_lo, _full(p_lo, 0.0)))
        correction = where(finite, p_lo * _LN2, _full(p_lo, 0.0))  # 2^p_lo - 1, p_lo below half an ulp of p_hi
        magnitude = lax.exp2(p_hi) * (1 + correction)
    y_int = lax.trunc(y) == y
    y_odd = _abs(lax.rem(y, _full(y, 2.0))) == 1  # (rem(inf, 2) is NaN: infinite y are even)
    out = where(_signbit(x) & y_odd, lax.neg(magnitude), magnitude)
    out = where((x < 0) & ~y_int & ~isinf(x), _full(x, np.nan), out)  # (-inf) ** 0.5 is inf, as in C
    out = where((_abs(x) == 1) & isinf(y), _full(x, 1.0), out)
    out = where((y == 0) | (x == 1), _full(x, 1.0), out)
    return cast(out, dt)


def _power_compute(x: Array, y: Array) -> Array:
    if _dt(x).is_bool: return x | ~y
    return _differentiable_float_power(x, y) if _dt(x).is_float else _int_power(x, y)


_power_ufunc = elementwise("power", _power_compute, numeric=True)


@jitted_op(static_ints=("x2",), promoted=("x1", "x2"))  # (an int exponent is static: lax.integer_pow's)
def power(x1: Any, x2: Any) -> Array:
    """x1 ** x2 elementwise. A static Python int exponent uses repeated multiplication (lax.integer_pow);
    integer arrays use square-and-multiply; floats use exp2(y*log2|x|) with numpy's sign/zero/inf rules."""
    if isinstance(x2, int) and not isinstance(x2, bool) and not is_python_scalar(x1):
        a = as_operand(x1, "power")
        if not _dt(a).is_bool and (_dt(a).is_inexact or x2 >= 0): return lax.integer_pow(a, x2)
        if not _dt(a).is_bool:
            raise ValueError(at_user_line(f"power: integers to negative integer powers are not allowed "
                                          f"({shape_str(a)} ** {x2})"))
    return _power_ufunc(x1, x2)


# the functions behind Array's operators are fnx.trace's: Array sits below fnx.numpy and builds them itself
add, subtract, multiply, negative, positive = (_trace.add, _trace.subtract, _trace.multiply, _trace.negative,
                                               _trace.positive)
true_divide = divide = _trace.divide
floor_divide = elementwise("floor_divide", _floor_divide, doc="x1 // x2 rounded toward -inf, like numpy.", numeric=True)
mod = remainder = elementwise("mod", _mod, doc="x1 % x2 with the sign of the divisor, like numpy.", numeric=True)
maximum = elementwise("maximum", _maximum, doc="Elementwise maximum; NaN propagates.")
minimum = elementwise("minimum", _minimum, doc="Elementwise minimum; NaN propagates.")
abs = absolute = elementwise("abs", _abs, doc="|x| elementwise (identity for unsigned and bool).")  # noqa: A001
sign = elementwise("sign", _sign, doc="-1, 0 or 1 by the sign of x (NaN stays NaN).")
square = elementwise("square", lambda a: a * a, numeric=True)


# ---- transcendental functions (float approximations over the primitive set) ----

def _floor(x: Array) -> Array:
    t = lax.trunc(x)
    return where(t > x, t - 1, t)


def _ceil(x: Array) -> Array:
    t = lax.trunc(x)
    return where(t < x, t + 1, t)


def _rint(x: Array) -> Array:
    """Round half to even, like numpy.round."""
    t = lax.trunc(x)
    frac = x - t
    half = _full(x, 0.5)
    odd = lax.rem(t, _full(x, 2.0)) != 0
    up = (_abs(frac) > half) | ((_abs(frac) == half) & odd)
    return where(up, t + _sign(frac), t)


# Cody-Waite splits (ln2 and pi/2 as a short head, exact in products with small integers, plus tails), per dtype
_LN2_SPLIT = {dtypes.float32: (0.693359375, -2.12194440e-4), dtypes.float64: (6.93145751953125e-1,
                                                                              1.42860682030941723212e-6)}
_EXP_LIMIT = {dtypes.float32: 104.0, dtypes.float64: 749.0}  # beyond these exp is 0 or inf; keeps 2**n in range


def _exponent_field(dt: DType) -> tuple[DType, int, int]:
    """(the integer type of float dtype `dt`'s bits, its mantissa bits, its exponent bias)."""
    return (dtypes.int32, 23, 127) if dt is dtypes.float32 else (dtypes.int64, 52, 1023)


def _pow2(n: Array, dt: DType) -> Array:
    """2 ** n for integral float n in the normal exponent range, built from the exponent bits (exact)."""
    itype, mantissa, bias = _exponent_field(dt)
    bits = lax.shift_left(lax.add(lax._convert_in_range(n, itype), bias), mantissa)
    return lax.bitcast_convert_type(bits, dt)


_ROUNDER = {dtypes.float32: 1.5 * 2.0 ** 23, dtypes.float64: 1.5 * 2.0 ** 52}


def _round_to_integer(y: Array) -> Array:
    """y rounded to the nearest integer (ties to even) for |y| < 2^22: adding 1.5 * 2^mantissa leaves no fraction
    bits, subtracting it back is exact. Two additions instead of a truncation and a compare-and-fix."""
    big = _ROUNDER[_dt(y)]
    return (y + big) - big


def _exp(x: Array, shift: int = 0) -> Array:
    """e^x * 2^shift (a small shift: the scaling is exact, so e^x / 2 is rounded once and overflows only where
    the result does)."""
    dt = _dt(x)
    head, tail = _LN2_SPLIT[dt]
    limit = _EXP_LIMIT[dt]
    xc = where(x > limit, _full(x, limit), where(x < -limit, _full(x, -limit), x))
    n = _round_to_integer(xc * _LOG2E)
    r = (xc - n * head) - n * tail
    half = lax.trunc(n * 0.5)
    return _exp_reduced(r) * _pow2(half, dt) * _pow2(n - half + shift if shift else n - half, dt)


def _reduce_normal(y: Array) -> tuple[Array, Array]:
    """(r, 2^n) with y = n ln 2 + r, |r| <= ln(2)/2, for y whose e^y is a normal float (|y| below about 87 in
    float32, 708 in float64: the caller clamps). 2^n comes from the rounding sum t = y log2(e) + 1.5 * 2^mantissa
    itself: t's bits are those of 1.5 * 2^mantissa plus n, and shifted into the exponent field the constant's bits
    fall off the top, so 2^n = bits(t) << mantissa plus the bias's (two integer ops instead of a conversion, an add
    and a shift)."""
    dt = _dt(y)
    head, tail = _LN2_SPLIT[dt]
    big = _ROUNDER[dt]
    t = y * _LOG2E + big
    n = t - big
    r = lax._fusable_add(lax._fusable_add(y, n * -head), n * -tail)
    itype, mantissa, bias = _exponent_field(dt)
    bits = lax.add(lax.shift_left(lax.bitcast_convert_type(t, itype), mantissa), bias << mantissa)
    return r, lax.bitcast_convert_type(bits, dt)


def _exp_normal(y: Array) -> Array:
    """e^y for y whose result is a normal float (the caller clamps): one scaling by 2^n instead of the two that
    subnormal and overflowing results need."""
    r, scale = _reduce_normal(y)
    return _exp_reduced(r) * scale


_EXPM1_F32 = (1.9875691500e-4, 1.3981999507e-3, 8.3334519073e-3, 4.1665795894e-2, 1.6666665459e-1,
              5.0000001201e-1)  # Cephes expf: e^r = 1 + r + r^2 P(r) on |r| <= ln(2)/2
_EXPM1_F64 = tuple(1 / math.factorial(k) for k in range(13, 1, -1))  # Taylor to r^13: below 1e-17 there


def _exp_reduced(r: Array) -> Array:
    """e^r for |r| <= ln(2)/2 as a polynomial (plain multiply-adds: vectorizes, no range reduction of its own)."""
    return 1 + r + r * r * _horner(r, _EXPM1_F32 if _dt(r) is dtypes.float32 else _EXPM1_F64, fused=True)


def _log(x: Array) -> Array:
    return lax.log2(x) * _LN2


def _expm1(x: Array) -> Array:
    u = _exp(x)
    um1 = u - 1
    out = where(u == 1, x, um1 * (x / _log(u)))  # (x / log u is near 1: um1 * x would overflow first)
    return where(um1 == -1, _full(x, -1.0), where(isinf(u), u, out))


def _log1p(x: Array) -> Array:
    u = x + 1
    out = where(u == 1, x, _log(u) * (x / (u - 1)))  # (log u * x overflows for huge x)
    return where(u == np.inf, u, out)


def _two_over_pi_chunks(count: int, width: int) -> tuple[float, ...]:
    """2/pi as `count` floats of `width` bits each, the bits after the point in order (their sum is 2/pi to
    2**-(count * width)); from Machin's pi = 16 atan(1/5) - 4 atan(1/239) in exact integer arithmetic."""
    bits = count * width + 64  # guard bits below the last chunk
    one = 1 << bits

    def atan_inv(n: int) -> int:  # atan(1/n) * 2**bits by its series
        total, power, k = 0, one // n, 0
        while power:
            total += (-1) ** k * (power // (2 * k + 1))
            power, k = power // (n * n), k + 1
        return total
    two_over_pi = (2 * one * one) // (16 * atan_inv(5) - 4 * atan_inv(239))
    mask = (1 << width) - 1
    return tuple(((two_over_pi >> (bits - width * (i + 1))) & mask) * 2.0 ** (-width * (i + 1)) for i in range(count))


# 29-bit pieces: a float32's 24-bit significand times one is exact in float64. 7 reach 2**-203, past the 2**-190
# that the largest float32 (2**104 times a 24-bit integer) needs for a result exact to ~2**-60 after cancellation.
_TWO_OVER_PI_29 = _two_over_pi_chunks(7, 29)


def _reduce_quadrant(a: Array) -> tuple[Array, Array]:
    """For a = |x| of a float32 x, held in float64: (q, r) with a = (4j + q) pi/2 + r, q in {0, 1, 2, 3}, |r| <=
    pi/4, r to ~2**-70 relative over the whole float32 range (Payne-Hanek without a table). a * 2/pi mod 4 is the
    sum over the 29-bit chunks c of 2/pi of (a * c mod 4): each product is exact, and so is its remainder; adding
    it to the running fraction (kept in [-1/2, 1/2]) is exact while the chunk's last bit is >= 2**-50, and once it
    is not, the later chunks are below 2**-26, so a rounding error stays relative to the result."""
    frac, turns = _full(a, 0.0), _full(a, 0.0)
    for c in _TWO_OVER_PI_29:
        p = a * c
        if 2.0 ** 128 * c >= 4: p = p - 4 * lax.trunc(p * 0.25)  # (a < 2**128: with a tinier chunk p is below 4)
        frac = frac + p
        n = _round_to_integer(frac)
        frac, turns = frac - n, turns + n
    return turns - 4 * _floor(turns * 0.25), frac * (np.pi / 2)


_SIN_TAYLOR = tuple((-1) ** k / math.factorial(2 * k + 1) for k in range(7, 0, -1))  # r^3 .. r^15 terms / r
_COS_TAYLOR = tuple((-1) ** k / math.factorial(2 * k) for k in range(8, 0, -1))      # r^2 .. r^16 terms


def _quadrant_sin_cos(x: Array) -> tuple[Array, Array, Array]:
    """For float32 x: the quadrant q of |x| and float64 sin(r), cos(r) of its reduced argument (Taylor series on
    |r| <= pi/4: truncation below 1e-16, so rounding to float32 is right but for exact ties; plain multiply-adds
    that vectorize)."""
    q, r = _reduce_quadrant(cast(_abs(x), dtypes.float64))
    z = r * r
    return q, r + r * z * _horner(z, _SIN_TAYLOR, fused=True), 1 + z * _horner(z, _COS_TAYLOR, fused=True)


def _cos_from_sines(x: Array) -> tuple[Array, Array]:
    """float64 (sin x, cos x) from two calls of the SIN primitive, whose argument reduction is right over the whole
    range: cos x = sin 2x / (2 sin x) where |sin x| > 1/2, else +-sqrt(1 - sin^2 x) (>= sqrt(3)/2: no
    cancellation) with the sign of sin 2x / sin x. Past 2**1023, where 2x overflows, 1 - 2 sin^2(x/2) stands in
    (absolute error ~1e-16, so relatively worse only where cos x is near 0)."""
    huge = _abs(x) >= 2.0 ** 1023
    s, s_other = lax.sin(x), lax.sin(x * where(huge, _full(x, 0.5), _full(x, 2.0)))
    magnitude = lax.sqrt(1 - s * s)
    near_one = where(_signbit(s) != _signbit(s_other), lax.neg(magnitude), magnitude)
    cos = where(_abs(s) > 0.5, s_other / (2 * s), near_one)
    return s, where(huge, 1 - 2 * (s_other * s_other), cos)


def _cos(x: Array) -> Array:
    """cos x by quadrant: +-cos r or +-sin r of the exactly reduced argument (float64 inputs: from sines)."""
    if _dt(x) is dtypes.float64: return _cos_from_sines(x)[1]
    q, s, c = _quadrant_sin_cos(x)
    return cast(where(q == 0, c, where(q == 1, lax.neg(s), where(q == 2, lax.neg(c), s))), _dt(x))


def _tan(x: Array) -> Array:
    """tan |x| = sin r / cos r (even quadrants) or -cos r / sin r (odd), with x's sign (float64: sin x / cos x)."""
    if _dt(x) is dtypes.float64:
        s, c = _cos_from_sines(x)
        return s / c
    q, s, c = _quadrant_sin_cos(x)
    odd = (q == 1) | (q == 3)
    t = cast(where(odd, lax.neg(c), s) / where(odd, s, c), _dt(x))
    return where(_signbit(x), lax.neg(t), t)


TANH_ONE_FORMULA = 1  # float32 tanh as one formula (_tanh)
_TANH_F32 = (-5.70498872745e-3, 2.06390887954e-2, -5.37397155531e-2, 1.33314422036e-1, -3.33332819422e-1)  # Cephes
_TANH_P = (-9.64399179425052238628e-1, -9.92877231001918586564e1, -1.61468768441708447952e3)  # Cephes tanh
_TANH_Q = (1.12811678491632931402e2, 2.23548839060100448583e3, 4.84406305325125486048e3)     # leading 1 omitted


def _with_sign_of(magnitude: Array, x: Array) -> Array:
    """|magnitude| with x's sign bit, in integer ops: -0.0 and negative NaNs keep theirs (no gradient rule: for
    the inside of functions that define their own derivative)."""
    bits, sign = _float_bits(x)
    mag, _ = _float_bits(magnitude)
    out = lax.bitwise_or(lax.bitwise_and(mag, ~sign), lax.bitwise_and(bits, sign))
    return lax.bitcast_convert_type(out, _dt(x))


def _expm1_normal(y: Array) -> Array:
    """e^y - 1 for float32 0 <= y <= 20 (the caller clamps), without a branch: with y = n ln 2 + r as in
    _exp_normal, e^y - 1 = 2^n (e^r - 1) + (2^n - 1), where e^r - 1 = r + r^2 P(r) has no cancellation and
    2^n - 1 is exact; for n = 0 it is e^r - 1 itself."""
    r, scale = _reduce_normal(y)
    return lax._fusable_add(scale * (r + r * r * _horner(r, _EXPM1_F32, fused=True)), scale - 1)


def _tanh(x: Array) -> Array:
    """tanh of a = |x| (a bit mask), then x's sign put back; the sign of zero and of NaN is x's. float32: e / (e +
    2) with e = e^(2a) - 1 from _expm1_normal, 2a clamped to 20 (tanh is 1 to the last bit from 9): one formula
    over the whole range, within 2.5 ulp (at most 1.5 from a = 0.3 up), half the work of two branches and a
    select (W1's gelu on the AVX2 EPYC: 7.6 -> 6.1 ms). float64: an odd rational for a < 0.625, else 1 - 2 / (exp(2a) +
    1) (exp overflowing to inf gives exactly 1)."""
    bits, sign = _float_bits(x)
    a = lax.bitcast_convert_type(lax.bitwise_and(bits, ~sign), _dt(x))
    if _dt(x) is dtypes.float32 and TANH_ONE_FORMULA:
        two_a = 2 * a
        e = _expm1_normal(where(two_a > 20.0, _full(x, 20.0), two_a))
        return _with_sign_of(e / (e + 2), x)
    z = a * a
    small = a + a * z * (_horner(z, _TANH_F32, fused=True) if _dt(x) is dtypes.float32
                         else _horner(z, _TANH_P, fused=True) / _horner(z, _TANH_Q, leading_one=True, fused=True))
    two_a = 2 * a  # tanh is 1 to the last bit beyond 2|x| = 20 (float32) or 40 (float64): clamp, then e^y is normal
    limit = 20.0 if _dt(x) is dtypes.float32 else 40.0
    large = 1 - 2 / (_exp_normal(where(two_a > limit, _full(x, limit), two_a)) + 1)
    return _with_sign_of(where(a < 0.625, small, large), x)


# sinh's Taylor coefficients 1/3!, 1/5!, ... (highest power first), to below half an ulp at |x| = 1
_SINH_TAYLOR = {dtypes.float32: tuple(1 / math.factorial(k) for k in range(13, 2, -2)),
                dtypes.float64: tuple(1 / math.factorial(k) for k in range(23, 2, -2))}


def _sinh(x: Array) -> Array:
    """sinh |x| by its odd series below 1, else e^a / 2 - e^-a / 2 (no cancellation past 1; e^a / 2 rounded once
    and finite wherever sinh is); x's sign put back."""
    a = _abs(x)
    z = a * a
    small = a + a * z * _horner(z, _SINH_TAYLOR[_dt(x)], fused=True)
    half_exp = _exp(a, shift=-1)
    r = where(a < 1, small, half_exp - 0.25 / half_exp)
    return where(x < 0, lax.neg(r), r)


def _cosh(x: Array) -> Array:
    """e^|x| / 2 + e^-|x| / 2, with e^|x| / 2 rounded once and finite wherever cosh is."""
    half_exp = _exp(_abs(x), shift=-1)
    return half_exp + 0.25 / half_exp


_ATAN_F32 = (8.05374449538e-2, -1.38776856032e-1, 1.99777106478e-1, -3.33329491539e-1)  # Cephes atanf
_ATAN_P = (-8.750608600031904122785e-1, -1.615753718733365076637e1, -7.500855792314704667340e1,
           -1.228866684490136173410e2, -6.485021904942025371773e1)  # Cephes atan (float64) numerator
_ATAN_Q = (2.485846490142306297962e1, 1.650270098316988542046e2, 4.328810604912902668951e2,
           4.853903996359136964868e2, 1.945506571482613964425e2)  # denominator, leading 1 omitted


def _horner(z: Array, coeffs: Sequence[float], leading_one: bool = False, fused: bool = False) -> Array:
    """The polynomial with these coefficients (highest power first) at z; `fused`: each step may be one
    multiply-add (faster and rounded once; results may differ from unfused steps in the last bit)."""
    acc = z + coeffs[0] if leading_one else _full(z, coeffs[0])
    for c in coeffs[1:]: acc = lax._fusable_add(acc * z, c) if fused else acc * z + c
    return acc


def _atan(x: Array) -> Array:
    """arctan by reduction to |t| <= tan(pi/8) (float32) or 0.66 (float64), then a minimax polynomial/rational."""
    dt = _dt(x)
    a = _abs(x)
    big = a > 2.414213562373095
    mid = ~big & (a > (0.4142135623730950 if dt is dtypes.float32 else 0.66))
    t = where(big, -1 / a, where(mid, (a - 1) / (a + 1), a))
    base = where(big, _full(x, np.pi / 2), where(mid, _full(x, np.pi / 4), _full(x, 0.0)))
    z = t * t
    if dt is dtypes.float32:
        p = _horner(z, _ATAN_F32) * z * t + t
    else:
        p = t * (z * _horner(z, _ATAN_P) / _horner(z, _ATAN_Q, leading_one=True)) + t
        p = p + where(big, _full(x, 6.123233995736765886e-17), where(mid, _full(x, 3.061616997868382943e-17),
                                                                     _full(x, 0.0)))
    r = base + p
    return where(x < 0, lax.neg(r), r)


_ASIN_F32 = (4.2163199048e-2, 2.4181311049e-2, 4.5470025998e-2, 7.4953002686e-2, 1.6666752422e-1)  # Cephes asinf
# pi/2 and pi as float32 head + tail: subtracting from the head and adding the tail keeps the result's last bit
_PIO2_F32 = (float(np.float32(np.pi / 2)), np.pi / 2 - float(np.float32(np.pi / 2)))
_PI_F32 = (float(np.float32(np.pi)), np.pi - float(np.float32(np.pi)))


def _asin_parts(a: Array) -> tuple[Array, Array]:
    """For float32 a = |x| <= 1: (p, big) with asin(a) = p, or pi/2 - 2p where `big` (a > 1/2: p = asin of
    sqrt((1 - a) / 2), 1 - a exact), p from Cephes' polynomial on [0, 1/2]."""
    big = a > 0.5
    z = where(big, 0.5 * (1 - a), a * a)
    s = where(big, lax.sqrt(z), a)
    return s + s * z * _horner(z, _ASIN_F32, fused=True), big


def _asin(x: Array) -> Array:
    """float32: Cephes' asinf; float64: 2 atan(x / (1 + sqrt(1 - x^2)))."""
    if _dt(x) is not dtypes.float32: return 2 * _atan(x / (1 + lax.sqrt((1 - x) * (1 + x))))
    p, big = _asin_parts(_abs(x))
    r = where(big, (_PIO2_F32[0] - 2 * p) + _PIO2_F32[1], p)
    return where(x < 0, lax.neg(r), r)


def _acos(x: Array) -> Array:
    """float32: pi/2 - asin x for |x| <= 1/2, else 2p or pi - 2p from asin's parts; float64: 2 atan(sqrt(1 - x^2)
    / (1 + x))."""
    if _dt(x) is not dtypes.float32:
        out = 2 * _atan(lax.sqrt((1 - x) * (1 + x)) / (1 + x))
        return where(x == -1, _full(x, np.pi), out)
    p, big = _asin_parts(_abs(x))
    middle = (_PIO2_F32[0] - where(x < 0, lax.neg(p), p)) + _PIO2_F32[1]
    return where(big, where(x < 0, (_PI_F32[0] - 2 * p) + _PI_F32[1], 2 * p), middle)


def _atan2(y: Array, x: Array) -> Array:
    ay, ax = _abs(y), _abs(x)
    both_inf = isinf(ay) & isinf(ax)
    lo, hi = _minimum(ay, ax), _maximum(ay, ax)
    ratio = where(both_inf, _full(x, 1.0), where(hi == 0, _full(x, 0.0), lo / hi))
    angle = _atan(ratio)
    angle = where(ay > ax, np.pi / 2 - angle, angle)
    angle = where(_signbit(x), np.pi - angle, angle)
    return where(_signbit(y), lax.neg(angle), angle)


def _with_derivative(compute, derivative):
    """`compute` with an explicit derivative (a custom_jvp): `derivative(*xs, y)` gives dy/dx_i per argument.
    The approximations behind these functions select between branches, and differentiating through a branch
    that is not taken can turn a zero cotangent into 0 * inf = NaN; the closed form has no such branches."""
    fun = pure(custom_jvp(compute))

    @fun.defjvp
    def jvp(primals, tangents):
        y = fun(*primals)
        parts = [t * d for t, d in zip(tangents, derivative(*primals, y))]
        total = parts[0]
        for part in parts[1:]: total = total + part
        return y, total
    return fun


def _odd(compute):
    """An odd function's formula with zeros passed through, so f(-0.0) is -0.0 as in numpy."""
    return lambda x: where(x == 0, x, compute(x))


def _float_ufunc(name: str, compute, doc: str, derivative=None):
    compute = _float_math(compute)
    compute.__name__ = compute.__qualname__ = name  # what graphs and kernel names call it ('tanh', not 'run')
    return elementwise(name, _with_derivative(compute, derivative) if derivative else compute, to_float=True,
                       doc=doc)  # (eager calls run jit of it: trace.jitted_elementwise)


exp = _float_ufunc("exp", _exp, "e ** x elementwise (integers promote to float32).", lambda x, y: (y,))
_EXP_NORMAL_MIN = {dtypes.float32: -87.3, dtypes.float64: -708.3}  # below: e^x is subnormal or 0


def _exp_nonpositive_compute(x: Array) -> Array:
    """e^x for x <= 0 (anything above is clamped to 0); below the normal range 0, whatever _exp_normal made of it
    (it stays finite or NaN there, and no float traps)."""
    lo = _EXP_NORMAL_MIN[_dt(x)]
    return where(x < lo, _full(x, 0.0), _exp_normal(where(x > 0, _full(x, 0.0), x)))


# e^x for x <= 0 (softmax and logsumexp after subtracting the maximum), with results below the normal range
# flushed to 0 as on XLA's CPU backend: one 2^n scaling instead of two
_exp_nonpositive = _float_ufunc("exp", _exp_nonpositive_compute, "e ** x for x <= 0 (subnormal results are 0).",
                                lambda x, y: (y,))
exp2 = elementwise("exp2", lax.exp2, to_float=True, doc="2 ** x elementwise.")
log = _float_ufunc("log", _log, "Natural logarithm elementwise.", lambda x, y: (1 / x,))
log2 = elementwise("log2", lax.log2, to_float=True, doc="Base-2 logarithm elementwise.")
log10 = _float_ufunc("log10", lambda x: lax.log2(x) * 0.30102999566398120, "Base-10 logarithm elementwise.")
log1p = _float_ufunc("log1p", _log1p, "log(1 + x), accurate for small |x|.", lambda x, y: (1 / (1 + x),))
expm1 = _float_ufunc("expm1", _expm1, "exp(x) - 1, accurate for small |x|.", lambda x, y: (y + 1,))
sqrt = elementwise("sqrt", lax.sqrt, to_float=True, doc="Square root elementwise.")
rsqrt = elementwise("rsqrt", lambda x: lax.recip(lax.sqrt(x)), to_float=True, doc="1 / sqrt(x) elementwise.")
reciprocal = elementwise("reciprocal", lax.recip, to_float=True,
                    doc="1 / x elementwise; integers give floats, as in JAX (numpy divides them as integers).")
sin = elementwise("sin", lax.sin, to_float=True, doc="Sine elementwise.")
cos = _float_ufunc("cos", _cos, "Cosine elementwise.", lambda x, y: (lax.neg(lax.sin(x)),))
tan = _float_ufunc("tan", _tan, "Tangent elementwise.", lambda x, y: (1 + y * y,))
tanh = _float_ufunc("tanh", _tanh, "Hyperbolic tangent elementwise (exactly +-1 for large |x|).",
                    lambda x, y: (1 - y * y,))
sinh = _float_ufunc("sinh", _odd(_sinh), "Hyperbolic sine elementwise.", lambda x, y: (cosh(x),))
cosh = _float_ufunc("cosh", _cosh, "Hyperbolic cosine elementwise.", lambda x, y: (sinh(x),))
arctan = _float_ufunc("arctan", _odd(_atan), "Inverse tangent elementwise, in [-pi/2, pi/2].",
                      lambda x, y: (1 / (1 + x * x),))
arcsin = _float_ufunc("arcsin", _odd(_asin), "Inverse sine elementwise (NaN outside [-1, 1]).",
                      lambda x, y: (lax.recip(lax.sqrt((1 - x) * (1 + x))),))
arccos = _float_ufunc("arccos", _acos, "Inverse cosine elementwise (NaN outside [-1, 1]).",
                      lambda x, y: (lax.neg(lax.recip(lax.sqrt((1 - x) * (1 + x)))),))
arctan2 = _float_ufunc("arctan2", _atan2, "The angle of the point (x2, x1) elementwise, in [-pi, pi], with "
                                          "numpy's signed-zero and infinity cases.",
                       lambda y, x, out: (x / (x * x + y * y), lax.neg(y) / (x * x + y * y)))


# d/dx x**y = y x**(y-1), d/dy x**y = log(x) x**y (0 at x = 0, as in JAX)
_differentiable_float_power = _with_derivative(
    _float_power, lambda x, y, out: (y * power(x, y - 1), where(x == 0, _full(x, 0.0), log(x) * out)))


def _rounding(name: str, compute, doc: str):
    return elementwise(name, lambda x: compute(x) if _dt(x).is_float else x, doc=doc)


floor = _rounding("floor", _floor, "Round toward -inf elementwise (integers are returned unchanged).")
ceil = _rounding("ceil", _ceil, "Round toward +inf elementwise (integers are returned unchanged).")
trunc = _rounding("trunc", lax.trunc, "Round toward zero elementwise (integers are returned unchanged).")
rint = _rounding("rint", _rint, "Round half to even elementwise.")


@jitted_op("decimals")
def round(a: Any, decimals: int = 0) -> Array:  # noqa: A001
    """Round half to even to `decimals` decimal places (like numpy: scale, round, unscale)."""
    x = as_operand(a, "round")
    if _dt(x).is_complex:  # each part rounded, as numpy
        return with_weak(make_complex(round(real_part(x), decimals), round(imag_part(x), decimals)), x.weak_type)
    if not _dt(x).is_float:
        if decimals >= 0: return x
        raise UnsupportedError(at_user_line(f"round: negative decimals for integer arrays ({shape_str(x)})"))
    if decimals == 0: return rint(x)
    scale = 10.0 ** decimals
    return with_weak(_float_math(lambda v: _rint(v * scale) / scale)(x), x.weak_type)


around = round


# ---- comparisons and logic ----

# (Array's operators, as in arithmetic above)
equal, not_equal, less, greater = _trace.equal, _trace.not_equal, _trace.less, _trace.greater
less_equal, greater_equal = _trace.less_equal, _trace.greater_equal
bitwise_and, bitwise_or, bitwise_xor = _trace.bitwise_and, _trace.bitwise_or, _trace.bitwise_xor
left_shift, right_shift = _trace.left_shift, _trace.right_shift
invert = bitwise_not = _trace.invert


def _as_bool(a: Array) -> Array:
    return a if _dt(a).is_bool else lax.ne(a, _full(a, 0))


logical_and = elementwise("logical_and", lambda a, b: lax.bitwise_and(_as_bool(a), _as_bool(b)))
logical_or = elementwise("logical_or", lambda a, b: lax.bitwise_or(_as_bool(a), _as_bool(b)))
logical_xor = elementwise("logical_xor", lambda a, b: lax.bitwise_xor(_as_bool(a), _as_bool(b)))
logical_not = elementwise("logical_not", lambda a: lax.bitwise_xor(_as_bool(a), True))
isnan = elementwise("isnan", lambda a: lax.ne(a, a) if _dt(a).is_float else _full(a, False, dtypes.bool_))
isinf = elementwise("isinf", lambda a: _abs(a) == _full(a, np.inf) if _dt(a).is_float
               else _full(a, False, dtypes.bool_))
isfinite = elementwise("isfinite", lambda a: lax.lt(_abs(a), _full(a, np.inf)) if _dt(a).is_float
                  else _full(a, True, dtypes.bool_))


@jitted_op(promoted=("arr", "min", "max", "a", "a_min", "a_max"))
def clip(arr: Any = None, min: Any = None, max: Any = None, *, a: Any = None, a_min: Any = None,  # noqa: A002
         a_max: Any = None) -> Array:
    """Limit values to [min, max] (either may be None); NaN stays NaN. Example: clip(x, 0, 1)."""
    x = as_operand(arr if arr is not None else a, "clip")
    lo, hi = (min if min is not None else a_min), (max if max is not None else a_max)
    if lo is not None: x = maximum(x, lo)
    if hi is not None: x = minimum(x, hi)
    return x


def where(condition: Any, x: Any = None, y: Any = None, /, *, size: int | None = None,
          fill_value: Any = None) -> Array | tuple[Array, ...]:
    """`x` where `condition` else `y` (broadcast together). With only `condition`, the indices of its nonzero
    elements (`nonzero`: needs a concrete value unless `size` is given)."""
    if x is None and y is None: return nonzero(condition, size=size, fill_value=fill_value)
    if size is not None or fill_value is not None:
        raise ValueError(at_user_line("where: size and fill_value are only for the one-argument form"))
    if x is None or y is None: raise ValueError(at_user_line("where: give either both x and y or neither"))
    return _select(condition, x, y)


@jitted_op(promoted=("x", "y"))
def _select(condition: Any, x: Any, y: Any) -> Array:
    """where(condition, x, y), the form jitted as JAX's is (the one-operand form has a shape of its values)."""
    c = _as_bool(as_operand(condition, "where"))
    (x, y), weak = prepare("where", x, y)
    shape = broadcast_shapes(c.shape, x.shape, name="where")
    c, x, y = (broadcast_array(a, shape, "where") for a in (c, x, y))
    return with_weak(lax.select(c, x, y), weak)


def _concrete(x: Any, name: str, error: type = ConcretizationError) -> np.ndarray:
    """The host value of an index-like argument, or `error` (ConcretizationError by default) under jit."""
    if isinstance(x, Array):
        if state.tracing and not x.is_concrete:
            raise error(at_user_line(
                f"{name}: needs concrete values, but got a traced {shape_str(x)} under jit; the result shape "
                "would depend on the values. Use fnx.numpy.where(mask, x, other) instead"))
        return np.asarray(x)
    return np.asarray(x)


def _concrete_ints(x: Any, name: str, what: str) -> np.ndarray:
    """`_concrete`, as int64, raising TypeError (as JAX does) when the values are not integers (2.0, 1.5)."""
    value = _concrete(x, name)
    if value.dtype.kind not in "iub":
        raise TypeError(at_user_line(f"{name}: {what} must be integers, got {value.dtype} {value.tolist()}"))
    return value.astype(np.int64)


def nonzero_sized_hook(x: Array, size: int, fill_value: Any, name: str) -> list[Array]:
    """fnx.numpy_arrays._nonzero_sized, installed when that module (which builds on this one) is imported."""
    raise RuntimeError("fnx.numpy_arrays is not imported")


@eager_op
def nonzero(a: Any, *, size: int | None = None, fill_value: Any = None) -> tuple[Array, ...]:
    """Indices of the nonzero elements, one array of the default int per axis. Without `size` it needs a concrete
    value (not under jit); with it, exactly `size` indices per axis: the first ones, then `fill_value` (default 0;
    a scalar or one per axis), as JAX's."""
    if size is not None:
        x = as_operand(a, "nonzero")
        if x.ndim == 0: raise ValueError(at_user_line("nonzero: not defined for 0-d arrays (as in JAX)"))
        return tuple(nonzero_sized_hook(x, size, fill_value, "nonzero"))
    index = dtypes.default_int().np
    return tuple(array(i.astype(index)) for i in np.nonzero(np.atleast_1d(_concrete(a, "nonzero"))))


# ---- reductions ----

def _reduce_axes(a: Array, axis: Any, name: str) -> tuple[int, ...]:
    if axis is None: return tuple(range(a.ndim))
    return tuple(sorted(normalize_axes(axis, a.ndim, name)))


def _sum_dtype(dt: DType) -> DType:
    """JAX promotes sums and products of bools and integers narrower than the default int to it (int32, or int64
    with x64 on; unsigned ones to the unsigned type of that width)."""
    wide = dtypes.default_int()
    if dt.is_bool or (dt.is_int and dt.itemsize < wide.itemsize):
        return (dtypes.uint64 if wide.itemsize == 8 else dtypes.uint32) if dt.is_unsigned else wide
    return dt


def _accumulate(name: str, reduce_fn, a: Any, axis: Any, dtype: Any, keepdims: bool, where_mask: Any,
                identity: int, promote_integers: bool = True) -> Array:
    x = as_operand(a, name)
    axes = _reduce_axes(x, axis, name)
    keep = not promote_integers and not _dt(x).is_bool  # (bools count in the default int either way, as in JAX)
    out_dtype = dtypes.requested(dtype) if dtype is not None else _dt(x) if keep else _sum_dtype(_dt(x))
    acc = dtypes.float32 if out_dtype.is_float and out_dtype.itemsize < 4 else out_dtype
    x = cast(x, acc)
    if where_mask is not None: x = globals()["where"](where_mask, x, _full(x, identity))
    return with_weak(cast(reduce_fn(x, axes, keepdims=keepdims), out_dtype), False)  # reductions are strong in JAX


@jitted_op("axis", "dtype", "out", "keepdims", "promote_integers", promoted=("a", "initial"))
def sum(a: Any, axis: Any = None, dtype: Any = None, out: None = None, keepdims: bool = False,  # noqa: A001
        initial: Any = None, where: Any = None, promote_integers: bool = True) -> Array:
    """Sum over `axis` (None: all; int or tuple; negative ok). Bools and small ints sum as int32/uint32 (unless
    `promote_integers=False`: then in their own dtype, wrapping); float16/bfloat16 accumulate in float32."""
    total = _accumulate("sum", lax.reduce_sum, a, axis, dtype, keepdims, where, 0, promote_integers)
    return total if initial is None else total + initial


@jitted_op("axis", "dtype", "out", "keepdims", "promote_integers", promoted=("a", "initial"))
def prod(a: Any, axis: Any = None, dtype: Any = None, out: None = None, keepdims: bool = False,
         initial: Any = None, where: Any = None, promote_integers: bool = True) -> Array:
    """Product over `axis`, with the same dtype rules as `sum`."""
    x = as_operand(a, "prod")
    reduce = _complex_product if _dt(x).is_complex or (dtype is not None and np.dtype(dtype).kind == "c") \
        else lax.reduce_prod
    total = _accumulate("prod", reduce, x, axis, dtype, keepdims, where, 1, promote_integers)
    return total if initial is None else total * initial


def _complex_product(x: Array, axes: Sequence[int], keepdims: bool = False) -> Array:
    """The product of complex values over `axes` as a tree of complex multiplies: the axes flattened to one of
    length m, padded with ones to a power of two, then halved log2(m) times (lax.reduce_prod's form)."""
    axes = tuple(axes)
    kept = [i for i in range(x.ndim) if i not in axes]
    moved = transpose(x, kept + list(axes))
    shape = tuple(x.shape[i] for i in kept)
    m = math.prod(x.shape[i] for i in axes)
    rows = moved.reshape(shape + (m,))
    width = 1 << builtins.max(m - 1, 0).bit_length()
    if width > m: rows = pad(rows, [(0, 0)] * len(shape) + [(0, width - m)], constant_values=1)
    while rows.shape[-1] > 1:
        half = rows.shape[-1] // 2
        rows = multiply(rows[..., :half], rows[..., half:])
    out = rows.reshape(shape)
    return out.reshape(tuple(1 if i in axes else s for i, s in enumerate(x.shape))) if keepdims else out


def _complex_extreme(name: str, x: Array, axes: tuple[int, ...], keepdims: bool, initial: Any, where_mask: Any,
                     take_max: bool) -> Array:
    """max/min of complex values in JAX's lexicographic order: the extreme real part, then the extreme imaginary
    part among the elements that have it."""
    if initial is not None or where_mask is not None:
        raise NotImplementedError(at_user_line(f"{name}: initial= and where= with complex values are not "
                                               "implemented in fnx yet"))
    re, im = real_part(x), imag_part(x)
    pick = max if take_max else min
    best_re = pick(re, axis=axes, keepdims=True)
    among = globals()["where"](re == best_re, im, _full(im, -np.inf if take_max else np.inf))
    out = make_complex(best_re, pick(among, axis=axes, keepdims=True))
    return out if keepdims else squeeze(out, axis=axes)


def _extreme(name: str, take_max: bool):
    def fn(a: Any, axis: Any = None, out: None = None, keepdims: bool = False, initial: Any = None,
           where: Any = None) -> Array:
        x = as_operand(a, name)
        axes = _reduce_axes(x, axis, name)
        if initial is None and (where is not None or builtins.any(x.shape[i] == 0 for i in axes)):
            if where is not None:
                raise ValueError(at_user_line(f"{name}: reduction with where= needs an initial value"))
            raise ValueError(at_user_line(f"{name}: zero-size array {shape_str(x)} reduced over axes {axes} "
                                          "has no identity; pass initial="))
        if _dt(x).is_complex: return with_weak(_complex_extreme(name, x, axes, keepdims, initial, where, take_max),
                                               False)
        key = x if take_max else lax._order_reversed(x)
        if where is not None:
            lowest = -np.inf if _dt(x).is_float else (False if _dt(x).is_bool else _dt(x).min)
            key = globals()["where"](where, key, _full(key, lowest))
        best = lax.reduce_max(key, axes, keepdims=keepdims)
        best = best if take_max else lax._order_reversed(best)
        if initial is not None: best = (maximum if take_max else minimum)(best, initial)
        return with_weak(best, False)
    fn.__name__ = fn.__qualname__ = name
    fn.__doc__ = (f"The {'largest' if take_max else 'smallest'} element over `axis` (NaN propagates). "
                  "Raises ValueError for an empty reduction without `initial`.")
    return jitted_op("axis", "out", "keepdims", promoted=("a", "initial"))(fn)


max = amax = _extreme("max", True)  # noqa: A001
min = amin = _extreme("min", False)  # noqa: A001


def _arg_reduction(name: str, lax_fn):
    def fn(a: Any, axis: int | None = None, out: None = None, keepdims: bool = False) -> Array:
        x = as_operand(a, name)
        if axis is None:
            out = lax_fn(ravel(x), 0, dtypes.default_int())
            return lax.reshape(out, (1,) * x.ndim) if keepdims else out
        axis = normalize_axes(axis, x.ndim, name)[0]
        out = lax_fn(x, axis, dtypes.default_int())
        return expand_dims(out, axis) if keepdims else out
    fn.__name__ = fn.__qualname__ = name
    fn.__doc__ = f"int32 index of the first {name[3:]}imum along `axis` (None: of the flattened array); NaN wins."
    return jitted_op("axis", "out", "keepdims")(fn)


argmax = _arg_reduction("argmax", lax.argmax)
argmin = _arg_reduction("argmin", lax.argmin)


@jitted_op("axis", "out", "keepdims")
def any(a: Any, axis: Any = None, out: None = None, keepdims: bool = False, *, where: Any = None) -> Array:  # noqa: A001
    """Whether any element over `axis` is true (nonzero)."""
    x = _as_bool(as_operand(a, "any"))
    if where is not None: x = logical_and(x, where)
    return lax.reduce_max(x, _reduce_axes(x, axis, "any"), keepdims=keepdims)


@jitted_op("axis", "out", "keepdims")
def all(a: Any, axis: Any = None, out: None = None, keepdims: bool = False, *, where: Any = None) -> Array:  # noqa: A001
    """Whether every element over `axis` is true (nonzero)."""
    x = logical_not(as_operand(a, "all"))
    if where is not None: x = logical_and(x, where)
    return logical_not(lax.reduce_max(x, _reduce_axes(x, axis, "all"), keepdims=keepdims))


def _count(x: Array, axes: tuple[int, ...]) -> int:
    return math.prod(x.shape[i] for i in axes)


@jitted_op("axis", "dtype", "out", "keepdims")
def mean(a: Any, axis: Any = None, dtype: Any = None, out: None = None, keepdims: bool = False, *,
         where: Any = None) -> Array:
    """Arithmetic mean over `axis`; integers give float32 (float64 for 64-bit ints). Empty reductions give NaN."""
    x = as_operand(a, "mean")
    dt = dtypes.requested(dtype, "mean") if dtype is not None else inexact_dtype(_dt(x))
    axes = _reduce_axes(x, axis, "mean")
    work = dtypes.float32 if dt.itemsize < 4 else dt  # as JAX: a 16-bit mean divides in float32 (no overflow)
    total = sum(x, axis=axes, dtype=work, keepdims=keepdims, where=where)
    count = _count(x, axes) if where is None else sum(_broadcast(_as_bool(as_operand(where)), x.shape), axis=axes,
                                                      dtype=work, keepdims=keepdims)
    return cast(total / (count if isinstance(count, int) else count), dt)


def _correction(name: str, ddof: Any, correction: Any) -> Any:
    """The degrees of freedom removed: `correction` (the array API's name) or numpy's `ddof`, not both (as JAX)."""
    if correction is None: return ddof
    if ddof != 0: raise ValueError(at_user_line(f"{name}: ddof and correction can't be provided simultaneously."))
    return correction


@jitted_op("axis", "dtype", "out", "ddof", "keepdims", "correction")
def var(a: Any, axis: Any = None, dtype: Any = None, out: None = None, ddof: int = 0,
        keepdims: bool = False, *, where: Any = None, correction: Any = None) -> Array:
    """Variance over `axis`: sum(|x - mean(x)|**2) / (n - ddof), over the elements where `where` is true (all by
    default); `correction` is another name for `ddof`."""
    ddof = _correction("var", ddof, correction)
    x = as_operand(a, "var")
    dt = dtypes.requested(dtype, "var") if dtype is not None else inexact_dtype(_dt(x))
    work = dtypes.float32 if dt.itemsize < 4 else dt
    x = cast(x, work)
    axes = _reduce_axes(x, axis, "var")
    centered = x - mean(x, axis=axes, keepdims=True, where=where)
    if work.is_complex:  # |x - mean|**2, real (numpy's and JAX's variance of complex values)
        centered, dt = abs(centered), dt.component
        work = dt if dt.itemsize >= 4 else dtypes.float32
    if where is None:
        n = _count(x, axes)
        return cast(sum(centered * centered, axis=axes, keepdims=keepdims) / builtins.max(n - ddof, 0), dt)
    count = sum(_broadcast(_as_bool(as_operand(where, "var")), x.shape), axis=axes, dtype=work, keepdims=keepdims)
    squares = sum(centered * centered, axis=axes, keepdims=keepdims, where=where)
    return cast(squares / maximum(count - ddof, 0), dt)


@jitted_op("axis", "dtype", "out", "ddof", "keepdims", "correction")
def std(a: Any, axis: Any = None, dtype: Any = None, out: None = None, ddof: int = 0,
        keepdims: bool = False, *, where: Any = None, correction: Any = None) -> Array:
    """Standard deviation over `axis`: sqrt(var) (same arguments)."""
    return sqrt(var(a, axis=axis, dtype=dtype, ddof=ddof, keepdims=keepdims, where=where, correction=correction))


def _cumulative(name: str, lax_fn):
    def fn(a: Any, axis: int | None = None, dtype: Any = None, out: None = None) -> Array:
        x = as_operand(a, name)
        if axis is None: x, axis = ravel(x), 0
        # unlike sum/prod, JAX keeps small integer dtypes (int8 stays int8, wrapping); bools count as int32
        default = dtypes.default_int() if _dt(x).is_bool else _dt(x)
        out_dtype = dtypes.requested(dtype) if dtype is not None else default
        acc = dtypes.float32 if out_dtype.is_float and out_dtype.itemsize < 4 else out_dtype
        return with_weak(cast(lax_fn(cast(x, acc), normalize_axes(axis, x.ndim, name)[0]), out_dtype), False)
    fn.__name__ = fn.__qualname__ = name
    fn.__doc__ = (f"Running {name[3:]} along `axis` (None: of the flattened array), an O(n log n) log-step scan. "
                  "The result keeps the input dtype (bools give int32), as in JAX; float16/bfloat16 accumulate in "
                  "float32.")
    return jitted_op("axis", "dtype", "out")(fn)


cumsum = _cumulative("cumsum", lax.cumsum)
cumprod = _cumulative("cumprod", lax.cumprod)


# ---- shapes ----

def _resolve_shape(shape: Any, size: int, name: str) -> tuple[int, ...]:
    shape = lax.canonical_shape(shape, name, nonnegative=False)
    unknown = [i for i, s in enumerate(shape) if s == -1]
    known = math.prod(s for s in shape if s != -1)
    if len(unknown) > 1 or builtins.any(s < -1 for s in shape) or (unknown and (known == 0 or size % known)) \
            or (not unknown and known != size):
        raise ShapeError(at_user_line(f"{name}: cannot reshape an array of size {size} into shape {shape}"))
    return tuple(size // known if s == -1 else s for s in shape)


@jitted_op("shape", "order", "newshape")
def reshape(a: Any, shape: Any = None, order: str = "C", *, newshape: Any = None) -> Array:
    """`a` with a new shape of the same size (one entry may be -1). Only C order is supported."""
    x = as_operand(a, "reshape")
    if order != "C": raise UnsupportedError(at_user_line(f"reshape: only order='C' is supported, got {order!r}"))
    return with_weak(lax.reshape(x, _resolve_shape(shape if shape is not None else newshape, x.size, "reshape")),
                 x.weak_type)


@jitted_op("order")
def ravel(a: Any, order: str = "C") -> Array:
    """The flattened (1-D) array."""
    return reshape(a, (-1,), order)


@jitted_op("axes")
def transpose(a: Any, axes: Sequence[int] | None = None) -> Array:
    """Permute the axes (reverse them when `axes` is None)."""
    x = as_operand(a, "transpose")
    perm = tuple(reversed(range(x.ndim))) if axes is None else tuple(axes)
    return with_weak(lax.transpose(x, perm), x.weak_type)


@jitted_op("axis1", "axis2")
def swapaxes(a: Any, axis1: int, axis2: int) -> Array:
    """Exchange two axes."""
    x = as_operand(a, "swapaxes")
    i, j = (normalize_axes(v, x.ndim, "swapaxes")[0] for v in (axis1, axis2))
    perm = list(range(x.ndim))
    perm[i], perm[j] = j, i
    return transpose(x, perm)


@jitted_op("source", "destination")
def moveaxis(a: Any, source: Any, destination: Any) -> Array:
    """Move axes `source` to positions `destination` (ints or sequences of equal length)."""
    x = as_operand(a, "moveaxis")
    src, dst = normalize_axes(source, x.ndim, "moveaxis"), normalize_axes(destination, x.ndim, "moveaxis")
    if len(src) != len(dst):
        raise ValueError(at_user_line(f"moveaxis: source {source} and destination {destination} differ in length"))
    perm = [i for i in range(x.ndim) if i not in src]
    for s, d in sorted(zip(src, dst), key=lambda pair: pair[1]): perm.insert(d, s)
    return transpose(x, perm)


@jitted_op("axis")
def expand_dims(a: Any, axis: Any) -> Array:
    """Insert size-1 axes at positions `axis` (int or tuple) of the result."""
    x = as_operand(a, "expand_dims")
    count = 1 if isinstance(axis, (int, np.integer)) else len(axis)
    axes = normalize_axes(axis, x.ndim + count, "expand_dims")
    dims = iter(x.shape)
    return reshape(x, tuple(1 if i in axes else next(dims) for i in range(x.ndim + count)))


@jitted_op("axis")
def squeeze(a: Any, axis: Any = None) -> Array:
    """Remove size-1 axes (all of them, or those in `axis`; ValueError if one of those is not size 1)."""
    x = as_operand(a, "squeeze")
    axes = (tuple(i for i, s in enumerate(x.shape) if s == 1) if axis is None
            else normalize_axes(axis, x.ndim, "squeeze"))
    if builtins.any(x.shape[i] != 1 for i in axes):
        raise ValueError(at_user_line(f"squeeze: cannot remove axes {axes} of {shape_str(x)}: not of size 1"))
    return reshape(x, tuple(s for i, s in enumerate(x.shape) if i not in axes))


@jitted_op("shape")
def broadcast_to(array: Any, shape: Any) -> Array:
    """`array` broadcast to `shape` with numpy's rules."""
    return _broadcast(as_operand(array, "broadcast_to"), _shape_arg(shape, "broadcast_to"))


@eager_op
def broadcast_arrays(*args: Any) -> list[Array]:
    """The arguments broadcast against each other (dtypes unchanged)."""
    arrs = [as_operand(x, "broadcast_arrays") for x in args]
    shape = broadcast_shapes(*[x.shape for x in arrs], name="broadcast_arrays")
    return [_broadcast(x, shape) for x in arrs]


def _promote_all(name: str, arrays: Sequence[Any]) -> list[Array]:
    arrs = [as_operand(x, name) for x in arrays]
    if not arrs: raise ValueError(at_user_line(f"{name}: needs at least one array"))
    arrs, weak = promote(arrs)
    return [with_weak(x, weak) for x in arrs]


@jitted_op("axis", "dtype", sequences=("arrays",))
def concatenate(arrays: Sequence[Any], axis: int | None = 0, dtype: Any = None) -> Array:
    """Join arrays along an existing `axis` (None: flatten them first); dtypes promote."""
    arrs = _promote_all("concatenate", arrays)
    if axis is None: arrs, axis = [ravel(x) for x in arrs], 0
    if builtins.any(x.ndim == 0 for x in arrs):
        raise ValueError(at_user_line("concatenate: zero-dimensional arrays cannot be concatenated"))
    out = with_weak(lax.concatenate(arrs, normalize_axes(axis, arrs[0].ndim, "concatenate")[0]), arrs[0].weak_type)
    return out if dtype is None else cast(out, dtypes.requested(dtype, "concatenate"))


@jitted_op("axis", "dtype", sequences=("arrays",))
def stack(arrays: Sequence[Any], axis: int = 0, dtype: Any = None) -> Array:
    """Join arrays of one shape along a new `axis`."""
    out = stack_arrays([as_operand(x, "stack") for x in arrays], axis)
    return out if dtype is None else cast(out, dtypes.requested(dtype, "stack"))


def _slice_axis(x: Array, start: int, stop: int, axis: int) -> Array:
    return lax.slice_in_dim(x, start, stop, axis=axis)


@jitted_op("indices_or_sections", "axis")
def split(ary: Any, indices_or_sections: Any, axis: int = 0) -> list[Array]:
    """Split into equal sections (an int that divides the axis) or at the given indices."""
    x = as_operand(ary, "split")
    axis = normalize_axes(axis, x.ndim, "split")[0]
    n = x.shape[axis]
    if isinstance(indices_or_sections, (int, np.integer)):
        sections = int(indices_or_sections)
        if sections <= 0 or n % sections:
            raise ValueError(at_user_line(f"split: array split does not result in an equal division "
                                          f"({n} into {sections} along axis {axis})"))
        cuts = [n // sections * i for i in range(1, sections)]
    else:
        cuts = [int(i) for i in _concrete(indices_or_sections, "split").reshape(-1)]
    bounds = [0] + [builtins.min(builtins.max(c + n if c < 0 else c, 0), n) for c in cuts] + [n]
    return [_slice_axis(x, lo, builtins.max(lo, hi), axis) for lo, hi in zip(bounds[:-1], bounds[1:])]


@jitted_op("reps")
def tile(A: Any, reps: Any) -> Array:
    """Repeat the whole array `reps` times along each axis."""
    x = as_operand(A, "tile")
    reps = lax.canonical_shape(reps, "tile")
    ndim = builtins.max(x.ndim, len(reps))
    shape, reps = (1,) * (ndim - x.ndim) + x.shape, (1,) * (ndim - len(reps)) + reps
    interleaved = lax.reshape(x, tuple(v for s in shape for v in (1, s)))
    spread = lax.expand(interleaved, tuple(v for r, s in zip(reps, shape) for v in (r, s)))
    return with_weak(lax.reshape(spread, tuple(r * s for r, s in zip(reps, shape))), x.weak_type)


@eager_op
def repeat(a: Any, repeats: Any, axis: int | None = None, total_repeat_length: int | None = None) -> Array:
    """Repeat each element `repeats` times (an int, or one static count per element) along `axis`
    (None: of the flattened array)."""
    x = as_operand(a, "repeat")
    if axis is None: x, axis = ravel(x), 0
    axis = normalize_axes(axis, x.ndim, "repeat")[0]
    counts = _concrete_ints(repeats, "repeat", "repeats")
    if counts.ndim == 0 or counts.size == 1:
        r, n = int(counts.reshape(-1)[0]), x.shape[axis]
        spread = lax.expand(lax.reshape(x, x.shape[:axis + 1] + (1,) + x.shape[axis + 1:]),
                            x.shape[:axis + 1] + (r,) + x.shape[axis + 1:])
        return with_weak(lax.reshape(spread, x.shape[:axis] + (n * r,) + x.shape[axis + 1:]), x.weak_type)
    if counts.shape != (x.shape[axis],) or (counts < 0).any():
        raise ValueError(at_user_line(f"repeat: repeats of shape {counts.shape} do not fit axis {axis} of "
                                      f"{shape_str(x)}"))
    index = np.repeat(np.arange(x.shape[axis], dtype=np.int32), counts)
    return with_weak(lax.gather_axis(x, lax.constant_array(index), axis), x.weak_type)


@jitted_op("axis")
def flip(m: Any, axis: Any = None) -> Array:
    """Reverse the order of elements along `axis` (None: all axes)."""
    x = as_operand(m, "flip")
    return with_weak(lax.rev(x, _reduce_axes(x, axis, "flip")), x.weak_type)


def _pad_side(x: Array, axis: int, width: int, before: bool, mode: str) -> Array:
    """`x` extended by `width` along `axis` on one side by copying its own values (edge/reflect/symmetric);
    widths beyond the axis reflect the already padded array again, as numpy does."""
    while width > 0:
        n = x.shape[axis]
        if n == 0: raise ValueError(at_user_line(f"pad: cannot pad an empty axis {axis} with mode {mode!r}"))
        if mode == "edge" or (mode == "reflect" and n == 1):
            piece = _slice_axis(x, 0, 1, axis) if before else _slice_axis(x, n - 1, n, axis)
            piece, k = _broadcast(piece, x.shape[:axis] + (width,) + x.shape[axis + 1:]), width
        else:
            skip = 1 if mode == "reflect" else 0
            k = builtins.min(width, n - skip)
            piece = _slice_axis(x, skip, skip + k, axis) if before else _slice_axis(x, n - skip - k, n - skip, axis)
            piece = lax.rev(piece, (axis,))
        x = lax.concatenate([piece, x] if before else [x, piece], axis)
        width -= k
    return x


@jitted_op("pad_width", "mode", "constant_values")  # (a number or one per side: static, as pad_width)
def pad(array: Any, pad_width: Any, mode: str = "constant", constant_values: Any = 0) -> Array:
    """Pad with `pad_width` ((before, after) per axis, or one pair / int for all) in mode 'constant'
    (`constant_values`), 'edge', 'reflect', 'symmetric' or 'wrap', like numpy.pad."""
    x = as_operand(array, "pad")
    widths = np.broadcast_to(_concrete_ints(pad_width, "pad", "pad_width").reshape(
        (-1, 2) if np.size(pad_width) > 2 else (-1,)), (x.ndim, 2))
    if (widths < 0).any(): raise ValueError(at_user_line(f"pad: negative pad_width {pad_width}"))
    if mode == "constant":
        values = constant_values
        if isinstance(values, Array) or np.size(values) == 1:
            return with_weak(lax.pad(x, cast(as_operand(values).reshape(()), _dt(x)),
                                 [(int(b), int(a), 0) for b, a in widths]), x.weak_type)
        per_axis = np.broadcast_to(np.asarray(values), (x.ndim, 2))
        for axis, ((b, a), (vb, va)) in enumerate(zip(widths, per_axis)):
            cfg = [(0, 0, 0)] * x.ndim
            cfg[axis] = (int(b), 0, 0)
            x = lax.pad(x, cast(as_operand(vb.item()), _dt(x)), cfg)
            cfg[axis] = (0, int(a), 0)
            x = lax.pad(x, cast(as_operand(va.item()), _dt(x)), cfg)
        return x
    if mode not in ("edge", "reflect", "symmetric", "wrap"):
        raise UnsupportedError(at_user_line(f"pad: mode {mode!r} is not supported"))
    for axis, (b, a) in enumerate(widths):
        x = _pad_side(_pad_side(x, axis, int(b), True, mode), axis, int(a), False, mode) if mode != "wrap" else \
            _pad_wrap(x, axis, int(b), int(a))
    return x


def _pad_wrap(x: Array, axis: int, before: int, after: int) -> Array:
    n = x.shape[axis]
    if (before or after) and n == 0: raise ValueError(at_user_line(f"pad: cannot wrap-pad an empty axis {axis}"))
    if not before and not after: return x
    reps = -(-(before + after) // n) + 1  # tile the axis, then cut the window [n - before % n, ...)
    shape = [1] * x.ndim
    shape[axis] = reps + 1
    tiled = tile(x, shape)
    start = (n - before % n) % n
    return _slice_axis(tiled, start, start + n + before + after, axis)


# ---- linear algebra ----

@jitted_op("precision", "preferred_element_type")
def matmul(a: Any, b: Any, *, precision: Any = None, preferred_element_type: Any = None) -> Array:
    """Matrix product with numpy's rules: 1-D operands gain (then lose) an axis; leading batch axes broadcast.
    `preferred_element_type`: the result's dtype (the products accumulate in it); `precision` is accepted as in JAX
    and changes nothing (float32 products are always computed in float32, JAX's CPU default)."""
    (x, y), weak = _prep_pair("matmul", a, b, preferred_element_type)
    if x.ndim == 0 or y.ndim == 0:
        raise ValueError(at_user_line(f"matmul: operands must not be 0-d, got {shape_str(x, y)}"))
    vec_x, vec_y = x.ndim == 1, y.ndim == 1
    x = lax.reshape(x, (1,) + x.shape) if vec_x else x
    y = lax.reshape(y, y.shape + (1,)) if vec_y else y
    if x.shape[-1] != y.shape[-2]:
        raise ShapeError(at_user_line(f"matmul: contracting dimensions differ: {shape_str(x, y)} "
                                      f"({x.shape[-1]} != {y.shape[-2]})"))
    batch = broadcast_shapes(x.shape[:-2], y.shape[:-2], name="matmul")
    if y.ndim == 2 and x.ndim > 2:
        # only x has batch axes: they are more rows of one matrix product, as JAX's dot_general treats them (a
        # broadcast copy of y per batch element made its gradient a product per element and then a sum over them)
        rows = lax.reshape(x, (math.prod(x.shape[:-1]), x.shape[-1]))
        out = lax.dot_general(rows, y, (((1,), (0,)), ((), ())), precision, preferred_element_type)
        shape = x.shape[:-1] + (() if vec_y else (y.shape[-1],))
        return with_weak(lax.reshape(out, shape), weak)
    x, y = _broadcast(x, batch + x.shape[-2:]), _broadcast(y, batch + y.shape[-2:])
    nb = len(batch)
    out = lax.dot_general(x, y, (((nb + 1,), (nb,)), (tuple(range(nb)), tuple(range(nb)))), precision,
                          preferred_element_type)
    shape = batch + (() if vec_x else (x.shape[-2],)) + (() if vec_y else (y.shape[-1],))
    return with_weak(lax.reshape(out, shape), weak)


def _prep_pair(name: str, a: Any, b: Any, preferred: Any = None) -> tuple[list[Array], bool]:
    """Promote two operands to one dtype without broadcasting them (and whether the result is weakly typed: not when
    a `preferred_element_type` is given)."""
    x, y = as_operand(a, name), as_operand(b, name)
    dt, weak = dtypes.result_type((_dt(x), x.weak_type), (_dt(y), y.weak_type))
    return [cast(x, dt), cast(y, dt)], weak and preferred is None


@jitted_op("axes", "precision", "preferred_element_type")
def tensordot(a: Any, b: Any, axes: Any = 2, *, precision: Any = None, preferred_element_type: Any = None) -> Array:
    """Sum products over the last `axes` axes of a and the first of b (int), or over axes pairs
    ((a_axes), (b_axes)). The result has a's free axes, then b's. (`precision`, `preferred_element_type`: as
    matmul's.)"""
    (x, y), weak = _prep_pair("tensordot", a, b, preferred_element_type)
    if isinstance(axes, (int, np.integer)):
        n = int(axes)
        if n > builtins.min(x.ndim, y.ndim) or n < 0:
            raise ShapeError(at_user_line(f"tensordot: cannot contract {n} axes of {shape_str(x, y)}"))
        ax, ay = tuple(range(x.ndim - n, x.ndim)), tuple(range(n))
    else:
        ax, ay = ((v,) if isinstance(v, (int, np.integer)) else tuple(v) for v in axes)
    return with_weak(lax.dot_general(x, y, ((ax, ay), ((), ())), precision, preferred_element_type), weak)


def _scalar_product(x: Array, y: Array, preferred: Any) -> Array:
    """dot/inner with a 0-d operand: the product, in `preferred_element_type` when one is given."""
    if preferred is None: return multiply(x, y)
    dt = dtypes.requested(preferred)
    return with_weak(multiply(cast(x, dt), cast(y, dt)), False)


@jitted_op("precision", "preferred_element_type")
def dot(a: Any, b: Any, *, precision: Any = None, preferred_element_type: Any = None) -> Array:
    """numpy.dot: products for 0-d, inner product for 1-D, matrix product for 2-D, and in general a sum over
    the last axis of a and the second-to-last of b. (`precision`, `preferred_element_type`: as matmul's.)"""
    (x, y), weak = _prep_pair("dot", a, b)
    if x.ndim == 0 or y.ndim == 0: return _scalar_product(x, y, preferred_element_type)
    return tensordot(x, y, ((x.ndim - 1,), (builtins.max(y.ndim - 2, 0),)), precision=precision,
                     preferred_element_type=preferred_element_type)


@jitted_op("precision", "preferred_element_type")
def vdot(a: Any, b: Any, *, precision: Any = None, preferred_element_type: Any = None) -> Array:
    """Dot product of the flattened arrays, the first conjugated (as numpy's)."""
    x = as_operand(a, "vdot")
    x = x.conj() if _dt(x).is_complex else x
    return dot(ravel(x), ravel(b), precision=precision, preferred_element_type=preferred_element_type)


@jitted_op("precision", "preferred_element_type")
def inner(a: Any, b: Any, *, precision: Any = None, preferred_element_type: Any = None) -> Array:
    """Sum of products over the last axes of a and b."""
    (x, y), _ = _prep_pair("inner", a, b)
    if x.ndim == 0 or y.ndim == 0: return _scalar_product(x, y, preferred_element_type)
    return tensordot(x, y, ((x.ndim - 1,), (y.ndim - 1,)), precision=precision,
                     preferred_element_type=preferred_element_type)


@jitted_op()
def outer(a: Any, b: Any) -> Array:
    """out[i, j] = a[i] * b[j] of the flattened arrays."""
    x, y = ravel(a), ravel(b)
    return multiply(lax.reshape(x, (x.size, 1)), lax.reshape(y, (1, y.size)))


def _einsum_parse(subscripts: str, operands: list[Array]) -> tuple[list[list[str]], list[str]]:
    """Labels per operand and for the output; '...' becomes private labels shared right-aligned."""
    subscripts = subscripts.replace(" ", "")
    inputs, arrow, output = subscripts.partition("->")
    terms = inputs.split(",")
    if len(terms) != len(operands):
        raise ValueError(at_user_line(f"einsum: {len(terms)} input terms in {subscripts!r} for "
                                      f"{len(operands)} operands"))
    n_ellipsis = 0
    for term, x in zip(terms, operands):
        if "..." in term: n_ellipsis = builtins.max(n_ellipsis, x.ndim - len(term.replace("...", "")))
    dots = [chr(0x391 + i) for i in range(n_ellipsis)]  # Greek capitals: never valid subscripts

    def expand(term: str, ndim: int | None) -> list[str]:
        head, has_dots, tail = term.partition("...")
        k = (ndim - len(head) - len(tail)) if ndim is not None else n_ellipsis
        return list(head) + (dots[n_ellipsis - k:] if has_dots else []) + list(tail)

    labels = [expand(t, x.ndim) for t, x in zip(terms, operands)]
    for lab, x, t in zip(labels, operands, terms):
        if len(lab) != x.ndim or builtins.any(not (c.isalpha() or c in dots) for c in lab):
            raise ValueError(at_user_line(f"einsum: term {t!r} does not fit operand {shape_str(x)}"))
    if arrow:
        out = expand(output, None)
    else:
        flat = [c for lab in labels for c in lab if c not in dots]
        out = dots + sorted(c for c in set(flat) if flat.count(c) == 1)
    return labels, out


def _einsum_diagonal(x: Array, labels: list[str]) -> tuple[Array, list[str]]:
    """Take the diagonal over repeated labels of one operand (flatten the pair, then stride by n + 1)."""
    while len(set(labels)) < len(labels):
        c = next(c for c in labels if labels.count(c) > 1)
        i, j = [k for k, v in enumerate(labels) if v == c][:2]
        n = x.shape[i]
        rest = [k for k in range(x.ndim) if k not in (i, j)]
        x = lax.reshape(lax.transpose(x, rest + [i, j]), tuple(x.shape[k] for k in rest) + (n * n,))
        x = lax.slice_in_dim(x, 0, n * n, stride=n + 1, axis=x.ndim - 1)
        labels = [labels[k] for k in rest] + [c]
    return x, labels


@eager_op
def einsum(subscripts: str, *operands: Any, optimize: Any = None, precision: Any = None,
           preferred_element_type: Any = None) -> Array:
    """Einstein summation, e.g. `einsum('bij,bjk->bik', a, b)`; supports '...', implicit output and repeated
    labels (diagonals). Contracts operands pairwise, left to right, with dot_general."""
    arrs = _promote_all("einsum", operands)
    labels, out = _einsum_parse(subscripts, arrs)
    sizes: dict[str, int] = {}
    for x, lab in zip(arrs, labels):
        for c, s in zip(lab, x.shape):
            if sizes.get(c, 1) not in (1, s) and s != 1:
                raise ShapeError(at_user_line(f"einsum: label {c!r} has sizes {sizes[c]} and {s} in {subscripts!r}"))
            sizes[c] = builtins.max(sizes.get(c, 1), s)
    if builtins.any(c not in sizes for c in out):
        raise ValueError(at_user_line(f"einsum: output labels {out} not found in the inputs of {subscripts!r}"))
    pending = []
    for x, lab in zip(arrs, labels):
        x, lab = _einsum_diagonal(x, lab)
        pending.append((_broadcast(x, tuple(sizes[c] for c in lab)), lab))

    def sum_unused(x: Array, lab: list[str], others: list[list[str]]) -> tuple[Array, list[str]]:
        needed = set(out).union(*others)
        drop = tuple(i for i, c in enumerate(lab) if c not in needed)
        return (lax.reduce_sum(x, drop) if drop else x), [c for c in lab if c in needed]

    x, lab = sum_unused(*pending[0], [lb for _, lb in pending[1:]])
    for k in range(1, len(pending)):
        y, ylab = sum_unused(*pending[k], [lab] + [lb for _, lb in pending[k + 1:]])
        later = set(out).union(*[lb for _, lb in pending[k + 1:]])
        shared = [c for c in lab if c in ylab]
        batch = [c for c in shared if c in later]
        contract = [c for c in shared if c not in later]
        x = lax.dot_general(x, y, (([lab.index(c) for c in contract], [ylab.index(c) for c in contract]),
                                   ([lab.index(c) for c in batch], [ylab.index(c) for c in batch])),
                            preferred_element_type=preferred_element_type)
        lab = batch + [c for c in lab if c not in shared] + [c for c in ylab if c not in shared]
    x, lab = sum_unused(x, lab, [])
    return with_weak(lax.transpose(x, [lab.index(c) for c in out]), arrs[0].weak_type)


# ---- gathers ----

def _normalize_index(i: Array, n: int) -> Array:
    return where(i < 0, i + n, i)


@jitted_op("axis", "mode", promoted=("a", "fill_value"))
def take(a: Any, indices: Any, axis: int | None = None, mode: str | None = None, fill_value: Any = None) -> Array:
    """Elements of `a` at `indices` along `axis` (None: of the flattened array); negative indices count from the
    end. Out-of-range indices: mode 'fill' (default, as in JAX: NaN / min int / max uint / True, or
    `fill_value`), 'clip' (clamp to [0, n-1], negative ones too, as in JAX) or 'wrap'."""
    x = as_operand(a, "take")
    if axis is None: x, axis = ravel(x), 0
    axis = normalize_axes(axis, x.ndim, "take")[0]
    idx = as_operand(indices, "take")
    check_operand("take", idx, _dt(idx).is_int, "integer indices")
    n = x.shape[axis]
    mode = mode or "fill"
    if mode == "wrap": idx = mod(idx, n)
    # 'clip' clamps negative indices to 0 (numpy's and JAX's rule); the other modes count them from the end
    idx = _clamp_index(idx, n) if mode == "clip" else _normalize_index(idx, n)
    if mode not in ("fill", "clip", "wrap"):
        raise UnsupportedError(at_user_line(f"take: mode {mode!r} is not supported (use 'fill', 'clip' or 'wrap')"))
    if n == 0:
        if idx.size: raise IndexError(at_user_line(f"take: cannot take from an empty axis {axis} of {shape_str(x)}"))
        return lax.full(x.shape[:axis] + idx.shape + x.shape[axis + 1:], 0, _dt(x))
    out = lax.gather_axis(x, idx, axis)
    if mode != "fill": return with_weak(out, x.weak_type)
    valid = (idx >= 0) & (idx < n)
    valid = lax.reshape(valid, (1,) * axis + idx.shape + (1,) * (x.ndim - axis - 1))
    return with_weak(where(_broadcast(valid, out.shape), out, _full(out, _fill_default(_dt(x), fill_value))),
                 x.weak_type)


def _fill_default(dt: DType, fill_value: Any) -> Any:
    if fill_value is not None: return fill_value
    if dt.is_complex: return complex(np.nan, np.nan)
    if dt.is_float: return np.nan
    return True if dt.is_bool else (dt.max if dt.is_unsigned else dt.min)


def _index_dtype(size: int) -> DType:
    return dtypes.int32 if size < 2**31 else dtypes.int64


@jitted_op("axis", "mode", promoted=("arr", "fill_value"))
def take_along_axis(arr: Any, indices: Any, axis: int | None, mode: str | None = None,
                    fill_value: Any = None) -> Array:
    """out[..., i, ...] = arr[..., indices[..., i, ...], ...] along `axis`; the other axes broadcast.
    Negative indices count from the end; out-of-range ones give `fill_value` (mode None or 'fill', as in JAX:
    NaN / the extreme int by default) or are clamped (mode 'clip')."""
    fills = _out_of_bounds_mode(mode, _GATHER_MODES | {None: "fill"}, "take_along_axis") == "fill"
    x, idx = as_operand(arr, "take_along_axis"), as_operand(indices, "take_along_axis")
    if axis is None: x, idx, axis = ravel(x), ravel(idx), 0
    if idx.ndim != x.ndim:
        raise ShapeError(at_user_line(f"take_along_axis: indices and arr must have the same rank, got "
                                      f"{shape_str(x, idx)}"))
    axis = normalize_axes(axis, x.ndim, "take_along_axis")[0]
    off = lambda s: s[:axis] + s[axis + 1:]  # noqa: E731
    other = broadcast_shapes(off(x.shape), off(idx.shape), name="take_along_axis")
    x = _broadcast(x, other[:axis] + (x.shape[axis],) + other[axis:])
    shape = other[:axis] + (idx.shape[axis],) + other[axis:]
    idx = _broadcast(idx, shape)
    out = _gather_linear(x, [(axis, idx)], shape)
    if fills:
        n = x.shape[axis]
        inside = (idx >= -n) & (idx < n)
        out = where(inside, out, _full(out, _fill_default(_dt(x), fill_value)))
    return with_weak(out, x.weak_type)


def _gather_linear(x: Array, indexed: list[tuple[int, Array]], shape: tuple[int, ...]) -> Array:
    """Gather with one index array (of `shape` = x's shape with indexed axes resized) per axis in `indexed`;
    the other axes are taken elementwise. Built as one gather from the flattened array."""
    itype = _index_dtype(x.size)
    strides = [math.prod(x.shape[i + 1:]) for i in range(x.ndim)]
    given = dict(indexed)
    linear = None
    for d in range(x.ndim):
        if d in given:
            i = cast(given[d], itype)
            i = _clamp_index(_normalize_index(i, x.shape[d]), x.shape[d])
        else:
            i = lax.broadcasted_iota(itype, shape, d)
        term = i * strides[d]
        linear = term if linear is None else linear + term
    if x.size == 0: return lax.full(shape, 0, _dt(x))
    return lax.gather_axis(lax.reshape(x, (x.size,)), linear if linear is not None else lax.full(shape, 0, itype), 0)


def _clamp_index(i: Array, n: int) -> Array:
    return where(i < 0, _full(i, 0), where(i > n - 1, _full(i, builtins.max(n - 1, 0)), i))


# ---- indexing: x[key] and x.at[key] ----

def _expand_key(x: Array, key: Any) -> list[tuple[str, Any]]:
    """The index as a list of ('none' | 'int' | 'slice' | 'array', value), Ellipsis expanded, masks turned into
    integer arrays, with every int/array entry consuming one axis of x."""
    key = key if isinstance(key, tuple) else (key,)
    items: list[tuple[str, Any]] = []
    for k in key:
        if type(k) is _Dynamic: items.append(("int" if k.count is None else "slice", k))
        elif k is None or k is Ellipsis or isinstance(k, slice): items.append(("none" if k is None else "ellipsis"
                                                                              if k is Ellipsis else "slice", k))
        elif isinstance(k, (bool, np.bool_)):
            items += [("none", None), ("mask0", bool(k))]
        elif isinstance(k, (int, np.integer)): items.append(("int", int(k)))
        elif isinstance(k, Array) or isinstance(k, (np.ndarray, list, tuple)):
            arr_dtype = _dt(k) if isinstance(k, Array) else np.asarray(k).dtype
            if (arr_dtype == dtypes.bool_ if isinstance(k, Array) else arr_dtype == np.bool_):
                mask = _concrete(k, "boolean indexing", NonConcreteBooleanIndexError)
                items += [("array", array(i.astype(np.int32))) for i in np.nonzero(mask)] if mask.ndim else \
                    [("none", None), ("mask0", bool(mask))]
            else:
                idx = k if isinstance(k, Array) else array(np.asarray(k) if np.size(k) else np.zeros(0, np.int32))
                if not _dt(idx).is_int:
                    raise IndexError(at_user_line(f"indexing: arrays used as indices must be integers or bools, "
                                                  f"got {shape_str(idx)}"))
                items.append(("array", idx))
        else:
            raise IndexError(at_user_line(f"indexing: unsupported index {k!r} of type {type(k).__name__}"))
    ellipses = [i for i, (kind, _) in enumerate(items) if kind == "ellipsis"]
    if len(ellipses) > 1: raise IndexError(at_user_line("indexing: an index can only have one ellipsis ('...')"))
    consumed = builtins.sum(kind in ("int", "slice", "array") for kind, _ in items)
    if consumed > x.ndim:
        raise IndexError(at_user_line(f"indexing: too many indices for an array of shape {x.shape}: {consumed}"))
    fill = [("slice", slice(None))] * (x.ndim - consumed)
    pos = ellipses[0] if ellipses else len(items)
    return items[:pos] + fill + items[pos + 1:]


def _apply_slice(x: Array, axis: int, s: slice | _Dynamic) -> Array:
    if type(s) is _Dynamic: return lax.dynamic_slice_in_dim(x, s.value, s.count, axis, allow_negative_indices=False)
    n = x.shape[axis]
    start, stop, step = s.indices(n)
    count = len(range(start, stop, step))
    if count == 0: return _slice_axis(x, 0, 0, axis)
    if step > 0: return lax.slice_in_dim(x, start, start + (count - 1) * step + 1, stride=step, axis=axis)
    last = start + (count - 1) * step
    return lax.rev(lax.slice_in_dim(x, last, start + 1, stride=-step, axis=axis), (axis,))


def _index(x: Array, key: Any, fill: Any = None) -> Array:
    """numpy indexing of `x` by `key`. As in JAX, negative indices count from the end once and indices still out
    of range are clamped (x[10] of 5 elements is x[4]), or give `fill` if it is given (then integers are gathered
    like index arrays, so that .at[] updates can drop them)."""
    items = _expand_key(x, key)
    advanced = fill is not None or builtins.any(kind == "array" for kind, _ in items)
    out, axis, adv_axes, adv_arrays, drop = x, 0, [], [], []
    for kind, value in items:
        if kind == "none" or kind == "mask0":
            if kind == "none": out = lax.reshape(out, out.shape[:axis] + (1,) + out.shape[axis:])
            else: out = _slice_axis(out, 0, 1 if value else 0, axis - 1)
            axis += kind == "none"
            continue
        n = out.shape[axis]
        if kind == "int" and n == 0:
            raise IndexError(at_user_line(f"indexing: index {value} is out of bounds for axis {axis} with size 0 "
                                          f"(array of shape {x.shape})"))
        if kind == "int" and not advanced:
            if type(value) is _Dynamic:
                out = lax.dynamic_slice_in_dim(out, value.value, 1, axis, allow_negative_indices=False)
            else:
                value = builtins.min(builtins.max(value + n if value < 0 else value, 0), n - 1)
                out = _slice_axis(out, value, value + 1, axis)
            drop.append(axis)
        elif kind == "slice":
            out = _apply_slice(out, axis, value)
        else:
            adv_axes.append(axis)  # an int beyond int32 is out of range either way: clamp it to stay so
            adv_arrays.append(value if kind != "int" else value.value if type(value) is _Dynamic else
                              lax.full((), builtins.min(builtins.max(value, -2**31), 2**31 - 1), dtypes.int32))
        axis += 1
    if drop: out = lax.reshape(out, tuple(s for i, s in enumerate(out.shape) if i not in drop))
    if not adv_axes: return with_weak(out, x.weak_type)
    return with_weak(_advanced(out, adv_axes, adv_arrays, fill), x.weak_type)


def _advanced(x: Array, axes: list[int], indices: list[Array], fill: Any) -> Array:
    """Gather with broadcast integer index arrays on `axes`: the indexed axes are flattened into one and gathered
    with one linear index; the result's index axes go where the first indexed axis was if `axes` are adjacent,
    else first (numpy's rule)."""
    bshape = broadcast_shapes(*[i.shape for i in indices], name="indexing")
    sizes = [x.shape[a] for a in axes]
    total = math.prod(sizes)
    itype = _index_dtype(total)
    adjacent = axes == list(range(axes[0], axes[0] + len(axes)))
    rest = [i for i in range(x.ndim) if i not in axes]
    at = axes[0] if adjacent else 0
    perm = rest[:at] + axes + rest[at:]
    moved = lax.transpose(x, perm)
    flat = lax.reshape(moved, moved.shape[:at] + (total,) + moved.shape[at + len(axes):])
    linear, valid = None, None
    for i, n, stride in zip(indices, sizes, [math.prod(sizes[k + 1:]) for k in range(len(sizes))]):
        i = _normalize_index(_broadcast(cast(i, itype), bshape), n)
        ok = (i >= 0) & (i < n)
        valid = ok if valid is None else valid & ok
        term = _clamp_index(i, n) * stride
        linear = term if linear is None else linear + term
    out_shape = flat.shape[:at] + bshape + flat.shape[at + 1:]
    if total == 0:
        if math.prod(bshape): raise IndexError(at_user_line(f"indexing: cannot index an empty axis of {x.shape}"))
        return lax.full(out_shape, 0, _dt(x))
    out = lax.gather_axis(flat, linear, at)
    if fill is None: return out
    valid = lax.reshape(valid, (1,) * at + bshape + (1,) * (flat.ndim - at - 1))
    return where(_broadcast(valid, out_shape), out, _full(out, fill))


class _Dynamic:
    """An entry of an eager call's index whose value is an argument of its jit (_index_plan): an int index
    (`count` None), or the start of a unit-step slice of `count` elements. `value` is the traced int32."""
    __slots__ = ("value", "count")

    def __init__(self, value: Array, count: int | None):
        self.value, self.count = value, count


def _index_plan(shape: tuple[int, ...], key: Any) -> tuple[tuple, list[int]] | None:
    """An eager x[key]'s form and the int values that its jit takes as arguments, for a key of ints, slices,
    None, Ellipsis and bools: each int index, normalized (-1 is n - 1), and each unit-step slice's start where
    it is not 0 (with the slice's length in the form). So `x[i]` and `x[i:i + 64]` in a loop compile one program,
    as JAX's dynamic slices do, not one per i (9-10 ms each). None for any other key, and for an int out of
    range (clamped by x[key], dropped by x.at[key]): those run op by op."""
    key = key if type(key) is tuple else (key,)
    consumed, ellipses = 0, 0
    for k in key:
        if k is Ellipsis: ellipses += 1
        elif isinstance(k, slice):
            if not builtins.all(v is None or (isinstance(v, (int, np.integer)) and not isinstance(v, (bool, np.bool_)))
                                for v in (k.start, k.stop, k.step)): return None
            consumed += 1
        elif isinstance(k, (int, np.integer)): consumed += not isinstance(k, (bool, np.bool_))
        elif k is not None and not isinstance(k, np.bool_): return None
    if ellipses > 1 or consumed > len(shape) or builtins.max(shape, default=0) >= 2 ** 31: return None
    form, values, axis = [], [], 0
    for k in key:
        if k is None or isinstance(k, (bool, np.bool_)):
            form.append(k if k is None else bool(k))
        elif k is Ellipsis:
            form.append(k)
            axis += len(shape) - consumed
        elif isinstance(k, slice):
            start, stop, step = k.indices(shape[axis])
            if step == 1 and start and (count := builtins.max(stop - start, 0)):
                form.append(("window", count))
                values.append(start)
            else:
                form.append(("slice",) + tuple(v if v is None else int(v) for v in (k.start, k.stop, k.step)))
            axis += 1
        else:
            n, i = shape[axis], int(k)
            i = i + n if i < 0 else i
            if not 0 <= i < n: return None
            form.append(("int",))
            values.append(i)
            axis += 1
    return tuple(form), values


def _planned_key(form: tuple, values: Sequence[Array]) -> tuple:
    """The index of `form` (_index_plan) with its int values `values` (traced) in their places."""
    values, key = iter(values), []
    for e in form:
        if type(e) is not tuple: key.append(e)
        elif e[0] == "slice": key.append(slice(*e[1:]))
        else: key.append(_Dynamic(next(values), e[1] if e[0] == "window" else None))
    return tuple(key)


_index_jits = _trace.LRUCache(256)  # an eager index's form -> the jit of that indexing (or of an .at[] update)


def _jitted_index(name: str, form: tuple, fn: Any) -> Any:
    """The eager jit for indexing of `form` by `fn`, kept per (name, form)."""
    if (f := _index_jits.get((name, form))) is None:
        fn.__name__ = fn.__qualname__ = name
        f = _index_jits.put((name, form), eager_jit(fn))
    return f


def _eager_plan(x: Any, key: Any) -> tuple[tuple, list[int]] | None:
    """_index_plan of x[key] where x[key] or x.at[key] may run as jit of itself: outside a trace and jit off."""
    if state.depth or jit_state.disabled or type(x) is not Array or x._buffer is None: return None
    return _index_plan(x.shape, key)


_getitem_eager = eager_op(lambda x, key: _index(x, key))


def _getitem(x: Array, key: Any) -> Array:
    """x[key]: outside a trace, jit of the indexing, with ints and slice starts as arguments (_index_plan)."""
    if (plan := _eager_plan(x, key)) is None: return _getitem_eager(x, key)
    form, values = plan
    return _jitted_index("getitem", form, lambda a, *v: _index(a, _planned_key(form, v)))(x, *values)


_GATHER_MODES = {None: "clip", "clip": "clip", "promise_in_bounds": "clip", "fill": "fill", "drop": "fill"}
_SCATTER_MODES = {None: "drop", "drop": "drop", "fill": "drop", "promise_in_bounds": "drop", "clip": "clip"}


def _out_of_bounds_mode(mode: Any, modes: dict, name: str) -> str:
    """JAX's GatherScatterMode names -> what fnx does with out-of-range indices ('clip', 'fill' or 'drop')."""
    if mode not in modes:
        raise ValueError(at_user_line(f"{name}: unknown mode {mode!r}; expected one of "
                                      f"{sorted(m for m in modes if m)} or None"))
    return modes[mode]


def _scatter(x: Array, key: Any, values: Any, mode: str, out_of_bounds: str = "drop") -> Array:
    """A copy of x with x[key] combined with `values` (broadcast) by `mode`; out-of-range updates are dropped (as
    JAX's default) or, with out_of_bounds='clip', applied at the clamped index. Outside a trace, jit of the
    update, with the key's ints as arguments (_index_plan) and `values` one too (a Python number where it
    converts exactly as a weak argument; else op by op)."""
    plan = _eager_plan(x, key)
    if plan is None or not (type(values) is Array or _trace.numbers_convert_exactly([x, values]) and (
            type(values) in (bool, int, float) or isinstance(values, np.ndarray))):
        return _scatter_eager(x, key, values, mode, out_of_bounds)
    form, starts = plan
    return _jitted_index(f"at[].{mode}", (form, mode, out_of_bounds), lambda a, v, *i: _scatter_traced(
        a, _planned_key(form, i), v, mode, out_of_bounds))(x, values, *starts)


@eager_op
def _scatter_eager(x: Array, key: Any, values: Any, mode: str, out_of_bounds: str = "drop") -> Array:
    return _scatter_traced(x, key, values, mode, out_of_bounds)


def _scatter_traced(x: Array, key: Any, values: Any, mode: str, out_of_bounds: str) -> Array:
    iota = lax.reshape(lax.iota(_index_dtype(x.size), x.size), x.shape)
    positions = _index(iota, key, fill=-1 if out_of_bounds == "drop" else None)
    updates = _broadcast(cast(as_operand(values, f"at[].{mode}"), _dt(x)), positions.shape, f"at[].{mode}")
    flat = lax.scatter_axis(lax.reshape(x, (x.size,)), lax.reshape(positions, (positions.size,)),
                            lax.reshape(updates, (updates.size,)), 0, mode)
    return with_weak(lax.reshape(flat, x.shape), x.weak_type)


class _IndexUpdateRef:
    """`x.at[key]`: functional updates of the elements `x[key]`. As in JAX, `mode` says what out-of-range indices
    do: updates drop them by default ('drop', 'fill', 'promise_in_bounds') or clamp them ('clip'); `get` clamps by
    default ('clip', 'promise_in_bounds') or fills ('fill', 'drop')."""
    __slots__ = ("array", "key")

    def __init__(self, array: Array, key: Any):
        self.array, self.key = array, key

    def get(self, *, indices_are_sorted: bool = False, unique_indices: bool = False, mode: str | None = None,
            fill_value: Any = None) -> Array:
        """x[key] (with `fill_value`, default NaN / the extreme int, for out-of-range indices when mode='fill')."""
        if _out_of_bounds_mode(mode, _GATHER_MODES, "at[].get") == "fill":
            return eager_op(_index)(self.array, self.key, _fill_default(_dt(self.array), fill_value))
        return _getitem(self.array, self.key)

    def _update(self, values: Any, combine: str, mode: str | None) -> Array:
        return _scatter(self.array, self.key, values, combine, _out_of_bounds_mode(mode, _SCATTER_MODES,
                                                                                   f"at[].{combine}"))

    def set(self, values: Any, *, indices_are_sorted: bool = False, unique_indices: bool = False,
            mode: str | None = None) -> Array:
        return self._update(values, "set", mode)

    def add(self, values: Any, *, indices_are_sorted: bool = False, unique_indices: bool = False,
            mode: str | None = None) -> Array:
        return self._update(values, "add", mode)

    def multiply(self, values: Any, *, indices_are_sorted: bool = False, unique_indices: bool = False,
            mode: str | None = None) -> Array:
        return self._update(values, "mul", mode)

    mul = multiply

    def min(self, values: Any, *, indices_are_sorted: bool = False, unique_indices: bool = False,
            mode: str | None = None) -> Array:
        return self._update(values, "min", mode)

    def max(self, values: Any, *, indices_are_sorted: bool = False, unique_indices: bool = False,
            mode: str | None = None) -> Array:
        return self._update(values, "max", mode)


class _IndexUpdateHelper:
    """The `x.at` property: `x.at[key].set(v)` returns a copy of x with x[key] = v (see _IndexUpdateRef)."""
    __slots__ = ("array",)

    def __init__(self, array: Array):
        self.array = array

    def __getitem__(self, key: Any) -> _IndexUpdateRef:
        return _IndexUpdateRef(self.array, key)


# ---- small utilities ----

def shape(a: Any) -> tuple[int, ...]:
    """The shape of an array or array-like."""
    return a.shape if isinstance(a, Array) else np.shape(a)


def ndim(a: Any) -> int:
    """The number of dimensions of an array or array-like."""
    return len(shape(a))


def size(a: Any) -> int:
    """The number of elements of an array or array-like."""
    return math.prod(shape(a))


astype = _trace.astype


def promote_types(a: Any, b: Any) -> np.dtype:
    """The dtype two (strongly typed) dtypes promote to, as a numpy dtype."""
    return dtypes.promote_types(a, b).np


def result_type(*args: Any) -> np.dtype:
    """The dtype an operation on `args` (arrays, dtypes, Python scalars) produces, as a numpy dtype."""
    return dtypes.result_type(*args)[0].np


# ---- fnx.numpy's part of the Array API (Array.NUMPY_METHODS; its other operators are fnx.trace's) ----

def _method(fn):
    return lambda self, other: apply_operator(fn, self, other)


def _reflected(fn):
    return lambda self, other: apply_operator(fn, other, self)


def _shape_varargs(fn):
    return lambda self, *args, **kwargs: fn(self, args[0] if len(args) == 1 and not isinstance(
        args[0], (int, np.integer)) else (args if args else None), **kwargs)


Array.install_numpy_methods({
    "__getitem__": _getitem, "at": property(_IndexUpdateHelper),
    "__floordiv__": _method(floor_divide), "__rfloordiv__": _reflected(floor_divide),
    "__mod__": _method(mod), "__rmod__": _reflected(mod),
    "__pow__": _method(power), "__rpow__": _reflected(power),
    "__matmul__": _method(matmul), "__rmatmul__": _reflected(matmul),
    "__abs__": abs,
    "T": property(lambda self: transpose(self)),
    "mT": property(lambda self: swapaxes(self, -1, -2)),
    "reshape": _shape_varargs(reshape), "transpose": _shape_varargs(transpose),
    "flatten": ravel, "ravel": ravel, "squeeze": squeeze, "swapaxes": swapaxes, "repeat": repeat,
    "sum": sum, "mean": mean, "prod": prod, "max": max, "min": min, "argmax": argmax, "argmin": argmin,
    "var": var, "std": std, "all": all, "any": any, "cumsum": cumsum, "cumprod": cumprod,
    "clip": clip, "round": round, "dot": dot, "take": take, "nonzero": nonzero,
})


# ---- the rest of jax.numpy, by theme ----

def _extend(names: dict[str, Any]) -> None:
    """Add a themed module's names to fnx.numpy: fnx/numpy_arrays.py (creating, stacking, rearranging),
    numpy_math.py (math, reductions, statistics), numpy_sorting.py (sorting, unique, quantiles) and
    numpy_linalg.py (as `linalg`). They build on the functions above, so they import this module, and
    fnx/__init__.py imports them after it; each calls this at its end (importing them from here would close an
    import cycle, which tests/test_layers.py forbids)."""
    globals().update(names)



def __getattr__(name: str):
    from fnx.jax_names import missing
    raise missing("fnx.numpy", name)
