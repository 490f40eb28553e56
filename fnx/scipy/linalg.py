"""fnx.scipy.linalg: jax.scipy.linalg's triangular solves and the Cholesky and LU factorizations with their
solvers, on fnx.numpy.linalg's loops (fnx/numpy_linalg.py). scipy's conventions: `cholesky` is upper unless
lower=True; `lu` returns (p, l, u) with a = p @ l @ u.

    >>> fnx.scipy.linalg.solve_triangular(jnp.array([[2.0, 0.0], [1.0, 1.0]]), jnp.array([2.0, 3.0]), lower=True)
    Array([1., 2.], dtype=float32)
"""
from __future__ import annotations

import math
from typing import Any

import numpy as np

from fnx import dtypes, lax
from fnx import numpy as jnp
from fnx import numpy_linalg
from fnx.errors import ShapeError, at_user_line
from fnx.numpy_linalg import _square, _triangular_solve, det, householder, inv, lu_factor as _lu
from fnx.trace import Array, eager_op, refuse_complex
from fnx.transforms.jit import jitted_op

__all__ = ["block_diag", "cho_factor", "cho_solve", "cholesky", "circulant", "companion", "det", "eigh", "expm",
           "fiedler", "hadamard", "hankel", "helmert", "hessenberg", "hilbert", "inv", "leslie", "lu", "lu_factor",
           "lu_solve", "pascal", "polar", "qr", "solve", "solve_triangular", "svd", "toeplitz"]


@jitted_op(automatic=True)
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


@jitted_op(automatic=True)
def cholesky(a: Any, lower: bool = False, overwrite_a: bool = False, check_finite: bool = True) -> Array:
    """The Cholesky factor: upper U with a = U^T U (scipy's default), or lower L with a = L L^T."""
    return numpy_linalg.cholesky(a, upper=not lower)


def cho_factor(a: Any, lower: bool = False, overwrite_a: bool = False, check_finite: bool = True) -> tuple:
    """(c, lower): the factor for cho_solve."""
    return cholesky(a, lower=lower), lower


def cho_solve(c_and_lower: tuple, b: Any, overwrite_b: bool = False, check_finite: bool = True) -> Array:
    """x with a x = b from cho_factor(a)'s (c, lower)."""
    c, lower = c_and_lower
    return _cho_solve(c, b, bool(lower))


@jitted_op(automatic=True)
def _cho_solve(c: Any, b: Any, lower: bool) -> Array:
    if lower:
        y = solve_triangular(c, b, lower=True)
        return solve_triangular(c, y, trans=1, lower=True)
    y = solve_triangular(c, b, trans=1, lower=False)
    return solve_triangular(c, y, lower=False)


@jitted_op(automatic=True)
def lu_factor(a: Any, overwrite_a: bool = False, check_finite: bool = True) -> tuple[Array, Array]:
    """(lu, piv): L (unit diagonal) and U packed, and LAPACK's row interchanges (row i swapped with piv[i])."""
    factors = _lu(a)
    return factors.lu, factors.pivots


@jitted_op(automatic=True)
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


@jitted_op(automatic=True)
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


@jitted_op(automatic=True)
def solve(a: Any, b: Any, lower: bool = False, overwrite_a: bool = False, overwrite_b: bool = False,
          check_finite: bool = True, assume_a: str = "gen") -> Array:
    """x with a x = b; assume_a 'pos' solves by Cholesky, anything else by LU."""
    if assume_a == "pos": return cho_solve(cho_factor(a, lower=True), b)
    return numpy_linalg.solve(a, b)


# ---- decompositions with scipy's signatures ----

@jitted_op(automatic=True)
def eigh(a: Any, b: Any = None, lower: bool = True, eigvals_only: bool = False, overwrite_a: bool = False,
         overwrite_b: bool = False, turbo: bool = True, eigvals: Any = None, type: int = 1,  # noqa: A002
         check_finite: bool = True) -> Any:
    """Eigenvalues (ascending) and eigenvectors of a symmetric matrix from its `lower` (or upper) triangle: (w, v),
    or w with eigvals_only. The generalized problem (b) is not supported, as in JAX."""
    if b is not None: raise NotImplementedError(at_user_line("eigh: only b=None is supported (as in JAX)"))
    if eigvals is not None: raise NotImplementedError(at_user_line("eigh: eigvals= (a subset) is not supported"))
    w, v = numpy_linalg.eigh(a, UPLO="L" if lower else "U", symmetrize_input=False)
    return w if eigvals_only else (w, v)


@jitted_op(automatic=True)
def svd(a: Any, full_matrices: bool = True, compute_uv: bool = True, overwrite_a: bool = False,
        check_finite: bool = True, lapack_driver: str = "gesdd") -> Any:
    """Singular value decomposition a = u @ diag(s) @ vh: (u, s, vh), or s without compute_uv."""
    out = numpy_linalg.svd(a, full_matrices=full_matrices, compute_uv=compute_uv)
    return tuple(out) if compute_uv else out


@jitted_op(automatic=True)
def qr(a: Any, overwrite_a: bool = False, lwork: Any = None, mode: str = "full", pivoting: bool = False,
       check_finite: bool = True) -> Any:
    """a = q @ r, with scipy's modes: 'full' (q square), 'economic' (q with a's columns), 'r' (a tuple (r,) of the
    full r), 'raw' is not supported."""
    if pivoting: raise NotImplementedError(at_user_line("qr: pivoting=True is not supported"))
    if mode not in ("full", "economic", "r"):
        raise ValueError(at_user_line(f"qr: mode must be 'full', 'economic' or 'r', got {mode!r}"))
    if mode == "r":  # the reduced R padded with zero rows: differentiated as the factorization, not the reflections
        r = numpy_linalg.qr(a, mode="r")
        a = jnp.asarray(a)
        extra = a.shape[-2] - r.shape[-2]
        return (jnp.concatenate([r, jnp.zeros(r.shape[:-2] + (extra, r.shape[-1]), r.dtype)], axis=-2)
                if extra > 0 else r,)
    return tuple(numpy_linalg.qr(a, mode="complete" if mode == "full" else "reduced"))


@jitted_op(automatic=True)
def polar(a: Any, side: str = "right", *, method: str = "qdwh", eps: Any = None, max_iterations: Any = None) -> tuple:
    """The polar decomposition a = u @ p (side 'right') or p @ u ('left'), u with orthonormal columns, p symmetric
    positive semi-definite; computed from the SVD for every `method` (JAX's default iterates QDWH: the same result
    to rounding)."""
    if side not in ("right", "left"):
        raise ValueError(at_user_line(f"polar: side must be 'right' or 'left', got {side!r}"))
    if method not in ("qdwh", "svd"): raise ValueError(at_user_line(f"polar: unknown method {method!r}"))
    x = jnp.asarray(a)
    if x.ndim != 2: raise ShapeError(at_user_line(f"polar: needs a matrix, got shape {x.shape}"))
    u_, s, vh = numpy_linalg.svd(x, full_matrices=False)
    unitary = u_ @ vh
    if side == "right": return unitary, (jnp.swapaxes(vh, -1, -2) * s[..., None, :]) @ vh
    return unitary, (u_ * s[..., None, :]) @ jnp.swapaxes(u_, -1, -2)


# Pade 13 coefficients of e^x (Higham, "The scaling and squaring method for the matrix exponential revisited", 2005)
_PADE13 = (64764752532480000.0, 32382376266240000.0, 7771770303897600.0, 1187353796428800.0, 129060195264000.0,
           10559470521600.0, 670442572800.0, 33522128640.0, 1323241920.0, 40840800.0, 960960.0, 16380.0, 182.0, 1.0)
_THETA13 = 5.371920351148152  # the 1-norm up to which Pade 13 is accurate to float64's rounding without squaring


@jitted_op(automatic=True)
def expm(A: Any, *, upper_triangular: bool = False, max_squarings: int = 16) -> Array:  # noqa: N803 (scipy's name)
    """The matrix exponential by scaling and squaring with a Pade 13 approximant (Higham 2005): A / 2^s with
    s = ceil(log2(|A|_1 / theta13)) (at most `max_squarings`), then squared s times. Works under jit (the squarings
    are selected, not branched) and differentiates through the matmuls and the solve."""
    a = jnp.asarray(A)
    if a.ndim < 2 or a.shape[-1] != a.shape[-2]:
        raise ShapeError(at_user_line(f"expm: needs square matrices, got shape {a.shape}"))
    if not _dt(a).is_float: a = a.astype(jnp.result_type(float))
    norm = jnp.max(jnp.sum(jnp.abs(a), axis=-2), axis=-1)
    s = jnp.clip(jnp.ceil(jnp.log2(jnp.maximum(norm, 1e-30) / _THETA13)), 0, max_squarings)
    a = a / (2.0 ** s)[..., None, None]
    eye = jnp.broadcast_to(jnp.eye(a.shape[-1], dtype=a.dtype), a.shape)
    a2 = a @ a
    a4 = a2 @ a2
    a6 = a4 @ a2
    b = _PADE13
    u = a @ (a6 @ (b[13] * a6 + b[11] * a4 + b[9] * a2) + b[7] * a6 + b[5] * a4 + b[3] * a2 + b[1] * eye)
    v = a6 @ (b[12] * a6 + b[10] * a4 + b[8] * a2) + b[6] * a6 + b[4] * a4 + b[2] * a2 + b[0] * eye
    r = numpy_linalg.solve(v - u, v + u)
    for i in range(max_squarings):
        r = jnp.where((i < s)[..., None, None], r @ r, r)
    return r


def _dt(x: Array):
    return x.uop.dtype


# ---- special matrices ----

@eager_op
def block_diag(*arrs: Any) -> Array:
    """The arrays (0-d: 1x1, 1-d: one row, 2-d) on the diagonal of one matrix, zeros elsewhere; dtypes promote."""
    mats = [jnp.atleast_2d(jnp.asarray(a)) for a in arrs]
    if any(m.ndim != 2 for m in mats): raise ValueError(at_user_line("block_diag: arguments must have rank <= 2"))
    if not mats: return jnp.zeros((1, 0))
    dt = jnp.result_type(*mats)
    rows = sum(m.shape[0] for m in mats)
    cols = sum(m.shape[1] for m in mats)
    out, r, c = jnp.zeros((rows, cols), dt), 0, 0
    for m in mats:
        out = lax.dynamic_update_slice(out, m.astype(dt), (r, c))
        r, c = r + m.shape[0], c + m.shape[1]
    return out


def _take_last(x: Array, index: np.ndarray) -> Array:
    """x[..., index] for a constant index array of any shape (the result has x's batch axes, then index's)."""
    flat = jnp.take(x, jnp.asarray(index.reshape(-1)), axis=-1)
    return flat.reshape(x.shape[:-1] + index.shape)


@eager_op
def toeplitz(c: Any, r: Any = None) -> Array:
    """The Toeplitz matrix with first column c and first row r (default c; r[0] is ignored), over c's and r's
    leading (batch) axes."""
    c = jnp.asarray(c)
    r = c if r is None else jnp.asarray(r)
    c, r = jnp.atleast_1d(c), jnp.atleast_1d(r)
    m, n = c.shape[-1], r.shape[-1]
    i, j = np.arange(m)[:, None], np.arange(n)[None, :]
    batch = jnp.broadcast_shapes(c.shape[:-1], r.shape[:-1])
    c, r = jnp.broadcast_to(c, batch + (m,)), jnp.broadcast_to(r, batch + (n,))
    dt = jnp.result_type(c, r)
    lower = _take_last(c.astype(dt), np.where(i >= j, i - j, 0))
    upper = _take_last(r.astype(dt), np.where(i < j, j - i, 0))
    return jnp.where(jnp.asarray(i >= j), lower, upper)


@eager_op
def circulant(c: Any) -> Array:
    """The circulant matrix with first column c: out[..., i, j] = c[..., (i - j) mod n]."""
    c = jnp.atleast_1d(jnp.asarray(c))
    n = c.shape[-1]
    return _take_last(c, (np.arange(n)[:, None] - np.arange(n)[None, :]) % n)


@eager_op
def hankel(c: Any, r: Any = None) -> Array:
    """The Hankel matrix with first column c and last row r (default zeros; r[0] is ignored): out[i, j] = c[i + j]
    while i + j < len(c), else r[i + j - len(c) + 1]."""
    c = jnp.ravel(jnp.asarray(c))
    r = jnp.zeros_like(c) if r is None else jnp.ravel(jnp.asarray(r))
    m, n = c.shape[0], r.shape[0]
    k = np.arange(m)[:, None] + np.arange(n)[None, :]
    values = jnp.concatenate([c, r[1:].astype(jnp.result_type(c, r))]).astype(jnp.result_type(c, r))
    return values[jnp.asarray(k)]


@eager_op
def hilbert(n: int) -> Array:
    """The n x n Hilbert matrix 1 / (i + j + 1)."""
    k = np.arange(n)
    return jnp.asarray(1.0 / (k[:, None] + k[None, :] + 1), dtype=jnp.result_type(float))


@eager_op
def pascal(n: int, kind: str | None = None) -> Array:
    """The n x n Pascal matrix: 'symmetric' (default) C(i + j, i), 'lower' C(i, j), 'upper' its transpose; exact
    integers in the default float dtype."""
    kind = kind or "symmetric"
    if kind not in ("symmetric", "lower", "upper"):
        raise ValueError(at_user_line(f"pascal: kind must be 'symmetric', 'lower' or 'upper', got {kind!r}"))
    i, j = np.meshgrid(np.arange(n), np.arange(n), indexing="ij")
    if kind == "symmetric": values = [[math.comb(a + b, a) for b in range(n)] for a in range(n)]
    else: values = [[math.comb(a, b) if a >= b else 0 for b in range(n)] for a in range(n)]
    out = np.array(values, np.float64).reshape(n, n)
    return jnp.asarray(out.T if kind == "upper" else out, dtype=jnp.result_type(float))


@eager_op
def leslie(f: Any, s: Any) -> Array:
    """The Leslie matrix: fecundities f in the first row, survival rates s on the subdiagonal."""
    f, s = jnp.atleast_1d(jnp.asarray(f)), jnp.atleast_1d(jnp.asarray(s))
    n = f.shape[-1]
    if s.shape[-1] != n - 1:
        raise ValueError(at_user_line(f"leslie: s must have one element fewer than f, got {s.shape} and {f.shape}"))
    dt = jnp.result_type(f, s)
    below = jnp.concatenate([jnp.diag(s.astype(dt)), jnp.zeros((n - 1, 1), dt)], axis=1) if n > 1 else \
        jnp.zeros((0, n), dt)
    return jnp.concatenate([f.astype(dt)[None, :], below], axis=0)


@eager_op
def companion(a: Any) -> Array:
    """The companion matrix of the polynomial with coefficients a (highest first): -a[1:] / a[0] in the first row,
    ones on the subdiagonal."""
    a = jnp.asarray(a)
    if a.ndim != 1 or a.shape[0] < 2:
        raise ValueError(at_user_line(f"companion: needs a 1-d array of at least 2 coefficients, got shape {a.shape}"))
    a = a.astype(jnp.result_type(a, float))
    n = a.shape[0] - 1
    first = -a[1:] / a[0]
    below = jnp.concatenate([jnp.eye(n - 1, dtype=a.dtype), jnp.zeros((n - 1, 1), a.dtype)], axis=1)
    return jnp.concatenate([first[None, :], below], axis=0)


@eager_op
def fiedler(a: Any) -> Array:
    """The symmetric Fiedler matrix |a_i - a_j|."""
    a = jnp.ravel(jnp.asarray(a))
    return jnp.abs(a[:, None] - a[None, :])


@eager_op
def helmert(n: int, full: bool = False) -> Array:
    """The Helmert matrix of order n (orthogonal): row 0 is 1/sqrt(n); row i has 1/sqrt(i (i+1)) in its first i
    places and -i/sqrt(i (i+1)) at i. Without `full`, row 0 is left out."""
    h = np.zeros((n, n))
    h[0] = 1 / math.sqrt(n)
    for i in range(1, n):
        h[i, :i] = 1 / math.sqrt(i * (i + 1))
        h[i, i] = -i / math.sqrt(i * (i + 1))
    return jnp.asarray(h if full else h[1:], dtype=jnp.result_type(float))


@eager_op
def hadamard(n: int, dtype: Any = int) -> Array:
    """The n x n Hadamard matrix (Sylvester's construction; n a power of 2)."""
    if n < 1 or n & (n - 1):
        raise ValueError(at_user_line(f"hadamard: n must be a positive power of 2, got {n}"))
    h = np.ones((1, 1), np.int64)
    while h.shape[0] < n: h = np.block([[h, h], [h, -h]])
    return jnp.asarray(h).astype(dtypes.requested(dtype, "hadamard"))


def __getattr__(name: str):
    from fnx.jax_names import missing
    raise missing("fnx.scipy.linalg", name)


@jitted_op(automatic=True)
def hessenberg(a: Any, calc_q: bool = False, overwrite_a: bool = False, check_finite: bool = True) -> Any:
    """jax.scipy.linalg.hessenberg: H = Q^T a Q, zero below its first subdiagonal, by Householder reflections
    with LAPACK's signs (dgehrd's), so H matches scipy's; `(H, Q)` with `calc_q`. Composed of fnx operations:
    jit, vmap and grad follow."""
    a = _square(a, "hessenberg")
    if not jnp.issubdtype(a.dtype, jnp.floating): a = a.astype(jnp.float32)
    n = a.shape[-1]
    index = jnp.arange(n, dtype=jnp.int32)
    h, q = a, jnp.broadcast_to(jnp.eye(n, dtype=a.dtype), a.shape)
    for j in range(n - 2):  # (n is static: one reflection per column but the last two)
        v = householder(h[..., :, j], j + 1, index)
        h = h - 2 * v[..., :, None] * jnp.sum(v[..., :, None] * h, axis=-2, keepdims=True)  # from the left
        h = h - 2 * jnp.sum(h * v[..., None, :], axis=-1, keepdims=True) * v[..., None, :]  # and the right
        q = q - 2 * jnp.sum(q * v[..., None, :], axis=-1, keepdims=True) * v[..., None, :]
    h = jnp.where(index[:, None] > index[None, :] + 1, 0, h)  # exact zeros below the subdiagonal
    return (h, q) if calc_q else h


# real-only algorithms: a complex argument is a TypeError (the constructors of special matrices take any values)
refuse_complex(globals(), ["cho_factor", "cho_solve", "cholesky", "det", "eigh", "expm", "hessenberg", "inv", "lu",
                           "lu_factor", "lu_solve", "polar", "qr", "solve", "solve_triangular", "svd"],
               "fnx.scipy.linalg")
