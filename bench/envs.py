"""What the step-level environment API costs: steps/s of N ``AsyncWebEnv``s driven by a trivial loop vs the
engine driving N rollouts itself with the instant policy (the path of ``webgym-engine run``), on the same pages.

Both sides run on one engine core (the same browsers, pages and warm caches), in alternating windows
(run/env, env/run, ...: a drift of the machine's load falls on both). Each window starts N episodes of endless
bench pages, waits until every one is past its first step, counts steps over ``--window`` seconds, then stops
them (the env side closes its envs; the run side cuts its rollouts). Both act alike: the same harmless in-page
click every step, no model. Prints every window, the medians and the ratio env / run.

    python -m bench.envs [--envs 32] [--workers 2] [--window 10] [--repeats 3] [--json PATH]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.ceiling import CLICK, PAGES
from browserpool.config import WorkerConfig
from engine.clients.env import AsyncWebEnv
from engine.core.config import RunConfig
from engine.core.core import EngineCore
from engine.sites.server import SiteServer
from engine.tasks.schema import Task
from policy.instant import InstantPolicy

ACTION = {"name": "left_click", "x": CLICK[0], "y": CLICK[1]}


def endless_tasks(base: str, n: int, tag: str) -> list[Task]:
    return [Task(task_id=f"{tag}-{i}", task_name="benchmark page", website=base + PAGES[i % len(PAGES)],
                 max_steps=1_000_000) for i in range(n)]


async def _window(core: EngineCore, stepped: set[str], n: int, seconds: float) -> dict[str, float]:
    """Wait for every episode to be past its first step, then count steps and the engine process's CPU time
    over ``seconds``."""
    ramp0 = time.monotonic()
    while len(stepped) < n and time.monotonic() - ramp0 < 120:
        await asyncio.sleep(0.05)
    await asyncio.sleep(1.0)  # settle into the steady state
    s0, t0, c0 = core.stats.steps, time.monotonic(), time.process_time()
    await asyncio.sleep(seconds)
    steps, dt, cpu = core.stats.steps - s0, time.monotonic() - t0, time.process_time() - c0
    return {"steps_per_s": round(steps / dt, 2), "ramp_s": round(time.monotonic() - ramp0 - seconds, 1),
            # The engine process's own CPU per step (its event loop, the env API or the policy, the store):
            # what the API adds shows here even when Chromium's CPU caps the steps/s of both sides.
            "engine_cpu_ms_per_step": round(1000 * cpu / max(1, steps), 3)}


async def run_side(core: EngineCore, stepped: set[str], base: str, n: int, seconds: float,
                   k: int) -> dict[str, Any]:
    """N rollouts driven by the engine with the instant policy."""
    rollouts = core.submit(core.context(InstantPolicy(*CLICK)), [(t, 0) for t in endless_tasks(base, n, f"run{k}")])
    row = await _window(core, stepped, n, seconds)
    core.cut(rollouts)
    await asyncio.gather(*(r.ended.wait() for r in rollouts))
    return {"side": "run", **row}


async def env_side(core: EngineCore, stepped: set[str], base: str, n: int, seconds: float,
                   k: int) -> dict[str, Any]:
    """N AsyncWebEnvs, each driven by a loop that sends the same click every step."""
    envs = [AsyncWebEnv(core) for _ in range(n)]

    async def drive(env: AsyncWebEnv, task: Task) -> None:
        await env.reset(task)
        while True:
            _, _, terminated, truncated, _ = await env.step(ACTION)
            if terminated or truncated:
                return

    loops = [asyncio.ensure_future(drive(e, t)) for e, t in zip(envs, endless_tasks(base, n, f"env{k}"), strict=True)]
    row = await _window(core, stepped, n, seconds)
    for loop in loops:
        loop.cancel()
    await asyncio.gather(*loops, return_exceptions=True)
    await asyncio.gather(*(e.close() for e in envs))
    return {"side": "env", **row}


async def measure(args: argparse.Namespace) -> dict[str, Any]:
    with SiteServer() as server, tempfile.TemporaryDirectory() as tmp:
        cfg = RunConfig(concurrency=args.envs, workers=args.workers, output_dir=tmp, telemetry=None,
                        worker=WorkerConfig(endpoint=""), episode_timeout_s=None, policy_step_timeout_s=None)
        windows: list[dict[str, Any]] = []
        async with EngineCore(cfg) as core:
            stepped: set[str] = set()  # episodes past their first step (one hook serves both sides alike)
            core.on_status(lambda st: stepped.add(st.episode_id) if st.step >= 1 else None)
            for k in range(args.repeats):
                for side in (("run", "env") if k % 2 == 0 else ("env", "run")):
                    fn = run_side if side == "run" else env_side
                    stepped.clear()
                    row = await fn(core, stepped, server.base_url, args.envs, args.window, k)
                    windows.append(row)
                    print(f"  window {len(windows)}: {side:3s} {row['steps_per_s']:7.2f} steps/s, engine CPU "
                          f"{row['engine_cpu_ms_per_step']:.2f} ms/step (ramp {row['ramp_s']} s)", flush=True)
    def median(side: str, key: str) -> float:
        return statistics.median(w[key] for w in windows if w["side"] == side)

    run_rate, env_rate = median("run", "steps_per_s"), median("env", "steps_per_s")
    ratio = env_rate / run_rate if run_rate else 0.0
    return {"envs": args.envs, "workers": args.workers, "window_s": args.window, "repeats": args.repeats,
            "windows": windows, "run_steps_per_s": run_rate, "env_steps_per_s": env_rate,
            "ratio_env_over_run": round(ratio, 4), "cost_pct": round(100 * (1 - ratio), 2), "goal_cost_pct": 5.0,
            "run_engine_cpu_ms_per_step": median("run", "engine_cpu_ms_per_step"),
            "env_engine_cpu_ms_per_step": median("env", "engine_cpu_ms_per_step")}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--envs", type=int, default=32)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--window", type=float, default=10.0)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args(argv)
    import uvloop

    result = uvloop.run(measure(args))
    print(f"run (instant policy): {result['run_steps_per_s']:.2f} steps/s   envs: {result['env_steps_per_s']:.2f} "
          f"steps/s   env/run {result['ratio_env_over_run']:.3f}  (cost {result['cost_pct']:.1f}%, goal < 5%)")
    print(f"engine process CPU per step: run {result['run_engine_cpu_ms_per_step']:.2f} ms, envs "
          f"{result['env_engine_cpu_ms_per_step']:.2f} ms")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
