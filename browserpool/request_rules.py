"""Request rules: ads and trackers refused at the network layer, in the worker, with no round trip to the engine.

Every load of a context already passes its network proxy (:mod:`browserpool.netpolicy`); a blocked host is refused
there, before any connection, with one set lookup per label of the host name (``a.b.ads.example`` is checked as
``a.b.ads.example``, ``b.ads.example``, ``ads.example``, ``example``). Rule files (``WorkerConfig.request_rules``)
in the two common formats of host lists:

- hosts files: ``0.0.0.0 ads.example`` or ``127.0.0.1 ads.example`` lines (and bare ``ads.example`` lines);
- Adblock Plus / EasyList domain rules: ``||ads.example^`` (options after ``$`` allowed, e.g. ``$third-party``,
  which every page's ads are). Other EasyList rules (paths, element hiding ``##``, exceptions ``@@``, regular
  expressions) are not applied: they are counted in :attr:`RequestRules.ignored`. Domain rules are most of what
  such lists block by request count.

Blocking a request changes what the page shows (an ad slot stays empty): it is off unless rules are given.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from pathlib import Path

_HOSTS_LINE = re.compile(r"^(?:0\.0\.0\.0|127\.0\.0\.1|::1?|::)\s+(\S+)")
_ABP_DOMAIN = re.compile(r"^\|\|([a-z0-9.-]+)\^(?:\$([^,]*(?:,[^,]*)*))?$")
_BARE_HOST = re.compile(r"^[a-z0-9-]+(?:\.[a-z0-9-]+)+$")
_NOT_DOMAIN_OPTIONS = ("domain=", "~third-party", "first-party")  # options that narrow a rule to some pages


class RequestRules:
    """A set of blocked host names (and their subdomains)."""

    def __init__(self, hosts: Iterable[str] = ()) -> None:
        self.hosts: set[str] = {h.lower().rstrip(".") for h in hosts if h}
        self.ignored = 0

    @classmethod
    def from_files(cls, paths: Iterable[str | Path]) -> RequestRules:
        """The rules of hosts files and EasyList files (see the module docstring)."""
        rules = cls()
        for path in paths:
            rules.add_lines(Path(path).read_text(encoding="utf-8", errors="replace").splitlines())
        return rules

    def add_lines(self, lines: Iterable[str]) -> None:
        for raw in lines:
            line = raw.strip().lower()
            if line.startswith("##"):  # EasyList's element hiding: not a request rule
                self.ignored += 1
                continue
            if not line or line.startswith(("#", "!", "[")):  # comments of both formats, EasyList's header
                continue
            if match := _HOSTS_LINE.match(line):
                host = match.group(1)
                if host not in ("localhost", "0.0.0.0", "broadcasthost"):
                    self.hosts.add(host.rstrip("."))
            elif match := _ABP_DOMAIN.match(line):
                options = match.group(2) or ""
                if any(o in options for o in _NOT_DOMAIN_OPTIONS):
                    self.ignored += 1
                else:
                    self.hosts.add(match.group(1).rstrip("."))
            elif _BARE_HOST.match(line):
                self.hosts.add(line)
            else:
                self.ignored += 1

    def __len__(self) -> int:
        return len(self.hosts)

    def blocks(self, host: str) -> str | None:
        """The rule (a host name) that blocks ``host`` or one of its parent domains; None when none does."""
        name = host.lower().rstrip(".")
        while name:
            if name in self.hosts:
                return name
            _, _, name = name.partition(".")
        return None
