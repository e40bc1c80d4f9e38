"""Telling when an episode's tab has settled: navigation over and the document quiet (the init script's check),
within a deadline; where the tab is then (URL, title, HTTP status) (``Settling``, a part of
:class:`browserpool.page.EpisodePage`)."""

from __future__ import annotations

import asyncio
import contextlib
import time
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from playwright.async_api import CDPSession
from playwright.async_api import Error as PlaywrightError

from browserpool.config import WorkerConfig
from browserpool.page_scripts import TITLE_CHARS
from browserpool.protocol import SettleState

# Where the page is, [url, title, HTTP status or null]: the init script's report, which a page's own scripts cannot
# alter; in a document without it (the init script did not run), read directly.
_LOCATION_EXPR = ("(window.__wgWhere ? window.__wgWhere() : [location.href, String(document.title).slice(0, "
                  f"{TITLE_CHARS}), ((performance.getEntriesByType('navigation')[0] || {{}}).responseStatus || null)])")


def _settle_expr(quiet_ms: int, cap_ms: int) -> str:
    """The settle check: waits for a quiet document (the init script's __wgSettle), then reports where it is:
    [state, url, title, status]."""
    return (f"(window.__wgSettle ? window.__wgSettle({quiet_ms}, {cap_ms}) : "
            f"Promise.resolve(['quiet'].concat({_LOCATION_EXPR})))")


class Settling:
    """The settle check and the navigation state it waits on (see the module docstring)."""

    if TYPE_CHECKING:  # what EpisodePage provides
        cdp: CDPSession
        cfg: WorkerConfig
        origins: set[str]
        url: str
        title: str
        status: int | None
        _loading: bool
        _stopped: asyncio.Event
        _nav_changed: asyncio.Event
        _loader_id: str | None

        def _check_open(self) -> None: ...

    async def _wait_for_document(self, loader_id: str | None) -> None:
        """Wait until the main frame has committed the navigation ``loader_id`` and stopped loading."""
        while loader_id and (self._loader_id != loader_id or self._loading):
            self._check_open()
            self._nav_changed.clear()
            await self._nav_changed.wait()

    async def _stop_loading(self) -> None:
        with contextlib.suppress(TimeoutError, PlaywrightError):
            async with asyncio.timeout(2.0):
                await self.cdp.send("Page.stopLoading")

    async def _settle(self, deadline: float, quiet_ms: int) -> SettleState:
        """Wait until navigation is over and the document is quiet; quiet, busy or timeout."""
        state = await self._settle_until(deadline, quiet_ms)
        if state is SettleState.TIMEOUT:
            await self._read_location()
        return state

    async def _read_location(self) -> None:
        """After a timeout: the URL, title and status of whatever document the tab shows (a page whose load event
        never came, because a script never finished, is still a page), within a short cap."""
        with contextlib.suppress(PlaywrightError, TimeoutError):
            async with asyncio.timeout(0.5):
                res = await self.cdp.send("Runtime.evaluate", {"expression": _LOCATION_EXPR, "returnByValue": True})
            value = res.get("result", {}).get("value")
            if isinstance(value, list) and len(value) == 3:
                self._take_location(*value)

    def _take_location(self, url: Any, title: Any, status: Any) -> bool:
        """Take a page's report of where it is, if it is well-formed (a URL and a title as strings): the report
        comes from the page's own script context, and what the worker sends on must match the protocol's types
        whatever a page did there."""
        if not (isinstance(url, str) and isinstance(title, str)):
            return False
        self.url, self.title = url, title[:TITLE_CHARS]
        self.status = status if type(status) is int and status > 0 else None
        return True

    async def _settle_until(self, deadline: float, quiet_ms: int) -> SettleState:
        while True:
            self._check_open()
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return SettleState.TIMEOUT
            if self._loading:
                try:
                    async with asyncio.timeout(remaining):
                        await self._stopped.wait()
                except TimeoutError:
                    return SettleState.TIMEOUT
                continue
            self._nav_changed.clear()
            cap_ms = int(min(quiet_ms + self.cfg.idle_cap_ms, remaining * 1000))
            expr = _settle_expr(quiet_ms, cap_ms)
            try:
                async with asyncio.timeout(remaining):
                    res = await self.cdp.send("Runtime.evaluate", {
                        "expression": expr, "returnByValue": True, "awaitPromise": True})
            except TimeoutError:
                return SettleState.TIMEOUT
            except PlaywrightError:
                # The document went away mid-check (a navigation, or the tab closing): check the new one once the
                # browser reports it, without spinning on a tab that no longer answers.
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(min(remaining, 0.05)):
                        await self._nav_changed.wait()
                continue
            value = res.get("result", {}).get("value")
            if not (isinstance(value, list) and len(value) == 4 and self._take_location(*value[1:])):
                # A document whose scripts broke the check (no init script, and builtins replaced): asking again
                # would only spin until the deadline.
                await self._read_location()
                return SettleState.BUSY
            self._note_origin(self.url)
            if value[0] == "navigating" or self._loading:  # the page script's third state: not settled yet
                # The document is leaving; wait for the browser to report the load (or give up on it).
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(min(remaining, 1.0)):
                        await self._nav_changed.wait()
                continue
            return SettleState.QUIET if value[0] == "quiet" else SettleState.BUSY

    def _note_origin(self, url: str) -> None:
        parts = urlsplit(url)
        if parts.scheme in ("http", "https"):
            self.origins.add(f"{parts.scheme}://{parts.netloc}")
