"""Reverse-mode autodiff: vjp, grad, value_and_grad, jacrev.

The whole idea, as in micrograd: trace the function into a graph, then walk the graph from the output back to
the inputs, in reverse topological order. Each node receives the sum of the cotangents its users send it, and
its primitive's rule in `vjp_rules` turns that into one cotangent per source:

    vjp_rules[Ops.MUL] = lambda g, u, x, y: (g * y, g * x)      # d(x*y) = y dx + x dy

Every rule has that one signature, `rule(g, u, *operands) -> one cotangent (None: zero) per operand`, where
`operands` are the node's value sources (`u.operands`) as Arrays and `g` is the node's cotangent. A call or
control node (CALL, COND, WHILE, SCAN) has a tuple of outputs, so its `g` is a list with one cotangent per
output (None: zero), collected from the GETTUPLEs that read them.

The backward pass is itself a graph over the function's PARAMs and the cotangents: it can be jitted, run
eagerly, or differentiated again (grad of grad). Only floating-point values carry cotangents.
"""
from __future__ import annotations

import functools
import math
from typing import Any, Callable, Sequence

import numpy as np

import fnx.numpy as jnp
from fnx import dtypes, lax, tree_util
from fnx.errors import UnsupportedError, at_user_line
from fnx.rewrite import substitute
from fnx.trace import Array, building, imag_part, inline, make_complex, real_part, trace
from fnx.transforms.common import (body_params, finish, float_argnums, graph, partial, product_of_others,
                                   tuple_valued)
from fnx.transforms.control_rules import cond_vjp, scan_vjp, while_vjp
from fnx.transforms.custom import refuse_closure
from fnx.transforms.shard_map import shard_map_vjp
from fnx.uop import Ops, ParamArg, UOp

# ---- the backward pass over a graph ----


def _depends(outs: list[UOp], wrt: list[UOp]) -> set[UOp]:
    """Nodes under `outs` that depend on some node of `wrt` through float values (a CALL carries its outputs')."""
    live = set(wrt)
    for u in graph(outs):
        if u in live: continue
        if tuple_valued(u):
            if any(s in live for s in u.operands): live.add(u)
        elif u.dtype.is_inexact and any(s in live for s in u.src):
            live.add(u)
    return live


def backward(outs: list[UOp], cotangents: list[Array | None], wrt: list[UOp]) -> list[Array | None]:
    """Cotangents of `wrt` given cotangents of `outs` (None: zero). Builds graph; call inside `building()`."""
    live = _depends(outs, wrt)
    for u in graph(outs):
        if u.op is Ops.CALL: refuse_closure(u, live, "grad")
    grads: dict[UOp, Any] = {}

    def send(u: UOp, g: Array | None) -> None:
        if g is None or u not in live: return
        grads[u] = g if u not in grads else grads[u] + g

    for o, ct in zip(outs, cotangents): send(o, ct)
    stop = set(wrt)
    for u in reversed(graph(outs)):
        if u not in grads or u in stop: continue
        if u.op is Ops.GETTUPLE:  # a call's or control node's cotangent has one entry per output, collected here
            node = u.src[0]
            node_cts = grads.setdefault(node, [None] * len(node.src[0].src))
            node_cts[u.arg] = grads[u] if node_cts[u.arg] is None else node_cts[u.arg] + grads[u]
            live.add(node)
            continue
        rule = vjp_rules.get(u.op)
        if rule is None:
            raise UnsupportedError(at_user_line(f"grad: no reverse-mode rule for primitive {u.op.name}"))
        for s, g in zip(u.operands, rule(grads[u], u, *[Array(s) for s in u.operands])):
            send(s, g)
    return [grads.get(w) for w in wrt]


def call_vjp(cts: list[Array | None], call: UOp, *operands: Array) -> list[Array | None]:
    """Cotangents of a CALL's arguments: through its custom rule, or by differentiating its body."""
    rule, body, args = call.arg, call.src[0], list(call.operands)
    outs = list(body.src)
    shapes = getattr(rule, "out_shapes", None) or [o.shape for o in outs]  # (a shard_map's body is per shard)
    cts = [c if c is not None or not o.dtype.is_inexact else lax.full(shape, 0, o.dtype)
           for c, o, shape in zip(cts, outs, shapes)]
    if rule.kind == "shard_map": return shard_map_vjp(cts, call, list(operands), backward)
    if rule.kind == "vjp":
        primals = rule.dynamic_args(list(operands))
        out, residuals = rule.fwd(*rule.full_args(primals))
        ct_tree = tree_util.tree_unflatten(rule.out_tree, [c if c is not None else None for c in cts])
        result = rule.bwd(*rule.static_values, residuals, ct_tree)
        return _bwd_cotangents(rule, primals, result)
    if rule.kind == "jvp":  # transpose the user's jvp: it is linear in the tangents
        tangents = [UOp(Ops.PARAM, a.dtype, (), ParamArg(i, a.shape, a.device, ("tangent", id(call))))
                    for i, a in enumerate(args)]
        _, tangent_outs = rule.apply_jvp(list(operands), [Array(t) for t in tangents])
        grads = backward([t.uop for t in tangent_outs], cts, tangents)
        # the cotangents of a linear map do not depend on its inputs, but a rule may still read them (a loop's
        # vjp replays the loop): a tangent PARAM left in would read the slot's argument of the enclosing function,
        # of another shape (a crash, or a read past its end), so it is zero there. The walk stops at the call's
        # arguments and incoming cotangents, made before these PARAMs (the forward and backward graphs so far,
        # walked again for every argument's cotangent), and shares what it rebuilt between those cotangents.
        zeros = {t: UOp.const(t.dtype, 0, t.shape) for t in tangents}
        seen = {u: u for u in [c.uop for c in cts if c is not None] + [o.uop for o in operands]}
        return [Array(substitute(g.uop, zeros, seen)) if g is not None and a.dtype.is_inexact else None
                for g, a in zip(grads, args)]
    # checkpoint: recompute the body from its arguments, kept apart from the forward pass by CONTIGUOUS
    params = body_params(call)  # by slot; an argument the body never reads has none (and no cotangent)
    grads = dict(zip(params, backward(outs, cts, list(params.values()))))
    fresh = {p: UOp(Ops.CONTIGUOUS, args[i].dtype, (args[i],)) for i, p in params.items()}
    return [Array(substitute(g.uop, fresh)) if (g := grads.get(i)) is not None else None for i in range(len(args))]


def _bwd_cotangents(rule, primals: tuple, result: Any) -> list[Array | None]:
    """The leaves of a custom_vjp bwd's result, checked against the primal arguments as JAX checks them: a tuple with
    one entry per (differentiable) argument, each None (a zero) or a tree like the argument with leaves of its
    shapes. A mismatch is a TypeError naming the function, never a gradient of the wrong shape."""
    name = getattr(rule.fun, "__name__", "function")
    if not isinstance(result, (tuple, list)):
        raise TypeError(at_user_line(f"custom_vjp {name}: bwd must return a tuple (one cotangent per argument), got "
                                     f"{type(result).__name__}"))
    if len(result) != len(primals):
        raise TypeError(at_user_line(f"custom_vjp {name}: bwd returned {len(result)} cotangents for {len(primals)} "
                                     "arguments"))
    out: list[Array | None] = []
    for i, (ct, primal) in enumerate(zip(result, primals)):
        leaves = tree_util.tree_leaves(primal)
        if ct is None:
            out += [None] * len(leaves)
            continue
        cts, tree = tree_util.tree_flatten(ct, is_leaf=lambda x: x is None)
        if tree != tree_util.tree_structure(primal) and len(cts) != len(leaves):
            raise TypeError(at_user_line(f"custom_vjp {name}: bwd's cotangent {i} has tree {tree}, its argument "
                                         f"{tree_util.tree_structure(primal)}"))
        for c, p in zip(cts, leaves):
            if c is None:
                out.append(None)
                continue
            c = lax.to_array(c)
            if c.shape != tuple(np.shape(p)):
                raise ValueError(at_user_line(f"custom_vjp {name}: bwd's cotangent {i} has shape {list(c.shape)} "
                                              f"where its argument has shape {list(np.shape(p))}"))
            out.append(c)
    return out


# ---- the user-facing transforms ----

def _weak_as(gradient: Array, primal: Any) -> Any:
    """A gradient carries its primal's weak type, as in JAX (grad of a Python float is weak); an integer or bool
    primal's gradient (grad's allow_int=True) is JAX's float0 zeros, a numpy array of that empty dtype."""
    dt = dtypes.to_dtype(primal.dtype) if hasattr(primal, "dtype") else dtypes.canonicalize_scalar(primal)[0]
    if not dt.is_inexact: return np.zeros(np.shape(primal), dtypes.float0)
    weak = primal.weak_type if isinstance(primal, Array) else type(primal) is float
    return gradient if gradient.weak_type == weak else Array(gradient.uop, weak)


def vjp(fun: Callable, *primals: Any, has_aux: bool = False) -> tuple:
    """Evaluate `fun(*primals)` and return it with a function that pulls output cotangents back to the inputs.

    Args:
      fun: a function of arrays (pytrees) returning arrays (pytrees), or `(out, aux)` with `has_aux=True`.
      *primals: the point to differentiate at.

    Returns:
      `(out, vjp_fn)` or `(out, vjp_fn, aux)`. `vjp_fn(cotangent)` takes a pytree shaped like `out` and returns
      a tuple with one cotangent pytree per primal (zeros for integer inputs).

    Example:
      >>> y, pullback = fnx.vjp(jnp.sin, 0.5)
      >>> pullback(1.0)   # (cos(0.5),)
    """
    traced = trace(fun, primals, transform=True, kind=f"vjp of {getattr(fun, '__name__', 'a function')}")
    leaves = tree_util.tree_leaves(primals)
    params = list(traced.fn.src[1:])
    body_outs = list(traced.body.src)
    out_tree = traced.out_tree
    if has_aux:
        out_tree, aux_tree, n_out = _split_aux(out_tree)
    else:
        n_out = len(body_outs)
    inlined: dict = {}  # (what the forward's nodes became: the backward's inlining stops there)
    with building():
        values = inline(traced, body_outs, leaves, inlined)
    arrays = [Array(u, w) for u, w in zip(values, traced.out_weak)]
    out = finish(tree_util.tree_unflatten(out_tree, arrays[:n_out]))
    aux = finish(tree_util.tree_unflatten(aux_tree, arrays[n_out:])) if has_aux else None

    def vjp_fn(cotangent: Any) -> tuple:
        ct_leaves, ct_tree = tree_util.tree_flatten(cotangent)
        if ct_tree != out_tree:
            raise TypeError(at_user_line(f"vjp: cotangent structure {ct_tree} does not match the output {out_tree}"))
        with building():
            cts = []
            for ct, o in zip(ct_leaves, body_outs[:n_out]):
                c = lax.to_array(ct)
                if c.shape != o.shape:
                    raise TypeError(at_user_line(f"vjp: cotangent of shape {c.shape} for an output of shape {o.shape}"))
                cts.append(lax.convert_element_type(c, o.dtype) if o.dtype.is_inexact else None)
            grads = backward(body_outs[:n_out], cts, params)
            grads = [g if g is not None else lax.full(p.shape, 0, p.dtype) for g, p in zip(grads, params)]
            grads = [Array(u) for u in inline(traced, [g.uop for g in grads], leaves, inlined)]
        return finish(tuple(tree_util.tree_unflatten(traced.in_tree, grads)), "the backward pass (vjp)")

    return (out, vjp_fn, aux) if has_aux else (out, vjp_fn)


def _split_aux(out_tree) -> tuple:
    """(out treedef, aux treedef, number of out leaves) for a function returning (out, aux)."""
    children = out_tree.children()
    if len(children) != 2:
        raise TypeError(at_user_line("has_aux=True requires the function to return a pair (output, aux)"))
    return children[0], children[1], children[0].num_leaves


def complex_inputs(args: tuple, name: str) -> None:
    """holomorphic=True differentiates with respect to complex inputs only (JAX's TypeError otherwise)."""
    for leaf in tree_util.tree_leaves(args):
        dt = dtypes.to_dtype(leaf.dtype) if hasattr(leaf, "dtype") else dtypes.canonicalize_scalar(leaf)[0]
        if not dt.is_complex:
            raise TypeError(at_user_line(f"{name} with holomorphic=True requires inputs with complex dtype, but got "
                                         f"{dt}"))


def unsupported_options(name: str, allow_int: bool) -> None:
    """JAX's jacobian option fnx cannot honour yet, refused with the reason (False is JAX's default)."""
    if allow_int:
        raise NotImplementedError(f"{name}(allow_int=True): fnx gives float0 gradients for integer inputs in grad "
                                  "and value_and_grad only; exclude integer arguments with argnums")


def value_and_grad(fun: Callable, argnums: int | Sequence[int] = 0, has_aux: bool = False, holomorphic: bool = False,
                   allow_int: bool = False, reduce_axes: Sequence = ()) -> Callable:
    """A function returning `(fun(*args), gradient of fun with respect to args[argnums])`.

    `fun` must return a scalar float (or `(scalar, aux)` with `has_aux`). With a tuple `argnums` the gradient is
    a tuple. Integer inputs raise TypeError, as in JAX; with `allow_int=True` their gradients are float0 zeros
    (`fnx.dtypes.float0`, numpy arrays), as JAX's. `holomorphic=True` differentiates a complex function of complex
    inputs (its derivative f'(z)); without it a complex output is a TypeError, as in JAX.

    Example:
      >>> fnx.value_and_grad(lambda x: (x ** 2).sum())(jnp.arange(3.0))
      (Array(5., dtype=float32), Array([0., 2., 4.], dtype=float32))
    """
    def wrapped(*args, **kwargs):
        nums = float_argnums(argnums, args, "grad", allow_int)
        if holomorphic: complex_inputs(tuple(args[n] for n in nums), "grad")

        result = vjp(partial(fun, args, kwargs, nums), *[args[n] for n in nums], has_aux=has_aux)
        out, pullback = result[0], result[1]
        value = out
        leaves = tree_util.tree_leaves(value)
        if len(leaves) != 1 or np.shape(leaves[0]) != () or not dtypes.to_dtype(leaves[0].dtype).is_inexact:
            shapes = [tuple(np.shape(v)) for v in leaves]
            raise TypeError(at_user_line(f"grad requires a scalar float output, got outputs of shape {shapes}; "
                                         "use jacrev or vjp for non-scalar outputs"))
        out_dtype = dtypes.to_dtype(leaves[0].dtype)
        if out_dtype.is_complex != holomorphic:
            raise TypeError(at_user_line(
                f"grad with holomorphic=True requires a complex output, got {out_dtype}" if holomorphic else
                f"grad requires real-valued outputs (a floating dtype), but got {out_dtype}. For holomorphic "
                "differentiation, pass holomorphic=True; for the gradient of a non-holomorphic function, take "
                "the real (or imaginary) part of its output, as in JAX"))
        grads = pullback(tree_util.tree_unflatten(tree_util.tree_structure(value), [lax.full((), 1.0, dtypes.to_dtype(
            leaves[0].dtype))]))
        grads = tree_util.tree_map(_weak_as, tuple(grads), tuple(args[n] for n in nums))
        grads = grads[0] if isinstance(argnums, int) else grads
        return ((value, result[2]), grads) if has_aux else (value, grads)
    return wrapped


def grad(fun: Callable, argnums: int | Sequence[int] = 0, has_aux: bool = False, holomorphic: bool = False,
         allow_int: bool = False, reduce_axes: Sequence = ()) -> Callable:
    """The gradient of a scalar-valued `fun` with respect to `args[argnums]` (see `value_and_grad`).

    Example:
      >>> fnx.grad(jnp.sin)(0.0)
      Array(1., dtype=float32)
    """
    vg = value_and_grad(fun, argnums, has_aux, holomorphic, allow_int)

    def wrapped(*args, **kwargs):
        (value, grads) = vg(*args, **kwargs)
        return (grads, value[1]) if has_aux else grads
    return wrapped


def jacrev(fun: Callable, argnums: int | Sequence[int] = 0, has_aux: bool = False, holomorphic: bool = False,
           allow_int: bool = False) -> Callable:
    """The Jacobian of `fun` by reverse mode: one vjp, its pullback mapped over every output basis vector at once
    (vmap over the identity), as JAX does.

    For outputs of shape S and an input of shape T the result has shape S + T (pytrees: nested like JAX).
    Integer inputs raise TypeError, as in JAX.
    """
    from fnx.transforms.vmap import vmap  # (vmap sits beside this module: both are transforms of traces)
    unsupported_options("jacrev", allow_int)

    def wrapped(*args, **kwargs):
        nums = float_argnums(argnums, args, "jacrev")
        diff = tuple(tree_util.tree_map(jnp.asarray, args[n]) for n in nums)
        if holomorphic: complex_inputs(diff, "jacrev")
        result = vjp(partial(fun, args, kwargs, nums), *diff, has_aux=has_aux)
        out, pullback = result[0], result[1]
        out_leaves, out_tree = tree_util.tree_flatten(out)
        for o in out_leaves:
            if dtypes.to_dtype(o.dtype).is_complex != holomorphic:
                raise TypeError(at_user_line(
                    f"jacrev with holomorphic=True requires complex outputs, got {o.dtype}" if holomorphic else
                    f"jacrev requires real-valued outputs (a floating dtype), but got {o.dtype}. For holomorphic "
                    "differentiation, pass holomorphic=True; otherwise take the real and imaginary parts"))
        shapes = [tuple(np.shape(o)) for o in out_leaves]
        sizes = [int(math.prod(shape)) for shape in shapes]
        bounds = np.cumsum([0] + sizes)
        eye = np.eye(int(bounds[-1]))
        basis = [jnp.asarray(eye[lo:hi].reshape(shape + (int(bounds[-1]),)), dtype=o.dtype)
                 for lo, hi, shape, o in zip(bounds[:-1], bounds[1:], shapes, out_leaves)]
        rows = vmap(lambda *cotangents: pullback(tree_util.tree_unflatten(out_tree, list(cotangents))),
                    in_axes=-1, out_axes=0)(*basis)  # (total, in_shape) per input leaf
        in_leaves, in_tree = tree_util.tree_flatten(tuple(rows))
        jac = []
        for lo, hi, shape in zip(bounds[:-1], bounds[1:], shapes):
            blocks = [jnp.reshape(r[lo:hi], shape + tuple(r.shape[1:])) for r in in_leaves]
            tree = tree_util.tree_unflatten(in_tree, blocks)
            jac.append(tree[0] if isinstance(argnums, int) else tree)
        jac = tree_util.tree_unflatten(out_tree, jac)
        return (jac, result[2]) if has_aux else jac
    return wrapped


# ---- helpers for the rules ----

def _unbroadcast_sum(g: Array, x: UOp) -> Array:
    """Sum g over the axes where x was broadcast (EXPAND's cotangent)."""
    axes = tuple(i for i, (s, t) in enumerate(zip(x.shape, g.shape)) if s != t)
    return lax.reduce_sum(g, axes, keepdims=True) if axes else g


def _float(x: Array) -> bool:
    return x.uop.dtype.is_inexact


def _max_vjp(g: Array, u: UOp, x: Array, y: Array) -> tuple:
    # ties share the cotangent equally, as in JAX
    half = jnp.where(x == y, 0.5, 0.0).astype(g.dtype)
    gx = jnp.where(x > y, g, 0.0).astype(g.dtype) + g * half
    gy = jnp.where(y > x, g, 0.0).astype(g.dtype) + g * half
    return (gx, gy) if _float(x) else (None, None)


def _reduce_vjp(g: Array, u: UOp, x: Array) -> tuple:
    op, axes = u.arg.op, u.arg.axes
    if not _float(x): return (None,)
    if op is Ops.ADD: return (lax.expand(g, x.shape),)
    full = lax.expand(Array(u), x.shape)
    if op is Ops.MAX:  # the maximum's cotangent is shared by the elements that reach it
        hit = (x == full).astype(g.dtype)
        count = lax.reduce_sum(hit, axes, keepdims=True)
        return (lax.expand(g / count, x.shape) * hit,)
    return (lax.expand(g, x.shape) * product_of_others(x, axes),)


def _index_vjp(g: Array, u: UOp, x: Array, idx: Array) -> tuple:
    """Gather's cotangent: a scatter-add of g at the (clamped) indices, O(number of indices)."""
    if not _float(x): return (None, None)
    n = x.shape[u.arg]
    clamped = jnp.clip(idx, 0, n - 1)
    return (lax.scatter_axis(lax.full(x.shape, 0, x.uop.dtype), clamped, g, u.arg, "add"), None)


def _scatter_vjp(g: Array, u: UOp, x: Array, idx: Array, upd: Array) -> tuple:
    axis, mode = u.arg.axis, u.arg.mode
    if not _float(x): return (None, None, None)
    n = x.shape[axis]
    inside = ((idx >= 0) & (idx < n))
    inside = lax.broadcast_in_dim(inside, upd.shape, tuple(range(axis, axis + idx.ndim)))
    g_upd = jnp.where(inside, lax.gather_axis(g, idx, axis), 0.0).astype(g.dtype)
    if mode == "add": return (g, None, g_upd)
    if mode == "set":  # overwritten positions get no cotangent
        zeros = lax.full(upd.shape, 0, g.uop.dtype)
        return (lax.scatter_axis(g, idx, zeros, axis, "set"), None, g_upd)
    raise UnsupportedError(at_user_line(f"grad: no reverse-mode rule for SCATTER with mode {mode!r}"))


def _cast_vjp(g: Array, u: UOp, x: Array) -> tuple:
    return (lax.convert_element_type(g, x.uop.dtype) if _float(x) and u.dtype.is_inexact else None,)


def _movement_vjp(g: Array, u: UOp, x: Array) -> tuple:
    op, arg = u.op, u.arg
    if op is Ops.RESHAPE: return (lax.reshape(g, x.shape),)
    if op is Ops.PERMUTE: return (lax.transpose(g, tuple(int(i) for i in np.argsort(arg))),)
    if op is Ops.EXPAND: return (_unbroadcast_sum(g, x.uop),)
    if op is Ops.PAD: return (lax.slice(g, [b for b, _ in arg], [b + s for (b, _), s in zip(arg, x.shape)]),)
    if op is Ops.SHRINK: return (lax.pad(g, 0, [(b, s - e, 0) for (b, e), s in zip(arg, x.shape)]),)
    return (lax.rev(g, tuple(i for i, f in enumerate(arg) if f)),)  # FLIP


def _floats(rule: Callable) -> Callable:
    """A rule that applies only when the node is floating point (integer values carry no cotangent)."""
    def wrapped(g, u, *srcs):
        return rule(g, u, *srcs) if u.dtype.is_inexact else tuple(None for _ in srcs)
    return wrapped


def _no_grad(g, u, *srcs):
    return tuple(None for _ in srcs)


def _collective_vjp(g: Array, u: UOp, *srcs: Array) -> tuple:
    """psum's transpose is psum; pmax/pmin send the summed cotangent to the extreme examples; all_gather's
    cotangent for this example is its slice of the summed cotangent. psum_scatter's transpose is the tiled
    all_gather (every example's chunk k came from chunk k of each example), ppermute's is ppermute with each
    pair reversed, and all_to_all's is all_to_all with the split and concat axes swapped."""
    kind, name, axis = u.arg.kind, u.arg.axis_name, u.arg.axis
    if kind == "axis_index" or not u.dtype.is_inexact: return tuple(None for _ in srcs)
    if kind == "psum_scatter": return (lax.all_gather(g, name, axis, tiled=True),)
    if kind == "ppermute": return (lax.ppermute(g, name, [(dst, src) for src, dst in u.arg.perm]),)
    if kind == "all_to_all": return (lax.all_to_all(g, name, axis, u.arg.split_axis, tiled=True),)
    total = lax.psum(g, name)
    if kind == "psum": return (total,)
    if kind == "all_gather": return (lax.gather_axis(total, lax.axis_index(name), axis),)
    hit = (srcs[0] == Array(u)).astype(g.dtype)
    return (total * hit / lax.psum(hit, name),)


def _copy_vjp(g: Array, u: UOp, x: Array) -> tuple:
    """A COPY's cotangent goes back to the device its operand lives on."""
    device = x.uop.device
    return (g if device in (None, u.arg) else Array(UOp(Ops.COPY, g.uop.dtype, (g.uop,), device)),)


LN2 = math.log(2.0)


# ---- the rule table: one rule per primitive, in the order of DESIGN.md §2 ----
vjp_rules: dict[Ops, Callable] = {}
for _op in (Ops.BUFFER, Ops.PARAM, Ops.CONST, Ops.IOTA): vjp_rules[_op] = _no_grad
for _op in (Ops.RESHAPE, Ops.PERMUTE, Ops.EXPAND, Ops.PAD, Ops.SHRINK, Ops.FLIP): vjp_rules[_op] = _movement_vjp
vjp_rules[Ops.INDEX] = _index_vjp
vjp_rules[Ops.REDUCE] = _reduce_vjp
vjp_rules[Ops.SCATTER] = _scatter_vjp
vjp_rules[Ops.RECIP] = _floats(lambda g, u, x: (-g * Array(u) * Array(u),))
vjp_rules[Ops.SQRT] = _floats(lambda g, u, x: (g / (2 * Array(u)),))
vjp_rules[Ops.EXP2] = _floats(lambda g, u, x: (g * Array(u) * LN2,))
vjp_rules[Ops.LOG2] = _floats(lambda g, u, x: (g / (x * LN2),))
vjp_rules[Ops.SIN] = _floats(lambda g, u, x: (g * jnp.cos(x),))
vjp_rules[Ops.TRUNC] = _no_grad
vjp_rules[Ops.CAST] = _cast_vjp
vjp_rules[Ops.BITCAST] = _no_grad
vjp_rules[Ops.ADD] = _floats(lambda g, u, x, y: (g, g))
vjp_rules[Ops.MUL] = _floats(lambda g, u, x, y: (g * y, g * x))
vjp_rules[Ops.DIV] = _floats(lambda g, u, x, y: (g / y, -g * Array(u) / y))
vjp_rules[Ops.MAX] = _max_vjp
vjp_rules[Ops.MOD] = _floats(lambda g, u, x, y: (g, -g * lax.trunc(x / y)))
for _op in (Ops.CMPLT, Ops.CMPNE, Ops.AND, Ops.OR, Ops.XOR, Ops.SHL, Ops.SHR): vjp_rules[_op] = _no_grad
vjp_rules[Ops.WHERE] = _floats(lambda g, u, c, a, b: (None, lax.select(c, g, lax.full(g.shape, 0, g.uop.dtype)),
                                                       lax.select(c, lax.full(g.shape, 0, g.uop.dtype), g)))
vjp_rules[Ops.COLLECTIVE] = _collective_vjp
vjp_rules[Ops.CALL] = call_vjp
vjp_rules[Ops.COND] = functools.partial(cond_vjp, backward=backward)  # control rules run `backward` on their bodies
vjp_rules[Ops.WHILE] = while_vjp
vjp_rules[Ops.SCAN] = functools.partial(scan_vjp, backward=backward)
# complex numbers, with JAX's convention (a cotangent is the conjugate of the real pair's: docs/COMPLEX.md)
vjp_rules[Ops.REAL] = lambda g, u, z: (make_complex(g, jnp.zeros_like(g)),)
vjp_rules[Ops.IMAG] = lambda g, u, z: (make_complex(jnp.zeros_like(g), -g),)
vjp_rules[Ops.COMPLEX] = lambda g, u, re, im: (real_part(g), -imag_part(g))
vjp_rules[Ops.CONTIGUOUS] = lambda g, u, x: (g,)
vjp_rules[Ops.DETACH] = _no_grad
vjp_rules[Ops.COPY] = _copy_vjp
