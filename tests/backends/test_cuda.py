"""The CUDA backend. Without a GPU: every kernel of the op suite (the FUNCTIONs of test_primitives.py) and whole
models, lowered for an sm_90 target, rendered as CUDA C and compiled to PTX by NVRTC, each PTX checked for the
entry point of every kernel; `jit(f, backend="cuda").lower(x).as_text(...)` on the compile-only device. With a
GPU: the op suite, transfers and an MLP training step against the interp oracle and the cpu backend."""
import dataclasses
import re

import numpy as np
import pytest

import fnx
import fnx.numpy as jnp
from fnx import dtypes
from fnx.backends import cuda, interp
from fnx.backends.c_render import CUDA, CRenderer
from fnx.lower.pipeline import lower
from fnx.uop import GroupOp, IotaArg, Ops, ParamArg, ReduceArg, ScatterArg, UOp
from assertions import mlp_step
from test_primitives import ALL, SHIFTS, _cases, assert_same, function_of, random_values

pytestmark = pytest.mark.skipif(cuda.nvrtc_version() is None, reason="NVRTC is not installed (pip install "
                                "'fnx[test]' brings cuda-bindings and nvidia-cuda-nvrtc-cu12)")

ARCH = "90"
TARGET = cuda.compile_only_target(ARCH)
PER_MODULE = 48  # kernels compiled in one NVRTC call (one module costs ~30 ms plus ~2 ms per kernel)


# ---- the op suite as FUNCTIONs: (name, FUNCTION, numpy arguments for the GPU run) ----

def _alu():
    for op, d in _cases():
        rng = np.random.default_rng(len(op.name) * 31 + d.itemsize)
        nsrc = 1 if op in GroupOp.Unary else 2
        args = [random_values(rng, d, (3, 17)) for _ in range(nsrc)]
        if op in SHIFTS: args[1] = rng.integers(-2, 8 * d.itemsize + 2, size=(3, 17)).astype(d.np)
        if op in (Ops.LOG2, Ops.SQRT): args[0] = np.abs(args[0])
        out = dtypes.bool_ if op in GroupOp.Comparison else d
        fn = function_of(lambda *p, op=op, out=out: UOp(op, out, p), [((3, 17), d)] * nsrc)
        yield f"{op.name}_{d.name}", fn, args


def _casts():
    for src in ALL:
        for dst in ALL:
            if src == dst: continue  # (no kernel: the output is the input)
            x = random_values(np.random.default_rng(7), src, (5, 9))
            if src.is_float and dst.is_int:
                info = np.iinfo(dst.np)
                x = np.clip(x.astype(np.float64), max(info.min, -1e6), min(info.max, 1e6)).astype(src.np)
            yield f"cast_{src.name}_{dst.name}", function_of(lambda p, dst=dst: UOp(Ops.CAST, dst, (p,)),
                                                              [((5, 9), src)]), [x]


def _bitcasts():
    for src in ALL:
        for dst in ALL:
            if src == dst or src.itemsize != dst.itemsize or dtypes.bool_ in (src, dst): continue
            x = random_values(np.random.default_rng(1), src, (4, 4))
            yield f"bitcast_{src.name}_{dst.name}", function_of(lambda p, dst=dst: UOp(Ops.BITCAST, dst, (p,)),
                                                                 [((4, 4), src)]), [x]


def _wheres():
    for d in ALL:
        rng = np.random.default_rng(3)
        args = [rng.random((6, 6)) < 0.5, random_values(rng, d, (6, 6)), random_values(rng, d, (6, 6))]
        yield f"where_{d.name}", function_of(lambda c, a, b, d=d: UOp(Ops.WHERE, d, (c, a, b)),
                                             [((6, 6), dtypes.bool_), ((6, 6), d), ((6, 6), d)]), args


REDUCE_SHAPES = [((3, 5, 4), (1,)), ((6, 7), (0, 1)), ((4, 9), (0,)), ((0, 3), (0,)), ((2, 0), (1,))]


def _reductions():
    for op in (Ops.ADD, Ops.MAX, Ops.MUL):
        for d in ALL:
            for shape, axes in REDUCE_SHAPES:
                if op is Ops.MAX and 0 in shape: continue  # (a max over nothing has no value)
                x = random_values(np.random.default_rng(0), d, shape)
                if op is Ops.MUL and d.is_float: x = (np.sign(x) * 0.9 + x * 0.01).astype(d.np)
                yield (f"reduce_{op.name}_{d.name}_{'x'.join(map(str, shape))}_{axes}",
                       function_of(lambda p, op=op, d=d, axes=axes: UOp(Ops.REDUCE, d, (p,), ReduceArg(op, axes)),
                                   [(shape, d)]), [x])


MOVEMENT = [  # chains of (kind, argument) applied to an int32 input of the first shape
    ((3, 4), [("permute", (1, 0)), ("pad", ((1, 2), (0, 1)))]),
    ((2, 3, 4), [("reshape", (24,)), ("flip", (True,)), ("shrink", ((3, 20),))]),
    ((1, 4), [("expand", (3, 4)), ("permute", (1, 0)), ("flip", (False, True))]),
    ((4, 1, 3), [("shrink", ((1, 3), (0, 1), (0, 3))), ("pad", ((0, 1), (2, 0), (1, 1))), ("reshape", (3, 3, 5))]),
]


def _movement():
    build = {"reshape": lambda x, a: (x.reshape(a), Ops.RESHAPE), "permute": lambda x, a: (x.transpose(a), Ops.PERMUTE),
             "expand": lambda x, a: (np.broadcast_to(x, a), Ops.EXPAND), "pad": lambda x, a: (np.pad(x, a), Ops.PAD),
             "shrink": lambda x, a: (x[tuple(slice(b, e) for b, e in a)], Ops.SHRINK),
             "flip": lambda x, a: (np.flip(x, tuple(i for i, f in enumerate(a) if f)), Ops.FLIP)}
    for i, (shape, chain) in enumerate(MOVEMENT):
        x = np.arange(int(np.prod(shape)), dtype=np.int32).reshape(shape)
        param = UOp(Ops.PARAM, dtypes.int32, (), ParamArg(0, shape, None))
        u, ref = param, x
        for kind, arg in chain:
            ref, op = build[kind](ref, arg)
            u = UOp(op, u.dtype, (u,), arg)
        u = UOp(Ops.ADD, u.dtype, (u, UOp.const(u.dtype, 1, u.shape)))
        yield f"movement_{i}", UOp(Ops.FUNCTION, dtypes.bool_, (UOp(Ops.TUPLE, dtypes.bool_, (u,)), param)), [x]


def _gather_scatter():
    rng = np.random.default_rng(5)
    x, upd = rng.standard_normal((4, 6)).astype(np.float32), rng.standard_normal((4, 2, 3)).astype(np.float32)
    idx = np.array([[0, 5, 9], [-1, 2, 2]], dtype=np.int32)
    for mode in ("set", "add", "mul", "min", "max"):
        yield f"scatter_{mode}", function_of(
            lambda a, i, v, mode=mode: UOp(Ops.SCATTER, dtypes.float32, (a, i, v), ScatterArg(1, mode)),
            [((4, 6), dtypes.float32), ((2, 3), dtypes.int32), ((4, 2, 3), dtypes.float32)]), [x, idx, upd]
    yield "gather", function_of(lambda a, i: UOp(Ops.INDEX, dtypes.float32, (a, i), 1),
                                [((4, 6), dtypes.float32), ((2, 3), dtypes.int32)]), [x, idx]


def _iota_and_constants():
    outs = (UOp(Ops.IOTA, dtypes.int32, (), IotaArg((3, 4), 1)), UOp.const(dtypes.float16, 1.5, (2, 2)),
            UOp.const(dtypes.float64, float("inf"), (3,)), UOp.const(dtypes.int64, -2 ** 63, (2,)),
            UOp.const(dtypes.uint64, 2 ** 64 - 1, (2,)), UOp.const(dtypes.float32, float("nan"), (2,)))
    yield "iota_and_constants", UOp(Ops.FUNCTION, dtypes.bool_, (UOp(Ops.TUPLE, dtypes.bool_, outs),)), []


SUITE = {"alu": _alu, "casts": _casts, "bitcasts": _bitcasts, "where": _wheres, "reductions": _reductions,
         "movement": _movement, "gather_scatter": _gather_scatter, "iota_and_constants": _iota_and_constants}


# ---- compiling without a GPU ----

def entry_points(ptx: str) -> set[str]:
    return set(re.findall(r"\.entry\s+(\w+)\s*\(", ptx))


def compile_functions(named: list[tuple[str, UOp]]) -> int:
    """Lower every FUNCTION for the sm_90 target, compile its kernels (renamed apart) in modules of PER_MODULE
    with NVRTC, and check each PTX has every kernel's entry point; returns how many kernels compiled. A module
    that fails is compiled function by function, so the failure names the function."""
    compiler = cuda.CUDACompiler(ARCH, cubin=False)
    kernels, owner = [], {}
    for name, fn in named:
        for k, lines in lower(fn, TARGET).kernels:
            if lines is None: continue
            renamed = dataclasses.replace(k, name=f"{re.sub(r'[^0-9A-Za-z_]', '_', name)}__{k.name}")
            kernels.append((renamed, lines))
            owner[renamed.name] = name
    renderer = CRenderer(CUDA)
    for start in range(0, len(kernels), PER_MODULE):
        chunk = kernels[start:start + PER_MODULE]
        source = renderer.render(chunk)
        try:
            ptx = compiler.compile_uncached(source).rstrip(b"\0").decode()
        except RuntimeError:
            for k, lines in chunk:
                try:
                    compiler.compile_uncached(renderer.render([(k, lines)]))
                except RuntimeError as err:
                    raise AssertionError(f"{owner[k.name]}: NVRTC rejects kernel {k.name}:\n{err}") from None
            raise
        missing = {k.name for k, _ in chunk} - entry_points(ptx)
        assert not missing, f"PTX lacks the entry points of {sorted(missing)}"
    return len(kernels)


@pytest.mark.parametrize("group", list(SUITE))
def test_op_suite_compiles_to_ptx(group):
    named = [(name, fn) for name, fn, _ in SUITE[group]()]
    assert compile_functions(named) >= len(named)  # every FUNCTION of the suite has at least one kernel


def _mlp_args():
    rng = np.random.default_rng(0)
    p = {"w1": rng.standard_normal((20, 16)) * 0.3, "b1": rng.standard_normal(16) * 0.1,
         "w2": rng.standard_normal((16, 5)) * 0.3, "b2": np.zeros(5)}
    p = {k: v.astype(np.float32) for k, v in p.items()}
    x = rng.standard_normal((8, 20)).astype(np.float32)
    return p, x, np.eye(5, dtype=np.float32)[rng.integers(0, 5, 8)]


def _softmax_layernorm(x, gamma):
    s = fnx.nn.softmax(x, axis=-1)
    mean = jnp.mean(s, axis=-1, keepdims=True)
    var = jnp.var(s, axis=-1, keepdims=True)
    return (s - mean) / jnp.sqrt(var + 1e-5) * gamma


MODELS = {"mlp_grad_step": (mlp_step, _mlp_args),
          "softmax_layernorm": (_softmax_layernorm, lambda: (np.random.default_rng(1).standard_normal(
              (6, 33)).astype(np.float32), np.linspace(0.5, 1.5, 33, dtype=np.float32)))}


def _lowered_on_cuda(name: str):
    fun, make_args = MODELS[name]
    return fnx.jit(fun, backend="cuda").lower(*make_args())


@pytest.mark.parametrize("name", list(MODELS))
def test_whole_models_compile_to_ptx(name):
    lowered = _lowered_on_cuda(name)
    launched = {item.kernel for item in lowered.executable.items if hasattr(item, "kernel")}
    assert launched, "no kernels"
    ptx = lowered.as_text("ptx")
    assert launched <= entry_points(ptx), sorted(launched - entry_points(ptx))
    assert ".target sm_90" in ptx


def test_lower_shows_cuda_source_without_a_gpu():
    lowered = fnx.jit(lambda x: jnp.sin(x) * 2 + 1, backend="cuda").lower(np.ones((4, 8), np.float32))
    source = lowered.as_text("source")
    kernel = next(item.kernel for item in lowered.executable.items if hasattr(item, "kernel"))
    assert f'extern "C" __global__ void {kernel}(float* b0, float* b1, long long lo, long long hi)' in source
    assert "blockIdx.x" in source and "sin(" in source
    assert lowered.executable.device.startswith("cuda:")
    assert "launch" in lowered.as_text("items")


def test_products_and_sums_round_separately():
    """--fmad=false: x * y + 1 is a rounded product and a rounded sum, as on every other backend, not one FMA."""
    x = np.ones(8, np.float32)
    ptx = fnx.jit(lambda x, y: x * y + 1, backend="cuda").lower(x, x).as_text("ptx")
    assert "mul.rn.f32" in ptx and "add.rn.f32" in ptx and "fma" not in ptx


def test_compile_only_device_says_what_it_cannot_do():
    device = fnx.devices("cuda")[0]
    if not device.compile_only: pytest.skip("this machine has a CUDA GPU: cuda:0 is a real device")
    assert fnx.device_count("cuda") == 1 and "compile_only" in repr(device)
    with pytest.raises(RuntimeError, match="compile-only"):
        fnx.device_put(np.ones(3, np.float32), "cuda")
    with pytest.raises(RuntimeError, match="compile-only"):
        fnx.jit(lambda x: x + 1, backend="cuda")(np.ones(3, np.float32))


def test_nvrtc_errors_name_the_kernels():
    source = 'extern "C" __global__ void k_broken(float* b0, long long lo, long long hi) { b0[0] = undefined; }'
    with pytest.raises(RuntimeError, match=r"(?s)k_broken.*undefined"):
        cuda.CUDACompiler(ARCH, cubin=False).compile_uncached(source)


def test_arch_names():
    assert [cuda.parse_arch(a) for a in ("sm_90", "compute_80", "86", "9.0", "sm_90a")] == ["90", "80", "86", "90",
                                                                                          "90a"]
    with pytest.raises(ValueError, match="FNX_CUDA_ARCH"):
        cuda.parse_arch("hopper")


# ---- on a GPU ----

def _gpu() -> str | None:
    devices = fnx.devices("cuda")
    return devices[0].name if devices and not devices[0].compile_only else None


gpu = pytest.mark.skipif(_gpu() is None, reason="no CUDA GPU on this machine")


def _run_on_gpu(fn: UOp, args: list) -> list[np.ndarray]:
    device = fnx.devices("cuda")[0]
    outs = device.compile(fn)([device.allocator.from_numpy(a) for a in args])
    return [device.allocator.copyout(b).reshape(u.shape) for b, u in zip(outs, fn.src[0].src)]


@gpu
@pytest.mark.parametrize("group", list(SUITE))
def test_op_suite_on_gpu_matches_interp(group):
    for name, fn, args in SUITE[group]():
        want = interp.run(fn, args)
        for got, w, u in zip(_run_on_gpu(fn, args), want, fn.src[0].src):
            try:
                assert_same(got, np.asarray(w).reshape(u.shape), u.dtype)
            except AssertionError as err:
                raise AssertionError(f"{name}: {err}") from None


@gpu
def test_device_put_round_trips_and_runs_on_gpu():
    x = np.arange(12, dtype=np.float32).reshape(3, 4)
    on_gpu = fnx.device_put(x, "cuda:0")
    assert on_gpu.device.name == "cuda:0"
    np.testing.assert_array_equal(np.asarray(on_gpu), x)
    y = jnp.exp(on_gpu) * 2 + jnp.sum(on_gpu)  # eager ops run on the array's device
    back = fnx.device_put(y, "cpu:0")
    assert back.device.name == "cpu:0"
    np.testing.assert_allclose(np.asarray(back), np.exp(x) * 2 + x.sum(), rtol=1e-6)
    moved = fnx.jit(lambda a: fnx.device_put(a * 3, "cpu:0"))(on_gpu)  # a COPY inside a compiled function
    np.testing.assert_allclose(np.asarray(moved), x * 3)


@gpu
def test_block_until_ready_waits_for_the_gpu():
    """Launches return at once; block_until_ready returns only when the stream has run them (it returned at once
    on the first GPU run, so a benchmark timed the launches alone)."""
    from cuda.bindings import driver
    a = fnx.device_put(np.ones((2048, 2048), np.float32), "cuda:0")
    f = fnx.jit(lambda a: jnp.tanh(a @ a) @ a)
    f(a).block_until_ready()
    device = fnx.devices("cuda")[0]
    outs = [f(a) for _ in range(20)]  # a few hundred milliseconds of queued work without tensor cores
    assert int(driver.cuStreamQuery(device.stream)[0]) == int(driver.CUresult.CUDA_ERROR_NOT_READY)
    fnx.block_until_ready(outs[-1])
    assert int(driver.cuStreamQuery(device.stream)[0]) == 0  # CUDA_SUCCESS: the stream has run everything
    np.testing.assert_allclose(np.asarray(outs[0])[:2, :2], np.tanh(np.float32(2048)) * 2048, rtol=1e-5)


@gpu
def test_float16_empty_large_and_mixed_devices_on_gpu():
    with fnx.default_device("cuda"):
        h = jnp.asarray(np.array([1.5, -2.25, 65504, 6e-8, np.nan], np.float16))
        np.testing.assert_array_equal(np.asarray(h * 2), np.array([3, -4.5, np.inf, 1.2e-7, np.nan], np.float16))
        assert np.asarray(jnp.zeros((0, 3)) + 1).shape == (0, 3)
        big = jnp.arange(1 << 22, dtype=jnp.float32)
        assert float(jnp.sum(jnp.ones(1 << 22))) == float(1 << 22)
        np.testing.assert_allclose(float(jnp.sum(big)), (1 << 22) * ((1 << 22) - 1) / 2, rtol=1e-6)
        np.testing.assert_array_equal(np.asarray(big[::1 << 20] * 2), np.arange(0, 1 << 22, 1 << 20) * 2)
        on_gpu = jnp.ones(3)
    with pytest.raises(ValueError, match="different devices"):
        fnx.jit(lambda a, b: a + b)(on_gpu, fnx.device_put(np.ones(3, np.float32), "cpu:0"))


@pytest.mark.skipif(_gpu() is None or len(fnx.devices("cuda")) < 2, reason="fewer than two CUDA GPUs")
def test_transfers_between_gpus():
    x = np.arange(10, dtype=np.float32)
    on_1 = fnx.device_put(fnx.device_put(x, "cuda:0") * 2, "cuda:1")  # peer to peer
    assert on_1.device.name == "cuda:1"
    np.testing.assert_array_equal(np.asarray(on_1 + 1), x * 2 + 1)
    moved = fnx.jit(lambda a: fnx.device_put(a + 1, "cuda:1"))(fnx.device_put(x, "cuda:0"))
    assert moved.device.name == "cuda:1"
    np.testing.assert_array_equal(np.asarray(moved), x + 1)


@gpu
def test_mlp_step_on_gpu_matches_cpu():
    p, x, onehot = _mlp_args()
    step_gpu = fnx.jit(mlp_step, backend="cuda")
    step_cpu = fnx.jit(mlp_step, backend="cpu")
    params_gpu, params_cpu = fnx.device_put(p, "cuda:0"), fnx.device_put(p, "cpu:0")
    for _ in range(3):
        params_gpu, loss_gpu = step_gpu(params_gpu, x, onehot)
        params_cpu, loss_cpu = step_cpu(params_cpu, x, onehot)
        np.testing.assert_allclose(float(loss_gpu), float(loss_cpu), rtol=1e-5)
    for k in p:
        assert params_gpu[k].device.name == "cuda:0"
        np.testing.assert_allclose(np.asarray(params_gpu[k]), np.asarray(params_cpu[k]), rtol=1e-5, atol=1e-6)


@gpu
def test_dlpack_shares_gpu_memory_read_only():
    """An Array on the GPU goes out as its own memory (DLPack 1.0, read-only) and comes back in place; a consumer
    without the read-only flag, or one asking for a copy, gets a copy of its own on the GPU."""
    import gc
    from fnx.backends import dlpack
    x = np.arange(12, dtype=np.float32).reshape(3, 4)
    a = fnx.device_put(x, "cuda:0") * 2
    assert a.__dlpack_device__() == (dlpack.CUDA, 0)
    back = jnp.from_dlpack(a)  # (fnx as the consumer: in place)
    assert back.device.name == "cuda:0" and back._buffer.ptr == a._buffer.ptr
    np.testing.assert_array_equal(np.asarray(jnp.sum(back, axis=0)), (x * 2).sum(axis=0))
    for kwargs, same, read_only in [({"max_version": (1, 0)}, True, True), ({"max_version": (1, 0), "copy": True},
                                                                             False, False), ({}, False, False),
                                    ({"max_version": (1, 0), "stream": 2}, True, True)]:
        tensor = dlpack.Borrowed(a.__dlpack__(**kwargs))
        assert (tensor.address == a._buffer.ptr) == same and tensor.read_only == read_only, kwargs
        assert tensor.device == (dlpack.CUDA, 0) and tensor.shape == (3, 4) and tensor.dtype == dtypes.float32
        buffer, index = fnx.devices("cuda")[0].allocator.borrow(tensor)
        assert index is None
        np.testing.assert_array_equal(fnx.devices("cuda")[0].allocator.copyout(buffer).reshape(3, 4), x * 2)
        del buffer  # (gives the tensor back)
    with pytest.raises(BufferError, match="shares memory only with DLPack 1.0 consumers"):
        a.__dlpack__(copy=False)
    np.testing.assert_array_equal(np.from_dlpack(a, device="cpu"), x * 2)  # (dl_device: a host copy)
    with pytest.raises(BufferError, match="reaches the host only as a copy"):
        a.__dlpack__(max_version=(1, 0), dl_device=(dlpack.CPU, 0), copy=False)
    copied = jnp.from_dlpack(a, copy=True)
    assert copied._buffer.ptr != a._buffer.ptr
    np.testing.assert_array_equal(np.asarray(copied), x * 2)
    del back, copied
    gc.collect()
    assert dlpack.exports_alive() == 0


@gpu
def test_dlpack_strided_gpu_tensors_are_gathered():
    """A producer's transposed, reversed or broadcast GPU tensor: fnx borrows the memory it spans and gathers
    the elements into a buffer of its own on the GPU."""
    import gc
    from fnx.backends import dlpack

    class Producer:
        def __init__(self, capsule): self.capsule = capsule
        def __dlpack__(self, **kwargs): return self.capsule
        def __dlpack_device__(self): return (dlpack.CUDA, 0)

    x = np.arange(12, dtype=np.float32).reshape(3, 4)
    a = fnx.device_put(x, "cuda:0")
    ptr = a._buffer.ptr
    for shape, strides, start, want in [((4, 3), (1, 4), 0, x.T), ((3, 4), (-4, -1), 11, x[::-1, ::-1]),
                                        ((2, 3, 4), (0, 4, 1), 0, np.broadcast_to(x, (2, 3, 4)))]:
        capsule = dlpack.export(ptr + 4 * start, dtypes.float32, shape, (dlpack.CUDA, 0), a, True, dlpack.READ_ONLY,
                                strides=strides)
        got = jnp.from_dlpack(Producer(capsule))
        assert got.device.name == "cuda:0"
        np.testing.assert_array_equal(np.asarray(got * 1), want)
    del got
    gc.collect()
    assert dlpack.exports_alive() == 0
