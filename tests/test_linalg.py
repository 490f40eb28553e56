"""fnx.numpy.linalg and fnx.scipy.linalg against jax.numpy.linalg / jax.scipy.linalg (LAPACK on the CPU) and
numpy: values for single and batched matrices, float32 and float64, singular and indefinite inputs; grads against
jax.grad; vmap and jit equal to eager; the names not implemented yet say so."""
import numpy as np
import pytest

import fnx
import fnx.numpy as jnp
import fnx.scipy.linalg as sl

jax = pytest.importorskip("jax")
J, JS = jax.numpy, jax.scipy.linalg

RNG = np.random.default_rng(21)


def _matrix(shape, dtype=np.float32):
    return RNG.standard_normal(shape).astype(dtype)


def _spd(n, batch=()):
    a = RNG.standard_normal(batch + (n, n))
    return (a @ np.swapaxes(a, -1, -2) + n * np.eye(n)).astype(np.float32)


def _close(ours, theirs, tol=2e-5):
    ours, theirs = np.asarray(ours), np.asarray(theirs)
    assert ours.shape == theirs.shape, (ours.shape, theirs.shape)
    np.testing.assert_allclose(ours, theirs, rtol=tol, atol=tol)


@pytest.mark.parametrize("batch", [(), (3,), (2, 2)])
def test_factorizations_and_solves_match_jax(batch):
    n = 5
    a, spd, b = _matrix(batch + (n, n)), _spd(n, batch), _matrix(batch + (n, 3))
    _close(jnp.linalg.cholesky(spd), J.linalg.cholesky(spd))
    _close(jnp.linalg.cholesky(spd, upper=True), J.linalg.cholesky(spd, upper=True))
    _close(jnp.linalg.solve(a, b), J.linalg.solve(a, b), 1e-4)
    _close(jnp.linalg.inv(a), J.linalg.inv(a), 1e-4)
    _close(jnp.linalg.det(a), J.linalg.det(a), 1e-4)
    for ours, theirs in zip(jnp.linalg.slogdet(a), J.linalg.slogdet(a)): _close(ours, theirs, 1e-5)
    for mode in ("reduced", "complete"):
        for ours, theirs in zip(jnp.linalg.qr(a[..., :, :3], mode=mode), J.linalg.qr(a[..., :, :3], mode=mode)):
            _close(ours, theirs)
    _close(jnp.linalg.qr(a, mode="r"), J.linalg.qr(a, mode="r"))
    if not batch:  # (JAX's scipy LU takes single matrices; batches are checked by their product)
        for ours, theirs in zip(sl.lu(a), JS.lu(a)): _close(ours, theirs)
        for ours, theirs in zip(sl.lu_factor(a), JS.lu_factor(a)): _close(ours, theirs)
    p, l_, u = (np.asarray(m) for m in sl.lu(a))
    _close(p @ l_ @ u, a, 1e-5)
    for trans in (0, 1):  # (JAX's lu_solve takes single matrices: batches against numpy)
        want = np.linalg.solve(np.swapaxes(a, -1, -2) if trans else a, b)
        _close(sl.lu_solve(sl.lu_factor(a), b, trans=trans), want, 1e-4)
    for lower in (False, True):
        _close(sl.cho_solve(sl.cho_factor(spd, lower=lower), b), JS.cho_solve(JS.cho_factor(spd, lower=lower), b))
        for trans in (0, 1):
            for unit in (False, True):
                t = np.tril(a) if lower else np.triu(a)
                t = t + 3 * np.eye(n, dtype=np.float32)  # (well conditioned)
                _close(sl.solve_triangular(t, b, trans=trans, lower=lower, unit_diagonal=unit),
                       JS.solve_triangular(t, b, trans=trans, lower=lower, unit_diagonal=unit), 1e-4)


def test_vectors_float64_and_special_matrices():
    a, v = _matrix((4, 4), np.float64), _matrix((4,), np.float64)
    with fnx.enable_x64():
        x = jnp.linalg.solve(a, v)
        assert x.dtype == np.float64 and x.shape == (4,)
        np.testing.assert_allclose(np.asarray(x), np.linalg.solve(a, v), rtol=1e-12)
        np.testing.assert_allclose(np.asarray(jnp.linalg.det(a)), np.linalg.det(a), rtol=1e-12)
    singular = np.array([[1.0, 2.0], [2.0, 4.0]], np.float32)
    assert float(jnp.linalg.det(singular)) == 0.0
    sign, log = jnp.linalg.slogdet(singular)
    assert float(sign) == 0.0 and float(log) == -np.inf
    indefinite = np.array([[1.0, 2.0], [2.0, 1.0]], np.float32)
    assert np.isnan(np.asarray(jnp.linalg.cholesky(indefinite))).any()  # (as JAX: NaNs, no exception)
    permuted = np.array([[0.0, 1.0], [1.0, 0.0]], np.float32)  # (a zero first pivot: the row swap)
    _close(jnp.linalg.det(permuted), -1.0)
    _close(jnp.linalg.inv(permuted), permuted)
    for power in (0, 1, 2, 5, -1, -3):
        _close(jnp.linalg.matrix_power(a.astype(np.float32), power),
               np.linalg.matrix_power(a, power).astype(np.float32), 2e-4)


@pytest.mark.parametrize("ord", [None, 1, 2, -1, -2, np.inf, -np.inf, 0, 3, "fro", "nuc"])
def test_norms_match_numpy(ord):
    x = _matrix((3, 4, 5))
    if ord not in ("fro", "nuc", -2):
        for axis in (-1, 0):
            _close(jnp.linalg.norm(x, ord=ord, axis=axis), np.linalg.norm(x, ord=ord, axis=axis), 1e-5)
    if ord not in (0, 3):
        matrix_ord = "fro" if ord is None else ord
        _close(jnp.linalg.norm(x, ord=matrix_ord, axis=(1, 2), keepdims=True),
               np.linalg.norm(x, ord=matrix_ord, axis=(1, 2), keepdims=True), 1e-5)
        _close(jnp.linalg.matrix_norm(x, ord=matrix_ord), np.linalg.norm(x, ord=matrix_ord, axis=(1, 2)), 1e-5)
    _close(jnp.linalg.norm(x), np.linalg.norm(x), 1e-5)
    _close(jnp.linalg.vector_norm(x, axis=(0, 2)), J.linalg.vector_norm(x, axis=(0, 2)), 1e-5)


@pytest.mark.parametrize("shape", [(6, 4), (4, 6), (5, 5), (2, 7, 3), (1, 1)])
@pytest.mark.parametrize("full_matrices", [False, True])
def test_svd_matches_lapack(shape, full_matrices):
    a = _matrix(shape)
    u, s, vh = (np.asarray(m, np.float64) for m in jnp.linalg.svd(a, full_matrices=full_matrices))
    ju, js, jvh = (np.asarray(m) for m in J.linalg.svd(a, full_matrices=full_matrices))
    assert u.shape == ju.shape and s.shape == js.shape and vh.shape == jvh.shape
    np.testing.assert_allclose(s, np.linalg.svd(a.astype(np.float64), compute_uv=False), atol=2e-6 * s.max())
    k = min(shape[-2:])
    np.testing.assert_allclose((u[..., :, :k] * s[..., None, :]) @ vh[..., :k, :], a, atol=3e-6 * s.max())
    for q in (u, np.swapaxes(vh, -1, -2)):
        np.testing.assert_allclose(np.swapaxes(q, -1, -2) @ q, np.broadcast_to(np.eye(q.shape[-1]), q.shape[:-2]
                                                                               + (q.shape[-1],) * 2), atol=2e-6)
    np.testing.assert_allclose(np.abs(u[..., :, :k]), np.abs(ju[..., :, :k]), atol=1e-4)  # (signs arbitrary)
    _close(jnp.linalg.svdvals(a), js, 2e-6 * s.max())


def test_svd_based_functions():
    a, b = _matrix((7, 4)), _matrix((7,))
    low_rank = _matrix((6, 2)) @ _matrix((2, 5))
    _close(jnp.linalg.pinv(a), np.linalg.pinv(a), 1e-5)
    _close(jnp.linalg.pinv(low_rank), J.linalg.pinv(low_rank), 1e-4)  # (numpy keeps the float32 noise: rcond 1e-15)
    assert int(jnp.linalg.matrix_rank(low_rank)) == 2 and int(jnp.linalg.matrix_rank(a)) == 4
    ours, theirs = jnp.linalg.lstsq(a, b), np.linalg.lstsq(a, b, rcond=None)
    for x, y in zip(ours, theirs): _close(x, np.asarray(y, np.asarray(x).dtype), 1e-5)
    square = _matrix((4, 4))
    for p in (None, 2, -2, 1, np.inf, "fro"):
        _close(jnp.linalg.cond(square, p), np.linalg.cond(square, p), 1e-3)
    chain = [_matrix((3, 8)), _matrix((8, 2)), _matrix((2, 9)), _matrix((9,))]
    _close(jnp.linalg.multi_dot(chain), np.linalg.multi_dot(chain), 1e-5)
    t = _matrix((2, 3, 6))
    _close(jnp.linalg.tensorinv(t.reshape(6, 2, 3), ind=1), np.linalg.tensorinv(t.reshape(6, 2, 3), ind=1), 1e-4)
    _close(jnp.linalg.tensorsolve(t.reshape(6, 2, 3), b[:6]), np.linalg.tensorsolve(t.reshape(6, 2, 3), b[:6]),
           1e-4)

    def loss(np_):
        return lambda a: (np_.linalg.svd(a, full_matrices=False)[1] ** 2).sum() + np_.linalg.norm(a, "nuc") + (
            np_.linalg.svd(a, full_matrices=False)[0] ** 2 * np_.arange(4.0)).sum()
    _close(fnx.grad(loss(jnp))(a), jax.grad(loss(J))(a), 1e-3)


def test_grads_match_jax():
    a, spd, b = _matrix((4, 4)), _spd(4), _matrix((4, 2))

    def loss(np_, sl_):
        def f(a, spd, b):
            return (np_.linalg.solve(a, b).sum() + np_.linalg.slogdet(a)[1] + np_.linalg.det(a)
                    + (np_.linalg.cholesky(spd) * b[:, :1]).sum() + np_.linalg.inv(a)[0].sum()
                    + (np_.linalg.qr(a)[1] ** 2).sum() + sl_.solve_triangular(spd, b, lower=True).sum())
        return f
    ours = fnx.grad(loss(jnp, sl), argnums=(0, 1, 2))(a, spd, b)
    theirs = jax.grad(loss(J, JS), argnums=(0, 1, 2))(a, spd, b)
    for x, y in zip(ours, theirs): _close(x, y, 2e-3)


def test_qr_grads_at_matrices_already_triangular_and_wide_match_jax():
    # differentiating the Householder reflections missed, where a column was already zero below the diagonal (a
    # diagonal or triangular matrix: the reflection is skipped), the rotation any perturbation starts: the gradient of
    # sum(R) at diag(1, 2, 7) + outer(x, x) with x = (0, 0, 2) had 2 where JAX (and the derivative) has 16
    weights = RNG.standard_normal((5, 5)).astype(np.float32)

    def loss(np_, mode="reduced", rows=3, cols=3):
        def f(x):
            a = np_.diag(np_.arange(1.0, 6.0))[:rows, :cols] + np_.outer(x, x)[:rows, :cols]
            q, r = np_.linalg.qr(a, mode=mode) if mode != "r" else (None, np_.linalg.qr(a, mode="r"))
            out = (r * weights[:r.shape[0], :r.shape[1]]).sum()
            return out if q is None else out + (q * weights[:q.shape[0], :q.shape[1]]).sum()
        return f
    points = [np.array([0.0, 0.0, 2.0, 0.0, 0.0], np.float32), np.zeros(5, np.float32),
              np.array([0.0, 1.0, -1.0, 0.0, 0.5], np.float32), RNG.standard_normal(5).astype(np.float32)]
    for x in points:
        for mode, rows, cols in (("reduced", 3, 3), ("r", 3, 3), ("reduced", 5, 3), ("reduced", 3, 5), ("r", 2, 5),
                                 ("complete", 3, 5)):
            theirs = jax.grad(loss(J, mode, rows, cols))(x)
            for g in (fnx.grad(loss(jnp, mode, rows, cols)), fnx.jit(fnx.grad(loss(jnp, mode, rows, cols)))):
                _close(g(x), theirs, 2e-3)
            if x is points[-1]:
                _close(jnp.linalg.qr(np.diag(np.arange(1.0, 6.0))[:rows, :cols] + np.outer(x, x)[:rows, :cols],
                                     mode=mode)[-1 if mode != "r" else slice(None)],
                       J.linalg.qr(np.diag(np.arange(1.0, 6.0))[:rows, :cols] + np.outer(x, x)[:rows, :cols],
                                   mode=mode)[-1 if mode != "r" else slice(None)], 1e-4)
    # scipy's mode='r' of a tall matrix: the reduced R with zero rows, differentiated as the factorization
    def scipy_r(lib, np_):
        return lambda x: (lib.qr(np_.diag(np_.arange(1.0, 6.0))[:, :3] + np_.outer(x, x)[:, :3], mode="r")[0]
                          * weights[:, :3]).sum()
    for x in points[:2]:
        _close(fnx.grad(scipy_r(sl, jnp))(x), jax.grad(scipy_r(JS, J))(x), 2e-3)


def test_det_grads_at_singular_matrices_and_svd_of_rank_deficient_ones():
    # det's derivative is the adjugate, finite at a singular matrix: differentiating the LU's divisions by a zero
    # pivot gave NaN; and the SVD's U had zero columns for zero singular values (not orthonormal)
    singular = [np.array([[1.0, 2.0], [2.0, 4.0]]), np.array([[0.0, 1.0], [0.0, 0.0]]), np.zeros((3, 3)),
                np.diag([1.0, 0.0, 3.0]), np.array([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0], [7.0, 8.0, 9.0]])]
    for a in [m.astype(np.float32) for m in singular] + [_matrix((2, 3, 3))]:
        for g in (fnx.grad(lambda m: jnp.linalg.det(m).sum()), fnx.jit(fnx.grad(lambda m: jnp.linalg.det(m).sum()))):
            _close(g(a), jax.grad(lambda m: J.linalg.det(m).sum())(a), 2e-4)
        _close(jnp.linalg.det(a), J.linalg.det(a), 2e-4)
    for a in singular + [np.ones((4, 3)), np.ones((3, 4)), np.outer(np.arange(5.0), np.arange(1.0, 4.0))]:
        a = a.astype(np.float32)
        u, s, vt = (np.asarray(t) for t in jnp.linalg.svd(a))
        np.testing.assert_allclose(u.T @ u, np.eye(u.shape[1]), atol=1e-6)
        np.testing.assert_allclose(vt @ vt.T, np.eye(vt.shape[0]), atol=1e-6)
        k = min(a.shape)
        np.testing.assert_allclose((u[:, :k] * s) @ vt[:k], a, atol=1e-5)
        np.testing.assert_allclose(s, np.linalg.svd(a.astype(np.float64), compute_uv=False), atol=1e-5)


def test_vmap_jit_and_errors():
    a, b = _matrix((3, 4, 4)), _matrix((3, 4))
    _close(fnx.vmap(jnp.linalg.solve)(a, b), jax.vmap(J.linalg.solve)(a, b), 1e-4)
    _close(fnx.jit(jnp.linalg.inv)(a), J.linalg.inv(a), 1e-4)
    with pytest.raises(Exception, match=r"det: needs square matrices .* \(3, 4\)"):
        jnp.linalg.det(np.ones((3, 4)))
    with pytest.raises(Exception, match=r"solve: a \(4, 4\) and b \(3,\)"):
        jnp.linalg.solve(np.eye(4), np.ones(3))
    with pytest.raises(AttributeError, match="jax.numpy.linalg.eig is not implemented in fnx yet"):
        jnp.linalg.eig


@pytest.mark.parametrize("n", [1, 2, 3, 8, 33])
def test_eigh_matches_lapack(n):
    a = _matrix((2, n, n))
    a = a + np.swapaxes(a, -1, -2)
    w, v = (np.asarray(x, np.float64) for x in jnp.linalg.eigh(a))
    want = np.linalg.eigvalsh(a.astype(np.float64))
    np.testing.assert_allclose(w, want, rtol=0, atol=2e-6 * n * np.abs(want).max())
    np.testing.assert_allclose(a @ v, v * w[..., None, :], atol=5e-6 * n * np.abs(want).max())
    np.testing.assert_allclose(np.swapaxes(v, -1, -2) @ v, np.broadcast_to(np.eye(n), v.shape), atol=1e-6 * n + 1e-6)
    theirs = np.asarray(J.linalg.eigh(a)[1])  # (signs are arbitrary: compare v v^T per eigenvector)
    np.testing.assert_allclose(np.abs(v), np.abs(theirs), atol=1e-4 * n)
    _close(jnp.linalg.eigvalsh(a), np.linalg.eigvalsh(a), 2e-6 * n * np.abs(want).max())


def test_eigh_float64_degenerate_uplo_and_grad():
    a = _matrix((6, 6), np.float64)
    a = a + a.T
    with fnx.enable_x64():
        np.testing.assert_allclose(np.asarray(jnp.linalg.eigh(a)[0]), np.linalg.eigvalsh(a), rtol=0, atol=1e-13)
    w, v = jnp.linalg.eigh(np.eye(4, dtype=np.float32) * 3)
    np.testing.assert_array_equal(np.asarray(w), [3, 3, 3, 3])
    lower_only = np.tril(a)
    with fnx.enable_x64():
        np.testing.assert_allclose(np.asarray(jnp.linalg.eigh(lower_only, symmetrize_input=False)[0]),
                                   np.linalg.eigvalsh(a), atol=1e-12)
        np.testing.assert_allclose(np.asarray(jnp.linalg.eigh(np.triu(a), UPLO="U", symmetrize_input=False)[0]),
                                   np.linalg.eigvalsh(a), atol=1e-12)
    b = _matrix((5, 5))
    b = b + b.T

    def loss(np_):  # (invariant to the eigenvectors' signs)
        return lambda a: (np_.linalg.eigh(a)[0] ** 3).sum() + (np_.linalg.eigh(a)[1] ** 2 * np_.arange(5.0)).sum()
    _close(fnx.grad(loss(jnp))(b), jax.grad(loss(J))(b), 1e-3)
    _close(fnx.vmap(jnp.linalg.eigvalsh)(np.stack([b, 2 * b])), np.stack([np.linalg.eigvalsh(b),
                                                                          np.linalg.eigvalsh(2 * b)]), 1e-4)


def test_eager_factorizations_trace_once_per_signature():
    """fnx.numpy.linalg's functions run as jitted functions, as JAX's do: a second eager call on arrays of the same
    shapes traces and compiles nothing. Run eagerly, each call traced again, and its fori loops got new bodies that
    were lowered and compiled again (inv of an 8x8 matrix: 211 ms a call)."""
    from fnx import events
    rng = np.random.default_rng(3)
    a = rng.standard_normal((6, 6)).astype(np.float32)
    spd = a @ a.T + 6 * np.eye(6, dtype=np.float32)
    calls = [(jnp.linalg.inv, np.linalg.inv), (lambda m: jnp.linalg.eigh(m)[0], lambda m: np.linalg.eigh(m)[0]),
             (jnp.linalg.cholesky, np.linalg.cholesky),
             (lambda m: jnp.linalg.svd(m, compute_uv=False), lambda m: np.linalg.svd(m, compute_uv=False))]
    for ours, _ in calls: ours(jnp.asarray(spd))
    traces = []
    stop = events.listen(lambda e: traces.append(e.name) if e.cat in ("trace", "lower") else None)
    try:
        other = spd + np.float32(1)
        results = [ours(jnp.asarray(other)) for ours, _ in calls]
    finally:
        stop()
    assert traces == []
    for got, (_, want) in zip(results, calls):
        np.testing.assert_allclose(np.asarray(got), want(other.astype(np.float64)), rtol=2e-4, atol=2e-4)
