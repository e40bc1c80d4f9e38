"""Progress while a run goes: a live bar on a terminal, a periodic status line otherwise."""

from __future__ import annotations

import asyncio
import sys
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from engine.store.stats import RunStats


def status_line(stats: RunStats) -> str:
    """One line of progress (when the run is not on a terminal)."""
    s = stats
    live = " ".join(f"{k}={v}" for k, v in sorted(s.states.items()) if v and k in "WR")
    return (f"[{s.elapsed_s:7.1f}s] episodes {s.done}/{s.total}  steps {s.steps} ({s.steps_per_s:.1f}/s)  "
            f"success {s.success_rate:.0%}  {_unscored(s)}errors {s.outcomes['error']}  {live}")


def _unscored(stats: RunStats) -> str:
    """The counts of episodes nothing scored (unrewarded, blocked, judge pending), those that are not 0."""
    counts = (("unrewarded", stats.outcomes["unrewarded"]), ("blocked", stats.outcomes["blocked"]),
              ("judge pending", stats.outcomes["judge_pending"]))
    return "".join(f"{name} {n}  " for name, n in counts if n)


async def show_progress(stats: RunStats, console: Console, interval_s: float = 10.0) -> None:
    """Runs until cancelled: a rich bar when attached to a terminal, else one line per interval."""
    if console.is_terminal:
        columns: list[Any] = [
            TextColumn("[bold]rollouts"), BarColumn(), MofNCompleteColumn(), TextColumn("{task.fields[info]}"),
            TimeElapsedColumn()]
        with Progress(*columns, console=console, transient=False) as bar:
            task = bar.add_task("run", total=stats.total, info="")
            try:
                while True:
                    bar.update(task, completed=stats.done, total=stats.total,
                               info=f"{stats.steps_per_s:5.1f} steps/s  success {stats.success_rate:.0%}  "
                                    f"{_unscored(stats)}errors {stats.outcomes['error']}")
                    await asyncio.sleep(0.25)
            finally:
                bar.update(task, completed=stats.done)
    else:
        while True:
            await asyncio.sleep(interval_s)
            print(status_line(stats), file=sys.stderr, flush=True)


def summary_table(summary: dict[str, Any], title: str = "run summary") -> Table:
    """The run summary as ``webgym-engine run`` prints it at the end (``summary``: :meth:`RunStats.summary`)."""
    table = Table(title=title, show_header=True, header_style="bold")
    table.add_column("metric")
    table.add_column("value", justify="right")
    rows = [
        ("episodes", summary["episodes"]), ("succeeded", summary["succeeded"]), ("failed", summary["failed"]),
        ("unrewarded", summary["unrewarded"]), ("blocked", summary["blocked"]), ("errors", summary["errors"]),
        ("judge pending", summary["judge_pending"]), ("lost", summary["lost"]),
        ("success rate (of rewarded)", f"{summary['success_rate']:.1%}"),
        ("steps", summary["steps"]), ("steps/s", f"{summary['steps_per_s']:.2f}"),
        ("step latency p50", f"{summary['step_latency_p50_ms']:.0f} ms"),
        ("step latency p95", f"{summary['step_latency_p95_ms']:.0f} ms"),
        ("peak browser PSS", f"{summary['peak_browser_pss_mib']:.0f} MiB"),
        ("elapsed", f"{summary['elapsed_s']:.1f} s"), ("worker restarts", summary["worker_restarts"]),
    ]
    for k, v in rows:
        table.add_row(k, str(v))
    return table
