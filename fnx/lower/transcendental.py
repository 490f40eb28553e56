"""Instruction selection for transcendentals: EXP2 and LOG2 on float32/float64 become range reduction plus a
polynomial of plain ALU ops, so the loop vectorizer can widen them (a libm call per element cannot be).

exp2(x) = 2^n * 2^f with n = round(x), f in [-1/2, 1/2], 2^f = e^(f ln 2) by its Taylor series; 2^n is applied
as two exponent-field multiplies so results that underflow to subnormals or overflow to inf come out right.
log2(x) = e + log2(m) with m in [sqrt(1/2), sqrt(2)), ln(m) = 2 atanh((m-1)/(m+1)) by its odd series, the
leading part carried in two pieces through the division by ln 2 (as fdlibm's log2). Series lengths give about
1 ulp in each precision; tests/test_transcendental_ulp.py checks that over the whole range.
"""
from __future__ import annotations

import decimal
import math

from fnx import dtypes
from fnx.dtypes import DType
from fnx.rewrite import PatternMatcher, UPat
from fnx.uop import Ops, UOp

# (int dtype of the same width, mantissa bits, exponent bias, clamp for exp2's argument (half of it must stay a
# normal exponent), exp2 series terms, log2 series terms)
_LAYOUT = {dtypes.float32: (dtypes.int32, 23, 127, 200.0, 8, 6),
           dtypes.float64: (dtypes.int64, 52, 1023, 2000.0, 14, 12)}


def _inv_ln2_split(significant_bits: int) -> tuple[float, float]:
    """1/ln 2 as hi (`significant_bits` bits) + lo (the rest, rounded to float64), from 40-digit decimals."""
    with decimal.localcontext() as ctx:
        ctx.prec = 40
        exact = 1 / decimal.Decimal(2).ln()
        hi = math.floor(float(exact) * 2.0 ** (significant_bits - 1)) / 2.0 ** (significant_bits - 1)
        return hi, float(exact - decimal.Decimal(hi))


# per dtype: the mask that keeps log's large part to 12 (float32) or 21 (float64) significant bits, and 1/ln 2 as
# hi + lo with hi short enough that its product with that part is exact
_INV_LN2_SPLIT = {dtypes.float32: (-(1 << 12), *_inv_ln2_split(12)),
                  dtypes.float64: (-(1 << 32), *_inv_ln2_split(32))}


def _c(d: DType, v) -> UOp:
    return UOp.const(d, v)


def _muladd(a: UOp, b: UOp, c: float) -> UOp:
    """a * b + c as one fused multiply-add (an ADD marked "contract": docs/IR.md)."""
    return UOp(Ops.ADD, a.dtype, (a * b, _c(a.dtype, c)), "contract")


def _pow2(n: UOp, d: DType) -> UOp:
    """2^n for an integer n in the normal exponent range, built from the exponent field."""
    int_t, mant, bias = _LAYOUT[d][:3]
    return UOp(Ops.BITCAST, d, ((n + bias).alu(Ops.SHL, mant),))


def _floor(x: UOp) -> UOp:
    t = UOp(Ops.TRUNC, x.dtype, (x,))
    return (x < t).alu(Ops.WHERE, t + -1.0, t)


def exp2(x: UOp) -> UOp | None:
    d = x.dtype
    if d not in _LAYOUT: return None
    int_t, _, _, limit, terms, _ = _LAYOUT[d]
    clamped = x.alu(Ops.MAX, -limit)
    clamped = (_c(d, limit) < clamped).alu(Ops.WHERE, _c(d, limit), clamped)  # NaN falls through
    n = _floor(clamped + 0.5)
    y = (clamped + n * -1.0) * math.log(2)  # |y| <= ln(2)/2
    poly = _c(d, 1.0 / math.factorial(terms - 1))
    for k in range(terms - 2, -1, -1):
        poly = _muladd(poly, y, 1.0 / math.factorial(k))
    n_int = n.cast(int_t)
    half = n_int // 2
    return poly * _pow2(half, d) * _pow2(n_int + half * -1, d)


def log2(x: UOp) -> UOp | None:
    d = x.dtype
    if d not in _LAYOUT: return None
    int_t, mant, bias, _, _, terms = _LAYOUT[d]
    tiny = x < float(2.0 ** (1 - bias))  # subnormal inputs: scale into the normal range first
    scaled = tiny.alu(Ops.WHERE, x * float(2.0 ** mant), x)
    bits = UOp(Ops.BITCAST, int_t, (scaled,))
    exponent = (bits.alu(Ops.SHR, _c(int_t, mant)).alu(Ops.AND, _c(int_t, 2 * bias + 1)) + -bias).cast(d)
    exponent = tiny.alu(Ops.WHERE, exponent + float(-mant), exponent)
    m = UOp(Ops.BITCAST, d, (bits.alu(Ops.AND, _c(int_t, (1 << mant) - 1)).alu(Ops.OR, _c(int_t, bias << mant)),))
    big = _c(d, math.sqrt(2.0)) < m
    m = big.alu(Ops.WHERE, m * 0.5, m)
    exponent = big.alu(Ops.WHERE, exponent + 1.0, exponent)
    # ln(m) = f - hfsq + s (hfsq + R) with f = m - 1 (exact), hfsq = f^2/2, s = f / (2 + f), R = 2 atanh(s)/s - 2:
    # the large part f - hfsq is split into hi (its low bits cleared) + lo, so that hi / ln 2 is exact (fdlibm)
    f = m + -1.0
    s = UOp(Ops.DIV, d, (f, f + 2.0))
    z = s * s
    series = _c(d, 2.0 / (2 * terms - 1))
    for k in range(terms - 2, 0, -1):
        series = _muladd(series, z, 2.0 / (2 * k + 1))
    hfsq = f * f * 0.5
    keep_hi, inv_ln2_hi, inv_ln2_lo = _INV_LN2_SPLIT[d]
    hi = UOp(Ops.BITCAST, d, (UOp(Ops.BITCAST, int_t, (f + hfsq * -1.0,)).alu(Ops.AND, _c(int_t, keep_hi)),))
    lo = (f + hi * -1.0) + hfsq * -1.0 + s * (hfsq + z * series)
    val_hi = hi * inv_ln2_hi
    val_lo = (lo + hi) * inv_ln2_lo + lo * inv_ln2_hi
    total = exponent + val_hi
    result = (val_lo + ((exponent + total * -1.0) + val_hi)) + total
    # special values: log2(0) = -inf, log2(x<0) = nan, log2(inf) = inf, nan stays nan
    result = (x.alu(Ops.CMPNE, 0.0)).alu(Ops.WHERE, result, _c(d, -math.inf))
    result = (x < 0.0).alu(Ops.WHERE, _c(d, math.nan), result)
    result = (x.alu(Ops.CMPNE, math.inf)).alu(Ops.WHERE, result, _c(d, math.inf))
    return x.alu(Ops.CMPNE, x).alu(Ops.WHERE, x, result)


transcendental = PatternMatcher([
    (UPat(Ops.EXP2, src=(UPat.var("x"),)), exp2),
    (UPat(Ops.LOG2, src=(UPat.var("x"),)), log2),
])
