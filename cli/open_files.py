"""The open-file limit of a command that runs the engine."""

from __future__ import annotations

import resource


def raise_open_file_limit() -> None:
    """Raise this process's limit of open files to its hard limit.

    Many systems' soft limit is 1,024. The engine's own descriptors (the workers' sockets, shared memory, the
    store, the model server's connections) stay well under it, but every connection to a tcp socket it listens
    on (``--listen``, ``--telemetry``, ``serve``'s HTTP port) takes one too, before any authentication: at the
    soft limit, a peer holding a thousand silent connections would leave the store unable to open a screenshot
    file, and the run would stop."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = hard if hard != resource.RLIM_INFINITY else max(soft, 1 << 16)
    if soft < target:
        resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
