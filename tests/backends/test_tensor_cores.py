"""Tensor cores (fnx/lower/tensor_core.py, the C renderer's TensorCoreRenderer).

- Which kernels qualify, and the CUDA heuristic's choice: float16 and bfloat16 matmul-like kernels take the TC
  action on an sm_80+ target, float32 ones and older GPUs do not.
- On OpenCL (CI's PoCL), programs are forced onto the tensor-core schedule, whose `mma` is emulated from the PTX
  fragment layout: every tile index, edge mask, shared-memory slab, fragment load, prologue and epilogue of the
  CUDA kernel runs, checked against float64 numpy — edges in m, n and k, batches, transposed and computed
  operands, float32 results, vmap and grad.
- With NVRTC: each program's CUDA C compiles to PTX with `mma.sync...m16n8k16` and no local-memory arrays.
- On a GPU (skipped elsewhere): the same programs with the real tensor cores.
"""
import numpy as np
import pytest

import fnx
import fnx.numpy as jnp
from fnx import lax
from fnx.backends import cuda
from fnx.backends.device import get_device
from fnx.backends.opencl import _cl_devices
from fnx.lower.optimize import Opt, OptError, apply_opt, heuristic_opts, schedule_override
from fnx.lower.pipeline import callify
from fnx.lower.rangeify import rangeify
from fnx.lower.tensor_core import NotTensorCore, tensor_core_tile

F16, BF16 = np.float16, jnp.bfloat16.dtype if hasattr(jnp.bfloat16, "dtype") else np.dtype(jnp.bfloat16)


def _gelu(x):
    return 0.5 * x * (1 + jnp.tanh(0.7978845608 * (x + 0.044715 * x ** 3)))


def _gelu_then_matmul(x, w, c):
    """The reference of `maximum(gelu(x) @ w + c, 0)` in float16: gelu as fnx computes it in float16 (on the cpu
    backend), the product exact in float64, then fnx's float16 roundings of the product and of the sum."""
    g = np.asarray(fnx.jit(_gelu, backend="cpu")(x.astype(F16)), np.float64)
    return np.maximum((g @ w).astype(F16) + c.astype(F16), 0).astype(np.float64)


# name: (fn, float64 reference, shapes, dtype)
PROGRAMS = {
    "edges": (lambda a, b: a @ b, lambda a, b: a @ b, [(70, 45), (45, 130)], F16),
    "whole_tiles": (lambda a, b: a @ b, lambda a, b: a @ b, [(128, 64), (64, 192)], F16),
    "bfloat16": (lambda a, b: a @ b, lambda a, b: a @ b, [(33, 80), (80, 65)], BF16),
    "transposed": (lambda a, b: a @ b.T, lambda a, b: a @ b.T, [(50, 72), (90, 72)], F16),
    "batched": (lambda a, b: jnp.einsum("bij,bjk->bik", a, b), lambda a, b: np.einsum("bij,bjk->bik", a, b),
                [(3, 33, 40), (3, 40, 17)], F16),
    "long_k": (lambda a, b: a @ b, lambda a, b: a @ b, [(20, 1000), (1000, 24)], F16),
    "computed_operand": (lambda x, w, c: jnp.maximum(_gelu(x) @ w + c, 0),
                         _gelu_then_matmul, [(40, 64), (64, 96), (96,)], F16),
    "attention": (lambda q, k, v: fnx.nn.softmax(jnp.einsum("bhqd,bhkd->bhqk", q, k), axis=-1) @ v, None,
                  [(2, 3, 20, 16), (2, 3, 24, 16), (2, 3, 24, 16)], F16),
    "conv": (lambda x, w: lax.conv_general_dilated(x, w, (1, 1), "SAME"), None, [(2, 3, 12, 12), (8, 3, 3, 3)], F16),
    "gathered_rows": (lambda table, idx, w: table[idx] @ w, None, [(50, 32), (40,), (32, 24)], F16),
    "float32_result": (lambda a, b: lax.dot_general(a, b, (((1,), (0,)), ((), ())), preferred_element_type=jnp.float32),
                       lambda a, b: a @ b, [(65, 48), (48, 70)], F16),
}


def _inputs(shapes, dtype, seed):
    rng = np.random.default_rng(seed)
    return [rng.integers(0, 50, s).astype(np.int32) if len(s) == 1 and s[0] == 40 else  # (gathered_rows' indices)
            rng.standard_normal(s).astype(np.float32).astype(dtype) for s in shapes]


def _reference(name, args):
    """A program's float64 result, or (None in PROGRAMS) the same program on the cpu backend, whose scalar
    kernels round its intermediate float16 values exactly as the tensor-core schedule must."""
    fn, ref, _, _ = PROGRAMS[name]
    if ref is not None: return ref(*[np.asarray(a, np.float64) for a in args])
    return np.asarray(fnx.jit(fn, backend="cpu")(*args), np.float64)


def _check(got, want, dtype, k: int, scale: float = 1.0):
    """got (16-bit or float32) against the float64 result: one rounding to its dtype, plus the float32 sum's
    error (k terms of size `scale`)."""
    got = np.asarray(got, np.float64)
    ulp = 2.0 ** -8 if dtype == BF16 else 2.0 ** -11 if dtype == F16 else 2.0 ** -24
    np.testing.assert_allclose(got, want, rtol=2 * ulp, atol=k * 2.0 ** -22 * scale + 2 * ulp * 1e-3)


def _tensor_cores_where_they_apply(kernel, target):
    try:
        tensor_core_tile(kernel)
    except NotTensorCore:
        return None
    return [Opt("TC", 0, 0)]


def _run_forced(device_name, fn, args):
    """fn on `device_name` with every kernel that qualifies on the tensor-core schedule: the outputs and source."""
    traced = fnx.jit(fn).lower(*[fnx.device_put(jnp.asarray(a), device_name) for a in args]).traced.fn
    device = get_device(device_name)
    with schedule_override(_tensor_cores_where_they_apply):
        exe = device.executable(traced)
    outs = exe([device.allocator.from_numpy(np.asarray(a)) for a in args])
    values = [b.numpy(o.shape) for b, o in zip(outs, traced.src[0].src)]
    return (values[0] if len(values) == 1 else values), exe.source


def _kernels(fn, *args):
    return rangeify(callify(fnx.jit(fn).lower(*args).traced.fn), grid=True).kernels  # (as grid devices do)


# ---- which kernels qualify ----

def test_which_kernels_qualify():
    a, b = np.ones((32, 48), F16), np.ones((48, 40), F16)
    [k] = _kernels(lambda a, b: a @ b, a, b)
    tile = tensor_core_tile(k)
    assert (tile.rows, tile.columns, tile.depth, tile.dtype.name) == (32, 40, 48, "float16")
    assert tile.blocks == 1
    for fn, args, why in [
            (lambda a, b: a @ b, (a.astype(np.float32), b.astype(np.float32)), "float16 or two bfloat16"),
            (lambda a: (a.astype(jnp.float32) ** 2).sum(1), (a,), "an \\(m, k\\) by a \\(k, n\\)"),
            (lambda a, b: (a[:, :, None] * b[None]).max(1), (a, b), "float32 sum over")]:
        kernels = _kernels(fn, *args)
        assert all(pytest.raises(NotTensorCore, tensor_core_tile, k).match(why) for k in kernels)
    big = _kernels(lambda a, b: a @ b, np.ones((4, 1 << 17), F16), np.ones((1 << 17, 4), F16))
    assert any("at most" in str(pytest.raises(NotTensorCore, tensor_core_tile, k).value) for k in big)


def test_widened_values_get_narrow_buffers_on_grid_devices_only():
    """gelu(x) in float16 feeds a matmul: a grid device keeps it float16 in memory (half the bytes, what the tensor
    cores read); the CPU keeps the float32 it widens to, which its matmul reads without converting per element."""
    fn, _, shapes, _ = PROGRAMS["computed_operand"]
    traced = callify(fnx.jit(fn).lower(*_inputs(shapes, F16, 0)).traced.fn)
    for grid, dtype in ((True, "float16"), (False, "float32")):
        schedule = rangeify(traced, grid=grid)
        kinds = [b.dtype.name for b in schedule.buffers if b.kind == "intermediate"]
        assert kinds == [dtype], (grid, kinds)


def test_tc_is_the_only_action_of_its_kernel():
    [k] = _kernels(lambda a, b: a @ b, np.ones((32, 48), F16), np.ones((48, 40), F16))
    with pytest.raises(OptError, match="no other action"):
        apply_opt(apply_opt(k, Opt("TC", 0, 0)), Opt("THREAD", 0))
    with pytest.raises(OptError, match="no other schedule action"):
        apply_opt(apply_opt(k, Opt("THREAD", 0)), Opt("TC", 0, 0))


@pytest.mark.parametrize("arch,dtype,expected", [("90", F16, True), ("90", BF16, True), ("80", F16, True),
                                                 ("90", np.float32, False), ("75", F16, False)])
def test_cuda_heuristic_takes_tensor_cores_for_16_bit_matmuls(arch, dtype, expected):
    [k] = _kernels(lambda a, b: a @ b, np.ones((256, 64), dtype), np.ones((64, 128), dtype))
    opts = heuristic_opts(k, cuda.compile_only_target(arch))
    assert (opts == [Opt("TC", 0, 0)]) == expected, opts


# ---- the schedule on OpenCL, its mma emulated ----

opencl = pytest.mark.skipif(not _cl_devices(), reason="no OpenCL device (apt-get install pocl-opencl-icd; "
                                                      "pip install 'fnx[opencl]')")


@opencl
@pytest.mark.parametrize("name", sorted(PROGRAMS))
def test_programs_on_the_tensor_core_schedule(name):
    fn, _, shapes, dtype = PROGRAMS[name]
    args = _inputs(shapes, dtype, len(name))
    got, source = _run_forced("opencl:0", fn, args)
    assert "mma_bf16(" in source if dtype == BF16 else "mma_f16(" in source
    _check(got, _reference(name, args), np.asarray(got).dtype.type if np.asarray(got).dtype != BF16 else BF16,
           shapes[0][-1])


@opencl
def test_vmap_and_grad_on_the_tensor_core_schedule():
    x, w = _inputs([(4, 24, 40), (40, 36)], F16, 7)
    got, source = _run_forced("opencl:0", fnx.vmap(lambda x, w: jnp.tanh(x @ w), in_axes=(0, None)), [x, w])
    assert "mma_f16(" in source
    _check(got, np.tanh(np.asarray(x, np.float64) @ np.asarray(w, np.float64)), F16, 40)

    def loss(w, x):  # a float16 forward; its gradient multiplies x.T by the float16 cotangent
        return (x @ w).astype(jnp.float32).sum() + ((x @ w) ** 2).astype(jnp.float32).sum()
    gw, source = _run_forced("opencl:0", lambda w, x: [fnx.grad(loss)(w, x)], [w, x[0]])
    assert "mma_f16(" in source
    x64, w64 = np.asarray(x[0], np.float64), np.asarray(w, np.float64)
    y16 = (x64 @ w64).astype(F16).astype(np.float64)  # (the forward's float16 product, as the program rounds it)
    want = x64.T @ (1 + 2 * y16)
    np.testing.assert_allclose(np.asarray(gw, np.float64), want, rtol=4e-3, atol=4e-3 * np.abs(want).max())


@opencl
def test_tensor_core_kernels_from_several_threads_at_once():
    """One executable on the tensor-core schedule, called from four threads at once on their own inputs (each
    block's shared tiles are its own): every thread gets its own answer, three times."""
    from concurrent.futures import ThreadPoolExecutor
    fn = lambda a, b: jnp.maximum(a @ b, 0)  # noqa: E731
    cases = [_inputs([(70, 45), (45, 130)], F16, seed) for seed in range(4)]
    traced = fnx.jit(fn).lower(*[fnx.device_put(jnp.asarray(a), "opencl:0") for a in cases[0]]).traced.fn
    device = get_device("opencl:0")
    with schedule_override(_tensor_cores_where_they_apply):
        exe = device.executable(traced)
    assert "mma_f16(" in exe.source

    def run(args):
        return [exe([device.allocator.from_numpy(np.asarray(a)) for a in args])[0].numpy((70, 130))
                for _ in range(3)]
    with ThreadPoolExecutor(4) as pool:
        results = list(pool.map(run, cases))
    for (a, b), got in zip(cases, results):
        want = np.maximum(np.asarray(a, np.float64) @ np.asarray(b, np.float64), 0)
        for g in got: _check(g, want, F16, 45)


# ---- CUDA C to PTX ----

nvrtc = pytest.mark.skipif(cuda.nvrtc_version() is None, reason="NVRTC is not installed (pip install 'fnx[test]')")


@nvrtc
@pytest.mark.parametrize("name", sorted(PROGRAMS))
def test_programs_compile_to_mma_instructions(name):
    fn, _, shapes, dtype = PROGRAMS[name]
    lowered = fnx.jit(fn, backend="cuda").lower(*_inputs(shapes, dtype, 0))
    kind = "bf16" if dtype == BF16 else "f16"
    assert f"mma_{kind}(" in lowered.as_text("source")
    ptx = lowered.as_text("ptx")
    assert f"mma.sync.aligned.m16n8k16.row.col.f32.{kind}.{kind}.f32" in ptx
    assert ".local" not in ptx  # (the accumulators and fragments stay in registers)


# ---- on a GPU ----

def _gpu() -> bool:
    devices = fnx.devices("cuda") if cuda.nvrtc_version() is not None else []
    return bool(devices) and not devices[0].compile_only


@pytest.mark.skipif(not _gpu(), reason="no CUDA GPU on this machine")
@pytest.mark.parametrize("name", sorted(PROGRAMS))
def test_programs_on_gpu_tensor_cores(name):
    fn, _, shapes, dtype = PROGRAMS[name]
    args = _inputs(shapes, dtype, len(name))
    lowered = fnx.jit(fn).lower(*[fnx.device_put(jnp.asarray(a), "cuda:0") for a in args])
    assert "mma_" in lowered.as_text("source")
    got = np.asarray(fnx.jit(fn)(*[fnx.device_put(jnp.asarray(a), "cuda:0") for a in args]))
    _check(got, _reference(name, args), got.dtype.type if got.dtype != BF16 else BF16, shapes[0][-1])
