"""Render linearized kernels as C for data-parallel devices: OpenCL C and CUDA C, one code-for-op table.

A kernel is launched over a grid: its thread-split loop (the optimizer's THREAD, which grid targets put on the
outermost output loop) becomes the work item's global index, `r = lo + global id`, guarded by `r < hi`; its other
loops run in the work item. Arguments: one pointer per buffer, then `lo` and `hi` (int64).

The semantics are the LLVM renderer's (fnx/backends/llvm_render.py), so every backend answers alike:
- registers hold bool as bool and float16/bfloat16 as float; memory holds bool as uchar and 16-bit floats as
  ushort, converted by the prelude's functions (round to nearest even; a NaN stays a NaN) — no fp16 extension
  needed. An inexact op on a 16-bit float is rounded to it before any other op reads it; 16-bit sums accumulate
  in float and round once;
- integer x / 0 = -1, x % 0 = x, MIN / -1 = MIN (no trap); shifts by the width or more give 0 (or the sign);
- float -> int casts saturate (NaN -> 0); float max propagates NaN and prefers +0 over -0;
- a false load gate reads nothing (the consumer discards the 0); constants are exact (hexadecimal literals).

Vector lanes (the optimizer's VECTORIZE, `kernel.lanes`: on grid targets W consecutive elements of an elementwise
kernel per work item): the arithmetic is scalar code, once per lane; a load or store of W consecutive elements
(arg = the lane RANGE) with no gate is one vector access of the memory type (`vloadW`/`vstoreW` in OpenCL, which
need only the element's alignment; `float4`-like types in CUDA, only where the first element's index is provably
a multiple of W: buffers start at least 16-byte aligned). Other lane accesses are a scalar access per lane.

Work-groups: a kernel with work-group ranges (`kernel.locals`, the optimizer's LOCAL and GROUP) launches one group
of L work items per iteration of its grid loop (`r = lo + group id`, the same in the whole group, so every barrier
is reached by all of the group) and every work-group range is the work item's local index `lid`. A REDUCE over
one finishes with a combine: each work item's partial goes to local memory, then a tree of L/2, L/4, ... 1
combines with a barrier per level, and every work item reads the total (one more barrier before the memory is
reused). A store that does not vary along `lid` is made by work item 0 only.
"""
from __future__ import annotations

import struct
from dataclasses import dataclass

import numpy as np

from fnx import dtypes
from fnx.backends.device import Renderer
from fnx.dtypes import DType
from fnx.errors import UnsupportedError
from fnx.lower.linearize import Linear, range_deps
from fnx.lower.rangeify import Kernel, reduce_identity
from fnx.lower.symbolic import terms
from fnx.lower.tensor_core import BLOCK_K, BLOCK_M, BLOCK_N, THREADS, WARPS, is_tensor_core, tensor_core_tile
from fnx.uop import Ops, UOp, postorder

_INEXACT = {Ops.ADD, Ops.MUL, Ops.DIV, Ops.RECIP, Ops.SQRT, Ops.EXP2, Ops.LOG2, Ops.SIN, Ops.REDUCE}


def is_half(d: DType) -> bool:
    return d.is_float and d.itemsize == 2


@dataclass(frozen=True)
class Dialect:
    """What differs between C-like kernel languages."""
    name: str
    kernel: str                # before `void name(...)`
    pointer: str               # qualifier of a buffer pointer
    global_id: str             # the work item's index in the grid
    int64: str
    uint64: str
    prelude: str               # type names and helper functions every module starts with
    local_id: str = ""         # the work item's index in its work-group
    group_id: str = ""         # the work-group's index in the grid
    local_memory: str = ""     # qualifier of an array shared by a work-group
    barrier: str = ""          # every work item of the group waits here; local memory writes are seen after
    group_size: str = ""       # attribute of a kernel always launched with groups of {} work items

    def c_type(self, d: DType) -> str:
        """The register type of `d`."""
        if d.is_bool: return "bool"
        if d.is_float: return "double" if d.itemsize == 8 else "float"
        return {1: ("char", "uchar"), 2: ("short", "ushort"), 4: ("int", "uint"),
                8: (self.int64, self.uint64)}[d.itemsize][d.is_unsigned]

    def mem_type(self, d: DType) -> str:
        if d.is_bool: return "uchar"
        if is_half(d): return "ushort"
        return self.c_type(d)


# the helpers both dialects share (16-bit floats, NaN-propagating max, the odd rounding of double -> float)
_COMMON = r"""
static inline float f16_to_f32(ushort h) {
  uint s = (uint)(h & 0x8000u) << 16, e = (h >> 10) & 0x1fu, m = h & 0x3ffu, bits;
  if (e == 0x1fu) bits = s | 0x7f800000u | (m << 13);
  else if (e != 0u) bits = s | ((e + 112u) << 23) | (m << 13);
  else if (m == 0u) bits = s;
  else { e = 113u; while ((m & 0x400u) == 0u) { m <<= 1; e -= 1u; } bits = s | (e << 23) | ((m & 0x3ffu) << 13); }
  return AS_FLOAT(bits);
}
static inline ushort f32_to_f16(float f) {
  uint x = AS_UINT(f), s = (x >> 16) & 0x8000u, a = x & 0x7fffffffu;
  if (a > 0x7f800000u) return (ushort)(s | 0x7e00u | ((a >> 13) & 0x3ffu));
  if (a >= 0x477ff000u) return (ushort)(s | 0x7c00u);
  if (a >= 0x38800000u) { uint r = a - 0x38000000u; r += 0xfffu + ((r >> 13) & 1u); return (ushort)(s | (r >> 13)); }
  if (a < 0x33000001u) return (ushort)s;
  uint e = a >> 23, m = (a & 0x7fffffu) | 0x800000u, shift = 126u - e, r = m >> shift;
  uint rest = m & ((1u << shift) - 1u), mid = 1u << (shift - 1u);
  if (rest > mid || (rest == mid && (r & 1u))) r += 1u;
  return (ushort)(s | r);
}
static inline float bf16_to_f32(ushort h) { return AS_FLOAT((uint)h << 16); }
static inline ushort f32_to_bf16(float f) {
  uint x = AS_UINT(f);
  if (f != f) return (ushort)(((x & 0x80000000u) | 0x7fc00000u) >> 16);
  return (ushort)((x + 0x7fffu + ((x >> 16) & 1u)) >> 16);
}
static inline float round_f16(float f) { return f16_to_f32(f32_to_f16(f)); }
static inline float round_bf16(float f) { return bf16_to_f32(f32_to_bf16(f)); }
static inline float max_f32(float a, float b) {
  if (a != a || b != b) return a + b;
  return a > b ? a : b > a ? b : (AS_UINT(a) >> 31) ? b : a;
}
static inline double max_f64(double a, double b) {
  if (a != a || b != b) return a + b;
  return a > b ? a : b > a ? b : (AS_ULONG(a) >> 63) ? b : a;
}
static inline float odd_float(double a) {
  float near = (float)a;
  double wide = (double)near;
  uint bits = AS_UINT(near);
  if ((bits & 1u) == 0u && wide != a && a == a) bits = fabs(wide) > fabs(a) ? bits - 1u : bits + 1u;
  return AS_FLOAT(bits);
}
"""

OPENCL = Dialect(
    "opencl", "__kernel", "__global", "get_global_id(0)", "long", "ulong",
    "#pragma OPENCL EXTENSION cl_khr_fp64 : enable\n"
    "#define AS_FLOAT(x) as_float(x)\n#define AS_UINT(x) as_uint(x)\n#define AS_ULONG(x) as_ulong(x)\n" + _COMMON,
    "get_local_id(0)", "get_group_id(0)", "__local", "barrier(CLK_LOCAL_MEM_FENCE);",
    "__attribute__((reqd_work_group_size({}, 1, 1)))")

CUDA = Dialect(
    "cuda", 'extern "C" __global__', "", "(blockIdx.x * (long long)blockDim.x + threadIdx.x)", "long long",
    "unsigned long long",
    "typedef unsigned char uchar;\ntypedef unsigned short ushort;\ntypedef unsigned int uint;\n"
    "typedef unsigned long long ulong;\n#define static static __device__\n"
    "#define AS_FLOAT(x) __uint_as_float(x)\n#define AS_UINT(x) __float_as_uint(x)\n"
    "#define AS_ULONG(x) ((ulong)__double_as_longlong(x))\n" + _COMMON + "#undef static\n",
    "threadIdx.x", "blockIdx.x", "__shared__", "__syncthreads();", "__launch_bounds__({})")


class KernelRenderer:
    """One kernel's linear program as one C function."""

    def __init__(self, kernel: Kernel, lines: Linear, dialect: Dialect):
        self.kernel, self.lines, self.d = kernel, lines, dialect
        self.locals, self.lanes = set(kernel.locals), set(kernel.lanes)
        self.width = kernel.locals[0].arg.size if kernel.locals else 0
        self.W = kernel.lanes[0].arg.size if kernel.lanes else 0
        self.deps = range_deps(kernel.sink) if kernel.locals or kernel.lanes else {}
        self.vec = {u: not self.lanes.isdisjoint(d) for u, d in self.deps.items()} if self.lanes else {}
        self.lane: int | None = None  # the lane being rendered (a vector node is rendered once per lane)
        self.shared: list[str] = []   # local-memory arrays, declared at the top of the function
        self.names: dict[UOp, str | list[str]] = {}  # a vector node: a name per lane
        self.count = 0
        self.acc: dict[UOp, str | list[str]] = {}
        self.body: list[str] = []
        self.depth = 1

    def emit(self, text: str) -> None:
        self.body.append("  " * self.depth + text)

    def fresh(self) -> str:
        self.count += 1
        return f"v{self.count}"

    def define(self, u: UOp, text: str, d: DType | None = None) -> str:
        name = self.names[u] = self.fresh()
        self.emit(f"{self.d.c_type(d or u.dtype)} {name} = {text};")
        return name

    # ---- constants ----
    def const(self, value, d: DType) -> str:
        if d.is_bool: return "true" if value else "false"
        if d.is_float:
            with np.errstate(over="ignore"):  # exact in its dtype (out of range: inf), as the LLVM renderer
                value = float(np.array(value, dtype=d.np))
            if d.itemsize == 8:
                return f"AS_DOUBLE_BITS({struct.unpack('<Q', struct.pack('<d', value))[0]}UL)" \
                    if not np.isfinite(value) else f"{value.hex()}"
            value = float(np.float32(value))
            if not np.isfinite(value): return f"AS_FLOAT({struct.unpack('<I', struct.pack('<f', value))[0]}u)"
            return f"{value.hex()}f"
        v = int(value)
        if d.itemsize == 8: return f"(({self.d.c_type(d)}){v}{'ULL' if d.is_unsigned else 'LL'})" if v != -2 ** 63 \
            else f"(({self.d.c_type(d)})(-9223372036854775807LL - 1))"
        if d.itemsize == 4 and not d.is_unsigned and v == -2 ** 31: return "((int)(-2147483647 - 1))"
        return f"(({self.d.c_type(d)}){v}{'u' if d.is_unsigned else ''})"

    def value(self, u: UOp) -> str:
        if u.op is Ops.CONST: return self.const(u.arg.value, u.dtype)
        if u.op is Ops.RANGE:
            if u in self.lanes: return self.const(self.lane, u.dtype)
            return "lid" if u in self.locals else f"r{u.arg.number}"
        name = self.names[u]
        return name[self.lane] if isinstance(name, list) else name

    # ---- the function ----
    def arguments(self) -> list[str]:
        """The C parameters (a pointer per buffer, then lo and hi); names each buffer PARAM `b<slot>`."""
        k, d = self.kernel, self.d
        params = [u for u in k.sink.toposort if u.op is Ops.PARAM]
        types = {p.arg.slot: p.dtype for p in params}
        for p in params: self.names[p] = f"b{p.arg.slot}"
        return [f"{d.pointer} {d.mem_type(types[i]) if i in types else 'uchar'}* b{i}".strip()
                for i in range(max(len(k.args), 1))] + [f"{d.int64} lo", f"{d.int64} hi"]

    def function(self, args: list[str], group: int, top: list[str]) -> str:
        """The whole C function: its head (launched in work-groups of `group` items when nonzero), `top`, the body."""
        d = self.d
        head = f"{d.kernel} void"
        if group:
            attribute = d.group_size.format(group)
            head = f"{d.kernel} {attribute} void" if d.name == "cuda" else f"{d.kernel} void {attribute}"
        return "\n".join([f"{head} {self.kernel.name}({', '.join(args)}) {{"] + top + self.body + ["}"])

    def render(self) -> str:
        d, args = self.d, self.arguments()
        for what, u in self.lines: getattr(self, f"line_{what}")(u)
        top = [f"  {d.int64} lid = {d.local_id};"] + [f"  {d.local_memory} {x};" for x in self.shared] \
            if self.width else []
        return self.function(args, self.width, top)

    # ---- loops and accumulators ----
    def line_open(self, r: UOp) -> None:
        i, k = r.arg.number, self.kernel
        if k.thread_range >= 0 and k.ranges[k.thread_range] is r:  # a work item (or work-group) of the grid
            if self.width:  # (exactly hi - lo groups are launched: no guard, and no barrier under a condition)
                self.emit(f"{{ {{ {self.d.int64} r{i} = lo + {self.d.group_id};")
            else:
                self.emit(f"{{ {self.d.int64} r{i} = lo + {self.d.global_id}; if (r{i} < hi) {{")
        else:
            self.emit(f"for ({self.d.int64} r{i} = 0; r{i} < {r.arg.size}; r{i}++) {{")
        self.depth += 1

    def line_close(self, r: UOp) -> None:
        self.depth -= 1
        k = self.kernel
        self.emit("} }" if k.thread_range >= 0 and k.ranges[k.thread_range] is r else "}")

    def acc_dtype(self, red: UOp) -> DType:
        return dtypes.float32 if is_half(red.dtype) else red.dtype

    def per_lane(self, u: UOp) -> range:
        """The lanes `u` is computed for: each lane when it varies along them, else once (lane None)."""
        return range(self.W) if self.vec.get(u) else range(1)

    def line_acc_init(self, red: UOp) -> None:
        d = self.acc_dtype(red)
        names = [f"acc{len(self.acc)}_{lane}" for lane in self.per_lane(red.src[0])]
        self.acc[red] = names if self.vec.get(red.src[0]) else names[0]
        for name in names:
            self.emit(f"{self.d.c_type(d)} {name} = {self.const(reduce_identity(red.arg.op, red.dtype), d)};")

    def line_prefetch(self, u: UOp) -> None:
        """Nothing: a prefetch before a reduce nest (linearize) is for CPU caches; a GPU hides a load's latency by
        running other work items meanwhile."""

    line_prefetch_next = line_prefetch

    def line_acc_update(self, red: UOp) -> None:
        d, accs = self.acc_dtype(red), self.acc[red]
        for lane in self.per_lane(red.src[0]):
            self.lane = lane if self.vec.get(red.src[0]) else None
            acc = accs[lane] if isinstance(accs, list) else accs
            self.emit(f"{acc} = {self.binary(red.arg.op, d, acc, self.value(red.src[0]))};")
        self.lane = None

    # ---- nodes ----
    def line_node(self, u: UOp) -> None:
        if u.op in (Ops.CONST, Ops.PARAM): return
        if u.op is Ops.STORE and u.arg is not None and self.vector_access(u): return self.vector_store(u)
        if u.op is Ops.LOAD and u.arg is not None and self.vector_access(u): return self.vector_load(u)
        if not self.vec.get(u): return self.node(u)
        names = []
        for self.lane in range(self.W):
            self.node(u)
            if u.op is not Ops.STORE: names.append(self.names[u])
        self.lane = None
        if names: self.names[u] = names

    def node(self, u: UOp) -> None:
        """`u` for one lane (self.lane; None outside vectors)."""
        if u.op is Ops.STORE: return self.store(u)
        if u.op is Ops.REDUCE and self.locals.intersection(u.src[1:]): return self.group_reduce(u)
        if u.op is Ops.REDUCE: text = self.reduced(u)
        elif u.op is Ops.LOAD: text = self.load(u)
        elif u.op is Ops.CAST: text = self.cast(self.value(u.src[0]), u.src[0].dtype, u.dtype)
        elif u.op is Ops.BITCAST: text = self.bitcast(self.value(u.src[0]), u.src[0].dtype, u.dtype)
        else: text = self.alu(u)
        if is_half(u.dtype) and u.op in _INEXACT and not (u.op is Ops.REDUCE and u.arg.op is Ops.MAX):
            text = self.round_to(text, u.dtype)
        self.define(u, text)

    def reduced(self, red: UOp) -> str:
        """A REDUCE's value: its accumulator, or (a reduction across the lanes) its accumulators combined."""
        acc = self.acc[red]
        if not isinstance(acc, list): return acc
        if self.vec.get(red): return acc[self.lane]
        total = acc[0]
        for other in acc[1:]: total = self.binary(red.arg.op, self.acc_dtype(red), total, other)
        return total

    # ---- vector loads and stores ----
    def vector_type(self, d: DType, n: int) -> str:
        base = self.d.mem_type(d)
        if self.d.name == "cuda":
            base = {"long long": "longlong", "unsigned long long": "ulonglong"}.get(base, base)
        return f"{base}{n}"

    def vector_access(self, u: UOp) -> bool:
        """Whether the lane access `u` (its arg is the lane RANGE) is one vector load or store."""
        gated = len(u.src) > (3 if u.op is Ops.LOAD else 4)
        size = u.src[0].dtype.itemsize
        if gated or self.W not in ((2, 4) if self.d.name == "cuda" else (2, 4, 8, 16)): return False
        if self.d.name == "opencl": return True  # (vloadn needs only the element's alignment)
        parts, const = terms(u.src[1])
        return self.W * size <= 16 and const % self.W == 0 and all(c % self.W == 0 for _, c in parts)

    def lane_field(self, lane: int) -> str:
        return "xyzw"[lane] if self.d.name == "cuda" else f"s{lane:x}"

    def vector_load(self, u: UOp) -> None:
        buf, index, t = self.value(u.src[0]), self.value(u.src[1]), self.vector_type(u.dtype, self.W)
        raw = f"vload{self.W}(0, {buf} + {index})" if self.d.name == "opencl" else f"*((const {t}*)({buf} + {index}))"
        name = self.fresh()
        self.emit(f"{t} {name} = {raw};")
        self.names[u] = [f"{name}_{lane}" for lane in range(self.W)]
        for lane, lane_name in enumerate(self.names[u]):
            text = self.from_memory(f"{name}.{self.lane_field(lane)}", u.dtype)
            self.emit(f"{self.d.c_type(u.dtype)} {lane_name} = {text};")

    def vector_store(self, u: UOp) -> None:
        buf, index, val = self.value(u.src[0]), self.value(u.src[1]), u.src[2]
        parts = []
        for self.lane in range(self.W):
            parts.append(self.to_memory(self.value(val), val.dtype))
        self.lane = None
        if self.d.name == "opencl":
            self.emit(f"vstore{self.W}(({self.vector_type(val.dtype, self.W)})({', '.join(parts)}), 0, "
                      f"{buf} + {index});")
        else:
            t = self.vector_type(val.dtype, self.W)
            self.emit(f"*(({t}*)({buf} + {index})) = make_{t}({', '.join(parts)});")

    def group_reduce(self, red: UOp) -> None:
        """The work-group's partials combined in a tree in local memory; every work item gets the total."""
        d, op = self.acc_dtype(red), red.arg.op
        mem = "uchar" if d.is_bool else self.d.c_type(d)
        tmp = f"group{len(self.shared)}"
        self.shared.append(f"{mem} {tmp}[{self.width}]")
        read = (lambda x: f"({x} != 0)") if d.is_bool else (lambda x: x)
        self.emit(f"{tmp}[lid] = {self.acc[red]};")
        self.emit(self.d.barrier)
        self.emit(f"for ({self.d.int64} s = {self.width // 2}; s > 0; s >>= 1) {{")
        combined = self.binary(op, d, read(f"{tmp}[lid]"), read(f"{tmp}[lid + s]"))
        self.emit(f"  if (lid < s) {tmp}[lid] = {combined};")
        self.emit(f"  {self.d.barrier}")
        self.emit("}")
        text = read(f"{tmp}[0]")
        self.define(red, self.round_to(text, red.dtype) if is_half(red.dtype) and op is not Ops.MAX else text)
        self.emit(self.d.barrier)  # (all have read it before a later iteration writes the memory again)

    def round_to(self, text: str, d: DType) -> str:
        return f"round_f16({text})" if d == dtypes.float16 else f"round_bf16({text})"

    def index(self, u: UOp) -> str:
        """A load's or store's element index for the lane being rendered (a lane access: its first plus the lane)."""
        index = self.value(u.src[1])
        return f"({index} + {self.lane})" if u.arg is not None else index

    def load(self, u: UOp) -> str:
        buf, index = self.value(u.src[0]), self.index(u)
        raw = self.from_memory(f"{buf}[{index}]", u.dtype)
        if len(u.src) > 2: return f"({self.value(u.src[2])} ? {raw} : {self.const(0, u.dtype)})"
        return raw

    def from_memory(self, text: str, d: DType) -> str:
        if d.is_bool: return f"({text} != 0)"
        if d == dtypes.float16: return f"f16_to_f32({text})"
        if d == dtypes.bfloat16: return f"bf16_to_f32({text})"
        return text

    def to_memory(self, text: str, d: DType) -> str:
        if d.is_bool: return f"(uchar)({text})"
        if d == dtypes.float16: return f"f32_to_f16({text})"
        if d == dtypes.bfloat16: return f"f32_to_bf16({text})"
        return text

    def store(self, u: UOp) -> None:
        buf, val = u.src[0], u.src[2]
        text = f"{self.value(buf)}[{self.index(u)}] = {self.to_memory(self.value(val), val.dtype)};"
        gates = [self.value(u.src[3])] if len(u.src) > 3 else []
        if self.width and not self.locals & self.deps[u]: gates.append("lid == 0")  # (the same in the whole group)
        self.emit(f"if ({' && '.join(gates)}) {text}" if gates else text)

    def alu(self, u: UOp) -> str:
        args = [self.value(s) for s in u.src]
        src = u.src[0].dtype
        op = u.op
        if op is Ops.WHERE: return f"({args[0]} ? {args[1]} : {args[2]})"
        if op is Ops.RECIP: return f"({self.const(1.0, u.dtype)} / {args[0]})"
        if op in (Ops.SQRT, Ops.EXP2, Ops.LOG2, Ops.SIN, Ops.TRUNC):
            return f"{op.name.lower()}({args[0]})"
        if op is Ops.CMPLT: return f"({args[0]} < {args[1]})"
        if op is Ops.CMPNE: return f"({args[0]} != {args[1]})"
        if op in (Ops.AND, Ops.OR, Ops.XOR):
            return f"({args[0]} {dict(AND='&', OR='|', XOR='^')[op.name]} {args[1]})"
        if op in (Ops.DIV, Ops.MOD) and not src.is_float:
            if u.src[1].op is Ops.CONST and u.src[1].arg.value not in (0, -1) and not src.is_bool:
                return f"({args[0]} {'/' if op is Ops.DIV else '%'} {args[1]})"  # (a divisor that cannot trap)
            return self.divide(op, src, *args)
        if op in (Ops.SHL, Ops.SHR): return self.shift(op, src, *args)
        if op in (Ops.ADD, Ops.MUL, Ops.MAX, Ops.DIV, Ops.MOD): return self.binary(op, src, *args)
        raise UnsupportedError(f"{self.d.name} renderer: no rule for {op.name} ({u.dtype}) in kernel "
                               f"{self.kernel.name}")

    def binary(self, op: Ops, d: DType, a: str, b: str) -> str:
        """ADD, MUL, MAX (also a reduction's update), and float DIV and MOD."""
        if d.is_bool: return f"({a} {'&' if op is Ops.MUL else '|'} {b})"
        if op in (Ops.ADD, Ops.MUL) and d.is_int and not d.is_unsigned and d.itemsize >= 4:
            u = self.unsigned(d)  # signed overflow is undefined in C: wrap in unsigned arithmetic
            return f"(({self.d.c_type(d)})(({u})({a}) {'+' if op is Ops.ADD else '*'} ({u})({b})))"
        if op is Ops.ADD: return f"({a} + {b})"
        if op is Ops.MUL: return f"({a} * {b})"
        if op is Ops.DIV: return f"({a} / {b})"
        if op is Ops.MOD: return f"fmod({a}, {b})"
        if d.is_float: return f"max_f{8 * max(d.itemsize, 4)}({a}, {b})"
        return f"({a} > {b} ? {a} : {b})"

    def divide(self, op: Ops, d: DType, a: str, b: str) -> str:
        if d.is_bool: return a if op is Ops.DIV else "false"
        zero, one, sign = self.const(0, d), self.const(1, d), "/" if op is Ops.DIV else "%"
        if d.is_unsigned:
            inner = f"({a} {sign} ({b} == {zero} ? {one} : {b}))"
        else:  # MIN / -1 overflows (and traps): x / -1 is the negation (wrapping), x % -1 is 0
            minus = self.const(-1, d)
            plain = f"({a} {sign} ({b} == {zero} || {b} == {minus} ? {one} : {b}))"
            negated = f"({self.d.c_type(d)})({self.unsigned(d)})(0u - ({self.unsigned(d)})({a}))"
            inner = f"({b} == {minus} ? {negated if op is Ops.DIV else zero} : {plain})"
        return f"({b} == {zero} ? {self.const(-1, d) if op is Ops.DIV else a} : {inner})"

    def unsigned(self, d: DType) -> str:
        return self.d.c_type({1: dtypes.uint8, 2: dtypes.uint16, 4: dtypes.uint32, 8: dtypes.uint64}[d.itemsize])

    def shift(self, op: Ops, d: DType, a: str, b: str) -> str:
        bits, t = 8 * d.itemsize, self.d.c_type(d)
        big = f"(({self.unsigned(d)})({b}) >= {bits}u)"
        if op is Ops.SHL:
            return f"({big} ? {self.const(0, d)} : ({t})(({self.unsigned(d)})({a}) << ({b})))"
        overflow = self.const(0, d) if d.is_unsigned else f"({a} < {self.const(0, d)} ? {self.const(-1, d)} : " \
                                                            f"{self.const(0, d)})"
        return f"({big} ? {overflow} : ({t})({a} >> ({b})))"

    def cast(self, a: str, src: DType, d: DType) -> str:
        t = self.d.c_type(d)
        if d.is_bool: return f"({a} != {self.const(0, src)})"
        if src.is_float and d.is_float:
            if src.itemsize == 8 and is_half(d): return self.round_to(f"odd_float({a})", d)
            out = f"(({t})({a}))"
            return self.round_to(out, d) if is_half(d) else out
        if src.is_float:  # saturating (NaN -> 0, beyond the range -> its end), as XLA
            bits = 8 * d.itemsize
            lo, top = (0.0, 2.0 ** bits) if d.is_unsigned else (-(2.0 ** (bits - 1)), 2.0 ** (bits - 1))
            reg = dtypes.float32 if is_half(src) else src
            return (f"({a} != {a} ? {self.const(0, d)} : {a} >= {self.const(top, reg)} ? {self.const(int(top) - 1, d)}"
                    f" : {a} < {self.const(lo, reg)} ? {self.const(int(lo), d)} : ({t})({a}))")
        if d.is_float:
            if is_half(d) and src.itemsize >= 4:  # through double and odd rounding: float could round twice
                return self.round_to(f"odd_float((double)({a}))", d)
            out = f"(({t})({a}))"
            return self.round_to(out, d) if is_half(d) else out
        return f"(({t})({a}))"

    def bitcast(self, a: str, src: DType, d: DType) -> str:
        bits = {1: "uchar", 2: "ushort", 4: "uint", 8: self.d.uint64}[d.itemsize]
        if src == dtypes.float16: raw = f"f32_to_f16({a})"
        elif src == dtypes.bfloat16: raw = f"f32_to_bf16({a})"
        elif src.is_bool: raw = f"(uchar)({a})"
        elif src.is_float: raw = f"AS_UINT({a})" if src.itemsize == 4 else f"AS_ULONG({a})"
        else: raw = f"(({bits})({a}))"
        if d == dtypes.float16: return f"f16_to_f32({raw})"
        if d == dtypes.bfloat16: return f"bf16_to_f32({raw})"
        if d.is_bool: return f"({raw} != 0)"
        if d.is_float: return f"AS_FLOAT({raw})" if d.itemsize == 4 else f"AS_DOUBLE_BITS({raw})"
        return f"(({self.d.c_type(d)})({raw}))"


_LD = BLOCK_K + 8  # 16-bit elements per row of a shared operand tile (padded: rows start in other banks)


class TensorCoreRenderer(KernelRenderer):
    """A tensor-core kernel (fnx/lower/tensor_core.py) as one C function: a block of THREADS threads per output
    tile of BLOCK_M x BLOCK_N. Per slab of BLOCK_K along k, the block computes the slab's A and B elements into
    shared memory as 16-bit floats (A row by row, B column by column: a thread's two k-neighbours are one 32-bit
    word), then each warp multiplies its 32 x 32 part with `mma.m16n8k16` (float32 accumulators in registers, in
    the fragment layout of the PTX ISA). At the end each thread runs the kernel's epilogue for its accumulators.

    On OpenCL (no tensor cores) `mma_*` is emulated: each work item writes its fragments to local memory at the
    places the same layout names and computes its accumulators from there. Every index, mask and fragment load
    is then the CUDA kernel's own, which lets the op suite check them on any OpenCL device."""

    def __init__(self, kernel: Kernel, lines: Linear, dialect: Dialect):
        super().__init__(kernel, lines, dialect)
        self.tile = tensor_core_tile(kernel)

    def block(self, head: str, before: list[str], nodes: list[UOp], after=lambda: []) -> None:
        """`head { before; nodes (sources first); after() }`: the names made for the nodes stay in the block."""
        outer = dict(self.names)
        self.emit(f"{head} {{")
        self.depth += 1
        for line in before: self.emit(line)
        for u in nodes:
            if u.op not in (Ops.RANGE, Ops.SINK) and u not in self.names: self.line_node(u)
        for line in after(): self.emit(line)
        self.depth -= 1
        self.emit("}")
        self.names = outer

    def unflatten(self, flat: str, ranges: tuple) -> list[str]:
        """C declaring each of `ranges` (outermost first) from their flattened index `flat`."""
        lines, inner = [], 1
        for r in reversed(ranges):
            div = f"{flat} / {inner}" if inner > 1 else flat
            lines.append(f"{self.d.int64} r{r.arg.number} = {div} % {r.arg.size};" if r is not ranges[0]
                         else f"{self.d.int64} r{r.arg.number} = {div};")
            inner *= r.arg.size
        return lines

    def render(self) -> str:
        k, d, t = self.kernel, self.d, self.tile
        cuda, i64, args = d.name == "cuda", d.int64, self.arguments()
        size_m, size_n, size_k = t.rows, t.columns, t.depth
        emit = self.emit
        unroll = lambda: emit("#pragma unroll") if cuda else None  # noqa: E731  (registers, not an array in memory)
        emit(f"int tid = (int){d.local_id}, warp = tid >> 5, lane = tid & 31, g = lane >> 2, q = lane & 3;")
        emit("int wm = warp >> 1, wn = warp & 1;")
        emit(f"{i64} blk = lo + {d.group_id};")
        emit(f"{i64} tn = blk % {-(-size_n // BLOCK_N)}; blk /= {-(-size_n // BLOCK_N)};")
        emit(f"{i64} tm = blk % {-(-size_m // BLOCK_M)}; blk /= {-(-size_m // BLOCK_M)};")
        for r in reversed(t.batch): emit(f"{i64} r{r.arg.number} = blk % {r.arg.size}; blk /= {r.arg.size};")
        emit("float acc[2][4][4];")
        unroll()
        emit("for (int i = 0; i < 32; i++) acc[i >> 4][(i >> 2) & 3][i & 3] = 0.0f;")
        emit(f"for ({i64} k0 = 0; k0 < {size_k}; k0 += {BLOCK_K}) {{")
        self.depth += 1
        halves = "(ushort*)" if cuda else "(__local ushort*)"
        for operand, tile, rows, size, ranges, start in ((t.a, "As", BLOCK_M, size_m, t.m, "tm"),  # As[i][j]: row i,
                                                         (t.b, "Bs", BLOCK_N, size_n, t.n, "tn")):  # Bs[i][j]: column i
            where = ("e / {K}", "e % {K}") if operand is t.a else ("e % {R}", "e / {R}")
            i, j = (w.format(K=BLOCK_K, R=rows) for w in where)
            emit(f"for (int e = tid; e < {rows * BLOCK_K}; e += {THREADS}) {{")
            self.depth += 1
            emit(f"int i = {i}, j = {j};")
            emit(f"{i64} at = {start} * {rows} + i, kk = k0 + j;")
            emit("float v = 0.0f;")
            self.block(f"if (at < {size} && kk < {size_k})", self.unflatten("at", ranges) + self.unflatten("kk", t.k),
                       postorder(operand), lambda operand=operand: [f"v = {self.value(operand)};"])
            emit(f"({halves}{tile})[i * {_LD} + j] = {self.to_memory('v', t.dtype)};")  # (k: j)
            self.depth -= 1
            emit("}")
        emit(d.barrier)
        mma = f"mma_{'f16' if t.dtype == dtypes.float16 else 'bf16'}"
        scratch = "" if cuda else ", Am + warp * 256, Bm + warp * 128, lane"
        emit(f"for (int s = 0; s < {BLOCK_K}; s += 16) {{")
        self.depth += 1
        emit("uint af[2][4], bf[4][2];")
        unroll()
        emit("for (int mi = 0; mi < 2; mi++) {")
        emit(f"  int at = (wm * 32 + mi * 16 + g) * {_LD} + s + q * 2;  /* row g (+8), k q*2 (+8) */")
        emit(f"  af[mi][0] = As[at >> 1]; af[mi][1] = As[(at + {8 * _LD}) >> 1];")
        emit(f"  af[mi][2] = As[(at + 8) >> 1]; af[mi][3] = As[(at + {8 * _LD} + 8) >> 1];")
        emit("}")
        unroll()
        emit("for (int nj = 0; nj < 4; nj++) {")
        emit(f"  int bt = (wn * 32 + nj * 8 + g) * {_LD} + s + q * 2;  /* column g, k q*2 (+8) */")
        emit("  bf[nj][0] = Bs[bt >> 1]; bf[nj][1] = Bs[(bt + 8) >> 1];")
        emit("}")
        unroll()
        emit("for (int i = 0; i < 8; i++)")
        emit(f"  {mma}(acc[i >> 2][i & 3], af[i >> 2], bf[i & 3]{scratch});")
        self.depth -= 1
        emit("}")
        emit(d.barrier)
        self.depth -= 1
        emit("}")
        epilogue = postorder(k.sink, None, {t.reduce})
        unroll()
        emit("for (int i = 0; i < 32; i++) {")
        self.depth += 1
        emit("int mi = i >> 4, nj = (i >> 2) & 3, c = i & 3;  /* c0, c1: row g; c2, c3: row g + 8 */")
        emit(f"{i64} row = tm * {BLOCK_M} + wm * 32 + mi * 16 + g + (c >> 1) * 8;")
        emit(f"{i64} col = tn * {BLOCK_N} + wn * 32 + nj * 8 + q * 2 + (c & 1);")
        self.names[t.reduce] = "acc[mi][nj][c]"
        self.block(f"if (row < {size_m} && col < {size_n})", self.unflatten("row", t.m) + self.unflatten("col", t.n),
                   epilogue)
        self.depth -= 1
        emit("}")
        shared = [f"uint As[{BLOCK_M * _LD // 2}]", f"uint Bs[{BLOCK_N * _LD // 2}]"]
        if not cuda: shared += [f"float Am[{WARPS * 256}]", f"float Bm[{WARPS * 128}]"]
        return self.function(args, THREADS, [f"  {d.local_memory} {x};" for x in shared])


def _mma(dialect: Dialect, kind: str) -> str:
    """`mma_f16` / `mma_bf16`: d += a @ b for one warp's m16n8k16 fragments (a: 4 words, b: 2, d: 4 floats)."""
    if dialect.name == "cuda":
        return (f"static __device__ __forceinline__ void mma_{kind}(float* d, const uint* a, const uint* b) {{\n"
                f'  asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.{kind}.{kind}.f32 {{%0, %1, %2, %3}}, '
                '{%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};"\n'
                '    : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])\n'
                '    : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));\n}\n')
    # the emulation: each work item places its fragments where the PTX ISA's layout says, then reads its outputs'
    wide = "f16_to_f32" if kind == "f16" else "bf16_to_f32"
    return (f"static void mma_{kind}(float* d, const uint* a, const uint* b, __local float* am, __local float* bm,"
            " int lane) {\n"
            "  int g = lane >> 2, q = lane & 3;\n"
            "  for (int i = 0; i < 8; i++)  /* a_i: row g (+8: i = 2, 3, 6, 7), column q*2 + (i & 1) (+8 from 4) */\n"
            "    am[(g + ((i & 2) ? 8 : 0)) * 16 + q * 2 + (i & 1) + ((i & 4) ? 8 : 0)] = "
            f"{wide}((ushort)((i & 1) ? a[i >> 1] >> 16 : a[i >> 1] & 0xffffu));\n"
            "  for (int i = 0; i < 4; i++)  /* b_i: row (k) q*2 + (i & 1) (+8 for i = 2, 3), column g */\n"
            "    bm[(q * 2 + (i & 1) + ((i & 2) ? 8 : 0)) * 8 + g] = "
            f"{wide}((ushort)((i & 1) ? b[i >> 1] >> 16 : b[i >> 1] & 0xffffu));\n"
            "  barrier(CLK_LOCAL_MEM_FENCE);\n"
            "  for (int i = 0; i < 4; i++) {  /* c_i: row g (+8 for i = 2, 3), column q*2 + (i & 1) */\n"
            "    int row = g + ((i & 2) ? 8 : 0), col = q * 2 + (i & 1);\n"
            "    float s = 0.0f;\n"
            "    for (int j = 0; j < 16; j++) s += am[row * 16 + j] * bm[j * 8 + col];\n"
            "    d[i] += s;\n"
            "  }\n"
            "  barrier(CLK_LOCAL_MEM_FENCE);\n}\n")


class CRenderer(Renderer):
    """Linear kernels -> one C module of `dialect`: the prelude, then one function per kernel."""

    def __init__(self, dialect: Dialect):
        self.dialect = dialect

    def render(self, kernels: list) -> str:
        functions = [(TensorCoreRenderer if is_tensor_core(k) else KernelRenderer)(k, lines, self.dialect).render()
                     for k, lines in kernels]
        kinds = {tensor_core_tile(k).dtype for k, _ in kernels if is_tensor_core(k)}
        helpers = [_mma(self.dialect, "f16" if d == dtypes.float16 else "bf16") for d in sorted(kinds, key=str)]
        return "\n\n".join([self.dialect.prelude + _DOUBLE_BITS[self.dialect.name]] + helpers + functions) + "\n"


_DOUBLE_BITS = {"opencl": "#define AS_DOUBLE_BITS(x) as_double((ulong)(x))\n",
                "cuda": "#define AS_DOUBLE_BITS(x) __longlong_as_double((long long)(x))\n"}
