"""64-bit types follow JAX's jax_enable_x64 flag: off by default (host float64/int64 values enter as 32-bit, requested
64-bit dtypes are narrowed with JAX's warning), on through fnx.config.update, the environment or enable_x64."""
import os
import subprocess
import sys
import threading
import warnings

import numpy as np
import pytest

import fnx
import fnx.numpy as jnp
from fnx import dtypes

jax = pytest.importorskip("jax")
jjnp = pytest.importorskip("jax.numpy")


@pytest.fixture(params=[False, True], ids=["x64_off", "x64_on"])
def x64_both(request):
    """fnx and JAX with the same x64 flag."""
    before = (fnx.config.read("jax_enable_x64"), jax.config.jax_enable_x64)
    fnx.config.update("jax_enable_x64", request.param)
    jax.config.update("jax_enable_x64", request.param)
    yield request.param
    fnx.config.update("jax_enable_x64", before[0])
    jax.config.update("jax_enable_x64", before[1])


def _cases(m, random):
    """name -> a call returning an array, written once for jax.numpy and fnx.numpy."""
    key = random.PRNGKey(0)
    return {
        "asarray(numpy float64)": lambda: m.asarray(np.ones(2)),
        "asarray(numpy int64)": lambda: m.asarray(np.arange(3)),
        "asarray(numpy uint64)": lambda: m.asarray(np.arange(3, dtype=np.uint64)),
        "asarray(numpy float64 scalar)": lambda: m.asarray(np.float64(1.5)),
        "array(list of floats)": lambda: m.array([1.0, 2.0]),
        "array(list of ints)": lambda: m.array([1, 2]),
        "asarray(Python float)": lambda: m.asarray(1.0),
        "ones()": lambda: m.ones(2),
        "zeros(int64)": lambda: m.zeros(2, "int64"),
        "ones(float64)": lambda: m.ones(2, m.float64),
        "full(Python float)": lambda: m.full(2, 1.5),
        "astype(float64)": lambda: m.ones(2, m.float32).astype(m.float64),
        "arange(int)": lambda: m.arange(3),
        "arange(float)": lambda: m.arange(3.0),
        "linspace": lambda: m.linspace(0, 1, 3),
        "eye": lambda: m.eye(2),
        "tri": lambda: m.tri(2),
        "indices": lambda: m.indices((2,)),
        "sum(int32)": lambda: m.sum(m.ones(3, m.int32)),
        "sum(bool)": lambda: m.sum(m.ones(3, bool)),
        "sum(uint8)": lambda: m.sum(m.ones(3, m.uint8)),
        "cumsum(bool)": lambda: m.cumsum(m.ones(3, bool)),
        "mean(int)": lambda: m.mean(m.arange(3)),
        "sin(int)": lambda: m.sin(m.arange(3)),
        "argmax": lambda: m.argmax(m.ones(3)),
        "argsort": lambda: m.argsort(m.ones(3)),
        "nonzero": lambda: m.nonzero(m.ones(3))[0],
        "count_nonzero": lambda: m.count_nonzero(m.ones(3)),
        "bincount": lambda: m.bincount(m.arange(3), length=3),
        "float32 * 2.0": lambda: m.ones(2, m.float32) * 2.0,
        "int32 + uint32": lambda: m.ones(2, m.int32) + m.ones(2, m.uint32),
        "float32 + numpy float64": lambda: m.ones(2, m.float32) + np.ones(2),
        "where(Python scalars)": lambda: m.where(m.ones(2) > 0, 1.0, 2),
        "True // True": lambda: m.asarray(True) // True,
        "random.normal": lambda: random.normal(key, (2,)),
        "random.uniform(float64)": lambda: random.uniform(key, (2,), dtype=m.float64),
        "random.randint": lambda: random.randint(key, (2,), 0, 4),
        "jit(numpy float64)": lambda: (jax if m is jjnp else fnx).jit(lambda x: x * 2)(np.ones(2)),
        "jit(ones inside)": lambda: (jax if m is jjnp else fnx).jit(lambda x: x + m.ones(2))(np.ones(2, np.int8)),
    }


@pytest.mark.parametrize("name", sorted(_cases(jjnp, jax.random)))
def test_dtypes_match_jax_in_both_modes(x64_both, name):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        expected = _cases(jjnp, jax.random)[name]().dtype
        got = _cases(jnp, fnx.random)[name]().dtype
    assert np.dtype(got) == np.dtype(expected), f"{name} with x64={x64_both}: fnx {got}, JAX {expected}"


def test_values_enter_as_float32_when_x64_is_off():
    x = np.random.default_rng(0).standard_normal(1000)  # float64, as numpy makes it
    got = fnx.jit(lambda v: jnp.sum(v * v))(x)
    assert got.dtype == np.float32
    expected = np.sum(x.astype(np.float32) * x.astype(np.float32), dtype=np.float64)
    np.testing.assert_allclose(np.asarray(got), expected, rtol=1e-5)
    assert fnx.device_put(x).dtype == np.float32 and fnx.device_put(np.arange(3)).dtype == np.int32


def test_requested_64_bit_dtypes_warn_as_jax_does():
    for _ in range(2):  # (every call warns, as JAX's do: an eager ones runs as jit of itself)
        with pytest.warns(UserWarning, match="Explicitly requested dtype float64 requested in ones is not available"):
            assert jnp.ones(2, jnp.float64).dtype == np.float32
    with pytest.warns(UserWarning, match="requested in astype"):
        assert jnp.arange(3).astype("int64").dtype == np.int32
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # host values convert silently, as in JAX
        assert jnp.asarray(np.ones(2)).dtype == np.float32


def test_big_python_ints_need_x64():
    with pytest.raises(OverflowError, match="too large to convert to int32"):
        jnp.asarray(2**40)
    with pytest.raises(OverflowError, match="jax_enable_x64"):
        jnp.array([1, 2**40])
    with fnx.enable_x64():
        big = jnp.asarray(2**40) + 1
        assert big.dtype == np.int64 and int(big) == 2**40 + 1


def test_x64_computes_in_float64():
    with fnx.enable_x64(True):
        x = jnp.asarray(np.full(3, 1.0 + 2.0**-40))
        assert x.dtype == np.float64
        got = fnx.jit(lambda v: (v - 1.0) * 2.0**40)(x)
        np.testing.assert_array_equal(np.asarray(got), np.ones(3))  # float32 would give 0
        grad = fnx.grad(lambda v: jnp.sum(jnp.sin(v)))(x)
        assert grad.dtype == np.float64
        np.testing.assert_allclose(np.asarray(grad), np.cos(np.full(3, 1.0 + 2.0**-40)), rtol=1e-15)


def test_one_jitted_function_under_both_modes():
    f = fnx.jit(lambda x: x + jnp.ones(2))
    a = f(np.ones(2, np.int8))
    with fnx.enable_x64():
        b = f(np.ones(2, np.int8))
    c = f(np.ones(2, np.int8))
    assert (a.dtype, b.dtype, c.dtype) == (np.float32, np.float64, np.float32)
    for v in (a, b, c): np.testing.assert_array_equal(np.asarray(v), [2, 2])


def test_enable_x64_is_per_thread():
    seen = {}

    def other():
        seen["thread"] = jnp.ones(1).dtype

    with fnx.enable_x64():
        thread = threading.Thread(target=other)
        thread.start()
        thread.join()
        seen["block"] = jnp.ones(1).dtype
    assert seen == {"thread": np.float32, "block": np.float64}
    assert not dtypes.x64_enabled()


def test_config_read_and_update():
    assert fnx.config.jax_enable_x64 is False and fnx.config.read("jax_enable_x64") is False
    fnx.config.update("jax_enable_x64", True)
    try:
        assert fnx.config.jax_enable_x64 is True and jnp.asarray(np.ones(1)).dtype == np.float64
    finally:
        fnx.config.update("jax_enable_x64", False)
    assert jnp.asarray(np.ones(1)).dtype == np.float32


@pytest.mark.parametrize("variable", ["JAX_ENABLE_X64", "FNX_ENABLE_X64"])
def test_environment_variables_turn_x64_on(variable):
    env = {k: v for k, v in os.environ.items() if k not in ("JAX_ENABLE_X64", "FNX_ENABLE_X64")}
    env[variable] = "1"
    code = "import numpy as np, fnx.numpy as jnp; print(jnp.ones(2).dtype, jnp.asarray(np.ones(2)).dtype)"
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True).stdout
    assert out.split() == ["float64", "float64"]
    env[variable] = "maybe"
    bad = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert bad.returncode != 0 and f"{variable}='maybe'" in bad.stderr
