"""fnx.scipy: the parts of jax.scipy fnx has (linalg)."""
from fnx.scipy import linalg

__all__ = ["linalg"]


def __getattr__(name: str):
    from fnx.jax_names import missing
    raise missing("fnx.scipy", name)
