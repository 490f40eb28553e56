"""The lowering cache (fnx/backends/lowering_cache.py): a warm process reads what lowering produced instead of
lowering again, gets the same results as the cold one and as numpy in float64, and a damaged entry is ignored.
The round trip through the encoding gives back the very same (hash-consed) kernel graphs."""
import glob
import json
import os
import struct
import subprocess
import sys

import numpy as np
import pytest

import fnx
import fnx.numpy as jnp
from fnx.backends.cpu_target import host_target
from fnx.backends.lowering_cache import LoweringCache, Uncacheable, _decode_arg, _Nodes, decode, encode

PROGRAM = """
import json, sys
import numpy as np, fnx, fnx.numpy as jnp
rng = np.random.default_rng(0)
x = rng.standard_normal((1100, 1024)).astype(np.float32)
ws = [rng.standard_normal((64, 64)).astype(np.float32) * 0.1 for _ in range(3)]

def chain(x):  # row chains (thread-split layernorm steps) and, below, shared kernels and packed operands
    for _ in range(3):
        m = x.mean(-1, keepdims=True)
        x = x + 0.5 * (x - m) / jnp.sqrt(((x - m) ** 2).mean(-1, keepdims=True) + 1e-5)
    return x[:, :8]

def layers(ws, h):
    for w in ws: h = h + jnp.tanh(h @ w) * 0.5
    return (h ** 2).mean()

results, hits = [], []
for f, args in ((chain, (x,)), (fnx.value_and_grad(layers), (ws, x[:600, :64]))):
    jf = fnx.jit(f)
    out = jf(*[jnp.asarray(a) if isinstance(a, np.ndarray) else [jnp.asarray(w) for w in a] for a in args])
    results.append(np.asarray(fnx.tree_util.tree_leaves(out)[-1] if isinstance(out, tuple) else out).tolist())
    lowering = jf.lower(*[jnp.asarray(a) if isinstance(a, np.ndarray) else [jnp.asarray(w) for w in a]
                          for a in args]).executable.lowering
    hits.append(lowering.callified is None)  # (read from the cache: callify was never run)
    assert lowering.fn is not None  # (and is made when asked for)
print(json.dumps([results, hits]))
"""


def run(cache_dir: str):
    env = dict(os.environ, FNX_CACHE_DIR=cache_dir)
    out = subprocess.run([sys.executable, "-c", PROGRAM], env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def _numpy_chain():
    x = np.random.default_rng(0).standard_normal((1100, 1024)).astype(np.float32).astype(np.float64)
    for _ in range(3):
        m = x.mean(-1, keepdims=True)
        x = x + 0.5 * (x - m) / np.sqrt(((x - m) ** 2).mean(-1, keepdims=True) + 1e-5)
    return x[:, :8]


def test_warm_process_reads_the_lowering_and_gets_the_same_results(tmp_path):
    cold, cold_hits = run(str(tmp_path))
    assert cold_hits == [False, False]
    assert glob.glob(str(tmp_path / "*" / "*.lowering"))
    warm, warm_hits = run(str(tmp_path))
    assert warm_hits == [True, True]
    assert warm == cold
    np.testing.assert_allclose(np.asarray(warm[0]), _numpy_chain(), rtol=2e-5, atol=2e-5)


def test_a_damaged_entry_is_ignored(tmp_path):
    cold, _ = run(str(tmp_path))
    for path in glob.glob(str(tmp_path / "*" / "*.lowering")):
        data = bytearray(open(path, "rb").read())
        data[len(data) // 2] ^= 0xFF
        open(path, "wb").write(bytes(data))
    again, hits = run(str(tmp_path))
    assert hits == [False, False] and again == cold


def test_an_entry_that_fails_to_decode_after_its_modules_were_linked_is_lowered_again(tmp_path, monkeypatch):
    """The CPU backend links an entry's modules while its kernels decode; when decoding then fails, the process
    lowers the function itself and gets the right answer."""
    from fnx.backends import lowering_cache
    from fnx.config import config
    monkeypatch.setattr(config, "cache_dir", str(tmp_path))
    x = np.random.default_rng(2).standard_normal((300, 64)).astype(np.float32)
    f = lambda x: jnp.tanh(x @ x.T).sum(axis=1)  # noqa: E731
    want = np.tanh(x.astype(np.float64) @ x.T.astype(np.float64)).sum(axis=1)
    np.testing.assert_allclose(np.asarray(fnx.jit(f)(x)), want, rtol=1e-4, atol=1e-4)
    fnx.clear_caches()
    linked = []

    def broken(d, graphs):
        assert linked, "the modules are handed over before the kernels are decoded"
        raise ValueError("a damaged kernel")
    original = lowering_cache.decode
    monkeypatch.setattr(lowering_cache, "_decode_kernel", broken)
    monkeypatch.setattr(lowering_cache, "decode", lambda blob, fn, first=None: original(
        blob, fn, lambda modules: (linked.append(modules), first(modules))))
    np.testing.assert_allclose(np.asarray(fnx.jit(f)(x)), want, rtol=1e-4, atol=1e-4)
    assert linked and linked[0], "the entry was found and its modules linked"


def _lowering(f, *args):
    return fnx.jit(f).lower(*args).executable


def test_the_round_trip_gives_back_the_same_kernels():
    x = jnp.asarray(np.random.default_rng(1).standard_normal((1100, 1024)).astype(np.float32))

    def f(x):
        for _ in range(3):
            m = x.mean(-1, keepdims=True)
            x = x + 0.5 * (x - m) / jnp.sqrt(((x - m) ** 2).mean(-1, keepdims=True) + 1e-5)
        return jnp.exp(x[:, :64]) @ x[:64, :64]
    exe = _lowering(f, x)
    lowering = exe.lowering
    assert lowering.chains  # (the round trip covers a chain, a PACK and a transcendental)
    back, modules = decode(encode(lowering, [(["k0"], "source text")]), exe.fn)
    assert modules == [(["k0"], "source text")]
    assert len(back.kernels) == len(lowering.kernels)
    for (k, lines), (k2, lines2) in zip(lowering.kernels, back.kernels):
        assert k2.sink is k.sink and k2.args == k.args and k2.ranges == k.ranges and k2.opts == k.opts
        assert (k2.name, k2.code, k2.thread_range, k2.lanes, k2.row_ranges, k2.work) == \
            (k.name, k.code, k.thread_range, k.lanes, k.row_ranges, k.work)
        assert lines2 == lines
    assert back.schedule.buffers == lowering.schedule.buffers and back.schedule.outputs == lowering.schedule.outputs
    assert back.memory == lowering.memory
    for c, c2 in zip(lowering.chains, back.chains):
        assert (c2.name, c2.first, c2.rows, c2.block, c2.step, c2.args, c2.scratch) == \
            (c.name, c.first, c.rows, c.block, c.step, c.args, c.scratch)
        assert [m.name for m in c2.members] == [m.name for m in c.members]
    assert back.as_text("rangeify") == lowering.as_text("rangeify")
    assert back.as_text("callify") == lowering.as_text("callify")


def test_keys_and_entries_keep_every_bit_of_a_float_constant(tmp_path, monkeypatch):
    # float.hex() writes each NaN as "nan": programs that differ in a NaN's sign shared a key, and a cached -nan
    # constant came back as +nan (a bitcast of it, as a sort's keys, changes sign)
    monkeypatch.setattr(fnx.config.config, "cache_dir", str(tmp_path))
    x = jnp.asarray(np.array([1.0, np.nan, -0.0, 2.0], np.float32))
    keys = set()
    for nan in (np.nan, -np.nan):
        for zero in (0.0, -0.0):
            exe = _lowering(lambda v, nan=nan, zero=zero: jnp.where(jnp.isnan(v), nan, jnp.where(v == 1.0, zero, v)), x)
            keys.add(LoweringCache(host_target(1), "test").key(exe.fn))
    assert len(keys) == 4 and None not in keys
    for value in (-np.nan, np.nan, -0.0, 0.0, 1e-310, float.fromhex("0x1.fffffffffffffp+1023")):
        back = _decode_arg(_Nodes().arg(value), [])
        assert struct.pack("<d", back) == struct.pack("<d", value)


def test_a_warm_lowering_decodes_kernel_graphs_only_when_asked(tmp_path, monkeypatch):
    """Running a program read from the cache needs no kernel graph (its object code is cached): the node table is
    decoded the first time something asks for a graph (as_text, a profiler's loops), once, from several threads
    at once, and then gives the cold lowering's very graphs."""
    import threading
    from fnx.backends import lowering_cache
    from fnx.config import config
    monkeypatch.setattr(config, "cache_dir", str(tmp_path))
    x = np.random.default_rng(3).standard_normal((200, 48)).astype(np.float32)
    f = lambda x: jnp.tanh(x @ x.T).sum(axis=1) / jnp.sqrt((x * x).sum())  # noqa: E731
    want = np.tanh(x.astype(np.float64) @ x.T) .sum(axis=1) / np.sqrt((x.astype(np.float64) ** 2).sum())
    cold = fnx.jit(f).lower(x).executable.lowering
    cold_text = cold.as_text("linearize")
    fnx.clear_caches()
    decoded = []
    original = lowering_cache._decode_nodes
    monkeypatch.setattr(lowering_cache, "_decode_nodes", lambda rows: decoded.append(1) or original(rows))
    jf = fnx.jit(f)
    np.testing.assert_allclose(np.asarray(jf(x)), want, rtol=1e-4, atol=1e-4)
    warm = jf.lower(x).executable.lowering
    assert warm.callified is None and not decoded  # (from the cache, and run without a graph)
    texts = []
    threads = [threading.Thread(target=lambda: texts.append(warm.as_text("linearize"))) for _ in range(4)]
    for t in threads: t.start()
    for t in threads: t.join()
    assert texts == [cold_text] * 4 and decoded == [1]
    for (k, lines), (k2, lines2) in zip(cold.kernels, warm.kernels):
        assert k2.sink is k.sink and k2.ranges == k.ranges and lines2 == lines and k2.lanes == k.lanes
        assert (k2.work, k2.thread_size, k2.output) == (k.work, k.thread_size, k.output)


def test_host_steps_are_not_cached():
    f = lambda x: fnx.lax.while_loop(lambda c: c[0] < 3, lambda c: (c[0] + 1, c[1] @ c[1]), (0, x))[1]  # noqa: E731
    exe = _lowering(f, jnp.asarray(np.eye(300, dtype=np.float32)))
    with pytest.raises(Uncacheable):
        encode(exe.lowering, [])


def test_the_source_digest_is_kept_under_the_files_stats(tmp_path, monkeypatch):
    """fnx's source hash (part of every entry's key) is read back from the cache directory while no source file's
    path, size or modification time changed, recomputed from the contents when one does or when the kept file is
    damaged; it is always the hash of the contents."""
    from fnx.backends import lowering_cache as lc
    monkeypatch.setattr(lc, "_fnx_digest", [])
    full = lc._fnx_source_digest(None)
    monkeypatch.setattr(lc, "_fnx_digest", [])
    assert lc._fnx_source_digest(str(tmp_path)) == full
    (kept,) = glob.glob(str(tmp_path / "fnx-source" / "*"))
    assert open(kept).read() == full
    open(kept, "w").write("f" * 64)  # (what the file says is what a process with these stats uses)
    monkeypatch.setattr(lc, "_fnx_digest", [])
    assert lc._fnx_source_digest(str(tmp_path)) == "f" * 64
    for damaged in (b"damaged", b"\x9a" * 64, b"g" * 64):
        open(kept, "wb").write(damaged)
        monkeypatch.setattr(lc, "_fnx_digest", [])
        assert lc._fnx_source_digest(str(tmp_path)) == full
    source = lc.__file__
    st = os.stat(source)
    try:
        os.utime(source, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000_000))
        monkeypatch.setattr(lc, "_fnx_digest", [])
        assert lc._fnx_source_digest(str(tmp_path)) == full
        assert len(glob.glob(str(tmp_path / "fnx-source" / "*"))) == 2  # (kept anew under the new stats)
    finally:
        os.utime(source, ns=(st.st_atime_ns, st.st_mtime_ns))
