"""Complex numbers: values against numpy (complex128 references), promotion and derivatives against JAX (which
defines the convention), on every device, under jit, vmap and control flow; and the clear errors where fnx has no
complex form of a function yet."""
import threading
import warnings

import numpy as np
import pytest

import fnx
import fnx.numpy as jnp
from fnx import lax

jax = pytest.importorskip("jax")
J = jax.numpy

RNG = np.random.default_rng(0)


def _complex(shape, scale=1.0):
    return ((RNG.standard_normal(shape) + 1j * RNG.standard_normal(shape)) * scale).astype(np.complex64)


Z, W = _complex((3, 4)), _complex((3, 4))
# the awkward values: zeros of either part, a huge and a tiny modulus, the negative real axis (log's branch cut)
SPECIAL = np.array([0, 1, -1, 1j, -1j, 3 + 4j, -2.5 + 0j, -2.5 - 0j, 1e30 + 1e30j, 1e-30 - 1e-30j, 0.5 - 7j],
                   np.complex64)


def _close(got, want, rtol=2e-6, atol=1e-6):
    got = np.asarray(got)
    assert got.dtype == np.asarray(want).dtype or np.asarray(want).dtype == np.complex128, (got.dtype, want)
    np.testing.assert_allclose(got, want, rtol=rtol, atol=atol)


# ---- values against numpy, in float64 ----

UNARY = ["exp", "log", "sqrt", "sin", "cos", "tan", "sinh", "cosh", "tanh", "abs", "angle", "sign", "square",
         "reciprocal", "conj", "real", "imag", "negative", "log10", "log2", "exp2", "log1p", "expm1", "arcsin",
         "arccos", "arctan", "arcsinh", "arccosh", "arctanh"]


@pytest.mark.parametrize("name", UNARY)
def test_unary_functions_match_numpy(name, device):
    got = getattr(jnp, name)(Z)
    want = getattr(np, name)(Z.astype(np.complex128))
    assert np.asarray(got).dtype == (np.float32 if np.isrealobj(want) else np.complex64)
    np.testing.assert_allclose(np.asarray(got), want, rtol=3e-6, atol=3e-6)


@pytest.mark.parametrize("name", ["exp", "log", "sqrt", "abs", "angle", "sign", "reciprocal"])
def test_unary_functions_at_awkward_values(name):
    with np.errstate(all="ignore"):
        want = getattr(np, name)(SPECIAL.astype(np.complex128))
    got = np.asarray(getattr(jnp, name)(SPECIAL))
    finite = np.isfinite(want)
    np.testing.assert_allclose(got[finite], want[finite].astype(got.dtype), rtol=3e-6, atol=1e-37)


SIGNED_ZEROS = np.array([0j, complex(0, -0.0), complex(-0.0, 0), complex(-0.0, -0.0), -2.5 - 0j,
                         complex(-2.5, -0.0), 1 + 2j], np.complex64)


def _same_signs_and_close(got, want):
    got, want = np.asarray(got), np.asarray(want)
    assert got.dtype == want.dtype, (got.dtype, want.dtype)
    for part in (np.real, np.imag):
        np.testing.assert_array_equal(np.signbit(part(got)), np.signbit(part(want)))
    finite = np.isfinite(want)
    np.testing.assert_allclose(got[finite], want[finite], rtol=2e-6)
    np.testing.assert_array_equal(got[~finite], want[~finite])


@pytest.mark.parametrize("case", [
    lambda m, x: x + x, lambda m, x: x * 1.0, lambda m, x: m.conj(x), lambda m, x: x - 0j,
    lambda m, x: m.log(x + x)])  # (numpy and JAX agree on each sign here; not on sqrt's at -0.0 parts)
def test_signed_zero_parts_survive_computation(case, device):
    # a complex result is made from its real and imaginary parts; made by adding the two parts, each padded with
    # +0.0, it turned every -0.0 part into +0.0 (x + x for 0-0j gave 0+0j, and log took the other branch)
    with np.errstate(all="ignore"):
        want = case(np, SIGNED_ZEROS)
    _same_signs_and_close(case(jnp, SIGNED_ZEROS), want)
    _same_signs_and_close(fnx.jit(lambda x: case(jnp, x))(SIGNED_ZEROS), want)


@pytest.mark.parametrize("name", ["add", "subtract", "multiply", "divide", "power", "equal", "not_equal"])
def test_binary_functions_match_numpy(name, device):
    got = getattr(jnp, name)(Z, W)
    want = getattr(np, name)(Z.astype(np.complex128), W.astype(np.complex128))
    np.testing.assert_allclose(np.asarray(got), want, rtol=1e-5, atol=1e-6)


def test_division_neither_overflows_nor_underflows():
    big, tiny = np.complex64(3e30 + 4e30j), np.complex64(3e-30 - 4e-30j)
    np.testing.assert_allclose(np.asarray(jnp.divide(big, big)), 1.0, rtol=1e-6)
    np.testing.assert_allclose(np.asarray(jnp.divide(tiny, tiny)), 1.0, rtol=1e-6)
    np.testing.assert_allclose(np.asarray(jnp.divide(1 + 1j, big)), (1 + 1j) / (3e30 + 4e30j), rtol=1e-6)


def test_operators_and_python_scalars_promote_as_jax():
    z = jnp.asarray(Z)
    for got, want in [(z * 1j, J.asarray(Z) * 1j), (2 * z + 1, 2 * J.asarray(Z) + 1), (z ** 2, J.asarray(Z) ** 2),
                      (z ** -1, J.asarray(Z) ** -1), (abs(z), abs(J.asarray(Z))), (1 / z, 1 / J.asarray(Z)),
                      (-z, -J.asarray(Z)), (z.conj(), J.asarray(Z).conj()), (z.real, J.asarray(Z).real),
                      (z.imag, J.asarray(Z).imag)]:
        assert np.asarray(got).dtype == np.asarray(want).dtype
        np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=2e-6, atol=1e-6)
    x = np.arange(3, dtype=np.float32)
    for a, b in [(x, 1j), (x.astype(np.float16), Z[0, :3]), (x.astype(np.int32), 1j), (True, 1j)]:
        assert jnp.result_type(a, b) == J.result_type(a, b)
        assert np.asarray(jnp.add(a, b)).dtype == np.asarray(J.add(a, b)).dtype


def test_x64_gives_complex128():
    with fnx.enable_x64():
        z = jnp.asarray(Z.astype(np.complex128))
        assert z.dtype == np.complex128 and (z * 1j).dtype == np.complex128
        assert jnp.asarray(np.float64(1.0) + 1j).dtype == np.complex128
        np.testing.assert_allclose(np.asarray(jnp.exp(z)), np.exp(Z.astype(np.complex128)), rtol=1e-14)
    assert jnp.asarray(Z.astype(np.complex128)).dtype == np.complex64  # x64 off: canonicalized, as JAX
    with pytest.warns(UserWarning, match="complex128"):
        jnp.zeros(2, dtype=np.complex128)


def test_reductions_products_and_movement(device):
    z, w, zz, ww = jnp.asarray(Z), jnp.asarray(W), Z.astype(np.complex128), W.astype(np.complex128)
    cases = [(jnp.sum(z, axis=0), zz.sum(0)), (jnp.mean(z), zz.mean()), (z @ w.T, zz @ ww.T),
             (jnp.einsum("ij,kj->ik", z, w), zz @ ww.T), (jnp.vdot(z, w), np.vdot(zz, ww)),
             (jnp.var(z, axis=1), zz.var(1)), (jnp.std(z), zz.std()), (jnp.linalg.norm(z), np.linalg.norm(zz)),
             (jnp.linalg.norm(z, 1), np.linalg.norm(zz, 1)), (jnp.cumsum(z, axis=1), zz.cumsum(1)),
             (z.T[::-1], zz.T[::-1]), (jnp.concatenate([z, w]), np.concatenate([zz, ww])),
             (jnp.where(z.real > 0, z, w), np.where(zz.real > 0, zz, ww)), (jnp.pad(z, 1), np.pad(zz, 1)),
             (z[jnp.array([2, 0])], zz[[2, 0]]), (z.at[1, 2].set(5 - 5j), _set(zz, (1, 2), 5 - 5j)),
             (z.at[0].add(1j), _add(zz, 0, 1j)), (jnp.outer(z[0], w[1]), np.outer(zz[0], ww[1])),
             (jnp.linalg.vecdot(z, w), np.vecdot(zz, ww)), (jnp.sort_complex(z[0]), np.sort_complex(zz[0])),
             (jnp.prod(z, axis=1), zz.prod(1)), (jnp.cumprod(z, axis=1), zz.cumprod(1)),
             (jnp.prod(z[:, :3]), zz[:, :3].prod()),
             (jnp.round(z * 3, 1), np.round(zz * 3, 1)), (jnp.isclose(z, z + 1e-3j), np.isclose(zz, zz + 1e-3j))]
    for got, want in cases:
        np.testing.assert_allclose(np.asarray(got), want, rtol=1e-5, atol=2e-6)


def _set(a, index, value):
    a = a.copy()
    a[index] = value
    return a


def _add(a, index, value):
    a = a.copy()
    a[index] += value
    return a


def test_complex_linear_systems_match_numpy_and_their_gradients_jax():
    a, b = _complex((2, 4, 4)), _complex((2, 4, 3))
    a64, b64 = a.astype(np.complex128), b.astype(np.complex128)
    np.testing.assert_allclose(np.asarray(jnp.linalg.solve(a, b)), np.linalg.solve(a64, b64), rtol=2e-5, atol=2e-5)
    np.testing.assert_allclose(np.asarray(jnp.linalg.solve(a[0], b[0, :, 0])), np.linalg.solve(a64[0], b64[0, :, 0]),
                               rtol=2e-5, atol=2e-5)
    np.testing.assert_allclose(np.asarray(jnp.linalg.solve(a[0].real, b[0])), np.linalg.solve(a64[0].real, b64[0]),
                               rtol=2e-5, atol=2e-5)
    np.testing.assert_allclose(np.asarray(jnp.linalg.inv(a)), np.linalg.inv(a64), rtol=2e-5, atol=2e-5)
    np.testing.assert_allclose(np.asarray(jnp.linalg.matrix_power(a, -2)), np.linalg.matrix_power(a64, -2),
                               rtol=2e-5, atol=2e-5)
    f = lambda m: lambda x: m.sum(m.abs(m.linalg.solve(x, b[0])))  # noqa: E731
    np.testing.assert_allclose(np.asarray(fnx.grad(f(jnp))(a[0])), np.asarray(jax.grad(f(J))(a[0])), rtol=1e-4,
                               atol=1e-5)


def test_orderings_are_lexicographic_as_jax():
    s = np.array([1 + 2j, 1 + 1j, -1 + 5j, 1 + 1j, 0j, -1 - 5j], np.complex64)
    grid = s.reshape(2, 3)
    for name in ("max", "min"):
        for axis in (None, 0, 1):
            np.testing.assert_array_equal(np.asarray(getattr(jnp, name)(grid, axis=axis)),
                                          np.asarray(getattr(J, name)(grid, axis=axis)))
    for name in ("maximum", "minimum", "less", "greater", "less_equal", "greater_equal"):
        np.testing.assert_array_equal(np.asarray(getattr(jnp, name)(s, s[::-1])),
                                      np.asarray(getattr(J, name)(s, s[::-1])))
    np.testing.assert_array_equal(np.asarray(jnp.sort(s)), np.asarray(J.sort(s)))
    np.testing.assert_array_equal(np.asarray(jnp.argsort(s)), np.asarray(J.argsort(s)))
    np.testing.assert_array_equal(np.asarray(jnp.sort(s, descending=True)), np.asarray(J.sort(s, descending=True)))


def test_casts_between_real_and_complex():
    z = jnp.asarray(Z)
    np.testing.assert_array_equal(np.asarray(jnp.asarray(Z.real).astype(jnp.complex64)), Z.real.astype(np.complex64))
    with pytest.warns(np.exceptions.ComplexWarning):
        np.testing.assert_array_equal(np.asarray(z.astype(jnp.float32)), Z.real)
    np.testing.assert_array_equal(np.asarray(jnp.asarray(SPECIAL).astype(bool)), SPECIAL.astype(bool))
    np.testing.assert_array_equal(np.asarray(lax.complex(Z.real, Z.imag)), Z)
    assert complex(z[0, 0]) == complex(Z[0, 0]) and z[0, 0].item() == Z[0, 0].item()


# ---- derivatives: JAX's convention ----

FUNCTIONS = {
    "abs squared": lambda m: lambda z: m.sum(m.abs(z) ** 2),
    "real of exp": lambda m: lambda z: m.real(m.sum(m.exp(z))),
    "imag of a product": lambda m: lambda z: m.imag(m.sum(z * z * (1 + 2j))),
    "abs": lambda m: lambda z: m.sum(m.abs(z)),
    "angle": lambda m: lambda z: m.sum(m.angle(z)),
    "real of a quotient": lambda m: lambda z: m.real(m.sum(1 / z)),
    "log and sqrt": lambda m: lambda z: m.sum(m.abs(m.log(z) * m.sqrt(z))),
    "matmul": lambda m: lambda z: m.real(m.sum((z @ z.T) * m.conj(z[:, :3]))),
    "trig": lambda m: lambda z: m.sum(m.imag(m.sin(z) * m.cosh(z) + m.tan(z * 0.1))),
}


@pytest.mark.parametrize("name", FUNCTIONS)
def test_grad_of_a_real_function_of_complex_inputs_matches_jax(name):
    z = Z[:, :3]
    want = np.asarray(jax.grad(FUNCTIONS[name](J))(z))
    got = fnx.grad(FUNCTIONS[name](jnp))(z)
    assert np.asarray(got).dtype == np.complex64
    np.testing.assert_allclose(np.asarray(got), want, rtol=2e-5, atol=2e-5)
    np.testing.assert_allclose(np.asarray(fnx.jit(fnx.grad(FUNCTIONS[name](jnp)))(z)), want, rtol=2e-5, atol=2e-5)


def test_grad_through_a_complex_intermediate_of_real_inputs_matches_jax():
    f = lambda m: lambda x: m.abs(m.sum(x * m.exp(1j * x)))  # noqa: E731
    x = np.linspace(0.1, 2.0, 5).astype(np.float32)
    np.testing.assert_allclose(np.asarray(fnx.grad(f(jnp))(x)), np.asarray(jax.grad(f(J))(x)), rtol=1e-5)
    # the gradient against finite differences (float64), independently of JAX
    with fnx.enable_x64():
        x64 = x.astype(np.float64)
        g = np.asarray(fnx.grad(f(jnp))(x64))
        for i in range(x.size):
            e = np.zeros_like(x64)
            e[i] = 1e-6
            fd = (float(f(np)(x64 + e)) - float(f(np)(x64 - e))) / 2e-6
            assert abs(g[i] - fd) < 1e-6


def test_holomorphic_grad_jvp_and_vjp_match_jax():
    z = np.complex64(0.3 + 0.8j)
    got = fnx.grad(lambda z: jnp.sin(z) ** 2 * jnp.exp(z), holomorphic=True)(z)
    want = jax.grad(lambda z: J.sin(z) ** 2 * J.exp(z), holomorphic=True)(z)
    np.testing.assert_allclose(complex(got), complex(want), rtol=1e-5)
    primal, tangent = fnx.jvp(lambda z: z * jnp.conj(z) + jnp.exp(z), (Z,), (W,))
    jprimal, jtangent = jax.jvp(lambda z: z * J.conj(z) + J.exp(z), (Z,), (W,))
    np.testing.assert_allclose(np.asarray(tangent), np.asarray(jtangent), rtol=1e-5, atol=1e-5)
    _, pullback = fnx.vjp(lambda z: z * (2 + 1j) + jnp.conj(z) ** 2, Z)
    _, jpullback = jax.vjp(lambda z: z * (2 + 1j) + J.conj(z) ** 2, Z)
    np.testing.assert_allclose(np.asarray(pullback(W)[0]), np.asarray(jpullback(W)[0]), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("name", ["jacrev", "jacfwd", "hessian"])
def test_holomorphic_jacobians_match_jax(name):
    f = (lambda m: lambda z: m.sum(m.sin(z) * z[::-1] ** 2)) if name == "hessian" else (
        lambda m: lambda z: m.sin(z) * z[::-1])
    z = Z[0]
    got, want = getattr(fnx, name)(f(jnp), holomorphic=True)(z), getattr(jax, name)(f(J), holomorphic=True)(z)
    assert np.asarray(got).dtype == np.complex64
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-5, atol=1e-5)
    x = Z.real[0]
    np.testing.assert_allclose(np.asarray(fnx.jacfwd(lambda x: jnp.exp(1j * x))(x)),
                               np.asarray(jax.jacfwd(lambda x: J.exp(1j * x))(x)), rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(np.asarray(fnx.jacrev(lambda z: jnp.abs(z) ** 2)(z)),
                               np.asarray(jax.jacrev(lambda z: J.abs(z) ** 2)(z)), rtol=1e-6, atol=1e-6)


def test_grad_refuses_complex_outputs_and_real_holomorphic_inputs_as_jax():
    with pytest.raises(TypeError, match="jacrev requires real-valued outputs"):
        fnx.jacrev(lambda z: z * z)(Z[0])
    with pytest.raises(TypeError, match="jacfwd requires real-valued inputs"):
        fnx.jacfwd(lambda z: z * z)(Z[0])
    with pytest.raises(TypeError, match="complex dtype"):
        fnx.jacrev(lambda x: x, holomorphic=True)(Z.real[0])
    with pytest.raises(TypeError, match="real-valued outputs.*holomorphic=True"):
        fnx.grad(lambda z: z * z)(np.complex64(1 + 1j))
    with pytest.raises(TypeError, match="complex dtype"):
        fnx.grad(lambda x: x * 1j, holomorphic=True)(1.0)


# ---- transforms and control flow ----

def test_vmap_jit_and_control_flow_carry_complex_values():
    z = jnp.asarray(Z)
    np.testing.assert_allclose(np.asarray(fnx.vmap(lambda r: r * jnp.conj(r[::-1]))(z)), Z * np.conj(Z[:, ::-1]),
                               rtol=1e-6)
    np.testing.assert_allclose(np.asarray(fnx.vmap(jnp.exp, in_axes=1, out_axes=1)(z)), np.exp(Z), rtol=1e-6)
    step = lambda m, lx: lambda c, x: (c * x + 1j, m.abs(c))  # noqa: E731
    xs = _complex((5, 4), 0.5)
    got, want = lax.scan(step(jnp, lax), Z[0], xs), jax.lax.scan(step(J, jax.lax), Z[0], xs)
    for g, w in zip(got, want): np.testing.assert_allclose(np.asarray(g), np.asarray(w), rtol=1e-5)
    got = lax.while_loop(lambda c: jnp.abs(c[0]) < 100, lambda c: c * (1 + 1j), Z[0])
    want = jax.lax.while_loop(lambda c: J.abs(c[0]) < 100, lambda c: c * (1 + 1j), Z[0])
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-6)
    got = fnx.jit(lambda p, c: lax.cond(p, lambda c: c * 1j, jnp.conj, c))(False, Z)
    np.testing.assert_allclose(np.asarray(got), np.conj(Z))
    loss = lambda m, lx: lambda z: m.abs(lx.fori_loop(0, 3, lambda i, c: c * c * 0.5 + z, z)).sum()  # noqa: E731
    np.testing.assert_allclose(np.asarray(fnx.grad(loss(jnp, lax))(Z[0])), np.asarray(jax.grad(loss(J, jax.lax))(Z[0])),
                               rtol=1e-5)


def test_a_complex_value_is_one_pytree_leaf_and_lives_past_its_trace():
    z = jnp.asarray(Z)
    assert fnx.tree_util.tree_leaves({"z": z}) == [z]
    kept = fnx.jit(lambda a: a * 2)(z)
    np.testing.assert_array_equal(np.asarray(kept), Z * 2)
    np.testing.assert_array_equal(np.asarray(kept + 0), Z * 2)  # used again after the call that made it
    assert repr(jnp.asarray(np.complex64(1 - 2j))) == "Array(1.-2.j, dtype=complex64)"


def test_from_several_threads():
    results = [None] * 4

    def work(i):
        results[i] = np.asarray(fnx.jit(lambda z: jnp.exp(z) * i)(Z))
    threads = [threading.Thread(target=work, args=(i,)) for i in range(4)]
    for t in threads: t.start()
    for t in threads: t.join()
    for i, r in enumerate(results): np.testing.assert_allclose(r, np.exp(Z) * i, rtol=2e-6, atol=1e-6)


# ---- what fnx has no complex form of: a clear error, never the real part's answer ----

@pytest.mark.parametrize("call", [
    lambda z: jnp.linalg.det(z[:, :3]), lambda z: jnp.linalg.eigh(z[:, :3]), lambda z: jnp.median(z),
    lambda z: jnp.argmax(z), lambda z: jnp.fmax(z, z), lambda z: lax.lt(z, z), lambda z: jnp.floor(z),
    lambda z: jnp.linalg.norm(z, 2), lambda z: fnx.scipy.linalg.expm(z[:, :3]), lambda z: z // 2],
    ids=["det", "eigh", "median", "argmax", "fmax", "lax.lt", "floor", "spectral norm", "expm", "floor_divide"])
def test_functions_without_a_complex_form_raise(call):
    with warnings.catch_warnings():
        warnings.simplefilter("error", np.exceptions.ComplexWarning)  # never the real part silently
        with pytest.raises((TypeError, fnx.errors.ShapeError, ValueError)):
            call(jnp.asarray(Z))
