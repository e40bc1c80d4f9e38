"""The Omniboxes workload through ``webgym-engine serve``'s HTTP API, against the same workload through the
engine's own loop, in one run on one engine core (the same browser workers and pages).

Workload per episode (the original server's benchmark): lease (``POST /get``), visit a light page, 10 x (click an
inert point + take a screenshot), release (``POST /reset``). ``--pages plain`` (the default): a plain page of text,
a link and a button (bench/pages/plain.html), the kind of page the original's figures were measured on;
``--pages light``: the bundled sites' light pages (images, style sheets; ``bench.ceiling``'s light profile).
N clients loop over episodes; a step is one click plus one screenshot. The engine side runs N rollouts of 10
steps each (the instant policy clicks the same point; every step has its screenshot), one after another per slot,
as ``run`` does.

Each side runs for ``--window`` seconds after a warm-up episode per slot; sides alternate (http/engine,
engine/http, ...) so that a drift of the machine's load falls on both. The HTTP clients run in the engine's own
process, on its event loop: their cost counts against the HTTP side (a real client runs elsewhere).

Prints steps/s per side, p50/p95 per command (client-side, HTTP round trip included), the PSS of everything that
serves the leases (the engine process and the browser workers with their Chromium) per lease, the ratio
http / engine (what the HTTP layer costs) and the ratios to the original server's figures, which were measured
elsewhere (the original is not in this repository): ``bench/peers/omniboxes.json`` holds them with how and when
they were measured, and the stored result carries them.

    python -m bench.omnibox [--clients 8 32] [--workers 2] [--window 20] [--repeats 1] [--pages plain|light]
                            [--json PATH]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import tempfile
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import aiohttp
import numpy as np

from bench.ceiling import CLICK, PAGES, stack_cpu
from bench.suite import machine_facts
from browserpool.config import WorkerConfig
from browserpool.memory import pss_bytes, tree_pss_bytes
from engine.core.config import RunConfig
from engine.core.core import EngineCore
from engine.sites.server import SiteServer
from engine.tasks.schema import Task
from policy.instant import InstantPolicy
from server.app import BrowserServer, ServerConfig

STEPS_PER_EPISODE = 10  # the original's benchmark (--steps changes it)
PAGES_DIR = Path(__file__).resolve().parent / "pages"
PAGE_SETS = {"plain": ["/bench-pages/plain.html"], "light": PAGES}
# The original server's figures, measured elsewhere (module docstring).
ORIGINAL_SERVER = Path(__file__).resolve().parent / "peers" / "omniboxes.json"


def original_server() -> dict[str, Any]:
    """The record of the original server's measurements (``bench/peers/omniboxes.json``)."""
    record: dict[str, Any] = json.loads(ORIGINAL_SERVER.read_text(encoding="utf-8"))
    return record


def original_steps_per_s(record: dict[str, Any], instances: int | None = None) -> tuple[float, float]:
    """The lowest and highest steps/s the original measured at ``instances`` (at any count when it has none there,
    or when ``instances`` is None)."""
    every = [run["steps_per_s"] for run in record["runs"]]
    at = [run["steps_per_s"] for run in record["runs"] if run["instances"] == instances]
    return min(at or every), max(at or every)


class Window:
    """Steps and per-command latencies counted while a side's window is open."""

    def __init__(self) -> None:
        self.open = False
        self.steps = 0
        self.latency_ms: dict[str, list[float]] = defaultdict(list)

    def timed(self, name: str, t0: float) -> None:
        if self.open:
            self.latency_ms[name].append((time.perf_counter() - t0) * 1000)


async def _http_client(url: str, page_urls: list[str], steps: int, k: int, win: Window, stop: asyncio.Event,
                       warm: asyncio.Event, warmed: list[int]) -> None:
    """One client of the Omniboxes API, looping over episodes until ``stop``."""
    async with aiohttp.ClientSession() as http:
        async def call(name: str, method: str, path: str, **kw: Any) -> bytes:
            t0 = time.perf_counter()
            async with http.request(method, url + path, **kw) as resp:
                body = await resp.read()
                if resp.status != 200:
                    raise RuntimeError(f"{name}: {resp.status} {body[:200]!r}")
            win.timed(name, t0)
            return body

        episode = 0
        while not stop.is_set():
            lease = json.loads(await call("get", "POST", "/get", params={"lifetime_mins": 45}))
            await call("visit_page", "POST", "/execute",
                       json={**lease, "visit_page": {"url": page_urls[(k + episode) % len(page_urls)]}})
            for _ in range(steps):
                await call("click_coords", "POST", "/execute", json={**lease, "click_coords": {"x": CLICK[0],
                                                                                               "y": CLICK[1]}})
                await call("screenshot", "GET", "/screenshot", params={**lease, "interaction_mode": "coordinates"})
                if win.open:
                    win.steps += 1
            await call("reset", "POST", "/reset", params=lease)
            episode += 1
            if episode == 1:
                warmed.append(k)
                await warm.wait()


async def _engine_slot(core: EngineCore, tasks: list[Task], k: int, win: Window, stop: asyncio.Event,
                       warm: asyncio.Event, warmed: list[int]) -> None:
    """One slot of the engine's own loop: rollouts of 10 steps, one after another, until ``stop``."""
    ctx = core.context(InstantPolicy(*CLICK))
    episode = 0
    while not stop.is_set():
        rollout = core.rollout(ctx, tasks[(k + episode) % len(tasks)])
        t0 = time.perf_counter()
        record = await core.run_episode(rollout)
        if record["status"] == "error":
            raise RuntimeError(f"engine episode failed: {record['error']}")
        win.timed("episode", t0)
        episode += 1
        if episode == 1:
            warmed.append(k)
            await warm.wait()


def _cpu_seconds(core: EngineCore) -> dict[str, float]:
    """CPU time so far of what serves the leases: this process (the engine and the in-process clients) and the
    browser workers' stacks (their Python, Playwright drivers and Chromium; ``bench.ceiling.stack_cpu``)."""
    return {**stack_cpu(core.pool), "engine": time.process_time()}


def _serving_pss_mib(core: EngineCore) -> float:
    """PSS of the engine process and its browser workers' process trees (not the site server: that is the web)."""
    total = pss_bytes(os.getpid())
    total += sum(tree_pss_bytes(h.proc.pid) for h in core.pool.alive_workers() if h.proc is not None)
    return total / 2**20


async def _side(side: str, core: EngineCore, server: BrowserServer, base: str, pages: list[str], steps: int,
                n: int, seconds: float) -> dict[str, Any]:
    win, stop, warm = Window(), asyncio.Event(), asyncio.Event()
    warmed: list[int] = []
    if side == "http":
        page_urls = [base + p for p in pages]
        jobs = [asyncio.ensure_future(_http_client(server.url, page_urls, steps, k, win, stop, warm, warmed))
                for k in range(n)]
    else:
        tasks = [Task(task_id=f"omni-{i}", task_name="benchmark page", website=base + p, difficulty=1,
                      max_steps=steps)
                 for i, p in enumerate(pages)]
        jobs = [asyncio.ensure_future(_engine_slot(core, tasks, k, win, stop, warm, warmed)) for k in range(n)]
    t_ramp = time.monotonic()
    while len(warmed) < n:
        if any(j.done() for j in jobs):
            next(j for j in jobs if j.done()).result()  # a slot that failed: raise its error
        await asyncio.sleep(0.05)
    ramp_s = time.monotonic() - t_ramp
    warm.set()
    win.open = True
    t0, s0, cpu0 = time.monotonic(), core.stats.steps, _cpu_seconds(core)
    await asyncio.sleep(seconds / 2)
    pss_mib = await asyncio.to_thread(_serving_pss_mib, core)
    await asyncio.sleep(seconds / 2)
    win.open = False
    dt, cpu1 = time.monotonic() - t0, _cpu_seconds(core)
    if side == "engine":
        win.steps = core.stats.steps - s0  # every step as it ends (only this side's rollouts run now)
    stop.set()
    await asyncio.gather(*jobs)
    # Where the CPU went, per step (ms), and the share of all cores that serving the leases took.
    cpu_ms = {k: round(1000 * (cpu1[k] - cpu0.get(k, 0.0)) / max(1, win.steps), 2) for k in sorted(cpu1)}
    row: dict[str, Any] = {"side": side, "clients": n, "steps_per_s": round(win.steps / dt, 2),
                           "engine_cpu_ms_per_step": cpu_ms["engine"],
                           "pss_mib_per_slot": round(pss_mib / n, 1), "pss_mib_total": round(pss_mib),
                           "ramp_s": round(ramp_s, 1), "cpu_ms_per_step": cpu_ms,
                           "cpu_busy_fraction": round((sum(cpu1.values()) - sum(cpu0.values())) / dt
                                                      / (os.cpu_count() or 1), 3)}
    row["latency_ms"] = {name: {"p50": round(float(np.percentile(v, 50)), 1),
                                "p95": round(float(np.percentile(v, 95)), 1), "n": len(v)}
                         for name, v in sorted(win.latency_ms.items())}
    return row


async def measure(args: argparse.Namespace) -> dict[str, Any]:
    windows: list[dict[str, Any]] = []
    with SiteServer(mounts={"/bench-pages": PAGES_DIR}) as sites, tempfile.TemporaryDirectory() as tmp:
        cfg = RunConfig(concurrency=max(args.clients), workers=args.workers, output_dir=tmp, telemetry=None,
                        worker=WorkerConfig(endpoint=""), episode_timeout_s=None, policy_step_timeout_s=None)
        async with EngineCore(cfg) as core:
            server = BrowserServer(core, ServerConfig(port=0, capacity=max(args.clients)))
            await server.start()
            try:
                for n in args.clients:
                    for k in range(args.repeats):
                        for side in (("http", "engine") if k % 2 == 0 else ("engine", "http")):
                            row = await _side(side, core, server, sites.base_url, PAGE_SETS[args.pages],
                                              args.steps, n, args.window)
                            windows.append(row)
                            lat = row["latency_ms"]
                            shown = ", ".join(f"{c} {v['p50']:.0f}/{v['p95']:.0f}" for c, v in lat.items())
                            print(f"  {side:6s} x{n:<3d} {row['steps_per_s']:6.2f} steps/s, "
                                  f"{row['pss_mib_per_slot']:5.1f} MiB per lease, engine CPU "
                                  f"{row['engine_cpu_ms_per_step']:.2f} ms/step; p50/p95 ms: {shown}", flush=True)
                            print(f"         CPU busy {row['cpu_busy_fraction']:.0%}, ms per step: "
                                  f"{row['cpu_ms_per_step']}", flush=True)
            finally:
                await server.close()
    return summarize(args, windows)


def summarize(args: argparse.Namespace, windows: list[dict[str, Any]]) -> dict[str, Any]:
    """Medians per side and client count, the HTTP layer's cost and the ratios to the original server."""
    original = original_server()
    per_n = {}
    for n in args.clients:
        def med(side: str, key: str, n: int = n) -> float:
            return round(statistics.median(w[key] for w in windows if w["side"] == side and w["clients"] == n), 2)

        http, engine = med("http", "steps_per_s"), med("engine", "steps_per_s")
        http_rows = [w for w in windows if w["side"] == "http" and w["clients"] == n]
        mib = med("http", "pss_mib_per_slot")
        original_mib = max(original["mib_per_instance"]) + original["fixed_mib"] / n
        lo, hi = original_steps_per_s(original, n)
        per_n[str(n)] = {
            "http_steps_per_s": http, "engine_steps_per_s": engine,
            "http_over_engine": round(http / engine, 3) if engine else 0.0,
            "original_steps_per_s": [lo, hi],
            "x_original": [round(http / hi, 1), round(http / lo, 1)],
            "pss_mib_per_lease": mib, "original_mib_per_instance": round(original_mib),
            "memory_fraction_of_original": round(mib / original_mib, 3),
            "latency_ms": http_rows[-1]["latency_ms"],
        }
    return {"clients": args.clients, "workers": args.workers, "window_s": args.window, "repeats": args.repeats,
            "pages": args.pages,
            "steps_per_episode": args.steps, "original_steps_per_s": list(original_steps_per_s(original)),
            "original": original,
            "goal": "http >= 10x the original's steps/s; <= 1/4 of its memory per instance",
            "results": per_n, "windows": windows}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--clients", type=int, nargs="+", default=[8, 32])
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--window", type=float, default=20.0)
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--pages", choices=sorted(PAGE_SETS), default="plain")
    parser.add_argument("--steps", type=int, default=STEPS_PER_EPISODE,
                        help="steps per episode (10 or more: the engine side's shortest step cap is 10)")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args(argv)
    if args.steps < STEPS_PER_EPISODE:
        parser.error(f"--steps must be at least {STEPS_PER_EPISODE}")
    import uvloop

    machine = machine_facts()  # as it was at the start, not after the load
    result = {**uvloop.run(measure(args)), "machine": machine}
    for n, r in result["results"].items():
        print(f"{n} clients: HTTP {r['http_steps_per_s']:.2f} steps/s, engine loop {r['engine_steps_per_s']:.2f} "
              f"(http/engine {r['http_over_engine']:.3f}); {r['x_original'][0]}-{r['x_original'][1]}x the original's "
              f"{r['original_steps_per_s'][0]:g}-{r['original_steps_per_s'][1]:g} steps/s (measured elsewhere); "
              f"{r['pss_mib_per_lease']:.1f} MiB per lease = "
              f"{100 * r['memory_fraction_of_original']:.0f}% of the original's {r['original_mib_per_instance']} MiB "
              "per instance")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
