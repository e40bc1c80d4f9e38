"""Popups, new tabs, downloads, file choosers, dialogs, permission prompts, a page closing its own tab and a page
replacing the builtins the worker's scripts use (real Chromium, pages on loopback).

Every page a context opens besides the episode's tab is closed (or, when the agent's own action opened it,
becomes the episode's page: the tab goes to its URL); nothing of an episode (its pages, the storage of every
origin it touched, its cookies) is there when the next episode gets the same context.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any
from urllib.parse import quote

import psutil
import pytest
import pytest_asyncio

from browserpool.config import WorkerConfig
from browserpool.page import DIALOG_STORM, POPUP_STORM
from browserpool.pool import BrowserPool, BrowserSession
from browserpool.protocol import BrowserAction, NetSettings, Observation, PageEvent
from browserpool.tab_events import refused_detail
from browserpool.worker import BrowserWorker
from tests.conftest import inproc_pool, open_session, until
from tests.test_netpolicy import CountingServer, Fence

EMPTY = {"local": 0, "session": 0, "cookie": ""}


@pytest.fixture(scope="module")
def other() -> Iterator[CountingServer]:
    """Another origin (a loopback server the worker's policy allows): where the popups go."""
    server = CountingServer()
    yield server
    server.close()


@pytest.fixture(scope="module")
def fence() -> Iterator[Fence]:
    with pytest.MonkeyPatch.context() as mp:
        yield Fence(mp)


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def inproc(tmp_path_factory: pytest.TempPathFactory, other: CountingServer, fence: Fence
                 ) -> AsyncIterator[tuple[BrowserWorker, BrowserPool]]:
    cfg = WorkerConfig(endpoint="", worker_id="popups", net=NetSettings(
        allow=[f"127.0.0.1:{other.port}"], hosts={"other.test": "127.0.0.1"}))
    async with inproc_pool(f"ipc://{tmp_path_factory.mktemp('ipc')}/pool.sock", cfg) as wp:
        yield wp
    assert fence.outside == []


async def act(session: BrowserSession, action: BrowserAction) -> Observation:
    obs, frame = await session.act(action)
    frame.release()
    return obs


async def js(session: BrowserSession, *exprs: str) -> list[Any]:
    return await session.evaluate(list(exprs))


def slot_of(worker: BrowserWorker, session: BrowserSession) -> Any:
    return worker.episodes[session.episode_id].slot


@contextlib.asynccontextmanager
async def open_in_context(worker: BrowserWorker, pool: BrowserPool, url: str, ctx: Any
                          ) -> AsyncIterator[tuple[BrowserSession, Observation]]:
    """Open ``url`` in the next episode that gets ``ctx``, which must have gone back to the worker's idle contexts
    (kept for reuse, not dropped). Other idle contexts may come first: which one an episode gets depends on when
    each went back. The episodes that get those are held open until one gets ``ctx``."""
    assert await until(lambda: any(slot.context is ctx for slot in worker.idle)), "the context was not kept"
    async with contextlib.AsyncExitStack() as held:
        for _ in range(len(worker.idle)):
            session, obs, _frame = await held.enter_async_context(open_session(pool, url))
            if slot_of(worker, session).context is ctx:
                yield session, obs
                return
    raise AssertionError("no episode got the context back")


def wrote(server: CountingServer, origin: str) -> bool:
    return any(p.startswith("/wrote?from=" + quote(origin, safe="")) for _, p, _ in server.requests)


# (opener page, how the popup is opened: a click on a selector or at a point)
ESCAPES = [
    ("popup_detached.html", BrowserAction("click", selector="#go")),
    ("popup_form_target.html", BrowserAction("click", selector="#go")),
    ("popup_iframe.html", BrowserAction("click", x=300, y=150)),  # a button filling the iframe
    ("popup_noopener.html", BrowserAction("click", selector="#go")),
]


async def assert_dropped(worker: BrowserWorker, pool: BrowserPool, ctx: Any, url: str) -> None:
    """``ctx`` (whose episode had a popup) is closed, not reused: a popup's renderer is a process of its own, whose
    storage writes can land after a reset's clearing. The next episode on ``url`` finds no storage, no cookie."""
    assert await until(lambda: ctx not in worker.browser.contexts)  # type: ignore[union-attr]
    assert all(slot.context is not ctx for slot in worker.idle)
    async with open_session(pool, url) as (s2, obs, _f):
        assert slot_of(worker, s2).context is not ctx
        assert len(slot_of(worker, s2).context.pages) == 1 and not obs.events
        assert (await js(s2, "window.seenAtLoad"))[0] == EMPTY
        assert await slot_of(worker, s2).context.cookies() == []


@pytest.mark.parametrize(("page", "action"), ESCAPES,
                         ids=[p.removeprefix("popup_").removesuffix(".html") for p, _ in ESCAPES])
async def test_a_popup_past_the_shim_is_adopted_closed_and_its_context_dropped(
        inproc: tuple[BrowserWorker, BrowserPool], fixture_url: Callable[[str], str], other: CountingServer,
        page: str, action: BrowserAction) -> None:
    worker, pool = inproc
    to = f"{other.base_url}/fixtures/popup_target.html"
    async with open_session(pool, fixture_url(f"{page}?to={quote(to, safe='')}")) as (s1, obs, _f):
        ctx = slot_of(worker, s1).context
        obs = await act(s1, action)
        # One tab per episode: the tab went to the popup's URL (a form posted into a new window loads with GET).
        assert obs.url == to and obs.title == "popup target", obs
        assert PageEvent("popup", to, "adopted") in (obs.events or [])
        assert await until(lambda: len(ctx.pages) == 1), [p.url for p in ctx.pages]
        assert await until(lambda: wrote(other, to))
        assert (await js(s1, "localStorage.getItem('popup')"))[0] == "local"
    await assert_dropped(worker, pool, ctx, f"{other.base_url}/fixtures/storage.html")


async def test_popups_without_a_user_gesture_are_closed_not_adopted(
        inproc: tuple[BrowserWorker, BrowserPool], fixture_url: Callable[[str], str], other: CountingServer,
        monkeypatch: pytest.MonkeyPatch) -> None:
    worker, pool = inproc
    monkeypatch.setattr(worker.cfg, "max_popups", POPUP_STORM)  # all of them load (past the cap: the bomb's test)
    to = f"http://other.test:{other.port}/fixtures/popup_target.html"  # an origin only the popup loads
    opener = fixture_url(f"popup_onload.html?n={POPUP_STORM - 1}&to={quote(to, safe='')}")  # not a storm
    async with open_session(pool, opener) as (s1, obs, _f):
        ctx = slot_of(worker, s1).context
        assert obs.title == "popup onload"  # the tab stays where it was
        events = list(obs.events or [])
        deadline = time.monotonic() + 10
        while len([e for e in events if e.kind == "popup"]) < POPUP_STORM - 1 and time.monotonic() < deadline:
            events += (await act(s1, BrowserAction("wait", seconds=0.2))).events or []
        opened = sorted(f"{to}?i={i}" for i in range(POPUP_STORM - 1))
        assert sorted(e.url for e in events if e.kind == "popup") == opened
        assert all(e.detail == "closed" for e in events if e.kind == "popup")
        assert await until(lambda: len(ctx.pages) == 1)
    # The episode ends as soon as its popups are closed, while their last writes may still be on their way.
    await assert_dropped(worker, pool, ctx, f"http://other.test:{other.port}/fixtures/storage.html")


async def test_a_storm_of_popups_is_left_for_a_blank_page(
        inproc: tuple[BrowserWorker, BrowserPool], fixture_url: Callable[[str], str], other: CountingServer) -> None:
    """Before, a page that opened windows without end kept its worker setting up and closing 13-20 of them a second:
    its steps took 4-6x as long, another episode's on the same worker 2-9x, and its processes grew to 1.1-2.1 GB."""
    worker, pool = inproc
    to = f"http://other.test:{other.port}/fixtures/popup_target.html"
    async with open_session(pool, fixture_url(f"popup_storm.html?to={quote(to, safe='')}")) as (s1, obs, _f):
        slot = slot_of(worker, s1)
        ctx = slot.context
        events = list(obs.events or [])
        deadline = time.monotonic() + 10
        while not any("windows opened in one step" in e.detail for e in events) and time.monotonic() < deadline:
            events += (await act(s1, BrowserAction("wait", seconds=0.2))).events or []
        storm = [e for e in events if "windows opened in one step" in e.detail]
        assert [e.detail for e in storm] == [f"{POPUP_STORM} windows opened in one step: the page was left for "
                                             "about:blank"], events
        obs = await act(s1, BrowserAction("wait", seconds=0.5))
        assert obs.url == "about:blank"
        # The storm is over: nothing opens any more. Windows opened before the page was left may still be reported
        # (Playwright sets each one up first, slower on a loaded machine); then a whole step brings none.
        quiet, deadline = False, time.monotonic() + 10
        while not quiet and time.monotonic() < deadline:
            opened = slot.popups
            obs = await act(s1, BrowserAction("wait", seconds=0.5))
            quiet = slot.popups == opened and not obs.events
        assert quiet and obs.url == "about:blank", (slot.popups, obs.events)
        # The page is usable again: the agent can go on elsewhere.
        obs = await act(s1, BrowserAction("navigate", url=fixture_url("click.html")))
        assert obs.title == "click" and obs.settle == "quiet"
    await assert_dropped(worker, pool, ctx, f"http://other.test:{other.port}/fixtures/storage.html")


# The ways a page opens windows past the in-page shim, from the page and from a cross-site iframe (popup_bomb.html).
BOMB_WAYS = ["link", "open", "form", "middle", "frame-link", "frame-open", "frame-form", "frame-middle"]


def chromium_processes(worker: BrowserWorker) -> int:
    return len(psutil.Process(worker._chromium_pid).children(recursive=True))


async def test_a_popup_bomb_loads_at_most_max_popups_and_leaves_nothing_behind(
        inproc: tuple[BrowserWorker, BrowserPool], fixture_url: Callable[[str], str], other: CountingServer) -> None:
    """A page that opens 50 windows (links, document.open, forms, middle clicks; from the page and a cross-site
    frame): only the episode's max_popups of them load, the rest are closed before they send a request and recorded;
    the episode goes on, and neither a process nor a page of them outlives it. Before, all 50 loaded, each window a
    page to set up and, across sites, a renderer of its own."""
    worker, pool = inproc
    cap = worker.cfg.max_popups
    to = f"http://other.test:{other.port}/bomb"  # a path only the popups load
    frame = f"http://other.test:{other.port}/fixtures/popup_bomb.html"
    url = fixture_url(f"popup_bomb.html?to={quote(to, safe='')}&frame={quote(frame, safe='')}")

    def loaded() -> list[str]:
        return [path for _, path, _ in other.requests if path.startswith("/bomb")]

    before, peak = len(loaded()), 0
    baseline = chromium_processes(worker)

    async def sample() -> None:
        nonlocal peak
        while True:
            peak = max(peak, chromium_processes(worker))
            await asyncio.sleep(0.05)

    sampler = asyncio.ensure_future(sample())
    events: list[PageEvent] = []
    try:
        async with open_session(pool, url) as (s, obs, _f):
            slot = slot_of(worker, s)
            ctx = slot.context
            events += obs.events or []
            assert await js(s, "frameReady") == [True]
            for batch in range(10):  # 5 windows a step: under the storm's 10, so that the page stays and opens all
                await js(s, f"bomb({BOMB_WAYS[batch % len(BOMB_WAYS)]!r}, {5 * batch}, 5)")
                deadline, quiet = time.monotonic() + 15, False
                while not quiet and time.monotonic() < deadline:
                    seen = len(events)
                    t0 = time.monotonic()
                    obs = await act(s, BrowserAction("wait", seconds=0.2))
                    assert obs.settle == "quiet" and time.monotonic() - t0 < 5, obs  # nothing waits on a refused one
                    events += obs.events or []
                    quiet = len(events) == seen and len([e for e in events if e.kind == "popup"]) >= 5 * (batch + 1)
                assert quiet, (batch, events)
            assert (obs.url, obs.title) == (url, "popup bomb"), (obs, events)  # the episode goes on where it was
            assert await until(lambda: len(loaded()) - before >= min(cap, 50))
            await act(s, BrowserAction("wait", seconds=0.5))  # time for one more to load, if any were let through
            during = chromium_processes(worker)
        assert len(loaded()) - before <= cap, f"{len(loaded()) - before} of 50 popups loaded (max_popups={cap})"
        refused = [e for e in events if e.kind == "popup" and e.detail.startswith("refused")]
        assert len(refused) == 50 - cap, events
        assert {e.detail for e in refused} == {f"refused: past the episode's {cap} popups"}
        assert len([e for e in events if e.kind == "popup" and e.detail == "closed"]) == cap, events
        assert not [e for e in events if e.kind not in ("popup",)], events  # none dropped, no storm, no refusal
        assert not [e for e in events if "windows opened in one step" in e.detail], events
        # Its context is dropped: every process of the episode goes with it.
        assert await until(lambda: ctx not in worker.browser.contexts)  # type: ignore[union-attr]
        assert await until(lambda: chromium_processes(worker) <= baseline, 20), (baseline, chromium_processes(worker))
    finally:
        sampler.cancel()
    print(f"\npopup bomb: {len(loaded()) - before} of 50 loaded (max_popups={cap}); Chromium processes before "
          f"{baseline}, at most {peak} during, {during} at its end, {chromium_processes(worker)} after")
    # The next episode on this worker sees nothing of them.
    async with open_session(pool, fixture_url("click.html")) as (s2, obs, _f):
        assert len(slot_of(worker, s2).context.pages) == 1 and not obs.events, obs.events
        obs = await act(s2, BrowserAction("wait", seconds=0.3))
        assert not obs.events and len(loaded()) - before <= cap


@pytest.mark.parametrize(("page", "action"), ESCAPES,
                         ids=[p.removeprefix("popup_").removesuffix(".html") for p, _ in ESCAPES])
async def test_a_popup_past_the_cap_still_takes_the_tab_to_its_url(
        inproc: tuple[BrowserWorker, BrowserPool], fixture_url: Callable[[str], str], other: CountingServer,
        monkeypatch: pytest.MonkeyPatch, page: str, action: BrowserAction) -> None:
    """With max_popups 0 no popup loads, yet the agent's own click on a link to a new window still takes the episode's
    tab there: the URL is the window open's, not the popup's."""
    worker, pool = inproc
    monkeypatch.setattr(worker.cfg, "max_popups", 0)
    to = f"{other.base_url}/fixtures/popup_target.html?past={page}"
    async with open_session(pool, fixture_url(f"{page}?to={quote(to, safe='')}")) as (s, _obs, _f):
        obs = await act(s, action)
        assert obs.url == to and obs.title == "popup target", obs
        assert PageEvent("popup", to, "adopted") in (obs.events or [])
        obs = await act(s, BrowserAction("wait", seconds=0.3))
        assert len(slot_of(worker, s).context.pages) == 1
    path = to.removeprefix(other.base_url)
    assert [p for _, p, _ in other.requests].count(path) == 1  # the tab's load: the popup never asked


async def test_a_popup_guard_that_goes_away_has_its_browser_replaced(
        inproc: tuple[BrowserWorker, BrowserPool], fixture_url: Callable[[str], str], other: CountingServer) -> None:
    """Without its guard, every new window would wait for it: the worker drains and relaunches its browser (with a
    guard of its own), and popups are bounded there as before."""
    worker, pool = inproc
    guard, recycles = worker.popup_guard, worker.browser_recycles
    assert guard is not None
    crash = asyncio.ensure_future(guard._command("Page.crash", {}))  # the guard's renderer dies (no answer comes)
    try:
        assert await until(lambda: worker.browser_recycles == recycles + 1, 30)
    finally:
        crash.cancel()
        with contextlib.suppress(BaseException):
            await crash
    assert worker.popup_guard is not guard and not worker.draining
    to = f"http://other.test:{other.port}/after-recycle"
    n = worker.cfg.max_popups + 2
    async with open_session(pool, fixture_url(f"popup_onload.html?n={n}&to={quote(to, safe='')}")) as (s, obs, _f):
        events = list(obs.events or [])
        deadline = time.monotonic() + 10
        while len([e for e in events if e.kind == "popup"]) < n and time.monotonic() < deadline:
            events += (await act(s, BrowserAction("wait", seconds=0.2))).events or []
        cap = worker.cfg.max_popups
        assert sorted(e.detail for e in events if e.kind == "popup") == ["closed"] * cap + [refused_detail(cap)] * 2
        assert await until(lambda: len([p for _, p, _ in other.requests if p.startswith("/after-recycle")]) == cap)


async def test_a_popup_not_reported_yet_is_seen_in_the_browser(
        inproc: tuple[BrowserWorker, BrowserPool], fixture_url: Callable[[str], str], other: CountingServer,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Playwright reports a popup only once it has set it up, after the popup's first requests: an episode that
    ends in between would leave it to the next one. The browser's own list of targets already holds it, and the
    worker asks it before a context is reused."""
    worker, pool = inproc
    async with open_session(pool, fixture_url("click.html")) as (s0, _o, _f):
        assert not await worker.episodes[s0.episode_id].page.context_has_other_pages()
    reported: list[Any] = []
    monkeypatch.setattr(worker, "_on_page", lambda _slot, page: reported.append(page))  # the worker never hears
    to = f"http://other.test:{other.port}/fixtures/popup_target.html"
    async with open_session(pool, fixture_url(f"popup_onload.html?to={quote(to, safe='')}")) as (s1, _o, _f):
        slot = slot_of(worker, s1)
        ctx = slot.context
        assert await until(lambda: len(reported) == 1)
        assert await slot.page.context_has_other_pages() and slot.popups == 0
        slot.page.announced_popups = 0  # as for a popup a cross-site frame opened: its tab heard of no window
    await assert_dropped(worker, pool, ctx, f"http://other.test:{other.port}/fixtures/storage.html")


async def test_storage_of_a_cross_site_iframe_is_cleared(
        inproc: tuple[BrowserWorker, BrowserPool], fixture_url: Callable[[str], str], other: CountingServer) -> None:
    worker, pool = inproc
    src = f"http://other.test:{other.port}/fixtures/frame_storage.html"  # another site: a partitioned frame
    framed = fixture_url(f"frame_host.html?src={quote(src, safe='')}")
    async with open_session(pool, framed) as (s1, _o, _f):
        ctx = slot_of(worker, s1).context
        await act(s1, BrowserAction("wait", seconds=0.2))
        assert (await js(s1, "window.reports"))[0] == [EMPTY]  # the frame loaded, found nothing, wrote
    async with open_in_context(worker, pool, framed, ctx) as (s2, _o):
        await act(s2, BrowserAction("wait", seconds=0.2))
        assert (await js(s2, "window.reports"))[0] == [EMPTY]  # what the frame wrote last episode is gone


@pytest.mark.wallclock
async def test_a_download_is_refused_and_recorded(inproc: tuple[BrowserWorker, BrowserPool],
                                                  fixture_url: Callable[[str], str], other: CountingServer) -> None:
    _, pool = inproc
    to = f"{other.base_url}/download"
    async with open_session(pool, fixture_url(f"page_download.html?to={quote(to, safe='')}")) as (s, _o, _f):
        for selector, event in [("#go", PageEvent("download", "data:text/plain,private%20notes", "refused: notes.txt")),
                                ("#server", PageEvent("download", to, "refused: report.bin"))]:
            obs = await act(s, BrowserAction("click", selector=selector))
            assert event in (obs.events or []), obs.events
            # The page stays, and the step settles as usual (not at its deadline, waiting for a new document).
            assert obs.title == "download" and obs.settle == "quiet", obs
            assert obs.timings_ms["settle_ms"] < 3000


async def test_a_file_chooser_is_cancelled_and_recorded(inproc: tuple[BrowserWorker, BrowserPool],
                                                        fixture_url: Callable[[str], str]) -> None:
    _, pool = inproc
    async with open_session(pool, fixture_url("page_filechooser.html")) as (s, _o, _f):
        for n in (1, 2):  # a cancelled chooser does not block the next one
            obs = await act(s, BrowserAction("click", selector="#file"))
            assert [e.kind for e in obs.events or []] == ["filechooser"]
            assert obs.events[0].detail == "cancelled (selectSingle)"  # type: ignore[index]
            assert await js(s, "window.cancelled", "window.changed") == [n, 0]


async def test_a_dialog_is_dismissed_and_recorded(inproc: tuple[BrowserWorker, BrowserPool],
                                                  fixture_url: Callable[[str], str]) -> None:
    _, pool = inproc
    async with open_session(pool, fixture_url("page_dialog.html")) as (s, _o, _f):
        obs = await act(s, BrowserAction("click", selector="#go"))
        assert PageEvent("dialog", fixture_url("page_dialog.html"), "confirm: Delete everything?") in (obs.events or [])
        assert await js(s, "window.answer") == [False]


async def test_a_loop_of_dialogs_is_stopped_and_the_page_stays_usable(
        inproc: tuple[BrowserWorker, BrowserPool], fixture_url: Callable[[str], str]) -> None:
    # Answered one by one, the alerts never end and never let the page render: the screenshot waited out its
    # deadline and the episode's context was discarded (20 s, browser_hung).
    _, pool = inproc
    url = fixture_url("page_dialog_storm.html")
    async with open_session(pool, url) as (s, _o, _f):
        for _ in range(2):  # a second storm in the same episode is stopped as well
            obs = await act(s, BrowserAction("click", selector="#go"))
            assert obs.settle == "quiet"
            stopped = PageEvent("dialog", url, f"{DIALOG_STORM} dialogs in one operation: the page's running script "
                                               "was stopped")
            assert stopped in (obs.events or []) and (obs.events or [])[-1].kind == "dropped"  # the rest: counted
        assert (await js(s, "window.shown"))[0] >= 2 * DIALOG_STORM  # the page answers


@pytest.mark.parametrize("only", ["", "slice", "lower", "title", "settle", "concat", "then", "timers", "math"])
async def test_a_page_that_replaces_builtins_neither_stalls_steps_nor_makes_its_worker_look_broken(
        inproc: tuple[BrowserWorker, BrowserPool], fixture_url: Callable[[str], str], only: str) -> None:
    # The worker's scripts run in the page's own script context. Before, a page that replaced what they call made
    # every settle wait out its timeout (10 s a step), or made the worker send an observation of the wrong types
    # (a title of 42, an element's tag as an object), which the engine counts against the worker: five such
    # pages, and the worker was banned.
    _, pool = inproc
    url = fixture_url("page_tampered.html" + (f"?only={only}" if only else ""))
    session = await pool.lease(f"tampered-{only}")
    try:
        obs, frame = await session.open(url, som=True)
        frame.release()
        assert (obs.settle, obs.title) == ("quiet", "tampered")
        # The marks are the page's own business: listed, or (where it broke the pass) none, never malformed.
        elements = obs.elements or []
        listed = [] if only in ("", "lower", "math") else [[1, "button", "press"], [2, "a", "link"]]
        assert [e[:3] for e in elements] == listed, elements
        assert all(isinstance(v, int) for e in elements for v in e[3:]), elements
        obs = await act(session, BrowserAction("click", x=70, y=30))
        assert (obs.settle, obs.title) == ("quiet", "tampered")
        assert await js(session, "document.getElementById('out').textContent") == ["clicked"]
    finally:
        await session.close()
    assert not pool.offences and len(pool.workers) == 1


async def test_permission_prompts_are_denied_at_once(inproc: tuple[BrowserWorker, BrowserPool],
                                                     fixture_url: Callable[[str], str]) -> None:
    _, pool = inproc
    async with open_session(pool, fixture_url("click.html")) as (s, _o, _f):
        # Headless Chromium would leave this pending forever (no prompt to answer).
        assert await js(s, "Notification.requestPermission()", "Notification.permission") == ["denied", "denied"]
        geo = ("new Promise(r => navigator.geolocation.getCurrentPosition(() => r('granted'), e => r(e.code)))")
        assert await js(s, geo) == [1]  # PERMISSION_DENIED


async def test_a_page_that_closes_its_tab_is_reopened_at_its_url(inproc: tuple[BrowserWorker, BrowserPool],
                                                                 fixture_url: Callable[[str], str]) -> None:
    # A tab with one history entry may close itself; the episode carries on in a new tab, and says so.
    worker, pool = inproc
    url = fixture_url("page_close.html")
    async with open_session(pool, url) as (s, _o, _f):
        slot = slot_of(worker, s)
        first_tab = slot.page
        t0 = time.monotonic()
        obs = await act(s, BrowserAction("click", selector="#go"))
        assert time.monotonic() - t0 < 5  # no wait for a settle that a closed tab never gives
        assert PageEvent("closed", url, "the page closed its tab: reopened at its URL") in (obs.events or [])
        assert obs.url == url and obs.frame is not None
        assert slot.page is not first_tab and not slot.page.closed.is_set()
        assert await js(s, "window.loads", "history.length") == [1, 1]  # a new tab: its session storage is new
        # Closed between two operations (a timer): the next one finds the tab reopened.
        await js(s, "setTimeout(() => window.close(), 0), 1")
        assert await until(lambda: slot.page is not None and slot.page.closed.is_set())
        obs = await act(s, BrowserAction("scroll", direction="down"))
        assert [e.kind for e in obs.events or []] == ["closed"] and obs.url == url
    assert len(slot.context.pages) <= 1  # nothing of the episode is left open
    async with open_session(pool, fixture_url("click.html")) as (s, obs, _f):  # the worker carries on
        assert obs.title
