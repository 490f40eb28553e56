"""Float -> integer casts saturate as XLA's do (NaN -> 0, beyond the range -> its nearest end), on every backend,
eager and fused under jit, from every float width (the fuzzer found float16 inf -> int32 giving INT_MIN on cpu:
the clamp constant overflowed float16, and float32 stopped at 2147483520)."""
import ml_dtypes
import numpy as np
import pytest

import fnx
import fnx.numpy as jnp

SOURCES = {
    "float16": np.array([np.inf, -np.inf, np.nan, 40000, -40000, 65504, 3.7, -3.7, 127.9, 128, -129, -0.7], np.float16),
    "bfloat16": np.array([3e38, -1e10, np.inf, -np.inf, np.nan, 300, -300, 65536, 1.5, -2.0 ** 31], ml_dtypes.bfloat16),
    "float32": np.array([3e9, -3e9, np.inf, -np.inf, np.nan, 2147483520.0, 2.0 ** 31, -2.0 ** 31, 5e9, 255.9, 256,
                         -1.5, 2.0 ** 63, 2.0 ** 64], np.float32),
    "float64": np.array([3e9, -3e19, np.inf, np.nan, 2.0 ** 63, 2.0 ** 64, -1, 1.5e19, 9.3e18, -2.0 ** 63,
                         4294967295.5, -2147483648.9], np.float64),
}
TARGETS = [np.int8, np.uint8, np.int16, np.uint16, np.int32, np.uint32, np.int64, np.uint64]


def _saturating(x: np.ndarray, dtype) -> np.ndarray:
    """The reference, one element at a time in Python integers."""
    info = np.iinfo(dtype)
    out = []
    for v in x.astype(np.float64):
        if np.isnan(v): out.append(0)
        elif v >= info.max: out.append(info.max)
        elif v <= info.min: out.append(info.min)
        else: out.append(int(np.trunc(v)))
    return np.array(out, dtype)


@pytest.mark.parametrize("source", list(SOURCES))
@pytest.mark.parametrize("target", TARGETS, ids=lambda t: np.dtype(t).name)
def test_float_to_int_saturates(device, source, target):
    x = SOURCES[source]
    expected = _saturating(x, target)
    np.testing.assert_array_equal(np.asarray(jnp.asarray(x).astype(target)), expected)
    np.testing.assert_array_equal(np.asarray(fnx.jit(lambda v: (v * 1).astype(target))(jnp.asarray(x))), expected)


@pytest.mark.parametrize("source", ["float16", "float32"])
@pytest.mark.parametrize("target", [np.int8, np.uint8, np.int16, np.int32, np.uint32], ids=lambda t: np.dtype(t).name)
def test_float_to_int_matches_jax(source, target):
    jax_numpy = pytest.importorskip("jax.numpy")
    x = SOURCES[source]
    np.testing.assert_array_equal(np.asarray(fnx.jit(lambda v: v.astype(target))(jnp.asarray(x))),
                                  np.asarray(jax_numpy.asarray(x).astype(target)))
