"""The core's guard of other people's websites: what counts as the engine's own, the per-site action rate and the
blocklist (a site that blocked the agent is skipped until its entry expires)."""

from __future__ import annotations

import time

from engine.episode.rollout import Rollout
from engine.store.records import RecordError, RecordErrorKind
from engine.web.blocklist import Blocklist
from engine.web.domains import DomainPacer, domain_of, is_local


class SiteGuard:
    """``base_url``: where the engine's own sites are served (set once they are); ``blocklist``: opened by the
    core's start (its default file is in the run directory)."""

    def __init__(self, base_url: str | None, domain_rate: float) -> None:
        self.base_url = base_url
        self.pacer = DomainPacer(domain_rate)
        self.blocklist: Blocklist | None = None

    def is_own(self, website: str) -> bool:
        """Whether ``website`` is on the engine's own sites or the user's local ones (no per-site limits, never
        blocked)."""
        return (bool(self.base_url) and website.startswith(self.base_url or "")) or is_local(website)

    async def pace(self, url: str) -> float:
        """Wait until an action may go to ``url``'s site (the engine's own sites never wait)."""
        return 0.0 if self.is_own(url) else await self.pacer.wait(domain_of(url))

    async def skipped_as_blocked(self, rollout: Rollout) -> bool:
        """End the rollout with a ``blocked_domain`` record when its site is on the blocklist; whether it did."""
        if self.blocklist is None or self.is_own(rollout.task.website):
            return False
        domain = domain_of(rollout.task.website)
        entry = self.blocklist.blocked(domain)
        if entry is None:
            return False
        until = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(entry.until))
        await rollout.end_with_error(RecordErrorKind.BLOCKED_DOMAIN, f"{domain} is on the blocklist until {until} "
                                                       f"({entry.reason}; from the {entry.source})")
        return True

    def note_block(self, rollout: Rollout) -> None:
        """An episode that ended on a block page puts its domain on the blocklist."""
        record = rollout.record
        error: RecordError | dict[str, str] = (record.get("error") if record else None) or {}
        if error.get("kind") == "blocked":
            self.block(rollout.task.website, str(error.get("message") or "a block page"), "page",
                       rollout.block_for_s)

    def block(self, website: str, reason: str, source: str, for_s: float | None = None) -> None:
        """Put ``website``'s domain on the blocklist (never one of the engine's own sites)."""
        domain = domain_of(website)
        if self.blocklist is not None and domain and not self.is_own(website):
            self.blocklist.add(domain, reason, source, for_s=for_s)
