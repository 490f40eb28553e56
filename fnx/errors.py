"""The exceptions fnx raises, and the helper that names the user's source line in them."""
from __future__ import annotations

import os
import sys

_FNX_DIR = os.path.dirname(os.path.abspath(__file__))


def user_frame() -> str:
    """The innermost stack frame outside the fnx package, as 'file:line (function)'."""
    frame = sys._getframe(1)
    while frame is not None:
        path = os.path.abspath(frame.f_code.co_filename)
        if not path.startswith(_FNX_DIR + os.sep) and "importlib" not in path:
            return f"{frame.f_code.co_filename}:{frame.f_lineno} ({frame.f_code.co_name})"
        frame = frame.f_back
    return "<unknown>"


class FnxError(Exception):
    """Base class of fnx's own errors."""


class ShapeError(FnxError, TypeError):
    """Shapes that do not fit together (a TypeError, as JAX raises for shape mismatches)."""


class ConcretizationError(FnxError, TypeError):
    """A traced value was used where a concrete Python value is needed (bool(), int(), float(), indexing).

    JAX's name for it is `ConcretizationTypeError` (the same class here); the subclasses below are the ones JAX
    raises for each conversion, so `except fnx.errors.TracerBoolConversionError` works as in JAX."""


ConcretizationTypeError = ConcretizationError


class TracerBoolConversionError(ConcretizationTypeError):
    """bool() of a traced value (a Python `if`, `and`, `or`, `not` on it), as jax.errors.TracerBoolConversionError."""


class TracerIntegerConversionError(ConcretizationError):
    """Use of a traced value as a Python index (`__index__`: `seq[x]`, `range(x)`), as
    jax.errors.TracerIntegerConversionError. In JAX it is not a ConcretizationTypeError; here it is one too, so fnx
    code catching ConcretizationError keeps working (int() of a traced value is a plain ConcretizationTypeError,
    as in JAX)."""


class TracerArrayConversionError(ConcretizationError):
    """np.asarray() (`__array__`) of a traced value, as jax.errors.TracerArrayConversionError."""


class NonConcreteBooleanIndexError(FnxError, IndexError):
    """Boolean-mask indexing with a traced mask: the result's shape depends on values, as
    jax.errors.NonConcreteBooleanIndexError (an IndexError, not a TypeError, in JAX; fnx raised a
    ConcretizationError here before)."""


class UnexpectedTracerError(FnxError, TypeError, RuntimeError):
    """A value traced inside jit or a transform was used after that trace ended (it escaped through a side
    effect: a global, a list, an attribute), like jax.errors.UnexpectedTracerError (a TypeError in JAX; also a
    RuntimeError, fnx's earlier base)."""


class KeyReuseError(FnxError, TypeError):
    """A PRNG key used twice, as jax.errors.KeyReuseError (fnx does not check key reuse; defined for code that
    catches it)."""


class UnsupportedError(FnxError, NotImplementedError):
    """An operation fnx does not support for these inputs, transform or backend."""


class DistributedError(FnxError, RuntimeError):
    """A process of a multi-process run (fnx.distributed) did not take part in an exchange within
    FNX_DISTRIBUTED_TIMEOUT seconds, or the processes disagree about what they run."""


def at_user_line(message: str) -> str:
    """Append the user's source line to an error message."""
    return f"{message}\n  at {user_frame()}"
