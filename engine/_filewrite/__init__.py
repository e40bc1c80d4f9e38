"""Write a batch of files with the GIL released once for the whole batch (compiled C).

The engine's screenshot writer runs on a thread beside a busy event loop; written with ``os.open``/``os.write``
/``os.close``, each file costs that thread three waits for the GIL, and it falls behind the loop (see
``engine/store/frame_writer.py``). :func:`write_files` takes the GIL back once per batch.
"""

from __future__ import annotations

import os
from collections.abc import Sequence

from ._core import write_files as _write_files

__all__ = ["write_files"]


def write_files(items: Sequence[tuple[str, bytes | memoryview, bool]]) -> list[str | None]:
    """Write each ``(path, data, make_dir)`` as a whole file, in order (``make_dir``: create its folder and
    parents first). ``data`` is any contiguous buffer. Returns, per item, None or what went wrong as text
    (``"<file name>: [Errno N] ..."``); never raises for a file that could not be written."""
    return [None if err == 0 else f"{os.path.basename(path)}: {OSError(err, os.strerror(err), path)}"
            for (path, _, _), err in zip(items, _write_files(items), strict=True)]
