"""memory plan: intermediate buffers whose lifetimes do not overlap share one allocation.

A buffer lives from the first step that uses it (the kernel that writes it) to the last step that reads it.
Steps run in order, so two buffers can share memory when one's last use comes strictly before the other's
first. Greedy first-fit over buffers in order of first use, reusing the smallest free slot that is large
enough. Inputs and outputs are never planned (the caller owns them), nor are a control step's outputs (they
are produced by the loop itself).
"""
from __future__ import annotations

from dataclasses import dataclass

from fnx.lower.rangeify import ControlStep, Schedule


@dataclass
class MemoryPlan:
    slot_of: dict[int, int]     # schedule buffer id -> slot
    slot_bytes: list[int]       # size of each slot
    unplanned_bytes: int        # what the planned buffers would take one allocation each

    @property
    def planned_bytes(self) -> int:
        return sum(self.slot_bytes)


def _uses(step) -> list[int]:
    return step.inputs + step.outputs if isinstance(step, ControlStep) else list(step.args)


def plan_memory(schedule: Schedule, steps: list) -> MemoryPlan:
    produced_by_loops = {b for s in steps if isinstance(s, ControlStep) for b in s.outputs}
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
    for b in planned:
        need = schedule.buffers[b].size * schedule.buffers[b].dtype.itemsize
        free = [s for s in range(len(slot_bytes)) if slot_free_after[s] < first[b] and slot_bytes[s] >= need]
        if free:
            slot = min(free, key=lambda s: slot_bytes[s])
        else:
            slot = len(slot_bytes)
            slot_bytes.append(need)
            slot_free_after.append(-1)
        slot_of[b] = slot
        slot_free_after[slot] = last[b]
    unplanned = sum(schedule.buffers[b].size * schedule.buffers[b].dtype.itemsize for b in planned)
    return MemoryPlan(slot_of, slot_bytes, unplanned)
