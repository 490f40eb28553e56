"""fnx.save / fnx.load: round trips of pytrees of arrays of every dtype, no pickling, clear errors."""
import numpy as np
import pytest

import fnx
import fnx.numpy as jnp
from fnx import dtypes


def test_round_trip_of_a_nested_tree(tmp_path):
    rng = np.random.default_rng(0)
    tree = {"params": {"w": jnp.asarray(rng.standard_normal((3, 4)).astype(np.float32)), "b": jnp.zeros(4)},
            "step": jnp.asarray(np.int32(7)), "history": [jnp.arange(3), None, (jnp.ones(2, jnp.bfloat16),)]}
    fnx.save(tmp_path / "ckpt.npz", tree)
    back = fnx.load(tmp_path / "ckpt.npz")
    assert fnx.tree_util.tree_structure(back) == fnx.tree_util.tree_structure(tree)
    for a, b in zip(fnx.tree_util.tree_leaves(tree), fnx.tree_util.tree_leaves(back)):
        assert isinstance(b, fnx.Array) and a.dtype == b.dtype and a.shape == b.shape
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


@pytest.mark.parametrize("dtype", dtypes.DTYPES, ids=lambda d: d.name)
def test_every_dtype(tmp_path, dtype):
    x = np.arange(6).reshape(2, 3).astype(dtype.np)
    fnx.save(tmp_path / "x.npz", {"x": x})
    np.testing.assert_array_equal(np.asarray(fnx.load(tmp_path / "x.npz")["x"]), x)


def test_unsupported_nodes_and_foreign_files_raise(tmp_path):
    with pytest.raises(TypeError, match="dict keys must be strings"):
        fnx.save(tmp_path / "a.npz", {1: jnp.ones(2)})
    np.savez(tmp_path / "plain.npz", x=np.ones(2))
    with pytest.raises(ValueError, match="not written by fnx.save"):
        fnx.load(tmp_path / "plain.npz")
