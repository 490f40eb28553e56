"""Collectives over a vmapped axis name — psum_scatter, ppermute, all_to_all, axis_size — against numpy formulas
of their semantics (example k of n, x_j example j's input) and against jax.vmap(..., axis_name=...) running the
same collectives: forward values tiled and untiled along any (also negative) axes, on each device, under jit,
over nested vmaps' names, on pytrees; jvp and grad inside the vmap (the collectives' own jvp and transpose rules)
and grad through the whole vmap (the batching rules); and the errors.

    psum_scatter tiled along d:    y_k = chunk k along d of sum_j x_j
    ppermute:                      y_dst = x_src for each (src, dst) pair, zeros for the examples no pair sends to
    all_to_all tiled (split s, concat c): y_k = concatenation along c over j of chunk k along s of x_j
"""
import numpy as np
import pytest
from hypothesis import given, strategies as st

import assertions
import fnx
from fnx import dtypes, lax
from fnx.errors import ShapeError, UnsupportedError
from fnx.uop import CollectiveArg, Ops, UOp


def _jax():
    """JAX, the oracle of the tests that compare with it (a counted skip where it is not installed)."""
    return pytest.importorskip("jax")


# ---- the numpy oracles, on the whole batch xs (example j = xs[j]) ----

def psum_scatter_ref(xs: np.ndarray, axis: int, tiled: bool) -> np.ndarray:
    n, total = len(xs), xs.sum(0)
    if not tiled: return np.stack([np.take(total, k, axis=axis) for k in range(n)])
    return np.stack(np.split(total, n, axis=axis))


def ppermute_ref(xs: np.ndarray, perm) -> np.ndarray:
    out = np.zeros_like(xs)
    for src, dst in perm: out[dst] = xs[src]
    return out


def all_to_all_ref(xs: np.ndarray, split_axis: int, concat_axis: int, tiled: bool) -> np.ndarray:
    n = len(xs)
    if not tiled:  # the axis of size n at concat_axis (of the result) indexes the sending example
        return np.stack([np.stack([np.take(x, k, axis=split_axis) for x in xs], axis=concat_axis) for k in range(n)])
    return np.stack([np.concatenate([np.split(x, n, axis=split_axis)[k] for x in xs], axis=concat_axis)
                     for k in range(n)])


def distinct(shape, seed: int, dtype=np.float32) -> np.ndarray:
    """Distinct small integers (exact in float32, and in their sums), shuffled: every misplaced entry shows."""
    return np.random.default_rng(seed).permutation(int(np.prod(shape))).astype(dtype).reshape(shape)


def vmapped(fn, xs, **kwargs):
    return fnx.vmap(fn, axis_name="i", **kwargs)(xs)


def ring(n: int, shift: int = 1) -> list:
    return [(j, (j + shift) % n) for j in range(n)]


# ---- forward values against the numpy formulas, over drawn shapes and axes ----

@st.composite
def chunked_case(draw, two_axes: bool):
    """(n, example shape, split axis, concat axis (or None), tiled), the split axis sized to fit and each axis given
    as a positive or negative index."""
    n, rank, tiled = draw(st.integers(1, 4)), draw(st.integers(1, 3)), draw(st.booleans())
    shape = [draw(st.integers(1, 3)) for _ in range(rank)]
    split = draw(st.integers(0, rank - 1))
    shape[split] = n * draw(st.integers(1, 3)) if tiled else n
    concat = draw(st.integers(0, rank - 1)) if two_axes else None
    signed = lambda a: a - rank if a is not None and draw(st.booleans()) else a  # noqa: E731
    return n, tuple(shape), signed(split), signed(concat), tiled


@given(case=chunked_case(two_axes=False), seed=st.integers(0, 2**16))
def test_psum_scatter_matches_its_formula(case, seed):
    n, shape, axis, _, tiled = case
    xs = distinct((n,) + shape, seed)
    out = vmapped(lambda x: lax.psum_scatter(x, "i", scatter_dimension=axis, tiled=tiled), xs)
    np.testing.assert_array_equal(np.asarray(out), psum_scatter_ref(xs, axis % len(shape), tiled))


@given(case=chunked_case(two_axes=True), seed=st.integers(0, 2**16))
def test_all_to_all_matches_its_formula(case, seed):
    n, shape, split, concat, tiled = case
    xs = distinct((n,) + shape, seed)
    out = vmapped(lambda x: lax.all_to_all(x, "i", split, concat, tiled=tiled), xs)
    np.testing.assert_array_equal(np.asarray(out), all_to_all_ref(xs, split % len(shape), concat % len(shape), tiled))


@st.composite
def partial_perm(draw):
    """(n, perm): distinct sources sent to distinct destinations, any number of pairs (none included)."""
    n = draw(st.integers(1, 5))
    sources = draw(st.permutations(range(n)))[:draw(st.integers(0, n))]
    destinations = draw(st.permutations(range(n)))[:len(sources)]
    return n, list(zip(sources, destinations))


@given(case=partial_perm(), rank=st.integers(0, 2), seed=st.integers(0, 2**16))
def test_ppermute_matches_its_formula(case, rank, seed):
    n, perm = case
    xs = distinct((n,) + (2,) * rank, seed, np.int32)
    out = vmapped(lambda x: lax.ppermute(x, "i", perm), xs)
    assertions.assert_tree_close(out, ppermute_ref(xs, perm), exact_dtypes=True)


def test_ppermute_accepts_numpy_integers_and_tuples():
    xs = distinct((3, 2), 0)
    perm = tuple((np.int64(s), np.int32(d)) for s, d in ring(3))
    np.testing.assert_array_equal(np.asarray(vmapped(lambda x: lax.ppermute(x, "i", perm), xs)),
                                  ppermute_ref(xs, ring(3)))


# ---- against jax.vmap: one case per collective, written against a lax module `L` ----

CASES = [
    ("psum_scatter", lambda L, x: L.psum_scatter(x, "i"), (4, 4, 3)),
    ("psum_scatter_dim1", lambda L, x: L.psum_scatter(x, "i", scatter_dimension=1), (4, 3, 4)),
    ("psum_scatter_tiled", lambda L, x: L.psum_scatter(x, "i", tiled=True), (4, 8, 3)),
    ("psum_scatter_tiled_dim1", lambda L, x: L.psum_scatter(x, "i", scatter_dimension=1, tiled=True), (4, 3, 8)),
    ("ppermute_ring", lambda L, x: L.ppermute(x, "i", ring(4)), (4, 2, 3)),
    ("ppermute_swap", lambda L, x: L.ppermute(x, "i", [(0, 3), (3, 0), (1, 2), (2, 1)]), (4, 5)),
    ("all_to_all_0_1", lambda L, x: L.all_to_all(x, "i", 0, 1), (4, 4, 3)),
    ("all_to_all_2_0", lambda L, x: L.all_to_all(x, "i", 2, 0), (4, 3, 2, 4)),
    ("all_to_all_0_0", lambda L, x: L.all_to_all(x, "i", 0, 0), (4, 4, 3)),
    ("all_to_all_1_2", lambda L, x: L.all_to_all(x, "i", 1, 2), (4, 3, 4, 2)),
    ("all_to_all_tiled_0_1", lambda L, x: L.all_to_all(x, "i", 0, 1, tiled=True), (4, 8, 3)),
    ("all_to_all_tiled_1_0", lambda L, x: L.all_to_all(x, "i", 1, 0, tiled=True), (4, 3, 8)),
    ("all_to_all_tiled_1_1", lambda L, x: L.all_to_all(x, "i", 1, 1, tiled=True), (4, 3, 8)),
    ("scaled_by_axis_size", lambda L, x: L.psum_scatter(x, "i", tiled=True) / L.axis_size("i"), (4, 4)),
]
IDS = [c[0] for c in CASES]


def fnx_fn(case):
    return lambda x: case[1](lax, x)


def jax_fn(case):
    return lambda x: case[1](_jax().lax, x)


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_forward_matches_jax(case):
    jax, xs = _jax(), distinct(case[2], 1)
    expected = np.asarray(jax.vmap(jax_fn(case), axis_name="i")(xs))
    np.testing.assert_array_equal(np.asarray(vmapped(fnx_fn(case), xs)), expected)
    np.testing.assert_array_equal(np.asarray(fnx.jit(fnx.vmap(fnx_fn(case), axis_name="i"))(xs)), expected)


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_forward_on_each_device(case, device):
    xs = distinct(case[2], 2)
    jax = _jax()
    np.testing.assert_array_equal(np.asarray(vmapped(fnx_fn(case), xs)),
                                  np.asarray(jax.vmap(jax_fn(case), axis_name="i")(xs)))


@pytest.mark.parametrize("case", CASES[:-1], ids=IDS[:-1])  # (the last one divides: floats)
def test_integers_keep_their_dtype(case):
    jax, xs = _jax(), distinct(case[2], 3, np.int32)
    out = vmapped(fnx_fn(case), xs)
    assertions.assert_tree_close(out, np.asarray(jax.vmap(jax_fn(case), axis_name="i")(xs)), exact_dtypes=True)


def _untiled_exchange_of_two_axes(case) -> bool:
    """jax.vmap(jax.grad(...)) fails on these (JAX transposes the untiled all_to_all with its expand_dims and
    squeeze applied twice: "Expected cotangent type float32[4,3,1] but got float32[4,1,3]")."""
    return case[0] in ("all_to_all_0_1", "all_to_all_2_0", "all_to_all_1_2")


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_grad_inside_the_vmap_matches_jax(case):
    """grad per example of a weighted sum through the collective, i.e. the transpose rules (psum_scatter <-> tiled
    all_gather, ppermute reversed, all_to_all with its axes swapped). Example j's gradient is that of the sum of
    every example's loss with respect to x_j: JAX's grad of that sum through jax.vmap is the oracle, and so is
    jax.vmap(jax.grad(...)) where JAX can transpose the collective."""
    jax, xs = _jax(), np.random.default_rng(4).standard_normal(case[2]).astype(np.float32)
    ws = np.random.default_rng(5).standard_normal(np.shape(vmapped(fnx_fn(case), xs))).astype(np.float32)

    def loss(m, f):
        return lambda x, w: (m.sin(f(x)) * w).sum()
    expected = jax.grad(lambda a: jax.vmap(loss(jax.numpy, jax_fn(case)), axis_name="i")(a, ws).sum())(xs)
    if not _untiled_exchange_of_two_axes(case):
        np.testing.assert_allclose(np.asarray(jax.vmap(jax.grad(loss(jax.numpy, jax_fn(case))), axis_name="i")(xs, ws)),
                                   np.asarray(expected), rtol=1e-5, atol=1e-6)
    got = fnx.vmap(fnx.grad(loss(fnx.numpy, fnx_fn(case))), axis_name="i")(xs, ws)
    np.testing.assert_allclose(np.asarray(got), np.asarray(expected), rtol=1e-5, atol=1e-6)
    jitted = fnx.jit(fnx.vmap(fnx.grad(loss(fnx.numpy, fnx_fn(case))), axis_name="i"))(xs, ws)
    np.testing.assert_allclose(np.asarray(jitted), np.asarray(expected), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_grad_through_the_vmap_matches_jax(case):
    """grad of the whole vmapped computation: differentiates what the batching rules built."""
    jax, xs = _jax(), np.random.default_rng(6).standard_normal(case[2]).astype(np.float32)
    ws = np.random.default_rng(7).standard_normal(np.shape(vmapped(fnx_fn(case), xs))).astype(np.float32)

    def loss(m, v, f):
        return lambda a: (m.sin(v(f, axis_name="i")(a)) * ws).sum()
    expected = jax.grad(loss(jax.numpy, jax.vmap, jax_fn(case)))(xs)
    got = fnx.grad(loss(fnx.numpy, fnx.vmap, fnx_fn(case)))(xs)
    np.testing.assert_allclose(np.asarray(got), np.asarray(expected), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_jvp_inside_the_vmap_matches_jax(case):
    jax, rng = _jax(), np.random.default_rng(8)
    xs, ts = (rng.standard_normal(case[2]).astype(np.float32) for _ in range(2))

    def tangent(m, jvp, f):
        return lambda x, t: jvp(lambda a: m.sin(f(a)), (x,), (t,))
    expected = jax.vmap(tangent(jax.numpy, jax.jvp, jax_fn(case)), axis_name="i")(xs, ts)
    got = fnx.vmap(tangent(fnx.numpy, fnx.jvp, fnx_fn(case)), axis_name="i")(xs, ts)
    assertions.assert_tree_close(got, expected, rtol=1e-5, atol=1e-6)


def test_inside_jit_scan_and_cond_bodies_match_jax():
    jax, xs = _jax(), distinct((4, 8), 19)

    def f(L, jit):
        def body(carry, row):
            return L.ppermute(carry, "i", ring(4)) + row, L.all_to_all(carry, "i", 0, 0, tiled=True)

        def g(x):
            scanned = L.scan(body, x[:4], x.reshape(2, 4))
            chosen = L.cond(x[0] > 3, lambda a: L.psum_scatter(a, "i", tiled=True), lambda a: -a[:2], x)
            return jit(lambda a: L.psum_scatter(a, "i"))(x[:4]), scanned, chosen
        return g
    expected = jax.vmap(f(jax.lax, jax.jit), axis_name="i")(xs)
    assertions.assert_tree_close(vmapped(f(lax, fnx.jit), xs), expected, rtol=0, atol=0)


# ---- the transpose rules against the formulas, where jax.vmap cannot be the oracle ----

def test_grad_of_a_partial_ppermute_sends_cotangents_back_to_the_sources():
    perm, xs = [(0, 2), (3, 1)], distinct((4, 3), 9)
    ws = np.random.default_rng(10).standard_normal((4, 3)).astype(np.float32)
    got = fnx.vmap(fnx.grad(lambda x, w: (lax.ppermute(x, "i", perm) * w).sum()), axis_name="i")(xs, ws)
    np.testing.assert_array_equal(np.asarray(got), ppermute_ref(ws, [(d, s) for s, d in perm]))


@given(case=chunked_case(two_axes=True), seed=st.integers(0, 2**16))
def test_all_to_all_transpose_is_all_to_all_with_swapped_axes(case, seed):
    """<all_to_all(x), w> summed over the examples equals <x, grad>: the vjp is the adjoint."""
    n, shape, split, concat, tiled = case
    xs = distinct((n,) + shape, seed)
    ws = distinct(np.shape(all_to_all_ref(xs, split % len(shape), concat % len(shape), tiled)), seed + 1)
    f = lambda x: lax.all_to_all(x, "i", split, concat, tiled=tiled)  # noqa: E731
    grads = fnx.vmap(fnx.grad(lambda x, w: (f(x) * w).sum()), axis_name="i")(xs, ws)
    assert grads.shape == xs.shape
    np.testing.assert_allclose((np.asarray(vmapped(f, xs)) * ws).sum(), (xs * np.asarray(grads)).sum(), rtol=1e-6)


@given(case=chunked_case(two_axes=False), seed=st.integers(0, 2**16))
def test_psum_scatter_transpose_is_the_tiled_all_gather(case, seed):
    n, shape, axis, _, tiled = case
    xs = distinct((n,) + shape, seed)
    ws = distinct(psum_scatter_ref(xs, axis % len(shape), tiled).shape, seed + 1)
    f = lambda x: lax.psum_scatter(x, "i", scatter_dimension=axis, tiled=tiled)  # noqa: E731
    grads = fnx.vmap(fnx.grad(lambda x, w: (f(x) * w).sum()), axis_name="i")(xs, ws)
    gathered = np.stack(list(ws), axis=axis % len(shape)) if not tiled else np.concatenate(list(ws), axis % len(shape))
    np.testing.assert_array_equal(np.asarray(grads), np.broadcast_to(gathered, xs.shape))


# ---- nested vmaps: a collective over the outer name inside the inner vmap ----

def test_outer_name_inside_an_inner_vmap_matches_jax():
    jax, xs = _jax(), distinct((4, 2, 8, 3), 11)

    def f(L):
        def inner(x):  # x: (8, 3); "i" is the outer axis (4), "j" the inner one (2)
            y = L.psum_scatter(x, "i", scatter_dimension=0, tiled=True)             # (2, 3)
            z = L.all_to_all(x, "i", 0, 1, tiled=True)                              # (2, 12)
            p = L.ppermute(x, "i", ring(4, 3)) + L.ppermute(x, "j", ring(2))       # (8, 3)
            return y, z, p, L.all_to_all(x[:2], "j", 0, 1)                          # (3, 2)
        return inner
    expected = jax.vmap(jax.vmap(f(jax.lax), axis_name="j"), axis_name="i")(xs)
    got = fnx.vmap(fnx.vmap(f(lax), axis_name="j"), axis_name="i")(xs)
    assertions.assert_tree_close(got, expected, rtol=0, atol=0)
    jitted = fnx.jit(fnx.vmap(fnx.vmap(f(lax), axis_name="j"), axis_name="i"))(xs)
    assertions.assert_tree_close(jitted, expected, rtol=0, atol=0)


def test_outer_name_with_the_inner_batch_elsewhere():
    """The inner vmap's batch axis in front shifts the axes the outer collective names; in_axes=1 moves it."""
    xs = distinct((3, 6, 2), 12)  # the outer axis "i" (3) in front, the inner one (2) last
    f = fnx.vmap(fnx.vmap(lambda x: lax.all_to_all(x, "i", 0, 0, tiled=True), in_axes=1, out_axes=1,
                          axis_name="j"), axis_name="i")
    expected = np.stack([all_to_all_ref(xs[:, :, j], 0, 0, True) for j in range(2)], axis=2)
    np.testing.assert_array_equal(np.asarray(f(xs)), expected)


def test_psum_scatter_over_two_names_scatters_their_row_major_index():
    xs = distinct((2, 3, 12), 13)
    out = fnx.vmap(fnx.vmap(lambda x: lax.psum_scatter(x, ("i", "j"), tiled=True), axis_name="j"),
                   axis_name="i")(xs)
    expected = psum_scatter_ref(xs.reshape(6, 12), 0, True).reshape(2, 3, 2)
    np.testing.assert_array_equal(np.asarray(out), expected)
    untiled = fnx.vmap(fnx.vmap(lambda x: lax.psum_scatter(x[:6], ("i", "j")), axis_name="j"), axis_name="i")(xs)
    np.testing.assert_array_equal(np.asarray(untiled), psum_scatter_ref(xs[..., :6].reshape(6, 6), 0, False)
                                  .reshape(2, 3))


# ---- operands that do not depend on the batch, pytrees, axis_size ----

def test_unbatched_operands():
    """A closed-over operand is every example's x: the formulas on it repeated n times (JAX agrees for psum_scatter
    and ppermute; its all_to_all of an unbatched operand returns a wrongly shaped (4, 1, 12, 4, 3) here)."""
    jax, const, zeros = _jax(), distinct((4, 3), 14), np.zeros((4, 1), np.float32)
    same = np.stack([const] * 4)

    def f(L):
        return lambda x: (L.psum_scatter(const, "i", tiled=True) + x, L.ppermute(const, "i", ring(4)) + x)
    expected = (psum_scatter_ref(same, 0, True), ppermute_ref(same, ring(4)))
    assertions.assert_tree_close(vmapped(f(lax), zeros), expected, rtol=0, atol=0)
    assertions.assert_tree_close(jax.vmap(f(jax.lax), axis_name="i")(zeros), expected, rtol=0, atol=0)
    out = vmapped(lambda x: lax.all_to_all(const, "i", 0, 1, tiled=True) + x, zeros)
    np.testing.assert_array_equal(np.asarray(out), all_to_all_ref(same, 0, 1, True))


def test_ppermute_of_an_unbatched_operand_sends_zeros_where_no_pair_points():
    const = distinct((3,), 16)
    out = fnx.vmap(lambda _: lax.ppermute(const, "i", [(0, 1)]), axis_name="i")(np.zeros(3, np.float32))
    np.testing.assert_array_equal(np.asarray(out), [np.zeros(3), const, np.zeros(3)])


def test_collectives_map_over_pytrees():
    jax = _jax()
    xs = {"a": distinct((4, 4, 2), 17), "b": (distinct((4, 8), 18, np.int32),)}

    def f(L):
        return lambda t: (L.psum_scatter(t, "i", tiled=True), L.ppermute(t, "i", ring(4)),
                          L.all_to_all(t, "i", 0, 0, tiled=True))
    assertions.assert_tree_close(vmapped(f(lax), xs), jax.vmap(f(jax.lax), axis_name="i")(xs), rtol=0, atol=0,
                                 exact_dtypes=True)


def test_axis_size_is_a_python_int():
    sizes = []
    fnx.vmap(fnx.vmap(lambda x: sizes.append((lax.axis_size("i"), lax.axis_size("j"), lax.axis_size(("i", "j"))))
                      or x, axis_name="j"), axis_name="i")(np.zeros((2, 3), np.float32))
    assert sizes == [(2, 3, 6)] and all(type(s) is int for s in sizes[0])


# ---- errors ----

def test_chunks_that_do_not_fit_raise_naming_the_op_axis_and_shape():
    xs = np.zeros((4, 6, 3), np.float32)
    with pytest.raises(ValueError, match=r"psum_scatter: scatter_dimension 0 .*\(6, 3\).*divisible by the size 4 "
                                         r"of axis name 'i'"):
        vmapped(lambda x: lax.psum_scatter(x, "i", tiled=True), xs)
    with pytest.raises(ValueError, match=r"psum_scatter: scatter_dimension 1 .*\(6, 3\).*equal the size 4"):
        vmapped(lambda x: lax.psum_scatter(x, "i", scatter_dimension=-1), xs)
    with pytest.raises(ValueError, match=r"all_to_all: split_axis 0 .*\(6, 3\).*divisible by the size 4"):
        vmapped(lambda x: lax.all_to_all(x, "i", 0, 1, tiled=True), xs)
    with pytest.raises(ValueError, match=r"all_to_all: split_axis 1 .*\(6, 3\).*equal the size 4"):
        vmapped(lambda x: lax.all_to_all(x, "i", 1, 0), xs)
    with pytest.raises(ValueError, match="all_to_all: axis 2 is out of bounds"):
        vmapped(lambda x: lax.all_to_all(x, "i", 0, 2), xs)


@pytest.mark.parametrize("perm,message", [
    ([(0, 4)], r"perm \[\(0, 4\)\] over axis name 'i' of size 4"), ([(-1, 0)], "size 4"),
    ([(0, 1), (0, 2)], "no source or destination twice"), ([(0, 1), (2, 1)], "no source or destination twice"),
    ([(0, 1, 2)], "pairs of ints"), ([0, 1], "pairs of ints"), ([(0.5, 1)], "pairs of ints")])
def test_bad_perms_raise_naming_the_perm_and_size(perm, message):
    with pytest.raises(ValueError, match="ppermute: .*" + message):
        vmapped(lambda x: lax.ppermute(x, "i", perm), np.zeros((4, 2), np.float32))


@pytest.mark.parametrize("call", [lambda x: lax.psum_scatter(x, "nope"), lambda x: lax.ppermute(x, "nope", []),
                                  lambda x: lax.all_to_all(x, "nope", 0, 0), lambda x: lax.axis_size("nope")],
                         ids=["psum_scatter", "ppermute", "all_to_all", "axis_size"])
def test_unbound_names_raise(call):
    with pytest.raises(NameError, match="unbound axis name 'nope'.*vmap.*or shard_map"):
        vmapped(call, np.zeros((4, 4), np.float32))
    with pytest.raises(NameError, match="unbound axis name 'nope'"):
        call(np.zeros(4, np.float32))


def test_axis_index_groups_and_several_names_are_unsupported():
    xs = np.zeros((2, 4), np.float32)
    with pytest.raises(UnsupportedError, match="psum_scatter: axis_index_groups"):
        vmapped(lambda x: lax.psum_scatter(x, "i", axis_index_groups=[[0, 1]]), xs)
    with pytest.raises(UnsupportedError, match="all_to_all: axis_index_groups"):
        vmapped(lambda x: lax.all_to_all(x, "i", 0, 0, axis_index_groups=[[0, 1]]), xs)
    nested = lambda f: fnx.vmap(fnx.vmap(f, axis_name="j"), axis_name="i")(np.zeros((2, 2, 4)))  # noqa: E731
    with pytest.raises(UnsupportedError, match=r"ppermute over several axis names \('i', 'j'\)"):
        nested(lambda x: lax.ppermute(x, ("i", "j"), [(0, 1)]))
    with pytest.raises(UnsupportedError, match="all_to_all over several axis names"):
        nested(lambda x: lax.all_to_all(x, ("i", "j"), 0, 0, tiled=True))


def test_ir_rejects_chunks_that_do_not_fit():
    x = UOp.const(dtypes.float32, 0.0, (6, 4))
    with pytest.raises(ShapeError, match=r"COLLECTIVE: psum_scatter: axis 0 of shape \(6, 4\).*4 chunks.*'i'"):
        UOp(Ops.COLLECTIVE, dtypes.float32, (x,), CollectiveArg("psum_scatter", "i", 4, 0))
    with pytest.raises(ShapeError, match="all_to_all: axis 1 .* 3 chunks"):
        UOp(Ops.COLLECTIVE, dtypes.float32, (x,), CollectiveArg("all_to_all", "i", 3, 0, split_axis=1))
    out = UOp(Ops.COLLECTIVE, dtypes.float32, (x,), CollectiveArg("all_to_all", "i", 2, 0, split_axis=1))
    assert out.shape == (12, 2)
    assert UOp(Ops.COLLECTIVE, dtypes.float32, (x,), CollectiveArg("ppermute", "i", 2, 0, ((0, 1),))).shape == (6, 4)
