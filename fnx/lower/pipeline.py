"""The lowering pipeline, stage by stage: callify → simplify → rangeify → optimize → linearize.

`lower(fn)` returns a `Lowering` that keeps every stage's output so `as_text(stage)` and FNX_DEBUG=3 can show
the graph between any two stages. Backends render `Lowering.kernels` into their own source.
"""
from __future__ import annotations

import contextlib
import sys
from dataclasses import dataclass

from fnx import dtypes
from fnx.debug.printing import format_function
from fnx.lower.linearize import Linear, format_linear, linearize
from fnx.lower.memory import MemoryPlan, plan_memory
from fnx.lower.optimize import optimize
from fnx.lower.rangeify import BufferSpec, ControlStep, Kernel, Schedule, rangeify
from fnx.lower.symbolic import simplify_graph
from fnx.lower.transcendental import transcendental
from fnx.rewrite import graph_rewrite, substitute
from fnx.uop import Ops, UOp

STAGES = ("callify", "rangeify", "optimize", "linearize", "memory")



def inline_calls(body: UOp) -> UOp:
    """`body` with every call (GETTUPLE of FUNCTION or CALL) replaced by the callee's output on its arguments."""
    calls = [u for u in body.toposort if u.op is Ops.GETTUPLE and u.src[0].op in (Ops.FUNCTION, Ops.CALL)]
    if not calls: return body
    mapping = {}
    for g in calls:
        inner_body, args = g.src[0].src[0], g.src[0].src[1:]
        params = {p: args[p.arg[0]] for p in inner_body.toposort if p.op is Ops.PARAM and p.arg[3:] == _tag(g)}
        mapping[g] = substitute(inner_body.src[g.arg], params)
    return inline_calls(substitute(body, mapping))


def callify(fn: UOp) -> UOp:
    """Inline nested calls into one FUNCTION over PARAMs, then simplify."""
    return UOp(Ops.FUNCTION, fn.dtype, (simplify_graph(inline_calls(fn.src[0])), *fn.src[1:]))


def _tag(call_output: UOp) -> tuple:
    """The PARAM tag of a call's body (custom rules trace their bodies with a tag of their own)."""
    rule = call_output.src[0].arg
    return tuple(getattr(rule, "tag", ()))


@contextlib.contextmanager
def _deep_recursion(limit: int = 50_000):
    previous = sys.getrecursionlimit()
    sys.setrecursionlimit(max(previous, limit))
    try:
        yield
    finally:
        sys.setrecursionlimit(previous)


@dataclass
class Lowering:
    fn: UOp
    schedule: Schedule
    kernels: list[tuple[Kernel, Linear]]
    memory: MemoryPlan

    def as_text(self, stage: str) -> str:
        if stage == "callify": return format_function(self.fn)
        if stage == "memory":
            plan = self.memory
            return (f"{len(plan.slot_of)} intermediate buffers in {len(plan.slot_bytes)} allocations: "
                    f"{plan.planned_bytes} bytes instead of {plan.unplanned_bytes}; buffer -> slot {plan.slot_of}")
        if stage == "rangeify":  # the kernel split, each kernel with its estimated FLOPs and bytes
            from fnx.lower.cost import describe
            return "\n".join(f"{k.name}: host loop over compiled bodies" if isinstance(k, ControlStep) else
                             f"kernel {describe(k)}; buffers {k.args}, loops {[r.arg[1] for r in k.ranges]} reduce "
                             f"{[r.arg[1] for r in k.reduce_ranges]}" for k in self.schedule.kernels)
        parts = []
        for kernel, lines in self.kernels:
            if lines is None:
                parts.append(f"{kernel.name}: host loop over compiled bodies, buffers {kernel.inputs} -> "
                             f"{kernel.outputs}")
                continue
            head = (f"kernel {kernel.name}: buffers {kernel.args}, loops "
                    f"{[r.arg[1] for r in kernel.ranges]} reduce {[r.arg[1] for r in kernel.reduce_ranges]}")
            if stage == "optimize":
                lanes = f", vector lanes {kernel.lanes[0].arg[1]} x{len(kernel.lanes)}" if kernel.lanes else ""
                head += f", actions {list(kernel.opts)}{lanes}, thread-split loop {kernel.thread_range}"
            parts.append(f"{head}\n{format_linear(lines)}" if stage == "linearize" else head)
        return "\n".join(parts)


def _new_buffer(schedule: Schedule):
    """A callback giving the schedule a new intermediate buffer (PACK's panels) and returning its id."""
    def new(dtype: dtypes.DType, size: int) -> int:
        schedule.buffers.append(BufferSpec(dtype, size, "intermediate"))
        return len(schedule.buffers) - 1
    return new


def lower(fn: UOp, threads: int, emit=None) -> Lowering:
    """The kernels of FUNCTION `fn` for a CPU with `threads` threads; `emit(kernels)`, when given, receives each
    kernel's optimized pieces (kernel, linear program) as soon as they are done (the CPU backend compiles them
    while the next ones are lowered)."""
    fn = callify(fn)
    with _deep_recursion():  # rangeify recurses along fused chains, which can be long (sorting networks, scans)
        schedule = rangeify(fn)
    kernels: list = []
    for i, kernel in enumerate(schedule.kernels):
        kernel.name = f"k{i}_{kernel.name}"
        if isinstance(kernel, ControlStep):  # runs on the host: its bodies are lowered when first called
            kernels.append((kernel, None))
            continue
        kernel.sink = graph_rewrite(kernel.sink, transcendental)
        done = [(k, linearize(k)) for k in optimize(kernel, threads, new_buffer=_new_buffer(schedule))]
        kernels.extend(done)
        if emit is not None: emit(done)
    return Lowering(fn, schedule, kernels, plan_memory(schedule, [k for k, _ in kernels]))


__all__ = ["lower", "Lowering", "STAGES", "callify", "dtypes"]
