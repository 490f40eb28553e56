"""The machine a lowering is for: what the optimizer's heuristics and BEAM read instead of constants tuned to
one chip. A backend reads it from its device and passes it down (`lower(fn, target)`); the CPU's comes from
fnx/backends/cpu_target.py (the host, or FNX_CPU_TARGET)."""
from __future__ import annotations

from dataclasses import dataclass, fields


@dataclass(frozen=True)
class Target:
    """Facts about one device, each read from the machine (or from the CPU an override names).

    Example: `Target('x86-64-v3', 'x86_64-unknown-linux-gnu', '+avx2,+fma', 32, 16, True, 49152, 2097152, 0, 8, 8)`
    is an AVX2 CPU: float32 kernels get 8 lanes and register blocks that fit 16 vector registers.
    """
    name: str               # LLVM CPU name the code is compiled for ('skylake-avx512', 'znver4', 'x86-64-v3', ...)
    triple: str             # LLVM target triple ('' for a backend that does not compile with LLVM)
    features: str           # LLVM feature string ('+avx2,+fma,...'; '' for the CPU name's own)
    vector_bytes: int       # widest vector register: 64 (AVX-512), 32 (AVX2), 16 (SSE, NEON)
    vector_registers: int   # how many of them: 32 with AVX-512 or on aarch64, 16 otherwise
    fma: bool               # fused multiply-add in one instruction
    l1_bytes: int           # L1 data cache per core
    l2_bytes: int           # L2 cache per core
    l3_bytes: int           # L3 cache, shared (0 when unknown)
    cores: int              # cores the OS lets this process run on
    threads: int            # worker threads a kernel may be split across (THREAD)
    grid: bool = False      # a data-parallel device: kernels launch over a grid of work items (OpenCL, CUDA)
    local_size: int = 1     # work items of one work-group / thread block a launch uses (grid devices)
    tensor_cores: tuple = ()  # the 16-bit float types its matrix instructions multiply ('float16', 'bfloat16')

    @property
    def key(self) -> str:
        """Every field, for cache keys (BEAM's schedules): any of them may steer the generated code."""
        return "|".join(f"{f.name}={getattr(self, f.name)}" for f in fields(self))


__all__ = ["Target"]
