"""Forward- and reverse-mode rules for the control-flow nodes (COND, WHILE, SCAN).

Each rule builds new bodies from the old ones and wraps them in a new node of the same kind:

- jvp: the body also carries tangents (its PARAMs gain tangent slots, its outputs gain tangent outputs).
- vjp: COND runs the vjp of the branch taken; SCAN saves the carry of every step in a forward scan, then runs
  the step's vjp in a reverse scan; WHILE has no reverse mode (the trip count is unknown), as in JAX.

The rules have their tables' signatures, plus the interpreter they apply to a body: `forward` (jvp.py) or
`backward` (grad.py), which the table passes in when it registers them, so this module imports no transform:

    jvp_rules[Ops.SCAN] = functools.partial(scan_jvp, forward=forward)      # (u, primals, tangents) -> per output
    vjp_rules[Ops.SCAN] = functools.partial(scan_vjp, backward=backward)    # (cts, u, *operands) -> per operand

vmap's batching rules for these nodes are in vmap.py, with the others.
"""
from __future__ import annotations

from typing import Callable

from fnx import dtypes
from fnx.errors import at_user_line
from fnx.rewrite import substitute
from fnx.trace import Array, fresh_tag
from fnx.transforms.common import body_params, param, tuple_of
from fnx.uop import ControlArg, Ops, ScanArg, UOp


def _zeros(u: UOp) -> UOp:
    return UOp.const(u.dtype, 0, u.shape)


def _outputs(node: UOp, n: int) -> list[UOp]:
    body = node.src[0]
    return [UOp(Ops.GETTUPLE, body.src[i].dtype, (node,), i) for i in range(n)]


def _rebind(node: UOp, body: UOp, operands: list[UOp], slots: list[int], tag: int) -> tuple[list[UOp], list[UOp]]:
    """The body's outputs over fresh PARAMs: operand j becomes slot slots[j] of `tag`. Returns (outs, params)."""
    old = body_params(node, body)
    new = [param(o, s, tag) for o, s in zip(operands, slots)]
    mapping = {old[j]: new[j] for j in range(len(operands)) if j in old}
    root = substitute(body, mapping) if mapping else body
    return list(root.src), new


# ---- forward mode: (node, primals, tangents of the operands, forward) -> one tangent (or None) per output ----

def cond_jvp(node: UOp, primals: list[Array], tangents: list[Array | None], forward: Callable) -> list[Array | None]:
    """Both branches also compute tangents; the new COND's extra outputs are the tangents."""
    ops = list(node.operands)
    tag = fresh_tag()
    pred, values, tans = ops[0], ops[1:], tangents[1:]
    n, k = len(values), len(node.src[0].src)
    has_t = [t is not None and v.dtype.is_inexact for t, v in zip(tans, values)]
    t_ops = [t.uop for t, h in zip(tans, has_t) if h]

    def jvp_body(body: UOp) -> UOp:
        outs, params = _rebind(node, body, values, list(range(n)), tag)
        t_params = [param(v, n + i, tag) for i, v in enumerate(v for v, h in zip(values, has_t) if h)]
        touts = forward(outs, [p for p, h in zip(params, has_t) if h], [Array(t) for t in t_params])
        return tuple_of(outs + [t.uop if t is not None else _zeros(o) for t, o in zip(touts, outs)])
    new = UOp(Ops.COND, dtypes.bool_, (jvp_body(node.src[0]), jvp_body(node.src[1]), pred, *values, *t_ops),
              ControlArg(tag))
    return [Array(t) for t in _outputs(new, 2 * k)[k:]]


def while_jvp(node: UOp, primals: list[Array], tangents: list[Array | None], forward: Callable) -> list[Array | None]:
    """The loop also carries the tangents of its float carries (the predicate does not depend on them)."""
    ops = list(node.operands)
    tag = fresh_tag()
    n = len(ops)
    has_t = [v.dtype.is_inexact for v in ops]
    t_init = [t.uop if t is not None else _zeros(v) for t, v, h in zip(tangents, ops, has_t) if h]
    m = len(t_init)
    outs, params = _rebind(node, node.src[0], ops, list(range(n)), tag)
    t_params = [param(v, n + i, tag) for i, v in enumerate(v for v, h in zip(ops, has_t) if h)]
    touts = forward(outs, [p for p, h in zip(params, has_t) if h], [Array(t) for t in t_params])
    t_outs = [t.uop if t is not None else _zeros(o) for t, o, h in zip(touts, outs, has_t) if h]
    cond_outs, _ = _rebind(node, node.src[1], ops, list(range(n)), tag)
    new = UOp(Ops.WHILE, dtypes.bool_, (tuple_of(outs + t_outs), tuple_of(cond_outs), *ops, *t_init), ControlArg(tag))
    t_iter = iter(_outputs(new, n + m)[n:])
    return [Array(next(t_iter)) if has_t[i] else None for i in range(n)]


def scan_jvp(node: UOp, primals: list[Array], tangents: list[Array | None], forward: Callable) -> list[Array | None]:
    """The step also computes the tangents of its carry and outputs, from those of the carry, xs and free values."""
    ops = list(node.operands)
    tag = fresh_tag()
    nc, nx = node.arg.ncarry, node.arg.nxs
    groups = [ops[:nc], ops[nc:nc + nx], ops[nc + nx:]]
    tgroups = [tangents[:nc], tangents[nc:nc + nx], tangents[nc + nx:]]
    # new operand layout: carry, tangent carry, xs, tangent xs, free, tangent free (tangents of floats only)
    t_of = [[(t.uop if t is not None else _zeros(v)) for t, v in zip(ts, vs) if v.dtype.is_inexact]
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
    float_params = [p for p in params if p.dtype.is_inexact]
    step_t = [_slice_aval(t) if group == 1 else t for group, ts in enumerate(t_of) for t in ts]  # xs: one step
    t_params = [param(t, s, tag) for t, s in zip(step_t, [s for group in tangent_slots for s in group])]
    touts = forward(outs, float_params, [Array(t) for t in t_params])
    touts = [t.uop if t is not None else _zeros(o) for t, o in zip(touts, outs)]
    c_float = [i for i in range(nc) if outs[i].dtype.is_inexact]
    new_body = tuple_of(outs[:nc] + [touts[i] for i in c_float] + outs[nc:] + [t for t, o in zip(touts[nc:], outs[nc:])
                                                                          if o.dtype.is_inexact])
    new_ops = groups[0] + t_of[0] + groups[1] + t_of[1] + groups[2] + t_of[2]
    new = UOp(Ops.SCAN, dtypes.bool_, (new_body, *new_ops),
              node.arg._replace(tag=tag, ncarry=nc + len(c_float), nxs=nx + len(t_of[1])))
    n_out = len(new_body.src)
    res = _outputs(new, n_out)
    tcarry = iter(res[nc:nc + len(c_float)])
    ny = len(outs) - nc
    y_tan = iter(res[nc + len(c_float) + ny:])
    return ([Array(next(tcarry)) if i in c_float else None for i in range(nc)]
            + [Array(next(y_tan)) if outs[nc + j].dtype.is_inexact else None for j in range(ny)])


def _slice_aval(x: UOp) -> UOp:
    """A placeholder shaped like one step's slice of a scanned operand (only its shape and dtype are used)."""
    return UOp.const(x.dtype, 0, x.shape[1:])


# ---- reverse mode: (cotangent per output, node, *operands, backward) -> one cotangent (or None) per operand ----

def cond_vjp(cts: list[Array | None], node: UOp, *operands: Array, backward: Callable) -> list[Array | None]:
    """A COND of the branches' vjps: the vjp of the branch taken (the predicate has no cotangent)."""
    ops = list(node.operands)
    tag = fresh_tag()
    pred, values = ops[0], ops[1:]
    n = len(values)
    outs_ref = list(node.src[0].src)
    ct_ops = [c.uop if c is not None else _zeros(o) for c, o in zip(cts, outs_ref)]

    def vjp_body(body: UOp) -> UOp:
        outs, params = _rebind(node, body, values, list(range(n)), tag)
        ct_params = [param(o, n + i, tag) for i, o in enumerate(outs)]
        grads = backward(outs, [Array(c) if o.dtype.is_inexact else None for c, o in zip(ct_params, outs)], params)
        return tuple_of([g.uop if g is not None else _zeros(p) for g, p in zip(grads, params)])
    new = UOp(Ops.COND, dtypes.bool_, (vjp_body(node.src[0]), vjp_body(node.src[1]), pred, *values, *ct_ops),
              ControlArg(tag))
    grads = _outputs(new, n)
    return [None] + [Array(g) if v.dtype.is_inexact else None for g, v in zip(grads, values)]


def while_vjp(cts: list[Array | None], node: UOp, *operands: Array) -> list[Array | None]:
    """No reverse mode, as in JAX: the trip count is not known when the backward pass is built."""
    raise TypeError(at_user_line("reverse-mode differentiation does not work for lax.while_loop (its trip count "
                                 "is not known in advance); use lax.scan or fori_loop with static bounds"))


def scan_vjp(cts: list[Array | None], node: UOp, *operands: Array, backward: Callable) -> list[Array | None]:
    """A forward scan that saves each step's carry, then a reverse scan of the step's vjp over the saved carries."""
    ops = list(node.operands)
    tag = fresh_tag()
    nc, length, reverse, nx = node.arg.ncarry, node.arg.length, node.arg.reverse, node.arg.nxs
    carry, xs, free = ops[:nc], ops[nc:nc + nx], ops[nc + nx:]
    nf = len(free)
    body = node.src[0]
    ny = len(body.src) - nc
    # 1. a forward scan that also outputs each step's incoming carry (the residuals)
    ftag = fresh_tag()
    step_ops = carry + [_slice_aval(x) for x in xs] + free
    outs, params = _rebind(node, body, step_ops, list(range(len(step_ops))), ftag)
    saving = UOp(Ops.SCAN, dtypes.bool_, (tuple_of(outs + params[:nc]), *ops), node.arg._replace(tag=ftag))
    saved = _outputs(saving, nc + ny + nc)[nc + ny:]
    # 2. a reverse scan of the step's vjp: carry (ct of the carry, accumulated ct of free values)
    ct_carry = [c.uop if c is not None else _zeros(o) for c, o in zip(cts[:nc], carry)]
    ct_ys = [c.uop if c is not None else UOp.const(o.dtype, 0, (length,) + o.shape) for c, o in zip(cts[nc:],
                                                                                                   body.src[nc:])]
    acc0 = [_zeros(f) for f in free]
    b_carry = ct_carry + acc0
    b_xs = saved + xs + ct_ys
    slot = iter(range(10**6))
    p_ct = [param(c, next(slot), tag) for c in ct_carry]
    p_acc = [param(a, next(slot), tag) for a in acc0]
    p_saved = [param(_slice_aval(s), next(slot), tag) for s in saved]
    p_x = [param(_slice_aval(x), next(slot), tag) for x in xs]
    p_cty = [param(_slice_aval(c), next(slot), tag) for c in ct_ys]
    p_free = [param(f, next(slot), tag) for f in free]
    step_outs, step_params = _rebind(node, body, p_saved + p_x + p_free, list(range(len(step_ops))), tag)
    mapping = {sp: p for sp, p in zip(step_params, p_saved + p_x + p_free)}
    step_outs = [substitute(o, mapping) for o in step_outs]
    out_cts = [Array(c) if o.dtype.is_inexact else None for c, o in zip(p_ct + p_cty, step_outs)]
    grads = backward(step_outs, out_cts, p_saved + p_x + p_free)
    g = [gr.uop if gr is not None else _zeros(p) for gr, p in zip(grads, p_saved + p_x + p_free)]
    g_carry, g_x, g_free = g[:nc], g[nc:nc + nx], g[nc + nx:]
    new_acc = [UOp(Ops.ADD, a.dtype, (a, gf)) if a.dtype.is_inexact else a for a, gf in zip(p_acc, g_free)]
    b_body = tuple_of(g_carry + new_acc + g_x)
    back = UOp(Ops.SCAN, dtypes.bool_, (b_body, *b_carry, *b_xs, *free),
               ScanArg(tag, ncarry=nc + nf, length=length, reverse=not reverse, nxs=len(b_xs)))
    res = _outputs(back, nc + nf + nx)
    grads_carry, grads_free, grads_xs = res[:nc], res[nc:nc + nf], res[nc + nf:]
    wrap = lambda u, v: Array(u) if v.dtype.is_inexact else None  # noqa: E731
    return [wrap(u, v) for u, v in zip(grads_carry + grads_xs + grads_free, carry + xs + free)]

