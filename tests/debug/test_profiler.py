"""fnx.profiler: the trace file is loaded back and its events checked against what the program did (which kernels
the executable launches, their FLOPs from the shapes, the bytes of a copy, the threads that ran them)."""
import glob
import gzip
import json
import os
import subprocess
import sys
import threading

import numpy as np
import pytest

import fnx
import fnx.numpy as jnp
from fnx import events
from fnx.backends.device import Launch


def load_trace(log_dir) -> list[dict]:
    paths = glob.glob(os.path.join(str(log_dir), "plugins", "profile", "*", "*.trace.json.gz"))
    assert len(paths) == 1, paths
    with gzip.open(paths[0], "rt") as f:
        return json.load(f)["traceEvents"]


def matmul_tanh(a, b):
    return jnp.tanh(a @ b)


@pytest.fixture(params=[d for d in ("cpu", "opencl") if d in os.environ.get("FNX_TEST_DEVICES", "cpu,opencl")])
def compiled_device(request):
    """The devices that compile kernels (interp runs graphs with numpy: no kernels to report)."""
    from tests.conftest import DEVICES
    if request.param not in DEVICES: pytest.skip(f"{request.param} is not among this run's devices {DEVICES}")
    return f"{request.param}:0"


def test_trace_records_tracing_compiling_and_every_kernel_launch(tmp_path, compiled_device):
    a = np.random.default_rng(0).standard_normal((64, 32)).astype(np.float32)
    b = np.random.default_rng(1).standard_normal((32, 16)).astype(np.float32)
    f = fnx.jit(matmul_tanh, device=compiled_device)
    with fnx.profiler.trace(tmp_path):
        first = f(a, b)
        second = f(a, b)
        np.testing.assert_allclose(np.asarray(second), np.tanh(a.astype(np.float64) @ b), rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(np.asarray(first), np.asarray(second))
    trace = load_trace(tmp_path)
    by_cat = lambda cat: [e for e in trace if e.get("cat") == cat]  # noqa: E731
    assert [e["name"] for e in by_cat("trace")] == ["matmul_tanh"]
    compiles = by_cat("compile")
    assert [e["name"] for e in compiles] == [f"matmul_tanh on {compiled_device}"] and compiles[0]["dur"] > 0
    assert by_cat("lower") and by_cat("lower")[0]["args"]["kernels"] >= 1
    launches = [item.kernel for item in f.lower(a, b).executable.items if isinstance(item, Launch)]
    kernels = by_cat("kernel")
    assert [e["name"] for e in kernels] == [f"matmul_tanh:{k}" for k in launches] * 2  # every launch, in order
    assert len(set(launches)) == len(launches)                                            # unique names
    dot = [e for e in kernels if "dot" in e["name"]]
    assert dot and all(e["args"]["flops"] >= 2 * 64 * 16 * 32 for e in dot)  # a matmul's multiply-adds, at least
    assert all(e["args"]["device"] == compiled_device and e["args"]["bytes"] > 0 and e["dur"] > 0 for e in kernels)
    assert all(e["args"]["GB/s"] > 0 for e in kernels)
    hits = [e for e in by_cat("cache") if e["name"] == "jit matmul_tanh: cache hit"]
    assert len(hits) == 1 and hits[0]["ph"] == "i"
    assert not events.active  # nothing listens once the trace is written


def test_events_are_recorded_per_thread(tmp_path):
    f = fnx.jit(lambda x: jnp.sin(x) * 2)
    x = np.linspace(-3, 3, 1000, dtype=np.float32)
    expected = np.sin(x.astype(np.float64)) * 2
    f(x)  # compiled before the threads start
    results, errors = {}, []

    def work(i: int) -> None:
        try:
            for _ in range(5): results[i] = np.asarray(f(x + i))
        except Exception as err:  # pragma: no cover - reported below
            errors.append(err)
    with fnx.profiler.trace(tmp_path):
        threads = [threading.Thread(target=work, args=(i,), name=f"worker-{i}") for i in range(4)]
        for t in threads: t.start()
        for t in threads: t.join()
    assert not errors
    for i in range(4):
        np.testing.assert_allclose(results[i], np.sin(x.astype(np.float64) + i) * 2, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(np.asarray(f(x)), expected, rtol=1e-5, atol=1e-5)
    trace = load_trace(tmp_path)
    kernels = [e for e in trace if e.get("cat") == "kernel"]
    assert len(kernels) == 4 * 5
    names = {e["args"]["name"] for e in trace if e["ph"] == "M" and e["name"] == "thread_name"}
    tids = {e["tid"] for e in kernels}
    assert len(tids) >= 2 and {f"worker-{i}" for i in range(4)} <= names


def test_transfers_and_user_annotations(tmp_path):
    host = np.arange(1000, dtype=np.float32)

    @fnx.profiler.annotate_function
    def load_batch():
        return fnx.device_put(host)
    with fnx.profiler.trace(tmp_path):
        for step in range(2):
            with fnx.profiler.StepTraceAnnotation("train", step_num=step):
                x = load_batch()
    np.testing.assert_array_equal(np.asarray(x), host)
    trace = load_trace(tmp_path)
    transfers = [e for e in trace if e.get("cat") == "transfer"]
    assert len(transfers) == 2 and all(e["args"]["bytes"] == host.nbytes for e in transfers)
    user = [e["name"] for e in trace if e.get("cat") == "user"]
    assert sorted(user) == sorted(["train 0", "train 1"] + ["test_transfers_and_user_annotations.<locals>."
                                                             "load_batch"] * 2)
    step0 = next(e for e in trace if e["name"] == "train 0")
    inner = [e for e in transfers if step0["ts"] <= e["ts"] <= step0["ts"] + step0["dur"]]
    assert len(inner) == 1  # the transfer of step 0 lies inside step 0's span


def test_start_and_stop_errors(tmp_path):
    with pytest.raises(RuntimeError, match="no trace is running"):
        fnx.profiler.stop_trace()
    fnx.profiler.start_trace(tmp_path)
    try:
        with pytest.raises(RuntimeError, match="already running"):
            fnx.profiler.start_trace(tmp_path)
    finally:
        path = fnx.profiler.stop_trace()
    assert os.path.isfile(path) and path.endswith(".trace.json.gz")
    with pytest.raises(NotImplementedError, match="perfetto"):
        fnx.profiler.start_trace(tmp_path, create_perfetto_link=True)
    assert not events.active


def test_a_trace_survives_an_error_in_the_block(tmp_path):
    with pytest.raises(ValueError):
        with fnx.profiler.trace(tmp_path):
            fnx.jit(lambda x: x + 1)(np.ones(3, np.float32))
            raise ValueError("user code failed")
    assert any(e.get("cat") == "kernel" for e in load_trace(tmp_path))
    assert not events.active


PROGRAM = """
import os, sys, glob, gzip, json
import numpy as np, fnx, fnx.numpy as jnp
from fnx.sharding import Mesh, PartitionSpec as P
mesh = Mesh(np.array(fnx.devices()).reshape(4), ("i",))
f = fnx.jit(fnx.shard_map(lambda x: fnx.lax.psum(x, "i"), mesh=mesh, in_specs=P("i"), out_specs=P()))
x = np.arange(16, dtype=np.float32)
on0 = fnx.device_put(x, fnx.devices()[0])
with fnx.profiler.trace(sys.argv[1]):
    out = np.asarray(f(x))
    on1 = fnx.device_put(on0, fnx.devices()[1])
expected = x.reshape(4, 4).sum(0)
assert np.allclose(out, expected), (out, expected)
assert np.array_equal(np.asarray(on1), x) and on1.devices() == {fnx.devices()[1]}
path, = glob.glob(os.path.join(sys.argv[1], "plugins", "profile", "*", "*.trace.json.gz"))
events = json.load(gzip.open(path, "rt"))["traceEvents"]
print(json.dumps([e for e in events if e.get("cat") in ("collective", "transfer")]))
"""


def test_collectives_and_copies_between_devices_are_recorded(tmp_path):
    env = dict(os.environ, FNX_CPU_DEVICES="4")
    out = subprocess.run([sys.executable, "-c", PROGRAM, str(tmp_path)], env=env, capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0, out.stderr
    recorded = json.loads(out.stdout.strip().splitlines()[-1])
    copies = [e for e in recorded if e["cat"] == "transfer" and e["name"].startswith("eager:")]  # device_put's
    assert [(e["args"]["src"], e["args"]["dst"], e["args"]["bytes"]) for e in copies] == [("cpu:0", "cpu:1", 64)]
    inside = [e for e in recorded if e["cat"] == "transfer" and e["name"].startswith("psum:")]  # the psum's own
    assert inside and all(e["args"]["bytes"] == 16 for e in inside)
    collectives = [e for e in recorded if e["cat"] == "collective"]
    assert collectives, out.stdout
    assert all(e["name"].startswith("psum over 'i'") and e["args"]["devices"] == 4 for e in collectives)
    assert all(e["args"]["bytes"] == 4 * 4 * 4 for e in collectives)  # four devices' f32[4] pieces
