"""The server's leases: browser contexts of the core's pool, handed out by ``/get`` and given back by ``/reset``.

A lease is one episode of the pool (one context, one tab, on the worker with the fewest live episodes). The
table caps the leases at the server's capacity (a full table answers ``/get`` at once with the original's 503, so
that clients back off), expires a lease that has not been used for its lifetime (a client that died never sends
its ``/reset``; the context goes back to the pool), and remembers recently ended leases so that a late command on
one gets a clear "expired" or "lost" answer instead of "unknown".
"""

from __future__ import annotations

import asyncio
import itertools
import time
import uuid
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

from browserpool.pool import BrowserPool, BrowserSession, PoolError
from browserpool.protocol import TrafficSpec
from engine.core.core import EngineCore
from engine.store.records import RecordError
from server.recorder import LeaseRecorder

ENDED_MEMORY = 4096  # ended lease ids remembered for their "expired" / "lost" answers


class LeaseError(Exception):
    """A request names a lease it cannot use: ``status`` and ``detail`` are the HTTP answer."""

    def __init__(self, status: int, detail: str) -> None:
        super().__init__(detail)
        self.status = status
        self.detail = detail


@dataclass
class Lease:
    """One leased browser context and what the server keeps about it between requests."""

    instance_id: str
    node: str  # the browser worker that holds the context
    session: BrowserSession
    lifetime_s: float  # idle time after which the lease expires
    recorder: LeaseRecorder
    last_used: float = field(default_factory=time.monotonic)
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)  # one command at a time per lease
    url: str = "about:blank"
    title: str = ""
    # The elements of the last set_of_marks screenshot or get_interactive_rects: [id, tag, text, x, y, w, h].
    elements: list[list[Any]] | None = None
    # What the last set_of_marks screenshot found (get_screenshot_info); None before the first one.
    som_elements: list[list[Any]] | None = None
    result: dict[str, Any] = field(default_factory=dict)  # where the last action left the page (its record's)
    opened: bool = False  # the worker has the lease's page (opened by its first command, not by /get)
    traffic: TrafficSpec | None = None  # its pages' traffic recorded or replayed (serve --record/--replay-traffic)

    async def ready(self) -> None:
        """Open the lease's blank page on its worker if no command has yet (a lease costs nothing until used)."""
        if not self.opened:
            await self.open("about:blank")

    async def open(self, url: str) -> None:
        """Open the lease's page at ``url``: its first command (``visit_page`` loads its URL as the open does)."""
        obs, frame = await self.session.open(url, shot=False, traffic=self.traffic)
        frame.release()
        self.opened = True
        self.url, self.title = obs.url, obs.title
        self.result = {"url": obs.url, "title": obs.title, "settle": obs.settle, "timings": obs.timings_ms}

    def element(self, element_id: str | int) -> list[Any]:
        """The element a ``*_id`` command names; LeaseError 400 when the last element pass has no such id."""
        for e in self.elements or ():
            if str(e[0]) == str(element_id).strip():
                return e
        raise LeaseError(400, f"No element {str(element_id)[:40]!r} on the last set_of_marks screenshot of this "
                              "instance (take one, or call get_interactive_rects, first)")


class LeaseTable:
    """Every live lease of the server (module docstring). ``capacity``: leases at once; ``lifetime_max_mins``: the
    largest ``lifetime_mins`` a ``/get`` may ask for (the original's ``--lifetime_max``)."""

    def __init__(self, core: EngineCore, capacity: int, *, lifetime_max_mins: int = 60, record: bool = False,
                 lease_wait_s: float = 5.0) -> None:
        self.core = core
        self.capacity = capacity
        self.lifetime_max_mins = lifetime_max_mins
        self.record = record
        self.lease_wait_s = lease_wait_s
        self.leases: dict[str, Lease] = {}
        self._ended: OrderedDict[str, str] = OrderedDict()  # instance id -> why it ended
        self._numbers = itertools.count(1)
        self._opening = 0  # /get requests between the capacity check and their lease

    @property
    def pool(self) -> BrowserPool:
        return self.core.pool

    # --- leasing ----------------------------------------------------------------------------------------
    async def acquire(self, lifetime_mins: int) -> Lease:
        """A new lease (a blank page: its first command opens it on the worker reserved now); LeaseError 503 (the
        original's answer, which clients retry) when the server is full, the lifetime is out of range, or no
        browser worker has room."""
        if not 0 <= lifetime_mins <= self.lifetime_max_mins:
            raise LeaseError(503, f"No available nodes with capacity to create new instance (lifetime_mins must "
                                  f"be between 0 and {self.lifetime_max_mins})")
        if len(self.leases) + self._opening >= self.capacity:
            raise LeaseError(503, "No available nodes with capacity to create new instance")
        number = next(self._numbers)
        # The original's shape, "<uuid4>:<port>": URL-safe, no "/" (clients put it in file names).
        instance_id = f"{uuid.uuid4()}:{number}"
        recorder = LeaseRecorder(self.core, f"lease-{number}", instance_id, self.record)
        traffic = await self._traffic(recorder)
        self._opening += 1
        t0 = time.monotonic()
        try:
            async with asyncio.timeout(self.lease_wait_s):
                session = await self.pool.lease(recorder.episode_id)
        except (TimeoutError, PoolError) as exc:
            recorder.end({"kind": "lease_failed", "message": str(exc) or "no browser worker had room"})
            raise LeaseError(503, f"Failed to create instance: {exc or 'no browser worker had room'}") from None
        finally:
            self._opening -= 1
        recorder.leased(session.worker_id, round((time.monotonic() - t0) * 1000, 1))
        lease = Lease(instance_id, session.worker_id, session, lifetime_mins * 60.0, recorder, traffic=traffic)
        self.leases[instance_id] = lease
        return lease

    async def _traffic(self, recorder: LeaseRecorder) -> TrafficSpec | None:
        """The lease's traffic spec: lease N records into, or replays, the archive of the lease N of a recording
        server (a client that takes its leases in the same order replays the same pages). LeaseError 503 when a
        replay has no archive for it."""
        plan = self.core.traffic
        if plan is None:
            return None
        try:
            traffic = await plan.episode(recorder.task_id, 0, recorder.episode_id)
        except FileNotFoundError as exc:
            recorder.end({"kind": "traffic_missing", "message": str(exc)})
            raise LeaseError(503, f"Failed to create instance: {exc}") from None
        return traffic.spec

    def find(self, instance_id: str, node: str) -> Lease:
        """The live lease ``instance_id`` on ``node``, its idle clock restarted; LeaseError with the answer for an
        unknown node (400), an unknown, ended or expired lease (400 / 410), or one whose browser died (410)."""
        lease = self.leases.get(instance_id)
        if lease is None:
            if not self._known_node(node):
                raise LeaseError(400, f"Node {node[:200]} is not found")
            why = self._ended.get(instance_id)
            if why is not None:
                raise LeaseError(410, f"Instance {instance_id[:80]} {why}; lease a new one with /get")
            raise LeaseError(400, f"Invalid instance UUID: {instance_id[:80]}")
        if node != lease.node:
            raise LeaseError(400, f"Node {node[:200]} is not found" if not self._known_node(node)
                             else f"Instance {instance_id[:80]} is not on node {node[:200]}")
        if not lease.session.handle.alive:  # nothing to give back: the worker and the context are gone
            self._end(lease, {"kind": "worker_lost", "message": "the browser worker serving the lease died"},
                      "was lost: its browser worker died")
            raise LeaseError(410, f"Instance {instance_id[:80]} was lost: its browser worker died; lease a new one "
                                  "with /get")
        lease.last_used = time.monotonic()
        return lease

    async def release(self, lease: Lease, error: RecordError | None = None, why: str = "was released") -> None:
        """End a lease: its context goes back to the pool (state cleared) and its record is written."""
        if self._end(lease, error, why):
            await lease.session.close()

    async def lost(self, lease: Lease, message: str) -> None:
        """The lease's browser failed under a command (its worker died, its page hung and was discarded)."""
        await self.release(lease, {"kind": "worker_lost", "message": message[:500]},
                           f"was lost ({message[:200]})")

    async def close(self) -> None:
        """Release every lease (the server is stopping)."""
        for lease in list(self.leases.values()):
            await self.release(lease, {"kind": "server_stopped", "message": "the server stopped"})

    async def expire_forever(self, check_s: float) -> None:
        """Every ``check_s``, release the leases idle for longer than their lifetime (never one mid-command)."""
        while True:
            await asyncio.sleep(check_s)
            now = time.monotonic()
            for lease in list(self.leases.values()):
                if not lease.lock.locked() and now - lease.last_used >= lease.lifetime_s:
                    mins = lease.lifetime_s / 60
                    await self.release(lease, {"kind": "lease_expired",
                                               "message": f"unused for its lifetime of {mins:g} min"},
                                       f"expired (unused for its lifetime of {mins:g} min)")

    # --- reporting --------------------------------------------------------------------------------------
    def info(self) -> dict[str, Any]:
        """``/info``: the original's ``nodes`` (one per live browser worker: its share of the capacity, what is
        available and its leases), plus the totals in the flat node-level shape both clients also accept."""
        workers = [h.worker_id for h in self.pool.alive_workers()]
        per_node: dict[str, list[str]] = {w: [] for w in workers}
        for lease in self.leases.values():
            per_node.setdefault(lease.node, []).append(lease.instance_id)
        share, extra = divmod(self.capacity, max(1, len(workers)))
        nodes = []
        for i, (node, ids) in enumerate(per_node.items()):
            cap = share + (1 if i < extra else 0) if node in workers else 0
            nodes.append({"url": node, "hash": node, "healthy": node in workers, "capacity": cap,
                          "available": max(0, cap - len(ids)), "instances": ids})
        in_use = [lease.instance_id for lease in self.leases.values()]
        return {"nodes": nodes, "capacity": self.capacity, "available": max(0, self.capacity - len(in_use)),
                "in_use": in_use}

    # --- internals --------------------------------------------------------------------------------------
    def _known_node(self, node: str) -> bool:
        return node in self.pool.workers or any(lease.node == node for lease in self.leases.values())

    def _end(self, lease: Lease, error: RecordError | None, why: str) -> bool:
        """Take the lease out of the table (remembering ``why`` for late requests) and write its record; False
        when it had ended already."""
        if self.leases.get(lease.instance_id) is not lease:
            return False
        del self.leases[lease.instance_id]
        self._ended[lease.instance_id] = why
        while len(self._ended) > ENDED_MEMORY:
            self._ended.popitem(last=False)
        lease.recorder.end(error)
        return True
