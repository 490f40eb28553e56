"""jax.numpy's sorting, searching, set and order-statistics functions: sort, argsort, lexsort, partition,
argpartition, searchsorted, unique (and the unique_* family), median, percentile, quantile and their nan-ignoring
forms. All stand on fnx.lax's stable sorting network (fnx/lax_sort.py), so they run under jit, vmap and grad
(values are gathered by the sorted order), and order values as JAX does: -0.0 equal to +0.0, NaN last, ties in
their original order.

    >>> jnp.unique(jnp.array([3, 1, 3, 2]), size=4, fill_value=-1)
    Array([ 1,  2,  3, -1], dtype=int32)
"""
from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np

from fnx import dtypes, lax
from fnx import numpy as jnp
from fnx.errors import ConcretizationError, at_user_line
from fnx.lax_sort import argsort_keys, order_keys
from fnx.trace import Array, cast, eager_op
from fnx.transforms.jit import jitted_op

__all__ = ["argpartition", "argsort", "intersect1d", "isin", "lexsort", "median", "nanmedian", "nanpercentile",
           "nanquantile", "partition", "percentile", "quantile", "searchsorted", "setdiff1d", "setxor1d", "sort",
           "union1d", "unique", "unique_all", "unique_counts", "unique_inverse", "unique_values"]


def _along(a: Any, axis: Any) -> tuple[Array, int]:
    """`a` as an Array and `axis` normalized; axis None flattens."""
    a = jnp.asarray(a)
    if axis is None: return jnp.ravel(a), 0
    if a.ndim == 0: raise ValueError(at_user_line(f"sort: axis {axis} is out of bounds for a 0-d array"))
    return a, int(axis) % a.ndim


@jitted_op(automatic=True)
def argsort(a: Any, axis: int | None = -1, *, kind: Any = None, order: Any = None, stable: bool = True,
            descending: bool = False) -> Array:
    """The int32 indices that sort `a` along `axis` (None: flattened); stable, also when `descending` (equal
    elements keep their order)."""
    a, axis = _along(a, axis)
    return cast(argsort_keys(_keys(a), axis, descending), dtypes.default_int())  # (int64 with x64 on, as JAX)


def _keys(a: Array) -> list[Array]:
    """The sort keys of `a`: itself, or a complex array's real then imaginary part (JAX's lexicographic order)."""
    return [jnp.real(a), jnp.imag(a)] if a.uop.dtype.is_complex else [a]


@jitted_op(automatic=True)
def sort(a: Any, axis: int | None = -1, *, kind: Any = None, order: Any = None, stable: bool = True,
         descending: bool = False) -> Array:
    """`a` sorted along `axis` (None: flattened); `descending` reverses the ascending sort."""
    a, axis = _along(a, axis)
    ordered = jnp.take_along_axis(a, argsort_keys(_keys(a), axis), axis)
    return lax.rev(ordered, (axis,)) if descending else ordered  # (as JAX: equal elements reversed too)


@jitted_op(automatic=True)
def lexsort(keys: Any, axis: int = -1) -> Array:
    """The indices that sort by several keys, the LAST key primary (numpy's convention)."""
    keys = [jnp.asarray(k) for k in keys]
    if not keys: raise TypeError(at_user_line("lexsort: need at least one key"))
    if len({k.shape for k in keys}) != 1:
        raise ValueError(at_user_line(f"lexsort: all keys must have one shape, got {[k.shape for k in keys]}"))
    return cast(argsort_keys(keys[::-1], int(axis) % keys[0].ndim), dtypes.default_int())


@jitted_op(automatic=True)
def partition(a: Any, kth: int, axis: int = -1) -> Array:
    """`a` with the kth+1 smallest elements first, ascending, then the others from the largest down (JAX's layout
    of a partition; equal elements in their original order)."""
    a, axis = _along(a, axis)
    return jnp.take_along_axis(a, _partition_order(a, kth, axis, rest_descending=True), axis)


@jitted_op(automatic=True)
def argpartition(a: Any, kth: int, axis: int = -1) -> Array:
    """Indices that partition `a`: those of the kth+1 smallest elements, ascending, then the others' in index
    order (JAX's layout)."""
    a, axis = _along(a, axis)
    return _partition_order(a, kth, axis, rest_descending=False)


def _partition_order(a: Array, kth: int, axis: int, rest_descending: bool) -> Array:
    n = a.shape[axis]
    if not -n <= kth < n: raise ValueError(at_user_line(f"partition: kth={kth} out of bounds for axis of size {n}"))
    kth = kth % n
    position = lax.broadcasted_iota(dtypes.int32, a.shape, axis)

    def rank(descending: bool) -> Array:  # each element's place in the (stable) sorted order
        return _scatter_along(jnp.zeros(a.shape, jnp.int32), argsort_keys([a], axis, descending), position, axis)
    up = rank(False)
    return argsort_keys([jnp.where(up <= kth, up, n + (rank(True) if rest_descending else position))], axis)


def _scatter_along(target: Array, index: Array, values: Array, axis: int) -> Array:
    """target with target[..., index[..., i], ...] = values[..., i, ...] along `axis` (index a permutation)."""
    moved_t, moved_i, moved_v = (jnp.moveaxis(x, axis, -1) for x in (target, index, values))
    rows = moved_t.reshape(-1, moved_t.shape[-1])
    flat_i, flat_v = moved_i.reshape(rows.shape), moved_v.reshape(rows.shape)
    batch = lax.broadcasted_iota(dtypes.int32, rows.shape, 0)
    out = rows.at[batch, flat_i].set(flat_v)
    return jnp.moveaxis(out.reshape(moved_t.shape), -1, axis)


@jitted_op("side", "method")  # (v: an argument, a scalar query too)
def searchsorted(a: Any, v: Any, side: str = "left", sorter: Any = None, *, method: str = "scan") -> Array:
    """Indices where the elements of `v` would be inserted into the sorted 1-d `a` to keep it sorted (int32;
    'left': before equal elements, 'right': after). NaN sorts last, as in sort."""
    a, v = jnp.asarray(a), jnp.asarray(v)
    if a.ndim != 1: raise ValueError(at_user_line(f"searchsorted: a must be 1-d, got shape {a.shape}"))
    if side not in ("left", "right"):
        raise ValueError(at_user_line(f"searchsorted: side must be 'left' or 'right', got {side!r}"))
    if sorter is not None: a = jnp.take(a, jnp.asarray(sorter))
    common = jnp.result_type(a, v)
    ka, kv = order_keys(a.astype(common)), order_keys(v.astype(common))
    before = (ka < kv[..., None]) if side == "left" else (ka <= kv[..., None])
    return jnp.sum(before, axis=-1, dtype=jnp.int32)


def _firsts(keys: Array) -> Array:
    """Where a sorted 1-d array of order keys starts a run of equal ones (its distinct values' first places)."""
    return jnp.concatenate([jnp.ones((min(keys.shape[0], 1),), bool), keys[1:] != keys[:-1]])


class _UniqueAll(NamedTuple):
    values: Array
    indices: Array
    inverse_indices: Array
    counts: Array


class _UniqueCounts(NamedTuple):
    values: Array
    counts: Array


class _UniqueInverse(NamedTuple):
    values: Array
    inverse_indices: Array


@eager_op
def unique(ar: Any, return_index: bool = False, return_inverse: bool = False, return_counts: bool = False,
           axis: int | None = None, *, equal_nan: bool = True, size: int | None = None, fill_value: Any = None,
           sorted: bool = True) -> Any:
    """The sorted distinct elements of `ar` (flattened), optionally with the index of each one's first
    occurrence, the inverse map (input shape) and the counts. Under jit the number of distinct elements is not
    known: pass `size` (the result is cut or padded to it: values with `fill_value`, default the smallest
    element; indices with the smallest element's index; counts with 0)."""
    if axis is not None:
        raise NotImplementedError("unique: axis= (distinct slices) is not implemented in fnx yet; flatten or use "
                                  "axis=None")
    x = jnp.ravel(jnp.asarray(ar))
    n = x.shape[0]
    order = argsort_keys([x], 0)
    ordered = jnp.take(x, order)
    keys = order_keys(ordered)
    first = _firsts(keys)
    if not equal_nan and ordered.dtype.kind == "f": first = first | jnp.isnan(ordered)
    group = jnp.cumsum(first, dtype=jnp.int32) - 1
    if size is None:
        try:
            size = int(jnp.sum(first))
        except ConcretizationError:
            raise ConcretizationError(at_user_line(
                "unique: the number of distinct elements depends on the values, so under jit it needs a static "
                "size= (the result is cut or padded to it)")) from None
    size = int(size)
    present = jnp.arange(size) < (group[-1] + 1 if n else 0)
    starts = jnp.full((size,), n, jnp.int32).at[group].min(jnp.arange(n, dtype=jnp.int32), mode="drop") \
        if n else jnp.zeros((size,), jnp.int32)  # (each group's first sorted position)
    starts = jnp.where(present, starts, 0)
    values = jnp.take(ordered, starts, mode="clip") if n else jnp.zeros((size,), x.dtype)
    fill = (ordered[0] if n else 0) if fill_value is None else fill_value
    values = jnp.where(present, values, jnp.asarray(fill, x.dtype))
    out = [values]
    if return_index: out.append(jnp.take(order, starts, mode="clip") if n else jnp.zeros((size,), jnp.int32))
    if return_inverse:
        inverse = jnp.zeros((n,), jnp.int32).at[order].set(group) if n else jnp.zeros((0,), jnp.int32)
        out.append(inverse.reshape(jnp.shape(ar)))
    if return_counts: out.append(jnp.zeros((size,), jnp.int32).at[group].add(1, mode="drop"))
    return out[0] if len(out) == 1 else tuple(out)


def unique_values(x: Any, *, size: int | None = None, fill_value: Any = None) -> Array:
    return unique(x, size=size, fill_value=fill_value)


def unique_counts(x: Any, *, size: int | None = None, fill_value: Any = None) -> _UniqueCounts:
    return _UniqueCounts(*unique(x, return_counts=True, size=size, fill_value=fill_value))


def unique_inverse(x: Any, *, size: int | None = None, fill_value: Any = None) -> _UniqueInverse:
    return _UniqueInverse(*unique(x, return_inverse=True, size=size, fill_value=fill_value))


def unique_all(x: Any, *, size: int | None = None, fill_value: Any = None) -> _UniqueAll:
    return _UniqueAll(*unique(x, return_index=True, return_inverse=True, return_counts=True, size=size,
                              fill_value=fill_value))


_METHODS = ("linear", "lower", "higher", "midpoint", "nearest")


def _quantile(a: Any, q: Any, axis: Any, method: str, keepdims: bool, ignore_nan: bool, name: str) -> Array:
    a, q = jnp.asarray(a), jnp.asarray(q)
    if method not in _METHODS: raise ValueError(at_user_line(f"{name}: method must be one of {_METHODS}, "
                                                             f"got {method!r}"))
    if not jnp.issubdtype(a.dtype, jnp.floating): a = a.astype(jnp.result_type(a, 1.0))
    q = q.astype(a.dtype)
    axes = tuple(range(a.ndim)) if axis is None else tuple(ax % a.ndim for ax in np.atleast_1d(axis))
    rest = [ax for ax in range(a.ndim) if ax not in axes]
    moved = jnp.transpose(a, rest + list(axes))
    moved = moved.reshape(moved.shape[:len(rest)] + (-1,))  # (rest..., n)
    n = moved.shape[-1]
    ordered = sort(moved, axis=-1)  # NaN last
    nan = jnp.isnan(moved)
    count = (n - jnp.sum(nan, axis=-1)) if ignore_nan else jnp.full(moved.shape[:-1], n)
    qs = q.reshape(q.shape + (1,) * len(rest))
    position = qs * (count.astype(a.dtype) - 1)
    low = jnp.clip(jnp.floor(position), 0, n - 1).astype(jnp.int32)
    high = jnp.clip(jnp.ceil(position), 0, n - 1).astype(jnp.int32)

    def at(index):
        rows = jnp.broadcast_to(ordered, index.shape + (n,)) if index.ndim > ordered.ndim - 1 else ordered
        return jnp.take_along_axis(rows, index[..., None], -1)[..., 0]
    lo, hi = at(low), at(high)
    if method == "lower": out = lo
    elif method == "higher": out = hi
    elif method == "midpoint": out = (lo + hi) / 2
    elif method == "nearest": out = at(jnp.clip(jnp.round(position), 0, n - 1).astype(jnp.int32))
    else:  # JAX's weighted sum (lo + (hi - lo) * t would give NaN between equal infinities: median([inf, inf])),
        # but lo itself at a whole index, where JAX and numpy weight hi by 0 and give NaN for an infinite hi
        high_weight = position - jnp.floor(position)
        out = jnp.where(high_weight == 0, lo, lo * (1 - high_weight) + hi * high_weight)
    bad = (count == 0) if ignore_nan else jnp.any(nan, axis=-1)
    out = jnp.where(bad, jnp.nan, out)
    if keepdims:
        shape = list(a.shape)
        for ax in axes: shape[ax] = 1
        out = out.reshape(q.shape + tuple(shape))
    return out


@jitted_op("axis", "out", "overwrite_input", "method", "keepdims")  # (q: an argument)
def quantile(a: Any, q: Any, axis: Any = None, out: None = None, overwrite_input: bool = False,
             method: str = "linear", keepdims: bool = False) -> Array:
    """The q-th quantiles (q in [0, 1]) of `a` over `axis` (None: all); q's axes come first in the result. A
    slice with a NaN gives NaN."""
    return _quantile(a, q, axis, method, keepdims, False, "quantile")


@jitted_op("axis", "out", "overwrite_input", "method", "keepdims")  # (q: an argument)
def nanquantile(a: Any, q: Any, axis: Any = None, out: None = None, overwrite_input: bool = False,
                method: str = "linear", keepdims: bool = False) -> Array:
    """quantile ignoring NaNs (an all-NaN slice gives NaN)."""
    return _quantile(a, q, axis, method, keepdims, True, "nanquantile")


def percentile(a: Any, q: Any, axis: Any = None, out: None = None, overwrite_input: bool = False,
               method: str = "linear", keepdims: bool = False) -> Array:
    """quantile with q in percent."""
    return quantile(a, jnp.asarray(q) / 100, axis, method=method, keepdims=keepdims)


def nanpercentile(a: Any, q: Any, axis: Any = None, out: None = None, overwrite_input: bool = False,
                  method: str = "linear", keepdims: bool = False) -> Array:
    """nanquantile with q in percent."""
    return nanquantile(a, jnp.asarray(q) / 100, axis, method=method, keepdims=keepdims)


def median(a: Any, axis: Any = None, out: None = None, overwrite_input: bool = False,
           keepdims: bool = False) -> Array:
    """The median over `axis` (None: all): quantile 0.5, the mean of the middle two for an even count."""
    return quantile(a, 0.5, axis, keepdims=keepdims)


def nanmedian(a: Any, axis: Any = None, out: None = None, overwrite_input: bool = False,
              keepdims: bool = False) -> Array:
    """median ignoring NaNs."""
    return nanquantile(a, 0.5, axis, keepdims=keepdims)



# ---- sets: on sorting and unique ----

@eager_op
def isin(element: Any, test_elements: Any, assume_unique: bool = False, invert: bool = False, *,
         method: str = "auto") -> Array:
    """Whether each element of `element` is among `test_elements` (every pair compared: no sort, any shape)."""
    element, tests = jnp.asarray(element), jnp.ravel(jnp.asarray(test_elements))
    found = jnp.any(element[..., None] == tests, axis=-1) if tests.shape[0] else jnp.zeros(element.shape, bool)
    return ~found if invert else found


def _set_result(values: Array, keep: Array, size: int | None, fill_value: Any, name: str,
                default_fill: Any = None) -> Array:
    """The sorted `values` where `keep`, packed to the front (cut or padded to `size` under jit); the padding is
    `fill_value`, else `default_fill`, else the result's first (smallest) element, as JAX pads."""
    if size is None:
        try:
            size = int(jnp.sum(keep))
        except ConcretizationError:
            raise ConcretizationError(at_user_line(f"{name}: the result's size depends on the values, so under "
                                                   "jit it needs a static size=")) from None
    order = argsort_keys([~keep], 0)  # (kept ones first, in their sorted order: the sort is stable)
    packed = jnp.take(values, order)[:size] if values.shape[0] else jnp.zeros((0,), values.dtype)
    count = jnp.sum(keep)
    if packed.shape[0] < size: packed = jnp.concatenate([packed, jnp.zeros((size - packed.shape[0],), values.dtype)])
    if fill_value is None:
        fill_value = default_fill if default_fill is not None else jnp.where(count > 0, packed[0], 0) if size else 0
    return jnp.where(jnp.arange(size) < count, packed, jnp.asarray(fill_value, values.dtype))


@eager_op
def union1d(ar1: Any, ar2: Any, *, size: int | None = None, fill_value: Any = None) -> Array:
    """The sorted distinct elements of either array."""
    return unique(jnp.concatenate([jnp.ravel(jnp.asarray(ar1)), jnp.ravel(jnp.asarray(ar2))]), size=size,
                  fill_value=fill_value)


@eager_op
def setdiff1d(ar1: Any, ar2: Any, assume_unique: bool = False, *, size: int | None = None,
              fill_value: Any = None) -> Array:
    """The sorted distinct elements of ar1 that are not in ar2."""
    a = sort(jnp.ravel(jnp.asarray(ar1)))
    keys = order_keys(a)
    first = _firsts(keys)
    return _set_result(a, first & ~isin(a, ar2), size, fill_value, "setdiff1d", default_fill=0)


@eager_op
def intersect1d(ar1: Any, ar2: Any, assume_unique: bool = False, return_indices: bool = False, *,
                size: int | None = None, fill_value: Any = None) -> Any:
    """The sorted distinct elements of both arrays; with `return_indices`, also where each first occurs in ar1
    and in ar2."""
    a, b = jnp.ravel(jnp.asarray(ar1)), jnp.ravel(jnp.asarray(ar2))
    ordered = sort(a)
    keys = order_keys(ordered)
    first = _firsts(keys)
    values = _set_result(ordered, first & isin(ordered, b), size, fill_value, "intersect1d")
    if not return_indices: return values
    count = values.shape[0]

    def first_index(source: Array) -> Array:  # the first position of each value in `source`
        match = source[None, :] == values[:, None]
        return jnp.where(jnp.any(match, axis=1), jnp.argmax(match, axis=1), 0).astype(jnp.int32) if count else \
            jnp.zeros((0,), jnp.int32)
    return values, first_index(a), first_index(b)


@eager_op
def setxor1d(ar1: Any, ar2: Any, assume_unique: bool = False, *, size: int | None = None,
             fill_value: Any = None) -> Array:
    """The sorted distinct elements in exactly one of the arrays."""
    a, b = jnp.ravel(jnp.asarray(ar1)), jnp.ravel(jnp.asarray(ar2))
    ordered = sort(jnp.concatenate([a, b]))
    keys = order_keys(ordered)
    first = _firsts(keys)
    return _set_result(ordered, first & (isin(ordered, a) != isin(ordered, b)), size, fill_value, "setxor1d")

jnp._extend({name: globals()[name] for name in __all__})
