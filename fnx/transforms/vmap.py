"""vmap: vectorize a function over a batch axis by rewriting its graph.

Trace the function once on one example, then rebuild the graph with a batch axis: every value carries it in
front (axis 0) or not at all (None), and each primitive's rule in `batch_rules` says how the op works on
batched operands:

    batch_rules[Ops.REDUCE] = lambda b, u: (UOp(Ops.REDUCE, .., (b.batched(u.src[0]),), ReduceArg(op, axes + 1)), 0)

Every rule has that one signature, `rule(b, u) -> (value, batch dim)`: it reads the batched sources from the
Batcher `b` (`b.values[s]`, or `b.batched(s)` with the batch axis in front) and returns the node's value with
its batch dimension (0, or None when it does not depend on the batch). A call or control node (CALL, COND,
WHILE, SCAN), whose value is a tuple, returns a list with one (value, batch dim) per output. A node none of
whose sources is batched is kept as it is without calling its rule, except a call or control node: its body
may read batched values, so its rule decides.

Elementwise ops broadcast their unbatched operands; movement ops shift their axes; gathers and scatters with
batched indices fold the batch into the indexed axis.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Callable

from fnx import dtypes, lax, tree_util
from fnx.errors import UnsupportedError, at_user_line
from fnx.trace import Array, building, fresh_tag, state, trace
from fnx.transforms.common import body_params, finish, graph, param, tuple_of, tuple_valued
from fnx.transforms.shard_map import batched_rule
from fnx.uop import ControlArg, GroupOp, IotaArg, Ops, ParamArg, ReduceArg, ScatterArg, UOp

Batched = tuple[UOp, "int | None"]   # (value, 0 if it has the batch axis in front else None)


def _permute(x: UOp, perm: tuple[int, ...]) -> UOp:
    return x if perm == tuple(range(len(perm))) else UOp(Ops.PERMUTE, x.dtype, (x,), perm)


def _reshape(x: UOp, shape: tuple[int, ...]) -> UOp:
    return x if tuple(shape) == x.shape else UOp(Ops.RESHAPE, x.dtype, (x,), tuple(shape))


def move_axis(x: UOp, source: int, destination: int) -> UOp:
    order = [i for i in range(x.ndim) if i != source]
    order.insert(destination, source)
    return _permute(x, tuple(order))


def broadcast_batch(x: UOp, size: int) -> UOp:
    """An unbatched value repeated `size` times along a new front axis."""
    if x.op is Ops.CONST: return UOp.const(x.dtype, x.arg.value, (size,) + x.shape)
    return UOp(Ops.EXPAND, x.dtype, (_reshape(x, (1,) + x.shape),), (size,) + x.shape)


class Batcher:
    """Rebuilds one traced body with a batch axis of `size`; `values` maps nodes to (value, batch dim)."""

    def __init__(self, size: int, values: dict[UOp, Batched], axis_name: str | None = None):
        self.size, self.values, self.axis_name = size, values, axis_name
        self.outputs: dict[UOp, list[Batched]] = {}  # call and control nodes -> (value, batch dim) per output

    def batched(self, u: UOp) -> UOp:
        """u's batched value with the batch axis in front (unbatched values are broadcast)."""
        value, bdim = self.values[u]
        return value if bdim is not None else broadcast_batch(value, self.size)

    def run(self, outs: list[UOp]) -> list[Batched]:
        for u in graph(outs):
            if u in self.values or tuple_valued(u): continue  # a call or control node: batched when read
            if u.op is Ops.GETTUPLE:
                if u.src[0] not in self.outputs: self.outputs[u.src[0]] = self.apply(u.src[0])
                self.values[u] = self.outputs[u.src[0]][u.arg]
                continue
            own = u.op is Ops.COLLECTIVE and u.arg.axis_name == self.axis_name  # a collective over this vmap's axis
            if not own and all(self.values[s][1] is None for s in u.src):  # nothing batched below: keep the node
                self.values[u] = (UOp(u.op, u.dtype, tuple(self.values[s][0] for s in u.src), u.arg), None)
                continue
            self.values[u] = self.apply(u)
        return [self.values[o] for o in outs]

    def apply(self, u: UOp) -> Batched | list[Batched]:
        """The batched value of `u` by its primitive's rule."""
        rule = batch_rules.get(u.op)
        if rule is None:
            raise UnsupportedError(at_user_line(f"vmap: no batching rule for primitive {u.op.name}"))
        return rule(self, u)


def _select(pred: UOp, a: UOp, b: UOp) -> UOp:
    """WHERE with a per-example (or scalar) predicate broadcast over the values' trailing axes."""
    if pred.shape != a.shape:
        lead = pred.shape + (1,) * (a.ndim - pred.ndim)
        pred = UOp(Ops.EXPAND, pred.dtype, (UOp(Ops.RESHAPE, pred.dtype, (pred,), lead),), a.shape) \
            if pred.shape else UOp(Ops.EXPAND, pred.dtype, (UOp(Ops.RESHAPE, pred.dtype, (pred,), (1,) * a.ndim),),
                                   a.shape) if a.ndim else pred
    return UOp(Ops.WHERE, a.dtype, (pred, a, b))


# ---- rules: each returns the node's value and its batch dimension ----

def _elementwise(b: Batcher, u: UOp) -> Batched:
    return UOp(u.op, u.dtype, tuple(b.batched(s) for s in u.src), u.arg), 0


def _movement(b: Batcher, u: UOp) -> Batched:
    x, n = b.batched(u.src[0]), b.size
    arg = {Ops.RESHAPE: lambda a: (n,) + tuple(a), Ops.EXPAND: lambda a: (n,) + tuple(a),
           Ops.PERMUTE: lambda a: (0,) + tuple(p + 1 for p in a), Ops.PAD: lambda a: ((0, 0),) + tuple(a),
           Ops.SHRINK: lambda a: ((0, n),) + tuple(a), Ops.FLIP: lambda a: (False,) + tuple(a)}[u.op](u.arg)
    return UOp(u.op, u.dtype, (x,), arg), 0


def _reduce(b: Batcher, u: UOp) -> Batched:
    arg = ReduceArg(u.arg.op, tuple(a + 1 for a in u.arg.axes))
    return UOp(Ops.REDUCE, u.dtype, (b.batched(u.src[0]),), arg), 0


def _marker(b: Batcher, u: UOp) -> Batched:
    return UOp(u.op, u.dtype, (b.batched(u.src[0]),), u.arg), 0


def _fold_batch(x: UOp, axis: int, n: int) -> UOp:
    """x of shape (B, pre..., n, post...) (indexed axis at 1 + axis) as (B * n, pre..., post...)."""
    moved = move_axis(x, 1 + axis, 1)
    return _reshape(moved, (moved.shape[0] * n,) + moved.shape[2:])


def _offset_indices(idx: UOp, n: int, drop_outside: bool) -> UOp:
    """Per-example indices into an axis of size n as indices into the batch-folded axis of size B * n."""
    index_t = idx.dtype if idx.dtype.itemsize >= 4 else dtypes.int32
    idx = idx.cast(index_t)
    batch = UOp(Ops.IOTA, index_t, (), IotaArg(idx.shape, 0)) * n
    if not drop_outside:  # gathers clamp per example, so clamp before offsetting
        idx = idx.alu(Ops.MAX, 0)
        idx = (idx < n).alu(Ops.WHERE, idx, n - 1)
        return idx + batch
    inside = (idx < 0).alu(Ops.CMPNE, True).alu(Ops.AND, idx < n)
    return inside.alu(Ops.WHERE, idx + batch, -1)


def _index(b: Batcher, u: UOp) -> Batched:
    (x, xb), (idx, ib) = b.values[u.src[0]], b.values[u.src[1]]
    axis = u.arg
    if ib is None:  # batched operand, shared indices: gather one axis further in
        return UOp(Ops.INDEX, u.dtype, (x, idx), axis + 1), 0
    if xb is None:  # shared operand, batched indices: the batch lands where the indices go, move it to the front
        out = UOp(Ops.INDEX, u.dtype, (x, idx), axis)
        return move_axis(out, axis, 0), 0
    n, k = x.shape[1 + axis], idx.ndim - 1
    flat = _fold_batch(x, axis, n)
    out = UOp(Ops.INDEX, u.dtype, (flat, _offset_indices(idx, n, False)), 0)  # (B, ks..., pre..., post...)
    order = [0] + list(range(1 + k, 1 + k + axis)) + list(range(1, 1 + k)) + list(range(1 + k + axis, out.ndim))
    return _permute(out, tuple(order)), 0


def _scatter(b: Batcher, u: UOp) -> Batched:
    axis, mode = u.arg.axis, u.arg.mode
    x, idx_u, upd_u = u.src
    idx, ib = b.values[idx_u]
    xb, ub = b.batched(x), b.batched(upd_u)
    if ib is None:
        return UOp(Ops.SCATTER, u.dtype, (xb, idx, ub), ScatterArg(axis + 1, mode)), 0
    n, k = x.shape[axis], idx.ndim - 1
    flat = _fold_batch(xb, axis, n)
    # updates (B, pre..., ks..., post...) -> (B, ks..., pre..., post...) to match the folded operand
    order = [0] + list(range(1 + axis, 1 + axis + k)) + list(range(1, 1 + axis)) + list(range(1 + axis + k, ub.ndim))
    upd = _permute(ub, tuple(order))
    upd = _reshape(upd, (b.size,) + upd.shape[1:])
    out = UOp(Ops.SCATTER, u.dtype, (flat, _offset_indices(idx, n, True), upd), ScatterArg(0, mode))
    unfolded = _reshape(out, (b.size, n) + flat.shape[1:])
    return move_axis(unfolded, 1, 1 + axis), 0


def _collective(b: Batcher, u: UOp) -> Batched:
    """A collective over this vmap's own axis reduces (or gathers) across the batch; over an enclosing vmap's
    axis it applies per example of this one."""
    return _own_collective(b, u) if u.arg.axis_name == b.axis_name else _other_collective(b, u)


def _own_collective(b: Batcher, u: UOp) -> Batched:
    """A collective over this vmap's axis: a reduction, gather or exchange across the batch."""
    kind, axis = u.arg.kind, u.arg.axis
    if kind == "axis_index": return (UOp(Ops.IOTA, dtypes.int32, (), IotaArg((b.size,), 0)), 0)
    x = b.batched(u.src[0])
    if kind == "all_gather": return (move_axis(x, 0, axis), None)
    if kind == "psum_scatter": return _psum_scatter(x, axis, b.size), 0
    if kind == "ppermute": return _ppermute(x, u.arg.perm, b.size), 0
    if kind == "all_to_all": return _all_to_all(x, u.arg.split_axis, axis, b.size), 0
    op = Ops.ADD if kind == "psum" else Ops.MAX
    flip = kind == "pmin"  # min = an order-reversing map, max, and the map back
    if flip: x = _order_reversed(x)
    out = UOp(Ops.RESHAPE, x.dtype, (UOp(Ops.REDUCE, x.dtype, (x,), ReduceArg(op, (0,))),), x.shape[1:])
    return (_order_reversed(out) if flip else out, None)


def _order_reversed(x: UOp) -> UOp:
    if x.dtype.is_float: return UOp(Ops.MUL, x.dtype, (x, UOp.const(x.dtype, -1.0, x.shape)))
    return UOp(Ops.XOR, x.dtype, (x, UOp.const(x.dtype, -1 if not x.dtype.is_bool else True, x.shape)))


def _psum_scatter(x: UOp, axis: int, n: int) -> UOp:
    """Example k's chunk k along `axis` of the sum over the batch: the sum's axis split in (n, chunk), n in front."""
    total = UOp(Ops.REDUCE, x.dtype, (x,), ReduceArg(Ops.ADD, (0,)))
    shape = x.shape[1:]
    return move_axis(_reshape(total, shape[:axis] + (n, shape[axis] // n) + shape[axis + 1:]), axis, 0)


def _ppermute(x: UOp, perm: tuple[tuple[int, int], ...], n: int) -> UOp:
    """Each destination example gathers its source's value; a zero example appended at index n serves the
    examples no pair sends to."""
    destination = UOp(Ops.IOTA, dtypes.int32, (), IotaArg((n,), 0))
    source = UOp.const(dtypes.int32, n, (n,))
    for src, dst in perm: source = destination.alu(Ops.CMPNE, dst).alu(Ops.WHERE, source, src)
    if len(perm) < n: x = UOp(Ops.PAD, x.dtype, (x,), ((0, 1),) + ((0, 0),) * (x.ndim - 1))
    return UOp(Ops.INDEX, x.dtype, (x, source), 0)


def _all_to_all(x: UOp, split_axis: int, concat_axis: int, n: int) -> UOp:
    """Example k gets chunk k (along split_axis) of every example j, concatenated in j's order along concat_axis:
    split the chunk index k out of split_axis, move it to the front and the batch index j in front of concat_axis,
    then merge j into concat_axis."""
    shape = x.shape[1:]
    split = _reshape(x, (n,) + shape[:split_axis] + (n, shape[split_axis] // n) + shape[split_axis + 1:])
    # the axes of `split`: the batch j at 0, example axis i at 1 + i, except that split_axis became the chunk
    # index k (at `chunk`) and the offset in the chunk (at chunk + 1), which pushes the later axes one further
    chunk = 1 + split_axis
    order = [chunk]
    for i in range(len(shape)):
        if i == concat_axis: order.append(0)
        order.append(chunk + 1 if i == split_axis else 1 + i + (i > split_axis))
    out = list(shape)
    out[split_axis] //= n
    out[concat_axis] *= n
    return _reshape(_permute(split, tuple(order)), (n,) + tuple(out))


def _other_collective(b: Batcher, u: UOp) -> Batched:
    """A collective over an enclosing vmap's axis: applied per example of this one (the batch stays in front, so
    the axes it names shift by one)."""
    arg = u.arg
    if arg.kind == "axis_index": return broadcast_batch(u, b.size), 0
    if arg.kind in ("all_gather", "psum_scatter", "all_to_all"): arg = arg._replace(axis=arg.axis + 1)
    if arg.kind == "all_to_all": arg = arg._replace(split_axis=arg.split_axis + 1)
    return UOp(Ops.COLLECTIVE, u.dtype, (b.batched(u.src[0]),), arg), 0


def _source(b: Batcher, u: UOp) -> Batched:
    raise AssertionError(f"{u.op.name} has no sources, so it is never batched")


# ---- calls: a call of the batched body ----

def _call(b: Batcher, call: UOp) -> list[Batched]:
    """A call with batched arguments (or a body closing over batched values) becomes a call of the batched
    body, with its custom rule batched too (vmap of the user's jvp, fwd and bwd); other calls are kept."""
    body, rule = call.src[0], call.arg
    args = [b.values[a] for a in call.src[1:]]
    closes = any(b.values.get(u, (None, None))[1] is not None for u in body.toposort if u not in call.src)
    if all(bdim is None for _, bdim in args) and not closes:
        kept = UOp(Ops.CALL, call.dtype, (body, *[v for v, _ in args]), rule)
        return [(UOp(Ops.GETTUPLE, o.dtype, (kept,), i), None) for i, o in enumerate(body.src)]
    tag = ("call", fresh_tag())
    batched = [b.batched(a) for a in call.src[1:]]
    params = body_params(call)
    # (a shard_map's body sees shards: its PARAMs keep their own shapes, with the batch axis in front)
    fresh = [UOp(Ops.PARAM, a.dtype, (), ParamArg(i, (b.size,) + params[i].shape if i in params else a.shape,
                                                  a.device, tag)) for i, a in enumerate(batched)]
    inner = Batcher(b.size, {**b.values, **{params[i]: (fresh[i], 0) for i in params}}, b.axis_name)
    outs = [v if bd is not None else broadcast_batch(v, b.size) for v, bd in inner.run(list(body.src))]
    new_rule = batched_rule(rule, tag, b.size) if rule.kind == "shard_map" else dataclasses.replace(
        rule, tag=tag, **_batched_rule(rule))
    new_call = UOp(Ops.CALL, call.dtype, (tuple_of(outs), *batched), new_rule)
    return [(UOp(Ops.GETTUPLE, o.dtype, (new_call,), i), 0) for i, o in enumerate(outs)]


def _batched_rule(rule) -> dict:
    """The user's rule functions of a custom call, mapped over a leading batch axis of every argument."""
    static_pos = dict(rule.static)

    def dynamic(full: tuple) -> list:
        return [a for i, a in enumerate(full) if i not in static_pos]
    out = {}
    if rule.jvp is not None:
        out["jvp"] = lambda *a: vmap(lambda p, t: rule.jvp(*a[:-2], p, t))(a[-2], a[-1])
    if rule.fwd is not None:
        out["fwd"] = lambda *full: vmap(lambda *d: rule.fwd(*rule.full_args(d)))(*dynamic(full))
        out["bwd"] = lambda *a: vmap(lambda r, c: rule.bwd(*a[:-2], r, c))(a[-2], a[-1])
    return out


# ---- control flow: new nodes whose bodies work on batched values ----

def _unbatched(b: Batcher, node: UOp) -> list[Batched] | None:
    """The outputs of a control node none of whose operands is batched: the node kept as it is. Else None."""
    ops = [b.values[s] for s in node.operands]
    if any(bd is not None for _, bd in ops): return None
    kept = UOp(node.op, node.dtype, node.src[:len(node.src) - len(node.operands)] + tuple(v for v, _ in ops),
               node.arg)
    return [(UOp(Ops.GETTUPLE, o.dtype, (kept,), i), None) for i, o in enumerate(node.src[0].src)]


def _cond(b: Batcher, node: UOp) -> list[Batched]:
    """Both branches on every example, then a per-example select."""
    if (kept := _unbatched(b, node)) is not None: return kept
    (pred, pbd), *values = [b.values[s] for s in node.operands]
    outs = []
    for body in node.src[:2]:
        params = body_params(node, body)
        inner = Batcher(b.size, {**b.values, **{params[i]: values[i] for i in params}}, b.axis_name)
        outs.append(inner.run(list(body.src)))
    result = []
    for (t, tb), (f, fb) in zip(*outs):
        if tb is None and fb is None and pbd is None:
            result.append((pred.alu(Ops.WHERE, t, f) if not t.shape else _select(pred, t, f), None))
            continue
        tv = t if tb is not None else broadcast_batch(t, b.size)
        fv = f if fb is not None else broadcast_batch(f, b.size)
        p = pred if pbd is not None else broadcast_batch(pred, b.size)
        result.append((_select(p, tv, fv), 0))
    return result


def _while(b: Batcher, node: UOp) -> list[Batched]:
    """Every carry batched; examples whose predicate turned false keep their carry."""
    if (kept := _unbatched(b, node)) is not None: return kept
    tag = fresh_tag()
    carries = [b.batched(s) for s in node.operands]
    params = body_params(node, node.src[0])
    new_params = [param(c, i, tag) for i, c in enumerate(carries)]
    mapping = {params[i]: (new_params[i], 0) for i in params}
    c_params = body_params(node, node.src[1])
    c_mapping = {c_params[i]: (new_params[i], 0) for i in c_params}
    outs = Batcher(b.size, {**b.values, **mapping}, b.axis_name).run(list(node.src[0].src))
    (pred, pbd), = Batcher(b.size, {**b.values, **c_mapping}, b.axis_name).run(list(node.src[1].src))
    new_carry = [v if bd is not None else broadcast_batch(v, b.size) for v, bd in outs]
    if pbd is not None:
        new_carry = [_select(pred, nv, p) for nv, p in zip(new_carry, new_params)]
        pred = UOp(Ops.RESHAPE, pred.dtype, (UOp(Ops.REDUCE, pred.dtype, (pred,), ReduceArg(Ops.MAX, (0,))),), ())
    new = UOp(Ops.WHILE, dtypes.bool_, (tuple_of(new_carry), tuple_of([pred]), *carries), ControlArg(tag))
    return [(UOp(Ops.GETTUPLE, c.dtype, (new,), i), 0) for i, c in enumerate(carries)]


def _scan(b: Batcher, node: UOp) -> list[Batched]:
    """The carry always batched, xs batched along their second axis (the first is the scanned one)."""
    if (kept := _unbatched(b, node)) is not None: return kept
    ops = [b.values[s] for s in node.operands]
    tag = fresh_tag()
    nc, nx = node.arg.ncarry, node.arg.nxs
    n = len(ops)
    batched_ops = [(b.batched(node.operands[i]) if i < nc else v if bd is None else
                    (move_axis(v, 0, 1) if i < nc + nx else v), i < nc or bd is not None)
                   for i, (v, bd) in enumerate(ops)]
    params = body_params(node)
    new_params, mapping = [], {}
    for i, ((v, batched), old) in enumerate(zip(batched_ops, [node.operands[j] for j in range(n)])):
        step_shape = v.shape[1:] if nc <= i < nc + nx else v.shape
        p = param(v, i, tag, step_shape)
        new_params.append(p)
        if i in params: mapping[params[i]] = (p, 0 if batched else None)
    outs = Batcher(b.size, {**b.values, **mapping}, b.axis_name).run(list(node.src[0].src))
    body = tuple_of([v if bd is not None else broadcast_batch(v, b.size) for v, bd in outs])
    new = UOp(Ops.SCAN, dtypes.bool_, (body, *[v for v, _ in batched_ops]), node.arg._replace(tag=tag))
    res = [UOp(Ops.GETTUPLE, o.dtype, (new,), i) for i, o in enumerate(body.src)]
    return [(r, 0) for r in res[:nc]] + [(move_axis(r, 1, 0), 0) for r in res[nc:]]


# ---- the rule table: one rule per primitive, in the order of DESIGN.md §2 ----
batch_rules: dict[Ops, Callable[[Batcher, UOp], Any]] = {}
for _op in (Ops.BUFFER, Ops.PARAM, Ops.CONST, Ops.IOTA): batch_rules[_op] = _source
for _op in GroupOp.Movement: batch_rules[_op] = _movement
batch_rules[Ops.INDEX] = _index
batch_rules[Ops.REDUCE] = _reduce
batch_rules[Ops.SCATTER] = _scatter
for _op in GroupOp.ALU | GroupOp.Complex: batch_rules[_op] = _elementwise
batch_rules[Ops.COLLECTIVE] = _collective
batch_rules[Ops.CALL] = _call
batch_rules[Ops.COND] = _cond
batch_rules[Ops.WHILE] = _while
batch_rules[Ops.SCAN] = _scan
for _op in GroupOp.Marker: batch_rules[_op] = _marker


# ---- the user-facing transform ----

def _broadcast_prefix(prefix: Any, tree: Any, name: str) -> list:
    """One entry of `prefix` (a pytree prefix of `tree`, or a single value) per leaf of `tree`."""
    if prefix is None or isinstance(prefix, int):
        return [prefix] * len(tree_util.tree_leaves(tree))
    try:
        return [p for p, sub in zip(*_prefix_pairs(prefix, tree)) for _ in tree_util.tree_leaves(sub)]
    except (ValueError, TypeError) as e:
        raise ValueError(at_user_line(f"vmap: {name} {prefix!r} does not match the arguments' structure: {e}")) \
            from None


def _prefix_pairs(prefix: Any, tree: Any) -> tuple[list, list]:
    treedef = tree_util.tree_structure(prefix, is_leaf=lambda v: v is None)
    subtrees = treedef.flatten_up_to(tree)
    return tree_util.tree_leaves(prefix, is_leaf=lambda v: v is None), subtrees


def mapped_axes(leaves: list, axes: list, name: str) -> tuple[list[int | None], list[tuple[int, int]]]:
    """Each leaf's mapped axis made non-negative (None: not mapped), and (leaf number, length) of each mapped one;
    a ValueError naming `name` (vmap, pmap) for an axis out of range."""
    norm, sizes = [], []
    for i, (leaf, ax) in enumerate(zip(leaves, axes)):
        shape = tuple(getattr(leaf, "shape", ()))
        if ax is None:
            norm.append(None)
            continue
        if not -len(shape) <= ax < len(shape):
            raise ValueError(at_user_line(f"{name}: in_axes {ax} is out of range for argument leaf {i} of shape "
                                          f"{shape}"))
        norm.append(ax % len(shape))
        sizes.append((i, shape[ax]))
    return norm, sizes


def vmap(fun: Callable, in_axes: Any = 0, out_axes: Any = 0, axis_name: str | None = None,
         axis_size: int | None = None) -> Callable:
    """Vectorize `fun` over an axis of its inputs (jax.vmap).

    Args:
      fun: a function of arrays (pytrees).
      in_axes: an int, None, or a pytree prefix of the arguments giving each input's batch axis (None: not
        batched, the same value for every example). Negative axes count from the end.
      out_axes: where the batch axis goes in the outputs (int or pytree prefix; None for outputs that do not
        depend on the batch).
      axis_size: the batch size when no input is batched.

    Example:
      >>> fnx.vmap(lambda x: x @ w)(xs)   # a matrix-vector product per row of xs
    """
    def wrapped(*args, **kwargs):
        if isinstance(in_axes, list): axes_spec = tuple(in_axes)
        else: axes_spec = in_axes
        if isinstance(axes_spec, tuple) and len(axes_spec) != len(args):
            raise ValueError(at_user_line(f"vmap: in_axes has {len(axes_spec)} entries for {len(args)} arguments"))
        leaves = tree_util.tree_leaves((args, kwargs))
        owner = [i for i, a in enumerate(args) for _ in tree_util.tree_leaves(a)]  # leaf -> argument (for errors)
        owner += [repr(k) for k, v in sorted(kwargs.items()) for _ in tree_util.tree_leaves(v)]
        # keyword arguments are always mapped over their axis 0, as in JAX (in_axes covers the positional ones)
        keyword_leaves = len(leaves) - len(tree_util.tree_leaves(args))
        axes = _broadcast_prefix(axes_spec, args, "in_axes") + [0] * keyword_leaves
        size = axis_size
        norm_axes, sizes = mapped_axes(leaves, axes, "vmap")
        found = {s for _, s in sizes}
        if len(found) > 1 or (size is not None and found and found != {size}):
            detail = ", ".join(f"argument {owner[i]} (leaf {i}) has size {s}" for i, s in sizes)
            raise ValueError(at_user_line(f"vmap got inconsistent sizes for the mapped axes: {detail}"
                                          + (f", axis_size={size}" if size is not None else "")))
        if size is None:
            if not found:
                raise ValueError(at_user_line("vmap needs at least one batched input (in_axes not all None) or "
                                              "axis_size"))
            size = found.pop()
        arrays = [lax.to_array(x) for x in leaves]
        examples = [Array(UOp.const(a.uop.dtype, 0, tuple(s for j, s in enumerate(a.shape) if j != ax)), a.weak_type)
                    if ax is not None else a for a, ax in zip(arrays, norm_axes)]
        treedef = tree_util.tree_structure((args, kwargs))
        previous = dict(state.axis_sizes)
        if axis_name is not None: state.axis_sizes[axis_name] = size
        try:
            traced = trace(lambda a, kw: fun(*a, **kw), tree_util.tree_unflatten(treedef, examples), transform=True,
                           abstract=True, kind=f"vmap of {getattr(fun, '__name__', 'a function')}")
        finally:
            state.axis_sizes = previous
        params = list(traced.fn.src[1:])
        values: dict[UOp, Batched] = {}
        for p, a, ax in zip(params, arrays, norm_axes):
            values[p] = (move_axis(a.uop, ax, 0), 0) if ax is not None else (a.uop, None)
        with building():
            results = Batcher(size, values, axis_name).run(list(traced.body.src))
            outs = _place_outputs(results, traced, size)
        return finish(tree_util.tree_unflatten(traced.out_tree, outs))

    def _place_outputs(results: list[Batched], traced, size: int) -> list[Array]:
        out_leaves_axes = _broadcast_prefix(out_axes, tree_util.tree_unflatten(traced.out_tree, [0] * len(results)),
                                            "out_axes")
        outs = []
        for (value, bdim), ax, weak in zip(results, out_leaves_axes, traced.out_weak):
            if ax is None:
                if bdim is not None:
                    raise ValueError(at_user_line("vmap: out_axes=None for an output that depends on the batch"))
                outs.append(Array(value, weak))
                continue
            batched = value if bdim is not None else broadcast_batch(value, size)
            if not -batched.ndim <= ax < batched.ndim:
                raise ValueError(at_user_line(f"vmap: out_axes {ax} is out of range for an output of rank "
                                              f"{batched.ndim - 1}"))
            outs.append(Array(move_axis(batched, 0, ax % batched.ndim), weak))
        return outs

    wrapped.__name__ = getattr(fun, "__name__", "vmapped")
    wrapped.__doc__ = getattr(fun, "__doc__", None)
    return wrapped
