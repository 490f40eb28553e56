"""Work-group schedules on grid devices (the optimizer's LOCAL and GROUP: a reduction split across a work-group and
combined in local memory with barriers; an output loop walked by the group's work items). The op suite runs the
heuristic's choice on every device; here each program also runs under forced schedules — every work-group width
from 2 to 128, groups first or output loops first — against a float64 numpy oracle (exact for integers and max),
including remainders that mask part of a group, 16-bit floats, NaN and bool reductions, and reductions nested in
loops. Needs an OpenCL device (CI installs PoCL)."""
import dataclasses

import numpy as np
import pytest

import fnx
import fnx.numpy as jnp
from fnx.backends.opencl import _cl_devices
from fnx.backends.device import get_device
from fnx.lower.optimize import Opt, OptError, apply_opt, heuristic_opts, schedule_override
from fnx.lower.pipeline import callify
from fnx.lower.rangeify import Kernel, rangeify

pytestmark = pytest.mark.skipif(not _cl_devices(), reason="no OpenCL device (apt-get install pocl-opencl-icd; "
                                                          "pip install 'fnx[opencl]')")

# (work-group width, compute units): with many units the outputs alone cannot fill the device, so reductions go on
# the work-groups first (GROUP); with one unit output loops do (LOCAL)
SCHEDULES = [(2, 1), (16, 1), (128, 1), (4, 1 << 30), (64, 1 << 30)]


def _forced(width: int, cores: int):
    def choose(kernel: Kernel, target):
        return heuristic_opts(kernel, dataclasses.replace(target, local_size=width, cores=cores))
    return schedule_override(choose)


def _run(fn, *args, width, cores):
    """fn's outputs on opencl:0, its kernels scheduled by the heuristic for that width and unit count (compiled
    here, never from an executable cache), and the OpenCL source."""
    traced = fnx.jit(fn).lower(*[fnx.device_put(jnp.asarray(a), "opencl:0") for a in args]).traced.fn
    device = get_device("opencl:0")
    with _forced(width, cores):
        exe = device.executable(traced)
    outs = exe([device.allocator.from_numpy(np.asarray(a)) for a in args])
    values = [b.numpy(o.shape) for b, o in zip(outs, traced.src[0].src)]
    return (values[0] if len(values) == 1 else values), exe.source


PROGRAMS = {
    "sum": (lambda x: x.sum(), lambda x: x.astype(np.float64).sum(), [(1000, 301)]),
    "sum_odd": (lambda x: x.sum(), lambda x: x.astype(np.float64).sum(), [(67,)]),
    "row_softmax": (lambda x: fnx.nn.softmax(x, axis=-1),
                    lambda x: np.exp(x - x.max(-1, keepdims=True)) / np.exp(x - x.max(-1, keepdims=True)).sum(
                        -1, keepdims=True), [(37, 300)]),
    "long_rows": (lambda x: jnp.max(x, axis=1) + x.mean(axis=1), lambda x: x.max(1) + x.astype(np.float64).mean(1),
                  [(3, 5003)]),
    "column_sums": (lambda x: x.sum(axis=0), lambda x: x.astype(np.float64).sum(0), [(513, 7)]),
    "matmul": (lambda a, b: a @ b, lambda a, b: a.astype(np.float64) @ b, [(65, 33), (33, 70)]),
    "matmul_blocks": (lambda a, b: jnp.maximum(a @ b, 0), lambda a, b: np.maximum(a.astype(np.float64) @ b, 0),
                      [(96, 48), (48, 256)]),  # (register blocks of rows and of columns a group apart)
    "plus_total": (lambda x: x * 2 + x.sum(), lambda x: x * 2.0 + x.astype(np.float64).sum(), [(3000,)]),
    "centered": (lambda x: x - x.mean(axis=0), lambda x: x - x.astype(np.float64).mean(0), [(129, 40)]),
    "nested": (lambda a, b: jnp.tanh(a @ b).sum(axis=1), lambda a, b: np.tanh(a.astype(np.float64) @ b).sum(1),
               [(20, 150), (150, 90)]),
}


@pytest.mark.parametrize("width,cores", SCHEDULES)
@pytest.mark.parametrize("name", sorted(PROGRAMS))
def test_float_programs_match_float64(name, width, cores):
    fn, ref, shapes = PROGRAMS[name]
    rng = np.random.default_rng(len(name))
    args = [rng.standard_normal(s).astype(np.float32) for s in shapes]
    got, _ = _run(fn, *args, width=width, cores=cores)
    want = ref(*args)
    np.testing.assert_allclose(got, want, rtol=2e-5, atol=2e-5 * np.sqrt(max(a.size for a in args)))


@pytest.mark.parametrize("width,cores", SCHEDULES)
def test_exact_reductions(width, cores):
    rng = np.random.default_rng(3)
    ints = rng.integers(-2 ** 31, 2 ** 31 - 1, size=(5, 999), dtype=np.int64).astype(np.int32)
    got, _ = _run(lambda x: x.sum(axis=1), ints, width=width, cores=cores)  # (wraps, in any order)
    np.testing.assert_array_equal(got, ints.sum(axis=1, dtype=np.int32))
    got, _ = _run(lambda x: (x.max(), x.min(), jnp.argmax(x, axis=0)), ints, width=width, cores=cores)
    np.testing.assert_array_equal(got[0], ints.max())
    np.testing.assert_array_equal(got[1], ints.min())
    np.testing.assert_array_equal(got[2], ints.argmax(axis=0))
    flags = rng.random((7, 300)) < 0.01
    got, _ = _run(lambda b: (jnp.any(b, axis=1), jnp.all(~b, axis=0)), flags, width=width, cores=cores)
    np.testing.assert_array_equal(got[0], flags.any(axis=1))
    np.testing.assert_array_equal(got[1], (~flags).all(axis=0))


@pytest.mark.parametrize("width,cores", SCHEDULES)
def test_16_bit_and_nan(width, cores):
    rng = np.random.default_rng(4)
    x = rng.standard_normal(2000).astype(np.float16)
    got, _ = _run(lambda x: x.sum(), x, width=width, cores=cores)
    assert got.dtype == np.float16
    want = np.float16(x.astype(np.float64).sum())  # (a float32 sum rounded once: within a float16 ulp or two)
    assert abs(float(got) - float(want)) <= 2 * float(np.spacing(want))
    y = rng.standard_normal(777).astype(np.float32)
    y[500] = np.nan
    got, _ = _run(lambda y: (y.max(), y.sum()), y, width=width, cores=cores)
    assert np.isnan(got[0]) and np.isnan(got[1])


def test_schedules_use_work_groups():
    """The forced schedules above do put reductions and output loops on work-groups (else they test nothing)."""
    x = np.ones((1000, 301), np.float32)
    _, source = _run(lambda x: x.sum(), x, width=16, cores=1)
    assert "barrier(CLK_LOCAL_MEM_FENCE)" in source and "reqd_work_group_size(16, 1, 1)" in source
    a, b = np.ones((65, 33), np.float32), np.ones((33, 70), np.float32)
    _, source = _run(lambda a, b: a @ b, a, b, width=64, cores=1)
    assert "get_group_id(0)" in source and "lid" in source and "barrier" not in source  # (LOCAL: no combine)


def _kernel(fn, *shapes) -> Kernel:
    traced = fnx.jit(fn).lower(*[jnp.ones(s) for s in shapes]).traced.fn
    return rangeify(callify(traced)).kernels[0]


def test_matmul_gets_register_blocks():
    a, b = np.ones((96, 48), np.float32), np.ones((48, 256), np.float32)
    kernel = _kernel(lambda a, b: a @ b, (96, 48), (48, 256))
    target = dataclasses.replace(get_device("opencl:0").target, local_size=64, cores=2)
    ops = [o.op for o in heuristic_opts(kernel, target)]
    assert ops == ["SPLIT", "THREAD", "UPCAST", "LOCAL", "UPCAST"], ops
    got, _ = _run(lambda a, b: a @ b, a, b, width=64, cores=2)
    np.testing.assert_array_equal(got, a @ b)


def test_work_group_actions_reject_what_they_cannot_do():
    matmul = _kernel(lambda a, b: a @ b, (8, 16), (16, 32))   # loops [8, 32], reduce [16]
    with pytest.raises(OptError, match="wrong kind"): apply_opt(matmul, Opt("GROUP", 0, 4))
    with pytest.raises(OptError, match="wrong kind"): apply_opt(matmul, Opt("LOCAL", 2, 4))
    with pytest.raises(OptError, match="power of two"): apply_opt(matmul, Opt("LOCAL", 1, 6))
    local = apply_opt(matmul, Opt("LOCAL", 1, 8))
    with pytest.raises(OptError, match="work-groups are 8 wide"): apply_opt(local, Opt("GROUP", 2, 4))
    with pytest.raises(OptError, match="two work-group ranges"): apply_opt(local, Opt("GROUP", 2, 8))
    with pytest.raises(OptError, match="work-group ranges"): apply_opt(local, Opt("VECTORIZE", 0, 4))
    vectorized = apply_opt(matmul, Opt("VECTORIZE", 1, 4))
    with pytest.raises(OptError, match="without lanes"): apply_opt(vectorized, Opt("GROUP", 2, 4))
    grouped = apply_opt(apply_opt(matmul, Opt("THREAD", 0)), Opt("GROUP", 2, 4))
    assert len(grouped.locals) == 1 and grouped.locals[0].arg.size == 4 and grouped.thread_range == 0


def test_the_cpu_renderer_refuses_work_groups():
    from fnx.backends.llvm_render import render_kernel
    from fnx.errors import UnsupportedError
    from fnx.lower.linearize import linearize
    grouped = apply_opt(_kernel(lambda x: x.sum(), (300,)), Opt("GROUP", 0, 4))
    with pytest.raises(UnsupportedError, match="work-group ranges"): render_kernel(grouped, linearize(grouped))


def test_beam_times_grid_schedules_on_the_device(monkeypatch):
    """BEAM on opencl: the candidates include work-group actions and lanes of at most 4 (no packing or
    accumulation), each timed on the device; the winner is no slower than the heuristic's schedule and computes
    the same values."""
    from fnx.backends import grid_beam
    from fnx.lower import search
    monkeypatch.setattr(search, "MAX_DEPTH", 1)
    device = get_device("opencl:0")
    kernel = _kernel(lambda x: jnp.tanh(x).sum(axis=1), (6, 200))
    actions = {o.op for o in search.candidate_actions(kernel, device.target)}
    assert {"LOCAL", "GROUP", "THREAD", "VECTORIZE"} <= actions and not {"PACK", "ACCUMULATE"} & actions
    assert {o.amount for o in search.candidate_actions(kernel, device.target) if o.op == "VECTORIZE"} == {2, 4}
    opts, best, heuristic = search.beam_search(kernel, device.target, 1, grid_beam.kernel_timers(device))
    assert best <= heuristic
    x = np.random.default_rng(5).standard_normal((6, 200)).astype(np.float32)
    with schedule_override(lambda k, t: opts):
        traced = fnx.jit(lambda x: jnp.tanh(x).sum(axis=1)).lower(fnx.device_put(jnp.asarray(x), device)).traced.fn
        exe = device.executable(traced)
    got = exe([device.allocator.from_numpy(x)])[0].numpy((6,))
    np.testing.assert_allclose(got, np.tanh(x.astype(np.float64)).sum(axis=1), rtol=1e-5, atol=1e-5)
