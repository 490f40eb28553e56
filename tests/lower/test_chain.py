"""Row chains (fnx/lower/chain.py): kernels that walk the same rows run block by block through a native driver.
Every result is checked against numpy in float64 (or JAX for gradients); each test also checks that the chain it
means to exercise was formed, so a test cannot pass by never running the driver."""
import threading

import numpy as np
import pytest

import fnx
import fnx.numpy as jnp
from assertions import assert_slots_never_overlap, relower
from fnx.backends import cpu_llvm
from fnx.config import config
from fnx.lower import chain as chain_module
from fnx.lower import row_sums
from fnx.uop import Ops

ROWS, COLS = 1037, 1024  # 1M elements a kernel (so each is thread-split); rows divisible by neither block nor threads


@pytest.fixture(autouse=True)
def fresh_lowerings():
    """Every test lowers afresh (a lowering cached by an earlier test may have been made under other settings)."""
    relower()
    yield
    relower()


def _layernorm_steps(lib, x, steps, g=None, b=None):
    for _ in range(steps):
        mean = x.mean(-1, keepdims=True)
        y = (x - mean) / lib.sqrt(((x - mean) ** 2).mean(-1, keepdims=True) + 1e-5)
        if g is not None: y = y * g + b
        x = x + 0.5 * y
    return x


def _data(rows=ROWS, cols=COLS, seed=0):
    return np.random.default_rng(seed).standard_normal((rows, cols)).astype(np.float32) * 2 + 0.5


def _carries_sums() -> int:
    """1 when this host's target carries row sums into the kernel writing the rows (fnx/lower/row_sums.py)."""
    return int(cpu_llvm._compiler().target.vector_registers >= row_sums.MIN_REGISTERS)


def _chains(f, *args):
    return fnx.jit(f).lower(*args).executable.lowering.chains


def test_layernorm_chain_runs_by_row_blocks():
    x = _data()
    f = lambda x: _layernorm_steps(jnp, x, 4)  # noqa: E731
    chains = _chains(f, jnp.asarray(x))
    assert len(chains) == 1 and len(chains[0].members) == 4
    c = chains[0]
    # several blocks a thread; in scratch three steps' rows, and where the target carries row sums, the three sums
    # their writers carry to the next member's mean (fnx/lower/row_sums.py)
    sums = _carries_sums()
    assert c.block < c.step <= c.rows and sorted(r for _, r in c.scratch.values()) == [4] * 3 * sums + [COLS * 4] * 3
    # each member reads one row (and its sum) and writes one (and its sum): a block of them fits the share of L1
    # (CHAIN_L1_PERCENT) the next member reads from
    share = cpu_llvm._compiler().target.l1_bytes * chain_module.CHAIN_L1_PERCENT // 100
    row = (COLS + sums) * 4
    assert c.block * 2 * row <= share < (c.block + 1) * 2 * row
    want = _layernorm_steps(np, x.astype(np.float64), 4)
    got = np.asarray(fnx.jit(f)(jnp.asarray(x)))
    np.testing.assert_allclose(got, want, rtol=2e-5, atol=2e-5)
    np.testing.assert_array_equal(np.asarray(fnx.jit(f)(jnp.asarray(x))), got)  # the second call: the same


def test_chain_scratch_is_not_planned_and_no_slots_overlap():
    x = jnp.asarray(_data())
    lowering = fnx.jit(lambda x: _layernorm_steps(jnp, x, 4)).lower(x).executable.lowering
    (c,) = lowering.chains
    assert not set(c.scratch) & set(lowering.memory.slot_of)  # (16 MB buffers that need 3 x block rows)
    assert c.scratch_buffer in lowering.memory.slot_of
    assert_slots_never_overlap(lowering)


def test_values_the_chain_passes_on_stay_whole():
    """An intermediate step that is also returned keeps its buffer (it is read after the chain)."""
    x = _data(seed=1)

    def f(x):
        mid = _layernorm_steps(jnp, x, 2)
        return mid, _layernorm_steps(jnp, mid, 2)
    (c,) = _chains(f, jnp.asarray(x))
    got_mid, got = (np.asarray(a) for a in fnx.jit(f)(jnp.asarray(x)))
    want_mid = _layernorm_steps(np, x.astype(np.float64), 2)
    np.testing.assert_allclose(got_mid, want_mid, rtol=2e-5, atol=2e-5)
    np.testing.assert_allclose(got, _layernorm_steps(np, want_mid, 2), rtol=2e-5, atol=2e-5)


def test_broadcast_parameters_and_the_gradient_match_jax():
    jax = pytest.importorskip("jax")
    x, g, b = _data(seed=2), np.linspace(0.5, 1.5, COLS, dtype=np.float32), np.linspace(-1, 1, COLS, dtype=np.float32)

    def loss(lib):
        return lambda x, g, b: (_layernorm_steps(lib, x, 3, g, b) ** 2).mean()
    args = [jnp.asarray(a) for a in (x, g, b)]
    assert _chains(lambda x, g, b: _layernorm_steps(jnp, x, 3, g, b), *args)
    got = fnx.jit(fnx.grad(loss(jnp), argnums=(0, 1, 2)))(*args)
    with jax.default_device(jax.devices("cpu")[0]):
        want = jax.jit(jax.grad(loss(jax.numpy), argnums=(0, 1, 2)))(x, g, b)
    for a, w in zip(got, want):
        np.testing.assert_allclose(np.asarray(a), np.asarray(w), rtol=2e-4, atol=1e-7)


def test_a_step_that_reads_other_rows_splits_the_chain():
    """A roll along the rows reads row i - 1 for row i: that kernel may not join the chain before it."""
    x = _data(seed=3)

    def f(lib):
        def run(x):
            x = _layernorm_steps(lib, x, 2)
            x = lib.roll(x, 1, axis=0) * 0.5 + x
            return _layernorm_steps(lib, x, 2)
        return run
    chains = _chains(f(jnp), jnp.asarray(x))
    for c in chains:  # no kernel of a chain reads a chain-written buffer at another row
        for k in c.members:
            for buffer, written, stride in chain_module._accesses(k):
                if any(buffer in {b for b, w, _ in chain_module._accesses(m) if w} for m in c.members):
                    assert stride is not None
    np.testing.assert_allclose(np.asarray(fnx.jit(f(jnp))(jnp.asarray(x))), f(np)(x.astype(np.float64)),
                               rtol=2e-5, atol=2e-5)


def test_donated_input_holds_a_correct_result():
    x = _data(seed=4)
    f = lambda x: _layernorm_steps(jnp, x, 3)  # noqa: E731
    assert _chains(f, jnp.asarray(x))
    got = np.asarray(fnx.jit(f, donate_argnums=0)(jnp.asarray(x)))
    np.testing.assert_allclose(got, _layernorm_steps(np, x.astype(np.float64), 3), rtol=2e-5, atol=2e-5)


def test_concurrent_calls_keep_their_own_scratch():
    f = fnx.jit(lambda x: _layernorm_steps(jnp, x, 3))
    inputs = [_data(seed=10 + i) for i in range(4)]
    assert _chains(lambda x: _layernorm_steps(jnp, x, 3), jnp.asarray(inputs[0]))
    results, errors = [None] * 4, []

    def work(i):
        try:
            for _ in range(3): results[i] = np.asarray(f(jnp.asarray(inputs[i])))
        except Exception as e:  # noqa: BLE001 (reported below)
            errors.append(e)
    threads = [threading.Thread(target=work, args=(i,)) for i in range(4)]
    for t in threads: t.start()
    for t in threads: t.join()
    assert not errors
    for x, got in zip(inputs, results):
        np.testing.assert_allclose(got, _layernorm_steps(np, x.astype(np.float64), 3), rtol=2e-5, atol=2e-5)


def test_small_chains_are_left_alone():
    """Below CHAIN_MIN_BYTES of scratch the kernels' buffers stay in cache anyway: no chain."""
    x = _data(rows=64, cols=128)
    assert not _chains(lambda x: _layernorm_steps(jnp, x, 4), jnp.asarray(x))


def test_the_chain_is_shown():
    x = jnp.asarray(_data())
    text = fnx.jit(lambda x: _layernorm_steps(jnp, x, 2)).lower(x).as_text("optimize")
    assert "chain_k0" in text and "by blocks of" in text


def test_float16_chain_matches_jax():
    """Half-precision rows (2-byte elements: other strides and scratch sizes) chained, against JAX's float16."""
    jax = pytest.importorskip("jax")
    x = _data(seed=5).astype(np.float16)
    f = lambda lib: (lambda x: _layernorm_steps(lib, x, 3))  # noqa: E731
    assert _chains(f(jnp), jnp.asarray(x))
    got = np.asarray(fnx.jit(f(jnp))(jnp.asarray(x))).astype(np.float64)
    want = np.asarray(jax.jit(f(jax.numpy))(x)).astype(np.float64)
    assert got.dtype == want.dtype
    np.testing.assert_allclose(got, want, rtol=2e-2, atol=2e-2)
    np.testing.assert_allclose(got, _layernorm_steps(np, x.astype(np.float64), 3), rtol=2e-2, atol=2e-2)


def test_one_thread_runs_the_chain_by_row_blocks_too():
    """FNX_CPU_THREADS=1 (a one-core machine, `taskset -c 0`): the kernels still mark their rows as the loop a
    chain splits (one chunk), so the chain forms and its one thread walks every block."""
    import os
    import subprocess
    import sys
    program = """
import numpy as np
import fnx, fnx.numpy as jnp
from test_chain import _data, _layernorm_steps
x = _data()
f = lambda x: _layernorm_steps(jnp, x, 4)
chains = fnx.jit(f).lower(jnp.asarray(x)).executable.lowering.chains
assert len(chains) == 1 and len(chains[0].members) == 4, chains
c = chains[0]
assert c.chunks == 1 and c.step == c.rows and c.block < c.rows, (c.chunks, c.step, c.block)
want = _layernorm_steps(np, x.astype(np.float64), 4)
for _ in range(2): np.testing.assert_allclose(np.asarray(fnx.jit(f)(jnp.asarray(x))), want, rtol=2e-5, atol=2e-5)
print("ok")
"""
    here = os.path.dirname(os.path.abspath(__file__))
    env = dict(os.environ, FNX_CPU_THREADS="1", PYTHONPATH=os.pathsep.join([here, os.path.dirname(here)]))
    done = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, timeout=300, env=env)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["ok"]


def test_layernorm_rows_two_at_a_time_in_the_chain():
    """An even number of rows: each layernorm kernel walks two rows an iteration (optimize.ROW_PAIRS), its chain
    then by pairs of rows; every row still gets its own mean and variance (rows of very different scales)."""
    x = _data(rows=1036)
    x *= np.logspace(-3, 3, 1036, dtype=np.float32)[:, None]
    f = lambda x: _layernorm_steps(jnp, x, 4)  # noqa: E731
    text = fnx.jit(f).lower(jnp.asarray(x)).as_text("optimize")
    assert "UPCAST(0, 2)" in text
    chains = _chains(f, jnp.asarray(x))
    assert len(chains) == 1 and chains[0].rows == 518
    want = _layernorm_steps(np, x.astype(np.float64), 4)
    np.testing.assert_allclose(np.asarray(fnx.jit(f)(jnp.asarray(x))), want, rtol=2e-5, atol=2e-5)


def test_rows_wider_than_the_l1_share_make_blocks_of_one_row(monkeypatch):
    """A member's rows that fit L1 but not the share of it a block may fill (CHAIN_L1_PERCENT): a block of zero
    rows never ended the driver's loop (four layernorms of (256, 2048) hung on a 32 KB L1). Here any row is wider
    than 1% of L1, so the block must be one row, and the result right."""
    monkeypatch.setattr(config, "cache_dir", None)  # (on-disk lowerings do not know the setting)
    monkeypatch.setattr(chain_module, "CHAIN_L1_PERCENT", 1)
    x = _data()
    f = lambda x: _layernorm_steps(jnp, x, 4)  # noqa: E731
    (c,) = _chains(f, jnp.asarray(x))
    assert c.block == 1  # (checked before running: a block of 0 would hang)
    want = _layernorm_steps(np, x.astype(np.float64), 4)
    np.testing.assert_allclose(np.asarray(fnx.jit(f)(jnp.asarray(x))), want, rtol=2e-5, atol=2e-5)


def test_scratch_buffers_take_turns_in_one_place(monkeypatch):
    """Each step reads only the step before, each element before it writes it or in a reduction the row's stores
    wait for: its scratch rows go where the rows of the step before were (chain._in_place), so eight steps' seven
    buffers share one place. Without that, they take turns in two places, no member reading and writing one;
    without reuse, each has its own. All three give the same bits."""
    x = _data(seed=3)
    f = lambda x: _layernorm_steps(jnp, x, 8)  # noqa: E731
    (c,) = _chains(f, jnp.asarray(x))
    # seven steps' rows, and where the target carries row sums, the seven sums their writers carry to the next
    # step's mean (fnx/lower/row_sums.py): each kind in one place
    rows = {b: offset for b, (offset, row) in c.scratch.items() if row == COLS * 4}
    sums = {b: offset for b, (offset, row) in c.scratch.items() if row == 4}
    assert len(rows) == 7 and len(set(rows.values())) == 1 and len(c.scratch) == 7 + len(sums)
    assert len(sums) == 7 * _carries_sums() and len(set(sums.values())) == _carries_sums()
    want = _layernorm_steps(np, x.astype(np.float64), 8)
    got = np.asarray(fnx.jit(f)(jnp.asarray(x)))
    np.testing.assert_allclose(got, want, rtol=5e-5, atol=5e-5)
    for setting, places in (("CHAIN_IN_PLACE", 2), ("CHAIN_REUSE", 7)):
        with monkeypatch.context() as m:
            m.setattr(config, "cache_dir", None)
            m.setattr(chain_module, setting, 0)
            relower()
            (apart,) = _chains(f, jnp.asarray(x))
            assert len({offset for offset, _ in apart.scratch.values()}) == places * (1 + _carries_sums())
            for k in apart.members:
                taken = [apart.scratch[b][0] for b in k.args if b in apart.scratch]
                assert len(taken) == len(set(taken))
            np.testing.assert_array_equal(np.asarray(fnx.jit(f)(jnp.asarray(x))), got)


def test_a_step_that_reads_its_row_reversed_writes_another_place():
    """A step that reads the row before it in reverse reads element j after it has written others: written into
    the place it reads, it would read its own results. It gets a place of its own (the steps that read in order
    still share theirs), and the values are numpy's."""
    x = _data(rows=517, seed=5)
    reorder = np_reorder = lambda v: v[:, ::-1]  # noqa: E731

    def f(lib, order, x):
        x = _layernorm_steps(lib, x, 2)
        return _layernorm_steps(lib, order(x), 2)
    chains = _chains(lambda x: f(jnp, reorder, x), jnp.asarray(x))
    assert chains and max(len(c.members) for c in chains) >= 3
    for c in chains:
        for j, k in enumerate(c.members[1:], 1):
            reads = {b for b in k.buffers(Ops.LOAD) if b in c.scratch}
            writes = {b for b in k.buffers(Ops.STORE) if b in c.scratch}
            for a in reads:
                for b in writes:
                    if c.scratch[a][1] == c.scratch[b][1] and c.scratch[a][0] == c.scratch[b][0]:
                        assert chain_module._in_place(k, a, b), (j, a, b)
    assert any(not chain_module._in_place(k, a, b) for c in chains for k in c.members
               for a in k.buffers(Ops.LOAD) & set(c.scratch) for b in k.buffers(Ops.STORE) & set(c.scratch)
               if c.scratch[a][1] == c.scratch[b][1])
    want = f(np, np_reorder, x.astype(np.float64))
    np.testing.assert_allclose(np.asarray(fnx.jit(lambda x: f(jnp, reorder, x))(jnp.asarray(x))), want,
                               rtol=5e-5, atol=5e-5)


@pytest.mark.parametrize("cols", [64, 16])
def test_a_dot_product_for_each_element_of_a_row_is_not_in_place(cols):
    """h @ w reads all of h's row for each output element, after the elements before it were stored: written into
    h's place it would read its own results. A layernorm's mean and variance are read once a row, before its
    first store: that kernel may write in place."""
    h = jnp.asarray(_data(rows=4096, cols=cols))
    w = jnp.asarray(np.ones((cols, cols), np.float32))
    checked = 0
    for f, allowed in ((lambda h, w: h @ w, False), (lambda h, w: _layernorm_steps(jnp, h, 1) * w[0], True)):
        for k, lines in fnx.jit(f).lower(h, w).executable.lowering.kernels:
            if lines is None or k.thread_range < 0 or 0 not in k.buffers(Ops.LOAD): continue
            for b in k.buffers(Ops.STORE):
                if k.buffers(Ops.STORE) and b != 0:
                    assert chain_module._in_place(k, 0, b) is allowed, (k.name, b)
                    checked += 1
    assert checked >= 2


def test_a_kernel_whose_rows_run_inside_other_loops_joins_no_chain():
    """A large matmul's k-slabs and column blocks run outside its thread-split row loop, so that each column block
    of B stays in L2 while every row block walks it. Chained with the kernel that packs A, it ran all of them
    again for every block of rows (B read again from memory every 16 rows: 4096² 620 ms instead of 480-610).
    Lowered for a fixed AVX-512 target with a 2 MiB L2 (no code is run for it), the packing of A and the product
    are kernels of their own; the product on this host matches numpy in float64."""
    from dataclasses import replace

    from fnx.backends.cpu_target import host_target
    from fnx.config import config
    from fnx.lower.pipeline import lower
    n = 2048
    a_np, b_np = np.random.default_rng(3).standard_normal((2, n, n)).astype(np.float32)
    a, b = jnp.asarray(a_np), jnp.asarray(b_np)
    f = lambda a, b: a @ b  # noqa: E731
    target = replace(host_target(2, config.cpu_target), vector_bytes=64, vector_registers=32, fma=True,
                     l1_bytes=48 << 10, l2_bytes=2 << 20)
    lowering = lower(fnx.jit(f).lower(a, b).traced.fn, target, chains=True)
    kernels = [k for k, lines in lowering.kernels if lines is not None]
    nested = [k for k in kernels if any(r.arg.size > 1 for r in k.ranges[:k.thread_range])]
    assert [k.name for k in nested] == ["k0_dot_2048x2048x1_acc"], [k.name for k in kernels]  # (what is tested)
    assert any(k.name.endswith("_pack1") for k in kernels)  # A packed: a kernel the product could be chained with
    assert not any(m in nested for c in lowering.chains for m in c.members), lowering.chains
    got = np.asarray(fnx.jit(f)(a, b)).astype(np.float64)
    np.testing.assert_allclose(got, a_np.astype(np.float64) @ b_np, rtol=1e-4, atol=2e-3 * np.sqrt(n))


def _attention_grads(lib, nn_lib, grad_fn, t):
    """Causal attention's gradient with respect to q, k and v (as the W12 benchmark computes it)."""
    def block(q, k, v, g):
        mask = lib.arange(t)[:, None] >= lib.arange(t)[None, :]
        scores = lib.where(mask, q @ k.transpose(0, 1, 3, 2) / np.sqrt(q.shape[-1]), -1e9)
        return lib.sum((nn_lib.softmax(scores, axis=-1) @ v) * g)
    return grad_fn(block, argnums=(0, 1, 2))


@pytest.mark.parametrize("b,h", [(4, 4), (2, 8), (16, 1), (1, 16)])
def test_attention_kernels_chain_by_batch_and_head(b, h):
    """The batch and head loops of attention's kernels merge into one loop of b * h rows (optimize.
    merge_batch_loops), whatever the split of b * h, so every kernel from the scores to the output's product
    walks the same rows and one chain runs them by (batch, head): its scratch a block stays far below L2. The
    gradients match JAX's."""
    jax = pytest.importorskip("jax")
    t, d = 256, 64
    rng = np.random.default_rng(7)
    q, k, v, g = (rng.standard_normal((b, h, t, d)).astype(np.float32) for _ in range(4))
    args = [jnp.asarray(a) for a in (q, k, v, g)]
    f = _attention_grads(jnp, fnx.nn, fnx.grad, t)
    chains = _chains(f, *args)
    assert len(chains) == 1 and len(chains[0].members) >= 9, [(c.name, len(c.members)) for c in chains]
    assert chains[0].rows == b * h and chains[0].block == 1
    got = fnx.jit(f)(*args)
    want = jax.jit(_attention_grads(jax.numpy, jax.nn, jax.grad, t))(q, k, v, g)
    for x, y in zip(got, want): np.testing.assert_allclose(np.asarray(x), np.asarray(y), rtol=2e-4, atol=2e-4)


def test_the_loss_between_forward_and_backward_no_longer_splits_the_chain(monkeypatch):
    """value_and_grad of attention: the loss (a sum over everything, not row by row) is a kernel between the
    forward's and the backward's. chain_order moves the backward's kernels (which do not read the loss) up to the
    forward's, so one chain runs them all and the probabilities and their gradient stay in its scratch. Without
    it: not one chain of them all. The value and the gradients match JAX's, and are bit-identical in both orders."""
    jax = pytest.importorskip("jax")
    b, h, t, d = 2, 8, 256, 32  # (every row kernel thread-split: a smaller row sum runs on one thread)
    rng = np.random.default_rng(8)
    q, k, v, g = (rng.standard_normal((b, h, t, d)).astype(np.float32) for _ in range(4))
    args = [jnp.asarray(a) for a in (q, k, v, g)]

    def step(lib, nn_lib, value_and_grad):
        def block(q, k, v, g):
            mask = lib.arange(t)[:, None] >= lib.arange(t)[None, :]
            scores = lib.where(mask, q @ k.transpose(0, 1, 3, 2) / np.sqrt(d), -1e9)
            return lib.sum((nn_lib.softmax(scores, axis=-1) @ v) * g)
        return value_and_grad(block, argnums=(0, 1, 2))
    f = step(jnp, fnx.nn, fnx.value_and_grad)
    chains = _chains(f, *args)
    assert len(chains) == 1, [(c.name, len(c.members)) for c in chains]
    one = chains[0]
    lowering = fnx.jit(f).lower(*args).executable.lowering
    row_kernels = [k for k, lines in lowering.kernels if lines is not None and k.thread_range >= 0
                   and k.ranges[k.thread_range].arg.size == b * h]
    # (16 on AVX2; 11 on AVX-512: fewer operands packed, and the softmax's sum goes into the kernel of its exps)
    assert len(one.members) == len(row_kernels) >= 11
    value, grads = fnx.jit(f)(*args)
    want_value, want_grads = jax.jit(step(jax.numpy, jax.nn, jax.value_and_grad))(q, k, v, g)
    assert float(value) == pytest.approx(float(want_value), rel=1e-4, abs=1e-3)
    for x, y in zip(grads, want_grads): np.testing.assert_allclose(np.asarray(x), np.asarray(y), rtol=2e-4, atol=2e-4)
    with monkeypatch.context() as m:
        m.setattr(config, "cache_dir", None)
        m.setattr(chain_module, "CHAIN_ORDER", 0)
        relower()
        apart = _chains(f, *args)  # (two chains on AVX2; on AVX-512 the backward's few kernels make none)
        assert len(apart) != 1 or len(apart[0].members) < len(one.members)
        value2, grads2 = fnx.jit(f)(*args)
        assert float(value2) == float(value)
        for x, y in zip(grads2, grads): np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


def test_a_kernel_that_reads_the_sum_between_row_kernels_stays_after_it():
    """Two layernorm steps, the sum of everything, a kernel that reads that sum, then two more steps that do not:
    chain_order moves the two steps up before the sum (one chain of four instead of two and three), while the
    kernel that reads the sum stays after it. The results match numpy in float64."""
    x = _data(seed=5)

    def f(lib, x):
        a = _layernorm_steps(lib, x, 2)
        total = a.sum()
        return lib.exp(a * 1e-3) * (total * 1e-6), _layernorm_steps(lib, a, 2)

    lowering = fnx.jit(lambda x: f(jnp, x)).lower(jnp.asarray(x)).executable.lowering
    kernels = [k for k, _ in lowering.kernels]
    loads = [{k.args[u.src[0].arg.slot] for u in k.sink.toposort if u.op is Ops.LOAD} for k in kernels]
    stores = [{k.args[u.src[0].arg.slot] for u in k.sink.toposort if u.op is Ops.STORE} for k in kernels]
    summing = next(i for i, k in enumerate(kernels) if k.thread_range < 0 or k.ranges[k.thread_range].arg.size != ROWS)
    readers = [i for i, read in enumerate(loads) if read & stores[summing]]
    assert readers and min(readers) > summing  # the kernel that reads the sum runs after it
    assert [len(c.members) for c in lowering.chains] == [4] and lowering.chains[0].first == 0
    got = [np.asarray(r) for r in fnx.jit(lambda x: f(jnp, x))(jnp.asarray(x))]
    want = f(np, x.astype(np.float64))
    np.testing.assert_allclose(got[0], want[0], rtol=1e-4, atol=1e-6)
    np.testing.assert_allclose(got[1], want[1], rtol=5e-5, atol=5e-5)


@pytest.mark.parametrize("rows", [ROWS, 128])
def test_the_driver_prefetches_the_next_block_of_inputs_from_memory(rows):
    """An input larger than L2, read row by row, comes from memory: the driver prefetches its next block, a few
    lines before each member (RowChain.prefetch). One that fits L2 (here 512 KB where L2 holds it) and a
    broadcast parameter are not prefetched. Prefetches change no result."""
    x, g, b = _data(rows=rows), _data(rows=1)[0], _data(rows=1, seed=1)[0]
    f = lambda x, g, b: _layernorm_steps(jnp, x, 4, g, b)  # noqa: E731
    args = (jnp.asarray(x), jnp.asarray(g), jnp.asarray(b))
    executable = fnx.jit(f).lower(*args).executable
    (c,) = executable.lowering.chains
    target = cpu_llvm._compiler().target
    unit = COLS * 4 * rows // c.rows  # bytes of one of the chain's rows (a pair, where its kernels walk pairs)
    from_memory = x.nbytes > target.l2_bytes
    assert [r for _, r in c.prefetch] == ([unit] if from_memory else [])
    lines = c.block * unit // 64
    assert executable.source.count("call void @llvm.prefetch.p0(") == (lines if from_memory else 0)
    want = _layernorm_steps(np, x.astype(np.float64), 4, g.astype(np.float64), b.astype(np.float64))
    np.testing.assert_allclose(np.asarray(fnx.jit(f)(*args)), want, rtol=2e-5, atol=2e-5)


def test_a_block_too_large_to_prefetch_is_left_to_the_hardware(monkeypatch):
    monkeypatch.setattr(config, "cache_dir", None)  # (on-disk lowerings do not know the setting)
    monkeypatch.setattr(chain_module, "CHAIN_PREFETCH_LINES", 1)
    x = _data()
    f = lambda x: _layernorm_steps(jnp, x, 4)  # noqa: E731
    executable = fnx.jit(f).lower(jnp.asarray(x)).executable
    (c,) = executable.lowering.chains
    assert c.prefetch == [] and "llvm.prefetch" not in executable.source
    want = _layernorm_steps(np, x.astype(np.float64), 4)
    np.testing.assert_allclose(np.asarray(fnx.jit(f)(jnp.asarray(x))), want, rtol=2e-5, atol=2e-5)
