"""Assertions shared by the test files (tests/ is on sys.path through tests/conftest.py)."""
import numpy as np

from fnx import tree_util


def assert_tree_close(actual, expected, rtol: float = 1e-5, atol: float = 1e-6, exact_dtypes: bool = False) -> None:
    """Same structure and shapes; floats close, everything else equal (and of equal dtype with exact_dtypes)."""
    assert tree_util.tree_structure(actual) == tree_util.tree_structure(expected)
    for a, e in zip(tree_util.tree_leaves(actual), tree_util.tree_leaves(expected)):
        a, e = np.asarray(a), np.asarray(e)
        assert a.shape == e.shape, (a.shape, e.shape)
        if np.issubdtype(e.dtype, np.inexact):
            np.testing.assert_allclose(a.astype(np.float64), e.astype(np.float64), rtol=rtol, atol=atol)
        else:
            if exact_dtypes: assert a.dtype == e.dtype, (a.dtype, e.dtype)
            np.testing.assert_array_equal(a, e)
