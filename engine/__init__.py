"""webgym-engine: an asynchronous rollout engine for visual web agents."""

__version__ = "0.1.0"
