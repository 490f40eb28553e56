"""lax.gather and the lax.scatter family with general dimension numbers, against jax.lax (values, both
out-of-bounds modes, gradients), eager, under jit and under vmap."""
import numpy as np
import pytest

import fnx
from fnx import lax

jax = pytest.importorskip("jax")
jlax = jax.lax

RNG = np.random.default_rng(0)

# (name, operand shape, indices, offset_dims, collapsed_slice_dims, start_index_map, operand_batching_dims,
#  start_indices_batching_dims, slice_sizes)
GATHERS = [
    ("rows", (5, 3), [[4], [0], [2], [6], [-1]], (1,), (0,), (0,), (), (), (1, 3)),
    ("points", (4, 5), [[0, 1], [3, 4], [2, 2], [4, 0], [1, -3], [3, 3]], (), (0, 1), (0, 1), (), (), (1, 1)),
    ("windows", (6, 7), [[0, 0], [4, 5], [5, 6], [1, 2]], (1, 2), (), (0, 1), (), (), (2, 3)),
    ("offsets around the batch", (5, 3, 4), [[1], [4], [3]], (0, 2), (1,), (1,), (), (), (5, 1, 2)),
    ("reversed index map", (4, 6), [[1, 3], [5, 0], [2, 2]], (1,), (1,), (1, 0), (), (), (3, 1)),
    ("batched", (2, 5, 3), [[[1], [4], [0], [2]], [[3], [3], [0], [7]]], (2,), (1,), (1,), (0,), (0,), (1, 1, 3)),
    ("batch of batches", (3, 4), [[[[1]], [[2]]], [[[0]], [[3]]]], (2, 3), (), (0,), (), (), (2, 4)),
]


def _gather_case(case):
    name, shape, idx, offset, collapsed, index_map, op_batch, idx_batch, sizes = case
    x = RNG.standard_normal(shape).astype(np.float32)
    dn = lax.GatherDimensionNumbers(offset, collapsed, index_map, op_batch, idx_batch)
    jdn = jlax.GatherDimensionNumbers(offset, collapsed, index_map, op_batch, idx_batch)
    return x, np.array(idx, np.int32), dn, jdn, sizes


@pytest.mark.parametrize("mode", ["clip", "fill", "promise_in_bounds"])
@pytest.mark.parametrize("case", GATHERS, ids=[c[0] for c in GATHERS])
def test_gather_matches_jax(case, mode):
    x, idx, dn, jdn, sizes = _gather_case(case)
    want = np.asarray(jlax.gather(x, idx, jdn, sizes, mode=mode))
    got = lax.gather(x, idx, dn, sizes, mode=mode)
    np.testing.assert_array_equal(np.asarray(got), want)
    jitted = fnx.jit(lambda a, i: lax.gather(a, i, dn, sizes, mode=mode))(x, idx)
    np.testing.assert_array_equal(np.asarray(jitted), want)


def test_gather_fill_value_and_integer_fill():
    x = np.arange(12, dtype=np.int32).reshape(4, 3)
    dn = lax.GatherDimensionNumbers((1,), (0,), (0,))
    idx = np.array([[1], [9], [-2]], np.int32)
    for fill in (None, 7):
        want = jlax.gather(x, idx, jlax.GatherDimensionNumbers((1,), (0,), (0,)), (1, 3), mode="fill",
                           fill_value=fill)
        np.testing.assert_array_equal(np.asarray(lax.gather(x, idx, dn, (1, 3), mode="fill", fill_value=fill)), want)
    # no mode: XLA's own rule, which clips a gather's out-of-bounds windows (and drops a scatter's)
    for mode in (None, "promise_in_bounds"):
        np.testing.assert_array_equal(np.asarray(lax.gather(x, idx, dn, (1, 3), mode=mode)), jlax.gather(
            x, idx, jlax.GatherDimensionNumbers((1,), (0,), (0,)), (1, 3), mode=mode))
        sdn, jsdn = lax.ScatterDimensionNumbers((1,), (0,), (0,)), jlax.ScatterDimensionNumbers((1,), (0,), (0,))
        np.testing.assert_array_equal(np.asarray(lax.scatter_add(x, idx, x[:3], sdn, mode=mode)),
                                      jlax.scatter_add(x, idx, x[:3], jsdn, mode=mode))


@pytest.mark.parametrize("case", GATHERS[:4], ids=[c[0] for c in GATHERS[:4]])
def test_gather_grad_matches_jax(case):
    x, idx, dn, jdn, sizes = _gather_case(case)
    w = RNG.standard_normal(np.asarray(jlax.gather(x, idx, jdn, sizes, mode="clip")).shape).astype(np.float32)
    want = jax.grad(lambda a: (jlax.gather(a, idx, jdn, sizes, mode="clip") * w).sum())(x)
    got = fnx.grad(lambda a: (lax.gather(a, idx, dn, sizes, mode="clip") * w).sum())(x)
    np.testing.assert_allclose(np.asarray(got), want, rtol=1e-6)


def test_gather_under_vmap_matches_a_loop():
    x = RNG.standard_normal((3, 6, 7)).astype(np.float32)
    idx = np.array([[[0, 0], [4, 5]], [[5, 6], [1, 2]], [[2, 2], [0, 4]]], np.int32)
    dn = lax.GatherDimensionNumbers((1, 2), (), (0, 1))
    got = fnx.vmap(lambda a, i: lax.gather(a, i, dn, (2, 3), mode="clip"))(x, idx)
    jdn = jlax.GatherDimensionNumbers((1, 2), (), (0, 1))
    want = np.stack([np.asarray(jlax.gather(x[k], idx[k], jdn, (2, 3), mode="clip")) for k in range(3)])
    np.testing.assert_array_equal(np.asarray(got), want)


# (name, operand shape, indices, updates shape, update_window_dims, inserted_window_dims,
#  scatter_dims_to_operand_dims, operand_batching_dims, scatter_indices_batching_dims)
SCATTERS = [
    ("rows with repeats", (5, 3), [[4], [0], [4], [7], [-1]], (5, 3), (1,), (0,), (0,), (), ()),
    ("points", (4, 5), [[0, 1], [3, 4], [0, 1], [4, 0]], (4,), (), (0, 1), (0, 1), (), ()),
    ("windows", (6, 7), [[0, 0], [4, 5], [1, 2], [3, 3]], (4, 2, 3), (1, 2), (), (0, 1), (), ()),
    ("window first", (6, 4), [[1], [5], [2]], (2, 3), (0,), (0,), (1,), (), ()),
    ("batched", (2, 5, 3), [[[1], [4], [1]], [[3], [0], [9]]], (2, 3, 3), (2,), (1,), (1,), (0,), (0,)),
]


def _scatter_case(case, dtype=np.float32):
    name, shape, idx, upd_shape, window, inserted, index_map, op_batch, idx_batch = case
    x = RNG.standard_normal(shape).astype(dtype)
    u = RNG.standard_normal(upd_shape).astype(dtype)
    dn = lax.ScatterDimensionNumbers(window, inserted, index_map, op_batch, idx_batch)
    jdn = jlax.ScatterDimensionNumbers(window, inserted, index_map, op_batch, idx_batch)
    return x, np.array(idx, np.int32), u, dn, jdn


@pytest.mark.parametrize("mode", ["clip", "fill", None])
@pytest.mark.parametrize("kind", ["scatter_add", "scatter_sub", "scatter_mul", "scatter_min", "scatter_max"])
@pytest.mark.parametrize("case", SCATTERS, ids=[c[0] for c in SCATTERS])
def test_scatter_combining_matches_jax(case, kind, mode):
    x, idx, u, dn, jdn = _scatter_case(case)
    want = np.asarray(getattr(jlax, kind)(x, idx, u, jdn, mode=mode))
    got = getattr(lax, kind)(x, idx, u, dn, mode=mode)
    np.testing.assert_allclose(np.asarray(got), want, rtol=1e-6, atol=1e-6)
    jitted = fnx.jit(lambda a, i, v: getattr(lax, kind)(a, i, v, dn, mode=mode))(x, idx, u)
    np.testing.assert_allclose(np.asarray(jitted), want, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("case", [c for c in SCATTERS if c[0] != "rows with repeats"],
                         ids=[c[0] for c in SCATTERS if c[0] != "rows with repeats"])
def test_scatter_set_matches_jax(case):
    """scatter (set) where no two kept windows overlap (with overlaps, which update lands is unspecified)."""
    x, idx, u, dn, jdn = _scatter_case(case)
    if case[0] in ("points", "windows"):  # keep windows that do not overlap
        idx, u = idx[[0, 1, 3]], u[[0, 1, 3]]
    if case[0] == "batched":
        idx = np.array([[[1], [4], [2]], [[3], [0], [9]]], np.int32)
    for mode in ("clip", "fill"):
        if mode == "clip" and case[0] == "batched": continue  # (clipping 9 to 4 would overlap the window at 4)
        want = np.asarray(jlax.scatter(x, idx, u, jdn, mode=mode))
        np.testing.assert_array_equal(np.asarray(lax.scatter(x, idx, u, dn, mode=mode)), want)


def test_scatter_apply_matches_jax():
    x = RNG.standard_normal((5, 3)).astype(np.float32)
    idx = np.array([[4], [0], [4]], np.int32)
    dn = lax.ScatterDimensionNumbers((1,), (0,), (0,))
    jdn = jlax.ScatterDimensionNumbers((1,), (0,), (0,))
    want = jlax.scatter_apply(x, idx, lambda v: v * 10 + 1, jdn, update_shape=(3, 3))
    got = lax.scatter_apply(x, idx, lambda v: v * 10 + 1, dn, update_shape=(3, 3))
    np.testing.assert_allclose(np.asarray(got), want, rtol=1e-6)  # row 4, covered twice, has func applied twice
    jitted = fnx.jit(lambda a, i: lax.scatter_apply(a, i, lambda v: v * 10 + 1, dn, update_shape=(3, 3)))(x, idx)
    np.testing.assert_allclose(np.asarray(jitted), want, rtol=1e-6)


def test_scatter_add_under_vmap_matches_a_loop():
    x = RNG.standard_normal((3, 5, 3)).astype(np.float32)
    idx = np.array([[[4], [0]], [[1], [1]], [[3], [8]]], np.int32)
    u = RNG.standard_normal((3, 2, 3)).astype(np.float32)
    dn, jdn = lax.ScatterDimensionNumbers((1,), (0,), (0,)), jlax.ScatterDimensionNumbers((1,), (0,), (0,))
    got = fnx.vmap(lambda a, i, v: lax.scatter_add(a, i, v, dn))(x, idx, u)
    want = np.stack([np.asarray(jlax.scatter_add(x[k], idx[k], u[k], jdn)) for k in range(3)])
    np.testing.assert_allclose(np.asarray(got), want, rtol=1e-6)


@pytest.mark.parametrize("case", SCATTERS[:3], ids=[c[0] for c in SCATTERS[:3]])
def test_scatter_add_grad_matches_jax(case):
    x, idx, u, dn, jdn = _scatter_case(case)
    w = RNG.standard_normal(x.shape).astype(np.float32)
    want = jax.grad(lambda a, v: (jlax.scatter_add(a, idx, v, jdn) ** 2 * w).sum(), argnums=(0, 1))(x, u)
    got = fnx.grad(lambda a, v: (lax.scatter_add(a, idx, v, dn) ** 2 * w).sum(), argnums=(0, 1))(x, u)
    for g, wg in zip(got, want):
        np.testing.assert_allclose(np.asarray(g), wg, rtol=1e-5, atol=1e-6)


def test_wrong_inputs_say_what_is_wrong():
    x = np.zeros((4, 3), np.float32)
    dn = lax.GatherDimensionNumbers((1,), (0,), (0,))
    with pytest.raises(TypeError, match="integers"):
        lax.gather(x, np.zeros((2, 1), np.float32), dn, (1, 3))
    with pytest.raises(TypeError, match="slice_sizes"):  # (a ShapeError, which is a TypeError as in JAX)
        lax.gather(x, np.zeros((2, 1), np.int32), dn, (1, 5))
    with pytest.raises(TypeError, match="index vectors of length 2"):
        lax.gather(x, np.zeros((2, 2), np.int32), dn, (1, 3))
    with pytest.raises(TypeError, match="slice size 1"):
        lax.gather(x, np.zeros((2, 1), np.int32), dn, (2, 3))
    sdn = lax.ScatterDimensionNumbers((1,), (0,), (0,))
    with pytest.raises(TypeError, match="do not fit"):
        lax.scatter_add(x, np.zeros((2, 1), np.int32), np.zeros((3, 3), np.float32), sdn)
    with pytest.raises(TypeError, match="one dtype"):
        lax.scatter_add(x, np.zeros((2, 1), np.int32), np.zeros((2, 3), np.int32), sdn)
    with pytest.raises(ValueError, match="unknown mode"):
        lax.gather(x, np.zeros((2, 1), np.int32), dn, (1, 3), mode="wrap")
