"""What every rollout of a run shares: its settings and the services it uses (pool, policy queue, store, stats)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal, get_args

from browserpool.pool import BrowserPool
from engine.agent.policy_api import Policy
from engine.episode.status import EpisodeStatus
from engine.store.run_dir import RunStore
from engine.store.stats import RunStats
from engine.tasks.schema import StepCaps
from engine.web.bounds import DEFAULT_LIMITS, PageLimits

if TYPE_CHECKING:
    from engine.episode.traffic_plan import TrafficPlan
    from engine.rewards.judge_queue import JudgeQueue

RewardMode = Literal["auto", "judge", "program"]
Mode = Literal["async", "sync"]  # the engine's own scheduling, or the lock-step baseline
REWARD_MODES: tuple[RewardMode, ...] = get_args(RewardMode)
MODES: tuple[Mode, ...] = get_args(Mode)



@dataclass
class RolloutSettings:
    """Per-run settings every rollout shares."""

    split: str = "train"
    retry_lost: int = 1  # how many times an episode whose worker died starts again
    mode: Mode = "async"
    policy_version: int = 0
    reward: RewardMode = "auto"  # auto: the page's or the task's own checks, else the judge (if any)
    # Wall-clock cap of a whole episode (all its attempts), from its first browser lease; None: no cap.
    episode_timeout_s: float | None = None
    # Cap on one policy call (the backend's own retries included; the wait for a policy slot excluded).
    policy_step_timeout_s: float | None = None
    page_limits: PageLimits = DEFAULT_LIMITS  # caps on page texts copied into prompts and records
    step_caps: StepCaps | None = None  # the run's steps per difficulty; None: each task's own


@dataclass
class RolloutContext:
    """The shared services a rollout uses."""

    pool: BrowserPool
    policy: Policy
    policy_slots: asyncio.Semaphore  # the policy queue: a cap on in-flight policy calls (FIFO)
    store: RunStore
    stats: RunStats
    settings: RolloutSettings = field(default_factory=RolloutSettings)
    on_status: Callable[[EpisodeStatus], None] | None = None
    judge: JudgeQueue | None = None  # judges episodes off the rollout path
    # Waits until an action may go to the site of a URL (engine.web.domains.DomainPacer); returns the seconds waited.
    pace: Callable[[str], Awaitable[float]] | None = None
    # Which episodes record their page traffic and which replay it (None: all live).
    traffic: TrafficPlan | None = None
