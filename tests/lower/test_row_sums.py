"""Carried row sums (fnx/lower/row_sums.py): the kernel that writes a row also sums it for a later kernel's mean.
Every result is checked against numpy in float64 (or JAX for gradients), and against the same program lowered
without the rewrite; each test also checks whether the rewrite happened, so a test cannot pass by never (or
always) taking it."""
import threading

import numpy as np
import pytest

import fnx
import fnx.numpy as jnp
from assertions import relower
from fnx.config import config
from fnx.lower import row_sums
from fnx.lower.optimize import _row_sum


@pytest.fixture(autouse=True)
def fresh_lowerings(monkeypatch):
    """Every test lowers afresh (a lowering cached by an earlier test may have been made under other settings),
    with row sums carried whatever the host's vector registers (the rewrite is right on every target; it pays
    with 32: `test_targets_with_few_registers_carry_none`)."""
    monkeypatch.setattr(row_sums, "MIN_REGISTERS", 0)
    monkeypatch.setattr(config, "cache_dir", None)
    relower()
    yield
    relower()


def _layernorms(lib, x, steps):
    for _ in range(steps):
        mean = x.mean(-1, keepdims=True)
        y = (x - mean) / lib.sqrt(((x - mean) ** 2).mean(-1, keepdims=True) + 1e-5)
        x = x + 0.5 * y
    return x


def _carried(f, *args) -> int:
    """How many kernels of f's lowering store a row sum they carry."""
    lowering = fnx.jit(f).lower(*args).executable.lowering
    return sum(any(_row_sum(k, st) for st in k.sink.src) for k, lines in lowering.kernels if lines is not None)


def _without(monkeypatch, f, *args):
    """f's results lowered without the rewrite (and the number of carried sums then, which must be 0)."""
    with monkeypatch.context() as m:
        m.setattr(config, "cache_dir", None)
        m.setattr(row_sums, "CARRY_ROW_SUMS", False)
        relower()
        carried = _carried(f, *args)
        out = fnx.jit(f)(*args)
        out = [np.asarray(o) for o in out] if isinstance(out, (tuple, list)) else np.asarray(out)
    relower()
    return out, carried


@pytest.mark.parametrize("rows, cols", [(1037, 1024), (37, 1000), (8, 3), (64, 1)])
def test_layernorm_steps_carry_each_mean_to_the_next(monkeypatch, rows, cols):
    """Each step but the last writes its rows and their sums; the next reads the sums as its mean. Rows of 1000
    and 3 floats leave a masked remainder of the lanes (it must add nothing); a row of one float has no loop."""
    x = np.random.default_rng(rows).standard_normal((rows, cols)).astype(np.float32) * 2 + 0.5
    f = lambda x: _layernorms(jnp, x, 4)  # noqa: E731
    carried = _carried(f, jnp.asarray(x))
    assert carried >= 3 if cols > 1 else carried == 0  # (tiny rows split each step in more kernels: more carried)
    got = np.asarray(fnx.jit(f)(jnp.asarray(x)))
    np.testing.assert_allclose(got, _layernorms(np, x.astype(np.float64), 4), rtol=5e-5, atol=5e-5)
    np.testing.assert_array_equal(np.asarray(fnx.jit(f)(jnp.asarray(x))), got)  # the second call: the same bits
    plain, none = _without(monkeypatch, f, jnp.asarray(x))
    assert none == 0
    np.testing.assert_allclose(got, plain, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("dtype, tol", [(np.float16, 2e-2), (jnp.bfloat16, 1e-1), (np.float64, 1e-12)])
def test_other_float_types_sum_in_their_own_type_as_the_mean_did(monkeypatch, dtype, tol):
    x = np.random.default_rng(1).standard_normal((96, 256)).astype(dtype)
    f = lambda x: _layernorms(jnp, x, 3)  # noqa: E731
    assert _carried(f, jnp.asarray(x)) >= 1  # (float64 rows fuse two steps in one kernel: one carried)
    got = np.asarray(fnx.jit(f)(jnp.asarray(x))).astype(np.float64)
    np.testing.assert_allclose(got, _layernorms(np, x.astype(np.float64), 3), rtol=tol, atol=tol)
    plain, _ = _without(monkeypatch, f, jnp.asarray(x))
    np.testing.assert_allclose(got, plain.astype(np.float64), rtol=tol, atol=tol)


def test_residual_stream_returned_and_summed_keeps_its_buffer(monkeypatch):
    """The written array is also an output and is summed by two later kernels: both read the one carried sum."""
    x = np.random.default_rng(2).standard_normal((300, 512)).astype(np.float32)

    def f(x):
        h = jnp.tanh(x) * 2 + x
        return h, h.mean(-1), h - h.mean(-1, keepdims=True) * (h * h).sum(-1, keepdims=True)
    got = [np.asarray(o) for o in fnx.jit(f)(jnp.asarray(x))]
    h = np.tanh(x.astype(np.float64)) * 2 + x
    want = [h, h.mean(-1), h - h.mean(-1, keepdims=True) * (h * h).sum(-1, keepdims=True)]
    for a, b in zip(got, want): np.testing.assert_allclose(a, b, rtol=2e-5, atol=2e-3)
    plain, _ = _without(monkeypatch, f, jnp.asarray(x))
    for a, b in zip(got, plain): np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-3)


@pytest.mark.parametrize("case", ["columns", "long rows", "integers", "max"])
def test_sums_the_rewrite_leaves_alone(case):
    """A sum over the written array's columns (not its rows), rows beyond MAX_ROW, integer rows and a max are
    computed as before, and right."""
    rng = np.random.default_rng(3)
    if case == "integers":
        x = rng.integers(-1000, 1000, (64, 128)).astype(np.int32)
        f = lambda x: (x * 3 + 1).sum(-1) + (x * 3 + 1)[:, 0]  # noqa: E731
        ref = lambda x: (x * 3 + 1).sum(-1) + (x * 3 + 1)[:, 0]  # noqa: E731
    else:
        cols = row_sums.MAX_ROW * 2 if case == "long rows" else 256
        x = rng.standard_normal((64, cols)).astype(np.float32)
        axis = 0 if case == "columns" else -1
        reduce = "max" if case == "max" else "sum"
        f = lambda x: getattr(jnp.exp(x) + x, reduce)(axis) * 2  # noqa: E731
        ref = lambda x: getattr(np.exp(x) + x, reduce)(axis) * 2  # noqa: E731
        f = (lambda g: lambda x: (g(x), jnp.exp(x) + x))(f)  # (the written array is an output: it is realized)
    assert _carried(f, jnp.asarray(x)) == 0
    out = fnx.jit(f)(jnp.asarray(x))
    got = np.asarray(out[0] if isinstance(out, tuple) else out)
    want = ref(x.astype(np.float64) if x.dtype.kind == "f" else x)
    np.testing.assert_allclose(got, want, rtol=2e-5, atol=1e-3)


def test_layernorm_gradient_and_vmap_match_jax():
    """grad and vmap of residual layernorm steps: a sum of gradient rows is carried too."""
    jax = pytest.importorskip("jax")
    x = np.random.default_rng(4).standard_normal((4, 128, 256)).astype(np.float32)
    loss = lambda lib: lambda x: (_layernorms(lib, x, 3) ** 2).sum()  # noqa: E731
    f = fnx.vmap(fnx.grad(loss(jnp)))
    assert _carried(f, jnp.asarray(x)) >= 2
    got = np.asarray(fnx.jit(f)(jnp.asarray(x)))
    want = np.asarray(jax.jit(jax.vmap(jax.grad(loss(jax.numpy))))(x))
    np.testing.assert_allclose(got, want, rtol=2e-3, atol=2e-3)


def test_from_several_threads_at_once():
    x = np.random.default_rng(5).standard_normal((517, 768)).astype(np.float32)
    f = fnx.jit(lambda x: _layernorms(jnp, x, 5))
    want = _layernorms(np, x.astype(np.float64), 5)
    first = np.asarray(f(jnp.asarray(x)))
    np.testing.assert_allclose(first, want, rtol=5e-5, atol=5e-5)
    results, errors = [], []

    def work():
        try:
            for _ in range(5): results.append(np.asarray(f(jnp.asarray(x))))
        except Exception as e:  # noqa: BLE001 (reported below)
            errors.append(e)
    threads = [threading.Thread(target=work) for _ in range(6)]
    for t in threads: t.start()
    for t in threads: t.join()
    assert not errors and len(results) == 30
    for r in results: np.testing.assert_array_equal(r, first)


def test_a_row_sum_kernel_of_its_own_goes_into_the_writer(monkeypatch):
    """`y, y.sum(-1)`: the sum's kernel stores nothing but the sum, so the kernel writing y stores the sums too,
    and the sum's kernel goes (the softmax sum of a gradient, which otherwise broke a row chain)."""
    x = np.random.default_rng(6).standard_normal((300, 512)).astype(np.float32)

    def f(x):
        y = jnp.exp(x) * 1.5
        return y, y.sum(-1), y.mean(-1) * 2

    def kernels():
        lowering = fnx.jit(f).lower(jnp.asarray(x)).executable.lowering
        return [k for k, lines in lowering.kernels if lines is not None]
    merged = kernels()
    assert len(merged[0].sink.src) == 2 and any(_row_sum(merged[0], st) for st in merged[0].sink.src)
    got = [np.asarray(o) for o in fnx.jit(f)(jnp.asarray(x))]
    y = np.exp(x.astype(np.float64)) * 1.5
    for a, b in zip(got, [y, y.sum(-1), y.mean(-1) * 2]): np.testing.assert_allclose(a, b, rtol=2e-6, atol=1e-5)
    with monkeypatch.context() as m:
        m.setattr(config, "cache_dir", None)
        m.setattr(row_sums, "CARRY_ROW_SUMS", False)
        relower()
        assert len(kernels()) == len(merged) + 1


def test_readers_of_some_rows_and_of_other_functions(monkeypatch):
    """Sums over only some of the written rows (a slice: the reader must not become the writer, whose stores would
    cover every row) and sums of two functions of the same rows (two carried sums) are right."""
    x = np.random.default_rng(7).standard_normal((200, 384)).astype(np.float32)

    def f(x):
        y = jnp.tanh(x) * 2 + 0.25
        return y, y[50:120].sum(-1), (y * y).sum(-1) + y.sum(-1), y[::3].mean(-1)
    got = [np.asarray(o) for o in fnx.jit(f)(jnp.asarray(x))]
    y = np.tanh(x.astype(np.float64)) * 2 + 0.25
    want = [y, y[50:120].sum(-1), (y * y).sum(-1) + y.sum(-1), y[::3].mean(-1)]
    for a, b in zip(got, want): np.testing.assert_allclose(a, b, rtol=2e-6, atol=2e-4)
    assert _carried(f, jnp.asarray(x)) >= 1
    plain, _ = _without(monkeypatch, f, jnp.asarray(x))
    for a, b in zip(got, plain): np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-4)


@pytest.mark.parametrize("registers, carried", [(16, 0), (32, 7)])
def test_targets_with_few_registers_carry_none(monkeypatch, registers, carried):
    """Lowered (not run) for a target of 16 and one of 32 vector registers: with 16 the sums' accumulators would
    spill from a row pair's output loop (row_sums.MIN_REGISTERS), so none are carried."""
    from dataclasses import replace

    from fnx.backends.cpu_target import host_target
    from fnx.lower.pipeline import lower
    monkeypatch.setattr(row_sums, "MIN_REGISTERS", 32)
    x = jnp.asarray(np.random.default_rng(8).standard_normal((512, 1024)).astype(np.float32))
    target = replace(host_target(2, config.cpu_target), vector_registers=registers)
    lowering = lower(fnx.jit(lambda x: _layernorms(jnp, x, 8)).lower(x).traced.fn, target)
    assert sum(any(_row_sum(k, st) for st in k.sink.src) for k, lines in lowering.kernels if lines) == carried


def test_two_to_the_26_elements():
    """2^26 floats (65,536 rows of 1,024): the writer's carried sums over every row are the means a float64
    reference gives, and the whole-array mean on top of them too."""
    x = np.random.default_rng(9).standard_normal((1 << 16, 1024)).astype(np.float32)

    def f(x):
        y = jnp.tanh(x) * 2 + 1  # (an output: written by a kernel of its own)
        return y, y - y.mean(-1, keepdims=True), y.mean()
    assert _carried(f, jnp.asarray(x)) >= 1
    _, centred, mean = fnx.jit(f)(jnp.asarray(x))
    y = np.tanh(x.astype(np.float64)) * 2 + 1
    np.testing.assert_allclose(np.asarray(centred), y - y.mean(-1, keepdims=True), rtol=0, atol=2e-5)
    np.testing.assert_allclose(float(mean), y.mean(), rtol=1e-6)
