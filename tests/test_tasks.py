"""The task loader: WebGym records, older rubric shapes, and errors that name file, line and field."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from engine.tasks.loading import load_tasks
from engine.tasks.schema import BUNDLED_TASKS, TaskFileError

GOOD = {
    "benchmark_name": "b", "task_id": "t1", "task_name": "Find the price", "domain": "shopping",
    "subdomain": "search", "website": "example.com", "definite_answer": "$5", "difficulty": "2",
    "attempt_level": None,
    "evaluator_reference": [{"id": 1, "description": "price", "facts": ["price is $5", "in stock"]}],
}


def write(tmp_path: Path, *records: object, raw: str | None = None) -> Path:
    path = tmp_path / "tasks.jsonl"
    lines = [json.dumps(r) for r in records]
    if raw is not None:
        lines.append(raw)
    path.write_text("\n".join(lines) + "\n")
    return path


def test_webgym_record_loads_with_original_conversions(tmp_path: Path) -> None:
    [task] = load_tasks(write(tmp_path, GOOD))
    assert task.website == "https://example.com"  # a bare host gets https://
    assert task.difficulty == 2 and task.attempt_level == 0
    assert task.rubric_items() == ["[Group 1: price] price is $5", "[Group 1: price] in stock"]
    assert task.step_cap("train") == 10 and task.step_cap("test") == 30


@pytest.mark.parametrize("ref, n_items", [
    ("the page shows the price", 1),
    (["fact one", "fact two"], 2),
    ([{"description": "old style", "difficulty": 3}], 1),
])
def test_older_rubric_shapes(tmp_path: Path, ref: object, n_items: int) -> None:
    [task] = load_tasks(write(tmp_path, {**GOOD, "evaluator_reference": ref}))
    assert len(task.rubric_items()) == n_items


def test_step_caps_by_difficulty_and_override(tmp_path: Path) -> None:
    recs = [{**GOOD, "task_id": f"d{d}", "difficulty": d} for d in (1, 4, 7)]
    recs.append({**GOOD, "task_id": "long", "difficulty": 1, "max_steps": 45})
    caps = {t.task_id: (t.step_cap("train"), t.step_cap("test")) for t in load_tasks(write(tmp_path, *recs))}
    assert caps == {"d1": (10, 30), "d4": (20, 50), "d7": (30, 70), "long": (45, 45)}


def test_sites_placeholder_is_replaced(tmp_path: Path) -> None:
    rec = {**GOOD, "website": "{SITES}/shop/", "reference_solution": [{"action": "navigate", "url": "{SITES}/x"}]}
    [task] = load_tasks(write(tmp_path, rec), base_url="http://127.0.0.1:9")
    assert task.website == "http://127.0.0.1:9/shop/"
    assert task.reference_solution[0]["url"] == "http://127.0.0.1:9/x"


@pytest.mark.parametrize("mutate, needle", [
    (lambda r: r.pop("task_id"), "line 2: field 'task_id': missing"),
    (lambda r: r.update(task_name=""), "line 2: field 'task_name': empty"),
    (lambda r: r.update(difficulty="hard"), "line 2: field 'difficulty': expected an integer"),
    (lambda r: r.update(website=["x"]), "line 2: field 'website': expected a string"),
    (lambda r: r.update(evaluator_reference={"a": 1}), "line 2: field 'evaluator_reference'"),
    (lambda r: r.update(evaluator_reference=[{"id": 1, "facts": []}]), "evaluator_reference[0].facts"),
    (lambda r: r.update(evaluator_reference=[{"id": 1, "facts": ["a", "b"], "checks": [{"kind": "url",
                                                                                        "contains": "x"}]}]),
     "evaluator_reference[0].checks': expected one check per fact"),
    (lambda r: r.update(evaluator_reference=[{"id": 1, "facts": ["a"], "checks": [{"kind": "magic"}]}]),
     "checks[0]': kind must be one of"),
    (lambda r: r.update(reference_solution=[{"action": "teleport"}]), "reference_solution[0]"),
    (lambda r: r.update(setup_js=42), "line 2: field 'setup_js': expected a non-empty string of JavaScript"),
    (lambda r: r.update(reward_source="judge"), "field 'reward_source': the only source a task file names"),
    (lambda r: r.update(reward_source="page"), "field 'reward_source': \"page\" needs a probe_js"),
])
def test_bad_record_names_line_and_field(tmp_path: Path, mutate, needle: str) -> None:  # type: ignore[no-untyped-def]
    bad = json.loads(json.dumps(GOOD))
    bad["task_id"] = "t2"
    mutate(bad)
    path = write(tmp_path, GOOD, bad)
    with pytest.raises(TaskFileError) as err:
        load_tasks(path)
    assert str(path) in str(err.value)
    assert needle in str(err.value)


def test_invalid_json_duplicate_and_empty(tmp_path: Path) -> None:
    with pytest.raises(TaskFileError, match=r", line 2: invalid JSON"):
        load_tasks(write(tmp_path, GOOD, raw="{not json"))
    with pytest.raises(TaskFileError, match=r", line 2: field 'task_id': duplicate 't1' \(first on line 1\)"):
        load_tasks(write(tmp_path, GOOD, GOOD))
    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n\n")
    with pytest.raises(TaskFileError, match="no tasks"):
        load_tasks(empty)
    with pytest.raises(TaskFileError, match="cannot read"):
        load_tasks(tmp_path / "missing.jsonl")
    with pytest.raises(TaskFileError, match=", line 1: expected a JSON object"):
        load_tasks(write(tmp_path, [1, 2]))


def test_bundled_tasks_are_complete() -> None:
    tasks = load_tasks(BUNDLED_TASKS, base_url="http://127.0.0.1:1")
    assert len(tasks) >= 100
    sites = {t.website.split("/")[3] for t in tasks}
    assert sites >= {"shop", "wiki", "travel", "forum"}
    lengths = [len(t.reference_solution) for t in tasks]
    assert min(lengths) <= 2 and max(lengths) >= 20
    for t in tasks:
        assert t.difficulty == sum(len(g.facts) for g in t.evaluator_reference), t.task_id
        assert t.has_checks and all(len(g.checks) == len(g.facts) for g in t.evaluator_reference), t.task_id
        assert t.step_cap() >= len(t.reference_solution), t.task_id
        assert "{SITES}" not in json.dumps(t.reference_solution), t.task_id
