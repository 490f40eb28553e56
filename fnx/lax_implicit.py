"""lax.custom_root and lax.custom_linear_solve: a root (a linear system's solution) found by any solver,
differentiated by the implicit function theorem instead of through the solver's iterations; fnx.lax re-exports the
names in `__all__`.

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
from fnx.errors import UnsupportedError, at_user_line
from fnx.transforms.custom import closure_convert, custom_jvp, custom_vjp
from fnx.transforms.grad import vjp
from fnx.transforms.jvp import jvp

__all__ = ["custom_linear_solve", "custom_root"]


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


def custom_linear_solve(matvec: Callable, b: Any, solve: Callable, transpose_solve: Callable | None = None,
                        symmetric: bool = False, has_aux: bool = False) -> Any:
    """jax.lax.custom_linear_solve: `solve(matvec, b)`, the x with matvec(x) = b, differentiated as A^-1 b rather
    than through the solver: the cotangent of b is `transpose_solve(vecmat, x_bar)` (`solve` itself when
    `symmetric`), and what `matvec` closes over gets -(x_bar_b)^T (dA x). Reverse mode (grad, vjp) only: forward
    mode is an error, as for any custom_vjp in fnx; without `transpose_solve` and not `symmetric`, the gradient is
    an error as in JAX.

    Example:
      >>> x = lax.custom_linear_solve(lambda v: a @ v, b, lambda mv, r: jnp.linalg.solve(a, r), symmetric=True)
    """
    # every function the rules call gets what it closes over as arguments: bwd runs after the forward trace ended
    mv_closed, mv_consts = closure_convert(matvec, b)
    solve_closed, solve_consts = closure_convert(lambda r: solve(matvec, r), b)
    if symmetric:
        transpose_closed, transpose_consts = solve_closed, solve_consts
    elif transpose_solve is not None:
        def vecmat(ct):  # the transpose of matvec (linear in x: its pullback at any point)
            return vjp(matvec, b)[1](ct)[0]
        transpose_closed, transpose_consts = closure_convert(lambda r: transpose_solve(vecmat, r), b)
    else:
        transpose_closed, transpose_consts = None, []
    n, m = len(mv_consts), len(solve_consts)

    @custom_vjp
    def linear_solve(rhs, *closed):
        return solve_closed(rhs, *closed[n:n + m])

    def fwd(rhs, *closed):
        out = linear_solve(rhs, *closed)
        return out, (out[0] if has_aux else out, closed)

    def bwd(residuals, ct):
        x, closed = residuals
        if transpose_closed is None:
            raise UnsupportedError(at_user_line("custom_linear_solve: differentiating it in reverse mode needs "
                                                "transpose_solve, or symmetric=True"))
        x_bar = ct[0] if has_aux else ct
        b_bar = transpose_closed(x_bar, *closed[n + m:])
        if has_aux: b_bar = b_bar[0]  # (transpose_solve returns aux too, as solve does)
        # d(A^-1 b) = -A^-1 (dA) x: what matvec closes over gets -b_bar^T (dA x)
        moved = vjp(lambda *c: mv_closed(x, *c), *closed[:n])[1](tree_util.tree_map(lambda g: -g, b_bar)) if n \
            else ()
        return (b_bar, *moved, *[jnp.zeros_like(c) for c in closed[n:]])

    linear_solve.defvjp(fwd, bwd)
    return linear_solve(b, *mv_consts, *solve_consts, *transpose_consts)


_lax._extend({name: globals()[name] for name in __all__})
