"""Carrying out an action in an episode's tab: the URL check, the target point (coordinates or a selector), and
the raw CDP input events of clicks, hovers, typing, key presses, scrolls, selects and navigations
(``InputDispatch``, a part of :class:`browserpool.page.EpisodePage`)."""

from __future__ import annotations

import asyncio
import math
from typing import TYPE_CHECKING, Any, TypeGuard
from urllib.parse import urlsplit

from playwright.async_api import CDPSession
from playwright.async_api import Error as PlaywrightError

from browserpool.config import WorkerConfig
from browserpool.keys import TYPE_MAX_LINE_BREAKS, KeyDef, parse_combo, typing_plan
from browserpool.page_errors import ActionRefused
from browserpool.page_scripts import SCROLL_FN, SELECT_FN
from browserpool.protocol import BrowserAction


class InputDispatch:
    """The actions' input events (see the module docstring)."""

    if TYPE_CHECKING:  # what EpisodePage provides
        cdp: CDPSession
        cfg: WorkerConfig
        load_error: str | None

        async def locate(self, selector: str) -> dict[str, Any]: ...
        async def _call(self, fn: str, arg: Any) -> Any: ...

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
        x: float | None
        y: float | None
        if kind in ("click", "hover", "type", "select") and (a.selector or a.node or a.x is not None):
            x, y = await self._target_point(a)
        elif kind in ("click", "hover", "select"):
            raise ActionRefused(f"{kind} needs coordinates, a selector or an element")
        else:
            x = y = None
        if kind == "key" and a.node:
            await self._element_call("DOM.focus", a.node)
        if kind == "click":
            assert x is not None and y is not None  # refused above without a point
            await self._click(x, y)
        elif kind == "hover":
            await self.cdp.send("Input.dispatchMouseEvent", {"type": "mouseMoved", "x": x, "y": y})
        elif kind == "type":
            breaks = (a.text or "").count("\n")
            if breaks > TYPE_MAX_LINE_BREAKS:
                raise ActionRefused(f"{breaks:,} line breaks in the text: at most {TYPE_MAX_LINE_BREAKS:,} are typed "
                                    "in one action")
            if x is not None and y is not None:  # set together
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
        elif kind == "go_forward":
            hist = await self.cdp.send("Page.getNavigationHistory")
            idx = hist["currentIndex"]
            if idx + 1 < len(hist["entries"]):
                await self.cdp.send("Page.navigateToHistoryEntry", {"entryId": hist["entries"][idx + 1]["id"]})
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
        return (x, y) if x is not None and y is not None else None

    async def _target_point(self, a: BrowserAction) -> tuple[float, float]:
        if a.node:
            return await self._element_point(a.node)
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
        assert a.x is not None  # a point is asked for only with a selector or coordinates (_dispatch)
        x, y = float(a.x), float(a.y if a.y is not None else 0.0)
        if not (math.isfinite(x) and math.isfinite(y)):  # NaN would pass both clamps
            raise ActionRefused(f"coordinates must be finite numbers, not ({a.x!r}, {a.y!r})")
        return min(max(x, 0.0), self.cfg.viewport_width - 1.0), min(max(y, 0.0), self.cfg.viewport_height - 1.0)

    async def _element_point(self, node: int) -> tuple[float, float]:
        """The centre of an accessibility tree's element (its backend node id), scrolled into view first."""
        await self._element_call("DOM.scrollIntoViewIfNeeded", node)
        quads = (await self._element_call("DOM.getContentQuads", node)).get("quads") or []
        w, h = self.cfg.viewport_width, self.cfg.viewport_height
        for quad in quads:
            if not (isinstance(quad, list) and len(quad) == 8 and all(_is_number(v) for v in quad)):
                continue
            x, y = sum(quad[0::2]) / 4, sum(quad[1::2]) / 4
            if 0 <= x < w and 0 <= y < h:
                return float(x), float(y)
        raise ActionRefused(f"element {node} has no visible box in the viewport")

    async def _element_call(self, method: str, node: int) -> dict[str, Any]:
        """A DOM command on an element named by its backend node id; ActionRefused when the page has no such node
        (an id of another document, or of an element that has gone)."""
        try:
            return await self.cdp.send(method, {"backendNodeId": node})
        except PlaywrightError as exc:
            if "Protocol error" not in str(exc):  # the tab or the browser went away: the worker's own handling
                raise
            raise ActionRefused(f"element {node}: {str(exc).splitlines()[0].rpartition(': ')[2][:200]} (ids are those "
                                "of the last observation's tree)") from None

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


def _is_number(value: Any) -> TypeGuard[float]:
    return type(value) in (int, float) and math.isfinite(value)
