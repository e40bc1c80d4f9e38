"""The run directory: atomic records, torn-tail repair, frames stored as given, resume bookkeeping."""

from __future__ import annotations

import json
import os
from pathlib import Path

from engine.store import RunStore, finished_keys, read_records


def record(task_id: str, sample: int = 0, **extra: object) -> dict:
    return {"task": {"task_id": task_id}, "sample": sample, "status": "success", **extra}


def test_append_and_read_back(tmp_path: Path) -> None:
    store = RunStore(tmp_path)
    store.append(record("a"))
    store.append(record("a", 1, note="x" * 100_000))  # larger than a pipe buffer: still one line
    store.close()
    lines = (tmp_path / "episodes.jsonl").read_bytes().split(b"\n")
    assert len(lines) == 3 and lines[-1] == b""
    assert [r["sample"] for r in read_records(tmp_path)] == [0, 1]
    assert finished_keys(tmp_path) == {"a#0", "a#1"}


def test_torn_last_line_is_cut_on_reopen(tmp_path: Path) -> None:
    store = RunStore(tmp_path)
    store.append(record("a"))
    store.close()
    with open(tmp_path / "episodes.jsonl", "ab") as f:
        f.write(b'{"task": {"task_id": "b"}, "sam')  # a process killed mid-write
    assert finished_keys(tmp_path) == {"a#0"}
    store = RunStore(tmp_path)
    store.append(record("c"))
    store.close()
    assert [r["task"]["task_id"] for r in read_records(tmp_path)] == ["a", "c"]
    assert all(json.loads(line) for line in (tmp_path / "episodes.jsonl").read_text().splitlines())


def test_frames_are_written_byte_for_byte(tmp_path: Path) -> None:
    store = RunStore(tmp_path)
    jpeg = b"\xff\xd8" + os.urandom(200_000) + b"\xff\xd9"
    rel = store.write_frame("shop-001#0", 0, memoryview(jpeg))
    rel2 = store.write_frame("shop-001#0", 1, jpeg[:10])
    assert rel == "frames/shop-001_0/000.jpg" and rel2.endswith("001.jpg")
    assert (tmp_path / rel).read_bytes() == jpeg


def test_manifest_keeps_start_time_on_resume(tmp_path: Path) -> None:
    store = RunStore(tmp_path)
    store.write_manifest({"policy": "scripted"})
    first = json.loads((tmp_path / "manifest.json").read_text())
    store.write_manifest({"policy": "scripted", "again": True})
    second = json.loads((tmp_path / "manifest.json").read_text())
    assert first["format_version"] == second["format_version"] == 1
    assert second["started_at"] == first["started_at"] and second["config"]["again"] is True
    assert second["code_version"]
