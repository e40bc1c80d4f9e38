"""The monitor's widgets: the cell grid (one widget draws every cell), the statistics and the detail panes."""

from __future__ import annotations

import math
from typing import Any

from rich.console import Group
from rich.segment import Segment
from rich.style import Style
from rich.table import Table
from rich.text import Text
from textual.binding import Binding
from textual.events import Click, Resize
from textual.geometry import Region, Size
from textual.message import Message
from textual.scroll_view import ScrollView
from textual.strip import Strip
from textual.widgets import Static

from tui.model import OP_NAMES, OPS, PHASES, STATE_NAMES, STATES, Cell, MonitorModel

CELL_W = 3  # two characters and a gap
CELL_STYLES: dict[str, Style] = {
    "N": Style.parse("grey62 on grey19"),
    "W": Style.parse("black on yellow"),
    "R": Style.parse("bright_white on dodger_blue3"),
    "F1": Style.parse("black on green3"),
    "F0": Style.parse("bright_white on red3"),
    "F?": Style.parse("black on grey70"),
    "X": Style.parse("bold yellow on dark_magenta"),
}
SELECTED = Style(reverse=True, bold=True, underline=True)
# F?: no reward value, the judge's still to come or none at all (an unrewarded episode).
LEGEND = (("F1", "reward 1"), ("F0", "reward 0"), ("F?", "no reward (yet)"))
SPARK = "▁▂▃▄▅▆▇█"


def sparkline(values: list[float], width: int = 30) -> str:
    """Unicode bars for the last ``width`` values, scaled to their maximum."""
    vals = values[-width:]
    if not vals:
        return ""
    top = max(vals) or 1.0
    return "".join(SPARK[min(len(SPARK) - 1, int(v / top * (len(SPARK) - 1) + 0.5))] for v in vals)


def fmt_s(seconds: float | None) -> str:
    """``1h02m``, ``3m05s``, ``12s``; ``?`` when unknown."""
    if seconds is None:
        return "?"
    s = int(seconds)
    if s >= 3600:
        return f"{s // 3600}h{s % 3600 // 60:02d}m"
    if s >= 60:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s}s"


def fmt_mib(n: int | None) -> str:
    """Bytes as MiB; ``-`` when not sampled."""
    return "-" if not n else f"{n / 2**20:.0f} MiB"


# mypy does not follow textual (pyproject): ScrollView is Any to it, and it checks can_focus against object's.
class CellGrid(ScrollView, can_focus=True):  # type: ignore[call-arg]
    """Every rollout as one cell, re-flowed to the width; draws lines as segments (no widget per cell)."""

    BINDINGS = [
        Binding("up", "move(0, -1)", "up", show=False), Binding("down", "move(0, 1)", "down", show=False),
        Binding("left", "move(-1, 0)", "left", show=False), Binding("right", "move(1, 0)", "right", show=False),
        Binding("home", "jump(0)", "first", show=False), Binding("end", "jump(-1)", "last", show=False),
    ]
    DEFAULT_CSS = """
    CellGrid { height: 1fr; min-height: 4; scrollbar-size-vertical: 1; }
    """

    class Selected(Message):
        """The selected cell changed (None: nothing selected)."""

        def __init__(self, episode_id: str | None) -> None:
            super().__init__()
            self.episode_id = episode_id

    def __init__(self, **kw: Any) -> None:
        super().__init__(**kw)
        self.cells: list[Cell] = []
        self.index: dict[str, int] = {}
        self.selected: str | None = None
        self.columns = 1

    # --- layout ---------------------------------------------------------------------------------------
    def _reflow(self) -> None:
        width = max(CELL_W, self.scrollable_content_region.width or self.size.width)
        self.columns = max(1, width // CELL_W)
        rows = math.ceil(len(self.cells) / self.columns)
        self.virtual_size = Size(self.columns * CELL_W, rows)

    def on_resize(self, event: Resize) -> None:
        self._reflow()
        self.refresh()

    def set_cells(self, cells: list[Cell]) -> None:
        """Show these cells (already filtered), keeping the selection when it is still there."""
        self.cells = cells
        self.index = {c.episode_id: i for i, c in enumerate(cells)}
        self._reflow()
        self.refresh()

    # --- drawing --------------------------------------------------------------------------------------
    def render_line(self, y: int) -> Strip:
        scroll_x, scroll_y = self.scroll_offset
        row = y + scroll_y
        start = row * self.columns
        if start >= len(self.cells):
            return Strip.blank(self.size.width)
        segments: list[Segment] = []
        gap = Segment(" ")  # unstyled, so neighbouring cells of one colour stay apart
        selected = self.selected
        for cell in self.cells[start:start + self.columns]:
            style = CELL_STYLES.get(cell.style_key, CELL_STYLES["N"])
            if cell.episode_id == selected:
                style = style + SELECTED
            segments.append(Segment(cell.text, style))
            segments.append(gap)
        strip = Strip(segments)
        return strip.crop(scroll_x, scroll_x + self.size.width)

    # --- selection ------------------------------------------------------------------------------------
    def select(self, episode_id: str | None) -> None:
        """Select a cell by episode id and scroll it into view."""
        self.selected = episode_id
        i = self.index.get(episode_id) if episode_id else None
        if i is not None:
            row, col = divmod(i, self.columns)
            self.scroll_to_region(Region(col * CELL_W, row, CELL_W, 1), animate=False, immediate=True)
        self.refresh()
        self.post_message(self.Selected(episode_id))

    def action_move(self, dx: int, dy: int) -> None:
        """Move the selection by cells (dx) or rows (dy)."""
        if not self.cells:
            return
        i = self.index.get(self.selected, -1) if self.selected else -1
        i = 0 if i < 0 else max(0, min(len(self.cells) - 1, i + dx + dy * self.columns))
        self.select(self.cells[i].episode_id)

    def action_jump(self, i: int) -> None:
        """Select the first (0) or last (-1) cell."""
        if self.cells:
            self.select(self.cells[i].episode_id)

    def on_click(self, event: Click) -> None:
        col = (event.x + int(self.scroll_offset.x)) // CELL_W
        row = event.y + int(self.scroll_offset.y)
        if col < self.columns:
            i = row * self.columns + col
            if 0 <= i < len(self.cells):
                self.focus()
                self.select(self.cells[i].episode_id)


class StatsPane(Static):
    """Counts, operations in flight, rates, success, latencies, queues, workers, time."""

    DEFAULT_CSS = """
    StatsPane { width: 48; height: 1fr; padding: 0 1; border-left: solid $primary-darken-2; overflow-y: auto; }
    """

    def show(self, model: MonitorModel) -> None:
        """Redraw from the model."""
        self.update(render_stats(model), layout=False)  # a fixed-size pane: no re-layout


def render_stats(model: MonitorModel) -> Group:
    """The statistics pane's content (a function, so tests and exports can use it)."""
    agg = model.agg
    counts = model.counts()
    parts: list[Any] = []
    states = Text()
    for s in STATES:
        key = "F1" if s == "F" else s
        states.append(f" {s} ", CELL_STYLES[key])
        states.append(f" {STATE_NAMES[s]} {counts.get(s, 0)}\n")
    parts.append(states)
    ops = model.ops_in_flight()
    parts.append(Text("in flight: " + " ".join(f"{o}:{ops[o]}" for o in OPS), style="bold", no_wrap=True))
    parts.append(Text(" ".join(f"{o} {OP_NAMES[o]}," for o in OPS).rstrip(","), style="dim"))
    total, done = agg.total or len(model.cells), agg.done
    outcomes = agg.outcomes
    rate = Table.grid(padding=(0, 1))
    rate.add_column(style="bold")
    rate.add_column()
    rate.add_row("episodes", f"{done}/{total}  ✓{outcomes.success} ✗{outcomes.failure} !{outcomes.error}")
    # Episodes nothing scored, each apart: none of them is a failure of the agent's (large counts wrap, never cut).
    rate.add_row("unscored", f"unrewarded {outcomes.unrewarded}  blocked {outcomes.blocked}  "
                             f"judge {outcomes.judge_pending}")
    rate.add_row("success", f"{agg.success_rate:.1%} of rewarded")
    rate.add_row("steps/s", f"{agg.steps_per_s:.1f}  ({agg.steps} steps)")
    rate.add_row("", Text(sparkline(agg.spark, 30), style="green"))
    rate.add_row("episodes/min", f"{agg.episodes_per_min:.1f}")
    rate.add_row("elapsed", f"{fmt_s(agg.elapsed_s)}   left ~{fmt_s(agg.eta_s)}")
    parts.append(rate)
    lat = Table(box=None, padding=(0, 1), show_edge=False, header_style="bold")
    lat.add_column("latency ms")
    lat.add_column("p50", justify="right")
    lat.add_column("p95", justify="right")
    for name in PHASES:
        p = agg.phases.get(name)
        lat.add_row(name, f"{p[0]:.0f}" if p else "-", f"{p[1]:.0f}" if p else "-")
    parts.append(lat)
    q = agg.queues
    parts.append(Text.assemble(
        ("queues", "bold"), "  in flight + waiting\n",
        f"  policy {q.policy_in_use}/{q.policy_cap} +{q.policy_waiting}   "
        f"browser ops {q.browser_in_flight} +{q.browser_waiting}\n",
        f"  browser leases +{q.lease_waiting}   judge +{q.judge_pending}"))
    workers = Table(box=None, padding=(0, 1), show_edge=False, header_style="bold")
    for col, just in (("worker", "left"), ("ok", "left"), ("eps", "right"), ("ops", "right"), ("PSS", "right")):
        workers.add_column(col, justify=just)  # type: ignore[arg-type]
    ws = agg.workers
    for w in ws[:16]:
        workers.add_row(w.id, Text("●", "green") if w.alive else Text("✗", "red"), str(w.episodes),
                        f"{w.ops}+{w.waiting}", fmt_mib(w.pss))
    if len(ws) > 16:
        workers.add_row(f"+{len(ws) - 16} more", "", "", "", "")
    parts.append(workers)
    parts.append(Text(f"browser PSS {fmt_mib(agg.pss_total)}, peak {fmt_mib(agg.peak_pss)}, "
                      f"restarts {agg.restarts}", style="dim", overflow="ellipsis", no_wrap=True))
    legend = Text("F:", no_wrap=True, overflow="ellipsis")
    for key, name in LEGEND:
        legend.append(" ", CELL_STYLES[key])
        legend.append(f" {name} ")
    parts.append(legend)
    return Group(*parts)


class DetailPane(Static):
    """The selected rollout: task, URL, last action and thought, step timings, latest screenshot."""

    DEFAULT_CSS = """
    DetailPane { height: 12; border-top: solid $primary-darken-2; padding: 0 1; overflow-y: auto; }
    """

    def show(self, cell: Cell | None) -> None:
        """Redraw for this cell (None: a hint)."""
        self.update(render_detail(cell), layout=False)


def render_detail(cell: Cell | None) -> Text:
    """The detail pane's content."""
    if cell is None:
        return Text("select a cell (arrows, click) to see its task, URL, action, thought, timings, screenshot",
                    style="dim")
    d = cell.details
    t = Text()
    state = STATE_NAMES.get(cell.state, cell.state)
    if cell.state == "R":
        state += f", step {cell.step}, {OP_NAMES.get(cell.op, cell.op)}"
    if cell.reward is not None:
        state += f", reward {cell.reward:g}"
    t.append(f"{cell.episode_id}", "bold")
    t.append(f"  [{state}]\n", CELL_STYLES.get(cell.style_key, Style()))
    rows = (("task", d.get("task")), ("url", d.get("url")), ("title", d.get("title")),
            ("action", d.get("action")), ("thought", d.get("thought")), ("screenshot", d.get("screenshot")),
            ("error", d.get("error")))
    for label, value in rows:
        if value or label in ("task", "url", "action", "screenshot"):
            t.append(f"{label:>10} ", "bold")
            t.append(f"{value or '-'}\n")
    timings = d.get("timings") or {}
    t.append(f"{'timings':>10} ", "bold")
    t.append("  ".join(f"{k.removesuffix('_ms')} {v:.0f}" for k, v in timings.items()) or "-")
    return t
