"""The RL loop's rollout pool: groups of episodes kept running, handed to the trainer as they complete.

A group is ``group_size`` episodes of one task (GRPO's group). The pool keeps enough groups submitted to the
engine that every browser slot always has an episode, and starts each new group with the policy version current
at that moment, so rollouts never stop between iterations (AsyncWebRL's everlasting pool). Staleness is bounded
at the source as AReaL does: group ``g`` may start only once ``g < (version + staleness + 1) * batch_groups``,
so no more than ``staleness`` versions' worth of groups run ahead of the trainer. ``staleness = 0`` is the
synchronous loop: a batch, then nothing until the next version. ``max_groups`` ends the pool: no group starts
that no iteration would take.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
from dataclasses import dataclass, field
from typing import Any

from engine.api import RolloutService
from engine.policy_api import Policy
from engine.tasks import Task


@dataclass
class Group:
    """One task's episodes, started together with one policy version."""

    task: Task
    started_version: int
    episode_ids: list[str]
    records: list[dict[str, Any]] = field(default_factory=list)

    @property
    def complete(self) -> bool:
        return len(self.records) == len(self.episode_ids)


class RolloutPool:
    """Keeps ``service`` busy with groups of ``tasks`` for ``policy`` (see the module docstring)."""

    def __init__(self, service: RolloutService, tasks: list[Task], policy: Policy, *, group_size: int,
                 batch_groups: int, staleness: int, max_groups: int | None = None, seed: int = 0) -> None:
        if not tasks:
            raise ValueError("the rollout pool needs tasks")
        self.service = service
        self.tasks = tasks
        self.policy = policy
        self.group_size = group_size
        self.batch_groups = batch_groups
        self.staleness = staleness
        self.max_groups = max_groups  # groups to start in all (the loop's iterations x batch_groups); None: no end
        self.version = 0
        self.started = 0  # groups started
        # Enough episodes queued in the engine that a slot freed by a finished episode is refilled at once.
        self.target_outstanding = service.cfg.concurrency + group_size
        self._rng = random.Random(seed)
        self._order: list[Task] = []
        self._by_episode: dict[str, Group] = {}
        self._complete: asyncio.Queue[Group] = asyncio.Queue()
        self._stopped = False
        self._all_in = asyncio.Event()  # set when no submitted episode is without its record
        self._reader: asyncio.Task[None] | None = None

    def start(self) -> None:
        """Submit the first groups and start reading finished episodes."""
        self._fill()
        self._reader = asyncio.ensure_future(self._read())

    def set_version(self, version: int) -> None:
        """New groups start with ``version`` (and more may start, up to the staleness bound)."""
        self.version = version
        self._fill()

    async def take(self, n: int) -> list[Group]:
        """The next ``n`` complete groups, in the order they completed (waits for them)."""
        groups = []
        for _ in range(n):
            if self._reader is not None and self._reader.done():
                self._reader.result()  # the reader failed: raise its error rather than wait forever
            getter = asyncio.ensure_future(self._complete.get())
            assert self._reader is not None
            await asyncio.wait({getter, self._reader}, return_when=asyncio.FIRST_COMPLETED)
            if not getter.done():
                getter.cancel()
                self._reader.result()
            groups.append(getter.result())
        return groups

    async def drain(self) -> list[Group]:
        """Start no more groups; wait for the running ones (every episode ends with its record) and return the
        groups not taken."""
        self._stopped = True
        running = {id(g): g for g in self._by_episode.values()}
        if self.service.outstanding > 0 and self._reader is not None:
            waiter = asyncio.ensure_future(self._all_in.wait())
            await asyncio.wait({waiter, self._reader}, return_when=asyncio.FIRST_COMPLETED)
            waiter.cancel()
            if self._reader.done():
                self._reader.result()
        await self.close()
        left = []
        while not self._complete.empty():
            left.append(self._complete.get_nowait())
        return left + [g for g in running.values() if all(g is not x for x in left)]

    async def close(self) -> None:
        reader, self._reader = self._reader, None
        if reader is not None and not reader.done():
            reader.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await reader

    def _admissible(self) -> bool:
        if self._stopped or (self.max_groups is not None and self.started >= self.max_groups):
            return False
        return self.started < (self.version + self.staleness + 1) * self.batch_groups

    def _fill(self) -> None:
        while self.service.outstanding < self.target_outstanding and self._admissible():
            if not self._order:  # every task once per pass, in a new random order each pass
                self._order = list(self.tasks)
                self._rng.shuffle(self._order)
            task = self._order.pop()
            ids = self.service.submit([task], self.policy, self.group_size, policy_version=self.version)
            group = Group(task=task, started_version=self.version, episode_ids=ids)
            self._by_episode.update((e, group) for e in ids)
            self.started += 1

    async def _read(self) -> None:
        while True:
            record = await self.service.next_result()
            group = self._by_episode.pop(record["episode_id"], None)
            if group is not None:
                group.records.append(record)
                if group.complete:
                    self._complete.put_nowait(group)
            self._fill()
            if self.service.outstanding == 0:
                self._all_in.set()
