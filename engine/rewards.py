"""Programmatic rewards: each rubric fact checked against the final page, URL or answer.

A reward is 1 only when every fact holds (as with the judge); the result keeps each fact's verdict so
both reward sources give records of the same shape.
"""

from __future__ import annotations

import json
import re
from collections.abc import Awaitable, Callable
from dataclasses import asdict, dataclass, field
from typing import Any

from engine.tasks import Task


@dataclass(slots=True)
class FactVerdict:
    group: str
    fact: str
    check: str
    passed: bool
    detail: str = ""


@dataclass(slots=True)
class Reward:
    value: float | None  # None: no reward could be computed
    source: str  # program | page | judge | none
    reason: str
    facts: list[FactVerdict] = field(default_factory=list)
    # What the reward was decided on, for audits (the judge's calls, prompts, replies, kept images); JSON-able.
    evidence: dict[str, Any] | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _norm(s: str) -> str:
    return " ".join(s.lower().split())


def _match_text(check: dict[str, Any], value: str) -> tuple[bool, str]:
    if "equals" in check:
        return _norm(value) == _norm(str(check["equals"])), f"equals {check['equals']!r}"
    if "contains" in check:
        return _norm(str(check["contains"])) in _norm(value), f"contains {check['contains']!r}"
    pattern = str(check["regex"])
    return re.search(pattern, value, re.IGNORECASE) is not None, f"matches /{pattern}/"


def _page_expr(check: dict[str, Any]) -> str:
    """A JS expression (evaluated in the final page) for a text or js check; never throws."""
    if check["kind"] == "text":
        needle = json.dumps(_norm(str(check.get("contains", check.get("equals", "")))))
        body = f"(document.body ? document.body.innerText : '').toLowerCase().replace(/\\s+/g, ' ').includes({needle})"
    else:
        body = f"({check['expr']})"
    return f"(() => {{ try {{ return !!{body}; }} catch (e) {{ return {{error: String(e)}}; }} }})()"


async def program_reward(task: Task, final_url: str, answer: str | None,
                         evaluate: Callable[[list[str]], Awaitable[list[Any]]]) -> Reward:
    """Check every fact of ``task``; ``evaluate`` runs JS expressions in the episode's final page."""
    items = [(g, fact, check) for g in task.evaluator_reference for fact, check in zip(g.facts, g.checks, strict=False)]
    if not items:
        return Reward(None, "none", "the task has no programmatic checks")
    page_checks = [i for i, (_, _, c) in enumerate(items) if c["kind"] in ("text", "js")]
    page_values = await evaluate([_page_expr(items[i][2]) for i in page_checks]) if page_checks else []
    by_index = dict(zip(page_checks, page_values, strict=False))
    verdicts = []
    for i, (group, fact, check) in enumerate(items):
        kind = check["kind"]
        if kind == "url":
            passed, detail = _match_text(check, final_url)
            detail = f"url {final_url!r} {detail}"
        elif kind == "answer":
            if answer is None:
                passed, detail = False, "no answer given"
            else:
                passed, detail = _match_text(check, answer)
                detail = f"answer {answer[:200]!r} {detail}"
        else:
            value = by_index.get(i)
            passed = value is True
            detail = value["error"] if isinstance(value, dict) and "error" in value else f"{kind} check"
        verdicts.append(FactVerdict(group.id, fact, kind, passed, detail))
    failed = [v for v in verdicts if not v.passed]
    if failed:
        reason = f"{len(failed)} of {len(verdicts)} facts failed; first: {failed[0].fact} ({failed[0].detail})"
        return Reward(0.0, "program", reason, verdicts)
    return Reward(1.0, "program", f"all {len(verdicts)} facts hold", verdicts)
