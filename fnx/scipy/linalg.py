"""fnx.scipy.linalg: jax.scipy.linalg's triangular solves and the Cholesky and LU factorizations with their
solvers, on fnx.numpy.linalg's loops (fnx/numpy_linalg.py). scipy's conventions: `cholesky` is upper unless
lower=True; `lu` returns (p, l, u) with a = p @ l @ u.

    >>> fnx.scipy.linalg.solve_triangular(jnp.array([[2.0, 0.0], [1.0, 1.0]]), jnp.array([2.0, 3.0]), lower=True)
    Array([1., 2.], dtype=float32)
"""
from __future__ import annotations

from typing import Any

from fnx import numpy as jnp
from fnx import numpy_linalg
from fnx.errors import ShapeError, at_user_line
from fnx.numpy_linalg import _square, _triangular_solve, det, inv, lu_factor as _lu
from fnx.trace import Array, eager_op

__all__ = ["cho_factor", "cho_solve", "cholesky", "det", "inv", "lu", "lu_factor", "lu_solve", "solve",
           "solve_triangular"]


@eager_op
def solve_triangular(a: Any, b: Any, trans: int | str = 0, lower: bool = False, unit_diagonal: bool = False,
                     overwrite_b: bool = False, debug: Any = None, check_finite: bool = True) -> Array:
    """x with op(a) x = b for triangular a (only its `lower` or upper triangle is read); op is a (trans 0 / 'N') or
    a^T (1 / 'T' / 2 / 'C'). b is (..., n) or (..., n, k)."""
    a, b = _square(a, "solve_triangular"), jnp.asarray(b)
    if trans not in (0, 1, 2, "N", "T", "C"):
        raise ValueError(at_user_line(f"solve_triangular: trans must be 0, 1, 2, 'N', 'T' or 'C', got {trans!r}"))
    vector = b.ndim == a.ndim - 1
    rhs = b[..., None] if vector else b
    if rhs.shape[-2] != a.shape[-1]:
        raise ShapeError(at_user_line(f"solve_triangular: a {a.shape} and b {b.shape} do not match"))
    t = jnp.tril(a) if lower else jnp.triu(a)
    if trans not in (0, "N"): t, lower = jnp.swapaxes(t, -1, -2), not lower
    x = _triangular_solve(t, rhs, lower=lower, unit_diagonal=unit_diagonal)
    return x[..., 0] if vector else x


@eager_op
def cholesky(a: Any, lower: bool = False, overwrite_a: bool = False, check_finite: bool = True) -> Array:
    """The Cholesky factor: upper U with a = U^T U (scipy's default), or lower L with a = L L^T."""
    return numpy_linalg.cholesky(a, upper=not lower)


def cho_factor(a: Any, lower: bool = False, overwrite_a: bool = False, check_finite: bool = True) -> tuple:
    """(c, lower): the factor for cho_solve."""
    return cholesky(a, lower=lower), lower


@eager_op
def cho_solve(c_and_lower: tuple, b: Any, overwrite_b: bool = False, check_finite: bool = True) -> Array:
    """x with a x = b from cho_factor(a)'s (c, lower)."""
    c, lower = c_and_lower
    if lower:
        y = solve_triangular(c, b, lower=True)
        return solve_triangular(c, y, trans=1, lower=True)
    y = solve_triangular(c, b, trans=1, lower=False)
    return solve_triangular(c, y, lower=False)


def lu_factor(a: Any, overwrite_a: bool = False, check_finite: bool = True) -> tuple[Array, Array]:
    """(lu, piv): L (unit diagonal) and U packed, and LAPACK's row interchanges (row i swapped with piv[i])."""
    factors = _lu(a)
    return factors.lu, factors.pivots


@eager_op
def lu_solve(lu_and_piv: tuple, b: Any, trans: int = 0, overwrite_b: bool = False,
             check_finite: bool = True) -> Array:
    """x with a x = b (trans 0) or a^T x = b (trans 1) from lu_factor(a)."""
    lu_, piv = lu_and_piv
    b = jnp.asarray(b)
    n = lu_.shape[-1]
    index = jnp.arange(n, dtype=jnp.int32)
    perm = jnp.broadcast_to(index, piv.shape)
    for i in range(n):  # (the interchanges in order: row i with row piv[i])
        p = piv[..., i:i + 1]
        at_i, at_p = perm[..., i:i + 1], jnp.take_along_axis(perm, p, axis=-1)
        perm = jnp.where(index == i, at_p, jnp.where(index == p, at_i, perm))
    rhs = b[..., None] if b.ndim == 1 else b
    if trans == 0:
        y = _triangular_solve(lu_, jnp.take_along_axis(rhs, perm[..., :, None], axis=-2), lower=True,
                              unit_diagonal=True)
        x = _triangular_solve(lu_, y, lower=False, unit_diagonal=False)
    else:
        y = _triangular_solve(jnp.swapaxes(jnp.triu(lu_), -1, -2), rhs, lower=True, unit_diagonal=False)
        z = _triangular_solve(jnp.swapaxes(jnp.tril(lu_, -1), -1, -2), y, lower=False, unit_diagonal=True)
        inverse = jnp.argsort(perm, axis=-1)  # (a^T = u^T l^T p^T: x = p z, row perm[i] of x is row i of z)
        x = jnp.take_along_axis(z, inverse[..., :, None], axis=-2)
    return x[..., 0] if b.ndim == 1 else x


@eager_op
def lu(a: Any, permute_l: bool = False, overwrite_a: bool = False, check_finite: bool = True) -> Any:
    """(p, l, u) with a = p @ l @ u: p a permutation matrix, l unit lower-triangular, u upper-triangular; with
    `permute_l`, (p @ l, u)."""
    factors = _lu(a)
    n = factors.lu.shape[-1]
    eye = jnp.eye(n, dtype=factors.lu.dtype)
    l_ = jnp.tril(factors.lu, -1) + eye
    u = jnp.triu(factors.lu)
    p = jnp.swapaxes(jnp.take(eye, factors.permutation, axis=0), -1, -2)  # (a[perm] = l u, so a = p l u)
    return (jnp.matmul(p, l_), u) if permute_l else (p, l_, u)


@eager_op
def solve(a: Any, b: Any, lower: bool = False, overwrite_a: bool = False, overwrite_b: bool = False,
          check_finite: bool = True, assume_a: str = "gen") -> Array:
    """x with a x = b; assume_a 'pos' solves by Cholesky, anything else by LU."""
    if assume_a == "pos": return cho_solve(cho_factor(a, lower=True), b)
    return numpy_linalg.solve(a, b)


def __getattr__(name: str):
    from fnx.jax_names import missing
    raise missing("fnx.scipy.linalg", name)
