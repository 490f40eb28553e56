"""fnx.scipy: the parts of jax.scipy fnx has (linalg)."""
from fnx.scipy import linalg

__all__ = ["linalg"]
