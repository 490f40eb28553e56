"""Top-level functions of the JAX API that have no better home: shapes without computing (eval_shape, typeof,
make_jaxpr), values to the host (device_get), host callbacks (pure_callback), and the small context managers and
switches users reach for (clear_caches, default_backend, named_scope, named_call).
"""
from __future__ import annotations

import contextlib
import functools
import logging
import os
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import numpy as np

from fnx import dtypes, events, tree_util
from fnx.backends.device import _executables, platform_of
from fnx.config import config
from fnx.debug.callbacks import host_arguments, run_on_host
from fnx.errors import UnsupportedError, at_user_line
from fnx.trace import Array, Traced, as_array, state, trace
from fnx.transforms.custom import clear_traces as clear_custom_traces
from fnx.transforms.grad import jacrev
from fnx.transforms.jit import Graph, ShapeDtypeStruct, abstract_value, clear_trace_caches, make_graph
from fnx.uop import UOp

__all__ = ["ShapedArray", "checkpoint_policies", "clear_caches", "custom_gradient", "default_backend",
           "default_matmul_precision", "device_get", "eval_shape", "host_ids", "jacobian", "linear_transpose",
           "make_jaxpr", "named_call", "named_scope", "print_environment_info", "pure_callback", "typeof"]

jacobian = jacrev  # jax.jacobian is reverse mode


def _out_shapes(traced: Traced) -> Any:
    """The outputs of a traced function as a pytree of ShapeDtypeStructs."""
    structs = [ShapeDtypeStruct(u.shape, u.dtype, weak_type=weak) for u, weak in zip(traced.body.src, traced.out_weak)]
    return tree_util.tree_unflatten(traced.out_tree, structs)


def eval_shape(fun: Callable, *args: Any, **kwargs: Any) -> Any:
    """The shapes and dtypes of `fun(*args, **kwargs)`, found by tracing it: no kernel runs and no memory for the
    results is allocated.

    Args:
      fun: a function of pytrees of arrays.
      *args, **kwargs: arrays, numpy values, Python scalars, or ShapeDtypeStructs standing for arrays.

    Returns:
      A pytree of ShapeDtypeStruct with the structure of the result.

    Example:
      >>> fnx.eval_shape(lambda x: x @ x.T, fnx.ShapeDtypeStruct((1000, 3), jnp.float32))
      ShapeDtypeStruct(shape=(1000, 1000), dtype=float32)
    """
    avals = [abstract_value(x) for x in tree_util.tree_leaves((args, kwargs))]
    traced = trace(lambda a, kw: fun(*a, **kw), (args, kwargs), avals=avals,
                   kind=f"eval_shape of {getattr(fun, '__name__', 'a function')}")
    return _out_shapes(traced)


def make_jaxpr(fun: Callable, static_argnums: int | Sequence[int] = (), axis_env: Any = None,
               return_shape: bool = False, abstracted_axes: Any = None) -> Callable:
    """`make_jaxpr(f)(*args)`: the traced function of `f`, printable, as jax.make_jaxpr (fnx's form of it is
    fnx.make_graph; the text is fnx's graph, not a jaxpr).

    Args:
      fun: the function to trace.
      static_argnums: positional arguments that are compile-time constants.
      return_shape: also return the outputs' ShapeDtypeStructs, as `(graph, shapes)`.
      axis_env, abstracted_axes: only None (UnsupportedError otherwise).

    Example:
      >>> print(fnx.make_jaxpr(lambda x: jnp.sin(x) * 2)(1.0))
    """
    if axis_env is not None or abstracted_axes is not None:
        raise UnsupportedError(at_user_line("make_jaxpr: axis_env and abstracted_axes are not supported (only None)"))
    graph_of = make_graph(fun, static_argnums)
    if not return_shape: return graph_of

    @functools.wraps(fun)
    def graph_and_shapes(*args: Any, **kwargs: Any) -> tuple[Graph, Any]:
        graph = graph_of(*args, **kwargs)
        return graph, _out_shapes(graph.traced)
    return graph_and_shapes


@dataclass(frozen=True)
class ShapedArray:
    """The abstract type of an array, as `jax.typeof` gives it: shape, dtype and weak type (no values)."""
    shape: tuple[int, ...]
    dtype: np.dtype
    weak_type: bool = False

    ndim = property(lambda self: len(self.shape))
    size = property(lambda self: int(np.prod(self.shape)))

    def __str__(self) -> str:
        return f"{'~' if self.weak_type else ''}{self._type_str()}"  # JAX marks weak types with ~

    def _type_str(self) -> str:
        return f"{self.dtype.name}[{','.join(map(str, self.shape))}]"

    def __repr__(self) -> str:
        return f"ShapedArray({self._type_str()}{', weak_type=True' if self.weak_type else ''})"


def typeof(x: Any) -> ShapedArray:
    """The abstract type of `x` (an Array, also a traced one; a numpy value; a Python scalar).

    Example:
      >>> fnx.typeof(jnp.ones(3))
      ShapedArray(float32[3])
    """
    shape, dtype, weak = abstract_value(x)
    return ShapedArray(shape, np.dtype(dtype.np), weak)


def device_get(x: Any) -> Any:
    """The pytree `x` with every Array replaced by a numpy array holding its value (waits for pending work); other
    leaves are returned as they are.

    Example:
      >>> fnx.device_get({'w': jnp.ones(2), 'step': 3})
      {'step': 3, 'w': array([1., 1.], dtype=float32)}
    """
    return tree_util.tree_map(lambda leaf: np.array(leaf) if isinstance(leaf, Array) else leaf, x)


_VMAP_METHODS = (None, "sequential", "sequential_unrolled", "expand_dims", "broadcast_all", "legacy_vectorized")


def pure_callback(callback: Callable[..., Any], result_shape_dtypes: Any, *args: Any, sharding: Any = None,
                  vmap_method: str | None = None, **kwargs: Any) -> Any:
    """Call the Python function `callback` on the values of `args` and use its result as arrays, as
    jax.pure_callback; it must be pure (same inputs, same outputs, no side effects that matter).

    Runs eagerly, and under jit by running the jitted function op by op (fnx has no compiled callback); under vmap
    it raises UnsupportedError, and under grad/jvp of an input it depends on ValueError, as JAX (use custom_jvp or
    custom_vjp).

    Args:
      callback: called with the arguments' pytrees, each array leaf a concrete fnx Array.
      result_shape_dtypes: a pytree of ShapeDtypeStruct (or anything with .shape and .dtype) describing the result;
        the result is converted to these dtypes.
      *args, **kwargs: pytrees of arrays passed to `callback`.
      sharding: accepted for JAX compatibility (ignored: the result is on the default device).
      vmap_method: one of JAX's names (checked; vmap is not supported).

    Returns:
      A pytree of Arrays with the structure, shapes and dtypes of `result_shape_dtypes`.

    Raises:
      RuntimeError: if the callback's result has another structure or shape than declared.

    Example:
      >>> fnx.jit(lambda x: fnx.pure_callback(np.sin, fnx.ShapeDtypeStruct(x.shape, x.dtype), x))(jnp.ones(2))
    """
    del sharding
    if vmap_method not in _VMAP_METHODS:
        raise ValueError(at_user_line(f"pure_callback: vmap_method must be one of {_VMAP_METHODS}, got "
                                      f"{vmap_method!r}"))
    specs, out_tree = tree_util.tree_flatten(result_shape_dtypes)
    specs = [ShapeDtypeStruct(s.shape, s.dtype) for s in specs]
    name = f"fnx.pure_callback({getattr(callback, '__name__', 'callback')})"

    def call() -> Any:
        result = callback(*host_arguments(args), **host_arguments(kwargs))
        values, tree = tree_util.tree_flatten(result)
        if tree != out_tree:
            raise RuntimeError(at_user_line(f"{name}: the callback returned a result of structure {tree}, but "
                                            f"result_shape_dtypes declares {out_tree}"))
        arrays = []
        for i, (value, spec) in enumerate(zip(values, specs)):
            value = np.asarray(value)
            if value.shape != spec.shape:
                raise RuntimeError(at_user_line(f"{name}: result leaf {i} has shape {value.shape}, but "
                                                f"result_shape_dtypes declares {spec}"))
            arrays.append(as_array(value.astype(spec.dtype, copy=False)))
        return tree_util.tree_unflatten(out_tree, arrays)

    def placeholder() -> Any:
        return tree_util.tree_unflatten(out_tree, [Array(UOp.const(dtypes.to_dtype(s.dtype), 0, s.shape))
                                                   for s in specs])
    return run_on_host(name, call, placeholder, (args, kwargs), differentiable=False)


def clear_caches() -> None:
    """Forget every traced and compiled program (jit's traces, the compiled executables), as jax.clear_caches; the
    next calls trace and compile again. The on-disk compile cache (FNX_CACHE_DIR) is kept."""
    clear_trace_caches()
    clear_custom_traces()
    with _executables.lock:  # the device layer's LRU of compiled FUNCTIONs has no clear(): empty it here
        _executables.entries.clear()


def default_backend() -> str:
    """The platform of the default device: 'cpu', 'cuda', 'opencl' or 'interp' (fnx's platform names, which
    fnx.devices(...) takes; JAX says 'gpu' for CUDA devices)."""
    return platform_of(state.default_device)


@contextlib.contextmanager
def named_scope(name: str):
    """Accepted for JAX compatibility: JAX names the ops built inside for profiles; fnx's graphs carry no names.

    Raises:
      TypeError: if `name` is not a string, as in JAX.
    """
    if not isinstance(name, str):
        raise TypeError(at_user_line(f"named_scope name argument must be a string, got {name!r}"))
    yield


def named_call(fun: Callable, *, name: str | None = None) -> Callable:
    """Accepted for JAX compatibility: returns `fun` (JAX names its ops in profiles; fnx's graphs carry no names)."""
    del name
    return fun


# ---- custom gradients, linear transposes, checkpoint policies, precision, environment ----

def custom_gradient(fun: Callable) -> Callable:
    """`fun(*args) -> (value, vjp)` as a function whose gradient is `vjp` (jax.custom_gradient): `vjp(g)` returns one
    cotangent per positional argument (a tuple; a single value is taken for a one-argument `fun`).

    fnx builds it on custom_vjp, keeping the arguments as residuals: the backward pass calls `fun` again to get its
    `vjp` (the forward value is computed twice under grad)."""
    from fnx.transforms.custom import custom_vjp  # (transforms sit above this module's imports)

    def cotangents(vjp: Callable, g: Any, n: int) -> tuple:
        out = vjp(g)
        out = tuple(out) if isinstance(out, (tuple, list)) else (out,)
        if len(out) != n:
            raise TypeError(at_user_line(f"custom_gradient: the vjp function returned {len(out)} cotangents for a "
                                         f"function of {n} positional arguments"))
        return out

    @custom_vjp
    def wrapped(*args):
        return fun(*args)[0]

    def forward(*args):
        return fun(*args)[0], args

    def backward(args, g):
        return cotangents(fun(*args)[1], g, len(args))

    wrapped.defvjp(forward, backward)
    return functools.wraps(fun)(lambda *args: wrapped(*args))


def linear_transpose(fun: Callable, *primals: Any, reduce_axes: Sequence = ()) -> Callable:
    """The transpose of the linear function `fun` at inputs shaped like `primals` (arrays or ShapeDtypeStructs), as
    jax.linear_transpose: `transpose(cotangent)` returns a tuple with one cotangent per primal. Built on vjp at
    zeros (the derivative of a linear function is the function itself); `fun` must be linear (not checked)."""
    from fnx import numpy as jnp
    from fnx.transforms.grad import vjp
    if reduce_axes: raise UnsupportedError(at_user_line("linear_transpose: reduce_axes is not supported"))
    zeros = tree_util.tree_map(lambda p: jnp.zeros(np.shape(p), p.dtype if hasattr(p, "dtype") else
                                                   dtypes.canonicalize_scalar(p)[0]), primals)
    _, pullback = vjp(fun, *zeros)

    def transpose(cotangent: Any) -> tuple:
        return tuple(pullback(cotangent))
    return transpose


def _policy(name: str, saves: Callable[..., bool]) -> Callable[..., bool]:
    saves.__name__ = saves.__qualname__ = name
    saves.__doc__ = (f"jax.checkpoint_policies.{name}: accepted by fnx.checkpoint(policy=), which recomputes every "
                     "intermediate under any policy (the values are the same; only JAX's memory use differs)")
    return saves


def _names_policy(name: str) -> Callable[..., Callable[..., bool]]:
    def factory(*names: str, **_) -> Callable[..., bool]:
        return _policy(f"{name}({', '.join(map(repr, names))})", lambda *a, **k: False)
    factory.__name__ = factory.__qualname__ = name
    return factory


checkpoint_policies = __import__("types").SimpleNamespace(
    everything_saveable=_policy("everything_saveable", lambda *a, **k: True),
    nothing_saveable=_policy("nothing_saveable", lambda *a, **k: False),
    dots_saveable=_policy("dots_saveable", lambda *a, **k: False),
    checkpoint_dots=_policy("checkpoint_dots", lambda *a, **k: False),
    dots_with_no_batch_dims_saveable=_policy("dots_with_no_batch_dims_saveable", lambda *a, **k: False),
    checkpoint_dots_with_no_batch_dims=_policy("checkpoint_dots_with_no_batch_dims", lambda *a, **k: False),
    save_anything_except_these_names=_names_policy("save_anything_except_these_names"),
    save_any_names_but_these=_names_policy("save_any_names_but_these"),
    save_only_these_names=_names_policy("save_only_these_names"),
    save_from_both_policies=lambda a, b: _policy("save_from_both_policies", lambda *x, **k: False),
    offload_dot_with_no_batch_dims=lambda *a, **k: _policy("offload_dot_with_no_batch_dims", lambda *x, **y: False),
    save_and_offload_only_these_names=lambda **k: _policy("save_and_offload_only_these_names", lambda *x, **y: False),
)

_PRECISIONS = (None, "default", "high", "highest", "bfloat16", "tensorfloat32", "float32", "fastest")


@contextlib.contextmanager
def debug_nans(new_val: bool = True):
    """Inside the block, a NaN in a float result is a FloatingPointError naming the op and the line that made it
    (jax.debug_nans; also `fnx.config.update("jax_debug_nans", True)` or JAX_DEBUG_NANS=1). Eager ops check their
    results; a jitted call that returns a NaN runs again op by op to find the op, as in JAX. The setting is the
    process's for the block (JAX's is the thread's)."""
    with _setting("debug_nans", new_val):
        yield


@contextlib.contextmanager
def debug_infs(new_val: bool = True):
    """As debug_nans, for infinities (jax.debug_infs)."""
    with _setting("debug_infs", new_val):
        yield


def _log_compile(event: events.Event) -> None:
    if event.cat in ("trace", "lower", "compile") and event.duration is not None:
        logging.getLogger("fnx").warning(events.debug_line(event, 1))


@contextlib.contextmanager
def log_compiles(new_val: bool = True):
    """Inside the block, each trace, lowering and compilation is logged as a warning on the 'fnx' logger, with its
    function, time and cache use (jax.log_compiles; JAX_LOG_COMPILES=1 / FNX_LOG_COMPILES=1 turn it on for the
    whole process). FNX_DEBUG=1 prints the same lines and the kernel launches."""
    stop = events.listen(_log_compile) if new_val else None
    try:
        yield
    finally:
        if stop is not None: stop()


if os.environ.get("FNX_LOG_COMPILES", os.environ.get("JAX_LOG_COMPILES", "0")) not in ("", "0"):
    events.listen(_log_compile)


@contextlib.contextmanager
def _setting(name: str, value: bool):
    previous = getattr(config, name)
    setattr(config, name, bool(value))
    try:
        yield
    finally:
        setattr(config, name, previous)


@contextlib.contextmanager
def default_matmul_precision(new_val: Any = None):
    """Accepted for JAX compatibility (jax.default_matmul_precision): fnx computes float32 products in float32 under
    any precision, JAX's CPU default, so the setting changes nothing. Raises ValueError for a name JAX rejects."""
    if new_val not in _PRECISIONS and not str(new_val).startswith(("ANY_", "F16_", "BF16_", "F32_", "F64_", "TF32_")):
        raise ValueError(at_user_line(f"default_matmul_precision: unknown precision {new_val!r}; one of "
                                      f"{[p for p in _PRECISIONS if p]} or a DotAlgorithmPreset name"))
    yield


def host_ids() -> list[int]:
    """The processes' indices (jax.host_ids, deprecated there: process_indices)."""
    from fnx.sharding.distributed import process_count
    return list(range(process_count()))


def print_environment_info(return_string: bool = False) -> str | None:
    """fnx's version, Python's, numpy's, llvmlite's and the devices, as jax.print_environment_info."""
    import platform
    import sys
    from importlib import metadata

    def version(package: str) -> str:
        try:
            return metadata.version(package)
        except metadata.PackageNotFoundError:
            return "not installed"
    from fnx.backends.device import _runtimes, platform_devices
    devices = [str(d) for p in sorted(_runtimes) if p != "interp" for d in platform_devices(p)]
    lines = [f"fnx:      {version('fnx')}", f"numpy:    {np.__version__}", f"llvmlite: {version('llvmlite')}",
             f"python:   {sys.version.splitlines()[0]}", f"platform: {platform.platform()}",
             f"devices:  {', '.join(devices) or 'none'}",
             f"jax_enable_x64: {dtypes.x64_enabled()}"]
    text = "\n".join(lines)
    if return_string: return text
    print(text)
    return None
