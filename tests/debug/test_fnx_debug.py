"""FNX_DEBUG levels, checked in fresh processes (the variable is read once, at import)."""
import math
import os
import subprocess
import sys

import pytest

PROGRAM = """
import numpy as np, fnx, fnx.numpy as jnp
def scaled_tanh_sum(x):
    return jnp.tanh(x * 2).sum()
f = fnx.jit(scaled_tanh_sum)
x = jnp.asarray(np.ones(64, np.float32))
f(x)
print("result", float(f(x)))
"""


def run_with_debug(level: int, cache_dir: str = "") -> str:
    """The program's output at FNX_DEBUG=level, with `cache_dir` as its compile cache (none by default: the first
    call then lowers and compiles)."""
    env = dict(os.environ, FNX_DEBUG=str(level), FNX_CACHE_DIR=cache_dir)
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


def test_level_one_names_kernels_and_reports_compiles_and_cache_hits():
    """Level 1: each kernel named by the jitted function and what it computes, with its time, GB/s and GFLOP/s;
    the trace and compile of the function with their times; then a cache hit on the second call."""
    out = run_with_debug(1)
    kernels = [line for line in out.splitlines() if line.startswith("fnx: kernel scaled_tanh_sum:")]
    assert len(kernels) == 2, out                                   # one launch per call, two calls
    assert all("tanh" in line and "sum" in line and "GB/s" in line and "GFLOP/s" in line for line in kernels), out
    assert any(line.startswith("fnx: trace scaled_tanh_sum ") and line.endswith("ms") for line in out.splitlines())
    compile_line = next(line for line in out.splitlines() if line.startswith("fnx: compile scaled_tanh_sum on cpu"))
    assert "1 kernels" in compile_line and "compiled now:" in compile_line, compile_line
    assert out.count("fnx: jit scaled_tanh_sum: cache hit") == 1, out
    # where the first call's time goes: lowering by stage, and each LLVM module (compiled or from the disk cache)
    lower_line = next(line for line in out.splitlines() if line.startswith("fnx: lower scaled_tanh_sum "))
    assert all(f"{stage} " in lower_line for stage in ("callify", "rangeify", "optimize")), lower_line
    assert any(line.startswith("fnx: llvm scaled_tanh_sum: LLVM module") and "object_cache" in line
               for line in out.splitlines()), out


def test_a_warm_process_reports_the_lowering_cache(tmp_path):
    """With a compile cache, the second process reads the lowering and the object code instead of making them."""
    cold = run_with_debug(1, str(tmp_path))
    assert "from the lowering cache" not in cold and "fnx: lower scaled_tanh_sum " in cold
    warm = run_with_debug(1, str(tmp_path))
    lower_line = next(line for line in warm.splitlines() if line.startswith("fnx: lower scaled_tanh_sum "))
    assert "1 kernels from the lowering cache" in lower_line, warm
    compile_line = next(line for line in warm.splitlines() if line.startswith("fnx: compile scaled_tanh_sum on cpu"))
    assert "compiled now: 0" in compile_line, compile_line
    result = lambda out: float(next(line for line in out.splitlines() if line.startswith("result")).split()[1])  # noqa: E731
    assert result(warm) == result(cold)
