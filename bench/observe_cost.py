"""What an accessibility tree and a DOM snapshot cost per observation, against a screenshot alone, in the same run.

Through the engine's own parts: a browser pool of one worker process (Chromium as the workers run it), sessions
each holding a bundled page (the light shop home page, the heavy page), observing it again and again (``Observe``:
what is in flight waited for, the capture, and with ``axtree`` the tree read beside it, with ``dom`` the snapshot),
and on the engine's side the tree's text as the prompt gets it (``tree_text``, marked from the snapshot). Per
observation, over a steady window: Chromium's CPU (its processes, from /proc), the engine's CPU (this process, the
worker's Python and its Playwright driver), the latency, and the sizes (tree nodes, characters of its text, snapshot
elements). Rounds alternate the order of the modes; medians over rounds.

    python -m bench.observe_cost [--rounds 3] [--seconds 6] [--sessions 4] [--json PATH]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
from pathlib import Path
from typing import Any

import psutil

from bench.chromium_cpu import ChromiumCpu, process_type
from bench.report import row, spread, write_result
from browserpool.pool import BrowserPool, BrowserSession, PoolConfig
from engine.agent.tree_text import tree_text
from engine.sites.server import SiteServer

PAGES = {"light": "/shop/", "heavy": "/heavy/shop.html"}
MODES = ("screenshot", "screenshot+dom", "screenshot+axtree", "screenshot+axtree+dom")


def engine_cpu_s() -> float:
    """CPU seconds of this process and of its children that are not Chromium: the browser workers' Python and their
    Playwright drivers (node), which carry every CDP reply to the worker."""
    me = psutil.Process()
    total = sum(me.cpu_times()[:2])
    for child in me.children(recursive=True):
        try:
            if process_type(child) is None:
                total += sum(child.cpu_times()[:2])
        except psutil.Error:
            continue
    return total


async def observe_loop(session: BrowserSession, mode: str, stop: asyncio.Event, out: dict[str, list[float]]
                       ) -> None:
    tree, dom = "axtree" in mode, "dom" in mode
    while not stop.is_set():
        t0 = time.perf_counter()
        obs, frame = await session.observe(axtree=tree, dom=dom)
        frame.release()
        if tree:
            text = tree_text(obs.axtree or [], obs.axtree_cut, obs.dom)  # what the engine builds for the prompt
            out["nodes"].append(len(obs.axtree or []))
            out["chars"].append(len(text))
        if dom:
            out["elements"].append(len(obs.dom or []))
        out["latency_ms"].append((time.perf_counter() - t0) * 1000)


async def window(sessions: list[BrowserSession], mode: str, seconds: float, warmup: float) -> dict[str, float]:
    """Observations of every session for ``seconds`` after ``warmup``: CPU and latency per observation."""
    stop = asyncio.Event()
    samples: dict[str, list[float]] = {"latency_ms": [], "nodes": [], "chars": [], "elements": []}
    loops = [asyncio.create_task(observe_loop(s, mode, stop, samples)) for s in sessions]
    await asyncio.sleep(warmup)
    chromium = ChromiumCpu()
    c0, e0, n0 = sum(chromium.read().values()), engine_cpu_s(), len(samples["latency_ms"])
    await asyncio.sleep(seconds)
    c1, e1, n1 = sum(chromium.read().values()), engine_cpu_s(), len(samples["latency_ms"])
    stop.set()
    await asyncio.gather(*loops)
    n = max(1, n1 - n0)
    out = {"observations": n, "chromium_ms": (c1 - c0) * 1000 / n, "engine_ms": (e1 - e0) * 1000 / n,
           "latency_ms": statistics.median(samples["latency_ms"][n0:n1] or [0.0]),
           "per_s": n / seconds}
    for size in ("nodes", "chars", "elements"):
        if samples[size]:
            out[size] = statistics.median(samples[size])
    return out


async def measure(base: str, rounds: int, seconds: float, warmup: float, n_sessions: int) -> dict[str, Any]:
    pool = BrowserPool(PoolConfig(workers=1))
    await pool.start()
    runs: dict[str, dict[str, list[dict[str, float]]]] = {p: {m: [] for m in MODES} for p in PAGES}
    try:
        for page, path in PAGES.items():
            sessions = []
            for i in range(n_sessions):
                session = await pool.lease(f"observe-cost-{page}-{i}")
                obs, frame = await session.open(base + path)
                frame.release()
                sessions.append(session)
            for r in range(rounds):
                order = MODES if r % 2 == 0 else MODES[::-1]
                for mode in order:
                    runs[page][mode].append(await window(sessions, mode, seconds, warmup))
            for session in sessions:
                await session.close()
    finally:
        await pool.close()
    summary: dict[str, Any] = {}
    for page, per in runs.items():
        summary[page] = {}
        for mode, windows in per.items():
            keys = windows[0].keys()
            summary[page][mode] = {k: spread([w[k] for w in windows]) for k in keys}
        plain, dom, tree, both = (summary[page][m] for m in MODES)
        summary[page]["tree_adds"] = _adds(plain, tree)
        summary[page]["dom_adds"] = _adds(plain, dom)
        summary[page]["dom_adds_to_tree"] = _adds(tree, both)  # the snapshot read beside the tree
    return {"summary": summary, "runs": runs}


def _adds(before: dict[str, Any], after: dict[str, Any]) -> dict[str, float]:
    return {k: round(after[k]["median"] - before[k]["median"], 2) for k in ("chromium_ms", "engine_ms", "latency_ms")}


def rows(result: dict[str, Any]) -> list[dict[str, Any]]:
    out = []
    for page, s in result["summary"].items():
        for mode in MODES:
            out.append(row(f"{page}, {mode}: Chromium CPU per observation", s[mode]["chromium_ms"]["median"], "ms"))
            out.append(row(f"{page}, {mode}: engine CPU per observation", s[mode]["engine_ms"]["median"], "ms"))
            out.append(row(f"{page}, {mode}: latency per observation", s[mode]["latency_ms"]["median"], "ms"))
        tree = s["screenshot+axtree"]
        out.append(row(f"{page}: tree nodes", tree["nodes"]["median"], "nodes"))
        out.append(row(f"{page}: tree text", tree["chars"]["median"], "characters"))
        out.append(row(f"{page}: snapshot elements", s["screenshot+axtree+dom"]["elements"]["median"], "elements"))
        for k, v in s["tree_adds"].items():
            out.append(row(f"{page}: the tree adds ({k.removesuffix('_ms')})", v, "ms"))
        for k, v in s["dom_adds"].items():
            out.append(row(f"{page}: the snapshot adds ({k.removesuffix('_ms')})", v, "ms"))
    return out


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=6.0)
    parser.add_argument("--warmup", type=float, default=1.5)
    parser.add_argument("--sessions", type=int, default=4)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args(argv)
    with SiteServer() as sites:
        result = asyncio.run(measure(sites.base_url, args.rounds, args.seconds, args.warmup, args.sessions))
    for page, s in result["summary"].items():
        for mode in MODES:
            m = s[mode]
            print(f"{page:6s} {mode:22s} chromium {m['chromium_ms']['median']:7.1f} ms  engine "
                  f"{m['engine_ms']['median']:6.1f} ms  latency {m['latency_ms']['median']:7.1f} ms  "
                  f"{m['per_s']['median']:6.1f}/s")
        print(f"{page:6s} tree adds {s['tree_adds']}  ({s['screenshot+axtree']['nodes']['median']:.0f} nodes, "
              f"{s['screenshot+axtree']['chars']['median']:.0f} characters)")
        print(f"{page:6s} snapshot adds {s['dom_adds']}, to the tree {s['dom_adds_to_tree']}  "
              f"({s['screenshot+axtree+dom']['elements']['median']:.0f} elements)")
    if args.json:
        write_result(args.json, "observe_cost", {"rounds": args.rounds, "seconds": args.seconds,
                                                 "warmup": args.warmup, "sessions": args.sessions, "pages": PAGES},
                     rows(result), [], [
                         "One worker; each session observes its page in a loop (settled, captured, and with the "
                         "DOM snapshot, the tree, or both, read beside the capture); rounds alternate the "
                         "modes' order; medians over rounds.",
                         "Engine CPU: the engine process and the worker's Python (the tree's decoding, its text); "
                         "Chromium CPU: its processes, from /proc."],
                     summary_by_page=result["summary"], runs=result["runs"])


if __name__ == "__main__":
    main()
