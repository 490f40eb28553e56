"""check_grads: numerical checks of fnx's forward and reverse mode, like jax.test_util.check_grads.

Everything runs in float64. Forward mode is compared against central finite differences along a random
direction; reverse mode against forward mode through the dot-product identity <vjp(u), v> = <u, jvp(v)>
(against finite differences when forward mode is not checked). With `order` > 1 the same checks are applied to
the jvp and vjp functions themselves, so higher derivatives are checked too.

    check_grads(lambda x, y: jnp.sin(x) * y, (x, y), order=2)
"""
from __future__ import annotations

from typing import Any, Callable, Sequence

import numpy as np

import fnx
from fnx import tree_util


def _is_float(x: Any) -> bool:
    return np.issubdtype(np.asarray(x).dtype, np.floating)


def _as_float64(tree: Any) -> Any:
    """Float leaves as float64 numpy arrays; other leaves (integer indices, bools) as they are."""
    return tree_util.tree_map(lambda x: np.asarray(x, np.float64) if _is_float(x) else np.asarray(x), tree)


def _numpy(tree: Any) -> Any:
    return tree_util.tree_map(lambda x: np.asarray(x), tree)


def _random_like(tree: Any, rng: np.random.Generator) -> Any:
    """A random direction shaped like `tree` (zero on the non-float leaves, which carry no derivative)."""
    return tree_util.tree_map(lambda x: rng.standard_normal(np.shape(x)) if _is_float(x) else np.zeros_like(x), tree)


def _step(tree: Any, direction: Any, scale: float) -> Any:
    return tree_util.tree_map(lambda x, d: x + scale * d if _is_float(x) else x, tree, direction)


def _inner(xs: Any, ys: Any) -> float:
    """Sum of the elementwise products over the float leaves of two equally shaped pytrees."""
    total = 0.0
    for x, y in zip(tree_util.tree_leaves(xs), tree_util.tree_leaves(ys)):
        x, y = np.asarray(x), np.asarray(y)
        assert x.shape == y.shape, f"leaf shapes differ: {x.shape} vs {y.shape}"
        if _is_float(x) and _is_float(y):
            total += float(np.sum(x.astype(np.float64) * y.astype(np.float64)))
    return total


def _assert_close(actual: Any, expected: Any, rtol: float, atol: float, what: str) -> None:
    actual_leaves, expected_leaves = tree_util.tree_leaves(actual), tree_util.tree_leaves(expected)
    assert len(actual_leaves) == len(expected_leaves), f"{what}: {len(actual_leaves)} vs {len(expected_leaves)} leaves"
    for a, e in zip(actual_leaves, expected_leaves):
        a, e = np.asarray(a), np.asarray(e)
        assert a.shape == e.shape, f"{what}: shape {a.shape} != {e.shape}"
        if _is_float(e):
            np.testing.assert_allclose(a.astype(np.float64), e, rtol=rtol, atol=atol, err_msg=what)


def numerical_jvp(f: Callable, args: tuple, tangents: tuple, eps: float) -> Any:
    """Central finite difference (f(x + eps t) - f(x - eps t)) / (2 eps), leaf by leaf."""
    plus = _numpy(f(*_step(args, tangents, eps)))
    minus = _numpy(f(*_step(args, tangents, -eps)))
    return tree_util.tree_map(lambda p, m: (p - m) / (2 * eps) if _is_float(p) else np.zeros(np.shape(p)),
                              plus, minus)


def check_jvp(f: Callable, args: tuple, eps: float, rtol: float, atol: float, rng: np.random.Generator) -> None:
    """fnx.jvp's primal output equals f(*args) and its tangent equals the central finite difference."""
    tangents = _random_like(args, rng)
    out, tangent_out = fnx.jvp(f, args, tangents)
    _assert_close(out, _numpy(f(*args)), rtol, atol, "jvp primal output != f(*args)")
    _assert_close(tangent_out, numerical_jvp(f, args, tangents, eps), rtol, atol,
                  "jvp tangent != central finite difference")


def check_vjp(f: Callable, args: tuple, eps: float, rtol: float, atol: float, rng: np.random.Generator,
              against_jvp: bool) -> None:
    """<vjp(u), v> == <u, jvp(v)> for random u, v (jvp by fnx.jvp, or by finite differences)."""
    out, pullback = fnx.vjp(f, *args)
    _assert_close(out, _numpy(f(*args)), rtol, atol, "vjp primal output != f(*args)")
    cotangent = _random_like(_numpy(out), rng)
    cotangent_in = pullback(cotangent)
    assert isinstance(cotangent_in, tuple) and len(cotangent_in) == len(args), "vjp_fn returns one entry per primal"
    for g, a in zip(tree_util.tree_leaves(cotangent_in), tree_util.tree_leaves(args)):
        assert np.shape(g) == np.shape(a), f"cotangent shape {np.shape(g)} != primal shape {np.shape(a)}"
    tangents = _random_like(args, rng)
    tangent_out = fnx.jvp(f, args, tangents)[1] if against_jvp else numerical_jvp(f, args, tangents, eps)
    lhs, rhs = _inner(cotangent_in, tangents), _inner(cotangent, tangent_out)
    np.testing.assert_allclose(lhs, rhs, rtol=rtol, atol=atol, err_msg="<vjp(u), v> != <u, jvp(v)>")


def check_grads(f: Callable, args: Sequence[Any], order: int = 2, modes: Sequence[str] = ("fwd", "rev"),
                eps: float = 1e-4, rtol: float = 1e-4, atol: float = 1e-4, seed: int = 0) -> None:
    """Check fnx's derivatives of `f` at `args` up to `order` (like jax.test_util.check_grads).

    Args:
      f: a function of arrays (pytrees) returning arrays (pytrees).
      args: the point, a sequence of positional arguments; float leaves are converted to float64.
      order: how many times to differentiate (2 also checks the jvp and vjp functions' own derivatives).
      modes: "fwd" (jvp against finite differences), "rev" (vjp against jvp or finite differences).
      eps, rtol, atol: the finite-difference step and the tolerances.

    Example:
      >>> check_grads(lambda x: jnp.sin(x) ** 2, (np.linspace(0, 1, 4),), order=2)
    """
    args = _as_float64(tuple(args))
    rng = np.random.default_rng(seed)
    n = len(args)
    if "fwd" in modes:
        check_jvp(f, args, eps, rtol, atol, rng)
        if order > 1:
            tangents = _random_like(args, rng)

            def f_jvp(*primals_and_tangents):
                return fnx.jvp(f, primals_and_tangents[:n], primals_and_tangents[n:])
            check_grads(f_jvp, args + tangents, order - 1, modes, eps, rtol, atol, seed + 1)
    if "rev" in modes:
        check_vjp(f, args, eps, rtol, atol, rng, against_jvp="fwd" in modes)
        if order > 1:
            cotangent = _random_like(_numpy(f(*args)), rng)

            def f_vjp(*primals_and_cotangent):
                return fnx.vjp(f, *primals_and_cotangent[:n])[1](primals_and_cotangent[n])
            check_grads(f_vjp, args + (cotangent,), order - 1, modes, eps, rtol, atol, seed + 2)


# ---- one small smooth function per float primitive, shared by test_grad.py (reverse) and test_jvp.py (forward) ----

def _primitive_cases() -> list[tuple[str, Callable, tuple, dict]]:
    """(primitive, function built on fnx.lax, arguments where it is smooth, check_grads options)."""
    from fnx import lax
    from fnx.trace import Array
    from fnx.uop import Ops, UOp

    rng = np.random.default_rng(0)
    pos = rng.uniform(0.5, 1.5, (3, 4))            # LOG2, SQRT, RECIP, DIV denominators
    sig = rng.standard_normal((3, 4))
    gap = np.where(rng.random((3, 4)) < 0.5, -1.0, 1.0) * rng.uniform(0.2, 0.6, (3, 4))
    distinct = rng.permutation(12).reshape(3, 4) / 4.0 - 1.0   # no ties, at least 0.25 apart
    with_zero = pos.copy()
    with_zero[1, 2] = 0.0                          # a product with a zero factor is still smooth
    numer = np.array([[0.3, 2.5, -1.1, 3.7], [-0.5, 1.3, 4.4, -2.9], [0.9, -3.3, 1.9, 0.1]])
    denom = np.array([[2.0, 2.0, 1.5, 1.6], [1.7, 1.0, 1.9, 1.3], [-2.0, 1.4, 1.2, 0.7]])  # x / y never near an integer
    small = rng.standard_normal((2, 3, 4))
    col = rng.standard_normal((3, 1))
    row = rng.standard_normal((4,))
    rows = rng.standard_normal((5, 3))
    gather_idx = np.array([2, 0, 2, 5])            # repeated, and 5 is clamped to 3 as in JAX
    scatter_idx = np.array([3, 0, 7])              # 7 is out of range: dropped
    add_idx = np.array([1, 1, 4])                  # repeated indices accumulate
    upd = rng.standard_normal((3, 3))

    def via_uop(op: Ops, *xs: Array, arg=None) -> Array:
        return Array(UOp(op, xs[0].uop.dtype, tuple(x.uop for x in xs), arg))

    cases = [
        ("ADD", lambda x, y: lax.mul(lax.add(x, y), x), (sig, pos)),
        ("MUL", lambda x, y: lax.mul(x, y), (sig, pos)),
        ("DIV", lambda x, y: lax.div(x, y), (sig, pos)),
        ("MAX", lambda x, y: lax.mul(lax.max(x, y), x), (sig, sig + gap)),
        ("MOD", lambda x, y: lax.rem(x, y), (numer, denom)),
        ("RECIP", lambda x: lax.recip(x), (pos,)),
        ("SQRT", lambda x: lax.sqrt(x), (pos,)),
        ("EXP2", lambda x: lax.exp2(x), (sig,)),
        ("LOG2", lambda x: lax.log2(x), (pos,)),
        ("SIN", lambda x: lax.sin(x), (sig,)),
        # complex values in between: JAX's convention makes these the real functions' derivatives
        # (a flip keeps each complex value a node: REAL of a COMPLEX folds away when the graph is built)
        ("COMPLEX", lambda x, y: lax.real(lax.mul(lax.rev(lax.complex(x, y), (0,)), lax.complex(lax.sin(y), x))),
         (sig, sig)),
        ("REAL", lambda x: lax.real(lax.rev(lax.exp(lax.complex(x, lax.mul(x, x))), (1,))), (sig,)),
        ("IMAG", lambda x: lax.imag(lax.rev(lax.div(lax.complex(lax.sin(x), x), lax.complex(x, lax.add(x, 2.0))),
                                            (0,))), (sig,)),
        ("TRUNC", lambda x: lax.mul(lax.trunc(x), x), (numer,)),
        ("CAST", lambda x: lax.mul(lax.convert_element_type(lax.convert_element_type(x, np.float32), np.float64), x),
         (sig,), {"eps": 1e-2, "rtol": 1e-3, "atol": 1e-3}),  # float32 rounding: a wider step
        ("WHERE", lambda x, y: lax.select(lax.lt(x, 0.0), lax.mul(x, y), lax.sin(y)), (sig + gap, pos)),
        ("RESHAPE", lambda x: lax.reshape(x, (4, 1, 3)), (sig,)),
        ("PERMUTE", lambda x: lax.transpose(x, (2, 0, 1)), (small,)),
        ("EXPAND", lambda c, r: lax.mul(lax.expand(c, (3, 4)), lax.broadcast_in_dim(r, (3, 4), (1,))), (col, row)),
        ("PAD", lambda x, v: lax.pad(x, v, [(1, 2, 0), (-1, 1, 1)]), (sig, np.float64(0.5))),
        ("SHRINK", lambda x: lax.slice(x, (1, 0), (3, 4), (1, 2)), (sig,)),
        ("FLIP", lambda x: lax.mul(lax.rev(x, (1,)), x), (sig,)),
        ("INDEX", lambda x, i: lax.mul(lax.gather_axis(x, i, 1), lax.gather_axis(x, i, 1)), (sig, gather_idx)),
        ("SCATTER(set)", lambda x, u: lax.scatter_axis(x, scatter_idx, u, 0, "set"), (rows, upd)),
        ("SCATTER(add)", lambda x, u: lax.scatter_axis(lax.mul(x, x), add_idx, lax.sin(u), 0, "add"), (rows, upd)),
        ("REDUCE(add)", lambda x: lax.reduce_sum(lax.mul(x, x), (1,)), (sig,)),
        ("REDUCE(max)", lambda x: lax.reduce_max(x, (0,)), (distinct,)),
        ("REDUCE(mul)", lambda x: lax.reduce_prod(x, (1,)), (with_zero,)),
        ("CONTIGUOUS", lambda x: lax.mul(via_uop(Ops.CONTIGUOUS, lax.sin(x)), x), (sig,)),
        ("COLLECTIVE", lambda x: fnx.vmap(lambda r: lax.mul(lax.psum(r, "i"), lax.sin(r)), axis_name="i")(x), (sig,)),
        ("COND", lambda x: lax.cond(lax.reduce_sum(x, (0, 1)) > 0, lambda a: lax.mul(lax.sin(a), a),
                                    lambda a: lax.mul(a, a), x), (sig,)),
        ("SCAN", lambda x: lax.scan(lambda c, row: (lax.add(lax.mul(c, row), lax.sin(row)), lax.mul(c, c)),
                                    lax.add(lax.mul(lax.reshape(lax.slice_in_dim(x, 0, 1), x.shape[1:]), 0.25), 0.5),
                                    x)[1], (sig,)),
    ]
    return [case if len(case) == 4 else case + ({},) for case in cases]


PRIMITIVE_CASES = _primitive_cases()
