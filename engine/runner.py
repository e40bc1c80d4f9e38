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

from browserpool.auth import KeyFileError, ServerKeys
from browserpool.config import WorkerConfig
from browserpool.pool import BrowserPool, PoolConfig, PoolError
from engine.agent.prompts import AgentConfig
from engine.bounds import PageLimits
from engine.judge import JudgeConfig, RubricJudge
from engine.judging import JudgeQueue, submit_records
from engine.miniwob import is_miniwob_spec, load_miniwob_tasks
from engine.rollout import REWARD_MODES, EpisodeStatus, Rollout, RolloutContext, RolloutSettings
from engine.stats import RunStats
from engine.store import RunStore, episode_key, finished_keys, read_records
from engine.tasks import BUNDLED_TASKS, Task, load_tasks
from engine.telemetry import TelemetryPublisher, resolve_endpoint
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
    # CURVE for sockets on tcp (the worker socket, telemetry): the engine's secret key file and the allowed
    # client keys (a directory of *.key files or one file); ``insecure``: tcp without authentication.
    server_key: str | None = None
    allow_keys: str | None = None
    insecure: bool = False
    worker: WorkerConfig = field(default_factory=lambda: WorkerConfig(endpoint=""))
    memory_sample_s: float = 5.0
    agent: AgentConfig = field(default_factory=AgentConfig)  # the model backends' agent protocol
    sampling: SamplingParams = field(default_factory=SamplingParams)
    backend: BackendConfig = field(default_factory=BackendConfig)
    reward: str = "auto"  # auto | judge | program (auto: the page's or the task's own checks, else the judge)
    judge: JudgeConfig = field(default_factory=JudgeConfig)
    # Stragglers: once this fraction of the run has a record, the rest get `straggler_grace_s` more, then end
    # with an error record that says so. None: off (the default for the test split: evaluations wait).
    straggler_fraction: float | None = None
    straggler_grace_s: float = 30.0
    # Live telemetry for `webgym-engine monitor`: "ipc" (a socket in the run directory), "tcp://HOST:PORT"
    # (port may be *), or None (off). Costs nothing measurable with no monitor attached.
    telemetry: str | None = "ipc"
    # Resource bounds. An episode that runs past episode_timeout_s (wall clock, from its first browser lease,
    # retries included) ends with an error record of kind episode_timeout; one policy call (its backend's
    # retries included) that takes longer than policy_step_timeout_s ends its episode with kind
    # policy_timeout. None: no cap. page_limits: caps on page texts copied into prompts and records.
    # Why an error record and not a recorded `wait`: a wait the model never chose (no reply, no tokens) would
    # enter training data as the model's own action, and a server that hung once mostly hangs again; an error
    # record keeps the trajectory honest, is left out of training like any error, and --resume can rerun it.
    episode_timeout_s: float | None = 900.0
    policy_step_timeout_s: float | None = 300.0
    page_limits: PageLimits = field(default_factory=PageLimits)

    def rollout_settings(self, policy_version: int = 0) -> RolloutSettings:
        """The per-rollout settings of this run (every client of the core uses these)."""
        return RolloutSettings(split=self.split, retry_lost=self.retry_lost, mode=self.mode,
                               policy_version=policy_version, reward=self.reward,
                               episode_timeout_s=self.episode_timeout_s,
                               policy_step_timeout_s=self.policy_step_timeout_s, page_limits=self.page_limits)

    def __post_init__(self) -> None:
        for name in ("episode_timeout_s", "policy_step_timeout_s"):
            value = getattr(self, name)
            if value is not None and value <= 0:
                setattr(self, name, None)  # 0 (the CLI's "off") or less: no cap
        if self.mode not in ("async", "sync"):
            raise ValueError(f"mode must be 'async' or 'sync', not {self.mode!r}")
        if self.reward not in REWARD_MODES:
            raise ValueError(f"reward must be one of {REWARD_MODES}, not {self.reward!r}")
        if self.reward == "judge" and not self.judge.base_url:
            raise ValueError("--reward judge needs --judge-base-url and --judge-model")
        if self.straggler_fraction is not None and not 0 < self.straggler_fraction <= 1:
            raise ValueError("the straggler fraction must be in (0, 1]")
        if self.concurrency < 1 or self.workers < 1:
            raise ValueError("concurrency and workers must be at least 1")
        if self.telemetry == "off":
            self.telemetry = None
        if self.telemetry is not None and not (self.telemetry == "ipc" or self.telemetry.startswith(("tcp://", "ipc://"))):
            raise ValueError(f"--telemetry must be ipc, tcp://HOST:PORT, ipc://PATH or off, not {self.telemetry!r}")


def plan_episodes(tasks: list[Task], episodes: int | None, done: set[str]) -> list[tuple[Task, int]]:
    """Which (task, sample) pairs to run: each task once, or cycling until ``episodes``; minus ``done``."""
    n = episodes if episodes is not None else len(tasks)
    plan = [(tasks[i % len(tasks)], i // len(tasks)) for i in range(n)]
    return [(t, s) for t, s in plan if episode_key(t.task_id, s) not in done]


class Engine:
    """Runs a list of episodes against a started pool and policy, writing records to a store."""

    def __init__(self, cfg: RunConfig, pool: BrowserPool, policy: Policy, store: RunStore,
                 stats: RunStats | None = None,
                 on_status: Callable[[EpisodeStatus], None] | None = None,
                 judge: RubricJudge | None = None) -> None:
        self.cfg = cfg
        self.stats = stats or RunStats()
        self.judge_queue = (JudgeQueue(judge, store, on_verdict=lambda j, _: self.stats.record_verdict(j))
                            if judge is not None else None)
        self.ctx = RolloutContext(
            pool=pool, policy=policy, policy_slots=asyncio.Semaphore(cfg.policy_concurrency),
            store=store, stats=self.stats,
            settings=cfg.rollout_settings(),
            on_status=on_status, judge=self.judge_queue)

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
            if self.judge_queue is not None:
                await self.judge_queue.drain()
        finally:
            sampler.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await sampler
            self.stats.worker_restarts = self.ctx.pool.restarts
            self.stats.finished_at = time.monotonic()
        if self.ctx.pool.fatal is not None:
            # Every episode has its (error) record by now; the run itself must not look like it went well.
            raise PoolError(f"the browser pool failed: {self.ctx.pool.fatal!r}") from self.ctx.pool.fatal
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
        runners = [asyncio.ensure_future(runner()) for _ in range(n)]
        watcher = (asyncio.ensure_future(self._cut_stragglers(rollouts, runners))
                   if self.cfg.straggler_fraction is not None else None)
        try:
            await asyncio.gather(*runners, return_exceptions=watcher is not None)
        finally:
            if watcher is not None:
                watcher.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await watcher
        for r in rollouts:  # the episodes the watcher cut (in flight or never started)
            if not r.finished:
                await r.cut(self._straggler_reason)

    @property
    def _straggler_reason(self) -> str:
        return (f"straggler: cut {self.cfg.straggler_grace_s:g} s after {self.cfg.straggler_fraction:.0%} "
                "of the run had finished")

    async def _cut_stragglers(self, rollouts: list[Rollout], runners: list[asyncio.Future[None]]) -> None:
        """Once the set fraction of episodes has a record, wait the grace period, then stop the rest."""
        assert self.cfg.straggler_fraction is not None
        need = self.cfg.straggler_fraction * len(rollouts)
        while sum(r.finished for r in rollouts) < need:
            await self.stats.wait_for_episode()
        await asyncio.sleep(self.cfg.straggler_grace_s)
        for task in runners:
            task.cancel()

    async def _run_sync(self, rollouts: list[Rollout]) -> None:
        for start in range(0, len(rollouts), self.cfg.concurrency):
            batch = rollouts[start:start + self.cfg.concurrency]
            while active := [r for r in batch if not r.finished]:
                await asyncio.gather(*(r.advance() for r in active))

    async def _sample_memory(self) -> None:
        # Reading PSS costs ~2 ms of kernel time per Chromium process, so the interval stretches to
        # keep the sampler under ~2% of one core however many renderers there are (on a machine that
        # Chromium saturates, this was the largest fixed cost of the engine process).
        while True:
            t0 = time.monotonic()
            pss = await asyncio.to_thread(self.ctx.pool.browser_pss_bytes)
            self.stats.peak_browser_pss = max(self.stats.peak_browser_pss, pss)
            await asyncio.sleep(max(self.cfg.memory_sample_s, 50 * (time.monotonic() - t0)))


def load_task_source(spec: str, base_url: str | None) -> list[Task]:
    """Tasks from a task file, or MiniWoB++ tasks for ``miniwob`` / ``miniwob:name,...`` (served at base_url)."""
    if is_miniwob_spec(spec):
        if base_url is None:
            raise ValueError("MiniWoB++ tasks need the site server (its pages are served there)")
        return load_miniwob_tasks(spec, base_url)
    return load_tasks(spec, base_url)


def new_run_dir(output_dir: str) -> Path:
    """A fresh, time-stamped run directory under ``output_dir``."""
    stamp = time.strftime("%Y%m%d-%H%M%S")
    base = Path(output_dir) / f"run-{stamp}"
    path, i = base, 1
    while path.exists():
        path, i = Path(f"{base}-{i}"), i + 1
    path.mkdir(parents=True)
    return path


def server_keys(cfg: RunConfig) -> ServerKeys | None:
    """The engine's CURVE keys for its tcp sockets, or None when none were given."""
    if cfg.server_key is None:
        if cfg.allow_keys is not None:
            raise KeyFileError("--allow-keys needs --server-key (the engine's own secret key)")
        return None
    return ServerKeys.load(cfg.server_key, cfg.allow_keys)


def pool_config(cfg: RunConfig, log_path: str | None) -> PoolConfig:
    per_worker = -(-cfg.concurrency // cfg.workers)
    return PoolConfig(workers=cfg.workers, worker=cfg.worker, listen=cfg.listen, spawn=cfg.spawn_workers,
                      max_episodes_per_worker=max(2 * per_worker, per_worker + 4),
                      ops_per_worker=cfg.ops_per_worker, log_path=log_path,
                      server_keys=server_keys(cfg), insecure=cfg.insecure,
                      secret_env=(cfg.backend.api_key_env, cfg.judge.api_key_env))


async def run(cfg: RunConfig, policy: Policy, base_url: str | None,
              on_start: Callable[[Engine, Path], Any] | None = None,
              on_status: Callable[[EpisodeStatus], None] | None = None) -> tuple[RunStats, Path]:
    """Load tasks, open the run directory, start the pool and policy, run, and shut down cleanly."""
    tasks = load_task_source(cfg.tasks, base_url)
    run_dir = Path(cfg.run_dir) if cfg.run_dir else new_run_dir(cfg.output_dir)
    cfg.run_dir = str(run_dir)
    store = RunStore(run_dir)  # takes the run directory's writer lock (RunDirBusy if another process has it)
    try:
        records = read_records(run_dir)
        done = finished_keys(run_dir, records)
        # Resuming: frames of attempts that never got a record (the run was killed or interrupted mid-episode) go,
        # so an episode's rerun never mixes its screenshots with a dead attempt's.
        stale_frames = store.remove_unrecorded_frames(records)
        plan = plan_episodes(tasks, cfg.episodes, done)
        store.write_manifest({**asdict(cfg), "policy_info": policy.describe(), "sites_base_url": base_url,
                              "resumed_with": len(done), "removed_stale_frames": len(stale_frames)})
        pool = BrowserPool(pool_config(cfg, str(run_dir / "workers.log")))
        judge = make_judge(cfg)
    except BaseException:
        store.close()
        raise
    # Resuming with a judge: records still waiting for a verdict (the judge failed, or the run ended first).
    pending = [r for r in records if r.get("status") == "judge_pending"] if judge is not None else []
    rejudging: JudgeQueue | None = None
    telemetry: TelemetryPublisher | None = None
    try:
        telemetry = _make_telemetry(cfg, run_dir, plan)  # first: a monitor can attach while the pool starts
        if telemetry is not None:
            on_status = _both(telemetry.on_status, on_status)
        await pool.start()
        await policy.start()
        if judge is not None:
            await judge.start()
        engine = Engine(cfg, pool, policy, store, on_status=on_status, judge=judge)
        if telemetry is not None:
            telemetry.attach(engine)
        if on_start:
            on_start(engine, run_dir)
        if pending and judge is not None:
            rejudging = JudgeQueue(judge, store, max_episodes=cfg.judge.concurrency)
            submit_records(rejudging, run_dir, pending)
        stats = await engine.run(plan)
        if rejudging is not None:
            await rejudging.drain()
    finally:
        if telemetry is not None:
            await telemetry.close()
        if judge is not None:
            await judge.close()
        await policy.close()
        await pool.close()
        store.close()
    return stats, run_dir


def _make_telemetry(cfg: RunConfig, run_dir: Path, plan: list[tuple[Task, int]]) -> TelemetryPublisher | None:
    """The telemetry publisher (bound and ticking, its endpoint in RUN_DIR/telemetry.json), or None when off."""
    if not cfg.telemetry:
        return None
    telemetry = TelemetryPublisher(resolve_endpoint(cfg.telemetry, run_dir), run_dir,
                                   server_keys=server_keys(cfg), insecure=cfg.insecure)
    telemetry.add_episodes((episode_key(t.task_id, s), t.task_id) for t, s in plan)
    telemetry.start()
    return telemetry


def _both(first: Callable[[EpisodeStatus], None],
          second: Callable[[EpisodeStatus], None] | None) -> Callable[[EpisodeStatus], None]:
    """One status callback that calls both."""
    if second is None:
        return first

    def call(status: EpisodeStatus) -> None:
        first(status)
        second(status)
    return call


def make_judge(cfg: RunConfig) -> RubricJudge | None:
    """The judge, when the reward mode may use it; verdicts are cached beside the run directory, shared by runs."""
    if cfg.reward == "program" or not cfg.judge.base_url:
        return None
    if cfg.judge.cache_dir is None:
        cfg.judge.cache_dir = str(Path(cfg.run_dir or cfg.output_dir).parent / "judge-cache")
    return RubricJudge(cfg.judge)
