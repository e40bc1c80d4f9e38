"""Chromium's headless shell against the full Chromium as the workers' browser, in one run.

Both sides run the same episodes of the bundled tasks (the instant policy clicking an inert point, ``--steps`` steps
each, ``--concurrency`` at a time, one worker), each with its own engine core, in two settings:

- ``fresh``: every episode in a new browser context (``context_reuse=1``), which is what a run's first episodes, a
  short run or a test pays: a context, a page and its renderer process per episode;
- ``reused``: the default context reuse, where an episode starts with a navigation of a warm page.

It reports, per side and setting, the time to start the engine's worker (launching the browser), steps/s, the
browser's CPU per step (its whole process tree, renderers that ended included) and its memory (PSS) at the end.
Sides alternate (shell/full, full/shell, ...) so that a drift of the machine's load falls on both.

    python -m bench.chromium_builds [--episodes 48] [--concurrency 8] [--steps 4] [--repeats 2] [--json PATH]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.ceiling import CLICK
from bench.proc_stats import sample
from bench.report import row, write_result
from browserpool.config import DEFAULT_CHROMIUM, FULL_CHROMIUM, WorkerConfig
from engine.core.config import RunConfig
from engine.core.core import EngineCore
from engine.sites.server import SiteServer
from engine.tasks.loading import load_tasks
from engine.tasks.schema import BUNDLED_TASKS, StepCaps
from policy.instant import InstantPolicy

SIDES = {"headless shell": DEFAULT_CHROMIUM, "full Chromium": FULL_CHROMIUM}
SETTINGS = {"fresh": 1, "reused": WorkerConfig(endpoint="").context_reuse}  # episodes per context


async def one_run(base: str, exe: str, reuse: int, args: argparse.Namespace, out: Path) -> dict[str, Any]:
    """One engine core on ``exe``: its start, then the episodes; the browser's CPU and memory from samples."""
    tasks = load_tasks(BUNDLED_TASKS, base, step_caps=StepCaps(train=(args.steps,) * 3))[:args.episodes]
    worker = WorkerConfig(endpoint="", chromium_path=exe, context_reuse=reuse)
    cfg = RunConfig(concurrency=args.concurrency, workers=1, worker=worker, telemetry=None, output_dir=str(out))
    t0 = time.monotonic()
    async with EngineCore(cfg) as core:
        start_s = time.monotonic() - t0
        policy = InstantPolicy(*CLICK)
        await core.start_policy(policy)
        before, steps0, t1 = await asyncio.to_thread(sample, core.pool), core.stats.steps, time.monotonic()
        await core.wait(core.submit(core.context(policy), [(t, None) for t in tasks]))
        wall, steps = time.monotonic() - t1, core.stats.steps - steps0
        after = await asyncio.to_thread(sample, core.pool)
    cpu = {k: after["workers_cpu_s"][k] - before["workers_cpu_s"][k] for k in after["workers_cpu_s"]}
    return {"start_s": round(start_s, 2), "steps": steps, "wall_s": round(wall, 2),
            "steps_per_s": round(steps / wall, 2), "browser_ms_per_step": round(1000 * cpu["browser"] / steps, 1),
            "stack_ms_per_step": round(1000 * sum(cpu.values()) / steps, 1),
            "browser_pss_mib": after["kinds"]["browser"]}


async def main_async(args: argparse.Namespace, out: Path) -> dict[str, Any]:
    runs: dict[str, dict[str, list[dict[str, Any]]]] = {s: {side: [] for side in SIDES} for s in SETTINGS}
    with SiteServer() as sites:
        for rep in range(args.repeats):
            order = list(SIDES) if rep % 2 == 0 else list(reversed(SIDES))
            for setting, reuse in SETTINGS.items():
                for side in order:
                    r = await one_run(sites.base_url, SIDES[side], reuse, args, out / f"{setting}-{side}-{rep}")
                    runs[setting][side].append(r)
                    print(f"  {setting:6} {side:14} start {r['start_s']} s, {r['steps_per_s']} steps/s, browser "
                          f"{r['browser_ms_per_step']} ms CPU per step, {r['browser_pss_mib']} MiB", flush=True)
    return runs


def median(rows: list[dict[str, Any]], key: str) -> float:
    return statistics.median(r[key] for r in rows)


def summary_rows(runs: dict[str, dict[str, list[dict[str, Any]]]]) -> list[dict[str, Any]]:
    """Per setting: each side's steps/s, browser CPU per step and memory (medians), and shell / full ratios."""
    rows = [row(f"worker start ({side}, median of all runs)",
                statistics.median(r["start_s"] for s in runs.values() for r in s[side]), "s") for side in SIDES]
    for setting, sides in runs.items():
        shell, full = sides["headless shell"], sides["full Chromium"]
        for side, rs in sides.items():
            rows += [row(f"{setting} contexts, {side}: steps/s", median(rs, "steps_per_s"), "steps/s"),
                     row(f"{setting} contexts, {side}: browser CPU per step", median(rs, "browser_ms_per_step"), "ms"),
                     row(f"{setting} contexts, {side}: browser memory at the end", median(rs, "browser_pss_mib"),
                         "MiB")]
        # The goals say why the shell is the default: it must be no slower and no costlier than the full browser.
        speed = median(shell, "steps_per_s") / median(full, "steps_per_s")
        cpu = median(shell, "browser_ms_per_step") / median(full, "browser_ms_per_step")
        rows += [row(f"{setting} contexts: steps/s, shell / full", speed, "x", ">= 1", speed >= 1),
                 row(f"{setting} contexts: browser CPU per step, shell / full", cpu, "x", "<= 1", cpu <= 1)]
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--episodes", type=int, default=48)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--steps", type=int, default=4, help="steps per episode")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    import uvloop

    with tempfile.TemporaryDirectory(prefix="bench-chromium-") as tmp:
        runs = uvloop.run(main_async(args, Path(tmp)))
    summary = summary_rows(runs)
    for r in summary:
        print(f"{r['figure']}: {r['value']} {r['unit']}")
    if args.json:
        notes = [f"{args.episodes} episodes of {args.steps} steps, {args.concurrency} at a time, one worker; "
                 f"{args.repeats} runs per side and setting, the sides alternating. Browser CPU: the worker's "
                 "Chromium process tree, renderers that ended included; memory: its PSS after the last episode.",
                 f"headless shell: {DEFAULT_CHROMIUM}; full Chromium: {FULL_CHROMIUM}."]
        write_result(args.json, "chromium_builds", {k: v for k, v in vars(args).items() if k != "json"}, summary,
                     [], notes, title="Chromium's headless shell against the full browser", runs=runs)


if __name__ == "__main__":
    main()
