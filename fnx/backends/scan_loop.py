"""A SCAN or WHILE whose body is small runs as one native loop: the body's kernels and a driver function that
calls them once per step, compiled together, so a step costs a few function calls instead of a round trip
through Python (the host loop in control.py costs 20-50 us per step). A COND whose branches are small runs its
branch's kernels from a driver likewise (no compiled function called per branch from the host).

The driver gets a table of base addresses. Per step it works out each body buffer's address: a carry is read
from one of two ping-pong buffers and written into the other, a slice of `xs` or `ys` is its base plus
step × slice bytes (counting down for reverse scans), loop-invariant operands and intermediates are fixed. The
body is lowered for one thread (no THREAD action): it is meant for bodies below the size where threads pay off.
Bodies the driver cannot express (a nested control-flow step, an output that is an operand or another output)
return None and run from the host loop.
"""
from __future__ import annotations

import ctypes
from dataclasses import replace

import numpy as np

from fnx import dtypes
from fnx.backends.control import body_function, operands
from fnx.backends.llvm_render import render_module
from fnx.lower.optimize import MIN_PARALLEL_WORK
from fnx.lower.pipeline import lower
from fnx.lower.rangeify import HostStep
from fnx.rewrite import substitute
from fnx.uop import Ops, UOp


_NOINLINE = 1000  # the attribute group of the driver's kernel calls (render_module's groups are numbered from 0)


class ScanProgram:
    """The compiled loop of one SCAN node; `run(inputs)` maps its host inputs to its outputs like run_control."""

    def __init__(self, node: UOp, lowering, source: str, table: list, compiler):
        self.node, self.lowering, self.table = node, lowering, table
        self.engine, self.module = compiler.compile(source)
        proto = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_int64)
        self.driver = proto(self.engine.get_function_address("scan_driver"))

    def run(self, inputs: list[np.ndarray], prepare=None) -> list[np.ndarray]:
        ncarry, length, nxs = self.node.arg.ncarry, self.node.arg.length, self.node.arg.nxs
        body, schedule = self.node.src[0], self.lowering.schedule
        carry = [np.array(c, copy=True).reshape(-1) for c in inputs[:ncarry]]
        other = [np.empty_like(c) for c in carry]
        xs = [np.ascontiguousarray(x) for x in inputs[ncarry:ncarry + nxs]]
        free = [np.ascontiguousarray(v) for v in inputs[ncarry + nxs:]]
        ys = [np.empty((length,) + o.shape, o.dtype.np) for o in body.src[ncarry:]]
        arrays = {"carry": carry, "other": other, "xs": xs, "ys": ys, "free": free}
        self.driver(_address_table(self.table, arrays, schedule), length)
        final = carry if length % 2 == 0 else other  # the carries swap buffers every step
        return [f.reshape(o.shape) for f, o in zip(final, operands(self.node)[:ncarry])] + ys


def compile_scan(node: UOp, compiler) -> ScanProgram | None:
    """The native loop for SCAN `node`, or None when its body needs the host loop (module docstring)."""
    ncarry, reverse, nxs = node.arg.ncarry, node.arg.reverse, node.arg.nxs
    ops = operands(node)
    avals = [(u.shape, u.dtype) for u in ops]
    avals = avals[:ncarry] + [(shape[1:], dt) for shape, dt in avals[ncarry:ncarry + nxs]] + avals[ncarry + nxs:]
    lowering = lower(body_function(node, node.src[0], avals), replace(compiler.target, threads=1))
    schedule, kernels = lowering.schedule, lowering.kernels
    nparams = len(avals)
    if any(isinstance(k, HostStep) for k, _ in kernels) or not kernels: return None
    if any(k.work >= MIN_PARALLEL_WORK for k, _ in kernels): return None  # big bodies keep their threads
    outs = schedule.outputs
    if len(set(outs)) != len(outs) or any(b < nparams for b in outs): return None
    # the address table: carries (ping), carries (pong), xs bases, ys bases, free operands, intermediates
    table = [("carry", i) for i in range(ncarry)] + [("other", i) for i in range(ncarry)] + \
        [("xs", j) for j in range(nxs)] + [("ys", m) for m in range(len(outs) - ncarry)] + \
        [("free", k) for k in range(nparams - ncarry - nxs)]
    inter = [i for i, spec in enumerate(schedule.buffers) if spec.kind == "intermediate"]
    table += [("intermediate", i) for i in inter]
    lines = ["define void @scan_driver(ptr %table, i64 %length) {", "entry:"]
    base = _load_table(table, lines)
    lines += ["  %go = icmp slt i64 0, %length", "  br i1 %go, label %loop, label %done", "loop:",
              "  %t = phi i64 [0, %entry], [%t.next, %loop]",
              "  %odd = and i64 %t, 1", "  %even = icmp eq i64 %odd, 0"]
    if reverse: lines += ["  %last = sub i64 %length, 1", "  %idx = sub i64 %last, %t"]
    idx = "%idx" if reverse else "%t"
    address: dict[int, str] = {}

    def pick(name: str, a: str, b: str) -> str:
        lines.append(f"  %{name} = select i1 %even, i64 {a}, i64 {b}")
        return f"%{name}"

    for i in range(ncarry):  # step t reads carry from ping on even steps, from pong on odd ones
        address[i] = pick(f"cin{i}", base[("carry", i)], base[("other", i)])
        address[outs[i]] = pick(f"cout{i}", base[("other", i)], base[("carry", i)])
    for j in range(nxs):
        nbytes = schedule.buffers[ncarry + j].size * schedule.buffers[ncarry + j].dtype.itemsize
        lines.append(f"  %xo{j} = mul i64 {idx}, {nbytes}")
        lines.append(f"  %x{j} = add i64 {base[('xs', j)]}, %xo{j}")
        address[ncarry + j] = f"%x{j}"
    for m, b in enumerate(outs[ncarry:]):
        nbytes = schedule.buffers[b].size * schedule.buffers[b].dtype.itemsize
        lines.append(f"  %yo{m} = mul i64 {idx}, {nbytes}")
        lines.append(f"  %y{m} = add i64 {base[('ys', m)]}, %yo{m}")
        address[b] = f"%y{m}"
    for k in range(nparams - ncarry - nxs):
        address[ncarry + nxs + k] = base[("free", k)]
    for i in inter:
        address.setdefault(i, base[("intermediate", i)])
    _calls(kernels, address, lines)
    lines += ["  %t.next = add i64 %t, 1", "  %more = icmp slt i64 %t.next, %length",
              "  br i1 %more, label %loop, label %done", "done:", "  ret void", "}",
              f"attributes #{_NOINLINE} = {{ noinline }}"]
    source = render_module(kernels) + "\n\n" + "\n".join(lines)
    return ScanProgram(node, lowering, source, table, compiler)


def _address_table(table: list, arrays: dict[str, list[np.ndarray]], schedule):
    """The driver's argument: the address of each `table` entry (kind, i), `arrays[kind][i]`, or for an
    "intermediate" entry a fresh array of that schedule buffer (the arrays must outlive the driver's call)."""
    fixed = {i: np.empty(spec.size, spec.dtype.np) for i, spec in enumerate(schedule.buffers)
             if spec.kind == "intermediate"}
    addresses = [(arrays[kind][i] if kind in arrays else fixed[i]).ctypes.data for kind, i in table]
    table_array = (ctypes.c_int64 * len(addresses))(*addresses)
    table_array.keep = fixed  # (the intermediates live as long as the table)
    return table_array


def _load_table(table: list, lines: list[str]) -> dict:
    """Load each entry of the driver's address table (its argument %table); {entry: the LLVM value}."""
    base = {}
    for n, entry in enumerate(table):
        lines.append(f"  %e{n} = getelementptr i64, ptr %table, i64 {n}")
        lines.append(f"  %a{n} = load i64, ptr %e{n}")
        base[entry] = f"%a{n}"
    return base


def _calls(kernels: list, address: dict[int, str], lines: list[str]) -> None:
    """One call per body kernel, each buffer argument at the address `address` gives its schedule buffer."""
    for n, (kernel, _) in enumerate(kernels):
        args = []
        for a, b in enumerate(kernel.args or [0]):
            lines.append(f"  %p{n}_{a} = inttoptr i64 {address[b] if kernel.args else 0} to ptr")
            args.append(f"ptr %p{n}_{a}")
        end = kernel.thread_size
        # (a call, not inlined: each kernel's `noalias` arguments hold per call only; inlined into this loop, where a
        # carry's buffer is written in one step and read in the next, LLVM moved loads across those steps and
        # jnp.linalg.solve of a float64 5 x 5 matrix gave NaNs on AVX-512)
        lines.append(f"  call void @{kernel.name}({', '.join(args)}, i64 0, i64 {end}) #{_NOINLINE}")


class WhileProgram:
    """The compiled loop of one WHILE node: a driver that runs the body's kernels, then the condition's on the new
    carry, and goes round again while it holds; `run(inputs, prepare)` checks the condition on the initial carry
    first (with the host path's compiled condition) and maps the inputs to the final carry like run_control."""

    def __init__(self, node: UOp, lowering, source: str, table: list, moving: list[bool], compiler):
        self.node, self.lowering, self.table, self.moving = node, lowering, table, moving
        self.engine, self.module = compiler.compile(source)
        proto = ctypes.CFUNCTYPE(ctypes.c_int64, ctypes.c_void_p)
        self.driver = proto(self.engine.get_function_address("while_driver"))

    def run(self, inputs: list[np.ndarray], prepare) -> list[np.ndarray]:
        ops = operands(self.node)
        check = prepare(body_function(self.node, self.node.src[1], [(u.shape, u.dtype) for u in ops]))
        if not bool(np.asarray(check(list(inputs))[0]).reshape(())): return list(inputs)
        carry = [np.array(c, copy=True).reshape(-1) for c in inputs]
        other = [np.empty_like(c) for c in carry]
        pred = np.zeros(1, np.bool_)
        arrays = {"carry": carry, "other": other, "pred": [pred]}
        steps = self.driver(_address_table(self.table, arrays, self.lowering.schedule))
        final = [o if moving and steps % 2 else c for c, o, moving in zip(carry, other, self.moving)]
        return [f.reshape(u.shape) for f, u in zip(final, ops)]


def compile_while(node: UOp, compiler) -> WhileProgram | None:
    """The native loop for WHILE `node`, or None when its body needs the host loop (as compile_scan). The body and
    the condition on the body's result are lowered as one function, (new carry..., continue?)."""
    ops = operands(node)
    ncarry, avals, tag = len(ops), [(u.shape, u.dtype) for u in ops], node.binds
    body, cond = node.src[0], node.src[1]
    params = {p: body.src[p.arg.slot] for p in cond.toposort if p.op is Ops.PARAM and p.arg.tag == tag}
    fused = UOp(Ops.TUPLE, dtypes.bool_, (*body.src, substitute(cond.src[0], params)))
    lowering = lower(body_function(node, fused, avals), replace(compiler.target, threads=1))
    schedule, kernels, outs = lowering.schedule, lowering.kernels, lowering.schedule.outputs
    if any(isinstance(k, HostStep) for k, _ in kernels) or not kernels: return None
    if any(k.work >= MIN_PARALLEL_WORK for k, _ in kernels): return None  # big bodies keep their threads
    if len(set(outs)) != len(outs) or outs[ncarry] < ncarry: return None
    if any(b < ncarry and b != i for i, b in enumerate(outs[:ncarry])): return None  # (a carry moved to another)
    moving = [b >= ncarry for b in outs[:ncarry]]  # (the others pass through unchanged: closed-over values)
    inter = [i for i, spec in enumerate(schedule.buffers) if spec.kind == "intermediate"]
    table = [("carry", i) for i in range(ncarry)] + [("other", i) for i in range(ncarry)] + [("pred", 0)] + \
        [("intermediate", i) for i in inter]
    lines = ["define i64 @while_driver(ptr %table) {", "entry:"]
    base = _load_table(table, lines)
    lines += ["  br label %loop", "loop:", "  %t = phi i64 [0, %entry], [%t.next, %loop]",
              "  %odd = and i64 %t, 1", "  %even = icmp eq i64 %odd, 0"]
    address: dict[int, str] = {outs[ncarry]: base[("pred", 0)]}
    for i in range(ncarry):  # step t reads a moving carry from ping on even steps, from pong on odd ones
        if not moving[i]:
            address[i] = base[("carry", i)]
            continue
        for name, a, b, slot in (("cin", "carry", "other", i), ("cout", "other", "carry", outs[i])):
            lines.append(f"  %{name}{i} = select i1 %even, i64 {base[(a, i)]}, i64 {base[(b, i)]}")
            address[slot] = f"%{name}{i}"
    for i in inter:
        address.setdefault(i, base[("intermediate", i)])
    _calls(kernels, address, lines)
    lines += ["  %t.next = add i64 %t, 1", f"  %pp = inttoptr i64 {base[('pred', 0)]} to ptr",
              "  %pv = load i8, ptr %pp", "  %more = icmp ne i8 %pv, 0",
              "  br i1 %more, label %loop, label %done", "done:", "  ret i64 %t.next", "}",
              f"attributes #{_NOINLINE} = {{ noinline }}"]
    source = render_module(kernels) + "\n\n" + "\n".join(lines)
    return WhileProgram(node, lowering, source, table, moving, compiler)


class CondProgram:
    """Both branches of one COND compiled into one module, each with a driver (`cond_true`, `cond_false`) that
    calls its kernels; `run(inputs, prepare)` picks the driver by the predicate (inputs[0])."""

    def __init__(self, node: UOp, lowerings: list, source: str, tables: list[list], compiler):
        self.node, self.lowerings, self.tables = node, lowerings, tables
        self.engine, self.module = compiler.compile(source)
        proto = ctypes.CFUNCTYPE(None, ctypes.c_void_p)
        self.drivers = [proto(self.engine.get_function_address(f"cond_{name}")) for name in ("true", "false")]

    def run(self, inputs: list[np.ndarray], prepare=None) -> list[np.ndarray]:
        branch = 0 if bool(np.asarray(inputs[0]).reshape(())) else 1
        values = [np.ascontiguousarray(v) for v in inputs[1:]]
        outs = [np.empty(o.shape, o.dtype.np) for o in self.node.src[branch].src]
        arrays = {"in": values, "out": outs}
        self.drivers[branch](_address_table(self.tables[branch], arrays, self.lowerings[branch].schedule))
        return outs


def compile_cond(node: UOp, compiler) -> CondProgram | None:
    """The native branches of COND `node`, or None when a branch needs the host path (a nested control-flow
    step, a kernel big enough for threads, an output that is an operand or another output)."""
    ops = operands(node)
    avals = [(u.shape, u.dtype) for u in ops]
    lowerings, tables, every, drivers = [], [], [], []
    for name, body in (("true", node.src[0]), ("false", node.src[1])):
        lowering = lower(body_function(node, body, avals), replace(compiler.target, threads=1))
        schedule, kernels, outs = lowering.schedule, lowering.kernels, lowering.schedule.outputs
        if any(isinstance(k, HostStep) for k, _ in kernels) or not kernels: return None
        if any(k.work >= MIN_PARALLEL_WORK for k, _ in kernels): return None
        if len(set(outs)) != len(outs) or any(b < len(ops) for b in outs): return None
        kernels = [(replace(k, name=f"{name}_{k.name}"), lin) for k, lin in kernels]  # (one module: names apart)
        inter = [i for i, spec in enumerate(schedule.buffers) if spec.kind == "intermediate"]
        table = [("in", i) for i in range(len(ops))] + [("out", m) for m in range(len(outs))] + \
            [("intermediate", i) for i in inter]
        lines = [f"define void @cond_{name}(ptr %table) {{", "entry:"]
        base = _load_table(table, lines)
        address = {i: base[("in", i)] for i in range(len(ops))}
        address.update({b: base[("out", m)] for m, b in enumerate(outs)})
        for i in inter: address.setdefault(i, base[("intermediate", i)])
        _calls(kernels, address, lines)
        lines += ["  ret void", "}"]
        lowerings.append(lowering)
        tables.append(table)
        every += kernels
        drivers.append("\n".join(lines))
    source = "\n\n".join([render_module(every)] + drivers) + f"\nattributes #{_NOINLINE} = {{ noinline }}"
    return CondProgram(node, lowerings, source, tables, compiler)
