"""Crashes mid-run: a worker or its Chromium killed with SIGKILL. No task may be lost."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from browserpool import protocol as P
from browserpool.config import WorkerConfig
from browserpool.pool_errors import WorkerLost
from engine.clients.runner import run
from engine.core.config import RunConfig
from engine.core.core import EngineCore
from engine.core.site_guard import SiteGuard
from engine.store.run_dir import read_records
from policy.instant import InstantPolicy
from tests.conftest import inproc_pool, open_session

pytestmark = pytest.mark.asyncio(loop_scope="session")
PAGES = ["/wiki/", "/shop/", "/forum/", "/travel/"]


def long_tasks(tmp_path: Path, n: int, steps: int) -> Path:
    path = tmp_path / "long.jsonl"
    path.write_text("".join(json.dumps({
        "task_id": f"long-{i}", "task_name": "click around", "website": "{SITES}" + PAGES[i % len(PAGES)],
        "difficulty": 1, "max_steps": steps,
        "evaluator_reference": [{"id": 1, "description": "d", "facts": ["still on the site"],
                                 "checks": [{"kind": "url", "contains": "127.0.0.1"}]}]}) + "\n"
        for i in range(n)))
    return path


async def run_and_kill(tmp_path: Path, sites: str, target: str, retry_lost: int) -> tuple[list[dict], EngineCore]:
    """Run 6 long episodes on 2 workers; SIGKILL one worker (or its browser) once 12 steps are done."""
    cfg = RunConfig(tasks=str(long_tasks(tmp_path, 6, 25)), output_dir=str(tmp_path / "runs"), concurrency=6,
                    workers=2, retry_lost=retry_lost)
    engines: list[EngineCore] = []
    killed: list[int] = []
    replaced: list[bool] = []

    async def killer(engine: EngineCore) -> None:
        while engine.stats.steps < 12:
            await asyncio.sleep(0.05)
        victim = engine.pool.workers["w0"]
        pid = victim.pid if target == "worker" else victim.browser_pid
        assert pid > 0
        os.kill(pid, signal.SIGKILL)
        killed.append(pid)
        await asyncio.sleep(0.5)
        await engine.pool.wait_for_workers(2, 60)  # the replacement joins while the run goes on
        replaced.append(True)

    def on_start(engine: EngineCore, _run_dir: Path) -> None:
        engines.append(engine)
        asyncio.ensure_future(killer(engine))

    stats, run_dir = await asyncio.wait_for(
        run(cfg, InstantPolicy(1275, 384), sites, on_start=on_start), 180)
    assert killed, "the kill never happened"
    assert replaced, "no replacement worker joined during the run"
    assert stats.summary()["lost"] == 0
    return read_records(run_dir), engines[0]


@pytest.mark.parametrize("target", ["worker", "browser"])
async def test_killed_episodes_end_with_an_error_record(tmp_path: Path, sites: str, target: str) -> None:
    records, engine = await run_and_kill(tmp_path, sites, target, retry_lost=0)
    assert len(records) == 6
    errors = [r for r in records if r["status"] == "error"]
    assert errors, "the episodes on the killed worker should have failed"
    for r in errors:
        assert r["error"]["kind"] == "worker_lost" and "died" in r["error"]["message"]
        assert r["worker"] == "w0"
    # Episodes on the other worker finished normally.
    assert all(r["status"] == "success" and len(r["steps"]) == 25 for r in records if r["worker"] != "w0")
    assert engine.pool.restarts == 1


async def test_killed_episodes_are_retried_once(tmp_path: Path, sites: str) -> None:
    records, engine = await run_and_kill(tmp_path, sites, "worker", retry_lost=1)
    assert len(records) == 6 and {r["status"] for r in records} == {"success"}
    retried = [r for r in records if r["attempts"] == 2]
    assert retried and all(r["previous_errors"][0]["kind"] == "worker_lost" for r in retried)
    assert all(len(r["steps"]) == 25 for r in records)
    # No shared-memory segment of the dead worker is left behind.
    dead = [h for h in engine.pool.workers.values() if not h.alive]
    assert dead and all(not Path("/dev/shm", h.shm_name or "x").exists() for h in dead)


async def test_a_worker_that_cannot_start_fails_fast(tmp_path: Path) -> None:
    from browserpool.config import WorkerConfig
    from browserpool.pool import BrowserPool, PoolConfig, PoolError

    missing = tmp_path / "no-such-chromium"
    pool = BrowserPool(PoolConfig(workers=1, worker=WorkerConfig(endpoint="", chromium_path=str(missing)),
                                  start_timeout_s=120))
    t0 = asyncio.get_running_loop().time()
    with pytest.raises(PoolError, match="cannot start"):
        await pool.start()
    assert asyncio.get_running_loop().time() - t0 < 60  # gave up after a few tries, not at the timeout


async def test_a_worker_whose_log_cannot_be_written_goes_on_serving(
        tmp_path: Path, fixture_url: Callable[[str], str], monkeypatch: pytest.MonkeyPatch) -> None:
    # The workers' stderr is the run's workers.log. Before, on a full disk, a line a worker logged raised ENOSPC
    # into the operation that logged it: here, every context over its heap cap of 1 MiB, which the episode's close
    # discards, was left open instead (a browser context leaked per episode).
    full = open("/dev/full", "w")  # noqa: SIM115 - every write fails with ENOSPC, as on a full disk
    monkeypatch.setattr(sys, "stderr", full)
    cfg = WorkerConfig(endpoint="", worker_id="inproc", context_memory_mib=1)
    try:
        async with inproc_pool(f"ipc://{tmp_path}/pool.sock", cfg) as (worker, pool):
            for _ in range(3):
                async with open_session(pool, fixture_url("click.html")) as (session, obs, _frame):
                    assert obs.title == "click"
                    reply, frame = await session.act(P.BrowserAction("click", x=150, y=120))
                    frame.release()
                    assert reply.settled
            assert worker.contexts_over_memory == 3 and worker.browser is not None
            assert worker.browser.contexts == [] and worker.idle == []  # all three discarded
    finally:
        monkeypatch.undo()
        with contextlib.suppress(OSError):
            full.close()


@pytest.mark.parametrize("mode", ["async", "sync"])
async def test_a_fault_of_the_engines_own_ends_its_episode_with_a_record_and_the_runner_goes_on(
        tmp_path: Path, sites: str, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture,
        mode: str) -> None:
    # A stand-in for a bug in the scheduler: the check that comes before an episode raises, once. Before, the
    # runner that met it died with it; with one runner the run then waited forever for the records.
    checks = 0
    check = SiteGuard.skipped_as_blocked

    async def faulty(self: SiteGuard, rollout: Any) -> bool:
        nonlocal checks
        checks += 1
        if checks == 2:
            raise RuntimeError("a bug of the engine's own")
        return await check(self, rollout)

    monkeypatch.setattr(SiteGuard, "skipped_as_blocked", faulty)
    cfg = RunConfig(tasks=str(long_tasks(tmp_path, 4, 2)), output_dir=str(tmp_path / "runs"), concurrency=1,
                    workers=1, telemetry=None, mode=mode)
    stats, run_dir = await asyncio.wait_for(run(cfg, InstantPolicy(), sites), 120)
    records = read_records(run_dir)
    assert len(records) == 4 and stats.summary()["lost"] == 0
    [internal] = [r for r in records if r["status"] == "error"]
    assert internal["error"]["kind"] == "internal" and "a bug of the engine's own" in internal["error"]["message"]
    assert any("an error of the engine's own" in r.getMessage() for r in caplog.records)


async def test_a_record_hook_that_raises_stops_no_runner(tmp_path: Path, sites: str,
                                                          caplog: pytest.LogCaptureFixture) -> None:
    # A trainer's own hook (EngineCore.on_record) with a bug. Before, it raised in the runner that delivered the
    # record, which died; with one runner the run then waited forever.
    seen: list[str] = []

    def buggy(_rollout: Any, record: dict[str, Any]) -> None:
        raise KeyError("a field the hook expected")

    def on_start(core: EngineCore, _run_dir: Path) -> None:
        core.on_record(buggy)
        core.on_record(lambda _r, record: seen.append(record["episode_id"]))  # later hooks still get every record

    cfg = RunConfig(tasks=str(long_tasks(tmp_path, 3, 2)), output_dir=str(tmp_path / "runs"), concurrency=1,
                    workers=1, telemetry=None)
    _, run_dir = await asyncio.wait_for(run(cfg, InstantPolicy(), sites, on_start=on_start), 120)
    assert len(read_records(run_dir)) == 3 and len(seen) == 3
    assert sum("a record hook failed" in r.getMessage() for r in caplog.records) == 3


async def test_a_capture_chromium_refuses_is_tried_again_and_one_it_always_refuses_ends_as_browser_capture(
        tmp_path: Path, sites: str, monkeypatch: pytest.MonkeyPatch) -> None:
    # Chromium sometimes refuses a capture of a page that is fine ("Unable to capture screenshot", seen under load
    # in the 64-environment test). Here the worker's CDP calls are patched to refuse chosen captures of a real
    # Chromium: refused as many times as the worker retries, the step goes on; refused on every try, the episode
    # ends as browser_capture and the worker serves the next one.
    from playwright.async_api import CDPSession
    from playwright.async_api import Error as PlaywrightError

    real_send = CDPSession.send
    captures = 0
    refused: Callable[[int], bool] = lambda n: False  # noqa: E731 - replaced per run below

    async def send(self: CDPSession, method: str, params: dict[str, Any] | None = None) -> Any:
        nonlocal captures
        if method == "Page.captureScreenshot":
            captures += 1
            if refused(captures):
                raise PlaywrightError("Protocol error (Page.captureScreenshot): Unable to capture screenshot")
        return await real_send(self, method, params)

    monkeypatch.setattr(CDPSession, "send", send)
    worker_cfg = WorkerConfig(endpoint="", worker_id="inproc")
    retries = worker_cfg.capture_retries
    assert retries >= 2  # more than the one retry there used to be
    async with inproc_pool(f"ipc://{tmp_path}/pool.sock", worker_cfg) as (worker, pool):
        def one_episode(name: str) -> RunConfig:
            return RunConfig(tasks=str(long_tasks(tmp_path, 1, 3)), output_dir=str(tmp_path / name),
                             concurrency=1, workers=1, telemetry=None, step_caps=(3, 3, 3))

        # The second capture (the first step's) refused on every try.
        captures, refused = 0, lambda n: n >= 2
        _, run_dir = await asyncio.wait_for(run(one_episode("always"), InstantPolicy(), sites, pool=pool), 120)
        [record] = read_records(run_dir)
        assert record["status"] == "error" and record["error"]["kind"] == "browser_capture", record["error"]
        assert f"refused the capture {retries + 1} times" in record["error"]["message"]
        assert captures == 1 + retries + 1  # the open's capture, then every try of the step's
        # Refused as many times as the worker tries again: the episode is whole.
        captures, refused = 0, lambda n: 2 <= n <= 1 + retries
        _, run_dir = await asyncio.wait_for(run(one_episode("flaky"), InstantPolicy(), sites, pool=pool), 120)
        [record] = read_records(run_dir)
        assert record["status"] != "error" and len(record["steps"]) == 3, record.get("error")
        assert captures == 1 + retries + 1 + 2  # the open's, the first step's tries, the two other steps'
        assert pool.restarts == 0 and worker.browser is not None  # one worker and browser served both


async def test_an_episode_waits_a_bounded_time_for_a_worker_when_none_is_alive(
        tmp_path: Path, fixture_url: Callable[[str], str]) -> None:
    # A pool of hand-started workers (here one, in this event loop) whose only worker lost its browser: nothing
    # spawns a new one. An episode that asks for a browser then waits for one to join at most start_timeout_s, and
    # ends with WorkerLost (a recorded error); before, it waited forever and the run never ended.
    async with inproc_pool(f"ipc://{tmp_path}/pool.sock", WorkerConfig(endpoint="", worker_id="alone")) as (
            worker, pool):
        async with open_session(pool, fixture_url("click.html")):
            pass  # the worker served an episode
        os.kill(worker._chromium_pid, signal.SIGKILL)
        pool.cfg.heartbeat_timeout_s = 2.0  # a hand-started worker is known gone when its heartbeats stop
        async with asyncio.timeout(30):
            while pool.alive_workers():
                await asyncio.sleep(0.05)
        assert worker.browser_lost
        pool.cfg.start_timeout_s = 1.0
        async with asyncio.timeout(30):
            with pytest.raises(WorkerLost, match="no browser worker was alive for 1 s"):
                await pool.lease("waits-for-a-worker")
