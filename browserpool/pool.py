"""The engine side of the browser pool: a ROUTER socket, K worker processes, supervision.

Each worker gets a bounded number of in-flight operations (a FIFO semaphore: the level-2 queue of
the engine), episodes are placed on the worker with the fewest live ones, and a worker that dies is
replaced while its episodes fail with :class:`WorkerLost`.

Every peer is untrusted until proven otherwise: on tcp the socket is a CURVE server whose ZAP handler
lets in only allowed keys (see ``auth.py``); every message is size-capped by ZeroMQ and decoded into a
validated struct; a peer that keeps sending bad messages is banned; every request has a deadline, so a
worker that heartbeats but never answers costs its episodes an error, never a hang; and a worker may
only point the engine at shared memory under the engine's naming scheme (``instance.py``).

Its parts have modules of their own: the sessions (``session.py``), requests and the receive loop (``routing.py``),
supervision (``supervisor.py``) and the trust checks (``trust.py``).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import os
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import zmq
import zmq.asyncio

# Names imported "as" themselves are re-exported: they lived here, and code elsewhere imports them from here.
from browserpool import protocol as P
from browserpool.auth import ClientKeys, CurveGuard, ServerKeys
from browserpool.config import WorkerConfig
from browserpool.instance import Instance
from browserpool.memory import tree_pss_bytes
from browserpool.pool_errors import BrowserOpError as BrowserOpError
from browserpool.pool_errors import PoolError as PoolError
from browserpool.pool_errors import RequestTimeout as RequestTimeout
from browserpool.pool_errors import WorkerLost as WorkerLost
from browserpool.reaper import reap_stale
from browserpool.router import RouterSocket
from browserpool.routing import Routing
from browserpool.session import BrowserSession as BrowserSession
from browserpool.session import Frame as Frame
from browserpool.supervisor import Supervisor
from browserpool.trust import PeerTrust
from browserpool.worker_handle import WorkerHandle as WorkerHandle

log = logging.getLogger(__name__)
# Events that report a repair, not a fault: logged as information, the others as warnings.
_REPAIR_EVENTS = frozenset({"reaped", "worker_rejoined"})


@dataclass
class PoolConfig:
    """How many workers, how they are started and how much each may do at once."""

    workers: int = max(1, os.cpu_count() or 1)
    worker: WorkerConfig = field(default_factory=lambda: WorkerConfig(endpoint=""))
    listen: str | None = None  # default: an ipc socket in a private temp dir
    spawn: bool = True  # False: wait for workers started by hand (--connect)
    max_episodes_per_worker: int = 64
    ops_per_worker: int = 16  # level-2 queue: in-flight browser operations per worker
    opens_per_worker: int = 4  # page loads are heavy: fewer at once load faster (and startup bursts)
    # How long the pool waits for its workers to start, and an episode for a worker when none is alive.
    start_timeout_s: float = 60.0
    heartbeat_timeout_s: float = 15.0
    restart: bool = True
    shared_memory: bool = True  # False: frames travel inline in replies (what remote workers do)
    log_path: str | None = None  # where worker stderr goes (default: inherited)
    # Environment variables never passed to workers, besides everything named like a secret (childenv.py):
    # e.g. a custom --api-key-env.
    secret_env: tuple[str, ...] = ()
    # CURVE on the worker socket: required when ``listen`` is tcp unless ``insecure`` is set.
    server_keys: ServerKeys | None = None
    insecure: bool = False
    # A request's deadline is the worker's own cap for the operation (open_timeout_s or settle_timeout_s, plus
    # the screenshot's) plus this slack; after ``max_timeouts`` missed deadlines in a row the worker is dropped.
    request_slack_s: float = 30.0
    max_timeouts: int = 3
    # Bad messages (undecodable, wrong frame count, wrong types, forged) a peer may send before it is banned.
    max_offences: int = 5


class BrowserPool(Routing, PeerTrust, Supervisor):
    """Starts, feeds and supervises the browser workers.

    Its parts: requests and the receive loop (:class:`~browserpool.routing.Routing`), the trust checks
    (:class:`~browserpool.trust.PeerTrust`) and supervision (:class:`~browserpool.supervisor.Supervisor`); here:
    its state, its lifecycle, leases and memory figures."""

    def __init__(self, cfg: PoolConfig) -> None:
        self.cfg = cfg
        self.instance = Instance.current()
        self._zctx = zmq.asyncio.Context()
        self._router = RouterSocket(self._zctx, P.MAX_MESSAGE_BYTES)
        self._guard: CurveGuard | None = None
        self._spawn_keys: ClientKeys | None = None  # the pool's own workers' key pair (CURVE only)
        self.offences: dict[bytes, int] = {}  # bad messages per peer identity
        # Hand-started workers dropped because their heartbeats stopped (a link down, a paused process), by
        # connection, with the episodes they had: one heard from again on that connection rejoins (_rejoin).
        self._silent: dict[bytes, tuple[WorkerHandle, set[str]]] = {}
        self.dropped_messages = 0
        # Frames that came inline from a worker whose ring is mapped: its ring was full (or the frame bigger than a
        # slot), so the frame was copied through the socket; a run that counts many needs more slots per worker.
        self.inline_frames = 0
        self.fatal: BaseException | None = None  # set when the receive loop itself broke
        self._tmpdir: tempfile.TemporaryDirectory[str] | None = None
        self.endpoint = ""
        self.workers: dict[str, WorkerHandle] = {}
        self._by_identity: dict[bytes, WorkerHandle] = {}
        self._req_ids = itertools.count(1)
        self._worker_ids = itertools.count(0)
        self._capacity = asyncio.Condition()
        self._tasks: set[asyncio.Task[Any]] = set()
        self._closing = False
        self.restarts = 0
        self.peak_browser_pss = 0  # the most the live workers' reported browser PSS came to at once (bytes)
        self.broken: str | None = None  # set when workers keep dying at start-up
        self._failed_starts = 0
        # (kind, message) of every event, besides the log (a worker dropped, silent or refused; a bad message).
        self.on_event: Callable[[str, str], None] | None = None

    # --- lifecycle ------------------------------------------------------------------------------
    async def start(self) -> None:
        """Bind the socket, start the workers and wait until each has said hello. A start that fails closes the
        pool again (workers, socket, context): a pool left for the garbage collector could block in zmq's
        context termination wherever the collector happens to run."""
        try:
            await self._start()
        except BaseException:
            await self.close()
            raise

    async def _start(self) -> None:
        self._secure_socket()
        # What engines killed before they could clean up left behind (never a live engine's).
        reaped = reap_stale()
        if reaped.segments or reaped.tmp_dirs:
            self._emit("reaped", f"removed {len(reaped.segments)} shared-memory segments and "
                                 f"{len(reaped.tmp_dirs)} temporary directories of engines that no longer run")
        # Private (0700) and named after this engine (pid and start time), so that the reaper of a later engine
        # can tell it is stale: the ipc socket and the spawned workers' temp directories live here.
        # ignore_cleanup_errors: a worker's Chromium killed at close may still be writing its profile there.
        self._tmpdir = tempfile.TemporaryDirectory(prefix=self.instance.tmp_prefix(), ignore_cleanup_errors=True)
        if self.cfg.listen:
            self.endpoint = self._router.bind(self.cfg.listen)
        else:
            self.endpoint = self._router.bind(f"ipc://{self._tmpdir.name}/pool.sock")
        self._spawn_task(self._recv_loop())
        self._spawn_task(self._watchdog())
        if self.cfg.spawn:
            for _ in range(self.cfg.workers):
                await self._spawn_worker()
        try:
            await self.wait_for_workers(self.cfg.workers, self.cfg.start_timeout_s)
        except TimeoutError:
            raise PoolError(f"browser workers did not start within {self.cfg.start_timeout_s:g} s "
                            f"(Chromium at {self.cfg.worker.chromium_path}?)") from None
        if self.broken:
            raise PoolError(f"browser workers cannot start: {self.broken}")

    def _secure_socket(self) -> None:  # called from start(), on the event loop
        """CURVE on the socket when keys are given; tcp without them only with ``insecure``."""
        keys = self.cfg.server_keys
        if keys is None:
            if (self.cfg.listen or "").startswith("tcp://") and not self.cfg.insecure:
                raise PoolError(f"the worker socket {self.cfg.listen} is on tcp: give it CURVE keys "
                                "(PoolConfig.server_keys) or accept any peer with PoolConfig.insecure")
            return
        loop = asyncio.get_running_loop()  # refusals are reported from the ZAP handler's thread
        self._guard = CurveGuard(self._zctx, keys,
                                 on_refused=lambda m: loop.call_soon_threadsafe(self._emit, "auth", m))
        self._guard.start()
        self._spawn_keys = ClientKeys.ephemeral(keys.public)
        self._guard.add(self._spawn_keys.public)
        keys.apply(self._router.sock)

    async def wait_for_workers(self, n: int, timeout: float) -> None:
        """Wait until at least ``n`` workers are alive (or the pool gave up on starting them)."""
        async with asyncio.timeout(timeout), self._capacity:
            await self._capacity.wait_for(lambda: self.broken or self.fatal or len(self.alive_workers()) >= n)

    async def close(self) -> None:
        """Shut every worker down, then the socket; unlink any segment left behind. A second call does nothing."""
        if self._zctx.closed:
            return
        self._closing = True
        for h in self.workers.values():
            if h.identity and self._by_identity.get(h.identity) is h:  # alive, or taken back and not yet leased to
                with contextlib.suppress(zmq.ZMQError):
                    self._router.send(h.identity, P.encode(P.Shutdown()))
            elif h.proc is not None and h.proc.returncode is None:
                # Still starting (no hello yet): it cannot hear Shutdown; SIGTERM makes it kill its browser and go.
                with contextlib.suppress(ProcessLookupError):
                    h.proc.terminate()
        procs = [h.proc for h in self.workers.values() if h.proc and h.proc.returncode is None]
        if procs:
            _, pending = await asyncio.wait([asyncio.ensure_future(p.wait()) for p in procs], timeout=15)
            for p in procs:
                if p.returncode is None:
                    with contextlib.suppress(ProcessLookupError):
                        p.kill()
            if pending:
                await asyncio.wait(pending, timeout=5)
        for t in list(self._tasks):
            t.cancel()
        for h in self.workers.values():
            if h.proc is not None and h.proc.returncode is None:  # restarted by a supervisor as the close began
                with contextlib.suppress(ProcessLookupError):
                    h.proc.kill()
            self._fail_worker(h, "the pool was closed")
            if h.reader:
                h.reader.close()
            self._unlink_ring(h)
        self._router.close()
        if self._guard is not None:
            self._guard.stop()
        self._zctx.destroy(linger=0)  # closes any socket still open instead of waiting on it forever
        if self._tmpdir:
            self._tmpdir.cleanup()

    def alive_workers(self) -> list[WorkerHandle]:
        return [h for h in self.workers.values() if h.alive]

    # --- episodes ---------------------------------------------------------------------------------
    async def lease(self, episode_id: str) -> BrowserSession:
        """Wait for a worker with room for one more episode and reserve it."""
        async with self._capacity:
            while True:
                if self.fatal is not None:
                    raise WorkerLost(f"the browser pool failed: {self.fatal!r}")
                if self.broken and not self.alive_workers():
                    raise WorkerLost(f"no browser worker is available: {self.broken}")
                candidates = [h for h in self.alive_workers()
                              if not h.draining and len(h.episodes) < self.cfg.max_episodes_per_worker]
                if candidates:
                    h = min(candidates, key=lambda w: len(w.episodes))
                    h.episodes.add(episode_id)
                    return BrowserSession(self, h, episode_id)
                if self.alive_workers():
                    await self._capacity.wait()  # room comes back as episodes end
                    continue
                # No worker at all: a spawned one is replaced within seconds and a hand-started one may come back,
                # but not waited for forever (a run on hand-started workers that all died would never end).
                try:
                    async with asyncio.timeout(self.cfg.start_timeout_s):
                        await self._capacity.wait_for(lambda: self.alive_workers() or self.broken or self.fatal)
                except TimeoutError:
                    raise WorkerLost(f"no browser worker was alive for {self.cfg.start_timeout_s:g} s") from None

    def _capacity_changed(self) -> None:
        async def notify() -> None:
            async with self._capacity:
                self._capacity.notify_all()
        self._spawn_task(notify())

    # --- memory -------------------------------------------------------------------------------------
    @property
    def browser_pss(self) -> int:
        """The live workers' browser PSS in bytes, as their last heartbeats report it (workers on any host)."""
        return sum(h.browser_pss for h in self.workers.values() if h.alive)

    def browser_pss_bytes(self) -> int:
        """PSS of the live workers' Chromium process trees read now from /proc (workers this pool spawned; blocking:
        call from a thread). For measurements: the run's own figures come from the heartbeats (:attr:`browser_pss`)."""
        return sum(tree_pss_bytes(h.browser_pid) for h in self.alive_workers() if h.browser_pid)

    def _spawn_task(self, coro: Any) -> None:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _emit(self, kind: str, message: str) -> None:
        """Log an event (the command line shows warnings on stderr) and hand it to ``on_event``."""
        log.log(logging.INFO if kind in _REPAIR_EVENTS else logging.WARNING, "browser pool: %s", message)
        if self.on_event:
            self.on_event(kind, message)
