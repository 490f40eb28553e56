"""fnx.dlpack: jax.dlpack's from_dlpack (any host DLPack producer into a new Array; fnx.numpy.from_dlpack's
function). Arrays export through their own `__dlpack__` (host memory; docs/RUNTIME.md)."""
from fnx.numpy import from_dlpack

__all__ = ["from_dlpack"]
