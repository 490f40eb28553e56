"""Pytrees: nested containers of leaves, with the same API and semantics as ``jax.tree_util``.

Node types are tuples, lists, dicts (keys sorted; unsortable keys keep insertion
order), ``None`` (a node with no children), namedtuples, ``OrderedDict``,
``defaultdict`` and any type registered with :func:`register_pytree_node`,
:func:`register_pytree_node_class` or :func:`register_dataclass`. Everything
else is a leaf. Types are looked up exactly: subclasses are not nodes unless
registered themselves (namedtuples excepted).
"""
from __future__ import annotations

import collections
import dataclasses
import functools
import operator
from typing import Any, Callable, Hashable, Iterable, NamedTuple, Sequence

__all__ = [
    "PyTreeDef", "tree_flatten", "tree_unflatten", "tree_leaves", "tree_structure", "tree_map", "tree_all",
    "tree_reduce", "tree_transpose", "tree_flatten_with_path", "tree_leaves_with_path", "tree_map_with_path",
    "keystr", "SequenceKey", "DictKey", "GetAttrKey", "FlattenedIndexKey", "register_pytree_node",
    "register_pytree_with_keys", "register_pytree_node_class", "register_dataclass", "treedef_is_leaf",
    "KeyEntry", "KeyPath", "Partial", "all_leaves", "flatten_one_level", "flatten_one_level_with_keys",
    "is_tree_node", "register_pytree_with_keys_class", "register_static", "tree_broadcast", "tree_reduce_associative",
    "treedef_children", "treedef_tuple",
]

# ---------------------------------------------------------------------------
# Keys


@dataclasses.dataclass(frozen=True)
class SequenceKey:
    """Key of a tuple or list element."""
    idx: int

    def __str__(self) -> str:
        return f"[{self.idx!r}]"


@dataclasses.dataclass(frozen=True)
class DictKey:
    """Key of a dict entry."""
    key: Hashable

    def __str__(self) -> str:
        return f"[{self.key!r}]"


@dataclasses.dataclass(frozen=True)
class GetAttrKey:
    """Key of an attribute (namedtuple and dataclass fields)."""
    name: str

    def __str__(self) -> str:
        return f".{self.name}"


@dataclasses.dataclass(frozen=True)
class FlattenedIndexKey:
    """Key of the i-th child of a registered node that has no keyed flatten function."""
    key: int

    def __str__(self) -> str:
        return f"[<flat index {self.key}>]"


KeyEntry = Any
KeyPath = tuple[KeyEntry, ...]


def keystr(keys: KeyPath, *, simple: bool = False, separator: str = "") -> str:
    """Renders a key path as a string.

    Args:
      keys: a key path, as produced by :func:`tree_flatten_with_path`.
      simple: if True, render each key bare (``0``, ``a``) instead of as an accessor (``[0]``, ``['a']``, ``.a``).
      separator: string placed between keys.

    Returns:
      The rendered path, e.g. ``"['a'][0].x"``.
    """
    if not simple:
        return separator.join(map(str, keys))
    bare = {SequenceKey: "idx", DictKey: "key", GetAttrKey: "name", FlattenedIndexKey: "key"}
    return separator.join(str(getattr(k, bare[type(k)])) if type(k) in bare else str(k) for k in keys)


# ---------------------------------------------------------------------------
# Registry


class _Node(NamedTuple):
    # flatten_with_keys(x) -> (((key, child), ...), aux); unflatten(aux, children) -> x
    flatten: Callable[[Any], tuple[Iterable[Any], Any]]
    flatten_with_keys: Callable[[Any], tuple[Iterable[tuple[KeyEntry, Any]], Any]]
    unflatten: Callable[[Any, tuple[Any, ...]], Any]


_registry: dict[type, _Node] = {}


def _register(nodetype: type, node: _Node) -> None:
    if nodetype in _registry:
        raise ValueError(f"Duplicate pytree node registration for {nodetype}")
    _registry[nodetype] = node


def register_pytree_node(nodetype: type, flatten_func: Callable[[Any], tuple[Iterable[Any], Any]],
                         unflatten_func: Callable[[Any, Iterable[Any]], Any],
                         flatten_with_keys_func: Callable[[Any], tuple[Iterable[tuple[KeyEntry, Any]], Any]]
                         | None = None) -> None:
    """Extends the set of types considered internal nodes in pytrees.

    Args:
      nodetype: the type to register.
      flatten_func: ``x -> (children, aux_data)``; ``aux_data`` is stored in the
        treedef and must be hashable and comparable.
      unflatten_func: ``(aux_data, children) -> x``.
      flatten_with_keys_func: optional ``x -> (((key, child), ...), aux_data)``;
        without it children are keyed by :class:`FlattenedIndexKey`.

    Raises:
      ValueError: if ``nodetype`` is already registered.
    """
    if flatten_with_keys_func is None:
        def flatten_with_keys_func(x):
            children, aux = flatten_func(x)
            return [(FlattenedIndexKey(i), c) for i, c in enumerate(children)], aux
    _register(nodetype, _Node(flatten_func, flatten_with_keys_func, unflatten_func))


def register_pytree_with_keys(nodetype: type,
                              flatten_with_keys: Callable[[Any], tuple[Iterable[tuple[KeyEntry, Any]], Any]],
                              unflatten_func: Callable[[Any, Iterable[Any]], Any],
                              flatten_func: Callable[[Any], tuple[Iterable[Any], Any]] | None = None) -> None:
    """Like :func:`register_pytree_node`, but children come with keys: ``x -> (((key, child), ...), aux)``."""
    if flatten_func is None:
        def flatten_func(x):
            pairs, aux = flatten_with_keys(x)
            return [c for _, c in pairs], aux
    register_pytree_node(nodetype, flatten_func, unflatten_func, flatten_with_keys)


def register_pytree_node_class(cls: type) -> type:
    """Class decorator registering ``cls`` via its ``tree_flatten`` method and ``tree_unflatten`` classmethod.

    Example:
      >>> @register_pytree_node_class
      ... class Pair:
      ...   def __init__(self, a, b): self.a, self.b = a, b
      ...   def tree_flatten(self): return (self.a, self.b), None
      ...   @classmethod
      ...   def tree_unflatten(cls, aux, children): return cls(*children)
    """
    register_pytree_node(cls, operator.methodcaller("tree_flatten"), cls.tree_unflatten)
    return cls


def register_pytree_with_keys_class(cls: type) -> type:
    """Class decorator registering ``cls`` via its ``tree_flatten_with_keys`` method (``x -> (((key, child), ...),
    aux)``), its optional ``tree_flatten`` method and its ``tree_unflatten`` classmethod."""
    flatten = operator.methodcaller("tree_flatten") if hasattr(cls, "tree_flatten") else None
    register_pytree_with_keys(cls, operator.methodcaller("tree_flatten_with_keys"), cls.tree_unflatten, flatten)
    return cls


def register_static(cls: type) -> type:
    """Registers ``cls`` as a pytree node with no children: an instance is kept whole in the treedef, so jit treats
    it as a static argument (it must be hashable). Usable as a decorator; returns ``cls``.

    Example:
      >>> @register_static
      ... class Mode(str): pass
      >>> tree_leaves([1, Mode("add")])
      [1]
    """
    register_pytree_node(cls, lambda x: ((), x), lambda aux, _: aux, lambda x: ((), x))
    return cls


def register_dataclass(nodetype: type | None = None, data_fields: Sequence[str] | None = None,
                       meta_fields: Sequence[str] | None = None, drop_fields: Sequence[str] = ()) -> Any:
    """Registers a dataclass as a pytree node; usable as a decorator.

    Data fields are children; meta fields are stored in the treedef, so they take
    part in treedef equality and hashing and must be hashable.

    Args:
      nodetype: the class. If omitted, returns a decorator.
      data_fields: names of child fields. If both field lists are omitted, every
        init field is a data field unless declared with ``metadata={'static': True}``.
      meta_fields: names of static fields.
      drop_fields: init fields to leave out of both lists (they must have defaults).

    Returns:
      ``nodetype``, registered.
    """
    if nodetype is None:
        return functools.partial(register_dataclass, data_fields=data_fields, meta_fields=meta_fields,
                                 drop_fields=drop_fields)
    if data_fields is None and meta_fields is None:
        if not dataclasses.is_dataclass(nodetype):
            raise TypeError(f"register_dataclass needs data_fields and meta_fields for non-dataclass {nodetype}")
        init = [f for f in dataclasses.fields(nodetype) if f.init and f.name not in drop_fields]
        meta_fields = [f.name for f in init if f.metadata.get("static", False)]
        data_fields = [f.name for f in init if not f.metadata.get("static", False)]
    elif data_fields is None or meta_fields is None:
        raise TypeError("register_dataclass: pass both data_fields and meta_fields, or neither")
    data_fields, meta_fields = tuple(data_fields), tuple(meta_fields)
    if dataclasses.is_dataclass(nodetype):
        init = {f.name for f in dataclasses.fields(nodetype) if f.init} - set(drop_fields)
        given = set(data_fields) | set(meta_fields)
        if given != init or len(given) != len(data_fields) + len(meta_fields):
            raise ValueError(f"data_fields {data_fields} and meta_fields {meta_fields} must partition the init "
                             f"fields {sorted(init)} of {nodetype.__name__}")

    def flatten_with_keys(x):
        return ([(GetAttrKey(n), getattr(x, n)) for n in data_fields],
                tuple(getattr(x, n) for n in meta_fields))

    def flatten(x):
        return [getattr(x, n) for n in data_fields], tuple(getattr(x, n) for n in meta_fields)

    def unflatten(aux, children):
        return nodetype(**dict(zip(meta_fields, aux)), **dict(zip(data_fields, children)))

    register_pytree_node(nodetype, flatten, unflatten, flatten_with_keys)
    return nodetype


def _dict_keys(d: dict) -> tuple:
    try:
        return tuple(sorted(d))
    except TypeError:  # unsortable (mixed-type) keys keep insertion order
        return tuple(d)


register_pytree_node(
    tuple, lambda t: (t, None), lambda _, c: tuple(c),
    lambda t: ([(SequenceKey(i), x) for i, x in enumerate(t)], None))
register_pytree_node(
    list, lambda l: (l, None), lambda _, c: list(c),
    lambda l: ([(SequenceKey(i), x) for i, x in enumerate(l)], None))
def _dict_flatten(d: dict) -> tuple[list, tuple]:
    keys = _dict_keys(d)
    return [d[k] for k in keys], keys


def _dict_flatten_with_keys(d: dict) -> tuple[list, tuple]:
    keys = _dict_keys(d)
    return [(DictKey(k), d[k]) for k in keys], keys


register_pytree_node(dict, _dict_flatten, lambda keys, c: dict(zip(keys, c)), _dict_flatten_with_keys)
register_pytree_node(
    type(None), lambda _: ((), None), lambda _, c: None, lambda _: ((), None))
register_pytree_node(
    collections.OrderedDict, lambda d: (list(d.values()), tuple(d)),
    lambda keys, c: collections.OrderedDict(zip(keys, c)),
    lambda d: ([(DictKey(k), v) for k, v in d.items()], tuple(d)))
# the default factory is aux data, so defaultdicts with different factories differ in structure
register_pytree_node(
    collections.defaultdict,
    lambda d: (_dict_flatten(d)[0], (d.default_factory, _dict_keys(d))),
    lambda aux, c: collections.defaultdict(aux[0], zip(aux[1], c)),
    lambda d: (_dict_flatten_with_keys(d)[0], (d.default_factory, _dict_keys(d))))


def _namedtuple_node(cls: type) -> _Node:
    return _Node(lambda t: (t, None),
                 lambda t: ([(GetAttrKey(f), x) for f, x in zip(cls._fields, t)], None),
                 lambda _, c: cls(*c))


def _lookup(t: type) -> _Node | None:
    node = _registry.get(t)
    if node is None and issubclass(t, tuple) and hasattr(t, "_fields"):  # any namedtuple is a node
        node = _namedtuple_node(t)
    return node


# ---------------------------------------------------------------------------
# PyTreeDef


class PyTreeDef:
    """The structure of a pytree: node types, aux data, and where the leaves go.

    Treedefs are immutable, hashable and compare equal iff their node types,
    aux data and children are equal.
    """

    __slots__ = ("_type", "_aux", "_children", "num_leaves", "num_nodes", "_hash")

    def __init__(self, node_type: type | None, aux: Any, children: tuple[PyTreeDef, ...]):
        self._type = node_type  # None marks a leaf
        self._aux = aux
        self._children = children
        self.num_leaves: int = 1 if node_type is None else sum(c.num_leaves for c in children)
        self.num_nodes: int = 1 + sum(c.num_nodes for c in children)
        self._hash: int | None = None

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, PyTreeDef):
            return NotImplemented
        return self is other or (self._type is other._type and self.num_leaves == other.num_leaves
                                 and self._aux == other._aux and self._children == other._children)

    def __hash__(self) -> int:
        if self._hash is None:
            self._hash = hash((self._type, self._aux, self._children))
        return self._hash

    def __repr__(self) -> str:
        return f"PyTreeDef({self._str()})"

    def _str(self) -> str:
        t, kids = self._type, [c._str() for c in self._children]
        if t is None:
            return "*"
        if t is type(None):
            return "None"
        if t is tuple:
            return f"({kids[0]},)" if len(kids) == 1 else f"({', '.join(kids)})"
        if t is list:
            return f"[{', '.join(kids)}]"
        keys = self._aux[1] if t is collections.defaultdict else self._aux
        if t in (dict, collections.OrderedDict, collections.defaultdict):
            body = "{" + ", ".join(f"{k!r}: {v}" for k, v in zip(keys, kids)) + "}"
            if t is dict:
                return body
            return f"{t.__name__}({self._aux[0]!r}, {body})" if t is collections.defaultdict else f"OrderedDict({body})"
        if t not in _registry:  # namedtuple
            return f"{t.__name__}(" + ", ".join(f"{f}={v}" for f, v in zip(t._fields, kids)) + ")"
        return f"CustomNode({t.__name__}[{self._aux!r}], [{', '.join(kids)}])"

    def unflatten(self, leaves: Iterable[Any]) -> Any:
        """Builds a pytree of this structure from ``leaves`` (in flattening order)."""
        leaves = list(leaves)
        if len(leaves) != self.num_leaves:
            raise ValueError(f"Wrong number of leaves for {self}: expected {self.num_leaves}, got {len(leaves)}")
        return self._build(iter(leaves))

    def _build(self, it: Iterable[Any]) -> Any:
        if self._type is None:
            return next(it)
        node = _lookup(self._type)
        return node.unflatten(self._aux, tuple(c._build(it) for c in self._children))

    def children(self) -> list[PyTreeDef]:
        """The treedefs of this node's children (empty for a leaf)."""
        return list(self._children)

    def node_data(self) -> tuple[type, Any] | None:
        """``(node_type, aux_data)`` of the root node, or None for a leaf."""
        return None if self._type is None else (self._type, self._aux)

    def compose(self, inner: PyTreeDef) -> PyTreeDef:
        """The treedef of this structure with every leaf replaced by ``inner``."""
        if self._type is None:
            return inner
        return PyTreeDef(self._type, self._aux, tuple(c.compose(inner) for c in self._children))

    def flatten_up_to(self, tree: Any) -> list[Any]:
        """Flattens ``tree`` down to this treedef's leaves, which must be a prefix of ``tree``'s structure.

        Raises:
          ValueError: if ``tree`` does not match this structure.
        """
        out: list[Any] = []
        self._flatten_up_to(tree, (), out)
        return out

    def _flatten_up_to(self, x: Any, path: KeyPath, out: list[Any]) -> None:
        if self._type is None:
            out.append(x)
            return
        where = f"at {keystr(path)}" if path else "at the root"

        def mismatch(what: str) -> ValueError:
            return ValueError(f"pytree structure mismatch {where}: {what}. Expected structure {self!r}, got {x!r}")

        if type(x) is not self._type:
            raise mismatch(f"expected node type {self._type.__name__}, got {type(x).__name__}")
        pairs, aux = _lookup(self._type).flatten_with_keys(x)
        pairs = list(pairs)
        if len(pairs) != len(self._children):
            raise mismatch(f"expected {len(self._children)} children, got {len(pairs)}")
        if aux != self._aux:
            raise mismatch(f"node data differ: expected {self._aux!r}, got {aux!r}")
        for c, (k, v) in zip(self._children, pairs):
            c._flatten_up_to(v, (*path, k), out)


def treedef_is_leaf(treedef: PyTreeDef) -> bool:
    """True if ``treedef`` is a single leaf."""
    return treedef._type is None


def treedef_children(treedef: PyTreeDef) -> list[PyTreeDef]:
    """The treedefs of the children of ``treedef``'s root node."""
    return treedef.children()


def treedef_tuple(treedefs: Iterable[PyTreeDef]) -> PyTreeDef:
    """The treedef of a tuple whose children have the structures ``treedefs``.

    Example:
      >>> treedef_tuple([tree_structure([1]), tree_structure(2)]) == tree_structure(([1], 2))
      True
    """
    return PyTreeDef(tuple, None, tuple(treedefs))


def is_tree_node(typ: type) -> bool:
    """True if instances of type ``typ`` are pytree nodes (built in, registered, or a namedtuple)."""
    return _lookup(typ) is not None


def flatten_one_level(tree: Any) -> tuple[tuple[Any, ...], Any]:
    """``(children, aux_data)`` of the root node of ``tree``.

    Raises:
      ValueError: if ``tree`` is a leaf.
    """
    children, aux = _node_of(tree).flatten(tree)
    return tuple(children), aux


def flatten_one_level_with_keys(tree: Any) -> tuple[tuple[tuple[KeyEntry, Any], ...], Any]:
    """``(((key, child), ...), aux_data)`` of the root node of ``tree``; ValueError for a leaf."""
    pairs, aux = _node_of(tree).flatten_with_keys(tree)
    return tuple(pairs), aux


def _node_of(tree: Any) -> _Node:
    node = _lookup(type(tree))
    if node is None:
        raise ValueError(f"can't tree-flatten type: {type(tree)}")
    return node


def all_leaves(iterable: Iterable[Any], is_leaf: Callable[[Any], bool] | None = None) -> bool:
    """True if every element of ``iterable`` is a leaf (``None`` is not: it is a node without children)."""
    return all(treedef_is_leaf(tree_structure(x, is_leaf)) for x in iterable)


_LEAF = PyTreeDef(None, None, ())


# ---------------------------------------------------------------------------
# Flattening


def _flatten(x: Any, is_leaf: Callable[..., bool] | None, leaves: list, path: KeyPath | None,
             is_leaf_takes_path: bool = False) -> PyTreeDef:
    """Appends the leaves of ``x`` (or ``(path, leaf)`` pairs when ``path`` is given) and returns its treedef;
    ``is_leaf`` is called as ``is_leaf(path, x)`` when ``is_leaf_takes_path``."""
    stop = is_leaf is not None and (is_leaf(path, x) if is_leaf_takes_path else is_leaf(x))
    node = None if stop else _lookup(type(x))
    if node is None:
        leaves.append(x if path is None else (path, x))
        return _LEAF
    if path is None:
        children, aux = node.flatten(x)
        defs = tuple(_flatten(c, is_leaf, leaves, None) for c in children)
    else:
        pairs, aux = node.flatten_with_keys(x)
        defs = tuple(_flatten(c, is_leaf, leaves, (*path, k), is_leaf_takes_path) for k, c in pairs)
    return PyTreeDef(type(x), aux, defs)


def tree_flatten(tree: Any, is_leaf: Callable[[Any], bool] | None = None) -> tuple[list[Any], PyTreeDef]:
    """Flattens a pytree into its leaves and structure.

    Args:
      tree: a pytree.
      is_leaf: optional predicate; a subtree for which it returns True is treated as a leaf.

    Returns:
      ``(leaves, treedef)``: the leaves in depth-first order (dict keys sorted)
      and the structure needed by :func:`tree_unflatten`.

    Example:
      >>> tree_flatten({'b': (1, None), 'a': 2})
      ([2, 1], PyTreeDef({'a': *, 'b': (*, None)}))
    """
    leaves: list[Any] = []
    return leaves, _flatten(tree, is_leaf, leaves, None)


def tree_unflatten(treedef: PyTreeDef, leaves: Iterable[Any]) -> Any:
    """Reconstructs a pytree from a treedef and its leaves (inverse of :func:`tree_flatten`)."""
    return treedef.unflatten(leaves)


def tree_leaves(tree: Any, is_leaf: Callable[[Any], bool] | None = None) -> list[Any]:
    """The leaves of a pytree, in flattening order."""
    return tree_flatten(tree, is_leaf)[0]


def tree_structure(tree: Any, is_leaf: Callable[[Any], bool] | None = None) -> PyTreeDef:
    """The treedef of a pytree."""
    return tree_flatten(tree, is_leaf)[1]


def tree_flatten_with_path(tree: Any, is_leaf: Callable[..., bool] | None = None, is_leaf_takes_path: bool = False
                           ) -> tuple[list[tuple[KeyPath, Any]], PyTreeDef]:
    """Like :func:`tree_flatten`, but each leaf comes with its key path (``is_leaf(path, x)`` when
    ``is_leaf_takes_path``).

    Returns:
      ``([(key_path, leaf), ...], treedef)``.

    Example:
      >>> tree_flatten_with_path({'a': [1]})[0]
      [((DictKey(key='a'), SequenceKey(idx=0)), 1)]
    """
    leaves: list[Any] = []
    return leaves, _flatten(tree, is_leaf, leaves, (), is_leaf_takes_path)


def tree_leaves_with_path(tree: Any, is_leaf: Callable[..., bool] | None = None,
                          is_leaf_takes_path: bool = False) -> list[tuple[KeyPath, Any]]:
    """The ``(key_path, leaf)`` pairs of a pytree."""
    return tree_flatten_with_path(tree, is_leaf, is_leaf_takes_path)[0]


def _rest_leaves(treedef: PyTreeDef, rest: Sequence[Any]) -> list[list[Any]]:
    out = []
    for i, r in enumerate(rest, start=1):
        try:
            out.append(treedef.flatten_up_to(r))
        except ValueError as e:  # say which argument is at fault
            raise ValueError(f"tree_map: argument {i} does not match the structure of argument 0: {e}") from None
    return out


def tree_map(f: Callable[..., Any], tree: Any, *rest: Any, is_leaf: Callable[[Any], bool] | None = None) -> Any:
    """Maps ``f`` over the leaves of one or more pytrees.

    Args:
      f: called as ``f(x, *xs)`` with ``x`` a leaf of ``tree`` and ``xs`` the
        matching subtrees of ``rest``.
      tree: the pytree whose structure the result has.
      *rest: pytrees which each must have ``tree``'s structure as a prefix.
      is_leaf: optional predicate marking extra leaves of ``tree``.

    Returns:
      A pytree with ``tree``'s structure holding the results of ``f``.

    Raises:
      ValueError: if a tree in ``rest`` does not match ``tree``'s structure.

    Example:
      >>> tree_map(lambda x, y: x + y, (1, {'a': 2}), (10, {'a': 20}))
      (11, {'a': 22})
    """
    leaves, treedef = tree_flatten(tree, is_leaf)
    others = _rest_leaves(treedef, rest)
    return treedef.unflatten(f(*xs) for xs in zip(leaves, *others))


def tree_map_with_path(f: Callable[..., Any], tree: Any, *rest: Any, is_leaf: Callable[..., bool] | None = None,
                       is_leaf_takes_path: bool = False) -> Any:
    """Like :func:`tree_map`, but ``f`` is called as ``f(key_path, x, *xs)``.

    Example:
      >>> tree_map_with_path(lambda path, x: x + path[0].idx, [1, 2, 3])
      [1, 3, 5]
    """
    pairs, treedef = tree_flatten_with_path(tree, is_leaf, is_leaf_takes_path)
    others = _rest_leaves(treedef, rest)
    return treedef.unflatten(f(p, x, *xs) for (p, x), *xs in zip(pairs, *others))


def tree_all(tree: Any, *, is_leaf: Callable[[Any], bool] | None = None) -> bool:
    """True iff every leaf of ``tree`` is truthy."""
    return all(tree_leaves(tree, is_leaf))


_NO_INIT = object()


def tree_reduce(function: Callable[[Any, Any], Any], tree: Any, initializer: Any = _NO_INIT,
                is_leaf: Callable[[Any], bool] | None = None) -> Any:
    """Reduces the leaves of ``tree`` with ``function``, like ``functools.reduce``.

    Raises:
      TypeError: if ``tree`` has no leaves and no ``initializer`` is given.
    """
    leaves = tree_leaves(tree, is_leaf)
    if initializer is _NO_INIT:
        return functools.reduce(function, leaves)
    return functools.reduce(function, leaves, initializer)


def tree_transpose(outer_treedef: PyTreeDef, inner_treedef: PyTreeDef | None, pytree_to_transpose: Any) -> Any:
    """Turns a tree of trees inside out: an ``outer`` of ``inner`` s becomes an ``inner`` of ``outer`` s.

    Args:
      outer_treedef: structure of the outer tree.
      inner_treedef: structure of each inner tree; inferred from the first one if None.
      pytree_to_transpose: a pytree of structure ``outer_treedef.compose(inner_treedef)``.

    Returns:
      The transposed pytree.

    Raises:
      TypeError: if the leaf count does not match the two structures.

    Example:
      >>> tree_transpose(tree_structure([0, 0]), tree_structure((0, 0)), [(1, 2), (3, 4)])
      ([1, 3], [2, 4])
    """
    if inner_treedef is None:
        inner_treedef = tree_structure(outer_treedef.flatten_up_to(pytree_to_transpose)[0])
    flat, treedef = tree_flatten(pytree_to_transpose)
    n_in, n_out = inner_treedef.num_leaves, outer_treedef.num_leaves
    if treedef.num_leaves != n_in * n_out:
        raise TypeError(f"Mismatch\n{treedef}\n != \n{outer_treedef.compose(inner_treedef)}")
    rows = [flat[i * n_in:(i + 1) * n_in] for i in range(n_out)]
    return inner_treedef.unflatten(outer_treedef.unflatten(col) for col in zip(*rows))


def tree_reduce_associative(operation: Callable[[Any, Any], Any], tree: Any, *, identity: Any = _NO_INIT,
                            is_leaf: Callable[[Any], bool] | None = None) -> Any:
    """Reduces the leaves of ``tree`` with an associative ``operation`` as a balanced tree of calls (depth log n).

    Args:
      operation: an associative binary function.
      tree: the pytree to reduce.
      identity: the result for a tree without leaves.
      is_leaf: optional predicate marking extra leaves.

    Raises:
      TypeError: if ``tree`` has no leaves and no ``identity`` is given.

    Example:
      >>> tree_reduce_associative(operator.add, [1, (2, 3), [4, 5, 6]])
      21
    """
    leaves = tree_leaves(tree, is_leaf)
    if not leaves:
        if identity is _NO_INIT:
            raise TypeError("Must specify identity for parallel reduction of empty sequence.")
        return identity
    while len(leaves) > 1:
        paired = [operation(a, b) for a, b in zip(leaves[::2], leaves[1::2])]
        leaves = paired + leaves[len(paired) * 2:]
    return leaves[0]


def tree_broadcast(prefix_tree: Any, full_tree: Any, is_leaf: Callable[[Any], bool] | None = None) -> Any:
    """``full_tree``'s structure with each leaf of ``prefix_tree`` repeated over the subtree it stands for.

    Example:
      >>> tree_broadcast((1, 2, 3), (0, {'a': 0, 'b': 0}, (0, 0)))
      (1, {'a': 2, 'b': 2}, (3, 3))

    Raises:
      ValueError: if ``prefix_tree`` is not a prefix of ``full_tree``.
    """
    leaves, treedef = tree_flatten(prefix_tree, is_leaf)
    subtrees = treedef.flatten_up_to(full_tree)
    return treedef.unflatten(tree_map(lambda _, leaf=leaf: leaf, sub, is_leaf=is_leaf)
                             for leaf, sub in zip(leaves, subtrees))


class Partial(functools.partial):
    """A ``functools.partial`` that is a pytree: its bound arguments are the children and the function is aux data,
    so it can be passed to and returned from jitted and transformed functions.

    Example:
      >>> add_one = Partial(operator.add, 1)
      >>> tree_map(lambda x: x * 10, add_one)(1)
      11
    """


register_pytree_node(
    Partial, lambda p: ((p.args, p.keywords), p.func), lambda func, c: Partial(func, *c[0], **c[1]),
    lambda p: ([(GetAttrKey("args"), p.args), (GetAttrKey("keywords"), p.keywords)], p.func))


def __getattr__(name: str):
    from fnx.jax_names import missing
    raise missing("fnx.tree_util", name)
