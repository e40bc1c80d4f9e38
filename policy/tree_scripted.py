"""``tree-scripted``: a scripted stand-in for a text-only language model that reads the accessibility tree. It is
not a model.

It answers every chat in BrowserGym's id-based format (:mod:`engine.agent.formats.browsergym`) from the text of the
chat alone: the task named in the first user message, and the tree the last one shows. Each task's reference
solution names its targets as the tree does (``"tree": [role, name, nth]`` on each step, written by
``scripts/tree_targets.py``); the stand-in finds that line in the tree text and answers with its id. So a run with it
shows that the tree holds what a text agent needs and that the id-based actions reach the page, with no image in the
prompt. A target not (yet) in the tree is waited for twice, then the episode answers that it is missing. Text for a
drop-down list is chosen with ``select_option``; a filled field is submitted with Enter only where that does something
(see ``_reply``), as an agent would, so that a solution keeps to its task's step cap.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from engine.agent.model_api import ChatRequest, Generation, LanguageModel
from engine.tasks.schema import Task

MAX_WAITS = 2
_LINE = re.compile(r"^\t*\[(\d+)\] (\S+) '((?:[^'\\]|\\.)*)'", re.MULTILINE)
_TASK = re.compile(r"^Task: (.*)$", re.MULTILINE)


@dataclass
class _Cursor:
    index: int = 0
    enter_on: str | None = None  # the field whose text was filled, to be submitted next
    waits: int = 0


class TreeScriptedModel(LanguageModel):
    """Reference solutions replayed through the tree text (a stand-in, named as such)."""

    name = "tree-scripted"
    model_name = "tree-scripted-stand-in"

    def __init__(self, tasks: list[Task]) -> None:
        self._solutions = {t.task_name: t.reference_solution for t in tasks}
        self._cursors: dict[str, _Cursor] = {}

    async def generate(self, request: ChatRequest) -> Generation:
        episode = request.request_id.rpartition("/")[0]
        cursor = self._cursors.setdefault(episode, _Cursor())
        return Generation(self._reply(request.messages, cursor), finish_reason="stop")

    def _reply(self, messages: list[dict[str, Any]], cursor: _Cursor) -> str:
        user = [m for m in messages if m.get("role") == "user"]
        if not user:
            return "No task was given.\n```\nreport_infeasible('no task')\n```"
        match = _TASK.search(_text(user[0]))
        steps = self._solutions.get(match.group(1).strip()) if match else None
        if steps is None:
            return "This task is not one I have a solution for.\n```\nreport_infeasible('unknown task')\n```"
        tree = _text(user[-1])
        if cursor.enter_on is not None:
            field, cursor.enter_on = cursor.enter_on, None
            return f"Submit what I typed.\n```\npress({field!r}, 'Enter')\n```"
        if cursor.index >= len(steps):
            return "The solution is done.\n```\nsend_msg_to_user('done')\n```"
        step = steps[cursor.index]
        kind = step["action"]
        if kind == "answer":
            cursor.index = len(steps)
            return f"I have the answer.\n```\nsend_msg_to_user({str(step.get('text', ''))!r})\n```"
        if kind == "go_back":
            cursor.index += 1
            return "Back to the previous page.\n```\ngo_back()\n```"
        role, name, nth = step["tree"]
        bid = _find(tree, role, name, nth)
        if bid is None:
            if cursor.waits < MAX_WAITS:
                cursor.waits += 1
                return f"No {role} {name!r} yet: wait.\n```\nnoop(1000)\n```"
            cursor.index = len(steps)
            return f"The {role} {name!r} is not on the page.\n```\nsend_msg_to_user('cannot find {role}')\n```"
        cursor.index += 1
        cursor.waits = 0
        text = str(step.get("text", ""))
        options = _options(tree, bid) if kind == "type" and role == "combobox" else None
        if options is not None:  # a drop-down list: typing picks the first option that starts with the text
            want = text.strip().lower()
            option = next((o for o in options if o.lower() == want), None) or next(
                (o for o in options if o.lower().startswith(want)), text)
            return f"Choose {option!r} in the {name!r} list.\n```\nselect_option({bid!r}, {option!r})\n```"
        if kind == "type":
            cursor.enter_on = bid if step.get("enter", True) else None
            return f"Type into the {role} {name!r}.\n```\nfill({bid!r}, {text!r})\n```"
        return f"Click the {role} {name!r}.\n```\nclick({bid!r})\n```"


def _text(message: dict[str, Any]) -> str:
    content = message.get("content")
    if isinstance(content, str):
        return content
    return "\n".join(p.get("text", "") for p in content or [] if isinstance(p, dict) and p.get("type") == "text")


def _unquoted(name: str) -> str:
    return re.sub(r"\\(.)", r"\1", name)


def _options(tree: str, bid: str) -> list[str] | None:
    """A drop-down list's option labels, or None when the element is no <select> (its first child in the tree is its
    options' popup)."""
    lines = tree.split("\n")
    at = next((i for i, line in enumerate(lines) if line.lstrip("\t").startswith(f"[{bid}] combobox ")), None)
    if at is None or at + 1 >= len(lines) or " MenuListPopup " not in lines[at + 1]:
        return None
    depth = len(lines[at]) - len(lines[at].lstrip("\t"))
    options = []
    for line in lines[at + 2:]:
        if len(line) - len(line.lstrip("\t")) <= depth:
            break
        match = _LINE.match(line)
        if match and match.group(2) == "option":
            options.append(_unquoted(match.group(3)))
    return options


def _find(tree: str, role: str, name: str, nth: int) -> str | None:
    """The id of the ``nth`` (0-based) line of ``role`` and ``name`` in the tree text, or None."""
    seen = 0
    for match in _LINE.finditer(tree):
        if match.group(2) == role and _unquoted(match.group(3)) == name:
            if seen == nth:
                return match.group(1)
            seen += 1
    return None
