"""How a worker process ends besides a Shutdown: on a signal (SIGTERM, SIGHUP; SIGINT for a spawned worker) and on
the death of the engine that spawned it (:func:`serve`), both by leaving at once (``Leaving``, a part of
:class:`browserpool.worker.BrowserWorker`)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import signal
import threading
from typing import TYPE_CHECKING, NoReturn

from browserpool import lifeline
from browserpool.config import WorkerConfig
from browserpool.instance import Instance
from browserpool.shm import SlotRing
from browserpool.stderr_log import log_line

if TYPE_CHECKING:
    from browserpool.worker import BrowserWorker

SIGNAL_GRACE_S = 5.0  # how long a spawned worker signalled while its engine lives waits for the engine's Shutdown
EXIT_ENGINE_GONE = 4  # the engine that spawned this worker died (or was gone before the worker started)
_leaving = threading.Lock()  # held by the one caller of BrowserWorker.leave


class Leaving:
    """The immediate exit (see the module docstring)."""

    if TYPE_CHECKING:  # what BrowserWorker provides
        cfg: WorkerConfig
        ring: SlotRing | None

    def kill_browser(self) -> int:
        """Kill this worker's Chromium (its whole process group: Playwright starts it detached) and the
        Playwright driver now, with SIGKILL; returns how many processes were signalled. Synchronous: safe from
        a signal handler or another thread."""
        return lifeline.kill_descendants()

    def leave(self, reason: str, code: int, tmp_dir: str | None = None) -> NoReturn:
        """Exit at once (SIGTERM, SIGHUP, the engine's death): kill the browser and driver, unlink the frame
        ring, remove ``tmp_dir``; no graceful close, which could wait on a dead engine. From any thread."""
        _leaving.acquire()  # a second caller (the signal and the watch both fire) waits for the exit
        log_line(f"worker {self.cfg.worker_id}: {reason}; killing the browser and exiting")
        if self.ring is not None:
            # Unlink only: unmapping could pull the memory from under a write in progress. (The resource tracker,
            # which would otherwise unlink it too and warn, is killed below with the other descendants.)
            with contextlib.suppress(OSError):
                os.unlink(os.path.join("/dev/shm", self.ring.name.lstrip("/")))
        with contextlib.suppress(Exception):
            self.kill_browser()
        if tmp_dir:
            shutil.rmtree(tmp_dir, ignore_errors=True)
        os._exit(code)


async def serve(worker: BrowserWorker, engine: Instance | None = None, tmp_dir: str | None = None) -> int:
    """Run ``worker`` until it is told to shut down or its browser dies.

    ``engine``: the process that spawned this worker (None for a worker started by hand). Its death makes the
    worker leave at once (:meth:`BrowserWorker.leave`: browser killed, ring unlinked). SIGTERM and SIGHUP (and
    SIGINT, for a spawned worker) do the same when there is no live engine; while the engine lives they are ignored
    if the engine ignores them, else they start a grace period for the engine's own Shutdown (the engine was most
    likely signalled too, and closes its episodes on this worker first)."""
    # A dead engine cannot remove its own temp directory (the one above tmp_dir): its workers do.
    parent = os.path.dirname(tmp_dir.rstrip("/")) if tmp_dir else ""
    engines_dir = parent if engine and os.path.basename(parent).startswith(engine.tmp_prefix()) else None

    def engine_gone() -> bool:
        # Re-parented: the parent-death signal came (the engine may still be a zombie in /proc).
        return engine is not None and (os.getppid() != engine.pid or not engine.alive())

    loop = asyncio.get_running_loop()
    grace: list[asyncio.TimerHandle] = []

    def on_signal(sig: signal.Signals) -> None:
        if engine is None or engine_gone():
            reason = f"got {sig.name}" + (f" (the engine, pid {engine.pid}, is gone)" if engine else "")
            worker.leave(reason, 128 + sig, engines_dir or tmp_dir)
        if lifeline.ignores_signal(engine.pid, sig):
            return  # sent to every process (systemd stops a whole cgroup) and the engine ignores it: so does its worker
        if not grace:
            # The engine lives and was most likely signalled too (systemd signals every process of its cgroup; the
            # pool starts workers in a session of their own, so a process-group signal never gets here). Stopping,
            # it still needs this worker to close its episodes, then shuts it down: leave on its own only if that
            # does not come.
            log_line(f"worker {worker.cfg.worker_id}: got {sig.name}; leaving in {SIGNAL_GRACE_S:g} s unless the "
                     "engine shuts this worker down first")
            grace.append(loop.call_later(SIGNAL_GRACE_S, worker.leave, f"got {sig.name}", 128 + sig, tmp_dir))

    # A spawned worker takes a SIGINT sent to it the same way; one started by hand keeps Ctrl-C's graceful
    # KeyboardInterrupt.
    for sig in (signal.SIGTERM, signal.SIGHUP, *((signal.SIGINT,) if engine is not None else ())):
        loop.add_signal_handler(sig, on_signal, sig)
    if engine is not None:
        lifeline.EngineWatch(engine, lambda: worker.leave(f"the engine (pid {engine.pid}) is gone",
                                                          EXIT_ENGINE_GONE, engines_dir or tmp_dir)).start()
    return await worker.run()
