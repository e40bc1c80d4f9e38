"""Console output of the long-running commands (``run``, ``serve``, ``workers``): progress and status lines that
cannot be written are dropped.

Their results are in the run directory, not on the console. Before, a progress line that could not be written
(stderr redirected to a file on a full disk, a terminal that went away) raised into the run, which then stopped
with no record of its episodes in flight. A short command's output is its result: those still fail on a write
error, as any Unix tool does.
"""

from __future__ import annotations

import sys

from engine.streams import DroppingStream


def keep_going_without_a_console() -> None:
    """Make this process's stdout and stderr drop the output they cannot write (call once, at a long-running
    command's start)."""
    for name in ("stdout", "stderr"):
        stream = getattr(sys, name)
        if stream is not None and not isinstance(stream, DroppingStream):
            setattr(sys, name, DroppingStream(stream))
