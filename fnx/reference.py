"""What each primitive computes, in numpy: the semantics the interp backend runs and the constant folder
(fnx/lower/symbolic.py) folds with, so a folded constant is what the graph would have computed."""
from __future__ import annotations

import numpy as np

from fnx import dtypes
from fnx.errors import UnsupportedError
from fnx.uop import GroupOp, Ops, UOp


def int_div(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    # C semantics: truncate toward zero; x/0 = -1 and x/-1 = -x (wrapping, so MIN/-1 = MIN) as on XLA's CPU backend
    minus_one = b == np.array(-1).astype(b.dtype) if b.dtype.kind == "i" else np.zeros(b.shape, bool)
    safe = np.where((b == 0) | minus_one, np.array(1, b.dtype), b)
    q = a // safe
    q = np.where((a - q * safe != 0) & ((a < 0) != (safe < 0)), q + np.array(1, a.dtype), q)
    q = np.where(minus_one, np.negative(a) if a.dtype.kind == "i" else a, q)
    return np.where(b == 0, np.array(-1).astype(a.dtype), q).astype(a.dtype)


def int_rem(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    safe = np.where(b == 0, 1, b)
    r = np.fmod(a, safe)
    return np.where(b == 0, a, r).astype(a.dtype)


def shift(a: np.ndarray, b: np.ndarray, left: bool) -> np.ndarray:
    bits = a.dtype.itemsize * 8
    big = (b < 0) | (b >= bits)
    shifted = np.left_shift(a, np.where(big, 0, b)) if left else np.right_shift(a, np.where(big, 0, b))
    overflow = np.zeros_like(a) if left or a.dtype.kind == "u" else np.where(a < 0, -1, 0).astype(a.dtype)
    return np.where(big, overflow, shifted)


def cast(x: np.ndarray, dtype: dtypes.DType) -> np.ndarray:
    if dtype.is_bool: return x != 0
    if dtype.is_int and dtypes.from_numpy(x.dtype).is_float:  # (bfloat16's numpy kind is 'V')
        top = 2.0 ** (8 * dtype.itemsize - (0 if dtype.is_unsigned else 1))  # (dtype.max rounds up to it in float)
        f = np.trunc(np.nan_to_num(x.astype(np.float64), nan=0.0, posinf=top, neginf=dtype.min))
        above = f >= top  # saturating as XLA: NaN -> 0, beyond the range -> its end
        with np.errstate(invalid="ignore"):
            inside = np.clip(np.where(above, 0.0, f), dtype.min, None).astype(dtype.np)
        return np.where(above, np.array(dtype.max, dtype.np), inside)
    if dtype.np.kind == "V" and (x.dtype == np.float64 or (x.dtype.kind in "iu" and x.dtype.itemsize >= 4)):
        return _round_once(x, dtype.np)
    return x.astype(dtype.np)


def _round_once(x: np.ndarray, narrow: np.dtype) -> np.ndarray:
    """float64 or 32/64-bit integers `x` to an ml_dtypes float (bfloat16, the float8s), rounded once: ml_dtypes
    before 0.7 casts them through float32, rounding twice, so a value just past a midpoint of the narrow type can
    land on the midpoint and then round to even, the wrong way. Here float32 is reached by rounding to odd (toward
    zero, the last bit set where anything was dropped), which keeps what nearest rounding to 16 bits or fewer
    needs: float32 has more than two bits beyond them."""
    if x.dtype.kind in "iu":
        wide = x.astype(np.float64)  # exact below 2**53: every 32-bit integer
        if x.dtype.itemsize == 8 and (big := np.abs(wide) >= 2.0 ** 53).any():
            wide[big] = [_odd_float64(int(v)) for v in x[big]]
        x = wide
    y = x.astype(np.float32)
    wide_y = y.astype(np.float64)
    with np.errstate(invalid="ignore"):
        inexact = (wide_y != x) & ~np.isnan(x)
        toward_zero = np.where(np.abs(wide_y) > np.abs(x), np.nextafter(y, np.float32(0)), y)
    odd = (toward_zero.view(np.uint32) | np.uint32(1)).view(np.float32)
    return np.where(inexact, odd, y).astype(narrow)


def _odd_float64(v: int) -> float:
    """Integer `v` (|v| >= 2**53) as a float64 rounded to odd: its top 53 bits, the last one set if any below were
    dropped."""
    a = abs(v)
    drop = a.bit_length() - 53
    top = (a >> drop) | (1 if a & ((1 << drop) - 1) else 0)
    return float(top) * 2.0 ** drop * (1 if v > 0 else -1)


def _float_op(fn):
    def run(x):
        with np.errstate(all="ignore"):
            return fn(x.astype(np.float32) if x.dtype.itemsize < 4 else x).astype(x.dtype)
    return run


UNARY = {Ops.RECIP: _float_op(lambda x: 1 / x), Ops.SQRT: _float_op(np.sqrt), Ops.EXP2: _float_op(np.exp2),
         Ops.LOG2: _float_op(np.log2), Ops.SIN: _float_op(np.sin), Ops.TRUNC: _float_op(np.trunc)}


def binary(op: Ops, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    isint = a.dtype.kind in "iu"
    with np.errstate(all="ignore"):
        if op is Ops.ADD: return np.logical_or(a, b) if a.dtype == np.bool_ else a + b
        if op is Ops.MUL: return np.logical_and(a, b) if a.dtype == np.bool_ else a * b
        if op is Ops.MAX: return np.maximum(a, b)
        if op is Ops.DIV: return int_div(a, b) if isint else a / b
        if op is Ops.MOD: return int_rem(a, b) if isint else np.fmod(a, b)
        if op is Ops.CMPLT: return a < b
        if op is Ops.CMPNE: return a != b
        if op is Ops.AND: return a & b
        if op is Ops.OR: return a | b
        if op is Ops.XOR: return a ^ b
        if op is Ops.SHL: return shift(a, b, True)
        if op is Ops.SHR: return shift(a, b, False)
    raise UnsupportedError(f"interp: no rule for {op}")


def _gather(x: np.ndarray, idx: np.ndarray, axis: int) -> np.ndarray:
    return np.take(x, np.clip(idx, 0, x.shape[axis] - 1), axis=axis)


def _scatter(x: np.ndarray, idx: np.ndarray, upd: np.ndarray, axis: int, mode: str) -> np.ndarray:
    out = x.copy()
    moved, upd_moved = np.moveaxis(out, axis, 0), upd.reshape(x.shape[:axis] + (idx.size,) + x.shape[axis + 1:])
    upd_moved = np.moveaxis(upd_moved, axis, 0)
    for i, target in enumerate(idx.reshape(-1)):  # sequential: later updates win for "set", as on the CPU backend
        if not 0 <= target < x.shape[axis]: continue
        cur = moved[target]
        if mode == "set": moved[target] = upd_moved[i]
        elif mode == "add": moved[target] = cur + upd_moved[i]
        elif mode == "mul": moved[target] = cur * upd_moved[i]
        elif mode == "min": moved[target] = np.minimum(cur, upd_moved[i])
        else: moved[target] = np.maximum(cur, upd_moved[i])
    return out


def _reduce(op: Ops, x: np.ndarray, axes: tuple[int, ...]) -> np.ndarray:
    acc = np.float32 if x.dtype.kind == "V" or x.dtype == np.float16 else x.dtype  # 16-bit floats sum in float32
    if op is Ops.ADD: return np.sum(x, axis=axes, keepdims=True, dtype=acc).astype(x.dtype)
    if op is Ops.MUL: return np.prod(x, axis=axes, keepdims=True, dtype=acc).astype(x.dtype)
    if x.size == 0:
        dtype = dtypes.from_numpy(x.dtype)
        fill = -np.inf if dtype.is_float else dtype.min
        return np.full(tuple(1 if i in axes else s for i, s in enumerate(x.shape)), fill, x.dtype)
    return np.max(x, axis=axes, keepdims=True)


def _movement(u: UOp, x: np.ndarray) -> np.ndarray:
    if u.op is Ops.RESHAPE: return x.reshape(u.arg)
    if u.op is Ops.PERMUTE: return x.transpose(u.arg)
    if u.op is Ops.EXPAND: return np.broadcast_to(x, u.arg)
    if u.op is Ops.PAD: return np.pad(x, u.arg)
    if u.op is Ops.SHRINK: return x[tuple(slice(b, e) for b, e in u.arg)]
    return np.flip(x, axis=tuple(i for i, f in enumerate(u.arg) if f))


def primitive(u: UOp, src: list[np.ndarray]) -> np.ndarray:
    """The value of primitive node `u` (no call, tuple, buffer or control node) given its sources' values."""
    if u.op is Ops.CONST: return np.full(u.shape, u.arg.value, dtype=u.dtype.np)
    if u.op is Ops.IOTA:
        shape, axis = u.arg.shape, u.arg.axis
        index = np.arange(shape[axis], dtype=u.dtype.np).reshape([-1 if i == axis else 1 for i in range(len(shape))])
        return np.broadcast_to(index, shape)
    if u.op in GroupOp.Movement: return _movement(u, src[0])
    if u.op is Ops.INDEX: return _gather(src[0], src[1], u.arg)
    if u.op is Ops.SCATTER: return _scatter(src[0], src[1], src[2], u.arg.axis, u.arg.mode)
    if u.op is Ops.REDUCE: return _reduce(u.arg.op, src[0], u.arg.axes)
    if u.op is Ops.CAST: return cast(src[0], u.dtype)
    if u.op is Ops.BITCAST: return src[0].view(u.dtype.np)
    if u.op is Ops.REAL: return np.real(src[0]).astype(u.dtype.np)
    if u.op is Ops.IMAG: return np.imag(src[0]).astype(u.dtype.np)
    if u.op is Ops.COMPLEX:
        out = np.empty(u.shape, u.dtype.np)
        out.real, out.imag = src[0], src[1]
        return out
    if u.op in UNARY: return UNARY[u.op](src[0])
    if u.op in GroupOp.Binary: return binary(u.op, src[0], src[1])
    if u.op is Ops.WHERE: return np.where(src[0], src[1], src[2])
    if u.op in GroupOp.Marker: return src[0]
    raise UnsupportedError(f"interp: no rule for {u.op}")
