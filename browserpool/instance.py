"""Names that tie an engine's host resources (shared-memory segments, temporary directories) to the
engine process that made them, so a later engine can tell a dead engine's leftovers from a live one's.

An engine instance is named by its pid and its process start time (clock ticks since boot, from
``/proc/PID/stat``): a pid alone can be reused by an unrelated process after the engine died.
Every segment an engine's workers create is called ``wg-<pid>-<start>-<worker>-<random>``; every
temporary directory ``webgym-<pid>-<start>-<random>``.
"""

from __future__ import annotations

import os
import re
import secrets
from dataclasses import dataclass

SHM_PREFIX = "wg-"
TMP_PREFIX = "webgym-"
# A segment name: prefix, owner pid and start time, a worker id of safe characters, a random suffix.
SHM_NAME_RE = re.compile(r"^wg-(?P<pid>\d{1,10})-(?P<start>\d{1,20})-(?P<worker>[A-Za-z0-9_.]{1,64})-[0-9a-f]{8}$")
TMP_NAME_RE = re.compile(r"^webgym-(?P<pid>\d{1,10})-(?P<start>\d{1,20})-")


def _stat_fields(pid: int) -> list[bytes] | None:
    """The fields of ``/proc/PID/stat`` from field 3 (the state) on, or None when there is no such process."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return None
    # The command name (field 2) may hold spaces and parentheses: split after its last ')'.
    return stat[stat.rfind(b")") + 2:].split()


def process_start_ticks(pid: int) -> int | None:
    """The start time of process ``pid`` in clock ticks since boot, or None when there is no such process."""
    fields = _stat_fields(pid)
    try:
        return int(fields[19]) if fields else None  # field 22 of the whole line
    except (IndexError, ValueError):
        return None


@dataclass(frozen=True, slots=True)
class Instance:
    """One engine process: its pid and start time."""

    pid: int
    start: int

    @classmethod
    def current(cls) -> Instance:
        pid = os.getpid()
        return cls(pid, process_start_ticks(pid) or 0)

    @property
    def tag(self) -> str:
        return f"{self.pid}-{self.start}"

    def alive(self) -> bool:
        """True while the very process this names runs (same pid, same start time; a zombie, dead but not yet
        reaped by its parent, does not run)."""
        fields = _stat_fields(self.pid)
        if not fields:
            return False
        try:
            return fields[0] not in (b"Z", b"X") and int(fields[19]) == self.start
        except (IndexError, ValueError):
            return False

    def shm_prefix(self, worker_id: str) -> str:
        """The prefix of every segment that worker ``worker_id`` of this engine creates."""
        return f"{SHM_PREFIX}{self.tag}-{safe_worker_id(worker_id)}-"

    def new_shm_name(self, worker_id: str) -> str:
        return self.shm_prefix(worker_id) + secrets.token_hex(4)

    def owns_shm(self, name: str, worker_id: str) -> bool:
        """Whether ``name`` is a segment name this engine told worker ``worker_id`` to use."""
        return SHM_NAME_RE.match(name) is not None and name.startswith(self.shm_prefix(worker_id))

    def tmp_prefix(self) -> str:
        return f"{TMP_PREFIX}{self.tag}-"


def safe_worker_id(worker_id: str) -> str:
    """A worker id reduced to the characters a segment name may hold."""
    return re.sub(r"[^A-Za-z0-9_.]", "_", worker_id)[:64] or "w"


def owner_of(name: str) -> Instance | None:
    """The engine instance a segment or temporary-directory name belongs to, or None for other names."""
    m = SHM_NAME_RE.match(name) or TMP_NAME_RE.match(name)
    return Instance(int(m["pid"]), int(m["start"])) if m else None
