"""The engine side of the browser pool: a ROUTER socket, K worker processes, supervision.

Each worker gets a bounded number of in-flight operations (a FIFO semaphore: the level-2 queue of
the engine), episodes are placed on the worker with the fewest live ones, and a worker that dies is
replaced while its episodes fail with :class:`WorkerLost`.

Every peer is untrusted until proven otherwise: on tcp the socket is a CURVE server whose ZAP handler
lets in only allowed keys (see ``auth.py``); every message is size-capped by ZeroMQ and decoded into a
validated struct; a peer that keeps sending bad messages is banned; every request has a deadline, so a
worker that heartbeats but never answers costs its episodes an error, never a hang; and a worker may
only point the engine at shared memory under the engine's naming scheme (``instance.py``).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import os
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any, get_args

import psutil
import zmq
import zmq.asyncio

from browserpool import protocol as P
from browserpool.auth import CURVE_ENV, ClientKeys, CurveGuard, ServerKeys
from browserpool.childenv import worker_env
from browserpool.config import WorkerConfig
from browserpool.instance import SHM_NAME_RE, Instance
from browserpool.lifeline import engine_arg
from browserpool.memory import tree_pss_bytes
from browserpool.netpolicy import engine_sites
from browserpool.reaper import reap_stale
from browserpool.router import RouterSocket
from browserpool.shm import SlotReader, unlink_segment
from browserpool.upstream import env_names

log = logging.getLogger(__name__)
# Events that report a repair, not a fault: logged as information, the others as warnings.
_REPAIR_EVENTS = frozenset({"reaped", "worker_rejoined"})

MAX_FAILED_STARTS = 3
MAX_SILENT = 256  # workers dropped for silence whose connection is remembered (they may speak again)
MAX_ABANDONED = 4096  # abandoned requests remembered per worker (WorkerHandle.abandoned)
_OBSERVING_OPS = frozenset({P.Op.OPEN, P.Op.ACT, P.Op.OBSERVE})  # the ops whose reply may hold a screenshot slot


class PoolError(RuntimeError):
    """Base of the pool's errors."""


class WorkerLost(PoolError):
    """The worker (or its browser) serving an episode died."""


class RequestTimeout(WorkerLost):
    """A worker did not answer a request within its deadline (the episode may be retried elsewhere)."""


class BrowserOpError(PoolError):
    """A worker answered an operation with an error; ``kind`` is one of protocol.ERR_*."""

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind


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


class Frame:
    """A screenshot received from a worker: a zero-copy view until :meth:`release`."""

    __slots__ = ("_handle", "_ref", "view")

    def __init__(self, handle: WorkerHandle | None, ref: P.FrameRef | None, view: memoryview) -> None:
        self._handle = handle
        self._ref = ref
        self.view = view

    def release(self) -> None:
        """Hand the slot back to its worker (idempotent)."""
        if self._ref is not None and self._handle is not None:
            self.view.release()
            self._handle.pending_release.append([self._ref.slot, self._ref.generation])
            self._ref = None

    def __enter__(self) -> Frame:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


@dataclass
class WorkerHandle:
    """What the engine knows about one connected worker."""

    worker_id: str
    ops: asyncio.Semaphore  # in-flight operations (PoolConfig.ops_per_worker)
    opens: asyncio.Semaphore  # in-flight page loads (PoolConfig.opens_per_worker)
    identity: bytes | None = None
    proc: asyncio.subprocess.Process | None = None  # None: a worker started by hand (maybe on another host)
    reader: SlotReader | None = None
    shm_name: str | None = None
    slot_count: int = 0
    browser_pid: int = 0  # only for workers this pool spawned (verified to be their descendant)
    pid: int = 0
    public_key: bytes | None = None  # the CURVE key the worker authenticated with
    alive: bool = False
    draining: bool = False  # the worker asked for no new episodes
    timeouts: int = 0  # missed request deadlines in a row
    episodes: set[str] = field(default_factory=set)
    futures: dict[int, asyncio.Future[Any]] = field(default_factory=dict)
    # Requests for an observation that timed out or were cancelled before their reply (insertion order; at most
    # MAX_ABANDONED): their late reply's screenshot slot is given back.
    abandoned: dict[int, None] = field(default_factory=dict)
    pending_release: list[list[int]] = field(default_factory=list)
    last_seen: float = 0.0
    ready: asyncio.Event = field(default_factory=asyncio.Event)
    wire_id: str = ""  # the id the worker itself uses in its messages
    hello: P.Hello | None = None  # what it said when it joined (a worker heard from again after silence rejoins)
    contexts: int = 0  # live episodes the worker reports in its heartbeats
    browser_pss: int = 0  # its browser's PSS in bytes, as its heartbeats report it (0: no reading yet)


class BrowserSession:
    """One episode's page on one worker; every call is one request/reply."""

    def __init__(self, pool: BrowserPool, handle: WorkerHandle, episode_id: str) -> None:
        self.pool = pool
        self.handle = handle
        self.episode_id = episode_id
        self.closed = False

    @property
    def worker_id(self) -> str:
        return self.handle.worker_id

    async def open(self, url: str, som: bool = False, setup_js: str | None = None,
                   probe_js: str | None = None, shot: bool = True, som_elements: int = 0
                   ) -> tuple[P.Observation, Frame]:
        """Open a page for the episode at ``url``; returns the first observation.

        ``som``: Set-of-Marks mode for the whole episode: every observation lists the visible interactive
        elements (``Observation.elements``) and its frame shows them as numbered boxes. ``som_elements``: list
        (and draw) at most this many (0: the worker's own cap, ``WorkerConfig.som_max_elements``), so that the
        frame shows no box whose id the caller drops from the list.
        ``setup_js``: a script the worker runs once after the first load (a returned promise is awaited);
        the page then settles again before the first screenshot. A script that throws fails the open
        (BrowserOpError, kind ``refused``). Used to start a page's own episode (MiniWoB's task generator).
        ``probe_js``: an expression evaluated after the settle of every observation of the episode (the
        open and every act); its JSON value comes back in ``Observation.probe`` (``{"error": ...}`` when it
        threw), e.g. a page's own reward and done flag. ``shot`` False: no screenshot (the frame is empty)."""
        if type(som_elements) is not int or som_elements < 0:
            raise BrowserOpError(P.ERR_REFUSED, f"som_elements must be a non-negative integer, not {som_elements!r}")
        operation = P.Open(url=url, som=som, som_elements=som_elements if som else 0, setup_js=setup_js,
                           probe_js=probe_js, shot=shot)
        async with self.handle.opens:
            body = await self.pool.request(self.handle, self.episode_id, operation)
        return self._observation(body)

    async def act(self, action: P.BrowserAction, shot: bool = True) -> tuple[P.Observation, Frame]:
        """Carry out one action and observe the settled page. ``shot`` False: no screenshot (the frame is
        empty), for a client that asks for one only when it wants it (:meth:`observe`)."""
        return self._observation(await self.pool.request(self.handle, self.episode_id, P.Act(action=action, shot=shot)))

    async def observe(self, som: bool | None = None, fmt: P.ImageFormat = "jpeg") -> tuple[P.Observation, Frame]:
        """Observe the page as it is now, without an action: whatever is still loading is waited for (no quiet
        period). ``som``: Set-of-Marks for this observation (None: the episode's mode); ``fmt``: jpeg or png."""
        if fmt not in get_args(P.ImageFormat):
            raise BrowserOpError(P.ERR_REFUSED, f"screenshot format must be jpeg or png, not {str(fmt)[:20]!r}")
        operation = P.Observe(som=som, format=fmt)
        return self._observation(await self.pool.request(self.handle, self.episode_id, operation))

    async def locate(self, selector: str) -> dict[str, Any]:
        """Where a CSS selector's first visible match is in the viewport (oracle access for scripts)."""
        return P.decode_body(await self.pool.request(self.handle, self.episode_id, P.Locate(selector=selector)))

    async def evaluate(self, exprs: list[str]) -> list[Any]:
        """Evaluate JS expressions in the page (for programmatic reward checks)."""
        return P.decode_body(await self.pool.request(self.handle, self.episode_id, P.Evaluate(exprs=exprs)))

    async def close(self) -> None:
        """Give the page's context back to the worker (state cleared); never raises."""
        if self.closed:
            return
        self.closed = True
        self.handle.episodes.discard(self.episode_id)
        self.pool._capacity_changed()
        if self.handle.alive:
            with contextlib.suppress(PoolError):
                await self.pool.request(self.handle, self.episode_id, P.Close())

    def _observation(self, body: Any) -> tuple[P.Observation, Frame]:
        try:
            obs = P.decode_observation(body)
        except P.ProtocolError as exc:
            self.pool.offence(self.handle, f"a malformed observation: {exc}")
            raise WorkerLost(f"browser worker {self.worker_id} sent a malformed observation") from exc
        ref = obs.frame
        if ref is not None:
            h = self.handle
            if h.reader is None or ref.slot >= h.slot_count or ref.nbytes > h.reader.slot_size:
                # A slot this worker never announced: nothing in shared memory is read for it.
                self.pool.offence(h, f"a frame reference outside its ring ({ref})")
                raise WorkerLost(f"browser worker {self.worker_id} sent a frame reference outside its ring")
            return obs, Frame(h, ref, h.reader.view(ref))
        if obs.frame_bytes and self.handle.reader is not None:
            self.pool.inline_frames += 1
        return obs, Frame(None, None, memoryview(obs.frame_bytes or b""))


class BrowserPool:
    """Starts, feeds and supervises the browser workers."""

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
                await self._capacity.wait()

    def _capacity_changed(self) -> None:
        async def notify() -> None:
            async with self._capacity:
                self._capacity.notify_all()
        self._spawn_task(notify())

    async def request(self, h: WorkerHandle, episode_id: str, operation: P.AnyOperation) -> Any:
        """Send one request to a worker and wait for its reply (through the worker's FIFO queue), at most
        until the request's deadline (:meth:`deadline`): then RequestTimeout."""
        async with h.ops:
            if not h.alive:
                raise WorkerLost(f"browser worker {h.worker_id} is gone")
            req_id = next(self._req_ids)
            release, h.pending_release = h.pending_release, []
            try:
                data = _encoded(P.Request(req_id, episode_id, operation, release))
            except BrowserOpError:
                h.pending_release = release + h.pending_release  # returned with the next request
                raise
            fut: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
            h.futures[req_id] = fut
            # A timer on the reply's own future (asyncio.wait_for would wrap it in a second future and a task).
            op = operation.op
            timer = asyncio.get_running_loop().call_later(self.deadline(op), _time_out, fut)
            try:
                self._router.send(h.identity, data)
                reply: P.Reply = await fut
            except TimeoutError:
                self._request_timed_out(h, op)
                raise RequestTimeout(f"browser worker {h.worker_id} did not answer {op.value!r} within "
                                     f"{self.deadline(op):g} s") from None
            finally:
                timer.cancel()
                h.futures.pop(req_id, None)
                if op in _OBSERVING_OPS and not (fut.done() and not fut.cancelled() and fut.exception() is None):
                    _abandon(h, req_id)
        h.timeouts = 0
        if reply.ok:
            return reply.body
        if reply.error_kind == P.ERR_BROWSER:
            raise WorkerLost(f"browser of worker {h.worker_id} died: {reply.error}")
        raise BrowserOpError(reply.error_kind or P.ERR_INTERNAL, reply.error or "unknown error")

    def deadline(self, op: P.Op) -> float:
        """Seconds the engine waits for the answer to ``op``: the worker's own cap for it plus slack."""
        w = self.cfg.worker
        cap = w.open_timeout_s if op is P.Op.OPEN else w.settle_timeout_s
        return cap + 2 * w.screenshot_timeout_s + self.cfg.request_slack_s

    def _request_timed_out(self, h: WorkerHandle, op: P.Op) -> None:
        h.timeouts += 1
        self._emit("timeout",
                   f"browser worker {h.worker_id} missed the deadline of {op.value!r} ({h.timeouts} in a row)")
        if h.timeouts >= self.cfg.max_timeouts:
            self._drop_worker(h, f"browser worker {h.worker_id} missed {h.timeouts} request deadlines in a row")

    def offence(self, h: WorkerHandle | None, what: str, identity: bytes | None = None,
                public_key: bytes | None = None) -> None:
        """Count a bad message from a peer; after ``max_offences`` the peer is banned (its key refused from
        then on, its messages ignored) and, if it was a worker, dropped."""
        identity = identity if identity is not None else (h.identity if h else None)
        self.dropped_messages += 1
        if identity is None:
            return
        n = self.offences[identity] = self.offences.get(identity, 0) + 1
        name = h.worker_id if h else f"peer {identity.hex()}"
        self._emit("protocol", f"dropped a bad message from {name} ({n}/{self.cfg.max_offences}): {what}"[:500])
        if n < self.cfg.max_offences:
            return
        key = public_key if public_key is not None else (h.public_key if h else None)
        if key is not None and self._guard is not None:
            self._guard.ban(key)
        if h is not None:
            self._drop_worker(h, f"browser worker {h.worker_id} was disconnected after {n} bad messages")
        else:
            self._emit("protocol", f"peer {identity.hex()} is ignored from now on after {n} bad messages")

    def _drop_worker(self, h: WorkerHandle, reason: str) -> None:
        """Stop using a worker that misbehaves: its episodes fail (and may retry elsewhere); a worker this pool
        spawned is killed (and replaced by its supervisor)."""
        self._emit("worker_dropped", reason)
        self._fail_worker(h, reason)
        if h.proc is not None and h.proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                h.proc.kill()

    # --- memory -------------------------------------------------------------------------------------
    @property
    def browser_pss(self) -> int:
        """The live workers' browser PSS in bytes, as their last heartbeats report it (workers on any host)."""
        return sum(h.browser_pss for h in self.workers.values() if h.alive)

    def browser_pss_bytes(self) -> int:
        """PSS of the live workers' Chromium process trees read now from /proc (workers this pool spawned; blocking:
        call from a thread). For measurements: the run's own figures come from the heartbeats (:attr:`browser_pss`)."""
        return sum(tree_pss_bytes(h.browser_pid) for h in self.alive_workers() if h.browser_pid)

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

    async def _recv_loop(self) -> None:
        """Receive every worker message. Input can never end this loop; anything else that does fails the pool
        loudly (``fatal``): every waiting request and lease raises instead of waiting forever."""
        try:
            while True:
                for frames in await self._router.recv_batch():
                    try:
                        self._on_message(frames)
                    except Exception as exc:  # noqa: BLE001 - a message must never end the loop
                        self.offence(self._by_identity.get(frames[0].bytes), f"its message could not be handled: "
                                     f"{exc!r}", frames[0].bytes)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            if self._closing:
                return
            self.fatal = exc
            self._emit("fatal", f"the worker socket's receive loop failed: {exc!r}")
            for h in list(self.workers.values()):
                self._fail_worker(h, f"the browser pool failed: {exc!r}")
            self._capacity_changed()

    def _on_message(self, frames: list[zmq.Frame]) -> None:
        """Handle one message."""
        identity = frames[0].bytes
        if self.offences.get(identity, 0) >= self.cfg.max_offences:
            self.dropped_messages += 1  # a banned peer: not even decoded
            return
        h = self._by_identity.get(identity)
        if h is None and identity in self._silent:
            # A worker dropped for its silence speaks again on the same connection: it was cut off, not gone.
            h = self._rejoin(identity, _user_key(frames[-1]))
            if h is None:
                return
        if len(frames) != 2:
            self.offence(h, f"{len(frames) - 1} frames instead of 1", identity, _user_key(frames[-1]))
            return
        try:
            msg = P.decode_from_worker(frames[1].buffer)
        except P.ProtocolError as exc:
            self.offence(h, str(exc), identity, _user_key(frames[1]))
            return
        if isinstance(msg, P.Reply):
            if h is None:
                self.offence(None, "a reply from a peer that never said hello", identity, _user_key(frames[1]))
                return
            h.last_seen = time.monotonic()
            fut = h.futures.get(msg.req_id)
            if fut is not None and not fut.done():
                fut.set_result(msg)
            elif h.abandoned.pop(msg.req_id, 0) is None:  # a late answer to a request that timed out or was cancelled
                _release_late_frame(h, msg)
        elif isinstance(msg, P.Heartbeat):
            if h is None or msg.worker_id != h.wire_id:
                self.offence(h, "a heartbeat that names another worker", identity, _user_key(frames[1]))
                return
            h.last_seen = time.monotonic()
            h.contexts = msg.contexts
            if msg.browser_pss != h.browser_pss:
                h.browser_pss = msg.browser_pss
                self.peak_browser_pss = max(self.peak_browser_pss, self.browser_pss)
            if h.proc is not None and msg.browser_pid and msg.browser_pid != h.browser_pid:
                h.browser_pid = _descendant_pid(h.proc.pid, msg.browser_pid)  # a recycled browser
            if msg.draining != h.draining:
                h.draining = msg.draining
                self._capacity_changed()
        elif isinstance(msg, P.Hello):
            self._on_hello(identity, msg, _user_key(frames[1]))

    def _on_hello(self, identity: bytes, msg: P.Hello, key: bytes | None) -> None:
        if msg.protocol != P.PROTOCOL_VERSION:
            self._emit("protocol", f"worker {msg.worker_id} speaks protocol {msg.protocol}, "
                                   f"engine {P.PROTOCOL_VERSION}; ignored")
            return
        if identity in self._by_identity:
            self.offence(self._by_identity[identity], "a second hello on one connection", identity, key)
            return
        h = self.workers.get(msg.worker_id)
        if h is None or h.alive or not self._is_spawned_peer(h, msg, key):
            # A worker started by hand (or a clashing or forged id): registered anew, never as one of ours.
            wid = msg.worker_id if h is None else f"{msg.worker_id}-{next(self._worker_ids)}"
            h = self._new_handle(wid)
        h.wire_id, h.hello = msg.worker_id, msg
        h.identity, h.pid, h.public_key, h.last_seen = identity, msg.pid, key, time.monotonic()
        h.browser_pid = _descendant_pid(h.proc.pid, msg.browser_pid) if h.proc is not None else 0
        h.reader, h.shm_name, h.slot_count = self._map_ring(h, msg), msg.shm_name, msg.slot_count
        welcome = P.Welcome(h.reader is not None, self._net_settings())
        self._router.send(identity, P.encode(welcome))
        self._by_identity[identity] = h
        h.alive = True
        h.ready.set()
        self._capacity_changed()

    def _rejoin(self, identity: bytes, key: bytes | None) -> WorkerHandle | None:
        """Take back a hand-started worker that was dropped for its silence and is heard from again on the same
        connection (so authenticated as before), under a new id, as a new worker joining would be: its episodes
        have ended (with a retry or an error record), and their pages still open on it are closed before it gets
        new ones. Its messages in the meantime (late replies) are not offences. None: not taken back (the key
        differs from the one it joined with)."""
        old, orphans = self._silent.pop(identity)
        if old.hello is None or key != old.public_key:
            return None
        h = self._new_handle(f"{old.wire_id}-{next(self._worker_ids)}")
        h.wire_id, h.hello, h.identity, h.pid, h.public_key = old.wire_id, old.hello, identity, old.pid, key
        h.reader, h.shm_name, h.slot_count = self._map_ring(h, old.hello), old.hello.shm_name, old.hello.slot_count
        h.pending_release, old.pending_release = old.pending_release, []  # slots of its ring released since
        h.abandoned = old.abandoned  # its late replies to requests failed while it was silent give their slots back
        h.last_seen = time.monotonic()
        self._by_identity[identity] = h  # not alive (leased nothing) until the closes below are on their way
        self._spawn_task(self._close_orphans(h, orphans))
        self._emit("worker_rejoined", f"browser worker {old.worker_id} is heard from again after its silence: "
                                      f"back as {h.worker_id}, {len(orphans)} pages of its ended episodes closed")
        return h

    async def _close_orphans(self, h: WorkerHandle, episodes: set[str]) -> None:
        """Close the pages of episodes that ended while the worker was cut off, then let it take episodes: the
        worker handles its requests in order of arrival, so a close always comes before any new open."""
        with contextlib.suppress(zmq.ZMQError):
            for episode_id in sorted(episodes):
                close = P.Request(next(self._req_ids), episode_id, P.Close())
                self._router.send(h.identity, P.encode(close))  # its answer is not waited for
        if self._by_identity.get(h.identity or b"") is h and not self._closing:
            h.alive = True
            h.ready.set()
            self._capacity_changed()

    def _net_settings(self) -> P.NetSettings:
        """The network policy every worker's pages follow: the pool's worker configuration's, with the bundled-site
        servers this process runs exempt."""
        w = self.cfg.worker
        return P.NetSettings(w.net_policy, w.allow_private_network, list(w.net_allow), list(w.net_deny),
                             list(dict.fromkeys([*w.net_exempt, *engine_sites()])), dict(w.net_hosts))

    def _is_spawned_peer(self, h: WorkerHandle, msg: P.Hello, key: bytes | None) -> bool:
        """Whether a hello that names one of this pool's spawned workers really comes from it."""
        if h.proc is None:
            return False
        if self._spawn_keys is not None:
            return key == self._spawn_keys.public
        return msg.pid == h.proc.pid

    def _map_ring(self, h: WorkerHandle, msg: P.Hello) -> SlotReader | None:
        """Map the worker's screenshot ring, when it names one that may be mapped; else frames come inline."""
        name = msg.shm_name
        if not (name and self.cfg.shared_memory and msg.slot_count and msg.slot_size):
            return None
        ok = self.instance.owns_shm(name, h.worker_id) if h.proc is not None else bool(SHM_NAME_RE.match(name))
        if not ok:
            self._emit("protocol", f"worker {h.worker_id} named shared memory {name[:80]!r} outside the engine's "
                                   "naming scheme; its frames come inline")
            return None
        try:
            reader = SlotReader(name, msg.slot_size)
        except (OSError, ValueError):
            return None  # another host: frames come inline
        if reader.size < msg.slot_count * msg.slot_size:
            reader.close()
            self._emit("protocol", f"worker {h.worker_id}'s ring {name!r} is smaller than it claims")
            return None
        return reader

    def _spawn_task(self, coro: Any) -> None:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _emit(self, kind: str, message: str) -> None:
        """Log an event (the command line shows warnings on stderr) and hand it to ``on_event``."""
        log.log(logging.INFO if kind in _REPAIR_EVENTS else logging.WARNING, "browser pool: %s", message)
        if self.on_event:
            self.on_event(kind, message)


def _abandon(h: WorkerHandle, req_id: int) -> None:
    """Note a request for an observation that will get no one's attention when its reply comes."""
    h.abandoned[req_id] = None
    if len(h.abandoned) > MAX_ABANDONED:  # replies that never came (a worker cut off): forget the oldest
        del h.abandoned[next(iter(h.abandoned))]


def _release_late_frame(h: WorkerHandle, reply: P.Reply) -> None:
    """Give back the screenshot slot of an abandoned request's reply: its worker keeps the slot until the engine
    releases it, so each cancelled or timed-out observation would take one slot of the ring for good (and a
    ring run dry sends every frame through the socket)."""
    if not reply.ok or reply.body is None:
        return
    try:
        obs = P.decode_observation(reply.body)
    except P.ProtocolError:  # a broken reply: nothing to give back
        return
    if obs.frame is not None:
        h.pending_release.append([obs.frame.slot, obs.frame.generation])


def _encoded(req: P.Request) -> bytes:
    """``req`` as bytes, or a BrowserOpError for a request no worker could receive: an argument msgpack cannot carry
    (an int over 2**64), or a message over the cap (the worker's socket would drop it and close the connection, and
    the request would only time out)."""
    try:
        data = P.encode(req)
    except (TypeError, ValueError, OverflowError) as exc:
        raise BrowserOpError(P.ERR_REFUSED, f"{req.op}: an argument cannot be sent: {exc}") from None
    if len(data) > P.MAX_MESSAGE_BYTES:
        raise BrowserOpError(P.ERR_TOO_LARGE, f"the request ({len(data):,} bytes) is over the "
                             f"{P.MAX_MESSAGE_BYTES:,}-byte cap of a message: its {req.op} argument is too large")
    return data


def _time_out(fut: asyncio.Future[Any]) -> None:
    if not fut.done():
        fut.set_exception(TimeoutError())


def _user_key(frame: zmq.Frame) -> bytes | None:
    """The CURVE public key (z85) the peer authenticated with, from the ZAP User-Id; None without CURVE."""
    try:
        uid = frame.get("User-Id")
    except zmq.ZMQError:
        return None
    return uid.encode() if uid else None


def _descendant_pid(root: int, pid: int) -> int:
    """``pid`` when it is a descendant of process ``root`` (a spawned worker's own Chromium), else 0."""
    if pid <= 0:
        return 0
    try:
        return pid if any(p.pid == root for p in psutil.Process(pid).parents()) else 0
    except psutil.Error:
        return 0
