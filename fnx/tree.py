"""The `jax.tree` module: short names for the pytree functions of fnx.tree_util.

    fnx.tree.map(lambda x, y: x + y, params, grads)
    leaves, treedef = fnx.tree.flatten({'a': 1, 'b': (2, 3)})
"""
from __future__ import annotations

import dataclasses
from typing import Any, Callable, Iterable

from fnx import tree_util
from fnx.tree_util import PyTreeDef

__all__ = ["all", "broadcast", "flatten", "flatten_with_path", "leaves", "leaves_with_path", "map", "map_with_path",
           "reduce", "reduce_associative", "static", "structure", "transpose", "unflatten"]

_NO_INIT = tree_util._NO_INIT  # "no initializer given" (None is a valid one)


def all(tree: Any, *, is_leaf: Callable[[Any], bool] | None = None) -> bool:  # noqa: A001
    """True iff every leaf of `tree` is truthy (a tree without leaves: True).

    Example:
      >>> fnx.tree.all([True, {'a': 1}])
      True
    """
    return tree_util.tree_all(tree, is_leaf=is_leaf)


def broadcast(prefix_tree: Any, full_tree: Any, is_leaf: Callable[[Any], bool] | None = None) -> Any:
    """`full_tree`'s structure with each leaf of `prefix_tree` repeated over the subtree it stands for.

    Example:
      >>> fnx.tree.broadcast((1, 2, 3), (0, {'a': 0, 'b': 0}, (0, 0)))
      (1, {'a': 2, 'b': 2}, (3, 3))
    """
    return tree_util.tree_broadcast(prefix_tree, full_tree, is_leaf)


def flatten(tree: Any, is_leaf: Callable[[Any], bool] | None = None) -> tuple[list[Any], PyTreeDef]:
    """`(leaves, treedef)` of a pytree: leaves in depth-first order (dict keys sorted).

    Example:
      >>> fnx.tree.flatten({'b': (1, None), 'a': 2})
      ([2, 1], PyTreeDef({'a': *, 'b': (*, None)}))
    """
    return tree_util.tree_flatten(tree, is_leaf)


def flatten_with_path(tree: Any, is_leaf: Callable[..., bool] | None = None, is_leaf_takes_path: bool = False
                      ) -> tuple[list[tuple[tree_util.KeyPath, Any]], PyTreeDef]:
    """`([(key_path, leaf), ...], treedef)`; `is_leaf(path, x)` when `is_leaf_takes_path`.

    Example:
      >>> fnx.tree.flatten_with_path({'a': [1]})[0]
      [((DictKey(key='a'), SequenceKey(idx=0)), 1)]
    """
    return tree_util.tree_flatten_with_path(tree, is_leaf, is_leaf_takes_path)


def leaves(tree: Any, is_leaf: Callable[[Any], bool] | None = None) -> list[Any]:
    """The leaves of a pytree, in flattening order.

    Example:
      >>> fnx.tree.leaves({'a': [1, 2], 'b': None})
      [1, 2]
    """
    return tree_util.tree_leaves(tree, is_leaf)


def leaves_with_path(tree: Any, is_leaf: Callable[..., bool] | None = None,
                     is_leaf_takes_path: bool = False) -> list[tuple[tree_util.KeyPath, Any]]:
    """The `(key_path, leaf)` pairs of a pytree."""
    return tree_util.tree_leaves_with_path(tree, is_leaf, is_leaf_takes_path)


def map(f: Callable[..., Any], tree: Any, *rest: Any,  # noqa: A001
        is_leaf: Callable[[Any], bool] | None = None) -> Any:
    """`f` applied to the leaves of `tree` and the matching subtrees of each of `rest` (which have `tree`'s
    structure as a prefix); the result has `tree`'s structure.

    Example:
      >>> fnx.tree.map(lambda x, y: x + y, (1, {'a': 2}), (10, {'a': 20}))
      (11, {'a': 22})
    """
    return tree_util.tree_map(f, tree, *rest, is_leaf=is_leaf)


def map_with_path(f: Callable[..., Any], tree: Any, *rest: Any, is_leaf: Callable[..., bool] | None = None,
                  is_leaf_takes_path: bool = False) -> Any:
    """Like `map`, with `f(key_path, x, *xs)`.

    Example:
      >>> fnx.tree.map_with_path(lambda path, x: x + path[0].idx, [1, 2, 3])
      [1, 3, 5]
    """
    return tree_util.tree_map_with_path(f, tree, *rest, is_leaf=is_leaf, is_leaf_takes_path=is_leaf_takes_path)


def reduce(function: Callable[[Any, Any], Any], tree: Any, initializer: Any = _NO_INIT,
           is_leaf: Callable[[Any], bool] | None = None) -> Any:
    """`functools.reduce(function, leaves(tree)[, initializer])`.

    Example:
      >>> fnx.tree.reduce(operator.add, [1, (2, 3)], 10)
      16
    """
    return tree_util.tree_reduce(function, tree, initializer, is_leaf)


def reduce_associative(operation: Callable[[Any, Any], Any], tree: Any, *, identity: Any = _NO_INIT,
                       is_leaf: Callable[[Any], bool] | None = None) -> Any:
    """Reduces the leaves with an associative `operation` as a balanced tree of calls; `identity` for no leaves."""
    return tree_util.tree_reduce_associative(operation, tree, identity=identity, is_leaf=is_leaf)


def structure(tree: Any, is_leaf: Callable[[Any], bool] | None = None) -> PyTreeDef:
    """The treedef of a pytree.

    Example:
      >>> fnx.tree.structure([1, (2, None)])
      PyTreeDef([*, (*, None)])
    """
    return tree_util.tree_structure(tree, is_leaf)


def transpose(outer_treedef: PyTreeDef, inner_treedef: PyTreeDef | None, pytree_to_transpose: Any) -> Any:
    """An outer tree of inner trees as an inner tree of outer trees (`inner_treedef` None: inferred).

    Example:
      >>> fnx.tree.transpose(fnx.tree.structure([0, 0]), None, [(1, 2), (3, 4)])
      ([1, 3], [2, 4])
    """
    return tree_util.tree_transpose(outer_treedef, inner_treedef, pytree_to_transpose)


def unflatten(treedef: PyTreeDef, leaves: Iterable[Any]) -> Any:
    """The pytree of structure `treedef` holding `leaves` (the inverse of `flatten`)."""
    return tree_util.tree_unflatten(treedef, leaves)


def static(**kwargs: Any) -> Any:
    """A `dataclasses.field(**kwargs)` marked static: `register_dataclass` keeps it in the treedef, not as a leaf.

    Example:
      >>> @fnx.tree_util.register_dataclass
      ... @dataclasses.dataclass
      ... class Op:
      ...   x: Any
      ...   kind: str = fnx.tree.static(default="add")
      >>> fnx.tree.leaves(Op(1))
      [1]
    """
    metadata = dict(kwargs.pop("metadata", None) or {})
    metadata["static"] = True
    return dataclasses.field(metadata=metadata, **kwargs)
