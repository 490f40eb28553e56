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
    live = [sum(nbytes[b] for b in intermediates if span[b][0] <= i <= span[b][1])
            for i in range(len(lowering.kernels))]
    floor = kind_bytes["input"] + kind_bytes["output"] + max(live)
    assert plan.peak_bytes == kind_bytes["input"] + kind_bytes["output"] + sum(plan.slot_bytes)
    assert floor <= plan.peak_bytes <= floor + max(nbytes[b] for b in intermediates)
    params = sum(v.nbytes for v in p.values())
    activations = x.nbytes + 2 * 256 * 512 * 4 + 3 * 256 * 10 * 4  # x, pre-activation and h, logits/softmax/grad
    assert plan.peak_bytes < 2 * (params + params + activations)
    assert_slots_never_overlap(lowering)
