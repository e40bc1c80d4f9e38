"""The pool's messages: a request sent to its worker and its reply awaited within a deadline, and every message
from the workers received, checked and routed (replies to their requests, heartbeats to their worker's handle,
hellos to the trust checks) (``Routing``, a part of :class:`browserpool.pool.BrowserPool`)."""

from __future__ import annotations

import asyncio
import itertools
import time
from typing import TYPE_CHECKING, Any

import zmq

from browserpool import protocol as P
from browserpool.pool_errors import BrowserOpError, RequestTimeout, WorkerLost
from browserpool.router import RouterSocket
from browserpool.trust import _descendant_pid, _user_key
from browserpool.worker_handle import WorkerHandle

if TYPE_CHECKING:
    from browserpool.pool import PoolConfig

MAX_ABANDONED = 4096  # abandoned requests remembered per worker (WorkerHandle.abandoned)
_OBSERVING_OPS = frozenset({P.Op.OPEN, P.Op.ACT, P.Op.OBSERVE})  # the ops whose reply may hold a screenshot slot


class Routing:
    """Requests, replies and the receive loop (see the module docstring)."""

    if TYPE_CHECKING:  # what BrowserPool provides
        cfg: PoolConfig
        fatal: BaseException | None
        workers: dict[str, WorkerHandle]
        offences: dict[bytes, int]
        dropped_messages: int
        peak_browser_pss: int
        _router: RouterSocket
        _req_ids: itertools.count[int]
        _by_identity: dict[bytes, WorkerHandle]
        _silent: dict[bytes, tuple[WorkerHandle, set[str]]]
        _closing: bool

        @property
        def browser_pss(self) -> int: ...
        def _emit(self, kind: str, message: str) -> None: ...
        def _capacity_changed(self) -> None: ...
        def offence(self, h: WorkerHandle | None, what: str, identity: bytes | None = None,
                    public_key: bytes | None = None) -> None: ...
        def _on_hello(self, identity: bytes, msg: P.Hello, key: bytes | None) -> None: ...
        def _rejoin(self, identity: bytes, key: bytes | None) -> WorkerHandle | None: ...
        def _drop_worker(self, h: WorkerHandle, reason: str) -> None: ...
        def _fail_worker(self, h: WorkerHandle, reason: str) -> None: ...

    async def request(self, h: WorkerHandle, episode_id: str, operation: P.AnyOperation) -> Any:
        """Send one request to a worker and wait for its reply (through the worker's FIFO queue), at most
        until the request's deadline (:meth:`deadline`): then RequestTimeout."""
        async with h.ops:
            if not h.alive:
                raise WorkerLost(f"browser worker {h.worker_id} is gone")
            assert h.identity is not None  # a worker is alive only once it has said hello
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
        h.pending_release.append((obs.frame.slot, obs.frame.generation))


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
