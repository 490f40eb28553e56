"""The lowering pipeline, stage by stage: callify → simplify → rangeify → optimize → linearize.

`lower(fn)` returns a `Lowering` that keeps every stage's output so `as_text(stage)` and FNX_DEBUG=3 can show
the graph between any two stages. Backends render `Lowering.kernels` into their own source.
"""
from __future__ import annotations

from dataclasses import dataclass

from fnx import dtypes
from fnx.debug.printing import format_function
from fnx.lower.linearize import Linear, format_linear, linearize
from fnx.lower.optimize import optimize
from fnx.lower.rangeify import Kernel, Schedule, rangeify
from fnx.lower.symbolic import simplify_graph
from fnx.lower.transcendental import transcendental
from fnx.rewrite import graph_rewrite, substitute
from fnx.uop import Ops, UOp

STAGES = ("callify", "rangeify", "optimize", "linearize")



def callify(fn: UOp) -> UOp:
    """Inline nested FUNCTION calls (GETTUPLE of FUNCTION) into one FUNCTION over PARAMs, then simplify."""
    body = fn.src[0]
    calls = [u for u in body.toposort if u.op is Ops.GETTUPLE and u.src[0].op is Ops.FUNCTION]
    if calls:
        mapping = {}
        for g in calls:
            inner_body, args = g.src[0].src[0], g.src[0].src[1:]
            params = {p: args[p.arg[0]] for p in inner_body.toposort if p.op is Ops.PARAM}
            mapping[g] = substitute(inner_body.src[g.arg], params)
        body = substitute(body, mapping)
        return callify(UOp(Ops.FUNCTION, fn.dtype, (body, *fn.src[1:])))
    return UOp(Ops.FUNCTION, fn.dtype, (simplify_graph(body), *fn.src[1:]))


@dataclass
class Lowering:
    fn: UOp
    schedule: Schedule
    kernels: list[tuple[Kernel, Linear]]

    def as_text(self, stage: str) -> str:
        if stage == "callify": return format_function(self.fn)
        parts = []
        for kernel, lines in self.kernels:
            head = (f"kernel {kernel.name}: buffers {kernel.args}, loops "
                    f"{[r.arg[1] for r in kernel.ranges]} reduce {[r.arg[1] for r in kernel.reduce_ranges]}")
            if stage == "optimize": head += f", thread-split loop {kernel.thread_range}"
            parts.append(f"{head}\n{format_linear(lines)}" if stage == "linearize" else head)
        return "\n".join(parts)


def lower(fn: UOp, threads: int) -> Lowering:
    fn = callify(fn)
    schedule = rangeify(fn)
    kernels = []
    for i, kernel in enumerate(schedule.kernels):
        kernel.name = f"k{i}_{kernel.name}"
        kernel.sink = graph_rewrite(kernel.sink, transcendental)
        kernels.extend((k, linearize(k)) for k in optimize(kernel, threads))
    return Lowering(fn, schedule, kernels)


__all__ = ["lower", "Lowering", "STAGES", "callify", "dtypes"]
