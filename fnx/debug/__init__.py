"""Looking inside: printing graphs (printing.py), host callbacks that print or inspect values while a function runs
(callbacks.py: fnx.debug.print, fnx.debug.callback) and drawing how arrays are laid out over devices."""
from fnx.debug.callbacks import callback, print  # noqa: A004
from fnx.debug.sharding_view import visualize_array_sharding, visualize_sharding

__all__ = ["callback", "print", "visualize_array_sharding", "visualize_sharding"]
