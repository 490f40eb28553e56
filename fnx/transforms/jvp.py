"""Forward-mode autodiff: jvp, linearize, jacfwd, hessian.

Walk the graph from the inputs to the outputs in topological order; every node's tangent comes from its
sources' tangents by its primitive's rule in `jvp_rules` (None is a symbolic zero and is never materialized):

    jvp_rules[Ops.MUL] = lambda u, (x, y), (tx, ty): tx * y + x * ty

Every rule has that one signature, `rule(u, primals, tangents)`, over the node's value sources (`u.operands`):
`primals` as Arrays and their `tangents` (None: zero). It returns the node's tangent (None: zero) or, for a call
or control node (CALL, COND, WHILE, SCAN), whose value is a tuple, a list with one tangent per output, which
the GETTUPLEs reading those outputs pick up. Only floating-point values carry tangents.
"""
from __future__ import annotations

import functools
import math
from typing import Any, Callable, Sequence

import numpy as np

import fnx.numpy as jnp
from fnx import lax, tree_util
from fnx.errors import UnsupportedError, at_user_line
from fnx.rewrite import substitute
from fnx.trace import Array, building, imag_part, inline, make_complex, real_part, trace
from fnx.transforms.common import (body_params, finish, float_argnums, graph, partial, product_of_others,
                                   tuple_valued)
from fnx.transforms.control_rules import cond_jvp, scan_jvp, while_jvp
from fnx.transforms.custom import refuse_closure
from fnx.transforms.grad import complex_inputs, jacrev
from fnx.transforms.shard_map import shard_map_jvp
from fnx.uop import Ops, UOp


def forward(outs: list[UOp], wrt: list[UOp], tangents: list[Array | None]) -> list[Array | None]:
    """Tangents of `outs` given tangents of `wrt` (None: zero). Builds graph; call inside `building()`."""
    tans: dict[UOp, Any] = {w: t for w, t in zip(wrt, tangents) if t is not None}
    for u in graph(outs):
        if u.op is Ops.CALL: refuse_closure(u, tans, "jvp")
        if u in tans or not any(s in tans for s in u.operands): continue
        if u.op is Ops.GETTUPLE:  # one output of a call or control node, whose rule gave a tangent per output
            t = tans[u.src[0]][u.arg]
            if t is not None: tans[u] = t
            continue
        if not u.dtype.is_inexact and not tuple_valued(u): continue
        rule = jvp_rules.get(u.op)
        if rule is None:
            raise UnsupportedError(at_user_line(f"jvp: no forward-mode rule for primitive {u.op.name}"))
        t = rule(u, [Array(s) for s in u.operands], [tans.get(s) for s in u.operands])
        if t is not None: tans[u] = t
    return [tans.get(o) for o in outs]


def call_jvp(call: UOp, primals: list[Array], tangents: list[Array | None]) -> list[Array | None]:
    """Tangents of a CALL's outputs: from the custom jvp, or the body's own derivative."""
    rule, body = call.arg, call.src[0]
    if rule.kind == "vjp":
        raise TypeError(at_user_line(f"can't apply forward-mode autodiff (jvp) to a custom_vjp function "
                                     f"({getattr(rule.fun, '__name__', 'function')}); use custom_jvp"))
    if rule.kind == "jvp":
        return rule.apply_jvp(primals, tangents)[1]
    if rule.kind == "shard_map": return shard_map_jvp(call, primals, tangents, forward)
    params = body_params(call)  # by slot; an argument the body never reads has none
    mapping = {p: primals[i].uop for i, p in params.items()}
    inner = forward(list(body.src), list(params.values()), [tangents[i] for i in params])
    return [Array(substitute(t.uop, mapping)) if t is not None else None for t in inner]


def jvp(fun: Callable, primals: Sequence[Any], tangents: Sequence[Any], has_aux: bool = False) -> tuple:
    """Evaluate `fun` at `primals` and its directional derivative along `tangents` (jax.jvp).

    Returns `(primals_out, tangents_out)` (plus `aux` with has_aux).

    Example:
      >>> fnx.jvp(jnp.sin, (0.0,), (1.0,))
      (Array(0., dtype=float32, weak_type=True), Array(1., dtype=float32))
    """
    primals, tangents = tuple(primals), tuple(tangents)
    if tree_util.tree_structure(primals) != tree_util.tree_structure(tangents):
        raise TypeError(at_user_line("jvp: primals and tangents must have the same pytree structure"))
    traced = trace(fun, primals, transform=True, kind=f"jvp of {getattr(fun, '__name__', 'a function')}")
    leaves = tree_util.tree_leaves(primals)
    t_leaves = tree_util.tree_leaves(tangents)
    for p, t in zip(leaves, t_leaves):
        if np.shape(p) != np.shape(t):
            raise TypeError(at_user_line(f"jvp: tangent of shape {np.shape(t)} for a primal of shape {np.shape(p)}"))
    params = list(traced.fn.src[1:])
    with building():
        t_arrays = [lax.convert_element_type(lax.to_array(t), p.dtype) if p.dtype.is_inexact else None
                    for t, p in zip(t_leaves, params)]
        body_outs = list(traced.body.src)
        touts = forward(body_outs, params, t_arrays)
        touts = [t if t is not None else lax.full(o.shape, 0, o.dtype) for t, o in zip(touts, body_outs)]
        values = inline(traced, body_outs + [t.uop for t in touts], leaves)
    n = len(body_outs)
    outs = [Array(u, w) for u, w in zip(values[:n], traced.out_weak)]
    tans = [Array(u) for u in values[n:]]
    out_tree = traced.out_tree
    if has_aux:
        out_tree, aux_tree = out_tree.children()
        k = out_tree.num_leaves
        aux = tree_util.tree_unflatten(aux_tree, outs[k:])
        return finish((tree_util.tree_unflatten(out_tree, outs[:k]), tree_util.tree_unflatten(out_tree, tans[:k]),
                       aux))
    return finish((tree_util.tree_unflatten(out_tree, outs), tree_util.tree_unflatten(out_tree, tans)))


def linearize(fun: Callable, *primals: Any) -> tuple:
    """`(fun(*primals), f_jvp)` where `f_jvp(*tangents)` is the jvp at `primals` (a linear function)."""
    out = fun(*primals)

    def f_jvp(*tangents):
        return jvp(fun, primals, tangents)[1]
    return out, f_jvp


def jacfwd(fun: Callable, argnums: int | Sequence[int] = 0, has_aux: bool = False, holomorphic: bool = False
           ) -> Callable:
    """The Jacobian of `fun` by forward mode: the jvp pushed along every input basis vector at once (vmap over the
    identity), as JAX does; shape out_shape + in_shape (pytrees nested like JAX). Integer inputs raise TypeError,
    as in JAX."""
    from fnx.transforms.vmap import vmap  # (vmap sits beside this module: both are transforms of traces)
    def wrapped(*args, **kwargs):
        nums = float_argnums(argnums, args, "jacfwd")
        diff = tuple(tree_util.tree_map(jnp.asarray, args[n]) for n in nums)
        if holomorphic: complex_inputs(diff, "jacfwd")
        elif any(leaf.dtype.kind == "c" for leaf in tree_util.tree_leaves(diff)):
            raise TypeError(at_user_line("jacfwd requires real-valued inputs (a floating dtype), but got a complex "
                                         "one. For holomorphic differentiation, pass holomorphic=True; for a "
                                         "non-holomorphic function of complex inputs, use jacrev"))
        partial_fun = partial(fun, args, kwargs, nums)
        in_leaves, in_tree = tree_util.tree_flatten(diff)
        shapes = [tuple(leaf.shape) for leaf in in_leaves]
        sizes = [int(math.prod(shape)) for shape in shapes]
        total = sum(sizes)
        bounds = np.cumsum([0] + sizes)
        eye = np.eye(total)
        basis = [jnp.asarray(eye[:, lo:hi].reshape((total,) + shape), dtype=leaf.dtype)
                 for lo, hi, shape, leaf in zip(bounds[:-1], bounds[1:], shapes, in_leaves)]

        def push(*tangents):
            res = jvp(partial_fun, diff, tuple(tree_util.tree_unflatten(in_tree, list(tangents))), has_aux=has_aux)
            return (res[0], res[1], res[2]) if has_aux else (res[0], res[1], None)
        out, tangents, aux = vmap(push, out_axes=(None, -1, None))(*basis)
        per_out = []
        for tangent in tree_util.tree_leaves(tangents):  # (..., total) -> one block per input leaf
            blocks = [jnp.reshape(tangent[..., lo:hi], tuple(tangent.shape[:-1]) + shape)
                      for lo, hi, shape in zip(bounds[:-1], bounds[1:], shapes)]
            tree = tree_util.tree_unflatten(in_tree, blocks)
            per_out.append(tree[0] if isinstance(argnums, int) else tree)
        jac = tree_util.tree_unflatten(tree_util.tree_structure(out), per_out)
        return (jac, aux) if has_aux else jac
    return wrapped


def hessian(fun: Callable, argnums: int | Sequence[int] = 0, has_aux: bool = False, holomorphic: bool = False
            ) -> Callable:
    """The Hessian of a scalar `fun`: jacfwd of jacrev."""
    return jacfwd(jacrev(fun, argnums, has_aux, holomorphic), argnums, has_aux, holomorphic)


# ---- helpers for the rules ----

def _zero_if_none(t: Array | None, like: Array) -> Array:
    return t if t is not None else lax.full(like.shape, 0, like.uop.dtype)


def _linear(build: Callable) -> Callable:
    """A rule for an op that is linear in its (single) float source: apply the same op to the tangent."""
    def rule(u, srcs, tans):
        return None if tans[0] is None else build(u, tans[0])
    return rule


def _same_op(u: UOp, t: Array) -> Array:
    return Array(UOp(u.op, t.uop.dtype, (t.uop,), u.arg))


def _sum(*parts: Array | None) -> Array | None:
    """The sum of the non-zero tangent parts (None when all are symbolic zeros)."""
    present = [p for p in parts if p is not None]
    if not present: return None
    total = present[0]
    for p in present[1:]: total = total + p
    return total


def _add(u, srcs, tans):
    return _sum(*tans)


def _mul(u, srcs, tans):
    (x, y), (tx, ty) = srcs, tans
    return _sum(tx * y if tx is not None else None, x * ty if ty is not None else None)


def _div(u, srcs, tans):
    (_, y), (tx, ty) = srcs, tans
    return _sum(tx / y if tx is not None else None, -(ty * Array(u) / y) if ty is not None else None)


def _max(u, srcs, tans):
    (x, y), (tx, ty) = srcs, [_zero_if_none(t, s) for t, s in zip(tans, srcs)]
    return jnp.where(x > y, tx, jnp.where(x < y, ty, (tx + ty) * 0.5))


def _mod(u, srcs, tans):
    (x, y), (tx, ty) = srcs, tans
    return _sum(tx, -(ty * lax.trunc(x / y)) if ty is not None else None)


def _unary(deriv: Callable) -> Callable:
    def rule(u, srcs, tans):
        return None if tans[0] is None else tans[0] * deriv(Array(u), srcs[0])
    return rule


def _where(u, srcs, tans):
    c, a, b = srcs
    if tans[1] is None and tans[2] is None: return None
    return lax.select(c, _zero_if_none(tans[1], a), _zero_if_none(tans[2], b))


def _cast(u, srcs, tans):
    return lax.convert_element_type(tans[0], u.dtype) if tans[0] is not None and srcs[0].uop.dtype.is_inexact else None


def _reduce(u, srcs, tans):
    op, axes = u.arg.op, u.arg.axes
    (x,), (t,) = srcs, tans
    if t is None: return None
    if op is Ops.ADD: return _same_op(u, t)
    if op is Ops.MAX:  # ties share the tangent, as in JAX
        hit = (x == lax.expand(Array(u), x.shape)).astype(t.dtype)
        return lax.reduce_sum(t * hit, axes, keepdims=True) / lax.reduce_sum(hit, axes, keepdims=True)
    return lax.reduce_sum(t * product_of_others(x, axes), axes, keepdims=True)


def _index(u, srcs, tans):
    return None if tans[0] is None else Array(UOp(Ops.INDEX, u.dtype, (tans[0].uop, srcs[1].uop), u.arg))


def _scatter(u, srcs, tans):
    axis, mode = u.arg.axis, u.arg.mode
    x, idx, upd = srcs
    if tans[0] is None and tans[2] is None: return None
    if mode not in ("set", "add"):
        raise UnsupportedError(at_user_line(f"jvp: no forward-mode rule for SCATTER with mode {mode!r}"))
    tx, tu = _zero_if_none(tans[0], x), _zero_if_none(tans[2], upd)
    return lax.scatter_axis(tx, idx, tu, axis, mode)


def _collective(u, srcs, tans):
    kind, name = u.arg.kind, u.arg.axis_name
    if kind == "axis_index" or tans[0] is None: return None
    if kind in ("psum", "all_gather", "psum_scatter", "ppermute", "all_to_all"):  # linear: the same on the tangent
        return Array(UOp(Ops.COLLECTIVE, u.dtype, (tans[0].uop,), u.arg))
    hit = (srcs[0] == Array(u)).astype(tans[0].dtype)  # pmax/pmin: the tangents of the extreme examples
    return lax.psum(tans[0] * hit, name) / lax.psum(hit, name)


LN2 = math.log(2.0)


# ---- the rule table: one rule per primitive, in the order of DESIGN.md §2 ----
jvp_rules: dict[Ops, Callable] = {}
for _op in (Ops.BUFFER, Ops.PARAM, Ops.CONST, Ops.IOTA): jvp_rules[_op] = lambda u, srcs, tans: None
for _op in (Ops.RESHAPE, Ops.PERMUTE, Ops.EXPAND, Ops.PAD, Ops.SHRINK, Ops.FLIP): jvp_rules[_op] = _linear(_same_op)
jvp_rules[Ops.INDEX] = _index
jvp_rules[Ops.REDUCE] = _reduce
jvp_rules[Ops.SCATTER] = _scatter
jvp_rules[Ops.RECIP] = _unary(lambda out, x: -(out * out))
jvp_rules[Ops.SQRT] = _unary(lambda out, x: 0.5 / out)
jvp_rules[Ops.EXP2] = _unary(lambda out, x: out * LN2)
jvp_rules[Ops.LOG2] = _unary(lambda out, x: 1.0 / (x * LN2))
jvp_rules[Ops.SIN] = _unary(lambda out, x: jnp.cos(x))
jvp_rules[Ops.TRUNC] = lambda u, srcs, tans: None
jvp_rules[Ops.CAST] = _cast
jvp_rules[Ops.BITCAST] = lambda u, srcs, tans: None
jvp_rules[Ops.ADD] = _add
jvp_rules[Ops.MUL] = _mul
jvp_rules[Ops.DIV] = _div
jvp_rules[Ops.MAX] = _max
jvp_rules[Ops.MOD] = _mod
for _op in (Ops.CMPLT, Ops.CMPNE, Ops.AND, Ops.OR, Ops.XOR, Ops.SHL, Ops.SHR): jvp_rules[_op] = lambda u, s, t: None
jvp_rules[Ops.WHERE] = _where
jvp_rules[Ops.COLLECTIVE] = _collective
jvp_rules[Ops.CALL] = call_jvp
jvp_rules[Ops.COND] = functools.partial(cond_jvp, forward=forward)  # control rules run `forward` on their bodies
jvp_rules[Ops.WHILE] = functools.partial(while_jvp, forward=forward)
jvp_rules[Ops.SCAN] = functools.partial(scan_jvp, forward=forward)
jvp_rules[Ops.REAL] = _linear(lambda u, t: real_part(t))
jvp_rules[Ops.IMAG] = _linear(lambda u, t: imag_part(t))
jvp_rules[Ops.COMPLEX] = lambda u, srcs, tans: None if tans[0] is None and tans[1] is None else make_complex(
    _zero_if_none(tans[0], srcs[0]), _zero_if_none(tans[1], srcs[1]))
jvp_rules[Ops.CONTIGUOUS] = _linear(_same_op)
jvp_rules[Ops.DETACH] = lambda u, srcs, tans: None
jvp_rules[Ops.COPY] = _linear(_same_op)
