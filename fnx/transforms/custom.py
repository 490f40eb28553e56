"""Functions with their own derivative rules (custom_jvp, custom_vjp) and rematerialization (checkpoint).

Each call becomes one CALL node: CALL(TUPLE(body outputs), args...) with the rule object as its arg, and the
outputs are GETTUPLE(CALL, i). Lowering inlines the body (callify); the autodiff transforms look the rule up:

- custom_jvp: forward mode calls the user's jvp; reverse mode transposes it (the jvp is linear in the tangents,
  so the cotangents of the arguments are the vjp of `tangents -> jvp(primals, tangents)[1]`).
- custom_vjp: reverse mode calls fwd then bwd; forward mode raises, as in JAX.
- checkpoint: reverse mode recomputes the body from its arguments (kept behind CONTIGUOUS so the recomputation
  is not merged with the forward pass by hash-consing) instead of keeping the forward intermediates.
"""
from __future__ import annotations

import functools
import itertools
from dataclasses import dataclass, field
from typing import Any, Callable, Container, Sequence

from fnx import dtypes, lax, tree_util
from fnx.errors import UnexpectedTracerError, at_user_line
from fnx.rewrite import substitute
from fnx.trace import Array, LRUCache, _device_of, _realize_tree, abstract_leaf, building, inline, state, trace
from fnx.uop import Ops, ParamArg, UOp

_serial = itertools.count()


@dataclass(eq=False)
class CustomRule:
    """The arg of a CALL node: which rule, the user's functions, and the static (non-differentiable) arguments."""
    kind: str                         # "jvp" | "vjp" | "checkpoint"
    fun: Callable
    in_tree: Any
    out_tree: Any
    jvp: Callable | None = None
    fwd: Callable | None = None
    bwd: Callable | None = None
    static: tuple = ()                # (position, value) of nondiff arguments
    tag: tuple = field(default=())

    def dynamic_args(self, leaves: Sequence[Any]) -> tuple:
        """The dynamic (differentiable) arguments rebuilt from their leaves."""
        return tuple(tree_util.tree_unflatten(self.in_tree, list(leaves)))

    @property
    def static_values(self) -> list:
        return [v for _, v in self.static]

    def full_args(self, dynamic: Sequence[Any]) -> list:
        """The user's full argument list: the static arguments at their positions, `dynamic` in the others."""
        return with_static(self.static, dynamic)

    def apply_jvp(self, primals: list[Array], tangents: list[Array | None]) -> tuple[list[Array], list[Array]]:
        """(output leaves, output tangent leaves) of the user's jvp at `primals` along `tangents` (None: zero)."""
        zeros = [t if t is not None else lax.full(p.shape, 0, p.uop.dtype) for t, p in zip(tangents, primals)]
        out, tout = self.jvp(*self.static_values, self.dynamic_args(primals), self.dynamic_args(zeros))
        return ([lax.to_array(o) for o in tree_util.tree_leaves(out)],
                [lax.to_array(t) for t in tree_util.tree_leaves(tout)])

    def __hash__(self) -> int: return id(self)


def with_static(static: tuple, dynamic: Sequence[Any]) -> list:
    """A full argument list: each (position, value) of `static` at its position, `dynamic` in order around them."""
    positions, it = dict(static), iter(dynamic)
    return [positions[i] if i in positions else next(it) for i in range(len(positions) + len(dynamic))]


def _call(kind: str, fun: Callable, args: tuple, nondiff_argnums: tuple, serial: int, pure: bool = False,
          **rules) -> Any:
    """Trace `fun` on the dynamic arguments and return the GETTUPLE outputs of a CALL node. A `pure` function's
    abstract trace (under jit) is kept per argument structure, types and devices (`_traces`)."""
    static = tuple((i, args[i]) for i in nondiff_argnums)
    dynamic = tuple(a for i, a in enumerate(args) if i not in nondiff_argnums)
    leaves, in_tree = tree_util.tree_flatten(dynamic)

    def body(*dyn):
        return fun(*with_static(static, dyn))
    key = _trace_key(serial, in_tree, leaves, static) if pure and state.tracing else None
    if key is None or (traced := _traces.get(key)) is None:
        traced = trace(body, dynamic, transform=True, tag=("custom", serial),
                       kind=f"{kind} of {getattr(fun, '__name__', 'a function')}")
        if key is not None: _traces.put(key, traced)
    rule = _rules_cache(kind, fun, traced.in_tree, traced.out_tree, static, serial, rules)
    arg_uops = [_leaf(x, p) for x, p in zip(leaves, traced.fn.src[1:])]
    body = traced.body
    if kind == "checkpoint" and (free := free_params(body, ("custom", serial))):
        # closure conversion: values of an enclosing trace that the function closed over become arguments of the
        # call, so that differentiating the call differentiates them too (their gradient was silently lost)
        hoisted = [UOp(Ops.PARAM, p.dtype, (), ParamArg(len(arg_uops) + i, p.arg.shape, p.arg.device,
                                                        ("custom", serial))) for i, p in enumerate(free)]
        body = substitute(body, dict(zip(free, hoisted)))
        arg_uops += free
    call = UOp(Ops.CALL, dtypes.bool_, (body, *arg_uops), rule)
    outs = [Array(UOp(Ops.GETTUPLE, o.dtype, (call,), i), w)
            for i, (o, w) in enumerate(zip(traced.body.src, traced.out_weak))]
    out = tree_util.tree_unflatten(traced.out_tree, outs)
    return _realize_tree(out) if not state.depth else out


_rules = LRUCache(4096)  # bounded: a checkpoint made anew each step (a new serial) must not pin its closures forever
# the abstract traces of fnx's own custom_jvp functions (exp, log, tanh, ...): a function of its arguments alone,
# so one trace per signature serves every call and its rule's call (W4 step's trace 8.7 -> 7.4 ms, GPT's 64 -> 54)
_traces = LRUCache(4096)


def clear_traces() -> None:
    """Forget the kept traces of fnx's own custom_jvp functions (fnx.clear_caches)."""
    with _traces.lock: _traces.entries.clear()


def _trace_key(serial: int, in_tree: Any, leaves: list, static: tuple) -> tuple | None:
    """What a pure function's trace depends on: its arguments' structure, types and devices, the static
    arguments and the x64 mode (None when a static argument cannot be hashed)."""
    avals = tuple((*abstract_leaf(x), _device_of(x)) for x in leaves)
    static = _hashable(static)
    if not isinstance(static, tuple): return None
    return serial, in_tree, avals, static, state.default_device, dtypes.x64_enabled()


def free_params(body: UOp, own: tuple) -> list[UOp]:
    """The PARAMs that `body` reads but that neither its call (tag `own`) nor a node inside it binds: values of
    an enclosing trace the function closed over."""
    nodes = body.toposort
    bound = {own} | {b for u in nodes if (b := u.binds) is not None}
    return [u for u in nodes if u.op is Ops.PARAM and u.arg.tag not in bound]


def refuse_closure(call: UOp, carried: Container[UOp], transform: str) -> None:
    """A custom_vjp / custom_jvp whose function closed over a value `transform` differentiates (one of `carried`)
    would lose that value's derivative (its rule gives derivatives for its arguments only): JAX's
    UnexpectedTracerError, naming the function and the remedy."""
    rule = call.arg
    if getattr(rule, "kind", None) not in ("vjp", "jvp"): return
    found = next((v for v in call.src[0].toposort if v in carried), None)
    if found is None: return
    name = getattr(rule.fun, "__name__", "function")
    raise UnexpectedTracerError(at_user_line(
        f"custom_{rule.kind} {name} closes over a value that {transform} differentiates (shape {found.shape}, "
        f"{found.dtype}), which its rule cannot differentiate: pass it to {name} as an argument (and give its "
        f"derivative in the rule), as JAX requires (jax.closure_convert)"))


def closure_convert(fun: Callable, *example_args: Any) -> tuple[Callable, list[Array]]:
    """`(converted, consts)` with `converted(*args, *consts) == fun(*args)`: the values of enclosing traces that
    `fun` closes over (a transform's or jit's arguments and what is computed from them) become explicit arguments,
    as jax.closure_convert, so that a custom_vjp / custom_jvp given them as arguments can differentiate them.
    Closed-over concrete arrays stay constants; with nothing to convert, `consts` is empty.

    Example:
      >>> def outer(a):
      ...     f, consts = fnx.closure_convert(lambda x: x * a, 2.0)   # consts == [a]
      ...     return f(2.0, *consts)
    """
    tag = ("closure", next(_serial))
    traced = trace(fun, example_args, transform=True, tag=tag,
                   kind=f"closure_convert of {getattr(fun, '__name__', 'a function')}")
    free = free_params(traced.body, tag)
    consts = [Array(p) for p in free]
    outs = list(traced.body.src)

    def converted(*args_and_consts):
        args, given = args_and_consts[:len(args_and_consts) - len(free)], args_and_consts[len(args_and_consts)
                                                                                           - len(free):]
        leaves, in_tree = tree_util.tree_flatten(args)
        if in_tree != traced.in_tree or len(given) != len(free):
            raise TypeError(at_user_line(f"closure_convert: the converted function takes arguments structured as "
                                         f"{traced.in_tree} and then {len(free)} consts; got {in_tree} and "
                                         f"{len(given)}"))
        with building():
            mapping = {p: lax.to_array(c, p.dtype).uop for p, c in zip(free, given)}
            body = substitute(UOp(Ops.TUPLE, dtypes.bool_, tuple(outs)), mapping) if mapping else None
            values = inline(traced, list(body.src) if body is not None else outs, leaves)
            out = tree_util.tree_unflatten(traced.out_tree, [Array(u, w) for u, w in zip(values, traced.out_weak)])
        return _realize_tree(out) if not state.depth else out
    return converted, consts


def _rules_cache(kind, fun, in_tree, out_tree, static, serial, rules) -> CustomRule:
    """One rule object per (function, structure, static args), so equal calls build equal (cacheable) graphs."""
    key = (serial, in_tree, out_tree, _hashable(static))
    if (rule := _rules.get(key)) is None:
        rule = _rules.put(key, CustomRule(kind, fun, in_tree, out_tree, static=static, tag=("custom", serial), **rules))
    return rule


def _hashable(static: tuple) -> Any:
    try:
        hash(static)
        return static
    except TypeError:
        return id(static)


def _leaf(x: Any, param: UOp) -> UOp:
    return x.uop if isinstance(x, Array) else lax.to_array(x, param.dtype).uop


class custom_jvp:
    """A function with a custom forward-mode derivative (reverse mode transposes it), like jax.custom_jvp.

    Example:
      >>> @fnx.custom_jvp
      ... def f(x): return jnp.sin(x)
      >>> @f.defjvp
      ... def f_jvp(primals, tangents):
      ...     (x,), (t,) = primals, tangents
      ...     return jnp.sin(x), jnp.cos(x) * t
    """

    def __init__(self, fun: Callable, nondiff_argnums: Sequence[int] = ()):
        self.fun, self.nondiff_argnums, self.jvp = fun, tuple(nondiff_argnums), None
        self.serial = next(_serial)
        self.pure = False  # (fnx's own functions: see `pure`)
        functools.update_wrapper(self, fun)

    def defjvp(self, jvp: Callable) -> Callable:
        self.jvp = jvp
        return jvp

    def __call__(self, *args):
        if self.jvp is None:
            raise AttributeError(at_user_line(f"custom_jvp {self.fun.__name__} has no jvp rule: call .defjvp first"))
        with building():
            out = _call("jvp", self.fun, args, self.nondiff_argnums, self.serial, self.pure, jvp=self.jvp)
        return _realize_tree(out) if not state.depth else out


def pure(fun: custom_jvp) -> custom_jvp:
    """`fun` marked as a function of its arguments alone (no global state, no closed-over traced values, no
    Python branch on values): under jit its trace for a signature is made once and reused. For fnx's own
    elementwise functions; a user's custom_jvp is traced at every call, as in JAX."""
    fun.pure = True
    return fun


class custom_vjp:
    """A function with a custom reverse-mode derivative, like jax.custom_vjp: `f.defvjp(fwd, bwd)` where
    `fwd(*args) -> (out, residuals)` and `bwd(residuals, cotangent) -> tuple of cotangents per argument`."""

    def __init__(self, fun: Callable, nondiff_argnums: Sequence[int] = ()):
        self.fun, self.nondiff_argnums, self.fwd, self.bwd = fun, tuple(nondiff_argnums), None, None
        self.serial = next(_serial)
        functools.update_wrapper(self, fun)

    def defvjp(self, fwd: Callable, bwd: Callable) -> None:
        self.fwd, self.bwd = fwd, bwd

    def __call__(self, *args):
        if self.fwd is None:
            raise AttributeError(at_user_line(f"custom_vjp {self.fun.__name__} has no rule: call .defvjp first"))
        with building():
            out = _call("vjp", self.fun, args, self.nondiff_argnums, self.serial, fwd=self.fwd, bwd=self.bwd)
        return _realize_tree(out) if not state.depth else out


def checkpoint(fun: Callable, *, prevent_cse: bool = True, policy: Callable | None = None,
               static_argnums: int | Sequence[int] = ()) -> Callable:
    """Rematerialize `fun` in the backward pass: its intermediates are recomputed from its inputs instead of
    being kept from the forward pass (jax.checkpoint / jax.remat).

    `prevent_cse` and `policy` are accepted as JAX's: fnx always keeps the recomputation apart from the forward
    pass and recomputes every intermediate (JAX's `nothing_saveable`); a policy changes what JAX keeps in
    memory, never the values, so results are the same under any policy."""
    static_argnums = (static_argnums,) if isinstance(static_argnums, int) else tuple(static_argnums)
    serial = next(_serial)

    @functools.wraps(fun)
    def wrapped(*args):
        with building():
            out = _call("checkpoint", fun, args, tuple(static_argnums), serial)
        return _realize_tree(out) if not state.depth else out
    return wrapped


remat = checkpoint
