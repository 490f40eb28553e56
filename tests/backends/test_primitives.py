"""Every primitive, on every dtype it accepts, on every backend: compiled results equal the interp oracle,
and the interp oracle equals plain numpy where numpy defines the operation."""
import zlib

import numpy as np
import pytest
from hypothesis import given, strategies as st

from fnx import dtypes, lax
from fnx.backends import interp
from fnx.backends.device import get_device
from fnx.trace import compile_function
from fnx.uop import GroupOp, IotaArg, Ops, ParamArg, ReduceArg, ScatterArg, UOp
from backends_under_test import DEVICES

ALL = dtypes.DTYPES
FLOATS = [d for d in ALL if d.is_float]
INTS = [d for d in ALL if d.is_int]


def random_values(rng: np.random.Generator, dtype, shape) -> np.ndarray:
    if dtype.is_bool: return rng.random(shape) < 0.5
    if dtype.is_float:
        v = rng.standard_normal(shape) * 4
        return v.astype(dtype.np)
    info = np.iinfo(dtype.np)
    edge = np.array([info.min, info.max, 0, 1, -1 if info.min < 0 else 2], dtype=object).astype(dtype.np)
    v = rng.integers(max(info.min, -1000), min(info.max, 1000), size=shape, endpoint=True).astype(dtype.np)
    flat = v.reshape(-1)
    if flat.size >= 8: flat[:5] = edge
    return v


COMPILED = [d for d in DEVICES if d != "interp"]  # the backends under test (FNX_TEST_DEVICES); interp is the oracle


@pytest.fixture(params=COMPILED)
def backend(request):
    return request.param


def run_on(device: str, fn: UOp, args: list[np.ndarray]) -> list[np.ndarray]:
    exe = compile_function(fn, f"{device}:0")
    allocator = get_device(f"{device}:0").allocator
    outs = exe([allocator.from_numpy(a) for a in args])
    return [get_device(b.device).allocator.copyout(b).reshape(u.shape) for b, u in zip(outs, fn.src[0].src)]


def function_of(build, avals) -> UOp:
    """The FUNCTION of PARAMs with `avals` ((shape, dtype) each) whose result is `build(*params)`: one UOp, or a
    tuple of them (outputs of one program)."""
    params = [UOp(Ops.PARAM, d, (), ParamArg(i, s, None)) for i, (s, d) in enumerate(avals)]
    out = build(*params)
    return UOp(Ops.FUNCTION, dtypes.bool_, (UOp(Ops.TUPLE, dtypes.bool_, out if isinstance(out, tuple) else (out,)),
                                            *params))


def assert_same(got: np.ndarray, want: np.ndarray, dtype) -> None:
    if dtype.is_float:
        g, w = got.astype(np.float64), want.astype(np.float64)
        tol = {2: 1e-2, 4: 2e-6, 8: 1e-13}[dtype.itemsize]
        np.testing.assert_allclose(g, w, rtol=tol, atol=tol, equal_nan=True)
    else:
        np.testing.assert_array_equal(got, want)


UNARY_FLOAT = [Ops.RECIP, Ops.SQRT, Ops.EXP2, Ops.LOG2, Ops.SIN, Ops.TRUNC]
BINARY = [Ops.ADD, Ops.MUL, Ops.MAX, Ops.DIV, Ops.MOD, Ops.CMPLT, Ops.CMPNE]
BITWISE = [Ops.AND, Ops.OR, Ops.XOR]
SHIFTS = [Ops.SHL, Ops.SHR]


def _cases():
    for op in UNARY_FLOAT:
        for d in FLOATS: yield op, d
    for op in BINARY:
        for d in ALL:
            if op in (Ops.DIV, Ops.MOD) and d.is_bool: continue
            yield op, d
    for op in BITWISE:
        for d in INTS + [dtypes.bool_]: yield op, d
    for op in SHIFTS:
        for d in INTS: yield op, d


def _alu_inputs(op, dtype) -> list[np.ndarray]:
    rng = np.random.default_rng(zlib.crc32(f'{op.name}{dtype.name}'.encode()))
    args = [random_values(rng, dtype, (3, 17)) for _ in range(1 if op in GroupOp.Unary else 2)]
    if op in SHIFTS: args[1] = rng.integers(-2, 8 * dtype.itemsize + 2, size=(3, 17)).astype(dtype.np)
    if op is Ops.LOG2 or op is Ops.SQRT: args[0] = np.abs(args[0])
    return args


# The ALU cases of one dtype run as the outputs of one program (each case its own inputs): an OpenCL driver builds
# a program in 0.2 s (PoCL parses its whole builtin header each time), whatever its size
@pytest.mark.parametrize("dtype", sorted({d for _, d in _cases()}, key=ALL.index), ids=lambda d: d.name)
def test_alu_matches_oracle(dtype, backend):
    ops = [op for op, d in _cases() if d is dtype]
    inputs = [_alu_inputs(op, dtype) for op in ops]
    outs = [dtypes.bool_ if op in GroupOp.Comparison else dtype for op in ops]
    slots = np.cumsum([0] + [len(a) for a in inputs])
    flat = [a for args in inputs for a in args]
    fn = function_of(lambda *p: tuple(UOp(op, out, p[lo:hi]) for op, out, lo, hi in zip(ops, outs, slots, slots[1:])),
                     [(a.shape, dtype) for a in flat])
    want, got = interp.run(fn, flat), run_on(backend, fn, flat)
    for op, out, g, w in zip(ops, outs, got, want):
        try:
            assert_same(g, w, out)
        except AssertionError as err:
            raise AssertionError(f"{op.name} on {dtype.name}: {err}") from None


@pytest.mark.parametrize("src", ALL, ids=lambda d: d.name)
def test_cast_matches_oracle(src, backend):
    """The casts from `src` to every dtype, as the outputs of one program (each its own input)."""
    rng = np.random.default_rng(7)
    inputs = []
    for dst in ALL:
        x = random_values(rng, src, (5, 9))
        if src.is_float and dst.is_int:  # in range: out-of-range float->int casts are implementation-defined in numpy
            info = np.iinfo(dst.np)
            x = np.clip(x.astype(np.float64), max(info.min, -1e6), min(info.max, 1e6)).astype(src.np)
        inputs.append(x)
    fn = function_of(lambda *p: tuple(UOp(Ops.CAST, dst, (q,)) for dst, q in zip(ALL, p)), [((5, 9), src)] * len(ALL))
    want, got = interp.run(fn, inputs), run_on(backend, fn, inputs)
    for dst, x, g, w in zip(ALL, inputs, got, want):
        try:
            assert_same(g, w, dst)
            if not (src.is_float and dst.is_int and dst.is_unsigned):
                assert_same(w, x.astype(dst.np) if not dst.is_bool else x != 0, dst)
        except AssertionError as err:
            raise AssertionError(f"cast {src.name} -> {dst.name}: {err}") from None


@pytest.mark.parametrize("pair", [(dtypes.float32, dtypes.int32), (dtypes.int32, dtypes.float32),
                                  (dtypes.float16, dtypes.int16), (dtypes.bfloat16, dtypes.uint16),
                                  (dtypes.float64, dtypes.uint64), (dtypes.uint8, dtypes.int8)])
def test_bitcast(pair, backend):
    src, dst = pair
    x = random_values(np.random.default_rng(1), src, (4, 4))
    fn = function_of(lambda p: UOp(Ops.BITCAST, dst, (p,)), [((4, 4), src)])
    got = run_on(backend, fn, [x])[0]
    assert_same(got, x.view(dst.np), dst)


def test_where_all_dtypes(backend):
    rng = np.random.default_rng(3)
    for d in ALL:
        c, a, b = rng.random((6, 6)) < 0.5, random_values(rng, d, (6, 6)), random_values(rng, d, (6, 6))
        fn = function_of(lambda p, q, r: UOp(Ops.WHERE, d, (p, q, r)),
                         [((6, 6), dtypes.bool_), ((6, 6), d), ((6, 6), d)])
        assert_same(run_on(backend, fn, [c, a, b])[0], np.where(c, a, b), d)


@pytest.mark.parametrize("dtype", [dtypes.float32, dtypes.float64, dtypes.int32, dtypes.uint8, dtypes.bool_,
                                   dtypes.bfloat16, dtypes.int64], ids=lambda d: d.name)
@given(shape=st.lists(st.integers(0, 5), min_size=1, max_size=3), data=st.data())
def test_reduce(dtype, shape, data, backend):
    """Sum, max and product over random axes of a random shape (one program, an output each)."""
    shape, ops = tuple(shape), (Ops.ADD, Ops.MAX, Ops.MUL)
    axes = tuple(sorted(data.draw(st.sets(st.integers(0, len(shape) - 1), min_size=1))))
    x = random_values(np.random.default_rng(0), dtype, shape)
    inputs = [x, x, (np.sign(x) * 0.9 + x * 0.01).astype(dtype.np) if dtype.is_float else x]
    fn = function_of(lambda *p: tuple(UOp(Ops.REDUCE, dtype, (q,), ReduceArg(op, axes)) for op, q in zip(ops, p)),
                     [(shape, dtype)] * 3)
    want, got = interp.run(fn, inputs), run_on(backend, fn, inputs)
    for op, v, g, w in zip(ops, inputs, got, want):
        ref = {Ops.ADD: np.sum, Ops.MUL: np.prod, Ops.MAX: np.max}[op]
        try:
            if v.size or op is not Ops.MAX:
                wide = v.astype(np.float32) if dtype.is_float and dtype.itemsize == 2 else v  # 16-bit floats: in f32
                assert_same(w, ref(wide, axis=axes, keepdims=True).astype(dtype.np), dtype)
            assert_same(g, w, dtype)
        except AssertionError as err:
            raise AssertionError(f"{op.name} of {dtype.name} {shape} over {axes}: {err}") from None


@given(data=st.data())
def test_movement_chains(data, backend):
    """Random chains of movement ops on an input equal numpy's, on every backend (they become index arithmetic)."""
    shape = tuple(data.draw(st.lists(st.integers(1, 4), min_size=1, max_size=3)))
    x = np.arange(int(np.prod(shape)), dtype=np.int32).reshape(shape)
    u = UOp(Ops.PARAM, dtypes.int32, (), ParamArg(0, shape, None))
    ref = x
    for _ in range(data.draw(st.integers(1, 4))):
        kind = data.draw(st.sampled_from(["reshape", "permute", "expand", "pad", "shrink", "flip"]))
        s = ref.shape
        if kind == "reshape":
            new = (int(np.prod(s)),) if len(s) > 1 else (1,) + s
            ref, u = ref.reshape(new), UOp(Ops.RESHAPE, u.dtype, (u,), new)
        elif kind == "permute":
            perm = tuple(data.draw(st.permutations(range(len(s)))))
            ref, u = ref.transpose(perm), UOp(Ops.PERMUTE, u.dtype, (u,), perm)
        elif kind == "expand":
            new = tuple(3 if d == 1 else d for d in s)
            ref, u = np.broadcast_to(ref, new), UOp(Ops.EXPAND, u.dtype, (u,), new)
        elif kind == "pad":
            pads = tuple((data.draw(st.integers(0, 2)), data.draw(st.integers(0, 2))) for _ in s)
            ref, u = np.pad(ref, pads), UOp(Ops.PAD, u.dtype, (u,), pads)
        elif kind == "shrink":
            bounds = tuple((b, data.draw(st.integers(b, d))) for d in s for b in [data.draw(st.integers(0, d))])
            ref, u = ref[tuple(slice(b, e) for b, e in bounds)], UOp(Ops.SHRINK, u.dtype, (u,), bounds)
        else:
            flags = tuple(data.draw(st.booleans()) for _ in s)
            ref = np.flip(ref, tuple(i for i, f in enumerate(flags) if f))
            u = UOp(Ops.FLIP, u.dtype, (u,), flags)
    u = UOp(Ops.ADD, u.dtype, (u, UOp.const(u.dtype, 1, u.shape)))
    param = UOp(Ops.PARAM, dtypes.int32, (), ParamArg(0, shape, None))
    fn = UOp(Ops.FUNCTION, dtypes.bool_, (UOp(Ops.TUPLE, dtypes.bool_, (u,)), param))
    np.testing.assert_array_equal(run_on(backend, fn, [x])[0], ref + 1)
    np.testing.assert_array_equal(interp.run(fn, [x])[0], ref + 1)


@pytest.mark.parametrize("mode", ["set", "add", "mul", "min", "max"])
def test_gather_scatter(mode, backend):
    rng = np.random.default_rng(5)
    x = rng.standard_normal((4, 6)).astype(np.float32)
    idx = np.array([[0, 5, 9], [-1, 2, 2]], dtype=np.int32)
    upd = rng.standard_normal((4, 2, 3)).astype(np.float32)
    fn = function_of(lambda a, i, v: UOp(Ops.SCATTER, dtypes.float32, (a, i, v), ScatterArg(1, mode)),
                     [((4, 6), dtypes.float32), ((2, 3), dtypes.int32), ((4, 2, 3), dtypes.float32)])
    want = interp.run(fn, [x, idx, upd])[0]
    np.testing.assert_allclose(run_on(backend, fn, [x, idx, upd])[0], want, rtol=1e-6)
    ref = x.copy()
    ufunc = {"set": None, "add": np.add, "mul": np.multiply, "min": np.minimum, "max": np.maximum}[mode]
    for j, t in enumerate(idx.reshape(-1)):
        if 0 <= t < 6:
            ref[:, t] = upd.reshape(4, 6)[:, j] if ufunc is None else ufunc(ref[:, t], upd.reshape(4, 6)[:, j])
    np.testing.assert_allclose(want, ref, rtol=1e-6)
    g = function_of(lambda a, i: UOp(Ops.INDEX, dtypes.float32, (a, i), 1),
                    [((4, 6), dtypes.float32), ((2, 3), dtypes.int32)])
    np.testing.assert_array_equal(run_on(backend, g, [x, idx])[0], np.take(x, np.clip(idx, 0, 5), axis=1))


def test_iota_and_constants(backend):
    fn = UOp(Ops.FUNCTION, dtypes.bool_, (UOp(Ops.TUPLE, dtypes.bool_, (
        UOp(Ops.IOTA, dtypes.int32, (), IotaArg((3, 4), 1)), UOp.const(dtypes.float16, 1.5, (2, 2)))),))
    iota, const = run_on(backend, fn, [])
    np.testing.assert_array_equal(iota, np.broadcast_to(np.arange(4, dtype=np.int32), (3, 4)))
    np.testing.assert_array_equal(const, np.full((2, 2), 1.5, np.float16))


def test_lax_primitives_run_eagerly(device):
    x = lax.to_array(np.arange(12, dtype=np.float32).reshape(3, 4))
    want = (np.arange(12).reshape(3, 4) * 2).sum(1)
    np.testing.assert_allclose(np.asarray(lax.reduce_sum(lax.mul(x, 2.0), (1,))), want)


@pytest.mark.parametrize("op", [Ops.EXP2, Ops.LOG2, Ops.SQRT, Ops.SIN, Ops.RECIP])
@pytest.mark.parametrize("dtype", [dtypes.float32, dtypes.float64], ids=lambda d: d.name)
def test_transcendental_special_values(op, dtype, backend):
    """Compiled transcendentals (polynomials after instruction selection) keep numpy's special values and
    accuracy across the whole range: 0, subnormals, huge, inf, nan, negative."""
    info = np.finfo(dtype.np)
    special = [0.0, -0.0, 1.0, 2.0, 0.5, -1.0, np.inf, -np.inf, np.nan, info.tiny, info.tiny / 8, info.max,
               -info.max, 127.9, 128.0, 150.0, -149.5, -160.0, 1023.5, -1074.0, 1e-30, 3e30]
    rng = np.random.default_rng(11)
    x = np.concatenate([np.array(special), rng.uniform(-300, 300, 200), np.exp(rng.uniform(-80, 80, 200))])
    x = x.astype(dtype.np)
    if op is Ops.SIN: x = x[np.abs(x) < 1e4]
    fn = function_of(lambda p: UOp(op, dtype, (p,)), [(x.shape, dtype)])
    got = run_on(backend, fn, [x])[0].astype(np.float64)
    want = interp.run(fn, [x])[0].astype(np.float64)
    assert np.array_equal(np.isnan(got), np.isnan(want))
    tol = 4 * float(info.eps)
    np.testing.assert_allclose(got, want, rtol=tol, atol=float(info.tiny) * 4, equal_nan=True)
