"""A text stream that drops what cannot be written, for output whose loss must not stop the process.

A progress line that cannot be written (stderr on a full disk) or a frame for a terminal that went away (every write
fails with EIO) would otherwise raise into whatever wrote it: the run, or the monitor's writer thread. Used by the
CLI's long-running commands (:mod:`cli.console_streams`) and the monitor's terminal driver (:mod:`tui.driver`).
"""

from __future__ import annotations

import contextlib
from typing import IO, Any

__all__ = ["DroppingStream"]


class DroppingStream:
    """A text stream that drops what cannot be written (OSError) instead of raising; all else is the stream's."""

    def __init__(self, stream: IO[str]) -> None:
        self._stream = stream

    def write(self, text: str) -> int:
        try:
            return self._stream.write(text)
        except OSError:
            return len(text)

    def flush(self) -> None:
        with contextlib.suppress(OSError):
            self._stream.flush()

    def __getattr__(self, name: str) -> Any:  # fileno, isatty, encoding...: the stream's own
        return getattr(self._stream, name)
