"""Running a partitioned program: every device runs the same compiled stages on its own shards, and the
collectives between stages move data between the devices.

The per-device program (fnx.sharding.partition) is cut at its collectives: stage k holds the nodes that come after
k collectives on their longest path from the inputs. A call runs stage 0 on every device (each on its own stream,
so the devices work at once), then the collectives whose operands are ready (fnx.sharding.collectives: one
compiled multi-device executable per group), then stage 1, and so on. Each stage is one FUNCTION whose PARAMs
carry no device, compiled once per device; `axis_index` is an input holding the device's mesh coordinate.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from fnx import dtypes
from fnx import trace as trace_module
from fnx import tree_util
from fnx.backends.device import Buffer, LRUCache, get_device
from fnx.errors import UnsupportedError
from fnx.rewrite import substitute
from fnx.sharding import collectives
from fnx.sharding.mesh import Mesh
from fnx.sharding.partition import Partitioned, partition
from fnx.sharding.sharding import (Dims, NamedSharding, PartitionSpec, ShardedBuffer, as_named, dims_spec,
                                   shard_host_value)
from fnx.trace import Array
from fnx.uop import BufferArg, GroupOp, Ops, ParamArg, UOp, postorder


@dataclass
class Stage:
    """One FUNCTION every device runs: its PARAMs read `inputs`, its outputs are `outputs` (nodes of the program)."""
    fn: UOp
    inputs: list[UOp]
    outputs: list[UOp]
    collectives: list[UOp] = field(default_factory=list)  # run after this stage, in order


class SPMDProgram:
    """A partitioned program, cut into stages, runnable on ShardedBuffers."""

    def __init__(self, part: Partitioned, shapes: list[tuple[int, ...]]):
        self.mesh, self.part, self.out_shapes = part.mesh, part, shapes
        body = part.fn.src[0]
        for node in body.graph:
            if node.op in GroupOp.Control or node.op is Ops.CALL:
                bodies = node.src[:len(node.src) - len(node.operands)]
                inner = [u for b in bodies for u in b.toposort if u.op is Ops.COLLECTIVE]
                if inner:
                    raise UnsupportedError(f"a collective ({inner[0].arg.kind} over {inner[0].arg.axis_name!r}) inside "
                                           f"{node.op.name.lower()} in a sharded computation is not supported yet: "
                                           "unroll the loop, or move the collective out of it")
        self.params = list(part.fn.src[1:])
        body = _bucketed(body)
        self.stages = _stages(body)
        self.outputs = list(body.src)
        self.devices = [d.name for d in self.mesh.local_devices]
        self.axis_index = [u for u in body.graph if u.op is Ops.COLLECTIVE and u.arg.kind == "axis_index"]

    def __call__(self, inputs: list[ShardedBuffer]) -> list[ShardedBuffer]:
        env: dict[UOp, dict[str, Buffer]] = {p: inputs[p.arg.slot].shards for p in self.params}
        for u in self.axis_index:
            env[u] = {d: _index_buffer(self.mesh, d, u.arg.axis_name) for d in self.devices}
        for stage in self.stages:
            if stage.outputs:
                results = {}
                several = len(self.devices) > 1  # (then each device's stage goes to its own queue: they run at once)
                for d in self.devices:
                    exe = get_device(d).compile(stage.fn)
                    args = [env[x][d] for x in stage.inputs]
                    results[d] = exe.call_async(args) if several else exe(args)
                for i, o in enumerate(stage.outputs):
                    env[o] = {d: results[d][i] for d in self.devices}
            for c in stage.collectives:
                x = c.src[0]
                groups = [[g.name for g in group] for group in self.mesh.groups(c.arg.axis_name)]
                env[c] = collectives.run(c.arg, x.shape, x.dtype, groups, env[x])
        out = []
        for o, dims, shape in zip(self.outputs, self.part.out_dims, self.out_shapes):
            sharding = NamedSharding(self.mesh, dims_spec(dims))
            out.append(ShardedBuffer(sharding, dims, shape, o.dtype, env[o]))
        return out


_index_buffers: dict = {}


def _index_buffer(mesh: Mesh, device: str, axis: str) -> Buffer:
    key = (mesh, device, axis)
    if (buf := _index_buffers.get(key)) is None:
        coord = mesh.coords(get_device(device))[axis]
        buf = _index_buffers[key] = get_device(device).allocator.from_numpy(np.array(coord, np.int32))
    return buf


def _depths(body: UOp) -> dict[UOp, int | None]:
    """Each node's number of collectives on its longest path from the inputs (None: it reads no input; a collective
    always has a depth, 0 when its operand reads no input)."""
    depth: dict[UOp, int | None] = {}
    for u in body.graph:
        if u.op is Ops.TUPLE: continue
        if u.op is Ops.PARAM or (u.op is Ops.COLLECTIVE and u.arg.kind == "axis_index"):
            depth[u] = 0
            continue
        levels = [depth[s] + (s.op is Ops.COLLECTIVE and s.arg.kind != "axis_index")
                  for s in u.operands if depth.get(s) is not None]
        if not levels and u.op is Ops.COLLECTIVE:  # of a constant (a backward pass's ones): it runs after stage 0,
            levels = [0]  # so what reads it is at depth 1 (reading no input, it floated into stage 0: a KeyError)
        depth[u] = max(levels) if levels else None
    return depth


BUCKETED = ("psum", "pmax", "pmin")


def _bucketed(body: UOp) -> UOp:
    """`body` with the reductions that run at the same point, of one kind, mesh axis and dtype, done as one: their
    operands flattened and joined, one collective, and each result a view of its part (what data-parallel
    training needs: one allreduce of all gradients instead of one per parameter)."""
    depth = _depths(body)
    buckets: dict[tuple, list[UOp]] = {}
    for u in body.graph:
        if u.op is Ops.COLLECTIVE and u.arg.kind in BUCKETED:
            buckets.setdefault((depth[u], u.arg.kind, u.arg.axis_name, u.dtype), []).append(u)
    mapping = {}
    for members in buckets.values():
        if len(members) < 2: continue
        total = sum(c.size for c in members)
        parts, offset = [], 0
        for c in members:
            flat = UOp(Ops.RESHAPE, c.dtype, (c.src[0],), (c.size,))
            parts.append(UOp(Ops.PAD, c.dtype, (flat,), ((offset, total - offset - c.size),)))
            offset += c.size
        joined = parts[0]
        for p in parts[1:]: joined = UOp(Ops.ADD if not joined.dtype.is_bool else Ops.OR, joined.dtype, (joined, p))
        reduced = UOp(Ops.COLLECTIVE, joined.dtype, (joined,), members[0].arg)
        offset = 0
        for c in members:
            piece = UOp(Ops.SHRINK, c.dtype, (reduced,), ((offset, offset + c.size),))
            mapping[c] = UOp(Ops.RESHAPE, c.dtype, (piece,), c.shape)
            offset += c.size
    return substitute(body, mapping) if mapping else body


def _stages(body: UOp) -> list[Stage]:
    """Cut `body` at its collectives (see the module's docstring). A node's home is the stage of its depth; nodes
    that depend on no input (constants and what is built from them) and movement ops (views: a broadcast of a
    weight that the backward pass reuses would otherwise cross a stage boundary as a materialized array) have no
    home: each stage that reads them recomputes them from their sources."""
    order = body.graph
    depth = _depths(body)
    external = lambda u: u.op is Ops.PARAM or u.op is Ops.COLLECTIVE  # noqa: E731  (values a stage reads)
    floats = lambda u: depth[u] is None or u.op in GroupOp.Movement  # noqa: E731  (recomputed where read)
    count = 1 + max((d for u, d in depth.items() if d is not None), default=0)
    needed: list[dict[UOp, None]] = [dict() for _ in range(count)]  # per stage: values others read, in order

    def producers(u: UOp) -> list[UOp]:
        """The nodes with a home that `u` reads, looking through the floating nodes in between."""
        found = postorder(u, lambda v: v.operands if v is u or (not external(v) and floats(v)) else ())
        return [v for v in found if v is not u and not external(v) and not floats(v)]

    for u in order:
        if u.op is Ops.TUPLE or external(u) or floats(u): continue
        for v in producers(u):
            if depth[v] != depth[u]: needed[depth[v]][v] = None
    materialized = [c.src[0] for c in order if c.op is Ops.COLLECTIVE and c.src] + list(body.src)
    for x in materialized:  # a collective's operand and the results are computed whole by some stage
        if not external(x): needed[depth[x] if depth[x] is not None else 0][x] = None
    stages = []
    for k in range(count):
        outputs = list(needed[k])
        inside = lambda u, k=k: not external(u) and (floats(u) or depth[u] == k)  # noqa: E731
        frontier = postorder(UOp(Ops.TUPLE, dtypes.bool_, tuple(outputs)),
                             lambda u: u.operands if u.op is Ops.TUPLE or inside(u) else ())
        inputs = [u for u in frontier if u.op is not Ops.TUPLE and not inside(u)]
        params = {x: UOp(Ops.PARAM, x.dtype, (), ParamArg(i, x.shape, None)) for i, x in enumerate(inputs)}
        tuple_out = UOp(Ops.TUPLE, dtypes.bool_, tuple(outputs))
        fn = UOp(Ops.FUNCTION, dtypes.bool_, (substitute(tuple_out, params) if params else tuple_out,
                                              *params.values()))
        stages.append(Stage(fn, inputs, outputs))
    for u in order:
        if u.op is Ops.COLLECTIVE and u.arg.kind != "axis_index":
            stages[depth[u] if depth[u] is not None else 0].collectives.append(u)
    return stages


# ---- jit and eager ops over sharded arrays ----

def mesh_of(shardings: list, calls: list = ()) -> Mesh | None:
    """The one mesh of the given NamedShardings and shard_map rules (ValueError naming two that differ)."""
    found = None
    for item in [*shardings, *calls]:
        mesh = item.mesh
        if found is not None and mesh != found:
            raise ValueError(f"one computation uses two meshes, {found} and {mesh}: put its arrays on one mesh")
        found = mesh
    return found


def to_sharded(x, mesh: Mesh, dims: Dims, dtype) -> ShardedBuffer:
    """Argument `x` (an Array, sharded or not, or a host value) as a ShardedBuffer laid out by `dims` on `mesh`."""
    buffer = getattr(x, "_buffer", None)
    if buffer is not None and buffer.is_sharded and buffer.mesh == mesh and buffer.dims == dims: return buffer
    value = np.asarray(x, dtype=dtype.np) if not hasattr(x, "_buffer") else np.asarray(x)
    return shard_host_value(np.asarray(value), NamedSharding(mesh, dims_spec(dims)), "jit")


_programs = LRUCache(256)


def program_for(fn: UOp, mesh: Mesh, in_dims: list[Dims], out_dims: list) -> SPMDProgram:
    key = (fn, mesh, tuple(in_dims), tuple(out_dims))
    if (found := _programs.get(key)) is None:
        found = _programs.put(key, SPMDProgram(partition(fn, mesh, in_dims, out_dims),
                                               [o.shape for o in fn.src[0].src]))
    return found


def run_eager(fn: UOp, buffers: list) -> list[UOp]:
    """An eager op whose operands include sharded arrays: partitioned like a jitted function, run, and its
    results as BUFFER UOps over ShardedBuffers."""
    mesh = mesh_of([b.sharding for b in buffers if b.is_sharded], has_shard_map(fn))
    in_dims = [b.dims if b.is_sharded else ((),) * len(p.shape) for b, p in zip(buffers, fn.src[1:])]
    program = program_for(fn, mesh, in_dims, [None] * len(fn.src[0].src))
    inputs = [b if b.is_sharded else to_sharded(Array.from_buffer(b, p.shape), mesh, d, p.dtype)
              for b, p, d in zip(buffers, fn.src[1:], in_dims)]
    return [UOp(Ops.BUFFER, o.dtype, (), BufferArg(b, o.shape)) for o, b in zip(fn.src[0].src, program(inputs))]


trace_module.sharded_runner[0] = run_eager


@dataclass
class Layout:
    """Where a jitted call's arguments live on a mesh: `in_dims` per argument leaf (then per closed-over array)."""
    mesh: Mesh
    in_dims: list[Dims]
    key: tuple

    @property
    def device(self) -> str:  # where the call is traced: a device of this process (under fnx.distributed)
        return (self.mesh.local_devices or self.mesh.flat_devices)[0].name


def _is_sharding_leaf(x) -> bool:
    return x is None or isinstance(x, (NamedSharding, PartitionSpec))


def _per_leaf(shardings, tree, what: str) -> list:
    """A sharding (or None) per leaf of `tree`, from `shardings`, a pytree prefix of it."""
    spec_leaves, spec_tree = tree_util.tree_flatten(shardings, is_leaf=_is_sharding_leaf)
    try:
        subtrees = spec_tree.flatten_up_to(tree)
    except ValueError as err:
        raise ValueError(f"jit: {what} must be a pytree prefix of the arguments' structure: {err}") from None
    out = []
    for s, sub in zip(spec_leaves, subtrees):
        out.extend([as_named(s, f"jit {what}") if s is not None else None] * len(tree_util.tree_leaves(sub)))
    return out


def layout(leaves: list, dynamic: tuple, n_kwarg_leaves: int, in_shardings) -> Layout | None:
    """The mesh layout of a jitted call, or None when no argument is sharded and no in_shardings are given."""
    given = _per_leaf(in_shardings, dynamic, "in_shardings") if in_shardings is not None else []
    given += [None] * (len(leaves) - len(given))
    own = [x._buffer.sharding if isinstance(x, Array) and x._buffer is not None and x._buffer.is_sharded else None
           for x in leaves]
    chosen = [g if g is not None else o for g, o in zip(given, own)]
    if not any(chosen): return None
    mesh = mesh_of([s for s in chosen if s is not None])
    in_dims = []
    for i, (x, s) in enumerate(zip(leaves, chosen)):
        shape = tuple(np.shape(x)) if not isinstance(x, Array) else x.shape
        in_dims.append(s.check(shape, f"jit argument {i}") if s is not None else ((),) * len(shape))
    return Layout(mesh, in_dims, ("mesh", mesh, tuple(in_dims)))


def has_shard_map(fn: UOp) -> list:
    return [u.arg for u in fn.toposort if u.op is Ops.CALL and getattr(u.arg, "kind", None) == "shard_map"]


class ShardedLowered:
    """A jitted function over a mesh: the traced global FUNCTION and its partitioned per-device program."""
    sharded = True
    fast = None

    def __init__(self, traced, mesh: Mesh, in_dims: list[Dims], out_shardings):
        self.traced, self.mesh = traced, mesh
        consts = [c.arg.buffer for c in traced.consts]
        self.consts = consts
        const_dims = [b.dims if b.is_sharded else ((),) * len(c.shape) for b, c in zip(consts, traced.consts)]
        mesh_of([b.sharding for b in consts if b.is_sharded] + [NamedSharding(mesh)])
        self.in_dims = list(in_dims) + const_dims
        outs = list(traced.body.src)
        want = [None] * len(outs)
        if out_shardings is not None:
            struct = tree_util.tree_unflatten(traced.out_tree, list(range(len(outs))))
            want = [s.check(o.shape, "jit out_shardings") if s is not None else None
                    for s, o in zip(_per_leaf(out_shardings, struct, "out_shardings"), outs)]
        self.program = program_for(traced.fn, mesh, self.in_dims, want)
        self.params = traced.fn.src[1:]
        self.out_avals = [(o.shape, weak) for o, weak in zip(outs, traced.out_weak)]

    def call(self, leaves: list):
        inputs = [to_sharded(x, self.mesh, d, p.dtype) for x, d, p in zip(leaves, self.in_dims, self.params)]
        inputs += [to_sharded(Array.from_buffer(b, c.shape), self.mesh, d, c.dtype)
                   for b, c, d in zip(self.consts, self.params[len(leaves):], self.in_dims[len(leaves):])]
        outs = self.program(inputs)
        arrays = [Array.from_buffer(b, shape, weak) for b, (shape, weak) in zip(outs, self.out_avals)]
        return tree_util.tree_unflatten(self.traced.out_tree, arrays)

    def as_text(self, stage: str | None = None) -> str:
        from fnx.debug.printing import format_function
        graph = format_function(self.traced.fn)
        if stage == "graph": return graph
        local = format_function(self.program.part.fn)
        return f"{graph}\n\n--- per device, over {self.mesh} ---\n{local}"

    def compile(self) -> ShardedCompiled:
        return ShardedCompiled(self)


@dataclass
class ShardedCompiled:
    """`jit(f).lower(*args).compile()` over a mesh: call it with the (non-static) arguments it was lowered for."""
    lowered: ShardedLowered

    def __call__(self, *args, **kwargs):
        leaves, tree = tree_util.tree_flatten((args, kwargs))
        if tree != self.lowered.traced.in_tree:
            raise TypeError(f"compiled function: called with arguments of structure {tree}, but it was compiled for "
                            f"{self.lowered.traced.in_tree}")
        return self.lowered.call(leaves)

    def as_text(self, stage: str | None = None) -> str:
        return self.lowered.as_text(stage)
