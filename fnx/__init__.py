"""fnx: composable function transformations (jit, grad, vmap) with its own kernel compiler."""
from fnx import dtypes, errors, lax, tree_util
from fnx import tree_util as tree
from fnx.checkpoint_io import load, save
from fnx.devices import default_device, device_count, device_put, devices, local_device_count, local_devices
from fnx.trace import Array
from fnx.transforms.custom import checkpoint, custom_jvp, custom_vjp, remat
from fnx.transforms.grad import grad, jacrev, value_and_grad, vjp
from fnx.transforms.jvp import hessian, jacfwd, jvp, linearize
from fnx.transforms.vmap import vmap
from fnx.transforms.jit import jit, make_graph
from fnx.transforms.shard_map import shard_map
from fnx import sharding  # noqa: E402
from fnx.sharding import make_mesh
from fnx.sharding import distributed  # noqa: E402  (fnx.distributed: many processes over MPI; imports no MPI)
from fnx.sharding.distributed import make_array_from_callback, process_count, process_index

from fnx import numpy  # noqa: E402  (installs indexing, // % ** @, abs and the reduction methods on Array)
from fnx import nn, optim, random  # noqa: E402
from fnx.backends import cpu_llvm as _cpu_llvm  # noqa: E402,F401  (registers cpu; loads LLVM now, as `import jax` loads XLA)
from fnx.backends import interp as _interp  # noqa: E402,F401  (registers the interp runtime)
from fnx.backends import opencl as _opencl  # noqa: E402,F401  (registers opencl: devices only with pyopencl and a driver)
from fnx.backends import cuda as _cuda  # noqa: E402,F401  (registers cuda: GPUs, or one compile-only device with NVRTC)

__all__ = ["Array", "block_until_ready", "checkpoint", "custom_jvp", "custom_vjp", "default_device", "device_count",
           "device_put", "devices", "distributed", "dtypes", "errors", "grad", "hessian", "jacfwd", "jacrev", "jit",
           "jvp", "lax", "linearize", "load", "local_device_count", "local_devices", "make_array_from_callback",
           "make_graph", "nn", "numpy", "optim", "process_count", "process_index", "random", "remat", "save",
           "shard_map", "sharding", "make_mesh", "tree", "tree_util", "value_and_grad", "vjp", "vmap"]


def block_until_ready(x):
    """Wait until every array in the pytree `x` is computed (large calls run asynchronously); returns `x`."""
    for leaf in tree_util.tree_leaves(x):
        if isinstance(leaf, Array): leaf.block_until_ready()
    return x
