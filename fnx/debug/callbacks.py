"""Host callbacks: Python called with array values while a function runs (fnx.debug.print, fnx.debug.callback,
fnx.pure_callback).

fnx has no compiled form of a callback (no CALLBACK primitive yet), so a callback runs where values are concrete:

- eagerly, and under grad / jvp outside jit (their traces see the concrete values): at once;
- under jit: the trace notes the callback (`callbacks.met`) and jit runs that signature op by op from then
  on, so the callback sees each call's values, in program order;
- under eval_shape and make_jaxpr: skipped (pure_callback gives placeholder zeros of its declared shapes);
- under vmap and inside control-flow bodies (lax.cond, scan, while_loop, fori_loop): UnsupportedError naming the
  callback and the transform.
"""
from __future__ import annotations

import builtins
import threading
from typing import Any, Callable

import numpy as np

from fnx import tree_util
from fnx.errors import UnsupportedError, at_user_line
from fnx.trace import Array, as_array, state, to_array, with_weak
from fnx.uop import Ops

_SKIPPED_UNDER = ("make_graph of", "eval_shape of")   # traces for shapes only: callbacks do not run
_DIFFERENTIATING = ("vjp of", "jvp of")                 # grad, jacrev, jacfwd, hessian, jvp, linearize


class _CallbackState(threading.local):
    """Per thread: how deep we are in jit traces (fnx.transforms.jit sets it) and how many callbacks they met."""

    def __init__(self):
        self.jit_tracing = 0
        self.met = 0


callbacks = _CallbackState()


def run_on_host(name: str, call: Callable[[], Any], placeholder: Callable[[], Any], args: Any = (),
                differentiable: bool = True) -> Any:
    """`call()` now when the values are concrete; under jit, note the callback (jit then runs the function op by op)
    and return `placeholder()`; raise UnsupportedError naming `name` where it cannot run (vmap, control flow).

    `differentiable=False` (pure_callback): ValueError when `args` depend on the inputs of an enclosing grad/jvp, as
    JAX raises (the callback's result would be a constant with a zero derivative).
    """
    kind = state.trace.kind if state.trace is not None else "a trace"
    if not state.tracing:
        if not differentiable and state.bindings and kind.startswith(_DIFFERENTIATING) and _depends_on_inputs(args):
            raise ValueError(at_user_line(
                f"{name}: pure callbacks cannot be differentiated ({kind} differentiates through one); wrap the "
                "callback in fnx.custom_jvp or fnx.custom_vjp to give its derivative"))
        return call()
    if callbacks.jit_tracing:
        callbacks.met += 1
        return placeholder()
    if kind.startswith(_SKIPPED_UNDER):
        return placeholder()
    raise UnsupportedError(at_user_line(
        f"{name} under {kind}: fnx runs host callbacks only where values are concrete (eagerly, under jit by running "
        "the function op by op, and under grad/jvp); not under vmap or inside lax control-flow bodies. Call it "
        "outside the vmapped function or loop body"))


def _depends_on_inputs(args: Any) -> bool:
    """Whether any array in `args` is computed from the PARAMs a transform bound to concrete values."""
    return any(isinstance(x, Array) and x._buffer is None and any(
        u.op is Ops.PARAM and u in state.bindings for u in x.uop.toposort) for x in tree_util.tree_leaves(args))


def concrete(tree: Any) -> Any:
    """`tree` with every Array leaf as a concrete, strongly typed Array (values computed under grad's bindings; JAX
    hands callbacks strongly typed arrays), other leaves as they are."""
    def leaf(x: Any) -> Any:
        if not isinstance(x, Array): return x
        return with_weak(x if x.is_concrete else as_array(np.asarray(x)), False)
    return tree_util.tree_map(leaf, tree)


def print(fmt: str, *args: Any, ordered: bool = False, **kwargs: Any) -> None:  # noqa: A001
    """Print `fmt.format(*args, **kwargs)` with the arrays' values when the function runs, also under jit and grad
    (where Python's `print` shows only traced values), as jax.debug.print.

    Args:
      fmt: a format string with `{}` / `{name}` placeholders.
      *args, **kwargs: pytrees of arrays (or other values) to format.
      ordered: accepted for JAX compatibility; fnx prints in program order always.

    Example:
      >>> fnx.jit(lambda x: fnx.debug.print("x = {}", x))(jnp.arange(3.0))
      x = [0. 1. 2.]
    """
    del ordered
    run_on_host("fnx.debug.print",
                lambda: builtins.print(fmt.format(*concrete(args), **concrete(kwargs))),
                lambda: None)


def callback(callback: Callable[..., Any], *args: Any, ordered: bool = False, partitioned: bool = False,
             **kwargs: Any) -> None:
    """Call `callback(*args, **kwargs)` with the arrays' values when the function runs (also under jit and grad),
    for its side effects; its result is ignored, as jax.debug.callback.

    Args:
      callback: a Python function of concrete Arrays.
      *args, **kwargs: pytrees of arrays passed to it.
      ordered, partitioned: accepted for JAX compatibility (fnx calls it in program order, on whole arrays).

    Example:
      >>> fnx.jit(lambda x: fnx.debug.callback(lambda v: seen.append(v), x) or x)(1.0)
    """
    del ordered, partitioned
    def call() -> None:
        callback(*concrete(args), **concrete(kwargs))
    run_on_host(f"fnx.debug.callback({getattr(callback, '__name__', 'callback')})", call, lambda: None)


def host_arguments(args: Any) -> Any:
    """The arguments of a pure callback: every leaf a concrete Array (Python scalars become weakly typed ones)."""
    return tree_util.tree_map(lambda x: x if isinstance(x, Array) else to_array(x), concrete(args))
