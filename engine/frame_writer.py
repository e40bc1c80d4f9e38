"""Screenshot files written off the event loop, in order, with a per-episode barrier.

One file per step is the largest cost the engine process pays per step (an open, a write of ~100 KB, a close: a
fraction of a millisecond on tmpfs, more on a disk). A writer thread takes those system calls off the event loop
(they release the GIL, so they run beside it on another core). Readers of a record (the judge, the RL loop, the
viewer) open its screenshots as soon as they see it, so a record may be published only once every frame its
episode queued has landed: :meth:`FrameWriter.landed` is that barrier. The queue is FIFO and served by one
thread, so a marker queued after an episode's frames is reached after all of them.

A frame can be written straight from the worker's shared-memory slot (no copy in the engine: with thousands of
rollouts a fresh 130 KB copy per step costs more than the rest of the step); the slot is handed back on the event
loop's thread once the file is written (``done``), since the pool's release lists belong to that thread.
"""

from __future__ import annotations

import asyncio
import os
import queue
import threading
from collections.abc import Callable
from dataclasses import dataclass, field


@dataclass
class _Frame:
    path: str
    data: bytes | memoryview
    episode: str
    make_dir: bool
    done: Callable[[], None] | None  # run on the loop once written (e.g. hand the slot back)
    loop: asyncio.AbstractEventLoop | None


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


class FrameWriter:
    """Writes JPEG files on one thread; :meth:`landed` waits until an episode's queued frames are on disk.

    Only the event loop's thread calls :meth:`submit`, :meth:`landed` and :meth:`close`."""

    def __init__(self) -> None:
        self._queue: queue.SimpleQueue[_Frame | _Marker | object] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()  # guards _pending and _done, which both threads update
        self._pending: dict[str, _Pending] = {}
        self._done: list[Callable[[], None]] = []  # written frames' callbacks, for the loop (under _lock)
        self._wake_scheduled = False

    def submit(self, episode: str, path: str, data: bytes | memoryview, make_dir: bool,
               done: Callable[[], None] | None = None) -> None:
        """Queue one file (``make_dir``: create its folder first); returns at once. ``data`` must stay valid
        until ``done`` (called on the event loop's thread once the file is written, or could not be)."""
        if self._thread is None:
            self._thread = threading.Thread(target=self._serve, name="frame-writer", daemon=True)
            self._thread.start()
        with self._lock:
            self._pending.setdefault(episode, _Pending()).queued += 1
        loop = asyncio.get_running_loop() if done is not None else None
        self._queue.put(_Frame(path, data, episode, make_dir, done, loop))

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

    def _hand_back(self, item: _Frame) -> None:
        """On the writer's thread: queue ``item.done`` for the loop, waking it once per batch."""
        with self._lock:
            self._done.append(item.done)  # type: ignore[arg-type]
            wake, self._wake_scheduled = not self._wake_scheduled, True
        if wake and item.loop is not None and not item.loop.is_closed():
            item.loop.call_soon_threadsafe(self._run_done)

    def _serve(self) -> None:
        while True:
            item = self._queue.get()
            if item is _STOP:
                return
            if isinstance(item, _Marker):
                if not item.loop.is_closed():
                    item.loop.call_soon_threadsafe(_resolve, item.future)
                continue
            assert isinstance(item, _Frame)
            error = write_file(item.path, item.data, item.make_dir)
            with self._lock:
                pending = self._pending.get(item.episode)
                if pending is not None:
                    pending.queued -= 1
                    if error:
                        pending.errors.append(error)
            if item.done is not None:
                self._hand_back(item)


def _resolve(future: asyncio.Future[None]) -> None:
    if not future.done():  # the waiter may have been cancelled
        future.set_result(None)


def write_file(path: str, data: bytes | memoryview, make_dir: bool) -> str | None:
    """Write one file (``make_dir``: create its folder first); the error as text, or None."""
    try:
        if make_dir:
            os.makedirs(os.path.dirname(path), exist_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view):]
        finally:
            os.close(fd)
    except OSError as exc:
        return f"{os.path.basename(path)}: {exc}"
    return None
