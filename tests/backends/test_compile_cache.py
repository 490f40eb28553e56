"""The on-disk compile cache (FNX_CACHE_DIR): a warm process loads machine code instead of running LLVM, a
damaged file is detected and recompiled, and an empty FNX_CACHE_DIR turns the cache off; a program's shared
library, linked as the process that compiled it exits, is opened by the next one, and a damaged or foreign one
is not."""
import json
import os
import subprocess
import sys

import numpy as np
import pytest

PROGRAM = """
import json
import numpy as np, fnx, fnx.numpy as jnp
from fnx.backends import cpu_llvm
f = fnx.jit(lambda x: jnp.tanh(x @ x.T).sum(-1))
x = np.arange(12, dtype=np.float32).reshape(3, 4) / 10
print(json.dumps(np.asarray(f(jnp.asarray(x))).tolist()))
cache = cpu_llvm._compiler().cache
print(cache.hits, cache.misses, cpu_llvm._compiler()._libraries.opened)
"""


# no C compiler: a warm process links the cached object code with MCJIT (with one, it opens the shared library
# that the process before linked at exit instead, and reads no object code: tested below)
NO_LIBRARIES = {"CC": "fnx-no-such-compiler"}


def run(cache_dir: str, libraries: bool = False) -> tuple[list, int, int] | tuple[list, int, int, int]:
    env = dict(os.environ, FNX_CACHE_DIR=cache_dir, **({} if libraries else NO_LIBRARIES))
    out = subprocess.run([sys.executable, "-c", PROGRAM], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    values, counts = out.stdout.strip().splitlines()[-2:]
    hits, misses, opened = map(int, counts.split())
    return (json.loads(values), hits, misses, opened) if libraries else (json.loads(values), hits, misses)


def test_warm_process_skips_llvm_and_gets_the_same_result(tmp_path):
    x = np.arange(12, dtype=np.float32).reshape(3, 4) / 10
    want = np.tanh(x @ x.T).sum(-1)
    cold, hits, misses = run(str(tmp_path))
    assert hits == 0 and misses >= 1
    warm, hits, misses = run(str(tmp_path))
    assert misses == 0 and hits >= 1
    np.testing.assert_allclose(cold, want, rtol=1e-5)
    assert warm == cold


def test_damaged_files_are_recompiled(tmp_path):
    cold, _, _ = run(str(tmp_path))
    for root, _, files in os.walk(tmp_path):
        for name in files:
            path = os.path.join(root, name)
            data = bytearray(open(path, "rb").read())
            data[-10] ^= 0xFF  # flip bits in the machine code: the digest no longer matches
            open(path, "wb").write(bytes(data))
    again, hits, misses = run(str(tmp_path))
    assert hits == 0 and misses >= 1 and again == cold


def test_empty_cache_dir_disables_the_cache(tmp_path):
    _, hits, misses = run("")
    _, hits2, misses2 = run("")
    assert hits == hits2 == 0 and misses2 == misses >= 1


OTHER_PROGRAM = """
import numpy as np, fnx, fnx.numpy as jnp
print(np.asarray(fnx.jit(lambda x: jnp.exp(x) * 3 - 1)(jnp.arange(5.0))).tolist())
"""


def test_a_valid_file_under_another_keys_name_is_recompiled(tmp_path):
    """Every entry carries its own key: another program's machine code copied over this one's (it segfaulted every
    later run) is ignored and recompiled."""
    other = tmp_path / "other"
    env = dict(os.environ, FNX_CACHE_DIR=str(other), **NO_LIBRARIES)
    donor_run = subprocess.run([sys.executable, "-c", OTHER_PROGRAM], env=env, capture_output=True, timeout=120)
    assert donor_run.returncode == 0
    donors = [os.path.join(r, n) for r, _, files in os.walk(other) for n in files if n.endswith(".o")]
    mine = tmp_path / "mine"
    cold, _, _ = run(str(mine))
    targets = [os.path.join(r, n) for r, _, files in os.walk(mine) for n in files if n.endswith(".o")]
    # (both programs compile the native workers' code: the same key, one file name, which stays a valid hit)
    shared = {os.path.basename(d) for d in donors} & {os.path.basename(t) for t in targets}
    donors = [d for d in donors if os.path.basename(d) not in shared]
    replaced = [t for t in targets if os.path.basename(t) not in shared]
    assert donors and replaced
    for i, path in enumerate(replaced):
        with open(donors[i % len(donors)], "rb") as f, open(path, "wb") as g: g.write(f.read())
    again, hits, misses = run(str(mine))
    assert hits == len(targets) - len(replaced) and misses == len(replaced) and again == cold
    warm, hits, misses = run(str(mine))  # and the recompiled entries are good again
    assert misses == 0 and warm == cold


def test_beam_entry_under_another_kernels_name_is_ignored(tmp_path, monkeypatch):
    from fnx.config import config
    from fnx.lower import search
    from fnx.lower.optimize import Opt
    monkeypatch.setattr(config, "cache_dir", str(tmp_path))
    search._store("a" * 64, [Opt("UPCAST", 0, 4)], 1e-3)
    assert search._load("a" * 64) == [Opt("UPCAST", 0, 4)]
    os.replace(search._cache_path("a" * 64), search._cache_path("b" * 64))
    assert search._load("b" * 64) is None


ASM_PROGRAM = """
import hashlib, numpy as np, fnx, fnx.numpy as jnp
from fnx.backends import cpu_llvm
f = fnx.jit(lambda x, w: jnp.tanh(x @ w + 1.0).sum(0))
x, w = np.ones((64, 48), np.float32) / 7, np.ones((48, 40), np.float32) / 5
lowered = f.lower(x, w)
asm = lowered.as_text("asm")
assert all(k.name in asm for k, lines in lowered.executable.lowering.kernels if lines is not None)
print(float(np.asarray(lowered.compile()(x, w)).sum()), hashlib.sha256(asm.encode()).hexdigest())
cache = cpu_llvm._compiler().cache
print(cache.hits, cache.misses)
"""


def test_warm_process_links_cached_code_and_shows_the_same_assembly(tmp_path):
    """A warm process links the cached object code without parsing its IR; asked for the assembly, it compiles
    the IR again and shows what the cold process compiled, and the results agree."""
    env = dict(os.environ, FNX_CACHE_DIR=str(tmp_path), **NO_LIBRARIES)
    outs = []
    for _ in range(2):
        out = subprocess.run([sys.executable, "-c", ASM_PROGRAM], env=env, capture_output=True, text=True, timeout=120)
        assert out.returncode == 0, out.stderr
        outs.append(out.stdout.split())
    (cold_sum, cold_asm, cold_hits, _), (warm_sum, warm_asm, warm_hits, warm_misses) = outs
    want = 40 * np.tanh(48 / 35 + 1.0) * 64
    assert abs(float(cold_sum) - want) < 1e-3 * want and cold_sum == warm_sum
    assert cold_hits == "0" and int(warm_hits) >= 1 and warm_misses == "0"
    assert warm_asm == cold_asm


# the shared-library tests need a C compiler driver; CI installs gcc and sets FNX_REQUIRE_CC=1, so there a missing
# one fails the run instead of skipping them
from fnx.backends.shared_libraries import _compiler  # noqa: E402

if _compiler() is None and os.environ.get("FNX_REQUIRE_CC") == "1":
    raise RuntimeError("FNX_REQUIRE_CC=1 but no C compiler (cc, gcc or clang) is on PATH: apt-get install gcc")
needs_cc = pytest.mark.skipif(_compiler() is None, reason="no C compiler to link shared libraries with")


def _libraries(directory) -> list[str]:
    return [os.path.join(r, n) for r, _, files in os.walk(directory) for n in files if n.endswith(".so")]


@needs_cc
def test_warm_process_opens_the_library_the_cold_one_linked_at_exit(tmp_path):
    """With a C compiler, the process that compiled a program links its modules into a shared library as it
    exits; the next process opens that library (no object code read, no MCJIT link) and computes the same."""
    x = np.arange(12, dtype=np.float32).reshape(3, 4) / 10
    cold, hits, misses, opened = run(str(tmp_path), libraries=True)
    assert hits == 0 and misses >= 1 and opened == 0
    assert len(_libraries(tmp_path)) == 1 and os.path.exists(_libraries(tmp_path)[0] + ".sha256")
    warm, hits, misses, opened = run(str(tmp_path), libraries=True)
    assert opened == 1 and misses == 0 and warm == cold
    np.testing.assert_allclose(cold, np.tanh(x @ x.T).sum(-1), rtol=1e-5)


@needs_cc
def test_a_damaged_or_foreign_library_is_not_opened(tmp_path):
    """A library whose bytes do not match its digest (damaged), or another program's library under this one's
    name, is not opened: the objects are linked with MCJIT and the result is the same."""
    cold, _, _, _ = run(str(tmp_path), libraries=True)
    path, = _libraries(tmp_path)
    data = bytearray(open(path, "rb").read())
    data[len(data) // 2] ^= 0xFF
    open(path, "wb").write(bytes(data))
    again, hits, misses, opened = run(str(tmp_path), libraries=True)
    assert opened == 0 and hits >= 1 and again == cold
    again, hits, misses, opened = run(str(tmp_path), libraries=True)  # (linked again as that process exited)
    assert opened == 1 and again == cold
    other = tmp_path / "other"
    env = dict(os.environ, FNX_CACHE_DIR=str(other))
    donor_run = subprocess.run([sys.executable, "-c", OTHER_PROGRAM], env=env, capture_output=True, timeout=120)
    assert donor_run.returncode == 0
    donor = _libraries(other)[0]
    for suffix in ("", ".sha256"):  # (the donor's library with its own, valid digest)
        with open(donor + suffix, "rb") as f, open(path + suffix, "wb") as g: g.write(f.read())
    again, hits, misses, opened = run(str(tmp_path), libraries=True)
    assert opened == 0 and hits >= 1 and again == cold


def test_no_library_is_made_without_a_c_compiler(tmp_path):
    cold, _, _ = run(str(tmp_path))
    warm, hits, misses = run(str(tmp_path))
    assert _libraries(tmp_path) == [] and hits >= 1 and misses == 0 and warm == cold
