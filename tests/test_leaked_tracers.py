"""A value traced inside jit or a transform and kept past its trace (a global, a list) raises
UnexpectedTracerError naming where the trace started, as JAX does; it segfaulted or gave a wrong value."""
import subprocess
import sys

import numpy as np
import pytest

import fnx
import fnx.numpy as jnp
from fnx.errors import UnexpectedTracerError


def _leak_from(kind: str):
    """A value built inside a trace of `kind`, kept in a list past the trace."""
    leak = []

    def f(x):
        leak.append(x * 2)
        return jnp.sum(x + 1)
    x = jnp.arange(3.0)
    if kind == "jit": fnx.jit(f)(x)
    elif kind == "grad": fnx.grad(f)(x)
    elif kind == "jit_grad": fnx.jit(fnx.grad(f))(x)
    elif kind == "vmap": fnx.vmap(f)(jnp.ones((2, 3)))
    elif kind == "jvp": fnx.jvp(f, (x,), (x,))
    elif kind == "scan": fnx.lax.scan(lambda c, y: (c + f(y), None), 0.0, jnp.ones((2, 3)))
    elif kind == "checkpoint": fnx.grad(fnx.checkpoint(f))(x)
    return leak[0]


USES = {
    "add": lambda t: t + 1,
    "jit_closure": lambda t: fnx.jit(lambda y: y + t)(jnp.ones(t.shape)),
    "grad_closure": lambda t: fnx.grad(lambda y: jnp.sum(y * t))(jnp.ones(t.shape)),
    "asarray": lambda t: np.asarray(t),
    "float": lambda t: float(t.sum()),
    "vmap_closure": lambda t: fnx.vmap(lambda y: y * t)(jnp.ones((2,) + t.shape)),
}


@pytest.mark.parametrize("kind", ["jit", "grad", "jit_grad", "vmap", "jvp", "scan", "checkpoint"])
@pytest.mark.parametrize("use", list(USES))
def test_leaked_value_raises(kind, use):
    leaked = _leak_from(kind)
    with pytest.raises(UnexpectedTracerError, match=r"test_leaked_tracers.py:\d+") as info:
        USES[use](leaked)
    assert "unexpected tracer" in str(info.value) and str(leaked.shape) in str(info.value)
    assert repr(leaked).startswith("Traced<")  # printing a leaked value does not raise


def test_values_returned_from_traces_stay_valid():
    """What a trace returns (outputs, aux, pullbacks, linearized functions) is not a leak."""
    x = jnp.arange(3.0)
    value, aux = fnx.grad(lambda x: (jnp.sum(x ** 2), x * 3), has_aux=True)(x)
    np.testing.assert_allclose(np.asarray(value), [0.0, 2.0, 4.0])
    np.testing.assert_allclose(np.asarray(aux + 1), [1.0, 4.0, 7.0])
    out, pullback = fnx.vjp(jnp.sin, x)
    np.testing.assert_allclose(np.asarray(pullback(jnp.ones(3))[0]), np.cos(np.arange(3.0)), rtol=1e-6)
    _, tangent_fn = fnx.linearize(jnp.sin, x)
    np.testing.assert_allclose(np.asarray(tangent_fn(jnp.ones(3))), np.cos(np.arange(3.0)), rtol=1e-6)
    np.testing.assert_allclose(np.asarray(fnx.jit(lambda x: fnx.jit(jnp.sin)(x) + 1)(x)), np.sin(np.arange(3.0)) + 1,
                               rtol=1e-6)


def test_leaks_in_a_child_process_raise_and_never_crash():
    code = """
import numpy as np, fnx, fnx.numpy as jnp
from fnx.errors import UnexpectedTracerError
leak = []
@fnx.jit
def f(x):
    leak.append(x * 2)
    return x + 1
f(jnp.ones(3))
for use in (lambda: leak[0] + 1, lambda: fnx.jit(lambda y: y + leak[0])(jnp.ones(3)),
            lambda: fnx.grad(lambda y: jnp.sum(y * leak[0]))(jnp.ones(3)), lambda: np.asarray(leak[0])):
    try:
        use()
        print("no error")
    except UnexpectedTracerError:
        print("raised")
"""
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr[-2000:]
    assert run.stdout.split() == ["raised"] * 4
