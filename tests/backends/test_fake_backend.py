"""The `fake` backend of tests/fake_backend.py (generated Python over numpy, plugged into the runtime interface and
replayed by fnx/backends/replay.py) computes what the interp oracle and numpy compute: every op class, 16-bit
floats, integer corner cases, control flow (host items), grad, and copies between devices (transfer items)."""
import math
import os
import re
import subprocess
import sys
import textwrap

import ml_dtypes
import numpy as np
import pytest
from hypothesis import event, given
from hypothesis import strategies as st

import fake_backend
import fnx
import fnx.numpy as jnp
from assertions import assert_tree_close, mlp_loss, one_action, random_schedule
from fnx import lax, nn, tree_util
from fnx.backends import interp
from fnx.backends.device import Launch, ObjectCache, get_device
from fnx.errors import UnsupportedError
from fnx.lower.optimize import Opt, schedule_override
from fnx.uop import GroupOp, Ops

RNG = np.random.default_rng(0)
F32 = np.float32


def _on(device, fn, *args, jit=False):
    """fn(*args) with the arguments placed on `device` and it the default device; numpy results."""
    with fnx.default_device(device):
        placed = [fnx.device_put(a, device) for a in args]
        out = (fnx.jit(fn) if jit else fn)(*placed)
    return tree_util.tree_map(np.asarray, out)


def _check(fn, *args, rtol=2e-6, atol=1e-6):
    """Eager and jit on fake:0 against eager interp; exact where rtol is 0."""
    expected = _on("interp", fn, *args)
    for jit in (False, True):
        got = _on("fake:0", fn, *args, jit=jit)
        assert_tree_close(got, expected, rtol=rtol, atol=atol if rtol else 0, exact_dtypes=True)
    return expected


def _executable(fn, *args):
    """The fake:0 executable of jit(fn) on args (its items and source)."""
    with fnx.default_device("fake:0"):
        return fnx.jit(fn).lower(*[fnx.device_put(a, "fake:0") for a in args]).executable


# ---- the device and its memory ----

def test_the_platform_has_two_devices_with_their_own_memory():
    assert [d.name for d in fnx.devices("fake")] == ["fake:0", "fake:1"]
    x = fnx.device_put(np.arange(6, dtype=F32), "fake:1")
    assert x.device is get_device("fake:1") and x.device.platform == "fake"
    with fnx.default_device("fake:0"):
        y = jnp.ones((2, 3)) * 2
    assert y.device.name == "fake:0" and y.devices() == {get_device("fake:0")}
    pools = {id(get_device(name).allocator.pool) for name in ("fake:0", "fake:1", "cpu:0")}
    assert len(pools) == 3
    with pytest.raises(ValueError, match="fake:2"):
        fnx.device_put(x, "fake:2")


# ---- elementwise, transcendentals, reductions, matmul ----

def test_elementwise_with_broadcasting():
    x, y = RNG.standard_normal((3, 1, 5)).astype(F32), RNG.standard_normal((4, 1)).astype(F32)
    _check(lambda a, b: (a * b - b / (1 + a * a)) ** 2 + jnp.maximum(a, b) - jnp.abs(a) + jnp.sqrt(jnp.abs(b)), x, y)
    _check(lambda a, b: jnp.where(a > b, a, -b) + (a != b) + jnp.floor(a * 3) % 2, x, y)
    _check(lambda a: a.T[::-1] + jnp.pad(a[0], ((1, 0), (0, 2)))[:, 1:6].sum(), x)


def test_transcendentals_against_float64():
    x = np.concatenate([np.linspace(-6, 6, 41), [0.0, -0.0, 1e-30, 1e-40, 80.0, -100.0]]).astype(F32)
    pos = np.concatenate([np.geomspace(1e-38, 1e38, 31), [0.0, np.inf, 1e-45]]).astype(F32)
    erf = np.vectorize(math.erf)
    cases = [(jnp.exp, np.exp, x), (jnp.log, np.log, pos), (jnp.sin, np.sin, x), (jnp.tanh, np.tanh, x),
             (lambda v: nn.gelu(v, approximate=False), lambda v: v * (1 + erf(v / np.sqrt(2))) / 2, x)]
    for fn, ref, arg in cases:
        got = _on("fake:0", fn, arg, jit=True)
        with np.errstate(all="ignore"):
            want = ref(arg.astype(np.float64)).astype(F32)
        np.testing.assert_allclose(got, want, rtol=4e-6, atol=1e-37)
        _check(fn, arg, rtol=4e-6, atol=1e-37)
    assert np.isnan(_on("fake:0", jnp.log, np.array([-1.0, np.nan], F32))).all()


@pytest.mark.parametrize("axis", [0, 1, 2, (0, 2), None])
def test_reductions_on_every_axis(axis):
    x = RNG.standard_normal((3, 4, 5)).astype(F32)
    i = RNG.integers(-100, 100, (3, 4, 5)).astype(np.int32)
    got = _check(lambda a, b: (a.sum(axis), a.max(axis), a.min(axis), a.mean(axis), jnp.prod(a, axis),
                               b.sum(axis), b.max(axis), jnp.any(b > 90, axis), jnp.all(b > -99, axis)), x, i)
    np.testing.assert_allclose(got[0], x.astype(np.float64).sum(axis), rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(got[5], i.sum(axis))


def test_matmul_and_softmax():
    a, b = RNG.standard_normal((6, 9)).astype(F32), RNG.standard_normal((9, 5)).astype(F32)
    got = _check(lambda p, q: p @ q, a, b, rtol=1e-5)
    np.testing.assert_allclose(got, a.astype(np.float64) @ b, rtol=1e-5, atol=1e-5)
    x = RNG.standard_normal((4, 7)).astype(F32) * 5
    got = _check(lambda v: nn.softmax(v, axis=-1), x)
    e = np.exp(x - x.max(-1, keepdims=True).astype(np.float64))
    np.testing.assert_allclose(got, e / e.sum(-1, keepdims=True), rtol=1e-5)


# ---- integers, casts and 16-bit floats: exactly what the oracle computes ----

DTYPES = [np.bool_, np.int8, np.int16, np.int32, np.int64, np.uint8, np.uint16, np.uint32, np.uint64, np.float16,
          ml_dtypes.bfloat16, np.float32, np.float64]
SAME_WIDTH = {1: np.int8, 2: np.uint16, 4: np.float32, 8: np.int64}


def _values(dtype):
    """Values of `dtype` that reach the corner cases: extremes, zeros of both signs, inf, NaN, small shifts."""
    if dtype == np.bool_: return st.booleans()
    if np.dtype(dtype).kind in "iu":
        info = np.iinfo(dtype)
        return st.one_of(st.integers(int(info.min), int(info.max)), st.sampled_from([0, 1, -1, int(info.min),
                         int(info.max)]), st.integers(-2, 66)).map(lambda v: np.array(v).astype(dtype))
    return st.one_of(st.floats(width=32 if dtype == np.float32 else 64, allow_subnormal=True),
                     st.sampled_from([0.0, -0.0, 1.0, -1.0, 0.5, np.inf, -np.inf, np.nan, 65504.0, 1e-8])
                     ).map(lambda v: _rounded(v, dtype))


def _rounded(value: float, dtype) -> np.ndarray:
    with np.errstate(over="ignore"):  # (beyond float16's range: inf)
        return np.array(value, np.float64).astype(dtype)


def _primitives(x, y):
    """Every elementwise primitive that applies to the dtype of x and y, and every cast and bitcast of x."""
    dt = fnx.dtypes.to_dtype(x.dtype)
    # (fnx.numpy's forms: they reach ADD, MUL, MAX on bool too, which jax.lax's strict dtype rules refuse)
    out = [jnp.add(x, y), jnp.multiply(x, y), jnp.maximum(x, y), jnp.less(x, y), jnp.not_equal(x, y),
           jnp.where(x == y, x, y)]
    if not dt.is_float: out += [x & y, x | y, x ^ y]
    if dt.is_int: out += [lax.shift_left(x, y), lax.shift_right(x, y), lax.div(x, y), lax.rem(x, y)]
    if dt.is_float:
        out += [lax.div(x, y), lax.rem(x, y), lax.recip(x), lax.sqrt(x), lax.sin(x), lax.trunc(x)]
        if dt.itemsize == 2: out += [lax.exp2(x), lax.log2(x)]  # (wider ones become polynomials when lowered)
    out += [lax.convert_element_type(x, d) for d in DTYPES]
    if not dt.is_bool: out.append(lax.bitcast_convert_type(x, SAME_WIDTH[dt.itemsize]))
    return out


@given(st.sampled_from(DTYPES), st.data())
def test_every_primitive_on_every_dtype_is_exactly_the_oracles(x64, dtype, data):
    """Scalar ALU through numpy scalars and fnx.reference: bit for bit what interp computes (NaNs where it has
    them), on the corner cases of every dtype (the 64-bit ones and the casts to them: with x64 on)."""
    x, y = (np.array(data.draw(st.lists(_values(dtype), min_size=9, max_size=9)), dtype) for _ in range(2))
    with np.errstate(all="ignore"):
        expected = _on("interp", _primitives, x, y)
    got = _on("fake:0", _primitives, x, y, jit=True)
    for g, e in zip(got, expected):
        assert g.dtype == e.dtype
        np.testing.assert_array_equal(_bits(g), _bits(e))


def _bits(a):
    """Floats as their bits (so -0.0 and 0.0 differ), every NaN as one value."""
    if a.dtype.kind in "biu": return a
    bits = a.view(f"u{a.dtype.itemsize}").copy()
    bits[np.isnan(a.astype(np.float64))] = 1
    return bits


@pytest.mark.parametrize("dtype", [np.int8, np.int32, np.int64, np.uint8, np.uint32])
def test_integer_division_modulo_and_shifts(dtype):
    info = np.iinfo(dtype)
    a = np.array([7, -7, 7, -7, 0, 5, info.min, info.min, info.max, -1, 3, 100], dtype=np.int64)
    b = np.array([2, 2, -2, -2, 3, 0, -1, 1, 7, 5, -3, 0], dtype=np.int64)
    shifts = np.array([0, 1, 3, 7, 8, 31, 32, 63, 64, -1, 2, 5], dtype=np.int64)
    a, b, s = (v.astype(dtype) for v in (a, b, shifts))  # (wrapping for unsigned and narrow types, on purpose)
    _check(lambda x, y, z: (x // y, x % y, lax.div(x, y), lax.rem(x, y), x << z, x >> z,
                            x & y, x | y, x ^ y, x < y, x * y + x), a, b, s, rtol=0)


@pytest.mark.filterwarnings("ignore:overflow encountered in cast")  # (interp's float16 of 1e10: inf)
@pytest.mark.parametrize("dtype", [np.int8, np.int32, np.int64, np.uint8, np.uint16, np.uint64])
@pytest.mark.usefixtures("x64")  # (the casts through float64)
def test_float_to_int_casts_saturate_like_the_oracle(dtype):
    x = np.array([np.nan, np.inf, -np.inf, 1e10, -1e10, 3e38, -3e38, 2.0 ** 31, -(2.0 ** 31), 255.5, 256.0, -0.9,
                  127.9, -128.9, 1.5, -1.5], F32)
    got = _check(lambda v: (v.astype(dtype), v.astype(jnp.float16).astype(dtype),
                            v.astype(jnp.bfloat16).astype(dtype), v.astype(jnp.float64).astype(dtype)), x, rtol=0)
    assert got[0][0] == 0 and got[0][1] == np.iinfo(dtype).max and got[0][2] == np.iinfo(dtype).min


@pytest.mark.parametrize("dtype", [np.float16, ml_dtypes.bfloat16])
def test_16_bit_floats_round_every_op(dtype):
    x, y = (RNG.standard_normal((3, 8)).astype(dtype) for _ in range(2))
    got = _check(lambda a, b: (a * b + a, a / b, jnp.sqrt(jnp.abs(a)), jnp.maximum(a, b), a.astype(F32) + 1,
                               (a * 1000).astype(jnp.int16), jnp.exp(a)), x, y, rtol=0)
    step = (x.astype(F32) * y.astype(F32)).astype(dtype)  # numpy rounding after every op
    np.testing.assert_array_equal(got[0], (step.astype(F32) + x.astype(F32)).astype(dtype))
    # a 16-bit sum accumulates in float32 and rounds once (the order of the float32 additions may differ)
    sums = _on("fake:0", lambda a: (a.sum(axis=1), a.sum(axis=0)), x, jit=True)
    for s, axis in zip(sums, (1, 0)):
        assert s.dtype == np.dtype(dtype)
        np.testing.assert_allclose(s.astype(F32), x.astype(F32).sum(axis).astype(dtype).astype(F32), rtol=1e-2)


# ---- gather, scatter ----

def test_gather_and_scatter():
    x = RNG.standard_normal((6, 4)).astype(F32)
    idx = np.array([5, 0, 0, 3, -1, 2], np.int32)
    upd = RNG.standard_normal((6, 4)).astype(F32)
    _check(lambda v, i: (v[i], v[:, 1][i], jnp.take(v, i % 4, axis=1)), x, idx)
    _check(lambda v, i, u: (v.at[i].add(u), v.at[i].set(u), v.at[i].max(u), v.at[2].multiply(3.0)), x, idx, upd)


# ---- control flow: host items whose bodies compile for the fake device ----

def test_scan_and_while_loop_run_as_host_items():
    xs = RNG.standard_normal((5, 3)).astype(F32)

    def scanned(c, xs):
        return lax.scan(lambda carry, x: (carry * 0.5 + x, jnp.sin(carry) * x), c, xs)

    def looped(v):
        return lax.while_loop(lambda s: s[0] < 7, lambda s: (s[0] + 1, s[1] * 1.5 - 1), (jnp.int32(0), v))

    _check(scanned, np.ones(3, F32), xs)
    _check(looped, xs[0])
    assert "host " in _executable(scanned, np.ones(3, F32), xs).as_text("items")
    assert "host " in _executable(looped, xs[0]).as_text("items")


def test_jit_of_grad_of_an_mlp_loss():
    params = {"w1": RNG.standard_normal((6, 8)).astype(F32) * 0.5, "b1": np.zeros(8, F32),
              "w2": RNG.standard_normal((8, 3)).astype(F32) * 0.5, "b2": np.full(3, 0.1, F32)}
    x, onehot = RNG.standard_normal((4, 6)).astype(F32), np.eye(3, dtype=F32)[[0, 2, 1, 2]]
    fn = fnx.value_and_grad(mlp_loss)
    with fnx.default_device("interp"):
        expected = tree_util.tree_map(np.asarray, fn(params, x, onehot))
    with fnx.default_device("fake:0"):
        placed = fnx.device_put((params, x, onehot), "fake:0")
        got = tree_util.tree_map(np.asarray, fnx.jit(fn)(*placed))
    assert_tree_close(got, expected, rtol=1e-5, atol=1e-6)


# ---- copies: transfer items, through the host ----

def test_copies_between_devices(monkeypatch):
    """fake has no fast path (`transfer` is False): its copies go through copyout / copyin."""
    calls = []
    for method in ("copyin", "copyout"):
        original = getattr(fake_backend.FakeAllocator, method)
        monkeypatch.setattr(fake_backend.FakeAllocator, method, lambda self, *a, m=method, f=original: (
            calls.append((m, self.device)), f(self, *a))[1])
    x = np.arange(12, dtype=F32).reshape(3, 4)
    a = fnx.device_put(x, "fake:0")
    assert calls == [("copyin", "fake:0")]
    b = fnx.device_put(a, "fake:1")
    assert b.device.name == "fake:1" and calls[1:] == [("copyout", "fake:0"), ("copyin", "fake:1")]
    on_cpu = fnx.device_put(b, "cpu:0")  # (the cpu's fast path reads the host memory of b directly)
    c = fnx.device_put(on_cpu, "fake:0")
    assert on_cpu.device.name == "cpu:0" and c.device.name == "fake:0" and calls[-1] == ("copyin", "fake:0")
    np.testing.assert_array_equal(np.asarray(b), x)
    np.testing.assert_array_equal(np.asarray(c), x)

    def moved(v):
        return fnx.device_put(v * 2, "fake:1") + 1
    exe = _executable(moved, x)
    assert "copy buffer" in exe.as_text("items") and "(fake:0) -> buffer" in exe.as_text("items")
    launches = [item for item in exe.items if isinstance(item, Launch)]
    assert [item.device for item in launches] == ["fake:0", "fake:1"]  # each kernel on the device it writes
    assert [exe.programs[item.kernel].device for item in launches] == ["fake:0", "fake:1"]
    with fnx.default_device("fake:0"):
        out = fnx.jit(moved)(a)
    assert out.device.name == "fake:1"
    np.testing.assert_array_equal(np.asarray(out), x * 2 + 1)


def test_a_host_step_reads_an_input_of_another_device_through_that_devices_allocator(monkeypatch):
    read_by = []
    copyout = fake_backend.FakeAllocator.copyout
    monkeypatch.setattr(fake_backend.FakeAllocator, "copyout",
                        lambda self, src: (read_by.append((self.device, src.device)), copyout(self, src))[1])

    def looped(v):
        moved = fnx.device_put(v, "fake:1")
        return lax.while_loop(lambda s: s[0] < 3, lambda s: (s[0] + 1, s[1] * 2), (jnp.int32(0), moved))[1] + 1
    x = np.arange(3, dtype=F32)
    assert "host k" in _executable(looped, x).as_text("items")
    with fnx.default_device("fake:0"):
        out = fnx.jit(looped)(fnx.device_put(x, "fake:0"))
    np.testing.assert_array_equal(np.asarray(out), x * 8 + 1)
    assert ("fake:1", "fake:1") in read_by and all(mine == theirs for mine, theirs in read_by)


def test_mixing_devices_in_one_op_is_an_error():
    a, b = fnx.device_put(np.ones(3, F32), "fake:0"), fnx.device_put(np.ones(3, F32), "fake:1")
    with pytest.raises(ValueError, match="fake:0.*fake:1|fake:1.*fake:0"):
        a + b
    with pytest.raises(ValueError, match="fake:0.*fake:1|fake:1.*fake:0"):
        fnx.jit(lambda u, v: u * v)(a, b)


# ---- the pieces: compiler cache, launch dimensions, schedules, coverage ----

def test_the_compile_cache_is_content_addressed_on_disk(tmp_path):
    source = "def k(lo, hi):\n    return hi - lo\n"
    first = fake_backend.PythonCompiler(ObjectCache(str(tmp_path), "fake-test"))
    binary = first.compile(source)
    assert (first.cache.hits, first.cache.misses) == (0, 1)
    second = fake_backend.PythonCompiler(ObjectCache(str(tmp_path), "fake-test"))  # a cold in-memory state
    assert second.compile(source) == binary and (second.cache.hits, second.cache.misses) == (1, 0)
    other = fake_backend.PythonCompiler(ObjectCache(str(tmp_path), "fake-other-target"))
    other.compile(source)
    assert other.cache.misses == 1
    assert fake_backend.PythonProgram("k", binary)(dims=(2, 7)) is None


def test_a_second_process_compiles_nothing(tmp_path):
    script = textwrap.dedent("""
        import numpy as np, fnx, fnx.numpy as jnp, fake_backend
        with fnx.default_device("fake:0"):
            out = fnx.jit(lambda x: jnp.tanh(x) @ x.T)(jnp.ones((3, 4)))
        cache = fake_backend.compiler().cache
        print(cache.hits, cache.misses, float(np.asarray(out).sum()))
    """)
    tests = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = dict(os.environ, FNX_CACHE_DIR=str(tmp_path),
               PYTHONPATH=os.pathsep.join([tests, os.path.dirname(tests), os.environ.get("PYTHONPATH", "")]))
    runs = [subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=120)
            for _ in range(2)]
    for run in runs: assert run.returncode == 0, run.stderr
    (hits1, misses1, sum1), (hits2, misses2, sum2) = (run.stdout.split() for run in runs)
    assert int(misses1) > 0 and int(hits2) == int(misses1) + int(hits1) and int(misses2) == 0
    assert sum1 == sum2


def test_a_thread_split_kernel_runs_in_pieces_of_its_launch_dims():
    x = RNG.standard_normal((6, 5)).astype(F32)
    with fnx.default_device("fake:0"):
        fn = fnx.jit(lambda v: jnp.exp(v).sum(axis=1)).lower(x).traced.fn
    device = get_device("fake:0")
    with schedule_override(lambda kernel, target: [Opt("THREAD", 0)] if kernel.ranges else []):
        exe = device.executable(fn)
    (launch,) = [item for item in exe.items if isinstance(item, Launch)]
    assert launch.dims == (0, 6) and "rng(lo, hi)" in exe.source
    buffers = [device.allocator.from_numpy(x), device.allocator.alloc(fnx.dtypes.float32, 6)]
    program = exe.programs[launch.kernel]
    for dims in [(0, 2), (2, 5), (5, 6)]:
        program(*buffers, dims=dims)
    np.testing.assert_allclose(buffers[1].numpy((6,)), np.exp(x.astype(np.float64)).sum(1), rtol=1e-5)


PROGRAMS = {  # odd sizes, so vector lanes overhang the loops (masked loads and stores)
    "matmul": (lambda a, b: a @ b, (RNG.standard_normal((5, 8)).astype(F32), RNG.standard_normal((8, 6)).astype(F32))),
    "softmax": (lambda a, b: nn.softmax(a + b, axis=-1), (RNG.standard_normal((3, 9)).astype(F32),
                                                          RNG.standard_normal(9).astype(F32))),
    "col_max": (lambda a, b: jnp.max(a * b, axis=0), (RNG.standard_normal((7, 6)).astype(F32),
                                                      RNG.standard_normal((7, 6)).astype(F32))),
    "int_ops": (lambda a, b: (a * 3 + b) // 2 % 7 - (a > b) + (a >> 1), (
        RNG.integers(-50, 50, (5, 9)).astype(np.int32), RNG.integers(-5, 5, (5, 9)).astype(np.int32))),
    "float16": (lambda a, b: (jnp.maximum(a * b + 1, a).astype(F32).sum(axis=1), (a * b).max(axis=0)), (
        RNG.standard_normal((3, 11)).astype(np.float16), RNG.standard_normal((3, 11)).astype(np.float16))),
    "gather": (lambda a, b: a[(jnp.abs(b[:3, 0]) * 10).astype(jnp.int32) % 4, :] + b[:3], (
        RNG.standard_normal((4, 9)).astype(F32), RNG.standard_normal((5, 9)).astype(F32))),
    "scatter": (lambda a, b: a.at[(jnp.abs(b[:, 0]) * 3).astype(jnp.int32) % 4].add(b), (
        RNG.standard_normal((4, 9)).astype(F32), RNG.standard_normal((6, 9)).astype(F32))),
    "bools": (lambda a, b: jnp.where((a > 0) & (b < 0.5), a, -a).astype(jnp.int8) + (a > b), (
        RNG.standard_normal((3, 10)).astype(F32), RNG.random((3, 10)).astype(F32))),
}
ACTIONS = [Opt("VECTORIZE", -1, 4), Opt("VECTORIZE", -1, 3), Opt("VECTORIZE", 0, 4), Opt("VECTORIZE", 0, 3),
           Opt("UPCAST", 0, 2), Opt("UNROLL", -1, 2), Opt("SPLIT", 0, 2), Opt("SWAP", 0, 1), Opt("ACCUMULATE", -1),
           Opt("PACK", -2, 4)]


def _scheduled(name, choose):
    """Program `name` on fake:0 lowered with the actions `choose` picks, and the interp oracle's result."""
    fn_of, args = PROGRAMS[name]
    with fnx.default_device("fake:0"):
        fn = fnx.jit(fn_of).lower(*args).traced.fn
    device = get_device("fake:0")
    with schedule_override(choose):
        exe = device.executable(fn)  # compiled here, never from the executable cache
    outs = exe([device.allocator.from_numpy(a) for a in args])
    got = [b.numpy(o.shape) for b, o in zip(outs, fn.src[0].src)]
    expected = [np.asarray(v) for v in interp.run(fn, list(args))]
    for g, e in zip(got, expected):
        tol = (1e-2 if name == "float16" else 1e-5) if g.dtype.kind == "f" else 0
        np.testing.assert_allclose(g, e, rtol=tol, atol=tol)
    return exe.source


RENDERED = {  # every way the renderer writes an access or a reduction, as a pattern of the generated source
    "consecutive vector load": r"load_lanes\(b\d+, \(v\d+ \+ lane\)\)",
    "masked consecutive vector load": r"load_lanes\(b\d+, \(v\d+ \+ lane\), v\d+\)",
    "gather": r"load_lanes\(b\d+, v\d+\)", "masked gather": r"load_lanes\(b\d+, v\d+, v\d+\)",
    "consecutive vector store": r"store_lanes\(b\d+, \(v\d+ \+ lane\), v\d+\)",
    "masked consecutive vector store": r"store_lanes\(b\d+, \(v\d+ \+ lane\), v\d+, v\d+\)",
    "scatter": r"store_lanes\(b\d+, v\d+, v\d+\)", "masked scatter": r"store_lanes\(b\d+, v\d+, v\d+, v\d+\)",
    "gated scalar load": r"b\d+\[v\d+ if v\d+ else 0\]", "gated scalar store": r"if v\d+: b\d+\[v\d+\] = ",
    "vector accumulator": r"np\.full\(", "sum across lanes": r"np\.add\.reduce\(",
    "max across lanes": r"np\.maximum\.reduce\(", "16-bit accumulator": r"\.astype\(T\['float32'\]\)",
}


def test_each_schedule_action_matches_the_oracle():
    """Every action (vector lanes with masks, unrolled loops, tiles, accumulation, packing) on every program where
    it applies; the table is not vacuous: each action applies somewhere."""
    used, sources = set(), []
    for name in PROGRAMS:
        for action in ACTIONS:
            sources.append(_scheduled(name, one_action(action, used)))
    assert used == set(ACTIONS)
    source = "\n".join(sources)
    assert [what for what, pattern in RENDERED.items() if not re.search(pattern, source)] == []


@given(st.sampled_from(sorted(PROGRAMS)), st.data())
def test_random_schedules_match_the_oracle(name, data):
    applied = []
    _scheduled(name, random_schedule(lambda n: data.draw(st.integers(0, n - 1)), applied=applied))
    total = sum(len(opts) for _, opts in applied)
    event(f"{min(total, 3)}{'+' if total >= 3 else ''} actions applied")  # (--hypothesis-show-statistics)


def test_every_alu_op_has_a_rule_and_a_missing_one_is_named(monkeypatch):
    assert GroupOp.ALU <= set(fake_backend.code_for_op) | {Ops.CAST, Ops.BITCAST}
    with fnx.default_device("fake:0"):
        fn = fnx.jit(lambda v: jnp.sin(v) + 1).lower(np.linspace(0, 1, 5).astype(F32)).traced.fn
    monkeypatch.delitem(fake_backend.code_for_op, Ops.SIN)
    with pytest.raises(UnsupportedError, match="fake backend: no rule for SIN"):
        get_device("fake:0").executable(fn)  # (not the cached executable)


def test_a_jitted_function_moves_its_output_to_another_platform_but_computes_on_its_own():
    """A COPY to another platform may feed the outputs (a transfer item); kernels after it would be compiled for
    the wrong device, which is a clear error (kernels run on one platform per executable)."""
    x = RNG.standard_normal(7).astype(F32)
    moved = fnx.jit(lambda v: fnx.device_put(jnp.sin(v), "fake:1"))(jnp.asarray(x))
    assert moved.device.name == "fake:1"
    np.testing.assert_allclose(np.asarray(moved), np.sin(x.astype(np.float64)), rtol=1e-6)
    with pytest.raises(UnsupportedError, match=r"compiled for cpu:0 computes on fake:1 after a device_put"):
        fnx.jit(lambda v: fnx.device_put(jnp.sin(v), "fake:1") * 3)(jnp.asarray(x))
