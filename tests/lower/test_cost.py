"""The cost model: FLOPs and bytes of kernels against closed forms (matmul 2*M*N*K, elementwise read + write) and
against an independent count over the linearized program (every op times the loops open around it)."""
import numpy as np
from hypothesis import given, strategies as st

import fnx
import fnx.numpy as jnp
from fnx import lax
from fnx.lower.cost import describe, element_flops, kernel_bytes, kernel_flops, op_flops, recompute_costs_more
from fnx.lower.linearize import linearize
from fnx.lower.pipeline import callify
from fnx.lower.rangeify import rangeify
from fnx.uop import GroupOp, Ops


def schedule_of(f, *args):
    return rangeify(callify(fnx.make_graph(f)(*args).fn))


def body_of(f, *args):
    return callify(fnx.make_graph(f)(*args).fn).src[0]


def linear_flops(kernel) -> int:
    """FLOPs counted on the program linearize emits: each float op (or comparison of floats) once per iteration of
    the loops open around it, each accumulator update once per iteration of its innermost loop."""
    open_loops, total = [], 0
    for what, u in linearize(kernel):
        if what == "open": open_loops.append(u.arg.size)
        elif what == "close": open_loops.pop()
        elif what == "acc_update": total += op_flops(u.arg.op) * int(np.prod(open_loops))
        elif what == "node" and u.op in GroupOp.ALU and (u.dtype.is_float or u.src[0].dtype.is_float):
            total += op_flops(u.op) * int(np.prod(open_loops))
    return total


dims = st.integers(1, 9)


@given(dims, dims, dims)
def test_matmul_flops_and_bytes(m, k, n):
    a, b = np.ones((m, k), np.float32), np.ones((k, n), np.float32)
    (kernel,) = schedule_of(lambda a, b: a @ b, a, b).kernels
    assert kernel.flops == (2 * m * n * k if k > 1 else m * n)  # k == 1: no reduction, one MUL per output
    assert kernel.bytes == 4 * (m * k + k * n + m * n)


def test_elementwise_gelu_is_one_kernel_moving_its_arrays_once():
    x = np.linspace(-3, 3, 64 * 48, dtype=np.float32).reshape(64, 48)
    (kernel,) = schedule_of(fnx.nn.gelu, x).kernels
    assert kernel.bytes == x.nbytes * 2
    assert kernel.flops == element_flops(body_of(fnx.nn.gelu, x).src[0], {}) * x.size


def test_op_weights():
    x = np.ones((8, 16), np.float32)
    for op, weight in ((lax.exp2, 10), (lax.sqrt, 4), (lax.recip, 4), (lambda x: lax.add(x, 1.0), 1),
                       (lambda x: lax.convert_element_type(x, jnp.float16), 0)):
        (kernel,) = schedule_of(op, x).kernels
        assert kernel.flops == weight * x.size


def test_row_work_is_counted_once_per_row():
    """x / sqrt(sum(x * x)) per row: the square root runs once per row (hoisted), the division per element."""
    m, n = 12, 40
    x = np.ones((m, n), np.float32)

    def f(x):
        norm = lax.sqrt(lax.reduce_sum(lax.mul(x, x), (1,), keepdims=True))
        return lax.div(x, lax.broadcast_in_dim(lax.reshape(norm, (m,)), (m, n), (0,)))
    (kernel,) = schedule_of(f, x).kernels
    assert kernel.flops == m * n * (1 + 1 + 4) + m * 4
    assert kernel.bytes == 2 * x.nbytes  # the second read of each row comes from cache


def test_broadcast_operand_is_read_once():
    x, v = np.ones((30, 20), np.float32), np.ones(20, np.float32)
    (kernel,) = schedule_of(lambda x, v: x + v, x, v).kernels
    assert kernel.bytes == 2 * x.nbytes + v.nbytes


def fused_programs():
    """Programs whose kernels use only float ops (the linear count sees no integer value arithmetic)."""
    def softmax2(x):
        e = lax.exp2(x - x.max(axis=-1, keepdims=True))
        return e / e.sum(axis=-1, keepdims=True)

    def layernorm(x):
        c = x - x.mean(axis=-1, keepdims=True)
        return c / jnp.sqrt((c * c).mean(axis=-1, keepdims=True) + 1e-5)
    return [softmax2, layernorm, lambda x: x.var(axis=0), lambda x: x.T @ x, lambda x: lax.sin(x).sum(),
            lambda x: x / x.sum()]


@given(st.integers(1, 7), st.integers(1, 11), st.sampled_from(range(6)))
def test_flops_match_the_linearized_program(m, n, which):
    x = np.ones((m, n), np.float32)
    for kernel in schedule_of(fused_programs()[which], x).kernels:
        assert kernel_flops(kernel) == linear_flops(kernel)


def test_element_flops_and_recompute_rule():
    x = np.ones((16, 32), np.float32)
    assert element_flops(body_of(lambda x: lax.exp2(lax.mul(x, 2.0)), x).src[0], {}) == 11
    centered = body_of(lambda x: x - x.mean(axis=-1, keepdims=True), x).src[0]
    assert 2 < element_flops(centered, {}) < 3  # ADD and MUL per element, the mean's DIV shared by a row of 32
    assert not recompute_costs_more(centered, 2, {})
    assert recompute_costs_more(body_of(jnp.exp, x).src[0], 2, {})
    assert not recompute_costs_more(body_of(jnp.exp, x).src[0], 1, {})


def test_describe_names_the_kernel_and_its_costs():
    (kernel,) = schedule_of(lambda a, b: a @ b, np.ones((10, 20), np.float32), np.ones((20, 30), np.float32)).kernels
    kernel.name = "k0_matmul"
    text = describe(kernel)
    assert text.startswith("k0_matmul: 12 kFLOP, 4.4 kB")
    assert kernel_bytes(kernel) == 4400 and kernel.flops == 12000


def test_reduce_ranges_list_every_reduce_of_a_fused_kernel():
    x = np.ones((6, 10), np.float32)
    (kernel,) = schedule_of(lambda x: (x - x.mean(-1, keepdims=True)) / x.std(-1, keepdims=True), x).kernels
    reduces = [u for u in kernel.sink.toposort if u.op is Ops.REDUCE]
    assert len(reduces) >= 2
    assert set(kernel.reduce_ranges) == {r for u in reduces for r in u.src[1:]}
    ids = [u.arg.number for u in kernel.sink.toposort if u.op is Ops.RANGE]
    assert len(ids) == len(set(ids))
