"""Websites as first-class: an episode's domain, and the episode queue that spreads episodes across domains.

Live websites throttle or block a crowd of browsers from one address. :class:`DomainQueue` is the engine's episode
queue (level 1) with a cap on the episodes running at once per domain: a runner takes the oldest queued episode
whose domain has room, preferring the domain with the fewest episodes running, so 64 browsers spread over the
task set's sites instead of landing on one. The engine's own sites (the bundled-site server) have no cap.

:class:`DomainPacer` spaces the actions sent to one domain's pages (page loads, clicks, typing: each one makes the
site answer requests) to at most ``rate`` per second, with a burst of ``rate`` actions. It is the engine's part of a
request-rate limit: the engine decides when an action goes out, not which requests the page then makes.

A domain is the URL's host name, lowercased, without a leading ``www.`` (``www.shop.example`` and
``shop.example`` are one site; ``a.shop.example`` another). Registrable domains (the public-suffix list) would
merge more; a host name is what a site's rate limiter sees. Sites on this machine or a private network (an IP
literal or ``localhost``: :func:`is_local`) are the user's own and have no limits, like the bundled sites.
"""

from __future__ import annotations

import asyncio
import functools
import ipaddress
import itertools
import time
from collections import deque
from collections.abc import Callable, Iterable
from typing import Generic, TypeVar
from urllib.parse import urlsplit

DEFAULT_DOMAIN_LIMIT = 8  # episodes at once on one site (0: no cap)
DEFAULT_DOMAIN_RATE = 4.0  # actions per second sent to one site's pages (0: no cap)

T = TypeVar("T")


def is_local(url: str) -> bool:
    """Whether ``url``'s host is this machine or an address of a private network (``localhost``, a loopback,
    private or link-local IP): the user's own sites, which per-site limits and the blocklist leave alone."""
    try:
        host = (urlsplit(url).hostname or "").lower().rstrip(".")
    except ValueError:
        return False
    return _is_local_host(host)


@functools.lru_cache(maxsize=4096)
def _is_local_host(host: str) -> bool:
    # Cached: asked for every action, and parsing an address costs more than the rest of a step's bookkeeping.
    if host == "localhost" or host.endswith(".localhost"):
        return True
    try:
        ip = ipaddress.ip_address(host)
    except ValueError:
        return False
    return ip.is_loopback or ip.is_private or ip.is_link_local


def domain_of(url: str) -> str:
    """The domain of ``url`` (see the module docstring); ``""`` when it has no host."""
    try:
        host = (urlsplit(url).hostname or "").lower().rstrip(".")
    except ValueError:
        return ""
    return host[4:] if host.startswith("www.") else host


class DomainQueue(Generic[T]):
    """A FIFO of items (episodes) with at most ``limit`` running per domain (``0``: no cap).

    ``domain(item)`` names an item's domain; ``exempt(item)`` frees an item from the cap (the engine's own sites).
    :meth:`get` hands out an item and counts it as running until :meth:`done` is called for it.
    """

    def __init__(self, domain: Callable[[T], str], limit: int = DEFAULT_DOMAIN_LIMIT,
                 exempt: Callable[[T], bool] | None = None) -> None:
        if limit < 0:
            raise ValueError("the domain limit must be >= 0")
        self.limit = limit
        self._domain = domain
        self._exempt = exempt or (lambda item: False)
        self._queues: dict[str, deque[tuple[int, T]]] = {}  # domain -> (arrival, item), oldest first
        self.running: dict[str, int] = {}
        self._taken: dict[int, str] = {}  # id(item) -> the domain it counts against ("" when exempt)
        self._order = itertools.count()
        self._changed = asyncio.Event()
        self.peak: dict[str, int] = {}  # the most episodes that ran at once per domain

    def __len__(self) -> int:
        return sum(len(q) for q in self._queues.values())

    def empty(self) -> bool:
        """Whether nothing is queued (whether or not anything could be taken)."""
        return len(self) == 0

    def put_nowait(self, item: T) -> None:
        key = "" if self._exempt(item) else self._domain(item)
        self._queues.setdefault(key, deque()).append((next(self._order), item))
        self._changed.set()

    def extend(self, items: Iterable[T]) -> None:
        for item in items:
            self.put_nowait(item)

    def get_nowait(self) -> T:
        """The next item that may run now; ``asyncio.QueueEmpty`` when none may."""
        best: tuple[int, int, str] | None = None  # (running on its domain, arrival, domain)
        for key, queue in self._queues.items():
            if not queue:
                continue
            running = self.running.get(key, 0)
            if key and self.limit and running >= self.limit:
                continue
            rank = (running if key else 0, queue[0][0], key)
            if best is None or rank < best:
                best = rank
        if best is None:
            raise asyncio.QueueEmpty
        key = best[2]
        _, item = self._queues[key].popleft()
        if not self._queues[key]:
            del self._queues[key]
        if key:
            self.running[key] = self.running.get(key, 0) + 1
            self.peak[key] = max(self.peak.get(key, 0), self.running[key])
        self._taken[id(item)] = key
        return item

    async def get(self) -> T:
        """The next item that may run (waits for one to be queued or for a domain to have room)."""
        while True:
            try:
                return self.get_nowait()
            except asyncio.QueueEmpty:
                self._changed.clear()
                await self._changed.wait()

    def done(self, item: T) -> None:
        """``item``'s episode ended: its domain has room for another."""
        key = self._taken.pop(id(item), None)
        if key:
            self.running[key] -= 1
            if not self.running[key]:
                del self.running[key]
            self._changed.set()


class DomainPacer:
    """At most ``rate`` actions per second per domain, with a burst of ``rate`` (``0``: no cap): the generic cell
    rate algorithm, one timestamp per domain, so a waiting action costs one timer and no polling."""

    def __init__(self, rate: float = DEFAULT_DOMAIN_RATE) -> None:
        if rate < 0:
            raise ValueError("the domain rate must be >= 0")
        self.rate = rate
        self._interval = 1.0 / rate if rate else 0.0
        self._burst = max(1.0, rate) * self._interval  # how far ahead of now a domain's schedule may run
        self._tat: dict[str, float] = {}  # domain -> theoretical arrival time of its next action

    def delay(self, domain: str, now: float | None = None) -> float:
        """Reserve the next action on ``domain``; how long it must wait first (0: go now)."""
        if not self.rate or not domain:
            return 0.0
        now = time.monotonic() if now is None else now
        tat = max(self._tat.get(domain, now), now) + self._interval
        self._tat[domain] = tat
        return max(0.0, tat - self._burst - now)

    async def wait(self, domain: str) -> float:
        """Wait until an action may go to ``domain``; returns the seconds waited."""
        wait = self.delay(domain)
        if wait:
            await asyncio.sleep(wait)  # the slot this action reserved
        return wait
