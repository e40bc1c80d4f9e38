"""Feeding a plan of episodes to the engine core's runners without holding it in memory as rollouts.

A plan is a list of ``(task, sample, episode_id)`` entries, a few bytes each (the id is the string the monitor's
telemetry already holds, shared rather than built again; None without telemetry). Made into rollouts all at once,
every finished one would keep its record, steps and last observation until the plan ends: a few KiB per episode,
gigabytes over the million episodes of a training run. The feeder makes each rollout only when one of a fixed
number of places frees up and lets it go once it has its record, so the core's memory stays flat over any plan.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING, Protocol

from engine.core.stragglers import StragglerCut

if TYPE_CHECKING:
    from engine.core.config import RunConfig
    from engine.core.hooks import RecordHook
    from engine.episode.context import RolloutContext
    from engine.episode.rollout import Rollout
    from engine.store.records import EpisodeRecord
    from engine.tasks.schema import Task

# One announced episode: its task, its sample number and the id telemetry was given (None: no telemetry).
PlannedEpisode = tuple["Task", int, "str | None"]


def places_for(concurrency: int) -> int:
    """Rollouts queued or running at once: enough that the runners never wait for the feeder and that a
    per-domain limit still finds episodes of other domains to run."""
    return max(64, 4 * concurrency)


class FeedTarget(Protocol):
    """What the feeder uses of the engine core (:class:`engine.core.core.EngineCore`)."""

    cfg: RunConfig

    def rollout(self, ctx: RolloutContext, task: Task, sample: int | None = None, *, announce: bool = True,
                episode_id: str | None = None) -> Rollout: ...

    def enqueue(self, rollout: Rollout) -> None: ...

    def on_record(self, hook: RecordHook) -> Callable[[], None]: ...

    def cut(self, rollouts: Iterable[Rollout]) -> None: ...


class PlanFeeder:
    """Runs ``plan`` through ``core`` (the plan already announced): rollouts made as places free up, stragglers
    cut as the core's ``wait`` cuts them."""

    def __init__(self, core: FeedTarget, ctx: RolloutContext, plan: Sequence[PlannedEpisode],
                 places: int | None = None) -> None:
        self.core, self.ctx, self.plan = core, ctx, plan
        self._places = asyncio.Semaphore(places or places_for(core.cfg.concurrency))
        self._live: set[Rollout] = set()
        self._ended = 0
        self._all_ended = asyncio.Event()
        self._cutter = StragglerCut.for_run(core.cfg, len(plan))

    async def run(self) -> None:
        """Until every episode of the plan has its record and the record hooks have seen it (cancelled: the
        episodes not yet fed are never made)."""
        if not self.plan:
            return
        forget = self.core.on_record(self._on_record)
        cutter = None if self._cutter is None else asyncio.ensure_future(self._cutter.run(lambda: self._live,
                                                                                           self.core.cut))
        try:
            for task, sample, episode_id in self.plan:
                await self._places.acquire()
                rollout = self.core.rollout(self.ctx, task, sample, announce=False, episode_id=episode_id)
                # Past the straggler cut: ends with a straggler record.
                rollout.cut_requested = self._cutter is not None and self._cutter.cutting
                self._live.add(rollout)
                self.core.enqueue(rollout)
            await self._all_ended.wait()
        finally:
            forget()
            if cutter is not None:
                cutter.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await cutter

    def _on_record(self, rollout: Rollout, _record: EpisodeRecord) -> None:
        if rollout not in self._live:  # another client's episode, or a judged record delivered again
            return
        self._live.discard(rollout)
        self._places.release()
        self._ended += 1
        if self._cutter is not None:
            self._cutter.count_end()
        if self._ended == len(self.plan):
            self._all_ended.set()
