"""Sharded training: a small GPT-style character language model trained data-parallel and tensor-parallel on a
mesh of host devices, its loss curve checked against the same training on one device.

    FNX_CPU_DEVICES=8 python examples/train_sharded.py                 # a 2x4 mesh: 2-way data, 4-way model
    FNX_CPU_DEVICES=8 python examples/train_sharded.py --mesh 8x1      # data parallel only
    mpirun -n 2 -x FNX_CPU_DEVICES=4 python examples/train_sharded.py --distributed   # 2 processes x 4 devices

The batch is split over mesh axis "data". The model is split over "model" as Megatron-LM splits it: each device
holds a quarter of the attention heads (the columns of the q, k and v projections, the rows of the output
projection) and a quarter of the MLP's hidden units (columns of the first layer, rows of the second), so a block
needs one sum over "model" after its attention and one after its MLP. Nothing in the model code says so: the
parameters and the batch are laid out with NamedShardings, and jit's partitioner inserts the collectives.
"""
from __future__ import annotations

import argparse
import math
import time

import numpy as np

import fnx
import fnx.numpy as jnp
from fnx import nn, optim
from fnx.sharding import NamedSharding, P


def corpus() -> str:
    """Some English to model, from the standard library (nothing to download): argparse's documentation."""
    return argparse.__doc__

def init_params(rng: np.random.Generator, vocab: int, d: int, layers: int, seq: int) -> dict:
    normal = lambda *shape: (rng.standard_normal(shape) * 0.02).astype(np.float32)  # noqa: E731
    p = {"wte": normal(vocab, d), "wpe": normal(seq, d), "lnf_g": np.ones(d, np.float32),
         "lnf_b": np.zeros(d, np.float32)}
    for i in range(layers):
        p.update({f"ln1_g{i}": np.ones(d, np.float32), f"ln1_b{i}": np.zeros(d, np.float32),
                  f"wq{i}": normal(d, d), f"wk{i}": normal(d, d), f"wv{i}": normal(d, d), f"proj{i}": normal(d, d),
                  f"ln2_g{i}": np.ones(d, np.float32), f"ln2_b{i}": np.zeros(d, np.float32),
                  f"fc{i}": normal(d, 4 * d), f"fc_b{i}": np.zeros(4 * d, np.float32), f"out{i}": normal(4 * d, d)})
    return p


def param_specs(params: dict) -> dict:
    """Megatron-style: heads and MLP hidden units split over "model"; embeddings and norms replicated."""
    def spec(name: str) -> P:
        if name.startswith(("wq", "wk", "wv", "fc")) and not name.startswith("fc_b"): return P(None, "model")
        if name.startswith("fc_b"): return P("model")
        if name.startswith(("proj", "out")): return P("model", None)
        return P()
    return {k: spec(k) for k in params}


def layernorm(x, g, b):
    mean = x.mean(-1, keepdims=True)
    var = ((x - mean) ** 2).mean(-1, keepdims=True)
    return (x - mean) / jnp.sqrt(var + 1e-5) * g + b


def loss_fn(p: dict, tokens, targets, heads: int, layers: int):
    b, t = tokens.shape
    d = p["wte"].shape[1]
    x = p["wte"][tokens] + p["wpe"][None, :t]
    causal = jnp.arange(t)[:, None] >= jnp.arange(t)[None, :]
    for i in range(layers):
        h = layernorm(x, p[f"ln1_g{i}"], p[f"ln1_b{i}"])
        q, k, v = ((h @ p[f"w{n}{i}"]).reshape(b, t, heads, d // heads).transpose(0, 2, 1, 3) for n in "qkv")
        scores = jnp.where(causal, q @ k.transpose(0, 1, 3, 2) / math.sqrt(d // heads), -1e9)
        att = (nn.softmax(scores, axis=-1) @ v).transpose(0, 2, 1, 3).reshape(b, t, d)
        x = x + att @ p[f"proj{i}"]
        hidden = nn.gelu(layernorm(x, p[f"ln2_g{i}"], p[f"ln2_b{i}"]) @ p[f"fc{i}"] + p[f"fc_b{i}"])
        x = x + hidden @ p[f"out{i}"]
    logits = layernorm(x, p["lnf_g"], p["lnf_b"]) @ p["wte"].T
    logp = nn.log_softmax(logits, axis=-1)
    return -jnp.mean(jnp.take_along_axis(logp, targets[..., None], axis=-1))


def batches(text: str, batch: int, seq: int, steps: int, seed: int):
    chars = sorted(set(text))
    ids = np.array([chars.index(c) for c in text], np.int32)
    rng = np.random.default_rng(seed)
    for _ in range(steps):
        starts = rng.integers(0, len(ids) - seq - 1, batch)
        window = np.stack([ids[s:s + seq + 1] for s in starts])
        yield window[:, :-1], window[:, 1:]


def train(args, mesh=None) -> list[float]:
    """Train for args.steps steps (over `mesh`, or on one device when it is None); the losses."""
    text = corpus()
    vocab = len(set(text))
    host = init_params(np.random.default_rng(0), vocab, args.d, args.layers, args.seq)
    tx = optim.adam(args.lr)
    if mesh is None:
        params = {k: jnp.asarray(v) for k, v in host.items()}
        place = lambda tokens: jnp.asarray(tokens)  # noqa: E731
    else:
        specs = param_specs(host)
        params = {k: fnx.device_put(v, NamedSharding(mesh, specs[k])) for k, v in host.items()}
        place = lambda tokens: fnx.device_put(tokens, NamedSharding(mesh, P("data", None)))  # noqa: E731
    state = tx.init(params)

    @fnx.jit
    def step(params, state, tokens, targets):
        loss, grads = fnx.value_and_grad(loss_fn)(params, tokens, targets, args.heads, args.layers)
        updates, state = tx.update(grads, state, params)
        return optim.apply_updates(params, updates), state, loss

    losses = []
    for tokens, targets in batches(text, args.batch, args.seq, args.steps, seed=1):
        params, state, loss = step(params, state, place(tokens), place(targets))
        losses.append(float(loss))
    return losses


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--mesh", default="2x4", help="data x model devices (default 2x4)")
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--seq", type=int, default=32)
    parser.add_argument("--d", type=int, default=64)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--distributed", action="store_true", help="under mpirun: one process per rank")
    parser.add_argument("--no-check", action="store_true", help="skip the single-device run to compare with")
    args = parser.parse_args()
    if args.distributed: fnx.distributed.initialize()
    data, model = (int(n) for n in args.mesh.split("x"))
    mesh = fnx.make_mesh((data, model), ("data", "model"))
    lead = fnx.process_index() == 0

    start = time.perf_counter()
    sharded = train(args, mesh)
    seconds = time.perf_counter() - start
    if lead:
        print(f"mesh {mesh} over {len(fnx.devices())} devices: {args.steps} steps in {seconds:.1f} s "
              "(the first step compiles)")
        shown = sorted(set(range(0, args.steps, max(1, args.steps // 10))) | {args.steps - 1})
        for i in shown: print(f"  step {i:3d}  loss {sharded[i]:.4f}")
    assert sharded[-1] < sharded[0], f"the loss did not fall: {sharded[0]:.4f} -> {sharded[-1]:.4f}"
    if not args.no_check:
        single = train(args)
        gap = max(abs(a - b) / max(abs(b), 1e-6) for a, b in zip(sharded, single))
        if lead: print(f"largest relative gap to the single-device run over {args.steps} steps: {gap:.2e}")
        assert gap < 1e-3, f"the sharded loss curve left the single-device one (relative gap {gap:.2e})"


if __name__ == "__main__":
    main()
