"""BEAM search over a kernel's schedule: the same actions as the hand heuristics (fnx/lower/optimize.py), chosen
by timing each candidate on the device. The backend passes in how to time: `measure(kernel, target)` returns a
timer, `timer(kernels) -> seconds` (the CPU's is fnx/backends/cpu_beam.py), so lowering needs no backend.

`FNX_BEAM=N` keeps the N fastest schedules at each depth, extends each by every action that applies, and stops when
a depth brings no improvement (or after MAX_DEPTH actions). The hand heuristic's schedule is always a candidate, so
the search never returns something slower than it measured. The winner is cached on disk under FNX_CACHE_DIR
(`beam/<key>.json`), content-addressed by the kernel's graph, its loops and the target (`Target.key`: the CPU,
its features and caches, the thread count), so a later process reuses it without timing anything. A progress bar
(tqdm, when installed) shows the candidates timed.
"""
from __future__ import annotations

import hashlib
import json
import os

from fnx.cache_files import write_atomically
from fnx.config import config
from fnx.lower.optimize import Opt, OptError, apply_opt, heuristic_opts, optimize
from fnx.lower.rangeify import Kernel
from fnx.lower.target import Target

MAX_DEPTH = 5
_AMOUNTS = {"VECTORIZE": (4, 8, 16, 32), "UPCAST": (2, 3, 4, 6, 8), "UNROLL": (2, 4, 8), "SPLIT": (2, 4, 16, 64, 256)}


def candidate_actions(k: Kernel, target: Target | None = None) -> list[Opt]:
    """Every action worth trying on kernel k (some may still fail to apply: those are skipped). A grid target
    gets work-group actions (LOCAL, GROUP: powers of two up to its work-group size) instead of packing and
    accumulation, and vector lanes of 2 or 4 (its widest vector access is 16 bytes)."""
    n_out, axes = len(k.ranges), k.ranges + k.reduce_ranges
    grid = target is not None and target.grid
    widths = [w for w in (4, 8, 16, 32, 64, 128, 256) if grid and w <= target.local_size]
    acts: list[Opt] = []
    for i, r in enumerate(axes):
        out = i < n_out
        for op in ("VECTORIZE", "UPCAST", "UNROLL", "SPLIT"):
            if op == "UPCAST" and not out or op == "UNROLL" and out: continue
            amounts = (2, 4) if grid and op == "VECTORIZE" else _AMOUNTS[op]
            acts += [Opt(op, i, a) for a in amounts if a <= r.arg.size]
        acts += [Opt("LOCAL" if out else "GROUP", i, w) for w in widths if w < 2 * r.arg.size]
        if out: acts.append(Opt("THREAD", i))
        if out and not k.opts and not grid: acts += [Opt("PACK", i, a) for a in (16, 32) if a <= r.arg.size]
        if out: acts += [Opt("SWAP", i, j) for j in range(i + 1, n_out)]
        if not out and not grid: acts.append(Opt("ACCUMULATE", i))
    if k.reduce_ranges and not k.opts and not grid: acts.append(Opt("SEPARATE", 0, 0))
    if k.reduce_ranges and not k.ranges and not k.opts and not grid:  # a whole-array reduction: partials per thread
        acts += [Opt("PARTIALS", 0, p) for p in (2, 4, 8) if 2 * p <= k.reduce_ranges[0].arg.size]
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
    path = _cache_path(key)
    if path is None: return
    text = json.dumps({"key": key, "opts": [[o.op, o.axis, o.amount] for o in opts], "seconds": seconds})
    write_atomically(path, text.encode())


def beam_search(kernel: Kernel, target: Target, width: int, measure) -> tuple[list[Opt], float, float]:
    """(best actions, their time, the hand heuristic's time), by timing candidates with `measure(kernel, target)`'s
    timer."""
    timer = measure(kernel, target)
    heuristic = heuristic_opts(kernel, target)
    timings: dict[tuple, float] = {}

    def time_of(opts: list[Opt]) -> float:
        key = tuple(opts)
        if key not in timings:
            try:
                timings[key] = timer(optimize(kernel, target, opts))
            except (OptError, AssertionError, ZeroDivisionError):
                timings[key] = float("inf")
        return timings[key]

    try:
        from tqdm import tqdm
        bar = tqdm(desc=f"BEAM {kernel.name}", unit="schedule", leave=False)
    except ImportError:
        bar = None
    base = time_of(heuristic)
    beam = [([], time_of([])), (heuristic, base)]
    best = min(beam, key=lambda b: b[1])
    for _ in range(MAX_DEPTH):
        found = []
        for opts, _ in beam:
            probe = kernel
            try:
                for opt in opts: probe = apply_opt(probe, opt)
            except OptError:
                continue
            for act in candidate_actions(probe, target):
                try:
                    apply_opt(probe, act)
                except (OptError, AssertionError):
                    continue
                t = time_of(opts + [act])
                if bar is not None: bar.update(1)
                found.append((opts + [act], t))
        if not found: break
        found.sort(key=lambda b: b[1])
        beam = found[:width]
        if beam[0][1] >= best[1]: break
        best = beam[0]
    if bar is not None: bar.close()
    return list(best[0]), best[1], base


def searched_opts(kernel: Kernel, target: Target, measure) -> list[Opt] | None:
    """The cached or freshly searched schedule for `target` when FNX_BEAM is set, else None (use the heuristics).
    `measure(kernel, target)` gives the backend's timer (beam_search)."""
    if config.beam <= 0 or not kernel.parallel: return None
    key = hashlib.sha256(f"{_graph_text(kernel)}|{target.key}".encode()).hexdigest()
    cached = _load(key)
    if cached is not None and _applies(kernel, cached): return cached  # (an older fnx may have allowed more)
    opts, seconds, _ = beam_search(kernel, target, config.beam, measure)
    _store(key, opts, seconds)
    return opts


def _applies(kernel: Kernel, opts: list[Opt]) -> bool:
    try:
        for opt in opts: kernel = apply_opt(kernel, opt)
    except OptError:
        return False
    return True
