"""The pool's trust checks on its peers: a hello is taken only in the protocol's version, as one of this pool's
spawned workers only from that very process (its key, or its pid), with a shared-memory ring only under the engine's
naming scheme; a hand-started worker cut off and heard from again rejoins only with the key it joined with; a peer
that keeps sending bad messages is banned (``PeerTrust``, a part of :class:`browserpool.pool.BrowserPool`)."""

from __future__ import annotations

import contextlib
import itertools
import time
from typing import TYPE_CHECKING, Any, cast

import psutil
import zmq

from browserpool import protocol as P
from browserpool.auth import ClientKeys, CurveGuard
from browserpool.instance import SHM_NAME_RE, Instance
from browserpool.netpolicy import with_engine_sites
from browserpool.router import RouterSocket
from browserpool.shm import SlotReader
from browserpool.worker_handle import WorkerHandle

if TYPE_CHECKING:
    from browserpool.pool import PoolConfig


class PeerTrust:
    """Hellos, rejoins and bans (see the module docstring)."""

    if TYPE_CHECKING:  # what BrowserPool provides
        cfg: PoolConfig
        instance: Instance
        workers: dict[str, WorkerHandle]
        offences: dict[bytes, int]
        dropped_messages: int
        _router: RouterSocket
        _guard: CurveGuard | None
        _spawn_keys: ClientKeys | None
        _req_ids: itertools.count[int]
        _worker_ids: itertools.count[int]
        _by_identity: dict[bytes, WorkerHandle]
        _silent: dict[bytes, tuple[WorkerHandle, set[str]]]
        _closing: bool

        def _emit(self, kind: str, message: str) -> None: ...
        def _capacity_changed(self) -> None: ...
        def _spawn_task(self, coro: Any) -> None: ...
        def _new_handle(self, wid: str) -> WorkerHandle: ...
        def _drop_worker(self, h: WorkerHandle, reason: str) -> None: ...

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
        assert h.identity is not None  # _rejoin set it
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
        return with_engine_sites(self.cfg.worker.net)

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


def _user_key(frame: zmq.Frame) -> bytes | None:
    """The CURVE public key (z85) the peer authenticated with, from the ZAP User-Id; None without CURVE."""
    try:
        # A string property (pyzmq types every property's value as ``int | str``).
        uid = cast(str, frame.get("User-Id"))
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
