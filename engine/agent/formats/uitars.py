"""UI-TARS's format: ``Thought: ...`` then ``Action: click(start_box='(x,y)')``.

The actions are Python-style calls with quoted arguments, one per line after ``Action:``. Points come as
``start_box`` (and ``end_box``): ``'(x,y)'``, ``'<|box_start|>(x,y)<|box_end|>'``, a box ``'(x1,y1,x2,y2)'`` read
as its centre, or ``'<point>x y</point>'``. Their frame is the run's ``--coords``: ``pixels`` (absolute pixels of
the resized screenshot, as UI-TARS-1.5 answers) or ``grid`` (0..1000, as earlier UI-TARS models do). ``type``
types into the focused field and a final ``\\n`` submits; ``finished(content=...)`` ends the episode with its
answer.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, ClassVar

from engine.agent.actions import AgentAction
from engine.agent.coords import CoordFrame, navigable_url
from engine.agent.parser import ParsedReply, skip_reason

from .base import Call, CallFormat, keys, point, read_call, text_arg, typed

SYSTEM = """\
You are a GUI agent operating a web browser. You get a task and screenshots of the browser; answer with \
your reasoning and the next action.

## Output format
```
Thought: ...
Action: ...
```

## Action space
click(start_box='(x,y)')
left_double(start_box='(x,y)')
hover(start_box='(x,y)')
type(content='')  # types into the focused field; end content with \\n to submit it
hotkey(key='ctrl c')  # keys separated by spaces
scroll(start_box='(x,y)', direction='down')  # direction: down or up
navigate(url='')
go_back()
wait()  # wait for the page to change
finished(content='')  # the task is done: content is the answer

## Notes
- $screen
- Write a short plan in Thought, then one action.
- Escape quotes inside strings with a backslash and write newlines as \\n."""

_DIRECTIONS = ("up", "down")


class UITarsFormat(CallFormat):
    """UI-TARS (1.0, 1.5) and models trained on its action grammar."""

    name: ClassVar[str] = "uitars"
    families: ClassVar[str] = "UI-TARS 1.0 / 1.5 (ByteDance) and models fine-tuned on its grammar"
    system_template: ClassVar[str] = SYSTEM
    no_call: ClassVar[str] = "no Action: in reply"

    def calls(self, text: str, reply: ParsedReply, skipped: list[str]) -> Iterator[tuple[int, Call]]:
        head, marker, actions = text.partition("Action:")
        thought = head.split("Thought:", 1)[1] if "Thought:" in head else head
        reply.thought = thought.strip() or None
        if not marker:
            return
        number = 0
        for line in actions.splitlines():
            if not line.strip():
                continue
            try:
                yield number, read_call(line)
            except Exception as e:  # noqa: BLE001 - a line that is no call is skipped, with why
                skipped.append(f"call {number}: {skip_reason(e)}")
            number += 1

    def to_action(self, call: Call, frame: CoordFrame, tree: frozenset[int] | None = None
                  ) -> tuple[AgentAction, list[str], dict[str, Any] | None]:
        name = call.name
        if name in ("click", "left_single", "left_double", "hover"):
            (x, y), frames, warnings = point(call.arg(0, "start_box", "point"), frame, f"{name}'s start_box")
            if name == "left_double":
                warnings.append("a double click is done as one click")
            return AgentAction("hover" if name == "hover" else "left_click", x=x, y=y), warnings, frames
        if name == "scroll":
            direction = call.arg(1, "direction")
            if direction not in _DIRECTIONS:
                raise ValueError(f"scroll direction must be up or down, got {direction!r}")
            box = call.arg(0, "start_box", "point")
            if box is None:
                return AgentAction("scroll", direction=direction), [], None
            (x, y), frames, warnings = point(box, frame, "scroll's start_box")
            return AgentAction("scroll", x=x, y=y, direction=direction), warnings, frames
        if name == "type":
            return typed(text_arg(call.arg(0, "content"), "type's content")), [], None
        if name in ("hotkey", "press"):
            return keys(text_arg(call.arg(0, "key"), f"{name}'s key").split(), name), [], None
        if name == "navigate":
            return AgentAction("navigate", url=navigable_url(text_arg(call.arg(0, "url"), "navigate's url"))), [], None
        if name == "go_back":
            return AgentAction("go_back"), [], None
        if name == "wait":
            return AgentAction("wait"), [], None
        if name in ("finished", "call_user"):
            content = call.arg(0, "content")
            answer = text_arg(content, "finished's content") if content is not None else ""
            warnings = ["call_user ends the episode: nobody is there to answer"] if name == "call_user" else []
            return AgentAction("answer", text=answer), warnings, None
        raise ValueError(f"{name}() is not an action of this browser (right clicks, drags and the desktop's "
                         "actions are not)")
