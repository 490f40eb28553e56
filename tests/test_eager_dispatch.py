"""Eager calls of the functions JAX jits (the elementwise ufuncs, the reductions, where, clip, matmul) run as jit of
themselves: a second call on other values of the same shapes traces nothing, Python numbers are weakly typed
arguments, and the results are those of the op-by-op path, checked against numpy in float64. Where a Python
number meets an integer or 16-bit float array the call stays op by op (its constant converts straight from the
Python value), and the results say so.
"""
import threading

import numpy as np
import pytest

import fnx
import fnx.numpy as jnp
from fnx import events

rng = np.random.default_rng(17)


def traces_of(fn, cats=("trace",)):
    """(fn's result, the names of the traces (or other events of `cats`) it started)."""
    names = []
    stop = events.listen(lambda e: names.append(e.name) if e.cat in cats else None)
    try:
        return fn(), names
    finally:
        stop()


def calls(x, y, m, s):
    """One eager call of each function, on arrays x, y (float32, (4, 11, 6)), mask m and Python float s."""
    return [x * s, s - x, x / y, jnp.sum(x, axis=1), x.mean(-1), jnp.max(x, axis=(0, 2), keepdims=True),
            jnp.argmax(x, axis=2), x.var(0, ddof=1), jnp.sum(x, where=m), jnp.where(m, x, s), jnp.clip(x, -s, s),
            jnp.cumsum(x, axis=1), x @ jnp.swapaxes(y, 1, 2), jnp.prod(x, axis=0, initial=s), jnp.any(m, axis=0)]


def want(x, y, m, s):
    x, y = x.astype(np.float64), y.astype(np.float64)
    return [x * s, s - x, x / y, x.sum(1), x.mean(-1), x.max((0, 2), keepdims=True), x.argmax(2), x.var(0, ddof=1),
            np.where(m, x, 0).sum(), np.where(m, x, s), np.clip(x, -s, s), np.cumsum(x, 1),
            x @ np.swapaxes(y, 1, 2), x.prod(0) * s, m.any(0)]


def test_a_second_call_of_each_traces_nothing_and_matches_numpy():
    shape = (4, 11, 6)  # (a shape no other test uses)
    first_args = [rng.standard_normal(shape).astype(np.float32) for _ in range(2)] + [rng.random(shape) > 0.5, 0.75]
    second_args = [rng.standard_normal(shape).astype(np.float32) for _ in range(2)] + [rng.random(shape) > 0.5, 1.25]

    def run(args):
        x, y, m, s = args
        return [np.asarray(r) for r in calls(jnp.asarray(x), jnp.asarray(y), jnp.asarray(m), s)]
    _, first = traces_of(lambda: run(first_args))
    assert {"multiply", "sum", "mean", "max", "argmax", "var", "_select", "clip", "cumsum", "matmul"} <= set(first)
    got, second = traces_of(lambda: run(second_args))
    assert second == []
    for i, (g, w) in enumerate(zip(got, want(*second_args))):
        assert g.shape == w.shape, i
        if w.dtype == bool or w.dtype.kind == "i":
            np.testing.assert_array_equal(g, w, err_msg=str(i))
        else:
            assert g.dtype == np.float32, (i, g.dtype)
            np.testing.assert_allclose(g, w, rtol=2e-5, atol=2e-6, err_msg=str(i))


def test_weak_types_and_dtypes_are_the_op_by_op_ones():
    """A Python number stays weakly typed through the jit: float32 * 2.0 is float32, a float64 array (x64 on) *
    2.0 float64, 2.0 * 3 a weak float32 scalar; a reduction is strongly typed, as in JAX."""
    x = jnp.asarray(np.arange(6, dtype=np.float32))
    for r in (x * 2.0, 2.0 * x, x + True, jnp.where(x > 2, x, 0.5)):
        assert r.dtype == np.float32 and not r.weak_type
    with fnx.enable_x64(True):
        w = jnp.asarray(np.arange(6, dtype=np.float64))
        assert (w * 2.0).dtype == np.float64 and float((w * 0.1)[3]) == 3 * 0.1
    s = jnp.multiply(2.0, 3)
    assert s.dtype == np.float32 and s.weak_type and float(s) == 6.0
    total = jnp.sum(jnp.asarray(np.ones(4, np.float32)))
    assert not total.weak_type and float(total) == 4.0
    with fnx.disable_jit():  # (op by op, the same results)
        np.testing.assert_array_equal(np.asarray(x * 2.0), np.arange(6) * 2.0)


def test_numbers_that_meet_narrow_arrays_stay_op_by_op():
    """float16 times 1 + 2**-11 + 2**-40: the constant rounds once from the double (1.001), not through the weak
    argument's float32 (1.0, a tie rounded to even); an int8 array plus 300 wraps as the op-by-op path (and JAX)
    does; neither call is a jit trace."""
    v = 1 + 2 ** -11 + 2 ** -40
    h = jnp.asarray(np.ones(3, np.float16))
    i8 = jnp.asarray(np.arange(4, dtype=np.int8))
    (product, wrapped, chosen), names = traces_of(lambda: (h * v, i8 + 300, jnp.where(i8 > 1, i8, 100)))
    assert names == []
    np.testing.assert_array_equal(np.asarray(product), np.full(3, np.float16(v)))
    assert np.float16(v) != np.float16(np.float32(v))  # (the case is the one it claims to be)
    np.testing.assert_array_equal(np.asarray(wrapped), (np.arange(4) + 300).astype(np.int8))
    np.testing.assert_array_equal(np.asarray(chosen), [100, 100, 2, 3])
    assert np.asarray(chosen).dtype == np.int8


def test_python_numbers_of_every_value_share_one_program_and_keep_their_sign():
    x = jnp.asarray(rng.standard_normal(9).astype(np.float32))
    _, first = traces_of(lambda: np.asarray(x * 1.5))
    values = [0.0, -0.0, 1e-40, np.inf, -np.inf, 3.0, 2 ** 31 - 1, -7]
    results, names = traces_of(lambda: [np.asarray(x * v) for v in values if type(v) is float] +
                                       [np.asarray(x + v) for v in values if type(v) is int])
    assert "multiply" in first and names == ["add"]  # (ints are another signature: one trace for both)
    xs = np.asarray(x).astype(np.float64)
    for got, v in zip(results, [v for v in values if type(v) is float] + [v for v in values if type(v) is int]):
        expected = (xs * np.float32(v) if type(v) is float else xs + np.float32(v)).astype(np.float32)
        np.testing.assert_array_equal(got, expected)
    assert np.all(np.signbit(np.asarray(jnp.abs(x) * -0.0)))  # (-0.0 is not 0.0's cached buffer)


def test_wrong_calls_raise_the_functions_errors():
    x = jnp.asarray(np.ones((2, 3), np.float32))
    with pytest.raises(TypeError):
        jnp.sum(x, axis=0, bogus=1)
    with pytest.raises(TypeError):
        jnp.sum()
    with pytest.raises(ValueError, match="max"):
        jnp.max(jnp.asarray(np.ones((0, 3), np.float32)), axis=0)
    with pytest.raises(ValueError, match=r"axis(.|\n)*at .*test_eager_dispatch.py"):  # (the user's line)
        jnp.sum(x, axis=2)
    with pytest.raises(ValueError, match="where"):
        jnp.where(x > 0, x)
    with pytest.raises(TypeError, match=r"matmul: contracting dimensions differ(.|\n)*test_eager_dispatch.py"):
        x @ x


def test_eager_calls_from_several_threads():
    """Eight threads call the same functions on their own values at once (the first calls race to trace and
    cache them): each gets its own answer."""
    shape = (3, 5, 7)
    data = [[rng.standard_normal(shape).astype(np.float32) for _ in range(2)] + [rng.random(shape) > 0.5, 0.5 + i]
            for i in range(8)]
    results: list = [None] * 8
    barrier = threading.Barrier(8)

    def work(i):
        barrier.wait()
        x, y, m, s = data[i]
        results[i] = [np.asarray(r) for r in calls(jnp.asarray(x), jnp.asarray(y), jnp.asarray(m), s)]
    threads = [threading.Thread(target=work, args=(i,)) for i in range(8)]
    for t in threads: t.start()
    for t in threads: t.join()
    for i in range(8):
        for got, w in zip(results[i], want(*data[i])):
            np.testing.assert_allclose(got, w, rtol=2e-5, atol=2e-6)


def test_a_float64_array_with_x64_off_keeps_a_python_floats_bits():
    """With x64 off a weak float is float32, so a float64 array (fnx's own wide intermediates: nn's erfc) times
    0.1 stays op by op and multiplies by the double 0.1, not by float32(0.1) (erfc lost 5 ulp so)."""
    assert not fnx.config.jax_enable_x64
    wide = jnp.asarray(np.ones(3, np.float32)).astype(fnx.dtypes.float64)
    got = np.asarray(wide * 0.1)
    assert got.dtype == np.float64 and got[0] == 0.1
    with fnx.enable_x64(True):  # (x64 on, the weak float is float64: the same bits through the jit)
        (got, names) = traces_of(lambda: np.asarray(jnp.asarray(np.ones(5)) * 0.1))
        assert names == ["multiply"] and got.dtype == np.float64 and got[0] == 0.1


def test_static_arguments_that_are_equal_in_python_are_distinct():
    """axis=0.0 after axis=0 (equal, and of one hash, as dict keys) is still the TypeError JAX gives, and
    keepdims=1 after keepdims=True a program of its own."""
    x = jnp.asarray(np.ones((2, 3), np.float32))
    np.testing.assert_array_equal(np.asarray(jnp.sum(x, axis=0)), [2, 2, 2])
    with pytest.raises(TypeError):
        jnp.sum(x, axis=0.0)
    assert jnp.sum(x, axis=1, keepdims=True).shape == (2, 1)
    assert jnp.sum(x, axis=1, keepdims=1).shape == (2, 1)


def test_arange_compiles_once_per_bounds_and_gives_a_fresh_array_each_call():
    """arange's bounds are static (a concrete array bound is unhashable: op by op, as before); each call's result
    is its own buffer, so donating one leaves the next call's intact."""
    (a, first) = traces_of(lambda: jnp.arange(3, 40, 3))
    (b, second) = traces_of(lambda: jnp.arange(3, 40, 3))
    assert first == ["arange"] and second == [] and a._buffer is not b._buffer
    np.testing.assert_array_equal(np.asarray(b), np.arange(3, 40, 3))
    fnx.jit(lambda v: v * 2, donate_argnums=0)(a)
    np.testing.assert_array_equal(np.asarray(jnp.arange(3, 40, 3)), np.arange(3, 40, 3))
    np.testing.assert_array_equal(np.asarray(jnp.arange(jnp.asarray(4))), np.arange(4))
    np.testing.assert_allclose(np.asarray(jnp.arange(0.5, 2.0, 0.25)), np.arange(0.5, 2.0, 0.25))


def test_nn_functions_give_their_op_by_op_bits():
    """fnx.nn's eager calls against the same calls under fnx.disable_jit (op by op): equal bits in float32, and
    in float16 with a Python number (alpha, the slope, epsilon), where the call stays op by op itself."""
    import fnx.nn as nn
    for dtype in (np.float32, np.float16):
        x = jnp.asarray(rng.standard_normal((5, 9)).astype(dtype) * 3)
        calls = [lambda: nn.elu(x, 0.3), lambda: nn.leaky_relu(x, 0.07), lambda: nn.standardize(x, epsilon=0.1),
                 lambda: nn.softmax(x), lambda: nn.gelu(x), lambda: nn.celu(x, 1.3), lambda: nn.squareplus(x, 0.7)]
        fast = [np.asarray(c()) for c in calls]
        with fnx.disable_jit():
            slow = [np.asarray(c()) for c in calls]
        for i, (f, s) in enumerate(zip(fast, slow)):
            assert f.dtype == s.dtype == dtype
            np.testing.assert_array_equal(f, s, err_msg=f"{dtype.__name__} call {i}")


def test_concatenate_and_stack_of_arrays_trace_once():
    """A list of Arrays is one dynamic argument (a tuple): a second call on other values traces nothing. A list
    with anything else in it (a numpy array, a nested list) runs op by op, as before."""
    def run(seed):
        r = np.random.default_rng(seed)
        a, b = (r.standard_normal((3, 4)).astype(np.float32) for _ in range(2))
        fa, fb = jnp.asarray(a), jnp.asarray(b)
        got = [jnp.concatenate([fa, fb, fa], axis=1), jnp.stack((fa, fb), axis=-1), jnp.concatenate([fa, fb], None)]
        return [np.asarray(g) for g in got], [np.concatenate([a, b, a], 1), np.stack([a, b], -1),
                                              np.concatenate([a.ravel(), b.ravel()])]
    _, first = traces_of(lambda: run(1))
    (got, want), second = traces_of(lambda: run(2))
    assert {"concatenate", "stack"} <= set(first) and second == []
    for g, w in zip(got, want): np.testing.assert_array_equal(g, w)
    mixed, names = traces_of(lambda: jnp.concatenate([jnp.asarray(np.ones(2, np.float32)), np.zeros(3, np.float32)]))
    assert names == [] and np.asarray(mixed).tolist() == [1, 1, 0, 0, 0]


def test_an_eager_ops_programs_are_bounded():
    """Eager code on ever new shapes keeps the programs of the last EAGER_SIGNATURES signatures per op, not one
    per shape (2,000 shapes of three ops grew a process by 1.4 GB so); an evicted shape is traced again and gives
    the same answer."""
    from fnx.transforms import jit as jit_module
    limit = jit_module.EAGER_SIGNATURES
    xs = [jnp.asarray(np.arange(n, dtype=np.float32)) for n in range(3, 3 + limit + 9)]  # (shapes no test uses)
    for x in xs: np.asarray(x * 2.5)
    sizes = [len(c.fast) for c in list(jit_module._all_caches) if c.fast.limit == limit]
    assert sizes and max(sizes) == limit
    first, names = traces_of(lambda: np.asarray(xs[0] * 2.5))
    assert names == ["multiply"]  # (the first shape's program went)
    np.testing.assert_array_equal(first, np.arange(3, dtype=np.float32) * 2.5)


def test_eager_indexing_in_a_loop_traces_once_per_form_and_matches_numpy():
    """x[i], x[i:i + k], x[i, ..., j], x[:, i] and x.at[i].set/add for every i: the ints and slice starts are
    arguments of one jit per form of the key (9-10 ms a compile each before), and every value is numpy's, with
    negative ints counted from the end."""
    a = rng.standard_normal((9, 5, 4)).astype(np.float32)
    x = jnp.asarray(a)
    forms = [(lambda i: x[i], lambda i: a[i]),
             (lambda i: x[i:i + 3], lambda i: a[i:i + 3]),
             (lambda i: x[i, ..., i % 4], lambda i: a[i, ..., i % 4]),
             (lambda i: x[:, i % 5, None], lambda i: a[:, i % 5, None]),
             (lambda i: x[-1 - i, 1:4, ::2], lambda i: a[-1 - i, 1:4, ::2]),
             (lambda i: x.at[i].set(2.5), lambda i: np.concatenate([a[:i], np.full((1, 5, 4), 2.5, np.float32),
                                                                   a[i + 1:]])),
             (lambda i: x.at[i, 1:3].add(x[0, :2]), lambda i: _added(a, i))]
    for k, (got, expect) in enumerate(forms):
        for i in range(3):  # (the first calls trace: x[0:3] has a static start, x[1:4] a window)
            np.testing.assert_array_equal(np.asarray(got(i)), expect(i), err_msg=f"form {k}, i={i}")
        results, names = traces_of(lambda: [np.asarray(got(i)) for i in range(3, 6)], ("trace", "lower"))
        assert names == [], (k, names)  # (op by op, each new i lowered and compiled a program)
        for i, r in zip(range(3, 6), results):
            np.testing.assert_array_equal(r, expect(i), err_msg=f"form {k}, i={i}")


def _added(a, i):
    out = a.copy()
    out[i, 1:3] += a[0, :2]
    return out


def test_eager_indexing_keeps_jaxs_out_of_range_and_advanced_rules():
    """Out-of-range ints (op by op): x[10] of 9 rows is the last row, x.at[10].set drops the update, as in JAX;
    an int next to an index array follows numpy's advanced-indexing axis rule; a float16 array's .at[].set of a
    Python float converts it once, straight from the Python value; bad keys raise at the user's line."""
    a = rng.standard_normal((9, 5, 4)).astype(np.float32)
    x = jnp.asarray(a)
    np.testing.assert_array_equal(np.asarray(x[10]), a[8])
    np.testing.assert_array_equal(np.asarray(x[-10]), a[0])
    np.testing.assert_array_equal(np.asarray(x.at[10].set(0.0)), a)
    np.testing.assert_array_equal(np.asarray(x[3:100]), a[3:100])
    idx = np.array([2, 0, 3])
    for i in range(2):
        np.testing.assert_array_equal(np.asarray(x[i, :, jnp.asarray(idx)]), a[i, :, idx])
        np.testing.assert_array_equal(np.asarray(x[jnp.asarray(idx), i]), a[idx, i])
    h = jnp.asarray(np.zeros(4, np.float16))
    assert float(h.at[1].set(1 + 2 ** -11 + 2 ** -40)[1]) == float(np.float16(1 + 2 ** -11 + 2 ** -40))
    with pytest.raises(IndexError, match=r"too many indices(.|\n)*at .*test_eager_dispatch.py"):
        x[1, 2, 3, 4]
    with pytest.raises(IndexError, match="one ellipsis"):
        x[..., 1, ...]
    with pytest.raises(TypeError, match=r"at\[\]\.set(.|\n)*\(7,\)(.|\n)*at .*test_eager_dispatch.py"):
        x.at[1].set(jnp.ones(7))


def test_eager_indexing_of_a_concrete_array_inside_jit_and_vmap_is_traced():
    """The eager fast path stays out of traces: an index under jit and vmap, and the grad through it, are
    numpy's and finite differences'."""
    a = rng.standard_normal((6, 5)).astype(np.float32)
    f = fnx.jit(lambda x, i: x[i] * x[2:4].sum())
    np.testing.assert_allclose(np.asarray(f(jnp.asarray(a), 4)), a[4] * a[2:4].sum(), rtol=1e-5)
    rows = fnx.vmap(lambda r: r[1:3].sum() + r[-1])(jnp.asarray(a))
    np.testing.assert_allclose(np.asarray(rows), a[:, 1:3].sum(1) + a[:, -1], rtol=1e-5)
    g = fnx.grad(lambda x: (x[3] ** 2).sum() + x.at[1].set(0.0).sum())(jnp.asarray(a))
    expect = np.ones_like(a)
    expect[1] = 0
    expect[3] += 2 * a[3]
    np.testing.assert_allclose(np.asarray(g), expect, rtol=1e-5)


def test_shape_creation_and_other_functions_trace_once_and_match_numpy():
    """The shape functions, astype, power, the creation functions, take, pad, round, split and the products run
    as jit of themselves: a second call on new values traces nothing, and each result is numpy's."""
    shape = (5, 9, 3)  # (a shape no other test uses)

    def calls(x, i):
        return [x.reshape(15, 9), jnp.reshape(x, (-1,)), x.T, jnp.swapaxes(x, 0, 2), jnp.moveaxis(x, 0, -1),
                jnp.expand_dims(x, 1), jnp.squeeze(x[:1]), jnp.broadcast_to(x[0], (2, 9, 3)), jnp.flip(x, 1),
                jnp.tile(x[0, 0], (2, 2)), x.astype(jnp.int32), x ** 2, jnp.power(x, 0.5), jnp.zeros((2, 3)),
                jnp.ones_like(x, dtype=jnp.int8), jnp.eye(4, k=1), jnp.take(x, i, axis=1),
                jnp.pad(x[0], ((1, 2), (0, 1)), constant_values=1.5), jnp.round(x * 10, 1), jnp.split(x, [2], 1)[1],
                jnp.tensordot(x, x, axes=[[1, 2], [1, 2]]), jnp.outer(x[0, 0], x[1, 1]), jnp.vdot(x, x),
                jnp.inner(x[0], x[1])]

    def expected(a, i):
        return [a.reshape(15, 9), a.reshape(-1), a.T, np.swapaxes(a, 0, 2), np.moveaxis(a, 0, -1),
                np.expand_dims(a, 1), np.squeeze(a[:1]), np.broadcast_to(a[0], (2, 9, 3)), np.flip(a, 1),
                np.tile(a[0, 0], (2, 2)), a.astype(np.int32), a ** 2, a ** 0.5, np.zeros((2, 3)),
                np.ones(a.shape, np.int8), np.eye(4, k=1), np.take(a, i, axis=1),
                np.pad(a[0], ((1, 2), (0, 1)), constant_values=1.5), np.round(a * 10, 1), np.split(a, [2], 1)[1],
                np.tensordot(a, a, axes=[[1, 2], [1, 2]]), np.outer(a[0, 0], a[1, 1]), np.vdot(a, a),
                np.inner(a[0], a[1])]

    def run(a, i):
        return [np.asarray(r) for r in calls(jnp.asarray(a), jnp.asarray(i))]
    first = [rng.random(shape).astype(np.float32) * 4, np.array([8, 0, -1, 3])]
    second = [rng.random(shape).astype(np.float32) * 4, np.array([1, 7, 2, -9])]
    run(*first)
    got, names = traces_of(lambda: run(*second), ("trace", "lower", "cache"))
    assert not [n for n in names if "cache hit" not in n], names  # (nothing traced or lowered again)
    hits = {n.split(":")[0].removeprefix("jit ") for n in names}
    assert {"reshape", "transpose", "swapaxes", "moveaxis", "expand_dims", "squeeze", "broadcast_to", "flip", "tile",
            "astype", "power", "zeros", "ones_like", "eye", "take", "pad", "round", "split", "tensordot", "outer",
            "vdot", "inner", "getitem"} <= hits, hits
    for k, (g, w) in enumerate(zip(got, expected(second[0].astype(np.float64), second[1]))):
        assert g.shape == w.shape, k
        if g.dtype.kind in "iu":
            np.testing.assert_array_equal(g, w if k != 10 else second[0].astype(np.int32), err_msg=str(k))
        else:
            np.testing.assert_allclose(g, w, rtol=2e-5, atol=1e-5, err_msg=str(k))


def test_a_remembered_call_form_is_not_taken_for_another_dtype_x64_or_value():
    """jitted_op remembers how a call of each form bound its arguments (its fast path); a call whose arrays have
    another dtype, under another x64 setting, or with other static values decides again: a float16 array beside a
    Python float stays op by op, a 64-bit dtype with x64 off warns each time, and other axes give other shapes."""
    m = jnp.asarray(np.array([True, False, True]))
    x32, x16 = jnp.asarray(np.ones(3, np.float32)), jnp.asarray(np.ones(3, np.float16))
    s = 1 + 2 ** -11 + 2 ** -40
    for _ in range(3):
        assert float(jnp.where(m, x32, s)[1]) == float(np.float32(s))
        assert float(jnp.where(m, x16, s)[1]) == float(np.float16(s))  # (once rounded, from the double)
    x = jnp.asarray(np.arange(6, dtype=np.float32).reshape(2, 3))
    for _ in range(3):
        assert jnp.mean(x, 0).shape == (3,) and jnp.mean(x, 1).shape == (2,) and jnp.mean(x, axis=1).shape == (2,)
        assert jnp.sum(x, 0, keepdims=True).shape == (1, 3) and jnp.sum(x, 0, keepdims=False).shape == (3,)
        with pytest.warns(UserWarning, match="dtype float64"):
            assert jnp.sum(x, dtype=jnp.float64).dtype == np.float32
        with fnx.enable_x64(True):
            assert jnp.sum(x, dtype=jnp.float64).dtype == np.float64
    for i in range(40):  # (a new number each call: each is its own form, and the memory of forms stays bounded)
        np.testing.assert_allclose(np.asarray(jnp.clip(x, 0.0, i / 8)), np.clip(np.arange(6).reshape(2, 3), 0, i / 8))


def test_new_bounds_fill_values_and_seeds_lower_nothing_after_the_first_call():
    """Item 4 of the performance issue, in creation functions: each new linspace bound, full / full_like fill
    value or PRNGKey seed was a constant of its own program, lowered and compiled per value (linspace 11 ms a
    call, PRNGKey 4 ms). Now they are arguments: a loop over new values lowers nothing after its first call,
    and every value is the op-by-op one (linspace numpy's float64 values rounded once; keys JAX's)."""
    import jax
    x = jnp.asarray(rng.standard_normal((5, 3)).astype(np.float32))

    def run(i):
        start, stop = float(rng.standard_normal()) * 10.0 ** (i % 5 - 2), float(i) + 0.1
        return ((start, stop), jnp.linspace(start, stop, 7), jnp.linspace(start, stop, 7, endpoint=False,
                                                                        retstep=True),
                jnp.full((2, 3), 0.1 * i), jnp.full((4,), i, dtype=np.int32), jnp.full_like(x, -0.3 * i),
                fnx.random.PRNGKey(i), fnx.random.PRNGKey(np.int64(-i) * 2 ** 33 - 1))
    run(0)
    for i in range(1, 6):
        out, lowered = traces_of(lambda: run(i), cats=("trace", "lower"))
        assert lowered == [], (i, lowered)
        (start, stop), values, (open_values, step), filled, ints, like, key, big_key = out
        np.testing.assert_array_equal(np.asarray(values), np.linspace(start, stop, 7).astype(np.float32))
        np.testing.assert_array_equal(np.asarray(open_values),
                                      np.linspace(start, stop, 7, endpoint=False).astype(np.float32))
        assert float(step) == np.float32((stop - start) / 7)
        assert values.dtype == np.float32 and not values.weak_type
        np.testing.assert_array_equal(np.asarray(filled), np.full((2, 3), np.float32(0.1 * i)))
        assert filled.weak_type and like.dtype == np.float32 and not like.weak_type
        np.testing.assert_array_equal(np.asarray(ints), np.full(4, i, np.int32))
        np.testing.assert_array_equal(np.asarray(like), np.full((5, 3), np.float32(-0.3 * i)))
        for k, seed in ((key, i), (big_key, np.int64(-i) * 2 ** 33 - 1)):
            np.testing.assert_array_equal(np.asarray(k), np.asarray(jax.random.PRNGKey(seed)))
            assert k.dtype == np.uint32


def test_fill_values_that_a_jit_argument_would_round_twice_stay_op_by_op():
    """0.1 into float16 or bfloat16, a Python int into float16: a weakly typed argument would be float32 or int32
    first, then rounded again; op by op the constant converts straight from the Python value, as in JAX."""
    x16 = jnp.asarray(np.ones((2, 2), np.float16))
    for i in range(1, 4):
        v = 0.1 * i + 1e-4
        np.testing.assert_array_equal(np.asarray(jnp.full((3,), v, dtype=np.float16)), np.full(3, np.float16(v)))
        np.testing.assert_array_equal(np.asarray(jnp.full_like(x16, v)), np.full((2, 2), np.float16(v)))
        got = np.asarray(jnp.full((2,), v, dtype=jnp.bfloat16)).astype(np.float64)
        np.testing.assert_array_equal(got, np.full(2, np.asarray(v).astype(jnp.bfloat16).astype(np.float64)))
    assert jnp.full_like(x16, 2049).dtype == np.float16 and float(jnp.full_like(x16, 2049)[0, 0]) == 2048.0
    with pytest.warns(UserWarning, match="float64"):
        assert jnp.full((2,), 0.1, dtype=np.float64).dtype == np.float32
    with pytest.warns(UserWarning, match="float64"):
        assert jnp.linspace(0.0, 1.0, 3, dtype=np.float64).dtype == np.float32
    with pytest.raises(OverflowError):
        jnp.linspace(0, 2 ** 40, 3)
    with pytest.raises(OverflowError):
        fnx.random.PRNGKey(2 ** 64)


def test_array_of_a_python_number_is_made_on_the_host():
    """`jnp.array(v)` / `jnp.asarray(v)` of a Python bool, int or float: a buffer filled on the host, no program
    (it was a constant realized through a program: 75 us a call); dtype and weak type as before (JAX's)."""
    cases = [(0.1, np.float32, True), (-0.0, np.float32, True), (7, np.int32, True), (True, np.bool_, False),
             (float("inf"), np.float32, True), (2 ** 31 - 1, np.int32, True)]
    jnp.array(1.5)
    for v, dtype, weak in cases:
        for make in (jnp.array, jnp.asarray):
            got, lowered = traces_of(lambda: make(v), cats=("trace", "lower"))
            assert lowered == [] and got.dtype == dtype and got.weak_type == weak and got.shape == ()
            assert np.asarray(got).tobytes() == np.asarray(v, dtype).tobytes()
    assert (jnp.ones(2, jnp.float16) * jnp.array(2.0)).dtype == np.float16  # (weak: the float16 array's dtype)
    with pytest.raises(OverflowError):
        jnp.array(2 ** 40)
    assert jnp.array(0.5, dtype=jnp.float16).dtype == np.float16 and jnp.array(0.5, ndmin=2).shape == (1, 1)
