"""Removes what dead engines left behind: shared-memory segments in ``/dev/shm`` and temporary directories.

An engine that dies without cleaning up (``kill -9``, a machine that runs out of memory) leaves its
workers' 64 MiB frame rings in ``/dev/shm`` and its private ipc directory in the temp directory. Both
carry their engine's pid and start time in their names (``browserpool.instance``); a new engine removes
every such entry whose engine no longer runs. Nothing else is touched: a name that does not match the
scheme is kept, and so is every entry of a live engine (same pid *and* same start time), or of a pid
this process cannot see (an engine in another pid namespace sharing ``/dev/shm`` looks dead: run such
engines with their own ``/dev/shm``).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import stat
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field

from browserpool.instance import SHM_NAME_RE, TMP_NAME_RE, Instance, owner_of

SHM_DIR = "/dev/shm"


@dataclass(slots=True)
class Reaped:
    """What one pass removed (names only) and what it kept because its engine still runs."""

    segments: list[str] = field(default_factory=list)
    tmp_dirs: list[str] = field(default_factory=list)
    live: int = 0


def _dead_owner(name: str, me: Instance) -> bool:
    owner = owner_of(name)
    # Our own entries are live by definition (also when /proc is unreadable for some reason).
    return owner is not None and owner != me and not owner.alive()


def reap_stale(shm_dir: str = SHM_DIR, tmp_dir: str | None = None) -> Reaped:
    """Remove the segments and temporary directories of engines that no longer run; never raises.

    ``shm_dir`` and ``tmp_dir`` (default: the system temp directory) are parameters for tests."""
    me = Instance.current()
    out = Reaped()
    for name in _listdir(shm_dir):
        if not SHM_NAME_RE.match(name):
            continue
        if not _dead_owner(name, me):
            out.live += 1
            continue
        path = os.path.join(shm_dir, name)
        # Only plain files: a link or a directory under that name was not made by an engine.
        if _is(path, stat.S_ISREG):
            with contextlib.suppress(OSError):  # another user's segment, or gone meanwhile
                os.unlink(path)
                out.segments.append(name)
    tmp_dir = tmp_dir or tempfile.gettempdir()
    for name in _listdir(tmp_dir):
        if not TMP_NAME_RE.match(name):
            continue
        if not _dead_owner(name, me):
            out.live += 1
            continue
        path = os.path.join(tmp_dir, name)
        if _is(path, stat.S_ISDIR):  # lstat: a symlink is never followed
            shutil.rmtree(path, ignore_errors=True)
            if not os.path.lexists(path):
                out.tmp_dirs.append(name)
    return out


def _listdir(path: str) -> list[str]:
    try:
        return os.listdir(path)
    except OSError:
        return []


def _is(path: str, test: Callable[[int], bool]) -> bool:
    try:
        st = os.lstat(path)
    except OSError:
        return False
    # The caller's own uid only: never remove another user's leftovers (it could not for most anyway).
    return test(st.st_mode) and st.st_uid == os.getuid()
