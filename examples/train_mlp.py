"""The main job: train an MLP on scikit-learn's bundled handwritten digits with jit(value_and_grad) + adam on the
CPU, show the loss falling, and report the test accuracy: one line per epoch (mean loss, test accuracy, seconds),
and on a terminal a progress bar over the whole run with the current loss.

    python examples/train_mlp.py [--epochs 30] [--batch 64]
"""
from __future__ import annotations

import argparse
import sys
import time

import numpy as np
from sklearn.datasets import load_digits
from tqdm import tqdm

import fnx
import fnx.numpy as jnp
from fnx import nn, optim, random


def init_params(key, sizes: list[int]) -> dict:
    params = {}
    keys = random.split(key, len(sizes) - 1)
    for i, (n_in, n_out) in enumerate(zip(sizes[:-1], sizes[1:])):
        params[f"w{i}"] = nn.initializers.glorot_normal()(keys[i], (n_in, n_out))
        params[f"b{i}"] = jnp.zeros(n_out)
    return params


def forward(params: dict, x):
    layers = len(params) // 2
    for i in range(layers - 1):
        x = nn.relu(x @ params[f"w{i}"] + params[f"b{i}"])
    return x @ params[f"w{layers - 1}"] + params[f"b{layers - 1}"]


def loss_fn(params: dict, x, y):
    logits = forward(params, x)
    return -jnp.mean(jnp.sum(nn.log_softmax(logits) * nn.one_hot(y, 10), axis=-1))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--epochs", type=int, default=30)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--lr", type=float, default=2e-3)
    args = parser.parse_args()

    digits = load_digits()
    x_all = (digits.data / 16.0).astype(np.float32)
    y_all = digits.target.astype(np.int32)
    order = np.random.default_rng(0).permutation(len(x_all))
    split = int(0.8 * len(x_all))
    train, test = order[:split], order[split:]
    x_train, y_train, x_test, y_test = x_all[train], y_all[train], x_all[test], y_all[test]
    print(f"digits: {len(train)} train / {len(test)} test images of 8x8 pixels, 10 classes")

    params = init_params(random.PRNGKey(0), [64, 128, 128, 10])
    opt = optim.adam(args.lr)
    state = opt.init(params)

    @fnx.jit
    def step(params, state, x, y):
        loss, grads = fnx.value_and_grad(loss_fn)(params, x, y)
        updates, state = opt.update(grads, state, params)
        return optim.apply_updates(params, updates), state, loss

    @fnx.jit
    def accuracy(params, x, y):
        return jnp.mean(jnp.argmax(forward(params, x), axis=-1) == y)

    steps_per_epoch = len(x_train) // args.batch
    rng = np.random.default_rng(1)
    # on a terminal, one bar over the whole run with the running loss; always one plain line per epoch (a log keeps
    # exactly these lines: `python examples/train_mlp.py | cat` shows no bar)
    bar = tqdm(total=args.epochs * steps_per_epoch, unit="step", ncols=100, mininterval=0.2, file=sys.stdout,
               disable=not sys.stdout.isatty())
    start = time.perf_counter()
    first_step = None
    for epoch in range(args.epochs):
        epoch_start = time.perf_counter()
        perm = rng.permutation(len(x_train))
        losses = []
        for i in range(steps_per_epoch):
            idx = perm[i * args.batch:(i + 1) * args.batch]
            t0 = time.perf_counter()
            params, state, loss = step(params, state, jnp.asarray(x_train[idx]), jnp.asarray(y_train[idx]))
            losses.append(float(loss))
            if first_step is None: first_step = time.perf_counter() - t0
            bar.set_postfix_str(f"epoch {epoch + 1}/{args.epochs} loss {losses[-1]:.4f}", refresh=False)
            bar.update(1)
        test_acc = float(accuracy(params, jnp.asarray(x_test), jnp.asarray(y_test)))
        line = (f"epoch {epoch + 1:{len(str(args.epochs))}d}/{args.epochs}  loss {np.mean(losses):.4f}  "
                f"test acc {test_acc:.3f}  {time.perf_counter() - epoch_start:.2f} s")
        if bar.disable: print(line, flush=True)
        else: bar.write(line, file=sys.stdout)
    bar.close()
    elapsed = time.perf_counter() - start
    test_acc = float(accuracy(params, jnp.asarray(x_test), jnp.asarray(y_test)))
    total_steps = args.epochs * steps_per_epoch
    print(f"final test accuracy {test_acc:.3f} after {total_steps} steps in {elapsed:.1f} s "
          f"(first step, with tracing and compiling: {first_step:.2f} s)")
    if test_acc < 0.95:
        raise SystemExit(f"test accuracy {test_acc:.3f} is below 0.95")


if __name__ == "__main__":
    main()
