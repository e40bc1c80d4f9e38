"""BrowserGym's format: a thought, then one call of its id-based action set (``click('412')``,
``fill('37', 'mug')``...), the grammar of text and hybrid agents that read the accessibility tree.

The ids are those in brackets in the tree the step showed (:mod:`engine.agent.tree_text`); one the tree lacks is
skipped with why. Calls are read with :mod:`ast`, never run. Supported: ``click``, ``dblclick`` (done as one
click), ``hover``, ``fill``, ``clear``, ``focus`` (done as a click), ``select_option``, ``press``, ``scroll``,
``goto``, ``go_back``, ``go_forward``, ``send_msg_to_user`` (the answer), ``report_infeasible`` (an answer that says
so) and ``noop``. BrowserGym's tab actions have no place here (an episode has one tab).
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any, ClassVar

from engine.agent.actions import AgentAction
from engine.agent.coords import CoordFrame, navigable_url
from engine.agent.parser import ParsedReply, skip_reason
from engine.agent.prompts import AgentConfig, PromptTemplates

from .base import Call, CallFormat, fenced_code, number, read_call, text_arg

SYSTEM = """\
You are an agent that operates a web browser. You get a task and, at every step, the page's accessibility tree: \
one element per line, indented by depth, each with its id in brackets, its role and its name. Answer with one \
short paragraph of reasoning, then exactly one action in a code block:
```
click('12')
```
The actions, with their arguments as Python literals:
- click(bid), dblclick(bid), hover(bid), focus(bid)
- fill(bid, value): clear the field and type value; clear(bid)
- select_option(bid, option): choose the option labelled option in a drop-down list
- press(bid, key_comb): press keys in the element, e.g. press('12', 'Enter') or press('12', 'Control+a')
- scroll(delta_x, delta_y): scroll the page, e.g. scroll(0, 500) down and scroll(0, -500) up
- goto(url), go_back(), go_forward()
- send_msg_to_user(text): give the final answer when the task is done
- report_infeasible(reason): when the task cannot be done
- noop(wait_ms=1000): wait for the page to change
bid is an element's id from the tree, as a string. $screen"""

_SCREEN = "Each step also shows a screenshot of the page."
_CODE = re.compile(r"```[ \t]*(?:python|py)?[ \t]*\n?", re.IGNORECASE)
_ACTIONS = frozenset({"click", "dblclick", "hover", "focus", "fill", "clear", "select_option", "press", "scroll",
                      "goto", "go_back", "go_forward", "send_msg_to_user", "report_infeasible", "noop"})
_BID = re.compile(r"^\[?\s*[a-zA-Z]?(\d{1,10})\s*\]?$")


class BrowserGymFormat(CallFormat):
    """Agents that read the accessibility tree and act on element ids (BrowserGym's and AgentLab's agents,
    WebArena-style text agents)."""

    name: ClassVar[str] = "browsergym"
    families: ClassVar[str] = "text and hybrid agents of BrowserGym / AgentLab (id-based actions on the " \
                              "accessibility tree), any chat LLM"
    system_template: ClassVar[str] = SYSTEM
    no_call: ClassVar[str] = "no action in reply"

    def system_prompt(self, cfg: AgentConfig, templates: PromptTemplates, width: int, height: int) -> str:
        return SYSTEM.replace("$screen", _SCREEN if cfg.screenshot else "").rstrip()

    def calls(self, text: str, reply: ParsedReply, skipped: list[str]) -> Iterator[tuple[int, Call]]:
        code, fenced = fenced_code(text, _CODE, reply)
        thought: list[str] = []
        for index, line in enumerate(s for s in code.splitlines() if s.strip()):
            head = line.strip().split("(", 1)[0].strip()
            if head not in _ACTIONS:
                if not fenced and reply.thought is None:
                    thought.append(line.strip())  # prose before the call is the thought
                continue
            if not fenced and reply.thought is None and thought:
                reply.thought = " ".join(thought)
            try:
                yield index, read_call(line)
            except Exception as e:  # noqa: BLE001 - a line that is no call is skipped, with why
                skipped.append(f"call {index}: {skip_reason(e)}")
        if reply.thought is None and thought:
            reply.thought = " ".join(thought)

    def to_action(self, call: Call, frame: CoordFrame, tree: frozenset[int] | None = None
                  ) -> tuple[AgentAction, list[str], dict[str, Any] | None]:
        name = call.name
        if name in ("click", "dblclick", "hover", "focus"):
            if name == "click" and call.arg(1, "button") not in (None, "left"):
                raise ValueError("click: only the left button")
            node = _node(call, tree)
            warnings = {"dblclick": ["a double click is done as one click"],
                        "focus": ["focus is done as a click"]}.get(name, [])
            return AgentAction("hover" if name == "hover" else "left_click", node=node), warnings, None
        if name in ("fill", "clear"):
            value = "" if name == "clear" else text_arg(call.arg(1, "value"), "fill's value")
            return AgentAction("type", node=_node(call, tree), text=value, clear=True, enter=False), [], None
        if name == "select_option":
            option = call.arg(1, "options")
            warnings = []
            if isinstance(option, list | tuple):
                if not option:
                    raise ValueError("select_option: no option given")
                option, warnings = option[0], ["only the first of several options is selected"]
            return AgentAction("select", node=_node(call, tree), text=text_arg(option, "the option")), warnings, None
        if name == "press":
            combo = text_arg(call.arg(1, "key_comb"), "press's key_comb").strip()
            if not combo:
                raise ValueError("press: no key given")
            return AgentAction("keypress", node=_node(call, tree), keys=combo), [], None
        if name == "scroll":
            dy = number(call.arg(1, "delta_y"), "scroll's delta_y")
            if dy == 0:
                raise ValueError("scroll: only vertical scrolling (delta_y) is done, and it is 0")
            return AgentAction("scroll", direction="down" if dy > 0 else "up"), [], None
        if name == "goto":
            return AgentAction("navigate", url=navigable_url(text_arg(call.arg(0, "url"), "goto's url"))), [], None
        if name in ("go_back", "go_forward"):
            return AgentAction("go_back" if name == "go_back" else "go_forward"), [], None
        if name in ("send_msg_to_user", "report_infeasible"):
            text = text_arg(call.arg(0, "text", "reason"), f"{name}'s text")
            return AgentAction("answer", text=text), (["the agent reported the task infeasible"]
                                                      if name == "report_infeasible" else []), None
        if name == "noop":
            wait_ms = call.arg(0, "wait_ms")
            seconds = 1.0 if wait_ms is None else number(wait_ms, "noop's wait_ms") / 1000
            return AgentAction("wait", seconds=max(0.0, seconds)), [], None
        raise ValueError(f"{name}() is not an action of this browser")


def _node(call: Call, tree: frozenset[int] | None) -> int:
    """The element id a call names (``'12'``, ``12``, ``'[12]'``, ``'a12'``), checked against the step's tree."""
    bid = call.arg(0, "bid")
    if isinstance(bid, bool) or not isinstance(bid, str | int):
        raise ValueError(f"{call.name}: bid must be an element's id, got {bid!r}"[:200])
    match = _BID.match(str(bid).strip())
    if match is None:
        raise ValueError(f"{call.name}: {str(bid)[:40]!r} is not an element's id")
    node = int(match.group(1))
    if tree is not None and node not in tree:
        raise ValueError(f"{call.name}: no element [{node}] in the page's tree")
    if not 1 <= node <= 2**31:
        raise ValueError(f"{call.name}: {node} is not an element's id")
    return node
