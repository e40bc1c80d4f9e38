"""The result file of a standalone benchmark (soak, chaos): machine facts, configuration, raw samples, a ``summary``
list of headline rows ``{figure, value, unit, goal, met}``, the plots beside it and notes; and the small series
helpers they share (a least-squares slope)."""

from __future__ import annotations

import json
import statistics
from pathlib import Path
from typing import Any

from bench.suite import machine_facts


def row(figure: str, value: float, unit: str, goal: str | None = None, met: bool | None = None) -> dict[str, Any]:
    """One headline figure of the ``summary`` list (``goal`` in words, e.g. "<= 1 MiB per 1,000 episodes")."""
    return {"figure": figure, "value": round(float(value), 4), "unit": unit, "goal": goal, "met": met}


def spread(values: list[float], digits: int = 2) -> dict[str, float]:
    """The median of repeated measurements with their min and max."""
    return {"median": round(statistics.median(values), digits), "min": min(values), "max": max(values)}


def slope(xs: list[float], ys: list[float]) -> float | None:
    """The least-squares slope of ys over xs; None with fewer than two distinct xs."""
    n = len(xs)
    if n < 2:
        return None
    mx, my = sum(xs) / n, sum(ys) / n
    sxx = sum((x - mx) ** 2 for x in xs)
    if sxx == 0:
        return None
    return sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / sxx


def write_result(path: Path, benchmark: str, config: dict[str, Any], summary: list[dict[str, Any]],
                 plots: list[str], notes: list[str], **data: Any) -> Path:
    """Write the result JSON (the plots are file names beside it); returns the path."""
    path.parent.mkdir(parents=True, exist_ok=True)
    doc = {"benchmark": benchmark, "machine": machine_facts(), "config": config, "summary": summary,
           "plots": plots, "notes": notes, **data}
    path.write_text(json.dumps(doc, indent=1, default=str) + "\n")
    return path
