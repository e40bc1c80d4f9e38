"""A browser worker process: one Chromium (through Playwright), many BrowserContexts, one per live
episode, served over a ZeroMQ DEALER socket.

Run by the pool, or by hand on another host: ``webgym-engine worker --connect tcp://engine:5555``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import socket
import sys
import time
from collections.abc import Awaitable
from dataclasses import dataclass, field
from typing import Any, TypeVar

import psutil
import zmq
import zmq.asyncio
from playwright.async_api import Browser, BrowserContext, async_playwright
from playwright.async_api import Error as PlaywrightError

from browserpool import protocol as P
from browserpool.config import WorkerConfig
from browserpool.page import ActionRefused, EpisodePage, PageHung
from browserpool.page_scripts import INIT_SCRIPT
from browserpool.shm import SlotRing

T = TypeVar("T")

EXIT_BROWSER_LOST = 3


class NoEpisode(Exception):
    """A request names an episode that has no page on this worker (closed, discarded, never opened)."""


@dataclass
class ContextSlot:
    """A BrowserContext and its tab, kept between episodes (state cleared), and its use count."""

    context: BrowserContext
    page: EpisodePage | None = None
    uses: int = 0


@dataclass
class Episode:
    slot: ContextSlot
    busy: asyncio.Lock = field(default_factory=asyncio.Lock)
    som: bool = False  # Set-of-Marks: every observation lists the elements and shows them as boxes
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
        self._zctx = zmq.asyncio.Context()
        self._sock = self._zctx.socket(zmq.DEALER)
        self._sock.setsockopt(zmq.LINGER, 0)
        self._tasks: set[asyncio.Task[Any]] = set()
        self._stop = asyncio.Event()

    # --- lifecycle ------------------------------------------------------------------------------
    async def run(self) -> int:
        cfg = self.cfg
        self._sock.connect(cfg.endpoint)
        self.ring = SlotRing(cfg.slot_count, cfg.slot_size)
        pw = await async_playwright().start()
        try:
            self.browser = await pw.chromium.launch(
                executable_path=cfg.chromium_path, args=cfg.chromium_flags, headless=True)
            self.browser.on("disconnected", lambda _b: self._on_browser_lost())
            await self._send(P.Hello(cfg.worker_id, os.getpid(), socket.gethostname(), _browser_pid(),
                                     self.browser.version, self.ring.name, cfg.slot_count, cfg.slot_size))
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
                await asyncio.wait_for(self.browser.close(), 10)
        with contextlib.suppress(Exception):
            await asyncio.wait_for(pw.stop(), 10)
        if self.ring:
            self.ring.close()
        self._sock.close(0)
        self._zctx.term()

    def _on_browser_lost(self) -> None:
        if not self._stop.is_set():
            self.browser_lost = True
            self._stop.set()

    async def _heartbeat(self) -> None:
        while True:
            await self._send(P.Heartbeat(self.cfg.worker_id, len(self.episodes), self.inflight))
            await asyncio.sleep(self.cfg.heartbeat_s)

    async def _serve(self) -> None:
        stop = asyncio.create_task(self._stop.wait())
        while not self._stop.is_set():
            recv = asyncio.ensure_future(self._sock.recv())
            done, _ = await asyncio.wait({recv, stop}, return_when=asyncio.FIRST_COMPLETED)
            if recv not in done:
                recv.cancel()
                break
            try:
                msg = P.decode(recv.result())
            except P.ProtocolError as exc:
                print(f"worker {self.cfg.worker_id}: {exc}", file=sys.stderr)
                continue
            if isinstance(msg, P.Request):
                self._release(msg.release)
                task = asyncio.create_task(self._handle(msg))
                self._tasks.add(task)
                task.add_done_callback(self._tasks.discard)
            elif isinstance(msg, P.Welcome):
                self.use_shm = msg.use_shm
            elif isinstance(msg, P.Shutdown):
                self._stop.set()
        if self.browser_lost and self._tasks:
            # Let in-flight requests report the crash before the process goes.
            await asyncio.wait(self._tasks, timeout=5)

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
        with contextlib.suppress(zmq.ZMQError):
            await self._send(reply)

    async def _dispatch(self, req: P.Request) -> Any:
        op, args = req.op, req.args
        if op == "open":
            return await self._open(req.episode_id, args["url"], bool(args.get("som", False)),
                                    args.get("setup_js"), args.get("probe_js"))
        if op == "close":
            await self._close(req.episode_id)
            return None
        ep = self.episodes.get(req.episode_id)
        if ep is None:
            raise NoEpisode(req.episode_id)
        async with ep.busy:
            if op == "act":
                action = P.BrowserAction.from_wire(args["action"])
                return await self._observe(ep, *await ep.page.perform(action))
            if op == "locate":
                return await ep.page.locate(args["selector"])
            if op == "evaluate":
                return [await ep.page.evaluate(e) for e in args["exprs"]]
        raise ActionRefused(f"unknown op {op!r}")

    async def _open(self, episode_id: str, url: str, som: bool = False, setup_js: str | None = None,
                    probe_js: str | None = None) -> list[Any]:
        if episode_id in self.episodes:
            await self._close(episode_id)
        slot = self.idle.pop() if self.idle else await self._new_context()
        slot.uses += 1
        if slot.page is None:
            try:
                slot.page = await EpisodePage.create(slot.context, self.cfg)
            except Exception:
                await self._drop_context(slot)
                raise
        ep = Episode(slot, som=som, probe_js=probe_js)
        self.episodes[episode_id] = ep
        ep.page.check_url(url)
        async with ep.busy:
            settle, timings, point = await ep.page.perform(P.BrowserAction("navigate", url=url),
                                                           self.cfg.open_timeout_s)
            await ep.page.forget_history()
            if setup_js is not None:
                # The first screenshot must show the page as the setup left it (e.g. a generated task).
                settle, setup_timings = await ep.page.run_setup(setup_js)
                timings.update(setup_timings)
            return await self._observe(ep, settle, timings, point)

    async def _observe(self, ep: Episode, settle: str, timings: dict[str, float],
                       point: tuple[float, float] | None) -> list[Any]:
        page = ep.page
        elements: list[list[Any]] | None = None
        note: str | None = None
        probe: Any = None
        if ep.probe_js is not None:
            t0 = time.perf_counter()
            try:
                probe = await page.evaluate(ep.probe_js)
            except PlaywrightError as exc:  # the document went away meanwhile (a late navigation)
                probe = {"error": str(exc).splitlines()[0][:200]}
            timings["probe_ms"] = _ms(t0)
        if ep.som:
            # Two independent CDP commands of the same settled page: sent together, one round trip instead
            # of two.
            shot, som = await asyncio.gather(_timed(page.screenshot()), _timed(page.som()),
                                             return_exceptions=True)
            if isinstance(shot, BaseException):
                raise shot
            jpeg, shot_ms = shot
            raw = jpeg
            css_width = float(self.cfg.viewport_width)
            if isinstance(som, PlaywrightError):
                # The document went away during the pass (a late navigation): a plain frame this time.
                elements, note, timings["som_ms"] = [], f"no elements: {som}".splitlines()[0][:200], 0.0
            elif isinstance(som, BaseException):
                raise som
            else:
                (css_width, elements), timings["som_ms"] = som
            timings["screenshot_ms"] = shot_ms
            t0 = time.perf_counter()
            if elements:
                jpeg = await asyncio.get_running_loop().run_in_executor(
                    None, _draw_marks, jpeg, elements, css_width, self.cfg.jpeg_quality)
            timings["draw_ms"] = _ms(t0)
        else:
            t0 = time.perf_counter()
            jpeg = await page.screenshot()
            timings["screenshot_ms"] = _ms(t0)
            raw = jpeg
        change = None
        if ep.last_shot is not None:
            t0 = time.perf_counter()
            change = await asyncio.get_running_loop().run_in_executor(None, _changed_fraction, ep.last_shot, raw)
            timings["diff_ms"] = _ms(t0)
        ep.last_shot = raw
        ref = self.ring.write(jpeg) if (self.ring and self.use_shm) else None
        obs = P.Observation(page.url, page.title, settle == "quiet", settle, self.cfg.viewport_width,
                            self.cfg.viewport_height, ref, None if ref else jpeg, timings, point, note, elements,
                            probe, change)
        return obs.to_wire()

    async def _new_context(self) -> ContextSlot:
        assert self.browser is not None
        ctx = await self.browser.new_context(
            viewport={"width": self.cfg.viewport_width, "height": self.cfg.viewport_height},
            device_scale_factor=1, locale="en-US", timezone_id="UTC", service_workers="block")
        await ctx.add_init_script(INIT_SCRIPT)
        return ContextSlot(ctx)

    async def _close(self, episode_id: str) -> None:
        ep = self.episodes.pop(episode_id, None)
        if ep is None:
            return
        try:
            await asyncio.wait_for(ep.page.reset(), 5)
            await asyncio.wait_for(ep.slot.context.clear_cookies(), 5)
        except (TimeoutError, PlaywrightError):
            await self._drop_context(ep.slot)
            return
        if ep.slot.uses >= self.cfg.context_reuse:
            await self._drop_context(ep.slot)
        else:
            self.idle.append(ep.slot)

    async def _discard(self, episode_id: str) -> None:
        """Throw away a hung episode's page and context; the worker carries on."""
        ep = self.episodes.pop(episode_id, None)
        if ep is not None:
            await ep.page.terminate_scripts()
            await self._drop_context(ep.slot)

    async def _drop_context(self, slot: ContextSlot) -> None:
        with contextlib.suppress(TimeoutError, PlaywrightError):
            await asyncio.wait_for(slot.context.close(), 10)


def _ms(t0: float) -> float:
    return round((time.perf_counter() - t0) * 1000.0, 2)


async def _timed(coro: Awaitable[T]) -> tuple[T, float]:
    """The coroutine's result and how long it took (ms), for operations that run side by side."""
    t0 = time.perf_counter()
    return await coro, _ms(t0)


def _changed_fraction(before: bytes, after: bytes) -> float | None:
    """How much of the page changed between two screenshots (in a thread: the codec releases the GIL)."""
    from engine import _imgcodec as imgcodec

    try:
        return imgcodec.frame_diff(before, after)[0]
    except imgcodec.ImgCodecError:
        return None


def _draw_marks(jpeg: bytes, elements: list[list[Any]], css_width: float, quality: int) -> bytes:
    """The screenshot with the elements drawn on as numbered boxes (run in a thread: the codec releases
    the GIL). Screenshot pixels per CSS px are measured, not assumed (zoom, device scale factor)."""
    from engine import _imgcodec as imgcodec  # here: a worker that never draws does not load numpy

    img = imgcodec.decode(jpeg)
    s = img.shape[1] / css_width if css_width > 0 else 1.0
    imgcodec.draw_som(img, [(e[0], round(e[3] * s), round(e[4] * s), round((e[3] + e[5]) * s),
                             round((e[4] + e[6]) * s)) for e in elements])
    return imgcodec.encode(img, quality)


def _browser_pid() -> int:
    """The root Chromium process started by this worker's Playwright driver (0 if not found)."""
    for proc in psutil.Process().children(recursive=True):
        try:
            if "chrom" in proc.name() and "chrom" not in (proc.parent().name() if proc.parent() else ""):
                return proc.pid
        except psutil.Error:
            continue
    return 0


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``python -m browserpool.worker``."""
    ap = argparse.ArgumentParser(description="webgym-engine browser worker")
    ap.add_argument("--config", help="WorkerConfig as JSON (the pool passes this)")
    ap.add_argument("--connect", help="engine endpoint, e.g. ipc:///tmp/x or tcp://host:5555")
    ap.add_argument("--worker-id")
    args = ap.parse_args(argv)
    cfg = WorkerConfig.from_json(args.config) if args.config else WorkerConfig(endpoint=args.connect or "")
    if args.connect:
        cfg.endpoint = args.connect
    if args.worker_id:
        cfg.worker_id = args.worker_id
    if not cfg.endpoint:
        ap.error("--connect or --config is required")
    try:
        import uvloop
        return uvloop.run(BrowserWorker(cfg).run())
    except KeyboardInterrupt:
        return 0


if __name__ == "__main__":
    sys.exit(main())
