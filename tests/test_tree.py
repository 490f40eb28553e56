"""fnx.tree (the `jax.tree` module) and the tree_util names added with it, against jax.tree / jax.tree_util on
nested dicts, lists, tuples, None, namedtuples, registered classes and dataclasses."""
import collections
import dataclasses
import operator

import pytest

import fnx
import fnx.tree_util as tu

jax = pytest.importorskip("jax")

Point = collections.namedtuple("Point", "x y")


class Box:
    """A class registered with both libraries: children (a, b), aux `tag`."""

    def __init__(self, a, b, tag="t"):
        self.a, self.b, self.tag = a, b, tag

    def __eq__(self, other):
        return type(other) is Box and (self.a, self.b, self.tag) == (other.a, other.b, other.tag)

    def __repr__(self):
        return f"Box({self.a!r}, {self.b!r}, {self.tag!r})"


for registry in (tu, jax.tree_util):
    registry.register_pytree_node(Box, lambda x: ((x.a, x.b), x.tag), lambda tag, c: Box(*c, tag))


@dataclasses.dataclass
class Op:
    x: object
    y: object
    kind: str = fnx.tree.static(default="add")


@dataclasses.dataclass
class JaxOp:
    x: object
    y: object
    kind: str = jax.tree.static(default="add")


tu.register_dataclass(Op)
jax.tree_util.register_dataclass(JaxOp)

TREES = [
    1,
    None,
    [],
    {"b": [1, (2, None)], "a": {"z": 3, "y": ()}},
    (Point(1, [2, 3]), None, {"k": Point(x=None, y=4)}),
    [Box(1, {"q": 2}), Box((3, 4), None, "u")],
    collections.OrderedDict([("z", 1), ("a", [2, 3])]),
]


def keys_as_strings(pairs):
    return [(tu.keystr(path), leaf) for path, leaf in pairs]


def jax_keys_as_strings(pairs):
    return [(jax.tree_util.keystr(path), leaf) for path, leaf in pairs]


@pytest.mark.parametrize("tree", TREES, ids=range(len(TREES)))
def test_functions_match_jax(tree):
    assert fnx.tree.leaves(tree) == jax.tree.leaves(tree)
    ours, theirs = fnx.tree.structure(tree), jax.tree.structure(tree)  # (the reprs differ: fnx keeps the older one)
    assert (ours.num_leaves, ours.num_nodes) == (theirs.num_leaves, theirs.num_nodes)
    leaves, treedef = fnx.tree.flatten(tree)
    assert fnx.tree.unflatten(treedef, [x * 10 for x in leaves]) == jax.tree.map(lambda x: x * 10, tree)
    assert fnx.tree.map(lambda x, y: (x, y), tree, tree) == jax.tree.map(lambda x, y: (x, y), tree, tree)
    assert keys_as_strings(fnx.tree.leaves_with_path(tree)) == jax_keys_as_strings(jax.tree.leaves_with_path(tree))
    assert keys_as_strings(fnx.tree.flatten_with_path(tree)[0]) == \
        jax_keys_as_strings(jax.tree.flatten_with_path(tree)[0])
    assert fnx.tree.map_with_path(lambda p, x: (tu.keystr(p), x), tree) == \
        jax.tree.map_with_path(lambda p, x: (jax.tree_util.keystr(p), x), tree)
    assert fnx.tree.reduce(operator.add, tree, 100) == jax.tree.reduce(operator.add, tree, 100)
    assert fnx.tree.reduce_associative(operator.add, tree, identity=0) == \
        jax.tree.reduce_associative(operator.add, tree, identity=0)
    assert fnx.tree.all(tree) == jax.tree.all(tree)
    assert fnx.tree.all(fnx.tree.map(lambda x: x - 1, tree)) == jax.tree.all(jax.tree.map(lambda x: x - 1, tree))
    assert tu.all_leaves(fnx.tree.leaves(tree)) and tu.all_leaves([tree]) == jax.tree_util.all_leaves([tree])


def test_is_leaf_and_is_leaf_takes_path_match_jax():
    tree = {"a": [1, 2], "b": (3, {"c": 4})}
    def pick(x): return isinstance(x, list)
    def pick_path(p, x): return len(p) == 1
    assert fnx.tree.leaves(tree, is_leaf=pick) == jax.tree.leaves(tree, is_leaf=pick)
    assert fnx.tree.map(lambda x: str(x), tree, is_leaf=pick) == jax.tree.map(lambda x: str(x), tree, is_leaf=pick)
    ours = fnx.tree.leaves_with_path(tree, is_leaf=pick_path, is_leaf_takes_path=True)
    theirs = jax.tree.leaves_with_path(tree, is_leaf=pick_path, is_leaf_takes_path=True)
    assert keys_as_strings(ours) == jax_keys_as_strings(theirs)
    assert fnx.tree.map_with_path(lambda p, x: len(p), tree, is_leaf=pick_path, is_leaf_takes_path=True) == \
        jax.tree.map_with_path(lambda p, x: len(p), tree, is_leaf=pick_path, is_leaf_takes_path=True)


def test_map_with_several_trees_uses_the_first_as_prefix():
    first, second = {"a": 1, "b": (2, 3)}, {"a": [10, 20], "b": (30, 40)}
    assert fnx.tree.map(lambda x, y: (x, y), first, second) == jax.tree.map(lambda x, y: (x, y), first, second)
    with pytest.raises(ValueError):
        fnx.tree.map(lambda x, y: x, first, {"a": 1})


def test_reduce_without_initializer_and_empty_trees():
    assert fnx.tree.reduce(operator.mul, [2, (3, 4)]) == jax.tree.reduce(operator.mul, [2, (3, 4)]) == 24
    assert fnx.tree.reduce(operator.add, [], None) is None
    with pytest.raises(TypeError):
        fnx.tree.reduce(operator.add, [])
    with pytest.raises(TypeError, match="identity"):
        fnx.tree.reduce_associative(operator.add, [None])
    ordered = [(c,) for c in "abcdefg"]  # associative, not commutative: the order must be kept
    assert fnx.tree.reduce_associative(operator.add, ordered, is_leaf=lambda x: isinstance(x, tuple)) == \
        tuple("abcdefg")


def test_transpose_and_broadcast_match_jax():
    tree = [(1, 2), (3, 4), (5, 6)]
    outer, inner = fnx.tree.structure([0, 0, 0]), fnx.tree.structure((0, 0))
    expected = jax.tree.transpose(jax.tree.structure([0, 0, 0]), jax.tree.structure((0, 0)), tree)
    assert fnx.tree.transpose(outer, inner, tree) == expected == ([1, 3, 5], [2, 4, 6])
    assert fnx.tree.transpose(outer, None, tree) == expected
    for prefix, full in [((1, 2, 3), (0, {"a": 0, "b": 0}, (0, 0))), ((1, 2), (0, None)), (7, {"a": [0, 0]})]:
        assert fnx.tree.broadcast(prefix, full) == jax.tree.broadcast(prefix, full)
    with pytest.raises(ValueError):
        fnx.tree.broadcast((1, 2), (0, 0, 0))


def test_static_dataclass_fields_stay_in_the_treedef():
    ours, theirs = Op(1, [2, 3], "mul"), JaxOp(1, [2, 3], "mul")
    assert fnx.tree.leaves(ours) == jax.tree.leaves(theirs) == [1, 2, 3]
    assert fnx.tree.structure(ours) != fnx.tree.structure(Op(1, [2, 3]))
    assert fnx.tree.map(lambda x: x + 1, ours) == Op(2, [3, 4], "mul")


def test_register_static_makes_a_childless_node_jit_treats_as_static():
    @tu.register_static
    class Mode(str):
        pass

    assert fnx.tree.leaves([1, Mode("add")]) == [1]
    assert fnx.tree.structure(Mode("a")) != fnx.tree.structure(Mode("b"))
    traces = []

    @fnx.jit
    def f(x, mode):
        traces.append(mode)
        return x + 1 if mode == "add" else x - 1
    assert float(f(1.0, Mode("add"))) == 2.0 and float(f(1.0, Mode("sub"))) == 0.0
    assert float(f(5.0, Mode("add"))) == 6.0 and traces == ["add", "sub"]


def test_register_pytree_with_keys_class():
    @tu.register_pytree_with_keys_class
    class Pair:
        def __init__(self, left, right): self.left, self.right = left, right
        def tree_flatten_with_keys(self): return ((tu.GetAttrKey("left"), self.left),
                                                  (tu.GetAttrKey("right"), self.right)), None
        @classmethod
        def tree_unflatten(cls, aux, children): return cls(*children)

    pairs = fnx.tree.leaves_with_path(Pair(1, [2]))
    assert keys_as_strings(pairs) == [(".left", 1), (".right[0]", 2)]
    doubled = fnx.tree.map(lambda x: 2 * x, Pair(1, [2]))
    assert (doubled.left, doubled.right) == (2, [4])


def test_partial_is_a_pytree_through_jit():
    add = tu.Partial(operator.add, 1)
    assert fnx.tree.leaves(add) == jax.tree.leaves(jax.tree_util.Partial(operator.add, 1)) == [1]
    assert fnx.tree.map(lambda x: x * 10, add)(1) == 11
    f = fnx.jit(lambda p, x: p(x))
    assert float(f(tu.Partial(operator.mul, fnx.numpy.float32(3.0)), 2.0)) == 6.0


def test_one_level_and_treedef_helpers_match_jax():
    tree = {"a": [1, 2], "b": {"c": 3}}
    assert tu.flatten_one_level(tree) == jax.tree_util.flatten_one_level(tree)
    ours, theirs = tu.flatten_one_level_with_keys(tree), jax.tree_util.flatten_one_level_with_keys(tree)
    assert [(str(k), c) for k, c in ours[0]] == [(str(k), c) for k, c in theirs[0]] and ours[1] == theirs[1]
    with pytest.raises(ValueError):
        tu.flatten_one_level(1)
    for typ in (list, dict, int, type(None), Point, Box, str):
        assert tu.is_tree_node(typ) == jax.tree_util.is_tree_node(typ), typ
    treedef = fnx.tree.structure({"a": (1, 2), "b": [3]})
    assert tu.treedef_children(treedef) == [fnx.tree.structure((1, 2)), fnx.tree.structure([3])]
    assert [c.num_leaves for c in jax.tree_util.treedef_children(jax.tree.structure({"a": (1, 2), "b": [3]}))] == \
        [c.num_leaves for c in tu.treedef_children(treedef)]
    joined = tu.treedef_tuple([fnx.tree.structure([1, 2]), fnx.tree.structure({"a": 1})])
    assert joined == fnx.tree.structure(([0, 0], {"a": 0}))
    assert fnx.tree.unflatten(joined, [1, 2, 3]) == ([1, 2], {"a": 3})


def test_fnx_tree_is_the_module_and_has_jax_names():
    import fnx.tree as tree_module
    assert fnx.tree is tree_module
    names = {n for n in dir(jax.tree) if not n.startswith("_")}
    assert names <= set(dir(fnx.tree)), names - set(dir(fnx.tree))
    public = {n for n in dir(jax.tree_util) if not n.startswith("_")} - {"default_registry"}
    assert public <= set(dir(tu)), public - set(dir(tu))
