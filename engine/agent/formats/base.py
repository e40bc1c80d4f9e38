"""What every action format shares: its interface, and a safe reader of Python-style calls.

An action format is the grammar a model family answers in (Qwen's ``computer_use`` tool call, UI-TARS's
``Action: click(start_box=...)``, ``pyautogui`` code...). It writes the system prompt that teaches the grammar,
and reads a reply back as one :class:`AgentAction` in viewport CSS pixels, with the same ``info`` as
:func:`engine.agent.coords.parse_action`: ``reply`` (a :class:`ParsedReply`: thought, action sentence, raw text),
``call`` (the call it used, as ``{"name", "arguments"}``), ``warnings``, ``frames``, ``skipped`` (``"call N: why"``
for each call passed over) and ``error`` (None on success, else why the reply became ``wait``). Reading never
raises and takes time linear in the reply's length (replies are cut at ``MAX_REPLY_CHARS``, as the tool-call
parser cuts them).

Calls written as Python (UI-TARS's actions, ``pyautogui`` code) are read with :mod:`ast`, which parses and never
runs anything: only calls whose arguments are literals are accepted.
"""

from __future__ import annotations

import ast
import math
import re
from abc import ABC, abstractmethod
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, ClassVar

from engine.agent.actions import AgentAction
from engine.agent.coords import CoordFrame, Elements, map_point
from engine.agent.parser import MAX_REPLY_CHARS, ParsedReply, skip_reason
from engine.agent.prompts import AgentConfig, PromptTemplates, fill

MAX_CALLS = 16  # calls read per reply, as for tool calls


@dataclass
class Call:
    """One call of a reply: its name, positional and keyword arguments (literals), and its source text."""

    name: str
    args: list[Any] = field(default_factory=list)
    kwargs: dict[str, Any] = field(default_factory=dict)
    source: str = ""

    def arg(self, position: int, *names: str) -> Any:
        """The argument given by keyword (any of ``names``) or else at ``position``; None when absent."""
        for name in names:
            if name in self.kwargs:
                return self.kwargs[name]
        return self.args[position] if position < len(self.args) else None

    def record(self) -> dict[str, Any]:
        """The call as the step records it (``parsed.tool_call``)."""
        return {"name": self.name, "arguments": {**{str(i): a for i, a in enumerate(self.args)}, **self.kwargs}}


class ActionFormat(ABC):
    """A grammar of replies: the system prompt that teaches it and the reader of its replies."""

    name: ClassVar[str]
    families: ClassVar[str]  # the model families that answer in it (the docs and --help say so)

    @abstractmethod
    def system_prompt(self, cfg: AgentConfig, templates: PromptTemplates, width: int, height: int) -> str:
        """The system message for a model image of ``width`` x ``height`` (the coordinates' extent)."""

    @abstractmethod
    def read(self, text: str, frame: CoordFrame, elements: Elements | None = None,
             tree: frozenset[int] | None = None) -> tuple[AgentAction, dict[str, Any]]:
        """A reply as an action (``wait`` when nothing usable was found) and what was read; never raises.
        ``elements``: the Set-of-Marks elements' centres; ``tree``: the ids of the accessibility tree's elements."""


# What the system prompt says of the coordinates, per ``--coords``.
_SCREEN = {"grid": "Coordinates run from 0 to 1000 on both axes of the screenshot, whatever its size.",
           "pixels": "Coordinates are pixels of the screenshot, which is ${screen_width}x${screen_height}."}


class CallFormat(ActionFormat):
    """A format whose replies hold calls (a thought, then one or more calls): the first call that maps to an
    action is the step's action; the others are listed in ``skipped`` with why. Its system prompt is
    ``system_template`` with ``$screen`` filled in."""

    system_template: ClassVar[str]
    no_call: ClassVar[str] = "no action in reply"

    def system_prompt(self, cfg: AgentConfig, templates: PromptTemplates, width: int, height: int) -> str:
        return fill(self.system_template, screen=fill(_SCREEN[cfg.coords], screen_width=width, screen_height=height))

    def read(self, text: str, frame: CoordFrame, elements: Elements | None = None,
             tree: frozenset[int] | None = None) -> tuple[AgentAction, dict[str, Any]]:
        info: dict[str, Any] = {"reply": None, "call": None, "warnings": [], "frames": None, "error": None,
                                "skipped": []}
        if not isinstance(text, str):
            info["error"] = f"reply is {type(text).__name__}, not str"
            return AgentAction("wait"), info
        reply = ParsedReply(raw=text[:MAX_REPLY_CHARS], truncated=len(text) > MAX_REPLY_CHARS)
        info["reply"] = reply
        try:
            calls = self.calls(reply.raw, reply, info["skipped"])  # read lazily: skipped reasons stay in order
            for read, (number, call) in enumerate(calls):
                if read == MAX_CALLS:
                    info["skipped"].append(f"calls past the first {MAX_CALLS} not read")
                    break
                try:
                    act, warnings, frames = self.to_action(call, frame, tree)
                except Exception as e:  # noqa: BLE001 - any failure skips this call, and the next one may do
                    info["skipped"].append(f"call {number}: {skip_reason(e)}")
                    continue
                reply.action_text = reply.action_text or call.source
                info.update(call=call.record(), warnings=warnings, frames=frames)
                return act, info
            info["error"] = "; ".join(info["skipped"]) or ("empty reply" if not text.strip() else self.no_call)
        except Exception as e:  # noqa: BLE001 - never raise on model output
            info["error"] = f"parse failure: {e!r}"
        reply.error = info["error"]
        return AgentAction("wait"), info

    @abstractmethod
    def calls(self, text: str, reply: ParsedReply, skipped: list[str]) -> Iterator[tuple[int, Call]]:
        """The reply's calls, numbered by their place; fills ``reply``'s thought and action sentence, and adds a
        ``"call N: why"`` to ``skipped`` for each one that cannot be read."""

    @abstractmethod
    def to_action(self, call: Call, frame: CoordFrame, tree: frozenset[int] | None = None
                  ) -> tuple[AgentAction, list[str], dict[str, Any] | None]:
        """One call as ``(action, warnings, coordinate frames)``; raises ValueError when it is no action. ``tree``: the
        ids of the accessibility tree's elements (formats that name elements by id)."""


def fenced_code(text: str, opening: re.Pattern[str], reply: ParsedReply) -> tuple[str, bool]:
    """The code of a reply's first fenced block (``opening``: the fence's pattern), and True; or the whole reply and
    False when it has none. What comes before the fence is the reply's thought."""
    fence = opening.search(text)
    if fence is None:
        return text, False
    reply.thought = text[:fence.start()].strip() or None
    end = text.find("```", fence.end())
    return (text[fence.end():] if end < 0 else text[fence.end():end]), True


def read_call(source: str) -> Call:
    """A Python call expression with literal arguments (``click(start_box='(1,2)')``, ``pyautogui.click(3, 4)``),
    read without running it; ValueError for anything else."""
    try:
        tree = ast.parse(source.strip(), mode="eval")
    except SyntaxError as exc:
        raise ValueError(f"not a call: {exc.msg}") from None
    node = tree.body
    if not isinstance(node, ast.Call):
        raise ValueError(f"not a call: {type(node).__name__}")
    name = _dotted(node.func)
    try:
        args = [ast.literal_eval(a) for a in node.args]
        kwargs = {k.arg: ast.literal_eval(k.value) for k in node.keywords if k.arg is not None}
    except (ValueError, TypeError, SyntaxError, RecursionError, MemoryError) as exc:
        raise ValueError(f"{name}: arguments must be literals ({type(exc).__name__})") from None
    if len(kwargs) != len(node.keywords):
        raise ValueError(f"{name}: **arguments are not read")
    return Call(name, args, kwargs, source.strip()[:500])


def _dotted(node: ast.expr) -> str:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return f"{_dotted(node.value)}.{node.attr}"
    raise ValueError("not a call of a named function")


def point(value: Any, frame: CoordFrame, what: str) -> tuple[tuple[int, int], dict[str, Any], list[str]]:
    """A point or box given as numbers or as text that holds them (``'(x,y)'``, ``'[x1,y1,x2,y2]'``,
    ``'<|box_start|>(x,y)<|box_end|>'``, ``'<point>x y</point>'``) in the frame's coordinates; a box is read as
    its centre. ValueError when there are not 2 or 4 finite numbers."""
    if value is None:
        raise ValueError(f"{what} is missing")
    return map_point(value, frame)


def number(value: Any, what: str) -> float:
    """A finite number (ints and floats, not booleans); ValueError otherwise."""
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(float(value)):
        raise ValueError(f"{what} must be a finite number, got {value!r}")
    return float(value)


def text_arg(value: Any, what: str) -> str:
    if not isinstance(value, str):
        raise ValueError(f"{what} must be a string, got {value!r}")
    return value


def typed(text: str) -> AgentAction:
    """Typing into the focused field, as these formats do (no click first); a final newline submits."""
    enter = text.endswith("\n")
    return AgentAction("type", text=text[:-1] if enter else text, clear=False, enter=enter)


def keys(names: list[Any], what: str) -> AgentAction:
    """A key combination from its key names (``["ctrl", "c"]``), as the engine's ``keypress`` spells them."""
    if not names or not all(isinstance(n, str) and n.strip() for n in names):
        raise ValueError(f"{what} needs key names, got {names!r}")
    return AgentAction("keypress", keys="+".join(n.strip() for n in names))
