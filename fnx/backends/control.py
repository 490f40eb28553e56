"""Host-side execution of structured control flow (COND, WHILE, SCAN), shared by every backend.

A backend hands in `prepare(fn)`, which compiles one body (a FUNCTION over the node's operands) and returns a
function from host arrays to host arrays; the loops here prepare each body once and call it per step.
"""
from __future__ import annotations

from typing import Callable

import numpy as np

from fnx import dtypes
from fnx.uop import Ops, ParamArg, UOp

Prepare = Callable[[UOp], Callable[[list[np.ndarray]], list[np.ndarray]]]


def operands(node: UOp) -> list[UOp]:
    """The node's value operands, in the order its bodies number their PARAMs (COND: without the predicate)."""
    if node.op is Ops.COND: return list(node.src[3:])
    return list(node.src[1:] if node.op is Ops.SCAN else node.src[2:])


def body_function(node: UOp, body: UOp, avals: list[tuple[tuple[int, ...], dtypes.DType]]) -> UOp:
    """FUNCTION(body, PARAM 0..n-1) for a body of `node` taking values of `avals` (unused slots included)."""
    tag = node.binds
    params = [UOp(Ops.PARAM, dt, (), ParamArg(i, shape, None, tag)) for i, (shape, dt) in enumerate(avals)]
    used = {p.arg.slot: p for p in body.toposort if p.op is Ops.PARAM and p.arg.tag == tag}
    return UOp(Ops.FUNCTION, dtypes.bool_, (body, *[used.get(i, p) for i, p in enumerate(params)]))


def run_control(node: UOp, inputs: list[np.ndarray], prepare: Prepare) -> list[np.ndarray]:
    """The outputs of a control node given its inputs (COND: the predicate first, then the operands)."""
    if node.op is Ops.COND:
        pred, values = bool(np.asarray(inputs[0]).reshape(())), inputs[1:]
        body = node.src[0] if pred else node.src[1]
        return prepare(body_function(node, body, _avals(node)))(values)
    if node.op is Ops.WHILE:
        carry = list(inputs)
        body_fn = prepare(body_function(node, node.src[0], _avals(node)))
        cond_fn = prepare(body_function(node, node.src[1], _avals(node)))
        while bool(np.asarray(cond_fn(carry)[0]).reshape(())):
            carry = body_fn(carry)
        return carry
    return _scan(node, inputs, prepare)


def _avals(node: UOp) -> list:
    return [(u.shape, u.dtype) for u in operands(node)]


def _scan(node: UOp, inputs: list[np.ndarray], prepare: Prepare) -> list[np.ndarray]:
    ncarry, length, reverse, nxs = node.arg.ncarry, node.arg.length, node.arg.reverse, node.arg.nxs
    carry, xs, free = inputs[:ncarry], inputs[ncarry:ncarry + nxs], inputs[ncarry + nxs:]
    body = node.src[0]
    step_avals = [(u.shape, u.dtype) for u in operands(node)]
    step_avals = step_avals[:ncarry] + [(shape[1:], dt) for shape, dt in step_avals[ncarry:ncarry + nxs]] + \
        step_avals[ncarry + nxs:]
    step = prepare(body_function(node, body, step_avals))
    ys = [np.empty((length,) + o.shape, o.dtype.np) for o in body.src[ncarry:]]
    for t in (range(length - 1, -1, -1) if reverse else range(length)):
        out = step(carry + [x[t] for x in xs] + free)
        carry = out[:ncarry]
        for y, value in zip(ys, out[ncarry:]): y[t] = value
    return carry + ys
