"""A fixed ring of shared-memory slots per worker, for JPEG screenshots.

The worker owns the segment (creates and unlinks it) and writes each screenshot into a free slot;
the engine maps the same segment and reads frames in place, then hands the slot back. A generation
number per slot makes a stale or double release harmless. Segments are created once per worker, never
per frame (creating and unlinking costs ~36 us; a 150 KB write+read ~9 us).
"""

from __future__ import annotations

import contextlib
import mmap
import os
import secrets
from collections import deque
from multiprocessing import resource_tracker, shared_memory

from browserpool.protocol import FrameRef

# Where POSIX shared memory lives on Linux: shm_open("/name") is /dev/shm/name.
SHM_DIR = "/dev/shm"


class SlotRing:
    """Worker side: owns the segment, allocates slots and writes frames into them."""

    def __init__(self, slot_count: int, slot_size: int, name: str | None = None) -> None:
        if slot_count <= 0 or slot_size <= 0:
            raise ValueError("slot_count and slot_size must be positive")
        self.slot_count = slot_count
        self.slot_size = slot_size
        name = name or f"wg-{os.getpid()}-{secrets.token_hex(4)}"
        self._shm = shared_memory.SharedMemory(name=name, create=True, size=slot_count * slot_size)
        self._free: deque[int] = deque(range(slot_count))
        self._generation = [0] * slot_count
        self._in_use = [False] * slot_count

    @property
    def name(self) -> str:
        return self._shm.name

    @property
    def free_slots(self) -> int:
        return len(self._free)

    def write(self, data: bytes | memoryview) -> FrameRef | None:
        """Copy ``data`` into a free slot; None when it does not fit or no slot is free."""
        n = len(data)
        if n > self.slot_size or not self._free:
            return None
        # The slot freed last: frames keep going through the same few slots, warm in the caches, and the segment's
        # memory (allocated on first touch) stays that of the frames in flight, not of the whole ring.
        slot = self._free.pop()
        self._in_use[slot] = True
        self._generation[slot] += 1
        start = slot * self.slot_size
        buf = self._shm.buf
        assert buf is not None  # None only once the segment is closed
        buf[start:start + n] = data
        return FrameRef(slot, self._generation[slot], n)

    def release(self, slot: int, generation: int) -> bool:
        """Return a slot to the free list; False (and no change) for a stale or unknown release."""
        if not 0 <= slot < self.slot_count or not self._in_use[slot]:
            return False
        if self._generation[slot] != generation:
            return False
        self._in_use[slot] = False
        self._free.append(slot)
        return True

    def close(self) -> None:
        """Unmap and unlink the segment."""
        try:
            self._shm.close()
        finally:
            with contextlib.suppress(FileNotFoundError):
                self._shm.unlink()


class SlotReader:
    """Engine side: maps a worker's ring read-only and gives zero-copy views of its frames.

    The segment is mapped directly, not through ``SharedMemory``: a reader closed while a frame's view is still
    held (its worker died mid-step) leaves the mapping, and the descriptor that Python's mmap keeps, to go with
    the last view. ``SharedMemory`` would keep its own descriptor open for good, and fail in its finalizer."""

    def __init__(self, name: str, slot_size: int) -> None:
        if not name or "/" in name or name in (".", ".."):
            raise ValueError(f"not a shared-memory segment name: {name[:80]!r}")
        fd = os.open(os.path.join(SHM_DIR, name), os.O_RDONLY)
        try:
            # The worker owns the segment (it unlinks it); this process only maps it, so no resource tracker
            # entry is made that could unlink it at exit.
            self._map: mmap.mmap | None = mmap.mmap(fd, 0, access=mmap.ACCESS_READ)
        finally:
            os.close(fd)
        self.name = name
        self.slot_size = slot_size
        self.size = len(self._map)  # the mapped segment's size in bytes
        self._buf = memoryview(self._map)

    def view(self, ref: FrameRef) -> memoryview:
        """A read-only memoryview of the frame's JPEG bytes, valid until the slot is released."""
        if ref.nbytes > self.slot_size:
            raise ValueError(f"frame of {ref.nbytes} bytes exceeds slot size {self.slot_size}")
        start = ref.slot * self.slot_size
        if start + ref.nbytes > self.size:
            raise ValueError(f"slot {ref.slot} lies outside the segment")
        return self._buf[start:start + ref.nbytes]

    def close(self) -> None:
        """Unmap the segment; when a frame's view is still held, the mapping goes when the last view does."""
        if self._map is None:
            return
        with contextlib.suppress(BufferError):  # a view is still exported
            self._buf.release()
            self._map.close()
        self._map = None


def unlink_segment(name: str) -> None:
    """Remove a segment left behind by a worker that died (best effort)."""
    try:
        seg = shared_memory.SharedMemory(name=name, create=False)
    except FileNotFoundError:
        return
    seg.close()
    try:
        seg.unlink()  # also drops the tracker registration that attaching made
    except FileNotFoundError:
        # Removed meanwhile (by its worker, or a reaper): the registration must still go, or the tracker warns of a
        # leaked segment when this process exits. (``_name``, with its leading slash, is the name the tracker holds;
        # typeshed lists only ``name``.)
        resource_tracker.unregister(seg._name, "shared_memory")  # type: ignore[attr-defined]
