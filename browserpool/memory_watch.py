"""The worker's memory watch: a renderer past ``page_memory_mib`` ended while its episode runs
(:mod:`browserpool.renderer_watch`), the browser's PSS read for the heartbeats, a context whose JS heap grew past
``context_memory_mib`` not reused, and a browser past ``browser_memory_mib`` drained and recycled (closed and
launched anew) once no episode is live (``MemoryWatch``, a part of :class:`browserpool.worker.BrowserWorker`)."""

from __future__ import annotations

import asyncio
import contextlib
import time
from typing import TYPE_CHECKING, Any

import psutil
import zmq
from playwright.async_api import Browser
from playwright.async_api import Error as PlaywrightError

from browserpool import protocol as P
from browserpool.config import WorkerConfig, launch_flags
from browserpool.contexts import ContextSlot, Episode
from browserpool.memory import tree_pss_bytes
from browserpool.popup_guard import PopupGuard
from browserpool.renderer_watch import MemoryKill, RendererWatch
from browserpool.stderr_log import log_line
from browserpool.timing import _ms


class MemoryWatch:
    """Memory readings, draining and the browser recycle (see the module docstring)."""

    if TYPE_CHECKING:  # what BrowserWorker provides
        cfg: WorkerConfig
        browser: Browser | None
        idle: list[ContextSlot]
        episodes: dict[str, Episode]
        inflight: int
        draining: bool
        browser_recycles: int
        browser_pss: int
        contexts_over_memory: int
        renderer_watch: RendererWatch | None
        popup_guard: PopupGuard | None
        _recycling: bool
        _browser_ready: asyncio.Event
        _chromium_pid: int
        _stop: asyncio.Event
        _tasks: set[asyncio.Task[Any]]

        async def _send(self, msg: P.Message) -> None: ...
        def _heartbeat_message(self) -> P.Heartbeat: ...
        def _on_browser_lost(self) -> None: ...
        async def _drop_context(self, slot: ContextSlot) -> None: ...
        async def _start_popup_guard(self) -> None: ...

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

    def _start_renderer_watch(self) -> None:
        """End a renderer holding more than ``page_memory_mib`` (unless 0), checked every ``page_memory_check_s``;
        the watch follows the browser across a recycle."""
        if self.cfg.page_memory_mib > 0:
            self.renderer_watch = RendererWatch(self.cfg.page_memory_mib << 20, self.cfg.page_memory_check_s,
                                                lambda: self._chromium_pid, self._log_memory_kill)
            self.renderer_watch.start()

    def _log_memory_kill(self, kill: MemoryKill) -> None:
        log_line(f"worker {self.cfg.worker_id}: a renderer held {kill.held_bytes / 2**20:.0f} MiB, over the "
                 f"{self.cfg.page_memory_mib} MiB page cap: ended (pid {kill.pid})")

    async def _page_memory_kill(self, ep: Episode | None) -> MemoryKill | None:
        """The watch's kill that made an operation of ``ep`` fail, if any: its page's renderer died just after
        one. An operation can fail before the crash is reported (a capture cut short), so the report is given a
        moment."""
        if self.renderer_watch is None or not self.renderer_watch.kills or ep is None or ep.slot.page is None:
            return None
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(1.0):
                await ep.page.crashed.wait()
        return self.renderer_watch.kill_before(ep.page.crashed_at) if ep.page.crashed.is_set() else None

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
                    self._start_draining_for(f"browser PSS {pss / 2**20:.0f} MiB is over the "
                                             f"{self.cfg.browser_memory_mib} MiB cap")

    def _start_draining_for(self, reason: str) -> None:
        """The browser must be replaced (``reason``): take no new episodes, say so now (not at the next beat),
        recycle it once idle."""
        if self.draining or self._recycling or self._stop.is_set():
            return
        self.draining = True
        log_line(f"worker {self.cfg.worker_id}: {reason}: draining, then recycling it")
        task = asyncio.ensure_future(self._say_draining())
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        self._maybe_recycle()

    async def _say_draining(self) -> None:
        with contextlib.suppress(zmq.ZMQError):
            await self._send(self._heartbeat_message())

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
            if self.popup_guard is not None:
                await self.popup_guard.close()
            with contextlib.suppress(Exception):
                async with asyncio.timeout(10):
                    await old.close()
            self.browser = await old.browser_type.launch(
                executable_path=self.cfg.chromium_path, args=launch_flags(self.cfg.chromium_flags), headless=True)
            self.browser.on("disconnected", lambda _b: self._on_browser_lost())
            await self._start_popup_guard()
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
