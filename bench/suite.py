"""The benchmark suite's framework: figures over repeated runs, machine facts, the results directory.

A suite (``bench/suites/``) runs its measurements ``repeats`` times and records every value of every
figure in a :class:`SuiteResult`; a :class:`Figure` reports the median with the min and max, and, where
the project sets one, the goal and whether the median meets it. A run writes::

    RESULTS_DIR/
      <suite>.json     every figure (median, min, max, all values), the suite's configuration, its raw
                       per-run rows, notes, the machine facts; ``skipped`` with the reason when it did not run
                       (:func:`write_suite`)
      <suite>*.png     the suite's plots (:func:`plot_series`: matplotlib, min-max error bars)
      summary.md       the machine, then one table row per figure (``bench.publish.write_summary``)
      summary.json     the same table as data

Rendering stored results into the documentation is ``bench.publish``'s job.
"""

from __future__ import annotations

import datetime as _dt
import importlib.metadata
import json
import os
import platform
import shutil
import statistics
import subprocess
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
# implemented in bench/suites/
SUITE_NAMES = ("ceiling", "async", "async_live", "scaling", "overhead", "codec", "policy")
SCALES = ("tiny", "quick", "full")
#: What ``bench all --quick`` may take on a 2-core machine without a GPU: the suites' budgets are held below it
#: (tests/test_bench_budget.py), and --help states it.
QUICK_LIMIT_S = 600.0
LIBRARIES = ("numpy", "playwright", "pyzmq", "msgpack", "uvloop", "psutil", "torch", "transformers", "matplotlib")
GOAL_OPS = {">=": lambda v, t: v >= t, "<=": lambda v, t: v <= t, ">": lambda v, t: v > t, "<": lambda v, t: v < t}


@dataclass
class Figure:
    """One measured quantity: every repeat's value; reported as the median with min and max."""

    key: str  # stable identifier within the suite, e.g. "light.c16.ratio"
    label: str  # what a reader sees in the summary table
    unit: str = ""
    goal: tuple[str, float] | None = None  # e.g. (">=", 0.85): the median must satisfy it
    values: list[float] = field(default_factory=list)

    def add(self, value: float | None) -> None:
        """Record one repeat's value (None, e.g. a ratio with a zero denominator, is left out)."""
        if value is not None:
            self.values.append(float(value))

    @property
    def median(self) -> float | None:
        return statistics.median(self.values) if self.values else None

    @property
    def met(self) -> bool | None:
        """Whether the median meets the goal; None without a goal or values."""
        if self.goal is None or self.median is None:
            return None
        op, threshold = self.goal
        return bool(GOAL_OPS[op](self.median, threshold))

    def goal_text(self) -> str:
        return f"{self.goal[0]} {num_text(self.goal[1])}{(' ' + self.unit) if self.unit else ''}" if self.goal else ""

    def value_text(self) -> str:
        """``median [min-max] unit``, or ``n/a``."""
        lo, hi = (min(self.values), max(self.values)) if self.values else (None, None)
        return range_text(self.median, lo, hi, len(self.values), self.unit)

    def to_dict(self) -> dict[str, Any]:
        return {"label": self.label, "unit": self.unit, "median": _round(self.median),
                "min": _round(min(self.values)) if self.values else None,
                "max": _round(max(self.values)) if self.values else None,
                "values": [_round(v) for v in self.values], "n": len(self.values),
                "goal": self.goal_text() or None, "met": self.met}


def _round(v: float | None) -> float | None:
    return None if v is None else round(v, 4)


def num_text(v: float | None) -> str:
    """Compact number formatting for tables: 3 significant digits, no exponent for ordinary values."""
    if v is None or v != v:  # None, or NaN (a value that could not be measured)
        return "n/a"
    a = abs(v)
    if float(v).is_integer() and a < 1e6:
        return f"{int(v):,}"
    if a >= 100:
        return f"{v:,.0f}"
    if a >= 10:
        return f"{v:.1f}"
    if a >= 1:
        return f"{v:.2f}"
    return f"{v:.3f}"


def range_text(median: float | None, lo: float | None, hi: float | None, n: int, unit: str = "") -> str:
    """A figure as every page shows it: ``median [min-max] unit`` (one value alone when ``n`` is 1), or ``n/a``."""
    if not n or median is None:
        return "n/a"
    unit = f" {unit}" if unit else ""
    if n == 1:
        return f"{num_text(median)}{unit}"
    return f"{num_text(median)} [{num_text(lo)}-{num_text(hi)}]{unit}"


@dataclass
class SuiteResult:
    """What one suite produced: figures, raw rows, notes, plots, or the reason it was skipped."""

    suite: str
    scale: str
    repeats: int
    config: dict[str, Any] = field(default_factory=dict)
    figures: dict[str, Figure] = field(default_factory=dict)
    runs: list[dict[str, Any]] = field(default_factory=list)  # raw per-run rows, whatever the suite measured
    notes: list[str] = field(default_factory=list)
    plots: list[str] = field(default_factory=list)
    # Headline rows {"figure", "value", "unit", "goal", "met"} that the publisher renders into the README.
    summary: list[dict[str, Any]] = field(default_factory=list)
    skipped: str | None = None
    started_at: float = field(default_factory=time.time)
    duration_s: float = 0.0

    def figure(self, key: str, label: str, unit: str = "", goal: tuple[str, float] | None = None) -> Figure:
        """The figure ``key``, created on first use (later calls return the same object)."""
        fig = self.figures.get(key)
        if fig is None:
            fig = self.figures[key] = Figure(key, label, unit, goal)
        return fig

    def add(self, key: str, label: str, value: float | None, unit: str = "",
            goal: tuple[str, float] | None = None) -> None:
        """Record one repeat's value of figure ``key``."""
        self.figure(key, label, unit, goal).add(value)

    def medians(self, keys: Sequence[str]) -> list[float | None]:
        return [self.figures[k].median if k in self.figures else None for k in keys]

    def to_dict(self, machine: dict[str, Any]) -> dict[str, Any]:
        return {"suite": self.suite, "scale": self.scale, "repeats": self.repeats, "skipped": self.skipped,
                "started_at": _dt.datetime.fromtimestamp(self.started_at, _dt.UTC).isoformat(timespec="seconds"),
                "duration_s": round(self.duration_s, 1), "config": self.config,
                "figures": {k: f.to_dict() for k, f in self.figures.items()}, "notes": self.notes,
                "plots": self.plots, "runs": self.runs, "machine": machine,
                **({"summary": self.summary} if self.summary else {})}


# --- machine facts -------------------------------------------------------------------------------------------
def chromium_version() -> str | None:
    """The version of the Chromium the browser workers launch (``chromium --version``), and whether it is the
    headless shell."""
    from browserpool.config import DEFAULT_CHROMIUM

    for exe in (DEFAULT_CHROMIUM, shutil.which("chromium"), shutil.which("chromium-browser")):
        if not exe or not os.path.exists(exe):
            continue
        try:
            out = subprocess.run([exe, "--version"], capture_output=True, text=True, timeout=20)
        except (OSError, subprocess.SubprocessError):
            continue
        if out.returncode == 0 and out.stdout.strip():
            # The shell prints the same version line as the full browser: say which one the figures are of.
            return out.stdout.strip() + (" (headless shell)" if "headless-shell" in os.path.basename(exe) else "")
    return None


# Pages and stored results, not code: a benchmark that has written its plot into docs/benchmarks/ before it takes
# the machine facts, or a page edited during a run, does not make the code that ran "dirty".
NOT_CODE = (":(exclude)docs", ":(exclude)README.md")


def git_revision(root: Path = ROOT) -> str | None:
    """The checkout's commit, with ``-dirty`` when the working tree's code has changes (the docs do not count);
    ``WEBGYM_CODE_REVISION`` where the code runs from a copy without its git history (a GPU machine's)."""
    if os.environ.get("WEBGYM_CODE_REVISION"):
        return os.environ["WEBGYM_CODE_REVISION"]
    try:
        rev = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=root, capture_output=True, text=True,
                             timeout=10)
        if rev.returncode != 0:
            return None
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no", "--", ".", *NOT_CODE],
                               cwd=root, capture_output=True, text=True, timeout=10)
        return rev.stdout.strip() + ("-dirty" if dirty.stdout.strip() else "")
    except (OSError, subprocess.SubprocessError):
        return None


def library_versions() -> dict[str, str | None]:
    out: dict[str, str | None] = {}
    for name in LIBRARIES:
        try:
            out[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            out[name] = None
    return out


def gpu_facts() -> dict[str, Any] | None:
    """The CUDA device, when torch is installed and sees one."""
    try:
        import torch
    except ImportError:
        return None
    if not torch.cuda.is_available():
        return None
    props = torch.cuda.get_device_properties(0)
    return {"name": props.name, "memory_gib": round(props.total_memory / 2**30, 1), "count": torch.cuda.device_count()}


def machine_facts() -> dict[str, Any]:
    """Cores, memory, load, OS, Chromium, Python and library versions, the code's revision."""
    import psutil

    vm = psutil.virtual_memory()
    try:
        load = [round(x, 2) for x in os.getloadavg()]
    except OSError:
        load = None
    return {
        "cores": os.cpu_count(), "cpu_model": _cpu_model(), "memory_gib": round(vm.total / 2**30, 1),
        "memory_available_gib": round(vm.available / 2**30, 1), "load_average": load,
        "os": platform.platform(), "python": platform.python_version(), "chromium": chromium_version(),
        "libraries": library_versions(), "gpu": gpu_facts(), "git_revision": git_revision(),
        "hostname": platform.node(),
    }


def _cpu_model() -> str | None:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or None


# --- plots ---------------------------------------------------------------------------------------------------
def plot_series(path: Path, title: str, xlabel: str, ylabel: str,
                series: Mapping[str, tuple[Sequence[float] | Sequence[str], Sequence[Figure | None]]], *,
                logx: bool = True,
                hline: float | None = None, hline_label: str = "goal", kind: str = "line",
                styles: dict[str, dict[str, Any]] | None = None) -> Path:
    """One plot: per series, x values and the figures at them (median, min-max error bars); saved as PNG.
    ``styles`` gives matplotlib keyword arguments per series (colour, line style)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.2), dpi=110)
    names = list(series)
    for i, name in enumerate(names):
        xs, figs = series[name]
        # Keep each point's index among the x values: a bar chart places bars by category position.
        pts = [(j, x, f) for j, (x, f) in enumerate(zip(xs, figs, strict=False)) if f is not None and f.values]
        if not pts:
            continue
        px = [p[1] for p in pts]
        med = [p[2].median for p in pts]
        lo = [p[2].median - min(p[2].values) for p in pts]  # type: ignore[operator]
        hi = [max(p[2].values) - p[2].median for p in pts]  # type: ignore[operator]
        if kind == "bar":
            width = 0.8 / max(1, len(names))
            bx = [p[0] + (i - (len(names) - 1) / 2) * width for p in pts]
            ax.bar(bx, med, width, yerr=[lo, hi], capsize=3, label=name)
            ax.set_xticks(range(len(xs)), [str(x) for x in xs], rotation=20, ha="right")
        else:
            ax.errorbar(px, med, yerr=[lo, hi], marker="o", capsize=3, label=name, **(styles or {}).get(name, {}))
    if logx and kind != "bar":
        ax.set_xscale("log", base=2)
        all_x = sorted({x for xs, _ in series.values() for x in xs})
        if all_x:
            ax.set_xticks(all_x, [str(int(x)) if float(x).is_integer() else str(x) for x in all_x])
    if hline is not None:
        ax.axhline(hline, color="grey", linestyle="--", linewidth=1, label=hline_label)
    ax.set_title(title)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.grid(True, alpha=0.3)
    if len(names) > 1 or hline is not None:
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return path


# --- the results directory -----------------------------------------------------------------------------------
def default_results_dir(base: str | Path = "bench-results") -> Path:
    """``bench-results/<UTC timestamp>/`` (a suffix when it exists already)."""
    stamp = _dt.datetime.now(_dt.UTC).strftime("%Y%m%d-%H%M%S")
    path, i = Path(base) / stamp, 1
    while path.exists():
        path, i = Path(base) / f"{stamp}-{i}", i + 1
    return path


def write_suite(out: Path, result: SuiteResult, machine: dict[str, Any]) -> Path:
    """``<suite>.json`` in ``out``."""
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"{result.suite}.json"
    path.write_text(json.dumps(result.to_dict(machine), indent=2) + "\n", encoding="utf-8")
    return path


def summary_rows(results: Sequence[SuiteResult]) -> list[dict[str, Any]]:
    """One row per figure of every suite (a skipped suite gets one row with the reason)."""
    rows: list[dict[str, Any]] = []
    for r in results:
        if r.skipped:
            rows.append({"suite": r.suite, "figure": "(skipped)", "value": r.skipped, "goal": "", "met": None})
            continue
        for f in r.figures.values():
            rows.append({"suite": r.suite, "key": f.key, "figure": f.label, "value": f.value_text(),
                         "goal": f.goal_text(), "met": f.met})
    return rows


def summary_table_text(results: Sequence[SuiteResult]) -> str:
    """A plain-text table of every figure, for the terminal."""
    rows = [("suite", "figure", "value (median [min-max])", "goal", "met")]
    for row in summary_rows(results):
        met = "" if row["met"] is None else ("yes" if row["met"] else "NO")
        rows.append((row["suite"], row["figure"], row["value"], row["goal"], met))
    widths = [min(70, max(len(str(r[i])) for r in rows)) for i in range(5)]
    out = []
    for j, r in enumerate(rows):
        out.append("  ".join(str(c)[:widths[i]].ljust(widths[i]) for i, c in enumerate(r)).rstrip())
        if j == 0:
            out.append("  ".join("-" * w for w in widths))
    return "\n".join(out)
