"""The engine: one event loop, an episode queue feeding up to ``concurrency`` rollouts (level 1),
bounded FIFO queues for policy calls and per-worker browser operations (level 2).

``mode="async"``: every rollout advances on its own; no barrier between steps or episodes.
``mode="sync"``: the naive baseline, for benchmarks only: a batch of ``concurrency`` episodes advances
in lock-step, every step waiting for the slowest episode of the batch.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from browserpool.config import WorkerConfig
from browserpool.pool import BrowserPool, PoolConfig
from engine.agent.prompts import AgentConfig
from engine.rollout import EpisodeStatus, Rollout, RolloutContext, RolloutSettings
from engine.stats import RunStats
from engine.store import RunStore, episode_key, finished_keys
from engine.tasks import BUNDLED_TASKS, Task, load_tasks
from policy.base import Policy
from policy.model import SamplingParams
from policy.registry import BackendConfig


@dataclass
class RunConfig:
    """Everything one run needs; stored in the run's manifest."""

    tasks: str = str(BUNDLED_TASKS)
    policy: str = "scripted"
    concurrency: int = 32
    workers: int = max(1, os.cpu_count() or 1)
    mode: str = "async"
    output_dir: str = "runs"
    run_dir: str | None = None  # set by --resume, or generated under output_dir
    episodes: int | None = None  # default: every task once; more cycles over the tasks
    split: str = "train"
    retry_lost: int = 1
    seed: int = 0
    policy_concurrency: int = 128
    ops_per_worker: int = 16
    listen: str | None = None
    spawn_workers: bool = True
    worker: WorkerConfig = field(default_factory=lambda: WorkerConfig(endpoint=""))
    memory_sample_s: float = 2.0
    agent: AgentConfig = field(default_factory=AgentConfig)  # the model backends' agent protocol
    sampling: SamplingParams = field(default_factory=SamplingParams)
    backend: BackendConfig = field(default_factory=BackendConfig)

    def __post_init__(self) -> None:
        if self.mode not in ("async", "sync"):
            raise ValueError(f"mode must be 'async' or 'sync', not {self.mode!r}")
        if self.concurrency < 1 or self.workers < 1:
            raise ValueError("concurrency and workers must be at least 1")


def plan_episodes(tasks: list[Task], episodes: int | None, done: set[str]) -> list[tuple[Task, int]]:
    """Which (task, sample) pairs to run: each task once, or cycling until ``episodes``; minus ``done``."""
    n = episodes if episodes is not None else len(tasks)
    plan = [(tasks[i % len(tasks)], i // len(tasks)) for i in range(n)]
    return [(t, s) for t, s in plan if episode_key(t.task_id, s) not in done]


class Engine:
    """Runs a list of episodes against a started pool and policy, writing records to a store."""

    def __init__(self, cfg: RunConfig, pool: BrowserPool, policy: Policy, store: RunStore,
                 stats: RunStats | None = None,
                 on_status: Callable[[EpisodeStatus], None] | None = None) -> None:
        self.cfg = cfg
        self.stats = stats or RunStats()
        self.ctx = RolloutContext(
            pool=pool, policy=policy, policy_slots=asyncio.Semaphore(cfg.policy_concurrency),
            store=store, stats=self.stats,
            settings=RolloutSettings(split=cfg.split, retry_lost=cfg.retry_lost, mode=cfg.mode),
            on_status=on_status)

    async def run(self, plan: list[tuple[Task, int]]) -> RunStats:
        """Run every planned episode to exactly one record."""
        self.stats.total += len(plan)
        rollouts = [Rollout(t, s, self.ctx) for t, s in plan]
        sampler = asyncio.ensure_future(self._sample_memory())
        try:
            if self.cfg.mode == "sync":
                await self._run_sync(rollouts)
            else:
                await self._run_async(rollouts)
        finally:
            sampler.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await sampler
            self.stats.worker_restarts = self.ctx.pool.restarts
            self.stats.finished_at = time.monotonic()
        return self.stats

    async def _run_async(self, rollouts: list[Rollout]) -> None:
        queue: asyncio.Queue[Rollout] = asyncio.Queue()
        for r in rollouts:
            queue.put_nowait(r)

        async def runner() -> None:
            while True:
                try:
                    r = queue.get_nowait()
                except asyncio.QueueEmpty:
                    return
                await r.run()

        n = min(self.cfg.concurrency, len(rollouts))
        await asyncio.gather(*(runner() for _ in range(n)))

    async def _run_sync(self, rollouts: list[Rollout]) -> None:
        for start in range(0, len(rollouts), self.cfg.concurrency):
            batch = rollouts[start:start + self.cfg.concurrency]
            while active := [r for r in batch if not r.finished]:
                await asyncio.gather(*(r.advance() for r in active))

    async def _sample_memory(self) -> None:
        # Reading PSS costs ~2 ms of kernel time per Chromium process, so the interval stretches to
        # keep the sampler under ~5% of one core however many renderers there are.
        while True:
            t0 = time.monotonic()
            pss = await asyncio.to_thread(self.ctx.pool.browser_pss_bytes)
            self.stats.peak_browser_pss = max(self.stats.peak_browser_pss, pss)
            await asyncio.sleep(max(self.cfg.memory_sample_s, 20 * (time.monotonic() - t0)))


def new_run_dir(output_dir: str) -> Path:
    """A fresh, time-stamped run directory under ``output_dir``."""
    stamp = time.strftime("%Y%m%d-%H%M%S")
    base = Path(output_dir) / f"run-{stamp}"
    path, i = base, 1
    while path.exists():
        path, i = Path(f"{base}-{i}"), i + 1
    path.mkdir(parents=True)
    return path


def pool_config(cfg: RunConfig, log_path: str | None) -> PoolConfig:
    per_worker = -(-cfg.concurrency // cfg.workers)
    return PoolConfig(workers=cfg.workers, worker=cfg.worker, listen=cfg.listen, spawn=cfg.spawn_workers,
                      max_episodes_per_worker=max(2 * per_worker, per_worker + 4),
                      ops_per_worker=cfg.ops_per_worker, log_path=log_path)


async def run(cfg: RunConfig, policy: Policy, base_url: str | None,
              on_start: Callable[[Engine, Path], Any] | None = None,
              on_status: Callable[[EpisodeStatus], None] | None = None) -> tuple[RunStats, Path]:
    """Load tasks, open the run directory, start the pool and policy, run, and shut down cleanly."""
    tasks = load_tasks(cfg.tasks, base_url)
    run_dir = Path(cfg.run_dir) if cfg.run_dir else new_run_dir(cfg.output_dir)
    cfg.run_dir = str(run_dir)
    store = RunStore(run_dir)
    done = finished_keys(run_dir)
    plan = plan_episodes(tasks, cfg.episodes, done)
    store.write_manifest({**asdict(cfg), "policy_info": policy.describe(), "sites_base_url": base_url,
                          "resumed_with": len(done)})
    pool = BrowserPool(pool_config(cfg, str(run_dir / "workers.log")))
    try:
        await pool.start()
        await policy.start()
        engine = Engine(cfg, pool, policy, store, on_status=on_status)
        if on_start:
            on_start(engine, run_dir)
        stats = await engine.run(plan)
    finally:
        await policy.close()
        await pool.close()
        store.close()
    return stats, run_dir
