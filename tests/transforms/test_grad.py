"""Reverse mode (vjp, grad, value_and_grad, jacrev): every primitive's rule against finite differences, the rule
tables, argnums / has_aux / pytrees, higher orders, composition with jit, control flow, gather as scatter-add,
ties, Jacobians and Hessians."""
from collections import namedtuple

import numpy as np
import pytest
from check_grads import PRIMITIVE_CASES, check_grads, numerical_jvp
from hypothesis import given, strategies as st

import fnx
import fnx.numpy as jnp
from fnx import lax, tree_util
from fnx.errors import ConcretizationError
from fnx.transforms.grad import vjp_rules
from fnx.transforms.jvp import jvp_rules
from fnx.uop import GroupOp, Ops

pytestmark = pytest.mark.usefixtures("x64")  # float64 inputs and derivatives

rng = np.random.default_rng(1)
X3 = rng.uniform(0.5, 1.5, 3)
X34 = rng.standard_normal((3, 4))


# ---- every primitive ----

def test_every_primitive_has_a_rule_in_both_tables():
    call_ops = {Ops.FUNCTION, Ops.TUPLE, Ops.GETTUPLE}  # the graph's structure, read by the traversal itself
    assert call_ops | {Ops.CALL} == GroupOp.Call
    missing_vjp = sorted(op.name for op in GroupOp.Primitives - call_ops if op not in vjp_rules)
    missing_jvp = sorted(op.name for op in GroupOp.Primitives - call_ops if op not in jvp_rules)
    assert not missing_vjp and not missing_jvp, f"no vjp rule: {missing_vjp}; no jvp rule: {missing_jvp}"
    assert not (set(vjp_rules) | set(jvp_rules)) - GroupOp.Primitives, "rules for ops that are not primitives"


def test_the_primitive_cases_cover_every_float_primitive():
    names = {name.split("(")[0] for name, *_ in PRIMITIVE_CASES}
    float_ops = GroupOp.Primitives - GroupOp.Source - GroupOp.Call - GroupOp.Comparison - {
        Ops.AND, Ops.OR, Ops.XOR, Ops.SHL, Ops.SHR, Ops.BITCAST, Ops.COPY, Ops.DETACH,  # DETACH: its own test
        Ops.WHILE}  # WHILE: forward mode only (reverse mode raises, as in JAX); tested in test_control_flow
    assert {op.name for op in float_ops} <= names


@pytest.mark.parametrize("name,f,args,options", PRIMITIVE_CASES, ids=[c[0] for c in PRIMITIVE_CASES])
def test_primitive_vjp_matches_finite_differences(name, f, args, options):
    check_grads(f, args, order=2, modes=("rev",), **options)


def test_primitive_vjp_on_the_interpreter(device):
    for name in ("MUL", "SIN", "INDEX", "SCATTER(add)", "REDUCE(mul)"):
        _, f, args, options = next(c for c in PRIMITIVE_CASES if c[0] == name)
        check_grads(f, args, order=1, modes=("rev",), **options)


@pytest.mark.parametrize("modes", [("rev",), ("fwd",), ("fwd", "rev")])
def test_check_grads_catches_a_wrong_rule(monkeypatch, modes):
    monkeypatch.setitem(vjp_rules, Ops.EXP2, lambda g, u, x: (g * 0.69,))        # the true factor is ln 2 * 2**x
    monkeypatch.setitem(jvp_rules, Ops.EXP2, lambda u, srcs, tans: tans[0] * 0.69)
    with pytest.raises(AssertionError):
        check_grads(lax.exp2, (X3,), order=1, modes=modes)


def test_detach_has_zero_gradient():
    g = fnx.grad(lambda x: (lax.stop_gradient(x) * x).sum())(X3)
    np.testing.assert_allclose(np.asarray(g), X3)
    np.testing.assert_array_equal(np.asarray(fnx.grad(lambda x: lax.stop_gradient(x).sum())(X3)), 0.0)


# ---- integer and bool values carry no gradient ----

def test_integer_and_bool_intermediates_give_zero_gradient():
    def f(x):
        as_int = lax.convert_element_type(x * 10, np.int32)
        mixed = lax.bitwise_xor(as_int, 3) + lax.shift_left(as_int, 1)
        flags = (x > 1.0) & (x < 1.4)
        return (lax.convert_element_type(mixed, np.float64) + flags.astype(np.float64) + jnp.argmax(x)).sum()
    np.testing.assert_array_equal(np.asarray(fnx.grad(f)(X3)), np.zeros(3))
    np.testing.assert_array_equal(np.asarray(fnx.jvp(f, (X3,), (np.ones(3),))[1]), 0.0)


def test_vjp_gives_zeros_for_integer_inputs():
    out, pullback = fnx.vjp(lambda x, i: x[i] * 2.0, X3, np.array([2, 0]))
    gx, gi = pullback(np.ones(2))
    np.testing.assert_allclose(np.asarray(gx), [2.0, 0.0, 2.0])
    assert np.asarray(gi).dtype.kind == "i" and np.all(np.asarray(gi) == 0)


def test_grad_with_respect_to_an_integer_input_raises():
    with pytest.raises(TypeError, match="float"):
        fnx.grad(lambda x: (x * 2.0).sum())(np.arange(3))
    with pytest.raises(TypeError, match="float"):
        fnx.grad(lambda x, i: (x * i).sum(), argnums=(0, 1))(X3, np.arange(3))
    np.testing.assert_allclose(np.asarray(fnx.grad(lambda x, i: (x * i).sum())(X3, np.arange(3))), [0, 1, 2])


def test_grad_of_a_non_scalar_output_raises():
    with pytest.raises(TypeError, match="scalar"):
        fnx.grad(lambda x: x * 2.0)(X3)
    with pytest.raises(TypeError, match="scalar"):
        fnx.grad(lambda x: (x.sum(), x.sum()))(X3)
    with pytest.raises(TypeError, match="scalar"):
        fnx.grad(lambda x: jnp.argmax(x))(X3)


# ---- argnums, has_aux, pytrees ----

def f_xyz(x, y, z):
    return (jnp.sin(x) * y + z * z * y).sum()


@pytest.mark.parametrize("argnums,expected", [
    (0, "x"), (1, "y"), (-1, "z"), ((0, 2), ("x", "z")), ((2, 0), ("z", "x")), ((-3, -2, -1), ("x", "y", "z"))])
def test_argnums(argnums, expected):
    x, y, z = X3, X3 + 1.0, X3 * 2.0
    closed = {"x": np.cos(x) * y, "y": np.sin(x) + z * z, "z": 2 * z * y}
    g = fnx.grad(f_xyz, argnums=argnums)(x, y, z)
    if isinstance(expected, str):
        np.testing.assert_allclose(np.asarray(g), closed[expected], rtol=1e-12)
    else:
        assert isinstance(g, tuple) and len(g) == len(expected)
        for gi, name in zip(g, expected):
            np.testing.assert_allclose(np.asarray(gi), closed[name], rtol=1e-12)


def test_argnums_out_of_range_raises():
    with pytest.raises(ValueError, match="argnums"):
        fnx.grad(f_xyz, argnums=3)(X3, X3, X3)


def test_value_and_grad_and_has_aux():
    def loss(x):
        return (x ** 2).sum(), {"mean": x.mean(), "count": 3}
    (value, aux), g = fnx.value_and_grad(loss, has_aux=True)(X3)
    np.testing.assert_allclose(float(value), (X3 ** 2).sum())
    np.testing.assert_allclose(float(aux["mean"]), X3.mean())
    np.testing.assert_allclose(np.asarray(g), 2 * X3)
    g2, aux2 = fnx.grad(loss, has_aux=True)(X3)
    np.testing.assert_allclose(np.asarray(g2), 2 * X3)
    np.testing.assert_allclose(float(aux2["mean"]), X3.mean())
    out, pullback, aux3 = fnx.vjp(lambda x: (x * 3.0, x.sum()), X3, has_aux=True)
    np.testing.assert_allclose(np.asarray(pullback(np.ones(3))[0]), 3.0)
    np.testing.assert_allclose(float(aux3), X3.sum())
    with pytest.raises(TypeError):
        fnx.grad(lambda x: (x.sum(), x.sum(), x.sum()), has_aux=True)(X3)


Point = namedtuple("Point", ["a", "b"])


def test_pytrees_in_and_out():
    params = {"w": X34, "layers": [X3, (X3 * 2.0, Point(a=X3[:2], b=np.float64(0.5)))]}

    def loss(p):
        a, b = p["layers"][1][1]
        return (p["w"] ** 2).sum() + (p["layers"][0] * p["layers"][1][0]).sum() + (a * b).sum()
    g = fnx.grad(loss)(params)
    assert fnx.tree_util.tree_structure(g) == fnx.tree_util.tree_structure(params)
    assert isinstance(g["layers"][1][1], Point)
    np.testing.assert_allclose(np.asarray(g["w"]), 2 * X34)
    np.testing.assert_allclose(np.asarray(g["layers"][0]), 2 * X3)
    np.testing.assert_allclose(np.asarray(g["layers"][1][0]), X3)
    np.testing.assert_allclose(np.asarray(g["layers"][1][1].a), 0.5)
    np.testing.assert_allclose(float(g["layers"][1][1].b), X3[:2].sum())

    def f(p):
        return {"sum": p.a + p.b, "pair": [p.a * p.b, Point(a=p.a, b=jnp.sin(p.b))]}
    check_grads(f, (Point(a=X3, b=X3 + 1.0),), order=1)


def test_vjp_checks_the_cotangent():
    _, pullback = fnx.vjp(lambda x: (x, x.sum()), X3)
    with pytest.raises(TypeError):
        pullback(np.ones(3))
    with pytest.raises(TypeError):
        pullback((np.ones(4), 1.0))


# ---- higher order ----

def test_third_order_against_closed_forms():
    x = np.float64(0.7)
    np.testing.assert_allclose(float(fnx.grad(fnx.grad(fnx.grad(lambda x: x ** 4)))(x)), 24 * x, rtol=1e-12)
    np.testing.assert_allclose(float(fnx.grad(fnx.grad(fnx.grad(jnp.sin)))(x)), -np.cos(x), rtol=1e-12)
    np.testing.assert_allclose(float(fnx.grad(fnx.grad(fnx.grad(jnp.exp)))(x)), np.exp(x), rtol=1e-12)
    np.testing.assert_allclose(float(fnx.grad(fnx.grad(fnx.grad(lambda x: 1 / x)))(x)), -6 / x ** 4, rtol=1e-12)


def test_grad_of_grad_with_several_arguments():
    def f(x, y):
        return (x * x * y + jnp.sin(x * y)).sum()
    x, y = X3, X3[::-1].copy()
    mixed = fnx.grad(lambda y: fnx.grad(f)(x, y).sum())(y)  # d/dy sum_i df/dx_i
    np.testing.assert_allclose(np.asarray(mixed), 2 * x + np.cos(x * y) - x * y * np.sin(x * y), rtol=1e-12)


# ---- composition with jit ----

def mlp_loss(params, x):
    h = jnp.tanh(x @ params["w1"] + params["b1"])
    return ((h @ params["w2"]) ** 2).mean()


MLP = {"w1": rng.standard_normal((4, 5)) * 0.5, "b1": rng.standard_normal(5) * 0.1,
       "w2": rng.standard_normal((5, 2)) * 0.5}


def test_jit_of_grad_equals_grad():
    eager = fnx.grad(mlp_loss)(MLP, X34)
    jitted = fnx.jit(fnx.grad(mlp_loss))(MLP, X34)
    for k in MLP:
        np.testing.assert_allclose(np.asarray(jitted[k]), np.asarray(eager[k]), rtol=1e-12)


def test_grad_of_jit_equals_grad():
    eager = fnx.grad(mlp_loss)(MLP, X34)
    through = fnx.grad(fnx.jit(mlp_loss))(MLP, X34)
    for k in MLP:
        np.testing.assert_allclose(np.asarray(through[k]), np.asarray(eager[k]), rtol=1e-12)


def test_vjp_fn_can_be_jitted():
    out, pullback = fnx.vjp(lambda x: jnp.sin(x) * x, X34)
    ct = rng.standard_normal((3, 4))
    np.testing.assert_allclose(np.asarray(fnx.jit(pullback)(ct)[0]), np.asarray(pullback(ct)[0]), rtol=1e-12)
    np.testing.assert_allclose(np.asarray(pullback(ct)[0]), ct * (np.cos(X34) * X34 + np.sin(X34)), rtol=1e-12)


def test_a_pullback_of_host_primals_called_twice_and_jitted():
    """vjp of a Python float and a numpy array: the pullback, called with two cotangents, eagerly and under jit,
    gives the exact derivatives each time (the pullback reuses what inlining the forward pass built)."""
    y = rng.standard_normal(5)
    f = lambda x, y: jnp.sin(x) * y + x ** 2 * jnp.exp(y)  # noqa: E731
    out, pullback = fnx.vjp(f, 0.7, y)
    np.testing.assert_allclose(np.asarray(out), np.sin(0.7) * y + 0.49 * np.exp(y), rtol=1e-12)
    for ct in (np.ones(5), rng.standard_normal(5)):
        for gx, gy in (pullback(ct), fnx.jit(pullback)(ct)):
            np.testing.assert_allclose(float(gx), (ct * (np.cos(0.7) * y + 1.4 * np.exp(y))).sum(), rtol=1e-12)
            np.testing.assert_allclose(np.asarray(gy), ct * (np.sin(0.7) + 0.49 * np.exp(y)), rtol=1e-12)


def branchy(x):
    if x.sum() > 0:
        return (x * x).sum()
    return -x.sum()


def test_python_control_flow_on_values_inside_grad():
    np.testing.assert_allclose(np.asarray(fnx.grad(branchy)(X3)), 2 * X3)
    np.testing.assert_allclose(np.asarray(fnx.grad(branchy)(-X3)), -np.ones(3))


def test_python_control_flow_on_values_inside_jit_raises():
    with pytest.raises(ConcretizationError):
        fnx.jit(fnx.grad(branchy))(X3)


def test_closed_over_arrays_are_constants():
    c = jnp.asarray(X3 * 2.0)
    g = fnx.grad(lambda x: (x * c + c * c).sum())(X3)
    np.testing.assert_allclose(np.asarray(g), X3 * 2.0)
    np.testing.assert_allclose(np.asarray(fnx.jit(fnx.grad(lambda x: (x * c * c).sum()))(X3)), 4 * X3 ** 2)
    gx, gc = fnx.grad(lambda x, c: (x * c).sum(), argnums=(0, 1))(X3, c)  # the same array as an argument does
    np.testing.assert_allclose(np.asarray(gc), X3)


# ---- gather's cotangent is a scatter-add ----

def test_gather_gradient_is_a_scatter_add_without_a_dense_intermediate():
    rows, idx = 37, np.array([3, 1, 3, 30, 0])
    x = rng.standard_normal((rows, 3))
    graph = fnx.make_graph(fnx.grad(lambda x: (x[idx] * x[idx]).sum()))(x)
    nodes = [u for u in graph.fn.toposort if u.shape is not None]
    assert any(u.op is Ops.SCATTER and u.arg.mode == "add" for u in nodes), str(graph)
    too_big = [u for u in nodes if u.size >= rows * len(idx)]
    assert not too_big, f"a (rows x indices) intermediate: {too_big}\n{graph}"
    expected = np.zeros_like(x)
    np.add.at(expected, idx, 2 * x[idx])
    np.testing.assert_allclose(np.asarray(fnx.grad(lambda x: (x[idx] * x[idx]).sum())(x)), expected, rtol=1e-12)


# ---- ties split the cotangent as in JAX ----

def test_maximum_and_minimum_ties_split_half_half():
    x = np.array([1.0, 2.0, 3.0])
    y = np.array([1.0, 0.0, 5.0])
    gx, gy = fnx.grad(lambda x, y: jnp.maximum(x, y).sum(), argnums=(0, 1))(x, y)
    np.testing.assert_allclose(np.asarray(gx), [0.5, 1.0, 0.0])
    np.testing.assert_allclose(np.asarray(gy), [0.5, 0.0, 1.0])
    gx, gy = fnx.grad(lambda x, y: jnp.minimum(x, y).sum(), argnums=(0, 1))(x, y)
    np.testing.assert_allclose(np.asarray(gx), [0.5, 0.0, 1.0])
    np.testing.assert_allclose(np.asarray(gy), [0.5, 1.0, 0.0])
    tx = fnx.jvp(lambda x, y: jnp.maximum(x, y), (x, y), (np.ones(3), np.zeros(3)))[1]
    np.testing.assert_allclose(np.asarray(tx), [0.5, 1.0, 0.0])


def test_max_reduction_ties_share_the_cotangent():
    x = np.array([[1.0, 3.0, 3.0], [2.0, 2.0, 2.0]])
    np.testing.assert_allclose(np.asarray(fnx.grad(lambda x: jnp.max(x, axis=1).sum())(x)),
                               [[0, 0.5, 0.5], [1 / 3, 1 / 3, 1 / 3]])
    np.testing.assert_allclose(np.asarray(fnx.grad(lambda x: jnp.min(x))(x)), [[1.0, 0, 0], [0, 0, 0]])
    np.testing.assert_allclose(np.asarray(fnx.grad(lambda x: jnp.max(x))(x)), [[0, 0.5, 0.5], [0, 0, 0]])


# ---- Jacobians and Hessians ----

def vector_fn(x):
    return jnp.stack([jnp.sin(x[0]) * x[1], x[1] * x[2] ** 2, jnp.exp(x[0] - x[2]), x.sum()])


def numerical_jacobian(f, x, eps=1e-5):
    columns = [numerical_jvp(f, (x,), (np.eye(x.size)[k].reshape(x.shape),), eps) for k in range(x.size)]
    return np.stack([np.asarray(c) for c in columns], axis=-1).reshape(np.shape(f(x)) + x.shape)


def test_jacrev_jacfwd_shapes_and_values():
    jr, jf = fnx.jacrev(vector_fn)(X3), fnx.jacfwd(vector_fn)(X3)
    assert jr.shape == jf.shape == (4, 3)
    np.testing.assert_allclose(np.asarray(jr), numerical_jacobian(vector_fn, X3), rtol=1e-6, atol=1e-8)
    np.testing.assert_allclose(np.asarray(jr), np.asarray(jf), rtol=1e-12)


def test_jacobian_of_matrix_to_matrix():
    f = lambda a: jnp.tanh(a) @ a.T  # noqa: E731
    a = X34[:2]
    jr, jf = fnx.jacrev(f)(a), fnx.jacfwd(f)(a)
    assert jr.shape == jf.shape == (2, 2, 2, 4)
    np.testing.assert_allclose(np.asarray(jr), numerical_jacobian(f, a), rtol=1e-6, atol=1e-8)
    np.testing.assert_allclose(np.asarray(jf), np.asarray(jr), rtol=1e-12)


def test_jacobians_with_argnums_and_pytree_outputs():
    f = lambda x, y: {"p": x * y, "s": (x * x).sum() + y[0]}  # noqa: E731
    for jac in (fnx.jacrev, fnx.jacfwd):
        j = jac(f, argnums=(0, 1))(X3, X3 + 1.0)
        assert j["p"][0].shape == (3, 3) and j["s"][1].shape == (3,)
        np.testing.assert_allclose(np.asarray(j["p"][0]), np.diag(X3 + 1.0))
        np.testing.assert_allclose(np.asarray(j["p"][1]), np.diag(X3))
        np.testing.assert_allclose(np.asarray(j["s"][0]), 2 * X3)
        np.testing.assert_allclose(np.asarray(j["s"][1]), [1.0, 0.0, 0.0])


def test_hessian_against_finite_differences_and_jacobians():
    f = lambda x: (jnp.sin(x) * x[::-1]).sum() + (x ** 3).prod()  # noqa: E731
    h = np.asarray(fnx.hessian(f)(X3))
    assert h.shape == (3, 3)
    np.testing.assert_allclose(h, h.T, rtol=1e-10)
    np.testing.assert_allclose(h, numerical_jacobian(fnx.grad(f), X3), rtol=1e-6, atol=1e-8)
    np.testing.assert_allclose(h, np.asarray(fnx.jacrev(fnx.grad(f))(X3)), rtol=1e-10)
    np.testing.assert_allclose(h, np.asarray(fnx.jacfwd(fnx.jacfwd(f))(X3)), rtol=1e-10)
    assert fnx.hessian(lambda m: (m ** 3).sum())(X34[:2]).shape == (2, 4, 2, 4)


# ---- values, dtypes and random points ----

def test_gradient_dtype_follows_the_input():
    assert np.asarray(fnx.grad(lambda x: (x * x).sum())(X3.astype(np.float32))).dtype == np.float32
    assert np.asarray(fnx.grad(lambda x: (x * x).sum())(X3)).dtype == np.float64
    with fnx.enable_x64(False):  # x64 off (the default): float64 inputs become float32, as in JAX
        assert np.asarray(fnx.grad(lambda x: (x * x).sum())(X3)).dtype == np.float32


@given(st.lists(st.floats(-3, 3), min_size=4, max_size=4))
def test_grad_of_a_polynomial_at_random_points(values):
    x = np.array(values)
    g = fnx.grad(lambda x: (x ** 3 - 2 * x * x + x).sum())(x)
    np.testing.assert_allclose(np.asarray(g), 3 * x ** 2 - 4 * x + 1, rtol=1e-12, atol=1e-12)


def test_jacobians_of_python_scalars_and_mixed_pytrees_match_jax():
    jax = pytest.importorskip("jax")
    assert float(fnx.jacfwd(lambda x: x ** 3)(2.0)) == 12.0 and float(fnx.jacrev(lambda x: x ** 3)(2.0)) == 12.0
    params = {"a": np.arange(3.0, dtype=np.float32), "b": np.ones((2, 2), np.float32)}

    def f(np_):
        return lambda p: {"o": np_.sin(p["a"]).sum() * p["b"], "q": (p["a"] * 2, p["b"].T @ p["b"])}
    for ours_fn, theirs_fn in ((fnx.jacfwd, jax.jacfwd), (fnx.jacrev, jax.jacrev), (fnx.hessian, jax.hessian)):
        if ours_fn is fnx.hessian:
            ours, theirs = ours_fn(lambda p: (f(jnp)(p)["o"] ** 2).sum())(params), theirs_fn(
                lambda p: (f(jax.numpy)(p)["o"] ** 2).sum())(params)
        else:
            ours, theirs = ours_fn(f(jnp))(params), theirs_fn(f(jax.numpy))(params)
        assert tree_util.tree_structure(ours) == tree_util.tree_structure(
            jax.tree_util.tree_map(np.asarray, theirs))
        for a, b in zip(tree_util.tree_leaves(ours), jax.tree_util.tree_leaves(theirs)):
            np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=1e-6)


def test_jax_options_of_grad_and_jacobians():
    jax = pytest.importorskip("jax")
    f = lambda x: ((x ** 3).sum(), x * 2)  # noqa: E731
    ours, theirs = fnx.hessian(f, has_aux=True)(np.arange(3.0)), jax.hessian(f, has_aux=True)(np.arange(3.0))
    np.testing.assert_allclose(np.asarray(ours[0]), np.asarray(theirs[0]))
    np.testing.assert_allclose(np.asarray(ours[1]), np.asarray(theirs[1]))
    assert float(fnx.grad(lambda x: x ** 2, holomorphic=False, allow_int=False)(3.0)) == 6.0
    with pytest.raises(NotImplementedError, match="allow_int=True"):
        fnx.jacrev(jnp.sin, allow_int=True)


def test_grad_allow_int_gives_float0_zeros_as_jax():
    jax = pytest.importorskip("jax")
    params = {"w": np.arange(3, dtype=np.float32), "n": np.arange(3, dtype=np.int32), "on": np.array(True)}
    loss = lambda p, k: (p["w"] * p["n"] * k).sum() * p["on"]  # noqa: E731
    for transform in (fnx.grad, fnx.value_and_grad):
        ours = transform(loss, argnums=(0, 1), allow_int=True)(params, 2)
        theirs = getattr(jax, transform.__name__)(loss, argnums=(0, 1), allow_int=True)(params, 2)
        ours, theirs = (ours[1], theirs[1]) if transform is fnx.value_and_grad else (ours, theirs)
        np.testing.assert_allclose(np.asarray(ours[0]["w"]), theirs[0]["w"])
        for got, want in ((ours[0]["n"], theirs[0]["n"]), (ours[0]["on"], theirs[0]["on"]), (ours[1], theirs[1])):
            assert isinstance(got, np.ndarray) and got.dtype == want.dtype == fnx.float0 and got.shape == want.shape
    with pytest.raises(TypeError, match="real-valued"):  # without allow_int, as in JAX
        fnx.grad(loss, argnums=(0, 1))(params, 2)
