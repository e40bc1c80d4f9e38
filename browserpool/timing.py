"""Elapsed time as the timings of an observation report it (milliseconds)."""

from __future__ import annotations

import time
from collections.abc import Awaitable
from typing import TypeVar

T = TypeVar("T")


def _ms(t0: float) -> float:
    return round((time.perf_counter() - t0) * 1000.0, 2)


async def _timed(coro: Awaitable[T]) -> tuple[T, float]:
    """The coroutine's result and how long it took (ms), for operations that run side by side."""
    t0 = time.perf_counter()
    return await coro, _ms(t0)
