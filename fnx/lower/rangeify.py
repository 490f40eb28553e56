"""rangeify: decide the kernel split of a FUNCTION and turn each kernel into loops over scalar computation.

Which values get their own buffer (are *realized*): the function's outputs, every SCATTER and CONTIGUOUS, and any
fused value that would otherwise be recomputed too often: one read at several indices (stencils, scans), an
expensive one broadcast across outer loops it does not depend on, or one computed in several loop nests when the
cost model (fnx/lower/cost.py) says recomputing it costs more than a buffer. Everything else fuses into its
consumers: elementwise chains compute in registers and movement ops (reshape, permute, expand, pad, shrink, flip,
gather) become index arithmetic on the loads, never copies.

A REDUCE fuses into the kernel that consumes it (softmax's max and sum, layernorm's mean and variance) when that is
cheap: its input row fits in cache (FUSED_ROW_BYTES), so the consumer's second read of the row costs no memory
traffic; the consumer reads each of its elements in one iteration of the loops outside it, so linearize computes it
once per row, never once per output element; it is not a matmul-like product of two loads (those stay their own
kernel for the optimizer); and one kernel computes it. The last condition, like the recompute rule, is a decision
over the whole function: `rangeify` splits, finds the fused values computed in several places at a cost, gives
buffers to those whose buffer saves the most (`_recomputed`), and splits again until nothing changes. A build
that finds a value needing a buffer fails, and the split builds again once the value has one; the needs of those
builds are found ahead by one speculative walk (`_Hint`), a kernel built in an earlier split is reused (`_reused`)
and a failed build replayed (`_Failed`) when its walk would repeat.

A stash saves the buffer of such a recomputed value when one kernel computes it twice: once in a fused reduction
over rows of the kernel's own output and once in the output loops at the same element (softmax's exp(x - max),
summed and then divided). The reduction's loop also stores the value into the output row, and the output loop
reads it back from there and overwrites it: one exp per element and no intermediate buffer, the row still in
cache (`KernelBuilder._stashed`). The rows must be the kernel's outer loops (`Kernel.row_ranges`): the optimizer
then keeps them outermost and splits only them across threads. One stash per kernel.

A kernel here is loops (RANGE) over one realized value: LOADs from buffers, scalar ALU ops, REDUCEs (each with
its own RANGEs, in REDUCE.src[1:]; linearize nests each at the output loops it depends on), and a STORE.
"""
from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, field, replace
from functools import cached_property

from fnx import dtypes
from fnx.dtypes import DType
from fnx.lower.cost import (_ranges_in, element_flops, kernel_bytes, kernel_flops, node_flops,
                            recompute_costs_more)
from fnx.lower.symbolic import simplify_kernel
from fnx.uop import GroupOp, Ops, ParamArg, RangeArg, ReduceArg, UOp, postorder

INDEX = dtypes.int64
CHEAP_FLOPS = 3               # a kept value this cheap to recompute is fused again where that saves a kernel
FUSED_ROW_BYTES = 256 * 1024  # a fused REDUCE's input is read again by its consumer: it should still be in cache
HEAVY_EPILOGUE = 20           # weighted ops an element from which a matmul's elementwise epilogue is a kernel of its
                              # own: applied to a register block's accumulators, a transcendental's temporaries
                              # spill (AVX2 has 16 registers, 12 of them accumulators); the W8 RNN cell
                              # tanh(h @ wh + x @ wx) on the AVX2 EPYC: fused 4.2 us a step, apart 3.2 us


@dataclass
class BufferSpec:
    dtype: DType
    size: int
    kind: str          # 'input' | 'intermediate' | 'output'
    param: int = -1    # input slot for kind 'input'
    device: str | None = None  # where it lives when not the executable's own device (a COPY's output)


@dataclass
class Kernel:
    """One kernel: `sink` is SINK(STORE) over scalar ops; args[i] is the schedule buffer behind kernel PARAM i."""
    name: str
    sink: UOp
    args: list[int]
    ranges: list[UOp]            # output loops, outermost first
    reduce_ranges: list[UOp]     # reduction loops, innermost last
    parallel: bool = True        # False when iterations must run in order (scatter)
    ordered: frozenset | None = None  # with parallel False, the loops that must (None: all); the others write
                                 # other elements in every iteration (a scatter's window: the columns of a row)
    thread_candidate: int = 0    # index into ranges of a loop whose iterations are independent
    thread_range: int = -1       # index into ranges split across threads (-1: none), set by optimize
    lanes: tuple = ()            # RANGEs computed as vector lanes of one width, not loops (set by optimize)
    locals: tuple = ()           # RANGEs that are the work item's index in its work-group (grid devices: LOCAL
                                 # and GROUP, one size), not loops (set by optimize)
    opts: tuple = ()             # the optimization actions applied (set by optimize)
    init: frozenset = frozenset()  # the loops that run in order, of an accumulating kernel (optimize)
    prelude: tuple = ()          # kernels that run first: PACK's copies of operands into panels (optimize)
    sources: tuple = ()          # the graph nodes it computes (not the ones it loads), for naming it
    row_ranges: tuple | None = None  # with a stash (module doc): the output loops that must enclose the others (it
                                     # is written and read back within one of their iterations), the only ones
                                     # that may be thread-split
    code: str = ""               # the name of the kernel whose compiled function this one runs, when it is a copy of
                                 # an earlier kernel (same graph and loops: a later layer's); '' for its own
    stream: frozenset = frozenset()  # PARAM slots whose whole-line vector stores bypass the caches (non-temporal:
                                     # fnx/lower/pipeline.py's `streamed`)

    @cached_property
    def work(self) -> int:
        """Innermost iterations: the output loops times the reduce loops of each reduction (reductions run one
        after another, except the levels of a blocked sum, each nested in the one outside it)."""
        reduce_loops, deps = set(self.reduce_ranges), {}
        for u in self.sink.toposort:  # the reduce loops each node varies along
            deps[u] = ({u} & reduce_loops if u.op is Ops.RANGE else set().union(*(deps[s] for s in u.src))
                       - (set(u.src[1:]) if u.op is Ops.REDUCE else set()))
        loops = {frozenset(deps[u.src[0]] | set(u.src[1:]) & reduce_loops) for u in self.sink.toposort
                 if u.op is Ops.REDUCE}
        nests = [rs for rs in loops if not any(rs < other for other in loops)]  # a level runs inside the next
        inner = sum(math.prod(r.arg.size for r in rs) for rs in nests)
        return math.prod(r.arg.size for r in self.ranges) * max(inner, 1)

    def buffers(self, op: Ops) -> set[int]:
        """The schedule buffers its LOADs (`op` LOAD) or its STOREs (`op` STORE) name."""
        return {self.args[u.src[0].arg.slot] for u in self.sink.toposort if u.op is op}

    @cached_property
    def thread_size(self) -> int:
        """Iterations of the loop split across threads (1 when none is)."""
        return self.ranges[self.thread_range].arg.size if self.thread_range >= 0 else 1

    @cached_property
    def output(self) -> int:
        """The schedule buffer the kernel stores into."""
        return self.args[self.sink.src[0].src[0].arg.slot]

    @property
    def flops(self) -> int:
        """Estimated weighted FLOPs of one run (fnx/lower/cost.py)."""
        return kernel_flops(self)

    @property
    def bytes(self) -> int:
        """Estimated bytes loaded and stored by one run (fnx/lower/cost.py)."""
        return kernel_bytes(self)


@dataclass
class Schedule:
    kernels: list[Kernel]
    buffers: list[BufferSpec]
    outputs: list[int]            # buffer id of each output
    realized: dict[UOp, int] = field(default_factory=dict)


def strides_of(shape: tuple[int, ...]) -> list[int]:
    out, acc = [], 1
    for s in reversed(shape):
        out.append(acc if s != 1 else 0)
        acc *= s
    return out[::-1]


def linear_index(idx: tuple[UOp, ...], shape: tuple[int, ...]) -> UOp:
    total = UOp.const(INDEX, 0)
    for i, st in zip(idx, strides_of(shape)):
        if st: total = total + i * st
    return total


def reshape_index(idx: tuple[UOp, ...], new_shape: tuple[int, ...], old_shape: tuple[int, ...]) -> tuple[UOp, ...]:
    """Indices into `old_shape` of the element at `idx` of its reshape to `new_shape`."""
    if tuple(s for s in new_shape if s != 1) == tuple(s for s in old_shape if s != 1):  # only size-1 axes change
        kept = iter(i for i, s in zip(idx, new_shape) if s != 1)
        return tuple(next(kept) if s != 1 else UOp.const(INDEX, 0) for s in old_shape)
    if 0 in new_shape: return tuple(UOp.const(INDEX, 0) for _ in old_shape)  # (no elements: never computed)
    out: list[UOp] = []
    i = j = 0
    while i < len(new_shape) or j < len(old_shape):
        # the shortest runs of axes with equal sizes (merged, split or both): each run's old indices come from its
        # new ones alone, without a flat index over the whole array to divide (fewer nodes to build and simplify)
        i0, j0, n, o = i, j, 1, 1
        if i < len(new_shape): n, i = new_shape[i], i + 1
        if j < len(old_shape): o, j = old_shape[j], j + 1
        while n != o:
            if n < o and i < len(new_shape): n, i = n * new_shape[i], i + 1
            elif j < len(old_shape): o, j = o * old_shape[j], j + 1
            else: break
        flat = linear_index(idx[i0:i], new_shape[i0:i]) if i - i0 > 1 else idx[i0] if i > i0 else None
        for k, (size, st) in enumerate(zip(old_shape[j0:j], strides_of(old_shape[j0:j]))):
            if size == 1 or flat is None: out.append(UOp.const(INDEX, 0))
            elif k == 0: out.append(flat // st if st != 1 else flat)  # (the run's outermost axis: flat < sizes)
            else: out.append((flat // st) % size if st != 1 else flat % size)
    return tuple(out)


class _Realize(Exception):
    """Raised while building a kernel when a fused value turns out to need its own buffer."""
    def __init__(self, node: UOp):
        self.node = node


@dataclass(eq=False)
class _Nest:
    """One loop nest of a kernel: its output loops, or a fused REDUCE's loops (the outer ones it depends on first)."""
    loops: list[UOp]
    kernel: KernelBuilder


@dataclass
class _Plan:
    """The whole-function fusion decision: fused values that get a buffer anyway, and where the last split put
    every fused value it computed (the loop nests computing it)."""
    keep: set[UOp] = field(default_factory=set)
    stash: set[UOp] = field(default_factory=set)
    grid: bool = False  # a grid device: widened 16-bit values get their buffer in the narrow type (_narrowest),
                        # and a matmul keeps even a heavy epilogue (no register block of accumulators to spill)
    computed_in: dict[UOp, set[_Nest]] = field(default_factory=dict)
    # the index expressions built so far in this lowering, shared by every build of every split (KernelBuilder.
    # linear, .reshaped): a few hundred distinct ones, asked for ~30k times in the GPT step (8 layers) with ~90k
    # nodes made again for them: 24% of rangeify's Python calls
    indices: dict[tuple, UOp | tuple] = field(default_factory=dict)


class KernelBuilder:
    """Builds the scalar graph of one kernel: `value(node, idx, gate)` is node's element at index tuple idx."""

    def __init__(self, schedule: Schedule, ranges: list[UOp], plan: _Plan, speculative: bool = False):
        self.schedule, self.plan, self.speculative = schedule, plan, speculative
        self.indices = plan.indices
        self.args: list[int] = []
        self.memo: dict[tuple, UOp] = {}
        self.nest = self.top = _Nest(list(ranges), self)
        self.root: UOp | None = None                        # the realized node and its buffer (set by _kernel_for)
        self.root_buffer, self.out_idx = -1, ()
        self.stash_reads: set[UOp] = set()                  # stashed values read back at the output index
        self.stash_writes: dict[UOp, tuple] = {}            # stashed value -> (index, STORE into the output)
        self.next_range = len(ranges)                       # range ids are unique within a kernel
        self.reduce_ranges: list[UOp] = []
        self.seen_at: dict[tuple[_Nest, UOp], set] = {}     # the index tuples a node was computed at, per nest
        self.reduced_at: dict[UOp, set] = {}                # the index tuples a fused REDUCE was computed at
        self.repeats_at: dict[tuple, int] = {}              # repeats(idx) per nest and index tuple (a nest's loops
                                                            # never change; a chain of ops asks it at one idx)
        self.computed_in: dict[UOp, set[_Nest]] = {}        # handed to the plan once the kernel is complete
        self.first_read: dict[UOp, int] = {}                # every node the walk asked the value of -> how many
                                                            # needs it had found then, at the first ask: kept when
                                                            # a need's cone is undone, that build read it (_Hint)
        self.walks: list[tuple[int, set[UOp]]] = []         # the nodes each cost walk counted (_walk), likewise
        # speculative builds (_Hint): the values found to need a buffer, each assumed to have one from then on
        # (`assumed`: a placeholder buffer), and the journal of the walk's changes to its tables, to undo a need's
        # half-built cone
        self.needs: list[UOp] = []
        self.assumed: list[UOp] = []
        self.journal: list[tuple] = []
        self.entered: dict[UOp, int] = {}                   # the journal's length when the walk first met a node
                                                            # (undone with a need's cone)
        self.first_failed: _Failed | None = None            # the first need, as a plain build fails (_Failed)

    def _walk(self) -> set[UOp]:
        """A set for a cost walk over the graph to fill with the nodes it counted, kept: the walk read whether
        those and their sources are realized (`_Failed`, `_Hint`)."""
        self.walks.append((len(self.needs), walked := set()))
        return walked

    def _note(self, container: set | dict, item) -> None:
        """`item` was just added to `container` (a new key of a dict): undone if a need is found beneath it."""
        if self.speculative: self.journal.append((container, item))

    def _add(self, container: set, item) -> None:
        if item not in container:
            container.add(item)
            self._note(container, item)

    def _undo(self, mark: int) -> None:
        journal = self.journal
        while len(journal) > mark:
            container, item = journal.pop()
            if container is None: self.next_range = item
            elif type(container) is set: container.discard(item)
            elif type(container) is list: del container[item:]
            else: del container[item]

    def _assume_realized(self, u: UOp, idx: tuple[UOp, ...], gate: UOp | None) -> UOp:
        """Speculation (`_Hint`): u needs a buffer. Undo what the walk did beneath u (the next build loads u and
        never goes there; what it read there stays in `first_read`: the builds up to this one read it), note the
        need, and go on as that build would: loading u (from a placeholder buffer, dropped afterwards)."""
        if not self.needs: self.first_failed = _Failed.of(self, u)
        self._undo(self.entered[u])
        self.needs.append(u)
        self.schedule.buffers.append(BufferSpec(u.dtype, u.size, "intermediate"))
        self.schedule.realized[u] = len(self.schedule.buffers) - 1
        self.assumed.append(u)
        return self.load(self.schedule.realized[u], self.linear(idx, u.shape), gate)

    def unassume(self) -> None:
        """Drop the placeholder buffers of the assumed needs (the build fails: they are not the schedule's)."""
        while self.assumed:
            del self.schedule.realized[self.assumed.pop()]
            self.schedule.buffers.pop()

    def give_up(self) -> None:
        """The walk found needs: the build fails on the first, after the stash's check (the next builds, each need
        realized, end there too)."""
        try:
            self.stash_stores()
        except _Realize as need:
            if need.node not in self.needs: self.needs.append(need.node)
        raise _Realize(self.needs[0])

    def release(self) -> None:
        """Drop the walk's tables once the kernel is built or has failed: the builder lives on in a cycle with its
        loop nests (and in the plan's computed_in), and its memo held every scalar node it made until the cyclic
        collector ran, one collection of 1.3 s after lowering the gradient of twelve gelu(standardize) steps."""
        self.unassume()
        self.memo, self.seen_at, self.repeats_at, self.reduced_at, self.journal, self.entered = {}, {}, {}, {}, [], {}

    def linear(self, idx: tuple[UOp, ...], shape: tuple[int, ...]) -> UOp:
        """linear_index(idx, shape), built once per lowering (`_Plan.indices`)."""
        if (hit := self.indices.get(key := (idx, shape))) is None: hit = self.indices[key] = linear_index(idx, shape)
        return hit

    def reshaped(self, idx: tuple[UOp, ...], new_shape: tuple[int, ...], old_shape: tuple[int, ...]) -> tuple:
        """reshape_index(idx, new_shape, old_shape), built once per lowering (`_Plan.indices`)."""
        if (hit := self.indices.get(key := (idx, new_shape, old_shape))) is None:
            hit = self.indices[key] = reshape_index(idx, new_shape, old_shape)
        return hit

    def buffer_arg(self, buf_id: int) -> UOp:
        if buf_id not in self.args: self.args.append(buf_id)
        spec = self.schedule.buffers[buf_id]
        return UOp(Ops.PARAM, spec.dtype, (), ParamArg(self.args.index(buf_id), (spec.size,), None))

    def load(self, buf_id: int, index: UOp, gate: UOp | None) -> UOp:
        # a constant index inside the buffer needs no gate: where the gate is false the caller discards the value
        # (a pad's WHERE), and across vector lanes a gated load of one address is a masked gather (the threefry
        # rounds of an eager random op under a pad: 0.6 s of LLVM for one kernel)
        if gate is not None and index.op is Ops.CONST and 0 <= index.arg.value < self.schedule.buffers[buf_id].size:
            gate = None
        src = (self.buffer_arg(buf_id), index) + ((gate,) if gate is not None else ())
        return UOp(Ops.LOAD, self.schedule.buffers[buf_id].dtype, src)

    def value(self, u: UOp, idx: tuple[UOp, ...], gate: UOp | None = None) -> UOp:
        key = (u, idx, gate)
        if (hit := self.memo.get(key)) is not None: return hit
        if u not in self.entered:  # the walk's first visit, or its first since a need's undo left u
            if u not in self.first_read: self.first_read[u] = len(self.needs)  # (never undone: that build read u)
            self._note(self.entered, u)
            self.entered[u] = len(self.journal)
        if (buf := self.schedule.realized.get(u)) is not None:
            out = self.load(buf, self.linear(idx, u.shape), gate)
        else:
            mark = len(self.journal)
            try:
                if u.op in _ALWAYS_REALIZED or _is_control_output(u) or u in self.plan.keep: raise _Realize(u)
                if u in self.plan.stash and self.root is not None: out = self._stashed(u, idx, gate)
                else: out = self.compute(u, idx, gate)
            except _Realize as need:
                # speculating, a need met at u's first visit is noted and assumed; any other ends the walk
                if not self.speculative or need.node is not u or self.entered[u] != mark: raise
                out = self._assume_realized(u, idx, gate)
        self.memo[key] = out
        if self.speculative: self.journal.append((self.memo, key))  # (self._note, inline: the hottest call)
        return out

    def _stashed(self, u: UOp, idx: tuple[UOp, ...], gate: UOp | None) -> UOp:
        """A stashed value: computed once, in the fused reduction that reads it, and stored there into the
        kernel's own output at the same element; read back from there by the output loops (module docstring)."""
        if (self.stash_reads | set(self.stash_writes)) - {u}: raise _Realize(u)  # one stash per kernel
        if gate is None and self.nest is self.top and idx == self.out_idx:
            self._add(self.stash_reads, u)
            return self.load(self.root_buffer, self.linear(idx, u.shape), None)
        if gate is None and self.nest is not self.top and u not in self.stash_writes:
            value = self.compute(u, idx)
            self.stash_writes[u] = (idx, _store(self, self.root_buffer, self.linear(idx, u.shape), value))
            self._note(self.stash_writes, u)
            return value
        raise _Realize(u)  # read anywhere else: it gets a buffer of its own

    def stash_stores(self) -> tuple[list[UOp], tuple[UOp, ...] | None]:
        """The stash's STOREs and the output loops that must enclose the others, once the kernel is built; a
        stash that is not both written in a reduction over the output's own rows and read back is realized."""
        if not self.stash_reads and not self.stash_writes: return [], None
        rows: set[UOp] = set()
        for u in self.stash_reads | set(self.stash_writes):
            if u not in self.stash_reads or u not in self.stash_writes: raise _Realize(u)
            idx = self.stash_writes[u][0]
            if not all(i is o or (i.op is Ops.RANGE and i in self.reduce_ranges) for i, o in zip(idx, self.out_idx)):
                raise _Realize(u)
            rows |= {i for i, o in zip(idx, self.out_idx) if i is o and i.op is Ops.RANGE}
        prefix = tuple(self.top.loops[:len(rows)])
        if set(prefix) != rows:  # the rows must be the outer loops, or a later row would overwrite the stash
            raise _Realize(next(iter(self.stash_writes)))
        return [st for _, st in self.stash_writes.values()], prefix

    def repeats(self, idx: tuple[UOp, ...]) -> int:
        """How often the current nest computes each element at idx: the iterations of the loops outside the
        innermost one idx depends on that idx does not depend on (linearize hoists out of the inner ones)."""
        key = (self.nest, idx)
        if (hit := self.repeats_at.get(key)) is not None: return hit
        used = {r for i in idx for r in _ranges_in(i)}
        loops = self.nest.loops
        innermost = max((k for k, r in enumerate(loops) if r in used), default=-1)
        out = self.repeats_at[key] = math.prod(r.arg.size for r in loops[:innermost + 1] if r not in used)
        return out

    def _check_fusion(self, u: UOp, idx: tuple[UOp, ...]) -> None:
        if u.op not in GroupOp.ALU: return
        if (seen := self.seen_at.get(key := (self.nest, u))) is None:
            self.seen_at[key] = {idx}
            self._note(self.seen_at, key)
            self._computed_in_nest(u)
        else:
            self._add(seen, idx)
            if len(seen) > 1 and element_flops(u, self.schedule.realized, 1, self._walk()) > 1: raise _Realize(u)
        repeats = self.repeats(idx)
        if repeats > 1 and u.size <= 1: repeats = 1
        if repeats > 1 and element_flops(u, self.schedule.realized, 8, self._walk()) > 8: raise _Realize(u)
        # inside a reduction, an operand that does not vary along some of its loops (a matmul's A along the output
        # columns) is recomputed in each of their iterations: a layernorm feeding a weight gradient ran per
        # multiply-add. It gets a buffer when that costs less than the copies
        if repeats > 1 and self.nest is not self.top and recompute_costs_more(u, repeats, self.schedule.realized,
                                                                              self._walk()):
            raise _Realize(u)

    def _computed_in_nest(self, u: UOp) -> None:
        if (nests := self.computed_in.get(u)) is None:
            self.computed_in[u] = {self.nest}
            self._note(self.computed_in, u)
        else:
            self._add(nests, self.nest)

    def compute(self, u: UOp, idx: tuple[UOp, ...], gate: UOp | None = None) -> UOp:
        """Node u's element at idx from its sources (the kernel's own root is computed, never loaded)."""
        self._check_fusion(u, idx)
        op, src = u.op, u.src
        if op is Ops.CONST: return UOp.const(u.dtype, u.arg.value)
        if op is Ops.IOTA: return idx[u.arg.axis].cast(u.dtype)
        if op in GroupOp.ALU: return UOp(op, u.dtype, tuple(self.value(s, idx, gate) for s in src), u.arg)
        if op is Ops.REDUCE: return self._fused_reduce(u, idx, gate)
        x = src[0]
        if op is Ops.RESHAPE: return self.value(x, self.reshaped(idx, u.shape, x.shape), gate)
        if op is Ops.PERMUTE:
            inverse = [0] * len(idx)
            for i, p in enumerate(u.arg): inverse[p] = idx[i]
            return self.value(x, tuple(inverse), gate)
        if op is Ops.EXPAND:
            return self.value(x, tuple(UOp.const(INDEX, 0) if s == 1 else i for i, s in zip(idx, x.shape)), gate)
        if op is Ops.SHRINK: return self.value(x, tuple(i + b for i, (b, _) in zip(idx, u.arg)), gate)
        if op is Ops.FLIP:
            return self.value(x, tuple(UOp.const(INDEX, s - 1) + i * -1 if f else i
                                       for i, s, f in zip(idx, x.shape, u.arg)), gate)
        if op is Ops.PAD: return self._pad(u, idx, gate)
        if op is Ops.INDEX:
            axis, k = u.arg, src[1].ndim
            target = self.value(src[1], idx[axis:axis + k], gate).cast(INDEX)
            n = x.shape[axis]
            clamped = target.alu(Ops.MAX, 0)
            clamped = clamped.alu(Ops.CMPLT, n).alu(Ops.WHERE, clamped, n - 1)
            return self.value(x, idx[:axis] + (clamped,) + idx[axis + k:], gate)
        raise NotImplementedError(f"rangeify: no rule for {op}")

    def reduce(self, u: UOp, idx: tuple[UOp, ...]) -> UOp:
        """REDUCE u's element at idx as a scalar REDUCE over fresh RANGEs, its input built in a loop nest of its own."""
        reduce_op, axes, x = u.arg.op, u.arg.axes, u.src[0]
        if x.size == 0: return UOp.const(u.dtype, reduce_identity(reduce_op, u.dtype))
        full, fresh = [], []
        for i, s in enumerate(x.shape):
            if i in axes and s > 1:
                fresh.append(UOp(Ops.RANGE, INDEX, (), RangeArg(self.next_range, s)))
                self.next_range += 1
                full.append(fresh[-1])
            else:
                full.append(UOp.const(INDEX, 0) if i in axes else idx[i])
        if not fresh: return self.value(x, tuple(full))
        if self.speculative:
            self.journal += [(None, self.next_range - len(fresh)), (self.reduce_ranges, len(self.reduce_ranges))]
        self.reduce_ranges.extend(fresh)
        used = {r for i in idx for r in _ranges_in(i)}
        outer, self.nest = self.nest, _Nest([r for r in self.nest.loops if r in used] + fresh, self)
        try:
            inner = self.value(x, tuple(full))
        finally:
            self.nest = outer
        return UOp(Ops.REDUCE, u.dtype, (inner, *fresh), ReduceArg(reduce_op, ()))

    def _fused_reduce(self, u: UOp, idx: tuple[UOp, ...], gate: UOp | None) -> UOp:
        """A REDUCE computed inside its consumer's kernel, or _Realize when that is not cheap (module docstring)."""
        x = u.src[0]
        row_bytes = math.prod(s for i, s in enumerate(x.shape) if i in u.arg.axes) * x.dtype.itemsize
        if gate is not None or row_bytes > FUSED_ROW_BYTES or self.repeats(idx) > 1: raise _Realize(u)
        if (places := self.reduced_at.get(u)) is None:
            places = self.reduced_at[u] = set()
            self._note(self.reduced_at, u)
        self._add(places, idx)
        if len(places) > 1: raise _Realize(u)  # read at two different places: one buffer serves both
        self._computed_in_nest(u)
        out = self.reduce(u, idx)
        if _is_matmul_like(out) and (not _one_element_per_iteration(u, idx)
                                     or any(r in self.reduce_ranges for i in idx for r in _ranges_in(i))):
            raise _Realize(u)  # a matmul fuses only into an elementwise epilogue, never into another reduction
        if (_is_matmul_like(out) and not self.plan.grid and self.root is not None
                and self._root_flops(HEAVY_EPILOGUE) > HEAVY_EPILOGUE):
            raise _Realize(u)  # ... and on the CPU only into a light one
        return out

    def _root_flops(self, limit: float) -> float:
        """Weighted ops an element of the kernel's root (itself realized: the walk starts at its sources), reduced
        values not counted; above `limit` it may stop counting."""
        walked = self._walk()
        return node_flops(self.root) + sum(element_flops(s, self.schedule.realized, limit, walked)
                                            for s in self.root.src)

    def _pad(self, u: UOp, idx: tuple[UOp, ...], gate: UOp | None) -> UOp:
        x, valid, inner = u.src[0], None, []
        for i, s, (b, _) in zip(idx, x.shape, u.arg):
            inner.append(i + (-b))
            if i.bounds[0] >= b and i.bounds[1] < b + s: continue
            ok = simplify_kernel((i < b).alu(Ops.CMPNE, True).alu(Ops.AND, i < b + s))
            valid = ok if valid is None else valid.alu(Ops.AND, ok)
        if valid is None: return self.value(x, tuple(inner), gate)
        inner_gate = valid if gate is None else gate.alu(Ops.AND, valid)
        return valid.alu(Ops.WHERE, self.value(x, tuple(inner), inner_gate), UOp.const(u.dtype, 0))


def _one_element_per_iteration(u: UOp, idx: tuple[UOp, ...]) -> bool:
    """Whether the consumer reads REDUCE u at plain, distinct loop indices (a transpose or an elementwise epilogue
    of a matmul): fused there, each output element is still reduced exactly once, and no buffer round trip is
    needed."""
    kept = [i for i, s in zip(idx, u.shape) if s > 1]
    return all(i.op is Ops.RANGE for i in kept) and len(set(kept)) == len(kept)


def _is_matmul_like(red: UOp) -> bool:
    """A reduced product of two operands that walk different ranges (a matmul, an outer product reduced)."""
    body = red.src[0] if red.op is Ops.REDUCE else red
    while body.op is Ops.CAST: body = body.src[0]
    return body.op is Ops.MUL and _ranges_in(body.src[0]) != _ranges_in(body.src[1])


def _ranges(shape: tuple[int, ...], first_id: int) -> tuple[tuple[UOp, ...], list[UOp]]:
    idx, ranges = [], []
    for s in shape:
        if s == 1:
            idx.append(UOp.const(INDEX, 0))
        else:
            r = UOp(Ops.RANGE, INDEX, (), RangeArg(first_id + len(ranges), s))
            idx.append(r)
            ranges.append(r)
    return tuple(idx), ranges


_INIT = {Ops.ADD: 0, Ops.MUL: 1}


def reduce_identity(op: Ops, dtype: DType):
    if op in _INIT: return _INIT[op] if not dtype.is_bool else op is Ops.MUL
    return -math.inf if dtype.is_float else dtype.min if not dtype.is_bool else False


def _store(builder: KernelBuilder, buf_id: int, index: UOp, value: UOp, gate: UOp | None = None) -> UOp:
    src = (builder.buffer_arg(buf_id), index, value) + ((gate,) if gate is not None else ())
    return UOp(Ops.STORE, dtypes.bool_, src)


def _finish(builder: KernelBuilder) -> None:
    """The kernel is complete: tell the plan where it computed each fused value."""
    for u, nests in builder.computed_in.items(): builder.plan.computed_in.setdefault(u, set()).update(nests)


@dataclass
class _Built:
    """A kernel an earlier split built for a realized node, with what its build depended on (`_reused`)."""
    kernel: Kernel
    groups: list[tuple[UOp, ...]]  # per kernel argument: the loaded nodes behind it (empty: the root's own buffer)
    computed: frozenset            # the fused nodes it computed
    stashed: frozenset             # those of them in the plan's stash
    computed_in: dict              # what it told the plan (_finish)


@dataclass
class _Failed:
    """A build an earlier split began for a realized node and gave up, needing `need` realized first, with the
    status of every node whose status the walk read: realized, kept, stashed. A failed build tells the plan
    nothing (`_finish` never ran), so when those statuses are all the same it fails again the same way: the
    second split of the gradient of twelve `x + gelu(standardize(x))` steps spent a third of rangeify (400k node
    visits) repeating the first split's 24 failed walks. A node's builds fail one after another, each after the
    last one's need got its buffer: the statuses list the need first, then the realized nodes, where a failure
    of another point in that sequence differs, so checking one that does not apply stops early."""
    need: UOp
    statuses: dict[UOp, tuple[bool, bool, bool]]

    @staticmethod
    def status(u: UOp, schedule: Schedule, plan: _Plan) -> tuple[bool, bool, bool]:
        return u in schedule.realized, u in plan.keep, u in plan.stash

    @classmethod
    def of(cls, builder: KernelBuilder, need: UOp) -> _Failed:
        read = set(builder.first_read)
        for _, walked in builder.walks:
            read |= walked
            for n in walked: read.update(n.src)  # (the walk stopped at the realized ones)
        realized = builder.schedule.realized
        order = [need, *(n for n in read if n in realized), *(n for n in read if n not in realized)]
        return cls(need, {n: cls.status(n, builder.schedule, builder.plan) for n in order})

    def again(self, schedule: Schedule, plan: _Plan) -> bool:
        return all(self.status(n, schedule, plan) == was for n, was in self.statuses.items())


@dataclass
class _Hint:
    """The needs a speculative build found, in order, for the builds of the same node that follow in this split.

    A build that meets a value needing a buffer fails; the split realizes the value and builds again from the
    top, and the next build fails at the next such value a little further on. For a chain of L normalizations,
    or the gradient of L layers, that is L walks of the whole graph below the node: quadratic. A speculative build
    instead notes the need, undoes what it did beneath it (the journal), assumes it realized and walks on, as
    the next build would: in one walk it finds the needs of all the builds to come. The next build replays the
    next need without walking as long as nothing realized since (but the earlier needs) is a node the walk had
    read by then (`first_read`: the number of needs found when the walk first read each node): the builds it
    replaces read exactly those nodes, so they would fail alike. Otherwise it walks again."""
    needs: list[UOp]
    first_read: dict[UOp, int]
    mark: int                  # schedule.realized's length when the nodes realized since were last checked
    next: int = 1              # the need the next build would fail on
    conflict: float = math.inf  # the first need whose walk read a node realized since (unforeseen)

    @classmethod
    def of(cls, builder: KernelBuilder) -> _Hint:
        first_read = dict(builder.first_read)
        for found, walked in builder.walks:
            for n in walked:
                for m in (n, *n.src):  # (the walk stopped at the realized sources)
                    if first_read.get(m, found + 1) > found: first_read[m] = found
        return cls(builder.needs, first_read, len(builder.schedule.realized) - 1)  # (the root, the last, goes)

    def replay(self, schedule: Schedule) -> UOp | None:
        """The need the next build of the node (realized again, the last) would fail on, when sure; else None."""
        realized = schedule.realized
        expected = self.needs[:self.next]
        for n in itertools.islice(realized, self.mark, len(realized) - 1):
            if n not in expected: self.conflict = min(self.conflict, self.first_read.get(n, math.inf))
        self.mark = len(realized) - 1
        if self.next >= len(self.needs) or self.conflict <= self.next or expected[-1] not in realized: return None
        self.next += 1
        return self.needs[self.next - 1]


def _reused(u: UOp, buf_id: int, schedule: Schedule, plan: _Plan, built: dict) -> list[Kernel] | None:
    """The kernel an earlier split built for `u`, when this split would build the same one, else None.

    A build is a deterministic walk from u: each node it meets is loaded when it is realized, computed otherwise
    (raising _Realize when the plan keeps it, or by cost: both read only the realized status of the nodes the
    walk meets), and stashed when the plan stashes it. So when every node it loaded is still realized, in the
    same buffers as one another, and every node it computed is still unrealized, unkept and stashed alike, the
    build would repeat itself; only the buffer ids change. The fixpoint in `rangeify` splits the whole function
    several times, adding a few kept values each time: most kernels come out the same (the GPT step: 6 splits
    of ~110 kernels)."""
    entry = built.get(u)
    if entry is None: return None
    realized = schedule.realized
    if any(v not in realized or realized[v] != realized[g[0]] for g in entry.groups for v in g): return None
    if len({realized[g[0]] for g in entry.groups if g}) != sum(1 for g in entry.groups if g): return None
    if any(v in realized or v in plan.keep for v in entry.computed): return None
    if entry.stashed != frozenset(v for v in entry.computed if v in plan.stash): return None
    for v, nests in entry.computed_in.items(): plan.computed_in.setdefault(v, set()).update(nests)
    return [replace(entry.kernel, args=[realized[g[0]] if g else buf_id for g in entry.groups])]


def _remember(built: dict, u: UOp, buf_id: int, builder: KernelBuilder, kernel: Kernel) -> None:
    visited = {key[0] for key in builder.memo} - {u}
    realized = builder.schedule.realized
    loaded = [v for v in visited if v in realized]
    groups = [tuple(v for v in loaded if realized[v] == a) if a != buf_id else () for a in kernel.args]
    if any(not g for g, a in zip(groups, kernel.args) if a != buf_id): return  # (an argument it did not load)
    computed = frozenset(visited) - set(loaded)
    built[u] = _Built(replace(kernel), groups, computed, frozenset(v for v in computed if v in builder.plan.stash),
                      builder.computed_in)


def _kernel_for(u: UOp, buf_id: int, schedule: Schedule, plan: _Plan, built: dict | None = None,
                hints: dict | None = None) -> list[Kernel]:
    """The kernel(s) computing realized node u into buffer buf_id, or _Realize naming a value to realize first.
    `built`, when given, keeps each built kernel and each failed build for later splits (`_reused`, `_Failed`);
    `hints`, this split's needs found ahead by speculative builds (`_Hint`)."""
    if u.op is Ops.SCATTER: return _scatter_kernels(u, buf_id, schedule, plan)
    if built is not None and (again := _reused(u, buf_id, schedule, plan, built)) is not None: return again
    if hints is not None and (hint := hints.pop(u, None)) is not None and (need := hint.replay(schedule)) is not None:
        hints[u] = hint
        raise _Realize(need)
    for failed in built.get((u, _Failed), ()) if built is not None else ():
        if failed.again(schedule, plan): raise _Realize(failed.need)
    out_idx, ranges = _ranges(u.shape, 0)
    builder = KernelBuilder(schedule, ranges, plan, speculative=hints is not None)
    builder.root, builder.root_buffer, builder.out_idx = u, buf_id, out_idx
    try:
        return _build(u, buf_id, builder, ranges, built)
    except _Realize as need:
        builder.unassume()
        if built is not None:
            built.setdefault((u, _Failed), []).append(builder.first_failed or _Failed.of(builder, need.node))
        if not builder.needs: raise
        if need.node not in builder.needs: builder.needs.append(need.node)  # (met again: the walk ended there)
        hints[u] = _Hint.of(builder)
        raise _Realize(builder.needs[0]) from None
    finally:
        builder.release()


def _build(u: UOp, buf_id: int, builder: KernelBuilder, ranges: list[UOp], built: dict | None) -> list[Kernel]:
    out_idx = builder.out_idx
    if not u.size: value = UOp.const(u.dtype, 0)
    elif u.op is Ops.REDUCE: value = builder.reduce(u, out_idx)
    elif u.op is Ops.CONTIGUOUS: value = builder.value(u.src[0], out_idx)
    else: value = builder.compute(u, out_idx)
    if builder.needs: builder.give_up()
    stash, rows = builder.stash_stores()
    sink = UOp(Ops.SINK, dtypes.bool_, (_store(builder, buf_id, builder.linear(out_idx, u.shape), value), *stash))
    _finish(builder)
    name = f"{kernel_title(sink)}_{'x'.join(map(str, u.shape)) or 'scalar'}"
    sources = tuple(dict.fromkeys([u, *(key[0] for key in builder.memo)]))
    kernel = Kernel(name, simplify_kernel(sink), builder.args, ranges, builder.reduce_ranges, sources=sources,
                    row_ranges=rows)
    if built is not None: _remember(built, u, buf_id, builder, kernel)
    return [kernel]


# what a kernel's name says it does: its reductions first, then the elementwise ops worth naming (ADD and MUL only
# when nothing else is there), so FNX_DEBUG, the profiler and the pictures tell kernels apart at a glance
_REDUCE_TITLES = {Ops.ADD: "sum", Ops.MAX: "max", Ops.MUL: "prod", Ops.AND: "all", Ops.OR: "any"}
_OP_TITLES = {Ops.EXP2: "exp", Ops.LOG2: "log", Ops.SIN: "sin", Ops.SQRT: "sqrt", Ops.RECIP: "div", Ops.DIV: "div",
              Ops.MOD: "mod", Ops.MAX: "max", Ops.WHERE: "where", Ops.CMPLT: "cmp", Ops.CMPNE: "cmp",
              Ops.CAST: "cast", Ops.BITCAST: "bitcast", Ops.TRUNC: "trunc", Ops.XOR: "bits", Ops.SHL: "bits",
              Ops.SHR: "bits", Ops.AND: "bits", Ops.OR: "bits"}


def kernel_title(sink: UOp, parts: int = 3) -> str:
    """A short name for the kernel under `sink` from its ops: 'dot' (a sum of products of two loads), 'sum',
    'max', then 'exp', 'div', 'where', ...; 'add'/'mul' when those are all it computes, 'copy' when it only
    moves data. At most `parts` words, joined by '_'."""
    nodes = sink.toposort
    titles = [("dot" if r.arg.op is Ops.ADD and r.src[0].op is Ops.MUL and
               all(s.op is Ops.LOAD for s in r.src[0].src) else _REDUCE_TITLES.get(r.arg.op, "reduce"))
              for r in nodes if r.op is Ops.REDUCE]
    titles += [_OP_TITLES[u.op] for u in nodes if u.op in _OP_TITLES]
    if not titles: titles = [u.op.name.lower() for u in nodes if u.op in (Ops.ADD, Ops.MUL)]
    return "_".join(list(dict.fromkeys(titles))[:parts]) or "copy"


def _scatter_kernels(u: UOp, buf_id: int, schedule: Schedule, plan: _Plan) -> list[Kernel]:
    """Copy the operand into the output, then apply the updates in order (one sequential kernel)."""
    x, ind, upd = u.src
    axis, mode = u.arg.axis, u.arg.mode
    copy = UOp(Ops.CONTIGUOUS, u.dtype, (x,))
    kernels = _kernel_for(copy, buf_id, schedule, plan) if x.size else []
    idx, ranges = _ranges(upd.shape, 0)
    builder = KernelBuilder(schedule, ranges, plan)
    if upd.size == 0: return kernels
    if upd not in schedule.realized and _reduces_inside(upd, schedule.realized): raise _Realize(upd)
    k = ind.ndim
    target = builder.value(ind, idx[axis:axis + k]).cast(INDEX)
    n = x.shape[axis]
    gate = (target < 0).alu(Ops.CMPNE, True).alu(Ops.AND, target < n)
    index = linear_index(idx[:axis] + (target,) + idx[axis + k:], x.shape)
    new = builder.value(upd, idx)
    if mode != "set":
        old = builder.load(buf_id, index, gate)
        combine = {"add": Ops.ADD, "mul": Ops.MUL, "max": Ops.MAX}.get(mode)
        new = old.alu(combine, new) if combine else new.alu(Ops.CMPLT, old).alu(Ops.WHERE, new, old)
        if mode == "min" and u.dtype.is_float:  # NaN propagates, as in numpy.minimum
            new = old.alu(Ops.CMPNE, old).alu(Ops.WHERE, old, new)
    sink = UOp(Ops.SINK, dtypes.bool_, (_store(builder, buf_id, index, new, gate),))
    _finish(builder)
    return kernels + [Kernel(f"S_{'_'.join(map(str, upd.shape))}", simplify_kernel(sink), builder.args, ranges,
                             builder.reduce_ranges, parallel=False, ordered=frozenset(ranges[axis:axis + k]))]


def _reduces_inside(u: UOp, realized: dict) -> bool:
    """Whether computing u fused would compute a reduction (one not realized yet). A scatter's updates are computed
    in its own kernel, which runs in order on one thread without vector lanes: a product there (the gradient of
    `E[ids] @ w` scatters `g @ w.T`) was computed scalar, once per update, 41.6 ms for 4096 x 256 x 64."""
    return any(v.op is Ops.REDUCE for v in postorder(u, None, realized))  # (stops at realized nodes: not in it)


_ALWAYS_REALIZED = (Ops.SCATTER, Ops.CONTIGUOUS, Ops.COPY)
_OWN_BUFFER = (Ops.REDUCE, *_ALWAYS_REALIZED)  # a reshape of one of these, when needed in a buffer, aliases it


def _is_control_output(u: UOp) -> bool:
    return u.op is Ops.GETTUPLE and u.src[0].op in GroupOp.Control


def _must_realize(body: UOp, plan: _Plan) -> list[UOp]:
    return [u for u in body.graph if u.op in _ALWAYS_REALIZED or _is_control_output(u) or u in plan.keep]


@dataclass
class HostStep:
    """A step of the schedule that is not a kernel: the runtime does it (its buffers are `inputs` -> `outputs`)."""
    node: UOp
    inputs: list[int]
    outputs: list[int]
    name: str


@dataclass
class ControlStep(HostStep):
    """A control-flow node run on the host: its inputs (COND: predicate first) and one buffer per output."""
    name: str = "control"


@dataclass
class TransferStep(HostStep):
    """COPY to another device: buffer inputs[0] copied into outputs[0], which lives on `device` (the seed's COPY,
    kept through lowering so a program over several devices is one schedule)."""
    device: str = ""
    name: str = "copy"


def _transfer_step(u: UOp, schedule: Schedule) -> TransferStep:
    """A buffer on COPY u's device, filled from its (already realized) source's buffer."""
    if u.src[0] not in schedule.realized: raise _Realize(u.src[0])
    schedule.buffers.append(BufferSpec(u.dtype, u.size, "intermediate", device=u.arg))
    schedule.realized[u] = len(schedule.buffers) - 1
    return TransferStep(u, [schedule.realized[u.src[0]]], [schedule.realized[u]], device=u.arg,
                        name=f"copy_{u.src[0].device}_to_{u.arg}")


def _control_step(node: UOp, schedule: Schedule) -> ControlStep:
    """Buffers for every output of a control node, fed by its (already realized) operands."""
    values = list(node.operands)  # COND: the predicate, then the operands
    missing = [v for v in values if v not in schedule.realized]
    if missing: raise _Realize(missing[0])
    body = node.src[0]
    outputs = []
    for i in range(len(body.src)):
        g = UOp(Ops.GETTUPLE, body.src[i].dtype, (node,), i)
        schedule.buffers.append(BufferSpec(g.dtype, g.size, "intermediate"))
        schedule.realized[g] = len(schedule.buffers) - 1
        outputs.append(len(schedule.buffers) - 1)
    return ControlStep(node, [schedule.realized[v] for v in values], outputs, f"{node.op.name.lower()}")


def _stashable(u: UOp, nests: set[_Nest]) -> bool:
    """Whether fused value u, computed in a reduction of a kernel and again in that kernel's output loops, can
    be stashed in the kernel's output instead of getting a buffer: the output has u's shape and dtype."""
    builders = {n.kernel for n in nests}
    if len(nests) != 2 or len(builders) != 1: return False
    b = builders.pop()
    return (b.root is not None and b.root.op not in _OWN_BUFFER and b.top in nests and b.root.shape == u.shape
            and b.root.dtype == u.dtype)


def _recomputed(plan: _Plan, realized: dict[UOp, int]) -> set[UOp]:
    """Fused values the last split computed in several places at a cost worth a buffer: a REDUCE in several
    kernels, or elementwise work in several loop nests that costs more than a buffer (cost.recompute_costs_more).

    When one such value feeds another, one buffer often serves both: the one computed in more places wins (a
    buffer for it makes the other cheap too), and between equals the upper one (the lower one is then computed
    once, in the upper one's kernel). Winners are chosen in rounds, each seeing the buffers chosen before it; a
    value below a winner waits for the next split, which computes it in fewer places."""
    places = {u: len({n.kernel for n in nests}) if u.op is Ops.REDUCE else len(nests)
              for u, nests in plan.computed_in.items()}
    # a value that one kernel of the split had to realize (it could not fuse there: a matmul feeding another
    # reduction) after earlier kernels computed it fused: it has a buffer anyway, so every kernel reads that (the
    # first layer's x @ w1 of an MLP was recomputed in the forward and in two backward kernels, 39 ms of 36 MFLOP)
    chosen = {u for u, k in places.items() if u in realized and u not in plan.keep and (
        u.op is Ops.REDUCE or recompute_costs_more(u, k + 1, set(realized) - {u}))}
    # a value's cost only falls as later rounds add buffers: one found cheap stays cheap, and one found costly
    # stays so while no new buffer is among the nodes its count walked
    cheap: set[UOp] = set()
    costly_walks: dict[UOp, set] = {}
    added: set[UOp] = set()
    while True:
        stop = {*realized, *chosen}
        below = set(_postorder_all([s for u in chosen for s in u.src], stop))
        costly = []
        for u, k in places.items():
            if k < 2 or u in cheap or u in stop or u in below: continue
            if u.op is Ops.REDUCE or ((walked := costly_walks.get(u)) is not None and walked.isdisjoint(added)):
                costly.append(u)
            elif recompute_costs_more(u, k, stop, walked := set()):
                costly.append(u)
                costly_walks[u] = walked
            else:
                cheap.add(u)
        losers = _losers(costly, places, stop)
        if not set(costly) - losers: return chosen
        added = {_narrowest(u, realized, plan.grid) for u in set(costly) - losers}
        chosen |= added


def _narrowest(u: UOp, realized: dict[UOp, int], narrow: bool) -> UOp:
    """The value to give a buffer for u: with `narrow` (grid devices), below exact widening casts (float16 ->
    float32, ...), the narrow source not yet realized (fewer bytes; the readers widen it again, exactly). A
    float16 matmul operand then stays float16 in memory, what tensor cores read. The CPU keeps the wide value: its
    matmul would widen each element of the operand again per multiply-add (gelu(x @ w1) @ w2 in bfloat16, 512 x
    1024 x 256: 8.9 ms wide, 10.6 ms narrow)."""
    while narrow and (u.op is Ops.CAST and u.dtype.is_float and u.src[0].dtype.is_float
           and u.src[0].dtype.itemsize < u.dtype.itemsize and u.src[0] not in realized):
        u = u.src[0]
    return u


class _Either:
    """`in` both sets, for postorder's stop argument (which it only looks into)."""
    def __init__(self, a: set, b: set): self.a, self.b = a, b
    def __contains__(self, u) -> bool: return u in self.a or u in self.b


def _losers(costly: list[UOp], places: dict[UOp, int], stop: set) -> set[UOp]:
    """Of each pair of `costly` nodes one above the other (not through `stop`), the one `_recomputed` does not
    choose: the upper one when the lower one is computed in more places, else the lower one. In one walk down and
    one up, each node carrying the most places of a costly node under it and over it (taking the pairs one by one
    was quadratic: a program of nested checkpointed blocks spent 20 s here)."""
    order = _postorder_all(costly, stop)
    own = {u: places[u] for u in costly}
    under: dict[UOp, int] = {}
    for n in order:
        under[n] = max((max(under[c], own.get(c, -1)) for c in n.src if c not in stop), default=-1)
    over = dict.fromkeys(order, -1)
    for n in reversed(order):
        top = max(over[n], own.get(n, -1))
        for c in n.src:
            if c not in stop and top > over[c]: over[c] = top
    return {u for u in costly if under[u] > places[u] or over[u] >= places[u]}


def _postorder_all(roots: list[UOp], stop: set) -> list[UOp]:
    """The nodes under any of `roots` not in `stop` nor below it, each after its sources, each once."""
    order: list[UOp] = []
    seen: set[UOp] = set()
    walked = _Either(stop, seen)
    for r in roots:
        found = postorder(r, lambda n: n.src, walked)
        seen.update(found)
        order += found
    return order


def rangeify(fn: UOp, grid: bool = False) -> Schedule:
    """Split FUNCTION `fn` (over PARAMs) into kernels; see the module docstring.

    Args:
      fn: a FUNCTION whose body is a TUPLE of outputs over PARAMs (after callify).
      grid: lower for a grid device (OpenCL, CUDA): widened 16-bit values are realized in their narrow type
        (`_narrowest`), and heavy matmul epilogues stay fused.
    Returns:
      the Schedule: kernels in run order, the buffers they use and the buffer of each output.

    Example: `rangeify(callify(fnx.make_graph(fnx.nn.softmax)(x).fn)).kernels` for a 2-d x is two kernels, each
    with its reduction fused in: exp(x - max) and its division by the row sums.
    """
    plan, built = _Plan(grid=grid), {}
    while True:
        schedule = _split(fn, plan, built)
        more = _recomputed(plan, schedule.realized)
        if not more: return _unkeep_cheap(fn, plan, schedule, built)
        stash = {u for u in more if u not in plan.stash and _stashable(u, plan.computed_in[u])}
        plan = _Plan(plan.keep | (more - stash), plan.stash | stash, grid, indices=plan.indices)


def _unkeep_cheap(fn: UOp, plan: _Plan, schedule: Schedule, built: dict) -> Schedule:
    """The split again without the kept values that have become cheap, when that split needs no more buffers.

    A value chosen in an early round, while its cone still held work that later rounds gave buffers of their own,
    can end up a subtraction between two loads: `x - mean` of a layernorm kept in a chain of them cost a kernel and
    a pass over memory per layer (the first four of eight layers took two kernels each, the last four one)."""
    realized = set(schedule.realized)
    cheap = {u for u in plan.keep if u.op is not Ops.REDUCE and element_flops(u, realized - {u}, CHEAP_FLOPS)
             <= CHEAP_FLOPS}
    if not cheap: return schedule
    trial_plan = _Plan(plan.keep - cheap, plan.stash, plan.grid, indices=plan.indices)
    trial = _split(fn, trial_plan, built)
    if _recomputed(trial_plan, trial.realized) or len(trial.kernels) >= len(schedule.kernels): return schedule
    return trial


def _check_params(params: list[UOp]) -> None:
    """Refuse a function whose PARAMs are not one trace's, one shape and dtype a slot: a PARAM of another trace
    left in by a transform would read this function's argument of its slot, whatever its shape (a crash, or a read
    past its end)."""
    tags = [p.arg.tag for p in params]
    own = max(set(tags), key=tags.count, default=())
    first: dict[int, UOp] = {}
    for p in params:
        other = first.setdefault(p.arg.slot, p)
        other = other if (other.shape, other.dtype) != (p.shape, p.dtype) else None
        if p.arg.tag != own or other is not None:
            raise RuntimeError(f"fnx internal error: argument {p.arg.slot} is read as {p.dtype}{list(p.shape)} by a "
                               f"PARAM of trace {p.arg.tag}" + (f" and as {other.dtype}{list(other.shape)}"
                                                                  if other is not None else "")
                               + f" (the function's PARAMs are trace {own}'s); please report it")


def _split(fn: UOp, plan: _Plan, built: dict | None = None) -> Schedule:
    """One kernel split of `fn`, realizing plan.keep besides what the split itself finds it must realize
    (`built`: kernels of earlier splits that may be reused, `_reused`)."""
    body = fn.src[0]
    params = sorted((u for u in body.graph if u.op is Ops.PARAM), key=lambda p: p.arg.slot)
    _check_params(params)
    nparams = max(len(fn.src) - 1, max((p.arg.slot for p in params), default=-1) + 1)
    buffers = [BufferSpec(dtypes.bool_, 0, "input", i) for i in range(nparams)]
    schedule = Schedule([], buffers, [])
    for p in params:
        buffers[p.arg.slot] = BufferSpec(p.dtype, p.size, "input", p.arg.slot)
        schedule.realized[p] = p.arg.slot
    pending = _must_realize(body, plan) + [o for o in body.src if o.op is not Ops.PARAM]
    done: set[UOp] = set()
    hints: dict[UOp, _Hint] = {}
    while pending:
        u = pending.pop(0)
        if u in done: continue
        if _is_control_output(u):
            if u not in schedule.realized:
                try:
                    schedule.kernels.append(_control_step(u.src[0], schedule))
                except _Realize as need:
                    pending[:0] = [need.node, u]
                    continue
            done.add(u)
            continue
        if u.op is Ops.COPY:
            if u not in schedule.realized:
                try:
                    schedule.kernels.append(_transfer_step(u, schedule))
                except _Realize as need:
                    pending[:0] = [need.node, u]
                    continue
            done.add(u)
            continue
        if u.op is Ops.RESHAPE and (u.src[0] in schedule.realized or u.src[0].op in _OWN_BUFFER):
            if u.src[0] not in schedule.realized:  # a reshape of a buffer is the same buffer: realize the base
                pending[:0] = [u.src[0], u]
                continue
            schedule.realized[u] = schedule.realized[u.src[0]]
            done.add(u)
            continue
        buf_id = len(buffers)
        buffers.append(BufferSpec(u.dtype, u.size, "intermediate", device=u.device))
        schedule.realized[u] = buf_id
        try:
            kernels = _kernel_for(u, buf_id, schedule, plan, built, hints)
        except _Realize as need:
            del schedule.realized[u]
            buffers.pop()
            pending[:0] = [_narrowest(need.node, schedule.realized, plan.grid), u]  # realize it first, then retry
            continue
        schedule.kernels.extend(kernels)
        done.add(u)
    for o in body.src:
        if o not in schedule.realized and o.op is Ops.PARAM: schedule.realized[o] = o.arg.slot
        buf_id = schedule.realized[o]
        schedule.outputs.append(buf_id)
        if buffers[buf_id].kind == "intermediate": buffers[buf_id].kind = "output"
    return schedule
