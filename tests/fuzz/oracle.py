"""The float64 numpy oracle for fuzz programs: a stand-in for fnx.numpy (exec the program's source with `jnp`
bound to an `Oracle`) that computes each op in float64 from its (already rounded) operands.

Two modes:

* rounded (the forward oracle): each float result is rounded to its dtype after every op, as JAX's semantics
  require (float16 rounds per op), and every value carries `e`, a running bound on how far any faithful
  implementation of the same program may be from the oracle, elementwise: 0 where the result is exactly
  determined (correctly rounded ops on exact operands: add, subtract, multiply, divide, sqrt, casts, selects,
  shapes, integer ops), a few ulps for each transcendental, n*u*sum|x| for a sum of n terms, and first-order
  propagation of the operands' bounds. A comparison, a cast to an integer or bool, or a where whose outcome the
  bound leaves undecided gives `e = inf` (the element is not checked, and the count is kept). fnx's results must
  equal the oracle where e == 0 and lie within SAFETY * e elsewhere.

* exact (the derivative oracle): no rounding; each value carries a tangent `t` (forward mode along a given
  direction) and an absolute tangent `ta` (the same with |partial derivatives|, i.e. the condition of the
  directional derivative, floored by the rounding noise of derivatives computed with cancellation), and every
  branch decision (comparisons, clip, abs, max/min selections, argmax, casts to int) is recorded so that finite
  differences can refuse a step that crosses a kink.
"""
from __future__ import annotations

import math

import numpy as np

from fuzz.programs import promote

SAFETY = 2.0
U = {"float32": 2.0 ** -24, "float16": 2.0 ** -11}
NP = {"float32": np.float32, "float16": np.float16, "int32": np.int32, "bool": np.bool_}
FMAX = {"float32": float(np.finfo(np.float32).max), "float16": 65504.0}
# ulps of the result each transcendental may be off (on top of correct rounding of its exact operand)
# (float32 divides by a reciprocal where the divisor is the same along the inner loop: fnx/lower/arith.py)
ULPS = {"float32": {"exp": 4, "log": 4, "tanh": 4, "sin": 4, "cos": 4, "sqrt": 0, "divide": 2},
        "float16": {"exp": 1, "log": 1, "tanh": 1, "sin": 1, "cos": 1, "sqrt": 0, "divide": 0}}
INF = np.inf


def _is_float(dt: str) -> bool:
    return dt in U


def _ulp(v: np.ndarray, dt: str) -> np.ndarray:
    with np.errstate(all="ignore"):
        return np.spacing(np.abs(v).astype(NP[dt])).astype(np.float64)


class OVal:
    """An oracle value: v (float64 for floats, already rounded in rounded mode; int32/bool arrays otherwise),
    its dtype name, the error bound e (rounded mode), the tangent t and the absolute tangent ta (exact mode)."""
    __slots__ = ("v", "dt", "e", "t", "ta", "ctx", "p")

    def __init__(self, ctx, v, dt, e=None, t=None, ta=None):
        self.ctx, self.v, self.dt = ctx, np.asarray(v), dt
        self.p = None  # a float32 product's unrounded value: an add may use it (a fused multiply-add)
        z = np.zeros(self.v.shape)
        self.e = z if e is None else np.broadcast_to(np.asarray(e, np.float64), self.v.shape)
        self.t = z if t is None else np.broadcast_to(np.asarray(t, np.float64), self.v.shape)
        self.ta = z if ta is None else np.broadcast_to(np.asarray(ta, np.float64), self.v.shape)

    shape = property(lambda self: self.v.shape)
    ndim = property(lambda self: self.v.ndim)
    dtype = property(lambda self: self.dt)

    def __add__(self, o): return self.ctx.add(self, o)
    def __radd__(self, o): return self.ctx.add(o, self)
    def __sub__(self, o): return self.ctx.subtract(self, o)
    def __rsub__(self, o): return self.ctx.subtract(o, self)
    def __mul__(self, o): return self.ctx.multiply(self, o)
    def __rmul__(self, o): return self.ctx.multiply(o, self)
    def __and__(self, o): return self.ctx.bitwise_and(self, o)
    def __matmul__(self, o): return self.ctx.matmul(self, o)
    def __getitem__(self, key): return self.ctx._apply_shape(self, lambda x: x[key])


class Oracle:
    """The `jnp` of the oracle. `exact=False`: rounded mode; `exact=True`: exact mode with tangents."""
    float32, float16, int32, bool_ = "float32", "float16", "int32", "bool"

    def __init__(self, exact: bool = False, floors: bool = False):
        self.exact, self.floors = exact, floors
        self.branches: list[np.ndarray] = []   # exact mode: every branch decision, in order
        self.undecided = 0                     # rounded mode: elements whose branch the bound leaves open
        self.work = 0                          # roundings along the longest chain, at most: 1 + c per float op,
                                               # n per reduction of n terms (scales the gradient tolerance)

    # ---- helpers ----
    def lift(self, x, like: str | None = None) -> OVal:
        if isinstance(x, OVal): return x
        if isinstance(x, bool): return OVal(self, np.asarray(x), "bool")
        kind = "pyint" if isinstance(x, int) else "pyfloat"
        dt = promote(like, kind) if like else ("int32" if kind == "pyint" else "float32")
        return self.cast(OVal(self, np.asarray(x, np.float64 if _is_float(dt) else NP[dt]),
                              "float32" if _is_float(dt) else dt), dt)

    def arrays(self, xs):
        arrs = [x for x in xs if isinstance(x, OVal)]
        dt = arrs[0].dt
        for a in arrs[1:]: dt = promote(dt, a.dt)
        for x in xs:
            if not isinstance(x, OVal): dt = promote(dt, "pyint" if isinstance(x, int) and not isinstance(x, bool)
                                                    else "pyfloat" if isinstance(x, float) else "bool")
        vals = [self.cast(self.lift(x, dt), dt) for x in xs]
        self._broadcast_work(vals)
        return vals, dt

    def _broadcast_work(self, vals, shape=None):
        """A broadcast operand's cotangent is a sum of as many terms as it was repeated: count them."""
        try:
            size = math.prod(shape if shape is not None else np.broadcast_shapes(*[v.shape for v in vals]))
        except ValueError:        # matmul and concatenate operands need not broadcast
            return
        self.work += max(size // max(math.prod(v.shape), 1) for v in vals) - 1

    def finish(self, v, dt, e_prop=None, c=0, t=None, ta=None) -> OVal:
        """Round v (exact, float64) to dt and bound the difference from a faithful implementation."""
        v = np.asarray(v)
        if not _is_float(dt):
            e = np.zeros(v.shape) if e_prop is None else np.where(np.asarray(e_prop) > 0, INF, 0.0)
            return OVal(self, v.astype(NP[dt]), dt, e=np.broadcast_to(e, v.shape), t=0, ta=0)
        self.work += 1 + c
        if self.exact:
            return OVal(self, v.astype(np.float64), dt, t=t, ta=ta)
        with np.errstate(all="ignore"):
            r = v.astype(NP[dt]).astype(np.float64)
            e_prop = np.zeros(r.shape) if e_prop is None else np.broadcast_to(np.nan_to_num(
                np.asarray(e_prop, np.float64), nan=INF), r.shape)
            e = e_prop + (c + (e_prop > 0)) * _ulp(r, dt)
            e = np.where(e_prop == INF, INF, e)
            risky = ~np.isfinite(r) | (np.abs(r) + SAFETY * e > FMAX[dt])
            e = np.where(risky & (e > 0), INF, e)
        return OVal(self, r, dt, e=e)

    def cast(self, a: OVal, dt: str) -> OVal:
        if a.dt == dt: return a
        if _is_float(dt):
            if _is_float(a.dt): return self.finish(a.v, dt, a.e, 0, a.t, a.ta)
            return self.finish(a.v.astype(np.float64), dt, a.e, 0)     # int/bool -> float: exact rounding
        if dt == "bool":
            out = a.v != 0
            if _is_float(a.dt): self._decide(out, (a.e > 0) & (np.abs(a.v) <= SAFETY * a.e))
            return self.finish(out, "bool", a.e if not _is_float(a.dt) else self._undecided_e(a, out))
        # -> int32
        if a.dt == "bool": return self.finish(a.v.astype(np.int32), "int32", a.e)
        if a.dt == "int32": return a
        out = self._trunc(a.v)
        if self.exact:
            self.branches.append(out)
            return self.finish(out, "int32")
        with np.errstate(all="ignore"):
            open_ = (a.e > 0) & (self._trunc(a.v - SAFETY * a.e) != self._trunc(a.v + SAFETY * a.e))
        self.undecided += int(np.sum(open_))
        return self.finish(out, "int32", np.where(open_, INF, 0.0))

    @staticmethod
    def _trunc(x):
        with np.errstate(invalid="ignore"):
            lo, hi = float(np.iinfo(np.int32).min), float(np.iinfo(np.int32).max)
            return np.trunc(np.clip(np.nan_to_num(x, nan=0.0, posinf=hi, neginf=lo), lo, hi)).astype(np.int32)

    def _decide(self, outcome, open_):
        """Record a branch outcome (exact mode) or count the undecided elements (rounded mode)."""
        if self.exact: self.branches.append(np.asarray(outcome).copy())
        else: self.undecided += int(np.sum(open_))

    def _undecided_e(self, a, out):
        open_ = (a.e > 0) & (np.abs(a.v) <= SAFETY * a.e)
        return np.where(open_ | (a.e == INF), INF, 0.0)

    def _apply_shape(self, a: OVal, fn) -> OVal:
        out = OVal(self, fn(a.v), a.dt, e=fn(a.e), t=fn(a.t), ta=fn(a.ta))
        out.p = None if a.p is None else fn(a.p)  # (a kernel moves indices, not values: still a product)
        return out

    # ---- elementwise ----
    def add(self, a, b):
        (a, b), dt = self.arrays([a, b])
        if dt == "bool": return self.bitwise_or(a, b)
        if not _is_float(dt):
            with np.errstate(all="ignore"): return self.finish(a.v + b.v, dt, np.maximum(a.e, b.e))
        return self.finish(a.v + b.v, dt, a.e + b.e + self._fused(a, b, 1), 0, a.t + b.t, a.ta + b.ta)

    def subtract(self, a, b):
        (a, b), dt = self.arrays([a, b])
        if not _is_float(dt):
            with np.errstate(all="ignore"): return self.finish(a.v - b.v, dt, np.maximum(a.e, b.e))
        return self.finish(a.v - b.v, dt, a.e + b.e + self._fused(a, b, -1), 0, a.t - b.t, a.ta + b.ta)

    def _fused(self, a, b, sign):
        """How far a + sign * b may be from the oracle's when one operand is a float32 product and the other is not:
        fnx (as XLA on the CPU) computes it as one fused multiply-add, from the unrounded product."""
        if self.exact or a.dt != "float32" or b.dt != "float32" or (a.p is None) == (b.p is None): return 0
        with np.errstate(all="ignore"):
            fused = ((a.v if a.p is None else a.p) + sign * (b.v if b.p is None else b.p)).astype(np.float32)
            return np.nan_to_num(np.abs(fused - (a.v + sign * b.v).astype(np.float32)), nan=0.0)

    def multiply(self, a, b):
        (a, b), dt = self.arrays([a, b])
        if dt == "bool": return self.bitwise_and(a, b)
        if not _is_float(dt):
            with np.errstate(all="ignore"): return self.finish(a.v * b.v, dt, np.maximum(a.e, b.e))
        with np.errstate(all="ignore"):
            e = np.abs(b.v) * a.e + np.abs(a.v) * b.e + a.e * b.e
        out = self.finish(a.v * b.v, dt, e, 0, a.v * b.t + b.v * a.t, np.abs(a.v) * b.ta + np.abs(b.v) * a.ta)
        if dt == "float32" and not self.exact: out.p = a.v * b.v  # (exact in float64)
        return out

    def divide(self, a, b):
        (a, b), dt = self.arrays([a, b])
        if not _is_float(dt): (a, b), dt = [self.cast(a, "float32"), self.cast(b, "float32")], "float32"
        with np.errstate(all="ignore"):
            q = a.v / b.v
            den = np.abs(b.v) - b.e
            e = np.where(den > 0, (a.e + np.abs(q) * b.e) / den, INF)
            t = (a.t - q * b.t) / b.v
            ta = (a.ta + np.abs(q) * b.ta) / np.abs(b.v)
        return self.finish(q, dt, e, ULPS.get(dt, {}).get("divide", 0), t, ta)

    def _select(self, take_a, a, b, dt, open_):
        e = np.where(open_, INF, np.where(take_a, a.e, b.e))
        if not _is_float(dt): return self.finish(np.where(take_a, a.v, b.v), dt, e)
        return self.finish(np.where(take_a, a.v, b.v), dt, e, 0, np.where(take_a, a.t, b.t),
                           np.where(take_a, a.ta, b.ta))

    def _extreme2(self, a, b, take_max):
        (a, b), dt = self.arrays([a, b])
        va, vb = np.broadcast_arrays(a.v, b.v)
        if self.exact: self.branches.append(np.stack([va > vb, va < vb]))
        take_a = (va >= vb) if take_max else (va <= vb)
        nan = np.isnan(va) if _is_float(dt) else np.zeros(va.shape, bool)
        take_a = take_a | nan
        # max and min are 1-Lipschitz: the bound is the larger operand bound, whichever side wins
        v = np.where(take_a, va, vb)
        e = np.maximum(a.e, b.e)
        if not _is_float(dt): return self.finish(v, dt, e)
        tie = (va == vb)
        t = np.where(tie, 0.5 * (a.t + b.t), np.where(take_a, a.t, b.t))
        ta = np.where(tie, np.maximum(a.ta, b.ta), np.where(take_a, a.ta, b.ta))
        return self.finish(v, dt, e, 0, t, ta)

    def maximum(self, a, b): return self._extreme2(a, b, True)
    def minimum(self, a, b): return self._extreme2(a, b, False)

    def clip(self, a, lo, hi):
        return self.minimum(self.maximum(a, lo), hi)

    def negative(self, a):
        a = self.lift(a)
        if not _is_float(a.dt):
            with np.errstate(all="ignore"): return self.finish(-a.v, a.dt, a.e)
        return self.finish(-a.v, a.dt, a.e, 0, -a.t, a.ta)

    def square(self, a):
        return self.multiply(a, a)

    def abs(self, a):
        a = self.lift(a)
        if not _is_float(a.dt):
            with np.errstate(all="ignore"): return self.finish(np.abs(a.v), a.dt, a.e)
        if self.exact: self.branches.append(a.v < 0)
        return self.finish(np.abs(a.v), a.dt, a.e, 0, np.sign(a.v) * a.t, a.ta)

    def _float_unary(self, name, a, f, df, e_fn, floor=None):
        a = self.lift(a)
        if not _is_float(a.dt): a = self.cast(a, "float32")
        with np.errstate(all="ignore"):
            y = f(a.v)
            d = df(a.v, y)
            e = e_fn(a.v, a.e, y) if not self.exact else None
            # with floors, the absolute tangent also carries the error of computing d in float32, where
            # it cancels (1 - y^2 of tanh near +-1, cos and sin near their zeros): 4 u (1 + |x|) per unit
            noise = 4 * U["float32"] * (1 + floor * np.abs(a.v)) if self.floors and floor is not None else 0.0
            return self.finish(y, a.dt, e, ULPS[a.dt][name], d * a.t, (np.abs(d) + noise) * a.ta)

    def exp(self, a):
        return self._float_unary("exp", a, np.exp, lambda x, y: y, lambda x, e, y: y * np.expm1(e))

    def log(self, a):
        return self._float_unary("log", a, np.log, lambda x, y: 1 / x,
                                 lambda x, e, y: np.where(x > e, np.log(x) - np.log(np.maximum(x - e, 0)), INF))

    def sqrt(self, a):
        return self._float_unary("sqrt", a, np.sqrt, lambda x, y: 0.5 / y,
                                 lambda x, e, y: y - np.sqrt(np.maximum(x - e, 0)))

    def tanh(self, a):
        return self._float_unary("tanh", a, np.tanh, lambda x, y: 1 - y * y, lambda x, e, y: np.minimum(e, 2.0), 0.0)

    def sin(self, a):
        return self._float_unary("sin", a, np.sin, lambda x, y: np.cos(x), lambda x, e, y: np.minimum(e, 2.0), 1.0)

    def cos(self, a):
        return self._float_unary("cos", a, np.cos, lambda x, y: -np.sin(x), lambda x, e, y: np.minimum(e, 2.0), 1.0)

    # ---- comparisons, where ----
    def _compare(self, a, b, fn):
        (a, b), dt = self.arrays([a, b])
        out = fn(a.v, b.v)
        e = np.maximum(a.e, b.e)
        if _is_float(dt):
            with np.errstate(all="ignore"):
                margin = SAFETY * (a.e + b.e)
                open_ = (margin > 0) & ~(np.abs(a.v - b.v) > margin)
            self._decide(out, open_)
            e = np.where(open_, INF, 0.0)
        return self.finish(out, "bool", e)

    def less(self, a, b): return self._compare(a, b, np.less)
    def less_equal(self, a, b): return self._compare(a, b, np.less_equal)
    def greater(self, a, b): return self._compare(a, b, np.greater)
    def greater_equal(self, a, b): return self._compare(a, b, np.greater_equal)
    def equal(self, a, b): return self._compare(a, b, np.equal)
    def not_equal(self, a, b): return self._compare(a, b, np.not_equal)

    def where(self, c, x, y):
        c = self.lift(c)
        (x, y), dt = self.arrays([x, y])
        cv, xv, yv = np.broadcast_arrays(c.v, x.v, y.v)
        shape = cv.shape
        x = OVal(self, xv, x.dt, np.broadcast_to(x.e, shape), np.broadcast_to(x.t, shape), np.broadcast_to(x.ta, shape))
        y = OVal(self, yv, y.dt, np.broadcast_to(y.e, shape), np.broadcast_to(y.t, shape), np.broadcast_to(y.ta, shape))
        return self._select(cv, x, y, dt, np.broadcast_to(c.e > 0, shape))

    # ---- integers and bools ----
    def _int_binary(self, a, b, fn):
        (a, b), dt = self.arrays([a, b])
        with np.errstate(all="ignore"): return self.finish(fn(a.v, b.v), dt, np.maximum(a.e, b.e))

    def bitwise_and(self, a, b): return self._int_binary(a, b, np.bitwise_and)
    def bitwise_or(self, a, b): return self._int_binary(a, b, np.bitwise_or)
    def bitwise_xor(self, a, b): return self._int_binary(a, b, np.bitwise_xor)
    def floor_divide(self, a, b): return self._int_binary(a, b, np.floor_divide)
    def remainder(self, a, b): return self._int_binary(a, b, np.remainder)

    def logical_xor(self, a, b):
        return self._int_binary(self.cast(self.lift(a), "bool"), self.cast(self.lift(b), "bool"), np.logical_xor)

    def logical_not(self, a):
        a = self.cast(self.lift(a), "bool")
        return self.finish(~a.v, "bool", a.e)

    def astype(self, a, dt):
        return self.cast(self.lift(a), dt)

    # ---- shapes ----
    def reshape(self, a, shape): return self._apply_shape(a, lambda x: np.reshape(x, shape))
    def transpose(self, a, axes=None): return self._apply_shape(a, lambda x: np.transpose(x, axes))
    def broadcast_to(self, a, shape):
        self._broadcast_work([a], shape)
        return self._apply_shape(a, lambda x: np.broadcast_to(x, shape))
    def flip(self, a, axis=None): return self._apply_shape(a, lambda x: np.flip(x, axis))

    def concatenate(self, arrays, axis=0):
        arrs, dt = self.arrays(list(arrays))
        cat = lambda f: np.concatenate([f(a) for a in arrs], axis=axis)
        return OVal(self, cat(lambda a: a.v), dt, cat(lambda a: a.e), cat(lambda a: a.t), cat(lambda a: a.ta))

    # ---- reductions ----
    @staticmethod
    def _norm_axes(axis, ndim):
        if axis is None: return tuple(range(ndim))
        if isinstance(axis, int): return (axis % ndim,)
        return tuple(sorted(x % ndim for x in axis))

    def sum(self, a, axis=None, keepdims=False):
        a = self.lift(a)
        axes = self._norm_axes(axis, a.ndim)
        n = math.prod(a.shape[k] for k in axes)
        if not _is_float(a.dt):
            s = np.sum(a.v.astype(np.int64), axis=axes, keepdims=keepdims)
            return self.finish(s.astype(np.int32), "int32", np.max(a.e, axis=axes, keepdims=keepdims, initial=0))
        acc = U["float32"]
        self.work += n
        e = np.sum(a.e, axis=axes, keepdims=keepdims) + max(n - 1, 0) * acc * np.sum(np.abs(a.v), axis=axes,
                                                                                      keepdims=keepdims)
        return self.finish(np.sum(a.v, axis=axes, keepdims=keepdims), a.dt, e, 0,
                           np.sum(a.t, axis=axes, keepdims=keepdims), np.sum(a.ta, axis=axes, keepdims=keepdims))

    def mean(self, a, axis=None, keepdims=False):
        a = self.lift(a)
        axes = self._norm_axes(axis, a.ndim)
        n = math.prod(a.shape[k] for k in axes)
        dt = "float32" if not _is_float(a.dt) else a.dt
        if not _is_float(a.dt):
            v = a.v.astype(np.float64)
            inf = np.max(a.e, axis=axes, keepdims=keepdims, initial=0)
            s = np.sum(v, axis=axes, keepdims=keepdims)
            e = (n * U["float32"] * np.sum(np.abs(v), axis=axes, keepdims=keepdims) / n) if n > 1 else 0 * s
            return self.finish(s / n, dt, np.where(inf > 0, INF, e))
        self.work += n
        e = (np.sum(a.e, axis=axes, keepdims=keepdims) + max(n - 1, 0) * U["float32"] *
             np.sum(np.abs(a.v), axis=axes, keepdims=keepdims)) / n
        return self.finish(np.sum(a.v, axis=axes, keepdims=keepdims) / n, dt, e, 0,
                           np.sum(a.t, axis=axes, keepdims=keepdims) / n,
                           np.sum(a.ta, axis=axes, keepdims=keepdims) / n)

    def _extreme(self, a, axis, keepdims, take_max):
        a = self.lift(a)
        axes = self._norm_axes(axis, a.ndim)
        rest = [k for k in range(a.ndim) if k not in axes]
        moved = lambda x: np.transpose(x, rest + list(axes)).reshape([a.shape[k] for k in rest] + [-1])
        v = moved(a.v)
        key = v if take_max else (-v.astype(np.float64) if a.dt != "bool" else ~v)
        idx = np.argmax(key, axis=-1)[..., None]
        out_shape = [1 if (k in axes) else a.shape[k] for k in range(a.ndim)] if keepdims else \
            [a.shape[k] for k in rest]
        pick = lambda x: np.take_along_axis(moved(x), idx, axis=-1)[..., 0].reshape(out_shape)
        best = (np.max if take_max else np.min)(v, axis=-1).reshape(out_shape)
        e = np.max(moved(a.e), axis=-1).reshape(out_shape)
        if self.exact and _is_float(a.dt): self.branches.append(idx.copy())
        if not _is_float(a.dt): return self.finish(best, a.dt, e)
        return self.finish(best, a.dt, e, 0, pick(a.t), pick(a.ta))

    def max(self, a, axis=None, keepdims=False): return self._extreme(a, axis, keepdims, True)
    def min(self, a, axis=None, keepdims=False): return self._extreme(a, axis, keepdims, False)

    def cumsum(self, a, axis=None):
        a = self.lift(a)
        ax = axis % a.ndim
        n = a.shape[ax]
        if not _is_float(a.dt):
            s = np.cumsum(a.v.astype(np.int64), axis=ax).astype(np.int32)
            return self.finish(s, "int32", np.maximum.accumulate(a.e, axis=ax))
        self.work += n
        e = np.cumsum(a.e, axis=ax) + max(n - 1, 0) * U["float32"] * np.cumsum(np.abs(a.v), axis=ax)
        return self.finish(np.cumsum(a.v, axis=ax), a.dt, e, 0, np.cumsum(a.t, axis=ax), np.cumsum(a.ta, axis=ax))

    def matmul(self, a, b):
        (a, b), dt = self.arrays([a, b])
        if not _is_float(dt):
            v = np.matmul(a.v.astype(np.int64), b.v.astype(np.int64)).astype(np.int32)
            bad = bool(np.any(a.e > 0) or np.any(b.e > 0))
            return self.finish(v, dt, np.full(v.shape, INF if bad else 0.0))
        k = a.shape[-1]
        self.work += k + (a.shape[-2] if a.ndim > 1 else 1) + (b.shape[-1] if b.ndim > 1 else 1)
        aa, ab = np.abs(a.v), np.abs(b.v)
        with np.errstate(all="ignore"):
            e = None
            if not self.exact:
                ea = np.where(np.isinf(a.e), 1e300, a.e)
                eb = np.where(np.isinf(b.e), 1e300, b.e)
                e = aa @ eb + ea @ ab + ea @ eb + k * U[dt] * (aa @ ab)
                e = np.where(e >= 1e299, INF, e)
            return self.finish(a.v @ b.v, dt, e, 0, a.v @ b.t + a.t @ b.v, aa @ b.ta + a.ta @ ab)


def run(bind, args, exact: bool = False, tangents=None, floors: bool = False):
    """Evaluate a program on numpy `args` with a fresh Oracle: `bind(jnp_like)` returns the program function
    with `jnp` bound to it (tests/fuzz/check.py execs the program's source). Returns (outputs, the Oracle)."""
    ctx = Oracle(exact, floors)
    program = bind(ctx)
    vals = []
    for k, a in enumerate(args):
        a = np.asarray(a)
        dt = {"f": "float32", "i": "int32", "b": "bool"}[a.dtype.kind]
        if a.dtype == np.float16: dt = "float16"
        t = None if tangents is None else tangents[k]
        vals.append(OVal(ctx, a.astype(np.float64) if dt in U else a, dt, t=t,
                         ta=None if t is None else np.abs(t)))
    outs = program(*vals)
    return tuple(ctx.lift(o) for o in (outs if isinstance(outs, (tuple, list)) else (outs,))), ctx
