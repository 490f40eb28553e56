import collections
import dataclasses
import functools
import operator

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import fnx.tree_util as tu
from fnx.tree_util import DictKey, FlattenedIndexKey, GetAttrKey, SequenceKey

Point = collections.namedtuple("Point", "x y")

leaves = st.integers(-1000, 1000)
trees = st.recursive(
    leaves | st.none(),
    lambda kids: (st.lists(kids, max_size=4) | st.lists(kids, max_size=4).map(tuple)
                  | st.dictionaries(st.text(max_size=3), kids, max_size=4)
                  | st.builds(Point, kids, kids)),
    max_leaves=25)


def reference_leaves(t):
    """Naive depth-first leaf order: dicts by sorted key, None has no leaves."""
    if t is None:
        return []
    if isinstance(t, (list, tuple)):
        return [x for c in t for x in reference_leaves(c)]
    if isinstance(t, dict):
        return [x for k in sorted(t) for x in reference_leaves(t[k])]
    return [t]


def get_path(t, path):
    for k in path:
        t = getattr(t, k.name) if isinstance(k, GetAttrKey) else t[k.idx if isinstance(k, SequenceKey) else k.key]
    return t


@settings(max_examples=200, deadline=None)
@given(trees)
def test_round_trip(t):
    flat, treedef = tu.tree_flatten(t)
    assert flat == reference_leaves(t) == tu.tree_leaves(t)
    assert treedef.num_leaves == len(flat)
    assert tu.tree_unflatten(treedef, flat) == t
    assert treedef.unflatten(flat) == t
    assert tu.tree_structure(t) == treedef and hash(tu.tree_structure(t)) == hash(treedef)
    rebuilt = tu.tree_unflatten(treedef, [x + 1 for x in flat])
    assert tu.tree_structure(rebuilt) == treedef
    assert tu.tree_map(lambda x: x + 1, t) == rebuilt
    assert tu.tree_map(lambda x, y: y - x, t, rebuilt) == tu.tree_map(lambda _: 1, t)
    assert treedef.num_nodes == 1 + sum(c.num_nodes for c in treedef.children())
    assert sum(c.num_leaves for c in treedef.children()) == treedef.num_leaves or not treedef.children()


@settings(max_examples=200, deadline=None)
@given(trees)
def test_paths_address_their_leaves(t):
    pairs, treedef = tu.tree_flatten_with_path(t)
    assert [x for _, x in pairs] == tu.tree_leaves(t)
    assert treedef == tu.tree_structure(t)
    for path, x in pairs:
        assert get_path(t, path) == x
    assert tu.tree_map_with_path(lambda p, x: get_path(t, p) - x, t) == tu.tree_map(lambda _: 0, t)


@settings(max_examples=100, deadline=None)
@given(trees, trees)
def test_treedef_equality_agrees_with_structure(a, b):
    da, db = tu.tree_structure(a), tu.tree_structure(b)
    same = tu.tree_map(lambda _: 0, a) == tu.tree_map(lambda _: 0, b) and type(a) is type(b)
    if same:
        assert da == db and hash(da) == hash(db)
    if da == db:
        assert tu.tree_unflatten(da, tu.tree_leaves(b)) == b


def test_basic_structures_and_repr():
    flat, treedef = tu.tree_flatten({"b": (1, None), "a": 2})
    assert flat == [2, 1]
    assert repr(treedef) == "PyTreeDef({'a': *, 'b': (*, None)})"
    assert repr(tu.tree_structure((1,))) == "PyTreeDef((*,))"
    assert repr(tu.tree_structure([Point(1, 2)])) == "PyTreeDef([Point(x=*, y=*)])"
    assert tu.tree_flatten(None) == ([], tu.tree_structure(None))
    assert tu.tree_structure(None).num_leaves == 0 and tu.tree_structure(None).num_nodes == 1
    assert tu.tree_structure(5).num_leaves == 1 and tu.treedef_is_leaf(tu.tree_structure(5))
    assert tu.tree_structure((1, 2)).num_nodes == 3
    assert tu.tree_structure((1, 2)) != tu.tree_structure([1, 2])
    assert tu.tree_structure(Point(1, 2)) != tu.tree_structure((1, 2))
    assert tu.tree_structure({"a": 1}) != tu.tree_structure({"b": 1})
    assert tu.tree_structure((1, 2)).children() == [tu.tree_structure(0)] * 2
    assert tu.tree_structure({"a": 1}) == tu.tree_structure({"a": (2, 3)}, is_leaf=lambda x: isinstance(x, tuple))


def test_dicts():
    d = {"b": 1, "a": 2}
    assert tu.tree_leaves(d) == [2, 1]
    assert list(tu.tree_map(lambda x: x, d)) == ["a", "b"]  # rebuilt in sorted order, as JAX does
    mixed = {1: "one", "a": "letter"}  # unsortable keys keep insertion order
    assert tu.tree_leaves(mixed) == ["one", "letter"] and tu.tree_map(str.upper, mixed) == {1: "ONE", "a": "LETTER"}
    od = collections.OrderedDict([("b", 1), ("a", 2)])
    assert tu.tree_leaves(od) == [1, 2]
    out = tu.tree_map(lambda x: x * 10, od)
    assert type(out) is collections.OrderedDict and list(out.items()) == [("b", 10), ("a", 20)]
    dd = collections.defaultdict(list, {"y": 1, "x": 2})
    out = tu.tree_map(lambda x: -x, dd)
    assert type(out) is collections.defaultdict and out.default_factory is list and out == {"x": -2, "y": -1}
    assert tu.tree_structure(dd) != tu.tree_structure(collections.defaultdict(int, dd))
    assert tu.tree_structure(od) != tu.tree_structure(dict(od))


def test_non_node_subclasses_are_leaves():
    class MyList(list):
        pass

    class MyTuple(tuple):
        pass

    assert tu.tree_leaves([MyList([1, 2]), MyTuple((3,))]) == [MyList([1, 2]), MyTuple((3,))]


def test_is_leaf():
    t = {"a": (1, 2), "b": [3, None]}
    assert tu.tree_leaves(t, is_leaf=lambda x: isinstance(x, tuple)) == [(1, 2), 3]
    assert tu.tree_leaves(t, is_leaf=lambda x: x is None) == [1, 2, 3, None]
    assert tu.tree_map(len, t, is_leaf=lambda x: isinstance(x, (tuple, list))) == {"a": 2, "b": 2}
    pairs = tu.tree_leaves_with_path(t, is_leaf=lambda x: isinstance(x, tuple))
    assert pairs == [((DictKey("a"),), (1, 2)), ((DictKey("b"), SequenceKey(0)), 3)]


def test_tree_map_multiple_trees_and_prefix():
    assert tu.tree_map(lambda x, y, z: x + y + z, (1, [2]), (10, [20]), (100, [200])) == (111, [222])
    # rest trees may be deeper than the first: the first tree is a prefix of them
    assert tu.tree_map(lambda x, y: (x, y), (1, 2), ([3, 4], {"k": 5})) == ((1, [3, 4]), (2, {"k": 5}))
    assert tu.tree_map(lambda x, y: y, (None, 1), (None, 2)) == (None, 2)


@pytest.mark.parametrize("other,msg", [
    ((1, 2, 3), "2 children, got 3"),
    ([1, 2], "expected node type tuple, got list"),
    ((1, {"b": 2}), r"at \[1\]"),
    ((1, 2), r"at \[1\]"),
])
def test_tree_map_mismatch(other, msg):
    with pytest.raises(ValueError, match=msg) as e:
        tu.tree_map(lambda x, y: x, (1, {"a": 2}), other)
    assert "argument 1" in str(e.value)


def test_none_is_a_node_in_the_first_tree():
    # a None where the first tree has a leaf is just a leaf value, but a None node must be matched by None
    assert tu.tree_map(lambda x, y: y, (1, 2), (None, 3)) == (None, 3)
    with pytest.raises(ValueError, match=r"at \[0\]"):
        tu.tree_map(lambda x, y: y, (None, 2), (1, 3))


def test_keys_and_keystr():
    t = {"a": [1, Point(2, 3)], "b": (4,)}
    pairs, _ = tu.tree_flatten_with_path(t)
    paths = [p for p, _ in pairs]
    assert paths[1] == (DictKey("a"), SequenceKey(1), GetAttrKey("x"))
    assert [tu.keystr(p) for p in paths] == ["['a'][0]", "['a'][1].x", "['a'][1].y", "['b'][0]"]
    assert tu.keystr(paths[1], simple=True, separator="/") == "a/1/x"
    assert len({SequenceKey(0), SequenceKey(0), DictKey(0)}) == 2
    out = tu.tree_map_with_path(lambda p, x, y: (tu.keystr(p), x + y), t, tu.tree_map(lambda x: 10 * x, t))
    assert out["a"][1].y == ("['a'][1].y", 33)


def test_reduce_all_transpose():
    t = {"a": [1, 2], "b": (3, None)}
    assert tu.tree_reduce(operator.add, t) == 6
    assert tu.tree_reduce(operator.add, t, 100) == 106
    assert tu.tree_reduce(operator.add, None, initializer=0) == 0
    with pytest.raises(TypeError):
        tu.tree_reduce(operator.add, [])
    assert tu.tree_all([True, (1, None)]) and not tu.tree_all({"a": [1, 0]}) and tu.tree_all(None)
    outer, inner = tu.tree_structure([0, 0, 0]), tu.tree_structure({"x": 0, "y": 0})
    t = [{"x": i, "y": -i} for i in range(3)]
    assert tu.tree_transpose(outer, inner, t) == {"x": [0, 1, 2], "y": [0, -1, -2]}
    assert tu.tree_transpose(outer, None, t) == {"x": [0, 1, 2], "y": [0, -1, -2]}
    with pytest.raises(TypeError):
        tu.tree_transpose(outer, inner, t[:2])
    assert outer.compose(inner) == tu.tree_structure(t)


def test_unflatten_wrong_leaf_count():
    treedef = tu.tree_structure((1, [2]))
    with pytest.raises(ValueError):
        treedef.unflatten([1])
    with pytest.raises(ValueError):
        tu.tree_unflatten(treedef, [1, 2, 3])


@tu.register_pytree_node_class
class Box:
    def __init__(self, value, label):
        self.value, self.label = value, label

    def __eq__(self, other):
        return type(other) is Box and (self.value, self.label) == (other.value, other.label)

    def tree_flatten(self):
        return (self.value,), self.label

    @classmethod
    def tree_unflatten(cls, label, children):
        return cls(*children, label)


class Pair:
    def __init__(self, a, b):
        self.a, self.b = a, b


tu.register_pytree_node(Pair, lambda p: ((p.a, p.b), None), lambda _, c: Pair(*c))


def test_registered_classes():
    t = [Box((1, 2), "L"), Pair(3, {"k": 4})]
    flat, treedef = tu.tree_flatten(t)
    assert flat == [1, 2, 3, 4]
    out = treedef.unflatten([10, 20, 30, 40])
    assert out[0] == Box((10, 20), "L") and (out[1].a, out[1].b) == (30, {"k": 40})
    assert tu.tree_structure(Box(1, "L")) != tu.tree_structure(Box(1, "M"))  # aux data is part of the treedef
    assert hash(tu.tree_structure(Box(1, "L"))) == hash(tu.tree_structure(Box(2, "L")))
    assert "CustomNode(Box['L']" in repr(tu.tree_structure(Box(1, "L")))
    paths = [p for p, _ in tu.tree_leaves_with_path(Pair(1, 2))]
    assert paths == [(FlattenedIndexKey(0),), (FlattenedIndexKey(1),)]
    with pytest.raises(ValueError, match="custom|node data|mismatch"):
        tu.tree_map(lambda x, y: x, Box(1, "L"), Box(1, "M"))


def test_duplicate_registration():
    with pytest.raises(ValueError):
        tu.register_pytree_node(Pair, lambda p: ((), None), lambda _, c: Pair(0, 0))
    with pytest.raises(ValueError):
        tu.register_pytree_node(tuple, lambda p: ((), None), lambda _, c: ())


@tu.register_dataclass
@dataclasses.dataclass
class Params:
    w: object
    b: object
    name: str = dataclasses.field(default="p", metadata={"static": True})


@functools.partial(tu.register_dataclass, data_fields=["x"], meta_fields=["n"])
@dataclasses.dataclass(frozen=True)
class Explicit:
    x: object
    n: int


def test_dataclasses():
    p = Params(w=[1, 2], b=3, name="dense")
    flat, treedef = tu.tree_flatten(p)
    assert flat == [1, 2, 3]
    assert treedef.unflatten([4, 5, 6]) == Params([4, 5], 6, "dense")
    assert tu.tree_structure(p) != tu.tree_structure(Params([1, 2], 3, "other"))
    assert tu.tree_structure(p) == tu.tree_structure(Params([0, 0], 0, "dense"))
    assert {tu.tree_structure(p): 1}[tu.tree_structure(Params([0, 0], 0, "dense"))] == 1
    assert [tu.keystr(k) for k, _ in tu.tree_leaves_with_path(p)] == [".w[0]", ".w[1]", ".b"]
    assert tu.tree_map(lambda x: x * 2, Explicit(x=(1, 2), n=3)) == Explicit(x=(2, 4), n=3)
    assert tu.tree_structure(Explicit(1, 2)) != tu.tree_structure(Explicit(1, 3))
    with pytest.raises(ValueError, match="node data"):
        tu.tree_map(lambda a, b: a, p, Params([1, 2], 3, "other"))

    @dataclasses.dataclass
    class Bad:
        a: int
        b: int

    with pytest.raises(ValueError):
        tu.register_dataclass(Bad, data_fields=["a"], meta_fields=[])
