"""fnx.nn.initializers: jax.nn.initializers' weight initializers.

An initializer is a function `init(key, shape, dtype=float32) -> Array`; the builders below (`normal(0.02)`,
`glorot_uniform()`, ...) return one. `zeros` and `ones` are initializers themselves, as in JAX. Random ones draw
from fnx.random, which gives JAX's bits for the same key, so they match jax.nn.initializers value for value.

    >>> init = fnx.nn.initializers.glorot_uniform()
    >>> w = init(fnx.random.PRNGKey(0), (784, 128))
"""
from __future__ import annotations

import math
from typing import Any, Callable, Sequence

import numpy as np

from fnx import numpy as jnp
from fnx import random
from fnx.errors import at_user_line
from fnx.trace import Array

__all__ = ["Initializer", "constant", "glorot_normal", "glorot_uniform", "he_normal", "he_uniform",
           "kaiming_normal", "kaiming_uniform", "lecun_normal", "lecun_uniform", "normal", "ones",
           "truncated_normal", "uniform", "variance_scaling", "xavier_normal", "xavier_uniform", "zeros"]

Initializer = Callable[..., Array]

# The standard deviation of a unit normal truncated to [-2, 2]: variance_scaling divides by it so the truncated
# samples have the requested variance.
_TRUNCATED_STDDEV = 0.87962566103423978


def _shape(shape: Any) -> tuple[int, ...]:
    return (int(shape),) if isinstance(shape, (int, np.integer)) else tuple(int(s) for s in shape)


def _scalar(value: float, dtype: Any) -> Any:
    """`value` rounded to `dtype` on the host, so the product with the samples rounds as JAX's does."""
    return np.asarray(value, dtype=np.dtype(dtype))[()]


def zeros(key: Any, shape: Any, dtype: Any = jnp.float32) -> Array:
    """An initializer that returns zeros (the key is unused).

    Args:
      key: a PRNG key (ignored).
      shape: the shape of the result.
      dtype: the dtype of the result (default float32).

    Returns:
      An array of zeros.

    Example:
      >>> fnx.nn.initializers.zeros(fnx.random.PRNGKey(0), (2, 3))
      Array([[0., 0., 0.],
             [0., 0., 0.]], dtype=float32)
    """
    return jnp.zeros(_shape(shape), dtype)


def ones(key: Any, shape: Any, dtype: Any = jnp.float32) -> Array:
    """An initializer that returns ones (the key is unused).

    Args:
      key: a PRNG key (ignored).
      shape: the shape of the result.
      dtype: the dtype of the result (default float32).

    Returns:
      An array of ones.
    """
    return jnp.ones(_shape(shape), dtype)


def constant(value: Any, dtype: Any = jnp.float32) -> Initializer:
    """Builds an initializer that fills the array with `value`.

    Args:
      value: the fill value (a scalar or anything that broadcasts to the requested shape).
      dtype: the initializer's default dtype.

    Returns:
      An initializer `init(key, shape, dtype=dtype)`.

    Example:
      >>> fnx.nn.initializers.constant(-7)(fnx.random.PRNGKey(0), (2,))
      Array([-7., -7.], dtype=float32)
    """
    def init(key: Any, shape: Any, dtype: Any = dtype) -> Array:
        return jnp.full(_shape(shape), value, dtype)
    return init


def normal(stddev: float = 1e-2, dtype: Any = jnp.float32) -> Initializer:
    """Builds an initializer that draws from a normal distribution with mean 0 and standard deviation `stddev`.

    Args:
      stddev: the standard deviation.
      dtype: the initializer's default dtype.

    Returns:
      An initializer `init(key, shape, dtype=dtype)`.

    Example:
      >>> w = fnx.nn.initializers.normal(5.0)(fnx.random.PRNGKey(42), (2, 3))
    """
    def init(key: Any, shape: Any, dtype: Any = dtype) -> Array:
        return random.normal(key, _shape(shape), dtype) * _scalar(stddev, dtype)
    return init


def uniform(scale: float = 1e-2, dtype: Any = jnp.float32) -> Initializer:
    """Builds an initializer that draws uniformly from [0, scale).

    Args:
      scale: the upper bound of the interval.
      dtype: the initializer's default dtype.

    Returns:
      An initializer `init(key, shape, dtype=dtype)`.
    """
    def init(key: Any, shape: Any, dtype: Any = dtype) -> Array:
        return random.uniform(key, _shape(shape), dtype) * _scalar(scale, dtype)
    return init


def truncated_normal(stddev: float = 1e-2, dtype: Any = jnp.float32, lower: float = -2.0,
                     upper: float = 2.0) -> Initializer:
    """Builds an initializer that draws from a normal distribution truncated to [lower, upper], times `stddev`.

    `stddev` is that of the untruncated distribution (no correction, as in JAX).

    Args:
      stddev: the scale of the samples.
      dtype: the initializer's default dtype.
      lower: the lower truncation bound, in units of `stddev`.
      upper: the upper truncation bound, in units of `stddev`.

    Returns:
      An initializer `init(key, shape, dtype=dtype)`.
    """
    def init(key: Any, shape: Any, dtype: Any = dtype) -> Array:
        return random.truncated_normal(key, lower, upper, _shape(shape), dtype) * _scalar(stddev, dtype)
    return init


def _axes(axes: int | Sequence[int], ndim: int) -> tuple[int, ...]:
    return tuple(a % ndim for a in ((axes,) if isinstance(axes, int) else axes))


def _fans(shape: tuple[int, ...], in_axis: Any, out_axis: Any, batch_axis: Any) -> tuple[float, float]:
    """(fan_in, fan_out): the in and out axes' sizes, each times the receptive field (the axes that are none of
    in, out and batch)."""
    if len(shape) < 2:
        raise ValueError(at_user_line(f"variance_scaling: cannot compute fan_in and fan_out of a {len(shape)}-d "
                                      f"shape {shape}; the weights must be at least 2-d"))
    ins, outs, batch = (_axes(a, len(shape)) for a in (in_axis, out_axis, batch_axis))
    in_size = math.prod(shape[a] for a in ins)
    out_size = math.prod(shape[a] for a in outs)
    receptive = math.prod(shape) / (in_size * out_size * math.prod(shape[a] for a in batch))
    return in_size * receptive, out_size * receptive


_DENOMINATORS = {
    "fan_in": lambda fan_in, fan_out: fan_in,
    "fan_out": lambda fan_in, fan_out: fan_out,
    "fan_avg": lambda fan_in, fan_out: (fan_in + fan_out) / 2,
    "fan_geo_avg": lambda fan_in, fan_out: math.sqrt(fan_in * fan_out),
}
_DISTRIBUTIONS = ("truncated_normal", "normal", "uniform")


def variance_scaling(scale: float, mode: str, distribution: str, in_axis: int | Sequence[int] = -2,
                     out_axis: int | Sequence[int] = -1, batch_axis: int | Sequence[int] = (),
                     dtype: Any = jnp.float32) -> Initializer:
    """Builds an initializer whose samples have variance scale / n, with n chosen from the weights' shape by `mode`.

    n is fan_in (the size of `in_axis` times the receptive field: every axis that is not an in, out or batch axis),
    fan_out (likewise for `out_axis`), their mean ("fan_avg") or their geometric mean ("fan_geo_avg").
    "truncated_normal" draws from a unit normal truncated to [-2, 2] and divides the standard deviation by that
    distribution's own (0.8796...); "normal" draws from a normal; "uniform" draws from [-sqrt(3 var), sqrt(3 var)).

    Args:
      scale: the scaling factor (positive).
      mode: "fan_in", "fan_out", "fan_avg" or "fan_geo_avg".
      distribution: "truncated_normal", "normal" or "uniform".
      in_axis: the input axis or axes of the weights.
      out_axis: the output axis or axes of the weights.
      batch_axis: axes to leave out of the fans.
      dtype: the initializer's default dtype.

    Returns:
      An initializer `init(key, shape, dtype=dtype)`; it raises ValueError for shapes with fewer than 2 axes.

    Example:
      >>> init = fnx.nn.initializers.variance_scaling(2.0, "fan_in", "truncated_normal")
      >>> w = init(fnx.random.PRNGKey(0), (3, 3, 16, 32))   # fan_in = 3 * 3 * 16
    """
    if mode not in _DENOMINATORS:
        raise ValueError(f"variance_scaling: mode must be one of {sorted(_DENOMINATORS)}, got {mode!r}")
    if distribution not in _DISTRIBUTIONS:
        raise ValueError(f"variance_scaling: distribution must be one of {list(_DISTRIBUTIONS)}, got "
                         f"{distribution!r}")

    def init(key: Any, shape: Any, dtype: Any = dtype) -> Array:
        shape = _shape(shape)
        variance = _scalar(scale / _DENOMINATORS[mode](*_fans(shape, in_axis, out_axis, batch_axis)), dtype)
        if distribution == "truncated_normal":
            stddev = np.sqrt(variance) / _scalar(_TRUNCATED_STDDEV, dtype)
            return random.truncated_normal(key, -2, 2, shape, dtype) * stddev
        if distribution == "normal":
            return random.normal(key, shape, dtype) * np.sqrt(variance)
        return random.uniform(key, shape, dtype, -1) * np.sqrt(3 * variance)
    return init


def _preset(name: str, scale: float, mode: str, distribution: str) -> Callable[..., Initializer]:
    """A named variance_scaling configuration, with JAX's signature (in_axis, out_axis, batch_axis, dtype)."""
    def build(in_axis: int | Sequence[int] = -2, out_axis: int | Sequence[int] = -1,
              batch_axis: int | Sequence[int] = (), dtype: Any = jnp.float32) -> Initializer:
        return variance_scaling(scale, mode, distribution, in_axis, out_axis, batch_axis, dtype)
    build.__name__ = build.__qualname__ = name
    build.__doc__ = (f"Builds the {name} initializer: variance_scaling({scale}, {mode!r}, {distribution!r}).\n\n"
                     "    Args:\n      in_axis, out_axis, batch_axis, dtype: as for variance_scaling.\n\n"
                     "    Returns:\n      An initializer `init(key, shape, dtype=dtype)`.\n")
    return build


glorot_uniform = xavier_uniform = _preset("glorot_uniform", 1.0, "fan_avg", "uniform")
glorot_normal = xavier_normal = _preset("glorot_normal", 1.0, "fan_avg", "truncated_normal")
lecun_uniform = _preset("lecun_uniform", 1.0, "fan_in", "uniform")
lecun_normal = _preset("lecun_normal", 1.0, "fan_in", "truncated_normal")
he_uniform = kaiming_uniform = _preset("he_uniform", 2.0, "fan_in", "uniform")
he_normal = kaiming_normal = _preset("he_normal", 2.0, "fan_in", "truncated_normal")
