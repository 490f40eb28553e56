"""lax.custom_root: a root of a function found by any solver, differentiated by the implicit function theorem
instead of through the solver's iterations; fnx.lax re-exports the names in `__all__`.

At the root x* of f(x, θ) = 0 (θ: what f closes over), ∂f/∂x · dx* + ∂f/∂θ · dθ = 0, so dx* solves the linear
system (∂f/∂x) dx* = -(∂f/∂θ) dθ, which the user's `tangent_solve` solves. The closed-over values θ become explicit
arguments (`closure_convert`) of a custom_jvp whose rule is that solve; reverse mode transposes it (so
`tangent_solve` must be made of differentiable fnx operations, as a `jnp.linalg.solve` or a division is). The
solver itself is never differentiated: it may iterate in Python or in a while_loop.
"""
from __future__ import annotations

from typing import Any, Callable

from fnx import lax as _lax
from fnx import numpy as jnp
from fnx import tree_util
from fnx.transforms.custom import closure_convert, custom_jvp
from fnx.transforms.jvp import jvp

__all__ = ["custom_root"]


def custom_root(f: Callable, initial_guess: Any, solve: Callable, tangent_solve: Callable,
                has_aux: bool = False) -> Any:
    """jax.lax.custom_root: `solve(f, initial_guess)`, a root of `f`, with derivatives from the implicit function
    theorem (module docstring).

    Args:
      f: the function whose root is sought (a pytree to a pytree of the same structure); it may close over the
        values being differentiated.
      initial_guess: where the solver starts (its derivative is zero).
      solve: `solve(f, initial_guess)` returns the root (and aux, with `has_aux`).
      tangent_solve: `tangent_solve(g, y)` returns x with g(x) = y for the linear function g (f's derivative in
        x at the root), e.g. `lambda g, y: y / g(1.0)` for scalars.
      has_aux: `solve` returns `(root, aux)`; aux gets no derivative.

    Example:
      >>> sqrt = lambda a: lax.custom_root(lambda x: x * x - a, 1.0, newton, lambda g, y: y / g(1.0))
      >>> fnx.grad(sqrt)(2.0)    # 1 / (2 sqrt(2)), whatever newton's iterations did
    """
    f_closed, consts = closure_convert(f, initial_guess)
    # the solver may close over the same values (through f, or its own): they are arguments too, whose tangents
    # the rule ignores, as JAX's (the root's derivative comes from f alone)
    solve_closed, solve_consts = closure_convert(lambda guess: solve(f, guess), initial_guess)
    n = len(consts)

    @custom_jvp
    def root(guess, *closed):
        return solve_closed(guess, *closed[n:])

    @root.defjvp
    def root_jvp(primals, tangents):
        guess, *closed = primals
        out = root(guess, *closed)
        solution = out[0] if has_aux else out
        closed = closed[:n]
        if closed:  # (∂f/∂θ) dθ at the root
            _, moved = jvp(lambda *c: f_closed(solution, *c), tuple(closed), tuple(tangents[1:n + 1]))
        else:
            moved = tree_util.tree_map(jnp.zeros_like, solution)
        linear = lambda v: jvp(lambda x: f_closed(x, *closed), (solution,), (v,))[1]  # noqa: E731  (∂f/∂x)
        step = tangent_solve(linear, tree_util.tree_map(lambda m: -m, moved))
        if has_aux: return out, (step, tree_util.tree_map(jnp.zeros_like, out[1]))
        return out, step

    return root(initial_guess, *consts, *solve_consts)


_lax._extend({name: globals()[name] for name in __all__})
