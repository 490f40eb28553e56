"""fnx.test_util.check_grads: passes for correct derivatives (any order, both modes, pytrees, float32 and float64)
and raises AssertionError for a wrong custom jvp or vjp, naming what differs."""
import numpy as np
import pytest

import fnx
import fnx.numpy as jnp
from fnx.test_util import check_grads


@pytest.mark.parametrize("order", [1, 2, 3])
def test_correct_derivatives_pass(order):
    x, y = np.float32(0.3), np.array([0.2, -0.5, 1.1], np.float32)
    check_grads(lambda a, b: jnp.sin(a) * jnp.tanh(b) + a * b ** 2, (x, y), order=order)
    check_grads(lambda p: jnp.exp(p["w"]).sum() * p["v"], ({"w": np.array([0.1, 0.2]), "v": np.float64(2.0)},),
                order=order)
    if order <= 2:  # (det through its LU loop: a third order compiles for long)
        check_grads(lambda m: jnp.linalg.det(m), (np.array([[2.0, 0.5], [0.3, 1.5]]),), order=order,
                    modes=("rev",))


def test_wrong_rules_fail():
    @fnx.custom_jvp
    def wrong_jvp(x): return jnp.sin(x)

    @wrong_jvp.defjvp
    def _(primals, tangents): return jnp.sin(primals[0]), 2 * jnp.cos(primals[0]) * tangents[0]

    @fnx.custom_vjp
    def wrong_vjp(x): return x ** 3

    wrong_vjp.defvjp(lambda x: (x ** 3, x), lambda x, g: (2 * x ** 2 * g,))
    x = np.float32(0.7)
    with pytest.raises(AssertionError, match="the jvp differs"):
        check_grads(wrong_jvp, (x,), order=1, modes=("fwd",))
    with pytest.raises(AssertionError, match="the vjp"):
        check_grads(wrong_vjp, (x,), order=1, modes=("rev",))
    with pytest.raises(TypeError, match="custom_vjp"):  # (no forward mode for a custom_vjp function, as JAX)
        check_grads(wrong_vjp, (x,), order=1, modes=("fwd",))
    with pytest.raises(ValueError, match="unknown mode 'sideways'"):
        check_grads(jnp.sin, (x,), order=1, modes=("sideways",))
