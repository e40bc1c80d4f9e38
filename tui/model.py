"""What the monitor shows: the cells and the aggregates, built from telemetry messages. Pure; no I/O.

:meth:`MonitorModel.apply` takes one message (``engine/telemetry/wire.py``); ``version`` goes up
whenever something visible changed, so the view redraws only then.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from engine.telemetry.wire import Aggregate, TelemetryMessage

STATES = ("N", "W", "R", "F", "X")
STATE_NAMES = {"N": "not started", "W": "waiting", "R": "running", "F": "finished", "X": "failed"}
OPS = ("n", "s", "t", "a", "e", "r")
OP_NAMES = {"n": "navigate", "s": "screenshot", "t": "element tree", "a": "model", "e": "execute", "r": "reward"}
PHASES = ("action", "settle", "screenshot", "model", "judge")


@dataclass
class Cell:
    """One rollout."""

    episode_id: str
    task_id: str = ""
    state: str = "N"
    op: str = ""
    step: int = 0
    reward: float | None = None
    details: dict[str, Any] = field(default_factory=dict)
    version: int = 0  # goes up with every change: the detail pane redraws only then

    @property
    def text(self) -> str:
        """Two characters: the step's last digit and the operation while running, else the state letter."""
        if self.state == "R":
            return f"{self.step % 10}{self.op or ' '}"
        return f"{self.state} "

    @property
    def style_key(self) -> str:
        """Which colour: the state, finished ones split by reward (F1 success, F0 failure, F? unknown)."""
        if self.state == "F":
            return "F?" if self.reward is None else ("F1" if self.reward >= 1.0 else "F0")
        return self.state


@dataclass
class MonitorModel:
    """Cells in plan order, the latest aggregates, and what the view filters by."""

    cells: dict[str, Cell] = field(default_factory=dict)
    agg: Aggregate = field(default_factory=Aggregate)
    run: str = ""
    seq: int = -1
    last_t: float = 0.0
    messages: int = 0
    gaps: int = 0  # messages lost on the way (seq jumps): the next snapshot heals them
    ended: bool = False
    version: int = 0
    agg_version: int = 0
    state_filter: str | None = None  # one state letter, or None for all
    search: str = ""  # a task id (or episode id) substring

    def reset(self, run: str = "") -> None:
        """Forget everything (another run)."""
        self.cells.clear()
        self.agg = Aggregate()
        self.run, self.seq, self.ended = run, -1, False
        self.version += 1

    def apply(self, msg: TelemetryMessage) -> bool:
        """Apply one message; True when the view should redraw."""
        run = msg.run
        if run != self.run and self.messages:
            self.reset(run)
        self.run = run
        self.messages += 1
        seq = msg.seq
        if self.seq >= 0 and seq > self.seq + 1:
            self.gaps += seq - self.seq - 1
        self.seq = max(self.seq, seq)
        self.last_t = msg.t
        if msg.kind == "end":
            self.ended = True
            self.version += 1
            return True
        cells = self.cells
        for eid, task_id in msg.tasks.items():
            cell = cells.get(eid)
            if cell is None:
                cells[eid] = Cell(eid, task_id)
            else:
                cell.task_id = task_id
        for eid, (state, op, step, reward) in msg.cells.items():
            cell = cells.get(eid)
            if cell is None:
                cell = cells[eid] = Cell(eid, eid.rsplit("#", 1)[0])
            cell.state, cell.op, cell.step, cell.reward = state, op, step, reward
            cell.version += 1
        for eid, d in msg.details.items():
            cell = cells.get(eid)
            if cell is not None:
                cell.details.update(d.fields())
                cell.version += 1
        if msg.agg is not None:
            self.agg = msg.agg
            self.agg_version += 1
        self.version += 1
        return True

    def visible(self) -> list[Cell]:
        """The cells that pass the state filter and the search, in plan order."""
        cells: Any = self.cells.values()
        if self.state_filter:
            cells = [c for c in cells if c.state == self.state_filter]
        if self.search:
            needle = self.search.lower()
            cells = [c for c in cells if needle in c.task_id.lower() or needle in c.episode_id.lower()]
        return list(cells)

    def counts(self) -> dict[str, int]:
        """Cells per state (from the cells themselves, so it is right between aggregates too)."""
        out = dict.fromkeys(STATES, 0)
        for c in self.cells.values():
            out[c.state] = out.get(c.state, 0) + 1
        return out

    def ops_in_flight(self) -> dict[str, int]:
        """Running cells per operation letter."""
        out = dict.fromkeys(OPS, 0)
        for c in self.cells.values():
            if c.state == "R" and c.op:
                out[c.op] = out.get(c.op, 0) + 1
        return out
