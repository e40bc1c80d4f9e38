"""The typed records of a run directory (:mod:`engine.store.records`): a real run reads back validated and exactly as
written; another record format, or a complete line that is not a record, is refused with a message naming the
file, the line and what to do; a torn last line is left out."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio
from click.testing import CliRunner

from engine.rewards.judge_queue import JudgeQueue
from engine.rewards.programmatic import FactVerdict, Reward
from engine.store.records import (
    FORMAT_VERSION,
    READABLE_VERSIONS,
    EpisodeRecord,
    Judgement,
    RecordFormatError,
    StepRecord,
    decode_judgement,
    decode_record,
)
from engine.store.run_dir import RunStore, read_manifest, read_records
from engine.tasks.loading import parse_task
from train.cli import export
from viewer.cli import view
from viewer.report import summarize

pytestmark = pytest.mark.asyncio(loop_scope="session")

# What the engine writes only sometimes (EpisodeRecord, StepRecord): everything else it always writes.
EPISODE_SOMETIMES = {"open_events", "judged_at", "judge_error", "traffic"}
STEP_ALWAYS = {"step", "url", "title", "screenshot", "settled", "action", "action_text", "reply", "thought",
               "parse_error", "policy_version", "timings_ms"}
STEP_IF_ACTED = {"point", "note", "page_changed", "result"}



class _Judge:
    """Stands in for the rubric judge: every episode succeeds."""

    async def judge(self, task: Any, answer: str | None, screenshots: list[tuple[str, bytes]],
                    steps: list[str] | None = None) -> Reward:
        facts = [FactVerdict("1", "the page shows it", "judge", True, "seen")]
        return Reward(1.0, "judge", "all facts met", facts, {"screenshots": [r for r, _ in screenshots]})


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def real_run(tmp_path_factory: pytest.TempPathFactory, engine_run: Path) -> Path:
    """A run written by the engine (a copy of ``engine_run``: scripted successes, random failures), and a judge
    verdict appended by the judge queue for one of its episodes."""
    run_dir = Path(shutil.copytree(engine_run, tmp_path_factory.mktemp("records") / "run"))
    record = read_records(run_dir)[-1]
    store = RunStore(run_dir)
    try:
        await JudgeQueue(_Judge(), store).judge_record(  # type: ignore[arg-type]
            parse_task(record["task"], run_dir / "episodes.jsonl", "record"), record)
    finally:
        store.close()
    return run_dir


def lines_of(run_dir: Path, name: str = "episodes.jsonl") -> list[bytes]:
    return (run_dir / name).read_bytes().splitlines()


def copy_run(real_run: Path, dest: Path, lines: list[bytes], tail: bytes = b"") -> Path:
    """A run directory of ``lines`` (each written with its newline), then ``tail`` as written."""
    dest.mkdir()
    (dest / "episodes.jsonl").write_bytes(b"".join(line + b"\n" for line in lines) + tail)
    shutil.copy(real_run / "manifest.json", dest / "manifest.json")
    return dest


async def test_engine_run_reads_back_typed_and_as_written(real_run: Path) -> None:
    raw = lines_of(real_run)
    records: list[EpisodeRecord] = read_records(real_run)
    assert len(records) == len(raw) >= 4
    statuses = {r["status"] for r in records}
    assert {"success", "failure"} <= statuses
    episode_keys, step_keys = set(EpisodeRecord.__annotations__), set(StepRecord.__annotations__)
    acted = 0
    for n, line in enumerate(raw, 1):
        written = json.loads(line)
        assert decode_record(line, path="episodes.jsonl", line_no=n) == written  # exactly as written
        assert written["format_version"] == FORMAT_VERSION
        # The types name every key the engine writes, and the engine writes every key they say it always does.
        assert episode_keys - EPISODE_SOMETIMES <= set(written) <= episode_keys
        for step in written["steps"]:
            assert STEP_ALWAYS <= set(step) <= step_keys
            if "result" in step:
                acted += 1
                assert set(step) >= STEP_IF_ACTED
    assert acted
    # The judge queue's verdict is a valid Judgement, merged into its record on read.
    [jline] = lines_of(real_run, "judgements.jsonl")
    judgement: Judgement = decode_judgement(jline)
    assert set(judgement) == set(Judgement.__annotations__)
    [judged] = [r for r in records if r["episode_id"] == judgement["episode_id"]]
    assert judged["status"] == "success" and judged["reward"] == judgement["reward"]
    assert judged["judged_at"] == judgement["judged_at"]


async def test_newer_record_format_says_upgrade(real_run: Path, tmp_path: Path) -> None:
    lines = lines_of(real_run)[:3]
    newer = json.loads(lines[1])
    newer.update(format_version=FORMAT_VERSION + 1, steps="another shape")  # version checked before the shape
    run_dir = copy_run(real_run, tmp_path / "run", [lines[0], json.dumps(newer).encode(), lines[2]])
    with pytest.raises(RecordFormatError) as exc:
        read_records(run_dir)
    message = str(exc.value)
    assert f"{run_dir / 'episodes.jsonl'} line 2 was written by a newer webgym-engine" in message
    assert f"record format {FORMAT_VERSION + 1}; this code reads 1 and {FORMAT_VERSION}" in message
    assert "upgrade webgym-engine" in message


async def test_older_record_format_says_what_to_do(real_run: Path, tmp_path: Path) -> None:
    older = json.loads(lines_of(real_run)[0])
    older["format_version"] = 0
    run_dir = copy_run(real_run, tmp_path / "run", [json.dumps(older).encode()])
    with pytest.raises(RecordFormatError) as exc:
        read_records(run_dir)
    message = str(exc.value)
    assert f"{run_dir / 'episodes.jsonl'} line 1 was written by an older webgym-engine (record format 0;" in message
    assert "code_version" in message and "new run directory" in message


async def test_wrong_type_on_a_complete_line_names_line_and_field(real_run: Path, tmp_path: Path) -> None:
    lines = lines_of(real_run)
    broken = json.loads(lines[1])
    broken["steps"][0]["step"] = "0"
    run_dir = copy_run(real_run, tmp_path / "run", [lines[0], json.dumps(broken).encode(), *lines[2:]])
    with pytest.raises(RecordFormatError) as exc:
        read_records(run_dir)
    assert str(exc.value) == (f"{run_dir / 'episodes.jsonl'} line 2 is not a valid episode record: "
                              "$.steps[0].step: Expected `int`, got `str`")
    assert not exc.value.malformed
    # A status no engine writes, a missing key the reader needs: the same.
    for change, field in (({"status": "done"}, "$.status"), ({"task": {"task_name": "x"}}, "$.task")):
        bad = json.dumps({**json.loads(lines[0]), **change}).encode()
        with pytest.raises(RecordFormatError, match=rf"^run/x.jsonl line 7 is not a valid episode record: \{field}"):
            decode_record(bad, path="run/x.jsonl", line_no=7)


async def test_records_of_format_1_read_with_their_statuses_mapped(real_run: Path, tmp_path: Path) -> None:
    """Format 1 wrote ``failure`` for an episode nothing scored (no reward value) or the judge found blocked (its
    0.0), and ``error`` for a block page or a blocklisted site: they read as ``unrewarded`` and ``blocked``, with
    no reward value. Every other status reads as it was written."""
    assert READABLE_VERSIONS == (1, FORMAT_VERSION) and FORMAT_VERSION == 2
    written = json.loads(lines_of(real_run)[0])
    judge_blocked = {"value": 0.0, "source": "judge", "reason": "blocked", "facts": [], "evidence": {"blocking": {}}}
    rows: list[tuple[str, dict[str, Any] | None, dict[str, str] | None, str]] = [
        ("failure", {"value": None, "source": "none", "reason": "no programmatic checks"}, None, "unrewarded"),
        ("failure", {"value": None, "source": "none", "reason": "a browser lease: its client rewards it"}, None,
         "unrewarded"),
        ("failure", judge_blocked, None, "blocked"),
        ("error", None, {"kind": "blocked", "message": "HTTP 403 (http://blocked.test/)"}, "blocked"),
        ("error", None, {"kind": "blocked_domain", "message": "blocked.test is on the blocklist"}, "blocked"),
        ("error", None, {"kind": "worker_lost", "message": "the worker died"}, "error"),
        ("failure", {"value": 0.0, "source": "program", "reason": "1 of 1 facts failed"}, None, "failure"),
        ("success", written["reward"], None, "success"),
        ("judge_pending", None, None, "blocked"),  # its format-1 verdict below: the judge's blocked 0.0
        ("judge_pending", None, None, "judge_pending"),
    ]
    old = [{**written, "format_version": 1, "episode_id": f"old#{n}", "sample": n, "status": status,
            "reward": reward, "error": error} for n, (status, reward, error, _) in enumerate(rows)]
    run_dir = copy_run(real_run, tmp_path / "run", [json.dumps(r).encode() for r in old])
    manifest = json.loads((run_dir / "manifest.json").read_text())
    (run_dir / "manifest.json").write_text(json.dumps({**manifest, "format_version": 1}))
    (run_dir / "judgements.jsonl").write_text(json.dumps(
        {"episode_id": "old#8", "reward": judge_blocked, "error": None, "judged_at": 1.0, "judge_ms": 5.0}) + "\n")
    assert read_manifest(run_dir)["format_version"] == 1  # a format-1 run directory still opens
    records = read_records(run_dir)
    assert [r["status"] for r in records] == [want for *_, want in rows]
    assert all(r["format_version"] == FORMAT_VERSION for r in records)
    for r in records:
        if r["status"] in ("unrewarded", "blocked"):  # never a 0.0 to train on
            assert (r["reward"] or {}).get("value") is None, r
    assert records[0]["reward"] == rows[0][1] and records[1]["reward"] == rows[1][1]
    for judged in (records[2], records[8]):  # what blocked it is said where every blocked record says it
        assert judged["reward"]["blocked"] is True and judged["reward"]["evidence"] == {"blocking": {}}
        assert judged["error"]["kind"] == "judge_blocked"
    assert [r["error"]["kind"] for r in records[3:6]] == ["blocked", "blocked_domain", "worker_lost"]
    assert records[6]["reward"]["value"] == 0.0 and records[7]["reward"]["value"] == 1.0
    counts = summarize(records)
    assert (counts["succeeded"], counts["failed"], counts["unrewarded"], counts["blocked"], counts["errors"],
            counts["judge_pending"]) == (1, 1, 2, 4, 1, 1)
    assert counts["success_rate"] == 0.5  # of the rewarded episodes


@pytest.mark.parametrize("broken", ["cut", "nested-too-deep"])
async def test_a_complete_line_that_is_not_json_is_refused(real_run: Path, tmp_path: Path, broken: str) -> None:
    lines = lines_of(real_run)
    # nested too deep: before, msgspec's RecursionError came out of read_records as it was
    bad = lines[1][:50] if broken == "cut" else b"[" * 100_000 + b"]" * 100_000
    run_dir = copy_run(real_run, tmp_path / "run", [lines[0], bad, lines[2]])
    with pytest.raises(RecordFormatError, match=r"episodes\.jsonl line 2 is not JSON") as exc:
        read_records(run_dir)
    assert exc.value.malformed


async def test_torn_last_line_is_ignored(real_run: Path, tmp_path: Path) -> None:
    lines = lines_of(real_run)
    run_dir = copy_run(real_run, tmp_path / "run", lines[:2], tail=lines[2][:60])  # killed mid-write
    assert [r["episode_id"] for r in read_records(run_dir)] == [json.loads(x)["episode_id"] for x in lines[:2]]
    (run_dir / "judgements.jsonl").write_bytes(lines_of(real_run, "judgements.jsonl")[0][:30])
    assert len(read_records(run_dir)) == 2
    # The writer cuts it when the run resumes.
    RunStore(run_dir).close()
    assert (run_dir / "episodes.jsonl").read_bytes() == b"".join(x + b"\n" for x in lines[:2])


MANIFESTS = [("[]", "is not a run manifest"), ('{"config": []}', "is not a run manifest"),
             ('{"config": {', "is not JSON"), ("[" * 100_000, "is not JSON"),
             (json.dumps({"format_version": FORMAT_VERSION + 1, "config": {}}), "was written by a newer webgym-engine")]


@pytest.mark.parametrize(("text", "why"), MANIFESTS, ids=["list", "config", "cut", "deep", "newer"])
async def test_a_manifest_this_code_cannot_read_is_named_by_every_reader(real_run: Path, tmp_path: Path, text: str,
                                                                         why: str) -> None:
    """Before, the viewer and the export read manifest.json on their own: a list, a bad config or a cut file came
    out as a traceback (AttributeError, JSONDecodeError, RecursionError), and a resumed run stopped on a list."""
    run_dir = copy_run(real_run, tmp_path / "run", lines_of(real_run)[:2])
    (run_dir / "manifest.json").write_text(text)
    with pytest.raises(RecordFormatError, match=f"^{run_dir / 'manifest.json'} {why}"):
        read_manifest(run_dir)
    for command, args in ((view, [str(run_dir)]), (export, [str(run_dir), "-o", str(tmp_path / "out.json")])):
        result = CliRunner().invoke(command, args)
        assert result.exit_code == 1 and isinstance(result.exception, SystemExit), result.output
        assert result.output.startswith(f"Error: {run_dir / 'manifest.json'} {why}"), result.output
    store = RunStore(run_dir)  # --resume writes a new manifest over the unreadable one
    try:
        store.write_manifest({"policy": "scripted"})
    finally:
        store.close()
    assert read_manifest(run_dir)["config"] == {"policy": "scripted"}
    assert read_manifest(tmp_path) == {}  # none at all: nothing to read
    (tmp_path / "manifest.json").mkdir()
    with pytest.raises(RecordFormatError, match="manifest.json cannot be read: .*Is a directory"):
        read_manifest(tmp_path)


async def test_json_the_engine_writes_beyond_msgspec_reads(real_run: Path) -> None:
    """``json.dumps`` writes NaN and -Infinity (a model's -inf log-probability): such a record still reads."""
    record = json.loads(lines_of(real_run)[0])
    record["steps"][0]["logprobs"] = [-0.5, float("-inf")]
    record["steps"][0]["probe"] = {"raw_reward": float("nan")}
    decoded = decode_record(json.dumps(record).encode())
    assert decoded["steps"][0]["logprobs"] == [-0.5, float("-inf")]
    record["format_version"] = FORMAT_VERSION + 1
    with pytest.raises(RecordFormatError, match="newer webgym-engine"):
        decode_record(json.dumps(record).encode())


def test_every_browser_error_kind_has_its_record_kind() -> None:
    # RecordErrorKind writes browser_<kind> by hand: a new ErrorKind without its member would make an episode whose
    # browser operation failed with it end in a ValueError instead of its error record.
    from browserpool.protocol import ErrorKind
    from engine.store.records import RecordErrorKind

    assert {RecordErrorKind.of_browser(kind).value for kind in ErrorKind} == {
        k.value for k in RecordErrorKind if k.value.startswith("browser_")} | {"page_memory"}
