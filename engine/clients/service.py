"""The engine as a library: submit tasks with a policy, iterate over trajectories as they finish.

For RL frameworks that own the training loop but let the engine drive the policy (veRL, AReaL, Slime,
PipelineRL shapes) and for this project's own ``webgym-engine train``::

    async with RolloutService(RunConfig(concurrency=64), serve_sites=True) as service:
        service.submit(tasks, policy, samples=8, policy_version=3)
        async for record in service.results():
            ...  # one record per episode: steps with token ids, log-probs, policy versions; the reward

The service is a client of :class:`engine.core.core.EngineCore`: one browser pool, one run directory, one judge,
telemetry (``webgym-engine monitor RUN_DIR`` attaches), sync mode, memory sampling and retries, exactly as
``webgym-engine run`` has them, and the same :class:`RunStats`. Each submission brings its own policy (an
in-process model, or an OpenAI-compatible endpoint through ``policy.registry``) and the policy version its
steps are recorded with. Rollouts of different submissions run side by side, so a trainer can submit the next
batch while the last one is still finishing (asynchronous RL). For trainers that drive every step themselves,
see :mod:`engine.clients.env`.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterable
from pathlib import Path
from types import TracebackType

from browserpool.pool import BrowserPool
from engine.agent.policy_api import Policy
from engine.core.config import RunConfig
from engine.core.core import EngineCore
from engine.episode.rollout import Rollout
from engine.rewards.judge import RubricJudge
from engine.store.records import EpisodeRecord
from engine.store.stats import RunStats
from engine.tasks.schema import Task


class RolloutService:
    """A long-lived engine: submissions in, finished trajectories out. ``core``: an engine core to use (started by
    the caller); ``pool``: an already started browser pool for the service's own core (left running)."""

    def __init__(self, cfg: RunConfig, *, base_url: str | None = None, serve_sites: bool = False,
                 site_mounts: dict[str, Path] | None = None, judge: RubricJudge | None = None,
                 core: EngineCore | None = None, pool: BrowserPool | None = None) -> None:
        self.core = core or EngineCore(cfg, judge=judge, base_url=base_url, serve_sites=serve_sites,
                                       site_mounts=site_mounts, pool=pool)
        self._own_core = core is None
        self._done: asyncio.Queue[EpisodeRecord] = asyncio.Queue()
        self._mine: dict[str, Rollout] = {}  # episodes submitted through this service, until handed out
        self._outstanding = 0  # submitted episodes whose final record has not been handed out yet
        self._held: dict[str, EpisodeRecord] = {}  # finished, not handed out yet (gather() waits for others)
        self.core.on_record(self._on_record)

    @property
    def cfg(self) -> RunConfig:
        return self.core.cfg

    @property
    def stats(self) -> RunStats:
        """The service's figures so far (the pool's memory and restart figures as of now, not of the last
        once-a-second update)."""
        self.core.take_pool_figures()
        return self.core.stats

    @property
    def run_dir(self) -> Path | None:
        return self.core.run_dir

    @property
    def base_url(self) -> str | None:
        return self.core.base_url

    async def __aenter__(self) -> RolloutService:
        await self.start()
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
        await self.close()

    async def start(self) -> Path:
        """Start the engine core (site server if asked, run directory, telemetry, pool, judge, runners)."""
        if self._own_core:
            return await self.core.start({"api": True})
        assert self.core.run_dir is not None
        return self.core.run_dir

    def submit(self, tasks: Iterable[Task], policy: Policy, samples: int = 1, policy_version: int = 0) -> list[str]:
        """Queue ``samples`` episodes of each task for ``policy``; returns their episode ids at once.

        The policy is started on first use and closed with the service."""
        ctx = self.core.context(policy, policy_version=policy_version)
        rollouts = self.core.submit(ctx, [(task, None) for task in tasks for _ in range(samples)])
        ids = [r.episode_id for r in rollouts]
        self._mine.update((r.episode_id, r) for r in rollouts)
        self._outstanding += len(ids)
        return ids

    async def results(self) -> AsyncIterator[EpisodeRecord]:
        """Finished episodes' records, in the order they finish, until everything submitted is out.

        A judged episode comes out once its verdict is in (or with ``judge_error`` if the judge failed)."""
        while self._outstanding > 0:
            yield await self.next_result()

    @property
    def outstanding(self) -> int:
        """Submitted episodes whose record has not been handed out yet."""
        return self._outstanding

    async def next_result(self) -> EpisodeRecord:
        """The next finished episode's record (waits for one; for loops that keep submitting as they consume)."""
        if self._held:
            record = self._held.pop(next(iter(self._held)))
        else:
            record = await self.core.unless_the_store_fails(self._done.get())
        self._outstanding -= 1
        return record

    async def gather(self, episode_ids: Iterable[str]) -> list[EpisodeRecord]:
        """The records of these episodes (in this order), once all have finished; records of other episodes
        that finish meanwhile are kept for :meth:`results` or a later ``gather``. With
        ``RunConfig.straggler_fraction`` set, the last of these episodes are cut as ``run`` cuts them."""
        wanted = list(episode_ids)
        missing = set(wanted) - self._held.keys()
        watcher = self.core.watch_stragglers([self._mine[e] for e in missing if e in self._mine])
        try:
            while missing:
                record = await self.core.unless_the_store_fails(self._done.get())
                self._held[record["episode_id"]] = record
                missing.discard(record["episode_id"])
        finally:
            if watcher is not None:
                watcher.cancel()
        self._outstanding -= len(wanted)
        return [self._held.pop(e) for e in wanted]

    async def collect(self) -> list[EpisodeRecord]:
        """Every record still to come (waits for all submitted episodes)."""
        return [r async for r in self.results()]

    async def close(self) -> None:
        """Close the core (episodes in flight end without a record; the judge drains; policies, pool, sites)."""
        if self._own_core:
            await self.core.close()

    def _on_record(self, rollout: Rollout, record: EpisodeRecord) -> None:
        if rollout.episode_id in self._mine and record["status"] != "judge_pending":
            del self._mine[rollout.episode_id]
            self._done.put_nowait(record)
