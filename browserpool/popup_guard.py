"""The bound on popups (``PopupGuard``, one per browser): of the pages an episode's pages open (a link or form with
a target, ``window.open`` and its aliases, a middle or modified click, from the page or any of its frames), at most
``WorkerConfig.max_popups`` load; every one past them is closed before it has sent a single request.

Chromium holds a new page's first request until each client that auto-attached to it with ``waitForDebuggerOnStart``
lets it go (``Runtime.runIfWaitingForDebugger`` on that client's own session; detaching does not). Playwright is one
such client and the guard another, so a page the guard refuses is closed while still held: no request, no renderer
of its own. A page with a live opener (``window.open``) is the exception: its renderer is its opener's, which holds
it for the first resume of any client, Playwright's included. Cut from its opener before that (the worker's init
script does it, run by Playwright in the page's empty first document before it lets the page go), its first request
is held like any other's, and it is closed once it has asked for it (closed earlier, its opener's page would hang).

Playwright's Python API sends no command on an auto-attached (flattened) session, so the guard's session lives in a
page of its own, given the browser's protocol (``Target.exposeDevToolsProtocol``): a blank page in a private context
that Playwright does not know (nor list). Its script decides as the browser reports each new page, with no round
trip to the worker, and tells the worker each verdict through a binding. Nothing of it runs per step: only new pages
reach it, and an episode's start arms its count (one round trip to the guard's page)."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import Callable
from typing import Any

from playwright.async_api import Browser, CDPSession
from playwright.async_api import Error as PlaywrightError

# The guard page's bindings, named in its script: the browser's protocol, and the one it reports verdicts through.
_PROTOCOL = "__wgBrowser"
_VERDICT = "__wgPopupVerdict"

# The guard's script, run once in its page. Per armed context: the cap, the pages let load so far, and the worker's
# own new tabs announced (not popups). A page of any other context (one not armed yet) is let go.
_GUARD_JS = """(() => {
  const armed = new Map();
  const held = new Map();  // session -> refused page, closed once its renderer lets it start (below)
  const answers = new Map();  // command id -> what to do with its answer
  let lastId = 0;
  const send = (method, params, sessionId, then) => {
    lastId += 1;
    if (then !== undefined) answers.set(lastId, then);
    __wgBrowser.send(JSON.stringify({id: lastId, method, params, sessionId}));
  };
  let started;
  const ready = new Promise((resolve, reject) => { started = {resolve, reject}; });
  __wgBrowser.onmessage = (text) => {
    const msg = JSON.parse(text);
    if (msg.id !== undefined) {
      const then = answers.get(msg.id);
      answers.delete(msg.id);
      if (then !== undefined) then(msg);
      return;
    }
    const target = held.get(msg.sessionId);
    if (target !== undefined && (msg.method === 'Page.frameRequestedNavigation'
                                 || msg.method === 'Page.frameStartedNavigating')) {
      held.delete(msg.sessionId);
      send('Target.closeTarget', {targetId: target});
      return;
    }
    if (msg.method === 'Target.detachedFromTarget') held.delete(msg.params.sessionId);
    if (msg.method !== 'Target.attachedToTarget') return;
    const {sessionId, targetInfo, waitingForDebugger} = msg.params;
    const ep = armed.get(targetInfo.browserContextId);
    let allowed = true;
    if (ep !== undefined && targetInfo.type === 'page') {
      if (ep.tabs > 0) {
        ep.tabs -= 1;
      } else {
        allowed = ep.used < ep.cap;
        if (allowed) ep.used += 1;
        const verdict = [targetInfo.browserContextId, targetInfo.openerId || '', allowed];
        try { globalThis.__wgPopupVerdict(JSON.stringify(verdict)); } catch (e) {}
      }
    }
    if (allowed) {
      // Let go, with a resume: detaching alone would leave its first request held. Not a page with a live opener
      // (below), which Playwright lets go: a second resume of its opener's renderer could come late and let the
      // opener's next page go before the init script has cut that one from its opener.
      if (waitingForDebugger && !targetInfo.canAccessOpener) send('Runtime.runIfWaitingForDebugger', {}, sessionId);
      send('Target.detachFromTarget', {sessionId});
      return;
    }
    if (!targetInfo.canAccessOpener) {
      // Its first request waits for this session (Chromium holds it until every waiting client lets go).
      send('Target.closeTarget', {targetId: targetInfo.targetId});
      return;
    }
    // A page with a live opener waits in its opener's renderer instead (see the module docstring): held by this
    // session once the init script has cut it from its opener, and closed once it has asked for its first request.
    held.set(sessionId, targetInfo.targetId);
    send('Page.enable', {}, sessionId);
  };
  globalThis.__wgGuard = {
    arm(context, cap) { armed.set(context, {cap, used: 0, tabs: 0}); },
    tab(context) { const ep = armed.get(context); if (ep !== undefined) ep.tabs += 1; },
    forget(context) { armed.delete(context); },
  };
  send('Target.setAutoAttach',
       {autoAttach: true, waitForDebuggerOnStart: true, flatten: true, filter: [{type: 'page'}]}, undefined,
       (msg) => { if (msg.error) started.reject(new Error(msg.error.message)); else started.resolve(true); });
  return ready;
})()"""


class GuardError(RuntimeError):
    """The guard could not be set up, or its page is gone (popups would wait for it forever)."""


class PopupGuard:
    """One browser's popup bound (see the module docstring). ``on_verdict(context_id, opener_id, allowed)`` hears of
    every page a page of an armed context opened, as it is let load or closed; ``on_lost()`` that the guard's page
    went away (its renderer died): popups of every context are then held, none loads.

    Its page is made over the browser's protocol, not Playwright's API: its context is not one of the browser's
    ``contexts`` (which hold the episodes' only), and Playwright leaves a page of a context it does not know alone.
    It is driven over an unflattened session, whose messages travel in ``Target.sendMessageToTarget``."""

    def __init__(self, on_verdict: Callable[[str, str, bool], None], on_lost: Callable[[], None]) -> None:
        self._on_verdict = on_verdict
        self._on_lost = on_lost
        self._browser_cdp: CDPSession | None = None
        self._session = ""  # the guard page's session
        self._last_id = 0
        self._answers: dict[int, asyncio.Future[dict[str, Any]]] = {}
        self._closing = False
        self._tasks: set[asyncio.Task[Any]] = set()

    async def start(self, browser: Browser) -> None:
        """Open the guard's page and start holding every new page; raises :class:`GuardError` if the browser does
        not allow it."""
        try:
            cdp = self._browser_cdp = await browser.new_browser_cdp_session()
            cdp.on("Target.receivedMessageFromTarget", self._on_message)
            cdp.on("Target.detachedFromTarget", self._on_detached)
            # Disposed of with this session: nothing of the guard outlives it.
            context = (await cdp.send("Target.createBrowserContext", {"disposeOnDetach": True}))["browserContextId"]
            target = (await cdp.send("Target.createTarget", {"url": "about:blank",
                                                             "browserContextId": context}))["targetId"]
            self._session = (await cdp.send("Target.attachToTarget", {"targetId": target,
                                                                      "flatten": False}))["sessionId"]
            await cdp.send("Target.exposeDevToolsProtocol", {"targetId": target, "bindingName": _PROTOCOL})
            await self._command("Inspector.enable", {})  # reports the page's crash
            await self._command("Runtime.addBinding", {"name": _VERDICT})
            await self._call(_GUARD_JS, wait=True)
        except PlaywrightError as exc:
            await self.close()
            raise GuardError(f"the popup guard did not start: {exc}") from exc
        except BaseException:
            await self.close()
            raise

    async def arm(self, context_id: str, cap: int) -> None:
        """Count the pages of ``context_id``'s pages from 0 again (an episode starts): ``cap`` of them load."""
        await self._call(f"__wgGuard.arm({json.dumps(context_id)}, {max(0, int(cap))})")

    async def expect_tab(self, context_id: str) -> None:
        """The worker is about to open a tab of its own in ``context_id``: let it go, uncounted."""
        await self._call(f"__wgGuard.tab({json.dumps(context_id)})")

    def forget(self, context_id: str) -> None:
        """``context_id`` is going away (not waited for)."""
        if self._closing:
            return
        task = asyncio.ensure_future(self._forget(context_id))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _forget(self, context_id: str) -> None:
        with contextlib.suppress(GuardError, PlaywrightError):
            await self._call(f"__wgGuard.forget({json.dumps(context_id)})")

    async def close(self) -> None:
        """Stop (the browser is being closed or replaced): its page and context go with its session."""
        self._closing = True
        for task in list(self._tasks):
            task.cancel()
        for answer in self._answers.values():
            answer.cancel()
        if self._browser_cdp is not None:
            with contextlib.suppress(PlaywrightError, TimeoutError):
                async with asyncio.timeout(5):
                    await self._browser_cdp.detach()

    async def _call(self, expression: str, wait: bool = False) -> None:
        res = await self._command("Runtime.evaluate", {"expression": expression, "awaitPromise": wait})
        if "exceptionDetails" in res:
            details = res["exceptionDetails"]
            text = (details.get("exception") or {}).get("description") or details.get("text") or "an exception"
            raise GuardError(f"the popup guard failed: {str(text)[:300]}")

    async def _command(self, method: str, params: dict[str, Any]) -> dict[str, Any]:
        """One command to the guard's page, within 10 s; its result."""
        if self._browser_cdp is None or self._closing:
            raise GuardError("the popup guard is not running")
        self._last_id += 1
        ident = self._last_id
        answer = self._answers[ident] = asyncio.get_running_loop().create_future()
        message = json.dumps({"id": ident, "method": method, "params": params})
        try:
            async with asyncio.timeout(10):
                await self._browser_cdp.send("Target.sendMessageToTarget", {"sessionId": self._session,
                                                                            "message": message})
                msg = await answer
        except TimeoutError:
            raise GuardError(f"the popup guard's page did not answer {method} within 10 s") from None
        finally:
            self._answers.pop(ident, None)
        if "error" in msg:
            raise GuardError(f"the popup guard's page refused {method}: {msg['error']}")
        result: dict[str, Any] = msg.get("result", {})
        return result

    def _on_message(self, params: dict[str, Any]) -> None:
        if params.get("sessionId") != self._session:
            return
        try:
            msg = json.loads(params.get("message", ""))
        except ValueError:
            return
        answer = self._answers.pop(msg.get("id"), None) if isinstance(msg.get("id"), int) else None
        if answer is not None:
            if not answer.done():
                answer.set_result(msg)
        elif msg.get("method") == "Runtime.bindingCalled":
            self._on_binding(msg.get("params") or {})
        elif msg.get("method") == "Inspector.targetCrashed":
            self._lost()

    def _on_detached(self, params: dict[str, Any]) -> None:
        if params.get("sessionId") == self._session:
            self._lost()

    def _on_binding(self, params: dict[str, Any]) -> None:
        if params.get("name") != _VERDICT:
            return
        try:
            context_id, opener_id, allowed = json.loads(params.get("payload", ""))
        except (ValueError, TypeError):
            return
        if isinstance(context_id, str) and isinstance(opener_id, str) and isinstance(allowed, bool):
            self._on_verdict(context_id, opener_id, allowed)

    def _lost(self) -> None:
        if not self._closing:
            self._closing = True
            self._on_lost()
