"""Run by tests/sharding/test_distributed.py under `mpirun -n P` with FNX_CPU_DEVICES=L: one process of a
multi-process fnx program. It checks what a process can check alone (its devices, its shards against the numpy
value they come from) and writes what needs every process (the bits of its results) to `<out>/rank<r>.json`,
with the largest error of each comparison, for the test to assert on.

    mpirun -n 2 env FNX_CPU_DEVICES=2 python tests/sharding/mpi_program.py OUTDIR
"""
import functools
import hashlib
import json
import os
import sys

import numpy as np

import fnx

try:
    fnx.distributed.initialize(num_processes=999)
    init_error = ""
except ValueError as err:
    init_error = str(err)
fnx.distributed.initialize(cluster_detection_method="mpi4py")
try:
    fnx.distributed.initialize()
    twice_error = ""
except RuntimeError as err:
    twice_error = str(err)

import fnx.numpy as jnp  # noqa: E402
from fnx import lax  # noqa: E402
from fnx.sharding import Mesh, NamedSharding, P  # noqa: E402

rank, procs = fnx.process_index(), fnx.process_count()
local = len(fnx.local_devices())
n = procs * local
report: dict = {"rank": rank, "errors": {}, "digests": {}, "init_error": init_error, "twice_error": twice_error}


def error(x, expected) -> float:
    """The largest |difference| between this process's shards of `x` and the slices of `expected` they hold."""
    worst = 0.0
    shards = x.addressable_shards
    assert len(shards) == len([d for d in x.sharding.mesh.flat_devices if d.process_index == rank])
    for s in shards:
        got, want = np.asarray(s.data), np.asarray(expected)[s.index]
        assert got.shape == want.shape, (got.shape, want.shape, s.index)
        if got.size: worst = max(worst, float(np.max(np.abs(got.astype(np.float64) - want))))
    return worst


def check(name: str, x, expected) -> None:
    report["errors"][name] = error(x, expected)


def digest(name: str, x) -> None:
    """The bytes of every shard this process holds, for the test to compare between processes."""
    report["digests"][name] = {s.device.name: hashlib.sha256(np.asarray(s.data).tobytes()).hexdigest()
                               for s in x.addressable_shards}


# ---- devices ----
devices = fnx.devices()
report["devices"] = [d.name for d in devices]
report["local"] = [d.name for d in fnx.local_devices()]
report["owners"] = [d.process_index for d in devices]
report["addressable"] = [d.addressable for d in devices]
report["default"] = fnx.numpy.zeros(2).device.name
report["count"] = [fnx.device_count(), fnx.local_device_count(), procs]
report["bare cpu"] = fnx.device_put(1.0, "cpu").device.name
remote = next(d for d in devices if not d.addressable)
try:
    fnx.device_put(np.ones(2), remote)
    report["remote_error"] = ""
except ValueError as err:
    report["remote_error"] = str(err)

# ---- arrays over a mesh that spans the processes ----
mesh = fnx.make_mesh((procs, local), ("data", "model"))  # "data" crosses processes, "model" stays in one
rng = np.random.default_rng(0)
host = rng.standard_normal((procs * 4, 6)).astype(np.float32)
x = fnx.device_put(host, NamedSharding(mesh, P("data", "model")))
check("device_put", x, host)
report["fully_addressable"] = x.is_fully_addressable
try:
    np.asarray(x)
    report["assemble_error"] = ""
except RuntimeError as err:
    report["assemble_error"] = str(err)
made = fnx.make_array_from_callback(host.shape, NamedSharding(mesh, P("data")), lambda index: host[index])
check("make_array_from_callback", made, host)

# ---- jit and eager ops whose reductions cross processes ----
check("jit sum over rows", fnx.jit(lambda a: (a * a).sum(axis=0))(x), (host.astype(np.float64) ** 2).sum(0))
check("jit mean", fnx.jit(lambda a: jnp.mean(a) + jnp.max(a))(x), host.astype(np.float64).mean() + host.max())
check("eager sum", (x * 2).sum(axis=0), 2 * host.astype(np.float64).sum(0))

# ---- shard_map collectives over all n devices (within and across processes), in order and interleaved ----
ints = np.arange(n * 2 * n * 3, dtype=np.float32).reshape(n * 2 * n, 3) - 40  # exact in float32
blocks = ints.reshape(n, 2 * n, 3)
halves = rng.standard_normal((n * 3, 5)).astype(np.float16)
in_float32 = halves.reshape(n, 3, 5)[0].astype(np.float32)
for j in range(1, n): in_float32 = in_float32 + halves.reshape(n, 3, 5)[j].astype(np.float32)
shift = [(j, (j + 1) % n) for j in range(n)]
partial = [(j, j + 1) for j in range(n - 1)]  # device 0 is no pair's destination: zeros
shifted = np.concatenate([np.zeros_like(blocks[:1]), blocks[:-1]]).reshape(ints.shape)
swapped = np.stack([np.concatenate([np.split(blocks[j], n, 0)[k] for j in range(n)], 1) for k in range(n)])
ordered = fnx.make_mesh((n,), ("i",))
interleaved = Mesh(np.array([d for k in range(local) for d in devices[k::local]]), ("i",))  # processes alternate


def over(line, f, out_specs=P()):
    return fnx.jit(fnx.shard_map(f, mesh=line, in_specs=P("i"), out_specs=out_specs))


for line, tag in ((ordered, ""), (interleaved, " interleaved")):
    smap = functools.partial(over, line)
    row = NamedSharding(line, P("i"))
    xi = fnx.device_put(ints, row)
    check("psum" + tag, smap(lambda b: lax.psum(b, "i"))(xi), blocks.sum(0))
    check("pmax" + tag, smap(lambda b: lax.pmax(b, "i"))(xi), blocks.max(0))
    check("pmin" + tag, smap(lambda b: lax.pmin(b, "i"))(xi), blocks.min(0))
    check("all_gather" + tag, smap(lambda b: lax.all_gather(b, "i"))(xi), blocks)
    check("all_gather tiled" + tag, smap(lambda b: lax.all_gather(b, "i", axis=1, tiled=True))(xi),
          np.concatenate(list(blocks), axis=1))
    check("psum_scatter" + tag, smap(lambda b: lax.psum_scatter(b, "i", tiled=True), P("i"))(xi), blocks.sum(0))
    check("ppermute ring" + tag, smap(lambda b: lax.ppermute(b, "i", shift), P("i"))(xi),
          np.roll(blocks, 1, 0).reshape(ints.shape))
    check("ppermute partial" + tag, smap(lambda b: lax.ppermute(b, "i", partial), P("i"))(xi), shifted)
    check("all_to_all" + tag, smap(lambda b: lax.all_to_all(b, "i", 0, 1, tiled=True), P("i"))(xi),
          swapped.reshape(n * 2, 3 * n))
    check("psum int32" + tag, smap(lambda b: lax.psum((b.astype(np.int32) % 3 == 0).astype(np.int32), "i"))(xi),
          (blocks.astype(np.int32) % 3 == 0).astype(np.int32).sum(0))
    check("psum float16 (added in float32)" + tag, smap(lambda b: lax.psum(b, "i"))(fnx.device_put(halves, row)),
          in_float32.astype(np.float16))

# ---- a collective over one axis of a 2-d mesh: groups with several devices in each process ----
if n % 4 == 0:
    grid = fnx.make_mesh((n // 4, 4), ("a", "b"))
    g = fnx.jit(fnx.shard_map(lambda b: lax.psum(b, "b"), mesh=grid, in_specs=P("a", "b"), out_specs=P("a")))
    values = rng.standard_normal((n // 4 * 2, 4 * 3)).astype(np.float32)
    expect = values.reshape(n // 4, 2, 4, 3).sum(2, dtype=np.float64).reshape(n // 4 * 2, 3)
    check("psum over b of (a, b)", g(fnx.device_put(values, NamedSharding(grid, P("a", "b")))), expect)

# ---- the same bits on every process: psum of random floats, summed in group order ----
noise = rng.standard_normal((n * 5, 7)).astype(np.float32)
summed = over(ordered, lambda b: lax.psum(b, "i"))(fnx.device_put(noise, NamedSharding(ordered, P("i"))))
in_order = noise.reshape(n, 5, 7)[0].copy()
for j in range(1, n): in_order = in_order + noise.reshape(n, 5, 7)[j]
check("psum in group order (bits)", summed, in_order)
digest("psum of random floats", summed)

# ---- the gradient of a data-parallel loss ----
features = rng.standard_normal((n * 4, 3)).astype(np.float32)
targets = rng.standard_normal(n * 4).astype(np.float32)
w = np.array([0.5, -1.0, 2.0], np.float32)


def loss(w, a, y):
    return jnp.mean((a @ w - y) ** 2)


row = NamedSharding(ordered, P("i"))
value, grad = fnx.jit(fnx.value_and_grad(loss))(w, fnx.device_put(features, row), fnx.device_put(targets, row))
f64, t64, w64 = features.astype(np.float64), targets.astype(np.float64), w.astype(np.float64)
residual = f64 @ w64 - t64
check("data-parallel loss", value, np.mean(residual ** 2))
check("data-parallel grad", grad, 2 * f64.T @ residual / len(t64))
digest("data-parallel grad", grad)

os.makedirs(sys.argv[1], exist_ok=True)
with open(os.path.join(sys.argv[1], f"rank{rank}.json"), "w") as f: json.dump(report, f)
fnx.distributed.shutdown()
