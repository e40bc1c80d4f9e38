"""The monitor: a Textual app with the cell grid, the statistics pane and the selected rollout's details.

Messages are applied to the model as they arrive (cheap); the view redraws at most ``refresh_hz`` times a
second, and only when something changed.
"""

from __future__ import annotations

import copy
from typing import Any

from textual.app import App, ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.widgets import Footer, Header, Input

from engine.telemetry.wire import TelemetryMessage
from tui.driver import HangupSafeDriver
from tui.feed import Source
from tui.model import STATE_NAMES, STATES, Cell, MonitorModel
from tui.widgets import CellGrid, DetailPane, StatsPane

FILTERS: tuple[str | None, ...] = (None, *STATES)


class MonitorApp(App[None]):
    """Every rollout as a live cell; see the footer for the keys."""

    TITLE = "webgym-engine monitor"
    CSS = """
    #main { height: 1fr; }
    #left { width: 1fr; }
    #search { dock: bottom; display: none; }
    #search.shown { display: block; }
    """
    BINDINGS = [
        Binding("f", "cycle_filter", "filter state"),
        Binding("slash", "search", "search task"),
        Binding("escape", "clear", "clear filter"),
        Binding("p", "pause", "pause"),
        Binding("q", "quit", "quit"),
    ]
    sub_title: str  # App's reactive, declared for mypy (which does not follow textual: see pyproject)

    def __init__(self, source: Source, refresh_hz: float = 10.0, **kw: Any) -> None:
        kw.setdefault("driver_class", HangupSafeDriver)  # a terminal that goes away cannot hang the process
        super().__init__(**kw)
        self.source = source
        self.model = MonitorModel()
        self.refresh_hz = min(refresh_hz, 10.0)
        self.paused = False
        self.status = "starting"
        self.applied = 0
        self.redraws = 0
        self._drawn = -1
        self._frozen: dict[str, Cell] = {}
        self._stats_drawn: tuple[Any, ...] = ()
        self._detail_drawn: tuple[Any, ...] = ()

    def compose(self) -> ComposeResult:
        yield Header(show_clock=False)
        with Horizontal(id="main"):
            with Vertical(id="left"):
                yield CellGrid(id="grid")
                yield DetailPane(id="detail")
            yield StatsPane(id="stats")
        yield Input(placeholder="task id (Enter: keep, Esc: clear)", id="search")
        yield Footer()

    def on_mount(self) -> None:
        self.query_one(CellGrid).focus()
        self.run_worker(self.source.run(self._apply, self._set_status), exclusive=True, name="feed")
        self.set_interval(1.0 / self.refresh_hz, self.refresh_view)
        self.refresh_view(force=True)

    # --- feed -----------------------------------------------------------------------------------------
    def _apply(self, msg: TelemetryMessage) -> None:
        self.model.apply(msg)
        self.applied += 1

    def _set_status(self, text: str) -> None:
        self.status = text
        self.model.version += 1  # the subtitle shows it

    # --- view -----------------------------------------------------------------------------------------
    def refresh_view(self, force: bool = False) -> None:
        """Redraw when the model changed (at most ``refresh_hz`` a second: called by a timer)."""
        if (self.paused or self.model.version == self._drawn) and not force:
            return
        self._drawn = self.model.version
        self.redraws += 1
        grid = self.query_one(CellGrid)
        if not self.paused:
            grid.set_cells(self.model.visible())
            # The statistics (Rich tables: the costly part) follow the aggregates, which come twice a second.
            stats_key = (self.model.agg_version, self.model.state_filter, self.model.search)
            if force or stats_key != self._stats_drawn:
                self._stats_drawn = stats_key
                self.query_one(StatsPane).show(self.model)
        self._show_detail(grid.selected, force)
        self._update_subtitle()

    def _show_detail(self, episode_id: str | None, force: bool = True) -> None:
        cells = self._frozen if self.paused else self.model.cells
        cell = cells.get(episode_id) if episode_id else None
        key = (episode_id, cell.version if cell else -1, self.paused)
        if force or key != self._detail_drawn:
            self._detail_drawn = key
            self.query_one(DetailPane).show(cell)

    def _update_subtitle(self) -> None:
        m = self.model
        parts = [m.run or "-", self.status]
        if m.state_filter:
            parts.append(f"filter: {STATE_NAMES[m.state_filter]}")
        if m.search:
            parts.append(f"search: {m.search}")
        if m.gaps:
            parts.append(f"{m.gaps} messages lost")
        if self.paused:
            parts.append("PAUSED")
        sub_title = " · ".join(parts)
        if sub_title != self.sub_title:
            self.sub_title = sub_title

    def on_cell_grid_selected(self, event: CellGrid.Selected) -> None:
        self._show_detail(event.episode_id)

    # --- keys -----------------------------------------------------------------------------------------
    def action_cycle_filter(self) -> None:
        """Show all cells, then only N, W, R, F, X in turn."""
        i = FILTERS.index(self.model.state_filter)
        self.model.state_filter = FILTERS[(i + 1) % len(FILTERS)]
        self._view_changed()

    def action_search(self) -> None:
        """Open the search box (task or episode id substring)."""
        box = self.query_one("#search", Input)
        box.add_class("shown")
        box.value = self.model.search
        box.focus()

    def action_clear(self) -> None:
        """Clear the filter and the search."""
        self.model.state_filter, self.model.search = None, ""
        box = self.query_one("#search", Input)
        box.value = ""
        box.remove_class("shown")
        self.query_one(CellGrid).focus()
        self._view_changed()

    def action_pause(self) -> None:
        """Freeze the view (the feed keeps being applied; resuming shows the present)."""
        self.paused = not self.paused
        if self.paused:
            frozen = [copy.copy(c) for c in self.model.visible()]
            self._frozen = {c.episode_id: c for c in frozen}
            self.query_one(CellGrid).set_cells(frozen)
        self._view_changed()

    def on_input_changed(self, event: Input.Changed) -> None:
        self.model.search = event.value.strip()
        self._view_changed()

    def on_input_submitted(self, event: Input.Submitted) -> None:
        event.input.remove_class("shown")
        grid = self.query_one(CellGrid)
        grid.focus()
        self._view_changed()
        visible = grid.cells
        if visible and grid.selected not in grid.index:
            grid.select(visible[0].episode_id)

    def _view_changed(self) -> None:
        self.model.version += 1
        self.refresh_view(force=True)
