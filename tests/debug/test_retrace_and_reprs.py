"""Why did it retrace (FNX_EXPLAIN_RETRACE / fnx.config.update("explain_cache_misses", True)), readable reprs of
jit's objects, signatures in help(), kernel and graph names from the user's functions, fnx.__version__."""
import functools
import importlib.metadata
import inspect
import logging
import os
import pathlib
import subprocess
import sys

import numpy as np
import pytest

import fnx
import fnx.numpy as jnp
from fnx.backends.device import Launch
from fnx.config import config

HERE = os.path.basename(__file__)


@pytest.fixture
def explain(caplog):
    previous = config.explain_cache_misses
    fnx.config.update("jax_explain_cache_misses", True)  # (JAX's name for it works too)
    caplog.set_level(logging.WARNING, logger="fnx")
    yield caplog
    fnx.config.update("explain_cache_misses", previous)


def messages(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "fnx"]


def test_each_kind_of_change_is_explained_with_the_call_site(explain):
    @functools.partial(fnx.jit, static_argnames="mode")
    def step(params, x, mode="train"):
        return params["w"] * x + (1.0 if mode == "train" else 0.0)

    params = {"w": jnp.full((), 2.0)}
    step(params, jnp.ones(3))
    step(params, jnp.ones(3))                                      # a cache hit: nothing to explain
    assert messages(explain) == []
    cases = [((params, jnp.ones(4)), {}, "argument 'x': shape (3,) -> (4,)"),
             ((params, jnp.ones(4, dtype=jnp.int32)), {}, "argument 'x': dtype float32 -> int32"),
             ((params, 2.0), {}, "weak type False -> True"),
             ((params, jnp.ones(3)), {"mode": "eval"},
              "static argument 'mode': (not given: its default 'train') -> 'eval'"),
             (({"w": jnp.ones(()), "b": jnp.ones(())}, jnp.ones(3)), {}, "the arguments' tree structure")]
    for number, (args, kwargs, reason) in enumerate(cases, start=2):
        line = inspect.currentframe().f_lineno + 1
        np.testing.assert_allclose(np.asarray(step(*args, **kwargs)), np.asarray(args[0]["w"]) *
                                   np.asarray(args[1]) + (0.0 if kwargs else 1.0))
        message = messages(explain)[-1]
        assert f"jit of step traces again, signature {number}" in message
        assert reason in message, message
        assert f"{HERE}:{line}" in message  # the user's line, not fnx's
    assert len(messages(explain)) == len(cases)


def test_the_changed_leaf_is_named_by_its_path(explain):
    f = fnx.jit(lambda params, x: params["layers"][1] @ x)
    params = {"layers": [jnp.ones((2, 2)), jnp.ones((3, 2))]}
    f(params, jnp.ones(2))
    params["layers"][1] = jnp.ones((4, 2))
    np.testing.assert_allclose(np.asarray(f(params, jnp.ones(2))), np.full(4, 2.0))
    assert "argument \"params['layers'][1]\": shape (3, 2) -> (4, 2)" in messages(explain)[-1]


def test_nothing_is_logged_unless_asked(caplog):
    caplog.set_level(logging.WARNING, logger="fnx")
    f = fnx.jit(lambda x: x * 2)
    f(jnp.ones(2))
    f(jnp.ones(3))
    assert messages(caplog) == []


def test_the_environment_variable_turns_it_on():
    program = ("import fnx, fnx.numpy as jnp\nf = fnx.jit(lambda x: x + 1)\nf(jnp.ones(2))\nf(jnp.ones(5))\n")
    out = subprocess.run([sys.executable, "-c", program], env=dict(os.environ, FNX_EXPLAIN_RETRACE="1"),
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "traces again, signature 2" in out.stderr and "shape (2,) -> (5,)" in out.stderr, out.stderr
    assert "<string>:4" in out.stderr


def test_unknown_config_names_are_refused():
    with pytest.raises(AttributeError, match="explain_cache_misses"):
        fnx.config.update("jax_no_such_setting", True)


def layer(x, w):
    return jnp.tanh(x @ w)


def test_reprs_of_jit_lowered_and_compiled():
    f = fnx.jit(layer)
    assert repr(f) == f"<fnx.jit of {layer!r}>"
    assert repr(fnx.jit(layer, static_argnums=1)).endswith("with static_argnums=(1,)>")
    x, w = jnp.ones((4, 3)), jnp.ones((3, 2))
    lowered = f.lower(x, w)
    kernels = sum(isinstance(i, Launch) for i in lowered.executable.items)
    assert repr(lowered) == f"Lowered(layer(x: f32[4,3], w: f32[3,2]) -> f32[4,2] on cpu:0, {kernels} kernels)"
    compiled = lowered.compile()
    assert repr(compiled) == f"Compiled(layer(x: f32[4,3], w: f32[3,2]) -> f32[4,2] on cpu:0, {kernels} kernels)"
    np.testing.assert_allclose(np.asarray(compiled(x, w)), np.tanh(np.full((4, 2), 3.0)), rtol=1e-6)


def test_graphs_and_kernels_are_named_after_the_users_functions():
    text = str(fnx.make_graph(lambda x: jnp.tanh(jnp.exp(x)))(jnp.ones(3)))
    assert "call custom_jvp(tanh)" in text and "call custom_jvp(exp)" in text and "(run)" not in text

    def block(x):
        return jnp.sin(x) * 2

    f = fnx.jit(lambda x, w: fnx.checkpoint(block)(x @ w).sum())
    lowered = f.lower(jnp.ones((8, 8)), jnp.ones((8, 8)))
    names = [i.kernel for i in lowered.executable.items if isinstance(i, Launch)]
    assert len(set(names)) == len(names)
    assert any("block" in n for n in names) and any("dot" in n for n in names), names


def test_ufuncs_have_numpys_signatures():
    """Every fnx.numpy function that is a numpy ufunc takes its positional arguments as numpy's does (help()
    shows `(x, /)` or `(x1, x2, /)`, not `(*args)`)."""
    checked = 0
    for name in dir(jnp):
        ours, theirs = getattr(jnp, name), getattr(np, name, None)
        if not isinstance(theirs, np.ufunc) or not callable(ours): continue
        params = list(inspect.signature(ours).parameters.values())
        positional = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
        assert len(positional) >= theirs.nin and not any(p.kind is p.VAR_POSITIONAL for p in params), (
            name, inspect.signature(ours))
        checked += 1
    assert checked > 60
    assert str(inspect.signature(jnp.tanh)) == "(x, /)" and str(inspect.signature(jnp.arctan2)) == "(x1, x2, /)"


def test_version_and_typing_marker():
    assert fnx.__version__ == importlib.metadata.version("fnx")
    assert (pathlib.Path(fnx.__file__).parent / "py.typed").is_file()


def test_graphs_and_lowered_functions_draw_themselves(tmp_path):
    """What a notebook shows: make_graph's result and every stage of a Lowered as SVG (fnx.debug.pictures)."""
    import xml.etree.ElementTree as ElementTree
    x, w = jnp.ones((4, 3)), jnp.ones((3, 2))
    graph = fnx.make_graph(layer)(x, w)
    svg = graph._repr_svg_()
    assert ElementTree.fromstring(svg).tag.endswith("svg") and "custom_jvp(tanh)" in svg and "layer" in svg
    graph.save(str(tmp_path / "graph.svg"))
    assert (tmp_path / "graph.svg").read_text() == svg
    lowered = fnx.jit(layer).lower(x, w)
    kernels = [i.kernel for i in lowered.executable.items if isinstance(i, Launch)]
    for stage in ("graph", "callify", "rangeify", "optimize", "linearize", "memory", "schedule"):
        picture = lowered.draw(stage)
        ElementTree.fromstring(picture._repr_svg_())
        if stage in ("rangeify", "optimize", "linearize", "schedule"):
            assert all(k in picture.svg for k in kernels), (stage, kernels)
    with pytest.raises(ValueError, match="rangeify"):
        lowered.draw("no such stage")
