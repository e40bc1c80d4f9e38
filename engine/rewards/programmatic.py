"""Programmatic rewards: each rubric fact checked against the final page, URL or answer.

A reward is 1 only when every fact holds (as with the judge); the result keeps each fact's verdict so
both reward sources give records of the same shape. :func:`unrewardable` names the tasks that nothing can score.
"""

from __future__ import annotations

import json
import re
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import asdict, dataclass, field
from typing import Any, cast

from engine.store.records import RecordStatus, RewardRecord, reward_status
from engine.tasks.schema import Task


@dataclass(slots=True)
class FactVerdict:
    group: str
    fact: str
    check: str
    passed: bool
    detail: str = ""


@dataclass(slots=True)
class Reward:
    """An episode's reward (:class:`engine.store.records.RewardRecord` once written). ``value`` None: nothing could
    score the episode (``unrewarded``), or, with ``blocked``, the judge saw the site block the agent."""

    value: float | None  # None: no reward could be computed
    source: str  # program | page | judge | none
    reason: str
    facts: list[FactVerdict] = field(default_factory=list)
    # What the reward was decided on, for audits (the judge's calls, prompts, replies, kept images); JSON-able.
    evidence: dict[str, Any] | None = None
    blocked: bool = False  # the judge's blocked verdict (value None)

    def to_dict(self) -> RewardRecord:
        """The reward as records hold it (``blocked`` only when true)."""
        out = asdict(self)
        if not self.blocked:
            del out["blocked"]
        # asdict gives the dataclass's fields, which are RewardRecord's keys (each FactVerdict a FactRecord).
        return cast("RewardRecord", out)

    @property
    def status(self) -> RecordStatus:
        """The status this reward gives its episode (:func:`engine.store.records.reward_status`)."""
        return reward_status({"value": self.value, "blocked": self.blocked})


def unrewardable(tasks: Iterable[Task], judge_configured: bool, reward: str = "auto") -> list[Task]:
    """The tasks whose episodes nothing can score, so that they would end ``unrewarded``: those the judge would
    not reward (:func:`judge_rewards`) that have no programmatic checks and no page reward, and those the judge
    would reward that give it nothing to check (no rubric facts, no reference answer). A run (or a training loop)
    says so before it starts. ``reward``: the run's reward mode (``auto``, ``program``, ``judge``)."""
    return [t for t in tasks
            if not (judgeable(t) if judge_rewards(t, judge_configured, reward) else has_own_reward(t))]


def judge_rewards(task: Task, judge_configured: bool, reward: str = "auto") -> bool:
    """Whether the judge gives ``task``'s reward: a judge is configured, and the reward mode is ``judge``, or
    ``auto`` and the task has no reward of its own (``program`` never asks the judge)."""
    if not judge_configured or reward == "program":
        return False
    return reward == "judge" or not has_own_reward(task)


def has_own_reward(task: Task) -> bool:
    """The task's own checks or its page give its reward (no judge needed)."""
    return task.has_checks or task.reward_from_page


def judgeable(task: Task) -> bool:
    """A judge has something to check: rubric facts or a reference answer
    (:meth:`engine.rewards.judge.RubricJudge.judge` gives no reward value otherwise)."""
    return any(g.facts for g in task.evaluator_reference) or bool((task.definite_answer or "").strip())


def page_reward(state: dict[str, Any] | None) -> Reward:
    """The reward a page computed itself (:attr:`engine.tasks.schema.PageHooks.reward_from_page`), in the rubric shape
    of programmatic rewards: one fact, "the page's own reward", that holds when the page ended its episode with a
    positive raw reward. The raw and time-scaled values and the page's reason stay in the detail."""
    if state is None:
        return Reward(None, "none", "the page reported no state (its probe never answered)")
    done, raw = bool(state.get("done")), state.get("raw_reward")
    passed = done and isinstance(raw, int | float) and raw > 0
    if done:
        detail = f"raw reward {raw}, time-scaled {state.get('reward')}, reason {state.get('reason')!r}"
    else:
        detail = "the page did not end its episode"
    fact = FactVerdict("1", "the page's own reward", "page", passed, detail)
    return Reward(1.0 if passed else 0.0, "page", detail, [fact])


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
