"""The shared-memory screenshot ring: slot life cycle, stale releases, exhaustion, cleanup, and a reader
in another process than the writer."""

from __future__ import annotations

import gc
import json
import os
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from multiprocessing import resource_tracker, shared_memory
from pathlib import Path

import pytest

from browserpool.protocol import FrameRef
from browserpool.shm import SHM_DIR, SlotReader, SlotRing, unlink_segment

SLOT = 4096


def shm_path(name: str) -> Path:
    return Path(SHM_DIR) / name.lstrip("/")


@pytest.fixture
def ring() -> Iterator[SlotRing]:
    r = SlotRing(4, SLOT)
    yield r
    r.close()


def segment_mappings(name: str) -> int:
    """How many times this process maps the segment."""
    with open("/proc/self/maps") as maps:
        return sum(line.rstrip().endswith(str(shm_path(name))) for line in maps)


def segment_descriptors(name: str) -> int:
    """How many of this process's open file descriptors are the segment."""
    fds = Path("/proc/self/fd")
    return sum(os.path.realpath(fds / fd) == str(shm_path(name)) for fd in os.listdir(fds))


@pytest.fixture
def reader(ring: SlotRing) -> Iterator[SlotReader]:
    rd = SlotReader(ring.name, SLOT)
    yield rd
    rd.close()


def frame(n: int, seed: int) -> bytes:
    return bytes((seed + i) % 251 for i in range(n))


def test_write_then_read_the_same_bytes(ring: SlotRing, reader: SlotReader) -> None:
    a, b = frame(1000, 1), frame(SLOT, 2)  # the second one fills its slot exactly
    ra, rb = ring.write(a), ring.write(memoryview(b))
    assert isinstance(ra, FrameRef) and isinstance(rb, FrameRef)
    assert ra.slot != rb.slot
    assert (ra.nbytes, rb.nbytes) == (len(a), len(b))
    assert ra.generation >= 1 and rb.generation >= 1
    assert bytes(reader.view(ra)) == a  # writing b did not touch a's slot
    assert bytes(reader.view(rb)) == b
    assert ring.free_slots == 2


def test_a_ring_touches_only_the_memory_of_the_frames_in_flight() -> None:
    """The slot freed last is used next: a run whose frames are handed back one or two at a time keeps writing the
    same few slots (warm in the caches), and the segment's memory (allocated page by page, on first touch) stays
    that of those slots however large the ring is and however many frames pass through it."""
    big = SlotRing(256, 64 << 10)
    frames = [frame(60_000, seed) for seed in range(7)]  # made once: 2,000 of them cost the test 15 s of CPU
    try:
        held = []
        for i in range(2000):
            ref = big.write(frames[i % 7])
            assert ref is not None
            held.append(ref)
            if len(held) == 2:  # the previous frame is handed back once the next one is in
                old = held.pop(0)
                assert big.release(old.slot, old.generation)
        allocated = os.stat(shm_path(big.name)).st_blocks * 512
        assert allocated <= 2 * (64 << 10), allocated  # two slots' worth of 256
    finally:
        big.close()


def test_release_returns_the_slot(ring: SlotRing) -> None:
    refs = [ring.write(frame(10, i)) for i in range(4)]
    assert ring.free_slots == 0
    assert all(r is not None for r in refs)
    assert ring.release(refs[2].slot, refs[2].generation) is True
    assert ring.free_slots == 1
    again = ring.write(b"new")
    assert again is not None
    assert again.slot == refs[2].slot
    assert again.generation > refs[2].generation


def test_stale_generation_and_double_release_are_ignored() -> None:
    ring = SlotRing(1, SLOT)
    try:
        old = ring.write(b"first")
        assert old is not None
        assert ring.release(old.slot, old.generation) is True
        new = ring.write(b"second")
        assert new is not None and new.slot == old.slot
        assert ring.free_slots == 0
        # The engine hands back the old frame late: the slot now holds another frame, keep it.
        assert ring.release(old.slot, old.generation) is False
        assert ring.free_slots == 0
        assert ring.release(new.slot, new.generation) is True
        assert ring.free_slots == 1
        # Released twice: the second time is a no-op (the slot is not listed free twice).
        assert ring.release(new.slot, new.generation) is False
        assert ring.free_slots == 1
        assert ring.write(b"a") is not None
        assert ring.write(b"b") is None
    finally:
        ring.close()


@pytest.mark.parametrize("slot", [-1, 4, 1000])
def test_release_of_an_unknown_slot_is_ignored(ring: SlotRing, slot: int) -> None:
    ring.write(b"x")
    free = ring.free_slots
    assert ring.release(slot, 1) is False
    assert ring.free_slots == free


def test_release_of_a_never_written_slot_is_ignored(ring: SlotRing) -> None:
    assert ring.release(0, 0) is False
    assert ring.free_slots == 4


def test_exhaustion_returns_none(ring: SlotRing, reader: SlotReader) -> None:
    refs = [ring.write(frame(100, i)) for i in range(4)]
    assert ring.write(b"one too many") is None  # the worker then sends this frame inline
    assert ring.free_slots == 0
    for i, r in enumerate(refs):
        assert bytes(reader.view(r)) == frame(100, i)  # nothing was overwritten
    ring.release(refs[0].slot, refs[0].generation)
    assert ring.write(b"fits again") is not None


def test_oversize_frame_returns_none(ring: SlotRing) -> None:
    assert ring.write(b"\0" * (SLOT + 1)) is None
    assert ring.free_slots == 4
    assert ring.write(b"\0" * SLOT) is not None


def test_reader_refuses_a_ref_larger_than_a_slot(ring: SlotRing, reader: SlotReader) -> None:
    with pytest.raises(ValueError):
        reader.view(FrameRef(0, 1, SLOT + 1))


def test_invalid_ring_sizes() -> None:
    with pytest.raises(ValueError):
        SlotRing(0, SLOT)
    with pytest.raises(ValueError):
        SlotRing(4, 0)


def test_close_unlinks_the_segment() -> None:
    ring = SlotRing(2, SLOT)
    path = shm_path(ring.name)
    assert path.exists()
    assert path.stat().st_size >= 2 * SLOT
    ring.close()
    assert not path.exists()
    with pytest.raises(FileNotFoundError):
        SlotReader(ring.name, SLOT)


def test_a_reader_closed_under_a_live_view_lets_go_of_the_segment_with_the_view(
        ring: SlotRing, monkeypatch: pytest.MonkeyPatch) -> None:
    # A worker that dies while the engine still holds one of its frames: the reader is closed under the view.
    unraisable: list[object] = []
    monkeypatch.setattr(sys, "unraisablehook", unraisable.append)
    def held() -> tuple[int, int]:
        return segment_mappings(ring.name), segment_descriptors(ring.name)

    ring_own = held()
    rd = SlotReader(ring.name, SLOT)
    assert held() == (ring_own[0] + 1, ring_own[1] + 1)  # one mapping, and the descriptor the mmap keeps
    view = rd.view(ring.write(b"held"))
    rd.close()
    del rd
    gc.collect()
    assert bytes(view) == b"held"  # the view stays valid...
    view.release()
    assert held() == ring_own  # ...and the mapping and its descriptor go with it
    assert unraisable == []  # nothing is left to fail in a finalizer


def test_the_engine_cannot_write_into_a_workers_ring(ring: SlotRing, reader: SlotReader) -> None:
    view = reader.view(ring.write(b"frame"))
    assert view.readonly
    with pytest.raises(TypeError):
        view[0] = 0
    view.release()


@pytest.mark.parametrize("name", ["", ".", "..", "../etc/passwd", "wg-1/x"])
def test_a_reader_refuses_a_name_outside_the_shared_memory_directory(name: str) -> None:
    with pytest.raises(ValueError, match="not a shared-memory segment name"):
        SlotReader(name, SLOT)


_CHILD = textwrap.dedent("""
    import json, sys
    from browserpool.shm import SlotRing
    ring = SlotRing(4, {slot})
    frames = [bytes((seed + i) % 251 for i in range(n)) for seed, n in ((1, 100), (2, {slot}), (3, 7))]
    refs = [[r.slot, r.generation, r.nbytes] for r in map(ring.write, frames)]
    print(json.dumps({{"name": ring.name, "refs": refs}}), flush=True)
    if sys.argv[1] == "keep":
        # A worker that dies without cleaning up: forget the segment, so nothing unlinks it at exit.
        from multiprocessing import resource_tracker
        resource_tracker.unregister(ring._shm._name, "shared_memory")
        sys.exit(0)
    sys.stdin.readline()  # wait until the other process has read the frames
    ring.close()
""")


def _child(mode: str) -> subprocess.Popen[str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(Path(__file__).resolve().parents[1]),
                                                    env.get("PYTHONPATH")) if p)
    return subprocess.Popen([sys.executable, "-c", _CHILD.format(slot=SLOT), mode], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True, env=env)


def test_reader_maps_a_segment_created_by_another_process() -> None:
    proc = _child("wait")
    try:
        info = json.loads(proc.stdout.readline())
        rd = SlotReader(info["name"], SLOT)
        for (seed, n), ref in zip(((1, 100), (2, SLOT), (3, 7)), info["refs"], strict=True):
            assert bytes(rd.view(FrameRef(*ref))) == frame(n, seed)
        rd.close()
        proc.stdin.write("done\n")
        proc.stdin.flush()
        assert proc.wait(timeout=30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert not shm_path(info["name"]).exists()  # the owner unlinked it; the reader did not keep it


def test_unlink_segment_removes_a_leftover_segment() -> None:
    proc = _child("keep")
    try:
        info = json.loads(proc.stdout.readline())
        assert proc.wait(timeout=30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    path = shm_path(info["name"])
    try:
        assert path.exists()  # the writer is gone, its segment is not
        unlink_segment(info["name"])
        assert not path.exists()
    finally:
        if path.exists():
            path.unlink()
    unlink_segment(info["name"])  # already gone: no error


@pytest.mark.parametrize(("concurrency", "workers", "configured", "slots"),
                         [(32, 2, 64, 64), (256, 2, 64, 256), (256, 2, 512, 512), (20_000, 2, 64, 4096)])
def test_a_run_gives_each_worker_ring_two_slots_per_rollout(concurrency: int, workers: int, configured: int,
                                                            slots: int) -> None:
    """A rollout holds up to two frames (the last until it is written, and the new one): a ring with fewer slots
    sends frames inline. Never fewer than configured, never more than a Hello may announce."""
    from browserpool.config import WorkerConfig
    from engine.core.builders import pool_config
    from engine.core.config import RunConfig

    cfg = RunConfig(concurrency=concurrency, workers=workers, worker=WorkerConfig(endpoint="", slot_count=configured))
    assert pool_config(cfg, None).worker.slot_count == slots
    assert cfg.worker.slot_count == configured  # the run's own config is left as it was


def test_unlink_segment_forgets_a_segment_removed_meanwhile(monkeypatch: pytest.MonkeyPatch) -> None:
    """Attaching registers the segment with this process's resource tracker; when another process removes it
    between the attach and the unlink, the registration must still be dropped (the tracker warns at exit else)."""
    from browserpool import shm

    ring = SlotRing(2, SLOT)
    name = ring.name
    forgotten: list[tuple[str, str]] = []
    unregister = resource_tracker.unregister
    attach = shm.shared_memory.SharedMemory

    def attach_then_lose(*args: object, **kwargs: object) -> shared_memory.SharedMemory:
        seg = attach(*args, **kwargs)  # type: ignore[arg-type]
        ring.close()  # its owner unlinks it now
        return seg

    def record(name: str, rtype: str) -> None:
        forgotten.append((name, rtype))
        unregister(name, rtype)

    monkeypatch.setattr(shm.shared_memory, "SharedMemory", attach_then_lose)
    monkeypatch.setattr(shm.resource_tracker, "unregister", record)
    unlink_segment(name)
    assert (f"/{name.lstrip('/')}", "shared_memory") in forgotten
    assert not shm_path(name).exists()
