"""Sorting, searching, unique and quantiles (fnx/numpy_sorting.py, fnx/lax_sort.py) against jax.numpy / jax.lax
(the oracle: JAX defines the order of NaN, -0.0 and ties) and numpy: every dtype family, axes, descending, NaN and
signed zeros, empty and odd sizes; grads of the gathered values against jax.grad; vmap and jit equal eager."""
import numpy as np
import pytest

import fnx
import fnx.lax as lax
import fnx.numpy as jnp
from fnx.lax_sort import SELECT_MAX_K

jax = pytest.importorskip("jax")
J = jax.numpy

RNG = np.random.default_rng(3)
SPECIAL = np.array([3.0, 1.0, np.nan, 1.0, -0.0, 0.0, -np.inf, 2.0, np.inf, -np.nan, -1.5], np.float32)


def _data(dtype, shape):
    if dtype == np.bool_: return RNG.random(shape) < 0.5
    if np.dtype(dtype).kind in "iu":
        info = np.iinfo(dtype)
        return RNG.integers(max(info.min, -100), min(info.max, 100), shape).astype(dtype)
    x = RNG.standard_normal(shape).astype(dtype)
    x.flat[::7] = 1.0  # (ties)
    return x


def _same(ours, theirs):
    ours, theirs = np.asarray(ours), np.asarray(theirs)
    assert ours.shape == theirs.shape and ours.dtype == theirs.dtype, (ours.shape, theirs.shape, ours.dtype,
                                                                       theirs.dtype)
    ours, theirs = ours.reshape(ours.shape or (1,)), theirs.reshape(theirs.shape or (1,))  # (0-d: no byte view)
    np.testing.assert_array_equal(ours.view(np.uint8) if ours.dtype.kind == "f" else ours,
                                  theirs.view(np.uint8) if theirs.dtype.kind == "f" else theirs)  # (bits: -0, NaN)


@pytest.mark.parametrize("dtype", [np.float32, np.float16, np.int8, np.uint32, np.int32, np.bool_])
@pytest.mark.parametrize("axis", [-1, 0, None])
@pytest.mark.parametrize("descending", [False, True])
def test_sort_and_argsort_match_jax(dtype, axis, descending):
    x = _data(dtype, (5, 13))
    _same(jnp.sort(x, axis=axis, descending=descending), J.sort(x, axis=axis, descending=descending))
    _same(jnp.argsort(x, axis=axis, descending=descending), J.argsort(x, axis=axis, descending=descending))


def test_special_floats_and_sizes():
    for f in ("sort", "argsort"):
        _same(getattr(jnp, f)(SPECIAL), getattr(J, f)(SPECIAL))
        _same(getattr(jnp, f)(SPECIAL, descending=True), getattr(J, f)(SPECIAL, descending=True))
    for n in (0, 1, 2, 1000):
        x = RNG.standard_normal(n).astype(np.float32)
        _same(jnp.sort(x), np.sort(x))
    with fnx.enable_x64():  # a float64 sort (with x64 off, the input narrows to float32, as in JAX)
        wide = np.asarray(jnp.sort(SPECIAL.astype(np.float64)))
    assert wide.dtype == np.float64
    assert np.asarray(jnp.sort(SPECIAL.astype(np.float64))).dtype == np.float32
    _same(wide.astype(np.float32), J.sort(SPECIAL))


def test_lexsort_partition_searchsorted():
    a, b = RNG.integers(0, 3, 20), RNG.integers(0, 3, 20)
    _same(jnp.lexsort([a, b]), J.lexsort([a, b]))
    x = RNG.integers(0, 50, (4, 9)).astype(np.int32)
    for kth in (0, 3, 8, -1):
        _same(jnp.partition(x, kth), J.partition(x, kth))
        _same(jnp.argpartition(x, kth), J.argpartition(x, kth))
    sorted_ = np.array([1.0, 2.0, 2.0, 3.5, np.nan], np.float32)
    v = np.array([[2.0, np.nan], [0.0, 9.0]], np.float32)
    for side in ("left", "right"):
        _same(jnp.searchsorted(sorted_, v, side=side), J.searchsorted(sorted_, v, side=side))
    perm = RNG.permutation(5)
    _same(jnp.searchsorted(sorted_[np.argsort(perm)], v, sorter=np.argsort(np.argsort(perm))),
          np.searchsorted(sorted_[np.argsort(perm)], v, sorter=np.argsort(np.argsort(perm))).astype(np.int32))


@pytest.mark.parametrize("size,fill", [(None, None), (6, None), (2, None), (8, -7)])
def test_unique_matches_jax(size, fill):
    x = np.array([[3, 1, 3], [2, 2, 9]], np.int32)
    kwargs = dict(return_index=True, return_inverse=True, return_counts=True, size=size, fill_value=fill)
    for ours, theirs in zip(jnp.unique(x, **kwargs), J.unique(x, **kwargs)): _same(ours, theirs)
    f = np.array([1.0, np.nan, -0.0, 0.0, np.nan, 1.0], np.float32)
    _same(jnp.unique(f), J.unique(f))
    _same(jnp.unique(f, equal_nan=False), J.unique(f, equal_nan=False))
    _same(fnx.jit(lambda x: jnp.unique(x, size=4))(x), J.unique(x, size=4))
    assert [np.asarray(a).tolist() for a in jnp.unique_counts(x)] == [np.asarray(a).tolist()
                                                                     for a in J.unique_counts(x)]
    with pytest.raises(fnx.errors.ConcretizationError, match="unique: .*size="):
        fnx.jit(jnp.unique)(x)


@pytest.mark.parametrize("method", ["linear", "lower", "higher", "midpoint", "nearest"])
def test_quantiles_match_numpy(method):
    x = RNG.standard_normal((6, 7)).astype(np.float32)
    for axis in (None, 0, 1, (0, 1)):
        for q in (0.5, [0.0, 0.25, 1.0]):
            np.testing.assert_allclose(np.asarray(jnp.quantile(x, q, axis=axis, method=method)),
                                       np.quantile(x, q, axis=axis, method=method), rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(np.asarray(jnp.percentile(x, [10, 90], axis=1, method=method, keepdims=True)),
                               np.percentile(x, [10, 90], axis=1, method=method, keepdims=True), rtol=1e-6,
                               atol=1e-6)
    y = x.copy()
    y[1, 2] = y[4, 4] = np.nan
    y[:, 5] = np.nan
    # (atol: a point between two values of opposite signs is small, and rounds to within an ulp of theirs, not its
    # own; which data the shared RNG gives depends on the tests run before in the process)
    np.testing.assert_allclose(np.asarray(jnp.nanquantile(y, 0.3, axis=0, method=method)),
                               np.nanquantile(y, 0.3, axis=0, method=method), rtol=1e-6, atol=1e-6, equal_nan=True)
    np.testing.assert_allclose(np.asarray(jnp.median(y, axis=1)), np.median(y, axis=1), rtol=1e-6, atol=1e-6,
                               equal_nan=True)
    np.testing.assert_allclose(np.asarray(jnp.nanmedian(y)), np.nanmedian(y), rtol=1e-6, atol=1e-6)


def test_lax_sort_top_k_and_key_val():
    keys, vals = RNG.integers(0, 4, (3, 10)).astype(np.int32), RNG.standard_normal((3, 10)).astype(np.float32)
    second = RNG.integers(0, 2, (3, 10)).astype(np.int32)
    for ours, theirs in zip(lax.sort((keys, second, vals), num_keys=2), jax.lax.sort((keys, second, vals),
                                                                                     num_keys=2)):
        _same(ours, theirs)
    for ours, theirs in zip(lax.sort_key_val(keys, vals, dimension=0), jax.lax.sort_key_val(keys, vals, 0)):
        _same(ours, theirs)
    x = np.array([[1.0, 3.0, 3.0, np.nan, -0.0, 0.0], [5.0, 4.0, 4.0, 4.0, 1.0, 2.0]], np.float32)
    for k in (0, 1, 3, 6):
        for ours, theirs in zip(lax.top_k(x, k), jax.lax.top_k(x, k)): _same(ours, theirs)
    with pytest.raises(ValueError, match="top_k: k=7"):
        lax.top_k(x, 7)


@pytest.mark.parametrize("dtype", [np.float32, np.float16, np.int32, np.int8, np.uint8, np.bool_])
def test_top_k_by_selection_is_jaxs(dtype):
    """top_k of up to SELECT_MAX_K entries selects them round by round (fnx/lax_sort.py `_selected`), above that
    it sorts: both give JAX's values and indices for every dtype, with NaN, infinities, signed zeros, ties and the
    integer extremes (the selection's own sentinel value among them), under jit and vmap; the grad of the values
    is JAX's."""
    x = _data(dtype, (6, 300))
    if dtype in (np.float32, np.float16): x[:, :11] = SPECIAL.astype(dtype)
    if np.dtype(dtype).kind in "iu": x[:, :4] = [np.iinfo(dtype).min, np.iinfo(dtype).max, 0, np.iinfo(dtype).min]
    for k in (1, 5, SELECT_MAX_K, SELECT_MAX_K + 1):
        for ours, theirs in zip(fnx.jit(lambda x: lax.top_k(x, k))(x), jax.lax.top_k(x, k)): _same(ours, theirs)
    xs = _data(dtype, (3, 4, 50))
    for ours, theirs in zip(fnx.vmap(lambda r: lax.top_k(r, 4))(xs), jax.vmap(lambda r: jax.lax.top_k(r, 4))(xs)):
        _same(ours, theirs)
    if dtype == np.float32:
        w = RNG.standard_normal((6, 7)).astype(np.float32)
        g = fnx.grad(lambda x: (lax.top_k(x, 7)[0] * w).sum())(x[:, 11:])
        _same(g, jax.grad(lambda x: (jax.lax.top_k(x, 7)[0] * w).sum())(x[:, 11:]))


def test_grads_vmap_and_jit():
    x = RNG.standard_normal((4, 9)).astype(np.float32)
    weights = RNG.standard_normal((4, 9)).astype(np.float32)

    def loss(np_, lax_):
        return lambda x: (np_.sort(x, axis=1) * weights).sum() + lax_.top_k(x, 3)[0].sum() + \
            np_.quantile(x, 0.3, axis=0).sum() + np_.median(x)
    np.testing.assert_allclose(np.asarray(fnx.grad(loss(jnp, lax))(x)), np.asarray(jax.grad(loss(J, jax.lax))(x)),
                               rtol=1e-5, atol=1e-6)
    _same(fnx.vmap(jnp.sort)(x), np.sort(x, axis=1))
    _same(fnx.vmap(lambda r: jnp.argsort(r, descending=True), in_axes=1)(x), J.argsort(x, axis=0,
                                                                                       descending=True).T)
    _same(fnx.jit(lambda x: jnp.sort(x, axis=0))(x), np.sort(x, axis=0))


def test_errors():
    with pytest.raises(ValueError, match="searchsorted: a must be 1-d"):
        jnp.searchsorted(np.ones((2, 2)), 1.0)
    with pytest.raises(ValueError, match="quantile: method"):
        jnp.quantile(np.ones(3), 0.5, method="cubic")
    with pytest.raises(ValueError, match="partition: kth=5"):
        jnp.partition(np.ones(3), 5)
    with pytest.raises(NotImplementedError, match="unique: axis="):
        jnp.unique(np.ones((2, 2)), axis=0)


@pytest.mark.parametrize("a,b", [([5, 1, 3, 3, 7, 1], [3, 9, 1, 1]), ([2, 2], [2]), ([], [1, 2]),
                                 ([0.5, -1.0, 2.0, -0.0], [0.0, 2.0, 8.0])])
def test_set_functions_match_jax(a, b):
    dtype = np.float32 if any(isinstance(v, float) for v in a + b) else np.int32
    a, b = np.array(a, dtype), np.array(b, dtype)
    for name in ("union1d", "setdiff1d", "setxor1d", "intersect1d"):
        _same(getattr(jnp, name)(a, b), getattr(J, name)(a, b))
        jitted = fnx.jit(lambda a, b, name=name: getattr(jnp, name)(a, b, size=5))(a, b)
        _same(jitted, jax.jit(lambda a, b, name=name: getattr(J, name)(a, b, size=5))(a, b))
        _same(getattr(jnp, name)(a, b, size=6, fill_value=-3), getattr(J, name)(a, b, size=6, fill_value=-3))
    for ours, theirs in zip(jnp.intersect1d(a, b, return_indices=True), J.intersect1d(a, b, return_indices=True)):
        np.testing.assert_array_equal(np.asarray(ours), np.asarray(theirs))
    _same(jnp.isin(a, b), J.isin(a, b))
    _same(jnp.isin(a.reshape(-1, 1) if a.size else a, b, invert=True), J.isin(a.reshape(-1, 1) if a.size else a, b,
                                                                            invert=True))
    with pytest.raises(fnx.errors.ConcretizationError, match="setdiff1d: .*size="):
        fnx.jit(jnp.setdiff1d)(a, b)


def test_a_negative_nan_constant_alive_elsewhere_keeps_nans_last():
    # hash-consing once keyed float constants by float.hex(), which writes every NaN as "nan": a -nan constant kept
    # alive by an earlier program stood in for the sort's +nan (its keys read the sign bit), and NaNs sorted first
    for dtype, x64 in ((np.float64, True), (np.float32, False)):
        x = SPECIAL.astype(dtype)
        with fnx.enable_x64(x64):
            held = fnx.jit(lambda v: jnp.where(jnp.isnan(v), -np.nan, v))  # (its graph holds -nan constants)
            flipped = np.asarray(held(x))
            assert np.signbit(flipped[np.isnan(x)]).all()
            ours, order = np.asarray(jnp.sort(x)), np.asarray(jnp.argsort(x))
        _same(ours.astype(np.float32), J.sort(SPECIAL))  # (float64 to float32 keeps each NaN's bits' sign)
        _same(order.astype(np.int32), J.argsort(SPECIAL))  # (int64 with x64 on, as in JAX)
        del held


def test_quantiles_at_infinities_and_signed_zeros():
    # lo + (hi - lo) * t gave NaN between two equal infinities (JAX: inf); at a whole index JAX and numpy weight the
    # next value by 0 and give NaN when it is infinite: fnx gives the value at that index
    cases = [([np.inf, np.inf], 0.5), ([-np.inf, np.nan, -np.inf], 0.5), ([-0.0, -0.0], 0.5), ([1.0, np.inf], 0.5),
             ([-np.inf, -np.inf, 2.0, 5.0], 0.25)]
    for values, q in cases:
        a = np.array(values, np.float32)
        for ours, theirs in ((jnp.nanquantile(a, q), J.nanquantile(a, q)), (jnp.nanmedian(a), J.nanmedian(a))):
            _same(ours, theirs)
        if not np.isnan(a).any():
            _same(jnp.quantile(a, q), J.quantile(a, q))
            _same(jnp.median(a), J.median(a))
    for values, q, want in (([1.0, np.inf], 1.0, np.inf), ([np.inf], 0.5, np.inf), ([-np.inf, 1.0], 0.0, -np.inf),
                            ([1.0, 2.0, np.inf], 1.0, np.inf), ([np.inf] * 3, 0.5, np.inf)):
        for method in ("linear", "nearest", "higher", "lower"):
            assert float(jnp.quantile(np.array(values, np.float32), q, method=method)) == want
    jitted = fnx.jit(lambda a: jnp.median(a, axis=1))(np.array([[np.inf, np.inf], [1.0, 3.0]], np.float32))
    np.testing.assert_array_equal(np.asarray(jitted), [np.inf, 2.0])


def test_eager_sorts_and_quantiles_trace_once_per_signature():
    """sort, argsort and the quantiles run as jitted functions (as JAX's lax.sort is one primitive): a second eager
    call on arrays of the same shape traces and lowers nothing (the network's graph was built again each call:
    percentile of 1,024 values took 9 ms a call)."""
    from fnx import events
    rng = np.random.default_rng(7)
    calls = [(jnp.sort, np.sort), (jnp.argsort, lambda v: np.argsort(v, kind="stable")), (jnp.median, np.median),
             (lambda v: jnp.percentile(v, 30.0), lambda v: np.percentile(v, 30.0))]
    for ours, _ in calls: ours(jnp.asarray(rng.standard_normal((16, 64)).astype(np.float32)))
    x = rng.standard_normal((16, 64)).astype(np.float32)
    seen = []
    stop = events.listen(lambda e: seen.append(e.name) if e.cat in ("trace", "lower") else None)
    try:
        results = [ours(jnp.asarray(x)) for ours, _ in calls]
    finally:
        stop()
    assert seen == []
    for got, (_, want) in zip(results, calls):
        np.testing.assert_allclose(np.asarray(got), want(x), rtol=1e-6)
