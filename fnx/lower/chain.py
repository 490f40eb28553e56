"""Row chains: consecutive kernels that walk the same rows run block by block, each block through all of them.

A chain of layernorms (eight steps on (4096, 1024), one kernel each) reads and writes the whole array once per
kernel, though each step needs only its own row of the step before: a 4 KB row of all eight steps fits in L1.
The kernels are already what makes a row fast (each reduction and the elementwise pass over a row, vectorized);
what costs is the memory traffic between them. So the runtime runs them interleaved: rows 0..B of every kernel
of the chain, then rows B..2B, and so on, over chunks of the rows the threads take in turn. An intermediate
buffer that only the chain uses then never needs its whole size: each chunk gets a scratch region of B rows per
such buffer,
and a kernel is handed that region's address shifted back by the block's first row, so its unchanged index
arithmetic lands in the region. The chain reads its inputs and writes its outputs once; what passes between its
kernels stays in cache. (XLA and tinygrad fuse such chains inside one kernel; here the kernels stay as they are
and a small native driver calls them block by block: `fnx/backends/chain_driver.py`.)

When this is right: every kernel's thread-split loop (its outermost independent loop, `Kernel.thread_range`)
runs over the same N rows, and every access to a buffer some kernel of the chain writes is *row-local*: its
index is `row * S + rest` with `0 <= rest < S` and the same S for every access of that buffer in the chain. Then
a block of rows touches only its own S-element rows of those buffers, blocks are disjoint, and within a block
the kernels run in their order: the same reads see the same writes as when each kernel runs whole. Buffers the
chain only reads may be read anywhere (a weight vector, a broadcast row). Memory planning and donation treat the
chain as one step, so no two of its buffers share memory.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from fnx import dtypes
from fnx.lower.linearize import range_deps
from fnx.lower.rangeify import BufferSpec, HostStep, Kernel, Schedule
from fnx.lower.symbolic import build, row_stride, terms
from fnx.lower.target import Target
from fnx.uop import Ops, UOp

CHUNKS_PER_THREAD = 4  # a thread-split loop runs as this many chunks a thread, which the threads take from a queue
                       # as they finish (fnx/backends/native_pool.py): a core slowed by another tenant takes fewer
                       # (one equal chunk a thread waited for the slower core: a 1024² matmul's caller half took
                       # 10.7 ms while the worker's half was done)
CHAIN_L1_PERCENT = 67  # of L1 a member's rows of a block (what it reads and writes) may fill: all of it left no room
                       # for the rest a kernel touches, and part of each block came back from L2 (W10, interleaved:
                       # 2 row pairs a block against 3, 0.94x the time in two runs; 1 pair 0.97x)
CHAIN_IN_PLACE = 1  # a member's output takes the very place of an input it reads only before writing (`_in_place`)
CHAIN_REUSE = 1  # scratch buffers whose rows no later member reads give their place to the next (`_regions`)
CHAIN_ORDER = 1  # kernels that can continue a chain move up to where it ends (`chain_order`)
CHAIN_LOOKAHEAD = 8  # steps `chain_order` looks past for one
CHAIN_MIN_BYTES = 1 << 20  # the chain's scratch buffers together at least this big: smaller ones stay in cache anyway
CHAIN_PREFETCH_LINES = 512  # cache lines of the next block the driver prefetches at most (`RowChain.prefetch`)


@dataclass
class RowChain:
    """Kernels `first`..`first + len(members) - 1` of a lowering, run block by block (module docstring)."""
    name: str
    first: int
    members: list[Kernel]
    rows: int                  # N, the rows every member's thread-split loop runs over
    block: int                 # rows per block
    step: int                  # rows per chunk (N when the chain runs on one thread); a chunk's scratch region is
                               # the (start / step)-th
    args: list[int]            # the schedule buffers the driver is given: members' buffers except the scratch ones,
                               # then `scratch_buffer`
    scratch: dict[int, tuple[int, int]]  # scratch buffer id -> (byte offset in a chunk's region, bytes per row)
    thread_bytes: int          # one chunk's scratch region
    scratch_buffer: int        # the schedule buffer of every chunk's region
    prefetch: list = field(default_factory=list)  # [buffer, bytes a row] of the inputs the driver prefetches
    # the next block of, a few lines before each member: the chain's arithmetic runs on blocks in L1, and only its
    # first member read from memory, which the hardware's prefetchers do not run far enough ahead of (`_prefetched`)

    @property
    def work(self) -> int:
        return sum(k.work for k in self.members)

    @property
    def chunks(self) -> int:
        return -(-self.rows // self.step)


def _accesses(kernel: Kernel) -> list[tuple[int, bool, int | None]] | None:
    """(buffer id, written?, row stride or None) of each LOAD and STORE of a kernel whose thread-split loop is its
    rows; None when the kernel cannot join a chain.

    Nor can one whose thread-split loop runs inside loops of more than one iteration: a block of rows would run
    all of them again, so what they reuse across rows would be fetched again for every block. (A large matmul's
    k-slabs and column blocks: each column block of B, kept in L2 for every row block, was read again from
    memory for every 16 rows; 4096² took 620 instead of 480-610 ms, its A packed block by block.)"""
    if kernel.thread_range < 0 or not kernel.parallel or kernel.locals: return None
    if any(r.arg.size > 1 for r in kernel.ranges[:kernel.thread_range]): return None
    if (found := kernel.__dict__.get("_row_accesses")) is not None: return found  # (chain_order's, then find_chains')
    row = kernel.ranges[kernel.thread_range]
    out = []
    for u in kernel.sink.toposort:
        if u.op not in (Ops.LOAD, Ops.STORE): continue
        lanes = u.arg.arg.size if u.arg is not None else 1
        out.append((kernel.args[u.src[0].arg.slot], u.op is Ops.STORE, row_stride(u.src[1], row, lanes)))
    kernel.__dict__["_row_accesses"] = out
    return out


def _consistent(accesses: list[list]) -> dict[int, int] | None:
    """{written buffer: row stride} when every access of every buffer the kernels write is row-local with one
    stride per buffer, else None."""
    written = {b for acc in accesses for b, w, _ in acc if w}
    strides: dict[int, int] = {}
    for acc in accesses:
        for b, _, s in acc:
            if b not in written: continue
            if s is None or strides.setdefault(b, s) != s: return None
    return strides


def chain_order(steps: list) -> list:
    """`steps` with kernels that could continue a chain moved up to where it ends, past the kernels (at most
    CHAIN_LOOKAHEAD) that end it, when those do not touch their buffers.

    An attention block's gradient: the loss, a sum over everything (not row by row), came between the forward's
    kernels and the backward's, which made two chains, and the probabilities and their gradient (16 MB each) went
    through memory from one to the other. A kernel moves before another only when neither writes what the other
    reads or writes; none moves past a host step; kernels that move keep their order."""
    steps = list(steps)
    rows = [None if lines is None or isinstance(k, HostStep) or (acc := _accesses(k)) is None
            or _consistent([acc]) is None else k.ranges[k.thread_range].arg.size for k, lines in steps]
    touched: dict[int, tuple[set[int], set[int]]] = {}

    def buffers(i: int) -> tuple[set[int], set[int]]:
        if (key := id(k := steps[i][0])) not in touched: touched[key] = k.buffers(Ops.LOAD), k.buffers(Ops.STORE)
        return touched[key]

    def independent(i: int, j: int) -> bool:
        (ri, wi), (rj, wj) = buffers(i), buffers(j)
        return not (wi & (rj | wj) or ri & wj)

    for i in range(1, len(steps)):
        run = rows[i - 1]
        if run is None or rows[i] == run: continue
        for j in range(i + 1, min(len(steps), i + 1 + CHAIN_LOOKAHEAD)):
            if steps[j - 1][1] is None or isinstance(steps[j - 1][0], HostStep): break
            if rows[j] != run or not all(independent(m, j) for m in range(i, j)): continue
            steps.insert(i, steps.pop(j))
            rows.insert(i, rows.pop(j))
            break
    return steps


def find_chains(schedule: Schedule, steps: list, target: Target) -> list[RowChain]:
    """The row chains among `steps` (a lowering's (kernel or host step, linear program) list), each adding its
    scratch buffer to `schedule`."""
    chains: list[RowChain] = []
    run: list[int] = []        # indices of the chain being grown
    run_acc: list[list] = []   # their accesses

    def close() -> None:
        if len(run) >= 2 and (chain := _chain(schedule, steps, run, run_acc, target)) is not None:
            chains.append(chain)
        run.clear()
        run_acc.clear()

    for i, (kernel, lines) in enumerate(steps):
        acc = None if lines is None or isinstance(kernel, HostStep) else _accesses(kernel)
        if acc is None:
            close()
            continue
        rows = kernel.ranges[kernel.thread_range].arg.size
        if run and (steps[run[0]][0].ranges[steps[run[0]][0].thread_range].arg.size != rows
                    or _consistent(run_acc + [acc]) is None):
            close()
        if not run and _consistent([acc]) is None: continue
        run.append(i)
        run_acc.append(acc)
    close()
    return chains


def _chain(schedule: Schedule, steps: list, run: list[int], run_acc: list[list], target: Target) -> RowChain | None:
    """The chain of kernels `run` (indices into `steps`), or None when it would not pay."""
    members = [steps[i][0] for i in run]
    strides = _consistent(run_acc)
    written = set(strides)
    read_later = {b for j, acc in enumerate(run_acc) for b, w, _ in acc if not w and any(
        b in {c for c, wc, _ in prev if wc} for prev in run_acc[:j])}
    if not read_later: return None  # nothing passes between the kernels
    inside = set(run)
    elsewhere = set()  # buffers some step outside the chain reads
    for i, (step, lines) in enumerate(steps):
        if i in inside: continue
        elsewhere |= set(step.inputs) if isinstance(step, HostStep) else set(step.args)
    scratch_ids = [b for b in sorted(written) if schedule.buffers[b].kind == "intermediate" and b not in elsewhere
                   and b not in schedule.outputs]
    full_bytes = sum(schedule.buffers[b].size * schedule.buffers[b].dtype.itemsize for b in scratch_ids)
    if full_bytes < CHAIN_MIN_BYTES: return None
    rows = members[0].ranges[members[0].thread_range].arg.size
    row_bytes = {b: s * schedule.buffers[b].dtype.itemsize for b, s in strides.items()}
    touched = sum(row_bytes.values()) + sum(  # the rows of the buffers it only reads, where those are row-local
        s * schedule.buffers[b].dtype.itemsize for b, s in {(b, s) for acc in run_acc for b, w, s in acc
                                                            if s is not None and b not in written})
    # the whole chain's block in half of L2, and where a row allows, what one member reads and writes of the block
    # in CHAIN_L1_PERCENT of L1 for the next member (W10's eight layernorms, 8 KB a row a member: 6 rows against 28,
    # 2.30 -> 1.92 ms at best; fewer rows pay the driver's call of each member more often: 1 row 2.72 ms)
    block = max(1, min(rows, target.l2_bytes // 2 // max(touched, 1)))
    per_member = max(sum({b: s * schedule.buffers[b].dtype.itemsize for b, _, s in acc if s is not None}.values())
                     for acc in run_acc)  # bytes of a row of the buffers one member walks row by row
    if per_member <= target.l1_bytes:  # (at least one row: a block of none would never end the driver's loop)
        block = max(1, min(block, target.l1_bytes * CHAIN_L1_PERCENT // 100 // per_member))
    scratch, offset = _regions(scratch_ids, run_acc, row_bytes, block, members)
    # (every member is thread-split: so is the chain) in CHUNKS_PER_THREAD chunks a thread, each with a scratch
    # region of its own, as long as those take at most half of what the buffers would whole
    step = -(-rows // (target.threads * CHUNKS_PER_THREAD)) if target.threads > 1 else rows
    if -(-rows // step) * offset > max(full_bytes // 2, target.threads * offset): step = -(-rows // target.threads)
    schedule.buffers.append(BufferSpec(dtypes.uint8, max(offset * -(-rows // step), 1), "intermediate"))
    args = list(dict.fromkeys(b for k in members for b in k.args if b not in scratch))
    return RowChain(f"chain_{members[0].name}_{len(members)}", run[0], members, rows, block, step,
                    args + [len(schedule.buffers) - 1], scratch, offset, len(schedule.buffers) - 1,
                    _prefetched(schedule, run_acc, written, block, target))


def _prefetched(schedule: Schedule, run_acc: list[list], written: set[int], block: int, target: Target
                ) -> list[list[int]]:
    """[buffer, bytes a row] of the chain's inputs that come from memory: read row by row (one stride, every
    access), not written by the chain, and larger than L2. Their next block is what the driver prefetches while the
    members compute on this one: the first member alone waited for the reads, and the arithmetic of the others
    left the memory idle (W10's eight layernorms, one thread, input and output beyond L3: 127 -> 110 ns a row a
    step)."""
    strides: dict[int, set] = {}
    for acc in run_acc:
        for b, w, s in acc:
            if b not in written: strides.setdefault(b, set()).add(s)
    out = []
    for b, found in strides.items():
        if len(found) != 1 or (s := next(iter(found))) is None or s <= 0: continue
        spec = schedule.buffers[b]
        row_bytes = s * spec.dtype.itemsize
        if spec.size * spec.dtype.itemsize > target.l2_bytes: out.append([b, row_bytes])
    lines = sum(-(-block * r // 64) for _, r in out)
    return out if 0 < lines <= CHAIN_PREFETCH_LINES else []


def _regions(ids: list[int], run_acc: list[list], row_bytes: dict[int, int], block: int,
             members: list[Kernel]) -> tuple[dict[int, tuple[int, int]], int]:
    """Each scratch buffer's place in a chunk's region ({buffer: (byte offset, bytes a row)}) and the region's
    size: a buffer takes the place of one that no member reads after the member that first writes it, so a chain
    of steps that each read the step before passes its rows through two places instead of one a step (W10's
    eight layernorms then touch 16 KB of scratch a block instead of 56 KB, which with its input and output block
    no longer fits in L1). Where that member is the last to read the other buffer and reads it only before it
    writes the same place (`_in_place`), the buffer takes the other's very place: one place for all the steps."""
    first = {b: min(j for j, acc in enumerate(run_acc) if any(x == b for x, _, _ in acc)) for b in ids}
    last = {b: max(j for j, acc in enumerate(run_acc) if any(x == b for x, _, _ in acc)) for b in ids}
    places: list[list[int]] = []  # [offset, bytes, the last member that uses what is there, the buffer there]
    scratch, end = {}, 0
    for b in sorted(ids, key=lambda b: first[b]):
        size = -(-block * row_bytes[b] // 64) * 64  # (each place starts on a cache line)
        place = None
        if CHAIN_REUSE:
            place = next((p for p in places if p[2] == first[b] and CHAIN_IN_PLACE and p[1] == size
                          and row_bytes[p[3]] == row_bytes[b] and _in_place(members[first[b]], p[3], b)), None)
            place = place or next((p for p in places if p[1] >= size and p[2] < first[b]), None)
        if place is None:
            place = [end, size, -1, b]
            places.append(place)
            end += size
        place[2:] = [last[b], b]
        scratch[b] = (place[0], row_bytes[b])
    return scratch, end


def _in_place(kernel: Kernel, a: int, b: int) -> bool:
    """Whether `kernel`, which writes buffer `b` and reads `a` for the last time in the chain, computes the same
    when the two are one memory, row by row. Each access is `row * S + rest` (the chain's rule); a LOAD of `a` and
    a STORE to `b` whose rests can meet must be ordered by the data: the load at the store's very index, feeding
    its value (each element read in the iteration that writes it, as donation's rule: fnx/lower/memory.py), or
    inside a reduction computed once a row (its value depends on no loop or lane but the row's: a layernorm's
    mean, not a matmul's dot product for each output element) whose result the stored value needs, which then
    reads all its row before the row's first store. Across the rows of the thread-split loop nothing meets (rows
    are disjoint). A member's arguments stay `noalias`, as a donated one's do: no reordering the compiler may make
    can move a load past a store that depends on it."""
    row = kernel.ranges[kernel.thread_range]
    loads = [u for u in kernel.sink.toposort if u.op is Ops.LOAD and kernel.args[u.src[0].arg.slot] == a]
    stores = [u for u in kernel.sink.toposort if u.op is Ops.STORE and kernel.args[u.src[0].arg.slot] == b]
    if not stores or any(u.op is Ops.LOAD and kernel.args[u.src[0].arg.slot] == b for u in kernel.sink.toposort):
        return False
    deps, outputs = range_deps(kernel.sink), set(kernel.ranges)  # (a sum over output loops runs beside the stores)

    def rest(u: UOp) -> tuple[int, int] | None:  # the bytes of a row the access can touch
        lanes = u.arg.arg.size if u.arg is not None else 1
        parts, const = terms(u.src[1])
        rest_parts = [(t, c) for t, c in parts if t is not row]
        if any(row in t.toposort for t, _ in rest_parts): return None
        lo, hi = build(u.src[1].dtype, rest_parts, const).bounds
        return lo, hi + lanes - 1

    for st in stores:
        value, where = set(st.src[2].toposort), rest(st)
        reductions = [r for r in value if r.op is Ops.REDUCE and deps[r] <= {row} and not set(r.src[1:]) & outputs]
        for ld in loads:
            span = rest(ld)
            if where is None or span is None: return False
            if span[1] < where[0] or where[1] < span[0]: continue  # (they never meet)
            if not used_before(kernel.sink, [ld], st): return False  # (a use placed after the store reads again)
            if ld.src[1] is st.src[1] and ld in value: continue
            if not any(ld in r.src[0].toposort for r in reductions): return False
    return True


def used_before(sink: UOp, loads: list[UOp], store: UOp) -> bool:
    """Whether every op that reads one of `loads` feeds `store`, so it runs before the store. The arguments are
    `noalias`, so LLVM may read a load's memory again for a use it places later (it did, for the lanes of a
    `sin` in a kernel that also stores another output); when `store` writes that very memory, such a use after it
    would read the new value. A kernel of one output meets this by itself; siblings (fnx/lower/siblings.py) may
    not: `tanh(z)` stored over z, then `sin(z)` for the kernel's next output read tanh(z)."""
    cone, read = set(store.toposort), set(loads)
    return all(u in cone for u in sink.toposort if u.op is not Ops.SINK and any(s in read for s in u.src))


def grouped_steps(steps: list, chains: list[RowChain]) -> list:
    """`steps` (kernels and host steps) with each chain's members replaced by the chain (memory planning and
    donation see a chain as one step that uses all its buffers at once)."""
    starts = {c.first: c for c in chains}
    out, i = [], 0
    while i < len(steps):
        if (c := starts.get(i)) is not None:
            out.append(c)
            i += len(c.members)
            continue
        out.append(steps[i])
        i += 1
    return out


__all__ = ["RowChain", "chain_order", "find_chains", "grouped_steps", "CHAIN_MIN_BYTES"]
