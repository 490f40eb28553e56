"""Prefetches before a long reduce nest (fnx/lower/linearize.py, prefetch_after): the loads a tile's epilogue makes
(a matmul's C rows, accumulated onto over k-slabs) are prefetched before its k loop opens. A prefetch changes no
value: each result is checked against numpy in float64 and bit for bit against the same kernel without them, and
each test checks that the prefetches it is about were (or were not) emitted, so none passes by never making one."""
import numpy as np
import pytest

import fnx
import fnx.numpy as jnp
from assertions import relower
from fnx.config import config
from fnx.lower import linearize as linearize_module


@pytest.fixture(autouse=True)
def fresh_lowerings(monkeypatch):
    """Lowered afresh under the test's settings (on-disk lowerings do not know them)."""
    monkeypatch.setattr(config, "cache_dir", None)
    relower()
    yield
    relower()


def _matmul(m, k, n, seed=0):
    rng = np.random.default_rng(seed)
    return rng.standard_normal((m, k)).astype(np.float32), rng.standard_normal((k, n)).astype(np.float32)


def _stages(a, b, stage):
    return fnx.jit(lambda a, b: a @ b).lower(a, b).compile().as_text(stage)


def test_accumulated_tiles_prefetch_their_rows_before_the_k_loop(monkeypatch):
    """(203 x 1000) @ (1000 x 200): the product accumulates into C over k-slabs, so each register tile loads its C
    rows after its k loop; they are prefetched (for writing) before it. 203 rows leave a last tile of clamped rows.
    Same bits as without the prefetches, and numpy's float64 product within float32 rounding."""
    a, b = _matmul(203, 1000, 200)
    text = fnx.jit(lambda a, b: a @ b).lower(a, b).as_text("linearize")
    kernels = [k for k in text.split("kernel ") if k.strip()]
    accumulating = [k for k in kernels if "_acc" in k.splitlines()[0]]
    assert accumulating and all("prefetch" in k for k in accumulating)
    for k in accumulating:  # every prefetch comes before the k loop that the loads it serves follow
        lines = [line.strip() for line in k.splitlines()]
        first_prefetch = next(i for i, line in enumerate(lines) if line.startswith("prefetch"))
        acc_init = next(i for i, line in enumerate(lines) if line.startswith("acc_init"))
        assert first_prefetch < acc_init
    llvm_ir = _stages(a, b, "llvm")
    assert "call void @llvm.prefetch.p0(ptr" in llvm_ir and ", i32 1, i32 3, i32 1)" in llvm_ir
    got = np.asarray(fnx.jit(lambda a, b: a @ b)(jnp.asarray(a), jnp.asarray(b)))
    np.testing.assert_allclose(got, a.astype(np.float64) @ b.astype(np.float64), rtol=1e-4, atol=1e-3)

    monkeypatch.setattr(linearize_module, "PREFETCH_MIN_TRIPS", 1 << 62)
    relower()
    assert "llvm.prefetch" not in _stages(a, b, "llvm")
    np.testing.assert_array_equal(np.asarray(fnx.jit(lambda a, b: a @ b)(jnp.asarray(a), jnp.asarray(b))), got)


def test_short_reduce_nests_get_no_prefetch():
    """A nest of fewer than PREFETCH_MIN_TRIPS iterations is over before a prefetch could help: none is made."""
    x = np.random.default_rng(1).standard_normal((300, 40)).astype(np.float32)
    y = np.random.default_rng(2).standard_normal((300, 1)).astype(np.float32)
    f = lambda x, y: x.sum(-1, keepdims=True) + y  # noqa: E731  (a load of y after a 40-step sum)
    assert 40 < linearize_module.PREFETCH_MIN_TRIPS
    assert "prefetch" not in fnx.jit(f).lower(x, y).as_text("linearize")
    got = np.asarray(fnx.jit(f)(jnp.asarray(x), jnp.asarray(y)))
    np.testing.assert_allclose(got, x.astype(np.float64).sum(-1, keepdims=True) + y, rtol=1e-5, atol=1e-5)


def test_a_load_after_a_long_sum_is_prefetched_and_gradients_agree():
    """Rows of 4096 summed, then each row's sum scaled by a value loaded after the sum: that load is prefetched
    before the sum's loop. The result and the gradient (which reads the loaded value again) match float64."""
    x = np.random.default_rng(3).standard_normal((37, 4096)).astype(np.float32)
    y = np.random.default_rng(4).standard_normal(37).astype(np.float32)
    f = lambda x, y: x.sum(-1) * y  # noqa: E731
    assert "prefetch" in fnx.jit(f).lower(x, y).as_text("linearize")
    got = np.asarray(fnx.jit(f)(jnp.asarray(x), jnp.asarray(y)))
    np.testing.assert_allclose(got, x.astype(np.float64).sum(-1) * y, rtol=1e-4, atol=1e-3)
    loss = lambda x, y: (f(x, y) ** 2).sum()  # noqa: E731
    gx, gy = fnx.jit(fnx.grad(loss, argnums=(0, 1)))(jnp.asarray(x), jnp.asarray(y))
    s = x.astype(np.float64).sum(-1)
    np.testing.assert_allclose(np.asarray(gx), np.broadcast_to((2 * s * y * y)[:, None], x.shape), rtol=1e-4,
                               atol=1e-2)
    np.testing.assert_allclose(np.asarray(gy), 2 * s * s * y, rtol=1e-4, atol=1e-1)


def _kernels_with(text: str, what: str) -> list[str]:
    return [k for k in text.split("kernel ") if k.strip() and what in k]


def test_softmax_rows_prefetch_the_next_row_in_their_exp_pass(monkeypatch):
    """Softmax over rows of 2048 floats (8 KB): the max pass reads a row from memory, the exp pass computes on it
    in cache; the exp pass prefetches the same places of the next row (into L2), the max pass and the rescale
    pass do not. The last row's prefetch points past the input's end, which a prefetch may do. Same bits as
    without the prefetches, and numpy's float64 softmax within float32 rounding."""
    x = (np.random.default_rng(5).standard_normal((333, 2048)) * 3).astype(np.float32)
    f = lambda x: fnx.nn.softmax(x, axis=-1)  # noqa: E731
    text = fnx.jit(f).lower(x).as_text("linearize")
    (kernel,) = _kernels_with(text, "prefetch_next")
    bodies = [loop.split("end ")[0] for loop in kernel.split("for ")[1:]]  # each loop up to its first inner end
    prefetching = [body for body in bodies if "prefetch_next" in body]
    assert len(bodies) >= 3 and len(prefetching) == 1
    body = prefetching[0]
    assert body.count(" mul ") + body.count(" add ") >= 8  # the exp pass, not the max pass
    assert ", i32 0, i32 2, i32 1)" in fnx.jit(f).lower(x).compile().as_text("llvm")
    got = np.asarray(fnx.jit(f)(jnp.asarray(x)))
    e = np.exp(x.astype(np.float64) - x.max(-1, keepdims=True))
    np.testing.assert_allclose(got, e / e.sum(-1, keepdims=True), rtol=1e-5, atol=1e-9)

    monkeypatch.setattr(linearize_module, "PREFETCH_ROW_BYTES", 0)
    relower()
    assert "prefetch_next" not in fnx.jit(f).lower(x).as_text("linearize")
    np.testing.assert_array_equal(np.asarray(fnx.jit(f)(jnp.asarray(x))), got)


def test_light_passes_and_matmuls_prefetch_no_next_row():
    """A layernorm's passes do a few operations a load (no time to hide the next row in), and a matmul's inner
    loop also loads B (bound by those loads): neither prefetches the next row. Both still match numpy."""
    x = np.random.default_rng(6).standard_normal((300, 2048)).astype(np.float32)
    norm = lambda x: (x - x.mean(-1, keepdims=True)) / jnp.sqrt(x.var(-1, keepdims=True) + 1e-5)  # noqa: E731
    a, b = _matmul(300, 2048, 64, seed=7)
    for f, args in ((norm, (x,)), (lambda a, b: a @ b, (a, b))):
        assert "prefetch_next" not in fnx.jit(f).lower(*args).as_text("linearize")
    x64 = x.astype(np.float64)
    want = (x64 - x64.mean(-1, keepdims=True)) / np.sqrt(x64.var(-1, keepdims=True) + 1e-5)
    np.testing.assert_allclose(np.asarray(fnx.jit(norm)(jnp.asarray(x))), want, rtol=1e-4, atol=1e-4)
    got = np.asarray(fnx.jit(lambda a, b: a @ b)(jnp.asarray(a), jnp.asarray(b)))
    np.testing.assert_allclose(got, a.astype(np.float64) @ b, rtol=1e-4, atol=2e-3)


def test_float16_softmax_prefetching_rows_matches_jax_twice_and_from_threads():
    """float16 rows of 4096 (8 KB: the next row is prefetched): the same bits on a second call and from eight
    threads at once, and JAX's float16 softmax within an ulp of float16 near 1."""
    jax = pytest.importorskip("jax")
    import threading
    x = (np.random.default_rng(9).standard_normal((300, 4096)) * 3).astype(np.float16)
    f = fnx.jit(lambda x: fnx.nn.softmax(x, axis=-1))
    assert "prefetch_next" in f.lower(x).as_text("linearize")
    first = np.asarray(f(jnp.asarray(x)))
    np.testing.assert_array_equal(np.asarray(f(jnp.asarray(x))), first)
    want = np.asarray(jax.jit(lambda x: jax.nn.softmax(x, axis=-1))(x))
    np.testing.assert_allclose(first.astype(np.float64), want.astype(np.float64), rtol=1e-3, atol=1e-3)
    outs = [None] * 8

    def call(i): outs[i] = np.asarray(f(jnp.asarray(x)))
    threads = [threading.Thread(target=call, args=(i,)) for i in range(8)]
    for t in threads: t.start()
    for t in threads: t.join()
    for out in outs: np.testing.assert_array_equal(out, first)
