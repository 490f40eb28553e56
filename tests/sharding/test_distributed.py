"""fnx.distributed: several processes under mpirun, each owning FNX_CPU_DEVICES cpu devices, with meshes and
collectives across them (docs/MPI.md).

The multi-process tests launch `mpirun -n 2` and `-n 4` on tests/sharding/mpi_program.py (every process checks its
shards against numpy and writes a report; the test compares the reports) and on tests/sharding/mpi_stalled.py (one
process stops taking part: the others must fail with DistributedError within FNX_DISTRIBUTED_TIMEOUT and mpirun must
exit nonzero). They are skipped, with the reason, only where mpirun or mpi4py is missing (.ci/run installs both).
"""
import importlib.util
import json
import os
import pathlib
import shutil
import subprocess
import sys
import time

import numpy as np
import pytest

import fnx
from fnx.sharding import NamedSharding, P, SingleDeviceSharding

HERE = pathlib.Path(__file__).parent
LOCAL = 2  # cpu devices per process
TIMEOUT = 3  # FNX_DISTRIBUTED_TIMEOUT of the stalled runs, in seconds
MPIRUN = shutil.which("mpirun")
MISSING = MPIRUN is None or importlib.util.find_spec("mpi4py") is None
# CI installs both and sets FNX_REQUIRE_MPI=1: there a missing one fails the run instead of skipping the tests
if MISSING and os.environ.get("FNX_REQUIRE_MPI") == "1":
    raise RuntimeError("FNX_REQUIRE_MPI=1 but mpirun or mpi4py is missing: the MPI tests cannot run")
needs_mpi = pytest.mark.skipif(MISSING, reason="needs OpenMPI's mpirun and mpi4py (apt-get install openmpi-bin "
                                               "libopenmpi-dev; pip install 'fnx[mpi]'); .ci/run installs them")

# the largest error each check of mpi_program.py may have (exact ones: integers, or the same order of additions)
TOLERANCE = {"jit sum over rows": 1e-5, "jit mean": 1e-6, "eager sum": 1e-5, "psum over b of (a, b)": 1e-5,
             "data-parallel loss": 1e-5, "data-parallel grad": 1e-5}


def mpirun(n: int, script: str, *args: str, timeout: float = 120, **env: str) -> subprocess.CompletedProcess:
    """`mpirun -n n python script args` with FNX_CPU_DEVICES=2 per process (as root where CI runs as root)."""
    environment = dict(os.environ, FNX_CPU_DEVICES=str(LOCAL), **env)
    exported = [flag for name in ("FNX_CPU_DEVICES", *env) for flag in ("-x", name)]
    command = [MPIRUN, "--allow-run-as-root", "--oversubscribe", "-n", str(n), *exported, sys.executable,
               str(HERE / script), *args]
    return subprocess.run(command, env=environment, capture_output=True, text=True, timeout=timeout)


@needs_mpi
@pytest.mark.parametrize("procs", [2, 4])
def test_a_program_over_several_processes(procs, tmp_path):
    run = mpirun(procs, "mpi_program.py", str(tmp_path))
    assert run.returncode == 0, run.stdout + run.stderr
    reports = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(procs)]
    names = [f"cpu:{i}" for i in range(procs * LOCAL)]
    for r, report in enumerate(reports):
        mine = names[r * LOCAL:(r + 1) * LOCAL]
        assert report["devices"] == names and report["local"] == mine and report["default"] == mine[0]
        assert report["owners"] == [i // LOCAL for i in range(procs * LOCAL)]
        assert report["addressable"] == [n in mine for n in names]
        assert report["count"] == [procs * LOCAL, LOCAL, procs] and report["bare cpu"] == mine[0]
        assert f"belongs to process {0 if r else 1}" in report["remote_error"]
        assert report["fully_addressable"] is False and "cannot be read in one process" in report["assemble_error"]
        assert "MPI started" in report["init_error"] and "only be called once" in report["twice_error"]
        for name, err in report["errors"].items():
            assert err <= TOLERANCE.get(name, 0.0), f"process {r}: {name} is off by {err}"
        assert set(report["errors"]) == set(reports[0]["errors"])  # every process ran every check
    assert {"psum", "all_to_all interleaved", "ppermute partial", "psum_scatter", "data-parallel grad",
            "psum float16 (added in float32)"} < set(reports[0]["errors"])
    for name in reports[0]["digests"]:  # the same bits on every device of every process
        bits = {h for report in reports for h in report["digests"][name].values()}
        assert len(bits) == 1, f"{name} differs between devices: {bits}"


@needs_mpi
@pytest.mark.parametrize("mode", ["sleep", "exit", "raise"])
def test_a_process_that_stops_fails_the_others_in_time(mode):
    start = time.monotonic()
    run = mpirun(4 if mode == "sleep" else 2, "mpi_stalled.py", mode, timeout=90,
                 FNX_DISTRIBUTED_TIMEOUT=str(TIMEOUT))
    took, output = time.monotonic() - start, run.stdout + run.stderr
    assert run.returncode != 0, output
    assert "was not stopped" not in output
    if mode == "raise":  # the uncaught exception aborts the job at once
        assert "KeyError: 'process 1 failed on purpose'" in output and "aborts the MPI job" in output
    else:
        assert "DistributedError" in output and f"waited {TIMEOUT} s (FNX_DISTRIBUTED_TIMEOUT)" in output, output
        who = "did not take part" if mode == "sleep" else "process 1 did not answer"  # (in a collective / greeting)
        assert who in output, output
    assert took < 60, f"mpirun took {took:.0f} s"


@needs_mpi
def test_processes_with_different_device_counts_are_an_error():
    script = str(HERE / "mpi_stalled.py")
    command = [MPIRUN, "--allow-run-as-root", "--oversubscribe", "-n", "1", "env", "FNX_CPU_DEVICES=1", sys.executable,
               script, "exit", ":", "-n", "1", "env", "FNX_CPU_DEVICES=2", sys.executable, script, "exit"]
    run = subprocess.run(command, capture_output=True, text=True, timeout=90)
    assert run.returncode != 0 and "different numbers of cpu devices (FNX_CPU_DEVICES per process: [1, 2])" in (
        run.stdout + run.stderr), run.stdout + run.stderr


def test_importing_fnx_does_not_import_mpi():
    code = "import sys, fnx; assert fnx.process_count() == 1 and 'mpi4py' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)


def test_one_process_owns_every_device(cpus):
    assert fnx.process_index() == 0 and fnx.process_count() == 1 and not fnx.distributed.is_initialized()
    assert fnx.local_devices() == cpus and fnx.local_device_count() == 8 == fnx.device_count()
    assert all(d.process_index == 0 and d.addressable for d in cpus)
    assert fnx.local_devices(process_index=1) == []


def test_initialize_after_fnx_ran_is_an_error(cpus):
    fnx.numpy.ones(2).block_until_ready()
    with pytest.raises(RuntimeError, match="must be called before fnx runs anything"):
        fnx.distributed.initialize()


def test_make_array_from_callback_on_one_process(mesh24):
    host = np.arange(8 * 6, dtype=np.int32).reshape(8, 6)
    asked = []

    def piece(index):
        asked.append(index)
        return host[index]
    x = fnx.make_array_from_callback(host.shape, NamedSharding(mesh24, P("data")), piece)
    assert x.sharding == NamedSharding(mesh24, P("data")) and x.dtype == np.int32
    np.testing.assert_array_equal(np.asarray(x), host)
    assert len(asked) == 2  # once per distinct slice, not once per device
    for shard in x.addressable_shards: np.testing.assert_array_equal(np.asarray(shard.data), host[shard.index])
    one = fnx.make_array_from_callback((3,), SingleDeviceSharding(mesh24.flat_devices[5]), lambda i: np.ones(3))
    assert one.device.name == "cpu:5" and np.asarray(one).tolist() == [1.0, 1.0, 1.0]
    with pytest.raises(ValueError, match="has shape"):
        fnx.make_array_from_callback(host.shape, NamedSharding(mesh24, P("data")), lambda index: host)
