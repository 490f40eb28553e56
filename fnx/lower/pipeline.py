"""The lowering pipeline, stage by stage: callify → simplify → rangeify → optimize → linearize.

`lower(fn)` returns a `Lowering` that keeps every stage's output so `as_text(stage)` and FNX_DEBUG=3 can show
the graph between any two stages. Backends render `Lowering.kernels` into their own source.
"""
from __future__ import annotations

import contextlib
import re
import sys
import time
from dataclasses import dataclass, field, replace

from fnx import dtypes, events
from fnx.debug.printing import format_function
from fnx.lower import chain as chain_module
from fnx.lower.chain import RowChain, chain_order, find_chains, grouped_steps
from fnx.lower.complex import complex_buffers, split_complex
from fnx.lower.cost import describe, kernel_bytes, kernel_flops
from fnx.lower.linearize import Linear, format_linear, linearize
from fnx.lower.memory import MemoryPlan, plan_memory
from fnx.lower.optimize import merge_batch_loops, optimize, overridden_opts, overriding
from fnx.lower.rangeify import BufferSpec, HostStep, Kernel, Schedule, TransferStep, rangeify
from fnx.lower.search import searched_opts
from fnx.lower.row_sums import carry_row_sums
from fnx.lower.siblings import merge_siblings
from fnx.lower.symbolic import simplify_graph
from fnx.lower.target import Target
from fnx.lower.transcendental import transcendental
from fnx.rewrite import graph_rewrite
from fnx.uop import Ops, UOp, postorder, with_src

STREAM_MIN_CACHES = 1  # a program output at least this many times the writing cores' L2 together is stored past the
                       # caches (`streamed`): neutral while the L3 keeps it, W10 4.15 -> 3.54 ms when it does not
                       # (docs/LOWERING.md, Streaming stores)

MERGE_BATCH_LOOPS = 1  # kernels' batch loops that every access walks as one are one loop (optimize.merge_batch_loops)
MERGE_SIBLINGS = 1  # elementwise kernels over the same loops that read an element in common are one (fnx/lower/siblings.py)
STAGES = ("callify", "rangeify", "optimize", "linearize", "memory")



def inline_calls(body: UOp, origins: dict[UOp, str] | None = None) -> UOp:
    """`body` with every call (GETTUPLE of FUNCTION or CALL) replaced by the callee's output on its arguments, at
    every depth in one walk. `origins`, when given, receives {inlined output node: the called function's name}
    (kernel names use it; of calls giving the same node, the outer one names it)."""
    return _Inliner(origins).run(body, _Scope({}))


@dataclass
class _Scope:
    """Nodes of one body already inlined (`memo`, seeded with the PARAMs it binds and their arguments)."""
    memo: dict
    seeds: dict = field(default_factory=dict)

    def __post_init__(self):
        self.memo.update(self.seeds)
        self.tags = {p.arg.tag for p in self.seeds}


def _is_call(u: UOp) -> bool:
    return u.op is Ops.GETTUPLE and u.src[0].op in (Ops.FUNCTION, Ops.CALL)


class _Inliner:
    """One walk over a graph inlining calls: a call's body is walked once per distinct call (one scope for all its
    outputs) with its PARAMs bound to the call's inlined arguments, calls inside it inlined on the way.

    PARAMs are scoped as in `substitute`: a node that binds a tag a scope binds too (a control node or call of the
    same rule) has its bodies walked in a scope without those PARAMs."""

    def __init__(self, origins: dict[UOp, str] | None):
        self.origins, self.scopes = origins, {}

    def run(self, root: UOp, scope: _Scope) -> UOp:
        memo, tags = scope.memo, scope.tags

        def children(u: UOp) -> tuple:
            if _is_call(u): return u.src[0].operands
            return u.operands if tags and u.binds in tags else u.src

        for u in postorder(root, children, memo):
            if _is_call(u): memo[u] = self.call(u, memo)
            elif tags and u.binds in tags:
                inner = {p: v for p, v in scope.seeds.items() if p.arg.tag != u.binds}
                n_bodies = len(u.src) - len(u.operands)
                src = (tuple(self.run(b, _Scope({}, inner)) for b in u.src[:n_bodies]) +
                       tuple(memo[s] for s in u.src[n_bodies:]))
                memo[u] = with_src(u, src)
            else:
                src = tuple(memo[s] for s in u.src)
                memo[u] = with_src(u, src)
        return memo[root]

    def call(self, g: UOp, memo: dict) -> UOp:
        call = g.src[0]
        callee, args = call.src[0], tuple(memo[a] for a in call.operands)
        if (scope := self.scopes.get((call, args))) is None:
            tag = _tag(g)
            seeds = {p: args[p.arg.slot] for p in callee.toposort if p.op is Ops.PARAM and p.arg.tag == tag}
            scope = self.scopes[(call, args)] = _Scope({}, seeds)
        out = self.run(callee.src[g.arg], scope)
        if self.origins is not None and (name := callee_name(call)): self.origins[out] = name
        return out


def _follow(origins: dict[UOp, str], memo: dict[UOp, UOp]) -> None:
    """Re-key `origins` by what each node became in a rewrite (`memo`: old node -> new node)."""
    moved = {memo.get(u, u): name for u, name in origins.items()}
    origins.clear()
    origins.update(moved)


def callee_name(call: UOp) -> str:
    """The name of the function a FUNCTION/CALL node calls, as an identifier ('tanh', 'layer'); '' for lambdas
    and bodies without one."""
    name = getattr(getattr(call.arg, "fun", None), "__name__", "") or getattr(call.arg, "name", "") or ""
    name = re.sub(r"\W", "", str(name)).strip("_")
    return "" if name in ("lambda", "run", "fun", "f") or name[:1].isdigit() else name


def callify(fn: UOp, origins: dict[UOp, str] | None = None) -> UOp:
    """Inline nested calls into one FUNCTION over PARAMs, then simplify; `origins` as in `inline_calls`."""
    if origins is None: return UOp(Ops.FUNCTION, fn.dtype, (simplify_graph(inline_calls(fn.src[0])), *fn.src[1:]))
    body, memo = inline_calls(fn.src[0], origins), {}
    body = simplify_graph(body, memo)
    _follow(origins, memo)
    return UOp(Ops.FUNCTION, fn.dtype, (body, *fn.src[1:]))


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
    callified: UOp | None        # the function after callify (None until asked for, when read from a disk cache)
    schedule: Schedule
    kernels: list[tuple[Kernel, Linear]]
    memory: MemoryPlan
    chains: list[RowChain] = field(default_factory=list)  # runs of kernels the runtime interleaves by row blocks
    source: UOp | None = None    # the function as given, when `callified` is to be made from it

    @property
    def fn(self) -> UOp:
        if self.callified is None: self.callified = callify(self.source)
        return self.callified

    def steps(self) -> list:
        """The kernels and host steps in order, each row chain as one step (what memory planning sees)."""
        return grouped_steps([k for k, _ in self.kernels], self.chains)

    def cost(self, kernel: Kernel) -> tuple[int, int]:
        """(estimated FLOPs, bytes moved) of one run of `kernel`, from its form before optimize (vector lanes and
        unrolled ranges confuse the byte estimate); a kernel optimize made (an init, a PACK copy) counts its own."""
        costs = self.__dict__.setdefault("_costs", {})
        if isinstance(kernel, RowChain):  # its kernels' FLOPs; its buffers' bytes once (the scratch stays in cache)
            flops = sum(self.cost(k)[0] for k in kernel.members)
            spec = self.schedule.buffers
            return flops, sum(spec[b].size * spec[b].dtype.itemsize for b in kernel.args[:-1])
        if kernel.name not in costs:
            before = {k.name: k for k in self.schedule.kernels if not isinstance(k, HostStep)}
            source = before.get(kernel.name.removesuffix("_acc"), kernel)
            costs[kernel.name] = (kernel_flops(source), kernel_bytes(source))
        return costs[kernel.name]

    def as_text(self, stage: str) -> str:
        if stage == "callify": return format_function(self.fn)
        if stage == "memory":
            plan = self.memory
            return (f"{len(plan.slot_of)} intermediate buffers in {len(plan.slot_bytes)} allocations: "
                    f"{plan.planned_bytes} bytes instead of {plan.unplanned_bytes}; buffer -> slot {plan.slot_of}")
        if stage == "rangeify":  # the kernel split, each kernel with its estimated FLOPs and bytes
            return "\n".join(f"{k.name}: {host_step_text(k)}" if isinstance(k, HostStep) else
                             f"kernel {describe(k)}; buffers {k.args}, loops {[r.arg.size for r in k.ranges]} reduce "
                             f"{[r.arg.size for r in k.reduce_ranges]}" for k in self.schedule.kernels)
        parts, starts = [], {c.first: c for c in self.chains}
        for i, (kernel, lines) in enumerate(self.kernels):
            if stage == "optimize" and (c := starts.get(i)) is not None:
                parts.append(f"{c.name}: the next {len(c.members)} kernels by blocks of {c.block} of their {c.rows} "
                             f"rows, {c.chunks} chunk(s); buffers {sorted(c.scratch)} in {c.thread_bytes} bytes "
                             f"of scratch a chunk")
            if lines is None:
                parts.append(f"{kernel.name}: {host_step_text(kernel)}, buffers {kernel.inputs} -> {kernel.outputs}")
                continue
            head = (f"kernel {kernel.name}: buffers {kernel.args}, loops "
                    f"{[r.arg.size for r in kernel.ranges]} reduce {[r.arg.size for r in kernel.reduce_ranges]}")
            if stage == "optimize":
                lanes = f", vector lanes {kernel.lanes[0].arg.size} x{len(kernel.lanes)}" if kernel.lanes else ""
                group = f", work-group {kernel.locals[0].arg.size} x{len(kernel.locals)}" if kernel.locals else ""
                head += f", actions {list(kernel.opts)}{lanes}{group}, thread-split loop {kernel.thread_range}"
            parts.append(f"{head}\n{format_linear(lines)}" if stage == "linearize" else head)
        return "\n".join(parts)


def _named(kernel: Kernel | HostStep, origins: dict[UOp, str]) -> str:
    """The kernel's name with the names of the user's functions it computes in front ('tanh_sum_div_64'): the
    functions (jnp.tanh, a checkpointed layer, ...) whose outputs it computes, at most two."""
    if isinstance(kernel, HostStep): return kernel.name
    called = [origins[u] for u in kernel.sources if u in origins]
    called = [n for n in dict.fromkeys(called) if n not in kernel.name.split("_")][:2]
    return "_".join(called + [kernel.name])


def host_step_text(step: HostStep) -> str:
    return f"transfer to {step.device}" if isinstance(step, TransferStep) else "host loop over compiled bodies"


def _new_buffer(schedule: Schedule):
    """A callback giving the schedule a new intermediate buffer (PACK's panels) and returning its id."""
    def new(dtype: dtypes.DType, size: int) -> int:
        schedule.buffers.append(BufferSpec(dtype, size, "intermediate"))
        return len(schedule.buffers) - 1
    return new


def _kernel_key(kernel: Kernel) -> tuple:
    """What a kernel's schedule and code depend on: its graph (hash-consed: equal graphs are one object, its
    buffers being the kernel's own PARAM slots), its loops and flags."""
    return (kernel.sink, tuple(r.arg for r in kernel.ranges), tuple(r.arg for r in kernel.reduce_ranges),
            kernel.parallel, None if kernel.ordered is None else tuple(sorted(r.arg for r in kernel.ordered)),
            kernel.thread_candidate,
            None if kernel.row_ranges is None else tuple(r.arg for r in kernel.row_ranges), kernel.stream)


def step_uses(schedule: Schedule) -> dict[int, int]:
    """How many steps of `schedule` (kernels and host steps) name each buffer."""
    uses: dict[int, int] = {}
    for step in schedule.kernels:
        for b in set(step.inputs if isinstance(step, HostStep) else step.args): uses[b] = uses.get(b, 0) + 1
    return uses


def streamed(kernel: Kernel, schedule: Schedule, target: Target, uses: dict[int, int]) -> frozenset:
    """The PARAM slots of `kernel` whose stores may bypass the caches: outputs of the whole program that no other
    step reads (the renderer also drops a slot the optimized kernel reads back: an accumulating matmul's), bigger
    than the private caches of the cores that write them (a grid device has no such stores). A normal store first
    reads each line it writes (to own it), a third of the traffic of a streaming kernel; a non-temporal one does
    not, as memcpy's large copies do not. What the caller does with the result comes later, after other work: from
    memory either way once it outgrows L2. `uses`: the schedule's `step_uses`."""
    if target.grid: return frozenset()
    out = set()
    for st in kernel.sink.src:
        if st.op is not Ops.STORE: continue
        slot = st.src[0].arg.slot
        buf = kernel.args[slot]
        spec = schedule.buffers[buf]
        if (buf in schedule.outputs and uses.get(buf, 0) == 1
                and spec.size * spec.dtype.itemsize >= STREAM_MIN_CACHES * target.l2_bytes * target.threads):
            out.add(slot)
    return frozenset(out)


def _copy_of(original: Kernel, done: list, kernel: Kernel, schedule: Schedule) -> list:
    """`kernel`'s optimized pieces when it equals `original` (a later layer's copy of a kernel, `_kernel_key`):
    `original`'s, on `kernel`'s buffers, running `original`'s compiled functions; a buffer optimize made (PACK's
    panels) gets one of its own."""
    buffers = dict(zip(original.args, kernel.args))
    out = []
    for k, lines in done:
        for a in k.args:
            if a not in buffers: buffers[a] = _new_buffer(schedule)(schedule.buffers[a].dtype, schedule.buffers[a].size)
        out.append((replace(k, name=kernel.name + k.name[len(original.name):], args=[buffers[a] for a in k.args],
                            code=k.code or k.name), lines))
    return out


def _stores_nothing(kernel) -> bool:
    """A kernel with an output loop of no iterations (a zero-size array's elements): it stores nothing, so it is
    left out (not compiled: an OpenCL driver's build of it alone costs 0.2 s)."""
    return isinstance(kernel, Kernel) and any(r.arg.size == 0 for r in kernel.ranges)


def lower(fn: UOp, target: Target, emit=None, measure=None, chains: bool = False) -> Lowering:
    """The kernels of FUNCTION `fn` for `target` (its vector width, caches and threads steer the schedules);
    `emit(kernels)`, when given, receives each kernel's optimized pieces (kernel, linear program) as soon as they
    are done (the CPU backend compiles them while the next ones are lowered). A kernel's actions are a test's
    schedule_override's, else BEAM's when FNX_BEAM is set and the backend gave a way to time kernels (`measure`,
    fnx/lower/search.py), else the hand heuristics'."""
    # every stage walks fused chains recursively somewhere (rangeify's kernel builder, optimize's index arithmetic
    # on a kernel that flips an array 2000 times, linearize), and such chains can be long (sorting networks, scans)
    with events.span("lower", events.current_name()) as found, _deep_recursion():
        lowering = _lower(fn, target, emit, measure, found, chains)
        found.update(kernels=sum(lines is not None for _, lines in lowering.kernels))
    return lowering


def _lower(fn: UOp, target: Target, emit, measure, split: dict, chains: bool) -> Lowering:
    """`lower`'s work; `split` receives the milliseconds each stage took (FNX_DEBUG and the profiler show them)."""
    clock = time.perf_counter()
    origins: dict[UOp, str] = {}
    fn = callify(fn, origins)
    fn, complex_inputs, complex_outputs = split_complex(fn)  # (the kernels compute on float pairs)
    split["callify_ms"], clock = round((time.perf_counter() - clock) * 1e3, 2), time.perf_counter()
    schedule = rangeify(fn, grid=target.grid)
    schedule.kernels = [k for k in schedule.kernels if not _stores_nothing(k)]
    complex_buffers(schedule, complex_inputs, complex_outputs)
    if MERGE_SIBLINGS: merge_siblings(schedule)
    carry_row_sums(schedule, target)
    split["rangeify_ms"], clock = round((time.perf_counter() - clock) * 1e3, 2), time.perf_counter()
    kernels: list = []
    lowered: dict[tuple, tuple] = {}  # a kernel's graph and loops -> (it, its optimized kernels)
    uses = step_uses(schedule)
    for i, kernel in enumerate(schedule.kernels):
        kernel.name = f"k{i}_{_named(kernel, origins)}"
        if isinstance(kernel, HostStep):  # the runtime does it (control flow: its bodies are lowered when first run)
            kernels.append((kernel, None))
            continue
        kernel.stream = streamed(kernel, schedule, target, uses)
        if MERGE_BATCH_LOOPS and not target.grid:
            merged = merge_batch_loops(kernel)
            if merged is not kernel:  # (in place: the schedule holds this kernel; its cached facts are redone)
                kernel.sink, kernel.ranges = merged.sink, merged.ranges
                for fact in ("work", "thread_size"): kernel.__dict__.pop(fact, None)
        key = _kernel_key(kernel)
        if (seen := lowered.get(key)) is not None:
            kernel.sink = seen[0].sink  # (its graph after the transcendental rewrite)
            done = _copy_of(*seen, kernel, schedule)
        else:
            kernel.sink = graph_rewrite(kernel.sink, transcendental)
            opts = overridden_opts(kernel, target)
            if opts is None and measure is not None: opts = searched_opts(kernel, target, measure)
            done = [(k, linearize(k)) for k in optimize(kernel, target, opts, new_buffer=_new_buffer(schedule))]
            if not overriding(): lowered[key] = (kernel, done)
        kernels.extend(done)
        if emit is not None: emit(done)  # (the CPU renders here and hands modules to the LLVM thread)
    split["optimize_ms"] = round((time.perf_counter() - clock) * 1e3, 2)
    if chains and chain_module.CHAIN_ORDER: kernels = chain_order(kernels)
    found = find_chains(schedule, kernels, target) if chains else []
    return Lowering(fn, schedule, kernels, plan_memory(schedule, grouped_steps([k for k, _ in kernels], found)), found)


__all__ = ["lower", "Lowering", "STAGES", "callify", "dtypes"]
