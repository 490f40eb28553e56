"""Non-temporal stores of a program's big outputs (fnx/lower/pipeline.py `streamed`, fnx/backends/llvm_render.py):
which stores bypass the caches, and that every value still arrives, from any thread, into any address.

The oracle is numpy on the same float32 inputs (the kernels here round exactly as numpy does: one op each), and
each test reads the kernel's LLVM text, so none passes without exercising the store it is about."""
from __future__ import annotations

import numpy as np

import fnx
import fnx.numpy as jnp
from fnx.backends import device as device_module
from fnx.backends.device import get_device
from fnx.lower import pipeline

RNG = np.random.default_rng(5)


def _big() -> int:
    """Float32 elements of an output just past the streaming threshold on this machine (whole vectors: a remainder
    makes every store of a 1-d kernel a masked one, which has no non-temporal form)."""
    target = get_device("cpu").target
    return (pipeline.STREAM_MIN_CACHES * target.l2_bytes * target.threads // 4 // 1024 + 3) * 1024


def _llvm(fn, *args) -> str:
    return fnx.jit(fn).lower(*map(jnp.asarray, args)).as_text("llvm")


def test_a_big_output_is_stored_past_the_caches_and_every_value_arrives():
    """x * 1.5 over a buffer beyond L2: whole-line stores are non-temporal, the kernel ends with a store fence
    (the worker thread's stores are visible to the caller), and 20 calls give numpy's values."""
    x = RNG.standard_normal(_big()).astype(np.float32)
    fn = lambda x: x * 1.5  # noqa: E731
    text = _llvm(fn, x)
    assert "!nontemporal" in text and ("sfence" in text or "fence seq_cst" in text)
    f = fnx.jit(fn)
    want = x * np.float32(1.5)
    for _ in range(20):
        np.testing.assert_array_equal(np.asarray(f(x)), want)


def test_small_and_reread_outputs_keep_normal_stores():
    """An output smaller than the cores' L2 together, an intermediate the next kernel reads, and an output another
    kernel of the program reads stay in cache; the values match numpy."""
    small = RNG.standard_normal(1000).astype(np.float32)
    assert "!nontemporal" not in _llvm(lambda x: x * 1.5, small)
    x = RNG.standard_normal((_big() // 512 + 1, 512)).astype(np.float32)

    def two(x):  # y is an output and the input of the max: it stays in cache (a sum would be carried by y's
        y = x * 1.5  # kernel, fnx/lower/row_sums.py, and y read by no other kernel)
        return y, y.max(-1)
    text = _llvm(two, x)
    kernels = text.split("\ndefine ")
    streamed = [k.split("(")[0] for k in kernels if "!nontemporal" in k]
    assert not streamed, streamed
    y, s = fnx.jit(two)(x)
    np.testing.assert_array_equal(np.asarray(y), x * np.float32(1.5))
    np.testing.assert_array_equal(np.asarray(s), (x * np.float32(1.5)).max(-1))


def test_an_accumulating_matmul_does_not_stream_its_output():
    """A matmul whose k-slabs add into its output reads the output back: its stores are normal ones."""
    n = 1024
    a, b = RNG.standard_normal((2, n, n)).astype(np.float32)
    lowered = fnx.jit(lambda a, b: a @ b).lower(jnp.asarray(a), jnp.asarray(b))
    acc = [k for k in lowered.as_text("llvm").split("\ndefine ") if "_acc(" in k.split("\n")[0]]
    for kernel in acc: assert "!nontemporal" not in kernel
    got = np.asarray(fnx.jit(lambda a, b: a @ b)(a, b))
    np.testing.assert_allclose(got, a.astype(np.float64) @ b, rtol=1e-4, atol=1e-3)


def test_an_output_not_on_a_cache_line_gets_normal_stores(monkeypatch):
    """Memory that starts mid-line (as numpy's 16-byte aligned allocations may): the kernel checks each store's
    address and stores normally there (a non-temporal vector store needs a line-aligned address); values match."""
    original = device_module.HostPool.array

    def off_line(self, dtype, size):
        if size * dtype.itemsize < 1 << 20: return original(self, dtype, size)
        block = np.empty(size * dtype.itemsize + 256, np.uint8)
        start = 16 + -block.ctypes.data % 64  # 16 bytes past a line
        array = block[start:start + size * dtype.itemsize].view(dtype)
        array.flags.writeable = False
        return array, array.ctypes.data  # (array.base keeps the block)
    monkeypatch.setattr(device_module.HostPool, "array", off_line)
    x = RNG.standard_normal(_big() + 1024).astype(np.float32)  # (a program of its own: the pool is asked anew)
    fn = lambda x: x * 2.5  # noqa: E731
    assert "!nontemporal" in _llvm(fn, x)
    got = fnx.jit(fn)(x)
    got.block_until_ready()
    assert got._buffer.ptr % 64 == 16  # (the output did land mid-line)
    np.testing.assert_array_equal(np.asarray(got), x * np.float32(2.5))


def test_a_chain_streams_its_last_kernels_output():
    """Eight layernorm steps run as a row chain: only the last kernel writes the program's output, and only it
    streams (the others write the chain's scratch, read at once by the next); the result matches float64."""
    rows = max(64, _big() // 1024 + 1)
    x = RNG.standard_normal((rows, 1024)).astype(np.float32)

    def chain(x):
        for _ in range(8):
            mean = x.mean(-1, keepdims=True)
            x = x + 0.5 * (x - mean) / jnp.sqrt(((x - mean) ** 2).mean(-1, keepdims=True) + 1e-5)
        return x
    text = _llvm(chain, x)
    assert "chain_" in text
    assert sum("!nontemporal" in k for k in text.split("\ndefine ")) == 1
    w = x.astype(np.float64)
    for _ in range(8):
        mean = w.mean(-1, keepdims=True)
        w = w + 0.5 * (w - mean) / np.sqrt(((w - mean) ** 2).mean(-1, keepdims=True) + 1e-5)
    np.testing.assert_allclose(np.asarray(fnx.jit(chain)(x)), w, rtol=2e-5, atol=2e-5)
