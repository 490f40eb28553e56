"""Kernels equal to an earlier kernel of the same function (same graph and loops: a later layer's copy) run the
earlier one's compiled code on their own buffers (`Kernel.code`). Results are checked against numpy in float64
and JAX's gradients; the tests check that copies were made, so they cannot pass by never sharing."""
import numpy as np
import pytest

import fnx
import fnx.numpy as jnp
from assertions import assert_slots_never_overlap


def _layers(lib, ws, x):
    for w in ws:
        h = x @ w
        x = x + lib.tanh(h) * 0.5
    return x


def _data(n=4, rows=600, width=96, seed=0):
    rng = np.random.default_rng(seed)
    return ([rng.standard_normal((width, width)).astype(np.float32) * 0.1 for _ in range(n)],
            rng.standard_normal((rows, width)).astype(np.float32))


def test_repeated_layers_share_compiled_kernels():
    ws, x = _data()
    args = ([jnp.asarray(w) for w in ws], jnp.asarray(x))
    f = lambda ws, x: _layers(jnp, ws, x)  # noqa: E731
    lowering = fnx.jit(f).lower(*args).executable.lowering
    kernels = [k for k, lines in lowering.kernels if lines is not None]
    copies = [k for k in kernels if k.code]
    assert len(copies) >= len(kernels) // 2
    names = {k.name for k in kernels}
    assert all(k.code in names and k.code != k.name for k in copies)
    main = [k for k in kernels if "_pack" not in k.name]
    # a layer is its product and then its tanh (a heavy epilogue runs apart from the matmul), on its own buffers
    assert len({tuple(k.args) for k in main}) == len(main) == 2 * len(ws)
    want = _layers(np, [w.astype(np.float64) for w in ws], x.astype(np.float64))
    np.testing.assert_allclose(np.asarray(fnx.jit(f)(*args)), want, rtol=2e-5, atol=2e-5)


def test_copies_with_packed_operands_get_panels_of_their_own():
    """At 600 rows B is packed (PACK makes a panel buffer per product): each copy packs into its own buffer, and
    the memory plan keeps buffers apart while they live."""
    ws, x = _data(seed=1)
    args = ([jnp.asarray(w) for w in ws], jnp.asarray(x))
    lowering = fnx.jit(lambda ws, x: _layers(jnp, ws, x)).lower(*args).executable.lowering
    packs = [k for k, lines in lowering.kernels if lines is not None and "_pack" in k.name]
    assert len(packs) == len(ws) and len({k.args[-1] for k in packs}) == len(ws)
    assert_slots_never_overlap(lowering)


def test_shared_kernels_under_grad_match_jax():
    jax = pytest.importorskip("jax")
    ws, x = _data(n=3, rows=64, width=32, seed=2)

    def loss(lib):
        return lambda ws, x: (_layers(lib, ws, x) ** 2).mean()
    got = fnx.jit(fnx.grad(loss(jnp)))([jnp.asarray(w) for w in ws], jnp.asarray(x))
    lowering = fnx.jit(fnx.grad(loss(jnp))).lower([jnp.asarray(w) for w in ws], jnp.asarray(x)).executable.lowering
    assert any(k.code for k, lines in lowering.kernels if lines is not None)
    want = jax.jit(jax.grad(loss(jax.numpy)))(ws, x)
    for g, w in zip(got, want):
        np.testing.assert_allclose(np.asarray(g), np.asarray(w), rtol=2e-4, atol=1e-6)
