"""A third backend, written as a test: the `fake` platform, two devices (`fake:0`, `fake:1`) that run kernels as
generated Python over numpy. It proves that a backend needs nothing outside its own file: it plugs into the
runtime interface of fnx/backends/device.py and is replayed by the generic fnx/backends/replay.py.

- memory: host memory from a `HostPool` of its own; `transfer` has no fast path, so copies between a fake device
  and any other go through copyout/copyin;
- `PythonRenderer`: each linear kernel becomes one Python function `def k(b0, b1, ..., lo, hi)` over flat writable
  numpy views of its buffers. Loops are `for`; scalars are numpy scalars (so float32 rounds per op as numpy does,
  16-bit floats round per op and integers wrap); the subtle ALU semantics (C-style integer division, shifts,
  saturating float->int casts, transcendentals) call fnx.reference's functions, the same the interp oracle runs;
- vector lanes are numpy arrays of the lane width (elementwise numpy ops then act per lane; scalars broadcast);
  a load/store whose arg is a lane range touches consecutive elements, other vector accesses gather/scatter, and
  a gate that varies across lanes masks them, as fnx/backends/llvm_render.py does;
- `PythonCompiler`: source -> marshalled code object, through the content-addressed `ObjectCache`;
- `PythonProgram`: execs the code and calls one kernel with its buffers.
"""
from __future__ import annotations

import ctypes
import functools
import marshal
import sys

import numpy as np

from fnx import dtypes
from fnx.backends.device import (Buffer, Compiler, Device, HostAllocator, HostPool, ObjectCache, Program, Renderer,
                                 Runtime, register_runtime)
from fnx.backends.replay import ReplayExecutable
from fnx.config import config
from fnx.dtypes import DType
from fnx.errors import UnsupportedError
from fnx.lower.linearize import Linear, range_deps
from fnx.lower.rangeify import Kernel, reduce_identity
from fnx.lower.target import Target
from fnx.reference import UNARY, cast, int_div, int_rem, shift
from fnx.uop import Ops, UOp

DEVICES = 2
# scalar-friendly and small: 16-byte vectors (4 float32 lanes), no FMA, one core and one thread
TARGET = Target("fake", "", "", vector_bytes=16, vector_registers=16, fma=False, l1_bytes=32 * 1024,
                l2_bytes=256 * 1024, l3_bytes=0, cores=1, threads=1)


# ---- what generated code calls: numpy and fnx.reference, applied to numpy scalars or lane vectors ----

def _elementwise(fn):
    """A reference function of arrays applied to numpy scalars or lane vectors (0-d results become scalars)."""
    return lambda *xs: fn(*[np.asarray(x) if not isinstance(x, (bool, DType)) else x for x in xs])[()]


def _where(cond, a, b):
    """WHERE: a select per lane when the condition is a vector, else a Python conditional."""
    return np.where(cond, a, b) if np.ndim(cond) else (a if cond else b)


def _load_lanes(buf: np.ndarray, index, gate=None):
    """A vector load: `index` holds each lane's element; lanes whose gate is false read 0 (a masked load)."""
    if gate is None: return buf[index]
    index, gate = np.broadcast_arrays(index, gate)
    return np.where(gate, buf[np.where(gate, index, 0)], np.zeros((), buf.dtype))


def _store_lanes(buf: np.ndarray, index, value, gate=True) -> None:
    """A vector store (lanes in order: a later lane wins an address, as a scatter does); false gates skip lanes."""
    index, value, gate = np.broadcast_arrays(index, value, gate)
    buf[index[gate]] = value[gate]


NAMESPACE = {
    "np": np, "DT": {d.name: d for d in dtypes.DTYPES}, "T": {d.name: d.np.type for d in dtypes.DTYPES},
    "rng": lambda lo, hi: np.arange(lo, hi, dtype=np.int64), "where": _where,
    "load_lanes": _load_lanes, "store_lanes": _store_lanes,
    "int_div": _elementwise(int_div), "int_rem": _elementwise(int_rem), "shift": _elementwise(shift),
    "cast": _elementwise(cast), "bitcast": lambda x, d: np.asarray(x).view(d.np)[()],
    **{op.name.lower(): _elementwise(fn) for op, fn in UNARY.items()},
}


# ---- the renderer: one table from op to Python text ----

def _int_or_float(int_text: str, float_text: str, bool_text: str | None = None):
    def render(d: DType, a: str, b: str) -> str:
        text = bool_text if d.is_bool and bool_text is not None else int_text if d.is_int or d.is_bool else float_text
        return text.format(a=a, b=b)
    return render


def _unary(name: str):
    return lambda d, a: f"{name}({a})"


code_for_op = {  # (dtype of the operands, *operand texts) -> text; sorted like DESIGN.md §2
    Ops.RECIP: _unary("recip"), Ops.SQRT: _unary("sqrt"), Ops.EXP2: _unary("exp2"), Ops.LOG2: _unary("log2"),
    Ops.SIN: _unary("sin"), Ops.TRUNC: _unary("trunc"),
    Ops.ADD: _int_or_float("({a} + {b})", "({a} + {b})", "({a} | {b})"),
    Ops.MUL: _int_or_float("({a} * {b})", "({a} * {b})", "({a} & {b})"),
    Ops.DIV: _int_or_float("int_div({a}, {b})", "({a} / {b})", "{a}"),
    Ops.MAX: _int_or_float("np.maximum({a}, {b})", "np.maximum({a}, {b})", "({a} | {b})"),
    Ops.MOD: _int_or_float("int_rem({a}, {b})", "np.fmod({a}, {b})", "({a} & T['bool'](False))"),
    Ops.CMPLT: lambda d, a, b: f"({a} < {b})", Ops.CMPNE: lambda d, a, b: f"({a} != {b})",
    Ops.AND: lambda d, a, b: f"({a} & {b})", Ops.OR: lambda d, a, b: f"({a} | {b})",
    Ops.XOR: lambda d, a, b: f"({a} ^ {b})",
    Ops.SHL: lambda d, a, b: f"shift({a}, {b}, True)", Ops.SHR: lambda d, a, b: f"shift({a}, {b}, False)",
    Ops.WHERE: lambda d, c, a, b: f"where({c}, {a}, {b})",
}

# a REDUCE's horizontal step across the lanes of its vector accumulator (`{x}`: the accumulator)
reduce_lanes = {Ops.ADD: "np.add.reduce({x}, dtype={x}.dtype)", Ops.MUL: "np.multiply.reduce({x}, dtype={x}.dtype)",
                Ops.MAX: "np.maximum.reduce({x})"}
reduce_lanes_bool = {Ops.ADD: "np.logical_or.reduce({x})", Ops.MUL: "np.logical_and.reduce({x})",
                     Ops.MAX: "np.logical_or.reduce({x})"}


def is_half(d: DType) -> bool:
    return d.is_float and d.itemsize == 2


def accumulator_dtype(d: DType) -> DType:
    """16-bit float sums accumulate in float32 and round once (as the LLVM renderer and the interp oracle do)."""
    return dtypes.float32 if is_half(d) else d


class KernelRenderer:
    """One kernel's linear program as a Python function; module-level constants go into `constants`."""

    def __init__(self, kernel: Kernel, lines: Linear, constants: dict[str, str]):
        self.kernel, self.lines, self.constants = kernel, lines, constants
        self.lanes = set(kernel.lanes)
        self.width = kernel.lanes[0].arg.size if kernel.lanes else 0
        self.vec = {u: not self.lanes.isdisjoint(d) for u, d in range_deps(kernel.sink).items()}
        self.names: dict[UOp, str] = {}
        self.acc: dict[UOp, str] = {}
        self.body: list[str] = []
        self.depth = 1

    def emit(self, text: str) -> None:
        self.body.append("    " * self.depth + text)

    def name(self, u: UOp, text: str) -> str:
        self.names[u] = f"v{len(self.names)}"
        self.emit(f"{self.names[u]} = {text}")
        return self.names[u]

    def const(self, value, d: DType) -> str:
        if d.is_float:
            with np.errstate(over="ignore"):  # exact in its dtype (out of range becomes inf), as LLVM's constants
                value = float(np.array(value, dtype=d.np))
            literal = f"float.fromhex({value.hex()!r})"
        else:
            literal = repr(bool(value)) if d.is_bool else str(int(value))
        text = f"T[{d.name!r}]({literal})"
        return self.constants.setdefault(text, f"c{len(self.constants)}")

    def value(self, u: UOp) -> str:
        if u.op is Ops.CONST: return self.const(u.arg.value, u.dtype)
        if u.op is Ops.RANGE: return "lane" if u in self.lanes else f"r{u.arg.number}"
        return self.names[u]

    def render(self) -> str:
        k = self.kernel
        args = [f"b{i}" for i in range(len(k.args))] + ["lo", "hi"]
        for p in (u for u in k.sink.toposort if u.op is Ops.PARAM): self.names[p] = f"b{p.arg.slot}"
        if self.width: self.emit(f"lane = rng(0, {self.width})")
        for what, u in self.lines: getattr(self, f"line_{what}")(u)
        if not self.body: self.emit("pass")
        return "\n".join([f"def {k.name}({', '.join(args)}):"] + self.body)

    # ---- loops and accumulators ----
    def line_open(self, r: UOp) -> None:
        threaded = self.kernel.thread_range >= 0 and self.kernel.ranges[self.kernel.thread_range] is r
        self.emit(f"for r{r.arg.number} in rng({'lo, hi' if threaded else f'0, {r.arg.size}'}):")
        self.depth += 1

    def line_close(self, r: UOp) -> None:
        if self.body[-1].lstrip().startswith("for "): self.emit("pass")  # an empty loop
        self.depth -= 1

    def line_acc_init(self, red: UOp) -> None:
        self.acc[red] = f"acc{len(self.acc)}"
        d = accumulator_dtype(red.dtype)
        identity = self.const(reduce_identity(red.arg.op, red.dtype), d)
        self.emit(f"{self.acc[red]} = " + (f"np.full({self.width}, {identity})" if self.vec[red.src[0]] else identity))

    def line_acc_update(self, red: UOp) -> None:
        d, x = accumulator_dtype(red.dtype), self.value(red.src[0])
        if d != red.dtype: x = f"{x}.astype(T[{d.name!r}])"
        self.emit(f"{self.acc[red]} = {code_for_op[red.arg.op](d, self.acc[red], x)}")

    def finish_reduce(self, red: UOp) -> str:
        """The REDUCE's value: its accumulator, reduced across lanes when the lane range is one of its ranges."""
        text = self.acc[red]
        if self.vec[red.src[0]] and not self.lanes.isdisjoint(red.src[1:]):
            text = (reduce_lanes_bool if red.dtype.is_bool else reduce_lanes)[red.arg.op].format(x=text)
        return f"({text}).astype(T[{red.dtype.name!r}])" if is_half(red.dtype) else text

    # ---- nodes ----
    def line_node(self, u: UOp) -> None:
        if u.op in (Ops.CONST, Ops.PARAM): return
        if u.op is Ops.REDUCE: self.name(u, self.finish_reduce(u))
        elif u.op is Ops.LOAD: self.name(u, self.load(u))
        elif u.op is Ops.STORE: self.store(u)
        else: self.name(u, self.alu(u))

    def alu(self, u: UOp) -> str:
        args = [self.value(s) for s in u.src]
        if u.op is Ops.CAST: return f"cast({args[0]}, DT[{u.dtype.name!r}])"  # (arg "in_range" too: same values)
        if u.op is Ops.BITCAST: return f"bitcast({args[0]}, DT[{u.dtype.name!r}])"
        rule = code_for_op.get(u.op)
        if rule is None:
            raise UnsupportedError(f"fake backend: no rule for {u.op.name} ({u.dtype}) in kernel {self.kernel.name}")
        return rule(u.src[-1].dtype, *args)  # (WHERE: the dtype of the values, not of the condition)

    def lanes_of(self, u: UOp, index: str) -> str:
        """Each lane's element index: consecutive from `index` when the access's arg is a lane range."""
        return f"({index} + lane)" if u.arg is not None else index

    def load(self, u: UOp) -> str:
        buf, index = self.value(u.src[0]), self.value(u.src[1])
        gate = self.value(u.src[2]) if len(u.src) > 2 else None
        if self.vec[u]: return f"load_lanes({buf}, {self.lanes_of(u, index)}" + (f", {gate})" if gate else ")")
        # a false gate reads element 0 (in bounds) and the consumer discards it, as the LLVM renderer does
        return f"{buf}[{index} if {gate} else 0]" if gate else f"{buf}[{index}]"

    def store(self, u: UOp) -> None:
        buf, index, val = (self.value(s) for s in u.src[:3])
        gate = self.value(u.src[3]) if len(u.src) > 3 else None
        if any(self.vec[s] for s in u.src[1:]) or u.arg is not None:
            self.emit(f"store_lanes({buf}, {self.lanes_of(u, index)}, {val}" + (f", {gate})" if gate else ")"))
        elif gate:
            self.emit(f"if {gate}: {buf}[{index}] = {val}")
        else:
            self.emit(f"{buf}[{index}] = {val}")


class PythonRenderer(Renderer):
    """Linear kernels -> one Python module: the constants they share, then one function per kernel."""

    def render(self, kernels: list) -> str:
        constants: dict[str, str] = {}
        functions = [KernelRenderer(k, lines, constants).render() for k, lines in kernels]
        header = "\n".join(f"{name} = {text}" for text, name in constants.items())
        return "\n\n\n".join([header] + functions) + "\n"


# ---- compiler, programs, memory, device ----

class PythonCompiler(Compiler):
    """Python source -> a marshalled code object (what a .pyc holds), cached on disk by source and target."""

    def compile_uncached(self, source: str) -> bytes:
        return marshal.dumps(compile(source, "<fnx fake kernels>", "exec"))


@functools.lru_cache(maxsize=64)
def _module(binary: bytes) -> dict:
    """The kernels of a binary: its code run once in a namespace of the helpers above."""
    namespace = dict(NAMESPACE)
    exec(marshal.loads(binary), namespace)
    return namespace


def writable(buf: Buffer) -> np.ndarray:
    """A writable flat numpy view of a buffer's memory (its host array is read-only), through its address."""
    if not buf.ptr and buf.size: raise buf.deleted_error()
    raw = (ctypes.c_char * (buf.size * buf.dtype.itemsize)).from_address(buf.ptr) if buf.size else bytearray()
    return np.frombuffer(raw, dtype=buf.dtype.np)


class PythonProgram(Program):
    """One kernel of a binary, loaded for `device`: `program(*buffers, dims=(lo, hi))` runs iterations lo..hi of
    its thread-split loop."""

    def __init__(self, name: str, binary: bytes, device: str = ""):
        self.name, self.device, self.function = name, device, _module(binary)[name]

    def __call__(self, *buffers: Buffer, dims: tuple = (0, 1)) -> None:
        arrays = [writable(b) for b in buffers]
        with np.errstate(all="ignore"):  # integers wrap and floats overflow silently, as compiled code does
            self.function(*arrays, *dims)


class FakeAllocator(HostAllocator):
    """Host memory of its own pool; no fast path to other devices: copies go through copyout / copyin."""

    def transfer(self, dst: Buffer, src: Buffer) -> bool:
        return False


@functools.lru_cache(maxsize=1)
def compiler() -> PythonCompiler:
    """The compiler both fake devices share (like the cpu devices, one code cache for the platform)."""
    key = f"fake {TARGET.key} python {sys.version_info[:3]} marshal {marshal.version}"
    return PythonCompiler(ObjectCache(config.cache_dir, key, suffix=".marshal"))


class FakeDevice(Device):
    def __init__(self, ordinal: int):
        super().__init__("fake", ordinal, FakeAllocator(f"fake:{ordinal}", HostPool()), target=TARGET,
                         renderer=PythonRenderer(), compiler=compiler())

    def executable(self, fn: UOp) -> ReplayExecutable:
        return ReplayExecutable(fn, self)

    def program(self, name: str, binary: bytes) -> PythonProgram:
        return PythonProgram(name, binary, self.name)


register_runtime(Runtime("fake", lambda: DEVICES, FakeDevice))
