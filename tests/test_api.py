"""The top-level JAX API (fnx/api.py, fnx.debug's callbacks, jit's ShapeDtypeStruct / disable_jit / method binding
/ trace cache) against JAX where JAX defines the behaviour, numpy otherwise."""
import functools

import numpy as np
import pytest

import fnx
import fnx.numpy as jnp

jax = pytest.importorskip("jax")
import jax.numpy as jjnp  # noqa: E402


def shapes(tree, lib):
    return lib.tree.map(lambda s: (s.shape, np.dtype(s.dtype).name, s.weak_type), tree)


EVAL_SHAPE_CASES = [
    (lambda x: (x.sum(), x * 2.0), lambda m: [m.ShapeDtypeStruct((2, 3), np.float32)]),
    (lambda x, y: {"mm": x @ y, "b": x[:, :1] + 1}, lambda m: [m.ShapeDtypeStruct((4, 3), np.float32),
                                                                m.ShapeDtypeStruct((3, 5), np.float32)]),
    (lambda x: x + 1, lambda m: [1.0]),
    (lambda x, n: (x.astype(np.int32), n * 2), lambda m: [m.ShapeDtypeStruct((7,), np.float16), 3]),
    (lambda x: x.mean(axis=0, keepdims=True), lambda m: [np.ones((5, 2), np.float32)]),
]


@pytest.mark.parametrize("case", range(len(EVAL_SHAPE_CASES)))
def test_eval_shape_matches_jax(case):
    fun, args = EVAL_SHAPE_CASES[case]
    assert shapes(fnx.eval_shape(fun, *args(fnx)), fnx) == shapes(jax.eval_shape(fun, *args(jax)), jax)


def test_eval_shape_runs_no_kernel():
    huge = fnx.ShapeDtypeStruct((1 << 17, 1 << 17), np.float32)  # 64 GiB each: computing it could not finish
    out = fnx.eval_shape(lambda x: jnp.tanh(x @ x).sum(axis=1), huge)
    assert out == fnx.ShapeDtypeStruct((1 << 17,), np.float32)


def test_shape_dtype_struct_matches_jax():
    for args in [((2, 3), np.float32), ((), "int32"), ((4,), np.float64)]:
        ours, theirs = fnx.ShapeDtypeStruct(*args), jax.ShapeDtypeStruct(*args)
        assert repr(ours) == repr(theirs)
        assert (ours.shape, ours.dtype, ours.ndim, ours.size, ours.sharding) == \
            (theirs.shape, theirs.dtype, theirs.ndim, theirs.size, theirs.sharding)
    assert fnx.ShapeDtypeStruct((2,), np.float32) == fnx.ShapeDtypeStruct([2], "float32")
    assert len({fnx.ShapeDtypeStruct((2,), np.float32), fnx.ShapeDtypeStruct((2,), np.float32)}) == 1
    assert fnx.ShapeDtypeStruct((2,), np.float32) != fnx.ShapeDtypeStruct((2,), np.int32)


def test_lower_with_shape_dtype_structs_then_call_compiled():
    f = fnx.jit(lambda x, y: jnp.tanh(x) @ y)
    compiled = f.lower(fnx.ShapeDtypeStruct((2, 3), np.float32), fnx.ShapeDtypeStruct((3,), np.float32)).compile()
    x, y = np.random.default_rng(0).standard_normal((2, 3)).astype(np.float32), np.ones(3, np.float32)
    want = np.tanh(x.astype(np.float64)) @ y  # (a sum of three terms near 1 that cancel: an absolute bound)
    np.testing.assert_allclose(np.asarray(compiled(jnp.asarray(x), jnp.asarray(y))), want, rtol=1e-6, atol=1e-6)
    with pytest.raises(TypeError):
        compiled(jnp.ones((3, 3)), jnp.ones(3))


def test_typeof_matches_jax():
    for make in (lambda m: m.ones((2, 3)), lambda m: m.arange(4), lambda m: 1.0, lambda m: np.int16(3)):
        ours, theirs = fnx.typeof(make(jnp)), jax.typeof(make(jjnp))
        assert (repr(ours), str(ours), ours.shape, ours.dtype, ours.weak_type) == \
            (repr(theirs), str(theirs), theirs.shape, theirs.dtype, theirs.weak_type)
    seen = []
    fnx.jit(lambda x: seen.append(fnx.typeof(x)) or x)(jnp.ones(2))  # a traced value has a type too
    assert str(seen[0]) == "float32[2]"


def test_make_jaxpr_is_make_graph():
    def f(x, n): return jnp.sin(x) * n
    assert str(fnx.make_jaxpr(f, static_argnums=1)(1.0, 3)) == str(fnx.make_graph(f, static_argnums=1)(1.0, 3))
    graph, out = fnx.make_jaxpr(lambda x: (x, x.sum()), return_shape=True)(fnx.ShapeDtypeStruct((3,), np.float32))
    assert "reduce" in str(graph) and shapes(out, fnx) == (((3,), "float32", False), ((), "float32", False))


def test_device_get_matches_jax():
    tree = {"w": np.arange(6.0, dtype=np.float32).reshape(2, 3), "step": 3, "nested": [np.int32(2), None]}
    ours = fnx.device_get(fnx.tree.map(lambda x: jnp.asarray(x) if isinstance(x, np.ndarray) else x, tree))
    theirs = jax.device_get(jax.tree.map(lambda x: jjnp.asarray(x) if isinstance(x, np.ndarray) else x, tree))
    assert type(ours["w"]) is np.ndarray and ours["w"].dtype == theirs["w"].dtype
    np.testing.assert_array_equal(ours["w"], theirs["w"])
    assert ours["step"] == theirs["step"] == 3 and ours["nested"][1] is None


def test_jacobian_matches_jax():
    def f(m): return lambda x: m.tanh(x[:, None] * x[None, :]).sum(axis=0)
    x = np.linspace(-1, 1, 4).astype(np.float32)
    np.testing.assert_allclose(np.asarray(fnx.jacobian(f(jnp))(jnp.asarray(x))),
                               np.asarray(jax.jacobian(f(jjnp))(x)), rtol=1e-5, atol=1e-6)


def printed(capsys, run):
    run()
    if hasattr(jax, "effects_barrier"): jax.effects_barrier()
    return capsys.readouterr().out


PRINT_CASES = {
    "eager": lambda lib, m: lib.debug.print("x={} y={y}", m.arange(3.0), y=2),
    "jit": lambda lib, m: [lib.jit(lambda x: lib.debug.print("x={}, sum={s}", x, s=x.sum()) or x * 2)(m.arange(3.0) + k)
                           for k in range(2)],
    "grad": lambda lib, m: lib.grad(lambda x: (lib.debug.print("g {}", x), x ** 2)[1])(3.0),
    "jit of grad": lambda lib, m: lib.jit(lib.grad(lambda x: (lib.debug.print("jg {x}", x=x), x ** 3)[1]))(2.0),
    "pytree": lambda lib, m: lib.jit(lambda t: lib.debug.print("{a} {b}", a=t["a"], b=t["b"]))(
        {"a": m.ones(2, dtype=np.int32), "b": (m.zeros(()), 1.5)}),
}


@pytest.mark.parametrize("case", sorted(PRINT_CASES))
def test_debug_print_output_matches_jax(capsys, case):
    theirs = printed(capsys, lambda: PRINT_CASES[case](jax, jjnp))
    ours = printed(capsys, lambda: PRINT_CASES[case](fnx, jnp))
    assert theirs and ours == theirs


def test_debug_print_under_jit_prints_each_call_in_order(capsys):
    @fnx.jit
    def step(x):
        fnx.debug.print("before {}", x)
        y = x * 2
        fnx.debug.print("after {}", y)
        return y
    for k in range(3): step(jnp.float32(k))
    assert capsys.readouterr().out.split("\n")[:-1] == [f"{w} {v}" for k in range(3)
                                                         for w, v in (("before", float(k)), ("after", 2.0 * k))]


def test_debug_print_under_vmap_says_it_is_unsupported():
    with pytest.raises(fnx.errors.UnsupportedError, match="debug.print under vmap"):
        fnx.vmap(lambda x: fnx.debug.print("{}", x))(jnp.ones(2))
    with pytest.raises(fnx.errors.UnsupportedError, match="debug.print under vmap"):
        fnx.jit(fnx.vmap(lambda x: fnx.debug.print("{}", x)))(jnp.ones(2))


def test_debug_callback_sees_values_under_jit():
    seen = []
    f = fnx.jit(lambda x: fnx.debug.callback(lambda v, w: seen.append((np.asarray(v), w)), x * 2, w=7) or x + 1)
    out = f(jnp.arange(3.0))
    np.testing.assert_array_equal(np.asarray(out), [1, 2, 3])
    np.testing.assert_array_equal(seen[0][0], [0, 2, 4])
    assert seen[0][1] == 7 and len(seen) == 1


def test_pure_callback_matches_jax_eager_and_under_jit():
    def host(x, scale): return (np.sin(np.asarray(x)) * scale).astype(np.float32), np.cumsum(np.asarray(x))

    def f(lib, m):
        def g(x):
            spec = (lib.ShapeDtypeStruct(x.shape, np.float32), lib.ShapeDtypeStruct(x.shape, x.dtype))
            a, b = lib.pure_callback(host, spec, x, 3.0)
            return a + b * 2
        return g
    x = np.linspace(-2, 2, 5).astype(np.float32)
    expected = np.asarray(jax.jit(f(jax, jjnp))(x))
    for ours in (f(fnx, jnp)(jnp.asarray(x)), fnx.jit(f(fnx, jnp))(jnp.asarray(x))):
        np.testing.assert_allclose(np.asarray(ours), expected, rtol=1e-6)


def test_pure_callback_converts_to_the_declared_dtype_and_checks_shapes():
    spec = fnx.ShapeDtypeStruct((2,), np.float32)
    out = fnx.pure_callback(lambda x: np.asarray(x, np.float64) + 0.5, spec, jnp.ones(2))
    assert out.dtype == np.float32 and np.asarray(out).tolist() == [1.5, 1.5]
    with pytest.raises(RuntimeError, match="shape"):
        fnx.pure_callback(lambda x: np.ones(3), spec, jnp.ones(2))
    with pytest.raises(RuntimeError, match="structure"):
        fnx.pure_callback(lambda x: (x, x), spec, jnp.ones(2))
    with pytest.raises(ValueError, match="vmap_method"):
        fnx.pure_callback(lambda x: x, spec, jnp.ones(2), vmap_method="nope")


def test_pure_callback_under_grad_and_vmap_raises_naming_it():
    spec = jax.ShapeDtypeStruct((), np.float32)
    with pytest.raises(ValueError):
        jax.grad(lambda x: jax.pure_callback(np.sin, spec, x))(1.0)
    with pytest.raises(ValueError, match="pure_callback.*vjp"):
        fnx.grad(lambda x: fnx.pure_callback(np.sin, fnx.ShapeDtypeStruct((), np.float32), x))(1.0)
    with pytest.raises(fnx.errors.UnsupportedError, match="pure_callback.*vmap"):
        fnx.vmap(lambda x: fnx.pure_callback(np.sin, fnx.ShapeDtypeStruct((), np.float32), x))(jnp.ones(3))
    # an argument the derivative does not flow through is fine, as in JAX
    g = fnx.grad(lambda x, c: x * fnx.pure_callback(np.cos, fnx.ShapeDtypeStruct((), np.float32), c))(2.0, 0.0)
    assert float(g) == 1.0


def test_jit_with_a_host_callback_has_no_single_lowering():
    f = fnx.jit(lambda x: fnx.debug.print("{}", x) or x)
    with pytest.raises(fnx.errors.UnsupportedError, match="host callback"):
        f.lower(1.0)


def test_disable_jit_runs_op_by_op():
    values = []
    f = fnx.jit(lambda x: values.append(np.asarray(x).copy()) or x * 2)
    with fnx.disable_jit():
        np.testing.assert_array_equal(np.asarray(f(jnp.arange(3.0))), [0, 2, 4])
    np.testing.assert_array_equal(values[0], [0, 1, 2])
    with pytest.raises(fnx.errors.TracerArrayConversionError):
        f(jnp.arange(3.0))


def test_jit_reuses_the_trace_of_the_same_function():
    traces = []

    def f(x):
        traces.append(1)
        return x * 2
    x = jnp.ones(3)
    fnx.jit(f)(x)
    fnx.jit(f)(x)
    fnx.jit(f)({"a": x}["a"])
    assert len(traces) == 1
    fnx.jit(f, static_argnums=())(x)  # the same options
    assert len(traces) == 1
    fnx.jit(f, donate_argnums=0)(jnp.ones(3))  # other options: traced anew
    assert len(traces) == 2
    fnx.jit(lambda x: f(x))(x)  # another function
    assert len(traces) == 3
    fnx.clear_caches()
    fnx.jit(f)(x)
    assert len(traces) == 4


def test_jitted_methods_bind_self_as_in_jax():
    def make(lib):
        @lib.tree_util.register_pytree_node_class
        class Scale:
            def __init__(self, s): self.s = s
            def tree_flatten(self): return (self.s,), None
            @classmethod
            def tree_unflatten(cls, aux, children): return cls(*children)
            @lib.jit
            def apply(self, x): return x * self.s

        class Static:
            def __init__(self, s): self.s = s
            @functools.partial(lib.jit, static_argnums=0)
            def apply(self, x): return x + self.s
        return Scale, Static
    for lib, m in ((jax, jjnp), (fnx, jnp)):
        Scale, Static = make(lib)
        assert float(Scale(3.0).apply(m.float32(2.0))) == 6.0
        assert float(Static(1.0).apply(m.float32(2.0))) == 3.0
        assert float(Scale.apply(Scale(2.0), 2.0)) == 4.0


def test_small_switches():
    assert fnx.default_backend() in {d.platform for d in fnx.devices()}
    assert fnx.devices(fnx.default_backend())
    with fnx.named_scope("block"):
        y = jnp.ones(2) + 1
    np.testing.assert_array_equal(np.asarray(y), [2, 2])
    with pytest.raises(TypeError):
        with fnx.named_scope(3):
            pass
    f = fnx.named_call(lambda x: x * 3, name="triple")
    assert float(fnx.jit(f)(2.0)) == 6.0


def test_top_level_aliases_jax_users_reach_for():
    import numpy as np
    assert fnx.host_id() == fnx.process_index() == 0 and fnx.host_count() == fnx.process_count()
    assert fnx.process_indices() == list(range(fnx.process_count()))
    assert fnx.P is fnx.sharding.PartitionSpec and fnx.NamedSharding is fnx.sharding.NamedSharding
    assert isinstance(fnx.devices()[0], fnx.Device)
    np.testing.assert_array_equal(np.asarray(fnx.dlpack.from_dlpack(np.arange(4))), np.arange(4))
