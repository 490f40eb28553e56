"""debug_nans / debug_infs (JAX's jax_debug_nans / jax_debug_infs): a NaN or infinity in a float result is a
FloatingPointError naming the op that made it and the user's line, eagerly and under jit (which runs the function
again op by op, as JAX does); against JAX's own error where JAX is installed."""
import os
import subprocess
import sys

import numpy as np
import pytest

import fnx
import fnx.numpy as jnp


def _f(lib):
    def f(v):
        a = v * 2
        b = lib.sqrt(a)  # the NaN is made here
        return b + 1
    return f


def test_eager_op_names_itself_and_the_line():
    x = jnp.asarray(np.array([1.0, -1.0], np.float32))
    with fnx.debug_nans(True):
        with pytest.raises(FloatingPointError, match=r"invalid value \(nan\) encountered in log\n  at .*debug_nans"):
            jnp.log(x)
        np.testing.assert_allclose(np.asarray(jnp.log(jnp.abs(x))), [0, 0])  # finite results pass
    assert np.isnan(np.asarray(jnp.log(x))[1])  # off again after the block: NaN is a value like any other


def test_jit_runs_again_op_by_op_to_find_the_op():
    x = np.array([1.0, -1.0], np.float32)
    f = fnx.jit(_f(jnp))
    with fnx.debug_nans(True):
        with pytest.raises(FloatingPointError, match=r"encountered in sqrt\n  at .*test_debug_nans.py:\d+ \(f\)"):
            f(x)
        np.testing.assert_allclose(np.asarray(f(np.abs(x))), np.sqrt(2 * np.abs(x)) + 1, rtol=1e-6)
        f(np.abs(x))  # called twice: the cached program is checked too
    assert np.isnan(np.asarray(f(x))[1])


def test_same_error_as_jax():
    jax = pytest.importorskip("jax")
    x = np.array([1.0, -1.0], np.float32)
    with jax.debug_nans(True), pytest.raises(FloatingPointError, match="sqrt") as theirs:
        jax.jit(_f(jax.numpy))(x)
    with fnx.debug_nans(True), pytest.raises(FloatingPointError, match="sqrt") as ours:
        fnx.jit(_f(jnp))(x)
    assert "invalid value (nan) encountered in" in str(theirs.value) and \
        "invalid value (nan) encountered in" in str(ours.value)


def test_infinities_gradients_integers_and_half_floats():
    with fnx.debug_infs(True):
        with pytest.raises(FloatingPointError, match=r"\(inf\)"):
            fnx.jit(lambda v: 1.0 / v)(jnp.zeros(2))
        with pytest.raises(FloatingPointError, match=r"\(inf\)"):  # d sqrt(x)/dx at 0
            fnx.grad(lambda v: jnp.sqrt(v))(0.0)
        np.testing.assert_array_equal(np.asarray(fnx.jit(lambda v: v // 1)(jnp.arange(3))), [0, 1, 2])  # ints
        with pytest.raises(FloatingPointError, match=r"\(inf\)"):
            jnp.asarray(np.array([60000], np.float16)) * 2  # overflows float16
    with fnx.debug_nans(True):
        np.asarray(fnx.jit(lambda v: 1.0 / v)(jnp.zeros(2)))  # an infinity is not a NaN


def test_config_update_and_environment_variable():
    fnx.config.update("jax_debug_nans", True)
    try:
        assert fnx.config.read("jax_debug_nans")
        with pytest.raises(FloatingPointError):
            jnp.log(jnp.asarray(-1.0))
    finally:
        fnx.config.update("jax_debug_nans", False)
    code = ("import fnx, fnx.numpy as jnp\ntry:\n    jnp.log(jnp.asarray(-1.0))\nexcept FloatingPointError as e:\n"
            "    print('raised', e)\n")
    out = subprocess.run([sys.executable, "-c", code], env={**os.environ, "JAX_DEBUG_NANS": "1"}, capture_output=True,
                         text=True, timeout=300)
    assert out.stdout.startswith("raised invalid value (nan) encountered in log"), out.stdout + out.stderr


def test_log_compiles_logs_each_trace_and_compile_in_the_block(caplog):
    def scaled(v):
        return v * 2.5
    with caplog.at_level("WARNING", logger="fnx"):
        with fnx.log_compiles():
            fnx.jit(scaled)(np.ones(3, np.float32))
            fnx.jit(scaled)(np.ones(3, np.float32))  # cached: nothing new to log
        fnx.jit(scaled)(np.ones(4, np.float32))  # after the block: not logged
    messages = [r.getMessage() for r in caplog.records if r.name == "fnx"]
    assert [m.split()[1] for m in messages] == ["trace", "lower", "compile"], messages
    assert all("scaled" in m for m in messages)
