"""Thin clients of the engine core: ``run``'s runner, the library service and the step-level environments."""
