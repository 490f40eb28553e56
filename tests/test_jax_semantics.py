"""fnx against JAX on the semantics users rely on without noticing: inputs JAX rejects, type promotion over every
pair of dtypes, reduction dtypes, weak types, reprs, vmap over keywords, collectives over several axes, gradients at
ties, out-of-bounds indexing, random bits. JAX is the oracle; where fnx decides differently on purpose, the test
says so and docs/JAX_DIFFERENCES.md gives the reason."""
import contextlib
import itertools

import numpy as np
import pytest

jax = pytest.importorskip("jax")

import jax.numpy as jjnp  # noqa: E402

import fnx  # noqa: E402
import fnx.numpy as jnp  # noqa: E402
from fnx import dtypes  # noqa: E402


@contextlib.contextmanager
def jax_x64(enabled: bool):
    previous = jax.config.jax_enable_x64
    jax.config.update("jax_enable_x64", enabled)
    try:
        yield
    finally:
        jax.config.update("jax_enable_x64", previous)


# ---- type promotion: every pair of dtypes, strong and weak ----

WEAK = [(dtypes.int32, True), (dtypes.float32, True), (dtypes.int64, True), (dtypes.float64, True)]
OPERANDS = [(d, False) for d in dtypes.DTYPES] + WEAK


def _is_64(operand) -> bool:
    return operand[0].itemsize == 8


def _jax_value(dtype, weak):
    """A JAX value of `dtype`: weak ones are Python scalars (64-bit weak: a weak value that needs 64 bits)."""
    if not weak: return jjnp.ones((), dtype.np)
    if dtype.itemsize == 4: return 1 if dtype.is_int else 1.0
    return jjnp.asarray(2**40) if dtype.is_int else jjnp.asarray(1e300)


def _jax_result_type(a, b):
    """JAX's answer: with x64 off for operands of at most 32 bits, with x64 on when one of them is 64-bit (fnx keeps
    explicit 64-bit dtypes, as JAX with x64 does, but never forms one from narrower operands, as JAX without)."""
    with jax_x64(_is_64(a) or _is_64(b)):
        dtype, weak = jax.dtypes.result_type(_jax_value(*a), _jax_value(*b), return_weak_type_flag=True)
    return str(dtype), bool(weak)


def test_promotion_matches_jax_for_every_pair():
    mismatches = []
    for a, b in itertools.product(OPERANDS, OPERANDS):
        dtype, weak = dtypes.result_type(a, b)
        if (dtype.name, weak) != _jax_result_type(a, b):
            mismatches.append((a, b, (dtype.name, weak), _jax_result_type(a, b)))
    assert not mismatches


def test_int32_plus_uint32_is_int32():
    out = jnp.ones(2, jnp.int32) + jnp.ones(2, jnp.uint32)
    assert out.dtype == jnp.int32 and out.tolist() == [2, 2]


# ---- inputs JAX rejects ----

SHAPE_CALLS = {
    "zeros": lambda m, r: m.zeros((2.5,)),
    "zeros_scalar": lambda m, r: m.zeros(2.5),
    "ones": lambda m, r: m.ones((2.5,)),
    "ones_numpy_float": lambda m, r: m.ones((np.float32(2),)),
    "full": lambda m, r: m.full((2.5, 2), 1.0),
    "empty": lambda m, r: m.empty((2.5,)),
    "zeros_like": lambda m, r: m.zeros_like(m.ones(2), shape=(2.5,)),
    "reshape": lambda m, r: m.ones(4).reshape((2.0, 2)),
    "broadcast_to": lambda m, r: m.broadcast_to(m.ones(1), (2.0,)),
    "tile": lambda m, r: m.tile(m.ones(1), (2.5,)),
    "eye": lambda m, r: m.eye(2.5),
    "eye_m": lambda m, r: m.eye(2, 2.5),
    "linspace": lambda m, r: m.linspace(0.0, 1.0, 2.5),
    "sum_axis": lambda m, r: m.sum(m.ones(2), axis=0.0),
    "negative": lambda m, r: m.ones((-1,)),
    "uniform": lambda m, r: r.uniform(r.key(0), (2.5,)),
    "normal": lambda m, r: r.normal(r.key(0), (2, 1.5)),
    "randint": lambda m, r: r.randint(r.key(0), (2.5,), 0, 3),
    "bernoulli": lambda m, r: r.bernoulli(r.key(0), 0.5, (2.5,)),
    "split": lambda m, r: r.split(r.key(0), 2.5),
}


@pytest.mark.parametrize("name", SHAPE_CALLS)
def test_non_integer_shapes_raise_type_error(name):
    with pytest.raises(TypeError):
        SHAPE_CALLS[name](jjnp, jax.random)
    with pytest.raises(TypeError, match="integer|nonnegative"):
        SHAPE_CALLS[name](jnp, fnx.random)


def test_integer_like_shapes_are_accepted():
    assert jnp.zeros((np.int64(2), True)).shape == jjnp.zeros((np.int64(2), True)).shape == (2, 1)
    assert jnp.zeros(jnp.array(3)).shape == (3,)
    assert jnp.ones(4).reshape(np.array([-1, 2])).shape == (2, 2)
