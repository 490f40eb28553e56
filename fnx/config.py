"""Every environment variable fnx reads, read once here and passed down from here."""
from __future__ import annotations

import os
from dataclasses import dataclass


@dataclass
class Config:
    device: str            # FNX_DEVICE: the default device ('cpu', 'interp', ...)
    debug: int             # FNX_DEBUG: 1 launches+times, 2 kernel names+shapes, 3 IR per stage, 4 LLVM IR
    cpu_threads: int       # FNX_CPU_THREADS: worker threads for CPU kernels (shared among the cpu devices)
    cache_dir: str | None  # FNX_CACHE_DIR: persistent compile cache ('' disables)
    beam: int = 0          # FNX_BEAM: width of the schedule search timed on the device (0: hand heuristics)
    executables: int = 512  # FNX_EXECUTABLES: compiled graphs kept for reuse (least recently used ones go first)
    cpu_devices: int = 1   # FNX_CPU_DEVICES: how many cpu devices (cpu:0..N-1) the host is split into
    cpu_target: str = "native"  # FNX_CPU_TARGET: the LLVM CPU to compile for: 'native' (the host), 'x86-64-v3'
                                # (AVX2), 'x86-64-v4' (AVX-512), 'x86-64-v2', or a name like 'znver4'
    distributed_timeout: float = 300.0  # FNX_DISTRIBUTED_TIMEOUT: seconds a process waits for the others in one
                                        # exchange of fnx.distributed before it raises DistributedError
    cuda_arch: str = "sm_90"  # FNX_CUDA_ARCH: the GPU a compile-only cuda device (no GPU present) compiles for
    explain_cache_misses: bool = False  # FNX_EXPLAIN_RETRACE: log why each jit retrace happened (what changed)
    enable_x64: bool = False  # FNX_ENABLE_X64 / JAX_ENABLE_X64: 64-bit types on (JAX's jax_enable_x64; off as in JAX)
    debug_nans: bool = False  # FNX_DEBUG_NANS / JAX_DEBUG_NANS: a NaN in a float result is a FloatingPointError
    debug_infs: bool = False  # FNX_DEBUG_INFS / JAX_DEBUG_INFS: so is an infinity


def _positive(name: str, default: str) -> int:
    text = os.environ.get(name, default) or default
    if not text.isdigit() or int(text) < 1: raise ValueError(f"{name}={text!r}: expected a positive integer")
    return int(text)


def _seconds(name: str, default: str) -> float:
    text = os.environ.get(name, default) or default
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not value > 0: raise ValueError(f"{name}={text!r}: expected a positive number of seconds")
    return value


def _flag(*names: str) -> bool:
    """An on/off environment variable (the first of `names` that is set): 1/true/yes/on or 0/false/no/off/''."""
    for name in names:
        text = os.environ.get(name)
        if text is None: continue
        if text.strip().lower() in ("1", "true", "yes", "on"): return True
        if text.strip().lower() in ("0", "false", "no", "off", ""): return False
        raise ValueError(f"{name}={text!r}: expected 1/true or 0/false")
    return False


def usable_cpus() -> int:
    """The CPUs this process may run on (`taskset`, a container's cpuset), not all the machine's: a worker thread
    beyond them shares a core with the caller, and every chunk handed to it waits for a time slice."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def _read() -> Config:
    cache = os.environ.get("FNX_CACHE_DIR", os.path.join(os.path.expanduser("~"), ".cache", "fnx"))
    return Config(device=os.environ.get("FNX_DEVICE", "cpu"), debug=int(os.environ.get("FNX_DEBUG", "0") or 0),
                                cpu_threads=int(os.environ.get("FNX_CPU_THREADS", "0") or 0) or usable_cpus(),
                                cache_dir=cache or None, beam=int(os.environ.get("FNX_BEAM", "0") or 0),
                                executables=int(os.environ.get("FNX_EXECUTABLES", "512") or 512),
                                cpu_devices=_positive("FNX_CPU_DEVICES", "1"),
                                cpu_target=os.environ.get("FNX_CPU_TARGET", "") or "native",
                                distributed_timeout=_seconds("FNX_DISTRIBUTED_TIMEOUT", "300"),
                                cuda_arch=os.environ.get("FNX_CUDA_ARCH", "") or "sm_90",
                                explain_cache_misses=os.environ.get("FNX_EXPLAIN_RETRACE", "0") not in ("", "0"),
                                enable_x64=_flag("FNX_ENABLE_X64", "JAX_ENABLE_X64"),
                                debug_nans=_flag("FNX_DEBUG_NANS", "JAX_DEBUG_NANS"),
                                debug_infs=_flag("FNX_DEBUG_INFS", "JAX_DEBUG_INFS"))


config = _read()

# the settings `update` may change while the program runs (the others are read once, at import)
_UPDATABLE = {"explain_cache_misses": bool, "enable_x64": bool, "debug_nans": bool, "debug_infs": bool}


def update(name: str, value) -> None:
    """Change a setting at run time, as `jax.config.update`: `fnx.config.update("explain_cache_misses", True)`,
    `fnx.config.update("jax_enable_x64", True)` (JAX's `jax_` prefix is accepted)."""
    key = name.removeprefix("jax_")
    if key not in _UPDATABLE:
        raise AttributeError(f"fnx.config.update: unknown or import-time-only setting {name!r}; settable at run time: "
                             f"{sorted(_UPDATABLE)} (the others are environment variables read at import: see "
                             "fnx/config.py)")
    setattr(config, key, _UPDATABLE[key](value))


def read(name: str):
    """A setting's current value, as `jax.config.read`: `fnx.config.read("jax_enable_x64")`."""
    key = name.removeprefix("jax_")
    if not hasattr(config, key): raise AttributeError(f"fnx.config.read: unknown setting {name!r}")
    return getattr(config, key)


def __getattr__(name: str):
    """`fnx.config.jax_enable_x64` and the other `jax_`-prefixed names read the setting, as on `jax.config`."""
    if name.startswith("jax_") and hasattr(config, name.removeprefix("jax_")):
        return getattr(config, name.removeprefix("jax_"))
    raise AttributeError(f"module 'fnx.config' has no attribute {name!r}")
