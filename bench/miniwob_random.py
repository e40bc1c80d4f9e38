"""The random policy over every MiniWoB++ task, through the whole engine: mean reward and steps/s.

One episode per task (``--episodes`` for more, cycling over the tasks), the page's own reward, the step
cap of the task (10 steps for the train split), real workers and Chromium. Prints one line of figures, the
episodes that ended in an error (there should be none), and optionally writes them as JSON.

    python -m bench.miniwob_random [--tasks miniwob] [--workers K] [--concurrency N] [--json PATH]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import tempfile
import time
from pathlib import Path
from typing import Any

from engine.agent.prompts import AgentConfig, Interaction
from engine.clients.runner import run
from engine.core.config import RunConfig
from engine.sites.server import SiteServer
from engine.store.run_dir import read_records
from engine.tasks.miniwob import miniwob_mount
from policy.registry import make_policy


async def bench(spec: str, workers: int, concurrency: int, episodes: int | None, seed: int,
                out_dir: Path, interaction: Interaction = "som") -> dict[str, Any]:
    """Run the random policy on ``spec``'s tasks; the figures and the error records' messages.

    In ``som`` mode the random policy mostly clicks random interactive elements; in ``coordinates``
    mode random points of the whole viewport."""
    agent = AgentConfig(interaction=interaction)
    with SiteServer(mounts=miniwob_mount()) as server:
        cfg = RunConfig(tasks=spec, output_dir=str(out_dir / "runs"), workers=workers,
                        concurrency=concurrency, episodes=episodes, seed=seed)
        t0 = time.monotonic()
        stats, run_dir = await run(cfg, make_policy("random", seed=seed, agent=agent), server.base_url)
        wall = time.monotonic() - t0
    records = read_records(run_dir)
    rewards = [reward["value"] or 0.0 for r in records if (reward := r.get("reward"))]
    raw = [s["probe"]["raw_reward"] for r in records for s in r["steps"][-1:]
           if isinstance(s.get("probe"), dict) and s["probe"].get("done")]
    summary = stats.summary()
    return {
        "tasks": len({r["task"]["task_id"] for r in records}),
        "episodes": len(records),
        "mean_reward": round(sum(rewards) / max(1, len(records)), 4),
        "ended_by_page": len(raw),
        "mean_raw_reward_when_ended": round(sum(raw) / len(raw), 4) if raw else None,
        "steps": summary["steps"],
        "steps_per_s": summary["steps_per_s"],
        "step_latency_p50_ms": summary["step_latency_p50_ms"],
        "wall_s": round(wall, 1),
        "errors": {r["episode_id"]: r["error"] for r in records if r["status"] == "error"},
        "run_dir": str(run_dir),
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tasks", default="miniwob", help="miniwob (all) or miniwob:name,name,...")
    ap.add_argument("--workers", type=int, default=max(1, min(4, os.cpu_count() or 1)))
    ap.add_argument("--concurrency", type=int, default=16)
    ap.add_argument("--episodes", type=int, default=None)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--interaction", choices=("som", "coordinates"), default="som",
                    help="som: clicks mostly on random interactive elements; coordinates: anywhere")
    ap.add_argument("--out", help="run directory parent (default: a temporary directory)")
    ap.add_argument("--json", help="also write the figures here")
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="miniwob-bench-") as tmp:
        out = Path(args.out) if args.out else Path(tmp)
        out.mkdir(parents=True, exist_ok=True)
        res = asyncio.run(bench(args.tasks, args.workers, args.concurrency, args.episodes, args.seed, out,
                                args.interaction))
    print(f"random policy ({args.interaction}): tasks {res['tasks']}  episodes {res['episodes']}"
          f"  mean reward {res['mean_reward']:.3f}  "
          f"ended by the page {res['ended_by_page']}  steps {res['steps']}  steps/s {res['steps_per_s']:.1f}  "
          f"p50 step {res['step_latency_p50_ms']:.0f} ms  wall {res['wall_s']:.0f} s  errors {len(res['errors'])}")
    for episode, error in res["errors"].items():
        print(f"  error {episode}: {error}")
    if args.json:
        Path(args.json).write_text(json.dumps(res, indent=2) + "\n", encoding="utf-8")
    return 1 if res["errors"] else 0


if __name__ == "__main__":
    raise SystemExit(main())
