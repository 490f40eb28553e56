"""BEAM search over a kernel's schedule: the same actions as the hand heuristics (fnx/lower/optimize.py), chosen
by timing each candidate on the device.

`FNX_BEAM=N` keeps the N fastest schedules at each depth, extends each by every action that applies, and stops when
a depth brings no improvement (or after MAX_DEPTH actions). The hand heuristic's schedule is always a candidate, so
the search never returns something slower than it measured. The winner is cached on disk under FNX_CACHE_DIR
(`beam/<key>.json`), content-addressed by the kernel's graph, its loops, the thread count and the CPU, so a later
process reuses it without timing anything. A progress bar (tqdm, when installed) shows the candidates timed.
"""
from __future__ import annotations

import ctypes
import hashlib
import json
import os
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace

import numpy as np

from fnx.config import config
from fnx.lower.linearize import linearize
from fnx.lower.optimize import Opt, OptError, apply_opt, heuristic_opts, optimize
from fnx.lower.rangeify import Kernel
from fnx.uop import Ops

MAX_DEPTH = 5
REPEATS = 3
_AMOUNTS = {"VECTORIZE": (4, 8, 16, 32), "UPCAST": (2, 3, 4, 6, 8), "UNROLL": (2, 4, 8), "SPLIT": (2, 4, 16, 64, 256)}


def candidate_actions(k: Kernel) -> list[Opt]:
    """Every action worth trying on kernel k (some may still fail to apply: those are skipped)."""
    n_out, axes = len(k.ranges), k.ranges + k.reduce_ranges
    acts: list[Opt] = []
    for i, r in enumerate(axes):
        out = i < n_out
        for op in ("VECTORIZE", "UPCAST", "UNROLL", "SPLIT"):
            if op == "UPCAST" and not out or op == "UNROLL" and out: continue
            acts += [Opt(op, i, a) for a in _AMOUNTS[op] if a <= r.arg[1]]
        if out: acts.append(Opt("THREAD", i))
        if out and not k.opts: acts += [Opt("PACK", i, a) for a in (16, 32) if a <= r.arg[1]]
        if out: acts += [Opt("SWAP", i, j) for j in range(i + 1, n_out)]
        if not out: acts.append(Opt("ACCUMULATE", i))
    return acts


def _graph_text(k: Kernel) -> str:
    """A canonical text of the kernel's graph and loops (names of nodes are their position in toposort)."""
    order = k.sink.toposort
    ids = {u: i for i, u in enumerate(order)}
    lines = [f"{u.op.name} {u.dtype.name} {[ids[s] for s in u.src]} {u.arg!r}" for u in order]
    return "\n".join(lines) + f"\nranges {[r.arg for r in k.ranges]} reduce {[r.arg for r in k.reduce_ranges]}"


def _cache_path(key: str) -> str | None:
    return os.path.join(config.cache_dir, "beam", key + ".json") if config.cache_dir else None


def _load(key: str) -> list[Opt] | None:
    path = _cache_path(key)
    if path is None: return None
    try:
        with open(path) as f: data = json.load(f)
        if data["key"] != key: return None  # a file copied or moved under another kernel's name
        return [Opt(str(op), int(axis), int(amount)) for op, axis, amount in data["opts"]]
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _store(key: str, opts: list[Opt], seconds: float) -> None:
    from fnx.backends.cpu_llvm import write_atomically
    path = _cache_path(key)
    if path is None: return
    text = json.dumps({"key": key, "opts": [[o.op, o.axis, o.amount] for o in opts], "seconds": seconds})
    write_atomically(path, text.encode())


class KernelTimer:
    """Compiles one schedule of a kernel (with its init kernel) and times it on random buffers."""

    def __init__(self, kernel: Kernel, threads: int):
        from fnx.backends.cpu_llvm import _compiler
        self.compiler, self.threads = _compiler(), threads
        self.pool = _pool(threads) if threads > 1 else None
        self.rng, self.buffers = np.random.default_rng(0), []
        self._allocate(kernel)

    def _allocate(self, kernel: Kernel) -> None:
        """Random host buffers for the kernel's arguments that have none yet, or too small a one (PACK's panels
        come last, and their size depends on the schedule)."""
        params = {u.arg[0]: u for u in kernel.sink.toposort if u.op is Ops.PARAM}
        self.buffers += [np.zeros(1, np.float32)] * (max(len(kernel.args), 1) - len(self.buffers))
        for i, p in params.items():
            size, dtype = p.arg[1][0], p.dtype
            if self.buffers[i].size >= size and self.buffers[i].dtype == dtype.np: continue
            host = self.rng.standard_normal(size) if dtype.is_float else self.rng.integers(0, 2, size)
            self.buffers[i] = np.ascontiguousarray(host.astype(dtype.np))

    def __call__(self, kernels: list[Kernel]) -> float:
        from fnx.backends.llvm_render import render_module
        kernels = [replace(k, name=f"beam{i}") for i, k in enumerate(kernels)]
        for k in kernels: self._allocate(k)
        engine, _ = self.compiler.compile(render_module([(k, linearize(k)) for k in kernels]))
        launches = []
        for k in kernels:
            proto = ctypes.CFUNCTYPE(None, *([ctypes.c_void_p] * max(len(k.args), 1)), ctypes.c_int64, ctypes.c_int64)
            func = proto(engine.get_function_address(k.name))
            outer = k.ranges[k.thread_range].arg[1] if k.thread_range >= 0 else 1
            args = [self.buffers[i].ctypes.data for i in range(max(len(k.args), 1))]
            launches.append((func, args, outer, k.thread_range >= 0))
        best = float("inf")
        for _ in range(REPEATS + 1):
            start = time.perf_counter()
            for func, args, outer, threaded in launches:
                if threaded and self.pool is not None:
                    chunk = -(-outer // self.threads)
                    jobs = [self.pool.submit(func, *args, lo, min(lo + chunk, outer)) for lo in range(0, outer, chunk)]
                    for job in jobs: job.result()
                else:
                    func(*args, 0, outer)
            best = min(best, time.perf_counter() - start)
        self._keep = engine  # the code must outlive the calls above
        return best


_pools: dict[int, ThreadPoolExecutor] = {}


def _pool(threads: int) -> ThreadPoolExecutor:
    if threads not in _pools: _pools[threads] = ThreadPoolExecutor(threads, thread_name_prefix="fnx-beam")
    return _pools[threads]


def beam_search(kernel: Kernel, threads: int, width: int) -> tuple[list[Opt], float, float]:
    """(best actions, their time, the hand heuristic's time), by timing candidates."""
    timer = KernelTimer(kernel, threads)
    heuristic = heuristic_opts(kernel, threads)
    timings: dict[tuple, float] = {}

    def measure(opts: list[Opt]) -> float:
        key = tuple(opts)
        if key not in timings:
            try:
                timings[key] = timer(optimize(kernel, threads, opts))
            except (OptError, AssertionError, ZeroDivisionError):
                timings[key] = float("inf")
        return timings[key]

    try:
        from tqdm import tqdm
        bar = tqdm(desc=f"BEAM {kernel.name}", unit="schedule", leave=False)
    except ImportError:
        bar = None
    base = measure(heuristic)
    beam = [([], measure([])), (heuristic, base)]
    best = min(beam, key=lambda b: b[1])
    for _ in range(MAX_DEPTH):
        found = []
        for opts, _ in beam:
            probe = kernel
            try:
                for opt in opts: probe = apply_opt(probe, opt)
            except OptError:
                continue
            for act in candidate_actions(probe):
                try:
                    apply_opt(probe, act)
                except (OptError, AssertionError):
                    continue
                t = measure(opts + [act])
                if bar is not None: bar.update(1)
                found.append((opts + [act], t))
        if not found: break
        found.sort(key=lambda b: b[1])
        beam = found[:width]
        if beam[0][1] >= best[1]: break
        best = beam[0]
    if bar is not None: bar.close()
    return list(best[0]), best[1], base


def searched_opts(kernel: Kernel, threads: int) -> list[Opt] | None:
    """The cached or freshly searched schedule when FNX_BEAM is set, else None (use the heuristics)."""
    if config.beam <= 0 or not kernel.parallel: return None
    key = hashlib.sha256(f"{_graph_text(kernel)}|{threads}|{_target()}".encode()).hexdigest()
    cached = _load(key)
    if cached is not None and _applies(kernel, cached): return cached  # (an older fnx may have allowed more)
    opts, seconds, _ = beam_search(kernel, threads, config.beam)
    _store(key, opts, seconds)
    return opts


def _applies(kernel: Kernel, opts: list[Opt]) -> bool:
    try:
        for opt in opts: kernel = apply_opt(kernel, opt)
    except OptError:
        return False
    return True


def _target() -> str:
    from fnx.backends.cpu_llvm import _compiler
    return _compiler().cache.target_id
