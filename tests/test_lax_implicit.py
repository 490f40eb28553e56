"""lax.custom_root (implicit-function-theorem derivatives of any solver) and closure_convert, against jax.lax and
the analytic derivatives."""
import numpy as np
import pytest

import fnx
import fnx.numpy as jnp
from fnx import lax

jax = pytest.importorskip("jax")


def _newton(f, x):  # a Python loop: a solver fnx never differentiates
    for _ in range(30):
        x = x - f(x) / (2.0 * x)  # (f = x*x - a: f' = 2x)
    return x


def _sqrt(lib):
    return lambda a: lib.lax.custom_root(lambda x: x * x - a, 1.0, _newton, lambda g, y: y / g(1.0))


def test_scalar_root_derivatives_match_jax_and_the_formula():
    ours, theirs = _sqrt(fnx), _sqrt(jax)
    np.testing.assert_allclose(float(ours(2.0)), np.sqrt(2), rtol=1e-6)
    np.testing.assert_allclose(float(fnx.grad(ours)(2.0)), 0.5 / np.sqrt(2), rtol=1e-6)
    np.testing.assert_allclose(float(fnx.grad(fnx.grad(ours))(2.0)), float(jax.grad(jax.grad(theirs))(2.0)),
                               rtol=1e-5)
    np.testing.assert_allclose(float(fnx.jit(fnx.grad(ours))(3.0)), float(jax.grad(theirs)(3.0)), rtol=1e-6)
    np.testing.assert_allclose(float(fnx.jvp(ours, (2.0,), (3.0,))[1]), 1.5 / np.sqrt(2), rtol=1e-6)
    a = np.array([1.0, 4.0, 9.0], np.float32)
    np.testing.assert_allclose(np.asarray(fnx.vmap(fnx.grad(ours))(a)), 0.5 / np.sqrt(a), rtol=1e-6)


def _linear_root(lib):
    """x with A(p) x = b(p): the solver is linalg.solve, the derivative comes from tangent_solve."""
    np_ = lib.numpy

    def loss(p):
        a = p["m"] @ p["m"].T + 4 * np_.eye(3)
        f = lambda x: a @ x - np_.tanh(p["b"])  # noqa: E731
        solve = lambda f, x0: np_.linalg.solve(a, np_.tanh(p["b"]))  # noqa: E731
        tangent_solve = lambda g, y: np_.linalg.solve(lib.jacobian(g)(y), y)  # noqa: E731
        x = lib.lax.custom_root(f, np_.zeros(3), solve, tangent_solve)
        return (x ** 2).sum()
    return loss


def test_vector_root_closing_over_parameters_matches_jax():
    rng = np.random.default_rng(0)
    p = {"m": rng.standard_normal((3, 3)).astype(np.float32), "b": rng.standard_normal(3).astype(np.float32)}
    ours = fnx.grad(_linear_root(fnx))(p)
    theirs = jax.grad(_linear_root(jax))(p)
    for k in p: np.testing.assert_allclose(np.asarray(ours[k]), theirs[k], rtol=1e-4, atol=1e-6)


def test_solver_with_a_while_loop_under_jit_and_aux():
    """The solver iterates in a while_loop (which reverse mode could not go through) and returns aux."""
    def solve(f, x0):
        def body(state):
            x, i = state
            return x - f(x) / (2.0 * x), i + 1
        return lax.while_loop(lambda s: (jnp.abs(f(s[0])) > 1e-6) & (s[1] < 50), body, (x0, 0))

    def root(a):
        x, iterations = lax.custom_root(lambda x: x * x - a, 1.0, solve, lambda g, y: y / g(1.0), has_aux=True)
        return x, iterations
    value, grad = fnx.jit(fnx.value_and_grad(lambda a: root(a)[0]))(5.0)
    np.testing.assert_allclose([float(value), float(grad)], [np.sqrt(5), 0.5 / np.sqrt(5)], rtol=1e-6)
    assert 1 < int(root(5.0)[1]) < 50


def test_closure_convert_makes_enclosing_values_arguments():
    def outer(a):
        f, consts = fnx.closure_convert(lambda x: jnp.sin(x * a) + w, 2.0)
        assert len(consts) == 1  # a (the concrete w stays a constant)
        assert float(f(2.0, *consts)) == pytest.approx(float(jnp.sin(2.0 * a) + w))
        with pytest.raises(TypeError, match="consts"):
            f(2.0)
        return f(2.0, *consts)
    w = np.float32(0.5)
    np.testing.assert_allclose(float(fnx.grad(outer)(3.0)), 2 * np.cos(6.0), rtol=1e-5)
    f, consts = fnx.closure_convert(lambda x: x * 2, 1.0)  # outside any trace: nothing to convert
    assert consts == [] and float(f(3.0)) == 6.0


def _solve_loss(lib, symmetric):
    np_ = lib.numpy

    def loss(p, b):
        a = p @ p.T + 3 * np_.eye(3)
        x = lib.lax.custom_linear_solve(
            lambda v: a @ v, b, lambda mv, r: np_.linalg.solve(a, r),
            transpose_solve=None if symmetric else (lambda vm, r: np_.linalg.solve(a.T, r)), symmetric=symmetric)
        return (x ** 3).sum()
    return loss


@pytest.mark.parametrize("symmetric", [True, False])
def test_custom_linear_solve_gradients_match_jax(symmetric):
    rng = np.random.default_rng(1)
    p, b = rng.standard_normal((3, 3)).astype(np.float32), rng.standard_normal(3).astype(np.float32)
    want = jax.grad(_solve_loss(jax, symmetric), argnums=(0, 1))(p, b)
    for got in (fnx.grad(_solve_loss(fnx, symmetric), argnums=(0, 1))(p, b),
                fnx.jit(fnx.grad(_solve_loss(fnx, symmetric), argnums=(0, 1)))(p, b)):
        for g, w in zip(got, want): np.testing.assert_allclose(np.asarray(g), w, rtol=1e-4, atol=1e-6)
    np.testing.assert_allclose(float(_solve_loss(fnx, symmetric)(p, b)), float(_solve_loss(jax, symmetric)(p, b)),
                               rtol=1e-5)


def test_custom_linear_solve_through_a_while_loop_solver_and_its_errors():
    """Conjugate gradients in a while_loop (no reverse rule through its iterations): the gradient comes from the
    transposed solve, equal to the one through a direct solve."""
    rng = np.random.default_rng(2)
    m = rng.standard_normal((4, 4)).astype(np.float32)
    b = rng.standard_normal(4).astype(np.float32)

    def cg(matvec, r):
        def body(state):
            x, res, d, k = state
            ad = matvec(d)
            alpha = (res @ res) / (d @ ad)
            x, new = x + alpha * d, res - alpha * ad
            return x, new, new + (new @ new) / (res @ res) * d, k + 1
        x, *_ = lax.while_loop(lambda s: (s[3] < 20) & (jnp.sqrt(s[1] @ s[1]) > 1e-7), body,
                               (jnp.zeros_like(r), r, r, 0))
        return x

    def loss(p, solver):
        a = p @ p.T + 4 * jnp.eye(4)
        x = lax.custom_linear_solve(lambda v: a @ v, b, solver, symmetric=True, has_aux=False)
        return jnp.sum(jnp.sin(x))
    direct = fnx.grad(lambda p: jnp.sum(jnp.sin(jnp.linalg.solve(p @ p.T + 4 * jnp.eye(4), b))))(m)
    np.testing.assert_allclose(np.asarray(fnx.grad(loss)(m, cg)), np.asarray(direct), rtol=1e-3, atol=1e-5)
    def with_aux(lib):  # solve (and so the transposed solve) returns aux, which gets no derivative
        def f(s):
            x, aux = lib.lax.custom_linear_solve(lambda u: u * s, b, lambda mv, r: (r / s, lib.numpy.int32(7)),
                                                 symmetric=True, has_aux=True)
            return (x ** 2).sum(), aux
        return f
    (g, aux), (jg, jaux) = fnx.grad(with_aux(fnx), has_aux=True)(2.0), jax.grad(with_aux(jax), has_aux=True)(2.0)
    np.testing.assert_allclose(float(g), float(jg), rtol=1e-6)
    assert int(aux) == int(jaux) == 7
    with pytest.raises(fnx.errors.UnsupportedError, match="transpose_solve"):
        fnx.grad(lambda v: lax.custom_linear_solve(lambda u: u * 2.0, v, lambda mv, r: r / 2.0).sum())(b)
    with pytest.raises(TypeError, match="forward-mode"):
        fnx.jvp(lambda v: lax.custom_linear_solve(lambda u: u * 2.0, v, lambda mv, r: r / 2.0, symmetric=True),
                (b,), (b,))
