"""Autodiff and batching rules for the control-flow nodes (COND, WHILE, SCAN).

Each rule builds new bodies from the old ones and wraps them in a new node of the same kind:

- jvp: the body also carries tangents (its PARAMs gain tangent slots, its outputs gain tangent outputs).
- vjp: COND runs the vjp of the branch taken; SCAN saves the carry of every step in a forward scan, then runs
  the step's vjp in a reverse scan; WHILE has no reverse mode (the trip count is unknown), as in JAX.
- vmap: COND computes both branches and selects per example; SCAN and WHILE batch their bodies, and a WHILE
  whose predicate differs between examples runs until every example is done, freezing the finished ones.
"""
from __future__ import annotations

from typing import Callable

from fnx import dtypes
from fnx.errors import at_user_line
from fnx.rewrite import substitute
from fnx.trace import Array, fresh_tag
from fnx.uop import Ops, UOp

def next_tag() -> int:
    return fresh_tag()


def _params(node: UOp, body: UOp) -> dict[int, UOp]:
    tag = node.arg[0] if isinstance(node.arg, tuple) else node.arg
    return {p.arg[0]: p for p in body.toposort if p.op is Ops.PARAM and p.arg[3:] == (tag,)}


def _param(like: UOp, slot: int, tag: int, shape: tuple[int, ...] | None = None) -> UOp:
    return UOp(Ops.PARAM, like.dtype, (), (slot, like.shape if shape is None else shape, like.device, tag))


def _zeros(u: UOp) -> UOp:
    return UOp.const(u.dtype, 0, u.shape)


def _tuple(outs: list[UOp]) -> UOp:
    return UOp(Ops.TUPLE, dtypes.bool_, tuple(outs))


def _outputs(node: UOp, n: int) -> list[UOp]:
    body = node.src[0]
    return [UOp(Ops.GETTUPLE, body.src[i].dtype, (node,), i) for i in range(n)]


def _rebind(node: UOp, body: UOp, operands: list[UOp], slots: list[int], tag: int) -> tuple[list[UOp], list[UOp]]:
    """The body's outputs over fresh PARAMs: operand j becomes slot slots[j] of `tag`. Returns (outs, params)."""
    old = _params(node, body)
    new = [_param(o, s, tag) for o, s in zip(operands, slots)]
    mapping = {old[j]: new[j] for j in range(len(operands)) if j in old}
    root = substitute(body, mapping) if mapping else body
    return list(root.src), new


# ---- forward mode ----

def control_jvp(node: UOp, tangents: list[Array | None]) -> list[tuple[UOp, UOp | None]]:
    """(primal, tangent) per output of a control node, given tangents of its operands (node.operands order)."""
    from fnx.transforms.jvp import forward
    ops = list(node.operands)
    tag = fresh_tag()
    if node.op is Ops.COND:
        pred, values, tans = ops[0], ops[1:], tangents[1:]
        n, k = len(values), len(node.src[0].src)
        has_t = [t is not None and v.dtype.is_float for t, v in zip(tans, values)]
        t_ops = [t.uop for t, h in zip(tans, has_t) if h]

        def jvp_body(body: UOp) -> UOp:
            outs, params = _rebind(node, body, values, list(range(n)), tag)
            t_params = [_param(v, n + i, tag) for i, v in enumerate(v for v, h in zip(values, has_t) if h)]
            touts = forward(outs, [p for p, h in zip(params, has_t) if h], [Array(t) for t in t_params])
            return _tuple(outs + [t.uop if t is not None else _zeros(o) for t, o in zip(touts, outs)])
        new = UOp(Ops.COND, dtypes.bool_, (jvp_body(node.src[0]), jvp_body(node.src[1]), pred, *values, *t_ops), tag)
        outs = _outputs(new, 2 * k)
        return [(outs[i], outs[k + i]) for i in range(k)]
    if node.op is Ops.WHILE:
        n = len(ops)
        has_t = [v.dtype.is_float for v in ops]
        t_init = [t.uop if t is not None else _zeros(v) for t, v, h in zip(tangents, ops, has_t) if h]
        m = len(t_init)
        outs, params = _rebind(node, node.src[0], ops, list(range(n)), tag)
        t_params = [_param(v, n + i, tag) for i, v in enumerate(v for v, h in zip(ops, has_t) if h)]
        touts = forward(outs, [p for p, h in zip(params, has_t) if h], [Array(t) for t in t_params])
        t_outs = [t.uop if t is not None else _zeros(o) for t, o, h in zip(touts, outs, has_t) if h]
        cond_outs, _ = _rebind(node, node.src[1], ops, list(range(n)), tag)
        new = UOp(Ops.WHILE, dtypes.bool_, (_tuple(outs + t_outs), _tuple(cond_outs), *ops, *t_init), tag)
        res = _outputs(new, n + m)
        t_iter = iter(res[n:])
        return [(res[i], next(t_iter) if has_t[i] else None) for i in range(n)]
    return _scan_jvp(node, tangents, tag, forward)


def _scan_jvp(node: UOp, tangents: list, tag: int, forward: Callable) -> list:
    _, nc, length, reverse, nx = node.arg
    ops = list(node.operands)
    groups = [ops[:nc], ops[nc:nc + nx], ops[nc + nx:]]
    tgroups = [tangents[:nc], tangents[nc:nc + nx], tangents[nc + nx:]]
    # new operand layout: carry, tangent carry, xs, tangent xs, free, tangent free (tangents of floats only)
    t_of = [[(t.uop if t is not None else _zeros(v)) for t, v in zip(ts, vs) if v.dtype.is_float]
            for ts, vs in zip(tgroups, groups)]
    body = node.src[0]
    slot, primal_slots, tangent_slots = 0, [], []
    for vs, ts in zip(groups, t_of):
        primal_slots += list(range(slot, slot + len(vs)))
        slot += len(vs)
        tangent_slots.append(list(range(slot, slot + len(ts))))
        slot += len(ts)
    step_ops = ops[:nc] + [_slice_aval(x) for x in ops[nc:nc + nx]] + ops[nc + nx:]
    outs, params = _rebind(node, body, step_ops, primal_slots, tag)
    float_params = [p for p in params if p.dtype.is_float]
    step_t = [_slice_aval(t) if group == 1 else t for group, ts in enumerate(t_of) for t in ts]  # xs: one step
    t_params = [_param(t, s, tag) for t, s in zip(step_t, [s for group in tangent_slots for s in group])]
    touts = forward(outs, float_params, [Array(t) for t in t_params])
    touts = [t.uop if t is not None else _zeros(o) for t, o in zip(touts, outs)]
    c_float = [i for i in range(nc) if outs[i].dtype.is_float]
    new_body = _tuple(outs[:nc] + [touts[i] for i in c_float] + outs[nc:] + [t for t, o in zip(touts[nc:], outs[nc:])
                                                                          if o.dtype.is_float])
    new_ops = groups[0] + t_of[0] + groups[1] + t_of[1] + groups[2] + t_of[2]
    new = UOp(Ops.SCAN, dtypes.bool_, (new_body, *new_ops),
              (tag, nc + len(c_float), length, reverse, nx + len(t_of[1])))
    n_out = len(new_body.src)
    res = _outputs(new, n_out)
    carry, tcarry = res[:nc], iter(res[nc:nc + len(c_float)])
    ys = res[nc + len(c_float):]
    ny = len(outs) - nc
    y_primal, y_tan = ys[:ny], iter(ys[ny:])
    out = [(carry[i], next(tcarry) if i in c_float else None) for i in range(nc)]
    return out + [(y_primal[j], next(y_tan) if outs[nc + j].dtype.is_float else None) for j in range(ny)]


def _slice_aval(x: UOp) -> UOp:
    """A placeholder shaped like one step's slice of a scanned operand (only its shape and dtype are used)."""
    return UOp.const(x.dtype, 0, x.shape[1:])


# ---- reverse mode ----

def control_vjp(node: UOp, cts: list[Array | None]) -> list[Array | None]:
    """Cotangents of a control node's operands (node.operands order) given its outputs' cotangents."""
    from fnx.transforms.grad import backward
    ops = list(node.operands)
    tag = fresh_tag()
    if node.op is Ops.WHILE:
        raise TypeError(at_user_line("reverse-mode differentiation does not work for lax.while_loop (its trip count "
                                     "is not known in advance); use lax.scan or fori_loop with static bounds"))
    if node.op is Ops.COND:
        pred, values = ops[0], ops[1:]
        n = len(values)
        outs_ref = list(node.src[0].src)
        ct_ops = [c.uop if c is not None else _zeros(o) for c, o in zip(cts, outs_ref)]

        def vjp_body(body: UOp) -> UOp:
            outs, params = _rebind(node, body, values, list(range(n)), tag)
            ct_params = [_param(o, n + i, tag) for i, o in enumerate(outs)]
            grads = backward(outs, [Array(c) if o.dtype.is_float else None for c, o in zip(ct_params, outs)], params)
            return _tuple([g.uop if g is not None else _zeros(p) for g, p in zip(grads, params)])
        new = UOp(Ops.COND, dtypes.bool_, (vjp_body(node.src[0]), vjp_body(node.src[1]), pred, *values, *ct_ops), tag)
        grads = _outputs(new, n)
        return [None] + [Array(g) if v.dtype.is_float else None for g, v in zip(grads, values)]
    return _scan_vjp(node, cts, tag, backward)


def _scan_vjp(node: UOp, cts: list, tag: int, backward: Callable) -> list:
    _, nc, length, reverse, nx = node.arg
    ops = list(node.operands)
    carry, xs, free = ops[:nc], ops[nc:nc + nx], ops[nc + nx:]
    nf = len(free)
    body = node.src[0]
    ny = len(body.src) - nc
    # 1. a forward scan that also outputs each step's incoming carry (the residuals)
    ftag = fresh_tag()
    step_ops = carry + [_slice_aval(x) for x in xs] + free
    outs, params = _rebind(node, body, step_ops, list(range(len(step_ops))), ftag)
    saving = UOp(Ops.SCAN, dtypes.bool_, (_tuple(outs + params[:nc]), *ops), (ftag, nc, length, reverse, nx))
    saved = _outputs(saving, nc + ny + nc)[nc + ny:]
    # 2. a reverse scan of the step's vjp: carry (ct of the carry, accumulated ct of free values)
    ct_carry = [c.uop if c is not None else _zeros(o) for c, o in zip(cts[:nc], carry)]
    ct_ys = [c.uop if c is not None else UOp.const(o.dtype, 0, (length,) + o.shape) for c, o in zip(cts[nc:],
                                                                                                   body.src[nc:])]
    acc0 = [_zeros(f) for f in free]
    b_carry = ct_carry + acc0
    b_xs = saved + xs + ct_ys
    slot = iter(range(10**6))
    p_ct = [_param(c, next(slot), tag) for c in ct_carry]
    p_acc = [_param(a, next(slot), tag) for a in acc0]
    p_saved = [_param(_slice_aval(s), next(slot), tag) for s in saved]
    p_x = [_param(_slice_aval(x), next(slot), tag) for x in xs]
    p_cty = [_param(_slice_aval(c), next(slot), tag) for c in ct_ys]
    p_free = [_param(f, next(slot), tag) for f in free]
    step_outs, step_params = _rebind(node, body, p_saved + p_x + p_free, list(range(len(step_ops))), tag)
    mapping = {sp: p for sp, p in zip(step_params, p_saved + p_x + p_free)}
    step_outs = [substitute(o, mapping) for o in step_outs]
    out_cts = [Array(c) if o.dtype.is_float else None for c, o in zip(p_ct + p_cty, step_outs)]
    grads = backward(step_outs, out_cts, p_saved + p_x + p_free)
    g = [gr.uop if gr is not None else _zeros(p) for gr, p in zip(grads, p_saved + p_x + p_free)]
    g_carry, g_x, g_free = g[:nc], g[nc:nc + nx], g[nc + nx:]
    new_acc = [UOp(Ops.ADD, a.dtype, (a, gf)) if a.dtype.is_float else a for a, gf in zip(p_acc, g_free)]
    b_body = _tuple(g_carry + new_acc + g_x)
    back = UOp(Ops.SCAN, dtypes.bool_, (b_body, *b_carry, *b_xs, *free),
               (tag, nc + nf, length, not reverse, len(b_xs)))
    res = _outputs(back, nc + nf + nx)
    grads_carry, grads_free, grads_xs = res[:nc], res[nc:nc + nf], res[nc + nf:]
    wrap = lambda u, v: Array(u) if v.dtype.is_float else None  # noqa: E731
    return [wrap(u, v) for u, v in zip(grads_carry + grads_xs + grads_free, carry + xs + free)]

