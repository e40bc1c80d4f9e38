"""A test past its timeout (pytest-timeout, ``timeout_method = "thread"``) reports where it hung, also in an xdist
worker: there pytest-timeout writes its stack dump to the worker's standard output, which xdist points at
/dev/null, so the run showed only "node down: Not properly terminated". This plugin takes over the thread method's
timer: at the deadline it writes the test's id, every thread's stack and every pending asyncio task's stack to
the process's standard error as it was at start (the run's log, also under xdist; not the test's captured output,
which a process that ends at once never shows), then ends the process as pytest-timeout does."""

from __future__ import annotations

import asyncio
import os
import sys
import threading
import traceback
from typing import Any, TextIO

import pytest

_STDERR = pytest.StashKey[TextIO]()


def write_hang_report(nodeid: str, timeout: float, out: TextIO) -> None:
    """Every thread's stack but the caller's, and every unfinished asyncio task's, under a title naming the test."""
    bar = "+" * 30
    out.write(f"\n{bar} Timeout: {nodeid} still ran after {timeout:g} s {bar}\n")
    names = {t.ident: t.name for t in threading.enumerate()}
    for ident, frame in sys._current_frames().items():
        if ident != threading.get_ident():
            out.write(f"--- thread {names.get(ident, ident)}\n{''.join(traceback.format_stack(frame))}")
    # Python 3.11 registers every task, C or Python, uvloop's included, in this set; it is what all_tasks() reads,
    # but all_tasks() needs the loop, which runs in another thread than this one.
    for task in list(getattr(asyncio.tasks, "_all_tasks", ())):
        if not task.done():
            out.write(f"--- task {task.get_name()}, awaiting (outermost first):\n")
            out.write("".join(traceback.format_list(_awaits(task.get_coro()))))
    out.write(f"{bar} Timeout {bar}\n")
    out.flush()


def pytest_configure(config: pytest.Config) -> None:
    # Output capture is suspended while plugins are configured: descriptor 2 is still the real standard error.
    config.stash[_STDERR] = os.fdopen(os.dup(2), "w", encoding="utf-8", errors="replace")


def pytest_unconfigure(config: pytest.Config) -> None:
    config.stash[_STDERR].close()


def _awaits(coro: Any) -> traceback.StackSummary:
    """Where a suspended coroutine waits, through every coroutine it awaits (a task's own stack shows only its
    outermost frame)."""
    frames = []
    while coro is not None:
        frame = getattr(coro, "cr_frame", None) or getattr(coro, "gi_frame", None)
        if frame is not None:
            frames.append((frame, frame.f_lineno))
        coro = getattr(coro, "cr_await", None) or getattr(coro, "gi_yieldfrom", None)
    return traceback.StackSummary.extract(frames)


@pytest.hookimpl(tryfirst=True)
def pytest_timeout_set_timer(item: pytest.Item, settings: Any) -> bool | None:
    """The thread method's timer, reporting to standard error; other methods are left to pytest-timeout."""
    if settings.method != "thread":
        return None

    def expire() -> None:
        try:
            write_hang_report(item.nodeid, settings.timeout, item.config.stash[_STDERR])
        finally:
            os._exit(1)

    timer = threading.Timer(settings.timeout, expire)
    timer.name = f"timeout {item.nodeid}"
    timer.daemon = True

    def cancel() -> None:
        timer.cancel()
        timer.join()

    item.cancel_timeout = cancel  # type: ignore[attr-defined]  # what pytest-timeout's cancel hook calls
    timer.start()
    return True
