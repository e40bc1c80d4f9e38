"""What the latency model of a served VLM (:class:`policy.simulated.LatencyModel`) predicts for one batch of
episodes run by the asynchronous engine and by its lock-step baseline, computed from the work itself.

The work of an episode is fixed by the ``simulated`` policy's draws (``fixed_work``): how many steps it takes
(the step at which it answers, or its step cap), how many tokens each reply decodes, how many images each prompt
holds; plus the browser time of each step and of opening and finishing the episode (measured, or estimated).
``t(k) = token_ms * (1 + k / knee)`` is the time per output token with ``k`` requests in flight, ``p(s)`` the
time to the first token of a prompt with ``s`` images.

- Lock-step: the episodes run in batches of ``C``, in order. A batch runs in rounds (open the page, step 1 .. the
  longest episode's last step, finish) and every round lasts as long as its slowest episode. In a step round the
  ``m`` episodes still running send their requests at once: the same prefill ``p`` (same step, same number of
  images), then they decode together, each finished request leaving the batch. With the token counts sorted
  ``n_1 <= ... <= n_m``, the ``j``-th reply is done at ``p + sum_{i <= j} (n_i - n_{i-1}) t(m - i + 1)``; the
  round lasts ``max_j (done_j + browser_j)``. The makespan is the sum of the rounds of every batch.
- Asynchronous: ``C`` runners take the episodes in order as they free up, with no barrier. In steady state the
  number of requests in flight is ``m = C * (model time) / (episode time)`` (Little's law), so a step costs
  ``p(s) + n t(m) + browser``; ``m`` is solved by fixed-point iteration. The makespan is that of list scheduling
  the episodes' durations on ``C`` runners (the tail is priced at the steady-state ``m``, slightly high).

Browser times come from each mode's own run (:func:`planned_work` takes them as callables): the latency model
shares no CPU, while the browsers of one machine do, differently in each mode (a lock-step round starts its
actions within one reply's decoding of each other, an asynchronous engine spreads them). The server queues no
prefill either: a lock-step burst of ``m`` prompts costs one prefill, not ``m``, which favours the lock-step side.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import random
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from bench.page_latency import LOAD_MEDIAN_S, LOAD_SIGMA
from bench.report import row, write_result
from policy.simulated import LatencyModel, SimulatedModel


@dataclass(frozen=True)
class StepWork:
    """One step of an episode: the prompt's images, the reply's tokens, the browser's time after it."""

    images: int
    tokens: int
    browser_s: float  # 0 for the answering step: no action goes to the browser


@dataclass(frozen=True)
class EpisodeWork:
    """An episode's whole work, in the order the engine takes episodes."""

    episode_id: str
    steps: tuple[StepWork, ...]
    open_s: float  # lease a browser context, open the start page, first screenshot
    finish_s: float  # reward and record

    def model_s(self, lm: LatencyModel, in_flight: float) -> float:
        """Seconds this episode waits for the model with ``in_flight`` requests served at once."""
        return sum(lm.prefill_s(s.images) + s.tokens * _token_s(lm, in_flight) for s in self.steps)

    def duration_s(self, lm: LatencyModel, in_flight: float) -> float:
        """Seconds from opening to the record, alone on a runner, with ``in_flight`` requests served at once."""
        return self.open_s + self.model_s(lm, in_flight) + sum(s.browser_s for s in self.steps) + self.finish_s


@dataclass(frozen=True)
class Prediction:
    """Makespans of both modes and their ratio (lock-step / asynchronous = the asynchronous speed-up)."""

    sync_s: float
    async_s: float
    in_flight: float  # the asynchronous engine's steady-state requests in flight
    rounds: int  # lock-step rounds over all batches

    @property
    def ratio(self) -> float:
        return self.sync_s / self.async_s if self.async_s > 0 else 0.0


def _token_s(lm: LatencyModel, in_flight: float) -> float:
    return lm.token_ms * (1 + in_flight / lm.knee) / 1000 / lm.speed


def planned_work(model: SimulatedModel, plan: Sequence[tuple[str, int]], window: int, max_tokens: int,
                 browser_s: Callable[[str, int], float], open_s: Callable[[str], float],
                 finish_s: Callable[[str], float]) -> list[EpisodeWork]:
    """The work of ``plan`` (episode ids with their step caps, in the engine's order) as the simulated model with
    ``fixed_work`` draws it: ``window`` past screenshots stay in the prompt besides the current one; the browser
    time of each non-answering step and of opening and finishing each episode come from the callables."""
    episodes = []
    for episode_id, cap in plan:
        answer = model.answer_step(episode_id)
        n = min(answer, cap)
        steps = tuple(StepWork(images=min(s, window) + 1, tokens=model.output_tokens(f"{episode_id}/{s}", max_tokens),
                               browser_s=0.0 if s == answer - 1 else browser_s(episode_id, s)) for s in range(n))
        episodes.append(EpisodeWork(episode_id, steps, open_s(episode_id), finish_s(episode_id)))
    return episodes


def _step_round(lm: LatencyModel, steps: Sequence[StepWork]) -> float:
    """One lock-step round of steps sent at once: the slowest reply plus its browser time."""
    order = sorted(steps, key=lambda s: s.tokens)
    t, prev, worst = lm.prefill_s(order[0].images), 0, 0.0
    for i, step in enumerate(order):
        t += (step.tokens - prev) * _token_s(lm, len(order) - i)
        prev = step.tokens
        worst = max(worst, t + step.browser_s)
    return worst


def lockstep_makespan(episodes: Sequence[EpisodeWork], concurrency: int, lm: LatencyModel) -> tuple[float, int]:
    """Seconds for the lock-step baseline to run ``episodes``, and the number of rounds it takes."""
    total, rounds = 0.0, 0
    for b in range(0, len(episodes), concurrency):
        batch = episodes[b:b + concurrency]
        longest = max(len(e.steps) for e in batch)
        total += max(e.open_s for e in batch)
        for r in range(longest):
            total += _step_round(lm, [e.steps[r] for e in batch if len(e.steps) > r])
        # Episodes that stopped earlier finished during the rounds the longest ones still stepped.
        total += max(e.finish_s for e in batch if len(e.steps) == longest)
        rounds += longest + 2
    return total, rounds


def steady_in_flight(episodes: Sequence[EpisodeWork], concurrency: int, lm: LatencyModel) -> float:
    """Requests in flight when ``concurrency`` runners run these episodes with no barrier (Little's law)."""
    m = concurrency / 2
    for _ in range(200):
        model = sum(e.model_s(lm, m) for e in episodes)
        whole = sum(e.duration_s(lm, m) for e in episodes)
        nxt = concurrency * model / whole if whole > 0 else 0.0
        if abs(nxt - m) < 1e-6:
            break
        m = nxt
    return m


def async_makespan(episodes: Sequence[EpisodeWork], concurrency: int, lm: LatencyModel) -> tuple[float, float]:
    """Seconds for ``concurrency`` runners to run ``episodes`` in order, and the requests in flight meanwhile."""
    m = steady_in_flight(episodes, concurrency, lm)
    free = [0.0] * min(concurrency, max(1, len(episodes)))
    for e in episodes:  # each episode goes to the runner that frees up first
        i = min(range(len(free)), key=free.__getitem__)
        free[i] += e.duration_s(lm, m)
    return max(free), m


def predict(sync_work: Sequence[EpisodeWork], async_work: Sequence[EpisodeWork], concurrency: int,
            lm: LatencyModel) -> Prediction:
    """Both makespans at ``concurrency`` under the latency model ``lm``: the same episodes and model work, each
    mode's with the browser times of its own run (the model shares no CPU, the browsers do)."""
    sync_s, rounds = lockstep_makespan(sync_work, concurrency, lm)
    async_s, m = async_makespan(async_work, concurrency, lm)
    return Prediction(sync_s, async_s, m, rounds)


def median_or(values: Sequence[float], default: float) -> float:
    """The median of ``values``, or ``default`` when there are none."""
    return statistics.median(values) if values else default


# --- what the model predicts for other work: python -m bench.async_prediction ---------------------------------------
MIXES = {  # step caps a task draws from (uniformly): the bundled tasks' run caps, WebGym's train and test caps
    "caps 10 (most bundled tasks)": (10,),
    "caps 10/20/30 (WebGym train)": (10, 20, 30),
    "caps 30/50/70 (WebGym test)": (30, 50, 70),
}


@dataclass(frozen=True)
class BrowserProfile:
    """Browser seconds per step: ``navigating`` of the steps load a page (log-normal, ``load_median_s`` and shape
    ``load_sigma``), the others take ``action_s``; opening an episode is one page load."""

    action_s: float
    navigating: float = 0.0
    load_median_s: float = 0.0
    load_sigma: float = 0.0

    def step_s(self, key: str) -> float:
        rng = random.Random(key)
        if rng.random() >= self.navigating:
            return self.action_s
        return rng.lognormvariate(math.log(self.load_median_s), self.load_sigma)

    def open_s(self, key: str) -> float:
        return self.step_s(key) if self.navigating else 1.0


BROWSERS = {
    # The bundled sites as the async suite measures them: about 0.35 s a step, 1 s to open an episode.
    "local sites": BrowserProfile(action_s=0.35),
    # An assumption, not a measurement: half the steps navigate (the share the async suite counts on the bundled
    # sites) and a page load takes 3 s at the median with a long tail (HTTP Archive's desktop median onLoad is
    # about 6 s; an agent's settled screenshot comes before it).
    # The async_live suite's page server (bench.page_latency) serves its documents with these delays, capped.
    "live web (assumed)": BrowserProfile(action_s=0.35, navigating=0.5, load_median_s=LOAD_MEDIAN_S,
                                         load_sigma=LOAD_SIGMA),
}


def mix_ratio(caps: Sequence[int], concurrency: int, lm: LatencyModel, browser: BrowserProfile, *,
              episodes_per_slot: int = 4, seed: int = 0) -> Prediction:
    """The prediction for ``episodes_per_slot * concurrency`` episodes whose step caps are drawn from ``caps``,
    with the same browser times in both modes (no CPU contention); each mode in its order (the lock-step batches in
    the drawn order, the asynchronous engine the largest caps first, as ``run`` does)."""
    model = SimulatedModel(seed=seed, latency=lm, fixed_work=True)
    rng = random.Random(seed)
    plan = [(f"task{i}#0", rng.choice(caps)) for i in range(episodes_per_slot * concurrency)]
    work = planned_work(model, plan, 4, 512, lambda e, s: browser.step_s(f"{seed}:{e}/{s}"),
                        lambda e: browser.open_s(f"{seed}:{e}/open"), lambda _e: 0.05)
    longest_first = [w for _, w in sorted(zip(plan, work, strict=True), key=lambda pw: -pw[0][1])]
    return predict(work, longest_first, concurrency, lm)


def main(argv: list[str] | None = None) -> int:
    """Print (and store) the ratio the calibrated latency model predicts over task mixes, browser times and
    concurrencies."""
    ap = argparse.ArgumentParser(description="The asynchronous speed-up the latency model predicts (no run).")
    ap.add_argument("--concurrency", type=int, nargs="+", default=[8, 32, 128])
    ap.add_argument("--sigma", type=float, default=0.6, help="shape of the reply-length log-normal (the stand-in's)")
    ap.add_argument("--out", type=Path, default=None, help="write async_prediction.json here")
    args = ap.parse_args(argv)
    lm = dataclasses.replace(LatencyModel.qwen_vl_7b_h100(), sigma=args.sigma)
    rows, table = [], []
    for browser_name, browser in BROWSERS.items():
        for mix_name, caps in MIXES.items():
            for c in args.concurrency:
                p = mix_ratio(caps, c, lm, browser)
                table.append({"browser": browser_name, "mix": mix_name, "caps": list(caps), "concurrency": c,
                              "ratio": round(p.ratio, 3), "sync_s": round(p.sync_s, 1),
                              "async_s": round(p.async_s, 1), "in_flight": round(p.in_flight, 1)})
                rows.append(row(f"{browser_name}, {mix_name}, {c} rollouts", p.ratio, "x (predicted)"))
                print(f"{browser_name:20s} {mix_name:30s} C={c:<4d} {p.ratio:5.2f}x")
    if args.out is not None:
        notes = ["Computed, not measured: the latency model of Qwen2.5-VL-7B on one H100 "
                 "(LatencyModel.qwen_vl_7b_h100) prices 4 x C episodes of the simulated policy's fixed work "
                 "(it answers at 5% per step, unless the step cap comes first) in both modes, with the same browser "
                 "times in both (no CPU contention, which favours neither side); the lock-step batches take the "
                 "drawn order, the asynchronous engine the largest step caps first, as `run` does. The async and "
                 "async_live suites measure their whole-batch ratios beside this model's prediction for the same "
                 "work (async.json, async_live.json).",
                 "Browser times: " + "; ".join(f"{k}: {v}" for k, v in BROWSERS.items()) + ". The live-web profile "
                 "is an assumption (half the steps load a page; bench/page_latency.py's delays, uncapped), not a "
                 "measurement."]
        write_result(args.out / "async_prediction.json", "async_prediction", vars(args) | {"out": None}, rows, [],
                     notes, table=table)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
