"""The RL loop keeps the infrastructure out of training: browser workers are killed while GRPO runs and one site
blocks the agent, and still no record without the task's own verdict becomes a training reward, every group trained
has its full size (the lost members were run again on the same task), and the blocked site's groups are dropped.

Real parts throughout: the engine's worker processes (SIGKILL), Chromium, the tests' site server (its
``/_test/denied`` page answers HTTP 403), a tiny Qwen3-VL in the in-process backend, the trainer. The tasks' check
is a coin flip (as in tests/test_rl_loop.py), so that groups have reward variance whatever the model does.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
from collections import Counter
from pathlib import Path

import pytest

pytest.importorskip("torch")

from bench.rl_loop import COIN_TASKS  # noqa: E402
from engine.clients.service import RolloutService  # noqa: E402
from engine.core.config import RunConfig  # noqa: E402
from policy.tiny_models import build_tiny_model  # noqa: E402
from train.config import TrainConfig  # noqa: E402
from train.loop import run_loop
from train.loop_config import LoopConfig  # noqa: E402

GROUP = 4
DENIED = {"task_id": "denied", "task_name": "Look around.", "website": "{SITES}/_test/denied", "difficulty": 1,
          "evaluator_reference": [{"id": 1, "description": "luck", "facts": ["a coin flip"],
                                   "checks": [{"kind": "js", "expr": "Math.random() < 0.5"}]}]}


async def kill_workers(service: RolloutService, kills: list[int]) -> None:
    """SIGKILL both browser workers, one after the other, while episodes run on them."""
    core = service.core
    for name in ("w0", "w1"):
        steps = core.stats.steps
        while core.stats.steps < steps + 4:
            await asyncio.sleep(0.05)
        victim = core.pool.workers[name]
        os.kill(victim.pid, signal.SIGKILL)
        kills.append(victim.pid)


@pytest.mark.asyncio(loop_scope="session")
async def test_killed_workers_and_a_blocking_site_never_become_training_rewards(tmp_path: Path,
                                                                                 site_server: str) -> None:
    model = build_tiny_model(tmp_path / "model", "qwen3_vl", hidden_size=64, num_layers=2)
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text("".join(json.dumps(t) + "\n" for t in [*COIN_TASKS[:3], DENIED]))
    train = TrainConfig.from_dict({
        "model_dir": str(model), "algorithm": "grpo", "lr": 1e-4, "max_steps": 1, "batch_size": 8, "cpu_threads": 1,
        "progress": False, "tensorboard": False, "plots": False, "agent": {"response_format": "vanilla", "window": 1}},
        "test")
    cfg = LoopConfig(train=train, tasks=str(tasks), iterations=2, mode="async", staleness=1, samples_per_task=GROUP,
                     concurrency=8, workers=2, device="cpu", max_tokens=8, step_caps=(3, 3, 3),
                     output_dir=str(tmp_path / "rl"))
    cfg.validate()
    # retry_lost = 0: a lost worker's episodes end as error records at once, for the loop to deal with.
    service = RolloutService(RunConfig(tasks=str(tasks), output_dir=str(tmp_path / "rl" / "rollouts"), concurrency=8,
                                       workers=2, retry_lost=0, telemetry=None, step_caps=(3, 3, 3)),
                             base_url=site_server)
    kills: list[int] = []
    killer = asyncio.ensure_future(kill_workers(service, kills))
    try:
        result = await asyncio.wait_for(run_loop(cfg, service=service), 480)
    finally:
        killer.cancel()
    assert len(kills) == 2, "the workers were not killed during the loop"
    reports = result.iterations
    assert all(r.infra_trained == 0 for r in reports)  # no record without the task's verdict was trained on
    outcomes = sum((Counter(r.outcomes) for r in reports), Counter())
    assert outcomes["error"] > 0 and outcomes["blocked"] == 2 * GROUP, outcomes  # lost episodes, the denied site
    assert sum(r.reruns for r in reports) > 0  # lost members were run again
    assert all(r.max_staleness <= cfg.staleness for r in reports)
    assert sum(r.groups_dropped.get("a member ended blocked", 0) for r in reports) == 2  # one per iteration

    # The audit trail, checked against the run directory itself: each trained group's episodes are exactly GROUP
    # records with the task's verdict; what was kept out is not among them.
    [run_dir] = (tmp_path / "rl" / "rollouts").iterdir()
    status = {r["episode_id"]: r["status"] for r in map(json.loads, (run_dir / "episodes.jsonl").open())}
    trained_groups = 0
    for it in range(cfg.iterations):
        for g in json.loads((tmp_path / "rl" / f"iter-{it:03d}" / "groups.json").read_text()):
            if not g["trained"]:
                assert g["task_id"] == "denied" or g["dropped"], g
                continue
            trained_groups += 1
            assert g["task_id"] != "denied"
            assert len(g["episodes"]) == GROUP and {status[e] for e in g["episodes"]} <= {"success", "failure"}, g
            assert all(status[x["episode_id"]] not in ("success", "failure") for x in g["excluded"])
    assert trained_groups == sum(r.groups_trained for r in reports) > 0
    assert {n for r in reports for n in r.group_sizes} == {GROUP}
