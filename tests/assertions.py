"""Assertions shared by the test files (tests/ is on sys.path through tests/conftest.py)."""
import numpy as np

from fnx import tree_util


def assert_tree_close(actual, expected, rtol: float = 1e-5, atol: float = 1e-6, exact_dtypes: bool = False) -> None:
    """Same structure and shapes; floats close, everything else equal (and of equal dtype with exact_dtypes)."""
    assert tree_util.tree_structure(actual) == tree_util.tree_structure(expected)
    for a, e in zip(tree_util.tree_leaves(actual), tree_util.tree_leaves(expected)):
        a, e = np.asarray(a), np.asarray(e)
        assert a.shape == e.shape, (a.shape, e.shape)
        if np.issubdtype(e.dtype, np.inexact):
            np.testing.assert_allclose(a.astype(np.float64), e.astype(np.float64), rtol=rtol, atol=atol)
        else:
            if exact_dtypes: assert a.dtype == e.dtype, (a.dtype, e.dtype)
            np.testing.assert_array_equal(a, e)


def mlp_loss(p, x, onehot):
    """Softmax cross-entropy of the 2-layer MLP of bench W4 (parameters w1 b1 w2 b2)."""
    import fnx.numpy as jnp
    from fnx import nn
    h = nn.relu(x @ p["w1"] + p["b1"])
    return -jnp.mean(jnp.sum(nn.log_softmax(h @ p["w2"] + p["b2"]) * onehot, axis=-1))


def mlp_step(p, x, onehot):
    """One SGD step of that MLP: (new parameters, loss), as bench W4 and the training tests compile it."""
    import fnx
    from fnx import optim
    loss, grads = fnx.value_and_grad(mlp_loss)(p, x, onehot)
    updates, _ = optim.sgd(0.1).update(grads, optim.sgd(0.1).init(p), p)
    return optim.apply_updates(p, updates), loss


def random_schedule(draw_index, tries: int = 4, most: int = 4, applied: list | None = None):
    """A schedule chooser (for fnx.lower.optimize.schedule_override) applying up to `most` actions, in up to `tries`
    draws of `draw_index(n)` among those BEAM would try (candidate_actions); records (kernel name, actions) in
    `applied` when given."""
    from fnx.lower.optimize import OptError, apply_opt
    from fnx.lower.search import candidate_actions

    def choose(kernel, target):
        opts, k = [], kernel
        for _ in range(tries):
            acts = candidate_actions(k)
            if not acts or len(opts) == most: break
            act = acts[draw_index(len(acts))]
            try:
                k = apply_opt(k, act)
            except OptError:
                continue
            opts.append(act)
        if applied is not None: applied.append((kernel.name, opts))
        return opts
    return choose


def one_action(action, applied: list | set | None = None):
    """A schedule chooser applying just `action` (its axis taken modulo the kernel's loops) where it applies and
    nothing elsewhere; adds each applied Opt to `applied` when given."""
    from fnx.lower.optimize import Opt, OptError, apply_opt

    def choose(kernel, target):
        axes = len(kernel.ranges) + len(kernel.reduce_ranges)
        opt = Opt(action.op, action.axis % axes if axes else 0, action.amount)
        try:
            apply_opt(kernel, opt)
        except OptError:
            return []
        if applied is not None: applied.add(action) if isinstance(applied, set) else applied.append(opt)
        return [opt]
    return choose


def wide_inputs(*args) -> bool:
    """Whether any argument is a 64-bit numpy array or scalar: a test that feeds float64/int64 tests that dtype, so
    it runs under `fnx.enable_x64(wide_inputs(...))` (with x64 off, fnx narrows such inputs to 32 bits, as JAX)."""
    import numpy as np
    return any(isinstance(a, (np.ndarray, np.generic)) and a.dtype.itemsize == 8 and a.dtype.kind in "fiu"
               for a in args)


def assert_slots_never_overlap(lowering) -> None:
    """A lowering's memory plan: buffers that share a slot are never used by overlapping ranges of steps (a row
    chain is one step), except that a buffer may be written by the step that reads the slot's buffer before it
    for the last time, when that step reads it only in place (fnx.lower.memory._in_place)."""
    from fnx.lower.memory import _in_place, _uses
    steps = lowering.steps()
    span = {}
    for i, step in enumerate(steps):
        for b in _uses(step): span[b] = (span.get(b, (i, i))[0], i)
    by_slot = {}
    for b, slot in lowering.memory.slot_of.items(): by_slot.setdefault(slot, []).append((*span[b], b))
    for spans in by_slot.values():
        spans.sort()
        for (_, end, a), (start, _, b) in zip(spans, spans[1:]):
            assert end < start or (end == start and _in_place(steps[start], a, b)), spans


def relower() -> None:
    """Forget every traced, compiled and lowered program of this process, so the next call lowers afresh under the
    test's settings (the in-memory lowerings, like the on-disk ones, do not know them)."""
    import fnx
    from fnx.backends import cpu_llvm
    fnx.clear_caches()
    cpu_llvm._lowerings.entries.clear()


def from_threads(call, threads: int = 4, calls: int = 2) -> list:
    """`call()`'s results, `calls` times from each of `threads` threads started together; raises the first error
    a thread met."""
    import threading
    results, errors = [], []

    def run():
        try:
            results.extend(call() for _ in range(calls))
        except Exception as e:  # raised below, in the caller's thread
            errors.append(e)
    started = [threading.Thread(target=run) for _ in range(threads)]
    for t in started: t.start()
    for t in started: t.join()
    if errors: raise errors[0]
    assert len(results) == threads * calls
    return results

