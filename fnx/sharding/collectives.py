"""Collectives between devices, as the seed writes them: compositions of COPY, RESHAPE and REDUCE over the shards
of a group of devices, compiled like any FUNCTION into one executable whose items copy between devices and
reduce on each. The seed's seven (broadcast, scatter, gather, reduce, allgather, reduce_scatter, allreduce) are
the functions of those names below; the collectives of fnx.lax are built from them:

For a group of n devices holding x_0 .. x_{n-1} (element j on device j), device k gets:

    psum          sum_j x_j                    (reduce_scatter, then allgather: each chunk is summed once)
    pmax / pmin   max_j x_j / min_j x_j
    all_gather    stack_j x_j along `axis`
    psum_scatter  chunk k along `axis` of sum_j x_j
    ppermute      x_src for the pair (src, k) of `perm`; zeros when k is no pair's destination
    all_to_all    concatenation over j, along `axis`, of chunk k (along `split_axis`) of x_j

psum also has the faster-scheduled forms of the literature, chosen by size (`allreduce_algorithm`): "ring"
(reduce_scatter in n-1 neighbour steps, then allgather around the ring) and "halving" (recursive halving, then
recursive doubling, for a power-of-two group). Each sums every chunk exactly once and hands the same bits to every
device; the summation order differs between algorithms, so they agree to rounding (integers: exactly).
"""
from __future__ import annotations

import math
import time
from typing import Callable

from fnx import dtypes, events
from fnx.backends.device import Buffer, Executable, LRUCache, get_device, processes
from fnx.sharding import distributed
from fnx.uop import CollectiveArg, Ops, ParamArg, ReduceArg, UOp

IDENTITY_ALONE = ("psum", "pmax", "pmin", "psum_scatter", "all_to_all")  # what a group of one device returns as is
# psum of at least this many bytes per device runs as a ring / recursive halving. bench/allreduce.py on host devices
# (2-vCPU Xeon): reduce_broadcast was the fastest at every size up to 64 MiB on 2, 4 and 8 devices (0.2-0.5x the
# ring's time): one executable runs all of a collective's steps in order, so total items and bytes decide, not
# per-link bandwidth. The switch stays for devices that copy concurrently, above anything measured here.
RING_MIN_BYTES = 1 << 30


# ---- UOp helpers ----

def _copy(x: UOp, device: str) -> UOp:
    return x if x.device == device else UOp(Ops.COPY, x.dtype, (x,), device)


def _reshape(x: UOp, shape: tuple[int, ...]) -> UOp:
    return x if x.shape == shape else UOp(Ops.RESHAPE, x.dtype, (x,), shape)


def _chunk(x: UOp, axis: int, k: int, n: int) -> UOp:
    """Chunk k of n along `axis`."""
    size = x.shape[axis] // n
    bounds = tuple((k * size, (k + 1) * size) if i == axis else (0, s) for i, s in enumerate(x.shape))
    return UOp(Ops.SHRINK, x.dtype, (x,), bounds)


def _stack(xs: list[UOp], axis: int) -> UOp:
    """The arrays of `xs` (same shape, one device) stacked along a new axis `axis`."""
    n, shape = len(xs), xs[0].shape
    wide = shape[:axis] + (1,) + shape[axis:]
    parts = []
    for k, x in enumerate(xs):
        pad = tuple((k, n - 1 - k) if i == axis else (0, 0) for i in range(len(wide)))
        parts.append(UOp(Ops.PAD, x.dtype, (_reshape(x, wide),), pad))
    out = parts[0]
    for p in parts[1:]: out = UOp(Ops.ADD if not out.dtype.is_bool else Ops.OR, out.dtype, (out, p))
    return out


def _concat(xs: list[UOp], axis: int) -> UOp:
    stacked = _stack(xs, axis)
    shape = xs[0].shape
    return _reshape(stacked, shape[:axis] + (len(xs) * shape[axis],) + shape[axis + 1:])


def _combine(xs: list[UOp], kind: str) -> UOp:
    """Reduce `xs` (same shape, one device) in order j = 0, 1, ...: stacked along a new axis 0, then REDUCE."""
    op = Ops.ADD if kind == "psum" else Ops.MAX
    flip = kind == "pmin"
    if flip: xs = [_reversed_order(x) for x in xs]
    out = UOp(Ops.REDUCE, xs[0].dtype, (_stack(xs, 0),), ReduceArg(op, (0,)))
    out = _reshape(out, xs[0].shape)
    return _reversed_order(out) if flip else out


def _reversed_order(x: UOp) -> UOp:
    """An order-reversing map that is its own inverse: negation for floats, bitwise not for integers."""
    if x.dtype.is_float: return UOp(Ops.MUL, x.dtype, (x, UOp.const(x.dtype, -1.0, x.shape)))
    return UOp(Ops.XOR, x.dtype, (x, UOp.const(x.dtype, True if x.dtype.is_bool else -1, x.shape)))


def _add(a: UOp, b: UOp) -> UOp:
    return UOp(Ops.ADD if not a.dtype.is_bool else Ops.OR, a.dtype, (a, b))


# ---- the compositions: xs[j] lives on devices[j]; each returns one output per device ----

def broadcast(x: UOp, devices: list[str]) -> list[UOp]:
    """`x` (on one device) copied to every device."""
    return [_copy(x, d) for d in devices]


def scatter(x: UOp, devices: list[str], axis: int = 0) -> list[UOp]:
    """Chunk k of `x` (on one device) along `axis` to device k."""
    return [_copy(_chunk(x, axis, k, len(devices)), d) for k, d in enumerate(devices)]


def gather(xs: list[UOp], devices: list[str], root: int = 0, axis: int = 0) -> UOp:
    """The xs concatenated along `axis` on device `root`."""
    return _concat([_copy(x, devices[root]) for x in xs], axis)


def reduce(xs: list[UOp], devices: list[str], root: int = 0, kind: str = "psum") -> UOp:
    """The reduction over j of xs[j], on device `root` (gather, then reduce)."""
    return _combine([_copy(x, devices[root]) for x in xs], kind)


def reduce_scatter(xs: list[UOp], devices: list[str], kind: str = "psum", axis: int = 0) -> list[UOp]:
    """Device k: chunk k along `axis` of the reduction over j of xs[j]."""
    n = len(devices)
    return [_combine([_copy(_chunk(x, axis, k, n), d) for x in xs], kind) for k, d in enumerate(devices)]


def allgather(xs: list[UOp], devices: list[str], axis: int = 0, tiled: bool = False) -> list[UOp]:
    """Device k: xs stacked (or, tiled, concatenated) along `axis`."""
    join = _concat if tiled else _stack
    return [join([_copy(x, d) for x in xs], axis) for d in devices]


def allreduce(xs: list[UOp], devices: list[str], kind: str = "psum") -> list[UOp]:
    """reduce_scatter, then allgather (a value too small to split over the group is reduced whole on each)."""
    n, size = len(devices), xs[0].size
    if size < n or size % n: return [_combine([_copy(x, d) for x in xs], kind) for d in devices]
    flat = [_reshape(x, (size,)) for x in xs]
    return [_reshape(o, xs[0].shape) for o in allgather(reduce_scatter(flat, devices, kind), devices, tiled=True)]


def reduce_broadcast(xs: list[UOp], devices: list[str], kind: str = "psum") -> list[UOp]:
    """allreduce as the seed's reduce onto the first device, then broadcast: the same bytes moved as
    reduce_scatter + allgather, in 2(n-1) transfers instead of about 2n^2 (small values: each transfer is an item)."""
    return broadcast(reduce(xs, devices, 0, kind), devices)


def ring_allreduce(xs: list[UOp], devices: list[str]) -> list[UOp]:
    """psum as a ring: in step t device k passes its partial sum of chunk (k - t) mod n to device k + 1, which adds
    its own; after n - 1 steps device k holds chunk (k + 1) mod n summed, and passes it around the ring."""
    n, size = len(devices), xs[0].size
    if size < n or size % n: return allreduce(xs, devices)
    flat = [_reshape(x, (size,)) for x in xs]
    partial = {(k, k): _chunk(flat[k], 0, k, n) for k in range(n)}  # (device, chunk) -> partial sum held there
    for t in range(n - 1):
        for k in range(n):
            c, nxt = (k - t) % n, (k + 1) % n
            partial[(nxt, c)] = _add(_copy(partial[(k, c)], devices[nxt]), _chunk(flat[nxt], 0, c, n))
    done = {(k + 1) % n: partial[(k, (k + 1) % n)] for k in range(n)}  # chunk -> its full sum, on one device
    held = {((c - 1) % n, c): done[c] for c in range(n)}  # (device, chunk) -> the summed chunk
    for t in range(n - 1):
        for c in range(n):
            at = (c - 1 + t) % n
            held[((at + 1) % n, c)] = _copy(held[(at, c)], devices[(at + 1) % n])
    return [_reshape(_concat([held[(k, c)] for c in range(n)], 0), xs[0].shape) for k in range(n)]


def halving_allreduce(xs: list[UOp], devices: list[str]) -> list[UOp]:
    """psum by recursive halving (each step, partners 2^i apart swap half of their range and add) and recursive
    doubling (the reduced pieces swapped back), for a group whose size is a power of two."""
    n, size = len(devices), xs[0].size
    if n & (n - 1) or size < n or size % n: return allreduce(xs, devices)
    flat = [_reshape(x, (size,)) for x in xs]
    pieces = [{(0, n): flat[k]} for k in range(n)]  # device -> {(first chunk, end chunk): its partial sum}
    ranges = [(0, n)] * n
    dist = n // 2
    while dist:
        new_ranges, new_pieces = [], []
        for k in range(n):
            partner = k ^ dist
            lo, hi = ranges[k]
            mid = (lo + hi) // 2
            mine = (lo, mid) if k & dist == 0 else (mid, hi)
            own = _part(pieces[k][ranges[k]], ranges[k], mine, size // n)
            theirs = _part(pieces[partner][ranges[partner]], ranges[partner], mine, size // n)
            first, second = (own, _copy(theirs, devices[k])) if k < partner else (_copy(theirs, devices[k]), own)
            new_pieces.append({mine: _add(first, second)})
            new_ranges.append(mine)
        pieces, ranges, dist = new_pieces, new_ranges, dist // 2
    held = [dict(p) for p in pieces]  # device k holds chunk k fully summed; now double back
    dist = 1
    while dist < n:
        for k in range(n):
            partner = k ^ dist
            for span, value in list(held[partner].items()):
                if span not in held[k]: held[k][span] = _copy(value, devices[k])
        dist *= 2
    return [_reshape(_concat([held[k][(c, c + 1)] for c in range(n)], 0), xs[0].shape) for k in range(n)]


def _part(x: UOp, have: tuple[int, int], want: tuple[int, int], chunk: int) -> UOp:
    start = (want[0] - have[0]) * chunk
    return UOp(Ops.SHRINK, x.dtype, (x,), ((start, start + (want[1] - want[0]) * chunk),))


def ppermute(xs: list[UOp], devices: list[str], perm: tuple) -> list[UOp]:
    sources = {dst: src for src, dst in perm}
    return [_copy(xs[sources[k]], d) if k in sources else _copy(UOp.const(xs[k].dtype, 0, xs[k].shape), d)
            for k, d in enumerate(devices)]


def all_to_all(xs: list[UOp], devices: list[str], split_axis: int, concat_axis: int) -> list[UOp]:
    n = len(devices)
    return [_concat([_copy(_chunk(x, split_axis, k, n), d) for x in xs], concat_axis) for k, d in enumerate(devices)]


def allreduce_algorithm(nbytes: int, n: int) -> Callable:
    """The psum schedule for `nbytes` per device over `n` devices."""
    if nbytes < RING_MIN_BYTES or n <= 2: return reduce_broadcast
    return halving_allreduce if n & (n - 1) == 0 else ring_allreduce


def composition(arg: CollectiveArg, xs: list[UOp], devices: list[str], algorithm: Callable | None = None) -> list[UOp]:
    """The outputs, one per device of the group, of collective `arg` over inputs `xs`."""
    kind = arg.kind
    if kind == "psum":
        choose = algorithm or allreduce_algorithm(xs[0].size * xs[0].dtype.itemsize, len(devices))
        return choose(xs, devices)
    if kind in ("pmax", "pmin"): return reduce_broadcast(xs, devices, kind)
    if kind == "all_gather": return allgather(xs, devices, arg.axis)
    if kind == "psum_scatter": return reduce_scatter(xs, devices, "psum", arg.axis)
    if kind == "ppermute": return ppermute(xs, devices, arg.perm)
    if kind == "all_to_all": return all_to_all(xs, devices, arg.split_axis, arg.axis)
    raise ValueError(f"no collective {kind!r}")


# ---- running one on device buffers ----

_compiled = LRUCache(512)


def executable(arg: CollectiveArg, shape: tuple[int, ...], dtype, devices: list[str],
               algorithm: Callable | None = None) -> Executable:
    """The compiled collective `arg` over inputs of `shape` and `dtype`, one per device of `devices` (cached)."""
    key = (arg, shape, dtype, tuple(devices), algorithm)
    if (exe := _compiled.get(key)) is None:
        params = [UOp(Ops.PARAM, dtype, (), ParamArg(j, shape, d)) for j, d in enumerate(devices)]
        outs = composition(arg, params, devices, algorithm)
        outs = [o if o.op is not Ops.PARAM else UOp(Ops.CONTIGUOUS, o.dtype, (o,)) for o in outs]
        fn = UOp(Ops.FUNCTION, dtypes.bool_, (UOp(Ops.TUPLE, dtypes.bool_, tuple(outs)), *params))
        with events.naming(arg.kind):  # (its kernels and copies are called psum:..., all_gather:... in events)
            exe = _compiled.put(key, get_device(devices[0]).compile(fn))
    return exe


def run(arg: CollectiveArg, shape: tuple[int, ...], dtype, groups: list[list[str]], values: dict[str, Buffer],
        algorithm: Callable | None = None) -> dict[str, Buffer]:
    """Collective `arg` within each group of device names; `values[device]` is that device's input Buffer, for the
    devices of this process. Groups with devices of other processes exchange through MPI (fnx.distributed)."""
    if events.active:  # (the profiler's view: one event for the whole collective, across every group)
        start = time.perf_counter()
        out = _run(arg, shape, dtype, groups, values, algorithm)
        for buffer in out.values(): buffer.wait()  # (queued work: its time belongs here)
        events.finished("collective", f"{arg.kind} over {arg.axis_name!r}", start, groups=len(groups),
                        devices=sum(len(g) for g in groups),
                        bytes=math.prod(shape) * dtype.itemsize * sum(len(g) for g in groups))
        return out
    return _run(arg, shape, dtype, groups, values, algorithm)


def _run(arg: CollectiveArg, shape: tuple[int, ...], dtype, groups: list[list[str]], values: dict[str, Buffer],
         algorithm: Callable | None = None) -> dict[str, Buffer]:
    crossing = [g for g in groups if not all(get_device(d).addressable for d in g)] if processes.count > 1 else []
    out = distributed.run_collective(arg, shape, dtype, crossing, values) if crossing else {}
    for group in groups:
        if crossing and group in crossing: continue
        if len(group) == 1 and (arg.kind in IDENTITY_ALONE or arg.kind == "ppermute" and arg.perm == ((0, 0),)):
            out[group[0]] = values[group[0]]  # a group of one: the value itself
            continue
        results = executable(arg, shape, dtype, group, algorithm)([values[d] for d in group])
        out.update(zip(group, results))
    return out
