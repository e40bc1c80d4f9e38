"""The benchmark suites of ``webgym-engine bench``: what each measures, how, and at which scale.

Every suite repeats its measurements ``repeats`` times (interleaving the configurations it compares, so
that a slow moment of a shared machine hits both sides), and reports each figure as the median with
min and max. Scales: ``full`` (the published figures; about 80 minutes on 2 cores), ``quick`` (all suites together in
under 10 minutes on a 2-core machine), ``tiny`` (seconds; the tests run it so that no suite rots).

Page profiles: ``light`` is the bundled sites (a few hundred DOM nodes, a handful of images); ``heavy``
is ``engine/sites/www/heavy/`` (a shop of 300 products and a news front page of 150 articles, rendered by
script from JSON: 3k-6k DOM nodes, 150-330 images per page), so that no figure holds only for toy pages.

ceiling
    The engine with the instant policy (a fixed inert click: the policy costs nothing) against a bare
    loop (CDP mouse events + JPEG screenshot on the same pages, same browser flags, same number of
    Chromium instances, no engine: no settle detection, no storage), both over a steady-state window,
    at 8, 16, 32 and 64 concurrent rollouts (16 and 32 on the heavy profile): steps/s of each, their ratio
    (goal: at least 0.85 at 16 and 32), the engine's CPU per step and step p50/p95.
async
    The engine in asynchronous mode against its own ``--mode sync`` baseline (a batch of ``concurrency``
    episodes advances in lock-step, every step waiting for the slowest episode), with the ``simulated``
    policy at its documented latency (``policy/simulated.py``, speed 1: prefill 40 ms + 15 ms per image,
    12 ms per output token growing as ``1 + in_flight / 64`` with the requests decoding at the same time,
    log-normal output lengths, median 90 tokens, sigma 0.6) in Set-of-Marks mode (the policy clicks
    interactive elements, so steps mix in-page changes and navigations) on the bundled tasks plus tasks on
    the heavy pages, seeded and shuffled the same way for both modes, so both run the same episodes in the
    same order. Each configuration is time-boxed: steps and finished episodes are counted over a fixed
    window that opens once every rollout has done its first step (the start-up burst of page loads is
    over) plus a short warm-up. Figures at 32, 128 and 256 rollouts: steps/s and episodes/min of each
    mode, the ratio (goal: at least 5x at 128), step latency p50/p95, the share of navigating steps.
scaling
    The engine with the instant policy at 8, 16, 32, ... concurrent rollouts on both profiles, while memory
    allows: steps/s, step p95, browser PSS per rollout (goal: at most 70 MiB at 128) and the engine
    process's CPU time per step (goal: at most 2 ms). Before each level the browser memory it needs is
    estimated from the PSS per rollout measured so far; the suite stops when that would leave less than
    2 GiB of the machine's available memory, and records where and why it stopped.
overhead
    The engine process's CPU per step by phase: a run with the simulated policy (fast, Set-of-Marks, so
    prompt building and parsing run) is timed without a profiler, then profiled with cProfile over a second
    window; each function's own time is mapped to a phase by its module (messaging: browserpool.pool,
    zmq, msgpack; image path: engine._imgcodec, shared-memory frames; prompt building: engine.agent's
    context and prompts, the agent policy; parsing: engine.agent.parser, coords, actions; store writes:
    engine.store; telemetry: engine.telemetry; scheduling: rollout, runner, stats; policy backend: the
    simulated model; library and builtin functions go to the phase of the project code that called them,
    the rest to "event loop and other"), and the phases' shares are applied to the unprofiled CPU per
    step (cProfile inflates Python time). Then ``bench/monitor.py``'s engine run: steps/s with a monitor
    process attached and without (telemetry on, nobody listening), alternating; goal: at most 3% fewer.
codec
    ``bench/codec.py``: the image path (decode, DCT-scaled decode, smart_resize, Set-of-Marks drawing,
    frame comparison) of ``engine._imgcodec`` against PyTurboJPEG and Pillow on screenshots of both
    profiles.
policy
    Only where CUDA is available: ``bench/policy.py``, the ``hf`` backend's dynamic batching on a
    random-weight Qwen2.5-VL architecture with a full-size language model (hidden 3584, 28 layers; built
    offline), one 1280x768 screenshot per request: requests/s and generated tokens/s against the number
    of concurrent requests.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import cProfile
import json
import os
import pstats
import random
import shutil
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import psutil

from bench import ceiling
from bench.suite import SCALES, Figure, SuiteResult, plot_series

CORES = max(1, os.cpu_count() or 1)
GiB = 2**30

# Per suite and scale: the configuration (the CLI's --repeats overrides "repeats").
CONFIGS: dict[str, dict[str, dict[str, Any]]] = {
    "ceiling": {
        "full": {"profiles": {"light": [8, 16, 32, 64], "heavy": [16, 32]}, "seconds": 10.0, "warmup": 3.0,
                 "repeats": 3},
        "quick": {"profiles": {"light": [16, 32], "heavy": [16]}, "seconds": 5.0, "warmup": 2.0, "repeats": 1},
        "tiny": {"profiles": {"light": [2]}, "seconds": 1.0, "warmup": 0.5, "repeats": 1, "workers": 1,
                 "facts_pages": 1},
    },
    "async": {
        "full": {"concurrency": [32, 128, 256], "seconds": 40.0, "warmup": 10.0, "repeats": 2, "heavy_tasks": 24,
                 "ramp_timeout": 150.0},
        "quick": {"concurrency": [32, 128], "seconds": 10.0, "warmup": 2.0, "repeats": 1, "heavy_tasks": 24,
                  "ramp_timeout": 45.0},
        "tiny": {"concurrency": [2], "seconds": 2.5, "warmup": 0.2, "repeats": 1, "heavy_tasks": 2, "workers": 1,
                 "sim_speed": 4.0, "ramp_timeout": 10.0},
    },
    "scaling": {
        "full": {"profiles": {"light": [8, 32, 128, 256], "heavy": [32, 128]},
                 "seconds": 10.0, "repeats": 2, "ramp_timeout": 240.0},
        "quick": {"profiles": {"light": [16, 128], "heavy": [32]}, "seconds": 5.0, "repeats": 1,
                  "ramp_timeout": 90.0, "facts_pages": 2},
        "tiny": {"profiles": {"light": [2], "heavy": [2]}, "seconds": 1.0, "repeats": 1, "workers": 1, "facts_pages": 1,
                 "ramp_timeout": 30.0},
    },
    "overhead": {
        "full": {"concurrency": 32, "warmup": 10.0, "seconds": 30.0, "sim_speed": 50.0, "monitor_concurrency": 32,
                 "monitor_seconds": 15.0, "repeats": 3},
        "quick": {"concurrency": 16, "warmup": 5.0, "seconds": 10.0, "sim_speed": 50.0, "monitor_concurrency": 16,
                  "monitor_seconds": 6.0, "repeats": 1},
        "tiny": {"concurrency": 2, "warmup": 1.0, "seconds": 1.5, "sim_speed": 50.0, "monitor_concurrency": 2,
                 "monitor_seconds": 1.0, "repeats": 1, "workers": 1},
    },
    "codec": {
        "full": {"reps": 80, "repeats": 3, "pages": {"light": 6, "heavy": 4}},
        "quick": {"reps": 20, "repeats": 1, "pages": {"light": 6, "heavy": 4}},
        "tiny": {"reps": 2, "repeats": 1, "pages": {"light": 1, "heavy": 1}},
    },
    "policy": {
        "full": {"concurrency": [1, 4, 16, 32, 64], "hidden_size": 3584, "layers": 28, "seconds": 20.0, "tokens": 64,
                 "repeats": 3},
        "quick": {"concurrency": [1, 16, 64], "hidden_size": 3584, "layers": 28, "seconds": 8.0, "tokens": 64,
                  "repeats": 1},
        "tiny": {"concurrency": [1, 2], "hidden_size": 256, "layers": 2, "seconds": 1.0, "tokens": 8, "repeats": 1},
    },
}

SuiteFn = Callable[[SuiteResult, dict[str, Any], str, Path], Awaitable[None]]


def config_for(suite: str, scale: str, repeats: int | None = None) -> dict[str, Any]:
    """The configuration of ``suite`` at ``scale``, with ``repeats`` overridden when given."""
    cfg = json.loads(json.dumps(CONFIGS[suite][scale]))  # a deep copy
    cfg.setdefault("workers", CORES)
    if repeats is not None:
        cfg["repeats"] = repeats
    return cfg


# --- ceiling -------------------------------------------------------------------------------------------------
async def suite_ceiling(res: SuiteResult, cfg: dict[str, Any], base: str, out: Path) -> None:
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


SATURATED_PCT = 95.0  # machine CPU busy share from which a run counts as CPU-bound

# --- async ---------------------------------------------------------------------------------------------------
HEAVY_TASK_PAGES = [("shop.html", "Find the cheapest Kettle in the Bazaar catalogue and add it to the cart"),
                    ("news.html", "Open the most read Science article of The Daily Heavy and report its author"),
                    ("shop.html?cat=Audio", "Which Audio product on Bazaar has the highest rating?"),
                    ("news.html?section=Tech", "How many minutes does the lead Tech story take to read?")]


def write_task_mix(path: Path, heavy: int, seed: int) -> int:
    """The async suite's task file: the bundled tasks plus ``heavy`` tasks on the heavy pages, shuffled (seeded)
    so that every batch mixes sites; returns the number of tasks."""
    from engine.tasks import BUNDLED_TASKS

    rows = [json.loads(line) for line in Path(BUNDLED_TASKS).read_text().splitlines() if line.strip()]
    for i in range(heavy):
        page, text = HEAVY_TASK_PAGES[i % len(HEAVY_TASK_PAGES)]
        rows.append({"task_id": f"heavy-{i:03d}", "task_name": text, "website": "{SITES}/heavy/" + page,
                     "benchmark_name": "webgym-bench-heavy", "domain": "benchmark", "difficulty": 2,
                     "evaluator_reference": [{"id": 1, "description": "benchmark page", "facts": [text]}]})
    random.Random(seed).shuffle(rows)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return len(rows)


class NavigationCounter:
    """Counts actions that moved a rollout to another page (path or query changed), from status updates."""

    def __init__(self) -> None:
        self.last: dict[str, tuple[str, str]] = {}
        self.navigations = 0

    def __call__(self, status: Any) -> None:
        if not status.url:
            return
        u = urlsplit(status.url)
        here = (u.path, u.query)
        before = self.last.get(status.episode_id)
        self.last[status.episode_id] = here
        if before is not None and before != here:  # an episode's first page is not a navigating step
            self.navigations += 1


def machine_busy(before: Any, after: Any) -> float:
    """The share of the machine's CPU time (all cores) that was busy between two ``psutil.cpu_times()``."""
    total = sum(after) - sum(before)
    idle = (after.idle + getattr(after, "iowait", 0.0)) - (before.idle + getattr(before, "iowait", 0.0))
    return round(1.0 - idle / total, 3) if total > 0 else 0.0


async def simulated_run(base: str, tasks_file: Path, mode: str, n: int, seconds: float, warmup: float,
                        workers: int, seed: int, out_dir: Path, sim_speed: float = 1.0,
                        ramp_timeout: float = 300.0) -> dict[str, Any]:
    """One time-boxed engine run with the simulated policy: steps/s and episodes/min over ``seconds``, from
    ``warmup`` s after every rollout has done its first step (or ``ramp_timeout`` s, whichever is first)."""
    from engine.agent.prompts import AgentConfig
    from engine.config import RunConfig
    from engine.runner import run
    from policy.registry import BackendConfig, make_policy

    agent = AgentConfig(interaction="som")
    backend = BackendConfig(sim_speed=sim_speed)
    # Every rollout may have its model call in flight (a served model queues them; the latency model slows
    # down with the requests it decodes), in both modes alike.
    cfg = RunConfig(tasks=str(tasks_file), concurrency=n, workers=workers, mode=mode,
                    output_dir=str(out_dir), episodes=n * 100, seed=seed,
                    policy_concurrency=max(128, n))
    policy = make_policy("simulated", seed=seed, agent=agent, backend=backend, max_in_flight=cfg.policy_concurrency)
    started: dict[str, Any] = {}

    def on_start(engine: Any, run_dir: Path) -> None:
        started["engine"], started["run_dir"], started["t"] = engine, run_dir, time.monotonic()

    navs = NavigationCounter()
    stepped: set[str] = set()

    def on_status(status: Any) -> None:
        navs(status)
        # Past its first step, or ended (an answer at step 0 ends an episode: in sync mode its slot then waits for
        # the batch, and would otherwise hold the window back until the next batch).
        if status.step >= 1 or status.state.value in ("F", "X"):
            stepped.add(status.episode_id)

    task = asyncio.ensure_future(run(cfg, policy, base, on_start=on_start, on_status=on_status))
    while "engine" not in started and not task.done():
        await asyncio.sleep(0.05)
    if task.done():
        task.result()  # raises what went wrong
    stats = started["engine"].stats
    # The window opens once as many episodes as there are rollouts have finished a step (every page opened,
    # the start-up burst over), plus the warm-up: both modes are measured in their steady state.
    ramp0 = time.monotonic()
    while len(stepped) < n and time.monotonic() - ramp0 < ramp_timeout and not task.done():
        await asyncio.sleep(0.1)
    ramp_s = time.monotonic() - ramp0
    await asyncio.sleep(warmup)
    t0, s0, e0, l0, c0 = time.monotonic(), stats.steps, stats.done, len(stats.step_latencies_ms), time.process_time()
    n0, m0 = navs.navigations, psutil.cpu_times()
    await asyncio.sleep(seconds)
    t1, s1, e1, c1 = time.monotonic(), stats.steps, stats.done, time.process_time()
    n1, m1 = navs.navigations, psutil.cpu_times()
    lat = sorted(stats.step_latencies_ms[l0:]) or [0.0]
    errors = stats.outcomes["error"]
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task
    steps = s1 - s0
    return {"mode": mode, "concurrency": n, "window_s": round(t1 - t0, 2), "steps": steps,
            "steps_per_s": round(steps / (t1 - t0), 3), "episodes": e1 - e0,
            "episodes_per_min": round((e1 - e0) * 60 / (t1 - t0), 3),
            "step_p50_ms": round(lat[len(lat) // 2], 1), "step_p95_ms": round(lat[int(len(lat) * 0.95)], 1),
            "engine_cpu_ms_per_step": round((c1 - c0) * 1000 / max(1, steps), 3),
            "navigating_share": round((n1 - n0) / steps, 3) if steps else None,
            "errors": errors, "peak_browser_pss_mib": round(stats.peak_browser_pss / 2**20, 1),
            "ramp_s": round(ramp_s, 1), "machine_cpu_busy": machine_busy(m0, m1),
            "phases_p50_p95_ms": {k: v[:2] for k, v in stats.phase_percentiles().items()}}


async def suite_async(res: SuiteResult, cfg: dict[str, Any], base: str, out: Path) -> None:
    """Asynchronous engine vs its lock-step baseline with the simulated latency model."""
    with tempfile.TemporaryDirectory(prefix="bench-async-") as tmp:
        tasks_file = Path(tmp) / "tasks.jsonl"
        res.config["tasks"] = write_task_mix(tasks_file, cfg["heavy_tasks"], seed=0)
        for rep in range(cfg["repeats"]):
            for n in cfg["concurrency"]:
                got: dict[str, dict[str, Any]] = {}
                for mode in (("async", "sync") if rep % 2 == 0 else ("sync", "async")):
                    got[mode] = await simulated_run(base, tasks_file, mode, n, cfg["seconds"], cfg["warmup"],
                                                    cfg["workers"], seed=rep, out_dir=Path(tmp) / f"{mode}-{n}-{rep}",
                                                    sim_speed=cfg.get("sim_speed", 1.0),
                                                    ramp_timeout=cfg["ramp_timeout"])
                a, s = got["async"], got["sync"]
                k = f"c{n}"
                for mode, row in got.items():
                    res.add(f"{k}.{mode}.steps_per_s", f"c{n}: {mode} steps/s", row["steps_per_s"], "steps/s")
                    res.add(f"{k}.{mode}.episodes_per_min", f"c{n}: {mode} episodes/min", row["episodes_per_min"],
                            "episodes/min")
                    res.add(f"{k}.{mode}.step_p50_ms", f"c{n}: {mode} step p50", row["step_p50_ms"], "ms")
                    res.add(f"{k}.{mode}.step_p95_ms", f"c{n}: {mode} step p95", row["step_p95_ms"], "ms")
                    res.add(f"{k}.{mode}.navigating_share", f"c{n}: {mode} share of navigating steps",
                            row["navigating_share"])
                    res.add(f"{k}.{mode}.machine_cpu_busy", f"c{n}: {mode} machine CPU busy",
                            100 * row["machine_cpu_busy"], "%")
                goal = (">=", 5.0) if n == 128 else None
                res.add(f"{k}.ratio_steps", f"c{n}: async / sync steps/s",
                        a["steps_per_s"] / s["steps_per_s"] if s["steps_per_s"] else None, "x", goal)
                res.add(f"{k}.ratio_episodes", f"c{n}: async / sync episodes/min",
                        a["episodes_per_min"] / s["episodes_per_min"] if s["episodes_per_min"] else None, "x")
                res.runs.append({"repeat": rep, "concurrency": n, "async": a, "sync": s})
                print(f"  async c{n:<4d} async {a['steps_per_s']:6.2f} steps/s {a['episodes_per_min']:6.1f} ep/min   "
                      f"sync {s['steps_per_s']:6.2f} steps/s {s['episodes_per_min']:6.1f} ep/min", flush=True)
    levels = cfg["concurrency"]
    plot_series(out / "async.png", "Asynchronous vs lock-step (simulated VLM latency)", "concurrent rollouts",
                "steps/s", {m: (levels, [res.figures.get(f"c{n}.{m}.steps_per_s") for n in levels])
                            for m in ("async", "sync")})
    plot_series(out / "async-ratio.png", "Asynchronous / lock-step", "concurrent rollouts", "x",
                {"steps/s": (levels, [res.figures.get(f"c{n}.ratio_steps") for n in levels]),
                 "episodes/min": (levels, [res.figures.get(f"c{n}.ratio_episodes") for n in levels])}, hline=5.0)
    res.plots += ["async.png", "async-ratio.png"]
    res.notes.append("Step latency is each rollout's own step (model call + action + settle + screenshot); in sync "
                     "mode a step also waits at the batch barrier, which the latency does not include. Episodes/min "
                     "counts episodes that finished inside the window; in sync mode they finish in bursts towards "
                     "the end of each batch, so a window shorter than a few batches (the quick scale) makes that "
                     "figure noisy: steps/s is the primary figure.")
    busy = res.medians([f"c{n}.async.machine_cpu_busy" for n in levels])
    saturated = [n for n, b in zip(levels, busy, strict=True) if b is not None and b >= SATURATED_PCT]
    if saturated:
        res.notes.append(
            f"At {', '.join(f'c{n}' for n in saturated)} the asynchronous runs kept the machine's CPUs at least "
            f"{SATURATED_PCT:g}% busy (machine CPU busy above): the browsers, not the model, bound the throughput "
            "there, and the lock-step baseline uses the CPU its barriers leave idle for the same browser work. "
            "The ratio then measures CPU headroom rather than the cost of the barriers; it grows with the cores "
            "available to Chromium (each navigation costs Chromium about 0.1-0.3 CPU-s on this kind of machine).")


# --- scaling -------------------------------------------------------------------------------------------------
MEMORY_FLOOR = 2 * GiB


async def suite_scaling(res: SuiteResult, cfg: dict[str, Any], base: str, out: Path) -> None:
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


# --- overhead ------------------------------------------------------------------------------------------------
PHASES: list[tuple[str, tuple[str, ...]]] = [
    ("messaging", ("browserpool/pool.py", "browserpool/protocol.py", "/zmq/", "msgpack")),
    ("image path", ("_imgcodec", "browserpool/shm.py")),
    ("prompt building", ("engine/agent/context.py", "engine/agent/prompts.py", "policy/agent_policy.py",
                         "policy/model.py", "policy/vision.py", "policy/base.py")),
    ("parsing", ("engine/agent/parser.py", "engine/agent/coords.py", "engine/actions.py")),
    ("store writes", ("engine/store.py",)),
    ("telemetry", ("engine/telemetry.py", "engine/progress.py")),
    ("policy backend", ("policy/simulated.py", "policy/instant.py")),
    ("scheduling", ("engine/rollout.py", "engine/runner.py", "engine/stats.py", "engine/rewards.py",
                    "engine/judging.py")),
]
OTHER = "event loop and other"
OTHER_THREADS = "other threads"  # the engine process's threads besides the loop: ZeroMQ I/O, memory sampler
PHASE_NAMES = [p for p, _ in PHASES] + [OTHER, OTHER_THREADS]


def _direct_phase(func: tuple[str, int, str]) -> str | None:
    """The phase of a profiled function by its file (or, for builtins, its qualified name); None: by caller."""
    filename, _, name = func
    where = filename.replace(os.sep, "/") if filename != "~" else name
    for phase, markers in PHASES:
        if any(m in where for m in markers):
            return phase
    return None


def phase_times(stats: pstats.Stats) -> dict[str, float]:
    """Own CPU time (s) per phase: project functions by module; library functions and builtins by their callers'
    phases (split by the time spent under each caller), recursively; what no project code called: OTHER."""
    raw: dict[Any, Any] = stats.stats  # type: ignore[attr-defined]
    memo: dict[Any, dict[str, float]] = {}

    def shares(func: Any, depth: int, seen: frozenset[Any]) -> dict[str, float]:
        if func in memo:
            return memo[func]
        phase = _direct_phase(func)
        if phase is not None:
            out = {phase: 1.0}
        else:
            callers = raw.get(func, (0, 0, 0.0, 0.0, {}))[4]
            weights = {c: v[2] + v[3] for c, v in callers.items() if c not in seen}
            total = sum(weights.values())
            if depth > 8 or not total:
                out = {OTHER: 1.0}
            else:
                out = {}
                for caller, w in weights.items():
                    for p, s in shares(caller, depth + 1, seen | {func}).items():
                        out[p] = out.get(p, 0.0) + s * w / total
        if depth == 0 or phase is not None:
            memo[func] = out
        return out

    times = {p: 0.0 for p in PHASE_NAMES if p != OTHER_THREADS}
    for func, (_, _, tt, _, _) in raw.items():
        for p, s in shares(func, 0, frozenset()).items():
            times[p] += tt * s
    return times


async def profiled_run(base: str, n: int, warmup: float, seconds: float, workers: int, sim_speed: float,
                       out_dir: Path, pyspy_path: Path | None = None) -> dict[str, Any]:
    """The engine with the (fast) simulated policy: CPU per step unprofiled, then (with ``pyspy_path``) a py-spy
    sample of the process into that file over half a window, then per phase under cProfile."""
    from engine.agent.prompts import AgentConfig
    from engine.config import RunConfig
    from engine.runner import run
    from policy.registry import BackendConfig, make_policy

    agent = AgentConfig(interaction="som")
    backend = BackendConfig(sim_speed=sim_speed)
    tasks_file = out_dir / "tasks.jsonl"
    write_task_mix(tasks_file, 8, seed=0)
    cfg = RunConfig(tasks=str(tasks_file), concurrency=n, workers=workers,
                    output_dir=str(out_dir / "runs"), episodes=n * 1000)
    policy = make_policy("simulated", agent=agent, backend=backend)
    started: dict[str, Any] = {}
    stepping: set[str] = set()

    def on_status(st: Any) -> None:
        if st.step >= 1 or st.state.value in ("F", "X"):
            stepping.add(st.episode_id)

    task = asyncio.ensure_future(run(cfg, policy, base, on_start=lambda e, d: started.update(engine=e),
                                     on_status=on_status))
    while "engine" not in started and not task.done():
        await asyncio.sleep(0.05)
    if task.done():
        task.result()
    stats = started["engine"].stats
    ramp0 = time.monotonic()
    # Measure once every rollout is past its first page load (a slow machine takes a while to get there).
    while len(stepping) < n and time.monotonic() - ramp0 < 120 and not task.done():
        await asyncio.sleep(0.1)
    await asyncio.sleep(warmup)
    t0, s0, c0, th0 = time.monotonic(), stats.steps, time.process_time(), time.thread_time()
    await asyncio.sleep(seconds)
    t1, s1, c1, th1 = time.monotonic(), stats.steps, time.process_time(), time.thread_time()
    # CPU time of the event loop's thread, not wall time: on a busy machine wall time also counts the moments
    # the process waits for a core.
    pyspy = await pyspy_window(seconds / 2, pyspy_path) if pyspy_path is not None else None
    prof = cProfile.Profile(time.thread_time)
    prof.enable()
    p0, ps0 = stats.steps, time.process_time()
    await asyncio.sleep(seconds)
    prof.disable()
    p1, ps1 = stats.steps, time.process_time()
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task
    times = phase_times(pstats.Stats(prof))
    total = sum(times.values()) or 1.0
    steps = max(1, s1 - s0)
    cpu_per_step = (c1 - c0) * 1000 / steps
    loop_per_step = min(cpu_per_step, (th1 - th0) * 1000 / steps)  # the event loop's thread: what cProfile sees
    phase_ms = {p: loop_per_step * t / total for p, t in times.items()}
    phase_ms[OTHER_THREADS] = cpu_per_step - loop_per_step
    top = sorted(pstats.Stats(prof).stats.items(), key=lambda kv: -kv[1][2])[:15]  # type: ignore[attr-defined]
    return {"concurrency": n, "steps_per_s": round((s1 - s0) / (t1 - t0), 2),
            "cpu_ms_per_step": round(cpu_per_step, 3),
            "profiled_cpu_ms_per_step": round((ps1 - ps0) * 1000 / max(1, p1 - p0), 3),
            "loop_thread_cpu_ms_per_step": round(loop_per_step, 3),
            "phase_share_of_loop_thread": {p: round(t / total, 4) for p, t in times.items()},
            "phase_ms_per_step": {p: round(ms, 4) for p, ms in phase_ms.items()},
            "top_functions": [{"function": f"{f[0]}:{f[1]}({f[2]})", "own_s": round(v[2], 4), "calls": v[1]}
                              for f, v in top],
            "pyspy": pyspy}


async def pyspy_window(seconds: float, path: Path) -> dict[str, Any] | None:
    """Sample this (the engine's) process with py-spy for ``seconds``, without pausing it, into ``path`` (collapsed
    stacks); returns the functions with the most samples on top of the stack. None when py-spy is not installed
    or may not attach (it needs ptrace rights over the process)."""
    exe = shutil.which("py-spy", path=f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}")
    if exe is None:
        return None
    proc = await asyncio.create_subprocess_exec(
        exe, "record", "--pid", str(os.getpid()), "--duration", str(max(1, round(seconds))), "--rate", "100",
        "--nonblocking", "--format", "raw", "--output", str(path),
        stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE)
    _, err = await proc.communicate()
    if proc.returncode != 0 or not path.exists():
        return {"error": err.decode(errors="replace").strip().splitlines()[-1:] or "py-spy failed"}
    return collapsed_top(path.read_text())


def collapsed_top(text: str, n: int = 15) -> dict[str, Any]:
    """Leaf functions with the most samples in py-spy's collapsed stacks (``frame;frame;leaf count`` lines), with
    their share of all samples (py-spy leaves out the samples of a waiting thread: these are CPU samples)."""
    own: dict[str, int] = {}
    for line in text.splitlines():
        stack, _, count = line.rpartition(" ")
        if stack and count.isdigit():
            leaf = stack.rsplit(";", 1)[-1]
            own[leaf] = own.get(leaf, 0) + int(count)
    total = sum(own.values())
    top = sorted(((c, f) for f, c in own.items()), reverse=True)[:n]
    return {"samples": total,
            "top_own": [{"function": f, "samples": c, "share": round(c / max(1, total), 4)} for c, f in top]}


async def monitor_windows(n: int, workers: int, seconds: float, repeats: int) -> list[tuple[float, float]] | None:
    """Steps/s without and with an attached monitor, one pair per repeat, from ``bench/monitor.py``; None if absent.

    HOOK: the live monitor (``tui/``) and its benchmark (``bench/monitor.py``) are maintained with the monitor;
    this suite calls that module rather than measuring the monitor its own way, so that both report the same
    thing. It knows two shapes of it: ``engine_overhead(n, workers, window_s, repeats)`` (alternating windows of
    one run: ``{"windows": [{"monitor": bool, "steps_per_s": x}, ...]}``) and ``engine_run(base, n, workers,
    seconds, monitor)`` (one run per side: ``{"steps_per_s": x}``)."""
    try:
        from bench import monitor
    except ImportError:
        return None
    if hasattr(monitor, "engine_overhead"):
        # A monitor that never subscribes must not hang the suite.
        limit = 180.0 + repeats * 2 * (seconds + 10.0)
        got = await asyncio.wait_for(monitor.engine_overhead(n, workers, seconds, repeats), limit)
        pairs: list[tuple[float, float]] = []
        windows = got.get("windows") or got.get("runs") or []
        for i in range(0, len(windows) - 1, 2):
            side = {bool(w["monitor"]): float(w["steps_per_s"]) for w in windows[i:i + 2]}
            if len(side) == 2:
                pairs.append((side[False], side[True]))
        return pairs
    if hasattr(monitor, "engine_run"):
        from engine.sites.server import SiteServer

        pairs = []
        with SiteServer() as server:
            for rep in range(repeats):
                side = {}
                for attached in ((False, True) if rep % 2 == 0 else (True, False)):
                    side[attached] = (await monitor.engine_run(server.base_url, n, workers, seconds,
                                                               attached))["steps_per_s"]
                pairs.append((side[False], side[True]))
        return pairs
    return None


async def suite_overhead(res: SuiteResult, cfg: dict[str, Any], base: str, out: Path) -> None:
    """Engine CPU per step by phase (cProfile shares of the unprofiled CPU time); monitor attached vs not."""
    for rep in range(cfg["repeats"]):
        with tempfile.TemporaryDirectory(prefix="bench-overhead-") as tmp:
            row = await profiled_run(base, cfg["concurrency"], cfg["warmup"], cfg["seconds"], cfg["workers"],
                                     cfg["sim_speed"], Path(tmp), pyspy_path=out / f"engine-pyspy-{rep}.txt")
        res.add("cpu_ms_per_step", f"c{cfg['concurrency']}: engine CPU per step (simulated policy, SoM)",
                row["cpu_ms_per_step"], "ms", ("<=", 2.0))
        res.add("steps_per_s", f"c{cfg['concurrency']}: steps/s (profile run)", row["steps_per_s"], "steps/s")
        for phase, ms in row["phase_ms_per_step"].items():
            res.add(f"phase.{phase.replace(' ', '_')}", f"CPU per step: {phase}", ms, "ms")
        res.runs.append({"repeat": rep, "kind": "profile", **row})
        print(f"  overhead: {row['cpu_ms_per_step']:.2f} ms CPU per step at {row['steps_per_s']:.1f} steps/s: "
              + ", ".join(f"{p} {ms:.3f}" for p, ms in row["phase_ms_per_step"].items()), flush=True)
    n, secs = cfg["monitor_concurrency"], cfg["monitor_seconds"]
    pairs = await monitor_windows(n, cfg["workers"], secs, cfg["repeats"])
    if pairs is None:
        res.notes.append("monitor: bench/monitor.py (engine_overhead or engine_run) is not available; steps/s with "
                         "and without an attached monitor were not measured.")
    else:
        for rep, (without, with_) in enumerate(pairs):
            res.add("monitor.without_steps_per_s", f"c{n}: steps/s, no monitor attached", without, "steps/s")
            res.add("monitor.with_steps_per_s", f"c{n}: steps/s, monitor attached", with_, "steps/s")
            res.add("monitor.slowdown_pct", f"c{n}: steps/s lost to an attached monitor",
                    100 * (1 - with_ / without) if without else None, "%", ("<=", 3.0))
            res.runs.append({"repeat": rep, "kind": "monitor", "without_steps_per_s": without,
                             "with_steps_per_s": with_})
            print(f"  overhead: monitor off {without:.1f} steps/s, on {with_:.1f} steps/s", flush=True)
    phases = PHASE_NAMES
    plot_series(out / "overhead.png", "Engine CPU per step by phase", "phase", "ms per step",
                {"CPU": (phases, [res.figures.get(f"phase.{p.replace(' ', '_')}") for p in phases])},
                logx=False, kind="bar")
    res.plots.append("overhead.png")
    res.notes.append("Phases: cProfile (thread CPU time; each function's own time, library and builtin calls charged "
                     "to the project code that made them) gives the shares of the event loop thread's CPU, applied to "
                     "that thread's CPU per step measured without the profiler; 'other threads' is the rest of the "
                     "process's CPU time (ZeroMQ's I/O thread, the memory sampler).")


# --- codec ---------------------------------------------------------------------------------------------------
async def suite_codec(res: SuiteResult, cfg: dict[str, Any], base: str, out: Path) -> None:
    """``bench/codec.py`` on screenshots of both page profiles."""
    from bench import codec

    pages = [p for profile, k in cfg["pages"].items() for p in ceiling.PROFILES[profile][:k]]
    # The codec benchmark drives its own event loop (screenshots) and times synchronous calls: a thread.
    shots = await asyncio.to_thread(codec.capture_screenshots, codec.QUALITY, pages)
    for rep in range(cfg["repeats"]):
        row = await asyncio.to_thread(codec.run, cfg["reps"], None, shots)
        res.runs.append({"repeat": rep, **row})
        for op, libs in row["median_ms"].items():
            for lib, ms in libs.items():
                res.add(f"{op}.{lib}_ms", f"{op}: {lib}", ms, "ms")
            if "pillow" in libs and libs.get("imgcodec"):
                res.add(f"{op}.speedup_vs_pillow", f"{op}: imgcodec speed-up over Pillow",
                        libs["pillow"] / libs["imgcodec"], "x")
    res.config["screenshots"] = len(shots)
    ops = list(res.runs[0]["median_ms"]) if res.runs else []
    plot_series(out / "codec.png", "Image path (median ms per call)", "operation", "ms",
                {lib: (ops, [res.figures.get(f"{op}.{lib}_ms") for op in ops]) for lib in codec.LIBS},
                logx=False, kind="bar")
    res.plots.append("codec.png")


# --- policy --------------------------------------------------------------------------------------------------
def gpu_unavailable_reason() -> str | None:
    """Why the policy suite cannot run here (None when it can)."""
    try:
        import torch
    except ImportError:
        return "torch is not installed"
    if not torch.cuda.is_available():
        return "no CUDA GPU (torch.cuda.is_available() is False)"
    return None


async def suite_policy(res: SuiteResult, cfg: dict[str, Any], base: str, out: Path) -> None:
    """``bench/policy.py``: the hf backend's requests/s and tokens/s against concurrent requests (GPU only)."""
    reason = gpu_unavailable_reason()
    if reason is not None:
        res.skipped = reason
        return
    from bench import policy as policy_bench

    for rep in range(cfg["repeats"]):
        args = argparse.Namespace(arch="qwen2_5_vl", device="cuda", hidden_size=cfg["hidden_size"],
                                  layers=cfg["layers"], max_pixels=1280 * 28 * 28, tokens=cfg["tokens"],
                                  seconds=cfg["seconds"], concurrency=cfg["concurrency"])
        rows = await policy_bench.main_async(args)
        for r in rows:
            c = r["concurrency"]
            res.add(f"c{c}.requests_per_s", f"c{c}: requests/s", r["requests_per_s"], "req/s")
            res.add(f"c{c}.tokens_per_s", f"c{c}: generated tokens/s", r["tokens_per_s"], "tok/s")
            res.add(f"c{c}.mean_batch", f"c{c}: mean batch", r["mean_batch"])
            res.add(f"c{c}.speedup", f"c{c}: requests/s vs 1 request", r["speedup"], "x")
        res.runs.append({"repeat": rep, "rows": rows})
    levels = cfg["concurrency"]
    plot_series(out / "policy.png", "hf backend: dynamic batching", "concurrent requests", "per second",
                {"requests/s": (levels, [res.figures.get(f"c{c}.requests_per_s") for c in levels]),
                 "tokens/s / 10": (levels, [_scaled(res.figures.get(f"c{c}.tokens_per_s"), 0.1) for c in levels])})
    res.plots.append("policy.png")


def _scaled(fig: Figure | None, k: float) -> Figure | None:
    return None if fig is None else Figure(fig.key, fig.label, fig.unit, None, [v * k for v in fig.values])


assert set(SCALES) == {s for c in CONFIGS.values() for s in c}
SUITES: dict[str, SuiteFn] = {"ceiling": suite_ceiling, "async": suite_async, "scaling": suite_scaling,
                              "overhead": suite_overhead, "codec": suite_codec, "policy": suite_policy}


async def run_suite(name: str, scale: str, out: Path, base: str, repeats: int | None = None) -> SuiteResult:
    """Run one suite at ``scale``; an exception inside it is recorded in the result (``error``), not raised."""
    cfg = config_for(name, scale, repeats)
    res = SuiteResult(name, scale, cfg["repeats"], config=dict(cfg))
    t0 = time.monotonic()
    try:
        await SUITES[name](res, cfg, base, out)
    except Exception as exc:  # noqa: BLE001 - one broken suite must not lose the others' results
        res.config["error"] = f"{type(exc).__name__}: {exc}"
        res.notes.append(f"the suite failed: {type(exc).__name__}: {exc}")
        print(f"  {name}: FAILED: {type(exc).__name__}: {exc}", flush=True)
    res.duration_s = time.monotonic() - t0
    return res


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
