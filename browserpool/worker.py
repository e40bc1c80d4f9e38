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
import socket
import sys
import tempfile
import time
from typing import Any

import msgspec
import zmq
import zmq.asyncio
from playwright.async_api import Browser, async_playwright
from playwright.async_api import Error as PlaywrightError

# Names imported "as" themselves are re-exported: they lived here, and code elsewhere imports them from here.
from browserpool import lifeline
from browserpool import protocol as P
from browserpool.auth import CURVE_ENV, ClientKeys, KeyFileError
from browserpool.config import WorkerConfig, launch_flags
from browserpool.consent import consent_script
from browserpool.contexts import ContextPool, ContextSlot, Episode
from browserpool.image_ops import _draw_marks as _draw_marks
from browserpool.instance import Instance
from browserpool.memory_watch import MemoryWatch, _newest_chromium
from browserpool.netpolicy import NetPolicy, with_engine_sites
from browserpool.observe import Observer
from browserpool.page import EpisodePage
from browserpool.page_errors import ActionRefused, CaptureFailed, PageHung, TabClosed
from browserpool.popup_guard import PopupGuard
from browserpool.proxy import RESOLVER_THREADS
from browserpool.renderer_watch import RendererWatch
from browserpool.request_rules import RequestRules
from browserpool.shm import SlotRing
from browserpool.stderr_log import log_line
from browserpool.traffic import EpisodeTraffic, TrafficError
from browserpool.upstream import ProxyPool
from browserpool.worker_exit import EXIT_ENGINE_GONE, Leaving, serve

EXIT_BROWSER_LOST = 3


class NoEpisode(Exception):
    """A request names an episode that has no page on this worker (closed, discarded, never opened)."""


class BrowserWorker(Observer, ContextPool, MemoryWatch, Leaving):
    """Serves Requests from the engine until told to shut down or its browser dies.

    Its parts: observations (:class:`~browserpool.observe.Observer`), the context pool
    (:class:`~browserpool.contexts.ContextPool`), the memory watch (:class:`~browserpool.memory_watch.MemoryWatch`)
    and the immediate exit (:class:`~browserpool.worker_exit.Leaving`); here: the socket loop and the requests."""

    def __init__(self, cfg: WorkerConfig) -> None:
        self.cfg = cfg
        self.ring: SlotRing | None = None
        self.use_shm = True
        self.browser: Browser | None = None
        self.browser_lost = False
        self.idle: list[ContextSlot] = []
        self.episodes: dict[str, Episode] = {}
        self.popup_guard: PopupGuard | None = None  # the bound on popups (browserpool/popup_guard.py)
        self.guarded: dict[str, ContextSlot] = {}
        self.inflight = 0
        # The network policy for pages (None: off); a bad entry fails the worker at start.
        cfg.net = with_engine_sites(cfg.net)  # sites served in-process
        self.netpolicy = NetPolicy.of(cfg.net)
        if cfg.proxies and self.netpolicy is None:
            raise ValueError("upstream proxies go through the network policy's proxy: they need net_policy on")
        # Upstream proxies (a bad entry or a missing credential variable fails the worker at start).
        self.proxies = (ProxyPool(cfg.proxies, cooldown_s=cfg.proxy_cooldown_s, timeout_s=cfg.settle_timeout_s)
                        if cfg.proxies else None)
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
        self.renderer_watch: RendererWatch | None = None  # made for the browser's root once it is known
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
                executable_path=cfg.chromium_path, args=launch_flags(cfg.chromium_flags), headless=True)
            self.browser.on("disconnected", lambda _b: self._on_browser_lost())
            await self._start_popup_guard()
            self._chromium_pid = _newest_chromium()
            self._start_renderer_watch()
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
        if self.renderer_watch is not None:
            self.renderer_watch.stop()
        if self.popup_guard is not None:
            await self.popup_guard.close()
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
        net = msgspec.structs.replace(net, deny=list(dict.fromkeys([*cfg.net.deny, *net.deny])))
        try:
            policy = NetPolicy.of(net)
        except ValueError as exc:
            log_line(f"worker {cfg.worker_id}: the engine's network policy is invalid ({exc}); keeping this "
                     "worker's own")
            return
        cfg.net = net
        self.netpolicy = policy

    async def _send(self, msg: P.Message) -> None:
        await self._sock.send(P.encode(msg), copy=False)

    def _release(self, pairs: list[tuple[int, int]]) -> None:
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
        except CaptureFailed as exc:
            reply = P.Reply(req.req_id, False, None, str(exc), P.ERR_CAPTURE)
        except Exception as exc:  # noqa: BLE001 - every request must get an answer
            if self.browser_lost:
                reply = P.Reply(req.req_id, False, None, "the browser process died", P.ERR_BROWSER)
            elif (kill := await self._page_memory_kill(self.episodes.get(req.episode_id))) is not None:
                await self._discard(req.episode_id)
                reply = P.Reply(req.req_id, False, None, f"the page's renderer held {kill.held_bytes / 2**20:.0f} "
                                f"MiB, over the {self.cfg.page_memory_mib} MiB page cap: it was ended, and its "
                                "context discarded", P.ERR_PAGE_MEMORY)
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
                return await ep.page.unless_crashed(self._episode_op(ep, operation))
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
            return await self._observe(ep, *await ep.page.settled(), None, som=operation.som, fmt=operation.format,
                                       axtree=operation.axtree, dom=operation.dom)
        if isinstance(operation, P.Locate):
            return await ep.page.locate(operation.selector)
        if isinstance(operation, P.Evaluate):
            return [await ep.page.evaluate(e) for e in operation.exprs]
        raise ActionRefused(f"unknown op {operation.op.value!r}")

    async def _open(self, episode_id: str, operation: P.Open) -> P.Observation:
        url, som, som_elements = operation.url, operation.som, operation.som_elements
        traffic = await _start_traffic(operation.traffic)  # a replay's archive read before a context is taken
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
        slot.popups = slot.refused = 0
        try:
            await self._count_popups(slot)
        except Exception:
            await self._drop_context(slot)
            raise
        # The engine lists at most som_elements: boxes past those would show ids the model cannot use.
        cap = self.cfg.som_max_elements
        ep = Episode(slot, som=som, som_cap=min(cap, som_elements) if som_elements else cap,
                     axtree=operation.axtree, dom=operation.dom, probe_js=operation.probe_js, traffic=traffic)
        self.episodes[episode_id] = ep
        ep.page.check_url(url)
        async with ep.busy:
            if traffic is not None:  # before the start page's first request
                await traffic.attach(ep.page.cdp)
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
            obs = await self._observe(ep, settle, timings, point, shot=operation.shot, retry_after=retry_after)
            if traffic is not None and traffic.spec.snapshot:  # what the start page loaded, for a group to replay
                await traffic.save(traffic.spec.snapshot)
            return obs

    async def _new_tab(self, slot: ContextSlot) -> None:
        """Open the context's episode tab (the worker's own page: not taken for a popup, nor counted by the popup
        guard once it counts the context's popups)."""
        slot.creating_page = True
        try:
            guard = self.popup_guard if self.guarded.get(slot.context_id) is slot else None
            if guard is not None:
                await guard.expect_tab(slot.context_id)
            slot.page = await EpisodePage.create(slot.context, self.cfg, slot.events, self.netpolicy)
            slot.page.guarded = guard is not None
        finally:
            slot.creating_page = False

    async def _reopen_tab(self, ep: Episode) -> None:
        """The page closed its own tab (``window.close()``, which a tab with one history entry may call): the
        episode goes on in a new tab of its context at the URL it had, as a browser restores a closed tab, and
        the next observation reports a ``closed`` event."""
        url = ep.page.url
        ep.slot.events.add("closed", url, "the page closed its tab: reopened at its URL")
        await self._new_tab(ep.slot)
        if ep.traffic is not None:
            await ep.traffic.attach(ep.page.cdp)
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



async def _start_traffic(spec: P.TrafficSpec | None) -> EpisodeTraffic | None:
    """The episode's recording or replay (``browserpool/traffic.py``); a replay whose archive cannot be read is
    refused."""
    if spec is None:
        return None
    try:
        return await asyncio.to_thread(EpisodeTraffic.start, spec, int(time.time() * 1000))
    except TrafficError as exc:
        raise ActionRefused(str(exc)) from None


def _worth_retrying(page: EpisodePage) -> bool:
    """Whether a start page's load failed in a way that may pass: an unreachable host, HTTP 5xx. (A page that
    timed out is kept: another try would cost the same again, and what it loaded may do.)"""
    if page.note is not None:  # refused by the network policy: final
        return False
    if page.load_error is not None:
        return not page.load_error.startswith(_FINAL_LOAD_ERRORS)
    return page.status is not None and page.status >= 500


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
    try:
        cfg = WorkerConfig.from_json(args.config) if args.config else WorkerConfig(endpoint=args.connect or "")
    except ValueError as exc:
        ap.error(str(exc))  # exits 2 with the field in the message
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
    # worker's contexts; each context may hold at most DNS_LOOKUPS_PER_CONTEXT of them (proxy).
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
