"""fnx: composable function transformations (jit, grad, vmap) with its own kernel compiler."""
from fnx import dtypes, errors, tree_util, lax
from fnx.trace import Array
