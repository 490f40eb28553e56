"""memory plan: intermediate buffers whose lifetimes do not overlap share one allocation; donated inputs become
outputs.

A buffer lives from the first step that uses it (the kernel that writes it) to the last step that reads it. Steps
run in order, so two buffers can share memory when one's last use comes strictly before the other's first, or is
the kernel that writes the other, reading it only in place (`_in_place`, donation's rule: each element read in the
iteration that writes the same element, of a dtype of the same width). The W4 step's gradient of relu,
`where(h > 0, dh, 0)`, is then written over dh: its slots take 1.6 MB instead of 2.1 (no time measurably saved:
W7's warm start, whose first call faults in every fresh page, was within noise). Greedy first-fit over buffers in
order of first use, reusing the smallest free slot that is large enough. Inputs and outputs are never planned (the
caller owns them), nor are a control step's outputs (they are produced by the loop itself). A row chain
(fnx/lower/chain.py) is one step: its kernels run interleaved, so all its buffers live through all of it.

Donation (`jit(..., donate_argnums=...)`) hands an input's memory to the call: `donation_aliases` says which
outputs may be written into which donated inputs (see its docstring for the rule).
"""
from __future__ import annotations

from dataclasses import dataclass

from fnx.lower.chain import RowChain, used_before
from fnx.lower.rangeify import HostStep, Kernel, Schedule
from fnx.uop import Ops

IN_PLACE = 1  # a slot's buffer may be written over by the kernel that reads it last, in place (`plan_memory`)


@dataclass
class MemoryPlan:
    slot_of: dict[int, int]     # schedule buffer id -> slot
    slot_bytes: list[int]       # size of each slot
    unplanned_bytes: int        # what the planned buffers would take one allocation each
    input_bytes: int = 0        # the arguments (owned by the caller)
    output_bytes: int = 0       # the results (allocated per call, owned by the caller afterwards)
    loop_bytes: int = 0         # outputs of control steps (allocated by the host loop)

    @property
    def planned_bytes(self) -> int:
        return sum(self.slot_bytes)

    @property
    def peak_bytes(self) -> int:
        """Memory a call holds at once: its inputs, its outputs, every slot and every loop output."""
        return self.input_bytes + self.output_bytes + self.planned_bytes + self.loop_bytes


def _uses(step) -> list[int]:
    return step.inputs + step.outputs if isinstance(step, HostStep) else list(step.args)


def _nbytes(schedule: Schedule, b: int) -> int:
    return schedule.buffers[b].size * schedule.buffers[b].dtype.itemsize


def plan_memory(schedule: Schedule, steps: list) -> MemoryPlan:
    produced_by_loops = {b for s in steps if isinstance(s, HostStep) for b in s.outputs}
    first: dict[int, int] = {}
    last: dict[int, int] = {}
    for i, step in enumerate(steps):
        for b in _uses(step):
            first.setdefault(b, i)
            last[b] = i
    planned = [b for b, spec in enumerate(schedule.buffers)
               if spec.kind == "intermediate" and b in first and b not in produced_by_loops]
    planned.sort(key=lambda b: first[b])
    slot_of: dict[int, int] = {}
    slot_bytes: list[int] = []
    slot_free_after: list[int] = []   # the last step that uses the slot's current buffer
    holder: list[int] = []            # the slot's current buffer

    def in_place(s: int, b: int, need: int) -> bool:  # b may be written over the slot's buffer, read last by b's writer
        a, step = holder[s], steps[first[b]]
        return (IN_PLACE and slot_free_after[s] == first[b] and slot_bytes[s] >= need and isinstance(step, Kernel)
                and schedule.buffers[a].dtype.itemsize == schedule.buffers[b].dtype.itemsize
                and a in kernel_reads(step) and _in_place(step, a, b))
    for b in planned:
        need = _nbytes(schedule, b)
        free = [s for s in range(len(slot_bytes)) if slot_free_after[s] < first[b] and slot_bytes[s] >= need]
        free = free or [s for s in range(len(slot_bytes)) if in_place(s, b, need)]
        if free:
            slot = min(free, key=lambda s: slot_bytes[s])
        else:
            slot = len(slot_bytes)
            slot_bytes.append(need)
            slot_free_after.append(-1)
            holder.append(b)
        slot_of[b] = slot
        slot_free_after[slot], holder[slot] = last[b], b
    unplanned = sum(_nbytes(schedule, b) for b in planned)
    kind_bytes = lambda kind: sum(_nbytes(schedule, b) for b, s in enumerate(schedule.buffers)  # noqa: E731
                                  if s.kind == kind and b not in produced_by_loops)
    return MemoryPlan(slot_of, slot_bytes, unplanned, kind_bytes("input"), kind_bytes("output"),
                      sum(_nbytes(schedule, b) for b in produced_by_loops))


def _accesses(kernel: Kernel, op: Ops) -> list:
    """(schedule buffer id, access UOp) of every LOAD or STORE in the kernel."""
    return [(kernel.args[u.src[0].arg.slot], u) for u in kernel.sink.toposort if u.op is op]


def kernel_reads(step) -> set[int]:
    if isinstance(step, RowChain): return set().union(*(kernel_reads(k) for k in step.members))
    return set(step.inputs) if isinstance(step, HostStep) else step.buffers(Ops.LOAD)


def kernel_writes(step) -> set[int]:
    if isinstance(step, RowChain): return set().union(*(kernel_writes(k) for k in step.members))
    return set(step.outputs) if isinstance(step, HostStep) else step.buffers(Ops.STORE)


def _in_place(step, donated: int, out: int) -> bool:
    """Whether `step`, which writes `out` first, computes the same thing when `out` is `donated`'s memory.

    True when the step does not read `donated`, or when it is a kernel with one STORE to `out`, no LOAD of
    `out`, and every LOAD of `donated` feeds that STORE's value and uses its very index (UOps are hash-consed:
    same index, same object). Then each iteration reads donated[i] before writing out[i] (the value depends on
    the read), and different iterations, including those of other threads, touch different elements, so no read
    ever sees a write. A gate on the STORE (the masked lanes past a vector loop's end: 1000 floats in vectors
    of 16) only leaves out writes, so it changes none of that.
    """
    if donated not in kernel_reads(step): return True
    if isinstance(step, (HostStep, RowChain)): return False
    stores = [u for b, u in _accesses(step, Ops.STORE) if b == out]
    if len(stores) != 1 or len(stores[0].src) not in (3, 4) or out in kernel_reads(step): return False
    index, feeding = stores[0].src[1], set(stores[0].src[2].toposort)
    loads = [u for b, u in _accesses(step, Ops.LOAD) if b == donated]
    return all(u.src[1] is index and u in feeding for u in loads) and used_before(step.sink, loads, stores[0])


def donation_aliases(schedule: Schedule, steps: list, donated: tuple[int, ...]) -> dict[int, int]:
    """Outputs that may be written into donated inputs: {output buffer id: input buffer id}.

    Input `p` can hold output `o` when they have the same dtype and size, `p` is not itself returned, `o` is
    written by a kernel (not a host loop), and writing `o` into `p`'s memory cannot change what any step reads:
    no step after the one that first writes `o` reads `p`, and that step reads `p` only in place (`_in_place`:
    element i of `p` read for element i of `o` only). Each donated input holds at most one output, matched in
    output order.
    """
    first_write: dict[int, int] = {}
    last_read: dict[int, int] = {}
    for i, step in enumerate(steps):
        for b in kernel_writes(step): first_write.setdefault(b, i)
        for b in kernel_reads(step): last_read[b] = i
    loop_outputs = {b for s in steps if isinstance(s, HostStep) for b in s.outputs}
    aliases: dict[int, int] = {}
    for p in donated:
        spec = schedule.buffers[p]
        if p in schedule.outputs: continue
        for o in dict.fromkeys(schedule.outputs):
            out = schedule.buffers[o]
            if (out.kind != "output" or o in aliases or o in loop_outputs or o not in first_write
                    or (out.dtype, out.size) != (spec.dtype, spec.size)):
                continue
            w = first_write[o]
            if last_read.get(p, -1) <= w and _in_place(steps[w], p, o):
                aliases[o] = p
                break
    return aliases
