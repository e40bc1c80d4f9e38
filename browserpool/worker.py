"""A browser worker process: one Chromium (through Playwright), many BrowserContexts, one per live
episode, served over a ZeroMQ DEALER socket.

Run by the pool, or by hand on another host: ``webgym-engine worker --connect tcp://engine:5555``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import shutil
import signal
import socket
import sys
import tempfile
import threading
import time
from collections.abc import Awaitable
from dataclasses import dataclass, field
from typing import Any, NoReturn, TypeVar

import psutil
import zmq
import zmq.asyncio
from playwright.async_api import Browser, BrowserContext, Page, async_playwright
from playwright.async_api import Error as PlaywrightError

from browserpool import lifeline
from browserpool import protocol as P
from browserpool.auth import CURVE_ENV, ClientKeys, KeyFileError
from browserpool.config import WorkerConfig
from browserpool.consent import CONSENT_MODES, consent_script
from browserpool.instance import Instance
from browserpool.memory import tree_pss_bytes
from browserpool.netpolicy import RESOLVER_THREADS, ContextProxy, NetPolicy, bypass_list, engine_sites
from browserpool.page import ActionRefused, EpisodePage, EventLog, PageHung, TabClosed
from browserpool.page_scripts import INIT_SCRIPT, NO_WEBRTC_SCRIPT
from browserpool.request_rules import RequestRules
from browserpool.shm import SlotRing
from browserpool.stderr_log import log_line
from browserpool.upstream import ProxyPool

T = TypeVar("T")

EXIT_BROWSER_LOST = 3
SIGNAL_GRACE_S = 5.0  # how long a spawned worker signalled while its engine lives waits for the engine's Shutdown
EXIT_ENGINE_GONE = 4  # the engine that spawned this worker died (or was gone before the worker started)
_leaving = threading.Lock()  # held by the one caller of BrowserWorker.leave


class NoEpisode(Exception):
    """A request names an episode that has no page on this worker (closed, discarded, never opened)."""


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


@dataclass
class Episode:
    slot: ContextSlot
    busy: asyncio.Lock = field(default_factory=asyncio.Lock)
    som: bool = False  # Set-of-Marks: every observation lists the elements and shows them as boxes
    som_cap: int = 0  # the most elements a Set-of-Marks pass lists (and so draws): the open's cap within the worker's
    probe_js: str | None = None  # evaluated after every observation's settle; its value is Observation.probe
    last_shot: bytes | None = None  # the previous raw screenshot, for Observation.change

    @property
    def page(self) -> EpisodePage:
        assert self.slot.page is not None
        return self.slot.page


class BrowserWorker:
    """Serves Requests from the engine until told to shut down or its browser dies."""

    def __init__(self, cfg: WorkerConfig) -> None:
        self.cfg = cfg
        self.ring: SlotRing | None = None
        self.use_shm = True
        self.browser: Browser | None = None
        self.browser_lost = False
        self.idle: list[ContextSlot] = []
        self.episodes: dict[str, Episode] = {}
        self.inflight = 0
        # The network policy for pages (None: off); a bad entry fails the worker at start.
        cfg.net_exempt = list(dict.fromkeys([*cfg.net_exempt, *engine_sites()]))  # sites served in-process
        self.netpolicy = (NetPolicy(allow_private_network=cfg.allow_private_network, allow=cfg.net_allow,
                                    deny=cfg.net_deny, exempt=cfg.net_exempt) if cfg.net_policy else None)
        if cfg.proxies and self.netpolicy is None:
            raise ValueError("upstream proxies go through the network policy's proxy: they need net_policy on")
        # Upstream proxies (a bad entry or a missing credential variable fails the worker at start).
        self.proxies = (ProxyPool(cfg.proxies, cooldown_s=cfg.proxy_cooldown_s, timeout_s=cfg.settle_timeout_s)
                        if cfg.proxies else None)
        if cfg.consent not in CONSENT_MODES:
            raise ValueError(f"consent must be one of {CONSENT_MODES}, not {cfg.consent!r}")
        if cfg.request_rules and self.netpolicy is None:
            raise ValueError("request rules are applied by the network policy's proxy: they need net_policy on")
        self.rules = RequestRules.from_files(cfg.request_rules) if cfg.request_rules else None
        self._zctx = zmq.asyncio.Context()
        self._sock = self._zctx.socket(zmq.DEALER)
        self._sock.setsockopt(zmq.LINGER, 0)
        self._sock.setsockopt(zmq.MAXMSGSIZE, P.MAX_MESSAGE_BYTES)
        self.dropped_messages = 0
        self._tasks: set[asyncio.Task[Any]] = set()
        self._stop = asyncio.Event()
        # Memory watch: ``draining`` (reported in heartbeats) while the browser waits to be recycled.
        self.draining = False
        self.browser_recycles = 0
        self.browser_pss = 0  # bytes, at the last memory check (0: none yet); sent in every heartbeat
        self.contexts_over_memory = 0  # contexts discarded after their episode for their JS heap
        self._recycling = False
        self._browser_ready = asyncio.Event()  # cleared while the browser is being recycled
        self._browser_ready.set()
        self._chromium_pid = 0  # the browser's root process, found when first sampled

    # --- lifecycle ------------------------------------------------------------------------------
    async def run(self) -> int:
        cfg = self.cfg
        keys = client_keys(cfg)
        if keys is not None:
            keys.apply(self._sock)
        elif cfg.endpoint.startswith("tcp://") and not cfg.insecure:
            raise SystemExit(f"{cfg.endpoint} is tcp: give the engine's public key and this worker's key "
                             "(--server-key, --key), or run without authentication with --insecure")
        self._sock.connect(cfg.endpoint)
        # A hand-started worker names its ring under the same scheme, as its own instance (a reaper can then tell
        # whether its owner still lives).
        self.ring = SlotRing(cfg.slot_count, cfg.slot_size,
                             cfg.shm_name or Instance.current().new_shm_name(cfg.worker_id))
        pw = await async_playwright().start()
        try:
            self.browser = await pw.chromium.launch(
                executable_path=cfg.chromium_path, args=cfg.chromium_flags, headless=True)
            self.browser.on("disconnected", lambda _b: self._on_browser_lost())
            self._chromium_pid = _newest_chromium()
            self.browser_pss = await asyncio.to_thread(self._browser_pss)
            await self._send(P.Hello(cfg.worker_id, os.getpid(), socket.gethostname(), self._chromium_pid,
                                     self.browser.version, self.ring.name, cfg.slot_count, cfg.slot_size))
            # The first heartbeat goes before any reply: even a run of one short episode has the memory figure.
            await self._send(self._heartbeat_message())
            beat = asyncio.create_task(self._heartbeat())
            await self._serve()
            beat.cancel()
        finally:
            await self._cleanup(pw)
        return EXIT_BROWSER_LOST if self.browser_lost else 0

    async def _cleanup(self, pw: Any) -> None:
        for t in list(self._tasks):
            t.cancel()
        with contextlib.suppress(Exception):
            if self.browser and not self.browser_lost:
                async with asyncio.timeout(10):
                    await self.browser.close()
        with contextlib.suppress(Exception):
            async with asyncio.timeout(10):
                await pw.stop()
        if self.ring:
            self.ring.close()
        self._sock.close(0)
        self._zctx.destroy(linger=0)

    def _on_browser_lost(self) -> None:
        if self._recycling:
            return  # the old browser, closed on purpose (_recycle_browser)
        if not self._stop.is_set():
            self.browser_lost = True
            self._stop.set()

    async def _heartbeat(self) -> None:
        watch = asyncio.create_task(self._watch_browser_memory())
        try:
            while True:
                await asyncio.sleep(self.cfg.heartbeat_s)
                await self._send(self._heartbeat_message())
                self._maybe_recycle()  # a draining worker that went idle without a close (a discarded page)
        finally:
            watch.cancel()

    def _heartbeat_message(self) -> P.Heartbeat:
        return P.Heartbeat(self.cfg.worker_id, len(self.episodes), self.inflight, self.draining,
                           self._chromium_pid, self.browser_pss)

    async def _serve(self) -> None:
        stop = asyncio.create_task(self._stop.wait())
        while not self._stop.is_set():
            recv = asyncio.ensure_future(self._sock.recv())
            done, _ = await asyncio.wait({recv, stop}, return_when=asyncio.FIRST_COMPLETED)
            if recv not in done:
                recv.cancel()
                break
            try:
                msg = P.decode_from_engine(recv.result())
            except P.ProtocolError as exc:
                self.dropped_messages += 1
                log_line(f"worker {self.cfg.worker_id}: dropped a bad message: {exc}")
                continue
            if isinstance(msg, P.Request):
                self._release(msg.release)
                task = asyncio.create_task(self._handle(msg))
                self._tasks.add(task)
                task.add_done_callback(self._tasks.discard)
            elif isinstance(msg, P.Welcome):
                self.use_shm = msg.use_shm
                if msg.net is not None:
                    self._follow_engine_policy(msg.net)
            elif isinstance(msg, P.Shutdown):
                self._stop.set()
        if self.browser_lost and self._tasks:
            # Let in-flight requests report the crash before the process goes.
            await asyncio.wait(self._tasks, timeout=5)

    def _follow_engine_policy(self, net: P.NetSettings) -> None:
        """Take the engine's network policy (it arrives before any episode). The worker's own deny entries stay:
        an engine can widen nothing that the worker's operator denied. Bad entries keep the worker's own policy."""
        cfg = self.cfg
        deny = list(dict.fromkeys([*cfg.net_deny, *net.deny]))
        try:
            policy = (NetPolicy(allow_private_network=net.allow_private_network, allow=net.allow, deny=deny,
                                exempt=net.exempt) if net.enabled else None)
        except ValueError as exc:
            log_line(f"worker {cfg.worker_id}: the engine's network policy is invalid ({exc}); keeping this "
                     "worker's own")
            return
        cfg.net_policy, cfg.allow_private_network = net.enabled, net.allow_private_network
        cfg.net_allow, cfg.net_deny, cfg.net_exempt, cfg.net_hosts = net.allow, deny, net.exempt, net.hosts
        self.netpolicy = policy

    async def _send(self, msg: P.Message) -> None:
        await self._sock.send(P.encode(msg), copy=False)

    def _release(self, pairs: list[list[int]]) -> None:
        if self.ring:
            for slot, gen in pairs:
                self.ring.release(slot, gen)

    # --- requests ----------------------------------------------------------------------------------
    async def _handle(self, req: P.Request) -> None:
        self.inflight += 1
        try:
            body = await self._dispatch(req)
            reply = P.Reply(req.req_id, True, body)
        except ActionRefused as exc:
            reply = P.Reply(req.req_id, False, None, str(exc), P.ERR_REFUSED)
        except PageHung as exc:
            await self._discard(req.episode_id)
            reply = P.Reply(req.req_id, False, None, f"page hung: {exc}; its context was discarded", P.ERR_HUNG)
        except NoEpisode:
            reply = P.Reply(req.req_id, False, None, f"no open episode {req.episode_id!r} on this worker",
                            P.ERR_NO_EPISODE)
        except Exception as exc:  # noqa: BLE001 - every request must get an answer
            if self.browser_lost:
                reply = P.Reply(req.req_id, False, None, "the browser process died", P.ERR_BROWSER)
            else:
                reply = P.Reply(req.req_id, False, None, f"{type(exc).__name__}: {exc}", P.ERR_INTERNAL)
        finally:
            self.inflight -= 1
        if reply.error is not None:
            reply.error = P.error_text(reply.error)
        data = P.encode(reply)
        if len(data) > P.MAX_MESSAGE_BYTES:
            data = P.encode(self._too_large(reply, len(data)))
        with contextlib.suppress(zmq.ZMQError):
            await self._sock.send(data, copy=False)

    def _too_large(self, reply: P.Reply, size: int) -> P.Reply:
        """The error sent instead of a reply over the engine's message cap (which the engine's socket would drop,
        leaving the request unanswered): a page's value too large to send. Its screenshot's slot is freed."""
        if isinstance(reply.body, P.Observation) and reply.body.frame is not None and self.ring is not None:
            self.ring.release(reply.body.frame.slot, reply.body.frame.generation)
        return P.Reply(reply.req_id, False, None, f"the reply ({size:,} bytes) is over the {P.MAX_MESSAGE_BYTES:,}"
                       "-byte cap of a message: a value of the page too large to send", P.ERR_TOO_LARGE)

    async def _dispatch(self, req: P.Request) -> Any:
        operation = req.operation
        if isinstance(operation, P.Open):
            return await self._open(req.episode_id, operation)
        if isinstance(operation, P.Close):
            await self._close(req.episode_id)
            return None
        ep = self.episodes.get(req.episode_id)
        if ep is None:
            raise NoEpisode(req.episode_id)
        async with ep.busy:
            if ep.page.closed.is_set():  # the page closed its tab since the last operation
                await self._reopen_tab(ep)
            try:
                return await self._episode_op(ep, operation)
            except (TabClosed, PlaywrightError):
                if not await ep.page.tab_closed():
                    raise
            await self._reopen_tab(ep)
            if isinstance(operation, P.Act):  # the action made the page close its tab (a "close" button): it
                # was carried out
                return await self._observe(ep, *await ep.page.settled(), None, shot=operation.shot)
            return await self._episode_op(ep, operation)  # the others only read: again, on the new tab

    async def _episode_op(self, ep: Episode, operation: P.AnyOperation) -> Any:
        if isinstance(operation, P.Act):
            return await self._observe(ep, *await ep.page.perform(operation.action), shot=operation.shot)
        if isinstance(operation, P.Observe):
            return await self._observe(ep, *await ep.page.settled(), None, som=operation.som, fmt=operation.format)
        if isinstance(operation, P.Locate):
            return await ep.page.locate(operation.selector)
        if isinstance(operation, P.Evaluate):
            return [await ep.page.evaluate(e) for e in operation.exprs]
        raise ActionRefused(f"unknown op {operation.op.value!r}")

    async def _open(self, episode_id: str, operation: P.Open) -> P.Observation:
        url, som, som_elements = operation.url, operation.som, operation.som_elements
        await self._browser_ready.wait()  # a browser recycle in progress: open on the new browser
        if episode_id in self.episodes:
            await self._close(episode_id)
        slot = self.idle.pop() if self.idle else await self._new_context()
        slot.uses += 1
        if slot.page is None:
            try:
                await self._new_tab(slot)
            except Exception:
                await self._drop_context(slot)
                raise
        slot.events.clear()  # a previous episode's late events are not this one's
        slot.popups = 0
        # The engine lists at most som_elements: boxes past those would show ids the model cannot use.
        cap = self.cfg.som_max_elements
        ep = Episode(slot, som=som, som_cap=min(cap, som_elements) if som_elements else cap,
                     probe_js=operation.probe_js)
        self.episodes[episode_id] = ep
        ep.page.check_url(url)
        async with ep.busy:
            retries = 0
            while True:
                settle, timings, point = await ep.page.perform(P.BrowserAction("navigate", url=url),
                                                               self.cfg.open_timeout_s)
                if retries == self.cfg.open_retries or not _worth_retrying(ep.page):
                    break
                # A transient failure of the start page (a host that did not answer, a 5xx): again, backing off.
                await asyncio.sleep(self.cfg.open_backoff_s * 2 ** retries)
                retries += 1
            if retries:
                timings["open_retries"] = float(retries)
            # A rate limiter's answer: how long it wants the agent away (the engine's blocklist keeps to it).
            retry_after = await ep.page.retry_after() if ep.page.status == 429 else None
            if ep.page.note is not None:
                # The task's own start page is refused: the episode cannot run as specified.
                raise ActionRefused(ep.page.note)
            if self.cfg.consent != "off":
                await self._answer_consent(ep, url, timings)
            await ep.page.forget_history()
            if operation.setup_js is not None:
                # The first screenshot must show the page as the setup left it (e.g. a generated task).
                settle, setup_timings = await ep.page.run_setup(operation.setup_js)
                timings.update(setup_timings)
            return await self._observe(ep, settle, timings, point, shot=operation.shot, retry_after=retry_after)

    async def _new_tab(self, slot: ContextSlot) -> None:
        """Open the context's episode tab (the worker's own page: not taken for a popup)."""
        slot.creating_page = True
        try:
            slot.page = await EpisodePage.create(slot.context, self.cfg, slot.events, self.netpolicy)
        finally:
            slot.creating_page = False

    async def _reopen_tab(self, ep: Episode) -> None:
        """The page closed its own tab (``window.close()``, which a tab with one history entry may call): the
        episode goes on in a new tab of its context at the URL it had, as a browser restores a closed tab, and
        the next observation reports a ``closed`` event."""
        url = ep.page.url
        ep.slot.events.add("closed", url, "the page closed its tab: reopened at its URL")
        await self._new_tab(ep.slot)
        if url.lower().startswith(("http://", "https://")):
            # Within an action's own cap, not an open's: this is part of the request under way.
            await ep.page.perform(P.BrowserAction("navigate", url=url))
            await ep.page.forget_history()

    async def _answer_consent(self, ep: Episode, url: str, timings: dict[str, float]) -> None:
        """Click the configured button of a known consent manager's wall, if the start page shows one (recorded as a
        ``consent`` event: what the model sees is then not what the site first showed)."""
        try:
            clicked = await ep.page.evaluate(consent_script(self.cfg.consent))
        except PlaywrightError:  # the document went away meanwhile
            return
        if isinstance(clicked, str):
            ep.slot.events.add("consent", url, f"{self.cfg.consent}: {clicked}")
            _, settle_timings = await ep.page.settled()
            timings["consent_ms"] = settle_timings["settle_ms"]

    async def _observe(self, ep: Episode, settle: str, timings: dict[str, float],
                       point: tuple[float, float] | None, *, som: bool | None = None, shot: bool = True,
                       fmt: str = "jpeg", retry_after: str | None = None) -> P.Observation:
        """The settled page as an Observation: the screenshot (``fmt`` jpeg or png; Set-of-Marks boxes drawn on
        it with ``som``, default the episode's mode), its elements, the probe's value and the page's events.
        ``shot`` False: no screenshot (a client that asks for one when it wants it: the HTTP server). ``retry_after``:
        a rate-limited start page's Retry-After header (opens only)."""
        page = ep.page
        elements: list[list[Any]] | None = None
        cut: str | None = None  # why the Set-of-Marks pass stopped early
        note, page.note = page.note, None  # what the action's own navigation ran into (a refused load)
        som = ep.som if som is None else som
        probe: Any = None
        if ep.probe_js is not None:
            t0 = time.perf_counter()
            try:
                probe = await page.evaluate(ep.probe_js)
            except PlaywrightError as exc:  # the document went away meanwhile (a late navigation)
                probe = {"error": str(exc).splitlines()[0][:200]}
            timings["probe_ms"] = _ms(t0)
        if not shot:
            return P.Observation(url=page.url, title=page.title, settled=settle == "quiet", settle=settle,
                                 width=self.cfg.viewport_width, height=self.cfg.viewport_height,
                                 timings_ms=timings, point=point, note=note, probe=probe,
                                 events=ep.slot.events.take(), status=page.status, load_error=page.load_error,
                                 retry_after=retry_after)
        if som:
            # Two independent CDP commands of the same settled page: sent together, one round trip instead
            # of two.
            cfg = self.cfg
            captured, marks = await asyncio.gather(
                _timed(page.screenshot(fmt)), _timed(page.som(ep.som_cap, cfg.som_budget_ms)),
                return_exceptions=True)
            if isinstance(captured, BaseException):
                raise captured
            image, timings["screenshot_ms"] = captured
            raw = image
            css_width = float(self.cfg.viewport_width)
            if isinstance(marks, PlaywrightError):
                # The document went away during the pass (a late navigation): a plain frame this time.
                elements, note, timings["som_ms"] = [], f"no elements: {marks}".splitlines()[0][:200], 0.0
            elif isinstance(marks, BaseException):
                raise marks
            else:
                (css_width, elements, cut), timings["som_ms"] = marks
                if cut is not None:
                    why = f"its cap of {ep.som_cap}" if cut == "count" else f"its time budget of {cfg.som_budget_ms} ms"
                    cut_note = (f"Set-of-Marks: {len(elements)} elements listed, the pass stopped at {why}; the page "
                                "may have more")
                    note = cut_note if note is None else f"{note}; {cut_note}"
            t0 = time.perf_counter()
            if elements:
                image = await asyncio.get_running_loop().run_in_executor(
                    None, _draw_marks, image, elements, css_width, self.cfg.jpeg_quality, fmt)
            timings["draw_ms"] = _ms(t0)
        else:
            t0 = time.perf_counter()
            image = await page.screenshot(fmt)
            timings["screenshot_ms"] = _ms(t0)
            raw = image
        change = None
        if fmt == "jpeg":  # the comparison reads JPEGs; an occasional PNG capture leaves the last JPEG in place
            if ep.last_shot is not None:
                t0 = time.perf_counter()
                change = await asyncio.get_running_loop().run_in_executor(None, _changed_fraction, ep.last_shot,
                                                                          raw)
                timings["diff_ms"] = _ms(t0)
            ep.last_shot = raw
        ref = self.ring.write(image) if (self.ring and self.use_shm) else None
        # A Reply's body: msgspec encodes the struct as an array.
        return P.Observation(url=page.url, title=page.title, settled=settle == "quiet", settle=settle,
                             width=self.cfg.viewport_width, height=self.cfg.viewport_height, frame=ref,
                             frame_bytes=None if ref else image, timings_ms=timings, point=point, note=note,
                             elements=elements, probe=probe, change=change, events=ep.slot.events.take(),
                             status=page.status, load_error=page.load_error, retry_after=retry_after,
                             elements_cut=cut)

    async def _new_context(self) -> ContextSlot:
        assert self.browser is not None
        cfg = self.cfg
        events = EventLog(cfg.max_events_per_observation)
        proxy = None
        extra: dict[str, Any] = {}
        if self.netpolicy is not None:
            # One proxy per context: every load it refuses is this context's, hence its episode's. The engine's
            # own sites bypass it (no cost on the bundled sites); "<-loopback>" sends every other loopback
            # load through it, too.
            proxy = ContextProxy(self.netpolicy, lambda url, rule: events.add("refused", url, rule),
                                 cfg.net_hosts, cfg.settle_timeout_s,
                                 on_unreachable=lambda url, detail: events.add("unreachable", url, detail),
                                 upstream=self.proxies, rules=self.rules)
            await proxy.start()
            extra["proxy"] = {"server": proxy.server, "bypass": bypass_list(cfg.net_exempt)}
        try:
            ctx = await self.browser.new_context(
                viewport={"width": cfg.viewport_width, "height": cfg.viewport_height},
                device_scale_factor=1, locale="en-US", timezone_id="UTC", service_workers="block",
                accept_downloads=False, **({"user_agent": cfg.user_agent} if cfg.user_agent else {}), **extra)
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

    def _on_page(self, slot: ContextSlot, page: Page) -> None:
        """A page the context opened besides the episode's tab (a popup, a new tab): closed at once. The
        episode's tab has already taken the URL of a popup its action opened (EpisodePage); one it did not
        announce (opened from an out-of-process frame) is recorded here."""
        if slot.creating_page or (slot.page is not None and page is slot.page.page):
            return
        ep_page = slot.page
        if ep_page is not None and ep_page.announced_popups > 0:
            ep_page.announced_popups -= 1
        elif ep_page is not None:
            ep_page.popup_closed(page.url)
        else:
            slot.events.add("popup", page.url, "closed")
        slot.popups += 1  # the context is not reused after this episode
        task = asyncio.ensure_future(self._close_page(page))
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
        with contextlib.suppress(TimeoutError, PlaywrightError):
            async with asyncio.timeout(10):
                await slot.context.close()

    # --- memory watch ------------------------------------------------------------------------------
    async def _context_over_memory(self, ep: Episode) -> bool:
        """Whether the episode's page holds more heap (V8 plus Blink's) than ``context_memory_mib``: one CDP
        round trip per episode. A renderer keeps what its pages allocated across a reset (a new document in the
        same process), so a heavy one is discarded instead of serving the next episode."""
        cap = self.cfg.context_memory_mib
        if cap <= 0 or ep.slot.page is None:
            return False
        try:
            async with asyncio.timeout(2.0):
                usage = await ep.page.cdp.send("Runtime.getHeapUsage")
        except (TimeoutError, PlaywrightError):
            return False  # unknown: the reset that follows decides (a page that does not answer is dropped)
        used = int(usage.get("usedSize", 0)) + int(usage.get("embedderHeapUsedSize", 0))
        if used <= cap << 20:
            return False
        self.contexts_over_memory += 1
        log_line(f"worker {self.cfg.worker_id}: a context's heap is {used / 2**20:.0f} MiB, over the "
                 f"{cap} MiB cap: discarded, not reused")
        return True

    def _browser_pss(self) -> int:
        """PSS of the browser's process tree (blocking: run in a thread)."""
        if not self._chromium_pid or not psutil.pid_exists(self._chromium_pid):
            self._chromium_pid = _newest_chromium()
        return tree_pss_bytes(self._chromium_pid)

    async def _watch_browser_memory(self) -> None:
        """Every ``memory_check_s``, read the browser's PSS (in a thread: a few ms of kernel time per process, not
        per step) for the heartbeats (the engine's memory figures); above ``browser_memory_mib`` (unless 0) the
        worker drains: it says so in its heartbeat (the pool leases it no new episodes) and recycles the browser as
        soon as no episode is live."""
        cap = self.cfg.browser_memory_mib << 20
        cost = 0.0  # the first reading was taken at start, before the worker said hello
        while True:
            # Reading PSS costs a few ms of kernel time per process: with many renderers the interval stretches
            # so that the watch stays under ~2% of one core.
            await asyncio.sleep(max(self.cfg.memory_check_s, 50 * cost))
            cost = 0.0
            if not self.draining and self.browser is not None:
                t0 = time.perf_counter()
                self.browser_pss = pss = await asyncio.to_thread(self._browser_pss)
                cost = time.perf_counter() - t0
                if cap and pss > cap and not self.draining:
                    await self._start_draining(pss)

    async def _start_draining(self, pss: int) -> None:
        """The browser is over its memory cap: take no new episodes, say so now, recycle it once idle."""
        self.draining = True
        log_line(f"worker {self.cfg.worker_id}: browser PSS {pss / 2**20:.0f} MiB is over the "
                 f"{self.cfg.browser_memory_mib} MiB cap: draining, then recycling it")
        with contextlib.suppress(zmq.ZMQError):
            await self._send(self._heartbeat_message())  # now, not at the next beat
        self._maybe_recycle()

    def _recycle_after_request(self) -> None:
        """Once the current request (an episode's close) has been answered, recycle if draining and idle."""
        task = asyncio.current_task()
        if self.draining and task is not None:
            task.add_done_callback(lambda _t: self._maybe_recycle())

    def _maybe_recycle(self) -> None:
        """Start the browser recycle if the worker is draining and nothing is live or in flight. Synchronous:
        nothing can slip in between the check and ``_browser_ready`` being cleared (opens wait on it)."""
        if (not self.draining or self._recycling or self.episodes or self.inflight or self.browser is None
                or self._stop.is_set()):
            return
        self._recycling = True
        self._browser_ready.clear()
        task = asyncio.create_task(self._recycle_browser())
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _recycle_browser(self) -> None:
        """Close the browser (its idle contexts with it) and launch a new one; then take episodes again."""
        old, self.browser = self.browser, None
        assert old is not None
        t0 = time.perf_counter()
        try:
            # Through _drop_context, so that whatever else a context holds is let go of as well.
            idle, self.idle = self.idle, []
            for slot in idle:
                await self._drop_context(slot)
            with contextlib.suppress(Exception):
                async with asyncio.timeout(10):
                    await old.close()
            self.browser = await old.browser_type.launch(
                executable_path=self.cfg.chromium_path, args=self.cfg.chromium_flags, headless=True)
            self.browser.on("disconnected", lambda _b: self._on_browser_lost())
            self._chromium_pid = _newest_chromium()
            self.browser_pss = 0  # the old tree's reading; the watch reads the new one at its next check
            self.browser_recycles += 1
            self.draining = False
            log_line(f"worker {self.cfg.worker_id}: browser recycled in {_ms(t0):.0f} ms")
            with contextlib.suppress(zmq.ZMQError):
                await self._send(self._heartbeat_message())  # not draining any more: lease it episodes again
        except Exception as exc:  # noqa: BLE001 - no browser: the worker exits and is replaced
            log_line(f"worker {self.cfg.worker_id}: browser recycle failed: {exc}")
            self._recycling = False
            self._on_browser_lost()
        finally:
            self._recycling = False
            self._browser_ready.set()

    # --- dying --------------------------------------------------------------------------------------
    def kill_browser(self) -> int:
        """Kill this worker's Chromium (its whole process group: Playwright starts it detached) and the
        Playwright driver now, with SIGKILL; returns how many processes were signalled. Synchronous: safe from
        a signal handler or another thread."""
        return lifeline.kill_descendants()

    def leave(self, reason: str, code: int, tmp_dir: str | None = None) -> NoReturn:
        """Exit at once (SIGTERM, SIGHUP, the engine's death): kill the browser and driver, unlink the frame
        ring, remove ``tmp_dir``; no graceful close, which could wait on a dead engine. From any thread."""
        _leaving.acquire()  # a second caller (the signal and the watch both fire) waits for the exit
        log_line(f"worker {self.cfg.worker_id}: {reason}; killing the browser and exiting")
        if self.ring is not None:
            # Unlink only: unmapping could pull the memory from under a write in progress. (The resource tracker,
            # which would otherwise unlink it too and warn, is killed below with the other descendants.)
            with contextlib.suppress(OSError):
                os.unlink(os.path.join("/dev/shm", self.ring.name.lstrip("/")))
        with contextlib.suppress(Exception):
            self.kill_browser()
        if tmp_dir:
            shutil.rmtree(tmp_dir, ignore_errors=True)
        os._exit(code)


def client_keys(cfg: WorkerConfig) -> ClientKeys | None:
    """The worker's CURVE keys: handed over by the pool that spawned it (environment, removed at once so that
    Chromium never inherits it), or read from the key files given on the command line; None without CURVE."""
    handed = os.environ.pop(CURVE_ENV, None)
    if handed:
        return ClientKeys.from_env(handed)
    if cfg.server_key_file and cfg.key_file:
        return ClientKeys.load(cfg.server_key_file, cfg.key_file)
    if cfg.server_key_file or cfg.key_file:
        raise KeyFileError("CURVE needs both --server-key (the engine's public key) and --key (this worker's "
                           "secret key)")
    return None


# Net errors that another try cannot fix: a certificate, a download, a load the page itself aborted.
_FINAL_LOAD_ERRORS = ("net::ERR_CERT", "net::ERR_SSL", "net::ERR_ABORTED", "net::ERR_BLOCKED",
                      "net::ERR_INVALID_URL", "net::ERR_UNSAFE")


def _worth_retrying(page: EpisodePage) -> bool:
    """Whether a start page's load failed in a way that may pass: an unreachable host, HTTP 5xx. (A page that
    timed out is kept: another try would cost the same again, and what it loaded may do.)"""
    if page.note is not None:  # refused by the network policy: final
        return False
    if page.load_error is not None:
        return not page.load_error.startswith(_FINAL_LOAD_ERRORS)
    return page.status is not None and page.status >= 500


def _ms(t0: float) -> float:
    return round((time.perf_counter() - t0) * 1000.0, 2)


async def _timed(coro: Awaitable[T]) -> tuple[T, float]:
    """The coroutine's result and how long it took (ms), for operations that run side by side."""
    t0 = time.perf_counter()
    return await coro, _ms(t0)


# The least change reported for captures that differ at all (Observation.change).
MIN_CHANGE = 1e-6


def _changed_fraction(before: bytes, after: bytes) -> float | None:
    """How much of the page changed between two screenshots (in a thread: the codec releases the GIL): 0.0 only for
    byte-identical captures (Chromium encodes an unchanged page to the same bytes), else at least MIN_CHANGE, so
    that any difference counts as a change, as the original's exact comparison of the frames has it (a word typed
    into a search box changes well under 0.1% of the pixels)."""
    if before == after:
        return 0.0
    from engine import _imgcodec as imgcodec

    try:
        return max(imgcodec.frame_diff(before, after)[0], MIN_CHANGE)
    except imgcodec.ImgCodecError:
        return None


def _draw_marks(image: bytes, elements: list[list[Any]], css_width: float, quality: int, fmt: str = "jpeg") -> bytes:
    """The screenshot with the elements drawn on as numbered boxes by the compiled codec (run in a thread: it
    releases the GIL); the same format as it came. Screenshot pixels per CSS px are measured, not assumed
    (zoom, device scale factor)."""
    from engine import _imgcodec as imgcodec  # here: a worker that never draws does not load numpy

    img = imgcodec.decode(image) if fmt == "jpeg" else _png_pixels(image)
    s = img.shape[1] / css_width if css_width > 0 else 1.0
    imgcodec.draw_som(img, [(e[0], round(e[3] * s), round(e[4] * s), round((e[3] + e[5]) * s),
                             round((e[4] + e[6]) * s)) for e in elements])
    return imgcodec.encode(img, quality) if fmt == "jpeg" else _png_bytes(img)


def _png_pixels(png: bytes) -> Any:
    """A PNG as a writable (H, W, 3) uint8 array (PNG captures are for clients that ask for them only)."""
    import io

    import numpy as np
    from PIL import Image

    with Image.open(io.BytesIO(png)) as im:
        return np.array(im.convert("RGB"))


def _png_bytes(img: Any) -> bytes:
    """An (H, W, 3) uint8 array as PNG (the fastest zlib level: these are sent, not archived)."""
    import io

    from PIL import Image

    buf = io.BytesIO()
    Image.fromarray(img).save(buf, "PNG", compress_level=1)
    return buf.getvalue()


def _newest_chromium() -> int:
    """The most recently started root Chromium process under this worker (after a recycle the old one may
    still be exiting), 0 if none."""
    best, best_start = 0, -1.0
    for proc in psutil.Process().children(recursive=True):
        try:
            parent = proc.parent()
            if ("chrom" in proc.name() and "chrom" not in (parent.name() if parent else "")
                    and proc.create_time() > best_start):
                best, best_start = proc.pid, proc.create_time()
        except psutil.Error:
            continue
    return best


async def serve(worker: BrowserWorker, engine: Instance | None = None, tmp_dir: str | None = None) -> int:
    """Run ``worker`` until it is told to shut down or its browser dies.

    ``engine``: the process that spawned this worker (None for a worker started by hand). Its death makes the
    worker leave at once (:meth:`BrowserWorker.leave`: browser killed, ring unlinked). SIGTERM and SIGHUP (and
    SIGINT, for a spawned worker) do the same when there is no live engine; while the engine lives they are ignored
    if the engine ignores them, else they start a grace period for the engine's own Shutdown (the engine was most
    likely signalled too, and closes its episodes on this worker first)."""
    # A dead engine cannot remove its own temp directory (the one above tmp_dir): its workers do.
    parent = os.path.dirname(tmp_dir.rstrip("/")) if tmp_dir else ""
    engines_dir = parent if engine and os.path.basename(parent).startswith(engine.tmp_prefix()) else None

    def engine_gone() -> bool:
        # Re-parented: the parent-death signal came (the engine may still be a zombie in /proc).
        return engine is not None and (os.getppid() != engine.pid or not engine.alive())

    loop = asyncio.get_running_loop()
    grace: list[asyncio.TimerHandle] = []

    def on_signal(sig: signal.Signals) -> None:
        if engine is None or engine_gone():
            reason = f"got {sig.name}" + (f" (the engine, pid {engine.pid}, is gone)" if engine else "")
            worker.leave(reason, 128 + sig, engines_dir or tmp_dir)
        if lifeline.ignores_signal(engine.pid, sig):
            return  # sent to every process (systemd stops a whole cgroup) and the engine ignores it: so does its worker
        if not grace:
            # The engine lives and was most likely signalled too (systemd signals every process of its cgroup; the
            # pool starts workers in a session of their own, so a process-group signal never gets here). Stopping,
            # it still needs this worker to close its episodes, then shuts it down: leave on its own only if that
            # does not come.
            log_line(f"worker {worker.cfg.worker_id}: got {sig.name}; leaving in {SIGNAL_GRACE_S:g} s unless the "
                     "engine shuts this worker down first")
            grace.append(loop.call_later(SIGNAL_GRACE_S, worker.leave, f"got {sig.name}", 128 + sig, tmp_dir))

    # A spawned worker takes a SIGINT sent to it the same way; one started by hand keeps Ctrl-C's graceful
    # KeyboardInterrupt.
    for sig in (signal.SIGTERM, signal.SIGHUP, *((signal.SIGINT,) if engine is not None else ())):
        loop.add_signal_handler(sig, on_signal, sig)
    if engine is not None:
        lifeline.EngineWatch(engine, lambda: worker.leave(f"the engine (pid {engine.pid}) is gone",
                                                          EXIT_ENGINE_GONE, engines_dir or tmp_dir)).start()
    return await worker.run()


def _use_tmp_dir(path: str) -> None:
    """Make ``path`` (private to this worker, removed at exit) the temp directory of this process and of the
    Playwright driver and Chromium it starts (their profiles and shared-memory files go there)."""
    os.makedirs(path, mode=0o700, exist_ok=True)
    os.environ["TMPDIR"] = path
    tempfile.tempdir = path


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``python -m browserpool.worker``."""
    ap = argparse.ArgumentParser(description="webgym-engine browser worker")
    ap.add_argument("--config", help="WorkerConfig as JSON (the pool passes this)")
    ap.add_argument("--connect", help="engine endpoint, e.g. ipc:///tmp/x or tcp://host:5555")
    ap.add_argument("--worker-id")
    ap.add_argument("--server-key", help="the engine's public key file (CURVE, tcp)")
    ap.add_argument("--key", help="this worker's secret key file (CURVE, tcp)")
    ap.add_argument("--insecure", action="store_true", help="tcp without CURVE authentication")
    ap.add_argument("--engine", help="PID:START of the engine that spawned this worker (the pool passes this): "
                                     "the worker dies with it")
    ap.add_argument("--tmp-dir", help="a private temporary directory for the browser, removed at exit (default for a "
                                      "worker started by hand: a new one under the system's)")
    args = ap.parse_args(argv)
    engine = lifeline.parse_engine(args.engine) if args.engine else None
    if engine is not None and not lifeline.bind_to_parent(engine):
        log_line(f"worker: the engine (pid {engine.pid}) is gone; not starting")
        return EXIT_ENGINE_GONE
    if not args.tmp_dir and engine is None:
        # Started by hand: a private temp dir all the same, so that what a killed Chromium leaves (its profile,
        # its shared-memory files) goes with this worker; named for this instance, so that if the worker itself is
        # killed, the next engine or worker on this host reaps it.
        args.tmp_dir = tempfile.mkdtemp(prefix=Instance.current().tmp_prefix())
    if args.tmp_dir:
        _use_tmp_dir(args.tmp_dir)
    cfg = WorkerConfig.from_json(args.config) if args.config else WorkerConfig(endpoint=args.connect or "")
    if args.connect:
        cfg.endpoint = args.connect
    if args.worker_id:
        cfg.worker_id = args.worker_id
    cfg.server_key_file = args.server_key or cfg.server_key_file
    cfg.key_file = args.key or cfg.key_file
    cfg.insecure = args.insecure or cfg.insecure
    if not cfg.endpoint:
        ap.error("--connect or --config is required")
    if cfg.shm_name is None:
        # Started by hand: the worker is its own instance, so its ring is named after itself (the engine maps only
        # rings under the naming scheme, and a later engine on this host reaps it if this worker is killed).
        cfg.shm_name = Instance.current().new_shm_name(cfg.worker_id)
    # The network proxies' name lookups run in libuv's thread pool (4 threads unless told), shared by all of this
    # worker's contexts; each context may hold at most DNS_LOOKUPS_PER_CONTEXT of them (netpolicy).
    os.environ.setdefault("UV_THREADPOOL_SIZE", str(RESOLVER_THREADS))
    try:
        import uvloop
        return uvloop.run(serve(BrowserWorker(cfg), engine, args.tmp_dir))
    except KeyFileError as exc:
        log_line(f"worker {cfg.worker_id}: {exc}")
        return 2
    except KeyboardInterrupt:
        return 0
    finally:
        if args.tmp_dir:
            shutil.rmtree(args.tmp_dir, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
