"""Where a long run's memory grows: ``tracemalloc`` from a starting point (the end of a soak's warm-up) to the end,
as the source lines whose live allocations grew most, per episode.

Tracing costs CPU on every allocation and memory of its own (a few dozen bytes per live block), which the process's
USS then includes: a soak run with it (``bench.soak --trace-growth``) attributes growth; its memory figures are not
comparable with a run without it.
"""

from __future__ import annotations

import tracemalloc
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]

# The tracer's own frames and the import machinery are not the program's growth.
_IGNORED = (tracemalloc.__file__, "<frozen importlib._bootstrap>", "<frozen importlib._bootstrap_external>",
            "<unknown>")


class GrowthTrace:
    """Start with :meth:`start` (at the end of the warm-up, with the episodes done then), end with :meth:`top`."""

    def __init__(self, frames: int = 1) -> None:
        self.frames = frames
        self.episodes_at_start: int | None = None
        self._start: tracemalloc.Snapshot | None = None

    @property
    def started(self) -> bool:
        return self._start is not None

    def start(self, episodes_done: int) -> None:
        """Trace from now on; allocations made before are not traced (they are the warm-up's)."""
        tracemalloc.start(self.frames)
        self._start = self._snapshot()
        self.episodes_at_start = episodes_done

    def top(self, episodes_done: int, n: int = 15) -> list[dict[str, Any]]:
        """Stop tracing; the ``n`` source lines whose live allocations grew most since :meth:`start`, with bytes,
        blocks and bytes per episode over the episodes done in between. Empty when never started."""
        if self._start is None or self.episodes_at_start is None:
            return []
        end = self._snapshot()
        tracemalloc.stop()
        episodes = max(1, episodes_done - self.episodes_at_start)
        out = []
        for stat in end.compare_to(self._start, "lineno")[:n]:
            frame = stat.traceback[0]
            out.append({"where": f"{_short(frame.filename)}:{frame.lineno}", "bytes": stat.size_diff,
                        "blocks": stat.count_diff, "bytes_per_episode": round(stat.size_diff / episodes, 1)})
        return out

    @staticmethod
    def _snapshot() -> tracemalloc.Snapshot:
        return tracemalloc.take_snapshot().filter_traces([tracemalloc.Filter(False, f) for f in _IGNORED])


def _short(filename: str) -> str:
    """A path in the project relative to its root, a library's from its package, anything else as it is."""
    path = Path(filename)
    if path.is_relative_to(ROOT) and ".venv" not in path.parts:
        return str(path.relative_to(ROOT))
    _, sep, tail = filename.partition("site-packages/")
    return tail if sep else filename
