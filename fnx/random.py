"""fnx.random: counter-based pseudo-random numbers with the Threefry-2x32 hash, bit-for-bit like jax.random.

A key is a uint32[2] array. Every sampler hashes a counter per output element with the key, so the same key and
shape give the same numbers eagerly, under `fnx.jit` and on every backend; `split` and `fold_in` derive new keys.
The bits follow JAX 0.10's defaults (`jax_threefry_partitionable=True`, `jax_enable_x64=False` for seeds):

    key = fnx.random.PRNGKey(0)
    key, sub = fnx.random.split(key)
    x = fnx.random.normal(sub, (3, 5))       # equal to jax.random.normal(sub, (3, 5))

Floating-point transforms (the inverse error function behind `normal`, the logarithm behind `gumbel` and
`categorical`, the error function behind `truncated_normal`) are written out operation by operation as XLA's CPU
backend evaluates them for float32, so float32 samples equal JAX's bit for bit.

Departures from jax.random:
  * `key(seed)` returns the same raw uint32[2] key as `PRNGKey(seed)` (fnx has no typed key arrays);
    `key_data` and `wrap_key_data` are identities that check the shape and dtype.
  * Seeds keep only their low 32 bits, as jax.random does with x64 disabled (its default); with x64 enabled JAX puts
    the high 32 bits of a 64-bit seed in the first key word.
  * float64 and int64 are real 64-bit types in fnx (JAX's x64 mode). bits, uniform, randint and bernoulli then
    match JAX with x64 enabled bit for bit; normal, gumbel and truncated_normal in float64 use fnx's own log/erf
    where XLA calls libm (and skip XLA's float64 fused multiply-adds), so they agree to ~1e-15 (normal) to
    ~1e-11 (gumbel, near u = 1) relative. float16 gumbel and truncated_normal differ from JAX in the last bits
    (XLA evaluates those fused 16-bit chains with excess float32 precision); bfloat16 and float16 uniform and
    normal match.
  * The float32 match assumes XLA's CPU code generation on an x86-64 host with FMA, where it contracts
    multiply-adds; fnx emulates those fused multiply-adds through float64 (exact up to ties of probability
    ~2^-29 per operation).
  * `permutation` sorts with a stable bitonic network (fnx has no sort primitive); the result equals JAX's
    (a stable sort by the same random keys), at O(n log^2 n) work.
"""
from __future__ import annotations

import functools
import math
from typing import Any, Sequence

import numpy as np

from fnx import dtypes
from fnx import lax
from fnx import numpy as jnp
from fnx.dtypes import DType
from fnx.errors import at_user_line
from fnx.trace import Array, Traced, eager_op, inline, state, trace

__all__ = ["PRNGKey", "key", "key_data", "wrap_key_data", "threefry_2x32", "split", "fold_in", "bits", "uniform",
           "normal", "truncated_normal", "bernoulli", "randint", "gumbel", "categorical", "permutation", "choice"]

Shape = Sequence[int]

# ---- keys ----


def _u32(value: int) -> np.uint32:
    return np.uint32(value & 0xFFFFFFFF)


def _key_array(key: Any, name: str, batched: bool = False) -> Array:
    """`key` as a uint32[2] Array (uint32[..., 2] when `batched`), or a TypeError naming the sampler."""
    k = key if isinstance(key, Array) else lax.to_array(np.asarray(key))
    if (k.shape[-1:] if batched else k.shape) != (2,) or k.uop.dtype != dtypes.uint32:
        raise TypeError(at_user_line(f"{name}: expected a PRNG key of shape ({'..., ' if batched else ''}2,) and "
                                     f"dtype uint32 (from fnx.random.PRNGKey), got {k.uop.dtype}{list(k.shape)}"))
    return k


@eager_op
def PRNGKey(seed: int | Any) -> Array:
    """A PRNG key (uint32[2]) from an integer seed, equal to `jax.random.PRNGKey(seed)`.

    Args:
      seed: a Python int in the int64 range, or an integer scalar array (traced under jit). Only its low 32 bits
        are used, as in JAX's default (x64 disabled) configuration: the key is `[0, seed mod 2**32]`.

    Returns:
      A uint32 array of shape (2,).

    Example:
      >>> fnx.random.PRNGKey(-1)
      Array([         0, 4294967295], dtype=uint32)
    """
    if isinstance(seed, int):
        if not -2 ** 63 <= seed < 2 ** 63:
            raise OverflowError(at_user_line(f"PRNGKey: seed {seed} does not fit in int64"))
        low = lax.to_array(_u32(seed))
    else:
        s = seed if isinstance(seed, Array) else lax.to_array(np.asarray(seed))
        if s.ndim:
            raise TypeError(at_user_line(f"PRNGKey: the seed must be a scalar, got shape {s.shape}; use vmap"))
        if not s.uop.dtype.is_int:
            raise TypeError(at_user_line(f"PRNGKey: the seed must be an integer, got {s.uop.dtype}"))
        low = lax.convert_element_type(s, dtypes.uint32)
    return jnp.stack([lax.to_array(np.uint32(0)), low])


def key(seed: int | Any) -> Array:
    """A PRNG key from an integer seed. In fnx this is the raw uint32[2] key of `PRNGKey` (JAX returns a typed key
    array holding the same data)."""
    return PRNGKey(seed)


def key_data(keys: Any) -> Array:
    """The uint32 data of a key or an array of keys (the keys themselves in fnx)."""
    return _key_array(keys, "key_data", batched=True)


def wrap_key_data(key_bits_array: Any, *, impl: str | None = None) -> Array:
    """A key from its uint32[2] data (the data itself in fnx; only `impl=None` or 'threefry2x32')."""
    if impl not in (None, "threefry2x32"):
        raise ValueError(at_user_line(f"wrap_key_data: fnx implements only threefry2x32, got impl={impl!r}"))
    return _key_array(key_bits_array, "wrap_key_data", batched=True)


# ---- the Threefry-2x32 hash (Salmon et al. 2011, 20 rounds) ----

_ROTATIONS = ((13, 15, 26, 6), (17, 29, 16, 24))
_KEY_SCHEDULE_PARITY = 0x1BD11BDA


def _rotate_left(x: Array, r: int) -> Array:
    return lax.bitwise_or(lax.shift_left(x, _u32(r)), lax.shift_right(x, _u32(32 - r)))


def _threefry_rounds(k0: Array, k1: Array, x0: Array, x1: Array) -> tuple[Array, Array]:
    """The Threefry-2x32 block cipher on counter words (x0, x1) under key (k0, k1); all uint32, broadcastable."""
    ks = (k0, k1, lax.bitwise_xor(lax.bitwise_xor(k0, k1), _u32(_KEY_SCHEDULE_PARITY)))
    x0, x1 = lax.add(x0, ks[0]), lax.add(x1, ks[1])
    for i in range(5):
        for r in _ROTATIONS[i % 2]:
            x0 = lax.add(x0, x1)
            x1 = lax.bitwise_xor(_rotate_left(x1, r), x0)
        x0 = lax.add(x0, ks[(i + 1) % 3])
        x1 = lax.add(lax.add(x1, ks[(i + 2) % 3]), _u32(i + 1))
    return x0, x1


def _key_words(key: Array) -> tuple[Array, Array]:
    return lax.reshape(lax.slice(key, (0,), (1,)), ()), lax.reshape(lax.slice(key, (1,), (2,)), ())


@eager_op
def threefry_2x32(keypair: Any, count: Any) -> Array:
    """Apply the Threefry-2x32 hash to the uint32 array `count` (as JAX's `threefry_2x32`).

    The flattened counts (padded with a zero to even length) are split in halves that form the two words of each
    block; the hashed halves are concatenated back in order.

    Args:
      keypair: a uint32[2] key.
      count: a uint32 array of any shape.

    Returns:
      A uint32 array of the shape of `count`.

    Example:
      >>> fnx.random.threefry_2x32(np.uint32([0x13198a2e, 0x03707344]), np.uint32([0x243f6a88, 0x85a308d3]))
      Array([3297917596, 1212020640], dtype=uint32)
    """
    k0, k1 = _key_words(_key_array(keypair, "threefry_2x32"))
    counts = lax.to_array(count)
    if counts.uop.dtype != dtypes.uint32:
        raise TypeError(at_user_line(f"threefry_2x32: counts must be uint32, got {counts.uop.dtype}"))
    flat = lax.reshape(counts, (counts.size,))
    odd = counts.size % 2
    if odd: flat = lax.pad(flat, _u32(0), [(0, 1, 0)])
    half = flat.shape[0] // 2
    y0, y1 = _threefry_rounds(k0, k1, lax.slice(flat, (0,), (half,)), lax.slice(flat, (half,), (2 * half,)))
    out = lax.concatenate([y0, y1], 0)
    return lax.reshape(lax.slice(out, (0,), (counts.size,)) if odd else out, counts.shape)


def _hash_iota(key: Array, shape: tuple[int, ...]) -> tuple[Array, Array]:
    """Both hash words for the 64-bit counters 0..size-1 laid out in `shape` (JAX's partitionable scheme)."""
    size = math.prod(shape)
    if size >= 2 ** 32:
        raise NotImplementedError(at_user_line(f"random: {size} values need counters beyond 32 bits"))
    k0, k1 = _key_words(key)
    low = lax.reshape(lax.iota(dtypes.uint32, size), shape) if shape else lax.to_array(_u32(0))
    return _threefry_rounds(k0, k1, lax.full(shape, 0, dtypes.uint32), low)


_UINT = {8: dtypes.uint8, 16: dtypes.uint16, 32: dtypes.uint32, 64: dtypes.uint64}


def _random_bits(key: Array, bit_width: int, shape: tuple[int, ...]) -> Array:
    hi, lo = _hash_iota(key, shape)
    if bit_width == 64:
        wide = lambda x: lax.convert_element_type(x, dtypes.uint64)  # noqa: E731
        return lax.bitwise_or(lax.shift_left(wide(hi), np.uint64(32)), wide(lo))
    return lax.convert_element_type(lax.bitwise_xor(hi, lo), _UINT[bit_width])


_shape = lax.canonical_shape


@eager_op
def split(key: Any, num: int | Shape = 2) -> Array:
    """Split a key into `num` new keys (a leading axis of length num, or a shape of keys).

    Args:
      key: a uint32[2] key.
      num: the number of keys, or a tuple giving the shape of the key array.

    Returns:
      A uint32 array of shape (num, 2) (or (*num, 2)).

    Example:
      >>> key, sub = fnx.random.split(fnx.random.PRNGKey(0))
    """
    k = _key_array(key, "split")
    hi, lo = _hash_iota(k, _shape(num, "split"))
    return jnp.stack([hi, lo], axis=-1)


@eager_op
def fold_in(key: Any, data: Any) -> Array:
    """A new key from `key` and a 32-bit integer `data` (e.g. a step or device index).

    Example:
      >>> step_key = fnx.random.fold_in(fnx.random.PRNGKey(0), 7)
    """
    k = _key_array(key, "fold_in")
    d = data if isinstance(data, Array) else lax.to_array(_u32(int(data)) if isinstance(data, int) else data)
    if d.ndim:
        raise TypeError(at_user_line(f"fold_in: data must be a scalar, got shape {d.shape}; use vmap"))
    k0, k1 = _key_words(k)
    y0, y1 = _threefry_rounds(k0, k1, lax.to_array(_u32(0)), lax.convert_element_type(d, dtypes.uint32))
    return jnp.stack([y0, y1])


@eager_op
def bits(key: Any, shape: Shape = (), dtype: Any = None) -> Array:
    """Uniform random bits as unsigned integers of `dtype` (uint8/16/32/64; default uint32).

    Example:
      >>> fnx.random.bits(fnx.random.PRNGKey(0), (3,))
      Array([4070199207, 4202968722, 1427181096], dtype=uint32)
    """
    dt = dtypes.uint32 if dtype is None else dtypes.to_dtype(dtype)
    if not dt.is_unsigned:
        raise ValueError(at_user_line(f"bits: dtype must be an unsigned integer type, got {dt}"))
    return _random_bits(_key_array(key, "bits"), dt.bits, _shape(shape, "bits"))


# ---- float32 math exactly as XLA's CPU backend evaluates it ----

def _f32(bits_: int) -> float:
    """The float32 with these bits, as a Python float (exact)."""
    return float(np.uint32(bits_).view(np.float32))


def _const(x: Array, value: float) -> Array:
    return lax.full(x.shape, value, x.uop.dtype)


def _select(pred: Array, a: Array | float, b: Array | float, like: Array) -> Array:
    as_array = lambda v: v if isinstance(v, Array) else _const(like, v)  # noqa: E731
    return lax.select(pred, as_array(a), as_array(b))


def _fma(a: Array, b: Array | float, c: Array | float) -> Array:
    """a * b + c rounded once, as the fused multiply-adds XLA:CPU's code generator contracts `p * x + c` into.

    float32: the float64 product of two float32s is exact, leaving the float64 sum's rounding before the float32
    one (this double rounding differs from a true fma only in ties, with probability about 2^-29). float64: plain
    multiply and add (the float64 transforms are not bit-exact anyway).
    """
    if a.uop.dtype != dtypes.float32: return lax.add(lax.mul(a, b), c)
    def wide(v: Array | float) -> Array | float:  # constants are float32 values, like XLA's
        return lax.convert_element_type(v, dtypes.float64) if isinstance(v, Array) else float(np.float32(v))
    return lax.convert_element_type(lax.add(lax.mul(wide(a), wide(b)), wide(c)), dtypes.float32)


def _horner(x: Array, coefficients: Sequence[float]) -> Array:
    """c0*x^n + ... + cn by Horner's rule with fused steps p = fma(p, x, c_i), as XLA:CPU evaluates it."""
    p = _const(x, coefficients[0])
    for c in coefficients[1:]:
        p = _fma(p, x, c)
    return p


# Cephes logf: log(m) for m in [sqrt(1/2), sqrt(2)) as x - x^2/2 + x^3 P(x), P in three interleaved chains
_LOG_CHAINS = ((0x3D9021BB, 0xBDEBD1B8, 0x3DEF251A), (0xBDFE5D4F, 0x3E11E9BF, 0xBE2AAE50),
               (0x3E4CCEAC, 0xBE7FFFFC, 0x3EAAAAAA))
_LN2_LO, _LN2_HI = 0xB95E8083, 0x3F318000


def _log_f32(y: Array) -> Array:
    """Natural log of float32 `y` as XLA:CPU computes it (Cephes range reduction and polynomial)."""
    i32, u32 = dtypes.int32, dtypes.uint32
    clamped = _select(lax.lt(_f32(0x00800000), y), y, _f32(0x00800000), y)  # subnormals and NaN -> FLT_MIN
    word = lax.bitcast_convert_type(clamped, u32)
    exponent = lax.convert_element_type(
        lax.sub(lax.convert_element_type(lax.shift_right(word, _u32(23)), i32), np.int32(127)), dtypes.float32)
    mantissa = lax.bitcast_convert_type(lax.bitwise_or(lax.bitwise_and(word, _u32(0x807FFFFF)), _u32(0x3F000000)),
                                        dtypes.float32)  # in [1/2, 1)
    small = lax.lt(mantissa, _f32(0x3F3504F3))
    x = lax.add(lax.add(mantissa, -1.0), _select(small, mantissa, 0.0, y))
    e = lax.sub(lax.add(exponent, 1.0), _select(small, 1.0, 0.0, y))
    z = lax.mul(x, x)
    z3 = lax.mul(z, x)
    a, b, c = (_fma(_fma(x, _f32(c0), _f32(c1)), x, _f32(c2)) for c0, c1, c2 in _LOG_CHAINS)
    tail = _fma(_fma(_fma(a, z3, b), z3, c), z3, lax.mul(e, _f32(_LN2_LO)))
    out = lax.add(lax.add(lax.sub(x, lax.mul(z, 0.5)), tail), lax.mul(e, _f32(_LN2_HI)))
    out = _select(lax.lt(0.0, y), out, math.nan, y)
    out = _select(lax.ne(y, 0.0), out, -math.inf, y)
    return _select(lax.ne(y, math.inf), out, math.inf, y)


# Cephes log1p: log1p(a) = a - a^2/2 + a^3 P(a)/Q(a) for |a| < sqrt(2) - 1
_LOG1P_P = (4.5270000862445199635e-5, 4.9854102823193375972e-1, 6.5787325942061044846e0, 2.9911919328553073277e1,
            6.0949667980987787057e1, 5.7112963590585538103e1, 2.0039553499201281259e1)
_LOG1P_Q = (1.0, 1.5062909083469192043e1, 8.3047565967967209469e1, 2.2176239823732856465e2,
            3.0909872225312059774e2, 2.1642788614495947685e2, 6.0118660497603843919e1)
_LOG1P_SMALL = {dtypes.float32: _f32(0x3ED413CD), dtypes.float64: float.fromhex("0x1.a827999fcef32p-2")}


def _log(x: Array) -> Array:
    """jnp.log as XLA:CPU computes it for float32 (float64: fnx's log; 16-bit floats go through float32)."""
    d = x.uop.dtype
    if d == dtypes.float64: return jnp.log(x)
    if d != dtypes.float32: return lax.convert_element_type(_log(lax.convert_element_type(x, dtypes.float32)), d)
    return _log_f32(x)


def _log1p(a: Array) -> Array:
    """jnp.log1p as XLA:CPU computes it: the Cephes rational form near 0, else log(1 + a)."""
    d = a.uop.dtype
    if d not in _LOG1P_SMALL:
        return lax.convert_element_type(_log1p(lax.convert_element_type(a, dtypes.float32)), d)
    a2 = lax.mul(a, a)
    ratio = lax.div(_horner(a, _LOG1P_P), _horner(a, _LOG1P_Q))
    near_zero = lax.add(a, lax.add(lax.mul(a2, -0.5), lax.mul(lax.mul(a, a2), ratio)))
    return _select(lax.lt(jnp.abs(a), _LOG1P_SMALL[d]), near_zero, _log(lax.add(a, 1.0)), a)


# Giles, "Approximating the erfinv function" (GPU Computing Gems, 2011): single precision, w = -log(1 - x^2)
_ERFINV_F32 = ((5.0, 2.5, (2.81022636e-08, 3.43273939e-07, -3.5233877e-06, -4.39150654e-06, 0.00021858087,
                           -0.00125372503, -0.00417768164, 0.246640727, 1.50140941)),
               (math.inf, 3.0, (-0.000200214257, 0.000100950558, 0.00134934322, -0.00367342844, 0.00573950773,
                                -0.0076224613, 0.00943887047, 1.00167406, 2.83297682)))
# double precision: three pieces, w - 3.125 below 6.25 and sqrt(w) - 3.25 / sqrt(w) - 5 above
_ERFINV_F64 = (
    (6.25, 3.125, (-3.6444120640178196996e-21, -1.685059138182016589e-19, 1.2858480715256400167e-18,
                   1.115787767802518096e-17, -1.333171662854620906e-16, 2.0972767875968561637e-17,
                   6.6376381343583238325e-15, -4.0545662729752068639e-14, -8.1519341976054721522e-14,
                   2.6335093153082322977e-12, -1.2975133253453532498e-11, -5.4154120542946279317e-11,
                   1.051212273321532285e-09, -4.1126339803469836976e-09, -2.9070369957882005086e-08,
                   4.2347877827932403518e-07, -1.3654692000834678645e-06, -1.3882523362786468719e-05,
                   0.0001867342080340571352, -0.00074070253416626697512, -0.0060336708714301490533,
                   0.24015818242558961693, 1.6536545626831027356)),
    (16.0, 3.25, (2.2137376921775787049e-09, 9.0756561938885390979e-08, -2.7517406297064545428e-07,
                  1.8239629214389227755e-08, 1.5027403968909827627e-06, -4.013867526981545969e-06,
                  2.9234449089955446044e-06, 1.2475304481671778723e-05, -4.7318229009055733981e-05,
                  6.8284851459573175448e-05, 2.4031110387097893999e-05, -0.0003550375203628474796,
                  0.00095328937973738049703, -0.0016882755560235047313, 0.0024914420961078508066,
                  -0.0037512085075692412107, 0.005370914553590063617, 1.0052589676941592334,
                  3.0838856104922207635)),
    (math.inf, 5.0, (-2.7109920616438573243e-11, -2.5556418169965252055e-10, 1.5076572693500548083e-09,
                     -3.7894654401267369937e-09, 7.6157012080783393804e-09, -1.4960026627149240478e-08,
                     2.9147953450901080826e-08, -6.7711997758452339498e-08, 2.2900482228026654717e-07,
                     -9.9298272942317002539e-07, 4.5260625972231537039e-06, -1.9681778105531670567e-05,
                     7.5995277030017761139e-05, -0.00021503011930044477347, -0.00013871931833623122026,
                     1.0103004648645343977, 4.8499064014085844221)))


def _erf_inv(x: Array) -> Array:
    """Inverse error function: Giles' piecewise polynomials in w = -log1p(-x^2), evaluated as XLA does.

    The pieces share one Horner loop whose coefficients are selected per element by w's piece; the longer pieces
    (lower w) run their extra steps only where they are active, like XLA's ErfInv.
    """
    d = x.uop.dtype
    if d not in (dtypes.float32, dtypes.float64):
        return lax.convert_element_type(_erf_inv(lax.convert_element_type(x, dtypes.float32)), d)
    pieces = _ERFINV_F32 if d == dtypes.float32 else _ERFINV_F64
    w = lax.neg(_log1p(lax.mul(x, lax.neg(x))))
    in_piece = [lax.lt(w, bound) for bound, _, _ in pieces[:-1]]  # first matching piece wins
    sqrt_w = lax.sqrt(w)

    def by_piece(values: Sequence[Any]) -> Array:
        out = values[-1] if isinstance(values[-1], Array) else _const(x, values[-1])
        for pred, v in zip(reversed(in_piece), reversed(values[:-1])):
            out = _select(pred, v, out, x)
        return out

    shifts = [lax.sub(w, shift) if i == 0 else lax.sub(sqrt_w, shift) for i, (_, shift, _) in enumerate(pieces)]
    t = by_piece(shifts)
    coefficients = [c for _, _, c in pieces]
    p = by_piece([c[0] for c in coefficients])
    for i in range(1, max(len(c) for c in coefficients)):  # Horner; a piece that has run out keeps its value
        active = [i < len(c) for c in coefficients]
        updated = _fma(p, t, by_piece([c[i] if ok else 0.0 for c, ok in zip(coefficients, active)]))
        p = updated if all(active) else by_piece([updated if ok else p for ok in active])
    result = lax.mul(p, x)
    return _select(lax.ne(jnp.abs(x), 1.0), result, lax.mul(x, math.inf), x)


# erf(x) = x P(x^2) / Q(x^2) on |x| < 3.8325, +-1 beyond (XLA:CPU's float32 erf, with fused multiply-adds)
_ERF_P = (0x39702D51, 0x3B5F5DA2, 0x3D50B6EB, 0x3E3DA740, 0x3F906EBA)
_ERF_Q = (0xB3FD3906, 0x37C588DF, 0x3A856D28, 0x3C6687D4, 0x3DE34C21, 0x3EFEB44A, 0x3F800000)


def _erf(x: Array) -> Array:
    """The error function: XLA:CPU's float32 rational form; float64 by the everywhere-positive series
    erf(x) = 2/sqrt(pi) exp(-x^2) sum_n 2^n x^(2n+1) / (2n+1)!! (fnx's exp, so a few ulp from libm's erf)."""
    d = x.uop.dtype
    if d == dtypes.float64: return _erf_f64(x)
    if d != dtypes.float32: return lax.convert_element_type(_erf(lax.convert_element_type(x, dtypes.float32)), d)
    x2 = lax.mul(x, x)

    def poly(coefficients: Sequence[int]) -> Array:
        p = _fma(x2, _f32(coefficients[0]), _f32(coefficients[1]))
        for c in coefficients[2:]: p = _fma(x2, p, _f32(c))
        return p

    ratio = lax.div(lax.mul(x, poly(_ERF_P)), poly(_ERF_Q))
    saturated = _select(lax.lt(x, 0.0), -1.0, 1.0, x)
    return _select(lax.lt(jnp.abs(x), _f32(0x407547CB)), ratio, saturated, x)


def _erf_f64(x: Array) -> Array:
    clipped = jnp.clip(x, -6.0, 6.0)  # erf(6) rounds to 1 in float64
    x2 = lax.mul(clipped, clipped)
    term, total = clipped, clipped
    for n in range(1, 160):  # terms peak near n = x^2 <= 36 and fall below 2^-60 of the sum by n ~ 150
        term = lax.mul(term, lax.mul(x2, 2.0 / (2 * n + 1)))
        total = lax.add(total, term)
    out = lax.mul(lax.mul(total, jnp.exp(lax.neg(x2))), 2.0 / math.sqrt(math.pi))
    return jnp.clip(out, -1.0, 1.0)


def _nextafter(x: Array, up: bool) -> Array:
    """The next float after x toward +inf (up) or -inf, as numpy.nextafter; infinities toward themselves stay."""
    d = x.uop.dtype
    int_t = {2: dtypes.int16, 4: dtypes.int32, 8: dtypes.int64}[d.itemsize]
    word = lax.bitcast_convert_type(x, int_t)
    step = lax.full(x.shape, 1, int_t)
    away_from_zero = lax.lt(0.0, x) if up else lax.lt(x, 0.0)
    moved = lax.bitcast_convert_type(lax.select(away_from_zero, lax.add(word, step), lax.sub(word, step)), d)
    tiny = _const(x, float(np.array(1, int_t.np).view(d.np)) * (1.0 if up else -1.0))
    out = lax.select(lax.ne(x, 0.0), moved, tiny)
    limit = math.inf if up else -math.inf
    return lax.select(lax.bitwise_or(lax.ne(x, x), lax.bitwise_xor(lax.ne(x, limit), True)), x, out)


# ---- samplers ----

def _float_dtype(dtype: Any, name: str) -> DType:
    dt = dtypes.float32 if dtype is None else dtypes.to_dtype(dtype)
    if not dt.is_float:
        raise ValueError(at_user_line(f"{name}: dtype must be a float dtype, got {dt}"))
    return dt


def _broadcast_to_rank(x: Array, rank: int) -> Array:
    return lax.reshape(x, (1,) * (rank - x.ndim) + x.shape) if x.ndim < rank else x


def _check_shape(name: str, shape: tuple[int, ...], *param_shapes: tuple[int, ...]) -> None:
    if param_shapes and jnp.broadcast_shapes(shape, *param_shapes) != shape:
        raise ValueError(at_user_line(f"{name}: parameter shapes {param_shapes} do not broadcast to the requested "
                                      f"shape {shape}"))


def _uniform(key: Array, shape: tuple[int, ...], dt: DType, minval: Any, maxval: Any) -> Array:
    info = dtypes.finfo(dt.np)
    nbits, nmant = dt.bits, int(info.nmant)
    lo, hi = (lax.convert_element_type(lax.to_array(v), dt) for v in (minval, maxval))
    _check_shape("uniform", shape, lo.shape, hi.shape)
    rng_bits = nbits if nmant >= 8 else 8  # bfloat16 has 7 mantissa bits: a byte of randomness suffices
    raw = lax.convert_element_type(_random_bits(key, rng_bits, shape), _UINT[nbits])
    one_bits = int(np.array(1.0, dt.np).view(_UINT[nbits].np))
    mantissa = lax.bitwise_or(lax.shift_right(raw, _UINT[nbits].np.type(rng_bits - nmant)),
                              _UINT[nbits].np.type(one_bits))
    floats = lax.sub(lax.bitcast_convert_type(mantissa, dt), np.array(1.0, dt.np))
    lo, hi = _broadcast_to_rank(lo, len(shape)), _broadcast_to_rank(hi, len(shape))
    span = jnp.broadcast_to(jnp.subtract(hi, lo), shape)
    return jnp.maximum(lo, _fma(floats, span, jnp.broadcast_to(lo, shape)))


@eager_op
def uniform(key: Any, shape: Shape = (), dtype: Any = None, minval: Any = 0.0, maxval: Any = 1.0) -> Array:
    """Uniform floats in [minval, maxval).

    The mantissa of a float in [1, 2) is filled with random bits, 1 is subtracted, and the result is scaled.

    Args:
      key: a PRNG key.
      shape: the result shape.
      dtype: a float dtype (default float32).
      minval, maxval: bounds, broadcastable to `shape`.

    Returns:
      An array of `shape` and `dtype`.

    Example:
      >>> fnx.random.uniform(fnx.random.PRNGKey(0), (2,))
      Array([0.947667  , 0.9785799 ], dtype=float32)
    """
    dt = _float_dtype(dtype, "uniform")
    return _uniform(_key_array(key, "uniform"), _shape(shape, "uniform"), dt, minval, maxval)


def _normal(key: Array, shape: tuple[int, ...], dt: DType) -> Array:
    lowest = -(1.0 - float(dtypes.finfo(dt.np).epsneg))  # the float after -1 toward 0: erfinv stays finite
    u = _uniform(key, shape, dt, lowest, 1.0)
    return lax.mul(np.array(math.sqrt(2), dt.np), _erf_inv(u))


@eager_op
def normal(key: Any, shape: Shape = (), dtype: Any = None) -> Array:
    """Standard normal samples, sqrt(2) * erfinv(u) for u uniform in (-1, 1).

    Args:
      key: a PRNG key.
      shape: the result shape.
      dtype: a float dtype (default float32).

    Returns:
      An array of `shape` and `dtype`.

    Example:
      >>> fnx.random.normal(fnx.random.PRNGKey(0), (3,))
      Array([ 1.6226422 ,  2.0252647 , -0.43359444], dtype=float32)
    """
    dt = _float_dtype(dtype, "normal")
    return _normal(_key_array(key, "normal"), _shape(shape, "normal"), dt)


@eager_op
def truncated_normal(key: Any, lower: Any, upper: Any, shape: Shape | None = None, dtype: Any = None) -> Array:
    """Standard normal samples conditioned on lower < x < upper (inverse-CDF sampling).

    Args:
      key: a PRNG key.
      lower, upper: bounds (floats or arrays), broadcastable to `shape`.
      shape: the result shape (default: the broadcast shape of lower and upper).
      dtype: a float dtype (default float32).

    Returns:
      An array in the open interval (lower, upper).

    Example:
      >>> x = fnx.random.truncated_normal(fnx.random.PRNGKey(0), -1.0, 2.0, (4,))
    """
    dt = _float_dtype(dtype, "truncated_normal")
    k = _key_array(key, "truncated_normal")
    lo, hi = (lax.convert_element_type(lax.to_array(v), dt) for v in (lower, upper))
    shape = jnp.broadcast_shapes(lo.shape, hi.shape) if shape is None else _shape(shape, "truncated_normal")
    _check_shape("truncated_normal", shape, lo.shape, hi.shape)
    sqrt2 = np.array(math.sqrt(2), dt.np)
    inv_sqrt2 = np.array(1, dt.np) / sqrt2  # XLA turns the division by a constant into this multiplication
    a, b = _erf(lax.mul(lo, inv_sqrt2)), _erf(lax.mul(hi, inv_sqrt2))
    out = lax.mul(sqrt2, _erf_inv(_uniform(k, shape, dt, a, b)))
    return jnp.clip(out, _nextafter(lo, True), _nextafter(hi, False))


@eager_op
def bernoulli(key: Any, p: Any = 0.5, shape: Shape | None = None) -> Array:
    """Booleans that are True with probability `p` (uniform(key, shape, p.dtype) < p).

    Example:
      >>> fnx.random.bernoulli(fnx.random.PRNGKey(0), 0.3, (4,))
    """
    prob = lax.to_array(p)
    if not prob.uop.dtype.is_float:
        raise TypeError(at_user_line(f"bernoulli: the probability p must be a float, got {prob.uop.dtype}"))
    shape = prob.shape if shape is None else _shape(shape, "bernoulli")
    _check_shape("bernoulli", shape, prob.shape)
    u = _uniform(_key_array(key, "bernoulli"), shape, prob.uop.dtype, 0.0, 1.0)
    return jnp.less(u, lax.convert_element_type(prob, prob.uop.dtype))


def _clip_convert(x: Array, dt: DType) -> Array:
    """Convert integers to `dt`, saturating at its range instead of wrapping."""
    src = dtypes.iinfo(x.uop.dtype.np)
    dst = dtypes.iinfo(dt.np)
    lo, hi = max(int(dst.min), int(src.min)), min(int(dst.max), int(src.max))
    clipped = jnp.clip(x, x.uop.dtype.np.type(lo), x.uop.dtype.np.type(hi))
    return lax.convert_element_type(clipped, dt)


def _int_operand(v: Any) -> Array:
    a = lax.to_array(v)
    if not a.uop.dtype.is_int: a = lax.convert_element_type(a, dtypes.int32)
    return lax.convert_element_type(a, a.uop.dtype)  # drop weak typing: the operand keeps its own width


def _randint(key: Array, shape: tuple[int, ...], minval: Array, maxval: Array, dt: DType) -> Array:
    _check_shape("randint", shape, minval.shape, maxval.shape)
    nbits = dt.bits
    unsigned = _UINT[nbits]
    dt_max = lax.convert_element_type(lax.to_array(dt.np.type(dtypes.iinfo(dt.np).max)), dt)
    maxval_out_of_range = jnp.greater(maxval, _clip_convert(dt_max, maxval.uop.dtype))
    lo, hi = _clip_convert(minval, dt), _clip_convert(maxval, dt)
    keys = split(key)
    higher, lower = (_random_bits(lax.reshape(lax.slice(keys, (i, 0), (i + 1, 2)), (2,)), nbits, shape)
                     for i in (0, 1))
    lo, hi, maxval_out_of_range = (jnp.broadcast_to(v, shape) for v in (lo, hi, maxval_out_of_range))
    span = lax.convert_element_type(lax.sub(hi, lo), unsigned)
    span = jnp.where(jnp.less_equal(hi, lo), unsigned.np.type(1), span)  # an empty range returns minval
    span = jnp.where(jnp.logical_and(maxval_out_of_range, jnp.greater(hi, lo)), span + unsigned.np.type(1), span)
    # (higher * 2^nbits + lower) mod span without overflow: 2^nbits mod span = (2^(nbits/2) mod span)^2 mod span
    multiplier = lax.rem(lax.full(shape, 2 ** (nbits // 2), unsigned), span)
    multiplier = lax.rem(lax.mul(multiplier, multiplier), span)
    offset = lax.add(lax.mul(lax.rem(higher, span), multiplier), lax.rem(lower, span))
    return lax.add(lo, lax.convert_element_type(lax.rem(offset, span), dt))


@eager_op
def randint(key: Any, shape: Shape, minval: Any, maxval: Any, dtype: Any = None) -> Array:
    """Uniform integers in [minval, maxval).

    Two words of random bits per value are reduced modulo the span, as JAX does (the bias is small unless the span
    is close to 2^nbits); 8- and 16-bit dtypes sample in int32.

    Args:
      key: a PRNG key.
      shape: the result shape.
      minval, maxval: integer bounds broadcastable to `shape`.
      dtype: an integer dtype (default int32).

    Returns:
      An array of `shape` and `dtype`.

    Example:
      >>> fnx.random.randint(fnx.random.PRNGKey(0), (4,), 0, 10)
    """
    dt = dtypes.int32 if dtype is None else dtypes.to_dtype(dtype)
    if not dt.is_int:
        raise TypeError(at_user_line(f"randint: dtype must be an integer dtype, got {dt}"))
    k, shape = _key_array(key, "randint"), _shape(shape, "randint")
    lo, hi = _int_operand(minval), _int_operand(maxval)
    if dt.bits < 32:
        info = dtypes.iinfo(dt.np)
        i32 = lambda v: lax.convert_element_type(v, dtypes.int32)  # noqa: E731
        lo = jnp.clip(i32(lo), np.int32(info.min), np.int32(info.max))
        hi = jnp.clip(i32(hi), np.int32(info.min), np.int32(int(info.max) + 1))
        return lax.convert_element_type(_randint(k, shape, lo, hi, dtypes.int32), dt)
    return _randint(k, shape, lo, hi, dt)


def _gumbel(key: Array, shape: tuple[int, ...], dt: DType, mode: str) -> Array:
    info = dtypes.finfo(dt.np)
    if mode == "high":
        both = _uniform(key, (2,) + shape, dt, 0.0, 1.0)
        high, low = (lax.reshape(lax.slice(both, (i,) + (0,) * len(shape), (i + 1,) + shape), shape) for i in (0, 1))
        refined = lax.add(lax.add(high, lax.mul(low, float(2.0 ** -int(info.nmant)))), float(info.tiny))
        x = jnp.where(jnp.greater_equal(high, 0.5), high, refined)
        return lax.neg(_log(lax.neg(_log1p(lax.neg(x)))))
    u = _uniform(key, shape, dt, float(info.tiny), 1.0)
    return lax.neg(_log(lax.neg(_log(u))))


@eager_op
def gumbel(key: Any, shape: Shape = (), dtype: Any = None, mode: str = "low") -> Array:
    """Standard Gumbel samples, -log(-log(u)).

    Args:
      key: a PRNG key.
      shape: the result shape.
      dtype: a float dtype (default float32).
      mode: "low" (one uniform per sample) or "high" (two, for a larger dynamic range).

    Example:
      >>> g = fnx.random.gumbel(fnx.random.PRNGKey(0), (3,))
    """
    if mode not in ("low", "high"):
        raise ValueError(at_user_line(f"gumbel: mode must be 'low' or 'high', got {mode!r}"))
    return _gumbel(_key_array(key, "gumbel"), _shape(shape, "gumbel"), _float_dtype(dtype, "gumbel"), mode)


@eager_op
def categorical(key: Any, logits: Any, axis: int = -1, shape: Shape | None = None, replace: bool = True,
                mode: str = "low") -> Array:
    """Samples from categorical distributions given unnormalized log-probabilities (the Gumbel-max trick).

    Args:
      key: a PRNG key.
      logits: log-probabilities up to a constant; `axis` indexes the categories.
      axis: the category axis.
      shape: the result shape; must end with the batch shape (logits.shape without `axis`). Default: that shape.
      replace: sample with replacement (True) or without (False: the Gumbel top-k trick).
      mode: the Gumbel sampler's mode ("low" or "high").

    Returns:
      int32 indices of `shape`.

    Example:
      >>> fnx.random.categorical(fnx.random.PRNGKey(0), jnp.log(jnp.array([0.2, 0.8])), shape=(5,))
    """
    k = _key_array(key, "categorical")
    lg = lax.to_array(logits)
    if not lg.uop.dtype.is_float: lg = lax.convert_element_type(lg, dtypes.float32)
    axis = axis % lg.ndim
    batch_shape = lg.shape[:axis] + lg.shape[axis + 1:]
    shape = batch_shape if shape is None else _shape(shape, "categorical")
    _check_shape("categorical", shape, batch_shape)
    prefix = shape[:len(shape) - len(batch_shape)]
    if replace:
        sample_shape = prefix + shape[len(prefix):len(prefix) + axis] + (lg.shape[axis],) + shape[len(prefix) + axis:]
        noisy = jnp.add(_gumbel(k, sample_shape, lg.uop.dtype, mode), lax.reshape(lg, (1,) * len(prefix) + lg.shape))
        return jnp.argmax(noisy, axis=len(prefix) + axis)
    n = lg.shape[axis]
    draws = math.prod(prefix)
    if draws > n:
        raise ValueError(at_user_line(f"categorical: {draws} samples without replacement exceed {n} categories"))
    noisy = jnp.moveaxis(jnp.add(lg, _gumbel(k, lg.shape, lg.uop.dtype, mode)), axis, -1)
    top = lax.slice_in_dim(_stable_argsort(lax.neg(noisy), noisy.ndim - 1), 0, draws, axis=-1)
    return jnp.moveaxis(top, -1, 0).reshape(shape)


# ---- permutations: a stable bitonic sorting network ----

def _stable_argsort(keys: Array, axis: int) -> Array:
    """The int32 permutation that stably sorts `keys` along `axis` (ascending; equal keys keep their order)."""
    moved = jnp.moveaxis(keys, axis, -1)
    traced = _argsort_network(moved.shape, moved.uop.dtype, moved.uop.device or state.default_device)
    return jnp.moveaxis(Array(inline(traced, list(traced.body.src), [moved])[0]), -1, axis)


@functools.lru_cache(maxsize=64)
def _argsort_network(shape: tuple[int, ...], dtype: DType, device: str) -> Traced:
    """The sorting network for keys of one shape and dtype on one device (its tables live there), traced once:
    traced anew, its scan's body got a new tag every call, so each eager permutation was a new graph compiled
    again (0.45 s for 2,000 elements)."""
    previous, state.default_device = state.default_device, device
    try:
        return trace(_last_axis_argsort, (np.zeros(shape, dtype.np),), device=device, avals=[(shape, dtype, False)],
                     transform=True, abstract=True, kind="the sorting network of random.permutation")
    finally:
        state.default_device = previous


def _last_axis_argsort(keys: Array) -> Array:
    """`_stable_argsort` along the last axis.

    A bitonic network over (key, index) pairs, padded to a power of two with pairs that sort last: the pairs are
    distinct, so the network's result is the unique stable order. The stages run as a scan over their (width,
    half) of one compare-exchange body.
    """
    moved = keys
    n = moved.shape[-1]
    size = 1 << max(n - 1, 0).bit_length()
    batch = moved.shape[:-1]
    index = lax.broadcasted_iota(dtypes.int32, moved.shape, moved.ndim - 1)
    if size != n:
        pad = [(0, 0, 0)] * len(batch) + [(0, size - n, 0)]
        top = np.array(np.iinfo(keys.dtype).max if moved.uop.dtype.is_int else np.inf, keys.dtype)
        moved = lax.pad(moved, top, pad)
        index = lax.pad(index, np.int32(size), pad)  # padding sorts after every real pair: larger index
        index = jnp.where(lax.broadcasted_iota(dtypes.int32, index.shape, index.ndim - 1) < n, index, np.int32(size))
    stages = [(width, half) for width in (1 << b for b in range(1, size.bit_length()))
              for half in (width >> j for j in range(1, width.bit_length()))]
    if stages:  # one compiled stage run by a loop: a network of 66 stages was 66 kernels to build and compile
        widths, halves = (jnp.asarray(np.array(column, np.int32)) for column in zip(*stages))
        position = lax.broadcasted_iota(dtypes.int32, moved.shape, moved.ndim - 1)
        (moved, index), _ = lax.scan(lambda carry, stage: (_compare_exchange(*carry, position, *stage), None),
                                     (moved, index), (widths, halves))
    return lax.slice_in_dim(index, 0, n, axis=-1) if size != n else index


def _compare_exchange(keys: Array, index: Array, position: Array, width: Array, half: Array) -> tuple[Array, Array]:
    """One bitonic stage on (key, index) pairs along the last axis: element p meets p ^ half; inside a run of
    `width` elements that ascends (p & width == 0) the lower position keeps the smaller pair, else the larger.
    Written with a gather of the partner, so every stage has the same shapes and one compiled body runs them all."""
    partner = jnp.bitwise_xor(position, half)
    other_key, other_index = jnp.take_along_axis(keys, partner, -1), jnp.take_along_axis(index, partner, -1)
    partner_first = jnp.logical_or(jnp.less(other_key, keys),
                                   jnp.logical_and(jnp.equal(other_key, keys), jnp.less(other_index, index)))
    keep_smaller = jnp.equal(jnp.less(position, partner), jnp.equal(jnp.bitwise_and(position, width), 0))
    take = jnp.where(keep_smaller, partner_first, jnp.logical_not(partner_first))
    return jnp.where(take, other_key, keys), jnp.where(take, other_index, index)


def _shuffle(key: Array, x: Array, axis: int) -> Array:
    # JAX's rounds: enough 32-bit sort keys that a collision among x.size elements is unlikely (exponent 3)
    rounds = int(np.ceil(3 * np.log(max(1, x.size)) / np.log(np.iinfo(np.uint32).max)))
    for _ in range(rounds):
        keys = split(key)
        key, subkey = (lax.reshape(lax.slice(keys, (j, 0), (j + 1, 2)), (2,)) for j in (0, 1))
        order = _stable_argsort(_random_bits(subkey, 32, x.shape), axis)
        x = jnp.take_along_axis(x, order, axis)
    return x


@eager_op
def permutation(key: Any, x: int | Any, axis: int = 0, independent: bool = False) -> Array:
    """A random permutation of `x` along `axis` (or of arange(x) for an integer x).

    Elements are sorted by fresh random 32-bit keys (once for up to ~1600 elements, then twice), exactly as JAX.

    Args:
      key: a PRNG key.
      x: an int n (permute arange(n)) or an array.
      axis: the axis to shuffle.
      independent: shuffle every slice along `axis` independently.

    Example:
      >>> fnx.random.permutation(fnx.random.PRNGKey(0), 5)
    """
    k = _key_array(key, "permutation")
    if isinstance(x, (int, np.integer)) or (not isinstance(x, Array) and np.ndim(x) == 0):
        return _shuffle(k, jnp.arange(int(x)), 0)
    arr = lax.to_array(x)
    if arr.ndim == 0:
        raise TypeError(at_user_line("permutation: x must be an integer or at least 1-dimensional"))
    axis = axis % arr.ndim
    if independent or arr.ndim == 1:
        return _shuffle(k, arr, axis)
    return jnp.take(arr, _shuffle(k, jnp.arange(arr.shape[axis]), 0), axis=axis)


@eager_op
def choice(key: Any, a: int | Any, shape: Shape = (), replace: bool = True, p: Any = None, axis: int = 0) -> Array:
    """A random sample from the elements of `a` (or arange(a)) along `axis`.

    Args:
      key: a PRNG key.
      a: an int n or an array.
      shape: the sample shape.
      replace: sample with replacement.
      p: optional probabilities of the entries (1-D, length a.shape[axis]).
      axis: the axis of `a` to sample along.

    Example:
      >>> fnx.random.choice(fnx.random.PRNGKey(0), 10, (3,), replace=False)
    """
    k = _key_array(key, "choice")
    shape = _shape(shape, "choice")
    arr = lax.to_array(a)
    n = int(np.asarray(a)) if arr.ndim == 0 else arr.shape[axis % arr.ndim]
    axis = axis % arr.ndim if arr.ndim else 0
    draws = math.prod(shape)
    if draws == 0: return jnp.zeros(shape, arr.dtype)
    if n <= 0: raise ValueError(at_user_line("choice: a must be greater than 0 unless no samples are taken"))
    if not replace and draws > n:
        raise ValueError(at_user_line(f"choice: cannot take {draws} samples from {n} without replacement"))
    if p is None and replace:
        ind = randint(k, shape, 0, n)
    elif p is None:
        perm = permutation(k, n if arr.ndim == 0 else arr, axis)
        flat = lax.slice_in_dim(perm, 0, draws, axis=axis)
        out_shape = shape if arr.ndim == 0 else arr.shape[:axis] + shape + arr.shape[axis + 1:]
        return lax.reshape(flat, out_shape)
    else:
        probs = lax.to_array(p)
        probs = probs if probs.uop.dtype.is_float else lax.convert_element_type(probs, dtypes.float32)
        if probs.shape != (n,):
            raise ValueError(at_user_line(f"choice: p must have shape ({n},), got {probs.shape}"))
        if replace:
            cumulative = jnp.cumsum(probs)
            total = lax.reshape(lax.slice(cumulative, (n - 1,), (n,)), ())
            r = jnp.multiply(total, jnp.subtract(1.0, _uniform(k, shape, probs.uop.dtype, 0.0, 1.0)))
            below = jnp.less(lax.reshape(cumulative, (1,) * len(shape) + (n,)), jnp.expand_dims(r, -1))
            ind = jnp.sum(below.astype(np.int32), axis=-1).astype(np.int32)  # searchsorted(cumulative, r)
        else:
            noisy = jnp.add(_gumbel(k, (n,), probs.uop.dtype, "low"), _log(probs))
            ind = lax.reshape(lax.slice(_stable_argsort(lax.neg(noisy), 0), (0,), (draws,)), shape)
    if arr.ndim == 0: return ind
    return jnp.take(arr, ind, axis=axis)


def __getattr__(name: str):
    from fnx.jax_names import missing
    raise missing("fnx.random", name)
