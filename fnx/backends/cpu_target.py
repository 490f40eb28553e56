"""The CPU's Target (fnx/lower/target.py): the host as LLVM and the OS see it, or the CPU FNX_CPU_TARGET names,
so one machine can compile and test the code of another (an AVX-512 host runs the AVX2 code of `x86-64-v3`).

- `native` (the default): LLVM's name and features of the host CPU; the vector width, register count and FMA
  follow from the features.
- `x86-64-v2`, `x86-64-v3`, `x86-64-v4`: the x86-64 psABI's levels, with their features (LEVELS).
- any other CPU LLVM knows (`znver4`, `skylake-avx512`): its vector width and FMA are read off the code LLVM
  generates for it (PROBES), and the features the host lacks are turned off, so nothing it adds can trap here.

A target whose instructions the host lacks is a ValueError naming FNX_CPU_TARGET, never an illegal instruction.
Cache sizes and cores are always the host's: an override changes the instruction set, not the memory.
"""
from __future__ import annotations

import functools
import os
import re
import subprocess
import sys
from dataclasses import replace

import llvmlite.binding as llvm

from fnx.config import usable_cpus
from fnx.lower.target import Target

_V2 = ("cx16", "sahf", "popcnt", "crc32", "sse3", "ssse3", "sse4.1", "sse4.2")
_V3 = _V2 + ("avx", "avx2", "bmi", "bmi2", "f16c", "fma", "lzcnt", "movbe", "xsave")
LEVELS = {"x86-64-v2": _V2, "x86-64-v3": _V3,  # the x86-64 psABI's microarchitecture levels, each with the last's
          "x86-64-v4": _V3 + ("avx512f", "avx512bw", "avx512cd", "avx512dq", "avx512vl")}


def _vector_op(vector: str, op: str) -> str:
    return (f"define void @probe(ptr %p, ptr %q) {{\n  %a = load {vector}, ptr %p\n  %b = load {vector}, ptr %q\n"
            f"  %c = {op} {vector} %a, %b\n  store {vector} %c, ptr %p\n  ret void\n}}\n")


PROBES = {  # feature -> (a function that needs it, a pattern of the assembly LLVM emits for it on a CPU that has it)
    "avx512f": (_vector_op("<16 x float>", "fadd"), r"%zmm"),
    "avx2": (_vector_op("<8 x i32>", "add"), r"vpaddd[^\n]*%ymm"),
    "avx": (_vector_op("<8 x float>", "fadd"), r"vaddps[^\n]*%ymm"),
    "fma": ("declare float @llvm.fma.f32(float, float, float)\ndefine float @probe(float %a, float %b, float %c) {\n"
            "  %d = call float @llvm.fma.f32(float %a, float %b, float %c)\n  ret float %d\n}\n", r"vfmadd"),
}
_CACHES = "/sys/devices/system/cpu/cpu0/cache"


def host_target(threads: int, override: str | None = None) -> Target:
    """The Target CPU kernels are compiled for, with `threads` worker threads: the host's (`override` None or
    'native'), or that of the CPU `override` (FNX_CPU_TARGET) names.

    Raises ValueError when LLVM does not know the name or the host cannot run its code.
    Example: `host_target(8, 'x86-64-v3').vector_bytes == 32` (8 float32 lanes, 16 registers).
    """
    base = _native() if override in (None, "", "native") else _override(override)
    return replace(base, threads=threads)


@functools.cache
def _host_features() -> llvm.FeatureMap:
    llvm.initialize_native_target()
    llvm.initialize_native_asmprinter()  # (the probes print assembly)
    return llvm.get_host_cpu_features()


def _vector_facts(has: set[str], triple: str) -> tuple[int, int, bool]:
    """(vector bytes, vector registers, fma) of a CPU with the LLVM features `has`."""
    if triple.startswith(("aarch64", "arm64")): return 16, 32, True  # NEON: 32 registers, FMA in the base ISA
    if "avx512f" in has: return 64, 32, "fma" in has
    return 32 if "avx" in has else 16, 16, "fma" in has


@functools.cache
def _native() -> Target:
    host = _host_features()
    triple = llvm.get_default_triple()
    facts = _vector_facts({f for f, on in host.items() if on}, triple)
    return Target(llvm.get_host_cpu_name(), triple, host.flatten(), *facts, *_caches(), usable_cpus(), threads=1)


@functools.cache
def _override(name: str) -> Target:
    return named_target(name, _native(), dict(_host_features()))


def named_target(name: str, host: Target, host_features: dict[str, bool]) -> Target:
    """The Target of CPU `name` (a psABI level or a CPU LLVM knows) on the host that `host` and its LLVM features
    describe; ValueError when the host lacks an instruction set the code for `name` uses.

    Example: on an AVX2 host, `named_target('x86-64-v4', ...)` raises (the host lacks avx512f, ...).
    """
    if name in LEVELS:
        needs, features = set(LEVELS[name]), ",".join(f"+{f}" for f in LEVELS[name])
    elif name in _llvm_cpus():
        needs = _probe(name, host.triple)
        features = ",".join(f"-{f}" for f, on in sorted(host_features.items()) if not on)  # the host lacks: off
    else:
        raise ValueError(f"FNX_CPU_TARGET={name!r}: LLVM knows no such CPU; use 'native', 'x86-64-v2', 'x86-64-v3', "
                         f"'x86-64-v4' or a name `llc -mcpu=help` lists (e.g. 'znver4', 'skylake-avx512')")
    missing = sorted(f for f in needs if not host_features.get(f))
    if missing:
        raise ValueError(f"FNX_CPU_TARGET={name!r}: this host ({host.name}) lacks {', '.join(missing)}, which "
                         f"code for {name} uses; pick a target the host can run, e.g. 'native'")
    vector_bytes, registers, fma = _vector_facts(needs, host.triple)
    return replace(host, name=name, features=features, vector_bytes=vector_bytes, vector_registers=registers, fma=fma)


def _probe(name: str, triple: str) -> set[str]:
    """The PROBES features CPU `name` has: those whose instructions LLVM emits when compiling for it."""
    machine = llvm.Target.from_triple(triple).create_target_machine(cpu=name, features="")
    return {f for f, (ir, pattern) in PROBES.items()
            if re.search(pattern, machine.emit_assembly(llvm.parse_assembly(ir)))}


@functools.cache
def _llvm_cpus() -> frozenset[str]:
    """The CPU names LLVM knows: its `-mcpu=help` list, printed by a child process (LLVM aborts the process that
    compiles for a name it does not know, so no name is tried here before it is found in the list)."""
    code = ("import llvmlite.binding as llvm; llvm.initialize_native_target(); "
            "llvm.Target.from_default_triple().create_target_machine(cpu='help')")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    listing = done.stderr.partition("Available CPUs for this target:")[2].partition("Available features")[0]
    return frozenset(line.split()[0] for line in listing.splitlines() if " - " in line)


def _caches() -> tuple[int, int, int]:
    """(L1 data, L2, L3) bytes of cpu0's caches: sysfs's, else sysconf's, else 32 KiB, 1 MiB and 0 (unknown)."""
    sizes: dict[int, int] = {}
    try:
        entries = [os.path.join(_CACHES, e) for e in os.listdir(_CACHES) if e.startswith("index")]
    except OSError:
        entries = []
    for entry in entries:
        try:
            level, kind, size = (_read(os.path.join(entry, f)) for f in ("level", "type", "size"))
        except OSError:
            continue
        if kind in ("Data", "Unified") and level.isdigit() and (m := re.fullmatch(r"(\d+)([KMG]?)", size)):
            sizes[int(level)] = int(m[1]) << {"K": 10, "M": 20, "G": 30, "": 0}[m[2]]
    fallbacks = {1: ("SC_LEVEL1_DCACHE_SIZE", 32 << 10), 2: ("SC_LEVEL2_CACHE_SIZE", 1 << 20),
                 3: ("SC_LEVEL3_CACHE_SIZE", 0)}
    return tuple(sizes.get(level) or _sysconf(key) or default for level, (key, default) in fallbacks.items())


def _read(path: str) -> str:
    with open(path) as f: return f.read().strip()


def _sysconf(key: str) -> int:
    try:
        return max(0, os.sysconf(key)) if key in os.sysconf_names else 0
    except (OSError, ValueError):
        return 0


__all__ = ["host_target", "named_target", "LEVELS"]
