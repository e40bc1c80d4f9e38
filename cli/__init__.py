"""The command line: the composition root that builds the engine core, policies and tools (nothing imports it)."""
