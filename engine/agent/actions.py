"""The agent's action vocabulary (the original's ``computer_use`` actions) and its browser mapping.

Coordinates here are CSS pixels of the viewport; mapping from a model's grid happens in the agent
protocol before an AgentAction is built.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any, Literal, cast, get_args

from browserpool.protocol import BrowserAction
from engine.store.records import ActionRecord

ActionName = Literal["left_click", "type", "scroll", "wait", "go_back", "navigate", "answer", "keypress", "hover",
                     "select", "go_forward"]
ACTION_NAMES: tuple[ActionName, ...] = get_args(ActionName)


@dataclass(slots=True)
class AgentAction:
    """One action chosen by a policy."""

    name: ActionName  # checked on construction: a parser or a trainer may hand in any string
    x: float | None = None
    y: float | None = None
    text: str | None = None
    direction: str | None = None
    url: str | None = None
    keys: str | None = None
    clear: bool = True
    enter: bool = True
    seconds: float | None = None
    element_id: int | None = None  # Set-of-Marks: the element the model named (x, y is its centre)
    # The accessibility tree's element the model named (its id there; engine.agent.tree_text): the worker scrolls it
    # into view and acts at its centre, in place of x, y.
    node: int | None = None

    def __post_init__(self) -> None:
        # Checked here, where an action enters the engine (a parser, a trainer's dict): a NaN coordinate or a number
        # for a text would otherwise fail the episode in the worker, far from the caller's mistake.
        if self.name not in ACTION_NAMES:
            raise ValueError(f"unknown action {self.name!r}; expected one of {', '.join(ACTION_NAMES)}")
        for field_name in ("x", "y", "seconds"):
            value = getattr(self, field_name)
            if value is not None and not _finite_number(value):
                raise ValueError(f"action {self.name}: {field_name} must be a finite number, not {value!r}"[:200])
        if self.seconds is not None and self.seconds < 0:
            raise ValueError(f"action {self.name}: seconds must be >= 0, not {self.seconds!r}")
        for field_name in ("text", "direction", "url", "keys"):
            value = getattr(self, field_name)
            if value is not None and not isinstance(value, str):
                raise TypeError(f"action {self.name}: {field_name} must be a string, not {type(value).__name__}")
        for field_name in ("element_id", "node"):
            value = getattr(self, field_name)
            if value is not None and (type(value) is bool or not isinstance(value, int)):
                raise TypeError(f"action {self.name}: {field_name} must be an integer, not {type(value).__name__}")
        if self.node is not None and not 1 <= self.node <= 2**31:
            raise ValueError(f"action {self.name}: node must be an element's id (1 to 2**31), not {self.node}")
        if type(self.clear) is not bool or type(self.enter) is not bool:
            raise TypeError(f"action {self.name}: clear and enter must be booleans")

    @property
    def ends_episode(self) -> bool:
        return self.name == "answer"

    def to_browser(self) -> BrowserAction:
        """The browser operation that carries this action out (``answer`` has none)."""
        n = self.name
        at = {"node": self.node} if self.node is not None else {"x": self.x, "y": self.y}
        if n == "left_click":
            return BrowserAction("click", **at)
        if n == "hover":
            return BrowserAction("hover", **at)
        if n == "select":
            return BrowserAction("select", **at, text=self.text or "")
        if n == "type":
            return BrowserAction("type", **at, text=self.text or "", clear=self.clear, enter=self.enter)
        if n == "scroll":
            return BrowserAction("scroll", x=self.x, y=self.y, direction=self.direction or "down")
        if n == "keypress":
            return BrowserAction("key", keys=self.keys or "", node=self.node)
        if n == "navigate":
            return BrowserAction("navigate", url=self.url or "")
        if n in ("go_back", "go_forward"):
            return BrowserAction(n)
        if n == "wait":
            return BrowserAction("wait", seconds=self.seconds)
        raise ValueError(f"action {n!r} has no browser operation")

    def describe(self) -> str:
        """One line for summaries and logs."""
        n = self.name
        at = f" at ({self.x:.0f}, {self.y:.0f})" if self.x is not None and self.y is not None else ""
        if self.element_id is not None:
            at = f" on element {self.element_id}"
        if self.node is not None:
            at = f" on [{self.node}]"
        if n == "type":
            return f"type {self.text!r}{at}" + (" + Enter" if self.enter else "")
        if n == "scroll":
            return f"scroll {self.direction}"
        if n == "navigate":
            return f"navigate to {self.url}"
        if n == "answer":
            return f"answer {self.text!r}"
        if n == "select":
            return f"select {self.text!r}{at}"
        if n == "keypress":
            return f"press {self.keys}{at}"
        return f"{n}{at}"

    def to_dict(self) -> ActionRecord:
        """Only the fields that differ from their defaults."""
        # The dataclass's fields are ActionRecord's keys, and ``name`` (whose default here is None) is always there.
        return cast("ActionRecord", {name: v for name, default in _DEFAULTS if (v := getattr(self, name)) != default})

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> AgentAction:
        return cls(**d)


def _finite_number(value: Any) -> bool:
    """An int or float (not a bool) that is finite as a float."""
    if type(value) is bool or not isinstance(value, int | float):
        return False
    try:
        return math.isfinite(value)
    except OverflowError:  # an int past the float range
        return False


_DEFAULTS = tuple((f.name, None if f.name == "name" else f.default) for f in fields(AgentAction))
