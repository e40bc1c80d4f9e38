"""What the engine knows about one connected browser worker (:class:`WorkerHandle`)."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any

from browserpool import protocol as P
from browserpool.shm import SlotReader


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
    pending_release: list[tuple[int, int]] = field(default_factory=list)  # (slot, generation) pairs
    last_seen: float = 0.0
    ready: asyncio.Event = field(default_factory=asyncio.Event)
    wire_id: str = ""  # the id the worker itself uses in its messages
    hello: P.Hello | None = None  # what it said when it joined (a worker heard from again after silence rejoins)
    contexts: int = 0  # live episodes the worker reports in its heartbeats
    browser_pss: int = 0  # its browser's PSS in bytes, as its heartbeats report it (0: no reading yet)
