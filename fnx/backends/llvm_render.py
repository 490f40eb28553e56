"""Render a linearized kernel as LLVM IR text.

Registers hold bool as i1 and float16/bfloat16 as float (their arithmetic runs in float32, rounded on every store
and cast); memory holds bool as i8, float16 as half and bfloat16 as i16. Integer division by zero and shifts by
out-of-range amounts are defined (x/0 = -1, x%0 = x, oversized shifts give 0 or the sign) so generated code never
traps or reads poison. A kernel is `void @name(ptr %buf0, ..., i64 %start, i64 %end)`; [start, end) bounds its
thread-split loop.
"""
from __future__ import annotations

import struct

import numpy as np

from fnx import dtypes
from fnx.dtypes import DType
from fnx.lower.linearize import Linear
from fnx.lower.rangeify import Kernel, reduce_identity
from fnx.uop import Ops, UOp


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
        if reg_type(d) == "float":  # float constants must be exact in float: round (out of range becomes inf)
            with np.errstate(over="ignore"):
                v = float(np.float32(v))
        return "0x" + struct.pack(">d", v).hex().upper()
    return str(int(value))


_FLOAT_INTRINSIC = {Ops.SQRT: "sqrt", Ops.EXP2: "exp2", Ops.LOG2: "log2", Ops.SIN: "sin", Ops.TRUNC: "trunc"}


class Renderer:
    """Turns one kernel's linear program into an LLVM function."""

    def __init__(self, kernel: Kernel, lines: Linear):
        self.kernel, self.lines = kernel, lines
        self.body: list[str] = []
        self.names: dict[UOp, str] = {}
        self.declares: set[str] = set()
        self.counter = 0
        self.block = "entry"
        self.loops: dict[UOp, dict] = {}
        self.acc: dict[UOp, str] = {}

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

    def intrinsic(self, name: str, ret: str, args: list[str], arg_types: list[str]) -> str:
        self.declares.add(f"declare {ret} @{name}({', '.join(arg_types)})")
        return self.emit(f"call {ret} @{name}({', '.join(f'{t} {a}' for t, a in zip(arg_types, args))})")

    # ---- values ----
    def value(self, u: UOp) -> str:
        if u.op is Ops.CONST: return const_text(u.arg[0], u.dtype)
        return self.names[u]

    def render(self) -> str:
        k = self.kernel
        params = sorted({u.arg[0]: u for u in k.sink.toposort if u.op is Ops.PARAM}.items())
        nargs = max(len(k.args), 1)
        for _, p in params: self.names[p] = f"%buf{p.arg[0]}"
        sig = ", ".join(f"ptr noalias %buf{i}" for i in range(nargs))
        self.body.append(f"define void @{k.name}({sig}, i64 %start, i64 %end) #0 {{")
        self.label("entry")
        for what, u in self.lines:
            getattr(self, f"line_{what}")(u)
        self.body.append("  ret void")
        self.body.append("}")
        return "\n".join(self.body)

    # ---- loops ----
    def line_open(self, r: UOp) -> None:
        i = r.arg[0]
        threaded = self.kernel.thread_range >= 0 and self.kernel.ranges[self.kernel.thread_range] is r
        lo, hi = ("%start", "%end") if threaded else ("0", str(r.arg[1]))
        pre = self.block
        guard = self.emit(f"icmp slt i64 {lo}, {hi}")
        self.body.append(f"  br i1 {guard}, label %L{i}, label %X{i}")
        self.label(f"L{i}")
        self.names[r] = f"%r{i}"
        phis = [(len(self.body), None, lo)]  # (line to patch, reduce node, value on entry)
        self.body.append("")
        for red in self.acc:  # an accumulator is carried around every reduce loop it spans
            if r in red.src[1:]:
                phis.append((len(self.body), red, self.acc[red]))
                self.body.append("")
                self.acc[red] = f"%acc{i}"
        self.loops[r] = (pre, hi, phis)

    def line_close(self, r: UOp) -> None:
        i, (pre, hi, phis) = r.arg[0], self.loops[r]
        self.body.append(f"  %r{i}.next = add nsw i64 %r{i}, 1")
        cont = self.emit(f"icmp slt i64 %r{i}.next, {hi}")
        latch = self.block
        self.body.append(f"  br i1 {cont}, label %L{i}, label %X{i}")
        self.label(f"X{i}")
        for line, red, entry in phis:
            if red is None:
                self.body[line] = f"  %r{i} = phi i64 [{entry}, %{pre}], [%r{i}.next, %{latch}]"
                continue
            t = reg_type(red.dtype)
            self.body[line] = f"  %acc{i} = phi {t} [{entry}, %{pre}], [{self.acc[red]}, %{latch}]"
            self.body.append(f"  %acc{i}.out = phi {t} [{entry}, %{pre}], [{self.acc[red]}, %{latch}]")
            self.acc[red] = f"%acc{i}.out"

    def line_acc_init(self, red: UOp) -> None:
        self.acc[red] = const_text(reduce_identity(red.arg[0], red.dtype), red.dtype)

    def line_acc_update(self, red: UOp) -> None:
        # reassociation lets the vectorizer keep one partial sum per lane (like numpy's pairwise sums, the order
        # of float additions then differs from a strict left-to-right loop)
        self.acc[red] = self.alu(red.arg[0], red.dtype, [self.acc[red], self.value(red.src[0])], red.dtype,
                                 flags=" reassoc nsz")

    # ---- nodes ----
    def line_node(self, u: UOp) -> None:
        if u.op in (Ops.CONST, Ops.PARAM): return
        if u.op is Ops.REDUCE: self.names[u] = self.acc[u]
        elif u.op is Ops.LOAD: self.names[u] = self.load(u)
        elif u.op is Ops.STORE: self.store(u)
        else: self.names[u] = self.alu(u.op, u.dtype, [self.value(s) for s in u.src], u.src[0].dtype)

    def address(self, u: UOp) -> tuple[str, str]:
        buf, index = u.src[0], self.value(u.src[1])
        if len(u.src) > (3 if u.op is Ops.STORE else 2):
            index = self.emit(f"select i1 {self.value(u.src[-1])}, i64 {index}, i64 0")
        ty = mem_type(buf.dtype)
        return self.emit(f"getelementptr inbounds {ty}, ptr {self.names[buf]}, i64 {index}"), ty

    def load(self, u: UOp) -> str:
        ptr, ty = self.address(u)
        raw = self.emit(f"load {ty}, ptr {ptr}, align {u.dtype.itemsize}")
        return self.from_memory(raw, u.dtype)

    def store(self, u: UOp) -> None:
        gated = len(u.src) > 3
        if gated:
            n = self.tmp()[2:]
            self.body.append(f"  br i1 {self.value(u.src[3])}, label %S{n}, label %D{n}")
            self.label(f"S{n}")
        ptr, ty = self.address(UOp(Ops.STORE, u.dtype, u.src[:3]))
        value = self.to_memory(self.value(u.src[2]), u.src[2].dtype)
        self.body.append(f"  store {ty} {value}, ptr {ptr}, align {u.src[2].dtype.itemsize}")
        if gated:
            self.body.append(f"  br label %D{n}")
            self.label(f"D{n}")

    def from_memory(self, raw: str, d: DType) -> str:
        if d.is_bool: return self.emit(f"icmp ne i8 {raw}, 0")
        if d == dtypes.float16: return self.emit(f"fpext half {raw} to float")
        if d == dtypes.bfloat16:
            wide = self.emit(f"zext i16 {raw} to i32")
            return self.emit(f"bitcast i32 {self.emit(f'shl i32 {wide}, 16')} to float")
        return raw

    def to_memory(self, value: str, d: DType) -> str:
        if d.is_bool: return self.emit(f"zext i1 {value} to i8")
        if d == dtypes.float16: return self.emit(f"fptrunc float {value} to half")
        if d == dtypes.bfloat16: return self.emit(f"trunc i32 {self.bf16_bits(value)} to i16")
        return value

    def bf16_bits(self, value: str) -> str:
        """float -> bfloat16 bits in the high half of an i32 shifted down (round to nearest even; NaN stays NaN)."""
        bits = self.emit(f"bitcast float {value} to i32")
        lsb = self.emit(f"and i32 {self.emit(f'lshr i32 {bits}, 16')}, 1")
        rounded = self.emit(f"add i32 {bits}, {self.emit(f'add i32 {lsb}, 32767')}")
        is_nan = self.emit(f"fcmp uno float {value}, 0.0")
        return self.emit(f"select i1 {is_nan}, i32 32704, i32 {self.emit(f'lshr i32 {rounded}, 16')}")

    def round_to(self, value: str, d: DType) -> str:
        """A float register rounded to a 16-bit float dtype and back (what a store then load would give)."""
        if d == dtypes.float16: return self.emit(f"fpext half {self.emit(f'fptrunc float {value} to half')} to float")
        if d == dtypes.bfloat16:
            return self.emit(f"bitcast i32 {self.emit(f'shl i32 {self.bf16_bits(value)}, 16')} to float")
        return value

    def alu(self, op: Ops, d: DType, args: list[str], src_dtype: DType, flags: str = "") -> str:
        t, st = reg_type(d), reg_type(src_dtype)
        f, signed = src_dtype.is_float, not src_dtype.is_unsigned
        a = args[0]
        if op is Ops.CAST: return self.cast(a, src_dtype, d)
        if op is Ops.BITCAST: return self.bitcast(a, src_dtype, d)
        if op is Ops.RECIP: return self.emit(f"fdiv {t} {const_text(1.0, d)}, {a}")
        if op in _FLOAT_INTRINSIC:
            return self.intrinsic(f"llvm.{_FLOAT_INTRINSIC[op]}.{'f64' if t == 'double' else 'f32'}", t, [a], [t])
        if op is Ops.WHERE: return self.emit(f"select i1 {a}, {t} {args[1]}, {t} {args[2]}")
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
            if d.is_bool: return self.emit(f"or i1 {a}, {b}")
            name = "maximum" if f else "smax" if signed else "umax"
            return self.intrinsic(f"llvm.{name}.{'f64' if t == 'double' else 'f32' if f else t}", t, [a, b], [t, t])
        if op in (Ops.AND, Ops.OR, Ops.XOR): return self.emit(f"{op.name.lower()} {t} {a}, {b}")
        if op in (Ops.DIV, Ops.MOD): return self.divide(op, d, a, b)
        if op in (Ops.SHL, Ops.SHR): return self.shift(op, d, a, b)
        raise NotImplementedError(f"LLVM renderer: no rule for {op}")

    def divide(self, op: Ops, d: DType, a: str, b: str) -> str:
        t = reg_type(d)
        if d.is_float: return self.emit(f"{'fdiv' if op is Ops.DIV else 'frem'} {t} {a}, {b}")
        if d.is_bool: return a if op is Ops.DIV else "false"
        zero = self.emit(f"icmp eq {t} {b}, 0")
        safe = self.emit(f"select i1 {zero}, {t} 1, {t} {b}")
        if not d.is_unsigned:  # MIN / -1 overflows (and traps on x86): divide by 1 and negate instead
            minus_one = self.emit(f"icmp eq {t} {safe}, -1")
            safe = self.emit(f"select i1 {minus_one}, {t} 1, {t} {safe}")
        kind = ("udiv" if d.is_unsigned else "sdiv") if op is Ops.DIV else ("urem" if d.is_unsigned else "srem")
        out = self.emit(f"{kind} {t} {a}, {safe}")
        if not d.is_unsigned:
            fixed = self.emit(f"sub {t} 0, {out}") if op is Ops.DIV else "0"
            out = self.emit(f"select i1 {minus_one}, {t} {fixed}, {t} {out}")
        return self.emit(f"select i1 {zero}, {t} {'-1' if op is Ops.DIV else a}, {t} {out}")

    def shift(self, op: Ops, d: DType, a: str, b: str) -> str:
        t, bits = reg_type(d), 8 * d.itemsize
        big = self.emit(f"icmp uge {t} {b}, {bits}")
        safe = self.emit(f"select i1 {big}, {t} 0, {t} {b}")
        kind = "shl" if op is Ops.SHL else "lshr" if d.is_unsigned else "ashr"
        out = self.emit(f"{kind} {t} {a}, {safe}")
        overflow = "0" if op is Ops.SHL or d.is_unsigned else self.emit(f"ashr {t} {a}, {bits - 1}")
        return self.emit(f"select i1 {big}, {t} {overflow}, {t} {out}")

    def cast(self, a: str, src: DType, d: DType) -> str:
        st, t = reg_type(src), reg_type(d)
        if d.is_bool: return self.emit(f"{'fcmp une' if src.is_float else 'icmp ne'} {st} {a}, "
                                       f"{const_text(0, src)}")
        if src.is_float and d.is_float:
            if st != t: a = self.emit(f"{'fpext' if st == 'float' else 'fptrunc'} {st} {a} to {t}")
            return self.round_to(a, d) if d.itemsize == 2 else a
        if src.is_float:  # saturating, NaN -> 0: clamp, then convert (selects vectorize; .sat intrinsics do not)
            bits = 8 * d.itemsize
            lo, top = (0.0, 2.0 ** bits) if d.is_unsigned else (-(2.0 ** (bits - 1)), 2.0 ** (bits - 1))
            hi = float(np.nextafter(np.array(top, dtype=np.float32 if st == "float" else np.float64), 0))
            below = self.emit(f"fcmp olt {st} {a}, {const_text(lo, src)}")
            a = self.emit(f"select i1 {below}, {st} {const_text(lo, src)}, {st} {a}")
            above = self.emit(f"fcmp ogt {st} {a}, {const_text(hi, src)}")
            a = self.emit(f"select i1 {above}, {st} {const_text(hi, src)}, {st} {a}")
            nan = self.emit(f"fcmp uno {st} {a}, {a}")
            a = self.emit(f"select i1 {nan}, {st} {const_text(0.0, src)}, {st} {a}")
            return self.emit(f"{'fptoui' if d.is_unsigned else 'fptosi'} {st} {a} to {t}")
        if d.is_float:
            out = self.emit(f"{'uitofp' if src.is_unsigned or src.is_bool else 'sitofp'} {st} {a} to {t}")
            return self.round_to(out, d) if d.itemsize == 2 else out
        if st == t: return a
        sb, tb = int(st[1:]), int(t[1:])
        if tb < sb: return self.emit(f"trunc {st} {a} to {t}")
        return self.emit(f"{'zext' if src.is_unsigned or src.is_bool else 'sext'} {st} {a} to {t}")

    def bitcast(self, a: str, src: DType, d: DType) -> str:
        bits = f"i{8 * d.itemsize}"
        if src == dtypes.float16: a = self.emit(f"bitcast half {self.emit(f'fptrunc float {a} to half')} to i16")
        elif src == dtypes.bfloat16: a = self.emit(f"trunc i32 {self.bf16_bits(a)} to i16")
        elif reg_type(src) != bits: a = self.emit(f"bitcast {reg_type(src)} {a} to {bits}")
        if d == dtypes.float16: return self.emit(f"fpext half {self.emit(f'bitcast i16 {a} to half')} to float")
        if d == dtypes.bfloat16: return self.from_memory(a, d)
        if d.is_bool: return self.emit(f"icmp ne i8 {a}, 0")
        return a if reg_type(d) == bits else self.emit(f"bitcast {bits} {a} to {reg_type(d)}")


def render_kernel(kernel: Kernel, lines: Linear) -> tuple[str, set[str]]:
    r = Renderer(kernel, lines)
    return r.render(), r.declares


def render_module(kernels: list[tuple[Kernel, Linear]]) -> str:
    functions, declares = [], set()
    for kernel, lines in kernels:
        text, decl = render_kernel(kernel, lines)
        functions.append(text)
        declares |= decl
    return "\n\n".join(functions + sorted(declares) + ['attributes #0 = { nounwind }'])
