"""Allreduce (psum) bandwidth between the host's cpu devices, for each schedule of fnx.sharding.collectives.

    python -m bench.allreduce                          # 2, 4, 8 devices, 4 KiB .. 64 MiB each (1 min on 2 cores)
    python -m bench.allreduce --devices 8 --max-mib 4  # fewer groups, smaller sizes
    python -m bench.allreduce --json out.json          # also write every result as JSON

(Run from the repository root: it imports bench.run.)

The schedules: "seed", the seed's composition `allreduce` (reduce_scatter, then allgather); "reduce_bcast",
`reduce_broadcast` (the seed's reduce onto one device, then broadcast); `ring_allreduce`; `halving_allreduce`
(recursive halving and doubling; on a group whose size is not a power of two it runs the seed's schedule). Each is
one compiled executable over the group, timed best-of-N on float32 inputs already on their devices, until every
device's output is computed. JAX's psum (shard_map over as many XLA cpu devices) is measured in the same run when
JAX is installed.

Rates as nccl-tests define them: algorithm bandwidth = bytes per device / time; bus bandwidth = 2(n-1)/n x that,
the bytes each device must send (and receive) in any allreduce, so it can be compared across group sizes. Here all
n devices are one host's memory and cores: the n x busbw bytes crossing between devices in a second are each read
and written once at the least, so `mem` = 2 n busbw / copy bandwidth is the share of the host's measured copy
bandwidth (bench/run.py's measurement) the transfers alone would use. Small sizes stay in cache and can exceed it.
`cores` is the process's CPU time over the wall time of the timed calls: how many of the host's cores the
collective kept busy.

Before timing, each group checks (untimed) that the schedules agree: int32 sums exactly, float32 sums of
values in [1, 2) within n ulps of each other, every device of a group holding the same bits.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import sys
import time
from typing import Callable

import numpy as np

import fnx
from bench.run import best, jax, memory_bandwidth
from fnx import dtypes
from fnx.backends.device import get_device
from fnx.config import config
from fnx.sharding import collectives
from fnx.uop import CollectiveArg

ALGORITHMS = {"seed": collectives.allreduce, "reduce_bcast": collectives.reduce_broadcast,
              "ring": collectives.ring_allreduce, "halving": collectives.halving_allreduce}
NAMES = {algorithm: name for name, algorithm in ALGORITHMS.items()}
SIZES = [4096 << (2 * k) for k in range(8)]  # 4 KiB, 16 KiB, ..., 64 MiB per device


def _size(nbytes: int) -> str:
    return f"{nbytes >> 20} MiB" if nbytes >= 1 << 20 else f"{nbytes >> 10} KiB"


def _executable(algorithm: Callable, shape: tuple[int, ...], dtype: np.dtype, devices: list[str]):
    arg = CollectiveArg("psum", "i", len(devices), 0)
    return collectives.executable(arg, shape, dtypes.from_numpy(np.dtype(dtype)), devices, algorithm)


def _inputs(values: np.ndarray, devices: list[str]) -> list:
    """values[k] as a buffer on devices[k]."""
    return [get_device(d).allocator.from_numpy(v) for d, v in zip(devices, values)]


def check_agreement(devices: list[str]) -> None:
    """The schedules agree (integers exactly, float32 within n ulps) and give every device the same bits; the
    shapes include one whose size does not divide by n (where ring and halving fall back to the seed)."""
    n = len(devices)
    rng = np.random.default_rng(n)
    for shape in ((24, 100), (1001,)):
        ints = rng.integers(-2**20, 2**20, (n, *shape)).astype(np.int32)
        floats = rng.uniform(1, 2, (n, *shape)).astype(np.float32)  # no cancellation: the ulps measure the order
        for values in (ints, floats):
            outs = {}
            for name, algorithm in ALGORITHMS.items():
                results = [b.numpy(shape) for b in _executable(algorithm, shape, values.dtype, devices)(
                    _inputs(values, devices))]
                for k, r in enumerate(results[1:], 1):
                    np.testing.assert_array_equal(r, results[0], f"{name} psum over {n}: device {k} vs device 0")
                outs[name] = results[0]
            for name, out in outs.items():
                if values.dtype == np.int32: np.testing.assert_array_equal(out, values.sum(0, dtype=np.int32), name)
                else: np.testing.assert_array_max_ulp(out, outs["seed"], maxulp=n)
            if values.dtype == np.float32:
                np.testing.assert_allclose(outs["seed"], values.sum(0, dtype=np.float64), rtol=n * 2.0**-23)


def _repeat(nbytes: int) -> int:
    return 7 if nbytes <= 1 << 20 else 5 if nbytes <= 4 << 20 else 3


def timed(fn: Callable, repeat: int) -> tuple[float, float]:
    """bench.run.best(fn), and the cores busy meanwhile: the process's CPU time over the wall time of all calls."""
    cpu, wall = time.process_time(), time.perf_counter()
    seconds = best(fn, repeat=repeat)
    return seconds, (time.process_time() - cpu) / (time.perf_counter() - wall)


def time_fnx(devices: list[str], nbytes: int) -> dict[str, tuple[float, float]]:
    """(best seconds, cores busy) per psum of `nbytes` of float32 per device, for each schedule."""
    shape = (nbytes // 4,)
    buffers = _inputs(np.ones((len(devices), *shape), np.float32), devices)
    times = {}
    for name, algorithm in ALGORITHMS.items():
        exe = _executable(algorithm, shape, np.float32, devices)

        def once():
            for out in exe(buffers): out.wait()
        times[name] = timed(once, _repeat(nbytes))
    return times


def time_jax(n: int, nbytes: int) -> tuple[float, float]:
    """(best seconds, cores busy) per jax.lax.psum of `nbytes` of float32 per device over n XLA cpu devices."""
    from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
    shard_map = getattr(jax, "shard_map", None)
    if shard_map is None: from jax.experimental.shard_map import shard_map  # JAX before 0.7
    mesh = Mesh(np.array(jax.devices("cpu")[:n]), ("i",))
    f = jax.jit(shard_map(lambda x: jax.lax.psum(x, "i"), mesh=mesh, in_specs=P("i"), out_specs=P("i")))
    x = jax.device_put(np.ones(n * nbytes // 4, np.float32), NamedSharding(mesh, P("i")))
    return timed(lambda: f(x).block_until_ready(), _repeat(nbytes))


def _chosen(nbytes: int, n: int) -> str:
    algorithm = collectives.allreduce_algorithm(nbytes, n)
    return NAMES.get(algorithm, algorithm.__name__)


def measure(n: int, sizes: list[int], with_jax: bool) -> list[dict]:
    """Time every schedule (and JAX) on the first n cpu devices; print one line per size; return JSON rows."""
    devices = [d.name for d in fnx.devices("cpu")[:n]]
    check_agreement(devices)
    copy = memory_bandwidth()
    names = [*ALGORITHMS, "jax"] if with_jax else list(ALGORITHMS)
    width = {name: max(8, len(name)) for name in names}
    print(f"\n{n} devices: psum of float32, best-of-N ms; GB/s of the fastest fnx schedule (busbw / copy "
          "bandwidth; mem = 2 n busbw / copy; cores busy)" + ("; JAX's busbw and cores" if with_jax else ""))
    print(f"{'bytes/dev':>9} " + " ".join(f"{name:>{width[name]}}" for name in names)
          + f" | {'fastest':>12} {'algbw':>5} {'busbw':>5} {'of copy':>7} {'mem':>4} {'cores':>5}"
          + (f" | {'jax bus':>7} {'cores':>5}" if with_jax else "") + " | chosen (time / fastest)")
    rows = []
    for nbytes in sizes:
        times = time_fnx(devices, nbytes)
        if with_jax: times["jax"] = time_jax(n, nbytes)
        chosen = _chosen(nbytes, n)
        line = {}
        for name, (seconds, cores) in times.items():
            busbw = 2 * (n - 1) / n * nbytes / seconds / 1e9
            line[name] = {"devices": n, "bytes_per_device": nbytes, "algorithm": name, "seconds": seconds,
                          "algbw_GB/s": nbytes / seconds / 1e9, "busbw_GB/s": busbw,
                          "fraction_of_copy_bandwidth": busbw / copy, "memory_share": 2 * n * busbw / copy,
                          "cores_busy": cores, "chosen": name == chosen}
        rows += line.values()
        fastest = min(ALGORITHMS, key=lambda k: times[k][0])
        top = line[fastest]
        print(f"{_size(nbytes):>9} " + " ".join(f"{line[k]['seconds'] * 1e3:{width[k]}.3f}" for k in names)
              + f" | {fastest:>12} {top['algbw_GB/s']:5.2f} {top['busbw_GB/s']:5.2f} "
              f"{top['fraction_of_copy_bandwidth']:7.1%} {top['memory_share']:4.0%} {top['cores_busy']:5.2f}"
              + (f" | {line['jax']['busbw_GB/s']:7.2f} {line['jax']['cores_busy']:5.2f}" if with_jax else "")
              + f" | {chosen}" + (f" ({line[chosen]['seconds'] / top['seconds']:.2f}x)" if chosen in line else ""))
    return rows


def crossover(rows: list[dict], n: int) -> str:
    """Where the large-message schedules (ring; halving on power-of-two groups) overtake the small-message ones
    (reduce_bcast, seed) by at least 5%, against allreduce_algorithm's switch (RING_MIN_BYTES); and the sizes at
    which its choice is 5% or more slower than the fastest schedule."""
    sizes = sorted({r["bytes_per_device"] for r in rows if r["devices"] == n})
    seconds = {(r["bytes_per_device"], r["algorithm"]): r["seconds"] for r in rows if r["devices"] == n}
    large = ("ring", "halving") if n & (n - 1) == 0 else ("ring",)  # (halving runs the seed on other groups)
    best_of = lambda s, names: min(seconds[(s, k)] for k in names)  # noqa: E731
    gain = {s: best_of(s, ("reduce_bcast", "seed")) / best_of(s, large) for s in sizes}
    ahead = [s for s in sizes if gain[s] >= 1.05]
    listed = lambda some: "every size" if some == sizes else ", ".join(map(_size, some)) or "no size"  # noqa: E731
    switch = [s for s in sizes if _chosen(s, n) in large]
    misses = []
    for s in sizes:
        chosen, fastest = _chosen(s, n), min(ALGORITHMS, key=lambda k: seconds[(s, k)])
        if (s, chosen) in seconds and seconds[(s, chosen)] > 1.05 * seconds[(s, fastest)]:
            misses.append(f"{_size(s)} ({chosen} {seconds[(s, chosen)] * 1e3:.3g} ms, {fastest} "
                          f"{seconds[(s, fastest)] * 1e3:.3g} ms)")
    return (f"{n} devices: best of reduce_bcast and seed / best of {' and '.join(large)}: "
            + ", ".join(f"{_size(s)} {gain[s]:.2f}x" for s in sizes)
            + f"; {' or '.join(large)} >= 5% faster at {listed(ahead)}; allreduce_algorithm switches to them "
            + (f"from {_size(switch[0])}" if switch else "at no size") + f" (RING_MIN_BYTES "
            f"{_size(collectives.RING_MIN_BYTES)}); its choice is >= 5% slower than the fastest at "
            + ("; ".join(misses) if misses else "no size"))


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--devices", type=int, nargs="+", default=[2, 4, 8], help="group sizes (default: 2 4 8)")
    parser.add_argument("--max-mib", type=float, default=64, help="largest size per device in MiB (default: 64)")
    parser.add_argument("--json", metavar="PATH", help="write every result as JSON")
    args = parser.parse_args(argv)
    config.cpu_devices = max(args.devices)  # (as FNX_CPU_DEVICES would: read when the first cpu device is made)
    if jax:
        try:
            jax.config.update("jax_num_cpu_devices", max(args.devices))
        except AttributeError:  # JAX before 0.4.38: XLA_FLAGS=--xla_force_host_platform_device_count=8 does it
            pass
    with_jax = jax is not None and len(jax.devices("cpu")) >= max(args.devices)
    sizes = [s for s in SIZES if s <= args.max_mib * 2**20]
    date = datetime.date.today().isoformat()
    print(f"fnx allreduce bench: {date}, {os.cpu_count()} cores split into {config.cpu_devices} cpu devices, numpy "
          f"{np.__version__}, jax {jax.__version__ if with_jax else 'not measured'}; load average "
          f"{os.getloadavg()[0]:.1f} (other processes on these cores skew the times)")
    print(f"host copy bandwidth: {memory_bandwidth():.1f} GB/s (256 MiB np.copyto, read + write counted)")
    print(f"allreduce_algorithm chooses {', '.join(sorted({_chosen(b, n) for n in args.devices for b in sizes}))} "
          f"(RING_MIN_BYTES = {_size(collectives.RING_MIN_BYTES)}); 'chosen' below names its choice per size")
    rows = [row for n in args.devices for row in measure(n, sizes, with_jax)]
    print()
    for n in args.devices: print(crossover(rows, n))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"date": date, "command": " ".join(["python -m bench.allreduce", *argv]),
                       "cores": os.cpu_count(), "load_average": os.getloadavg(),
                       "memory_bandwidth_GB/s": memory_bandwidth(), "ring_min_bytes": collectives.RING_MIN_BYTES,
                       "results": rows}, f, indent=1)


if __name__ == "__main__":
    main(sys.argv[1:])
