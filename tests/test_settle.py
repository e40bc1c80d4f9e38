"""Settle detection: a step is observed once the page has finished reacting, and never waits past its caps.

Timing bounds are generous (a loaded 2-core machine); what they check is the order of magnitude: a
capped wait ends near its cap, not at the next larger one.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator

import numpy as np
import pytest
import pytest_asyncio

from browserpool.config import WorkerConfig
from browserpool.pool import BrowserOpError, BrowserPool, BrowserSession, PoolConfig
from browserpool.protocol import BrowserAction, Observation
from engine._imgcodec import decode
from tests.conftest import open_session, started_pool

SETTLE_TIMEOUT_S = 3.0
SCREENSHOT_TIMEOUT_S = 3.0
IDLE_CAP_S = WorkerConfig(endpoint="").idle_cap_ms / 1000
MARGIN_S = 2.5
BLUE = (0, 0, 255)

pytestmark = pytest.mark.wallclock  # every test here times a wait


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def short_pool() -> AsyncIterator[BrowserPool]:
    """A one-worker pool with short caps, for the pages that never settle."""
    cfg = PoolConfig(workers=1, worker=WorkerConfig(endpoint="", settle_timeout_s=SETTLE_TIMEOUT_S,
                                                    screenshot_timeout_s=SCREENSHOT_TIMEOUT_S))
    async with started_pool(cfg) as p:
        yield p


async def act(session: BrowserSession, action: BrowserAction) -> tuple[Observation, np.ndarray, float]:
    """One step: (observation, the frame's pixels, seconds it took)."""
    t0 = time.monotonic()
    obs, frame = await session.act(action)
    elapsed = time.monotonic() - t0
    with frame:
        img = decode(frame.view)
    return obs, img, elapsed


def is_blue(img: np.ndarray) -> bool:
    """The fixture's #box (left 0..400, top 200..400) is painted blue once the page has finished."""
    return bool(np.all(np.abs(img[300, 200].astype(int) - np.array(BLUE)) <= 40))


async def text(session: BrowserSession, selector: str) -> str:
    return (await session.evaluate([f"document.querySelector({selector!r}).textContent"]))[0]


async def test_a_fetch_is_waited_for(open_page) -> None:
    async with open_page("settle_fetch.html") as (session, obs, frame):
        assert obs.settle == "quiet"
        assert not is_blue(decode(frame.view))
        obs, img, elapsed = await act(session, BrowserAction("click", x=120, y=50))
        # The observation was taken after the fetch (600 ms) answered and the page updated.
        assert obs.settle == "quiet" and obs.settled
        assert is_blue(img)
        assert elapsed >= 0.55
        assert await text(session, "#out") == "loaded"


async def test_dom_mutations_are_waited_for(open_page) -> None:
    async with open_page("settle_mutate.html") as (session, _, _f):
        obs, img, elapsed = await act(session, BrowserAction("click", x=120, y=50))
        assert obs.settle == "quiet"
        assert is_blue(img)  # painted only after ~300 ms of mutations every 10 ms
        assert elapsed >= 0.28
        assert (await text(session, "#out")).startswith("done after ")


async def test_a_page_that_never_stops_mutating_is_busy(open_page) -> None:
    t0 = time.monotonic()
    async with open_page("busy.html") as (session, obs, _f):
        elapsed = time.monotonic() - t0
        assert obs.settle == "busy"
        assert obs.settled is False
        assert IDLE_CAP_S * 0.9 <= elapsed < IDLE_CAP_S + MARGIN_S
        # A wait asks for 0.25 s of quiet, which never comes: it ends "busy" after that plus the idle cap.
        obs, _, elapsed = await act(session, BrowserAction("wait", seconds=0.25))
        assert obs.settle == "busy"
        assert IDLE_CAP_S * 0.9 <= elapsed < 0.25 + IDLE_CAP_S + MARGIN_S
        ticks = int(await text(session, "#tick"))
        assert ticks > 50  # the page did keep mutating all along


async def test_a_slow_link_is_observed_on_the_new_page(open_page) -> None:
    async with open_page("slow_link.html") as (session, _, _f):
        obs, _, elapsed = await act(session, BrowserAction("click", selector="#slow"))
        assert obs.settle == "quiet"
        assert obs.url.endswith("/_test/slow?ms=800")
        assert obs.title == "slow"
        assert elapsed >= 0.75
        assert await text(session, "#delay") == "Answered after 800 ms."


async def test_a_hanging_navigation_ends_at_the_settle_timeout(short_pool, fixture_url, site_server) -> None:
    async with open_session(short_pool, fixture_url("click.html")) as (session, _, _f):
        obs, img, elapsed = await act(session, BrowserAction("navigate", url=f"{site_server}/_test/hang"))
        assert obs.settle == "timeout"
        assert obs.settled is False
        assert img.shape == (768, 1280, 3)
        assert SETTLE_TIMEOUT_S * 0.9 <= elapsed < SETTLE_TIMEOUT_S + MARGIN_S
        # The hanging load was stopped: the episode goes on.
        obs, _, _ = await act(session, BrowserAction("navigate", url=fixture_url("nav_b.html")))
        assert (obs.settle, obs.title) == ("quiet", "page B")
    # And the worker serves new episodes.
    async with open_session(short_pool, fixture_url("click.html")) as (session, obs, _f):
        assert obs.settle == "quiet"
        await act(session, BrowserAction("click", selector="#btn"))
        assert await text(session, "#out") == "clicked 1"


async def test_a_script_in_an_endless_loop_fails_as_hung(short_pool, fixture_url) -> None:
    async with open_session(short_pool, fixture_url("hang_script.html")) as (session, obs, _f):
        assert obs.settle == "quiet"
        t0 = time.monotonic()
        try:
            await session.act(BrowserAction("click", selector="#freeze"))
        except BrowserOpError as exc:
            err = exc
        else:
            raise AssertionError("a page stuck in `while (true) {}` was observed")
        elapsed = time.monotonic() - t0
        assert err.kind == "hung"
        # Caps: the action+settle timeout, stopping the load, the screenshot timeout.
        assert elapsed < SETTLE_TIMEOUT_S + 2 + SCREENSHOT_TIMEOUT_S + MARGIN_S
        # The hung episode's page is gone from the worker...
        try:
            await session.evaluate(["1"])
        except BrowserOpError as exc:
            assert exc.kind == "no_episode"
        else:
            raise AssertionError("the hung page is still served")
    # ...and the worker goes on serving other episodes.
    async with open_session(short_pool, fixture_url("click.html")) as (session, obs, _f):
        assert obs.settle == "quiet"
        obs, _, _ = await act(session, BrowserAction("click", selector="#btn"))
        assert obs.settle == "quiet"
        assert await text(session, "#out") == "clicked 1"
