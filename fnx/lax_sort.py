"""jax.lax's sorting: sort (several operands, lexicographic keys), sort_key_val and top_k, on the stable bitonic
sorting network fnx.random's permutation uses (one compiled compare-exchange stage run by a scan, so a sort of n
elements compiles once per shape). Values are gathered by the sorted order with take_along_axis, so grad, jvp and
vmap follow from its rules.

The order is JAX's: integers as they are; floats by value with -0.0 equal to +0.0 and every NaN after +inf
(top_k: IEEE's total order, +0.0 above -0.0 and a negative NaN below -inf); ties keep their positions (stable),
also when descending.

    >>> fnx.lax.top_k(jnp.array([1.0, 3.0, 3.0, 2.0]), 2)
    (Array([3., 3.], dtype=float32), Array([1, 2], dtype=int32))
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from fnx import dtypes, lax
from fnx.errors import at_user_line
from fnx.trace import Array, eager_op, to_array

__all__ = ["approx_max_k", "approx_min_k", "sort", "sort_key_val", "top_k"]


def order_keys(x: Array, descending: bool = False, signed_zeros: bool = False) -> Array:
    """An integer array whose ascending order is JAX's sort order of `x` (its reverse when `descending`);
    `signed_zeros` gives top_k's order, IEEE's total order: -0.0 below +0.0 instead of equal, and a NaN with its
    sign bit set below -inf instead of after +inf with the others."""
    from fnx import numpy as jnp
    d = x.uop.dtype
    if d == dtypes.bool_: key = lax.convert_element_type(x, dtypes.int8)
    elif not d.is_float: key = x
    else:
        wide = x if d.itemsize >= 4 else lax.convert_element_type(x, dtypes.float32)
        if not signed_zeros: wide = jnp.where(wide == 0, 0.0, wide).astype(wide.dtype)
        if not signed_zeros: wide = jnp.where(jnp.isnan(wide), np.nan, wide).astype(wide.dtype)
        double = wide.uop.dtype.itemsize == 8
        bits = lax.bitcast_convert_type(wide, dtypes.int64 if double else dtypes.int32)
        flip = lax.full((), 2 ** 63 - 1 if double else 2 ** 31 - 1, bits.uop.dtype)  # (not a numpy scalar: x64 off
        # would narrow np.int64)
        key = jnp.where(bits < 0, jnp.bitwise_xor(bits, flip), bits)  # negative floats: larger magnitude first
    return jnp.bitwise_not(key) if descending else key


def argsort_keys(keys: Sequence[Array], axis: int, descending: bool = False, signed_zeros: bool = False) -> Array:
    """The int32 stable order along `axis` of the rows of `keys`, the first key most significant."""
    from fnx import numpy as jnp
    from fnx.random import _stable_argsort
    order = None
    for key in reversed(keys):  # (least significant first: each stable pass keeps the previous one's ties)
        key = order_keys(key, descending, signed_zeros)
        if order is None:
            order = _stable_argsort(key, axis)
            continue
        order = jnp.take_along_axis(order, _stable_argsort(jnp.take_along_axis(key, order, axis), axis), axis)
    return order


@eager_op
def sort(operand: Any, dimension: int = -1, is_stable: bool = True, num_keys: int = 1) -> Any:
    """Sort `operand` (an array, or a tuple/list of same-shape arrays sorted together) along `dimension`, by the
    first `num_keys` operands as lexicographic keys (jax.lax.sort). Returns the same structure."""
    from fnx import numpy as jnp
    single = not isinstance(operand, (tuple, list))
    operands = [to_array(operand)] if single else [to_array(o) for o in operand]
    shapes = {o.shape for o in operands}
    if len(shapes) != 1 or not 1 <= num_keys <= len(operands):
        raise ValueError(at_user_line(f"sort: operands of shapes {[o.shape for o in operands]} with num_keys="
                                      f"{num_keys}: need one shape and 1 <= num_keys <= {len(operands)}"))
    if operands[0].ndim == 0: raise ValueError(at_user_line("sort: a 0-d operand has no dimension to sort"))
    axis = dimension % operands[0].ndim
    order = argsort_keys(operands[:num_keys], axis)
    out = [jnp.take_along_axis(o, order, axis) for o in operands]
    return out[0] if single else type(operand)(out)


def sort_key_val(keys: Any, values: Any, dimension: int = -1, is_stable: bool = True) -> tuple[Array, Array]:
    """`keys` sorted along `dimension` and `values` in the same order (jax.lax.sort_key_val)."""
    return tuple(sort((keys, values), dimension, is_stable, num_keys=1))


@eager_op
def top_k(operand: Any, k: int) -> tuple[Array, Array]:
    """The `k` largest entries along the last axis and their int32 indices, largest first; among equal entries
    the lower index first (jax.lax.top_k)."""
    from fnx import numpy as jnp
    x = to_array(operand)
    if x.ndim == 0 or not 0 <= int(k) <= x.shape[-1]:
        raise ValueError(at_user_line(f"top_k: k={k} must be in [0, {x.shape[-1] if x.ndim else 0}] for an "
                                      f"operand of shape {x.shape} (sorted along its last axis)"))
    if 0 < int(k) <= SELECT_MAX_K and x.shape[-1] > int(k):
        order = _selected(order_keys(x, descending=True, signed_zeros=True), int(k))
    else:
        order = argsort_keys([x], x.ndim - 1, descending=True, signed_zeros=True)
        order = lax.slice_in_dim(order, 0, int(k), axis=-1)
    return jnp.take_along_axis(x, order, -1), order


SELECT_MAX_K = 16  # top_k of at most this many entries selects them one by one instead of sorting the rows: the
                   # sorting network's log2(n)^2 / 2 passes over the whole array (78 for rows of 4096) took 238 ms
                   # for 8 of (1024, 4096), JAX 7.5 ms


def _selected(keys: Array, k: int) -> Array:
    """The int32 positions of the k smallest `keys` along the last axis, smallest first and the lower position
    first among equal keys: k rounds that each take, of the positions not taken yet, the lowest one holding their
    smallest key (two reductions a row, which row chains keep in cache)."""
    from fnx import numpy as jnp
    n = keys.shape[-1]
    position = lax.broadcasted_iota(dtypes.int32, keys.shape, keys.ndim - 1)
    most = lax.full((), np.iinfo(keys.uop.dtype.np).max, keys.uop.dtype)
    taken = jnp.zeros(keys.shape, dtypes.bool_)
    picks = []
    for _ in range(k):
        free = jnp.where(taken, most, keys)
        least = free.min(axis=-1, keepdims=True)
        pick = jnp.where((free == least) & ~taken, position, n).min(axis=-1, keepdims=True)
        picks.append(pick)
        taken = taken | (position == pick)
    return jnp.concatenate(picks, axis=-1)



def approx_max_k(operand: Any, k: int, reduction_dimension: int = -1, recall_target: float = 0.95,
                 reduction_input_size_override: int = -1, aggregate_to_topk: bool = True) -> tuple[Array, Array]:
    """The k largest entries along `reduction_dimension` and their indices (jax.lax.approx_max_k); fnx returns
    the exact top k, which meets any recall target."""
    from fnx import numpy as jnp
    x = to_array(operand)
    axis = reduction_dimension % x.ndim
    values, index = top_k(jnp.moveaxis(x, axis, -1), k)
    return jnp.moveaxis(values, -1, axis), jnp.moveaxis(index, -1, axis)


def approx_min_k(operand: Any, k: int, reduction_dimension: int = -1, recall_target: float = 0.95,
                 reduction_input_size_override: int = -1, aggregate_to_topk: bool = True) -> tuple[Array, Array]:
    """The k smallest entries and their indices (exact, as approx_max_k)."""
    from fnx import numpy as jnp
    x = to_array(operand)
    axis = reduction_dimension % x.ndim
    order = argsort_keys([jnp.moveaxis(x, axis, -1)], x.ndim - 1)
    order = lax.slice_in_dim(order, 0, int(k), axis=-1)
    values = jnp.take_along_axis(jnp.moveaxis(x, axis, -1), order, -1)
    return jnp.moveaxis(values, -1, axis), jnp.moveaxis(order, -1, axis)

lax._extend({name: globals()[name] for name in __all__})
