"""fnx.random's further distributions: bit-exact (or ulp-close) agreement with jax.random for the transforms of
uniform and normal bits, statistics against scipy.stats for the rejection samplers and what builds on them,
jit and vmap, gamma's derivative in alpha, and the argument errors."""
import math

import numpy as np
import pytest

import fnx
import fnx.numpy as jnp
import fnx.random as random

N = 20000


@pytest.fixture
def jr():
    """jax.random, the oracle (tests using it skip without jax)."""
    return pytest.importorskip("jax").random


@pytest.fixture
def stats():
    return pytest.importorskip("scipy.stats")


def assert_bits_equal(ours, theirs):
    ours, theirs = np.asarray(ours), np.asarray(theirs)
    assert ours.shape == theirs.shape and ours.dtype == theirs.dtype, (ours.dtype, ours.shape, theirs.dtype,
                                                                       theirs.shape)
    if ours.dtype.kind == "f":
        ours, theirs = ours.reshape(-1).view(np.uint8), theirs.reshape(-1).view(np.uint8)
    np.testing.assert_array_equal(ours, theirs)


ARRAY_B = np.linspace(0.5, 4.0, 7, dtype=np.float32)
# (name, args after the key, kwargs): the same call on jax.random and fnx.random gives the same bits
EXACT = [
    ("exponential", ((N,),), {}),
    ("laplace", ((N,),), {}),
    ("logistic", ((N,),), {}),
    ("rademacher", ((N,),), {}),
    ("rademacher", ((5, 3),), {"dtype": np.float32}),
    ("rayleigh", (2.0, (N,)), {}),
    ("pareto", (3.0, (N,)), {}),
    ("pareto", (ARRAY_B, (300, 7)), {}),
    ("pareto", (np.full((4, 7), 2.5, np.float32),), {}),
    ("lognormal", (0.7, (N,)), {}),
    ("lognormal", (ARRAY_B, (300, 7)), {}),
    ("triangular", (-1.0, 0.3, 2.0, (N,)), {}),
    ("geometric", (0.2, (N,)), {}),
    ("geometric", (ARRAY_B / 5, (300, 7)), {}),
    ("poisson", (3.0, (N,)), {}),
    ("poisson", (50.0, (N,)), {}),
    ("poisson", (np.array([0.0, 0.5, 9.9, 10.0, 1e3], np.float32), (400, 5)), {}),
    ("binomial", (20.0, 0.3, (N,)), {}),
    ("binomial", (200.0, 0.7, (N,)), {}),
    ("binomial", (np.array([5.0, 50.0, 500.0], np.float32), np.array([0.05, 0.5, 0.9], np.float32), (300, 3)), {}),
    ("exponential", ((257,),), {"dtype": np.float16}),
]


@pytest.mark.parametrize("seed, name, args, kwargs", [(i, *e) for i, e in enumerate(EXACT)],
                         ids=[f"{e[0]}{i}" for i, e in enumerate(EXACT)])
def test_transforms_match_jax_bit_for_bit(jr, seed, name, args, kwargs):
    ours = getattr(random, name)(random.PRNGKey(seed), *args, **kwargs)
    theirs = getattr(jr, name)(jr.PRNGKey(seed), *args, **kwargs)
    assert_bits_equal(ours, theirs)


# Where fnx's float32 tan / pow and XLA's differ in the last bit, or XLA reassociates products of normals
CLOSE = [
    ("cauchy", ((N,),), 1e-6),
    ("maxwell", ((N,),), 1e-6),
    ("double_sided_maxwell", (0.5, 2.0, (N,)), 1e-5),
    ("weibull_min", (2.0, 1.5, (N,)), 1e-6),
    ("wald", (1.7, (N,)), 1e-5),
]


@pytest.mark.parametrize("name, args, rtol", CLOSE, ids=[c[0] for c in CLOSE])
def test_transforms_match_jax_to_an_ulp_or_so(jr, name, args, rtol):
    ours = np.asarray(getattr(random, name)(random.PRNGKey(3), *args))
    theirs = np.asarray(getattr(jr, name)(jr.PRNGKey(3), *args))
    assert ours.shape == theirs.shape and ours.dtype == theirs.dtype
    np.testing.assert_allclose(ours, theirs, rtol=rtol, atol=1e-6)
    assert np.mean(ours == theirs) > 0.5  # mostly bit-equal: the same transform, not merely the same distribution


def test_exp_helper_matches_xla_over_the_whole_range(jr):
    import jax.numpy as jjnp
    x = np.concatenate([np.random.default_rng(0).uniform(-110, 100, 100000).astype(np.float32),
                        np.float32([np.inf, -np.inf, np.nan, 0.0, -0.0, 88.72283935546875, 88.7229, -87.3365, 1e-40])])
    assert_bits_equal(random._exp(jnp.asarray(x)), jjnp.exp(x))


def test_shapes_and_dtypes_follow_jax(jr):
    fk, jk = random.PRNGKey(0), jr.PRNGKey(0)
    a2 = np.ones((2,), np.float32)
    calls = [("gamma", (1.0, (3, 2)), {"dtype": np.float16}), ("dirichlet", (np.ones((2, 3), np.float32),), {}),
             ("dirichlet", (np.ones(3, np.float32), (4,)), {}), ("double_sided_maxwell", (a2, 1.0), {}),
             ("double_sided_maxwell", (a2, 1.0, (3,)), {}), ("weibull_min", (a2, 1.0, (3, 1)), {}),
             ("poisson", (a2,), {}), ("binomial", (np.int32(5), a2 / 2), {}), ("geometric", (0.5,), {}),
             ("rademacher", ((2,),), {})]
    jax = pytest.importorskip("jax")
    for name, args, kwargs in calls:  # (traced, not run: run eagerly, these ten samplers took 18 s of CI's 2 cores)
        ours = fnx.eval_shape(lambda k: getattr(random, name)(k, *args, **kwargs), fk)
        theirs = jax.eval_shape(lambda k: getattr(jr, name)(k, *args, **kwargs), jk)
        assert (ours.shape, np.dtype(ours.dtype)) == (theirs.shape, theirs.dtype), (name, ours.shape, theirs.shape)


# ---- statistics of the gamma-based and rejection samplers against scipy.stats ----

def ks_ok(stats, samples, cdf):
    """The Kolmogorov-Smirnov distance is below its 0.1% critical value (1.95 / sqrt(n))."""
    samples = np.asarray(samples, np.float64).ravel()
    distance = stats.kstest(samples, cdf).statistic
    return distance < 1.95 / math.sqrt(samples.size), distance


def moments_ok(samples, mean, var, k=5.0):
    """Sample mean within k standard errors, sample variance within k of its standard error (normal approx.)."""
    s = np.asarray(samples, np.float64).ravel()
    n = s.size
    mean_ok = abs(s.mean() - mean) < k * math.sqrt(var / n)
    fourth = np.mean((s - mean) ** 4)
    var_ok = abs(s.var() - var) < k * math.sqrt(max(fourth - var ** 2, 1e-30) / n)
    return mean_ok and var_ok, (s.mean(), mean, s.var(), var)


@pytest.mark.parametrize("alpha", [0.05, 0.5, 1.0, 2.5, 40.0])
def test_gamma_distribution(stats, alpha):
    x = random.gamma(random.PRNGKey(1), alpha, (N,))
    assert x.dtype == jnp.float32
    ok, d = ks_ok(stats, x, stats.gamma(alpha).cdf)
    assert ok, d
    ok, m = moments_ok(x, alpha, alpha)
    assert ok, m
    logx = random.loggamma(random.PRNGKey(2), alpha, (N,))
    ok, d = ks_ok(stats, np.exp(np.asarray(logx, np.float64)), stats.gamma(alpha).cdf)
    assert ok, d


def test_loggamma_tiny_alpha_stays_finite(stats):
    logx = np.asarray(random.loggamma(random.PRNGKey(0), 1e-3, (N,)))
    assert np.isfinite(logx).all() and (logx < -50).mean() > 0.9  # gamma itself underflows to 0 here
    # Gamma(a) = Gamma(a + 1) U^(1/a), so Gamma(a)^a = U Gamma(a + 1)^a is nearly uniform for a = 1e-3
    ok, d = ks_ok(stats, np.exp(np.asarray(logx, np.float64) * 1e-3), stats.uniform().cdf)
    assert ok, d


def test_gamma_array_parameters_and_edge_values():
    a = jnp.asarray(np.array([0.3, 1.0, 7.0, 200.0], np.float32))
    x = np.asarray(random.gamma(random.PRNGKey(4), a, (5000, 4)))
    assert np.all(np.abs(x.mean(0) - np.asarray(a)) < 5 * np.sqrt(np.asarray(a) / 5000)), x.mean(0)
    edge = np.asarray(random.gamma(random.PRNGKey(0), np.float32([np.nan, 0.0, np.inf, -1.0])))
    assert np.isnan(edge[0]) and edge[1] == 0 and edge[2] == np.inf and np.isnan(edge[3])


@pytest.mark.parametrize("name, args, dist", [
    ("beta", (0.7, 2.5), lambda s: s.beta(0.7, 2.5)),
    ("chisquare", (3.0,), lambda s: s.chi2(3.0)),
    ("f", (5.0, 9.0), lambda s: s.f(5.0, 9.0)),
    ("t", (4.0,), lambda s: s.t(4.0)),
    ("generalized_normal", (1.5,), lambda s: s.gennorm(1.5)),
    ("generalized_normal", (0.8,), lambda s: s.gennorm(0.8)),
])
def test_gamma_based_distributions(stats, name, args, dist):
    x = getattr(random, name)(random.PRNGKey(5), *args, (N,))
    ok, d = ks_ok(stats, x, dist(stats).cdf)
    assert ok, d


def test_dirichlet_marginals_and_sums(stats):
    alpha = np.array([0.5, 1.0, 3.0], np.float32)
    x = np.asarray(random.dirichlet(random.PRNGKey(6), jnp.asarray(alpha), (N,)))
    assert x.shape == (N, 3)
    np.testing.assert_allclose(x.sum(-1), 1.0, atol=1e-5)
    for i, a in enumerate(alpha):  # each coordinate is Beta(a_i, sum - a_i)
        ok, d = ks_ok(stats, x[:, i], stats.beta(a, alpha.sum() - a).cdf)
        assert ok, (i, d)


def test_ball_radius_and_bounds(stats):
    for p, d in [(2.0, 3), (1.0, 2)]:
        x = np.asarray(random.ball(random.PRNGKey(7), d, p, (N,)), np.float64)
        radius = np.sum(np.abs(x) ** p, -1) ** (1 / p)
        assert x.shape == (N, d) and radius.max() <= 1.0 + 1e-6
        ok, dist = ks_ok(stats, radius ** d, stats.uniform().cdf)  # uniform in the ball: r^d is uniform
        assert ok, (p, d, dist)


@pytest.mark.parametrize("lam", [0.7, 6.0, 25.0, 1000.0])
def test_poisson_distribution(stats, lam):
    k = np.asarray(random.poisson(random.PRNGKey(8), lam, (N,)))
    assert k.dtype == np.int32 and k.min() >= 0
    ok, m = moments_ok(k, lam, lam)
    assert ok, m
    values, counts = np.unique(k, return_counts=True)
    expected = stats.poisson(lam).pmf(values) * N
    common = expected > 50
    chi2 = np.sum((counts[common] - expected[common]) ** 2 / expected[common])
    assert chi2 < stats.chi2(common.sum()).ppf(0.999), chi2


@pytest.mark.parametrize("n, p", [(8, 0.3), (60, 0.5), (1000, 0.97)])
def test_binomial_distribution(stats, n, p):
    k = np.asarray(random.binomial(random.PRNGKey(9), n, p, (N,)))
    assert k.dtype == np.float32 and k.min() >= 0 and k.max() <= n and np.all(k == np.floor(k))
    ok, m = moments_ok(k, n * p, n * p * (1 - p))
    assert ok, m


def test_binomial_and_poisson_edge_values():
    b = np.asarray(random.binomial(random.PRNGKey(0), np.float32([-1, np.nan, np.inf, 0, 5]),
                                   np.float32([0.5, 0.5, 0.5, 0.5, np.nan])))
    assert np.isnan(b[0]) and np.isnan(b[1]) and b[2] == np.inf and b[3] == 0 and np.isnan(b[4])
    assert np.asarray(random.poisson(random.PRNGKey(0), 0.0, (100,))).max() == 0


def test_multinomial_counts():
    p = np.array([0.1, 0.2, 0.3, 0.4], np.float32)
    c = np.asarray(random.multinomial(random.PRNGKey(10), 50.0, jnp.asarray(p), shape=(5000, 4)))
    assert c.shape == (5000, 4) and np.all(c.sum(-1) == 50) and c.min() >= 0
    se = np.sqrt(50 * p * (1 - p) / 5000)
    assert np.all(np.abs(c.mean(0) - 50 * p) < 5 * se), c.mean(0)


# ---- jit and vmap ----

TRANSFORMED = [
    ("exponential", lambda k, a: random.exponential(k, (6,)) * a),
    ("pareto", lambda k, a: random.pareto(k, a, (6,))),
    ("lognormal", lambda k, a: random.lognormal(k, a, (6,))),
    ("weibull_min", lambda k, a: random.weibull_min(k, 1.0, a, (6,))),
    ("gamma", lambda k, a: random.gamma(k, a, (6,))),
    ("poisson", lambda k, a: random.poisson(k, a * 8.0, (6,))),
    ("binomial", lambda k, a: random.binomial(k, 30.0, a / 3.0, (6,))),
    ("geometric", lambda k, a: random.geometric(k, a / 3.0, (6,))),
    ("multinomial", lambda k, a: random.multinomial(k, 7.0, jnp.stack([a, 1.0 / a]), shape=(2, 2))),
]


@pytest.mark.parametrize("name, fun", TRANSFORMED, ids=[t[0] for t in TRANSFORMED])
def test_jit_and_vmap_match_eager(name, fun):
    """Eager calls are the reference: jit, vmap over keys and parameters, and vmap over either alone agree."""
    keys = random.split(random.PRNGKey(12), 3)
    params = jnp.asarray(np.array([0.4, 1.3, 2.2], np.float32))
    eager = np.stack([np.asarray(fun(keys[i], params[i])) for i in range(3)])
    np.testing.assert_array_equal(np.asarray(fnx.jit(fnx.vmap(fun))(keys, params)), eager)
    over_keys = np.asarray(fnx.vmap(fun, in_axes=(0, None))(keys, params[0]))
    np.testing.assert_array_equal(over_keys[0], eager[0])
    assert not np.array_equal(over_keys[1], over_keys[0])  # the keys differ, so must the samples
    over_params = np.asarray(fnx.vmap(fun, in_axes=(None, 0))(keys[2], params))
    np.testing.assert_array_equal(over_params[2], eager[2])
    np.testing.assert_array_equal(np.asarray(fnx.jit(fun)(keys[1], params[1])), eager[1])


# ---- gamma's derivative in alpha (implicit reparameterization) ----

def test_gamma_grad_matches_jax_random_gamma_grad(jr):
    from jax import lax as jlax
    alpha = np.array([0.2, 0.9, 1.0, 3.7, 50.0, 900.0], np.float32)
    key = random.PRNGKey(13)
    x = np.asarray(random.gamma(key, jnp.asarray(alpha)))
    grads = np.asarray(fnx.grad(lambda a: jnp.sum(random.gamma(key, a)))(jnp.asarray(alpha)))
    expected = np.asarray(jlax.random_gamma_grad(alpha, x))
    np.testing.assert_allclose(grads, expected, rtol=2e-4, atol=1e-30)
    log_grads = np.asarray(fnx.grad(lambda a: jnp.sum(random.loggamma(key, a)))(jnp.asarray(alpha)))
    x_log = np.exp(np.asarray(random.loggamma(key, jnp.asarray(alpha)), np.float64)).astype(np.float32)
    np.testing.assert_allclose(log_grads, np.asarray(jlax.random_gamma_grad(alpha, x_log)) / x_log, rtol=2e-4)


def test_gamma_grad_is_the_implicit_derivative_of_the_cdf():
    """dx/da = -(dP(a, x)/da) / p(a, x), with dP/da by central differences of scipy's gammainc."""
    special = pytest.importorskip("scipy.special")
    stats = pytest.importorskip("scipy.stats")
    alpha = np.array([0.5, 2.0, 12.0], np.float32)
    key = random.PRNGKey(14)
    x = np.asarray(random.gamma(key, jnp.asarray(alpha, np.float32)), np.float64)
    grads = np.asarray(fnx.jit(fnx.grad(lambda a: jnp.sum(random.gamma(key, a))))(jnp.asarray(alpha)))
    h = 1e-5
    a64 = alpha.astype(np.float64)
    dp_da = (special.gammainc(a64 + h, x) - special.gammainc(a64 - h, x)) / (2 * h)
    np.testing.assert_allclose(grads, -dp_da / stats.gamma(a64).pdf(x), rtol=1e-3)


def test_beta_is_differentiable():
    key = random.PRNGKey(15)
    g = fnx.grad(lambda a: jnp.sum(random.beta(key, a, 2.0, (8,))))(1.5)
    assert np.isfinite(np.asarray(g)) and float(g) > 0  # a larger a pushes every Beta sample up


# ---- errors ----

def test_argument_errors():
    k = random.PRNGKey(0)
    with pytest.raises(ValueError):
        random.gamma(k, jnp.ones(3), (2,))
    with pytest.raises(ValueError):
        random.gamma(k, 1.0, (2,), jnp.int32)
    with pytest.raises(ValueError):
        random.geometric(k, 0.5, (2,), jnp.float32)
    with pytest.raises(ValueError):
        random.poisson(k, 2.0, (2,), jnp.float32)
    with pytest.raises(ValueError):
        random.dirichlet(k, 1.0)
    with pytest.raises(ValueError):
        random.exponential(k, (2,), jnp.int32)
    with pytest.raises(ValueError):
        random.binomial(k, 5, 0.5, (2,), jnp.int32)
    with pytest.raises(TypeError):
        random.laplace(np.zeros(3, np.uint32), (2,))
    with pytest.raises(ValueError, match=r"mean \(2,\) and cov \(3, 3\)"):
        random.multivariate_normal(k, jnp.zeros(2), jnp.eye(3))
    with pytest.raises(ValueError, match="method must be"):
        random.multivariate_normal(k, jnp.zeros(2), jnp.eye(2), method="lu")


def test_multivariate_normal_and_orthogonal():
    jax = pytest.importorskip("jax")
    k, jk = random.PRNGKey(5), jax.random.PRNGKey(5)
    mean = np.array([1.0, -2.0, 0.5], np.float32)
    a = np.random.default_rng(1).standard_normal((3, 3)).astype(np.float32)
    cov = a @ a.T + np.eye(3, dtype=np.float32)
    np.testing.assert_allclose(np.asarray(random.multivariate_normal(k, mean, cov, (7,))),
                               np.asarray(jax.random.multivariate_normal(jk, mean, cov, (7,))), rtol=1e-5, atol=1e-5)
    for method in ("cholesky", "eigh", "svd"):  # (moments: 20000 samples, 5 standard errors)
        x = np.asarray(random.multivariate_normal(k, mean, cov, (20000,), method=method), np.float64)
        np.testing.assert_allclose(x.mean(0), mean, atol=5 * np.sqrt(np.diag(cov).max() / 20000))
        np.testing.assert_allclose(np.cov(x.T), cov, atol=0.1 * np.abs(cov).max())
    for n, m, shape in ((4, None, ()), (3, 5, (2,)), (5, 2, ())):
        q = np.asarray(random.orthogonal(k, n, shape, m=m), np.float64)
        theirs = np.asarray(jax.random.orthogonal(jk, n, shape, m=m))
        assert q.shape == theirs.shape
        np.testing.assert_allclose(q, theirs, atol=1e-5)
        small = q if q.shape[-2] >= q.shape[-1] else np.swapaxes(q, -1, -2)
        np.testing.assert_allclose(np.swapaxes(small, -1, -2) @ small, np.broadcast_to(
            np.eye(small.shape[-1]), small.shape[:-2] + (small.shape[-1],) * 2), atol=1e-5)


def test_clone_and_key_impl():
    k = random.PRNGKey(3)
    assert_bits_equal(random.clone(k), k)
    assert random.key_impl(k) == "threefry2x32"
