"""pmap: jax.pmap, one device per element of a mapped axis, as a jitted shard_map over a one-axis mesh.

`pmap(f, "i")(x)` with `x.shape[0] == n` runs `f` on each of the first n devices, device k on `x[k]`; collectives
over "i" (psum, pmean, all_gather, ppermute, ...) exchange between the devices, and the result holds one slice
per device, stacked along `out_axes`. fnx builds it from what it has: the mapped axis of every argument is moved
to the front and split over a mesh of those n devices (`shard_map` with `P(axis_name)`), each device drops the
length-1 axis of its block, calls `f`, and puts the axis back on its results. The whole is jitted, so a call
compiles once per argument signature.
"""
from __future__ import annotations

import functools
import itertools
import threading
from typing import Any, Callable, Sequence

from fnx import numpy as jnp
from fnx import tree_util
from fnx.transforms.jit import jit
from fnx.devices import local_devices
from fnx.errors import UnsupportedError, at_user_line
from fnx.sharding import P
from fnx.sharding.mesh import Mesh
from fnx.transforms.shard_map import shard_map
from fnx.transforms.vmap import _broadcast_prefix, mapped_axes

_unnamed = itertools.count()
_tracing = threading.local()  # .axis: the axis name of the pmap whose body this thread is tracing


def pmap(fun: Callable, axis_name: Any = None, *, in_axes: Any = 0, out_axes: Any = 0,
         static_broadcasted_argnums: int | Sequence[int] = (), devices: Sequence[Any] | None = None,
         backend: str | None = None, axis_size: int | None = None, donate_argnums: Any = (),
         global_arg_shapes: Any = None) -> Callable:
    """Map `fun` over an axis of its arguments, one device per element (jax.pmap).

    Args:
      fun: the per-device function; inside it the mapped axis is gone, and collectives over `axis_name` work.
      axis_name: the name collectives use for the mapped axis.
      in_axes: an int, None (broadcast to every device), or a pytree prefix of the positional arguments, as vmap's.
        Keyword arguments are mapped over their axis 0.
      out_axes: where the mapped axis goes in the results (an int, or None for results equal on every device).
      static_broadcasted_argnums: positional arguments passed to `fun` as they are (hashable; a new value compiles
        again), on every device.
      devices: the devices to use, the first n of them (default: the local devices of `backend` or of the default
        device's platform).
      donate_argnums, global_arg_shapes: accepted for JAX compatibility; nothing is donated.

    Raises:
      ValueError: if the mapped axes differ in length, or it exceeds the number of devices (as JAX's "requires n
        logical devices" error).

    Example:
      >>> fnx.pmap(lambda x: x / fnx.lax.psum(x, "i"), "i")(jnp.arange(4.0))   # with FNX_CPU_DEVICES=4
    """
    static = (static_broadcasted_argnums,) if isinstance(static_broadcasted_argnums, int) \
        else tuple(static_broadcasted_argnums)
    name = axis_name if axis_name is not None else f"_pmap{next(_unnamed)}"  # (a name no collective uses)
    fun_name = getattr(fun, "__name__", "a function")
    if axis_size is not None: axis_size = int(axis_size)

    @functools.lru_cache(maxsize=64)
    def compiled(static_values: tuple, treedef, axes: tuple, n: int, pool: tuple) -> Callable:
        """The jitted program for one layout of the arguments and static values (a small LRU per pmap)."""
        mesh = Mesh(list(pool[:n]), (name,))

        def per_device(*blocks):
            leaves = [b if a is None else jnp.squeeze(b, 0) for b, a in zip(blocks, axes)]
            args, kwargs = tree_util.tree_unflatten(treedef, leaves)
            full = list(args)
            for position, value in sorted(static_values): full.insert(position, value)
            _tracing.axis, outer = name, getattr(_tracing, "axis", None)
            try:
                out = fun(*full, **kwargs)
            finally:
                _tracing.axis = outer
            return out if out_axes is None else tree_util.tree_map(lambda o: jnp.expand_dims(o, 0), out)

        specs = tuple(P() if a is None else P(name) for a in axes)
        mapped = shard_map(per_device, mesh=mesh, in_specs=specs, out_specs=P() if out_axes is None else P(name))

        def run(*leaves):
            fronts = [x if a is None else jnp.moveaxis(x, a, 0) for x, a in zip(leaves, axes)]
            out = mapped(*fronts)
            if out_axes is None or out_axes == 0: return out
            return tree_util.tree_map(lambda o: jnp.moveaxis(o, 0, out_axes), out)
        run.__name__ = f"pmap({fun_name})"
        return jit(run)

    @functools.wraps(fun)
    def mapped_fun(*args, **kwargs):
        if getattr(_tracing, "axis", None) is not None:
            raise UnsupportedError(at_user_line(
                f"pmap of {fun_name} inside the pmap over {_tracing.axis!r}: nested pmaps are not supported; map both "
                "axes in one fnx.shard_map over a two-axis mesh (fnx.make_mesh((n, m), (outer, inner)))"))
        if any(not -len(args) <= i < len(args) for i in static):
            raise ValueError(at_user_line(f"pmap: static_broadcasted_argnums {static} for {len(args)} positional "
                                          "arguments"))
        static_at = {i % len(args) for i in static}
        static_values = tuple((i, args[i]) for i in sorted(static_at))
        dynamic = tuple(a for i, a in enumerate(args) if i not in static_at)
        spec = in_axes
        if isinstance(spec, list): spec = tuple(spec)
        if isinstance(spec, tuple) and len(spec) == len(args) and static_at:
            spec = tuple(s for i, s in enumerate(spec) if i not in static_at)
        if isinstance(spec, tuple) and len(spec) != len(dynamic):
            raise ValueError(at_user_line(f"pmap: in_axes has {len(spec)} entries for {len(dynamic)} arguments"))
        leaves, treedef = tree_util.tree_flatten((dynamic, kwargs))
        axes = _broadcast_prefix(spec, dynamic, "in_axes") + [0] * (len(leaves) - len(tree_util.tree_leaves(dynamic)))
        norm, mapped = mapped_axes(leaves, axes, "pmap")
        sizes = {length for _, length in mapped}
        if len(sizes) > 1:
            raise ValueError(at_user_line(f"pmap got inconsistent sizes for array axes to be mapped: {sorted(sizes)}"))
        if not sizes and axis_size is None:
            raise ValueError(at_user_line("pmap: no argument is mapped (in_axes all None) and no axis_size is given"))
        n = sizes.pop() if sizes else axis_size
        pool = tuple(devices) if devices is not None else tuple(local_devices(backend=backend))
        if n > len(pool) or n == 0:
            raise ValueError(at_user_line(
                f"pmap of {fun_name}: compiling computation that requires {n} logical devices, but only {len(pool)} "
                f"devices are available (num_replicas={n}); FNX_CPU_DEVICES sets the number of cpu devices"))
        try:
            program = compiled(static_values, treedef, tuple(norm), n, pool)
        except TypeError as err:  # an unhashable static argument
            raise ValueError(at_user_line(f"pmap: static_broadcasted_argnums arguments must be hashable: {err}")) \
                from None
        return program(*leaves)

    return mapped_fun
