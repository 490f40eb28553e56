"""fnx.random: Threefry known answers, bit-exact agreement with jax.random (the oracle), jit, and statistics."""
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import fnx
import fnx.numpy as jnp
import fnx.random as random

# Random123's known-answer vectors for Threefry-2x32 with 20 rounds: (key, counter, expected output)
THREEFRY_KAT = [
    ((0x00000000, 0x00000000), (0x00000000, 0x00000000), (0x6B200159, 0x99BA4EFE)),
    ((0xFFFFFFFF, 0xFFFFFFFF), (0xFFFFFFFF, 0xFFFFFFFF), (0x1CB996FC, 0xBB002BE7)),
    ((0x13198A2E, 0x03707344), (0x243F6A88, 0x85A308D3), (0xC4923A9C, 0x483DF7A0)),
]
SHAPES = [(), (0,), (3, 5), (7,), (257,)]


@pytest.fixture
def jr():
    """jax.random, the oracle (tests using it skip without jax)."""
    return pytest.importorskip("jax").random


def assert_bits_equal(ours, theirs):
    ours, theirs = np.asarray(ours), np.asarray(theirs)
    assert ours.shape == theirs.shape and ours.dtype == theirs.dtype, (ours.dtype, ours.shape, theirs.dtype,
                                                                       theirs.shape)
    if ours.dtype.kind == "f":  # compare bits: exact, and NaN-safe
        ours, theirs = ours.reshape(-1).view(np.uint8), theirs.reshape(-1).view(np.uint8)
    np.testing.assert_array_equal(ours, theirs)


# ---- the hash itself, without JAX ----

@pytest.mark.parametrize("key, counter, expected", THREEFRY_KAT)
def test_threefry_known_answers(device, key, counter, expected):
    out = random.threefry_2x32(np.array(key, np.uint32), np.array(counter, np.uint32))
    assert np.asarray(out).tolist() == list(expected)


def test_threefry_under_jit_and_odd_sizes():
    key = np.array(THREEFRY_KAT[2][0], np.uint32)
    counts = np.arange(7, dtype=np.uint32).reshape(7)
    eager = np.asarray(random.threefry_2x32(key, counts))
    jitted = np.asarray(fnx.jit(random.threefry_2x32)(jnp.asarray(key), jnp.asarray(counts)))
    np.testing.assert_array_equal(eager, jitted)
    # an odd count is padded with a zero; the pair (counts[i], counts[i + 4]) forms one block
    padded = np.asarray(random.threefry_2x32(key, np.append(counts, np.uint32(0))))
    np.testing.assert_array_equal(eager, padded[:7])
    kat_key, kat_counter, kat_out = THREEFRY_KAT[2]
    block = np.asarray(random.threefry_2x32(np.array(kat_key, np.uint32), np.array(kat_counter, np.uint32)))
    assert block.tolist() == list(kat_out)


def test_key_errors():
    with pytest.raises(TypeError):
        random.uniform(np.zeros(3, np.uint32), (2,))
    with pytest.raises(TypeError):
        random.split(np.zeros(2, np.int32))
    with pytest.raises(OverflowError):
        random.PRNGKey(2 ** 64)
    with pytest.raises(ValueError):
        random.uniform(random.PRNGKey(0), (2,), jnp.int32)
    with pytest.raises(TypeError):
        random.randint(random.PRNGKey(0), (2,), 0, 5, jnp.float32)


def test_typed_keys_hold_prngkey_data():
    k = random.key(5)
    assert k.shape == () and str(k.dtype) == "key<fry>"
    assert_bits_equal(random.key_data(k), random.PRNGKey(5))
    assert_bits_equal(random.key_data(random.wrap_key_data(np.asarray(random.key_data(k)))), random.PRNGKey(5))
    assert_bits_equal(random.normal(k, (4,)), random.normal(random.PRNGKey(5), (4,)))  # same bits either way
    with pytest.raises(TypeError, match="single PRNG key"):
        random.normal(random.split(k, 2), (3,))


def test_typed_keys_print_split_and_travel_as_jax():
    jax = pytest.importorskip("jax")
    k, jk = random.key(3), jax.random.key(3)
    assert repr(k) == repr(jk) and repr(random.split(k, 3)) == repr(jax.random.split(jk, 3))
    keys, jkeys = random.split(k, 4), jax.random.split(jk, 4)
    assert isinstance(keys, random.KeyArray) and keys.shape == (4,) and len(list(keys)) == 4
    for ours, theirs in [(keys[2], jkeys[2]), (random.fold_in(k, 9), jax.random.fold_in(jk, 9)),
                         (random.clone(k), jax.random.clone(jk))]:
        assert isinstance(ours, random.KeyArray)
        assert_bits_equal(random.key_data(ours), np.asarray(jax.random.key_data(theirs)))
    sample = lambda r: lambda key: r.uniform(r.fold_in(key, 1), (3,))  # noqa: E731
    assert_bits_equal(fnx.jit(fnx.vmap(sample(random)))(keys), np.asarray(jax.jit(jax.vmap(sample(jax.random)))(jkeys)))
    final, _ = fnx.lax.scan(lambda c, _: (random.split(c)[0], None), k, None, length=3)
    jfinal, _ = jax.lax.scan(lambda c, _: (jax.random.split(c)[0], None), jk, None, length=3)
    assert isinstance(final, random.KeyArray)
    assert_bits_equal(random.key_data(final), np.asarray(jax.random.key_data(jfinal)))
    assert random.key_dtype() == "key<fry>" and random.key_impl(k) == "threefry2x32"


# ---- bit-exact agreement with jax.random ----

@pytest.mark.parametrize("seed", [0, 1, -1, 42, 2 ** 32 + 5, 2 ** 63 - 1, -2 ** 40, np.int32(-7), np.int8(-3),
                                  np.uint64(2 ** 64 - 1)])
def test_prngkey_matches_jax(jr, seed):
    assert_bits_equal(random.PRNGKey(seed), jr.PRNGKey(seed))


def test_split_and_fold_in_match_jax(jr, device):
    k, jk = random.PRNGKey(42), jr.PRNGKey(42)
    for num in (2, 3, (2, 3), 1):
        assert_bits_equal(random.split(k, num), jr.split(jk, num))
    for data in (0, 7, 2 ** 31, np.uint32(2 ** 32 - 1)):
        assert_bits_equal(random.fold_in(k, data), jr.fold_in(jk, data))


@pytest.mark.parametrize("shape", SHAPES)
def test_samplers_match_jax(jr, shape):
    k, jk = random.PRNGKey(7), jr.PRNGKey(7)
    assert_bits_equal(random.bits(k, shape), jr.bits(jk, shape))
    assert_bits_equal(random.uniform(k, shape), jr.uniform(jk, shape))
    assert_bits_equal(random.uniform(k, shape, minval=-2.0, maxval=3.5), jr.uniform(jk, shape, minval=-2.0,
                                                                                     maxval=3.5))
    assert_bits_equal(random.normal(k, shape), jr.normal(jk, shape))
    assert_bits_equal(random.randint(k, shape, -3, 17), jr.randint(jk, shape, -3, 17))
    assert_bits_equal(random.bernoulli(k, 0.3, shape), jr.bernoulli(jk, 0.3, shape))
    assert_bits_equal(random.gumbel(k, shape), jr.gumbel(jk, shape))
    assert_bits_equal(random.truncated_normal(k, -1.5, 0.7, shape), jr.truncated_normal(jk, -1.5, 0.7, shape))


def test_float32_transforms_match_jax_on_many_samples(jr, device):
    # 20k samples reach the polynomial pieces and branch points of log, log1p, erfinv and erf
    k, jk = random.PRNGKey(3), jr.PRNGKey(3)
    assert_bits_equal(random.normal(k, (20000,)), jr.normal(jk, (20000,)))
    assert_bits_equal(random.gumbel(k, (20000,)), jr.gumbel(jk, (20000,)))
    assert_bits_equal(random.gumbel(k, (2000,), mode="high"), jr.gumbel(jk, (2000,), mode="high"))
    assert_bits_equal(random.truncated_normal(k, -2.0, 3.0, (20000,)), jr.truncated_normal(jk, -2.0, 3.0, (20000,)))


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_16bit_floats_match_jax(jr, dtype):
    k, jk = random.PRNGKey(1), jr.PRNGKey(1)
    assert_bits_equal(random.uniform(k, (500,), dtype), jr.uniform(jk, (500,), dtype))
    assert_bits_equal(random.normal(k, (500,), dtype), jr.normal(jk, (500,), dtype))


@pytest.mark.parametrize("dtype, lo, hi", [("int8", -200, 300), ("uint8", 0, 256), ("int16", -5, 5),
                                           ("uint32", 0, 200), ("int32", 5, 3), ("int32", -2 ** 31, 2 ** 31 - 1)])
def test_randint_dtypes_and_bounds_match_jax(jr, dtype, lo, hi):
    assert_bits_equal(random.randint(random.PRNGKey(2), (300,), lo, hi, dtype),
                      jr.randint(jr.PRNGKey(2), (300,), lo, hi, dtype))


def test_array_parameters_match_jax(jr):
    k, jk = random.PRNGKey(5), jr.PRNGKey(5)
    lows = np.array([0, 10, 100], np.int32)
    assert_bits_equal(random.randint(k, (4, 3), lows, 1000), jr.randint(jk, (4, 3), lows, 1000))
    p = np.array([0.1, 0.5, 0.9], np.float32)
    assert_bits_equal(random.bernoulli(k, p, (4, 3)), jr.bernoulli(jk, p, (4, 3)))
    assert_bits_equal(random.bernoulli(k, p), jr.bernoulli(jk, p))
    lower = np.array([-1.0, 0.0, 1.0], np.float32)
    assert_bits_equal(random.truncated_normal(k, lower, 3.0), jr.truncated_normal(jk, lower, 3.0))
    assert_bits_equal(random.truncated_normal(k, -np.inf, 0.5, (50,)), jr.truncated_normal(jk, -np.inf, 0.5, (50,)))
    assert_bits_equal(random.uniform(k, (2, 3), minval=lower, maxval=4.0),
                      jr.uniform(jk, (2, 3), minval=lower, maxval=4.0))


def test_64bit_types_match_jax_x64(jr):
    jax = pytest.importorskip("jax")
    k = random.PRNGKey(3)
    with jax.enable_x64(True), fnx.enable_x64(True):
        jk = jr.PRNGKey(3)
        assert_bits_equal(random.bits(k, (100,), jnp.uint64), jr.bits(jk, (100,), "uint64"))
        assert_bits_equal(random.uniform(k, (100,), jnp.float64, -3.0, 5.0),
                          jr.uniform(jk, (100,), "float64", -3.0, 5.0))
        assert_bits_equal(random.randint(k, (100,), -10 ** 12, 10 ** 15, jnp.int64),
                          jr.randint(jk, (100,), -10 ** 12, 10 ** 15, "int64"))
        # float64 normal uses fnx's log where XLA calls libm: equal to a few ulp
        np.testing.assert_allclose(random.normal(k, (1000,), jnp.float64), jr.normal(jk, (1000,), "float64"),
                                   rtol=1e-14, atol=1e-15)


def test_categorical_matches_jax(jr):
    k, jk = random.PRNGKey(9), jr.PRNGKey(9)
    logits = np.random.RandomState(0).randn(4, 7).astype(np.float32)
    assert_bits_equal(random.categorical(k, logits), jr.categorical(jk, logits))
    assert_bits_equal(random.categorical(k, logits, axis=0), jr.categorical(jk, logits, axis=0))
    assert_bits_equal(random.categorical(k, logits, shape=(3, 4)), jr.categorical(jk, logits, shape=(3, 4)))
    assert_bits_equal(random.categorical(k, logits, axis=0, shape=(2, 7)),
                      jr.categorical(jk, logits, axis=0, shape=(2, 7)))
    assert_bits_equal(random.categorical(k, logits, shape=(5, 4), replace=False),
                      jr.categorical(jk, logits, shape=(5, 4), replace=False))


@pytest.mark.parametrize("n", [1, 5, 100, 2000])  # 2000 elements take two sorting rounds
def test_permutation_matches_jax(jr, n):
    assert_bits_equal(random.permutation(random.PRNGKey(4), n), jr.permutation(jr.PRNGKey(4), n))


def test_permutation_of_arrays_matches_jax(jr):
    k, jk = random.PRNGKey(4), jr.PRNGKey(4)
    x = np.arange(24, dtype=np.int32).reshape(4, 6)
    assert_bits_equal(random.permutation(k, x), jr.permutation(jk, x))
    assert_bits_equal(random.permutation(k, x, axis=1), jr.permutation(jk, x, axis=1))
    assert_bits_equal(random.permutation(k, x, axis=1, independent=True),
                      jr.permutation(jk, x, axis=1, independent=True))


def test_choice_matches_jax(jr):
    k, jk = random.PRNGKey(6), jr.PRNGKey(6)
    p = np.array([0.1, 0.2, 0.3, 0.4], np.float32)
    assert_bits_equal(random.choice(k, 10, (5,)), jr.choice(jk, 10, (5,)))
    assert_bits_equal(random.choice(k, 10, (5,), replace=False), jr.choice(jk, 10, (5,), replace=False))
    assert_bits_equal(random.choice(k, 4, (20,), p=p), jr.choice(jk, 4, (20,), p=p))
    assert_bits_equal(random.choice(k, 4, (3,), replace=False, p=p), jr.choice(jk, 4, (3,), replace=False, p=p))
    a = np.arange(12, dtype=np.float32).reshape(3, 4)
    assert_bits_equal(random.choice(k, a, (2,), axis=1), jr.choice(jk, a, (2,), axis=1))


@given(shape=st.lists(st.integers(0, 5), max_size=3).map(tuple), seed=st.integers(-2 ** 31, 2 ** 31 - 1))
def test_uniform_any_shape_matches_jax(shape, seed):
    jax_random = pytest.importorskip("jax").random
    assert_bits_equal(random.uniform(random.PRNGKey(seed), shape), jax_random.uniform(jax_random.PRNGKey(seed), shape))


# ---- jit ----

def test_jit_matches_eager(jr):
    def sample(key):
        k1, k2, k3 = random.split(key, 3)
        return (random.normal(k1, (3, 5)), random.uniform(k2, (4,)), random.randint(k3, (6,), 0, 9),
                random.fold_in(key, 11), random.truncated_normal(k1, -1.0, 1.0, (3,)))

    key = random.PRNGKey(123)
    jitted, eager = fnx.jit(sample)(key), sample(key)
    for a, b in zip(jitted, eager):
        assert_bits_equal(a, b)
    jk = jr.PRNGKey(123)
    jk1 = jr.split(jk, 3)[0]
    assert_bits_equal(jitted[0], jr.normal(jk1, (3, 5)))


def test_jit_traced_seed():
    keys = fnx.jit(lambda s: random.PRNGKey(s))(np.int32(-5))
    assert_bits_equal(keys, random.PRNGKey(-5))


# ---- statistics ----

def test_uniform_and_normal_moments():
    n = 100_000
    u = np.asarray(random.uniform(random.PRNGKey(0), (n,)), np.float64)
    assert u.min() >= 0.0 and u.max() < 1.0
    assert abs(u.mean() - 0.5) < 5 * np.sqrt(1 / 12 / n)
    assert abs(u.var() - 1 / 12) < 5 * np.sqrt((1 / 80 - 1 / 144) / n)
    z = np.asarray(random.normal(random.PRNGKey(1), (n,)), np.float64)
    assert abs(z.mean()) < 5 / np.sqrt(n)
    assert abs(z.var() - 1.0) < 5 * np.sqrt(2 / n)
    t = np.asarray(random.truncated_normal(random.PRNGKey(2), -1.0, 2.0, (n,)))
    assert t.min() > -1.0 and t.max() < 2.0


def test_split_streams_are_uncorrelated():
    n = 100_000
    k1, k2 = random.split(random.PRNGKey(0))
    a = np.asarray(random.uniform(k1, (n,)), np.float64)
    b = np.asarray(random.uniform(k2, (n,)), np.float64)
    c = np.asarray(random.uniform(random.fold_in(k1, 1), (n,)), np.float64)
    assert abs(np.corrcoef(a, b)[0, 1]) < 5 / np.sqrt(n)
    assert abs(np.corrcoef(a, c)[0, 1]) < 5 / np.sqrt(n)


def test_permutation_is_a_permutation(device):
    for n in (1, 2, 3, 17, 64):
        perm = np.asarray(random.permutation(random.PRNGKey(n), n))
        assert sorted(perm.tolist()) == list(range(n))
    x = np.arange(30, dtype=np.int32).reshape(5, 6)
    rows = np.asarray(random.permutation(random.PRNGKey(0), x, axis=1, independent=True))
    assert all(sorted(r.tolist()) == x[i].tolist() for i, r in enumerate(rows))



def test_eager_permutation_compiles_once(jr):
    """The sorting network is one scanned stage traced once per shape: a second eager call builds the same graph
    and reuses its executable (the unrolled network was 66 kernels to compile; a scan traced per call compiled anew
    each time). Results stay JAX's bits."""
    from fnx.backends.device import _executables
    first = random.permutation(random.PRNGKey(1), 2000)
    compiled = len(_executables)
    second = random.permutation(random.PRNGKey(2), 2000)
    assert len(_executables) == compiled
    assert_bits_equal(first, jr.permutation(jr.PRNGKey(1), 2000))
    assert_bits_equal(second, jr.permutation(jr.PRNGKey(2), 2000))
    assert_bits_equal(fnx.jit(lambda k: random.permutation(k, 2000))(random.PRNGKey(2)), second)


def test_eager_samplers_trace_once_per_signature(jr):
    """An eager sampler runs as a jitted function with its shape and dtype static, as JAX's do: a second call with
    another key (or minval, or fold_in data) traces nothing; a new shape traces once. Run eagerly, each call traced
    hundreds of threefry ops again (normal of 1000 values: 17 ms a call)."""
    from fnx import events
    traces = []
    stop = events.listen(lambda e: traces.append(e.name) if e.cat == "trace" else None)
    try:
        calls = [lambda k: random.normal(k, (1000,)), lambda k: random.uniform(k, [3, 4], minval=-1.0),
                 lambda k: random.permutation(k, 50), lambda k: random.split(k, 3), lambda k: random.fold_in(k, 2**31)]
        for call in calls: call(random.PRNGKey(0))
        before = len(traces)
        outs = [call(random.PRNGKey(5)) for call in calls]
        assert len(traces) == before, traces[before:]
        random.normal(random.PRNGKey(5), (7, 1, 13, 1))  # (a shape no other test draws: this process's jit
        assert len(traces) == before + 1                  # caches are shared by the tests it runs)
    finally:
        stop()
    theirs = [jr.normal(jr.PRNGKey(5), (1000,)), jr.uniform(jr.PRNGKey(5), (3, 4), minval=-1.0),
              jr.permutation(jr.PRNGKey(5), 50), jr.split(jr.PRNGKey(5), 3), jr.fold_in(jr.PRNGKey(5), 2**31)]
    for ours, want in zip(outs, theirs): assert_bits_equal(ours, want)


def test_randint_and_bernoulli_ranges():
    r = np.asarray(random.randint(random.PRNGKey(0), (10_000,), -3, 4))
    assert r.min() == -3 and r.max() == 3
    b = np.asarray(random.bernoulli(random.PRNGKey(0), 0.25, (20_000,)))
    assert b.dtype == np.bool_ and abs(b.mean() - 0.25) < 5 * np.sqrt(0.25 * 0.75 / 20_000)
