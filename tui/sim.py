"""A deterministic simulation of many rollouts, published through the real :class:`TelemetryPublisher`.

For tests (a recorded feed that is the same every time), the benchmark (1,024 rollouts updating at 10 Hz)
and demos. Nothing here runs a browser: each rollout walks N -> W -> R (n, s, a, e, s, a, ..., r) -> F/X
with random durations from a seeded generator, on a virtual clock.

    python -m tui.sim OUT.msgpack [--rollouts 64] [--seconds 20] [--seed 0]
"""

from __future__ import annotations

import argparse
import asyncio
import heapq
import random
from dataclasses import dataclass, field

from browserpool.pool import PoolConfig, WorkerHandle
from engine.episode.status import EpisodeStatus, Op, State
from engine.store.stats import RunStats
from engine.telemetry.publisher import TelemetryPublisher
from engine.telemetry.wire import TelemetryMessage
from tui.feed import write_messages

WALL0 = 1_767_225_600.0  # 2026-01-01T00:00:00Z: message times are this plus the virtual clock
SITES = ("shop", "wiki", "travel", "forum")
ACTIONS = ("left_click(640, 212)", "type('blue mug', submit)", "scroll(down)", "left_click(120, 88)",
           "go_back()", "answer('42')")


@dataclass
class _Pool:
    """What the publisher reads of a browser pool."""

    cfg: PoolConfig
    workers: dict[str, WorkerHandle] = field(default_factory=dict)
    restarts: int = 0
    peak_browser_pss: int = 0

    @property
    def browser_pss(self) -> int:
        return sum(h.browser_pss for h in self.workers.values() if h.alive)


class SimulatedRun:
    """``n`` rollouts on ``workers`` simulated workers, at most ``concurrency`` in flight.

    ``op_s`` is the mean duration of one operation: 0.1 makes every running cell change about ten times a
    second (the benchmark's load).
    """

    def __init__(self, n: int, seed: int = 0, concurrency: int | None = None, workers: int = 4,
                 op_s: float = 0.4, publisher: TelemetryPublisher | None = None,
                 steps: tuple[int, int] = (1, 12)) -> None:
        self.rng = random.Random(seed)
        self.now = 0.0
        self.op_s = op_s
        self.concurrency = concurrency or n
        self.stats = RunStats(started_at=0.0, total=n)
        self.pub = publisher or TelemetryPublisher(None, None, clock=lambda: self.now, wall=lambda: WALL0 + self.now)
        if publisher is not None:
            publisher.clock, publisher.wall = (lambda: self.now), (lambda: WALL0 + self.now)
        self.pub.run_name = self.pub.run_name or "run-simulated"
        pool = _Pool(PoolConfig(workers=workers, ops_per_worker=16, opens_per_worker=4))
        for w in range(workers):
            h = WorkerHandle(f"w{w}", ops=asyncio.Semaphore(16), opens=asyncio.Semaphore(4), alive=True)
            h.browser_pss = (900 + 37 * w) * 2**20  # as a worker's heartbeat would report it
            pool.workers[h.worker_id] = h
        pool.peak_browser_pss = pool.browser_pss
        self.pool = pool
        self.pub.pool = pool  # type: ignore[assignment]
        self.pub.stats = self.stats
        self.pub.policy_slots = asyncio.Semaphore(128)
        self.pub.policy_cap = 128
        self.statuses = [EpisodeStatus(f"sim-{i:04d}#0", f"sim-{i:04d}") for i in range(n)]
        self.stats.states["N"] = n
        self.pub.add_episodes((st.episode_id, st.task_id) for st in self.statuses)
        self._steps_left = [self.rng.randint(*steps) for _ in range(n)]
        self._worker = [f"w{i % workers}" for i in range(n)]
        self._events: list[tuple[float, int]] = []
        self._started = 0
        for _ in range(min(self.concurrency, n)):
            self._start_next()

    def _start_next(self) -> None:
        if self._started < len(self.statuses):
            i = self._started
            self._started += 1
            heapq.heappush(self._events, (self.now + self.rng.random() * 2 * self.op_s, i))

    def _dur(self) -> float:
        return self.rng.expovariate(1.0 / self.op_s)

    def _set(self, i: int, state: State, op: Op = Op.NONE) -> None:
        st = self.statuses[i]
        if st.state is not state:
            self.stats.move(st.state.value, state.value)
        st.state, st.op = state, op
        self.pub.on_status(st)

    def _advance(self, i: int) -> None:
        st, rng = self.statuses[i], self.rng
        site = SITES[i % len(SITES)]
        if st.state is State.NOT_STARTED:
            st.task = f"On the {site} site, find item {i} and report its price"
            self._set(i, State.WAITING)
        elif st.state is State.WAITING:
            self.pool.workers[self._worker[i]].episodes.add(st.episode_id)
            self._set(i, State.RUNNING, Op.NAVIGATE)
        elif st.op is Op.NAVIGATE or st.op is Op.EXECUTE:
            if st.op is Op.NAVIGATE:
                st.url = f"http://127.0.0.1:8000/{site}/"
                st.title = f"{site} home"
            else:
                st.url = f"http://127.0.0.1:8000/{site}/item.html?id={i}&step={st.step}"
            self._set(i, State.RUNNING, Op.SCREENSHOT)
        elif st.op is Op.SCREENSHOT:
            st.screenshot = f"frames/{st.episode_id}/{st.step:03d}.jpg"
            if self._steps_left[i] <= 0:
                self._set(i, State.RUNNING, Op.REWARD)
            else:
                self._set(i, State.RUNNING, Op.MODEL)
        elif st.op is Op.MODEL:
            st.action = ACTIONS[rng.randrange(len(ACTIONS))]
            st.thought = f"The page shows the {site} listing; next I will {st.action.split('(')[0]}."
            self._set(i, State.RUNNING, Op.EXECUTE)
            timings = {"policy_ms": round(rng.uniform(300, 900), 1), "action_ms": round(rng.uniform(5, 40), 1),
                       "settle_ms": round(rng.uniform(50, 400), 1), "screenshot_ms": round(rng.uniform(15, 60), 1)}
            timings["step_ms"] = round(sum(timings.values()), 1)
            st.step_timings_ms = timings
            self.stats.record_step(timings["step_ms"])
            self.stats.record_step_phases(timings)
            self._steps_left[i] -= 1
            st.step += 1
        elif st.op is Op.REWARD:
            self.pool.workers[self._worker[i]].episodes.discard(st.episode_id)
            self.stats.record_phase("judge", round(rng.uniform(1, 20), 1))
            if rng.random() < 0.06:
                st.error = "browser_timeout"
                self._set(i, State.FAILED)
                self.stats.record_episode("error")
            else:
                st.reward = 1.0 if rng.random() < 0.62 else 0.0
                self._set(i, State.FINISHED)
                self.stats.record_episode("success" if st.reward == 1.0 else "failure")
            self._start_next()
            return
        heapq.heappush(self._events, (self.now + self._dur(), i))

    def advance_to(self, t: float) -> None:
        """Run every event up to virtual time ``t``."""
        while self._events and self._events[0][0] <= t:
            self.now, i = heapq.heappop(self._events)
            self._advance(i)
        self.now = t
        # Queue depths that look like a busy engine's.
        running = sum(1 for s in self.statuses if s.state is State.RUNNING)
        for h in self.pool.workers.values():
            h.ops._value = 16 - min(16, len(h.episodes) // 2)
        assert self.pub.policy_slots is not None
        self.pub.policy_slots._value = 128 - min(128, running // 3)

    @property
    def finished(self) -> bool:
        return not self._events

    def messages(self, seconds: float, hz: float = 10.0) -> list[TelemetryMessage]:
        """The messages a monitor attached from the start would receive over ``seconds`` of virtual time."""
        out: list[TelemetryMessage] = []
        first = self.pub.message("snapshot", full_details=True)
        assert first is not None
        out.append(first)
        ticks = int(seconds * hz)
        for k in range(1, ticks + 1):
            self.advance_to(k / hz)
            msg = self.pub.message()
            if msg is not None:
                out.append(msg)
        return out


def simulated_feed(n: int = 64, seconds: float = 20.0, seed: int = 0, hz: float = 10.0,
                   op_s: float = 0.4) -> list[TelemetryMessage]:
    """A deterministic feed of ``n`` rollouts progressing (the same messages for the same arguments)."""
    return SimulatedRun(n, seed=seed, op_s=op_s, concurrency=max(1, n * 3 // 4)).messages(seconds, hz)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out")
    ap.add_argument("--rollouts", type=int, default=64)
    ap.add_argument("--seconds", type=float, default=20.0)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    n = write_messages(args.out, simulated_feed(args.rollouts, args.seconds, args.seed))
    print(f"{n} messages -> {args.out}")


if __name__ == "__main__":
    main()
