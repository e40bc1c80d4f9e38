"""Every browser action kind, through the real pool and a real Chromium, one fixture page per behaviour.

Each test asserts on the page state (``session.evaluate``) and on the Observation the step returned.
"""

from __future__ import annotations

import asyncio
import time

import numpy as np
import pytest
import uvloop

from browserpool.config import DEFAULT_CHROMIUM, FULL_CHROMIUM, WorkerConfig
from browserpool.keys import (
    TYPE_KEYED_EDGE,
    TYPE_MAX_LINE_BREAKS,
    TYPE_MIDDLE_ENTERS,
    KeyDef,
    key_for_char,
    typing_plan,
)
from browserpool.pool import BrowserOpError, BrowserSession, PoolConfig
from browserpool.protocol import ERR_TOO_LARGE, MAX_ERROR_CHARS, MAX_MESSAGE_BYTES, BrowserAction, FrameRef, Observation
from engine._imgcodec import decode, frame_diff
from tests.conftest import started_pool

W, H = 1280, 768


async def act(session: BrowserSession, action: BrowserAction) -> tuple[Observation, bytes]:
    """One step; returns the observation and a copy of its JPEG (the frame's slot is released)."""
    obs, frame = await session.act(action)
    with frame:
        return obs, bytes(frame.view)


def check_frame(obs: Observation, jpeg: bytes) -> np.ndarray:
    """The frame is a viewport-sized JPEG; returns its pixels."""
    assert jpeg[:2] == b"\xff\xd8"
    assert (obs.width, obs.height) == (W, H)
    img = decode(jpeg)
    assert img.shape == (H, W, 3)
    return img


def check_quiet(obs: Observation, url_end: str, title: str) -> None:
    assert obs.url.endswith(url_end), obs.url
    assert obs.title == title
    assert obs.settle == "quiet"
    assert obs.settled is True


async def js(session: BrowserSession, *exprs: str) -> list:
    return await session.evaluate(list(exprs))


def near(pixel: np.ndarray, rgb: tuple[int, int, int], tol: int = 24) -> bool:
    return bool(np.all(np.abs(pixel.astype(int) - np.array(rgb)) <= tol))


async def test_tests_run_on_uvloop() -> None:
    assert isinstance(asyncio.get_running_loop(), uvloop.Loop)


async def test_open_observation(open_page) -> None:
    async with open_page("click.html") as (_session, obs, frame):
        check_quiet(obs, "/fixtures/click.html", "click")
        assert isinstance(obs.frame, FrameRef)  # same host: the frame came through shared memory
        assert obs.frame_bytes is None
        jpeg = bytes(frame.view)
        assert obs.frame.nbytes == len(jpeg)
        img = check_frame(obs, jpeg)
        assert near(img[5, 5], (255, 255, 255))  # a blank page corner
        assert {"action_ms", "settle_ms", "screenshot_ms"} <= set(obs.timings_ms)


async def test_click_at_coordinates_changes_the_dom(open_page) -> None:
    async with open_page("click.html") as (session, _, _f):
        obs, jpeg = await act(session, BrowserAction("click", x=200, y=130))
        check_quiet(obs, "/fixtures/click.html", "click")
        check_frame(obs, jpeg)
        assert obs.point == (200.0, 130.0)
        assert await js(session, "document.getElementById('out').textContent", "window.clicks") == [
            "clicked 1", [[200, 130]]]
        # A click beside the button does nothing.
        await act(session, BrowserAction("click", x=600, y=600))
        assert await js(session, "window.clicks.length") == [1]


async def test_the_full_chromium_serves_episodes_as_the_headless_shell_does(open_page) -> None:
    # The workers run Chromium's headless shell by default; the full browser (``--chromium``) must work the same.
    assert DEFAULT_CHROMIUM.endswith("chromium-headless-shell") and FULL_CHROMIUM != DEFAULT_CHROMIUM
    async with started_pool(PoolConfig(workers=1, worker=WorkerConfig(endpoint="", chromium_path=FULL_CHROMIUM))
                            ) as full, open_page("click.html", pool=full) as (session, obs, frame):
        check_quiet(obs, "/fixtures/click.html", "click")
        check_frame(obs, bytes(frame.view))
        obs, jpeg = await act(session, BrowserAction("click", x=200, y=130))
        check_frame(obs, jpeg)
        assert await js(session, "document.getElementById('out').textContent") == ["clicked 1"]


async def test_click_by_selector_reports_the_point(open_page) -> None:
    async with open_page("click.html") as (session, _, _f):
        obs, _ = await act(session, BrowserAction("click", selector="#btn"))
        assert obs.point == pytest.approx((200.0, 130.0))  # the button's centre, in CSS px
        assert await js(session, "window.clicks") == [[[200, 130]]]
        assert await session.locate("#btn") == {
            "found": True, "x": 200, "y": 130, "width": 200, "height": 60, "inView": True,
            "below": False, "viewportHeight": H}


async def test_click_on_a_target_outside_the_viewport_is_refused(open_page) -> None:
    async with open_page("click.html") as (session, _, _f):
        loc = await session.locate("#far")
        assert loc["found"] and not loc["inView"] and loc["below"]
        with pytest.raises(BrowserOpError) as err:
            await act(session, BrowserAction("click", selector="#far"))
        assert err.value.kind == "refused"
        with pytest.raises(BrowserOpError) as err:
            await act(session, BrowserAction("click", selector="#no-such-element"))
        assert err.value.kind == "refused"
        # Nothing was clicked, and the session still works.
        assert await js(session, "window.clicks.length") == [0]
        await act(session, BrowserAction("click", selector="#btn"))
        assert await js(session, "window.clicks.length") == [1]


async def test_type_with_clear_and_enter_submits_the_form(open_page) -> None:
    async with open_page("form.html") as (session, _, _f):
        obs, jpeg = await act(session, BrowserAction("type", selector="#q", text="hello world"))
        check_frame(obs, jpeg)
        check_quiet(obs, "/_test/echo?q=hello+world", "echo")  # "old text" was cleared first
        assert obs.point is not None
        assert await js(session, "document.querySelector('#params td').textContent") == ["hello world"]


async def test_type_without_clear_or_enter_appends(open_page) -> None:
    async with open_page("form.html") as (session, _, _f):
        obs, _ = await act(session, BrowserAction("type", selector="#note", text="d-E!", clear=False,
                                                  enter=False))
        check_quiet(obs, "/fixtures/form.html", "form")
        assert await js(session, "document.getElementById('note').value", "window.keydowns") == ["abcd-E!", 4]
        # Typing with no target goes to the focused element; clear replaces its text.
        await act(session, BrowserAction("type", text="xyz", enter=False))
        assert await js(session, "document.getElementById('note').value") == ["xyz"]


async def test_a_long_text_is_typed_whole_within_the_action_cap(open_page) -> None:
    # 20,000 characters key by key would take the renderer ~15 s, past the action's 10 s cap, and leave the text cut
    # off; its ends still come as key presses, and each newline as an Enter.
    text = ("Lorem ipsum dolor sit amet, " * 200 + "\n") * 3 + "\u00e9t\u00e9 \u4e2d\u6587" + "x" * 3000 + "end"
    async with open_page("type_long.html") as (session, _, _f):
        obs, _ = await act(session, BrowserAction("type", selector="#t", text=text, clear=False,
                                                  enter=False))
        check_quiet(obs, "/fixtures/type_long.html", "type long")
        value, seen = await js(session, "document.getElementById('t').value", "window.seen")
        assert value == text
        assert seen["enter"] == 3 and seen["keydown"] == 2 * TYPE_KEYED_EDGE + 3 == seen["keyup"]
        assert seen["lastKeyup"] == "end"  # a key handler sees the whole text at the last key
        assert seen["input"] < 2 * TYPE_KEYED_EDGE + 20


async def test_a_text_of_many_lines_is_typed_with_a_bounded_number_of_key_presses_or_refused(open_page) -> None:
    # Before, every newline was an Enter press: 20,000 of them, 40,000 key events sent at once, kept the worker too
    # busy to heartbeat for 14 s (its other sessions waited as long) and hung the page.
    text = "x" + "\n" * TYPE_MAX_LINE_BREAKS + "y"
    async with open_page("type_long.html") as (session, _, _f):
        obs, _ = await act(session, BrowserAction("type", selector="#t", text=text, clear=False, enter=False))
        check_quiet(obs, "/fixtures/type_long.html", "type long")
        value, seen = await js(session, "document.getElementById('t').value", "window.seen")
        assert value == text
        assert seen["enter"] == 2 * TYPE_KEYED_EDGE - 2 + TYPE_MIDDLE_ENTERS
        assert seen["keydown"] == 2 * TYPE_KEYED_EDGE + TYPE_MIDDLE_ENTERS == seen["keyup"]
        # More line breaks than that would hang the page in Chromium's editing: refused at once, nothing typed.
        with pytest.raises(BrowserOpError, match="20,000 line breaks in the text: at most 1,000 are typed"):
            await session.act(BrowserAction("type", selector="#t", text="\n" * 20_000))
        assert await js(session, "document.getElementById('t').value.length") == [len(text)]


async def test_a_request_over_the_message_cap_is_refused_before_it_is_sent(open_page) -> None:
    # Before, the engine sent it: the worker's socket dropped it and closed the connection, and the step waited 60 s
    # for its deadline (three in a row and the worker would have been dropped, with every episode it served).
    async with open_page("type_long.html") as (session, _, _f):
        t0 = time.monotonic()
        with pytest.raises(BrowserOpError) as err:
            await session.act(BrowserAction("type", selector="#t", text="x" * (MAX_MESSAGE_BYTES + 1)))
        assert err.value.kind == ERR_TOO_LARGE and "over the 16,777,216-byte cap" in str(err.value)
        assert time.monotonic() - t0 < 10
        obs, _ = await act(session, BrowserAction("type", selector="#t", text="fine", enter=False))
        assert obs.settle == "quiet" and await js(session, "document.getElementById('t').value") == ["fine"]


async def test_an_argument_msgpack_cannot_carry_is_refused_and_the_screenshot_releases_wait(open_page) -> None:
    # Before, OverflowError came out of the pool, and the screenshot slots it was to hand back were lost for good.
    async with open_page("click.html") as (session, _, _f):
        _obs, frame = await session.act(BrowserAction("click", x=10, y=10))
        frame.release()
        waiting = list(session.handle.pending_release)
        assert waiting  # the frame came through shared memory: its slot goes back with the next request
        with pytest.raises(BrowserOpError) as err:
            await session.act(BrowserAction("scroll", direction="down", amount=10**30))
        assert err.value.kind == "refused" and "cannot be sent" in str(err.value)
        assert session.handle.pending_release[:len(waiting)] == waiting
        obs, _ = await act(session, BrowserAction("click", x=10, y=10))
        assert obs.settle == "quiet"


def test_the_typing_plan_presses_keys_at_both_ends_and_inserts_the_middle() -> None:
    def keys(plan: list[tuple[KeyDef | None, str]]) -> str:
        return "".join(c for kd, c in plan if kd is not None)

    short = "Hello, world!\n" * 9  # 126 characters: every one a key
    assert keys(typing_plan(short)) == short
    long = "a" * 64 + "b\nc" * 30 + "d" * 64
    plan = typing_plan(long)
    assert "".join(c for _kd, c in plan) == long
    assert keys(plan) == "a" * 64 + "\n" * 30 + "d" * 64
    assert [c for kd, c in plan if kd is None] == ["b"] + ["cb"] * 29 + ["c"]  # runs between the newlines
    assert typing_plan("caf\u00e9 \u4e2d\u6587!")[3:] == [(None, "\u00e9"), (key_for_char(" "), " "),
                                                     (None, "\u4e2d\u6587"), (key_for_char("!"), "!")]
    assert typing_plan("") == []
    many = "a" * 64 + "\n" * 1000 + "z" * 64  # the middle's newlines after the first 64 are inserted
    plan = typing_plan(many)
    assert "".join(c for _kd, c in plan) == many
    assert keys(plan) == "a" * 64 + "\n" * TYPE_MIDDLE_ENTERS + "z" * 64
    assert [c for kd, c in plan if kd is None] == ["\n" * (1000 - TYPE_MIDDLE_ENTERS)]


async def test_type_into_a_native_select_picks_an_option(open_page) -> None:
    async with open_page("select.html") as (session, _, _f):
        obs, _ = await act(session, BrowserAction("type", selector="#fruit", text="Cherry"))
        check_quiet(obs, "/fixtures/select.html", "select")
        assert await js(session, "document.getElementById('fruit').value",
                        "document.getElementById('out').textContent") == ["cherry", "picked cherry"]


async def test_hover(open_page) -> None:
    async with open_page("hover.html") as (session, obs, frame):
        before = check_frame(obs, bytes(frame.view))
        assert near(before[200, 250], (220, 220, 220))
        obs, jpeg = await act(session, BrowserAction("hover", x=250, y=200))
        check_quiet(obs, "/fixtures/hover.html", "hover")
        state = await js(session, "getComputedStyle(document.getElementById('box')).backgroundColor",
                         "document.getElementById('out').textContent",
                         "document.querySelector('#box:hover') !== null")
        assert state == ["rgb(0, 160, 0)", "hovered", True]
        assert near(check_frame(obs, jpeg)[200, 250], (0, 160, 0))  # the screenshot shows the :hover style
        # Moving away ends the hover.
        obs, jpeg = await act(session, BrowserAction("hover", x=800, y=600))
        assert near(check_frame(obs, jpeg)[200, 250], (220, 220, 220))


async def test_key_presses(open_page) -> None:
    async with open_page("keys.html") as (session, _, _f):
        await act(session, BrowserAction("click", selector="#a"))
        assert await js(session, "document.activeElement.id") == ["a"]
        obs, _ = await act(session, BrowserAction("key", keys="Tab"))
        check_quiet(obs, "/fixtures/keys.html", "keys")
        assert await js(session, "document.activeElement.id") == ["b"]
        # Several keys in one action: Tab to the <select>, then ArrowDown picks the next option.
        await act(session, BrowserAction("key", keys="Tab ArrowDown"))
        assert await js(session, "document.activeElement.id", "document.getElementById('size').value") == [
            "size", "medium"]
        # Control+A selects all the text of a field.
        await act(session, BrowserAction("click", selector="#a"))
        await act(session, BrowserAction("key", keys="Control+A"))
        a = "document.getElementById('a')"
        assert await js(session, f"{a}.selectionStart", f"{a}.selectionEnd") == [0, len("hello world")]
        log = (await js(session, "window.keylog"))[0]
        assert log[:3] == ["Tab", "Tab", "ArrowDown"]
        assert log[3].lower() == "control+a"
        # An unknown key is refused.
        with pytest.raises(BrowserOpError) as err:
            await act(session, BrowserAction("key", keys="NoSuchKey"))
        assert err.value.kind == "refused"
        # So is a model's runaway key name, at once, with the message cut. Before, the refusal's whole text went into
        # the reply, which the engine could not decode (errors are capped at 4,096 characters): the step waited 60 s
        # for its deadline, and the worker was counted a bad peer (banned at 5).
        t0 = time.monotonic()
        with pytest.raises(BrowserOpError) as err:
            await act(session, BrowserAction("key", keys="X" * 5000 + "+a"))
        assert err.value.kind == "refused" and str(err.value).startswith("unknown modifier 'XXX")
        assert len(str(err.value)) == MAX_ERROR_CHARS and time.monotonic() - t0 < 10
        assert (await js(session, "window.keylog"))[0][:3] == ["Tab", "Tab", "ArrowDown"]  # the page goes on


async def test_scroll_window(open_page) -> None:
    async with open_page("scroll.html") as (session, _, _f):
        step = H - 50
        obs, jpeg = await act(session, BrowserAction("scroll", direction="down"))
        check_quiet(obs, "/fixtures/scroll.html", "scroll")
        check_frame(obs, jpeg)
        assert await js(session, "window.scrollY") == [step]
        await act(session, BrowserAction("scroll", direction="down"))
        assert await js(session, "window.scrollY") == [2 * step]
        await act(session, BrowserAction("scroll", direction="up"))
        assert await js(session, "window.scrollY") == [step]
        await act(session, BrowserAction("scroll", direction="up", amount=100))
        assert await js(session, "window.scrollY") == [step - 100]
        with pytest.raises(BrowserOpError) as err:
            await act(session, BrowserAction("scroll", direction="sideways"))
        assert err.value.kind == "refused"


async def test_scroll_inner_element_under_the_point(open_page) -> None:
    async with open_page("scroll.html") as (session, _, _f):
        inner = "document.getElementById('inner').scrollTop"
        await act(session, BrowserAction("scroll", direction="down", x=200, y=150))
        assert await js(session, inner, "window.scrollY") == [H - 50, 0]
        await act(session, BrowserAction("scroll", direction="up", x=200, y=150, amount=300))
        assert await js(session, inner, "window.scrollY") == [H - 50 - 300, 0]
        # A point outside the scrollable element scrolls the window.
        await act(session, BrowserAction("scroll", direction="down", x=800, y=400))
        assert await js(session, inner, "window.scrollY") == [H - 50 - 300, H - 50]


async def test_go_back(open_page) -> None:
    async with open_page("nav_a.html") as (session, _, _f):
        # At the start of the episode's history there is nothing to go back to.
        obs, _ = await act(session, BrowserAction("go_back"))
        check_quiet(obs, "/fixtures/nav_a.html", "page A")
        obs, _ = await act(session, BrowserAction("click", selector="#to-b"))
        check_quiet(obs, "/fixtures/nav_b.html", "page B")
        obs, jpeg = await act(session, BrowserAction("go_back"))
        check_quiet(obs, "/fixtures/nav_a.html", "page A")
        check_frame(obs, jpeg)
        assert await js(session, "location.pathname", "document.querySelector('h1').textContent") == [
            "/fixtures/nav_a.html", "Page A"]


async def test_navigate(open_page, fixture_url) -> None:
    async with open_page("nav_a.html") as (session, _, _f):
        obs, jpeg = await act(session, BrowserAction("navigate", url=fixture_url("nav_b.html")))
        check_quiet(obs, "/fixtures/nav_b.html", "page B")
        check_frame(obs, jpeg)
        assert await js(session, "document.getElementById('heading').textContent") == ["Page B"]
        obs, _ = await act(session, BrowserAction("go_back"))
        check_quiet(obs, "/fixtures/nav_a.html", "page A")


@pytest.mark.wallclock
async def test_wait_on_a_quiet_page_lasts_its_duration(open_page) -> None:
    async with open_page("click.html") as (session, _, _f):
        t0 = time.monotonic()
        obs, jpeg = await act(session, BrowserAction("wait", seconds=0.6))
        assert 0.6 <= time.monotonic() - t0 < 3.0
        check_quiet(obs, "/fixtures/click.html", "click")
        check_frame(obs, jpeg)
        assert obs.point is None
        # A duration that is no number of seconds waits the default second (before: an internal error).
        for seconds in (float("nan"), float("inf"), -5.0):
            t0 = time.monotonic()
            obs, _ = await act(session, BrowserAction("wait", seconds=seconds))
            assert obs.settle == "quiet" and 1.0 <= time.monotonic() - t0 < 3.5, seconds


async def test_wait_sees_a_change_that_a_timer_makes(open_page) -> None:
    async with open_page("delayed.html") as (session, obs, _f):
        assert await js(session, "document.getElementById('status').textContent") == ["loading"]
        obs, _ = await act(session, BrowserAction("wait", seconds=1.0))
        assert obs.settle == "quiet"
        assert await js(session, "document.getElementById('status').textContent") == ["ready"]


@pytest.mark.parametrize("url", [
    "file:///etc/passwd",
    "chrome://version",
    "javascript:document.title='pwned'",
    "JavaScript:document.title='pwned'",
    "data:text/html,<title>pwned</title>",
])
async def test_navigation_to_a_forbidden_url_is_refused(open_page, url: str) -> None:
    async with open_page("click.html") as (session, _, _f):
        with pytest.raises(BrowserOpError) as err:
            await act(session, BrowserAction("navigate", url=url))
        assert err.value.kind == "refused"
        # The page is untouched and the session still usable.
        assert (await js(session, "location.pathname", "document.title")) == ["/fixtures/click.html", "click"]
        obs, _ = await act(session, BrowserAction("click", selector="#btn"))
        check_quiet(obs, "/fixtures/click.html", "click")
        assert await js(session, "window.clicks.length") == [1]


async def test_opening_a_forbidden_url_is_refused(pool, fixture_url) -> None:
    session = await pool.lease("test-open-refused")
    try:
        with pytest.raises(BrowserOpError) as err:
            await session.open("file:///etc/passwd")
        assert err.value.kind == "refused"
        obs, frame = await session.open(fixture_url("click.html"))
        frame.release()
        check_quiet(obs, "/fixtures/click.html", "click")
    finally:
        await session.close()


async def test_target_blank_opens_in_the_same_tab(open_page) -> None:
    async with open_page("blank_target.html") as (session, _, _f):
        obs, jpeg = await act(session, BrowserAction("click", selector="#link"))
        check_quiet(obs, "/fixtures/nav_b.html", "page B")
        check_frame(obs, jpeg)
        assert await js(session, "document.getElementById('heading').textContent") == ["Page B"]
        obs, _ = await act(session, BrowserAction("go_back"))
        check_quiet(obs, "/fixtures/blank_target.html", "new tabs")
        # window.open(url, '_blank') navigates this tab too.
        obs, _ = await act(session, BrowserAction("click", selector="#opener"))
        check_quiet(obs, "/fixtures/nav_a.html", "page A")


async def test_typing_a_word_into_a_bundled_search_box_counts_as_a_change(open_page, site_server: str) -> None:
    # The shop's own search box (the bundled sites are served at the fixture server's root).
    async with open_page(f"{site_server}/shop/") as (session, _obs, frame):
        opened = bytes(frame.view)
        obs, shot = await session.act(BrowserAction("click", x=1275, y=384))  # an inert margin: nothing changes
        with shot:
            unchanged = bytes(shot.view)
        assert unchanged == opened and obs.change == 0.0
        obs, shot = await session.act(BrowserAction("click", selector="#search-input"))  # focus the box
        with shot:
            focused = bytes(shot.view)
        obs, shot = await session.act(BrowserAction("type", text="mug", clear=False, enter=False))
        with shot:
            typed = bytes(shot.view)
        fraction = frame_diff(focused, typed)[0]
        # A few hundred pixels: far under a threshold of 0.2% of the (1/4-scale) frame, yet a change, as the
        # original's exact comparison of the frames has it.
        assert 0 < fraction < 0.002, fraction
        assert obs.change == fraction > 0
