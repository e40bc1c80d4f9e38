"""The run directory: atomic records, torn-tail repair, frames stored as given, resume bookkeeping."""

from __future__ import annotations

import asyncio
import json
import os
import threading
from pathlib import Path

import pytest

from engine.store import frame_writer
from engine.store.records import FORMAT_VERSION
from engine.store.run_dir import (
    RunStore,
    StoreFailed,
    episode_key,
    finished_keys,
    frames_name,
    read_records,
)
from tests.conftest import SmallDisk


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


def test_every_episode_has_its_own_frames_directory_whatever_its_task_id(tmp_path: Path) -> None:
    ids = [episode_key(t, 0) for t in ("shop-001", "a/b", "a_b", "x" * 300, "y" * 300, "caf\u00e9 \u2615", "a_b_0")]
    names = [frames_name(e) for e in ids]
    assert names[0] == "shop-001_0"  # a plain id keeps the name it always had
    assert len(set(names)) == len(names)  # no two episodes share a directory
    assert all(len(n.encode()) <= 100 and "/" not in n and n not in (".", "..") for n in names)
    store = RunStore(tmp_path)
    try:
        for i, e in enumerate(ids):
            rel = store.write_frame(e, 0, b"\xff\xd8" + bytes([i]))
            assert rel == f"frames/{frames_name(e)}/000.jpg"
        assert [(tmp_path / f"frames/{n}/000.jpg").read_bytes()[-1] for n in names] == list(range(len(ids)))
    finally:
        store.close()


async def test_queued_frames_have_landed_when_the_barrier_returns(tmp_path: Path) -> None:
    """The rollouts' path: files are written on the store's thread; ``frames_landed`` returns once every frame
    of the episode is complete on disk (a record is published only after it)."""
    store = RunStore(tmp_path)
    frames = [os.urandom(150_000) for _ in range(40)]
    paths = [store.queue_frame("e#0", i, data) for i, data in enumerate(frames)]
    other = store.queue_frame("f#0", 0, b"other")
    assert await store.frames_landed("e#0") is None
    assert [(tmp_path / rel).read_bytes() for rel in paths] == frames
    assert await store.frames_landed("never-queued#0") is None  # nothing to wait for
    store.close()  # drains what is still queued
    assert (tmp_path / other).read_bytes() == b"other"


async def test_a_frame_written_from_its_buffer_hands_it_back_on_the_loop(tmp_path: Path) -> None:
    """The zero-copy path: the file is written from the given buffer (a worker's slot), then ``done`` runs on the
    event loop's thread, never before the bytes are on disk."""
    import threading

    store = RunStore(tmp_path)
    slot = bytearray(os.urandom(100_000))
    handed_back: list[tuple[bytes, bool]] = []

    def done() -> None:  # what the rollout passes: Frame.release
        rel_path = tmp_path / "frames" / "e_0" / "000.jpg"
        handed_back.append((rel_path.read_bytes(), threading.current_thread() is threading.main_thread()))

    rel = store.queue_frame("e#0", 0, memoryview(slot), done)
    assert await store.frames_landed("e#0") is None
    for _ in range(100):  # the callback is scheduled on the loop by the writer thread
        if handed_back:
            break
        await asyncio.sleep(0.01)
    assert handed_back == [(bytes(slot), True)]
    assert (tmp_path / rel).read_bytes() == bytes(slot)
    store.close()


async def test_a_frame_that_cannot_be_written_fails_the_store_at_the_barrier(tmp_path: Path) -> None:
    store = RunStore(tmp_path)
    store.queue_frame("e#0", 0, b"first")
    assert await store.frames_landed("e#0") is None
    (tmp_path / "frames" / "e_0").rename(tmp_path / "moved")  # the episode's folder vanished mid-episode
    store.queue_frame("e#0", 1, b"second")
    await asyncio.wait_for(store.failed.wait(), 5)  # at once, not when the episode ends
    with pytest.raises(StoreFailed, match=r"could not be written \(a screenshot: 001.jpg: "):
        await store.frames_landed("e#0")
    # Failed for the rest of the run: nothing more is written, every writer gets the first error.
    for write in (lambda: store.append({"episode_id": "f#0"}), lambda: store.write_frame("f#0", 0, b"x"),
                  lambda: store.append_judgement({"episode_id": "e#0", "reward": None, "error": None})):
        with pytest.raises(StoreFailed, match="001.jpg"):
            write()
    assert store.failed.is_set() and store.episodes_path.read_text() == ""
    store.close()


async def test_rollouts_wait_for_room_while_the_disk_is_behind(tmp_path: Path,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """Past ``max_queued`` frames waiting to be written, ``room`` waits until half of them are: a disk slower than
    the run slows the run instead of filling memory (and the workers' rings) with queued frames."""
    disk_free = threading.Event()
    write = frame_writer.write_files

    def slow_disk(items: list[tuple[str, bytes, bool]]) -> list[str | None]:
        disk_free.wait(10)
        return write(items)

    monkeypatch.setattr(frame_writer, "write_files", slow_disk)
    writer = frame_writer.FrameWriter(max_queued=4)
    await writer.room()  # nothing queued: at once
    for i in range(6):
        writer.submit("e#0", str(tmp_path / f"{i:03d}.jpg"), b"frame %d" % i, False)
    assert writer.queued == 6
    waiting = asyncio.ensure_future(writer.room())
    await asyncio.sleep(0.1)
    assert not waiting.done()  # the disk has written nothing yet
    disk_free.set()
    await asyncio.wait_for(waiting, 10)
    assert writer.queued <= 2
    assert await writer.landed("e#0") == []
    assert [(tmp_path / f"{i:03d}.jpg").read_bytes() for i in range(6)] == [b"frame %d" % i for i in range(6)]
    writer.close()


def test_manifest_keeps_start_time_on_resume(tmp_path: Path) -> None:
    store = RunStore(tmp_path)
    store.write_manifest({"policy": "scripted"})
    first = json.loads((tmp_path / "manifest.json").read_text())
    store.write_manifest({"policy": "scripted", "again": True})
    second = json.loads((tmp_path / "manifest.json").read_text())
    assert first["format_version"] == second["format_version"] == FORMAT_VERSION
    assert second["started_at"] == first["started_at"] and second["config"]["again"] is True
    assert second["code_version"]


def test_a_run_directory_on_a_full_disk_fails_at_its_manifest_and_closes_once(small_disk: SmallDisk) -> None:
    # Before, `run` on a full disk stopped with a traceback (a plain OSError), then a second one: the failed start
    # had closed the store, and closing it again raised EBADF.
    small_disk.fill()
    store = RunStore(small_disk.path / "run")
    with pytest.raises(StoreFailed, match=r"manifest.json: \[Errno 28\] No space left on device"):
        store.write_manifest({"tasks": "x"})
    assert not (small_disk.path / "run" / "manifest.tmp").exists()
    store.close()
    store.close()  # as the core's close does after a start that failed
