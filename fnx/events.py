"""What fnx reports about its own work while it runs: tracing, lowering, compiling (with cache hits and misses),
kernel launches, transfers and collectives, each as an `Event` with its thread, start and duration.

Two listeners read them: FNX_DEBUG's printed lines (`DebugPrinter`, registered at import when FNX_DEBUG >= 1)
and `fnx.profiler`'s trace files. With no listener, the hot paths pay one test of the module flag `active`
(`if events.active:`); everything that costs (timing a kernel, waiting for a device, estimating its bytes and
FLOPs) happens only behind it. This module sits below everything that emits: it imports only fnx.config.
"""
from __future__ import annotations

import contextlib
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from fnx.config import config


@dataclass
class Event:
    """One thing fnx did: `cat` is 'trace', 'lower', 'compile', 'cache', 'kernel', 'transfer', 'collective' or
    'host'; `start` is time.perf_counter() seconds; `duration` is None for an instant (a cache hit)."""
    cat: str
    name: str
    start: float
    duration: float | None = None
    thread: int = 0
    thread_name: str = ""
    args: dict = field(default_factory=dict)


active = False                      # whether any listener is registered (read by the hot paths)
_listeners: list[Callable[[Event], None]] = []
_lock = threading.Lock()


def listen(listener: Callable[[Event], None]) -> Callable[[], None]:
    """Call `listener(event)` for every event from now on; returns the function that stops it."""
    global active
    with _lock:
        _listeners.append(listener)
        active = True

    def stop() -> None:
        global active
        with _lock:
            if listener in _listeners: _listeners.remove(listener)
            active = bool(_listeners)
    return stop


def emit(event: Event) -> None:
    thread = threading.current_thread()
    event.thread, event.thread_name = thread.ident or 0, thread.name
    for listener in list(_listeners): listener(event)


def instant(cat: str, name: str, **args: Any) -> None:
    """An event without duration (a cache hit, a retrace)."""
    if active: emit(Event(cat, name, time.perf_counter(), None, args=args))


def finished(cat: str, name: str, start: float, **args: Any) -> None:
    """An event that began at `start` (perf_counter seconds) and ends now."""
    if active: emit(Event(cat, name, start, time.perf_counter() - start, args=args))


@contextlib.contextmanager
def span(cat: str, name: str, **args: Any) -> Iterator[dict]:
    """Time the block as one event; the block may add to the yielded `args` (what it found out: a cache hit)."""
    if not active:
        yield args
        return
    start = time.perf_counter()
    try:
        yield args
    finally:
        finished(cat, name, start, **args)


_names = threading.local()


@contextlib.contextmanager
def naming(name: str) -> Iterator[None]:
    """What this thread compiles inside the block is called `name` (jit: the function's name) in events."""
    previous = getattr(_names, "name", None)
    _names.name = name
    try:
        yield
    finally:
        _names.name = previous


def current_name() -> str:
    """The name given by the innermost `naming` block of this thread; 'eager' (op-by-op work) outside any."""
    return getattr(_names, "name", None) or "eager"


# ---- FNX_DEBUG's lines ----

def _rate(amount: float | None, seconds: float, unit: str) -> str:
    if not amount or seconds <= 0: return ""
    return f"  {amount / seconds / 1e9:.3g} {unit}"


def _duration(seconds: float) -> str:
    return f"{seconds * 1e6:.1f} us" if seconds < 1e-3 else f"{seconds * 1e3:.1f} ms"


def debug_line(event: Event, level: int) -> str | None:
    """FNX_DEBUG's line for `event` at `level` (None: not shown at that level). Level 1: kernels with their
    shape, time, GB/s and GFLOP/s, tracing and compile times, cache hits and misses; level 2 adds each kernel's
    loops and schedule actions."""
    a = event.args
    if event.cat == "kernel":
        detail = f"  loops={a.get('loops')} actions={a.get('actions')}" if level >= 2 else ""
        return (f"fnx: kernel {event.name} on {a.get('device')}  {_duration(event.duration or 0)}"
                f"{_rate(a.get('bytes'), event.duration or 0, 'GB/s')}"
                f"{_rate(a.get('flops'), event.duration or 0, 'GFLOP/s')}{detail}")
    if event.cat == "cache":
        return f"fnx: {event.name}" + "".join(f" {k}={v}" for k, v in a.items() if k != "why") + (
            f"\n{a['why']}" if a.get("why") else "")
    if event.duration is None: return None
    if event.cat == "lower" and "optimize_ms" in a:  # (optimize includes rendering each kernel, on the CPU)
        return (f"fnx: lower {event.name} {_duration(event.duration)} ({a.get('kernels')} kernels: callify "
                f"{a['callify_ms']} ms, rangeify {a['rangeify_ms']} ms, optimize {a['optimize_ms']} ms)")
    if event.cat == "lower" and "lowering_cache" in a:
        return (f"fnx: lower {event.name} {_duration(event.duration)} ({a.get('kernels')} kernels from the lowering "
                f"cache)")
    if event.cat == "compile" and "cache_misses" in a:
        return (f"fnx: compile {event.name} {_duration(event.duration)} ({a['kernels']} kernels; object code from the "
                f"disk cache: {a['cache_hits']} modules, compiled now: {a['cache_misses']})")
    extra = ", ".join(f"{k} {v}" for k, v in a.items())
    return f"fnx: {event.cat} {event.name} {_duration(event.duration)}" + (f" ({extra})" if extra else "")


class DebugPrinter:
    """FNX_DEBUG's listener: one line per event on stdout, written whole (threads do not interleave lines)."""

    def __init__(self, level: int, out: Any = None):
        self.level, self.out = level, out

    def __call__(self, event: Event) -> None:
        line = debug_line(event, self.level)
        if line is None: return
        out = self.out or sys.stdout
        out.write(line + "\n")


if config.debug >= 1: listen(DebugPrinter(config.debug))

__all__ = ["Event", "active", "listen", "emit", "instant", "finished", "span", "naming", "current_name", "debug_line",
           "DebugPrinter"]
