"""Making an episode's tab reusable by the next episode: the storage of every origin (and storage partition) it
reached cleared, its history forgotten (``TabReset``, a part of :class:`browserpool.page.EpisodePage`)."""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
from typing import TYPE_CHECKING, Any

from playwright.async_api import CDPSession

from browserpool.event_log import EventLog
from browserpool.page_errors import PageHung

# The most storages (origins, and partitions: origins x top-level sites) a reused tab clears one by one, each a CDP
# call. A page that reached more (images from thousands of subdomains, redirects through many sites) has its context
# dropped instead, which clears everything at once: clearing 2,000 origins under 300 sites kept a worker's event loop
# busy for 9 s.
MAX_CLEARED_STORAGES = 2000


def _host_of(origin: str) -> str:
    """The host of ``scheme://host[:port]`` (IPv6 in brackets)."""
    rest = origin.split("://", 1)[-1]
    if rest.startswith("["):
        return rest[:rest.index("]") + 1]
    return rest.rsplit(":", 1)[0] if ":" in rest else rest


def _site_candidates(origin: str) -> list[str]:
    """The sites ``origin`` may belong to (scheme://registrable-domain): the host itself for an IP address or a
    single label, else every parent domain of two labels or more (one of them is the registrable domain)."""
    scheme, _, rest = origin.partition("://")
    host = rest[1:rest.index("]")] if rest.startswith("[") else rest.rsplit(":", 1)[0] if ":" in rest else rest
    try:
        ipaddress.ip_address(host)
        return [f"{scheme}://[{host}]" if ":" in host else f"{scheme}://{host}"]
    except ValueError:
        pass
    labels = host.split(".")
    if len(labels) < 2:
        return [f"{scheme}://{host}"]
    return [f"{scheme}://{'.'.join(labels[i:])}" for i in range(len(labels) - 1)]


class TabReset:
    """The tab's reset between episodes (see the module docstring)."""

    if TYPE_CHECKING:  # what EpisodePage provides
        cdp: CDPSession
        events: EventLog
        origins: set[str]
        top_sites: set[str]
        target_id: str
        context_id: str
        url: str
        title: str
        status: int | None
        note: str | None
        _adopt: str | None
        _leaving: asyncio.Lock

        async def evaluate(self, expression: str) -> Any: ...
        async def _wait_for_document(self, loader_id: str | None) -> None: ...

    async def reset(self, more_origins: set[str] | None = None) -> bool:
        """Make the tab reusable by another episode: leave the page (its scripts stop), forget the
        storage of every origin visited (its frames', popups', and ``more_origins``: those the network
        proxy saw) and the navigation history. Reusing the tab is ~4x cheaper than a new one (no new
        renderer process). False, with nothing done, when there is more storage to clear than
        :data:`MAX_CLEARED_STORAGES`: the context is to be dropped instead."""
        origins = self.origins | more_origins if more_origins else self.origins
        if len(origins) * (1 + len(self.top_sites)) > MAX_CLEARED_STORAGES:
            return False
        with contextlib.suppress(PageHung):
            await self.evaluate("try { sessionStorage.clear(); } catch (e) {}")
        res = await self.cdp.send("Page.navigate", {"url": "about:blank"})
        # Page.navigate may answer before the blank page has committed. Until it has, the old document
        # is alive (its unload handlers may still write storage), resetNavigationHistory fails ("Not
        # attached to an active page") and the next episode's navigation can collide with this one
        # and never finish.
        await self._wait_for_document(res.get("loaderId"))
        # A frame of another site keeps its storage in a partition of the top-level site it was embedded in
        # (storage key "ORIGIN/^0SITE"), which clearing by origin does not reach: each such key is cleared too
        # (candidate sites: without a public-suffix list every parent domain is tried; unknown keys cost nothing).
        keys = {f"{o}/^0{t}" for o in origins for t in self.top_sites if _host_of(o) != _host_of(t)}
        if origins:
            # Independent commands: pipelined, one round trip for all of them.
            await asyncio.gather(
                *(self.cdp.send("Storage.clearDataForOrigin", {"origin": origin, "storageTypes": "all"})
                  for origin in origins),
                *(self.cdp.send("Storage.clearDataForStorageKey", {"storageKey": key, "storageTypes": "all"})
                  for key in keys))
        self.origins.clear()
        self.top_sites.clear()
        await self.forget_history()
        self.url, self.title, self.status = "about:blank", "", None
        self.note, self._adopt = None, None
        self.events.clear()
        return True

    async def context_has_other_pages(self) -> bool:
        """Whether the browser holds a page of this tab's context besides the tab. Playwright reports a popup
        only once it has set the popup up, after its first requests: one opened just before its episode ended
        may not be in the context's pages yet."""
        targets = (await self.cdp.send("Target.getTargets"))["targetInfos"]
        return any(t.get("type") == "page" and t.get("browserContextId") == self.context_id
                   and t.get("targetId") != self.target_id for t in targets)

    async def forget_history(self) -> None:
        """Drop the back/forward list, so go_back never reaches a previous episode's pages."""
        async with self._leaving:
            await self.cdp.send("Page.resetNavigationHistory")
