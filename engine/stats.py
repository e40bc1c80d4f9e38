"""Run statistics: episode outcomes, step latencies, throughput, peak browser memory."""

from __future__ import annotations

import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import numpy as np

SUMMARY_KEYS = ("episodes", "succeeded", "failed", "errors", "lost", "steps", "steps_per_s",
                "step_latency_p50_ms", "step_latency_p95_ms", "peak_browser_pss_mib")


@dataclass
class RunStats:
    """Counters updated by the rollouts; read by progress displays and the final summary."""

    total: int = 0  # episodes that entered the run
    started_at: float = field(default_factory=time.monotonic)
    finished_at: float | None = None
    outcomes: Counter[str] = field(default_factory=Counter)  # success | failure | error
    steps: int = 0
    step_latencies_ms: list[float] = field(default_factory=list)
    states: Counter[str] = field(default_factory=Counter)  # live count per rollout state letter
    peak_browser_pss: int = 0
    worker_restarts: int = 0

    def record_step(self, latency_ms: float) -> None:
        self.steps += 1
        self.step_latencies_ms.append(latency_ms)

    def record_episode(self, status: str) -> None:
        self.outcomes[status] += 1

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
        return self.outcomes["success"] / self.done if self.done else 0.0

    def summary(self) -> dict[str, Any]:
        """The figures of the summary table, with the keys of ``--summary-json``."""
        lat = np.asarray(self.step_latencies_ms) if self.step_latencies_ms else np.zeros(1)
        return {
            "episodes": self.done,
            "succeeded": self.outcomes["success"],
            "failed": self.outcomes["failure"],
            "errors": self.outcomes["error"],
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
