"""fnx.debug.pictures: the SVG pictures of graphs, lowering stages and schedules are well-formed XML, draw what
the IR holds (one box per node, one curve per dependency, pointing at its user), never overlap their boxes and
come out the same every time; .png goes through cairosvg."""
import os
import re
import struct
import xml.etree.ElementTree as ET
import zlib
from types import SimpleNamespace

import pytest
from hypothesis import given
from hypothesis import strategies as st

import fnx
import fnx.numpy as jnp
from fnx.debug.pictures import Graph, Node, Picture, draw_function, draw_graph, draw_lowering, draw_schedule
from fnx.debug.printing import format_function
from fnx.lower.pipeline import STAGES
from fnx.uop import Ops

SVG = "{http://www.w3.org/2000/svg}"


# ---- functions to draw ----

def mlp_loss(params, x, y):
    h = x
    for w, b in params[:-1]:
        h = jnp.tanh(h @ w + b)
    w, b = params[-1]
    return ((h @ w + b - y) ** 2).mean()


def mlp_args(sizes=(16, 32, 4), batch=8):
    params = [(jnp.ones((m, n)) * 0.1, jnp.zeros(n)) for m, n in zip(sizes, sizes[1:])]
    return params, jnp.ones((batch, sizes[0])), jnp.ones((batch, sizes[-1]))


def dense_tanh_sum(x, w, b):
    return jnp.tanh(x @ w + b).sum(axis=-1)


def dense_args():
    return jnp.ones((64, 128)), jnp.ones((128, 32)), jnp.zeros(32)


def looped(x):
    return fnx.lax.fori_loop(0, 5, lambda i, c: c * 2.0 + 1.0, x).sum()


def long_chain(x, y):
    """Several hundred nodes: y is used all along the chain (its edges share one trunk)."""
    peaks = []
    for i in range(100):
        x = jnp.sin(x) * y + x.sum(axis=0)
        if i % 10 == 0: peaks.append(x.max())
    return x, peaks


# ---- reading the SVG back ----

def parse(picture: Picture) -> ET.Element:
    return ET.fromstring(picture.svg)


def groups(root: ET.Element, cls: str = "node") -> list[ET.Element]:
    return [g for g in root.iter(f"{SVG}g") if g.get("class") == cls]


def texts(group: ET.Element) -> list[str]:
    return [t.text or "" for t in group.iter(f"{SVG}text")]


def rect_of(group: ET.Element) -> tuple[float, float, float, float]:
    r = group.find(f"{SVG}rect")
    return tuple(float(r.get(k)) for k in ("x", "y", "width", "height"))


def edges(root: ET.Element) -> list[str]:
    return [p.get("d") for p in root.iter(f"{SVG}path") if p.get("class") == "edge"]


def assert_no_overlaps(rects: list[tuple[float, float, float, float]]) -> None:
    by_top = sorted(rects, key=lambda r: r[1])
    for i, (x, y, w, h) in enumerate(by_top):
        for x2, y2, w2, h2 in by_top[i + 1:]:
            if y2 >= y + h: break
            assert x + w <= x2 or x2 + w2 <= x, f"boxes overlap: {(x, y, w, h)} and {(x2, y2, w2, h2)}"


def assert_edges_end_on_box_tops(root: ET.Element) -> None:
    """Every curve's last point (where its arrowhead is) lies on the top side of a box: arrows point at users."""
    rects = [rect_of(g) for g in groups(root)]
    for d in edges(root):
        x, y = map(float, re.findall(r"(-?[\d.]+),(-?[\d.]+)", d)[-1])
        assert any(abs(y - ry) < 0.2 and rx - 0.2 <= x <= rx + rw + 0.2 for rx, ry, rw, _ in rects), d


# ---- independent counts from the IR ----

def drawn_nodes(fn):
    """What a picture of FUNCTION fn shows as boxes: PARAMs and body nodes other than constants."""
    body = fn.src[0]
    return {u for u in [*fn.src[1:], *body.graph] if u is not body and u.op is not Ops.CONST}


def dependencies(fn) -> int:
    """Distinct (value, user) pairs between drawn nodes, plus one per returned value that is a drawn node."""
    nodes = drawn_nodes(fn)
    pairs = {(s, u) for u in nodes for s in u.operands if s in nodes}
    return len(pairs) + sum(o in nodes for o in fn.src[0].src)


# ---- draw_function ----

def test_function_has_one_box_per_node_and_output():
    fn = fnx.make_graph(fnx.grad(mlp_loss))(*mlp_args()).fn
    root = parse(draw_function(fn, "loss"))
    nodes = groups(root)
    assert len(nodes) == len(drawn_nodes(fn)) + len(fn.src[0].src)
    assert sum(g.get("data-kind") == "input" for g in nodes) == len(fn.src) - 1
    assert sum(g.get("data-kind") == "output" for g in nodes) == len(fn.src[0].src)


def test_function_labels_show_every_op_with_its_type():
    fn = fnx.make_graph(dense_tanh_sum)(*dense_args()).fn
    labels = {tuple(texts(g)[:2]) for g in groups(parse(draw_function(fn)))}
    heads = {(head.split(" (")[0].split(" ")[0], rest[0] if rest else "") for head, *rest in labels}
    ops = 0
    for line in format_function(fn).splitlines()[1:-1]:
        if m := re.match(r"\s+v\d+: (\S+) = ([a-z]+)\b(?! *\[)", line):  # v5: f32[..] = mul v1 v4 (not v12 = c14[0])
            if m.group(2) != "const":
                assert (m.group(2), m.group(1)) in heads, line
                ops += 1
        elif m := re.match(r"\s+c\d+ = (call \S+|cond|while|scan) ", line):
            assert any(head == m.group(1) for head, *_ in labels), line
    assert ops >= 10
    assert any(head.startswith("reduce add axes=(2,)") for head, *_ in labels)


def test_constants_are_shown_in_their_users_labels():
    fn = fnx.make_graph(lambda x: x * 2.5 + 1.0)(jnp.ones(3)).fn
    heads = [texts(g)[0] for g in groups(parse(draw_function(fn)))]
    assert "mul (·, 2.5)" in heads and "add (·, 1.0)" in heads
    assert not any(h.startswith("const") for h in heads)


def test_edges_are_the_data_dependencies_and_point_at_users():
    for fn in (fnx.make_graph(fnx.grad(mlp_loss))(*mlp_args()).fn, fnx.make_graph(looped)(jnp.ones((4, 8))).fn):
        root = parse(draw_function(fn))
        assert len(edges(root)) == dependencies(fn)
        assert_edges_end_on_box_tops(root)


def test_boxes_never_overlap_in_a_large_gradient():
    fn = fnx.make_graph(fnx.value_and_grad(mlp_loss))(*mlp_args((64, 128, 128, 10), 32)).fn
    root = parse(draw_function(fn, "value_and_grad"))
    assert len(groups(root)) > 100
    assert_no_overlaps([rect_of(g) for g in groups(root)])


def test_a_graph_of_hundreds_of_nodes_is_laid_out():
    fn = fnx.make_graph(long_chain)(jnp.ones((8, 4)), jnp.ones((8, 4))).fn
    picture = draw_function(fn, "chain")
    root = parse(picture)
    assert len(groups(root)) == len(drawn_nodes(fn)) + len(fn.src[0].src) >= 500
    assert len(edges(root)) == dependencies(fn)
    assert_no_overlaps([rect_of(g) for g in groups(root)])


def test_drawing_is_deterministic():
    def draw():
        return draw_function(fnx.make_graph(fnx.grad(mlp_loss))(*mlp_args()).fn, "loss").svg
    assert draw() == draw()
    lowering = fnx.jit(looped).lower(jnp.ones((4, 8))).executable.lowering
    assert all(draw_lowering(lowering, s).svg == draw_lowering(lowering, s).svg for s in STAGES)


def test_repr_says_what_and_how():
    fn = fnx.make_graph(dense_tanh_sum)(*dense_args()).fn
    picture = draw_function(fn, "f")
    n = len(groups(parse(picture)))
    assert repr(picture).startswith(f"<Picture: graph of f, {n} nodes;")
    assert "_repr_svg_" in repr(picture) and picture._repr_svg_() == picture.svg


# ---- draw_graph: the layout on arbitrary graphs ----

def test_labels_are_xml_escaped():
    graph = Graph()
    a = graph.add(Node(['a < b & "c" \'d\' > e'], "input"))
    graph.connect(a, graph.add(Node(["x</text><script>", "&amp;"], "elementwise")))
    root = parse(draw_graph(graph, "<&>"))
    assert [texts(g) for g in groups(root)] == [['a < b & "c" \'d\' > e'], ["x</text><script>", "&amp;"]]
    assert [t.text for t in root.iter(f"{SVG}text") if t.get("class") == "heading"] == ["<&>"]


def test_unknown_node_kind_raises():
    with pytest.raises(ValueError, match="kinds are"):
        Node(["x"], "purple")


@st.composite
def dags(draw):
    n = draw(st.integers(1, 40))
    labels = draw(st.lists(st.lists(st.text(st.characters(blacklist_categories=("Cs", "Cc", "Cn", "Zl", "Zp")),
                                            max_size=70), min_size=1, max_size=3), min_size=n, max_size=n))
    pairs = draw(st.lists(st.tuples(st.integers(0, n - 1), st.integers(0, n - 1)), max_size=3 * n))
    return labels, [(a, b) for a, b in pairs if a < b]


@given(dags())
def test_random_dags_keep_their_edges_and_never_overlap(dag):
    labels, pairs = dag
    graph = Graph()
    for lines in labels: graph.add(Node(lines, "elementwise"))
    for a, b in pairs: graph.connect(a, b)
    root = parse(draw_graph(graph))
    assert len(groups(root)) == len(labels)
    assert len(edges(root)) == len(set(pairs))
    assert_no_overlaps([rect_of(g) for g in groups(root)])
    assert_edges_end_on_box_tops(root)


# ---- draw_lowering ----

@pytest.fixture(scope="module")
def lowerings():
    return {"mlp grad": fnx.jit(fnx.grad(mlp_loss)).lower(*mlp_args()).executable.lowering,
            "fori_loop": fnx.jit(looped).lower(jnp.ones((4, 8))).executable.lowering}


@pytest.mark.parametrize("name", ["mlp grad", "fori_loop"])
@pytest.mark.parametrize("stage", STAGES)
def test_every_stage_draws(lowerings, name, stage):
    lowering = lowerings[name]
    root = parse(draw_lowering(lowering, stage))
    nodes = groups(root)
    steps = [k for k, _ in lowering.kernels] if stage in ("optimize", "linearize", "memory") else \
        lowering.schedule.kernels
    if stage == "callify":
        assert len(nodes) == len(drawn_nodes(lowering.fn)) + len(lowering.fn.src[0].src)
    if stage in ("rangeify", "optimize"):
        step_boxes = [g for g in nodes if g.get("data-kind") in ("kernel", "call", "transfer")]
        assert [texts(g)[0] for g in step_boxes] == [k.name for k in steps]
        assert_no_overlaps([rect_of(g) for g in nodes])
        assert_edges_end_on_box_tops(root)
    if stage == "linearize":
        heads = [g for g in nodes if g.get("data-kind") in ("kernel", "call")]
        assert [texts(g)[0] for g in heads] == [k.name for k in steps]
        assert_no_overlaps([rect_of(g) for g in nodes])
    if stage == "memory":
        plan = lowering.memory
        heading = [t.text for t in root.iter(f"{SVG}text") if t.get("class") == "heading"][0]
        assert heading == (f"{len(plan.slot_of)} buffers in {len(plan.slot_bytes)} allocations: "
                           f"{plan.planned_bytes} bytes instead of {plan.unplanned_bytes}")
        bars = [rect_of(g) for g in groups(root, "bar")]
        assert len(bars) == len(plan.slot_of)
        assert_no_overlaps(bars)  # buffers sharing a slot have lifetimes that do not overlap


def test_optimize_draws_the_buffers_each_kernel_reads_and_writes(lowerings):
    lowering = lowerings["mlp grad"]
    root = parse(draw_lowering(lowering, "optimize"))
    writes = sum(len({u.src[0].arg.slot for u in k.sink.toposort if u.op is Ops.STORE})
                 for k, lines in lowering.kernels if lines is not None)
    buffers = [g for g in groups(root) if g.get("data-kind") in ("input", "buffer", "output")]
    inputs = {b for k, lines in lowering.kernels if lines is not None for b in k.args
              if lowering.schedule.buffers[b].kind == "input"}
    assert len(buffers) == writes + len(inputs)


def test_linearize_caps_long_programs():
    lowering = fnx.jit(dense_tanh_sum).lower(*dense_args()).executable.lowering
    root = parse(draw_lowering(lowering, "linearize"))
    mores = [texts(g)[0] for g in groups(root) if texts(g)[0].startswith("…")]
    assert mores and all(re.fullmatch(r"… \d+ more lines", m) for m in mores)


def test_unknown_stage_raises(lowerings):
    with pytest.raises(ValueError, match="callify"):
        draw_lowering(lowerings["fori_loop"], "vectorize")


# ---- draw_schedule ----

@pytest.mark.parametrize("f, args", [(fnx.grad(mlp_loss), mlp_args()), (looped, (jnp.ones((4, 8)),))])
def test_schedule_has_one_node_per_item_in_run_order(f, args):
    exe = fnx.jit(f).lower(*args).executable
    root = parse(draw_schedule(exe))
    items = [texts(g)[0] for g in groups(root) if g.get("data-kind") in ("kernel", "call", "transfer")]
    assert len(items) == len(exe.items)
    assert [int(t.split()[0][1:]) for t in items] == list(range(len(exe.items)))
    assert_edges_end_on_box_tops(root)


@pytest.mark.parametrize("f, args", [(dense_tanh_sum, dense_args()), (looped, (jnp.ones((4, 8)),))])
def test_schedule_without_a_lowering_infers_what_launches_write(f, args):
    """An executable that keeps no lowering: a launch writes the buffers it is the first to use."""
    exe = fnx.jit(f).lower(*args).executable
    bare = SimpleNamespace(items=exe.items, buffers=exe.buffers, output_ids=exe.output_ids, device=exe.device)
    with_lowering, without = parse(draw_schedule(exe)), parse(draw_schedule(bare))
    assert [texts(g) for g in groups(without)] == [texts(g) for g in groups(with_lowering)]
    assert len(edges(without)) == len(edges(with_lowering))


# ---- saving ----

def test_save_svg_round_trips(tmp_path):
    picture = draw_function(fnx.make_graph(dense_tanh_sum)(*dense_args()).fn, "f")
    picture.save(tmp_path / "f.svg")
    assert (tmp_path / "f.svg").read_text(encoding="utf-8") == picture.svg


def test_save_rejects_other_suffixes(tmp_path):
    picture = draw_function(fnx.make_graph(dense_tanh_sum)(*dense_args()).fn)
    with pytest.raises(ValueError, match=r"\.svg or \.png"):
        picture.save(tmp_path / "f.jpg")


def test_save_png_without_cairosvg_says_how_to_install(tmp_path, monkeypatch):
    monkeypatch.setitem(__import__("sys").modules, "cairosvg", None)
    picture = draw_function(fnx.make_graph(dense_tanh_sum)(*dense_args()).fn)
    with pytest.raises(ImportError, match="pip install cairosvg") as error:
        picture.save(tmp_path / "f.png")
    assert "libcairo2" in str(error.value)


def png_chunks(data: bytes) -> list[tuple[bytes, bytes]]:
    chunks, at = [], 8
    while at < len(data):
        (length,) = struct.unpack(">I", data[at:at + 4])
        chunks.append((data[at + 4:at + 8], data[at + 8:at + 8 + length]))
        at += 12 + length
    return chunks


def test_save_png_is_a_real_picture(tmp_path):
    if os.environ.get("FNX_REQUIRE_CAIROSVG") != "1": pytest.importorskip("cairosvg")
    else: import cairosvg  # noqa: F401  (CI: a missing cairosvg must fail, not skip)
    graph = draw_function(fnx.make_graph(mlp_loss)(*mlp_args()).fn, "mlp_loss")
    kernels = draw_lowering(fnx.jit(fnx.grad(mlp_loss)).lower(*mlp_args()).executable.lowering, "rangeify")
    for picture, name in ((graph, "graph.png"), (kernels, "rangeify.png")):
        picture.save(tmp_path / name)
        data = (tmp_path / name).read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n"
        chunks = png_chunks(data)
        assert chunks[0][0] == b"IHDR"
        width, height = struct.unpack(">II", chunks[0][1][:8])
        root = parse(picture)
        assert (width, height) == (int(root.get("width")), int(root.get("height")))  # 96 dpi: one pixel per unit
        pixels = zlib.decompress(b"".join(body for kind, body in chunks if kind == b"IDAT"))
        assert len(set(pixels)) > 16  # a blank or one-colour image filters down to a handful of byte values
        if out := os.environ.get("FNX_PICTURES_DIR"):
            os.makedirs(out, exist_ok=True)
            picture.save(os.path.join(out, name))


# ---- errors ----

def test_draw_function_wants_a_function():
    fn = fnx.make_graph(dense_tanh_sum)(*dense_args()).fn
    with pytest.raises(TypeError, match="expected a FUNCTION"):
        draw_function(fn.src[0].src[0])


def test_graph_edges_must_go_forward():
    graph = Graph()
    a, b = graph.add(Node(["a"], "input")), graph.add(Node(["b"], "output"))
    for src, dst in ((b, a), (a, a), (a, 2)):
        with pytest.raises(ValueError, match="later one"):
            graph.connect(src, dst)
