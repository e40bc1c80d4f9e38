"""One episode's tab (:class:`EpisodePage`): its state, its operations (actions, reads, screenshots, Set-of-Marks)
and how it is set up. Its other parts have modules of their own: the CDP events it answers (``tab_events.py``), the
settle check (``settle.py``), the input of actions (``input_dispatch.py``), the reset between episodes
(``tab_reset.py``).

Playwright manages the lifecycle (context, page); every per-step operation is a raw CDP command on
the page's own session, which skips Playwright's actionability machinery (it halves step throughput).
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import math
import time
from collections import deque
from typing import Any

from playwright.async_api import BrowserContext, CDPSession, Page
from playwright.async_api import Error as PlaywrightError

# Names imported "as" themselves are re-exported: they lived here, and code elsewhere imports them from here.
from browserpool.axtree import read_axtree
from browserpool.config import WorkerConfig
from browserpool.domsnapshot import read_dom
from browserpool.event_log import EventLog as EventLog
from browserpool.input_dispatch import InputDispatch, _is_number
from browserpool.netpolicy import NetPolicy
from browserpool.page_errors import ActionRefused, CaptureFailed, PageHung
from browserpool.page_scripts import LOCATE_FN, som_expression
from browserpool.page_scripts import TITLE_CHARS as TITLE_CHARS
from browserpool.protocol import AXNode, BrowserAction, DOMNode, SettleState
from browserpool.settle import Settling
from browserpool.tab_events import DIALOG_STORM as DIALOG_STORM
from browserpool.tab_events import POPUP_STORM as POPUP_STORM
from browserpool.tab_events import TabEvents
from browserpool.tab_reset import TabReset
from browserpool.timing import _ms

# Asked of a start page answered with HTTP 429: how long the site wants the agent to stay away. Navigation Timing has
# no response headers, and watching every response of every load for this rare case would cost every page; the page
# asks its own URL once more (HEAD, uncached) and reads the header, for at most 3 s.
_RETRY_AFTER_EXPR = (
    "Promise.race([fetch(location.href, {method: 'HEAD', cache: 'no-store', credentials: 'include'})"
    ".then(r => r.headers.get('retry-after'), () => null), new Promise(r => setTimeout(() => r(null), 3000))])")
RETRY_AFTER_CHARS = 64

# Longest element text a Set-of-Marks pass reports (longer ones are cut, with an ellipsis).
SOM_TEXT_CHARS = 80

# Permissions a page may ask for: denied outright, so that no request waits on a prompt nobody answers
# (headless Chromium leaves Notification.requestPermission() pending forever otherwise).
DENIED_PERMISSIONS = (
    "geolocation", "notifications", "camera", "microphone", "midi", "clipboard-read", "display-capture",
    "idle-detection", "local-fonts", "storage-access", "window-management", "persistent-storage",
    "background-sync", "screen-wake-lock", "speaker-selection", "captured-surface-control", "keyboard-lock",
    "pointer-lock", "local-network-access", "local-network", "loopback-network",
)


# A capture's failures that a later try gets past (EpisodePage.screenshot).
_CAPTURE_FLAKES = ("Unable to capture screenshot",)


class EpisodePage(TabEvents, Settling, InputDispatch, TabReset):
    """A page plus its CDP session, with the state needed to tell when it has settled.

    Its parts: the CDP events it answers (:class:`~browserpool.tab_events.TabEvents`), the settle check
    (:class:`~browserpool.settle.Settling`), the input of actions (:class:`~browserpool.input_dispatch.InputDispatch`)
    and the reset between episodes (:class:`~browserpool.tab_reset.TabReset`); here: its state and the operations."""

    def __init__(self, page: Page, cdp: CDPSession, cfg: WorkerConfig, main_frame: str,
                 events: EventLog | None = None, policy: NetPolicy | None = None) -> None:
        self.page = page
        self.cdp = cdp
        self.cfg = cfg
        self.main_frame = main_frame
        self.events = events if events is not None else EventLog(cfg.max_events_per_observation)
        self.policy = policy
        self.origins: set[str] = set()
        self.top_sites: set[str] = set()  # candidate sites of the main frame's documents (storage partitions)
        self.note: str | None = None  # what the last action's own navigation ran into (a refused load)
        # The browser's error for the last action's navigation ("net::ERR_NAME_NOT_RESOLVED", ...): the page then
        # shows the browser's error page, which the policy sees like a person would.
        self.load_error: str | None = None
        self.announced_popups = 0  # window opens seen here whose page the context has not reported yet
        self.guarded = False  # the worker's popup guard rules on this context's popups (browserpool/popup_guard.py)
        self._window_opens: deque[tuple[str, bool]] = deque()  # (URL, adopted) waiting for the guard's verdict
        self._verdicts: deque[bool] = deque()  # the guard's verdicts on popups of this tab waiting for their URL
        self.target_id = ""  # this tab's and its context's ids in the browser (set by create)
        self.context_id = ""
        self._acting = False  # inside perform(): a popup the action opened with a user gesture is adopted
        self._dialogs = 0  # dialogs since the current operation began (DIALOG_STORM)
        self._unasked_popups = 0  # windows opened without the agent's asking since then (POPUP_STORM)
        # Held while the tab leaves its page for about:blank, and by what must not run across that swap of documents
        # (a screenshot: the capture could wait out its deadline; forgetting the history: "not attached").
        self._leaving = asyncio.Lock()
        self._adopt: str | None = None
        self.url = "about:blank"
        self.title = ""
        self.status: int | None = None  # the main document's HTTP status, as of the last settle
        self._loading = False
        self._stopped = asyncio.Event()
        self._stopped.set()
        self._nav_changed = asyncio.Event()
        self._loader_id: str | None = None  # loader of the main frame's committed document
        self.closed = asyncio.Event()  # the tab closed (its page's own window.close(), or its context's end)
        self.crashed = asyncio.Event()  # its renderer died (e.g. ended by the worker's memory watch: renderer_watch)
        self.crashed_at = 0.0  # when (time.monotonic)
        self._operations: set[asyncio.Task[Any]] = set()  # under way (cancelled if the renderer dies)
        cdp.on("Page.frameStartedLoading", self._on_started)
        cdp.on("Page.frameStoppedLoading", self._on_stopped)
        cdp.on("Page.frameNavigated", self._on_navigated)
        cdp.on("Page.windowOpen", self._on_window_open)
        cdp.on("Page.downloadWillBegin", self._on_download)
        cdp.on("Page.javascriptDialogOpening", self._on_dialog)
        cdp.on("Page.fileChooserOpened", self._on_file_chooser)

    @classmethod
    async def create(cls, context: BrowserContext, cfg: WorkerConfig, events: EventLog | None = None,
                     policy: NetPolicy | None = None) -> EpisodePage:
        """A new tab in ``context`` with its CDP session: file choosers cancelled (and reported), permission
        requests denied; ``events`` collects what its pages do, ``policy`` judges its main-frame URLs."""
        page = await context.new_page()
        cdp = await context.new_cdp_session(page)
        await cdp.send("Page.enable")
        tree = await cdp.send("Page.getFrameTree")
        ep = cls(page, cdp, cfg, tree["frameTree"]["frame"]["id"], events, policy)
        page.on("close", lambda _page: ep._on_closed())
        page.on("crash", lambda _page: ep._on_crashed())
        info = (await cdp.send("Target.getTargetInfo"))["targetInfo"]
        ep.target_id, ep.context_id = str(info.get("targetId", "")), str(info.get("browserContextId", ""))
        # Sent together (one round trip): a chooser is cancelled as it opens; the permissions are denied for
        # every origin of this context. Names this Chromium does not know are refused and skipped.
        await asyncio.gather(
            cdp.send("Page.setInterceptFileChooserDialog", {"enabled": True, "cancel": True}),
            *(cdp.send("Browser.setPermission", {"permission": {"name": name}, "setting": "denied",
                                                 "browserContextId": ep.context_id})
              for name in DENIED_PERMISSIONS),
            return_exceptions=True)
        return ep

    # --- operations ----------------------------------------------------------------------------
    async def perform(self, action: BrowserAction, cap_s: float | None = None
                      ) -> tuple[SettleState, dict[str, float], tuple[float, float] | None]:
        """Carry out one action and wait until the page settles, within ``cap_s`` (default:
        settle_timeout_s; a ``wait`` action may ask for less).

        Returns (settle status, timings, point clicked). Raises ActionRefused for invalid actions.
        On a timeout the page keeps what it has loaded; only a navigation that never got a response
        is stopped, so the tab is not left waiting on it.
        """
        cap = cap_s or self.cfg.settle_timeout_s
        # ``wait`` asks for the page to stay quiet for its duration (default 1 s): a change that a
        # timer makes meanwhile is seen, and nothing happening costs exactly the requested time.
        quiet_ms = self.cfg.quiet_ms
        if action.kind == "wait":
            seconds = action.seconds if action.seconds is not None and math.isfinite(action.seconds) else 1.0
            quiet_ms = int(1000 * min(max(seconds, 0.0) or 1.0, cap / 2))
        deadline = time.monotonic() + cap
        timings: dict[str, float] = {}
        t0 = time.perf_counter()
        point = None
        self.note, self.load_error = None, None
        self._acting, self._adopt, self._dialogs, self._unasked_popups = True, None, 0, 0
        try:
            try:
                async with asyncio.timeout(cap):
                    point = await self._dispatch(action)
            except TimeoutError:
                timings["action_ms"] = _ms(t0)
                await self._stop_loading()
                return SettleState.TIMEOUT, timings, point
            timings["action_ms"] = _ms(t0)
            t1 = time.perf_counter()
            status = await self._settle(deadline, quiet_ms)
            if self._adopt is not None:
                status = await self._adopt_popup(deadline, quiet_ms)
            timings["settle_ms"] = _ms(t1)
        finally:
            self._acting = False
        if action.kind == "navigate" and action.url:
            refused = self.events.refusal_for(action.url)
            if refused is not None:
                self.note = f"refused by the network policy ({refused.detail}): {refused.url}"
        return status, timings, point

    async def _adopt_popup(self, deadline: float, quiet_ms: int) -> str:
        """The action opened a popup: this tab goes to its URL (the popup itself is closed by the worker;
        a form posted into a new window is loaded here with GET)."""
        url, self._adopt = self._adopt, None
        assert url is not None
        self.events.add("popup", url, "adopted")
        with contextlib.suppress(PlaywrightError):
            await self.cdp.send("Page.navigate", {"url": url})
        return await self._settle(deadline, quiet_ms)

    async def settled(self) -> tuple[SettleState, dict[str, float]]:
        """Wait only for what is still in flight (a navigation, a load, pending fetches), not for a quiet period:
        before a screenshot taken on request, after the page already settled from its last action. Returns
        (settle status, timings)."""
        t0 = time.perf_counter()
        self._dialogs = self._unasked_popups = 0
        status = await self._settle(time.monotonic() + self.cfg.settle_timeout_s, 0)
        return status, {"settle_ms": _ms(t0)}

    async def run_setup(self, script: str) -> tuple[SettleState, dict[str, float]]:
        """Run an episode's setup script (a returned promise is awaited), then wait until the page settles
        again. Returns (settle status, timings). Raises ActionRefused when the script throws: the episode
        cannot start as specified."""
        t0 = time.perf_counter()
        result = await self.evaluate(script)
        timings = {"setup_ms": _ms(t0)}
        if isinstance(result, dict) and set(result) == {"error"}:
            raise ActionRefused(f"setup_js failed: {result['error']}")
        t1 = time.perf_counter()
        status = await self._settle(time.monotonic() + self.cfg.settle_timeout_s, self.cfg.quiet_ms)
        timings["setup_settle_ms"] = _ms(t1)
        return status, timings

    async def screenshot(self, fmt: str = "jpeg") -> bytes:
        """The viewport as JPEG bytes (CDP, no re-encoding); ``fmt`` png only for clients that ask for PNG.

        Chromium sometimes refuses a capture of a page that is fine ("Unable to capture screenshot", seen under
        load): it is tried again, up to ``capture_retries`` times, after a pause that doubles from 20 ms, all
        within ``screenshot_timeout_s``. Raises CaptureFailed when every try was refused, PageHung past the
        deadline."""
        params: dict[str, Any] = ({"format": "png", "optimizeForSpeed": True} if fmt == "png" else
                                  {"format": "jpeg", "quality": self.cfg.jpeg_quality, "optimizeForSpeed": True})
        try:
            async with self._leaving, asyncio.timeout(self.cfg.screenshot_timeout_s):
                for attempt in range(self.cfg.capture_retries + 1):
                    try:
                        res = await self.cdp.send("Page.captureScreenshot", params)
                        break
                    except PlaywrightError as exc:
                        if not any(m in str(exc) for m in _CAPTURE_FLAKES):
                            raise
                        if attempt == self.cfg.capture_retries:
                            raise CaptureFailed(f"Chromium refused the capture {attempt + 1} times: "
                                                f"{str(exc).splitlines()[0][:200]}") from exc
                    # Only after a refused capture (never on the hot path): the compositor gets a few frames.
                    await asyncio.sleep(0.02 * 2 ** attempt)
        except TimeoutError as exc:
            raise PageHung(f"screenshot did not complete within {self.cfg.screenshot_timeout_s:g} s") from exc
        return base64.b64decode(res["data"])

    async def som(self, max_elements: int, budget_ms: int, tree_ids: bool = False
                  ) -> tuple[float, list[list[Any]], str | None]:
        """Set-of-Marks pass: the viewport's CSS width, the visible interactive elements (at most ``max_elements``,
        found within ``budget_ms``), numbered 1..N in document order, each ``[id, tag, text, x, y, w, h]``
        (viewport CSS px, ints), and what cut the list short (``count``, ``time``; None: nothing did). ``tree_ids``:
        each element's id is its id in the accessibility tree instead (``browserpool/axtree.py``), so that a hybrid
        agent names an element by one id in both (1..N when the lookup fails).

        Raises PageHung when the page does not answer within screenshot_timeout_s, PlaywrightError when
        the document went away meanwhile."""
        expression = som_expression(SOM_TEXT_CHARS, max_elements, budget_ms, keep=tree_ids)
        elements: list[int] = []
        try:
            async with asyncio.timeout(self.cfg.screenshot_timeout_s):
                if tree_ids:
                    value, elements = await self._som_by_reference(expression)
                else:
                    res = await self.cdp.send("Runtime.evaluate", {"expression": expression, "returnByValue": True})
                    value = None if "exceptionDetails" in res else res.get("result", {}).get("value")
        except TimeoutError as exc:
            raise PageHung(f"the element pass did not complete within {self.cfg.screenshot_timeout_s:g} s") from exc
        if not isinstance(value, list) or len(value) != 4:
            return float(self.cfg.viewport_width), [], None
        css_width, _css_height, found, cut = value
        if not (_is_number(css_width) and css_width > 0):
            css_width = self.cfg.viewport_width
        found = found if isinstance(found, list) else []
        ids = elements if tree_ids and len(elements) == len(found) else None  # else 1..N
        kept = [(ids[k] if ids else 0, row) for k, row in enumerate(found) if _is_element(row)]
        rows = [[i if ids else n, *row] for n, (i, row) in enumerate(kept, 1)]
        return float(css_width), rows, cut if cut in ("count", "time") else None

    async def _som_by_reference(self, expression: str) -> tuple[Any, list[int]]:
        """A pass whose result stays in the page (by reference): its values, and each listed element's backend node
        id ([] when one cannot be had). The references are released at once."""
        group = "wg-som"
        res = await self.cdp.send("Runtime.evaluate", {"expression": expression, "objectGroup": group})
        handle = res.get("result", {}).get("objectId")
        if "exceptionDetails" in res or not handle:
            return None, []
        try:
            # Index reads only: the page may have replaced Array.prototype's methods.
            values, listed = await asyncio.gather(
                self.cdp.send("Runtime.callFunctionOn", {
                    "objectId": handle, "returnByValue": True,
                    "functionDeclaration": "function () { return [this[0], this[1], this[2], this[3]]; }"}),
                self.cdp.send("Runtime.callFunctionOn", {
                    "objectId": handle, "objectGroup": group,
                    "functionDeclaration": "function () { return this[4]; }"}))
            value = values.get("result", {}).get("value")
            refs = listed.get("result", {}).get("objectId")
            if not refs:
                return value, []
            props = await self.cdp.send("Runtime.getProperties", {"objectId": refs, "ownProperties": True})
            objects = sorted((int(p["name"]), p["value"]["objectId"]) for p in props.get("result", [])
                             if str(p.get("name", "")).isdigit() and (p.get("value") or {}).get("objectId"))
            nodes = await asyncio.gather(*(self.cdp.send("DOM.describeNode", {"objectId": o}) for _, o in objects),
                                         return_exceptions=True)
            if not all(isinstance(n, dict) for n in nodes):
                return value, []
            return value, [int(n["node"]["backendNodeId"]) for n in nodes if isinstance(n, dict)]
        except (KeyError, TypeError, ValueError):  # the page's script context answered nonsense
            return None, []
        finally:
            with contextlib.suppress(PlaywrightError):
                await self.cdp.send("Runtime.releaseObjectGroup", {"objectGroup": group})

    async def axtree(self) -> tuple[list[AXNode], bool]:
        """The tab's accessibility tree and whether it was cut (``browserpool/axtree.py``). Raises PageHung when the
        page does not answer within screenshot_timeout_s, PlaywrightError when the document went away meanwhile."""
        try:
            async with asyncio.timeout(self.cfg.screenshot_timeout_s):
                return await read_axtree(self.cdp, self.cfg.axtree_max_nodes, self.cfg.axtree_text_chars)
        except TimeoutError as exc:
            raise PageHung(f"the accessibility tree was not read within {self.cfg.screenshot_timeout_s:g} s") from exc

    async def dom(self) -> tuple[list[DOMNode], bool]:
        """The tab's elements with their boxes and visibility, and whether they were cut
        (``browserpool/domsnapshot.py``). Raises PageHung when the page does not answer within
        screenshot_timeout_s, PlaywrightError when the document went away meanwhile."""
        try:
            async with asyncio.timeout(self.cfg.screenshot_timeout_s):
                return await read_dom(self.cdp, self.cfg.dom_max_nodes,
                                      (self.cfg.viewport_width, self.cfg.viewport_height))
        except TimeoutError as exc:
            raise PageHung(f"the DOM snapshot was not read within {self.cfg.screenshot_timeout_s:g} s") from exc

    async def locate(self, selector: str) -> dict[str, Any]:
        """Where the first visible element matching ``selector`` is (viewport CSS px)."""
        return await self._call(LOCATE_FN, selector)

    async def evaluate(self, expression: str) -> Any:
        """Evaluate a JS expression in the page; exceptions come back as {'error': message}.
        Raises PageHung when the page does not answer within settle_timeout_s."""
        try:
            async with asyncio.timeout(self.cfg.settle_timeout_s):
                res = await self.cdp.send("Runtime.evaluate", {
                    "expression": expression, "returnByValue": True, "awaitPromise": True})
        except TimeoutError as exc:
            raise PageHung(f"the page did not answer within {self.cfg.settle_timeout_s:g} s") from exc
        if "exceptionDetails" in res:
            details = res["exceptionDetails"]
            msg = details.get("exception", {}).get("description") or details.get("text", "error")
            return {"error": msg.splitlines()[0]}
        return res.get("result", {}).get("value")

    async def retry_after(self) -> str | None:
        """The Retry-After header of the document's URL, asked again (see ``_RETRY_AFTER_EXPR``); None without one."""
        with contextlib.suppress(PageHung, PlaywrightError):
            value = await self.evaluate(_RETRY_AFTER_EXPR)
            if isinstance(value, str) and value.strip():
                return value.strip()[:RETRY_AFTER_CHARS]
        return None

    async def terminate_scripts(self) -> None:
        """Stop JavaScript that is running away (answered on the IO thread, even when the page is busy)."""
        with contextlib.suppress(TimeoutError, PlaywrightError):
            async with asyncio.timeout(2.0):
                await self.cdp.send("Runtime.terminateExecution")

    # --- internals -------------------------------------------------------------------------------
    async def _call(self, fn: str, arg: Any) -> Any:
        return await self.evaluate(f"({fn})({json.dumps(arg)})")


def _is_element(row: Any) -> bool:
    """Whether a Set-of-Marks row is ``[tag, text, x, y, w, h]`` with strings and finite numbers. The pass runs in the
    page's script context, where a page may have replaced the builtins it uses; a row of other types is left out
    rather than sent to the engine, whose protocol check would take it for a broken worker."""
    return (isinstance(row, list) and len(row) == 6 and isinstance(row[0], str) and isinstance(row[1], str)
            and all(_is_number(v) for v in row[2:]))

