"""fnx.numpy.linalg: jax.numpy.linalg's norms and the factorizations built on Gaussian elimination and Householder
reflections (cholesky, LU with partial pivoting, QR), with solve, inv, det, slogdet, matrix_power.

Every factorization is a loop of vectorized updates over the columns (fori_loop with static bounds, so a scan:
traced once, any size), composed of fnx ops: it runs on every backend and under jit, vmap (leading batch axes),
jvp and grad (reverse mode through the scan). JAX calls LAPACK on the CPU instead; the values agree to float
rounding (tests/test_linalg.py). Symmetric eigenproblems (eigh) use the parallel cyclic Jacobi method, n / 2
disjoint rotations at a time for a fixed number of sweeps, and the SVD (svd, and pinv, lstsq, matrix_rank, cond,
the 2- and nuclear norms on it) its one-sided form on column pairs; both with custom derivatives. The general
eigenproblem (eig, eigvals) is not implemented yet and says so.

    >>> fnx.numpy.linalg.det(jnp.array([[2.0, 1.0], [1.0, 3.0]]))
    Array(5., dtype=float32)
"""
from __future__ import annotations

import sys
from typing import Any, NamedTuple

import numpy as np

from fnx import lax
from fnx import numpy as jnp
from fnx.control_flow import fori_loop
from fnx.errors import ShapeError, at_user_line
from fnx.trace import Array, eager_op, refuse_complex
from fnx.transforms.custom import custom_jvp
from fnx.transforms.jit import jitted_op

__all__ = ["cholesky", "cond", "cross", "det", "diagonal", "eigh", "eigvalsh", "inv", "lstsq", "matmul",
           "matrix_norm", "matrix_power", "matrix_rank", "matrix_transpose", "multi_dot", "norm", "outer", "pinv",
           "qr", "slogdet", "solve", "svd", "svdvals", "tensordot", "tensorinv", "tensorsolve", "trace", "vecdot",
           "vector_norm"]


def _square(a: Any, name: str) -> Array:
    a = jnp.asarray(a)
    if a.ndim < 2 or a.shape[-1] != a.shape[-2]:
        raise ShapeError(at_user_line(f"{name}: needs square matrices in the last two axes, got shape {a.shape}"))
    if not jnp.issubdtype(a.dtype, jnp.inexact): a = a.astype(jnp.float32)  # (complex stays: see refuse_complex)
    return a


def _column(a: Array, j: Array) -> Array:
    """a[..., :, j] for a traced j."""
    return jnp.take(a, j, axis=-1)


def _row(a: Array, j: Array) -> Array:
    return jnp.take(a, j, axis=-2)


@jitted_op(automatic=True)
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
        # (a zero pivot: the column is zero from j down, and nothing is eliminated, as LAPACK's dgetrf; dividing by
        # it made NaNs that reached every later pivot: det of a matrix with a zero column was NaN, not 0)
        multipliers = jnp.where((index > j) & (pivot != 0), column / jnp.where(pivot != 0, pivot, 1), 0)
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


@jitted_op(automatic=True)
def solve(a: Any, b: Any) -> Array:
    """x with a x = b, by LU with partial pivoting. A 1-d b is a vector; otherwise b is (..., n, k), a stack of
    matrices (numpy 2's and JAX's rule)."""
    a = _square(a, "solve")
    b = jnp.asarray(b)
    if jnp.iscomplexobj(a) or jnp.iscomplexobj(b): return _complex_solve(a, b)
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


def _complex_solve(a: Array, b: Array) -> Array:
    """A complex system as the real one of twice its size: [[Ar, -Ai], [Ai, Ar]] [xr; xi] = [br; bi]."""
    a = a.astype(jnp.result_type(a, b, 1j))
    b = b.astype(a.dtype)
    ar, ai, n, vector = jnp.real(a), jnp.imag(a), a.shape[-1], b.ndim == 1
    big = jnp.concatenate([jnp.concatenate([ar, -ai], axis=-1), jnp.concatenate([ai, ar], axis=-1)], axis=-2)
    rhs = jnp.concatenate([jnp.real(b), jnp.imag(b)], axis=-1 if vector else -2)
    x = solve(big, rhs)
    xr, xi = (x[..., :n], x[..., n:]) if vector else (x[..., :n, :], x[..., n:, :])
    return lax.complex(xr, xi)


@jitted_op(automatic=True)
def inv(a: Any) -> Array:
    """The inverse of square matrices (singular ones give inf/NaN, as in JAX)."""
    a = _square(a, "inv")
    return solve(a, jnp.broadcast_to(jnp.eye(a.shape[-1], dtype=a.dtype), a.shape))


class SlogdetResult(NamedTuple):
    sign: Array
    logabsdet: Array


@jitted_op(automatic=True)
def slogdet(a: Any, *, method: str | None = None) -> SlogdetResult:
    """(sign, log|det|) of square matrices, from the LU factors; a singular matrix gives (0, -inf)."""
    a = _square(a, "slogdet")
    factors = lu_factor(a)
    diagonal = jnp.diagonal(factors.lu, axis1=-2, axis2=-1)
    swaps = jnp.sum(factors.pivots != jnp.arange(a.shape[-1]), axis=-1)
    sign = jnp.where(swaps % 2 == 1, -1.0, 1.0).astype(a.dtype) * jnp.prod(jnp.sign(diagonal), axis=-1)
    return SlogdetResult(sign, jnp.sum(jnp.log(jnp.abs(diagonal)), axis=-1))


def _lu_det(a: Array) -> Array:
    """The product of U's diagonal, signed by the row swaps."""
    factors = lu_factor(a)
    swaps = jnp.sum(factors.pivots != jnp.arange(a.shape[-1]), axis=-1)
    product = jnp.prod(jnp.diagonal(factors.lu, axis1=-2, axis2=-1), axis=-1)
    return jnp.where(swaps % 2 == 1, -product, product)


def _adjugate(a: Array) -> Array:
    """adj(a), with adj(a) a = det(a) I, also for singular a: from a = U S V^T, adj(a) = det(U) det(V) V adj(S) U^T
    where adj(S) holds each singular value's product with all the others but itself (no division: zero for a rank
    below n - 1, rank one for n - 1)."""
    u, s, vt = svd(a)
    ones = jnp.ones(s.shape[:-1] + (1,), s.dtype)
    before = jnp.cumprod(jnp.concatenate([ones, s[..., :-1]], axis=-1), axis=-1)           # s_0 ... s_{i-1}
    after = jnp.flip(jnp.cumprod(jnp.concatenate([ones, jnp.flip(s, -1)[..., :-1]], axis=-1), axis=-1), -1)
    sign = _lu_det(u) * _lu_det(vt)  # (+-1: orthogonal factors)
    v = jnp.swapaxes(vt, -1, -2)
    return sign[..., None, None] * jnp.matmul(v * (before * after)[..., None, :], jnp.swapaxes(u, -1, -2))


@custom_jvp
def _det(a: Array) -> Array:
    return _lu_det(a)


@_det.defjvp
def _det_jvp(primals, tangents):
    """d det(a) = tr(adj(a) da): differentiating the LU's divisions by its pivots gave NaN at a singular matrix,
    where the derivative is as finite as anywhere (JAX's too)."""
    (a,), (da,) = primals, tangents
    return _det(a), jnp.sum(jnp.swapaxes(_adjugate(a), -1, -2) * da, axis=(-2, -1))


@jitted_op(automatic=True)
def det(a: Any) -> Array:
    """The determinant of square matrices (the product of U's diagonal, signed by the row swaps). Its derivative is
    tr(adj(a) da), with the adjugate from the SVD: finite at singular matrices, as JAX's."""
    a = _square(a, "det")
    return _det(a) if a.shape[-1] else _lu_det(a)


class QRResult(NamedTuple):
    Q: Array
    R: Array


@eager_op
def householder(column: Array, j: Any, index: Array) -> Array:
    """The unit vector v of the reflection I - 2 v v^T that maps `column`'s entries j.. onto entry j, made
    -sign(column[j]) times their norm (LAPACK's dlarfg signs), leaving entries above j alone; zero (no reflection)
    when nothing below entry j is nonzero."""
    x = jnp.where(index >= j, column, 0)
    head = jnp.take(x, j, axis=-1)
    length = jnp.sqrt(jnp.sum(x * x, axis=-1))
    alpha = -jnp.where(head < 0, -1.0, 1.0).astype(column.dtype) * length
    v = x - jnp.where(index == j, alpha[..., None], 0)
    size = jnp.sqrt(jnp.sum(v * v, axis=-1, keepdims=True))
    below = jnp.sum(jnp.where(index > j, x * x, 0), axis=-1, keepdims=True)
    reflect = (below > 0) & (size > 0)
    return jnp.where(reflect, v / jnp.where(reflect, size, 1), 0)


def _householder_qr(a: Array) -> tuple[Array, Array]:
    """(Q, R) of (..., m, n) matrices by Householder reflections: Q (m, m) and R (m, n) upper triangular."""
    m = a.shape[-2]
    k = min(a.shape[-2:])
    index = jnp.arange(m, dtype=jnp.int32)

    def step(j, state):
        r, q = state
        v = householder(_column(r, j), j, index)
        r = r - 2 * v[..., :, None] * jnp.sum(v[..., :, None] * r, axis=-2, keepdims=True)
        q = q - 2 * jnp.sum(q * v[..., None, :], axis=-1, keepdims=True) * v[..., None, :]
        return r, q
    eye = jnp.broadcast_to(jnp.eye(m, dtype=a.dtype), a.shape[:-2] + (m, m))
    r, q = fori_loop(0, k, step, (a, eye)) if k else (a, eye)
    return q, jnp.triu(r)


@custom_jvp
def _tall_qr(a: Array) -> tuple[Array, Array]:
    """The reduced QR of (..., m, n) matrices with m >= n: Q (m, n), R (n, n)."""
    q, r = _householder_qr(a)
    n = a.shape[-1]
    return q[..., :, :n], r[..., :n, :]


@_tall_qr.defjvp
def _tall_qr_jvp(primals, tangents):
    """The QR factors' derivative from the factorization itself, not from the reflections: where a column below the
    diagonal is already zero the reflection is skipped, and differentiating that branch misses the rotation any
    perturbation starts (the gradient of sum(R) at a diagonal matrix came out wrong). With B = dA R^-1 and
    C = Q^T B: Q^T dQ = W is antisymmetric and dR R^-1 = C - W upper triangular, so W's strictly lower part is C's:
    W = tril(C, -1) - tril(C, -1)^T, dR = (C - W) R, dQ = B + Q (W - C). (R singular: infinite, as in JAX.)"""
    (a,), (da,) = primals, tangents
    q, r = _tall_qr(a)
    t = lambda x: jnp.swapaxes(x, -1, -2)  # noqa: E731
    b = t(_triangular_solve(t(r), t(da), lower=True, unit_diagonal=False))  # B R = dA
    c = jnp.matmul(t(q), b)
    below = jnp.tril(c, -1)
    w = below - t(below)
    return (q, r), (b + jnp.matmul(q, w - c), jnp.matmul(c - w, r))


@jitted_op(automatic=True)
def qr(a: Any, mode: str = "reduced") -> Any:
    """Q R = a with orthonormal Q and upper-triangular R, by Householder reflections (R's diagonal has LAPACK's
    signs: each reflection maps its column to -sign(a_jj) times its norm). `mode`: 'reduced' (Q (m, k), R (k, n),
    k = min(m, n)), 'complete' (Q (m, m)), 'r' (R only). Differentiable as JAX: the factors' derivative comes from
    the factorization (`_tall_qr_jvp`); a wide matrix (m < n) is Q [R1 R2] with Q R1 its first m columns and
    R2 = Q^T times the rest. 'complete' with m > n (Q's extra columns are not unique; JAX refuses its derivative)
    is differentiated through the reflections."""
    if mode not in ("reduced", "complete", "r", "raw"):
        raise ValueError(at_user_line(f"qr: mode must be 'reduced', 'complete' or 'r', got {mode!r}"))
    if mode == "raw": raise NotImplementedError("qr: mode='raw' (LAPACK's packed reflectors) is not implemented")
    a = jnp.asarray(a)
    if a.ndim < 2: raise ShapeError(at_user_line(f"qr: needs matrices in the last two axes, got shape {a.shape}"))
    if not jnp.issubdtype(a.dtype, jnp.floating): a = a.astype(jnp.float32)
    m, n = a.shape[-2:]
    if mode == "complete" and m > n: return QRResult(*_householder_qr(a))
    if m == 0 or n == 0:  # (nothing to factor: Q is the identity's first k columns)
        q, r = _householder_qr(a)
        k = min(m, n)
        q, r = (q, r) if mode == "complete" else (q[..., :, :k], r[..., :k, :])
    elif m >= n: q, r = _tall_qr(a)
    else:
        q, square = _tall_qr(a[..., :, :m])
        r = jnp.concatenate([square, jnp.matmul(jnp.swapaxes(q, -1, -2), a[..., :, m:])], axis=-1)
    return r if mode == "r" else QRResult(q, r)


@jitted_op(automatic=True)
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


class EighResult(NamedTuple):
    eigenvalues: Array
    eigenvectors: Array


JACOBI_SWEEPS = {4: 10, 8: 14}  # sweeps of the Jacobi method per float width: quadratic convergence reaches the
                                 # float's precision in 5-8 for the sizes measured (n <= 256); the rest is margin


def _tournament(n: int) -> np.ndarray:
    """The partner of every index in each of the n - 1 rounds of a round robin over n (even) indices: every pair
    meets once per sweep, and the pairs of a round are disjoint (so one round is n / 2 independent rotations)."""
    players = list(range(n))
    rounds = []
    for _ in range(n - 1):
        partner = [0] * n
        for k in range(n // 2):
            a, b = players[k], players[n - 1 - k]
            partner[a], partner[b] = b, a
        rounds.append(partner)
        players = [players[0], players[-1]] + players[1:-1]
    return np.array(rounds, np.int32)


def _rotation(pp: Array, qq: Array, pq: Array, first: Array) -> tuple[Array, Array, Array]:
    """The Jacobi rotation that zeroes the (p, q) entry of the symmetric 2 x 2 block [[pp, pq], [pq, qq]]
    (Golub and Van Loan's sym.schur2): its tangent t, cosine c and the sine signed per index (+s at p, -s at q)."""
    off = pq != 0
    tau = (qq - pp) / (2 * jnp.where(off, pq, 1))
    t = jnp.where(tau >= 0, 1.0, -1.0).astype(pp.dtype) / (jnp.abs(tau) + jnp.sqrt(1 + tau * tau))
    t = jnp.where(off, t, 0)
    c = 1 / jnp.sqrt(1 + t * t)
    return t, c, jnp.where(first, t * c, -t * c)


def _jacobi_eigh(a: Array) -> tuple[Array, Array]:
    """Eigenvalues (ascending) and eigenvectors of symmetric matrices by the parallel cyclic Jacobi method."""
    n = a.shape[-1]
    size = n + n % 2  # (an odd size gets a zero row and column: its rotations are the identity)
    work = jnp.pad(a, [(0, 0)] * (a.ndim - 2) + [(0, size - n)] * 2) if size != n else a
    vectors = jnp.broadcast_to(jnp.eye(size, dtype=a.dtype), work.shape)
    index = jnp.arange(size, dtype=jnp.int32)
    eye = jnp.eye(size, dtype=bool)

    def rotate(state, partner):
        work, vectors = state
        first = index < partner  # (the pair's first index p; the other is q)
        p, q = jnp.where(first, index, partner), jnp.where(first, partner, index)
        diagonal = jnp.diagonal(work, axis1=-2, axis2=-1)
        a_pp, a_qq = jnp.take(diagonal, p, axis=-1), jnp.take(diagonal, q, axis=-1)
        a_pq = jnp.take(jnp.reshape(work, work.shape[:-2] + (size * size,)), p * size + q, axis=-1)
        t, c, s = _rotation(a_pp, a_qq, a_pq, first)  # G[p, q] = s, G[q, p] = -s
        # G's column j: c_j at row j, and at row partner(j) the entry of row partner(j), s' of that index
        s_of_partner = jnp.take(s, partner, axis=-1) if s.ndim == 1 else jnp.take_along_axis(
            s, jnp.broadcast_to(partner, s.shape), axis=-1)
        columns = work * c[..., None, :] + jnp.take(work, partner, axis=-1) * s_of_partner[..., None, :]
        work = columns * c[..., :, None] + jnp.take(columns, partner, axis=-2) * s_of_partner[..., :, None]
        # the pair's entries exactly as the rotation makes them (Rutishauser): a_pp - t a_pq, a_qq + t a_pq and 0
        # off the diagonal; from the products they carried the cancellation error (float32 eigenvalues of a 64 x 64
        # matrix 16x less accurate)
        diagonal = jnp.where(first, a_pp - t * a_pq, a_qq + t * a_pq)
        work = jnp.where(eye, diagonal[..., :, None], jnp.where(index[None, :] == partner[:, None], 0, work))
        vectors = vectors * c[..., None, :] + jnp.take(vectors, partner, axis=-1) * s_of_partner[..., None, :]
        return (work, vectors), None

    rounds = jnp.asarray(np.tile(_tournament(size), (JACOBI_SWEEPS[a.dtype.itemsize], 1))) if size > 1 else None
    if rounds is not None: (work, vectors), _ = lax.scan(rotate, (work, vectors), rounds)
    values = jnp.diagonal(work, axis1=-2, axis2=-1)[..., :n]
    vectors = vectors[..., :n, :n]
    order = jnp.argsort(values, axis=-1)
    return jnp.take_along_axis(values, order, axis=-1), jnp.take_along_axis(vectors, order[..., None, :], axis=-1)


@custom_jvp
def _eigh(a: Array) -> tuple[Array, Array]:
    return _jacobi_eigh(a)


@_eigh.defjvp
def _eigh_jvp(primals, tangents):
    """d(w) = diag(V^T dA V); d(V) = V (F * (V^T dA V)) with F_ij = 1 / (w_j - w_i) off the diagonal (the
    standard first-order perturbation of distinct eigenvalues)."""
    (a,), (da,) = primals, tangents
    values, vectors = _eigh(a)
    projected = jnp.matmul(jnp.swapaxes(vectors, -1, -2), jnp.matmul(da, vectors))
    gaps = values[..., None, :] - values[..., :, None]
    eye = jnp.eye(a.shape[-1], dtype=bool)
    f = jnp.where(eye, 0, 1 / jnp.where(eye, 1, gaps))
    return (values, vectors), (jnp.diagonal(projected, axis1=-2, axis2=-1), jnp.matmul(vectors, f * projected))


@jitted_op(automatic=True)
def eigh(a: Any, UPLO: str | None = None, symmetrize_input: bool = True) -> EighResult:
    """Eigenvalues (ascending) and orthonormal eigenvectors (columns) of symmetric matrices: a V = V diag(w).
    By the parallel cyclic Jacobi method (accurate to the float's precision, also for tiny eigenvalues); JAX calls
    LAPACK's syevd. An eigenvector's sign is not unique. `symmetrize_input` uses (a + a^T) / 2; otherwise the
    `UPLO` triangle ('L' default, or 'U') is read. Differentiable (distinct eigenvalues), as JAX.

    Accuracy measured against float64 LAPACK (float32, random symmetric n x n): eigenvalues within 1.4e-7, 7e-7,
    1.7e-6 of the largest for n = 5, 64, 129; eigenvectors orthonormal to 3e-7, 1e-5, 2.5e-5."""
    a = _square(a, "eigh")
    if symmetrize_input: a = (a + jnp.swapaxes(a, -1, -2)) / 2
    else:
        part = jnp.tril(a) if UPLO in (None, "L") else jnp.triu(a)
        a = part + jnp.swapaxes(part, -1, -2) - jnp.diagonal(a, axis1=-2, axis2=-1)[..., None] * jnp.eye(
            a.shape[-1], dtype=a.dtype)
    return EighResult(*_eigh(a))


@jitted_op(automatic=True)
def eigvalsh(a: Any, UPLO: str | None = "L", *, symmetrize_input: bool = True) -> Array:
    """The eigenvalues of symmetric matrices, ascending (eigh's first result)."""
    return eigh(a, UPLO, symmetrize_input).eigenvalues


class SVDResult(NamedTuple):
    U: Array
    S: Array
    Vh: Array


def _jacobi_svd(a: Array) -> tuple[Array, Array, Array]:
    """Thin SVD of (..., m, n) matrices with m >= n by one-sided Jacobi (Hestenes): column pairs of a are rotated
    until orthogonal (the same parallel rounds as eigh), then the singular values are the column norms, V holds
    the rotations and U the normalized columns. Singular values descending."""
    m, n = a.shape[-2:]
    size = n + n % 2
    work = jnp.pad(a, [(0, 0)] * (a.ndim - 2) + [(0, 0), (0, size - n)]) if size != n else a
    vectors = jnp.broadcast_to(jnp.eye(size, dtype=a.dtype), work.shape[:-2] + (size, size))
    index = jnp.arange(size, dtype=jnp.int32)

    def rotate(state, partner):
        work, vectors = state
        first = index < partner
        other = jnp.take(work, partner, axis=-1)
        norms = jnp.sum(work * work, axis=-2)                    # ||a_i||^2
        cross = jnp.sum(work * other, axis=-2)                   # a_i . a_partner(i)
        alpha = jnp.where(first, norms, jnp.take(norms, partner, axis=-1))   # the pair's p column
        beta = jnp.where(first, jnp.take(norms, partner, axis=-1), norms)    # and q column
        _, c, s = _rotation(alpha, beta, cross, first)
        s_of_partner = jnp.take(s, partner, axis=-1)
        work = work * c[..., None, :] + other * s_of_partner[..., None, :]
        vectors = vectors * c[..., None, :] + jnp.take(vectors, partner, axis=-1) * s_of_partner[..., None, :]
        return (work, vectors), None

    if size > 1:
        rounds = jnp.asarray(np.tile(_tournament(size), (JACOBI_SWEEPS[a.dtype.itemsize], 1)))
        (work, vectors), _ = lax.scan(rotate, (work, vectors), rounds)
    work, vectors = work[..., :, :n], vectors[..., :n, :n]
    values = jnp.sqrt(jnp.sum(work * work, axis=-2))
    order = jnp.argsort(values, axis=-1, descending=True)
    values = jnp.take_along_axis(values, order, axis=-1)
    work = jnp.take_along_axis(work, order[..., None, :], axis=-1)
    vectors = jnp.take_along_axis(vectors, order[..., None, :], axis=-1)
    u = work / jnp.where(values > 0, values, 1)[..., None, :]
    if m and n:  # a zero singular value's column of work is zero: U's column there completes an orthonormal basis
        # (Q of U's QR: its first columns are U's own, up to sign, as the nonzero ones come first and are orthonormal)
        u = jnp.where(values[..., None, :] > 0, u, _householder_qr(u)[0][..., :, :n])
    return u, values, vectors


@custom_jvp
def _svd(a: Array) -> tuple[Array, Array, Array]:
    return _jacobi_svd(a)


@_svd.defjvp
def _svd_jvp(primals, tangents):
    """For distinct nonzero singular values (Townsend, 2016): with J = U^T dA V and F_ij = 1 / (s_j^2 - s_i^2),
    dS = diag(J), dU = U (F * (J S + S J^T)) + (I - U U^T) dA V / S, dV = V (F * (S J + J^T S))."""
    (a,), (da,) = primals, tangents
    u, s, v = _svd(a)
    j = jnp.matmul(jnp.swapaxes(u, -1, -2), jnp.matmul(da, v))
    squares = s * s
    gaps = squares[..., None, :] - squares[..., :, None]
    eye = jnp.eye(s.shape[-1], dtype=bool)
    f = jnp.where(eye, 0, 1 / jnp.where(eye, 1, gaps))
    js, sj = j * s[..., None, :], s[..., :, None] * j
    du = jnp.matmul(u, f * (js + jnp.swapaxes(sj, -1, -2)))
    outside = jnp.matmul(da, v) - jnp.matmul(u, jnp.matmul(jnp.swapaxes(u, -1, -2), jnp.matmul(da, v)))
    du = du + outside / jnp.where(s > 0, s, 1)[..., None, :]
    dv = jnp.matmul(v, f * (sj + jnp.swapaxes(js, -1, -2)))
    return (u, s, v), (du, jnp.diagonal(j, axis1=-2, axis2=-1), dv)


@jitted_op(automatic=True)
def svd(a: Any, full_matrices: bool = True, compute_uv: bool = True, hermitian: bool = False) -> Any:
    """a = U diag(S) Vh with orthonormal U, Vh and singular values S descending, by one-sided Jacobi (JAX calls
    LAPACK's gesdd). `full_matrices` completes U (or Vh) to a square orthonormal basis; with `compute_uv=False`
    only S. Differentiable for distinct nonzero singular values, as JAX."""
    a = jnp.asarray(a)
    if a.ndim < 2: raise ShapeError(at_user_line(f"svd: needs matrices in the last two axes, got shape {a.shape}"))
    if not jnp.issubdtype(a.dtype, jnp.floating): a = a.astype(jnp.float32)
    m, n = a.shape[-2:]
    wide = m < n
    u, s, v = _svd(jnp.swapaxes(a, -1, -2) if wide else a)
    if wide: u, v = v, u  # (the SVD of a^T: the roles swap)
    if not compute_uv: return s
    if full_matrices and m != n:
        tall = v if wide else u
        complete = qr(tall, mode="complete").Q[..., :, min(m, n):]  # (an orthonormal basis of the rest)
        if not wide: u = jnp.concatenate([u, complete], axis=-1)
        else: v = jnp.concatenate([v, complete], axis=-1)
    return SVDResult(u, s, jnp.swapaxes(v, -1, -2))


@jitted_op(automatic=True)
def svdvals(x: Any, /) -> Array:
    """The singular values, descending."""
    return svd(x, compute_uv=False)


def _cutoff(s: Array, rtol: Any, shape: tuple[int, ...]) -> Array:
    if rtol is None: rtol = max(shape[-2:]) * float(jnp.finfo(s.dtype).eps)
    return jnp.asarray(rtol, s.dtype)[..., None] * s[..., :1]


@jitted_op(automatic=True)
def pinv(a: Any, rtol: Any = None, hermitian: bool = False, *, rcond: Any = None) -> Array:
    """The Moore-Penrose pseudo-inverse: V diag(1/S) U^T over the singular values above rtol * max(S)."""
    a = jnp.asarray(a)
    if not jnp.issubdtype(a.dtype, jnp.floating): a = a.astype(jnp.float32)
    u, s, vh = svd(a, full_matrices=False)
    keep = s > _cutoff(s, rtol if rcond is None else rcond, a.shape)
    inverse = jnp.where(keep, 1 / jnp.where(keep, s, 1), 0)
    return jnp.matmul(jnp.swapaxes(vh, -1, -2) * inverse[..., None, :], jnp.swapaxes(u, -1, -2))


@jitted_op(automatic=True)
def matrix_rank(M: Any, rtol: Any = None, *, tol: Any = None) -> Array:
    """The number of singular values above tol (default rtol * max(S), rtol = max(m, n) * eps)."""
    m = jnp.asarray(M)
    if m.ndim < 2: return jnp.asarray(jnp.any(m != 0), jnp.int32)
    s = svdvals(m)
    limit = jnp.asarray(tol, s.dtype)[..., None] if tol is not None else _cutoff(s, rtol, m.shape)
    return jnp.sum(s > limit, axis=-1, dtype=jnp.int32)


class LstsqResult(NamedTuple):
    solution: Array
    residuals: Array
    rank: Array
    singular_values: Array


@jitted_op(automatic=True)
def lstsq(a: Any, b: Any, rcond: Any = None, *, numpy_resid: bool = False) -> LstsqResult:
    """The least-squares solution of a x = b through the SVD (singular values at or below rcond * max(S) are
    dropped), with the squared residuals (when a has full column rank and more rows than columns), the rank and the
    singular values."""
    a, b = jnp.asarray(a), jnp.asarray(b)
    if a.ndim != 2 or b.ndim not in (1, 2) or b.shape[0] != a.shape[0]:
        raise ShapeError(at_user_line(f"lstsq: a must be 2-d and b 1-d or 2-d with a's rows, got {a.shape} and "
                                      f"{b.shape}"))
    if not jnp.issubdtype(a.dtype, jnp.floating): a = a.astype(jnp.float32)
    u, s, vh = svd(a, full_matrices=False)
    keep = s > _cutoff(s, rcond, a.shape)
    rhs = b[:, None] if b.ndim == 1 else b
    coefficients = jnp.where(keep[:, None], jnp.matmul(u.T, rhs) / jnp.where(keep, s, 1)[:, None], 0)
    x = jnp.matmul(vh.T, coefficients)
    rank = jnp.sum(keep, dtype=jnp.int32)
    residual = jnp.sum((jnp.matmul(a, x) - rhs) ** 2, axis=0)
    full = (rank == a.shape[1]) & (a.shape[0] > a.shape[1])
    residuals = jnp.where(full, residual, 0) if numpy_resid is False else residual
    if b.ndim == 1: x, residuals = x[:, 0], residuals
    return LstsqResult(x, residuals, rank, s)


@jitted_op(automatic=True)
def cond(x: Any, p: Any = None) -> Array:
    """The condition number: max(S) / min(S) for p None or 2, min / max for -2, else norm(x, p) norm(inv(x), p)."""
    x = jnp.asarray(x)
    if p in (None, 2, -2):
        s = svdvals(x)
        return s[..., 0] / s[..., -1] if p != -2 else s[..., -1] / s[..., 0]
    return norm(x, ord=p, axis=(-2, -1)) * norm(inv(x), ord=p, axis=(-2, -1))


def multi_dot(arrays: Any, *, precision: Any = None) -> Array:
    """The product of a chain of matrices (first and last may be vectors), multiplied in the order that costs the
    fewest multiply-adds (the classic dynamic program over the chain)."""
    arrays = [jnp.asarray(a) for a in arrays]
    if len(arrays) < 2: raise ValueError(at_user_line("multi_dot: needs at least two arrays"))
    first, last = arrays[0].ndim == 1, arrays[-1].ndim == 1
    if first: arrays[0] = arrays[0][None, :]
    if last: arrays[-1] = arrays[-1][:, None]
    dims = [a.shape[0] for a in arrays] + [arrays[-1].shape[1]]
    count = len(arrays)
    cost = [[0] * count for _ in range(count)]
    split_at = [[0] * count for _ in range(count)]
    for length in range(1, count):
        for i in range(count - length):
            j = i + length
            cost[i][j], split_at[i][j] = min((cost[i][k] + cost[k + 1][j] + dims[i] * dims[k + 1] * dims[j + 1], k)
                                             for k in range(i, j))

    def product(i, j):
        if i == j: return arrays[i]
        k = split_at[i][j]
        return jnp.matmul(product(i, k), product(k + 1, j))
    out = product(0, count - 1)
    if first: out = out[0]
    if last: out = out[..., 0]
    return out


@jitted_op(automatic=True)
def tensorsolve(a: Any, b: Any, axes: Any = None) -> Array:
    """x with tensordot(a, x, x.ndim) = b: a reshaped to a square matrix and solved."""
    a, b = jnp.asarray(a), jnp.asarray(b)
    if axes is not None:
        rest = [i for i in range(a.ndim) if i not in axes]
        a = jnp.transpose(a, rest + list(axes))
    unknown = a.shape[b.ndim:]
    size = int(np.prod(unknown))
    return solve(a.reshape(-1, size), b.reshape(-1)).reshape(unknown)


@jitted_op(automatic=True)
def tensorinv(a: Any, ind: int = 2) -> Array:
    """The inverse of a with respect to tensordot over its first `ind` axes."""
    a = jnp.asarray(a)
    inner, outer = a.shape[:ind], a.shape[ind:]
    return inv(a.reshape(int(np.prod(inner)), -1)).reshape(outer + inner)


def matmul(x1: Any, x2: Any, /, *, precision: Any = None, preferred_element_type: Any = None) -> Array:
    return jnp.matmul(x1, x2, precision=precision, preferred_element_type=preferred_element_type)


def outer(x1: Any, x2: Any, /) -> Array:
    """The outer product of two vectors."""
    x1, x2 = jnp.asarray(x1), jnp.asarray(x2)
    if x1.ndim != 1 or x2.ndim != 1:
        raise ValueError(at_user_line(f"outer: needs 1-d arrays, got shapes {x1.shape} and {x2.shape}"))
    return x1[:, None] * x2[None, :]


def diagonal(x: Any, /, *, offset: int = 0) -> Array:
    return jnp.diagonal(x, offset=offset, axis1=-2, axis2=-1)


def trace(x: Any, /, *, offset: int = 0, dtype: Any = None) -> Array:
    return jnp.sum(diagonal(x, offset=offset), axis=-1, dtype=dtype)


def matrix_transpose(x: Any, /) -> Array:
    return jnp.swapaxes(jnp.asarray(x), -1, -2)


def vecdot(x1: Any, x2: Any, /, *, axis: int = -1, precision: Any = None) -> Array:
    """sum(conj(x1) * x2) over `axis` (the conjugate of x1, as numpy's and JAX's)."""
    return jnp.sum(jnp.conj(jnp.asarray(x1)) * jnp.asarray(x2), axis=axis)


def tensordot(x1: Any, x2: Any, /, *, axes: Any = 2, precision: Any = None) -> Array:
    from fnx.numpy import tensordot as numpy_tensordot
    return numpy_tensordot(x1, x2, axes=axes, precision=precision)


def cross(x1: Any, x2: Any, /, *, axis: int = -1) -> Array:
    from fnx.numpy import cross as numpy_cross
    return numpy_cross(x1, x2, axis=axis)


@eager_op
def vector_norm(x: Any, /, *, axis: Any = None, keepdims: bool = False, ord: Any = 2) -> Array:
    """The vector p-norm over `axis` (None: all elements): ord 2 (default), 1, inf, -inf, 0 (the count of
    nonzeros) or any other real p."""
    x = jnp.asarray(x)
    if jnp.iscomplexobj(x): x = jnp.abs(x)  # (a vector norm of z is that of |z|)
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
    """The matrix norm over the last two axes: 'fro', 'nuc' (the sum of singular values), 2 / -2 (the largest /
    smallest singular value), 1 / -1 (largest / smallest column sum of magnitudes), inf / -inf (row sums)."""
    return norm(x, ord=ord, axis=(-2, -1), keepdims=keepdims)


@jitted_op(automatic=True)
def norm(x: Any, ord: Any = None, axis: Any = None, keepdims: bool = False) -> Array:
    """numpy.linalg.norm: a vector norm over one axis (or of a 1-d array), a matrix norm over two axes (or of a
    2-d array), the 2-norm of all elements for axis None and ord None."""
    x = jnp.asarray(x)
    if jnp.iscomplexobj(x):  # every norm of a complex array is that norm of |x| except the spectral ones
        if ord in (2, -2, "nuc") and (x.ndim == 2 and axis is None or axis is not None and np.ndim(axis) == 1
                                      and len(axis) == 2):
            raise TypeError(at_user_line(f"norm: ord={ord!r} of complex matrices is not supported in fnx yet"))
        x = jnp.abs(x)
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
    if ord in (2, -2, "nuc"):
        s = svdvals(jnp.moveaxis(x, (rows, cols), (-2, -1)))
        out = jnp.sum(s, axis=-1) if ord == "nuc" else s[..., 0] if ord == 2 else s[..., -1]
        return jnp.expand_dims(out, (rows, cols)) if keepdims else out
    if ord not in (1, -1, np.inf, -np.inf):
        raise ValueError(at_user_line(f"norm: invalid ord {ord!r} for matrices"))
    summed_over, kept = (rows, cols) if ord in (1, -1) else (cols, rows)
    sums = jnp.sum(jnp.abs(x), axis=summed_over, keepdims=True)
    pick = jnp.max if ord in (1, np.inf) else jnp.min
    out = pick(sums, axis=kept, keepdims=True)
    return out if keepdims else jnp.squeeze(out, axis=(rows, cols))


# real-only algorithms: a complex argument is a TypeError (the products and norms above take complex values)
refuse_complex(globals(), [n for n in __all__ if n not in (
    "cross", "diagonal", "matmul", "matrix_transpose", "multi_dot", "outer", "tensordot", "trace", "vecdot", "norm",
    "vector_norm", "matrix_norm", "solve", "inv", "matrix_power")], "fnx.numpy.linalg")


def __getattr__(name: str):
    from fnx.jax_names import missing
    raise missing("fnx.numpy.linalg", name)


jnp._extend({"linalg": sys.modules[__name__]})
