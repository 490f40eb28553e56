"""Forward mode (jvp, linearize, jacfwd, hessian): every primitive's rule against finite differences, symbolic
zeros, pytrees, has_aux, higher orders, composition with jit and reverse mode."""
import numpy as np
import pytest
from check_grads import PRIMITIVE_CASES, check_grads
from hypothesis import given, strategies as st

import fnx
import fnx.numpy as jnp
from fnx import lax

pytestmark = pytest.mark.usefixtures("x64")  # float64 inputs and derivatives

rng = np.random.default_rng(2)
X3 = rng.uniform(0.5, 1.5, 3)
X34 = rng.standard_normal((3, 4))


@pytest.mark.parametrize("name,f,args,options", PRIMITIVE_CASES, ids=[c[0] for c in PRIMITIVE_CASES])
def test_primitive_jvp_matches_finite_differences(name, f, args, options):
    check_grads(f, args, order=2, modes=("fwd",), **options)


def test_primitive_jvp_and_vjp_agree():
    for name in ("DIV", "MAX", "PAD", "INDEX", "SCATTER(set)", "REDUCE(max)", "REDUCE(mul)"):
        _, f, args, options = next(c for c in PRIMITIVE_CASES if c[0] == name)
        check_grads(f, args, order=1, modes=("fwd", "rev"), **options)


def test_detach_has_zero_tangent():
    out, tangent = fnx.jvp(lambda x: lax.stop_gradient(x) * x, (X3,), (np.ones(3),))
    np.testing.assert_allclose(np.asarray(tangent), X3)
    np.testing.assert_array_equal(np.asarray(fnx.jvp(lax.stop_gradient, (X3,), (np.ones(3),))[1]), 0.0)


def test_jvp_values_against_closed_forms():
    out, tangent = fnx.jvp(lambda x, y: jnp.sin(x) * y, (X3, X3 + 1.0), (np.ones(3), np.full(3, 2.0)))
    np.testing.assert_allclose(np.asarray(out), np.sin(X3) * (X3 + 1.0), rtol=1e-12)
    np.testing.assert_allclose(np.asarray(tangent), np.cos(X3) * (X3 + 1.0) + 2.0 * np.sin(X3), rtol=1e-12)


def test_outputs_independent_of_the_input_get_zero_tangents():
    out, tangent = fnx.jvp(lambda x: (x * 2.0, jnp.ones(2), jnp.arange(3)), (X3,), (np.ones(3),))
    np.testing.assert_allclose(np.asarray(tangent[0]), 2.0)
    np.testing.assert_array_equal(np.asarray(tangent[1]), [0.0, 0.0])
    assert np.asarray(tangent[2]).shape == (3,) and np.all(np.asarray(tangent[2]) == 0)


def test_jvp_pytrees_and_has_aux():
    primals = ({"a": X3, "b": [X34]},)
    tangents = ({"a": np.ones(3), "b": [np.ones((3, 4))]},)
    out, tangent, aux = fnx.jvp(lambda p: ({"s": (p["a"] ** 2).sum(), "m": p["b"][0] * 2.0}, p["a"].max()),
                                primals, tangents, has_aux=True)
    np.testing.assert_allclose(float(tangent["s"]), 2 * X3.sum(), rtol=1e-12)
    np.testing.assert_allclose(np.asarray(tangent["m"]), 2.0)
    np.testing.assert_allclose(float(aux), X3.max())


def test_jvp_checks_its_arguments():
    with pytest.raises(TypeError):
        fnx.jvp(jnp.sin, (X3,), (np.ones(4),))
    with pytest.raises(TypeError):
        fnx.jvp(lambda x, y: x * y, (X3, X3), (np.ones(3),))


def test_integer_inputs_get_no_tangent():
    out, tangent = fnx.jvp(lambda x, i: x[i] * i, (X3, np.array([2, 0])), (np.ones(3), np.zeros(2, np.int64)))
    np.testing.assert_allclose(np.asarray(tangent), [2.0, 0.0])


def test_jvp_of_jvp_is_the_second_derivative():
    f = lambda x: jnp.sin(x) * x  # noqa: E731
    second = fnx.jvp(lambda x: fnx.jvp(f, (x,), (np.ones(3),))[1], (X3,), (np.ones(3),))[1]
    np.testing.assert_allclose(np.asarray(second), 2 * np.cos(X3) - X3 * np.sin(X3), rtol=1e-12)


def test_forward_over_reverse_and_reverse_over_forward():
    f = lambda x: (jnp.exp(x) * x[::-1]).sum()  # noqa: E731
    v = np.array([1.0, -2.0, 0.5])
    hvp_fwd = fnx.jvp(fnx.grad(f), (X3,), (v,))[1]
    hvp_rev = fnx.grad(lambda x: fnx.jvp(f, (x,), (v,))[1])(X3)
    hess = np.asarray(fnx.hessian(f)(X3))
    np.testing.assert_allclose(np.asarray(hvp_fwd), hess @ v, rtol=1e-10)
    np.testing.assert_allclose(np.asarray(hvp_rev), hess @ v, rtol=1e-10)


def test_jit_of_jvp_and_jvp_of_jit():
    f = lambda x, y: jnp.tanh(x @ y).sum(axis=0)  # noqa: E731
    y = rng.standard_normal((4, 2))
    eager = fnx.jvp(f, (X34, y), (np.ones((3, 4)), np.ones((4, 2))))
    jitted = fnx.jit(lambda x, y: fnx.jvp(f, (x, y), (np.ones((3, 4)), np.ones((4, 2)))))(X34, y)
    through = fnx.jvp(fnx.jit(f), (X34, y), (np.ones((3, 4)), np.ones((4, 2))))
    for a, b, c in zip(eager, jitted, through):
        np.testing.assert_allclose(np.asarray(b), np.asarray(a), rtol=1e-12)
        np.testing.assert_allclose(np.asarray(c), np.asarray(a), rtol=1e-12)


def test_linearize():
    f = lambda x: jnp.sin(x) * jnp.exp(x)  # noqa: E731
    out, f_jvp = fnx.linearize(f, X3)
    np.testing.assert_allclose(np.asarray(out), np.sin(X3) * np.exp(X3), rtol=1e-12)
    for t in (np.ones(3), np.array([0.5, -1.0, 2.0])):
        np.testing.assert_allclose(np.asarray(f_jvp(t)), np.asarray(fnx.jvp(f, (X3,), (t,))[1]), rtol=1e-12)
        np.testing.assert_allclose(np.asarray(f_jvp(t)), (np.cos(X3) + np.sin(X3)) * np.exp(X3) * t, rtol=1e-12)
    np.testing.assert_allclose(np.asarray(f_jvp(2 * np.ones(3))), 2 * np.asarray(f_jvp(np.ones(3))), rtol=1e-12)


def test_jacfwd_has_aux():
    jac, aux = fnx.jacfwd(lambda x: (x * x, x.sum()), has_aux=True)(X3)
    np.testing.assert_allclose(np.asarray(jac), np.diag(2 * X3))
    np.testing.assert_allclose(float(aux), X3.sum())


def test_hessian_with_argnums():
    f = lambda x, y: (x * x * y).sum()  # noqa: E731
    h = fnx.hessian(f, argnums=1)(X3, X3 + 1.0)
    np.testing.assert_array_equal(np.asarray(h), np.zeros((3, 3)))
    h = fnx.hessian(f)(X3, X3 + 1.0)
    np.testing.assert_allclose(np.asarray(h), np.diag(2 * (X3 + 1.0)))


@given(st.lists(st.floats(-2, 2), min_size=3, max_size=3), st.lists(st.floats(-2, 2), min_size=3, max_size=3))
def test_jvp_is_linear_in_the_tangent(t1, t2):
    f = lambda x: jnp.sin(x) * x.sum()  # noqa: E731
    a, b = (fnx.jvp(f, (X3,), (np.array(t),))[1] for t in (t1, t2))
    both = fnx.jvp(f, (X3,), (np.array(t1) + np.array(t2),))[1]
    np.testing.assert_allclose(np.asarray(both), np.asarray(a) + np.asarray(b), rtol=1e-10, atol=1e-12)
