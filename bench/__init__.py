"""Benchmarks: they print figures and ratios (speed targets live here, not in tests)."""
