"""The package version (a leaf: the run directory records it without loading the rest of the engine)."""

__version__ = "0.1.0"
