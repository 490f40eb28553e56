"""jit: trace once per (input avals, static arguments, device), compile the FUNCTION, and reuse the Executable.

    @fnx.jit
    def f(x, w): return jnp.tanh(x @ w).sum()
    f(x, w)                      # traces and compiles on the first call, then only runs
    f.lower(x, w).as_text()      # the traced graph, the lowered kernels and their LLVM IR
"""
from __future__ import annotations

import contextlib
import functools
import inspect
import logging
import math
import operator
import threading
import types
import warnings
import weakref
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import numpy as np

from fnx import dtypes, events, tree_util
from fnx.backends.device import Buffer, Executable, Launch, get_device
from fnx.config import config
from fnx.debug.callbacks import callbacks
from fnx.debug.printing import format_function
from fnx.devices import default_device, device_name, device_put
from fnx.errors import UnsupportedError, at_user_line, user_frame
from fnx.sharding import spmd
from fnx.trace import (Array, Traced, abstract_leaf, compile_function, constant_buffer, jit_hook,
                       numbers_convert_exactly, realize, special_values, state, to_array, trace)
from fnx.uop import BufferArg, Ops, UOp, collector_paused, scalar_of


class ShapeDtypeStruct:
    """The shape and dtype of an array without its values, as jax.ShapeDtypeStruct: what `eval_shape` returns, and an
    argument that `jit(f).lower(...)`, `eval_shape` and `make_jaxpr` accept in place of an array.

    Example:
      >>> fnx.jit(lambda x: x.sum()).lower(fnx.ShapeDtypeStruct((2, 3), jnp.float32)).as_text("graph")
    """
    __slots__ = ("shape", "dtype", "sharding", "weak_type")

    def __init__(self, shape: Sequence[int], dtype: Any, sharding: Any = None, weak_type: bool = False):
        self.shape = tuple(operator.index(d) for d in shape)
        self.dtype = np.dtype(dtypes.to_dtype(dtype).np)
        self.sharding, self.weak_type = sharding, bool(weak_type)

    ndim = property(lambda self: len(self.shape))
    size = property(lambda self: int(np.prod(self.shape)))

    def _key(self) -> tuple:
        return (self.shape, self.dtype, self.sharding, self.weak_type)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, ShapeDtypeStruct) and self._key() == other._key()

    def __hash__(self) -> int:
        return hash(self._key())

    def __repr__(self) -> str:
        extra = (f", sharding={self.sharding}" if self.sharding is not None else "") + (
            ", weak_type=True" if self.weak_type else "")
        return f"ShapeDtypeStruct(shape={self.shape}, dtype={self.dtype.name}{extra})"


def abstract_value(x: Any) -> tuple[tuple[int, ...], dtypes.DType, bool]:
    """(shape, dtype, weak_type) of an argument leaf: a ShapeDtypeStruct, an Array, a numpy or Python value."""
    if isinstance(x, ShapeDtypeStruct): return (x.shape, dtypes.to_dtype(x.dtype), x.weak_type)
    return abstract_leaf(x)


class _JitState(threading.local):
    """Per thread: whether jit is disabled (`disable_jit`, or a jitted function with host callbacks running op by
    op)."""

    def __init__(self):
        self.disabled = 0


jit_state = _JitState()


@contextlib.contextmanager
def disable_jit(disable: bool = True):
    """Inside this block jitted functions run op by op (eagerly), as with jax.disable_jit: Python `print` and
    breakpoints see concrete values. Transforms (grad, vmap) still trace.

    Example:
      >>> with fnx.disable_jit():
      ...   fnx.jit(lambda x: print(x) or x)(1.0)
    """
    jit_state.disabled += bool(disable)
    try:
        yield
    finally:
        jit_state.disabled -= bool(disable)


class _RunEagerly:
    """The cache entry of a signature whose trace met a host callback: fnx has no compiled form of a callback, so
    such calls run the function op by op (the callbacks then see concrete values)."""

    def __repr__(self) -> str:
        return "<runs eagerly: host callback>"


RUN_EAGERLY = _RunEagerly()


EAGER_SIGNATURES = 32  # signatures (shapes, dtypes) an eager op's jit keeps programs for (`eager_jit`)


class _Signatures(dict):
    """A trace cache's signature -> program map, bounded to `limit` entries (None: `config.executables`,
    FNX_EXECUTABLES): past that the oldest goes (it is traced again if called again). A program keeps its
    compiled code alive, and eager ops run as jit of themselves: on 2,000 new shapes, `(x * 2.0 + 1.0).sum()`
    kept 6,000 programs and grew the process by 1.4 GB. (A dict, so that the lookup on every call stays
    dict.get.)"""
    __slots__ = ("limit",)

    def __init__(self):
        super().__init__()
        self.limit: int | None = None

    def __setitem__(self, key: Any, value: Any) -> None:
        if key not in self and len(self) >= (self.limit or config.executables): del self[next(iter(self))]
        super().__setitem__(key, value)


class _TraceCache:
    """The programs traced for one function and one set of jit options (signature key -> Lowered), shared by every
    `jit` of that function with those options, as JAX's cache is keyed by the function."""
    __slots__ = ("lowered", "fast", "__weakref__")

    def __init__(self):
        self.lowered: dict[Any, Any] = _Signatures()
        self.fast: dict[Any, Any] = _Signatures()


_shared_caches: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # function -> {options: _TraceCache}
_all_caches: weakref.WeakSet = weakref.WeakSet()
_caches_lock = threading.Lock()


def _trace_cache(fun: Callable, options: tuple | None) -> _TraceCache:
    """The trace cache of `fun` with jit `options` (None: unshareable options, a cache of its own). Functions are
    held weakly: a cache goes away with its function."""
    with _caches_lock:
        try:
            per_options = _shared_caches.setdefault(fun, {}) if options is not None else None
        except TypeError:  # not weakly referenceable
            per_options = None
        cache = per_options.get(options) if per_options is not None else None
        if cache is None:
            cache = _TraceCache()
            if per_options is not None: per_options[options] = cache
            _all_caches.add(cache)
        return cache


def clear_trace_caches() -> None:
    """Forget every jitted function's traced programs (they retrace on their next call)."""
    with _caches_lock:
        for cache in list(_all_caches):
            cache.lowered.clear()
            cache.fast.clear()


def _as_buffer(x: Any, device: str, param: UOp) -> Buffer:
    """The device buffer holding argument leaf `x` (realizing lazy arrays, uploading host values as the PARAM's
    dtype: Python scalars are weakly typed)."""
    if isinstance(x, Array):
        if x._buffer is not None and x._buffer.device != device:  # jit(device=...): the call's device
            x = device_put(x, device)
        if x._buffer is None:  # constants and pending work get a buffer once, kept by the Array
            if x.uop.op is Ops.CONST:
                buffer = get_device(device).allocator.from_numpy(np.full(x.shape, x.uop.arg.value, x.uop.dtype.np))
                x.uop = UOp(Ops.BUFFER, x.uop.dtype, (), BufferArg(buffer, x.shape))
            else:
                x.uop = realize([x.uop])[0]
        return x._buffer
    return get_device(device).allocator.from_numpy(np.asarray(x, dtype=param.dtype.np))  # (a copy: x may change)


@dataclass
class Lowered:
    """A traced and compiled function for one set of input avals: `.as_text(stage)`, `.compile()`.

    `donated` are the flat argument positions whose buffers the call may reuse for outputs (donate_argnums).
    """
    traced: Traced
    executable: Executable
    donated: tuple[int, ...] = ()
    arg_names: tuple[str, ...] = ()  # one per flat argument leaf, for Compiled's errors ('x', "params['w']")
    device: str | None = None        # where it was compiled (its Compiled runs there)
    sharded = False                  # (fnx.sharding.spmd.ShardedLowered runs over a mesh)

    def __post_init__(self):  # what every call needs, worked out once
        traced = self.traced
        self.params = traced.fn.src[1:]
        self.consts = [c.arg.buffer for c in traced.consts]
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

    def draw(self, stage: str = "graph") -> Any:
        """A picture (fnx.debug.pictures.Picture: drawn inline in Jupyter, `.save('f.svg' | 'f.png')`) of the
        traced graph ('graph'), of a lowering stage ('callify', 'rangeify', 'optimize', 'linearize', 'memory') or
        of the executable's run order of kernels and copies ('schedule')."""
        from fnx.debug import pictures
        name = self.executable.label
        if stage == "graph": return pictures.draw_function(self.traced.fn, title=f"{name}: traced graph")
        if stage == "schedule": return pictures.draw_schedule(self.executable)
        lowering = getattr(self.executable, "lowering", None)
        if lowering is None:
            raise ValueError(f"Lowered.draw({stage!r}): the {self.device} device runs the graph without lowering it "
                             "into kernels; only 'graph' and 'schedule' can be drawn")
        return pictures.draw_lowering(lowering, stage)

    def compile(self) -> Compiled:
        return Compiled(self)

    def __repr__(self) -> str:
        launches = sum(isinstance(item, Launch) for item in self.executable.items)
        return f"Lowered({_signature_text(self)} on {self.device}, {launches} kernels)"


@dataclass
class Compiled:
    """The executable of `jit(f).lower(*args).compile()`: call it with the non-static arguments, of the shapes and
    dtypes it was lowered for (anything else raises TypeError, as in JAX)."""
    lowered: Lowered

    def __call__(self, *args, **kwargs) -> Any:
        leaves, tree = tree_util.tree_flatten((args, kwargs))
        _check_compiled_args(self.lowered, leaves, tree)
        return _run(self.lowered, leaves)

    def as_text(self, stage: str | None = None) -> str:
        return self.lowered.as_text(stage)

    def __repr__(self) -> str:
        return f"Compiled({repr(self.lowered).removeprefix('Lowered(')}"


def _signature_text(lowered: Lowered) -> str:
    """'f(x: f32[64,128], w: f32[128,32]) -> f32[64]': the function with its argument and output types."""
    from fnx.debug.printing import type_str
    params = ", ".join(f"{name}: {type_str(p)}" for name, p in zip(lowered.arg_names or [f"arg{i}" for i in range(
        len(lowered.params))], lowered.params))
    outs = [type_str(u) for u in lowered.traced.body.src]
    return f"{lowered.executable.label}({params}) -> {outs[0] if len(outs) == 1 else '(' + ', '.join(outs) + ')'}"


def _check_compiled_args(lowered: Lowered, leaves: list, tree: Any) -> None:
    """TypeError naming each argument whose structure, shape or dtype differs from what `lowered` was compiled for
    (a compiled executable would otherwise read its memory as another shape or dtype)."""
    if tree != lowered.traced.in_tree:
        raise TypeError(at_user_line(f"compiled function: called with arguments of structure {tree}, but it was "
                                     f"compiled for {lowered.traced.in_tree} (static arguments are left out)"))
    mismatches = []
    for i, (leaf, param) in enumerate(zip(leaves, lowered.params)):
        shape, dtype, _ = abstract_leaf(leaf)
        if shape != param.shape or dtype != param.dtype:
            name = lowered.arg_names[i] if i < len(lowered.arg_names) else f"argument {i}"
            mismatches.append(f"argument {name!r} compiled with {param.dtype}{list(param.shape)} and called with "
                              f"{dtype}{list(shape)}")
    if mismatches:
        raise TypeError(at_user_line("compiled function: argument types differ from the types it was compiled "
                                     "for: " + "; ".join(mismatches)))


def _arg_names(signature: inspect.Signature | None, dynamic_numbers: list[int], tree: tuple) -> tuple[str, ...]:
    """The name of each flat leaf of (dynamic args, dynamic kwargs): the parameter name and the path inside it."""
    params = [p for p in signature.parameters.values()] if signature is not None else []
    positional = [p.name for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    names = []
    for path, _ in tree_util.tree_flatten_with_path(tree)[0]:
        if path[0].idx == 0:
            number = dynamic_numbers[path[1].idx]
            base = positional[number] if number < len(positional) else f"args[{number}]"
        else:
            base = str(path[1].key)
        names.append(base + tree_util.keystr(path[2:]))
    return tuple(names)


def _run(lowered: Lowered, leaves: Sequence) -> Any:
    if lowered.sharded: return lowered.call(list(leaves))
    device = lowered.device
    inputs = [x._buffer if type(x) is Array and x._buffer is not None and x._buffer.device == device else
              _as_buffer(x, device, p) for x, p in zip(leaves, lowered.params)]
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
                 donate_argnums: Sequence[int], donate_argnames: Sequence[str] = (), device: str | None = None,
                 in_shardings: Any = None, out_shardings: Any = None):
        self.fun, self._device = fun, device
        self.in_shardings, self.out_shardings = in_shardings, out_shardings
        self._signature = _signature_or_none(fun)
        params = list(self._signature.parameters.values()) if self._signature is not None else []
        self._positional = [p.name for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
        self._varargs = self._signature is None or any(p.kind is p.VAR_POSITIONAL for p in params)
        var_keywords = self._signature is None or any(p.kind is p.VAR_KEYWORD for p in params)
        named = [p.name for p in params if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]
        for what, names in (("static_argnames", static_argnames), ("donate_argnames", donate_argnames)):
            unknown = [n for n in names if n not in named]
            if unknown and not var_keywords:
                raise ValueError(at_user_line(f"jit: {what}={tuple(names)} names {unknown}, which the function "
                                              f"does not take (its parameters: {named})"))
        self.static_argnums = self._argnums("static_argnums", static_argnums)
        self.static_argnames = tuple(static_argnames)
        self.donate_argnums = self._argnums("donate_argnums", donate_argnums) + tuple(
            self._positional.index(n) for n in donate_argnames if n in self._positional)
        self._static_positions = {self._positional.index(n) for n in self.static_argnames if n in self._positional}
        self._flat_ok = not self.static_argnums and not self.static_argnames and device is None
        shareable = in_shardings is None and out_shardings is None
        cache = _trace_cache(fun, (self.static_argnums, self.static_argnames, self.donate_argnums, device)
                             if shareable else None)
        self._traces = 0  # how many signatures this object traced (others may share its cache)
        self._name = getattr(fun, "__name__", None) or type(fun).__name__  # (in events, retrace explanations)
        self._cache: dict[Any, Lowered | _RunEagerly] = cache.lowered
        self._fast: dict[Any, Lowered | _RunEagerly] = cache.fast
        functools.update_wrapper(self, fun)

    def __repr__(self) -> str:
        options = [f"{k}={v}" for k, v in (("static_argnums", self.static_argnums), ("static_argnames",
                   self.static_argnames), ("donate_argnums", self.donate_argnums), ("device", self._device)) if v]
        return f"<fnx.jit of {self.fun!r}{' with ' + ', '.join(options) if options else ''}>"

    def __get__(self, instance: Any, owner: type | None = None) -> Any:
        """A jitted function in a class body is a method: `obj.f(x)` calls it with `obj` first, as in JAX."""
        return self if instance is None else types.MethodType(self, instance)

    def _maybe_sharded(self, leaves: list) -> bool:
        return self.in_shardings is not None or any(type(x) is Array and x._buffer is not None and
                                                    x._buffer.is_sharded for x in leaves)

    def _argnums(self, what: str, argnums: Sequence[int]) -> tuple[int, ...]:
        """Argument numbers checked against the signature, as JAX does: negative ones count from the end (resolved
        here, or per call for a function taking *args); ValueError for numbers past the positional parameters."""
        out = []
        for i in argnums:
            if not isinstance(i, (int, np.integer)) or isinstance(i, bool):
                raise TypeError(at_user_line(f"jit: {what} must be integers, got {argnums!r}"))
            n = len(self._positional)
            if not self._varargs and not -n <= i < n:
                raise ValueError(at_user_line(f"jit: {what}={tuple(argnums)}, but the function only accepts {n} "
                                              f"positional arguments ({self._positional})"))
            out.append(int(i) % n if not self._varargs and i < 0 else int(i))
        return tuple(out)

    def _static_numbers(self, nargs: int) -> set[int]:
        """The positions of the static arguments of a call with `nargs` positional arguments."""
        return {i + nargs if i < 0 else i for i in self.static_argnums} | self._static_positions

    def _split(self, args: tuple, kwargs: dict) -> tuple[tuple, Any]:
        """(dynamic args, hashable static key); keyword arguments are bound to positions when possible."""
        if kwargs and self._signature is not None:
            bound = self._signature.bind(*args, **kwargs)
            args, kwargs = tuple(bound.args), dict(bound.kwargs)
        static_nums = self._static_numbers(len(args))
        static = tuple((i, args[i]) for i in sorted(static_nums) if 0 <= i < len(args))
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
        avals = tuple(abstract_value(x) for x in leaves)
        on_mesh = spmd.layout(leaves, dynamic, 0, self.in_shardings) if self._maybe_sharded(leaves) else None
        device = on_mesh.device if on_mesh is not None else self._device or _placement(leaves)
        key = (treedef, avals, static, on_mesh.key if on_mesh is not None else device, dtypes.x64_enabled())
        lowered = self._cache.get(key)
        if lowered is None:
            with events.naming(self._name), collector_paused():
                return self._trace_and_compile(key, dynamic, dyn_kwargs, static, leaves, avals, on_mesh, device)
        if events.active: events.instant("cache", f"jit {self._name}: cache hit")
        return lowered, leaves

    def _trace_and_compile(self, key: tuple, dynamic: tuple, dyn_kwargs: dict, static: tuple, leaves: list,
                           avals: tuple, on_mesh: Any, device: str) -> tuple[Lowered, list]:
        """The cache miss of `_lower`: explain it when asked (FNX_EXPLAIN_RETRACE), trace, partition or compile."""
        if self._cache and (config.explain_cache_misses or events.active):
            _explain_retrace(self, key, (dynamic, dyn_kwargs))
        flat_fun = self._with_static(static)
        static_pos = {i for i, _ in static if isinstance(i, int)}
        seen, callbacks.jit_tracing = callbacks.met, callbacks.jit_tracing + 1
        try:
            with default_device(device), events.span("trace", self._name):  # traced for, compiled for and
                traced = trace(flat_fun, (dynamic, dyn_kwargs), avals=list(avals),  # run on the arguments'
                               kind=f"jit of {self._name}")                         # device
        finally:
            callbacks.jit_tracing -= 1
        self._traces += 1  # (a trace that raised is not counted: nothing was cached)
        if callbacks.met != seen:  # a host callback (fnx.debug.print, ...): run this signature op by op
            self._cache[key] = RUN_EAGERLY
            return RUN_EAGERLY, leaves
        nargs = len(dynamic) + len(static_pos)
        static_numbers = self._static_numbers(nargs)
        donate = tuple(i + nargs if i < 0 else i for i in self.donate_argnums)
        donated = _donated_leaves(donate, static_numbers, dynamic) if donate else ()
        dynamic_numbers = [i for i in range(nargs) if i not in static_numbers]
        calls = spmd.has_shard_map(traced.fn)
        if on_mesh is None and (calls or self.out_shardings is not None):
            mesh = spmd.mesh_of(calls + _shardings_in(self.out_shardings))
            on_mesh = spmd.Layout(mesh, [((),) * len(a[0]) for a in avals], ())
        if on_mesh is not None:  # laid out over a mesh: partitioned, run by every device of it
            lowered = self._cache[key] = spmd.ShardedLowered(traced, on_mesh.mesh, on_mesh.in_dims,
                                                             self.out_shardings)
            return lowered, leaves
        lowered = self._cache[key] = Lowered(traced, compile_function(traced.fn, device), donated,
                                             _arg_names(self._signature, dynamic_numbers, (dynamic, dyn_kwargs)),
                                             device)
        if donated: _warn_unusable(lowered)
        return lowered, leaves

    def __call__(self, *args, **kwargs) -> Any:
        if state.depth or jit_state.disabled:  # inside another trace: inline, as JAX does for nested jit
            return self.fun(*args, **kwargs)
        if not kwargs and self._flat_ok and (key := _flat_key(args)) is not None:
            # the common case, kept lean: flat positional arrays (and Python numbers) need no tree flattening
            lowered = self._fast.get(key)
            if lowered is None: lowered = self._fast[key] = self._lower(args, kwargs)[0]
            elif events.active: events.instant("cache", f"jit {self._name}: cache hit")
            if lowered is RUN_EAGERLY: return self._run_eagerly(args, kwargs)
            if key[-1] is _NUMBERS:
                if lowered.fast is None or lowered.sharded: return _run(lowered, args)
                args = _number_arrays(args, lowered)
            if lowered.fast is not None and (out := lowered.fast(args)) is not None:
                (shape, weak), = lowered.out_avals
                result = Array.from_buffer(out, shape, weak)
            else:
                result = _run(lowered, args)
        else:
            lowered, leaves = self._lower(args, kwargs)
            if lowered is RUN_EAGERLY: return self._run_eagerly(args, kwargs)
            result = _run(lowered, leaves)
        if config.debug_nans or config.debug_infs: self._check_values(result, args, kwargs)
        return result

    def _check_values(self, result: Any, args: tuple, kwargs: dict) -> None:
        """debug_nans / debug_infs: a NaN or infinity in the results runs the function again op by op, as JAX does,
        so that the FloatingPointError names the op that made it and its line; where no single op does (the
        compiled code rounded differently), the error names the jitted function."""
        bad = special_values(result, f"jit({self._name})")
        if bad is None: return
        self._run_eagerly(args, kwargs)
        raise FloatingPointError(at_user_line(f"{bad}; run op by op, no single operation made it"))

    def _with_static(self, static: tuple) -> Callable:
        """The function of (dynamic args, dynamic kwargs) that calls `fun` with the `static` values put back."""
        static_pos = dict(s for s in static if isinstance(s[0], int))
        static_kw = dict(s for s in static if isinstance(s[0], str))

        def flat_fun(dyn, kw):
            it = iter(dyn)
            full = [static_pos[i] if i in static_pos else next(it) for i in range(len(dyn) + len(static_pos))]
            return self.fun(*full, **kw, **static_kw)
        return flat_fun

    def _run_eagerly(self, args: tuple, kwargs: dict) -> Any:
        """Run the function op by op (its trace met a host callback, which has no compiled form in fnx); the dynamic
        arguments become Arrays first, as a compiled call sees them."""
        dynamic, static = self._split(args, kwargs)
        dynamic = tree_util.tree_map(to_array, dynamic)
        with disable_jit(), (default_device(self._device) if self._device else contextlib.nullcontext()):
            return self._with_static(static)(*dynamic)

    def lower(self, *args, **kwargs) -> Lowered:
        """The traced and compiled function for these arguments (arrays, or ShapeDtypeStructs standing for them)."""
        lowered = self._lower(args, kwargs)[0]
        if lowered is RUN_EAGERLY:
            raise UnsupportedError(at_user_line(
                f"jit({getattr(self.fun, '__name__', 'f')}).lower: the function calls a host callback "
                "(fnx.debug.print, fnx.debug.callback or fnx.pure_callback), which fnx runs outside compiled code: "
                "calls of it run op by op, so there is no single lowered program"))
        return lowered

    def trace_count(self) -> int:
        """How many distinct signatures this jitted function traced (for tests and debugging); a signature another
        `jit` of the same function and options traced first is reused, not counted."""
        return self._traces


def _explain_retrace(jitted: Jitted, key: tuple, arguments: tuple) -> None:
    """Say why `jitted` traces again: what differs between this call's signature `key` and the closest signature
    traced before (its arguments' shapes, dtypes, weak types, static values, tree structure, device), with the
    call site. Logged as a warning on the 'fnx' logger when FNX_EXPLAIN_RETRACE=1 or
    `fnx.config.update("explain_cache_misses", True)`, and sent to FNX_DEBUG and the profiler as an event."""
    earlier = [k for k in list(jitted._cache) if k != key]
    if not earlier: return
    static_numbers = jitted._static_numbers(len(arguments[0]) + sum(isinstance(i, int) for i, _ in key[2]))
    nargs = len(arguments[0]) + len(static_numbers)
    names = _arg_names(jitted._signature, [i for i in range(nargs) if i not in static_numbers], arguments)
    reasons = min((_signature_differences(jitted, old, key, names) for old in earlier), key=len)
    closest = f" (against the closest of the {len(earlier)} signatures traced before)" if len(earlier) > 1 else ""
    message = (f"fnx: jit of {jitted._name} traces again, signature {len(earlier) + 1}, at {user_frame()}; what "
               f"changed{closest}:\n" + "\n".join(f"  - {r}" for r in reasons))
    if config.explain_cache_misses: logging.getLogger("fnx").warning(message)
    events.instant("cache", f"jit {jitted._name}: retrace", why=message)


def _signature_differences(jitted: Jitted, old: tuple, new: tuple, names: tuple[str, ...]) -> list[str]:
    """What differs between two trace-cache keys (treedef, avals, static values, device or layout), in words."""
    (tree0, avals0, static0, where0, x64_0), (tree1, avals1, static1, where1, x64_1) = old, new
    out = []
    if tree0 != tree1:
        out.append(f"the arguments' tree structure: {tree0} -> {tree1}")
    else:
        for name, (shape0, dtype0, weak0), (shape1, dtype1, weak1) in zip(names, avals0, avals1):
            if shape0 != shape1: out.append(f"argument {name!r}: shape {shape0} -> {shape1}")
            if dtype0 != dtype1: out.append(f"argument {name!r}: dtype {dtype0} -> {dtype1}")
            if weak0 != weak1:
                out.append(f"argument {name!r}: weak type {weak0} -> {weak1} (a Python scalar is weakly typed, an "
                           "array is not)")
    values0, values1 = dict(static0), dict(static1)
    for k in sorted(set(values0) | set(values1), key=str):
        if values0.get(k, _MISSING) != values1.get(k, _MISSING):
            label = jitted._positional[k] if isinstance(k, int) and k < len(jitted._positional) else k
            param = jitted._signature.parameters.get(label) if jitted._signature is not None else None
            missing = "(not given)" if param is None or param.default is param.empty else \
                f"(not given: its default {param.default!r})"
            before, after = (repr(v[k]) if k in v else missing for v in (values0, values1))
            out.append(f"static argument {label!r}: {before} -> {after}")
    if where0 != where1: out.append(f"the device or mesh layout: {where0} -> {where1}")
    if x64_0 != x64_1: out.append(f"jax_enable_x64: {x64_0} -> {x64_1}")
    return out or ["nothing visible in the signature (the function object or jit options differ)"]


_MISSING = object()


def _shardings_in(tree: Any) -> list:
    """The NamedShardings among the leaves of an out_shardings pytree."""
    return [s for s in tree_util.tree_leaves(tree, is_leaf=lambda x: hasattr(x, "mesh")) if hasattr(s, "mesh")]


_NUMBERS = object()  # the last entry of a `_flat_key` with Python numbers in it


def _flat_key(args: tuple) -> tuple | None:
    """The cache key of a call whose arguments are all concrete Arrays or Python numbers: the default device, the
    x64 flag and each argument's (shape, dtype, weak type, device), or a number's type (its aval: an int, float or
    bool's dtype follows from the x64 flag), then _NUMBERS if there were numbers; None when some argument is
    anything else (an int outside the default int's range too: tracing it raises)."""
    x64 = dtypes.x64_enabled()
    key, numbers = [state.default_device, x64], False
    for a in args:
        if type(a) is Array and a._buffer is not None:
            key.append((a._shape, a._dtype, a.weak_type, a._buffer.device))
        elif type(a) is float or type(a) is bool or (type(a) is int and (x64 or -2 ** 31 <= a < 2 ** 31)
                                                       and -2 ** 63 <= a < 2 ** 63):
            key.append(type(a))
            numbers = True
        else:
            return None
    if numbers: key.append(_NUMBERS)
    return tuple(key)


def _number_arrays(args: tuple, lowered: Lowered) -> list:
    """`args` with each Python number an Array of its PARAM's dtype over a buffer shared by every call with that
    value (buffers are immutable, and the lean path donates nothing): a new buffer a call cost more than the
    call (an eager `x * 2.0` 22 us, `x * y` 5 us)."""
    device = lowered.device
    return [a if type(a) is Array else Array.from_buffer(
        _number_buffer(a, p.dtype, device), (), type(a) is not bool) for a, p in zip(args, lowered.params)]


_number_buffers: dict = {}
NUMBER_BUFFERS = 1024  # Python numbers whose buffers `_number_buffer` finds without building their constant


def _number_buffer(value: Any, dtype: Any, device: str) -> Buffer:
    """The buffer of Python number `value` as `dtype` (what `trace.constant_buffer` would hold), kept by the value
    itself: building the constant's UOp to look it up was a fifth of an eager `x * 2.0`, and a new value's buffer
    is made without it. The key tells 0.0 from -0.0 and 1 from 1.0 and True; a NaN, never equal to itself, is not
    found and is built each time."""
    kind = type(value)
    if kind not in (bool, int, float, complex): return constant_buffer(UOp.const(dtype, value), device)
    sign = (math.copysign(1.0, value) if kind is float else
            (math.copysign(1.0, value.real), math.copysign(1.0, value.imag)) if kind is complex else 0)
    key = (value, kind, sign, dtype, device)
    if (buf := _number_buffers.get(key)) is None:
        if len(_number_buffers) >= NUMBER_BUFFERS: _number_buffers.clear()
        buf = _number_buffers[key] = get_device(device).allocator.scalar(scalar_of(value, dtype), dtype)
    return buf


def _placement(leaves: Sequence) -> str:
    """The device a call runs on: that of its array arguments (they must share one, as in JAX), else the default
    device. Arguments that are numpy arrays or Python scalars are copied to it."""
    found = None
    for x in leaves:
        if isinstance(x, Array):
            device = x._buffer.device if x._buffer is not None else x.uop.device
            if device is None or device == found: continue
            if found is not None:
                raise ValueError(at_user_line(f"jit: the arguments are on different devices, {found} and {device}; "
                                              "move them to one device with fnx.device_put first"))
            found = device
    return found or state.default_device


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


def jit(fun: Callable | None = None, *, in_shardings: Any = None, out_shardings: Any = None,
        static_argnums: int | Sequence[int] | None = None, static_argnames: str | Sequence[str] | None = None,
        donate_argnums: int | Sequence[int] | None = None, donate_argnames: str | Sequence[str] | None = None,
        keep_unused: bool = False, device: Any = None, backend: str | None = None, inline: bool = False,
        abstracted_axes: Any = None, compiler_options: dict | None = None) -> Any:
    """Compile `fun` with fnx's kernel compiler; traced once per input shapes/dtypes and static arguments.

    Args:
      fun: a function of arrays (pytrees of arrays) returning arrays.
      static_argnums / static_argnames: arguments treated as compile-time constants (must be hashable);
        a new value retraces. Negative numbers count from the end; numbers or names the function does not take
        raise ValueError, as in JAX.
      donate_argnums / donate_argnames: positional arguments whose buffers the call may reuse for its outputs, as
        in JAX: an output of the same shape and dtype is written into a donated argument's memory when the
        computation provably never reads an element after overwriting it (see fnx.lower.memory.donation_aliases),
        and when no numpy view of it is alive. The donated Array is then deleted: using it raises RuntimeError. A
        donated argument that can hold no output gets a warning at compile time and stays valid.
      device / backend: run on this device (a Device or a name such as 'cpu' or 'interp') or on this platform's
        first device; at most one of them. ValueError for unknown ones.
      keep_unused, inline: accepted for JAX compatibility; fnx always keeps every argument and always inlines a
        jitted function called inside another trace.
      in_shardings / out_shardings: NamedShardings (or PartitionSpecs under `with mesh:`), pytree prefixes of the
        positional arguments / of the results: the call lays its arguments out so (resharding any that differ)
        and returns results laid out so; without them, sharded arguments keep their layout and the results get
        the one the partitioner propagates (docs/SHARDING.md).
      abstracted_axes, compiler_options: only None is supported (UnsupportedError otherwise, never silently
        ignored).

    Returns:
      A callable with `.lower(*args)` giving the traced and compiled form (`.as_text()`, `.compile()`).

    Example:
      >>> f = fnx.jit(lambda x: x * 2 + 1)
      >>> f(jnp.arange(3))
      Array([1, 3, 5], dtype=int32)
    """
    options = dict(in_shardings=in_shardings, out_shardings=out_shardings, static_argnums=static_argnums,
                   static_argnames=static_argnames, donate_argnums=donate_argnums, donate_argnames=donate_argnames,
                   keep_unused=keep_unused, device=device, backend=backend, inline=inline,
                   abstracted_axes=abstracted_axes, compiler_options=compiler_options)
    if fun is None:
        return lambda f: jit(f, **options)
    if not callable(fun):
        raise TypeError(at_user_line(f"jit: expected a function, got {type(fun).__name__} {fun!r}"))
    unsupported = [k for k in ("abstracted_axes", "compiler_options") if options[k] is not None]
    if unsupported:
        raise UnsupportedError(at_user_line(f"jit: {', '.join(unsupported)} are not supported by fnx (only None)"))
    if device is not None and backend is not None:
        raise ValueError(at_user_line("jit: pass at most one of device= and backend="))
    try:
        where = None if device is None and backend is None else device_name(device if device is not None else
                                                                             backend)
    except ValueError as err:
        raise ValueError(at_user_line(f"jit: {err}")) from None
    as_tuple = lambda v: () if v is None else (v,) if isinstance(v, (int, str)) else tuple(v)  # noqa: E731
    return Jitted(fun, as_tuple(static_argnums), as_tuple(static_argnames), as_tuple(donate_argnums),
                  as_tuple(donate_argnames), where, in_shardings, out_shardings)


def _plain(v: Any) -> bool:
    """Whether `v` is a value a jitted library function may take as static: None, a Python scalar, a string, a
    dtype, or a tuple of them (not an object of another library, which would be compiled in by identity)."""
    if isinstance(v, tuple): return all(_plain(e) for e in v)
    return v is None or isinstance(v, (bool, int, float, complex, str, np.dtype, type, dtypes.DType))


def jitted_op(*static: str, static_ints: Sequence[str] = (), convert: dict[str, Callable] | None = None,
              automatic: bool = False, promoted: Sequence[str] = (), sequences: Sequence[str] = ()) -> Callable:
    """Decorator for library functions that JAX jits (fnx.random's samplers, fnx.numpy.linalg, the reductions,
    where and matmul, fnx.nn): outside a trace,
    a call runs `jit` of the function, so a second call with arrays of the same shapes traces and compiles
    nothing; inside a trace, or under fnx.disable_jit, it is traced or run op by op as an eager_op.

    Static arguments: those named in `static` (and those in `static_ints` when they are ints), or, `automatic`,
    every argument that is not an array (flags, axes, orders, strings, Python scalars; any other object runs the
    call eagerly). A list in a static
    place is taken as a tuple; a static value that cannot be hashed (a shape given as an array, a list of arrays)
    runs the call eagerly, and so does an array argument given as a list. `convert` maps an argument's name to
    what makes it a jit argument of the right dtype (fold_in's Python int data, which wraps to uint32).
    `promoted` names the arguments that promote together (a reduction's array and its `initial`, where's x and
    y): a Python number among them that meets an integer or 16-bit float array runs the call eagerly, which
    converts it straight from the Python value (trace.numbers_convert_exactly). `sequences` names the arguments
    that take a list of arrays (concatenate's, stack's): a list or tuple of Arrays there is one dynamic argument,
    a tuple (anything else in it runs the call eagerly).

    The jit of a call takes its dynamic arguments positionally (each static combination, Nones included, has its
    own jit), so a call of arrays takes jit's lean path: an eager sum over an axis 26 -> 8.6 us a call, as
    JAX's 9.6.

    Run eagerly, every call traced its whole graph again, and a graph holding a loop (the factorizations' fori
    loops) got a new loop body each time, so it was lowered and compiled again: `jnp.linalg.inv` of an 8x8
    matrix took 211 ms a call, `random.normal(key, (1000,))` 17 ms."""
    def decorate(fn: Callable) -> Callable:
        from fnx.trace import eager_op
        eager = eager_op(fn)
        bind = _Binder(fn)
        jitted: dict[tuple, Jitted] = {}
        arrays = (Array, np.ndarray, np.generic)
        calls: dict[tuple, tuple] = {}  # a call's form (_call_form) -> (its jit, the positions of its arguments)

        @functools.wraps(fn)
        def wrapper(*args, **kwargs):
            if state.depth or jit_state.disabled: return eager(*args, **kwargs)
            try:
                form = (len(args), tuple(kwargs), dtypes.x64_enabled(), *map(_call_form, args),
                        *map(_call_form, kwargs.values()))
                known = calls.get(form)
            except TypeError:  # (an unhashable argument: an index array, a list)
                form = known = None
            if known is not None:
                f, picks = known
                given = args + tuple(kwargs.values()) if kwargs else args
                return f(*[given[i] for i in picks])
            values = bind(args, kwargs)
            for name, f in (convert or {}).items():
                if name in values: values[name] = f(values[name])
            for name in sequences:
                if isinstance(v := values.get(name), (list, tuple)):
                    if not all(type(e) is Array for e in v): return eager(*args, **kwargs)
                    values[name] = tuple(v)
            if not automatic:
                names = [n for n in static if n in values] + [
                    n for n in static_ints if isinstance(values.get(n), (int, np.integer))
                    and not isinstance(values[n], bool)]
            else:
                names = [n for n, v in values.items() if not isinstance(v, arrays) and not (
                    isinstance(v, (list, tuple)) and any(isinstance(e, arrays) for e in v))]
            for n in names:
                if isinstance(values[n], (list, tuple)): values[n] = _tupled(values[n])
                if automatic and not _plain(values[n]): return eager(*args, **kwargs)  # (an object of another kind)
            if any(isinstance(v, list) for n, v in values.items() if n not in names):
                return eager(*args, **kwargs)  # (an array given as a list: converted where the function wants it)
            if any(dtypes.narrowed(values.get(n)) for n in _DTYPE_NAMES if n in names):
                return eager(*args, **kwargs)  # (a 64-bit dtype with x64 off: JAX's warning on every call)
            if promoted and not numbers_convert_exactly([values[n] for n in promoted
                                                         if n in values and n not in names]):
                return eager(*args, **kwargs)
            # static: the named arguments and every None (no leaves); the rest, in order, the jit's arguments
            dynamic = tuple(n for n, v in values.items() if v is not None and n not in names)
            static_values = {n: v for n, v in values.items() if n not in dynamic}
            key = (tuple((n, _typed(v)) for n, v in static_values.items()), dynamic)
            try:
                f = jitted.get(key)
            except TypeError:  # (a static value that cannot be hashed: a shape given as an array)
                return eager(*args, **kwargs)
            if f is None: f = jitted[key] = eager_jit(bind.with_static(static_values, dynamic))
            order = list(values)
            if form is not None and not convert and order == [*bind.positional[:len(args)], *kwargs]:
                if len(calls) >= CALL_FORMS: calls.clear()
                calls[form] = (f, [order.index(n) for n in dynamic])
            return f(*[values[n] for n in dynamic])
        return wrapper
    return decorate


CALL_FORMS = 64  # call forms a jitted library function remembers (jitted_op's fast path); then it starts over


def _call_form(v: Any) -> Any:
    """What jitted_op's decisions about an argument depend on: an Array's dtype (whether a Python number beside it
    converts exactly), or the value itself with its type (a static axis, a flag; a number's kind and range). A
    call whose arguments all have the forms of an earlier call's binds them as that call did."""
    return v._dtype if type(v) is Array else (type(v), v) if type(v) is not tuple else (tuple, _typed(v))


_DTYPE_NAMES = ("dtype", "preferred_element_type")  # static arguments that name a dtype a user requests


def _tupled(v: list | tuple) -> tuple:
    """A static list, and the lists in it, as tuples (tensordot's axes=[[1], [0]]), so that it can be a key."""
    return tuple(_tupled(e) if isinstance(e, (list, tuple)) else e for e in v)


def _typed(v: Any) -> Any:
    """A static value as a cache key that tells 0.0 from 0 and True from 1 (equal in Python, not as an axis)."""
    return (tuple, tuple(_typed(e) for e in v)) if type(v) is tuple else (type(v), v)


class _Binder:
    """Binds a library function's call arguments to its parameter names, as inspect.Signature.bind does (and
    raising its TypeError for a call that does not fit) in a fraction of its time; and makes the function of the
    dynamic arguments alone that jitted_op jits."""

    def __init__(self, fn: Callable):
        self.fn, self.signature = fn, inspect.signature(fn)
        kinds = inspect.Parameter
        params = self.signature.parameters.values()
        self.plain = not any(p.kind in (kinds.VAR_POSITIONAL, kinds.VAR_KEYWORD) for p in params)
        self.positional = [p.name for p in params if p.kind in (kinds.POSITIONAL_ONLY, kinds.POSITIONAL_OR_KEYWORD)]
        self.keywords = {p.name for p in params if p.kind in (kinds.POSITIONAL_OR_KEYWORD, kinds.KEYWORD_ONLY)}
        self.required = [p.name for p in params if p.default is kinds.empty]
        self.defaults = {p.name: p.default for p in params}

    def __call__(self, args: tuple, kwargs: dict) -> dict:
        """{parameter name: value} of the arguments given, in parameter order for positional ones."""
        if self.plain and len(args) <= len(self.positional):
            values = dict(zip(self.positional, args))
            for k, v in kwargs.items():
                if k in values or k not in self.keywords: break
                values[k] = v
            else:
                if all(n in values for n in self.required): return values
        return dict(self.signature.bind(*args, **kwargs).arguments)  # (the call's TypeError, or *args)

    def with_static(self, static: dict, dynamic: tuple[str, ...]) -> Callable:
        """fn as a function of the `dynamic` arguments' values, in that order, with `static` put back."""
        fn, positional, defaults = self.fn, self.positional, self.defaults

        def call(*values):
            given = {**static, **dict(zip(dynamic, values))}
            count = max((i + 1 for i, n in enumerate(positional) if n in given), default=0)
            return fn(*[given.pop(n, defaults[n]) for n in positional[:count]], **given)
        call.__name__ = call.__qualname__ = getattr(fn, "__name__", "an operation")  # (no __wrapped__: jit would
        return call                                                                    # read fn's signature)


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
        avals = [abstract_value(x) for x in tree_util.tree_leaves((dynamic, dyn_kwargs))]
        name = getattr(fun, '__name__', 'a function')
        return Graph(trace(flat_fun, (dynamic, dyn_kwargs), avals=avals, kind=f"make_graph of {name}"),
                     f"{name}: traced graph")
    return graph


@dataclass
class Graph:
    """What `make_graph(f)(*args)` returns: the traced FUNCTION, printed as text and drawn in Jupyter."""
    traced: Traced
    title: str = ""

    @property
    def fn(self) -> UOp:
        return self.traced.fn

    def __str__(self) -> str:
        return format_function(self.traced.fn)

    __repr__ = __str__

    def draw(self) -> Any:
        """The graph as a picture (fnx.debug.pictures.Picture): `.save('graph.svg' | 'graph.png')`."""
        from fnx.debug import pictures
        return pictures.draw_function(self.traced.fn, title=self.title)

    def _repr_svg_(self) -> str:  # (Jupyter draws the graph inline)
        return self.draw()._repr_svg_()

    def save(self, path: str) -> None:
        """Write the picture of the graph to `path` ('.svg', or '.png' with cairosvg installed)."""
        self.draw().save(path)


def eager_jit(fn: Callable) -> Jitted:
    """jit of a library function for its eager calls (jitted_op, trace.jitted_elementwise): its programs are
    kept for the last EAGER_SIGNATURES signatures only, since eager code on ever new shapes would otherwise keep
    one compiled program per shape and op (eager ops before ran through the executables' bounded cache alone)."""
    jitted = jit(fn)
    jitted._cache.limit = jitted._fast.limit = EAGER_SIGNATURES
    return jitted


jit_hook[0] = (eager_jit, jit_state)  # eager elementwise calls run as jit of themselves (trace.jitted_elementwise)
