"""The ``codec`` suite: frame comparison) of ``engine._imgcodec`` against PyTurboJPEG and Pillow on screenshots of both
profiles.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from bench import ceiling
from bench import codec as codec_bench
from bench.suite import SuiteResult, plot_series
from bench.suites.common import BARE_LOOP_FIXED_S, OPEN_S_PER_ROLLOUT

CONFIG: dict[str, dict[str, Any]] = {  # per scale (the CLI's --repeats overrides "repeats")
    "full": {"reps": 80, "repeats": 3, "pages": {"light": 6, "heavy": 4}},
    "quick": {"reps": 20, "repeats": 1, "pages": {"light": 6, "heavy": 4}},
    "tiny": {"reps": 2, "repeats": 1, "pages": {"light": 1, "heavy": 1}},
}


def budget_s(cfg: dict[str, Any]) -> float:
    """What a run of ``cfg`` takes at most: the screenshots (a browser, each page loaded), then per repeat ``reps``
    rounds of every operation and library on them, allowed 0.2 s a round (the whole quick suite took 9-11 s in the runs
    of 2026-12-04)."""
    pages = sum(cfg["pages"].values())
    return BARE_LOOP_FIXED_S + OPEN_S_PER_ROLLOUT["heavy"] * pages + cfg["repeats"] * cfg["reps"] * 0.2


async def measure(res: SuiteResult, cfg: dict[str, Any], base: str, out: Path) -> None:
    """``bench/codec.py`` on screenshots of both page profiles."""

    pages = [p for profile, k in cfg["pages"].items() for p in ceiling.PROFILES[profile][:k]]
    # The codec benchmark drives its own event loop (screenshots) and times synchronous calls: a thread.
    shots = await asyncio.to_thread(codec_bench.capture_screenshots, codec_bench.QUALITY, pages)
    for rep in range(cfg["repeats"]):
        row = await asyncio.to_thread(codec_bench.run, cfg["reps"], None, shots)
        res.runs.append({"repeat": rep, **row})
        for op, libs in row["median_ms"].items():
            for lib, ms in libs.items():
                res.add(f"{op}.{lib}_ms", f"{op}: {lib}", ms, "ms")
            if "pillow" in libs and libs.get("imgcodec"):
                res.add(f"{op}.speedup_vs_pillow", f"{op}: imgcodec speed-up over Pillow",
                        libs["pillow"] / libs["imgcodec"], "x")
    res.config["screenshots"] = len(shots)
    ops = list(res.runs[0]["median_ms"]) if res.runs else []
    plot_series(out / "codec.png", "Image path (median ms per call)", "operation", "ms",
                {lib: (ops, [res.figures.get(f"{op}.{lib}_ms") for op in ops]) for lib in codec_bench.LIBS},
                logx=False, kind="bar")
    res.plots.append("codec.png")
