"""Lines to a worker process's stderr, which is the run's ``workers.log`` for spawned workers."""

from __future__ import annotations

import contextlib
import sys


def log_line(text: str) -> None:
    """Write one line to stderr. A line that cannot be written is dropped: logging must never fail the operation
    that logs, such as discarding a context or exiting. (OSError: a full disk; ValueError: stderr closed;
    RuntimeError: a signal handler's line while another line is being written.)"""
    with contextlib.suppress(OSError, ValueError, RuntimeError):
        print(text, file=sys.stderr, flush=True)
