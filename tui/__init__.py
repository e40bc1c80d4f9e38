"""The live monitor (``webgym-engine monitor``): a Textual app fed by the engine's telemetry socket."""
