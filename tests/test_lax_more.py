"""The last jax.lax names: mulhi (every integer width, signs, against jax.lax), broadcast_shapes, the convolution
shape helpers, approx_max_k / approx_min_k (exact here), index_take, and the option enums."""
import numpy as np
import pytest

import fnx
import fnx.lax as lax

jax = pytest.importorskip("jax")
L = jax.lax


@pytest.mark.parametrize("dtype", [np.int8, np.uint8, np.int16, np.uint16, np.int32, np.uint32])
def test_mulhi_matches_jax(dtype):
    info = np.iinfo(dtype)
    rng = np.random.default_rng(info.bits)
    x, y = (rng.integers(info.min, info.max, 500, dtype=np.int64, endpoint=True).astype(dtype) for _ in range(2))
    x[:4], y[:4] = [info.min, info.max, 0, -1 if info.min else 1], [info.min, info.max, info.max, info.max]
    np.testing.assert_array_equal(np.asarray(lax.mulhi(x, y)), np.asarray(L.mulhi(x, y)))
    np.testing.assert_array_equal(np.asarray(fnx.jit(lax.mulhi)(x, y)), np.asarray(L.mulhi(x, y)))
    with pytest.raises(TypeError, match="mulhi"):
        lax.mulhi(x.astype(np.float32), y.astype(np.float32))


def test_shape_helpers_match_jax():
    assert lax.broadcast_shapes((2, 1), (3,), ()) == L.broadcast_shapes((2, 1), (3,), ())
    with pytest.raises(ValueError, match="broadcast_shapes"):
        lax.broadcast_shapes((2,), (3,))
    for specs in (("NCHW", "OIHW", "NCHW"), ("NHWC", "HWIO", "NHWC")):
        assert lax.conv_general_permutations(specs) == L.conv_general_permutations(specs)
    for padding in ("SAME", "VALID", [(1, 2), (0, 1)]):
        args = ((2, 3, 9, 8), (4, 3, 3, 2), (2, 1), padding, ("NCHW", "OIHW", "NCHW"))
        assert lax.conv_general_shape_tuple(*args) == tuple(int(d) for d in L.conv_general_shape_tuple(*args))
        nhwc = ((1, 5, 6, 3), (3, 2, 3, 4), (2, 2), padding, ("NHWC", "HWIO", "NHWC"))
        assert lax.conv_transpose_shape_tuple(*nhwc) == tuple(int(d) for d in L.conv_transpose_shape_tuple(*nhwc))
    assert lax.conv_shape_tuple((2, 3, 9, 9), (4, 3, 3, 3), (2, 2), [(1, 1), (0, 0)]) == \
        tuple(int(d) for d in L.conv_shape_tuple((2, 3, 9, 9), (4, 3, 3, 3), (2, 2), [(1, 1), (0, 0)]))


def test_approx_top_k_index_take_and_enums():
    v = np.random.default_rng(2).standard_normal((4, 9)).astype(np.float32)
    for ours_fn, theirs_fn in ((lax.approx_max_k, L.approx_max_k), (lax.approx_min_k, L.approx_min_k)):
        for dim in (-1, 0):
            for ours, theirs in zip(ours_fn(v, 3, dim), theirs_fn(v, 3, dim)):
                np.testing.assert_array_equal(np.asarray(ours), np.asarray(theirs))
    src, idx = np.arange(24).reshape(2, 3, 4), np.array([[0, 1], [1, 2]])
    np.testing.assert_array_equal(np.asarray(lax.index_take(src, idx, (0, 2))),
                                  np.asarray(L.index_take(src, idx, (0, 2))))
    assert [m.name for m in lax.Precision] == [m.name for m in L.Precision]
    assert [m.name for m in lax.GatherScatterMode] == [m.name for m in L.GatherScatterMode]
