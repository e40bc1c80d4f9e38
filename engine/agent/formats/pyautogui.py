"""The ``pyautogui`` format: a thought, then Python code that calls ``pyautogui`` (OSWorld-style agents).

The code is read, never run: each statement must be one call with literal arguments (``pyautogui.click(640,
360)``, ``pyautogui.write('shoes\\n')``, ``pyautogui.hotkey('ctrl', 'l')``, ``pyautogui.scroll(-5)``), or one of the
words ``WAIT``, ``DONE``, ``FAIL``. Browser steps that ``pyautogui`` lacks are two more calls: ``navigate(url)``
and ``go_back()``; ``answer(text)`` ends the episode with an answer. Points are in the run's ``--coords`` frame;
two floats within 0..1 are read as fractions of the screen (as some agents answer), with a warning.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any, ClassVar

from engine.agent.actions import AgentAction
from engine.agent.coords import CoordFrame, map_point, navigable_url
from engine.agent.parser import ParsedReply, skip_reason

from .base import Call, CallFormat, fenced_code, keys, number, read_call, text_arg, typed

SYSTEM = """\
You are an agent that operates a web browser by writing Python code with `pyautogui`. You get a task and \
screenshots of the browser. Answer with one short paragraph of reasoning, then one code block:
```python
pyautogui.click(x, y)
```
The calls you may use, one per line, with literal arguments:
- pyautogui.click(x, y) and pyautogui.doubleClick(x, y)
- pyautogui.moveTo(x, y) to hover
- pyautogui.write('text') to type into the focused field; end the text with \\n to submit it
- pyautogui.press('enter') and pyautogui.hotkey('ctrl', 'l')
- pyautogui.scroll(-5) to scroll down (a positive number scrolls up)
- navigate('https://...') and go_back()
- answer('...') when the task is done, with your answer
Write WAIT to wait for the page to change, DONE when the task is done and needs no answer, FAIL when it cannot be \
done. $screen"""

_CODE = re.compile(r"```[ \t]*(?:python|py)?[ \t]*\n", re.IGNORECASE)
_WORDS = frozenset({"WAIT", "DONE", "FAIL"})  # words some agents write instead of a call


class PyAutoGUIFormat(CallFormat):
    """Agents that answer with ``pyautogui`` code (OSWorld's baselines, and models trained on their traces)."""

    name: ClassVar[str] = "pyautogui"
    families: ClassVar[str] = "agents that write pyautogui code (OSWorld-style prompts of general VLMs, Aguvis, " \
                              "OpenCUA, Jedi)"
    system_template: ClassVar[str] = SYSTEM
    no_call: ClassVar[str] = "no pyautogui code in reply"

    def calls(self, text: str, reply: ParsedReply, skipped: list[str]) -> Iterator[tuple[int, Call]]:
        code, fenced = fenced_code(text, _CODE, reply)
        lines = (s for s in code.splitlines() if s.strip() and not s.lstrip().startswith("#"))
        for index, line in enumerate(lines):
            word = line.strip()
            if word in _WORDS:
                yield index, Call(word, source=word)
                continue
            try:
                call = read_call(line)
            except Exception as e:  # noqa: BLE001 - a line that is no call is skipped, with why
                if fenced or line.lstrip().startswith(("pyautogui.", "navigate", "go_back", "answer")):
                    skipped.append(f"call {index}: {skip_reason(e)}")
                elif reply.thought is None:  # prose before unfenced code is the thought
                    reply.thought = line.strip()
                continue
            yield index, call

    def to_action(self, call: Call, frame: CoordFrame, tree: frozenset[int] | None = None
                  ) -> tuple[AgentAction, list[str], dict[str, Any] | None]:
        name = call.name.removeprefix("pyautogui.")
        if name in ("click", "doubleClick", "leftClick", "moveTo"):
            (x, y), frames, warnings = _point(call, frame)
            if name == "doubleClick":
                warnings.append("a double click is done as one click")
            return AgentAction("hover" if name == "moveTo" else "left_click", x=x, y=y), warnings, frames
        if name in ("write", "typewrite"):
            value = call.arg(0, "message")
            if isinstance(value, list):  # typewrite(['a', 'b', 'enter']) presses keys one by one: as text
                value = "".join("\n" if k == "enter" else k for k in value if isinstance(k, str))
            return typed(text_arg(value, f"{name}'s text")), [], None
        if name in ("press", "hotkey"):
            names = call.args if name == "hotkey" else call.arg(0, "keys")
            return keys(names if isinstance(names, list) else [names], name), [], None
        if name == "scroll":
            clicks = number(call.arg(0, "clicks"), "scroll's clicks")
            if clicks == 0:
                raise ValueError("scroll(0) scrolls nowhere")
            return AgentAction("scroll", direction="down" if clicks < 0 else "up"), [], None
        if name == "navigate":
            return AgentAction("navigate", url=navigable_url(text_arg(call.arg(0, "url"), "navigate's url"))), [], None
        if name == "go_back":
            return AgentAction("go_back"), [], None
        if name in ("answer", "DONE", "FAIL"):
            value = call.arg(0, "text", "answer")
            text = text_arg(value, "answer's text") if value is not None else ""
            return AgentAction("answer", text=text), ["FAIL: the agent gave up"] if name == "FAIL" else [], None
        if name in ("WAIT", "sleep"):
            return AgentAction("wait"), [], None
        raise ValueError(f"{call.name}() is not an action of this browser")


def _point(call: Call, frame: CoordFrame) -> tuple[tuple[int, int], dict[str, Any], list[str]]:
    x, y = call.arg(0, "x"), call.arg(1, "y")
    if isinstance(x, tuple | list) and y is None and len(x) == 2:  # click((x, y))
        x, y = x
    x, y = number(x, f"{call.name}'s x"), number(y, f"{call.name}'s y")
    warnings: list[str] = []
    if 0 <= x <= 1 and 0 <= y <= 1 and isinstance(call.arg(0, "x"), float):
        mw, mh = frame.model_size
        x, y = x * mw, y * mh
        warnings.append("coordinates within 0..1 read as fractions of the screen")
    (cx, cy), frames, more = map_point([x, y], frame)
    return (cx, cy), frames, warnings + more

