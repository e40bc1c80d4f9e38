"""Where Chromium's CPU goes, per click + screenshot and per page load, and what cuts it.

Workloads (bare CDP, the workers' Chromium and switches, no engine), each over a steady window after a warm-up:

- ``clicks``: tabs spread over 2 browsers, each looping CDP mouse events (an inert click) + a JPEG screenshot,
  on the light or the heavy pages (the ``ceiling`` suite's bare loop);
- ``loads``: tabs loading a page (to ``load``), a screenshot, then ``about:blank`` (an episode's visit and reset);
- ``original``: the original server's workload per episode: visit a plain page, 10 x click + screenshot, reset.

``trace``: each workload twice, untraced (Chromium's CPU per step from /proc, by process type: browser, renderer,
GPU, network, other utilities) and traced (Chromium's own tracing, every process). The trace's complete events carry
thread time; each event's self time (its thread time less its children's) is put in one bucket (input, script,
style/layout, paint, raster, compositing, screenshot capture and encoding, IPC, other) by its name, category and,
for a task, the source location that posted it. Tracing costs CPU itself: the buckets are shares of the traced
CPU, reported scaled to the untraced total per process type.

``ab``: variants (Chromium switches, capture parameters) against the workers' default, rounds alternating the order,
Chromium's CPU per step from /proc (median over rounds, min and max).

    python -m bench.chromium_cpu trace [--seconds 6] [--json PATH]
    python -m bench.chromium_cpu ab [--rounds 3] [--seconds 8] [--variants NAME ...] [--json PATH]
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import itertools
import json
import re
import time
from collections import defaultdict
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil
from playwright.async_api import Browser, CDPSession, Page, async_playwright
from playwright.async_api import Error as PlaywrightError

from bench import ceiling
from bench.report import row, spread, write_result
from browserpool.config import CHROMIUM_FLAGS, DEFAULT_CHROMIUM
from engine.sites.server import SiteServer

VIEWPORT = {"width": 1280, "height": 768}
BROWSERS = 2
PLAIN_PAGE = "/wiki/"  # the original's workload: a plain page

# --- Chromium's processes, by type ---------------------------------------------------------------------------------


def process_type(proc: psutil.Process) -> str | None:
    """browser, renderer, gpu, network, utility or zygote, from a Chromium process's switches; None if not one."""
    try:
        if "chrom" not in proc.name():
            return None
        args = proc.cmdline()
    except psutil.Error:
        return None
    kind = next((a.split("=", 1)[1] for a in args if a.startswith("--type=")), "browser")
    if kind == "utility":
        return "network" if any("NetworkService" in a for a in args) else "utility"
    return {"gpu-process": "gpu"}.get(kind, kind)


class ChromiumCpu:
    """CPU seconds of this process's Chromium children by process type, processes that exited included (their
    last reading is kept, so a renderer that goes away mid-window still counts)."""

    def __init__(self) -> None:
        self._last: dict[int, tuple[str, float]] = {}

    def read(self) -> dict[str, float]:
        for proc in psutil.Process().children(recursive=True):
            kind = self._last[proc.pid][0] if proc.pid in self._last else process_type(proc)
            if kind is None:
                continue
            try:
                t = proc.cpu_times()
            except psutil.Error:
                continue
            self._last[proc.pid] = (kind, t.user + t.system)
        out: dict[str, float] = defaultdict(float)
        for kind, cpu in self._last.values():
            out[kind] += cpu
        return dict(out)


def per_step(before: dict[str, float], after: dict[str, float], steps: int) -> dict[str, float]:
    """ms of CPU per step by process type, and ``total``."""
    out = {k: (after.get(k, 0.0) - before.get(k, 0.0)) * 1000 / max(1, steps) for k in after}
    out["total"] = sum(out.values())
    return {k: round(v, 3) for k, v in sorted(out.items())}


# --- variants: what is A/B-tested ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Variant:
    """A way to run Chromium: its switches and the screenshot's CDP parameters (what it costs pages: ``cost``)."""

    name: str
    flags: list[str] = field(default_factory=lambda: list(CHROMIUM_FLAGS))
    capture: dict[str, Any] = field(default_factory=lambda: {"format": "jpeg", "quality": 80,
                                                             "optimizeForSpeed": True})
    cost: str = ""
    # A frame is made only when asked (HeadlessExperimental.beginFrame, whose reply carries the screenshot):
    # Page.captureScreenshot would wait for a frame that never comes.
    begin_frame: bool = False
    # Playwright's own switches left out of the launch (e.g. its --enable-features list).
    ignore_default_args: list[str] = field(default_factory=list)


def _with(*extra: str) -> list[str]:
    return [*CHROMIUM_FLAGS, *extra]


VARIANTS: dict[str, Variant] = {v.name: v for v in [
    Variant("default", cost="the workers' switches and capture today"),
    Variant("begin_frame", _with("--enable-begin-frame-control", "--run-all-compositor-stages-before-draw"),
            begin_frame=True,
            cost="no frame unless asked: requestAnimationFrame, CSS animations, IntersectionObserver and wheel input "
                 "advance only when one is issued; Page.captureScreenshot never returns; two frames at once in a "
                 "browser crash its GPU process"),
    Variant("in_process_gpu", _with("--in-process-gpu"),
            cost="the display compositor in the browser process (a crash there takes the browser)"),
    Variant("no_new_surface", ignore_default_args=["--enable-features=CDPScreenshotNewSurface,"
                                                   "SkipListAccountsWithoutGaiaCookies"],
            cost="a capture may copy the frame last drawn instead of asking for a new one"),
    Variant("quality_60", capture={"format": "jpeg", "quality": 60, "optimizeForSpeed": True},
            cost="a coarser JPEG (quality 60 instead of 80)"),
    Variant("not_from_surface", capture={"format": "jpeg", "quality": 80, "optimizeForSpeed": True,
                                         "fromSurface": False},
            cost="capture from the view, not the compositor surface"),
    Variant("no_optimize_for_speed", capture={"format": "jpeg", "quality": 80},
            cost="none: the encoder's slower, tighter path"),
    Variant("one_raster_thread", _with("--num-raster-threads=1"), cost="raster of big pages on one thread"),
    Variant("no_threaded_compositing", _with("--disable-threaded-compositing"),
            cost="compositing on the main thread: scrolls and animations wait for scripts"),
    Variant("no_site_isolation", _with("--disable-site-isolation-trials", "--site-per-process=false",
                                       "--disable-features=IsolateOrigins,site-per-process"),
            cost="cross-site frames in their parent's renderer (less isolation between a page and its iframes)"),
    Variant("process_per_tab", _with("--process-per-tab"), cost="one renderer per tab whatever its sites"),
    Variant("no_smooth_scrolling", _with("--disable-smooth-scrolling"), cost="scrolls jump (no animation)"),
    Variant("no_lcd_text", _with("--disable-lcd-text", "--disable-font-subpixel-positioning"),
            cost="greyscale text antialiasing"),
    Variant("no_partial_raster", _with("--disable-partial-raster"), cost="a changed tile is re-rastered whole"),
    Variant("no_image_animation", _with("--disable-image-animation-resync", "--disable-threaded-animation"),
            cost="animations on the main thread"),
]}

# --- workloads -----------------------------------------------------------------------------------------------------


@dataclass
class Tabs:
    browsers: list[Browser]
    pages: list[Page]
    sessions: list[CDPSession]
    # One frame at a time per browser under begin-frame control: a second one issued while one is under way
    # ("overlapping IssueExternalBeginFrame") crashes the GPU process, six times and the browser is gone.
    frame_locks: list[asyncio.Lock] = field(default_factory=lambda: [asyncio.Lock() for _ in range(BROWSERS)])

    def shot(self, i: int, variant: Variant) -> Awaitable[bytes]:
        return screenshot(self.sessions[i], variant, self.frame_locks[i % BROWSERS])


async def open_tabs(pw: Any, variant: Variant, base: str, urls: list[str], n: int) -> Tabs:
    browsers = [await pw.chromium.launch(executable_path=DEFAULT_CHROMIUM, args=variant.flags,
                                         ignore_default_args=variant.ignore_default_args or None)
                for _ in range(BROWSERS)]
    pages, sessions = [], []
    for i in range(n):
        ctx = await browsers[i % BROWSERS].new_context(viewport=VIEWPORT)
        page = await ctx.new_page()
        await page.goto(base + urls[i % len(urls)])
        pages.append(page)
        sessions.append(await ctx.new_cdp_session(page))
    return Tabs(browsers, pages, sessions)


async def screenshot(session: CDPSession, variant: Variant, frame_lock: asyncio.Lock) -> bytes:
    if variant.begin_frame:
        async with frame_lock:
            frame = await session.send("HeadlessExperimental.beginFrame", {"screenshot": variant.capture})
        return base64.b64decode(frame.get("screenshotData") or "")
    try:
        shot = await session.send("Page.captureScreenshot", variant.capture)
    except PlaywrightError as exc:  # once more, as the worker does (browserpool.page.EpisodePage.screenshot)
        if "Unable to capture screenshot" not in str(exc):
            raise
        shot = await session.send("Page.captureScreenshot", variant.capture)
    return base64.b64decode(shot["data"])


async def click_and_shot(tabs: Tabs, i: int, variant: Variant) -> None:
    x, y = ceiling.CLICK
    await asyncio.gather(*(tabs.sessions[i].send("Input.dispatchMouseEvent", {
        "type": kind, "x": x, "y": y, "button": "left", "clickCount": 1})
        for kind in ("mouseMoved", "mousePressed", "mouseReleased")))
    await tabs.shot(i, variant)


StepLoop = Callable[[int, Tabs, Callable[[], bool], Callable[[int], None]], Awaitable[None]]


def clicks_loop(variant: Variant) -> StepLoop:
    async def loop(i: int, tabs: Tabs, running: Callable[[], bool], done: Callable[[int], None]) -> None:
        while running():
            await click_and_shot(tabs, i, variant)
            done(1)
    return loop


def loads_loop(variant: Variant, base: str, urls: list[str]) -> StepLoop:
    async def loop(i: int, tabs: Tabs, running: Callable[[], bool], done: Callable[[int], None]) -> None:
        for k in itertools.count(i):
            if not running():
                return
            await tabs.pages[i].goto(base + urls[k % len(urls)], wait_until="load")
            await tabs.shot(i, variant)
            await tabs.pages[i].goto("about:blank")
            done(1)
    return loop


def original_loop(variant: Variant, base: str) -> StepLoop:
    """Per episode: visit a plain page, 10 x click + screenshot, reset to about:blank; a step is a click."""
    async def loop(i: int, tabs: Tabs, running: Callable[[], bool], done: Callable[[int], None]) -> None:
        while running():
            await tabs.pages[i].goto(base + PLAIN_PAGE, wait_until="load")
            for _ in range(10):
                await click_and_shot(tabs, i, variant)
                done(1)
            await tabs.pages[i].goto("about:blank")
    return loop


@dataclass(frozen=True)
class Workload:
    name: str
    label: str  # what a step is
    tabs: int
    urls: list[str]
    kind: str  # clicks, loads, original


WORKLOADS = [
    Workload("light_clicks", "click + screenshot, light pages", 16, ceiling.PAGES, "clicks"),
    Workload("heavy_clicks", "click + screenshot, heavy pages", 16, ceiling.HEAVY_PAGES, "clicks"),
    Workload("light_loads", "page load + screenshot + reset, light pages", 8, ceiling.PAGES, "loads"),
    Workload("heavy_loads", "page load + screenshot + reset, heavy pages", 8, ceiling.HEAVY_PAGES, "loads"),
    Workload("original", "click + screenshot, the original's episode (visit, 10 steps, reset)", 8, [PLAIN_PAGE],
             "original"),
]


def step_loop(w: Workload, variant: Variant, base: str) -> StepLoop:
    if w.kind == "clicks":
        return clicks_loop(variant)
    if w.kind == "loads":
        return loads_loop(variant, base, w.urls)
    return original_loop(variant, base)


async def run_window(w: Workload, variant: Variant, base: str, seconds: float, warmup: float,
                     trace_to: Path | None = None) -> dict[str, Any]:
    """One workload over a window: steps/s and Chromium's CPU per step by process type; with ``trace_to``, the
    window is traced (every browser) and each browser's trace written there."""
    pw = await async_playwright().start()
    try:
        tabs = await open_tabs(pw, variant, base, w.urls, w.tabs)
        cpu = ChromiumCpu()
        count = 0
        stop = time.monotonic() + warmup + seconds
        window: dict[str, Any] = {}

        def done(k: int) -> None:
            nonlocal count
            count += k

        async def clock() -> None:
            await asyncio.sleep(warmup)
            if trace_to is not None:
                for b in tabs.browsers:
                    await b.start_tracing(categories=TRACE_CATEGORIES)
            window.update(t0=time.monotonic(), c0=count, cpu0=cpu.read())
            await asyncio.sleep(seconds)
            window.update(t1=time.monotonic(), c1=count, cpu1=cpu.read())
            if trace_to is not None:
                window["traces"] = [await b.stop_tracing() for b in tabs.browsers]

        loop = step_loop(w, variant, base)
        await asyncio.gather(clock(), *(loop(i, tabs, lambda: time.monotonic() < stop, done)
                                        for i in range(w.tabs)))
        for b in tabs.browsers:
            await b.close()
    finally:
        await pw.stop()
    steps = window["c1"] - window["c0"]
    out = {"workload": w.name, "variant": variant.name, "steps": steps,
           "steps_per_s": round(steps / (window["t1"] - window["t0"]), 2),
           "cpu_ms_per_step": per_step(window["cpu0"], window["cpu1"], steps)}
    if trace_to is not None:
        out["trace_files"] = []
        for k, data in enumerate(window["traces"]):
            path = trace_to / f"{w.name}-{k}.json"
            path.write_bytes(data)
            out["trace_files"].append(str(path))
    return out


# --- the trace's breakdown -----------------------------------------------------------------------------------------

TRACE_CATEGORIES = ["toplevel", "ipc", "mojom", "input", "blink", "cc", "viz", "gpu", "v8", "devtools.timeline",
                    "benchmark", "renderer.scheduler", "disabled-by-default-devtools.screenshot"]

BUCKETS = ["input", "script", "style_layout", "paint", "raster", "compositing", "screenshot", "ipc", "other"]

# (bucket, pattern on "category|name|posted-from file|function"), first match wins.
_RULES: list[tuple[str, re.Pattern[str]]] = [(bucket, re.compile(p, re.I)) for bucket, p in [
    ("screenshot", r"screenshot|copyoutput|copy_output|copyfromsurface|readback|jpeg|encode|captur|page_handler"),
    ("input", r"^input\||input|mouse|event_dispatch|eventhandler|widget_input|pointer"),
    ("script", r"^v8|v8\.|functioncall|evaluatescript|runmicrotasks|timerfire|compile|bindings"),
    ("style_layout", r"layout|style|recalc|updatelayouttree|prepaint|hittest|lifecycle"),
    ("raster", r"raster|tile|skia|imagedecode|decode"),
    ("paint", r"paint|displayitem|record"),
    ("compositing", r"^cc\||^viz\||^gpu\||composit|beginframe|begin_frame|beginmainframe|draw|swap|surface|"
                    r"scheduler|commit|layertree|frame_sink|/cc/|/viz/|/gpu/"),
    ("ipc", r"^ipc\||^mojom\||mojo|ipc|channel|message_pipe|/mojo/"),
]]


def bucket_of(cat: str, name: str, args: dict[str, Any]) -> str:
    key = f"{cat}|{name}|{args.get('src_file', '')}|{args.get('src_func', '')}"
    for bucket, pattern in _RULES:
        if pattern.search(key):
            return bucket
    return "other"


def trace_breakdown(paths: list[str]) -> dict[str, dict[str, float]]:
    """Thread-time seconds by process type and bucket over the traces: each complete event's self time."""
    out: dict[str, dict[str, float]] = defaultdict(lambda: defaultdict(float))
    for path in paths:
        events = json.loads(Path(path).read_text())
        events = events["traceEvents"] if isinstance(events, dict) else events
        kinds: dict[int, str] = {}
        for e in events:
            if e.get("ph") == "M" and e.get("name") == "process_name":
                kinds[e["pid"]] = _kind_of_process_name(str(e.get("args", {}).get("name", "")))
        by_thread: dict[tuple[int, int], list[dict[str, Any]]] = defaultdict(list)
        for e in events:
            if e.get("ph") == "X" and "tdur" in e and "tts" in e:
                by_thread[(e["pid"], e["tid"])].append(e)
        for (pid, _tid), evs in by_thread.items():
            kind = kinds.get(pid, "other")
            evs.sort(key=lambda e: (e["tts"], -e["tdur"]))
            stack: list[list[Any]] = []  # open events: [end, bucket, self time left]

            def pop_until(t: float, kind: str = kind, stack: list[list[Any]] = stack) -> None:
                while stack and stack[-1][0] <= t:
                    _end, bucket, own_time = stack.pop()
                    out[kind][bucket] += max(0.0, own_time) / 1e6

            for e in evs:
                begin, dur = float(e["tts"]), float(e["tdur"])
                pop_until(begin)
                bucket = bucket_of(str(e.get("cat", "")), str(e.get("name", "")), e.get("args") or {})
                if stack:
                    stack[-1][2] -= dur  # the parent's self time is what its children did not take
                    if bucket == "other":  # an uninformative inner event: what its parent ran as
                        bucket = stack[-1][1]
                stack.append([begin + dur, bucket, dur])
            pop_until(float("inf"))
    return {k: {b: round(v, 4) for b, v in sorted(buckets.items())} for k, buckets in out.items()}


def _kind_of_process_name(name: str) -> str:
    n = name.lower()
    if "renderer" in n:
        return "renderer"
    if "gpu" in n:
        return "gpu"
    if "network" in n:
        return "network"
    if "browser" in n:
        return "browser"
    return "utility"


def scaled_breakdown(cpu_ms: dict[str, float], traced_s: dict[str, dict[str, float]]) -> dict[str, dict[str, float]]:
    """Per process type, the traced buckets' shares applied to its untraced ms per step; time the trace did not
    cover (no event on the thread) is ``untraced``."""
    out = {}
    for kind, ms in cpu_ms.items():
        if kind == "total":
            continue
        buckets = traced_s.get(kind, {})
        total = sum(buckets.values())
        out[kind] = ({b: round(ms * v / total, 3) for b, v in buckets.items()} if total > 0
                     else {"untraced": round(ms, 3)})
    return out


async def trace_all(base: str, seconds: float, warmup: float, out_dir: Path) -> dict[str, Any]:
    variant = VARIANTS["default"]
    results = {}
    for w in WORKLOADS:
        plain = await run_window(w, variant, base, seconds, warmup)
        traced = await run_window(w, variant, base, seconds, warmup, trace_to=out_dir)
        traced_s = trace_breakdown(traced["trace_files"])
        by_bucket: dict[str, float] = defaultdict(float)
        scaled = scaled_breakdown(plain["cpu_ms_per_step"], traced_s)
        for buckets in scaled.values():
            for b, v in buckets.items():
                by_bucket[b] += v
        results[w.name] = {
            "label": w.label, "tabs": w.tabs, "steps_per_s": plain["steps_per_s"],
            "cpu_ms_per_step": plain["cpu_ms_per_step"],
            "traced_cpu_ms_per_step": traced["cpu_ms_per_step"],
            "ms_per_step_by_process_and_bucket": scaled,
            "ms_per_step_by_bucket": {b: round(by_bucket.get(b, 0.0), 3) for b in [*BUCKETS, "untraced"]
                                      if b in by_bucket},
            "traced_thread_s": traced_s}
        print(f"  {w.name}: {plain['steps_per_s']} steps/s, Chromium {plain['cpu_ms_per_step']['total']} ms/step; "
              f"by bucket {results[w.name]['ms_per_step_by_bucket']}", flush=True)
        for path in traced["trace_files"]:
            Path(path).unlink()  # tens of MB each: the breakdown is what is kept
    return results


async def ab(base: str, names: list[str], rounds: int, seconds: float, warmup: float) -> dict[str, Any]:
    workloads = [w for w in WORKLOADS if w.name in ("light_clicks", "light_loads")]
    runs: dict[str, list[dict[str, Any]]] = defaultdict(list)
    failed: dict[str, str] = {}
    sides = ["default", *[n for n in names if n != "default"]]
    for r in range(rounds):
        order = sides if r % 2 == 0 else list(reversed(sides))
        for name in order:
            for w in workloads:
                if name in failed:
                    continue
                try:
                    got = await run_window(w, VARIANTS[name], base, seconds, warmup)
                except Exception as exc:  # noqa: BLE001 - a variant Chromium cannot run is a finding, not an end
                    failed[name] = f"{w.name}, round {r}: {type(exc).__name__}: {str(exc).splitlines()[0]}"
                    print(f"  {name:24s} {w.name:13s} FAILED: {failed[name]}", flush=True)
                    continue
                runs[name].append({"round": r, **got})
                print(f"  {name:24s} {w.name:13s} {got['steps_per_s']:7.1f} steps/s  Chromium "
                      f"{got['cpu_ms_per_step']['total']:6.2f} ms/step", flush=True)
    summary: dict[str, dict[str, Any]] = {}
    for name, rs in runs.items():
        if name in failed:
            continue
        summary[name] = {}
        for w in workloads:
            ms = [x["cpu_ms_per_step"]["total"] for x in rs if x["workload"] == w.name]
            rate = [x["steps_per_s"] for x in rs if x["workload"] == w.name]
            summary[name][w.name] = {"chromium_ms_per_step": spread(ms, 3), "steps_per_s": spread(rate, 3)}
    ratios = {name: {w.name: round(summary[name][w.name]["chromium_ms_per_step"]["median"]
                                   / summary["default"][w.name]["chromium_ms_per_step"]["median"], 3)
                     for w in workloads} for name in summary}
    return {"summary": summary, "over_default": ratios, "runs": dict(runs), "failed": failed,
            "variants": {n: {"flags": VARIANTS[n].flags, "capture": VARIANTS[n].capture, "cost": VARIANTS[n].cost}
                         for n in sides}}


def trace_rows(result: dict[str, Any]) -> list[dict[str, Any]]:
    rows = []
    for name, r in result.items():
        rows.append(row(f"{name}: Chromium CPU per step ({r['label']})", r["cpu_ms_per_step"]["total"], "ms"))
        for bucket, v in r["ms_per_step_by_bucket"].items():
            rows.append(row(f"{name}: {bucket}", v, "ms"))
    return rows


def ab_rows(result: dict[str, Any]) -> list[dict[str, Any]]:
    rows = []
    for name, per in result["over_default"].items():
        for w, ratio in per.items():
            rows.append(row(f"{name} / default: Chromium CPU per step, {w}", ratio, "x"))
    return rows


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="mode", required=True)
    t = sub.add_parser("trace")
    t.add_argument("--seconds", type=float, default=6.0)
    t.add_argument("--warmup", type=float, default=2.0)
    t.add_argument("--json", type=Path, default=None)
    a = sub.add_parser("ab")
    a.add_argument("--rounds", type=int, default=3)
    a.add_argument("--seconds", type=float, default=8.0)
    a.add_argument("--warmup", type=float, default=2.0)
    a.add_argument("--variants", nargs="+", default=[n for n in VARIANTS if n != "default"], choices=list(VARIANTS))
    a.add_argument("--json", type=Path, default=None)
    args = parser.parse_args(argv)
    with SiteServer() as sites:
        if args.mode == "trace":
            out_dir = Path(args.json).parent if args.json else Path(".")
            result = asyncio.run(trace_all(sites.base_url, args.seconds, args.warmup, out_dir))
            if args.json:
                write_result(args.json, "chromium_cpu_trace", {"seconds": args.seconds, "warmup": args.warmup,
                                                               "browsers": BROWSERS, "categories": TRACE_CATEGORIES},
                             trace_rows(result), [], [
                                 "Each workload runs twice: untraced (CPU per step from /proc, by process type) "
                                 "and traced; the buckets are the traced self thread-time shares, scaled to the "
                                 "untraced CPU of each process type."], workloads=result)
        else:
            result = asyncio.run(ab(sites.base_url, args.variants, args.rounds, args.seconds, args.warmup))
            for name, per in result["over_default"].items():
                print(f"{name:24s} " + "  ".join(f"{w} {r:.3f}" for w, r in per.items()))
            if args.json:
                write_result(args.json, "chromium_cpu_ab", {"rounds": args.rounds, "seconds": args.seconds,
                                                            "warmup": args.warmup, "browsers": BROWSERS},
                             ab_rows(result), [], [
                                 "Rounds alternate the variants' order; medians over rounds (min and max in "
                                 "`summary_by_variant`). Ratios below 1 cut Chromium's CPU per step."],
                             summary_by_variant=result["summary"], over_default=result["over_default"],
                             failed=result["failed"], runs=result["runs"], variants=result["variants"])


if __name__ == "__main__":
    main()
