"""The worker's BrowserContexts: one per live episode, kept between episodes (state cleared) up to
``context_reuse`` uses, each with its network proxy and the log of what its pages do; a page the context opens
besides the episode's tab (a popup) is closed at once, and past the episode's ``max_popups`` before it loads (the
browser's popup guard, ``browserpool/popup_guard.py``) (``ContextPool``, a part of
:class:`browserpool.worker.BrowserWorker`)."""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from playwright.async_api import Browser, BrowserContext, Page
from playwright.async_api import Error as PlaywrightError

from browserpool.config import WorkerConfig
from browserpool.event_log import EventLog
from browserpool.netpolicy import NetPolicy, bypass_list
from browserpool.page import EpisodePage
from browserpool.page_scripts import INIT_SCRIPT, NO_WEBRTC_SCRIPT
from browserpool.popup_guard import PopupGuard
from browserpool.proxy import ContextProxy
from browserpool.request_rules import RequestRules
from browserpool.stderr_log import log_line
from browserpool.tab_events import refused_detail
from browserpool.traffic import EpisodeTraffic
from browserpool.upstream import ProxyPool


@dataclass
class ContextSlot:
    """A BrowserContext and its tab, kept between episodes (state cleared), and its use count; its network
    proxy (the policy), the events its pages produce, and the popups on their way to being closed."""

    context: BrowserContext
    page: EpisodePage | None = None
    uses: int = 0
    events: EventLog = field(default_factory=EventLog)
    proxy: ContextProxy | None = None
    creating_page: bool = False  # the worker's own new_page() is under way: that page is no popup
    closing: set[asyncio.Task[Any]] = field(default_factory=set)  # popups being closed (their tasks held)
    popups: int = 0  # pages this episode's pages opened besides its tab
    context_id: str = ""  # the context's id in the browser, once the popup guard counts its popups
    refused: int = 0  # popups the guard refused (recorded then) that Playwright has not reported yet


@dataclass
class Episode:
    slot: ContextSlot
    busy: asyncio.Lock = field(default_factory=asyncio.Lock)
    som: bool = False  # Set-of-Marks: every observation lists the elements and shows them as boxes
    som_cap: int = 0  # the most elements a Set-of-Marks pass lists (and so draws): the open's cap within the worker's
    axtree: bool = False  # every observation carries the accessibility tree
    dom: bool = False  # every observation carries the DOM snapshot
    traffic: EpisodeTraffic | None = None  # its tab's traffic recorded or replayed (browserpool/traffic.py)
    probe_js: str | None = None  # evaluated after every observation's settle; its value is Observation.probe
    last_shot: bytes | None = None  # the previous raw screenshot, for Observation.change

    @property
    def page(self) -> EpisodePage:
        assert self.slot.page is not None
        return self.slot.page


class ContextPool:
    """Contexts made, reused and dropped (see the module docstring)."""

    if TYPE_CHECKING:  # what BrowserWorker provides
        cfg: WorkerConfig
        browser: Browser | None
        netpolicy: NetPolicy | None
        proxies: ProxyPool | None
        rules: RequestRules | None
        idle: list[ContextSlot]
        episodes: dict[str, Episode]
        popup_guard: PopupGuard | None
        guarded: dict[str, ContextSlot]  # by context id: the contexts whose popups the guard counts

        def _recycle_after_request(self) -> None: ...
        async def _context_over_memory(self, ep: Episode) -> bool: ...
        def _start_draining_for(self, reason: str) -> None: ...

    async def _new_context(self) -> ContextSlot:
        assert self.browser is not None
        cfg = self.cfg
        events = EventLog(cfg.max_events_per_observation)
        proxy = None
        extra: dict[str, Any] = {"user_agent": cfg.user_agent} if cfg.user_agent else {}
        if self.netpolicy is not None:
            # One proxy per context: every load it refuses is this context's, hence its episode's. The engine's
            # own sites bypass it (no cost on the bundled sites); "<-loopback>" sends every other loopback
            # load through it, too.
            proxy = ContextProxy(self.netpolicy, lambda url, rule: events.add("refused", url, rule),
                                 cfg.net.hosts, cfg.settle_timeout_s,
                                 on_unreachable=lambda url, detail: events.add("unreachable", url, detail),
                                 upstream=self.proxies, rules=self.rules)
            await proxy.start()
            extra["proxy"] = {"server": proxy.server, "bypass": bypass_list(cfg.net.exempt)}
        try:
            ctx = await self.browser.new_context(
                viewport={"width": cfg.viewport_width, "height": cfg.viewport_height},
                device_scale_factor=1, locale="en-US", timezone_id="UTC", service_workers="block",
                accept_downloads=False, **extra)
            await ctx.add_init_script(INIT_SCRIPT if proxy is None else INIT_SCRIPT + NO_WEBRTC_SCRIPT)
        except BaseException:
            if proxy is not None:
                await proxy.close()
            raise
        slot = ContextSlot(ctx, events=events, proxy=proxy)
        ctx.on("page", lambda page: self._on_page(slot, page))
        if proxy is not None:
            # However the context ends (dropped, its browser recycled or gone), its proxy stops with it.
            ctx.on("close", lambda _ctx: asyncio.ensure_future(proxy.close()))
        return slot

    async def _start_popup_guard(self) -> None:
        """The browser's popup guard (a new browser: none of its contexts is counted yet)."""
        assert self.browser is not None
        self.guarded = {}
        self.popup_guard = PopupGuard(self._on_popup_verdict, lambda: self._start_draining_for(
            "its popup guard's page went away (popups are held, none loads)"))
        await self.popup_guard.start(self.browser)

    async def _count_popups(self, slot: ContextSlot) -> None:
        """An episode starts in ``slot``: the guard counts its popups from 0 (only ``max_popups`` load)."""
        if self.popup_guard is None or slot.page is None:
            return
        slot.context_id = slot.page.context_id
        self.guarded[slot.context_id] = slot
        await self.popup_guard.arm(slot.context_id, self.cfg.max_popups)
        slot.page.guarded = True

    def _on_popup_verdict(self, context_id: str, opener_id: str, allowed: bool) -> None:
        """The guard let a page of the context load, or closed it before it loaded (then recorded here: Playwright
        reports it closed, and the worker passes over it)."""
        slot = self.guarded.get(context_id)
        if slot is None:
            return
        if not allowed:
            slot.popups += 1  # the context is not reused after this episode
            slot.refused += 1
        if slot.page is not None:
            slot.page.popup_verdict(opener_id == slot.page.target_id, allowed)
        elif not allowed:
            slot.events.add("popup", "", refused_detail(self.cfg.max_popups))

    def _on_page(self, slot: ContextSlot, page: Page) -> None:
        """A page the context opened besides the episode's tab (a popup, a new tab): closed at once. The
        episode's tab has already taken the URL of a popup its action opened (EpisodePage); one it did not
        announce (opened from an out-of-process frame, a middle click) is recorded here."""
        if slot.creating_page or (slot.page is not None and page is slot.page.page):
            return
        # Refused by the popup guard before it loaded (recorded then): Playwright reports it closed, or (a window.open
        # page) still blank, held. Or gone already. Either way there is nothing to record.
        refused = slot.refused > 0 and (page.is_closed() or page.url in ("", "about:blank"))
        if refused or page.is_closed():
            if refused:
                slot.refused -= 1
            slot.popups += 1
            if not page.is_closed():
                self._close_later(slot, page)
            return
        ep_page = slot.page
        if ep_page is not None and ep_page.announced_popups > 0:
            ep_page.announced_popups -= 1
        elif ep_page is not None:
            ep_page.popup_closed(page.url)
        else:
            slot.events.add("popup", page.url, "closed")
        slot.popups += 1  # the context is not reused after this episode
        self._close_later(slot, page)

    @classmethod
    def _close_later(cls, slot: ContextSlot, page: Page) -> None:
        task = asyncio.ensure_future(cls._close_page(page))
        slot.closing.add(task)
        task.add_done_callback(slot.closing.discard)

    @staticmethod
    async def _close_page(page: Page) -> None:
        with contextlib.suppress(TimeoutError, PlaywrightError):
            async with asyncio.timeout(5):
                await page.close()

    async def _close(self, episode_id: str) -> None:
        ep = self.episodes.pop(episode_id, None)
        if ep is None:
            return
        self._recycle_after_request()
        # An operation of this episode may still be running (the engine gave up on it: a deadline, an episode
        # cap): let it end, within its own caps, before the page is reset under it; else the context goes.
        try:
            async with asyncio.timeout(self.cfg.settle_timeout_s + 2 * self.cfg.screenshot_timeout_s):
                await ep.busy.acquire()
        except TimeoutError:
            await self._drop_context(ep.slot)
            return
        ep.busy.release()  # the episode is out of self.episodes: nothing else can take its lock now
        if ep.traffic is not None:
            await _end_traffic(ep.traffic, episode_id)
        if await self._context_over_memory(ep):  # a heavy renderer is not reused
            await self._drop_context(ep.slot)
            return
        slot = ep.slot
        if slot.popups or ep.page.announced_popups:
            # A popup ran in a renderer of its own, which the worker cannot wait for: what its scripts wrote (storage,
            # cookies) can land after a reset has cleared them. Dropping the context takes all of it at once.
            await self._drop_context(slot)
            return
        try:
            # Nothing of this episode outlives it: its proxy connections (tunnels, sockets), the storage of every
            # origin it loaded from (frames too: the proxy saw them all), a popup not reported yet.
            more_origins = None
            if slot.proxy is not None:
                slot.proxy.close_connections()
                more_origins, slot.proxy.origins = slot.proxy.origins, set()
            async with asyncio.timeout(5):
                reusable = await ep.page.reset(more_origins) and not await ep.page.context_has_other_pages()
            if reusable:
                async with asyncio.timeout(5):
                    await slot.context.clear_cookies()
        except (TimeoutError, PlaywrightError):
            await self._drop_context(slot)
            return
        # slot.popups again: one reported while the tab was reset (its writes, too, may land late).
        if not reusable or slot.popups or slot.uses >= self.cfg.context_reuse:
            await self._drop_context(slot)
        else:
            self.idle.append(slot)

    async def _discard(self, episode_id: str) -> None:
        """Throw away a hung episode's page and context; the worker carries on."""
        ep = self.episodes.pop(episode_id, None)
        if ep is not None:
            await ep.page.terminate_scripts()
            await self._drop_context(ep.slot)

    async def _drop_context(self, slot: ContextSlot) -> None:
        if slot.context_id and self.guarded.pop(slot.context_id, None) is slot and self.popup_guard is not None:
            self.popup_guard.forget(slot.context_id)
        with contextlib.suppress(TimeoutError, PlaywrightError):
            async with asyncio.timeout(10):
                await slot.context.close()


async def _end_traffic(traffic: EpisodeTraffic, episode_id: str) -> None:
    """The episode's interception stopped (before its tab is reset) and, for a recording, its archive written; an
    archive that cannot be written is logged (the engine sees no file)."""
    await traffic.detach()
    if traffic.spec.mode == "record":
        try:
            await traffic.save()
        except OSError as exc:
            log_line(f"episode {episode_id}: its traffic archive {traffic.spec.path} was not written: {exc}")
