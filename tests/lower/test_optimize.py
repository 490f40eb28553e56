"""Schedules: every optimization action, alone and in random combinations, computes what the unoptimized kernel
and the interp oracle compute; the heuristics pick the expected actions; BEAM never loses to the heuristic."""
import re
from dataclasses import replace

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from assertions import one_action, random_schedule, wide_inputs
import fnx
import fnx.numpy as jnp
from fnx.backends import interp
from fnx.backends.cpu_target import host_target
from fnx.backends.device import Buffer, get_device
from fnx.config import config
from fnx.lower.optimize import SUM_VECTORS, Opt, OptError, apply_opt, heuristic_opts, schedule_override
from fnx.lower.pipeline import callify, lower
from fnx.lower.rangeify import rangeify

TARGET = host_target(2, config.cpu_target)  # what the cpu device compiles for, with 2 threads
AVX512 = replace(TARGET, vector_bytes=64, vector_registers=32)  # (heuristics only: never compiled)


def _matmul(a, b): return a @ b
def _matmul_t(a, b): return jnp.maximum(a @ b.T, 0)
def _batched_t(a, b): return a @ b.transpose(0, 2, 1)  # (attention's q kᵀ: B transposed, one per batch)
def _gelu(x, b): return 0.5 * (x + b) * (1 + jnp.tanh(0.79788456 * (x + b)))
def _row_softmax(x, b): return fnx.nn.softmax(x + b, axis=-1)
def _col_sum(x, b): return (x * b).sum(axis=0)
def _row_max(x, b): return jnp.max(x - b, axis=1)
def _int_ops(x, b): return (x * 3 + b) // 2 % 7 - (x > b)
def _flip_pad(x, b): return jnp.pad(x[::-1] * b, ((1, 2), (0, 3)))
def _totals(x, b): return jnp.sum(x * b) / 3 + jnp.max(x)  # (whole-array reductions: PARTIALS)
def _gather(x, b): return x[(jnp.abs(b[:3, 0]) * 10).astype(jnp.int32) % 4, :] + b[:3]


def _small_floats(x, b):  # float16 / bfloat16: float32 registers, rounded on every store
    return jnp.maximum(x * b + 1, x).astype(jnp.float32).sum(axis=1)
def _bools(x, b): return jnp.where((x > 0) & (b < 0.5), x, -x).astype(jnp.int8) + (x > b)
def _bytes(x, b): return ((x.astype(jnp.int32) * 7) >> 1).astype(jnp.uint8) + b
def _bf16_cast(x, b): return (x.astype(jnp.bfloat16) * b.astype(jnp.bfloat16)).astype(jnp.float16)


RNG = np.random.default_rng(0)
PROGRAMS = {  # name -> (function, arguments): odd sizes on purpose, so masks and remainders are exercised
    "matmul": (_matmul, (RNG.standard_normal((24, 40)).astype(np.float32),
                         RNG.standard_normal((40, 48)).astype(np.float32))),
    "matmul_f64": (_matmul, (RNG.standard_normal((12, 20)), RNG.standard_normal((20, 9)))),
    "matmul_t": (_matmul_t, (RNG.standard_normal((10, 13)).astype(np.float32),
                             RNG.standard_normal((37, 13)).astype(np.float32))),
    "batched_t": (_batched_t, (RNG.standard_normal((3, 10, 13)).astype(np.float32),
                               RNG.standard_normal((3, 37, 13)).astype(np.float32))),
    "gelu": (_gelu, (RNG.standard_normal((6, 37)).astype(np.float32), RNG.standard_normal(37).astype(np.float32))),
    "softmax": (_row_softmax, (RNG.standard_normal((5, 50)).astype(np.float32),
                               RNG.standard_normal((5, 50)).astype(np.float32))),
    "col_sum": (_col_sum, (RNG.standard_normal((33, 20)).astype(np.float32),
                           RNG.standard_normal((33, 20)).astype(np.float32))),
    "row_max": (_row_max, (RNG.standard_normal((7, 45)).astype(np.float32), np.float32(0.5))),
    "int_ops": (_int_ops, (RNG.integers(-50, 50, (9, 23)).astype(np.int32),
                           RNG.integers(-5, 5, (9, 23)).astype(np.int32))),
    "flip_pad": (_flip_pad, (RNG.standard_normal((6, 10)).astype(np.float32), np.float32(2.0))),
    "float16": (_small_floats, (RNG.standard_normal((5, 37)).astype(np.float16),
                                RNG.standard_normal((5, 37)).astype(np.float16))),
    "bools": (_bools, (RNG.standard_normal((7, 21)).astype(np.float32), RNG.random((7, 21)).astype(np.float32))),
    "bytes": (_bytes, (RNG.integers(0, 200, (6, 35)).astype(np.uint8), RNG.integers(0, 50, (6, 35)).astype(np.uint8))),
    "bf16_cast": (_bf16_cast, (RNG.standard_normal((3, 40)).astype(np.float32),
                               RNG.standard_normal((3, 40)).astype(np.float32))),
    # a stash (the max, read back per row) that the thread heuristic once tried to split off its rows (OptError)
    "stash_grad": (fnx.grad(lambda x: jnp.sum(jnp.maximum(jnp.maximum(jnp.max(x), x), x == 0.5))),
                   (np.linspace(-1.0, 1.0, 5000).astype(np.float32),)),
    "totals": (_totals, (RNG.standard_normal((37, 23)).astype(np.float32), RNG.standard_normal((37, 23)).astype(
        np.float32))),
    "gather": (_gather, (RNG.standard_normal((4, 18)).astype(np.float32), RNG.standard_normal((5, 18)).astype(
        np.float32))),
}


def _traced(name):
    fn, args = PROGRAMS[name]
    with fnx.enable_x64(wide_inputs(*args)):  # matmul_f64 tests float64
        lowered = fnx.jit(fn).lower(*[jnp.asarray(a) for a in args])
    return lowered.traced.fn, [np.asarray(a) for a in args]


def _run(fn, args, choose):
    with schedule_override(choose):
        exe = get_device("cpu").executable(fn)  # compiled here, never from the executable cache
    outs = exe([Buffer.from_numpy("cpu:0", a) for a in args])
    return [b.numpy(o.shape) for b, o in zip(outs, fn.src[0].src)]


def _check(name, choose):
    fn, args = _traced(name)
    expected = interp.run(fn, args)
    plain = _run(fn, args, lambda k, t: [])
    got = _run(fn, args, choose)
    for e, p, g in zip(expected, plain, got):
        # 16-bit floats compute in float32 registers here, rounded per op by the oracle (docs/IR.md)
        half = any(a.dtype.kind == "f" and a.dtype.itemsize == 2 for a in args) or g.dtype.itemsize == 2
        tol = (1e-2 if half else 1e-5) if g.dtype.kind == "f" else 0
        np.testing.assert_allclose(p, e, rtol=tol, atol=tol)
        np.testing.assert_allclose(g, e, rtol=tol, atol=tol)


SINGLE = [Opt("VECTORIZE", -1, 4), Opt("VECTORIZE", -1, 16), Opt("VECTORIZE", -1, 7), Opt("UPCAST", 0, 2),
          Opt("UPCAST", 0, 3), Opt("UPCAST", 0, 5), Opt("UPCAST", -2, 7),  # (5 and 7 leave clamped remainders)
          Opt("UNROLL", -1, 2), Opt("UNROLL", -1, 4), Opt("SPLIT", 0, 2), Opt("SPLIT", -1, 5),
          Opt("SWAP", 0, 1), Opt("THREAD", 0), Opt("ACCUMULATE", -1), Opt("PACK", -2, 16), Opt("PACK", -2, 7),
          Opt("PACK", 0, 5),  # (A of a matmul, in panels of 5 rows)
          Opt("SEPARATE", 0, 0),  # (matmul_t's relu: the product computed apart, by its own heuristic schedule)
          Opt("PARTIALS", 0, 2), Opt("PARTIALS", 0, 5)]  # (totals: 37 rows in chunks of 19 and 8, the last masked)


@pytest.mark.parametrize("name", sorted(PROGRAMS))
@pytest.mark.parametrize("action", SINGLE, ids=repr)
def test_each_action_alone_matches_the_oracle(name, action):
    applied = []
    _check(name, one_action(action, applied))


def test_the_single_actions_do_apply_somewhere():
    """The table above is not vacuous: every action applies to at least one kernel of the programs."""
    used = set()
    for name in PROGRAMS:
        fn, _ = _traced(name)
        for kernel in rangeify(callify(fn)).kernels:
            axes = len(kernel.ranges) + len(kernel.reduce_ranges)
            for action in SINGLE:
                try:
                    apply_opt(kernel, Opt(action.op, action.axis % axes if axes else 0, action.amount))
                    used.add(action)
                except OptError:
                    pass
    assert used == set(SINGLE)


@settings(max_examples=25)
@given(st.sampled_from(sorted(PROGRAMS)), st.data())
def test_random_action_sequences_match_the_oracle(name, data):
    _check(name, random_schedule(lambda n: data.draw(st.integers(0, n - 1))))


def test_heuristics_register_block_matmul():
    fn, _ = _traced("matmul")
    kernel = rangeify(callify(fn)).kernels[0]
    ops = [o.op for o in heuristic_opts(kernel, TARGET)]
    assert "VECTORIZE" in ops and "UPCAST" in ops


@pytest.mark.parametrize("transposed", [False, True], ids=["a@b", "a@b.T"])
def test_heuristics_pack_b_into_panels(transposed):
    """A matmul with many rows, and any a @ b.T, reads B from panels a prelude kernel packs; the result is the
    product (against numpy in float64) and the panels are a planned intermediate buffer."""
    a = RNG.standard_normal((520, 40)).astype(np.float32)
    b = RNG.standard_normal((72, 40) if transposed else (40, 72)).astype(np.float32)
    fn = (lambda a, b: a @ b.T) if transposed else (lambda a, b: a @ b)
    lowered = fnx.jit(fn).lower(jnp.asarray(a), jnp.asarray(b))
    text = lowered.as_text("optimize")
    assert "PACK(" in text and "_pack0" in text
    assert lowered.as_text("memory").startswith("1 intermediate buffers")
    want = a.astype(np.float64) @ (b.T if transposed else b).astype(np.float64)
    got = _run(lowered.traced.fn, [a, b], lambda k, t: None)[0]
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


def test_large_matmul_packs_a_and_blocks_rows_past_a_remainder():
    """A matmul whose A slab is read by many column blocks (a small L2 makes them many here) packs A as well,
    in panels of the register block's rows; 6 rows (AVX2's 6 x 16 block) do not divide 514 rows, so the last
    block computes its last 2 rows again and stores none of them. The product matches numpy in float64."""
    a = RNG.standard_normal((514, 384)).astype(np.float32)
    b = RNG.standard_normal((384, 1024)).astype(np.float32)
    lowered = fnx.jit(lambda a, b: a @ b).lower(jnp.asarray(a), jnp.asarray(b))
    small_l2 = replace(TARGET, vector_bytes=32, vector_registers=16, l2_bytes=64 << 10)  # AVX2-like (heuristics)
    chosen = []

    def choose(k, t):
        chosen.append(heuristic_opts(k, small_l2))
        return chosen[-1]
    got = _run(lowered.traced.fn, [a, b], choose)[0]
    matmul = next(o for o in chosen if any(x.op == "ACCUMULATE" for x in o))
    assert matmul[:2] == [Opt("PACK", 1, 16), Opt("PACK", 0, 6)] and Opt("UPCAST", 1, 6) in matmul, matmul
    np.testing.assert_allclose(got, a.astype(np.float64) @ b, rtol=1e-4, atol=1e-4)


def test_batched_transposed_product_packs_each_batchs_operand():
    """q @ kᵀ per (batch, head): the heuristics pack each batch's kᵀ into its own panels (a transposing copy) and
    schedule the plain product; the result matches numpy in float64."""
    a = RNG.standard_normal((2, 3, 40, 24)).astype(np.float32)
    b = RNG.standard_normal((2, 3, 36, 24)).astype(np.float32)
    lowered = fnx.jit(lambda a, b: a @ b.transpose(0, 1, 3, 2)).lower(jnp.asarray(a), jnp.asarray(b))
    chosen = []

    def choose(k, t):
        chosen.append(heuristic_opts(k, t))
        return chosen[-1]
    got = _run(lowered.traced.fn, [a, b], choose)[0]
    assert any(o and o[0].op == "PACK" for o in chosen), chosen
    np.testing.assert_allclose(got, a.astype(np.float64) @ b.transpose(0, 1, 3, 2), rtol=1e-4, atol=1e-4)


def test_rows_between_one_and_two_vectors_get_lanes_as_wide_as_the_row():
    """Per-example outer products with 10 classes: one vector of 10 lanes per row rather than 8 and a masked 2
    (whatever the target's width w, a row of w + 2 elements); the values match numpy."""
    lanes = TARGET.vector_bytes // 4
    x = RNG.standard_normal((6, 7)).astype(np.float32)
    g = RNG.standard_normal((6, lanes + 2)).astype(np.float32)
    lowered = fnx.jit(lambda x, g: x[:, :, None] * g[:, None, :]).lower(jnp.asarray(x), jnp.asarray(g))
    (kernel,) = rangeify(callify(lowered.traced.fn)).kernels
    assert Opt("VECTORIZE", 2, lanes + 2) in heuristic_opts(kernel, TARGET)
    got = _run(lowered.traced.fn, [x, g], lambda k, t: None)[0]
    np.testing.assert_allclose(got, x[:, :, None] * g[:, None, :], rtol=1e-6)


@pytest.mark.parametrize("classes", [5, 6, 10, 13])
def test_rows_shorter_than_a_vector_reduce_in_lanes_as_wide_as_the_row(classes):
    """log_softmax over rows of fewer elements than a vector holds but more than half of one (10 classes on
    AVX-512's 16 float lanes, 6 on AVX2's 8): its max and its sum reduce in lanes as wide as the row, not in scalar
    code (W5's softmax kernel on the AVX-512 Xeon: 15 -> 6.4 us). Either target's schedule, run here, matches
    float64 numpy, a NaN row included."""
    x = RNG.standard_normal((37, classes)).astype(np.float32)
    x[3, 1] = np.nan
    lowered = fnx.jit(lambda x: fnx.nn.log_softmax(x, axis=-1)).lower(jnp.asarray(x))
    kernels = rangeify(callify(lowered.traced.fn)).kernels
    wide = x.astype(np.float64)
    want = wide - wide.max(-1, keepdims=True) - np.log(np.exp(wide - wide.max(-1, keepdims=True)).sum(-1,
                                                                                                   keepdims=True))
    for target in (AVX512, replace(TARGET, vector_bytes=32, vector_registers=16)):
        lanes = target.vector_bytes // 4
        reduce_lanes = {o.amount for k in kernels if k.reduce_ranges for o in heuristic_opts(k, target)
                        if o.op == "VECTORIZE" and o.axis >= len(k.ranges)}
        if lanes // 2 < classes < lanes: assert reduce_lanes == {classes}, (target.vector_bytes, reduce_lanes)
        elif classes <= lanes // 2: assert not reduce_lanes
        shaped = lambda k, t, v=target: heuristic_opts(k, replace(t, vector_bytes=v.vector_bytes,  # noqa: E731
                                                                 vector_registers=v.vector_registers))
        got = _run(lowered.traced.fn, [x], shaped)[0]
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
        assert np.isnan(got[3]).all() and not np.isnan(np.delete(got, 3, axis=0)).any()


def test_narrow_product_gets_lanes_along_the_operand_that_walks_rows():
    """h.T @ g with 10 columns: lanes along h's contiguous rows, every column unrolled, a scattered store."""
    h = RNG.standard_normal((40, 96)).astype(np.float32)
    g = RNG.standard_normal((40, 10)).astype(np.float32)
    fn = lambda h, g: jnp.maximum(h, 0).T @ g  # noqa: E731
    lowered = fnx.jit(fn).lower(jnp.asarray(h), jnp.asarray(g))
    (kernel,) = rangeify(callify(lowered.traced.fn)).kernels
    assert heuristic_opts(kernel, AVX512)[:2] == [Opt("VECTORIZE", 0, 16), Opt("UPCAST", 1, 10)]
    got = _run(lowered.traced.fn, [h, g], lambda k, t: None)[0]
    np.testing.assert_allclose(got, np.maximum(h, 0).astype(np.float64).T @ g, rtol=1e-5, atol=1e-5)


def test_pack_is_refused_where_it_does_not_fit():
    fn, _ = _traced("matmul")
    kernel = rangeify(callify(fn)).kernels[0]
    for bad in (Opt("PACK", 2, 8), Opt("PACK", 1, 1), Opt("PACK", 1, 49)):  # a reduce loop; too narrow; wide
        with pytest.raises(OptError):
            apply_opt(kernel, bad)
    with pytest.raises(OptError):  # PACK comes first
        apply_opt(apply_opt(kernel, Opt("VECTORIZE", 1, 16)), Opt("PACK", 1, 16))


def test_vector_lanes_reach_llvm():
    x = jnp.ones((64, 64))
    lanes = TARGET.vector_bytes // 4  # float32s in one vector register of the target
    text = fnx.jit(lambda x: x * 2 + 1).lower(x).as_text("llvm")
    assert f"load <{lanes} x float>" in text and f"<{lanes * SUM_VECTORS} x float>" not in text
    # a transcendental's chain of dependent FMAs: SUM_VECTORS independent vectors an iteration
    text = fnx.jit(lambda x: jnp.exp(x) * 2).lower(x).as_text("llvm")
    assert f"load <{lanes * SUM_VECTORS} x float>" in text


def test_actions_that_break_independence_are_refused():
    fn, _ = _traced("matmul")
    kernel = rangeify(callify(fn)).kernels[0]
    acc = apply_opt(kernel, Opt("ACCUMULATE", 2))   # the k loop now runs outermost, in order
    for bad in (Opt("UPCAST", 0, 2), Opt("VECTORIZE", 0, 4), Opt("THREAD", 0)):
        with pytest.raises(OptError):
            apply_opt(acc, bad)
    with pytest.raises(OptError):
        apply_opt(kernel, Opt("UNROLL", 2, 7))     # 7 does not divide 40 (an UPCAST by 7 clamps its remainder)


def test_beam_search_caches_a_schedule_no_slower_than_the_heuristic(tmp_path, monkeypatch, capsys):
    from fnx.backends.cpu_beam import kernel_timers
    from fnx.backends.cpu_llvm import _compiler
    from fnx.lower import search
    monkeypatch.setattr(config, "beam", 2)
    monkeypatch.setattr(config, "cache_dir", str(tmp_path))
    monkeypatch.setattr(search, "MAX_DEPTH", 2)
    fn, args = _traced("matmul")
    kernel = rangeify(callify(fn)).kernels[0]
    opts, best, heuristic = search.beam_search(kernel, TARGET, 2, kernel_timers(_compiler()))
    assert best <= heuristic  # the heuristic's schedule is a candidate, timed in the same run
    with capsys.disabled():
        print(f"\nBEAM 24x40x48 matmul: {opts} {best * 1e6:.1f} us, heuristic {heuristic * 1e6:.1f} us")
    got = _run(fn, args, lambda k, t: None)       # None: FNX_BEAM decides, and writes its choice to the cache
    np.testing.assert_allclose(got[0], args[0] @ args[1], rtol=1e-5, atol=1e-5)
    assert list((tmp_path / "beam").glob("*.json"))

    def no_search(*a):
        raise AssertionError("the cached schedule should have been used")
    monkeypatch.setattr(search, "beam_search", no_search)
    again = _run(fn, args, lambda k, t: None)
    np.testing.assert_allclose(again[0], got[0])


def test_beam_without_a_timer_uses_the_heuristics(monkeypatch):
    """FNX_BEAM set, but lowered with no `measure` (nothing to time kernels with): the hand heuristics decide."""
    monkeypatch.setattr(config, "beam", 2)
    fn, _ = _traced("matmul")
    (kernel,), ((lowered, _),) = rangeify(callify(fn)).kernels, lower(fn, TARGET).kernels
    assert list(lowered.opts) == heuristic_opts(kernel, TARGET)


def test_fusable_adds_become_fmuladd_and_keep_their_value_under_transforms():
    """lax._fusable_add (fnx.numpy's polynomials): one llvm.fmuladd per Horner step, within an ulp of numpy, and
    grad / vmap / the interp oracle treat it as an ordinary ADD."""
    from fnx import lax

    def poly(x):
        return lax._fusable_add(lax._fusable_add(x * 0.25, 0.5) * x, -1.5)
    x = np.linspace(-3, 3, 40).astype(np.float32)
    assert fnx.jit(poly).lower(jnp.asarray(x)).as_text("llvm").count("@llvm.fmuladd") >= 2
    want = (x.astype(np.float64) * 0.25 + 0.5) * x - 1.5
    np.testing.assert_allclose(np.asarray(fnx.jit(poly)(jnp.asarray(x))), want, rtol=2e-7, atol=1e-6)
    with fnx.default_device("interp"):
        np.testing.assert_allclose(np.asarray(poly(jnp.asarray(x))), want, rtol=2e-7, atol=1e-6)
    grads = fnx.vmap(fnx.grad(poly))(jnp.asarray(x))
    np.testing.assert_allclose(np.asarray(grads), 0.5 * x + 0.5, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("threads", [2, 8])
def test_heuristics_with_threads_apply_to_every_program(threads):
    for name in PROGRAMS:
        _check(name, lambda k, t: heuristic_opts(k, replace(t, threads=threads)))


def test_few_heavy_iterations_are_threaded():
    """A kernel with too few iterations for a thread hand-off but heavy ones (estimated FLOPs, fnx/lower/cost.py) is
    split across the threads; a light kernel of the same size is not. The threaded result is checked."""
    from fnx.lower.cost import kernel_flops
    from fnx.lower.optimize import MIN_PARALLEL_ELEMENTS, MIN_PARALLEL_FLOPS

    def heavy(x):
        for _ in range(20): x = jnp.sin(x) * 1.5 + jnp.exp(-x * x)
        return x
    x = np.linspace(-2, 2, 128 * 512, dtype=np.float32).reshape(128, 512)
    for fun, threaded in ((heavy, True), (lambda x: x * 2 + 1, False)):
        kernels = rangeify(callify(fnx.make_graph(fun)(x).fn)).kernels
        assert len(kernels) == 1 and kernels[0].work < MIN_PARALLEL_ELEMENTS
        assert (kernel_flops(kernels[0]) >= MIN_PARALLEL_FLOPS) == threaded
        assert any(o.op == "THREAD" for o in heuristic_opts(kernels[0], TARGET)) == threaded
    expected = x.astype(np.float64)
    for _ in range(20): expected = np.sin(expected) * 1.5 + np.exp(-expected * expected)
    np.testing.assert_allclose(np.asarray(fnx.jit(heavy)(x)), expected, rtol=2e-4, atol=2e-4)


def test_elementwise_kernels_thread_sooner_than_reductions():
    """A kernel with no reduction is split across the threads from MIN_PARALLEL_ELEMENTS elements (memory traffic
    is most of it: x*2+1 on 2^18 floats, 49 -> 25 us on two threads); a product of the same work is not (its
    register blocks split unevenly and the hand-off is a large part of it: 128 x 256 x 10, 12.6 us on one
    thread, 17-24 on two). Both give numpy's values."""
    from fnx.lower.optimize import MIN_PARALLEL_ELEMENTS, MIN_PARALLEL_WORK
    a = RNG.standard_normal((128, 256)).astype(np.float32)
    g = RNG.standard_normal((128, 10)).astype(np.float32)
    w = RNG.standard_normal((256, 10)).astype(np.float32)
    cases = [(lambda a, g: a[:, :, None] * g[:, None, :], (a, g), a[:, :, None] * g[:, None, :], True),
             (lambda a, g: a[:, :100, None] * g[:, None, :], (a, g), a[:, :100, None] * g[:, None, :], False),
             (lambda a, w: a @ w, (a, w), a.astype(np.float64) @ w, False)]
    for fun, args, want, threaded in cases:
        lowered = fnx.jit(fun).lower(*[jnp.asarray(v) for v in args])
        (kernel,) = rangeify(callify(lowered.traced.fn)).kernels
        assert kernel.work < MIN_PARALLEL_WORK and (kernel.work >= MIN_PARALLEL_ELEMENTS) == (
            threaded or bool(kernel.reduce_ranges))  # (the product as much work as the first)
        assert any(o.op == "THREAD" for o in heuristic_opts(kernel, TARGET)) == threaded
        np.testing.assert_allclose(_run(lowered.traced.fn, list(args), lambda k, t: None)[0], want, rtol=1e-5,
                                   atol=1e-5)


@pytest.mark.parametrize("width", [1024, 1000, 48])
def test_row_sums_accumulate_in_several_vectors(width):
    """A layernorm row's sums accumulate in SUM_VECTORS vectors (independent chains of adds) where that leaves no
    masked remainder, fewer where it would; the result matches float64 either way."""
    x_np = np.random.default_rng(0).standard_normal((8, width)).astype(np.float32) * 3 + 1

    def layernorm(x):
        mean = x.mean(-1, keepdims=True)
        return (x - mean) / jnp.sqrt(((x - mean) ** 2).mean(-1, keepdims=True) + 1e-5)
    lowering = fnx.jit(layernorm).lower(jnp.asarray(x_np)).executable.lowering
    (kernel, _), = [(k, lines) for k, lines in lowering.kernels if lines is not None]
    lanes = TARGET.vector_bytes // 4
    vectors = next((v for v in (SUM_VECTORS, 2) if width % (v * lanes) == 0), 1)
    assert kernel.lanes and kernel.lanes[0].arg.size == lanes * vectors
    x64 = x_np.astype(np.float64)
    want = (x64 - x64.mean(-1, keepdims=True)) / np.sqrt(x64.var(-1, keepdims=True) + 1e-5)
    np.testing.assert_allclose(np.asarray(fnx.jit(layernorm)(jnp.asarray(x_np))), want, rtol=2e-5, atol=2e-5)


def _sgd(w, x, g): return w - 0.1 * (x.T @ g)  # a weight gradient with the update fused in


@pytest.mark.parametrize("m,k,n", [(96, 1024, 2048), (600, 1000, 1100)])
def test_a_matmul_under_an_epilogue_is_computed_apart_to_take_k_slabs(m, k, n):
    """`w - lr * x.T @ g` with a B beyond L2: the sum cannot accumulate k-slab by k-slab in an output that holds
    `w - ...`, so SEPARATE computes it into a buffer of its own first (there it takes the k-slabs, and with 600
    rows PACK too: two placeholder buffers, one inside the other's schedule), then a pass applies the update."""
    rng = np.random.default_rng(m)
    w, x, g = (rng.standard_normal(s).astype(np.float32) for s in ((m, n), (k, m), (k, n)))
    lowered = fnx.jit(_sgd).lower(w, x, g)
    [kernel] = rangeify(callify(lowered.traced.fn)).kernels
    assert heuristic_opts(kernel, TARGET)[0] == Opt("SEPARATE", 0, 0)
    text = lowered.as_text("optimize")
    assert "_sum" in text and "ACCUMULATE" in text and ("PACK" in text) == (m >= 512)
    want = w.astype(np.float64) - 0.1 * (x.astype(np.float64).T @ g.astype(np.float64))
    got = np.asarray(fnx.jit(_sgd)(w, x, g))
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5 * np.sqrt(k) * 4)
    for again in (fnx.jit(_sgd)(w, x, g), fnx.jit(_sgd)(w, x, g)):  # (a second call reuses the buffers)
        np.testing.assert_array_equal(np.asarray(again), got)


def test_separate_refuses_what_it_cannot_split():
    bare = rangeify(callify(fnx.jit(lambda a, b: a @ b).lower(np.ones((8, 9), np.float32),
                                                             np.ones((9, 10), np.float32)).traced.fn)).kernels[0]
    with pytest.raises(OptError, match="epilogue"):
        apply_opt(bare, Opt("SEPARATE", 0, 0))
    with pytest.raises(OptError, match="before every other action"):
        apply_opt(apply_opt(bare, Opt("THREAD", 0)), Opt("SEPARATE", 0, 0))
    # a column sum's mean has an epilogue too, but it is no product of two operands: the heuristic leaves it whole
    [mean] = rangeify(callify(fnx.jit(lambda x: x.mean(axis=0)).lower(np.ones((4096, 512), np.float32))
                              .traced.fn)).kernels
    assert Opt("SEPARATE", 0, 0) not in heuristic_opts(mean, TARGET)


def test_pack_copies_store_whole_vectors():
    """PACK's copy of a transposed B (`a @ b.T`) walks the panel's columns innermost, in lanes (its stores whole
    vectors, its loads gathered), not a scalar column at a time; the product still matches float64 numpy."""
    rng = np.random.default_rng(5)
    a, b = rng.standard_normal((700, 96)).astype(np.float32), rng.standard_normal((300, 96)).astype(np.float32)
    lowered = fnx.jit(_matmul_t).lower(a, b)
    packs = [line for line in lowered.as_text("optimize").splitlines() if "_pack" in line]
    assert packs and all("VECTORIZE" in line for line in packs), packs
    want = np.maximum(a.astype(np.float64) @ b.T.astype(np.float64), 0)
    np.testing.assert_allclose(np.asarray(fnx.jit(_matmul_t)(a, b)), want, rtol=1e-5, atol=1e-4)


def test_separated_sums_from_several_threads_at_once():
    """Four threads call one jitted SGD step whose weight gradient is computed apart (SEPARATE: a buffer of the
    schedule between two kernels) on their own inputs at once; each gets its own float64-numpy answer."""
    from concurrent.futures import ThreadPoolExecutor
    rng = np.random.default_rng(11)
    m, k, n = 96, 1024, 2048
    cases = [tuple(rng.standard_normal(s).astype(np.float32) for s in ((m, n), (k, m), (k, n))) for _ in range(4)]
    step = fnx.jit(_sgd)
    [kernel] = rangeify(callify(step.lower(*cases[0]).traced.fn)).kernels
    assert heuristic_opts(kernel, TARGET)[0] == Opt("SEPARATE", 0, 0)
    with ThreadPoolExecutor(4) as pool:
        results = list(pool.map(lambda c: [np.asarray(step(*c)) for _ in range(3)], cases))
    for (w, x, g), got in zip(cases, results):
        want = w.astype(np.float64) - 0.1 * (x.astype(np.float64).T @ g.astype(np.float64))
        for r in got: np.testing.assert_allclose(r, want, rtol=1e-5, atol=1e-5 * np.sqrt(k) * 4)


@pytest.mark.parametrize("n", [42, 17, 64])
def test_gather_after_a_sum_split_into_masked_vectors(n):
    """One kernel sums over x and then gathers at the sum (a median's count of its non-NaN values): vectors of 8
    over the sum leave a masked remainder when 8 does not divide n; the gather reads the sum, not the loop, so
    it runs once after the loop without the loop's mask. Against numpy, and with the plain schedule."""
    x = RNG.standard_normal(n).astype(np.float32)
    fn = fnx.jit(lambda x: x[jnp.sum(x > 0) // 2] * 2.0 + jnp.sum(x)).lower(jnp.asarray(x)).traced.fn
    vectorized = lambda k, t: [Opt("VECTORIZE", 0, 8)] if k.reduce_ranges and not k.ranges else []  # noqa: E731
    want = x[(x > 0).sum() // 2] * 2.0 + x.astype(np.float64).sum()
    for choose in (lambda k, t: [], vectorized):
        np.testing.assert_allclose(_run(fn, [x], choose)[0], want, rtol=1e-5)


def test_an_accumulating_matmul_needs_no_pass_that_sets_its_output_first():
    """k-slabs (SPLIT + ACCUMULATE): the first slab starts from 0 instead of the output's old contents, so there is
    no kernel that zeroes the output first; the output's memory, reused from a result full of NaN, does not leak
    into the product."""
    n = 1024
    rng = np.random.default_rng(5)
    a, b = rng.standard_normal((2, n, n)).astype(np.float32)
    mm = fnx.jit(lambda a, b: a @ b)
    text = mm.lower(jnp.asarray(a), jnp.asarray(b)).as_text("optimize")
    assert "ACCUMULATE" in text and "_init" not in text
    want = a.astype(np.float64) @ b.astype(np.float64)
    for _ in range(2):
        nan = fnx.jit(lambda x: x * np.float32(np.nan))(jnp.ones((n, n)))
        nan.block_until_ready()
        del nan  # its block goes back to the pool, for the product's output
        got = np.asarray(mm(jnp.asarray(a), jnp.asarray(b)))
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4 * np.sqrt(n))


@pytest.mark.parametrize("n", [1 << 22, (1 << 22) + 1])
def test_a_whole_array_reduction_is_split_across_the_threads(n):
    """A reduction to one value has no output loop to thread-split: PARTIALS computes a partial per thread first
    (where the threads divide the loop), then the kernel reduces those; the sum, max and mean still match numpy's
    float64 answers, and a second call (reused buffers) gives the same bits."""
    x = np.random.default_rng(n).random(n, dtype=np.float32)
    f = lambda x: (jnp.sum(x * x), jnp.max(x), jnp.mean(x))  # noqa: E731
    kernels = [k for k in rangeify(callify(fnx.jit(f).lower(x).traced.fn)).kernels if k.reduce_ranges]
    assert len(kernels) == 3
    for kernel in kernels:
        assert (heuristic_opts(kernel, TARGET)[:1] == [Opt("PARTIALS", 0, 2)]) == (n % 2 == 0)
    text = fnx.jit(f).lower(x).as_text("optimize")
    assert ("_partials" in text) == (n % 2 == 0 and get_device("cpu").threads > 1)
    got = [np.asarray(v) for v in fnx.jit(f)(x)]
    wide = x.astype(np.float64)
    np.testing.assert_allclose(got[0], np.sum(wide * wide), rtol=1e-6)
    assert got[1] == x.max()
    np.testing.assert_allclose(got[2], wide.mean(), rtol=1e-6)
    again = [np.asarray(v) for v in fnx.jit(f)(x)]
    for a, b in zip(again, got): np.testing.assert_array_equal(a, b)


def test_a_mean_of_row_sums_is_split_across_the_threads_with_lanes_along_the_rows():
    """A loss `-(log_softmax(x) * y).sum(-1).mean()` is a sum over the rows of sums along them: one reduction
    inside the other. PARTIALS splits the outer one (it took one thread), and the lanes run along the row, where x
    and y are contiguous, not across rows (a row's max is contiguous that way, and lanes there gathered x and y:
    5.8 ms for 4096 x 1000); the loss and its gradient match JAX's, twice."""
    jax = pytest.importorskip("jax")
    rng = np.random.default_rng(7)
    x = rng.standard_normal((1100, 1000)).astype(np.float32)
    y = np.eye(1000, dtype=np.float32)[rng.integers(0, 1000, 1100)]

    def loss(lib, nn):
        return lambda x, y: -(nn.log_softmax(x) * y).sum(-1).mean()
    f = fnx.jit(fnx.value_and_grad(loss(jnp, fnx.nn)))
    [total] = [k for k in rangeify(callify(f.lower(x, y).traced.fn)).kernels
               if not k.ranges and len(k.reduce_ranges) == 2]
    assert heuristic_opts(total, TARGET)[0] == Opt("PARTIALS", 0, 2)
    text = f.lower(x, y).as_text("optimize")
    [line] = [ln for ln in text.splitlines() if "_scalar" in ln and "VECTORIZE" in ln]  # (the loss's kernel)
    outputs = 0 if "loops []" in line else 1  # (its chunk loop, when the threads took partials)
    axes = [int(a) for a in re.findall(r"VECTORIZE\((\d+),", line)]
    assert axes == [outputs + 1], line  # (the columns: after the rows)
    want = jax.jit(jax.value_and_grad(loss(jax.numpy, jax.nn)))(x, y)
    for _ in range(2):
        got = f(x, y)
        np.testing.assert_allclose(float(got[0]), float(want[0]), rtol=1e-6)
        np.testing.assert_allclose(np.asarray(got[1]), np.asarray(want[1]), rtol=1e-5, atol=1e-9)


def test_partials_refuses_what_it_cannot_split():
    [rows] = rangeify(callify(fnx.jit(lambda x: x.sum(axis=1)).lower(np.ones((64, 64), np.float32)).traced.fn)).kernels
    with pytest.raises(OptError, match="without output loops"):
        apply_opt(rows, Opt("PARTIALS", 0, 2))
    [total] = rangeify(callify(fnx.jit(jnp.sum).lower(np.ones(64, np.float32)).traced.fn)).kernels
    with pytest.raises(OptError, match="amount"):
        apply_opt(total, Opt("PARTIALS", 0, 40))
    with pytest.raises(OptError, match="first"):
        apply_opt(apply_opt(total, Opt("VECTORIZE", 0, 4)), Opt("PARTIALS", 0, 2))


def test_whole_array_partials_in_float16_from_several_threads_match_jax():
    """float16 sum / mean / max of 2^21 values (partials per thread) are JAX's, called from four threads at once,
    and a grad of a whole-array sum under jit is 2 * x summed."""
    import threading
    jax = pytest.importorskip("jax")
    x = (np.random.default_rng(5).random(1 << 21) * 0.01).astype(np.float16)
    f = fnx.jit(lambda x: (jnp.sum(x), jnp.mean(x), jnp.max(x)))
    want = [np.asarray(v) for v in jax.jit(lambda x: (jax.numpy.sum(x), jax.numpy.mean(x), jax.numpy.max(x)))(x)]
    results, errors = [], []

    def call():
        try:
            results.append([np.asarray(v) for v in f(x)])
        except Exception as e:  # surfaced below
            errors.append(e)
    threads = [threading.Thread(target=call) for _ in range(4)]
    for t in threads: t.start()
    for t in threads: t.join()
    assert not errors and len(results) == 4
    for got in results:
        for g, w in zip(got, want): np.testing.assert_allclose(g.astype(np.float32), w.astype(np.float32), rtol=2e-3)
    z = np.random.default_rng(6).random(1 << 22).astype(np.float32)
    h = fnx.jit(lambda x: fnx.grad(lambda v: jnp.sum(v * v))(x).sum())
    np.testing.assert_allclose(float(h(z)), 2 * z.astype(np.float64).sum(), rtol=1e-6)
