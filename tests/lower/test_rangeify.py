"""The kernel split: elementwise chains, reductions, movement ops and matmul fuse into one kernel; a value read at
several indices is realized once; reductions fuse into the kernels that consume them when cheap (softmax, layernorm)
and a value recomputed in several places gets a buffer. Every case's output is checked against the interp backend
and numpy."""
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

import fnx
import fnx.numpy as jnp
from fnx import dtypes, lax
from fnx.backends.cpu_target import host_target
from fnx.lower.pipeline import callify, lower
from fnx.lower.rangeify import FUSED_ROW_BYTES, rangeify
from fnx.uop import Ops, ParamArg, ReduceArg, UOp


def kernels_of(f, *args) -> list:
    """rangeify's kernels for f(*args); the CPU executable's schedule has the same split."""
    with fnx.default_device("cpu"):
        kernels = rangeify(callify(fnx.make_graph(f)(*args).fn)).kernels
        lowering = fnx.jit(f).lower(*args).executable.lowering
    assert len(lowering.schedule.kernels) == len(kernels)
    return kernels


def run_on(device: str, f, *args):
    with fnx.default_device(device):
        return np.asarray(fnx.jit(f)(*args))


def check(f, *args, want=None) -> np.ndarray:
    """f's compiled output equals the interp oracle (and `want` when given); returns it."""
    got = run_on("cpu", f, *args)
    np.testing.assert_allclose(got, run_on("interp", f, *args), rtol=2e-6, atol=1e-6)
    if want is not None: np.testing.assert_allclose(got, want, rtol=2e-5, atol=1e-5)
    return got


def ops_in(kernel) -> list[Ops]:
    return [u.op for u in kernel.sink.toposort]


dims = st.integers(1, 6)


def chain(x):
    y = x
    for i in range(10):
        y = lax.mul(y, 0.5) if i % 3 == 0 else lax.add(y, 0.25) if i % 3 == 1 else lax.sin(y)
    return y


def chain_numpy(x):
    y = x.astype(np.float64)
    for i in range(10):
        y = y * 0.5 if i % 3 == 0 else y + 0.25 if i % 3 == 1 else np.sin(y)
    return y


@given(st.tuples(dims, dims))
def test_elementwise_chain_is_one_kernel(shape):
    x = np.random.default_rng(0).standard_normal(shape).astype(np.float32)
    assert len(kernels_of(chain, x)) == 1
    check(chain, x, want=chain_numpy(x))


def test_elementwise_chain_through_pipeline_lower():
    x = np.linspace(-1, 1, 12, dtype=np.float32).reshape(3, 4)
    traced = fnx.make_graph(chain)(x).fn
    lowering = lower(traced, host_target(2))
    assert len(lowering.kernels) == 1
    assert len(lowering.schedule.kernels) == 1
    kernel, lines = lowering.kernels[0]
    assert [what for what, _ in lines].count("open") == 2   # one loop per output axis, nothing else


def test_a_padded_operand_gates_its_data_loads_not_its_scalar_loads():
    """Under a pad, a load at a constant index inside its buffer (a 0-d operand) is not gated: the pad's WHERE
    discards it in the padding anyway, and across vector lanes a gated load of one address is a masked gather."""
    f = lambda x, s: jnp.pad(x * s, (0, 3))  # noqa: E731
    x, s = np.arange(1, 6, dtype=np.float32), np.float32(2.5)
    schedule = rangeify(callify(fnx.make_graph(f)(x, s).fn))
    loads = [u for k in schedule.kernels for u in k.sink.toposort if u.op is Ops.LOAD]
    gated = {u.src[1].op is Ops.CONST: len(u.src) > 2 for u in loads}
    assert gated == {True: False, False: True}, loads  # the scalar's load: no gate; x's: gated by the pad
    np.testing.assert_array_equal(np.asarray(fnx.jit(f)(x, s)), np.pad(x * s, (0, 3)))


@given(st.tuples(dims, dims))
def test_sum_of_scaled_is_one_kernel(shape):
    x = np.random.default_rng(1).standard_normal(shape).astype(np.float32)
    f = lambda x: lax.reduce_sum(lax.mul(x, 2.0), (0, 1))  # noqa: E731
    kernels = kernels_of(f, x)
    assert len(kernels) == 1
    assert (Ops.REDUCE in ops_in(kernels[0])) == (x.size > 1)
    check(f, x, want=(x.astype(np.float64) * 2).sum())


def test_row_sums_are_one_kernel():
    x = np.arange(20, dtype=np.float32).reshape(4, 5)
    f = lambda x: lax.reduce_max(lax.add(x, 1.0), (1,))  # noqa: E731
    assert len(kernels_of(f, x)) == 1
    check(f, x, want=(x + 1).max(axis=1))


def test_transpose_then_math_adds_no_copy():
    x = np.arange(12, dtype=np.float32).reshape(3, 4)
    f = lambda x: lax.exp2(lax.mul(lax.transpose(x, (1, 0)), 0.125))  # noqa: E731
    assert len(kernels_of(f, x)) == 1
    check(f, x, want=np.exp2(x.T * 0.125))


def test_reshape_then_math_adds_no_copy():
    x = np.arange(12, dtype=np.float32).reshape(3, 4)
    f = lambda x: lax.add(lax.reshape(x, (2, 6)), lax.reshape(lax.transpose(x, (1, 0)), (2, 6)))  # noqa: E731
    assert len(kernels_of(f, x)) == 1
    check(f, x, want=x.reshape(2, 6) + x.T.reshape(2, 6))


def test_broadcast_then_math_adds_no_copy():
    x = np.arange(12, dtype=np.float32).reshape(3, 4)
    v = np.array([1, -2, 3, -4], np.float32)
    f = lambda x, v: lax.mul(x, lax.broadcast_in_dim(v, (3, 4), (1,)))  # noqa: E731
    assert len(kernels_of(f, x, v)) == 1
    check(f, x, v, want=x * v)


def test_slice_pad_and_flip_add_no_copy():
    x = np.arange(10, dtype=np.float32)
    f = lambda x: lax.add(lax.rev(lax.slice(x, (2,), (8,)), (0,)), lax.pad(lax.slice(x, (0,), (4,)), 0.0, [(1, 1, 0)]))  # noqa: E731
    assert len(kernels_of(f, x)) == 1
    check(f, x, want=x[2:8][::-1] + np.pad(x[:4], (1, 1)))


def matmul(a, b):
    m, k = a.shape
    n = b.shape[1]
    a3 = lax.broadcast_in_dim(a, (m, k, n), (0, 1))
    b3 = lax.broadcast_in_dim(b, (m, k, n), (1, 2))
    return lax.reshape(lax.reduce_sum(lax.mul(a3, b3), (1,), keepdims=True), (m * n,))


@given(dims, dims, dims)
def test_matmul_is_one_kernel(m, k, n):
    rng = np.random.default_rng(2)
    a, b = rng.standard_normal((m, k)).astype(np.float32), rng.standard_normal((k, n)).astype(np.float32)
    kernels = kernels_of(matmul, a, b)
    assert len(kernels) == 1
    check(matmul, a, b, want=(a.astype(np.float64) @ b).reshape(-1))


def stencil(x):
    e = lax.exp2(x)
    n = x.shape[0]
    return lax.add(lax.slice(e, (1,), (n,)), lax.slice(e, (0,), (n - 1,)))


@given(st.integers(2, 40))
def test_value_read_at_two_indices_is_realized_once(n):
    x = np.linspace(-2, 2, n, dtype=np.float32)
    kernels = kernels_of(stencil, x)
    assert len(kernels) == 2
    assert sum(ops_in(k).count(Ops.EXP2) for k in kernels) == 1
    e = np.exp2(x.astype(np.float64))
    check(stencil, x, want=e[1:] + e[:-1])


def test_cheap_value_read_at_two_indices_is_recomputed():
    x = np.arange(8, dtype=np.float32)
    f = lambda x: lax.add(lax.slice(lax.add(x, 1.0), (1,), (8,)), lax.slice(lax.add(x, 1.0), (0,), (7,)))  # noqa: E731
    assert len(kernels_of(f, x)) == 1
    check(f, x, want=(x[1:] + 1) + (x[:-1] + 1))


def test_softmax_realizes_only_its_reductions():
    x = np.random.default_rng(3).standard_normal((4, 7)).astype(np.float32)

    def softmax(x):
        m = lax.broadcast_in_dim(lax.reduce_max(x, (1,)), x.shape, (0,))
        e = lax.exp2(lax.add(x, lax.mul(m, -1.0)))
        s = lax.broadcast_in_dim(lax.reduce_sum(e, (1,)), x.shape, (0,))
        return lax.div(e, s)

    kernels = kernels_of(softmax, x)
    assert len(kernels) == 1  # exp2 is one op: computing it in the sum's loop and again in the output loop is cheap
    assert sum(ops_in(k).count(Ops.REDUCE) for k in kernels) == 2
    e = np.exp2(x - x.max(axis=1, keepdims=True))
    check(softmax, x, want=e / e.sum(axis=1, keepdims=True))


def test_several_outputs_share_inputs():
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    f = lambda x: (lax.add(x, 1.0), lax.reduce_sum(x, (1,)), lax.transpose(x, (1, 0)))  # noqa: E731
    with fnx.default_device("cpu"):
        got = fnx.jit(f)(x)
    with fnx.default_device("interp"):
        want = fnx.jit(f)(x)
    for g, w, ref in zip(got, want, (x + 1, x.sum(axis=1), x.T)):
        np.testing.assert_array_equal(np.asarray(g), np.asarray(w))
        np.testing.assert_array_equal(np.asarray(g), ref)


def schedule_of(f, *args):
    return rangeify(callify(fnx.make_graph(f)(*args).fn))


def softmax_by_hand(x):
    e = jnp.exp(x - x.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def softmax_numpy(x):
    e = np.exp(x.astype(np.float64) - x.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def layernorm(x, g, b):
    mean = x.mean(axis=-1, keepdims=True)
    var = ((x - mean) ** 2).mean(axis=-1, keepdims=True)
    return (x - mean) / jnp.sqrt(var + 1e-5) * g + b


def layernorm_numpy(x, g, b):
    centered = x.astype(np.float64) - x.mean(axis=-1, keepdims=True)
    return centered / np.sqrt((centered ** 2).mean(axis=-1, keepdims=True) + 1e-5) * g + b


@pytest.mark.parametrize("softmax", [fnx.nn.softmax, softmax_by_hand])
def test_softmax_over_rows_fuses_its_reductions(softmax):
    x = np.zeros((4096, 4096), np.float32)
    kernels = schedule_of(softmax, x).kernels
    assert len(kernels) == 1  # exp(x - max) is stashed in the output row by the sum's loop and scaled in place
    assert [r.arg.size for r in kernels[0].ranges] == [4096, 4096] and len(kernels[0].row_ranges) == 1
    # accesses: x read once, the output row written by the sum's loop, read back and rewritten while in cache
    assert kernels[0].bytes <= 3 * x.nbytes


def _stash_kernel(x, axis=-1):
    return [k for k in schedule_of(lambda x: fnx.nn.softmax(x, axis=axis), x).kernels if k.row_ranges is not None]


@pytest.mark.parametrize("shape, axis", [((37, 70), -1), ((3, 5, 33), -1), ((33, 12), 0), ((2048, 300), -1),
                                         ((300,), 0)])
def test_stashed_softmax_matches_numpy_under_every_schedule_it_allows(shape, axis):
    """The stash (the exp written into the output inside the sum's loop, read back by the output loop) is used
    where the reduced axes are the inner loops, and any schedule the optimizer accepts keeps the result; over
    axis 0 of a 2-d array the rows would be inner loops, so the exp gets a buffer instead."""
    from fnx.lower.optimize import Opt, OptError, apply_opt, schedule_override
    x = np.random.default_rng(5).standard_normal(shape).astype(np.float32) * 4
    e = np.exp(x.astype(np.float64) - x.max(axis=axis, keepdims=True))
    want = e / e.sum(axis=axis, keepdims=True)
    assert bool(_stash_kernel(x, axis)) == (axis == -1 or len(shape) == 1)
    trials = [[], [Opt("THREAD", 0)], [Opt("VECTORIZE", len(shape), 16), Opt("VECTORIZE", len(shape) - 1, 16),
                                       Opt("THREAD", 0)], [Opt("SWAP", 0, 1)], [Opt("THREAD", len(shape) - 1)],
              [Opt("UPCAST", len(shape) - 1, 2)], [Opt("VECTORIZE", 0, 4)], [Opt("SPLIT", len(shape) - 1, 3)],
              [Opt("UNROLL", len(shape), 2)], [Opt("UNROLL", len(shape) + 1, 2)], [Opt("SPLIT", len(shape) + 1, 2)]]
    for opts in trials:
        def choose(kernel, target):
            k = kernel
            for o in opts:  # the actions up to the first the kernel refuses
                try:
                    k = apply_opt(k, o)
                except OptError:
                    break
            return list(k.opts)
        with schedule_override(choose):
            got = _compiled(lambda x: fnx.nn.softmax(x, axis=axis), x)
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-7, err_msg=str(opts))


def _compiled(f, x):
    from fnx.backends.device import Buffer, get_device
    fn = fnx.make_graph(f)(x).fn
    exe = get_device("cpu").executable(fn)  # compiled here, never from the executable cache
    return exe([Buffer.from_numpy("cpu:0", x)])[0].numpy(x.shape)


def test_stash_kernel_refuses_actions_that_would_reorder_its_rows():
    from fnx.lower.optimize import Opt, OptError, apply_opt
    (kernel,) = _stash_kernel(np.zeros((64, 48), np.float32))
    apply_opt(kernel, Opt("THREAD", 0))
    for bad in (Opt("SWAP", 0, 1), Opt("THREAD", 1), Opt("VECTORIZE", 0, 4), Opt("UPCAST", 0, 2),
                Opt("SPLIT", 0, 4)):
        with pytest.raises(OptError):
            apply_opt(kernel, bad)


def test_one_stash_per_kernel():
    """Two values a kernel would stash in the same output: one gets a buffer (they would overwrite each other)."""
    def two(x):
        a, b = jnp.exp(x), jnp.sin(x) * jnp.exp(-x)
        return a / a.sum(axis=-1, keepdims=True) + b / b.sum(axis=-1, keepdims=True)
    x = np.random.default_rng(6).standard_normal((9, 40)).astype(np.float32)
    kernels = schedule_of(two, x).kernels
    assert all(len(k.sink.src) <= 2 for k in kernels)
    a, b = np.exp(x.astype(np.float64)), np.sin(x) * np.exp(-x.astype(np.float64))
    check(two, x, want=a / a.sum(-1, keepdims=True) + b / b.sum(-1, keepdims=True))


@pytest.mark.parametrize("softmax", [fnx.nn.softmax, softmax_by_hand])
def test_fused_softmax_matches_numpy(device, softmax):
    x = np.random.default_rng(4).standard_normal((37, 70)).astype(np.float32) * 4
    np.testing.assert_allclose(np.asarray(fnx.jit(softmax)(x)), softmax_numpy(x), rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("shape", [(4096, 4096), (512, 768)])
def test_layernorm_over_rows_is_at_most_two_kernels(shape):
    x, g = np.zeros(shape, np.float32), np.ones(shape[-1], np.float32)
    kernels = schedule_of(layernorm, x, g, g).kernels
    assert len(kernels) <= 2
    assert sum(ops_in(k).count(Ops.REDUCE) for k in kernels) == 2


def test_fused_layernorm_matches_numpy(device):
    rng = np.random.default_rng(5)
    x = (rng.standard_normal((19, 130)) * 3 + 1).astype(np.float32)
    g, b = rng.standard_normal(130).astype(np.float32), rng.standard_normal(130).astype(np.float32)
    np.testing.assert_allclose(np.asarray(fnx.jit(layernorm)(x, g, b)), layernorm_numpy(x, g, b), rtol=1e-4, atol=1e-5)


@given(st.tuples(dims, dims), st.sampled_from([0, 1]))
def test_reduce_feeding_a_reduce_fuses(shape, axis):
    x = np.random.default_rng(6).standard_normal(shape).astype(np.float32)
    f = lambda x: x.var(axis=axis)  # noqa: E731
    kernels = kernels_of(f, x)
    assert len(kernels) == 1
    check(f, x, want=x.astype(np.float64).var(axis=axis))


def test_matmul_fuses_only_into_an_elementwise_epilogue():
    """A matmul-like reduction read once per output element (bias + relu, a transpose) is computed in its consumer's
    kernel (the optimizer still sees the matmul: one REDUCE); read by a reduction over its rows, it keeps a buffer."""
    rng = np.random.default_rng(7)
    a, b = rng.standard_normal((12, 9)).astype(np.float32), rng.standard_normal((9, 14)).astype(np.float32)
    bias = rng.standard_normal(14).astype(np.float32)
    relu = lambda a, b, bias: jnp.maximum(a @ b + bias, 0.0)  # noqa: E731
    kernels = kernels_of(relu, a, b, bias)
    assert len(kernels) == 1 and ops_in(kernels[0]).count(Ops.REDUCE) == 1
    check(relu, a, b, bias, want=np.maximum(a.astype(np.float64) @ b + bias, 0))
    transposed = lambda a, b: (a @ b).T * 2.0  # noqa: E731
    assert len(kernels_of(transposed, a, b)) == 1
    check(transposed, a, b, want=(a.astype(np.float64) @ b).T * 2)
    f = lambda a, b: jnp.maximum(a @ b, 0.0) + (a @ b).sum(axis=1, keepdims=True)  # noqa: E731
    kernels = kernels_of(f, a, b)
    assert len(kernels) == 2
    assert [ops_in(k).count(Ops.REDUCE) for k in kernels] == [1, 1]  # the matmul, then the row sum in the output
    ab = a.astype(np.float64) @ b
    check(f, a, b, want=np.maximum(ab, 0) + ab.sum(axis=1, keepdims=True))


def test_matmul_keeps_a_buffer_before_a_heavy_epilogue():
    """tanh(a @ b + c @ d) (the RNN cell): applied to the accumulators of a register block, tanh's temporaries
    would spill; on the CPU the products keep buffers and tanh runs as a kernel of its own. A light epilogue (bias,
    relu) stays fused, and the values are the same either way."""
    rng = np.random.default_rng(9)
    a, b = rng.standard_normal((16, 64)).astype(np.float32), rng.standard_normal((64, 64)).astype(np.float32) / 8
    c, d = rng.standard_normal((16, 32)).astype(np.float32), rng.standard_normal((32, 64)).astype(np.float32) / 8
    cell = lambda a, b, c, d: jnp.tanh(a @ b + c @ d)  # noqa: E731
    kernels = kernels_of(cell, a, b, c, d)
    assert [ops_in(k).count(Ops.REDUCE) for k in kernels] == [1, 1, 0]
    with fnx.default_device("cpu"):  # a grid device has no register block to spill: there it stays one kernel
        [fused] = rangeify(callify(fnx.make_graph(cell)(a, b, c, d).fn), grid=True).kernels
    assert ops_in(fused).count(Ops.REDUCE) == 2
    want = np.tanh(a.astype(np.float64) @ b + c.astype(np.float64) @ d)
    check(cell, a, b, c, d, want=want)
    np.testing.assert_allclose(np.asarray(fnx.jit(lambda h, xs: lax.scan(
        lambda h, x: (cell(h, b, x, d), None), h, xs)[0])(a, np.stack([c, -c, c]))),
        _numpy_cell(a, b, [c, -c, c], d), rtol=2e-5, atol=2e-6)
    import threading  # as users run it: jitted, called again from four threads at once, and in float16
    jitted, results = fnx.jit(cell), []
    threads = [threading.Thread(target=lambda: results.append(np.asarray(jitted(a, b, c, d)))) for _ in range(4)]
    for t in threads: t.start()
    for t in threads: t.join()
    for got in results: np.testing.assert_allclose(got, want, rtol=2e-5, atol=2e-6)
    half = [v.astype(np.float16) for v in (a, b, c, d)]
    np.testing.assert_allclose(np.asarray(jitted(*half)).astype(np.float64),
                               np.tanh(half[0].astype(np.float64) @ half[1] + half[2].astype(np.float64) @ half[3]),
                               rtol=0, atol=4e-3)
    light = lambda a, b, c, d: jnp.maximum(a @ b + c @ d, 0.0)  # noqa: E731
    assert len(kernels_of(light, a, b, c, d)) == 1
    check(light, a, b, c, d, want=np.maximum(a.astype(np.float64) @ b + c.astype(np.float64) @ d, 0))


def _numpy_cell(h, b, xs, d):
    for x in xs: h = np.tanh(h.astype(np.float64) @ b + x.astype(np.float64) @ d)
    return h


def test_reduce_that_varies_along_an_inner_loop_keeps_its_kernel():
    """x - x.mean(axis=0): fused, the column mean would be recomputed for every row."""
    x = np.random.default_rng(8).standard_normal((64, 48)).astype(np.float32)
    f = lambda x: x - x.mean(axis=0)  # noqa: E731
    kernels = kernels_of(f, x)
    assert len(kernels) == 2
    assert sum(k.flops for k in kernels) < 8 * x.size  # fused, the mean's sum alone would be 64 * x.size
    check(f, x, want=x - x.astype(np.float64).mean(axis=0))


def test_reduce_over_a_row_larger_than_cache_keeps_its_kernel():
    f = lambda x: x - x.max(axis=-1, keepdims=True)  # noqa: E731
    assert len(schedule_of(f, np.zeros((2, FUSED_ROW_BYTES // 4), np.float32)).kernels) == 1
    assert len(schedule_of(f, np.zeros((2, FUSED_ROW_BYTES // 4 + 1), np.float32)).kernels) == 2


def test_reduce_read_at_two_places_is_computed_once():
    x = np.random.default_rng(9).standard_normal((10, 6)).astype(np.float32)
    f = lambda x: x.sum(1, keepdims=True)[1:] + x.sum(1, keepdims=True)[:-1]  # noqa: E731
    kernels = kernels_of(f, x)
    assert sum(ops_in(k).count(Ops.REDUCE) for k in kernels) == 1
    s = x.astype(np.float64).sum(1, keepdims=True)
    check(f, x, want=s[1:] + s[:-1])


def test_reduce_needed_by_two_kernels_gets_a_buffer():
    x = np.random.default_rng(10).standard_normal((10, 6)).astype(np.float32)
    f = lambda x: (x - x.max(-1, keepdims=True), lax.exp2(x) - x.max(-1, keepdims=True))  # noqa: E731
    kernels = schedule_of(f, x).kernels
    assert len(kernels) == 3 and sum(ops_in(k).count(Ops.REDUCE) for k in kernels) == 1
    with fnx.default_device("cpu"):
        got = fnx.jit(f)(x)
    np.testing.assert_allclose(np.asarray(got[0]), x - x.max(-1, keepdims=True))
    np.testing.assert_allclose(np.asarray(got[1]), np.exp2(x) - x.max(-1, keepdims=True), rtol=1e-5, atol=1e-6)



def _mlp_loss(x, w1, b1, w2):
    return (fnx.nn.gelu(x @ w1 + b1) @ w2).sum()


def test_a_matmul_realized_for_one_kernel_is_read_by_every_kernel():
    """grad of an MLP: its first layer's x @ w1 feeds the forward gelu, the gelu derivative and (as a matmul
    operand inside another reduction) w2's gradient. The last could not fuse it and gave it a buffer, but the
    kernels built before kept computing it inline: three copies of the matmul, one in scalar loops (36 ms where
    3 ms do). Now one kernel computes it and the rest read its buffer."""
    rng = np.random.default_rng(12)
    x, w1 = rng.standard_normal((64, 16)).astype(np.float32), rng.standard_normal((16, 48)).astype(np.float32)
    b1, w2 = rng.standard_normal(48).astype(np.float32), rng.standard_normal((48, 8)).astype(np.float32)
    grad = fnx.grad(_mlp_loss, argnums=(1, 2, 3))
    kernels = rangeify(callify(fnx.make_graph(grad)(x, w1, b1, w2).fn)).kernels
    first_layer = [k for k in kernels if k.reduce_ranges and {0, 1} <= set(k.args)]  # reads x and w1, reduces
    assert len(first_layer) == 1, [(k.name, k.args) for k in kernels]
    with fnx.default_device("cpu"):
        got = fnx.jit(grad)(x, w1, b1, w2)
    jax = pytest.importorskip("jax")
    with jax.default_device(jax.devices("cpu")[0]):
        want = jax.grad(lambda *a: (jax.nn.gelu(a[0] @ a[1] + a[2]) @ a[3]).sum(), argnums=(1, 2, 3))(x, w1, b1, w2)
    for g, w in zip(got, want):
        np.testing.assert_allclose(np.asarray(g), np.asarray(w), rtol=2e-4, atol=2e-4)


def test_a_reduction_of_a_broadcast_is_done_once():
    """ones @ w.T (the cotangent of a sum, broadcast over the batch) reduces each row of w once, not once per
    batch row: no kernel reduces inside a loop over the batch."""
    rng = np.random.default_rng(13)
    w = rng.standard_normal((48, 16)).astype(np.float32)
    f = lambda w: jnp.ones((64, 16), jnp.float32) @ w.T  # noqa: E731
    kernels = kernels_of(f, w)
    assert all(k.work <= 48 * 16 for k in kernels if k.reduce_ranges), [(k.name, k.work) for k in kernels]
    check(f, w, want=np.broadcast_to(w.astype(np.float64).sum(1), (64, 48)))


def test_a_cheap_operand_of_a_matmul_is_computed_once_not_per_column():
    """(a * s + c) @ b: the elementwise producer of A does not vary along the output's columns, so fused into the
    reduction it ran once per multiply-add (a layernorm feeding a weight gradient: 4x the matmul's work). It gets
    a buffer when that costs less than the copies: the schedule's FLOPs are the matmul's plus one pass over A."""
    rng = np.random.default_rng(14)
    m, k, n = 32, 24, 40
    a, b = rng.standard_normal((m, k)).astype(np.float32), rng.standard_normal((k, n)).astype(np.float32)
    s, c = rng.standard_normal(k).astype(np.float32), rng.standard_normal(k).astype(np.float32)
    f = lambda a, b, s, c: (a * s + c) @ b  # noqa: E731
    kernels = kernels_of(f, a, b, s, c)
    assert sum(kern.flops for kern in kernels) <= 1.2 * (2 * m * k * n + 2 * m * k), [kern.name for kern in kernels]
    want = (a.astype(np.float64) * s + c) @ b
    np.testing.assert_allclose(run_on("cpu", f, a, b, s, c), want, rtol=1e-5, atol=1e-5)


def test_batched_rows_times_a_matrix_is_one_matrix_product():
    """x (b, t, d) @ w (d, n) is one (b*t, d) @ (d, n) product, as JAX's dot_general has it: w was broadcast per
    batch element, so its gradient was b partial products of (d, n) summed afterwards (a (b, d, n) buffer)."""
    rng = np.random.default_rng(15)
    x, w = rng.standard_normal((4, 6, 8)).astype(np.float32), rng.standard_normal((8, 10)).astype(np.float32)
    grad = fnx.grad(lambda w, x: jnp.sin(x @ w).sum())
    schedule = rangeify(callify(fnx.make_graph(grad)(w, x).fn))
    assert max(spec.size for spec in schedule.buffers) < 4 * 8 * 10, [spec.size for spec in schedule.buffers]
    with fnx.default_device("cpu"):
        got = np.asarray(fnx.jit(grad)(w, x))
    x64 = x.astype(np.float64).reshape(-1, 8)
    np.testing.assert_allclose(got, x64.T @ np.cos(x64 @ w), rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(np.asarray(fnx.jit(lambda x, w: x @ w)(x, w)), x.astype(np.float64) @ w, rtol=1e-5,
                               atol=1e-5)

def test_expensive_value_used_by_two_kernels_is_computed_once():
    x = np.random.default_rng(11).standard_normal((10, 6)).astype(np.float32)
    f = lambda x: (jnp.exp(x).sum(axis=0), jnp.exp(x).sum(axis=1))  # noqa: E731
    kernels = schedule_of(f, x).kernels
    assert len(kernels) == 3
    assert sum(Ops.BITCAST in ops_in(k) for k in kernels) == 1  # exp's polynomial is built with bitcasts
    with fnx.default_device("cpu"):
        got = fnx.jit(f)(x)
    np.testing.assert_allclose(np.asarray(got[0]), np.exp(x.astype(np.float64)).sum(0), rtol=1e-5)
    np.testing.assert_allclose(np.asarray(got[1]), np.exp(x.astype(np.float64)).sum(1), rtol=1e-5)


def normalizations(steps: int):
    def f(x):
        for _ in range(steps):
            x = x - x.mean(axis=-1, keepdims=True)
            x = x / (jnp.sqrt((x * x).mean(axis=-1, keepdims=True)) + 1.0)
        return x
    return f


def normalizations_numpy(x, steps: int):
    x = x.astype(np.float64)
    for _ in range(steps):
        x = x - x.mean(axis=-1, keepdims=True)
        x = x / (np.sqrt((x * x).mean(axis=-1, keepdims=True)) + 1.0)
    return x


def test_chain_of_normalizations_costs_linear_flops():
    """Each step fuses its two reductions; earlier steps are not recomputed in later kernels (once quadratic)."""
    x = np.zeros((64, 32), np.float32)
    flops = [sum(k.flops for k in schedule_of(normalizations(n), x).kernels) for n in (8, 12, 16, 20, 24)]
    increments = np.diff(flops)
    assert increments.max() <= 1.25 * increments.min(), flops
    assert len(schedule_of(normalizations(24), x).kernels) <= 2 * 24



def _layernorm_residuals(x):
    for _ in range(8):
        mean = x.mean(-1, keepdims=True)
        x = x + 0.5 * (x - mean) / jnp.sqrt(((x - mean) ** 2).mean(-1, keepdims=True) + 1e-5)
    return x


def test_layernorm_residual_chain_is_one_kernel_per_step():
    """bench W10's chain: x - mean kept in an early round of the split (while its cone was still fused work) cost
    the first four steps a second kernel and pass over memory each; once cheap it is fused again."""
    x = np.random.default_rng(16).standard_normal((64, 48)).astype(np.float32)
    assert len(kernels_of(_layernorm_residuals, x)) == 8
    want = x.astype(np.float64)
    for _ in range(8):
        d = want - want.mean(-1, keepdims=True)
        want = want + 0.5 * d / np.sqrt((d * d).mean(-1, keepdims=True) + 1e-5)
    np.testing.assert_allclose(run_on("cpu", _layernorm_residuals, x), want, rtol=1e-4, atol=1e-4)

def test_chain_of_normalizations_matches_numpy(device):
    x = np.random.default_rng(12).standard_normal((16, 24)).astype(np.float32)
    np.testing.assert_allclose(np.asarray(fnx.jit(normalizations(7))(x)), normalizations_numpy(x, 7),
                               rtol=1e-4, atol=1e-5)


def _split_text(fn) -> list:
    schedule = rangeify(fn)
    return [(k.sink, tuple(k.args), tuple(r.arg for r in k.ranges), tuple(r.arg for r in k.reduce_ranges),
             k.row_ranges is not None) if hasattr(k, "sink") else type(k).__name__ for k in schedule.kernels] + \
        [(b.dtype, b.size, b.kind) for b in schedule.buffers] + [tuple(schedule.outputs)]


def _gelu_standardize_steps(x, steps=6):
    for _ in range(steps): x = x + fnx.nn.gelu(fnx.nn.standardize(x, axis=-1))
    return x


def test_kernels_reused_across_splits_are_the_ones_a_rebuild_gives(monkeypatch):
    """rangeify splits the function several times; a kernel an earlier split built is reused when its build would
    repeat (`_reused`), a build that failed is not walked again when it would fail the same way (`_Failed`), and
    within a split the needs of a node's next builds are found ahead by speculation (`_Hint`). The whole schedule
    must equal the one built from scratch every time."""
    import sys
    sys.path.insert(0, str(__import__("pathlib").Path(__file__).parents[2]))
    from bench import run as bench
    rng = np.random.default_rng(0)
    gpt = {k: jnp.asarray(v) for k, v in bench._gpt_params(rng).items()}
    data = rng.integers(0, bench.GPT["vocab"], (bench.GPT["batch"], bench.GPT["seq"] + 1)).astype(np.int32)
    mlp, x, y = bench._mlp_data()
    programs = [
        (bench._gpt_step(jnp, fnx.nn, fnx.value_and_grad), (gpt, jnp.asarray(data[:, :-1]), jnp.asarray(data[:, 1:]))),
        (bench._mlp_step(jnp, fnx.nn, fnx.value_and_grad),
         ({k: jnp.asarray(v) for k, v in mlp.items()}, jnp.asarray(x), jnp.asarray(np.eye(10, dtype=np.float32)[y]))),
        (lambda x: fnx.nn.softmax(jnp.tanh(x) @ x.T, axis=-1).sum(0), (jnp.ones((64, 64)),)),
        (fnx.grad(lambda x: _gelu_standardize_steps(x).sum()), (jnp.ones((32, 64)),)),
        (fnx.grad(lambda x: normalizations(5)(x).sum()), (jnp.ones((16, 24)),)),
        (fnx.grad(_residual_mlp), ([jnp.ones((32, 32)) * 0.1 * i for i in range(4)], jnp.ones((16, 32)))),
        (_log_softmax_steps, (jnp.ones((8, 16)),)),
        # the matmul fails after its operand's row max r was fused into it (a heavy epilogue); r read again,
        # flipped, is fused as the next build would fuse it only when speculation undid that first visit
        (lambda x, w: jnp.tanh((x - x.max(-1, keepdims=True)) @ w) + x.max(-1, keepdims=True)[::-1],
         (jnp.ones((8, 16)), jnp.ones((16, 4)))),
        # the input's gradient needs sin(1.5 x) beneath a reduction that then fails itself: the undo of that
        # reduction's cone must not forget that an earlier build read sin(1.5 x), which the split realizes for
        # the matmul before building the input's gradient again (found by the fuzzer)
        (fnx.grad(lambda x: (lambda m: m.sum() + jnp.exp(m).sum())(jnp.sin(x * 1.5) @ jnp.sin(x * 1.5).T)),
         (jnp.zeros((63, 2)),)),
    ]
    for f, args in programs:
        fn = callify(fnx.make_graph(f)(*args).fn)
        _failures_checked(monkeypatch)
        reused = _split_text(fn)
        monkeypatch.undo()
        _plain_splits(monkeypatch)
        rebuilt = _split_text(fn)
        monkeypatch.undo()
        assert reused == rebuilt


@settings(max_examples=50, deadline=None, database=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much])
@given(st.data())
def test_shortcuts_leave_random_programs_split_alike(data):
    """The fuzzer's random programs (tests/fuzz/programs.py, up to 30 numpy steps), forward and the gradient of
    their float outputs' sum: split with rangeify's shortcuts and with every build walked, the same schedule."""
    from tests.fuzz.programs import programs
    prog = data.draw(programs(grad=True))
    ns = {"jnp": jnp, "np": np}
    exec(prog.program_source(), ns)
    program = ns["program"]
    args = [np.zeros(i.shape, i.dtype) for i in prog.inputs]
    floats = prog.float_outputs()
    functions = [program] + ([fnx.grad(lambda *xs: sum(program(*xs)[k].sum() for k in floats),
                                       argnums=tuple(range(len(args))))] if floats else [])
    for f in functions:
        fn = callify(fnx.make_graph(f)(*args).fn)
        with pytest.MonkeyPatch.context() as monkeypatch:
            _failures_checked(monkeypatch)
            fast = _split_text(fn)
            _plain_splits(monkeypatch)
            assert _split_text(fn) == fast, prog.source()


def _residual_mlp(ws, x):
    h = x
    for w in ws:
        m = h.mean(-1, keepdims=True)
        h = h + jnp.tanh((h - m) / jnp.sqrt(((h - m) ** 2).mean(-1, keepdims=True) + 1e-5) @ w)
    return (h ** 2).mean()


def _log_softmax_steps(x, steps=8):
    for _ in range(steps): x = fnx.nn.log_softmax(x) * 0.5
    return x


def _failures_checked(monkeypatch):
    """Every failed build, walked or replayed (`_Failed`, `_Hint`), checked against a plain build of the same node
    at that moment: it must fail on the same need."""
    from fnx.lower import rangeify as rangeify_module
    kernel_for = rangeify_module._kernel_for

    def checked(u, buf_id, schedule, plan, built=None, hints=None):
        try:
            return kernel_for(u, buf_id, schedule, plan, built, hints)
        except rangeify_module._Realize as need:
            with pytest.raises(rangeify_module._Realize) as plain:
                kernel_for(u, buf_id, schedule, plan)
            assert plain.value.node is need.node
            raise
    monkeypatch.setattr(rangeify_module, "_kernel_for", checked)


def _plain_splits(monkeypatch):
    """rangeify without its shortcuts: every build walked, none reused, replayed or speculative."""
    from fnx.lower import rangeify as rangeify_module
    kernel_for = rangeify_module._kernel_for
    monkeypatch.setattr(rangeify_module, "_reused", lambda *a: None)
    monkeypatch.setattr(rangeify_module._Failed, "again", lambda *a: False)
    monkeypatch.setattr(rangeify_module, "_kernel_for", lambda u, buf_id, schedule, plan, built=None, hints=None:
                        kernel_for(u, buf_id, schedule, plan, built))


def test_failed_builds_are_not_walked_again(monkeypatch):
    """The gradient of a chain of normalizations fails each build of its output once per statistic below it (each
    needs a buffer first), and the second split fails the same ones: one speculative walk finds the needs of all
    of a split's builds of a node (`_Hint`), and the second split replays the first failure (`_Failed`), with the
    same schedule as every build walked. Counted in node visits of KernelBuilder.value; the result checked
    against float64 finite differences."""
    from fnx.lower import rangeify as rangeify_module
    x = np.random.default_rng(3).standard_normal((32, 64)).astype(np.float32)
    f = fnx.grad(lambda x: _gelu_standardize_steps(x, 10).sum())
    fn = callify(fnx.make_graph(f)(x).fn)
    visits = [0]
    value = rangeify_module.KernelBuilder.value

    def counted(self, *args):
        visits[0] += 1
        return value(self, *args)
    monkeypatch.setattr(rangeify_module.KernelBuilder, "value", counted)
    replayed = _split_text(fn)
    with_shortcuts, visits[0] = visits[0], 0
    reused = rangeify_module._reused
    _plain_splits(monkeypatch)
    monkeypatch.setattr(rangeify_module, "_reused", reused)  # (reuse kept: it is not what is measured)
    assert _split_text(fn) == replayed
    assert with_shortcuts < 0.5 * visits[0], (with_shortcuts, visits[0])
    monkeypatch.undo()

    def reference(x, steps=10):  # float64: gelu (tanh form) of standardize, its gradient by finite differences
        def g(a):
            for _ in range(steps):
                s = (a - a.mean(-1, keepdims=True)) / np.sqrt(a.var(-1, keepdims=True) + 1e-5)
                a = a + 0.5 * s * (1 + np.tanh(np.sqrt(2 / np.pi) * (s + 0.044715 * s ** 3)))
            return a.sum()
        grad, h = np.zeros_like(x, np.float64), 1e-6
        flat = x.astype(np.float64).ravel()
        for i in range(0, flat.size, 97):  # a sample of the entries
            up, down = flat.copy(), flat.copy()
            up[i] += h
            down[i] -= h
            grad.ravel()[i] = (g(up.reshape(x.shape)) - g(down.reshape(x.shape))) / (2 * h)
        return grad
    got = np.asarray(fnx.jit(f)(x))
    want = reference(x)
    sample = np.arange(0, x.size, 97)
    np.testing.assert_allclose(got.ravel()[sample], want.ravel()[sample], rtol=2e-3, atol=2e-3)


def test_losers_match_the_pairwise_rule():
    """rangeify._losers (one walk down, one up) against the rule it implements, pair by pair: of two costly values
    one above the other, the upper one loses when the lower one is computed in more places, else the lower one."""
    from fnx.lower.rangeify import _losers
    from fnx.uop import postorder
    x = np.ones((4, 8), np.float32)

    def f(a):
        b = jnp.exp(a) * 2.0
        c = jnp.sin(b) + b
        d = jnp.tanh(c) * c - jnp.cos(b)
        return (d + jnp.sqrt(jnp.abs(c))).sum(-1), jnp.log(jnp.abs(d) + 1.0)
    body = callify(fnx.make_graph(f)(x).fn).src[0]
    nodes = [u for u in body.toposort if u.op in (Ops.ADD, Ops.MUL, Ops.EXP2, Ops.SIN, Ops.LOG2, Ops.SQRT)]
    rng = np.random.default_rng(0)
    for _ in range(200):
        costly = list(rng.choice(nodes, size=int(rng.integers(1, len(nodes) + 1)), replace=False))
        stop = set(rng.choice(nodes, size=int(rng.integers(0, 3)), replace=False)) - set(costly)
        places = {u: int(rng.integers(2, 5)) for u in costly}
        want = set()
        for u in costly:
            for v in postorder(u, lambda n: n.src, stop)[:-1]:
                if v in places: want.add(u if places[v] > places[u] else v)
        assert _losers(costly, places, stop) == want


def _evaluate(u, env: dict) -> int:
    """An index expression's value with RANGEs bound by `env` (Python's // and % equal the kernels' on these
    non-negative values)."""
    if u.op is Ops.CONST: return u.arg.value
    if u.op is Ops.RANGE: return env[u]
    a, b = (_evaluate(s, env) for s in u.src)
    return {Ops.ADD: a + b, Ops.MUL: a * b, Ops.DIV: a // b if b else 0, Ops.MOD: a % b if b else a}[u.op]


@given(st.lists(st.integers(1, 4), max_size=4), st.data())
def test_reshape_index_finds_the_element_numpy_does(new_shape, data):
    """The old shape's indices of each element of a reshape (rangeify reads through every RESHAPE with them):
    any factorization of the same size, size-1 axes anywhere, merges and splits and both in one run of axes."""
    from fnx.lower.rangeify import INDEX, reshape_index
    from fnx.uop import RangeArg, UOp
    size = int(np.prod(new_shape))
    factors, rest = [], size
    for p in (2, 3):
        while rest % p == 0: factors.append(p); rest //= p
    factors = data.draw(st.permutations(factors)) + [1] * data.draw(st.integers(0, 2))
    cuts = sorted(data.draw(st.lists(st.integers(0, len(factors)), max_size=3)))
    old_shape = tuple(int(np.prod(factors[a:b])) for a, b in zip([0] + cuts, cuts + [len(factors)]))
    ranges = [UOp(Ops.RANGE, INDEX, (), RangeArg(k, s)) for k, s in enumerate(new_shape)]
    index = reshape_index(tuple(ranges), tuple(new_shape), old_shape)
    for point in np.ndindex(*new_shape):
        flat = int(np.ravel_multi_index(point, new_shape)) if new_shape else 0
        want = tuple(int(w) for w in np.unravel_index(flat, old_shape)) if old_shape else ()
        assert tuple(_evaluate(i, dict(zip(ranges, point))) for i in index) == want, (new_shape, old_shape, point)


def test_a_param_of_another_trace_is_refused_not_read_from_the_argument_of_its_slot():
    # a transform that left an inner trace's PARAM in a program (a transposed custom_jvp rule did) had it read this
    # function's argument of the same slot, whatever its shape: a crash, or a read past its end
    own = UOp(Ops.PARAM, dtypes.float32, (), ParamArg(0, (4,), None))
    for stray in (UOp(Ops.PARAM, dtypes.float32, (), ParamArg(0, (300,), None, ("tangent", 1))),
                  UOp(Ops.PARAM, dtypes.float32, (), ParamArg(0, (300,), None))):
        total = UOp(Ops.ADD, dtypes.float32, (UOp(Ops.REDUCE, dtypes.float32, (own,), ReduceArg(Ops.ADD, (0,))),
                                              UOp(Ops.REDUCE, dtypes.float32, (stray,), ReduceArg(Ops.ADD, (0,)))))
        fn = UOp(Ops.FUNCTION, dtypes.bool_, (UOp(Ops.TUPLE, dtypes.bool_, (total,)), own))
        with pytest.raises(RuntimeError, match=r"argument 0 is read as float32\[(4|300)\]"):
            rangeify(fn)


def test_kernels_that_store_nothing_are_left_out(device):
    """A zero-size result's kernel has an output loop of no iterations: it is not compiled (on PoCL a program
    costs 0.2 s to build), and the results are still right: the empty arrays, and the sum over the empty axis,
    whose kernel stores zeros."""
    x = np.ones((4, 0, 3), np.float32)
    f = lambda a, b: (jnp.sin(a) * 2 + 1, (a * 3).sum(1), b + 1)  # noqa: E731
    b = np.arange(5, dtype=np.float32)
    got = [np.asarray(o) for o in fnx.jit(f)(x, b)]
    for g, want in zip(got, [np.ones((4, 0, 3)), np.zeros((4, 3)), b + 1]):
        assert g.shape == want.shape and g.dtype == np.float32
        np.testing.assert_array_equal(g, want)
    if device == "interp": return  # (the oracle does not lower)
    lowering = fnx.jit(f).lower(x, b).executable.lowering
    compiled = [k.name for k, lines in lowering.kernels if lines is not None]
    assert len(rangeify(callify(fnx.make_graph(f)(x, b).fn)).kernels) == 3 and len(compiled) == 2, compiled
