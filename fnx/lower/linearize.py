"""linearize: order a kernel's scalar graph into a flat program with explicit loop nesting.

Each node is placed in the innermost loop among the ranges it depends on (so loop-invariant work sits outside
inner loops by construction). A REDUCE's accumulator is set up before its loops open, updated in the innermost
one, and read after they close.
"""
from __future__ import annotations

from fnx.lower.rangeify import Kernel
from fnx.uop import Ops, UOp

# a linear program is a list of (what, node): what in open/close/node/acc_init/acc_update
Linear = list[tuple[str, UOp]]


def linearize(kernel: Kernel) -> Linear:
    nest = kernel.ranges + kernel.reduce_ranges
    position = {r: i for i, r in enumerate(nest)}
    level: dict[UOp, int] = {}
    after_reduce: dict[UOp, bool] = {}
    order = [u for u in kernel.sink.toposort if u.op not in (Ops.SINK, Ops.RANGE)]
    reduce_set = set(kernel.reduce_ranges)
    for u in kernel.sink.toposort:
        if u.op is Ops.RANGE:
            level[u], after_reduce[u] = position[u], False
            continue
        if u.op is Ops.REDUCE:
            level[u] = max((position[r] for r in _ranges_of(u.src[0], level) if r not in reduce_set), default=-1)
            after_reduce[u] = True
            continue
        level[u] = max((level[s] for s in u.src), default=-1)
        after_reduce[u] = any(after_reduce[s] for s in u.src)
    lines: Linear = []
    emitted: set[UOp] = set()

    def emit_level(lvl: int, late: bool) -> None:
        for u in order:
            if u not in emitted and level[u] == lvl and after_reduce[u] == late and u.op is not Ops.REDUCE:
                lines.append(("node", u))
                emitted.add(u)

    emit_level(-1, False)
    for i, r in enumerate(kernel.ranges):
        lines.append(("open", r))
        emit_level(i, False)
    reduce_node = next((u for u in order if u.op is Ops.REDUCE), None)
    if reduce_node is not None:
        lines.append(("acc_init", reduce_node))
        for i, r in enumerate(kernel.reduce_ranges, start=len(kernel.ranges)):
            lines.append(("open", r))
            emit_level(i, False)
        lines.append(("acc_update", reduce_node))
        for r in reversed(kernel.reduce_ranges):
            lines.append(("close", r))
        lines.append(("node", reduce_node))
        emitted.add(reduce_node)
        for lvl in range(-1, len(kernel.ranges)):
            emit_level(lvl, True)
    for r in reversed(kernel.ranges):
        lines.append(("close", r))
    missing = [u for u in order if u not in emitted]
    assert not missing, f"linearize: nodes left unplaced: {missing[:3]}"
    return lines


def _ranges_of(u: UOp, level: dict) -> set[UOp]:
    return {n for n in u.toposort if n.op is Ops.RANGE}


def format_linear(lines: Linear) -> str:
    names: dict[UOp, str] = {}
    out, depth = [], 0
    for what, u in lines:
        if what == "close":
            depth -= 1
            out.append("  " * depth + f"end r{u.arg[0]}")
            continue
        names.setdefault(u, f"r{u.arg[0]}" if u.op is Ops.RANGE else f"%{len(names)}")
        if what == "open":
            out.append("  " * depth + f"for r{u.arg[0]} in range({u.arg[1]}):")
            depth += 1
            continue
        if what in ("acc_init", "acc_update"):
            out.append("  " * depth + f"{what} {names[u]} {u.arg[0].name.lower()}" +
                       (f" {names.get(u.src[0], '?')}" if what == "acc_update" else ""))
            continue
        args = " ".join(names.get(s, "?") for s in u.src)
        extra = f" {u.arg[0]!r}" if u.op is Ops.CONST else f" {u.arg[0].name.lower()}" if u.op is Ops.REDUCE else ""
        label = {"acc_init": "acc_init", "acc_update": "acc_update"}.get(what, u.op.name.lower())
        out.append("  " * depth + f"{names[u]} = {label} {u.dtype.name} {args}{extra}".rstrip())
    return "\n".join(out)
