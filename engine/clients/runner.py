"""``webgym-engine run`` as a client of the engine core: plan the episodes of a task source (resuming a run
directory's unfinished ones), hand them to the core with one policy, wait for every record.

``RunConfig.mode="async"``: every rollout advances on its own; no barrier between steps or episodes.
``RunConfig.mode="sync"``: the naive baseline, for benchmarks only: a batch of ``concurrency`` episodes
advances in lock-step, every step waiting for the slowest episode of the batch.

An asynchronous run starts the episodes allowed the most steps first (``RunConfig.order``), so that the last
minutes of a run are not one long episode running alone.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from browserpool.pool import BrowserPool
from engine.agent.policy_api import Policy
from engine.core.config import RunConfig
from engine.core.core import EngineCore
from engine.episode.status import EpisodeStatus
from engine.rewards.judge import RubricJudge
from engine.rewards.judge_queue import JudgeQueue, submit_records
from engine.store.records import EpisodeRecord
from engine.store.run_dir import episode_key, finished_keys, read_records
from engine.store.stats import RunStats
from engine.tasks.loading import load_tasks
from engine.tasks.miniwob import is_miniwob_spec, load_miniwob_tasks
from engine.tasks.schema import StepCaps, Task


def plan_episodes(tasks: list[Task], episodes: int | None, done: set[str]) -> list[tuple[Task, int]]:
    """Which (task, sample) pairs to run: each task once, or cycling until ``episodes``; minus ``done``."""
    n = episodes if episodes is not None else len(tasks)
    plan = [(tasks[i % len(tasks)], i // len(tasks)) for i in range(n)]
    return [(t, s) for t, s in plan if episode_key(t.task_id, s) not in done]


def longest_first(plan: list[tuple[Task, int]], split: str, caps: StepCaps | None) -> list[tuple[Task, int]]:
    """``plan`` with the episodes allowed the most steps first; equal caps keep their order (a stable sort).

    A run ends when its last episode does. A long episode started last runs on alone while the other rollouts have
    nothing left to do; started first, it runs while the short ones fill in around it (longest-processing-time-first
    scheduling, with the step cap as the length known before the run)."""
    return sorted(plan, key=lambda p: -p[0].step_cap(split, caps))


def run_order(plan: list[tuple[Task, int]], cfg: RunConfig) -> list[tuple[Task, int]]:
    """The order in which ``run`` starts ``plan``: ``cfg.order``, except that the lock-step baseline keeps the task
    file's order (its batches are the original's)."""
    if cfg.mode == "async" and cfg.order == "longest_first":
        return longest_first(plan, cfg.split, cfg.run_step_caps())
    return plan


def load_task_source(spec: str, base_url: str | None) -> list[Task]:
    """Tasks from a task file, or MiniWoB++ tasks for ``miniwob`` / ``miniwob:name,...`` (served at base_url)."""
    if is_miniwob_spec(spec):
        if base_url is None:
            raise ValueError("MiniWoB++ tasks need the site server (its pages are served there)")
        return load_miniwob_tasks(spec, base_url)
    return load_tasks(spec, base_url)


async def run(cfg: RunConfig, policy: Policy, base_url: str | None, *, judge: RubricJudge | None = None,
              on_start: Callable[[EngineCore, Path], Any] | None = None,
              on_status: Callable[[EpisodeStatus], None] | None = None,
              manifest: dict[str, Any] | None = None, pool: BrowserPool | None = None) -> tuple[RunStats, Path]:
    """Run every planned episode of ``cfg.tasks`` with ``policy`` to exactly one record; shut down cleanly.

    ``cfg.run_dir`` set: resume that run directory (finished episodes are kept, unfinished ones rerun, records
    still waiting for a verdict are judged again). ``pool``: an already started browser pool to run on (left
    running; its workers' settings are its own, not ``cfg.worker``'s), e.g. one that several runs share. Returns
    the stats and the run directory."""
    tasks = load_task_source(cfg.tasks, base_url)
    core = EngineCore(cfg, judge=judge, base_url=base_url, pool=pool)
    if on_status is not None:
        core.on_status(on_status)
    resuming = Path(cfg.run_dir) if cfg.run_dir else None
    records = read_records(resuming) if resuming is not None and resuming.exists() else []
    done = finished_keys(resuming, records) if resuming is not None and resuming.exists() else set()
    plan = run_order(plan_episodes(tasks, cfg.episodes, done), cfg)
    try:
        run_dir = await core.start({"policy": policy.name, "policy_info": policy.describe(),
                                    "resumed_with": len(done), **(manifest or {})})
        # Resuming: frames of attempts that never got a record (the run was killed mid-episode) go, so an
        # episode's rerun never mixes its screenshots with a dead attempt's.
        core.store.remove_unrecorded_frames(records)
        await core.start_policy(policy)
        core.stats.restart_clock()  # steps/s counts from the first episode, not from browser and model start
        ctx = core.context(policy)
        announced = core.announce(plan)
        if on_start:
            on_start(core, run_dir)
        rejudging = _rejudge_pending(core, run_dir, records)
        await core.run_all(ctx, announced)
        if rejudging is not None:
            await rejudging.drain()
    finally:
        await core.close()
    return core.stats, run_dir


def _rejudge_pending(core: EngineCore, run_dir: Path, records: list[EpisodeRecord]) -> JudgeQueue | None:
    """Resuming with a judge: queue the records still waiting for a verdict (the judge failed, or the run ended)."""
    pending = [r for r in records if r.get("status") == "judge_pending"]
    if core.judge is None or not pending:
        return None
    queue = JudgeQueue(core.judge, core.store, max_episodes=core.judge.cfg.concurrency)
    submit_records(queue, run_dir, pending)
    return queue
