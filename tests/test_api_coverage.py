"""How much of JAX's public API fnx has: for each mirrored module, the share of JAX's public names fnx defines
(printed with `pytest -s`; the README's figures come from here), and every name it lacks raises an AttributeError
that says it is not implemented yet rather than Python's bare one. The list of JAX's names is data in
fnx/jax_names.py (JAX is not a run-time dependency); with JAX installed the live names are compared too."""
import importlib

import pytest

from fnx.jax_names import JAX_NAMES

MODULES = sorted(JAX_NAMES)


def _module(dotted: str):
    """fnx's module by its dotted name (fnx.numpy.linalg is an attribute of fnx.numpy, not a package module)."""
    head, *rest = dotted.split(".")
    module = importlib.import_module(head)
    for part in rest:
        module = getattr(module, part) if hasattr(module, part) else importlib.import_module(
            f"{module.__name__}.{part}")
    return module


def coverage(module: str) -> tuple[int, int, list[str]]:
    ours = _module(module)
    names = sorted(JAX_NAMES[module])
    have = [n for n in names if _has(ours, n)]
    return len(have), len(names), [n for n in names if n not in have]


def _has(module, name: str) -> bool:
    try:
        getattr(module, name)
        return True
    except AttributeError:
        return False


@pytest.mark.parametrize("module", MODULES)
def test_missing_names_say_they_are_not_implemented(module):
    ours = _module(module)
    have, total, missing = coverage(module)
    print(f"\n{module}: {have} of {total} of JAX's public names ({have / total:.0%})")
    for name in missing:
        with pytest.raises(AttributeError, match=f"{name} is not implemented in fnx yet"):
            getattr(ours, name)
    with pytest.raises(AttributeError, match="has no attribute 'surely_not_a_jax_name'$"):
        ours.surely_not_a_jax_name


def test_names_match_the_installed_jax():
    """Reported, not asserted: a newer JAX may add names (regenerate fnx/jax_names.py then)."""
    jax = pytest.importorskip("jax")
    for module in MODULES:
        live = importlib.import_module("jax" + module[len("fnx"):])  # (jax.numpy.linalg is a real module)
        names = {n for n in dir(live) if not n.startswith("_") and not (module == "fnx.lax" and n.endswith("_p"))
                 and type(getattr(live, n, None)) is not type(jax)}
        new, gone = names - JAX_NAMES[module], JAX_NAMES[module] - names
        if new or gone: print(f"\n{module}: JAX {jax.__version__} adds {sorted(new)[:10]}, drops {sorted(gone)[:10]}")
        assert JAX_NAMES[module], module


def test_missing_submodules_say_they_are_not_implemented():
    """jax.numpy.fft, jax.scipy.special, jax.image ...: the same message as a missing function, and each really is a
    JAX module (so the list cannot name something JAX does not have)."""
    from fnx.jax_names import MISSING_SUBMODULES
    jax = pytest.importorskip("jax")
    for module, names in MISSING_SUBMODULES.items():
        for name in names:
            with pytest.raises(AttributeError, match=f"jax{module[3:]}.{name} is not implemented in fnx yet"):
                getattr(_module(module), name)
            assert type(importlib.import_module(f"jax{module[3:]}.{name}")) is type(jax)
