"""fnx.pmap against jax.pmap (JAX with eight host devices, fnx with eight cpu devices): collectives over the axis,
in_axes/out_axes and pytrees, static arguments, gradients, and the errors; and make_array_from_single_device_arrays."""
import numpy as np
import pytest

import fnx
import fnx.numpy as jnp
from fnx import lax

jax = pytest.importorskip("jax")

RNG = np.random.default_rng(0)


def test_normalizing_by_a_psum_matches_jax(cpus):
    x = RNG.standard_normal((4, 3)).astype(np.float32)
    want = jax.pmap(lambda v: v / jax.lax.psum(v, "i"), "i")(x)
    got = fnx.pmap(lambda v: v / lax.psum(v, "i"), "i")(x)
    np.testing.assert_allclose(np.asarray(got), want, rtol=1e-6)
    # one slice per device, in the order of the devices
    assert got.sharding.spec == fnx.P("i") and {d.id for d in got.devices()} == {0, 1, 2, 3}


def test_collectives_over_the_mapped_axis_match_jax(cpus):
    x = RNG.standard_normal((8, 2)).astype(np.float32)
    perm = [(i, (i + 1) % 8) for i in range(8)]

    def f(lib):
        def body(v):
            return (lib.lax.pmean(v, "d"), lib.lax.all_gather(v, "d"), lib.lax.ppermute(v, "d", perm),
                    lib.lax.axis_index("d") * 1.0 + v, lib.lax.pmax(v, "d"))
        return body
    want = jax.pmap(f(jax), "d")(x)
    got = fnx.pmap(f(fnx), "d")(x)
    for g, w in zip(got, want):
        np.testing.assert_allclose(np.asarray(g), w, rtol=1e-6)


def test_in_axes_out_axes_pytrees_and_keywords_match_jax(cpus):
    params = {"w": RNG.standard_normal((3, 5)).astype(np.float32), "b": RNG.standard_normal(5).astype(np.float32)}
    xs = RNG.standard_normal((2, 4, 3)).astype(np.float32)  # mapped over axis 1

    def f(p, x, scale):
        return {"y": (x @ p["w"] + p["b"]) * scale, "n": (x * x).sum(-1)}
    scale = np.float32(0.5) * np.ones(4, np.float32)
    want = jax.pmap(f, in_axes=(None, 1, 0), out_axes=1)(params, xs, scale)
    got = fnx.pmap(f, in_axes=(None, 1, 0), out_axes=1)(params, xs, scale)
    for k in want:
        np.testing.assert_allclose(np.asarray(got[k]), want[k], rtol=1e-5)
    # keyword arguments are mapped over axis 0
    got = fnx.pmap(lambda x, *, s: x * s)(xs[0], s=scale)
    np.testing.assert_allclose(np.asarray(got), xs[0] * scale[:, None], rtol=1e-6)


def test_static_arguments_and_calling_twice(cpus):
    x = RNG.standard_normal((4, 3)).astype(np.float32)
    f = fnx.pmap(lambda v, power: v ** power, static_broadcasted_argnums=1)
    jf = jax.pmap(lambda v, power: v ** power, static_broadcasted_argnums=1)
    for power in (2, 3, 2):
        np.testing.assert_allclose(np.asarray(f(x, power)), jf(x, power), rtol=1e-6)
    np.testing.assert_allclose(np.asarray(f(x * 2, 2)), jf(x * 2, 2), rtol=1e-6)  # new values, same program


def test_grad_through_pmap_matches_jax(cpus):
    x = RNG.standard_normal((4, 3)).astype(np.float32)
    w = RNG.standard_normal(3).astype(np.float32)

    def loss(lib):
        def inner(v, w):
            return lib.lax.psum(((v * w) ** 2).sum(), "i")
        return lambda v, w: lib.pmap(inner, "i", in_axes=(0, None))(v, w).sum()
    want = jax.grad(loss(jax), argnums=(0, 1))(x, w)
    got = fnx.grad(loss(fnx), argnums=(0, 1))(x, w)
    for g, wv in zip(got, want):
        np.testing.assert_allclose(np.asarray(g), wv, rtol=1e-5)


def test_pmap_of_a_vmap_and_inside_jit(cpus):
    x = RNG.standard_normal((2, 5, 3)).astype(np.float32)
    f = fnx.pmap(fnx.vmap(lambda v: jnp.tanh(v).sum()))
    np.testing.assert_allclose(np.asarray(f(x)), np.tanh(x).sum(-1), rtol=1e-5)
    g = fnx.jit(lambda v: fnx.pmap(lambda u: u * 2)(v) + 1)
    np.testing.assert_allclose(np.asarray(g(x)), x * 2 + 1, rtol=1e-6)


def test_errors_name_the_problem(cpus):
    with pytest.raises(ValueError, match="requires 9 logical devices, but only 8"):
        fnx.pmap(lambda v: v)(np.ones((9, 2), np.float32))
    with pytest.raises(ValueError, match="inconsistent sizes"):
        fnx.pmap(lambda a, b: a + b)(np.ones((2, 3), np.float32), np.ones((3, 3), np.float32))
    with pytest.raises(ValueError, match="in_axes has 1 entries for 2 arguments"):
        fnx.pmap(lambda a, b: a + b, in_axes=(0,))(np.ones((2, 3), np.float32), np.ones((2, 3), np.float32))
    with pytest.raises(fnx.errors.UnsupportedError, match="nested pmaps are not supported"):
        fnx.pmap(fnx.pmap(lambda v: v * 2, "j"), "i")(np.ones((2, 4, 3), np.float32))
    with pytest.raises(ValueError, match="hashable"):
        fnx.pmap(lambda a, s: a, static_broadcasted_argnums=1)(np.ones((2, 3), np.float32), np.ones(2))


def test_make_array_from_single_device_arrays(mesh24):
    """One array per device, each holding its shard, become one sharded array (as JAX's, checked against the host
    array it was cut from)."""
    host = RNG.standard_normal((4, 8)).astype(np.float32)
    sharding = fnx.NamedSharding(mesh24, fnx.P("data", "model"))
    index_of = sharding.addressable_devices_indices_map(host.shape)
    pieces = [fnx.device_put(host[index], device) for device, index in index_of.items()]
    x = fnx.make_array_from_single_device_arrays(host.shape, sharding, pieces)
    np.testing.assert_array_equal(np.asarray(x), host)
    assert x.sharding == sharding and x.shape == host.shape
    np.testing.assert_array_equal(np.asarray(fnx.jit(lambda a: a * 2)(x)), host * 2)
    with pytest.raises(ValueError, match="has shape"):
        fnx.make_array_from_single_device_arrays(host.shape, sharding, [fnx.device_put(host, pieces[0].device)]
                                                 + pieces[1:])
    with pytest.raises(ValueError, match="no array for the devices"):
        fnx.make_array_from_single_device_arrays(host.shape, sharding, pieces[1:])
    with pytest.raises(ValueError, match="several arrays on"):
        fnx.make_array_from_single_device_arrays(host.shape, sharding, pieces + pieces[:1])
