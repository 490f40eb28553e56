"""The seed's collectives (broadcast, scatter, gather, reduce, allgather, reduce_scatter, allreduce) as COPY/RESHAPE/
REDUCE compositions compiled into one multi-device executable, and the faster allreduce schedules (ring, recursive
halving): each against numpy, the schedules against each other (integers exactly, floats to rounding), every device
receiving the same bits, results on the devices they belong to."""
import numpy as np
import pytest

import fnx
import fnx.numpy as jnp
from fnx import dtypes
from fnx.backends.device import get_device
from fnx.sharding import collectives
from fnx.uop import CollectiveArg, Ops, ParamArg, UOp


def _run(build, host: list[np.ndarray], devices: list[str]) -> list[tuple[str, np.ndarray]]:
    """Compile `build(params, devices)` (one PARAM per input, on its device) and run it on `host`'s values."""
    dtype = dtypes.from_numpy(host[0].dtype)
    params = [UOp(Ops.PARAM, dtype, (), ParamArg(j, h.shape, d)) for j, (h, d) in enumerate(zip(host, devices))]
    outs = build(params, devices)
    outs = outs if isinstance(outs, list) else [outs]
    outs = [o if o.op is not Ops.PARAM else UOp(Ops.CONTIGUOUS, o.dtype, (o,)) for o in outs]
    fn = UOp(Ops.FUNCTION, dtypes.bool_, (UOp(Ops.TUPLE, dtypes.bool_, tuple(outs)), *params))
    buffers = [get_device(d).allocator.from_numpy(h) for h, d in zip(host, devices)]
    results = get_device(devices[0]).compile(fn)(buffers)
    return [(b.device, get_device(b.device).allocator.copyout(b).reshape(o.shape)) for b, o in zip(results, outs)]


def _inputs(n, shape, dtype=np.float32, seed=0):
    rng = np.random.default_rng(seed)
    if np.dtype(dtype).kind == "i": return [rng.integers(-100, 100, shape).astype(dtype) for _ in range(n)]
    return [rng.standard_normal(shape).astype(dtype) for _ in range(n)]


@pytest.mark.parametrize("n", [2, 3, 4, 8])
def test_seed_collectives_against_numpy(cpus, n):
    names = [d.name for d in cpus[:n]]
    xs = _inputs(n, (n * 3, 2), seed=n)
    total = np.sum(np.stack(xs), axis=0)
    out = _run(lambda p, d: collectives.broadcast(p[1], d), xs, names)
    for k, (where, value) in enumerate(out):
        assert where == names[k]
        np.testing.assert_array_equal(value, xs[1])
    out = _run(lambda p, d: collectives.scatter(p[0], d), xs, names)
    for k, (where, value) in enumerate(out):
        assert where == names[k]
        np.testing.assert_array_equal(value, xs[0][3 * k:3 * k + 3])
    (where, value), = _run(lambda p, d: collectives.gather(p, d, root=n - 1), xs, names)
    assert where == names[-1]
    np.testing.assert_array_equal(value, np.concatenate(xs))
    (where, value), = _run(lambda p, d: collectives.reduce(p, d, root=0), xs, names)
    np.testing.assert_allclose(value, total, rtol=1e-6, atol=1e-6)
    for k, (where, value) in enumerate(_run(lambda p, d: collectives.allgather(p, d), xs, names)):
        assert where == names[k]
        np.testing.assert_array_equal(value, np.stack(xs))
    for k, (where, value) in enumerate(_run(lambda p, d: collectives.reduce_scatter(p, d), xs, names)):
        np.testing.assert_allclose(value, total[3 * k:3 * k + 3], rtol=1e-6, atol=1e-6)
    for k, (where, value) in enumerate(_run(lambda p, d: collectives.allreduce(p, d), xs, names)):
        assert where == names[k]
        np.testing.assert_allclose(value, total, rtol=1e-6, atol=1e-6)


SCHEDULES = [collectives.allreduce, collectives.reduce_broadcast, collectives.ring_allreduce,
             collectives.halving_allreduce]


@pytest.mark.parametrize("n", [2, 3, 4, 8])
@pytest.mark.parametrize("size", [1, 5, 24, 4096])
def test_allreduce_schedules_agree(cpus, n, size):
    names = [d.name for d in cpus[:n]]
    ints = _inputs(n, (size,), np.int32, seed=size)
    floats = _inputs(n, (size,), np.float32, seed=size + 1)
    for schedule in SCHEDULES:
        out = _run(lambda p, d: schedule(p, d), ints, names)
        for k, (where, value) in enumerate(out):
            assert where == names[k]
            np.testing.assert_array_equal(value, np.sum(np.stack(ints), axis=0))  # integers: exactly
        out = _run(lambda p, d: schedule(p, d), floats, names)
        first = out[0][1]
        for _, value in out: np.testing.assert_array_equal(value, first)  # every device gets the same bits
        np.testing.assert_allclose(first, np.sum(np.stack(floats).astype(np.float64), axis=0), rtol=1e-5,
                                   atol=1e-5)


def test_algorithm_is_chosen_by_size():
    assert collectives.allreduce_algorithm(1024, 4) is collectives.reduce_broadcast
    big = collectives.RING_MIN_BYTES
    assert collectives.allreduce_algorithm(big, 4) is collectives.halving_allreduce
    assert collectives.allreduce_algorithm(big, 6) is collectives.ring_allreduce
    assert collectives.allreduce_algorithm(big, 2) is collectives.reduce_broadcast


@pytest.mark.parametrize("kind", ["psum", "pmax", "pmin", "all_gather", "psum_scatter", "ppermute", "all_to_all"])
def test_run_over_the_groups_of_a_mesh(mesh24, kind):
    """collectives.run within the groups of mesh axis "model" (two groups of four), against numpy."""
    groups = [[d.name for d in g] for g in mesh24.groups("model")]
    arg = CollectiveArg(kind, "model", 4, 1 if kind == "all_to_all" else 0,
                        ((0, 1), (1, 2), (2, 3), (3, 0)) if kind == "ppermute" else (), 0)
    xs = {d: x for g in groups for d, x in zip(g, _inputs(4, (8, 4), seed=len(g[0]) + ord(g[0][-1])))}
    values = {d: get_device(d).allocator.from_numpy(x) for d, x in xs.items()}
    out = collectives.run(arg, (8, 4), dtypes.float32, groups, values)
    for group in groups:
        stack = np.stack([xs[d] for d in group])
        for k, d in enumerate(group):
            expected = {"psum": stack.sum(0), "pmax": stack.max(0), "pmin": stack.min(0), "all_gather": stack,
                        "psum_scatter": stack.sum(0)[2 * k:2 * k + 2], "ppermute": stack[(k - 1) % 4],
                        "all_to_all": np.concatenate([s[2 * k:2 * k + 2] for s in stack], axis=1)}[kind]
            assert out[d].device == d
            got = get_device(d).allocator.copyout(out[d]).reshape(expected.shape)
            np.testing.assert_allclose(got, expected, rtol=1e-6, atol=1e-6)


def test_collective_waits_for_values_still_being_computed(cpus):
    """Inputs computed asynchronously on each device's own stream: the collective reads them only when done."""
    names = [d.name for d in cpus[:4]]
    big = [fnx.device_put(np.full((1 << 20,), i + 1, np.float32), names[i]) for i in range(4)]
    work = fnx.jit(lambda x: jnp.sqrt(x * x) * 2.0)
    values = {names[i]: work(big[i])._buffer for i in range(4)}
    out = collectives.run(CollectiveArg("psum", "i", 4, 0), (1 << 20,), dtypes.float32, [names], values)
    for d in names:
        np.testing.assert_array_equal(get_device(d).allocator.copyout(out[d]), np.full((1 << 20,), 20, np.float32))
