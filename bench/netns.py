"""A Linux network namespace joined to this host by a veth pair: "another host" on one machine, whose link can be
cut and restored. Root only (``ip netns``, ``ip link``).

The host side of the pair gets ``10.231.N.1/30`` and the namespace side ``10.231.N.2/30`` (N from this process's
pid); the namespace is named ``wgchaos-<pid>``, so that :func:`remove_stale` can tell one a killed run left behind
(its pid no longer runs) and remove it. :meth:`NetNamespace.close` kills what still runs inside, then removes the
namespace and the pair; it is safe to call twice.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
from dataclasses import dataclass

import psutil

PREFIX = "wgchaos-"
_NAME = re.compile(rf"^{PREFIX}(\d+)$")


def ip(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    """Run ``ip ARGS``; raises with ip's own message when ``check`` and it fails."""
    res = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=30)
    if check and res.returncode != 0:
        raise RuntimeError(f"ip {' '.join(args)}: {res.stderr.strip()}")
    return res


def namespaces() -> list[str]:
    """The names of the network namespaces ``ip netns`` knows."""
    return [line.split()[0] for line in ip("netns", "list", check=False).stdout.splitlines() if line.strip()]


def link_exists(name: str) -> bool:
    return ip("link", "show", name, check=False).returncode == 0


@dataclass
class NetNamespace:
    """One namespace and its veth pair (see the module docstring)."""

    name: str
    host_if: str
    ns_if: str
    host_addr: str
    ns_addr: str
    closed: bool = False

    @classmethod
    def create(cls) -> NetNamespace:
        """Make the namespace, the pair and the addresses, and bring both ends (and the namespace's loopback) up."""
        pid = os.getpid()
        net = f"10.231.{pid % 250 + 1}"
        ns = cls(f"{PREFIX}{pid}", f"wgc{pid}h"[:15], f"wgc{pid}n"[:15], f"{net}.1", f"{net}.2")
        try:
            ip("netns", "add", ns.name)
            ip("link", "add", ns.host_if, "type", "veth", "peer", "name", ns.ns_if)
            ip("link", "set", ns.ns_if, "netns", ns.name)
            ip("addr", "add", f"{ns.host_addr}/30", "dev", ns.host_if)
            ip("link", "set", ns.host_if, "up")
            ip("-n", ns.name, "addr", "add", f"{ns.ns_addr}/30", "dev", ns.ns_if)
            ip("-n", ns.name, "link", "set", ns.ns_if, "up")
            ip("-n", ns.name, "link", "set", "lo", "up")
        except BaseException:
            ns.close()
            raise
        return ns

    def exec_argv(self, argv: list[str]) -> list[str]:
        """``argv`` run inside the namespace."""
        return ["ip", "netns", "exec", self.name, *argv]

    def cut(self) -> None:
        """Take the namespace's end of the link down: nothing passes either way (no reset is sent: the peers see
        silence, as with a pulled cable)."""
        ip("-n", self.name, "link", "set", self.ns_if, "down")

    def restore(self) -> None:
        """Bring the namespace's end up again (its address and route come back with it)."""
        ip("-n", self.name, "link", "set", self.ns_if, "up")

    def pids(self) -> list[int]:
        """The processes running inside the namespace."""
        res = ip("netns", "pids", self.name, check=False)
        return [int(p) for p in res.stdout.split() if p.isdigit()]

    def close(self) -> None:
        """Kill whatever still runs inside, remove the namespace and the pair (idempotent)."""
        if self.closed:
            return
        self.closed = True
        if self.name in namespaces():
            for pid in self.pids():
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            ip("netns", "del", self.name, check=False)
        if link_exists(self.host_if):  # normally gone with its peer; not when the namespace never got it
            ip("link", "del", self.host_if, check=False)

    def __enter__(self) -> NetNamespace:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def remove_stale() -> list[str]:
    """Remove the namespaces (and their pairs) of chaos runs whose process no longer runs; their names."""
    removed = []
    for name in namespaces():
        m = _NAME.match(name)
        if m is None or psutil.pid_exists(int(m.group(1))):
            continue
        pid = int(m.group(1))
        NetNamespace(name, f"wgc{pid}h"[:15], f"wgc{pid}n"[:15], "", "").close()
        removed.append(name)
    return removed
