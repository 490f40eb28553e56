"""Random well-typed fnx programs as data: a hypothesis strategy that draws a straight-line program (inputs of
random shapes and dtypes, then up to ~30 steps over a pool of values), rendered as Python source that a developer
can paste. The source is the single definition of the program: the tests exec it with `jnp` bound to fnx.numpy
(eager on interp or cpu, under jit, under grad) and to the float64 numpy oracle in fuzz/oracle.py.

Shapes and dtypes of every value are tracked here, mirroring JAX's promotion lattice over the four dtypes used
(bool < int32 < float16 < float32, Python scalars weak), so every drawn step is valid by construction.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
from hypothesis import strategies as st

DTYPES = ("float32", "float16", "int32", "bool")
FLOATS = ("float32", "float16")
ORDER = {"bool": 0, "int32": 1, "float16": 2, "float32": 3}
DIMS = (2, 1, 3, 4, 5, 7, 8, 16, 17, 31, 32, 33, 63, 64, 65, 127, 128, 129, 255, 256, 257)  # shrinks to 2 first
MAX_ELEMS = 66049          # 257 * 257
MAX_MATMUL_FLOPS = 1 << 22
GENE = 16                  # integers drawn per step (a step reads 0 past the end)
JNP_DTYPE = {"float32": "jnp.float32", "float16": "jnp.float16", "int32": "jnp.int32", "bool": "jnp.bool_"}


def promote(a: str, b: str) -> str:
    """JAX's result type of two arrays (a, b in DTYPES) or an array and a weak Python scalar ('pyint'/'pyfloat')."""
    if b == "pyint": return "int32" if a == "bool" else a
    if b == "pyfloat": return "float32" if a in ("bool", "int32") else a
    if a in ("pyint", "pyfloat"): return promote(b, a)
    return a if ORDER[a] >= ORDER[b] else b


def broadcast(*shapes):
    return tuple(np.broadcast_shapes(*shapes))


def compatible(s1, s2) -> bool:
    try:
        np.broadcast_shapes(s1, s2)
        return True
    except ValueError:
        return False


@dataclass
class Var:
    name: str
    shape: tuple
    dtype: str


@dataclass
class Input:
    name: str
    shape: tuple
    dtype: str
    seed: int
    scale: float


@dataclass
class Program:
    inputs: list
    lines: list = field(default_factory=list)      # (name, expression source)
    outputs: list = field(default_factory=list)    # names
    vars: dict = field(default_factory=dict)       # name -> Var
    grad: bool = False                             # drawn for the gradient test (float32 only)

    def program_source(self) -> str:
        args = ", ".join(i.name for i in self.inputs)
        body = [f"    {name} = {expr}" for name, expr in self.lines]
        outs = ", ".join(self.outputs)
        return "\n".join([f"def program({args}):", *body, f"    return ({outs},)"]) + "\n"

    def input_source(self) -> str:
        return "args = [" + ", ".join(
            f"_rand({i.shape!r}, {i.dtype!r}, seed={i.seed}, scale={i.scale!r})" for i in self.inputs) + "]\n"

    def float_outputs(self) -> list:
        return [k for k, n in enumerate(self.outputs) if self.vars[n].dtype in FLOATS]

    def source(self) -> str:
        """A self-contained script: paste it into a Python session at the repository root to reproduce."""
        check = GRAD_CHECK if self.grad else FORWARD_CHECK
        return HEADER + "\n" + self.program_source() + "\n\n" + self.input_source() + check

    def __repr__(self) -> str:
        return "\n" + self.source()


HEADER = '''import numpy as np
import fnx, fnx.numpy as jnp


def _rand(shape, dtype, seed, scale):
    r = np.random.default_rng(seed)
    if dtype == "bool": return r.random(shape) < 0.5
    if dtype == "int32": return r.integers(-int(scale), int(scale) + 1, shape).astype(np.int32)
    return (r.standard_normal(shape) * scale).astype(dtype)

'''

FORWARD_CHECK = '''
with fnx.default_device("interp"):
    expected = program(*[jnp.asarray(a) for a in args])        # the numpy oracle backend
eager = program(*[jnp.asarray(a) for a in args])               # cpu, one kernel per op
jitted = fnx.jit(program)(*[jnp.asarray(a) for a in args])     # cpu, fused
for k, (e, g, j) in enumerate(zip(expected, eager, jitted)):
    e, g, j = np.asarray(e), np.asarray(g), np.asarray(j)
    print(k, e.dtype, g.dtype, j.dtype, e.shape,
          "max |eager-interp|", np.max(np.abs(g.astype(np.float64) - e), initial=0),
          "max |jit-interp|", np.max(np.abs(j.astype(np.float64) - e), initial=0))
'''

GRAD_CHECK = '''W = {k: np.random.default_rng(1000 + k).standard_normal(np.shape(o)).astype(np.float32)
     for k, o in enumerate(program(*[jnp.asarray(a) for a in args])) if o.dtype == jnp.float32}


def loss(*xs):
    outs = program(*xs)
    return sum(jnp.sum(outs[k] * w) for k, w in W.items())


xs = [jnp.asarray(a) for a in args]
argnums = tuple(range(len(xs)))
grads = {"grad": fnx.grad(loss, argnums)(*xs), "jit(grad)": fnx.jit(fnx.grad(loss, argnums))(*xs)}
# the same program in float64 numpy (tests/fuzz/oracle.py), by central differences along a random direction
import sys, types; sys.path.insert(0, "tests"); from fuzz import oracle
def loss64(s, d):
    bind = lambda jnp_like: types.FunctionType(program.__code__, {**globals(), "jnp": jnp_like})
    outs, _ = oracle.run(bind, [np.asarray(a, np.float64) + s * di for a, di in zip(args, d)], exact=True)
    return sum(float(np.sum(outs[k].v * w)) for k, w in W.items())
d = [np.random.default_rng(7).standard_normal(np.shape(a)) for a in args]
h = 1e-5
print("finite differences", (loss64(h, d) - loss64(-h, d)) / (2 * h))
for name, g in grads.items(): print(name, sum(float(np.sum(np.asarray(gi, np.float64) * di)) for gi, di in zip(g, d)))
'''


# ---- drawing ----

def _scalar_src(v) -> str:
    return repr(v)


class _Builder:
    def __init__(self, draw, grad: bool):
        self.draw, self.grad = draw, grad
        self.prog = Program(inputs=[], grad=grad)
        self.pool: list[Var] = []
        self.n = 0
        self.gene, self.pos = None, 0

    def add_var(self, expr: str, shape, dtype) -> Var:
        name = f"v{self.n}"
        self.n += 1
        var = Var(name, tuple(int(d) for d in shape), dtype)
        self.prog.lines.append((name, expr))
        self.prog.vars[name] = var
        self.pool.append(var)
        return var

    # Choices come from hypothesis directly while drawing the inputs, and from the current step's gene (a tuple
    # of integers, one list element per step) while drawing the steps: hypothesis shrinks a program by deleting
    # whole steps from that list and by moving each gene's integers towards 0 (the first choice of each kind).
    def _next(self, n: int, label=None) -> int:
        if n <= 1: return 0
        if self.gene is None: return self.draw(st.integers(0, n - 1), label=label)
        value = self.gene[self.pos] if self.pos < len(self.gene) else 0
        self.pos += 1
        return value % n

    def pick(self, pred=lambda v: True, label="operand"):
        """A pool value satisfying pred, biased towards recent values (None if there is none)."""
        cands = [v for v in self.pool if pred(v)]
        if not cands: return None
        i = self._next(len(cands), label)
        return cands[len(cands) - 1 - i]          # shrinks towards the most recent value

    def integers(self, lo, hi, label=None):
        return lo + self._next(hi - lo + 1, label)

    def choice(self, seq, label=None):
        return seq[self._next(len(seq), label)]

    def boolean(self, label=None):
        return self._next(2, label) == 1

    def permutation(self, n: int):
        rest, perm = list(range(n)), []
        while rest: perm.append(rest.pop(self._next(len(rest), "permutation")))
        return perm


def _size(shape) -> int:
    return int(math.prod(shape))


def _draw_base_shape(b: _Builder):
    rank = b.choice((2, 1, 3, 0), label="rank")
    shape = [b.choice(DIMS, label="dim") for _ in range(rank)]
    while _size(shape) > MAX_ELEMS:   # keep the drawn dims, shrink the largest until it fits
        k = int(np.argmax(shape))
        shape[k] = max(1, shape[k] // 4)
    return tuple(shape)


def _input_shape(b: _Builder, base):
    drop = 0
    if base and b.integers(0, 3, label="drop leading axes") == 3:
        drop = b.integers(1, len(base), label="leading axes dropped")
    shape = list(base[drop:])
    for k in range(len(shape)):
        if shape[k] > 1 and b.integers(0, 3, label="size-1 axis") == 3: shape[k] = 1
    return tuple(shape)


OPS = ("binary", "unary_float", "compare", "where", "unary", "divide", "reduce", "astype", "int_op", "reshape",
       "transpose", "slice", "broadcast", "concat", "matmul", "cumsum", "flip",
       "unary_float", "binary", "unary_float", "reduce")   # weights: the arithmetic more often than the shapes


@st.composite
def programs(draw, grad: bool = False, max_steps: int = 30):
    b = _Builder(draw, grad)
    base = _draw_base_shape(b)
    for k in range(b.integers(1, 3, label="inputs")):
        shape = _input_shape(b, base)
        dtype = "float32" if grad else b.choice(DTYPES, label="input dtype")
        scale = {"float32": (1.0, 10.0, 0.1, 1e4), "float16": (1.0, 10.0, 0.1, 1e4), "int32": (3, 100, 70000),
                 "bool": (1,)}[dtype]
        inp = Input(f"x{k}", shape, dtype, b.integers(0, 2 ** 16, label="seed"), b.choice(scale, label="scale"))
        b.prog.inputs.append(inp)
        var = Var(inp.name, shape, dtype)
        b.prog.vars[inp.name] = var
        b.pool.append(var)
    at_least = draw(st.integers(1, max_steps), label="at least this many steps")   # lists alone stay short
    genes = draw(st.lists(st.tuples(*[st.integers(0, 2 ** 16 - 1)] * GENE), min_size=at_least,
                          max_size=max_steps), label="steps")
    for gene in genes:
        b.gene, b.pos = gene, 0
        _STEPS[b.choice(OPS, label="op")](b)
    b.gene = None
    used = set()
    for _, expr in b.prog.lines:
        used.update(tok for tok in _tokens(expr))
    sinks = [v.name for v in b.pool[len(b.prog.inputs):] if v.name not in used]
    if not sinks: sinks = [b.pool[-1].name]
    if grad and not any(b.prog.vars[s].dtype == "float32" for s in sinks):
        last = b.prog.vars[sinks[-1]]
        sinks.append(b.add_var(f"jnp.astype({last.name}, jnp.float32)", last.shape, "float32").name)
    b.prog.outputs = sinks
    return b.prog


def _tokens(expr: str):
    import re
    return re.findall(r"\b[vx]\d+\b", expr)


# ---- steps: each draws its operands from the pool and appends one line ----

def _numeric(v: Var) -> bool:
    return v.dtype != "bool"


def _float(v: Var) -> bool:
    return v.dtype in FLOATS


def _partner(b: _Builder, a: Var, pred=lambda v: True):
    """A second operand broadcast-compatible with a (a itself when nothing else fits)."""
    cand = b.pick(lambda v: compatible(v.shape, a.shape) and _size(broadcast(v.shape, a.shape)) <= MAX_ELEMS
                  and pred(v), label="second operand")
    return cand


def step_binary(b: _Builder):
    a = b.pick(label="first operand")
    fn = b.choice(("add", "subtract", "multiply", "maximum", "minimum"), label="binary fn")
    if a.dtype != "bool" and b.boolean(label="scalar operand"):
        # only scalars that keep the array's dtype: a weakly typed result (bool + 1, int32 + 2.0) would
        # promote differently downstream (JAX's weak types), which this generator does not model
        c = b.choice((2.0, -1.5, 0.5, 3, -2, 1e4) if a.dtype in FLOATS else (3, -2, 7, 65537), label="scalar")
        dt = a.dtype
        if fn in ("add", "subtract", "multiply") and b.boolean(label="operator form"):
            sym = {"add": "+", "subtract": "-", "multiply": "*"}[fn]
            b.add_var(f"{a.name} {sym} {_scalar_src(c)}", a.shape, dt)
        else:
            b.add_var(f"jnp.{fn}({a.name}, {_scalar_src(c)})", a.shape, dt)
        return
    o = _partner(b, a)
    if a.dtype == "bool" and o.dtype == "bool" and fn == "subtract": fn = "logical_xor"
    dt = promote(a.dtype, o.dtype)
    b.add_var(f"jnp.{fn}({a.name}, {o.name})", broadcast(a.shape, o.shape), dt)


def step_divide(b: _Builder):
    a = b.pick(label="numerator")
    o = _partner(b, a, _float)
    if o is None:
        step_unary_float(b)
        return
    dt = promote(a.dtype, o.dtype)
    b.add_var(f"jnp.divide({a.name}, {o.name} * {o.name} + 1.0)", broadcast(a.shape, o.shape), dt)


UNARY_FLOAT = {
    "exp": "jnp.exp(jnp.clip({a}, -8.0, 8.0))",
    "log": "jnp.log({a} * {a} + 1.0)",
    "sqrt": "jnp.sqrt({a} * {a} + 0.25)",
    "tanh": "jnp.tanh({a})",
    "sin": "jnp.sin({a})",
    "cos": "jnp.cos({a})",
}


def step_unary_float(b: _Builder):
    a = b.pick(_float, label="float operand")
    if a is None:
        step_astype(b, to="float32")
        return
    fn = b.choice(tuple(UNARY_FLOAT), label="float fn")
    operand = a.name
    if b.grad and fn in ("sin", "cos"):
        # the gradient test compares float32 with float64: sin' of a large argument depends on that argument's
        # absolute rounding error (magnitude 1e3 known to 0.05: 5% off, fnx and JAX alike in float32), which the
        # gradient tolerance does not model; at |x| ~ 1e18 even float64 finite differences fail. The forward
        # test, whose bound does carry it, keeps any x.
        operand = f"jnp.clip({a.name}, -8.0, 8.0)"
    b.add_var(UNARY_FLOAT[fn].format(a=operand), a.shape, a.dtype)


def step_unary(b: _Builder):
    a = b.pick(label="operand")
    if a.dtype == "bool":
        b.add_var(f"jnp.logical_not({a.name})", a.shape, "bool")
        return
    fn = b.choice(("negative", "abs", "square"), label="unary fn")
    b.add_var(f"jnp.{fn}({a.name})", a.shape, a.dtype)


def step_compare(b: _Builder):
    a = b.pick(label="compared")
    fn = b.choice(("less", "greater_equal", "greater", "less_equal", "equal", "not_equal"), label="compare fn")
    if a.dtype == "bool": fn = fn if fn in ("equal", "not_equal") else "not_equal"
    if b.boolean(label="against a scalar"):
        c = 0.5 if a.dtype in FLOATS else 0 if a.dtype == "int32" else True
        b.add_var(f"jnp.{fn}({a.name}, {c!r})", a.shape, "bool")
        return
    o = _partner(b, a, lambda v: (v.dtype == "bool") == (a.dtype == "bool"))
    b.add_var(f"jnp.{fn}({a.name}, {o.name})", broadcast(a.shape, o.shape), "bool")


def step_where(b: _Builder):
    x = b.pick(label="where x")
    y = _partner(b, x)
    shape = broadcast(x.shape, y.shape)
    c = b.pick(lambda v: v.dtype == "bool" and compatible(v.shape, shape)
               and _size(broadcast(v.shape, shape)) <= MAX_ELEMS, label="condition")
    if c is None or b.boolean(label="inline condition"):
        cond = f"jnp.greater({x.name}, {y.name})" if x.dtype != "bool" or y.dtype != "bool" else \
            f"jnp.not_equal({x.name}, {y.name})"
        b.add_var(f"jnp.where({cond}, {x.name}, {y.name})", shape, promote(x.dtype, y.dtype))
        return
    b.add_var(f"jnp.where({c.name}, {x.name}, {y.name})", broadcast(c.shape, shape), promote(x.dtype, y.dtype))


def step_int_op(b: _Builder):
    a = b.pick(lambda v: v.dtype in ("int32", "bool"), label="integer operand")
    if a is None:
        step_astype(b, to="int32")
        return
    fn = b.choice(("bitwise_and", "bitwise_or", "bitwise_xor", "floor_divide", "remainder"), label="int fn")
    if fn in ("floor_divide", "remainder"):
        if a.dtype != "int32":
            fn = "bitwise_xor"
        else:
            o = _partner(b, a, lambda v: v.dtype == "int32")
            b.add_var(f"jnp.{fn}({a.name}, ({o.name} & 7) + 1)", broadcast(a.shape, o.shape), "int32")
            return
    o = _partner(b, a, lambda v: v.dtype in ("int32", "bool"))
    b.add_var(f"jnp.{fn}({a.name}, {o.name})", broadcast(a.shape, o.shape), promote(a.dtype, o.dtype))


def step_astype(b: _Builder, to=None):
    a = b.pick(label="cast operand")
    targets = ("float32", "int32", "bool") if b.grad else DTYPES
    to = to or b.choice(targets, label="cast to")
    b.add_var(f"jnp.astype({a.name}, {JNP_DTYPE[to]})", a.shape, to)


def _axes(b: _Builder, ndim: int):
    if ndim == 0: return None
    kind = b.integers(0, 2, label="axis kind")
    if kind == 0: return b.integers(-ndim, ndim - 1, label="axis")
    if kind == 1: return None
    axes = tuple(k for k in range(ndim) if b.boolean(label="reduce this axis"))
    return axes or (0,)


def _reduced_shape(shape, axis, keepdims):
    nd = len(shape)
    axes = range(nd) if axis is None else [axis % nd] if isinstance(axis, int) else [x % nd for x in axis]
    return tuple(1 if k in axes else d for k, d in enumerate(shape) if keepdims or k not in axes)


def step_reduce(b: _Builder):
    a = b.pick(label="reduced")
    fn = b.choice(("sum", "max", "mean", "min"), label="reduction")
    if fn == "mean" and a.dtype == "bool": fn = "sum"
    axis = _axes(b, len(a.shape))
    keepdims = b.boolean(label="keepdims")
    shape = _reduced_shape(a.shape, axis, keepdims)
    dt = {"sum": "int32" if a.dtype == "bool" else a.dtype, "mean": "float32" if a.dtype == "int32" else a.dtype,
          "max": a.dtype, "min": a.dtype}[fn]
    b.add_var(f"jnp.{fn}({a.name}, axis={axis!r}, keepdims={keepdims})", shape, dt)


def step_cumsum(b: _Builder):
    a = b.pick(lambda v: len(v.shape) >= 1, label="cumsum operand")
    if a is None:
        step_reduce(b)
        return
    axis = b.integers(-len(a.shape), len(a.shape) - 1, label="axis")
    b.add_var(f"jnp.cumsum({a.name}, axis={axis})", a.shape, "int32" if a.dtype == "bool" else a.dtype)


def step_reshape(b: _Builder):
    a = b.pick(label="reshaped")
    shape = list(a.shape)
    kind = b.integers(0, 3, label="reshape kind")
    if kind == 0 and len(shape) >= 2:            # merge two adjacent axes
        k = b.integers(0, len(shape) - 2, label="axis")
        shape[k:k + 2] = [shape[k] * shape[k + 1]]
    elif kind == 1 and shape:                    # split an axis by one of its factors
        k = b.integers(0, len(shape) - 1, label="axis")
        factors = [f for f in range(2, shape[k]) if shape[k] % f == 0] or [1]
        f = b.choice(factors, label="factor")
        shape[k:k + 1] = [f, shape[k] // f]
    elif kind == 2:                              # insert a size-1 axis
        k = b.integers(0, len(shape), label="position")
        shape.insert(k, 1)
    else:                                        # flatten
        shape = [_size(shape)]
    if len(shape) > 4: shape = [_size(shape)]
    b.add_var(f"jnp.reshape({a.name}, {tuple(shape)!r})", shape, a.dtype)


def step_transpose(b: _Builder):
    a = b.pick(lambda v: len(v.shape) >= 2, label="transposed")
    if a is None:
        step_reshape(b)
        return
    perm = b.permutation(len(a.shape))
    b.add_var(f"jnp.transpose({a.name}, {tuple(perm)!r})", tuple(a.shape[p] for p in perm), a.dtype)


def step_slice(b: _Builder):
    a = b.pick(lambda v: len(v.shape) >= 1, label="sliced")
    if a is None:
        step_reshape(b)
        return
    parts, shape = [], []
    for d in a.shape:
        if b.boolean(label="slice this axis"):
            step = b.choice((1, 2, -1, 3, -2), label="step")
            start = b.integers(0, d - 1, label="start")
            if step > 0:
                stop = b.integers(start + 1, d, label="stop")
                parts.append(f"{start}:{stop}" + (f":{step}" if step != 1 else ""))
            else:
                stop = b.integers(-1, start - 1, label="stop")
                parts.append(f"{start}:{stop if stop >= 0 else ''}:{step}")
            shape.append(len(range(d)[slice(start, stop if stop >= 0 else None, step)]))
        elif b.integers(0, 4, label="index") == 4:
            i = b.integers(-d, d - 1, label="index")
            parts.append(str(i))
        else:
            parts.append(":")
            shape.append(d)
    b.add_var(f"{a.name}[{', '.join(parts)}{',' if len(parts) == 1 else ''}]", shape, a.dtype)


def step_broadcast(b: _Builder):
    a = b.pick(label="broadcast")
    grown = (3, 2, 4, 5, 7, 8, 16, 17)
    shape = [b.choice(grown, label="size of new axis") if d == 1 and b.boolean(label="grow") else d for d in a.shape]
    if len(shape) < 4 and b.boolean(label="new leading axis"):
        shape.insert(0, b.choice(grown, label="new axis"))
    if _size(shape) > MAX_ELEMS: shape = list(a.shape)
    b.add_var(f"jnp.broadcast_to({a.name}, {tuple(shape)!r})", shape, a.dtype)


def step_concat(b: _Builder):
    a = b.pick(lambda v: len(v.shape) >= 1, label="concatenated")
    if a is None:
        step_broadcast(b)
        return
    axis = b.integers(0, len(a.shape) - 1, label="axis")
    o = b.pick(lambda v: len(v.shape) == len(a.shape) and all(x == y for k, (x, y) in enumerate(zip(v.shape, a.shape))
                                                              if k != axis), label="second part")
    shape = list(a.shape)
    shape[axis] += o.shape[axis]
    if _size(shape) > MAX_ELEMS:
        step_flip(b)
        return
    b.add_var(f"jnp.concatenate([{a.name}, {o.name}], axis={axis})", shape, promote(a.dtype, o.dtype))


def step_flip(b: _Builder):
    a = b.pick(lambda v: len(v.shape) >= 1, label="flipped")
    if a is None:
        step_unary(b)
        return
    axis = b.integers(0, len(a.shape) - 1, label="axis")
    b.add_var(f"jnp.flip({a.name}, axis={axis})", a.shape, a.dtype)


def _matmul_shape(s1, s2):
    if len(s1) == 0 or len(s2) == 0: return None
    x = (1,) + tuple(s1) if len(s1) == 1 else tuple(s1)
    y = tuple(s2) + (1,) if len(s2) == 1 else tuple(s2)
    if x[-1] != y[-2]: return None
    if not compatible(x[:-2], y[:-2]): return None
    batch = broadcast(x[:-2], y[:-2])
    out = batch + (() if len(s1) == 1 else (x[-2],)) + (() if len(s2) == 1 else (y[-1],))
    flops = _size(batch) * x[-2] * x[-1] * y[-1]
    if flops > MAX_MATMUL_FLOPS or _size(out) > MAX_ELEMS: return None
    return out


def step_matmul(b: _Builder):
    a = b.pick(lambda v: len(v.shape) >= 1 and v.dtype != "bool", label="left factor")
    if a is None:
        step_binary(b)
        return
    o = b.pick(lambda v: v.dtype != "bool" and _matmul_shape(a.shape, v.shape) is not None, label="right factor")
    if o is not None:
        expr = f"{a.name} @ {o.name}" if b.boolean(label="operator form") else f"jnp.matmul({a.name}, {o.name})"
        b.add_var(expr, _matmul_shape(a.shape, o.shape), promote(a.dtype, o.dtype))
        return
    if len(a.shape) >= 2:   # a @ a^T over the last two axes
        perm = tuple(range(len(a.shape) - 2)) + (len(a.shape) - 1, len(a.shape) - 2)
        tshape = tuple(a.shape[p] for p in perm)
        out = _matmul_shape(a.shape, tshape)
        if out is not None:
            b.add_var(f"jnp.matmul({a.name}, jnp.transpose({a.name}, {perm!r}))", out, a.dtype)
            return
    if len(a.shape) == 1:
        b.add_var(f"jnp.matmul({a.name}, {a.name})", (), a.dtype)
        return
    step_binary(b)


_STEPS = {"binary": step_binary, "unary_float": step_unary_float, "compare": step_compare, "where": step_where,
          "unary": step_unary, "divide": step_divide, "reduce": step_reduce, "astype": step_astype,
          "int_op": step_int_op, "reshape": step_reshape, "transpose": step_transpose, "slice": step_slice,
          "broadcast": step_broadcast, "concat": step_concat, "matmul": step_matmul, "cumsum": step_cumsum,
          "flip": step_flip}
