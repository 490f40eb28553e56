"""Rules as data: `UPat` patterns, a `PatternMatcher` of (pattern, function) pairs, and `graph_rewrite`.

        pm = PatternMatcher([(UPat(Ops.ADD, src=(UPat.var("x"), UPat.cvar("c"))),
                              lambda x, c: x if c.arg.value == 0 else None)])
        graph_rewrite(root, pm)   # bottom-up, each node rewritten to a fixed point

A rule's function gets the named sub-matches as keyword arguments (plus `ctx` if it names it) and returns a
replacement UOp, or None to leave the node alone.
"""
from __future__ import annotations

import inspect
from collections import defaultdict
from typing import Any, Callable, Iterable

from fnx.dtypes import DType
from fnx.uop import Ops, UOp, postorder, with_src


class UPat:
    """A pattern over UOps. `op` is an Ops or a set of them; `src` a tuple of UPats (matched in order, or in either
    order for a 2-source commutative pattern when `commutative=True`), or a single UPat every source must match."""

    def __init__(self, op: Ops | Iterable[Ops] | None = None, dtype: DType | Iterable[DType] | None = None,
                              src: tuple[UPat, ...] | UPat | None = None, arg: Any = None, name: str | None = None,
                              commutative: bool = False, predicate: Callable[[UOp], bool] | None = None):
        self.ops = None if op is None else frozenset([op] if isinstance(op, Ops) else op)
        self.dtypes = None if dtype is None else frozenset([dtype] if isinstance(dtype, DType) else dtype)
        self.src, self.arg, self.name, self.commutative, self.predicate = src, arg, name, commutative, predicate

    @staticmethod
    def var(name: str, dtype: DType | Iterable[DType] | None = None) -> UPat:
        return UPat(dtype=dtype, name=name)

    @staticmethod
    def cvar(name: str, dtype: DType | Iterable[DType] | None = None) -> UPat:
        return UPat(Ops.CONST, dtype=dtype, name=name)

    @staticmethod
    def const(value: Any, name: str | None = None) -> UPat:
        """A CONST node whose value equals `value` (any shape, any dtype)."""
        return UPat(Ops.CONST, name=name, predicate=lambda u: u.arg.value == value and type(u.arg.value) is not bool
                                or u.arg.value is value)

    def match(self, u: UOp, bindings: dict[str, UOp]) -> bool:
        if self.ops is not None and u.op not in self.ops: return False
        if self.dtypes is not None and u.dtype not in self.dtypes: return False
        if self.arg is not None and u.arg != self.arg: return False
        if self.predicate is not None and not self.predicate(u): return False
        if self.name is not None:
            if self.name in bindings and bindings[self.name] is not u: return False
            bindings[self.name] = u
        if self.src is None: return True
        if isinstance(self.src, UPat): return all(self.src.match(s, bindings) for s in u.src)
        if len(self.src) != len(u.src): return False
        orders = [u.src, u.src[::-1]] if self.commutative and len(u.src) == 2 else [u.src]
        for order in orders:
            trial = dict(bindings)
            if all(p.match(s, trial) for p, s in zip(self.src, order)):
                bindings.update(trial)
                return True
        return False


class PatternMatcher:
    """An ordered list of (UPat, function) rules, indexed by op so a node is only tried against rules that can match."""

    def __init__(self, rules: list[tuple[UPat, Callable[..., UOp | None]]]):
        self.rules = rules
        self.by_op: dict[Ops, list] = defaultdict(list)
        for pat, fn in rules:  # a rule for any op joins every op's list, so list order is kept everywhere
            wants_ctx = "ctx" in inspect.signature(fn).parameters
            for op in (pat.ops if pat.ops is not None else Ops):
                self.by_op[op].append((pat, fn, wants_ctx))

    def __add__(self, other: PatternMatcher) -> PatternMatcher:
        return PatternMatcher(self.rules + other.rules)

    def rewrite(self, u: UOp, ctx: Any = None) -> UOp | None:
        for pat, fn, wants_ctx in self.by_op.get(u.op, ()):
            bindings: dict[str, UOp] = {}
            if pat.match(u, bindings):
                out = fn(ctx=ctx, **bindings) if wants_ctx else fn(**bindings)
                if out is not None and out is not u: return out
        return None


def graph_rewrite(root: UOp, pm: PatternMatcher, ctx: Any = None, memo: dict[UOp, UOp] | None = None) -> UOp:
    """Rewrite `root` bottom-up: each node's sources first, then the node itself until no rule fires.

    Nodes a rule creates are rewritten too. `memo` maps already-rewritten nodes to their results and may be shared
    between calls that rewrite parts of one graph.
    """
    memo = {} if memo is None else memo
    for u in _toposort_new(root, memo):
        src = tuple(memo[s] for s in u.src)
        new = with_src(u, src)
        for _ in range(1000):
            out = pm.rewrite(new, ctx)
            if out is None: break
            new = graph_rewrite(out, pm, ctx, memo) if out not in memo else memo[out]
        memo[u] = new
    return memo[root]


def _toposort_new(root: UOp, memo: dict[UOp, UOp]) -> list[UOp]:
    """The nodes under `root` not yet in `memo`, sources first; does not descend below memoized nodes."""
    return postorder(root, None, memo)


def substitute(root: UOp, mapping: dict[UOp, UOp], memo: dict[UOp, UOp] | None = None) -> UOp:
    """Replace the nodes in `mapping` (and rebuild everything above them). `memo`, when given, receives every
    visited node's replacement (what each old node became).

    PARAMs are scoped: inside the body of a call or control node, the PARAMs of that node's own tag are its
    parameters, not the mapping's. One body is shared (hash-consed) by every call of a checkpointed function;
    binding one call's PARAMs must not rewrite the bodies of the other calls it reaches."""
    tags = {p.arg.tag for p in mapping if p.op is Ops.PARAM}
    shadows = (lambda u: u.binds in tags) if tags else (lambda u: False)
    memo = dict(mapping) if memo is None else memo
    memo.update(mapping)
    for u in postorder(root, lambda u: u.operands if shadows(u) else u.src, memo):
        if shadows(u):
            inner = {k: v for k, v in mapping.items() if not (k.op is Ops.PARAM and k.arg.tag == u.binds)}
            n_bodies = len(u.src) - len(u.operands)
            src = tuple(substitute(b, inner) for b in u.src[:n_bodies]) + tuple(memo[s] for s in u.src[n_bodies:])
        else:
            src = tuple(memo[s] for s in u.src)
        memo[u] = with_src(u, src)
    return memo[root]
