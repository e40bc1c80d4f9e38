"""Set-of-Marks mode: the worker lists the visible interactive elements of every observation and draws
them on the frame as numbered boxes; the ``select`` action picks an option by point.

Real Chromium through the shared pool, one fixture page (tests/fixtures/som_*.html) per behaviour. Boxes
are ``[id, tag, text, x, y, w, h]`` in viewport CSS px; the fixtures place elements at whole pixels, so
the expected boxes are exact.
"""

from __future__ import annotations

import contextlib
import itertools
from collections.abc import AsyncIterator, Callable
from typing import Any

import numpy as np
import pytest

from browserpool.config import WorkerConfig
from browserpool.pool import BrowserOpError, BrowserPool, BrowserSession
from browserpool.protocol import BrowserAction, Observation
from browserpool.worker import _draw_marks
from engine import _imgcodec as imgcodec
from tests.conftest import inproc_pool

W, H = 1280, 768
_ids = itertools.count(1)

# Boxes (tag, x, y, w, h) of the elements whose id starts with "i-", in document order, as the page
# lays them out (floor of the left/top edge, ceil of the right/bottom edge).
_EXPECTED_JS = """Array.from(document.querySelectorAll('[id^="i-"]'), (e) => {
  const r = e.getBoundingClientRect(), x = Math.floor(r.left), y = Math.floor(r.top);
  return [e.tagName.toLowerCase(), x, y, Math.ceil(r.right) - x, Math.ceil(r.bottom) - y];
})"""


@contextlib.asynccontextmanager
async def som_session(pool: BrowserPool, url: str, som: bool = True, som_elements: int = 0
                      ) -> AsyncIterator[tuple[BrowserSession, Observation, bytes]]:
    """Open ``url`` (in SoM mode unless ``som`` is False); yields (session, first observation, its JPEG)."""
    session = await pool.lease(f"som-ep-{next(_ids)}")
    try:
        obs, frame = await session.open(url, som=som, som_elements=som_elements)
        with frame:
            jpeg = bytes(frame.view)
        yield session, obs, jpeg
    finally:
        await session.close()


@pytest.fixture
def som_page(pool: BrowserPool, fixture_url: Callable[[str], str]) -> Callable[..., Any]:
    """``async with som_page("som_collect.html") as (session, obs, jpeg): ...``"""
    def opener(name: str, som: bool = True) -> contextlib.AbstractAsyncContextManager[
            tuple[BrowserSession, Observation, bytes]]:
        return som_session(pool, fixture_url(name), som)
    return opener


async def act(session: BrowserSession, action: BrowserAction) -> tuple[Observation, bytes]:
    obs, frame = await session.act(action)
    with frame:
        return obs, bytes(frame.view)


def boxes(obs: Observation) -> list[list[Any]]:
    """The elements without their text: [id, tag, x, y, w, h]."""
    assert obs.elements is not None
    return [[e[0], e[1], *e[3:]] for e in obs.elements]


def centre(el: list[Any]) -> tuple[float, float]:
    """Where the engine clicks for an element: the centre of its box."""
    _id, _tag, _text, x, y, w, h = el
    return x + w / 2, y + h / 2


def near(pixel: np.ndarray, rgb: tuple[int, int, int], tol: int = 40) -> bool:
    return bool(np.all(np.abs(pixel.astype(int) - np.array(rgb)) <= tol))


async def test_interactive_elements_are_collected_in_document_order(som_page) -> None:
    async with som_page("som_collect.html") as (session, obs, _jpeg):
        [expected] = await session.evaluate([_EXPECTED_JS])
        # Tags, interactive roles, onclick (attribute and property), contenteditable and tabindex >= 0;
        # not: <a> without href, hidden inputs, role=note, tabindex=-1, plain div/span/p, <details>.
        assert [e[1:] for e in boxes(obs)] == expected
        # Numbered 1..N in document order: #i-last is at the top of the screen but last in the document.
        assert [e[0] for e in obs.elements] == list(range(1, len(expected) + 1))
        assert obs.elements[-1][1:4] == ["button", "last in document", 10]
        texts = {e[2] for e in obs.elements}
        assert {"link", "button", "typed", "two", "more", "role button", "onclick prop", "editable bold",
                "tabindex 0"} <= texts
        assert {"som_ms", "draw_ms", "screenshot_ms", "action_ms", "settle_ms"} <= set(obs.timings_ms)


async def test_plain_episode_has_no_elements(som_page) -> None:
    async with som_page("som_collect.html", som=False) as (session, obs, _jpeg):
        assert obs.elements is None
        assert "som_ms" not in obs.timings_ms and "draw_ms" not in obs.timings_ms
        obs, _ = await act(session, BrowserAction("wait", seconds=0.05))
        assert obs.elements is None


async def test_iframe_elements_are_offset_by_the_iframe_box_and_clickable(som_page) -> None:
    async with som_page("som_iframe.html") as (session, obs, _jpeg):
        # The iframe's content starts at its position + border (5) + padding (7); #below lies under
        # the iframe's own fold and is left out.
        assert boxes(obs) == [[1, "button", 10, 10, 80, 30],
                              [2, "button", 100 + 12 + 20, 150 + 12 + 30, 100, 40],
                              [3, "select", 100 + 12 + 200, 150 + 12 + 30, 120, 30]]
        assert obs.elements[1][2] == "inner button"
        x, y = centre(obs.elements[1])
        await act(session, BrowserAction("click", x=x, y=y))
        assert await session.evaluate(["document.getElementById('frame').contentWindow.clicked"]) == [1]


async def test_shadow_root_elements_in_place_of_their_host_and_clickable(som_page) -> None:
    async with som_page("som_shadow.html") as (session, obs, _jpeg):
        assert boxes(obs) == [[1, "button", 10, 10, 80, 30],
                              [2, "button", 200 + 30, 100 + 40, 120, 50],
                              [3, "button", 10, 400, 80, 30]]
        assert obs.elements[1][2] == "shadow button"
        x, y = centre(obs.elements[1])
        await act(session, BrowserAction("click", x=x, y=y))
        assert await session.evaluate(["window.shadowClicks"]) == [1]


async def test_page_sized_overlay_is_dropped(som_page) -> None:
    async with som_page("som_overlay.html") as (_session, obs, _jpeg):
        # The backdrop has an onclick but covers the viewport: only the dialog's button is a target.
        assert boxes(obs) == [[1, "button", 500, 300, 150, 40]]


async def test_covered_elements_are_left_out(som_page) -> None:
    async with som_page("som_occluded.html") as (_session, obs, _jpeg):
        # #covered is under the banner; #half's centre is too, but its right part is reachable.
        assert [(e[2], *e[3:]) for e in obs.elements] == [("half covered", 400, 20, 160, 40),
                                                          ("free", 100, 300, 160, 40)]


async def test_hidden_and_offscreen_elements_are_left_out(som_page) -> None:
    async with som_page("som_hidden.html") as (_session, obs, _jpeg):
        # display:none, visibility:hidden, opacity 0 (own or a parent's), zero size, below the fold,
        # left of the viewport, scrolled out of an overflow box: out. A box half out: clipped.
        assert obs.elements == [[1, "button", "shown", 10, 10, 100, 30],
                                [2, "button", "partly out", 1230, 300, 50, 30]]


async def test_element_texts_are_accessible_names(som_page) -> None:
    async with som_page("som_names.html") as (_session, obs, _jpeg):
        texts = [e[2] for e in obs.elements]
        long_text = ("Lorem ipsum dolor sit amet, consectetur adipiscing elit, sed do eiusmod tempor "
                     "incididunt ut labore")
        assert texts == [
            "Close dialog",  # aria-label
            "Due date",  # aria-labelledby
            "Search products",  # placeholder
            "Home page",  # alt of the link's image
            "Send it",  # a submit input's value
            "E-mail address",  # <label for>
            "many spaces and lines",  # whitespace collapsed
            long_text[:79] + "\u2026",  # cut to 80 characters
            "",  # a password's value is never shown
            "Settings",  # title
        ]


async def test_frame_shows_the_marks(som_page) -> None:
    async with som_page("som_marks.html", som=False) as (_s, plain_obs, plain_jpeg):
        assert plain_obs.elements is None
    async with som_page("som_marks.html") as (session, obs, jpeg):
        assert boxes(obs) == [[1, "button", 100, 100, 200, 60], [2, "button", 600, 400, 120, 40]]
        plain, marked = imgcodec.decode(plain_jpeg), imgcodec.decode(jpeg)
        assert marked.shape == plain.shape == (H, W, 3)
        for bid, x, y, w, h in ((1, 100, 100, 200, 60), (2, 600, 400, 120, 40)):
            colour = imgcodec.PALETTE[bid % len(imgcodec.PALETTE)]
            # The outline, inside the box on every edge (mid-edge, away from the label).
            for px, py in ((x + w // 2, y), (x + w // 2, y + h - 1), (x, y + h // 2), (x + w - 1, y + h // 2)):
                assert near(marked[py, px], colour), (bid, px, py, marked[py, px])
                assert not near(plain[py, px], colour)
        # Far from every box the frames agree (JPEG noise only).
        far = (slice(600, 760), slice(100, 500)), (slice(250, 380), slice(800, 1270))
        for ys, xs in far:
            assert np.abs(marked[ys, xs].astype(int) - plain[ys, xs].astype(int)).max() <= 8

        # After an action the observation is a SoM one too: #third appeared, and is drawn.
        obs, jpeg = await act(session, BrowserAction("click", x=centre(obs.elements[0])[0],
                                                     y=centre(obs.elements[0])[1]))
        assert boxes(obs) == [[1, "button", 100, 100, 200, 60], [2, "button", 600, 400, 120, 40],
                              [3, "button", 900, 100, 100, 40]]
        marked = imgcodec.decode(jpeg)
        assert near(marked[100, 950], imgcodec.PALETTE[3])
        assert {"som_ms", "draw_ms"} <= set(obs.timings_ms)


async def test_a_pass_over_a_crowded_page_stops_at_its_caps(tmp_path: Any, fixture_url: Callable[[str], str]
                                                            ) -> None:
    # Hit tests cost more the more elements a page has: uncapped, a page of tens of thousands of targets would keep
    # the pass (and the screenshot waiting on the same renderer) past its timeout.
    url = fixture_url("som_crowd.html")
    cfg = WorkerConfig(endpoint="", worker_id="som-caps", som_max_elements=50)
    async with inproc_pool(f"ipc://{tmp_path}/pool.sock", cfg) as (worker, pool):
        async with som_session(pool, url) as (_s, obs, _jpeg):
            assert [e[0] for e in obs.elements or []] == list(range(1, 51))
            assert [e[2] for e in (obs.elements or [])[:3]] == ["l1", "l2", "l3"]  # the first ones, in order
            assert obs.note == ("Set-of-Marks: 50 elements listed, the pass stopped at its cap of 50; the page may "
                                "have more")
            assert obs.elements_cut == "count"
        # The caller's cap (the engine's page_limits.elements), lower than the worker's: the boxes drawn are the
        # ones listed, so the frame shows no id that the prompt leaves out.
        async with som_session(pool, url, som=False) as (_s, _obs, plain_jpeg):
            pass
        async with som_session(pool, url, som_elements=7) as (session, obs, jpeg):
            assert [e[0] for e in obs.elements or []] == list(range(1, 8))
            assert obs.note is not None and "stopped at its cap of 7;" in obs.note
            later, frame = await session.observe()  # every later observation of the episode keeps the cap
            frame.release()
            assert len(later.elements or []) == 7
        plain, marked = (imgcodec.decode(j).astype(int) for j in (plain_jpeg, jpeg))
        _id, _tag, _text, x, y, w, _h = (obs.elements or [])[-1]
        top_edge = np.abs(marked[y, :] - plain[y, :]).sum(axis=1)  # per pixel of the row of the first links' tops
        assert top_edge[x + 2:x + w - 2].min() > 60  # link 7: its box drawn
        assert top_edge[x + w + 2:x + 2 * w - 2].max() < 60  # link 8, the next one in the row: no box
        async with som_session(pool, url, som_elements=500) as (_s, obs, _jpeg):  # the worker's own cap still holds
            assert len(obs.elements or []) == 50
        worker.cfg.som_budget_ms = 0  # out of time at once
        async with som_session(pool, url) as (_s, obs, _jpeg):
            assert obs.elements == [] and obs.note is not None
            assert obs.note.startswith("Set-of-Marks: 0 elements listed, the pass stopped at its time budget of 0 ms")
            assert obs.elements_cut == "time"
        worker.cfg.som_max_elements, worker.cfg.som_budget_ms = 400, 10_000
        async with som_session(pool, url) as (_s, obs, _jpeg):
            assert len(obs.elements or []) == 400 and obs.note is None and obs.elements_cut is None


async def test_an_open_with_a_malformed_element_cap_is_refused(pool: BrowserPool,
                                                               fixture_url: Callable[[str], str]) -> None:
    for bad in (-1, "300", 2.5, True):
        with pytest.raises(BrowserOpError) as err:
            async with som_session(pool, fixture_url("som_collect.html"), som_elements=bad):  # type: ignore[arg-type]
                pass
        assert err.value.kind == "refused" and "non-negative integer" in str(err.value)


def test_marks_are_drawn_in_screenshot_pixels() -> None:
    """A screenshot twice the viewport's CSS size (a device scale factor of 2) gets boxes twice as big."""
    img = np.full((2 * H, 2 * W, 3), 255, dtype=np.uint8)
    jpeg = imgcodec.encode(img, 90)
    out = imgcodec.decode(_draw_marks(jpeg, [[1, "button", "b", 100, 100, 200, 60]], float(W), 90))
    colour = imgcodec.PALETTE[1]
    assert near(out[200, 400], colour)  # top edge at y = 2 * 100
    assert near(out[200 + 119, 400], colour)  # bottom edge at y = 2 * 160 - 1
    assert near(out[260, 200], colour) and near(out[260, 599], colour)  # left and right edges
    assert near(out[200 + 125, 400], (255, 255, 255))  # just below the box: untouched


async def test_select_by_point_in_the_main_document(som_page) -> None:
    async with som_page("som_select.html") as (session, obs, _jpeg):
        x, y = 100, 35  # the centre of #size
        obs, _ = await act(session, BrowserAction("select", x=x, y=y, text="  medium "))
        assert obs.point == (x, y)
        assert await session.evaluate(["document.getElementById('size').value", "window.events"]) == [
            "m", ["input:m", "change:m"]]
        await act(session, BrowserAction("select", x=x, y=y, text="XL"))  # by value, any case
        await act(session, BrowserAction("select", x=x, y=y, text="extra large"))  # label, spaces collapsed
        assert await session.evaluate(["document.getElementById('size').value"]) == ["xl"]
        for bad in (BrowserAction("select", x=x, y=y, text="Huge"),  # no such option
                    BrowserAction("select", x=x, y=y, text="Large"),  # a disabled option
                    BrowserAction("select", x=100, y=95, text="Small")):  # a button, not a select
            with pytest.raises(BrowserOpError) as err:
                await act(session, bad)
            assert err.value.kind == "refused"
        assert await session.evaluate(["document.getElementById('size').value"]) == ["xl"]


async def test_select_by_point_in_an_iframe(som_page) -> None:
    async with som_page("som_select.html") as (session, obs, _jpeg):
        [fruit] = [e for e in obs.elements if e[3] >= 300]  # the <select> in the iframe
        assert fruit[1:] == ["select", "Apple", 302 + 40, 102 + 20, 150, 30]
        x, y = centre(fruit)
        obs, _ = await act(session, BrowserAction("select", x=x, y=y, text="cherry"))
        win = "document.querySelector('iframe').contentWindow"
        assert await session.evaluate([f"{win}.document.getElementById('fruit').value", f"{win}.events"]) == [
            "c", ["input:c", "change:c"]]
        assert [e for e in obs.elements if e[3] >= 300][0][2] == "Cherry"  # the new choice is its text
