"""Sharding: meshes of devices, how arrays are laid out over them, and running computations over them.

    from fnx.sharding import Mesh, NamedSharding, PartitionSpec as P
    mesh = fnx.make_mesh((2, 4), ("data", "model"))
    x = fnx.device_put(x, NamedSharding(mesh, P("data", None)))

mesh.py (Mesh), sharding.py (PartitionSpec, NamedSharding, the ShardedBuffer an array holds), partition.py (a
global program -> the per-device program with its collectives), collectives.py (the collectives as compositions
of COPY, RESHAPE and REDUCE), spmd.py (running the per-device program on every device; jit over a mesh).
"""
from fnx.backends.device import SingleDeviceSharding
from fnx.sharding.mesh import Mesh, current_mesh, make_mesh, use_mesh
from fnx.sharding.sharding import NamedSharding, P, PartitionSpec

__all__ = ["Mesh", "NamedSharding", "P", "PartitionSpec", "SingleDeviceSharding", "current_mesh", "make_mesh",
           "use_mesh"]
