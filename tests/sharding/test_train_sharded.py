"""examples/train_sharded.py, as users run it: on a 2x4 mesh of host devices in one process, and as two MPI
processes of four devices each; both must reproduce the single-device loss curve (the script checks it and exits
nonzero otherwise) with the loss falling."""
import importlib.util
import os
import pathlib
import re
import shutil
import subprocess
import sys

import pytest

MISSING = shutil.which("mpirun") is None or importlib.util.find_spec("mpi4py") is None
SCRIPT = pathlib.Path(__file__).parents[2] / "examples" / "train_sharded.py"
ARGS = ["--steps", "6", "--layers", "1", "--lr", "1e-2"]


def _check(run: subprocess.CompletedProcess) -> None:
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    gap = float(re.search(r"largest relative gap to the single-device run over \d+ steps: (\S+)", run.stdout)[1])
    assert gap < 1e-4
    losses = [float(v) for v in re.findall(r"loss (\d+\.\d+)", run.stdout)]
    assert losses[-1] < losses[0]


def test_on_a_2x4_mesh_in_one_process():
    env = dict(os.environ, FNX_CPU_DEVICES="8")
    _check(subprocess.run([sys.executable, str(SCRIPT), *ARGS], env=env, capture_output=True, text=True,
                          timeout=600))


@pytest.mark.skipif(MISSING, reason="needs mpirun and mpi4py (.ci/run installs them)")
def test_as_two_mpi_processes_of_four_devices():
    command = [shutil.which("mpirun"), "--allow-run-as-root", "--oversubscribe", "-n", "2", "-x", "FNX_CPU_DEVICES",
               sys.executable, str(SCRIPT), "--distributed", *ARGS]
    _check(subprocess.run(command, env=dict(os.environ, FNX_CPU_DEVICES="4"), capture_output=True, text=True,
                          timeout=600))
