"""The ``scaling`` suite: The engine with the instant policy at 8, 16, 32, ... concurrent rollouts on both profiles,
while memory allows: steps/s, step p95, browser PSS per rollout (goal: at most 70 MiB at 128) and the engine
process's CPU time per step (goal: at most 2 ms). Before each level the browser memory it needs is estimated from
the PSS per rollout measured so far; the suite stops when that would leave less than 2 GiB of the machine's
available memory, and records where and why it stopped.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import psutil

from bench import ceiling
from bench.suite import SuiteResult, plot_series
from bench.suites.common import OPEN_S_PER_ROLLOUT, PAGE_FACTS_S, GiB, engine_run_s, page_profile_facts

CONFIG: dict[str, dict[str, Any]] = {  # per scale (the CLI's --repeats overrides "repeats")
    "full": {"profiles": {"light": [8, 32, 128, 256], "heavy": [32, 128]},
             "seconds": 10.0, "repeats": 2, "ramp_timeout": 240.0},
    "quick": {"profiles": {"light": [128], "heavy": [16]}, "seconds": 5.0, "repeats": 1,
              "ramp_timeout": 90.0, "facts_pages": 2},
    "tiny": {"profiles": {"light": [2], "heavy": [2]}, "seconds": 1.0, "repeats": 1, "workers": 1, "facts_pages": 1,
             "ramp_timeout": 30.0},
}


def budget_s(cfg: dict[str, Any]) -> float:
    """What a run of ``cfg`` takes at most (bench.suites.common's time model): every level, its ramp capped at
    ``ramp_timeout``."""
    per_repeat = sum(engine_run_s(profile, n, cfg["seconds"])
                     - max(0.0, OPEN_S_PER_ROLLOUT[profile] * n - cfg["ramp_timeout"])
                     for profile, levels in cfg["profiles"].items() for n in levels)
    return PAGE_FACTS_S + cfg["repeats"] * per_repeat


MEMORY_FLOOR = 2 * GiB


async def measure(res: SuiteResult, cfg: dict[str, Any], base: str, out: Path) -> None:
    """Throughput, latency, memory and CPU per step from 8 rollouts up to what memory allows."""
    res.config["page_profiles"] = await asyncio.to_thread(page_profile_facts, base, list(cfg["profiles"]),
                                                          cfg.get("facts_pages"))
    reached: dict[str, list[int]] = {}
    for profile, levels in cfg["profiles"].items():
        per_rollout: float | None = None
        reached[profile] = []
        stop = f"the scale's last level ({levels[-1]}) was reached"
        for n in levels:
            avail = psutil.virtual_memory().available
            if per_rollout is not None and per_rollout * n > avail - MEMORY_FLOOR:
                stop = (f"memory: {n} rollouts would need ~{per_rollout * n / GiB:.1f} GiB of browser memory "
                        f"({per_rollout / 2**20:.0f} MiB each), {avail / GiB:.1f} GiB available, "
                        f"{MEMORY_FLOOR / GiB:.0f} GiB kept free")
                break
            rows = []
            for rep in range(cfg["repeats"]):
                row = await ceiling.engine_run(base, n, cfg["workers"], cfg["seconds"], 80,
                                               pages=ceiling.PROFILES[profile], ramp_timeout=cfg["ramp_timeout"])
                rows.append(row)
                k = f"{profile}.c{n}"
                res.add(f"{k}.steps_per_s", f"{profile} c{n}: steps/s", row["steps_per_s"], "steps/s")
                res.add(f"{k}.step_p95_ms", f"{profile} c{n}: step p95", row["step_latency_p95_ms"], "ms")
                res.add(f"{k}.pss_per_rollout_mib", f"{profile} c{n}: browser PSS per rollout",
                        row["pss_per_rollout_mib"], "MiB", ("<=", 70.0) if n == 128 else None)
                res.add(f"{k}.engine_cpu_ms_per_step", f"{profile} c{n}: engine CPU per step",
                        row["engine_cpu_ms_per_step"], "ms", ("<=", 2.0))
                res.runs.append({"repeat": rep, "profile": profile, **row})
                print(f"  scaling {profile:5s} c{n:<4d} {row['steps_per_s']:7.1f} steps/s  p95 "
                      f"{row['step_latency_p95_ms']:6.0f} ms  PSS {row['pss_per_rollout_mib']:5.1f} MiB/rollout  "
                      f"engine CPU {row['engine_cpu_ms_per_step']:.2f} ms/step  (ramp {row['ramp_s']} s)", flush=True)
            reached[profile].append(n)
            per_rollout = max(r["pss_per_rollout_mib"] for r in rows) * 2**20
            # Where memory would run out, from what this level measured: the browsers' PSS now plus what
            # the machine still has available (less the floor), at this level's PSS per rollout.
            room = psutil.virtual_memory().available - MEMORY_FLOOR
            limit = int((max(r["browser_pss_mib"] for r in rows) * 2**20 + max(0, room)) / per_rollout)
            res.add(f"{profile}.c{n}.memory_limit_rollouts", f"{profile} c{n}: rollouts that fit in memory (estimate)",
                    limit)
            if any(r["stepping"] < n for r in rows):
                stop = (f"ramp: at {n} rollouts not every rollout was stepping within {cfg['ramp_timeout']:.0f} s "
                        "(the machine is saturated)")
                break
        res.config.setdefault("stopped", {})[profile] = {"last_level": reached[profile][-1] if reached[profile]
                                                         else None, "reason": stop}
        res.add(f"{profile}.max_concurrency", f"{profile}: largest concurrency run", max(reached[profile], default=0))
        res.notes.append(f"{profile}: stopped after {max(reached[profile], default=0)} rollouts; {stop}.")
    metrics = [("steps_per_s", "steps/s", "scaling.png"), ("step_p95_ms", "step p95 (ms)", "scaling-latency.png"),
               ("pss_per_rollout_mib", "browser PSS per rollout (MiB)", "scaling-memory.png"),
               ("engine_cpu_ms_per_step", "engine CPU per step (ms)", "scaling-cpu.png")]
    for key, ylabel, name in metrics:
        hline = 70.0 if key == "pss_per_rollout_mib" else 2.0 if key == "engine_cpu_ms_per_step" else None
        plot_series(out / name, f"Scaling: {ylabel}", "concurrent rollouts", ylabel,
                    {p: (lv, [res.figures.get(f"{p}.c{n}.{key}") for n in lv]) for p, lv in reached.items()},
                    hline=hline)
        res.plots.append(name)
