"""The engine core: the one object that owns the browser pool, the bundled-site server, the run directory's
store, the episode scheduler, telemetry, memory sampling, the judge queue and the run's statistics.

Everything else is a thin client of it (the shape of vLLM's v1 engine core and its clients):

- :func:`engine.clients.runner.run` (``webgym-engine run``): plans the episodes of a task file and waits for them;
- :class:`engine.clients.service.RolloutService`: a trainer submits episodes with its policy and reads records back;
- :class:`engine.clients.env.AsyncWebEnv` / :class:`engine.clients.gym_env.WebEnv`: a trainer drives every step itself.

A feature of the core (telemetry and the monitor, sync mode, stragglers, memory sampling, judging, retries of
lost workers, the network policy) therefore works, and is counted, the same way through every client::

    core = EngineCore(RunConfig(concurrency=64), serve_sites=True)
    await core.start()
    rollouts = core.submit(core.context(policy), [(task, 0), (task, 1)])
    await core.wait(rollouts)
    await core.close()
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import asdict
from pathlib import Path
from typing import Any, TypeVar

from browserpool.pool import BrowserPool, PoolError
from engine.agent.policy_api import Policy
from engine.core.builders import new_run_dir, pool_config, server_keys
from engine.core.config import RunConfig
from engine.core.hooks import CoreHooks, RecordHook
from engine.core.plan_feed import PlanFeeder, PlannedEpisode
from engine.core.site_guard import SiteGuard
from engine.core.stragglers import StragglerCut, straggler_reason, watch
from engine.episode.context import RolloutContext, RolloutSettings
from engine.episode.rollout import Rollout
from engine.episode.status import EpisodeStatus
from engine.episode.traffic_plan import TrafficPlan
from engine.rewards.judge import RubricJudge
from engine.rewards.judge_queue import JudgeQueue
from engine.sites.server import SiteServer
from engine.store.records import EpisodeRecord, Judgement, RecordErrorKind
from engine.store.run_dir import RunStore, StoreFailed, episode_key, merge_judgement
from engine.store.stats import RunStats
from engine.tasks.schema import Task
from engine.telemetry.publisher import CoreGauges, TelemetryPublisher, resolve_endpoint
from engine.web.blocklist import Blocklist
from engine.web.domains import DomainQueue, domain_of

T = TypeVar("T")
log = logging.getLogger(__name__)


class EngineCore:
    """One engine (module docstring). ``start()`` before use, ``close()`` after; or ``async with``.

    ``judge``: the rubric judge for episodes without programmatic checks (the core starts and closes it).
    ``base_url``: where the task sites are served; ``serve_sites``: start the bundled-site server (its URL
    becomes ``base_url``). ``pool`` / ``store``: an already started pool or an open store to use instead of
    the core's own (the core then neither starts nor closes them).
    """

    def __init__(self, cfg: RunConfig, *, judge: RubricJudge | None = None, base_url: str | None = None,
                 serve_sites: bool = False, site_mounts: dict[str, Path] | None = None,
                 pool: BrowserPool | None = None, store: RunStore | None = None) -> None:
        if cfg.reward == "judge" and judge is None:
            raise ValueError("RunConfig.reward 'judge' needs a judge (EngineCore(judge=RubricJudge(...)))")
        self.cfg = cfg
        self.judge = judge if cfg.reward != "program" else None
        self.guard = SiteGuard(base_url, cfg.domain_rate)
        self._serve_sites = serve_sites and base_url is None
        self._site_mounts = site_mounts
        self.stats = RunStats()
        self.policy_slots = asyncio.Semaphore(cfg.policy_concurrency)  # the policy queue (level 2), FIFO
        self.pool: BrowserPool = pool  # type: ignore[assignment]  # set by start() when not given
        self.store: RunStore = store  # type: ignore[assignment]
        self._own_pool, self._own_store = pool is None, store is None
        self.run_dir: Path | None = store.dir if store is not None else None
        self.judge_queue: JudgeQueue | None = None
        self.traffic: TrafficPlan | None = None  # set by start() when the run records or replays traffic
        self.telemetry: TelemetryPublisher | None = None
        self._sites: SiteServer | None = None
        self.hooks = CoreHooks()
        self._policies: dict[int, tuple[Policy, asyncio.Future[None]]] = {}
        self._samples: dict[str, int] = {}
        self._pending: DomainQueue[Rollout] = DomainQueue(lambda r: domain_of(r.task.website), cfg.domain_limit,
                                                           exempt=lambda r: self.guard.is_own(r.task.website))
        self._jobs: dict[str, asyncio.Task[EpisodeRecord]] = {}
        self._runners: list[asyncio.Task[None]] = []
        self._pool_figures: asyncio.Task[None] | None = None
        self._store_watch: asyncio.Task[None] | None = None
        self._started = False

    @property
    def base_url(self) -> str | None:
        """Where the task sites are served (the bundled-site server's URL once it has started)."""
        return self.guard.base_url

    # --- lifecycle ------------------------------------------------------------------------------------
    async def __aenter__(self) -> EngineCore:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def start(self, manifest: dict[str, Any] | None = None) -> Path:
        """Open the run directory (a new one, or ``cfg.run_dir`` to resume), write the manifest, start the sites,
        telemetry (first: a monitor can attach while browsers start), the pool, the judge, the memory sampler and
        the episode runners. Returns the run directory."""
        try:
            if self._serve_sites:
                self._sites = SiteServer(mounts=self._site_mounts)
                self.guard.base_url = self._sites.__enter__().base_url
            if self.store is None:
                self.run_dir = Path(self.cfg.run_dir) if self.cfg.run_dir else new_run_dir(self.cfg.output_dir)
                self.store = RunStore(self.run_dir)  # the directory's writer lock (RunDirBusy if taken)
            assert self.run_dir is not None
            traffic = self.cfg.traffic_settings()
            if traffic.active:
                self.traffic = TrafficPlan(traffic, self.run_dir, self.base_url)
            self.guard.blocklist = Blocklist(self.cfg.blocklist or self.run_dir / "blocklist.json",
                                             self.cfg.blocklist_ttl_s,
                                             on_error=lambda problem: log.warning("blocklist: %s", problem))
            self.store.write_manifest({**asdict(self.cfg), "run_dir": str(self.run_dir),
                                       "sites_base_url": self.base_url, **(manifest or {})})
            if self.cfg.telemetry:
                self.telemetry = TelemetryPublisher(resolve_endpoint(self.cfg.telemetry, self.run_dir), self.run_dir,
                                                    server_keys=server_keys(self.cfg), insecure=self.cfg.insecure)
                self.hooks.status_hooks.insert(0, self.telemetry.on_status)
            if self.pool is None:
                secrets = [self.judge.cfg.api_key_env] if self.judge is not None else []
                self.pool = BrowserPool(pool_config(self.cfg, str(self.run_dir / "workers.log"), secrets))
            if self.telemetry is not None:
                self.telemetry.attach(self.gauges())
                self.telemetry.start()
            if self._own_pool:
                await self.pool.start()
            if self.judge is not None:
                await self.judge.start()
                self.judge_queue = JudgeQueue(self.judge, self.store, on_verdict=self._on_verdict)
            self._pool_figures = asyncio.ensure_future(self._follow_pool())
            self._runners = self._start_runners()
            self._store_watch = asyncio.ensure_future(self._stop_when_the_store_fails())
            self._started = True
        except BaseException:
            await self.close()
            raise
        return self.run_dir

    async def close(self) -> None:
        """Stop the runners (episodes in flight end without a record, so a resume reruns them), drain the judge,
        close the policies, telemetry, the pool, the store and the sites."""
        tasks = [*self._runners, *([self._store_watch] if self._store_watch else [])]
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._runners, self._store_watch = [], None
        for job in list(self._jobs.values()):  # episodes the step-level environments still run
            job.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await job
        if self._pool_figures is not None:
            self._pool_figures.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._pool_figures
            self._pool_figures = None
        if self.judge_queue is not None:
            await self.judge_queue.drain()
        self._finish_stats()
        try:
            if self.telemetry is not None:
                await self.telemetry.close()
            if self.judge is not None:
                await self.judge.close()
            for policy, _ in self._policies.values():
                await policy.close()
            self._policies.clear()
            if self.pool is not None and self._own_pool:
                await self.pool.close()
        finally:
            if self.store is not None and self._own_store:
                self.store.close()
            if self._sites is not None:
                self._sites.__exit__(None, None, None)
                self._sites = None
            self._started = False

    def gauges(self) -> CoreGauges:
        """What telemetry reads of this core: its counters, pool, policy queue and judge queue."""
        return CoreGauges(stats=self.stats, pool=self.pool, policy_slots=self.policy_slots,
                          policy_cap=self.cfg.policy_concurrency, judge_pending=self._judge_pending)

    def _judge_pending(self) -> int:
        return self.judge_queue.pending if self.judge_queue is not None else 0

    # --- hooks ----------------------------------------------------------------------------------------
    def on_status(self, hook: Callable[[EpisodeStatus], None]) -> None:
        """Call ``hook`` with every status change of every rollout (a progress display, a test)."""
        self.hooks.status_hooks.append(hook)

    def on_record(self, hook: RecordHook) -> Callable[[], None]:
        """Call ``hook(rollout, record)`` when a rollout run by the core's runners ends, and again with the merged
        record when a judged episode's verdict arrives (its status is then no longer ``judge_pending``). Returns
        what removes the hook."""
        return self.hooks.on_record(hook)

    def on_verdict(self, episode_id: str, hook: Callable[[EpisodeRecord], None] | None) -> None:
        """Call ``hook(merged record)`` once when this judged episode's verdict arrives (register it before the
        episode can end: a cached verdict may come at once); None forgets the hook."""
        self.hooks.on_verdict(episode_id, hook)

    def publish_status(self, status: EpisodeStatus) -> None:
        """Show an episode that a client runs itself, outside the core's rollouts (a lease of the HTTP browser
        server), in telemetry and to every status hook; call again with each change of ``status``."""
        self.hooks.status(status)

    def _on_verdict(self, judgement: Judgement, record: EpisodeRecord) -> None:
        self.stats.record_verdict(judgement)
        merged = merge_judgement(record, judgement)
        if merged["status"] == "blocked":  # the judge saw the site block the agent
            website = str((record.get("task") or {}).get("website") or "")
            self.guard.block(website, "the judge's verdict: blocked", "judge")
        hook = self.hooks.take_verdict_hook(record["episode_id"])
        if hook is not None:
            hook(merged)

    # --- episodes -------------------------------------------------------------------------------------
    def context(self, policy: Policy, *, policy_version: int = 0, settings: RolloutSettings | None = None,
                policy_slots: asyncio.Semaphore | None = None) -> RolloutContext:
        """The services a rollout of ``policy`` uses (the core's pool, store, stats, judge and telemetry)."""
        if not self._started:
            raise RuntimeError("start the engine core first")
        return RolloutContext(pool=self.pool, policy=policy, policy_slots=policy_slots or self.policy_slots,
                              store=self.store, stats=self.stats,
                              settings=settings or self.cfg.rollout_settings(policy_version),
                              on_status=self.hooks.status, judge=self.judge_queue,
                              # no rate: no per-step URL checks
                              pace=self.guard.pace if self.guard.pacer.rate else None, traffic=self.traffic)

    def rollout(self, ctx: RolloutContext, task: Task, sample: int | None = None, *, announce: bool = True,
                episode_id: str | None = None) -> Rollout:
        """A new rollout of ``task`` (``sample``: the next unused index of the task when None), announced to
        telemetry and counted in the stats (``announce=False``: :meth:`announce` did it for its whole plan, and
        ``episode_id`` is the id it gave telemetry)."""
        sample = self._reserve_sample(task, sample)
        if announce:
            if self.telemetry is not None:
                episode_id = episode_key(task.task_id, sample)
                self.telemetry.add_episodes([(episode_id, task.task_id)])
            self.stats.total += 1
        return Rollout(task, sample, ctx, episode_id)

    def _reserve_sample(self, task: Task, sample: int | None) -> int:
        """``sample``, or the task's next unused sample number; either way counted as used."""
        if sample is None:
            sample = self._samples.get(task.task_id, 0)
        self._samples[task.task_id] = max(self._samples.get(task.task_id, 0), sample + 1)
        return sample

    def submit(self, ctx: RolloutContext, episodes: Iterable[tuple[Task, int | None]]) -> list[Rollout]:
        """Queue episodes for the core's runners (``concurrency`` at a time; lock-step batches in sync mode)."""
        rollouts = [self.rollout(ctx, task, sample) for task, sample in episodes]
        for r in rollouts:
            self.enqueue(r)
        return rollouts

    def enqueue(self, rollout: Rollout) -> None:
        """Queue a rollout made by :meth:`rollout` for the core's runners."""
        self._pending.put_nowait(rollout)

    async def wait(self, rollouts: list[Rollout]) -> None:
        """Until every one of ``rollouts`` has its record (cutting stragglers when the config says so), then
        until the judge has given every verdict it owes. Raises :class:`PoolError` when the pool failed."""
        waiting = asyncio.gather(*(r.ended.wait() for r in rollouts))
        watcher = self.watch_stragglers(rollouts)
        try:
            await self.unless_the_store_fails(waiting)
        finally:
            waiting.cancel()
            if watcher is not None:
                watcher.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await watcher
        await self._settle()

    async def _settle(self) -> None:
        """After a set of episodes has its records: until the judge has given every verdict it owes."""
        if self.judge_queue is not None:
            await self.judge_queue.drain()
        self._finish_stats()
        if self.pool.fatal is not None:
            # Every episode has its (error) record by now; the run itself must not look like it went well.
            raise PoolError(f"the browser pool failed: {self.pool.fatal!r}") from self.pool.fatal
        self.store.raise_if_failed()

    async def run_plan(self, policy: Policy, plan: Iterable[tuple[Task, int | None]]) -> RunStats:
        """Run episodes with one policy to their records (started first; steps/s counted from then)."""
        await self.start_policy(policy)
        self.stats.restart_clock()
        await self.run_all(self.context(policy), self.announce(plan))
        return self.stats

    def announce(self, plan: Iterable[tuple[Task, int | None]]) -> list[PlannedEpisode]:
        """Count a plan's episodes in the stats and show them in telemetry as not started; returns the plan with
        every sample number resolved and, with telemetry, the episode ids it was given, for :meth:`run_all` (a
        rollout then shares its id string with telemetry's, instead of holding a second copy for the run)."""
        announced: list[PlannedEpisode] = []
        for task, sample in plan:
            s = self._reserve_sample(task, sample)
            announced.append((task, s, None if self.telemetry is None else episode_key(task.task_id, s)))
        if self.telemetry is not None:
            self.telemetry.add_episodes((eid, task.task_id) for task, _, eid in announced if eid is not None)
        self.stats.total += len(announced)
        return announced

    async def run_all(self, ctx: RolloutContext, plan: list[PlannedEpisode]) -> None:
        """Run an announced plan to its records, as :meth:`submit` and :meth:`wait` would, but making each
        rollout only when there is room for it in the queue and letting it go once it has its record (memory flat
        over any number of episodes; see :mod:`engine.core.plan_feed`)."""
        await self.unless_the_store_fails(PlanFeeder(self, ctx, plan).run())
        await self._settle()

    async def unless_the_store_fails(self, awaitable: Awaitable[T]) -> T:
        """Await ``awaitable`` (which waits for records), or raise :class:`~engine.store.run_dir.StoreFailed` as soon as
        the run directory cannot be written: the records it waits for would never come (it is cancelled)."""
        store = self.store
        task = asyncio.ensure_future(awaitable)
        failed = asyncio.ensure_future(store.failed.wait())
        try:
            await asyncio.wait([task, failed], return_when=asyncio.FIRST_COMPLETED)
        finally:
            failed.cancel()
            if not task.done():
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        if task.cancelled() and store.failure is not None:
            raise store.failure
        return task.result()

    async def run_episode(self, rollout: Rollout,
                          on_verdict: Callable[[EpisodeRecord], None] | None = None) -> EpisodeRecord:
        """Run one rollout to its record in a task of its own (so that a straggler cut can stop it alone).
        ``on_verdict``: called with the merged record when the judge rewards this episode later."""
        await self.start_policy(rollout.ctx.policy)
        with self.hooks.awaiting_verdict(rollout, on_verdict):
            job = asyncio.ensure_future(rollout.run())
            self._jobs[rollout.episode_id] = job
            try:
                await asyncio.wait([job])
            finally:
                if not job.done():  # the caller was cancelled: so is the episode (no record: a resume reruns it)
                    job.cancel()
                    with contextlib.suppress(asyncio.CancelledError):
                        await job
                self._jobs.pop(rollout.episode_id, None)
            if not job.cancelled():
                return job.result()  # the record, or StoreFailed: the run directory could not be written
            if not rollout.cut_requested:  # the core is closing: no record, so that a resume reruns it
                raise asyncio.CancelledError
            await rollout.end_with_error(RecordErrorKind.STRAGGLER, straggler_reason(self.cfg))
        assert rollout.record is not None
        return rollout.record

    async def start_policy(self, policy: Policy) -> None:
        """Start ``policy`` once (shared by every rollout of it); the core closes it. Raises what start raised."""
        entry = self._policies.get(id(policy))
        if entry is None:
            entry = self._policies[id(policy)] = (policy, asyncio.ensure_future(policy.start()))
        await asyncio.shield(entry[1])

    def cut(self, rollouts: Iterable[Rollout]) -> None:
        """Stop these episodes: in flight ones are cancelled, queued ones end when a runner reaches them; each
        ends with a ``straggler`` error record."""
        for r in rollouts:
            if r.finished:
                continue
            r.cut_requested = True
            job = self._jobs.get(r.episode_id)
            if job is not None:
                job.cancel()

    # --- the scheduler --------------------------------------------------------------------------------
    def _start_runners(self) -> list[asyncio.Task[None]]:
        if self.cfg.mode == "sync":
            return [asyncio.ensure_future(self._sync_runner())]
        return [asyncio.ensure_future(self._runner()) for _ in range(self.cfg.concurrency)]

    async def _runner(self) -> None:
        # Asynchronous mode (level 1): each runner takes the next episode (of a domain with room) as soon as its
        # last one ends. A run directory that cannot be written stops it (_stop_when_the_store_fails): the
        # episode it ran has no record, for --resume.
        with contextlib.suppress(StoreFailed):
            while True:
                rollout = await self._pending.get()
                try:
                    await self._run_queued(rollout)
                finally:
                    self._pending.done(rollout)

    async def _run_queued(self, rollout: Rollout) -> None:
        if rollout.finished:
            return
        try:
            if rollout.cut_requested:
                await rollout.end_with_error(RecordErrorKind.STRAGGLER, straggler_reason(self.cfg))
            elif not await self.guard.skipped_as_blocked(rollout) and await self._policy_started(rollout):
                await self.run_episode(rollout, self.hooks.redelivery(rollout))
                self.guard.note_block(rollout)
        except StoreFailed:
            raise
        except Exception as exc:  # noqa: BLE001 - a fault of the engine's own loses neither the episode nor the runner
            await self._engine_fault(rollout, exc)
        finally:  # a runner cancelled just after the record was written still hands it on
            if rollout.record is not None:
                self.hooks.deliver(rollout)

    @staticmethod
    async def _engine_fault(rollout: Rollout, exc: Exception) -> None:
        """A runner met an error of the engine's own (a bug): log it, and end the episode with an ``internal``
        error record unless it has its record already. Called in the ``except`` block (the log takes its
        traceback)."""
        log.exception("episode %s: an error of the engine's own", rollout.episode_id)
        if rollout.record is None:
            await rollout.end_with_error(RecordErrorKind.INTERNAL, f"{type(exc).__name__}: {exc}")

    async def _policy_started(self, rollout: Rollout) -> bool:
        """Start the rollout's policy; a policy that cannot start ends its episodes (error records), not the
        engine."""
        try:
            await self.start_policy(rollout.ctx.policy)
        except Exception as exc:  # noqa: BLE001 - any failure of a policy's start
            await rollout.end_with_error(RecordErrorKind.POLICY, f"the policy did not start: {exc}")
            return False
        return True

    async def _sync_runner(self) -> None:
        # The synchronous baseline (benchmarks only): a batch of `concurrency` episodes advances in lock-step,
        # every phase waiting for the slowest episode of the batch. Stopped by a store failure as _runner is.
        with contextlib.suppress(StoreFailed):
            while True:
                await self._sync_batch()

    async def _sync_batch(self) -> None:
        batch = [await self._pending.get()]
        while len(batch) < self.cfg.concurrency and not self._pending.empty():
            batch.append(self._pending.get_nowait())
        live = [r for r in batch if await self._may_run_in_batch(r)]
        with contextlib.ExitStack() as verdicts:
            for r in live:
                verdicts.enter_context(self.hooks.awaiting_verdict(r, self.hooks.redelivery(r)))
            while active := [r for r in live if not r.finished]:
                await asyncio.gather(*(r.advance() for r in active))
        for r in batch:
            self._pending.done(r)
            self.guard.note_block(r)
            self.hooks.deliver(r)

    async def _may_run_in_batch(self, rollout: Rollout) -> bool:
        """Whether a lock-step batch runs this rollout: not skipped as blocked, its policy started (as in
        _run_queued, a fault of the engine's own ends it with an ``internal`` record)."""
        try:
            return not await self.guard.skipped_as_blocked(rollout) and await self._policy_started(rollout)
        except StoreFailed:
            raise
        except Exception as exc:  # noqa: BLE001 - see _run_queued
            await self._engine_fault(rollout, exc)
            return False

    def watch_stragglers(self, rollouts: list[Rollout]) -> asyncio.Task[None] | None:
        """A task that cuts the last of ``rollouts`` (:func:`engine.core.stragglers.watch`; cancel it once they all
        have records), or None when ``cfg`` cuts no stragglers."""
        return watch(StragglerCut.for_run(self.cfg, len(rollouts)), rollouts, self.on_record, self.cut)

    async def _stop_when_the_store_fails(self) -> None:
        """Once the run directory cannot be written, stop the runners: the episodes they run could not be recorded
        (they end with no record, for --resume), and those still queued are never started."""
        await self.store.failed.wait()
        for runner in self._runners:
            runner.cancel()

    # --- measurements ---------------------------------------------------------------------------------
    async def _follow_pool(self) -> None:
        # The workers report their browsers' memory in their heartbeats (the pool keeps the peak): the run's
        # stats take the pool's figures once a second, with no reads of /proc here.
        while True:
            self.take_pool_figures()
            await asyncio.sleep(1.0)

    def take_pool_figures(self) -> None:
        """Copy the pool's figures (peak browser memory, worker restarts) into the run's stats."""
        if self.pool is not None:
            self.stats.peak_browser_pss = max(self.stats.peak_browser_pss, self.pool.peak_browser_pss)
            self.stats.worker_restarts = self.pool.restarts

    def _finish_stats(self) -> None:
        self.take_pool_figures()
        self.stats.finished_at = time.monotonic()
