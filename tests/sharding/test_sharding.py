"""Meshes, PartitionSpecs and NamedShardings; device_put onto a mesh; what a sharded Array answers (its shards, its
value put together, its sharding) — each checked against the numpy array it was made from."""
import numpy as np
import pytest

import fnx
import fnx.numpy as jnp
from fnx.sharding import Mesh, NamedSharding, P, PartitionSpec


def test_mesh_shape_names_and_groups(cpus):
    mesh = Mesh(np.array(cpus).reshape(2, 4), ("data", "model"))
    assert mesh.shape == {"data": 2, "model": 4} and mesh.size == 8 and mesh.axis_names == ("data", "model")
    assert mesh.device_ids.tolist() == [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert [[d.id for d in g] for g in mesh.groups("model")] == [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert [[d.id for d in g] for g in mesh.groups("data")] == [[0, 4], [1, 5], [2, 6], [3, 7]]
    assert [[d.id for d in g] for g in mesh.groups(("data", "model"))] == [list(range(8))]
    assert mesh.coords(cpus[6]) == {"data": 1, "model": 2}
    assert mesh == fnx.make_mesh((2, 4), ("data", "model")) and hash(mesh) == hash(fnx.make_mesh((2, 4),
                                                                                                  ("data", "model")))
    assert repr(mesh) == "Mesh('data': 2, 'model': 4)"


def test_mesh_errors(cpus):
    with pytest.raises(ValueError, match="2 axis names"):
        Mesh(np.array(cpus), ("a", "b"))
    with pytest.raises(ValueError, match="appears twice"):
        Mesh(np.array([cpus[0], cpus[0]]), ("a",))
    with pytest.raises(ValueError, match=r"needs 16 devices, and 8 are available"):
        fnx.make_mesh((4, 4), ("a", "b"))


def test_partition_spec_is_jax_like():
    spec = P("data", None, ("x", "y"))
    assert isinstance(spec, tuple) and spec == ("data", None, ("x", "y")) and PartitionSpec is P
    assert repr(spec) == "PartitionSpec('data', None, ('x', 'y'))"
    with pytest.raises(TypeError, match="PartitionSpec entries"):
        P(3)


@pytest.mark.parametrize("spec", [P(), P("data"), P(None, "model"), P("model", "data"), P(("data", "model")),
                                  P(None, ("model", "data"))])
def test_device_put_lays_out_and_gathers_back(mesh24, spec):
    host = np.arange(8 * 16, dtype=np.float32).reshape(8, 16)
    x = fnx.device_put(host, NamedSharding(mesh24, spec))
    assert x.sharding == NamedSharding(mesh24, spec) and x.shape == (8, 16) and x.dtype == np.float32
    assert x.devices() == set(mesh24.flat_devices)
    np.testing.assert_array_equal(np.asarray(x), host)
    shards = x.addressable_shards
    assert len(shards) == 8
    for shard in shards:  # each device holds exactly its slice, numbered as JAX numbers replicas
        np.testing.assert_array_equal(np.asarray(shard.data), host[shard.index])
        assert shard.data.device is shard.device
    expected = NamedSharding(mesh24, spec).devices_indices_map((8, 16))
    assert {s.device: s.index for s in shards} == expected
    replicas = {}
    for s in shards: replicas.setdefault(tuple((i.start, i.stop) for i in s.index), []).append(s.replica_id)
    assert all(sorted(r) == list(range(len(r))) for r in replicas.values())
    assert x.is_fully_replicated == (spec in (P(),))


def test_shard_shape_and_index_map(mesh24):
    s = NamedSharding(mesh24, P("model", "data"))
    assert s.shard_shape((8, 6)) == (2, 3)
    assert s.devices_indices_map((8, 6))[mesh24.flat_devices[5]] == (slice(2, 4), slice(3, 6))
    assert not s.is_fully_replicated and NamedSharding(mesh24, P()).is_fully_replicated
    assert s.num_devices == 8 and s.is_fully_addressable


def test_device_put_errors_name_the_axis_spec_and_shape(mesh24):
    with pytest.raises(ValueError, match=r"axis 0 of shape \(6, 4\) \(size 6\) is split over mesh axes \('model',\)"
                                         r" of 4 devices by PartitionSpec PartitionSpec\('model'\)"):
        fnx.device_put(np.zeros((6, 4), np.float32), NamedSharding(mesh24, P("model")))
    with pytest.raises(ValueError, match="names mesh axis 'nope'"):
        NamedSharding(mesh24, P("nope"))
    with pytest.raises(ValueError, match="has 3 entries, for an array of rank 2"):
        fnx.device_put(np.zeros((4, 4), np.float32), NamedSharding(mesh24, P("data", None, None)))
    with pytest.raises(ValueError, match="uses a mesh axis twice"):
        fnx.device_put(np.zeros((4, 4), np.float32), NamedSharding(mesh24, P("data", "data")))
    with pytest.raises(ValueError, match="a bare PartitionSpec"):
        fnx.device_put(np.zeros((4, 4), np.float32), P("data"))


def test_bare_partition_spec_inside_a_mesh_block(mesh24):
    with mesh24:
        x = fnx.device_put(np.ones((4, 4), np.float32), P("data"))
    assert x.sharding == NamedSharding(mesh24, P("data"))


def test_sharded_array_is_spread_not_on_one_device(mesh24):
    x = fnx.device_put(np.ones((4, 4), np.float32), NamedSharding(mesh24, P("data")))
    with pytest.raises(ValueError, match="spread over 8 devices"):
        x.device
    assert x.block_until_ready() is x


def test_device_put_of_a_device_array_and_of_integers(mesh24):
    host = np.arange(16, dtype=np.int32).reshape(4, 4)
    x = fnx.device_put(jnp.asarray(host), NamedSharding(mesh24, P(None, "model")))
    assert x.dtype == np.int32
    np.testing.assert_array_equal(np.asarray(x), host)
    again = fnx.device_put(x, NamedSharding(mesh24, P(None, "model")))
    assert again is x  # already laid out so: the same array, as JAX returns it
    moved = fnx.device_put(x, NamedSharding(mesh24, P("data")))
    np.testing.assert_array_equal(np.asarray(moved), host)
    assert moved.sharding.spec == P("data")


def test_visualize_array_sharding_draws_the_grid(mesh24, capsys):
    x = fnx.device_put(np.zeros((8, 16), np.float32), NamedSharding(mesh24, P("data", "model")))
    fnx.debug.visualize_array_sharding(x)
    assert capsys.readouterr().out == (
        "┌───────┬───────┬───────┬───────┐\n"
        "│ CPU 0 │ CPU 1 │ CPU 2 │ CPU 3 │\n"
        "├───────┼───────┼───────┼───────┤\n"
        "│ CPU 4 │ CPU 5 │ CPU 6 │ CPU 7 │\n"
        "└───────┴───────┴───────┴───────┘\n")
    fnx.debug.visualize_array_sharding(fnx.device_put(np.zeros(16, np.float32), NamedSharding(mesh24, P("model"))))
    assert capsys.readouterr().out == (
        "┌─────────┬─────────┬─────────┬─────────┐\n"
        "│ CPU 0,4 │ CPU 1,5 │ CPU 2,6 │ CPU 3,7 │\n"
        "└─────────┴─────────┴─────────┴─────────┘\n")
    fnx.debug.visualize_array_sharding(jnp.ones((3, 3)))
    assert capsys.readouterr().out == "┌───────┐\n│ CPU 0 │\n└───────┘\n"
    with pytest.raises(ValueError, match="rank 0, 1 or 2"):
        fnx.debug.visualize_array_sharding(jnp.ones((2, 2, 2)))
