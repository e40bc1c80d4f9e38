"""The worker's observation of a settled page: the screenshot (with Set-of-Marks boxes drawn on), its elements,
the probe's value, how much changed since the last one, and the page's events, as an Observation whose frame goes
through the shared-memory ring (``Observer``, a part of :class:`browserpool.worker.BrowserWorker`)."""

from __future__ import annotations

import asyncio
import time
from typing import TYPE_CHECKING, Any

from playwright.async_api import Error as PlaywrightError

from browserpool import protocol as P
from browserpool.config import WorkerConfig
from browserpool.contexts import Episode
from browserpool.image_ops import _changed_fraction, _draw_marks
from browserpool.shm import SlotRing
from browserpool.timing import _ms, _timed


class Observer:
    """Observations (see the module docstring)."""

    if TYPE_CHECKING:  # what BrowserWorker provides
        cfg: WorkerConfig
        ring: SlotRing | None
        use_shm: bool

    async def _observe(self, ep: Episode, settle: P.SettleState, timings: dict[str, float],
                       point: tuple[float, float] | None, *, som: bool | None = None, shot: bool = True,
                       fmt: str = "jpeg", retry_after: str | None = None,
                       axtree: bool | None = None, dom: bool | None = None) -> P.Observation:
        """The settled page as an Observation: the screenshot (``fmt`` jpeg or png; Set-of-Marks boxes drawn on
        it with ``som``, default the episode's mode), its elements, the probe's value and the page's events.
        ``shot`` False: no screenshot (a client that asks for one when it wants it: the HTTP server). ``retry_after``:
        a rate-limited start page's Retry-After header (opens only). ``axtree``, ``dom``: read the accessibility tree
        and the DOM snapshot too (default: the episode's mode), beside the capture."""
        page = ep.page
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
        wants_tree = ep.axtree if axtree is None else axtree
        # Read while the capture is taken.
        tree = asyncio.ensure_future(_timed(page.axtree())) if wants_tree else None
        snapshot = asyncio.ensure_future(_timed(page.dom())) if (ep.dom if dom is None else dom) else None
        if not shot:
            nodes, tree_cut, elems, dom_cut, note = await _reads(tree, snapshot, timings, note)
            return P.Observation(url=page.url, title=page.title, settled=settle is P.SettleState.QUIET, settle=settle,
                                 width=self.cfg.viewport_width, height=self.cfg.viewport_height,
                                 timings_ms=timings, point=point, note=note, probe=probe,
                                 events=ep.slot.events.take(), status=page.status, load_error=page.load_error,
                                 retry_after=retry_after, axtree=nodes, axtree_cut=tree_cut, dom=elems,
                                 dom_cut=dom_cut, traffic=ep.traffic.counts.take() if ep.traffic else None)
        try:
            image, raw, elements, cut, note = await self._capture(ep, fmt, som, wants_tree, timings, note)
        except BaseException:
            await _drop(tree)  # the capture failed: the reads beside it go too
            await _drop(snapshot)
            raise
        nodes, tree_cut, elems, dom_cut, note = await _reads(tree, snapshot, timings, note)
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
        return P.Observation(url=page.url, title=page.title, settled=settle is P.SettleState.QUIET, settle=settle,
                             width=self.cfg.viewport_width, height=self.cfg.viewport_height, frame=ref,
                             frame_bytes=None if ref else image, timings_ms=timings, point=point, note=note,
                             elements=elements, probe=probe, change=change, events=ep.slot.events.take(),
                             status=page.status, load_error=page.load_error, retry_after=retry_after,
                             elements_cut=cut, axtree=nodes, axtree_cut=tree_cut, dom=elems, dom_cut=dom_cut,
                             traffic=ep.traffic.counts.take() if ep.traffic else None)

    async def _capture(self, ep: Episode, fmt: str, som: bool, tree_ids: bool, timings: dict[str, float],
                       note: str | None) -> tuple[bytes, bytes, list[list[Any]] | None, str | None, str | None]:
        """The screenshot (with the Set-of-Marks boxes drawn on when ``som``), the raw capture, the elements, why
        their pass stopped early, and the note with what it ran into."""
        page = ep.page
        elements: list[list[Any]] | None = None
        cut: str | None = None
        if som:
            # Two independent CDP commands of the same settled page: sent together, one round trip instead
            # of two.
            cfg = self.cfg
            captured, marks = await asyncio.gather(
                _timed(page.screenshot(fmt)), _timed(page.som(ep.som_cap, cfg.som_budget_ms, tree_ids=tree_ids)),
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
        return image, raw, elements, cut, note


async def _reads(tree: asyncio.Future[Any] | None, snapshot: asyncio.Future[Any] | None,
                 timings: dict[str, float], note: str | None
                 ) -> tuple[list[P.AXNode] | None, bool, list[P.DOMNode] | None, bool, str | None]:
    """The tree and the snapshot read beside a capture (:func:`_read` each); when one fails, the other is ended."""
    try:
        nodes, tree_cut, note = await _read(tree, "axtree", timings, note)
    except BaseException:
        await _drop(snapshot)
        raise
    elems, dom_cut, note = await _read(snapshot, "dom", timings, note)
    return nodes, tree_cut, elems, dom_cut, note


_WHAT = {"axtree": "accessibility tree", "dom": "DOM snapshot"}


async def _read(read: asyncio.Future[Any] | None, kind: str, timings: dict[str, float], note: str | None
                ) -> tuple[Any, bool, str | None]:
    """What a tree or snapshot read (``kind`` axtree or dom) gave (None when none was asked for), whether it was
    cut, and the note with why it is empty when the document went away during the read (a late navigation)."""
    if read is None:
        return None, False, note
    try:
        (nodes, cut), timings[f"{kind}_ms"] = await read
    except PlaywrightError as exc:
        why = f"no {_WHAT[kind]}: {exc}".splitlines()[0][:200]
        return [], False, why if note is None else f"{note}; {why}"
    return nodes, cut, note


async def _drop(read: asyncio.Future[Any] | None) -> None:
    """A tree or snapshot read whose observation failed: ended, its own failure dropped with it."""
    if read is not None:
        read.cancel()
        await asyncio.wait([read])  # its outcome is not raised here; a cancellation of this task still is
        if not read.cancelled():
            read.exception()  # retrieved: no "exception was never retrieved" at exit
