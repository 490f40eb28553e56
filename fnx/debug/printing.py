"""Readable text for IR graphs: `format_function` prints a FUNCTION like a small program (make_graph, as_text)."""
from __future__ import annotations

from fnx.uop import GroupOp, Ops, UOp

SHORT_DTYPES = {"bool": "bool", "float32": "f32", "float64": "f64", "float16": "f16", "bfloat16": "bf16",
                "int8": "i8", "int16": "i16", "int32": "i32", "int64": "i64", "uint8": "u8", "uint16": "u16",
                "uint32": "u32", "uint64": "u64"}


def type_str(u: UOp) -> str:
    return f"{SHORT_DTYPES.get(u.dtype.name, u.dtype.name)}[{','.join(map(str, u.shape))}]"


def arg_str(u: UOp) -> str:
    if u.op is Ops.REDUCE: return f"{u.arg.op.name.lower()} axes={u.arg.axes}"
    if u.op is Ops.FLIP: return f"axes={tuple(i for i, f in enumerate(u.arg) if f)}"
    if u.op is Ops.INDEX: return f"axis={u.arg}"
    if u.op is Ops.SCATTER: return f"axis={u.arg.axis} mode={u.arg.mode}"
    if u.op is Ops.IOTA: return f"axis={u.arg.axis}"
    if u.op in GroupOp.Movement: return str(u.arg)
    if u.op is Ops.COPY: return str(u.arg)
    if u.op is Ops.COLLECTIVE:
        a = u.arg
        extra = {"all_gather": f" axis={a.axis}", "psum_scatter": f" axis={a.axis}", "ppermute": f" perm={a.perm}",
                 "all_to_all": f" split={a.split_axis} concat={a.axis}"}.get(a.kind, "")
        return f"{a.kind} over {a.axis_name!r}{extra}"
    return ""


def call_name(u: UOp) -> str:
    """'call custom_jvp(tanh)', 'call checkpoint(f)', ...: what kind of call and of which function."""
    kind = getattr(u.arg, "kind", "function")
    fun = getattr(getattr(u.arg, "fun", None), "__name__", "") or getattr(u.arg, "name", "")
    return f"call {'custom_' + kind if kind in ('jvp', 'vjp') else kind}({fun})"


def format_function(fn: UOp, name: str = "function") -> str:
    """A FUNCTION as text: its PARAMs, one line per node, and the returned tuple."""
    body = fn.src[0] if fn.op is Ops.FUNCTION else fn
    params = list(fn.src[1:]) if fn.op is Ops.FUNCTION and all(p.op is Ops.PARAM for p in fn.src[1:]) else \
        sorted((u for u in body.toposort if u.op is Ops.PARAM), key=lambda p: p.arg.slot)
    names: dict[UOp, str] = {p: f"p{p.arg.slot}" for p in params}
    lines = [f"{name}({', '.join(f'{names[p]}: {type_str(p)}' for p in params)}):"]
    for u in body.graph:
        if u in names or u is body: continue
        if u.op in (Ops.CALL, Ops.FUNCTION) or u.op in GroupOp.Control:
            names[u] = f"c{len(names)}"
            kind = call_name(u) if u.op is not Ops.COND and u.op not in GroupOp.Control else u.op.name.lower()
            body_sizes = "/".join(str(len(b.toposort)) for b in u.src[:len(u.src) - len(u.operands)])
            lines.append(f"  {names[u]} = {kind} {' '.join(names[s] for s in u.operands)}  # body nodes: {body_sizes}")
            continue
        if u.op is Ops.GETTUPLE:
            names[u] = f"v{len(names) - len(params)}"
            lines.append(f"  {names[u]}: {type_str(u)} = {names[u.src[0]]}[{u.arg}]")
            continue
        if u.op is Ops.CONST and u.shape == ():
            names[u] = repr(u.arg.value)
            continue
        names[u] = f"v{len(names) - len(params)}"
        operands = " ".join(names[s] for s in u.src)
        detail = repr(u.arg.value) if u.op is Ops.CONST else arg_str(u)
        dtype = f" to {u.dtype.name}" if u.op in (Ops.CAST, Ops.BITCAST) else ""
        text = " ".join(part for part in (f"{u.op.name.lower()}{dtype}", operands, detail) if part)
        lines.append(f"  {names[u]}: {type_str(u)} = {text}")
    lines.append(f"  return ({', '.join(names[s] for s in body.src)}{',' if len(body.src) == 1 else ''})")
    return "\n".join(lines)
