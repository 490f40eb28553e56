"""fnx: composable function transformations (jit, grad, vmap) with its own kernel compiler."""
from importlib import metadata as _metadata

from fnx import dtypes, errors, lax, tree, tree_util
from fnx.checkpoint_io import load, save
from fnx.devices import default_device, device_count, device_put, devices, local_device_count, local_devices
from fnx.trace import Array
from fnx.transforms.custom import checkpoint, closure_convert, custom_jvp, custom_vjp, remat
from fnx.transforms.grad import grad, jacrev, value_and_grad, vjp
from fnx.transforms.jvp import hessian, jacfwd, jvp, linearize
from fnx.transforms.vmap import vmap
from fnx.transforms.jit import ShapeDtypeStruct, disable_jit, jit, make_graph
from fnx.transforms.shard_map import shard_map
from fnx import sharding  # noqa: E402
from fnx.sharding import NamedSharding, P, make_mesh
from fnx.sharding import distributed  # noqa: E402  (fnx.distributed: many processes over MPI; imports no MPI)
from fnx.sharding.distributed import (make_array_from_callback, make_array_from_single_device_arrays,
                                      process_count, process_index)
from fnx.backends.device import Device

from fnx import numpy  # noqa: E402  (installs indexing, // % ** @, abs and the reduction methods on Array)
from fnx import lax_ops, lax_conv, lax_sort, lax_gather  # noqa: E402,F401  (join fnx.lax: see lax._extend)
from fnx import lax_implicit  # noqa: E402,F401  (lax.custom_root: above the transforms it uses)
from fnx import numpy_arrays, numpy_math, numpy_sorting, numpy_linalg, numpy_complex, numpy_fft  # noqa: E402,F401,E501
from fnx import dlpack, scipy, test_util  # noqa: E402
from fnx import nn, optim, random  # noqa: E402
from fnx import debug  # noqa: E402
from fnx.transforms.pmap import pmap  # noqa: E402  (a jitted shard_map: above numpy, api and sharding)
from fnx import config, profiler  # noqa: E402  (fnx.config.update as jax.config.update; fnx.profiler.trace)
from fnx.dtypes import enable_x64, float0  # noqa: E402  (`with fnx.enable_x64(True):` as jax.enable_x64)
from fnx.api import (ShapedArray, checkpoint_policies, clear_caches, custom_gradient, debug_infs,  # noqa: E402
                     debug_nans, default_backend, default_matmul_precision, device_get, eval_shape, host_ids,
                     jacobian, linear_transpose, log_compiles, make_jaxpr, named_call, named_scope,
                     print_environment_info, pure_callback, typeof)
from fnx.backends import cpu_llvm as _cpu_llvm  # noqa: E402,F401  (registers cpu; loads LLVM now, as `import jax` loads XLA)
from fnx.backends import interp as _interp  # noqa: E402,F401  (registers the interp runtime)
from fnx.backends import opencl as _opencl  # noqa: E402,F401  (registers opencl: devices only with pyopencl and a driver)
from fnx.backends import cuda as _cuda  # noqa: E402,F401  (registers cuda: GPUs, or one compile-only device with NVRTC)

try:
    __version__ = _metadata.version("fnx")
except _metadata.PackageNotFoundError:  # (run from a source tree that was not installed)
    __version__ = "0.0.0+unknown"

__all__ = ["__version__", "block_until_ready", "checkpoint", "checkpoint_policies", "clear_caches", "closure_convert",
           "config",
           "custom_gradient", "custom_jvp", "custom_vjp", "debug", "debug_infs", "debug_nans", "default_backend",
           "default_device", "default_matmul_precision", "device_count", "device_get", "device_put", "devices",
           "disable_jit", "distributed", "dlpack", "dtypes", "enable_x64", "errors", "eval_shape", "float0", "grad",
           "hessian", "host_count", "host_id", "host_ids", "jacfwd", "jacobian", "jacrev", "jit", "jvp", "lax",
           "linear_transpose", "linearize", "log_compiles",
           "load", "local_device_count", "local_devices", "make_array_from_callback",
           "make_array_from_single_device_arrays", "make_graph", "make_jaxpr",
           "make_mesh", "named_call", "named_scope", "nn", "numpy", "optim", "print_environment_info", "process_count",
           "pmap", "process_index", "process_indices", "profiler", "pure_callback", "random", "remat", "save", "scipy",
           "shard_map", "sharding", "test_util", "tree", "tree_util", "typeof", "value_and_grad", "vjp", "vmap",
           "Array", "Device", "NamedSharding", "P", "ShapeDtypeStruct", "ShapedArray"]


def host_id() -> int:
    """This process's index among the processes of the job (jax.host_id; process_index's older name)."""
    return process_index()


def host_count() -> int:
    """How many processes the job has (jax.host_count; process_count's older name)."""
    return process_count()


def process_indices() -> list[int]:
    """The indices of every process of the job."""
    return list(range(process_count()))


def block_until_ready(x):
    """Wait until every array in the pytree `x` is computed (large calls run asynchronously); returns `x`."""
    for leaf in tree_util.tree_leaves(x):
        if isinstance(leaf, Array): leaf.block_until_ready()
    return x


def __getattr__(name: str):
    from fnx.jax_names import missing
    raise missing("fnx", name)
