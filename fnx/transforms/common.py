"""What more than one transform needs: walking a graph, the PARAMs of a body, argnums, returning results.

grad, jvp and vmap each interpret a traced graph with their own rule table; this module holds the helpers they
share, so that no transform reads another's privates. It imports no other transform. Inside fnx/transforms
the imports go one way:

    custom                                    (CustomRule: the arg of a CALL; imported by numpy and nn too)
    common                                    (this module)
    control_rules <- common                   (jvp and vjp rules of COND / WHILE / SCAN)
    grad          <- common, control_rules    (reverse mode)
    jvp           <- common, control_rules, grad   (forward mode; hessian is jacfwd of grad's jacrev)
    vmap          <- common                   (batching)
"""
from __future__ import annotations

import math
from typing import Any, Callable, Sequence

import numpy as np

import fnx.numpy as jnp
from fnx import dtypes, lax, tree_util
from fnx.config import config
from fnx.errors import at_user_line
from fnx.trace import Array, _realize_tree, special_values, state
from fnx.uop import GroupOp, Ops, ParamArg, UOp

# ---- graphs and bodies ----


def tuple_of(outs: Sequence[UOp]) -> UOp:
    """A TUPLE node: the outputs of a body, or the roots of a walk."""
    return UOp(Ops.TUPLE, dtypes.bool_, tuple(outs))


def graph(outs: list[UOp]) -> list[UOp]:
    """The nodes under `outs`, sources first, not descending into call bodies (they are rewritten per call)."""
    return [u for u in tuple_of(outs).graph][:-1]


def tuple_valued(u: UOp) -> bool:
    """Whether `u` is a call or control node (CALL, COND, WHILE, SCAN): its value is a tuple, read by GETTUPLE."""
    return u.op is Ops.CALL or u.op in GroupOp.Control


def body_params(node: UOp, body: UOp | None = None) -> dict[int, UOp]:
    """The PARAMs that `body` (default: the node's first body) binds for a call or control node, by slot.

    An argument the body never reads has no PARAM, so its slot is absent."""
    body = node.src[0] if body is None else body
    return {p.arg.slot: p for p in body.toposort if p.op is Ops.PARAM and p.arg.tag == node.binds}


def param(like: UOp, slot: int, tag: int, shape: tuple[int, ...] | None = None) -> UOp:
    """A PARAM at `slot` of the body tagged `tag`, with `like`'s dtype and device and its shape (or `shape`)."""
    return UOp(Ops.PARAM, like.dtype, (), ParamArg(slot, like.shape if shape is None else shape, like.device, (tag,)))


# ---- the user-facing wrappers ----

def argnums_tuple(argnums: int | Sequence[int], nargs: int, name: str) -> tuple[int, ...]:
    """`argnums` as a tuple of non-negative positions; ValueError naming `name` when one is out of range."""
    nums = (argnums,) if isinstance(argnums, int) else tuple(argnums)
    for n in nums:
        if not -nargs <= n < nargs:
            raise ValueError(at_user_line(f"{name}: argnums {argnums} out of range for {nargs} positional arguments"))
    return tuple(n % nargs for n in nums)


def float_argnums(argnums: int | Sequence[int], args: tuple, name: str, allow_int: bool = False) -> tuple[int, ...]:
    """`argnums_tuple`, raising TypeError (as JAX does) when a differentiated argument has a non-float leaf (unless
    `allow_int`: integer and bool leaves then get float0 gradients)."""
    nums = argnums_tuple(argnums, len(args), name)
    for n in nums if not allow_int else ():
        for leaf in tree_util.tree_leaves(args[n]):
            dt = dtypes.to_dtype(leaf.dtype) if hasattr(leaf, "dtype") else dtypes.canonicalize_scalar(leaf)[0]
            if not dt.is_inexact:
                raise TypeError(at_user_line(f"{name} requires real-valued (float) inputs, but argument {n} has "
                                             f"dtype {dt}; use jnp.float32 inputs or exclude it with argnums"))
    return nums


def partial(fun: Callable, args: tuple, kwargs: dict, nums: tuple[int, ...]) -> Callable:
    """`fun` as a function of the arguments at positions `nums` only (the others fixed to `args`)."""
    def partial_fun(*diff_args):
        full = list(args)
        for n, a in zip(nums, diff_args): full[n] = a
        return fun(*full, **kwargs)
    return partial_fun


def finish(tree: Any, what: str = "a transformed function") -> Any:
    """Outside any trace, run what a transform built (a FloatingPointError naming `what` for a NaN / infinity in
    it, with debug_nans / debug_infs on); inside one, leave it lazy."""
    if state.depth: return tree
    tree = _realize_tree(tree)
    if (config.debug_nans or config.debug_infs) and (bad := special_values(tree, what)) is not None:
        raise FloatingPointError(at_user_line(bad))
    return tree


# ---- maths shared by the rules ----

def product_of_others(x: Array, axes: tuple[int, ...]) -> Array:
    """For each element, the product of the other elements of its reduction group (exact with zeros)."""
    keep = [i for i in range(x.ndim) if i not in axes]
    moved = lax.transpose(x, keep + list(axes))
    n = int(math.prod(x.shape[a] for a in axes))
    flat = jnp.reshape(moved, tuple(x.shape[i] for i in keep) + (n,))
    ones = jnp.ones(flat.shape[:-1] + (1,), flat.dtype)
    before = jnp.concatenate([ones, lax.cumprod(flat, axis=flat.ndim - 1)[..., :-1]], axis=-1)
    suffix = lax.cumprod(jnp.flip(flat, -1), axis=flat.ndim - 1)[..., :-1]
    after = jnp.flip(jnp.concatenate([ones, suffix], axis=-1), -1)
    others = jnp.reshape(before * after, moved.shape)
    inverse = np.argsort(keep + list(axes))
    return lax.transpose(others, tuple(int(i) for i in inverse))
