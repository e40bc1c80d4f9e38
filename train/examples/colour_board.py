"""The colour board: a generated task family with random layouts, for learning demonstrations and tests.

The bundled site's page ``{SITES}/board/`` (``engine/sites/www/board/index.html``) draws a 4 x 2 grid of cells in
the top three quarters of the viewport, some of them coloured squares, from its URL (``?cells=r..g.b..&goal=r``).
The task is always :data:`INSTRUCTION`: a click on the red cell picks it and turns the bar below the grid into a
Submit button, and Submit ends the episode with reward 1 (the page's own reward, read by a probe, as MiniWoB++'s
pages give theirs). A click on any other cell changes nothing, so the agent may try again until its step cap; an
``answer`` ends the episode unrewarded by the page (reward 0). What varies is the layout: where the red square is
and which other colours (one to three of green, blue and yellow) stand where. A policy that solves it has to find
the red square in the screenshot, then finish the job.

A layout is drawn from a seed (:meth:`Boards.layout`); :meth:`Boards.split` gives disjoint sets of layouts for
demonstrations, training and a held-out evaluation, so that no evaluated layout was ever seen in training.
:meth:`Boards.task_record` writes a task in the WebGym schema with the engine's extras (the probe, the page's
reward, and a reference solution for the scripted policy: :meth:`Boards.solution`).
"""

from __future__ import annotations

import json
import random
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from engine.tasks.schema import SITES_PLACEHOLDER

COLOURS = {"r": "red", "g": "green", "b": "blue", "y": "yellow"}
GOAL = "r"
COLUMNS, ROWS = 4, 2
CELLS = COLUMNS * ROWS  # in reading order
VIEWPORT = (1280, 720)  # the workers' default viewport, which the grid fills
INSTRUCTION = f"Click the {COLOURS[GOAL]} square, then Submit."
BOARD_HEIGHT = 0.75  # of the viewport; the Submit button is the bar below it
BENCHMARK = "colour-board"

# Evaluated after every observation; never throws (an exception comes back as {error}), as MiniWoB++'s probe.
PROBE_JS = """(() => {
  const s = window.BOARD_STATE;
  if (!s) return {error: 'no colour board on this page'};
  return {done: !!s.done, reward: Number(s.reward), raw_reward: Number(s.raw_reward), reason: s.reason};
})()"""


@dataclass(frozen=True, slots=True)
class Layout:
    """One board: ``cells`` is a string of :data:`CELLS` characters (a colour key of :data:`COLOURS`, or ``.``)."""

    cells: str

    @property
    def goal_cell(self) -> int:
        """The index of the red cell (0..7, reading order)."""
        return self.cells.index(GOAL)

    @property
    def key(self) -> str:
        return self.cells


def cell_at(x: float, y: float, viewport: tuple[int, int] = VIEWPORT) -> int | None:
    """The cell under the CSS point ``(x, y)``; None outside the page."""
    width, height = viewport
    board = height * BOARD_HEIGHT
    if not (0 <= x < width and 0 <= y < board):
        return None
    return int(y * ROWS // board) * COLUMNS + int(x * COLUMNS // width)


def on_submit(x: float, y: float, viewport: tuple[int, int] = VIEWPORT) -> bool:
    """Whether the CSS point ``(x, y)`` is on the Submit button: the whole bar below the board."""
    width, height = viewport
    return 0 <= x < width and height * BOARD_HEIGHT <= y < height


def task_id(seed: int) -> str:
    return f"{BENCHMARK}-{seed}"


@dataclass(frozen=True)
class Boards:
    """The family's layouts. ``red_cell`` fixes the cell the red square stands in (None: any cell): a version whose
    pick a model learns at once, for tests of what comes after it."""

    red_cell: int | None = None

    def layout(self, seed: int) -> Layout:
        """The layout of ``seed``: the red square and one to three of the other colours, each in its own cell."""
        rng = random.Random(seed)
        others = rng.sample([c for c in COLOURS if c != GOAL], rng.randint(1, len(COLOURS) - 1))
        cells = ["."] * CELLS
        if self.red_cell is None:
            places = rng.sample(range(CELLS), 1 + len(others))
        else:
            places = [self.red_cell, *rng.sample([c for c in range(CELLS) if c != self.red_cell], len(others))]
        for colour, cell in zip([GOAL, *others], places, strict=True):
            cells[cell] = colour
        return Layout("".join(cells))

    def split(self, sizes: Sequence[int], seed: int = 0) -> list[list[int]]:
        """Disjoint lists of seeds, one per size in ``sizes``, whose layouts are all different from each other: the
        layouts of one list never appear in another (nor twice in one)."""
        seen: set[str] = set()
        out: list[list[int]] = []
        candidate = seed * 1_000_003
        for size in sizes:
            part: list[int] = []
            while len(part) < size:
                key = self.layout(candidate).key
                if key not in seen:
                    seen.add(key)
                    part.append(candidate)
                candidate += 1
            out.append(part)
        return out

    def solution(self, seed: int) -> list[dict[str, Any]]:
        """The scripted policy's steps that solve layout ``seed``: pick the red cell, then Submit."""
        return [{"action": "click", "target": f"#cell-{self.layout(seed).goal_cell}"},
                {"action": "click", "target": "#submit"}]

    def task_record(self, seed: int, *, max_steps: int, base_url: str = SITES_PLACEHOLDER) -> dict[str, Any]:
        """The task of layout ``seed`` in the WebGym schema (``{SITES}`` by default, for a task file)."""
        board = self.layout(seed)
        return {
            "task_id": task_id(seed),
            "task_name": INSTRUCTION,
            "website": f"{base_url}/board/?cells={board.cells}&goal={GOAL}",
            "benchmark_name": BENCHMARK,
            "domain": BENCHMARK,
            "subdomain": "find-the-colour",
            "max_steps": max_steps,
            "probe_js": PROBE_JS,
            "reward_source": "page",
            "reference_solution": self.solution(seed),
        }

    def write_tasks(self, path: str | Path, seeds: Iterable[int], *, max_steps: int) -> Path:
        """A JSONL task file of the layouts ``seeds``."""
        path = Path(path)
        path.write_text("".join(json.dumps(self.task_record(s, max_steps=max_steps)) + "\n" for s in seeds),
                        encoding="utf-8")
        return path
