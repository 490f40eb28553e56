"""The rest of jax.lax, composed from fnx.lax's primitives and fnx.numpy: fnx.lax re-exports every name in `__all__`.

Elementwise ops by their lax names follow JAX's strict dtype rule: operands must share one dtype
(`lax.add(int32, float32)` is a TypeError naming both); Python scalars and other weakly typed values are accepted
where they fit the other operands' dtype (`lax.add(float16_array, 2.0)`), as jax.numpy's weak types adapt. Shapes
must be equal, 0-d operands broadcast. This module also redefines fnx.lax's own binary primitives (add, sub, mul,
div, rem, max, lt, ne, shift_left, bitwise_and/or/xor, select) with that check, reshape with `dimensions=` and
slice_in_dim with JAX's argument names.

Beside them: special functions (erf, erfc, erf_inv, lgamma, digamma, each computed in float64 and rounded to the
operand's dtype), bit ops (population_count, clz, the three shifts), reduce_precision and nextafter by bit
manipulation, the structural functions (squeeze, expand_dims, broadcast, collapse, dynamic slices as gathers and
masked selects, so that indices may be traced), scans (associative_scan as a log-step scan; cummax, cummin,
cumlogsumexp on it; map over scan, with batch_size= over vmap), reduce with a recognised monoid, and reduce_window
as a fold over strided slices. Everything is a composition, so jit, vmap and grad follow.

    >>> from fnx import lax
    >>> lax.cummax(np.array([1.0, 3.0, 2.0, 5.0]))
    Array([1., 3., 3., 5.], dtype=float32)
"""
from __future__ import annotations

import builtins
import enum
import functools
import math
import operator
from typing import Any, Callable, Sequence

import numpy as np

from fnx import dtypes, tree_util
from fnx import lax as _lax
from fnx.control_flow import scan
from fnx.errors import ShapeError, UnsupportedError, at_user_line
from fnx.trace import (Array, cast, complex_ufunc, conjugate, eager_op, imag_part, make_complex, normalize_axes,
                       promote, real_part, shape_str, to_array, with_weak)
from fnx.transforms.custom import custom_jvp

__all__ = [
    "complex", "real", "imag", "conj",
    "DotDimensionNumbers", "GatherScatterMode", "Precision", "PrecisionLike", "RoundingMethod", "abs", "acos",
    "acosh", "add", "asin", "asinh", "associative_scan", "atan", "atan2", "atanh", "batch_matmul", "bitwise_and",
    "bitwise_not", "bitwise_or", "bitwise_xor", "broadcast", "broadcast_shapes", "broadcast_to_rank", "cbrt",
    "ceil", "clamp", "clz", "collapse", "cos", "cosh", "cumlogsumexp", "cummax", "cummin", "digamma", "div", "dot",
    "dynamic_index_in_dim", "dynamic_slice", "dynamic_slice_in_dim", "dynamic_update_index_in_dim",
    "dynamic_update_slice", "dynamic_update_slice_in_dim", "eq", "erf", "erf_inv", "erfc", "exp", "expand_dims",
    "expm1", "floor", "full_like", "ge", "gt", "index_in_dim", "index_take", "is_finite", "le", "lgamma", "log",
    "log1p", "logistic", "lt", "map", "max", "min", "mul", "mulhi", "ne", "nextafter", "population_count", "pow",
    "reciprocal", "reduce", "reduce_and", "reduce_min", "reduce_or", "reduce_precision", "reduce_window",
    "reduce_window_shape_tuple", "reduce_xor", "rem", "reshape", "round", "rsqrt", "select", "select_n",
    "shift_left", "shift_right_arithmetic", "shift_right_logical", "sign", "sinh", "slice_in_dim", "split",
    "square", "squeeze", "sub", "tan", "tanh", "tile", "stack", "unstack", "empty", "dtype", "broadcast_like",
]

# fnx.lax's own primitives, before this module's strict versions replace them in fnx.lax's namespace (_extend)
_add, _mul, _div, _rem, _max, _lt, _ne = _lax.add, _lax.mul, _lax.div, _lax.rem, _lax.max, _lax.lt, _lax.ne
_sub, _select, _shift_left, _shift_right = _lax.sub, _lax.select, _lax.shift_left, _lax.shift_right
_and, _or, _xor = _lax.bitwise_and, _lax.bitwise_or, _lax.bitwise_xor
_reshape, _full, _convert, _bitcast = _lax.reshape, _lax.full, _lax.convert_element_type, _lax.bitcast_convert_type


def _jnp():
    """fnx.numpy, imported when first needed: it sits above fnx.lax, which imports this module."""
    import fnx.numpy
    return fnx.numpy


# ---- operands: JAX's strict dtype rule ----

_FLOATS = "floating"
_NUMERIC = "integer, floating"


def _check_dtype(name: str, a: Array, ok: bool, accepted: str) -> None:
    if not ok:
        raise TypeError(at_user_line(f"{name} does not accept dtype {a.uop.dtype} (shape {list(a.shape)}). "
                                     f"Accepted dtypes are subtypes of {accepted}."))


def _operands(name: str, *xs: Any) -> tuple[list[Array], bool]:
    """The operands of lax op `name` with one dtype and one shape, and whether the result is weakly typed.

    Strongly typed operands must share their dtype exactly (TypeError naming every operand's dtype otherwise);
    weakly typed ones (Python scalars) take that dtype when it can hold them, as jnp's weak types do. Shapes must be
    equal except for 0-d operands, which broadcast."""
    arrays = [to_array(x) for x in xs]
    strong = {a.uop.dtype for a in arrays if not a.weak_type}
    target = next(iter(strong)) if len(strong) == 1 else None
    fits = target is not None and all(dtypes.result_type((target, False), (a.uop.dtype, True))[0] == target
                                      for a in arrays if a.weak_type)
    if len(strong) > 1 or (strong and not fits):
        got = ", ".join(str(a.uop.dtype) for a in arrays)
        raise TypeError(at_user_line(f"lax.{name} requires arguments to have the same dtypes, got {got} "
                                     f"(jax.numpy-style functions in fnx.numpy promote)"))
    if target is not None:
        arrays, weak = [cast(a, target) for a in arrays], False
    else:
        arrays, weak = promote(arrays)
    shapes = {a.shape for a in arrays if a.ndim}
    if len(shapes) > 1:
        raise ShapeError(at_user_line(f"lax.{name}: operands must have equal shapes (0-d ones broadcast), "
                                      f"got {shape_str(*arrays)}"))
    shape = shapes.pop() if shapes else ()
    return [a if a.shape == shape else _lax._broadcast_scalar(a, shape) for a in arrays], weak


# lax names whose complex forms are fnx.numpy's of another name (trace.COMPLEX_UFUNCS is keyed by those)
_NP_NAMES = {"sub": "subtract", "mul": "multiply", "div": "divide", "eq": "equal", "ne": "not_equal", "neg": "negative",
             "is_finite": "isfinite", "asin": "arcsin", "acos": "arccos", "atan": "arctan", "asinh": "arcsinh",
             "acosh": "arccosh", "atanh": "arctanh"}


def _binary(name: str, compute: Callable, accepted: str | None, doc: str):
    """A strict binary lax op: `compute` on two operands of one dtype and shape; `accepted` limits the dtypes."""
    def fn(x, y):
        (a, b), weak = _operands(name, x, y)
        if a.uop.dtype.is_complex: out = complex_ufunc(_NP_NAMES.get(name, name))(a, b)
        else:
            if accepted is not None: _check_dtype(name, a, _accepts(a.uop.dtype, accepted), accepted)
            out = compute(a, b)
        return with_weak(out, weak and out.uop.dtype == a.uop.dtype)
    return _lax._export(fn, name, doc)


def _accepts(dtype: dtypes.DType, accepted: str) -> bool:
    kinds = {"floating": dtype.is_float, "integer": dtype.is_int, "bool": dtype.is_bool,
             "signedinteger": dtype.is_int and not dtype.is_unsigned}
    return builtins.any(kinds[k] for k in accepted.split(", "))


def _unary(name: str, compute: Callable, accepted: str, doc: str, wide: bool = False):
    """A unary lax op: `compute` on an operand of an accepted dtype; `wide`: 16-bit floats compute in float32."""
    def fn(x):
        a = to_array(x)
        if a.uop.dtype.is_complex:  # (computed on the parts: fnx/numpy_complex.py)
            return with_weak(complex_ufunc(_NP_NAMES.get(name, name))(a), a.weak_type)
        _check_dtype(name, a, _accepts(a.uop.dtype, accepted), accepted)
        work = _convert(a, dtypes.float32) if wide and a.uop.dtype.is_float and a.uop.dtype.itemsize < 4 else a
        out = compute(work)
        if out.uop.dtype != a.uop.dtype and not out.uop.dtype.is_bool: out = _convert(out, a.uop.dtype)
        return with_weak(out, a.weak_type and not out.uop.dtype.is_bool)
    return _lax._export(fn, name, doc)


@eager_op
def complex(x, y) -> Array:  # noqa: A001
    """x + i y from two floats of one dtype (float32 -> complex64, float64 -> complex128)."""
    (a, b), weak = _operands("complex", x, y)
    _check_dtype("complex", a, a.uop.dtype.is_float and a.uop.dtype.itemsize >= 4, "float32, float64")
    return with_weak(make_complex(a, b), weak)


@eager_op
def real(x) -> Array:
    """The real part of a complex array."""
    a = to_array(x)
    _check_dtype("real", a, a.uop.dtype.is_complex, "complexfloating")
    return real_part(a)


@eager_op
def imag(x) -> Array:
    """The imaginary part of a complex array."""
    a = to_array(x)
    _check_dtype("imag", a, a.uop.dtype.is_complex, "complexfloating")
    return imag_part(a)


@eager_op
def conj(x) -> Array:
    """The complex conjugate (a real array becomes complex, as in JAX)."""
    a = to_array(x)
    return conjugate(a if a.uop.dtype.is_complex else cast(a, dtypes.complex_of(a.uop.dtype)))


def _full_like(a: Array, value: Any, dtype: dtypes.DType | None = None) -> Array:
    return _full(a.shape, value, dtype or a.uop.dtype)


# ---- binary elementwise ops ----

add = _binary("add", _add, _NUMERIC, "x + y elementwise; operands of one dtype (Python scalars adapt).")
sub = _binary("sub", _sub, _NUMERIC, "x - y elementwise; operands of one dtype.")
mul = _binary("mul", _mul, _NUMERIC, "x * y elementwise; operands of one dtype.")
div = _binary("div", _div, _NUMERIC, "x / y: true division for floats, rounding toward zero for integers.")
rem = _binary("rem", _rem, _NUMERIC, "Remainder of x / y with the sign of x (C's fmod).")
max = _binary("max", _max, None, "Elementwise maximum (NaN propagates).")  # noqa: A001
min = _binary("min", lambda a, b: _jnp().minimum(a, b), None, "Elementwise minimum (NaN propagates).")  # noqa: A001
atan2 = _binary("atan2", lambda a, b: _jnp().arctan2(a, b), _FLOATS, "Elementwise arctan(x / y) in (-pi, pi].")
eq = _binary("eq", lambda a, b: _jnp().equal(a, b), None, "x == y elementwise (bool).")
ne = _binary("ne", _ne, None, "x != y elementwise (bool).")
lt = _binary("lt", _lt, None, "x < y elementwise (bool).")
le = _binary("le", lambda a, b: _jnp().less_equal(a, b), None, "x <= y elementwise (bool).")
gt = _binary("gt", lambda a, b: _lt(b, a), None, "x > y elementwise (bool).")
ge = _binary("ge", lambda a, b: _jnp().less_equal(b, a), None, "x >= y elementwise (bool).")
bitwise_and = _binary("bitwise_and", _and, "integer, bool", "Elementwise x & y of integer or bool arrays.")
bitwise_or = _binary("bitwise_or", _or, "integer, bool", "Elementwise x | y of integer or bool arrays.")
bitwise_xor = _binary("bitwise_xor", _xor, "integer, bool", "Elementwise x ^ y of integer or bool arrays.")


def _unsigned(dtype: dtypes.DType) -> dtypes.DType:
    return {1: dtypes.uint8, 2: dtypes.uint16, 4: dtypes.uint32, 8: dtypes.uint64}[dtype.itemsize]


def _signed(dtype: dtypes.DType) -> dtypes.DType:
    return {1: dtypes.int8, 2: dtypes.int16, 4: dtypes.int32, 8: dtypes.int64}[dtype.itemsize]


def _shift(a: Array, b: Array, shift: Callable, out_of_range: Callable) -> Array:
    """`shift(a, b)` where 0 <= b < bits, else `out_of_range(a)` (XLA's defined results for large or negative b)."""
    bits = a.uop.dtype.bits
    valid = _lt(b, _full_like(b, bits)) if b.uop.dtype.is_unsigned else \
        _and(_lt(b, _full_like(b, bits)), _lt(_full_like(b, -1), b))
    safe = _select(valid, b, _full_like(b, 0))
    return _select(valid, shift(a, safe), out_of_range(a))


def _as(dtype: dtypes.DType, fn: Callable) -> Callable:
    """`fn` run on its operands' bits viewed as `dtype`, the result viewed back."""
    def run(a: Array, b: Array) -> Array:
        if a.uop.dtype == dtype: return fn(a, b)
        return _bitcast(fn(_bitcast(a, dtype), _bitcast(b, dtype)), a.uop.dtype)
    return run


shift_left = _binary("shift_left", lambda a, b: _shift(a, b, _shift_left, lambda x: _full_like(x, 0)), "integer",
                     "x << y elementwise; shifts of y >= bits (or y < 0) give 0.")
shift_right_logical = _binary(
    "shift_right_logical",
    lambda a, b: _as(_unsigned(a.uop.dtype), lambda x, y: _shift(x, y, _shift_right, lambda v: _full_like(v, 0)))(a, b),
    "integer", "x >> y elementwise, filling with zeros; shifts of y >= bits (or y < 0) give 0.")


def _arithmetic_shift(a: Array, b: Array) -> Array:
    top = a.uop.dtype.bits - 1
    return _shift(a, b, _shift_right, lambda x: _shift_right(x, _full_like(x, top)))


shift_right_arithmetic = _binary(
    "shift_right_arithmetic", lambda a, b: _as(_signed(a.uop.dtype), _arithmetic_shift)(a, b), "integer",
    "x >> y elementwise, filling with the sign bit; shifts of y >= bits (or y < 0) give 0 or -1.")


@eager_op
def pow(x, y) -> Array:  # noqa: A001
    """x ** y for a floating-point x; y has x's dtype or is an integer array (jax.lax.pow)."""
    a, b = to_array(x), to_array(y)
    _check_dtype("pow", a, a.uop.dtype.is_float, _FLOATS)
    if b.uop.dtype.is_int and not b.weak_type:
        (a,), _ = _operands("pow", a)
        if b.shape != a.shape and a.ndim and b.ndim:
            raise ShapeError(at_user_line(f"lax.pow: operands must have equal shapes, got {shape_str(a, b)}"))
        weak = False
    else:
        (a, b), weak = _operands("pow", a, b)
    out = _jnp().power(a, b)
    return with_weak(_convert(out, a.uop.dtype), weak)


@eager_op
def nextafter(x1, x2) -> Array:
    """The next representable value after x1 in the direction of x2, elementwise (floats)."""
    (a, b), weak = _operands("nextafter", x1, x2)
    _check_dtype("nextafter", a, a.uop.dtype.is_float, _FLOATS)
    itype = _signed(a.uop.dtype)
    bits = _bitcast(a, itype)
    step = _select(_xor(_lt(a, b), _lt(_full_like(a, 0), a)), _full_like(bits, -1), _full_like(bits, 1))
    moved = _bitcast(_add(bits, step), a.uop.dtype)
    # from zero: the smallest subnormal with y's sign
    sign_bit = _and(_bitcast(b, itype), _full_like(bits, -(1 << (a.uop.dtype.bits - 1))))
    tiny = _bitcast(_or(sign_bit, _full_like(bits, 1)), a.uop.dtype)
    out = _select(eq(a, _full_like(a, 0)), tiny, moved)
    out = _select(eq(a, b), b, out)
    return with_weak(_select(_or(_ne(a, a), _ne(b, b)), _add(a, b), out), weak)


@eager_op
def select(pred, on_true, on_false) -> Array:
    """Elementwise `on_true if pred else on_false`; `pred` is bool (0-d or the cases' shape), the cases share a
    dtype (jax.lax.select)."""
    p = to_array(pred)
    _check_dtype("select", p, p.uop.dtype.is_bool, "bool")
    (a, b), weak = _operands("select", on_true, on_false)
    if p.ndim and p.shape != a.shape:
        raise ShapeError(at_user_line(f"lax.select: the predicate must be 0-d or have the cases' shape, "
                                      f"got {shape_str(p, a, b)}"))
    return with_weak(_select(_lax._broadcast_scalar(p, a.shape) if p.shape != a.shape else p, a, b), weak)


@eager_op
def select_n(which, *cases) -> Array:
    """cases[which] elementwise: `which` is bool (two cases) or an int32 array, 0-d or of the cases' shape."""
    if not cases: raise ValueError(at_user_line("lax.select_n: needs at least one case"))
    w = to_array(which)
    _check_dtype("select_n", w, w.uop.dtype.is_bool or w.uop.dtype.is_int, "bool, integer")
    if w.uop.dtype.is_bool and len(cases) > 2:
        raise TypeError(at_user_line(f"lax.select_n: a bool `which` selects between at most 2 cases, got {len(cases)}"))
    arrays, weak = _operands("select_n", *cases)
    if w.ndim and w.shape != arrays[0].shape:
        raise ShapeError(at_user_line(f"lax.select_n: `which` must be 0-d or have the cases' shape, "
                                      f"got {shape_str(w, *arrays)}"))
    w = _lax._broadcast_scalar(w, arrays[0].shape) if w.shape != arrays[0].shape else w
    if w.uop.dtype.is_bool: return with_weak(arrays[0] if len(arrays) == 1 else _select(w, arrays[1], arrays[0]), weak)
    out = arrays[-1]
    for i in reversed(range(len(arrays) - 1)):
        out = _select(_lt(w, _full_like(w, i + 1)), arrays[i], out)
    return with_weak(out, weak)


@eager_op
def clamp(min, x, max) -> Array:  # noqa: A002
    """x clipped to [min, max] elementwise; min and max are 0-d or of x's shape, all of one dtype."""
    (lo, a, hi), weak = _operands("clamp", min, x, max)
    return with_weak(_jnp().minimum(_max(a, lo), hi), weak)


# ---- unary elementwise ops ----

def _np_unary(name: str, np_name: str, accepted: str = _FLOATS, wide: bool = False):
    return _unary(name, lambda a: getattr(_jnp(), np_name)(a), accepted,
                  f"Elementwise {np_name} (jax.lax.{name}).", wide)


exp = _np_unary("exp", "exp")
expm1 = _np_unary("expm1", "expm1")
log = _np_unary("log", "log")
log1p = _np_unary("log1p", "log1p")
tanh = _np_unary("tanh", "tanh")
cos = _np_unary("cos", "cos")
tan = _np_unary("tan", "tan")
asin = _np_unary("asin", "arcsin")
acos = _np_unary("acos", "arccos")
atan = _np_unary("atan", "arctan")
sinh = _np_unary("sinh", "sinh")
cosh = _np_unary("cosh", "cosh")
rsqrt = _np_unary("rsqrt", "rsqrt")
floor = _np_unary("floor", "floor")
ceil = _np_unary("ceil", "ceil")
is_finite = _np_unary("is_finite", "isfinite")
abs = _np_unary("abs", "abs", "floating, signedinteger")  # noqa: A001
sign = _np_unary("sign", "sign", _NUMERIC)
square = _unary("square", lambda a: _mul(a, a), _NUMERIC, "x * x elementwise.")
reciprocal = _unary("reciprocal", lambda a: _lax.recip(a), _FLOATS, "1 / x elementwise.")
def _sigmoid(a: Array) -> Array:
    from fnx import nn  # (nn sits above lax)
    return nn.sigmoid(a)


logistic = _unary("logistic", _sigmoid, _FLOATS, "The logistic sigmoid 1 / (1 + exp(-x)) elementwise.")
bitwise_not = _unary("bitwise_not", lambda a: _xor(a, _full_like(a, True if a.uop.dtype.is_bool else -1)),
                     "integer, bool", "~x elementwise for integer or bool arrays.")


def _two_branches(cond: Array, x: Array, safe_true: float, safe_false: float, on_true: Callable,
                  on_false: Callable) -> Array:
    """where(cond, on_true(x), on_false(x)), each branch fed only inputs it is meant for (the others replaced by a
    harmless value), so no inf or NaN from the branch not taken reaches the gradient."""
    jnp = _jnp()
    return jnp.where(cond, on_true(jnp.where(cond, x, safe_true)), on_false(jnp.where(cond, safe_false, x)))


def _large(a: Array) -> float:
    """|x| past which asinh/acosh(x) is log(2|x|) to the dtype's precision."""
    return 2.0 ** (np.finfo(a.uop.dtype.np).nmant // 2 + 2)


def _asinh(a: Array) -> Array:
    jnp = _jnp()
    m = jnp.abs(a)
    out = _two_branches(m > _large(a), m, 2.0, 0.0, lambda v: jnp.log(v) + math.log(2),
                        lambda v: jnp.log1p(v + v * v / (1 + jnp.sqrt(1 + v * v))))
    return jnp.where(a < 0, -out, out)


def _acosh(a: Array) -> Array:
    jnp = _jnp()
    return _two_branches(a > _large(a), a, 2.0, 1.0, lambda v: jnp.log(v) + math.log(2),
                         lambda v: jnp.log1p((v - 1) + jnp.sqrt((v - 1) * (v + 1))))


def _atanh(a: Array) -> Array:
    jnp = _jnp()
    m = jnp.abs(a)
    out = 0.5 * jnp.log1p(2 * m / (1 - m))
    return jnp.where(a < 0, -out, out)


def _cbrt(a: Array) -> Array:
    """sign(x) 2^(log2|x| / 3), refined by one Newton step (which also makes the derivative exact)."""
    jnp = _jnp()
    m = jnp.abs(a)
    special = (m == 0) | jnp.isinf(m) | jnp.isnan(m)
    out = _two_branches(special, m, 1.0, 1.0, lambda v: v,
                        lambda v: (lambda y: y - (y - v / (y * y)) / 3)(jnp.exp2(jnp.log2(v) / 3)))
    return jnp.where(a < 0, -out, out)


asinh = _unary("asinh", _asinh, _FLOATS, "Inverse hyperbolic sine elementwise.", wide=True)
acosh = _unary("acosh", _acosh, _FLOATS, "Inverse hyperbolic cosine elementwise (NaN below 1).", wide=True)
atanh = _unary("atanh", _atanh, _FLOATS, "Inverse hyperbolic tangent elementwise (NaN outside [-1, 1]).", wide=True)
cbrt = _unary("cbrt", _cbrt, _FLOATS, "Cube root elementwise (negative for negative x).", wide=True)


class RoundingMethod(enum.IntEnum):
    """lax.round's tie rule: AWAY_FROM_ZERO (the default, like C's round) or TO_NEAREST_EVEN (like numpy's)."""
    AWAY_FROM_ZERO = 0
    TO_NEAREST_EVEN = 1


@eager_op
def round(x, rounding_method: RoundingMethod | int = RoundingMethod.AWAY_FROM_ZERO) -> Array:  # noqa: A001
    """x rounded to the nearest integer elementwise, ties per `rounding_method` (floats only).

    Example:
      >>> lax.round(np.float32([0.5, 1.5, -2.5]))   # [1., 2., -3.]
    """
    method = RoundingMethod(int(rounding_method))
    a = to_array(x)
    _check_dtype("round", a, a.uop.dtype.is_float, _FLOATS)
    jnp = _jnp()
    if method is RoundingMethod.TO_NEAREST_EVEN: return with_weak(jnp.round(a), a.weak_type)
    t = _lax.trunc(a)
    away = jnp.abs(a - t) >= 0.5  # exact: a - t is representable for every float
    return with_weak(jnp.where(away, t + jnp.sign(a), t), a.weak_type)


# ---- special functions, in float64 and rounded to the operand's dtype ----

_SQRT_PI = math.sqrt(math.pi)
_LANCZOS_G = 7.0
_LANCZOS = (0.99999999999980993, 676.5203681218851, -1259.1392167224028, 771.32342877765313, -176.61502916214059,
            12.507343278686905, -0.13857109526572012, 9.9843695780195716e-6, 1.5056327351493116e-7)
# erf_inv's first guess: M. Giles, "Approximating the erfinv function" (2010), single-precision version
_GILES_CENTRAL = (2.81022636e-08, 3.43273939e-07, -3.5233877e-06, -4.39150654e-06, 0.00021858087, -0.00125372503,
                  -0.00417768164, 0.246640727, 1.50140941)
_GILES_TAIL = (-0.000200214257, 0.000100950558, 0.00134934322, -0.00367342844, 0.00573950773, -0.0076224613,
               0.00943887047, 1.00167406, 2.83297682)


def _horner(coeffs: Sequence[float], z: Array) -> Array:
    acc = _jnp().full_like(z, coeffs[0])
    for c in coeffs[1:]: acc = acc * z + c
    return acc


def _wide(a: Array) -> Array:
    return _convert(a, dtypes.float64)


def _erf64(w: Array) -> Array:
    """erf of a float64 array: Taylor series near 0 (keeps the relative precision), 1 - erfc beyond."""
    from fnx import nn  # (nn's erfc; nn sits above lax)
    jnp = _jnp()
    near = jnp.abs(w) < 0.5
    small = jnp.where(near, w, 0.0)
    series = small * _horner(nn._erf_taylor(16), small * small)
    return jnp.where(near, series, 1 - nn._erfc_wide(jnp.where(near, 1.0, w)))


def _erfc64(w: Array) -> Array:
    from fnx import nn
    return nn._erfc_wide(w)


def _erf_inv64(w: Array, steps: int = 2) -> Array:
    """Giles' single-precision erfinv, then Newton steps on erf (on erfc in the tails, where 1 - |x| is exact)."""
    jnp = _jnp()
    m = jnp.abs(w)
    inside = m < 1
    mi = jnp.where(inside, m, 0.5)
    t = -jnp.log((1 - mi) * (1 + mi))
    central = _horner(_GILES_CENTRAL, jnp.where(t < 5, t, 2.5) - 2.5)
    tail = _horner(_GILES_TAIL, jnp.sqrt(jnp.where(t < 5, 5.0, t)) - 3)
    y = jnp.where(t < 5, central, tail) * mi
    for _ in range(steps):
        residual = jnp.where(mi < 0.5, _erf64(y) - mi, (1 - mi) - _erfc64(y))
        y = y - residual * _SQRT_PI / 2 * jnp.exp(y * y)
    y = jnp.where(inside, y, jnp.where(m == 1, np.inf, np.nan))
    return jnp.where(w < 0, -y, y)


def _lgamma64(w: Array) -> Array:
    """log|Gamma(x)|: Lanczos (g = 7) for x >= 0.5, the reflection formula below (inf at the poles)."""
    jnp = _jnp()
    reflect = w < 0.5
    z = jnp.where(reflect, 1 - w, w) - 1
    series = jnp.full_like(z, _LANCZOS[0])
    for i, c in enumerate(_LANCZOS[1:], start=1): series = series + c / (z + i)
    t = z + _LANCZOS_G + 0.5
    direct = 0.5 * math.log(2 * math.pi) + (z + 0.5) * jnp.log(t) - t + jnp.log(series)
    frac = w - jnp.round(w)  # sin(pi x) from the distance to the nearest integer: exact for large |x|
    sin_pi = jnp.abs(jnp.sin(math.pi * jnp.where(reflect, frac, 0.5)))
    out = jnp.where(reflect, math.log(math.pi) - jnp.log(sin_pi) - direct, direct)
    return jnp.where(jnp.isinf(w), np.inf, out)


def _digamma64(w: Array) -> Array:
    """psi(x): the reflection formula below 0.5, six upward recurrence steps, then the asymptotic series."""
    jnp = _jnp()
    reflect = w < 0.5
    y = jnp.where(reflect, 1 - w, w)
    acc = jnp.zeros_like(y)
    for _ in range(6):
        acc = acc - 1 / y
        y = y + 1
    inv2 = 1 / (y * y)
    tail = _horner((1 / 12, -691 / 32760, 1 / 132, -1 / 240, 1 / 252, -1 / 120, 1 / 12), inv2) * inv2
    direct = acc + jnp.log(y) - 0.5 / y - tail
    frac = w - jnp.round(w)
    tan_pi = jnp.tan(math.pi * jnp.where(reflect, frac, 0.25))
    out = jnp.where(reflect, direct - math.pi / tan_pi, direct)
    pole = (w <= 0) & (frac == 0)
    return jnp.where(pole, np.nan, jnp.where(w == np.inf, np.inf, out))


@functools.cache
def _special(name: str) -> Callable:
    """The special function `name` on a float array (in float64), with JAX's derivative where the composition's own
    would be inexact (erf, erfc, erf_inv); lgamma and digamma differentiate their formulas."""
    from fnx.transforms.custom import custom_jvp, pure  # (transforms sit above lax)
    jnp = _jnp()
    value = {"erf": _erf64, "erfc": _erfc64, "erf_inv": _erf_inv64, "lgamma": _lgamma64, "digamma": _digamma64}[name]

    def run(a: Array) -> Array:
        if name == "erf_inv" and a.uop.dtype.itemsize < 8:  # one Newton step takes Giles' guess past float32
            return _convert(_erf_inv64(_wide(a), steps=1), a.uop.dtype)
        return _convert(value(_wide(a)), a.uop.dtype)
    slope = {"erf": lambda x, y: 2 / _SQRT_PI * jnp.exp(-x * x), "erfc": lambda x, y: -2 / _SQRT_PI * jnp.exp(-x * x),
             "erf_inv": lambda x, y: _SQRT_PI / 2 * jnp.exp(y * y)}.get(name)
    if slope is None: return run
    wrapped = pure(custom_jvp(run))

    @wrapped.defjvp
    def jvp(primals, tangents):
        (x,), (t,) = primals, tangents
        y = wrapped(x)
        return y, t * slope(x, y).astype(t.dtype)
    return wrapped


erf = _unary("erf", lambda a: _special("erf")(a), _FLOATS, "The error function elementwise.")
erfc = _unary("erfc", lambda a: _special("erfc")(a), _FLOATS, "The complementary error function 1 - erf(x).")
erf_inv = _unary("erf_inv", lambda a: _special("erf_inv")(a), _FLOATS,
                 "The inverse error function elementwise (+-inf at +-1, NaN outside [-1, 1]).")
lgamma = _unary("lgamma", lambda a: _special("lgamma")(a), _FLOATS, "log|Gamma(x)| elementwise (inf at the poles).")
digamma = _unary("digamma", lambda a: _special("digamma")(a), _FLOATS,
                 "The digamma function Gamma'(x) / Gamma(x) elementwise (NaN at the poles).")


# ---- bit manipulation ----

def _popcount(a: Array) -> Array:
    """Set bits per element (SWAR: pairs, nibbles, bytes, then the bytes summed by shifts), in a's dtype."""
    u = _bitcast(a, _unsigned(a.uop.dtype)) if not a.uop.dtype.is_unsigned else a
    bits = u.uop.dtype.bits
    mask = lambda pattern: _full_like(u, int.from_bytes(bytes([pattern]) * (bits // 8), "little"))  # noqa: E731
    shr = lambda v, n: _shift_right(v, _full_like(v, n))  # noqa: E731
    v = _sub(u, _and(shr(u, 1), mask(0x55)))
    v = _add(_and(v, mask(0x33)), _and(shr(v, 2), mask(0x33)))
    v = _and(_add(v, shr(v, 4)), mask(0x0F))
    shift = 8
    while shift < bits:
        v = _add(v, shr(v, shift))
        shift *= 2
    v = _and(v, _full_like(v, 0xFF))
    return v if v.uop.dtype == a.uop.dtype else _bitcast(v, a.uop.dtype)


def _clz(a: Array) -> Array:
    """Leading zero bits: smear the highest set bit rightwards, then count the ones that are not leading zeros."""
    u = _bitcast(a, _unsigned(a.uop.dtype)) if not a.uop.dtype.is_unsigned else a
    bits, shift = u.uop.dtype.bits, 1
    while shift < bits:
        u = _or(u, _shift_right(u, _full_like(u, shift)))
        shift *= 2
    count = _sub(_full_like(u, bits), _popcount(u))
    return count if count.uop.dtype == a.uop.dtype else _bitcast(count, a.uop.dtype)


population_count = _unary("population_count", _popcount, "integer", "The number of set bits of each element.")
clz = _unary("clz", _clz, "integer", "The number of leading zero bits of each element.")


@eager_op
def reduce_precision(operand, exponent_bits: int, mantissa_bits: int) -> Array:
    """x rounded (to nearest, ties to even) to a float with `exponent_bits` and `mantissa_bits`, kept in x's dtype:
    values beyond its range become +-inf, values below its smallest normal +-0 (XLA's reduce-precision).

    Example:
      >>> lax.reduce_precision(np.float32([1.1]), 5, 10)   # float16's precision: [1.0996094]
    """
    a = to_array(operand)
    _check_dtype("reduce_precision", a, a.uop.dtype.is_float, _FLOATS)
    exponent_bits, mantissa_bits = operator.index(exponent_bits), operator.index(mantissa_bits)
    if exponent_bits < 1 or mantissa_bits < 0:
        raise ValueError(at_user_line(f"reduce_precision: need exponent_bits >= 1 and mantissa_bits >= 0, got "
                                      f"{exponent_bits} and {mantissa_bits}"))
    info = np.finfo(a.uop.dtype.np)
    src_mantissa, src_exponent = int(info.nmant), a.uop.dtype.bits - 1 - int(info.nmant)
    utype = _unsigned(a.uop.dtype)
    bits = _bitcast(a, utype)
    const = lambda v: _full_like(bits, v)  # noqa: E731
    if mantissa_bits < src_mantissa:
        drop = src_mantissa - mantissa_bits
        last_kept = _and(_shift_right(bits, const(drop)), const(1))
        bits = _add(bits, _add(const((1 << (drop - 1)) - 1), last_kept))
        bits = _and(bits, const(((1 << a.uop.dtype.bits) - 1) ^ ((1 << drop) - 1)))
    if exponent_bits < src_exponent:
        src_bias, new_bias = (1 << (src_exponent - 1)) - 1, (1 << (exponent_bits - 1)) - 1
        exponent = _and(bits, const(((1 << src_exponent) - 1) << src_mantissa))
        sign = _and(bits, const(1 << (a.uop.dtype.bits - 1)))
        overflow = _lt(const((src_bias + new_bias) << src_mantissa), exponent)
        underflow = _lt(exponent, const((src_bias - new_bias + 1) << src_mantissa))
        inf_bits = _or(sign, const(((1 << src_exponent) - 1) << src_mantissa))
        bits = _select(overflow, inf_bits, _select(underflow, sign, bits))
    out = _bitcast(bits, a.uop.dtype)
    return with_weak(_select(_ne(a, a), a, out), a.weak_type)


# ---- shapes ----

@eager_op
def reshape(operand, new_sizes: Sequence[int], dimensions: Sequence[int] | None = None) -> Array:
    """`operand` reshaped to `new_sizes`, after transposing it by `dimensions` when given (jax.lax.reshape)."""
    a = to_array(operand)
    if dimensions is not None and tuple(dimensions) != tuple(range(a.ndim)):
        a = _lax.transpose(a, dimensions)
    return _reshape(a, new_sizes)


@eager_op
def squeeze(array, dimensions: Sequence[int]) -> Array:
    """`array` without the size-1 axes `dimensions` (ValueError for an axis whose size is not 1)."""
    a = to_array(array)
    axes = normalize_axes(dimensions, a.ndim, "squeeze")
    if builtins.any(a.shape[i] != 1 for i in axes):
        raise ValueError(at_user_line(f"lax.squeeze: cannot squeeze axes {tuple(dimensions)} of shape {a.shape}: "
                                      f"their sizes must be 1"))
    return _reshape(a, tuple(s for i, s in enumerate(a.shape) if i not in axes))


@eager_op
def expand_dims(array, dimensions: Sequence[int]) -> Array:
    """`array` with size-1 axes inserted at `dimensions` (positions in the result)."""
    a = to_array(array)
    axes = normalize_axes(dimensions, a.ndim + len(dimensions), "expand_dims")
    rest = iter(a.shape)
    return _reshape(a, tuple(1 if i in axes else next(rest) for i in range(a.ndim + len(axes))))


@eager_op
def broadcast(operand, sizes: Sequence[int]) -> Array:
    """`operand` broadcast with new leading axes of `sizes`: the result's shape is sizes + operand.shape."""
    a = to_array(operand)
    sizes = _lax.canonical_shape(sizes, "broadcast")
    return _lax.broadcast_in_dim(a, sizes + a.shape, tuple(range(len(sizes), len(sizes) + a.ndim)))


@eager_op
def broadcast_to_rank(x, rank: int) -> Array:
    """`x` with leading size-1 axes added up to `rank` (unchanged if its rank is already at least `rank`)."""
    a = to_array(x)
    return a if a.ndim >= rank else _reshape(a, (1,) * (rank - a.ndim) + a.shape)


@eager_op
def collapse(operand, start_dimension: int, stop_dimension: int | None = None) -> Array:
    """`operand` with axes start_dimension..stop_dimension-1 merged into one (to the end when stop is None)."""
    a = to_array(operand)
    start = start_dimension + a.ndim if start_dimension < 0 else start_dimension
    stop = a.ndim if stop_dimension is None else stop_dimension + a.ndim if stop_dimension < 0 else stop_dimension
    if not 0 <= start <= stop <= a.ndim:
        raise ValueError(at_user_line(f"lax.collapse: bad dimensions [{start_dimension}, {stop_dimension}) for "
                                      f"shape {a.shape}"))
    return _reshape(a, a.shape[:start] + (math.prod(a.shape[start:stop]),) + a.shape[stop:])


@eager_op
def full_like(x, fill_value, dtype=None, shape: Sequence[int] | None = None, sharding=None) -> Array:
    """An array of x's shape (or `shape`) and dtype (or `dtype`) filled with `fill_value`."""
    a = to_array(x)
    out = _full(a.shape if shape is None else shape, fill_value, a.uop.dtype if dtype is None else dtype)
    return with_weak(out, a.weak_type and dtype is None)


def slice_in_dim(operand, start_index: int | None, limit_index: int | None, stride: int = 1, axis: int = 0) -> Array:
    """operand[start_index:limit_index:stride] along `axis` (static; negative indices count from the end)."""
    a = to_array(operand)
    axis = normalize_axes(axis, a.ndim, "slice_in_dim")[0]
    n = a.shape[axis]
    start = 0 if start_index is None else operator.index(start_index)
    limit = n if limit_index is None else operator.index(limit_index)
    start, limit = start + n if start < 0 else start, limit + n if limit < 0 else limit
    starts, limits, strides = [0] * a.ndim, list(a.shape), [1] * a.ndim
    starts[axis], limits[axis], strides[axis] = start, limit, stride
    return _lax.slice(a, starts, limits, strides)


def index_in_dim(operand, index: int, axis: int = 0, keepdims: bool = True) -> Array:
    """operand[index] along `axis` (static; negative counts from the end), keeping the axis when `keepdims`."""
    a = to_array(operand)
    axis = normalize_axes(axis, a.ndim, "index_in_dim")[0]
    n, index = a.shape[axis], operator.index(index)
    if not -n <= index < n:
        raise IndexError(at_user_line(f"lax.index_in_dim: index {index} is out of bounds for axis {axis} of size {n}"))
    index %= n
    out = slice_in_dim(a, index, index + 1, 1, axis)
    return out if keepdims else _reshape(out, a.shape[:axis] + a.shape[axis + 1:])


@eager_op
def split(operand, sizes: Sequence[int], axis: int = 0) -> list[Array]:
    """`operand` cut along `axis` into pieces of `sizes` (which must add up to the axis size)."""
    a = to_array(operand)
    axis = normalize_axes(axis, a.ndim, "split")[0]
    sizes = _lax.canonical_shape(sizes, "split")
    if builtins.sum(sizes) != a.shape[axis]:
        raise ValueError(at_user_line(f"lax.split: sizes {sizes} must add up to {a.shape[axis]}, the size of axis "
                                      f"{axis} of shape {a.shape}"))
    offsets = np.cumsum((0,) + sizes)
    return [slice_in_dim(a, int(b), int(e), 1, axis) for b, e in zip(offsets[:-1], offsets[1:])]


# ---- dynamic slices: start indices may be traced; they are clamped so the slice fits, as in JAX ----

def _start_indices(name: str, start_indices: Any, a: Array, sizes: Sequence[int],
                   allow_negative_indices: bool | Sequence[bool]) -> list[Array]:
    """Each axis' start as an int32 scalar Array, negative ones wrapped (when allowed), clamped to [0, n - size]."""
    starts = [to_array(s) for s in start_indices] if isinstance(start_indices, (list, tuple)) else \
        [_lax.gather_axis(to_array(start_indices), np.int32([i]), 0) for i in range(a.ndim)]
    if len(starts) != a.ndim:
        raise TypeError(at_user_line(f"lax.{name}: need one start index per axis of shape {a.shape}, got "
                                     f"{len(starts)}"))
    negative = allow_negative_indices if isinstance(allow_negative_indices, (list, tuple)) else \
        [allow_negative_indices] * a.ndim
    jnp = _jnp()
    out = []
    for s, n, size, wrap in zip(starts, a.shape, sizes, negative):
        if not s.uop.dtype.is_int:
            raise TypeError(at_user_line(f"lax.{name}: start indices must be integers, got {s.uop.dtype}"))
        s = _convert(_reshape(s, ()), dtypes.int32)
        if wrap: s = jnp.where(s < 0, s + n, s)
        out.append(jnp.clip(s, 0, n - size))
    return out


def _check_sizes(name: str, a: Array, sizes: Sequence[int]) -> tuple[int, ...]:
    sizes = _lax.canonical_shape(sizes, name)
    if len(sizes) != a.ndim or builtins.any(s > n for s, n in zip(sizes, a.shape)):
        raise TypeError(at_user_line(f"lax.{name}: slice sizes {sizes} must have one entry per axis of shape "
                                     f"{a.shape}, each at most that axis' size"))
    return sizes


@eager_op
def dynamic_slice(operand, start_indices, slice_sizes: Sequence[int], *,
                  allow_negative_indices: bool | Sequence[bool] = True) -> Array:
    """operand[start:start + size] per axis, with start indices that may be traced (clamped to fit, as in JAX).

    Example:
      >>> lax.dynamic_slice(np.arange(6.0), (4,), (3,))   # start clamped to 3: [3., 4., 5.]
    """
    a = to_array(operand)
    sizes = _check_sizes("dynamic_slice", a, slice_sizes)
    starts = _start_indices("dynamic_slice", start_indices, a, sizes, allow_negative_indices)
    out = a
    for axis, (start, size) in enumerate(zip(starts, sizes)):
        if size == a.shape[axis]: continue  # the clamped start is 0
        index = _add(_lax.iota(dtypes.int32, size), _lax._broadcast_scalar(start, (size,)))
        out = _lax.gather_axis(out, index, axis)
    return out


@eager_op
def dynamic_update_slice(operand, update, start_indices, *,
                         allow_negative_indices: bool | Sequence[bool] = True) -> Array:
    """A copy of `operand` with `update` written at `start_indices` (traced or not; clamped so it fits)."""
    a, u = to_array(operand), to_array(update)
    if u.uop.dtype != a.uop.dtype:
        if not u.weak_type:
            raise TypeError(at_user_line(f"lax.dynamic_update_slice: update dtype {u.uop.dtype} must match operand "
                                         f"dtype {a.uop.dtype}"))
        u = cast(u, a.uop.dtype)
    if u.ndim != a.ndim or builtins.any(s > n for s, n in zip(u.shape, a.shape)):
        raise TypeError(at_user_line(f"lax.dynamic_update_slice: update shape {u.shape} must have the rank of the "
                                     f"operand's shape {a.shape} and fit in it"))
    starts = _start_indices("dynamic_update_slice", start_indices, a, u.shape, allow_negative_indices)
    placed, mask = u, None
    for axis, (start, size) in enumerate(zip(starts, u.shape)):
        n = a.shape[axis]
        if size == n: continue
        offset = _sub(_lax.iota(dtypes.int32, n), _lax._broadcast_scalar(start, (n,)))
        inside = _and(_lt(offset, _full((n,), size, dtypes.int32)), _lt(_full((n,), -1, dtypes.int32), offset))
        if size == 0: return a
        placed = _lax.gather_axis(placed, _jnp().clip(offset, 0, size - 1), axis)
        here = _lax.broadcast_in_dim(inside, a.shape, (axis,))
        mask = here if mask is None else _and(mask, here)
    return placed if mask is None else _select(mask, placed, a)


def dynamic_slice_in_dim(operand, start_index, slice_size: int, axis: int = 0, *,
                         allow_negative_indices: bool = True) -> Array:
    """dynamic_slice along one axis: operand[..., start:start + slice_size, ...]."""
    a = to_array(operand)
    axis = normalize_axes(axis, a.ndim, "dynamic_slice_in_dim")[0]
    starts = [np.int32(0)] * a.ndim
    starts[axis] = start_index
    sizes = list(a.shape)
    sizes[axis] = slice_size
    return dynamic_slice(a, starts, sizes, allow_negative_indices=allow_negative_indices)


def dynamic_index_in_dim(operand, index, axis: int = 0, keepdims: bool = True, *,
                         allow_negative_indices: bool = True) -> Array:
    """operand[index] along `axis` with a possibly traced index; keeps the axis (size 1) when `keepdims`."""
    a = to_array(operand)
    axis = normalize_axes(axis, a.ndim, "dynamic_index_in_dim")[0]
    out = dynamic_slice_in_dim(a, index, 1, axis, allow_negative_indices=allow_negative_indices)
    return out if keepdims else _reshape(out, a.shape[:axis] + a.shape[axis + 1:])


def dynamic_update_slice_in_dim(operand, update, start_index, axis: int, *,
                                allow_negative_indices: bool = True) -> Array:
    """dynamic_update_slice along one axis (the other axes start at 0)."""
    a = to_array(operand)
    axis = normalize_axes(axis, a.ndim, "dynamic_update_slice_in_dim")[0]
    starts = [np.int32(0)] * a.ndim
    starts[axis] = start_index
    return dynamic_update_slice(a, update, starts, allow_negative_indices=allow_negative_indices)


def dynamic_update_index_in_dim(operand, update, index, axis: int, *, allow_negative_indices: bool = True) -> Array:
    """Write `update` (with or without the size-1 axis `axis`) at `index` along `axis`."""
    a, u = to_array(operand), to_array(update)
    axis = normalize_axes(axis, a.ndim, "dynamic_update_index_in_dim")[0]
    if u.ndim == a.ndim - 1: u = _reshape(u, u.shape[:axis] + (1,) + u.shape[axis:])
    return dynamic_update_slice_in_dim(a, u, index, axis, allow_negative_indices=allow_negative_indices)


# ---- products ----

@eager_op
def dot(lhs, rhs, *, dimension_numbers=None, precision=None, preferred_element_type=None) -> Array:
    """Vector/matrix product: lhs's last axis contracted with rhs's first (jax.lax.dot); with dimension_numbers,
    dot_general."""
    a, b = to_array(lhs), to_array(rhs)
    if dimension_numbers is None:
        if a.ndim not in (1, 2) or b.ndim not in (1, 2) or a.shape[-1] != b.shape[0]:
            raise TypeError(at_user_line(f"lax.dot: incompatible shapes for dot: got {a.shape} and {b.shape}"))
        dimension_numbers = (((a.ndim - 1,), (0,)), ((), ()))
    return _lax.dot_general(a, b, dimension_numbers, precision, preferred_element_type)


@eager_op
def batch_matmul(lhs, rhs, precision=None) -> Array:
    """Matrix products over equal leading batch axes: [..., m, k] x [..., k, n] -> [..., m, n]."""
    a, b = to_array(lhs), to_array(rhs)
    if a.ndim < 2 or a.ndim != b.ndim or a.shape[:-2] != b.shape[:-2] or a.shape[-1] != b.shape[-2]:
        raise ValueError(at_user_line(f"lax.batch_matmul: need arrays of equal rank >= 2 with equal batch axes and "
                                      f"matching inner sizes, got {shape_str(a, b)}"))
    batch = tuple(range(a.ndim - 2))
    return _lax.dot_general(a, b, (((a.ndim - 1,), (b.ndim - 2,)), (batch, batch)), precision)


# ---- scans ----

@eager_op
def associative_scan(fn: Callable, elems: Any, reverse: bool = False, axis: int = 0) -> Any:
    """All prefix combinations fn(x0, fn(x1, ...)) of the pytree `elems` along `axis` (fn must be associative and
    work elementwise on slices); `reverse` combines from the end. Log-step (Hillis-Steele): O(n log n) work,
    ceil(log2 n) calls of fn.

    Example:
      >>> lax.associative_scan(lax.add, np.arange(5.0))   # [0., 1., 3., 6., 10.]
    """
    leaves, tree = tree_util.tree_flatten(elems)
    if not leaves: return elems
    leaves = [to_array(x) for x in leaves]
    axis = normalize_axes(axis, leaves[0].ndim, "associative_scan")[0]
    n = leaves[0].shape[axis]
    if builtins.any(x.ndim <= axis or x.shape[axis] != n for x in leaves):
        raise ValueError(at_user_line(f"lax.associative_scan: every element needs the same size along axis {axis}, "
                                      f"got {shape_str(*leaves)}"))
    if reverse: leaves = [_lax.rev(x, (axis,)) for x in leaves]

    def combine(earlier, later):  # (with reverse: earlier in the reversed order, as JAX calls fn)
        return [to_array(x) for x in tree_util.tree_leaves(fn(tree.unflatten(earlier), tree.unflatten(later)))]
    shift = 1
    while shift < n:
        merged = combine([slice_in_dim(x, 0, n - shift, 1, axis) for x in leaves],
                         [slice_in_dim(x, shift, n, 1, axis) for x in leaves])
        leaves = [_lax.concatenate([slice_in_dim(x, 0, shift, 1, axis), m], axis) for x, m in zip(leaves, merged)]
        shift *= 2
    if reverse: leaves = [_lax.rev(x, (axis,)) for x in leaves]
    return tree.unflatten(leaves)


def _logaddexp(a: Array, b: Array) -> Array:
    """log(exp(a) + exp(b)) without overflow; equal arguments (also two infinities) give a + log 2."""
    jnp = _jnp()
    same = a == b
    delta = jnp.where(same, 0.0, a - b).astype(a.dtype)
    return jnp.maximum(a, b) + jnp.log1p(jnp.exp(-jnp.abs(delta)))


def _cumulative(name: str, combine: Callable, accepted: str):
    def fn(operand, axis: int = 0, reverse: bool = False) -> Array:
        a = to_array(operand)
        _check_dtype(name, a, _accepts(a.uop.dtype, accepted), accepted)
        if a.ndim == 0:
            raise ValueError(at_user_line(f"lax.{name}: needs an array of rank >= 1, got shape ()"))
        return associative_scan(combine, a, reverse=reverse, axis=axis)
    return _lax._export(fn, name, f"Inclusive running {name[3:]} along `axis` (from the end when `reverse`).")


cummax = _cumulative("cummax", lambda a, b: _max(a, b), _NUMERIC)
cummin = _cumulative("cummin", lambda a, b: _jnp().minimum(a, b), _NUMERIC)
cumlogsumexp = _cumulative("cumlogsumexp", _logaddexp, _FLOATS)


def map(f: Callable, xs: Any, *, batch_size: int | None = None) -> Any:  # noqa: A001
    """f applied to each slice of the pytree `xs` along its leading axis, stacked (a scan, so f is traced once);
    with `batch_size`, f is vmapped over batches of that many slices, the remainder in one last batch.

    Example:
      >>> lax.map(lambda x: x * 2, np.arange(3.0))   # [0., 2., 4.]
    """
    if batch_size is None:
        return scan(lambda carry, x: (carry, f(x)), None, xs)[1]
    from fnx.transforms.vmap import vmap  # (transforms sit above lax)
    leaves, tree = tree_util.tree_flatten(xs)
    n = to_array(leaves[0]).shape[0]
    batch_size = operator.index(batch_size)
    if batch_size < 1: raise ValueError(at_user_line(f"lax.map: batch_size must be >= 1, got {batch_size}"))
    full_batches, rest = divmod(n, batch_size)
    batched = vmap(f)
    parts = []
    if full_batches:
        head = [_reshape(slice_in_dim(to_array(x), 0, full_batches * batch_size), (full_batches, batch_size)
                         + to_array(x).shape[1:]) for x in leaves]
        ys = scan(lambda carry, x: (carry, batched(tree.unflatten(x))), None, head)[1]
        parts.append(tree_util.tree_map(lambda y: _reshape(y, (full_batches * batch_size,) + y.shape[2:]), ys))
    if rest:
        parts.append(batched(tree.unflatten([slice_in_dim(to_array(x), n - rest, n) for x in leaves])))
    if len(parts) == 1: return parts[0]
    return tree_util.tree_map(lambda a, b: _lax.concatenate([a, b], 0), parts[0], parts[1])


# ---- reductions ----

def _extreme(x: Array, axes: tuple[int, ...], largest: bool) -> Array:
    if largest: return _lax.reduce_max(x, axes)
    return _lax._order_reversed(_lax.reduce_max(_lax._order_reversed(x), axes))


def _bitwise_reduce(x: Array, axes: tuple[int, ...], kind: str) -> Array:
    """and/or/xor over `axes`: bools via max/min/sum, integers bit by bit."""
    if x.uop.dtype.is_bool:
        if kind == "xor":
            return _ne(_rem(_lax.reduce_sum(_convert(x, dtypes.int32), axes), _full((), 2, dtypes.int32)),
                       _full((), 0, dtypes.int32))
        return _extreme(x, axes, largest=kind == "or")
    u = _bitcast(x, _unsigned(x.uop.dtype)) if not x.uop.dtype.is_unsigned else x
    out = None
    for bit in range(u.uop.dtype.bits):
        ones = _and(_shift_right(u, _full_like(u, bit)), _full_like(u, 1))
        if kind == "xor": hit = _and(_lax.reduce_sum(ones, axes), _full((), 1, u.uop.dtype))
        else: hit = _extreme(ones, axes, largest=kind == "or")
        term = _shift_left(hit, _full_like(hit, bit))
        out = term if out is None else _or(out, term)
    return out if out.uop.dtype == x.uop.dtype else _bitcast(out, x.uop.dtype)


def _axis_reducer(name: str, compute: Callable, accepted: str, doc: str):
    def fn(operand, axes: Sequence[int]) -> Array:
        a = to_array(operand)
        _check_dtype(name, a, _accepts(a.uop.dtype, accepted), accepted)
        return compute(a, normalize_axes(axes, a.ndim, name))
    return _lax._export(fn, name, doc)


reduce_min = _axis_reducer("reduce_min", lambda a, axes: _extreme(a, axes, False), "integer, floating, bool",
                           "The minimum of `operand` over `axes`.")
reduce_and = _axis_reducer("reduce_and", lambda a, axes: _bitwise_reduce(a, axes, "and"), "integer, bool",
                           "Bitwise (logical for bools) and of `operand` over `axes`.")
reduce_or = _axis_reducer("reduce_or", lambda a, axes: _bitwise_reduce(a, axes, "or"), "integer, bool",
                          "Bitwise (logical for bools) or of `operand` over `axes`.")
reduce_xor = _axis_reducer("reduce_xor", lambda a, axes: _bitwise_reduce(a, axes, "xor"), "integer, bool",
                           "Bitwise (logical for bools) xor of `operand` over `axes`.")


def _monoid(computation: Callable) -> str | None:
    """The monoid (add, mul, max, min, and, or) that `computation` is, if it is one fnx knows by identity."""
    import fnx.numpy as jnp
    known = {"add": (add, _add, jnp.add, operator.add), "mul": (mul, _mul, jnp.multiply, operator.mul),
             "max": (max, _max, jnp.maximum), "min": (min, jnp.minimum),
             "and": (bitwise_and, _and, jnp.bitwise_and, jnp.logical_and, operator.and_),
             "or": (bitwise_or, _or, jnp.bitwise_or, jnp.logical_or, operator.or_)}
    for kind, fns in known.items():
        if builtins.any(computation is f for f in fns): return kind
    return None


def _reduce_by(kind: str, a: Array, axes: tuple[int, ...]) -> Array:
    if kind == "add": return _lax.reduce_sum(a, axes)
    if kind == "mul": return _lax.reduce_prod(a, axes)
    if kind in ("max", "min"): return _extreme(a, axes, kind == "max")
    return _bitwise_reduce(a, axes, kind)


@eager_op
def reduce(operands: Any, init_values: Any, computation: Callable, dimensions: Sequence[int]) -> Any:
    """Reduce `operands` over `dimensions` with `computation`, starting from `init_values` (jax.lax.reduce).

    fnx recognises the monoids add, mul, max, min, and, or (fnx.lax's, fnx.numpy's or the operator module's
    functions) and reduces with them; init_values is combined in once. Other computations, and several operands
    at once, raise NotImplementedError.
    """
    kind = _monoid(computation)
    leaves, tree = tree_util.tree_flatten(operands)
    inits = tree_util.tree_leaves(init_values)
    if kind is None or len(leaves) != 1 or len(inits) != 1:
        raise NotImplementedError(at_user_line(
            f"lax.reduce: only a single operand reduced by a known monoid (lax/jnp/operator add, mul, max, min, "
            f"and, or) is supported, got computation {getattr(computation, '__name__', computation)!r} over "
            f"{len(leaves)} operand(s)"))
    a = to_array(leaves[0])
    init = to_array(inits[0])
    if init.ndim:
        raise TypeError(at_user_line(f"lax.reduce: init value must be a scalar, got shape {init.shape}"))
    if init.uop.dtype != a.uop.dtype and not init.weak_type:
        raise TypeError(at_user_line(f"lax.reduce: operand dtype {a.uop.dtype} and init value dtype "
                                     f"{init.uop.dtype} must match"))
    axes = normalize_axes(dimensions, a.ndim, "reduce")
    if not axes: return tree.unflatten([a])  # nothing reduced: the operand, as in JAX
    return tree.unflatten([with_weak(computation(_reduce_by(kind, a, axes), cast(init, a.uop.dtype)), False)])


# ---- windows: a fold over strided slices ----

def _window_pads(name: str, shape: Sequence[int], window: Sequence[int], strides: Sequence[int],
                 padding: Any) -> list[tuple[int, int]]:
    if isinstance(padding, str):
        if padding.upper() == "VALID": return [(0, 0)] * len(shape)
        if padding.upper() != "SAME":
            raise ValueError(at_user_line(f"lax.{name}: padding must be 'VALID', 'SAME' or (low, high) pairs, "
                                          f"got {padding!r}"))
        pads = []
        for n, w, s in zip(shape, window, strides):
            total = builtins.max((-(-n // s) - 1) * s + w - n, 0)
            pads.append((total // 2, total - total // 2))
        return pads
    pads = [tuple(operator.index(p) for p in pair) for pair in padding]
    if len(pads) != len(shape) or builtins.any(len(p) != 2 for p in pads):
        raise ValueError(at_user_line(f"lax.{name}: padding needs one (low, high) pair per axis of {tuple(shape)}, "
                                      f"got {padding!r}"))
    return pads


def _window_config(name: str, shape: Sequence[int], window_dimensions, window_strides, padding, base_dilation,
                   window_dilation):
    rank = len(shape)
    window = tuple(operator.index(w) for w in window_dimensions)
    strides = tuple(operator.index(s) for s in window_strides) if window_strides is not None else (1,) * rank
    base = tuple(operator.index(d) for d in base_dilation) if base_dilation is not None else (1,) * rank
    dilation = tuple(operator.index(d) for d in window_dilation) if window_dilation is not None else (1,) * rank
    if builtins.any(len(t) != rank for t in (window, strides, base, dilation)) or \
            builtins.any(v < 1 for v in strides + base + dilation) or builtins.any(w < 0 for w in window):
        raise ValueError(at_user_line(f"lax.{name}: window dimensions, strides and dilations need one positive entry "
                                      f"per axis of shape {tuple(shape)}"))
    dilated_shape = tuple((n - 1) * d + 1 if n else 0 for n, d in zip(shape, base))
    effective = tuple((w - 1) * d + 1 if w else 0 for w, d in zip(window, dilation))
    pads = _window_pads(name, dilated_shape, effective, strides, padding)
    padded = tuple(n + lo + hi for n, (lo, hi) in zip(dilated_shape, pads))
    out_shape = tuple((p - e) // s + 1 if p >= e else 0 for p, e, s in zip(padded, effective, strides))
    return window, strides, base, dilation, pads, out_shape


def reduce_window_shape_tuple(operand_shape: Sequence[int], window_dimensions: Sequence[int],
                              window_strides: Sequence[int], padding: Any, base_dilation=None,
                              window_dilation=None) -> tuple[int, ...]:
    """The shape reduce_window gives for an operand of `operand_shape`."""
    return _window_config("reduce_window_shape_tuple", tuple(operand_shape), window_dimensions, window_strides,
                          padding, base_dilation, window_dilation)[-1]


@eager_op
def reduce_window(operand, init_value, computation: Callable, window_dimensions: Sequence[int],
                  window_strides: Sequence[int] | None = None, padding: Any = "VALID",
                  base_dilation: Sequence[int] | None = None, window_dilation: Sequence[int] | None = None) -> Array:
    """`computation` folded over each window of `operand` (jax.lax.reduce_window): padding ('VALID', 'SAME' or
    (low, high) pairs) and base dilation fill with `init_value`; each output element is computation(init, fold of
    its window). Built from one strided slice per window position, so any binary `computation` works and grads
    follow; the cost grows with the window's size. A single operand only (pytrees raise NotImplementedError).

    Example:
      >>> lax.reduce_window(np.arange(5.0), -np.inf, lax.max, (2,), (1,), "VALID")   # [1., 2., 3., 4.]
    """
    if not isinstance(operand, (Array, np.ndarray, np.generic, int, float, bool)):
        raise NotImplementedError(at_user_line("lax.reduce_window: several operands (a pytree) are not supported"))
    a = to_array(operand)
    init = to_array(init_value)
    if init.uop.dtype != a.uop.dtype:
        if not init.weak_type:
            raise TypeError(at_user_line(f"lax.reduce_window: operand dtype {a.uop.dtype} and init value dtype "
                                         f"{init.uop.dtype} must match"))
        init = cast(init, a.uop.dtype)
    window, strides, base, dilation, pads, out_shape = _window_config(
        "reduce_window", a.shape, window_dimensions, window_strides, padding, base_dilation, window_dilation)
    fill = init if init.ndim == 0 else _reshape(init, ())
    kind = _tiled_kind(computation)
    if kind and strides == window and set(base + dilation) == {1} and not builtins.any(lo or hi for lo, hi in pads) \
            and 0 not in out_shape + window:  # windows that tile the operand: max pooling, average pooling
        start = _lax.broadcast_in_dim(fill, out_shape, ())
        return with_weak(to_array(computation(start, _tiled_reduce(a, window, out_shape, kind))), a.weak_type)
    config = [(lo, hi, d - 1) for (lo, hi), d in zip(pads, base)]
    padded = _lax.pad(a, fill, config) if builtins.any(c != (0, 0, 0) for c in config) else a
    acc = None
    for offsets in np.ndindex(*window):
        starts = [o * d for o, d in zip(offsets, dilation)]
        limits = [s + (m - 1) * st + 1 if m else s for s, m, st in zip(starts, out_shape, strides)]
        piece = _lax.slice(padded, starts, limits, strides)
        acc = piece if acc is None else computation(acc, piece)
    start = _lax.broadcast_in_dim(fill, out_shape, ())
    return with_weak(to_array(computation(start, acc) if acc is not None else start), a.weak_type)



# the reductions a tiled reduce_window does in one REDUCE: computation by its name, among fnx's own functions
_TILED_KINDS = {"max": "max", "maximum": "max", "min": "min", "minimum": "min", "add": "add", "mul": "mul",
                "multiply": "mul"}


def _tiled_kind(computation: Callable) -> str | None:
    """'max', 'min', 'add' or 'mul' when `computation` is fnx's (lax.max, jnp.maximum, lax.add, ...), else None."""
    if not str(getattr(computation, "__module__", "")).startswith("fnx."): return None
    return _TILED_KINDS.get(getattr(computation, "__name__", ""))


def _tiled_reduce(a: Array, window: tuple[int, ...], out_shape: tuple[int, ...], kind: str) -> Array:
    """reduce_window over windows that tile `a` (strides equal to the window; no padding, no dilation): the part the
    windows cover, reshaped so that each window is the trailing axis of its output element, reduced over that axis.

    One REDUCE over contiguous elements instead of a strided slice per window position (whose grads are strided
    pads: a 2x2 max pool's backward took ~750 index operations per element). The grad of max and min goes to the
    first extreme element of each window in row-major window order, as JAX's select_and_scatter does."""
    rank = len(window)
    covered = [o * w for o, w in zip(out_shape, window)]
    x = _lax.slice(a, [0] * rank, covered) if covered != list(a.shape) else a
    x = _lax.reshape(x, [d for o, w in zip(out_shape, window) for d in (o, w)])
    x = _lax.transpose(x, [2 * i for i in range(rank)] + [2 * i + 1 for i in range(rank)])
    x = _lax.reshape(x, (*out_shape, math.prod(window)))
    if kind == "add": return _lax.reduce_sum(x, (rank,))
    if kind == "mul": return _lax.reduce_prod(x, (rank,))
    return _window_extreme(x) if kind == "max" else _window_least(x)


def _first_extreme_jvp(largest: bool):
    """The derivative rule of max (or min) over the trailing axis: the tangent of the first extreme element."""
    def jvp(primals, tangents):
        (x,), (t,) = primals, tangents
        y = _extreme(x, (x.ndim - 1,), largest)
        # (a buffer of its own: each window decides once, and the backward pass reads one index per element)
        first = _lax.optimization_barrier((_lax.argmax if largest else _lax.argmin)(x, x.ndim - 1, dtypes.int32))
        hit = eq(_lax.broadcasted_iota(dtypes.int32, x.shape, x.ndim - 1),
                      _lax.broadcast_in_dim(first, x.shape, tuple(range(x.ndim - 1))))
        return y, _lax.reduce_sum(_lax.select(hit, t, _lax.full(t.shape, 0, t.dtype)), (x.ndim - 1,))
    return jvp


def _window_max(x: Array) -> Array:
    return _extreme(x, (x.ndim - 1,), True)


def _window_min(x: Array) -> Array:
    return _extreme(x, (x.ndim - 1,), False)


_window_extreme, _window_least = custom_jvp(_window_max), custom_jvp(_window_min)
_window_extreme.defjvp(_first_extreme_jvp(True))
_window_least.defjvp(_first_extreme_jvp(False))


# ---- names of options and types, and a few more ops ----

class Precision(enum.Enum):
    """jax.lax.Precision: accepted by dot_general / conv and ignored (fnx computes in the operands' dtype, 16-bit
    floats accumulating in float32)."""
    DEFAULT = 0
    HIGH = 1
    HIGHEST = 2


class GatherScatterMode(enum.Enum):
    """jax.lax.GatherScatterMode: what out-of-range indices do (fnx's indexing: CLIP for gathers, FILL_OR_DROP for
    scatters, as jnp's defaults)."""
    CLIP = 0
    FILL_OR_DROP = 1
    PROMISE_IN_BOUNDS = 2
    ONE_HOT = 3


DotDimensionNumbers = tuple  # ((lhs_contracting, rhs_contracting), (lhs_batch, rhs_batch))
PrecisionLike = Any


def broadcast_shapes(*shapes: Sequence[int]) -> tuple[int, ...]:
    """The shape numpy broadcasting gives these shapes (ValueError when they do not broadcast)."""
    try:
        return tuple(int(d) for d in np.broadcast_shapes(*[tuple(s) for s in shapes]))
    except ValueError:
        raise ValueError(f"broadcast_shapes: incompatible shapes for broadcasting: {[tuple(s) for s in shapes]}") \
            from None


def mulhi(x, y, /) -> Array:
    """The high half of the full-width product of two integers of one dtype (jax.lax.mulhi), wrapping as the
    hardware does."""
    (a, b), _ = _operands("mulhi", x, y)
    d = a.uop.dtype
    _check_dtype("mulhi", a, d.is_int, "integer")
    bits = 8 * d.itemsize
    if bits <= 16:  # (the full product fits a 32-bit integer)
        wide = dtypes.uint32 if d.is_unsigned else dtypes.int32
        product = _mul(_convert(a, wide), _convert(b, wide))
        return _convert(_shift_right(product, _full(product.shape, bits, wide)), d)
    # four half-width partial products (32 or 64 bits): the high word with every carry
    half, unsigned = bits // 2, _unsigned(d)
    ua, ub = _convert(a, unsigned), _convert(b, unsigned)
    low_mask = _full(ua.shape, (1 << half) - 1, unsigned)
    shift = _full(ua.shape, half, unsigned)
    a_lo, a_hi = _and(ua, low_mask), _shift_right(ua, shift)
    b_lo, b_hi = _and(ub, low_mask), _shift_right(ub, shift)
    lo_lo, hi_lo, lo_hi, hi_hi = _mul(a_lo, b_lo), _mul(a_hi, b_lo), _mul(a_lo, b_hi), _mul(a_hi, b_hi)
    middle = _add(_add(_shift_right(lo_lo, shift), _and(hi_lo, low_mask)), _and(lo_hi, low_mask))
    high = _add(_add(_add(hi_hi, _shift_right(hi_lo, shift)), _shift_right(lo_hi, shift)),
                _shift_right(middle, shift))
    if not d.is_unsigned:  # (signed: subtract b where a < 0 and a where b < 0, modulo the width)
        zero = _full(a.shape, 0, d)
        high = _sub(high, _convert(_select(_lt(a, zero), b, zero), unsigned))
        high = _sub(high, _convert(_select(_lt(b, zero), a, zero), unsigned))
    return _convert(high, d)


def index_take(src, idxs, axes: Sequence[int]) -> Array:
    """src indexed along `axes` by the columns of `idxs` (jax.lax.index_take: idxs[:, i] indexes axis axes[i])."""
    src, idxs = to_array(src), to_array(idxs)
    index = [slice(None)] * src.ndim
    for i, axis in enumerate(axes): index[axis] = idxs[:, i]
    return src[tuple(index)]

# ---- array building: tile, stack, unstack, empty, dtype, broadcast_like ----

def tile(operand, reps: Sequence[int]) -> Array:
    """`operand` repeated reps[i] times along each axis i (jax.lax.tile: one rep per axis, as numpy.tile's result
    for reps of the operand's rank)."""
    a = to_array(operand)
    reps = tuple(_lax.canonical_shape(reps, "tile"))
    if len(reps) != a.ndim:
        raise TypeError(at_user_line(f"tile: reps length must be equal to the ndim of x, got len(reps)={len(reps)} "
                                     f"and x.ndim={a.ndim}"))
    from fnx import numpy as jnp  # (fnx.numpy builds on fnx.lax)
    return jnp.tile(a, reps)


def stack(operands: Sequence, axis: int = 0) -> Array:
    """The operands (one shape and dtype) joined along a new axis `axis` (jax.lax.stack)."""
    arrays = [to_array(x) for x in operands]
    if not arrays: raise ValueError(at_user_line("stack: needs at least one operand"))
    first = arrays[0]
    if any(x.shape != first.shape or x.uop.dtype != first.uop.dtype for x in arrays):
        raise TypeError(at_user_line("stack: operands must have one shape and dtype, got "
                                     f"{', '.join(f'{x.uop.dtype}{list(x.shape)}' for x in arrays)}"))
    axis = normalize_axes(axis, first.ndim + 1, "stack")[0]
    return _lax.concatenate([expand_dims(x, (axis,)) for x in arrays], axis)


def unstack(x, axis: int = 0) -> tuple[Array, ...]:
    """The slices of `x` along `axis`, that axis removed (jax.lax.unstack)."""
    a = to_array(x)
    if a.ndim == 0: raise ValueError(at_user_line("unstack: needs an array of rank >= 1, got a 0-d one"))
    axis = normalize_axes(axis, a.ndim, "unstack")[0]
    return tuple(index_in_dim(a, i, axis, keepdims=False) for i in range(a.shape[axis]))


def empty(shape, dtype, *, out_sharding: Any = None) -> Array:
    """An array of `shape` and `dtype` whose values are unspecified (jax.lax.empty; fnx gives zeros)."""
    if out_sharding is not None:
        raise UnsupportedError(at_user_line("lax.empty: out_sharding is not supported (use fnx.device_put)"))
    return _full(_lax.canonical_shape(shape, "empty"), 0, dtypes.requested(dtype, "empty"))


def dtype(x: Any) -> np.dtype:
    """The numpy dtype of a value or dtype specifier as fnx would hold it (jax.lax.dtype): Python floats are the
    default float, 64-bit types are 32-bit unless x64 is on."""
    if isinstance(x, (bool, int, float)) and not isinstance(x, np.generic):
        return dtypes.canonicalize_scalar(x)[0].np
    if isinstance(x, Array): return x.uop.dtype.np
    if hasattr(x, "dtype") and not isinstance(x, type): return dtypes.canonicalize(dtypes.to_dtype(x.dtype)).np
    return dtypes.canonicalize(dtypes.to_dtype(x)).np


def broadcast_like(arr, like_arr) -> Array:
    """`arr` broadcast to the shape of `like_arr` (jax.lax.broadcast_like; numpy's trailing-axis rules)."""
    a, like = to_array(arr), to_array(like_arr)
    if a.ndim > like.ndim or any(s not in (1, t) for s, t in zip(a.shape[::-1], like.shape[::-1])):
        raise ShapeError(at_user_line(f"broadcast_like: cannot broadcast {shape_str(a)} to {list(like.shape)}"))
    dims = tuple(range(like.ndim - a.ndim, like.ndim))
    return _lax.broadcast_in_dim(a, like.shape, dims)


_lax._extend({name: globals()[name] for name in __all__})
