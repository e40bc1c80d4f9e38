"""The engine core and what it is built from: its configuration, the plan feeder, the straggler cut and the
process settings."""
