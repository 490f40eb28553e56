"""fnx.scipy.linalg's special matrices, scipy-signature decompositions and expm against scipy (float64, the oracle)
and JAX; and float64 solves of every small size under jit (the native scan loop once gave NaNs for 5 x 5 and 6 x 6
on AVX-512: its kernels were inlined into the loop, where their `noalias` arguments do not hold)."""
import numpy as np
import pytest
from backends_under_test import DEVICES

import fnx
import fnx.numpy as jnp
import fnx.scipy.linalg as fl

sl = pytest.importorskip("scipy.linalg")
jax = pytest.importorskip("jax")
jl = pytest.importorskip("jax.scipy.linalg")


@pytest.mark.parametrize("name, args, kwargs", [
    ("block_diag", (np.float32(1), np.ones(2, np.int32), np.arange(4.0).reshape(2, 2)), {}),
    ("toeplitz", (np.array([1, 2, 3]), np.array([9, 4, 5, 6])), {}), ("toeplitz", (np.array([1.0, 2, 3]),), {}),
    ("circulant", (np.array([1, 2, 3, 7]),), {}), ("hankel", (np.array([1, 2, 3]), np.array([3, 4, 5, 6])), {}),
    ("hankel", (np.array([1.0, 2, 3]),), {}), ("hilbert", (5,), {}), ("pascal", (6,), {}),
    ("pascal", (6, "lower"), {}), ("pascal", (6, "upper"), {}),
    ("leslie", (np.array([1.0, 2, 3]), np.array([0.5, 0.6])), {}), ("companion", (np.array([2.0, 3, 5, 7]),), {}),
    ("fiedler", (np.array([1.0, 4, 2, -3]),), {}), ("helmert", (5,), {}), ("helmert", (5,), {"full": True}),
    ("hadamard", (8,), {})])
def test_special_matrices_match_scipy(name, args, kwargs):
    got, want = getattr(fl, name)(*args, **kwargs), getattr(sl, name)(*args, **kwargs)
    assert got.shape == want.shape
    np.testing.assert_allclose(np.asarray(got), want, rtol=1e-6, atol=1e-7)
    assert np.dtype(got.dtype) == np.dtype(getattr(jl, name)(*args, **kwargs).dtype)  # JAX's dtypes (x64 off)


def test_batched_toeplitz_matches_jax():
    c = np.arange(6.0, dtype=np.float32).reshape(2, 3)
    np.testing.assert_array_equal(np.asarray(fl.toeplitz(c)), np.asarray(jl.toeplitz(c)))


def test_decompositions_with_scipy_signatures(device):
    rng = np.random.default_rng(0)
    a = rng.standard_normal((4, 4)).astype(np.float32)
    s = a + a.T
    w, v = fl.eigh(s)
    np.testing.assert_allclose(np.asarray(w), np.linalg.eigvalsh(s.astype(np.float64)), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(np.asarray(v) * np.asarray(w) @ np.asarray(v).T, s, atol=1e-4)
    np.testing.assert_allclose(np.asarray(fl.eigh(np.triu(s), lower=False, eigvals_only=True)), np.asarray(w),
                               atol=1e-5)
    u, sv, vh = fl.svd(a)
    np.testing.assert_allclose((np.asarray(u) * np.asarray(sv)) @ np.asarray(vh), a, atol=1e-5)
    b = rng.standard_normal((5, 3)).astype(np.float32)
    for mode, shapes in (("full", [(5, 5), (5, 3)]), ("economic", [(5, 3), (3, 3)])):
        q, r = fl.qr(b, mode=mode)
        assert [q.shape, r.shape] == shapes
        np.testing.assert_allclose(np.asarray(q) @ np.asarray(r), b, atol=1e-5)
    (r,) = fl.qr(b, mode="r")
    assert r.shape == (5, 3)
    for side, x in (("right", b), ("left", b.T)):
        got, want = fl.polar(x, side=side), jl.polar(x, side=side)
        for g, w_ in zip(got, want): np.testing.assert_allclose(np.asarray(g), np.asarray(w_), atol=1e-4)


@pytest.mark.parametrize("scale", [0.01, 1.0, 5.0, 40.0])
def test_expm_against_scipy(device, scale):
    a = np.random.default_rng(1).standard_normal((4, 4)).astype(np.float32) * scale
    want = sl.expm(a.astype(np.float64))
    for got in (fl.expm(a), fnx.jit(fl.expm)(a)):  # (at scale 40: fnx 2.4e-6, JAX 2.3e-5; its pivots divide by
        assert np.abs(np.asarray(got) - want).max() <= 4e-6 * np.abs(want).max()  # reciprocals, docs/LOWERING.md)


def test_expm_float64_gradient_and_batch(x64):
    rng = np.random.default_rng(2)
    a = rng.standard_normal((5, 5)) * 0.7
    np.testing.assert_allclose(np.asarray(fl.expm(a)), sl.expm(a), rtol=1e-13, atol=1e-13)
    batch = rng.standard_normal((3, 4, 4))
    np.testing.assert_allclose(np.asarray(fl.expm(batch)), np.stack([sl.expm(m) for m in batch]), rtol=1e-12)
    # (under jit this program aborted the process: LLVM's X86 backend asserted on AVX2 on a uitofp of a compare's
    # <4 x i1>; bool -> float casts are now selects)
    np.testing.assert_allclose(np.asarray(fnx.jit(fl.expm)(batch)), np.stack([sl.expm(m) for m in batch]), rtol=1e-12)
    grad = np.asarray(fnx.grad(lambda m: jnp.sum(fl.expm(m)))(a))
    eps, numeric = 1e-6, np.zeros_like(a)
    for i in range(5):
        for j in range(5):
            e = np.zeros_like(a)
            e[i, j] = eps
            numeric[i, j] = (sl.expm(a + e).sum() - sl.expm(a - e).sum()) / (2 * eps)
    np.testing.assert_allclose(grad, numeric, rtol=1e-6, atol=1e-7)


# every size on interp and cpu; four on opencl, where each size's programs are built anew (4.5 s a size on PoCL)
SOLVE_SIZES = [(device, n) for device in DEVICES for n in range(1, 10) if device != "opencl" or n in (1, 2, 5, 9)]


@pytest.mark.parametrize("device, n", SOLVE_SIZES, indirect=["device"], ids=[f"{d}-{n}" for d, n in SOLVE_SIZES])
def test_float64_solve_every_small_size_under_jit(device, x64, n):
    a = np.random.default_rng(n).standard_normal((n, n)) + n * np.eye(n)
    b = np.random.default_rng(n + 100).standard_normal((n, 3))
    want = np.linalg.solve(a, b)
    # eagerly too, but on PoCL for two sizes only: there each eager op builds a program, 2.6 s a size
    eager = (jnp.linalg.solve(a, b),) if device != "opencl" or n in (1, 9) else ()
    for got in eager + (fnx.jit(jnp.linalg.solve)(a, b), fnx.jit(jnp.linalg.inv)(a) @ b):
        assert got.dtype == np.float64
        np.testing.assert_allclose(np.asarray(got), want, rtol=1e-10, atol=1e-12)


def test_bad_arguments():
    with pytest.raises(ValueError, match="power of 2"):
        fl.hadamard(6)
    with pytest.raises(ValueError, match="kind"):
        fl.pascal(3, "diagonal")
    with pytest.raises(NotImplementedError, match="b=None"):
        fl.eigh(np.eye(2), np.eye(2))
    with pytest.raises(fnx.errors.ShapeError, match="square"):
        fl.expm(np.ones((2, 3)))


@pytest.mark.parametrize("n", [1, 2, 3, 6, 9])
def test_hessenberg_matches_scipy(device, n):
    """LAPACK's reflection signs, so H and Q equal scipy's (float64, with x64 on), not only up to signs; float32
    under jit, batched, and Q H Q^T = a."""
    a = np.random.default_rng(n).standard_normal((n, n))
    want_h, want_q = sl.hessenberg(a, calc_q=True)
    with fnx.enable_x64():
        h, q = fl.hessenberg(a, calc_q=True)
        np.testing.assert_allclose(np.asarray(h), want_h, rtol=1e-10, atol=1e-12)
        np.testing.assert_allclose(np.asarray(q), want_q, rtol=1e-10, atol=1e-12)
        assert not np.tril(np.asarray(h), -2).any()  # exactly zero below the subdiagonal
    a32 = a.astype(np.float32)
    h32 = fnx.jit(fl.hessenberg)(a32)
    np.testing.assert_allclose(np.asarray(h32), want_h, rtol=1e-4, atol=1e-4 * n)
    batch = np.stack([a32, 2 * a32])
    hb, qb = fnx.vmap(lambda m: fl.hessenberg(m, calc_q=True))(batch)
    np.testing.assert_allclose(np.asarray(qb @ hb @ np.swapaxes(qb, -1, -2)), batch, rtol=1e-4, atol=1e-4 * n)
