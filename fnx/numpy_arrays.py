"""fnx.numpy's functions for creating, stacking, slicing and rearranging arrays, and its dtype queries.

What is here (every name in `__all__` becomes `fnx.numpy.<name>`):

- creation: tri, tril/triu, indices, meshgrid, mgrid/ogrid, r_/c_ (and numpy's s_/index_exp), logspace, geomspace,
  copy, fromfunction, frombuffer, fromstring (fromiter/fromfile raise, as in JAX);
- index helpers: tril/triu/diag/mask indices (and their *_from forms), ix_, unravel_index, ravel_multi_index;
- stacking and splitting: vstack hstack dstack column_stack block concat unstack append, array_split and
  h/v/dsplit, atleast_1d/2d/3d;
- rearranging: roll rot90 fliplr flipud rollaxis permute_dims matrix_transpose resize delete insert trim_zeros;
- diagonals: diag diagflat diagonal trace fill_diagonal;
- selection: select choose compress extract place put put_along_axis argwhere flatnonzero;
- dtype queries: can_cast issubdtype isdtype isscalar iterable and the abstract dtype
  classes (generic, number, floating, ...) plus the aliases int_/uint/float_/double/single.

Each function composes fnx.lax and the fnx.numpy functions defined before this module is imported, so it runs
eagerly, under jit, vmap and grad alike. Shapes must be static: a result whose shape depends on the values
(argwhere, flatnonzero, compress, extract, delete and trim_zeros without a `size`, ravel_multi_index's
mode='raise' check) needs concrete inputs and raises ConcretizationError under jit, as JAX does. As in JAX,
functions that numpy defines as in-place (fill_diagonal, put_along_axis, place, put) need `inplace=False` and
return the updated copy.
"""
from __future__ import annotations

import builtins
import math
import operator
from typing import Any, Callable, Sequence

import ml_dtypes
import numpy as np

from fnx import dtypes, lax
from fnx.dtypes import DType
from fnx.errors import UnsupportedError, at_user_line
from fnx.numpy import (_broadcast, _concrete, _dt, _full, _slice_axis, _static_scalar,
                       arange, array, concatenate, flip, full, linspace, moveaxis, power, ravel, reshape, split,
                       sum, swapaxes, take, tile, transpose, where, zeros)
from fnx.trace import (Array, as_operand, broadcast_shapes, cast, eager_op, inexact_dtype, is_python_scalar,
                       normalize_axes, promote, shape_str, state, with_weak)

__all__ = [
    # creation
    "tri", "tril", "triu", "indices", "meshgrid", "mgrid", "ogrid", "r_", "c_", "s_", "index_exp", "logspace",
    "geomspace", "copy", "fromfunction", "frombuffer", "fromstring", "fromiter", "fromfile",
    # index helpers
    "tril_indices", "triu_indices", "tril_indices_from", "triu_indices_from", "diag_indices", "diag_indices_from",
    "mask_indices", "ix_", "unravel_index", "ravel_multi_index",
    # stacking and splitting
    "atleast_1d", "atleast_2d", "atleast_3d", "vstack", "hstack", "dstack", "column_stack", "block", "concat",
    "unstack", "append", "array_split", "hsplit", "vsplit", "dsplit",
    # rearranging
    "roll", "rot90", "fliplr", "flipud", "rollaxis", "permute_dims", "matrix_transpose", "resize", "delete", "insert",
    "trim_zeros",
    # diagonals
    "diag", "diagflat", "diagonal", "trace", "fill_diagonal",
    # selection
    "select", "choose", "compress", "extract", "place", "put", "put_along_axis", "argwhere", "flatnonzero",
    # dtypes
    "can_cast", "issubdtype", "isdtype", "isscalar", "iterable", "generic", "number",
    "inexact", "floating", "integer", "signedinteger", "unsignedinteger", "complexfloating", "character", "flexible",
    "object_", "int_", "uint", "float_", "double", "single",
    # mapped over axes, bits, printing and files
    "vectorize", "apply_along_axis", "apply_over_axes", "packbits", "unpackbits", "array_repr", "array_str",
    "get_printoptions", "set_printoptions", "printoptions", "save", "savez", "load", "einsum_path",
]


def _int(x: Any, name: str, what: str) -> int:
    """A static integer argument (a Python/numpy int or a concrete integer Array)."""
    value = _static_scalar(x, name)
    try:
        return operator.index(value)
    except TypeError:
        raise TypeError(at_user_line(f"{name}: {what} must be an integer, got {value!r}")) from None


def _at_least_2d(x: Array, name: str) -> None:
    if x.ndim < 2:
        raise ValueError(at_user_line(f"{name}: the array must have at least 2 dimensions, got {shape_str(x)}"))


# ---- creation ----

def _tri_mask(rows: int, cols: int, k: int, lower: bool) -> Array:
    """bool[rows, cols]: True on and below (lower) or on and above (upper) the k-th diagonal."""
    shape = (rows, cols)
    i, j = lax.broadcasted_iota(dtypes.int64, shape, 0), lax.broadcasted_iota(dtypes.int64, shape, 1)
    return j <= i + k if lower else j >= i + k


@eager_op
def tri(N: int, M: int | None = None, k: int = 0, dtype: Any = None) -> Array:
    """An N x M array with ones at and below the k-th diagonal and zeros elsewhere (float32 by default).

    Example: `tri(3, 2, -1)` -> [[0, 0], [1, 0], [1, 1]].
    """
    rows, cols = lax.canonical_shape((N, N if M is None else M), "tri")
    mask = _tri_mask(rows, cols, _int(k, "tri", "k"), lower=True)
    return cast(mask, dtypes.requested(dtype, "tri") if dtype is not None else dtypes.float32)


def _triangle(name: str, lower: bool):
    def fn(m: Any, k: int = 0) -> Array:
        x = as_operand(m, name)
        _at_least_2d(x, name)
        mask = _broadcast(_tri_mask(*x.shape[-2:], _int(k, name, "k"), lower), x.shape)
        return with_weak(lax.select(mask, x, _full(x, 0)), x.weak_type)
    fn.__name__ = fn.__qualname__ = name
    fn.__doc__ = (f"The {'lower' if lower else 'upper'} triangle of the last two axes of `m`: elements "
                  f"{'below' if lower else 'above'} the k-th diagonal (inclusive) kept, the others zero.\n\n"
                  f"    Example: `{name}(ones((2, 2)))` -> [[1, {'0' if lower else '1'}], "
                  f"[{'1' if lower else '0'}, 1]].")
    return eager_op(fn)


tril = _triangle("tril", lower=True)
triu = _triangle("triu", lower=False)


@eager_op
def indices(dimensions: Sequence[int], dtype: Any = None, sparse: bool = False) -> Array | tuple[Array, ...]:
    """An index grid: `out[d][i0, i1, ...] = i_d` (int32 by default), stacked into one array of shape
    (len(dimensions), *dimensions); with `sparse`, a tuple of arrays broadcastable to that grid.

    Example: `indices((2, 3))[1]` -> [[0, 1, 2], [0, 1, 2]].
    """
    shape = lax.canonical_shape(dimensions, "indices")
    dt = dtypes.requested(dtype, "indices") if dtype is not None else dtypes.default_int()
    if sparse:
        return tuple(lax.reshape(lax.iota(dt, n), tuple(n if i == d else 1 for i in range(len(shape))))
                     for d, n in enumerate(shape))
    if not shape: return zeros((0,), dt)
    return lax.concatenate([lax.broadcasted_iota(dt, (1,) + shape, d + 1) for d in range(len(shape))], 0)


@eager_op
def meshgrid(*xi: Any, copy: bool = True, sparse: bool = False, indexing: str = "xy") -> list[Array]:
    """Coordinate arrays from 1-D coordinate vectors: with indexing='ij' the k-th output varies along axis k;
    with 'xy' (the default) the first two axes are swapped. `sparse` keeps size-1 axes instead of broadcasting.

    Example: `meshgrid(arange(2), arange(3))[0]` -> [[0, 1], [0, 1], [0, 1]].
    """
    arrays = [as_operand(x, "meshgrid") for x in xi]
    if builtins.any(a.ndim != 1 for a in arrays):
        raise ValueError(at_user_line(f"meshgrid: arguments must be 1-D, got {shape_str(*arrays)}"))
    if indexing not in ("xy", "ij"):
        raise ValueError(at_user_line(f"meshgrid: indexing must be 'xy' or 'ij', got {indexing!r}"))
    axes = list(range(len(arrays)))
    if indexing == "xy" and len(arrays) >= 2: axes[0], axes[1] = 1, 0
    shape = [1] * len(arrays)
    for a, axis in zip(arrays, axes): shape[axis] = a.shape[0]
    out = []
    for a, axis in zip(arrays, axes):
        column = lax.reshape(a, tuple(a.shape[0] if i == axis else 1 for i in range(len(arrays))))
        out.append(with_weak(column if sparse else _broadcast(column, tuple(shape)), a.weak_type))
    return out


def _grid_axis(s: slice) -> Array:
    """One axis of mgrid/ogrid: arange(start, stop, step), or `abs(step)` points from start to stop inclusive
    when the step is imaginary (numpy's `0:1:5j`)."""
    start = 0 if s.start is None else s.start
    step = 1 if s.step is None else s.step
    if isinstance(step, complex):
        return linspace(start, s.stop, int(abs(step)))
    return arange(start, s.stop, step)


class _Grid:
    """`mgrid[...]` / `ogrid[...]`: dense or open (broadcastable) coordinate grids indexed by slices."""

    def __init__(self, sparse: bool, name: str):
        self.sparse, self.name = sparse, name

    def __getitem__(self, key: slice | tuple[slice, ...]) -> Array | list[Array]:
        keys = key if isinstance(key, tuple) else (key,)
        if builtins.any(not isinstance(k, slice) for k in keys):
            raise TypeError(at_user_line(f"{self.name}: expected slices like 0:3 or 0:1:5j, got {key!r}"))
        floats = builtins.any(isinstance(v, (float, complex, np.floating)) for k in keys
                              for v in (k.start, k.stop, k.step))
        axes = [cast(a, dtypes.default_float()) if floats else a for a in map(_grid_axis, keys)]
        if not isinstance(key, tuple): return axes[0]
        grids = meshgrid(*axes, indexing="ij", sparse=self.sparse)
        if self.sparse: return grids
        return lax.concatenate([lax.reshape(g, (1,) + g.shape) for g in grids], 0) if grids else \
            arange(0)

    def __repr__(self) -> str:
        return f"fnx.numpy.{self.name}"


mgrid = _Grid(sparse=False, name="mgrid")
ogrid = _Grid(sparse=True, name="ogrid")


def _move_original_axes(x: Array, ndim_before: int, ndmin: int, trans1d: int) -> Array:
    """r_'s rule for an array raised from `ndim_before` to `ndmin` axes with leading 1s: its original axes go to
    position `trans1d` (negative: counted from the end) instead of the end."""
    if trans1d == -1 or ndim_before >= ndmin: return x
    added = ndmin - ndim_before
    at = trans1d + added + 1 if trans1d < 0 else trans1d
    order = list(range(ndmin))
    return transpose(x, order[:at] + order[added:] + order[at:added])


class _AxisConcatenator:
    """`r_[...]` / `c_[...]`: concatenate slices (as arange/linspace), scalars and arrays along an axis. A leading
    string 'axis[,ndmin[,trans1d]]' changes the axis, the minimum rank and where a raised array's axes go."""

    def __init__(self, axis: int, ndmin: int, trans1d: int, name: str):
        self.axis, self.ndmin, self.trans1d, self.name = axis, ndmin, trans1d, name

    def __getitem__(self, key: Any) -> Array:
        items = list(key) if isinstance(key, tuple) else [key]
        axis, ndmin, trans1d = self.axis, self.ndmin, self.trans1d
        if items and isinstance(items[0], str):
            directive = items.pop(0)
            if directive in ("r", "c"):
                raise UnsupportedError(at_user_line(f"{self.name}: the matrix directive {directive!r} is not "
                                                    "supported (fnx has no matrix type)"))
            try:
                parts = [int(p) for p in directive.split(",")]
            except ValueError:
                raise ValueError(at_user_line(f"{self.name}: could not understand directive {directive!r}")) from None
            axis, ndmin, trans1d = (parts + [ndmin, trans1d][len(parts) - 1:])[:3]
        arrays = []
        for item in items:
            a = _grid_axis(item) if isinstance(item, slice) else as_operand(item, self.name)
            raised = array(a, ndmin=builtins.max(ndmin, 1))
            arrays.append(_move_original_axes(raised, a.ndim, ndmin, trans1d))
        if not arrays: return zeros((0,))
        return concatenate(arrays, axis)

    def __repr__(self) -> str:
        return f"fnx.numpy.{self.name}"


r_ = _AxisConcatenator(0, 1, -1, "r_")
c_ = _AxisConcatenator(-1, 2, 0, "c_")
s_, index_exp = np.s_, np.index_exp


def _float_result(name: str, args: Sequence[Any], dtype: Any) -> tuple[list[Array], DType]:
    """The arguments as float64 (the working precision) and the result dtype (`dtype`, else their promoted
    inexact type)."""
    arrays, _ = promote([as_operand(a, name) for a in args])
    dt = dtypes.requested(dtype) if dtype is not None else inexact_dtype(_dt(arrays[0]))
    return [cast(a, dtypes.float64) for a in arrays], dt


def _round_to(values: Array, dt: DType) -> Array:
    return cast(values, dt)  # (to an integer dtype: truncated, as numpy and JAX do)


@eager_op
def logspace(start: Any, stop: Any, num: int = 50, endpoint: bool = True, base: Any = 10.0, dtype: Any = None,
             axis: int = 0) -> Array:
    """`num` values from base**start to base**stop, evenly spaced in the exponent (computed in float64).

    Example: `logspace(0, 2, 3)` -> [1., 10., 100.].
    """
    (lo, hi, b), dt = _float_result("logspace", (start, stop, base), dtype)
    exponents = linspace(lo, hi, num, endpoint=endpoint, dtype=dtypes.float64, axis=axis)
    return _round_to(power(b, exponents), dt)


@eager_op
def geomspace(start: Any, stop: Any, num: int = 50, endpoint: bool = True, dtype: Any = None,
              axis: int = 0) -> Array:
    """`num` values from start to stop in geometric progression (both of one sign; NaN otherwise, as JAX).

    Example: `geomspace(1, 1000, 4)` -> [1., 10., 100., 1000.].
    """
    (lo, hi), dt = _float_result("geomspace", (start, stop), dtype)
    sign = where(lo < 0, _full(lo, -1.0), where(lo > 0, _full(lo, 1.0), _full(lo, np.nan)))
    from fnx.numpy import log10  # (a name fnx.numpy defines; imported here to keep this module's namespace small)
    exponents = linspace(log10(lo / sign), log10(hi / sign), num, endpoint=endpoint, dtype=dtypes.float64, axis=0)
    values = power(_full(exponents, 10.0), exponents) * sign
    return _round_to(moveaxis(values, 0, axis), dt)


@eager_op
def copy(a: Any, order: Any = None) -> Array:
    """An array with the values of `a` (Arrays are immutable, so this is `a` itself)."""
    return array(a)


def fromfunction(function: Callable, shape: Any, *, dtype: Any = float, **kwargs: Any) -> Any:
    """`function(*indices)` called with one index array per axis of `shape` (of `dtype`, float32 by default).

    Example: `fromfunction(lambda i, j: i + j, (2, 2))` -> [[0., 1.], [1., 2.]].
    """
    shape = lax.canonical_shape(shape, "fromfunction")
    dt = dtypes.requested(dtype, "fromfunction")
    return function(*(lax.broadcasted_iota(dt, shape, d) for d in range(len(shape))), **kwargs)


def _host_dtype(dtype: Any) -> np.dtype:
    return np.dtype(ml_dtypes.bfloat16) if dtype is dtypes.bfloat16 else np.dtype(dtype)


def frombuffer(buffer: Any, dtype: Any = float, count: int = -1, offset: int = 0) -> Array:
    """A 1-D array of the bytes of `buffer` read as `dtype` (numpy.frombuffer, then placed on the device)."""
    return array(np.frombuffer(buffer, dtype=_host_dtype(dtype), count=count, offset=offset),
                 dtype=dtypes.requested(dtype, "frombuffer"))


def fromstring(string: str, dtype: Any = float, count: int = -1, *, sep: str) -> Array:
    """A 1-D array of the numbers in `string` separated by `sep` (numpy.fromstring, then placed on the device)."""
    return array(np.fromstring(string, dtype=_host_dtype(dtype), count=count, sep=sep),
                 dtype=dtypes.requested(dtype, "fromstring"))


def fromiter(*args: Any, **kwargs: Any) -> Array:
    """Not implemented, as in JAX: iterators may be impure. Use `asarray(list(iterable))`."""
    raise UnsupportedError(at_user_line("fromiter: not implemented, because it may be non-pure and so unsafe "
                                        "under jit; use fnx.numpy.asarray(list(iterable)) instead"))


def fromfile(*args: Any, **kwargs: Any) -> Array:
    """Not implemented, as in JAX: reading a file is a side effect. Use `asarray(numpy.fromfile(...))`."""
    raise UnsupportedError(at_user_line("fromfile: not implemented, because it may be non-pure and so unsafe "
                                        "under jit; use fnx.numpy.asarray(numpy.fromfile(...)) instead"))


# ---- index helpers ----

def _index_arrays(index_tuple: tuple[np.ndarray, ...]) -> tuple[Array, ...]:
    return tuple(array(np.asarray(i, dtype=np.int32)) for i in index_tuple)


def _triangle_indices(name: str, np_fn):
    def fn(n: int, k: int = 0, m: int | None = None) -> tuple[Array, Array]:
        n, k = _int(n, name, "n"), _int(k, name, "k")
        m = n if m is None else _int(m, name, "m")
        if n < 0 or m < 0: raise ValueError(at_user_line(f"{name}: negative dimensions ({n}, {m})"))
        return _index_arrays(np_fn(n, k, m))
    fn.__name__ = fn.__qualname__ = name
    fn.__doc__ = (f"The (row, column) int32 indices of the {name[:4]} triangle of an n x m array, from the k-th "
                  f"diagonal.\n\n    Example: `{name}(2)` -> {tuple(i.tolist() for i in np_fn(2, 0, 2))}.")
    return fn


tril_indices = _triangle_indices("tril_indices", np.tril_indices)
triu_indices = _triangle_indices("triu_indices", np.triu_indices)


def _two_dims(arr: Any, name: str) -> tuple[int, int]:
    shape = arr.shape if isinstance(arr, Array) else np.shape(arr)
    if len(shape) != 2:
        raise ValueError(at_user_line(f"{name}: only 2-D inputs are accepted, got shape {tuple(shape)}"))
    return shape


def tril_indices_from(arr: Any, k: int = 0) -> tuple[Array, Array]:
    """`tril_indices` for the shape of the 2-D array `arr`."""
    n, m = _two_dims(arr, "tril_indices_from")
    return tril_indices(n, k, m)


def triu_indices_from(arr: Any, k: int = 0) -> tuple[Array, Array]:
    """`triu_indices` for the shape of the 2-D array `arr`."""
    n, m = _two_dims(arr, "triu_indices_from")
    return triu_indices(n, k, m)


def diag_indices(n: int, ndim: int = 2) -> tuple[Array, ...]:
    """`ndim` copies of arange(n) (int32): the indices of the main diagonal of an n x ... x n array."""
    n, ndim = _int(n, "diag_indices", "n"), _int(ndim, "diag_indices", "ndim")
    if n < 0 or ndim < 0: raise ValueError(at_user_line(f"diag_indices: n={n} and ndim={ndim} must be >= 0"))
    return (arange(n),) * ndim


def diag_indices_from(arr: Any) -> tuple[Array, ...]:
    """`diag_indices` for `arr`, whose axes (at least 2) must all have one length."""
    shape = arr.shape if isinstance(arr, Array) else np.shape(arr)
    if len(shape) < 2 or len(set(shape)) != 1:
        raise ValueError(at_user_line(f"diag_indices_from: the input needs at least 2 dimensions, all of equal "
                                      f"length, got shape {tuple(shape)}"))
    return diag_indices(shape[0], len(shape))


def mask_indices(n: int, mask_func: Callable, k: int = 0, *, size: int | None = None) -> tuple[Array, Array]:
    """The indices where `mask_func(ones((n, n)), k)` is nonzero (e.g. mask_func=triu gives triu_indices)."""
    mask = mask_func(full((_int(n, "mask_indices", "n"),) * 2, 1, dtypes.int32), k)
    return tuple(_nonzero_sized(as_operand(mask, "mask_indices"), size, None, "mask_indices"))


@eager_op
def ix_(*args: Any) -> tuple[Array, ...]:
    """Open-mesh index arrays from 1-D integer sequences: the k-th result has shape (1, ..., n_k, ..., 1), so that
    `x[ix_(rows, cols)]` takes the cross product.

    Example: `x[ix_(array([0, 1]), array([2]))]` is x[0:2, 2:3].
    """
    arrays = [as_operand(a, "ix_") for a in args]
    out = []
    for k, a in enumerate(arrays):
        if a.ndim != 1:
            raise ValueError(at_user_line(f"ix_: arguments must be 1-dimensional, got {shape_str(a)}"))
        if _dt(a).is_bool:
            raise UnsupportedError(at_user_line(f"ix_: boolean arguments are not supported, got {shape_str(a)}"))
        out.append(lax.reshape(a, tuple(a.shape[0] if i == k else 1 for i in range(len(arrays)))))
    return tuple(out)


@eager_op
def unravel_index(indices: Any, shape: Sequence[int]) -> tuple[Array, ...]:
    """The coordinates in an array of `shape` of flat (C-order) `indices`. As in JAX, negative indices count from
    the end and indices still out of range are clipped.

    Example: `unravel_index(5, (2, 3))` -> (1, 2).
    """
    idx = as_operand(indices, "unravel_index")
    if not (_dt(idx).is_int or _dt(idx).is_bool):
        raise TypeError(at_user_line(f"unravel_index: indices must be integers, got {shape_str(idx)}"))
    dims = lax.canonical_shape(shape, "unravel_index")
    total = math.prod(dims)
    if total == 0: return tuple(_full(idx, 0) for _ in dims)
    dt = _dt(idx) if _dt(idx).is_int else dtypes.int32
    work = cast(idx, dtypes.int64)
    work = where(work < 0, work + total, work)
    work = where(work < 0, _full(work, 0), where(work >= total, _full(work, total - 1), work))
    coords = []
    for n in reversed(dims):
        coords.append(with_weak(cast(lax.rem(work, n), dt), idx.weak_type))
        work = lax.div(work, n)
    return tuple(reversed(coords))


@eager_op
def ravel_multi_index(multi_index: Sequence[Any], dims: Sequence[int], mode: str = "raise",
                      order: str = "C") -> Array:
    """Flat indices into an array of shape `dims` from one coordinate array per axis. mode 'raise' checks that
    every coordinate is in range (needs concrete values: ConcretizationError under jit, as JAX), 'wrap' takes
    them modulo the axis, 'clip' clamps them. order 'C' (row-major) or 'F' (column-major).

    Example: `ravel_multi_index((array([1]), array([2])), (2, 3))` -> [5].
    """
    dims = lax.canonical_shape(dims, "ravel_multi_index")
    coords = [as_operand(i, "ravel_multi_index") for i in multi_index]
    if len(coords) != len(dims):
        raise ValueError(at_user_line(f"ravel_multi_index: {len(coords)} coordinate arrays for {len(dims)} "
                                      f"dimensions {dims}"))
    if builtins.any(not _dt(c).is_int for c in coords):
        raise TypeError(at_user_line(f"ravel_multi_index: coordinates must be integers, got {shape_str(*coords)}"))
    if order not in ("C", "F"): raise ValueError(at_user_line(f"ravel_multi_index: order must be 'C' or 'F', "
                                                              f"got {order!r}"))
    if mode == "raise":
        for c, n in zip(coords, dims):
            value = _concrete(c, "ravel_multi_index (mode='raise')")
            if ((value < 0) | (value >= n)).any():
                raise ValueError(at_user_line(f"ravel_multi_index: invalid entry in coordinates array "
                                              f"{value.tolist()} for an axis of size {n}"))
    elif mode == "wrap":
        from fnx.numpy import mod
        coords = [mod(c, n) if n else c for c, n in zip(coords, dims)]
    elif mode == "clip":
        coords = [where(c < 0, _full(c, 0), where(c >= n, _full(c, builtins.max(n - 1, 0)), c))
                  for c, n in zip(coords, dims)]
    else:
        raise ValueError(at_user_line(f"ravel_multi_index: mode must be 'raise', 'wrap' or 'clip', got {mode!r}"))
    coords, _ = promote(coords)
    axes = range(len(dims)) if order == "C" else reversed(range(len(dims)))
    flat = None
    for axis in axes:
        flat = coords[axis] if flat is None else flat * dims[axis] + coords[axis]
    if flat is None: return array(0)
    return with_weak(_broadcast(flat, flat.shape), False)


# ---- stacking and splitting ----

def _at_least(name: str, ndmin: int, raise_shape: Callable[[tuple[int, ...]], tuple[int, ...]]):
    def fn(*arys: Any) -> Array | list[Array]:
        out = []
        for a in arys:
            x = as_operand(a, name)
            out.append(x if x.ndim >= ndmin else lax.reshape(x, raise_shape(x.shape)))
        return out[0] if len(out) == 1 else out
    fn.__name__ = fn.__qualname__ = name
    fn.__doc__ = (f"Each argument with at least {ndmin} dimension{'s' if ndmin > 1 else ''} (size-1 axes added as "
                  f"numpy.{name} does); one array for one argument, else a list.")
    return eager_op(fn)


atleast_1d = _at_least("atleast_1d", 1, lambda s: (1,))
atleast_2d = _at_least("atleast_2d", 2, lambda s: (1,) * (2 - len(s)) + s)
atleast_3d = _at_least("atleast_3d", 3, lambda s: {0: (1, 1, 1), 1: (1,) + s + (1,), 2: s + (1,)}[len(s)])


def _sequence(tup: Any, name: str) -> list[Any]:
    """The arrays of a stacking function: a sequence, or the rows of one Array (as JAX accepts)."""
    if isinstance(tup, (Array, np.ndarray)):
        x = as_operand(tup, name)
        if x.ndim == 0: raise ValueError(at_user_line(f"{name}: needs a sequence of arrays, got {shape_str(x)}"))
        return unstack(x)
    return list(tup)


def _stack_along(name: str, ndmin: int, axis_of: Callable[[Array], int]):
    raise_to = {1: atleast_1d, 2: atleast_2d, 3: atleast_3d}[ndmin]

    def fn(tup: Sequence[Any], dtype: Any = None) -> Array:
        arrays = [raise_to(as_operand(a, name)) for a in _sequence(tup, name)]
        if not arrays: raise ValueError(at_user_line(f"{name}: needs at least one array to concatenate"))
        return concatenate(arrays, axis_of(arrays[0]), dtype=dtype)
    fn.__name__ = fn.__qualname__ = name
    return eager_op(fn)


vstack = _stack_along("vstack", 2, lambda first: 0)
vstack.__doc__ = """Stack arrays vertically (along axis 0), 1-D arrays as rows. Example: vstack([[1, 2], [3, 4]])."""
hstack = _stack_along("hstack", 1, lambda first: 0 if first.ndim == 1 else 1)
hstack.__doc__ = """Stack arrays horizontally: along axis 1, or axis 0 for 1-D arrays."""
dstack = _stack_along("dstack", 3, lambda first: 2)
dstack.__doc__ = """Stack arrays along the third axis (after raising each to 3-D as atleast_3d)."""


@eager_op
def column_stack(tup: Sequence[Any]) -> Array:
    """Stack 1-D arrays as columns of a 2-D array (0-D ones as 1 x 1); 2-D arrays are stacked as they are."""
    arrays = []
    for a in _sequence(tup, "column_stack"):
        x = as_operand(a, "column_stack")
        arrays.append(x if x.ndim >= 2 else lax.reshape(x, (x.size, 1)))
    if not arrays: raise ValueError(at_user_line("column_stack: needs at least one array to concatenate"))
    return concatenate(arrays, 1)


def _block_depth(arrays: Any, name: str) -> tuple[int, int]:
    """(list nesting depth, largest leaf rank) of block's argument, checking that all leaves sit at one depth."""
    if isinstance(arrays, tuple):
        raise ValueError(at_user_line(f"{name}: tuples are not allowed (use lists), got {arrays!r}"))
    if not isinstance(arrays, list): return 0, as_operand(arrays, name).ndim
    if not arrays: raise ValueError(at_user_line(f"{name}: empty lists are not allowed"))
    parts = [_block_depth(a, name) for a in arrays]
    if len({depth for depth, _ in parts}) != 1:
        raise ValueError(at_user_line(f"{name}: mismatched list depths in {arrays!r}"))
    return parts[0][0] + 1, builtins.max(rank for _, rank in parts)


def _block_join(arrays: Any, depth: int, ndim: int) -> Array:
    if not isinstance(arrays, list):
        x = as_operand(arrays, "block")
        return lax.reshape(x, (1,) * (ndim - x.ndim) + x.shape) if x.ndim < ndim else x
    return concatenate([_block_join(a, depth - 1, ndim) for a in arrays], axis=-depth)


@eager_op
def block(arrays: Any) -> Array:
    """An array assembled from nested lists of blocks: the innermost lists join along the last axis, the next
    ones along the one before, and so on (blocks first get leading size-1 axes up to a common rank).

    Example: `block([[eye(2), zeros((2, 1))], [ones((1, 3))]])` is 3 x 3.
    """
    depth, rank = _block_depth(arrays, "block")
    return _block_join(arrays, depth, builtins.max(depth, rank))


@eager_op
def concat(arrays: Sequence[Any], /, *, axis: int | None = 0) -> Array:
    """The array API's name for `concatenate`."""
    return concatenate(arrays, axis)


@eager_op
def unstack(x: Any, /, *, axis: int = 0) -> tuple[Array, ...]:
    """The slices of `x` along `axis`, as a tuple (the inverse of `stack`)."""
    a = as_operand(x, "unstack")
    if a.ndim == 0: raise ValueError(at_user_line(f"unstack: needs at least 1 dimension, got {shape_str(a)}"))
    axis = normalize_axes(axis, a.ndim, "unstack")[0]
    rest = a.shape[:axis] + a.shape[axis + 1:]
    return tuple(with_weak(lax.reshape(_slice_axis(a, i, i + 1, axis), rest), a.weak_type)
                 for i in range(a.shape[axis]))


@eager_op
def append(arr: Any, values: Any, axis: int | None = None) -> Array:
    """`values` appended to `arr` along `axis` (None: both flattened); dtypes promote.

    Example: `append(array([1, 2]), 3)` -> [1, 2, 3].
    """
    if axis is None: return concatenate([ravel(arr), ravel(values)], 0)
    return concatenate([arr, values], axis)


@eager_op
def array_split(ary: Any, indices_or_sections: Any, axis: int = 0) -> list[Array]:
    """Like `split`, but a number of sections need not divide the axis: the first `n % sections` parts get one
    element more. Example: `array_split(arange(7), 3)` -> [0 1 2], [3 4], [5 6]."""
    if not isinstance(indices_or_sections, (int, np.integer)): return split(ary, indices_or_sections, axis)
    x = as_operand(ary, "array_split")
    axis = normalize_axes(axis, x.ndim, "array_split")[0]
    sections, n = int(indices_or_sections), x.shape[axis]
    if sections <= 0:
        raise ValueError(at_user_line(f"array_split: the number of sections must be positive, got {sections}"))
    small, extra = divmod(n, sections)
    sizes = [small + 1] * extra + [small] * (sections - extra)
    bounds = np.cumsum([0] + sizes)
    return [_slice_axis(x, int(lo), int(hi), axis) for lo, hi in zip(bounds[:-1], bounds[1:])]


def _split_along(name: str, min_ndim: int, axis_of: Callable[[Array], int], doc: str):
    def fn(ary: Any, indices_or_sections: Any) -> list[Array]:
        x = as_operand(ary, name)
        if x.ndim < min_ndim:
            raise ValueError(at_user_line(f"{name}: needs an array of at least {min_ndim} dimension"
                                          f"{'s' if min_ndim > 1 else ''}, got {shape_str(x)}"))
        return split(x, indices_or_sections, axis_of(x))
    fn.__name__ = fn.__qualname__ = name
    fn.__doc__ = doc
    return eager_op(fn)


hsplit = _split_along("hsplit", 1, lambda x: 1 if x.ndim > 1 else 0,
                      "`split` along axis 1 (axis 0 for 1-D arrays).")
vsplit = _split_along("vsplit", 2, lambda x: 0, "`split` along axis 0 (arrays of at least 2 dimensions).")
dsplit = _split_along("dsplit", 3, lambda x: 2, "`split` along axis 2 (arrays of at least 3 dimensions).")


# ---- rearranging ----

def _roll_static(x: Array, shift: int, axis: int) -> Array:
    n = x.shape[axis]
    if n == 0: return x
    cut = (-shift) % n
    if cut == 0: return x
    return lax.concatenate([_slice_axis(x, cut, n, axis), _slice_axis(x, 0, cut, axis)], axis)


def _roll_traced(x: Array, shift: Array, axis: int) -> Array:
    """Roll by a traced shift: a gather with (i - shift) mod n along `axis`."""
    n = x.shape[axis]
    if n == 0: return x
    from fnx.numpy import mod
    index = mod(lax.iota(dtypes.int32, n) - cast(shift, dtypes.int32), n)
    return take(x, index, axis=axis)


@eager_op
def roll(a: Any, shift: Any, axis: Any = None) -> Array:
    """Shift elements cyclically by `shift` along `axis` (None: of the flattened array, then reshaped). `shift`
    and `axis` may be sequences (broadcast against each other); a traced shift works under jit.

    Example: `roll(arange(5), 2)` -> [3, 4, 0, 1, 2].
    """
    x = as_operand(a, "roll")
    if axis is None: return reshape(roll(ravel(x), shift, 0), x.shape)
    axes = np.atleast_1d(np.asarray(axis))
    shift_arr = shift if isinstance(shift, Array) else None
    if shift_arr is not None and (shift_arr.is_concrete or not state.tracing):
        shift_arr = None
        shift = np.asarray(shift)
    if shift_arr is None:
        shifts = np.asarray(shift)
        if shifts.dtype.kind not in "iub":
            raise TypeError(at_user_line(f"roll: shift must be integers, got {shifts.tolist()!r}"))
        if shifts.ndim > 1 or axes.ndim > 1:
            raise ValueError(at_user_line(f"roll: shift {shifts.tolist()} and axis {axes.tolist()} must be scalars "
                                          "or 1-D sequences"))
        shifts, axes = np.broadcast_arrays(shifts, axes)
        for s, ax in zip(np.atleast_1d(shifts), np.atleast_1d(axes)):
            x = _roll_static(x, int(s), normalize_axes(int(ax), x.ndim, "roll")[0])
        return x
    check_shift = shift_arr if shift_arr.ndim else lax.reshape(shift_arr, (1,))
    if not _dt(check_shift).is_int:
        raise TypeError(at_user_line(f"roll: shift must be integers, got {shape_str(shift_arr)}"))
    if check_shift.ndim != 1 or (check_shift.shape[0] != len(axes) and check_shift.shape[0] != 1 and len(axes) != 1):
        raise ValueError(at_user_line(f"roll: shift {shape_str(shift_arr)} does not fit axis {axes.tolist()}"))
    count = builtins.max(check_shift.shape[0], len(axes))
    for i in range(count):
        s = lax.reshape(_slice_axis(check_shift, i % check_shift.shape[0], i % check_shift.shape[0] + 1, 0), ())
        x = _roll_traced(x, s, normalize_axes(int(axes[i % len(axes)]), x.ndim, "roll")[0])
    return x


@eager_op
def rot90(m: Any, k: int = 1, axes: tuple[int, int] = (0, 1)) -> Array:
    """Rotate by 90 degrees `k` times in the plane of `axes`, from the first axis toward the second.

    Example: `rot90(array([[1, 2], [3, 4]]))` -> [[2, 4], [1, 3]].
    """
    x = as_operand(m, "rot90")
    _at_least_2d(x, "rot90")
    axes = tuple(axes)
    if len(axes) != 2: raise ValueError(at_user_line(f"rot90: axes must be two axes, got {axes}"))
    first, second = normalize_axes(axes[0], x.ndim, "rot90")[0], normalize_axes(axes[1], x.ndim, "rot90")[0]
    if first == second: raise ValueError(at_user_line(f"rot90: axes must be different, got {axes}"))
    k = _int(k, "rot90", "k") % 4
    if k == 0: return x
    if k == 2: return flip(x, (first, second))
    # a quarter turn is a reflection about the diagonal (swapaxes) followed by one along an axis
    return flip(swapaxes(x, first, second), first if k == 1 else second)


@eager_op
def fliplr(m: Any) -> Array:
    """Reverse the order of columns (axis 1); needs at least 2 dimensions."""
    x = as_operand(m, "fliplr")
    _at_least_2d(x, "fliplr")
    return flip(x, 1)


@eager_op
def flipud(m: Any) -> Array:
    """Reverse the order of rows (axis 0); needs at least 1 dimension."""
    x = as_operand(m, "flipud")
    if x.ndim < 1: raise ValueError(at_user_line(f"flipud: needs at least 1 dimension, got {shape_str(x)}"))
    return flip(x, 0)


@eager_op
def rollaxis(a: Any, axis: int, start: int = 0) -> Array:
    """Move `axis` so that it comes before the axis now at position `start` (numpy's older moveaxis)."""
    x = as_operand(a, "rollaxis")
    axis = normalize_axes(axis, x.ndim, "rollaxis")[0]
    start = operator.index(start)
    if not -x.ndim <= start <= x.ndim:
        raise ValueError(at_user_line(f"rollaxis: start={start} must satisfy {-x.ndim} <= start <= {x.ndim}"))
    start = start + x.ndim if start < 0 else start
    if axis < start: start -= 1
    return moveaxis(x, axis, start)


@eager_op
def permute_dims(a: Any, /, axes: Sequence[int]) -> Array:
    """The array API's name for `transpose` with explicit `axes`."""
    return transpose(a, axes)


@eager_op
def matrix_transpose(x: Any, /) -> Array:
    """Swap the last two axes (a stack of matrices transposed); needs at least 2 dimensions."""
    a = as_operand(x, "matrix_transpose")
    _at_least_2d(a, "matrix_transpose")
    return swapaxes(a, -1, -2)


@eager_op
def resize(a: Any, new_shape: Any) -> Array:
    """An array of `new_shape` filled with the flattened `a` repeated cyclically (zeros if `a` is empty).

    Example: `resize(arange(3), (2, 4))` -> [[0, 1, 2, 0], [1, 2, 0, 1]].
    """
    x = as_operand(a, "resize")
    shape = lax.canonical_shape(new_shape, "resize", nonnegative=False)
    if builtins.any(s < 0 for s in shape):
        raise ValueError(at_user_line(f"resize: all elements of new_shape must be non-negative, got {shape}"))
    total = math.prod(shape)
    if x.size == 0: return with_weak(lax.full(shape, 0, _dt(x)), x.weak_type)
    flat = ravel(x)
    repeated = tile(flat, -(-total // x.size)) if total > x.size else flat
    return reshape(_slice_axis(repeated, 0, total, 0), shape)


def _positions(obj: Any, n: int, name: str) -> np.ndarray:
    """The static positions an index object (int, slice, sequence or concrete integer/bool array) names on an
    axis of length n (not yet normalized for negatives, except slices)."""
    if isinstance(obj, slice): return np.arange(n)[obj]
    value = _concrete(obj, name)
    if value.dtype == np.bool_:
        if value.shape != (n,):
            raise ValueError(at_user_line(f"{name}: boolean index of shape {value.shape} does not fit an axis of "
                                          f"length {n}"))
        return np.nonzero(value)[0]
    if value.size and value.dtype.kind not in "iu":
        raise TypeError(at_user_line(f"{name}: indices must be integers, got {value.dtype} {value.tolist()}"))
    return value.astype(np.int64)


def _flatten_for(arr: Any, axis: int | None, name: str) -> tuple[Array, int]:
    x = as_operand(arr, name)
    if axis is None: return ravel(x), 0
    return x, normalize_axes(axis, x.ndim, name)[0]


@eager_op
def delete(arr: Any, obj: Any, axis: int | None = None, *, assume_unique_indices: bool = False) -> Array:
    """`arr` without the entries `obj` (an int, slice, index sequence or boolean mask) along `axis` (None: of the
    flattened array). Index arrays must be concrete, except with `assume_unique_indices=True` (the indices are
    then taken to be distinct and in range, so the result's size is known and it works under jit).

    Example: `delete(arange(5), [1, 3])` -> [0, 2, 4].
    """
    x, axis = _flatten_for(arr, axis, "delete")
    n = x.shape[axis]
    if assume_unique_indices and isinstance(obj, Array) and not obj.is_concrete and state.tracing:
        idx = ravel(obj)
        idx = where(idx < 0, idx + n, idx)
        removed = lax.reduce_max(cast(lax.reshape(idx, (idx.size, 1)) == lax.iota(_dt(idx), n), dtypes.int32),
                                 (0,)) != 0 if idx.size else _full(lax.iota(dtypes.int32, n), False, dtypes.bool_)
        keep = _nonzero_sized(~lax.reshape(removed, (n,)), n - idx.size, None, "delete")[0]
        return take(x, keep, axis=axis, mode="clip")
    positions = _positions(obj, n, "delete")
    if not isinstance(obj, slice):
        bad = (positions < -n) | (positions >= n)
        if bad.any():
            raise IndexError(at_user_line(f"delete: index {positions[bad][0]} is out of bounds for axis {axis} "
                                          f"with size {n}"))
    keep = np.setdiff1d(np.arange(n), positions % builtins.max(n, 1))
    return take(x, array(keep.astype(np.int32)), axis=axis, mode="clip") if keep.size < n else x


@eager_op
def insert(arr: Any, obj: Any, values: Any, axis: int | None = None) -> Array:
    """`arr` with `values` inserted before the index or indices `obj` along `axis` (None: of the flattened array).
    An int `obj` inserts all of `values` there; a sequence inserts one value before each index. Indices beyond
    the end insert at the end, as JAX; `obj` must be static (concrete under jit).

    Example: `insert(arange(3), 1, 9)` -> [0, 9, 1, 2].
    """
    x, axis = _flatten_for(arr, axis, "insert")
    n = x.shape[axis]
    positions = _positions(obj, n, "insert")
    vals = cast(as_operand(values, "insert"), _dt(x))
    if positions.ndim == 0 and not isinstance(obj, slice):
        vals = moveaxis(array(vals, ndmin=x.ndim), 0, axis)
        count = vals.shape[axis]
        positions = np.full(count, int(positions))
    else:
        positions = positions.reshape(-1)
        count = positions.size
        vals = array(vals, ndmin=x.ndim)
    positions = np.clip(np.where(positions < 0, positions + n, positions), 0, n)
    vals = _broadcast(vals, x.shape[:axis] + (count,) + x.shape[axis + 1:], "insert")
    order = np.argsort(positions, kind="stable")
    source = np.zeros(n + count, np.int64)  # output slot -> index into concatenate([x, vals])
    inserted_at = np.empty(count, np.int64)
    inserted_at[order] = positions[order] + np.arange(count)
    is_new = np.zeros(n + count, bool)
    is_new[inserted_at] = True
    source[inserted_at] = n + np.arange(count)
    source[~is_new] = np.arange(n)
    joined = lax.concatenate([x, vals], axis)
    return with_weak(take(joined, array(source.astype(np.int32)), axis=axis, mode="clip"), x.weak_type)


def trim_zeros(filt: Any, trim: str = "fb") -> Array:
    """The 1-D `filt` without its leading ('f' in `trim`) and/or trailing ('b') zeros. Needs concrete values (the
    result's length depends on them), so it raises ConcretizationError under jit, as in JAX."""
    x = as_operand(filt, "trim_zeros")
    if x.ndim != 1: raise ValueError(at_user_line(f"trim_zeros: needs a 1-D array, got {shape_str(x)}"))
    nonzero = np.flatnonzero(_concrete(x, "trim_zeros"))
    if nonzero.size == 0: return _slice_axis(x, 0, 0, 0)
    lo = int(nonzero[0]) if "f" in trim.lower() else 0
    hi = int(nonzero[-1]) + 1 if "b" in trim.lower() else x.shape[0]
    return _slice_axis(x, lo, hi, 0)


# ---- diagonals ----

@eager_op
def diagonal(a: Any, offset: int = 0, axis1: int = 0, axis2: int = 1) -> Array:
    """The `offset`-th diagonal of the (axis1, axis2) planes, as a new last axis.

    Example: `diagonal(arange(9).reshape(3, 3), 1)` -> [1, 5].
    """
    x = as_operand(a, "diagonal")
    if x.ndim < 2:
        raise ValueError(at_user_line(f"diagonal: needs an array of at least 2 dimensions, got {shape_str(x)}"))
    first, second = normalize_axes(axis1, x.ndim, "diagonal")[0], normalize_axes(axis2, x.ndim, "diagonal")[0]
    if first == second: raise ValueError(at_user_line(f"diagonal: axis1 and axis2 must differ, got {axis1}, {axis2}"))
    offset = _int(offset, "diagonal", "offset")
    planes = moveaxis(x, (first, second), (-2, -1))
    rows, cols = planes.shape[-2:]
    count = builtins.max(0, builtins.min(rows, cols - offset) if offset >= 0 else builtins.min(rows + offset, cols))
    batch = planes.shape[:-2]
    flat = lax.reshape(planes, batch + (rows * cols,))
    if count == 0: return _slice_axis(flat, 0, 0, len(batch))
    start = offset if offset >= 0 else -offset * cols
    return lax.slice_in_dim(flat, start, start + (count - 1) * (cols + 1) + 1, stride=cols + 1, axis=len(batch))


@eager_op
def diag(v: Any, k: int = 0) -> Array:
    """For 1-D `v`: a square matrix with `v` on the k-th diagonal. For 2-D `v`: its k-th diagonal.

    Example: `diag(array([1, 2]))` -> [[1, 0], [0, 2]].
    """
    x = as_operand(v, "diag")
    k = _int(k, "diag", "k")
    if x.ndim == 2: return diagonal(x, k)
    if x.ndim != 1: raise ValueError(at_user_line(f"diag: input must be 1-D or 2-D, got {shape_str(x)}"))
    n = x.shape[0] + builtins.abs(k)
    padded = lax.pad(x, lax.full((), 0, _dt(x)), [(0, builtins.abs(k), 0)])
    # the value on (i, i + k) is v[i] for k >= 0 (it varies with the row) and v[j] for k < 0 (with the column)
    grid = _broadcast(lax.reshape(padded, (n, 1) if k >= 0 else (1, n)), (n, n))
    mask = lax.broadcasted_iota(dtypes.int32, (n, n), 1) == lax.broadcasted_iota(dtypes.int32, (n, n), 0) + k
    return with_weak(lax.select(mask, grid, _full(grid, 0)), x.weak_type)


@eager_op
def diagflat(v: Any, k: int = 0) -> Array:
    """A square matrix with the flattened `v` on the k-th diagonal."""
    return diag(ravel(v), k)


@eager_op
def trace(a: Any, offset: int = 0, axis1: int = 0, axis2: int = 1, dtype: Any = None, out: None = None) -> Array:
    """The sum along the `offset`-th diagonal of the (axis1, axis2) planes (small integers sum as int32, as
    `sum`)."""
    if out is not None: raise UnsupportedError(at_user_line("trace: the out argument is not supported"))
    return sum(diagonal(a, offset, axis1, axis2), axis=-1, dtype=dtype)


def _inplace_unsupported(name: str, inplace: bool, error: type = ValueError) -> None:
    if inplace:
        raise error(at_user_line(f"{name}: fnx arrays are immutable, so it cannot modify an array in place; pass "
                                 "inplace=False to get the updated array instead"))


@eager_op
def fill_diagonal(a: Any, val: Any, wrap: bool = False, *, inplace: bool = True) -> Array:
    """A copy of `a` (2-D, or n-D with all axes equal) with its main diagonal set to `val` (flattened and repeated
    cyclically). Needs inplace=False, as in JAX; wrap=True is not supported (as in JAX).

    Example: `fill_diagonal(zeros((2, 2)), 5, inplace=False)` -> [[5, 0], [0, 5]].
    """
    _inplace_unsupported("fill_diagonal", inplace, NotImplementedError)
    if wrap: raise UnsupportedError(at_user_line("fill_diagonal: wrap=True is not supported"))
    x = as_operand(a, "fill_diagonal")
    if x.ndim < 2 or (x.ndim > 2 and len(set(x.shape)) != 1):
        raise ValueError(at_user_line(f"fill_diagonal: needs a 2-D array or one with all axes of equal length, got "
                                      f"{shape_str(x)}"))
    count = builtins.min(x.shape)
    if count == 0: return x
    step = builtins.sum(math.prod(x.shape[d + 1:]) for d in range(x.ndim))
    positions = array((np.arange(count) * step).astype(np.int32))
    values = resize(cast(as_operand(val, "fill_diagonal"), _dt(x)), (count,))
    return reshape(ravel(x).at[positions].set(values), x.shape)


# ---- selection ----

@eager_op
def select(condlist: Sequence[Any], choicelist: Sequence[Any], default: Any = 0) -> Array:
    """Elementwise, the entry of the first choice whose condition holds, else `default` (all broadcast together;
    dtypes promote).

    Example: `select([x < 0, x > 0], [-x, x], 0)` is |x|.
    """
    if len(condlist) != len(choicelist):
        raise ValueError(at_user_line(f"select: condlist must have length equal to choicelist ({len(condlist)} vs "
                                      f"{len(choicelist)})"))
    if not condlist: raise ValueError(at_user_line("select: condlist must be non-empty"))
    out = default
    for condition, choice in reversed(list(zip(condlist, choicelist))):
        cond = as_operand(condition, "select")
        if not _dt(cond).is_bool:
            from fnx.numpy import not_equal
            cond = not_equal(cond, 0)
        out = where(cond, choice, out)
    return out


@eager_op
def choose(a: Any, choices: Sequence[Any], out: None = None, mode: str = "raise") -> Array:
    """Elementwise `choices[a]` (a and the choices broadcast together). mode 'raise' checks that every index is in
    [0, len(choices)) (needs concrete values), 'wrap' takes them modulo, 'clip' clamps them.

    Example: `choose(array([0, 1]), [array([1, 2]), array([3, 4])])` -> [1, 4].
    """
    if out is not None: raise UnsupportedError(at_user_line("choose: the out argument is not supported"))
    index = as_operand(a, "choose")
    if not _dt(index).is_int:
        raise TypeError(at_user_line(f"choose: the index array must be integers, got {shape_str(index)}"))
    n = len(choices)
    if n == 0: raise ValueError(at_user_line("choose: choices must be non-empty"))
    if mode == "raise":
        value = _concrete(index, "choose (mode='raise')")
        if ((value < 0) | (value >= n)).any():
            raise ValueError(at_user_line(f"choose: invalid entry in choice array (indices must be in [0, {n}))"))
    elif mode == "wrap":
        from fnx.numpy import mod
        index = mod(index, n)
    elif mode == "clip":
        index = where(index < 0, _full(index, 0), where(index >= n, _full(index, n - 1), index))
    else:
        raise ValueError(at_user_line(f"choose: mode must be 'raise', 'wrap' or 'clip', got {mode!r}"))
    arrays, weak = promote([as_operand(c, "choose") for c in choices])
    shape = broadcast_shapes(index.shape, *[c.shape for c in arrays], name="choose")
    result = _broadcast(arrays[0], shape, "choose")
    for i in range(1, n):
        result = lax.select(_broadcast(index == i, shape, "choose"), _broadcast(arrays[i], shape, "choose"), result)
    return with_weak(result, weak)


def _nonzero_sized(x: Array, size: int | None, fill_value: Any, name: str) -> list[Array]:
    """The coordinates of the nonzero elements of `x`, one int32 array per axis. With `size`, exactly `size` of
    them (the first ones, then `fill_value`, default 0, a scalar or one per axis) — fine under jit; without it the
    count comes from concrete values (ConcretizationError under jit)."""
    if size is None:
        found = np.nonzero(_concrete(x, f"{name} (without size=)"))
        return [array(i.astype(dtypes.default_int().np)) for i in found]
    size = _int(size, name, "size")
    if size < 0: raise ValueError(at_user_line(f"{name}: size must be non-negative, got {size}"))
    fills = np.broadcast_to(np.asarray(0 if fill_value is None else fill_value), (x.ndim,))
    mask = lax.reshape(x != _full(x, 0) if not _dt(x).is_bool else x, (x.size,))
    order = lax.full((size,), 0, dtypes.int32)
    if x.size and size:
        slot = lax.cumsum(cast(mask, dtypes.int32), 0) - 1  # where each nonzero element goes in the result
        slot = where(mask, slot, _full(slot, size))  # (zeros go past the end, so the scatter drops them)
        order = lax.scatter_axis(order, slot, lax.iota(dtypes.int32, x.size), 0)
        count = sum(cast(mask, dtypes.int32))
    else:
        count = lax.full((), 0, dtypes.int32)
    valid = lax.iota(dtypes.int32, size) < count
    coords = []
    for d, n in enumerate(x.shape):
        stride = math.prod(x.shape[d + 1:])
        coord = lax.rem(lax.div(order, stride), n) if n else order
        coords.append(cast(where(valid, coord, _full(coord, int(fills[d]))), dtypes.default_int()))
    return coords


@eager_op
def argwhere(a: Any, *, size: int | None = None, fill_value: Any = None) -> Array:
    """The indices of the nonzero elements, as an int32 array of shape (count, a.ndim). Without `size` the
    values must be concrete (ConcretizationError under jit); with it the result has `size` rows, padded with
    `fill_value` (default 0; a scalar or one per axis).

    Example: `argwhere(array([[0, 1], [2, 0]]))` -> [[0, 1], [1, 0]].
    """
    x = as_operand(a, "argwhere")
    if x.ndim == 0:  # (one row without columns when x is nonzero, else none; with size=, `size` rows)
        rows = size if size is not None else builtins.int(_concrete(x, "argwhere (without size=)") != 0)
        return lax.full((_int(rows, "argwhere", "size"), 0), 0, dtypes.int32)
    coords = _nonzero_sized(x, size, fill_value, "argwhere")
    rows = coords[0].shape[0]
    return lax.concatenate([lax.reshape(c, (rows, 1)) for c in coords], 1)


@eager_op
def flatnonzero(a: Any, *, size: int | None = None, fill_value: Any = None) -> Array:
    """The indices of the nonzero elements of the flattened `a` (int32); `size`/`fill_value` as in argwhere."""
    return _nonzero_sized(ravel(a), size, fill_value, "flatnonzero")[0]


@eager_op
def compress(condition: Any, a: Any, axis: int | None = None, *, size: int | None = None,
             fill_value: Any = 0) -> Array:
    """The slices of `a` along `axis` (None: of the flattened array) where the 1-D `condition` is nonzero. As
    in argwhere, `size` fixes the result's length (padding with `fill_value`), which makes it work under jit.

    Example: `compress(array([True, False, True]), arange(3))` -> [0, 2].
    """
    x, axis = _flatten_for(a, axis, "compress")
    n = x.shape[axis]
    if size is None:  # (the condition's values, before any op could trace it)
        cond = np.ravel(_concrete(condition, "compress (without size=)")) != 0
        if cond[n:].any():
            raise ValueError(at_user_line(f"compress: condition of {cond.size} entries has True ones beyond axis "
                                          f"{axis} of {shape_str(x)}"))
        picked = array(np.flatnonzero(cond[:n]).astype(np.int32))
    else:
        cond = ravel(as_operand(condition, "compress"))
        picked = _nonzero_sized(_slice_axis(cond, 0, builtins.min(n, cond.shape[0]), 0), size, n, "compress")[0]
    return take(x, picked, axis=axis, mode="fill", fill_value=fill_value)


@eager_op
def extract(condition: Any, arr: Any, *, size: int | None = None, fill_value: Any = 0) -> Array:
    """The elements of the flattened `arr` where the flattened `condition` is nonzero (see compress)."""
    if size is None: condition = _concrete(condition, "extract (without size=)")  # (before ravel traces it)
    return compress(np.ravel(condition) if size is None else ravel(condition), ravel(arr), size=size,
                    fill_value=fill_value)


@eager_op
def place(arr: Any, mask: Any, vals: Any, *, inplace: bool = True) -> Array:
    """A copy of `arr` with the elements where `mask` is nonzero replaced by `vals` in order (repeated cyclically).
    Needs inplace=False, as in JAX; works under jit.

    Example: `place(arange(4), array([1, 0, 1, 1]), array([9, 8]), inplace=False)` -> [9, 1, 8, 9].
    """
    _inplace_unsupported("place", inplace)
    x = as_operand(arr, "place")
    m = ravel(_broadcast(as_operand(mask, "place"), x.shape, "place"))
    m = m if _dt(m).is_bool else m != _full(m, 0)
    values = ravel(cast(as_operand(vals, "place"), _dt(x)))
    if values.size == 0 or x.size == 0: return x
    slot = lax.rem(lax.cumsum(cast(m, dtypes.int32), 0) - 1 + values.size, values.size)
    return reshape(where(m, take(values, slot, mode="clip"), ravel(x)), x.shape)


@eager_op
def put(a: Any, ind: Any, v: Any, mode: str | None = None, *, inplace: bool = True) -> Array:
    """A copy of `a` with the flat positions `ind` set to `v` (repeated cyclically to ind's length). Needs
    inplace=False, as in JAX. Out-of-range indices, as in JAX: mode None counts negative ones from the end, then
    clamps; 'clip' clamps them to [0, size - 1] (negative ones to 0); 'wrap' takes them modulo the size.

    Example: `put(arange(3), array([1]), 9, inplace=False)` -> [0, 9, 2].
    """
    _inplace_unsupported("put", inplace)
    if mode not in (None, "clip", "wrap"):
        raise ValueError(at_user_line(f"put: mode should be one of None, 'wrap' or 'clip'; got {mode!r}"))
    x = as_operand(a, "put")
    idx = ravel(as_operand(ind, "put"))
    if not _dt(idx).is_int: raise TypeError(at_user_line(f"put: indices must be integers, got {shape_str(idx)}"))
    values = ravel(cast(as_operand(v, "put"), _dt(x)))
    if idx.size == 0 or values.size == 0 or x.size == 0: return x
    if mode == "wrap":
        from fnx.numpy import mod
        idx = mod(idx, x.size)
    elif mode == "clip":
        idx = where(idx < 0, _full(idx, 0), idx)
    return reshape(ravel(x).at[idx].set(resize(values, idx.shape), mode="clip"), x.shape)


@eager_op
def put_along_axis(arr: Any, indices: Any, values: Any, axis: int | None, inplace: bool = True, *,
                   mode: str | None = None) -> Array:
    """A copy of `arr` with `arr[..., indices[..., i, ...], ...] = values` along `axis` (the inverse of
    take_along_axis; the other axes broadcast). Needs inplace=False, as in JAX.

    Example: `put_along_axis(zeros((2, 2)), array([[1], [0]]), 5., 1, inplace=False)` -> [[0, 5], [5, 0]].
    """
    _inplace_unsupported("put_along_axis", inplace)
    x = as_operand(arr, "put_along_axis")
    idx = as_operand(indices, "put_along_axis")
    if not _dt(idx).is_int:
        raise TypeError(at_user_line(f"put_along_axis: indices must be integers, got {shape_str(idx)}"))
    if axis is None:  # (as JAX: arr is flattened, indices must already be 1-D)
        return reshape(put_along_axis(ravel(x), idx, values, 0, inplace=False, mode=mode), x.shape)
    if idx.ndim != x.ndim:
        raise ValueError(at_user_line(f"put_along_axis: arr and indices must have the same number of dimensions, "
                                      f"got {shape_str(x, idx)}"))
    axis = normalize_axes(axis, x.ndim, "put_along_axis")[0]
    shape = tuple(idx.shape[d] if d == axis else np.broadcast_shapes((x.shape[d],), (idx.shape[d],))[0]
                  for d in range(x.ndim))
    key = tuple(_broadcast(idx, shape) if d == axis else lax.broadcasted_iota(dtypes.int32, shape, d)
                for d in range(x.ndim))
    return x.at[key].set(values, mode=mode)


# ---- dtypes ----

generic, number, inexact, floating = np.generic, np.number, np.inexact, np.floating
integer, signedinteger, unsignedinteger = np.integer, np.signedinteger, np.unsignedinteger
complexfloating, character, flexible, object_ = np.complexfloating, np.character, np.flexible, np.object_
from fnx.numpy import float32 as single, float64 as double, int64 as int_, uint64 as uint  # noqa: E402
float_ = double

_ML_FLOATS = frozenset(np.dtype(t) for t in (ml_dtypes.bfloat16, ml_dtypes.float8_e4m3fn, ml_dtypes.float8_e5m2))


def _np_dtype(x: Any) -> np.dtype:
    """A dtype-like, an Array or numpy value (its dtype) or an fnx DType as a numpy dtype."""
    if isinstance(x, Array): return _dt(x).np
    if isinstance(x, DType): return x.np
    if hasattr(x, "dtype") and not isinstance(x, type): return np.dtype(x.dtype)
    return np.dtype(x)


def issubdtype(arg1: Any, arg2: Any) -> builtins.bool:
    """Whether dtype `arg1` is `arg2` or below it in numpy's type hierarchy (bfloat16 counts as floating).

    Example: `issubdtype(float16, floating)` is True; `issubdtype(int8, floating)` is False.
    """
    if isinstance(arg2, type) and issubclass(arg2, np.generic) and arg2 in (np.generic, np.number, np.inexact,
                                                                           np.floating):
        if _np_dtype(arg1) in _ML_FLOATS: return True
    if not (isinstance(arg2, type) and issubclass(arg2, np.generic)): arg2 = _np_dtype(arg2)
    return builtins.bool(np.issubdtype(_np_dtype(arg1), arg2))


_KINDS: dict[str, Callable[[np.dtype], builtins.bool]] = {
    "bool": lambda d: d == np.bool_,
    "signed integer": lambda d: d.kind == "i",
    "unsigned integer": lambda d: d.kind == "u",
    "integral": lambda d: d.kind in "iu",
    "real floating": lambda d: d.kind == "f" or d in _ML_FLOATS,
    "complex floating": lambda d: d.kind == "c",
    "numeric": lambda d: d.kind in "iufc" or d in _ML_FLOATS,
}


def isdtype(dtype: Any, kind: Any) -> builtins.bool:
    """The array API's dtype test: whether `dtype` is of `kind` — a dtype, one of 'bool', 'signed integer',
    'unsigned integer', 'integral', 'real floating', 'complex floating', 'numeric', or a tuple of those."""
    d = _np_dtype(dtype)
    for k in (kind if isinstance(kind, tuple) else (kind,)):
        if isinstance(k, str):
            if k not in _KINDS:
                raise ValueError(at_user_line(f"isdtype: unrecognized kind {k!r}; expected one of {list(_KINDS)} "
                                              "or a dtype"))
            if _KINDS[k](d): return True
        elif _np_dtype(k) == d:
            return True
    return False


def can_cast(from_: Any, to: Any, casting: str = "safe") -> builtins.bool:
    """Whether numpy's `casting` rule allows converting dtype `from_` (or an array's dtype) to `to`. Python
    scalars are refused with a TypeError, as in JAX (NEP 50: the answer would depend on the value)."""
    if is_python_scalar(from_):
        raise TypeError(at_user_line(f"can_cast: does not support Python scalars ({from_!r}); pass a dtype or array"))
    return builtins.bool(np.can_cast(_np_dtype(from_), _np_dtype(to), casting))


def isscalar(element: Any) -> builtins.bool:
    """Whether `element` is a scalar: what numpy.isscalar accepts (Python and numpy scalars, strings), or a 0-d
    Array or numpy array (as in JAX)."""
    if isinstance(element, (Array, np.ndarray)): return element.ndim == 0
    return builtins.bool(np.isscalar(element))


def iterable(y: Any) -> builtins.bool:
    """Whether `iter(y)` works."""
    try:
        iter(y)
    except TypeError:
        return False
    return True


# ---- functions mapped over axes (vmap), bits, printing and files ----

def _vmap():
    from fnx.transforms.vmap import vmap  # (the transform; this module is below it in the layers)
    return vmap


def _parse_signature(signature: str) -> tuple[list[tuple[str, ...]], list[tuple[str, ...]]]:
    """'(m,n),(n)->(m)' -> ([('m', 'n'), ('n',)], [('m',)])."""
    def groups(text: str) -> list[tuple[str, ...]]:
        import re
        return [tuple(d.strip() for d in g.split(",") if d.strip()) for g in re.findall(r"\(([^)]*)\)", text)]
    if "->" not in signature: raise ValueError(f"vectorize: signature {signature!r} has no '->'")
    inputs, outputs = signature.replace(" ", "").split("->")
    return groups(inputs), groups(outputs)


class vectorize:
    """jax.numpy.vectorize: `pyfunc` applied to every element (or, with a gufunc `signature` such as
    '(n),(n)->()', to every core block) of broadcast arguments, by vmap over the loop axes (compiled once, not a
    Python loop). `excluded` names positional arguments passed through unchanged."""

    def __init__(self, pyfunc: Callable, *, excluded: frozenset = frozenset(), signature: str | None = None):
        self.pyfunc, self.excluded, self.signature = pyfunc, frozenset(excluded), signature
        self.__doc__ = getattr(pyfunc, "__doc__", None)

    def __call__(self, *args: Any) -> Any:
        fixed = {i: a for i, a in enumerate(args) if i in self.excluded}
        mapped = [as_operand(a, "vectorize") for i, a in enumerate(args) if i not in self.excluded]
        cores = _parse_signature(self.signature)[0] if self.signature else [()] * len(mapped)
        if len(cores) != len(mapped):
            raise TypeError(at_user_line(f"vectorize: signature {self.signature!r} has {len(cores)} inputs, got "
                                         f"{len(mapped)} arrays"))
        loops = [a.shape[:a.ndim - len(c)] for a, c in zip(mapped, cores)]
        if any(a.ndim < len(c) for a, c in zip(mapped, cores)):
            raise ValueError(at_user_line(f"vectorize: an argument has fewer dimensions than its core dims in "
                                          f"{self.signature!r}"))
        loop = broadcast_shapes(*loops)
        count = math.prod(loop)
        flat = [reshape(_broadcast(a, loop + a.shape[len(s):], "vectorize"), (count,) + a.shape[len(s):])
                for a, s in zip(mapped, loops)]

        def one(*blocks):
            it = iter(blocks)
            return self.pyfunc(*[fixed[i] if i in fixed else next(it) for i in range(len(args))])
        out = _vmap()(one)(*flat)
        return _tree_reshape(out, loop)


def _tree_reshape(out: Any, loop: tuple[int, ...]) -> Any:
    from fnx import tree_util
    return tree_util.tree_map(lambda o: reshape(o, loop + tuple(o.shape[1:])), out)


def apply_along_axis(func1d: Callable, axis: int, arr: Any, *args: Any, **kwargs: Any) -> Any:
    """func1d applied to every 1-d slice of `arr` along `axis` (vmap over the others); the slices' results take
    the place of that axis."""
    a = as_operand(arr, "apply_along_axis")
    axis = normalize_axes(axis, a.ndim, "apply_along_axis")[0]
    moved = moveaxis(a, axis, -1)
    rest = moved.shape[:-1]
    rows = reshape(moved, (math.prod(rest), moved.shape[-1]))
    out = _vmap()(lambda row: func1d(row, *args, **kwargs))(rows)
    out = reshape(out, rest + tuple(out.shape[1:]))
    extra = out.ndim - len(rest)
    return moveaxis(out, tuple(range(len(rest), out.ndim)), tuple(range(axis, axis + extra))) if extra else out


def apply_over_axes(func: Callable, a: Any, axes: Any) -> Array:
    """func(a, axis) for each axis in turn; a result that lost the axis gets it back (size 1)."""
    out = as_operand(a, "apply_over_axes")
    for axis in np.atleast_1d(axes).tolist():
        axis = axis % out.ndim
        result = func(out, axis)
        if result.ndim == out.ndim - 1: result = reshape(result, result.shape[:axis] + (1,) + result.shape[axis:])
        elif result.ndim != out.ndim:
            raise ValueError(at_user_line("apply_over_axes: func must keep the rank or drop the axis"))
        out = result
    return out


@eager_op
def packbits(a: Any, axis: int | None = None, bitorder: str = "big") -> Array:
    """The elements of an integer or bool array as bits (nonzero: 1), packed eight to a uint8 along `axis`
    (flattened when None); the last byte is padded with zeros."""
    x = as_operand(a, "packbits")
    if _dt(x).is_float: raise TypeError(at_user_line(f"packbits: needs integer or bool values, got {_dt(x)}"))
    if bitorder not in ("big", "little"):
        raise ValueError(at_user_line(f"packbits: bitorder must be 'big' or 'little', got {bitorder!r}"))
    x = (x != 0).astype(np.uint8)
    if axis is None: x, axis = ravel(x), 0
    axis = normalize_axes(axis, x.ndim, "packbits")[0]
    x = moveaxis(x, axis, -1)
    n = x.shape[-1]
    x = concatenate([x, zeros(x.shape[:-1] + (-n % 8,), np.uint8)], axis=-1)
    groups = reshape(x, x.shape[:-1] + (x.shape[-1] // 8, 8))
    weights = array(np.array([128, 64, 32, 16, 8, 4, 2, 1] if bitorder == "big" else [1, 2, 4, 8, 16, 32, 64, 128],
                             np.uint8))
    return moveaxis(sum(groups * weights, axis=-1, dtype=np.uint8), -1, axis)


@eager_op
def unpackbits(a: Any, axis: int | None = None, count: int | None = None, bitorder: str = "big") -> Array:
    """The bits of a uint8 array as 0/1 uint8 values, eight per element along `axis` (flattened when None);
    `count` keeps that many (negative: drops that many from the end)."""
    x = as_operand(a, "unpackbits")
    if _dt(x) != dtypes.uint8: raise TypeError(at_user_line(f"unpackbits: needs uint8 values, got {_dt(x)}"))
    if bitorder not in ("big", "little"):
        raise ValueError(at_user_line(f"unpackbits: bitorder must be 'big' or 'little', got {bitorder!r}"))
    if axis is None: x, axis = ravel(x), 0
    axis = normalize_axes(axis, x.ndim, "unpackbits")[0]
    x = moveaxis(x, axis, -1)
    shifts = array(np.array([7, 6, 5, 4, 3, 2, 1, 0] if bitorder == "big" else list(range(8)), np.uint8))
    bits = (x[..., None] >> shifts) & np.uint8(1)
    bits = reshape(bits, x.shape[:-1] + (x.shape[-1] * 8,))
    if count is not None: bits = bits[..., :count] if count >= 0 else bits[..., :bits.shape[-1] + count]
    return moveaxis(bits, -1, axis)


def array_repr(arr: Any, max_line_width: int | None = None, precision: int | None = None,
               suppress_small: bool | None = None) -> str:
    """numpy.array_repr of the value."""
    return np.array_repr(np.asarray(arr), max_line_width, precision, suppress_small)


def array_str(a: Any, max_line_width: int | None = None, precision: int | None = None,
              suppress_small: bool | None = None) -> str:
    """numpy.array_str of the value."""
    return np.array_str(np.asarray(a), max_line_width, precision, suppress_small)


get_printoptions, set_printoptions, printoptions = np.get_printoptions, np.set_printoptions, np.printoptions


def save(file: Any, arr: Any, allow_pickle: bool = True) -> None:
    """numpy.save of the value."""
    np.save(file, np.asarray(arr), allow_pickle=allow_pickle)


def savez(file: Any, *args: Any, **kwds: Any) -> None:
    """numpy.savez of the values."""
    np.savez(file, *[np.asarray(a) for a in args], **{k: np.asarray(v) for k, v in kwds.items()})


def load(file: Any, *args: Any, **kwargs: Any) -> Any:
    """numpy.load, with an array file's contents as an fnx Array (an .npz archive stays numpy's lazy mapping)."""
    out = np.load(file, *args, **kwargs)
    return array(out) if isinstance(out, np.ndarray) else out


def einsum_path(subscripts: str, *operands: Any, optimize: Any = "greedy") -> tuple[list, str]:
    """The contraction order numpy.einsum_path chooses for operands of these shapes (values are not read)."""
    shaped = [np.empty(np.shape(o), np.float32) for o in operands]
    return np.einsum_path(subscripts, *shaped, optimize=optimize)

from fnx import numpy as _numpy  # noqa: E402  (the namespace these names join)

_numpy._extend({name: globals()[name] for name in __all__})


_numpy.nonzero_sized_hook = _nonzero_sized  # (nonzero(size=) in fnx.numpy, which cannot import this module)
