"""The in-episode memory bound: every ``page_memory_check_s`` the worker reads the private resident memory of each
of its Chromium's renderer processes and ends one past ``page_memory_mib`` (SIGKILL), so that a page allocating
without end costs its own episode (recorded ``page_memory``) and not the machine; the browser and the other
episodes live on.

Why a watch and not a kernel limit: a cgroup bounds a process tree (a whole browser and every episode in it), not
a page, and creating one needs write access to the cgroup tree, which containers often do not give. The watch costs
a listing of /proc and one small read per process of the browser per check: 0.26 ms of CPU with 32 contexts open
(37 processes), 0.5% of a core at the default 20 checks a second.
What it cannot bound: memory a renderer gains between two checks (a page that writes 64 MiB every 100 ms overshoots
by at most one such write plus the kill's own latency)."""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

PAGE_SIZE = os.sysconf("SC_PAGE_SIZE")


def private_resident_bytes(pid: int) -> int:
    """Resident memory a process does not share (its heaps, ArrayBuffers, stacks), 0 when it is gone:
    resident minus shared pages of /proc/PID/statm (one small read, no page-table walk as smaps needs)."""
    try:
        with open(f"/proc/{pid}/statm", "rb") as f:
            return _private_of_statm(f.read())
    except OSError:
        return 0


def _private_of_statm(statm: bytes) -> int:
    fields = statm.split()
    return max(0, int(fields[1]) - int(fields[2])) * PAGE_SIZE


def _parent(pid: int) -> int:
    """The parent of ``pid`` (0 when it is gone); the name in /proc/PID/stat may hold spaces and parentheses."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return 0
    return int(stat[stat.rindex(b")") + 2:].split()[1])


def _is_renderer(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return b"--type=renderer" in f.read()
    except OSError:
        return False


class ProcessTree:
    """The descendants of one root process, kept up to date by a listing of /proc: only processes not seen
    before are read (a process's ancestry does not change while it lives, except to leave the tree)."""

    def __init__(self, root: int) -> None:
        self.root = root
        self.members: set[int] = {root}
        self._others: set[int] = set()

    def refresh(self) -> set[int]:
        """Re-read /proc; returns the descendants (the root excluded)."""
        alive = {int(name) for name in os.listdir("/proc") if name.isdigit()}
        self.members &= alive
        self._others &= alive
        parents = {pid: _parent(pid) for pid in alive - self.members - self._others}
        # A parent is older than its child but may be new to this listing as well: resolve until nothing moves.
        changed = True
        while changed:
            changed = False
            for pid, parent in list(parents.items()):
                if parent in self.members:
                    self.members.add(pid)
                    del parents[pid]
                    changed = True
        self._others |= parents.keys()
        return self.members - {self.root}


@dataclass(frozen=True)
class MemoryKill:
    """A renderer the watch ended: its process, what it held, and when (``time.monotonic``)."""

    pid: int
    held_bytes: int
    at: float


class RendererWatch:
    """Ends a renderer of the browser whose root process ``root_of()`` names (it changes when the browser is
    recycled) that holds more private memory than ``cap_bytes``: a :meth:`check` every ``interval_s`` in a thread
    of its own, so that a busy event loop does not stretch it; ``on_kill`` hears of each kill (from that thread)."""

    #: How long after a kill a page's crash is taken for it (a crash is reported ~30 ms after the SIGKILL).
    ATTRIBUTION_S = 5.0

    def __init__(self, cap_bytes: int, interval_s: float, root_of: Callable[[], int],
                 on_kill: Callable[[MemoryKill], None] | None = None) -> None:
        self.cap_bytes = cap_bytes
        self.interval_s = interval_s
        self.root_of = root_of
        self.on_kill = on_kill
        self.tree = ProcessTree(0)
        self.kills: list[MemoryKill] = []  # replaced, never changed in place: read from the event loop's thread
        # /proc/PID/statm kept open per process: a read at offset 0 is 1 us, an open and a read 10 us. The file
        # belongs to the process, not the number: once the process is gone it fails, even if the number is reused.
        self._statm: dict[int, int] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="renderer-watch", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()
        for fd in self._statm.values():
            os.close(fd)
        self._statm.clear()

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            root = self.root_of()
            if root != self.tree.root:
                self.tree = ProcessTree(root)
            if root:
                self.check()

    def _held(self, pid: int) -> int:
        try:
            fd = self._statm.get(pid)
            if fd is None:
                fd = self._statm[pid] = os.open(f"/proc/{pid}/statm", os.O_RDONLY | os.O_CLOEXEC)
            return _private_of_statm(os.pread(fd, 128, 0))
        except OSError:
            return 0

    def check(self) -> None:
        """One pass: every renderer over the cap is killed."""
        members = self.tree.refresh()
        for pid in self._statm.keys() - members:
            os.close(self._statm.pop(pid))
        for pid in members:
            held = self._held(pid)
            # The type is read only for a process over the cap: a process just forked by the zygote still shows
            # the zygote's command line, and the browser's other children (GPU, network) are not a page's.
            if held > self.cap_bytes and _is_renderer(pid):
                try:
                    os.kill(pid, signal.SIGKILL)
                except OSError:
                    continue
                kill = MemoryKill(pid, held, time.monotonic())
                self.kills = [k for k in self.kills if kill.at - k.at < self.ATTRIBUTION_S] + [kill]
                if self.on_kill is not None:
                    self.on_kill(kill)

    def kill_before(self, crashed_at: float) -> MemoryKill | None:
        """The last kill before a crash reported at ``crashed_at`` (``time.monotonic``), if it explains it."""
        for kill in reversed(self.kills):
            if 0 <= crashed_at - kill.at < self.ATTRIBUTION_S:
                return kill
        return None
