"""Pictures of what fnx built, as SVG drawn in pure Python: a traced FUNCTION, each stage of its lowering and the
schedule an executable replays. A `Picture` shows itself inline in Jupyter and saves as .svg or .png.

`draw_function(fn)` draws the graph `format_function` prints; `draw_lowering(lowering, stage)` draws one of the
stages `Lowering.as_text` prints (the kernel split as a dataflow of buffers and kernels, each kernel's program,
the memory plan); `draw_schedule(executable)` draws the recorded run order.

Graphs go through a small layered layout written here (no graphviz): nodes are put in layers by their longest path
from the inputs, an edge that skips layers gets a dummy node in each layer it crosses, sweeps of barycenter
ordering reduce crossings, and a least-squares placement (pool adjacent violators) puts each node near its
neighbours without overlaps. Everything is iterative and deterministic: the same graph gives the same SVG bytes.
"""
from __future__ import annotations

import hashlib
import math
import os
import textwrap
from dataclasses import dataclass, field
from xml.sax.saxutils import escape

from fnx.backends.device import HostCall, Transfer
from fnx.debug.printing import SHORT_DTYPES, arg_str, call_name, type_str
from fnx.lower.cost import describe
from fnx.lower.linearize import format_linear
from fnx.lower.memory import kernel_reads, kernel_writes
from fnx.lower.pipeline import STAGES, host_step_text
from fnx.lower.rangeify import BufferSpec, HostStep, Kernel, TransferStep
from fnx.uop import GroupOp, Ops, UOp

# text is monospace: DejaVu Sans Mono (and Menlo, Consolas) advance 0.602 em per character
FONT_SIZE, HEADING_SIZE = 12, 14
CHAR_WIDTH = 0.602 * FONT_SIZE
LINE_HEIGHT = 15
PAD_X, PAD_Y = 8, 5
MAX_CHARS = 56            # longer label lines wrap (the tooltip keeps them whole)
LAYER_GAP = 44            # vertical room between layers, where the edges bend
NODE_GAP, DUMMY_GAP = 18, 6
DUMMY_WIDTH = 6           # an edge passing through a layer takes this much room in it
DUMMY_WEIGHT = 4.0        # dummies resist moving more than nodes do: long edges run straight
SWEEPS = 12               # barycenter passes (alternating down and up); the order with fewest crossings is kept
PLACEMENT_ROUNDS = 6
MARGIN, TITLE_HEIGHT = 16, 30
FONTS = "DejaVu Sans Mono, Menlo, Consolas, monospace"
CAIRO_MAX_SIZE = 32767    # pixels: a PNG of a larger picture is scaled down to fit
ARROW = "fnx-arrow"       # the marker's id; made unique per picture (Jupyter puts many SVGs in one page)

# fill and stroke of each kind of box
COLORS = {
    "input": ("#dbeafe", "#2563eb"),        # PARAMs and input buffers
    "elementwise": ("#fef9c3", "#a16207"),
    "reduce": ("#fed7aa", "#c2410c"),
    "movement": ("#e5e7eb", "#4b5563"),     # reshape, permute, expand, pad, shrink, flip, gather
    "call": ("#ede9fe", "#6d28d9"),         # calls and control flow, host steps
    "output": ("#dcfce7", "#15803d"),
    "kernel": ("#fee2e2", "#b91c1c"),
    "buffer": ("#e0f2fe", "#0369a1"),
    "transfer": ("#fce7f3", "#be185d"),     # COPY to another device, collectives
    "loop": ("#e0e7ff", "#4338ca"),         # a linear program's for/end
    "instruction": ("#ffffff", "#9ca3af"),
    "other": ("#f9fafb", "#6b7280"),
}


# ---- the picture ----

@dataclass(frozen=True)
class Picture:
    """An SVG document (`svg`) and a one-line `description` of what it shows.

    Jupyter displays it inline (`_repr_svg_`); `save(path)` writes .svg text or a .png (through cairosvg), one
    pixel per SVG unit (scaled down when a side would exceed cairo's CAIRO_MAX_SIZE). `width` and `height` are the
    document's size.

    Example:
      >>> pic = draw_function(fnx.make_graph(f)(x).fn, "f")
      >>> pic.save("f.png")
    """
    svg: str
    description: str
    width: int
    height: int

    def _repr_svg_(self) -> str:
        return self.svg

    def __repr__(self) -> str:
        return f"<Picture: {self.description}; _repr_svg_ in Jupyter, .save('x.svg'|'x.png')>"

    def save(self, path: str | os.PathLike) -> None:
        """Write the picture to `path`: SVG text for a .svg name, a PNG rasterized by cairosvg for a .png name.

        Raises:
          ValueError: for any other suffix.
          ImportError: for .png when cairosvg (or the cairo library it loads) is missing.
        """
        suffix = os.path.splitext(os.fspath(path))[1].lower()
        if suffix == ".svg":
            with open(path, "w", encoding="utf-8") as f: f.write(self.svg)
        elif suffix == ".png":
            _svg_to_png(self.svg, os.fspath(path), min(1.0, CAIRO_MAX_SIZE / max(self.width, self.height, 1)))
        else:
            raise ValueError(f"Picture.save({os.fspath(path)!r}): unsupported suffix {suffix!r}; use .svg or .png")


def _svg_to_png(svg: str, path: str, scale: float) -> None:
    try:
        import cairosvg  # optional: only .png needs it
    except (ImportError, OSError) as e:  # (cairocffi raises OSError when the cairo library is missing)
        raise ImportError(f"Picture.save({path!r}) needs cairosvg to write PNG: pip install cairosvg (it needs the "
                          f"system cairo library, e.g. apt-get install libcairo2); {type(e).__name__}: {e}") from e
    cairosvg.svg2png(bytestring=svg.encode("utf-8"), write_to=path, scale=scale)


# ---- SVG writing ----

_CONTROL_CHARACTERS = {c: "?" for c in range(32) if chr(c) not in "\t\n\r"}  # not allowed in XML 1.0


def _xml(text: str) -> str:
    """Text (or an attribute value) made safe inside XML: <, >, &, both quotes and control characters."""
    return escape(str(text).translate(_CONTROL_CHARACTERS), {'"': "&quot;", "'": "&apos;"})


def _num(v: float) -> str:
    """A coordinate, rounded so the output is short and the same on every machine."""
    return f"{round(v, 1):g}"


def _text_width(lines: list[str]) -> float:
    return max((len(line) for line in lines), default=0) * CHAR_WIDTH


def _box_size(lines: list[str]) -> tuple[float, float]:
    return _text_width(lines) + 2 * PAD_X, len(lines) * LINE_HEIGHT + 2 * PAD_Y


class _Canvas:
    """SVG elements collected in drawing order (edges under boxes); `picture` wraps them into a document."""

    def __init__(self) -> None:
        self.under: list[str] = []
        self.over: list[str] = []

    def box(self, x: float, y: float, width: float, height: float, lines: list[str], kind: str, tooltip: str = "",
            align: str = "middle", cls: str = "node") -> None:
        """A rounded rectangle filled by `kind`'s colour, its lines of text centred (or left-aligned), the first
        one bold; `tooltip` shows on hover."""
        fill, stroke = COLORS[kind]
        dashed = ' stroke-dasharray="4 3"' if kind == "other" else ""
        tooltip = tooltip or "\n".join(lines)
        parts = [f'<g class="{cls}" data-kind="{kind}"><title>{_xml(tooltip)}</title>',
                 f'<rect x="{_num(x)}" y="{_num(y)}" width="{_num(width)}" height="{_num(height)}" rx="4" '
                 f'fill="{fill}" stroke="{stroke}"{dashed}/>']
        text_x = x + width / 2 if align == "middle" else x + PAD_X
        top = y + (height - len(lines) * LINE_HEIGHT) / 2
        for i, line in enumerate(lines):
            style = ' font-weight="bold"' if i == 0 and len(lines) > 1 else ' fill="#374151"'
            parts.append(f'<text x="{_num(text_x)}" y="{_num(top + (i + 1) * LINE_HEIGHT - 3.5)}" '
                         f'text-anchor="{align}"{style}>{_xml(line)}</text>')
        self.over.append("".join(parts) + "</g>")

    def edge(self, path: str) -> None:
        self.under.append(f'<path class="edge" d="{path}" fill="none" stroke="#6b7280" stroke-width="1.2" '
                          f'marker-end="url(#{ARROW})"/>')

    def rect(self, x: float, y: float, width: float, height: float, fill: str) -> None:
        self.under.append(f'<rect x="{_num(x)}" y="{_num(y)}" width="{_num(width)}" height="{_num(height)}" '
                          f'fill="{fill}"/>')

    def text(self, x: float, y: float, text: str, anchor: str = "start", rotate: float = 0) -> None:
        turn = f' transform="rotate({_num(rotate)} {_num(x)} {_num(y)})"' if rotate else ""
        self.over.append(f'<text class="label" x="{_num(x)}" y="{_num(y)}" text-anchor="{anchor}" '
                         f'fill="#374151"{turn}>{_xml(text)}</text>')

    def picture(self, width: float, height: float, heading: str, description: str) -> Picture:
        """The document: a white page with `heading` on top and the elements below it, `width` x `height` of
        content plus margins. The arrow marker's id is made from the content, so two different pictures in one
        page never share it and the same picture always gets the same one."""
        page_width = math.ceil(max(width, len(heading) * CHAR_WIDTH * HEADING_SIZE / FONT_SIZE) + 2 * MARGIN)
        page_height = math.ceil(height + 2 * MARGIN + TITLE_HEIGHT)
        body = "\n".join(self.under + self.over)
        marker = f"{ARROW}-{hashlib.sha1((heading + body).encode()).hexdigest()[:10]}"
        return Picture("\n".join([
            f'<svg xmlns="http://www.w3.org/2000/svg" width="{page_width}" height="{page_height}" '
            f'viewBox="0 0 {page_width} {page_height}" font-family="{FONTS}" font-size="{FONT_SIZE}">',
            f"<title>{_xml(description)}</title>",
            f'<defs><marker id="{marker}" viewBox="0 0 10 10" refX="10" refY="5" markerWidth="8" markerHeight="8" '
            f'markerUnits="userSpaceOnUse" orient="auto"><path d="M0,0 L10,5 L0,10 z" fill="#6b7280"/></marker>'
            "</defs>",
            '<rect width="100%" height="100%" fill="white"/>',
            f'<text class="heading" x="{MARGIN}" y="{MARGIN + HEADING_SIZE}" font-size="{HEADING_SIZE}" '
            f'font-weight="bold">{_xml(heading)}</text>',
            f'<g transform="translate({MARGIN},{MARGIN + TITLE_HEIGHT})">',
            body.replace(f"url(#{ARROW})", f"url(#{marker})"),
            "</g>",
            "</svg>"]), description, page_width, page_height)


# ---- a layered DAG layout ----

@dataclass
class Node:
    """A box of a graph: its lines of text (the first is the head), its kind (which colour) and a tooltip.
    Lines longer than MAX_CHARS wrap; the tooltip keeps them whole."""
    lines: list[str]
    kind: str
    tooltip: str = ""

    def __post_init__(self) -> None:
        if self.kind not in COLORS: raise ValueError(f"Node kind {self.kind!r}: the kinds are {list(COLORS)}")
        self.tooltip = self.tooltip or "\n".join(self.lines)
        self.lines = [part for line in self.lines for part in textwrap.wrap(line, MAX_CHARS) or [""]]


@dataclass
class Graph:
    """Nodes in an order where every edge goes forward (a source before its users), and edges (src, dst) between
    them; the same edge added twice is drawn once. Edges go down the picture, so an edge back to an earlier node
    (a cycle) is refused."""
    nodes: list[Node] = field(default_factory=list)
    edges: dict[tuple[int, int], None] = field(default_factory=dict)

    def add(self, node: Node) -> int:
        self.nodes.append(node)
        return len(self.nodes) - 1

    def connect(self, src: int, dst: int) -> None:
        if not 0 <= src < dst < len(self.nodes):
            raise ValueError(f"Graph.connect({src}, {dst}): an edge goes from a node to a later one, of the "
                             f"{len(self.nodes)} added so far")
        self.edges[(src, dst)] = None


def _layers(graph: Graph) -> list[int]:
    """Each node's layer: one below its lowest source (longest path from the inputs). A node without sources
    that is not an input (an iota, a constant-only op) moves down to just above its first user, so its edges
    stay short."""
    n = len(graph.nodes)
    sources: list[list[int]] = [[] for _ in range(n)]
    users: list[list[int]] = [[] for _ in range(n)]
    for a, b in graph.edges:
        sources[b].append(a)
        users[a].append(b)
    layer = [0] * n
    for v in range(n):
        if sources[v]: layer[v] = max(layer[s] for s in sources[v]) + 1
    for v in range(n):
        if not sources[v] and users[v] and graph.nodes[v].kind != "input":
            layer[v] = min(layer[u] for u in users[v]) - 1
    return layer


@dataclass
class _Vertices:
    """The nodes plus dummy vertices where edges pass through layers: the long edges leaving one node share one
    dummy per layer (a trunk they branch off, so a value used all along a deep graph costs one line, not one per
    use). `chains[e]` is edge e's vertices; it is drawn from `chains[e][starts[e]]` on (0: from its source; more:
    from where it leaves the part of the trunk an edge drawn before it already shows)."""
    layer: list[int]
    width: list[float]
    chains: list[list[int]]
    starts: list[int]
    above: list[list[int]]   # the vertices one layer up joined to each vertex
    below: list[list[int]]

    @property
    def count(self) -> int:
        return len(self.layer)


def _vertices(graph: Graph, layer: list[int]) -> _Vertices:
    layers, widths = list(layer), [_box_size(node.lines)[0] for node in graph.nodes]
    trunk: dict[tuple[int, int], int] = {}  # (source node, layer) -> the dummy its edges share there
    chains = []
    for a, b in graph.edges:
        chain = [a]
        for level in range(layer[a] + 1, layer[b]):
            if (a, level) not in trunk:
                layers.append(level)
                widths.append(DUMMY_WIDTH)
                trunk[(a, level)] = len(layers) - 1
            chain.append(trunk[(a, level)])
        chains.append(chain + [b])
    starts, drawn = [0] * len(chains), set()
    for e in sorted(range(len(chains)), key=lambda e: (chains[e][0], len(chains[e]), e)):  # shallow edges first
        dummies = chains[e][1:-1]
        starts[e] = next((i for i, d in enumerate(dummies) if d not in drawn), len(dummies))
        drawn.update(dummies)
    joined = dict.fromkeys((p, q) for chain in chains for p, q in zip(chain, chain[1:]))  # (trunks: once)
    above: list[list[int]] = [[] for _ in layers]
    below: list[list[int]] = [[] for _ in layers]
    for p, q in joined:
        above[q].append(p)
        below[p].append(q)
    return _Vertices(layers, widths, chains, starts, above, below)


def _inversions(values: list[int]) -> int:
    """Pairs i < j with values[i] > values[j], counted with a Fenwick tree."""
    tree = [0] * (max(values, default=0) + 2)
    count = 0
    for seen, v in enumerate(values):
        i, at_most_v = v + 1, 0
        while i > 0:
            at_most_v += tree[i]
            i -= i & -i
        count += seen - at_most_v
        i = v + 1
        while i < len(tree):
            tree[i] += 1
            i += i & -i
    return count


def _crossings(rows: list[list[int]], vs: _Vertices) -> int:
    """Edge crossings between each pair of neighbouring layers."""
    index = {v: i for row in rows for i, v in enumerate(row)}
    total = 0
    for row in rows[:-1]:
        pairs = sorted((index[v], index[w]) for v in row for w in vs.below[v])
        total += _inversions([w for _, w in pairs])
    return total


def _order(vs: _Vertices) -> list[list[int]]:
    """The vertices of each layer, left to right: barycenter sweeps, alternately down (by the mean position of a
    vertex's neighbours above) and up, keeping the order with the fewest crossings."""
    rows: list[list[int]] = [[] for _ in range(max(vs.layer, default=-1) + 1)]
    for v in range(vs.count): rows[vs.layer[v]].append(v)
    position = {v: (i + 0.5) / len(row) for row in rows for i, v in enumerate(row)}
    best, fewest = [list(row) for row in rows], _crossings(rows, vs)
    for sweep in range(SWEEPS):
        down = sweep % 2 == 0
        neighbours = vs.above if down else vs.below
        for row in (rows[1:] if down else rows[-2::-1]):
            key = {v: sum(position[u] for u in neighbours[v]) / len(neighbours[v]) if neighbours[v] else position[v]
                   for v in row}
            row.sort(key=lambda v: (key[v], position[v]))
            position.update((v, (i + 0.5) / len(row)) for i, v in enumerate(row))
        if (crossings := _crossings(rows, vs)) < fewest:
            best, fewest = [list(row) for row in rows], crossings
    return best


def _fit(desired: list[float], gaps: list[float], weights: list[float]) -> list[float]:
    """The positions closest to `desired` (weighted least squares) with x[i+1] - x[i] >= gaps[i]: with offsets
    removed the constraint is "non-decreasing", solved by pooling adjacent violators."""
    offsets = [0.0]
    for gap in gaps: offsets.append(offsets[-1] + gap)
    blocks: list[list[float]] = []  # [mean, weight, count]
    for d, offset, w in zip(desired, offsets, weights):
        blocks.append([d - offset, w, 1])
        while len(blocks) > 1 and blocks[-2][0] > blocks[-1][0]:
            m2, w2, c2 = blocks.pop()
            m1, w1, c1 = blocks.pop()
            blocks.append([(m1 * w1 + m2 * w2) / (w1 + w2), w1 + w2, c1 + c2])
    means = [m for m, _, count in blocks for _ in range(int(count))]
    return [m + offset for m, offset in zip(means, offsets)]


def _place(rows: list[list[int]], vs: _Vertices, real: int) -> list[float]:
    """The centre x of each vertex: packed left to right, then moved toward the mean x of its neighbours, layer by
    layer down and up, never closer to the next vertex than their half widths and a gap."""
    x = [0.0] * vs.count
    gaps = []
    for row in rows:
        row_gaps = [(vs.width[a] + vs.width[b]) / 2 + (NODE_GAP if a < real and b < real else DUMMY_GAP)
                    for a, b in zip(row, row[1:])]
        gaps.append(row_gaps)
        for v, left in zip(row, _fit([0.0] * len(row), row_gaps, [1.0] * len(row))): x[v] = left
    passes = [vs.above, vs.below] * PLACEMENT_ROUNDS + [None]
    for neighbours in passes:
        order = range(len(rows)) if neighbours is not vs.below else range(len(rows) - 1, -1, -1)
        for i in order:
            row = rows[i]
            near = [neighbours[v] if neighbours is not None else vs.above[v] + vs.below[v] for v in row]
            desired = [sum(x[u] for u in us) / len(us) if us else x[v] for v, us in zip(row, near)]
            weights = [(DUMMY_WEIGHT if v >= real else 1.0) if us else 0.2 for v, us in zip(row, near)]
            for v, new in zip(row, _fit(desired, gaps[i], weights)): x[v] = new
    return x


@dataclass
class _Drawn:
    """A laid-out graph: where each node's box is, the curve of each edge, and the size of the whole."""
    boxes: list[tuple[float, float, float, float]]   # x, y, width, height of each node
    paths: list[str]                                  # the SVG path of each edge
    width: float
    height: float


def _ports(ends: list[tuple[int, int, int]], x: list[float], boxes) -> dict[tuple[int, int], float]:
    """Where edges meet one side of their boxes: spread over the box's width in the order of the vertex at their
    other end, so they do not cross at the box (edges into one trunk share its port). `ends` are (node, vertex at
    the other end, edge); returns {(edge, node): x}."""
    by_node: dict[int, dict[int, list[int]]] = {}
    for node, other, edge in ends: by_node.setdefault(node, {}).setdefault(other, []).append(edge)
    slot = {}
    for node, others in by_node.items():
        left, _, width, _ = boxes[node]
        for k, other in enumerate(sorted(others, key=lambda v: (x[v], v))):
            for edge in others[other]: slot[(edge, node)] = left + width * (k + 1) / (len(others) + 1)
    return slot


def _layout(graph: Graph) -> _Drawn:
    """Boxes and edge curves of a layered drawing of `graph`, top to bottom (see the module docstring)."""
    layer = _layers(graph)
    vs = _vertices(graph, layer)
    rows = _order(vs)
    x = _place(rows, vs, len(graph.nodes))
    sizes = [_box_size(node.lines) for node in graph.nodes]
    left = min((x[v] - vs.width[v] / 2 for v in range(vs.count)), default=0.0)
    x = [c - left for c in x]
    tops, bottoms, y = [], [], 0.0
    for row in rows:
        height = max((sizes[v][1] for v in row if v < len(graph.nodes)), default=LINE_HEIGHT)
        tops.append(y)
        bottoms.append(y + height)
        y += height + LAYER_GAP
    boxes = [(x[v] - w / 2, (tops[layer[v]] + bottoms[layer[v]] - h) / 2, w, h) for v, (w, h) in enumerate(sizes)]
    out_slot = _ports([(chain[0], chain[1], e) for e, chain in enumerate(vs.chains)], x, boxes)
    in_slot = _ports([(chain[-1], chain[-2], e) for e, chain in enumerate(vs.chains)], x, boxes)
    paths = []
    for e, chain in enumerate(vs.chains):
        a, b, start = chain[0], chain[-1], vs.starts[e]
        if start == 0: points = [(out_slot[(e, a)], boxes[a][1] + boxes[a][3])]
        else: points = [(x[chain[start]], bottoms[vs.layer[chain[start]]])]
        for d in chain[start + 1:-1]: points += [(x[d], tops[vs.layer[d]]), (x[d], bottoms[vs.layer[d]])]
        points.append((in_slot[(e, b)], boxes[b][1]))
        paths.append(_curve(points))
    width = max([bx + bw for bx, _, bw, _ in boxes] + [x[v] + DUMMY_WIDTH for v in range(len(graph.nodes), vs.count)],
                default=0.0)
    return _Drawn(boxes, paths, width, max(y - LAYER_GAP, 0.0))


def _curve(points: list[tuple[float, float]]) -> str:
    """An SVG path through (start, end) pairs of points: a cubic Bézier from each start to its end, leaving and
    arriving vertically, and a straight line from each end to the next start (through a dummy's layer)."""
    def p(point): return f"{_num(point[0])},{_num(point[1])}"
    parts = [f"M{p(points[0])}"]
    for i in range(0, len(points) - 1, 2):
        (x0, y0), (x1, y1) = points[i], points[i + 1]
        if i: parts.append(f"L{p(points[i])}")
        middle = (y0 + y1) / 2
        parts.append(f"C{p((x0, middle))} {p((x1, middle))} {p((x1, y1))}")
    return " ".join(parts)


def _graph_picture(graph: Graph, heading: str, description: str) -> Picture:
    drawn = _layout(graph)
    canvas = _Canvas()
    for path in drawn.paths: canvas.edge(path)
    for node, (x, y, w, h) in zip(graph.nodes, drawn.boxes): canvas.box(x, y, w, h, node.lines, node.kind, node.tooltip)
    return canvas.picture(drawn.width, drawn.height, heading, description)


def draw_graph(graph: Graph, title: str = "") -> Picture:
    """A picture of any `Graph` of `Node`s with the layered layout the other pictures use.

    Args:
      graph: nodes (each with lines of text and a kind from COLORS) and edges between them, every edge from an
        earlier node to a later one.
      title: the heading.
    Returns:
      a Picture.

    Example:
      >>> g = Graph(); a = g.add(Node(["x: f32[3]"], "input")); b = g.add(Node(["sin", "f32[3]"], "elementwise"))
      >>> g.connect(a, b); draw_graph(g, "sin").save("sin.svg")
    """
    return _graph_picture(graph, title or "graph", f"{title or 'graph'}, {len(graph.nodes)} nodes")


# ---- the traced function ----

def _kind(u: UOp) -> str:
    if u.op is Ops.PARAM: return "input"
    if u.op in GroupOp.ALU: return "elementwise"
    if u.op in (Ops.REDUCE, Ops.SCATTER): return "reduce"
    if u.op in GroupOp.Movement or u.op is Ops.INDEX: return "movement"
    if u.op in GroupOp.Call or u.op in GroupOp.Control: return "call"
    if u.op in (Ops.COPY, Ops.COLLECTIVE): return "transfer"
    return "other"


def _op_lines(u: UOp) -> list[str]:
    """A node's label as format_function writes its line: op (constant operands shown in place, · for the
    others), arg, type. A call or control node: its kind and its bodies' sizes."""
    if u.op is Ops.PARAM: return [f"p{u.arg.slot}: {type_str(u)}"]
    if u.op in (Ops.CALL, Ops.FUNCTION) or u.op in GroupOp.Control:
        kind = u.op.name.lower() if u.op in GroupOp.Control else call_name(u)
        sizes = "/".join(str(len(b.toposort)) for b in u.src[:len(u.src) - len(u.operands)])
        return [kind, f"body nodes: {sizes}"]
    if u.op is Ops.GETTUPLE: return [f"[{u.arg}] {type_str(u)}"]
    head = u.op.name.lower() + (f" to {u.dtype.name}" if u.op in (Ops.CAST, Ops.BITCAST) else "")
    if any(s.op is Ops.CONST for s in u.src):
        head += f" ({', '.join(repr(s.arg.value) if s.op is Ops.CONST else '·' for s in u.src)})"
    return [" ".join(part for part in (head, arg_str(u)) if part), type_str(u)]


def _function_graph(fn: UOp) -> Graph:
    """One node per PARAM and per node of the body (constants are shown inside their users' labels), one output
    node per returned value; calls and control flow are single nodes, their bodies not entered."""
    if fn.op not in (Ops.FUNCTION, Ops.TUPLE):
        raise TypeError(f"draw_function: expected a FUNCTION (e.g. fnx.make_graph(f)(x).fn), got a {fn.op.name} node")
    body = fn.src[0] if fn.op is Ops.FUNCTION else fn
    params = list(fn.src[1:]) if fn.op is Ops.FUNCTION else []
    graph, index = Graph(), {}
    for u in params + body.graph:
        if u in index or u is body or u.op is Ops.CONST: continue
        index[u] = graph.add(Node(_op_lines(u), _kind(u)))
        for s in u.operands:
            if s in index: graph.connect(index[s], index[u])
    for i, out in enumerate(body.src):
        value = f" = {out.arg.value!r}" if out.op is Ops.CONST else ""
        node = graph.add(Node([f"out{i}: {type_str(out)}{value}"], "output"))
        if out in index: graph.connect(index[out], node)
    return graph


def _function_picture(fn: UOp, heading: str) -> Picture:
    graph = _function_graph(fn)
    return _graph_picture(graph, f"{heading} ({len(graph.nodes)} nodes)", f"{heading}, {len(graph.nodes)} nodes")


def draw_function(fn: UOp, title: str = "") -> Picture:
    """A picture of FUNCTION `fn` as a graph: the nodes `fnx.debug.printing.format_function` prints.

    PARAMs are input nodes (`p0: f32[64,128]`), each body node is a box with its op and type (`reduce add
    axes=(2,)` over `f32[64,32,1]`), scalar and broadcast constants appear in their users' labels (`mul (·, 2.0)`),
    a call or control-flow node is one box (`call custom_jvp(run)`, `scan`) with a small box per output it gives,
    and each returned value is an output node. Edges point from a value to its users.

    Args:
      fn: a FUNCTION UOp, e.g. `fnx.make_graph(f)(x).fn` (or the TUPLE of a body).
      title: what to call it in the heading ("graph of f").
    Returns:
      a Picture.
    Raises:
      TypeError: when `fn` is another kind of node.

    Example:
      >>> draw_function(fnx.make_graph(lambda x: jnp.tanh(x).sum())(x).fn, "f").save("f.svg")
    """
    return _function_picture(fn, f"graph of {title}" if title else "graph")


# ---- the schedule: buffers and the steps that read and write them ----

@dataclass
class _Step:
    """A step of a schedule as the dataflow picture shows it: its label, its kind and the buffers it reads and
    writes."""
    lines: list[str]
    kind: str
    reads: list[int]
    writes: list[int]


def _dtype(spec: BufferSpec) -> str:
    return SHORT_DTYPES.get(spec.dtype.name, spec.dtype.name)


def _buffer_lines(b: int, spec: BufferSpec, outputs: list[int], device: str | None) -> list[str]:
    positions = ",".join(str(i) for i, o in enumerate(outputs) if o == b)
    role = {"input": f"input {spec.param}", "output": f"output {positions}"}.get(spec.kind, spec.kind)
    where = f" on {spec.device}" if spec.device not in (None, device) else ""
    return [f"b{b}: {_dtype(spec)}[{spec.size}]", f"{role}, {spec.size * spec.dtype.itemsize} B{where}"]


def _buffer_kind(spec: BufferSpec) -> str:
    return {"input": "input", "output": "output"}.get(spec.kind, "buffer")


def _dataflow_graph(steps: list[_Step], buffers: list[BufferSpec], outputs: list[int], device: str | None) -> Graph:
    """Buffers and steps, edges buffer -> step -> buffer. A buffer written again (an accumulating kernel after its
    init kernel, a scatter after its copy) gets a new node for its new contents; a step reading a buffer it writes
    reads the contents before it, when there are any (a stash reads back only what it wrote itself)."""
    graph, latest, times_written = Graph(), {}, {}

    def buffer_node(b: int) -> None:
        again = [f"written again ({times_written[b]})"] if times_written.get(b, 0) > 1 else []
        latest[b] = graph.add(Node(_buffer_lines(b, buffers[b], outputs, device) + again, _buffer_kind(buffers[b])))

    for step in steps:
        reads = [b for b in step.reads if b in latest or b not in step.writes]
        for b in reads:
            if b not in latest: buffer_node(b)  # an input, drawn where it is first read
        node = graph.add(Node(step.lines, step.kind))
        for b in reads: graph.connect(latest[b], node)
        for b in step.writes:
            times_written[b] = times_written.get(b, 0) + 1
            buffer_node(b)
            graph.connect(node, latest[b])
    for b in outputs:
        if b not in latest: buffer_node(b)  # an input returned as it is
    return graph


def _loops(kernel: Kernel) -> str:
    return f"loops {[r.arg.size for r in kernel.ranges]} reduce {[r.arg.size for r in kernel.reduce_ranges]}"


def _cost(kernel: Kernel) -> str:
    return describe(kernel).removeprefix(f"{kernel.name}: ")


def _schedule_actions(kernel: Kernel) -> list[str]:
    """What optimize did to a kernel: its actions, vector lanes, work-group and the loop split across threads."""
    lines = [f"actions {list(kernel.opts)}"]
    if kernel.lanes: lines.append(f"vector lanes {kernel.lanes[0].arg.size} x{len(kernel.lanes)}")
    if kernel.locals: lines.append(f"work-group {kernel.locals[0].arg.size} x{len(kernel.locals)}")
    if kernel.thread_range >= 0:
        lines.append(f"thread-split loop {kernel.thread_range} ({kernel.ranges[kernel.thread_range].arg.size})")
    else:
        lines.append("no thread split")
    return lines


def _step(step: Kernel | HostStep, optimized: bool) -> _Step:
    if isinstance(step, HostStep):
        kind = "transfer" if isinstance(step, TransferStep) else "call"
        return _Step([step.name, host_step_text(step)], kind, list(step.inputs), list(step.outputs))
    lines = [step.name, _loops(step), _cost(step)] + (_schedule_actions(step) if optimized else [])
    return _Step(lines, "kernel", sorted(kernel_reads(step)), sorted(kernel_writes(step)))


def _dataflow_picture(lowering, stage: str) -> Picture:
    schedule = lowering.schedule
    optimized = stage == "optimize"
    kernels = [k for k, _ in lowering.kernels] if optimized else schedule.kernels
    devices = {spec.device for spec in schedule.buffers if spec.device is not None}
    only = devices.pop() if len(devices) == 1 else None  # (over several devices, every buffer says where it is)
    graph = _dataflow_graph([_step(k, optimized) for k in kernels], schedule.buffers, schedule.outputs, only)
    what = "kernels after optimize" if optimized else "kernel split (rangeify)"
    heading = f"{what}: {len(kernels)} steps over {len(graph.nodes) - len(kernels)} buffer nodes"
    return _graph_picture(graph, heading, f"{stage} stage, {len(kernels)} steps")


# ---- linear programs ----

LINEAR_MAX_LINES = 60     # a longer program shows its first lines and a box saying how many more
INDENT = 14
COLUMN_GAP, ROW_GAP, MAX_ROW_WIDTH = 28, 36, 2400


def _linear_kind(text: str) -> str:
    if text.startswith(("for ", "end ")): return "loop"
    if text.startswith("acc_") or " = reduce " in text: return "reduce"
    if " = load " in text or " = store " in text: return "buffer"
    return "instruction"


def _linear_column(kernel: Kernel | HostStep, linear) -> tuple[list[str], list[tuple[int, str, str]]]:
    """A kernel's header lines and its program as (depth, text, kind) rows, capped at LINEAR_MAX_LINES."""
    if linear is None: return [kernel.name, host_step_text(kernel)], []
    program = format_linear(linear).split("\n")
    rows = [((len(line) - len(line.lstrip(" "))) // 2, line.strip(), _linear_kind(line.strip()))
            for line in program[:LINEAR_MAX_LINES]]
    if len(program) > LINEAR_MAX_LINES: rows.append((0, f"… {len(program) - LINEAR_MAX_LINES} more lines", "other"))
    return [kernel.name, _loops(kernel), f"{len(program)} lines"], rows


def _linear_picture(lowering) -> Picture:
    """One column per step: a header box, then one box per line of its linear program, indented by loop depth."""
    canvas, x, y, row_height, width = _Canvas(), 0.0, 0.0, 0.0, 0.0
    row_box = LINE_HEIGHT + 4
    for kernel, linear in lowering.kernels:
        head, rows = _linear_column(kernel, linear)
        head_width, head_height = _box_size(head)
        column_width = max([head_width] + [depth * INDENT + _box_size([text])[0] for depth, text, _ in rows])
        if x > 0 and x + column_width > MAX_ROW_WIDTH:
            x, y, row_height = 0.0, y + row_height + ROW_GAP, 0.0
        canvas.box(x, y, column_width, head_height, head, "call" if linear is None else "kernel")
        top = y + head_height + 6
        for i, (depth, text, kind) in enumerate(rows):
            canvas.box(x + depth * INDENT, top + i * (row_box + 2), column_width - depth * INDENT, row_box, [text],
                       kind, align="start")
        row_height = max(row_height, head_height + 6 + len(rows) * (row_box + 2))
        width = max(width, x + column_width)
        x += column_width + COLUMN_GAP
    steps = len(lowering.kernels)
    return canvas.picture(width, y + row_height, f"linear programs of {steps} steps (first {LINEAR_MAX_LINES} "
                          "lines each)", f"linearize stage, {steps} steps")


# ---- the memory plan ----

STEP_WIDTH, SLOT_HEIGHT = 64, 30


def _lifetimes(steps: list) -> tuple[dict[int, int], dict[int, int]]:
    """The first and last step using each buffer (the memory plan's rule: a buffer lives from the step that
    writes it to the last step that reads it)."""
    first: dict[int, int] = {}
    last: dict[int, int] = {}
    for i, step in enumerate(steps):
        for b in sorted(kernel_reads(step) | kernel_writes(step)):
            first.setdefault(b, i)
            last[b] = i
    return first, last


def _bar_label(text: str, width: float) -> str:
    """`text` cut to fit a bar `width` wide (the bar's tooltip has all of it)."""
    fits = int((width - 2 * PAD_X) / CHAR_WIDTH)
    if len(text) <= fits: return text
    return text[:fits - 1] + "…" if fits > 1 else ""


def _memory_picture(lowering) -> Picture:
    """Steps left to right, allocations (slots) top to bottom; each planned buffer a bar in its slot, spanning the
    steps it lives over."""
    plan, buffers = lowering.memory, lowering.schedule.buffers
    steps = [k for k, _ in lowering.kernels]
    first, last = _lifetimes(steps)
    canvas = _Canvas()
    slot_labels = [f"slot {s}: {nbytes} B" for s, nbytes in enumerate(plan.slot_bytes)]
    left = _text_width(slot_labels) + 12
    longest_name = max((len(step.name) for step in steps), default=0) * CHAR_WIDTH
    top = longest_name * math.sqrt(0.5) + 12
    for i, step in enumerate(steps):
        if i % 2 == 0: canvas.rect(left + i * STEP_WIDTH, top, STEP_WIDTH,
                                   len(plan.slot_bytes) * SLOT_HEIGHT, "#f3f4f6")
        canvas.text(left + (i + 0.5) * STEP_WIDTH, top - 6, f"{i} {step.name}", rotate=-45)
    for s, label in enumerate(slot_labels): canvas.text(0, top + (s + 0.5) * SLOT_HEIGHT + 4, label)
    # a buffer written over the one before it in its slot, by the step that reads that one last (in place): each
    # bar takes half of that step
    touching = {(s, first[b]) for b, s in plan.slot_of.items()} & {(s, last[b]) for b, s in plan.slot_of.items()}
    for b, s in sorted(plan.slot_of.items()):
        spec = buffers[b]
        start = first[b] + (0.5 if (s, first[b]) in touching and last[b] != first[b] else 0)
        end = last[b] + (0.5 if (s, last[b]) not in touching or last[b] == first[b] else 0)
        x, width = left + start * STEP_WIDTH + 2, (end - start + 0.5) * STEP_WIDTH - 4
        text = f"b{b} {_dtype(spec)}[{spec.size}]"
        tooltip = f"{text}, {spec.size * spec.dtype.itemsize} B in slot {s}, steps {first[b]}..{last[b]}"
        canvas.box(x, top + s * SLOT_HEIGHT + 3, width, SLOT_HEIGHT - 6, [_bar_label(text, width)], "buffer", tooltip,
                   cls="bar")
    bottom = top + len(plan.slot_bytes) * SLOT_HEIGHT + 20
    canvas.text(0, bottom, f"inputs {plan.input_bytes} B, outputs {plan.output_bytes} B, loop outputs "
                           f"{plan.loop_bytes} B; peak {plan.peak_bytes} B")
    heading = (f"{len(plan.slot_of)} buffers in {len(plan.slot_bytes)} allocations: {plan.planned_bytes} bytes "
               f"instead of {plan.unplanned_bytes}")
    width = max(left + len(steps) * STEP_WIDTH + longest_name * math.sqrt(0.5), 80 * CHAR_WIDTH)
    return canvas.picture(width, bottom + 6, heading, f"memory plan, {heading}")


# ---- an executable's run order ----

def _item_step(number: int, item, kernels: dict, written: set[int], inputs: set[int]) -> _Step:
    """A recorded item (Launch, Transfer or HostCall; fnx.backends.device) with the buffers it reads and writes.
    A launch's come from its kernel in the executable's lowering; without one, a buffer a launch is the first to
    use (not an input) is taken as written by it (a guess: right for plain kernels, not for PACK's copies, which
    get their kernel's arguments)."""
    if isinstance(item, Transfer):
        return _Step([f"#{number} transfer", f"{item.src_device} → {item.device}"], "transfer", [item.src], [item.dst])
    if isinstance(item, HostCall):
        return _Step([f"#{number} host {item.name}", f"on {item.device}"], "call", list(item.inputs),
                     list(item.outputs))
    lines = [f"#{number} launch {item.kernel}", f"on {item.device}", f"dims {list(item.dims)}"]
    if (kernel := kernels.get(item.kernel)) is not None:
        return _Step(lines, "kernel", sorted(kernel_reads(kernel)), sorted(kernel_writes(kernel)))
    fresh = sorted(b for b in set(item.buffers) if b not in written and b not in inputs)
    return _Step(lines, "kernel", sorted(set(item.buffers) - set(fresh)), fresh)


def draw_schedule(executable) -> Picture:
    """A picture of the order an `Executable` (fnx.backends.device) runs its items in: each item (a kernel
    launch with its device and dimensions, a transfer between devices, a host step) numbered in run order, between
    the buffers it reads and the buffers it writes.

    Args:
      executable: e.g. `fnx.jit(f).lower(x).executable`.
    Returns:
      a Picture.

    Example:
      >>> draw_schedule(fnx.jit(f).lower(x).executable).save("run.svg")
    """
    lowering = getattr(executable, "lowering", None)
    kernels = {k.name: k for k, lines in lowering.kernels if lines is not None} if lowering is not None else {}
    inputs = {b for b, spec in enumerate(executable.buffers) if spec.kind == "input"}
    steps, written = [], set()
    for number, item in enumerate(executable.items):
        steps.append(_item_step(number, item, kernels, written, inputs))
        written.update(steps[-1].writes)
    graph = _dataflow_graph(steps, executable.buffers, list(executable.output_ids), executable.device)
    heading = f"run order on {executable.device}: {len(steps)} items, {len(executable.buffers)} buffers"
    return _graph_picture(graph, heading, f"schedule, {len(steps)} items")


# ---- the lowering stages ----

def draw_lowering(lowering, stage: str) -> Picture:
    """A picture of one stage of a `fnx.lower.pipeline.Lowering` (what `Lowering.as_text(stage)` prints):

    - "callify": the function with its calls inlined, as `draw_function` draws it;
    - "rangeify": the kernel split: buffers (input, intermediate, output) and the kernels and host steps between
      them, each kernel with its loops and estimated cost;
    - "optimize": the same after optimize (which may split a kernel and add PACK buffers), each kernel also with
      its actions, vector lanes and the loop split across threads;
    - "linearize": each kernel's linear program, a column of instruction boxes (the first LINEAR_MAX_LINES);
    - "memory": the memory plan: each intermediate buffer a bar in its allocation over the steps it lives.

    Args:
      lowering: e.g. `fnx.jit(f).lower(x).executable.lowering`.
      stage: one of `fnx.lower.pipeline.STAGES`.
    Returns:
      a Picture.
    Raises:
      ValueError: for a stage that is not one of those.

    Example:
      >>> draw_lowering(fnx.jit(f).lower(x).executable.lowering, "rangeify").save("kernels.png")
    """
    if stage not in STAGES: raise ValueError(f"draw_lowering: unknown stage {stage!r}; the stages are {STAGES}")
    return stage_pictures[stage](lowering)


stage_pictures = {
    "callify": lambda lowering: _function_picture(lowering.fn, "callify: the function with its calls inlined"),
    "rangeify": lambda lowering: _dataflow_picture(lowering, "rangeify"),
    "optimize": lambda lowering: _dataflow_picture(lowering, "optimize"),
    "linearize": _linear_picture,
    "memory": _memory_picture,
}

__all__ = ["Graph", "Node", "Picture", "draw_function", "draw_graph", "draw_lowering", "draw_schedule"]
