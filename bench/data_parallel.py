"""Data-parallel training steps on 1, 2 and 4 of the host's cpu devices: time per step and scaling, fnx and JAX.

    python -m bench.data_parallel                        # both models on 1, 2, 4 devices (~1 min on 2 cores)
    python -m bench.data_parallel --model mlp --devices 1 2
    python -m bench.data_parallel --json out.json        # also write every result as JSON

(Run from the repository root: it imports bench.run.)

The models are bench/run.py's: W4's MLP step (784-512-10) at batch 1024, and W9's GPT step (2 layers, d=128,
batch 16 of 64 tokens). A step is `fnx.jit` of value_and_grad and an SGD update. The batch is laid out over the
mesh axis "data" (`fnx.device_put(x, NamedSharding(mesh, P("data")))`) and the parameters replicated (`P()`), so
the partitioner sums the gradients with a psum. The global batch is the same on every device count (strong
scaling): n devices hold 1/n of it each. A step is timed best-of-N, parameters fed back, until the new
parameters and the loss are computed.

Each device count runs in a fresh process with the host split into that many cpu devices (as FNX_CPU_DEVICES=n:
the FNX_CPU_THREADS worker threads are shared out evenly when the devices are made, so one device gets all the
cores), JAX on as many XLA cpu devices. This host has os.cpu_count() cores: beyond that many devices they share
cores and a step cannot get faster, so what the larger counts show there is the cost of partitioning and
collectives. "no mesh" is the plain jitted step on one device with all the cores.

Before timing (untimed), a few steps on the mesh are checked against the same steps of the unsharded jit: losses
and parameters agree to float32 rounding; JAX's first loss agrees with fnx's.
"""
from __future__ import annotations

import argparse
import concurrent.futures
import datetime
import json
import multiprocessing
import os
import sys
import time

import numpy as np

import fnx
import fnx.numpy as jnp
from bench.run import GPT, _gpt_params, _gpt_step, _mlp_data, _mlp_step, best, jax
from fnx.config import config
from fnx.sharding import NamedSharding, P

MLP_BATCH = 1024
CHECKED_STEPS = 3


def mlp():
    """W4's MLP parameters and a batch of MLP_BATCH (inputs, one-hot labels); its step, given a numpy module."""
    params, _, _ = _mlp_data()
    rng = np.random.default_rng(1)
    x = rng.standard_normal((MLP_BATCH, 784)).astype(np.float32)
    onehot = np.eye(10, dtype=np.float32)[rng.integers(0, 10, MLP_BATCH)]
    return params, (x, onehot), _mlp_step, f"W4 MLP 784-512-10, batch {MLP_BATCH}"


def gpt():
    """W9's GPT parameters and a batch of (tokens, next tokens); its step, given a numpy module."""
    rng = np.random.default_rng(0)
    params = _gpt_params(rng)
    data = rng.integers(0, GPT["vocab"], (GPT["batch"], GPT["seq"] + 1)).astype(np.int32)
    shape = "{layers} layers d={d} {heads} heads, batch {batch} x {seq} tokens".format(**GPT)
    return params, (data[:, :-1], data[:, 1:]), _gpt_step, f"W9 GPT {shape}"


MODELS = {"mlp": mlp, "gpt": gpt}
REPEAT = {"mlp": 7, "gpt": 3}


def _timed_loop(step, params, batch, block, repeat: int) -> float:
    """Best seconds per training step, each one's parameters feeding the next."""
    state = [params]

    def once():
        state[0], loss = step(state[0], *batch)
        block((state[0], loss))
    return best(once, repeat=repeat)


def measure(model: str, n: int) -> dict:
    """In a fresh process: the model's step on a mesh of n cpu devices (and JAX's on n XLA cpu devices), checked
    against the unsharded jit, then timed. Returns seconds per step (and, on one device, without a mesh)."""
    config.cpu_devices = n  # (as FNX_CPU_DEVICES=n: read when the first cpu device is made, which is below)
    if jax: jax.config.update("jax_num_cpu_devices", n)
    params, batch, make_step, _ = MODELS[model]()
    step = fnx.jit(make_step(jnp, fnx.nn, fnx.value_and_grad))
    mesh = fnx.make_mesh((n,), ("data",))
    on_mesh = fnx.device_put(params, NamedSharding(mesh, P())), fnx.device_put(batch, NamedSharding(mesh, P("data")))
    plain = {k: jnp.asarray(v) for k, v in params.items()}, tuple(jnp.asarray(b) for b in batch)
    start = time.perf_counter()
    p, loss = step(on_mesh[0], *on_mesh[1])
    fnx.block_until_ready((p, loss))
    first_call = time.perf_counter() - start
    p_plain, loss_plain = step(plain[0], *plain[1])
    losses = [(float(loss), float(loss_plain))]
    for _ in range(CHECKED_STEPS - 1):
        p, loss = step(p, *on_mesh[1])
        p_plain, loss_plain = step(p_plain, *plain[1])
        losses.append((float(loss), float(loss_plain)))
    np.testing.assert_allclose(*zip(*losses), rtol=1e-5, err_msg=f"{model}: losses on {n} devices vs unsharded")
    for k in params:
        np.testing.assert_allclose(np.asarray(p[k]), np.asarray(p_plain[k]), rtol=1e-5, atol=1e-6,
                                   err_msg=f"{model}: parameter {k} after {CHECKED_STEPS} steps on {n} devices")
    out = {"fnx": _timed_loop(step, *on_mesh, fnx.block_until_ready, REPEAT[model]), "fnx_first_call": first_call,
           "losses": [a for a, _ in losses]}
    if n == 1: out["fnx_no_mesh"] = _timed_loop(step, *plain, fnx.block_until_ready, REPEAT[model])
    if jax:
        import jax.numpy as jjnp
        from jax.sharding import Mesh as JaxMesh, NamedSharding as JaxSharding, PartitionSpec as JaxP
        jmesh = JaxMesh(np.array(jax.devices("cpu")[:n]), ("data",))
        jstep = jax.jit(make_step(jjnp, jax.nn, jax.value_and_grad))
        jparams, jbatch = jax.device_put(params, JaxSharding(jmesh, JaxP())), jax.device_put(
            batch, JaxSharding(jmesh, JaxP("data")))
        np.testing.assert_allclose(float(jstep(jparams, *jbatch)[1]), losses[0][0], rtol=1e-4)
        out["jax"] = _timed_loop(jstep, jparams, jbatch, jax.block_until_ready, REPEAT[model])
        if n == 1:
            out["jax_no_mesh"] = _timed_loop(jstep, jax.device_put(params), jax.device_put(batch),
                                             jax.block_until_ready, REPEAT[model])
    return out


def in_fresh_process(model: str, n: int) -> dict:
    """measure(model, n) in a new Python process (a process's cpu devices are made once)."""
    with concurrent.futures.ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as pool:
        return pool.submit(measure, model, n).result()


def report(model: str, counts: list[int]) -> list[dict]:
    """Measure the model on each device count; print its table; return JSON rows."""
    _, batch, _, title = MODELS[model]()
    results = {n: in_fresh_process(model, n) for n in counts}
    base = results[counts[0]]
    impls = ["fnx", "jax"] if "jax" in base else ["fnx"]
    print(f"\n{title}: ms per step, speedup over {counts[0]} device(s) (efficiency: speedup / devices)")
    print(f"{'devices':>7} {'batch/dev':>9} | " + " | ".join(f"{i + ' ms':>9} {'speedup':>7} {'eff':>4}"
                                                             for i in impls) + " | fnx first call")
    rows = []
    for n, res in results.items():
        cells = []
        for impl in impls:
            speedup = base[impl] / res[impl]
            cells.append(f"{res[impl] * 1e3:9.2f} {speedup:6.2f}x {speedup * counts[0] / n:4.0%}")
            rows.append({"model": model, "devices": n, "implementation": impl, "seconds": res[impl],
                         "per_device_batch": len(batch[0]) // n, "speedup": speedup})
        rows[-len(impls)]["first_call_seconds"] = res["fnx_first_call"]
        rows[-len(impls)]["losses"] = res["losses"]
        print(f"{n:>7} {len(batch[0]) // n:>9} | " + " | ".join(cells) + f" | {res['fnx_first_call']:.1f} s")
    if 1 in results:
        plain = results[1]
        print(f"{'no mesh':>7} {len(batch[0]):>9} | " + " | ".join(f"{plain[i + '_no_mesh'] * 1e3:9.2f}"
                                                                     + " " * 13 for i in impls))
        rows += [{"model": model, "devices": 1, "implementation": impl, "mesh": False,
                  "seconds": plain[impl + "_no_mesh"]} for impl in impls]
    return rows


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", nargs="+", choices=list(MODELS), default=list(MODELS), help="default: both")
    parser.add_argument("--devices", type=int, nargs="+", default=[1, 2, 4], help="device counts (default: 1 2 4)")
    parser.add_argument("--json", metavar="PATH", help="write every result as JSON")
    args = parser.parse_args(argv)
    date = datetime.date.today().isoformat()
    print(f"fnx data-parallel bench: {date}, {os.cpu_count()} cores (so at most {os.cpu_count()} devices can work "
          f"at once), numpy {np.__version__}, jax {jax.__version__ if jax else 'not installed'}; load average "
          f"{os.getloadavg()[0]:.1f} (other processes on these cores skew the times)")
    rows = [row for model in args.model for row in report(model, args.devices)]
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"date": date, "command": " ".join(["python -m bench.data_parallel", *argv]),
                       "cores": os.cpu_count(), "load_average": os.getloadavg(), "results": rows}, f, indent=1)


if __name__ == "__main__":
    main(sys.argv[1:])
