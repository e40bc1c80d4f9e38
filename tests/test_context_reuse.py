"""Episodes reuse a worker's BrowserContext (and tab) but never see each other's state.

The worker runs in this process here (against a pool that waits for hand-started workers), so the tests
can see which BrowserContext served each episode.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable

import psutil
import pytest
import pytest_asyncio

from browserpool.config import WorkerConfig
from browserpool.pool import BrowserPool, BrowserSession
from browserpool.protocol import BrowserAction
from browserpool.worker import BrowserWorker
from tests.conftest import inproc_pool, open_session

EMPTY = {"local": 0, "session": 0, "cookie": ""}


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def inproc(tmp_path_factory: pytest.TempPathFactory
                 ) -> AsyncIterator[tuple[BrowserWorker, BrowserPool]]:
    """(worker, pool): one BrowserWorker running in this event loop, serving a pool."""
    cfg = WorkerConfig(endpoint="", worker_id="inproc")
    async with inproc_pool(f"ipc://{tmp_path_factory.mktemp('ipc')}/pool.sock", cfg) as wp:
        yield wp


def context_of(worker: BrowserWorker, session: BrowserSession):
    return worker.episodes[session.episode_id].slot.context


async def seen_at_load(session: BrowserSession) -> dict:
    return (await session.evaluate(["window.seenAtLoad"]))[0]


async def test_storage_does_not_leak_into_the_next_episode(inproc, fixture_url) -> None:
    worker, pool = inproc
    async with open_session(pool, fixture_url("storage.html")) as (s1, obs, _f):
        assert obs.settle == "quiet"
        ctx = context_of(worker, s1)
        await s1.evaluate(["writeAll('first')"])
        # The writes took: a reload of the page sees them.
        await s1.act(BrowserAction("navigate", url=fixture_url("storage.html?again")))
        assert await seen_at_load(s1) == {"local": 1, "session": 1, "cookie": "k-first=cookie"}
    async with open_session(pool, fixture_url("storage.html")) as (s2, _, _f):
        assert context_of(worker, s2) is ctx  # the same context, cleared
        assert await seen_at_load(s2) == EMPTY
        got = await s2.evaluate(["localStorage.getItem('k-first')", "sessionStorage.getItem('k-first')"])
        assert got == [None, None]


async def test_storage_written_while_leaving_does_not_leak(inproc, fixture_url) -> None:
    worker, pool = inproc
    async with open_session(pool, fixture_url("storage.html#write-on-exit")) as (s1, _, _f):
        ctx = context_of(worker, s1)
    async with open_session(pool, fixture_url("storage.html")) as (s2, _, _f):
        assert context_of(worker, s2) is ctx
        assert await seen_at_load(s2) == EMPTY


async def test_a_close_waits_for_the_episodes_operation_in_flight(inproc, fixture_url) -> None:
    """The engine may give up on an operation (a deadline, an episode's wall-clock cap) and close the episode while
    the worker still runs it: the close waits for it instead of resetting the page under it, both are answered,
    and the context serves the next episode cleanly."""
    worker, pool = inproc
    session = await pool.lease("close-during-act")
    obs, frame = await session.open(fixture_url("storage.html"))
    frame.release()
    ctx = context_of(worker, session)
    t0 = time.monotonic()
    acting = asyncio.ensure_future(session.act(BrowserAction("wait", seconds=1.5)))
    await asyncio.sleep(0.2)  # the wait is under way in the worker
    await session.close()
    # The close waited for the wait to end, which began after t0: counted from t0, a late wake-up here cannot hide it.
    assert time.monotonic() - t0 >= 1.4
    obs, frame = await acting
    frame.release()
    assert obs.settle == "quiet"
    async with open_session(pool, fixture_url("storage.html")) as (s2, obs2, _f):
        assert context_of(worker, s2) is ctx and obs2.settle == "quiet"
        assert await seen_at_load(s2) == EMPTY


async def test_go_back_does_not_reach_the_previous_episode(inproc, fixture_url) -> None:
    worker, pool = inproc
    async with open_session(pool, fixture_url("nav_a.html")) as (s1, _, _f):
        ctx = context_of(worker, s1)
        obs, frame = await s1.act(BrowserAction("click", selector="#to-b"))
        frame.release()
        assert obs.title == "page B"
    async with open_session(pool, fixture_url("storage.html")) as (s2, _, _f):
        assert context_of(worker, s2) is ctx
        assert await s2.evaluate(["history.length"]) == [1]
        for _ in range(2):
            obs, frame = await s2.act(BrowserAction("go_back"))
            frame.release()
            assert obs.url == fixture_url("storage.html")
            assert obs.title == "storage"
        # Within the episode, going back works.
        obs, frame = await s2.act(BrowserAction("navigate", url=fixture_url("nav_b.html")))
        frame.release()
        obs, frame = await s2.act(BrowserAction("go_back"))
        frame.release()
        assert obs.title == "storage"
        obs, frame = await s2.act(BrowserAction("go_back"))
        frame.release()
        assert obs.title == "storage"


async def test_contexts_are_reused_and_recycled(inproc, fixture_url) -> None:
    worker, pool = inproc
    assert worker.browser is not None
    reuse = 3
    saved, worker.cfg.context_reuse = worker.cfg.context_reuse, reuse
    try:
        served = []
        for _ in range(3 * reuse + 1):
            async with open_session(pool, fixture_url("click.html")) as (s, obs, _f):
                assert obs.settle == "quiet"
                served.append(context_of(worker, s))
                assert worker.browser.contexts == [served[-1]]  # never a second one
        assert worker.browser.contexts == [slot.context for slot in worker.idle]
        assert len(worker.idle) <= 1
    finally:
        worker.cfg.context_reuse = saved
    # Runs of episodes on one context: at most `reuse` long, and full-length once the count restarts.
    runs = [1]
    for prev, cur in zip(served, served[1:], strict=False):
        if cur is prev:
            runs[-1] += 1
        else:
            runs.append(1)
    assert max(runs) == reuse
    assert runs[1:-1] == [reuse] * (len(runs) - 2)
    assert len(runs) <= 5  # 10 episodes, not 10 contexts
    assert len({id(c) for c in served}) == len(runs)  # a recycled context is never used again


@pytest.mark.wallclock
async def test_a_page_that_reached_too_many_origins_has_its_context_dropped_not_cleared_one_by_one(
        inproc, fixture_url) -> None:
    # Before, the tab was cleared origin by origin and partition by partition (origins x top-level sites), all at
    # once: a page that had reached 2,000 origins under 300 sites kept the worker's event loop (here this test's)
    # busy for 9 s, near the engine's 15 s heartbeat timeout.
    worker, pool = inproc
    stalls: list[float] = []

    async def watch_the_loop() -> None:
        while True:
            t0 = time.monotonic()
            await asyncio.sleep(0.02)
            stalls.append(time.monotonic() - t0)

    async with open_session(pool, fixture_url("storage.html")) as (s1, _, _f):
        ctx = context_of(worker, s1)
        await s1.evaluate(["writeAll('many')"])
        # What images from thousands of subdomains and redirects through many sites leave in the tab's account.
        page = worker.episodes[s1.episode_id].page
        page.origins.update(f"https://o{i}.example.net" for i in range(2000))
        page.top_sites.update(f"https://s{i}.example.org" for i in range(300))
        watcher = asyncio.ensure_future(watch_the_loop())
    try:
        async with open_session(pool, fixture_url("storage.html")) as (s2, _, _f):
            assert context_of(worker, s2) is not ctx  # dropped, with all its storage
            assert await seen_at_load(s2) == EMPTY
    finally:
        watcher.cancel()
    assert max(stalls) < 1.0, max(stalls)


def chromium_processes(pid: int) -> int:
    return len(psutil.Process(pid).children(recursive=True)) + 1


async def test_chromium_process_count_stays_bounded(pool, fixture_url: Callable[[str], str]) -> None:
    """Many open/close cycles on a spawned worker: no context, tab or renderer is left behind."""
    (handle,) = pool.alive_workers()
    assert handle.browser_pid > 0
    pages = ["click.html", "nav_a.html", "storage.html"]
    async with open_session(pool, fixture_url(pages[0])):
        pass
    baseline = chromium_processes(handle.browser_pid)
    counts = []
    for i in range(12):
        async with open_session(pool, fixture_url(pages[i % len(pages)])) as (s, _, _f):
            obs, frame = await s.act(BrowserAction("click", x=10, y=10))
            frame.release()
        counts.append(chromium_processes(handle.browser_pid))
    assert max(counts) <= baseline + 2, (baseline, counts)
