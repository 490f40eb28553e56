"""fnx.numpy's array creation, stacking, slicing and rearranging functions (fnx/numpy_arrays.py) against numpy and
jax.numpy: values and dtypes (ints, bools, float16 exactly; these functions only move values), eagerly, under
fnx.jit and under fnx.vmap; grads against jax.grad; wrong inputs raise JAX's exception types."""
import numpy as np
import pytest

import fnx
import fnx.numpy as fnp
from fnx.errors import ConcretizationError

jax = pytest.importorskip("jax")
jnp = pytest.importorskip("jax.numpy")

rng = np.random.default_rng(0)


def data(shape, dtype=np.float32):
    """Distinct-ish values of `dtype` (small integers for ints, a mix of True/False for bools)."""
    if np.dtype(dtype) == np.bool_: return rng.random(shape) > 0.5
    if np.dtype(dtype).kind in "iu": return rng.integers(0, 9, shape).astype(dtype)
    return rng.standard_normal(shape).astype(dtype)


A2 = data((3, 4))
A3 = data((2, 3, 4), np.int32)
V = data((5,))
H2 = data((4, 4), np.float16)
B2 = data((3, 4), np.bool_)
E = data((0, 3))
S = np.float32(2.5)
IDX = np.array([[1, 0, 2, 3], [3, 3, 0, 1]], np.int32)
MASK = np.array([0, 2, 0, 1, 0, 0, 3], np.int32)

# (id, fn(module, *arrays), arrays, oracles): oracles says which of numpy ("np") and jax ("jax") to compare with
BOTH, JAX = ("np", "jax"), ("jax",)
CASES = [
    ("tri", lambda m: m.tri(3, 4, -1, dtype=m.int8), [], BOTH),
    ("tri_default", lambda m: m.tri(2), [], JAX),
    ("tril", lambda m, x: m.tril(x, 1), [A2], BOTH),
    ("tril_batched_f16", lambda m, x: m.tril(x, -1), [data((2, 3, 3), np.float16)], BOTH),
    ("triu_bool", lambda m, x: m.triu(x), [B2], BOTH),
    ("triu_empty", lambda m, x: m.triu(x, 2), [E], BOTH),
    ("indices", lambda m: m.indices((2, 3)), [], BOTH),
    ("indices_sparse", lambda m: m.indices((2, 0, 3), sparse=True), [], BOTH),
    ("meshgrid_xy", lambda m, x, y: m.meshgrid(x, y), [V, data((3,), np.int32)], BOTH),
    ("meshgrid_ij_sparse", lambda m, x, y, z: m.meshgrid(x, y, z, indexing="ij", sparse=True),
     [V, data((2,)), data((0,))], BOTH),
    ("mgrid", lambda m: m.mgrid[0:3, 0:1:5j], [], BOTH),
    ("mgrid_1d", lambda m: m.mgrid[-2:7:3], [], BOTH),
    ("ogrid", lambda m: m.ogrid[0:3, 1:2.5:0.5], [], BOTH),
    ("r_", lambda m, x: m.r_[1:3, x, 7], [V], BOTH),
    ("r_directive", lambda m, x, y: m.r_["1,2,0", x, y], [V, V], BOTH),
    ("c_", lambda m, x, y: m.c_[x, y], [A2, data((3,))], BOTH),
    ("logspace", lambda m: m.logspace(0, 3, 4, base=2.0), [], BOTH),
    ("logspace_arrays", lambda m, a, b: m.logspace(a, b, 3, endpoint=False, axis=-1), [data((2,)), data((2,))],
     BOTH),
    ("geomspace", lambda m: m.geomspace(1, 1000, 7), [], BOTH),
    # (JAX computes a float16 geomspace in float16, 5e-4 off; fnx in float64, exactly as numpy: JAX gets 1e-3)
    ("geomspace_negative", lambda m: m.geomspace(-2.0, -32.0, 5, dtype=m.float16), [], BOTH, 1e-3),
    ("copy", lambda m, x: m.copy(x), [H2], BOTH),
    ("fromfunction", lambda m: m.fromfunction(lambda i, j: i * 3 + j, (2, 3), dtype=m.int32), [], BOTH),
    ("tril_indices", lambda m: m.tril_indices(4, -1), [], BOTH),
    ("triu_indices", lambda m: m.triu_indices(3, 1, 5), [], BOTH),
    ("tril_indices_from", lambda m, x: m.tril_indices_from(x, 1), [A2], BOTH),
    ("triu_indices_from", lambda m, x: m.triu_indices_from(x), [E], BOTH),
    ("diag_indices", lambda m: m.diag_indices(3, 3), [], BOTH),
    ("diag_indices_from", lambda m, x: m.diag_indices_from(x), [H2], BOTH),
    ("mask_indices", lambda m: m.mask_indices(3, m.triu, 1), [], BOTH),
    ("ix_", lambda m, x, y: m.ix_(x, y), [np.array([2, 0], np.int32), np.array([1, 3, 3], np.int32)], BOTH),
    ("unravel_index", lambda m, i: m.unravel_index(i, (3, 4)), [np.array([0, 5, 11, 7], np.int32)], BOTH),
    ("unravel_index_clipped", lambda m, i: m.unravel_index(i, (3, 4)), [np.array([-1, 12, -13, 30], np.int32)],
     JAX),
    ("ravel_multi_index", lambda m, i, j: m.ravel_multi_index((i, j), (3, 4)),
     [np.array([0, 2, 1], np.int32), np.array([3, 0, 1], np.int32)], BOTH),
    ("ravel_multi_index_F_clip", lambda m, i, j: m.ravel_multi_index((i, j), (3, 4), mode="clip", order="F"),
     [np.array([0, 5, -1], np.int32), np.array([3, 0, 9], np.int32)], BOTH),
    ("ravel_multi_index_wrap", lambda m, i, j: m.ravel_multi_index((i, j), (3, 4), mode="wrap"),
     [np.array([0, 5, -1], np.int32), np.array([3, 0, 9], np.int32)], BOTH),
    ("atleast_1d", lambda m, x: m.atleast_1d(x), [S], BOTH),
    ("atleast_2d_many", lambda m, x, y, z: m.atleast_2d(x, y, z), [S, V, A3], BOTH),
    ("atleast_3d_many", lambda m, x, y, z, w: m.atleast_3d(x, y, z, w), [S, V, A2, A3], BOTH),
    ("vstack", lambda m, x, y: m.vstack([x, y]), [data((4,)), A2], BOTH),
    ("vstack_array", lambda m, x: m.vstack(x), [A3], BOTH),
    ("hstack", lambda m, x, y: m.hstack([x, y]), [A2, data((3, 2), np.float16)], BOTH),
    ("hstack_1d", lambda m, x, y: m.hstack((x, y)), [V, data((0,))], BOTH),
    ("dstack", lambda m, x, y: m.dstack([x, y]), [A2, A2], BOTH),
    ("dstack_1d", lambda m, x, y: m.dstack([x, y]), [V, V], BOTH),
    ("column_stack", lambda m, x, y: m.column_stack([x, y]), [data((3,)), A2], BOTH),
    ("block", lambda m, x, y, z: m.block([[x, y], [z]]), [data((2, 2)), data((2, 1), np.int32), data((1, 3))], BOTH),
    ("block_1d_scalars", lambda m, x: m.block([x, 1.5, x]), [V], BOTH),
    ("block_3d", lambda m, x, y: m.block([[[x], [y]]]), [data((1, 2)), data((1, 2))], BOTH),
    ("concat", lambda m, x, y: m.concat([x, y], axis=-1), [A2, A2], JAX),
    ("unstack", lambda m, x: m.unstack(x, axis=-2), [A3], JAX),
    ("append", lambda m, x, y: m.append(x, y), [A2, V], BOTH),
    ("append_axis", lambda m, x, y: m.append(x, y, axis=0), [A2, data((1, 4), np.int8)], BOTH),
    ("array_split", lambda m, x: m.array_split(x, 3, axis=-1), [A3], BOTH),
    ("array_split_indices", lambda m, x: m.array_split(x, [1, -1]), [A2], ("np",)),  # (JAX rejects -1: a bug)
    ("hsplit", lambda m, x: m.hsplit(x, 2), [A2], BOTH),
    ("hsplit_1d", lambda m, x: m.hsplit(x, [2]), [V], BOTH),
    ("vsplit", lambda m, x: m.vsplit(x, [1, 2]), [A2], BOTH),
    ("dsplit", lambda m, x: m.dsplit(x, 4), [A3], BOTH),
    ("roll_flat", lambda m, x: m.roll(x, 5), [A2], BOTH),
    ("roll_axes", lambda m, x: m.roll(x, (1, -2), axis=(0, -1)), [A3], BOTH),
    ("roll_one_shift_many_axes", lambda m, x: m.roll(x, 2, axis=(1, 2)), [A3], BOTH),
    ("roll_empty", lambda m, x: m.roll(x, 1, axis=0), [E], BOTH),
    ("rot90", lambda m, x: m.rot90(x), [A2], BOTH),
    ("rot90_k", lambda m, x: m.rot90(x, -1, axes=(2, 0)), [A3], BOTH),
    ("rot90_k2_bool", lambda m, x: m.rot90(x, 2), [B2], BOTH),
    ("rot90_k3", lambda m, x: m.rot90(x, 7, (-1, -2)), [H2], BOTH),
    ("fliplr", lambda m, x: m.fliplr(x), [A3], BOTH),
    ("flipud", lambda m, x: m.flipud(x), [V], BOTH),
    ("rollaxis", lambda m, x: m.rollaxis(x, 2), [A3], BOTH),
    ("rollaxis_start", lambda m, x: m.rollaxis(x, 0, 3), [A3], BOTH),
    ("rollaxis_negative", lambda m, x: m.rollaxis(x, -1, -2), [A3], BOTH),
    ("permute_dims", lambda m, x: m.permute_dims(x, (2, 0, 1)), [A3], JAX),
    ("matrix_transpose", lambda m, x: m.matrix_transpose(x), [A3], JAX),
    ("resize", lambda m, x: m.resize(x, (2, 7)), [V], BOTH),
    ("resize_shrink", lambda m, x: m.resize(x, 5), [A2], BOTH),
    ("resize_empty", lambda m, x: m.resize(x, (2, 2)), [E], BOTH),
    ("delete_int", lambda m, x: m.delete(x, -1, axis=1), [A2], BOTH),
    ("delete_array", lambda m, x: m.delete(x, np.array([1, 3, 3])), [A2], BOTH),
    ("delete_mask", lambda m, x: m.delete(x, np.array([True, False, True]), axis=0), [A2], BOTH),
    ("delete_slice", lambda m, x: m.delete(x, slice(None, None, 2), axis=-1), [A3], BOTH),
    ("insert_scalar_index", lambda m, x, v: m.insert(x, 1, v, axis=1), [A2, data((3,))], BOTH),
    ("insert_indices", lambda m, x: m.insert(x, np.array([3, 1, 3, 0]), np.array([10, 11, 12, 13])), [V], BOTH),
    ("insert_flat_negative", lambda m, x: m.insert(x, -1, 7), [A3], BOTH),
    ("insert_rows", lambda m, x: m.insert(x, np.array([0, 3]), 9.5, axis=0), [A2], BOTH),
    ("insert_slice", lambda m, x: m.insert(x, slice(0, 4, 2), np.array([8.0, 9.0])), [V], BOTH),
    ("trim_zeros", lambda m, x: m.trim_zeros(x), [MASK], BOTH),
    ("trim_zeros_b", lambda m, x: m.trim_zeros(x, "b"), [MASK], BOTH),
    ("diagonal", lambda m, x: m.diagonal(x), [A2], BOTH),
    ("diagonal_axes", lambda m, x: m.diagonal(x, 1, -1, 0), [A3], BOTH),
    ("diagonal_negative", lambda m, x: m.diagonal(x, -2), [A2], BOTH),
    ("diagonal_past_end", lambda m, x: m.diagonal(x, 4), [A2], BOTH),
    ("diag_1d", lambda m, x: m.diag(x), [V], BOTH),
    ("diag_1d_k", lambda m, x: m.diag(x, -2), [data((3,), np.bool_)], BOTH),
    ("diag_1d_k_pos", lambda m, x: m.diag(x, 1), [data((3,), np.int32)], BOTH),
    ("diag_2d", lambda m, x: m.diag(x, 1), [A2], BOTH),
    ("diagflat", lambda m, x: m.diagflat(x, -1), [data((2, 2))], BOTH),
    ("trace", lambda m, x: m.trace(x), [A2], BOTH),
    ("trace_int8", lambda m, x: m.trace(x.astype(m.int8), 1, 2, 1), [A3], JAX),
    ("trace_f16", lambda m, x: m.trace(x, -1), [H2], JAX),
    ("fill_diagonal", lambda m, x, v: m.fill_diagonal(x, v, inplace=False), [data((5, 3)), data((2,))], JAX),
    ("fill_diagonal_3d", lambda m, x: m.fill_diagonal(x, 4, inplace=False), [data((3, 3, 3), np.int32)], JAX),
    ("select", lambda m, c1, c2, x: m.select([c1, c2], [x, -x], default=7.0), [B2, ~B2, A2], BOTH),
    ("select_int_default", lambda m, c, x: m.select([c], [x], default=np.int8(3)), [B2[0], A2], BOTH),
    ("choose", lambda m, i, x, y: m.choose(i, [x, y]), [np.array([[0, 1, 1, 0]], np.int32), A2, V[:4]], BOTH),
    ("choose_wrap", lambda m, i, x, y: m.choose(i, [x, y], mode="wrap"), [np.array([3, -1, 2], np.int32), V[:3],
                                                                        V[2:5]], BOTH),
    ("choose_clip", lambda m, i, x, y: m.choose(i, [x, y], mode="clip"), [np.array([3, -1, 0], np.int32), V[:3],
                                                                        V[2:5]], BOTH),
    ("compress", lambda m, c, x: m.compress(c, x, axis=1), [np.array([1, 0, 1], np.int32), A2], BOTH),
    ("compress_flat", lambda m, c, x: m.compress(c, x), [np.array([True, False, True]), A2], BOTH),
    ("compress_size", lambda m, c, x: m.compress(c, x, axis=1, size=3, fill_value=-1),
     [np.array([0, 1, 0, 0], np.int32), A3], JAX),
    ("extract", lambda m, c, x: m.extract(c, x), [B2, A2], BOTH),
    ("extract_size", lambda m, c, x: m.extract(c, x, size=3), [B2, A2], JAX),
    ("place", lambda m, x, c, v: m.place(x, c, v, inplace=False), [A2, B2, data((3,))], JAX),
    ("put", lambda m, x, i, v: m.put(x, i, v, inplace=False), [A2, np.array([0, 5, 11, -2], np.int32),
                                                               data((2,))], JAX),
    ("put_clip_wrap", lambda m, x, i, v: (m.put(x, i, v, mode="clip", inplace=False),
                                          m.put(x, i, v, mode="wrap", inplace=False)),
     [V, np.array([-3, 9], np.int32), data((2,))], JAX),
    ("put_along_axis", lambda m, x, i, v: m.put_along_axis(x, i, v, 1, inplace=False), [data((2, 5)), IDX, 7.0],
     JAX),
    ("put_along_axis_broadcast", lambda m, x, i, v: m.put_along_axis(x, i, v, 0, inplace=False),
     [A3, np.array([[[1], [0], [1]]], np.int32), data((1, 3, 1), np.int32)], JAX),
    ("argwhere", lambda m, x: m.argwhere(x), [B2], BOTH),
    ("argwhere_scalar", lambda m, x: m.argwhere(x), [np.float32(3)], BOTH),
    ("argwhere_empty", lambda m, x: m.argwhere(x), [E], BOTH),
    ("argwhere_size", lambda m, x: m.argwhere(x, size=20, fill_value=-1), [A3 > 4], JAX),
    ("argwhere_size_short", lambda m, x: m.argwhere(x, size=2, fill_value=(7, 8)), [B2], JAX),
    ("argwhere_size_empty", lambda m, x: m.argwhere(x, size=2), [E], JAX),
    ("flatnonzero", lambda m, x: m.flatnonzero(x), [MASK], BOTH),
    ("flatnonzero_size", lambda m, x: m.flatnonzero(x, size=4, fill_value=-7), [MASK], JAX),
]


def _tree_np(tree):
    return [np.asarray(leaf) for leaf in jax.tree_util.tree_leaves(tree)]


def _compare(got, want, exact_dtype: bool, what: str, rtol: float = 2e-6):
    got, want = _tree_np(got), _tree_np(want)
    assert len(got) == len(want), (what, len(got), len(want))
    for g, w in zip(got, want):
        assert g.shape == w.shape, (what, g.shape, w.shape)
        if exact_dtype: assert g.dtype == w.dtype, (what, g.dtype, w.dtype)
        if w.dtype.kind in "biu" and g.dtype.kind in "biu":
            np.testing.assert_array_equal(g, w, err_msg=what)
        else:  # the float results move values or compute in float64 (logspace, geomspace): round-off only
            np.testing.assert_allclose(g.astype(np.float64), w.astype(np.float64), rtol=rtol, atol=1e-6,
                                       err_msg=what)


# cases whose result shape depends on their array arguments' values: under jit those are closed over (concrete)
VALUE_SHAPED = {"ravel_multi_index", "trim_zeros", "trim_zeros_b", "choose", "compress", "compress_flat", "extract",
                "argwhere", "argwhere_scalar", "argwhere_empty", "flatnonzero"}


def _jax_args(args):
    return [jnp.asarray(a) if isinstance(a, (np.ndarray, np.generic)) else a for a in args]


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_against_numpy_jax_eager_and_jit(case):
    name, fn, args, oracles = case[:4]
    jax_rtol = case[4] if len(case) > 4 else 2e-6
    fnx_args = [fnp.asarray(a) if isinstance(a, (np.ndarray, np.generic)) else a for a in args]
    eager = fn(fnp, *fnx_args)
    if "jax" in oracles:
        _compare(eager, fn(jnp, *_jax_args(args)), exact_dtype=True, what=f"{name} eager vs jax", rtol=jax_rtol)
    if "np" in oracles:
        _compare(eager, fn(np, *args), exact_dtype=False, what=f"{name} eager vs numpy")
    if name in VALUE_SHAPED:
        jitted = fnx.jit(lambda: fn(fnp, *fnx_args))()
    elif name == "mask_indices":  # (its mask is computed inside the function: never concrete under jit)
        return
    else:
        jitted = fnx.jit(lambda *a: fn(fnp, *a))(*fnx_args)
    _compare(jitted, eager, exact_dtype=True, what=f"{name} jit vs eager")


def _second(a):
    """Another input of a's shape and dtype (for a batch of two)."""
    a = np.asarray(a)
    if a.dtype == np.bool_: return ~a
    return (a[::-1] if a.ndim else a) * 2 + 1 if a.dtype.kind == "f" else np.flip(a)


# cases whose every array argument can carry a batch axis (the rest take static index arguments or need concrete
# values: trim_zeros, argwhere without size, ...)
VMAPPED = ["tril", "tril_batched_f16", "triu_bool", "meshgrid_xy", "vstack", "hstack", "dstack", "column_stack",
           "block", "concat", "unstack", "append", "array_split", "hsplit", "vsplit", "roll_flat", "roll_axes",
           "rot90", "rot90_k", "fliplr", "rollaxis", "matrix_transpose", "resize", "delete_array", "insert_indices",
           "insert_scalar_index", "diagonal", "diagonal_axes", "diag_1d", "diag_2d", "diagflat", "trace",
           "fill_diagonal", "select", "choose_wrap", "compress_size", "extract_size", "place", "put",
           "put_along_axis", "argwhere_size", "flatnonzero_size", "unravel_index", "ravel_multi_index_wrap",
           "logspace_arrays", "ix_", "atleast_3d_many"]


@pytest.mark.parametrize("name", VMAPPED)
def test_vmap_matches_eager_per_element(name):
    _, fn, args = next(c for c in CASES if c[0] == name)[:3]
    arrays = [a for a in args if isinstance(a, (np.ndarray, np.generic))]
    batch = [np.stack([np.asarray(a), _second(a)]) for a in arrays]

    def call(*xs):
        it = iter(xs)
        return fn(fnp, *[next(it) if isinstance(a, (np.ndarray, np.generic)) else a for a in args])
    batched = fnx.vmap(call)(*[fnp.asarray(b) for b in batch])
    for i in range(2):
        one = call(*[fnp.asarray(b[i]) for b in batch])
        _compare([np.asarray(leaf)[i] for leaf in jax.tree_util.tree_leaves(batched)], one, exact_dtype=True,
                 what=f"{name} vmap element {i}")


def test_roll_with_traced_shift_under_jit_and_vmap():
    x = data((3, 5))
    shifts = np.array([0, 2, -7, 11], np.int32)
    rolled = fnx.vmap(lambda s: fnp.roll(fnp.asarray(x), s, axis=1))(fnp.asarray(shifts))
    for s, got in zip(shifts, np.asarray(rolled)):
        np.testing.assert_array_equal(got, np.roll(x, s, axis=1))
    got = fnx.jit(lambda a, s: fnp.roll(a, s))(fnp.asarray(x), fnp.asarray(np.int32(4)))
    np.testing.assert_array_equal(np.asarray(got), np.roll(x, 4))


def test_delete_with_traced_unique_indices_under_jit():
    x, obj = data((4, 6)), np.array([4, 0, -1], np.int32)
    got = fnx.jit(lambda a, o: fnp.delete(a, o, axis=1, assume_unique_indices=True))(fnp.asarray(x),
                                                                                     fnp.asarray(obj))
    np.testing.assert_array_equal(np.asarray(got), np.delete(x, obj, axis=1))


def test_sized_results_under_jit_match_jax():
    x = (data((4, 5), np.int32) > 5)
    fns = [lambda m, a: m.argwhere(a, size=6, fill_value=-1), lambda m, a: m.flatnonzero(a, size=30),
           lambda m, a: m.compress(a[0], m.arange(5) * 2, size=4, fill_value=-9)]
    for fn in fns:
        _compare(fnx.jit(lambda a: fn(fnp, a))(fnp.asarray(x)), jax.jit(lambda a: fn(jnp, a))(jnp.asarray(x)),
                 exact_dtype=True, what="sized under jit")


@pytest.mark.parametrize("fn", [
    lambda m, a: m.argwhere(a), lambda m, a: m.flatnonzero(a), lambda m, a: m.trim_zeros(a),
    lambda m, a: m.compress(a > 0, a), lambda m, a: m.delete(a, a), lambda m, a: m.extract(a, a),
    lambda m, a: m.ravel_multi_index((a,), (9,)), lambda m, a: m.choose(a, [a, a]),
], ids=["argwhere", "flatnonzero", "trim_zeros", "compress", "delete", "extract", "ravel_multi_index", "choose"])
def test_value_dependent_shapes_raise_concretization_error_under_jit(fn):
    a = np.array([0, 1, 0, 1], np.int32)
    with pytest.raises(jax.errors.ConcretizationTypeError):
        jax.jit(lambda x: fn(jnp, x))(jnp.asarray(a))
    with pytest.raises(ConcretizationError, match="traced"):
        fnx.jit(lambda x: fn(fnp, x))(fnp.asarray(a))


GRADS = [
    ("tril", lambda m, x: m.tril(x, -1), (3, 4)),
    ("triu", lambda m, x: m.triu(x, 1), (2, 3, 3)),
    ("roll", lambda m, x: m.roll(x, (1, -2), axis=(0, 1)), (3, 4)),
    ("rot90", lambda m, x: m.rot90(x, 3), (3, 4)),
    ("diagonal", lambda m, x: m.diagonal(x, 1, 0, 2), (3, 2, 4)),
    ("trace", lambda m, x: m.trace(x, -1) * m.ones((3,)), (4, 3)),
    ("diag", lambda m, x: m.diag(x, -1), (4,)),
    ("vstack_block", lambda m, x: m.block([[x, x[:, :1]], [m.vstack([x[0], x[1]]), x[:2, 1:]]]), (3, 2)),
    ("delete_insert", lambda m, x: m.insert(m.delete(x, 1, axis=0), np.array([0, 2]), x[1] * 2, axis=0), (3, 4)),
    ("resize_tile", lambda m, x: m.resize(x, (3, 5)), (2, 3)),
    ("put_along_axis", lambda m, x: m.put_along_axis(x, m.array([[2], [0]]), x[:, :1] ** 2, 1, inplace=False),
     (2, 4)),
    ("fill_diagonal", lambda m, x: m.fill_diagonal(x, x[0, :3] * 3, inplace=False), (3, 3)),
    ("select", lambda m, x: m.select([x > 0.5, x < -0.5], [x * x, -x], default=x), (3, 4)),
    ("place_put", lambda m, x: m.put(m.place(x, x > 0, x[::-1] * 2, inplace=False), m.array([1, 4]), x[:2],
                                     inplace=False), (6,)),
    ("meshgrid_stack", lambda m, x: m.dstack(m.meshgrid(x, x * 2)), (3,)),
    ("choose_split", lambda m, x: m.choose(m.array([0, 1, 0]), m.array_split(x, 2)[:1] * 2 + [x[3:]],
                                           mode="clip"), (6,)),
]


@pytest.mark.parametrize("case", GRADS, ids=[c[0] for c in GRADS])
def test_grad_matches_jax(case):
    _, fn, shape = case
    x = data(shape)
    weights = data(jax.eval_shape(lambda a: fn(jnp, a), jnp.asarray(x)).shape)

    def loss(m):
        return lambda a: m.sum(fn(m, a) * weights)
    want = jax.grad(loss(jnp))(jnp.asarray(x))
    got = fnx.grad(loss(fnp))(fnp.asarray(x))
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-5, atol=1e-6)
    got_jit = fnx.jit(fnx.grad(loss(fnp)))(fnp.asarray(x))
    np.testing.assert_allclose(np.asarray(got_jit), np.asarray(want), rtol=1e-5, atol=1e-6)


ERRORS = [
    ("tril_1d", lambda m: m.tril(m.ones(3))),
    ("diag_3d", lambda m: m.diag(m.ones((2, 2, 2)))),
    ("diagonal_1d", lambda m: m.diagonal(m.ones(3))),
    ("rot90_1d", lambda m: m.rot90(m.ones(3))),
    ("rot90_same_axes", lambda m: m.rot90(m.ones((2, 3)), axes=(0, 0))),
    ("roll_bad_axis", lambda m: m.roll(m.ones(3), 1, axis=3)),
    ("vstack_empty", lambda m: m.vstack([])),
    ("hstack_ranks", lambda m: m.hstack([m.ones(2), m.ones((2, 2))])),
    ("append_ranks", lambda m: m.append(m.ones((2, 2)), m.ones(3), axis=0)),
    ("split_unequal", lambda m: m.hsplit(m.ones(5), 2)),
    ("vsplit_1d", lambda m: m.vsplit(m.ones(3), 1) if m is not jnp else m.vsplit(m.ones(3), 2)),
    ("resize_negative", lambda m: m.resize(m.ones(3), -1)),
    ("select_lengths", lambda m: m.select([m.array([True])], [m.array([1]), m.array([2])])),
    ("select_empty", lambda m: m.select([], [])),
    ("ravel_multi_index_range", lambda m: m.ravel_multi_index((m.array([3]), m.array([1])), (2, 3))),
    ("choose_range", lambda m: m.choose(m.array([0, 3]), [m.array([1, 2]), m.array([3, 4])])),
    ("block_empty", lambda m: m.block([])),
    ("block_depths", lambda m: m.block([[m.ones(2)], m.ones(2)])),
    ("meshgrid_2d", lambda m: m.meshgrid(m.ones((2, 2)))),
    ("meshgrid_indexing", lambda m: m.meshgrid(m.ones(2), indexing="q")),
    ("tril_indices_from_1d", lambda m: m.tril_indices_from(m.ones(3))),
    ("diag_indices_from_rect", lambda m: m.diag_indices_from(m.ones((2, 3)))),
    ("fill_diagonal_inplace", lambda m: m.fill_diagonal(m.zeros((3, 3)), 1)),
    ("fill_diagonal_uneven", lambda m: m.fill_diagonal(m.zeros((2, 3, 2)), 1, inplace=False)),
    ("put_along_axis_inplace", lambda m: m.put_along_axis(m.zeros(3), m.array([0]), 1.0, 0)),
    ("put_along_axis_ranks", lambda m: m.put_along_axis(m.zeros((2, 3)), m.array([0]), 1.0, 0, inplace=False)),
    ("place_inplace", lambda m: m.place(m.arange(3), m.array([1, 0, 1]), m.array([9]))),
    ("put_inplace", lambda m: m.put(m.arange(3), 1, 9)),
    ("put_bad_mode", lambda m: m.put(m.arange(3), 1, 9, mode="fill", inplace=False)),
    ("fromiter", lambda m: m.fromiter([1, 2], dtype=float)),
    ("matrix_transpose_1d", lambda m: m.matrix_transpose(m.ones(3))),
    ("rollaxis_start", lambda m: m.rollaxis(m.ones((2, 3, 4)), 0, 5)),
    ("ix_2d", lambda m: m.ix_(m.ones((2, 2), dtype=m.int32))),
    ("ix_bool", lambda m: m.ix_(m.array([True, False]))),
    ("unstack_0d", lambda m: m.unstack(m.ones(()))),
    ("isdtype_kind", lambda m: m.isdtype(m.float32, "bogus")),
    ("can_cast_python_scalar", lambda m: m.can_cast(1, m.int8)),
    ("delete_out_of_range", lambda m: m.delete(m.arange(5), 7)),
]


@pytest.mark.parametrize("case", ERRORS, ids=[c[0] for c in ERRORS])
def test_wrong_inputs_raise_jax_exception_type(case):
    _, fn = case
    with pytest.raises(Exception) as want:
        fn(jnp)
    expected = type(want.value)
    if expected.__name__ == "IndexError" or "out of bounds for array of dimension" in str(want.value):
        expected = (IndexError, ValueError)  # JAX reports delete's bad index as a bad axis; numpy as IndexError
    with pytest.raises(expected) as got:
        fn(fnp)
    assert "\n  at " in str(got.value), "fnx errors name the user's line"


def test_dtype_queries_and_names():
    for name in ["generic", "number", "inexact", "floating", "integer", "signedinteger", "unsignedinteger",
                 "complexfloating", "character", "flexible", "object_"]:
        assert getattr(fnp, name) is getattr(jnp, name), name
    for name in ["int_", "uint", "float_", "double", "single"]:
        assert np.dtype(getattr(fnp, name)) == np.dtype(getattr(jnp, name)), name
    dts = [fnp.bool_, fnp.int8, fnp.uint8, fnp.int32, fnp.float16, fnp.bfloat16, fnp.float32, fnp.float64]
    kinds = [fnp.generic, fnp.number, fnp.inexact, fnp.floating, fnp.integer, fnp.signedinteger,
             fnp.unsignedinteger, fnp.bfloat16, fnp.float32]
    for a in dts:
        for k in kinds:
            assert fnp.issubdtype(a, k) == jnp.issubdtype(a, k), (a, k)
        for b in dts:
            for casting in ("safe", "same_kind", "unsafe"):
                assert fnp.can_cast(a, b, casting) == jnp.can_cast(a, b, casting), (a, b, casting)
            assert fnp.isdtype(a, b) == jnp.isdtype(a, b), (a, b)
        for kind in ["bool", "signed integer", "unsigned integer", "integral", "real floating", "complex floating",
                     "numeric", ("bool", "integral")]:
            assert fnp.isdtype(a, kind) == jnp.isdtype(a, kind), (a, kind)
    assert fnp.can_cast(fnp.ones(2, fnp.int8), fnp.int16)
    for value in [1, 1.5, True, 1j, np.float32(1), np.array(1.0), np.ones(2), [1], "a", None]:
        assert fnp.isscalar(value) == jnp.isscalar(value), value
        assert fnp.iscomplexobj(value) == jnp.iscomplexobj(value), value
        assert fnp.iterable(value) == jnp.iterable(value), value
    assert fnp.isscalar(fnp.ones(())) and not fnp.isscalar(fnp.ones(1))
    assert fnp.isrealobj(fnp.ones(2)) and not fnp.isrealobj(np.ones(2, np.complex64))


def test_frombuffer_fromstring_and_index_helpers():
    buffer = np.arange(6, dtype=np.float32).tobytes()
    _compare(fnp.frombuffer(buffer, dtype=fnp.float32, count=3, offset=4),
             jnp.frombuffer(buffer, dtype=jnp.float32, count=3, offset=4), True, "frombuffer")
    _compare(fnp.fromstring("1, 2, 3.5", sep=","), jnp.fromstring("1, 2, 3.5", sep=","), True, "fromstring")
    assert fnp.s_[1:2, ::3] == np.s_[1:2, ::3] and fnp.index_exp[..., 0] == np.index_exp[..., 0]
    x = data((4, 5))
    np.testing.assert_array_equal(np.asarray(fnp.asarray(x)[fnp.ix_(fnp.array([3, 0]), fnp.array([1, 4, 2]))]),
                                  x[np.ix_([3, 0], [1, 4, 2])])
    rows, cols = fnp.tril_indices_from(fnp.asarray(x), 1)
    np.testing.assert_array_equal(np.asarray(fnp.asarray(x)[rows, cols]), x[np.tril_indices_from(x, 1)])
