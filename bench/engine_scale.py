"""Engine-only scale: how many rollouts one engine process drives when the browsers are not the limit.

The browsers are null workers (``bench/null_worker.py``, a benchmark stand-in: the worker protocol and
shared-memory frames, an instant answer with a pre-encoded JPEG), started as separate processes that join the
engine's socket like workers on other hosts. What is measured is the engine process: its steps/s, its CPU per
step, the step latency (p50/p95; with browsers that take no time, a step's latency is the engine's own overhead
plus its queueing: at saturation, rollouts / steps/s), and its memory per rollout (the engine's RSS growth over
an idle engine, divided by the rollouts). Two policies:

- ``instant``: a fixed inert click (the policy costs nothing): messaging, scheduling, frames, store writes;
- ``protocol``: the full agent protocol with a stand-in model that answers at once (a canned ``computer_use``
  reply): the chat of every step built (system prompt, context window, image references), the reply parsed and
  mapped, and the step's messages stored.

Each level is time-boxed: steps are counted over ``--seconds`` once every rollout has stepped. A py-spy sample of
the engine process at the largest level says where its time goes. Every level keeps its rollouts' screenshots
until their episodes end: at thousands of rollouts that is gigabytes of fresh memory, and ``bench.tmpfs_writes``
measures what the machine charges for writing into it (the frame writer's CPU per frame is that write).

    python -m bench.engine_scale [--levels 256 1024 4096 8192] [--policies instant protocol] [--workers 2]
                                 [--seconds 10] [--json docs/benchmarks/engine_scale.json]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import gc
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import psutil
import uvloop

from bench.ceiling import CLICK
from bench.null_worker import PAGE_URL, null_workers
from bench.proc_stats import thread_cpu
from bench.suite import machine_facts
from browserpool.pool import BrowserPool
from browserpool.protocol import MAX_SLOTS
from engine.agent.model_api import ChatRequest, Generation, LanguageModel
from engine.agent.policy_api import Policy
from engine.agent.prompts import AgentConfig
from engine.core.builders import pool_config
from engine.core.config import RunConfig
from engine.core.core import EngineCore
from engine.core.gc_tuning import tune_for_engine_process
from engine.episode.status import EpisodeStatus
from engine.store.run_dir import RunStore
from engine.tasks.schema import Task
from policy.agent_policy import AgentPolicy
from policy.instant import InstantPolicy

OPENS_PER_NULL_WORKER = 256
REPLY = ('Action: click the inert margin\n<tool_call>\n{"name": "computer_use", "arguments": '
         '{"action": "left_click", "coordinate": [998, 500]}}\n</tool_call>')


class InstantModel(LanguageModel):
    """A stand-in model (named as such) that answers every chat at once with the same tool call."""

    name = "instant-model"
    model_name = "instant-model (benchmark stand-in)"

    async def generate(self, request: ChatRequest) -> Generation:
        return Generation(REPLY, finish_reason="stop")


class GcMeter:
    """CPU time the cyclic garbage collector takes from the thread it runs on, per generation (``gc.callbacks``).

    A collection runs on the thread that allocates, so at thousands of rollouts it shows in py-spy as time in
    whatever line allocated (a decode, a reply): this says how much of it is the collector's."""

    def __init__(self) -> None:
        self.seconds = [0.0, 0.0, 0.0]
        self.count = [0, 0, 0]
        self._t0 = 0.0

    def __call__(self, phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            self._t0 = time.thread_time()
        else:
            self.seconds[info["generation"]] += time.thread_time() - self._t0
            self.count[info["generation"]] += 1

    def __enter__(self) -> GcMeter:
        gc.callbacks.append(self)
        return self

    def __exit__(self, *_: object) -> None:
        gc.callbacks.remove(self)


def make_policy(kind: str) -> Policy:
    if kind == "instant":
        return InstantPolicy(*CLICK)
    if kind == "protocol":
        return AgentPolicy(InstantModel(), AgentConfig(response_format="vanilla", window=2))
    raise ValueError(f"unknown policy {kind!r}; expected instant or protocol")


async def level(n: int, policy_kind: str, workers: int, seconds: float, steps_per_episode: int,
                profile: Path | None = None, run_root: str | None = None,
                ring_slots: int | None = None) -> dict[str, Any]:
    """One engine with ``n`` rollouts on ``workers`` null workers: steps/s, CPU and latency per step, memory.
    Run it in a fresh process (``--one``): the memory per rollout is the growth of that process's RSS. The run
    directory goes below ``run_root`` (default: the temp directory). ``ring_slots``: the null workers' rings, when
    not the size the pool gives a browser worker (fewer slots than rollouts send frames inline)."""
    from bench.suites.overhead import pyspy_window

    # The pool gives a worker's ring two slots per rollout (engine.core.builders.pool_config), and a ring has at most
    # MAX_SLOTS: enough workers that two per rollout fit (with fewer, frames would travel inline). 96 short of the
    # limit, as the stored levels were measured (5 workers at 8,192 rollouts).
    workers = max(workers, -(-2 * n // (MAX_SLOTS - 96)))
    me = psutil.Process()
    uss0 = me.memory_full_info().uss  # everything imported, nothing started (USS: the workers' rings left out)
    # Enough episodes that none runs out in the window (each one ends after steps_per_episode steps).
    samples = max(3, -(-int(2 * seconds * 2500) // (steps_per_episode * n)))
    with tempfile.TemporaryDirectory(prefix="bench-scale-", dir=run_root) as tmp, contextlib.ExitStack() as stack:
        endpoint = f"ipc://{tmp}/engine.sock"
        cfg = RunConfig(concurrency=n, workers=workers, telemetry=None, listen=endpoint, spawn_workers=False,
                        policy_concurrency=max(128, n), output_dir=tmp)
        # A null worker's page load is instant: the cap on loads in flight per worker (there for Chromium) would
        # only stretch the start-up of thousands of rollouts, which is not what this measures.
        pcfg = dataclasses.replace(pool_config(cfg, os.path.join(tmp, "workers.log")),
                                   opens_per_worker=OPENS_PER_NULL_WORKER)
        # The null workers' rings: the size the pool gives a browser worker for this run.
        procs = stack.enter_context(null_workers(endpoint, workers, ring_slots or pcfg.worker.slot_count))
        store = RunStore(os.path.join(tmp, "run"))
        pool = BrowserPool(pcfg)
        try:
            await pool.start()
            core = EngineCore(cfg, pool=pool, store=store)
            await core.start()
            stepping: set[str] = set()

            def on_status(st: EpisodeStatus) -> None:
                if st.step >= 2:
                    stepping.add(st.episode_id)

            core.on_status(on_status)
            tasks = [Task(task_id=f"scale-{i}", task_name="benchmark page", website=f"{PAGE_URL}task-{i}",
                          max_steps=steps_per_episode) for i in range(n)]
            plan = [(t, s) for s in range(samples) for t in tasks]
            run = asyncio.ensure_future(core.run_plan(make_policy(policy_kind), plan))
            stats = core.stats
            ramp0 = time.monotonic()
            while len(stepping) < n and not run.done() and time.monotonic() - ramp0 < 300:
                await asyncio.sleep(0.1)
            if run.done():
                run.result()  # raises what went wrong
            ramp_s = time.monotonic() - ramp0
            await asyncio.sleep(min(2.0, seconds / 4))  # past the start-up burst
            workers_cpu = [psutil.Process(p.pid) for p in procs]
            w0 = sum(sum(w.cpu_times()[:2]) for w in workers_cpu)
            t0, s0, l0, i0 = time.monotonic(), stats.steps, len(stats.step_latencies_ms), pool.inline_frames
            c0, th0, threads0 = time.process_time(), time.thread_time(), thread_cpu()
            uss = me.memory_full_info().uss
            with GcMeter() as gc_meter:
                await asyncio.sleep(seconds)
            t1, s1, c1, th1 = time.monotonic(), stats.steps, time.process_time(), time.thread_time()
            inline = pool.inline_frames - i0
            threads = {name: round((cpu - threads0.get(name, 0.0)) / (t1 - t0), 3)
                       for name, cpu in thread_cpu().items()}
            w1 = sum(sum(w.cpu_times()[:2]) for w in workers_cpu)
            pyspy = await pyspy_window(min(seconds, 5.0), profile) if profile is not None else None
            lat = sorted(stats.step_latencies_ms[l0:]) or [0.0]
            errors = stats.outcomes["error"]
            run.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await run
            await core.close()
        finally:
            await pool.close()
            store.close()
    steps, window = s1 - s0, t1 - t0
    return {"policy": policy_kind, "concurrency": n, "workers": workers, "window_s": round(window, 2),
            "steps": steps, "steps_per_s": round(steps / window, 1),
            "engine_cpu_ms_per_step": round((c1 - c0) * 1000 / max(1, steps), 4),
            "loop_cpu_ms_per_step": round((th1 - th0) * 1000 / max(1, steps), 4),
            "loop_busy": round((th1 - th0) / window, 3),
            "gc_ms_per_step": round(sum(gc_meter.seconds) * 1000 / max(1, steps), 4),
            "gc_share_of_loop": round(sum(gc_meter.seconds) / max(1e-9, th1 - th0), 3),
            "gc_collections": gc_meter.count, "gc_full_ms": round(gc_meter.seconds[2] * 1000, 1),
            "null_workers_cpu_busy": round((w1 - w0) / window, 3),
            "step_p50_ms": round(lat[len(lat) // 2], 2), "step_p95_ms": round(lat[int(len(lat) * 0.95)], 2),
            "engine_threads_cpu_busy": threads,
            "engine_uss_mib": round(uss / 2**20, 1),
            "uss_per_rollout_kib": round((uss - uss0) / 1024 / n, 1),
            "inline_frames": inline, "ramp_s": round(ramp_s, 1), "errors": errors, "pyspy": pyspy}


def level_in_process(n: int, policy_kind: str, args: argparse.Namespace, profile: Path | None) -> dict[str, Any]:
    """:func:`level` in a fresh Python process (its memory is the level's alone); the row it printed."""
    cmd = [sys.executable, "-m", "bench.engine_scale", "--one", str(n), policy_kind, "--workers", str(args.workers),
           "--seconds", str(args.seconds), "--steps", str(args.steps), *(["--run-root", args.run_root]
                                                                        if args.run_root else [])]
    if profile is not None:
        cmd += ["--profile-file", str(profile)]
    out = subprocess.run(cmd, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=900)
    if out.returncode != 0:
        raise RuntimeError(f"level {policy_kind} c{n} failed: {out.stderr[-2000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def run_levels(args: argparse.Namespace) -> list[dict[str, Any]]:
    """Every policy at every level, each in its own process; prints a line per level."""
    rows = []
    for policy_kind in args.policies:
        for i, n in enumerate(args.levels):
            profile = None
            if args.profile and i == len(args.levels) - 1:
                profile = Path(args.profile_dir) / f"engine-scale-{policy_kind}-{n}.txt"
                profile.parent.mkdir(parents=True, exist_ok=True)
            row = level_in_process(n, policy_kind, args, profile)
            rows.append(row)
            print(f"{policy_kind:8s} c{n:<5d} {row['steps_per_s']:8.1f} steps/s  engine CPU "
                  f"{row['engine_cpu_ms_per_step']:.3f} ms/step, its loop {row['loop_cpu_ms_per_step']:.3f} "
                  f"({100 * row['loop_busy']:.0f}% of a core); null workers {100 * row['null_workers_cpu_busy']:.0f}%"
                  f"  step p50 {row['step_p50_ms']:.1f} ms p95 {row['step_p95_ms']:.1f} ms  "
                  f"{row['uss_per_rollout_kib']:.0f} KiB/rollout  inline frames {row['inline_frames']}  "
                  f"errors {row['errors']}", flush=True)
            busy = {k: v for k, v in row["engine_threads_cpu_busy"].items() if v >= 0.02}
            print(f"    garbage collector: {row['gc_ms_per_step']:.3f} ms/step, "
                  f"{100 * row['gc_share_of_loop']:.0f}% of the loop; collections per generation "
                  f"{row['gc_collections']}, full ones {row['gc_full_ms']:.0f} ms in all")
            print(f"    engine threads (share of a core): {busy}")
            if row["pyspy"] and "top_own" in row["pyspy"]:
                for f in row["pyspy"]["top_own"][:8]:
                    print(f"    {100 * f['share']:5.1f}%  {f['function']}")
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--levels", type=int, nargs="+", default=[256, 1024, 4096, 8192])
    ap.add_argument("--policies", nargs="+", default=["instant", "protocol"], choices=["instant", "protocol"])
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--seconds", type=float, default=10.0)
    ap.add_argument("--steps", type=int, default=20, help="steps per episode (then the episode's record)")
    ap.add_argument("--profile", action="store_true", help="py-spy the engine at each policy's largest level")
    ap.add_argument("--profile-dir", default="bench-results/engine-scale")
    ap.add_argument("--run-root", default=None,
                    help="where the run directories go (e.g. /dev/shm: the screenshots then cost no disk writes)")
    ap.add_argument("--json", type=Path, default=None)
    ap.add_argument("--one", nargs=2, metavar=("N", "POLICY"), help=argparse.SUPPRESS)  # one level, as JSON
    ap.add_argument("--profile-file", type=Path, default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.one:
        tune_for_engine_process()  # as webgym-engine run does
        row = uvloop.run(level(int(args.one[0]), args.one[1], args.workers, args.seconds, args.steps,
                               args.profile_file, args.run_root))
        print(json.dumps(row, default=str))
        return
    machine = machine_facts()  # as it was at the start, not after the levels' load
    rows = run_levels(args)
    if args.json:
        args.json.write_text(json.dumps({"benchmark": "engine_scale", "machine": machine,
                                         "config": {k: v for k, v in vars(args).items()
                                                    if k not in ("json", "one", "profile_file")},
                                         "rows": rows}, indent=1, default=str) + "\n")


if __name__ == "__main__":
    main()
