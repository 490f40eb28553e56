"""vmap: every primitive batched along any input axis (in_axes 0, 1, -1, None mixes) and placed along any output
axis, against the oracle of running the function once per example and stacking the results (with fnx itself, and
with numpy where numpy has the op); composition with jit, grad, jacfwd/jacrev, custom rules and checkpoint;
pytrees in and out; and the errors vmap raises."""
import numpy as np
import pytest
from hypothesis import given, strategies as st

import assertions
import fnx
import fnx.numpy as jnp
from fnx import dtypes, lax, tree_util
from fnx.errors import ConcretizationError
from fnx.trace import trace
from fnx.transforms.vmap import batch_rules
from fnx.uop import GroupOp, Ops

# ---- the oracle: one call per example, stacked ----


def example(args, in_axes, i: int) -> list:
    """The i-th example's arguments: batched arguments indexed along their batch axis, the others as they are."""
    return [a if ax is None else np.take(np.asarray(a), i, axis=ax) for a, ax in zip(args, in_axes)]


def stack_examples(fn, args, in_axes, size: int, out_axes=0):
    """`fn` run on each example, its outputs stacked along `out_axes` (a pytree of numpy arrays)."""
    outs = [fn(*example(args, in_axes, i)) for i in range(size)]
    return tree_util.tree_map(lambda *o: np.stack([np.asarray(v) for v in o], axis=out_axes), *outs)


def assert_tree_close(actual, expected, rtol: float = 1e-5, atol: float = 1e-6) -> None:
    """Same structure, shapes and dtypes; values exactly equal for integers and bools, close for floats."""
    assertions.assert_tree_close(actual, expected, rtol, atol, exact_dtypes=True)


def check_vmap(fn, args, in_axes, out_axes=0, reference=None, rtol: float = 1e-5, atol: float = 1e-6):
    """vmap(fn) on the current device equals fn per example on the interp oracle, stacked, and `reference` (a
    numpy function) per example stacked. (The examples run on interp, not on the device: the unbatched functions
    run on every device in their own tests, and on opencl each would build programs of its own.)"""
    in_axes = tuple(in_axes)
    size = next(np.shape(a)[ax] for a, ax in zip(args, in_axes) if ax is not None)
    out = fnx.vmap(fn, in_axes=in_axes, out_axes=out_axes)(*args)
    on_arrays = lambda *a: fn(*[jnp.asarray(v) for v in a])  # noqa: E731   (methods like .at need Arrays)
    with fnx.default_device("interp"):
        examples = stack_examples(on_arrays, args, in_axes, size, out_axes)
    assert_tree_close(out, examples, rtol, atol)
    if reference is not None:
        want = stack_examples(reference, args, in_axes, size, out_axes)
        assert_tree_close(tree_util.tree_map(np.asarray, out), want, rtol=1e-4, atol=1e-5)
    return out


def batch(make, in_axes, size: int, rng) -> list:
    """Arguments for `in_axes`: `size` examples from `make(rng)` stacked along each batched argument's axis."""
    draws = [make(rng) for _ in range(size)]
    return [draws[0][j] if ax is None else np.stack([d[j] for d in draws], axis=ax) for j, ax in enumerate(in_axes)]


# ---- example values ----

def normal(shape, dtype=np.float32):
    return lambda r: r.standard_normal(shape).astype(dtype)


def positive(shape):
    return lambda r: r.uniform(0.5, 2.0, shape).astype(np.float32)


def ints(shape, lo=-9, hi=10, dtype=np.int32):
    return lambda r: r.integers(lo, hi, shape).astype(dtype)


def nonzero_ints(shape):
    return lambda r: (r.integers(1, 6, shape) * r.choice([-1, 1], shape)).astype(np.int32)


def bools(shape):
    return lambda r: r.random(shape) < 0.5


def unique_indices(n, k):
    return lambda r: r.permutation(n)[:k].astype(np.int32)


def args_of(*makers):
    return lambda r: tuple(m(r) for m in makers)


# ---- numpy references for the primitives ----

def np_trunc_div(a, b):
    return (np.abs(a) // np.abs(b) * np.sign(a) * np.sign(b)).astype(a.dtype)


def np_gather(x, idx, axis):
    return np.take(x, np.clip(idx, 0, x.shape[axis] - 1), axis=axis)


def np_scatter(x, idx, upd, axis, mode):
    out = np.moveaxis(np.array(x, copy=True), axis, 0)
    upd = np.moveaxis(upd, tuple(range(axis, axis + idx.ndim)), tuple(range(idx.ndim)))
    combine = {"set": lambda old, new: new, "add": np.add, "mul": np.multiply, "min": np.minimum, "max": np.maximum}
    for pos in np.ndindex(idx.shape):
        if 0 <= idx[pos] < out.shape[0]:
            out[idx[pos]] = combine[mode](out[idx[pos]], upd[pos])
    return np.moveaxis(out, 0, axis)


def np_pad(x, value, config):
    return np.pad(x, [(lo, hi) for lo, hi, _ in config], constant_values=value)


CLOSED = np.arange(12, dtype=np.float32).reshape(3, 4) - 5.0   # a closed-over array: a BUFFER in the graph
X = (3, 4)

# (name, fn, make one example's args, numpy reference or None)
PRIMITIVES = [
    # unary ALU
    ("recip", lax.recip, args_of(positive(X)), lambda x: 1 / x),
    ("sqrt", lax.sqrt, args_of(positive(X)), np.sqrt),
    ("exp2", lax.exp2, args_of(normal(X)), np.exp2),
    ("log2", lax.log2, args_of(positive(X)), np.log2),
    ("sin", lax.sin, args_of(normal(X)), np.sin),
    # complex numbers: COMPLEX, REAL and IMAG (and complex values through movement and sums)
    ("complex_parts", lambda x, y: (lax.complex(x, y), lax.real(jnp.flip(lax.complex(x, y))),
                                    lax.imag(lax.exp(jnp.flip(lax.complex(y, x))))),
     args_of(normal(X), normal(X)),
     lambda x, y: (x + 1j * y, np.flip(x), np.imag(np.exp(np.flip(y + 1j * x))))),
    ("trunc", lambda x: lax.trunc(x * 3), args_of(normal(X)), lambda x: np.trunc(x * 3)),
    ("cast_f32_i32", lambda x: lax.convert_element_type(x * 4, jnp.int32), args_of(normal(X)),
     lambda x: (x * 4).astype(np.int32)),
    ("cast_i32_f32", lambda x: lax.convert_element_type(x, jnp.float32), args_of(ints(X)),
     lambda x: x.astype(np.float32)),
    ("cast_f32_bool", lambda x: lax.convert_element_type(lax.trunc(x), jnp.bool_), args_of(normal(X)),
     lambda x: np.trunc(x).astype(bool)),
    ("cast_bool_i32", lambda x: lax.convert_element_type(x, jnp.int32), args_of(bools(X)),
     lambda x: x.astype(np.int32)),
    ("cast_i32_u8", lambda x: lax.convert_element_type(x, jnp.uint8), args_of(ints(X, -300, 300)),
     lambda x: x.astype(np.uint8)),
    ("bitcast_f32_i32", lambda x: lax.bitcast_convert_type(x, jnp.int32), args_of(normal(X)),
     lambda x: x.view(np.int32)),
    ("bitcast_u8_i8", lambda x: lax.bitcast_convert_type(x, jnp.int8), args_of(ints(X, 0, 256, np.uint8)),
     lambda x: x.view(np.int8)),
    # binary ALU
    ("add_f32", lax.add, args_of(normal(X), normal(X)), np.add),
    ("add_i32", lax.add, args_of(ints(X), ints(X)), np.add),
    ("add_u8_wraps", lax.add, args_of(ints(X, 0, 256, np.uint8), ints(X, 0, 256, np.uint8)), np.add),
    ("add_bool_as_or", lax.bitwise_or, args_of(bools(X), bools(X)), np.logical_or),
    ("mul_f32", lax.mul, args_of(normal(X), normal(X)), np.multiply),
    ("mul_i8_wraps", lax.mul, args_of(ints(X, -128, 128, np.int8), ints(X, -128, 128, np.int8)), np.multiply),
    ("div_f32", lax.div, args_of(normal(X), positive(X)), np.divide),
    ("div_i32", lax.div, args_of(ints(X, -50, 50), nonzero_ints(X)), np_trunc_div),
    ("max_f32", lax.max, args_of(normal(X), normal(X)), np.maximum),
    ("max_i32", lax.max, args_of(ints(X), ints(X)), np.maximum),
    ("max_bool", lax.max, args_of(bools(X), bools(X)), np.maximum),
    ("rem_f32", lax.rem, args_of(normal(X), positive(X)), np.fmod),
    ("rem_i32", lax.rem, args_of(ints(X, -50, 50), nonzero_ints(X)), np.fmod),
    ("lt_f32", lax.lt, args_of(normal(X), normal(X)), np.less),
    ("lt_u8", lax.lt, args_of(ints(X, 0, 256, np.uint8), ints(X, 0, 256, np.uint8)), np.less),
    ("ne_i32", lax.ne, args_of(ints(X, 0, 3), ints(X, 0, 3)), np.not_equal),
    ("ne_bool", lax.ne, args_of(bools(X), bools(X)), np.not_equal),
    ("and_i32", lax.bitwise_and, args_of(ints(X, -99, 99), ints(X, -99, 99)), np.bitwise_and),
    ("and_bool", lax.bitwise_and, args_of(bools(X), bools(X)), np.logical_and),
    ("or_i32", lax.bitwise_or, args_of(ints(X, -99, 99), ints(X, -99, 99)), np.bitwise_or),
    ("xor_i32", lax.bitwise_xor, args_of(ints(X, -99, 99), ints(X, -99, 99)), np.bitwise_xor),
    ("xor_bool", lax.bitwise_xor, args_of(bools(X), bools(X)), np.logical_xor),
    ("shl_i32", lax.shift_left, args_of(ints(X, -99, 99), ints(X, 0, 8)), np.left_shift),
    ("shr_i32", lax.shift_right, args_of(ints(X, -99, 99), ints(X, 0, 8)), np.right_shift),
    ("shr_u8", lax.shift_right, args_of(ints(X, 0, 256, np.uint8), ints(X, 0, 8, np.uint8)), np.right_shift),
    # ternary ALU
    ("where_f32", lax.select, args_of(bools(X), normal(X), normal(X)), np.where),
    ("where_i32", lax.select, args_of(bools(X), ints(X), ints(X)), np.where),
    # movement
    ("reshape", lambda x: lax.reshape(x, (4, 3)), args_of(normal(X)), lambda x: x.reshape(4, 3)),
    ("reshape_flat", lambda x: lax.reshape(x, (12,)), args_of(normal(X)), lambda x: x.reshape(12)),
    ("reshape_split", lambda x: lax.reshape(x, (2, 1, 6)), args_of(normal(X)), lambda x: x.reshape(2, 1, 6)),
    ("permute", lambda x: lax.transpose(x, (2, 0, 1)), args_of(normal((2, 3, 4))), lambda x: x.transpose(2, 0, 1)),
    ("expand", lambda x: lax.expand(x, (3, 4)), args_of(normal((3, 1))), lambda x: np.broadcast_to(x, (3, 4))),
    ("broadcast_in_dim", lambda x: lax.broadcast_in_dim(x, (2, 3), (1,)), args_of(normal((3,))),
     lambda x: np.broadcast_to(x, (2, 3))),
    ("pad_zero", lambda x: lax.pad(x, 0.0, [(1, 2, 0), (0, 1, 0)]), args_of(normal(X)),
     lambda x: np_pad(x, 0.0, [(1, 2, 0), (0, 1, 0)])),
    ("pad_value_crop", lambda x: lax.pad(x, 7.0, [(-1, 2, 0), (2, -1, 0)]), args_of(normal(X)),
     lambda x: np_pad(x[1:, :-1], 7.0, [(0, 2, 0), (2, 0, 0)])),
    ("pad_interior", lambda x: lax.pad(x, -1.0, [(0, 0, 1), (1, 0, 2)]), args_of(normal(X)), None),
    ("shrink", lambda x: lax.slice(x, (1, 0), (3, 3)), args_of(normal(X)), lambda x: x[1:3, 0:3]),
    ("shrink_strided", lambda x: lax.slice(x, (0, 1), (3, 4), (2, 2)), args_of(normal(X)), lambda x: x[0:3:2, 1:4:2]),
    ("flip", lambda x: lax.rev(x, (0,)), args_of(normal(X)), lambda x: x[::-1]),
    ("flip_both", lambda x: lax.rev(x, (0, 1)), args_of(normal(X)), lambda x: x[::-1, ::-1]),
    # gathers: out-of-range and negative indices clamp
    ("gather_axis0", lambda x, i: lax.gather_axis(x, i, 0), args_of(normal(X), ints((2,), -2, 5)),
     lambda x, i: np_gather(x, i, 0)),
    ("gather_axis1_2d", lambda x, i: lax.gather_axis(x, i, 1), args_of(normal(X), ints((2, 3), -2, 6)),
     lambda x, i: np_gather(x, i, 1)),
    ("gather_axis2_i8", lambda x, i: lax.gather_axis(x, i, 2), args_of(ints((2, 3, 4)), ints((5,), -1, 5, np.int8)),
     lambda x, i: np_gather(x, i, 2)),
    # scatters: out-of-range and negative indices are dropped
    ("scatter_set", lambda x, i, u: lax.scatter_axis(x, i, u, 0, "set"),
     args_of(normal(X), unique_indices(3, 2), normal((2, 4))), lambda x, i, u: np_scatter(x, i, u, 0, "set")),
    ("scatter_set_axis1", lambda x, i, u: lax.scatter_axis(x, i, u, 1, "set"),
     args_of(normal(X), unique_indices(4, 3), normal((3, 3))), lambda x, i, u: np_scatter(x, i, u, 1, "set")),
    ("scatter_add", lambda x, i, u: lax.scatter_axis(x, i, u, 1, "add"),
     args_of(normal(X), ints((2, 3), -2, 6), normal((3, 2, 3))), lambda x, i, u: np_scatter(x, i, u, 1, "add")),
    ("scatter_add_i32", lambda x, i, u: lax.scatter_axis(x, i, u, 0, "add"),
     args_of(ints(X), ints((5,), -1, 4), ints((5, 4))), lambda x, i, u: np_scatter(x, i, u, 0, "add")),
    ("scatter_mul", lambda x, i, u: lax.scatter_axis(x, i, u, 0, "mul"),
     args_of(normal(X), ints((4,), -1, 4), positive((4, 4))), lambda x, i, u: np_scatter(x, i, u, 0, "mul")),
    ("scatter_min", lambda x, i, u: lax.scatter_axis(x, i, u, 1, "min"),
     args_of(normal(X), ints((5,), 0, 5), normal((3, 5))), lambda x, i, u: np_scatter(x, i, u, 1, "min")),
    ("scatter_max", lambda x, i, u: lax.scatter_axis(x, i, u, 0, "max"),
     args_of(ints(X), ints((4,), -1, 4), ints((4, 4))), lambda x, i, u: np_scatter(x, i, u, 0, "max")),
    # reductions
    ("reduce_sum_0", lambda x: lax.reduce_sum(x, (0,)), args_of(normal(X)), lambda x: x.sum(0)),
    ("reduce_sum_all", lambda x: lax.reduce_sum(x, (0, 1)), args_of(normal(X)), lambda x: x.sum()),
    ("reduce_sum_i32_keep", lambda x: lax.reduce_sum(x, (1,), keepdims=True), args_of(ints(X)),
     lambda x: x.sum(1, keepdims=True, dtype=np.int32)),
    ("reduce_max_1", lambda x: lax.reduce_max(x, (1,)), args_of(normal(X)), lambda x: x.max(1)),
    ("reduce_max_u8", lambda x: lax.reduce_max(x, (0, 1)), args_of(ints(X, 0, 256, np.uint8)), lambda x: x.max()),
    ("reduce_prod", lambda x: lax.reduce_prod(x, (0,)), args_of(positive(X)), lambda x: x.prod(0)),
    ("reduce_prod_3d", lambda x: lax.reduce_prod(x, (0, 2)), args_of(ints((2, 3, 2), -3, 4)),
     lambda x: x.prod((0, 2), dtype=np.int32)),
    # sources and markers inside the function
    ("iota", lambda x: x + lax.broadcasted_iota(jnp.int32, x.shape, 1), args_of(ints(X)),
     lambda x: x + np.arange(4, dtype=np.int32)),
    ("const", lambda x: lax.mul(x, lax.full(x.shape, 2.5)), args_of(normal(X)), lambda x: x * 2.5),
    ("closed_over_buffer", lambda x: lax.mul(x, CLOSED), args_of(normal(X)), lambda x: x * CLOSED),
    ("contiguous", lambda x: lax.add(lax.optimization_barrier(lax.mul(x, x)), x), args_of(normal(X)),
     lambda x: x * x + x),
    ("detach", lambda x: lax.mul(lax.stop_gradient(x), x), args_of(normal(X)), lambda x: x * x),
]
CASE_IDS = [c[0] for c in PRIMITIVES]


def _ranks(case) -> tuple[list[int], int]:
    """The example arguments' ranks and the output's rank."""
    _, fn, make, _ = case
    args = make(np.random.default_rng(0))
    return [np.ndim(a) for a in args], np.ndim(fn(*args))


def _axis_choices(rank: int) -> list:
    """Batch axes valid for a batched array of rank `rank` + 1, as an in_axes or out_axes entry."""
    return [a for a in (0, 1, -1) if -(rank + 1) <= a <= rank]


@pytest.mark.parametrize("case", PRIMITIVES, ids=CASE_IDS)
@given(data=st.data())
def test_primitive_batched_along_any_axes(case, data):
    name, fn, make, reference = case
    arg_ranks, out_rank = _ranks(case)
    in_axes = [data.draw(st.sampled_from([None] + _axis_choices(r)), label="in_axis") for r in arg_ranks]
    if all(ax is None for ax in in_axes):
        in_axes[data.draw(st.integers(0, len(in_axes) - 1))] = data.draw(st.sampled_from(_axis_choices(arg_ranks[0])))
    out_axes = data.draw(st.sampled_from(_axis_choices(out_rank)), label="out_axes")
    size = data.draw(st.sampled_from([1, 3]), label="size")
    rng = np.random.default_rng(data.draw(st.integers(0, 2**32 - 1), label="seed"))
    check_vmap(fn, batch(make, in_axes, size, rng), in_axes, out_axes, reference)


@pytest.mark.parametrize("case", PRIMITIVES, ids=CASE_IDS)
def test_primitive_all_batched_on_each_device(case, device):
    name, fn, make, reference = case
    in_axes = [0] * len(make(np.random.default_rng(0)))
    check_vmap(fn, batch(make, in_axes, 2, np.random.default_rng(1)), in_axes, 0, reference)


def test_every_primitive_has_a_batching_rule():
    # FUNCTION, TUPLE and GETTUPLE are the graph's structure, read by the traversal itself
    assert set(batch_rules) == GroupOp.Primitives - {Ops.FUNCTION, Ops.TUPLE, Ops.GETTUPLE}


def test_primitive_table_reaches_every_array_primitive():
    """The cases above put every primitive with array semantics in front of the batcher."""
    seen = set()
    for _, fn, make, _ in PRIMITIVES:
        args = make(np.random.default_rng(0))
        traced = trace(fn, tuple(args), transform=True, abstract=True)
        seen |= {u.op for u in traced.body.toposort}
    # control flow: see its own tests; collectives need a named axis: test_collectives_over_a_vmapped_axis
    want = GroupOp.Primitives - GroupOp.Call - GroupOp.Control - {Ops.COPY, Ops.COLLECTIVE}
    assert want <= seen, want - seen


# ---- outputs that do not depend on the batch ----

@pytest.mark.parametrize("out_axes", [0, 1, -1])
def test_unbatched_output_is_broadcast(out_axes):
    xs = np.arange(6.0, dtype=np.float32).reshape(3, 2)
    out = fnx.vmap(lambda x: (x * 2, lax.iota(jnp.int32, 4).reshape(2, 2)), out_axes=(0, out_axes))(xs)
    np.testing.assert_array_equal(out[0], xs * 2)
    np.testing.assert_array_equal(out[1], np.stack([np.arange(4).reshape(2, 2)] * 3, axis=out_axes))


def test_out_axes_none_keeps_an_unbatched_output():
    xs, w = np.ones((3, 2), np.float32), np.arange(2.0, dtype=np.float32)
    ys, wsum = fnx.vmap(lambda x, w: (x @ w, w.sum()), in_axes=(0, None), out_axes=(0, None))(xs, w)
    np.testing.assert_allclose(ys, xs @ w)
    assert np.shape(wsum) == () and float(wsum) == 1.0


def test_constant_output_and_python_scalar_output():
    out = fnx.vmap(lambda x: (jnp.zeros(2), 3.0))(np.ones((4, 5), np.float32))
    np.testing.assert_array_equal(out[0], np.zeros((4, 2)))
    np.testing.assert_array_equal(out[1], np.full(4, 3.0))


def test_identity_with_negative_in_and_out_axes():
    xs = np.arange(24.0, dtype=np.float32).reshape(2, 3, 4)
    np.testing.assert_array_equal(fnx.vmap(lambda x: x, in_axes=-1, out_axes=-1)(xs), xs)
    np.testing.assert_array_equal(fnx.vmap(lambda x: x, in_axes=-1, out_axes=0)(xs), np.moveaxis(xs, -1, 0))
    np.testing.assert_array_equal(fnx.vmap(lambda x: x, in_axes=1, out_axes=2)(xs), np.moveaxis(xs, 1, 2))


# ---- nesting and composition with the other transforms ----

def test_nested_vmap_two_levels_is_an_outer_product():
    xs, ys = np.arange(3.0, dtype=np.float32), np.arange(4.0, dtype=np.float32) + 1
    out = fnx.vmap(fnx.vmap(jnp.multiply, in_axes=(None, 0)), in_axes=(0, None))(xs, ys)
    np.testing.assert_array_equal(out, np.outer(xs, ys))


def test_nested_vmap_two_levels_matrix_vector_with_mixed_axes():
    a = np.random.default_rng(0).standard_normal((4, 3, 5)).astype(np.float32)   # batched along axis 1 outside
    v = np.random.default_rng(1).standard_normal((5, 2)).astype(np.float32)      # batched along axis 1 inside
    inner = fnx.vmap(lambda m, x: m @ x, in_axes=(None, 1), out_axes=1)           # (4, 5), (5, 2) -> (4, 2)
    out = fnx.vmap(inner, in_axes=(1, None), out_axes=-1)(a, v)                    # -> (4, 2, 3)
    np.testing.assert_allclose(out, np.einsum("ibk,kj->ijb", a, v), rtol=1e-5, atol=1e-5)


def test_nested_vmap_three_levels():
    rng = np.random.default_rng(2)
    x, y, z = (rng.standard_normal(s).astype(np.float32) for s in ((3, 2), (4, 3), (3, 5)))
    f = lambda a, b, c: (a * b) @ c  # noqa: E731   (3,), (3,), (3,) -> ()
    g = fnx.vmap(fnx.vmap(fnx.vmap(f, in_axes=(None, None, -1)), in_axes=(None, 0, None), out_axes=1),
                 in_axes=(1, None, None))
    out = g(x, y, z)                                   # (2, 5, 4): the middle level's axis placed last
    np.testing.assert_allclose(out, np.einsum("ki,jk,kl->ilj", x, y, z), rtol=1e-5, atol=1e-5)


def test_nested_vmap_inner_closes_over_outer_batched_value():
    xs, ys = np.arange(3.0, dtype=np.float32), np.arange(4.0, dtype=np.float32)
    out = fnx.vmap(lambda x: fnx.vmap(lambda y: jnp.sin(x) * y)(ys))(xs)
    np.testing.assert_allclose(out, np.sin(xs)[:, None] * ys, rtol=1e-6)


def test_vmap_traces_the_function_once_not_once_per_example():
    calls = []

    def f(x):
        calls.append(1)
        return x * 2
    fnx.vmap(f)(np.ones((7, 3), np.float32))
    assert len(calls) == 1


def test_vmap_of_jit_and_jit_of_vmap():
    rng = np.random.default_rng(3)
    xs, w = rng.standard_normal((5, 3)).astype(np.float32), rng.standard_normal((3, 2)).astype(np.float32)
    f = lambda x, w: jnp.tanh(x @ w).sum()  # noqa: E731
    expected = np.tanh(xs @ w).sum(-1)
    jitted_f = fnx.jit(f)
    vmap_of_jit = fnx.vmap(jitted_f, in_axes=(0, None))
    jit_of_vmap = fnx.jit(fnx.vmap(f, in_axes=(0, None)))
    np.testing.assert_allclose(vmap_of_jit(xs, w), expected, rtol=1e-5)
    np.testing.assert_allclose(jit_of_vmap(xs, w), expected, rtol=1e-5)
    np.testing.assert_allclose(jit_of_vmap(xs + 1, w), np.tanh((xs + 1) @ w).sum(-1), rtol=1e-5)
    assert jit_of_vmap.trace_count() == 1          # same shapes: no retrace
    jit_of_vmap(xs[:2], w)
    assert jit_of_vmap.trace_count() == 2          # a new batch size is a new signature
    assert jitted_f.trace_count() == 0             # a jit inside vmap is inlined into vmap's trace


def _linear_loss(w, x, y):
    return jnp.mean((x @ w["W"] + w["b"] - y) ** 2)


def _mlp_loss(params, x, y):
    h = jnp.tanh(x @ params["w1"] + params["b1"])
    logits = h @ params["w2"] + params["b2"]
    return -jnp.sum(fnx.nn.log_softmax(logits) * y)


def _models():
    rng = np.random.default_rng(4)
    f32 = lambda *s: rng.standard_normal(s).astype(np.float32)  # noqa: E731
    linear = ({"W": f32(3, 2), "b": f32(2)}, f32(6, 3), f32(6, 2), _linear_loss)
    labels = np.eye(3, dtype=np.float32)[rng.integers(0, 3, 6)]
    mlp = ({"w1": f32(4, 5), "b1": f32(5), "w2": f32(5, 3), "b2": f32(3)}, f32(6, 4), labels, _mlp_loss)
    return {"linear": linear, "mlp": mlp}


@pytest.mark.parametrize("model", ["linear", "mlp"])
def test_per_example_gradients_equal_a_loop_of_grads(model):
    params, xs, ys, loss = _models()[model]
    per_example = fnx.vmap(fnx.grad(loss), in_axes=(None, 0, 0))(params, xs, ys)
    loop = [fnx.grad(loss)(params, x, y) for x, y in zip(xs, ys)]
    expected = tree_util.tree_map(lambda *g: np.stack([np.asarray(v) for v in g]), *loop)
    assert_tree_close(per_example, expected, rtol=1e-5, atol=1e-6)
    jitted = fnx.jit(fnx.vmap(fnx.grad(loss), in_axes=(None, 0, 0)))(params, xs, ys)
    assert_tree_close(jitted, expected, rtol=1e-5, atol=1e-6)
    # the mean of the per-example gradients is the gradient of the mean loss, by grad of vmap
    mean_loss = lambda p: jnp.mean(fnx.vmap(loss, in_axes=(None, 0, 0))(p, xs, ys))  # noqa: E731
    assert_tree_close(fnx.grad(mean_loss)(params), tree_util.tree_map(lambda g: g.mean(0), expected),
                      rtol=1e-5, atol=1e-6)


def test_linear_model_per_example_gradients_against_closed_form():
    params, xs, ys, _ = _models()["linear"]
    g = fnx.vmap(fnx.grad(_linear_loss), in_axes=(None, 0, 0))(params, xs, ys)
    residual = xs @ params["W"] + params["b"] - ys                       # (6, 2)
    np.testing.assert_allclose(g["b"], residual, rtol=1e-5, atol=1e-6)  # d mean(r^2)/db over 2 outputs
    np.testing.assert_allclose(g["W"], xs[:, :, None] * residual[:, None, :], rtol=1e-5, atol=1e-6)


def test_jacobians_of_a_vmapped_function():
    xs = np.random.default_rng(5).standard_normal((3, 2)).astype(np.float32)
    g = lambda x: jnp.sin(x) * jnp.sum(x ** 2)  # noqa: E731
    per = [np.asarray(fnx.jacfwd(g)(x)) for x in xs]
    block_diagonal = np.zeros((3, 2, 3, 2), np.float32)
    for i, j in enumerate(per): block_diagonal[i, :, i, :] = j
    np.testing.assert_allclose(fnx.jacfwd(fnx.vmap(g))(xs), block_diagonal, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(fnx.jacrev(fnx.vmap(g))(xs), block_diagonal, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(fnx.vmap(fnx.jacrev(g))(xs), np.stack(per), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(fnx.vmap(fnx.jacfwd(g))(xs), np.stack(per), rtol=1e-5, atol=1e-6)


def test_hessian_per_example():
    xs = np.random.default_rng(6).standard_normal((4, 3)).astype(np.float32)
    f = lambda x: jnp.sum(x ** 3)  # noqa: E731
    out = fnx.vmap(fnx.hessian(f))(xs)
    np.testing.assert_allclose(out, np.stack([np.diag(6 * x) for x in xs]), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("fn, derivative", [(jnp.tanh, lambda x: 1 - np.tanh(x) ** 2), (jnp.exp, np.exp)],
                         ids=["tanh", "exp"])
def test_vmap_of_library_custom_jvp_functions(fn, derivative):
    xs = np.random.default_rng(7).standard_normal((3, 4)).astype(np.float32)
    np.testing.assert_allclose(fnx.vmap(fn)(xs), fn(xs), rtol=1e-6)
    np.testing.assert_allclose(fnx.vmap(fnx.grad(lambda x: fn(x).sum()))(xs), derivative(xs), rtol=1e-5)
    np.testing.assert_allclose(fnx.grad(lambda x: fnx.vmap(fn)(x).sum())(xs), derivative(xs), rtol=1e-5)
    _, tangent = fnx.jvp(fnx.vmap(fn), (xs,), (np.ones_like(xs),))
    np.testing.assert_allclose(tangent, derivative(xs), rtol=1e-5)


@fnx.custom_jvp
def _doubled_derivative(x):
    """The identity, whose custom derivative is 2: a derivative through the body would give 1."""
    return x


@_doubled_derivative.defjvp
def _doubled_derivative_jvp(primals, tangents):
    return primals[0], 2.0 * tangents[0]


def test_vmap_keeps_a_custom_jvp_rule():
    xs = np.arange(6.0, dtype=np.float32).reshape(3, 2)
    np.testing.assert_array_equal(fnx.vmap(_doubled_derivative)(xs), xs)
    np.testing.assert_array_equal(fnx.vmap(fnx.grad(lambda x: _doubled_derivative(x).sum()))(xs), np.full((3, 2), 2.0))
    np.testing.assert_array_equal(fnx.grad(lambda x: fnx.vmap(_doubled_derivative)(x).sum())(xs), np.full((3, 2), 2.0))
    _, tangent = fnx.jvp(fnx.vmap(_doubled_derivative), (xs,), (np.ones_like(xs),))
    np.testing.assert_array_equal(tangent, np.full((3, 2), 2.0))


@fnx.custom_vjp
def _clipped_gradient(x):
    return jnp.sin(x)


_clipped_gradient.defvjp(lambda x: (jnp.sin(x), x), lambda x, g: (jnp.clip(g * jnp.cos(x), -0.5, 0.5),))


def test_vmap_of_custom_vjp():
    xs = np.linspace(-3, 3, 8, dtype=np.float32).reshape(4, 2)
    expected = np.clip(np.cos(xs), -0.5, 0.5)
    np.testing.assert_allclose(fnx.vmap(_clipped_gradient)(xs), np.sin(xs), rtol=1e-6)
    np.testing.assert_allclose(fnx.vmap(fnx.grad(lambda x: _clipped_gradient(x).sum()))(xs), expected, rtol=1e-5)
    np.testing.assert_allclose(fnx.grad(lambda x: fnx.vmap(_clipped_gradient)(x).sum())(xs), expected, rtol=1e-5)


def test_vmap_of_checkpoint():
    xs = np.random.default_rng(8).standard_normal((3, 4)).astype(np.float32)
    f = fnx.checkpoint(lambda x: jnp.sin(jnp.sin(x)))
    np.testing.assert_allclose(fnx.vmap(f)(xs), np.sin(np.sin(xs)), rtol=1e-6)
    want = np.cos(np.sin(xs)) * np.cos(xs)
    np.testing.assert_allclose(fnx.vmap(fnx.grad(lambda x: f(x).sum()))(xs), want, rtol=1e-5)
    np.testing.assert_allclose(fnx.grad(lambda x: fnx.vmap(f)(x).sum())(xs), want, rtol=1e-5)


def test_vmap_of_checkpoint_closing_over_the_batched_value():
    xs = np.arange(6.0, dtype=np.float32).reshape(3, 2)
    out = fnx.vmap(lambda x: fnx.checkpoint(lambda y: y * x)(jnp.ones(2)))(xs)
    np.testing.assert_array_equal(out, xs)


def test_vmap_of_custom_jvp_closing_over_the_batched_value():
    xs = np.arange(6.0, dtype=np.float32).reshape(3, 2)

    def f(x):
        @fnx.custom_jvp
        def scaled(y):
            return y * x
        scaled.defjvp(lambda primals, tangents: (primals[0] * x, tangents[0] * x))
        return scaled(jnp.ones(2))
    np.testing.assert_array_equal(fnx.vmap(f)(xs), xs)


def test_vmap_of_forward_and_reverse_mode_transforms():
    xs = np.random.default_rng(11).standard_normal((3, 2)).astype(np.float32)
    primal, tangent = fnx.vmap(lambda x, t: fnx.jvp(jnp.sin, (x,), (t,)))(xs, np.full_like(xs, 2.0))
    np.testing.assert_allclose(primal, np.sin(xs), rtol=1e-6)
    np.testing.assert_allclose(tangent, 2 * np.cos(xs), rtol=1e-5)
    (pulled,) = fnx.vmap(lambda x: fnx.vjp(jnp.sin, x)[1](jnp.ones(2)))(xs)
    np.testing.assert_allclose(pulled, np.cos(xs), rtol=1e-5)
    np.testing.assert_allclose(fnx.vmap(lambda x: fnx.linearize(jnp.sin, x)[1](x))(xs), np.cos(xs) * xs, rtol=1e-5)


def test_vmap_over_random_keys_matches_a_loop():
    keys = fnx.random.split(fnx.random.PRNGKey(0), 3)
    out = fnx.vmap(lambda k: fnx.random.normal(k, (2,)))(keys)
    np.testing.assert_array_equal(out, np.stack([fnx.random.normal(k, (2,)) for k in keys]))


def test_empty_batch():
    assert fnx.vmap(jnp.sin)(np.ones((0, 3), np.float32)).shape == (0, 3)
    assert fnx.vmap(lambda x: x.sum(), in_axes=1)(np.ones((3, 0), np.float32)).shape == (0,)


def test_inner_out_axes_none_for_a_value_batched_only_outside():
    xs = np.arange(6.0, dtype=np.float32).reshape(3, 2)
    out = fnx.vmap(lambda x: fnx.vmap(lambda y: x * 2, out_axes=None)(jnp.ones(4)))(xs)
    np.testing.assert_array_equal(out, xs * 2)


def test_vmap_of_custom_jvp_with_batched_and_unbatched_arguments():
    xs, w = np.random.default_rng(9).standard_normal((3, 4)).astype(np.float32), np.float32(0.5)
    out = fnx.vmap(lambda x, s: jnp.tanh(x * s), in_axes=(0, None))(xs, w)
    np.testing.assert_allclose(out, np.tanh(xs * w), rtol=1e-6)
    out = fnx.vmap(lambda x, s: jnp.tanh(x * s), in_axes=(None, 0))(xs[0], np.arange(3.0, dtype=np.float32))
    np.testing.assert_allclose(out, np.tanh(xs[0] * np.arange(3.0)[:, None]), rtol=1e-6)


def test_against_jax_vmap():
    jax = pytest.importorskip("jax")
    rng = np.random.default_rng(10)
    x, m, idx = rng.standard_normal((3, 4, 5)).astype(np.float32), rng.standard_normal((5, 2)).astype(np.float32), \
        rng.integers(0, 4, (2, 5))

    def f(np_):
        return lambda a, b, i: (np_.tanh(a @ b).sum(0), np_.take_along_axis(a, i, axis=0), np_.cumsum(a, axis=-1))

    for in_axes, out_axes in [((0, None, None), 0), ((1, None, 0), (1, 0, -1)), ((-1, 1, None), -1)]:
        xa = np.moveaxis(x, 0, in_axes[0])
        ma = m if in_axes[1] is None else np.stack([m, m * 2, -m], axis=in_axes[1])
        ia = idx if in_axes[2] is None else np.stack([idx, 3 - idx, idx], axis=in_axes[2])
        ours = fnx.vmap(f(jnp), in_axes, out_axes)(xa, ma, ia)
        theirs = jax.vmap(f(jax.numpy), in_axes, out_axes)(xa, ma, ia)
        assert_tree_close(ours, tuple(np.asarray(t) for t in theirs), rtol=1e-5, atol=1e-5)


# ---- pytrees in and out ----

def test_dict_argument_with_an_in_axes_prefix():
    xs = np.arange(6.0, dtype=np.float32).reshape(3, 2)
    b = np.array([10.0, 20.0], np.float32)
    out = fnx.vmap(lambda d: d["a"] + d["b"], in_axes=({"a": 0, "b": None},))({"a": xs, "b": b})
    np.testing.assert_array_equal(out, xs + b)


def test_nested_pytrees_in_and_out():
    xs = np.arange(6.0, dtype=np.float32).reshape(3, 2)
    ys = np.arange(6.0, dtype=np.float32).reshape(2, 3)    # batched along axis 1
    args = ({"x": xs, "pair": (ys, 2.0)}, [np.float32(1.5)])

    def f(tree, scale):
        y, c = tree["pair"]
        return {"sum": tree["x"].sum() * scale[0], "cols": [y * c, tree["x"]]}
    in_axes = ({"x": 0, "pair": (1, None)}, [None])
    out_axes = {"sum": 0, "cols": [1, 0]}
    out = fnx.vmap(f, in_axes=in_axes, out_axes=out_axes)(*args)
    assert set(out) == {"sum", "cols"} and isinstance(out["cols"], list)
    np.testing.assert_array_equal(out["sum"], xs.sum(1) * 1.5)
    np.testing.assert_array_equal(out["cols"][0], ys * 2.0)   # batched along axis 1 back out along axis 1
    np.testing.assert_array_equal(out["cols"][1], xs)


def test_in_axes_as_a_list_and_a_prefix_for_a_whole_subtree():
    xs = np.arange(6.0, dtype=np.float32).reshape(3, 2)
    tree = {"a": xs, "b": xs * 2}
    out = fnx.vmap(lambda t, s: (t["a"] + t["b"]) * s, in_axes=[0, None])(tree, np.float32(2.0))
    np.testing.assert_array_equal(out, (xs * 3) * 2)
    out = fnx.vmap(lambda t: t["a"] - t["b"], in_axes=(1,))(tree)
    np.testing.assert_array_equal(out, (xs - xs * 2).T)


def test_out_axes_prefix_for_a_tuple_output():
    xs = np.arange(6.0, dtype=np.float32).reshape(3, 2)
    a, b = fnx.vmap(lambda x: (x, x * 2), out_axes=1)(xs)
    np.testing.assert_array_equal(a, xs.T)
    np.testing.assert_array_equal(b, 2 * xs.T)


def test_mixed_python_scalars_and_arrays():
    xs = np.arange(3.0, dtype=np.float32)
    out = fnx.vmap(lambda x, s: x * s, in_axes=(0, None))(xs, 2)
    assert out.dtype == np.float32
    np.testing.assert_array_equal(out, xs * 2)


# ---- errors ----

def test_inconsistent_batch_sizes_name_the_arguments_and_sizes():
    with pytest.raises(ValueError, match=r"argument 0 .*size 2.*argument 1 .*size 3"):
        fnx.vmap(jnp.add)(np.ones((2, 4)), np.ones((3, 4)))
    with pytest.raises(ValueError, match=r"size 4.*size 3"):
        fnx.vmap(jnp.add, in_axes=(1, 0))(np.ones((3, 4)), np.ones((3, 4)))
    with pytest.raises(ValueError, match="axis_size=5"):
        fnx.vmap(jnp.sin, axis_size=5)(np.ones((3, 4)))


@pytest.mark.parametrize("in_axes", [2, -3, (0, 5)])
def test_in_axes_out_of_range(in_axes):
    with pytest.raises(ValueError, match="out of range"):
        fnx.vmap(jnp.add, in_axes=in_axes)(np.ones((3, 4)), np.ones((3, 4)))


def test_in_axes_for_a_scalar_argument_is_out_of_range():
    with pytest.raises(ValueError, match="out of range"):
        fnx.vmap(jnp.sin)(1.0)


@pytest.mark.parametrize("in_axes", [(0,), (0, 0, 0), ({"a": 0},), ([0, 0],)])
def test_in_axes_structure_mismatch(in_axes):
    with pytest.raises(ValueError, match="in_axes"):
        fnx.vmap(lambda x, y: x[0] + y, in_axes=in_axes)((np.ones(3), np.ones(3)), np.ones(3))


def test_out_axes_structure_mismatch():
    with pytest.raises(ValueError, match="out_axes"):
        fnx.vmap(lambda x: (x, x), out_axes=(0, 0, 0))(np.ones(3))


def test_out_axes_out_of_range():
    with pytest.raises(ValueError, match="out_axes"):
        fnx.vmap(lambda x: x, out_axes=2)(np.ones((3, 4)))


def test_all_in_axes_none_needs_axis_size():
    with pytest.raises(ValueError, match="axis_size"):
        fnx.vmap(jnp.sin, in_axes=None)(np.ones(3))
    out = fnx.vmap(lambda x: x * 2, in_axes=None, axis_size=4)(np.arange(3.0, dtype=np.float32))
    np.testing.assert_array_equal(out, np.tile(np.arange(3.0) * 2, (4, 1)))
    out = fnx.vmap(lambda x: x, in_axes=0, axis_size=3)(np.arange(3.0, dtype=np.float32))
    np.testing.assert_array_equal(out, np.arange(3.0))
    out = fnx.vmap(lambda: jnp.ones(2), axis_size=3)()
    np.testing.assert_array_equal(out, np.ones((3, 2)))


def test_out_axes_none_for_a_batched_output_raises():
    with pytest.raises(ValueError, match="out_axes=None"):
        fnx.vmap(lambda x: x * 2, out_axes=None)(np.ones((3, 2)))


def test_python_control_flow_on_a_batched_value_raises():
    def f(x):
        return x if x.sum() > 0 else -x
    with pytest.raises(ConcretizationError):
        fnx.vmap(f)(np.ones((3, 2)))
    with pytest.raises(ConcretizationError):
        fnx.vmap(lambda x: float(x))(np.ones(3))
    with pytest.raises(ConcretizationError):
        fnx.vmap(lambda x, y: x if y > 0 else -x, in_axes=(None, 0))(np.ones(2), np.ones(3))


def test_an_op_error_inside_vmap_names_the_op_and_the_users_line():
    with pytest.raises(TypeError, match=r"matmul.*4 != 5.*\n.*test_vmap.py"):
        fnx.vmap(lambda x, y: x @ y)(np.ones((2, 4)), np.ones((2, 5)))


def test_dtypes_and_weak_types_survive():
    xs = np.arange(6, dtype=np.int8).reshape(3, 2)
    out = fnx.vmap(lambda x: x + 1)(xs)
    assert out.dtype == np.int8
    assert fnx.vmap(lambda x: x * 2.0)(np.ones((3, 2), jnp.float16)).dtype == dtypes.float16.np


# ---- collectives over a vmapped axis_name ----

COLLECTIVE_CASES = [
    ("psum", lambda x: x / fnx.lax.psum(x, "i"), lambda xs: xs / xs.sum(0)),
    ("pmean", lambda x: x - fnx.lax.pmean(x, "i"), lambda xs: xs - xs.mean(0)),
    ("pmax", lambda x: fnx.lax.pmax(x, "i") * x, lambda xs: xs.max(0) * xs),
    ("pmin", lambda x: fnx.lax.pmin(x, "i") + x, lambda xs: xs.min(0) + xs),
    ("all_gather", lambda x: fnx.lax.all_gather(x, "i").sum(0) * x, lambda xs: xs.sum(0) * xs),
    ("axis_index", lambda x: x + fnx.lax.axis_index("i").astype(np.float32),
     lambda xs: xs + np.arange(len(xs), dtype=np.float32)[:, None]),
]


@pytest.mark.parametrize("name,fn,ref", COLLECTIVE_CASES, ids=[c[0] for c in COLLECTIVE_CASES])
def test_collectives_over_a_vmapped_axis(name, fn, ref):
    xs = np.random.default_rng(3).standard_normal((4, 3)).astype(np.float32)
    np.testing.assert_allclose(np.asarray(fnx.vmap(fn, axis_name="i")(xs)), ref(xs), rtol=1e-5, atol=1e-6)
    jitted = fnx.jit(fnx.vmap(fn, axis_name="i"))
    np.testing.assert_allclose(np.asarray(jitted(xs)), ref(xs), rtol=1e-5, atol=1e-6)
    # gradients through the collective equal those of the same computation written on the whole batch
    loss = lambda a: (fnx.vmap(fn, axis_name="i")(a) ** 2).sum()  # noqa: E731
    whole = lambda a: (ref_fnx(name)(a) ** 2).sum()  # noqa: E731
    np.testing.assert_allclose(np.asarray(fnx.grad(loss)(xs)), np.asarray(fnx.grad(whole)(xs)), rtol=1e-4, atol=1e-5)


def ref_fnx(name):
    """The collective computation written on the whole batch with fnx.numpy (a differentiable oracle)."""
    return {"psum": lambda a: a / a.sum(0), "pmean": lambda a: a - a.mean(0), "pmax": lambda a: a.max(0) * a,
            "pmin": lambda a: a.min(0) + a, "all_gather": lambda a: a.sum(0) * a,
            "axis_index": lambda a: a + jnp.arange(a.shape[0], dtype=jnp.float32)[:, None]}[name]


def test_nested_collectives_name_their_own_axis():
    xs = np.arange(6.0, dtype=np.float32).reshape(2, 3)
    f = fnx.vmap(fnx.vmap(lambda x: fnx.lax.psum(x, "i") + 100 * fnx.lax.psum(x, "j"), axis_name="j"), axis_name="i")
    np.testing.assert_allclose(np.asarray(f(xs)), xs.sum(0)[None, :] + 100 * xs.sum(1)[:, None])


def test_collective_outside_its_vmap_raises():
    with pytest.raises(NameError, match="unbound axis name"):
        fnx.lax.psum(np.ones(3, np.float32), "nope")
