"""What the request rules save: Chromium CPU per step and steps/s on the heavy bundled pages with third-party ads,
with and without the rules, in one run.

A bench server (on loopback, named ``news.bench`` and ``ads.bench`` for the workers through
``NetSettings.hosts``) serves
the bundled heavy pages (``bench.ceiling.HEAVY_PAGES``) with ``--ads`` third-party scripts and pixels from
``ads.bench`` injected, as live pages pull them: each script loads, then animates a banner (a timer that rewrites
it every 100 ms) and fetches a tracking pixel every second, which is what ad and analytics scripts do in the
background. The rules are a hosts file that lists ``ads.bench``. Both sides run the same episodes (the instant
policy clicking an inert point, ``--steps`` steps each) with their own engine core; sides alternate
(without/with, with/without, ...) so that a drift of the machine's load falls on both.

    python -m bench.request_rules [--episodes 24] [--concurrency 8] [--ads 10] [--repeats 2] [--json PATH]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import aiohttp
from aiohttp import web

from bench.ceiling import CLICK, HEAVY_PAGES, stack_cpu
from browserpool.config import WorkerConfig
from browserpool.protocol import NetSettings
from engine.core.config import RunConfig
from engine.core.core import EngineCore
from engine.sites.server import SiteServer
from engine.tasks.schema import StepCaps, Task
from policy.instant import InstantPolicy

AD_SCRIPT = """(() => {
  const box = document.createElement('div');
  box.style.cssText = 'width:300px;height:250px;background:#fc0;font:20px sans-serif';
  document.body.appendChild(box);
  let n = 0;
  setInterval(() => { box.textContent = 'Buy now ' + (n++); box.style.background = n % 2 ? '#fc0' : '#0cf'; }, 100);
  setInterval(() => { new Image().src = '//ads.bench:PORT/px.gif?t=' + Date.now(); }, 1000);
})();"""
PIXEL = (b"GIF89a\x01\x00\x01\x00\x80\x00\x00\x00\x00\x00\xff\xff\xff!\xf9\x04\x01\x00\x00\x00\x00,"
         b"\x00\x00\x00\x00\x01\x00\x01\x00\x00\x02\x02D\x01\x00;")


class AdPages:
    """The bench server: the heavy pages (fetched from the bundled-site server) with ads injected, and the ads."""

    def __init__(self, sites: str, ads: int) -> None:
        self.sites = sites
        self.ads = ads
        self.port = 0
        self.ad_requests = 0
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._runner: web.AppRunner | None = None

    def __enter__(self) -> AdPages:
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self._start(), self._loop).result(10)
        return self

    def __exit__(self, *exc: object) -> None:
        asyncio.run_coroutine_threadsafe(self._runner.cleanup(), self._loop).result(10)  # type: ignore[union-attr]
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(5)

    async def _start(self) -> None:
        app = web.Application()
        app.router.add_get("/{tail:.*}", self._serve)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        self.port = self._runner.addresses[0][1]

    async def _serve(self, request: web.Request) -> web.Response:
        if request.host.startswith("ads.bench"):
            self.ad_requests += 1
            if request.path.endswith(".gif"):
                return web.Response(body=PIXEL, content_type="image/gif")
            return web.Response(text=AD_SCRIPT.replace("PORT", str(self.port)), content_type="application/javascript")
        async with aiohttp.ClientSession() as session, session.get(self.sites + request.path_qs) as resp:
            body, kind = await resp.read(), resp.content_type
        if kind != "text/html":  # an asset the page asked of this host: as the bundled-site server sent it
            return web.Response(body=body, content_type=kind)
        html = body.decode("utf-8", "replace")
        ads = "".join(f'<script async src="http://ads.bench:{self.port}/ad{i}.js"></script>' for i in range(self.ads))
        html = html.replace("<head>", f'<head><base href="{self.sites}{request.path}">', 1)
        html = html.replace("</body>", ads + "</body>", 1) if "</body>" in html else html + ads
        return web.Response(text=html, content_type="text/html")


async def one_side(pages: AdPages, rules: Path | None, args: argparse.Namespace, tmp: Path) -> dict[str, Any]:
    net = NetSettings(allow_private_network=True, hosts={"news.bench": "127.0.0.1", "ads.bench": "127.0.0.1"})
    worker = WorkerConfig(endpoint="", net=net,
                          request_rules=[str(rules)] if rules else [])
    cfg = RunConfig(concurrency=args.concurrency, workers=1, worker=worker, telemetry=None, output_dir=str(tmp))
    caps = StepCaps(train=(args.steps, args.steps, args.steps))
    tasks = [Task(task_id=f"ads-{i}", task_name="Look at the page.",
                  website=f"http://news.bench:{pages.port}{HEAVY_PAGES[i % len(HEAVY_PAGES)]}", difficulty=1,
                  step_caps=caps) for i in range(args.episodes)]
    async with EngineCore(cfg) as core:
        policy = InstantPolicy(*CLICK)
        await core.start_policy(policy)
        warm = [core.rollout(core.context(policy), tasks[0])]  # the browser's first page: not measured
        for r in warm:
            core.enqueue(r)
        await core.wait(warm)
        ads_before, cpu0, steps0, t0 = pages.ad_requests, stack_cpu(core.pool), core.stats.steps, time.monotonic()
        await core.wait(core.submit(core.context(policy), [(t, None) for t in tasks]))
        wall, cpu1 = time.monotonic() - t0, stack_cpu(core.pool)
        steps = core.stats.steps - steps0
    return {"steps": steps, "wall_s": round(wall, 2), "steps_per_s": round(steps / wall, 2),
            "chromium_ms_per_step": round(1000 * (cpu1["chromium"] - cpu0["chromium"]) / steps, 1),
            "stack_ms_per_step": round(1000 * sum(cpu1[k] - cpu0[k] for k in cpu1) / steps, 1),
            "ad_requests": pages.ad_requests - ads_before}


async def main_async(args: argparse.Namespace) -> dict[str, Any]:
    runs: dict[str, list[dict[str, Any]]] = {"without": [], "with": []}
    with SiteServer() as sites, AdPages(sites.base_url, args.ads) as pages, \
            tempfile.TemporaryDirectory(prefix="bench-rules-") as tmp_name:
        tmp = Path(tmp_name)
        rules = tmp / "hosts.txt"
        rules.write_text("0.0.0.0 ads.bench\n")
        for rep in range(args.repeats):
            order = ("without", "with") if rep % 2 == 0 else ("with", "without")
            for side in order:
                row = await one_side(pages, rules if side == "with" else None, args, tmp / f"{side}-{rep}")
                runs[side].append(row)
                print(f"  {side:7} rules: {row['steps_per_s']} steps/s, Chromium {row['chromium_ms_per_step']} ms "
                      f"CPU per step, {row['ad_requests']} ad requests", flush=True)

    def med(side: str, key: str) -> float:
        return round(statistics.median(r[key] for r in runs[side]), 2)

    summary: dict[str, Any] = {side: {k: med(side, k) for k in ("steps_per_s", "chromium_ms_per_step",
                                                                "stack_ms_per_step", "ad_requests")}
                               for side in runs}
    summary["chromium_cpu_saved_pct"] = round(100 * (1 - summary["with"]["chromium_ms_per_step"]
                                                     / summary["without"]["chromium_ms_per_step"]), 1)
    summary["steps_per_s_ratio"] = round(summary["with"]["steps_per_s"] / summary["without"]["steps_per_s"], 3)
    return {"config": {k: v for k, v in vars(args).items() if k != "json"}, "pages": HEAVY_PAGES, "runs": runs,
            "summary": summary}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--episodes", type=int, default=24)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--steps", type=int, default=5, help="steps per episode")
    parser.add_argument("--ads", type=int, default=10, help="third-party ad scripts per page")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    import uvloop

    out = uvloop.run(main_async(args))
    s = out["summary"]
    print(f"without rules: {s['without']['steps_per_s']} steps/s, Chromium {s['without']['chromium_ms_per_step']} ms "
          f"CPU per step; with: {s['with']['steps_per_s']} steps/s, {s['with']['chromium_ms_per_step']} ms "
          f"({s['chromium_cpu_saved_pct']}% of Chromium's CPU saved; steps/s x{s['steps_per_s_ratio']})")
    if args.json:
        args.json.write_text(json.dumps(out, indent=1, default=str) + "\n")


if __name__ == "__main__":
    main()

