"""Run statistics: episode outcomes, step latencies, throughput, peak browser memory.

Outcomes are counted by record status (:data:`engine.store.records.STATUSES`), each apart: ``succeeded``, ``failed``,
``unrewarded`` (nothing could score the episode), ``blocked`` (the site refused the agent), ``errors`` and
``judge_pending`` in the summary. The success rate is of the rewarded episodes (succeeded + failed): an episode
nothing scored, a blocked site or an error is no failure of the agent's."""

from __future__ import annotations

import time
from array import array
from collections import Counter, deque
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from engine.store.records import Judgement, reward_status

SUMMARY_KEYS = ("episodes", "succeeded", "failed", "unrewarded", "blocked", "errors", "judge_pending", "lost", "steps",
                "steps_per_s", "step_latency_p50_ms", "step_latency_p95_ms", "peak_browser_pss_mib")
# Summary key -> the record status it counts.
OUTCOME_KEYS = (("succeeded", "success"), ("failed", "failure"), ("unrewarded", "unrewarded"),
                ("blocked", "blocked"), ("errors", "error"), ("judge_pending", "judge_pending"))
PHASE_WINDOW = 2000  # latency samples kept per phase
# Step timing keys (from the worker and the rollout) -> phase names of the live displays.
_STEP_PHASES = (("action_ms", "action"), ("settle_ms", "settle"), ("screenshot_ms", "screenshot"),
                ("policy_ms", "model"))


@dataclass
class RunStats:
    """Counters updated by the rollouts; read by progress displays and the final summary."""

    total: int = 0  # episodes that entered the run
    started_at: float = field(default_factory=time.monotonic)
    finished_at: float | None = None
    outcomes: Counter[str] = field(default_factory=Counter)  # by record status (engine.store.records.STATUSES)
    steps: int = 0
    # Every step's latency, 8 bytes each (a list of floats would take 32): the run's percentiles, and the
    # benchmarks' windows (slices).
    step_latencies_ms: array[float] = field(default_factory=lambda: array("d"))
    states: Counter[str] = field(default_factory=Counter)  # live count per rollout state letter
    peak_browser_pss: int = 0
    worker_restarts: int = 0

    def restart_clock(self) -> None:
        """Count elapsed time (and so steps/s) from now: after the browsers and the policy have started."""
        self.started_at = time.monotonic()

    def record_step(self, latency_ms: float) -> None:
        self.steps += 1
        self.step_latencies_ms.append(latency_ms)

    # Per-phase latencies for live displays: a bounded window each, so a long run costs constant memory.
    _phases: dict[str, deque[float]] = field(default_factory=dict, repr=False)

    def record_phase(self, name: str, ms: float) -> None:
        """One latency sample (ms) of a phase: action, settle, screenshot, model, judge."""
        window = self._phases.get(name)
        if window is None:
            window = self._phases[name] = deque(maxlen=PHASE_WINDOW)
        window.append(ms)

    def record_step_phases(self, timings_ms: dict[str, float]) -> None:
        """The phases of one step's timings (keys as in ``episodes.jsonl``: policy_ms, action_ms, ...)."""
        for key, name in _STEP_PHASES:
            ms = timings_ms.get(key)
            if ms is not None:
                self.record_phase(name, ms)

    def phase_percentiles(self) -> dict[str, tuple[float, float, int]]:
        """``{phase: (p50_ms, p95_ms, samples in the window)}`` over the last PHASE_WINDOW samples of each."""
        out: dict[str, tuple[float, float, int]] = {}
        for name, window in self._phases.items():
            if window:
                p50, p95 = np.percentile(np.fromiter(window, float, len(window)), (50, 95))
                out[name] = (round(float(p50), 1), round(float(p95), 1), len(window))
        return out

    def record_episode(self, status: str) -> None:
        """An episode has its record, of ``status`` (a record status)."""
        self.outcomes[status] += 1

    def record_verdict(self, judgement: Judgement) -> None:
        """A judge verdict arrived for a pending episode: it moves to the verdict's status (success, failure,
        unrewarded or blocked); an error leaves it pending."""
        reward = judgement.get("reward")
        if isinstance(ms := judgement.get("judge_ms"), int | float):  # the judge's latency, when it says
            self.record_phase("judge", ms)
        if reward is not None:
            self.outcomes["judge_pending"] -= 1
            self.outcomes[reward_status(reward)] += 1

    def move(self, old: str | None, new: str) -> None:
        if old is not None:
            self.states[old] -= 1
        self.states[new] += 1

    @property
    def done(self) -> int:
        return sum(self.outcomes.values())

    @property
    def elapsed_s(self) -> float:
        return (self.finished_at or time.monotonic()) - self.started_at

    @property
    def steps_per_s(self) -> float:
        return self.steps / self.elapsed_s if self.elapsed_s > 0 else 0.0

    @property
    def success_rate(self) -> float:
        """Of the rewarded episodes (:func:`success_rate`)."""
        return success_rate(self.outcomes)

    def summary(self) -> dict[str, Any]:
        """The figures of the summary table, with the keys of ``--summary-json``."""
        lat = np.asarray(self.step_latencies_ms) if self.step_latencies_ms else np.zeros(1)
        return {
            "episodes": self.done,
            **outcome_counts(self.outcomes),
            "lost": self.total - self.done,
            "steps": self.steps,
            "steps_per_s": round(self.steps_per_s, 2),
            "step_latency_p50_ms": round(float(np.percentile(lat, 50)), 1),
            "step_latency_p95_ms": round(float(np.percentile(lat, 95)), 1),
            "peak_browser_pss_mib": round(self.peak_browser_pss / 2**20, 1),
            "success_rate": round(self.success_rate, 4),
            "elapsed_s": round(self.elapsed_s, 2),
            "worker_restarts": self.worker_restarts,
        }


def outcome_counts(outcomes: Mapping[str, int]) -> dict[str, int]:
    """The summary's outcome figures (``succeeded`` ... ``judge_pending``) from counts by record status."""
    return {key: outcomes.get(status, 0) for key, status in OUTCOME_KEYS}


def success_rate(outcomes: Mapping[str, int]) -> float:
    """Successes among the rewarded episodes (success + failure) of counts by record status; 0 when none was
    rewarded. Unrewarded, blocked, errored and pending episodes are not in it: nothing scored the agent there."""
    rewarded = outcomes.get("success", 0) + outcomes.get("failure", 0)
    return outcomes.get("success", 0) / rewarded if rewarded else 0.0
