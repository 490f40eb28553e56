"""The README's main job as a user runs it: examples/train_mlp.py in a fresh process whose stdout is a pipe (what a
log keeps): one line per epoch, the loss falling, no progress-bar residue, and the final test accuracy the README
promises (>= 95%, which the script also enforces with its exit status)."""
import os
import re
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
EPOCH = re.compile(r"^epoch\s+(\d+)/(\d+)  loss (\d+\.\d+)  test acc (\d\.\d+)  \d+\.\d+ s$")


def test_main_job_prints_one_line_per_epoch_and_learns():
    out = subprocess.run([sys.executable, os.path.join(ROOT, "examples", "train_mlp.py"), "--epochs", "12"],
                         capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert out.returncode == 0, out.stdout + out.stderr  # (the script exits non-zero below 95% accuracy)
    lines = out.stdout.splitlines()
    epochs = [EPOCH.match(line) for line in lines if line.startswith("epoch")]
    assert len(epochs) == 12 and all(epochs), lines
    assert [int(m.group(1)) for m in epochs] == list(range(1, 13))
    losses = [float(m.group(3)) for m in epochs]
    assert losses[-1] < losses[0] / 5, losses                       # the loss falls
    final = lines[-1]
    assert final.startswith("final test accuracy ") and float(final.split()[3]) >= 0.95, final
    assert "\r" not in out.stdout and "it/s" not in out.stdout and "step/s" not in out.stdout  # no bar in a log
