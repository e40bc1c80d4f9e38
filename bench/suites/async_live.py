"""The ``async_live`` suite: the ``async`` suite's whole batches (:mod:`bench.suites.async_sync`: the same episodes,
policy, latency model and prediction) on the bundled sites served with the page-load times of the live web.

Pages: :mod:`bench.page_latency`, a benchmark stand-in for the internet. Each document a browser navigates to
arrives after a delay keyed by its URL (log-normal, 3 s at the median, shape 0.8, at most 8 s: an assumption
drawn from HTTP Archive's onLoad times, not a measurement); the rest of a page arrives at once. The original
system's 4-5x came from such work: a lock-step round waits for the slowest of its page loads, an asynchronous
engine does not. The server waits without CPU, as a remote site does, so this 2-core machine can run the level
the latency model needs for 3.5x.

Concurrency: 32 rollouts carry the goals (the asynchronous side at least 3.5x, and at least 0.9 of the
prediction). With page loads of seconds a step takes several times as long as on the local pages, so 32
rollouts ask this machine for fewer steps a second than 16 do on the ``async`` suite's pages (5.7 against 9.2 in
the stored runs), and its CPU stays well short of busy (the share is measured and stored beside the ratio). 16 is
measured to show the growth with concurrency. A quick run at 16 rollouts with 2 episodes per rollout (the file's
order in both modes) measured 2.16x against 2.15x predicted, at 32 with 2 per rollout 2.79x against 2.78x: with few
episodes per runner the asynchronous side's last episodes (the tail of list scheduling) weigh more. The quick scale
runs 1 per rollout of at most 6 steps (its two batches took 427 s with 2 of up to 9 steps on average, 233 s with 1),
so its ratio is the tail's more still; the prediction, priced on the same work, is the figure to hold it to.

The ``tiny`` scale (the tests') runs the suite's code on the plain bundled sites, in seconds; the page-latency
server has tests of its own (``tests/test_page_latency.py``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from bench import page_latency
from bench.suite import SuiteResult
from bench.suites.async_sync import Headline, measure_batches
from bench.suites.common import whole_batches_s

LIVE = Headline(concurrency=32, ratio_goal=3.5, plot_prefix="async-live", pages="live-web page loads")

CONFIG: dict[str, dict[str, Any]] = {  # per scale (the CLI's --repeats overrides "repeats")
    "full": {"concurrency": [16, 32], "episodes_per_slot": 4, "repeats": 2, "timeout_s": 2400.0, "pages": "live"},
    "quick": {"concurrency": [32], "episodes_per_slot": 1, "repeats": 1, "timeout_s": 1200.0, "pages": "live",
              "step_caps": [6, 6, 6]},
    "tiny": {"concurrency": [2], "episodes_per_slot": 2, "repeats": 1, "workers": 1, "sim_speed": 4.0,
             "step_caps": [3, 3, 3], "timeout_s": 120.0, "pages": "local"},
}


def budget_s(cfg: dict[str, Any]) -> float:
    """What a run of ``cfg`` takes at most (bench.suites.common's time model): both modes' whole batches."""
    pages = "live" if cfg["pages"] == "live" else "local"
    return whole_batches_s(pages, cfg["episodes_per_slot"], cfg["repeats"] * len(cfg["concurrency"]),
                           cfg.get("sim_speed", 1.0), cfg.get("step_caps"))


async def measure(res: SuiteResult, cfg: dict[str, Any], base: str, out: Path) -> None:
    """Whole batches, asynchronous and lock-step, with live-web page loads; beside the latency model's prediction."""
    from engine.sites.server import SiteServer

    if cfg["pages"] == "local":
        await measure_batches(res, cfg, base, out, LIVE)
        return
    with SiteServer(module="bench.page_latency") as server:
        await measure_batches(res, cfg, server.base_url, out, LIVE)
    res.notes.append(f"Pages: bench/page_latency.py ({page_latency.describe()}).")
