"""A browser worker's tie to the engine that spawned it: the worker (and its Playwright driver and
Chromium) must not outlive the engine, however the engine dies (``kill -9`` included).

Two things hold it, each covering the other's gap:

- ``prctl(PR_SET_PDEATHSIG, SIGTERM)``: the kernel sends the worker SIGTERM when its parent dies. Set
  by the worker itself once it runs, so the parent may already be gone by then: it checks that its
  parent is still the engine it was given (pid and start time) and leaves at once otherwise.
- a watch thread on the engine's pidfd (a poll of ``/proc`` where pidfds are missing): it does not need
  the event loop, so a worker whose loop is stuck still dies with its engine.

Dying, the worker kills its descendants (:func:`kill_descendants`): Playwright starts Chromium detached,
in a process group of its own, so that group is killed whole. (Chromium's crash handlers, which
double-fork away from it, exit on their own once Chromium is gone; and a worker killed outright takes
its driver with it, which takes Chromium: the driver's pipe closes.)

Linux only (as the rest of the pool); elsewhere the calls do nothing and say so.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import select
import signal
import threading
import time
from collections.abc import Callable

import psutil

from browserpool.instance import Instance

PR_SET_PDEATHSIG = 1
POLL_S = 0.5  # the /proc poll's period where pidfds are not available


def _prctl(option: int, arg: int) -> bool:
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(option, ctypes.c_ulong(arg), ctypes.c_ulong(0), ctypes.c_ulong(0),
                          ctypes.c_ulong(0)) == 0
    except (OSError, AttributeError):  # no libc prctl: not Linux
        return False


def parse_engine(text: str) -> Instance:
    """``PID:START`` (what the pool passes as ``--engine``) as an Instance."""
    pid, _, start = text.partition(":")
    try:
        return Instance(int(pid), int(start))
    except ValueError:
        raise ValueError(f"--engine must be PID:START, not {text!r}") from None


def engine_arg(engine: Instance) -> str:
    """The ``--engine`` argument that names ``engine``."""
    return f"{engine.pid}:{engine.start}"


def bind_to_parent(engine: Instance) -> bool:
    """Ask the kernel for SIGTERM when the parent dies, then check the parent is still ``engine``.

    False: the engine is already gone (the caller should leave at once). The signal itself must be
    handled by the caller (its SIGTERM handler)."""
    _prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
    # After prctl: a parent that died before it would not send the signal, so look now.
    return os.getppid() == engine.pid and engine.alive()


def ignores_signal(pid: int, sig: int) -> bool:
    """Whether process ``pid`` ignores ``sig`` (SIG_IGN: e.g. SIGHUP under nohup, SIGINT for a background job of a
    script); False when it cannot be told."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("SigIgn:"):
                    return bool(int(line.split()[1], 16) >> (sig - 1) & 1)
    except (OSError, ValueError, IndexError):
        pass
    return False


def kill_descendants() -> int:
    """SIGKILL every process below this one, and every process group one of them leads (Chromium's own
    group, with its zygotes and renderers); never this process's own group. Returns how many it signalled."""
    try:
        procs = psutil.Process().children(recursive=True)
    except psutil.Error:
        return 0
    own = os.getpgrp()
    groups: set[int] = set()
    for p in procs:
        with contextlib.suppress(OSError):
            g = os.getpgid(p.pid)
            if g != own:
                groups.add(g)
    for g in groups:
        with contextlib.suppress(OSError):
            os.killpg(g, signal.SIGKILL)
    n = 0
    for p in procs:
        with contextlib.suppress(psutil.Error):
            p.kill()
            n += 1
    return n


class EngineWatch(threading.Thread):
    """Calls ``on_death()`` (from this thread) once ``engine`` no longer runs."""

    def __init__(self, engine: Instance, on_death: Callable[[], object]) -> None:
        super().__init__(name="engine-watch", daemon=True)
        self.engine = engine
        self.on_death = on_death

    def run(self) -> None:
        fd: int | None = None
        with contextlib.suppress(OSError, AttributeError):
            fd = os.pidfd_open(self.engine.pid)
        try:
            # Checked after the pidfd is open: the engine started before this worker, so if it still runs now it
            # already held that pid when the pidfd was opened, and the pidfd is the engine's.
            if fd is not None and self.engine.alive():
                select.select([fd], [], [])  # readable once the process has exited
            else:
                while self.engine.alive():
                    time.sleep(POLL_S)
        finally:
            if fd is not None:
                os.close(fd)
        self.on_death()
