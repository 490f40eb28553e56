"""fnx.test_util: check_grads, which compares a function's forward- and reverse-mode derivatives with central
finite differences along random directions (jax.test_util.check_grads), to any order.

    >>> fnx.test_util.check_grads(jnp.sin, (jnp.float32(0.3),), order=2)   # raises AssertionError if wrong
"""
from __future__ import annotations

from typing import Any, Callable, Sequence

import numpy as np

from fnx import dtypes, tree_util
from fnx.transforms.grad import vjp
from fnx.transforms.jvp import jvp

__all__ = ["check_grads", "check_jvp", "check_vjp"]

_EPS = {2: 2 ** -6, 4: 1e-3, 8: 1e-6}     # the finite-difference step by float width
_TOLERANCE = {2: 1e-1, 4: 2e-2, 8: 1e-5}  # a central difference's error is eps^2 f''' plus rounding / eps


def _leaves(tree: Any) -> list[np.ndarray]:
    return [np.asarray(x) for x in tree_util.tree_leaves(tree)]


def _width(args: Sequence[Any]) -> int:
    """The narrowest float width among the arguments as fnx computes them (float64 is float32 with x64 off)."""
    return min((dtypes.canonicalize(dtypes.from_numpy(np.asarray(x).dtype)).itemsize
                for x in tree_util.tree_leaves(args) if np.asarray(x).dtype.kind == "f"), default=8)


def _random_like(tree: Any, rng: np.random.Generator) -> Any:
    return tree_util.tree_map(lambda x: rng.standard_normal(np.shape(x)).astype(np.asarray(x).dtype), tree)


def _shifted(args: Sequence[Any], tangents: Sequence[Any], step: float) -> list:
    return [tree_util.tree_map(lambda a, t: (np.asarray(a, np.float64) + step * np.asarray(t, np.float64)).astype(
        np.asarray(a).dtype), a, t) for a, t in zip(args, tangents)]


def _numerical_jvp(f: Callable, args: Sequence[Any], tangents: Sequence[Any], eps: float) -> list[np.ndarray]:
    plus, minus = _leaves(f(*_shifted(args, tangents, eps))), _leaves(f(*_shifted(args, tangents, -eps)))
    return [(p.astype(np.float64) - m.astype(np.float64)) / (2 * eps) for p, m in zip(plus, minus)]


def _close(name: str, got: list, want: list, atol: float, rtol: float) -> None:
    for g, w in zip(got, want):
        g, w = np.asarray(g, np.float64), np.asarray(w, np.float64)
        if not np.allclose(g, w, atol=atol, rtol=rtol):
            raise AssertionError(f"check_grads: {name} differs from finite differences by up to "
                                 f"{np.max(np.abs(g - w)):.3g} (atol {atol:g}, rtol {rtol:g})\n  got  {g}\n  want {w}")


def check_jvp(f: Callable, f_jvp: Callable, args: Sequence[Any], atol: float | None = None,
              rtol: float | None = None, eps: float | None = None, seed: int = 0) -> None:
    """f_jvp(args, tangents) -> (out, out_tangents) agrees with central differences of f along random tangents."""
    width = _width(args)
    eps, atol, rtol = eps or _EPS[width], atol or _TOLERANCE[width], rtol or _TOLERANCE[width]
    tangents = [_random_like(a, np.random.default_rng(seed + i)) for i, a in enumerate(args)]
    out, out_tangents = f_jvp(tuple(args), tuple(tangents))
    _close("the primal output", _leaves(out), _leaves(f(*args)), atol, rtol)
    _close("the jvp", _leaves(out_tangents), _numerical_jvp(f, args, tangents, eps), atol, rtol)


def check_vjp(f: Callable, f_vjp: Callable, args: Sequence[Any], atol: float | None = None,
              rtol: float | None = None, eps: float | None = None, seed: int = 0) -> None:
    """f_vjp(*args) -> (out, pullback) satisfies <ct, J t> = <pullback(ct), t> for a random cotangent ct, J t by
    central differences. The tangent t is pullback(ct) itself (scaled to unit length): then a wrong pullback cannot
    hide in a small inner product of random vectors."""
    width = _width(args)
    eps, atol, rtol = eps or _EPS[width], atol or _TOLERANCE[width], rtol or _TOLERANCE[width]
    out, pullback = f_vjp(*args)
    cotangent = _random_like(out, np.random.default_rng(seed + 1000))
    pulled = pullback(cotangent)
    norm = lambda xs: np.sqrt(sum(float(np.sum(np.asarray(x, np.float64) ** 2)) for x in xs))  # noqa: E731
    size = norm(_leaves(pulled))
    if size > 0:  # t: the pullback scaled to unit length
        tangents = [tree_util.tree_map(lambda p, a: (np.asarray(p, np.float64) / size).astype(np.asarray(a).dtype),
                                       p, a) for p, a in zip(pulled, args)]
    else:  # (a zero pullback: check it along random directions)
        tangents = [_random_like(a, np.random.default_rng(seed + i)) for i, a in enumerate(args)]
    numerical = _numerical_jvp(f, args, tangents, eps)
    forward = sum(float(np.sum(c.astype(np.float64) * n)) for c, n in zip(_leaves(cotangent), numerical))
    backward = sum(float(np.sum(np.asarray(p, np.float64) * np.asarray(t, np.float64))) for p, t in
                   zip(_leaves(pulled), _leaves(tangents)))
    # in units of the largest of |ct| |J t|, |J^T ct| |t| and |ct| |t| (a derivative of size one)
    scale = max(norm(_leaves(cotangent)) * norm(numerical), size * norm(_leaves(tangents)),
                norm(_leaves(cotangent)) * norm(_leaves(tangents))) or 1.0
    _close("the vjp (as <ct, J t> = <J^T ct, t>)", [backward / scale], [forward / scale], atol, rtol)


def check_grads(f: Callable, args: Sequence[Any], order: int, modes: Sequence[str] = ("fwd", "rev"),
                atol: float | None = None, rtol: float | None = None, eps: float | None = None) -> None:
    """Check f's derivatives up to `order` in the `modes` ('fwd': jvp, 'rev': vjp) against central finite
    differences (jax.test_util.check_grads); raises AssertionError naming what differs and by how much.
    Tolerances and the step default by the inputs' float width (float32: eps 1e-3, tolerance 2e-2)."""
    args = tuple(args)
    for mode in modes:
        if mode not in ("fwd", "rev"): raise ValueError(f"check_grads: unknown mode {mode!r} ('fwd' or 'rev')")
    if "fwd" in modes:
        check_jvp(f, lambda a, t: jvp(f, a, t), args, atol, rtol, eps)
        if order > 1:
            def tangent_out(*both):
                half = len(both) // 2
                return jvp(f, both[:half], both[half:])[1]
            rng = np.random.default_rng(7)
            check_grads(tangent_out, args + tuple(_random_like(a, rng) for a in args), order - 1, ("fwd",), atol,
                        rtol, eps)
    if "rev" in modes:
        check_vjp(f, lambda *a: vjp(f, *a), args, atol, rtol, eps)
        if order > 1:
            cotangent = _random_like(f(*args), np.random.default_rng(11))

            def pulled(*a):
                return vjp(f, *a)[1](cotangent)
            check_grads(pulled, args, order - 1, ("rev",), atol, rtol, eps)
