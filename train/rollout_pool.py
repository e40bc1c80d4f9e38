"""The RL loop's rollout pool: groups of episodes kept running, handed to the trainer as they complete.

A group is ``group_size`` episodes of one task (GRPO's group). The pool keeps enough groups submitted to the
engine that every browser slot always has an episode, and starts each new group with the policy version current
at that moment, so rollouts never stop between iterations (AsyncWebRL's everlasting pool). Staleness is bounded
at the source as AReaL does: group ``g`` may start only once ``g < (iteration + staleness + 1) * batch_groups``
(``iteration``: the iterations the trainer has finished, :meth:`RolloutPool.next_iteration`), so no more than
``staleness`` iterations' worth of groups run ahead of the trainer. An iteration that trains nothing (every group
without reward variance) leaves the version as it was and still lets the next groups start. ``staleness = 0`` is the
synchronous loop: a batch, then nothing until the next version. ``max_groups`` ends the pool: no group starts
that no iteration would take.

Nothing the infrastructure caused reaches a group's training records. A member that ends without the task's
verdict (:func:`train.algorithms.is_trainable` false: an ``error`` of any kind (a lost worker, a straggler, a
timeout), a judge that gave no verdict) is kept apart in ``Group.excluded`` and, with ``on_infra = "rerun"``
(the default), run again on the same task, so the group keeps its size; the rerun takes the current policy
version only while that is within ``staleness`` of the group's own, so a rerun never mixes versions beyond the
bound. Past that bound, past ``max_reruns`` reruns, with ``on_infra = "drop"``, or for a member that no rerun
can help (``blocked``: the site refuses the agent; ``unrewarded``: nothing can score the task) the group is
dropped: delivered with ``dropped`` saying why, and not trained on.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
from dataclasses import dataclass, field
from typing import Literal, get_args

from engine.agent.policy_api import Policy
from engine.clients.service import RolloutService
from engine.store.records import EpisodeRecord
from engine.tasks.schema import Task
from train.algorithms import is_trainable

#: What the pool does with a member that ends without the task's verdict: run it again, or drop its group.
InfraAction = Literal["rerun", "drop"]
INFRA_ACTIONS: tuple[InfraAction, ...] = get_args(InfraAction)
#: Members that no rerun can help: the site refuses the agent, or nothing can score the task.
_NO_RERUN = ("blocked", "unrewarded")


@dataclass
class Group:
    """One task's episodes, started together with one policy version (see the module docstring)."""

    task: Task
    started_version: int
    size: int  # the members it trains with
    episode_ids: list[str]  # every episode submitted for it, reruns included
    records: list[EpisodeRecord] = field(default_factory=list)  # the members with the task's verdict
    excluded: list[EpisodeRecord] = field(default_factory=list)  # the others, never trained on
    reruns: int = 0
    dropped: str | None = None  # why the group is not trained on; None: it has ``size`` trainable records

    @property
    def pending(self) -> int:
        """Episodes submitted for the group whose record has not arrived."""
        return len(self.episode_ids) - len(self.records) - len(self.excluded)

    @property
    def complete(self) -> bool:
        """Every member is in: ``size`` trainable records, or dropped with nothing left running."""
        return self.pending == 0 and (self.dropped is not None or len(self.records) == self.size)


class RolloutPool:
    """Keeps ``service`` busy with groups of ``tasks`` for ``policy`` (see the module docstring)."""

    def __init__(self, service: RolloutService, tasks: list[Task], policy: Policy, *, group_size: int,
                 batch_groups: int, staleness: int, max_groups: int | None = None, seed: int = 0,
                 on_infra: InfraAction = "rerun", max_reruns: int | None = None) -> None:
        if on_infra not in INFRA_ACTIONS:
            raise ValueError(f"on_infra must be one of {INFRA_ACTIONS}, not {on_infra!r}")
        if not tasks:
            raise ValueError("the rollout pool needs tasks")
        self.service = service
        self.tasks = tasks
        self.policy = policy
        self.group_size = group_size
        self.batch_groups = batch_groups
        self.staleness = staleness
        self.max_groups = max_groups  # groups to start in all (the loop's iterations x batch_groups); None: no end
        self.on_infra = on_infra
        self.max_reruns = group_size if max_reruns is None else max_reruns  # per group
        self.version = 0
        self.iteration = 0  # iterations the trainer has finished
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

    def next_iteration(self, version: int) -> None:
        """The trainer finished an iteration (with or without an update): new groups start with ``version``, and
        more may start, up to the staleness bound."""
        self.iteration += 1
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
        return self.started < (self.iteration + self.staleness + 1) * self.batch_groups

    def _fill(self) -> None:
        while self.service.outstanding < self.target_outstanding and self._admissible():
            if not self._order:  # every task once per pass, in a new random order each pass
                self._order = list(self.tasks)
                self._rng.shuffle(self._order)
            task = self._order.pop()
            ids = self.service.submit([task], self.policy, self.group_size, policy_version=self.version)
            group = Group(task=task, started_version=self.version, size=self.group_size, episode_ids=ids)
            self._by_episode.update((e, group) for e in ids)
            self.started += 1

    def _add(self, group: Group, record: EpisodeRecord) -> None:
        """A member's record: kept for training, or kept apart and answered with a rerun or the group's drop."""
        if is_trainable(record):
            group.records.append(record)
            return
        group.excluded.append(record)
        if group.dropped is not None:
            return
        status = str(record.get("status"))
        if status in _NO_RERUN:
            group.dropped = f"a member ended {status}"
        elif self.on_infra == "drop":
            group.dropped = f"a member ended {status} (on_infra = drop)"
        elif group.reruns >= self.max_reruns:
            group.dropped = f"{group.reruns} reruns did not complete it"
        elif self.version - group.started_version > self.staleness:
            group.dropped = (f"a rerun at version {self.version} would be more than {self.staleness} versions "
                             f"after the group's {group.started_version}")
        elif self._stopped:
            group.dropped = "the pool is draining"
        else:
            [rerun] = self.service.submit([group.task], self.policy, 1, policy_version=self.version)
            group.episode_ids.append(rerun)
            group.reruns += 1
            self._by_episode[rerun] = group

    async def _read(self) -> None:
        while True:
            record = await self.service.next_result()
            group = self._by_episode.pop(record["episode_id"], None)
            if group is not None:
                self._add(group, record)
                if group.complete:
                    self._complete.put_nowait(group)
            self._fill()
            if self.service.outstanding == 0:
                self._all_in.set()
