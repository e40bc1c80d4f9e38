"""SIGTERM and SIGHUP end a command the way Ctrl-C does.

``timeout``, systemd, Kubernetes and a closed terminal send these; Python's default for them is to die
on the spot, which skips every ``finally``: the browser pool is never closed, the store never flushed.
:func:`until_signal` turns either signal into a cancellation of the command's coroutine, so the same
clean-up as for Ctrl-C runs (episodes in flight end without a record and are rerun by ``--resume``;
the store is closed; the workers are shut down and their shared memory unlinked), and then raises
:class:`Terminated`, whose ``exit_code`` is the shell's ``128 + signum``.
"""

from __future__ import annotations

import asyncio
import signal
from collections.abc import Awaitable, Iterable
from typing import TypeVar

T = TypeVar("T")

SIGNALS: tuple[signal.Signals, ...] = (signal.SIGTERM, signal.SIGHUP)


class Terminated(Exception):
    """The command was stopped by a signal after its clean-up ran."""

    def __init__(self, signum: int) -> None:
        self.signum = signum
        self.name = signal.Signals(signum).name
        super().__init__(f"stopped by {self.name}")

    @property
    def exit_code(self) -> int:
        """What a shell reports for a process killed by this signal."""
        return 128 + self.signum


async def until_signal(aw: Awaitable[T], signals: Iterable[signal.Signals] = SIGNALS) -> T:
    """Await ``aw``; on one of ``signals``, cancel it, let its clean-up finish, then raise Terminated.

    A second signal during the clean-up is ignored (a clean-up that hangs is ended with SIGKILL, which the
    browser workers survive by no more than a second: they die with the engine)."""
    loop = asyncio.get_running_loop()
    inner = asyncio.ensure_future(aw)
    caught: list[int] = []

    def on_signal(signum: int) -> None:
        if not caught:
            caught.append(signum)
            inner.cancel()

    installed = []
    for sig in signals:
        if signal.getsignal(sig) is signal.SIG_IGN:
            continue  # ignored on purpose (SIGHUP under nohup): stays ignored
        try:
            loop.add_signal_handler(sig, on_signal, int(sig))
            installed.append(sig)
        except (ValueError, RuntimeError, NotImplementedError):  # not the main thread, or no signals here
            continue
    try:
        return await inner
    except asyncio.CancelledError:
        if caught and inner.cancelled():
            raise Terminated(caught[0]) from None
        raise
    finally:
        for sig in installed:
            loop.remove_signal_handler(sig)
