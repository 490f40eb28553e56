"""Run a fuzz program on fnx (eager and jit, on interp and cpu; grad and jit(grad)) and check every result
against the float64 oracle of fuzz/oracle.py. Each check returns a list of failure messages (empty: passed) and
statistics; the caller adds the program's source so that a failure prints as a paste-able reproduction."""
from __future__ import annotations

import traceback

import numpy as np

import fnx
import fnx.numpy as jnp
from fuzz import oracle as O
from fuzz.programs import FLOATS, HEADER, Program

# |<grad, d> - exact directional derivative| <= GRAD_ULPS * u * work * (its condition): float32 rounding (u) at
# most `work` times along any path, forward or backward (the oracle counts 1 + c per float op, n per reduction of
# n terms, the broadcast factor of each broadcast operand (its cotangent is a sum) and m + k + n per matmul)
GRAD_ULPS = 8
GRAD_ATOL = 1e-30
FD_STEP = 1e-5


def inputs(prog: Program) -> list[np.ndarray]:
    ns: dict = {}
    exec(HEADER, ns)
    return [ns["_rand"](i.shape, i.dtype, seed=i.seed, scale=i.scale) for i in prog.inputs]


def bind(prog: Program, jnp_module):
    ns = {"jnp": jnp_module, "np": np}
    exec(prog.program_source(), ns)
    return ns["program"]


def _describe(k, name, what):
    return f"output {k} ({name}): {what}"


def compare(label: str, k: int, name: str, got, o: O.OVal, expect_dtype: str, stats: dict) -> list[str]:
    """fnx's `got` against the oracle value `o`: equal where o.e == 0, within SAFETY * o.e elsewhere."""
    r = np.asarray(got)
    if str(r.dtype) != expect_dtype:
        return [f"{label}: " + _describe(k, name, f"dtype {r.dtype}, expected {expect_dtype}")]
    if r.shape != o.v.shape:
        return [f"{label}: " + _describe(k, name, f"shape {r.shape}, expected {o.v.shape}")]
    checked = o.e != np.inf
    stats["elements"] = stats.get("elements", 0) + r.size
    stats["checked"] = stats.get("checked", 0) + int(np.sum(checked))
    stats["exact"] = stats.get("exact", 0) + int(np.sum(o.e == 0))
    if expect_dtype in FLOATS:
        rv = r.astype(np.float64)
        same = (rv == o.v) | (np.isnan(rv) & np.isnan(o.v))
        with np.errstate(all="ignore"):
            diff = np.abs(rv - o.v)
            bad = np.where(o.e == 0, ~same, checked & ~(diff <= O.SAFETY * o.e) & ~same)
    else:
        bad = (o.e == 0) & (r != o.v)
    if not bad.any(): return []
    idx = np.argwhere(bad)
    lines = [f"{label}: " + _describe(k, name, f"{len(idx)} of {r.size} elements ({int(np.sum(checked))} checked) "
                                               f"differ from the oracle; dtype {expect_dtype}, shape {r.shape}")]
    if expect_dtype in FLOATS:
        with np.errstate(all="ignore"):
            order = np.argsort(-np.where(bad, np.nan_to_num(diff, nan=np.inf) / np.maximum(o.e, 1e-300), -1).ravel(),
                               kind="stable")[:5]
        idx = [np.unravel_index(i, r.shape) for i in order if bad.ravel()[i]]
    for i in [tuple(int(j) for j in i) for i in idx][:5]:
        lines.append(f"    at {list(i)}: got {r[i].item()!r}, oracle {o.v[i].item()!r} "
                     f"(allowed error {O.SAFETY * o.e[i]:.3g})")
    return lines


def _outs(x):
    return tuple(x) if isinstance(x, (tuple, list)) else (x,)


def check_forward(prog: Program, variants=("interp eager", "interp jit", "cpu eager", "cpu jit")):
    args = inputs(prog)
    expected, ctx = O.run(lambda ns: bind(prog, ns), args)
    stats = {"undecided": ctx.undecided}
    fails = []
    for k, (name, o) in enumerate(zip(prog.outputs, expected)):
        var = prog.vars[name]
        assert o.dt == var.dtype and o.v.shape == var.shape, \
            f"fuzzer bug: the oracle's {name} is {o.dt}{o.v.shape}, the generator declared {var.dtype}{var.shape}"
    fn = bind(prog, jnp)
    for label in variants:
        device, mode = label.split()
        try:
            with fnx.default_device(device):
                xs = [jnp.asarray(a) for a in args]
                got = _outs(fn(*xs) if mode == "eager" else fnx.jit(fn)(*xs))
                got = [np.asarray(g) for g in got]
        except Exception as exc:  # a well-typed program must run
            fails.append(f"{label}: raised {type(exc).__name__}: {exc}\n" +
                         "".join(traceback.format_exception(exc)[-3:]))
            continue
        if len(got) != len(expected):
            fails.append(f"{label}: {len(got)} outputs, expected {len(expected)}")
            continue
        for k, (name, g, o) in enumerate(zip(prog.outputs, got, expected)):
            fails += compare(label, k, name, g, o, prog.vars[name].dtype, stats)
    return fails, stats


# ---- gradients ----

def weights(prog: Program, outs) -> dict:
    return {k: np.random.default_rng(1000 + k).standard_normal(np.shape(o.v if isinstance(o, O.OVal) else o))
            .astype(np.float32) for k, o in enumerate(outs) if prog.vars[prog.outputs[k]].dtype == "float32"}


def evaluate_loss(bind_program, args, W, exact=True, tangents=None, floors=False):
    """The loss sum_k sum(out_k * W_k) of the oracle's float64 evaluation; returns (loss, T, S, branches)."""
    outs, ctx = O.run(bind_program, args, exact=exact, tangents=tangents, floors=floors)
    loss = sum(float(np.sum(outs[k].v * w)) for k, w in W.items())
    evaluate_loss.work = ctx.work
    T = sum(float(np.sum(outs[k].t * w)) for k, w in W.items())
    S = sum(float(np.sum(outs[k].ta * np.abs(w))) for k, w in W.items())
    return loss, T, S, ctx.branches


def _same_branches(a, b) -> bool:
    return len(a) == len(b) and all(x.shape == y.shape and np.array_equal(x, y) for x, y in zip(a, b))


def check_grad(prog: Program, rng_seed: int):
    args = inputs(prog)
    rounded, ctx = O.run(lambda ns: bind(prog, ns), args)
    stats = {"undecided": ctx.undecided, "directions": 0, "kinks": 0}
    if ctx.undecided:    # fnx's float32 run may take the other side of a branch: its gradient is not comparable
        stats["skipped"] = "undecided branch"
        return [], stats
    W = weights(prog, rounded)
    fn = bind(prog, jnp)
    float_idx = [k for k in W]

    def loss(*xs):
        outs = _outs(fn(*xs))
        total = 0.0
        for k in float_idx: total = total + jnp.sum(outs[k] * W[k])
        return total

    argnums = tuple(range(len(args)))
    grads, fails = {}, []
    for label in ("cpu grad", "cpu jit(grad)", "interp grad"):
        device = label.split()[0]
        try:
            with fnx.default_device(device):
                xs = [jnp.asarray(a) for a in args]
                g = fnx.grad(loss, argnums)(*xs) if "jit" not in label else fnx.jit(fnx.grad(loss, argnums))(*xs)
                grads[label] = [np.asarray(gi, np.float64) for gi in g]
        except Exception as exc:
            fails.append(f"{label}: raised {type(exc).__name__}: {exc}\n" +
                         "".join(traceback.format_exception(exc)[-3:]))
    for label, g in grads.items():
        for gi, a in zip(g, args):
            if gi.shape != np.shape(a): fails.append(f"{label}: gradient shape {gi.shape}, expected {np.shape(a)}")
    if fails: return fails, stats

    rng = np.random.default_rng(rng_seed)
    exact_prog = lambda ns: bind(prog, ns)
    directions = [[rng.standard_normal(np.shape(a)) for a in args]]
    for _ in range(3):   # single elements: an elementwise check of three gradient entries
        k = int(rng.integers(len(args)))
        d = [np.zeros(np.shape(a)) for a in args]
        d[k].reshape(-1)[rng.integers(max(d[k].size, 1))] = 1.0
        directions.append(d)
    x64 = [np.asarray(a, np.float64) for a in args]
    for d in directions:
        L0, T, S, base = evaluate_loss(exact_prog, x64, W, tangents=d)
        rtol = GRAD_ULPS * O.U["float32"] * (evaluate_loss.work + 1)
        # + the error of derivatives that cancel in float32 (tanh' = 1 - y^2 near +-1, ...), propagated
        noise = evaluate_loss(exact_prog, x64, W, tangents=d, floors=True)[2] - S
        atol = O.SAFETY * noise + GRAD_ATOL
        fd_vals = {}
        for s in (FD_STEP, -FD_STEP, 2 * FD_STEP, -2 * FD_STEP):
            Ls, _, _, br = evaluate_loss(exact_prog, [x + s * di for x, di in zip(x64, d)], W)
            if not _same_branches(br, base): break
            fd_vals[s] = Ls
        if len(fd_vals) < 4:
            stats["kinks"] += 1
            continue
        stats["directions"] += 1
        fd1 = (fd_vals[FD_STEP] - fd_vals[-FD_STEP]) / (2 * FD_STEP)
        fd2 = (fd_vals[2 * FD_STEP] - fd_vals[-2 * FD_STEP]) / (4 * FD_STEP)
        fd_err = abs(fd1 - fd2) + 1e-13 * (abs(L0) + 1) / FD_STEP
        if not abs(T - fd1) <= 1e-6 * S + 4 * fd_err:
            fails.append(f"fuzzer oracle: forward-mode derivative {T!r} != central differences {fd1!r} "
                         f"(second estimate {fd2!r}, condition {S!r}) in float64")
            continue
        for label, g in grads.items():
            gd = sum(float(np.sum(gi * di)) for gi, di in zip(g, d))
            if not abs(gd - T) <= rtol * S + atol:
                nz = [(k, [int(i) for i in np.unravel_index(int(np.argmax(np.abs(di))), di.shape)])
                      for k, di in enumerate(d) if np.count_nonzero(di) == 1]
                where = f" (d/d x{nz[0][0]}{nz[0][1]})" if nz else " (random dense direction)"
                fails.append(f"{label}: <grad, d> = {gd!r}, float64 derivative {T!r} (finite differences {fd1!r}), "
                             f"condition {S!r}: relative error {abs(gd - T) / max(S, 1e-300):.3g} > {rtol:.3g} "
                             f"(+ {atol:.3g}){where}")
        stats.setdefault("rel_err", []).extend(   # as a fraction of the tolerance
            abs(sum(float(np.sum(gi * di)) for gi, di in zip(g, d)) - T) / max(rtol * S + atol, 1e-300)
            for g in grads.values())
    return fails, stats
