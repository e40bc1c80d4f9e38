"""The engine side of the browser pool: a ROUTER socket, K worker processes, supervision.

Each worker gets a bounded number of in-flight operations (a FIFO semaphore: the level-2 queue of
the engine), episodes are placed on the worker with the fewest live ones, and a worker that dies is
replaced while its episodes fail with :class:`WorkerLost`.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import os
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

import zmq
import zmq.asyncio

from browserpool import protocol as P
from browserpool.config import WorkerConfig
from browserpool.memory import tree_pss_bytes
from browserpool.shm import SlotReader, unlink_segment

MAX_FAILED_STARTS = 3


class PoolError(RuntimeError):
    """Base of the pool's errors."""


class WorkerLost(PoolError):
    """The worker (or its browser) serving an episode died."""


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
    proc: asyncio.subprocess.Process | None = None
    reader: SlotReader | None = None
    shm_name: str | None = None
    browser_pid: int = 0
    pid: int = 0
    alive: bool = False
    episodes: set[str] = field(default_factory=set)
    futures: dict[int, asyncio.Future[Any]] = field(default_factory=dict)
    pending_release: list[list[int]] = field(default_factory=list)
    last_seen: float = 0.0
    ready: asyncio.Event = field(default_factory=asyncio.Event)


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
                   probe_js: str | None = None) -> tuple[P.Observation, Frame]:
        """Open a page for the episode at ``url``; returns the first observation.

        ``som``: Set-of-Marks mode for the whole episode: every observation lists the visible interactive
        elements (``Observation.elements``) and its frame shows them as numbered boxes.
        ``setup_js``: a script the worker runs once after the first load (a returned promise is awaited);
        the page then settles again before the first screenshot. A script that throws fails the open
        (BrowserOpError, kind ``refused``). Used to start a page's own episode (MiniWoB's task generator).
        ``probe_js``: an expression evaluated after the settle of every observation of the episode (the
        open and every act); its JSON value comes back in ``Observation.probe`` (``{"error": ...}`` when it
        threw), e.g. a page's own reward and done flag."""
        args: dict[str, Any] = {"url": url}
        # Each only when set: a plain open's request is unchanged.
        if som:
            args["som"] = True
        if setup_js is not None:
            args["setup_js"] = setup_js
        if probe_js is not None:
            args["probe_js"] = probe_js
        async with self.handle.opens:
            body = await self.pool.request(self.handle, "open", self.episode_id, args)
        return self._observation(body)

    async def act(self, action: P.BrowserAction) -> tuple[P.Observation, Frame]:
        """Carry out one action and observe the settled page."""
        body = await self.pool.request(self.handle, "act", self.episode_id, {"action": action.to_wire()})
        return self._observation(body)

    async def locate(self, selector: str) -> dict[str, Any]:
        """Where a CSS selector's first visible match is in the viewport (oracle access for scripts)."""
        return await self.pool.request(self.handle, "locate", self.episode_id, {"selector": selector})

    async def evaluate(self, exprs: list[str]) -> list[Any]:
        """Evaluate JS expressions in the page (for programmatic reward checks)."""
        return await self.pool.request(self.handle, "evaluate", self.episode_id, {"exprs": exprs})

    async def close(self) -> None:
        """Give the page's context back to the worker (state cleared); never raises."""
        if self.closed:
            return
        self.closed = True
        self.handle.episodes.discard(self.episode_id)
        self.pool._capacity_changed()
        if self.handle.alive:
            with contextlib.suppress(PoolError):
                await self.pool.request(self.handle, "close", self.episode_id, {})

    def _observation(self, body: list[Any]) -> tuple[P.Observation, Frame]:
        obs = P.Observation.from_wire(body)
        if obs.frame is not None and self.handle.reader is not None:
            return obs, Frame(self.handle, obs.frame, self.handle.reader.view(obs.frame))
        return obs, Frame(None, None, memoryview(obs.frame_bytes or b""))


class BrowserPool:
    """Starts, feeds and supervises the browser workers."""

    def __init__(self, cfg: PoolConfig) -> None:
        self.cfg = cfg
        self._zctx = zmq.asyncio.Context()
        self._sock = self._zctx.socket(zmq.ROUTER)
        self._sock.setsockopt(zmq.LINGER, 0)
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
        self.broken: str | None = None  # set when workers keep dying at start-up
        self._failed_starts = 0
        self.on_event: Callable[[str, str], None] | None = None  # (kind, message) for logs

    # --- lifecycle ------------------------------------------------------------------------------
    async def start(self) -> None:
        """Bind the socket, start the workers and wait until each has said hello."""
        if self.cfg.listen:
            self._sock.bind(self.cfg.listen)
            self.endpoint = self._sock.getsockopt(zmq.LAST_ENDPOINT).decode()
        else:
            self._tmpdir = tempfile.TemporaryDirectory(prefix="webgym-")
            self.endpoint = f"ipc://{self._tmpdir.name}/pool.sock"
            self._sock.bind(self.endpoint)
        self._spawn_task(self._recv_loop())
        self._spawn_task(self._watchdog())
        if self.cfg.spawn:
            for _ in range(self.cfg.workers):
                await self._spawn_worker()
        try:
            await self.wait_for_workers(self.cfg.workers, self.cfg.start_timeout_s)
        except TimeoutError:
            await self.close()
            raise PoolError(f"browser workers did not start within {self.cfg.start_timeout_s:g} s "
                            f"(Chromium at {self.cfg.worker.chromium_path}?)") from None
        if self.broken:
            await self.close()
            raise PoolError(f"browser workers cannot start: {self.broken}")

    async def wait_for_workers(self, n: int, timeout: float) -> None:
        """Wait until at least ``n`` workers are alive (or the pool gave up on starting them)."""
        async def enough() -> None:
            async with self._capacity:
                await self._capacity.wait_for(lambda: self.broken or len(self.alive_workers()) >= n)
        await asyncio.wait_for(enough(), timeout)

    async def close(self) -> None:
        """Shut every worker down, then the socket; unlink any segment left behind."""
        self._closing = True
        for h in self.workers.values():
            if h.alive and h.identity:
                with contextlib.suppress(zmq.ZMQError):
                    await self._sock.send_multipart([h.identity, P.encode(P.Shutdown())])
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
            self._fail_worker(h, "the pool was closed")
            if h.reader:
                h.reader.close()
            if h.shm_name:
                unlink_segment(h.shm_name)
        self._sock.close(0)
        self._zctx.term()
        if self._tmpdir:
            self._tmpdir.cleanup()

    def alive_workers(self) -> list[WorkerHandle]:
        return [h for h in self.workers.values() if h.alive]

    # --- episodes ---------------------------------------------------------------------------------
    async def lease(self, episode_id: str) -> BrowserSession:
        """Wait for a worker with room for one more episode and reserve it."""
        async with self._capacity:
            while True:
                if self.broken and not self.alive_workers():
                    raise WorkerLost(f"no browser worker is available: {self.broken}")
                candidates = [h for h in self.alive_workers()
                              if len(h.episodes) < self.cfg.max_episodes_per_worker]
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

    async def request(self, h: WorkerHandle, op: str, episode_id: str, args: dict[str, Any]) -> Any:
        """Send one request to a worker and wait for its reply (through the worker's FIFO queue)."""
        async with h.ops:
            if not h.alive:
                raise WorkerLost(f"browser worker {h.worker_id} is gone")
            req_id = next(self._req_ids)
            fut: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
            h.futures[req_id] = fut
            release, h.pending_release = h.pending_release, []
            msg = P.Request(req_id, op, episode_id, args, release)
            try:
                await self._sock.send_multipart([h.identity, P.encode(msg)], copy=False)
                reply: P.Reply = await fut
            finally:
                h.futures.pop(req_id, None)
        if reply.ok:
            return reply.body
        if reply.error_kind == P.ERR_BROWSER:
            raise WorkerLost(f"browser of worker {h.worker_id} died: {reply.error}")
        raise BrowserOpError(reply.error_kind or P.ERR_INTERNAL, reply.error or "unknown error")

    # --- memory -------------------------------------------------------------------------------------
    def browser_pss_bytes(self) -> int:
        """PSS of all live workers' Chromium process trees (blocking: call from a thread)."""
        return sum(tree_pss_bytes(h.browser_pid) for h in self.alive_workers())

    # --- workers -------------------------------------------------------------------------------------
    async def _spawn_worker(self) -> WorkerHandle:
        wid = f"w{next(self._worker_ids)}"
        wcfg = replace(self.cfg.worker, endpoint=self.endpoint, worker_id=wid)
        h = self._new_handle(wid)
        stderr = open(self.cfg.log_path, "ab") if self.cfg.log_path else None  # noqa: SIM115
        try:
            h.proc = await asyncio.create_subprocess_exec(
                sys.executable, "-m", "browserpool.worker", "--config", wcfg.to_json(),
                stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.DEVNULL, stderr=stderr)
        finally:
            if stderr:
                stderr.close()
        self._spawn_task(self._supervise(h))
        return h

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
                    self._fail_worker(h, f"browser worker {h.worker_id} stopped sending heartbeats")

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
        if h.shm_name and h.proc is not None:
            unlink_segment(h.shm_name)
        if was_alive:
            self._capacity_changed()

    async def _recv_loop(self) -> None:
        while True:
            identity, payload = await self._sock.recv_multipart()
            try:
                msg = P.decode(payload)
            except P.ProtocolError as exc:
                self._emit("protocol", str(exc))
                continue
            h = self._by_identity.get(identity)
            if isinstance(msg, P.Reply):
                if h is not None:
                    h.last_seen = time.monotonic()
                    fut = h.futures.get(msg.req_id)
                    if fut is not None and not fut.done():
                        fut.set_result(msg)
            elif isinstance(msg, P.Heartbeat):
                if h is not None:
                    h.last_seen = time.monotonic()
            elif isinstance(msg, P.Hello):
                await self._on_hello(identity, msg)

    async def _on_hello(self, identity: bytes, msg: P.Hello) -> None:
        if msg.protocol != P.PROTOCOL_VERSION:
            self._emit("protocol", f"worker {msg.worker_id} speaks protocol {msg.protocol}, "
                                   f"engine {P.PROTOCOL_VERSION}; ignored")
            return
        h = self.workers.get(msg.worker_id)
        if h is None or h.alive:  # a worker started by hand (or a clashing id): register it anew
            wid = msg.worker_id if h is None else f"{msg.worker_id}-{next(self._worker_ids)}"
            h = self._new_handle(wid)
        h.identity, h.pid, h.browser_pid = identity, msg.pid, msg.browser_pid
        h.shm_name, h.last_seen = msg.shm_name, time.monotonic()
        use_shm = False
        if msg.shm_name and self.cfg.shared_memory:
            try:
                h.reader = SlotReader(msg.shm_name, msg.slot_size)
                use_shm = True
            except (FileNotFoundError, OSError):
                h.reader = None  # another host: frames come inline
        await self._sock.send_multipart([identity, P.encode(P.Welcome(use_shm))])
        self._by_identity[identity] = h
        h.alive = True
        h.ready.set()
        self._capacity_changed()

    def _spawn_task(self, coro: Any) -> None:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _emit(self, kind: str, message: str) -> None:
        if self.on_event:
            self.on_event(kind, message)
