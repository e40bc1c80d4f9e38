"""The step-level environments: AsyncWebEnv on a shared engine core, WebEnv as a gymnasium.Env.

Real parts throughout: the bundled sites' server, browser workers with Chromium, the engine core's store.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
from collections.abc import AsyncIterator
from pathlib import Path

import numpy as np
import pytest
import torch
from gymnasium.utils.env_checker import check_env

from browserpool.pool import BrowserPool
from engine.agent.prompts import AgentConfig
from engine.clients.env import AsyncWebEnv, EpisodeError
from engine.clients.gym_env import CoreThread, WebEnv
from engine.core.config import RunConfig
from engine.core.core import EngineCore
from engine.store.run_dir import StoreFailed, read_records
from engine.tasks.loading import load_tasks
from engine.tasks.schema import Task
from policy.registry import BackendConfig, make_policy
from policy.scripted import ScriptedPolicy
from tests.conftest import SharedPools, SmallDisk, subset
from train.export import export_sharegpt
from viewer.report import build_report


async def test_64_envs_with_scripted_solutions_solve_every_task(tmp_path: Path, site_server: str,
                                                                pools: SharedPools) -> None:
    tasks = load_tasks(subset(tmp_path, per_site=16, max_len=3), site_server)
    assert len(tasks) >= 40
    cfg = RunConfig(output_dir=str(tmp_path / "runs"), concurrency=64, workers=2, telemetry=None)
    oracle = ScriptedPolicy()  # the "trainer": reads the page through the env's request, like a demonstrator

    async def solve(env: AsyncWebEnv, task_index: int) -> dict:
        task = tasks[task_index % len(tasks)]
        obs, info = await env.reset(task)
        assert obs["screenshot"][:2] == b"\xff\xd8" and info["task_id"] == task.task_id
        while True:
            assert env.request is not None
            reply = await oracle.act(env.request)
            obs, reward, terminated, truncated, info = await env.step(reply.action.to_dict())
            if terminated or truncated:
                await oracle.end_episode(info["episode_id"])
                return {"reward": reward, "terminated": terminated, "status": info["status"]}

    async with EngineCore(cfg, pool=await pools.for_run(cfg)) as core:
        envs = [AsyncWebEnv(core, oracle=True) for _ in range(64)]
        results = await asyncio.wait_for(asyncio.gather(*(solve(e, i) for i, e in enumerate(envs))), 400)
        assert core.stats.summary()["episodes"] == 64
    assert all(r == {"reward": 1.0, "terminated": True, "status": "success"} for r in results), results
    records = read_records(core.run_dir)  # type: ignore[arg-type]
    assert len(records) == 64 and {r["status"] for r in records} == {"success"}
    assert all(r["policy"] == "env" and r["steps"] for r in records)


async def test_reply_text_with_a_broken_tool_call_is_a_recorded_wait(tmp_path: Path, site_server: str,
                                                                     pool: BrowserPool) -> None:
    tasks = load_tasks(subset(tmp_path, per_site=1), site_server)
    cfg = RunConfig(output_dir=str(tmp_path / "runs"), concurrency=2, workers=1, telemetry=None)
    async with EngineCore(cfg, pool=pool) as core:
        env = AsyncWebEnv(core, tasks, decode=True)
        obs, info = await env.reset(seed=3)
        assert obs["image"].shape == (obs["height"], obs["width"], 3)
        chat, images = env.messages()
        assert chat[0]["role"] == "system" and set(images) == {info["frame"]}
        broken = 'Thought: click it\nAction: click\n<tool_call>\n{"name": "computer_use", "arguments": {"action": '
        obs, reward, terminated, truncated, info = await env.step(broken)
        assert (reward, terminated, truncated) == (0.0, False, False)
        assert info["action"] == {"name": "wait"} and info["parse_error"]
        # A good reply on the grid: the same parser and coordinate frames as `run`.
        good = ('<tool_call>\n{"name": "computer_use", "arguments": {"action": "left_click", '
                '"coordinate": [500, 500]}}\n</tool_call>')
        obs, *_, info = await env.step(good)
        assert info["action"]["name"] == "left_click" and info["parse_error"] is None
        assert info["action"]["x"] == pytest.approx(obs["width"] / 2, abs=1)
        obs, reward, terminated, truncated, info = await env.step({"name": "answer", "text": "done"})
        assert terminated and not truncated and info["status"] in ("success", "failure")
        with pytest.raises(RuntimeError, match="reset"):
            await env.step({"name": "wait"})
    [record] = read_records(core.run_dir)  # type: ignore[arg-type]
    first = record["steps"][0]
    assert first["action"] == {"name": "wait"} and first["parse_error"] and first["reply"] == broken
    assert first["messages"][0]["role"] == "user"  # recorded like `run` records a model's step
    assert record["steps"][1]["parsed"]["frames"]


@contextlib.asynccontextmanager
async def one_env(tmp_path: Path, site_server: str, concurrency: int = 1, pool: BrowserPool | None = None
                  ) -> AsyncIterator[tuple[EngineCore, AsyncWebEnv, list[Task]]]:
    """A core with one browser worker (``pool``'s, or one of its own) and an env on it, reset to the first of one
    task per site."""
    tasks = load_tasks(subset(tmp_path, per_site=1), site_server)
    cfg = RunConfig(output_dir=str(tmp_path / "runs"), concurrency=concurrency, workers=1, telemetry=None)
    async with EngineCore(cfg, pool=pool) as core:
        env = AsyncWebEnv(core, tasks)
        await env.reset(tasks[0])
        yield core, env, tasks


async def test_a_killed_worker_is_an_error_the_trainer_can_handle(tmp_path: Path, site_server: str) -> None:
    async with one_env(tmp_path, site_server, concurrency=2) as (core, env, tasks):
        os.kill(core.pool.workers["w0"].pid, signal.SIGKILL)
        with pytest.raises(EpisodeError) as caught:
            for _ in range(20):
                await env.step({"name": "scroll", "direction": "down"})
        assert caught.value.kind == "worker_lost" and caught.value.record["status"] == "error"
        await core.pool.wait_for_workers(1, 60)
        obs, info = await env.reset(tasks[0])  # a fresh episode on the replacement worker
        assert obs["screenshot"] and info["step"] == 0
        await env.close()  # the live episode ends with its one record
    records = read_records(core.run_dir)  # type: ignore[arg-type]
    assert [r["error"]["kind"] for r in records] == ["worker_lost", "abandoned"]
    assert len({r["episode_id"] for r in records}) == 2


async def test_a_malformed_action_dict_is_refused_and_the_episode_goes_on(tmp_path: Path, site_server: str,
                                                                          pool: BrowserPool) -> None:
    # Sent on, a NaN coordinate or a number for a text failed the episode in the worker (browser_internal).
    async with one_env(tmp_path, site_server, pool=pool) as (core, env, _tasks):
        for bad, error in (({"name": "left_click", "x": float("nan"), "y": 1}, ValueError),
                           ({"name": "left_click", "x": "10", "y": 1}, ValueError),
                           ({"name": "type", "text": 5}, TypeError), ({"name": "keypress", "keys": ["a"]}, TypeError),
                           ({"name": "wait", "seconds": -1}, ValueError), ({"name": "fly"}, ValueError)):
            with pytest.raises(error, match="action|unknown"):
                await env.step(bad)
        obs, reward, terminated, truncated, info = await env.step({"name": "answer", "text": "done"})
        assert terminated and info["status"] in ("success", "failure")
    [record] = read_records(core.run_dir)  # type: ignore[arg-type]
    assert [s["action"]["name"] for s in record["steps"]] == ["answer"]


async def test_a_second_step_at_once_is_refused_with_what_is_wrong(tmp_path: Path, site_server: str,
                                                                    pool: BrowserPool) -> None:
    # Before, it was told "reset() the environment first (the last episode has ended)", of an episode still running.
    async with one_env(tmp_path, site_server, pool=pool) as (core, env, _tasks):
        first = asyncio.ensure_future(env.step({"name": "scroll", "direction": "down"}))
        await asyncio.sleep(0)  # the first step is waiting for its observation
        with pytest.raises(RuntimeError, match="another step\\(\\) of this environment is still waiting"):
            await env.step({"name": "scroll", "direction": "down"})
        _obs, _reward, terminated, _truncated, _info = await first
        assert not terminated
        obs, reward, terminated, truncated, info = await env.step({"name": "answer", "text": "done"})
        assert terminated
    [record] = read_records(core.run_dir)  # type: ignore[arg-type]
    assert [s["action"]["name"] for s in record["steps"]] == ["scroll", "answer"]


async def test_token_ids_as_arrays_are_recorded_as_numbers_and_malformed_ones_are_refused(
        tmp_path: Path, site_server: str, pool: BrowserPool) -> None:
    # A numpy array or integer was written into the record as its text ("[1 2 3]"), which the record's reader
    # refuses: the whole run directory could no longer be read (training, the viewer, --resume).
    async with one_env(tmp_path, site_server, pool=pool) as (core, env, _tasks):
        await env.step({"name": "wait"}, token_ids=np.array([5, 6, 7]), logprobs=torch.tensor([-0.5, -0.25, -2.0]),
                       policy_version=np.int64(3))
        for bad, error in ((dict(token_ids="567"), TypeError), (dict(token_ids=[1.5]), TypeError),
                           (dict(token_ids=torch.tensor([1.0])), TypeError), (dict(policy_version="3"), TypeError),
                           (dict(token_ids=[1], logprobs=["x"]), TypeError),
                           (dict(token_ids=[1], logprobs=[float("nan")]), ValueError),
                           (dict(token_ids=[1, 2], logprobs=[-0.5]), ValueError)):
            with pytest.raises(error):
                await env.step({"name": "wait"}, **bad)
        await env.step({"name": "answer", "text": "done"}, token_ids=(8,), logprobs=[float("-inf")])
    [record] = read_records(core.run_dir)  # type: ignore[arg-type]
    assert [(s["token_ids"], s["logprobs"], s["policy_version"]) for s in record["steps"]] == [
        ([5, 6, 7], [-0.5, -0.25, -2.0], 3), ([8], [float("-inf")], 0)]


async def test_a_cancelled_step_stops_the_episode_until_reset(tmp_path: Path, site_server: str,
                                                               pool: BrowserPool) -> None:
    # The episode goes on without the caller: its next step would act on a page the caller never saw.
    async with one_env(tmp_path, site_server, pool=pool) as (core, env, tasks):
        step = asyncio.ensure_future(env.step({"name": "wait", "seconds": 0.5}))
        await asyncio.sleep(0.05)
        step.cancel()
        with pytest.raises(asyncio.CancelledError):
            await step
        with pytest.raises(RuntimeError, match="cancelled"):
            await env.step({"name": "wait"})
        obs, info = await env.reset(tasks[0])  # the episode left behind ends with its record; a new one starts
        assert info["step"] == 0 and obs["screenshot"]
        obs, reward, terminated, truncated, info = await env.step({"name": "answer", "text": "done"})
        assert terminated and info["status"] in ("success", "failure")
    records = read_records(core.run_dir)  # type: ignore[arg-type]
    assert [r["status"] for r in records][0] == "error" and records[0]["error"]["kind"] == "abandoned"
    assert len(records) == 2


async def test_a_full_disk_is_a_store_error_from_step_and_reset(tmp_path: Path, site_server: str,
                                                                 small_disk: SmallDisk, pool: BrowserPool) -> None:
    # Before, the first episode whose screenshots could not be written ended as a "store" error record (one that
    # --resume skips), and one whose record could not be written came back from step() as finished, its record only
    # in memory; the env went on running episodes that could not be recorded.
    tasks = load_tasks(subset(tmp_path, per_site=1), site_server)
    cfg = RunConfig(output_dir=str(small_disk.path / "runs"), concurrency=1, workers=1, telemetry=None)
    async with EngineCore(cfg, pool=pool) as core:
        env = AsyncWebEnv(core, tasks)
        finished: list[str] = []
        with pytest.raises(StoreFailed, match="No space left on device"):
            for i in range(100):
                await env.reset(tasks[i % len(tasks)])
                *_, info = await env.step({"name": "answer", "text": "done"})
                finished.append(info["episode_id"])
        with pytest.raises(StoreFailed):
            await env.reset(tasks[0])
    assert finished and [r["episode_id"] for r in read_records(core.run_dir)] == finished  # type: ignore[arg-type]


async def test_env_runs_open_in_the_viewer_and_export(tmp_path: Path, site_server: str, pool: BrowserPool) -> None:
    tasks = load_tasks(subset(tmp_path, per_site=1), site_server)
    cfg = RunConfig(output_dir=str(tmp_path / "runs"), concurrency=2, workers=1)
    oracle = ScriptedPolicy()
    async with EngineCore(cfg, pool=pool) as core:
        for task in tasks[:3]:
            env = AsyncWebEnv(core, oracle=True)
            await env.reset(task)
            while env.request is not None:
                reply = await oracle.act(env.request)
                *_, terminated, truncated, _ = await env.step(reply.action.to_dict())
                if terminated or truncated:
                    break
    run_dir = Path(core.run_dir)  # type: ignore[arg-type]
    index = build_report(run_dir)
    assert index.exists() and len(list((index.parent / "data").glob("ep-*.js"))) == 3
    summary = (index.parent / "data" / "summary.js").read_text()
    assert '"total":3' in summary and '"succeeded":3' in summary
    out = tmp_path / "export.jsonl"
    result = export_sharegpt(run_dir, out, only_success=True)
    lines = out.read_text().splitlines()
    assert result["samples"] == len(lines) > 0
    assert all(s["conversations"] and s["images"] for s in map(json.loads, lines))


def test_web_env_passes_gymnasiums_checker(tmp_path: Path) -> None:
    cfg = RunConfig(output_dir=str(tmp_path / "runs"), concurrency=2, workers=1, telemetry=None)
    with CoreThread(cfg, serve_sites=True) as core:
        assert core.base_url is not None
        tasks = load_tasks(subset(tmp_path, per_site=1), core.base_url)
        env = WebEnv(core, tasks)
        check_env(env, skip_render_check=True)
        obs, info = env.reset(seed=1, options={"task_id": tasks[0].task_id})
        assert obs["screenshot"].shape == env.observation_space["screenshot"].shape
        assert info["task_id"] == tasks[0].task_id
        _, reward, terminated, truncated, info = env.step({"name": "answer", "text": "x"})
        assert terminated and isinstance(reward, float) and "verdict" not in info
        env.close()


async def test_the_env_gives_the_model_what_run_would(tmp_path: Path, site_server: str, pool: BrowserPool) -> None:
    """env.messages() is the chat the agent policy of `run` builds for the same step, and reply text is read into
    the same action as `run` reads it (a simulated model's replies; window 1, so summaries appear)."""
    tasks = load_tasks(subset(tmp_path, per_site=1), site_server)
    agent = AgentConfig(window=1)
    policy = make_policy("simulated", agent=agent, backend=BackendConfig(sim_speed=100))
    cfg = RunConfig(output_dir=str(tmp_path / "runs"), concurrency=2, workers=1, telemetry=None)
    await policy.start()
    try:
        async with EngineCore(cfg, pool=pool) as core:
            env = AsyncWebEnv(core, tasks, agent=agent)
            await env.reset(tasks[0])
            for _ in range(4):
                assert env.request is not None
                reply = await policy.act(env.request)
                chat, images = env.messages()
                refs = {p["image"] for m in chat if isinstance(m["content"], list)
                        for p in m["content"] if p["type"] == "image"}
                assert chat == reply.messages and set(images) == refs
                *_, terminated, truncated, info = await env.step(reply.text)
                assert info["action"] == reply.action.to_dict() and info["parse_error"] == reply.parse_error
                if terminated or truncated:
                    break
            else:
                assert any("Step 0" in p.get("text", "") for p in env.messages()[0][1]["content"])
    finally:
        await policy.close()


def test_a_text_agents_web_env_observes_the_tree_and_acts_by_id(tmp_path: Path) -> None:
    cfg = RunConfig(output_dir=str(tmp_path / "runs"), concurrency=2, workers=1, telemetry=None)
    agent = AgentConfig(observe=("axtree", "dom"), action_format="browsergym")
    with CoreThread(cfg, serve_sites=True) as core:
        assert core.base_url is not None
        tasks = [t for t in load_tasks(subset(tmp_path, per_site=1), core.base_url) if "/shop/" in t.website]
        env = WebEnv(core, tasks, agent=agent)
        assert env.observation_space["axtree"].contains("[1] RootWebArea 'x'")
        obs, info = env.reset(options={"task_id": tasks[0].task_id})
        assert obs in env.observation_space
        box = next(line for line in obs["axtree"].splitlines() if " searchbox " in line)
        bid = box.strip().split("]")[0].lstrip("[")
        # With the DOM snapshot: the box's line is marked as BrowserGym marks it, its row has the same id.
        assert ", clickable, visible" in box
        first_dom = info["observation"]["dom"]
        row = next(r for r in first_dom if r[0] == int(bid))
        assert row[2] == "input" and row[7] == 1.0 and row[8] is True
        obs, _, _, _, info = env.step(f"The search box.\n```\nfill('{bid}', 'mug')\n```")
        assert info["parse_error"] is None and info["action"] == {"name": "type", "text": "mug", "enter": False,
                                                                  "node": int(bid)}
        assert "value='mug'" in obs["axtree"]
        _, _, terminated, _, info = env.step("send_msg_to_user('done')")
        assert terminated and env.record is not None and env.record["steps"][0]["axtree"].startswith("[")
        assert env.record["steps"][0]["dom"] == first_dom  # the snapshot the first step acted on
        env.close()
