"""Task files read into :class:`engine.tasks.schema.Task` s, with errors that name file, line, field.

Files are JSONL (one record a line; positions in messages are 1-based ``line N``) or JSON (a top-level
array of records, or an object with a ``"tasks"`` array; positions are the 0-based array index,
``item N``, since records need not sit on lines of their own). ``*.jsonl`` is always read as JSONL,
``*.json`` always as JSON; any other name is sniffed (a leading ``[``, or a whole-file object with a
``"tasks"`` array, is JSON).
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from engine import json_input
from engine.tasks.schema import (
    CHECK_KINDS,
    KNOWN_FIELDS,
    MAX_FACTS,
    PAGE_FIELDS,
    PAGE_SCRIPT_CHARS,
    RUBRIC_TEXT_CHARS,
    SITES_PLACEHOLDER,
    SOLUTION_ACTIONS,
    TEXT_CHARS,
    PageHooks,
    RubricGroup,
    StepCaps,
    Task,
    TaskFileError,
    as_step_caps,
)


class _Line:
    """Field access for one record with errors that say where (``line N`` or ``item N``)."""

    def __init__(self, path: Path, where: str | int, rec: dict[str, Any]) -> None:
        self.path, self.rec = path, rec
        self.where = f"line {where}" if isinstance(where, int) else where

    def fail(self, fld: str, problem: str) -> TaskFileError:
        return TaskFileError(f"{self.path}, {self.where}: field '{fld}': {problem}")

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
        return self.within(name, v, TEXT_CHARS[name])

    def within(self, name: str, text: str, limit: int) -> str:
        """``text``, or an error when it is longer than ``limit`` characters."""
        if len(text) > limit:
            raise self.fail(name, f"{len(text):,} characters, over the limit of {limit:,}")
        return text

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
        return (RubricGroup("1", raw, (line.within("evaluator_reference", raw, RUBRIC_TEXT_CHARS),)),)
    if not isinstance(raw, list):
        raise line.fail("evaluator_reference", f"expected a list of fact groups, got {type(raw).__name__}")
    groups: list[RubricGroup] = []
    for i, g in enumerate(raw):
        where = f"evaluator_reference[{i}]"
        if isinstance(g, str):
            groups.append(RubricGroup(str(i + 1), g, (line.within(where, g, RUBRIC_TEXT_CHARS),)))
            continue
        if not isinstance(g, dict):
            raise line.fail(where, f"expected an object or a string, got {type(g).__name__}")
        if "facts" not in g:  # {description, difficulty}: one item
            desc = g.get("description")
            if not isinstance(desc, str) or not desc:
                raise line.fail(where, "needs 'facts' or a 'description'")
            desc = line.within(f"{where}.description", desc, RUBRIC_TEXT_CHARS)
            groups.append(RubricGroup(str(g.get("id", i + 1)), desc, (desc,)))
            continue
        facts = g["facts"]
        if not isinstance(facts, list) or not facts or not all(isinstance(f, str) for f in facts):
            raise line.fail(f"{where}.facts", "expected a non-empty list of strings")
        for j, fact in enumerate(facts):
            line.within(f"{where}.facts[{j}]", fact, RUBRIC_TEXT_CHARS)
        desc = line.within(f"{where}.description", str(g.get("description", "")), RUBRIC_TEXT_CHARS)
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
        groups.append(RubricGroup(str(g.get("id", i + 1)), desc, tuple(facts), tuple(checks)))
    if sum(len(g.facts) for g in groups) > MAX_FACTS:
        raise line.fail("evaluator_reference", f"more than {MAX_FACTS:,} facts")
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


def _build(rec: Any, path: Path, where: str, base_url: str | None,
           caps: StepCaps | None) -> tuple[Task | None, str | None, list[TaskFileError]]:
    """One record: (the task or None, its task_id if that field is usable, every field error found).

    Every field is checked even after one fails, so ``validate_file`` can list all problems of a record;
    ``load_tasks`` raises the first (fields in file-schema order: task_id, task_name, website, ...).
    """
    if not isinstance(rec, dict):
        return None, None, [TaskFileError(f"{path}, {where}: expected a JSON object, got {type(rec).__name__}")]
    line = _Line(path, where, _subst(rec, base_url))
    errors: list[TaskFileError] = []

    def take(fn: Any, default: Any) -> Any:
        try:
            return fn()
        except TaskFileError as exc:
            errors.append(exc)
            return default

    task_id = take(lambda: line.str_field("task_id", required=True), None)
    task_name = take(lambda: line.str_field("task_name", required=True), "")
    website = take(lambda: _website(line, line.str_field("website", required=True)), "")
    benchmark = take(lambda: line.str_field("benchmark_name"), "")
    domain = take(lambda: line.str_field("domain"), "")
    subdomain = take(lambda: line.str_field("subdomain"), "")
    groups = take(lambda: _rubric(line, line.rec.get("evaluator_reference")), ())
    n_facts = sum(len(g.facts) for g in groups)

    def difficulty_field() -> int:
        d = line.int_field("difficulty", n_facts or 1)
        if d is None or d < 1:
            raise line.fail("difficulty", f"must be at least 1, got {d}")
        return d

    def max_steps_field() -> int | None:
        m = line.int_field("max_steps", None)
        if m is not None and m < 1:
            raise line.fail("max_steps", "must be at least 1")
        return m

    difficulty = take(difficulty_field, 1)
    attempt_level = take(lambda: line.int_field("attempt_level", 0) or 0, 0)
    max_steps = take(max_steps_field, None)
    solution = take(lambda: _solution(line, line.rec.get("reference_solution")), ())
    page = take(lambda: _page_hooks(line), None)
    answer = line.rec.get("definite_answer")
    definite_answer = None if answer in (None, "") else take(
        lambda: line.within("definite_answer", str(answer).strip(), TEXT_CHARS["definite_answer"]), None)
    if errors:
        return None, task_id, errors
    return Task(
        task_id=task_id, task_name=task_name, website=website, benchmark_name=benchmark, domain=domain,
        subdomain=subdomain, definite_answer=definite_answer,
        difficulty=difficulty, attempt_level=attempt_level, evaluator_reference=groups, max_steps=max_steps,
        reference_solution=solution, page=page,
        extra={k: v for k, v in line.rec.items() if k not in KNOWN_FIELDS}, step_caps=caps,
    ), task_id, []


def _page_hooks(line: Any) -> PageHooks | None:
    """The record's :class:`PageHooks`, or None when it has none of their fields."""
    if not any(line.rec.get(k) is not None for k in PAGE_FIELDS):
        return None

    def script(name: str) -> str | None:
        v = line.rec.get(name)
        if v is None:
            return None
        if not isinstance(v, str) or not v.strip():
            raise line.fail(name, "expected a non-empty string of JavaScript")
        return line.within(name, v, PAGE_SCRIPT_CHARS)

    source = line.rec.get("reward_source")
    if source not in (None, "page"):
        raise line.fail("reward_source", f"the only source a task file names is \"page\", got {source!r}")
    hooks = PageHooks(setup=script("setup_js"), probe=script("probe_js"), reward_from_page=source == "page")
    if hooks.reward_from_page and hooks.probe is None:
        raise line.fail("reward_source", "\"page\" needs a probe_js that reports the page's state")
    return hooks


def parse_task(rec: Any, path: Path, lineno: int | str, base_url: str | None = None, *,
               step_caps: StepCaps | Mapping[str, Any] | None = None) -> Task:
    """Validate one decoded JSON record and build a Task; raises the record's first error.

    ``lineno`` is a 1-based line number, or a position label such as ``"item 3"``.
    """
    where = f"line {lineno}" if isinstance(lineno, int) else lineno
    caps = None if step_caps is None else as_step_caps(step_caps)
    task, _, errors = _build(rec, Path(path), where, base_url, caps)
    if errors:
        raise errors[0]
    assert task is not None
    return task


def _is_json_document(path: Path, text: str) -> bool:
    """Whether ``text`` is a JSON document of tasks rather than JSONL (see the module docstring)."""
    suffix = path.suffix.lower()
    if suffix in (".json", ".jsonl"):
        return suffix == ".json"
    head = text.lstrip()
    if head.startswith("["):
        return True
    if head.startswith("{"):
        try:
            doc = json_input.loads(text)
        except ValueError:
            return False  # several objects (JSONL), or a document that _records reports
        return isinstance(doc, dict) and isinstance(doc.get("tasks"), list)
    return False


def _json_problem(exc: ValueError) -> str:
    """What the JSON reader found wrong: a syntax error with its column, arrays and objects nested too deep, or a
    number too long for an integer (Python refuses more than 4,300 digits)."""
    if isinstance(exc, json.JSONDecodeError):
        return f"{exc.msg} (column {exc.colno})"
    if isinstance(exc, json_input.NestedTooDeep):
        return "arrays or objects nested too deep"
    return str(exc).split(";")[0]


def _records(path: Path, text: str) -> Iterator[tuple[str, Any]]:
    """``(position, record)`` for every record of the file, or ``(position, TaskFileError)`` for a part that
    cannot be decoded (a bad JSONL line; for JSON, the whole document)."""
    if not _is_json_document(path, text):
        for lineno, raw in enumerate(text.splitlines(), start=1):
            if not raw.strip():
                continue
            try:
                yield f"line {lineno}", json_input.loads(raw)
            except ValueError as exc:
                yield f"line {lineno}", TaskFileError(f"{path}, line {lineno}: invalid JSON: {_json_problem(exc)}")
        return
    try:
        doc = json_input.loads(text)
    except ValueError as exc:
        where = f", line {exc.lineno}" if isinstance(exc, json.JSONDecodeError) else ""
        yield "", TaskFileError(f"{path}{where}: invalid JSON: {_json_problem(exc)}")
        return
    if isinstance(doc, dict) and isinstance(doc.get("tasks"), list):
        doc = doc["tasks"]
    if not isinstance(doc, list):
        yield "", TaskFileError(f"{path}: expected a JSON array of tasks or an object with a 'tasks' array, "
                                f"got {type(doc).__name__}")
        return
    for i, rec in enumerate(doc):
        yield f"item {i}", rec


def _scan(path: str | Path, base_url: str | None, step_caps: StepCaps | Mapping[str, Any] | None,
          first_only: bool) -> tuple[list[Task], list[TaskFileError]]:
    """The valid tasks of a file and the errors found (only the first one when ``first_only``)."""
    path = Path(path)
    caps = None if step_caps is None else as_step_caps(step_caps)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        return [], [TaskFileError(f"{path}: cannot read task file: {exc.strerror or exc}")]
    except UnicodeDecodeError as exc:
        return [], [TaskFileError(f"{path}: not UTF-8 text ({exc.reason} at byte {exc.start})")]
    tasks: list[Task] = []
    errors: list[TaskFileError] = []
    seen: dict[str, str] = {}
    for where, rec in _records(path, text):
        if isinstance(rec, TaskFileError):
            errors.append(rec)
        else:
            task, task_id, rec_errors = _build(rec, path, where, base_url, caps)
            errors.extend(rec_errors)
            if task_id is not None:
                if task_id in seen:
                    # A later record with a taken id is the bad one: the first keeps its place.
                    errors.append(TaskFileError(f"{path}, {where}: field 'task_id': duplicate {task_id!r} "
                                                f"(first on {seen[task_id]})"))
                    task = None
                else:
                    seen[task_id] = where
            if task is not None:
                tasks.append(task)
        if first_only and errors:
            return tasks, errors[:1]
    if not tasks and not errors:
        errors.append(TaskFileError(f"{path}: no tasks in file"))
    return tasks, errors


def load_tasks(path: str | Path, base_url: str | None = None,
               step_caps: StepCaps | Mapping[str, Any] | None = None) -> list[Task]:
    """Load a JSONL or JSON task file. Raises TaskFileError naming the first bad line (item) and field.

    Blank lines are skipped; task ids must be unique. ``base_url`` replaces ``{SITES}``; ``step_caps``
    (a :class:`StepCaps`, or ``{"train": (e, m, h), "test": (e, m, h)}``) sets the caps
    :meth:`Task.step_cap` uses (default: the original's, :data:`STEP_CAPS`).
    """
    tasks, errors = _scan(path, base_url, step_caps, first_only=True)
    if errors:
        raise errors[0]
    return tasks


def check_file(path: str | Path, base_url: str | None = None,
               step_caps: StepCaps | Mapping[str, Any] | None = None) -> tuple[list[Task], list[TaskFileError]]:
    """Every valid task of a file and every error in it, in file order (does not stop at the first).

    A record with several bad fields gives one error per field; a record with a duplicate ``task_id`` is
    an error (the first record with that id stays valid).
    """
    return _scan(path, base_url, step_caps, first_only=False)


def validate_file(path: str | Path, base_url: str | None = None) -> list[TaskFileError]:
    """All the errors in a task file (empty when it loads); see :func:`check_file`."""
    return check_file(path, base_url)[1]
