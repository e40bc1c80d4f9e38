"""What the network policy for pages costs: steps/s of the bundled sites with the policy on and off.

In one process run, on the same tasks, with the scripted policy and the real engine (engine.clients.runner.run: spawned
workers over ZeroMQ, the trajectory store, settle detection): ``--repeats`` runs with the policy on and as many
with it off, alternating (on/off, off/on, ...: a drift of the machine's load falls on both). Each run's steps/s is
the engine's own (steps over the time from the engine's start to its last record; pool start-up excluded).
Prints every run, the medians, their ratio (on / off) and the cost in percent.

    python -m bench.netpolicy [--repeats 3] [--episodes 24] [--concurrency 16] [--workers 2] [--json PATH]
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from browserpool.config import WorkerConfig
from browserpool.protocol import NetSettings
from engine.clients.runner import run
from engine.core.config import RunConfig
from engine.sites.server import SiteServer
from engine.store.run_dir import read_records
from policy.registry import make_policy


async def one_run(base_url: str, policy_on: bool, args: argparse.Namespace, out: Path) -> dict[str, Any]:
    """One engine run of ``args.episodes`` bundled tasks; its steps/s and outcome counts."""
    cfg = RunConfig(episodes=args.episodes, concurrency=args.concurrency, workers=args.workers,
                    output_dir=str(out), telemetry=None,
                    worker=WorkerConfig(endpoint="", net=NetSettings(enabled=policy_on)))
    t0 = time.monotonic()
    stats, run_dir = await run(cfg, make_policy("scripted"), base_url)
    records = read_records(run_dir)
    return {"policy": "on" if policy_on else "off", "steps": stats.steps, "elapsed_s": round(stats.elapsed_s, 2),
            "steps_per_s": round(stats.steps_per_s, 3), "wall_s": round(time.monotonic() - t0, 2),
            "succeeded": sum(r["status"] == "success" for r in records),
            "errors": sum(r["status"] == "error" for r in records),
            "refused_events": sum(e["kind"] == "refused" for r in records for s in r["steps"]
                                  for e in s.get("events", []))}


async def measure(args: argparse.Namespace) -> dict[str, Any]:
    """Alternate policy-on and policy-off runs; the medians and their ratio."""
    runs: list[dict[str, Any]] = []
    with SiteServer() as server, tempfile.TemporaryDirectory(prefix="bench-netpolicy-") as tmp:
        for i in range(args.repeats):
            for policy_on in ((True, False) if i % 2 == 0 else (False, True)):
                r = await one_run(server.base_url, policy_on, args, Path(tmp))
                runs.append(r)
                print(f"  run {len(runs):2d}: policy {r['policy']:3s}  {r['steps']:4d} steps  "
                      f"{r['steps_per_s']:6.2f} steps/s  ({r['succeeded']} succeeded, {r['errors']} errors)",
                      flush=True)
    on = [r["steps_per_s"] for r in runs if r["policy"] == "on"]
    off = [r["steps_per_s"] for r in runs if r["policy"] == "off"]
    ratio = statistics.median(on) / statistics.median(off)
    return {"runs": runs, "on_steps_per_s": statistics.median(on), "off_steps_per_s": statistics.median(off),
            "on_range": [min(on), max(on)], "off_range": [min(off), max(off)], "ratio": round(ratio, 4),
            "cost_percent": round((1 - ratio) * 100, 2),
            "settings": {k: getattr(args, k) for k in ("repeats", "episodes", "concurrency", "workers")}}


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``python -m bench.netpolicy``."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=3, help="runs per setting (alternating)")
    ap.add_argument("--episodes", type=int, default=24, help="episodes per run (the bundled tasks in order)")
    ap.add_argument("--concurrency", type=int, default=16)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--json", help="also write the figures here")
    args = ap.parse_args(argv)
    import uvloop

    res = uvloop.run(measure(args))
    for name in ("on", "off"):
        low, high = res[f"{name}_range"]
        print(f"policy {name:3s}: {res[f'{name}_steps_per_s']:.2f} steps/s (median; {low:.2f}-{high:.2f})")
    print(f"on / off   : {res['ratio']:.3f}  (the policy costs {res['cost_percent']:.1f}% of steps/s; goal < 3%)")
    if args.json:
        Path(args.json).write_text(json.dumps(res, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
