"""lax.conv_general_dilated and its forms against jax.lax (the oracle: JAX defines the semantics): 1-, 2- and 3-d,
strides, every padding form (negative too), lhs and rhs dilation, feature groups, string and numeric dimension
numbers; grads of input and kernel against jax.grad; vmap and jit equal to eager; float16; empty outputs; errors."""
import numpy as np
import pytest

import fnx
import fnx.lax as lax

jax = pytest.importorskip("jax")

RNG = np.random.default_rng(7)


def _pair(x_shape, w_shape, dtype=np.float32):
    return RNG.standard_normal(x_shape).astype(dtype), RNG.standard_normal(w_shape).astype(dtype)


CASES = {  # name -> (input shape, kernel shape, keyword arguments)
    "1d_valid": ((2, 3, 11), (4, 3, 3), dict(window_strides=(1,), padding="VALID")),
    "1d_same_stride": ((1, 2, 10), (3, 2, 4), dict(window_strides=(3,), padding="SAME")),
    "2d_same_lower": ((2, 3, 7, 6), (5, 3, 2, 3), dict(window_strides=(2, 1), padding="SAME_LOWER")),
    "2d_pairs_negative": ((1, 2, 9, 8), (2, 2, 3, 3), dict(window_strides=(1, 2), padding=((2, -1), (0, 3)))),
    "2d_dilated": ((2, 2, 8, 9), (3, 2, 3, 2), dict(window_strides=(1, 1), padding=((1, 1), (2, 0)),
                                                    lhs_dilation=(2, 1),
                                                    rhs_dilation=(1, 3))),
    "2d_groups_nhwc": ((2, 6, 5, 4), (3, 3, 2, 8), dict(window_strides=(1, 1), padding="SAME",
                                                       dimension_numbers=("NHWC", "HWIO", "NHWC"),
                                                       feature_group_count=2)),
    "2d_depthwise": ((1, 7, 7, 4), (3, 3, 1, 4), dict(window_strides=(2, 2), padding="VALID",
                                                     dimension_numbers=("NHWC", "HWIO", "NHWC"),
                                                     feature_group_count=4)),
    "2d_mixed_specs": ((3, 2, 5, 6), (2, 3, 4, 2), dict(window_strides=(1, 1), padding="VALID",
                                                       dimension_numbers=("HCNW", "IWOH", "NWHC"))),
    "3d": ((1, 2, 5, 4, 6), (2, 2, 2, 3, 2), dict(window_strides=(1, 2, 1), padding="SAME")),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_values_grads_and_vmap_match_jax(name):
    x_shape, w_shape, kwargs = CASES[name]
    x, w = _pair(x_shape, w_shape)
    want = np.asarray(jax.lax.conv_general_dilated(x, w, **kwargs))
    got = lax.conv_general_dilated(x, w, **kwargs)
    assert got.shape == want.shape and got.dtype == want.dtype
    np.testing.assert_allclose(np.asarray(got), want, rtol=1e-5, atol=1e-5)
    jitted = fnx.jit(lambda x, w: lax.conv_general_dilated(x, w, **kwargs))
    np.testing.assert_allclose(np.asarray(jitted(x, w)), want, rtol=1e-5, atol=1e-5)
    cotangent = RNG.standard_normal(want.shape).astype(np.float32)

    def loss(lax_module):
        return lambda x, w: (lax_module.conv_general_dilated(x, w, **kwargs) * cotangent).sum()
    ours = fnx.grad(loss(lax), argnums=(0, 1))(x, w)
    theirs = jax.grad(loss(jax.lax), argnums=(0, 1))(x, w)
    for a, b in zip(ours, theirs): np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-4, atol=1e-4)
    xs = np.stack([x, x * 2])
    batched = fnx.vmap(lambda x: lax.conv_general_dilated(x, w, **kwargs))(xs)
    np.testing.assert_allclose(np.asarray(batched), np.stack([want, 2 * want]), rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize("padding", ["SAME", "VALID", ((1, 2), (0, 1))])
@pytest.mark.parametrize("transpose_kernel", [False, True])
def test_conv_transpose_matches_jax(padding, transpose_kernel):
    x, w = _pair((2, 5, 6, 3), (3, 2, 4, 3) if transpose_kernel else (3, 2, 3, 4))
    kwargs = dict(strides=(2, 1), padding=padding, dimension_numbers=("NHWC", "HWIO", "NHWC"),
                  transpose_kernel=transpose_kernel)
    want = np.asarray(jax.lax.conv_transpose(x, w, **kwargs))
    got = lax.conv_transpose(x, w, **kwargs)
    assert got.shape == want.shape
    np.testing.assert_allclose(np.asarray(got), want, rtol=1e-5, atol=1e-5)


def test_conv_and_general_padding_forms():
    x, w = _pair((2, 3, 8, 8), (4, 3, 3, 3))
    np.testing.assert_allclose(np.asarray(lax.conv(x, w, (2, 2), "SAME")),
                               np.asarray(jax.lax.conv(x, w, (2, 2), "SAME")), rtol=1e-5, atol=1e-5)
    got = lax.conv_with_general_padding(x, w, (1, 1), ((1, 0), (2, 1)), (1, 2), (2, 1))
    want = jax.lax.conv_with_general_padding(x, w, (1, 1), ((1, 0), (2, 1)), (1, 2), (2, 1))
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-5, atol=1e-5)
    assert lax.conv_dimension_numbers(x.shape, w.shape, ("NHWC", "HWIO", "NHWC")) == \
        tuple(tuple(s) for s in jax.lax.conv_dimension_numbers(x.shape, w.shape, ("NHWC", "HWIO", "NHWC")))


def test_float16_int_and_empty():
    x, w = _pair((1, 2, 6, 6), (3, 2, 3, 3), np.float16)
    got = lax.conv_general_dilated(x, w, (1, 1), "SAME")
    assert got.dtype == np.float16
    want = jax.lax.conv_general_dilated(x.astype(np.float32), w.astype(np.float32), (1, 1), "SAME")
    np.testing.assert_allclose(np.asarray(got, np.float32), np.asarray(want), rtol=1e-2, atol=1e-2)
    xi, wi = RNG.integers(-5, 5, (1, 1, 5, 5)).astype(np.int32), RNG.integers(-3, 3, (2, 1, 2, 2)).astype(np.int32)
    np.testing.assert_array_equal(np.asarray(lax.conv(xi, wi, (1, 1), "VALID")),
                                  np.asarray(jax.lax.conv(xi, wi, (1, 1), "VALID")))
    empty = lax.conv(np.ones((2, 1, 2, 2), np.float32), np.ones((3, 1, 3, 3), np.float32), (1, 1), "VALID")
    assert empty.shape == (2, 3, 0, 0)
    wide = lax.conv_general_dilated(np.ones((2, 4, 3), np.float32), np.ones((5, 4, 3), np.float32), (1,), "VALID",
                                    preferred_element_type=np.float16)
    assert wide.dtype == np.float16 and np.all(np.asarray(wide) == 12)


def test_errors_name_the_shapes():
    x, w = _pair((1, 4, 5, 5), (2, 3, 3, 3))
    with pytest.raises(Exception, match=r"input \(1, 4, 5, 5\) has 4 features and kernel \(2, 3, 3, 3\)"):
        lax.conv(x, w, (1, 1), "VALID")
    with pytest.raises(ValueError, match="padding must be"):
        lax.conv(x, np.ones((2, 4, 3, 3), np.float32), (1, 1), "FULL")
    with pytest.raises(ValueError, match="window_strides needs 2 positive integers"):
        lax.conv(x, np.ones((2, 4, 3, 3), np.float32), (1,), "VALID")
    with pytest.raises(ValueError, match="string padding with lhs_dilation"):
        lax.conv_general_dilated(x, np.ones((2, 4, 3, 3), np.float32), (1, 1), "SAME", lhs_dilation=(2, 2))
    with pytest.raises(NotImplementedError, match="batch_group_count"):
        lax.conv_general_dilated(x, np.ones((2, 4, 3, 3), np.float32), (1, 1), "VALID", batch_group_count=2)
