"""One episode's tab: hot-path input and screenshots over a CDP session, settle detection.

Playwright manages the lifecycle (context, page); every per-step operation is a raw CDP command on
the page's own session, which skips Playwright's actionability machinery (it halves step throughput).
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import ipaddress
import json
import math
import time
from typing import Any
from urllib.parse import urlsplit

from playwright.async_api import BrowserContext, CDPSession, Page
from playwright.async_api import Error as PlaywrightError

from browserpool.config import WorkerConfig
from browserpool.keys import TYPE_MAX_LINE_BREAKS, KeyDef, parse_combo, typing_plan
from browserpool.netpolicy import NetPolicy
from browserpool.page_scripts import LOCATE_FN, SCROLL_FN, SELECT_FN, TITLE_CHARS, som_expression
from browserpool.protocol import BrowserAction, PageEvent

# Where the page is, [url, title, HTTP status or null]: the init script's report, which a page's own scripts cannot
# alter; in a document without it (the init script did not run), read directly.
_LOCATION_EXPR = ("(window.__wgWhere ? window.__wgWhere() : [location.href, String(document.title).slice(0, "
                  f"{TITLE_CHARS}), ((performance.getEntriesByType('navigation')[0] || {{}}).responseStatus || null)])")


def _settle_expr(quiet_ms: int, cap_ms: int) -> str:
    """The settle check: waits for a quiet document (the init script's __wgSettle), then reports where it is:
    [state, url, title, status]."""
    return (f"(window.__wgSettle ? window.__wgSettle({quiet_ms}, {cap_ms}) : "
            f"Promise.resolve(['quiet'].concat({_LOCATION_EXPR})))")


# Asked of a start page answered with HTTP 429: how long the site wants the agent to stay away. Navigation Timing has
# no response headers, and watching every response of every load for this rare case would cost every page; the page
# asks its own URL once more (HEAD, uncached) and reads the header, for at most 3 s.
_RETRY_AFTER_EXPR = (
    "Promise.race([fetch(location.href, {method: 'HEAD', cache: 'no-store', credentials: 'include'})"
    ".then(r => r.headers.get('retry-after'), () => null), new Promise(r => setTimeout(() => r(null), 3000))])")
RETRY_AFTER_CHARS = 64

# Longest element text a Set-of-Marks pass reports (longer ones are cut, with an ellipsis).
SOM_TEXT_CHARS = 80

# The most storages (origins, and partitions: origins x top-level sites) a reused tab clears one by one, each a CDP
# call. A page that reached more (images from thousands of subdomains, redirects through many sites) has its context
# dropped instead, which clears everything at once: clearing 2,000 origins under 300 sites kept a worker's event loop
# busy for 9 s.
MAX_CLEARED_STORAGES = 2000


class ActionRefused(Exception):
    """The action cannot be carried out (bad URL scheme, unknown key, missing target)."""


class TabClosed(Exception):
    """The episode's tab closed under an operation (its page called ``window.close()``)."""


class PageHung(Exception):
    """The page stopped answering (e.g. JavaScript in an endless loop)."""


def _ms(t0: float) -> float:
    return round((time.perf_counter() - t0) * 1000.0, 2)


# Permissions a page may ask for: denied outright, so that no request waits on a prompt nobody answers
# (headless Chromium leaves Notification.requestPermission() pending forever otherwise).
DENIED_PERMISSIONS = (
    "geolocation", "notifications", "camera", "microphone", "midi", "clipboard-read", "display-capture",
    "idle-detection", "local-fonts", "storage-access", "window-management", "persistent-storage",
    "background-sync", "screen-wake-lock", "speaker-selection", "captured-surface-control", "keyboard-lock",
    "pointer-lock", "local-network-access", "local-network", "loopback-network",
)
# Main-frame documents that are not refused after the fact: the blank page, error pages (a refused or
# failed load shows one) and blob: documents (the page's own content, same origin).
_COMMITTED_OK = ("http:", "https:", "blob:", "chrome-error:")
_TEXT_CAP = 300  # longest URL or message kept in a page event
# Dialogs in one operation past which the page's running script is stopped: a loop of alert()s, each answered at
# once, never lets the page render, so the screenshot would wait out its deadline and the context be discarded.
DIALOG_STORM = 20
# Windows a page may open in one step without the agent's asking (a pop-under or two a click) before the tab leaves
# it for about:blank. A page that opened them without end kept its worker setting each one up, only to close it:
# its own steps took 4-6x as long, and another episode's on the same worker 2-9x.
POPUP_STORM = 10


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


class EpisodePage:
    """A page plus its CDP session, with the state needed to tell when it has settled."""

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

    # --- CDP events --------------------------------------------------------------------------
    def _on_closed(self) -> None:
        self.closed.set()
        # Whatever waits for the document wakes up, and finds the tab gone (TabClosed).
        self._stopped.set()
        self._nav_changed.set()

    async def tab_closed(self) -> bool:
        """Whether the tab is closed, asked after an operation failed: the closing can fail an operation before
        Playwright reports it, so a tab that does not answer is given a moment to."""
        if self.closed.is_set():
            return True
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
        # page (this tab goes to its URL when the action settles); every other one is only closed.
        if (self._acting and self._adopt is None and params.get("userGesture")
                and url[:8].lower().startswith(("http://", "https://"))):
            self._adopt = url
        else:
            self.popup_closed(url)

    def popup_closed(self, url: str) -> None:
        """A window opened without the agent's asking, closed by the worker: recorded. At POPUP_STORM of them in one
        step the tab leaves the page (once a step: more may still be on their way as it does)."""
        self.events.add("popup", url, "closed")
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

    # --- operations ----------------------------------------------------------------------------
    async def perform(self, action: BrowserAction, cap_s: float | None = None
                      ) -> tuple[str, dict[str, float], tuple[float, float] | None]:
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
                return "timeout", timings, point
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

    async def settled(self) -> tuple[str, dict[str, float]]:
        """Wait only for what is still in flight (a navigation, a load, pending fetches), not for a quiet period:
        before a screenshot taken on request, after the page already settled from its last action. Returns
        (settle status, timings)."""
        t0 = time.perf_counter()
        self._dialogs = self._unasked_popups = 0
        status = await self._settle(time.monotonic() + self.cfg.settle_timeout_s, 0)
        return status, {"settle_ms": _ms(t0)}

    async def run_setup(self, script: str) -> tuple[str, dict[str, float]]:
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
        """The viewport as JPEG bytes (CDP, no re-encoding); ``fmt`` png only for clients that ask for PNG."""
        params: dict[str, Any] = ({"format": "png", "optimizeForSpeed": True} if fmt == "png" else
                                  {"format": "jpeg", "quality": self.cfg.jpeg_quality, "optimizeForSpeed": True})
        try:
            async with self._leaving, asyncio.timeout(self.cfg.screenshot_timeout_s):
                res = await self.cdp.send("Page.captureScreenshot", params)
        except TimeoutError as exc:
            raise PageHung(f"screenshot did not complete within {self.cfg.screenshot_timeout_s:g} s") from exc
        return base64.b64decode(res["data"])

    async def som(self, max_elements: int, budget_ms: int) -> tuple[float, list[list[Any]], str | None]:
        """Set-of-Marks pass: the viewport's CSS width, the visible interactive elements (at most ``max_elements``,
        found within ``budget_ms``), numbered 1..N in document order, each ``[id, tag, text, x, y, w, h]``
        (viewport CSS px, ints), and what cut the list short (``count``, ``time``; None: nothing did).

        Raises PageHung when the page does not answer within screenshot_timeout_s, PlaywrightError when
        the document went away meanwhile (a navigation)."""
        try:
            async with asyncio.timeout(self.cfg.screenshot_timeout_s):
                res = await self.cdp.send("Runtime.evaluate", {
                    "expression": som_expression(SOM_TEXT_CHARS, max_elements, budget_ms), "returnByValue": True})
        except TimeoutError as exc:
            raise PageHung(f"the element pass did not complete within {self.cfg.screenshot_timeout_s:g} s") from exc
        value = res.get("result", {}).get("value")
        if "exceptionDetails" in res or not isinstance(value, list) or len(value) != 4:
            return float(self.cfg.viewport_width), [], None
        css_width, _css_height, found, cut = value
        if not (_is_number(css_width) and css_width > 0):
            css_width = self.cfg.viewport_width
        rows = [row for row in found if _is_element(row)] if isinstance(found, list) else []
        return float(css_width), [[i, *e] for i, e in enumerate(rows, 1)], cut if cut in ("count", "time") else None

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

    async def terminate_scripts(self) -> None:
        """Stop JavaScript that is running away (answered on the IO thread, even when the page is busy)."""
        with contextlib.suppress(TimeoutError, PlaywrightError):
            async with asyncio.timeout(2.0):
                await self.cdp.send("Runtime.terminateExecution")

    # --- internals -------------------------------------------------------------------------------
    async def _call(self, fn: str, arg: Any) -> Any:
        return await self.evaluate(f"({fn})({json.dumps(arg)})")

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

    async def _settle(self, deadline: float, quiet_ms: int) -> str:
        """Wait until navigation is over and the document is quiet; 'quiet', 'busy' or 'timeout'."""
        state = await self._settle_until(deadline, quiet_ms)
        if state == "timeout":
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

    async def _settle_until(self, deadline: float, quiet_ms: int) -> str:
        while True:
            self._check_open()
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return "timeout"
            if self._loading:
                try:
                    async with asyncio.timeout(remaining):
                        await self._stopped.wait()
                except TimeoutError:
                    return "timeout"
                continue
            self._nav_changed.clear()
            cap_ms = int(min(quiet_ms + self.cfg.idle_cap_ms, remaining * 1000))
            expr = _settle_expr(quiet_ms, cap_ms)
            try:
                async with asyncio.timeout(remaining):
                    res = await self.cdp.send("Runtime.evaluate", {
                        "expression": expr, "returnByValue": True, "awaitPromise": True})
            except TimeoutError:
                return "timeout"
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
                return "busy"
            state = value[0] if value[0] in ("quiet", "busy", "navigating") else "busy"
            self._note_origin(self.url)
            if state == "navigating" or self._loading:
                # The document is leaving; wait for the browser to report the load (or give up on it).
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(min(remaining, 1.0)):
                        await self._nav_changed.wait()
                continue
            return state

    def _note_origin(self, url: str) -> None:
        parts = urlsplit(url)
        if parts.scheme in ("http", "https"):
            self.origins.add(f"{parts.scheme}://{parts.netloc}")

    def check_url(self, url: str) -> None:
        """Refuse (ActionRefused) a URL the worker is asked to load: a scheme not allowed, an about: page other
        than about:blank. Where the page may load from is the network proxy's part."""
        scheme = urlsplit(url).scheme.lower()
        if scheme not in self.cfg.allowed_schemes:
            raise ActionRefused(f"navigation to {scheme or 'a relative'}: URL refused ({url[:200]})")
        if scheme == "about" and url.strip().lower() != "about:blank":
            raise ActionRefused(f"navigation to about: pages other than about:blank refused ({url[:200]})")

    async def _dispatch(self, a: BrowserAction) -> tuple[float, float] | None:
        kind = a.kind
        if kind in ("click", "hover", "type", "select") and (a.selector or a.x is not None):
            x, y = await self._target_point(a)
        elif kind in ("click", "hover", "select"):
            raise ActionRefused(f"{kind} needs coordinates or a selector")
        else:
            x = y = None
        if kind == "click":
            await self._click(x, y)
        elif kind == "hover":
            await self.cdp.send("Input.dispatchMouseEvent", {"type": "mouseMoved", "x": x, "y": y})
        elif kind == "type":
            breaks = (a.text or "").count("\n")
            if breaks > TYPE_MAX_LINE_BREAKS:
                raise ActionRefused(f"{breaks:,} line breaks in the text: at most {TYPE_MAX_LINE_BREAKS:,} are typed "
                                    "in one action")
            if x is not None:
                await self._click(x, y)
            if a.clear:
                await self._press(2, parse_combo("Control+A")[1], commands=["selectAll"])
                await self._press(0, parse_combo("Backspace")[1])
            await self._type_text(a.text or "")
            if a.enter:
                await self._press(0, parse_combo("Enter")[1])
        elif kind == "select":
            res = await self._call(SELECT_FN, [x, y, a.text or ""])
            if not isinstance(res, dict) or not res.get("ok"):
                raise ActionRefused(str(res.get("error") if isinstance(res, dict) else res))
        elif kind == "key":
            for combo in (a.keys or "").split():
                try:
                    mods, kd = parse_combo(combo)
                except ValueError as exc:
                    raise ActionRefused(str(exc)) from exc
                await self._press(mods, kd)
        elif kind == "scroll":
            if a.direction not in ("up", "down"):
                raise ActionRefused(f"scroll direction must be up or down, not {a.direction!r}")
            amount = a.amount if a.amount else self.cfg.viewport_height - 50
            dy = amount if a.direction == "down" else -amount
            await self._call(SCROLL_FN, [dy, a.x, a.y])
        elif kind == "wait":
            pass  # settling is the wait
        elif kind == "go_back":
            hist = await self.cdp.send("Page.getNavigationHistory")
            idx = hist["currentIndex"]
            if idx > 0:
                await self.cdp.send("Page.navigateToHistoryEntry", {"entryId": hist["entries"][idx - 1]["id"]})
        elif kind == "navigate":
            url = a.url or ""
            self.check_url(url)
            res = await self.cdp.send("Page.navigate", {"url": url})
            # A failed load (a refused one, a host that does not resolve, a bad certificate...) is an outcome: the
            # page shows it, the observation says what it was.
            if res.get("errorText"):
                self.load_error = str(res["errorText"])
        else:
            raise ActionRefused(f"unknown action kind {kind!r}")
        return (x, y) if x is not None else None

    async def _target_point(self, a: BrowserAction) -> tuple[float, float]:
        if a.selector:
            loc = await self.locate(a.selector)
            if not isinstance(loc, dict) or loc.get("error") or not loc.get("found"):
                raise ActionRefused(f"no visible element matches {a.selector!r}")
            if not loc.get("inView"):
                raise ActionRefused(f"element {a.selector!r} is outside the viewport")
            x, y = loc.get("x"), loc.get("y")
            if not (_is_number(x) and _is_number(y)):  # the page's script context answered nonsense
                raise ActionRefused(f"no usable position for {a.selector!r}")
            return float(x), float(y)
        x, y = float(a.x), float(a.y if a.y is not None else 0.0)
        if not (math.isfinite(x) and math.isfinite(y)):  # NaN would pass both clamps
            raise ActionRefused(f"coordinates must be finite numbers, not ({a.x!r}, {a.y!r})")
        return min(max(x, 0.0), self.cfg.viewport_width - 1.0), min(max(y, 0.0), self.cfg.viewport_height - 1.0)

    async def _click(self, x: float, y: float) -> None:
        send = self.cdp.send
        base = {"x": x, "y": y, "button": "left", "clickCount": 1}
        # Pipelined: CDP handles commands of one session in order.
        await asyncio.gather(
            send("Input.dispatchMouseEvent", {"type": "mouseMoved", "x": x, "y": y}),
            send("Input.dispatchMouseEvent", {"type": "mousePressed", **base}),
            send("Input.dispatchMouseEvent", {"type": "mouseReleased", **base}),
        )

    async def _press(self, modifiers: int, kd: KeyDef, commands: list[str] | None = None) -> None:
        down: dict[str, Any] = {"type": "keyDown" if kd.text and not modifiers & 2 else "rawKeyDown",
                                "modifiers": modifiers, "key": kd.key, "code": kd.code,
                                "windowsVirtualKeyCode": kd.vk}
        if kd.text and not modifiers & 2:
            down["text"] = down["unmodifiedText"] = kd.text
        if commands:
            down["commands"] = commands
        up = {"type": "keyUp", "modifiers": modifiers, "key": kd.key, "code": kd.code,
              "windowsVirtualKeyCode": kd.vk}
        await asyncio.gather(self.cdp.send("Input.dispatchKeyEvent", down),
                             self.cdp.send("Input.dispatchKeyEvent", up))

    async def _type_text(self, text: str) -> None:
        """Type ``text`` as :func:`~browserpool.keys.typing_plan` says: key presses, and runs inserted at once."""
        sends = []
        for kd, chars in typing_plan(text):
            if kd is None:
                sends.append(self.cdp.send("Input.insertText", {"text": chars}))
                continue
            down = {"type": "keyDown", "key": kd.key, "code": kd.code, "windowsVirtualKeyCode": kd.vk,
                    "text": kd.text, "unmodifiedText": kd.text}
            sends.append(self.cdp.send("Input.dispatchKeyEvent", down))
            sends.append(self.cdp.send("Input.dispatchKeyEvent", {
                "type": "keyUp", "key": kd.key, "code": kd.code, "windowsVirtualKeyCode": kd.vk}))
        if sends:
            await asyncio.gather(*sends)


def _is_number(value: Any) -> bool:
    return type(value) in (int, float) and math.isfinite(value)


def _is_element(row: Any) -> bool:
    """Whether a Set-of-Marks row is ``[tag, text, x, y, w, h]`` with strings and finite numbers. The pass runs in the
    page's script context, where a page may have replaced the builtins it uses; a row of other types is left out
    rather than sent to the engine, whose protocol check would take it for a broken worker."""
    return (isinstance(row, list) and len(row) == 6 and isinstance(row[0], str) and isinstance(row[1], str)
            and all(_is_number(v) for v in row[2:]))
