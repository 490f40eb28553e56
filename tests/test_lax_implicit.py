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
