"""jit over sharded arrays: every kind of op, on random shapes with random layouts over a 2x4 mesh, equals the same
function run unsharded (and numpy where it is simple); exactly for integer programs, to float tolerance otherwise
(a sum split over devices adds in another order). Also in_shardings/out_shardings, with_sharding_constraint,
grads of sharded losses, calls repeated and from several threads."""
import threading

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import fnx
import fnx.numpy as jnp
from fnx import lax
from fnx.sharding import NamedSharding, P

CHOICES = [None, "data", "model", ("data", "model"), ("model", "data")]
SIZES = {None: 1, "data": 2, "model": 4, ("data", "model"): 8, ("model", "data"): 8}


def _spec(draw, shape):
    """A random PartitionSpec for `shape`: each axis split over mesh axes that divide it, none used twice."""
    used, entries = set(), []
    for size in shape:
        ok = [c for c in CHOICES if size % SIZES[c] == 0 and not used & set([c] if isinstance(c, str) else c or [])]
        pick = draw(st.sampled_from(ok))
        used |= set([pick] if isinstance(pick, str) else pick or [])
        entries.append(pick)
    return P(*entries)


def _rand(shape, seed, dtype=np.float32):
    rng = np.random.default_rng(seed)
    if np.dtype(dtype).kind == "i": return rng.integers(-5, 6, shape).astype(dtype)
    return rng.standard_normal(shape).astype(dtype)


UNARY = {  # name: (function of x, shape of x)
    "elementwise": (lambda x: jnp.sin(x) * x + 1.0, (8, 16)),
    "sum_axis0": (lambda x: jnp.sum(x, axis=0), (8, 16)),
    "sum_axis1_keep": (lambda x: jnp.sum(x, axis=1, keepdims=True), (8, 16)),
    "sum_all": (lambda x: jnp.sum(x), (8, 16)),
    "max_axis": (lambda x: jnp.max(x, axis=1), (8, 16)),
    "min_all": (lambda x: jnp.min(x), (8, 16)),
    "prod_axis": (lambda x: jnp.prod(x * 0.1 + 1.0, axis=0), (8, 8)),
    "mean_var": (lambda x: jnp.var(x, axis=0) + jnp.mean(x), (8, 16)),
    "softmax": (lambda x: fnx.nn.softmax(x, axis=-1), (8, 16)),
    "logsumexp": (lambda x: fnx.nn.logsumexp(x, axis=0), (16, 8)),
    "merge_axes": (lambda x: x.reshape(-1) * 2.0, (8, 16)),
    "split_axis": (lambda x: x.reshape(4, 32) + 1.0, (128,)),
    "reshape_3d": (lambda x: x.reshape(8, 4, 4).sum(axis=2), (8, 16)),
    "transpose": (lambda x: x.T @ x, (8, 16)),
    "slice": (lambda x: x[1:7, ::2] * 3.0, (8, 16)),
    "flip": (lambda x: jnp.flip(x, axis=0) - x, (8, 16)),
    "pad": (lambda x: jnp.pad(x, ((1, 2), (0, 0))), (8, 16)),
    "concat": (lambda x: jnp.concatenate([x, x * 2.0], axis=0), (8, 16)),
    "cumsum": (lambda x: jnp.cumsum(x, axis=1), (8, 16)),
    "argmax": (lambda x: jnp.argmax(x, axis=0), (8, 16)),
    "take": (lambda x: jnp.take(x, jnp.array([3, 0, 7, 7]), axis=0), (8, 16)),
    "take_axis1": (lambda x: x[:, jnp.array([1, 15, 2])], (8, 16)),
    "scatter_add": (lambda x: x.at[jnp.array([0, 3, 3])].add(1.0), (8, 16)),
    "scatter_set_row": (lambda x: x.at[5].set(-1.0), (8, 16)),
    "scatter_set_repeated_and_out_of_range": (lambda x: x.at[jnp.array([9, 6, 6, -1, 2])].set(
        jnp.arange(5.0)[:, None] + x[:5]), (8, 16)),
    "scatter_add_column": (lambda x: x.at[:, 13].add(x[:, 2]), (8, 16)),
    "scatter_mul_points": (lambda x: x.at[jnp.array([1, 6, 1]), jnp.array([3, 15, 3])].mul(2.0), (8, 16)),
    "scatter_max_3d": (lambda x: x.at[:, jnp.array([0, 3])].max(0.25), (4, 4, 8)),
    "where": (lambda x: jnp.where(x > 0, x, -x * 0.5), (8, 16)),
    "broadcast_bias": (lambda x: x + jnp.arange(16.0), (8, 16)),
    "outer": (lambda x: (x[:, :, None] * x[:, None, :]).sum(0), (8, 16)),
    "scan": (lambda x: lax.scan(lambda c, r: (c + r, c * r), jnp.zeros(16), x)[1], (8, 16)),
    "cond": (lambda x: lax.cond(jnp.sum(x) > 0, lambda v: v * 2.0, lambda v: v - 1.0, x), (8, 16)),
}


@pytest.mark.parametrize("name", sorted(UNARY))
@given(data=st.data())
def test_each_op_sharded_equals_unsharded(mesh24, name, data):
    fn, shape = UNARY[name]
    spec = _spec(data.draw, shape)
    x = _rand(shape, seed=len(name))
    expected = np.asarray(fnx.jit(fn)(x))
    xs = fnx.device_put(x, NamedSharding(mesh24, spec))
    got = fnx.jit(fn)(xs)
    assert got.shape == expected.shape and got.dtype == expected.dtype
    np.testing.assert_allclose(np.asarray(got), expected, rtol=2e-5, atol=2e-5, err_msg=f"{name} with {spec}")


BINARY = {
    "matmul": (lambda x, w: x @ w, (8, 16), (16, 8)),
    "batched_matmul": (lambda x, w: jnp.einsum("bij,bjk->bik", x, w), (4, 8, 8), (4, 8, 8)),
    "mlp": (lambda x, w: jnp.tanh(x @ w) @ w.T, (8, 16), (16, 8)),
    "add_broadcast_row": (lambda x, b: x * b[None, :8].sum(), (8, 8), (8, 8)),
}


@pytest.mark.parametrize("name", sorted(BINARY))
@given(data=st.data())
def test_binary_ops_with_two_layouts(mesh24, name, data):
    fn, sx, sw = BINARY[name]
    x, w = _rand(sx, 1), _rand(sw, 2)
    expected = np.asarray(fnx.jit(fn)(x, w))
    xs = fnx.device_put(x, NamedSharding(mesh24, _spec(data.draw, sx)))
    ws = fnx.device_put(w, NamedSharding(mesh24, _spec(data.draw, sw)))
    np.testing.assert_allclose(np.asarray(fnx.jit(fn)(xs, ws)), expected, rtol=2e-5, atol=2e-5)


@given(data=st.data())
def test_integer_programs_are_exact(mesh24, data):
    x = _rand((8, 16), 3, np.int32)
    fn = lambda x: (jnp.sum(x * x, axis=0) + jnp.max(x, axis=1).sum()) % 7  # noqa: E731
    xs = fnx.device_put(x, NamedSharding(mesh24, _spec(data.draw, (8, 16))))
    got = fnx.jit(fn)(xs)
    np.testing.assert_array_equal(np.asarray(got), (np.sum(x * x, axis=0) + x.max(1).sum()) % 7)


def test_elementwise_stays_local_and_keeps_the_layout(mesh24):
    x = fnx.device_put(_rand((8, 16), 4), NamedSharding(mesh24, P("data", "model")))
    f = fnx.jit(lambda x: jnp.exp(x) * 2.0 + x)
    out = f(x)
    assert out.sharding == NamedSharding(mesh24, P("data", "model"))
    text = f.lower(x).as_text()
    assert "collective" not in text.split("per device")[1]  # no communication for elementwise work


def test_reduction_over_a_split_axis_inserts_one_psum(mesh24):
    x = fnx.device_put(_rand((8, 16), 5), NamedSharding(mesh24, P("data")))
    f = fnx.jit(lambda x: jnp.sum(x, axis=0))
    local = f.lower(x).program.part.fn
    kinds = [u.arg.kind for u in local.toposort if u.op.name == "COLLECTIVE"]
    assert kinds == ["psum"]
    np.testing.assert_allclose(np.asarray(f(x)), np.asarray(x).sum(0), rtol=1e-5)


def test_in_and_out_shardings(mesh24):
    x = _rand((8, 16), 6)
    f = fnx.jit(lambda x: x * 2.0, in_shardings=NamedSharding(mesh24, P("model")),
                out_shardings=NamedSharding(mesh24, P(None, "data")))
    out = f(x)
    assert out.sharding == NamedSharding(mesh24, P(None, "data"))
    np.testing.assert_allclose(np.asarray(out), x * 2)
    with mesh24:
        g = fnx.jit(lambda a, b: (a + b, a - b), in_shardings=(P("data"), P()), out_shardings=(P(), P("model")))
        s, d = g(x, x)
    assert s.sharding.spec == P() and d.sharding.spec == P("model")
    np.testing.assert_allclose(np.asarray(s), 2 * x)
    with pytest.raises(ValueError, match=r"axis 0 of shape \(8, 16\) .* split over mesh axes \('data', 'model'\)"
                                         r"|which does not divide"):
        fnx.jit(lambda a: a, in_shardings=NamedSharding(mesh24, P(None, ("data", "model", )))).lower(
            _rand((8, 12), 0))


def test_with_sharding_constraint_reshards(mesh24):
    x = fnx.device_put(_rand((8, 16), 7), NamedSharding(mesh24, P("data")))

    @fnx.jit
    def f(x):
        y = fnx.lax.with_sharding_constraint(jnp.tanh(x), NamedSharding(mesh24, P(None, "model")))
        return y * 2.0

    out = f(x)
    assert out.sharding == NamedSharding(mesh24, P(None, "model"))
    np.testing.assert_allclose(np.asarray(out), np.tanh(np.asarray(x)) * 2, rtol=1e-6)


def test_grad_of_a_sharded_loss_and_a_training_step(mesh24):
    x, w = _rand((16, 8), 8), _rand((8, 4), 9) * 0.1
    loss = lambda w, x: jnp.mean((jnp.tanh(x @ w) - 0.5) ** 2)  # noqa: E731
    step = fnx.jit(lambda w, x: w - 0.1 * fnx.grad(loss)(w, x))
    xs = fnx.device_put(x, NamedSharding(mesh24, P("data")))
    ws = fnx.device_put(w, NamedSharding(mesh24, P(None, "model")))
    w1, w2 = w, ws
    for _ in range(3):
        w1, w2 = step(w1, x), step(w2, xs)
    np.testing.assert_allclose(np.asarray(w2), np.asarray(w1), rtol=1e-5, atol=1e-6)


def test_calls_from_several_threads(mesh24):
    x = fnx.device_put(_rand((8, 16), 10), NamedSharding(mesh24, P("data", "model")))
    f = fnx.jit(lambda x: jnp.sum(jnp.sin(x), axis=1))
    expected = np.sin(np.asarray(x)).sum(1)
    errors = []

    def work():
        try:
            for _ in range(3): np.testing.assert_allclose(np.asarray(f(x)), expected, rtol=1e-5)
        except Exception as err:  # noqa: BLE001  (reported below)
            errors.append(err)
    threads = [threading.Thread(target=work) for _ in range(4)]
    for t in threads: t.start()
    for t in threads: t.join()
    assert not errors


def test_eager_ops_on_sharded_arrays(mesh24):
    host = _rand((8, 16), 11)
    x = fnx.device_put(host, NamedSharding(mesh24, P("data")))
    np.testing.assert_allclose(np.asarray(jnp.sum(x, axis=0)), host.sum(0), rtol=1e-5)
    np.testing.assert_allclose(np.asarray(x[2:5] @ x.T), host[2:5] @ host.T, rtol=1e-5)
    assert (x + 1).sharding == x.sharding


def test_mixing_two_meshes_is_an_error(cpus):
    a = fnx.make_mesh((2, 4), ("data", "model"))
    b = fnx.sharding.Mesh(np.array(cpus[:4]), ("data",))
    x = fnx.device_put(np.ones((8, 8), np.float32), NamedSharding(a, P("data")))
    y = fnx.device_put(np.ones((8, 8), np.float32), NamedSharding(b, P("data")))
    with pytest.raises(ValueError, match="two meshes"):
        fnx.jit(lambda x, y: x + y)(x, y)


def test_eager_grad_and_lower_compile_on_sharded_arrays(mesh24):
    x, w = _rand((16, 8), 12), _rand((8, 4), 13)
    xs = fnx.device_put(x, NamedSharding(mesh24, P("data", "model")))
    loss = lambda w, x: jnp.sum(jnp.tanh(x @ w) ** 2)  # noqa: E731
    np.testing.assert_allclose(np.asarray(fnx.grad(loss)(w, xs)), np.asarray(fnx.grad(loss)(w, x)), rtol=1e-5)
    compiled = fnx.jit(loss).lower(w, xs).compile()
    np.testing.assert_allclose(float(compiled(w, xs)), float(loss(w, x)), rtol=1e-5)
    assert "per device" in compiled.as_text()


EXACT = ["elementwise", "merge_axes", "split_axis", "slice", "flip", "pad", "concat", "take", "take_axis1", "where",
         "broadcast_bias"]  # no sum split over devices: the same operations in the same order, so the same bits


@pytest.mark.parametrize("name", EXACT)
@given(data=st.data())
def test_programs_without_split_sums_are_bit_for_bit(mesh24, name, data):
    fn, shape = UNARY[name]
    x = _rand(shape, seed=len(name) + 1)
    xs = fnx.device_put(x, NamedSharding(mesh24, _spec(data.draw, shape)))
    np.testing.assert_array_equal(np.asarray(fnx.jit(fn)(xs)), np.asarray(fnx.jit(fn)(x)))


@given(shape=st.lists(st.sampled_from([1, 2, 4, 6, 8, 16]), min_size=1, max_size=3).map(tuple), data=st.data())
def test_random_shapes_and_layouts(mesh24, shape, data):
    x = _rand(shape, seed=sum(shape))
    xs = fnx.device_put(x, NamedSharding(mesh24, _spec(data.draw, shape)))
    axis = data.draw(st.integers(0, len(shape) - 1))

    def fn(x):
        y = jnp.tanh(x) * 2.0 - x
        total = jnp.sum(y, axis=axis, keepdims=True) + jnp.max(x)
        return y / (1.0 + total * total), jnp.cumsum(x, axis=axis), jnp.moveaxis(x, axis, 0).reshape(-1)[::3]
    for got, want in zip(fnx.jit(fn)(xs), fnx.jit(fn)(x)):
        np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=2e-5, atol=2e-5)


def test_float16_and_a_large_sharded_mean(mesh24):
    h = _rand((8, 16), 14).astype(np.float16)
    hs = fnx.device_put(h, NamedSharding(mesh24, P("data", "model")))
    f = fnx.jit(lambda x: jnp.tanh(x) * x + jnp.sum(x, axis=0))
    got = f(hs)
    assert got.dtype == np.float16
    np.testing.assert_allclose(np.asarray(got, np.float32), np.asarray(f(h), np.float32), rtol=2e-3, atol=2e-3)
    n = 1 << 24
    big = np.random.default_rng(15).standard_normal(n).astype(np.float32)
    xs = fnx.device_put(big, NamedSharding(mesh24, P(("data", "model"))))
    np.testing.assert_allclose(float(jnp.mean(xs)), big.astype(np.float64).mean(), rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("spec, kept", [(P("data"), P("data")), (P(("data", "model")), P(("data", "model"))),
                                        (P("data", "model"), P("data"))])
def test_an_update_of_a_row_split_array_keeps_the_split(mesh24, spec, kept):
    """`x.at[i].set(v)` and `.at[idx].add` on rows split over devices: each device combines the updates that fall
    in its block (the index less the block's start; the others are out of its range, which SCATTER drops), so
    the rows stay split, eagerly and under jit, with no gather of the rows. (The operand was gathered first, and
    the result was replicated on every device.) A split of the other axis is gathered by the flat index's
    reshape: the row split stays."""
    x = _rand((16, 8), 9)
    xs = fnx.device_put(x, NamedSharding(mesh24, spec))
    want = x.copy()
    want[11] = 0.5
    np.add.at(want, [3, 14, 3, 0], 1.0)
    update = lambda x, i: x.at[i].set(0.5).at[jnp.array([3, 14, 3, 0, 16])].add(1.0)  # noqa: E731
    for got in (update(xs, 11), fnx.jit(update)(xs, 11)):  # (eagerly; under jit with i traced)
        np.testing.assert_array_equal(np.asarray(got), want)
        assert got.sharding == NamedSharding(mesh24, kept), got.sharding
    if spec == P("data"):
        local = fnx.jit(lambda x: x.at[11].set(0.5)).lower(xs).program.part.fn
        assert not [u for u in local.toposort if u.op.name == "COLLECTIVE" and u.arg.kind == "all_gather"]
