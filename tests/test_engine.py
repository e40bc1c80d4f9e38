"""The engine end to end on the bundled sites: real site server, real workers, real Chromium. The runs of the
default worker settings share the session's browser pool (``pool``); one with settings of its own starts its own."""

from __future__ import annotations

import asyncio
import gc
import json
import weakref
from pathlib import Path

import pytest

from browserpool.config import WorkerConfig
from browserpool.pool import BrowserPool
from engine._imgcodec import jpeg_size
from engine.clients.runner import run
from engine.core.config import RunConfig
from engine.core.core import EngineCore
from engine.core.plan_feed import PlanFeeder
from engine.episode.rollout import Rollout
from engine.episode.status import EpisodeStatus
from engine.store.records import FORMAT_VERSION
from engine.store.run_dir import read_records
from engine.tasks.loading import load_tasks
from policy.registry import make_policy
from tests.conftest import subset

pytestmark = pytest.mark.asyncio(loop_scope="session")


def config(tmp_path: Path, tasks: Path, **kw: object) -> RunConfig:
    kw.setdefault("concurrency", 4)
    kw.setdefault("workers", 1)
    return RunConfig(tasks=str(tasks), output_dir=str(tmp_path / "runs"), **kw)  # type: ignore[arg-type]


async def test_scripted_run_solves_tasks_and_records_everything(tmp_path: Path, sites: str, pool: BrowserPool) -> None:
    tasks = subset(tmp_path)
    n = len(tasks.read_text().splitlines())
    stats, run_dir = await run(config(tmp_path, tasks), make_policy("scripted"), sites, pool=pool)
    records = read_records(run_dir)
    assert len(records) == n and stats.summary()["lost"] == 0
    assert {r["status"] for r in records} == {"success"}, [r["reward"] for r in records if r["status"] != "success"]
    manifest = json.loads((run_dir / "manifest.json").read_text())
    assert manifest["format_version"] == FORMAT_VERSION and manifest["config"]["policy"] == "scripted"
    for r in records:
        assert r["reward"]["value"] == 1.0 and all(f["passed"] for f in r["reward"]["facts"])
        assert r["steps"] and r["steps"][-1]["action"]["name"] == "answer"
        for step in r["steps"]:
            shot = (run_dir / step["screenshot"]).read_bytes()
            assert shot[:2] == b"\xff\xd8" and jpeg_size(shot) == (1280, 768)
            assert step["url"].startswith(sites) and "policy_ms" in step["timings_ms"]
            if step["action"]["name"] != "answer":
                assert step["result"]["settle"] in ("quiet", "busy")
                assert {"action_ms", "settle_ms", "screenshot_ms"} <= set(step["timings_ms"])
                assert isinstance(step["page_changed"], bool)
        assert (run_dir / r["final"]["screenshot"]).exists()


async def test_sync_mode_records_every_episode(tmp_path: Path, sites: str, pool: BrowserPool) -> None:
    tasks = subset(tmp_path, per_site=1)
    n = len(tasks.read_text().splitlines())
    _, run_dir = await run(config(tmp_path, tasks, mode="sync"), make_policy("scripted"), sites, pool=pool)
    records = read_records(run_dir)
    assert len(records) == n and all(r["mode"] == "sync" for r in records)
    assert sum(r["status"] == "success" for r in records) == n


@pytest.mark.parametrize("mode", ["async", "sync"])
async def test_an_async_run_starts_the_longest_episodes_first_the_lock_step_baseline_the_files_order(
        tmp_path: Path, sites: str, mode: str, pool: BrowserPool) -> None:
    # One rollout at a time: the records come in the order the episodes started.
    tasks = subset(tmp_path, per_site=1)
    rows = [json.loads(line) for line in tasks.read_text().splitlines()]
    for row, difficulty in zip(rows, (1, 8, 5, 9), strict=True):  # step caps 10, 30, 20, 30 (train)
        row["difficulty"] = difficulty
    tasks.write_text("".join(json.dumps(r) + "\n" for r in rows))
    _, run_dir = await run(config(tmp_path, tasks, concurrency=1, mode=mode), make_policy("scripted"), sites,
                         pool=pool)
    started = [r["task"]["task_id"] for r in read_records(run_dir)]
    ids = [r["task_id"] for r in rows]
    assert started == ([ids[1], ids[3], ids[2], ids[0]] if mode == "async" else ids)
    _, run_dir = await run(config(tmp_path, tasks, concurrency=1, order="file"), make_policy("scripted"), sites,
                         pool=pool)
    assert [r["task"]["task_id"] for r in read_records(run_dir)] == ids


async def test_a_plan_is_fed_a_few_rollouts_at_a_time_and_none_is_kept_once_recorded(tmp_path: Path, sites: str,
                                                                                       pool: BrowserPool) -> None:
    # A long plan must not grow the engine: each rollout is made when a place frees up and let go with its record.
    tasks = subset(tmp_path, per_site=1)
    # More runners than places: only the feeder can keep the episodes in flight down to 3.
    core = EngineCore(config(tmp_path, tasks, concurrency=8, step_caps=(1, 1, 1)), base_url=sites, pool=pool)
    entered: set[str] = set()
    most_alive = 0
    gone: list[weakref.ref[Rollout]] = []
    ids: list[str] = []

    def on_status(st: EpisodeStatus) -> None:
        nonlocal most_alive
        entered.add(st.episode_id)
        ids.append(st.episode_id)
        most_alive = max(most_alive, len(entered) - len(gone))

    core.on_status(on_status)
    core.on_record(lambda rollout, _record: gone.append(weakref.ref(rollout)))
    await core.start()
    try:
        policy = make_policy("instant")
        await core.start_policy(policy)
        plan = core.announce([(t, s) for s in range(2) for t in load_tasks(tasks, sites)])
        assert core.stats.total == len(plan) > 6  # the whole plan is counted before any rollout exists
        await PlanFeeder(core, core.context(policy), plan, places=3).run()
    finally:
        await core.close()
    records = read_records(core.run_dir)
    assert sorted(r["episode_id"] for r in records) == sorted(f"{t.task_id}#{s}" for t, s, _ in plan)
    assert 1 < most_alive <= 3
    # Each rollout's id is the very string telemetry was given for the monitor (kept for the run), not a copy.
    announced = {eid: eid for _, _, eid in plan}
    assert core.telemetry is not None and len(announced) == len(plan) and all(announced[e] is e for e in ids)
    gc.collect()
    assert len(gone) == len(plan) and not [ref for ref in gone if ref() is not None]


async def test_random_policy_ends_every_episode_with_a_record(tmp_path: Path, sites: str, pool: BrowserPool) -> None:
    tasks = subset(tmp_path, per_site=3, max_len=30)
    stats, run_dir = await run(config(tmp_path, tasks, concurrency=8, episodes=16, seed=3, step_caps=(6, 6, 6)),
                               make_policy("random", seed=3), sites, pool=pool)
    records = read_records(run_dir)
    assert len(records) == 16 and len({r["episode_id"] for r in records}) == 16
    assert not [r["error"] for r in records if r["status"] == "error"]
    assert stats.steps == sum(len(r["steps"]) for r in records)
    assert all(1 <= len(r["steps"]) <= 6 for r in records)  # the run's step caps


async def test_resume_skips_episodes_that_have_a_record(tmp_path: Path, sites: str, pool: BrowserPool) -> None:
    tasks = subset(tmp_path, per_site=1)
    n = len(tasks.read_text().splitlines())
    _, run_dir = await run(config(tmp_path, tasks, episodes=2), make_policy("scripted"), sites, pool=pool)
    first = read_records(run_dir)
    assert len(first) == 2
    with open(run_dir / "episodes.jsonl", "ab") as f:
        f.write(b'{"episode_id": "torn')  # as if the process had been killed mid-write
    stats, _ = await run(config(tmp_path, tasks, run_dir=str(run_dir)), make_policy("scripted"), sites, pool=pool)
    records = read_records(run_dir)
    assert stats.total == n - 2
    assert sorted(r["episode_id"] for r in records) == sorted({r["episode_id"] for r in records})
    assert len(records) == n and records[:2] == first


async def test_refused_navigation_is_recorded_and_the_episode_continues(tmp_path: Path, sites: str,
                                                                        pool: BrowserPool) -> None:
    rec = {"task_id": "escape", "task_name": "read a local file", "website": "{SITES}/wiki/", "difficulty": 1,
           "evaluator_reference": [{"id": 1, "description": "d", "facts": ["on the wiki"],
                                    "checks": [{"kind": "url", "contains": "/wiki/"}]}],
           "reference_solution": [{"action": "navigate", "url": "file:///etc/passwd"},
                                  {"action": "navigate", "url": "chrome://version"},
                                  {"action": "answer", "text": "no"}]}
    tasks = tmp_path / "escape.jsonl"
    tasks.write_text(json.dumps(rec) + "\n")
    _, run_dir = await run(config(tmp_path, tasks, concurrency=1), make_policy("scripted"), sites, pool=pool)
    [r] = read_records(run_dir)
    assert r["status"] == "success" and r["final"]["url"].startswith(sites)
    assert [s.get("error", "")[:7] for s in r["steps"][:2]] == ["refused", "refused"]


async def test_hanging_page_ends_at_its_deadline(tmp_path: Path, sites: str) -> None:
    rec = {"task_id": "hang", "task_name": "wait forever", "website": "{SITES}/wiki/", "difficulty": 1,
           "evaluator_reference": [{"id": 1, "description": "d", "facts": ["f"],
                                    "checks": [{"kind": "answer", "contains": "x"}]}],
           "reference_solution": [{"action": "navigate", "url": "{SITES}/_test/hang"},
                                  {"action": "answer", "text": "x"}]}
    tasks = tmp_path / "hang.jsonl"
    tasks.write_text(json.dumps(rec) + "\n")
    cfg = config(tmp_path, tasks, concurrency=1, worker=WorkerConfig(endpoint="", settle_timeout_s=2.0))
    _, run_dir = await asyncio.wait_for(run(cfg, make_policy("scripted"), sites), 60)
    [r] = read_records(run_dir)
    step = r["steps"][0]
    assert step["result"]["settle"] == "timeout" and not step["result"]["url"].endswith("/_test/hang")
    # The settle's 2 s cap, within the clocks' rounding: the worker's timer starts a moment after the cap's (one run
    # measured 1999.95 ms).
    assert 1990 <= step["timings_ms"]["action_ms"] + step["timings_ms"].get("settle_ms", 0) < 8000
    assert r["status"] == "success"  # the episode went on after the timed-out step
