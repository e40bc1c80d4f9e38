"""Where rewards come from inside a run: the judge off the rollout path, re-judging, and straggler cuts."""

from __future__ import annotations

import asyncio
import base64
import json
import os
import re
import shutil
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio

from browserpool.pool import BrowserPool
from engine.agent.model_api import ChatRequest, Generation, LanguageModel
from engine.clients.env import AsyncWebEnv
from engine.clients.runner import run
from engine.clients.service import RolloutService
from engine.core.config import RunConfig
from engine.core.core import EngineCore
from engine.rewards.judge import JudgeConfig, RubricJudge
from engine.store.run_dir import read_records
from engine.store.stats import RunStats
from engine.tasks.loading import load_tasks
from policy.registry import make_judge, make_policy
from tests.chat_test_server import ChatTestServer
from tests.conftest import SmallDisk, subset

pytestmark = pytest.mark.asyncio(loop_scope="session")


def slow_task(task_id: str, waits: int, seconds: float) -> dict:
    """A bundled-site task whose scripted solution waits on a quiet page ``waits`` times."""
    return {"task_id": task_id, "task_name": "wait a while", "website": "{SITES}/wiki/", "difficulty": 1,
            "max_steps": waits + 2,
            "evaluator_reference": [{"id": 1, "description": "d", "facts": ["f"],
                                     "checks": [{"kind": "answer", "contains": "done"}]}],
            "reference_solution": [*({"action": "wait", "seconds": seconds} for _ in range(waits)),
                                   {"action": "answer", "text": "done"}]}


@pytest.mark.wallclock
async def test_stragglers_are_cut_with_a_record_that_says_why(tmp_path: Path, sites: str, pool: BrowserPool) -> None:
    fast = [json.loads(line) for line in subset(tmp_path, per_site=1).read_text().splitlines()]
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text("\n".join(json.dumps(r) for r in [*fast, slow_task("slow", waits=8, seconds=3.0)]) + "\n")
    cfg = RunConfig(tasks=str(tasks), output_dir=str(tmp_path / "runs"), concurrency=5, workers=1,
                    straggler_fraction=0.8, straggler_grace_s=1.0)
    stats, run_dir = await run(cfg, make_policy("scripted"), sites, pool=pool)
    records = {r["task"]["task_id"]: r for r in read_records(run_dir)}
    assert len(records) == len(fast) + 1 and stats.summary()["lost"] == 0
    slow = records.pop("slow")
    assert slow["status"] == "error" and slow["error"]["kind"] == "straggler"
    assert "80%" in slow["error"]["message"] and len(slow["steps"]) < 8
    assert {r["status"] for r in records.values()} == {"success"}
    assert stats.elapsed_s < 20  # the slow episode alone needs over 24 s


async def test_no_straggler_cut_by_default(tmp_path: Path, sites: str, pool: BrowserPool) -> None:
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text(json.dumps(slow_task("slow", waits=2, seconds=1.0)) + "\n")
    cfg = RunConfig(tasks=str(tasks), output_dir=str(tmp_path / "runs"), concurrency=1, workers=1)
    _, run_dir = await run(cfg, make_policy("scripted"), sites, pool=pool)
    [record] = read_records(run_dir)
    assert record["status"] == "success"


class PassingJudgeTestModel(LanguageModel):
    """A test stand-in for a judge model: every check passes (the site did not block the agent)."""

    name = "passing-judge-test"

    async def generate(self, request: ChatRequest) -> Generation:
        blocking = request.messages[0]["content"][0]["text"].startswith("## Blocking check")
        return Generation(f"Looked at it.\nVERDICT: {'NO' if blocking else 'YES'}", finish_reason="stop")


@pytest_asyncio.fixture(loop_scope="session")
async def judge_server() -> AsyncIterator[ChatTestServer]:
    async with ChatTestServer(PassingJudgeTestModel(), served_model_name="judge") as server:
        yield server


def judged_config(tmp_path: Path, tasks: Path) -> RunConfig:
    return RunConfig(tasks=str(tasks), output_dir=str(tmp_path / "runs"), concurrency=4, workers=1, reward="judge")


def judge_of(tmp_path: Path, server: ChatTestServer, **judge: object) -> RubricJudge:
    """The judge on the test server, its verdicts cached where `webgym-engine judge` looks (beside the runs)."""
    return make_judge(JudgeConfig(base_url=server.base_url, model="judge", backoff_s=0.01,
                                  cache_dir=str(tmp_path / "runs" / "judge-cache"), **judge))  # type: ignore[arg-type]


def raw_records(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "episodes.jsonl").read_text().splitlines()]


async def test_the_judge_never_holds_up_the_rollouts(
        tmp_path: Path, sites: str, judge_server: ChatTestServer, pool: BrowserPool) -> None:
    tasks = subset(tmp_path, per_site=1)
    n = len(tasks.read_text().splitlines())
    judge_server.latency_s = 0.4  # a slow judge: each episode needs several calls, two at a time
    try:
        stats, run_dir = await run(judged_config(tmp_path, tasks), make_policy("scripted"), sites,
                                   judge=judge_of(tmp_path, judge_server, concurrency=2), pool=pool)
    finally:
        judge_server.latency_s = 0.0
    raw = raw_records(run_dir)
    assert len(raw) == n and {r["status"] for r in raw} == {"judge_pending"} and stats.summary()["lost"] == 0
    judgements = [json.loads(line) for line in (run_dir / "judgements.jsonl").read_text().splitlines()]
    assert len(judgements) == n
    rollouts_done = max(r["started_at"] + r["duration_s"] for r in raw)
    # Verdicts kept arriving after the last rollout had ended: the rollouts did not wait for them.
    assert max(j["judged_at"] for j in judgements) > rollouts_done + 0.5
    assert all(r["duration_s"] < 15 for r in raw)
    for r in read_records(run_dir):
        assert r["status"] == "success" and r["reward"]["source"] == "judge"
        evidence = r["reward"]["evidence"]
        assert evidence["keypoint"]["kept"][-1] == r["final"]["screenshot"] and evidence["counts"]["calls"] >= 3
    assert stats.summary()["succeeded"] == n and stats.summary()["judge_pending"] == 0


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def judge_down_run(tmp_path_factory: pytest.TempPathFactory, site_server: str, pool: BrowserPool
                         ) -> tuple[RunStats, Path, int]:
    """(stats, run directory, episodes) of a run of one task per site whose judge failed every call: made once,
    copied by each test that uses it (:func:`with_the_judge_down`)."""
    tmp_path = tmp_path_factory.mktemp("judge-down")
    tasks = subset(tmp_path, per_site=1)
    async with ChatTestServer(PassingJudgeTestModel(), served_model_name="judge") as server:
        server.fail_next(10_000, 500, message="judge down")
        stats, run_dir = await run(judged_config(tmp_path, tasks), make_policy("scripted"), site_server,
                                   judge=judge_of(tmp_path, server, retries=1), pool=pool)
    return stats, run_dir, len(tasks.read_text().splitlines())


def with_the_judge_down(made: tuple[RunStats, Path, int], tmp_path: Path) -> tuple[RunStats, Path, int]:
    """A copy of :func:`judge_down_run`'s run directory in ``tmp_path/runs``, where ``webgym-engine judge`` looks
    for its verdict cache."""
    stats, run_dir, n = made
    return stats, Path(shutil.copytree(run_dir, tmp_path / "runs" / run_dir.name)), n


async def judge_cli(run_dir: Path, judge_server: ChatTestServer, *extra: str) -> int:
    """``webgym-engine judge RUN_DIR``: a real subprocess, awaited without blocking this loop (it serves the test
    server)."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "cli.main", "judge", str(run_dir), "--judge-base-url", judge_server.base_url,
        "--judge-model", "judge", *extra, stderr=asyncio.subprocess.PIPE)
    _, err = await proc.communicate()
    assert b"judged" in err, err.decode()
    return proc.returncode or 0


async def test_judge_failure_leaves_episodes_pending_until_rejudged(
        tmp_path: Path, judge_server: ChatTestServer, judge_down_run: tuple[RunStats, Path, int]) -> None:
    stats, run_dir, n = with_the_judge_down(judge_down_run, tmp_path)
    records = read_records(run_dir)
    assert len(records) == n and stats.summary()["judge_pending"] == n and stats.summary()["lost"] == 0
    assert all(r["status"] == "judge_pending" and "judge down" in r["judge_error"] for r in records)
    assert await judge_cli(run_dir, judge_server) == 0
    assert {r["status"] for r in read_records(run_dir)} == {"success"}
    calls = len(judge_server.received)
    assert await judge_cli(run_dir, judge_server, "--all") == 0  # every verdict is cached: no new calls
    assert len(judge_server.received) == calls


async def test_a_full_disk_stops_the_judge_before_it_spends_calls_on_verdicts_it_cannot_store(
        tmp_path: Path, judge_server: ChatTestServer, small_disk: SmallDisk,
        judge_down_run: tuple[RunStats, Path, int]) -> None:
    # Before, every pending episode was judged (its calls paid for) and none of the verdicts was stored.
    _, made, n = judge_down_run
    small_disk.resize("64m")
    run_dir = Path(shutil.copytree(made, small_disk.path / made.name))
    used = os.statvfs(run_dir).f_blocks - os.statvfs(run_dir).f_bfree
    small_disk.resize(f"{used * os.statvfs(run_dir).f_frsize // 1024}k")  # full: judgements.jsonl has no room
    calls = len(judge_server.received)
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "cli.main", "judge", str(run_dir), "--judge-base-url", judge_server.base_url,
        "--judge-model", "judge", "--judge-concurrency", "1", "--cache-dir", str(tmp_path / "cache"),
        stderr=asyncio.subprocess.PIPE, env={**os.environ, "COLUMNS": "1000"})
    _, err = await proc.communicate()
    said = err.decode(errors="replace")
    assert proc.returncode == 1 and "could not be written" in said and "No space left" in said, said
    records = read_records(run_dir)
    assert len(records) == n and {r["status"] for r in records} == {"judge_pending"}
    asked = {r["task"]["task_name"] for r in records for call in judge_server.received[calls:]
             if r["task"]["task_name"] in json.dumps(call.payload)}
    assert len(asked) == 1  # the first verdict could not be stored: no other episode was judged


async def test_the_judge_sends_no_file_from_outside_the_run_directory(
        tmp_path: Path, judge_server: ChatTestServer, judge_down_run: tuple[RunStats, Path, int]) -> None:
    # A run directory may come from elsewhere. Before, its records' screenshot references were read wherever they
    # pointed, and re-judging it sent those files to the judge's server.
    _, run_dir, _ = with_the_judge_down(judge_down_run, tmp_path)
    records = raw_records(run_dir)
    shot = run_dir / records[0]["steps"][0]["screenshot"]
    secret = tmp_path / "private.jpg"
    secret.write_bytes(shot.read_bytes() + b"PRIVATE-BYTES")  # still a JPEG that a judge would take
    (run_dir / "frames" / "escape.jpg").symlink_to(secret)
    for ref, record in zip([str(secret), "frames/../../private.jpg", "frames/escape.jpg"], records, strict=False):
        for step in record["steps"]:
            step["screenshot"] = ref
        record["final"]["screenshot"] = ref
    (run_dir / "episodes.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    calls = len(judge_server.received)
    await judge_cli(run_dir, judge_server)
    sent = [base64.b64decode(b) for b in re.findall(r"base64,([A-Za-z0-9+/=]+)",
                                                    json.dumps([r.payload for r in judge_server.received[calls:]]))]
    assert sent and not any(b.endswith(b"PRIVATE-BYTES") for b in sent)  # the fourth episode's own were sent
    errors = [json.loads(line)["error"] for line in (run_dir / "judgements.jsonl").read_text().splitlines()]
    assert sum("outside the run directory's frames/" in (e or "") for e in errors) == 3, errors


async def test_auto_reward_prefers_the_task_checks(
        tmp_path: Path, sites: str, judge_server: ChatTestServer, pool: BrowserPool) -> None:
    checked = json.loads(subset(tmp_path, per_site=1).read_text().splitlines()[0])
    unchecked = {**checked, "task_id": "no-checks",
                 "evaluator_reference": [{"id": 1, "description": "d", "facts": ["the answer names a product"]}]}
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text(json.dumps(checked) + "\n" + json.dumps(unchecked) + "\n")
    cfg = judged_config(tmp_path, tasks)
    cfg.reward = "auto"
    _, run_dir = await run(cfg, make_policy("scripted"), sites, judge=judge_of(tmp_path, judge_server), pool=pool)
    sources = {r["task"]["task_id"]: r["reward"]["source"] for r in read_records(run_dir)}
    assert sources == {checked["task_id"]: "program", "no-checks": "judge"}


def checked_and_unchecked(tmp_path: Path) -> tuple[dict, dict, Path]:
    """A bundled task with its programmatic checks, the same task without them, and a task file of both."""
    checked = json.loads(subset(tmp_path, per_site=1).read_text().splitlines()[0])
    unchecked = {**checked, "task_id": "no-checks",
                 "evaluator_reference": [{"id": 1, "description": "d", "facts": ["the answer names a product"]}]}
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text(json.dumps(checked) + "\n" + json.dumps(unchecked) + "\n")
    return checked, unchecked, tasks


async def test_a_task_without_checks_run_without_a_judge_ends_unrewarded(
        tmp_path: Path, sites: str, pool: BrowserPool) -> None:
    # Before, its record was a failure (reward value None): a WebGym task file run without a judge read 0% success.
    checked, _, tasks = checked_and_unchecked(tmp_path)
    cfg = RunConfig(tasks=str(tasks), output_dir=str(tmp_path / "runs"), concurrency=2, workers=1, telemetry=None)
    stats, run_dir = await run(cfg, make_policy("scripted"), sites, pool=pool)
    records = {r["task"]["task_id"]: r for r in read_records(run_dir)}
    assert records[checked["task_id"]]["status"] == "success"
    unrewarded = records["no-checks"]
    assert unrewarded["status"] == "unrewarded" and unrewarded["error"] is None
    assert unrewarded["reward"]["value"] is None and unrewarded["reward"]["source"] == "none"
    summary = stats.summary()
    assert (summary["succeeded"], summary["failed"], summary["unrewarded"], summary["blocked"], summary["errors"],
            summary["judge_pending"]) == (1, 0, 1, 0, 0, 0)
    assert summary["success_rate"] == 1.0  # of the rewarded episodes: nothing scored the other one


class BlockingJudgeTestModel(LanguageModel):
    """A test stand-in for a judge model that sees a block page in every episode (and says YES to every check)."""

    name = "blocking-judge-test"

    async def generate(self, request: ChatRequest) -> Generation:
        return Generation("A CAPTCHA covers the page.\nVERDICT: YES", finish_reason="stop")


async def test_a_judged_blocked_verdict_ends_blocked_with_no_reward_value(
        tmp_path: Path, sites: str, pool: BrowserPool) -> None:
    # Before, the judge's blocked verdict was a reward of 0.0 and a failure, which a trainer trained on.
    _, _, tasks = checked_and_unchecked(tmp_path)
    async with ChatTestServer(BlockingJudgeTestModel(), served_model_name="judge") as server:
        stats, run_dir = await run(judged_config(tmp_path, tasks), make_policy("scripted"), sites,
                                   judge=judge_of(tmp_path, server), pool=pool)
    records = read_records(run_dir)
    assert len(records) == 2 and {r["status"] for r in raw_records(run_dir)} == {"judge_pending"}
    for r in records:
        assert r["status"] == "blocked" and r["reward"]["value"] is None and r["reward"]["blocked"] is True
        assert r["reward"]["source"] == "judge" and r["reward"]["evidence"]["blocking"]["blocked"] is True
        assert r["error"] == {"kind": "judge_blocked", "message": "blocked: A CAPTCHA covers the page."}
    summary = stats.summary()
    assert (summary["blocked"], summary["failed"], summary["judge_pending"], summary["success_rate"]) == (2, 0, 0, 0.0)


class VerdictlessJudgeTestModel(PassingJudgeTestModel):
    """A test stand-in for a judge model that answers the answer check without a verdict line, also when reminded."""

    name = "verdictless-judge-test"

    async def generate(self, request: ChatRequest) -> Generation:
        if request.messages[0]["content"][0]["text"].startswith("## Answer check"):
            return Generation("The screenshots show it: no issues, supported.", finish_reason="stop")
        return await super().generate(request)


async def test_a_judge_that_twice_gives_no_verdict_line_leaves_the_episode_pending(
        tmp_path: Path, sites: str, pool: BrowserPool) -> None:
    # Before, the reply's last "no" was read as the verdict: the episode was a failure, nothing said why.
    _, unchecked, tasks = checked_and_unchecked(tmp_path)
    tasks.write_text(json.dumps(unchecked) + "\n")
    async with ChatTestServer(VerdictlessJudgeTestModel(), served_model_name="judge") as server:
        stats, run_dir = await run(judged_config(tmp_path, tasks), make_policy("scripted"), sites,
                                   judge=judge_of(tmp_path, server), pool=pool)
        answer_checks = [r.payload["messages"] for r in server.received
                         if "## Answer check" in json.dumps(r.payload["messages"][0])]
    [record] = read_records(run_dir)
    assert record["status"] == "judge_pending" and record["reward"] is None
    assert "no verdict in the judge's reply, even after a reminder" in record["judge_error"]
    assert [len(m) for m in answer_checks] == [1, 3]  # asked, then once more with the reminder
    reminder = json.dumps(answer_checks[1][2])
    assert answer_checks[1][1]["role"] == "assistant" and "`VERDICT: YES` or `VERDICT: NO`" in reminder
    assert stats.summary()["judge_pending"] == 1 and stats.summary()["failed"] == 0


async def test_the_service_cuts_stragglers_of_a_batch_like_run(tmp_path: Path, sites: str, pool: BrowserPool) -> None:
    fast = [json.loads(line) for line in subset(tmp_path, per_site=1).read_text().splitlines()]
    tasks_file = tmp_path / "tasks.jsonl"
    tasks_file.write_text("\n".join(json.dumps(r) for r in [*fast, slow_task("slow", waits=8, seconds=3.0)]) + "\n")
    cfg = RunConfig(output_dir=str(tmp_path / "runs"), concurrency=5, workers=1, telemetry=None,
                    straggler_fraction=0.8, straggler_grace_s=1.0)
    async with RolloutService(cfg, base_url=sites, pool=pool) as service:
        ids = service.submit(load_tasks(tasks_file, sites), make_policy("scripted"))
        records = {r["task"]["task_id"]: r for r in await asyncio.wait_for(service.gather(ids), 60)}
    slow = records.pop("slow")
    assert slow["status"] == "error" and slow["error"]["kind"] == "straggler" and len(slow["steps"]) < 8
    assert {r["status"] for r in records.values()} == {"success"}


async def test_an_env_episode_gets_the_judges_verdict_later(tmp_path: Path, sites: str,
                                                            judge_server: ChatTestServer, pool: BrowserPool) -> None:
    """A task without checks of its own: the env's last step says judge_pending, and info["verdict"] resolves to
    the record with the judge's reward merged in (the rollout never waited for it)."""
    checked = json.loads(subset(tmp_path, per_site=1).read_text().splitlines()[0])
    unchecked = {**checked, "task_id": "judged",
                 "evaluator_reference": [{"id": 1, "description": "d", "facts": ["the answer names a product"]}]}
    tasks_file = tmp_path / "tasks.jsonl"
    tasks_file.write_text(json.dumps(unchecked) + "\n")
    cfg = RunConfig(output_dir=str(tmp_path / "runs"), concurrency=2, workers=1, telemetry=None)
    async with EngineCore(cfg, judge=judge_of(tmp_path, judge_server), base_url=sites, pool=pool) as core:
        env = AsyncWebEnv(core, load_tasks(tasks_file, sites))
        await env.reset("judged")
        *_, terminated, _, info = await env.step({"name": "answer", "text": "a mug"})
        assert terminated and info["status"] == "judge_pending"
        merged = await asyncio.wait_for(info["verdict"], 60)
    assert merged["status"] == "success" and merged["reward"]["source"] == "judge"
    assert read_records(core.run_dir)[0]["status"] == "success"  # type: ignore[arg-type]


async def test_the_straggler_cutter_waits_for_its_fraction_then_the_grace_period() -> None:
    from engine.core.stragglers import StragglerCut

    live: set[Any] = {"a", "b", "c", "d"}  # names stand in for the rollouts: the cutter only hands them on
    cuts: list[list[str]] = []
    cutter = StragglerCut(total=4, fraction=0.75, grace_s=0.05)
    task = asyncio.ensure_future(cutter.run(lambda: live, lambda rs: cuts.append(sorted(rs))))
    for name in ("a", "b"):
        live.discard(name)
        cutter.count_end()
    await asyncio.sleep(0.1)
    assert not task.done() and not cutter.cutting  # 2 of 4 ended: under 75%
    live.discard("c")
    cutter.count_end()
    await asyncio.wait_for(task, 2)
    assert cutter.cutting and cuts == [["d"]]
    assert StragglerCut.for_run(RunConfig(mode="sync", straggler_fraction=0.5), 4) is None  # lock-step: never
    assert StragglerCut.for_run(RunConfig(), 4) is None  # not asked for
