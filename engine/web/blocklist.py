"""The blocklist: domains that blocked the agent, skipped until their entry expires (12 hours, as the original).

Entries come from the judge's "blocked" verdict and from block pages the engine sees itself (HTTP 403 or 429 on
an episode's start page, a known challenge or CAPTCHA page). A 429 that says when to come back (``Retry-After``)
blocks its domain for that long instead (at least a minute, at most a week).

A task whose domain is on the list ends with an error record of kind ``blocked_domain`` instead of running. The
list is a JSON file (``blocklist.json`` in the run directory by default, or a shared path for several runs),
written atomically and read again when another process changed it. ``webgym-engine tasks blocklist`` shows and
clears it. A file that cannot be read when the list is opened is an error; one that another process (or a hand
edit) breaks later, or that cannot be written, is reported to ``on_error`` when given (the engine: the run goes on
with the entries it has), else raised.
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from email.utils import parsedate_to_datetime
from pathlib import Path

from engine import json_input

DEFAULT_TTL_S = 12 * 3600.0
RETRY_AFTER_BOUNDS_S = (60.0, 7 * 86400.0)  # a Retry-After is kept to within these

# Titles of the challenge and block pages of common bot walls (lowercased substrings).
CHALLENGE_TITLES = ("just a moment", "attention required", "access denied", "are you a robot", "captcha",
                    "security check", "request blocked", "pardon our interruption", "too many requests")
BLOCK_STATUSES = (403, 429)


@dataclass
class Entry:
    """One blocked domain."""

    domain: str
    until: float  # wall clock (time.time())
    reason: str
    source: str  # "judge" | "page"
    added: float


def block_reason(status: int | None, title: str) -> str | None:
    """Why a start page is a block page (HTTP 403/429 on the main document, a challenge page's title); None when
    it is not one."""
    if status in BLOCK_STATUSES:
        return f"HTTP {status} on the start page"
    lowered = title.lower()
    for marker in CHALLENGE_TITLES:
        if marker in lowered:
            return f"a challenge page ({title[:80]!r})"
    return None


def retry_after_s(value: str | None, now: float | None = None) -> float | None:
    """The seconds a ``Retry-After`` header asks for (delta-seconds or an HTTP date), kept within
    RETRY_AFTER_BOUNDS_S; None when there is none or it cannot be read."""
    text = (value or "").strip()[:64]
    if not text:
        return None
    if text.isdigit():
        seconds = float(text)
    else:
        try:
            seconds = parsedate_to_datetime(text).timestamp() - (time.time() if now is None else now)
        except (TypeError, ValueError, IndexError, OverflowError):
            return None
    low, high = RETRY_AFTER_BOUNDS_S
    return min(max(seconds, low), high)


class Blocklist:
    """The blocked domains of ``path`` (None: kept in memory only), each for ``ttl_s`` seconds. ``on_error``: told
    of a file that could not be read again or written once the list is open (module docstring)."""

    def __init__(self, path: str | Path | None, ttl_s: float = DEFAULT_TTL_S,
                 on_error: Callable[[str], None] | None = None) -> None:
        if ttl_s <= 0:
            raise ValueError("the blocklist's ttl must be > 0")
        self.path = Path(path) if path is not None else None
        self.ttl_s = ttl_s
        self._entries: dict[str, Entry] = {}
        self._mtime: float | None = None
        self.on_error: Callable[[str], None] | None = None  # none while opening: a broken file is an error then
        self._reload()
        self.on_error = on_error

    def entries(self, now: float | None = None) -> list[Entry]:
        """The entries in force at ``now``, soonest to expire first."""
        self._reload()
        now = time.time() if now is None else now
        return sorted((e for e in self._entries.values() if e.until > now), key=lambda e: e.until)

    def blocked(self, domain: str, now: float | None = None) -> Entry | None:
        """The entry that blocks ``domain`` at ``now``, if any."""
        if not domain:
            return None
        self._reload()
        entry = self._entries.get(domain)
        now = time.time() if now is None else now
        return entry if entry is not None and entry.until > now else None

    def add(self, domain: str, reason: str, source: str, now: float | None = None,
            for_s: float | None = None) -> Entry:
        """Block ``domain`` from ``now`` for ``for_s`` seconds (None: the ttl); an entry in force is replaced."""
        self._reload()
        now = time.time() if now is None else now
        until = now + (self.ttl_s if for_s is None else for_s)
        entry = Entry(domain=domain, until=until, reason=reason, source=source, added=now)
        self._entries[domain] = entry
        self._save()
        return entry

    def clear(self, domain: str | None = None) -> int:
        """Remove ``domain``'s entry (None: every entry); returns how many were removed."""
        self._reload()
        if domain is None:
            removed = len(self._entries)
            self._entries.clear()
        else:
            removed = int(self._entries.pop(domain, None) is not None)
        self._save()
        return removed

    def _reload(self) -> None:
        if self.path is None:
            return
        try:
            mtime = self.path.stat().st_mtime
        except FileNotFoundError:
            return
        if mtime == self._mtime:
            return
        try:
            data = json_input.loads(self.path.read_text(encoding="utf-8"))
            entries = {d: Entry(**e) for d, e in data.get("domains", {}).items()}
        except (OSError, ValueError, TypeError, AttributeError) as exc:
            self._mtime = mtime  # reported once per change of the file
            self._fail(ValueError(f"{self.path}: not a blocklist file: {exc}"), "kept the entries read before")
            return
        self._entries, self._mtime = entries, mtime

    def _save(self) -> None:
        if self.path is None:
            return
        now = time.time()
        live = {d: asdict(e) for d, e in self._entries.items() if e.until > now}
        tmp = self.path.with_name(f".{self.path.name}.{os.getpid()}.tmp")
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            tmp.write_text(json.dumps({"domains": live}, indent=1) + "\n", encoding="utf-8")
            os.replace(tmp, self.path)
            self._mtime = self.path.stat().st_mtime
        except OSError as exc:
            with contextlib.suppress(OSError):
                tmp.unlink(missing_ok=True)
            self._fail(OSError(f"{self.path}: the blocklist could not be written: {exc}"), "kept in memory")

    def _fail(self, exc: Exception, what_now: str) -> None:
        """Raise ``exc``, or with ``on_error`` set, report it and go on with the entries in memory."""
        if self.on_error is None:
            raise exc
        self.on_error(f"{exc} ({what_now})")
