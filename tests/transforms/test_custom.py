"""custom_jvp, custom_vjp, checkpoint/remat and stop_gradient: the user's rules are the ones used, in both
modes, under jit and at higher order; checkpoint gives the same gradients and recomputes its body."""
import numpy as np
import pytest
from check_grads import check_grads

import fnx
import fnx.numpy as jnp
from fnx import lax
from fnx.uop import Ops

pytestmark = pytest.mark.usefixtures("x64")  # float64 inputs and derivatives

rng = np.random.default_rng(3)
X3 = rng.uniform(0.5, 1.5, 3)
X8 = np.linspace(0.1, 1.0, 8)


# ---- custom_jvp ----

@fnx.custom_jvp
def scaled(x):
    return x * 2.0


@scaled.defjvp
def scaled_jvp(primals, tangents):  # deliberately not the true derivative, so the test sees which rule ran
    (x,), (t,) = primals, tangents
    return scaled(x), t * 3.0


@fnx.custom_jvp
def softplus(x):
    return jnp.log1p(jnp.exp(x))


@softplus.defjvp
def softplus_jvp(primals, tangents):
    (x,), (t,) = primals, tangents
    return softplus(x), t / (1.0 + jnp.exp(-x))


@fnx.custom_jvp
def my_sin(x):
    return jnp.sin(x)


@my_sin.defjvp
def my_sin_jvp(primals, tangents):
    (x,), (t,) = primals, tangents
    return my_sin(x), jnp.cos(x) * t   # differentiable itself: grad of grad goes through cos


def test_custom_jvp_value_is_the_function():
    np.testing.assert_allclose(np.asarray(scaled(X3)), 2 * X3)
    np.testing.assert_allclose(np.asarray(fnx.jit(scaled)(X3)), 2 * X3)


@pytest.mark.parametrize("outer", [(2,), (4,), (300,)])
def test_a_transposed_jvp_rule_that_loops_over_its_tangent(outer):
    # reverse mode transposes the rule over stand-in tangent PARAMs; a loop's vjp replays the loop, and the stand-in
    # was left in the gradient's graph, where it read the enclosing function's first argument: of another shape
    # (a crash; larger, a read past its end) or, of the same shape, numbers that only happened not to matter
    @fnx.custom_jvp
    def f(a):
        return jnp.sin(a)

    @f.defjvp
    def f_jvp(primals, tangents):
        (a,), (da,) = primals, tangents

        def row(i, out):  # out[i] = da[i] * cos(a[i]), a row at a time
            return jnp.where((jnp.arange(3) == i)[:, None], (jnp.take(da, i, axis=0) * jnp.cos(a[i]))[None], out)
        return f(a), lax.fori_loop(0, 3, row, jnp.zeros((3, 3), a.dtype))

    x = np.linspace(0.2, 1.4, outer[0]).astype(np.float32)
    w = np.arange(9, dtype=np.float32).reshape(3, 3)

    def loss(x):
        v = jnp.concatenate([x, x])[:3]
        return (f(v[:, None] * v[None, :]) * w).sum()
    for g in (fnx.grad(loss), fnx.jit(fnx.grad(loss))):
        got = np.asarray(g(x))
        eps = 1e-3
        for i in range(min(outer[0], 4)):  # (float64 central differences of the float32 loss)
            e = np.zeros_like(x)
            e[i] = eps
            fd = (float(loss(x + e)) - float(loss(x - e))) / (2 * eps)
            np.testing.assert_allclose(got[i], fd, rtol=2e-2, atol=2e-2)
        assert not got[4:].any()


def test_custom_jvp_rule_is_used_in_forward_mode():
    out, tangent = fnx.jvp(scaled, (X3,), (np.ones(3),))
    np.testing.assert_allclose(np.asarray(out), 2 * X3)
    np.testing.assert_allclose(np.asarray(tangent), 3.0)


def test_custom_jvp_rule_is_transposed_for_reverse_mode():
    np.testing.assert_allclose(np.asarray(fnx.grad(lambda x: scaled(x).sum())(X3)), 3.0)
    _, pullback = fnx.vjp(lambda x: scaled(x) * x, X3)
    np.testing.assert_allclose(np.asarray(pullback(np.ones(3))[0]), 3.0 * X3 + 2 * X3)


def test_custom_jvp_is_checked_numerically_when_correct():
    check_grads(softplus, (np.array([-3.0, -0.5, 0.2, 4.0]),), order=2)
    check_grads(my_sin, (X3,), order=2)


def test_custom_jvp_rule_wins_where_the_function_is_not_differentiable():
    @fnx.custom_jvp
    def clipped_sqrt(x):
        return jnp.sqrt(jnp.maximum(x, 0.0))

    @clipped_sqrt.defjvp
    def clipped_sqrt_jvp(primals, tangents):
        (x,), (t,) = primals, tangents
        return clipped_sqrt(x), jnp.where(x > 0, t / (2 * jnp.sqrt(jnp.maximum(x, 1e-30))), 0.0)
    g = fnx.grad(lambda x: clipped_sqrt(x).sum())(np.array([0.0, 4.0]))
    np.testing.assert_allclose(np.asarray(g), [0.0, 0.25])


def test_custom_jvp_grad_of_grad_through_a_differentiable_rule():
    x = np.float64(0.4)
    np.testing.assert_allclose(float(fnx.grad(my_sin)(x)), np.cos(x), rtol=1e-12)
    np.testing.assert_allclose(float(fnx.grad(fnx.grad(my_sin))(x)), -np.sin(x), rtol=1e-12)
    np.testing.assert_allclose(float(fnx.grad(fnx.grad(fnx.grad(my_sin)))(x)), -np.cos(x), rtol=1e-12)
    np.testing.assert_allclose(np.asarray(fnx.hessian(lambda v: my_sin(v).sum())(X3)), np.diag(-np.sin(X3)),
                               rtol=1e-12, atol=1e-15)


def test_custom_jvp_nondiff_argnums():
    from functools import partial

    @partial(fnx.custom_jvp, nondiff_argnums=(0,))
    def power(n, x):
        return x ** n

    @power.defjvp
    def power_jvp(n, primals, tangents):
        (x,), (t,) = primals, tangents
        return power(n, x), n * x ** (n - 1) * t
    np.testing.assert_allclose(np.asarray(fnx.jvp(lambda x: power(3, x), (X3,), (np.ones(3),))[1]), 3 * X3 ** 2)
    np.testing.assert_allclose(np.asarray(fnx.grad(lambda x: power(4, x).sum())(X3)), 4 * X3 ** 3, rtol=1e-12)
    np.testing.assert_allclose(np.asarray(fnx.grad(lambda x: power(2, x).sum())(X3)), 2 * X3, rtol=1e-12)


def test_custom_jvp_with_several_arguments_and_outputs():
    @fnx.custom_jvp
    def polar(r, theta):
        return r * jnp.cos(theta), r * jnp.sin(theta)

    @polar.defjvp
    def polar_jvp(primals, tangents):
        (r, theta), (tr, tt) = primals, tangents
        c, s = jnp.cos(theta), jnp.sin(theta)
        return polar(r, theta), (tr * c - r * s * tt, tr * s + r * c * tt)
    check_grads(polar, (X3, X3[::-1].copy()), order=2)


def test_custom_jvp_under_jit():
    g = fnx.jit(fnx.grad(lambda x: scaled(x).sum()))(X3)
    np.testing.assert_allclose(np.asarray(g), 3.0)
    g = fnx.grad(fnx.jit(lambda x: scaled(x).sum()))(X3)
    np.testing.assert_allclose(np.asarray(g), 3.0)
    tangent = fnx.jit(lambda x: fnx.jvp(scaled, (x,), (jnp.ones(3),))[1])(X3)
    np.testing.assert_allclose(np.asarray(tangent), 3.0)
    np.testing.assert_allclose(np.asarray(fnx.jit(fnx.grad(fnx.grad(my_sin)))(np.float64(0.4))), -np.sin(0.4))


def test_graphs_with_custom_rules_print():
    graph = str(fnx.make_graph(lambda x: scaled(x) + five_times(x) + fnx.checkpoint(jnp.sin)(x))(X3))
    assert "call" in graph.lower()
    text = fnx.jit(fnx.grad(lambda x: scaled(x).sum())).lower(X3).as_text("rangeify")
    assert "kernel" in text


def test_custom_jvp_without_a_rule_raises():
    @fnx.custom_jvp
    def f(x):
        return x
    with pytest.raises(AttributeError):
        f(X3)


def test_fnx_own_functions_are_traced_once_a_signature_under_jit(monkeypatch):
    from fnx.transforms import custom
    kinds = []
    real = custom.trace
    monkeypatch.setattr(custom, "trace", lambda f, args, **kw: kinds.append(kw["kind"]) or real(f, args, **kw))
    monkeypatch.setattr(custom, "_traces", custom.LRUCache(64))
    a, c = rng.standard_normal((5, 3)).astype(np.float32), rng.standard_normal(4).astype(np.float32)
    b = rng.standard_normal((5, 3))  # float64 (x64 on): a signature of its own

    def f(a, b, c):  # exp of a twice, of b, of c (another shape), of a float32 scalar and of a weak one: five
        return jnp.exp(a) + jnp.exp(a * 2), jnp.exp(b), jnp.exp(c), jnp.exp(a[0, 0] * 0 + 1.5), jnp.exp(2.0) * a
    got = fnx.jit(f)(a, b, c)
    assert kinds.count("jvp of exp") == 5, kinds
    want = (np.exp(a) + np.exp(a * 2), np.exp(b), np.exp(c), np.exp(np.float32(1.5)),
            (np.exp(2.0) * a).astype(np.float32))
    for x, y in zip(got, want):
        assert np.asarray(x).dtype == y.dtype
        np.testing.assert_allclose(np.asarray(x), y, rtol=2e-7 if y.dtype == np.float64 else 2e-6)
    # a second jit, and reverse mode through the kept trace: the same values, no new trace of those signatures
    grads = fnx.jit(fnx.grad(lambda a, b: (jnp.exp(a) * jnp.exp(a * 2)).sum() + jnp.exp(b).sum(), (0, 1)))(a, b)
    np.testing.assert_allclose(np.asarray(grads[0]), 3 * np.exp(3 * a.astype(np.float64)), rtol=1e-5)
    np.testing.assert_allclose(np.asarray(grads[1]), np.exp(b), rtol=1e-12)
    assert kinds.count("jvp of exp") == 5, kinds
    fnx.clear_caches()  # forgets them too
    np.testing.assert_allclose(np.asarray(fnx.jit(jnp.exp)(c)), np.exp(c), rtol=2e-6)
    assert kinds.count("jvp of exp") == 6, kinds


def test_a_users_custom_jvp_is_traced_at_every_call():
    scale = [2.0]

    @fnx.custom_jvp
    def g(x):  # reads a global: each trace must see its value then, as in JAX
        return x * scale[0]

    @g.defjvp
    def g_jvp(primals, tangents):
        return g(primals[0]), tangents[0] * scale[0]
    np.testing.assert_allclose(np.asarray(fnx.jit(lambda x: g(x))(X3)), 2 * X3)
    scale[0] = 5.0
    np.testing.assert_allclose(np.asarray(fnx.jit(lambda x: g(x))(X3)), 5 * X3)
    np.testing.assert_allclose(np.asarray(fnx.jit(fnx.grad(lambda x: g(x).sum()))(X3)), 5.0)


# ---- custom_vjp ----

@fnx.custom_vjp
def sin_with_residuals(x):
    return jnp.sin(x)


def sin_fwd(x):
    return jnp.sin(x), (jnp.cos(x),)


def sin_bwd(residuals, g):
    (cos_x,) = residuals
    return (g * cos_x,)


sin_with_residuals.defvjp(sin_fwd, sin_bwd)


@fnx.custom_vjp
def five_times(x):
    return x * 1.0


five_times.defvjp(lambda x: (x * 1.0, None), lambda residuals, g: (g * 5.0,))


def test_custom_vjp_value_is_the_function():
    np.testing.assert_allclose(np.asarray(five_times(X3)), X3)
    np.testing.assert_allclose(np.asarray(fnx.vjp(five_times, X3)[0]), X3)


def test_custom_vjp_fwd_and_bwd_are_used():
    np.testing.assert_allclose(np.asarray(fnx.grad(lambda x: five_times(x).sum())(X3)), 5.0)
    np.testing.assert_allclose(np.asarray(fnx.grad(lambda x: (five_times(x) * x).sum())(X3)), 6 * X3)


def test_custom_vjp_with_residuals_matches_finite_differences():
    check_grads(sin_with_residuals, (X3,), order=1, modes=("rev",))
    np.testing.assert_allclose(np.asarray(fnx.grad(lambda x: sin_with_residuals(x).sum())(X3)), np.cos(X3),
                               rtol=1e-12)


def test_custom_vjp_grad_of_grad_through_a_differentiable_bwd():
    x = np.float64(0.3)
    np.testing.assert_allclose(float(fnx.grad(fnx.grad(sin_with_residuals))(x)), -np.sin(x), rtol=1e-12)


def test_custom_vjp_with_several_arguments_and_pytree_output():
    @fnx.custom_vjp
    def f(x, y):
        return {"p": x * y, "s": x + y}

    def f_fwd(x, y):
        return f(x, y), (x, y)

    def f_bwd(residuals, ct):
        x, y = residuals
        return (ct["p"] * y + ct["s"], ct["p"] * x + ct["s"])
    f.defvjp(f_fwd, f_bwd)
    gx, gy = fnx.grad(lambda x, y: (f(x, y)["p"] * 2.0 + f(x, y)["s"]).sum(), argnums=(0, 1))(X3, X3 + 1.0)
    np.testing.assert_allclose(np.asarray(gx), 2 * (X3 + 1.0) + 1.0)
    np.testing.assert_allclose(np.asarray(gy), 2 * X3 + 1.0)


def test_custom_vjp_nondiff_argnums():
    from functools import partial

    @partial(fnx.custom_vjp, nondiff_argnums=(0,))
    def scale(k, x):
        return x * k

    scale.defvjp(lambda k, x: (x * k, None), lambda k, residuals, g: (g * k,))
    np.testing.assert_allclose(np.asarray(fnx.grad(lambda x: scale(3.0, x).sum())(X3)), 3.0)
    np.testing.assert_allclose(np.asarray(fnx.grad(lambda x: scale(-2.0, x).sum())(X3)), -2.0)


def test_custom_vjp_under_jit():
    np.testing.assert_allclose(np.asarray(fnx.jit(fnx.grad(lambda x: five_times(x).sum()))(X3)), 5.0)
    np.testing.assert_allclose(np.asarray(fnx.grad(fnx.jit(lambda x: five_times(x).sum()))(X3)), 5.0)
    np.testing.assert_allclose(np.asarray(fnx.jit(five_times)(X3)), X3)


def test_jvp_of_custom_vjp_raises():
    with pytest.raises(TypeError, match="custom_vjp"):
        fnx.jvp(five_times, (X3,), (np.ones(3),))
    with pytest.raises(TypeError, match="custom_vjp"):
        fnx.jacfwd(sin_with_residuals)(X3)


# ---- checkpoint / remat ----

def body(x):
    return jnp.sin(x * jnp.sum(x * x)) * jnp.exp(-x)


def test_checkpoint_gives_the_same_gradients():
    loss = lambda x: body(x).sum()  # noqa: E731
    remat_loss = lambda x: fnx.checkpoint(body)(x).sum()  # noqa: E731
    np.testing.assert_allclose(np.asarray(fnx.grad(remat_loss)(X8)), np.asarray(fnx.grad(loss)(X8)), rtol=1e-12)
    np.testing.assert_allclose(np.asarray(fnx.jit(fnx.grad(remat_loss))(X8)), np.asarray(fnx.grad(loss)(X8)),
                               rtol=1e-12)
    np.testing.assert_allclose(np.asarray(fnx.checkpoint(body)(X8)), np.asarray(body(X8)), rtol=1e-12)
    check_grads(fnx.remat(body), (X8,), order=2)


def test_checkpoint_static_argnums_and_nesting():
    def layer(x, n):
        for _ in range(n):
            x = jnp.tanh(x) * 1.5
        return x
    plain = fnx.grad(lambda x: layer(x, 3).sum())(X3)
    remat = fnx.grad(lambda x: fnx.checkpoint(layer, static_argnums=(1,))(x, 3).sum())(X3)
    nested = fnx.grad(lambda x: fnx.checkpoint(lambda y: fnx.checkpoint(jnp.tanh)(y) * 1.5)(x).sum())(X3)
    np.testing.assert_allclose(np.asarray(remat), np.asarray(plain), rtol=1e-12)
    np.testing.assert_allclose(np.asarray(nested), 1.5 * (1 - np.tanh(X3) ** 2), rtol=1e-12)


def _schedule(fun):
    return fnx.jit(fnx.value_and_grad(lambda x: fun(x).sum())).lower(X8).executable.lowering.schedule


def _ancestors(schedule, buffer: int) -> set[int]:
    """The buffers `buffer` is computed from, through the kernels that write them (a kernel writes its last arg)."""
    writer = {k.args[-1]: k for k in schedule.kernels}
    seen, stack = set(), [buffer]
    while stack:
        b = stack.pop()
        for src in writer[b].args[:-1] if b in writer else ():
            if src not in seen:
                seen.add(src)
                stack.append(src)
    return seen


def test_checkpoint_recomputes_the_body_in_the_backward_pass():
    plain, remat = _schedule(body), _schedule(fnx.checkpoint(body))
    inputs = lambda s: {i for i, b in enumerate(s.buffers) if b.kind == "input"}  # noqa: E731
    copies = lambda s: {b for u, b in s.realized.items() if u.op is Ops.CONTIGUOUS}  # noqa: E731
    reduces = lambda s: sum(u.op is Ops.REDUCE for k in s.kernels for u in k.sink.toposort)  # noqa: E731
    # without checkpoint the backward reads the forward's intermediates (the sum) from their buffers
    value_plain, grad_plain = plain.outputs
    assert _ancestors(plain, value_plain) & _ancestors(plain, grad_plain) - inputs(plain)
    assert not copies(plain)
    # with it, the backward starts from a CONTIGUOUS copy of the inputs and recomputes the sum from it
    value_remat, grad_remat = remat.outputs
    assert copies(remat) and copies(remat) <= _ancestors(remat, grad_remat)
    assert not (_ancestors(remat, value_remat) & _ancestors(remat, grad_remat)) - inputs(remat)
    assert reduces(remat) > reduces(plain) and len(remat.kernels) > len(plain.kernels)
    executable = fnx.jit(fnx.value_and_grad(lambda x: fnx.checkpoint(body)(x).sum())).lower(X8).executable
    assert executable.as_text("rangeify").count("kernel") == len(remat.kernels)


# ---- stop_gradient ----

def test_stop_gradient_gives_zero_gradient():
    np.testing.assert_array_equal(np.asarray(fnx.grad(lambda x: lax.stop_gradient(x * x).sum())(X3)), 0.0)
    np.testing.assert_allclose(np.asarray(fnx.grad(lambda x: (x * lax.stop_gradient(x * x)).sum())(X3)), X3 ** 2)
    np.testing.assert_array_equal(np.asarray(fnx.jvp(lambda x: lax.stop_gradient(jnp.sin(x)), (X3,),
                                                     (np.ones(3),))[1]), 0.0)
    np.testing.assert_allclose(np.asarray(fnx.grad(fnx.grad(lambda x: x * lax.stop_gradient(x) ** 2))(2.0)), 0.0)
    np.testing.assert_allclose(np.asarray(fnx.jit(fnx.grad(lambda x: (x * lax.stop_gradient(x)).sum()))(X3)), X3)


def test_checkpoint_rejects_unknown_keywords_and_takes_jax_ones():
    with pytest.raises(TypeError, match="static_argnum"):
        fnx.checkpoint(jnp.sin, static_argnum=1)
    f = fnx.checkpoint(lambda x, n: jnp.sin(x) * n, static_argnums=1, prevent_cse=False, policy=None)
    np.testing.assert_allclose(float(fnx.grad(f)(1.0, 2)), 2 * np.cos(1.0), rtol=1e-6)


def test_checkpoint_of_a_function_that_ignores_an_argument():
    """Its body has no PARAM for the unused argument: grad raised KeyError and jvp paired tangents with the wrong
    arguments (1.08 instead of 0 below). Oracle: the derivative by hand."""
    f = fnx.checkpoint(lambda x, y: jnp.sin(y) * 2)
    x, y = jnp.float32(0.3), jnp.float32(0.7)
    _, tangent = fnx.jvp(f, (x, y), (jnp.float32(1.0), jnp.float32(0.0)))
    assert float(tangent) == 0.0
    _, tangent = fnx.jvp(f, (x, y), (jnp.float32(0.0), jnp.float32(1.0)))
    np.testing.assert_allclose(float(tangent), 2 * np.cos(0.7), rtol=1e-6)
    gx, gy = fnx.grad(f, argnums=(0, 1))(x, y)
    assert float(gx) == 0.0
    np.testing.assert_allclose(float(gy), 2 * np.cos(0.7), rtol=1e-6)


def test_concrete_value_inside_checkpoint_under_grad_is_a_clear_error():
    """float() of a value traced inside checkpoint under grad: JAX's ConcretizationTypeError (it crashed the
    process before: the inner trace's input was compiled in with no buffer behind it)."""
    def f(x):
        return jnp.sin(x).sum() * float(x.sum())
    with pytest.raises(fnx.errors.ConcretizationTypeError, match="traced inside checkpoint"):
        fnx.grad(fnx.checkpoint(f))(jnp.ones(3))
    # plain grad of concrete inputs reads the value (a constant to the derivative): cos(x) * sum(x)
    np.testing.assert_allclose(np.asarray(fnx.grad(f)(jnp.ones(3))), np.full(3, np.cos(1.0) * 3), rtol=1e-6)


# ---- closures over values being differentiated ----

def _closing_checkpoint(lib):
    def loss(params, x):
        def layer(h):  # closes over params: a checkpointed layer as users write it
            return lib.numpy.tanh(h @ params["w"] + params["b"])
        h = lib.checkpoint(layer)(x)
        h = lib.checkpoint(layer)(h)  # the same block reused
        return (h ** 2).sum()
    return loss


def test_checkpoint_closing_over_parameters_differentiates_them_as_jax():
    """The gradient of values a checkpointed function closes over was silently zero: they are now arguments of
    the call (closure conversion), in grad, jvp, grad of grad, vmap and jit."""
    jax = pytest.importorskip("jax")
    rng = np.random.default_rng(0)
    params = {"w": rng.standard_normal((4, 4)).astype(np.float32) * 0.5, "b": rng.standard_normal(4).astype(np.float32)}
    x = rng.standard_normal((3, 4)).astype(np.float32)
    ours = fnx.grad(_closing_checkpoint(fnx))(params, x)
    theirs = jax.grad(_closing_checkpoint(jax))(params, x)
    for k in params: np.testing.assert_allclose(np.asarray(ours[k]), theirs[k], rtol=1e-5, atol=1e-6)
    jitted = fnx.jit(fnx.grad(_closing_checkpoint(fnx)))(params, x)
    for k in params: np.testing.assert_allclose(np.asarray(jitted[k]), theirs[k], rtol=1e-5, atol=1e-6)
    t = {k: np.ones_like(v) for k, v in params.items()}
    np.testing.assert_allclose(np.asarray(fnx.jvp(lambda p: _closing_checkpoint(fnx)(p, x), (params,), (t,))[1]),
                               jax.jvp(lambda p: _closing_checkpoint(jax)(p, x), (params,), (t,))[1], rtol=1e-5)

    def scalar(lib):
        return lambda a: lib.checkpoint(lambda v: lib.numpy.sin(v * a))(2.0)
    np.testing.assert_allclose(float(fnx.grad(fnx.grad(scalar(fnx)))(3.0)), jax.grad(jax.grad(scalar(jax)))(3.0),
                               rtol=1e-5)
    np.testing.assert_allclose(np.asarray(fnx.vmap(fnx.grad(scalar(fnx)))(jnp.arange(3.0))),
                               jax.vmap(jax.grad(scalar(jax)))(np.arange(3.0)), rtol=1e-5)


def test_custom_rules_closing_over_a_differentiated_value_raise_as_jax():
    """custom_vjp / custom_jvp rules give derivatives for their arguments only: a closed-over value being
    differentiated is JAX's UnexpectedTracerError (its gradient was silently zero); closing over a value that is
    not differentiated works."""
    def outer(a, kind):
        if kind == "vjp":
            g = fnx.custom_vjp(lambda x: x * a)
            g.defvjp(lambda x: (x * a, None), lambda _, ct: (ct * 100.0,))
        else:
            g = fnx.custom_jvp(lambda x: x * a)
            g.defjvp(lambda p, t: (p[0] * a, t[0] * 100.0))
        return g(2.0)
    for kind in ("vjp", "jvp"):
        with pytest.raises(fnx.errors.UnexpectedTracerError, match=f"custom_{kind} <lambda> closes over a value"):
            fnx.grad(outer)(3.0, kind)
        assert float(fnx.jit(outer, static_argnums=1)(3.0, kind)) == 6.0
        assert float(fnx.grad(lambda x, a: outer(a, kind) * x)(1.0, 3.0)) == 6.0
    with pytest.raises(fnx.errors.UnexpectedTracerError, match="jvp differentiates"):
        fnx.jvp(lambda a: outer(a, "jvp"), (3.0,), (1.0,))
