"""Complex numbers: complex64 (and complex128 with x64), as jax.numpy has them.

A complex array is one value of a complex dtype to the user, to pytrees, jit, vmap and grad. fnx computes on it
through its parts: the complex form of each elementwise function (registered here, by name, in
`trace.COMPLEX_UFUNCS`, which `trace.elementwise` consults when an operand is complex) takes REAL and IMAG of its
operands, computes in floats and joins the result with COMPLEX. So every transform needs rules for those three
primitives only, and the compiler turns what is left (complex inputs, outputs, movement, sums) into float pairs
(fnx/lower/complex.py). docs/COMPLEX.md has the design and JAX's derivative convention, which follows from it.

This module also holds the complex functions of fnx.numpy (`real`, `imag`, `conj`, `angle`, ...) and the complex
forms of the products (`matmul`, `dot`, `einsum` go through `complex_dot_general`).
"""
from __future__ import annotations

import builtins
import math
from typing import Any, Callable

import numpy as np

from fnx import dtypes
from fnx.trace import (COMPLEX_UFUNCS, Array, as_operand, eager_op, imag_part, inexact_dtype, make_complex,
                       real_part, with_weak)
from fnx.trace import conjugate as _conjugate
from fnx import numpy as jnp

__all__ = ["real", "imag", "conj", "conjugate", "angle", "iscomplex", "isreal", "iscomplexobj", "isrealobj",
           "complex64", "complex128", "complex_", "csingle", "cdouble", "complexfloating", "sort_complex"]

complex64, complex128 = jnp.scalar_type(np.complex64), jnp.scalar_type(np.complex128)
complex_, csingle, cdouble, complexfloating = complex128, complex64, complex128, np.complexfloating


def _parts(z: Array) -> tuple[Array, Array]:
    return real_part(z), imag_part(z)


def _rule(name: str) -> Callable[[Callable], Callable]:
    def register(fn: Callable) -> Callable:
        COMPLEX_UFUNCS[name] = fn
        return fn
    return register


# ---- arithmetic ----

COMPLEX_UFUNCS["add"] = lambda a, b: make_complex(real_part(a) + real_part(b), imag_part(a) + imag_part(b))
COMPLEX_UFUNCS["subtract"] = lambda a, b: make_complex(real_part(a) - real_part(b), imag_part(a) - imag_part(b))
COMPLEX_UFUNCS["negative"] = lambda a: make_complex(-real_part(a), -imag_part(a))
COMPLEX_UFUNCS["positive"] = lambda a: a
COMPLEX_UFUNCS["conjugate"] = _conjugate


@_rule("multiply")
def _multiply(a: Array, b: Array) -> Array:
    (ar, ai), (br, bi) = _parts(a), _parts(b)
    return make_complex(ar * br - ai * bi, ar * bi + ai * br)


@_rule("divide")
def _divide(a: Array, b: Array) -> Array:
    """a / b with b scaled by its larger part first, so |b|**2 neither overflows nor underflows."""
    (ar, ai), (br, bi) = _parts(a), _parts(b)
    scale = jnp.maximum(jnp.abs(br), jnp.abs(bi))
    scale = jnp.where((scale == 0) | jnp.isinf(scale), 1.0, scale).astype(br.dtype)
    cr, ci = br / scale, bi / scale
    den = (cr * cr + ci * ci) * scale
    return make_complex((ar * cr + ai * ci) / den, (ai * cr - ar * ci) / den)


COMPLEX_UFUNCS["true_divide"] = _divide
COMPLEX_UFUNCS["square"] = lambda a: _multiply(a, a)
COMPLEX_UFUNCS["reciprocal"] = lambda a: _divide(jnp.ones_like(a), a)


@_rule("power")
def _power(a: Array, b: Array) -> Array:
    """a ** b: repeated squaring for a constant integer exponent (z ** 2 is z * z exactly, as in JAX), else
    exp(b log a), with 0 ** b = 0 for Re(b) > 0."""
    n = _constant_integer(b)
    if n is not None and builtins.abs(n) <= 64:
        out, base, k = None, a, builtins.abs(n)
        while k:
            if k & 1: out = base if out is None else _multiply(out, base)
            base, k = _multiply(base, base), k >> 1
        out = jnp.ones_like(a) if out is None else out
        return _divide(jnp.ones_like(a), out) if n < 0 else out
    general = _exp(_multiply(b, _log(a)))
    zero = (real_part(a) == 0) & (imag_part(a) == 0) & (real_part(b) > 0)
    return jnp.where(zero, jnp.zeros_like(general), general)


def _constant_integer(b: Array) -> int | None:
    """The exponent as a Python int when it is a constant with an integral real part and no imaginary part."""
    u = b.uop
    while u.op.name in ("EXPAND", "RESHAPE"): u = u.src[0]
    if u.op.name != "CONST": return None
    value = complex(u.arg.value)
    return int(value.real) if value.imag == 0 and value.real == int(value.real) else None


# ---- functions of complex numbers ----

@_rule("abs")
def _abs(a: Array) -> Array:
    return jnp.hypot(real_part(a), imag_part(a))


COMPLEX_UFUNCS["absolute"] = _abs


@_rule("sign")
def _sign(a: Array) -> Array:
    """z / |z|, and 0 at 0 (JAX's)."""
    r = _abs(a)
    safe = jnp.where(r == 0, 1.0, r).astype(r.dtype)
    return jnp.where(r == 0, jnp.zeros_like(a), make_complex(real_part(a) / safe, imag_part(a) / safe))


@_rule("exp")
def _exp(a: Array) -> Array:
    x, y = _parts(a)
    ex = jnp.exp(x)
    return make_complex(ex * jnp.cos(y), ex * jnp.sin(y))


@_rule("log")
def _log(a: Array) -> Array:
    x, y = _parts(a)
    return make_complex(jnp.log(jnp.hypot(x, y)), jnp.arctan2(y, x))


COMPLEX_UFUNCS["log10"] = lambda a: _scale(_log(a), 1 / math.log(10))
COMPLEX_UFUNCS["log2"] = lambda a: _scale(_log(a), 1 / math.log(2))
COMPLEX_UFUNCS["exp2"] = lambda a: _exp(_scale(a, math.log(2)))


def _scale(z: Array, c: float) -> Array:
    return make_complex(real_part(z) * c, imag_part(z) * c)


@_rule("sqrt")
def _sqrt(a: Array) -> Array:
    """The principal root: t = sqrt((|z| + |x|) / 2) is the part that does not cancel; the other is y / 2t."""
    x, y = _parts(a)
    t = jnp.sqrt((jnp.hypot(x, y) + jnp.abs(x)) * 0.5)
    safe = jnp.where(t == 0, 1.0, t).astype(t.dtype)
    other = jnp.where(t == 0, jnp.zeros_like(t), y / (2 * safe))
    right = x >= 0
    return make_complex(jnp.where(right, t, jnp.abs(other)), jnp.where(right, other, jnp.copysign(t, y)))


COMPLEX_UFUNCS["rsqrt"] = lambda a: _divide(jnp.ones_like(a), _sqrt(a))


@_rule("sin")
def _sin(a: Array) -> Array:
    x, y = _parts(a)
    return make_complex(jnp.sin(x) * jnp.cosh(y), jnp.cos(x) * jnp.sinh(y))


@_rule("cos")
def _cos(a: Array) -> Array:
    x, y = _parts(a)
    return make_complex(jnp.cos(x) * jnp.cosh(y), -(jnp.sin(x) * jnp.sinh(y)))


@_rule("tan")
def _tan(a: Array) -> Array:
    """(sin 2x + i sinh 2y) / (cos 2x + cosh 2y)."""
    x, y = _parts(a)
    den = jnp.cos(2 * x) + jnp.cosh(2 * y)
    return make_complex(jnp.sin(2 * x) / den, jnp.sinh(2 * y) / den)


@_rule("sinh")
def _sinh(a: Array) -> Array:
    x, y = _parts(a)
    return make_complex(jnp.sinh(x) * jnp.cos(y), jnp.cosh(x) * jnp.sin(y))


@_rule("cosh")
def _cosh(a: Array) -> Array:
    x, y = _parts(a)
    return make_complex(jnp.cosh(x) * jnp.cos(y), jnp.sinh(x) * jnp.sin(y))


@_rule("tanh")
def _tanh(a: Array) -> Array:
    """(sinh 2x + i sin 2y) / (cosh 2x + cos 2y)."""
    x, y = _parts(a)
    den = jnp.cosh(2 * x) + jnp.cos(2 * y)
    return make_complex(jnp.sinh(2 * x) / den, jnp.sin(2 * y) / den)


@_rule("log1p")
def _log1p(a: Array) -> Array:
    """log(1 + z) with |1 + z|**2 = 1 + (2x + x**2 + y**2) taken through log1p: accurate for small z."""
    x, y = _parts(a)
    return make_complex(0.5 * jnp.log1p(x * (2 + x) + y * y), jnp.arctan2(y, 1 + x))


@_rule("expm1")
def _expm1(a: Array) -> Array:
    """e**z - 1 = (e**x - 1) cos y - 2 sin(y/2)**2 + i e**x sin y: accurate for small z."""
    x, y = _parts(a)
    half = jnp.sin(y * 0.5)
    return make_complex(jnp.expm1(x) * jnp.cos(y) - 2 * half * half, jnp.exp(x) * jnp.sin(y))


def _times_i(z: Array, sign: float = 1.0) -> Array:
    """sign * i * z."""
    return make_complex(-sign * imag_part(z), sign * real_part(z))


def _add_real(z: Array, c: float) -> Array:
    return make_complex(real_part(z) + c, imag_part(z))


@_rule("arcsinh")
def _arcsinh(a: Array) -> Array:
    """log(z + sqrt(z**2 + 1)) as log1p(z + z**2 / (1 + sqrt(z**2 + 1))), on the half plane Re z >= 0 (odd
    symmetry gives the other), where nothing cancels and small z keep their relative precision."""
    flip = real_part(a) < 0
    z = jnp.where(flip, COMPLEX_UFUNCS["negative"](a), a)
    square = _multiply(z, z)
    out = _log1p(_add_complex(z, _divide(square, _add_real(_sqrt(_add_real(square, 1.0)), 1.0))))
    return jnp.where(flip, COMPLEX_UFUNCS["negative"](out), out)


def _add_complex(a: Array, b: Array) -> Array:
    return make_complex(real_part(a) + real_part(b), imag_part(a) + imag_part(b))


@_rule("arccosh")
def _arccosh(a: Array) -> Array:
    """log(z + sqrt(z + 1) sqrt(z - 1)), the principal branch (Re >= 0)."""
    return _log(_add_complex(a, _multiply(_sqrt(_add_real(a, 1.0)), _sqrt(_add_real(a, -1.0)))))


@_rule("arctanh")
def _arctanh(a: Array) -> Array:
    """(log1p(z) - log1p(-z)) / 2."""
    diff = _add_complex(_log1p(a), COMPLEX_UFUNCS["negative"](_log1p(COMPLEX_UFUNCS["negative"](a))))
    return _scale(diff, 0.5)


COMPLEX_UFUNCS["arcsin"] = lambda a: _times_i(_arcsinh(_times_i(a)), -1.0)      # -i asinh(i z)
COMPLEX_UFUNCS["arctan"] = lambda a: _times_i(_arctanh(_times_i(a)), -1.0)      # -i atanh(i z)
COMPLEX_UFUNCS["arccos"] = lambda a: _add_real(COMPLEX_UFUNCS["negative"](COMPLEX_UFUNCS["arcsin"](a)), math.pi / 2)


# ---- comparisons and predicates ----

def _greater(a: Array, b: Array) -> Array:
    """a > b in JAX's lexicographic order of complex numbers (the real parts, then the imaginary parts)."""
    (ar, ai), (br, bi) = _parts(a), _parts(b)
    return (ar > br) | ((ar == br) & (ai > bi))


COMPLEX_UFUNCS["greater"] = _greater
COMPLEX_UFUNCS["less"] = lambda a, b: _greater(b, a)
COMPLEX_UFUNCS["greater_equal"] = lambda a, b: (~_greater(b, a) & ~COMPLEX_UFUNCS["isnan"](a)
                                                & ~COMPLEX_UFUNCS["isnan"](b))
COMPLEX_UFUNCS["less_equal"] = lambda a, b: COMPLEX_UFUNCS["greater_equal"](b, a)
COMPLEX_UFUNCS["maximum"] = lambda a, b: jnp.where(_greater(b, a), b, a)
COMPLEX_UFUNCS["minimum"] = lambda a, b: jnp.where(_greater(a, b), b, a)

COMPLEX_UFUNCS["equal"] = lambda a, b: (real_part(a) == real_part(b)) & (imag_part(a) == imag_part(b))
COMPLEX_UFUNCS["not_equal"] = lambda a, b: (real_part(a) != real_part(b)) | (imag_part(a) != imag_part(b))
COMPLEX_UFUNCS["isnan"] = lambda a: jnp.isnan(real_part(a)) | jnp.isnan(imag_part(a))
COMPLEX_UFUNCS["isinf"] = lambda a: jnp.isinf(real_part(a)) | jnp.isinf(imag_part(a))
COMPLEX_UFUNCS["isfinite"] = lambda a: jnp.isfinite(real_part(a)) & jnp.isfinite(imag_part(a))
COMPLEX_UFUNCS["logical_not"] = lambda a: (real_part(a) == 0) & (imag_part(a) == 0)


# ---- fnx.numpy's complex functions ----

@eager_op
def real(val: Any, /) -> Array:
    """The real part (a real array itself)."""
    x = as_operand(val, "real")
    return with_weak(real_part(x), x.weak_type)


@eager_op
def imag(val: Any, /) -> Array:
    """The imaginary part (zeros for a real array)."""
    x = as_operand(val, "imag")
    return with_weak(imag_part(x), x.weak_type)


@eager_op
def conjugate(x: Any, /) -> Array:
    """The complex conjugate (a real array itself)."""
    a = as_operand(x, "conjugate")
    return COMPLEX_UFUNCS["conjugate"](a) if a.uop.dtype.is_complex else a


conj = conjugate


@eager_op
def angle(z: Any, deg: bool = False) -> Array:
    """The argument of each element, in (-pi, pi] (degrees with `deg`); 0 or pi for reals, as numpy."""
    a = as_operand(z, "angle")
    if not a.uop.dtype.is_inexact: a = a.astype(inexact_dtype(a.uop.dtype))
    out = jnp.arctan2(imag_part(a), real_part(a))
    return out * (180 / np.pi) if deg else out


@eager_op
def iscomplex(x: Any) -> Array:
    """Whether each element has a nonzero imaginary part."""
    return imag_part(as_operand(x, "iscomplex")) != 0


@eager_op
def isreal(x: Any) -> Array:
    """Whether each element has a zero imaginary part."""
    return imag_part(as_operand(x, "isreal")) == 0


def iscomplexobj(x: Any) -> bool:
    """Whether `x` has a complex dtype."""
    if isinstance(x, Array): return x.uop.dtype.is_complex
    return builtins.bool(np.iscomplexobj(x))


def isrealobj(x: Any) -> bool:
    """Whether `x` does not have a complex dtype."""
    return not iscomplexobj(x)


@eager_op
def sort_complex(a: Any) -> Array:
    """`a` sorted by real part, then imaginary part, as a complex array."""
    x = as_operand(a, "sort_complex")
    x = x if x.uop.dtype.is_complex else x.astype(dtypes.complex_of(inexact_dtype(x.uop.dtype)))
    order = jnp.lexsort((imag_part(x), real_part(x)), axis=-1)
    return jnp.take_along_axis(x, order, axis=-1)


def complex_dot_general(dot: Callable, a: Array, b: Array) -> Array:
    """A product `dot(a, b)` (a dot_general of real arrays) of operands of which at least one is complex: the
    four real products of the parts (three when one side is real)."""
    (ar, ai), (br, bi) = _parts(a), _parts(b)
    if not a.uop.dtype.is_complex: return make_complex(dot(ar, br), dot(ar, bi))
    if not b.uop.dtype.is_complex: return make_complex(dot(ar, br), dot(ai, br))
    return make_complex(dot(ar, br) - dot(ai, bi), dot(ar, bi) + dot(ai, br))


jnp._extend({name: globals()[name] for name in __all__})
