"""Console output of the long-running commands (``run``, ``serve``, ``workers``): progress and status lines that
cannot be written are dropped.

Their results are in the run directory, not on the console. Before, a progress line that could not be written
(stderr redirected to a file on a full disk, a terminal that went away) raised into the run, which then stopped
with no record of its episodes in flight. A short command's output is its result: those still fail on a write
error, as any Unix tool does.
"""

from __future__ import annotations

import contextlib
import sys
from typing import Any, TextIO


class DroppingStream:
    """A text stream that drops what cannot be written (OSError) instead of raising; all else is the stream's."""

    def __init__(self, stream: TextIO) -> None:
        self._stream = stream

    def write(self, text: str) -> int:
        try:
            return self._stream.write(text)
        except OSError:
            return len(text)

    def flush(self) -> None:
        with contextlib.suppress(OSError):
            self._stream.flush()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)


def keep_going_without_a_console() -> None:
    """Make this process's stdout and stderr drop the output they cannot write (call once, at a long-running
    command's start)."""
    for name in ("stdout", "stderr"):
        stream = getattr(sys, name)
        if stream is not None and not isinstance(stream, DroppingStream):
            setattr(sys, name, DroppingStream(stream))
