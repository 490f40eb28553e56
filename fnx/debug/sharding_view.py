"""`visualize_array_sharding(x)`: the layout of an array over its devices as a grid of boxes, as JAX prints it.

    >>> fnx.debug.visualize_array_sharding(x)      # x: (8, 16) laid out by P("data", "model") on a 2x4 mesh
    ┌───────┬───────┬───────┬───────┐
    │ CPU 0 │ CPU 1 │ CPU 2 │ CPU 3 │
    ├───────┼───────┼───────┼───────┤
    │ CPU 4 │ CPU 5 │ CPU 6 │ CPU 7 │
    └───────┴───────┴───────┴───────┘

Rows are the blocks of axis 0, columns those of axis 1 (a vector is one row); a box lists every device holding
that block ("CPU 0,4": replicated on both). JAX draws with the `rich` package; this small text renderer needs
nothing, and fnx does not depend on rich for one picture.
"""
from __future__ import annotations

from typing import Any


def _blocks(indices: dict, axis: int, length: int) -> list[tuple[int, int]]:
    """The distinct (start, stop) ranges of `axis` among the devices' slices, in order."""
    if axis >= 0 and axis < len(next(iter(indices.values()))):
        spans = {(s[axis].start or 0, length if s[axis].stop is None else s[axis].stop) for s in indices.values()}
    else:
        spans = {(0, length)}
    return sorted(spans)


def sharding_text(shape: tuple[int, ...], sharding: Any) -> str:
    """The grid of boxes for an array of `shape` laid out by `sharding` (a NamedSharding or SingleDeviceSharding)."""
    if len(shape) > 2:
        raise ValueError(f"visualize_array_sharding: only arrays of rank 0, 1 or 2 can be drawn, got shape {shape}")
    if hasattr(sharding, "devices_indices_map"):
        indices = sharding.devices_indices_map(shape)
    else:
        indices = {sharding.device: tuple(slice(0, n) for n in shape)}
    rows = _blocks(indices, 0, shape[0]) if len(shape) == 2 else [(0, 1)]
    cols = _blocks(indices, len(shape) - 1, shape[-1]) if shape else [(0, 1)]
    cells = [[[] for _ in cols] for _ in rows]
    for device, index in indices.items():
        r = rows.index((index[0].start or 0, index[0].stop)) if len(shape) == 2 else 0
        c = cols.index((index[-1].start or 0, index[-1].stop)) if shape else 0
        cells[r][c].append(device)
    text = [[_label(devs) for devs in row] for row in cells]
    width = max(len(t) for row in text for t in row) + 2
    line = lambda left, mid, right: left + mid.join("─" * width for _ in cols) + right  # noqa: E731
    out = [line("┌", "┬", "┐")]
    for i, row in enumerate(text):
        out.append("│" + "│".join(t.center(width) for t in row) + "│")
        out.append(line("├", "┼", "┤") if i < len(text) - 1 else line("└", "┴", "┘"))
    return "\n".join(out)


def _label(devices: list) -> str:
    devices = sorted(devices, key=lambda d: d.id)
    platform = devices[0].platform.upper()
    return f"{platform} {','.join(str(d.id) for d in devices)}"


def visualize_array_sharding(arr: Any, *, use_color: bool = True, scale: float = 1.0, min_width: int = 9,
                             max_width: int = 80, color_map: Any = None) -> None:
    """Print how `arr` (rank 0 to 2) is laid out over its devices (JAX's options are accepted; fnx draws plain
    text)."""
    print(sharding_text(tuple(arr.shape), arr.sharding))


def visualize_sharding(shape: tuple[int, ...], sharding: Any, **options) -> None:
    """Print the layout `sharding` gives an array of `shape`."""
    print(sharding_text(tuple(shape), sharding))
