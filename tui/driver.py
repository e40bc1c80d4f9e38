"""The monitor's terminal driver: Textual's, made safe against a terminal that goes away.

When the terminal is gone (a closed window, a killed tmux session) every write to it fails with EIO. Textual's
writer thread dies on the first one, and from then on the app blocks in ``queue.put`` as soon as its 30 queued
writes are full: in the middle of a frame, or in the shutdown that restores the terminal's modes, so the process
never exits. :class:`HangupSafeDriver` writes through :class:`engine.streams.DroppingStream`, so the writer drains,
the app's shutdown completes and the run's own stop (on SIGHUP, :mod:`engine.core.shutdown`) can end the process.
"""

from __future__ import annotations

import sys
from typing import Any, TextIO, cast

from textual.drivers.linux_driver import LinuxDriver

from engine.streams import DroppingStream

__all__ = ["HangupSafeDriver"]


class HangupSafeDriver(LinuxDriver):
    """Textual's Linux driver with its output through a :class:`~engine.streams.DroppingStream` (module docstring)."""

    def __init__(self, app: Any, *, debug: bool = False, mouse: bool = True,
                 size: tuple[int, int] | None = None) -> None:
        super().__init__(app, debug=debug, mouse=mouse, size=size)
        stream = sys.__stderr__  # what LinuxDriver writes the screen to
        assert stream is not None
        self._file = cast(TextIO, DroppingStream(stream))
