"""Engine vs bare loop: how close the engine gets to the browser's own ceiling.

In one process run, on the same pages and the same browser flags:
  * bare loop: N pages spread over K Chromium instances, each looping CDP click + JPEG screenshot,
    nothing else (no settle, no storage, no policy);
  * engine: the full engine (workers over ZeroMQ, shared-memory frames, settle detection, frame
    comparison, trajectory store) with the instant policy.
Both report steps/s measured over a steady-state window; the ratio engine/bare is the figure of merit.
A second engine run at higher concurrency reports browser PSS per concurrent rollout.

    python -m bench.ceiling [--concurrency 16 32] [--memory-at 128] [--seconds 20] [--json PATH]
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import contextlib
import json
import os
import tempfile
import time
from pathlib import Path
from typing import Any

import psutil
from playwright.async_api import async_playwright

from browserpool.config import CHROMIUM_FLAGS, DEFAULT_CHROMIUM, WorkerConfig
from browserpool.pool import BrowserPool
from engine.core.builders import pool_config
from engine.core.config import RunConfig
from engine.core.core import EngineCore
from engine.episode.status import EpisodeStatus
from engine.sites.server import SiteServer
from engine.store.run_dir import RunStore, read_records
from engine.tasks.schema import Task
from policy.instant import InstantPolicy

# Light but real pages of the bundled sites (the instant policy clicks an inert corner).
PAGES = ["/shop/", "/shop/product.html?id=p01", "/wiki/", "/travel/", "/forum/", "/shop/search.html?q=mug"]
# The heavy page profile (engine/sites/www/heavy/): 3k-6k DOM nodes, 150-330 images, rendered by script.
HEAVY_PAGES = ["/heavy/shop.html", "/heavy/news.html", "/heavy/shop.html?item=h042", "/heavy/news.html?article=7",
               "/heavy/shop.html?sort=price", "/heavy/news.html?section=Tech"]
PROFILES = {"light": PAGES, "heavy": HEAVY_PAGES}
CLICK = (1275.0, 384.0)  # right margin of the viewport: nothing to activate there (on both profiles)


async def bare_loop(base: str, n: int, browsers: int, seconds: float, quality: int,
                    pages: list[str] | None = None, warmup: float = 3.0,
                    flags: list[str] | None = None) -> dict[str, Any]:
    """CDP input + JPEG screenshot in a tight loop on n pages; steps/s over the window after ``warmup`` s.
    ``flags``: Chromium's (default: the workers')."""
    pages = pages or PAGES
    pw = await async_playwright().start()
    try:
        args = CHROMIUM_FLAGS if flags is None else flags
        bs = [await pw.chromium.launch(executable_path=DEFAULT_CHROMIUM, args=args) for _ in range(browsers)]

        async def open_page(i: int) -> Any:
            ctx = await bs[i % browsers].new_context(viewport={"width": 1280, "height": 768})
            page = await ctx.new_page()
            await page.goto(base + pages[i % len(pages)])
            return await ctx.new_cdp_session(page)

        # Opened a few at a time (setup, not measured): one by one, 64 heavy pages take a minute.
        sessions = []
        for k in range(0, n, 8):
            sessions += await asyncio.gather(*(open_page(i) for i in range(k, min(n, k + 8))))
        count = 0
        stop = time.monotonic() + seconds + warmup
        window: dict[str, float] = {}

        async def loop(s: Any) -> None:
            nonlocal count
            x, y = CLICK
            while time.monotonic() < stop:
                # Pipelined like the engine's worker: one session handles its commands in order.
                await asyncio.gather(*(s.send("Input.dispatchMouseEvent", {
                    "type": kind, "x": x, "y": y, "button": "left", "clickCount": 1})
                    for kind in ("mouseMoved", "mousePressed", "mouseReleased")))
                shot = await s.send("Page.captureScreenshot", {"format": "jpeg", "quality": quality,
                                                               "optimizeForSpeed": True})
                base64.b64decode(shot["data"])
                count += 1

        cpu: list[dict[str, float]] = []

        async def clock() -> None:
            await asyncio.sleep(warmup)
            window["start"], window["c0"] = time.monotonic(), count
            cpu.append(own_stack_cpu())
            await asyncio.sleep(seconds)
            window["end"], window["c1"] = time.monotonic(), count
            cpu.append(own_stack_cpu())

        await asyncio.gather(clock(), *(loop(s) for s in sessions))
        for b in bs:
            await b.close()
    finally:
        await pw.stop()
    steps = window["c1"] - window["c0"]
    rate = steps / (window["end"] - window["start"])
    per_step = {k: round((cpu[1][k] - cpu[0][k]) * 1000 / max(1, steps), 2) for k in cpu[0]}
    return {"concurrency": n, "steps_per_s": round(rate, 2), "cpu_ms_per_step": per_step}


def python_stack_cpu(root: psutil.Process, python_key: str) -> dict[str, float]:
    """CPU seconds used so far by a Python process, its Playwright drivers and their Chromium."""
    out = {python_key: 0.0, "playwright_driver": 0.0, "chromium": 0.0}
    try:
        children = root.children(recursive=True)
    except psutil.Error:
        return out
    out[python_key] = _cpu_s(root)
    for c in children:
        if key := _stack_part(c):
            out[key] += _cpu_s(c)
    return out


def own_stack_cpu() -> dict[str, float]:
    """The bare loop's stack: this process, its Playwright driver and Chromium."""
    return python_stack_cpu(psutil.Process(), "python")


def stack_cpu(pool: BrowserPool) -> dict[str, float]:
    """The engine's browser stack: every live worker's Python process, driver and Chromium."""
    out = {"worker_python": 0.0, "playwright_driver": 0.0, "chromium": 0.0}
    for h in pool.alive_workers():
        try:
            worker = psutil.Process(h.pid)
        except psutil.Error:
            continue
        for k, v in python_stack_cpu(worker, "worker_python").items():
            out[k] += v
    return out


def _cpu_s(proc: psutil.Process) -> float:
    try:
        t = proc.cpu_times()
        return t.user + t.system
    except psutil.Error:
        return 0.0


def _stack_part(proc: psutil.Process) -> str | None:
    try:
        name = proc.name()
    except psutil.Error:
        return None
    return "chromium" if "chrom" in name else "playwright_driver" if name.startswith("node") else None


async def engine_run(base: str, n: int, workers: int, seconds: float, quality: int,
                     steps_per_episode: int = 400, pages: list[str] | None = None,
                     ramp_timeout: float = 600.0, chromium: str = DEFAULT_CHROMIUM) -> dict[str, Any]:
    """The engine with the instant policy; steps/s over a window once every rollout is running
    (or ``ramp_timeout`` s after the start, whichever comes first; ``ramp_s`` says how long it took).
    ``error_detail``: what ended each episode that ended as an error."""
    pages = pages or PAGES
    tasks = [Task(task_id=f"bench-{i}", task_name="benchmark page", website=base + pages[i % len(pages)],
                  max_steps=steps_per_episode) for i in range(n)]
    cfg = RunConfig(concurrency=n, workers=workers, telemetry=None,
                    worker=WorkerConfig(endpoint="", jpeg_quality=quality, chromium_path=chromium))
    with tempfile.TemporaryDirectory() as tmp:
        store = RunStore(tmp)
        pool = BrowserPool(pool_config(cfg, os.path.join(tmp, "workers.log")))
        await pool.start()
        stepping: set[str] = set()

        def on_status(st: EpisodeStatus) -> None:
            # An episode that ended before stepping (an error) counts as ready: else the ramp would wait for it
            # until every other episode had run out its steps, and the window would measure nothing.
            if st.step >= 2 or st.ended:
                stepping.add(st.episode_id)

        core = EngineCore(cfg, pool=pool, store=store)
        await core.start()
        core.on_status(on_status)
        cpu0 = time.process_time()
        run = asyncio.ensure_future(core.run_plan(InstantPolicy(*CLICK), [(t, 0) for t in tasks]))
        stats = core.stats
        # Measure only once every rollout is past its page load and stepping.
        ramp0 = time.monotonic()
        while len(stepping) < n and not run.done() and time.monotonic() - ramp0 < ramp_timeout:
            await asyncio.sleep(0.1)
        ramp_s = time.monotonic() - ramp0
        t0, s0, c0 = time.monotonic(), stats.steps, time.process_time()
        k0 = await asyncio.to_thread(stack_cpu, pool)
        await asyncio.sleep(seconds)
        t1, s1, c1 = time.monotonic(), stats.steps, time.process_time()
        k1 = await asyncio.to_thread(stack_cpu, pool)
        peak = stats.peak_browser_pss
        pss_now = await asyncio.to_thread(pool.browser_pss_bytes)
        run.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await run
        await core.close()
        await pool.close()
        store.close()
        errors = error_detail(tmp)
    rate = (s1 - s0) / (t1 - t0)
    lat = sorted(stats.step_latencies_ms[s0:s1]) or [0.0]
    return {"concurrency": n, "steps_per_s": round(rate, 2),
            "engine_cpu_ms_per_step": round((c1 - c0) * 1000 / max(1, s1 - s0), 3),
            "cpu_ms_per_step": {k: round((k1[k] - k0[k]) * 1000 / max(1, s1 - s0), 2) for k in k0},
            "step_latency_p50_ms": round(lat[len(lat) // 2], 1),
            "step_latency_p95_ms": round(lat[int(len(lat) * 0.95)], 1),
            "browser_pss_mib": round(max(peak, pss_now) / 2**20, 1),
            "pss_per_rollout_mib": round(max(peak, pss_now) / 2**20 / n, 1),
            "setup_cpu_s": round(c0 - cpu0, 2), "ramp_s": round(ramp_s, 1), "stepping": len(stepping),
            "errors": stats.outcomes["error"] + stats.outcomes["blocked"], "error_detail": errors}


def error_detail(run_dir: str) -> list[dict[str, Any]]:
    """What ended each episode of the run that ended early, as an error or blocked (kind, message, steps made), from
    its records: a benchmark that counts errors says what they were, since its run directory is removed afterwards
    (an episode cut when the window closed writes no record)."""
    return [{"kind": error["kind"], "message": error["message"][:300], "steps": len(r["steps"]),
             "website": r["task"]["website"]}
            for r in read_records(run_dir) if r["status"] in ("error", "blocked") and (error := r.get("error"))]


async def main_async(args: argparse.Namespace) -> dict[str, Any]:
    results: dict[str, Any] = {"machine": {"cores": os.cpu_count()}, "ceiling": [], "memory": None}
    with SiteServer() as server:
        base = server.base_url
        for n in args.concurrency:
            bare = await bare_loop(base, n, args.workers, args.seconds, args.quality)
            eng = await engine_run(base, n, args.workers, args.seconds, args.quality)
            row = {"concurrency": n, "bare_steps_per_s": bare["steps_per_s"],
                   "engine_steps_per_s": eng["steps_per_s"],
                   "ratio": round(eng["steps_per_s"] / bare["steps_per_s"], 3) if bare["steps_per_s"] else None,
                   "engine": eng}
            results["ceiling"].append(row)
            print(f"bare loop CPU per step: {bare['cpu_ms_per_step']}")
            print(f"concurrency {n:4d}: bare {bare['steps_per_s']:6.1f} steps/s   engine "
                  f"{eng['steps_per_s']:6.1f} steps/s   ratio {row['ratio']:.3f}   "
                  f"engine CPU {eng['engine_cpu_ms_per_step']:.2f} ms/step   "
                  f"worker stack {eng['cpu_ms_per_step']}   "
                  f"p50 {eng['step_latency_p50_ms']:.0f} ms", flush=True)
        if args.memory_at:
            mem = await engine_run(base, args.memory_at, args.workers, args.seconds, args.quality)
            results["memory"] = mem
            print(f"concurrency {args.memory_at:4d}: engine {mem['steps_per_s']:6.1f} steps/s   browser PSS "
                  f"{mem['browser_pss_mib']:.0f} MiB = {mem['pss_per_rollout_mib']:.1f} MiB per rollout",
                  flush=True)
    return results


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--concurrency", type=int, nargs="+", default=[16, 32])
    ap.add_argument("--memory-at", type=int, default=128, help="0 to skip the memory run")
    ap.add_argument("--workers", type=int, default=max(1, os.cpu_count() or 1))
    ap.add_argument("--seconds", type=float, default=20.0)
    ap.add_argument("--quality", type=int, default=80)
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args(argv)
    import uvloop
    results = uvloop.run(main_async(args))
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
