"""Carried row sums: the kernel that writes an array row by row also sums each row as it writes it, for a later
kernel that would otherwise read the whole row again only to sum it.

A chain of layernorms with residuals (x = x + f(layernorm(x)), eight times: W10) writes each step's x in one
kernel, and the next kernel's first pass over a row is its mean: a loop that loads the row back and adds it up.
On a row kept in L1 that loop is a third of the next kernel's loads, and the writing loop had every element in a
register already (W10 on a 2-core Zen 4 in AVX-512 code, interleaved in one process: 2.32 -> 2.08 ms; rows in
L1 0.195 -> 0.176 ms).

When a kernel's only store walks a buffer row-major (its innermost output loop along a row of n, the loops
outside it along whole rows) and a later kernel sums that buffer along such rows (a REDUCE ADD over one reduce
loop of n whose source is an elementwise function of one LOAD of the buffer, at `row * n + r`), the writer also
stores the sum of that function of each row it writes into a new (rows,) buffer, and the reader loads that
instead of reducing. The function is applied to the value the writer stores, after its rounding to the buffer's
type, so the reader sums what it summed before (a float16 row's float32 sum, a row's squares). The writer's sum
is a REDUCE over its own innermost output loop: linearize updates its accumulator in that loop's body, beside the
store, and finishes it as the loop closes. A reader that stores nothing but functions of such sums, at the rows
they sum (a row sum or mean kernel of its own: a softmax's sum under a gradient), goes entirely: the writer
stores what it stored (`_absorb`). Left as a kernel, such a reader had too little work to be thread-split, and
broke the row chain around it (fnx/lower/chain.py).

Only on devices that run loops (a grid device's output loops are its work items, and a sum across them would be
a work-group reduction) with MIN_REGISTERS vector registers or more, only float sums, only rows of at most
MAX_ROW, only when the writer writes nothing else and no other step writes the buffer, and not from a
matmul-like writer (its schedule tiles, splits and accumulates in its output loops; the optimizer refuses any
action but lanes on a loop that carries a sum). The sum adds in another order than the reader's did (vector
lanes, then across them, as any fnx sum: docs/LOWERING.md).
"""
from __future__ import annotations

from fnx.lower.rangeify import INDEX, BufferSpec, HostStep, Kernel, Schedule
from fnx.lower.symbolic import build, terms
from fnx.lower.target import Target
from fnx.rewrite import substitute
from fnx.uop import GroupOp, Ops, ParamArg, ReduceArg, UOp, postorder

CARRY_ROW_SUMS = True  # (a switch for A/B runs and tests)
MIN_REGISTERS = 32  # vector registers a target needs: a row pair's output loop then holds its sums' accumulators
                    # too. With AVX2's 16 they spill: W10 in AVX2 code on a Zen 4, interleaved in one process,
                    # 2.19 -> 2.71 ms (AVX-512 code, 32 registers: 2.32 -> 2.08 ms; rows in L1 0.195 -> 0.176)
MAX_ROW = 1024  # longest row summed so: its sum is one loop's accumulators, not the levels of a blocked sum
                # (optimize.block_sums: at most FLAT_SUM_MAX additions in a row each, so with 4 lanes or more)


def _row_index(index: UOp, inner: UOp, outer: list[UOp]) -> UOp | None:
    """The row number of a row-major `index` = inner + n * row (n = inner's size), row an affine function of
    loops in `outer` with coefficients that are multiples of n; None for any other index."""
    n = inner.arg.size
    parts, const = terms(index)
    if const or sorted(c for t, c in parts if t is inner) != [1]: return None
    rest = [(t, c) for t, c in parts if t is not inner]
    if any(t not in outer or c % n or c <= 0 for t, c in rest) or len({id(t) for t, _ in rest}) != len(rest):
        return None
    return build(INDEX, [(t, c // n) for t, c in rest], 0)


def _matmul_like(red: UOp) -> bool:
    """Whether REDUCE `red` sums products of two buffers that both vary along its loops."""
    loops = set(red.src[1:])
    return len({ld.src[0] for ld in red.src[0].toposort if ld.op is Ops.LOAD
                and any(r in loops for r in ld.src[1].toposort)}) > 1


def _written_rows(k: Kernel) -> tuple[UOp, UOp, int, UOp] | None:
    """(column loop, row index, rows, stored value) of a kernel whose only store writes its buffer row-major, each
    row's elements over its innermost output loop and every row once over the loops outside it."""
    if isinstance(k, HostStep) or not k.parallel or k.row_ranges is not None or len(k.ranges) < 2: return None
    if len(k.sink.src) != 1 or (st := k.sink.src[0]).op is not Ops.STORE or len(st.src) != 3: return None
    if any(_matmul_like(red) for red in k.sink.toposort if red.op is Ops.REDUCE):
        return None  # (its schedule blocks and splits the output loops, or accumulates in them)
    column, outer = k.ranges[-1], k.ranges[:-1]
    if column.arg.size > MAX_ROW or (row := _row_index(st.src[1], column, outer)) is None: return None
    rows = 1
    for r in outer: rows *= r.arg.size
    lo, hi = row.bounds
    if set(r for r in row.toposort if r.op is Ops.RANGE) != set(outer) or lo != 0 or hi != rows - 1: return None
    return column, row, rows, st.src[2]


def _summed(k: Kernel, red: UOp) -> tuple[UOp, UOp] | None:
    """(the LOAD, the reader's row index) of a REDUCE of kernel k that sums an elementwise function of one LOAD
    along rows of its buffer (over one reduce loop), or None."""
    if red.arg.op is not Ops.ADD or len(red.src) != 2 or not red.dtype.is_float: return None
    r = red.src[1]
    if r.op is not Ops.RANGE or r not in k.reduce_ranges: return None
    loads = [u for u in red.src[0].toposort if u.op is Ops.LOAD]
    if len(loads) != 1 or len(loads[0].src) != 2: return None  # (a gated load: a pad's)
    ld = loads[0]
    # elementwise in the loaded value: above the load nothing but arithmetic on it and constants
    if any(u is not ld and u.op not in GroupOp.ALU and u.op is not Ops.CONST for u in postorder(red.src[0], stop={ld})):
        return None
    if (row := _row_index(ld.src[1], r, k.ranges)) is None: return None
    return ld, row


def carry_row_sums(schedule: Schedule, target: Target) -> None:
    """Rewrite `schedule`'s kernels in place for `target` (module docstring)."""
    if not CARRY_ROW_SUMS or target.grid or target.vector_registers < MIN_REGISTERS: return
    writers: dict[int, list[int]] = {}
    for i, k in enumerate(schedule.kernels):
        for b in (k.outputs + k.inputs if isinstance(k, HostStep) else k.buffers(Ops.STORE)):
            writers.setdefault(b, []).append(i)
    sums: dict[tuple, int] = {}  # (summed buffer, the function summed) -> the buffer of its row sums
    rows_of: dict[int, tuple | None] = {}  # a writer's rows, found before it stores any sums
    absorbed: set[int] = set()
    for i, k in enumerate(schedule.kernels):
        if isinstance(k, HostStep): continue
        found = []  # (REDUCE, its LOAD, the row it sums, the writer's index, the writer's rows)
        for red in k.sink.toposort:
            if red.op is not Ops.REDUCE or (summed := _summed(k, red)) is None: continue
            ld, row = summed
            b = k.args[ld.src[0].arg.slot]
            if len(w := writers.get(b, [])) != 1 or w[0] >= i or b in k.buffers(Ops.STORE): continue
            if w[0] not in rows_of: rows_of[w[0]] = _written_rows(schedule.kernels[w[0]])
            if (rows := rows_of[w[0]]) is None or rows[0].arg.size != red.src[1].arg.size: continue
            lo, hi = row.bounds
            if lo < 0 or hi >= rows[2]: continue
            found.append((red, ld, row, w[0], rows))
        if not found: continue
        if _absorb(schedule, k, found):
            absorbed.add(i)
            continue
        loads = {}
        for red, ld, row, w, rows in found:
            key = (k.args[ld.src[0].arg.slot], substitute(red.src[0], {ld: UOp(Ops.ACC, ld.dtype, (), "summed")}))
            if key not in sums: sums[key] = _add_row_sums(schedule, schedule.kernels[w], rows, red, ld)
            loads[red] = UOp(Ops.LOAD, red.dtype, (_param(k, sums[key], schedule), row))
        _set_sink(k, substitute(k.sink, loads))
        k.reduce_ranges = [r for r in k.reduce_ranges if r in k.sink.toposort]
    schedule.kernels = [k for i, k in enumerate(schedule.kernels) if i not in absorbed]


def _same_index(a: UOp, b: UOp) -> bool:
    (pa, ca), (pb, cb) = terms(a), terms(b)
    return ca == cb and sorted((id(t), c) for t, c in pa) == sorted((id(t), c) for t, c in pb)


def _absorb(schedule: Schedule, reader: Kernel, found: list) -> bool:
    """Move `reader` into its one writer when all it stores, row by row, is a function of the sums it reads from
    that writer's rows (a row sum or mean kernel of its own: the softmax sum under a gradient): the writer then
    stores it as it finishes each row, and the reader's kernel goes. False (nothing changed) otherwise."""
    if len({w for *_, w, _ in found}) != 1: return False
    sums = {red for red, *_ in found}
    row, n_rows = found[0][2], found[0][4][2]
    iterations = 1
    for r in reader.ranges: iterations *= r.arg.size
    # (every row once: the writer stores each of its rows' values, so the reader must have stored all of them)
    if iterations != n_rows or row.bounds != (0, n_rows - 1): return False
    for st in reader.sink.src:
        if st.op is not Ops.STORE or len(st.src) != 3 or not _same_index(st.src[1], row): return False
        if schedule.buffers[reader.args[st.src[0].arg.slot]].size != n_rows: return False
        if any(u not in sums and u.op not in GroupOp.ALU and u.op is not Ops.CONST
               for u in postorder(st.src[2], stop=sums)):
            return False
    if any(not _same_index(r, row) for _, _, r, _, _ in found): return False
    writer = schedule.kernels[found[0][3]]
    column, writer_row, _, value = found[0][4]
    totals = {red: UOp(Ops.REDUCE, red.dtype, (substitute(red.src[0], {ld: value}), column), ReduceArg(Ops.ADD, ()))
              for red, ld, *_ in found}
    stores = tuple(UOp(Ops.STORE, st.dtype, (_param(writer, reader.args[st.src[0].arg.slot], schedule), writer_row,
                                                substitute(st.src[2], totals))) for st in reader.sink.src)
    _set_sink(writer, UOp(Ops.SINK, writer.sink.dtype, writer.sink.src + stores, writer.sink.arg))
    return True


def _param(k: Kernel, buf: int, schedule: Schedule) -> UOp:
    if buf not in k.args: k.args.append(buf)
    spec = schedule.buffers[buf]
    return UOp(Ops.PARAM, spec.dtype, (), ParamArg(k.args.index(buf), (spec.size,), None))


def _add_row_sums(schedule: Schedule, writer: Kernel, rows: tuple, red: UOp, ld: UOp) -> int:
    """A (rows,) buffer that `writer` fills with the sum along each row it writes of what REDUCE `red` sums (its
    function of LOAD `ld`, applied to the value the writer stores)."""
    column, row, n_rows, value = rows
    schedule.buffers.append(BufferSpec(red.dtype, n_rows, "intermediate"))
    buf = len(schedule.buffers) - 1
    total = UOp(Ops.REDUCE, red.dtype, (substitute(red.src[0], {ld: value}), column), ReduceArg(Ops.ADD, ()))
    store = UOp(Ops.STORE, writer.sink.src[0].dtype, (_param(writer, buf, schedule), row, total))
    _set_sink(writer, UOp(Ops.SINK, writer.sink.dtype, writer.sink.src + (store,), writer.sink.arg))
    return buf


def _set_sink(k: Kernel, sink: UOp) -> None:
    k.sink = sink
    for fact in ("work", "thread_size", "output"): k.__dict__.pop(fact, None)


__all__ = ["carry_row_sums", "CARRY_ROW_SUMS", "MAX_ROW"]
