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
  * Typed keys (`key(seed)`, dtype key<fry>) are a pytree over their uint32 data, so `tree_leaves` of one gives
    that data (JAX's is a leaf of an extended dtype); fnx.numpy functions take their `key_data`, not the keys.
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
import operator
from typing import Any, Sequence

import numpy as np

from fnx import dtypes, tree_util
from fnx import lax
from fnx import numpy as jnp
from fnx.dtypes import DType
from fnx.errors import at_user_line
from fnx.trace import Array, Traced, eager_op, inline, state, trace
from fnx.transforms.custom import custom_jvp  # gamma's derivative in alpha (implicit reparameterization)
from fnx.transforms.jit import jitted_op

__all__ = ["PRNGKey", "key", "key_data", "key_dtype", "KeyArray", "wrap_key_data", "threefry_2x32", "split", "fold_in",
           "bits", "uniform", "normal", "truncated_normal", "bernoulli", "randint", "gumbel", "categorical",
           "permutation", "choice", "ball", "beta", "binomial", "cauchy", "chisquare", "clone", "dirichlet",
           "double_sided_maxwell", "exponential", "f", "gamma", "generalized_normal", "geometric", "key_impl",
           "laplace", "loggamma", "logistic", "lognormal", "maxwell", "multinomial", "multivariate_normal",
           "orthogonal", "pareto", "poisson", "rademacher", "rayleigh", "t", "triangular", "wald", "weibull_min"]

Shape = Sequence[int]

# ---- keys ----


def _u32(value: int) -> np.uint32:
    return np.uint32(value & 0xFFFFFFFF)


class KeyDType:
    """The dtype of typed key arrays: `key<fry>` (threefry2x32), as JAX prints it."""
    name = "key<fry>"

    def __repr__(self) -> str: return self.name
    __str__ = __repr__

    def __eq__(self, other) -> bool: return isinstance(other, KeyDType) or other == self.name
    def __hash__(self) -> int: return hash(self.name)


KEY_DTYPE = KeyDType()


class KeyArray:
    """An array of typed PRNG keys (`fnx.random.key`): shape `shape`, dtype key<fry>, holding uint32 data of shape
    shape + (2,) (`key_data`). It is a pytree whose one child is that data, so jit, vmap, scan and the trees carry it;
    every sampler accepts it as it accepts a raw uint32[2] key, and split/fold_in/clone of a typed key give typed
    keys, as in JAX."""
    __slots__ = ("_data",)

    def __init__(self, data: Array):
        self._data = data

    shape = property(lambda self: tuple(self._data.shape[:-1]))
    ndim = property(lambda self: self._data.ndim - 1)
    size = property(lambda self: math.prod(self.shape))
    dtype = property(lambda self: KEY_DTYPE)

    def __len__(self) -> int:
        if not self.shape: raise TypeError("len() of an unsized key array")
        return self.shape[0]

    def __iter__(self):
        return (self[i] for i in range(len(self)))

    def __getitem__(self, index) -> KeyArray:
        index = index if isinstance(index, tuple) else (index,)
        if any(i is Ellipsis for i in index):
            raise IndexError("key arrays are indexed by their key axes: an Ellipsis is not supported in fnx")
        return KeyArray(self._data[index + (slice(None),)])

    def reshape(self, *shape) -> KeyArray:
        shape = shape[0] if len(shape) == 1 and isinstance(shape[0], (tuple, list)) else shape
        return KeyArray(jnp.reshape(self._data, tuple(shape) + (2,)))

    def block_until_ready(self) -> KeyArray:
        self._data.block_until_ready()
        return self

    def __repr__(self) -> str:
        return f"Array({self.shape}, dtype={KEY_DTYPE}) overlaying:\n{np.asarray(self._data)}"

    __str__ = __repr__


tree_util.register_pytree_node(KeyArray, lambda k: ((k._data,), None), lambda _, children: KeyArray(children[0]))


def _typed_like(key: Any, data: Array) -> Any:
    """New key data as a typed key array when `key` was one (split, fold_in, clone keep the key's kind)."""
    return KeyArray(data) if isinstance(key, KeyArray) else data


def _key_array(key: Any, name: str, batched: bool = False) -> Array:
    """`key` as a uint32[2] Array (uint32[..., 2] when `batched`), or a TypeError naming the sampler."""
    if isinstance(key, KeyArray):
        if key.shape and not batched:
            raise TypeError(at_user_line(f"{name}: expected a single PRNG key, got a key array of shape {key.shape}; "
                                         "use vmap over it"))
        return key._data
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
    if isinstance(seed, (int, np.integer)):  # (a numpy integer's low 32 bits, as its conversion to uint32 keeps)
        if isinstance(seed, int) and not -2 ** 63 <= seed < 2 ** 63:
            raise OverflowError(at_user_line(f"PRNGKey: seed {seed} does not fit in int64"))
        # made on the host: stacked from two constants, each new seed was a program of its own to compile (4 ms)
        return lax.to_array(np.array([0, _u32(int(seed))], np.uint32))
    else:
        s = seed if isinstance(seed, Array) else lax.to_array(np.asarray(seed))
        if s.ndim:
            raise TypeError(at_user_line(f"PRNGKey: the seed must be a scalar, got shape {s.shape}; use vmap"))
        if not s.uop.dtype.is_int:
            raise TypeError(at_user_line(f"PRNGKey: the seed must be an integer, got {s.uop.dtype}"))
        low = lax.convert_element_type(s, dtypes.uint32)
    return jnp.stack([lax.to_array(np.uint32(0)), low])


def key(seed: int | Any, *, impl: str | None = None) -> KeyArray:
    """A typed PRNG key (shape (), dtype key<fry>) from an integer seed: the data of `PRNGKey(seed)`, as
    `jax.random.key`. Only `impl=None` or 'threefry2x32'."""
    _check_impl(impl, "key")
    return KeyArray(PRNGKey(seed))


def _check_impl(impl: str | None, name: str) -> None:
    if impl not in (None, "threefry2x32", "threefry"):
        raise ValueError(at_user_line(f"{name}: fnx implements only threefry2x32, got impl={impl!r}"))


def key_data(keys: Any) -> Array:
    """The uint32 data of a typed key array (shape + (2,)); a raw uint32 key is its own data."""
    return _key_array(keys, "key_data", batched=True)


def wrap_key_data(key_bits_array: Any, *, impl: str | None = None) -> KeyArray:
    """A typed key array from uint32 data of shape (..., 2) (only `impl=None` or 'threefry2x32')."""
    _check_impl(impl, "wrap_key_data")
    if isinstance(key_bits_array, KeyArray):
        raise TypeError(at_user_line("wrap_key_data: expected uint32 data, got a typed key array (use key_data)"))
    return KeyArray(_key_array(key_bits_array, "wrap_key_data", batched=True))


def key_dtype(impl: str | None = None) -> KeyDType:
    """The dtype of typed keys, key<fry>."""
    _check_impl(impl, "key_dtype")
    return KEY_DTYPE


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
        return lax.bitwise_or(lax.shift_left(wide(hi), lax.full((), 32, dtypes.uint64)), wide(lo))
    return lax.convert_element_type(lax.bitwise_xor(hi, lo), _UINT[bit_width])


_shape = lax.canonical_shape


@jitted_op("num")
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
    return _typed_like(key, jnp.stack([hi, lo], axis=-1))


@jitted_op(convert={"data": lambda v: _u32(int(v)) if isinstance(v, int) else v})
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
    return _typed_like(key, jnp.stack([y0, y1]))


@jitted_op("shape", "dtype")
def bits(key: Any, shape: Shape = (), dtype: Any = None) -> Array:
    """Uniform random bits as unsigned integers of `dtype` (uint8/16/32/64; default uint32).

    Example:
      >>> fnx.random.bits(fnx.random.PRNGKey(0), (3,))
      Array([4070199207, 4202968722, 1427181096], dtype=uint32)
    """
    dt = dtypes.uint32 if dtype is None else dtypes.requested(dtype, "bits")
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
    dt = dtypes.default_float() if dtype is None else dtypes.requested(dtype)
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


@jitted_op("shape", "dtype")
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


@jitted_op("shape", "dtype")
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


@jitted_op("shape", "dtype")
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


@jitted_op("shape")
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


@jitted_op("shape", "dtype")
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
    dt = dtypes.default_int() if dtype is None else dtypes.requested(dtype, "randint")
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


@jitted_op("shape", "dtype", "mode")
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


@jitted_op("axis", "shape", "replace")
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
    traced = _argsort_network(moved.shape, moved.uop.dtype, moved.uop.device or state.default_device,
                              dtypes.x64_enabled())
    return jnp.moveaxis(Array(inline(traced, list(traced.body.src), [moved])[0]), -1, axis)


@functools.lru_cache(maxsize=64)
def _argsort_network(shape: tuple[int, ...], dtype: DType, device: str, x64: bool) -> Traced:
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
    if not moved.uop.dtype.is_float and moved.uop.dtype.itemsize <= 4 and size <= 2 ** 31:
        return _packed_argsort(moved, n, size)  # (float keys compare as floats: -0.0 equal to +0.0)
    index = lax.broadcasted_iota(dtypes.int32, moved.shape, moved.ndim - 1)
    if size != n:
        top = np.array(np.iinfo(keys.dtype).max if moved.uop.dtype.is_int else np.inf, keys.dtype)
        moved = _pad_last(moved, top, size)
        index = _pad_last(index, np.int32(size), size)  # padding sorts after every real pair: larger index
        index = jnp.where(lax.broadcasted_iota(dtypes.int32, index.shape, index.ndim - 1) < n, index, np.int32(size))
    _, index = _network((moved, index), size, lambda pair, *stage: _compare_exchange(*pair, *stage))
    return lax.slice_in_dim(index, 0, n, axis=-1) if size != n else index


def _pad_last(x: Array, value: Any, size: int) -> Array:
    """`x` padded with `value` at the end of its last axis to `size`."""
    return lax.pad(x, value, [(0, 0, 0)] * (x.ndim - 1) + [(0, size - x.shape[-1], 0)])


def _network(carry: Any, size: int, exchange) -> Any:
    """The bitonic network's stages over the last axis (of length `size`, a power of two) run on `carry`:
    `exchange(carry, position, width, half)` is one stage. One compiled stage run by a scan over the stages'
    (width, half): a network of 66 stages was 66 kernels to build and compile."""
    stages = [(width, half) for width in (1 << b for b in range(1, size.bit_length()))
              for half in (width >> j for j in range(1, width.bit_length()))]
    if not stages: return carry
    widths, halves = (jnp.asarray(np.array(column, np.int32)) for column in zip(*stages))
    leaf = tree_util.tree_leaves(carry)[0]
    position = lax.broadcasted_iota(dtypes.int32, leaf.shape, leaf.ndim - 1)
    carry, _ = lax.scan(lambda c, stage: (exchange(c, position, *stage), None), carry, (widths, halves))
    return carry


def _packed_argsort(keys: Array, n: int, size: int) -> Array:
    """`_last_axis_argsort` of integer keys of 32 bits or fewer (fnx.lax's sorts order floats by such keys, their
    bits: `order_keys`): each (key, index) pair packed into one int64, the key
    (order-preserving as int32) in the high half and its index in the low, so the network moves one array and a
    stage is one gather and a min/max. The packed values of the real elements are distinct (their indices are), so
    the result is the stable order; the padding is the largest int64, after all of them."""
    d = keys.uop.dtype
    if d == dtypes.uint32:  # (an order-preserving int32: the top bit flipped)
        key32 = lax.bitcast_convert_type(lax.bitwise_xor(keys, np.uint32(0x80000000)), dtypes.int32)
    else:
        key32 = lax.convert_element_type(keys, dtypes.int32)
    index = lax.broadcasted_iota(dtypes.int64, keys.shape, keys.ndim - 1)
    packed = lax.bitwise_or(lax.shift_left(lax.convert_element_type(key32, dtypes.int64),
                                           lax.full((), 32, dtypes.int64)), index)
    if size != n: packed = _pad_last(packed, lax.full((), np.iinfo(np.int64).max, dtypes.int64), size)

    def stage(v: Array, position: Array, width: Array, half: Array) -> Array:
        partner = jnp.bitwise_xor(position, half)
        other = jnp.take_along_axis(v, partner, -1)
        keep_smaller = jnp.equal(jnp.less(position, partner), jnp.equal(jnp.bitwise_and(position, width), 0))
        return jnp.where(keep_smaller, lax.min(v, other), lax.max(v, other))
    packed = _network(packed, size, stage)
    if size != n: packed = lax.slice_in_dim(packed, 0, n, axis=-1)
    return lax.convert_element_type(lax.bitwise_and(packed, lax.full((), 0xFFFFFFFF, dtypes.int64)), dtypes.int32)


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


@jitted_op("axis", "independent", static_ints=("x",))
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


@jitted_op("shape", "replace", "axis", static_ints=("a",))
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


# ---- more distributions: transforms of uniform and normal bits, gamma-based and rejection samplers ----

# Cephes expf: exp(x) = 2^n exp(r), n = floor(x log2(e) + 1/2), r = x - n ln2 in two fused steps, exp(r) polynomial
_EXP_P = (1.9875691500e-4, 1.3981999507e-3, 8.3334519073e-3, 4.1665795894e-2, 1.6666665459e-1, 5.0000001201e-1)
_EXP_HI = _f32(0x42B17218)  # 88.72284: above it exp overflows
_EXP_LO = -88.3762626647949


def _exp(x: Array) -> Array:
    """jnp.exp as XLA:CPU computes it for float32 (float64: fnx's exp; 16-bit floats go through float32).

    XLA clamps n to 127 (so exp(88.6) takes r above ln2 / 2) and flushes results below FLT_MIN to zero.
    """
    d = x.uop.dtype
    if d == dtypes.float64: return jnp.exp(x)
    if d != dtypes.float32: return lax.convert_element_type(_exp(lax.convert_element_type(x, dtypes.float32)), d)
    clamped = jnp.clip(x, _EXP_LO, _EXP_HI)
    n = jnp.clip(lax.floor(_fma(clamped, 1.44269504088896341, 0.5)), -126.0, 127.0)
    r = _fma(n, 2.12194440e-4, _fma(n, -0.693359375, clamped))
    y = lax.add(_fma(_horner(r, _EXP_P), lax.mul(r, r), r), 1.0)
    exponent = lax.shift_left(lax.add(lax.convert_element_type(n, dtypes.int32), np.int32(127)), np.int32(23))
    out = lax.mul(y, lax.bitcast_convert_type(exponent, dtypes.float32))
    out = _select(lax.lt(out, _f32(0x00800000)), 0.0, out, x)  # XLA:CPU runs with denormals flushed to zero
    out = _select(lax.lt(_EXP_HI, x), math.inf, out, x)
    return _select(lax.ne(x, x), x, out, x)


def _split_keys(key: Array, num: int) -> list[Array]:
    keys = split(key, num)
    return [lax.reshape(lax.slice(keys, (i, 0), (i + 1, 2)), (2,)) for i in range(num)]


def _float_param(value: Any, dt: DType) -> Array:
    return lax.convert_element_type(lax.to_array(value), dt)


def _sample_shape(name: str, shape: Shape | None, *params: Array) -> tuple[int, ...]:
    """`shape`, or the broadcast parameter shapes when it is None; the parameters must broadcast to it (JAX)."""
    shapes = [p.shape for p in params]
    if shape is None: return jnp.broadcast_shapes(*shapes) if shapes else ()
    shape = _shape(shape, name)
    try:
        _check_shape(name, shape, *shapes)
    except TypeError as error:  # JAX raises ValueError for parameters that do not broadcast to the shape
        raise ValueError(str(error)) from None
    return shape


def _int_dtype(dtype: Any, name: str) -> DType:
    dt = dtypes.default_int() if dtype is None else dtypes.requested(dtype)
    if not dt.is_int:
        raise ValueError(at_user_line(f"{name}: dtype must be an integer dtype, got {dt}"))
    return dt


@eager_op
def clone(key: Any) -> Array:
    """A copy of `key` (JAX's key-reuse checker treats it as fresh; fnx keys are plain data, so this is the key)."""
    return _typed_like(key, _key_array(key, "clone", batched=True))


def key_impl(keys: Any) -> str:
    """The name of the PRNG implementation behind `keys`: always 'threefry2x32' in fnx."""
    _key_array(keys, "key_impl", batched=True)
    return "threefry2x32"


def _exponential(key: Array, shape: tuple[int, ...], dt: DType) -> Array:
    return lax.neg(_log1p(lax.neg(_uniform(key, shape, dt, 0.0, 1.0))))  # log of 1 - u in (0, 1]


@jitted_op("shape", "dtype")
def exponential(key: Any, shape: Shape = (), dtype: Any = None) -> Array:
    """Standard exponential samples, -log(1 - u).

    Example:
      >>> e = fnx.random.exponential(fnx.random.PRNGKey(0), (3,))
    """
    return _exponential(_key_array(key, "exponential"), _shape(shape, "exponential"),
                        _float_dtype(dtype, "exponential"))


@eager_op
def laplace(key: Any, shape: Shape = (), dtype: Any = None) -> Array:
    """Standard Laplace samples, sign(u) log(1 - |u|) for u uniform in (-1, 1).

    Example:
      >>> x = fnx.random.laplace(fnx.random.PRNGKey(0), (3,))
    """
    dt = _float_dtype(dtype, "laplace")
    u = _uniform(_key_array(key, "laplace"), _shape(shape, "laplace"), dt,
                 -1.0 + float(dtypes.finfo(dt.np).epsneg), 1.0)
    return lax.mul(lax.sign(u), _log1p(lax.neg(lax.abs(u))))


@eager_op
def logistic(key: Any, shape: Shape = (), dtype: Any = None) -> Array:
    """Standard logistic samples, log(u) - log(1 - u).

    Example:
      >>> x = fnx.random.logistic(fnx.random.PRNGKey(0), (3,))
    """
    dt = _float_dtype(dtype, "logistic")
    u = _uniform(_key_array(key, "logistic"), _shape(shape, "logistic"), dt, float(dtypes.finfo(dt.np).tiny), 1.0)
    return lax.sub(_log(u), _log1p(lax.neg(u)))


@eager_op
def cauchy(key: Any, shape: Shape = (), dtype: Any = None) -> Array:
    """Standard Cauchy samples, tan(pi (u - 1/2)).

    fnx's float32 tan is within an ulp of XLA's but not always equal to it, so samples agree with JAX to ~1e-6
    relative rather than bit for bit.

    Example:
      >>> x = fnx.random.cauchy(fnx.random.PRNGKey(0), (3,))
    """
    dt = _float_dtype(dtype, "cauchy")
    u = _uniform(_key_array(key, "cauchy"), _shape(shape, "cauchy"), dt, float(dtypes.finfo(dt.np).eps), 1.0)
    return lax.tan(lax.mul(np.array(np.pi, dt.np), lax.sub(u, 0.5)))


def _rademacher(key: Array, shape: tuple[int, ...], dt: DType) -> Array:
    heads = lax.convert_element_type(jnp.less(_uniform(key, shape, dtypes.float32, 0.0, 1.0), 0.5), dt)
    return lax.sub(lax.mul(heads, dt.np.type(2)), dt.np.type(1))


@eager_op
def rademacher(key: Any, shape: Shape = (), dtype: Any = None) -> Array:
    """Random signs: -1 or +1 with equal probability, as `dtype` (default int32).

    Example:
      >>> fnx.random.rademacher(fnx.random.PRNGKey(0), (4,))
    """
    dt = dtypes.default_int() if dtype is None else dtypes.requested(dtype, "rademacher")
    return _rademacher(_key_array(key, "rademacher"), _shape(shape, "rademacher"), dt)


def _maxwell(key: Array, shape: tuple[int, ...], dt: DType) -> Array:
    xyz = _normal(key, shape + (3,), dt)
    return lax.sqrt(jnp.sum(lax.mul(xyz, xyz), axis=-1))


@eager_op
def maxwell(key: Any, shape: Shape = (), dtype: Any = None) -> Array:
    """Maxwell samples: the length of a standard normal 3-vector.

    Example:
      >>> x = fnx.random.maxwell(fnx.random.PRNGKey(0), (3,))
    """
    return _maxwell(_key_array(key, "maxwell"), _shape(shape, "maxwell"), _float_dtype(dtype, "maxwell"))


@eager_op
def double_sided_maxwell(key: Any, loc: Any, scale: Any, shape: Shape = (), dtype: Any = None) -> Array:
    """Double-sided Maxwell samples, sign * maxwell * scale + loc.

    As in JAX, the result shape is `shape + broadcast(loc, scale).shape`, where an empty `shape` first becomes the
    parameter shape (so array parameters of shape p with shape=() give samples of shape p + p).

    Example:
      >>> x = fnx.random.double_sided_maxwell(fnx.random.PRNGKey(0), 0.0, 1.0, (3,))
    """
    dt = _float_dtype(dtype, "double_sided_maxwell")
    k = _key_array(key, "double_sided_maxwell")
    loc, scale = lax.to_array(loc), lax.to_array(scale)
    param_shape = jnp.broadcast_shapes(loc.shape, scale.shape)
    shape = (_shape(shape, "double_sided_maxwell") or param_shape) + param_shape
    maxwell_key, sign_key = _split_keys(k, 2)
    signed = lax.mul(_rademacher(sign_key, shape, dt), _maxwell(maxwell_key, shape, dt))
    if signed.uop.dtype == dtypes.float32 and jnp.result_type(signed, scale, loc) == np.float32:
        fit = lambda v: jnp.broadcast_to(lax.convert_element_type(v, dtypes.float32), shape)  # noqa: E731
        return _fma(signed, fit(scale), fit(loc))  # XLA contracts the multiply-add
    return jnp.add(jnp.multiply(signed, scale), loc)


@eager_op
def weibull_min(key: Any, scale: Any, concentration: Any, shape: Shape = (), dtype: Any = None) -> Array:
    """Weibull samples by the inverse CDF, (-log(1 - u)) ** (1 / concentration) * scale.

    The result broadcasts `shape` with the parameters' shapes. fnx's float32 power can differ from XLA's by an ulp.

    Example:
      >>> x = fnx.random.weibull_min(fnx.random.PRNGKey(0), 1.0, 2.0, (3,))
    """
    dt = _float_dtype(dtype, "weibull_min")
    e = _exponential(_key_array(key, "weibull_min"), _shape(shape, "weibull_min"), dt)
    return jnp.multiply(jnp.power(e, jnp.divide(1.0, concentration)), scale)


@eager_op
def rayleigh(key: Any, scale: Any, shape: Shape | None = None, dtype: Any = None) -> Array:
    """Rayleigh samples, scale * sqrt(-2 log(u)).

    Example:
      >>> x = fnx.random.rayleigh(fnx.random.PRNGKey(0), 1.0, (3,))
    """
    dt = _float_dtype(dtype, "rayleigh")
    s = _float_param(scale, dt)
    shape = _sample_shape("rayleigh", shape, s)
    u = _uniform(_key_array(key, "rayleigh"), shape, dt, 0.0, 1.0)
    return lax.mul(jnp.broadcast_to(s, shape), lax.sqrt(lax.mul(_log(u), -2.0)))


@eager_op
def pareto(key: Any, b: Any, shape: Shape | None = None, dtype: Any = None) -> Array:
    """Pareto samples with shape parameter `b` (minimum 1), exp(e / b) for e standard exponential.

    Example:
      >>> x = fnx.random.pareto(fnx.random.PRNGKey(0), 3.0, (3,))
    """
    dt = _float_dtype(dtype, "pareto")
    bb = _float_param(b, dt)
    shape = _sample_shape("pareto", shape, bb)
    e = _exponential(_key_array(key, "pareto"), shape, dt)
    if bb.shape == shape: return _exp(lax.div(e, bb))
    return _exp(lax.mul(e, jnp.broadcast_to(lax.div(1.0, bb), shape)))  # XLA: A / broadcast(b) -> A * (1 / b)


@eager_op
def lognormal(key: Any, sigma: Any = np.float32(1), shape: Shape | None = None, dtype: Any = None) -> Array:
    """Log-normal samples, exp(sigma * n) for n standard normal.

    Example:
      >>> x = fnx.random.lognormal(fnx.random.PRNGKey(0), 0.5, (3,))
    """
    dt = _float_dtype(dtype, "lognormal")
    s = _float_param(sigma, dt)
    shape = _sample_shape("lognormal", shape, s)
    if s.shape == shape: return _exp(lax.mul(_normal(_key_array(key, "lognormal"), shape, dt), s))
    # XLA folds the broadcast scalars of (sqrt(2) * erfinv(u)) * sigma into erfinv(u) * (sqrt(2) * sigma)
    lowest = -(1.0 - float(dtypes.finfo(dt.np).epsneg))
    e = _erf_inv(_uniform(_key_array(key, "lognormal"), shape, dt, lowest, 1.0))
    return _exp(lax.mul(e, jnp.broadcast_to(lax.mul(np.array(math.sqrt(2), dt.np), s), shape)))


@eager_op
def triangular(key: Any, left: Any, mode: Any, right: Any, shape: Shape | None = None, dtype: Any = None) -> Array:
    """Triangular samples on [left, right] peaking at `mode`, by the inverse CDF.

    Example:
      >>> x = fnx.random.triangular(fnx.random.PRNGKey(0), 0.0, 0.5, 1.0, (3,))
    """
    dt = _float_dtype(dtype, "triangular")
    lo, mo, hi = (_float_param(v, dt) for v in (left, mode, right))
    shape = _sample_shape("triangular", shape, lo, mo, hi)
    lo, mo, hi = (jnp.broadcast_to(v, shape) for v in (lo, mo, hi))
    u = _uniform(_key_array(key, "triangular"), shape, dt, 0.0, 1.0)
    width = lax.sub(hi, lo)
    below = lax.add(lo, lax.sqrt(lax.mul(lax.mul(u, width), lax.sub(mo, lo))))
    above = lax.sub(hi, lax.sqrt(lax.mul(lax.mul(lax.sub(1.0, u), width), lax.sub(hi, mo))))
    return lax.select(lax.lt(u, lax.div(lax.sub(mo, lo), width)), below, above)


@eager_op
def wald(key: Any, mean: Any, shape: Shape | None = None, dtype: Any = None) -> Array:
    """Wald (inverse Gaussian, unit shape) samples by Michael, Schucany and Haas' transformation of a normal.

    Example:
      >>> x = fnx.random.wald(fnx.random.PRNGKey(0), 1.0, (3,))
    """
    dt = _float_dtype(dtype, "wald")
    mu = _float_param(mean, dt)
    shape = _sample_shape("wald", shape, mu)
    mu = jnp.broadcast_to(mu, shape)
    normal_key, uniform_key = _split_keys(_key_array(key, "wald"), 2)
    v = _normal(normal_key, shape, dt)
    z = _uniform(uniform_key, shape, dt, 0.0, 1.0)
    y = lax.mul(v, v)
    mu2 = lax.mul(mu, mu)
    root = lax.sqrt(_fma(lax.mul(mu, 4.0), y, lax.mul(mu2, lax.mul(y, y))))  # XLA contracts 4 mu y + mu^2 y^2
    x = _fma(lax.neg(lax.mul(mu, 0.5)), root, _fma(lax.mul(mu2, y), 0.5, mu))
    return lax.select(lax.le(z, lax.div(mu, lax.add(mu, x))), x, lax.div(mu2, x))


@eager_op
def geometric(key: Any, p: Any, shape: Shape | None = None, dtype: Any = None) -> Array:
    """Geometric samples (trials up to the first success, >= 1), floor(log(u) / log(1 - p)) + 1.

    Example:
      >>> fnx.random.geometric(fnx.random.PRNGKey(0), 0.3, (4,))
    """
    dt = _int_dtype(dtype, "geometric")
    prob = lax.to_array(p)
    if not prob.uop.dtype.is_float: prob = lax.convert_element_type(prob, dtypes.float32)
    shape = _sample_shape("geometric", shape, prob)
    u = _uniform(_key_array(key, "geometric"), shape, prob.uop.dtype, 0.0, 1.0)
    log_u = _log(_select(lax.eq(u, 0.0), 1.0, u, u))  # u = 0 counts as 1, as in JAX
    g = lax.add(lax.floor(lax.div(log_u, jnp.broadcast_to(_log1p(lax.neg(prob)), shape))), 1.0)
    return lax.convert_element_type(g, dt)


# ---- gamma: Marsaglia and Tsang's rejection sampler, vectorized over the batch ----

def _marsaglia_tsang(key: Array, alpha: Array, log_space: bool) -> Array:
    """Gamma(alpha) samples (their logs if `log_space`) for an array `alpha`, one while_loop for the whole batch.

    Each round proposes x normal, v = (1 + c x)^3 and u uniform for every element and keeps the first accepted
    d v per element (Marsaglia and Tsang, 2000). alpha < 1 samples Gamma(alpha + 1) and multiplies by
    u^(1 / alpha) (in log space: adds log(u) / alpha), as JAX does. NaN, negative or infinite alpha stop at once.
    """
    dt, shape = alpha.uop.dtype, alpha.shape
    boost = lax.ge(alpha, 1.0)
    a = lax.select(boost, alpha, lax.add(alpha, 1.0))
    d = lax.sub(a, 1.0 / 3.0)
    c = lax.div(_const(d, 1.0 / 3.0), lax.sqrt(d))
    invalid = jnp.logical_or(jnp.logical_not(lax.gt(d, 0.0)), jnp.isinf(d))
    key, boost_key = _split_keys(key, 2)

    def propose(state):
        key, done, v_out = state
        key, normal_key, uniform_key = _split_keys(key, 3)
        x = _normal(normal_key, shape, dt)
        u = _uniform(uniform_key, shape, dt, 0.0, 1.0)
        v = lax.add(lax.mul(x, c), 1.0)
        v3 = lax.mul(lax.mul(v, v), v)
        x2 = lax.mul(x, x)
        squeeze = lax.lt(u, lax.sub(1.0, lax.mul(lax.mul(x2, x2), 0.0331)))
        exact = lax.lt(_log(u), lax.add(lax.mul(x2, 0.5), lax.mul(d, lax.add(lax.sub(1.0, v3), _log(v3)))))
        accept = jnp.logical_and(lax.gt(v, 0.0), jnp.logical_or(squeeze, exact))
        fresh = jnp.logical_and(accept, jnp.logical_not(done))
        return key, jnp.logical_or(done, accept), lax.select(fresh, v3, v_out)

    init = (key, invalid, lax.select(jnp.logical_and(invalid, jnp.logical_not(jnp.isinf(d))), _const(d, math.nan),
                                     _const(d, 1.0)))  # invalid alpha gives NaN (inf stays inf), as in JAX
    _, _, v3 = lax.while_loop(lambda s: jnp.any(jnp.logical_not(s[1])), propose, init)
    u = _uniform(boost_key, shape, dt, 0.0, 1.0)
    if log_space:
        log_u = _log1p(lax.neg(u))
        log_boost = lax.select(jnp.logical_or(boost, lax.eq(log_u, 0.0)), _const(u, 0.0), lax.div(log_u, alpha))
        return lax.add(lax.add(_log(d), _log(v3)), log_boost)
    boost_factor = lax.select(boost, _const(u, 1.0), jnp.power(lax.sub(1.0, u), lax.div(1.0, alpha)))
    return lax.mul(lax.mul(d, v3), boost_factor)


def _gamma_dlog_dalpha(alpha: Array, log_x: Array) -> Array:
    """d log(x) / d alpha for a Gamma(alpha) sample x held at its CDF value (implicit reparameterization).

    dx/dalpha = -(dP(alpha, x)/dalpha) / p(x) for the regularized incomplete gamma P, whose series
    P = sum_n x^(alpha+n) e^-x / Gamma(alpha+n+1) gives d log x / d alpha = -sum_n s_n (log x - digamma(alpha+n+1))
    with s_0 = 1/alpha, s_n = s_(n-1) x / (alpha + n). Summed in float64 until the terms stop mattering (past
    n = x - alpha, where they shrink geometrically); it loses accuracy only for x far in the right tail.
    """
    a = lax.convert_element_type(alpha, dtypes.float64)
    lx = lax.convert_element_type(log_x, dtypes.float64)
    x = jnp.exp(lx)
    s = lax.div(1.0, a)
    psi = lax.digamma(lax.add(a, 1.0))
    total = lax.mul(s, lax.sub(lx, psi))

    def more(state):
        n, s, _, total = state
        pending = jnp.logical_or(lax.lt(lax.add(a, n), x), lax.gt(jnp.abs(s), lax.mul(jnp.abs(total), 1e-17)))
        return jnp.any(jnp.logical_and(pending, jnp.isfinite(total)))

    def step(state):
        n, s, psi, total = state
        s = lax.mul(s, lax.div(x, lax.add(a, n)))
        psi = lax.add(psi, lax.div(1.0, lax.add(a, n)))
        return lax.add(n, 1.0), s, psi, lax.add(total, lax.mul(s, lax.sub(lx, psi)))

    n0 = lax.full(a.shape, 1.0, dtypes.float64)
    total = lax.while_loop(more, step, (n0, s, psi, total))[3]
    return lax.convert_element_type(lax.neg(total), alpha.uop.dtype)


@custom_jvp
def _gamma_sample(key: Array, alpha: Array) -> Array:
    return _marsaglia_tsang(key, alpha, False)


@custom_jvp
def _loggamma_sample(key: Array, alpha: Array) -> Array:
    return _marsaglia_tsang(key, alpha, True)


@_gamma_sample.defjvp
def _gamma_sample_jvp(primals, tangents):
    key, alpha = primals
    x = _gamma_sample(key, alpha)
    safe = jnp.maximum(x, float(dtypes.finfo(x.dtype).tiny))  # as JAX: a sample that rounded to 0 counts as tiny
    return x, lax.mul(tangents[1], lax.mul(_gamma_dlog_dalpha(alpha, _log(safe)), safe))


@_loggamma_sample.defjvp
def _loggamma_sample_jvp(primals, tangents):
    key, alpha = primals
    log_x = _loggamma_sample(key, alpha)
    return log_x, lax.mul(tangents[1], _gamma_dlog_dalpha(alpha, log_x))


def _gamma(key: Array, a: Any, shape: Shape | None, dt: DType, log_space: bool, name: str) -> Array:
    alpha = _float_param(a, dt)
    shape = _sample_shape(name, shape, alpha)
    alpha = jnp.broadcast_to(alpha, shape)
    return (_loggamma_sample if log_space else _gamma_sample)(key, alpha)


@eager_op
def gamma(key: Any, a: Any, shape: Shape | None = None, dtype: Any = None) -> Array:
    """Standard Gamma(a) samples (unit scale), density x^(a-1) e^-x / Gamma(a).

    Marsaglia and Tsang's rejection method, run for the whole batch in one loop, with JAX's boost for a < 1. The
    samples are distributed as JAX's but are not the same numbers. Differentiable with respect to `a` by implicit
    reparameterization, as in JAX.

    Args:
      key: a PRNG key.
      a: the shape parameter(s), broadcastable to `shape`.
      shape: the result shape (default: a's shape).
      dtype: a float dtype (default float32).

    Example:
      >>> x = fnx.random.gamma(fnx.random.PRNGKey(0), 2.5, (3,))
    """
    return _gamma(_key_array(key, "gamma"), a, shape, _float_dtype(dtype, "gamma"), False, "gamma")


@eager_op
def loggamma(key: Any, a: Any, shape: Shape | None = None, dtype: Any = None) -> Array:
    """log of Gamma(a) samples, computed in log space (accurate when a << 1 makes samples underflow).

    Example:
      >>> x = fnx.random.loggamma(fnx.random.PRNGKey(0), 0.01, (3,))
    """
    return _gamma(_key_array(key, "loggamma"), a, shape, _float_dtype(dtype, "loggamma"), True, "loggamma")


@eager_op
def beta(key: Any, a: Any, b: Any, shape: Shape | None = None, dtype: Any = None) -> Array:
    """Beta(a, b) samples, Ga / (Ga + Gb) from two log-space gamma samples.

    Example:
      >>> x = fnx.random.beta(fnx.random.PRNGKey(0), 2.0, 3.0, (3,))
    """
    dt = _float_dtype(dtype, "beta")
    aa, bb = _float_param(a, dt), _float_param(b, dt)
    shape = _sample_shape("beta", shape, aa, bb)
    key_a, key_b = _split_keys(_key_array(key, "beta"), 2)
    log_a = _gamma(key_a, aa, shape, dt, True, "beta")
    log_b = _gamma(key_b, bb, shape, dt, True, "beta")
    top = jnp.maximum(log_a, log_b)
    ga, gb = jnp.exp(log_a - top), jnp.exp(log_b - top)
    return ga / (ga + gb)


@eager_op
def dirichlet(key: Any, alpha: Any, shape: Shape | None = None, dtype: Any = None) -> Array:
    """Dirichlet(alpha) samples over alpha's last axis: normalized log-space gamma samples.

    Args:
      key: a PRNG key.
      alpha: concentrations, at least 1-D; the last axis indexes the categories.
      shape: the batch shape (default alpha.shape[:-1]); the result has shape `shape + alpha.shape[-1:]`.
      dtype: a float dtype (default float32).

    Example:
      >>> x = fnx.random.dirichlet(fnx.random.PRNGKey(0), jnp.array([1.0, 2.0, 3.0]), (2,))
    """
    dt = _float_dtype(dtype, "dirichlet")
    conc = _float_param(alpha, dt)
    if conc.ndim < 1:
        raise ValueError(at_user_line(f"dirichlet: alpha must have ndim >= 1, got ndim == {conc.ndim}"))
    shape = _sample_shape("dirichlet", shape, lax.full(conc.shape[:-1], 0, dt))
    log_g = _gamma(_key_array(key, "dirichlet"), conc, shape + conc.shape[-1:], dt, True, "dirichlet")
    unnormalized = jnp.exp(log_g - lax.stop_gradient(jnp.max(log_g, axis=-1, keepdims=True)))
    return unnormalized / jnp.sum(unnormalized, axis=-1, keepdims=True)


def _chisquare(key: Array, df: Array, shape: tuple[int, ...], dt: DType) -> Array:
    return lax.mul(jnp.exp(_gamma(key, lax.div(df, 2.0), shape, dt, True, "chisquare")), 2.0)


@eager_op
def chisquare(key: Any, df: Any, shape: Shape | None = None, dtype: Any = None) -> Array:
    """Chi-square samples with `df` degrees of freedom, 2 Gamma(df / 2).

    Example:
      >>> x = fnx.random.chisquare(fnx.random.PRNGKey(0), 3.0, (3,))
    """
    dt = _float_dtype(dtype, "chisquare")
    d = _float_param(df, dt)
    return _chisquare(_key_array(key, "chisquare"), d, _sample_shape("chisquare", shape, d), dt)


@eager_op
def f(key: Any, dfnum: Any, dfden: Any, shape: Shape | None = None, dtype: Any = None) -> Array:
    """F-distribution samples, (chi2(dfnum) / dfnum) / (chi2(dfden) / dfden).

    Example:
      >>> x = fnx.random.f(fnx.random.PRNGKey(0), 5.0, 10.0, (3,))
    """
    dt = _float_dtype(dtype, "f")
    num, den = _float_param(dfnum, dt), _float_param(dfden, dt)
    shape = _sample_shape("f", shape, num, den)
    key_den, key_num = _split_keys(_key_array(key, "f"), 2)
    return lax.div(lax.div(_chisquare(key_num, num, shape, dt), jnp.broadcast_to(num, shape)),
                   lax.div(_chisquare(key_den, den, shape, dt), jnp.broadcast_to(den, shape)))


@eager_op
def t(key: Any, df: Any, shape: Shape | None = None, dtype: Any = None) -> Array:
    """Student's t samples with `df` degrees of freedom, n * sqrt((df / 2) / Gamma(df / 2)).

    Example:
      >>> x = fnx.random.t(fnx.random.PRNGKey(0), 4.0, (3,))
    """
    dt = _float_dtype(dtype, "t")
    d = _float_param(df, dt)
    shape = _sample_shape("t", shape, d)
    key_n, key_g = _split_keys(_key_array(key, "t"), 2)
    half_df = jnp.broadcast_to(lax.div(d, 2.0), shape)
    g = _gamma(key_g, half_df, shape, dt, False, "t")
    return lax.mul(_normal(key_n, shape, dt), lax.sqrt(lax.div(half_df, g)))


def _generalized_normal(key: Array, p: Any, shape: tuple[int, ...], dt: DType) -> Array:
    gamma_key, sign_key = _split_keys(key, 2)
    inv_p = jnp.divide(1.0, p)
    g = _gamma(gamma_key, inv_p, shape, dt, False, "generalized_normal")
    return jnp.multiply(_rademacher(sign_key, shape, dt), jnp.power(g, inv_p))


@eager_op
def generalized_normal(key: Any, p: Any, shape: Shape = (), dtype: Any = None) -> Array:
    """Generalized normal samples, density proportional to exp(-|x|^p): sign * Gamma(1/p) ** (1/p).

    Example:
      >>> x = fnx.random.generalized_normal(fnx.random.PRNGKey(0), 1.5, (3,))
    """
    return _generalized_normal(_key_array(key, "generalized_normal"), p, _shape(shape, "generalized_normal"),
                               _float_dtype(dtype, "generalized_normal"))


@eager_op
def ball(key: Any, d: int, p: float = 2, shape: Shape = (), dtype: Any = None) -> Array:
    """Points uniform in the unit p-norm ball of dimension `d` (Barthe, Guedon, Mendelson and Naor).

    Returns:
      An array of shape `shape + (d,)`.

    Example:
      >>> x = fnx.random.ball(fnx.random.PRNGKey(0), 3, shape=(5,))
    """
    dt = _float_dtype(dtype, "ball")
    if isinstance(d, Array) and d.uop.op.name != "CONST":
        raise TypeError(at_user_line("ball: the dimension d must be a concrete integer, got a traced value"))
    d = operator.index(np.asarray(d).item() if not isinstance(d, int) else d)
    shape = _shape(shape, "ball")
    g_key, e_key = _split_keys(_key_array(key, "ball"), 2)
    g = _generalized_normal(g_key, p, shape + (d,), dt)
    e = _exponential(e_key, shape, dt)
    radius = jnp.power(jnp.add(jnp.sum(jnp.power(jnp.abs(g), p), axis=-1), e), jnp.divide(1.0, p))
    return jnp.divide(g, jnp.expand_dims(radius, -1))


# ---- Poisson, binomial and multinomial: JAX's algorithms, every element advancing in one batch-wide loop ----

def _poisson_knuth(key: Array, lam: Array, dt: DType) -> Array:
    """Knuth: count uniforms until their product drops below exp(-lam) (used for lam < 10)."""
    def step(state):
        key, k, log_prod = state
        key, sub = _split_keys(key, 2)
        k = lax.select(lax.gt(log_prod, lax.neg(lam)), lax.add(k, np.int32(1)), k)
        return key, k, lax.add(log_prod, _log(_uniform(sub, lam.shape, dtypes.float32, 0.0, 1.0)))

    init = (key, lax.full(lam.shape, 0, dtypes.int32), lax.full(lam.shape, 0.0, dtypes.float32))
    k = lax.while_loop(lambda s: jnp.any(lax.gt(s[2], lax.neg(lam))), step, init)[1]
    return lax.convert_element_type(lax.sub(k, np.int32(1)), dt)


def _poisson_rejection(key: Array, lam: Array, dt: DType) -> Array:
    """Hormann's transformed rejection with squeeze (PTRS, 1993), for lam >= 10."""
    log_lam = _log(lam)
    b = _fma(lax.sqrt(lam), 2.53, 0.931)
    a = _fma(b, 0.02483, -0.059)
    inv_alpha = lax.add(lax.div(1.1328, lax.sub(b, 3.4)), 1.1239)
    v_r = lax.sub(0.9277, lax.div(3.6224, lax.sub(b, 2.0)))

    def step(state):
        key, k_out, accepted = state
        key, key_u, key_v = _split_keys(key, 3)
        u = lax.sub(_uniform(key_u, lam.shape, lam.uop.dtype, 0.0, 1.0), 0.5)
        v = _uniform(key_v, lam.shape, lam.uop.dtype, 0.0, 1.0)
        us = lax.sub(0.5, lax.abs(u))
        k = lax.floor(lax.add(_fma(lax.add(lax.div(lax.mul(a, 2.0), us), b), u, lam), 0.43))
        s = _log(lax.div(lax.mul(v, inv_alpha), lax.add(lax.div(a, lax.mul(us, us)), b)))
        target = lax.sub(_fma(k, log_lam, lax.neg(lam)), lax.lgamma(lax.add(k, 1.0)))
        accept_fast = jnp.logical_and(lax.ge(us, 0.07), lax.le(v, v_r))
        reject = jnp.logical_or(lax.lt(k, 0.0), jnp.logical_and(lax.lt(us, 0.013), lax.gt(v, us)))
        accept = jnp.logical_or(accept_fast, jnp.logical_and(jnp.logical_not(reject), lax.le(s, target)))
        return key, lax.select(accept, k, k_out), jnp.logical_or(accepted, accept)

    init = (key, lax.full(lam.shape, -1.0, lam.uop.dtype), lax.full(lam.shape, False, dtypes.bool_))
    k = lax.while_loop(lambda s: jnp.any(jnp.logical_not(s[2])), step, init)[1]
    return lax.convert_element_type(k, dt)


@eager_op
def poisson(key: Any, lam: Any, shape: Shape | None = None, dtype: Any = None) -> Array:
    """Poisson(lam) samples as integers of `dtype` (default int32).

    JAX's algorithm: Knuth's product of uniforms for lam < 10, Hormann's transformed rejection above, each run as
    one loop over the whole batch with JAX's key sequence, so samples equal JAX's except where fnx's float32
    lgamma and XLA's differ at an acceptance boundary (rare). lam is computed in float32, as in JAX.

    Example:
      >>> fnx.random.poisson(fnx.random.PRNGKey(0), 3.0, (4,))
    """
    dt = _int_dtype(dtype, "poisson")
    k = _key_array(key, "poisson")
    rate = lax.to_array(lam)
    shape = rate.shape if shape is None else _shape(shape, "poisson")
    rate = lax.convert_element_type(jnp.broadcast_to(rate, shape), dtypes.float32)
    use_knuth = jnp.logical_or(lax.ne(rate, rate), lax.lt(rate, 10.0))
    knuth = _poisson_knuth(k, lax.select(use_knuth, rate, _const(rate, 0.0)), dt)
    rejection = _poisson_rejection(k, lax.select(use_knuth, _const(rate, 1e5), rate), dt)
    result = lax.select(use_knuth, knuth, rejection)
    return lax.select(lax.eq(rate, 0.0), lax.full(shape, 0, dt), result)


# Stirling's series tail log(k!) - [(k + 1/2) log(k + 1) - (k + 1) + log(2 pi) / 2] for k = 0..9
_STIRLING_TAIL = (0.0810614667953272, 0.0413406959554092, 0.0276779256849983, 0.02079067210376509,
                  0.0166446911898211, 0.0138761288230707, 0.0118967099458917, 0.0104112652619720,
                  0.00925546218271273, 0.00833056343336287)


def _stirling_tail(k: Array) -> Array:
    kc = jnp.clip(k, 0.0, 9.0)
    kp1 = kc + 1.0
    approx = (1.0 / 12 - (1.0 / 360 - 1.0 / 1260 / (kp1 * kp1)) / (kp1 * kp1)) / kp1
    table = jnp.take(jnp.asarray(np.array(_STIRLING_TAIL, k.dtype)), lax.convert_element_type(lax.floor(kc),
                                                                                            dtypes.int32))
    return jnp.where(k <= 9, table, approx)


def _binomial_inversion(key: Array, count: Array, prob: Array) -> Array:
    """Count geometric waiting times until they pass `count` (used when count * p <= 10)."""
    log_q = _log1p(lax.neg(prob))

    def step(state):
        key, num, total = state
        sub, key = _split_keys(key, 2)
        num = lax.select(lax.le(total, count), lax.add(num, 1.0), num)
        geom = lax.ceil(lax.div(_log(_uniform(sub, prob.shape, prob.uop.dtype, 0.0, 1.0)), log_q))
        return key, num, lax.add(total, geom)

    zeros = lax.full(prob.shape, 0.0, prob.uop.dtype)
    num = lax.while_loop(lambda s: jnp.any(lax.le(s[2], count)), step, (key, zeros, zeros))[1]
    return lax.sub(num, 1.0)


def _btrs(key: Array, count: Array, prob: Array) -> Array:
    """Hormann's BTRS transformed rejection (1993), for count * p > 10."""
    stddev = jnp.sqrt(count * prob * (1 - prob))
    b = 1.15 + 2.53 * stddev
    a = -0.0873 + 0.0248 * b + 0.01 * prob
    c = count * prob + 0.5
    v_r = 0.92 - 4.2 / b
    r = prob / (1 - prob)
    alpha = (2.83 + 5.1 / b) * stddev
    m = jnp.floor((count + 1) * prob)
    tail_m = (m + 0.5) * _log((m + 1) / (r * (count - m + 1))) + _stirling_tail(m) + _stirling_tail(count - m)

    def step(state):
        key, k_out, accepted = state
        key, key_u, key_v = _split_keys(key, 3)
        u = _uniform(key_u, prob.shape, prob.uop.dtype, 0.0, 1.0) - 0.5
        v = _uniform(key_v, prob.shape, prob.uop.dtype, 0.0, 1.0)
        us = 0.5 - jnp.abs(u)
        k = jnp.floor((2 * a / us + b) * u + c)
        accept_fast = (us >= 0.07) & (v <= v_r)
        reject = (k < 0) | (k > count)
        log_v = _log(v * alpha / (a / (us * us) + b))
        bound = (tail_m + (count + 1) * _log((count - m + 1) / (count - k + 1))
                 + (k + 0.5) * _log(r * (count - k + 1) / (k + 1)) - _stirling_tail(k) - _stirling_tail(count - k))
        accept = accept_fast | (~reject & (log_v <= bound))
        return key, jnp.where(accept, k, k_out), accepted | accept

    init = (key, lax.full(prob.shape, -1.0, prob.uop.dtype), lax.full(prob.shape, False, dtypes.bool_))
    return lax.while_loop(lambda s: jnp.any(jnp.logical_not(s[2])), step, init)[1]


def _binomial(key: Array, n: Any, p: Any, shape: Shape | None, dt: DType) -> Array:
    prob = lax.to_array(p)
    if not prob.uop.dtype.is_float: prob = lax.convert_element_type(prob, dtypes.float32)
    count = lax.convert_element_type(lax.to_array(n), prob.uop.dtype)
    shape = _sample_shape("binomial", shape, count, prob)
    count, prob = jnp.broadcast_to(count, shape), jnp.broadcast_to(prob, shape)
    low_p = prob < 0.5
    q = jnp.where(low_p, prob, 1.0 - prob)
    bad_count = jnp.isnan(count) | (count < 0)
    bad_q = jnp.isnan(q) | (q < 0)
    q = jnp.where(bad_q, 0.01, q)
    use_inversion = bad_count | (count * q <= 10.0)
    count = jnp.floor(count)
    inversion = _binomial_inversion(key, jnp.where(use_inversion, count, 0.0), q)
    rejection = _btrs(key, jnp.where(use_inversion, 1e4, count), jnp.where(use_inversion, 0.5, q))
    samples = lax.convert_element_type(jnp.where(use_inversion, inversion, rejection), dt)
    invalid = bad_q | bad_count
    samples = jnp.where(invalid, dt.np.type(np.nan), samples)
    samples = jnp.where(jnp.isinf(count) & ~invalid, dt.np.type(np.inf), samples)
    keep = low_p | bad_count | jnp.isnan(q) | jnp.isinf(count)
    return jnp.where(keep, samples, lax.convert_element_type(count, dt) - samples)


@eager_op
def binomial(key: Any, n: Any, p: Any, shape: Shape | None = None, dtype: Any = None) -> Array:
    """Binomial(n, p) samples as floats of `dtype` (default float32), like JAX.

    JAX's algorithm: inversion by geometric waiting times for n * min(p, 1 - p) <= 10, Hormann's BTRS rejection
    above, each one loop over the batch. NaN n or p, negative n or p give NaN; infinite n gives inf.

    Example:
      >>> fnx.random.binomial(fnx.random.PRNGKey(0), 10, 0.3, (4,))
    """
    dt = _float_dtype(dtype, "binomial")
    return _binomial(_key_array(key, "binomial"), n, p, None if shape is None else _shape(shape, "binomial"), dt)


@eager_op
def multinomial(key: Any, n: Any, p: Any, *, shape: Shape | None = None, dtype: Any = None,
                unroll: int | bool = 1) -> Array:
    """Multinomial(n, p) counts over p's last axis, by sequential conditional binomials (as JAX).

    Args:
      key: a PRNG key.
      n: the number of trials, broadcastable to `shape[:-1]`.
      p: category probabilities (last axis), broadcastable to `shape`.
      shape: the result shape (default p.shape); its last entry is the number of categories.
      dtype: a float dtype (default float32).
      unroll: accepted for compatibility.

    Example:
      >>> fnx.random.multinomial(fnx.random.PRNGKey(0), 10.0, jnp.array([0.2, 0.3, 0.5]))
    """
    dt = _float_dtype(dtype, "multinomial")
    k = _key_array(key, "multinomial")
    prob, trials = lax.to_array(p), lax.to_array(n)
    work = jnp.result_type(prob, trials, np.float32) if not (prob.uop.dtype.is_float or trials.uop.dtype.is_float) \
        else jnp.result_type(prob, trials)
    prob, trials = prob.astype(work), trials.astype(work)
    shape = prob.shape if shape is None else _shape(shape, "multinomial")
    trials = jnp.broadcast_to(trials, shape[:-1])
    prob = jnp.moveaxis(jnp.broadcast_to(prob, shape), -1, 0)
    remaining = jnp.flip(jnp.cumsum(jnp.flip(prob, 0), axis=0), 0)
    ratios = prob / jnp.where(remaining == 0, 1, remaining)

    def draw(left, ratio_key):
        ratio, sub = ratio_key
        count = _binomial(sub, left, jnp.clip(ratio, 0, 1), None, left.uop.dtype)
        return left - count, count

    _, counts = lax.scan(draw, trials, (ratios, split(k, shape[-1])))
    return jnp.moveaxis(counts, 0, -1).astype(dt)


@eager_op
def multivariate_normal(key: Any, mean: Any, cov: Any, shape: Shape | None = None, dtype: Any = None,
                        method: str = "cholesky") -> Array:
    """Samples of N(mean, cov): mean + A z with z standard normal (this module's bits) and A A^T = cov from
    fnx.numpy.linalg's `method` ('cholesky', 'eigh' or 'svd'); shape defaults to the broadcast batch of mean and
    cov. Close to JAX's values, not bit-identical (the factorizations are fnx's own: docs/JAX_DIFFERENCES.md)."""
    if method not in ("cholesky", "eigh", "svd"):
        raise ValueError(at_user_line(f"multivariate_normal: method must be 'cholesky', 'eigh' or 'svd', got "
                                      f"{method!r}"))
    dt = _float_dtype(dtype, "multivariate_normal")
    key = _key_array(key, "multivariate_normal")
    mean, cov = jnp.asarray(mean, dt.np), jnp.asarray(cov, dt.np)
    if mean.ndim < 1 or cov.ndim < 2 or cov.shape[-2:] != (mean.shape[-1],) * 2:
        raise ValueError(at_user_line(f"multivariate_normal: mean {mean.shape} and cov {cov.shape} must be (..., n) "
                                      "and (..., n, n)"))
    n = mean.shape[-1]
    batch = np.broadcast_shapes(mean.shape[:-1], cov.shape[:-2])
    shape = batch if shape is None else tuple(shape)
    _check_shape("multivariate_normal", shape, batch)
    if method == "cholesky": factor = jnp.linalg.cholesky(cov)
    elif method == "eigh":
        values, vectors = jnp.linalg.eigh(cov)
        factor = vectors * jnp.sqrt(values)[..., None, :]
    else:
        u, s, _ = jnp.linalg.svd(cov)
        factor = u * jnp.sqrt(s)[..., None, :]
    z = _normal(key, shape + (n,), dt)
    return mean + jnp.einsum("...ij,...j->...i", factor, z)


@eager_op
def orthogonal(key: Any, n: int, shape: Shape = (), dtype: Any = None, m: int | None = None) -> Array:
    """Random (n, m) matrices (m = n by default) with orthonormal columns (or rows when m > n), uniform over
    them (Haar): the Q of a standard normal matrix's QR with R's diagonal made positive."""
    dt = _float_dtype(dtype, "orthogonal")
    key = _key_array(key, "orthogonal")
    m = n if m is None else int(m)
    z = _normal(key, tuple(shape) + (max(n, m), min(n, m)), dt)
    q, r = jnp.linalg.qr(z)
    q = q * jnp.sign(jnp.diagonal(r, axis1=-2, axis2=-1))[..., None, :]
    return q if n >= m else jnp.swapaxes(q, -1, -2)


def __getattr__(name: str):
    from fnx.jax_names import missing
    raise missing("fnx.random", name)
