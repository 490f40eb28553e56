"""jit: trace once per (input avals, static arguments, device), compile the FUNCTION, and reuse the Executable.

    @fnx.jit
    def f(x, w): return jnp.tanh(x @ w).sum()
    f(x, w)                      # traces and compiles on the first call, then only runs
    f.lower(x, w).as_text()      # the traced graph, the lowered kernels and their LLVM IR
"""
from __future__ import annotations

import functools
import inspect
import warnings
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import numpy as np

from fnx import tree_util
from fnx.backends.device import Buffer, Executable
from fnx.debug.printing import format_function
from fnx.errors import at_user_line
from fnx.trace import Array, Traced, abstract_leaf, compile_function, realize, state, trace
from fnx.uop import Ops, UOp


def _as_buffer(x: Any, device: str, param: UOp) -> Buffer:
    """The device buffer holding argument leaf `x` (realizing lazy arrays, uploading host values as the PARAM's
    dtype: Python scalars are weakly typed)."""
    if isinstance(x, Array):
        if x._buffer is None:  # constants and pending work get a buffer once, kept by the Array
            if x.uop.op is Ops.CONST:
                x.uop = UOp(Ops.BUFFER, x.uop.dtype, (), (Buffer.from_numpy(device, np.full(
                    x.shape, x.uop.arg[0], x.uop.dtype.np)), x.shape))
            else:
                x.uop = realize([x.uop])[0]
        return x._buffer
    return Buffer.from_numpy(device, np.array(x, dtype=param.dtype.np, copy=True))  # the caller may mutate x


@dataclass
class Lowered:
    """A traced and compiled function for one set of input avals: `.as_text(stage)`, `.compile()`.

    `donated` are the flat argument positions whose buffers the call may reuse for outputs (donate_argnums).
    """
    traced: Traced
    executable: Executable
    donated: tuple[int, ...] = ()

    def __post_init__(self):  # what every call needs, worked out once
        traced = self.traced
        self.params = traced.fn.src[1:]
        self.consts = [c.arg[0] for c in traced.consts]
        self.out_avals = [(u.shape, weak) for u, weak in zip(traced.body.src, traced.out_weak)]
        self.single_output = tree_util.treedef_is_leaf(traced.out_tree)
        self.donating = self.donated if self.donated and self.executable.aliases(self.donated) else ()
        single = getattr(self.executable, "single_output_call", None)  # a backend's lean path for small calls
        self.fast = single() if single and self.single_output and not self.consts and not self.donating else None

    def as_text(self, stage: str | None = None) -> str:
        """The traced graph (stage 'graph'), or the executable's text for a lowering stage (None: all of them)."""
        graph = format_function(self.traced.fn)
        if stage == "graph": return graph
        return f"{graph}\n\n{self.executable.as_text(stage)}" if stage is None else self.executable.as_text(stage)

    def compile(self) -> Compiled:
        return Compiled(self)


@dataclass
class Compiled:
    lowered: Lowered

    def __call__(self, *args) -> Any:
        leaves, _ = tree_util.tree_flatten(args)
        return _run(self.lowered, leaves)

    def as_text(self, stage: str | None = None) -> str:
        return self.lowered.as_text(stage)


def _run(lowered: Lowered, leaves: Sequence) -> Any:
    device = state.default_device
    inputs = [x._buffer if type(x) is Array and x._buffer is not None else _as_buffer(x, device, p)
              for x, p in zip(leaves, lowered.params)]
    if lowered.consts: inputs += lowered.consts
    if lowered.donating:
        outs = lowered.executable(inputs, lowered.donating)
    else:
        outs = lowered.executable(inputs)
    if lowered.single_output:
        (shape, weak), = lowered.out_avals
        return Array.from_buffer(outs[0], shape, weak)
    arrays = [Array.from_buffer(buf, shape, weak) for buf, (shape, weak) in zip(outs, lowered.out_avals)]
    return tree_util.tree_unflatten(lowered.traced.out_tree, arrays)


def _donated_leaves(donate_argnums: tuple[int, ...], static: set[int], dynamic: tuple) -> tuple[int, ...]:
    """Flat argument positions of the leaves of the donated positional arguments."""
    positions, start = [], 0
    dynamic_numbers = [i for i in range(len(dynamic) + len(static)) if i not in static]
    for number, arg in zip(dynamic_numbers, dynamic):
        count = tree_util.tree_structure(arg).num_leaves
        if number in donate_argnums: positions.extend(range(start, start + count))
        start += count
    return tuple(positions)


class Jitted:
    """The callable `fnx.jit(f)` returns. Calling it traces and compiles once per input signature."""

    def __init__(self, fun: Callable, static_argnums: Sequence[int], static_argnames: Sequence[str],
                 donate_argnums: Sequence[int]):
        self.fun, self.donate_argnums = fun, tuple(donate_argnums)
        self._signature = _signature_or_none(fun)
        self.static_argnums = tuple(static_argnums)
        self.static_argnames = tuple(static_argnames)
        params = list(self._signature.parameters) if self._signature is not None else []
        self._static_positions = {params.index(n) for n in self.static_argnames if n in params}
        self._flat_ok = not self.static_argnums and not self.static_argnames
        self._cache: dict[Any, Lowered] = {}
        self._fast: dict[Any, Lowered] = {}
        functools.update_wrapper(self, fun)

    def _split(self, args: tuple, kwargs: dict) -> tuple[tuple, Any]:
        """(dynamic args, hashable static key); keyword arguments are bound to positions when possible."""
        if kwargs and self._signature is not None:
            bound = self._signature.bind(*args, **kwargs)
            args, kwargs = tuple(bound.args), dict(bound.kwargs)
        static_nums = set(self.static_argnums) | self._static_positions
        static = tuple((i, args[i]) for i in sorted(static_nums) if i < len(args))
        static += tuple(sorted((k, v) for k, v in kwargs.items() if k in self.static_argnames))
        dynamic = tuple(a for i, a in enumerate(args) if i not in static_nums)
        dyn_kwargs = {k: v for k, v in kwargs.items() if k not in self.static_argnames}
        try:
            hash(static)
        except TypeError:
            raise ValueError(at_user_line(f"jit: static arguments must be hashable, got {static}")) from None
        return (dynamic, dyn_kwargs), static

    def _lower(self, args: tuple, kwargs: dict) -> tuple[Lowered, list]:
        (dynamic, dyn_kwargs), static = self._split(args, kwargs)
        leaves, treedef = tree_util.tree_flatten((dynamic, dyn_kwargs))
        avals = tuple(abstract_leaf(x) for x in leaves)
        key = (treedef, avals, static, state.default_device)
        lowered = self._cache.get(key)
        if lowered is None:
            static_pos, static_kw = dict(s for s in static if isinstance(s[0], int)), dict(
                s for s in static if isinstance(s[0], str))

            def flat_fun(dyn, kw):
                it = iter(dyn)
                full = [static_pos[i] if i in static_pos else next(it) for i in range(len(dyn) + len(static_pos))]
                return self.fun(*full, **kw, **static_kw)
            traced = trace(flat_fun, (dynamic, dyn_kwargs), avals=list(avals))
            donated = _donated_leaves(self.donate_argnums, set(self.static_argnums) | self._static_positions,
                                      dynamic) if self.donate_argnums else ()
            lowered = self._cache[key] = Lowered(traced, compile_function(traced.fn, state.default_device), donated)
            if donated: _warn_unusable(lowered)
        return lowered, leaves

    def __call__(self, *args, **kwargs) -> Any:
        if state.depth:  # inside another trace: inline, as JAX does for nested jit
            return self.fun(*args, **kwargs)
        if not kwargs and self._flat_ok and (key := _flat_key(args)) is not None:
            # the common case, kept lean: flat positional arrays need no tree flattening
            lowered = self._fast.get(key)
            if lowered is None: lowered = self._fast[key] = self._lower(args, kwargs)[0]
            if lowered.fast is not None and (out := lowered.fast(args)) is not None:
                (shape, weak), = lowered.out_avals
                return Array.from_buffer(out, shape, weak)
            return _run(lowered, args)
        lowered, leaves = self._lower(args, kwargs)
        return _run(lowered, leaves)

    def lower(self, *args, **kwargs) -> Lowered:
        return self._lower(args, kwargs)[0]

    def trace_count(self) -> int:
        """How many distinct signatures were traced (for tests and debugging)."""
        return len(self._cache)


def _flat_key(args: tuple) -> tuple | None:
    """The cache key of a call whose arguments are all concrete or traced Arrays: the default device and each
    argument's (shape, dtype, weak type); None when some argument is anything else."""
    key = [state.default_device]
    for a in args:
        if type(a) is not Array: return None
        key.append((a._shape, a._dtype, a.weak_type))
    return tuple(key)


def _warn_unusable(lowered: Lowered) -> None:
    """JAX's warning when a donated argument cannot hold any output (it then stays valid)."""
    used = set(lowered.executable.aliases(lowered.donated).values())
    unusable = [p for p in lowered.donated if p not in used]
    if unusable:
        avals = ", ".join(f"{lowered.params[p].dtype}{list(lowered.params[p].shape)}" for p in unusable)
        warnings.warn(f"Some donated buffers were not usable: {avals}. (The cpu backend writes an output of the "
                      "same shape and dtype into a donated argument when no later step reads the argument.)",
                      stacklevel=4)


def _signature_or_none(fun: Callable) -> inspect.Signature | None:
    try:
        return inspect.signature(fun)
    except (TypeError, ValueError):
        return None


def jit(fun: Callable | None = None, *, static_argnums: int | Sequence[int] = (),
        static_argnames: str | Sequence[str] = (),
        donate_argnums: int | Sequence[int] = (), **unused) -> Any:
    """Compile `fun` with fnx's kernel compiler; traced once per input shapes/dtypes and static arguments.

    Args:
      fun: a function of arrays (pytrees of arrays) returning arrays.
      static_argnums / static_argnames: arguments treated as compile-time constants (must be hashable);
        a new value retraces.
      donate_argnums: positional arguments whose buffers the call may reuse for its outputs, as in JAX: an output
        of the same shape and dtype is written into a donated argument's memory when the computation provably
        never reads an element after overwriting it (see fnx.lower.memory.donation_aliases), and when no numpy
        view of it is alive. The donated Array is then deleted: using it raises RuntimeError. A donated argument
        that can hold no output gets a warning at compile time and stays valid.

    Returns:
      A callable with `.lower(*args)` giving the traced and compiled form (`.as_text()`, `.compile()`).

    Example:
      >>> f = fnx.jit(lambda x: x * 2 + 1)
      >>> f(jnp.arange(3))
      Array([1, 3, 5], dtype=int32)
    """
    as_tuple = lambda v: (v,) if isinstance(v, (int, str)) else tuple(v)  # noqa: E731
    if fun is None:
        return lambda f: jit(f, static_argnums=static_argnums, static_argnames=static_argnames,
                             donate_argnums=donate_argnums)
    return Jitted(fun, as_tuple(static_argnums), as_tuple(static_argnames), as_tuple(donate_argnums))


def make_graph(fun: Callable, static_argnums: int | Sequence[int] = ()) -> Callable:
    """`make_graph(f)(*args)` returns the traced FUNCTION of f (printable), like jax.make_jaxpr."""
    jitted = jit(fun, static_argnums=static_argnums)

    def graph(*args, **kwargs) -> Graph:
        (dynamic, dyn_kwargs), static = jitted._split(args, kwargs)
        static_pos = dict(static)
        def flat_fun(dyn, kw):
            it = iter(dyn)
            full = [static_pos[i] if i in static_pos else next(it) for i in range(len(dyn) + len(static_pos))]
            return fun(*full, **kw)
        return Graph(trace(flat_fun, (dynamic, dyn_kwargs)))
    return graph


@dataclass
class Graph:
    traced: Traced

    @property
    def fn(self) -> UOp:
        return self.traced.fn

    def __str__(self) -> str:
        return format_function(self.traced.fn)

    __repr__ = __str__
