"""The live monitor's costs.

1. Keeping up: 1,024 simulated rollouts, every cell changing about ten times a second, published through the
   real TelemetryPublisher (10 Hz) to the real monitor app (a separate process, Textual headless): the
   monitor's CPU use, messages received vs sent, seq gaps, and the lag from publish to apply.
2. The engine's cost: the engine with the instant policy on the bundled sites (as bench/ceiling.py), steps/s
   with a monitor process attached vs without one (telemetry on, nobody listening), in alternating windows of
   one run; medians and their ratio.

    python -m bench.monitor [--rollouts 1024] [--seconds 20] [--engine-seconds 15] [--repeats 3] [--json PATH]
    python -m bench.monitor --export-svg docs/monitor.svg    # the README's screenshot, of a real run
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import psutil

from bench.ceiling import CLICK, PAGES
from browserpool.config import WorkerConfig
from browserpool.pool import BrowserPool
from engine.core.builders import pool_config
from engine.core.config import RunConfig
from engine.core.core import EngineCore
from engine.episode.status import EpisodeStatus
from engine.sites.server import SiteServer
from engine.store.run_dir import RunStore, episode_key
from engine.tasks.schema import Task
from engine.telemetry.publisher import TelemetryPublisher
from engine.telemetry.wire import TelemetryMessage
from policy.instant import InstantPolicy
from tui.sim import SimulatedRun


# --- the monitor process -----------------------------------------------------------------------------------
async def child(endpoint: str, seconds: float, out: str) -> None:
    """Run the real monitor app headless on ``endpoint`` for ``seconds``; write what it saw to ``out``."""
    from tui.app import MonitorApp
    from tui.feed import SocketFeed

    lags: list[float] = []
    app = MonitorApp(SocketFeed(endpoint=endpoint))
    apply = app._apply

    seqs: list[int] = []

    def timed_apply(msg: TelemetryMessage) -> None:
        apply(msg)
        lags.append(time.time() - msg.t)
        if not seqs:
            seqs.append(msg.seq)

    app._apply = timed_apply  # type: ignore[method-assign]
    app.call_later(lambda: app.set_timer(seconds, app.exit))
    await app.run_async(headless=True, size=(200, 60))
    lags.sort()
    result = {"applied": app.applied, "redraws": app.redraws, "first_seq": seqs[0] if seqs else None,
              "last_seq": app.model.seq, "gaps": app.model.gaps,
              "cells": len(app.model.cells),
              "lag_ms": {"p50": round(1000 * lags[len(lags) // 2], 1) if lags else None,
                         "p95": round(1000 * lags[int(len(lags) * 0.95)], 1) if lags else None,
                         "max": round(1000 * lags[-1], 1) if lags else None}}
    Path(out).write_text(json.dumps(result))


def start_monitor(endpoint: str, seconds: float, out: str) -> subprocess.Popen[bytes]:
    """The monitor app in its own process (as `webgym-engine monitor --connect` would run it)."""
    return subprocess.Popen([sys.executable, "-m", "bench.monitor", "--child", endpoint, "--child-seconds",
                             str(seconds), "--child-out", out], stdin=subprocess.DEVNULL)


def cpu_s(proc: psutil.Process) -> float:
    t = proc.cpu_times()
    return t.user + t.system


# --- 1. keeping up with 1,024 rollouts ----------------------------------------------------------------------
async def keep_up(rollouts: int, seconds: float) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as tmp:
        pub = TelemetryPublisher(f"ipc://{tmp}/t.sock", tmp, hz=10)
        sim = SimulatedRun(rollouts, seed=0, op_s=0.1, publisher=pub, steps=(10_000, 10_001))
        t0 = time.monotonic()
        sim.advance_to(0.0)
        pub.clock, pub.wall = (lambda: time.monotonic() - t0), time.time  # real time now
        out = os.path.join(tmp, "child.json")
        proc = start_monitor(pub.endpoint or "", seconds + 6.0, out)
        ps = psutil.Process(proc.pid)
        pub.start()
        engine_cpu0 = time.process_time()

        async def drive() -> None:
            while True:
                sim.advance_to(time.monotonic() - t0)
                await asyncio.sleep(0.02)

        driver = asyncio.ensure_future(drive())
        await asyncio.sleep(4.0)  # the monitor starts, attaches, gets its first snapshot
        c0, w0, sent0, cpu_e0 = cpu_s(ps), time.monotonic(), pub.sent, time.process_time()
        await asyncio.sleep(seconds)
        c1, w1, sent1, cpu_e1 = cpu_s(ps), time.monotonic(), pub.sent, time.process_time()
        changes = sum(s.step for s in sim.statuses)
        await asyncio.to_thread(proc.wait, 60)
        driver.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await driver
        await pub.close()
        seen = json.loads(Path(out).read_text())
    del engine_cpu0
    return {"rollouts": rollouts, "seconds": seconds, "monitor_cpu_pct": round(100 * (c1 - c0) / (w1 - w0), 1),
            "publisher_side_cpu_pct": round(100 * (cpu_e1 - cpu_e0) / (w1 - w0), 1),
            "messages_per_s": round((sent1 - sent0) / (w1 - w0), 1), "sent": pub.sent, "dropped": pub.dropped,
            "steps_simulated": changes, "monitor": seen}


# --- 2. the engine with and without a monitor ---------------------------------------------------------------
async def engine_overhead(n: int, workers: int, window_s: float, repeats: int,
                          settle_s: float = 3.0) -> dict[str, Any]:
    """One engine run (instant policy, telemetry on), measured in alternating windows without and with a monitor
    process attached: the same pages, browsers and warm caches on both sides, so only the monitor differs.
    ``settle_s``: the warm-up, and the time a monitor gets past its start-up before its window opens."""
    with SiteServer() as server, tempfile.TemporaryDirectory() as tmp:
        base = server.base_url
        tasks = [Task(task_id=f"bench-{i}", task_name="benchmark page", website=base + PAGES[i % len(PAGES)],
                      max_steps=1_000_000) for i in range(n)]
        cfg = RunConfig(concurrency=n, workers=workers, telemetry=None, worker=WorkerConfig(endpoint=""))
        store = RunStore(tmp)
        pool = BrowserPool(pool_config(cfg, os.path.join(tmp, "workers.log")))
        await pool.start()
        pub = TelemetryPublisher(f"ipc://{tmp}/t.sock", tmp)
        plan = [(t, 0) for t in tasks]
        pub.add_episodes((episode_key(t.task_id, s), t.task_id) for t, s in plan)
        stepping: set[str] = set()

        def on_status(st: EpisodeStatus) -> None:
            pub.on_status(st)
            if st.step >= 2:
                stepping.add(st.episode_id)

        core = EngineCore(cfg, pool=pool, store=store)
        await core.start()
        core.on_status(on_status)
        pub.attach(core.gauges())
        pub.start()
        run = asyncio.ensure_future(core.run_plan(InstantPolicy(*CLICK), plan))
        stats = core.stats
        while len(stepping) < n and not run.done():
            await asyncio.sleep(0.1)
        await asyncio.sleep(settle_s)  # warm-up
        rows: list[dict[str, Any]] = []
        for r in range(repeats):
            for monitor in ((False, True) if r % 2 == 0 else (True, False)):  # alternate the order
                proc = None
                if monitor:
                    proc = start_monitor(pub.endpoint or "", 3600, os.path.join(tmp, "child.json"))
                    while not pub.subscribed:
                        await asyncio.sleep(0.05)
                    await asyncio.sleep(settle_s)  # past the monitor's start-up (imports, first snapshot)
                    c0 = cpu_s(psutil.Process(proc.pid))
                sent0, t0, s0, e0, k0 = pub.sent, time.monotonic(), stats.steps, time.process_time(), pub.tick_cpu_s
                await asyncio.sleep(window_s)
                t1, s1, e1, k1 = time.monotonic(), stats.steps, time.process_time(), pub.tick_cpu_s
                row: dict[str, Any] = {"monitor": monitor, "steps_per_s": round((s1 - s0) / (t1 - t0), 2),
                                       "messages_per_s": round((pub.sent - sent0) / (t1 - t0), 1),
                                       "engine_cpu_pct": round(100 * (e1 - e0) / (t1 - t0), 1),
                                       "telemetry_cpu_pct": round(100 * (k1 - k0) / (t1 - t0), 3)}
                if proc is not None:
                    row["monitor_cpu_pct"] = round(100 * (cpu_s(psutil.Process(proc.pid)) - c0) / (t1 - t0), 1)
                    proc.terminate()
                    await asyncio.to_thread(proc.wait, 30)
                    deadline = time.monotonic() + 10.0
                    while pub.subscribed and time.monotonic() < deadline:  # until the publisher saw it leave
                        await asyncio.sleep(0.05)
                rows.append(row)
                print(f"  window {len(rows)}: monitor {'on ' if monitor else 'off'}  {row['steps_per_s']:7.1f} steps/s"
                      f"  {row['messages_per_s']:5.1f} telemetry msg/s  engine process CPU {row['engine_cpu_pct']:.0f}%"
                      f", telemetry ticks {row['telemetry_cpu_pct']:.2f}%"
                      + (f"  monitor CPU {row['monitor_cpu_pct']:.1f}%" if monitor else ""), flush=True)
        run.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await run
        await pub.close()
        await core.close()
        await pool.close()
        store.close()
    without = statistics.median(r["steps_per_s"] for r in rows if not r["monitor"])
    with_ = statistics.median(r["steps_per_s"] for r in rows if r["monitor"])
    on = [r for r in rows if r["monitor"]]
    return {"concurrency": n, "workers": workers, "window_s": window_s, "windows": rows,
            "median_without": without, "median_with": with_, "ratio": round(with_ / without, 4) if without else None,
            # Each pair (off, on) ran back to back: their ratios are less exposed to drift than the medians.
            "paired_ratios": [round(rows[i + 1]["steps_per_s"] / rows[i]["steps_per_s"], 3) if not rows[i]["monitor"]
                              else round(rows[i]["steps_per_s"] / rows[i + 1]["steps_per_s"], 3)
                              for i in range(0, len(rows) - 1, 2)],
            "monitor_cpu_pct": statistics.median(r["monitor_cpu_pct"] for r in on),
            "telemetry_share_of_engine_cpu_pct": round(statistics.median(
                100 * r["telemetry_cpu_pct"] / r["engine_cpu_pct"] for r in on), 3)}


# --- the README's picture -------------------------------------------------------------------------------------
async def export_svg(path: Path, seconds: float, concurrency: int, workers: int) -> None:
    """Run the bundled tasks (scripted policy) with the monitor attached in-process; save it as SVG."""
    from engine.clients.runner import run
    from engine.core.builders import new_run_dir
    from policy.registry import make_policy
    from tui.app import MonitorApp
    from tui.cli import prepare_in_process
    from tui.feed import SocketFeed
    from tui.widgets import CellGrid

    prepare_in_process()
    with tempfile.TemporaryDirectory() as tmp, SiteServer() as server:
        run_dir = new_run_dir(tmp)
        cfg = RunConfig(output_dir=tmp, run_dir=str(run_dir), concurrency=concurrency, workers=workers)
        engine = asyncio.ensure_future(run(cfg, make_policy("scripted"), server.base_url))
        app = MonitorApp(SocketFeed(run_dir=run_dir))
        async with app.run_test(size=(150, 46)) as pilot:
            await pilot.pause(seconds)
            grid = app.query_one(CellGrid)
            running = [c for c in grid.cells if c.state == "R" and c.step >= 1] or grid.cells
            grid.select(running[len(running) // 2].episode_id)
            await pilot.pause(0.3)
            app.save_screenshot(filename=path.name, path=str(path.parent))
        engine.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await engine
    print(f"monitor screenshot -> {path}")


async def main_async(args: argparse.Namespace) -> dict[str, Any]:
    if args.export_svg:
        await export_svg(args.export_svg, args.export_after, args.concurrency, args.workers)
        return {}
    results: dict[str, Any] = {"machine": {"cores": os.cpu_count()}}
    if args.rollouts:
        k = await keep_up(args.rollouts, args.seconds)
        results["keep_up"] = k
        m = k["monitor"]
        print(f"monitor with {k['rollouts']} rollouts at 10 Hz: CPU {k['monitor_cpu_pct']:.1f}% of one core, "
              f"{k['messages_per_s']:.1f} msg/s, applied {m['applied']} of the {m['last_seq'] - m['first_seq'] + 1} "
              f"sent while attached (gaps {m['gaps']}, dropped at the engine {k['dropped']}), "
              f"lag p50 {m['lag_ms']['p50']} ms "
              f"p95 {m['lag_ms']['p95']} ms max {m['lag_ms']['max']} ms, {m['redraws']} redraws; "
              f"publisher side CPU {k['publisher_side_cpu_pct']:.1f}% (simulation included)", flush=True)
    if args.repeats:
        e = await engine_overhead(args.concurrency, args.workers, args.engine_seconds, args.repeats)
        results["engine"] = e
        print(f"engine at concurrency {e['concurrency']}: median {e['median_without']:.1f} steps/s without a "
              f"monitor, {e['median_with']:.1f} with one: ratio {e['ratio']:.3f}, paired ratios {e['paired_ratios']}; "
              f"monitor CPU {e['monitor_cpu_pct']:.1f}% of one core; telemetry ticks "
              f"{e['telemetry_share_of_engine_cpu_pct']:.2f}% of the engine process's CPU", flush=True)
    return results


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rollouts", type=int, default=1024, help="0 skips the keep-up run")
    ap.add_argument("--seconds", type=float, default=20.0)
    ap.add_argument("--concurrency", type=int, default=32)
    ap.add_argument("--workers", type=int, default=max(1, os.cpu_count() or 1))
    ap.add_argument("--engine-seconds", type=float, default=15.0, help="length of one measuring window")
    ap.add_argument("--repeats", type=int, default=3, help="window pairs (off, on); 0 skips the engine run")
    ap.add_argument("--json", type=Path, default=None)
    ap.add_argument("--export-svg", type=Path, default=None,
                    help="only save a screenshot of the monitor on a run of the bundled tasks (docs/monitor.svg)")
    ap.add_argument("--export-after", type=float, default=12.0, help="--export-svg: seconds into the run")
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--child-seconds", type=float, default=20.0, help=argparse.SUPPRESS)
    ap.add_argument("--child-out", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        asyncio.run(child(args.child, args.child_seconds, args.child_out))
        return
    import uvloop
    results = uvloop.run(main_async(args))
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
