"""Structured control flow: cond, while_loop, fori_loop, scan (as in jax.lax).

Each traces its Python functions once into bodies (TUPLEs over PARAMs tagged with the node's own tag) and
builds one node of the call family:

    COND(true_body, false_body, pred, operands...)  arg=ControlArg(tag)
                                                          GETTUPLE(COND, i): output i of the branch taken
    WHILE(body, cond_body, init...)  arg=ControlArg(tag)  GETTUPLE(WHILE, i): carry i after the loop
    SCAN(body, init..., xs...)  arg=ScanArg(tag, ncarry, length, reverse, nxs)
                                                          GETTUPLE(SCAN, i): final carry i, then stacked ys

Values a body closes over become extra operands, so a body depends on nothing but its PARAMs. Backends run
the bodies as compiled functions in a host-side loop: a 10,000-step scan is one body compiled once.
"""
from __future__ import annotations

from typing import Any, Callable

import numpy as np

from fnx import dtypes, tree_util
from fnx.backends.device import LRUCache
from fnx.errors import at_user_line
from fnx.rewrite import substitute
from fnx.trace import (Array, _realize_tree, building, fresh_tag, imag_part, make_complex, real_part, state, to_array,
                        trace)
from fnx.uop import ControlArg, IotaArg, Ops, ParamArg, ScanArg, UOp

_FREE_MOVES = (Ops.RESHAPE, Ops.EXPAND, Ops.PERMUTE)


_UNTAGGED = -1  # the tag a control node's key is built with (fresh_tag never gives it)
_canonical_tags = LRUCache(4096)  # a control node of that tag -> the tag every node of its content gets


def _canonical(node: UOp) -> UOp:
    """`node` (COND, WHILE or SCAN, just built with a fresh tag) with the tag every node of the same content gets:
    tracing the same loop again then builds the same graph, so an eager op holding one (a factorization's fori
    loop, gcd's) finds its compiled program instead of lowering and compiling the loop again (64 ms a call for
    gcd of 64 ints). Nodes of equal content are then one node (hash-consing), as a checkpointed body shared by
    several calls is already."""
    tag = node.arg.tag
    n_bodies = len(node.src) - len(node.operands)
    bodies = node.src[:n_bodies]
    params = {u for b in bodies for u in b.toposort if u.op is Ops.PARAM and u.arg.tag == (tag,)}

    def retagged(new: int) -> UOp:
        mapping = {q: UOp(Ops.PARAM, q.dtype, (), q.arg._replace(tag=(new,))) for q in params}
        return UOp(node.op, node.dtype, tuple(substitute(b, mapping) for b in bodies) + node.src[n_bodies:],
                   node.arg._replace(tag=new))
    key = retagged(_UNTAGGED)
    if (canonical := _canonical_tags.get(key)) is None: canonical = _canonical_tags.put(key, tag)
    return node if canonical == tag else retagged(canonical)


def close_body(outs: list[UOp], params: list[UOp], tag: tuple) -> tuple[UOp, list[UOp]]:
    """TUPLE(outs) over `params`, with every value the outputs close over (anything built from other PARAMs or
    BUFFERs) replaced by a fresh PARAM of `tag`; returns the body and those closed-over values, in slot order.
    Nested bodies are not entered: a nested control node is closed already, and a call's body only decides
    whether the call depends on `params`."""
    own = set(params)
    body = UOp(Ops.TUPLE, dtypes.bool_, tuple(outs))
    order = body.graph
    depends_own: dict[UOp, bool] = {}
    foreign: dict[UOp, bool] = {}
    users: dict[UOp, list[UOp]] = {}
    for u in order:
        srcs = u.src if u is body else u.operands
        for s in srcs: users.setdefault(s, []).append(u)
        inner = u.src[0].toposort if u.op is Ops.CALL else ()
        depends_own[u] = u in own or any(depends_own[s] for s in srcs) or any(n in own for n in inner)
        foreign[u] = (u.op in (Ops.PARAM, Ops.BUFFER) and u not in own) or any(foreign[s] for s in srcs)
    hoist = [u for u in order if u is not body and u.shape is not None and not depends_own[u] and foreign[u]
             and any(depends_own[v] or v is body for v in users.get(u, []))]
    # close over the array itself, not a broadcast or reshape of it: the movement stays in the body, where it is
    # index arithmetic (an expanded weight matrix would otherwise be materialized and read at every step)
    bases = []
    for h in hoist:
        while h.op in _FREE_MOVES and h.src[0].shape is not None: h = h.src[0]
        if h not in bases: bases.append(h)
    hoist = bases
    mapping = {h: UOp(Ops.PARAM, h.dtype, (), ParamArg(len(params) + i, h.shape, h.device, tag))
               for i, h in enumerate(hoist)}
    return (substitute(body, mapping) if mapping else body), hoist


def params_after(params: list[UOp], values: list[UOp], tag: int) -> list[UOp]:
    """`params` followed by PARAMs (of `tag`) for `values`, numbered on from them."""
    return params + [UOp(Ops.PARAM, u.dtype, (), ParamArg(len(params) + i, u.shape, u.device, (tag,)))
                     for i, u in enumerate(values)]


def _trace_body(fun: Callable, example_args: tuple, tag: int) -> tuple[Any, list, list[UOp]]:
    """Trace `fun` on abstract arguments shaped like `example_args`: (traced, own params, output uops)."""
    traced = trace(fun, example_args, transform=True, tag=(tag,), abstract=True,
                   kind=f"a control-flow body ({getattr(fun, '__name__', 'a function')})")
    return traced, list(traced.fn.src[1:]), list(traced.body.src)


def _leaf_uops(tree: Any) -> tuple[list[Array], Any]:
    leaves, treedef = tree_util.tree_flatten(tree)
    return [to_array(x) for x in leaves], treedef


def _avals(arrays: list[Array]) -> list[str]:
    return [f"{a.uop.dtype}{list(a.shape)}" for a in arrays]


def _check_same_types(what: str, a_name: str, a: list[UOp], b_name: str, b: list[UOp], a_tree, b_tree) -> None:
    if a_tree != b_tree or any(x.shape != y.shape or x.dtype != y.dtype for x, y in zip(a, b)):
        ta = [f"{x.dtype}{list(x.shape)}" for x in a]
        tb = [f"{y.dtype}{list(y.shape)}" for y in b]
        raise TypeError(at_user_line(f"{what}: {a_name} {a_tree} with types {ta} and {b_name} {b_tree} with types "
                                     f"{tb} must have identical structure, shapes and dtypes"))


def _finish(out: Any) -> Any:
    return _realize_tree(_from_parts(out)) if not state.depth else _from_parts(out)


# ---- complex values cross a body's boundary as their two parts (control nodes carry real values only) ----

class _Parts:
    """A complex leaf of a body's arguments or results, as the pytree of its real and imaginary parts."""
    __slots__ = ("re", "im")

    def __init__(self, re: Any, im: Any):
        self.re, self.im = re, im


tree_util.register_pytree_node(_Parts, lambda p: ((p.re, p.im), None), lambda _, children: _Parts(*children))


def _is_complex(x: Any) -> bool:
    return (isinstance(x, Array) and x.uop.dtype.is_complex) or (
        isinstance(x, (np.ndarray, np.generic, complex)) and np.iscomplexobj(x))


def _to_parts(tree: Any) -> Any:
    """`tree` with each complex leaf replaced by its _Parts."""
    if not any(_is_complex(x) for x in tree_util.tree_leaves(tree)): return tree
    def split(x):
        if not _is_complex(x): return x
        z = to_array(x)
        return _Parts(real_part(z), imag_part(z))
    return tree_util.tree_map(split, tree)


def _from_parts(tree: Any) -> Any:
    """`tree` with each _Parts joined back into a complex array."""
    leaves = tree_util.tree_leaves(tree, is_leaf=lambda x: isinstance(x, _Parts))
    if not any(isinstance(x, _Parts) for x in leaves): return tree
    return tree_util.tree_map(lambda p: make_complex(to_array(p.re), to_array(p.im)) if isinstance(p, _Parts) else p,
                              tree, is_leaf=lambda x: isinstance(x, _Parts))


def _on_parts(fun: Callable) -> Callable:
    """`fun` taking and returning complex values as _Parts."""
    def body(*args):
        return _to_parts(fun(*_from_parts(args)))
    body.__name__ = getattr(fun, "__name__", "a function")
    return body


def cond(pred: Any, true_fun: Callable, false_fun: Callable, *operands: Any) -> Any:
    """`true_fun(*operands)` if pred else `false_fun(*operands)`, choosing at run time (jax.lax.cond).

    Both branches are traced; they must return the same structure, shapes and dtypes.
    """
    p = to_array(pred)
    if p.shape != () or not (p.uop.dtype.is_bool or p.uop.dtype.is_int):
        raise TypeError(at_user_line(f"cond: the predicate must be a scalar bool or int, got {_avals([p])[0]}"))
    operands, true_fun, false_fun = _to_parts(operands), _on_parts(true_fun), _on_parts(false_fun)
    with building():
        p = p if p.uop.dtype.is_bool else Array(p.uop.alu(Ops.CMPNE, 0))
        args, in_tree = _leaf_uops(operands)
        tag = fresh_tag()
        examples = tree_util.tree_unflatten(in_tree, args)
        t_traced, t_params, t_outs = _trace_body(true_fun, examples, tag)
        f_traced, f_params, f_outs = _trace_body(false_fun, examples, tag)
        _check_same_types("cond", "true_fun output", t_outs, "false_fun output", f_outs, t_traced.out_tree,
                          f_traced.out_tree)
        t_body, t_free = close_body(t_outs, t_params, (tag,))
        # the false branch's closed-over values come after the true branch's
        f_body, f_free = close_body(f_outs, params_after(t_params, t_free, tag), (tag,))
        node = _canonical(UOp(Ops.COND, dtypes.bool_, (t_body, f_body, p.uop, *[a.uop for a in args], *t_free,
                                                       *f_free), ControlArg(tag)))
        outs = [Array(UOp(Ops.GETTUPLE, o.dtype, (node,), i), w)
                for i, (o, w) in enumerate(zip(t_outs, t_traced.out_weak))]
        return _finish(tree_util.tree_unflatten(t_traced.out_tree, outs))


def while_loop(cond_fun: Callable, body_fun: Callable, init_val: Any) -> Any:
    """Repeat `val = body_fun(val)` while `cond_fun(val)` (jax.lax.while_loop). The carry keeps its type."""
    init_val, cond_fun, body_fun = _to_parts(init_val), _on_parts(cond_fun), _on_parts(body_fun)
    with building():
        args, in_tree = _leaf_uops(init_val)
        tag = fresh_tag()
        example = tree_util.tree_unflatten(in_tree, args)
        b_traced, params, b_outs = _trace_body(body_fun, (example,), tag)
        _check_same_types("while_loop", "body_fun output", b_outs, "the carry", [a.uop for a in args],
                          b_traced.out_tree, in_tree)
        c_traced, c_params, c_outs = _trace_body(cond_fun, (example,), tag)
        if len(c_outs) != 1 or c_outs[0].shape != () or not c_outs[0].dtype.is_bool:
            raise TypeError(at_user_line(f"while_loop: cond_fun must return a scalar bool, got "
                                         f"{[f'{o.dtype}{list(o.shape)}' for o in c_outs]}"))
        body, free = close_body(b_outs, params, (tag,))
        cond_body, c_free = close_body(c_outs, params_after(params, free, tag), (tag,))
        extra = free + c_free  # closed-over values ride along as carries that the body passes through unchanged
        if extra:
            body = UOp(Ops.TUPLE, dtypes.bool_, body.src + tuple(params_after(params, extra, tag)[len(params):]))
        node = _canonical(UOp(Ops.WHILE, dtypes.bool_, (body, cond_body, *[a.uop for a in args], *extra),
                              ControlArg(tag)))
        outs = [Array(UOp(Ops.GETTUPLE, a.uop.dtype, (node,), i), a.weak_type) for i, a in enumerate(args)]
        return _finish(tree_util.tree_unflatten(in_tree, outs))


def scan(f: Callable, init: Any, xs: Any = None, length: int | None = None, reverse: bool = False,
         unroll: int = 1) -> tuple[Any, Any]:
    """Loop `carry, y = f(carry, x)` over the leading axis of `xs` (jax.lax.scan); returns (carry, stacked ys).

    The body is traced once, whatever the length. `unroll` is accepted for compatibility.
    """
    init, xs, f = _to_parts(init), _to_parts(xs), _on_parts(f)
    with building():
        carry, c_tree = _leaf_uops(init)
        x_leaves, x_tree = tree_util.tree_flatten(xs)
        x_arrays = [to_array(x) for x in x_leaves]
        lengths = {a.shape[0] for a in x_arrays if a.ndim}
        if any(a.ndim == 0 for a in x_arrays):
            raise ValueError(at_user_line("scan: every xs leaf needs a leading axis to scan over"))
        if length is not None: lengths.add(int(length))
        if len(lengths) != 1:
            raise ValueError(at_user_line(f"scan: xs leading axes and length disagree: {sorted(lengths)}"
                                          if lengths else "scan: no xs given, so pass length"))
        n = lengths.pop()
        tag = fresh_tag()
        x_examples = [Array(UOp.const(a.uop.dtype, 0, a.shape[1:]), a.weak_type) for a in x_arrays]
        example = (tree_util.tree_unflatten(c_tree, carry), tree_util.tree_unflatten(x_tree, x_examples))
        traced, params, outs = _trace_body(lambda c, x: f(c, x), example, tag)
        children = traced.out_tree.children()
        if len(children) != 2:
            raise TypeError(at_user_line("scan: the body must return a pair (carry, y)"))
        nc = children[0].num_leaves
        _check_same_types("scan", "the carry output", outs[:nc], "the carry input", [a.uop for a in carry],
                          children[0], c_tree)
        body, free = close_body(outs, params, (tag,))
        node = _canonical(UOp(Ops.SCAN, dtypes.bool_, (body, *[a.uop for a in carry], *[a.uop for a in x_arrays],
                                                       *free), ScanArg(tag, nc, n, bool(reverse), len(x_arrays))))
        results = [Array(UOp(Ops.GETTUPLE, o.dtype, (node,), i), w)
                   for i, (o, w) in enumerate(zip(outs, traced.out_weak))]
        final = tree_util.tree_unflatten(children[0], results[:nc])
        ys = tree_util.tree_unflatten(children[1], results[nc:])
        return _finish((final, ys))


def fori_loop(lower: int, upper: int, body_fun: Callable, init_val: Any) -> Any:
    """`val = body_fun(i, val)` for i in [lower, upper) (jax.lax.fori_loop). Static int bounds become a scan
    (so reverse mode works); traced bounds become a while_loop."""
    if isinstance(lower, (int, np.integer)) and isinstance(upper, (int, np.integer)):
        steps = max(int(upper) - int(lower), 0)
        if steps == 0: return init_val
        def step(carry, i):
            return body_fun(i + int(lower), carry), None
        final, _ = scan(step, init_val, xs=Array(_iota(steps)), length=steps)
        return final
    lo, hi = to_array(lower), to_array(upper)
    def cond_fun(state_):
        return state_[0] < hi
    def body(state_):
        i, val = state_
        return i + 1, body_fun(i, val)
    return while_loop(cond_fun, body, (lo, init_val))[1]


def _iota(n: int) -> UOp:
    return UOp(Ops.IOTA, dtypes.int32, (), IotaArg((n,), 0))


def switch(index: Any, branches: list[Callable], *operands: Any) -> Any:
    """`branches[clip(index, 0, len - 1)](*operands)` as a chain of conds (jax.lax.switch)."""
    if not branches: raise ValueError(at_user_line("switch needs at least one branch"))
    i = to_array(index)

    def choose(k: int, *ops):
        if k == len(branches) - 1: return branches[k](*ops)  # the clip: indices above (and NaN) take the last
        taken = i <= 0 if k == 0 else i == k  # and indices below take the first
        return cond(taken, branches[k], lambda *o: choose(k + 1, *o), *ops)
    return choose(0, *operands)


