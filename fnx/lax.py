"""fnx.lax: one function per primitive (plus a few thin compositions), as in jax.lax.

Each primitive function builds exactly one UOp from operands of equal shape and dtype (promoted with fnx.trace's
`promote`; only 0-d operands broadcast); fnx.numpy adds numpy broadcasting on top. Operands may be Arrays, numpy
arrays or Python scalars (weakly typed).
"""
from __future__ import annotations

import builtins
import math
import operator
from typing import Any, Sequence

import numpy as np

from fnx import dtypes, tree_util
from fnx.control_flow import cond, fori_loop, scan, switch, while_loop  # noqa: F401  (jax.lax's control flow)
from fnx.errors import ConcretizationError, ShapeError, UnsupportedError, at_user_line
from fnx.trace import (Array, alu, cast, complex_ufunc, eager_op, join, movement, negate, normalize_axes, promote,
                       shape_str, state, with_weak)
from fnx.trace import constant_array, to_array  # noqa: F401  (public here too: fnx.lax.to_array)
from fnx.uop import CollectiveArg, GroupOp, IotaArg, Ops, ReduceArg, ScatterArg, UOp

# ---- operands ----


def _binary_operands(x: Any, y: Any, name: str) -> tuple[Array, Array, bool]:
    """Convert and promote two operands; returns them with the result's weak flag."""
    (a, b), weak = promote([to_array(x), to_array(y)])
    if a.ndim == 0 and b.ndim: a = _broadcast_scalar(a, b.shape)
    if b.ndim == 0 and a.ndim: b = _broadcast_scalar(b, a.shape)
    return a, b, weak


def _broadcast_scalar(a: Array, shape: tuple[int, ...]) -> Array:
    """A 0-d operand broadcast to `shape` (scalars broadcast in lax ops, as in jax.lax)."""
    if a.uop.op is Ops.CONST: return Array(UOp.const(a.uop.dtype, a.uop.arg.value, shape), a.weak_type)
    return expand(reshape(a, (1,) * len(shape)), shape)


def _same_shapes(name: str, *xs: Array) -> None:
    if any(x.shape != xs[0].shape for x in xs):
        raise ShapeError(at_user_line(f"{name}: operands must have equal shapes, got {shape_str(*xs)}"))


_COMPLEX_UNARY = {Ops.RECIP: "reciprocal", Ops.SQRT: "sqrt", Ops.EXP2: "exp2", Ops.LOG2: "log2", Ops.SIN: "sin"}


def _unary(op: Ops, x: Any, name: str, floats_only: bool = False) -> Array:
    a = to_array(x)
    if a.uop.dtype.is_complex: return with_weak(complex_ufunc(_COMPLEX_UNARY.get(op, name))(a), a.weak_type)
    if floats_only and not a.uop.dtype.is_float:
        raise TypeError(at_user_line(f"{name} needs a floating-point operand, got {shape_str(a)}"))
    return alu(op, a, weak=a.weak_type)


_COMPLEX_FORMS = {Ops.ADD: "add", Ops.MUL: "multiply", Ops.DIV: "divide", Ops.CMPNE: "not_equal"}


def _binary(op: Ops, x: Any, y: Any, name: str) -> Array:
    a, b, weak = _binary_operands(x, y, name)
    _same_shapes(name, a, b)
    if a.uop.dtype.is_complex:  # (computed on the parts: fnx/numpy_complex.py)
        out = complex_ufunc(_COMPLEX_FORMS.get(op, name))(a, b)
        return with_weak(out, weak and out.uop.dtype == a.uop.dtype)
    return alu(op, a, b, weak=weak and op not in GroupOp.Comparison)


# ---- elementwise primitives ----

@eager_op
def add(x, y): return _binary(Ops.ADD, x, y, "add")
@eager_op
def mul(x, y): return _binary(Ops.MUL, x, y, "mul")
@eager_op
def _fusable_add(x, y):
    """x + y, where a product of floats feeding it may be fused with it into one multiply-add (rounded once, not
    twice). fnx.numpy's polynomial approximations use it; the ADD carries arg "contract" (docs/IR.md)."""
    a, b, weak = _binary_operands(x, y, "add")
    _same_shapes("add", a, b)
    return Array(UOp(Ops.ADD, a.uop.dtype, (a.uop, b.uop), "contract"), weak)
@eager_op
def _convert_in_range(x, new_dtype):
    """x (integral floats within new_dtype's range, or NaN) converted to an integer dtype without the saturating
    clamp a CAST renders (three compares and selects): the CAST carries arg "in_range" (docs/IR.md); a NaN gives
    an unspecified integer. fnx.numpy's exp uses it for the exponent of 2^n, where a NaN input is NaN anyway."""
    a = to_array(x)
    return Array(UOp(Ops.CAST, dtypes.to_dtype(new_dtype), (a.uop,), "in_range"), False)
@eager_op
def max(x, y): return _binary(Ops.MAX, x, y, "max")  # noqa: A001
@eager_op
def lt(x, y): return _binary(Ops.CMPLT, x, y, "lt")
@eager_op
def ne(x, y): return _binary(Ops.CMPNE, x, y, "ne")
@eager_op
def shift_left(x, y): return _binary(Ops.SHL, x, y, "shift_left")
@eager_op
def shift_right(x, y): return _binary(Ops.SHR, x, y, "shift_right")


@eager_op
def div(x, y):
    """x / y: true division for floats, truncation toward zero for integers (like C and jax.lax.div)."""
    return _binary(Ops.DIV, x, y, "div")


@eager_op
def rem(x, y):
    """Remainder with the sign of x (like C's fmod and jax.lax.rem)."""
    return _binary(Ops.MOD, x, y, "rem")


def _export(fn, name: str, doc: str):
    """A public lax function made by a factory: named, documented, and eager outside a trace."""
    fn.__name__ = fn.__qualname__ = name
    fn.__doc__ = doc
    return eager_op(fn)


def _bitwise(op: Ops, name: str):
    def fn(x, y):
        a, b, weak = _binary_operands(x, y, name)
        if a.uop.dtype.is_float:
            raise TypeError(at_user_line(f"{name} needs integer or bool operands, got {a.uop.dtype}"))
        _same_shapes(name, a, b)
        return alu(op, a, b, weak=weak)
    return _export(fn, name, f"Elementwise {name} of integer or bool arrays.")


bitwise_and = _bitwise(Ops.AND, "bitwise_and")
bitwise_or = _bitwise(Ops.OR, "bitwise_or")
bitwise_xor = _bitwise(Ops.XOR, "bitwise_xor")


@eager_op
def recip(x): return _unary(Ops.RECIP, x, "recip", floats_only=True)
@eager_op
def sqrt(x): return _unary(Ops.SQRT, x, "sqrt", floats_only=True)
@eager_op
def exp2(x): return _unary(Ops.EXP2, x, "exp2", floats_only=True)
@eager_op
def log2(x): return _unary(Ops.LOG2, x, "log2", floats_only=True)
@eager_op
def sin(x): return _unary(Ops.SIN, x, "sin", floats_only=True)
@eager_op
def trunc(x): return _unary(Ops.TRUNC, x, "trunc", floats_only=True)


@eager_op
def select(pred, on_true, on_false) -> Array:
    """Elementwise `on_true if pred else on_false` (jax.lax.select); all operands of one shape."""
    p = to_array(pred)
    if not p.uop.dtype.is_bool:
        raise TypeError(at_user_line(f"select: predicate must be bool, got {p.uop.dtype}"))
    a, b, weak = _binary_operands(on_true, on_false, "select")
    _same_shapes("select", p, a, b)
    return alu(Ops.WHERE, p, a, b, weak=weak)


@eager_op
def convert_element_type(x, new_dtype) -> Array:
    """Cast to `new_dtype` (float->int truncates toward zero; anything->bool is x != 0); strongly typed."""
    return with_weak(cast(to_array(x), dtypes.requested(new_dtype, "convert_element_type")), False)


@eager_op
def bitcast_convert_type(x, new_dtype) -> Array:
    """Reinterpret the bits of each element as `new_dtype` (same item size)."""
    a, dtype = to_array(x), dtypes.requested(new_dtype, "bitcast_convert_type")
    if dtype.itemsize != a.uop.dtype.itemsize:
        raise TypeError(at_user_line(f"bitcast_convert_type: {a.uop.dtype} and {dtype} differ in size"))
    return Array(UOp(Ops.BITCAST, dtype, (a.uop,)))


# ---- movement primitives ----

def canonical_shape(shape: Any, name: str, nonnegative: bool = True) -> tuple[int, ...]:
    """`shape` (an integer or a sequence of them) as a tuple of Python ints.

    Raises TypeError naming `name` for entries that are not integers (2.5, np.float32(2), a traced value), as JAX's
    "Shapes must be 1D sequences of concrete values of integer type", and for negative sizes when `nonnegative`.
    """
    entries = shape if isinstance(shape, (tuple, list)) or np.ndim(shape) == 1 else (shape,)
    try:
        out = tuple(operator.index(s) for s in entries)
    except ConcretizationError:  # a traced size under jit: that error says what to do
        raise
    except TypeError as err:
        message = f"{name}: shapes must be 1D sequences of concrete values of integer type, got {shape!r}"
        raise TypeError(at_user_line(message)) from err
    if nonnegative and any(s < 0 for s in out):
        raise TypeError(at_user_line(f"{name}: shapes must have nonnegative sizes, got {out}"))
    return out


@eager_op
def reshape(x, new_sizes: Sequence[int]) -> Array:
    a = to_array(x)
    new_sizes = canonical_shape(new_sizes, "reshape", nonnegative=False)
    if math.prod(new_sizes) != a.size or any(s < 0 for s in new_sizes):
        raise ShapeError(at_user_line(f"reshape: cannot reshape an array of shape {a.shape} (size {a.size}) "
                                      f"into shape {new_sizes}"))
    return a if new_sizes == a.shape else movement(Ops.RESHAPE, a, new_sizes)


@eager_op
def transpose(x, permutation: Sequence[int]) -> Array:
    a = to_array(x)
    perm = normalize_axes(permutation, a.ndim, "transpose")
    if len(perm) != a.ndim:
        raise ValueError(at_user_line(f"transpose: permutation {tuple(permutation)} does not match rank {a.ndim}"))
    return a if perm == tuple(range(a.ndim)) else movement(Ops.PERMUTE, a, perm)


@eager_op
def broadcast_in_dim(x, shape: Sequence[int], broadcast_dimensions: Sequence[int]) -> Array:
    """Broadcast `x` to `shape`; operand axis i maps to output axis broadcast_dimensions[i] (jax.lax semantics)."""
    a, shape = to_array(x), canonical_shape(shape, "broadcast_in_dim")
    dims = tuple(broadcast_dimensions)
    if len(dims) != a.ndim or any(a.shape[i] not in (1, shape[d]) for i, d in enumerate(dims)):
        raise ShapeError(at_user_line(f"broadcast_in_dim: cannot broadcast {a.shape} to {shape} "
                                      f"along dimensions {dims}"))
    keep = [1] * len(shape)
    for i, d in enumerate(dims): keep[d] = a.shape[i]
    out = reshape(a, keep)
    return out if tuple(keep) == shape else movement(Ops.EXPAND, out, shape)


@eager_op
def expand(x, shape: Sequence[int]) -> Array:
    """Broadcast size-1 axes of `x` to `shape` (same rank)."""
    a, shape = to_array(x), tuple(shape)
    return a if a.shape == shape else movement(Ops.EXPAND, a, shape)


@eager_op
def pad(x, padding_value, padding_config: Sequence[tuple[int, int, int]]) -> Array:
    """Pad with `padding_value`: (low, high, interior) per axis; negative low/high crop (jax.lax.pad)."""
    a = to_array(x)
    if len(padding_config) != a.ndim:
        raise ValueError(at_user_line(f"pad: need one (low, high, interior) per axis of {a.shape}, "
                                      f"got {padding_config}"))
    if any(interior for _, _, interior in padding_config):
        out = a
        for axis, (_, _, interior) in enumerate(padding_config):
            if interior: out = _interior_pad(out, axis, interior, padding_value)
        return pad(out, padding_value, [(lo, hi, 0) for lo, hi, _ in padding_config])
    crop = tuple((builtins.max(-lo, 0), s - builtins.max(-hi, 0)) for (lo, hi, _), s in zip(padding_config, a.shape))
    if any(b > e for b, e in crop):
        raise ValueError(at_user_line(f"pad: negative padding {padding_config} removes more than the axis size "
                                      f"{a.shape}"))
    out = movement(Ops.SHRINK, a, crop) if crop != tuple((0, s) for s in a.shape) else a
    widths = tuple((builtins.max(lo, 0), builtins.max(hi, 0)) for lo, hi, _ in padding_config)
    if all(w == (0, 0) for w in widths): return out
    padded = movement(Ops.PAD, out, widths)
    value = to_array(padding_value, out.uop.dtype)
    if value.uop.op is Ops.CONST and value.uop.arg.value == 0: return padded
    mask = movement(Ops.PAD, Array(UOp.const(dtypes.bool_, True, out.shape)), widths)
    return select(mask, padded, expand(reshape(value, (1,) * padded.ndim), padded.shape) if value.ndim == 0 else value)


def _interior_pad(a: Array, axis: int, interior: int, value) -> Array:
    n = a.shape[axis]
    if n == 0: return a
    moved = reshape(a, a.shape[:axis + 1] + (1,) + a.shape[axis + 1:])
    cfg = [(0, 0, 0)] * moved.ndim
    cfg[axis + 1] = (0, interior, 0)
    spread = pad(moved, value, cfg)
    flat = reshape(spread, a.shape[:axis] + (n * (interior + 1),) + a.shape[axis + 1:])
    return slice_in_dim(flat, 0, n * (interior + 1) - interior, axis=axis)


@eager_op
def slice(x, start_indices: Sequence[int], limit_indices: Sequence[int], strides: Sequence[int] | None = None) -> Array:  # noqa: A001
    """x[start:limit:stride] per axis (static bounds, jax.lax.slice)."""
    a = to_array(x)
    if len(start_indices) != a.ndim or len(limit_indices) != a.ndim:
        raise ValueError(at_user_line(f"slice: need one start and limit per axis of {a.shape}"))
    bounds = tuple((int(b), int(e)) for b, e in zip(start_indices, limit_indices))
    if any(not 0 <= b <= e <= s for (b, e), s in zip(bounds, a.shape)):
        raise ValueError(at_user_line(f"slice: bounds {bounds} out of range for shape {a.shape}"))
    out = a if bounds == tuple((0, s) for s in a.shape) else movement(Ops.SHRINK, a, bounds)
    if strides is None or all(s == 1 for s in strides): return out
    for axis, stride in enumerate(strides):
        if stride != 1: out = _stride_axis(out, axis, int(stride))
    return out


def _stride_axis(a: Array, axis: int, stride: int) -> Array:
    """Every stride-th element along `axis`, as pad + reshape + shrink (no gather)."""
    n = a.shape[axis]
    count = -(-n // stride)
    cfg = [(0, 0, 0)] * a.ndim
    cfg[axis] = (0, count * stride - n, 0)
    padded = pad(a, 0, cfg)
    split = reshape(padded, a.shape[:axis] + (count, stride) + a.shape[axis + 1:])
    start, limit = [0] * split.ndim, list(split.shape)
    limit[axis + 1] = 1
    return reshape(slice(split, start, limit), a.shape[:axis] + (count,) + a.shape[axis + 1:])


def slice_in_dim(x, start: int, limit: int, stride: int = 1, axis: int = 0) -> Array:
    a = to_array(x)
    axis = normalize_axes(axis, a.ndim, "slice_in_dim")[0]
    starts, limits, strides = [0] * a.ndim, list(a.shape), [1] * a.ndim
    starts[axis], limits[axis], strides[axis] = start, limit, stride
    return slice(a, starts, limits, strides)


@eager_op
def rev(x, dimensions: Sequence[int]) -> Array:
    """Reverse the order of elements along `dimensions`."""
    a = to_array(x)
    axes = normalize_axes(dimensions, a.ndim, "rev")
    return a if not axes else movement(Ops.FLIP, a, tuple(i in axes for i in range(a.ndim)))


@eager_op
def gather_axis(x, indices, axis: int) -> Array:
    """Gather along one axis: out[..., i..., ...] = x[..., indices[i...], ...]. Out-of-range indices are clamped
    (as JAX's gather does); negative indices are not normalized here (fnx.numpy does that)."""
    a, idx = to_array(x), to_array(indices)
    if not idx.uop.dtype.is_int:
        raise TypeError(at_user_line(f"gather: indices must be integers, got {idx.uop.dtype}"))
    axis = normalize_axes(axis, a.ndim, "gather")[0]
    return Array(UOp(Ops.INDEX, a.uop.dtype, (a.uop, idx.uop), axis), a.weak_type)


@eager_op
def scatter_axis(x, indices, updates, axis: int, mode: str = "set") -> Array:
    """A copy of x with x[..., indices[i], ...] combined with updates[..., i, ...] (mode: set/add/mul/min/max).
    Indices outside the axis are dropped, as JAX's scatter does."""
    a, idx = to_array(x), to_array(indices)
    upd = convert_element_type(updates, a.uop.dtype)
    axis = normalize_axes(axis, a.ndim, "scatter")[0]
    want = a.shape[:axis] + idx.shape + a.shape[axis + 1:]
    if mode not in ("set", "add", "mul", "min", "max"):
        raise ValueError(f"scatter: unknown mode {mode!r}")
    if upd.shape != want:
        raise ShapeError(at_user_line(f"scatter: updates of shape {upd.shape} do not fit indices of shape {idx.shape} "
                                      f"into an operand of shape {a.shape} along axis {axis} (want {want})"))
    return Array(UOp(Ops.SCATTER, a.uop.dtype, (a.uop, idx.uop, upd.uop), ScatterArg(axis, mode)), a.weak_type)


# ---- reductions ----

def _reduce(op: Ops, x: Any, axes: Sequence[int], name: str) -> Array:
    """Reduce over `axes`, keeping them as size-1 axes (the REDUCE primitive)."""
    a = to_array(x)
    axes = tuple(sorted(normalize_axes(axes, a.ndim, name)))
    if not axes: return a
    return Array(UOp(Ops.REDUCE, a.uop.dtype, (a.uop,), ReduceArg(op, axes)), a.weak_type)


def _drop_axes(a: Array, axes: tuple[int, ...]) -> Array:
    return reshape(a, tuple(s for i, s in enumerate(a.shape) if i not in axes))


def _reducer(op: Ops, name: str):
    def fn(operand, axes: Sequence[int], keepdims: bool = False) -> Array:
        a = to_array(operand)
        norm = normalize_axes(axes, a.ndim, name)
        out = _reduce(op, a, norm, name)
        return out if keepdims else _drop_axes(out, norm)
    return _export(fn, name, f"Reduce `operand` over `axes` with {op.name.lower()}.")


reduce_sum = _reducer(Ops.ADD, "reduce_sum")
reduce_max = _reducer(Ops.MAX, "reduce_max")
reduce_prod = _reducer(Ops.MUL, "reduce_prod")


# ---- markers ----

def _identity_per_leaf(op: Ops, x: Any) -> Any:
    """`op` (an identity on values) applied to every array leaf of the pytree `x`, as JAX's versions take pytrees."""
    def leaf(v):
        a = to_array(v)
        return Array(UOp(op, a.uop.dtype, (a.uop,)), a.weak_type)
    return tree_util.tree_map(leaf, x)


@eager_op
def stop_gradient(x) -> Any:
    """The identity whose gradient is zero, on an array or a pytree of them."""
    return _identity_per_leaf(Ops.DETACH, x)


@eager_op
def optimization_barrier(x) -> Any:
    """The identity, forced into its own buffer (no fusion across it), on an array or a pytree of them."""
    return _identity_per_leaf(Ops.CONTIGUOUS, x)


# ---- compositions that jax.lax also offers ----

def full(shape: Sequence[int], fill_value, dtype=None) -> Array:
    shape = canonical_shape(shape, "full")
    dt = dtypes.requested(dtype, "full") if dtype is not None else dtypes.canonicalize_scalar(
        fill_value.item() if isinstance(fill_value, np.generic) else fill_value)[0]
    if isinstance(fill_value, Array):
        return broadcast_in_dim(convert_element_type(fill_value, dt), shape, ())
    return Array(UOp.const(dt, fill_value, shape))


def iota(dtype, size: int) -> Array:
    """[0, 1, ..., size-1] as `dtype`."""
    return broadcasted_iota(dtype, canonical_shape(size, "iota"), 0)


def broadcasted_iota(dtype, shape: Sequence[int], dimension: int) -> Array:
    """An array of `shape` whose value is its index along `dimension`."""
    dt, shape = dtypes.requested(dtype, "broadcasted_iota"), canonical_shape(shape, "broadcasted_iota")
    dimension = normalize_axes(dimension, len(shape), "broadcasted_iota")[0]
    index_dtype = dtypes.int32 if dt.itemsize <= 4 or not dt.is_int else dtypes.int64
    index = UOp(Ops.IOTA, index_dtype, (), IotaArg(shape, dimension))
    return convert_element_type(Array(index), dt)


# ---- compositions used by fnx.numpy ----

@eager_op
def neg(x) -> Array:
    """-x; unsigned integers wrap like numpy (multiplying by the all-ones value, which is -1 modulo 2**bits)."""
    a = to_array(x)
    if a.uop.dtype.is_bool:
        raise TypeError(at_user_line(f"neg: cannot negate a bool array of shape {a.shape}; use logical_not"))
    return with_weak(complex_ufunc("negative")(a), a.weak_type) if a.uop.dtype.is_complex else negate(a)


@eager_op
def sub(x, y) -> Array:
    """x - y, as x + (-y) (exact for floats; wraps for integers)."""
    a, b, weak = _binary_operands(x, y, "sub")
    _same_shapes("sub", a, b)
    return alu(Ops.ADD, a, neg(b), weak=weak)


@eager_op
def integer_pow(x, y: int) -> Array:
    """x ** y for a static Python int y, by repeated squaring (y < 0 takes the reciprocal; floats only)."""
    a, y = to_array(x), int(y)
    if y < 0 and not a.uop.dtype.is_inexact:
        raise ValueError(at_user_line(f"integer_pow: integers to negative powers ({a.uop.dtype}{list(a.shape)} "
                                      f"** {y}) are not allowed"))
    result, base, n = None, a, builtins.abs(y)
    while n:
        if n & 1: result = base if result is None else mul(result, base)
        n >>= 1
        if n: base = mul(base, base)
    result = full(a.shape, 1, a.uop.dtype) if result is None else result
    return Array((recip(result) if y < 0 else result).uop, a.weak_type)


@eager_op
def concatenate(operands: Sequence[Any], dimension: int) -> Array:
    """Join arrays of equal dtype and rank along `dimension`, as a balanced tree of pad + select (no scatter)."""
    arrs = [to_array(o) for o in operands]
    if not arrs: raise ValueError(at_user_line("concatenate: needs at least one operand"))
    first = arrs[0]
    dim = normalize_axes(dimension, first.ndim, "concatenate")[0] if first.ndim else None
    other = lambda a: a.shape[:dim] + a.shape[dim + 1:]  # noqa: E731
    if dim is None or any(a.ndim != first.ndim or a.uop.dtype != first.uop.dtype or other(a) != other(first)
                          for a in arrs):
        raise ShapeError(at_user_line(f"concatenate: operands must have one dtype, one rank >= 1 and equal sizes "
                                      f"off axis {dimension}, got {shape_str(*arrs)}"))
    return join(arrs, dim)


def _cumulative(combine, identity, name: str):
    def fn(operand, axis: int = 0, reverse: bool = False) -> Array:
        a = to_array(operand)
        axis = normalize_axes(axis, a.ndim, name)[0]
        out = rev(a, (axis,)) if reverse else a
        shift, n = 1, a.shape[axis]
        while shift < n:  # log-step (Hillis-Steele) scan: O(n log n) work, log n steps
            cfg = [(0, 0, 0)] * a.ndim
            cfg[axis] = (shift, -shift, 0)
            out = combine(out, pad(out, identity, cfg))
            shift *= 2
        return rev(out, (axis,)) if reverse else out
    return _export(fn, name, f"Inclusive running {name[3:]} along `axis` (jax.lax.{name}).")


cumsum = _cumulative(add, 0, "cumsum")
cumprod = _cumulative(mul, 1, "cumprod")


@eager_op
def dot_general(lhs, rhs, dimension_numbers, precision=None, preferred_element_type=None) -> Array:
    """Contract `lhs` and `rhs` (jax.lax.dot_general): dimension_numbers = ((lhs_contract, rhs_contract),
    (lhs_batch, rhs_batch)). The result has the batch axes, then lhs's free axes, then rhs's free axes.
    Built as broadcast multiply + sum; float16/bfloat16 accumulate in float32."""
    a, b = to_array(lhs), to_array(rhs)
    dtype, weak = dtypes.result_type((a.uop.dtype, a.weak_type), (b.uop.dtype, b.weak_type))
    (lc, rc), (lb, rb) = dimension_numbers
    lc, rc = normalize_axes(lc, a.ndim, "dot_general"), normalize_axes(rc, b.ndim, "dot_general")
    lb, rb = normalize_axes(lb, a.ndim, "dot_general"), normalize_axes(rb, b.ndim, "dot_general")
    sizes = lambda x, axes: [x.shape[i] for i in axes]  # noqa: E731
    if len(lc) != len(rc) or len(lb) != len(rb) or sizes(a, lc) != sizes(b, rc) or sizes(a, lb) != sizes(b, rb) \
            or set(lc) & set(lb) or set(rc) & set(rb):
        raise ShapeError(at_user_line(f"dot_general: cannot contract {a.uop.dtype}{list(a.shape)} with "
                                      f"{b.uop.dtype}{list(b.shape)} using dimension_numbers {dimension_numbers}"))
    lf = tuple(i for i in range(a.ndim) if i not in lc and i not in lb)
    rf = tuple(i for i in range(b.ndim) if i not in rc and i not in rb)
    out_dtype = dtypes.requested(preferred_element_type, "dot_general") if preferred_element_type is not None else dtype
    acc = dtypes.float32 if out_dtype.is_float and out_dtype.itemsize < 4 else out_dtype
    a, b = convert_element_type(a, acc), convert_element_type(b, acc)
    batch, cont = sizes(a, lb), sizes(a, lc)
    a = reshape(transpose(a, lb + lf + lc), batch + sizes(a, lf) + [1] * len(rf) + cont)
    b = reshape(transpose(b, rb + rf + rc), batch + [1] * len(lf) + sizes(b, rf) + cont)
    shape = tuple(t if s == 1 else s for s, t in zip(a.shape, b.shape))
    out = mul(expand(a, shape), expand(b, shape))
    nfree = len(batch) + len(lf) + len(rf)
    out = reduce_sum(out, tuple(range(nfree, len(shape)))) if cont else out
    return Array(convert_element_type(out, out_dtype).uop, weak and preferred_element_type is None)


def _order_reversed(a: Array) -> Array:
    """A monotonically decreasing map of `a` (negation for floats, bitwise not for integers and bools)."""
    if a.uop.dtype.is_float: return neg(a)
    return bitwise_xor(a, full(a.shape, -1 if a.uop.dtype.is_int else True, a.uop.dtype))


def _arg_extreme(name: str, take_max: bool):
    def fn(operand, axis: int, index_dtype=dtypes.int32) -> Array:
        a = to_array(operand)
        axis = normalize_axes(axis, a.ndim, name)[0]
        n = a.shape[axis]
        if n == 0:
            raise ValueError(at_user_line(f"{name}: attempt to get {name} of an empty sequence "
                                          f"(shape {a.shape}, axis {axis})"))
        key = a if take_max else _order_reversed(a)
        best = expand(reduce_max(key, (axis,), keepdims=True), key.shape)
        hit = bitwise_xor(ne(key, best), True)
        if key.uop.dtype.is_float:  # NaN wins, as in numpy: the reduced max is NaN and the NaNs are the hits
            hit = bitwise_or(hit, bitwise_and(ne(key, key), ne(best, best)))
        reversed_index = sub(full(a.shape, n - 1, index_dtype), broadcasted_iota(index_dtype, a.shape, axis))
        first = reduce_max(select(hit, reversed_index, full(a.shape, -1, index_dtype)), (axis,))
        return sub(full(first.shape, n - 1, index_dtype), first)
    extreme = "largest" if take_max else "smallest"
    return _export(fn, name, f"Index of the first {extreme} element along `axis` (NaN wins).")


argmax = _arg_extreme("argmax", True)
argmin = _arg_extreme("argmin", False)


# ---- collectives over a named axis (a vmap's axis_name) ----

def _axis_size(axis_name: str, op: str) -> int:
    if axis_name not in state.axis_sizes:
        raise NameError(at_user_line(f"{op}: unbound axis name {axis_name!r}; collectives need an enclosing "
                                     f"vmap(..., axis_name={axis_name!r}) or shard_map over a mesh with that axis"))
    return state.axis_sizes[axis_name]


def _axis_names(axis_name: Any) -> tuple:
    """A named axis or a tuple of them (JAX: a collective over several nested vmaps' axes at once)."""
    return tuple(axis_name) if isinstance(axis_name, (tuple, list)) else (axis_name,)


def _total_size(axis_name: Any, op: str) -> int:
    """The size of a named axis, or the product of the sizes of a tuple of them."""
    return math.prod(_axis_size(name, op) for name in _axis_names(axis_name))


def _one_axis_name(axis_name: Any, op: str) -> str:
    """The single name of a collective that fnx runs over one named axis at a time."""
    names = _axis_names(axis_name)
    if len(names) != 1:
        raise UnsupportedError(at_user_line(f"{op} over several axis names {axis_name!r} is not supported: use one "
                                            "name at a time"))
    return names[0]


def _no_groups(axis_index_groups: Any, op: str) -> None:
    if axis_index_groups is not None:
        raise UnsupportedError(at_user_line(f"{op}: axis_index_groups is not supported (got {axis_index_groups!r})"))


def _check_chunks(op: str, what: str, a: Array, axis: int, axis_name: Any, size: int, tiled: bool) -> None:
    """Tiled collectives split `axis` into `size` chunks; untiled ones need it to have exactly `size` entries."""
    if a.shape[axis] % size if tiled else a.shape[axis] != size:
        need = "be divisible by" if tiled else "equal"
        raise ValueError(at_user_line(f"{op}: {what} {axis} of an array of shape {a.shape} must {need} the size "
                                      f"{size} of axis name {axis_name!r} (tiled={tiled})"))


def _collective(kind: str, x: Any, axis_name: Any, axis: int = 0, perm: tuple = (), split_axis: int = 0) -> Array:
    a = to_array(x)
    for name in _axis_names(axis_name):  # over several axes: one after the other
        arg = CollectiveArg(kind, name, _axis_size(name, kind), axis, perm, split_axis)
        a = Array(UOp(Ops.COLLECTIVE, a.uop.dtype, (a.uop,), arg), a.weak_type)
    return a


def _tree_collective(kind: str):
    def fn(x, axis_name: Any):
        return tree_util.tree_map(lambda leaf: _collective(kind, leaf, axis_name), x)
    return _export(fn, kind, f"The {kind[1:]} of x over the named axis `axis_name` (or a tuple of names) "
                             "(every example gets it).")


psum = _tree_collective("psum")
pmax = _tree_collective("pmax")
pmin = _tree_collective("pmin")


@eager_op
def pmean(x, axis_name: Any):
    """The mean of x over the named axis `axis_name` (or a tuple of names)."""
    size = _total_size(axis_name, "pmean")
    return tree_util.tree_map(lambda leaf: div(_collective("psum", leaf, axis_name), float(size))
                              if to_array(leaf).uop.dtype.is_inexact
                              else _collective("psum", leaf, axis_name) // size, x)


@eager_op
def all_gather(x, axis_name: str, axis: int = 0, tiled: bool = False) -> Any:
    """Every example's x (an array or a pytree of them), stacked along a new axis `axis` (or concatenated along it
    with tiled=True)."""
    _one_axis_name(axis_name, "all_gather")  # jax.vmap does not batch it over several either

    def gather(leaf):
        a = to_array(leaf)
        where = normalize_axes(axis, a.ndim + (0 if tiled else 1), "all_gather")[0]
        out = _collective("all_gather", a, axis_name, where)
        if not tiled: return out
        return reshape(out, a.shape[:where] + (out.shape[where] * a.shape[where],) + a.shape[where + 1:])
    return tree_util.tree_map(gather, x)


@eager_op
def psum_scatter(x, axis_name: Any, *, scatter_dimension: int = 0, axis_index_groups=None,
                 tiled: bool = False) -> Any:
    """The psum of x over the named axis, of which each example keeps only its own chunk (jax.lax.psum_scatter).

    Args:
      x: an array or a pytree of them.
      axis_name: a named axis of size n, or a tuple of names (their row-major product).
      scatter_dimension: the axis split into n chunks, example k keeping chunk k. Untiled, its size must be n
        and it is removed; tiled, its size must be divisible by n and it shrinks n-fold.
      axis_index_groups: not supported (None).
      tiled: keep the rank (see scatter_dimension).

    Returns:
      This example's chunk of the sum over all examples.

    Example:
      >>> fnx.vmap(lambda x: lax.psum_scatter(x, "i"), axis_name="i")(np.arange(16.0).reshape(4, 4))
      Array([24., 28., 32., 36.], dtype=float32)
    """
    _no_groups(axis_index_groups, "psum_scatter")
    size = _total_size(axis_name, "psum_scatter")

    def scatter(leaf):
        a = to_array(leaf)
        axis = normalize_axes(scatter_dimension, a.ndim, "psum_scatter")[0]
        _check_chunks("psum_scatter", "scatter_dimension", a, axis, axis_name, size, tiled)
        out = _collective("psum_scatter", a, axis_name, axis)  # over several names: chunks of chunks, row-major
        return out if tiled else reshape(out, a.shape[:axis] + a.shape[axis + 1:])
    return tree_util.tree_map(scatter, x)


def _checked_perm(perm: Any, axis_name: Any, size: int) -> tuple[tuple[int, int], ...]:
    """ppermute's `perm` as (source, destination) int pairs in [0, size), no source or destination twice."""
    try:
        pairs = tuple((operator.index(src), operator.index(dst)) for src, dst in perm)
    except (TypeError, ValueError):
        raise ValueError(at_user_line(f"ppermute: perm must be a sequence of (source, destination) pairs of ints, "
                                      f"got {perm!r}")) from None
    sources, destinations = [s for s, _ in pairs], [d for _, d in pairs]
    if any(not 0 <= i < size for i in sources + destinations) or len(set(sources)) != len(sources) \
            or len(set(destinations)) != len(destinations):
        raise ValueError(at_user_line(f"ppermute: perm {perm!r} over axis name {axis_name!r} of size {size} needs "
                                      f"indices in [0, {size}) and no source or destination twice"))
    return pairs


@eager_op
def ppermute(x, axis_name: Any, perm: Sequence[tuple[int, int]]) -> Any:
    """Send x between the examples of the named axis (jax.lax.ppermute).

    Args:
      x: an array or a pytree of them.
      axis_name: a named axis.
      perm: (source, destination) pairs of example indices: example `destination` gets example `source`'s x.
        No two pairs share a source or a destination; examples that are no pair's destination get zeros.

    Returns:
      The x of the example that sends to this one (zeros if none does).

    Example:
      >>> ring = [(j, (j + 1) % 4) for j in range(4)]
      >>> fnx.vmap(lambda x: lax.ppermute(x, "i", ring), axis_name="i")(np.arange(4.0))
      Array([3., 0., 1., 2.], dtype=float32)
    """
    name = _one_axis_name(axis_name, "ppermute")
    pairs = _checked_perm(perm, name, _axis_size(name, "ppermute"))
    return tree_util.tree_map(lambda leaf: _collective("ppermute", leaf, name, perm=pairs), x)


@eager_op
def all_to_all(x, axis_name: Any, split_axis: int, concat_axis: int, *, axis_index_groups=None,
               tiled: bool = False) -> Any:
    """Exchange chunks between the examples of the named axis (jax.lax.all_to_all): every example splits x into
    n chunks along `split_axis` and sends chunk k to example k, which concatenates what it gets, in example order,
    along `concat_axis`.

    Args:
      x: an array or a pytree of them.
      axis_name: a named axis of size n.
      split_axis: the axis split into n chunks. Untiled, its size must be n and it is removed; tiled, its size
        must be divisible by n and it shrinks n-fold.
      concat_axis: untiled, the position in the result of the new axis of size n (indexed by the sending
        example); tiled, the axis that grows n-fold.
      axis_index_groups: not supported (None).
      tiled: keep the rank (see split_axis and concat_axis).

    Returns:
      The chunks this example received from every example.

    Example:
      >>> fnx.vmap(lambda x: lax.all_to_all(x, "i", 0, 0), axis_name="i")(np.arange(4.0).reshape(2, 2))
      Array([[0., 2.],
             [1., 3.]], dtype=float32)
    """
    _no_groups(axis_index_groups, "all_to_all")
    name = _one_axis_name(axis_name, "all_to_all")
    size = _axis_size(name, "all_to_all")

    def exchange(leaf):
        a = to_array(leaf)
        split = normalize_axes(split_axis, a.ndim, "all_to_all")[0]
        concat = normalize_axes(concat_axis, a.ndim, "all_to_all")[0]
        _check_chunks("all_to_all", "split_axis", a, split, name, size, tiled)
        if not tiled and split != concat:  # as JAX: a new axis at concat_axis, the tiled exchange, split_axis dropped
            if split < concat: concat += 1  # (concat_axis counts the result's axes, split_axis already removed)
            else: split += 1
            a = reshape(a, a.shape[:concat] + (1,) + a.shape[concat:])
        out = _collective("all_to_all", a, name, concat, split_axis=split)
        return out if tiled or split == concat else reshape(out, out.shape[:split] + out.shape[split + 1:])
    return tree_util.tree_map(exchange, x)


def axis_size(axis_name: Any) -> int:
    """The size of the named axis, or the product of the sizes of a tuple of names, as a Python int
    (jax.lax.axis_size).

    Example:
      >>> fnx.vmap(lambda x: x / lax.axis_size("i"), axis_name="i")(np.ones(4))   # [0.25 0.25 0.25 0.25]
    """
    return _total_size(axis_name, "axis_size")


@eager_op
def axis_index(axis_name: Any) -> Array:
    """This example's index along the named axis (with a tuple of names: the row-major index over all of them)."""
    index = None
    for name in _axis_names(axis_name):
        size = _axis_size(name, "axis_index")
        own = Array(UOp(Ops.COLLECTIVE, dtypes.int32, (), CollectiveArg("axis_index", name, size, 0)))
        index = own if index is None else add(mul(index, full((), size, dtypes.int32)), own)
    return index


def with_sharding_constraint(x: Any, shardings: Any) -> Any:
    """x (a pytree of arrays) laid out by `shardings` (a NamedSharding, or a PartitionSpec inside `with mesh:`, or a
    pytree prefix of them): under jit the partitioner reshards there; outside, the arrays are put so."""
    from fnx.devices import device_put  # (devices sits above lax: it builds on the trace this module extends)
    spec_leaves, spec_tree = tree_util.tree_flatten(shardings, is_leaf=lambda s: hasattr(s, "mesh") or
                                                    isinstance(s, tuple) and type(s).__name__ == "PartitionSpec")
    subtrees = spec_tree.flatten_up_to(x)
    return spec_tree.unflatten(device_put(sub, s) for s, sub in zip(spec_leaves, subtrees))


def _extend(names: dict[str, Any]) -> None:
    """Add a themed module's names to fnx.lax: fnx/lax_ops.py (the rest of jax.lax's ops), lax_conv.py
    (convolutions), lax_sort.py (sorting). They build on this module; fnx/__init__.py imports them after it and
    each calls this at its end (importing them from here would close an import cycle)."""
    globals().update(names)


def __getattr__(name: str):
    from fnx.jax_names import missing
    raise missing("fnx.lax", name)
