"""The straggler cut: once a set fraction of a set of episodes has its records, the rest get a grace period, then
end with a ``straggler`` error record (asynchronous mode only: lock-step batches wait for their last episode by
design). One cutter for the core's :meth:`~engine.core.core.EngineCore.wait` (rollouts made at once) and for the plan
feeder (rollouts made as places free up); each counts ends from the core's record hooks.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING

from engine.core.config import RunConfig

if TYPE_CHECKING:
    from engine.core.hooks import RecordHook
    from engine.episode.rollout import Rollout
    from engine.store.records import EpisodeRecord


def straggler_reason(cfg: RunConfig) -> str:
    """The error text of a cut episode's record."""
    return (f"straggler: cut {cfg.straggler_grace_s:g} s after {cfg.straggler_fraction or 0:.0%} "
            "of the run had finished")


class StragglerCut:
    """Counts the ends of ``total`` episodes; :meth:`run` cuts what is still live once ``fraction`` of them ended
    and ``grace_s`` passed. ``cutting`` says the cut happened (an episode made later is cut as it starts)."""

    def __init__(self, total: int, fraction: float, grace_s: float) -> None:
        self.need = fraction * total
        self.grace_s = grace_s
        self.cutting = False
        self._ended = 0
        self._enough = asyncio.Event()
        if self.need <= 0:
            self._enough.set()

    @classmethod
    def for_run(cls, cfg: RunConfig, total: int) -> StragglerCut | None:
        """The cutter ``cfg`` asks for (``straggler_fraction`` set, asynchronous mode), or None."""
        if cfg.straggler_fraction is None or cfg.mode != "async":
            return None
        return cls(total, cfg.straggler_fraction, cfg.straggler_grace_s)

    def count_end(self) -> None:
        """One of the episodes has its record."""
        self._ended += 1
        if self._ended >= self.need:
            self._enough.set()

    async def run(self, live: Callable[[], Iterable[Rollout]], cut: Callable[[Iterable[Rollout]], None]) -> None:
        """Wait for the fraction and the grace period, then ``cut(live())``."""
        await self._enough.wait()
        await asyncio.sleep(self.grace_s)
        self.cutting = True
        cut(list(live()))


def watch(cutter: StragglerCut | None, rollouts: list[Rollout], on_record: Callable[[RecordHook], Callable[[], None]],
          cut: Callable[[Iterable[Rollout]], None]) -> asyncio.Task[None] | None:
    """A task that runs ``cutter`` over ``rollouts`` made at once, counting their ends through the record hook it
    adds with ``on_record`` (removed when the task ends); None without a cutter."""
    if cutter is None:
        return None
    remaining = {r for r in rollouts if not r.finished}
    for _ in range(len(rollouts) - len(remaining)):
        cutter.count_end()

    def on_end(rollout: Rollout, _record: EpisodeRecord) -> None:
        if rollout in remaining:  # once: a judged record comes again with its verdict
            remaining.discard(rollout)
            cutter.count_end()

    forget = on_record(on_end)
    task = asyncio.ensure_future(cutter.run(lambda: remaining, cut))
    task.add_done_callback(lambda _: forget())  # also when cancelled before it ran
    return task
