"""An episode's state as a monitor sees it: the original's states (N not started, W waiting for a browser, R running,
F finished, X failed), the operation while running (n navigate, s screenshot, a model call, e execute, r reward) and
the moves the state machine allows."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum


class State(StrEnum):
    NOT_STARTED = "N"
    WAITING = "W"
    RUNNING = "R"
    FINISHED = "F"
    FAILED = "X"


class Op(StrEnum):
    NONE = ""
    NAVIGATE = "n"
    SCREENSHOT = "s"
    MODEL = "a"
    EXECUTE = "e"
    REWARD = "r"


#: The state machine: the states each state may move to.
ALLOWED_MOVES = {
    State.NOT_STARTED: {State.WAITING, State.FAILED},
    State.WAITING: {State.RUNNING, State.FAILED, State.WAITING},
    State.RUNNING: {State.RUNNING, State.FINISHED, State.FAILED, State.WAITING},
    State.FINISHED: set(),
    State.FAILED: set(),
}


@dataclass
class EpisodeStatus:
    """What a monitor shows of one rollout."""

    episode_id: str
    task_id: str
    state: State = State.NOT_STARTED
    op: Op = Op.NONE
    step: int = 0
    reward: float | None = None
    # What the monitor's detail view shows; updated as the episode goes.
    task: str = ""  # the instruction
    url: str = ""
    title: str = ""
    action: str = ""  # the last action, in one line
    thought: str = ""  # the last thought the policy gave, if any
    screenshot: str = ""  # the latest stored screenshot (path in the run directory)
    step_timings_ms: dict[str, float] = field(default_factory=dict)  # of the last completed step
    error: str = ""  # the error kind that ended the episode

    @property
    def ended(self) -> bool:
        """Whether the episode has ended (finished or failed)."""
        return self.state is State.FINISHED or self.state is State.FAILED

    @property
    def cell(self) -> str:
        """The original monitor's cell text: state, or step digit plus operation letter."""
        if self.state is State.RUNNING:
            return f"{self.step % 10}{self.op.value}"
        return self.state.value
