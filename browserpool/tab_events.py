"""What an episode's tab reports over CDP and how the worker answers it: loads and navigations (the state the
settle check waits on; every committed main-frame document checked), window opens (one adopted, the rest closed or,
past the episode's ``max_popups``, refused before they load: ``browserpool/popup_guard.py``), downloads refused,
dialogs dismissed, file choosers cancelled, the tab closing, its renderer dying (``TabEvents``, a part of
:class:`browserpool.page.EpisodePage`)."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import deque
from collections.abc import Coroutine
from typing import TYPE_CHECKING, Any, TypeVar

from playwright.async_api import CDPSession
from playwright.async_api import Error as PlaywrightError

from browserpool.config import WorkerConfig
from browserpool.event_log import EventLog
from browserpool.page_errors import PageCrashed, TabClosed
from browserpool.tab_reset import _site_candidates

if TYPE_CHECKING:
    from browserpool.netpolicy import NetPolicy

T = TypeVar("T")

# Main-frame documents that are not refused after the fact: the blank page, error pages (a refused or
# failed load shows one) and blob: documents (the page's own content, same origin).
_COMMITTED_OK = ("http:", "https:", "blob:", "chrome-error:")
# Dialogs in one operation past which the page's running script is stopped: a loop of alert()s, each answered at
# once, never lets the page render, so the screenshot would wait out its deadline and the context be discarded.
DIALOG_STORM = 20
# Windows a page may open in one step without the agent's asking (a pop-under or two a click) before the tab leaves
# it for about:blank. A page that opened them without end kept its worker setting each one up, only to close it:
# its own steps took 4-6x as long, and another episode's on the same worker 2-9x.
POPUP_STORM = 10


def refused_detail(cap: int) -> str:
    """The detail of a ``popup`` event of a window the popup guard closed before it loaded."""
    return f"refused: past the episode's {cap} popups"


class TabEvents:
    """The tab's CDP event handlers (see the module docstring)."""

    if TYPE_CHECKING:  # what EpisodePage provides
        cdp: CDPSession
        cfg: WorkerConfig
        main_frame: str
        events: EventLog
        policy: NetPolicy | None
        origins: set[str]
        top_sites: set[str]
        announced_popups: int
        guarded: bool
        url: str
        closed: asyncio.Event
        crashed: asyncio.Event
        crashed_at: float
        _operations: set[asyncio.Task[Any]]
        _acting: bool
        _adopt: str | None
        _dialogs: int
        _unasked_popups: int
        _window_opens: deque[tuple[str, bool]]
        _verdicts: deque[bool]
        _leaving: asyncio.Lock
        _loading: bool
        _stopped: asyncio.Event
        _nav_changed: asyncio.Event
        _loader_id: str | None

        async def terminate_scripts(self) -> None: ...
        async def _wait_for_document(self, loader_id: str | None) -> None: ...
        def _note_origin(self, url: str) -> None: ...

    def _on_closed(self) -> None:
        self.closed.set()
        # Whatever waits for the document wakes up, and finds the tab gone (TabClosed).
        self._stopped.set()
        self._nav_changed.set()

    def _on_crashed(self) -> None:
        # The renderer died (the memory watch ended it, or it crashed). A command already sent over the tab's CDP
        # session would wait out its own timeout (a capture: 10 s), so the operation under way is cancelled.
        self.crashed_at = time.monotonic()
        self.crashed.set()
        self._stopped.set()
        self._nav_changed.set()
        for op in self._operations:
            op.cancel()

    async def unless_crashed(self, operation: Coroutine[Any, Any, T]) -> T:
        """Run an operation on the tab; :class:`PageCrashed` as soon as its renderer dies (at once if it has).
        The operation runs as a task of its own (9 us here): cancelling the request's own task instead would race its
        reply (a cancel asked for as the operation ends lands on the reply's send)."""
        if self.crashed.is_set():
            operation.close()
            raise PageCrashed(f"the page's renderer died ({self.url[:200]})")
        task = asyncio.ensure_future(operation)
        self._operations.add(task)
        try:
            return await task
        except asyncio.CancelledError:
            me = asyncio.current_task()
            if self.crashed.is_set() and me is not None and not me.cancelling():  # the crash's cancel, not ours
                raise PageCrashed(f"the page's renderer died ({self.url[:200]})") from None
            raise
        finally:
            self._operations.discard(task)
            if not task.done():  # this request itself was cancelled: so is its operation
                task.cancel()

    async def tab_closed(self) -> bool:
        """Whether the tab is closed, asked after an operation failed: the closing can fail an operation before
        Playwright reports it, so a tab that does not answer is given a moment to."""
        if self.closed.is_set():
            return True
        if self.crashed.is_set():
            return False  # its renderer is gone, the tab is not: the operation failed for that
        try:
            async with asyncio.timeout(2.0):
                await self.cdp.send("Runtime.evaluate", {"expression": "0"})
            return False
        except (TimeoutError, PlaywrightError):
            pass
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(2.0):
                await self.closed.wait()
        return self.closed.is_set()

    def _check_open(self) -> None:
        if self.closed.is_set():
            raise TabClosed(f"the page closed its tab ({self.url[:200]})")

    def _on_started(self, params: dict[str, Any]) -> None:
        if params.get("frameId") == self.main_frame:
            self._loading = True
            self._stopped.clear()
            self._nav_changed.set()

    def _on_stopped(self, params: dict[str, Any]) -> None:
        if params.get("frameId") == self.main_frame:
            self._loading = False
            self._stopped.set()
            self._nav_changed.set()

    def _on_navigated(self, params: dict[str, Any]) -> None:
        frame = params.get("frame", {})
        origin = frame.get("securityOrigin")
        if isinstance(origin, str) and origin.startswith(("http://", "https://")):
            self.origins.add(origin)  # subframes too: their storage is cleared between episodes
        if frame.get("id") == self.main_frame and not frame.get("parentId"):
            self.url = frame.get("url", self.url)
            self._loader_id = frame.get("loaderId")
            self._nav_changed.set()
            self._check_committed(self.url)
            if isinstance(origin, str) and origin.startswith(("http://", "https://")):
                self.top_sites.update(_site_candidates(origin))

    def _check_committed(self, url: str) -> None:
        """Every main-frame document is checked once committed, however it was reached: a refused scheme (or a
        URL a path-specific deny pattern names, which a TLS tunnel hides from the proxy) is left for
        about:blank at once, and recorded."""
        low = url[:16].lower()
        rule = None
        if low.startswith(_COMMITTED_OK):
            if self.policy is not None and low.startswith("https:"):
                verdict = self.policy.deny_url(url)
                rule = verdict.rule if verdict is not None else None
        elif not low.startswith("about:blank"):
            rule = f"scheme {low.split(':', 1)[0] or '?'}:"
        if rule is not None:
            self.events.add("refused", url, rule)
            asyncio.ensure_future(self._leave())

    async def _leave(self) -> None:
        """Leave the page for about:blank (a refused document, a storm of popups), and wait for the blank one."""
        async with self._leaving:
            with contextlib.suppress(PlaywrightError, TimeoutError, TabClosed):
                res = await self.cdp.send("Page.navigate", {"url": "about:blank"})
                async with asyncio.timeout(self.cfg.screenshot_timeout_s):
                    await self._wait_for_document(res.get("loaderId"))

    def _on_window_open(self, params: dict[str, Any]) -> None:
        url = str(params.get("url", ""))
        self.announced_popups += 1
        self._note_origin(url)
        # One tab per episode: a popup the agent's own action opened (a user gesture) becomes the episode's
        # page (this tab goes to its URL when the action settles, loaded or refused); every other one is only closed.
        adopt = bool(self._acting and self._adopt is None and params.get("userGesture")
                     and url[:8].lower().startswith(("http://", "https://")))
        if adopt:
            self._adopt = url
        else:
            self._count_unasked(url)
        # Recorded with the popup guard's verdict (let load, or refused), which names no URL: the browser reports
        # a tab's window opens and their pages in the same order.
        self._window_opens.append((url, adopt))
        if not self.guarded:
            self._verdicts.append(True)
        self._pair_popups()

    def popup_verdict(self, from_tab: bool, allowed: bool) -> None:
        """The popup guard let a page of this tab's context load (``allowed``) or closed it before it loaded;
        ``from_tab``: this tab opened it (its window open has the URL). A page let load that the tab did not announce
        is recorded once Playwright reports it (:meth:`popup_closed`, with its URL)."""
        if from_tab:
            self._verdicts.append(allowed)
            self._pair_popups()
        elif not allowed:
            self.events.add("popup", "", self._refused())
            self._count_unasked("")

    def _pair_popups(self) -> None:
        while self._window_opens and self._verdicts:
            (url, adopted), allowed = self._window_opens.popleft(), self._verdicts.popleft()
            if not allowed:
                # Playwright reports it closed (or blank), which the worker passes over: nothing is left to announce.
                self.announced_popups = max(0, self.announced_popups - 1)
            if not adopted:
                self.events.add("popup", url, "closed" if allowed else self._refused())

    def _refused(self) -> str:
        return refused_detail(self.cfg.max_popups)

    def popup_closed(self, url: str) -> None:
        """A window opened without the agent's asking (not announced to this tab), closed by the worker: recorded."""
        self.events.add("popup", url, "closed")
        self._count_unasked(url)

    def _count_unasked(self, url: str) -> None:
        """At POPUP_STORM windows opened in one step without the agent's asking, the tab leaves the page (once a
        step: more may still be on their way as it does)."""
        self._unasked_popups += 1
        if self._unasked_popups == POPUP_STORM:
            self.events.add("popup", url, f"{POPUP_STORM} windows opened in one step: the page was left for "
                                          "about:blank")
            asyncio.ensure_future(self._leave())

    def _on_download(self, params: dict[str, Any]) -> None:
        self.events.add("download", str(params.get("url", "")), f"refused: {params.get('suggestedFilename', '')}")
        if params.get("frameId") == self.main_frame:
            # A navigation that became a download leaves the document where it was: the settle check, told it
            # was leaving, must not wait for a new one until its deadline.
            asyncio.ensure_future(self._stay())

    async def _stay(self) -> None:
        with contextlib.suppress(PlaywrightError):
            await self.cdp.send("Runtime.evaluate", {"expression": "window.__wgStay && window.__wgStay()"})
        self._nav_changed.set()

    def _on_dialog(self, params: dict[str, Any]) -> None:
        # Playwright answers it (dismissed; a beforeunload is accepted, so navigations go on): only recorded.
        kind = params.get("type", "dialog")
        self.events.add("dialog", str(params.get("url", "")), f"{kind}: {params.get('message', '')}")
        self._dialogs += 1
        if self._dialogs % DIALOG_STORM == 0:  # again after each 20 more: a script that comes back (a timer)
            self.events.add("dialog", str(params.get("url", "")), f"{DIALOG_STORM} dialogs in one operation: the "
                            "page's running script was stopped")
            asyncio.ensure_future(self.terminate_scripts())

    def _on_file_chooser(self, params: dict[str, Any]) -> None:
        self.events.add("filechooser", self.url, f"cancelled ({params.get('mode', '')})")
