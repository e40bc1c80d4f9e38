"""The library API: a long-lived engine that takes submissions and hands back trajectories as they finish."""

from __future__ import annotations

import asyncio
import dataclasses
from pathlib import Path

import pytest

from browserpool.pool import BrowserPool
from engine.agent.actions import AgentAction
from engine.agent.policy_api import Policy, PolicyReply, PolicyRequest
from engine.clients.runner import run
from engine.clients.service import RolloutService
from engine.core.config import RunConfig
from engine.store.run_dir import StoreFailed, read_records
from engine.tasks.loading import load_tasks
from policy.registry import make_policy
from tests.conftest import SmallDisk, subset, until
from tui.feed import SocketFeed
from tui.model import MonitorModel

pytestmark = pytest.mark.asyncio(loop_scope="session")


async def test_submissions_stream_back_as_they_finish(tmp_path: Path, site_server: str, pool: BrowserPool) -> None:
    cfg = RunConfig(output_dir=str(tmp_path / "runs"), concurrency=4, workers=1, telemetry=None)
    async with RolloutService(cfg, base_url=site_server, pool=pool) as service:
        assert service.base_url is not None
        tasks = load_tasks(subset(tmp_path, per_site=1), service.base_url)
        first = service.submit(tasks[:2], make_policy("scripted"), samples=2, policy_version=1)
        seen: list[dict] = []
        async for record in service.results():
            seen.append(record)
            if len(seen) == 1:  # a trainer submits its next batch while the first is still running
                second = service.submit(tasks[2:], make_policy("scripted"), policy_version=2)
        ids = [r["episode_id"] for r in seen]
        assert sorted(ids) == sorted(first + second) and len(set(ids)) == len(ids) == 6
        versions = {r["episode_id"]: {s["policy_version"] for s in r["steps"]} for r in seen}
        assert all(versions[e] == {1} for e in first) and all(versions[e] == {2} for e in second)
        assert {r["status"] for r in seen} == {"success"}
        # The same task twice in one run: distinct samples, distinct episode ids.
        again = service.submit(tasks[:1], make_policy("scripted"), policy_version=3)
        [record] = await service.collect()
        assert record["episode_id"] == again[0] and record["sample"] == 2
        run_dir = service.run_dir
    assert run_dir is not None and len(read_records(run_dir)) == 7


class BrokenPolicy(Policy):
    """A policy whose start fails (a model that cannot load)."""

    async def start(self) -> None:
        await asyncio.sleep(0.05)  # runners wait on the same start meanwhile
        raise RuntimeError("weights not found")


async def test_a_policy_that_cannot_start_ends_its_episodes_with_errors(tmp_path: Path, site_server: str,
                                                                        pool: BrowserPool) -> None:
    cfg = RunConfig(output_dir=str(tmp_path / "runs"), concurrency=4, workers=1, telemetry=None)
    async with RolloutService(cfg, base_url=site_server, pool=pool) as service:
        assert service.base_url is not None
        tasks = load_tasks(subset(tmp_path, per_site=1), service.base_url)
        ids = service.submit(tasks, BrokenPolicy())
        records = await asyncio.wait_for(service.gather(ids), 60)
    assert [r["status"] for r in records] == ["error"] * len(ids)
    assert all("weights not found" in r["error"]["message"] for r in records)


class MistypedReplyPolicy(Policy):
    """A policy whose replies carry a number where the record keeps text (a user's policy with a bug)."""

    async def act(self, request: PolicyRequest) -> PolicyReply:
        return PolicyReply(AgentAction("answer", text="done"), text=42)  # type: ignore[arg-type]


async def test_a_policy_reply_of_the_wrong_types_is_a_policy_error_and_the_run_stays_readable(
        tmp_path: Path, site_server: str, pool: BrowserPool) -> None:
    # Recorded as it was, the reply made the record one its reader refuses: the whole run directory unreadable.
    cfg = RunConfig(output_dir=str(tmp_path / "runs"), concurrency=2, workers=1, telemetry=None)
    async with RolloutService(cfg, base_url=site_server, pool=pool) as service:
        assert service.base_url is not None
        tasks = load_tasks(subset(tmp_path, per_site=1), service.base_url)[:2]
        ids = service.submit(tasks, MistypedReplyPolicy())
        records = await asyncio.wait_for(service.gather(ids), 60)
        run_dir = service.run_dir
    assert [(r["status"], r["error"]["kind"]) for r in records] == [("error", "policy")] * 2
    assert all("text must be a string, not int" in r["error"]["message"] for r in records)
    assert run_dir is not None and len(read_records(run_dir)) == 2


async def test_the_service_has_every_feature_of_run(tmp_path: Path, site_server: str, pool: BrowserPool) -> None:
    """Telemetry (a monitor attached to a service sees its cells), sync mode, the workers' memory figures and the
    same stats as `run`: both are clients of one engine core."""
    tasks_file = subset(tmp_path, per_site=1)
    tasks = load_tasks(tasks_file, site_server)[:4]
    cfg = RunConfig(tasks=str(tasks_file), output_dir=str(tmp_path / "runs"), concurrency=2, workers=1, mode="sync")
    model = MonitorModel()
    async with RolloutService(cfg, base_url=site_server) as service:
        assert service.run_dir is not None
        feed = SocketFeed(run_dir=service.run_dir, poll_s=0.05)
        watcher = asyncio.ensure_future(feed.run(model.apply, lambda _: None))
        transitions: list[tuple[str, str]] = []
        service.core.on_status(lambda st: transitions.append((st.episode_id, st.state.value)))
        ids = service.submit(tasks, make_policy("scripted"))
        records = await asyncio.wait_for(service.gather(ids), 120)
        assert await until(lambda: model.counts()["F"] == len(ids)), model.counts()  # a telemetry tick or two
        watcher.cancel()
        await asyncio.gather(watcher, return_exceptions=True)
        service_summary = service.stats.summary()
    assert set(model.cells) == set(ids) and model.counts()["F"] == 4  # the monitor saw every cell finish
    assert service_summary["peak_browser_pss_mib"] > 0 and service_summary["episodes"] == 4
    # Sync mode: the second batch of two started only after the first batch had ended (lock-step batches).
    first_start = {e: transitions.index((e, "W")) for e in ids}
    first_end = {e: transitions.index((e, "F")) for e in ids}
    assert min(first_start[e] for e in ids[2:]) > max(first_end[e] for e in ids[:2]), transitions
    assert {r["mode"] for r in records} == {"sync"}
    run_stats, _ = await run(dataclasses.replace(cfg, telemetry=None, episodes=4), make_policy("scripted"),
                             site_server, pool=pool)
    assert set(run_stats.summary()) == set(service_summary)
    assert run_stats.summary()["peak_browser_pss_mib"] > 0


async def test_a_full_disk_ends_gather_with_the_store_error_and_no_record_is_only_in_memory(
        tmp_path: Path, small_disk: SmallDisk) -> None:
    # Before, the service handed back records it could not write (the run directory had none of them), and a
    # record whose append failed was never counted as ended.
    cfg = RunConfig(output_dir=str(small_disk.path / "runs"), concurrency=4, workers=1, telemetry=None)
    async with RolloutService(cfg, serve_sites=True) as service:
        assert service.base_url is not None
        tasks = load_tasks(subset(tmp_path, per_site=2), service.base_url)
        ids = service.submit(tasks * 3, make_policy("scripted"))
        with pytest.raises(StoreFailed, match="No space left on device"):
            await asyncio.wait_for(service.gather(ids), 60)
        handed: list[str] = []  # the records that finished before: handed out, then the error again
        with pytest.raises(StoreFailed):
            while len(handed) <= len(ids):
                handed.append((await asyncio.wait_for(service.next_result(), 10))["episode_id"])
        run_dir = service.run_dir
    assert run_dir is not None
    stored = {r["episode_id"] for r in read_records(run_dir)}
    assert set(handed) <= stored and len(stored) < len(ids)
