"""``miniwob-scripted``: hand-written solutions of MiniWoB++ tasks, acting like a person with a mouse.

Each solved task has a small JavaScript solver that reads the live page (the episode's instruction from
``core.getUtterance()``, the elements, their current values) and returns the *next* action only, with the
target element's centre in viewport CSS pixels: ``{action: 'click'|'type'|'select', x, y, text?}``.
Solvers keep no state between steps: they look at what is already done (a field's value, a checkbox's
state) and pick what remains, so a step the page ignored is simply tried again. The policy turns the
answer into an ordinary :class:`AgentAction` (left_click, type, select at a point), so the recorded
trajectories contain exactly the browser actions a visual model would emit.

Page access: the policy reads the page through the rollout's page probe (``wants_page_probe``), which is the
episode's :class:`browserpool.pool.BrowserSession`; besides ``locate`` it uses the session's
``evaluate(exprs)`` (oracle access, like the scripted policy's; never given to models).

Tasks without a solver are answered at once with ``answer`` (reward 0): :data:`SOLVED_TASKS` lists the
solved ones.
"""

from __future__ import annotations

from typing import Any

from engine.agent.actions import AgentAction
from engine.agent.policy_api import Policy, PolicyError, PolicyReply, PolicyRequest

# Shared helpers, defined inside every solver call (the page's own globals stay untouched).
_PRELUDE = """
const U = (() => { let u = core.getUtterance(); return (u && typeof u === 'object') ? u.utterance : String(u); })();
const Q = [...U.matchAll(/"([^"]*)"/g)].map((m) => m[1]);
const $1 = (sel) => document.querySelector(sel);
const $all = (sel) => [...document.querySelectorAll(sel)];
const byText = (sel, t) => $all(sel).find((e) => e.textContent.trim() === t);
const at = (el) => {
  // The centre, unless another element covers it (MiniWoB overlaps elements on purpose): then the point
  // nearest the centre, on a grid over the box, where a click really reaches the element.
  const r = el.getBoundingClientRect();
  const pts = [];
  for (let i = 1; i < 8; i++) {
    for (let j = 1; j < 8; j++) pts.push([r.left + r.width * i / 8, r.top + r.height * j / 8]);
  }
  pts.sort((a, b) => Math.hypot(a[0] - r.left - r.width / 2, a[1] - r.top - r.height / 2)
                   - Math.hypot(b[0] - r.left - r.width / 2, b[1] - r.top - r.height / 2));
  const hit = pts.find(([x, y]) => { const e = document.elementFromPoint(x, y); return e && el.contains(e); });
  const [x, y] = hit || [r.left + r.width / 2, r.top + r.height / 2];
  return {x, y};
};
const click = (el) => el ? {action: 'click', ...at(el)} : null;
const type = (el, text) => el ? {action: 'type', ...at(el), text} : null;
const select = (el, text) => el ? {action: 'select', ...at(el), text} : null;
const fill = (pairs, submit) => {
  for (const [el, text] of pairs) if (el && el.value !== text) return type(el, text);
  return click(submit);
};
const labelled = (root, name) => $all(root + ' label').find((l) => l.textContent.trim() === name);
"""

# Task name -> solver body (JavaScript statements ending in a return of the next action, or null).
SOLVERS: dict[str, str] = {
    "click-button": "return click(byText('#area button', Q[0]));",
    "click-link": "return click(byText('#area .alink', Q[0]));",
    "click-dialog": "return click($1('.ui-dialog-titlebar-close'));",
    "click-test": "return click($1('#subbtn'));",
    "click-test-2": "return click($1('#subbtn'));",
    # ONE first, then TWO: the page's own list of the buttons pushed so far says which is next.
    "click-button-sequence": "return click(buttonsPushed.length ? $1('#subbtn2') : $1('#subbtn'));",
    "click-tab": "const n = U.match(/Tab #(\\d+)/)[1]; return click($1(`#area ul a[href=\"#tabs-${n}\"]`));",
    "focus-text": "return click($1('#tt'));",
    "enter-text": "return fill([[$1('#tt'), Q[0]]], $1('#subbtn'));",
    "enter-password": "return fill([[$1('#password'), Q[0]], [$1('#verify'), Q[0]]], $1('#subbtn'));",
    "login-user": "return fill([[$1('#username'), Q[0]], [$1('#password'), Q[1]]], $1('#subbtn'));",
    "click-checkboxes": """
        const list = U.replace(/^Select /, '').replace(/ and click Submit\\.$/, '');
        const want = list === 'nothing' ? [] : list.split(', ');
        for (const l of $all('#boxes label')) {
          const box = l.querySelector('input');
          if (box.checked !== want.includes(l.textContent.trim())) return click(box);
        }
        return click($1('#subbtn'));""",
    "click-option": """
        const name = U.replace(/^Select /, '').replace(/ and click Submit\\.$/, '');
        const box = labelled('#boxes', name).querySelector('input');
        return box.checked ? click($1('#subbtn')) : click(box);""",
    "choose-list": """
        const name = U.replace(/^Select /, '').replace(/ from the list and click Submit\\.$/, '');
        const sel = $1('#options');
        const current = sel.options[sel.selectedIndex];
        return current && current.textContent === name ? click($1('#area button')) : select(sel, name);""",
}
SOLVED_TASKS = tuple(sorted(SOLVERS))


def solver_expression(task: str) -> str:
    """The JS expression that computes ``task``'s next action in the page (never throws)."""
    body = SOLVERS[task]
    return f"(() => {{ try {{ {_PRELUDE}\n{body} }} catch (e) {{ return {{error: String(e)}}; }} }})()"


def _task_name(request: PolicyRequest) -> str:
    task = request.task
    return task.subdomain or task.task_id.removeprefix("miniwob.")


class MiniWobScriptedPolicy(Policy):
    """Solves the MiniWoB++ tasks in :data:`SOLVED_TASKS` from the live page; answers at once elsewhere."""

    name = "miniwob-scripted"
    reads_pixels = False
    wants_page_probe = True

    async def act(self, request: PolicyRequest) -> PolicyReply:
        task = _task_name(request)
        if task not in SOLVERS:
            return PolicyReply(AgentAction("answer", text="no scripted solution"),
                               text=f"no scripted solution for MiniWoB++ task {task!r}")
        evaluate = getattr(request.page, "evaluate", None)
        if evaluate is None:
            raise PolicyError("the miniwob-scripted policy needs page access (a page probe with evaluate)")
        (found,) = await evaluate([solver_expression(task)])
        if not isinstance(found, dict) or "error" in found or found.get("action") not in ("click", "type", "select"):
            detail = found.get("error") if isinstance(found, dict) else found
            return PolicyReply(AgentAction("answer", text="cannot solve"),
                               text=f"{task}: the solver found no next action ({detail})")
        action = _to_action(found)
        return PolicyReply(action, text=f"{task}: {action.describe()}")


def _to_action(found: dict[str, Any]) -> AgentAction:
    x, y = round(float(found["x"]), 1), round(float(found["y"]), 1)
    kind = found["action"]
    if kind == "click":
        return AgentAction("left_click", x=x, y=y)
    if kind == "select":
        return AgentAction("select", x=x, y=y, text=str(found.get("text", "")))
    # MiniWoB forms are submitted by their own button: no Enter after typing.
    return AgentAction("type", x=x, y=y, text=str(found.get("text", "")), clear=True, enter=False)

