"""The log of what a context's pages did besides the actions (refused loads, popups, downloads, dialogs, file
choosers), until the next observation takes it."""

from __future__ import annotations

import contextlib
import ipaddress
from urllib.parse import urlsplit

from browserpool.protocol import PageEvent

_TEXT_CAP = 300  # longest URL or message kept in a page event


class EventLog:
    """What a context's pages did besides the actions (refused loads, popups, downloads, dialogs, file
    choosers), collected until the next observation takes them. Capped: past ``cap`` events per observation
    the rest are only counted (a page cannot flood the records)."""

    __slots__ = ("cap", "dropped", "items")

    def __init__(self, cap: int = 32) -> None:
        self.cap = cap
        self.items: list[PageEvent] = []
        self.dropped = 0

    def add(self, kind: str, url: str = "", detail: str = "") -> None:
        """Record one event (URL and detail cut to a few hundred characters)."""
        if len(self.items) >= self.cap:
            self.dropped += 1
            return
        self.items.append(PageEvent(kind, url[:_TEXT_CAP], detail[:_TEXT_CAP]))

    def take(self) -> list[PageEvent] | None:
        """The events since the last call (None when there were none); the log starts empty again."""
        if not self.items:
            return None
        items, self.items = self.items, []
        if self.dropped:
            items.append(PageEvent("dropped", "", f"{self.dropped} more events not listed"))
            self.dropped = 0
        return items

    def clear(self) -> None:
        """Forget everything (a new episode starts)."""
        self.items.clear()
        self.dropped = 0

    def refusal_for(self, url: str) -> PageEvent | None:
        """The refused-load event of ``url``, if any: the same URL, or for a tunnel (which shows only its host
        and port) the same host and port. Chromium may have rewritten the host (an IPv6 literal, say), so both
        sides are compared in canonical form."""
        want = _authority(url)
        if want is None:
            return None
        path = _path(url)
        for ev in self.items:
            if ev.kind == "refused" and _authority(ev.url) == want and ("://" not in ev.url or _path(ev.url) == path):
                return ev
        return None


def _path(url: str) -> str:
    try:
        parts = urlsplit(url)
    except ValueError:
        return ""
    return (parts.path or "/") + (f"?{parts.query}" if parts.query else "")


def _authority(url: str) -> tuple[str, int] | None:
    """(canonical host, port) of a URL or of a bare ``host:port``; None when it has no host."""
    try:
        parts = urlsplit(url if "://" in url else f"tunnel://{url}")
        host, port = parts.hostname, parts.port
    except ValueError:
        return None
    if not host:
        return None
    with contextlib.suppress(ValueError):
        host = ipaddress.ip_address(host).compressed
    return host, port or (443 if parts.scheme in ("https", "wss", "tunnel") else 80)
