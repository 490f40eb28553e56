"""jax.lax's general gather and scatter (XLA's dimension numbers), composed from fnx.lax's one-axis gather and
scatter: fnx.lax re-exports every name in `__all__`.

Each element of the result (of a gather) or of the updates (of a scatter) has one position in the operand: its
window's start, read from the index vectors along the last axis of the indices (JAX's index_vector_dim), plus its
offset inside the window. This module computes that position for every element as a flat index into the
operand's elements and hands it to `gather_axis` / `scatter_axis` of the flattened operand, so jit, vmap and grad
follow from those primitives' rules.

Out-of-bounds windows follow `mode` (GatherScatterMode): 'clip' moves the window's start so that the whole window
fits; 'fill' / 'drop' (FILL_OR_DROP) fills a gathered window with `fill_value` (NaN for floats, the minimum of
signed and the maximum of unsigned integers, True) and drops a scattered window, when any part of the window is
out of bounds. With no mode or 'promise_in_bounds', a gather clips and a scatter drops, as JAX's results do.

    >>> from fnx import lax
    >>> dn = lax.GatherDimensionNumbers(offset_dims=(1,), collapsed_slice_dims=(0,), start_index_map=(0,))
    >>> lax.gather(np.arange(6.0).reshape(3, 2), np.array([[2], [0]]), dn, slice_sizes=(1, 2))
    Array([[4., 5.],
           [0., 1.]], dtype=float32)
"""
from __future__ import annotations

import math
from typing import Any, Callable, NamedTuple, Sequence

import numpy as np

from fnx import dtypes
from fnx import lax as _lax
from fnx.control_flow import fori_loop
from fnx.errors import ShapeError, at_user_line
from fnx.lax_ops import GatherScatterMode
from fnx.trace import Array, to_array, with_weak

__all__ = ["GatherDimensionNumbers", "ScatterDimensionNumbers", "gather", "scatter", "scatter_add", "scatter_sub",
           "scatter_mul", "scatter_min", "scatter_max", "scatter_apply"]


class GatherDimensionNumbers(NamedTuple):
    """jax.lax.GatherDimensionNumbers: which result axes are window offsets (`offset_dims`), which operand axes
    the window drops (`collapsed_slice_dims`, each of slice size 1), which operand axis each index-vector entry
    starts (`start_index_map`), and operand axes matched one to one with axes of the indices (batching)."""
    offset_dims: tuple[int, ...]
    collapsed_slice_dims: tuple[int, ...]
    start_index_map: tuple[int, ...]
    operand_batching_dims: tuple[int, ...] = ()
    start_indices_batching_dims: tuple[int, ...] = ()


class ScatterDimensionNumbers(NamedTuple):
    """jax.lax.ScatterDimensionNumbers: which axes of the updates are window axes (`update_window_dims`), which
    operand axes the window leaves out (`inserted_window_dims`, size 1), which operand axis each index-vector
    entry starts (`scatter_dims_to_operand_dims`), and operand axes matched with axes of the indices (batching)."""
    update_window_dims: Sequence[int]
    inserted_window_dims: Sequence[int]
    scatter_dims_to_operand_dims: Sequence[int]
    operand_batching_dims: Sequence[int] = ()
    scatter_indices_batching_dims: Sequence[int] = ()


def _mode(mode: Any, default: str) -> str:
    """'clip' or 'fill' from a GatherScatterMode or its name; None and 'promise_in_bounds' give XLA's own rule,
    `default` (JAX's results: a gather clips, a scatter drops)."""
    if mode is None: return default
    name = mode.name if isinstance(mode, GatherScatterMode) else str(mode).upper()
    if name == "PROMISE_IN_BOUNDS": return default
    if name == "CLIP": return "clip"
    if name in ("FILL_OR_DROP", "FILL", "DROP"): return "fill"
    raise ValueError(at_user_line(f"gather/scatter: unknown mode {mode!r} (expected 'clip', 'fill', "
                                  "'promise_in_bounds' or a lax.GatherScatterMode)"))


def _check_axes(op: str, what: str, axes: Sequence[int], rank: int) -> tuple[int, ...]:
    axes = tuple(int(a) for a in axes)
    if any(not 0 <= a < rank for a in axes) or len(set(axes)) != len(axes):
        raise ShapeError(at_user_line(f"{op}: {what} {axes} must be distinct axes below {rank}"))
    return axes


def _window_positions(op: str, operand: Array, indices: Array, index_map: tuple[int, ...],
                      batching: tuple[tuple[int, int], ...], sizes: tuple[int, ...], window: tuple[int, ...],
                      clip: bool) -> tuple[Array, Array]:
    """(flat, inside): the flat operand index of every element of every window, shape batch + window sizes, and
    whether each window lies wholly inside the operand, shape batch (before any clipping).

    `indices` has the batch axes and the index vector last; `index_map[k]` is the operand axis that entry k
    starts; `batching` pairs (operand axis, batch axis of the indices) that share one coordinate; `window` lists the
    operand axes the window spans (the others contribute only their start)."""
    batch = indices.shape[:-1]
    if indices.shape[-1] != len(index_map):
        raise ShapeError(at_user_line(f"{op}: index vectors of length {indices.shape[-1]} (the last axis of indices "
                                      f"of shape {indices.shape}) for {len(index_map)} start axes {index_map}"))
    size = math.prod(operand.shape)
    wide = dtypes.int64 if size >= 2 ** 31 else dtypes.int32  # (fnx's own int64: never narrowed by the x64 flag)
    idx = _lax.convert_element_type(indices, wide)
    strides = [math.prod(operand.shape[d + 1:]) for d in range(operand.ndim)]
    flat, inside = _lax.full(batch, 0, wide), _lax.full(batch, True, dtypes.bool_)
    for d in range(operand.ndim):
        if d in index_map:
            start = _lax.reshape(_lax.slice(idx, (0,) * len(batch) + (index_map.index(d),), batch + (
                index_map.index(d) + 1,)), batch)
            top = operand.shape[d] - sizes[d]
            inside = inside & (start >= 0) & (start <= top)
            start = _lax.max(_lax.min(start, _lax.full(batch, top, wide)), _lax.full(batch, 0, wide)) if clip \
                else start
        elif (axis := dict(batching).get(d)) is not None:
            start = _lax.broadcasted_iota(wide, batch, axis)
        else:
            continue
        flat = flat + start * _lax.full(batch, strides[d], wide)
    extent = tuple(sizes[d] for d in window)
    offsets = _lax.full(extent, 0, wide)
    for k, d in enumerate(window):
        offsets = offsets + _lax.broadcasted_iota(wide, extent, k) * _lax.full(extent, strides[d], wide)
    full_shape = batch + extent
    flat = _lax.broadcast_in_dim(flat, full_shape, tuple(range(len(batch)))) + _lax.broadcast_in_dim(
        offsets, full_shape, tuple(range(len(batch), len(full_shape))))
    return flat, inside


def gather(operand, start_indices, dimension_numbers: GatherDimensionNumbers, slice_sizes: Sequence[int], *,
           unique_indices: bool = False, indices_are_sorted: bool = False, mode=None, fill_value=None) -> Array:
    """jax.lax.gather: windows of `slice_sizes` from `operand`, one per index vector of `start_indices` (its last
    axis), arranged by `dimension_numbers` (module docstring). `unique_indices` and `indices_are_sorted` are
    hints and are ignored."""
    x, s = to_array(operand), to_array(start_indices)
    if not s.uop.dtype.is_int:
        raise TypeError(at_user_line(f"gather: start_indices must be integers, got {s.uop.dtype}"))
    if s.ndim == 0: raise ShapeError(at_user_line("gather: start_indices must have an index vector axis (rank >= 1)"))
    dn = dimension_numbers
    sizes = tuple(int(n) for n in slice_sizes)
    if len(sizes) != x.ndim or any(not 0 <= n <= dim for n, dim in zip(sizes, x.shape)):
        raise ShapeError(at_user_line(f"gather: slice_sizes {sizes} must give one size per axis of the operand "
                                      f"{x.shape}, each between 0 and the axis' length"))
    collapsed = _check_axes("gather", "collapsed_slice_dims", dn.collapsed_slice_dims, x.ndim)
    index_map = _check_axes("gather", "start_index_map", dn.start_index_map, x.ndim)
    op_batch = _check_axes("gather", "operand_batching_dims", dn.operand_batching_dims, x.ndim)
    idx_batch = _check_axes("gather", "start_indices_batching_dims", dn.start_indices_batching_dims, s.ndim - 1)
    if any(sizes[d] != 1 for d in collapsed + op_batch):
        raise ShapeError(at_user_line(f"gather: collapsed and batching axes {collapsed + op_batch} need slice size 1, "
                                      f"got slice_sizes {sizes}"))
    if len(op_batch) != len(idx_batch) or any(x.shape[a] != s.shape[b] for a, b in zip(op_batch, idx_batch)):
        raise ShapeError(at_user_line(f"gather: operand_batching_dims {op_batch} of operand {x.shape} and "
                                      f"start_indices_batching_dims {idx_batch} of indices {s.shape} must pair axes "
                                      "of equal length"))
    window = tuple(d for d in range(x.ndim) if d not in collapsed and d not in op_batch)
    batch = s.shape[:-1]
    offset_dims = _check_axes("gather", "offset_dims", dn.offset_dims, len(batch) + len(window))
    if len(offset_dims) != len(window):
        raise ShapeError(at_user_line(f"gather: {len(offset_dims)} offset_dims {offset_dims} for the {len(window)} "
                                      f"window axes {window} of the operand"))
    clip = _mode(mode, "clip") == "clip"
    out_shape = batch + tuple(sizes[d] for d in window)
    if math.prod(x.shape) == 0 or math.prod(out_shape) == 0:
        got = _lax.full(out_shape, 0, x.uop.dtype)
    else:
        flat, inside = _window_positions("gather", x, s, index_map, tuple(zip(op_batch, idx_batch)), sizes, window,
                                         clip)
        got = _lax.gather_axis(_lax.reshape(x, (math.prod(x.shape),)), flat, 0)
        if not clip:
            fill = _fill_value(x.uop.dtype, fill_value)
            mask = _lax.broadcast_in_dim(inside, out_shape, tuple(range(len(batch))))
            got = _lax.select(mask, got, _lax.full(out_shape, fill, x.uop.dtype))
    # result axes: the batch axes in order where offset_dims leaves room, the window axes at offset_dims
    order, batch_axes, window_axes = [], iter(range(len(batch))), iter(range(len(batch), len(out_shape)))
    for position in range(len(out_shape)):
        order.append(next(window_axes) if position in offset_dims else next(batch_axes))
    return with_weak(_lax.transpose(got, tuple(order)), x.weak_type)


def _fill_value(dt, fill_value):
    if fill_value is not None: return fill_value
    if dt.is_float: return np.nan
    return True if dt.is_bool else (dt.max if dt.is_unsigned else dt.min)


def _scatter(op: str, operand, scatter_indices, updates, dimension_numbers: ScatterDimensionNumbers, mode,
             combine: str) -> Array:
    x, s, u = to_array(operand), to_array(scatter_indices), to_array(updates)
    if not s.uop.dtype.is_int:
        raise TypeError(at_user_line(f"{op}: scatter_indices must be integers, got {s.uop.dtype}"))
    if u.uop.dtype != x.uop.dtype and not u.weak_type:
        raise TypeError(at_user_line(f"{op}: updates of dtype {u.uop.dtype} for an operand of dtype "
                                     f"{x.uop.dtype} (lax requires one dtype; convert with convert_element_type)"))
    if s.ndim == 0: raise ShapeError(at_user_line(f"{op}: scatter_indices must have an index vector axis"))
    dn = dimension_numbers
    window_dims = _check_axes(op, "update_window_dims", dn.update_window_dims, u.ndim)
    inserted = _check_axes(op, "inserted_window_dims", dn.inserted_window_dims, x.ndim)
    index_map = _check_axes(op, "scatter_dims_to_operand_dims", dn.scatter_dims_to_operand_dims, x.ndim)
    op_batch = _check_axes(op, "operand_batching_dims", dn.operand_batching_dims, x.ndim)
    idx_batch = _check_axes(op, "scatter_indices_batching_dims", dn.scatter_indices_batching_dims, s.ndim - 1)
    window = tuple(d for d in range(x.ndim) if d not in inserted and d not in op_batch)
    update_batch = tuple(a for a in range(u.ndim) if a not in window_dims)
    batch = s.shape[:-1]
    extent = tuple(u.shape[a] for a in window_dims)
    if (len(window_dims) != len(window) or tuple(u.shape[a] for a in update_batch) != batch
            or any(n > x.shape[d] for n, d in zip(extent, window))
            or len(op_batch) != len(idx_batch) or any(x.shape[a] != s.shape[b] for a, b in zip(op_batch, idx_batch))):
        raise ShapeError(at_user_line(
            f"{op}: updates of shape {u.shape} do not fit operand {x.shape} and indices {s.shape} with "
            f"{dimension_numbers}: the updates' scatter axes must have the indices' batch shape {batch}, its "
            f"window axes {window_dims} one size (at most the axis' length) for each operand axis {window}"))
    u = _lax.convert_element_type(u, x.uop.dtype)
    # updates with their scatter axes first, then the window axes, as the flat positions are laid out
    u = _lax.transpose(u, update_batch + window_dims)
    if math.prod(x.shape) == 0 or math.prod(u.shape) == 0: return x
    sizes = [1] * x.ndim
    for n, d in zip(extent, window): sizes[d] = n
    clip = _mode(mode, "fill") == "clip"
    flat, inside = _window_positions(op, x, s, index_map, tuple(zip(op_batch, idx_batch)), tuple(sizes), window,
                                     clip)
    total = math.prod(x.shape)
    if not clip:  # a window partly outside goes wholly to an index past the end, which the scatter drops
        mask = _lax.broadcast_in_dim(inside, flat.shape, tuple(range(len(batch))))
        flat = _lax.select(mask, flat, _lax.full(flat.shape, total, flat.uop.dtype))
    count = math.prod(flat.shape)
    out = _lax.scatter_axis(_lax.reshape(x, (total,)), _lax.reshape(flat, (count,)), _lax.reshape(u, (count,)), 0,
                            combine)
    return with_weak(_lax.reshape(out, x.shape), x.weak_type)


def scatter(operand, scatter_indices, updates, dimension_numbers: ScatterDimensionNumbers, *,
            indices_are_sorted: bool = False, unique_indices: bool = False, mode=None) -> Array:
    """jax.lax.scatter: a copy of `operand` with the windows of `updates` written at the index vectors'
    positions (module docstring). Where windows overlap, which update lands is unspecified, as in JAX."""
    return _scatter("scatter", operand, scatter_indices, updates, dimension_numbers, mode, "set")


def scatter_add(operand, scatter_indices, updates, dimension_numbers: ScatterDimensionNumbers, *,
                indices_are_sorted: bool = False, unique_indices: bool = False, mode=None) -> Array:
    """jax.lax.scatter_add: `operand` with the windows of `updates` added in (overlaps add up)."""
    return _scatter("scatter_add", operand, scatter_indices, updates, dimension_numbers, mode, "add")


def scatter_sub(operand, scatter_indices, updates, dimension_numbers: ScatterDimensionNumbers, *,
                indices_are_sorted: bool = False, unique_indices: bool = False, mode=None) -> Array:
    """jax.lax.scatter_sub: `operand` with the windows of `updates` subtracted."""
    return _scatter("scatter_sub", operand, scatter_indices, -to_array(updates), dimension_numbers, mode, "add")


def scatter_mul(operand, scatter_indices, updates, dimension_numbers: ScatterDimensionNumbers, *,
                indices_are_sorted: bool = False, unique_indices: bool = False, mode=None) -> Array:
    """jax.lax.scatter_mul: `operand` with its elements multiplied by the windows of `updates`."""
    return _scatter("scatter_mul", operand, scatter_indices, updates, dimension_numbers, mode, "mul")


def scatter_min(operand, scatter_indices, updates, dimension_numbers: ScatterDimensionNumbers, *,
                indices_are_sorted: bool = False, unique_indices: bool = False, mode=None) -> Array:
    """jax.lax.scatter_min: the minimum of `operand`'s elements and the updates landing on them."""
    return _scatter("scatter_min", operand, scatter_indices, updates, dimension_numbers, mode, "min")


def scatter_max(operand, scatter_indices, updates, dimension_numbers: ScatterDimensionNumbers, *,
                indices_are_sorted: bool = False, unique_indices: bool = False, mode=None) -> Array:
    """jax.lax.scatter_max: the maximum of `operand`'s elements and the updates landing on them."""
    return _scatter("scatter_max", operand, scatter_indices, updates, dimension_numbers, mode, "max")


def scatter_apply(operand, scatter_indices, func: Callable[[Array], Array],
                  dimension_numbers: ScatterDimensionNumbers, *, update_shape: Sequence[int] = (),
                  indices_are_sorted: bool = False, unique_indices: bool = False, mode=None) -> Array:
    """jax.lax.scatter_apply: `operand` with the elementwise `func` applied to each element once for every window
    of updates of shape `update_shape` that covers it (twice where two windows overlap, as in JAX)."""
    x = to_array(operand)
    count = _scatter("scatter_apply", _lax.full(x.shape, 0, dtypes.int32), scatter_indices,
                     _lax.full(tuple(update_shape), 1, dtypes.int32), dimension_numbers, mode, "add")
    most = _lax.reduce_max(count, tuple(range(count.ndim))) if count.ndim else count
    return fori_loop(0, most, lambda i, v: _lax.select(count > i, to_array(func(v)), v), x)


_lax._extend({name: globals()[name] for name in __all__})
