"""Looking inside: printing graphs (printing.py) and drawing how arrays are laid out over devices."""
from fnx.debug.sharding_view import visualize_array_sharding, visualize_sharding

__all__ = ["visualize_array_sharding", "visualize_sharding"]
