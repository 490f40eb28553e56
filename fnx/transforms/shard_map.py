"""shard_map: write the program one device runs on its shard, with explicit collectives, as jax.shard_map.

    @functools.partial(fnx.shard_map, mesh=mesh, in_specs=(P("data"), P()), out_specs=P())
    def loss(x, w):                                   # x: this device's rows, w: all of w
        return fnx.lax.pmean(jnp.mean((x @ w) ** 2), "data")

The body is traced once, on the shard shapes, with the mesh axes bound as named axes (psum, all_gather,
ppermute, ... and axis_index work over them). The call is one CALL node whose arg is a `ShardMapRule`: its
operands and results are global arrays, its body is per-device. The partitioner (fnx.sharding.partition) inlines
the body on operands laid out by in_specs, so everything around it may be sharded too.

Its meaning is that of a vmap over the mesh axes: device k runs the body on block k of each split operand and on
the whole of each replicated one; a result split by out_specs is the concatenation of the devices' results, and a
replicated one is device 0's (check_vma checks it cannot differ). The transform rules follow from it:

- jvp: a shard_map of the body's jvp (the tangents split like their primals).
- vmap: a shard_map of the batched body (the batch axis is not split).
- vjp: a shard_map of the body's backward pass; the cotangent of a result replicated over a mesh axis enters on
  device 0 of that axis only (the result is device 0's), and the cotangent of an operand replicated over an axis
  is summed over it (the operand was handed to every device). psum's transpose stays psum, as under vmap, and
  the gradients equal JAX's.
"""
from __future__ import annotations

import contextlib
import functools
import math
from dataclasses import dataclass, field
from typing import Any, Callable

from fnx import dtypes, tree_util
from fnx.errors import at_user_line
from fnx.rewrite import substitute
from fnx.sharding.mesh import Mesh, current_mesh
from fnx.sharding.sharding import Dims, PartitionSpec, dims_spec, shard_shape, spec_dims
from fnx.trace import Array, building, fresh_tag, state, to_array, trace
from fnx.uop import CollectiveArg, GroupOp, Ops, ParamArg, UOp


@dataclass(eq=False)
class ShardMapRule:
    """The arg of a shard_map CALL: the mesh, the split of each operand and result, the results' global shapes,
    and the tag of the body's PARAMs."""
    mesh: Mesh
    in_dims: tuple[Dims, ...]
    out_dims: tuple[Dims, ...]
    out_shapes: tuple[tuple[int, ...], ...]
    tag: tuple = field(default=())
    name: str = "shard_map"
    kind: str = "shard_map"

    def __hash__(self) -> int: return id(self)

    def derived(self, in_dims, out_dims, out_shapes) -> ShardMapRule:
        return ShardMapRule(self.mesh, tuple(in_dims), tuple(out_dims), tuple(out_shapes), ("call", fresh_tag()),
                            self.name)

    def local_shape(self, shape: tuple[int, ...], dims: Dims) -> tuple[int, ...]:
        return shard_shape(self.mesh, dims, shape)


def _specs_per_leaf(specs: Any, tree: Any, what: str, fun_name: str) -> list:
    """The PartitionSpec of each leaf of `tree`, from `specs`, a pytree prefix of it (a spec covers a subtree)."""
    is_spec = lambda x: x is None or isinstance(x, PartitionSpec)  # noqa: E731
    spec_leaves, spec_tree = tree_util.tree_flatten(specs, is_leaf=is_spec)
    try:
        subtrees = spec_tree.flatten_up_to(tree)
    except ValueError as err:
        raise ValueError(at_user_line(f"shard_map of {fun_name}: {what} must be a pytree prefix of the "
                                      f"{'arguments' if what == 'in_specs' else 'results'}: {err}")) from None
    out = []
    for spec, sub in zip(spec_leaves, subtrees):
        if not isinstance(spec, PartitionSpec):
            raise TypeError(at_user_line(f"shard_map of {fun_name}: {what} entries must be PartitionSpecs, got "
                                         f"{spec!r}"))
        out.extend([spec] * len(tree_util.tree_leaves(sub)))
    return out


def _dims_for(mesh: Mesh, spec: PartitionSpec, shape: tuple[int, ...], what: str, fun_name: str) -> Dims:
    """The dims of `spec` for an array of `shape`, checked: names of mesh axes, used once, dividing the axis."""
    try:
        dims = spec_dims(spec, len(shape))
    except ValueError as err:
        raise ValueError(at_user_line(f"shard_map of {fun_name}: {what}: {err}")) from None
    used = [a for d in dims for a in d]
    for name in used:
        if name not in mesh.axis_names:
            raise ValueError(at_user_line(f"shard_map of {fun_name}: {what} has spec {spec!r} naming mesh axis "
                                          f"{name!r}, which the mesh {mesh} does not have"))
    if len(set(used)) != len(used):
        raise ValueError(at_user_line(f"shard_map of {fun_name}: {what} has spec {spec!r}, which uses a mesh axis "
                                      "twice"))
    for i, (size, axes) in enumerate(zip(shape, dims)):
        parts = math.prod(mesh.axis_size(a) for a in axes)
        if size % parts:
            raise ValueError(at_user_line(
                f"shard_map of {fun_name}: {what} has spec {spec!r} for an array of shape {shape}: its axis {i} "
                f"(size {size}) is split over mesh axes {axes} ({parts} devices), which does not divide it"))
    return dims


def _varying(body: UOp, in_dims: tuple[Dims, ...], tag: tuple) -> dict[UOp, frozenset]:
    """The mesh axes along which each value of the body can differ between devices (JAX's check_vma): an operand
    varies along the axes splitting it, axis_index along its axis; psum/pmax/pmin/all_gather make a value the same
    along their axis, ppermute/psum_scatter/all_to_all keep it varying."""
    out: dict[UOp, frozenset] = {}
    for u in body.toposort:
        if u.op is Ops.PARAM and u.arg.tag == tag:
            out[u] = frozenset(a for d in in_dims[u.arg.slot] for a in d)
        elif u.op is Ops.COLLECTIVE:
            name = u.arg.axis_name
            below = out.get(u.src[0], frozenset()) if u.src else frozenset()
            out[u] = below - {name} if u.arg.kind in ("psum", "pmax", "pmin", "all_gather") else below | {name}
        elif u.op is Ops.GETTUPLE or u.op is Ops.CALL or u.op in GroupOp.Control:
            out[u] = frozenset().union(*(out.get(s, frozenset()) for s in (u.operands if u.op is not Ops.GETTUPLE
                                                                             else u.src)))
        else:
            out[u] = frozenset().union(*(out.get(s, frozenset()) for s in u.src)) if u.src else frozenset()
    return out


def shard_map(f: Callable | None = None, /, *, out_specs: Any, in_specs: Any = None, mesh: Mesh | None = None,
              axis_names: Any = frozenset(), check_vma: bool = True, check_rep: bool | None = None) -> Callable:
    """Map `f` over shards of its arguments on the devices of `mesh`, as jax.shard_map.

    Args:
      f: the per-device function. Inside it, arrays have their shard's shape and collectives over the mesh axes
        (fnx.lax.psum, pmean, pmax, pmin, all_gather, psum_scatter, ppermute, all_to_all, axis_index) work.
      mesh: the devices (default: the mesh of an enclosing `with mesh:`).
      in_specs: a PartitionSpec per argument (a pytree prefix of the arguments): how each is split.
      out_specs: a PartitionSpec per result (a pytree prefix of the results): how the results are put together;
        a mesh axis a spec leaves out means the result is the same on every device along it.
      check_vma / check_rep: check that a result is the same along the mesh axes its out_spec leaves out (a
        ValueError when it cannot be, as in JAX).
      axis_names: accepted for JAX compatibility; every mesh axis is manual.

    Returns:
      A function of global arrays. Under jit it is part of the jitted computation; called eagerly it runs as one.

    Example:
      >>> mesh = fnx.make_mesh((4,), ("i",))
      >>> f = fnx.shard_map(lambda x: fnx.lax.psum(x, "i"), mesh=mesh, in_specs=P("i"), out_specs=P())
      >>> f(jnp.arange(8.0))     # [0+2+4+6, 1+3+5+7]
    """
    if f is None:
        return lambda g: shard_map(g, out_specs=out_specs, in_specs=in_specs, mesh=mesh, axis_names=axis_names,
                                   check_vma=check_vma, check_rep=check_rep)
    check = check_vma if check_rep is None else check_rep
    fun_name = getattr(f, "__name__", "a function")

    @functools.wraps(f)
    def mapped(*args):
        use = mesh if mesh is not None else current_mesh()
        if use is None:
            raise ValueError(at_user_line(f"shard_map of {fun_name}: no mesh: pass mesh= or call it inside "
                                          "`with mesh:`"))
        if in_specs is None:
            raise ValueError(at_user_line(f"shard_map of {fun_name}: in_specs is required"))
        if not state.depth:  # called eagerly: run as one jitted computation over the mesh
            from fnx.transforms.jit import jit  # (jit's sharded path runs shard_map; jit imports nothing of this)
            return jit(mapped)(*args)
        return _call(f, fun_name, use, args, in_specs, out_specs, check)
    return mapped


def _call(f: Callable, fun_name: str, mesh: Mesh, args: tuple, in_specs: Any, out_specs: Any, check: bool) -> Any:
    leaves, in_tree = tree_util.tree_flatten(args)
    arrays = [to_array(x) for x in leaves]
    specs = _specs_per_leaf(in_specs, args, "in_specs", fun_name)
    in_dims = tuple(_dims_for(mesh, s, a.shape, f"argument {i}", fun_name) for i, (s, a) in
                    enumerate(zip(specs, arrays)))
    tag = ("call", fresh_tag())
    local = [(shard_shape(mesh, d, a.shape), a.uop.dtype, a.weak_type) for d, a in zip(in_dims, arrays)]
    with _mesh_axes(mesh):
        traced = trace(lambda *xs: f(*xs), tree_util.tree_unflatten(in_tree, arrays), avals=local, transform=True,
                       tag=tag, abstract=True, kind=f"shard_map of {fun_name}")
    body, operands, in_dims = _close_over(traced.body, tag, [a.uop for a in arrays], in_dims)
    outs = list(body.src)
    out_struct = tree_util.tree_unflatten(traced.out_tree, list(range(len(outs))))
    out_spec_list = _specs_per_leaf(out_specs, out_struct, "out_specs", fun_name)
    out_dims = []
    for i, (o, spec) in enumerate(zip(outs, out_spec_list)):
        dims = spec_dims(spec, len(o.shape)) if len(spec) <= len(o.shape) else None
        if dims is None:
            raise ValueError(at_user_line(f"shard_map of {fun_name}: out_specs {spec!r} has more entries than result "
                                          f"{i} of shape {o.shape} has axes"))
        out_dims.append(dims)
    if check:
        varying = _varying(body, in_dims, tag)
        for i, (o, dims, spec) in enumerate(zip(outs, out_dims, out_spec_list)):
            loose = sorted(varying.get(o, frozenset()) - {a for d in dims for a in d})
            if loose:
                raise ValueError(at_user_line(
                    f"shard_map of {fun_name}: out_specs {spec!r} of result {i} (shard shape {o.shape}) says it is "
                    f"the same on every device along mesh axes {loose}, but it can differ along them (it is not "
                    f"reduced over them with psum/pmax/all_gather); split it over them in out_specs, or pass "
                    f"check_vma=False"))
    out_shapes = tuple(tuple(s * math.prod(mesh.axis_size(a) for a in d) for s, d in zip(o.shape, dims))
                       for o, dims in zip(outs, out_dims))
    rule = ShardMapRule(mesh, in_dims, tuple(out_dims), out_shapes, tag, fun_name)
    call = UOp(Ops.CALL, dtypes.bool_, (body, *operands), rule)
    results = [Array(UOp(Ops.GETTUPLE, o.dtype, (call,), i), w) for i, (o, w) in enumerate(zip(outs,
                                                                                             traced.out_weak))]
    return tree_util.tree_unflatten(traced.out_tree, results)


@contextlib.contextmanager
def _mesh_axes(mesh: Mesh):
    """The mesh's axes bound as named axes (what collectives in the body, and in its derivatives, read)."""
    previous = state.axis_sizes
    state.axis_sizes = {**previous, **dict(mesh.shape)}
    try:
        yield
    finally:
        state.axis_sizes = previous


def _close_over(body: UOp, tag: tuple, operands: list[UOp], in_dims: tuple) -> tuple[UOp, list[UOp], tuple]:
    """The body with the values it closed over (an enclosing trace's PARAMs, concrete arrays) made operands of
    their own, replicated (P()): every device computes with the whole value, as in JAX."""
    inner = {n.binds for n in body.toposort if n.binds is not None}  # (the PARAMs of nested bodies are theirs)
    free = [u for u in body.toposort if u.op is Ops.BUFFER or (u.op is Ops.PARAM and u.arg.tag != tag
                                                                and u.arg.tag not in inner)]
    if not free: return body, operands, in_dims
    start = len(operands)
    params = {u: UOp(Ops.PARAM, u.dtype, (), ParamArg(start + i, u.shape, None, tag)) for i, u in enumerate(free)}
    return substitute(body, params), operands + free, in_dims + tuple(((),) * len(u.shape) for u in free)


# ---- the transform rules (called by jvp, vmap and grad for a CALL whose rule is a ShardMapRule) ----

def _fresh(like: list[UOp], shapes: list[tuple[int, ...]], tag: tuple, start: int = 0) -> list[UOp]:
    return [UOp(Ops.PARAM, u.dtype, (), ParamArg(start + i, s, None, tag)) for i, (u, s) in enumerate(zip(like,
                                                                                                           shapes))]


def _rebound(call: UOp, tag: tuple) -> tuple[UOp, list[UOp]]:
    """The call's body over fresh PARAMs tagged `tag` (one per operand, at its shard shape), and those PARAMs."""
    rule, body = call.arg, call.src[0]
    shapes = [rule.local_shape(a.shape, d) for a, d in zip(call.operands, rule.in_dims)]
    fresh = _fresh(list(call.operands), shapes, tag)
    old = {p: fresh[p.arg.slot] for p in body.toposort if p.op is Ops.PARAM and p.arg.tag == rule.tag}
    return (substitute(body, old) if old else body), fresh


def _new_call(rule: ShardMapRule, tag: tuple, outs: list[UOp], operands: list[UOp], in_dims, out_dims,
              out_shapes) -> list[UOp]:
    new_rule = rule.derived(in_dims, out_dims, out_shapes)
    new_rule.tag = tag
    node = UOp(Ops.CALL, dtypes.bool_, (UOp(Ops.TUPLE, dtypes.bool_, tuple(outs)), *operands), new_rule)
    return [UOp(Ops.GETTUPLE, o.dtype, (node,), i) for i, o in enumerate(outs)]


def shard_map_jvp(call: UOp, primals: list[Array], tangents: list[Array | None], forward: Callable) -> list:
    """Tangents of the results: a shard_map of the body's jvp, the tangents split like their primals."""
    rule = call.arg
    tag = ("call", fresh_tag())
    body, fresh = _rebound(call, tag)
    have = [i for i, t in enumerate(tangents) if t is not None]
    t_params = _fresh([fresh[i] for i in have], [fresh[i].shape for i in have], tag, len(fresh))
    with building(), _mesh_axes(rule.mesh):
        inner = forward(list(body.src), [fresh[i] for i in have], [Array(t) for t in t_params])
    keep = [i for i, t in enumerate(inner) if t is not None]
    if not keep: return [None] * len(inner)
    operands = [p.uop for p in primals] + [tangents[i].uop for i in have]
    outs = _new_call(rule, tag, [inner[i].uop for i in keep], operands,
                     list(rule.in_dims) + [rule.in_dims[i] for i in have], [rule.out_dims[i] for i in keep],
                     [rule.out_shapes[i] for i in keep])
    result: list = [None] * len(inner)
    for i, o in zip(keep, outs): result[i] = Array(o)
    return result


def shard_map_vjp(cts: list[Array | None], call: UOp, operands: list[Array], backward: Callable) -> list:
    """Cotangents of the operands: a shard_map of the body's backward pass (see the module's docstring)."""
    rule, mesh = call.arg, call.arg.mesh
    tag = ("call", fresh_tag())
    body, fresh = _rebound(call, tag)
    outs = list(body.src)
    floats = [i for i, c in enumerate(cts) if c is not None]
    ct_params = _fresh([outs[i] for i in floats], [outs[i].shape for i in floats], tag, len(fresh))
    with building(), _mesh_axes(mesh):
        masked = {}
        for i, p in zip(floats, ct_params):
            ct = Array(p)
            for name in mesh.axis_names:
                if mesh.axis_size(name) > 1 and not any(name in d for d in rule.out_dims[i]):
                    ct = _on_first(ct, name, mesh.axis_size(name))
            masked[i] = ct
        grads = backward([outs[i] for i in floats], [masked[i] for i in floats], fresh)
        results = {}
        for j, g in enumerate(grads):
            if g is None or not fresh[j].dtype.is_inexact: continue
            for name in mesh.axis_names:
                if mesh.axis_size(name) > 1 and not any(name in d for d in rule.in_dims[j]):
                    g = Array(UOp(Ops.COLLECTIVE, g.uop.dtype, (g.uop,), CollectiveArg("psum", name,
                                                                                       mesh.axis_size(name), 0)))
            results[j] = g
    if not results: return [None] * len(fresh)
    order = sorted(results)
    ops = list(call.operands) + [cts[i].uop for i in floats]
    in_dims = list(rule.in_dims) + [rule.out_dims[i] for i in floats]
    news = _new_call(rule, tag, [results[j].uop for j in order], ops, in_dims, [rule.in_dims[j] for j in order],
                     [call.operands[j].shape for j in order])
    out: list = [None] * len(fresh)
    for j, o in zip(order, news): out[j] = Array(o)
    return out


def _on_first(ct: Array, name: str, size: int) -> Array:
    """`ct` on the device at index 0 of mesh axis `name`, zeros on the others."""
    index = UOp(Ops.COLLECTIVE, dtypes.int32, (), CollectiveArg("axis_index", name, size, 0))
    first = UOp(Ops.CMPNE, dtypes.bool_, (index, UOp.const(dtypes.int32, 0)))
    first = UOp(Ops.EXPAND, dtypes.bool_, (UOp(Ops.RESHAPE, dtypes.bool_, (first,), (1,) * ct.ndim),), ct.shape)
    zero = UOp.const(ct.uop.dtype, 0, ct.shape)
    return Array(UOp(Ops.WHERE, ct.uop.dtype, (first, zero, ct.uop)))


def batched_rule(rule: ShardMapRule, tag: tuple, size: int) -> ShardMapRule:
    """The rule of a shard_map whose operands and results all gained a leading batch axis of `size` (not split)."""
    new = rule.derived([((),) + d for d in rule.in_dims], [((),) + d for d in rule.out_dims],
                       [(size,) + s for s in rule.out_shapes])
    new.tag = tag
    return new


def is_shard_map(u: UOp) -> bool:
    return u.op is Ops.CALL and isinstance(u.arg, ShardMapRule)


__all__ = ["ShardMapRule", "dims_spec", "shard_map"]
