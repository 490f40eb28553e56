"""FNX_DEBUG levels, checked in fresh processes (the variable is read once, at import)."""
import math
import os
import subprocess
import sys

import pytest

PROGRAM = """
import numpy as np, fnx, fnx.numpy as jnp
f = fnx.jit(lambda x: jnp.tanh(x * 2).sum())
print("result", float(f(jnp.asarray(np.ones(64, np.float32)))))
"""


def run_with_debug(level: int) -> str:
    env = dict(os.environ, FNX_DEBUG=str(level))
    out = subprocess.run([sys.executable, "-c", PROGRAM], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    return out.stdout


@pytest.mark.parametrize("level", [0, 1, 2, 3, 4])
def test_debug_levels_add_detail(level):
    out = run_with_debug(level)
    result = float(next(line for line in out.splitlines() if line.startswith("result")).split()[1])
    assert abs(result - 64 * math.tanh(2.0)) < 1e-4
    assert ("fnx: kernel" in out) == (level >= 1)          # 1: each launch with its time
    assert ("loops=" in out) == (level >= 2)               # 2: kernel names and loop sizes
    assert ("--- rangeify ---" in out) == (level >= 3)     # 3: the IR after each lowering stage
    assert ("define void" in out) == (level >= 4)          # 4: the LLVM IR
