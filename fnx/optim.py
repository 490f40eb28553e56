"""fnx.optim: pure, optax-like optimizers built from small gradient transformations.

A `GradientTransformation` is a pair of pure functions: `init(params) -> state` and
`update(grads, state, params=None) -> (updates, new_state)`. States are NamedTuples of fnx arrays (step counts are
int32 scalars), so a whole training step can run under `fnx.jit`. Optimizers are chains of the building blocks
below and follow optax's formulas; a learning rate may be a float or a schedule `count -> value`.

    >>> opt = fnx.optim.adam(1e-3)
    >>> state = opt.init(params)
    >>> updates, state = opt.update(grads, state, params)
    >>> params = fnx.optim.apply_updates(params, updates)
"""
from __future__ import annotations

import math
import warnings
from typing import Any, Callable, NamedTuple, Union

from fnx import numpy as jnp
from fnx import tree_util
from fnx.errors import at_user_line
from fnx.trace import Array

__all__ = ["EmptyState", "GradientTransformation", "ScaleByAdamState", "ScaleByRmsState", "ScaleByRssState",
           "ScaleByScheduleState", "ScaleByStddevState", "TraceState", "adagrad", "adam", "adamw",
           "add_decayed_weights", "apply_updates", "chain", "clip", "clip_by_global_norm", "constant_schedule",
           "cosine_decay_schedule", "exponential_decay", "global_norm", "identity", "join_schedules",
           "linear_schedule", "momentum", "nadam", "piecewise_constant_schedule", "polynomial_schedule",
           "rmsprop", "scale", "scale_by_adam", "scale_by_learning_rate", "scale_by_rms", "scale_by_rss",
           "scale_by_schedule", "scale_by_stddev", "sgd", "trace", "warmup_cosine_decay_schedule"]

Schedule = Callable[[Any], Any]
ScalarOrSchedule = Union[float, Schedule]


class GradientTransformation(NamedTuple):
    """A pure gradient transformation: `init(params) -> state`, `update(grads, state, params=None) -> (updates,
    new_state)`."""
    init: Callable[[Any], Any]
    update: Callable[..., tuple[Any, Any]]


class EmptyState(NamedTuple):
    """The state of a stateless transformation."""


class ScaleByScheduleState(NamedTuple):
    count: Array


class TraceState(NamedTuple):
    trace: Any


class ScaleByAdamState(NamedTuple):
    count: Array
    mu: Any
    nu: Any


class ScaleByRmsState(NamedTuple):
    count: Array
    nu: Any


class ScaleByStddevState(NamedTuple):
    count: Array
    mu: Any
    nu: Any


class ScaleByRssState(NamedTuple):
    sum_of_squares: Any


# ---- helpers ----

_map = tree_util.tree_map
_INT32_MAX = 2 ** 31 - 1


def _zero_count() -> Array:
    return jnp.zeros([], jnp.int32)


def _increment(count: Array) -> Array:
    """count + 1, saturating at the int32 maximum instead of wrapping."""
    return jnp.where(count < _INT32_MAX, count + 1, count)


def _zeros_like(params: Any, dtype: Any = None) -> Any:
    return _map(lambda p: jnp.zeros_like(p, dtype=dtype), params)


def _cast_tree(tree: Any, dtype: Any) -> Any:
    return tree if dtype is None else _map(lambda t: jnp.asarray(t).astype(dtype), tree)


def _ema(grads: Any, moments: Any, decay: float, power: int) -> Any:
    """The exponential moving average (1 - decay) * g**power + decay * moment, leaf by leaf."""
    return _map(lambda g, m: (1 - decay) * (g if power == 1 else jnp.square(g)) + decay * m, grads, moments)


def _debias(moments: Any, decay: float, count: Array) -> Any:
    """Adam's bias correction: moment / (1 - decay**count), the power taken in float32 or the moment's wider dtype."""
    def debias(m: Array) -> Array:
        work = jnp.result_type(m, jnp.float32)
        correction = 1 - jnp.power(jnp.asarray(decay, work), count.astype(work))
        return m / correction.astype(m.dtype)
    return _map(debias, moments)


def _need_params(name: str, params: Any) -> None:
    if params is None:
        raise ValueError(at_user_line(f"{name}: update needs the params (call update(grads, state, params))"))


def global_norm(tree: Any) -> Array:
    """The l2 norm of all the leaves of `tree` together: sqrt(sum of every element squared).

    Args:
      tree: a pytree of arrays.

    Returns:
      A scalar array.

    Example:
      >>> fnx.optim.global_norm({"a": jnp.array([3.0]), "b": jnp.array([4.0])})
      Array(5., dtype=float32)
    """
    return jnp.sqrt(sum(jnp.sum(jnp.square(leaf)) for leaf in tree_util.tree_leaves(tree)))


def apply_updates(params: Any, updates: Any) -> Any:
    """params + updates leaf by leaf, each result cast back to its parameter's dtype.

    Args:
      params: a pytree of arrays.
      updates: a pytree of the same structure (as returned by an update function).

    Returns:
      The new params.

    Example:
      >>> fnx.optim.apply_updates({"w": jnp.ones(2)}, {"w": jnp.array([0.5, -1.0])})
      {'w': Array([1.5, 0. ], dtype=float32)}
    """
    def add(p: Any, u: Any) -> Array:
        p = jnp.asarray(p)
        return (p + u).astype(p.dtype)
    return _map(add, params, updates)


# ---- building blocks ----

def identity() -> GradientTransformation:
    """A transformation that returns the updates unchanged.

    Returns:
      A GradientTransformation with an EmptyState.
    """
    return GradientTransformation(lambda params: EmptyState(), lambda updates, state, params=None: (updates, state))


def chain(*transforms: GradientTransformation) -> GradientTransformation:
    """Applies transformations one after another; the state is the tuple of their states.

    Args:
      *transforms: the transformations, in the order they apply.

    Returns:
      A GradientTransformation.

    Example:
      >>> opt = fnx.optim.chain(fnx.optim.clip_by_global_norm(1.0), fnx.optim.adam(1e-3))
    """
    def init(params: Any) -> tuple:
        return tuple(t.init(params) for t in transforms)

    def update(updates: Any, state: tuple, params: Any = None) -> tuple[Any, tuple]:
        if len(state) != len(transforms):
            raise ValueError(f"chain: got a state with {len(state)} parts for {len(transforms)} transformations")
        new_states = []
        for t, s in zip(transforms, state):
            updates, s = t.update(updates, s, params)
            new_states.append(s)
        return updates, tuple(new_states)
    return GradientTransformation(init, update)


def scale(step_size: float) -> GradientTransformation:
    """Multiplies the updates by a constant.

    Args:
      step_size: the factor.

    Returns:
      A GradientTransformation with an EmptyState.
    """
    def update(updates: Any, state: EmptyState, params: Any = None) -> tuple[Any, EmptyState]:
        return _map(lambda u: u * step_size, updates), state
    return GradientTransformation(lambda params: EmptyState(), update)


def scale_by_schedule(step_size_fn: Schedule) -> GradientTransformation:
    """Multiplies the updates by `step_size_fn(count)`, where count is the number of updates done so far.

    Args:
      step_size_fn: a schedule, from the int32 step count to a scalar.

    Returns:
      A GradientTransformation with a ScaleByScheduleState.
    """
    def update(updates: Any, state: ScaleByScheduleState, params: Any = None) -> tuple[Any, ScaleByScheduleState]:
        step = step_size_fn(state.count)
        return _map(lambda u: u * jnp.asarray(step).astype(jnp.asarray(u).dtype), updates), \
            ScaleByScheduleState(_increment(state.count))
    return GradientTransformation(lambda params: ScaleByScheduleState(_zero_count()), update)


def scale_by_learning_rate(learning_rate: ScalarOrSchedule, *, flip_sign: bool = True) -> GradientTransformation:
    """Multiplies the updates by -learning_rate (or +learning_rate without `flip_sign`).

    Args:
      learning_rate: a float or a schedule.
      flip_sign: negate, so that applying the updates descends.

    Returns:
      A GradientTransformation.
    """
    sign = -1 if flip_sign else 1
    if callable(learning_rate):
        return scale_by_schedule(lambda count: sign * learning_rate(count))
    return scale(sign * learning_rate)


def trace(decay: float, nesterov: bool = False, accumulator_dtype: Any = None) -> GradientTransformation:
    """Momentum: trace = g + decay * trace; the updates are the trace (or g + decay * trace with `nesterov`).

    Args:
      decay: the momentum coefficient.
      nesterov: use Nesterov's look-ahead form.
      accumulator_dtype: optional dtype of the trace.

    Returns:
      A GradientTransformation with a TraceState.
    """
    def update(updates: Any, state: TraceState, params: Any = None) -> tuple[Any, TraceState]:
        new_trace = _map(lambda g, t: g + decay * t, updates, state.trace)
        updates = _map(lambda g, t: g + decay * t, updates, new_trace) if nesterov else new_trace
        return updates, TraceState(_cast_tree(new_trace, accumulator_dtype))
    return GradientTransformation(lambda params: TraceState(_zeros_like(params, accumulator_dtype)), update)


def scale_by_adam(b1: float = 0.9, b2: float = 0.999, eps: float = 1e-8, eps_root: float = 0.0,
                  mu_dtype: Any = None, *, nesterov: bool = False) -> GradientTransformation:
    """Adam's rescaling: mu_hat / (sqrt(nu_hat + eps_root) + eps) with bias-corrected moment estimates.

    mu = b1 mu + (1 - b1) g, nu = b2 nu + (1 - b2) g^2, mu_hat = mu / (1 - b1^t), nu_hat = nu / (1 - b2^t) at step
    t = 1, 2, ... With `nesterov` (NAdam), mu_hat = b1 mu / (1 - b1^(t+1)) + (1 - b1) g / (1 - b1^t).

    Args:
      b1: decay of the first moment.
      b2: decay of the second moment.
      eps: added to the denominator outside the square root.
      eps_root: added to the second moment inside the square root.
      mu_dtype: optional dtype of the first moment.
      nesterov: use Nesterov momentum (NAdam).

    Returns:
      A GradientTransformation with a ScaleByAdamState.
    """
    def init(params: Any) -> ScaleByAdamState:
        return ScaleByAdamState(_zero_count(), _zeros_like(params, mu_dtype), _zeros_like(params))

    def update(updates: Any, state: ScaleByAdamState, params: Any = None) -> tuple[Any, ScaleByAdamState]:
        mu = _ema(updates, state.mu, b1, 1)
        nu = _ema(updates, state.nu, b2, 2)
        count = _increment(state.count)
        if nesterov:
            mu_hat = _map(lambda m, g: b1 * m + (1 - b1) * g, _debias(mu, b1, _increment(count)),
                          _debias(updates, b1, count))
        else:
            mu_hat = _debias(mu, b1, count)
        nu_hat = _debias(nu, b2, count)
        updates = _map(lambda m, v: m / (jnp.sqrt(v + eps_root) + eps), mu_hat, nu_hat)
        return updates, ScaleByAdamState(count, _cast_tree(mu, mu_dtype), nu)
    return GradientTransformation(init, update)


def _rms_denominator(second_moment: Array, eps: float, eps_in_sqrt: bool) -> Array:
    return jnp.sqrt(second_moment + eps) if eps_in_sqrt else jnp.sqrt(second_moment) + eps


def scale_by_rms(decay: float = 0.9, eps: float = 1e-8, initial_scale: float = 0.0, eps_in_sqrt: bool = True,
                 bias_correction: bool = False) -> GradientTransformation:
    """RMSProp's rescaling: g / sqrt(nu + eps) with nu = decay nu + (1 - decay) g^2.

    Args:
      decay: decay of the squared-gradient average.
      eps: added to nu inside the square root (outside it when `eps_in_sqrt` is False).
      initial_scale: the initial value of nu.
      eps_in_sqrt: where eps goes (optax's default: inside).
      bias_correction: divide nu by (1 - decay^t) as Adam does.

    Returns:
      A GradientTransformation with a ScaleByRmsState.
    """
    def init(params: Any) -> ScaleByRmsState:
        return ScaleByRmsState(_zero_count(), _map(lambda p: jnp.full_like(p, initial_scale), params))

    def update(updates: Any, state: ScaleByRmsState, params: Any = None) -> tuple[Any, ScaleByRmsState]:
        nu = _ema(updates, state.nu, decay, 2)
        count = _increment(state.count)
        nu_hat = _debias(nu, decay, count) if bias_correction else nu
        updates = _map(lambda g, v: g / _rms_denominator(v, eps, eps_in_sqrt), updates, nu_hat)
        return updates, ScaleByRmsState(count, nu)
    return GradientTransformation(init, update)


def scale_by_stddev(decay: float = 0.9, eps: float = 1e-8, initial_scale: float = 0.0, eps_in_sqrt: bool = True,
                    bias_correction: bool = False) -> GradientTransformation:
    """Centered RMSProp's rescaling: g / sqrt(nu - mu^2 + eps), with mu and nu moving averages of g and g^2.

    Args:
      decay: decay of both moving averages.
      eps: added inside the square root (outside it when `eps_in_sqrt` is False).
      initial_scale: the initial value of nu.
      eps_in_sqrt: where eps goes (optax's default: inside).
      bias_correction: divide mu and nu by (1 - decay^t).

    Returns:
      A GradientTransformation with a ScaleByStddevState.
    """
    def init(params: Any) -> ScaleByStddevState:
        return ScaleByStddevState(_zero_count(), _zeros_like(params),
                                  _map(lambda p: jnp.full_like(p, initial_scale), params))

    def update(updates: Any, state: ScaleByStddevState, params: Any = None) -> tuple[Any, ScaleByStddevState]:
        mu = _ema(updates, state.mu, decay, 1)
        nu = _ema(updates, state.nu, decay, 2)
        count = _increment(state.count)
        mu_hat, nu_hat = (_debias(mu, decay, count), _debias(nu, decay, count)) if bias_correction else (mu, nu)
        updates = _map(lambda g, m, v: g / _rms_denominator(v - jnp.square(m), eps, eps_in_sqrt),
                       updates, mu_hat, nu_hat)
        return updates, ScaleByStddevState(count, mu, nu)
    return GradientTransformation(init, update)


def scale_by_rss(initial_accumulator_value: float = 0.1, eps: float = 1e-7) -> GradientTransformation:
    """Adagrad's rescaling: g / sqrt(sum of all g^2 so far + eps) (0 where that sum is 0).

    Args:
      initial_accumulator_value: the initial sum of squares.
      eps: added inside the square root.

    Returns:
      A GradientTransformation with a ScaleByRssState.
    """
    def update(updates: Any, state: ScaleByRssState, params: Any = None) -> tuple[Any, ScaleByRssState]:
        total = _map(lambda g, s: jnp.square(g) + s, updates, state.sum_of_squares)
        updates = _map(lambda g, s: jnp.where(s > 0, g / jnp.sqrt(s + eps), 0), updates, total)
        return updates, ScaleByRssState(total)
    return GradientTransformation(
        lambda params: ScaleByRssState(_map(lambda p: jnp.full_like(p, initial_accumulator_value), params)), update)


def add_decayed_weights(weight_decay: float = 0.0, mask: Any = None) -> GradientTransformation:
    """Adds weight_decay * params to the updates (decoupled weight decay when chained before the learning rate).

    Args:
      weight_decay: the coefficient.
      mask: optional pytree of Python bools with the params' structure (or a function params -> such a pytree);
        leaves marked False get no decay.

    Returns:
      A GradientTransformation with an EmptyState; its update needs `params`.
    """
    def update(updates: Any, state: EmptyState, params: Any = None) -> tuple[Any, EmptyState]:
        _need_params("add_decayed_weights", params)
        keep = mask(params) if callable(mask) else mask
        if keep is None:
            return _map(lambda g, p: g + weight_decay * p, updates, params), state
        return _map(lambda g, p, k: g + weight_decay * p if k else g, updates, params, keep), state
    return GradientTransformation(lambda params: EmptyState(), update)


def clip(max_delta: float) -> GradientTransformation:
    """Clips every update element to [-max_delta, max_delta].

    Args:
      max_delta: the bound.

    Returns:
      A GradientTransformation with an EmptyState.
    """
    def update(updates: Any, state: EmptyState, params: Any = None) -> tuple[Any, EmptyState]:
        return _map(lambda u: jnp.clip(u, -max_delta, max_delta), updates), state
    return GradientTransformation(lambda params: EmptyState(), update)


def clip_by_global_norm(max_norm: float) -> GradientTransformation:
    """Rescales the updates so that their global l2 norm is at most `max_norm` (unchanged when it already is).

    Args:
      max_norm: the largest allowed global norm.

    Returns:
      A GradientTransformation with an EmptyState.

    Example:
      >>> clipper = fnx.optim.clip_by_global_norm(1.0)
      >>> clipper.update({"g": jnp.array([3.0, 4.0])}, clipper.init(None))[0]
      {'g': Array([0.6, 0.8], dtype=float32)}
    """
    def update(updates: Any, state: EmptyState, params: Any = None) -> tuple[Any, EmptyState]:
        norm = global_norm(updates)
        small = norm < max_norm
        return _map(lambda u: jnp.where(small, u, (u / norm.astype(u.dtype)) * max_norm), updates), state
    return GradientTransformation(lambda params: EmptyState(), update)


# ---- optimizers ----

def sgd(learning_rate: ScalarOrSchedule, momentum: float | None = None, nesterov: bool = False,
        accumulator_dtype: Any = None) -> GradientTransformation:
    """Stochastic gradient descent, optionally with (Nesterov) momentum: updates = -lr * trace(grads).

    Args:
      learning_rate: a float or a schedule.
      momentum: the momentum decay (None: plain SGD).
      nesterov: use Nesterov momentum.
      accumulator_dtype: optional dtype of the momentum trace.

    Returns:
      A GradientTransformation.

    Example:
      >>> opt = fnx.optim.sgd(0.1, momentum=0.9)
    """
    first = trace(momentum, nesterov, accumulator_dtype) if momentum is not None else identity()
    return chain(first, scale_by_learning_rate(learning_rate))


def momentum(learning_rate: ScalarOrSchedule, beta: float = 0.9, nesterov: bool = False) -> GradientTransformation:
    """SGD with momentum `beta`: the same as sgd(learning_rate, momentum=beta, nesterov=nesterov).

    Args:
      learning_rate: a float or a schedule.
      beta: the momentum decay.
      nesterov: use Nesterov momentum.

    Returns:
      A GradientTransformation.
    """
    return sgd(learning_rate, momentum=beta, nesterov=nesterov)


def adam(learning_rate: ScalarOrSchedule, b1: float = 0.9, b2: float = 0.999, eps: float = 1e-8,
         eps_root: float = 0.0, mu_dtype: Any = None, *, nesterov: bool = False) -> GradientTransformation:
    """Adam: updates = -lr * mu_hat / (sqrt(nu_hat + eps_root) + eps); see scale_by_adam.

    Args:
      learning_rate: a float or a schedule.
      b1, b2, eps, eps_root, mu_dtype, nesterov: as for scale_by_adam.

    Returns:
      A GradientTransformation.

    Example:
      >>> opt = fnx.optim.adam(1e-3)
    """
    return chain(scale_by_adam(b1, b2, eps, eps_root, mu_dtype, nesterov=nesterov),
                 scale_by_learning_rate(learning_rate))


def nadam(learning_rate: ScalarOrSchedule, b1: float = 0.9, b2: float = 0.999, eps: float = 1e-8,
          eps_root: float = 0.0, mu_dtype: Any = None) -> GradientTransformation:
    """NAdam: Adam with Nesterov momentum (adam(..., nesterov=True)).

    Args:
      learning_rate, b1, b2, eps, eps_root, mu_dtype: as for adam.

    Returns:
      A GradientTransformation.
    """
    return adam(learning_rate, b1, b2, eps, eps_root, mu_dtype, nesterov=True)


def adamw(learning_rate: ScalarOrSchedule, b1: float = 0.9, b2: float = 0.999, eps: float = 1e-8,
          eps_root: float = 0.0, mu_dtype: Any = None, weight_decay: float = 1e-4, mask: Any = None, *,
          nesterov: bool = False) -> GradientTransformation:
    """Adam with decoupled weight decay: updates = -lr * (adam_update + weight_decay * params).

    Args:
      learning_rate: a float or a schedule.
      b1, b2, eps, eps_root, mu_dtype, nesterov: as for scale_by_adam.
      weight_decay: the decay coefficient (it is multiplied by the learning rate).
      mask: which params decay; see add_decayed_weights.

    Returns:
      A GradientTransformation; its update needs `params`.
    """
    return chain(scale_by_adam(b1, b2, eps, eps_root, mu_dtype, nesterov=nesterov),
                 add_decayed_weights(weight_decay, mask), scale_by_learning_rate(learning_rate))


def rmsprop(learning_rate: ScalarOrSchedule, decay: float = 0.9, eps: float = 1e-8, initial_scale: float = 0.0,
            eps_in_sqrt: bool = True, centered: bool = False, momentum: float | None = None,
            nesterov: bool = False, bias_correction: bool = False) -> GradientTransformation:
    """RMSProp: updates = -lr * g / sqrt(nu + eps) (centered: nu - mu^2), then optional momentum.

    Args:
      learning_rate: a float or a schedule.
      decay, eps, initial_scale, eps_in_sqrt, bias_correction: as for scale_by_rms / scale_by_stddev.
      centered: divide by the standard deviation of g instead of its root mean square.
      momentum: optional momentum decay, applied after the learning rate (as optax does).
      nesterov: use Nesterov momentum.

    Returns:
      A GradientTransformation.
    """
    scaler = scale_by_stddev if centered else scale_by_rms
    last = trace(momentum, nesterov) if momentum is not None else identity()
    return chain(scaler(decay, eps, initial_scale, eps_in_sqrt, bias_correction),
                 scale_by_learning_rate(learning_rate), last)


def adagrad(learning_rate: ScalarOrSchedule, initial_accumulator_value: float = 0.1,
            eps: float = 1e-7) -> GradientTransformation:
    """Adagrad: updates = -lr * g / sqrt(sum of all g^2 so far + eps).

    Args:
      learning_rate: a float or a schedule.
      initial_accumulator_value: the initial sum of squares.
      eps: added inside the square root.

    Returns:
      A GradientTransformation.
    """
    return chain(scale_by_rss(initial_accumulator_value, eps), scale_by_learning_rate(learning_rate))


# ---- schedules: functions from the step count (a Python int or an int32 array) to a value ----

def constant_schedule(value: float) -> Schedule:
    """A schedule that always returns `value`.

    Args:
      value: the constant.

    Returns:
      A schedule `count -> value`.
    """
    return lambda count: value


def polynomial_schedule(init_value: float, end_value: float, power: float, transition_steps: int,
                        transition_begin: int = 0) -> Schedule:
    """(init - end) * (1 - t / transition_steps)^power + end, with t = count - transition_begin clipped to
    [0, transition_steps].

    Args:
      init_value: the value before the transition.
      end_value: the value after it.
      power: the polynomial's power.
      transition_steps: the transition's length (<= 0: constant init_value, with a warning).
      transition_begin: the count at which the transition starts.

    Returns:
      A schedule.
    """
    if transition_steps <= 0:
        warnings.warn("polynomial_schedule: transition_steps <= 0, so the schedule is the constant init_value",
                      stacklevel=2)
        return constant_schedule(init_value)

    def schedule(count: Any) -> Array:
        t = jnp.clip(jnp.asarray(count) - transition_begin, 0, transition_steps)
        return (init_value - end_value) * jnp.power(1 - t / transition_steps, power) + end_value
    return schedule


def linear_schedule(init_value: float, end_value: float, transition_steps: int,
                    transition_begin: int = 0) -> Schedule:
    """Linear interpolation from init_value to end_value over `transition_steps` steps after `transition_begin`.

    Args:
      init_value: the value up to `transition_begin`.
      end_value: the value from transition_begin + transition_steps on.
      transition_steps: the transition's length (<= 0: constant init_value, with a warning).
      transition_begin: the count at which the transition starts.

    Returns:
      A schedule.

    Example:
      >>> fnx.optim.linear_schedule(1.0, 0.0, 10)(5)
      Array(0.5, dtype=float32)
    """
    return polynomial_schedule(init_value, end_value, 1, transition_steps, transition_begin)


def exponential_decay(init_value: float, transition_steps: int, decay_rate: float, transition_begin: int = 0,
                      staircase: bool = False, end_value: float | None = None) -> Schedule:
    """init_value * decay_rate^((count - transition_begin) / transition_steps), init_value before the transition.

    Args:
      init_value: the initial value.
      transition_steps: steps per factor of decay_rate (<= 0: constant init_value, with a warning).
      decay_rate: the decay factor.
      transition_begin: the count at which decay starts.
      staircase: decay in whole steps (floor the exponent).
      end_value: optional bound the value never passes (a floor when decaying, a ceiling when growing).

    Returns:
      A schedule.
    """
    if transition_steps <= 0:
        warnings.warn("exponential_decay: transition_steps <= 0, so the schedule is the constant init_value",
                      stacklevel=2)
        return constant_schedule(init_value)

    def schedule(count: Any) -> Array:
        elapsed = jnp.asarray(count) - transition_begin
        exponent = elapsed / transition_steps
        if staircase: exponent = jnp.floor(exponent)
        value = jnp.where(elapsed <= 0, init_value, init_value * jnp.power(decay_rate, exponent))
        if end_value is not None:
            value = (jnp.maximum if decay_rate < 1 else jnp.minimum)(value, end_value)
        return value
    return schedule


def cosine_decay_schedule(init_value: float, decay_steps: int, alpha: float = 0.0,
                          exponent: float = 1.0) -> Schedule:
    """init_value * ((1 - alpha) * (0.5 (1 + cos(pi t / decay_steps)))^exponent + alpha), t = min(count,
    decay_steps).

    Args:
      init_value: the initial value.
      decay_steps: the length of the decay (must be positive).
      alpha: the final value as a fraction of init_value.
      exponent: the power of the cosine factor.

    Returns:
      A schedule.
    """
    if decay_steps <= 0:
        raise ValueError(f"cosine_decay_schedule: decay_steps must be positive, got {decay_steps}")

    def schedule(count: Any) -> Array:
        t = jnp.minimum(jnp.asarray(count), decay_steps)
        cosine = 0.5 * (1 + jnp.cos(math.pi * t / decay_steps))
        return init_value * ((1 - alpha) * jnp.power(cosine, exponent) + alpha)
    return schedule


def join_schedules(schedules: list[Schedule], boundaries: list[int]) -> Schedule:
    """Runs schedules one after another: from boundaries[i] on, schedules[i + 1](count - boundaries[i]).

    Args:
      schedules: the schedules, in order.
      boundaries: the counts at which each next schedule starts (one fewer than `schedules`).

    Returns:
      A schedule.
    """
    def schedule(count: Any) -> Array:
        count = jnp.asarray(count)
        value = schedules[0](count)
        for boundary, later in zip(boundaries, schedules[1:]):
            value = jnp.where(count < boundary, value, later(count - boundary))
        return value
    return schedule


def warmup_cosine_decay_schedule(init_value: float, peak_value: float, warmup_steps: int, decay_steps: int,
                                 end_value: float = 0.0, exponent: float = 1.0) -> Schedule:
    """Linear warmup from init_value to peak_value over `warmup_steps`, then cosine decay to end_value, reached at
    count `decay_steps` (which includes the warmup).

    Args:
      init_value: the value at count 0.
      peak_value: the value at the end of the warmup.
      warmup_steps: the warmup's length.
      decay_steps: the total length of warmup and decay.
      end_value: the final value.
      exponent: the power of the cosine factor.

    Returns:
      A schedule.
    """
    alpha = 0.0 if peak_value == 0 else end_value / peak_value
    return join_schedules([linear_schedule(init_value, peak_value, warmup_steps),
                           cosine_decay_schedule(peak_value, decay_steps - warmup_steps, alpha, exponent)],
                          [warmup_steps])


def piecewise_constant_schedule(init_value: float, boundaries_and_scales: dict[int, float] | None = None) -> Schedule:
    """init_value, multiplied by scale for every boundary the count has reached (count >= boundary).

    Args:
      init_value: the value before the first boundary.
      boundaries_and_scales: a dict {boundary count: factor}; factors must be non-negative.

    Returns:
      A schedule.

    Example:
      >>> fnx.optim.piecewise_constant_schedule(1.0, {10: 0.1, 20: 0.5})(15)
      Array(0.1, dtype=float32)
    """
    steps = sorted((boundaries_and_scales or {}).items())
    if any(factor < 0 for _, factor in steps):
        raise ValueError("piecewise_constant_schedule: the scales must be non-negative")

    def schedule(count: Any) -> Array:
        count = jnp.asarray(count)
        value = init_value
        for boundary, factor in steps:
            value = jnp.where(count < boundary, value, value * factor)
        return value
    return schedule
