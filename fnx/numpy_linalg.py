"""fnx.numpy.linalg: jax.numpy.linalg's norms and the factorizations built on Gaussian elimination and Householder
reflections (cholesky, LU with partial pivoting, QR), with solve, inv, det, slogdet, matrix_power.

Every factorization is a loop of vectorized updates over the columns (fori_loop with static bounds, so a scan:
traced once, any size), composed of fnx ops: it runs on every backend and under jit, vmap (leading batch axes),
jvp and grad (reverse mode through the scan). JAX calls LAPACK on the CPU instead; the values agree to float
rounding (tests/test_linalg.py). Eigen- and singular-value decompositions (eigh, svd and what needs them: lstsq,
pinv, matrix_rank, the 2-norm and nuclear norm) are not implemented yet and say so.

    >>> fnx.numpy.linalg.det(jnp.array([[2.0, 1.0], [1.0, 3.0]]))
    Array(5., dtype=float32)
"""
from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np

from fnx import lax
from fnx import numpy as jnp
from fnx.control_flow import fori_loop
from fnx.errors import ShapeError, at_user_line
from fnx.trace import Array, eager_op

__all__ = ["cholesky", "det", "inv", "matrix_norm", "matrix_power", "norm", "qr", "slogdet", "solve",
           "vector_norm"]


def _square(a: Any, name: str) -> Array:
    a = jnp.asarray(a)
    if a.ndim < 2 or a.shape[-1] != a.shape[-2]:
        raise ShapeError(at_user_line(f"{name}: needs square matrices in the last two axes, got shape {a.shape}"))
    if not jnp.issubdtype(a.dtype, jnp.floating): a = a.astype(jnp.float32)
    return a


def _column(a: Array, j: Array) -> Array:
    """a[..., :, j] for a traced j."""
    return jnp.take(a, j, axis=-1)


def _row(a: Array, j: Array) -> Array:
    return jnp.take(a, j, axis=-2)


@eager_op
def cholesky(a: Any, *, upper: bool = False, symmetrize_input: bool = True) -> Array:
    """The lower-triangular L with a = L L^T (a symmetric positive definite; otherwise NaNs, as in JAX). With
    `symmetrize_input` a is replaced by (a + a^T) / 2 first; `upper` returns L^T."""
    a = _square(a, "cholesky")
    if symmetrize_input: a = (a + jnp.swapaxes(a, -1, -2)) / 2
    n = a.shape[-1]
    rows = lax.broadcasted_iota(jnp.int32, (n, n), 0)
    cols = lax.broadcasted_iota(jnp.int32, (n, n), 1)
    index = jnp.arange(n, dtype=jnp.int32)

    def step(j, work):  # column j of L from the Schur complement, then the trailing block updated
        column = _column(work, j)
        pivot = jnp.sqrt(jnp.take(column, j, axis=-1))[..., None]
        factor = jnp.where(index >= j, column / pivot, 0)
        trailing = (rows > j) & (cols > j)
        work = jnp.where(trailing, work - factor[..., :, None] * factor[..., None, :], work)
        return jnp.where(cols == j, factor[..., :, None], work)
    lower = jnp.tril(fori_loop(0, n, step, a))
    return jnp.swapaxes(lower, -1, -2) if upper else lower


class LUFactors(NamedTuple):
    lu: Array           # L (unit diagonal, below) and U (on and above the diagonal) in one matrix
    pivots: Array       # row j was swapped with row pivots[j] at step j (LAPACK's convention), int32
    permutation: Array  # the rows of a in the order of L U: a[permutation] = L @ U, int32


def lu_factor(a: Any) -> LUFactors:
    """LU with partial pivoting of square matrices (the largest magnitude in each column is the pivot)."""
    a = _square(a, "lu")
    n = a.shape[-1]
    batch = a.shape[:-2]
    index = jnp.arange(n, dtype=jnp.int32)
    rows = lax.broadcasted_iota(jnp.int32, (n, n), 0)
    cols = lax.broadcasted_iota(jnp.int32, (n, n), 1)

    def step(j, state):
        work, pivots, perm = state
        column = _column(work, j)
        candidates = jnp.where(index >= j, jnp.abs(column), -1)
        p = jnp.argmax(candidates, axis=-1).astype(jnp.int32)
        swap = jnp.where(index == j, p[..., None], jnp.where(index == p[..., None], j, index))
        work = jnp.take_along_axis(work, swap[..., :, None], axis=-2)
        perm = jnp.take_along_axis(perm, swap, axis=-1)
        pivots = jnp.where(index == j, p[..., None], pivots)
        column = _column(work, j)
        pivot = jnp.take(column, j, axis=-1)[..., None]
        multipliers = jnp.where(index > j, column / pivot, 0)
        trailing = (rows > j) & (cols > j)
        work = jnp.where(trailing, work - multipliers[..., :, None] * _row(work, j)[..., None, :], work)
        work = jnp.where((cols == j) & (rows > j), multipliers[..., :, None], work)
        return work, pivots, perm
    start = (a, jnp.zeros(batch + (n,), jnp.int32), jnp.broadcast_to(index, batch + (n,)))
    return LUFactors(*fori_loop(0, n, step, start))


def _triangular_solve(t: Array, b: Array, lower: bool, unit_diagonal: bool) -> Array:
    """x with t x = b for triangular t (..., n, n) and b (..., n, k), by substitution row by row."""
    n = t.shape[-1]
    index = jnp.arange(n, dtype=jnp.int32)

    def step(i, x):
        row = n - 1 - i if not lower else i
        coefficients = _row(t, row)                     # (..., n)
        known = jnp.sum(coefficients[..., :, None] * x, axis=-2)   # (..., k): the solved rows' part
        value = _row(b, row) - known
        if not unit_diagonal: value = value / jnp.take(coefficients, row, axis=-1)[..., None]
        return jnp.where((index == row)[:, None], value[..., None, :], x)
    return fori_loop(0, n, step, jnp.zeros(jnp.broadcast_shapes(t.shape[:-2], b.shape[:-2]) + b.shape[-2:],
                                           jnp.result_type(t, b)))


@eager_op
def solve(a: Any, b: Any) -> Array:
    """x with a x = b, by LU with partial pivoting. A 1-d b is a vector; otherwise b is (..., n, k), a stack of
    matrices (numpy 2's and JAX's rule)."""
    a = _square(a, "solve")
    b = jnp.asarray(b)
    vector = b.ndim == 1
    if b.shape[-1 if vector else -2] != a.shape[-1]:
        raise ShapeError(at_user_line(f"solve: a {a.shape} and b {b.shape} do not match (b needs {a.shape[-1]} "
                                      "rows)"))
    rhs = b[..., None] if vector else b
    factors = lu_factor(a)
    permuted = jnp.take_along_axis(jnp.broadcast_to(rhs, jnp.broadcast_shapes(rhs.shape[:-2], a.shape[:-2])
                                                    + rhs.shape[-2:]),
                                   factors.permutation[..., :, None], axis=-2)
    y = _triangular_solve(factors.lu, permuted, lower=True, unit_diagonal=True)
    x = _triangular_solve(factors.lu, y, lower=False, unit_diagonal=False)
    return x[..., 0] if vector else x


@eager_op
def inv(a: Any) -> Array:
    """The inverse of square matrices (singular ones give inf/NaN, as in JAX)."""
    a = _square(a, "inv")
    return solve(a, jnp.broadcast_to(jnp.eye(a.shape[-1], dtype=a.dtype), a.shape))


class SlogdetResult(NamedTuple):
    sign: Array
    logabsdet: Array


@eager_op
def slogdet(a: Any, *, method: str | None = None) -> SlogdetResult:
    """(sign, log|det|) of square matrices, from the LU factors; a singular matrix gives (0, -inf)."""
    a = _square(a, "slogdet")
    factors = lu_factor(a)
    diagonal = jnp.diagonal(factors.lu, axis1=-2, axis2=-1)
    swaps = jnp.sum(factors.pivots != jnp.arange(a.shape[-1]), axis=-1)
    sign = jnp.where(swaps % 2 == 1, -1.0, 1.0).astype(a.dtype) * jnp.prod(jnp.sign(diagonal), axis=-1)
    return SlogdetResult(sign, jnp.sum(jnp.log(jnp.abs(diagonal)), axis=-1))


@eager_op
def det(a: Any) -> Array:
    """The determinant of square matrices (the product of U's diagonal, signed by the row swaps)."""
    a = _square(a, "det")
    factors = lu_factor(a)
    swaps = jnp.sum(factors.pivots != jnp.arange(a.shape[-1]), axis=-1)
    product = jnp.prod(jnp.diagonal(factors.lu, axis1=-2, axis2=-1), axis=-1)
    return jnp.where(swaps % 2 == 1, -product, product)


class QRResult(NamedTuple):
    Q: Array
    R: Array


@eager_op
def qr(a: Any, mode: str = "reduced") -> Any:
    """Q R = a with orthonormal Q and upper-triangular R, by Householder reflections (R's diagonal has LAPACK's
    signs: each reflection maps its column to -sign(a_jj) times its norm). `mode`: 'reduced' (Q (m, k), R (k, n),
    k = min(m, n)), 'complete' (Q (m, m)), 'r' (R only)."""
    if mode not in ("reduced", "complete", "r", "raw"):
        raise ValueError(at_user_line(f"qr: mode must be 'reduced', 'complete' or 'r', got {mode!r}"))
    if mode == "raw": raise NotImplementedError("qr: mode='raw' (LAPACK's packed reflectors) is not implemented")
    a = jnp.asarray(a)
    if a.ndim < 2: raise ShapeError(at_user_line(f"qr: needs matrices in the last two axes, got shape {a.shape}"))
    if not jnp.issubdtype(a.dtype, jnp.floating): a = a.astype(jnp.float32)
    m, n = a.shape[-2:]
    k = min(m, n)
    index = jnp.arange(m, dtype=jnp.int32)

    def step(j, state):
        r, q = state
        x = jnp.where(index >= j, _column(r, j), 0)
        head = jnp.take(x, j, axis=-1)
        length = jnp.sqrt(jnp.sum(x * x, axis=-1))
        alpha = -jnp.where(head < 0, -1.0, 1.0).astype(a.dtype) * length
        v = x - jnp.where(index == j, alpha[..., None], 0)
        size = jnp.sqrt(jnp.sum(v * v, axis=-1, keepdims=True))
        below = jnp.sum(jnp.where(index > j, x * x, 0), axis=-1, keepdims=True)
        reflect = (below > 0) & (size > 0)  # (nothing below the diagonal: no reflection, as LAPACK's dlarfg)
        v = jnp.where(reflect, v / jnp.where(reflect, size, 1), 0)
        r = r - 2 * v[..., :, None] * jnp.sum(v[..., :, None] * r, axis=-2, keepdims=True)
        q = q - 2 * jnp.sum(q * v[..., None, :], axis=-1, keepdims=True) * v[..., None, :]
        return r, q
    eye = jnp.broadcast_to(jnp.eye(m, dtype=a.dtype), a.shape[:-2] + (m, m))
    r, q = fori_loop(0, k, step, (a, eye)) if k else (a, eye)
    r = jnp.triu(r)
    if mode == "r": return r[..., :k, :] if m > n else r
    if mode == "complete": return QRResult(q, r)
    return QRResult(q[..., :, :k], r[..., :k, :])


@eager_op
def matrix_power(a: Any, n: int) -> Array:
    """a @ a @ ... (n times) by repeated squaring; n = 0 gives the identity, n < 0 powers of the inverse."""
    a = _square(a, "matrix_power")
    if not isinstance(n, (int, np.integer)): raise TypeError(f"matrix_power: n must be an int, got {n!r}")
    if n < 0: a, n = inv(a), -n
    result, square = None, a
    while n:
        if n & 1: result = square if result is None else jnp.matmul(result, square)
        n >>= 1
        if n: square = jnp.matmul(square, square)
    return jnp.broadcast_to(jnp.eye(a.shape[-1], dtype=a.dtype), a.shape) if result is None else result


_NEEDS_SVD = "is not implemented in fnx yet (it needs the singular values: svd is not there yet)"


@eager_op
def vector_norm(x: Any, /, *, axis: Any = None, keepdims: bool = False, ord: Any = 2) -> Array:
    """The vector p-norm over `axis` (None: all elements): ord 2 (default), 1, inf, -inf, 0 (the count of
    nonzeros) or any other real p."""
    x = jnp.asarray(x)
    if not jnp.issubdtype(x.dtype, jnp.floating): x = x.astype(jnp.float32)
    size = jnp.abs(x)
    if ord == 2: return jnp.sqrt(jnp.sum(x * x, axis=axis, keepdims=keepdims))
    if ord == np.inf: return jnp.max(size, axis=axis, keepdims=keepdims)
    if ord == -np.inf: return jnp.min(size, axis=axis, keepdims=keepdims)
    if ord == 0: return jnp.sum(x != 0, axis=axis, keepdims=keepdims).astype(x.dtype)
    if ord == 1: return jnp.sum(size, axis=axis, keepdims=keepdims)
    return jnp.sum(size ** ord, axis=axis, keepdims=keepdims) ** (1.0 / ord)


@eager_op
def matrix_norm(x: Any, /, *, keepdims: bool = False, ord: Any = "fro") -> Array:
    """The matrix norm over the last two axes: 'fro', 1 / -1 (largest / smallest column sum of magnitudes), inf /
    -inf (row sums). 2, -2 and 'nuc' need singular values and raise NotImplementedError."""
    return norm(x, ord=ord, axis=(-2, -1), keepdims=keepdims)


@eager_op
def norm(x: Any, ord: Any = None, axis: Any = None, keepdims: bool = False) -> Array:
    """numpy.linalg.norm: a vector norm over one axis (or of a 1-d array), a matrix norm over two axes (or of a
    2-d array), the 2-norm of all elements for axis None and ord None."""
    x = jnp.asarray(x)
    if not jnp.issubdtype(x.dtype, jnp.floating): x = x.astype(jnp.float32)
    if axis is None:
        if ord is None: return vector_norm(jnp.ravel(x) if not keepdims else x, axis=None, keepdims=keepdims)
        if x.ndim not in (1, 2):
            raise ValueError(at_user_line(f"norm: ord={ord!r} needs a 1-d or 2-d array or axis=, got {x.shape}"))
        axis = tuple(range(x.ndim))
    axes = (axis,) if isinstance(axis, (int, np.integer)) else tuple(axis)
    if len(axes) == 1: return vector_norm(x, axis=axes[0], keepdims=keepdims, ord=2 if ord is None else ord)
    if len(axes) != 2: raise ValueError(at_user_line(f"norm: axis must be one or two axes, got {axis!r}"))
    rows, cols = (a % x.ndim for a in axes)
    if ord in (None, "fro", "f"): return jnp.sqrt(jnp.sum(x * x, axis=axes, keepdims=keepdims))
    if ord in (2, -2, "nuc"): raise NotImplementedError(f"norm: ord={ord!r} for matrices {_NEEDS_SVD}")
    if ord not in (1, -1, np.inf, -np.inf):
        raise ValueError(at_user_line(f"norm: invalid ord {ord!r} for matrices"))
    summed_over, kept = (rows, cols) if ord in (1, -1) else (cols, rows)
    sums = jnp.sum(jnp.abs(x), axis=summed_over, keepdims=True)
    pick = jnp.max if ord in (1, np.inf) else jnp.min
    out = pick(sums, axis=kept, keepdims=True)
    return out if keepdims else jnp.squeeze(out, axis=(rows, cols))


def __getattr__(name: str):
    from fnx.jax_names import missing
    raise missing("fnx.numpy.linalg", name)
