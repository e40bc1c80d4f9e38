"""Chromium's feature switches, A/B in one run: the engine's ``--disable-features`` alone (which, given after
Playwright's, dropped Playwright's list) against the merged switches the workers launch with now
(:func:`browserpool.config.launch_flags`).

Two workloads on the light pages, 2 browsers, rounds alternating which flags go first:

- clicks: :func:`bench.ceiling.bare_loop` (CDP mouse events + JPEG screenshot in a tight loop on 16 pages);
- page loads: 8 tabs each loading a light page, then ``about:blank`` (an episode's visit and reset), in a loop.

Prints, per side, steps/s and Chromium's CPU per click + screenshot, loads/s and Chromium's CPU per load (medians
over the rounds, with min and max), and the ratios new / old.

    python -m bench.feature_flags [--rounds 3] [--seconds 15] [--json PATH]
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import time
from pathlib import Path
from typing import Any

from playwright.async_api import async_playwright

from bench import ceiling
from bench.ceiling import own_stack_cpu
from bench.report import row, spread, write_result
from browserpool import config
from browserpool.config import DEFAULT_CHROMIUM
from engine.sites.server import SiteServer

SIDES: dict[str, list[str]] = {
    "old": [*config.QUIET_FLAGS, "--disable-features=" + ",".join(config.ENGINE_DISABLED_FEATURES)],
    "new": config.CHROMIUM_FLAGS,
}


async def page_loads(base: str, flags: list[str], seconds: float, tabs: int = 8) -> dict[str, float]:
    """Loads/s and Chromium's CPU per load over ``seconds`` of ``tabs`` tabs loading light pages and about:blank."""
    pw = await async_playwright().start()
    try:
        browsers = [await pw.chromium.launch(executable_path=DEFAULT_CHROMIUM, args=flags) for _ in range(2)]
        pages = [await (await browsers[i % 2].new_context(viewport={"width": 1280, "height": 768})).new_page()
                 for i in range(tabs)]
        count = 0
        stop = time.monotonic() + seconds
        before = own_stack_cpu()

        async def loop(i: int, page: Any) -> None:
            nonlocal count
            for k in itertools.count(i):  # each tab through the pages, from its own
                if time.monotonic() >= stop:
                    return
                await page.goto(base + ceiling.PAGES[k % len(ceiling.PAGES)], wait_until="load")
                await page.goto("about:blank")
                count += 2

        t0 = time.monotonic()
        await asyncio.gather(*(loop(i, p) for i, p in enumerate(pages)))
        took = time.monotonic() - t0
        after = own_stack_cpu()
        for b in browsers:
            await b.close()
    finally:
        await pw.stop()
    return {"loads_per_s": round(count / took, 2),
            "chromium_ms_per_load": round((after["chromium"] - before["chromium"]) * 1000 / max(1, count), 2)}


async def measure(rounds: int, seconds: float) -> dict[str, Any]:
    runs: dict[str, list[dict[str, Any]]] = {side: [] for side in SIDES}
    with SiteServer() as sites:
        for r in range(rounds):
            for side in (("old", "new") if r % 2 == 0 else ("new", "old")):
                clicks = await ceiling.bare_loop(sites.base_url, 16, 2, seconds, 80, warmup=3.0,
                                                 flags=SIDES[side])
                loads = await page_loads(sites.base_url, SIDES[side], seconds)
                run = {"round": r, "steps_per_s": clicks["steps_per_s"],
                       "chromium_ms_per_step": clicks["cpu_ms_per_step"]["chromium"], **loads}
                runs[side].append(run)
                print(f"  {side}: {run}", flush=True)
    summary = {side: {key: spread([run[key] for run in rs])
                      for key in ("steps_per_s", "chromium_ms_per_step", "loads_per_s", "chromium_ms_per_load")}
               for side, rs in runs.items()}
    ratios = {key: round(summary["new"][key]["median"] / summary["old"][key]["median"], 3)
              for key in summary["new"]}
    return {"summary": summary, "new_over_old": ratios, "runs": runs}


def summary_rows(result: dict[str, Any]) -> list[dict[str, Any]]:
    """The headline figures: each side's medians, and new / old."""
    rows = []
    for side, label in (("old", "the engine's switch alone (old)"), ("new", "merged switches (new)")):
        s = result["summary"][side]
        rows += [row(f"{label}: steps/s, click + screenshot", s["steps_per_s"]["median"], "steps/s"),
                 row(f"{label}: Chromium CPU per click + screenshot", s["chromium_ms_per_step"]["median"], "ms"),
                 row(f"{label}: page loads/s", s["loads_per_s"]["median"], "loads/s"),
                 row(f"{label}: Chromium CPU per page load", s["chromium_ms_per_load"]["median"], "ms")]
    ratios = result["new_over_old"]
    # No goal: the merge is a correctness fix (Playwright's switches were dropped); the ratios say what it costs.
    rows += [row("new / old: Chromium CPU per click + screenshot", ratios["chromium_ms_per_step"], "x"),
             row("new / old: Chromium CPU per page load", ratios["chromium_ms_per_load"], "x")]
    return rows


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=15.0)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args(argv)
    result = asyncio.run(measure(args.rounds, args.seconds))
    for side, s in result["summary"].items():
        print(f"{side}: {s['steps_per_s']['median']} steps/s, {s['chromium_ms_per_step']['median']} ms of Chromium "
              f"per click + screenshot; {s['loads_per_s']['median']} loads/s, {s['chromium_ms_per_load']['median']} ms "
              "per load (medians)")
    print("new / old:", result["new_over_old"])
    if args.json:
        config_ = {"rounds": args.rounds, "seconds": args.seconds, "flags": SIDES}
        notes = ["Rounds alternate which flags go first; the figures are medians over the rounds (min and max in "
                 "`summary_by_side`)."]
        write_result(args.json, "feature_flags", config_, summary_rows(result), [], notes,
                     summary_by_side=result["summary"], new_over_old=result["new_over_old"], runs=result["runs"])


if __name__ == "__main__":
    main()
