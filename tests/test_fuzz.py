"""Differential fuzzing of fnx (issue 10): random well-typed programs, every result against a float64 oracle.

* Programs (tests/fuzz/programs.py): 1-3 inputs of broadcast-compatible shapes (up to 257 per axis, at most
  257*257 elements) over float32/float16/int32/bool, then up to 30 steps drawn from fnx.numpy: add subtract
  multiply maximum minimum (also with Python scalars and as operators), divide, negative abs square logical_not,
  exp log sqrt tanh sin cos on safe domains (exp of a clip, log and sqrt of x*x + c), the six comparisons, where,
  bitwise and/or/xor, floor_divide and remainder by (b & 7) + 1, astype between the four dtypes, sum mean max min
  over random axes with keepdims, cumsum, reshape transpose broadcast_to flip, basic slicing (steps, negative
  steps, integer indices), concatenate, matmul / @ (vectors, batches). Every value that no later step reads is
  an output. A program is data that renders as a self-contained script: a failure prints it, ready to paste.
* Forward (test_fuzz_forward): eager and jit, on `interp` and on `cpu`, each output against the oracle
  (tests/fuzz/oracle.py): the same source run on numpy in float64, rounded to the dtype after every op (JAX's
  semantics, float16 included), with a running bound on how far any faithful implementation may be from it.
  Where the bound is 0 (correctly rounded ops on exact operands: + - * / sqrt, casts, selects, shapes, integer
  ops) fnx must agree exactly; elsewhere within twice the bound (a few ulps per transcendental, n*u*sum|x| per
  sum of n terms, first-order propagation); comparisons and casts the bound cannot decide are not checked.
* Gradients (test_fuzz_grad): float32 programs; grad and jit(grad) on cpu and grad on interp of
  sum_k sum(out_k * W_k) along a random dense direction and three single elements, against the oracle's float64
  forward-mode derivative, which is itself checked against central finite differences (a step that crosses a
  kink of where/max/abs/clip/casts is refused); the tolerance is float32 rounding times the program's rounding
  count, relative to the directional derivative's condition (its |partials| sum).

CI runs 60 forward and 40 gradient programs (under a minute on two cores); `FNX_FUZZ_EXAMPLES=N` runs N of each
(e.g. `FNX_FUZZ_EXAMPLES=2000 python -m pytest tests/test_fuzz.py` for a long run).
"""
import os

from hypothesis import HealthCheck, event, given, note, settings, strategies as st

from fuzz.check import check_forward, check_grad
from fuzz.programs import programs

EXAMPLES = int(os.environ.get("FNX_FUZZ_EXAMPLES", "0") or 0)
# CI checks the same programs every run (derandomized: a finding there is a regression, not the luck of the draw);
# a long run (FNX_FUZZ_EXAMPLES=N) explores new ones each time
FUZZ = settings(max_examples=EXAMPLES or 60, deadline=None, database=None, print_blob=True, derandomize=not EXAMPLES,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                       HealthCheck.filter_too_much])


def _report(prog, fails, stats):
    """Fail with the program's source; count what was not checked (pytest --hypothesis-show-statistics)."""
    note(f"stats: {stats}")
    if "skipped" in stats: event(f"gradient not checked: {stats['skipped']}")
    if stats.get("kinks"): event("gradient directions refused at a kink")
    if stats.get("elements"):
        event(f"forward elements checked: {100 * stats['checked'] // stats['elements'] // 10 * 10}%+")
    assert not fails, "fnx disagrees with the float64 oracle on this program:\n" + "\n".join(fails) + \
        "\n\nReproduce: paste this at the repository root:\n" + prog.source()


@FUZZ
@given(programs())
def test_fuzz_forward(prog):
    """interp eager, interp jit, cpu eager and cpu jit against the per-op-rounded float64 oracle."""
    fails, stats = check_forward(prog)
    _report(prog, fails, stats)


@settings(FUZZ, max_examples=EXAMPLES or 40)
@given(programs(grad=True), st.integers(0, 2 ** 16))
def test_fuzz_grad(prog, seed):
    """grad and jit(grad) on cpu and grad on interp of sum(program(x) * W), float32 programs, against the float64
    forward-mode derivative (checked by central differences), along a dense and three single-element directions."""
    fails, stats = check_grad(prog, seed)
    _report(prog, fails, stats)


def _program(lines, inputs, grad=False):
    """A fixed program: lines of (name, source, shape, dtype); inputs of (shape, dtype, scale)."""
    from fuzz.programs import Input, Program, Var
    prog = Program(inputs=[Input(f"x{k}", s, d, 7 + k, sc) for k, (s, d, sc) in enumerate(inputs)], grad=grad)
    for i in prog.inputs: prog.vars[i.name] = Var(i.name, i.shape, i.dtype)
    for name, src, shape, dtype in lines:
        prog.lines.append((name, src))
        prog.vars[name] = Var(name, shape, dtype)
    prog.outputs = [lines[-1][0]]
    return prog


def test_fuzzer_catches_injected_bugs(monkeypatch):
    """The checks are not vacuous: bugs injected into this process (a 2e-6 relative error in interp's SIN, a sum
    that drops the last of 128 terms, a derivative of sin 0.1% off) fail them; the uninjected programs pass."""
    import numpy as np

    from fnx import lax
    from fnx import reference  # what interp computes for each primitive
    from fnx.transforms import grad as grad_module
    from fnx.transforms.jit import clear_trace_caches
    from fnx.uop import Ops
    sine = _program([("v0", "jnp.sin(x0)", (64,), "float32")], [((64,), "float32", 1.0)])
    total = _program([("v0", "jnp.sum(x0, axis=0)", (), "float32")], [((128,), "float32", 1.0)])
    sine_grad = _program([("v0", "jnp.sin(x0)", (5,), "float32")], [((5,), "float32", 1.0)], grad=True)
    assert check_forward(sine)[0] == [] and check_forward(total)[0] == [] and check_grad(sine_grad, 1)[0] == []

    with monkeypatch.context() as m:
        sin = reference.UNARY[Ops.SIN]
        m.setitem(reference.UNARY, Ops.SIN, lambda x: sin(x) * np.asarray(1 + 2e-6, x.dtype))
        fails = check_forward(sine)[0]
        assert any(f.startswith("interp eager") for f in fails) and not any(f.startswith("cpu") for f in fails)
    with monkeypatch.context() as m:
        reduce_sum = lax.reduce_sum
        m.setattr(lax, "reduce_sum", lambda x, axes, keepdims=False: reduce_sum(
            lax.slice_in_dim(x, 0, x.shape[axes[0]] - 1, axis=axes[0]) if x.shape[axes[0]] > 100 else x, axes,
            keepdims=keepdims))
        clear_trace_caches()  # (an eager sum runs jit of itself: its program was traced before the injection)
        fails = check_forward(total)[0]
        assert sorted(f.split(":")[0] for f in fails if not f.startswith(" ")) == \
            ["cpu eager", "cpu jit", "interp eager", "interp jit"]
    clear_trace_caches()  # (nor may a program traced with the bug outlive it)
    with monkeypatch.context() as m:
        rule = grad_module.vjp_rules[Ops.SIN]
        m.setitem(grad_module.vjp_rules, Ops.SIN, lambda g, u, x: tuple(c * 1.001 for c in rule(g, u, x)))
        fails = check_grad(sine_grad, 1)[0]
        assert {f.split(":")[0] for f in fails} == {"cpu grad", "cpu jit(grad)", "interp grad"}
