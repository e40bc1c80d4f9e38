"""One writer per run directory.

Two processes appending to the same ``episodes.jsonl`` (a ``run --resume`` started twice, a ``judge``
while the run still goes) would each rerun the other's episodes and write their records twice. A
writer therefore holds ``RUN_DIR/writer.lock`` with ``flock(LOCK_EX)`` while it has the directory
open. The kernel drops the lock when the holder's last descriptor closes, including when the process
is killed (``kill -9`` leaves no stale lock behind); the file itself stays (removing a lock file races
with the next locker) and holds the holder's pid, for the message a refused writer prints.

Readers (``view``, ``export``, ``monitor``) never take the lock and are never blocked by it. Within
one process the lock is re-entrant: the CLI takes it first (to fail before anything starts) and the
run's store takes it again.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import threading
from pathlib import Path
from types import TracebackType

LOCK_NAME = "writer.lock"

_held: dict[str, list[int]] = {}  # real path of the run directory -> [fd, holds]
_guard = threading.Lock()


class RunDirBusy(RuntimeError):
    """Another live process is writing this run directory."""

    def __init__(self, run_dir: str | Path, pid: int | None) -> None:
        who = f"pid {pid}" if pid else "another process"
        super().__init__(f"{run_dir} is in use by {who} (one writer per run directory; wait for it to end, "
                         "or stop it)")
        self.run_dir = str(run_dir)
        self.pid = pid


class RunDirLock:
    """A hold on a run directory's writer lock; :meth:`release` (or leaving the ``with`` block) gives it back."""

    def __init__(self, key: str, run_dir: str) -> None:
        self._key = key
        self.run_dir = run_dir
        self.released = False

    def release(self) -> None:
        """Give this hold back; the lock itself goes when the process's last hold does (idempotent)."""
        if self.released:
            return
        self.released = True
        with _guard:
            entry = _held.get(self._key)
            if entry is None:
                return
            entry[1] -= 1
            if entry[1] == 0:
                del _held[self._key]
                os.close(entry[0])  # closing the only descriptor drops the flock

    def __enter__(self) -> RunDirLock:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.release()


def lock_run_dir(run_dir: str | Path) -> RunDirLock:
    """Take the writer lock of ``run_dir`` (which must exist) without waiting; RunDirBusy when another process
    holds it. Re-entrant within this process."""
    key = os.path.realpath(run_dir)
    with _guard:
        entry = _held.get(key)
        if entry is not None:
            entry[1] += 1
            return RunDirLock(key, str(run_dir))
        path = os.path.join(key, LOCK_NAME)
        # O_CLOEXEC (Python's default) as well: a spawned worker or server must not inherit the lock.
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            os.close(fd)
            if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                raise RunDirBusy(run_dir, holder_pid(run_dir)) from None
            raise
        # Who holds it, for the message of a refused writer (rewritten in place: the file is never replaced).
        note = json.dumps({"pid": os.getpid()}).encode() + b"\n"  # no command line: it may hold credentials
        with contextlib.suppress(OSError):
            os.ftruncate(fd, 0)
            os.pwrite(fd, note, 0)
        _held[key] = [fd, 1]
        return RunDirLock(key, str(run_dir))


def holder_pid(run_dir: str | Path) -> int | None:
    """The pid the lock file names: its holder, or its last holder once released."""
    try:
        data = json.loads(Path(run_dir, LOCK_NAME).read_text() or "{}")
    except (OSError, ValueError):
        return None
    pid = data.get("pid") if isinstance(data, dict) else None
    return pid if isinstance(pid, int) else None
