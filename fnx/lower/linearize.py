"""linearize: order a kernel's scalar graph into a flat program with explicit loop nesting.

The kernel's output loops (`kernel.ranges`) nest in order. Every node is placed in the innermost loop among the
ranges it depends on, so loop-invariant work sits outside inner loops by construction. A REDUCE owns the loop nest
of its reduce ranges (REDUCE.src[1:]); the nest is emitted at the level of the output loops the REDUCE depends on
(a row sum consumed by every element of the row is computed once per row, before the element loop opens).
REDUCEs at the same level over the same ranges share one loop nest (register blocking: several accumulators
updated in one loop). An accumulator is set up before its loops open, updated in the innermost one, and read
after they close. Vector-lane ranges (`kernel.lanes`) are not loops: nodes that depend on one are vectors. Nor
are a grid kernel's work-group ranges (`kernel.locals`): they are the work item's index in its group, set from the
start; a REDUCE over one finishes with a combine across the group (the renderer's).
"""
from __future__ import annotations

from math import prod
from typing import TYPE_CHECKING

from fnx.lower.symbolic import row_stride
from fnx.uop import Ops, UOp

if TYPE_CHECKING:  # (rangeify builds its cost model on range_deps below)
    from fnx.lower.rangeify import Kernel

# a linear program is a list of (what, node): what in open/close/node/acc_init/acc_update/prefetch/
# prefetch_next
Linear = list[tuple[str, UOp]]
PREFETCH_ROW_BYTES = 4096  # a row (of a row-walking kernel's input) from which an inner loop prefetches the next
PREFETCH_ROW_WORK = 8  # operations a load of the loop that prefetches the next row (`_prefetch_next_rows`)
PREFETCH_MIN_TRIPS = 64  # iterations of a reduce nest from which the loads after it are prefetched before it: a
                         # memory miss (~100 ns) is then a fraction of the nest's time, not more than all of it


def range_deps(sink: UOp, pinned: frozenset = frozenset()) -> dict[UOp, frozenset]:
    """The RANGEs each node's value depends on (a REDUCE's value does not depend on its own reduce ranges; a
    LOAD/STORE of consecutive lanes depends on the lane range in its arg). A LOAD of a buffer the kernel writes
    also depends on the `pinned` ranges: it must not be hoisted above the previous iteration's store."""
    deps: dict[UOp, frozenset] = {}
    stored = {st.src[0] for st in sink.src if st.src} if pinned else set()
    none = frozenset()
    for u in sink.toposort:
        op, src = u.op, u.src
        if op is Ops.RANGE: d = frozenset((u,))
        elif op is Ops.REDUCE: d = deps[src[0]] - set(src[1:])
        else:
            d = deps[src[0]] if src else none
            for s in src[1:]:  # (most nodes add nothing to their first source's ranges: no new set)
                if (e := deps[s]) is not d and not e <= d: d = d | e
            if op is Ops.LOAD and src[0] in stored: d = d | pinned
        if u.arg is not None and op in (Ops.LOAD, Ops.STORE): d = d | {u.arg}
        deps[u] = d
    return deps


def linearize(kernel: Kernel) -> Linear:
    order = [u for u in kernel.sink.toposort if u.op not in (Ops.SINK, Ops.RANGE)]
    deps = range_deps(kernel.sink, frozenset(kernel.ranges))
    lanes = set(kernel.lanes) | set(kernel.locals)  # (not loops: open everywhere)
    lines: Linear = []
    emitted: set[UOp] = set()
    # output-loop reductions (fnx/lower/row_sums.py): REDUCEs over the kernel's own innermost output loops, updated
    # in their body beside the stores and finished as they close; what reads one waits until then
    outer_of = {}
    for u in order:
        if u.op is not Ops.REDUCE or not (loops := [r for r in u.src[1:] if r in kernel.ranges]): continue
        first = kernel.ranges.index(loops[0])
        assert set(loops) == set(kernel.ranges[first:]) and not set(u.src[1:]) - set(loops) - lanes, \
            f"linearize: a reduction over output loops must span the innermost ones ({kernel.name})"
        outer_of[u] = kernel.ranges[first]
    waiting = set(outer_of)
    for u in order:
        if u not in waiting and any(s in waiting for s in u.src): waiting.add(u)

    def emit_level(chain: list[UOp]) -> None:
        """Emit every node whose ranges are all open and include the innermost open one (toposort order)."""
        open_ranges, inner = set(chain) | lanes, chain[-1] if chain else None
        for u in order:
            if u in emitted or not deps[u] <= open_ranges: continue
            if inner is not None and inner not in deps[u]: continue
            if u in waiting and (u in outer_of or any(s in waiting and s not in emitted for s in u.src)): continue
            if u.op is Ops.REDUCE:
                emit_reduces(u, chain)
                continue
            lines.append(("node", u))
            emitted.add(u)

    def emit_reduces(first: UOp, chain: list[UOp]) -> None:
        """`first` and every other ready REDUCE over the same loops (not feeding one another) in one loop nest."""
        loops = [r for r in first.src[1:] if r not in lanes]
        open_ranges, inner = set(chain) | lanes, chain[-1] if chain else None

        def at_this_level(u: UOp) -> bool:
            return u not in emitted and deps[u] <= open_ranges and (inner is None or inner in deps[u])

        group, before = [first], set()
        for u in order:
            if u.op is not Ops.REDUCE or u is first or u in emitted or u.src[1:] != first.src[1:]: continue
            if not deps[u] <= open_ranges or u in first.toposort: continue
            needs = [a for a in u.toposort if a is not u and at_this_level(a)]  # must be computed before the nest
            if any(a.op is Ops.REDUCE for a in needs): continue
            group.append(u)
            before.update(needs)
        for u in order:
            if u in before and u not in emitted:
                lines.append(("node", u))
                emitted.add(u)
        if prod(r.arg.size for r in loops) >= PREFETCH_MIN_TRIPS: prefetch_after(group, at_this_level)
        for red in group: lines.append(("acc_init", red))
        for i, r in enumerate(loops):
            lines.append(("open", r))
            emit_level(chain + loops[:i + 1])
        for red in group: lines.append(("acc_update", red))
        for r in reversed(loops): lines.append(("close", r))
        for red in group:
            lines.append(("node", red))
            emitted.add(red)

    def prefetch_after(group: list[UOp], at_this_level) -> None:
        """("prefetch", load) lines for the loads this level reads once the nest of `group` closes (a matmul tile's
        C rows, accumulated onto): their addresses are known before the nest opens, so the cache lines (and their
        pages' translations) arrive while it runs instead of stalling the loads after it. The index arithmetic
        moves before the nest."""
        inside = set().union(*(red.toposort for red in group))
        for u in order:
            if u.op is not Ops.LOAD or u in inside or not at_this_level(u): continue
            index = [a for a in u.src[1].toposort if a.op is not Ops.RANGE and at_this_level(a)]
            if any(a.op in (Ops.REDUCE, Ops.LOAD) for a in index): continue
            for a in index:
                lines.append(("node", a))
                emitted.add(a)
            lines.append(("prefetch", u))

    emit_level([])
    for i, r in enumerate(kernel.ranges):
        lines += [("acc_init", red) for red, outer in outer_of.items() if outer is r]
        lines.append(("open", r))
        emit_level(kernel.ranges[:i + 1])
    lines += [("acc_update", red) for red in outer_of]
    for i in reversed(range(len(kernel.ranges))):
        lines.append(("close", kernel.ranges[i]))
        if done := [red for red, outer in outer_of.items() if outer is kernel.ranges[i]]:
            for red in done:
                lines.append(("node", red))
                emitted.add(red)
            emit_level(kernel.ranges[:i])
    missing = [u for u in order if u not in emitted]
    assert not missing, f"linearize: nodes left unplaced: {missing[:3]}"
    return _prefetch_next_rows(kernel, lines, deps)


def _prefetch_next_rows(kernel: Kernel, lines: Linear, deps: dict) -> Linear:
    """`lines` with the next row prefetched by the inner loop that computes the most per row it loads: a
    ("prefetch_next", load) before each of that loop's loads of a row of a buffer the kernel does not write
    (`row * S + rest`, the row being the thread-split loop's), for the same place of the next row, when that
    loop loads nothing else, does at least PREFETCH_ROW_WORK operations a load, and a row is at least
    PREFETCH_ROW_BYTES.

    A softmax row of 4096 floats is read from memory by its max pass, then its exps are computed from cache: the
    hardware prefetchers, which run a few lines ahead of the loads, idle meanwhile. Prefetched during the exps,
    the next row arrives while they are computed (W3 on the AVX2 EPYC 7.7 -> 6.3 ms). A loop of a few operations
    a load (a layernorm's passes) has no time to hide it in, and pays for the prefetches: W10, whose rows come
    from cache in a row chain, took 1.4x as long with them in every pass."""
    if kernel.thread_range < 0 or kernel.locals or not PREFETCH_ROW_BYTES: return lines
    row = kernel.ranges[kernel.thread_range]
    stored = {st.src[0] for st in kernel.sink.src if st.src}
    lanes = set(kernel.lanes)

    def next_row(u: UOp) -> int | None:
        """The row stride of load `u` when it reads rows the kernel does not write, else None."""
        if u.src[0] in stored or (u.arg is None and lanes & deps[u]): return None
        stride = row_stride(u.src[1], row, u.arg.arg.size if u.arg is not None else 1)
        return stride if stride is not None and stride * u.src[0].dtype.itemsize >= PREFETCH_ROW_BYTES else None

    work: dict[UOp, list[int]] = {}  # inner loop -> [its operations, its loads of rows, its other loads]
    loops: list[UOp] = []
    for what, u in lines:
        if what == "open": loops.append(u)
        elif what == "close": loops.pop()
        elif loops and loops[-1] is not row and row in loops and what in ("node", "acc_update"):
            counts = work.setdefault(loops[-1], [0, 0, 0])
            if what == "node" and u.op is Ops.LOAD: counts[1 if next_row(u) is not None else 2] += 1
            elif u.op not in (Ops.STORE, Ops.CONST): counts[0] += 1
    # (a loop that also loads other data, a matmul's B, is bound by those loads and its reuse, not by the row)
    best = max((loop for loop, (ops, rows, other) in work.items() if rows and not other),
               key=lambda r: work[r][0] / work[r][1], default=None)
    if best is None or work[best][0] < PREFETCH_ROW_WORK * work[best][1]: return lines
    out: Linear = []
    loops = []
    for what, u in lines:
        if what == "open": loops.append(u)
        elif what == "close": loops.pop()
        elif what == "node" and u.op is Ops.LOAD and loops and loops[-1] is best and (stride := next_row(u)):
            ahead = UOp(Ops.ADD, u.src[1].dtype, (u.src[1], UOp.const(u.src[1].dtype, stride)))
            if ahead not in deps:  # (a node of the kernel's own would be placed twice)
                out += [("node", ahead), ("prefetch_next", UOp(Ops.LOAD, u.dtype, (u.src[0], ahead), u.arg))]
        out.append((what, u))
    return out


def format_linear(lines: Linear) -> str:
    names: dict[UOp, str] = {}
    out, depth = [], 0
    for what, u in lines:
        if what == "close":
            depth -= 1
            out.append("  " * depth + f"end r{u.arg.number}")
            continue
        names.setdefault(u, f"r{u.arg.number}" if u.op is Ops.RANGE else f"%{len(names)}")
        if what == "open":
            out.append("  " * depth + f"for r{u.arg.number} in range({u.arg.size}):")
            depth += 1
            continue
        if what in ("prefetch", "prefetch_next"):
            out.append("  " * depth + f"{what} {names.get(u.src[0], '?')} {names.get(u.src[1], '?')}")
            continue
        if what in ("acc_init", "acc_update"):
            out.append("  " * depth + f"{what} {names[u]} {u.arg.op.name.lower()}" +
                       (f" {names.get(u.src[0], '?')}" if what == "acc_update" else ""))
            continue
        args = " ".join(names.get(s, f"r{s.arg.number}" if s.op is Ops.RANGE else "?") for s in u.src)
        extra = f" {u.arg.value!r}" if u.op is Ops.CONST else f" {u.arg.op.name.lower()}" if u.op is Ops.REDUCE else ""
        out.append("  " * depth + f"{names[u]} = {u.op.name.lower()} {u.dtype.name} {args}{extra}".rstrip())
    return "\n".join(out)
