"""The engine as a library: submit tasks with a policy, iterate over trajectories as they finish.

For RL frameworks that own the training loop (veRL, AReaL, Slime, PipelineRL shapes) and for this
project's own ``webgym-engine train``::

    async with RolloutService(RunConfig(concurrency=64), serve_sites=True) as service:
        service.submit(tasks, policy, samples=8, policy_version=3)
        async for record in service.results():
            ...  # one record per episode: steps with token ids, log-probs, policy versions; the reward

One browser pool, one run directory and one judge serve every submission; each submission brings its
own policy (an in-process model, or an OpenAI-compatible endpoint through ``policy.registry``) and the
policy version its steps are recorded with. Rollouts of different submissions run side by side, so a
trainer can submit the next batch while the last one is still finishing (asynchronous RL).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Iterable
from dataclasses import asdict
from pathlib import Path
from types import TracebackType
from typing import Any

from browserpool.pool import BrowserPool
from engine.judging import JudgeQueue
from engine.rollout import Rollout, RolloutContext
from engine.runner import RunConfig, make_judge, new_run_dir, pool_config
from engine.sites.server import SiteServer
from engine.stats import RunStats
from engine.store import RunStore, merge_judgement
from engine.tasks import Task
from policy.base import Policy


class RolloutService:
    """A long-lived engine: submissions in, finished trajectories out."""

    def __init__(self, cfg: RunConfig, *, base_url: str | None = None, serve_sites: bool = False,
                 site_mounts: dict[str, Path] | None = None) -> None:
        self.cfg = cfg
        self.base_url = base_url
        self._serve_sites = serve_sites and base_url is None
        self._site_mounts = site_mounts
        self.stats = RunStats()
        self._sites: SiteServer | None = None
        self._pool: BrowserPool | None = None
        self._store: RunStore | None = None
        self._judge_queue: JudgeQueue | None = None
        self._judge: Any = None
        self._slots = asyncio.Semaphore(cfg.policy_concurrency)
        self._pending: asyncio.Queue[Rollout] = asyncio.Queue()
        self._done: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
        self._runners: list[asyncio.Task[None]] = []
        # Each policy's start (one per policy, awaited by every runner); the policies are closed with the service.
        self._starts: dict[int, tuple[Policy, asyncio.Future[None]]] = {}
        self._samples: dict[str, int] = {}  # next sample index per task: episode ids stay unique
        self._outstanding = 0  # submitted episodes whose final record has not been handed out yet
        self._held: dict[str, dict[str, Any]] = {}  # finished, not handed out yet (gather() waits for others)
        self.run_dir: Path | None = None

    async def __aenter__(self) -> RolloutService:
        await self.start()
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
        await self.close()

    async def start(self) -> Path:
        """Start the site server (if asked), the browser pool, the judge and the rollout runners."""
        if self._serve_sites:
            self._sites = SiteServer(mounts=self._site_mounts)
            self.base_url = self._sites.__enter__().base_url
        self.run_dir = Path(self.cfg.run_dir) if self.cfg.run_dir else new_run_dir(self.cfg.output_dir)
        self.cfg.run_dir = str(self.run_dir)
        self._store = RunStore(self.run_dir)
        self._store.write_manifest({**asdict(self.cfg), "api": True, "sites_base_url": self.base_url})
        self._pool = BrowserPool(pool_config(self.cfg, str(self.run_dir / "workers.log")))
        await self._pool.start()
        self._judge = make_judge(self.cfg)
        if self._judge is not None:
            await self._judge.start()
            self._judge_queue = JudgeQueue(self._judge, self._store, on_verdict=self._on_verdict)
        self._runners = [asyncio.ensure_future(self._runner()) for _ in range(self.cfg.concurrency)]
        return self.run_dir

    def submit(self, tasks: Iterable[Task], policy: Policy, samples: int = 1, policy_version: int = 0) -> list[str]:
        """Queue ``samples`` episodes of each task for ``policy``; returns their episode ids at once.

        The policy is started on first use and closed with the service."""
        if self._pool is None or self._store is None:
            raise RuntimeError("start the service first")
        ctx = RolloutContext(
            pool=self._pool, policy=policy, policy_slots=self._slots, store=self._store, stats=self.stats,
            settings=self.cfg.rollout_settings(policy_version),
            judge=self._judge_queue)
        ids = []
        for task in tasks:
            for _ in range(samples):
                sample = self._samples.get(task.task_id, 0)
                self._samples[task.task_id] = sample + 1
                rollout = Rollout(task, sample, ctx)
                self._pending.put_nowait(rollout)
                ids.append(rollout.episode_id)
        self.stats.total += len(ids)
        self._outstanding += len(ids)
        return ids

    async def results(self) -> AsyncIterator[dict[str, Any]]:
        """Finished episodes' records, in the order they finish, until everything submitted is out.

        A judged episode comes out once its verdict is in (or with ``judge_error`` if the judge failed)."""
        while self._outstanding > 0:
            if self._held:
                record = self._held.pop(next(iter(self._held)))
            else:
                record = await self._done.get()
            self._outstanding -= 1
            yield record

    async def gather(self, episode_ids: Iterable[str]) -> list[dict[str, Any]]:
        """The records of these episodes (in this order), once all have finished; records of other episodes
        that finish meanwhile are kept for :meth:`results` or a later ``gather``."""
        wanted = list(episode_ids)
        missing = set(wanted) - self._held.keys()
        while missing:
            record = await self._done.get()
            self._held[record["episode_id"]] = record
            missing.discard(record["episode_id"])
        self._outstanding -= len(wanted)
        return [self._held.pop(e) for e in wanted]

    async def collect(self) -> list[dict[str, Any]]:
        """Every record still to come (waits for all submitted episodes)."""
        return [r async for r in self.results()]

    async def close(self) -> None:
        """Stop the runners (episodes in flight end without a record), then the judge, policies, pool, sites."""
        for t in self._runners:
            t.cancel()
        for t in self._runners:
            with contextlib.suppress(asyncio.CancelledError):
                await t
        self._runners = []
        if self._judge_queue is not None:
            await self._judge_queue.drain()
        if self._judge is not None:
            await self._judge.close()
        for policy, _ in self._starts.values():
            await policy.close()
        self._starts.clear()
        if self._pool is not None:
            await self._pool.close()
        if self._store is not None:
            self._store.close()
        if self._sites is not None:
            self._sites.__exit__(None, None, None)

    async def _runner(self) -> None:
        while True:
            rollout = await self._pending.get()
            policy = rollout.ctx.policy
            if id(policy) not in self._starts:
                self._starts[id(policy)] = (policy, asyncio.ensure_future(policy.start()))
            try:
                await asyncio.shield(self._starts[id(policy)][1])
            except Exception as exc:  # noqa: BLE001 - a policy that cannot start ends its episodes, not the service
                record = await rollout.end_with_error("policy", f"the policy did not start: {exc}")
            else:
                record = await rollout.run()
            if record["status"] != "judge_pending":
                self._done.put_nowait(record)

    def _on_verdict(self, judgement: dict[str, Any], record: dict[str, Any]) -> None:
        self.stats.record_verdict(judgement)
        self._done.put_nowait(merge_judgement(record, judgement))
