"""The scripted policy: follows each task's reference solution like a person with a mouse.

Steps that target an element (by CSS selector) are turned into plain coordinate actions: the policy
asks the page where the element is and, when it lies outside the viewport, scrolls towards it first,
so recorded trajectories look exactly like a visual agent's (usable as demonstrations).
"""

from __future__ import annotations

from dataclasses import dataclass

from engine.agent.actions import AgentAction
from engine.agent.policy_api import Policy, PolicyError, PolicyReply, PolicyRequest

MAX_SCROLLS_PER_TARGET = 12
MAX_WAITS_PER_TARGET = 3


@dataclass
class _Cursor:
    index: int = 0
    scrolls: int = 0
    waits: int = 0


class ScriptedPolicy(Policy):
    """Replays ``task.reference_solution``; answers "done" when the solution has no answer step."""

    name = "scripted"
    reads_pixels = False
    wants_page_probe = True

    def __init__(self) -> None:
        self._cursors: dict[str, _Cursor] = {}

    async def act(self, request: PolicyRequest) -> PolicyReply:
        cur = self._cursors.setdefault(request.episode_id, _Cursor())
        steps = request.task.reference_solution
        if cur.index >= len(steps):
            return PolicyReply(AgentAction("answer", text="done"), text="solution finished")
        step = steps[cur.index]
        kind = step["action"]
        target = step.get("target")
        if target and kind in ("click", "type", "hover"):
            if request.page is None:
                raise PolicyError("the scripted policy needs page access for selector targets")
            loc = await request.page.locate(target)
            if not loc.get("found"):
                if cur.waits < MAX_WAITS_PER_TARGET:
                    cur.waits += 1
                    return PolicyReply(AgentAction("wait", seconds=2.0), text=f"waiting for {target}")
                cur.index = len(steps)
                return PolicyReply(AgentAction("answer", text="cannot find " + target),
                                   text=f"target {target} not found")
            if not loc.get("inView"):
                if cur.scrolls >= MAX_SCROLLS_PER_TARGET:
                    raise PolicyError(f"cannot scroll {target} into view")
                cur.scrolls += 1
                direction = "down" if loc.get("below") else "up"
                return PolicyReply(AgentAction("scroll", direction=direction), text=f"scroll to {target}")
            x, y = round(loc["x"], 1), round(loc["y"], 1)
        else:
            x = y = None
        cur.index += 1
        cur.scrolls = cur.waits = 0
        action = _to_action(step, x, y)
        return PolicyReply(action, text=f"step {cur.index}/{len(steps)}: {action.describe()}")

    async def end_episode(self, episode_id: str) -> None:
        self._cursors.pop(episode_id, None)


def _to_action(step: dict, x: float | None, y: float | None) -> AgentAction:
    kind = step["action"]
    if kind == "click":
        return AgentAction("left_click", x=x, y=y)
    if kind == "hover":
        return AgentAction("hover", x=x, y=y)
    if kind == "type":
        return AgentAction("type", x=x, y=y, text=step.get("text", ""), clear=step.get("clear", True),
                           enter=step.get("enter", True))
    if kind == "key":
        return AgentAction("keypress", keys=step.get("keys", "Enter"))
    if kind == "scroll":
        return AgentAction("scroll", direction=step.get("direction", "down"))
    if kind == "navigate":
        return AgentAction("navigate", url=step["url"])
    if kind == "answer":
        return AgentAction("answer", text=step.get("text", ""))
    if kind == "wait":
        return AgentAction("wait", seconds=step.get("seconds"))
    return AgentAction("go_back")
