"""The partitioner: a FUNCTION over global arrays, with a sharding per input, becomes the program each device runs
on its shards (SPMD), with the collectives that make the pieces add up to the global result.

Each node of the global body gets a local node and `dims` (per array axis, the mesh axes it is split over), as
the seed derives `axis` for multi-device values:

- elementwise ops take the split of their operands (an operand split otherwise is resharded to it);
- a reduction over a split axis reduces locally, then psum/pmax over the mesh axes of that axis;
- RESHAPE keeps the split of the leading axis of a group of axes (the others gathered), PERMUTE and EXPAND carry it;
- SCATTER keeps its operand's split: each device applies the updates that fall in its block;
- PAD/SHRINK/FLIP/INDEX along a split axis, and control flow, first gather what they need whole;
- a shard_map call is its body, inlined on operands resharded to its in_specs;
- COPY to a NamedSharding (`with_sharding_constraint`, device_put under jit) reshards.

Resharding gathers split axes (all_gather over the innermost mesh axis first) and slices replicated ones (each
device picks its block by axis_index; a broadcast or a constant is simply built at the local size).
"""
from __future__ import annotations

import math
import sys
from dataclasses import dataclass

from fnx import dtypes
from fnx.errors import UnsupportedError
from fnx.rewrite import substitute
from fnx.sharding.mesh import Mesh
from fnx.sharding.sharding import Dims, NamedSharding, check_dims, shard_shape
from fnx.uop import CollectiveArg, ConstArg, GroupOp, IotaArg, Ops, ParamArg, UOp


@dataclass
class Partitioned:
    """The per-device program of a global FUNCTION: `fn` takes and returns shards (its PARAMs have no device; its
    COLLECTIVE nodes run over `mesh` axes), laid out by `in_dims` and `out_dims`."""
    fn: UOp
    mesh: Mesh
    in_dims: list[Dims]
    out_dims: list[Dims]


def partition(fn: UOp, mesh: Mesh, in_dims: list[Dims], out_dims: list[Dims | None]) -> Partitioned:
    """Partition FUNCTION `fn` over `mesh` for inputs laid out by `in_dims`; outputs are laid out by `out_dims`
    where given, else as the propagation leaves them."""
    previous = sys.getrecursionlimit()
    sys.setrecursionlimit(max(previous, 20_000))  # (building a value locally recurses along its chain of sources)
    try:
        return _partition(fn, mesh, in_dims, out_dims)
    finally:
        sys.setrecursionlimit(previous)


def _partition(fn: UOp, mesh: Mesh, in_dims: list[Dims], out_dims: list[Dims | None]) -> Partitioned:
    part = _Partitioner(mesh)
    body = _inline_plain_calls(fn.src[0])
    params = {p.arg.slot: p for p in body.toposort if p.op is Ops.PARAM and p.arg.tag == ()}
    local_params = []
    for slot, (arg, dims) in enumerate(zip(fn.src[1:], in_dims)):  # (the arguments: PARAMs, or an eager op's BUFFERs)
        check_dims(mesh, dims, arg.shape, f"argument {slot}")
        local = UOp(Ops.PARAM, arg.dtype, (), ParamArg(slot, shard_shape(mesh, dims, arg.shape), None))
        if slot in params: part.values[params[slot]] = (local, dims)
        local_params.append(local)
    outs, final_dims = [], []
    for out, want in zip(body.src, out_dims):
        part.run(out)
        if want is not None: check_dims(mesh, want, out.shape, "out_shardings")
        dims = want if want is not None else part.values[out][1]
        outs.append(part.reshard(out, dims))
        final_dims.append(dims)
    local_fn = UOp(Ops.FUNCTION, fn.dtype, (UOp(Ops.TUPLE, dtypes.bool_, tuple(outs)), *local_params))
    return Partitioned(local_fn, mesh, list(in_dims), final_dims)


def _inline_plain_calls(body: UOp) -> UOp:
    """`body` with calls other than shard_map (custom_jvp/vjp, checkpoint, nested FUNCTIONs) inlined."""
    calls = [u for u in body.toposort if u.op is Ops.GETTUPLE and u.src[0].op in (Ops.FUNCTION, Ops.CALL)
             and getattr(u.src[0].arg, "kind", None) != "shard_map"]
    if not calls: return body
    mapping = {}
    for g in calls:
        call = g.src[0]
        inner, args, tag = call.src[0], call.src[1:], tuple(getattr(call.arg, "tag", ()))
        params = {p: args[p.arg.slot] for p in inner.toposort if p.op is Ops.PARAM and p.arg.tag == tag}
        mapping[g] = substitute(inner.src[g.arg], params)
    return _inline_plain_calls(substitute(body, mapping))


def _unsplit(dims: Dims, axes) -> Dims:
    return tuple(() if i in axes else d for i, d in enumerate(dims))


class _Partitioner:
    def __init__(self, mesh: Mesh):
        self.mesh = mesh
        self.values: dict[UOp, tuple[UOp, Dims]] = {}
        self._resharded: dict[tuple[UOp, Dims], UOp] = {}

    def size(self, names) -> int:
        return math.prod(self.mesh.axis_size(a) for a in names)

    def local_shape(self, shape, dims: Dims) -> tuple[int, ...]:
        return shard_shape(self.mesh, dims, shape)

    # ---- the walk ----
    def run(self, root: UOp) -> None:
        for u in root.graph:
            if u not in self.values: self.values[u] = self.node(u)

    def node(self, u: UOp) -> tuple[UOp, Dims]:
        op = u.op
        replicated = ((),) * len(u.shape) if u.shape is not None else ()
        if op in (Ops.CONST, Ops.IOTA): return u, replicated
        if op is Ops.PARAM:
            raise UnsupportedError(f"a sharded computation reads PARAM {u.arg} of an enclosing body")
        if op in GroupOp.ALU or op in GroupOp.Complex: return self.elementwise(u)
        if op is Ops.REDUCE: return self.reduce(u)
        if op is Ops.RESHAPE: return self.reshape(u)
        if op is Ops.PERMUTE:
            x, dims = self.values[u.src[0]]
            return UOp(op, u.dtype, (x,), u.arg), tuple(dims[i] for i in u.arg)
        if op is Ops.EXPAND:
            x, dims = self.values[u.src[0]]
            return UOp(op, u.dtype, (x,), self.local_shape(u.arg, dims)), dims
        if op in (Ops.PAD, Ops.SHRINK, Ops.FLIP): return self.window(u)
        if op is Ops.INDEX: return self.index(u)
        if op is Ops.SCATTER: return self.scatter(u)
        if op in (Ops.CONTIGUOUS, Ops.DETACH):
            x, dims = self.values[u.src[0]]
            return UOp(op, u.dtype, (x,), u.arg), dims
        if op is Ops.COPY:
            if not isinstance(u.arg, NamedSharding):
                raise UnsupportedError(f"a sharded computation copies a value to device {u.arg}: under jit over "
                                       "sharded arrays, device_put takes a NamedSharding")
            if u.arg.mesh != self.mesh:
                raise UnsupportedError(f"a sharding constraint over {u.arg.mesh} inside a computation over {self.mesh}")
            dims = u.arg.check(u.shape, "with_sharding_constraint")
            return self.reshard(u.src[0], dims), dims
        if op is Ops.CALL or op in GroupOp.Control: return self.call(u), ()  # (read by its GETTUPLEs)
        if op is Ops.GETTUPLE: return self.values[u.src[0]][0][u.arg]
        if op is Ops.COLLECTIVE:
            raise UnsupportedError(f"a collective over axis {u.arg.axis_name!r} outside shard_map and vmap")
        raise UnsupportedError(f"the partitioner has no rule for {op.name}")

    # ---- rules ----
    def elementwise(self, u: UOp) -> tuple[UOp, Dims]:
        dims, used = [], set()
        for axis in range(len(u.shape)):
            pick: tuple = ()
            for s in u.src:
                cand = self.values[s][1][axis]
                if cand and not used & set(cand): pick = cand; break  # noqa: E702
            used |= set(pick)
            dims.append(pick)
        dims = tuple(dims)
        return UOp(u.op, u.dtype, tuple(self.reshard(s, dims) for s in u.src), u.arg), dims

    def reduce(self, u: UOp) -> tuple[UOp, Dims]:
        x, dims = self.values[u.src[0]]
        axes = u.arg.axes
        if u.arg.op is Ops.MUL and any(dims[a] for a in axes):  # no product collective: gather first
            dims = _unsplit(dims, axes)
            x = self.reshard(u.src[0], dims)
        out = UOp(Ops.REDUCE, u.dtype, (x,), u.arg)
        kind = "psum" if u.arg.op is Ops.ADD else "pmax"
        for a in axes:
            for name in dims[a]:
                out = UOp(Ops.COLLECTIVE, u.dtype, (out,), CollectiveArg(kind, name, self.mesh.axis_size(name), 0))
        return out, _unsplit(dims, axes)

    def reshape(self, u: UOp) -> tuple[UOp, Dims]:
        src = u.src[0]
        _, dims = self.values[src]
        keep, out_dims = _reshape_dims(src.shape, u.shape, dims, self.size)
        x = self.reshard(src, keep)
        return UOp(Ops.RESHAPE, u.dtype, (x,), self.local_shape(u.shape, out_dims)), out_dims

    def window(self, u: UOp) -> tuple[UOp, Dims]:
        x_global = u.src[0]
        _, dims = self.values[x_global]
        trivial = {Ops.PAD: lambda a, s: a == (0, 0), Ops.SHRINK: lambda a, s: a == (0, s),
                   Ops.FLIP: lambda a, s: not a}[u.op]
        touched = [i for i, (a, s) in enumerate(zip(u.arg, x_global.shape)) if not trivial(a, s)]
        dims = _unsplit(dims, touched)
        x = self.reshard(x_global, dims)
        local = self.local_shape(x_global.shape, dims)
        arg = tuple(a if not d else {Ops.PAD: (0, 0), Ops.SHRINK: (0, n), Ops.FLIP: False}[u.op]
                    for a, d, n in zip(u.arg, dims, local))
        return UOp(u.op, u.dtype, (x,), arg), dims

    def index(self, u: UOp) -> tuple[UOp, Dims]:
        x_global, idx_global, axis = u.src[0], u.src[1], u.arg
        x_dims = _unsplit(self.values[x_global][1], (axis,))
        used = {a for d in x_dims for a in d}
        idx_dims = tuple(d if not used & set(d) else () for d in self.values[idx_global][1])
        out = UOp(Ops.INDEX, u.dtype, (self.reshard(x_global, x_dims), self.reshard(idx_global, idx_dims)), axis)
        return out, x_dims[:axis] + idx_dims + x_dims[axis + 1:]

    def scatter(self, u: UOp) -> tuple[UOp, Dims]:
        """The operand keeps its split, along the scattered axis too: each device combines the updates whose index
        falls in its block, at the index less the block's start, and the others fall out of its range, which
        SCATTER drops (as XLA's partitioner does; gathering the axis first left `x.at[i].set(v)` of a sharded
        array replicated on every device). The indices and the updates along that axis are replicated."""
        x_global, idx_global, upd_global = u.src
        axis = u.arg.axis
        x_dims = self.values[x_global][1]
        upd_dims = x_dims[:axis] + ((),) * idx_global.ndim + x_dims[axis + 1:]
        idx = self.reshard(idx_global, ((),) * idx_global.ndim)
        if x_dims[axis]:
            local = self.local_shape(x_global.shape, x_dims)[axis]
            back = (self._block(x_dims[axis]) * -local).cast(idx.dtype)  # (minus the block's start)
            back = UOp(Ops.EXPAND, idx.dtype, (UOp(Ops.RESHAPE, idx.dtype, (back,), (1,) * idx.ndim),), idx.shape)
            idx = UOp(Ops.ADD, idx.dtype, (idx, back))
        srcs = (self.reshard(x_global, x_dims), idx, self.reshard(upd_global, upd_dims))
        return UOp(Ops.SCATTER, u.dtype, srcs, u.arg), x_dims

    def call(self, node: UOp) -> list[tuple[UOp, Dims]]:
        """A shard_map call inlined (its body on operands resharded to its in_specs), or a control node run
        whole on every device."""
        if node.op is Ops.CALL and getattr(node.arg, "kind", None) == "shard_map":
            rule = node.arg
            if rule.mesh != self.mesh:
                raise UnsupportedError(f"shard_map over {rule.mesh} inside a computation sharded over {self.mesh}: "
                                       "one jitted computation runs over one mesh")
            args = [self.reshard(a, dims) for a, dims in zip(node.operands, rule.in_dims)]
            body = node.src[0]
            params = {p: args[p.arg.slot] for p in body.toposort if p.op is Ops.PARAM and p.arg.tag == rule.tag}
            return [(o, dims) for o, dims in zip(substitute(body, params).src, rule.out_dims)]
        if node.op in GroupOp.Control:
            if any(u.op is Ops.CALL and getattr(u.arg, "kind", None) == "shard_map" for u in node.toposort):
                raise UnsupportedError(f"shard_map inside {node.op.name.lower()} under a sharded jit is not "
                                       "supported: call the loop inside the shard_map body instead")
            operands = node.operands
            bodies = node.src[:len(node.src) - len(operands)]
            whole = UOp(node.op, node.dtype, bodies + tuple(self.reshard(s, ((),) * len(s.shape)) for s in operands),
                        node.arg)
            outs = [UOp(Ops.GETTUPLE, o.dtype, (whole,), i) for i, o in enumerate(node.src[0].src)]
            return [(o, ((),) * len(o.shape)) for o in outs]
        raise UnsupportedError(f"the partitioner has no rule for {node.op.name}")

    # ---- resharding ----
    def reshard(self, u: UOp, to: Dims) -> UOp:
        """The local value of global node `u` laid out by `to`."""
        x, have = self.values[u]
        if have == to: return x
        key = (u, to)
        if (done := self._resharded.get(key)) is not None: return done
        free = self._built_local(u, to) if not any(have[i] for i, d in enumerate(to) if d != have[i]) else None
        if free is None:
            kept = []
            for axis, (h, t) in enumerate(zip(have, to)):  # every gather before any slice: a gather along a mesh
                names = list(h)                             # axis must see equal blocks of the other array axes
                while names and tuple(names) != tuple(t[:len(names)]):  # the innermost mesh axes first
                    name = names.pop()
                    size = self.mesh.axis_size(name)
                    stacked = UOp(Ops.COLLECTIVE, x.dtype, (x,), CollectiveArg("all_gather", name, size, axis))
                    shape = x.shape[:axis] + (size * x.shape[axis],) + x.shape[axis + 1:]
                    x = UOp(Ops.RESHAPE, x.dtype, (stacked,), shape)
                kept.append(len(names))
            for axis, (t, k) in enumerate(zip(to, kept)):
                if len(t) > k: x = self._slice(x, axis, t[k:])
            free = x
        self._resharded[key] = free
        return free

    def _block(self, names: tuple[str, ...]) -> UOp:
        """This device's place (int32) among the blocks of an axis split over mesh axes `names`, the first major."""
        block = None
        for name in names:
            index = UOp(Ops.COLLECTIVE, dtypes.int32, (), CollectiveArg("axis_index", name, self.mesh.axis_size(name),
                                                                        0))
            block = index if block is None else block * self.mesh.axis_size(name) + index
        return block

    def _slice(self, x: UOp, axis: int, names: tuple[str, ...]) -> UOp:
        """This device's block of local axis `axis` when it is further split over mesh axes `names`."""
        local = x.shape[axis] // self.size(names)
        block = self._block(names)
        start = UOp(Ops.EXPAND, dtypes.int32, (UOp(Ops.RESHAPE, dtypes.int32, (block * local,), (1,)),), (local,))
        positions = UOp(Ops.ADD, dtypes.int32, (UOp(Ops.IOTA, dtypes.int32, (), IotaArg((local,), 0)), start))
        return UOp(Ops.INDEX, x.dtype, (x, positions), axis)

    def _local_of(self, u: UOp, to: Dims) -> UOp | None:
        """The local value of `u` laid out by `to` when no communication is needed: its own when it already is,
        else built at the local size from replicated values (None when it cannot be)."""
        x, have = self.values[u]
        if have == to: return x
        if any(have): return None
        key = (u, to)
        if (done := self._resharded.get(key)) is not None: return done
        built = self._built_local(u, to)
        if built is not None: self._resharded[key] = built
        return built

    def _built_local(self, u: UOp, to: Dims) -> UOp | None:
        """Replicated `u` computed again at the local size of `to`, from its sources built so in turn: a constant,
        an iota along an unsplit axis, a broadcast, and elementwise work, reshapes, permutes and reductions over
        other axes of such values. A value that only replicated inputs reach (the backward pass's broadcast of
        a loss's cotangent, say) is then computed on each device's part, not whole and sliced."""
        shape, op = self.local_shape(u.shape, to), u.op
        if op is Ops.CONST: return UOp(Ops.CONST, u.dtype, (), ConstArg(u.arg.value, shape))
        if op is Ops.IOTA: return UOp(Ops.IOTA, u.dtype, (), IotaArg(shape, u.arg.axis)) if not to[u.arg.axis] else None
        if op in GroupOp.ALU or op in GroupOp.Complex:
            srcs = [self._local_of(s, to) for s in u.src]
            return None if any(x is None for x in srcs) else UOp(op, u.dtype, tuple(srcs), u.arg)
        src = u.src[0] if u.src else None
        if op is Ops.EXPAND:
            src_to = tuple(t if src.shape[i] != 1 or u.shape[i] == 1 else () for i, t in enumerate(to))
            if any(src.shape[i] == 1 and u.shape[i] != 1 for i, t in enumerate(to) if t) or src_to == to:
                x = self._local_of(src, src_to)
                return UOp(op, u.dtype, (x if x is not None else self.reshard(src, src_to),), shape)
            return None
        if op is Ops.RESHAPE:
            kept, src_to = _reshape_dims(u.shape, src.shape, to, self.size)
            x = self._local_of(src, src_to) if kept == to else None
            return None if x is None else UOp(op, u.dtype, (x,), shape)
        if op is Ops.PERMUTE:
            src_to = [()] * len(to)
            for i, axis in enumerate(u.arg): src_to[axis] = to[i]
            x = self._local_of(src, tuple(src_to))
            return None if x is None else UOp(op, u.dtype, (x,), u.arg)
        if op is Ops.REDUCE and not any(to[a] for a in u.arg.axes):
            x = self._local_of(src, to)
            return None if x is None else UOp(op, u.dtype, (x,), u.arg)
        return None


def _reshape_dims(src: tuple[int, ...], out: tuple[int, ...], dims: Dims, size) -> tuple[Dims, Dims]:
    """(the split the source must have, the split of the result) for a RESHAPE from `src` to `out`: within each
    group of axes with equal products, a split stays only on the group's leading non-1 axis (the group's other
    axes are gathered), and only when the result's leading non-1 axis of the group divides by it."""
    if 0 in src or 0 in out: return ((),) * len(src), ((),) * len(out)
    keep, result = [()] * len(src), [()] * len(out)
    i = j = 0
    while i < len(src) or j < len(out):
        ii, jj, ps, po = [], [], 1, 1
        if i < len(src): ii.append(i); ps *= src[i]; i += 1  # noqa: E702
        if j < len(out): jj.append(j); po *= out[j]; j += 1  # noqa: E702
        while ps != po:
            if ps < po: ii.append(i); ps *= src[i]; i += 1  # noqa: E702
            else: jj.append(j); po *= out[j]; j += 1  # noqa: E702
        lead_in = next((k for k in ii if src[k] != 1), None)
        lead_out = next((k for k in jj if out[k] != 1), None)
        split = [k for k in ii if dims[k]]  # (the other axes' splits are gathered: the leading one's stays a block)
        if split and split[0] == lead_in and lead_out is not None and out[lead_out] % size(dims[lead_in]) == 0:
            keep[lead_in] = result[lead_out] = dims[lead_in]
    return tuple(keep), tuple(result)
