"""Saving and loading pytrees of arrays: `fnx.save(path, tree)`, `fnx.load(path)`.

The file is a numpy `.npz`: one entry per leaf plus a JSON description of the tree (dicts with string keys,
lists, tuples, None, and leaves). Nothing is pickled, so loading an untrusted file cannot run code; trees with
other node types (namedtuples, registered classes) raise TypeError when saved.
"""
from __future__ import annotations

import json
import os
from typing import Any

import numpy as np

from fnx import dtypes
from fnx.errors import at_user_line
from fnx.trace import to_array

_STRUCTURE = "__fnx_tree__"


def _describe(tree: Any, leaves: list) -> Any:
    if tree is None: return {"t": "none"}
    if type(tree) is dict:
        if not all(isinstance(k, str) for k in tree):
            raise TypeError(at_user_line(f"fnx.save: dict keys must be strings, got {list(tree)}"))
        return {"t": "dict", "c": {k: _describe(v, leaves) for k, v in tree.items()}}
    if type(tree) in (list, tuple):
        return {"t": type(tree).__name__, "c": [_describe(v, leaves) for v in tree]}
    if isinstance(tree, (list, tuple, dict)):
        raise TypeError(at_user_line(f"fnx.save: cannot save a {type(tree).__name__} node; use dicts, lists and "
                                     "tuples"))
    leaf = np.asarray(tree)
    leaves.append(leaf)
    return {"t": "leaf", "i": len(leaves) - 1, "d": dtypes.from_numpy(leaf.dtype).name}  # npz forgets bfloat16


def _rebuild(node: dict, arrays: Any) -> Any:
    kind = node["t"]
    if kind == "none": return None
    if kind == "dict": return {k: _rebuild(v, arrays) for k, v in node["c"].items()}
    if kind in ("list", "tuple"):
        items = [_rebuild(v, arrays) for v in node["c"]]
        return items if kind == "list" else tuple(items)
    return to_array(arrays[f"leaf{node['i']}"].view(dtypes.to_dtype(node["d"]).np))


def save(path: str | os.PathLike, tree: Any) -> None:
    """Write a pytree of arrays to `path` (an .npz file; written to a temporary name, then renamed)."""
    leaves: list[np.ndarray] = []
    structure = _describe(tree, leaves)
    path = os.fspath(path)
    tmp = f"{path}.tmp-{os.getpid()}.npz"
    np.savez(tmp, **{f"leaf{i}": leaf for i, leaf in enumerate(leaves)},
             **{_STRUCTURE: np.frombuffer(json.dumps(structure).encode(), np.uint8)})
    os.replace(tmp, path)


def load(path: str | os.PathLike) -> Any:
    """Read a pytree saved with `save`; leaves come back as fnx Arrays on the default device."""
    with np.load(os.fspath(path), allow_pickle=False) as arrays:
        if _STRUCTURE not in arrays:
            raise ValueError(at_user_line(f"fnx.load: {os.fspath(path)!r} was not written by fnx.save"))
        structure = json.loads(arrays[_STRUCTURE].tobytes().decode())
        return _rebuild(structure, arrays)
