"""How busy the browsers and the policy were while the RL loop ran: sampled fractions over time windows.

The loop asks, for example, "while the trainer ran iteration 3, what fraction of the browser slots held an
episode, and how often had the policy no request at all?" Sampling (every ``period_s``) keeps the probes out of
the engine's hot path; a 20 ms period resolves the seconds-long phases of an iteration.
"""

from __future__ import annotations

import asyncio
import bisect
import contextlib
import time
from collections.abc import Callable

from engine.agent.model_api import ChatRequest, Generation, LanguageModel


class CountingModel(LanguageModel):
    """``model`` with a count of the requests in flight (for the policy's idle time)."""

    def __init__(self, model: LanguageModel) -> None:
        self.model = model
        self.name = model.name
        self.model_name = model.model_name
        self.in_flight = 0

    @property
    def resize(self) -> dict[str, int] | None:  # type: ignore[override]
        return self.model.resize

    async def start(self) -> None:
        await self.model.start()

    async def close(self) -> None:
        await self.model.close()

    async def generate(self, request: ChatRequest) -> Generation:
        self.in_flight += 1
        try:
            return await self.model.generate(request)
        finally:
            self.in_flight -= 1


class Utilization:
    """Samples named probes (each returns a fraction in 0..1) every ``period_s``."""

    def __init__(self, probes: dict[str, Callable[[], float]], period_s: float = 0.02) -> None:
        self.probes = probes
        self.period_s = period_s
        self.times: list[float] = []
        self.values: dict[str, list[float]] = {name: [] for name in probes}
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.ensure_future(self._sample())

    async def close(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    def mean(self, name: str, t0: float, t1: float) -> float | None:
        """The mean of ``name``'s samples taken in ``[t0, t1]`` (monotonic clock); None without samples."""
        lo, hi = bisect.bisect_left(self.times, t0), bisect.bisect_right(self.times, t1)
        window = self.values[name][lo:hi]
        return round(sum(window) / len(window), 3) if window else None

    async def _sample(self) -> None:
        while True:
            self.times.append(time.monotonic())
            for name, probe in self.probes.items():
                self.values[name].append(min(max(float(probe()), 0.0), 1.0))
            await asyncio.sleep(self.period_s)
