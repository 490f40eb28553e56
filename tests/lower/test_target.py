"""The CPU Target: read from the host, overridden by FNX_CPU_TARGET (a name the host cannot run is an error), and
steering the heuristics (lanes, register blocks); the op suite under three targets against numpy in float64."""
import os
import subprocess
import sys

import pytest

import fnx
import fnx.numpy as jnp
from fnx.backends.cpu_target import LEVELS, host_target, named_target
from fnx.lower.optimize import heuristic_opts
from fnx.lower.pipeline import callify
from fnx.lower.rangeify import rangeify

HOST = host_target(3)
X86 = HOST.triple.startswith("x86_64")
HAS = {f[1:] for f in HOST.features.split(",") if f.startswith("+")}
x86_only = pytest.mark.skipif(not X86, reason="x86-64 levels and probes")


def _level(name: str):
    """The Target of psABI level `name` as if the host had every feature (for heuristics: never run here)."""
    return named_target(name, HOST, dict.fromkeys(LEVELS[name], True))


def test_host_target_is_read_from_the_machine():
    assert HOST.name and HOST.threads == 3 and HOST.cores >= 1
    assert HOST.l1_bytes > 0 and HOST.l2_bytes >= HOST.l1_bytes and HOST.l3_bytes >= 0
    if X86:
        want = 64 if "avx512f" in HAS else 32 if "avx" in HAS else 16
        assert (HOST.vector_bytes, HOST.vector_registers) == (want, 32 if want == 64 else 16)
        assert HOST.fma == ("fma" in HAS)
    assert HOST.vector_bytes in (16, 32, 64)
    assert host_target(3).key == HOST.key != host_target(4).key  # the thread count changes the code


@x86_only
@pytest.mark.parametrize("name, vector_bytes, registers, fma", [("x86-64-v2", 16, 16, False),
                                                                 ("x86-64-v3", 32, 16, True),
                                                                 ("x86-64-v4", 64, 32, True)])
def test_levels(name, vector_bytes, registers, fma):
    if any(f not in HAS for f in LEVELS[name]):
        with pytest.raises(ValueError, match=f"FNX_CPU_TARGET='{name}'.*lacks"):
            host_target(2, name)
        return
    target = host_target(2, name)
    assert (target.name, target.vector_bytes, target.vector_registers, target.fma) == (name, vector_bytes,
                                                                                        registers, fma)
    assert target.l2_bytes == HOST.l2_bytes and target.threads == 2  # the memory is the host's
    if name != "x86-64-v4": assert "avx512" not in target.features


@x86_only
def test_a_cpu_llvm_knows_is_probed():
    """znver3 (AVX2, FMA): its vector width read off the code LLVM emits for it; what the host lacks is turned off."""
    if "avx2" not in HAS or "fma" not in HAS: pytest.skip("the host cannot run AVX2 code")
    target = host_target(2, "znver3")
    assert (target.vector_bytes, target.vector_registers, target.fma) == (32, 16, True)
    lacks = {f for f in HOST.features.split(",") if f.startswith("-")}  # (sse4a, clzero, ... on an Intel host)
    assert lacks <= set(target.features.split(","))


def test_unknown_names_and_what_the_host_lacks_are_errors():
    with pytest.raises(ValueError, match="FNX_CPU_TARGET='no-such-cpu'"):
        host_target(2, "no-such-cpu")
    if not X86: return
    avx2_host = {f: True for f in LEVELS["x86-64-v3"]}
    with pytest.raises(ValueError, match="FNX_CPU_TARGET='x86-64-v4'.*avx512bw, avx512cd, avx512dq, avx512f"):
        named_target("x86-64-v4", HOST, avx2_host)
    with pytest.raises(ValueError, match="lacks fma"):
        named_target("x86-64-v3", HOST, {**avx2_host, "fma": False})


def _kernels(f, *shapes):
    fn = fnx.make_graph(f)(*[jnp.zeros(s, jnp.float32) for s in shapes]).fn
    return rangeify(callify(fn)).kernels


@x86_only
def test_lanes_follow_the_vector_width():
    (kernel,) = _kernels(lambda x: jnp.exp(x) * 2, (64, 100))
    for name, lanes in (("x86-64-v4", 16), ("x86-64-v3", 8), ("x86-64-v2", 4)):
        vectorize = [o for o in heuristic_opts(kernel, _level(name)) if o.op == "VECTORIZE"]
        assert vectorize and {o.amount for o in vectorize} == {lanes}, name


@x86_only
@pytest.mark.parametrize("shape", [(24, 40, 48), (520, 64, 128), (768, 640, 640), (1024, 1024, 1024), (96, 33, 10)])
def test_register_blocks_fit_the_registers(shape):
    """A matmul's block of accumulators (UPCAST rows x vectors per row), a row's B vectors and a broadcast of A fit
    the target's vector registers."""
    m, k, n = shape
    kernel = _kernels(lambda a, b: a @ b, (m, k), (k, n))[0]
    for name in ("x86-64-v3", "x86-64-v4"):
        target = _level(name)
        opts = heuristic_opts(kernel, target)
        lanes = max(o.amount for o in opts if o.op == "VECTORIZE")
        rows = max([o.amount for o in opts if o.op == "UPCAST"], default=1)
        vectors = -(-lanes * 4 // target.vector_bytes)
        assert rows * vectors + vectors + 1 <= target.vector_registers, (name, opts)


# ---- the op suite under two targets ----

OPS = r"""
import sys
import ml_dtypes, numpy as np
import fnx, fnx.numpy as jnp

rng = np.random.default_rng(0)
f32 = lambda *s: rng.standard_normal(s).astype(np.float32)  # noqa: E731
f64 = lambda *s: rng.standard_normal(s)  # noqa: E731
pos = lambda *s: (rng.random(s) + 0.1).astype(np.float32)  # noqa: E731
idx = rng.integers(0, 37, 300).astype(np.int32)
ints = rng.integers(-100, 100, (45, 77)).astype(np.int32)


def softmax(x):
    e = np.exp(x - x.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def matmul(a, b): return a @ b
def bf16(x): return x.astype(ml_dtypes.bfloat16).astype(np.float64)


def scatter_add(x, i, v):
    out = x.astype(np.float64).copy()
    np.add.at(out, i, v)
    return out


CASES = [  # (name, fnx function, numpy float64 reference, arguments, relative tolerance)
    ("exp_log1p", lambda x: jnp.exp(x) + jnp.log1p(jnp.abs(x)), lambda x: np.exp(x) + np.log1p(np.abs(x)),
     (f32(37, 101),), 2e-6),
    ("tanh_sin_sqrt", lambda x, y: jnp.tanh(x) * jnp.sin(y) + jnp.sqrt(y),
     lambda x, y: np.tanh(x) * np.sin(y) + np.sqrt(y), (f32(37, 101), pos(37, 101)), 4e-6),
    ("arctan2_power", lambda x, y: jnp.arctan2(x, y) + jnp.power(y, 1.7),
     lambda x, y: np.arctan2(x, y) + np.power(y, 1.7), (f32(13, 257), pos(13, 257)), 4e-6),
    ("f64_transcendental", lambda x: jnp.cos(x) * jnp.exp(x / 4), lambda x: np.cos(x) * np.exp(x / 4),
     (f64(29, 31),), 1e-12),
    ("sum_rows", lambda x: x.sum(axis=1), lambda x: x.sum(axis=1), (f32(123, 1001),), 1e-5),
    ("max_cols", lambda x: x.max(axis=0), lambda x: x.max(axis=0), (f32(1001, 37),), 0),
    ("mean_all", lambda x: x.mean(), lambda x: x.mean(), (f32(777, 1025),), 1e-5),
    ("argmax", lambda x: jnp.argmax(x, axis=1), lambda x: np.argmax(x, axis=1), (f32(33, 129),), 0),
    ("f64_sum", lambda x: x.sum(axis=0), lambda x: x.sum(axis=0), (f64(1000, 65),), 1e-12),
    ("matmul_odd", matmul, matmul, (f32(37, 129), f32(129, 67)), 1e-5),
    ("matmul_packed", matmul, matmul, (f32(520, 64), f32(64, 200)), 1e-5),
    ("matmul_kslabs", matmul, matmul, (f32(300, 700), f32(700, 520)), 1e-5),
    ("matmul_big", matmul, matmul, (f32(512, 1024), f32(1024, 1024)), 1e-5),
    ("matmul_bt_relu", lambda a, b: jnp.maximum(a @ b.T, 0), lambda a, b: np.maximum(a @ b.T, 0),
     (f32(97, 64), f32(130, 64)), 1e-5),
    ("narrow_product", lambda h, g: h.T @ g, lambda h, g: h.T @ g, (f32(40, 96), f32(40, 10)), 1e-5),
    ("transpose", lambda x: x.T + 1, lambda x: x.T + 1, (f32(64, 96),), 1e-7),  # (blocks shuffled in registers)
    ("matmul_bt_big", lambda a, b: a @ b.T, lambda a, b: a @ b.T, (f32(128, 96), f32(320, 96)), 1e-5),
    ("matmul_f64", matmul, matmul, (f64(65, 333), f64(333, 47)), 1e-12),
    ("matmul_f64_kslabs", matmul, matmul, (f64(96, 512), f64(512, 512)), 1e-12),
    ("matmul_int32", matmul, matmul, (ints[:33, :40], ints[:40, :17]), 0),
    ("matmul_bf16", lambda a, b: (a.astype(jnp.bfloat16) @ b.astype(jnp.bfloat16)).astype(jnp.float32),
     lambda a, b: bf16(a) @ bf16(b), (f32(40, 64), f32(64, 48)), 3e-2),
    ("softmax", lambda x: fnx.nn.softmax(x, axis=-1), softmax, (f32(64, 301),), 1e-5),
    ("layernorm", lambda x: (x - x.mean(-1, keepdims=True)) / jnp.sqrt(x.var(-1, keepdims=True) + 1e-5),
     lambda x: (x - x.mean(-1, keepdims=True)) / np.sqrt(x.var(-1, keepdims=True) + 1e-5), (f32(33, 513),), 1e-4),
    ("gather", lambda x, i: x[i] * 2, lambda x, i: x[i] * 2, (f32(37, 70), idx), 0),
    ("scatter_add", lambda x, i, v: x.at[i].add(v), scatter_add, (f32(37, 70), idx, f32(300, 70)), 1e-5),
    ("float16", lambda x, y: (x.astype(jnp.float16) * y.astype(jnp.float16) + 1).astype(jnp.float32),
     lambda x, y: x.astype(np.float16).astype(np.float64) * y.astype(np.float16) + 1,
     (f32(19, 333), f32(19, 333)), 4e-3),
    ("float16_sum", lambda x: x.astype(jnp.float16).astype(jnp.float32).sum(axis=1),
     lambda x: x.astype(np.float16).astype(np.float64).sum(axis=1), (f32(50, 370),), 1e-5),
    ("int_casts", lambda x: ((x * 10).astype(jnp.int32) // 3 % 7).astype(jnp.uint8) + jnp.uint8(250),
     lambda x: ((x.astype(np.float32) * np.float32(10)).astype(np.int32) // 3 % 7).astype(np.uint8) + np.uint8(250),
     (f32(45, 201),), 0),
    ("int8_ops", lambda x: ((x.astype(jnp.int8) * 3) >> 1) + (x > 0),
     lambda x: ((x.astype(np.int8) * 3) >> 1) + (x > 0), (ints.astype(np.float32),), 0),
]
bad = []
for name, f, ref, args, rtol in CASES:
    with fnx.enable_x64(any(a.dtype == np.float64 for a in args)):  # the f64 cases test float64
        got = np.asarray(fnx.jit(f)(*[jnp.asarray(a) for a in args]))
    want = ref(*[a.astype(np.float64) if a.dtype.kind == "f" else a for a in args])
    scale = max(1.0, float(np.max(np.abs(want))))  # (a sum's rounding error grows with its largest terms)
    if got.shape != want.shape or not np.allclose(got.astype(np.float64), want, rtol=rtol, atol=rtol * scale):
        bad.append(f"{name}: {np.max(np.abs(got - want)) if got.shape == want.shape else got.shape}")
text = fnx.jit(lambda x: x * 2 + 1).lower(jnp.zeros((64, 64), jnp.float32)).as_text("llvm")  # (one vector a step)
lanes = [n for n in (64, 32, 16, 8, 4) if f"load <{n} x float>" in text]
asm = fnx.jit(lambda a, b: jnp.exp(a @ b).sum(axis=1)).lower(jnp.asarray(f32(520, 64)), jnp.asarray(f32(64, 200)))
asm = asm.as_text("asm")
widest = 64 if "%zmm" in asm else 32 if "%ymm" in asm else 16  # the widest register the machine code uses
print(lanes[0] if lanes else 0, widest, "; ".join(bad) or "ok")
"""


@pytest.mark.parametrize("name", ["native", "x86-64-v3", "x86-64-v2"])
def test_op_suite_under_the_target(name):
    """Representative ops (transcendentals, reductions, matmuls of awkward sizes, softmax, gather/scatter, 16-bit
    floats, int casts) compiled for `name` in a fresh process, against numpy in float64."""
    target = HOST if name == "native" else None
    if target is None:
        try:
            target = host_target(2, name)
        except ValueError as e:
            pytest.skip(str(e))
    env = dict(os.environ, FNX_CPU_TARGET=name, FNX_CACHE_DIR="")
    done = subprocess.run([sys.executable, "-c", OPS], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    lanes, widest, verdict = done.stdout.split(maxsplit=2)
    assert verdict.strip() == "ok", verdict
    assert int(lanes) == max(4, target.vector_bytes // 4)  # the kernels were compiled for `name`
    assert int(widest) <= target.vector_bytes  # (so a host with just those registers runs them)


@x86_only
def test_b_is_packed_from_enough_register_blocks():
    """B is packed into panels once its matmul's rows make PACK_PASSES register blocks that each read all of B:
    256 rows are 43 blocks of AVX2's 6 rows (packed) but 32 of AVX-512's 8 (not); 512 rows are packed on both
    (what the packed product computes is checked in tests/lower/test_optimize.py)."""
    from fnx.lower.optimize import PACK_PASSES, _block_rows
    for rows in (256, 512):
        (kernel,) = _kernels(lambda a, b: a @ b, (rows, 784), (784, 512))
        for name in ("x86-64-v3", "x86-64-v4"):
            target = _level(name)
            packs = any(o.op == "PACK" for o in heuristic_opts(kernel, target))
            assert packs == (rows >= PACK_PASSES * _block_rows(target, 2)), (rows, name)
            assert packs == (rows == 512 or name == "x86-64-v3"), (rows, name)
