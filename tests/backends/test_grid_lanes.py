"""Vector lanes on grid devices (VECTORIZE on OpenCL and CUDA: W consecutive elements a work item, their
contiguous loads and stores one vector access). The op suite's arrays are too small for the heuristic to choose
lanes (it wants a work-group per compute unit left), so here every program runs with lanes forced — on the output
loop, on a reduce loop (a sum across lanes) and beside work-group-free reductions (an accumulator per lane) —
against a numpy oracle computed in the same dtype (exact for elementwise arithmetic, float64 for sums), with
misaligned slices, gathers, padding, concatenation, transposes and broadcasts; 16-bit floats, int8 and bool.
OpenCL (PoCL in CI) runs them; NVRTC compiles them for CUDA and the PTX is checked for vector instructions; a GPU
runs them where there is one."""
import dataclasses

import ml_dtypes
import numpy as np
import pytest

import fnx
import fnx.numpy as jnp
from fnx.backends import cuda
from fnx.backends.device import get_device
from fnx.backends.opencl import _cl_devices
from fnx.lower.optimize import Opt, OptError, apply_opts, heuristic_opts, schedule_override
from fnx.lower.rangeify import Kernel

BF16 = ml_dtypes.bfloat16


def _lanes(across: bool):
    """A schedule_override: lanes (as many as 16 bytes of the kernel's widest element hold, at most 4) on the first
    loop that takes them, output loops innermost first, then reduce loops (reduce loops first when `across`: a sum
    across lanes); the grid on an output loop; else the heuristic's schedule."""
    return schedule_override(lambda kernel, target: _with_lanes(kernel, target, across))


def _with_lanes(kernel: Kernel, target, across: bool) -> list[Opt]:
    widest = max([u.src[0].dtype.itemsize for u in kernel.sink.toposort if u.op.name in ("LOAD", "STORE")] + [1])
    w = max(2, min(4, 16 // widest))
    n_out = len(kernel.ranges)
    outputs, reductions = list(reversed(range(n_out))), list(range(n_out, n_out + len(kernel.reduce_ranges)))
    for a in reductions + outputs if across else outputs + reductions:
        for t in range(n_out):
            opts = [Opt("VECTORIZE", a, w), Opt("THREAD", t)]
            try:
                apply_opts(kernel, opts)
            except OptError:
                continue
            return opts
    return heuristic_opts(kernel, target)


def _run_forced(device_name: str, name: str, args):
    """fn's output on `device_name`, every kernel with lanes where they apply (compiled here), and the source."""
    args_there = [fnx.device_put(jnp.asarray(a), device_name) for a in args]
    traced = fnx.jit(PROGRAMS[name][0]).lower(*args_there).traced.fn
    device = get_device(device_name)
    with _lanes("across" in name):
        exe = device.executable(traced)
    outs = exe([device.allocator.from_numpy(np.asarray(a)) for a in args])
    return outs[0].numpy(traced.src[0].src[0].shape), exe.source


def _r(rng, shape, dtype):
    if dtype == np.bool_: return rng.random(shape) < 0.5
    if np.dtype(dtype).kind in "iu": return rng.integers(-100, 100, shape).astype(dtype)
    return rng.standard_normal(shape).astype(dtype)


# name: (fn, numpy oracle, argument shapes and dtypes, tolerance (0: exact))
PROGRAMS = {
    "f32_affine": (lambda x: x * 2 + 1, lambda x: x * np.float32(2) + np.float32(1), [((4096,), np.float32)], 0),
    "f16": (lambda h: h * 3 + h, lambda h: h * np.float16(3) + h, [((1024,), np.float16)], 0),
    "bf16": (lambda h: h * 3 - h, lambda h: h * BF16(3) - h, [((1024,), BF16)], 0),
    "int8_wraps": (lambda x: x * 3 - 5, lambda x: x * np.int8(3) - np.int8(5), [((1024,), np.int8)], 0),
    "bool": (lambda b, x: ~b | (x > 0), lambda b, x: ~b | (x > 0), [((512,), np.bool_), ((512,), np.float32)], 0),
    "misaligned_slice": (lambda x: x[1:] * 2, lambda x: x[1:] * np.float32(2), [((1025,), np.float32)], 0),
    "row_broadcast": (lambda x, r: x + r, lambda x, r: x + r, [((64, 128), np.float32), ((128,), np.float32)], 0),
    "column_broadcast": (lambda x, c: x * c[:, None], lambda x, c: x * c[:, None],
                         [((64, 128), np.float32), ((64,), np.float32)], 0),
    "transpose": (lambda x: x.T + 1, lambda x: x.T + np.float32(1), [((96, 128), np.float32)], 0),
    "gather": (lambda x, i: x[i % 300], lambda x, i: x[i % 300], [((300,), np.float32), ((256,), np.int32)], 0),
    "pad": (lambda x: jnp.pad(x, (3, 5)) * 2, lambda x: np.pad(x, (3, 5)) * np.float32(2), [((504,), np.float32)], 0),
    "concatenate": (lambda x, y: jnp.concatenate([x, y]) + 1, lambda x, y: np.concatenate([x, y]) + np.float32(1),
                    [((301,), np.float32), ((211,), np.float32)], 0),
    "tanh": (jnp.tanh, np.tanh, [((2048,), np.float32)], 3e-6),
    "column_sums": (lambda x: x.sum(axis=0), lambda x: x.astype(np.float64).sum(0).astype(np.float32),
                    [((513, 64), np.float32)], 2e-5),
    "row_sums": (lambda x: x.sum(axis=1), lambda x: x.astype(np.float64).sum(1).astype(np.float32),
                 [((40, 512), np.float32)], 2e-5),
    "row_sums_across": (lambda x: x.sum(axis=1), lambda x: x.astype(np.float64).sum(1).astype(np.float32),
                        [((40, 512), np.float32)], 2e-5),
    "row_max_nan": (lambda x: jnp.max(jnp.where(x > 2.5, jnp.nan, x), axis=1),
                    lambda x: np.max(np.where(x > 2.5, np.nan, x), axis=1), [((40, 512), np.float32)], 0),
    "row_max_nan_across": (lambda x: jnp.max(jnp.where(x > 2.5, jnp.nan, x), axis=1),
                           lambda x: np.max(np.where(x > 2.5, np.nan, x), axis=1), [((40, 512), np.float32)], 0),
    "softmax_across": (lambda x: fnx.nn.softmax(x, axis=-1),
                       lambda x: (np.exp(x - x.max(-1, keepdims=True)) / np.exp(x - x.max(-1, keepdims=True)).sum(
                           -1, keepdims=True)).astype(np.float32), [((24, 256), np.float32)], 3e-6),
    "f16_row_sums": (lambda h: h.sum(axis=1), lambda h: h.astype(np.float64).sum(1).astype(np.float16),
                     [((16, 256), np.float16)], 1e-3),
}


def _inputs(name):
    rng = np.random.default_rng(len(name))
    return [_r(rng, shape, dtype) for shape, dtype in PROGRAMS[name][2]]


def _check(name, got, args):
    _, ref, _, tol = PROGRAMS[name]
    want = ref(*args)
    assert got.shape == want.shape and got.dtype == want.dtype, (got.shape, got.dtype, want.shape, want.dtype)
    if tol == 0:
        np.testing.assert_array_equal(got, want)
    else:
        np.testing.assert_allclose(got.astype(np.float64), want.astype(np.float64), rtol=tol,
                                   atol=tol * np.sqrt(args[0].size))


opencl = pytest.mark.skipif(not _cl_devices(), reason="no OpenCL device (apt-get install pocl-opencl-icd; "
                                                      "pip install 'fnx[opencl]')")


@opencl
@pytest.mark.parametrize("name", sorted(PROGRAMS))
def test_programs_with_lanes_on_opencl(name):
    args = _inputs(name)
    got, source = _run_forced("opencl:0", name, args)
    _check(name, got, args)
    if name in ("f32_affine", "f16", "bf16", "int8_wraps", "misaligned_slice", "row_broadcast"):
        assert "vload" in source and "vstore" in source, source  # the contiguous accesses are vector accesses
    if name.startswith(("column_sums", "row_sums", "row_max")):
        assert "acc0_3" in source, source  # an accumulator per lane
    if "across" in name:
        assert "vload4" in source, source  # (the row's contiguous loads)


@opencl
def test_the_heuristic_takes_lanes_where_they_pay():
    """The heuristic's own choice, with the device's work-group size and unit count made small so small arrays
    qualify: lanes on a light contiguous elementwise kernel, none on a heavy one (sin: compute bound, 4 copies of
    its polynomial a work item); and none at the device's real size on a short array (idle compute units)."""
    rng = np.random.default_rng(0)
    x, y = (rng.standard_normal(1 << 12).astype(np.float32) for _ in range(2))
    device = get_device("opencl:0")
    small = dataclasses.replace(device.target, cores=1, local_size=2)
    for fn, ref, lanes in [(lambda x, y: x * 2 + y, lambda x, y: x * np.float32(2) + y, True),
                           (lambda x, y: jnp.sin(x) * y, lambda x, y: np.sin(x.astype(np.float64)) * y, False)]:
        traced = fnx.jit(fn).lower(fnx.device_put(x, "opencl:0"), fnx.device_put(y, "opencl:0")).traced.fn
        with schedule_override(lambda kernel, target: heuristic_opts(kernel, small)):
            exe = device.executable(traced)
        assert ("vload4" in exe.source and "vstore4" in exe.source) == lanes, exe.source
        got = exe([device.allocator.from_numpy(x), device.allocator.from_numpy(y)])[0].numpy(x.shape)
        np.testing.assert_allclose(got, ref(x, y), rtol=3e-6, atol=1e-6)
    short = np.ones(64, np.float32)
    assert "vload" not in fnx.jit(lambda x: x * 2).lower(fnx.device_put(short, "opencl:0")).as_text("source")


nvrtc = pytest.mark.skipif(cuda.nvrtc_version() is None, reason="NVRTC is not installed (pip install 'fnx[test]')")


def _cuda_source(name):
    fn, _, specs, _ = PROGRAMS[name]
    args = [np.zeros(shape, dtype) for shape, dtype in specs]
    with _lanes("across" in name):
        lowered = fnx.jit(fn, backend="cuda").lower(*args)
        return lowered.as_text("source"), lowered.as_text("ptx")


@nvrtc
@pytest.mark.parametrize("name", sorted(PROGRAMS))
def test_programs_with_lanes_compile_for_cuda(name):
    source, ptx = _cuda_source(name)
    assert ".entry" in ptx
    if name in ("f32_affine", "row_broadcast"):
        assert "ld.global.v4.f32" in ptx and "st.global.v4.f32" in ptx
    if name in ("f16", "bf16"):
        assert "ld.global.v4.u16" in ptx and "st.global.v4.u16" in ptx


@nvrtc
def test_cuda_vector_loads_only_where_aligned():
    """x[1:]: the store's first index is a multiple of 4, the load's is one more: a 16-byte load there would be
    misaligned (a fault on the GPU), so the load is per lane and the store one vector."""
    source, ptx = _cuda_source("misaligned_slice")
    assert "make_float4" in source and "const float4*" not in source
    assert "st.global.v4.f32" in ptx and "ld.global.v4" not in ptx


def _gpu() -> bool:
    devices = fnx.devices("cuda") if cuda.nvrtc_version() is not None else []
    return bool(devices) and not devices[0].compile_only


@pytest.mark.skipif(not _gpu(), reason="no CUDA GPU on this machine")
def test_programs_with_lanes_on_gpu():
    for name in sorted(PROGRAMS):
        args = _inputs(name)
        got, _ = _run_forced("cuda:0", name, args)
        _check(name, got, args)


@opencl
def test_lanes_from_several_threads_and_on_2_26_elements():
    """What users do: one jitted light kernel called from four threads at once (each its own inputs), and 2^26
    int8 elements (wrapping) under the device's real heuristic, which takes lanes there — against numpy, exact."""
    import threading
    f = fnx.jit(lambda x, y: x * 3 - y)
    big = np.random.default_rng(7).integers(-128, 128, 1 << 26).astype(np.int8)
    on_device = fnx.device_put(big, "opencl:0")
    assert "vload4" in f.lower(on_device, on_device).as_text("source")
    np.testing.assert_array_equal(np.asarray(f(on_device, on_device)), big * np.int8(3) - big)
    inputs = [np.arange(1 << 16, dtype=np.float32) * (i + 1) for i in range(4)]
    got: list = [None] * 4

    def call(i):
        x = fnx.device_put(inputs[i], "opencl:0")
        got[i] = np.asarray(f(x, x))
    threads = [threading.Thread(target=call, args=(i,)) for i in range(4)]
    for t in threads: t.start()
    for t in threads: t.join()
    for i in range(4): np.testing.assert_array_equal(got[i], inputs[i] * np.float32(3) - inputs[i])
