"""The generic runtime: lower a FUNCTION for a device's target, render and compile its kernels with the device's
renderer and compiler, record the schedule as items, and replay them through the device's allocator and
programs. A backend whose device supplies those pieces (and `program(name, binary)`) needs nothing else; the CPU
backend replays its items its own way (a lean call path, native worker threads, asynchronous streams).
"""
from __future__ import annotations

import time

import numpy as np

from fnx import events
from fnx.backends.control import run_control
from fnx.backends.device import Buffer, Device, Executable, HostCall, Launch, Transfer, check_platform, get_device
from fnx.lower.pipeline import STAGES, lower
from fnx.lower.rangeify import HostStep, TransferStep
from fnx.lower.tensor_core import is_tensor_core, launch_dims
from fnx.uop import UOp


class ReplayExecutable(Executable):
    """A FUNCTION lowered for `device.target`, its kernels compiled into one binary, replayed item by item."""

    def __init__(self, fn: UOp, device: Device):
        self.fn, self.device, self._device = fn, device.name, device
        self.lowering = lower(fn, device.target, measure=device.kernel_timers())
        schedule = self.lowering.schedule
        self.buffers, self.output_ids = schedule.buffers, list(schedule.outputs)
        kernels = [(k, lines) for k, lines in self.lowering.kernels if lines is not None]
        self.source = device.renderer.render(kernels) if kernels else ""
        binary = device.compiler.compile(self.source) if kernels else b""
        self.steps: dict[str, HostStep] = {}
        self.kernel_of = {kernel.name: kernel for kernel, lines in self.lowering.kernels if lines is not None}
        self.items: list = []
        for kernel, lines in self.lowering.kernels:
            if isinstance(kernel, TransferStep):
                source = self.buffers[kernel.inputs[0]].device or self.device
                self.items.append(Transfer(kernel.outputs[0], kernel.inputs[0], kernel.device, source))
            elif isinstance(kernel, HostStep):
                self.steps[kernel.name] = kernel
                self.items.append(HostCall(kernel.name, self.device, tuple(kernel.inputs), tuple(kernel.outputs)))
            else:
                outer, out = kernel.thread_size, kernel.output
                group = (kernel.locals[0].arg.size,) if kernel.locals else ()  # (work items of a work-group)
                dims = launch_dims(kernel) if is_tensor_core(kernel) else (0, outer) + group
                self.items.append(Launch(kernel.name, self.buffers[out].device or self.device, tuple(kernel.args),
                                         dims))
        check_platform(self.items, self.device)
        # a kernel after a COPY runs where its output lives: that device (of this platform) loads the program
        self.programs = {item.kernel: get_device(item.device).program(item.kernel, binary)
                         for item in self.items if isinstance(item, Launch)}
        made = {b for item in self.items for b in getattr(item, "outputs", ())} | {
            item.dst for item in self.items if isinstance(item, Transfer)}
        ninputs = sum(spec.kind == "input" for spec in self.buffers)
        self.allocated = [(i, spec) for i, spec in enumerate(self.buffers) if i >= ninputs and i not in made]

    def __call__(self, inputs: list[Buffer]) -> list[Buffer]:
        buffers: list[Buffer | None] = list(inputs) + [None] * (len(self.buffers) - len(inputs))
        for buf in inputs: buf.wait()
        for i, spec in self.allocated:  # (transfers and host steps make their outputs)
            buffers[i] = get_device(spec.device or self.device).allocator.alloc(spec.dtype, spec.size)
        for item in self.items:
            if reporting := events.active:  # (each step waits for its device, so that its time is its own)
                start = time.perf_counter()
            if isinstance(item, Launch):
                self.programs[item.kernel](*[buffers[b] for b in item.buffers], dims=item.dims)
                if reporting:
                    get_device(item.device).synchronize()
                    self.kernel_event(self.kernel_of[item.kernel], start)
            elif isinstance(item, Transfer):
                source, target = buffers[item.src], get_device(item.device).allocator
                buffers[item.dst] = copy = target.alloc(source.dtype, source.size)
                if not target.transfer(copy, source):
                    target.copyin(copy, get_device(source.device).allocator.copyout(source))
                if reporting:
                    get_device(item.device).synchronize()
                    self.transfer_event(source, item.device, start)
            else:
                self._host_call(self.steps[item.name], buffers)
                if reporting: events.finished("host", f"{self.label}:{item.name}", start, device=self.device)
        return [buffers[b] for b in self.output_ids]

    def _host_call(self, step: HostStep, buffers: list) -> None:
        """A control-flow node: its bodies are FUNCTIONs compiled for this device, called from a host loop."""
        device = self._device

        def prepare(fn: UOp):
            exe, shapes = device.compile(fn), [o.shape for o in fn.src[0].src]
            return lambda values: [get_device(b.device).allocator.copyout(b).reshape(s) for b, s in zip(
                exe([device.allocator.from_numpy(np.asarray(v)) for v in values]), shapes)]
        node = step.node
        values = [get_device(buffers[i].device).allocator.copyout(buffers[i]).reshape(node.operands[j].shape)
                  for j, i in enumerate(step.inputs)]  # (an input may live on another device, after a COPY)
        for out, value in zip(step.outputs, run_control(node, values, prepare)):
            buffers[out] = device.allocator.from_numpy(np.asarray(value, dtype=self.buffers[out].dtype.np))

    def as_text(self, stage: str | None = None) -> str:
        if stage in STAGES: return self.lowering.as_text(stage)
        if stage == "items": return self.items_text()
        if stage == "source": return self.source
        stages = [f"--- {s} ---\n{self.lowering.as_text(s)}" for s in STAGES]
        return "\n\n".join(stages + [f"--- items ---\n{self.items_text()}", f"--- source ---\n{self.source}"])

