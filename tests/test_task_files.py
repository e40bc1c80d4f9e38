"""Task files at scale and the ``tasks`` tools: JSONL/JSON loading, complete validation, step caps,
statistics, sampling, decomposition (with a model rewrite over real HTTP) and the ``tasks`` commands.

The 1,000+ record file is generated here (:func:`make_webgym_records`), with the generator's own counts
to compare the statistics against.
"""

from __future__ import annotations

import asyncio
import json
import random
import subprocess
import sys
from collections import Counter
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio
from click.testing import CliRunner

from cli.task_tools import (
    SUBTASK_TEMPLATE,
    decomposable,
    decompose,
    decompose_async,
    model_rewriter,
    sample,
    stats,
    subsets,
    write_jsonl,
)
from cli.tasks import tasks as tasks_cli
from engine.agent.model_api import ChatRequest, Generation, LanguageModel
from engine.tasks.loading import check_file, load_tasks, validate_file
from engine.tasks.schema import BUNDLED_TASKS, StepCaps, Task, TaskFileError
from policy.openai_backend import OpenAIModel
from tests.chat_test_server import ChatTestServer

pytestmark = pytest.mark.timeout(60)
REPO = Path(__file__).resolve().parent.parent

# -- the generated WebGym-format file -------------------------------------------------------------------

DOMAINS = {"shopping": ["search", "cart", "compare"], "travel": ["flights", "hotels"],
           "reference": ["lookup", "multi-hop"], "government": ["forms"], "": [""]}
HOSTS = ["www.amazon.com", "en.wikipedia.org", "booking.com", "data.gov.uk", "news.ycombinator.com",
         "Docs.Python.org", "localhost"]
BENCHMARKS = ["webgym-train", "webvoyager", "mind2web", ""]


def make_webgym_records(n: int = 1200, seed: int = 1234) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """``n`` records with every WebGym field, and the counts :func:`stats` should find (split = train).

    Varied: domains (one empty), websites with and without a scheme (and a path, upper case), difficulty
    1..12 (sometimes as a string), definite_answer null / empty / text / a number, rubric as fact groups
    or an older shape (a string, a list of strings, ``{description, difficulty}`` objects), attempt_level
    null or 0..2, and every 50th record with its own ``"split": "test"``.
    """
    rng = random.Random(seed)
    records: list[dict[str, Any]] = []
    exp: dict[str, Counter] = {k: Counter() for k in ("split", "bucket", "difficulty", "facts", "domain",
                                                      "subdomain", "host", "benchmark")}
    answers = decomposable_n = 0
    for i in range(n):
        difficulty = 1 + i % 12
        domain = rng.choice(sorted(DOMAINS))
        subdomain = rng.choice(DOMAINS[domain])
        host = HOSTS[i % len(HOSTS)]
        website = [f"https://{host}/", f"http://{host}/path?q={i}", host, f"{host}/deep/link"][i % 4]
        benchmark = BENCHMARKS[i % len(BENCHMARKS)]
        answer: Any = [None, "", f"answer {i}", 42][i % 4]
        shape = i % 10
        if shape == 0:
            ref: Any = f"The page shows item {i}"
            n_facts, groups = 1, [1]
        elif shape == 1:
            ref = [f"fact {i}.{j}" for j in range(1 + i % 3)]
            n_facts, groups = len(ref), [1] * len(ref)
        elif shape == 2:
            ref = [{"description": f"old item {i}.{j}", "difficulty": 2} for j in range(1 + i % 2)]
            n_facts, groups = len(ref), [1] * len(ref)
        else:  # fact groups: the difficulty's facts split into 1..4 groups
            k = rng.randint(1, min(4, difficulty))
            cuts = sorted(rng.sample(range(1, difficulty), k - 1)) if k > 1 else []
            groups = [b - a for a, b in zip([0, *cuts], [*cuts, difficulty], strict=True)]
            ref = [{"id": g + 1, "description": f"group {g + 1} of task {i}",
                    "facts": [f"fact {i}.{g}.{j}" for j in range(size)]} for g, size in enumerate(groups)]
            n_facts = difficulty
        rec = {"benchmark_name": benchmark, "task_name": f"Task number {i}: find things on {host}",
               "domain": domain, "subdomain": subdomain, "website": website, "definite_answer": answer,
               "task_id": f"gen-{i:05d}", "difficulty": str(difficulty) if i % 7 == 0 else difficulty,
               "evaluator_reference": ref, "attempt_level": None if i % 5 == 0 else i % 3}
        split = "train"
        if i % 50 == 0:
            rec["split"] = split = "test"
        records.append(rec)
        exp["split"][split] += 1
        exp["bucket"]["easy" if difficulty <= 3 else "medium" if difficulty <= 6 else "hard"] += 1
        exp["difficulty"][difficulty] += 1
        exp["facts"][n_facts] += 1
        exp["domain"][domain or "(none)"] += 1
        exp["subdomain"][subdomain or "(none)"] += 1
        exp["host"][host.lower()] += 1
        exp["benchmark"][benchmark or "(none)"] += 1
        answers += answer not in (None, "")
        decomposable_n += len(groups) >= 2 and max(groups) >= 3
    expected = {k: dict(v) for k, v in exp.items()}
    expected.update(with_definite_answer=answers, decomposable=decomposable_n, total=n)
    return records, expected


def write_lines(path: Path, *lines: Any) -> Path:
    """A JSONL file: dicts are JSON-encoded, strings written as they are (for broken lines)."""
    path.write_text("\n".join(line if isinstance(line, str) else json.dumps(line) for line in lines) + "\n")
    return path


@pytest.fixture(scope="module")
def generated(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[dict[str, Any]], dict[str, Any]]:
    records, expected = make_webgym_records()
    path = tmp_path_factory.mktemp("gen") / "train.jsonl"
    write_lines(path, *records)
    return path, records, expected


def test_generated_file_loads_and_stats_match_the_generator(generated: Any) -> None:
    path, records, expected = generated
    tasks = load_tasks(path)
    assert len(tasks) == len(records) >= 1000
    s = stats(tasks, split="train")
    assert s["total"] == expected["total"]
    assert s["by_split"] == expected["split"]  # a record's own split wins over the file's
    assert s["by_bucket"] == expected["bucket"]
    assert s["by_difficulty"] == expected["difficulty"] and set(s["by_difficulty"]) == set(range(1, 13))
    assert s["by_facts"] == expected["facts"]
    assert s["by_domain"] == expected["domain"]
    assert s["by_subdomain"] == expected["subdomain"]
    assert s["by_host"] == expected["host"]
    assert s["by_benchmark"] == expected["benchmark"]
    assert s["with_definite_answer"] == expected["with_definite_answer"]
    assert s["decomposable"] == expected["decomposable"]
    facts = sorted(k for k, v in expected["facts"].items() for _ in range(v))
    assert s["facts_per_task"]["min"] == facts[0] and s["facts_per_task"]["max"] == facts[-1]
    assert s["facts_per_task"]["median"] == (facts[len(facts) // 2 - 1] + facts[len(facts) // 2]) / 2
    # Without --split and without own fields, records count under "(none)".
    assert stats(tasks)["by_split"] == {"(none)": expected["split"]["train"], "test": expected["split"]["test"]}
    assert validate_file(path) == []


def test_malformed_file_reports_every_error_with_its_line(tmp_path: Path) -> None:
    good = {"task_id": "a1", "task_name": "Find it", "website": "example.com", "difficulty": 1,
            "evaluator_reference": [{"id": 1, "description": "d", "facts": ["f"]}]}
    path = write_lines(
        tmp_path / "bad.jsonl",
        good,                                                                 # 1
        '{"task_id": "x", "task_name": ',                                     # 2 bad JSON
        {k: v for k, v in good.items() if k != "task_id"},                    # 3 no task_id
        {**good, "task_id": "a2"},                                            # 4
        good,                                                                 # 5 duplicate a1
        {**good, "task_id": "a3", "difficulty": "abc"},                       # 6
        {**good, "task_id": "a4", "evaluator_reference": 42},                 # 7
        {**good, "task_id": "a5", "task_name": ""},                           # 8
        "",                                                                   # 9 blank: skipped
        {**good, "task_id": "a6", "task_name": " ", "difficulty": "x"},       # 10 two errors
        {**good, "task_id": "a7", "evaluator_reference": {"facts": ["x"]}},   # 11
        {**good, "task_id": "a8"},                                            # 12
    )
    valid, errors = check_file(path)
    assert [t.task_id for t in valid] == ["a1", "a2", "a8"]
    got = [str(e) for e in errors]
    p = str(path)
    assert got == [
        f"{p}, line 2: invalid JSON: Expecting value (column 31)",
        f"{p}, line 3: field 'task_id': missing",
        f"{p}, line 5: field 'task_id': duplicate 'a1' (first on line 1)",
        f"{p}, line 6: field 'difficulty': expected an integer, got 'abc'",
        f"{p}, line 7: field 'evaluator_reference': expected a list of fact groups, got int",
        f"{p}, line 8: field 'task_name': empty",
        f"{p}, line 10: field 'task_name': empty",
        f"{p}, line 10: field 'difficulty': expected an integer, got 'x'",
        f"{p}, line 11: field 'evaluator_reference': expected a list of fact groups, got dict",
    ]
    assert [str(e) for e in validate_file(path)] == got
    with pytest.raises(TaskFileError) as err:  # load_tasks still stops at the first
        load_tasks(path)
    assert str(err.value) == got[0]
    [missing] = validate_file(tmp_path / "missing.jsonl")
    assert str(missing).endswith("cannot read task file: No such file or directory")
    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n")
    assert [str(e) for e in validate_file(empty)] == [f"{empty}: no tasks in file"]


def test_runaway_values_are_errors_that_name_their_line_and_field(tmp_path: Path) -> None:
    # Before, a number of 5,000 digits or arrays nested 50,000 deep raised out of json.loads past the loader (a
    # traceback from `tasks validate`, a bare "Error: Exceeds the limit..." from `run`), and a 1 MB task name was
    # taken as it was: one 10-step episode's record then held 11 MB, the task's text once in each step's prompt.
    good = {"task_id": "a1", "task_name": "Find it", "website": "example.com",
            "evaluator_reference": [{"id": 1, "description": "d", "facts": ["f"]}]}
    path = write_lines(
        tmp_path / "runaway.jsonl",
        good,                                                                           # 1
        '{"task_id": "n", "task_name": "t", "website": "w", "difficulty": ' + "9" * 5000 + "}",  # 2
        "[" * 50_000 + "]" * 50_000,                                                    # 3
        {**good, "task_id": "a2", "task_name": "x" * 40_000},                           # 4
        {**good, "task_id": "a3", "evaluator_reference": [{"facts": ["f" * 40_000]}]},  # 5
        {**good, "task_id": "a4", "evaluator_reference": [{"facts": ["f"] * 1001}]},   # 6
        {**good, "task_id": "a5", "definite_answer": "y" * 40_000},                     # 7
        {**good, "task_id": "i" * 2000},                                                # 8
        {**good, "task_id": "a6", "task_name": "x" * 32_768},                           # 9: at the limit
    )
    valid, errors = check_file(path)
    assert [t.task_id for t in valid] == ["a1", "a6"]
    p = str(path)
    assert [str(e) for e in errors] == [
        f"{p}, line 2: invalid JSON: Exceeds the limit (4300 digits) for integer string conversion: value has "
        "5000 digits",
        f"{p}, line 3: invalid JSON: arrays or objects nested too deep",
        f"{p}, line 4: field 'task_name': 40,000 characters, over the limit of 32,768",
        f"{p}, line 5: field 'evaluator_reference[0].facts[0]': 40,000 characters, over the limit of 32,768",
        f"{p}, line 6: field 'evaluator_reference': more than 1,000 facts",
        f"{p}, line 7: field 'definite_answer': 40,000 characters, over the limit of 32,768",
        f"{p}, line 8: field 'task_id': 2,000 characters, over the limit of 1,024",
    ]
    document = tmp_path / "deep.json"
    document.write_text("[" * 50_000 + "]" * 50_000)
    assert [str(e) for e in validate_file(document)] == [f"{document}: invalid JSON: arrays or objects nested too deep"]
    res = CliRunner().invoke(tasks_cli, ["validate", str(path)])
    assert res.exit_code == 1 and "line 3: invalid JSON: arrays or objects nested too deep" in res.output


def _rec(task_id: str, *group_sizes: int, **kw: Any) -> dict[str, Any]:
    return {"task_id": task_id, "task_name": f"Do {task_id}.", "website": "shop.example", "domain": "shopping",
            "definite_answer": "yes", "attempt_level": 0,
            "evaluator_reference": [{"id": g + 1, "description": f"part {g + 1}",
                                     "facts": [f"{task_id} fact {g + 1}.{j + 1}" for j in range(n)],
                                     "checks": [{"kind": "answer", "contains": f"{g + 1}.{j + 1}"} for j in range(n)]}
                                    for g, n in enumerate(group_sizes)], **kw}


def test_json_files_load_with_item_positions(tmp_path: Path) -> None:
    recs = [_rec("j1", 1), _rec("j2", 2, 3)]
    arr = tmp_path / "tasks.json"
    arr.write_text(json.dumps(recs, indent=2))
    assert [t.task_id for t in load_tasks(arr)] == ["j1", "j2"]
    obj = tmp_path / "wrapped.json"
    obj.write_text(json.dumps({"split": "test", "tasks": recs}))
    assert [t.difficulty for t in load_tasks(obj)] == [1, 5]
    sniffed = tmp_path / "tasks.txt"  # no telling suffix: a leading '[' means JSON
    sniffed.write_text(json.dumps(recs))
    assert len(load_tasks(sniffed)) == 2
    one_line = tmp_path / "one.data"  # a single JSONL record is not mistaken for a JSON document
    one_line.write_text(json.dumps(recs[0]) + "\n")
    assert len(load_tasks(one_line)) == 1

    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps([recs[0], {**recs[1], "task_id": ""}, recs[0], [1]]))
    assert [str(e) for e in validate_file(bad)] == [
        f"{bad}, item 1: field 'task_id': empty",
        f"{bad}, item 2: field 'task_id': duplicate 'j1' (first on item 0)",
        f"{bad}, item 3: expected a JSON object, got list",
    ]
    broken = tmp_path / "broken.json"
    broken.write_text('[\n  {"task_id": "a"},\n  oops\n]')
    with pytest.raises(TaskFileError, match=r"broken.json, line 3: invalid JSON"):
        load_tasks(broken)
    scalar = tmp_path / "scalar.json"
    scalar.write_text('{"no": "tasks"}')
    with pytest.raises(TaskFileError, match="expected a JSON array of tasks"):
        load_tasks(scalar)


def test_buckets_and_step_caps_default_and_configured(tmp_path: Path) -> None:
    path = write_lines(tmp_path / "t.jsonl", *[{**_rec(f"d{d}", 1), "difficulty": d} for d in range(1, 13)],
                       {**_rec("long", 1), "max_steps": 45})
    tasks = {t.task_id: t for t in load_tasks(path)}
    assert [tasks[f"d{d}"].bucket for d in range(1, 13)] == ["easy"] * 3 + ["medium"] * 3 + ["hard"] * 6
    assert [(tasks[f"d{d}"].step_cap("train"), tasks[f"d{d}"].step_cap("test")) for d in (3, 4, 6, 7, 12)] == [
        (10, 30), (20, 50), (20, 50), (30, 70), (30, 70)]
    assert tasks["long"].step_cap() == 45 and tasks["long"].step_cap("test") == 45

    caps = StepCaps(train=(5, 6, 7), test=(8, 9, 100))
    configured = {t.task_id: t for t in load_tasks(path, step_caps=caps)}
    assert [configured[f"d{d}"].step_cap() for d in (1, 5, 9)] == [5, 6, 7]
    assert [configured[f"d{d}"].step_cap("test") for d in (1, 5, 9)] == [8, 9, 100]
    assert configured["long"].step_cap("test") == 45  # max_steps still raises the cap
    as_dict = load_tasks(path, step_caps={"train": [2, 3, 4]})  # test keeps the default
    assert [t.step_cap("train") for t in as_dict[:7:3]] == [2, 3, 4]
    assert as_dict[0].step_cap("test") == 30
    assert configured["d1"] == tasks["d1"]  # the caps are settings, not part of the task's identity
    with pytest.raises(ValueError, match="three positive integers"):
        StepCaps(train=(10, 0, 30))
    with pytest.raises(ValueError, match="unknown split"):
        load_tasks(path, step_caps={"valid": (1, 2, 3)})
    with pytest.raises(ValueError, match="unknown split"):
        tasks["d1"].step_cap("dev")


def test_sample_is_deterministic_and_stratified(generated: Any) -> None:
    tasks = load_tasks(generated[0])
    a = sample(tasks, 100, seed=3)
    assert [t.task_id for t in a] == [t.task_id for t in sample(tasks, 100, seed=3)]
    assert [t.task_id for t in a] != [t.task_id for t in sample(tasks, 100, seed=4)]
    assert len({t.task_id for t in a}) == 100
    order = {t.task_id: i for i, t in enumerate(tasks)}
    assert [order[t.task_id] for t in a] == sorted(order[t.task_id] for t in a)  # input order kept
    strat = sample(tasks, 100, seed=3, stratify_by="bucket")
    assert Counter(t.bucket for t in strat) == {"easy": 25, "medium": 25, "hard": 50}  # 300/300/600 of 1200
    assert [t.task_id for t in strat] == [t.task_id for t in sample(tasks, 100, seed=3, stratify_by="bucket")]
    assert sample(tasks, 5000) == tasks and sample(tasks, 0) == []
    # Largest remainder: 7 easy + 3 hard, 5 drawn -> 3.5 / 1.5 -> 3 / 1, the seat left to the first ("easy").
    small = [Task(f"s{i}", "x", "https://x", difficulty=1 if i < 7 else 9) for i in range(10)]
    assert Counter(t.bucket for t in sample(small, 5, stratify_by="bucket")) == {"easy": 4, "hard": 1}
    assert Counter(t.bucket for t in sample(small, 4, seed=9, stratify_by="bucket")) == {"easy": 3, "hard": 1}
    with pytest.raises(ValueError, match="unknown stratum"):
        sample(tasks, 3, stratify_by="colour")
    with pytest.raises(ValueError):
        sample(tasks, -1)


@pytest.fixture
def hand_tasks(tmp_path: Path) -> list[Task]:
    path = write_lines(
        tmp_path / "hand.jsonl",
        _rec("two", 3, 1),                    # eligible, 2 groups: {1}, {2}
        _rec("three", 1, 3, 2, max_steps=40, split="train", reference_solution=[{"action": "answer", "text": "1.1"}]),
        _rec("flat", 2, 2),                   # no group with 3+ facts
        _rec("single", 5),                    # one group only
        {**_rec("old", 1), "evaluator_reference": ["a", "b", "c"]},  # older shape: one fact per item
        _rec("four", 3, 1, 1, 2, attempt_level=2),
    )
    return load_tasks(path)


def test_decompose_rule_ids_rubrics_and_counts(hand_tasks: list[Task], tmp_path: Path) -> None:
    assert subsets(2) == [(0,), (1,)]
    assert subsets(3) == [(0,), (1,), (2,), (1, 2), (0, 2), (0, 1)]
    assert [decomposable(t) for t in hand_tasks] == [True, True, False, False, False, True]
    records = decompose(hand_tasks)
    assert [r["task_id"] for r in records] == [
        "two::sub-1", "two::sub-2",
        "three::sub-1", "three::sub-2", "three::sub-3", "three::sub-2-3", "three::sub-1-3", "three::sub-1-2",
        "four::sub-1", "four::sub-2", "four::sub-3", "four::sub-4",
        "four::sub-2-3-4", "four::sub-1-3-4", "four::sub-1-2-4", "four::sub-1-2-3"]
    by_id = {r["task_id"]: r for r in records}
    parents = {t.task_id: t for t in hand_tasks}
    for rec in records:
        parent = parents[rec["parent_task_id"]]
        kept = [g["id"] for g in rec["evaluator_reference"]]
        all_ids = [g.id for g in parent.evaluator_reference]
        assert 0 < len(kept) < len(all_ids) and set(kept) < set(all_ids)  # proper, non-empty
        assert kept == [all_ids[i - 1] for i in rec["sub_groups"]]
        assert rec["difficulty"] == sum(len(g["facts"]) for g in rec["evaluator_reference"])
        assert rec["attempt_level"] == parent.attempt_level + 1
        assert rec["definite_answer"] is None and rec["task_name_source"] == "template"
        for g in rec["evaluator_reference"]:  # groups carried whole, checks included
            src = parent.evaluator_reference[int(g["id"]) - 1]
            assert g == src.to_dict() and len(g["checks"]) == len(g["facts"])
    three = by_id["three::sub-2-3"]
    assert three["task_name"] == "Do three. (Only this part is checked: part 2; part 3.)"
    assert three["task_name"] == SUBTASK_TEMPLATE.format(task="Do three.", parts="part 2; part 3")
    assert [g["facts"] for g in three["evaluator_reference"]] == [
        ["three fact 2.1", "three fact 2.2", "three fact 2.3"], ["three fact 3.1", "three fact 3.2"]]
    assert three["max_steps"] == 40 and three["split"] == "train"  # parent's settings and fields kept
    assert three["reference_solution"] == [{"action": "answer", "text": "1.1"}]
    assert by_id["four::sub-1"]["attempt_level"] == 3
    assert decompose([t for t in hand_tasks if not decomposable(t)]) == []

    out = tmp_path / "subs.jsonl"
    assert write_jsonl(records, out) == 16
    loaded = load_tasks(out)
    assert [t.task_id for t in loaded] == [r["task_id"] for r in records]
    assert all(t.extra["parent_task_id"] in parents and t.definite_answer is None for t in loaded)
    nested = decompose(loaded)  # sub-tasks decompose again where the rule allows: (3, 2) does, (1, 1, 2) not
    assert nested == decompose(loaded)
    assert [r["task_id"] for r in nested[:2]] == ["three::sub-2-3::sub-1", "three::sub-2-3::sub-2"]
    assert nested[0]["attempt_level"] == 2 and nested[0]["parent_task_id"] == "three::sub-2-3"
    assert len(nested) == 22


def test_decompose_generated_and_bundled_counts(generated: Any) -> None:
    tasks = load_tasks(generated[0])
    records = decompose(tasks)
    k = [len(t.evaluator_reference) for t in tasks if decomposable(t)]
    assert len(k) == generated[2]["decomposable"] > 0
    assert len(records) == sum(n if n == 2 else 2 * n for n in k)
    assert len({r["task_id"] for r in records}) == len(records)
    bundled = load_tasks(BUNDLED_TASKS)
    k = [len(t.evaluator_reference) for t in bundled if decomposable(t)]
    assert len(k) >= 10  # the bundled set has tasks to decompose (17 of 136 when this was written)
    assert len(decompose(bundled)) == sum(n if n == 2 else 2 * n for n in k)


# -- rewriting through a model over real HTTP -----------------------------------------------------------

class CannedRewriteModel(LanguageModel):
    """A test stand-in for a model: replies with a reasoning block and a quoted ``Rewritten: <user text>``."""

    name = "canned-rewrite"

    async def generate(self, request: ChatRequest) -> Generation:
        user = request.messages[-1]["content"][-1]["text"]
        return Generation(text=f'<think>short</think> "Rewritten: {user}"', finish_reason="stop")


@pytest_asyncio.fixture
async def rewrite_server() -> AsyncIterator[ChatTestServer]:
    async with ChatTestServer(CannedRewriteModel()) as srv:
        yield srv


async def test_rewrite_through_openai_backend_and_failure_keeps_template(
        rewrite_server: ChatTestServer, hand_tasks: list[Task]) -> None:
    model = OpenAIModel(rewrite_server.base_url, "test-model", retries=0)
    await model.start()
    try:
        rewrite_server.fail_next(1, 500, message="model overloaded")
        three = [t for t in hand_tasks if t.task_id == "three"]
        records = await decompose_async(three, model_rewriter(model), concurrency=1)
    finally:
        await model.close()
    templates = decompose(three)
    assert len(records) == 6
    assert records[0]["task_name"] == templates[0]["task_name"]  # the failed one keeps the template
    assert records[0]["task_name_source"] == "template"
    assert "HTTP 500" in records[0]["rewrite_error"] and "model overloaded" in records[0]["rewrite_error"]
    for rec, tpl in zip(records[1:], templates[1:], strict=True):
        assert rec["task_name"] == f"Rewritten: {tpl['task_name']}" and rec["task_name_source"] == "rewrite"
        assert "rewrite_error" not in rec
    payload = rewrite_server.received[-1].payload
    assert payload["temperature"] == 0 and payload["model"] == "test-model"
    assert payload["messages"][0]["role"] == "system"


async def test_rewrite_that_raises_or_is_empty(hand_tasks: list[Task]) -> None:
    async def flaky(text: str) -> str:
        if "part 1" in text:
            raise RuntimeError("boom")
        return "  " if "part 3" in text else text.upper()

    recs = await decompose_async([t for t in hand_tasks if t.task_id == "two"], flaky)
    assert recs[0]["rewrite_error"] == "RuntimeError: boom"
    assert recs[1]["task_name"] == "DO TWO. (ONLY THIS PART IS CHECKED: PART 2.)"
    recs = await decompose_async([t for t in hand_tasks if t.task_id == "three"], flaky)
    assert recs[2]["rewrite_error"] == "ValueError: the model returned an empty rewrite"


# -- the command line ------------------------------------------------------------------------------------

def test_cli_validate(tmp_path: Path, generated: Any) -> None:
    bad = write_lines(tmp_path / "bad.jsonl", _rec("a", 1), "{oops", {**_rec("b", 1), "difficulty": "abc"})
    result = CliRunner().invoke(tasks_cli, ["validate", str(generated[0]), str(bad)])
    assert result.exit_code == 1, result.output
    lines = result.output.splitlines()
    assert f"{generated[0]}: {len(generated[1])} valid records, ok" in lines
    assert f"{bad}, line 2: invalid JSON: Expecting property name enclosed in double quotes (column 2)" in lines
    assert f"{bad}, line 3: field 'difficulty': expected an integer, got 'abc'" in lines
    assert f"{bad}: 1 valid record, 2 errors" in lines
    result = CliRunner().invoke(tasks_cli, ["validate", "--max-errors", "1", str(bad)])
    assert "1 more errors not shown" in result.output and result.exit_code == 1
    ok = CliRunner().invoke(tasks_cli, ["validate", str(BUNDLED_TASKS)])
    assert ok.exit_code == 0 and "136 valid records, ok" in ok.output


def test_cli_stats(generated: Any) -> None:
    path, _, expected = generated
    result = CliRunner().invoke(tasks_cli, ["stats", str(path), "--split", "train", "--json"])
    assert result.exit_code == 0, result.output
    got = json.loads(result.stdout)
    assert got["by_split"] == expected["split"] and got["by_bucket"] == expected["bucket"]
    assert got["by_difficulty"] == {str(k): v for k, v in expected["difficulty"].items()}
    assert got["by_host"] == expected["host"]
    table = CliRunner().invoke(tasks_cli, ["stats", str(path), "--split", "test"], env={"COLUMNS": "120"})
    assert table.exit_code == 0, table.output
    for needle in ("by difficulty bucket", "hard (7+)", "test step cap", "by website host", "en.wikipedia.org",
                   "decomposable"):
        assert needle in table.output
    broken = path.parent / "broken.jsonl"
    broken.write_text("{}\n")
    failed = CliRunner().invoke(tasks_cli, ["stats", str(broken)])
    assert failed.exit_code == 1 and "line 1: field 'task_id': missing" in failed.output


def test_cli_sample(generated: Any, tmp_path: Path) -> None:
    path = generated[0]
    out = tmp_path / "sample.jsonl"
    result = CliRunner().invoke(tasks_cli, ["sample", str(path), "40", "--seed", "7", "--stratify", "bucket",
                                            "-o", str(out)])
    assert result.exit_code == 0, result.output
    assert "sampled 40 of 1200 tasks" in result.output
    want = sample(load_tasks(path), 40, seed=7, stratify_by="bucket")
    assert load_tasks(out) == want  # written records load back to the same tasks
    stdout = CliRunner().invoke(tasks_cli, ["sample", str(path), "3"])
    assert [json.loads(line)["task_id"] for line in stdout.stdout.splitlines()] == [
        t.task_id for t in sample(load_tasks(path), 3)]


def test_cli_decompose(hand_tasks: list[Task], tmp_path: Path) -> None:
    src = tmp_path / "hand.jsonl"
    out = tmp_path / "subs.jsonl"
    result = CliRunner().invoke(tasks_cli, ["decompose", str(src), str(out)])
    assert result.exit_code == 0, result.output
    assert "6 tasks read, 3 eligible parents, 16 sub-tasks written" in result.output
    assert "sub-tasks by difficulty: 1: 4, 2: 2, 3: 4, 4: 2, 5: 2, 6: 2" in result.output
    assert [t.task_id for t in load_tasks(out)] == [r["task_id"] for r in decompose(hand_tasks)]
    usage = CliRunner().invoke(tasks_cli, ["decompose", str(src), str(out), "--rewrite-model", "m"])
    assert usage.exit_code == 2 and "go together" in usage.output


async def test_cli_decompose_with_rewrite(rewrite_server: ChatTestServer, hand_tasks: list[Task],
                                          tmp_path: Path) -> None:
    src, out = tmp_path / "hand.jsonl", tmp_path / "subs.jsonl"
    rewrite_server.fail_next(1, 400, message="bad request")  # not retried: that sub-task keeps its template
    # In a thread: the CLI runs its own event loop, while this one serves the test server.
    result = await asyncio.to_thread(CliRunner().invoke, tasks_cli, [
        "decompose", str(src), str(out), "--rewrite-base-url", rewrite_server.base_url,
        "--rewrite-model", "test-model", "--rewrite-concurrency", "1"])
    assert result.exit_code == 0, result.output
    assert "rewritten: 15, rewrite failed (template text kept): 1" in result.output
    recs = [json.loads(line) for line in out.read_text().splitlines()]
    failed = [r for r in recs if "rewrite_error" in r]
    assert len(failed) == 1 and "HTTP 400" in failed[0]["rewrite_error"]
    assert failed[0]["task_name"].endswith("(Only this part is checked: part 1.)")
    assert all(r["task_name"].startswith("Rewritten: Do ") for r in recs if r is not failed[0])
    assert len(load_tasks(out)) == 16


def test_module_entry_point_in_a_subprocess(tmp_path: Path) -> None:
    bad = write_lines(tmp_path / "bad.jsonl", _rec("a", 1), {**_rec("b", 1), "website": ["x"]})
    proc = subprocess.run([sys.executable, "-m", "cli.tasks", "validate", str(bad)], cwd=REPO,
                          capture_output=True, text=True, timeout=30)
    assert proc.returncode == 1, proc.stderr
    assert proc.stdout.splitlines() == [f"{bad}, line 2: field 'website': expected a string, got list",
                                        f"{bad}: 1 valid record, 1 error"]
