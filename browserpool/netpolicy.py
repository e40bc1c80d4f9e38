"""The network policy for pages: the rules for which hosts and addresses a page may load from, and the registry of
the engine's own sites, exempt from them. (The forward proxy that holds every load of a BrowserContext to the rules
is in ``proxy.py``.)

Rules (:class:`NetPolicy`), in order:

1. **always refused** (no flag lifts these): cloud metadata names (``metadata.google.internal``,
   ``metadata``, ...) and addresses (169.254.169.254, fd00:ec2::254, 100.100.100.200, ...), link-local
   (169.254.0.0/16, fe80::/10), unspecified (0.0.0.0/8, ::), multicast and reserved/broadcast addresses;
2. **deny entries** (``--net-deny``): a refusal wins over any allow entry;
3. **the engine's own sites** (``exempt``: the bundled-site server's ``host:port``) are allowed;
4. **refused by default**: loopback (127.0.0.0/8, ::1), private (10/8, 172.16/12, 192.168/16), shared
   (CGNAT 100.64/10), unique-local (fc00::/7) and a few other special-purpose ranges, unless
   ``allow_private_network`` is set or an allow entry (``--net-allow``) names the load specifically: an
   address, a CIDR, a ``host:port`` or a URL pattern. (A bare host name cannot lift the block: a name can be
   pointed at any address.)
5. everything else is allowed.

IPv6 forms that carry an IPv4 address (IPv4-mapped ``::ffff:a.b.c.d``, IPv4-compatible ``::a.b.c.d``,
NAT64 ``64:ff9b::/96``, 6to4 ``2002::/16``, Teredo) are judged by the IPv4 address they carry as well.
A name is judged by every address it resolves to: one blocked address refuses the load, and the proxy then
connects to the address it checked, never to the name again (no DNS rebinding between check and use).

Entries (``--net-allow`` / ``--net-deny``, repeatable):

* ``example.com`` (exact host), ``*.example.com`` (its subdomains), ``*`` (every host); deny only, or
  with a port;
* ``example.com:8080``, ``*.example.com:443``, ``10.0.0.5:8080``, ``[fd00::1]:80`` (host and port);
* ``10.0.0.5``, ``fd00::1``, ``10.0.0.0/8``, ``fc00::/7`` (addresses; a name is matched by what it
  resolves to);
* ``http://example.com/admin/*`` (URL patterns, shell-style globs over the whole URL). Inside a TLS tunnel
  (https, wss) the proxy sees only the host and port: there a URL pattern applies when its path part is
  ``*`` or ``/*``; path-specific patterns are matched against plain-http loads and the main frame's
  navigations.
"""

from __future__ import annotations

import fnmatch
import ipaddress
from collections.abc import Iterable
from dataclasses import dataclass
from urllib.parse import urlsplit

import msgspec

from browserpool.net_addresses import _DEFAULT_PORTS, IPAddress, IPNetwork, _ip, _norm_host, _split_host_port
from browserpool.protocol import NetSettings

# Names imported "as" themselves are re-exported: they lived here, and code elsewhere imports them from here.
from browserpool.proxy import DNS_LOOKUPS_PER_CONTEXT as DNS_LOOKUPS_PER_CONTEXT
from browserpool.proxy import MAX_INTERIM_HEADS as MAX_INTERIM_HEADS
from browserpool.proxy import ContextProxy as ContextProxy

# Names of cloud metadata services (compared without a trailing dot, lowercased).
METADATA_NAMES = frozenset({
    "metadata.google.internal", "metadata.goog", "metadata", "instance-data", "instance-data.ec2.internal",
    "metadata.azure.com", "metadata.packet.net",
})
# Addresses of cloud metadata services (AWS/GCP/Azure/OCI/DigitalOcean, AWS IPv6 and ECS, Alibaba, Oracle
# Cloud Classic).
METADATA_ADDRESSES = frozenset(ipaddress.ip_address(a) for a in (
    "169.254.169.254", "169.254.170.2", "fd00:ec2::254", "100.100.100.200", "192.0.0.192",
))

_N = ipaddress.ip_network
# (network, rule) pairs that no flag lifts, checked in order.
ALWAYS_BLOCKED: tuple[tuple[IPNetwork, str], ...] = (
    (_N("169.254.0.0/16"), "link-local"),
    (_N("fe80::/10"), "link-local"),
    (_N("0.0.0.0/8"), "unspecified"),
    (_N("::/128"), "unspecified"),
    (_N("224.0.0.0/4"), "multicast"),
    (_N("ff00::/8"), "multicast"),
    (_N("240.0.0.0/4"), "reserved"),  # includes 255.255.255.255 (broadcast)
)
# (network, rule) pairs refused unless the private network is allowed or an allow entry names them.
DEFAULT_BLOCKED: tuple[tuple[IPNetwork, str], ...] = (
    (_N("127.0.0.0/8"), "loopback"),
    (_N("::1/128"), "loopback"),
    (_N("10.0.0.0/8"), "private"),
    (_N("172.16.0.0/12"), "private"),
    (_N("192.168.0.0/16"), "private"),
    (_N("100.64.0.0/10"), "shared (CGNAT)"),
    (_N("fc00::/7"), "unique-local"),
    (_N("fec0::/10"), "site-local"),
    (_N("192.0.0.0/24"), "special-purpose"),
    (_N("198.18.0.0/15"), "special-purpose"),
    (_N("64:ff9b:1::/48"), "special-purpose"),  # local-use NAT64: the embedded address is not recoverable
)
_ALWAYS, _DEFAULT, _PUBLIC = 2, 1, 0
_NAT64 = _N("64:ff9b::/96")
_COMPAT = _N("::/96")  # IPv4-compatible (deprecated) addresses, :: and ::1 aside


@dataclass(frozen=True, slots=True)
class Verdict:
    """The policy's answer for one load: allowed or not, and the rule that decided it."""

    allowed: bool
    rule: str


def _embedded_v4(addr: IPAddress) -> list[ipaddress.IPv4Address]:
    """The IPv4 addresses an IPv6 address carries (mapped, compatible, NAT64, 6to4, Teredo)."""
    if not isinstance(addr, ipaddress.IPv6Address):
        return []
    out: list[ipaddress.IPv4Address] = []
    if addr.ipv4_mapped is not None:
        out.append(addr.ipv4_mapped)
    if addr in _NAT64 or (addr in _COMPAT and int(addr) > 1):
        out.append(ipaddress.IPv4Address(int(addr) & 0xFFFFFFFF))
    if addr.sixtofour is not None:
        out.append(addr.sixtofour)
    if addr.teredo is not None:
        out.extend(addr.teredo)
    return out


def classify(addr: IPAddress) -> tuple[int, str]:
    """(tier, rule) of one address: 2 always refused, 1 refused by default, 0 public ('public')."""
    worst = (_PUBLIC, "public")
    for a in (addr, *_embedded_v4(addr)):
        if a in METADATA_ADDRESSES:
            return _ALWAYS, "metadata"
        for net, rule in ALWAYS_BLOCKED:
            if a.version == net.version and a in net:
                return _ALWAYS, rule
        if worst[0] < _DEFAULT:
            for net, rule in DEFAULT_BLOCKED:
                if a.version == net.version and a in net:
                    worst = (_DEFAULT, rule)
                    break
    return worst


_TUNNEL_SCHEMES = ("https", "wss")


@dataclass(frozen=True, slots=True)
class Entry:
    """One allow or deny entry, parsed (see the module docstring for the forms)."""

    text: str
    kind: str  # host | net | url
    host: str = ""  # host glob (kind host/url), lowercased
    port: int | None = None
    net: IPNetwork | None = None  # kind net
    scheme: str = ""  # kind url: scheme glob
    path: str = ""  # kind url: path-and-query glob ("" for the whole site)

    @classmethod
    def parse(cls, text: str) -> Entry:
        """Parse one entry; raises ValueError with the entry in the message."""
        s = text.strip()
        if not s:
            raise ValueError("empty network policy entry")
        if "://" in s:
            scheme, _, rest = s.partition("://")
            authority, slash, path = rest.partition("/")
            host, port = _split_host_port(authority)
            if not host:
                raise ValueError(f"no host in URL pattern {text!r}")
            scheme = scheme.lower()
            if port is None:
                port = _DEFAULT_PORTS.get(scheme)
            return cls(s, "url", _norm_host(host), port, scheme=scheme, path=(slash + path) if slash else "")
        if "/" in s:
            try:
                return cls(s, "net", net=ipaddress.ip_network(s, strict=False))
            except ValueError as exc:
                raise ValueError(f"bad CIDR {text!r}: {exc}") from None
        host, port = _split_host_port(s)
        host = _norm_host(host)
        if not host:
            raise ValueError(f"no host in {text!r}")
        addr = _ip(host)
        if addr is not None:
            return cls(s, "net", port=port, net=ipaddress.ip_network(addr))
        return cls(s, "host", host, port)

    @property
    def specific(self) -> bool:
        """Whether the entry names its loads precisely enough to lift the default private block."""
        return self.kind in ("net", "url") or self.port is not None

    def _host_matches(self, host: str) -> bool:
        pat = self.host
        if pat.startswith("*.") and "*" not in pat[2:] and "?" not in pat and "[" not in pat:
            return host.endswith(pat[1:])  # subdomains only; write the apex as an entry of its own
        return fnmatch.fnmatchcase(host, pat)

    def matches(self, host: str, port: int, addresses: Iterable[IPAddress], url: str | None,
                tunnel: bool) -> bool:
        """Whether this entry covers a load of ``host:port`` (resolved to ``addresses``); ``url`` is the full
        URL when known (plain http, navigations), ``tunnel`` True for a CONNECT (https/wss, path unseen)."""
        if self.port is not None and self.port != port:
            return False
        if self.kind == "net":
            assert self.net is not None
            return any(a.version == self.net.version and a in self.net
                       for addr in addresses for a in (addr, *_embedded_v4(addr)))
        if not self._host_matches(host):
            return False
        if self.kind == "host":
            return True
        if url is not None:
            parts = urlsplit(url)
            if not fnmatch.fnmatchcase(parts.scheme.lower(), self.scheme):
                return False
            if not self.path:
                return True
            tail = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
            return fnmatch.fnmatchcase(tail, self.path)
        # A tunnel or a bare host check: only a pattern that covers every path of the host can match.
        if tunnel and not any(fnmatch.fnmatchcase(s, self.scheme) for s in _TUNNEL_SCHEMES):
            return False
        return self.path in ("", "*", "/*")


def parse_entries(texts: Iterable[str]) -> tuple[Entry, ...]:
    """Parse allow/deny entries (see :class:`Entry`); raises ValueError on the first bad one."""
    return tuple(Entry.parse(t) for t in texts)


class NetPolicy:
    """The rule engine: a pure function of (host, port, resolved addresses, URL) -> :class:`Verdict`."""

    def __init__(self, *, allow_private_network: bool = False, allow: Iterable[str] = (),
                 deny: Iterable[str] = (), exempt: Iterable[str] = ()) -> None:
        self.allow_private_network = allow_private_network
        self.allow = parse_entries(allow)
        for e in self.allow:
            if not e.specific:
                raise ValueError(f"allow entry {e.text!r}: give a port (HOST:PORT), an address, a CIDR or a URL "
                                 "pattern; a bare host name cannot lift the private-network block")
        self.deny = parse_entries(deny)
        self.exempt = parse_entries(exempt)
        for e in self.exempt:
            if e.port is None or e.kind == "url":
                raise ValueError(f"exempt entry {e.text!r} must be HOST:PORT")

    @classmethod
    def of(cls, net: NetSettings) -> NetPolicy | None:
        """The rules of ``net``, or None when its policy is off; raises ValueError on a bad entry."""
        if not net.enabled:
            return None
        return cls(allow_private_network=net.allow_private_network, allow=net.allow, deny=net.deny, exempt=net.exempt)

    def precheck(self, host: str, port: int, url: str | None = None, tunnel: bool = False) -> Verdict | None:
        """The verdict when it needs no name resolution (an IP-literal host, a metadata or denied name), else
        None: resolve the name and call :meth:`check`."""
        h = _norm_host(host)
        addr = _ip(h)
        if addr is not None:
            return self.check(h, port, [addr], url, tunnel)
        if h in METADATA_NAMES:
            return Verdict(False, "metadata")
        for e in self.deny:
            if e.kind != "net" and e.matches(h, port, (), url, tunnel):
                return Verdict(False, f"deny {e.text}")
        return None

    def check(self, host: str, port: int, addresses: Iterable[IPAddress | str], url: str | None = None,
              tunnel: bool = False) -> Verdict:
        """Judge a load of ``host:port`` whose name resolved to ``addresses`` (every one is checked; an
        IP-literal host stands for itself when ``addresses`` is empty)."""
        h = _norm_host(host)
        addrs = [a if not isinstance(a, str) else ipaddress.ip_address(a.split("%", 1)[0]) for a in addresses]
        literal = _ip(h)
        if literal is not None and not addrs:
            addrs = [literal]
        if not addrs:
            return Verdict(False, "no address")
        if h in METADATA_NAMES:
            return Verdict(False, "metadata")
        tiers = [classify(a) for a in addrs]
        for tier, rule in tiers:
            if tier == _ALWAYS:
                return Verdict(False, rule)
        for e in self.deny:
            if e.matches(h, port, addrs, url, tunnel):
                return Verdict(False, f"deny {e.text}")
        for e in self.exempt:
            # Every address must be the engine's own server (a name that also resolves elsewhere is not it).
            if all(e.matches(h, port, [a], url, tunnel) for a in addrs):
                return Verdict(True, "engine sites")
        blocked = [(a, rule) for a, (tier, rule) in zip(addrs, tiers, strict=True) if tier == _DEFAULT]
        if not blocked:
            return Verdict(True, "public")
        if self.allow_private_network:
            return Verdict(True, "private network allowed")
        for e in self.allow:
            if e.kind != "net" and e.matches(h, port, addrs, url, tunnel):
                return Verdict(True, f"allow {e.text}")
        for a, rule in blocked:
            if not any(e.kind == "net" and e.matches(h, port, [a], url, tunnel) for e in self.allow):
                return Verdict(False, rule)
        return Verdict(True, "allow " + ", ".join(e.text for e in self.allow if e.kind == "net"
                                                   and e.matches(h, port, addrs, url, tunnel)))

    def deny_url(self, url: str) -> Verdict | None:
        """The refusal of a URL by a path-specific deny pattern (which a TLS tunnel hides from the proxy: the
        worker applies it to main-frame documents once committed), or None."""
        for e in self.deny:
            if e.kind == "url" and e.path not in ("", "*", "/*"):
                try:
                    parts = urlsplit(url)
                    host, port = parts.hostname or "", parts.port or _DEFAULT_PORTS.get(parts.scheme.lower(), 0)
                except ValueError:
                    return Verdict(False, "malformed URL")
                if e.matches(_norm_host(host), port, (), url, False):
                    return Verdict(False, f"deny {e.text}")
        return None

    def check_url(self, url: str) -> Verdict | None:
        """The verdict on a URL that needs no name resolution (see :meth:`precheck`); None for URLs that are
        not network loads (about:, data:, ...) or that need resolving."""
        try:
            parts = urlsplit(url)
            host, port = parts.hostname, parts.port
        except ValueError:
            return Verdict(False, "malformed URL")
        scheme = parts.scheme.lower()
        if scheme not in _DEFAULT_PORTS or not host:
            return None
        return self.precheck(host, port or _DEFAULT_PORTS[scheme], url)


# The engine's own sites served from this process (``host:port`` of each running bundled-site server): they
# are exempt from the policy in every worker this process configures (WorkerConfig.to_json, BrowserWorker),
# so that whoever starts the sites (a run, the library service, a test, a benchmark) needs no extra step.
_ENGINE_SITES: dict[str, int] = {}


def _authority(base_url: str) -> str:
    parts = urlsplit(base_url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"not an http(s) base URL: {base_url!r}")
    host = f"[{parts.hostname}]" if ":" in parts.hostname else parts.hostname
    return f"{host}:{parts.port or _DEFAULT_PORTS[parts.scheme]}"


def register_engine_site(base_url: str) -> None:
    """Exempt a bundled-site server this process runs (``http://HOST:PORT``) from the network policy."""
    key = _authority(base_url)
    _ENGINE_SITES[key] = _ENGINE_SITES.get(key, 0) + 1


def unregister_engine_site(base_url: str) -> None:
    """Undo :func:`register_engine_site` (the server stopped)."""
    key = _authority(base_url)
    if _ENGINE_SITES.get(key, 0) > 1:
        _ENGINE_SITES[key] -= 1
    else:
        _ENGINE_SITES.pop(key, None)


def engine_sites() -> list[str]:
    """``host:port`` of every bundled-site server this process runs now."""
    return sorted(_ENGINE_SITES)


def with_engine_sites(net: NetSettings) -> NetSettings:
    """``net`` with the bundled-site servers this process runs exempt (they are the engine's own sites): the one
    place where the engine's sites join a network policy (a spawned worker's config, the policy sent to workers
    that join, a worker's own sites)."""
    return msgspec.structs.replace(net, exempt=list(dict.fromkeys([*net.exempt, *engine_sites()])))


def bypass_list(exempt: Iterable[str]) -> str:
    """Chromium's proxy bypass list for a context: only the engine's own ``host:port`` entries, and
    ``<-loopback>`` first, which removes Chromium's implicit bypass of loopback hosts (and keeps Playwright
    from adding its own)."""
    return ",".join(["<-loopback>", *exempt])

