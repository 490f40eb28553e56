"""The `interp` backend: a numpy interpreter of the frontend IR. It is the oracle the compiled backends are tested
against, so it stays simple: one small numpy function per primitive, evaluated in topological order."""
from __future__ import annotations

import numpy as np

from fnx.backends.control import run_control
from fnx.backends.device import (Buffer, Device, Executable, HostAllocator, HostCall, Runtime, get_device,
                                 register_runtime)
from fnx.debug.printing import format_function
from fnx.lower.pipeline import inline_calls
from fnx.lower.rangeify import BufferSpec
from fnx.reference import primitive
from fnx.uop import GroupOp, Ops, UOp


def evaluate(u: UOp, values: dict[UOp, np.ndarray]) -> np.ndarray:
    """The value of one node given the values of its sources."""
    if u.op is Ops.BUFFER: return u.arg.buffer.numpy(u.shape)
    if u.op is Ops.TUPLE: return tuple(values[s] for s in u.src)
    if u.op is Ops.GETTUPLE: return values[u.src[0]][u.arg]
    if u.op is Ops.FUNCTION: return run(u, [values[s] for s in u.src[1:]])
    if u.op in GroupOp.Control:
        inputs = [values[s] for s in u.operands]  # COND: the predicate, then the operands
        return tuple(run_control(u, inputs, lambda fn: lambda vals: list(run(fn, vals))))
    return primitive(u, [values[s] for s in u.src])


def run(fn: UOp, args: list[np.ndarray]) -> tuple[np.ndarray, ...]:
    """Evaluate FUNCTION `fn` on numpy arguments (PARAM k takes args[k]); nested calls are inlined first."""
    values: dict[UOp, np.ndarray] = {}
    body = inline_calls(fn.src[0])
    for u in body.graph:
        values[u] = np.asarray(args[u.arg.slot]).reshape(u.shape) if u.op is Ops.PARAM else evaluate(u, values)
    return values[body]


class InterpExecutable(Executable):
    """One host step: the whole FUNCTION evaluated by `run`. Each output lands on its own device (a COPY's)."""

    def __init__(self, fn: UOp, device: str):
        self.fn, self.device = fn, device
        outs = fn.src[0].src
        self.buffers = [BufferSpec(p.dtype, p.size, "input", i) for i, p in enumerate(fn.src[1:])] + [
            BufferSpec(o.dtype, o.size, "output", device=o.device if o.device != device else None) for o in outs]
        self.output_ids = list(range(len(fn.src) - 1, len(self.buffers)))
        self.items = [HostCall("evaluate", device, tuple(range(len(fn.src) - 1)), tuple(self.output_ids))]

    def __call__(self, inputs: list[Buffer]) -> list[Buffer]:
        args = [b.numpy(a.shape) for a, b in zip(self.fn.src[1:], inputs)]
        outs = run(self.fn, args)
        return [get_device(spec.device or self.device).allocator.from_numpy(np.asarray(o, dtype=u.dtype.np))
                for o, u, spec in zip(outs, self.fn.src[0].src, self.buffers[len(inputs):])]

    def as_text(self, stage: str | None = None) -> str:
        if stage == "items": return self.items_text()
        return format_function(self.fn) if stage is not None else f"{format_function(self.fn)}\n\n{self.items_text()}"


class InterpDevice(Device):
    def executable(self, fn: UOp) -> InterpExecutable:
        return InterpExecutable(fn, self.name)


register_runtime(Runtime("interp", lambda: 1, lambda i: InterpDevice("interp", i, HostAllocator(f"interp:{i}"))))
