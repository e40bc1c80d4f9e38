"""Tasks: the WebGym task schema, loading task files, MiniWoB++ as a task source."""
