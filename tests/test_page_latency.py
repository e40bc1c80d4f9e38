"""The async_live benchmark's page server (bench/page_latency.py): the bundled sites with live-web page-load times.

A document a browser navigates to arrives after its URL's delay, the same every time; the rest of a page arrives
at once; documents are never cached, so that two runs that follow the same links wait the same time. Checked over
real HTTP and through the engine's own browser worker (real Chromium, behind its network policy).
"""

from __future__ import annotations

import statistics
import time
import urllib.request
from collections.abc import AsyncIterator, Iterator

import pytest
import pytest_asyncio

from bench.page_latency import LOAD_CAP_S, LOAD_MEDIAN_S, page_load_s
from browserpool.config import WorkerConfig
from browserpool.pool import BrowserPool
from browserpool.protocol import BrowserAction
from engine.sites.server import SiteServer
from tests.conftest import inproc_pool, open_session


@pytest.fixture(scope="module")
def live_sites() -> Iterator[str]:
    with SiteServer(module="bench.page_latency") as server:
        yield server.base_url


def quick_query(path: str, low: float = 0.3, high: float = 0.9) -> tuple[str, float]:
    """A query for ``path`` whose page-load time is between ``low`` and ``high`` seconds (a short test)."""
    for i in range(10_000):
        delay = page_load_s(path, f"visit={i}")
        if low <= delay <= high:
            return f"visit={i}", delay
    raise AssertionError("no such query")


def get(url: str, dest: str) -> tuple[float, str]:
    """GET ``url`` as a browser fetching a ``dest`` (Sec-Fetch-Dest): (seconds taken, Cache-Control)."""
    req = urllib.request.Request(url, headers={"Sec-Fetch-Dest": dest})
    t0 = time.monotonic()
    with urllib.request.urlopen(req, timeout=30) as resp:
        resp.read()
        return time.monotonic() - t0, resp.headers["Cache-Control"]


def test_a_page_load_is_a_function_of_the_url_with_a_median_and_a_cap() -> None:
    delays = [page_load_s("/shop/", f"q={i}") for i in range(4000)]
    assert delays == [page_load_s("/shop/", f"q={i}") for i in range(4000)]  # the same every time
    assert page_load_s("/shop/", "q=1") != page_load_s("/shop/", "q=2")  # the query counts
    assert abs(statistics.median(delays) - LOAD_MEDIAN_S) < 0.25 * LOAD_MEDIAN_S
    assert min(delays) > 0 and max(delays) == LOAD_CAP_S
    # log-normal with shape 0.8: about 11% of loads would take longer than 8 s; those are cut at the cap.
    assert 0.07 < sum(d == LOAD_CAP_S for d in delays) / len(delays) < 0.15


def test_documents_wait_their_delay_and_are_not_cached_the_rest_arrives_at_once(live_sites: str) -> None:
    query, delay = quick_query("/shop/index.html", low=0.5)
    url = f"{live_sites}/shop/index.html?{query}"
    for _ in range(2):  # the same delay the second time
        took, cache = get(url, "document")
        assert delay - 0.02 <= took < delay + 2.0 and cache == "no-store"
    took, cache = get(url, "script")  # what a page loads itself (a CDN's speed)
    assert took < delay - 0.2 and cache != "no-store"
    took, _ = get(url, "iframe")
    assert took < delay - 0.2


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def pool(live_sites: str, tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[BrowserPool]:
    # The server registered itself as an engine site before the worker starts: the worker's policy lets it through.
    cfg = WorkerConfig(endpoint="", worker_id="page-latency")
    async with inproc_pool(f"ipc://{tmp_path_factory.mktemp('ipc')}/pool.sock", cfg) as (_worker, p):
        yield p


@pytest.mark.asyncio(loop_scope="session")
async def test_the_engines_browser_waits_for_the_start_page_and_for_a_followed_link(live_sites: str,
                                                                                     pool: BrowserPool) -> None:
    query, delay = quick_query("/shop/index.html")
    t0 = time.monotonic()
    async with open_session(pool, f"{live_sites}/shop/index.html?{query}") as (session, obs, _frame):
        assert time.monotonic() - t0 >= delay - 0.02 and obs.url.endswith(query)
        # The links in view (a click scrolls no page), with their absolute URLs.
        (links,) = await session.evaluate(["[...document.querySelectorAll('a[href]')].map(a => "
                                           "[a.href, a.getBoundingClientRect().top < innerHeight])"])
        choices = [i for i, (u, seen) in enumerate(links) if seen and u.startswith(live_sites) and "#" not in u]
        pick = min(choices, key=lambda i: page_load_s(*_path_query(links[i][0], live_sites)))  # the shortest wait
        target = links[pick][0]
        wait = page_load_s(*_path_query(target, live_sites))
        await session.evaluate([f"document.querySelectorAll('a[href]')[{pick}].setAttribute('data-pick', '')"])
        t1 = time.monotonic()
        obs2, frame2 = await session.act(BrowserAction(kind="click", selector="a[data-pick]"))
        frame2.release()
        assert obs2.url == target and obs2.settle != "timeout"
        assert time.monotonic() - t1 >= wait - 0.02, (target, wait)


def _path_query(url: str, base: str) -> tuple[str, str]:
    path, _, query = url[len(base):].partition("?")
    return path, query
