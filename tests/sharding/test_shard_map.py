"""shard_map with every collective, against JAX's shard_map on eight host devices (JAX defines the semantics) and
against numpy; under jit, grad, jvp and vmap; called twice; and its errors."""
import functools

import numpy as np
import pytest

import fnx
import fnx.numpy as jnp
from fnx import lax
from fnx.sharding import NamedSharding, P

jax = pytest.importorskip("jax")
jjnp = jax.numpy
JP = jax.sharding.PartitionSpec


def _jax_mesh(shape, names):
    devices = np.array(jax.devices()[:int(np.prod(shape))]).reshape(shape)
    return jax.sharding.Mesh(devices, names)


def _both(fn_fnx, fn_jax, mesh, jmesh, in_specs, out_specs, *args, check_vma=True):
    """The same per-device function under fnx.shard_map and jax.shard_map, on the same host arrays."""
    ours = fnx.shard_map(fn_fnx, mesh=mesh, in_specs=in_specs, out_specs=out_specs, check_vma=check_vma)(*args)
    theirs = jax.shard_map(fn_jax, mesh=jmesh, in_specs=_jp(in_specs), out_specs=_jp(out_specs),
                           check_vma=check_vma)(*args)
    return np.asarray(ours), np.asarray(theirs)


def _jp(specs):
    """fnx PartitionSpecs (a pytree of them) as JAX's."""
    return JP(*specs) if isinstance(specs, P) else tuple(_jp(s) for s in specs)


def _rand(*shape, seed=0):
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


COLLECTIVES = {  # name: (fnx body, jax body, in_spec, out_spec, global shape)
    "psum": (lambda x: lax.psum(x, "i"), lambda x: jax.lax.psum(x, "i"), P("i"), P(), (8, 3)),
    "pmean": (lambda x: lax.pmean(x * 2, "i"), lambda x: jax.lax.pmean(x * 2, "i"), P("i"), P(), (8, 3)),
    "pmax": (lambda x: lax.pmax(x, "i"), lambda x: jax.lax.pmax(x, "i"), P(None, "i"), P(), (3, 8)),
    "pmin": (lambda x: lax.pmin(x, "i"), lambda x: jax.lax.pmin(x, "i"), P("i"), P(), (8, 2)),
    "all_gather": (lambda x: lax.all_gather(x, "i"), lambda x: jax.lax.all_gather(x, "i"), P("i"), P(), (8, 3)),
    "all_gather_tiled_axis1": (lambda x: lax.all_gather(x, "i", axis=1, tiled=True),
                               lambda x: jax.lax.all_gather(x, "i", axis=1, tiled=True), P(None, "i"), P(), (3, 8)),
    "psum_scatter": (lambda x: lax.psum_scatter(x, "i", tiled=True), lambda x: jax.lax.psum_scatter(x, "i",
                                                                                                    tiled=True),
                     P(None, None), P("i"), (8, 3)),
    "psum_scatter_untiled": (lambda x: lax.psum_scatter(x, "i", scatter_dimension=1),
                             lambda x: jax.lax.psum_scatter(x, "i", scatter_dimension=1), P("i"), P("i"), (8, 4)),
    "ppermute_ring": (lambda x: lax.ppermute(x, "i", [(k, (k + 1) % 4) for k in range(4)]),
                      lambda x: jax.lax.ppermute(x, "i", [(k, (k + 1) % 4) for k in range(4)]), P("i"), P("i"),
                      (8, 3)),
    "ppermute_partial": (lambda x: lax.ppermute(x, "i", [(0, 2), (3, 1)]),
                         lambda x: jax.lax.ppermute(x, "i", [(0, 2), (3, 1)]), P("i"), P("i"), (8, 3)),
    "all_to_all": (lambda x: lax.all_to_all(x, "i", 1, 0, tiled=True),
                   lambda x: jax.lax.all_to_all(x, "i", 1, 0, tiled=True), P("i"), P("i"), (8, 8)),
    "axis_index": (lambda x: x + lax.axis_index("i").astype(jnp.float32),
                   lambda x: x + jax.lax.axis_index("i").astype(jjnp.float32), P("i"), P("i"), (8, 3)),
}


@pytest.mark.parametrize("name", sorted(COLLECTIVES))
def test_each_collective_equals_jax(mesh4, name):
    ours_fn, jax_fn, in_spec, out_spec, shape = COLLECTIVES[name]
    x = _rand(*shape)
    ours, theirs = _both(ours_fn, jax_fn, mesh4, _jax_mesh((4,), ("i",)), in_spec, out_spec, x, check_vma=False)
    assert ours.shape == theirs.shape
    np.testing.assert_allclose(ours, theirs, rtol=1e-6, atol=1e-6)


def test_psum_is_the_sum_of_blocks_exactly_for_integers(mesh4):
    x = np.arange(8 * 3, dtype=np.int32).reshape(8, 3)
    out = fnx.shard_map(lambda b: lax.psum(b, "i"), mesh=mesh4, in_specs=P("i"), out_specs=P())(x)
    np.testing.assert_array_equal(np.asarray(out), x.reshape(4, 2, 3).sum(0))
    assert out.dtype == np.int32


def test_two_dimensional_mesh_reduces_within_groups(mesh24):
    x = _rand(4, 8)
    body = lambda b: lax.psum(b, "model") * (1 + lax.axis_index("data").astype(jnp.float32))  # noqa: E731
    jbody = lambda b: jax.lax.psum(b, "model") * (1 + jax.lax.axis_index("data").astype(jjnp.float32))  # noqa: E731
    ours, theirs = _both(body, jbody, mesh24, _jax_mesh((2, 4), ("data", "model")), P("data", "model"),
                         P("data"), x)
    np.testing.assert_allclose(ours, theirs, rtol=1e-6)
    blocks = x.reshape(2, 2, 4, 2).sum(2) * np.array([1, 2], np.float32)[:, None, None]
    np.testing.assert_allclose(ours, blocks.reshape(4, 2), rtol=1e-6)


def test_psum_over_both_axes_and_a_tuple_of_names(mesh24):
    x = _rand(8, 4)
    f = lambda b: lax.psum(b, ("data", "model"))  # noqa: E731
    ours, theirs = _both(f, lambda b: jax.lax.psum(b, ("data", "model")), mesh24,
                         _jax_mesh((2, 4), ("data", "model")), P("data", "model"), P(), x)
    np.testing.assert_allclose(ours, theirs, rtol=1e-5)


def _loss_fnx(w, x):
    return lax.pmean(jnp.mean(jnp.tanh(x @ w) ** 2), "i")


def _loss_jax(w, x):
    return jax.lax.pmean(jjnp.mean(jjnp.tanh(x @ w) ** 2), "i")


def test_grad_of_a_data_parallel_loss_equals_jax(mesh4):
    w, x = _rand(3, 5, seed=1), _rand(8, 3, seed=2)
    ours = fnx.grad(lambda w, x: fnx.shard_map(_loss_fnx, mesh=mesh4, in_specs=(P(), P("i")), out_specs=P())(w, x),
                    argnums=(0, 1))(w, x)
    jmesh = _jax_mesh((4,), ("i",))
    theirs = jax.grad(lambda w, x: jax.shard_map(_loss_jax, mesh=jmesh, in_specs=(JP(), JP("i")),
                                                 out_specs=JP())(w, x), argnums=(0, 1))(w, x)
    for a, b in zip(ours, theirs): np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=1e-7)
    # and against the unsharded loss
    whole = fnx.grad(lambda w, x: jnp.mean(jnp.tanh(x @ w) ** 2), argnums=(0, 1))(w, x)
    for a, b in zip(ours, whole): np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("name", ["psum", "all_gather", "psum_scatter", "ppermute_ring", "all_to_all"])
def test_grad_through_each_collective_equals_jax(mesh4, name):
    ours_fn, jax_fn, in_spec, out_spec, shape = COLLECTIVES[name]
    x = _rand(*shape, seed=3)
    weights = _rand(*np.asarray(fnx.shard_map(ours_fn, mesh=mesh4, in_specs=in_spec, out_specs=out_spec,
                                              check_vma=False)(x)).shape, seed=4)
    jmesh = _jax_mesh((4,), ("i",))
    ours = fnx.grad(lambda x: jnp.sum(fnx.shard_map(ours_fn, mesh=mesh4, in_specs=in_spec, out_specs=out_spec,
                                                    check_vma=False)(x) * weights))(x)
    theirs = jax.grad(lambda x: jjnp.sum(jax.shard_map(jax_fn, mesh=jmesh, in_specs=JP(*in_spec),
                                                       out_specs=JP(*out_spec), check_vma=False)(x) * weights))(x)
    np.testing.assert_allclose(np.asarray(ours), np.asarray(theirs), rtol=1e-5, atol=1e-6)


def test_grad_when_the_cotangent_is_a_constant(mesh4):
    """grad of sum(shard_map(...)) with a psum inside: the backward pass's psum reads only the constant ones of
    the sum's cotangent, and the staged program read its result before computing it (a KeyError)."""
    x, w = _rand(4, 3, seed=5), _rand(3, seed=6)
    jmesh = _jax_mesh((4,), ("i",))
    bodies = [lambda lib: lambda v, w: lib.lax.psum(((v * w) ** 2).sum(), "i")[None],
              lambda lib: lambda v, w: lib.lax.psum(v.sum(-1), "i") * w.sum()]
    for body in bodies:
        ours = fnx.grad(lambda v, w: fnx.shard_map(body(fnx), mesh=mesh4, in_specs=(P("i"), P()),
                                                   out_specs=P("i"))(v, w).sum(), argnums=(0, 1))(x, w)
        theirs = jax.grad(lambda v, w: jax.shard_map(body(jax), mesh=jmesh, in_specs=(JP("i"), JP()),
                                                     out_specs=JP("i"))(v, w).sum(), argnums=(0, 1))(x, w)
        for a, b in zip(ours, theirs): np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5)


def test_grad_of_pmax_goes_to_the_largest_block(mesh4):  # (JAX has no derivative of pmax; numpy's max is the oracle)
    x, weights = _rand(3, 8, seed=12), _rand(3, 2, seed=13)
    f = fnx.shard_map(lambda b: lax.pmax(b, "i"), mesh=mesh4, in_specs=P(None, "i"), out_specs=P())
    got = fnx.grad(lambda x: jnp.sum(f(x) * weights))(x)
    blocks = x.reshape(3, 4, 2)
    expected = (blocks == blocks.max(1, keepdims=True)) * weights[:, None, :]
    np.testing.assert_allclose(np.asarray(got), expected.reshape(3, 8), rtol=1e-6)


def test_jvp_equals_jax(mesh4):
    x, t = _rand(8, 3, seed=5), _rand(8, 3, seed=6)
    f = fnx.shard_map(lambda b: lax.psum(jnp.sin(b), "i"), mesh=mesh4, in_specs=P("i"), out_specs=P())
    g = jax.shard_map(lambda b: jax.lax.psum(jjnp.sin(b), "i"), mesh=_jax_mesh((4,), ("i",)), in_specs=JP("i"),
                      out_specs=JP())
    ours, theirs = fnx.jvp(f, (x,), (t,)), jax.jvp(g, (x,), (t,))
    for a, b in zip(ours, theirs): np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=1e-6)


def test_vmap_of_shard_map_equals_jax(mesh4):
    x = _rand(5, 8, 3, seed=7)
    f = fnx.shard_map(lambda b: lax.psum(b * b, "i"), mesh=mesh4, in_specs=P("i"), out_specs=P())
    g = jax.shard_map(lambda b: jax.lax.psum(b * b, "i"), mesh=_jax_mesh((4,), ("i",)), in_specs=JP("i"),
                      out_specs=JP())
    np.testing.assert_allclose(np.asarray(fnx.vmap(f)(x)), np.asarray(jax.vmap(g)(x)), rtol=1e-5)


def test_under_jit_with_global_ops_around_and_called_twice(mesh24):
    x, w = _rand(8, 4, seed=8), _rand(4, 4, seed=9)

    @fnx.jit
    def step(x, w):
        h = jnp.tanh(x) + 1.0
        body = lambda h, w: lax.psum(h @ w, "model")  # noqa: E731
        y = fnx.shard_map(body, mesh=mesh24, in_specs=(P("data", "model"), P("model", None)),
                          out_specs=P("data", None))(h, w)
        return jnp.sum(y * y, axis=1)

    expected = np.sum(((np.tanh(x) + 1) @ w) ** 2, axis=1)
    for _ in range(2):
        np.testing.assert_allclose(np.asarray(step(x, w)), expected, rtol=1e-5)
    assert step.trace_count() == 1
    xs = fnx.device_put(x, NamedSharding(mesh24, P("data")))
    np.testing.assert_allclose(np.asarray(step(xs, w)), expected, rtol=1e-5)


def test_decorator_form_pytrees_and_closures(mesh4):
    scale = jnp.asarray(np.float32(3.0))

    @functools.partial(fnx.shard_map, mesh=mesh4, in_specs=({"a": P("i"), "b": P()},), out_specs=(P(), P("i")))
    def f(tree):
        return lax.psum(tree["a"] * scale, "i"), tree["a"] + tree["b"]

    a, b = _rand(8, 2, seed=10), _rand(2, 2, seed=11)
    total, added = f({"a": a, "b": b})
    np.testing.assert_allclose(np.asarray(total), 3 * a.reshape(4, 2, 2).sum(0), rtol=1e-5)
    np.testing.assert_allclose(np.asarray(added), a + np.tile(b, (4, 1)), rtol=1e-6)


def test_mesh_from_a_with_block(mesh4):
    with mesh4:
        out = fnx.shard_map(lambda b: lax.psum(b, "i"), in_specs=P("i"), out_specs=P())(np.ones((4, 2), np.float32))
    np.testing.assert_array_equal(np.asarray(out), np.full((1, 2), 4, np.float32))


def test_errors_name_the_axis_spec_and_shape(mesh4):
    f = fnx.shard_map(lambda b: b, mesh=mesh4, in_specs=P("i"), out_specs=P("i"))
    with pytest.raises(ValueError, match=r"spec PartitionSpec\('i'\) for an array of shape \(6, 2\): its axis 0 "
                                         r"\(size 6\) is split over mesh axes \('i',\) \(4 devices\)"):
        f(np.zeros((6, 2), np.float32))
    g = fnx.shard_map(lambda b: b * 2, mesh=mesh4, in_specs=P("i"), out_specs=P())
    with pytest.raises(ValueError, match=r"can differ along them .*\['i'\]|mesh axes \['i'\]"):
        g(np.zeros((4, 2), np.float32))
    h = fnx.shard_map(lambda b: b, mesh=mesh4, in_specs=P("j"), out_specs=P("j"))
    with pytest.raises(ValueError, match="naming mesh axis 'j'"):
        h(np.zeros((4, 2), np.float32))
    with pytest.raises(NameError, match="unbound axis name 'k'"):
        fnx.shard_map(lambda b: lax.psum(b, "k"), mesh=mesh4, in_specs=P("i"), out_specs=P("i"))(
            np.zeros((4, 2), np.float32))
    with pytest.raises(ValueError, match="no mesh"):
        fnx.shard_map(lambda b: b, in_specs=P("i"), out_specs=P("i"))(np.zeros((4, 2), np.float32))
