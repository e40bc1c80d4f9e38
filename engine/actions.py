"""The agent's action vocabulary (the original's ``computer_use`` actions) and its browser mapping.

Coordinates here are CSS pixels of the viewport; mapping from a model's grid happens in the agent
protocol before an AgentAction is built.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

from browserpool.protocol import BrowserAction

ACTION_NAMES = ("left_click", "type", "scroll", "wait", "go_back", "navigate", "answer", "keypress", "hover",
                "select")


@dataclass(slots=True)
class AgentAction:
    """One action chosen by a policy."""

    name: str
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

    def __post_init__(self) -> None:
        if self.name not in ACTION_NAMES:
            raise ValueError(f"unknown action {self.name!r}; expected one of {', '.join(ACTION_NAMES)}")

    @property
    def ends_episode(self) -> bool:
        return self.name == "answer"

    def to_browser(self) -> BrowserAction:
        """The browser operation that carries this action out (``answer`` has none)."""
        n = self.name
        if n == "left_click":
            return BrowserAction("click", x=self.x, y=self.y)
        if n == "hover":
            return BrowserAction("hover", x=self.x, y=self.y)
        if n == "select":
            return BrowserAction("select", x=self.x, y=self.y, text=self.text or "")
        if n == "type":
            return BrowserAction("type", x=self.x, y=self.y, text=self.text or "", clear=self.clear,
                                 enter=self.enter)
        if n == "scroll":
            return BrowserAction("scroll", x=self.x, y=self.y, direction=self.direction or "down")
        if n == "keypress":
            return BrowserAction("key", keys=self.keys or "")
        if n == "navigate":
            return BrowserAction("navigate", url=self.url or "")
        if n == "go_back":
            return BrowserAction("go_back")
        if n == "wait":
            return BrowserAction("wait", seconds=self.seconds)
        raise ValueError(f"action {n!r} has no browser operation")

    def describe(self) -> str:
        """One line for summaries and logs."""
        n = self.name
        at = f" at ({self.x:.0f}, {self.y:.0f})" if self.x is not None and self.y is not None else ""
        if self.element_id is not None:
            at = f" on element {self.element_id}"
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
            return f"press {self.keys}"
        return f"{n}{at}"

    def to_dict(self) -> dict[str, Any]:
        """Only the fields that differ from their defaults."""
        return {name: v for name, default in _DEFAULTS if (v := getattr(self, name)) != default}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> AgentAction:
        return cls(**d)


_DEFAULTS = tuple((f.name, None if f.name == "name" else f.default) for f in fields(AgentAction))
