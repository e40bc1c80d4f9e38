"""What recording and replaying page traffic cost: steps/s and CPU per step of the bundled tasks live, recorded and
replayed, in the same run, and the archive's size per episode.

In one process, on the same tasks, with the scripted policy and the real engine (engine.clients.runner.run:
spawned workers, the store, settle detection): first a run that records (``record_traffic``), then ``--repeats``
live runs and as many replays of that recording, alternating (live/replay, replay/live, ...: a drift of the
machine's load falls on both). Steps/s is the engine's own (pool start-up excluded); CPU is the whole process tree's
(this process, its browser workers and their Chromium, from getrusage of self and waited children) over the run,
per step, start-up included alike in every mode.

    python -m bench.traffic_replay [--repeats 2] [--episodes 48] [--concurrency 16] [--workers 2] [--json PATH]
"""

from __future__ import annotations

import argparse
import resource
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.report import row, spread, write_result
from engine.clients.runner import run
from engine.core.config import RunConfig
from engine.sites.server import SiteServer
from engine.store.run_dir import read_records
from policy.registry import make_policy

MODES = ("live", "record", "replay")


def cpu_s() -> float:
    """CPU seconds of this process and of its children that have ended (the workers and their Chromium)."""
    return sum(sum(resource.getrusage(who)[:2]) for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN))


async def one_run(base_url: str, mode: str, args: argparse.Namespace, out: Path, recording: str | None
                  ) -> tuple[dict[str, Any], Path]:
    """One engine run of ``args.episodes`` bundled tasks in ``mode``; its figures and run directory."""
    cfg = RunConfig(episodes=args.episodes, concurrency=args.concurrency, workers=args.workers, output_dir=str(out),
                    telemetry=None, record_traffic=mode == "record",
                    replay_traffic=recording if mode == "replay" else None)
    c0, t0 = cpu_s(), time.monotonic()
    stats, run_dir = await run(cfg, make_policy("scripted"), base_url)
    cpu = cpu_s() - c0
    records = read_records(run_dir)
    misses = sum(s["traffic"]["misses"] for r in records for s in r["steps"] if "traffic" in s)
    misses += sum(r["traffic"]["open"]["misses"] for r in records if "open" in r.get("traffic", {}))
    archives = sorted((run_dir / "traffic").glob("*.traffic")) if mode == "record" else []
    figures = {"mode": mode, "steps": stats.steps, "steps_per_s": round(stats.steps_per_s, 3),
               "cpu_ms_per_step": round(cpu * 1000 / max(1, stats.steps), 2), "wall_s": round(time.monotonic() - t0, 2),
               "succeeded": sum(r["status"] == "success" for r in records),
               "errors": sum(r["status"] == "error" for r in records), "misses": misses}
    if archives:
        sizes = [p.stat().st_size for p in archives]
        figures |= {"archives": len(sizes), "archive_kib_median": round(statistics.median(sizes) / 1024, 1),
                    "archive_kib_max": round(max(sizes) / 1024, 1)}
    return figures, run_dir


async def measure(args: argparse.Namespace) -> dict[str, Any]:
    runs: list[dict[str, Any]] = []
    with SiteServer() as server, tempfile.TemporaryDirectory(prefix="bench-traffic-") as tmp:
        recorded, recording = await one_run(server.base_url, "record", args, Path(tmp), None)
        runs.append(recorded)
        print(f"  record: {recorded}", flush=True)
        for i in range(args.repeats):
            for mode in (("live", "replay") if i % 2 == 0 else ("replay", "live")):
                figures, _ = await one_run(server.base_url, mode, args, Path(tmp), str(recording))
                runs.append(figures)
                print(f"  {mode}: {figures}", flush=True)
    summary = {m: {k: spread([r[k] for r in runs if r["mode"] == m]) for k in ("steps_per_s", "cpu_ms_per_step")}
               for m in MODES}
    live, replay = summary["live"], summary["replay"]
    return {"runs": runs, "summary": summary, "record": recorded,
            "replay_over_live_steps_per_s": round(replay["steps_per_s"]["median"] / live["steps_per_s"]["median"], 3),
            "replay_over_live_cpu": round(replay["cpu_ms_per_step"]["median"] / live["cpu_ms_per_step"]["median"], 3),
            "record_over_live_cpu": round(summary["record"]["cpu_ms_per_step"]["median"]
                                          / live["cpu_ms_per_step"]["median"], 3)}


def rows(result: dict[str, Any]) -> list[dict[str, Any]]:
    out = []
    for mode in MODES:
        s = result["summary"][mode]
        out.append(row(f"{mode}: steps/s", s["steps_per_s"]["median"], "steps/s"))
        out.append(row(f"{mode}: CPU per step (whole process tree)", s["cpu_ms_per_step"]["median"], "ms"))
    out.append(row("replayed / live: steps/s", result["replay_over_live_steps_per_s"], "x"))
    out.append(row("replayed / live: CPU per step", result["replay_over_live_cpu"], "x"))
    out.append(row("recorded / live: CPU per step", result["record_over_live_cpu"], "x"))
    out.append(row("archive per episode (median)", result["record"]["archive_kib_median"], "KiB"))
    out.append(row("replayed requests the recording lacked", sum(r["misses"] for r in result["runs"]
                                                                 if r["mode"] == "replay"), "requests"))
    return out


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``python -m bench.traffic_replay``."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=2, help="live and replayed runs each (alternating)")
    ap.add_argument("--episodes", type=int, default=48, help="episodes per run (the bundled tasks)")
    ap.add_argument("--concurrency", type=int, default=16)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--json", type=Path, default=None, help="also write the figures here")
    args = ap.parse_args(argv)
    import uvloop

    result = uvloop.run(measure(args))
    for mode in MODES:
        s = result["summary"][mode]
        print(f"{mode:7s} {s['steps_per_s']['median']:7.2f} steps/s  {s['cpu_ms_per_step']['median']:7.1f} ms CPU "
              "per step")
    print(f"replayed / live: steps/s {result['replay_over_live_steps_per_s']}x, CPU per step "
          f"{result['replay_over_live_cpu']}x; archive per episode {result['record']['archive_kib_median']} KiB")
    if args.json:
        write_result(args.json, "traffic_replay", {k: getattr(args, k) for k in ("repeats", "episodes",
                                                                                  "concurrency", "workers")},
                     rows(result), [], [
                         "A recording run first, then live and replayed runs alternating; the scripted policy on "
                         "the bundled tasks; steps/s the engine's own, CPU the whole process tree's per step.",
                         "The bundled sites are local: a replay saves no network time here, only the serving."],
                     runs=result["runs"], summary_by_mode=result["summary"], record=result["record"],
                     replay_over_live_steps_per_s=result["replay_over_live_steps_per_s"],
                     replay_over_live_cpu=result["replay_over_live_cpu"],
                     record_over_live_cpu=result["record_over_live_cpu"])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
