"""Render a linearized kernel as LLVM IR text.

Registers hold bool as i1 and float16/bfloat16 as float: an op computes in float32 and its result is rounded to
its 16-bit dtype before any other op reads it (as JAX and numpy round every op; 16-bit sums accumulate in float32
and round once, as JAX's do); memory holds bool as i8, float16 as half and bfloat16 as i16. Integer division by
zero and shifts by out-of-range amounts are defined (x/0 = -1, x%0 = x, oversized shifts give 0 or the sign) so
generated code never traps or reads poison. A kernel is `void @name(ptr %buf0, ..., i64 %start, i64 %end)`;
[start, end) bounds its thread-split loop.

Vector lanes: when the optimizer made ranges the kernel's `lanes`, every value that depends on one is an LLVM
vector `<W x T>` (scalars that meet vectors are splatted). A LOAD/STORE whose arg is a lane range reads/writes W
consecutive elements from its index (one vector instruction); other vector addresses become gathers/scatters; a gate
that varies across lanes becomes the mask of a masked load/store. A REDUCE over the lane range keeps a vector
accumulator and finishes with a horizontal reduction.
"""
from __future__ import annotations

import functools
import platform
import struct

import numpy as np

from fnx import dtypes
from fnx.dtypes import DType
from fnx.errors import UnsupportedError
from fnx.lower.linearize import Linear, range_deps
from fnx.lower.rangeify import Kernel, reduce_identity
from fnx.lower.symbolic import terms
from fnx.uop import Ops, UOp


@functools.cache
def transpose_network(w: int, itemsize: int) -> tuple[list, list[int]]:
    """How w vectors of w elements (the rows of a block) become its w columns: stages (d, (low mask, high mask)),
    each turning every pair of vectors a and a + d (a without bit d) into two two-input shuffles of them, and
    the vector that ends up holding each column. 32-bit elements first interleave within 128-bit lanes, 1 and
    then 2 at a time (unpcklps, shufps), then whole lanes: one instruction a shuffle on AVX2, where arbitrary
    masks cost several (8 x 8 floats: 24 instead of 256). Otherwise (and if that does not come out a transpose)
    log2(w) rounds of block swaps: for d = w/2 .. 1, vectors a and a + d exchange their d x d off-diagonal blocks."""
    def interleave(group: int, span: int, start: int) -> list[int]:  # groups of `group` from each, within spans
        return [x for base in range(0, w, span) for k in range(start, start + span // 2, group)
                for x in (*range(base + k, base + k + group), *range(w + base + k, w + base + k + group))]
    swaps = [(d, ([c if not c & d else w + c - d for c in range(w)], [c + d if not c & d else w + c for c in range(w)]))
             for d in (1 << b for b in reversed(range(w.bit_length() - 1)))]
    candidates = [swaps]
    if itemsize == 4 and w in (4, 8, 16):
        lanes = [(1, (interleave(1, 4, 0), interleave(1, 4, 2))), (2, (interleave(2, 4, 0), interleave(2, 4, 2)))]
        blocks = (interleave(4, w, 0), interleave(4, w, w // 2))
        candidates.insert(0, lanes + {4: [], 8: [(4, blocks)], 16: [(8, blocks), (4, blocks)]}[w])
    block = np.arange(w * w).reshape(w, w)
    for stages in candidates:
        rows = shuffled(list(block), stages)
        where = {c: v for v, row in enumerate(rows) for c in range(w) if (row == block[:, c]).all()}
        if len(where) == w: return stages, [where[c] for c in range(w)]
    raise AssertionError(f"no transpose network for {w} lanes")


def shuffled(rows: list, stages: list) -> list:
    """numpy rows through a transpose network's stages, each as the renderer emits it (`transpose_network`)."""
    for d, (low, high) in stages:
        for a in range(len(rows)):
            if not a & d:
                both = np.concatenate([rows[a], rows[a + d]])
                rows[a], rows[a + d] = both[low], both[high]
    return rows


def mem_type(d: DType) -> str:
    if d.is_bool: return "i8"
    if d == dtypes.float16: return "half"
    if d == dtypes.bfloat16: return "i16"
    if d.is_float: return "double" if d.itemsize == 8 else "float"
    return f"i{8 * d.itemsize}"


def reg_type(d: DType) -> str:
    if d.is_bool: return "i1"
    if d.is_float: return "double" if d.itemsize == 8 else "float"
    return f"i{8 * d.itemsize}"


def const_text(value, d: DType) -> str:
    if d.is_bool: return "true" if value else "false"
    if d.is_float:
        v = float(value)
        if reg_type(d) == "float":  # float constants must be exact in their dtype: round (out of range becomes inf)
            with np.errstate(over="ignore"):
                v = float(np.array(v, dtype=d.np))
        return "0x" + struct.pack(">d", v).hex().upper()
    return str(int(value))


_FLOAT_INTRINSIC = {Ops.SQRT: "sqrt", Ops.EXP2: "exp2", Ops.LOG2: "log2", Ops.SIN: "sin", Ops.TRUNC: "trunc"}

_X86 = platform.machine().lower() in ("x86_64", "amd64")  # (the host compiles for itself: FNX_CPU_TARGET is x86 too)

# ops whose float32 result a 16-bit float must round; MAX, WHERE, TRUNC, MOD (fmod is exact), loads and bitcasts of
# 16-bit values are exact already and casts round themselves
_INEXACT = {Ops.ADD, Ops.MUL, Ops.DIV, Ops.RECIP, Ops.SQRT, Ops.EXP2, Ops.LOG2, Ops.SIN, Ops.REDUCE}


def is_half(d: DType) -> bool:
    """float16 or bfloat16: held in a float register, rounded to d after every inexact op."""
    return d.is_float and d.itemsize == 2


def rounds(u: UOp) -> bool:
    """Whether u's float32 register must be rounded to its 16-bit dtype before another op reads it."""
    return is_half(u.dtype) and u.op in _INEXACT and not (u.op is Ops.REDUCE and u.arg.op is Ops.MAX)


CACHE_LINE = 64  # bytes a prefetch brings in (x86-64's and most ARM cores' line; a smaller one only prefetches less)


class Renderer:
    """Turns one kernel's linear program into an LLVM function."""

    def __init__(self, kernel: Kernel, lines: Linear):
        self.kernel, self.lines = kernel, lines
        loaded = {u.src[0].arg.slot for u in kernel.sink.toposort if u.op is Ops.LOAD}
        self.stream, self.streamed = kernel.stream - loaded, False  # (an accumulating kernel reads its output back)
        self.body: list[str] = []
        self.names: dict[UOp, str] = {}
        self.declares: set[str] = set()
        self.counter = 0
        self.block = "entry"
        self.loops: dict[UOp, tuple] = {}
        self.acc: dict[UOp, str] = {}
        if kernel.locals:
            raise UnsupportedError(f"LLVM renderer: kernel {kernel.name} has work-group ranges (LOCAL/GROUP): a "
                                   "schedule for grid devices (OpenCL, CUDA), not the CPU")
        self.lanes = set(kernel.lanes)
        self.W = kernel.lanes[0].arg.size if kernel.lanes else 0
        deps = range_deps(kernel.sink)
        self.vec = {u: not self.lanes.isdisjoint(d) for u, d in deps.items()}
        self.w = 0   # the vector width of the node being rendered (0: scalar)
        self.blocks = self.transposed_blocks()
        self.columns: dict[UOp, list[str]] = {}  # a transposed block's first load -> its columns' registers

    def tmp(self) -> str:
        self.counter += 1
        return f"%t{self.counter}"

    def emit(self, text: str) -> str:
        name = self.tmp()
        self.body.append(f"  {name} = {text}")
        return name

    def label(self, name: str) -> None:
        self.body.append(f"{name}:")
        self.block = name

    def intrinsic(self, name: str, ret: str, args: list[str], arg_types: list[str], flags: str = "") -> str:
        self.declares.add(f"declare {ret} @{name}({', '.join(arg_types)})")
        return self.emit(f"call{flags} {ret} @{name}({', '.join(f'{t} {a}' for t, a in zip(arg_types, args))})")

    # ---- types and constants in the current width ----
    def vt(self, scalar: str, w: int | None = None) -> str:
        w = self.w if w is None else w
        return f"<{w} x {scalar}>" if w else scalar

    def rt(self, d: DType) -> str:
        return self.vt(reg_type(d))

    def c(self, value, d: DType) -> str:
        text = const_text(value, d)
        return f"splat ({reg_type(d)} {text})" if self.w else text

    def sfx(self, scalar: str) -> str:
        """An intrinsic's type suffix: f32, i64, v16f32, ..."""
        base = {"float": "f32", "double": "f64", "half": "f16"}.get(scalar, scalar)
        return f"v{self.w}{base}" if self.w else base

    def splat(self, value: str, scalar: str) -> str:
        """A scalar register broadcast to a vector of the current width."""
        if not value.startswith("%"): return f"splat ({scalar} {value})"
        # emitted at each use (a cached one may sit in a block that does not dominate this one); LLVM merges them
        one = self.emit(f"insertelement <{self.w} x {scalar}> poison, {scalar} {value}, i64 0")
        return self.emit(f"shufflevector <{self.w} x {scalar}> {one}, <{self.w} x {scalar}> poison, "
                         f"<{self.w} x i32> zeroinitializer")

    # ---- values ----
    def value(self, u: UOp) -> str:
        """u's register, as a vector when the node being rendered is one."""
        if u.op is Ops.CONST: return self.c(u.arg.value, u.dtype)
        if u.op is Ops.RANGE and u in self.lanes:
            return "<" + ", ".join(f"i64 {i}" for i in range(self.W)) + ">" if self.w else "0"
        name = self.names[u]
        return self.splat(name, reg_type(u.dtype)) if self.w and not self.vec.get(u) else name

    def render(self) -> str:
        k = self.kernel
        params = sorted({u.arg.slot: u for u in k.sink.toposort if u.op is Ops.PARAM}.items())
        nargs = max(len(k.args), 1)
        for _, p in params: self.names[p] = f"%buf{p.arg.slot}"
        sig = ", ".join(f"ptr noalias %buf{i}" for i in range(nargs))
        self.body.append(f"define void @{k.name}({sig}, i64 %start, i64 %end) #0 {{")
        self.label("entry")
        for what, u in self.lines:
            self.w = self.W if self.vec.get(u) else 0
            getattr(self, f"line_{what}")(u)
        if self.streamed and _X86:  # non-temporal stores are weakly ordered: made visible before the caller reads
            self.intrinsic_void("llvm.x86.sse.sfence", [], [])
        elif self.streamed:
            self.body.append("  fence seq_cst")
        self.body.append("  ret void")
        self.body.append("}")
        return "\n".join(self.body)

    # ---- loops ----
    def line_open(self, r: UOp) -> None:
        i = r.arg.number
        threaded = self.kernel.thread_range >= 0 and self.kernel.ranges[self.kernel.thread_range] is r
        lo, hi = ("%start", "%end") if threaded else ("0", str(r.arg.size))
        pre = self.block
        guard = self.emit(f"icmp slt i64 {lo}, {hi}")
        self.body.append(f"  br i1 {guard}, label %L{i}, label %X{i}")
        self.label(f"L{i}")
        self.names[r] = f"%r{i}"
        phis = [(len(self.body), None, lo, None)]  # (line to patch, reduce node, value on entry, phi name)
        self.body.append("")
        for red in self.acc:  # an accumulator is carried around every reduce loop it spans
            if r in red.src[1:]:
                name = self.tmp()
                phis.append((len(self.body), red, self.acc[red], name))
                self.body.append("")
                self.acc[red] = name
        self.loops[r] = (pre, hi, phis)

    def line_close(self, r: UOp) -> None:
        i, (pre, hi, phis) = r.arg.number, self.loops[r]
        self.body.append(f"  %r{i}.next = add nsw i64 %r{i}, 1")
        cont = self.emit(f"icmp slt i64 %r{i}.next, {hi}")
        latch = self.block
        self.body.append(f"  br i1 {cont}, label %L{i}, label %X{i}")
        self.label(f"X{i}")
        self.body[phis[0][0]] = f"  %r{i} = phi i64 [{phis[0][2]}, %{pre}], [%r{i}.next, %{latch}]"
        for line, red, entry, name in phis[1:]:
            t = self.acc_type(red)
            self.body[line] = f"  {name} = phi {t} [{entry}, %{pre}], [{self.acc[red]}, %{latch}]"
            self.acc[red] = self.emit(f"phi {t} [{entry}, %{pre}], [{self.acc[red]}, %{latch}]")

    def acc_type(self, red: UOp) -> str:
        return self.vt(reg_type(red.dtype), self.W if self.vec.get(red.src[0]) else 0)

    def line_acc_init(self, red: UOp) -> None:
        self.w = self.W if self.vec.get(red.src[0]) else 0
        self.acc[red] = self.c(reduce_identity(red.arg.op, red.dtype), red.dtype)

    def line_acc_update(self, red: UOp) -> None:
        # reassociation lets LLVM keep partial sums in independent registers (like numpy's pairwise sums, the
        # order of float additions then differs from a strict left-to-right loop)
        self.w = self.W if self.vec.get(red.src[0]) else 0
        x = red.src[0]
        # a sum of products: fused multiply-add (not for 16-bit floats, whose product is rounded before the sum)
        if red.arg.op is Ops.ADD and x.op is Ops.MUL and red.dtype.is_float and not is_half(red.dtype):
            t = self.rt(red.dtype)
            self.acc[red] = self.intrinsic(f"llvm.fmuladd.{self.sfx(reg_type(red.dtype))}", t,
                                           [self.value(x.src[0]), self.value(x.src[1]), self.acc[red]], [t, t, t])
            return
        # a level of a blocked sum (optimize.block_sums) adds its inner level's sum as it is: reassociating would
        # let LLVM fold an unrolled inner level back into one long chain of additions
        self.acc[red] = self.alu(red.arg.op, red.dtype, [self.acc[red], self.value(x)], red.dtype,
                                 flags=" nsz" if x.op is Ops.REDUCE else " reassoc nsz")

    def finish_reduce(self, red: UOp) -> str:
        """The REDUCE's value: its accumulator, reduced across lanes when the lane range is one of its ranges."""
        acc = self.acc[red]
        if not (self.vec.get(red.src[0]) and not self.lanes.isdisjoint(red.src[1:])): return acc
        d, op, s = red.dtype, red.arg.op, reg_type(red.dtype)
        self.w = self.W
        vt, suffix = self.vt(s), self.sfx(s)
        if d.is_float and op is Ops.ADD:
            return self.intrinsic(f"llvm.vector.reduce.fadd.{suffix}", s, [const_text(-0.0, d), acc], [s, vt],
                                  " reassoc nsz")
        if d.is_float and op is Ops.MUL:
            return self.intrinsic(f"llvm.vector.reduce.fmul.{suffix}", s, [const_text(1.0, d), acc], [s, vt],
                                  " reassoc nsz")
        if d.is_float: return self.intrinsic(f"llvm.vector.reduce.fmaximum.{suffix}", s, [acc], [vt])
        name = {Ops.ADD: "or" if d.is_bool else "add", Ops.MUL: "and" if d.is_bool else "mul",
                Ops.MAX: "or" if d.is_bool else "umax" if d.is_unsigned else "smax"}[op]
        return self.intrinsic(f"llvm.vector.reduce.{name}.{suffix}", s, [acc], [vt])

    # ---- nodes ----
    def line_node(self, u: UOp) -> None:
        if u.op in (Ops.CONST, Ops.PARAM) or u in self.lanes: return
        if u.op is Ops.REDUCE: self.names[u] = self.finish_reduce(u)
        elif u.op is Ops.LOAD: self.names[u] = self.load(u)
        elif u.op is Ops.STORE: self.store(u)
        elif (fused := self.fused_product(u)) is not None: self.names[u] = fused
        elif (quotient := self.constant_divide(u)) is not None: self.names[u] = quotient
        elif u.op is Ops.CAST and u.arg == "in_range" and u.src[0].dtype.is_float and u.dtype.is_int:
            # integral and in range (lax._convert_in_range): no clamp; `freeze` makes a NaN's poison an integer
            kind, t = "fptoui" if u.dtype.is_unsigned else "fptosi", self.rt(u.dtype)
            converted = self.emit(f"{kind} {self.rt(u.src[0].dtype)} {self.value(u.src[0])} to {t}")
            self.names[u] = self.emit(f"freeze {t} {converted}")
        else: self.names[u] = self.alu(u.op, u.dtype, [self.value(s) for s in u.src], u.src[0].dtype)
        if rounds(u):
            self.w = self.W if self.vec.get(u) else 0  # a REDUCE across lanes finishes as a scalar
            self.names[u] = self.round_to(self.names[u], u.dtype)

    def fused_product(self, u: UOp) -> str | None:
        """ADD marked "contract" of a float product and another value as one llvm.fmuladd (rounded once)."""
        if u.op is not Ops.ADD or u.arg != "contract" or not u.dtype.is_float or is_half(u.dtype): return None
        mul, other = (u.src[0], u.src[1]) if u.src[0].op is Ops.MUL else (u.src[1], u.src[0])
        if mul.op is not Ops.MUL: return None
        t = self.rt(u.dtype)
        return self.intrinsic(f"llvm.fmuladd.{self.sfx(reg_type(u.dtype))}", t,
                              [self.value(mul.src[0]), self.value(mul.src[1]), self.value(other)], [t, t, t])

    def constant_divide(self, u: UOp) -> str | None:
        """An integer DIV or MOD by a constant other than 0 and -1: no guard, and unsigned when the dividend is
        never negative (an index): LLVM makes that a shift, a mask or a multiply without a sign fix-up."""
        d, c = u.dtype, u.src[-1]
        if (u.op not in (Ops.DIV, Ops.MOD) or not d.is_int or c.op is not Ops.CONST or c.arg.shape
                or c.arg.value in (0, -1)): return None
        unsigned = d.is_unsigned or (c.arg.value > 0 and u.src[0].bounds[0] >= 0)
        return self.emit(f"{_division(u.op, unsigned)} {self.rt(d)} {self.value(u.src[0])}, {self.value(c)}")

    def pointer(self, buf: UOp, index: UOp, lanes: bool) -> str:
        """The address of element `index`, or a vector of addresses (one per lane) for a gather/scatter."""
        ty = mem_type(buf.dtype)
        if lanes:
            return self.emit(f"getelementptr inbounds {ty}, ptr {self.names[buf]}, {self.vt('i64')} "
                             f"{self.value(index)}")
        saved, self.w = self.w, 0
        idx = self.value(index)
        self.w = saved
        return self.emit(f"getelementptr inbounds {ty}, ptr {self.names[buf]}, i64 {idx}")

    def mask(self, gate: UOp) -> str:
        return self.value(gate) if self.vec.get(gate) else self.splat(self.scalar(gate), "i1")

    def scalar(self, u: UOp) -> str:
        saved, self.w = self.w, 0
        out = self.value(u)
        self.w = saved
        return out

    def transposed_blocks(self) -> dict[UOp, tuple[UOp, int, int]]:
        """Gathers that together read a W x W block: W loads of one buffer, without a gate, whose indices are one
        expression `e + lane * S` (S the stride across lanes, not 1) plus the constants c0 .. c0 + W - 1 (an
        unrolled loop that walks the buffer contiguously: a transpose, `x.T + 1`, or a copy of B.T into panels).
        Each maps to (the group's first load, its column, S): `transposed` reads the block as W contiguous
        rows and transposes them in registers, instead of W gathers of W lanes from W lines each."""
        if not self.W or self.W & (self.W - 1) or self.W < 4: return {}
        groups: dict[tuple, dict[int, UOp]] = {}
        for what, u in self.lines:
            if what != "node" or u.op is not Ops.LOAD or u.arg is not None or len(u.src) > 2 or not self.vec.get(u):
                continue
            parts, constant = terms(u.src[1])
            coefs: dict[UOp, int] = {}
            for t, c in parts: coefs[t] = coefs.get(t, 0) + c
            across = [c for t, c in coefs.items() if t in self.lanes]
            if (len(across) != 1 or across[0] in (0, 1)
                    or any(t not in self.lanes and not self.lanes.isdisjoint(t.toposort) for t in coefs)):
                continue
            key = (u.src[0], u.dtype, frozenset((t, c) for t, c in coefs.items() if c))
            groups.setdefault(key, {}).setdefault(constant, u)
        blocks, order = {}, {u: i for i, (_, u) in enumerate(self.lines)}
        for (_, _, coefs), members in groups.items():
            first = min(members)
            if sorted(members) != list(range(first, first + self.W)): continue
            stride = next(c for t, c in coefs if t in self.lanes)
            lead = min(members.values(), key=lambda u: order[u])
            for constant, u in members.items(): blocks[u] = (lead, constant - first, stride)
        return blocks

    def transposed(self, u: UOp) -> str:
        """Load `u` of a transposed block (`transposed_blocks`): at the block's first load, its W rows (lane r's
        elements, contiguous) and the transpose, log2(W) rounds of interleaving pairs of vectors W/2 apart (after
        them vector c holds column c); the block's other loads take their column."""
        lead, column, stride = self.blocks[u]
        if lead not in self.columns:
            buf, ty, w = lead.src[0], mem_type(lead.src[0].dtype), self.W
            mt = self.vt(ty)
            lane0 = self.emit(f"extractelement {self.vt('i64')} {self.value(lead.src[1])}, i64 0")
            rows = []
            for r in range(w):  # (lane r's row starts at the lead's lane-0 element, less the lead's column)
                at = self.emit(f"add i64 {lane0}, {r * stride - self.blocks[lead][1]}")
                ptr = self.emit(f"getelementptr inbounds {ty}, ptr {self.names[buf]}, i64 {at}")
                rows.append(self.emit(f"load {mt}, ptr {ptr}, align {lead.dtype.itemsize}"))
            stages, where = transpose_network(w, lead.dtype.itemsize)
            for d, masks in stages:
                out = list(rows)
                for a in range(w):
                    if a & d: continue
                    out[a], out[a + d] = (self.emit(f"shufflevector {mt} {rows[a]}, {mt} {rows[a + d]}, <{w} x i32> "
                                                    f"<{', '.join(f'i32 {x}' for x in m)}>") for m in masks)
                rows = out
            rows = [rows[where[c]] for c in range(w)]
            self.columns[lead] = [self.from_memory(v, lead.dtype) for v in rows]
        return self.columns[lead][column]

    def load(self, u: UOp) -> str:
        if u in self.blocks: return self.transposed(u)
        buf, index = u.src[0], u.src[1]
        gate = u.src[2] if len(u.src) > 2 else None
        d, size = u.dtype, u.dtype.itemsize
        if not self.w:  # scalar: a false gate reads element 0 (always in bounds) and the caller discards it
            idx = self.value(index)
            if gate is not None: idx = self.emit(f"select i1 {self.value(gate)}, i64 {idx}, i64 0")
            ptr = self.emit(f"getelementptr inbounds {mem_type(buf.dtype)}, ptr {self.names[buf]}, i64 {idx}")
            return self.from_memory(self.emit(f"load {mem_type(buf.dtype)}, ptr {ptr}, align {size}"), d)
        mt = self.vt(mem_type(buf.dtype))
        ptr = self.pointer(buf, index, u.arg is None)
        if u.arg is None:  # lanes at scattered addresses
            mask = self.mask(gate) if gate is not None else "splat (i1 true)"
            raw = self.intrinsic(f"llvm.masked.gather.{self.sfx(mem_type(buf.dtype))}.v{self.w}p0", mt,
                                 [ptr, str(size), mask, "zeroinitializer"], [self.vt("ptr"), "i32", self.vt("i1"), mt])
        elif gate is not None:
            raw = self.intrinsic(f"llvm.masked.load.{self.sfx(mem_type(buf.dtype))}.p0", mt,
                                 [ptr, str(size), self.mask(gate), "zeroinitializer"],
                                 ["ptr", "i32", self.vt("i1"), mt])
        else:
            raw = self.emit(f"load {mt}, ptr {ptr}, align {size}")
        return self.from_memory(raw, d)

    def line_prefetch(self, u: UOp, locality: int = 3) -> None:
        """llvm.prefetch of the cache lines load `u` reads (for writing too when the kernel stores to its buffer),
        placed before a long reduce nest (linearize). A prefetch never faults: no gate, and no `inbounds` (a
        clamped or gated-off address may lie outside the buffer). A gather's lanes are not prefetched."""
        if self.vec.get(u) and u.arg is None: return
        buf, size = u.src[0], u.src[0].dtype.itemsize
        self.w = 0
        index = self.value(u.src[1])
        write = int(any(st.src and st.src[0] is buf for st in self.kernel.sink.src))
        span = max(self.W, 1) * size if u.arg is not None else size
        for offset in sorted({*range(0, span, CACHE_LINE), *((span - size,) if span % CACHE_LINE else ())}):
            at = self.emit(f"add i64 {index}, {offset // size}") if offset else index
            ptr = self.emit(f"getelementptr {mem_type(buf.dtype)}, ptr {self.names[buf]}, i64 {at}")
            self.intrinsic_void("llvm.prefetch.p0", [ptr, str(write), str(locality), "1"],
                                ["ptr", "i32", "i32", "i32"])

    def line_prefetch_next(self, u: UOp) -> None:
        """The next row's lines for load `u` (linearize), into L2 (locality 2): the current row fills L1."""
        self.line_prefetch(u, 2)

    def store(self, u: UOp) -> None:
        buf, index, val = u.src[0], u.src[1], u.src[2]
        gate = u.src[3] if len(u.src) > 3 else None
        self.w = self.W if (self.vec.get(index) or self.vec.get(val) or u.arg is not None
                            or (gate is not None and self.vec.get(gate))) else 0
        size = val.dtype.itemsize
        if self.w:
            mt = self.vt(mem_type(buf.dtype))
            value, ptr = self.to_memory(self.value(val), val.dtype), self.pointer(buf, index, u.arg is None)
            mask = self.mask(gate) if gate is not None else "splat (i1 true)"
            if u.arg is None:
                self.intrinsic_void(f"llvm.masked.scatter.{self.sfx(mem_type(buf.dtype))}.v{self.w}p0",
                                    [value, ptr, str(size), mask], [mt, self.vt("ptr"), "i32", self.vt("i1")])
            elif gate is not None and not self.vec.get(gate):
                # one gate for every lane (a clamped remainder row of a register block): a branch around a plain
                # store. A masked store with a splat mask is microcoded on AMD (the W8 RNN cell: 4.7 -> 4.4 us a step)
                n = self.tmp()[2:]
                self.body.append(f"  br i1 {self.scalar(gate)}, label %S{n}, label %D{n}")
                self.label(f"S{n}")
                self.body.append(f"  store {mt} {value}, ptr {ptr}, align {size}")
                self.body.append(f"  br label %D{n}")
                self.label(f"D{n}")
            elif gate is not None:
                self.intrinsic_void(f"llvm.masked.store.{self.sfx(mem_type(buf.dtype))}.p0",
                                    [value, ptr, str(size), mask], [mt, "ptr", "i32", self.vt("i1")])
            elif buf.arg.slot in self.stream and self.w * size % 64 == 0:
                self.streaming_store(f"{mt} {value}", ptr, size)
            else:
                self.body.append(f"  store {mt} {value}, ptr {ptr}, align {size}")
            return
        if gate is not None:
            n = self.tmp()[2:]
            self.body.append(f"  br i1 {self.value(gate)}, label %S{n}, label %D{n}")
            self.label(f"S{n}")
        ptr = self.pointer(buf, index, False)
        value = self.to_memory(self.value(val), val.dtype)
        self.body.append(f"  store {mem_type(buf.dtype)} {value}, ptr {ptr}, align {size}")
        if gate is not None:
            self.body.append(f"  br label %D{n}")
            self.label(f"D{n}")

    def streaming_store(self, typed_value: str, ptr: str, size: int) -> None:
        """A store of whole cache lines that bypasses the caches (non-temporal: no read of the lines first) where
        its address is line-aligned, a normal one where not (a buffer numpy allocated: 16-byte aligned)."""
        n = self.tmp()[2:]
        low = self.emit(f"and i64 {self.emit(f'ptrtoint ptr {ptr} to i64')}, 63")
        self.body.append(f"  br i1 {self.emit(f'icmp eq i64 {low}, 0')}, label %N{n}, label %M{n}")
        self.label(f"N{n}")
        self.body.append(f"  store {typed_value}, ptr {ptr}, align 64, !nontemporal !{{i32 1}}")
        self.body.append(f"  br label %D{n}")
        self.label(f"M{n}")
        self.body.append(f"  store {typed_value}, ptr {ptr}, align {size}")
        self.body.append(f"  br label %D{n}")
        self.label(f"D{n}")
        self.streamed = True

    def intrinsic_void(self, name: str, args: list[str], arg_types: list[str]) -> None:
        self.declares.add(f"declare void @{name}({', '.join(arg_types)})")
        self.body.append(f"  call void @{name}({', '.join(f'{t} {a}' for t, a in zip(arg_types, args))})")

    def from_memory(self, raw: str, d: DType) -> str:
        if d.is_bool: return self.emit(f"icmp ne {self.vt('i8')} {raw}, {self.c(0, dtypes.int8)}")
        if d == dtypes.float16: return self.emit(f"fpext {self.vt('half')} {raw} to {self.vt('float')}")
        if d == dtypes.bfloat16:
            wide = self.emit(f"zext {self.vt('i16')} {raw} to {self.vt('i32')}")
            shifted = self.emit(f"shl {self.vt('i32')} {wide}, {self.c(16, dtypes.int32)}")
            return self.emit(f"bitcast {self.vt('i32')} {shifted} to {self.vt('float')}")
        return raw

    def to_memory(self, value: str, d: DType) -> str:
        if d.is_bool: return self.emit(f"zext {self.vt('i1')} {value} to {self.vt('i8')}")
        if d == dtypes.float16: return self.emit(f"fptrunc {self.vt('float')} {value} to {self.vt('half')}")
        if d == dtypes.bfloat16: return self.emit(f"trunc {self.vt('i32')} {self.bf16_bits(value)} to {self.vt('i16')}")
        return value

    def bf16_rounded(self, value: str) -> str:
        """The bits of a float rounded to bfloat16, as an i32 whose low half is zero (round to nearest even; a NaN
        becomes the quiet NaN of its sign, as ml_dtypes does)."""
        i32, f32, k = self.vt("i32"), self.vt("float"), lambda v: self.c(v, dtypes.int32)
        bits = self.emit(f"bitcast {f32} {value} to {i32}")
        lsb = self.emit(f"and {i32} {self.emit(f'lshr {i32} {bits}, {k(16)}')}, {k(1)}")
        rounded = self.emit(f"add {i32} {bits}, {self.emit(f'add {i32} {lsb}, {k(0x7FFF)}')}")
        is_nan = self.emit(f"fcmp uno {f32} {value}, {self.c(0.0, dtypes.float32)}")
        nan = self.emit(f"or {i32} {self.emit(f'and {i32} {bits}, {k(-0x80000000)}')}, {k(0x7FC00000)}")
        return self.emit(f"select {self.vt('i1')} {is_nan}, {i32} {nan}, {i32} "
                         f"{self.emit(f'and {i32} {rounded}, {k(-0x10000)}')}")

    def bf16_bits(self, value: str) -> str:
        """float -> bfloat16 bits in the low half of an i32 (bf16_rounded)."""
        return self.emit(f"lshr {self.vt('i32')} {self.bf16_rounded(value)}, {self.c(16, dtypes.int32)}")

    def round_to(self, value: str, d: DType) -> str:
        """A float register rounded to a 16-bit float dtype and back (what a store then load would give)."""
        f32 = self.vt("float")
        if d == dtypes.float16:
            half = self.vt("half")
            return self.emit(f"fpext {half} {self.emit(f'fptrunc {f32} {value} to {half}')} to {f32}")
        if d == dtypes.bfloat16:
            return self.emit(f"bitcast {self.vt('i32')} {self.bf16_rounded(value)} to {f32}")
        return value

    def alu(self, op: Ops, d: DType, args: list[str], src_dtype: DType, flags: str = "") -> str:
        t, st = self.rt(d), self.rt(src_dtype)
        f, signed = src_dtype.is_float, not src_dtype.is_unsigned
        a = args[0]
        if op is Ops.CAST: return self.cast(a, src_dtype, d)
        if op is Ops.BITCAST: return self.bitcast(a, src_dtype, d)
        if op is Ops.RECIP: return self.emit(f"fdiv {t} {self.c(1.0, d)}, {a}")
        if op in _FLOAT_INTRINSIC:
            return self.intrinsic(f"llvm.{_FLOAT_INTRINSIC[op]}.{self.sfx(reg_type(d))}", t, [a], [t])
        if op is Ops.WHERE: return self.emit(f"select {self.vt('i1')} {a}, {t} {args[1]}, {t} {args[2]}")
        b = args[1]
        if op is Ops.CMPLT:
            cmp = "fcmp olt" if f else f"icmp {'slt' if signed and not src_dtype.is_bool else 'ult'}"
            return self.emit(f"{cmp} {st} {a}, {b}")
        if op is Ops.CMPNE: return self.emit(f"{'fcmp une' if f else 'icmp ne'} {st} {a}, {b}")
        if op is Ops.ADD:
            return self.emit(f"{'fadd' + flags if f else 'or' if d.is_bool else 'add'} {t} {a}, {b}")
        if op is Ops.MUL:
            return self.emit(f"{'fmul' + flags if f else 'and' if d.is_bool else 'mul'} {t} {a}, {b}")
        if op is Ops.MAX:
            if d.is_bool: return self.emit(f"or {t} {a}, {b}")
            name = "maximum" if f else "smax" if signed else "umax"
            return self.intrinsic(f"llvm.{name}.{self.sfx(reg_type(d))}", t, [a, b], [t, t])
        if op in (Ops.AND, Ops.OR, Ops.XOR): return self.emit(f"{op.name.lower()} {t} {a}, {b}")
        if op in (Ops.DIV, Ops.MOD): return self.divide(op, d, a, b)
        if op in (Ops.SHL, Ops.SHR): return self.shift(op, d, a, b)
        raise NotImplementedError(f"LLVM renderer: no rule for {op}")

    def divide(self, op: Ops, d: DType, a: str, b: str) -> str:
        t, i1 = self.rt(d), self.vt("i1")
        if d.is_float: return self.emit(f"{'fdiv' if op is Ops.DIV else 'frem'} {t} {a}, {b}")
        if d.is_bool: return a if op is Ops.DIV else self.c(False, d)
        zero = self.emit(f"icmp eq {t} {b}, {self.c(0, d)}")
        safe = self.emit(f"select {i1} {zero}, {t} {self.c(1, d)}, {t} {b}")
        if not d.is_unsigned:  # MIN / -1 overflows (and traps on x86): divide by 1 and negate instead
            minus_one = self.emit(f"icmp eq {t} {safe}, {self.c(-1, d)}")
            safe = self.emit(f"select {i1} {minus_one}, {t} {self.c(1, d)}, {t} {safe}")
        out = self.emit(f"{_division(op, d.is_unsigned)} {t} {a}, {safe}")
        if not d.is_unsigned:
            fixed = self.emit(f"sub {t} {self.c(0, d)}, {out}") if op is Ops.DIV else self.c(0, d)
            out = self.emit(f"select {i1} {minus_one}, {t} {fixed}, {t} {out}")
        return self.emit(f"select {i1} {zero}, {t} {self.c(-1, d) if op is Ops.DIV else a}, {t} {out}")

    def shift(self, op: Ops, d: DType, a: str, b: str) -> str:
        t, bits, i1 = self.rt(d), 8 * d.itemsize, self.vt("i1")
        kind = "shl" if op is Ops.SHL else "lshr" if d.is_unsigned else "ashr"
        amount = b[len("splat ("):-1].split()[-1] if b.startswith("splat (") else b
        if amount.isdigit() and int(amount) < bits: return self.emit(f"{kind} {t} {a}, {b}")  # (a constant in range)
        big = self.emit(f"icmp uge {t} {b}, {self.c(bits, d)}")
        safe = self.emit(f"select {i1} {big}, {t} {self.c(0, d)}, {t} {b}")
        out = self.emit(f"{kind} {t} {a}, {safe}")
        overflow = self.c(0, d) if op is Ops.SHL or d.is_unsigned else self.emit(f"ashr {t} {a}, {self.c(bits - 1, d)}")
        return self.emit(f"select {i1} {big}, {t} {overflow}, {t} {out}")

    def cast(self, a: str, src: DType, d: DType) -> str:
        st, t, i1 = self.rt(src), self.rt(d), self.vt("i1")
        if d.is_bool: return self.emit(f"{'fcmp une' if src.is_float else 'icmp ne'} {st} {a}, {self.c(0, src)}")
        if src.is_float and d.is_float:
            if reg_type(src) == "double" and is_half(d): a = self.odd_float(a)
            elif st != t: a = self.emit(f"{'fpext' if reg_type(src) == 'float' else 'fptrunc'} {st} {a} to {t}")
            return self.round_to(a, d) if is_half(d) else a
        if src.is_float:  # saturating as XLA (NaN -> 0, beyond the range -> its end): selects vectorize, .sat do not
            bits = 8 * d.itemsize
            lo, top = (0.0, 2.0 ** bits) if d.is_unsigned else (-(2.0 ** (bits - 1)), 2.0 ** (bits - 1))
            reg = dtypes.float32 if is_half(src) else src  # the constants in the register's type (16-bit: float)
            nan = self.emit(f"fcmp uno {st} {a}, {a}")
            a = self.emit(f"select {i1} {nan}, {st} {self.c(0.0, reg)}, {st} {a}")
            below = self.emit(f"fcmp olt {st} {a}, {self.c(lo, reg)}")
            a = self.emit(f"select {i1} {below}, {st} {self.c(lo, reg)}, {st} {a}")
            above = self.emit(f"fcmp oge {st} {a}, {self.c(top, reg)}")  # 2^bits: exact in every float type
            a = self.emit(f"select {i1} {above}, {st} {self.c(0.0, reg)}, {st} {a}")
            out = self.emit(f"{'fptoui' if d.is_unsigned else 'fptosi'} {st} {a} to {t}")
            return self.emit(f"select {i1} {above}, {t} {self.c(int(top) - 1, d)}, {t} {out}")
        if d.is_float and src.is_bool:  # a select, not uitofp of i1 vectors: LLVM's X86 backend asserted (AVX2) on
            reg = dtypes.float32 if is_half(d) else d  # uitofp <4 x i1> of a compare of truncated i64 lanes
            return self.emit(f"select {i1} {a}, {t} {self.c(1.0, reg)}, {t} {self.c(0.0, reg)}")
        if d.is_float:
            kind = "uitofp" if src.is_unsigned else "sitofp"
            if is_half(d) and src.itemsize == 4:  # exactly through double: float could round twice
                return self.round_to(self.odd_float(self.emit(f"{kind} {st} {a} to {self.vt('double')}")), d)
            out = self.emit(f"{kind} {st} {a} to {t}")
            return self.round_to(out, d) if is_half(d) else out
        if st == t: return a
        sb, tb = int(reg_type(src)[1:]), int(reg_type(d)[1:])
        if tb < sb: return self.emit(f"trunc {st} {a} to {t}")
        return self.emit(f"{'zext' if src.is_unsigned or src.is_bool else 'sext'} {st} {a} to {t}")

    def odd_float(self, a: str) -> str:
        """A double as float, rounded to odd (an inexact result gets an odd last bit): rounding that to a 16-bit
        float is correctly rounded, where a float rounded to nearest could land on a 16-bit midpoint."""
        f64, f32, i32 = self.vt("double"), self.vt("float"), self.vt("i32")
        near = self.emit(f"fptrunc {f64} {a} to {f32}")
        wide = self.emit(f"fpext {f32} {near} to {f64}")
        bits = self.emit(f"bitcast {f32} {near} to {i32}")
        even = self.emit(f"icmp eq {i32} {self.emit(f'and {i32} {bits}, {self.c(1, dtypes.int32)}')}, "
                         f"{self.c(0, dtypes.int32)}")
        fix = self.emit(f"and {self.vt('i1')} {even}, {self.emit(f'fcmp one {f64} {wide}, {a}')}")
        fabs = f"llvm.fabs.{self.sfx('double')}"
        away = self.emit(f"fcmp ogt {f64} {self.intrinsic(fabs, f64, [wide], [f64])}, "
                         f"{self.intrinsic(fabs, f64, [a], [f64])}")
        step = self.emit(f"select {self.vt('i1')} {away}, {i32} {self.c(-1, dtypes.int32)}, {i32} "
                         f"{self.c(1, dtypes.int32)}")
        odd = self.emit(f"select {self.vt('i1')} {fix}, {i32} {self.emit(f'add {i32} {bits}, {step}')}, {i32} {bits}")
        return self.emit(f"bitcast {i32} {odd} to {f32}")

    def bitcast(self, a: str, src: DType, d: DType) -> str:
        bits = self.vt(f"i{8 * d.itemsize}")
        if src == dtypes.float16:
            half = self.vt("half")
            a = self.emit(f"bitcast {half} {self.emit(f'fptrunc {self.rt(src)} {a} to {half}')} to {self.vt('i16')}")
        elif src == dtypes.bfloat16: a = self.emit(f"trunc {self.vt('i32')} {self.bf16_bits(a)} to {self.vt('i16')}")
        elif self.rt(src) != bits: a = self.emit(f"bitcast {self.rt(src)} {a} to {bits}")
        if d == dtypes.float16:
            half = self.emit(f"bitcast {self.vt('i16')} {a} to {self.vt('half')}")
            return self.emit(f"fpext {self.vt('half')} {half} to {self.vt('float')}")
        if d == dtypes.bfloat16: return self.from_memory(a, d)
        if d.is_bool: return self.emit(f"icmp ne {self.vt('i8')} {a}, {self.c(0, dtypes.int8)}")
        return a if self.rt(d) == bits else self.emit(f"bitcast {bits} {a} to {self.rt(d)}")


def _division(op: Ops, unsigned: bool) -> str:
    """LLVM's instruction for integer DIV (toward zero) or MOD (the dividend's sign)."""
    return ("udiv" if unsigned else "sdiv") if op is Ops.DIV else ("urem" if unsigned else "srem")


def render_kernel(kernel: Kernel, lines: Linear) -> tuple[str, set[str]]:
    r = Renderer(kernel, lines)
    return r.render(), r.declares


def packed_entry(kernel: Kernel) -> str:
    """`@<name>_packed(ptr argv, i64 start, i64 end)`: the kernel with its buffer addresses in an array, so one
    native worker loop can call any kernel (fnx/backends/native_pool.py)."""
    n = max(len(kernel.args), 1)
    body = [f"define void @{kernel.name}_packed(ptr %argv, i64 %start, i64 %end) {{"]
    for i in range(n):
        body += [f"  %p{i} = getelementptr ptr, ptr %argv, i64 {i}", f"  %a{i} = load ptr, ptr %p{i}, align 8"]
    args = ", ".join(f"ptr %a{i}" for i in range(n))
    return "\n".join(body + [f"  call void @{kernel.name}({args}, i64 %start, i64 %end)", "  ret void", "}"])


def render_function(kernel: Kernel, lines: Linear) -> tuple[str, set[str]]:
    """A kernel's LLVM functions (with its packed entry when it is thread-split) and the declarations they need."""
    text, declares = render_kernel(kernel, lines)
    return (text + "\n\n" + packed_entry(kernel) if kernel.thread_range >= 0 else text), declares


def module_source(functions: list[tuple[str, set[str]]]) -> str:
    """One LLVM module of rendered functions (render_function)."""
    declares = set().union(*(d for _, d in functions))
    # noinline: a packed entry calls its kernel (once per chunk of iterations) instead of holding a copy of it that
    # LLVM would optimize and generate code for a second time (a quarter of the GPT step's LLVM time)
    return "\n\n".join([t for t, _ in functions] + sorted(declares) + ['attributes #0 = { nounwind noinline }'])


def render_module(kernels: list[tuple[Kernel, Linear]]) -> str:
    return module_source([render_function(k, lines) for k, lines in kernels])
