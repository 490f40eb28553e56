"""Long float reductions against float64 numpy, at 2^20, 2^24 and 2^26 elements: sums are blocked into levels of
partial sums whatever the schedule (`block_sums` in fnx/lower/optimize.py, the bound in docs/LOWERING.md), so
their relative error stays near numpy's pairwise sums, eager and jit, threaded or not, under random schedules."""
import functools
import math
from dataclasses import replace
import os
import subprocess
import sys

import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from assertions import random_schedule
import fnx
import fnx.numpy as jnp
from fnx.backends.device import Buffer, get_device
from fnx.lower.optimize import (FLAT_SUM_MAX, SUM_BLOCK, SUM_BLOCK_WIDE, Opt, OptError, apply_opt, apply_opts,
                                heuristic_opts, schedule_override)
from fnx.lower.pipeline import callify
from fnx.lower.rangeify import rangeify
from fnx.uop import Ops

BOUND = 1e-6  # relative error of a float32 sum of positive values; a flat loop reached 1e-5 at 2^26 (4% for 0.1s)
SIZES = [20, 24, 26]


@functools.cache
def _positive(log2n: int) -> np.ndarray:
    """2^log2n float32 values uniform in [0, 1) (shared by the tests: 256 MB at 2^26)."""
    x = np.random.default_rng(log2n).random(2 ** log2n, dtype=np.float32)
    x.flags.writeable = False
    return x


def _f64_sums(x: np.ndarray, axis=None) -> np.ndarray:
    return np.add.reduce(x, axis=axis, dtype=np.float64)


@functools.cache
def _f64_stats(log2n: int) -> tuple[float, float]:
    """The float64 sum and variance of _positive(log2n)."""
    x = _positive(log2n)
    total = float(_f64_sums(x))
    squares = sum(float(np.square(c.astype(np.float64) - total / x.size).sum()) for c in x.reshape(-1, 1 << 18))
    return total, squares / x.size


def _rel(got, want) -> float:
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    return float(np.max(np.abs(got - want) / np.abs(want)))


def _call(f, mode: str, *args):
    return np.asarray((fnx.jit(f) if mode == "jit" else f)(*[jnp.asarray(a) for a in args]))


# ---- the escaped bug: the mean of 2^26 copies of 0.1 was 0.0960 ----

@pytest.mark.parametrize("mode", ["eager", "jit"])
def test_mean_of_a_constant_is_the_constant(mode):
    got = _call(lambda: jnp.mean(jnp.full(2 ** 26, 0.1, jnp.float32)), mode)
    np.testing.assert_allclose(got, np.float32(0.1), rtol=3e-7)  # 2 ulp, as numpy's pairwise mean


def test_fused_sum_of_a_broadcast_does_not_saturate():
    """2^34 twos, never in memory (a fused broadcast): each vector lane used to stop at 2^25, the sum at 2^29."""
    got = fnx.jit(lambda: jnp.full((131072, 131072), 2.0).sum())()
    assert float(got) == 2.0 ** 35


def test_fused_sum_of_products_of_two_inputs():
    """2^26 products of two inputs fused into one sum (nothing to fold): sum of an outer product."""
    x, y = _positive(26)[:2 ** 13], _positive(26)[2 ** 13:2 ** 14]
    got = _call(lambda x, y: (x[:, None] * y[None, :]).sum(), "jit", x, y)
    assert _rel(got, _f64_sums(x) * _f64_sums(y)) <= BOUND


# ---- sum, mean, var, cumsum, matmul at every size ----

@pytest.mark.parametrize("mode", ["eager", "jit"])
@pytest.mark.parametrize("log2n", SIZES)
def test_sum_mean_var(log2n, mode):
    x = _positive(log2n)
    total, var = _f64_stats(log2n)
    assert _rel(_call(jnp.sum, mode, x), total) <= BOUND
    assert _rel(_call(jnp.mean, mode, x), total / x.size) <= BOUND
    assert _rel(_call(jnp.var, mode, x), var) <= BOUND


@pytest.mark.parametrize("log2n,mode", [(20, "eager"), (20, "jit"), (24, "jit")])
def test_cumsum(log2n, mode):
    """cumsum is a log-step scan (fnx/lax.py): every prefix is a tree of additions, accurate at any length
    (2^26 is left out: the scan does n log n work, 26 passes over 256 MB)."""
    x = _positive(log2n)
    assert _rel(_call(jnp.cumsum, mode, x), np.cumsum(x, dtype=np.float64)) <= BOUND


@pytest.mark.parametrize("mode", ["eager", "jit"])
def test_matmul_with_a_long_contraction(mode):
    a, b = _positive(24)[:2 ** 21].reshape(2, 2 ** 20), _positive(26)[:2 ** 21].reshape(2 ** 20, 2)
    want = a.astype(np.float64) @ b.astype(np.float64)
    assert _rel(_call(lambda a, b: a @ b, mode, a, b), want) <= BOUND


@pytest.mark.parametrize("mode", ["eager", "jit"])
def test_max_min_prod(mode):
    x = _positive(24)
    assert _call(jnp.max, mode, x) == x.max() and _call(jnp.min, mode, x) == x.min()  # exact in any order
    # exact in any order: 2^20 factors of 1, 2, 0.5 and -1 whose partial products stay far from overflow
    signs_and_powers = np.ones(2 ** 20, np.float32)
    signs_and_powers[:64], signs_and_powers[64:124], signs_and_powers[124:127] = 2.0, 0.5, -1.0
    exact = np.random.default_rng(7).permutation(signs_and_powers)
    assert _call(jnp.prod, mode, exact) == -16.0
    # rounded at every product: 2^20 factors near 1. The error depends on the order (on this data numpy's
    # sequential float32 product is 2.9e-5 off, a pairwise tree 2.7e-3, JAX's CPU prod 1.7e-3; fnx 1.3e-4): a bound
    # on the accumulated rounding, where the exact case above checks that every factor is used once
    near_one = (1 + (_positive(20) - 0.5) * 2 ** -10).astype(np.float32)
    want = np.exp(np.log(near_one.astype(np.float64)).sum())
    assert _rel(_call(jnp.prod, mode, near_one), want) <= 5e-4


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_16_bit_sums_accumulate_in_float32(dtype):
    """A REDUCE of 16-bit floats sums in float32 and rounds once (its blocked levels too): the result is the exact
    sum rounded to the dtype, within one ulp (a 16-bit accumulator stops growing once half its ulp passes 0.02)."""
    x = jnp.asarray(_positive(20) * 0.02).astype(dtype)
    values = np.asarray(x.astype(jnp.float32), np.float64)

    def rounded(v: float) -> float:
        return float(jnp.asarray(np.float32(v)).astype(dtype).astype(jnp.float32))
    for f, want in ((lambda x: fnx.lax.reduce_sum(x, (0,)), values.sum()), (jnp.mean, values.mean())):
        got = float(fnx.jit(f)(x).astype(jnp.float32))
        ulp = 2.0 ** (math.floor(math.log2(want)) - (10 if dtype == "float16" else 7))
        assert abs(got - rounded(want)) <= ulp, (got, want)


# ---- every axis, threaded or not ----

AXES = {  # name -> (function, shape, float64 oracle): 2^26 elements reduced along rows, columns, a middle axis, all
    "rows": (lambda x: x.sum(axis=1), (64, 2 ** 20), lambda x: _f64_sums(x, 1)),
    "columns": (lambda x: x.sum(axis=0), (2 ** 20, 64), lambda x: _f64_sums(x, 0)),
    "middle": (lambda x: jnp.mean(x, axis=1), (16, 2 ** 16, 64), lambda x: _f64_sums(x, 1) / x.shape[1]),
    "all_2d": (lambda x: x.sum(), (2 ** 13, 2 ** 13), _f64_sums),
}


def _compile_and_run(fn, args, choose):
    with schedule_override(choose):
        exe = get_device("cpu").executable(fn)  # compiled here, never from the executable cache
    outs = exe([Buffer.from_numpy("cpu:0", a) for a in args])
    return [b.numpy(o.shape) for b, o in zip(outs, fn.src[0].src)]


@pytest.mark.parametrize("threads", [1, 8])
@pytest.mark.parametrize("name", sorted(AXES))
def test_every_axis_with_and_without_threads(name, threads):
    f, shape, oracle = AXES[name]
    x = _positive(26).reshape(shape)
    lowered = fnx.jit(f).lower(jnp.asarray(x))
    chosen = []

    def choose(kernel, target):
        opts = heuristic_opts(kernel, replace(target, threads=threads))
        chosen.extend(opts)
        return opts
    got = _compile_and_run(lowered.traced.fn, [x], choose)[0]
    assert _rel(got, oracle(x)) <= BOUND
    if threads > 1 and name in ("rows", "columns", "middle"):
        assert Opt("THREAD", 0) in chosen  # the threaded schedule is the one tested


SINGLE_THREAD = """
import numpy as np, fnx, fnx.numpy as jnp
x = np.random.default_rng(0).random((16, 2 ** 20), dtype=np.float32)
rows = np.asarray(fnx.jit(lambda x: x.sum(axis=1))(jnp.asarray(x)))
want = np.add.reduce(x, axis=1, dtype=np.float64)
print(fnx.jit(lambda x: x.sum(axis=1)).lower(x).executable.threads, float(np.max(np.abs(rows - want) / want)),
      float(jnp.mean(jnp.full(2 ** 26, 0.1, jnp.float32))))
"""


def test_one_cpu_thread():
    env = dict(os.environ, FNX_CPU_THREADS="1")
    done = subprocess.run([sys.executable, "-c", SINGLE_THREAD], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    threads, rel, mean = done.stdout.split()
    assert threads == "1" and float(rel) <= BOUND
    np.testing.assert_allclose(float(mean), np.float32(0.1), rtol=3e-7)


# ---- every schedule: random actions, as BEAM's candidates are drawn ----

PROGRAMS = {  # name -> (function, arguments, float64 oracle), 2^24 elements but one
    "sum": (lambda x: x.sum(), (_positive(24).reshape(2 ** 12, 2 ** 12),), _f64_sums),
    "rows": (lambda x: x.sum(axis=1), (_positive(24).reshape(16, 2 ** 20),), lambda x: _f64_sums(x, 1)),
    "columns": (lambda x: x.sum(axis=0), (_positive(24).reshape(2 ** 20, 16),), lambda x: _f64_sums(x, 0)),
    "var": (lambda x: jnp.var(x), (_positive(24),), lambda x: _f64_stats(24)[1]),
    "matmul": (lambda a, b: a @ b, (_positive(24)[:2 ** 21].reshape(2, 2 ** 20),
                                    _positive(24)[2 ** 21:2 ** 22].reshape(2 ** 20, 2)),
               lambda a, b: a.astype(np.float64) @ b.astype(np.float64)),
    "exp_sum": (lambda x: jnp.exp(x).sum(axis=-1), (_positive(24).reshape(4, 2 ** 22),),
                lambda x: np.exp(x.astype(np.float64)).sum(axis=-1)),
    "prime": (lambda x: x.sum(), (_positive(20)[:1000003],), _f64_sums),  # no divisor: levels with masked tails
}


def _random_schedule(draw_index, applied: list):
    return random_schedule(draw_index, tries=12, applied=applied)


def _additions_in_a_row(k) -> list[tuple[int, int]]:
    """For each float sum of an optimized kernel, and for ACCUMULATE's passes into the output: (additions in a row
    into one accumulator, the most allowed: FLAT_SUM_MAX for a flat sum, SUM_BLOCK for a level of a blocked sum
    over the level inside it, SUM_BLOCK_WIDE for the innermost level)."""
    out = []
    for u in k.sink.toposort:
        if u.op is Ops.REDUCE and u.arg.op is Ops.ADD and u.dtype.is_float:
            nested = any(u in v.src[0].toposort for v in k.sink.toposort if v.op is Ops.REDUCE and v is not u)
            most = SUM_BLOCK if u.src[0].op is Ops.REDUCE else SUM_BLOCK_WIDE if nested else FLAT_SUM_MAX
            out.append((math.prod(r.arg.size for r in u.src[1:] if r not in k.lanes), most))
    if k.init: out.append((math.prod(r.arg.size for r in k.init), FLAT_SUM_MAX))
    return out


@settings(max_examples=25)
@given(st.sampled_from(sorted(PROGRAMS)), st.data())
def test_every_schedule_bounds_the_additions_in_a_row(name, data):
    """Structure, for many schedules (cheap: nothing runs): after any actions, no float sum adds more than
    FLAT_SUM_MAX values in a row into one accumulator, and each level of a blocked sum at most SUM_BLOCK (its
    innermost SUM_BLOCK_WIDE)."""
    f, args, _ = PROGRAMS[name]
    fn = fnx.jit(f).lower(*[jnp.asarray(a) for a in args]).traced.fn
    applied = []
    choose = _random_schedule(lambda n: data.draw(st.integers(0, n - 1)), applied)
    for kernel in rangeify(callify(fn)).kernels:
        k = apply_opts(kernel, choose(kernel, 2))
        for count, most in _additions_in_a_row(k):
            assert count <= most, (name, applied)
    assume(any(opts for _, opts in applied))  # every draw may pick an action that does not apply (UPCAST by 3 of 16)


@settings(max_examples=10)
@given(st.sampled_from(sorted(PROGRAMS)), st.data())
def test_random_schedules_stay_within_the_bound(name, data):
    f, args, oracle = PROGRAMS[name]
    fn = fnx.jit(f).lower(*[jnp.asarray(a) for a in args]).traced.fn
    applied = []
    got = _compile_and_run(fn, list(args), _random_schedule(lambda n: data.draw(st.integers(0, n - 1)), applied))[0]
    assume(any(opts for _, opts in applied))  # (as above: only schedules with an action count)
    assert _rel(got, oracle(*args)) <= BOUND, applied


def test_no_actions_at_all_still_blocks():
    """The plain schedule (one scalar loop of 2^24 additions) is blocked too."""
    f, args, oracle = PROGRAMS["sum"]
    fn = fnx.jit(f).lower(jnp.asarray(args[0])).traced.fn
    got = _compile_and_run(fn, list(args), lambda k, t: [])[0]
    assert _rel(got, oracle(*args)) <= BOUND


@pytest.mark.parametrize("name", sorted(PROGRAMS))
def test_blocking_keeps_the_work(name):
    """The levels nest inside each other: a kernel's iteration count (read by the thread and async-dispatch
    thresholds) is the flat loop's (plus masked tails)."""
    f, args, _ = PROGRAMS[name]
    fn = fnx.jit(f).lower(*[jnp.asarray(a) for a in args]).traced.fn
    for kernel in rangeify(callify(fn)).kernels:
        blocked = apply_opts(kernel, [])
        assert kernel.work <= blocked.work <= 1.01 * kernel.work
        assert len(blocked.reduce_ranges) > len(kernel.reduce_ranges) or kernel.work <= FLAT_SUM_MAX


def test_accumulate_refuses_too_many_passes():
    """ACCUMULATE adds each pass into the output in a row: a float sum allows FLAT_SUM_MAX passes at most."""
    f, args, _ = PROGRAMS["matmul"]
    fn = fnx.jit(f).lower(*[jnp.asarray(a) for a in args]).traced.fn
    (kernel,) = rangeify(callify(fn)).kernels
    k_axis = len(kernel.ranges)
    split = apply_opt(kernel, Opt("SPLIT", k_axis, 256))  # 4096 slabs of 256
    with pytest.raises(OptError, match="passes"):
        apply_opt(split, Opt("ACCUMULATE", k_axis))
    few = apply_opt(kernel, Opt("SPLIT", k_axis, 2 ** 12))  # 256 slabs: allowed
    assert apply_opt(few, Opt("ACCUMULATE", k_axis)).init
