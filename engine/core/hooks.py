"""The core's hooks: who hears of every status change, every record and each judged episode's verdict.

A hook that raises is logged: it runs in a runner, which must go on, and the other hooks still get the record.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Iterator

from engine.episode.rollout import Rollout
from engine.episode.status import EpisodeStatus
from engine.store.records import EpisodeRecord

RecordHook = Callable[[Rollout, EpisodeRecord], None]
VerdictHook = Callable[[EpisodeRecord], None]
log = logging.getLogger(__name__)


class CoreHooks:
    """The status, record and verdict hooks of one engine core."""

    def __init__(self) -> None:
        self.status_hooks: list[Callable[[EpisodeStatus], None]] = []
        self.record_hooks: list[RecordHook] = []
        self.verdict_hooks: dict[str, VerdictHook] = {}

    def status(self, status: EpisodeStatus) -> None:
        """Hand a status change to every status hook."""
        for hook in self.status_hooks:
            hook(status)

    def on_record(self, hook: RecordHook) -> Callable[[], None]:
        """Add a record hook; returns what removes it."""
        self.record_hooks.append(hook)
        return lambda: self.record_hooks.remove(hook)

    def on_verdict(self, episode_id: str, hook: VerdictHook | None) -> None:
        """Set (None: forget) the hook for one episode's verdict."""
        if hook is None:
            self.verdict_hooks.pop(episode_id, None)
        else:
            self.verdict_hooks[episode_id] = hook

    def take_verdict_hook(self, episode_id: str) -> VerdictHook | None:
        """The episode's verdict hook, forgotten (a verdict comes once)."""
        return self.verdict_hooks.pop(episode_id, None)

    @contextlib.contextmanager
    def awaiting_verdict(self, rollout: Rollout, hook: VerdictHook | None) -> Iterator[None]:
        """Register ``hook`` for the episode's verdict before the episode can end (a judge with a cached verdict
        answers as soon as the record is written); forget it unless the episode ended waiting for the judge."""
        if hook is None:
            yield
            return
        self.on_verdict(rollout.episode_id, hook)
        try:
            yield
        finally:
            if rollout.record is None or rollout.record["status"] != "judge_pending":
                self.on_verdict(rollout.episode_id, None)

    def redelivery(self, rollout: Rollout) -> VerdictHook | None:
        """What hands a judged episode's merged record to the record hooks (None: nobody listens)."""
        if not self.record_hooks:
            return None
        return lambda merged: self.deliver(rollout, merged)

    def deliver(self, rollout: Rollout, record: EpisodeRecord | None = None) -> None:
        """Hand a finished episode's record (or, later, its merged record) to the record hooks."""
        record = record or rollout.record
        assert record is not None
        for hook in list(self.record_hooks):
            try:
                hook(rollout, record)
            except Exception:  # noqa: BLE001 - a caller's hook
                log.exception("a record hook failed on episode %s", rollout.episode_id)
