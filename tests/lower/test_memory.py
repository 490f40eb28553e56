"""The memory plan: intermediates with disjoint lifetimes share allocations, never two that are live together,
and results stay equal to the interp oracle."""
import numpy as np

import fnx
import fnx.numpy as jnp
from assertions import assert_slots_never_overlap
from fnx.lower.rangeify import ControlStep


def _lowering(f, *args):
    return fnx.jit(f).lower(*args).executable.lowering


def chain(x):
    for _ in range(6):  # each step reduces (a buffer) and broadcasts back: many short-lived intermediates
        x = x - x.mean(axis=-1, keepdims=True)
        x = x / (jnp.sqrt((x * x).mean(axis=-1, keepdims=True)) + 1.0)
    return x.sum()


def test_disjoint_lifetimes_share_memory_and_results_hold():
    x = np.random.default_rng(0).standard_normal((64, 32)).astype(np.float32)
    lowering = _lowering(chain, jnp.asarray(x))
    plan = lowering.memory
    assert plan.planned_bytes < plan.unplanned_bytes
    assert len(plan.slot_bytes) < len(plan.slot_of)
    assert_slots_never_overlap(lowering)
    with fnx.default_device("interp"):
        want = float(fnx.jit(chain)(jnp.asarray(x)))
    np.testing.assert_allclose(float(fnx.jit(chain)(jnp.asarray(x))), want, rtol=1e-5, atol=1e-4)


def test_mlp_training_step_plan_is_bounded_by_its_tensors():
    rng = np.random.default_rng(1)
    p = {"w1": rng.standard_normal((20, 16)).astype(np.float32), "b1": np.zeros(16, np.float32),
         "w2": rng.standard_normal((16, 5)).astype(np.float32), "b2": np.zeros(5, np.float32)}

    def loss(p, x, y):
        h = fnx.nn.relu(x @ p["w1"] + p["b1"])
        return -jnp.mean(jnp.sum(fnx.nn.log_softmax(h @ p["w2"] + p["b2"]) * y, -1))

    def step(p, x, y):
        grads = fnx.grad(loss)(p, x, y)
        return {k: p[k] - 0.1 * grads[k] for k in p}
    x = rng.standard_normal((8, 20)).astype(np.float32)
    y = np.eye(5, dtype=np.float32)[rng.integers(0, 5, 8)]
    lowering = _lowering(step, p, x, y)
    plan = lowering.memory
    sizes = [s.size * s.dtype.itemsize for i, s in enumerate(lowering.schedule.buffers) if i in plan.slot_of]
    assert max(sizes) <= plan.planned_bytes <= plan.unplanned_bytes == sum(sizes)
    assert_slots_never_overlap(lowering)


def test_loop_outputs_are_not_planned():
    def f(x):
        return fnx.lax.scan(lambda c, xt: (c + xt, c * xt), jnp.zeros(x.shape[1:]), x)[1].sum()
    lowering = _lowering(f, np.ones((5, 3), np.float32))
    loop_outputs = {b for k, _ in lowering.kernels if isinstance(k, ControlStep) for b in k.outputs}
    assert loop_outputs and not loop_outputs & set(lowering.memory.slot_of)
    assert float(fnx.jit(f)(np.ones((5, 3), np.float32))) == 30.0


def _mlp_step_lowering():
    """The 784-512-10 MLP training step of bench W4 (batch 256): jit(value_and_grad) plus an SGD update."""
    from assertions import mlp_step
    rng = np.random.default_rng(2)
    p = {"w1": rng.standard_normal((784, 512)).astype(np.float32), "b1": np.zeros(512, np.float32),
         "w2": rng.standard_normal((512, 10)).astype(np.float32), "b2": np.zeros(10, np.float32)}
    x = rng.standard_normal((256, 784)).astype(np.float32)
    onehot = np.eye(10, dtype=np.float32)[rng.integers(0, 10, 256)]
    return _lowering(mlp_step, p, x, onehot), p, x


def test_mlp_training_step_peak_is_bounded_by_its_live_tensors():
    """Peak bytes of one call = inputs + outputs + the plan's slots. No plan can go below inputs + outputs + the
    largest set of intermediates alive at one step (they need distinct memory); first-fit may waste at most
    about one buffer's worth to fragmentation, so the plan must stay below that plus the largest intermediate.
    Also below twice what the step's tensors take (parameters, gradients, activations), a budget any sane
    schedule keeps."""
    lowering, p, x = _mlp_step_lowering()
    schedule, plan = lowering.schedule, lowering.memory
    nbytes = [s.size * s.dtype.itemsize for s in schedule.buffers]
    kind_bytes = {k: sum(n for n, s in zip(nbytes, schedule.buffers) if s.kind == k)
                  for k in ("input", "output")}
    span: dict[int, tuple[int, int]] = {}
    for i, (step, _) in enumerate(lowering.kernels):
        for b in (step.inputs + step.outputs if isinstance(step, ControlStep) else step.args):
            span[b] = (span.get(b, (i, i))[0], i)
    intermediates = [b for b, s in enumerate(schedule.buffers) if s.kind == "intermediate"]
    # a buffer the kernel writing another reads last, in place, may lend it its memory (`_in_place`): at that
    # step only the one written counts
    lent = {(a, span[a][1]) for a in intermediates for b in intermediates if a != b
            and plan.slot_of.get(a) == plan.slot_of.get(b) is not None and span[a][1] == span[b][0]}
    assert lent  # (the relu gradient is written over the gradient it masks)
    live = [sum(nbytes[b] for b in intermediates if span[b][0] <= i <= span[b][1] and (b, i) not in lent)
            for i in range(len(lowering.kernels))]
    floor = kind_bytes["input"] + kind_bytes["output"] + max(live)
    assert plan.peak_bytes == kind_bytes["input"] + kind_bytes["output"] + sum(plan.slot_bytes)
    assert floor <= plan.peak_bytes <= floor + max(nbytes[b] for b in intermediates)
    params = sum(v.nbytes for v in p.values())
    activations = x.nbytes + 2 * 256 * 512 * 4 + 3 * 256 * 10 * 4  # x, pre-activation and h, logits/softmax/grad
    assert plan.peak_bytes < 2 * (params + params + activations)
    assert_slots_never_overlap(lowering)


def _steps_in_place(lowering):
    """(reads, writes) pairs of planned buffers sharing a slot, the second written by the step that reads the first
    for the last time."""
    from fnx.lower.memory import _uses
    span = {}
    for i, step in enumerate(lowering.steps()):
        for b in _uses(step): span[b] = (span.get(b, (i, i))[0], i)
    slot_of = lowering.memory.slot_of
    return [(a, b) for a in slot_of for b in slot_of
            if a != b and slot_of[a] == slot_of[b] and span[a][1] == span[b][0]]


def test_an_elementwise_step_writes_over_the_intermediate_it_reads_last():
    """tanh(x @ w) @ w: the tanh kernel reads x @ w for the last time, each element in the iteration that writes
    the same element of its result, so it writes over it and the plan needs one buffer of that size fewer; the
    values are numpy's, called twice and from four threads. Read reversed, x @ w keeps its own memory (an element
    would be read after another iteration wrote it), and the values are right too."""
    import threading
    rng = np.random.default_rng(3)
    x, w = rng.standard_normal((512, 300)).astype(np.float32), rng.standard_normal((300, 300)).astype(np.float32)
    cases = ((lambda x, w: jnp.tanh(x @ w) @ w, lambda h: h, True),
             (lambda x, w: jnp.tanh((x @ w)[:, ::-1]) @ w, lambda h: h[:, ::-1], False))
    for f, order, shared in cases:
        lowering = _lowering(f, x, w)
        assert bool(_steps_in_place(lowering)) == shared
        assert_slots_never_overlap(lowering)
        jf, got = fnx.jit(f), {}

        def want(x):
            return np.tanh(order(x.astype(np.float64) @ w)) @ w

        def work(i):
            got[i] = np.asarray(jf(x + i, w))
        for _ in range(2): np.testing.assert_allclose(np.asarray(jf(x, w)), want(x), rtol=1e-4, atol=1e-3)
        threads = [threading.Thread(target=work, args=(i,)) for i in range(4)]
        for t in threads: t.start()
        for t in threads: t.join()
        for i in range(4): np.testing.assert_allclose(got[i], want(x + i), rtol=1e-4, atol=1e-3)
    in_place, apart = (_lowering(f, x, w).memory.planned_bytes for f, _, _ in cases)
    assert apart - in_place == x.shape[0] * w.shape[1] * 4  # (one (512, 300) float32 buffer fewer)
