"""The pool's supervision of its workers: each spawned as a process of its own (in a session of its own, tied to the
engine's life, without the engine's secrets) and replaced when it dies, until too many die while starting;
hand-started workers declared dead when their heartbeats stop; a worker that misbehaves dropped
(``Supervisor``, a part of :class:`browserpool.pool.BrowserPool`)."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import os
import sys
import tempfile
import time
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from browserpool.auth import CURVE_ENV, ClientKeys
from browserpool.childenv import worker_env
from browserpool.instance import Instance
from browserpool.lifeline import engine_arg
from browserpool.pool_errors import WorkerLost
from browserpool.shm import unlink_segment
from browserpool.upstream import env_names
from browserpool.worker_handle import WorkerHandle

if TYPE_CHECKING:
    from browserpool.pool import PoolConfig

MAX_FAILED_STARTS = 3
MAX_SILENT = 256  # workers dropped for silence whose connection is remembered (they may speak again)


class Supervisor:
    """Workers started, replaced, declared dead and dropped (see the module docstring)."""

    if TYPE_CHECKING:  # what BrowserPool provides
        cfg: PoolConfig
        instance: Instance
        endpoint: str
        workers: dict[str, WorkerHandle]
        restarts: int
        broken: str | None
        _tmpdir: tempfile.TemporaryDirectory[str] | None
        _spawn_keys: ClientKeys | None
        _worker_ids: itertools.count[int]
        _by_identity: dict[bytes, WorkerHandle]
        _silent: dict[bytes, tuple[WorkerHandle, set[str]]]
        _failed_starts: int
        _closing: bool

        def _emit(self, kind: str, message: str) -> None: ...
        def _capacity_changed(self) -> None: ...
        def _spawn_task(self, coro: Any) -> None: ...

    def _drop_worker(self, h: WorkerHandle, reason: str) -> None:
        """Stop using a worker that misbehaves: its episodes fail (and may retry elsewhere); a worker this pool
        spawned is killed (and replaced by its supervisor)."""
        self._emit("worker_dropped", reason)
        self._fail_worker(h, reason)
        if h.proc is not None and h.proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                h.proc.kill()

    # --- workers -------------------------------------------------------------------------------------
    async def _spawn_worker(self) -> WorkerHandle | None:
        if self._closing:
            return None
        wid = f"w{next(self._worker_ids)}"
        # The ring is named after this engine, so the engine may unlink it and a later one reap it if both die.
        wcfg = replace(self.cfg.worker, endpoint=self.endpoint, worker_id=wid, insecure=self.cfg.insecure,
                       shm_name=self.instance.new_shm_name(wid))
        h = self._new_handle(wid)
        assert self._tmpdir is not None
        # --engine: the worker dies with this process (parent-death signal and a pidfd watch), kill -9 included.
        # --tmp-dir: Playwright's profile and Chromium's temp files go below this engine's own temp directory.
        # A session of its own (start_new_session): a signal meant for the engine's process group (Ctrl-C, a closed
        # terminal, `timeout`) never reaches the worker, its Playwright driver or its resource tracker; the engine
        # stops them itself, once it has closed their episodes.
        life = ["--engine", engine_arg(self.instance), "--tmp-dir", os.path.join(self._tmpdir.name, wid)]
        stderr = open(self.cfg.log_path, "ab") if self.cfg.log_path else None  # noqa: SIM115
        try:
            h.proc = await asyncio.create_subprocess_exec(
                sys.executable, "-m", "browserpool.worker", "--config", wcfg.to_json(), *life,
                stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.DEVNULL, stderr=stderr,
                env=self._worker_env(), start_new_session=True)
        finally:
            if stderr:
                stderr.close()
        self._spawn_task(self._supervise(h))
        return h

    def _worker_env(self) -> dict[str, str]:
        """The environment of a spawned worker; with CURVE it carries the pool's worker key pair."""
        env = worker_env(drop=self.cfg.secret_env)  # without the engine's secrets (API keys, tokens, passwords)
        for url in self.cfg.worker.proxies:  # but with the upstream proxies' credentials: the workers use them
            for name in env_names(url):
                if name in os.environ:
                    env[name] = os.environ[name]
        if self._spawn_keys is not None:
            env[CURVE_ENV] = self._spawn_keys.to_env()
        return env

    def _new_handle(self, wid: str) -> WorkerHandle:
        h = WorkerHandle(wid, ops=asyncio.Semaphore(self.cfg.ops_per_worker),
                         opens=asyncio.Semaphore(self.cfg.opens_per_worker))
        self.workers[wid] = h
        return h

    async def _supervise(self, h: WorkerHandle) -> None:
        assert h.proc is not None
        code = await h.proc.wait()
        if self._closing:
            return
        self._emit("worker_exit", f"browser worker {h.worker_id} exited with code {code}")
        self._fail_worker(h, f"browser worker {h.worker_id} died (exit code {code})")
        # A worker that dies before it ever said hello will most likely do so again: stop after a few
        # in a row instead of looping, so waiting episodes end with an error rather than hang.
        self._failed_starts = 0 if h.ready.is_set() else self._failed_starts + 1
        if self._failed_starts >= MAX_FAILED_STARTS:
            self.broken = f"{self._failed_starts} browser workers in a row died while starting (see the worker log)"
            self._capacity_changed()
        elif self.cfg.restart:
            self.restarts += 1
            await self._spawn_worker()

    async def _watchdog(self) -> None:
        """Declare hand-started (remote) workers dead when their heartbeats stop."""
        while True:
            await asyncio.sleep(1.0)
            now = time.monotonic()
            for h in list(self.workers.values()):
                if h.alive and h.proc is None and now - h.last_seen > self.cfg.heartbeat_timeout_s:
                    reason = f"browser worker {h.worker_id} stopped sending heartbeats"
                    self._emit("worker_silent", reason)
                    if h.identity:
                        self._silent[h.identity] = (h, set(h.episodes))
                        while len(self._silent) > MAX_SILENT:
                            self._silent.pop(next(iter(self._silent)))
                    self._fail_worker(h, reason)

    def _fail_worker(self, h: WorkerHandle, reason: str) -> None:
        was_alive = h.alive
        h.alive = False
        for fut in h.futures.values():
            if not fut.done():
                fut.set_exception(WorkerLost(reason))
        h.futures.clear()
        if h.identity:
            self._by_identity.pop(h.identity, None)
        if h.reader:
            h.reader.close()
            h.reader = None
        self._unlink_ring(h)
        if was_alive:
            self._capacity_changed()

    def _unlink_ring(self, h: WorkerHandle) -> None:
        """Unlink a worker's ring: only a worker this pool spawned, only a name under this engine's scheme."""
        if h.shm_name and h.proc is not None and self.instance.owns_shm(h.shm_name, h.worker_id):
            unlink_segment(h.shm_name)
