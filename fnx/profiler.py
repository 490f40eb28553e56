"""fnx.profiler: record what fnx does into a trace file that Perfetto (ui.perfetto.dev) and chrome://tracing open.

As in JAX: `with fnx.profiler.trace(log_dir):` or `start_trace(log_dir)` ... `stop_trace()`, plus
`TraceAnnotation` / `annotate_function` for the user's own spans. The file holds one event per traced function,
lowering, compile (with its cache hits and misses), kernel launch (name, device, bytes and FLOPs estimated by
the compiler's cost model, GB/s and GFLOP/s), transfer and collective, on the thread that did it.

The file is Chrome's JSON trace-event format (gzipped), not JAX's XPlane protobuf: it needs no TensorBoard
plugin, and Perfetto reads it directly. It is written to `log_dir/plugins/profile/<date_time>/<host>.trace.json.gz`
(the folder layout JAX uses), and `stop_trace` returns that path.

While a trace runs, kernels are timed one by one: each waits for its device, and the CPU backend's lean call path
is off, so a profiled program runs somewhat slower than an unprofiled one (as under any profiler).
"""
from __future__ import annotations

import contextlib
import datetime
import functools
import gzip
import json
import os
import socket
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

from fnx import events

_lock = threading.Lock()
_session: _Session | None = None


class _Session:
    """One running trace: the events so far, and where they go."""

    def __init__(self, log_dir: str):
        self.log_dir = os.fspath(log_dir)
        self.origin = time.perf_counter()
        self.wall = datetime.datetime.now()
        self.events: list[events.Event] = []
        self.stop_listening = events.listen(self.events.append)

    def write(self) -> str:
        folder = os.path.join(self.log_dir, "plugins", "profile", self.wall.strftime("%Y_%m_%d_%H_%M_%S"))
        os.makedirs(folder, exist_ok=True)
        path = os.path.join(folder, f"{socket.gethostname() or 'host'}.trace.json.gz")
        with gzip.open(path, "wt", encoding="utf-8") as f:
            json.dump(chrome_trace(self.events, self.origin), f)
        return path


def chrome_trace(recorded: list[events.Event], origin: float) -> dict:
    """The events as Chrome's trace-event JSON: complete events ('X') with start and duration in microseconds
    since `origin`, instants ('i') for cache hits and retraces, and the names of the threads ('M')."""
    pid, threads, out = os.getpid(), {}, []
    for e in recorded:
        tid = threads.setdefault((e.thread, e.thread_name), (len(threads) + 1, e.thread_name))[0]
        args = {k: _json_value(v) for k, v in e.args.items()}
        if e.duration:
            if e.args.get("bytes"): args["GB/s"] = float(f"{e.args['bytes'] / e.duration / 1e9:.4g}")
            if e.args.get("flops"): args["GFLOP/s"] = float(f"{e.args['flops'] / e.duration / 1e9:.4g}")
        event = {"name": e.name, "cat": e.cat, "pid": pid, "tid": tid, "ts": (e.start - origin) * 1e6, "args": args}
        if e.duration is None:
            event.update(ph="i", s="t")
        else:
            event.update(ph="X", dur=e.duration * 1e6)
        out.append(event)
    out += [{"name": "thread_name", "ph": "M", "pid": pid, "tid": tid, "args": {"name": name}}
            for tid, name in threads.values()]
    out.append({"name": "process_name", "ph": "M", "pid": pid, "args": {"name": f"fnx (pid {pid})"}})
    return {"traceEvents": out, "displayTimeUnit": "ms"}


def _json_value(value: Any) -> Any:
    """A JSON-ready form of an event argument: numbers, strings and lists of them as they are, others as text."""
    if value is None or isinstance(value, (int, float, str, bool)): return value
    if isinstance(value, (list, tuple)): return [_json_value(v) for v in value]
    return str(value)


def start_trace(log_dir: str | os.PathLike, create_perfetto_link: bool = False, create_perfetto_trace: bool = False,
                profiler_options: Any = None) -> None:
    """Start recording fnx's events for `stop_trace` to write under `log_dir`. The trace is always a Perfetto-
    readable JSON file (`create_perfetto_trace` is accepted and changes nothing); `create_perfetto_link` (JAX
    uploads the trace to a local server and prints a link) is not supported: open the file in ui.perfetto.dev."""
    global _session
    if create_perfetto_link:
        raise NotImplementedError("fnx.profiler.start_trace: create_perfetto_link is not supported; open the written "
                                  ".trace.json.gz file in https://ui.perfetto.dev or chrome://tracing")
    with _lock:
        if _session is not None:
            raise RuntimeError("fnx.profiler.start_trace: a trace is already running (call stop_trace first)")
        _session = _Session(log_dir)


def stop_trace() -> str:
    """Stop the trace `start_trace` began and write it; returns the path of the file."""
    global _session
    with _lock:
        if _session is None: raise RuntimeError("fnx.profiler.stop_trace: no trace is running (call start_trace)")
        session, _session = _session, None
    session.stop_listening()
    return session.write()


@contextlib.contextmanager
def trace(log_dir: str | os.PathLike, create_perfetto_link: bool = False,
          create_perfetto_trace: bool = False) -> Iterator[None]:
    """`with fnx.profiler.trace(log_dir):` records the block (start_trace, then stop_trace on the way out, also
    when the block raises)."""
    start_trace(log_dir, create_perfetto_link, create_perfetto_trace)
    try:
        yield
    finally:
        stop_trace()


class TraceAnnotation:
    """A span of the user's own in the trace: `with fnx.profiler.TraceAnnotation("data loading"):`; keyword
    arguments become the event's arguments."""

    def __init__(self, name: str, **kwargs: Any):
        self.name, self.kwargs, self._span = name, kwargs, None

    def __enter__(self) -> TraceAnnotation:
        self._span = events.span("user", self.name, **self.kwargs)
        self._span.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        self._span.__exit__(*exc)


class StepTraceAnnotation(TraceAnnotation):
    """A training step's span: `with StepTraceAnnotation("train", step_num=i):` (named 'train 3' in the trace)."""

    def __init__(self, name: str, **kwargs: Any):
        step = kwargs.get("step_num")
        super().__init__(f"{name} {step}" if step is not None else name, **kwargs)


def annotate_function(func: Callable | None = None, name: str | None = None, **kwargs: Any) -> Callable:
    """Decorator: each call of `func` is a span named `name` (default: the function's qualified name)."""
    if func is None: return functools.partial(annotate_function, name=name, **kwargs)
    label = name or getattr(func, "__qualname__", None) or getattr(func, "__name__", "function")

    @functools.wraps(func)
    def wrapper(*args: Any, **kw: Any) -> Any:
        with TraceAnnotation(label, **kwargs):
            return func(*args, **kw)
    return wrapper


__all__ = ["start_trace", "stop_trace", "trace", "TraceAnnotation", "StepTraceAnnotation", "annotate_function",
           "chrome_trace"]
