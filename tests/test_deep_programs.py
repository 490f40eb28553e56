"""Programs thousands of operations deep (an unrolled Python loop) trace, transform, lower and run: nothing on the
way recurses once per operation into Python's recursion limit. Each checked against numpy in float64."""
import numpy as np

import fnx
import fnx.numpy as jnp

STEPS = 3000


def chain_then_exp(x):
    """3000 elementwise steps, then a function with its own derivative rule (a custom_jvp: exp)."""
    for _ in range(STEPS): x = x * 1.0001 + 0.0001
    return jnp.exp(x).sum()


def _reference(x: np.ndarray) -> tuple[float, np.ndarray]:
    """The value and gradient of chain_then_exp in float64."""
    y = x.astype(np.float64)
    for _ in range(STEPS): y = y * 1.0001 + 0.0001
    return float(np.exp(y).sum()), np.exp(y) * 1.0001 ** STEPS


def test_a_3000_op_chain_before_a_custom_rule_under_jit_grad_and_vmap():
    x = np.linspace(-1, 1, 6, dtype=np.float32)
    value, grad = _reference(x)
    np.testing.assert_allclose(float(fnx.jit(chain_then_exp)(x)), value, rtol=2e-3)
    np.testing.assert_allclose(np.asarray(fnx.jit(fnx.grad(chain_then_exp))(x)), grad, rtol=2e-3)
    batch = np.stack([x, x[::-1] * 0.5])
    want = [_reference(row)[0] for row in batch]
    np.testing.assert_allclose(np.asarray(fnx.jit(fnx.vmap(chain_then_exp))(batch)), want, rtol=2e-3)
    np.testing.assert_allclose(float(fnx.jit(chain_then_exp)(x)), value, rtol=2e-3)  # called again


def test_an_array_flipped_2000_times_in_one_kernel():
    """One fused kernel whose index arithmetic nests 2000 reversals (the optimizer's index analysis recursed along
    it outside the deep-recursion allowance rangeify had)."""
    x = np.linspace(0, 1, 8, dtype=np.float32)

    def f(x):
        for _ in range(2000): x = x[::-1] * 1.01
        return x
    want = x.astype(np.float64)
    for _ in range(2000): want = want[::-1] * 1.01
    np.testing.assert_allclose(np.asarray(fnx.jit(f)(x)), want, rtol=1e-3)
