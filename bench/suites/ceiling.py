"""The ``ceiling`` suite: The engine with the instant policy (a fixed inert click: the policy costs nothing) against a
bare loop (CDP mouse events + JPEG screenshot on the same pages, same browser flags, same number of Chromium
instances, no engine: no settle detection, no storage), both over a steady-state window, at 8, 16, 32 and 64
concurrent rollouts (16 and 32 on the heavy profile): steps/s of each, their ratio (goal: at least 0.85 at 16 and
32), the engine's CPU per step and step p50/p95.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from bench import ceiling
from bench.suite import SuiteResult, plot_series
from bench.suites.common import PAGE_FACTS_S, bare_loop_s, engine_run_s, page_profile_facts

CONFIG: dict[str, dict[str, Any]] = {  # per scale (the CLI's --repeats overrides "repeats")
    "full": {"profiles": {"light": [8, 16, 32, 64], "heavy": [16, 32]}, "seconds": 10.0, "warmup": 3.0,
             "repeats": 3},
    "quick": {"profiles": {"light": [32], "heavy": [16]}, "seconds": 5.0, "warmup": 2.0, "repeats": 1},
    "tiny": {"profiles": {"light": [2]}, "seconds": 1.0, "warmup": 0.5, "repeats": 1, "workers": 1,
             "facts_pages": 1},
}


def budget_s(cfg: dict[str, Any]) -> float:
    """What a run of ``cfg`` takes at most (bench.suites.common's time model): both sides at every level."""
    per_repeat = sum(engine_run_s(profile, n, cfg["seconds"]) + bare_loop_s(profile, n, cfg["seconds"], cfg["warmup"])
                     for profile, levels in cfg["profiles"].items() for n in levels)
    return PAGE_FACTS_S + cfg["repeats"] * per_repeat


async def measure(res: SuiteResult, cfg: dict[str, Any], base: str, out: Path) -> None:
    """Engine (instant policy) vs bare CDP loop: steps/s and ratio per profile and concurrency."""
    res.config["page_profiles"] = await asyncio.to_thread(page_profile_facts, base, list(cfg["profiles"]),
                                                          cfg.get("facts_pages"))
    for rep in range(cfg["repeats"]):
        for profile, levels in cfg["profiles"].items():
            pages = ceiling.PROFILES[profile]
            for n in levels:
                # Alternate which side runs first, so that drift on a shared machine does not favour one.
                order = ("bare", "engine") if rep % 2 == 0 else ("engine", "bare")
                got: dict[str, dict[str, Any]] = {}
                for side in order:
                    if side == "bare":
                        got[side] = await ceiling.bare_loop(base, n, cfg["workers"], cfg["seconds"], 80, pages=pages,
                                                            warmup=cfg["warmup"])
                    else:
                        got[side] = await ceiling.engine_run(base, n, cfg["workers"], cfg["seconds"], 80, pages=pages)
                bare, eng = got["bare"], got["engine"]
                ratio = eng["steps_per_s"] / bare["steps_per_s"] if bare["steps_per_s"] else None
                k = f"{profile}.c{n}"
                res.add(f"{k}.bare_steps_per_s", f"{profile} c{n}: bare loop steps/s", bare["steps_per_s"], "steps/s")
                res.add(f"{k}.engine_steps_per_s", f"{profile} c{n}: engine steps/s", eng["steps_per_s"], "steps/s")
                goal = (">=", 0.85) if n in (16, 32) else None
                res.add(f"{k}.ratio", f"{profile} c{n}: engine / bare loop", ratio, "", goal)
                res.add(f"{k}.engine_cpu_ms_per_step", f"{profile} c{n}: engine CPU per step",
                        eng["engine_cpu_ms_per_step"], "ms")
                res.add(f"{k}.step_p50_ms", f"{profile} c{n}: engine step p50", eng["step_latency_p50_ms"], "ms")
                res.add(f"{k}.step_p95_ms", f"{profile} c{n}: engine step p95", eng["step_latency_p95_ms"], "ms")
                res.runs.append({"repeat": rep, "profile": profile, "concurrency": n, "bare": bare, "engine": eng})
                print(f"  ceiling {profile:5s} c{n:<4d} bare {bare['steps_per_s']:7.1f}  engine "
                      f"{eng['steps_per_s']:7.1f} steps/s  ratio {ratio or 0:.3f}", flush=True)
                for err in eng["error_detail"]:
                    print(f"    error after {err['steps']} steps on {err['website']}: {err['kind']}: "
                          f"{err['message']}", flush=True)
    series, styles = {}, {}
    for i, (profile, levels) in enumerate(cfg["profiles"].items()):
        for side, label, line in (("engine", "engine", "-"), ("bare", "bare loop", "--")):
            series[f"{profile}: {label}"] = (levels, [res.figures.get(f"{profile}.c{n}.{side}_steps_per_s")
                                                      for n in levels])
            styles[f"{profile}: {label}"] = {"color": f"C{i}", "linestyle": line}
    plot_series(out / "ceiling.png", "Engine vs bare CDP loop", "concurrent rollouts", "steps/s", series,
                styles=styles)
    ratios = {p: (lv, [res.figures.get(f"{p}.c{n}.ratio") for n in lv]) for p, lv in cfg["profiles"].items()}
    plot_series(out / "ceiling-ratio.png", "Engine / bare loop", "concurrent rollouts", "ratio", ratios, hline=0.85)
    res.plots += ["ceiling.png", "ceiling-ratio.png"]
