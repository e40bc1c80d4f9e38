"""The errors of the browser pool (what a session's operation raises)."""

from __future__ import annotations

from browserpool.protocol import ErrorKind


class PoolError(RuntimeError):
    """Base of the pool's errors."""


class WorkerLost(PoolError):
    """The worker (or its browser) serving an episode died."""


class RequestTimeout(WorkerLost):
    """A worker did not answer a request within its deadline (the episode may be retried elsewhere)."""


class BrowserOpError(PoolError):
    """A worker answered an operation with an error of this ``kind``."""

    def __init__(self, kind: ErrorKind, message: str) -> None:
        super().__init__(message)
        self.kind = kind
