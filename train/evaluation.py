"""Held-out evaluation for the RL loop: a task set run with the current policy, and the figures a claim needs.

:func:`evaluate` runs every task of a held-out set ``samples`` times through the loop's engine with an evaluation
policy (greedy by default) and the current policy version, and sums up what happened (:class:`Evaluation`).
Only records with the task's verdict count towards success (:func:`train.algorithms.is_trainable`); the others
(errors, blocked sites, a judge without a verdict) are counted apart, never as failures.

:func:`wilson_interval` gives a success rate's 95% interval, :func:`paired_gain` the gain between two evaluations
of the same tasks with its 95% interval (the per-task differences' mean, +-1.96 standard errors: the same tasks
are evaluated twice, so the comparison is paired).
"""

from __future__ import annotations

import math
import statistics
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from engine.agent.policy_api import Policy
from engine.clients.service import RolloutService
from engine.store.records import EpisodeRecord
from engine.tasks.schema import Task
from train.algorithms import is_success, is_trainable

Z95 = 1.959963984540054  # the normal distribution's 97.5% quantile


@dataclass
class Evaluation:
    """One evaluation of a task set with one policy version."""

    label: str  # e.g. "start" (before the first update) or "end" (after the last)
    version: int
    episodes: int
    rewarded: int  # episodes with the task's verdict (success or failure)
    successes: int
    mean_steps: float  # over the rewarded episodes
    outcomes: dict[str, int]  # status -> episodes
    # task id -> the success (1.0 / 0.0) of each of its rewarded episodes, in sample order
    per_task: dict[str, list[float]] = field(default_factory=dict)

    @property
    def success_rate(self) -> float:
        return self.successes / self.rewarded if self.rewarded else math.nan

    @property
    def interval(self) -> tuple[float, float]:
        """The success rate's 95% Wilson interval."""
        return wilson_interval(self.successes, self.rewarded)

    def to_dict(self) -> dict[str, Any]:
        low, high = self.interval
        return {"label": self.label, "version": self.version, "episodes": self.episodes, "rewarded": self.rewarded,
                "successes": self.successes, "success_rate": self.success_rate, "interval_95": [low, high],
                "mean_steps": self.mean_steps, "outcomes": self.outcomes, "per_task": self.per_task}


def summarise(label: str, version: int, records: Sequence[EpisodeRecord]) -> Evaluation:
    """An :class:`Evaluation` of ``records`` (one per episode)."""
    rewarded = [r for r in records if is_trainable(r)]
    per_task: dict[str, list[float]] = {}
    for r in rewarded:
        per_task.setdefault(str(r["task"]["task_id"]), []).append(float(is_success(r)))
    steps = [len(r.get("steps") or []) for r in rewarded]
    return Evaluation(label=label, version=version, episodes=len(records), rewarded=len(rewarded),
                      successes=sum(is_success(r) for r in rewarded),
                      mean_steps=statistics.fmean(steps) if steps else math.nan,
                      outcomes=dict(Counter(str(r.get("status")) for r in records)), per_task=per_task)


async def evaluate(service: RolloutService, tasks: Sequence[Task], policy: Policy, *, label: str, version: int,
                   samples: int = 1) -> Evaluation:
    """Run ``samples`` episodes of every task with ``policy`` (recorded as ``version``) and sum them up; waits for
    them all (other submissions of the service run on meanwhile)."""
    ids = service.submit(tasks, policy, samples, policy_version=version)
    return summarise(label, version, await service.gather(ids))


def wilson_interval(successes: int, n: int, z: float = Z95) -> tuple[float, float]:
    """The Wilson score interval of ``successes`` out of ``n`` (95% by default); (nan, nan) for ``n = 0``."""
    if n <= 0:
        return math.nan, math.nan
    p = successes / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return max(0.0, centre - half), min(1.0, centre + half)


@dataclass(frozen=True)
class PairedGain:
    """``after - before`` over the tasks both evaluations rewarded, with its 95% interval."""

    gain: float
    low: float
    high: float
    tasks: int  # the tasks the difference rests on
    episodes: int  # their rewarded episodes, both evaluations together

    def to_dict(self) -> dict[str, Any]:
        return {"gain": self.gain, "interval_95": [self.low, self.high], "tasks": self.tasks,
                "episodes": self.episodes}


def paired_gain(before: Evaluation, after: Evaluation, z: float = Z95) -> PairedGain:
    """The mean over tasks of (success rate after - success rate before), +-``z`` standard errors of that mean."""
    common = sorted(set(before.per_task) & set(after.per_task))
    diffs = [statistics.fmean(after.per_task[t]) - statistics.fmean(before.per_task[t]) for t in common]
    episodes = sum(len(before.per_task[t]) + len(after.per_task[t]) for t in common)
    if not diffs:
        return PairedGain(math.nan, math.nan, math.nan, 0, 0)
    mean = statistics.fmean(diffs)
    se = statistics.stdev(diffs) / math.sqrt(len(diffs)) if len(diffs) > 1 else math.inf
    return PairedGain(mean, mean - z * se, mean + z * se, len(diffs), episodes)
