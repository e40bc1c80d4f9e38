"""A browser worker kept running by a host process that a cluster manager placed (a Ray actor): the host
starts an ordinary worker process (``python -m browserpool.worker``) that connects to the engine over ZeroMQ
itself, and the worker dies with its host.

The host passes itself as the worker's ``--engine``, so the worker's lifeline (``lifeline.py``: the
parent-death signal and a pidfd watch) ties it to the host process exactly as it ties a spawned worker to
its engine: however the host dies (killed by its cluster manager, ``kill -9``), the worker kills its
browser, unlinks its frame ring and removes the host's temporary directory.

A worker that exits cleanly was shut down by its engine (the engine closed): the host starts a new one, which
waits for the next engine on the same endpoint. A worker that fails (its browser died, it could not start)
takes the host down with it (:meth:`WorkerHost.fail`), so the cluster manager's own restart policy (Ray's
``max_restarts``) decides what happens next, and a crash loop stays bounded and visible there.

Each worker process gets its own id, ``NAME-<host pid>-<n>``: distinct per host, per restart of the host (a new
pid) and per worker the host started, so the engine never mistakes a replacement for the worker it replaces.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import asdict, dataclass, replace
from typing import Any

from browserpool.auth import CURVE_ENV
from browserpool.childenv import worker_env
from browserpool.config import WorkerConfig
from browserpool.instance import Instance
from browserpool.lifeline import engine_arg
from browserpool.reaper import reap_stale
from browserpool.stderr_log import log_line

EXIT_WORKER_FAILED = 75  # the host's exit code when its worker failed (for its cluster manager to restart it)


@dataclass(frozen=True, slots=True)
class HostedWorker:
    """What a host reports about its current worker process."""

    worker_id: str
    pid: int  # the worker process
    host_pid: int
    hostname: str
    generation: int  # 0 for the host's first worker, then one more per worker it started after a clean exit
    started: float  # time.time() of the worker's start


class WorkerHost:
    """Keeps one browser worker process running, tied to this process (module docstring).

    ``cfg``: the worker's configuration (its ``endpoint`` is the engine's; ``worker_id`` is set here).
    ``name``: the prefix of the worker ids. ``curve``: the worker's CURVE keys as :meth:`ClientKeys.to_env`
    writes them (handed over in the worker's environment, never on its command line), or None."""

    def __init__(self, cfg: WorkerConfig, name: str, curve: str | None = None) -> None:
        self.cfg = cfg
        self.name = name
        self.instance = Instance.current()
        self._curve = curve
        reap_stale()  # what hosts (or engines) on this machine left when they died too hard to clean up
        # Named after this host, so that its worker removes it when the host dies (worker.serve) and a later
        # engine's reaper on this machine can tell it is stale.
        self.tmp_dir = tempfile.mkdtemp(prefix=self.instance.tmp_prefix())
        self._changed = threading.Condition()
        self._current: HostedWorker | None = None
        self._start_error: BaseException | None = None
        # One long-lived thread starts every worker process: the parent-death signal follows the thread that
        # forked the child, so a short-lived thread would take the worker down with it.
        threading.Thread(target=self._keep, name="worker-keeper", daemon=True).start()
        with self._changed:
            self._changed.wait_for(lambda: self._current is not None or self._start_error is not None)
        if self._start_error is not None:
            raise RuntimeError(f"cannot start a browser worker: {self._start_error}") from self._start_error

    def info(self) -> dict[str, Any]:
        """The current worker (a :class:`HostedWorker` as a dict: plain data for any caller)."""
        with self._changed:
            assert self._current is not None
            return asdict(self._current)

    def watch(self, generation: int, timeout_s: float) -> dict[str, Any]:
        """The current worker once its generation differs from ``generation``, or after ``timeout_s`` (a long
        poll: a caller that passes the generation it knows hears of a replacement at once)."""
        with self._changed:
            self._changed.wait_for(lambda: self._current is not None and self._current.generation != generation,
                                   timeout_s)
            assert self._current is not None
            return asdict(self._current)

    def fail(self, code: int) -> None:
        """The worker failed with exit code ``code``: end this host (overridable, e.g. by a test)."""
        log_line(f"worker host {self.name}-{self.instance.pid}: its browser worker exited with code {code}; "
                 "the host exits so that its cluster manager restarts it")
        shutil.rmtree(self.tmp_dir, ignore_errors=True)
        os._exit(EXIT_WORKER_FAILED)

    def _keep(self) -> None:
        generation = 0
        while True:
            try:
                proc, current = self._start(generation)
            except OSError as exc:
                with self._changed:
                    self._start_error = exc
                    self._changed.notify_all()
                return
            with self._changed:
                self._current = current
                self._changed.notify_all()
            code = proc.wait()
            if code != 0:
                self.fail(code)
                return
            generation += 1  # shut down by its engine: the next worker waits for the next engine

    def _start(self, generation: int) -> tuple[subprocess.Popen[bytes], HostedWorker]:
        worker_id = f"{self.name}-{self.instance.pid}-{generation}"
        cfg = replace(self.cfg, worker_id=worker_id)
        env = worker_env()  # without this process's secrets
        env.pop(CURVE_ENV, None)
        if self._curve is not None:
            env[CURVE_ENV] = self._curve  # the worker removes it before its browser starts
        # --engine: the worker dies with this host. A session of its own: a signal meant for the host's process
        # group reaches the worker only through its lifeline, after the host itself is gone.
        proc = subprocess.Popen(
            [sys.executable, "-m", "browserpool.worker", "--config", cfg.to_json(),
             "--engine", engine_arg(self.instance), "--tmp-dir", os.path.join(self.tmp_dir, f"w{generation}")],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, env=env, start_new_session=True)
        return proc, HostedWorker(worker_id, proc.pid, self.instance.pid, socket.gethostname(), generation,
                                  time.time())
