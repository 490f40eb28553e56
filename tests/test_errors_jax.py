"""Errors as JAX raises them: the classes of jax.errors under their names in fnx.errors (with JAX's bases), raised
where JAX raises them, so `except jax.errors.X` code ported to `except fnx.errors.X` catches the same failures."""
import numpy as np
import pytest

import fnx
import fnx.numpy as jnp

jax = pytest.importorskip("jax")
import jax.numpy as jjnp  # noqa: E402

CONVERSIONS = [  # (what the traced function does, the class JAX raises)
    (lambda x: bool(x), "TracerBoolConversionError"),
    (lambda x: 1 if x > 0 else 0, "TracerBoolConversionError"),
    (lambda x: int(x), "ConcretizationTypeError"),
    (lambda x: range(x), "TracerIntegerConversionError"),
    (lambda x: [1, 2, 3][x], "TracerIntegerConversionError"),
    (lambda x: np.asarray(x), "TracerArrayConversionError"),
    (lambda x: float(x), "ConcretizationTypeError"),
    (lambda x: x.item(), "ConcretizationTypeError"),
]


@pytest.mark.parametrize("fun, name", CONVERSIONS, ids=[n + str(i) for i, (_, n) in enumerate(CONVERSIONS)])
def test_traced_conversions_raise_jaxs_class(fun, name):
    with pytest.raises(getattr(jax.errors, name)):
        jax.jit(fun)(1)
    with pytest.raises(getattr(fnx.errors, name)) as info:
        fnx.jit(fun)(1)
    assert isinstance(info.value, TypeError) and isinstance(info.value, fnx.errors.ConcretizationError)
    assert "test_errors_jax.py" in str(info.value)  # the message still names the user's line


def test_class_hierarchy_follows_jax():
    names = ["ConcretizationTypeError", "TracerBoolConversionError", "TracerIntegerConversionError",
             "TracerArrayConversionError", "NonConcreteBooleanIndexError", "UnexpectedTracerError", "KeyReuseError"]
    for name in names:
        ours, theirs = getattr(fnx.errors, name), getattr(jax.errors, name)
        for base in (TypeError, IndexError, ValueError):
            assert issubclass(ours, base) == issubclass(theirs, base), (name, base)
        assert issubclass(ours, fnx.errors.FnxError)
    assert issubclass(fnx.errors.TracerBoolConversionError, fnx.errors.ConcretizationTypeError)
    assert fnx.errors.ConcretizationTypeError is fnx.errors.ConcretizationError


def test_bool_of_an_array_with_several_or_no_elements_is_a_value_error():
    for make in (lambda m: m.ones(3), lambda m: m.ones((2, 2)), lambda m: m.ones(0)):
        with pytest.raises(ValueError) as theirs:
            bool(make(jjnp))
        with pytest.raises(ValueError) as ours:
            bool(make(jnp))
        assert str(theirs.value).split(".")[0] in str(ours.value)
    assert bool(jnp.ones((1, 1))) is True and bool(jnp.zeros(1)) is False
    with pytest.raises(TypeError):  # int() and float() keep numpy's TypeError, as JAX
        int(jnp.ones(3))


def test_leaked_tracer_is_a_type_error_as_in_jax():
    kept = []
    fnx.jit(lambda x: kept.append(x * 2) or x)(1.0)
    with pytest.raises(fnx.errors.UnexpectedTracerError) as info:
        kept[0] + 1
    assert isinstance(info.value, TypeError)


LIST_CALLS = [
    lambda m: m.sum([1, 2, 3]),
    lambda m: m.add(m.ones(2), [1, 2]),
    lambda m: m.reshape([1, 2], (2, 1)),
    lambda m: m.where([True, False], 1, 2),
    lambda m: m.concatenate([m.ones(1), [2.0]]),
    lambda m: m.dot([1, 2], [1, 2]),
]


@pytest.mark.parametrize("call", LIST_CALLS, ids=range(len(LIST_CALLS)))
def test_lists_as_array_arguments_are_type_errors(call):
    with pytest.raises(TypeError):
        call(jjnp)
    with pytest.raises(TypeError, match="requires ndarray or scalar arguments"):
        call(jnp)


def test_lists_where_jax_converts_them():
    for call in (lambda m: m.sum(m.array([1, 2, 3])), lambda m: m.zeros(3).at[:2].set([1, 2]),
                 lambda m: m.pad(m.ones(2), 1, constant_values=(1, 2)), lambda m: m.stack([m.ones(2), m.zeros(2)]),
                 lambda m: m.add(m.ones(2), 1.5)):
        np.testing.assert_array_equal(np.asarray(call(jnp)), np.asarray(call(jjnp)))
