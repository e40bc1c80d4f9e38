"""What several suites share: the machine's size, the task mix on the bundled and heavy pages, the facts recorded
about the pages each profile loads, and the time model each suite's ``budget_s`` is computed from."""

from __future__ import annotations

import json
import os
import random
from pathlib import Path
from typing import Any

from bench import ceiling

CORES = max(1, os.cpu_count() or 1)
GiB = 2**30

# --- the time model of a suite's run (its ``budget_s(cfg)``): windows and ramps from its configuration, priced with
# the slower of what the parts took in two quick runs of 2026-12-04 on a 2-core machine (797 s and 616 s: the first
# before the quick scale was trimmed; this shared machine's speed moves by 10-20% between runs). Each part is rounded
# up: a budget is a bound, not a prediction.
#: Opening one rollout's page (a context, its tab, the page loaded), one at a time as the engine ramps or a bare loop
#: sets up: the ramps measured 0.24-0.66 s per rollout on light pages (16 to 128), 0.66-0.73 s on heavy ones.
OPEN_S_PER_ROLLOUT = {"light": 0.7, "heavy": 0.8}
#: Starting a pool of workers (their Chromium) and shutting it down, around one engine run.
ENGINE_RUN_FIXED_S = 8.0
#: Launching a bare loop's browsers and closing them (it opens its tabs 8 at a time: a quarter of the one-by-one
#: time on 2 cores).
BARE_LOOP_FIXED_S = 2.0
BARE_OPEN_SPEEDUP = 4.0
#: Recording the page facts of the profiles (one browser, a few pages each).
PAGE_FACTS_S = 5.0
#: Per episode per rollout slot, with the suites' simulated policy (model latency at speed 1): the asynchronous
#: side's makespan on the bundled pages (28.0-29.4 s for 2 per slot at 8 rollouts) and with live-web page loads
#: (111.7 s for 2 per slot at 32), and the lock-step side's (39.9-41.6 s; 311.2 s for 2, 147.4 s for 1).
EPISODE_S = {"local": 15.0, "live": 56.0}
SYNC_EPISODE_S = {"local": 21.0, "live": 156.0}
#: The asynchronous side's last episodes, past the mean (list scheduling's tail), as a share of one episode: 85.4 s
#: for 1 per slot with live-web loads, against 56 s a slot at 2.
TAIL = 0.55
#: Steps an episode of the task mix takes without step caps (123 steps in 16 episodes, 585 in 64, in those runs).
STEPS_PER_EPISODE = 9.2


def engine_run_s(profile: str, n: int, seconds: float) -> float:
    """An engine run at ``n`` rollouts on ``profile`` pages measured over ``seconds`` once every rollout runs."""
    return ENGINE_RUN_FIXED_S + OPEN_S_PER_ROLLOUT[profile] * n + seconds


def bare_loop_s(profile: str, n: int, seconds: float, warmup: float) -> float:
    """A bare CDP loop on ``n`` tabs: its browsers, the tabs opened, a warm-up and the window."""
    return BARE_LOOP_FIXED_S + OPEN_S_PER_ROLLOUT[profile] * n / BARE_OPEN_SPEEDUP + warmup + seconds


def whole_batches_s(pages: str, episodes_per_slot: int, runs: int, sim_speed: float = 1.0,
                    step_caps: list[int] | None = None) -> float:
    """``runs`` pairs of whole batches (asynchronous, then lock-step) of ``episodes_per_slot`` episodes per slot, the
    model's latency divided by ``sim_speed``, episodes cut to ``step_caps`` (their mean, against the uncut mix's)."""
    steps = min(1.0, sum(step_caps) / len(step_caps) / STEPS_PER_EPISODE) if step_caps else 1.0
    scale = steps / sim_speed
    per_pair = (episodes_per_slot * (EPISODE_S[pages] + SYNC_EPISODE_S[pages]) + TAIL * EPISODE_S[pages]) * scale
    return runs * (2 * ENGINE_RUN_FIXED_S + per_pair)


HEAVY_TASK_PAGES = [("shop.html", "Find the cheapest Kettle in the Bazaar catalogue and add it to the cart"),
                    ("news.html", "Open the most read Science article of The Daily Heavy and report its author"),
                    ("shop.html?cat=Audio", "Which Audio product on Bazaar has the highest rating?"),
                    ("news.html?section=Tech", "How many minutes does the lead Tech story take to read?")]


def write_task_mix(path: Path, heavy: int, seed: int) -> int:
    """The async suite's task file: the bundled tasks plus ``heavy`` tasks on the heavy pages, shuffled (seeded)
    so that every batch mixes sites; returns the number of tasks."""
    from engine.tasks.schema import BUNDLED_TASKS

    rows = [json.loads(line) for line in Path(BUNDLED_TASKS).read_text().splitlines() if line.strip()]
    for i in range(heavy):
        page, text = HEAVY_TASK_PAGES[i % len(HEAVY_TASK_PAGES)]
        rows.append({"task_id": f"heavy-{i:03d}", "task_name": text, "website": "{SITES}/heavy/" + page,
                     "benchmark_name": "webgym-bench-heavy", "domain": "benchmark", "difficulty": 2,
                     "evaluator_reference": [{"id": 1, "description": "benchmark page", "facts": [text]}]})
    random.Random(seed).shuffle(rows)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return len(rows)


def page_profile_facts(base: str, profiles: list[str], per_profile: int | None = None) -> dict[str, Any]:
    """DOM nodes, images (elements and distinct files) and bytes of each profile's pages (the first
    ``per_profile`` of them), as the benchmarks load them: recorded with the results."""
    from playwright.sync_api import sync_playwright

    from browserpool.config import CHROMIUM_FLAGS, DEFAULT_CHROMIUM

    facts: dict[str, Any] = {}
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=DEFAULT_CHROMIUM, args=CHROMIUM_FLAGS)
        page = browser.new_context(viewport={"width": 1280, "height": 768}).new_page()
        for profile in profiles:
            rows = {}
            for path in ceiling.PROFILES[profile][:per_profile]:
                page.goto(base + path, wait_until="load")
                page.wait_for_timeout(300)
                rows[path] = page.evaluate("""() => ({dom_nodes: document.getElementsByTagName('*').length,
                    images: document.images.length, distinct_images: new Set([...document.images].map(i => i.src)).size,
                    bytes: performance.getEntriesByType('resource').reduce((s, e) => s + e.encodedBodySize, 0)
                           + performance.getEntriesByType('navigation')[0].encodedBodySize})""")
            facts[profile] = rows
        browser.close()
    return facts
