"""The models of bench/run.py's training workloads (W4's MLP step, W9's GPT step), written once for fnx and for
JAX: each takes the library's numpy, nn and value_and_grad. This module imports neither library, so the fresh
processes of W7 and W13 import only the one they measure: with JAX's objects also in the heap, the full
collection of Python's heap that falls in fnx's first call cost 50 ms of W7's warm 80-90 ms."""
from __future__ import annotations

import math

import numpy as np


def _sgd_step(loss, grad_fn, lr: float):
    """One SGD step on `loss(params, *batch)` (a dict of params), returning (new params, loss): the training step of
    W4, W9 and W11, with `grad_fn` fnx's or JAX's value_and_grad."""
    def step(p, *batch):
        value, g = grad_fn(loss)(p, *batch)
        return {k: p[k] - lr * g[k] for k in p}, value
    return step


def _mlp_data():
    rng = np.random.default_rng(0)
    params = {"w1": (rng.standard_normal((784, 512)) * 0.05).astype(np.float32), "b1": np.zeros(512, np.float32),
              "w2": (rng.standard_normal((512, 10)) * 0.05).astype(np.float32), "b2": np.zeros(10, np.float32)}
    x = rng.standard_normal((256, 784)).astype(np.float32)
    y = rng.integers(0, 10, 256)
    return params, x, y


def _mlp_step(lib, nn_lib, grad_fn):
    def loss(p, x, onehot):
        h = lib.maximum(x @ p["w1"] + p["b1"], 0)
        logits = h @ p["w2"] + p["b2"]
        return -lib.mean(lib.sum(nn_lib.log_softmax(logits) * onehot, axis=-1))

    return _sgd_step(loss, grad_fn, 0.01)


GPT = dict(layers=2, d=128, heads=4, seq=64, batch=16, vocab=256)


def _gpt_params(rng) -> dict:
    """A small GPT: token and position embeddings (the token one tied to the output), per layer a pre-norm
    attention block and a pre-norm GELU MLP block (4x wide)."""
    d, v, t = GPT["d"], GPT["vocab"], GPT["seq"]
    normal = lambda *shape: (rng.standard_normal(shape) * 0.02).astype(np.float32)  # noqa: E731
    p = {"wte": normal(v, d), "wpe": normal(t, d), "lnf_g": np.ones(d, np.float32), "lnf_b": np.zeros(d, np.float32)}
    for i in range(GPT["layers"]):
        p.update({f"ln1_g{i}": np.ones(d, np.float32), f"ln1_b{i}": np.zeros(d, np.float32),
                  f"qkv{i}": normal(d, 3 * d), f"proj{i}": normal(d, d),
                  f"ln2_g{i}": np.ones(d, np.float32), f"ln2_b{i}": np.zeros(d, np.float32),
                  f"fc{i}": normal(d, 4 * d), f"fc_b{i}": np.zeros(4 * d, np.float32), f"out{i}": normal(4 * d, d)})
    return p


def _gpt_step(lib, nn_lib, grad_fn):
    """One SGD step of next-token cross-entropy, written once for fnx and JAX (`lib` is their numpy)."""
    h_, t = GPT["heads"], GPT["seq"]

    def layernorm(x, g, b):
        mean = x.mean(-1, keepdims=True)
        var = ((x - mean) ** 2).mean(-1, keepdims=True)
        return (x - mean) / lib.sqrt(var + 1e-5) * g + b

    def loss(p, tokens, targets):
        b, d = tokens.shape[0], p["wte"].shape[1]
        x = p["wte"][tokens] + p["wpe"][None, :t]
        mask = lib.tril(lib.ones((t, t), bool)) if hasattr(lib, "tril") else lib.arange(t)[:, None] >= lib.arange(t)
        for i in range(GPT["layers"]):
            qkv = layernorm(x, p[f"ln1_g{i}"], p[f"ln1_b{i}"]) @ p[f"qkv{i}"]
            q, k, v = (qkv[..., j * d:(j + 1) * d].reshape(b, t, h_, d // h_).transpose(0, 2, 1, 3) for j in range(3))
            scores = lib.where(mask, q @ k.transpose(0, 1, 3, 2) / math.sqrt(d // h_), -1e9)  # (a Python float: weak)
            att = (nn_lib.softmax(scores, axis=-1) @ v).transpose(0, 2, 1, 3).reshape(b, t, d)
            x = x + att @ p[f"proj{i}"]
            hidden = nn_lib.gelu(layernorm(x, p[f"ln2_g{i}"], p[f"ln2_b{i}"]) @ p[f"fc{i}"] + p[f"fc_b{i}"])
            x = x + hidden @ p[f"out{i}"]
        logits = layernorm(x, p["lnf_g"], p["lnf_b"]) @ p["wte"].T
        logp = nn_lib.log_softmax(logits, axis=-1)
        return -lib.mean(lib.take_along_axis(logp, targets[..., None], axis=-1))

    return _sgd_step(loss, grad_fn, 0.1)
