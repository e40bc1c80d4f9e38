"""Screenshot files written off the event loop, in order, with a per-episode barrier.

One file per step is the largest cost the engine process pays per step (an open, a write of ~100 KB, a close: a
fraction of a millisecond on tmpfs, more on a disk). A writer thread takes those system calls off the event loop,
in batches written by compiled code that gives up the GIL once per batch (``engine._filewrite``). Written with
Python's own ``os`` calls, each file made the thread win the GIL back from the busy loop three times: at a
thousand steps/s it fell seconds behind, and every queued frame held a shared-memory slot (or an inline copy).

Readers of a record (the judge, the RL loop, the viewer) open its screenshots as soon as they see it, so a record
may be published only once every frame its episode queued has landed: :meth:`FrameWriter.landed` is that barrier.
The queue is FIFO and served by one thread, so a marker queued after an episode's frames is reached after all of
them.

A frame can be written straight from the worker's shared-memory slot (no copy in the engine: with thousands of
rollouts a fresh 130 KB copy per step costs more than the rest of the step); the slot is handed back on the event
loop's thread once the file is written (``done``), since the pool's release lists belong to that thread.
"""

from __future__ import annotations

import asyncio
import queue
import threading
from collections.abc import Callable
from dataclasses import dataclass, field

from engine._filewrite import write_files


@dataclass
class _Frame:
    path: str
    data: bytes | memoryview
    episode: str
    make_dir: bool
    done: Callable[[], None] | None  # run on the loop once written (e.g. hand the slot back)
    loop: asyncio.AbstractEventLoop | None  # the submitter's, for ``done`` and ``on_error``


@dataclass
class _Marker:
    """Reached by the thread after every item queued before it."""

    loop: asyncio.AbstractEventLoop
    future: asyncio.Future[None]


@dataclass
class _Pending:
    queued: int = 0
    errors: list[str] = field(default_factory=list)


_STOP = object()
# Frames written per batch (one GIL release): 5-20 ms of writes of 127 KB frames to tmpfs on a 2-core host, the most
# by which a batch holds back the slots of the frames it wrote first.
BATCH_FRAMES = 64
# Frames that may wait to be written before the rollouts wait for room (:meth:`FrameWriter.room`): a disk slower than
# the run then slows the run instead of filling memory with queued frames, or its workers' rings with held slots.
MAX_QUEUED = 512
THREAD_NAME = "frame-writer"  # the writer thread's name (benchmarks read its CPU time by it)


class FrameWriter:
    """Writes JPEG files on one thread; :meth:`landed` waits until an episode's queued frames are on disk.

    Only the event loop's thread calls :meth:`submit`, :meth:`room`, :meth:`landed` and :meth:`close`."""

    def __init__(self, max_queued: int = MAX_QUEUED, on_error: Callable[[str], None] | None = None) -> None:
        self.max_queued = max_queued
        self.on_error = on_error  # called on the loop's thread with a file's error as soon as it is known
        self._queue: queue.SimpleQueue[_Frame | _Marker | object] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()  # guards _pending and _done, which both threads update
        self._pending: dict[str, _Pending] = {}
        self._done: list[Callable[[], None]] = []  # written frames' callbacks, for the loop (under _lock)
        self._wake_scheduled = False
        self._queued = 0  # frames submitted and not yet written (under _lock)
        self._room_waiters: list[tuple[asyncio.AbstractEventLoop, asyncio.Future[None]]] = []  # (under _lock)

    @property
    def queued(self) -> int:
        """Frames submitted and not yet written."""
        return self._queued

    def submit(self, episode: str, path: str, data: bytes | memoryview, make_dir: bool,
               done: Callable[[], None] | None = None) -> None:
        """Queue one file (``make_dir``: create its folder first); returns at once. ``data`` must stay valid
        until ``done`` (called on the event loop's thread once the file is written, or could not be)."""
        if self._thread is None:
            self._thread = threading.Thread(target=self._serve, name=THREAD_NAME, daemon=True)
            self._thread.start()
        with self._lock:
            self._pending.setdefault(episode, _Pending()).queued += 1
            self._queued += 1
        try:
            loop: asyncio.AbstractEventLoop | None = asyncio.get_running_loop()
        except RuntimeError:  # a caller without a loop (then with no callback)
            loop = None
        self._queue.put(_Frame(path, data, episode, make_dir, done, loop))

    async def room(self) -> None:
        """Return at once while at most ``max_queued`` frames wait to be written; else wait until half of them are.
        A rollout calls it before it asks for its next screenshot."""
        if self._queued <= self.max_queued:
            return
        loop = asyncio.get_running_loop()
        future = loop.create_future()
        with self._lock:
            if self._queued <= self.max_queued:  # written meanwhile
                return
            self._room_waiters.append((loop, future))
        await future

    async def landed(self, episode: str) -> list[str]:
        """Wait until every frame queued for ``episode`` is written; the errors of those that failed (a full disk,
        a removed folder), and forget the episode."""
        with self._lock:
            pending = self._pending.get(episode)
            busy = pending is not None and pending.queued > 0
        if busy:
            loop = asyncio.get_running_loop()
            marker = _Marker(loop, loop.create_future())
            self._queue.put(marker)
            await marker.future
        with self._lock:
            done = self._pending.pop(episode, None)
        return done.errors if done is not None else []

    def close(self) -> None:
        """Write what is queued, then stop the thread (and run the callbacks of what it wrote)."""
        if self._thread is not None:
            self._queue.put(_STOP)
            self._thread.join()
            self._thread = None
        self._run_done()

    def _run_done(self) -> None:
        """On the loop's thread: the callbacks of the frames written since the last call."""
        with self._lock:
            done, self._done = self._done, []
            self._wake_scheduled = False
        for callback in done:
            callback()

    def _serve(self) -> None:
        while True:
            batch = [self._queue.get()]
            while len(batch) < BATCH_FRAMES:
                try:
                    batch.append(self._queue.get_nowait())
                except queue.Empty:
                    break
            frames: list[_Frame] = []
            for item in batch:  # in queue order: a marker is resolved once the frames before it are written
                if isinstance(item, _Frame):
                    frames.append(item)
                    continue
                self._write(frames)
                frames = []
                if item is _STOP:
                    return
                assert isinstance(item, _Marker)
                if not item.loop.is_closed():
                    item.loop.call_soon_threadsafe(_resolve, item.future)
            self._write(frames)

    def _write(self, frames: list[_Frame]) -> None:
        """On the writer's thread: write ``frames`` (the GIL released once for all), count them as landed and
        queue their ``done`` callbacks for the loop, waking it once per batch."""
        if not frames:
            return
        errors = write_files([(f.path, f.data, f.make_dir) for f in frames])
        loop = next((f.loop for f in frames if f.done is not None), None)
        with self._lock:
            self._queued -= len(frames)
            waiters: list[tuple[asyncio.AbstractEventLoop, asyncio.Future[None]]] = []
            if self._room_waiters and self._queued <= self.max_queued // 2:
                waiters, self._room_waiters = self._room_waiters, []
            failed: tuple[asyncio.AbstractEventLoop | None, str] | None = None  # the first error, for on_error
            for f, error in zip(frames, errors, strict=True):
                pending = self._pending.get(f.episode)
                if pending is not None:
                    pending.queued -= 1
                if error:
                    if pending is not None:
                        pending.errors.append(error)
                    failed = failed or (f.loop, error)
                if f.done is not None:
                    self._done.append(f.done)
            wake = loop is not None and not self._wake_scheduled
            if wake:
                self._wake_scheduled = True
        if wake and loop is not None and not loop.is_closed():
            loop.call_soon_threadsafe(self._run_done)
        if failed is not None and self.on_error is not None and failed[0] is not None and not failed[0].is_closed():
            failed[0].call_soon_threadsafe(self.on_error, failed[1])
        for waiter_loop, future in waiters:
            if not waiter_loop.is_closed():
                waiter_loop.call_soon_threadsafe(_resolve, future)


def _resolve(future: asyncio.Future[None]) -> None:
    if not future.done():  # the waiter may have been cancelled
        future.set_result(None)

