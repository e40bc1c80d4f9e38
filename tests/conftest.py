"""Shared fixtures: the fixture-page web server, a browser pool, uvloop, and a helper that opens a
session on a page and closes it afterwards.

Every async test and async fixture runs on one session-wide event loop (see ``pyproject.toml``),
which is a uvloop loop, as in the engine.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import dataclasses
import itertools
import json
import subprocess
import time
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import msgspec
import pytest
import pytest_asyncio
import uvloop
from playwright.async_api import Page, async_playwright

from browserpool.config import CHROMIUM_FLAGS, DEFAULT_CHROMIUM, WorkerConfig
from browserpool.pool import BrowserPool, BrowserSession, Frame, PoolConfig
from browserpool.protocol import Observation
from browserpool.worker import BrowserWorker
from engine.core.builders import pool_config
from engine.core.config import RunConfig
from engine.sites.server import SiteServer
from engine.tasks.schema import BUNDLED_TASKS
from tests.openweb import OpenWeb

# A test past its timeout says where it hung, also in an xdist worker.
pytest_plugins = ("tests.timeout_dump",)

FIXTURES_DIR = Path(__file__).resolve().parent / "fixtures"

_episode_ids = itertools.count(1)


# The suite's stored timing (python -m bench.test_time): every test file's time, slowest first.
_TEST_TIME = Path(__file__).resolve().parent.parent / "docs" / "benchmarks" / "test_time.json"


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Order the files for ``make test``'s processes (``--dist loadfile --no-loadscope-reorder``, each file whole in
    one process): the longest first, by the stored timing, so that no long file starts last and runs on alone while
    the other process sits idle; then the files the timing does not know yet (new ones), the most tests first."""
    try:
        stored = {f["file"]: float(f["seconds"]) for f in json.loads(_TEST_TIME.read_text())["files"]}
    except (OSError, ValueError, KeyError, TypeError):
        stored = {}
    counts = collections.Counter(item.location[0] for item in items)
    items.sort(key=lambda item: (item.location[0] not in stored,
                                 -stored.get(item.location[0], counts[item.location[0]]), item.location[0]))


def pytest_asyncio_loop_factories(config: pytest.Config, item: pytest.Item) -> dict[str, Callable[[], Any]]:
    """Run async tests and fixtures on uvloop (pytest-asyncio >= 1.x; replaces the deprecated
    ``event_loop_policy`` fixture override). One factory, so test ids stay unchanged."""
    return {"uvloop": uvloop.new_event_loop}


# autouse: started before any pool, so that the workers every test starts count it among the engine's own sites
# (exempt from the network policy: browserpool.netpolicy.register_engine_site).
@pytest.fixture(scope="session", autouse=True)
def site_server() -> Iterator[str]:
    """Base URL (``http://127.0.0.1:PORT``) of a SiteServer that serves the bundled sites, tests/fixtures under
    /fixtures, and the tests' own endpoints (``tests/site_endpoints.py``: slow, hanging and echo pages)."""
    with SiteServer(mounts={"/fixtures": FIXTURES_DIR}, module="tests.site_endpoints") as server:
        yield server.base_url


@pytest.fixture(scope="session")
def sites(site_server: str) -> str:
    """Base URL of the bundled sites: the tests' site server serves them at /."""
    return site_server


@pytest.fixture(scope="session")
def fixture_url(site_server: str) -> Callable[[str], str]:
    """``fixture_url("click.html")`` -> the page's full URL on the site server."""
    def url(name: str) -> str:
        return f"{site_server}/fixtures/{name}"
    return url


def _require_chromium(cfg: PoolConfig) -> None:
    if not Path(cfg.worker.chromium_path).exists():
        pytest.fail(f"Chromium not found at {cfg.worker.chromium_path} (make test installs it)")


@contextlib.asynccontextmanager
async def started_pool(cfg: PoolConfig) -> AsyncIterator[BrowserPool]:
    """A started BrowserPool, closed on exit (fails the test when Chromium is missing)."""
    _require_chromium(cfg)
    pool = BrowserPool(cfg)
    await pool.start()
    try:
        yield pool
    finally:
        await pool.close()


@pytest.fixture(scope="module")
def openweb() -> Iterator[OpenWeb]:
    """The local open web (tests/openweb.py), its pages answered at once; a module that wants them slow (episodes
    that overlap in time) defines its own."""
    with OpenWeb(delay_s=0.0) as web:
        yield web


@contextlib.asynccontextmanager
async def openweb_pool(web: OpenWeb) -> AsyncIterator[BrowserPool]:
    """One browser worker whose pages reach the local open web (tests/openweb.py), HTTPS on its trusted port
    included."""
    cfg = PoolConfig(workers=1)
    cfg.worker.net = web.net
    cfg.worker.chromium_flags = [*CHROMIUM_FLAGS, f"--ignore-certificate-errors-spki-list={web.trusted_spki}"]
    async with started_pool(cfg) as p:
        yield p


@contextlib.asynccontextmanager
async def inproc_pool(endpoint: str, cfg: WorkerConfig) -> AsyncIterator[tuple[BrowserWorker, BrowserPool]]:
    """(worker, pool): a BrowserWorker with ``cfg`` running in this event loop (so that a test can see its
    contexts, proxies and counters), serving a pool that waits for it on ``endpoint``."""
    if not Path(cfg.chromium_path).exists():
        pytest.fail(f"Chromium not found at {cfg.chromium_path} (make test installs it)")
    cfg.endpoint = endpoint
    worker = BrowserWorker(cfg)
    task = asyncio.create_task(worker.run())
    # The pool's worker configuration is the worker's own: the engine's network policy, which the worker takes
    # from the pool when it joins, is then the one the test configured.
    pool = BrowserPool(PoolConfig(workers=1, spawn=False, listen=endpoint, start_timeout_s=60, worker=cfg))
    try:
        await pool.start()
        yield worker, pool
    finally:
        await pool.close()  # tells the worker to shut down, but does not wait for a hand-started one
        try:
            await asyncio.wait_for(asyncio.shield(task), 20)
        except TimeoutError:
            worker._stop.set()
            await task


class SharedPools:
    """Started browser pools, one per worker configuration (how many workers, and their :class:`WorkerConfig`),
    each shared by the tests of a session that run with that configuration: a pool's start (a worker process, its
    Chromium) is paid once, not per test. A test that kills, bans, patches or reconfigures its workers, or that
    counts what its pool did (restarts, memory, contexts), starts its own."""

    def __init__(self) -> None:
        self._pools: dict[str, BrowserPool] = {}
        self._lock = asyncio.Lock()

    async def for_run(self, cfg: RunConfig) -> BrowserPool:
        """The shared pool for a run of ``cfg`` (``run(cfg, ..., pool=...)``, ``EngineCore(cfg, pool=...)``): its
        workers and worker settings; room for 32 rollouts at once."""
        key = f"{cfg.workers}/{msgspec.json.encode(cfg.worker).decode()}"
        async with self._lock:
            if key not in self._pools:
                pool_cfg = pool_config(dataclasses.replace(cfg, concurrency=32, listen=None, spawn_workers=True),
                                       None)
                _require_chromium(pool_cfg)
                pool = BrowserPool(pool_cfg)
                await pool.start()
                self._pools[key] = pool
            return self._pools[key]

    async def close(self) -> None:
        for pool in self._pools.values():
            await pool.close()
        self._pools.clear()


@pytest_asyncio.fixture(scope="session", loop_scope="session")
async def pools() -> AsyncIterator[SharedPools]:
    """The session's :class:`SharedPools`."""
    shared = SharedPools()
    try:
        yield shared
    finally:
        await shared.close()


@pytest_asyncio.fixture(scope="session", loop_scope="session")
async def pool(pools: SharedPools) -> BrowserPool:
    """One browser worker with default settings, shared by the whole test session (the pool of a run with the
    default worker settings on one worker)."""
    return await pools.for_run(RunConfig(workers=1))


@contextlib.asynccontextmanager
async def open_session(pool: BrowserPool, url: str, **open_args: Any
                       ) -> AsyncIterator[tuple[BrowserSession, Observation, Frame]]:
    """Lease a session on ``pool``, open ``url`` (with ``open_args``: ``axtree=True``...) and yield (session, first
    observation, its frame); the frame is released and the session closed on exit."""
    session = await pool.lease(f"test-ep-{next(_episode_ids)}")
    try:
        obs, frame = await session.open(url, **open_args)
        with frame:
            yield session, obs, frame
    finally:
        await session.close()


@contextlib.asynccontextmanager
async def viewer_episode(index: Path, episode: int = 0) -> AsyncIterator[Page]:
    """The viewer's page of one episode (``index``: the report's index.html), loaded in a Chromium of its own."""
    async with async_playwright() as p:
        browser = await p.chromium.launch(executable_path=DEFAULT_CHROMIUM, args=CHROMIUM_FLAGS)
        try:
            page = await browser.new_page()
            await page.goto(index.with_name("episode.html").as_uri() + f"#{episode}")
            await page.wait_for_selector(f"body[data-loaded='{episode}']")
            yield page
        finally:
            await browser.close()


@pytest.fixture
def open_page(pool: BrowserPool, fixture_url: Callable[[str], str]) -> Callable[..., Any]:
    """``async with open_page("click.html") as (session, obs, frame): ...``.

    The argument is a fixture file name or a full URL; ``pool=`` picks another pool than the shared one.
    """
    def opener(page: str, *, pool: BrowserPool = pool) -> contextlib.AbstractAsyncContextManager[
            tuple[BrowserSession, Observation, Frame]]:
        url = page if "://" in page or page.startswith("about:") else fixture_url(page)
        return open_session(pool, url)
    return opener


def fastest(call: Callable[[], Any], repeats: int = 3) -> tuple[float, Any]:
    """The least time (s) ``call`` took over ``repeats`` calls, and its result: a bound on a shared machine's noisy
    clock (behaviour with a generous limit, not a benchmark)."""
    best, result = float("inf"), None
    for _ in range(repeats):
        t0 = time.perf_counter()
        result = call()
        best = min(best, time.perf_counter() - t0)
    return best, result


async def until(cond: Callable[[], bool], timeout_s: float = 10.0) -> bool:
    """Poll ``cond`` (a test-side check, off the engine's paths) until true or the timeout.

    A test waits for what it is about to check, not for a fixed time: on a loaded machine a fixed sleep is too short.
    """
    deadline = time.monotonic() + timeout_s
    while not cond():
        if time.monotonic() > deadline:
            return False
        await asyncio.sleep(0.02)
    return True


@dataclasses.dataclass
class SmallDisk:
    """A file system of its own (tmpfs) that fills up: writes past its size fail with ENOSPC, as on a full disk."""

    path: Path

    def resize(self, size: str) -> None:
        """Make room (``"64m"``) or take it away; what is on it stays."""
        subprocess.run(["mount", "-o", f"remount,size={size}", str(self.path)], check=True, capture_output=True)

    def fill(self) -> None:
        """Take all the room that is left (a file of what fits)."""
        with open(self.path / "filler", "ab") as f, contextlib.suppress(OSError):
            while True:
                f.write(b"\0" * 65536)
                f.flush()


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[SmallDisk]:
    """A 1 MiB tmpfs at ``tmp_path/disk`` (mounting needs root, which the test machines have; skipped elsewhere)."""
    path = tmp_path / "disk"
    path.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(path)], capture_output=True)
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.decode(errors='replace').strip()}")
    try:
        yield SmallDisk(path)
    finally:
        subprocess.run(["umount", "-l", str(path)], capture_output=True)


def subset(tmp_path: Path, per_site: int = 2, max_len: int = 6) -> Path:
    """The first ``per_site`` bundled tasks of each site with at most ``max_len`` solution steps, as a task file."""
    by_site: dict[str, list[dict]] = {}
    for line in BUNDLED_TASKS.read_text().splitlines():
        rec = json.loads(line)
        site = rec["website"].split("/")[1]
        if len(rec["reference_solution"]) <= max_len:
            by_site.setdefault(site, []).append(rec)
    chosen = [r for recs in by_site.values() for r in recs[:per_site]]
    path = tmp_path / "subset.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in chosen) + "\n")
    return path


@pytest_asyncio.fixture(scope="session", loop_scope="session")
async def engine_run(tmp_path_factory: pytest.TempPathFactory, site_server: str, pool: BrowserPool) -> Path:
    """One run written by the engine for the tests that read runs (records, the viewer): the :func:`subset`'s tasks
    (two per site) solved by the scripted policy (successes), then the same run resumed with the random policy for
    three more episodes (failures, scrolls, typing). Shared: copy it (``shutil.copytree``) before changing it."""
    from engine.clients.runner import run
    from policy.registry import make_policy

    tmp = tmp_path_factory.mktemp("engine-run")
    tasks = subset(tmp, per_site=2, max_len=8)
    n = len(tasks.read_text().splitlines())
    cfg: dict[str, Any] = dict(tasks=str(tasks), output_dir=str(tmp / "runs"), concurrency=4, workers=1,
                               telemetry=None)
    _, run_dir = await run(RunConfig(**cfg), make_policy("scripted"), site_server, pool=pool)
    await run(RunConfig(**cfg, run_dir=str(run_dir), episodes=n + 3, seed=5), make_policy("random", seed=5),
              site_server, pool=pool)
    return Path(run_dir)
