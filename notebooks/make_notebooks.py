"""Writes the notebooks of this folder from the cells below, without outputs.

    python notebooks/make_notebooks.py          # rewrite the .ipynb files
    python notebooks/make_notebooks.py --check  # exit 1 if a stored .ipynb differs from what this writes

Edit the cells here, not in Jupyter: tests/test_notebooks.py runs every notebook and checks that the stored files
are exactly what this script writes (so a notebook saved with outputs, or edited by hand, fails the tests). Each
notebook checks its own results (`assert` against numpy or a float64 reference) and ends with a cell printing
"all checks passed".
"""
from __future__ import annotations

import argparse
import os
import sys

import nbformat
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook

HERE = os.path.dirname(os.path.abspath(__file__))
PASSED = "all checks passed"

QUICKSTART = [
    ("md", """# fnx in ten minutes: jit, grad, vmap and the traced graph

fnx follows JAX's API (`import fnx as jax; import fnx.numpy as jnp` runs typical JAX code) and compiles with its own
kernel compiler to LLVM on the CPU. This notebook shows the three transformations users start with, checks every
result against numpy, and draws the graph fnx traces."""),
    ("code", """import time

import numpy as np

import fnx
import fnx.numpy as jnp

print("fnx", fnx.__version__, "on", fnx.devices())"""),
    ("md", """## `jit`: trace once, compile to kernels

`fnx.jit(f)` traces `f` on the shapes and dtypes of its arguments, compiles the graph into fused kernels, and reuses
them on later calls with the same shapes. Numpy arrays can be passed directly."""),
    ("code", """def predict(w, b, x):
    return jnp.tanh(x @ w + b)

rng = np.random.default_rng(0)
w_np = rng.standard_normal((3, 2)).astype(np.float32)
b_np = rng.standard_normal(2).astype(np.float32)
x_np = rng.standard_normal((5, 3)).astype(np.float32)
t_np = rng.standard_normal((5, 2)).astype(np.float32)

fast_predict = fnx.jit(predict)
y = fast_predict(w_np, b_np, x_np)
print(y)
np.testing.assert_allclose(np.asarray(y), np.tanh(x_np @ w_np + b_np), rtol=1e-5, atol=1e-6)"""),
    ("md", """## `grad`: reverse-mode derivatives

`fnx.grad(loss, argnums=(0, 1))` returns the gradient with respect to `w` and `b`. Below it is checked against
the derivative written by hand in float64."""),
    ("code", """def loss(w, b, x, t):
    return jnp.mean((predict(w, b, x) - t) ** 2)

dw, db = fnx.grad(loss, argnums=(0, 1))(w_np, b_np, x_np, t_np)
print("dw =", dw, "\\ndb =", db)

y64 = np.tanh(x_np.astype(np.float64) @ w_np + b_np)
dy = 2 * (y64 - t_np) / y64.size * (1 - y64 ** 2)   # d loss / d (x @ w + b)
np.testing.assert_allclose(np.asarray(dw), x_np.T @ dy, rtol=1e-4, atol=1e-6)
np.testing.assert_allclose(np.asarray(db), dy.sum(axis=0), rtol=1e-4, atol=1e-6)"""),
    ("md", """## `vmap`: per-example gradients without a loop

`vmap` maps a function over a leading axis. Mapping `grad(loss)` over the examples gives one gradient per example;
their mean is the batch gradient above, and each one equals the gradient computed alone."""),
    ("code", """per_example = fnx.jit(fnx.vmap(fnx.grad(loss), in_axes=(None, None, 0, 0)))
grads = per_example(w_np, b_np, x_np[:, None, :], t_np[:, None, :])
print("per-example gradients:", grads.shape)

np.testing.assert_allclose(np.asarray(grads).mean(axis=0), np.asarray(dw), rtol=1e-5, atol=1e-7)
for i in range(len(x_np)):
    alone = fnx.grad(loss)(w_np, b_np, x_np[i:i + 1], t_np[i:i + 1])
    np.testing.assert_allclose(np.asarray(grads[i]), np.asarray(alone), rtol=1e-5, atol=1e-7)"""),
    ("md", """## The traced graph

`fnx.make_graph(f)(*args)` traces without running. Its text is fnx's IR: a FUNCTION of PARAMs over a few dozen
primitives (`jnp.tanh` is a call of its own, with its custom derivative rule). As the last expression of a cell,
Jupyter draws it."""),
    ("code", """graph = fnx.make_graph(loss)(w_np, b_np, x_np, t_np)
print(graph)"""),
    ("code", """graph"""),
    ("md", """## Eager and jitted

Without `jit`, every fnx operation runs at once (one compiled kernel per operation, cached). Under `jit` the whole
chain (here GELU's tanh form) is one fused loop; numpy makes one pass over memory and one temporary per operation.
The times are measured here, on this machine, not promised: `examples/quickstart.py` compares more workloads, with
the ones where fnx is slower."""),
    ("code", """def chain(lib, x):
    return 0.5 * x * (1 + lib.tanh(0.7978845608 * (x + 0.044715 * x * x * x)))

z_np = rng.standard_normal(1 << 20).astype(np.float32)
z = jnp.asarray(z_np)
fast_chain = fnx.jit(lambda x: chain(jnp, x))

def median_ms(fn, repeat=15):
    fn()
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        np.asarray(fn())
        times.append(time.perf_counter() - start)
    return 1e3 * float(np.median(times))

print(f"eager {median_ms(lambda: chain(jnp, z)):.2f} ms, jit {median_ms(lambda: fast_chain(z)):.2f} ms, "
      f"numpy {median_ms(lambda: chain(np, z_np)):.2f} ms for 1M float32")
expected = chain(np, z_np.astype(np.float64))
np.testing.assert_allclose(np.asarray(fast_chain(z)), expected, rtol=1e-5, atol=1e-6)
np.testing.assert_allclose(np.asarray(chain(jnp, z)), expected, rtol=1e-5, atol=1e-6)"""),
    ("code", f"""# every result above was checked against numpy as it was computed; one last look at the values
assert y.shape == (5, 2) and dw.shape == (3, 2) and grads.shape == (5, 3, 2)
assert float(loss(w_np, b_np, x_np, t_np)) > 0
print({PASSED!r})"""),
]

TRAINING = [
    ("md", """# Training a small MLP with `jit(value_and_grad)` and adam

A three-class spiral (synthetic, so nothing to download), a 2-64-64-3 MLP, minibatches of 128, `fnx.optim.adam`.
The step is one jitted function: forward, backward and the optimizer update compile together."""),
    ("code", """%matplotlib inline
import time

import matplotlib.pyplot as plt
import numpy as np

import fnx
import fnx.numpy as jnp
from fnx import nn, optim, random"""),
    ("code", """def spirals(per_class, classes, noise, rng):
    points, labels = [], []
    for c in range(classes):
        radius = np.linspace(0.05, 1, per_class)
        start = c * 2 * np.pi / classes
        angle = np.linspace(start, start + 3.5, per_class) + rng.normal(0, noise, per_class)
        points.append(np.stack([radius * np.sin(angle), radius * np.cos(angle)], axis=1))
        labels.append(np.full(per_class, c))
    return np.concatenate(points).astype(np.float32), np.concatenate(labels).astype(np.int32)

rng = np.random.default_rng(0)
x_all, y_all = spirals(300, 3, noise=0.2, rng=rng)
order = rng.permutation(len(x_all))
x_train, y_train = x_all[order[:720]], y_all[order[:720]]
x_test, y_test = x_all[order[720:]], y_all[order[720:]]
plt.figure(figsize=(4, 4))
plt.scatter(x_train[:, 0], x_train[:, 1], c=y_train, s=6, cmap="viridis")
plt.title("training points")
plt.show()"""),
    ("code", """def init_params(key, sizes):
    keys = random.split(key, len(sizes) - 1)
    return [(nn.initializers.glorot_normal()(k, (n_in, n_out)), jnp.zeros(n_out))
            for k, n_in, n_out in zip(keys, sizes[:-1], sizes[1:])]

def forward(params, x):
    for w, b in params[:-1]:
        x = nn.relu(x @ w + b)
    w, b = params[-1]
    return x @ w + b

def loss_fn(params, x, y):
    return -jnp.mean(jnp.sum(nn.log_softmax(forward(params, x)) * nn.one_hot(y, 3), axis=-1))

params = init_params(random.PRNGKey(0), [2, 64, 64, 3])
opt = optim.adam(1e-2)
opt_state = opt.init(params)

@fnx.jit
def step(params, opt_state, x, y):
    loss, grads = fnx.value_and_grad(loss_fn)(params, x, y)
    updates, opt_state = opt.update(grads, opt_state, params)
    return optim.apply_updates(params, updates), opt_state, loss

@fnx.jit
def accuracy(params, x, y):
    return jnp.mean(jnp.argmax(forward(params, x), axis=-1) == y)"""),
    ("code", """losses = []
start = time.perf_counter()
for i in range(400):
    batch = rng.integers(0, len(x_train), 128)
    params, opt_state, loss = step(params, opt_state, x_train[batch], y_train[batch])
    losses.append(float(loss))
test_accuracy = float(accuracy(params, x_test, y_test))
print(f"{len(losses)} steps in {time.perf_counter() - start:.2f} s (the first with tracing and compiling); "
      f"loss {losses[0]:.3f} -> {np.mean(losses[-20:]):.4f}; test accuracy {test_accuracy:.3f}")"""),
    ("code", """fig, (left, right) = plt.subplots(1, 2, figsize=(10, 4))
left.semilogy(losses)
left.set(xlabel="step", ylabel="training loss (minibatch)", title="loss")
grid = np.stack(np.meshgrid(np.linspace(-1.2, 1.2, 200), np.linspace(-1.2, 1.2, 200)), axis=-1).reshape(-1, 2)
classes = np.asarray(jnp.argmax(forward(params, grid.astype(np.float32)), axis=-1)).reshape(200, 200)
right.contourf(grid[:, 0].reshape(200, 200), grid[:, 1].reshape(200, 200), classes, alpha=0.3, cmap="viridis")
right.scatter(x_test[:, 0], x_test[:, 1], c=y_test, s=6, cmap="viridis")
right.set(title=f"decision regions, test accuracy {test_accuracy:.1%}")
plt.show()"""),
    ("md", """## Checks

The loss fell, the model classifies held-out points, and fnx's loss of the trained parameters equals a float64
numpy forward pass of the same parameters."""),
    ("code", f"""assert np.mean(losses[-20:]) < 0.2 * np.mean(losses[:5]), "the loss did not fall"
assert test_accuracy > 0.9, test_accuracy

def numpy_loss(params, x, y):
    h = x.astype(np.float64)
    for w, b in params[:-1]:
        h = np.maximum(h @ np.asarray(w, np.float64) + np.asarray(b, np.float64), 0)
    logits = h @ np.asarray(params[-1][0], np.float64) + np.asarray(params[-1][1], np.float64)
    logits -= logits.max(axis=-1, keepdims=True)
    log_probs = logits - np.log(np.exp(logits).sum(axis=-1, keepdims=True))
    return -np.mean(log_probs[np.arange(len(y)), y])

np.testing.assert_allclose(float(fnx.jit(loss_fn)(params, x_test, y_test)), numpy_loss(params, x_test, y_test),
                           rtol=1e-4, atol=1e-6)
print({PASSED!r})"""),
]

SHARDING = [
    ("md", """# Sharding over eight host devices

`FNX_CPU_DEVICES=8` splits the host into `cpu:0..7`, each with its own memory and queue, so a laptop can run the
code written for a mesh of accelerators. It is read once, when fnx is imported: set it first (restart the kernel
if fnx was already imported). See `docs/SHARDING.md`."""),
    ("code", """import os
os.environ["FNX_CPU_DEVICES"] = "8"   # before fnx is imported

import functools

import numpy as np

import fnx
import fnx.numpy as jnp
from fnx.sharding import Mesh, NamedSharding, PartitionSpec as P

print(fnx.devices())
assert len(fnx.devices()) == 8"""),
    ("md", """## A 2x4 mesh, and arrays laid out over it

A `Mesh` names the axes of a grid of devices; a `NamedSharding(mesh, PartitionSpec(...))` says which array axis
is split over which mesh axis (`None`: not split, so each device along that mesh axis holds a copy)."""),
    ("code", """mesh = Mesh(np.array(fnx.devices()).reshape(2, 4), ("data", "model"))
rng = np.random.default_rng(0)
x_np = rng.standard_normal((16, 32)).astype(np.float32)
w_np = rng.standard_normal((32, 8)).astype(np.float32)

x = fnx.device_put(x_np, NamedSharding(mesh, P("data", None)))    # rows split over "data"
w = fnx.device_put(w_np, NamedSharding(mesh, P(None, "model")))   # columns split over "model"
print("x:"); fnx.debug.visualize_array_sharding(x)
print("w:"); fnx.debug.visualize_array_sharding(w)"""),
    ("md", """## jit over sharded arrays

A jitted function over sharded arguments runs on all eight devices: fnx's partitioner turns the global program
into the per-device one (with the collectives it needs), and the result keeps a sharding."""),
    ("code", """y = fnx.jit(lambda x, w: jnp.tanh(x @ w))(x, w)
print(y.sharding)
fnx.debug.visualize_array_sharding(y)
print([(str(shard.device), shard.index) for shard in y.addressable_shards[:2]], "...")
np.testing.assert_allclose(np.asarray(y), np.tanh(x_np @ w_np), rtol=1e-5, atol=1e-6)"""),
    ("md", """## A data-parallel training step

The batch is split over `"data"`, the parameters are replicated. The step is written for one device; the
gradients are summed over the data axis by the partitioner. The result must equal the same step on one device."""),
    ("code", """def loss(params, x, y):
    hidden = jnp.tanh(x @ params["w1"] + params["b1"])
    return jnp.mean((hidden @ params["w2"] - y) ** 2)

@fnx.jit
def train_step(params, x, y):
    value, grads = fnx.value_and_grad(loss)(params, x, y)
    return fnx.tree.map(lambda p, g: p - 0.1 * g, params, grads), value

params_np = {"w1": (0.2 * rng.standard_normal((32, 64))).astype(np.float32), "b1": np.zeros(64, np.float32),
             "w2": (0.2 * rng.standard_normal((64, 1))).astype(np.float32)}
xb_np = rng.standard_normal((64, 32)).astype(np.float32)
yb_np = rng.standard_normal((64, 1)).astype(np.float32)

replicated, by_rows = NamedSharding(mesh, P()), NamedSharding(mesh, P("data"))
params = fnx.device_put(params_np, replicated)
xb, yb = fnx.device_put(xb_np, by_rows), fnx.device_put(yb_np, by_rows)
for _ in range(3):
    params, value = train_step(params, xb, yb)
print("loss on the mesh:", float(value), "; w1 is", params["w1"].sharding)

one_device = {k: fnx.device_put(v, fnx.devices()[0]) for k, v in params_np.items()}
for _ in range(3):
    one_device, value_one = train_step(one_device, xb_np, yb_np)
print("loss on one device:", float(value_one))
np.testing.assert_allclose(float(value), float(value_one), rtol=1e-5)
for name in params_np:
    np.testing.assert_allclose(np.asarray(params[name]), np.asarray(one_device[name]), rtol=1e-5, atol=1e-6)"""),
    ("md", """## `shard_map`: write the per-device program yourself

Inside `shard_map` each device sees its own block; collectives such as `psum` combine the blocks over mesh axes.
`axis_index` says where a device sits on the mesh."""),
    ("code", """a_np = rng.standard_normal((8, 16)).astype(np.float32)

@functools.partial(fnx.shard_map, mesh=mesh, in_specs=(P("data", "model"),), out_specs=P())
def total(block):                      # block: (4, 4), one per device
    return fnx.lax.psum(block.sum(), ("data", "model"))

@functools.partial(fnx.shard_map, mesh=mesh, in_specs=(P("data", "model"),), out_specs=P("data", "model"))
def where_am_i(block):
    return jnp.zeros_like(block) + 4 * fnx.lax.axis_index("data") + fnx.lax.axis_index("model")

@functools.partial(fnx.shard_map, mesh=mesh, in_specs=(P("data", None), P()), out_specs=P("data", None))
def row_softmax(rows, scale):          # rows: half of them (split over "data"), the same on the 4 "model" devices
    e = jnp.exp(scale * rows - (scale * rows).max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)

print("psum:", float(fnx.jit(total)(a_np)), " numpy:", float(a_np.sum()))
print(np.asarray(where_am_i(a_np)))
np.testing.assert_allclose(float(fnx.jit(total)(a_np)), a_np.sum(dtype=np.float64), rtol=1e-5)
np.testing.assert_array_equal(np.asarray(where_am_i(a_np)), np.repeat(np.repeat(np.arange(8.0).reshape(2, 4), 4, 0),
                                                                   4, 1))
expected = np.exp(2 * a_np - (2 * a_np).max(-1, keepdims=True))
np.testing.assert_allclose(np.asarray(row_softmax(a_np, np.float32(2))), expected / expected.sum(-1, keepdims=True),
                           rtol=1e-5, atol=1e-7)"""),
    ("code", f"""print({PASSED!r})"""),
]

COMPILER = [
    ("md", """# Inside the compiler: from a traced graph to kernels, and a BEAM search

`fnx.jit(f).lower(*args)` keeps every stage of the lowering: `as_text(stage)` prints it and `draw(stage)` draws
it. The stages, in order (docs/LOWERING.md):

| stage | what it holds |
|---|---|
| graph | the traced FUNCTION, as `make_graph` shows it |
| callify | nested calls (`tanh`'s custom rule, checkpointed blocks) inlined, the graph simplified |
| rangeify | the kernel split: which nodes fuse into one loop nest, with FLOP and byte estimates |
| optimize | each kernel's schedule: vector lanes, unrolling, thread split, ... |
| linearize | each kernel as a list of instructions |
| memory | intermediate buffers packed into fewer allocations |
| items / schedule | what the executable replays: launches and transfers |
| llvm | the CPU backend's LLVM IR |"""),
    ("code", """import time

import numpy as np

import fnx
import fnx.numpy as jnp

def f(x, w, b):
    return jnp.tanh(x @ w + b).sum(axis=-1)

rng = np.random.default_rng(0)
x_np = rng.standard_normal((64, 128)).astype(np.float32)
w_np = (rng.standard_normal((128, 32)) / np.sqrt(128)).astype(np.float32)
b_np = rng.standard_normal(32).astype(np.float32)
lowered = fnx.jit(f).lower(x_np, w_np, b_np)

def show(text, lines=40):
    text_lines = text.splitlines()
    print("\\n".join(text_lines[:lines]) + (f"\\n... ({len(text_lines) - lines} more lines)" if len(text_lines) > lines
                                            else ""))"""),
    *[cell for heading, text, picture in [
        ("graph: what was traced", "graph", "graph"),
        ("callify: calls inlined, the graph simplified", "callify", "callify"),
        ("rangeify: the kernel split", "rangeify", "rangeify"),
        ("optimize: each kernel's schedule (the actions chosen by the hand heuristics)", "optimize", "optimize"),
        ("linearize: each kernel as instructions", "linearize", "linearize"),
        ("memory: intermediate buffers packed into allocations", "memory", "memory"),
        ("items and schedule: what the executable replays on each call", "items", "schedule")]
      for cell in (("md", f"## {heading}"), ("code", f'show(lowered.as_text("{text}"))\nlowered.draw("{picture}")'))],
    ("md", "## llvm: the CPU backend's code (the start of it)"),
    ("code", """show(lowered.as_text("llvm"), lines=30)"""),
    ("code", """expected = np.tanh(x_np.astype(np.float64) @ w_np + b_np).sum(axis=-1)
np.testing.assert_allclose(np.asarray(lowered.compile()(x_np, w_np, b_np)), expected, rtol=1e-4, atol=1e-4)
np.testing.assert_allclose(np.asarray(fnx.jit(f)(x_np, w_np, b_np)), expected, rtol=1e-4, atol=1e-4)"""),
    ("md", """## BEAM: searching a kernel's schedule by timing it

The hand heuristics (`heuristic_opts`) choose a kernel's actions from the machine's vector width, registers,
caches and threads. `FNX_BEAM=N` instead keeps the N fastest schedules at each depth, extends each by every action
that applies, and times them on this CPU (`fnx/lower/search.py`; the CPU device gives the timer,
`kernel_timers()`). Here the search runs by hand on the one kernel of a 256x256 matmul, with a beam of width 2."""),
    ("code", """from fnx.lower.optimize import heuristic_opts, schedule_override
from fnx.lower.search import beam_search

a_np = rng.standard_normal((256, 256)).astype(np.float32)
b2_np = rng.standard_normal((256, 256)).astype(np.float32)
matmul_lowered = fnx.jit(lambda a, b: a @ b).lower(a_np, b2_np)
(kernel,) = matmul_lowered.executable.lowering.schedule.kernels   # the kernel as rangeify made it
device = fnx.devices()[0]

heuristic = heuristic_opts(kernel, device.target)
start = time.perf_counter()
searched, searched_seconds, heuristic_seconds = beam_search(kernel, device.target, 2, device.kernel_timers())
print(f"searched for {time.perf_counter() - start:.1f} s")
# (candidates within the timing noise of each other can win, so a chosen list may hold near no-ops)
print(f"heuristic actions {heuristic}: {heuristic_seconds * 1e6:.0f} µs")
print(f"BEAM's actions    {searched}: {searched_seconds * 1e6:.0f} µs")"""),
    ("md", """The search never returns something slower than the heuristic's schedule *as it measured it*; timings of
sub-millisecond kernels vary from run to run, so compile the function with BEAM's actions
(`schedule_override`) and time both whole calls. The executables are cached by graph, so `clear_caches()` comes
first."""),
    ("code", """def median_us(fn, a, b, repeat=50):
    np.asarray(fn(a, b))
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        np.asarray(fn(a, b))
        times.append(time.perf_counter() - start)
    return 1e6 * float(np.median(times))

a, b2 = jnp.asarray(a_np), jnp.asarray(b2_np)
fnx.clear_caches()
with schedule_override(lambda kernel, target: searched):
    searched_matmul = fnx.jit(lambda a, b: a @ b).lower(a, b2).compile()
print(searched_matmul.as_text("optimize"))
fnx.clear_caches()
heuristic_matmul = fnx.jit(lambda a, b: a @ b).lower(a, b2).compile()
print(heuristic_matmul.as_text("optimize"))
print(f"whole calls: heuristic {median_us(heuristic_matmul, a, b2):.0f} µs, "
      f"BEAM {median_us(searched_matmul, a, b2):.0f} µs, numpy {median_us(np.matmul, a_np, b2_np):.0f} µs")"""),
    ("code", f"""expected = a_np.astype(np.float64) @ b2_np
for compiled in (searched_matmul, heuristic_matmul):
    np.testing.assert_allclose(np.asarray(compiled(a, b2)), expected, rtol=1e-4, atol=1e-3)
assert "actions " + str(searched) in searched_matmul.as_text("optimize")
print({PASSED!r})"""),
]

NOTEBOOKS = {"01_quickstart.ipynb": QUICKSTART, "02_training.ipynb": TRAINING, "03_sharding.ipynb": SHARDING,
             "04_inside_the_compiler.ipynb": COMPILER}


def build(cells: list[tuple[str, str]]) -> nbformat.NotebookNode:
    """A notebook of `cells` (kind, source), without outputs; cell ids are their positions, so the file is the
    same on every run."""
    nb = new_notebook(metadata={
        "kernelspec": {"display_name": "Python 3 (ipykernel)", "language": "python", "name": "python3"},
        "language_info": {"name": "python"}})
    for i, (kind, source) in enumerate(cells):
        cell = new_markdown_cell(source) if kind == "md" else new_code_cell(source)
        cell["id"] = f"cell-{i:02d}"
        nb.cells.append(cell)
    return nb


def text(name: str) -> str:
    """The .ipynb text this script writes for notebook `name`."""
    return nbformat.writes(build(NOTEBOOKS[name])) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--check", action="store_true", help="compare instead of writing")
    args = parser.parse_args()
    stale = []
    for name in NOTEBOOKS:
        path = os.path.join(HERE, name)
        if args.check:
            with open(path, encoding="utf-8") as f:
                if f.read() != text(name): stale.append(name)
        else:
            with open(path, "w", encoding="utf-8") as f: f.write(text(name))
    if stale: print(f"differ from make_notebooks.py: {', '.join(stale)}", file=sys.stderr)
    return 1 if stale else 0


if __name__ == "__main__":
    sys.exit(main())
