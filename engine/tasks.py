"""Tasks in the WebGym task schema (fact-group rubrics), loaded with errors that name file, line, field.

A record has the fields of the original task files (``benchmark_name, task_name, domain, subdomain,
website, definite_answer, task_id, difficulty, evaluator_reference, attempt_level``) and may carry
this engine's extras: ``max_steps``, a ``reference_solution`` for the scripted policy, and, in each
fact group, ``checks`` (one programmatic check per fact). ``{SITES}`` in any string stands for the
base URL of the bundled-site server.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

SITES_PLACEHOLDER = "{SITES}"
BUNDLED_TASKS = Path(__file__).parent / "sites" / "tasks.jsonl"

# Step caps by difficulty bucket (easy 1-3 facts, medium 4-6, hard 7+), as in the original.
STEP_CAPS = {"train": (10, 20, 30), "test": (30, 50, 70)}
CHECK_KINDS = {"url", "text", "js", "answer"}
SOLUTION_ACTIONS = {"click", "type", "key", "scroll", "go_back", "navigate", "wait", "answer", "hover"}


class TaskFileError(ValueError):
    """A task file that cannot be used; the message names the file, line and field."""


@dataclass(frozen=True, slots=True)
class RubricGroup:
    """One fact group of the rubric; ``checks[i]`` (when present) verifies ``facts[i]``."""

    id: str
    description: str
    facts: tuple[str, ...]
    checks: tuple[dict[str, Any], ...] = ()


@dataclass(frozen=True, slots=True)
class Task:
    task_id: str
    task_name: str  # the instruction shown to the agent
    website: str
    benchmark_name: str = ""
    domain: str = ""
    subdomain: str = ""
    definite_answer: str | None = None
    difficulty: int = 1
    attempt_level: int = 0
    evaluator_reference: tuple[RubricGroup, ...] = ()
    max_steps: int | None = None
    reference_solution: tuple[dict[str, Any], ...] = ()
    extra: dict[str, Any] = field(default_factory=dict)

    def step_cap(self, split: str = "train") -> int:
        """Steps allowed: the original's cap by difficulty, or the task's own max_steps if larger."""
        easy, medium, hard = STEP_CAPS[split]
        cap = easy if self.difficulty <= 3 else medium if self.difficulty <= 6 else hard
        return max(cap, self.max_steps or 0)

    @property
    def has_checks(self) -> bool:
        return any(g.checks for g in self.evaluator_reference)

    def rubric_items(self) -> list[str]:
        """Facts flattened for a judge: ``[Group <id>: <description>] <fact>``."""
        return [f"[Group {g.id}: {g.description}] {fact}" for g in self.evaluator_reference for fact in g.facts]

    def to_dict(self) -> dict[str, Any]:
        """The record as stored in trajectories (WebGym field names)."""
        return {
            "task_id": self.task_id, "task_name": self.task_name, "website": self.website,
            "benchmark_name": self.benchmark_name, "domain": self.domain, "subdomain": self.subdomain,
            "definite_answer": self.definite_answer, "difficulty": self.difficulty,
            "attempt_level": self.attempt_level,
            "evaluator_reference": [
                {"id": g.id, "description": g.description, "facts": list(g.facts),
                 **({"checks": list(g.checks)} if g.checks else {})}
                for g in self.evaluator_reference],
        }


class _Line:
    """Field access for one record with errors that say where."""

    def __init__(self, path: Path, lineno: int, rec: dict[str, Any]) -> None:
        self.path, self.lineno, self.rec = path, lineno, rec

    def fail(self, fld: str, problem: str) -> TaskFileError:
        return TaskFileError(f"{self.path}, line {self.lineno}: field '{fld}': {problem}")

    def str_field(self, name: str, required: bool = False, default: str = "") -> str:
        v = self.rec.get(name)
        if v is None:
            if required:
                raise self.fail(name, "missing")
            return default
        if not isinstance(v, str | int | float) or isinstance(v, bool):
            raise self.fail(name, f"expected a string, got {type(v).__name__}")
        v = str(v).strip()
        if required and not v:
            raise self.fail(name, "empty")
        return v

    def int_field(self, name: str, default: int | None) -> int | None:
        v = self.rec.get(name)
        if v is None or v == "":
            return default
        try:
            return int(v)
        except (TypeError, ValueError):
            raise self.fail(name, f"expected an integer, got {v!r}") from None


def _subst(value: Any, base_url: str | None) -> Any:
    if base_url is None:
        return value
    if isinstance(value, str):
        return value.replace(SITES_PLACEHOLDER, base_url)
    if isinstance(value, list):
        return [_subst(v, base_url) for v in value]
    if isinstance(value, dict):
        return {k: _subst(v, base_url) for k, v in value.items()}
    return value


def _website(line: _Line, raw: str) -> str:
    if SITES_PLACEHOLDER in raw or "://" in raw or raw.startswith("about:"):
        return raw
    return "https://" + raw  # the original's rule for a bare host


def _rubric(line: _Line, raw: Any) -> tuple[RubricGroup, ...]:
    """Fact groups, plus the older shapes the original accepts (string, strings, description objects)."""
    if raw is None or raw == "":
        return ()
    if isinstance(raw, str):
        return (RubricGroup("1", raw, (raw,)),)
    if not isinstance(raw, list):
        raise line.fail("evaluator_reference", f"expected a list of fact groups, got {type(raw).__name__}")
    groups = []
    for i, g in enumerate(raw):
        where = f"evaluator_reference[{i}]"
        if isinstance(g, str):
            groups.append(RubricGroup(str(i + 1), g, (g,)))
            continue
        if not isinstance(g, dict):
            raise line.fail(where, f"expected an object or a string, got {type(g).__name__}")
        if "facts" not in g:  # {description, difficulty}: one item
            desc = g.get("description")
            if not isinstance(desc, str) or not desc:
                raise line.fail(where, "needs 'facts' or a 'description'")
            groups.append(RubricGroup(str(g.get("id", i + 1)), desc, (desc,)))
            continue
        facts = g["facts"]
        if not isinstance(facts, list) or not facts or not all(isinstance(f, str) for f in facts):
            raise line.fail(f"{where}.facts", "expected a non-empty list of strings")
        checks = g.get("checks") or []
        if checks:
            if not isinstance(checks, list) or len(checks) != len(facts):
                raise line.fail(f"{where}.checks", f"expected one check per fact ({len(facts)})")
            for j, c in enumerate(checks):
                if not isinstance(c, dict) or c.get("kind") not in CHECK_KINDS:
                    raise line.fail(f"{where}.checks[{j}]", f"kind must be one of {sorted(CHECK_KINDS)}")
                if c["kind"] == "js" and not isinstance(c.get("expr"), str):
                    raise line.fail(f"{where}.checks[{j}]", "a js check needs 'expr'")
                if c["kind"] != "js" and not any(k in c for k in ("contains", "equals", "regex")):
                    raise line.fail(f"{where}.checks[{j}]", "needs 'contains', 'equals' or 'regex'")
        groups.append(RubricGroup(str(g.get("id", i + 1)), str(g.get("description", "")),
                                  tuple(facts), tuple(checks)))
    return tuple(groups)


def _solution(line: _Line, raw: Any) -> tuple[dict[str, Any], ...]:
    if raw is None:
        return ()
    if not isinstance(raw, list):
        raise line.fail("reference_solution", "expected a list of steps")
    for i, step in enumerate(raw):
        if not isinstance(step, dict) or step.get("action") not in SOLUTION_ACTIONS:
            raise line.fail(f"reference_solution[{i}]", f"action must be one of {sorted(SOLUTION_ACTIONS)}")
    return tuple(raw)


def parse_task(rec: Any, path: Path, lineno: int, base_url: str | None = None) -> Task:
    """Validate one decoded JSON record and build a Task."""
    if not isinstance(rec, dict):
        raise TaskFileError(f"{path}, line {lineno}: expected a JSON object, got {type(rec).__name__}")
    line = _Line(path, lineno, _subst(rec, base_url))
    groups = _rubric(line, line.rec.get("evaluator_reference"))
    n_facts = sum(len(g.facts) for g in groups)
    difficulty = line.int_field("difficulty", n_facts or 1)
    if difficulty is None or difficulty < 1:
        raise line.fail("difficulty", f"must be at least 1, got {difficulty}")
    max_steps = line.int_field("max_steps", None)
    if max_steps is not None and max_steps < 1:
        raise line.fail("max_steps", "must be at least 1")
    answer = line.rec.get("definite_answer")
    known = {"task_id", "task_name", "website", "benchmark_name", "domain", "subdomain", "definite_answer",
             "difficulty", "attempt_level", "evaluator_reference", "max_steps", "reference_solution"}
    return Task(
        task_id=line.str_field("task_id", required=True),
        task_name=line.str_field("task_name", required=True),
        website=_website(line, line.str_field("website", required=True)),
        benchmark_name=line.str_field("benchmark_name"),
        domain=line.str_field("domain"),
        subdomain=line.str_field("subdomain"),
        definite_answer=str(answer).strip() if answer not in (None, "") else None,
        difficulty=difficulty,
        attempt_level=line.int_field("attempt_level", 0) or 0,
        evaluator_reference=groups,
        max_steps=max_steps,
        reference_solution=_solution(line, line.rec.get("reference_solution")),
        extra={k: v for k, v in line.rec.items() if k not in known},
    )


def load_tasks(path: str | Path, base_url: str | None = None) -> list[Task]:
    """Load a JSONL task file. Raises TaskFileError naming the first bad line and field.

    Blank lines are skipped; task ids must be unique.
    """
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise TaskFileError(f"{path}: cannot read task file: {exc.strerror or exc}") from exc
    except UnicodeDecodeError as exc:
        raise TaskFileError(f"{path}: not UTF-8 text ({exc.reason} at byte {exc.start})") from exc
    tasks: list[Task] = []
    seen: dict[str, int] = {}
    for lineno, raw in enumerate(text.splitlines(), start=1):
        if not raw.strip():
            continue
        try:
            rec = json.loads(raw)
        except json.JSONDecodeError as exc:
            raise TaskFileError(f"{path}, line {lineno}: invalid JSON: {exc.msg} (column {exc.colno})") from None
        task = parse_task(rec, path, lineno, base_url)
        if task.task_id in seen:
            raise TaskFileError(f"{path}, line {lineno}: field 'task_id': duplicate {task.task_id!r} "
                                f"(first on line {seen[task.task_id]})")
        seen[task.task_id] = lineno
        tasks.append(task)
    if not tasks:
        raise TaskFileError(f"{path}: no tasks in file")
    return tasks
