"""Transposes in registers (fnx/lower/optimize.py `_transpose_upcast`, fnx/backends/llvm_render.py
`transposed_blocks`): a kernel whose vector lanes gather a load that another loop walks contiguously unrolls that
loop by the lane count, and the LLVM renderer reads the W x W block as W contiguous rows and shuffles them into
columns. The oracle is numpy (a transpose and a +1 are exact), and the LLVM text shows the gathers are gone."""
from __future__ import annotations

import numpy as np
import pytest

from assertions import from_threads
import fnx
import fnx.numpy as jnp
from fnx.backends.llvm_render import shuffled, transpose_network

RNG = np.random.default_rng(11)


@pytest.mark.parametrize("w", [4, 8, 16, 32])
@pytest.mark.parametrize("itemsize", [1, 2, 4, 8])
def test_the_network_turns_rows_into_columns(w, itemsize):
    """Each stage shuffles vectors a and a + d (a without bit d) with its two masks, as the renderer emits it;
    afterwards the vector `where[c]` holds column c of a random block. 32-bit elements of 8 and 16 lanes start
    with interleaves inside 128-bit lanes (single AVX2 instructions)."""
    block = RNG.integers(0, 1 << 30, (w, w))
    stages, where = transpose_network(w, itemsize)
    rows = shuffled(list(block), stages)
    for c in range(w): np.testing.assert_array_equal(rows[where[c]], block[:, c])
    assert len(stages) == w.bit_length() - 1
    if itemsize == 4 and w in (8, 16): assert [d for d, _ in stages][:2] == [1, 2]


@pytest.mark.parametrize("shape", [(64, 48), (1024, 1024), (48, 64, 32), (37, 1000), (1000, 37), (8, 24)])
def test_a_transpose_is_exact_and_reads_no_gathers(shape):
    """`x.T + 1` (and a swap of a 3-d array's outer axes, which moves whole rows) equal numpy's; where the loop
    that walks x contiguously divides by the lanes, the kernel's LLVM reads the blocks as rows and shuffles them,
    without a gather."""
    x = RNG.standard_normal(shape).astype(np.float32)
    f = fnx.jit(lambda x: jnp.swapaxes(x, 0, 1) + 1.0)
    for _ in range(2): np.testing.assert_array_equal(np.asarray(f(x)), np.swapaxes(x, 0, 1) + np.float32(1))
    lowered = f.lower(x)
    [kernel] = [line for line in lowered.as_text("optimize").splitlines() if line.startswith("kernel")]
    lanes = int(kernel.split("VECTORIZE(")[1].split(",")[1].split(")")[0])
    text = lowered.as_text("llvm")
    if len(shape) == 2 and shape[1] % lanes == 0 and shape[0] % lanes == 0:  # (a masked remainder: gathers)
        assert "UPCAST" in kernel and "masked.gather" not in text and "shufflevector" in text, kernel


@pytest.mark.parametrize("dtype", [np.int32, np.float16, np.int8, np.bool_, np.uint16])
def test_transposes_of_every_width(dtype):
    x = (RNG.standard_normal((96, 64)) * 10).astype(dtype)
    got = np.asarray(fnx.jit(lambda x: jnp.transpose(x))(x))
    np.testing.assert_array_equal(got, x.T)
    got = np.asarray(fnx.jit(lambda x: x.T == x.T[0])(x))
    np.testing.assert_array_equal(got, x.T == x.T[0])


def test_a_transposed_operand_is_packed_without_gathers_and_the_product_is_right():
    """`g @ w.T` copies w.T into panels first (a transposing PACK): that copy reads w by rows too; the product
    matches numpy's in float64, from four threads, twice each."""
    g, w = RNG.standard_normal((256, 512)).astype(np.float32), RNG.standard_normal((768, 512)).astype(np.float32)
    f = fnx.jit(lambda g, w: g @ w.T)
    text = f.lower(g, w).as_text("llvm")
    pack = text[text.index("_pack0"):]
    pack = pack[:pack.index("\n}")]
    assert "masked.gather" not in pack and "shufflevector" in pack
    want = g.astype(np.float64) @ w.T.astype(np.float64)
    results = from_threads(lambda: np.asarray(f(g, w)))
    for got in results: np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-3)


def test_grad_and_vmap_through_transposes_match_jax():
    jax = pytest.importorskip("jax")
    x, w = RNG.standard_normal((64, 128)).astype(np.float32), RNG.standard_normal((64, 32)).astype(np.float32)

    def loss(lib):
        return lambda x, w: (lib.tanh(x.T @ w) ** 2).sum() + (x.T * 2).mean()
    got = fnx.jit(fnx.grad(loss(jnp), argnums=(0, 1)))(x, w)
    want = jax.jit(jax.grad(loss(jax.numpy), argnums=(0, 1)))(x, w)
    for a, b in zip(got, want): np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-4, atol=1e-4)
    xs = RNG.standard_normal((3, 48, 32)).astype(np.float32)
    np.testing.assert_array_equal(np.asarray(fnx.jit(fnx.vmap(lambda x: x.T - 1.0))(xs)),
                                  np.swapaxes(xs, 1, 2) - np.float32(1))
