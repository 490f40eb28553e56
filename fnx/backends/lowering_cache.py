"""The lowering cache: a warm process skips Python lowering too, not only LLVM.

The compile cache (ObjectCache) keeps machine code keyed by LLVM IR, so a warm process still traced, lowered
(rangeify, optimize, linearize: ~190 ms for the W4 step) and rendered IR just to find the key. This cache keeps,
next to it, what lowering produced for a FUNCTION: the kernels (their graphs, loops, schedules and linear
programs), the buffers, the memory plan and the row chains, and the LLVM modules' sources. Its key hashes the
FUNCTION's graph, the target, and the source code of fnx itself (a changed fnx never reads an older entry).

Entries are plain data (JSON: a table of nodes, each its op, dtype, sources and argument, the arguments of a
closed set of types), never pickles, so a cache file can at worst fail to decode: it is then ignored. A call's
rule (custom_jvp, custom_vjp, checkpoint) enters the key as what lowering reads of it, its body's PARAM tag and
its name (its Python functions served the transforms, which are done; its body is in the graph). A FUNCTION whose
graph holds anything else (a device buffer) or whose lowering has a host step (control flow the runtime lowers
when it first runs) is not cached.
"""
from __future__ import annotations

import hashlib
import json
import os
import struct
import threading
import zlib
from dataclasses import fields

import fnx
from fnx import dtypes
from fnx.backends.device import ObjectCache
from fnx.cache_files import write_atomically
from fnx.config import config
from fnx.lower.chain import RowChain
from fnx.lower.memory import MemoryPlan
from fnx.lower.optimize import Opt
from fnx.lower.pipeline import Lowering
from fnx.lower.rangeify import BufferSpec, HostStep, Kernel, Schedule
from fnx.lower.target import Target
from fnx.uop import (GroupOp, ConstArg, IotaArg, Ops, ParamArg, RangeArg, ReduceArg, ScanArg, ScatterArg, ControlArg,
                     CollectiveArg, UOp, collector_paused)

_DTYPES = {d.name: d for d in dtypes.ALL_DTYPES}
_ARGS = {t.__name__: t for t in (ConstArg, IotaArg, ParamArg, RangeArg, ReduceArg, ScanArg, ScatterArg, ControlArg,
                                 CollectiveArg)}


class Uncacheable(Exception):
    """The lowering holds something this cache does not encode."""


class _Nodes:
    """A table of UOps, each after its sources and the UOps its arg names (a LOAD's lane range)."""

    def __init__(self, for_key: bool = False):
        self.index: dict[UOp, int] = {}
        self.rows: list = []
        self.for_key = for_key  # (a key may name a call's rule by its kind, tag and name: lowering inlines calls)

    def ref(self, root: UOp) -> int:
        stack = [(root, False)]
        while stack:
            u, ready = stack.pop()
            if u in self.index: continue
            if ready:
                self.index[u] = len(self.rows)
                arg = self.rule(u.arg) if self.for_key and u.op in (Ops.CALL, Ops.FUNCTION) else self.arg(u.arg)
                self.rows.append([u.op.name, u.dtype.name, [self.index[s] for s in u.src], arg])
                continue
            stack.append((u, True))
            stack.extend((s, False) for s in (*u.src, *([u.arg] if isinstance(u.arg, UOp) else []))
                         if s not in self.index)
        return self.index[root]

    def rule(self, a):
        """A call's rule as the lowering sees it: the PARAM tag of its body and the name kernels take from it (its
        Python functions served the transforms, which are done)."""
        if a is None: return None
        return ["C", type(a).__name__, self.arg(tuple(getattr(a, "tag", ()))), callee_name_of(a)]

    def arg(self, a):
        if a is None or isinstance(a, (bool, int, str)): return a
        if isinstance(a, float): return ["F", struct.unpack("<Q", struct.pack("<d", a))[0]]  # (every bit: hex()
        # writes each NaN as "nan", dropping its sign and payload)
        if isinstance(a, UOp): return ["U", self.index[a]]
        if isinstance(a, Ops): return ["O", a.name]
        if isinstance(a, dtypes.DType): return ["D", a.name]
        if type(a).__name__ in _ARGS and type(a) is _ARGS[type(a).__name__]:
            return ["N", type(a).__name__, [self.arg(v) for v in a]]
        if type(a) is tuple: return ["T", [self.arg(v) for v in a]]
        raise Uncacheable(f"{type(a).__name__} argument")


def callee_name_of(rule) -> str:
    name = getattr(getattr(rule, "fun", None), "__name__", "") or getattr(rule, "name", "") or ""
    return str(name)


def _decode_arg(a, nodes: list):
    if not isinstance(a, list): return a
    tag = a[0]
    if tag == "F": return struct.unpack("<d", struct.pack("<Q", a[1]))[0]
    if tag == "U": return nodes[a[1]]
    if tag == "O": return Ops[a[1]]
    if tag == "D": return _DTYPES[a[1]]
    if tag == "N": return _ARGS[a[1]](*(_decode_arg(v, nodes) for v in a[2]))
    if tag == "T": return tuple(_decode_arg(v, nodes) for v in a[1])
    raise ValueError(f"unknown argument tag {tag!r}")


def _decode_nodes(rows: list) -> list[UOp]:
    """The table's UOps; the kernels' scalar nodes without shape inference (the entry is fnx's own: the cache
    checks its digest and the key hashes fnx's source)."""
    nodes: list[UOp] = []
    for op, dtype, src, arg in rows:
        o, sources = Ops[op], tuple(nodes[i] for i in src)
        make = UOp.scalar if o in GroupOp.ALU and sources and all(s.shape == () for s in sources) else UOp
        nodes.append(make(o, _DTYPES[dtype], sources, _decode_arg(arg, nodes)))
    return nodes


_KERNEL_FIELDS = ("name", "parallel", "thread_candidate", "thread_range", "code")
_KNOWN = ("work", "thread_size", "output")  # what the runtime reads of a kernel, kept so that it needs no graph
_GRAPH_FIELDS = ("sink", "ranges", "reduce_ranges", "lanes", "locals", "row_ranges")


def _encode_kernel(k: Kernel, t: _Nodes) -> dict:
    if k.init or k.prelude: raise Uncacheable("an unscheduled kernel")
    out = {f: getattr(k, f) for f in _KERNEL_FIELDS + _KNOWN}  # (walking a big kernel's graph for `work`: 3 ms)
    out.update(sink=t.ref(k.sink), args=list(k.args), ranges=[t.ref(r) for r in k.ranges],
               reduce_ranges=[t.ref(r) for r in k.reduce_ranges], lanes=[t.ref(r) for r in k.lanes],
               locals=[t.ref(r) for r in k.locals], opts=[[o.op, o.axis, o.amount] for o in k.opts],
               row_ranges=None if k.row_ranges is None else [t.ref(r) for r in k.row_ranges],
               stream=sorted(k.stream))
    return out


class _Graphs:
    """An entry's node table, decoded the first time something asks for a kernel's graph (as_text, a profiler's
    loops, donation): running the program needs only what `_KNOWN` keeps, so a warm process skips decoding the
    graphs (most of the entry: 5-7 ms of the W4 step's 13 ms warm compile)."""

    def __init__(self, rows: bytes):
        self.rows, self.nodes, self.lock = rows, None, threading.Lock()

    def node(self, i: int) -> UOp:
        if self.nodes is None:
            with self.lock:
                if self.nodes is None:
                    try:
                        self.nodes = _decode_nodes(json.loads(self.rows))
                    except (ValueError, KeyError, TypeError, IndexError) as err:
                        raise RuntimeError(f"the lowering cache entry's kernel graphs did not decode ({err!r}); "
                                           "clear FNX_CACHE_DIR") from err
        return self.nodes[i]


class _CachedKernel(Kernel):
    """A Kernel read from the cache: its graph fields (`_GRAPH_FIELDS`) are decoded on first use."""

    def __getattr__(self, name: str):  # (called only for an attribute not set yet)
        refs = self.__dict__.get("_refs")
        if refs is None or name not in refs: raise AttributeError(name)
        graphs = self.__dict__["_graphs"]
        for field, ref in refs.items():
            if field not in self.__dict__:
                self.__dict__[field] = None if ref is None else graphs.node(ref) if field == "sink" else \
                    (list if field in ("ranges", "reduce_ranges") else tuple)(graphs.node(i) for i in ref)
        return self.__dict__[name]


def _decode_kernel(d: dict, graphs: _Graphs) -> Kernel:
    k = object.__new__(_CachedKernel)
    k.__dict__.update(name=d["name"], args=list(d["args"]), parallel=d["parallel"],
                      thread_candidate=d["thread_candidate"], thread_range=d["thread_range"],
                      opts=tuple(Opt(*o) for o in d["opts"]), init=frozenset(), prelude=(), sources=(), code=d["code"],
                      stream=frozenset(d["stream"]),
                      _refs={f: d[f] for f in _GRAPH_FIELDS}, _graphs=graphs, **{f: d[f] for f in _KNOWN})
    return k


class _Lines:
    """A kernel's linear program from the cache, decoded on first use (the runtime only asks whether it has one:
    its object code is in the compile cache)."""

    def __init__(self, refs: list, graphs: _Graphs):
        self.refs, self.graphs, self.lines = refs, graphs, None

    def _list(self) -> list:
        if self.lines is None: self.lines = [(what, self.graphs.node(i)) for what, i in self.refs]
        return self.lines

    def __iter__(self): return iter(self._list())
    def __len__(self) -> int: return len(self.refs)
    def __getitem__(self, i): return self._list()[i]
    def __eq__(self, other): return self._list() == (other._list() if isinstance(other, _Lines) else other)
    __hash__ = None


def encode(lowering: Lowering, modules: list[tuple[list[str], str]]) -> bytes:
    """The lowering and its modules ((kernel names, LLVM source) each) as bytes; raises Uncacheable."""
    t = _Nodes()
    if any(isinstance(k, HostStep) for k, _ in lowering.kernels) or \
            any(isinstance(k, HostStep) for k in lowering.schedule.kernels):
        raise Uncacheable("a host step")
    kernels = [(_encode_kernel(k, t), [[what, t.ref(u)] for what, u in lines]) for k, lines in lowering.kernels]
    before = [_encode_kernel(k, t) for k in lowering.schedule.kernels]
    position = {id(k): i for i, (k, _) in enumerate(lowering.kernels)}
    chains = [{**{f.name: getattr(c, f.name) for f in fields(RowChain) if f.name != "members"},
               "scratch": [[b, o, r] for b, (o, r) in c.scratch.items()],
               "members": [position[id(k)] for k in c.members]} for c in lowering.chains]
    plan = lowering.memory
    data = {"kernels": kernels, "before": before,
            "buffers": [[b.dtype.name, b.size, b.kind, b.param, b.device] for b in lowering.schedule.buffers],
            "outputs": list(lowering.schedule.outputs),
            "memory": {**{f.name: getattr(plan, f.name) for f in fields(MemoryPlan)},
                       "slot_of": [[b, s] for b, s in plan.slot_of.items()]},
            "chains": chains, "modules": [names for names, _ in modules]}
    # the node table after the rest, parsed only when a graph is asked for; the LLVM sources last, apart (as JSON
    # strings their escapes made loading 4x slower)
    head, rows = json.dumps(data, separators=(",", ":")).encode(), json.dumps(t.rows, separators=(",", ":")).encode()
    return zlib.compress(len(head).to_bytes(8, "little") + head + len(rows).to_bytes(8, "little") + rows +
                         b"\0".join(s.encode() for _, s in modules), 1)


def decode(blob: bytes, fn: UOp, modules_first=None) -> tuple[Lowering, list[tuple[list[str], str]]]:
    """The lowering and its modules from `encode`'s bytes. `modules_first(modules)`, when given, gets the modules
    before the kernels are decoded (the CPU backend starts linking their object code meanwhile)."""
    raw = zlib.decompress(blob)
    n = int.from_bytes(raw[:8], "little")
    data = json.loads(raw[8:8 + n])
    m = int.from_bytes(raw[8 + n:16 + n], "little")
    graphs, tail = _Graphs(raw[16 + n:16 + n + m]), raw[16 + n + m:]
    sources = [text.decode() for text in tail.split(b"\0")] if data["modules"] else []
    modules = [(list(names), source) for names, source in zip(data["modules"], sources)]
    if modules_first is not None: modules_first(modules)
    kernels = [(_decode_kernel(k, graphs), _Lines(lines, graphs)) for k, lines in data["kernels"]]
    buffers = [BufferSpec(_DTYPES[d], size, kind, param, device) for d, size, kind, param, device in
               data["buffers"]]
    schedule = Schedule([_decode_kernel(k, graphs) for k in data["before"]], buffers, list(data["outputs"]))
    memory = data["memory"]
    memory["slot_of"] = {b: s for b, s in memory["slot_of"]}
    chains = [RowChain(**{**c, "scratch": {b: (o, r) for b, o, r in c["scratch"]},
                          "members": [kernels[i][0] for i in c["members"]]}) for c in data["chains"]]
    return Lowering(None, schedule, kernels, MemoryPlan(**memory), chains, source=fn), modules


_fnx_digest: list[str] = []


def _fnx_source_digest(cache_dir: str | None) -> str:
    """A hash of fnx's own source code: an entry made by other code is never read. Reading and hashing every file
    took 2.3 ms of a warm start, so the hash is kept in the cache directory under a hash of the files' paths, sizes
    and modification times (0.5 ms to compute), and recomputed from the contents whenever any of those change."""
    if not _fnx_digest:
        root = os.path.dirname(os.path.abspath(fnx.__file__))
        paths = []
        for folder, dirs, files in sorted(os.walk(root)):
            dirs.sort()
            paths += [os.path.join(folder, name) for name in sorted(files) if name.endswith(".py")]
        stats = hashlib.sha256()
        for path in paths:
            st = os.stat(path)
            stats.update(f"{path} {st.st_size} {st.st_mtime_ns}\n".encode())
        kept = os.path.join(cache_dir, "fnx-source", stats.hexdigest()) if cache_dir else None
        try:
            with open(kept, "rb") as f: digest = f.read().decode("ascii")  # type: ignore[arg-type]
        except (OSError, TypeError, ValueError):  # (none kept, no cache directory, a damaged file)
            digest = ""
        if len(digest) != 64 or any(c not in "0123456789abcdef" for c in digest):
            h = hashlib.sha256()
            for path in paths:
                with open(path, "rb") as f: h.update(os.path.basename(path).encode() + f.read())
            digest = h.hexdigest()
            if kept: write_atomically(kept, digest.encode())
        _fnx_digest.append(digest)
    return _fnx_digest[0]


class LoweringCache:
    """Entries on disk beside the compile cache (FNX_CACHE_DIR), one per (FUNCTION, target, fnx source)."""

    def __init__(self, target: Target, pipeline: str):
        source = _fnx_source_digest(config.cache_dir)
        self.files = ObjectCache(config.cache_dir, f"lowering {target.key} {pipeline} {source}", suffix=".lowering")

    def key(self, fn: UOp) -> str | None:
        """The entry's key, or None when `fn` cannot be cached (or there is no cache directory)."""
        if self.files.directory is None: return None
        t = _Nodes(for_key=True)
        try:
            t.ref(fn)
        except Uncacheable:
            return None
        return self.files.key(json.dumps(t.rows, separators=(",", ":")))

    def load(self, key: str, fn: UOp, modules_first=None):
        """(lowering, modules) from the entry under `key`, or None (`modules_first`: see `decode`; it may have been
        called for an entry that then fails to decode)."""
        blob = self.files.load(key)
        if blob is None: return None
        with collector_paused():  # (decoding makes thousands of small lists: in a process full of objects each full
            try:                  # collection they set off took 50 ms, 10x the decoding)
                return decode(blob, fn, modules_first)
            except (ValueError, KeyError, TypeError, IndexError, zlib.error):  # (a damaged or foreign entry)
                return None

    def store(self, key: str, lowering: Lowering, modules: list) -> bool:
        """Write the entry (True); a lowering this cache cannot encode (a host step; a graph deeper than the
        recursion limit) is simply not stored (False): the next process lowers it again."""
        try:
            self.files.store(key, encode(lowering, modules))
        except (Uncacheable, RecursionError):
            return False
        return True


__all__ = ["LoweringCache", "encode", "decode", "Uncacheable"]
