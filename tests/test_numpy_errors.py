"""Errors from fnx.numpy: the documented type, and a message naming the op, the shapes/dtypes and the user's line."""
import numpy as np
import pytest

import fnx
import fnx.numpy as jnp
from fnx.errors import ConcretizationError, ShapeError

THIS_FILE = "test_numpy_errors.py"


def raises(exc_type, fn, *words):
    """fn() raises exc_type (also under jit when it takes arrays), with every word and this file in the message."""
    with pytest.raises(exc_type) as info:
        fn()
    message = str(info.value)
    for word in words + (THIS_FILE,):
        assert word in message, (word, message)
    return message


def test_shape_mismatch_in_add_and_matmul(device):
    a, b = jnp.ones((2, 3)), jnp.ones((4, 3))
    raises(ShapeError, lambda: a + b, "add", "(2, 3)", "(4, 3)")
    raises(TypeError, lambda: jnp.multiply(a, jnp.ones(2)), "multiply", "(2,)")
    raises(ShapeError, lambda: a @ b, "matmul", "[2, 3]", "[4, 3]")
    raises(ShapeError, lambda: fnx.jit(lambda x, y: x @ y)(a, b), "matmul", "[2, 3]", "[4, 3]")
    raises(ShapeError, lambda: jnp.dot(jnp.ones(3), jnp.ones(4)), "dot_general", "[3]", "[4]")
    raises(ShapeError, lambda: jnp.concatenate([a, jnp.ones((2, 4))], axis=0), "concatenate", "[2, 4]")
    raises(ShapeError, lambda: jnp.stack([a, b]), "stack", "[2, 3]", "[4, 3]")
    raises(ShapeError, lambda: jnp.reshape(a, (4, 2)), "reshape", "(4, 2)")
    raises(ShapeError, lambda: jnp.broadcast_to(a, (3, 3)), "broadcast_to", "(3, 3)")
    raises(ShapeError, lambda: jnp.einsum("ij,jk->ik", a, b), "einsum", "'j'")
    raises(ShapeError, lambda: a.at[0].set(jnp.ones(5)), "at[].set", "(3,)")


def test_out_of_range_axis(device):
    a = jnp.ones((2, 3))
    raises(ValueError, lambda: jnp.sum(a, axis=2), "sum", "axis 2", "rank 2")
    raises(ValueError, lambda: jnp.argmax(a, axis=-3), "argmax", "axis -3")
    raises(ValueError, lambda: jnp.mean(a, axis=(0, 5)), "mean", "axis 5")
    raises(ValueError, lambda: jnp.expand_dims(a, 4), "expand_dims")
    raises(ValueError, lambda: jnp.cumsum(a, axis=7), "cumsum")
    raises(ValueError, lambda: jnp.squeeze(a, 0), "squeeze", "[2, 3]")
    raises(ValueError, lambda: jnp.max(jnp.ones((0, 2))), "max", "[0, 2]")
    raises(ValueError, lambda: jnp.split(a, 2, axis=1), "split", "3 into 2")
    raises(IndexError, lambda: jnp.ones((0, 3))[0], "index 0", "size 0")  # a[5] clamps, as in JAX
    raises(IndexError, lambda: a[0, 0, 0], "too many indices")


def test_bad_dtypes(device):
    f = jnp.ones(3)
    raises(TypeError, lambda: f & f, "bitwise_and", "float32")
    raises(TypeError, lambda: jnp.left_shift(f, 1), "left_shift", "float32")
    raises(TypeError, lambda: ~f, "invert", "float32")
    raises(TypeError, lambda: fnx.jit(lambda x: x | 1)(f), "bitwise_or", "float32")
    raises(TypeError, lambda: fnx.lax.lt(1j, 2j), "lt", "complex")  # (jnp.less orders complex values; lax.lt not)
    raises(TypeError, lambda: jnp.floor(1 + 2j), "floor", "complex")
    raises(TypeError, lambda: jnp.negative(jnp.array([True])), "negative", "bool")
    raises(TypeError, lambda: jnp.take(f, f), "take", "float32")
    raises(IndexError, lambda: f[jnp.array([0.5])], "integers or bools", "float32")
    raises(ValueError, lambda: jnp.arange(3) ** -1, "power", "int32")


def test_concretization_under_jit(device):
    x = jnp.arange(4.0)
    raises(fnx.errors.NonConcreteBooleanIndexError, lambda: fnx.jit(lambda a: a[a > 1])(x), "boolean indexing", "[4]",
           "where")
    assert issubclass(fnx.errors.NonConcreteBooleanIndexError, IndexError)  # (as JAX's)
    raises(ConcretizationError, lambda: fnx.jit(lambda a: jnp.where(a > 1))(x), "nonzero", "[4]")

    def branchy(a):
        if a.sum() > 0:
            return a
        return -a
    raises(ConcretizationError, lambda: fnx.jit(branchy)(x), "shape ()", "where")
    raises(ConcretizationError, lambda: fnx.jit(lambda a: jnp.arange(a[0]))(x), "arange")
    raises(ConcretizationError, lambda: fnx.jit(lambda a, r: jnp.repeat(a, r))(x, jnp.arange(4)), "repeat", "[4]")
    np.testing.assert_array_equal(np.asarray(branchy(x)), np.arange(4.0))  # eager Python branching works
