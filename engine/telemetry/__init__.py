"""Live telemetry for monitors: the publisher and its wire format."""
