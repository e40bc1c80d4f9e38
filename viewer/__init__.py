"""A static HTML report of a run directory (``webgym-engine view RUN_DIR``)."""
