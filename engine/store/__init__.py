"""The run directory: episode and step records, screenshot files, one writer per directory, run statistics."""
