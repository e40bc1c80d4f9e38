"""The network policy for pages: which hosts and addresses a page may load from, and the forward proxy that
holds every load of a BrowserContext to it.

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

import asyncio
import contextlib
import fnmatch
import html
import ipaddress
import socket
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from browserpool.request_rules import RequestRules
from browserpool.upstream import ProxyPool, UpstreamProxy

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network

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


def _norm_host(host: str) -> str:
    """A host as the rules compare it: lowercased, without a trailing dot or IPv6 brackets."""
    host = host.strip().lower().rstrip(".")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    return host


def _ip(host: str) -> IPAddress | None:
    try:
        return ipaddress.ip_address(host.split("%", 1)[0])  # a zone index (fe80::1%eth0) does not change the rule
    except ValueError:
        return None


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


def _split_host_port(text: str) -> tuple[str, int | None]:
    """``host``, ``host:port``, ``[v6]``, ``[v6]:port`` or a bare IPv6 address -> (host, port or None)."""
    if text.startswith("["):
        host, sep, rest = text[1:].partition("]")
        if not sep:
            raise ValueError(f"unclosed bracket in {text!r}")
        if not rest:
            return host, None
        if not rest.startswith(":") or not rest[1:].isdigit():
            raise ValueError(f"bad port in {text!r}")
        return host, _port(rest[1:], text)
    if text.count(":") > 1:
        return text, None  # a bare IPv6 address
    host, sep, port = text.partition(":")
    if not sep:
        return host, None
    if not port.isdigit():
        raise ValueError(f"bad port in {text!r}")
    return host, _port(port, text)


def _port(text: str, entry: str) -> int:
    port = int(text)
    if not 0 < port < 65536:
        raise ValueError(f"port out of range in {entry!r}")
    return port


_DEFAULT_PORTS = {"http": 80, "ws": 80, "https": 443, "wss": 443}
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


# --- the proxy -------------------------------------------------------------------------------------------

MAX_HEAD_BYTES = 64 * 1024  # request line plus headers
HEAD_TIMEOUT_S = 60.0  # a connection that never sends a complete request head is closed
_HOP_BY_HOP = frozenset({b"connection", b"keep-alive", b"proxy-connection", b"proxy-authorization",
                         b"proxy-authenticate", b"te", b"trailer", b"upgrade"})
_PIPE_CHUNK = 64 * 1024
# Interim (1xx) response heads passed on before the final one: a server sends one or two (100 Continue, 103 Early
# Hints); one that never stops would otherwise have them relayed for as long as it likes.
MAX_INTERIM_HEADS = 16
# Name lookups of one context's pages in the resolver's threads at once. A lookup holds its thread until the
# resolver answers or gives up (seconds, when a DNS server drops queries), even after its load was abandoned, and the
# worker's contexts share a few threads: without a cap, one page could hold them all, and every other episode of
# the worker would wait for its names.
DNS_LOOKUPS_PER_CONTEXT = 4
# The resolver's threads a worker asks for (libuv's default is 4: two slow pages would hold them all).
RESOLVER_THREADS = 32

# A refused load: the page shows this (plain http) and the favicon is not fetched again through the proxy.
_REFUSED_PAGE = ("<!doctype html><html><head><meta charset=\"utf-8\"><link rel=\"icon\" href=\"data:,\">"
                 "<title>Refused by the network policy</title></head><body><h1>Refused by the network policy"
                 "</h1><p>{url}</p><p>rule: {rule}</p></body></html>")


def _response(status: str, body: str) -> bytes:
    data = body.encode()
    return (f"HTTP/1.1 {status}\r\nContent-Type: text/html; charset=utf-8\r\nContent-Length: {len(data)}\r\n"
            "Cache-Control: no-store\r\nConnection: close\r\n\r\n").encode() + data


def _end_to_end(head_rest: bytes) -> list[bytes]:
    """The header lines of a head (after its first line) without the hop-by-hop ones."""
    return [h for h in head_rest.split(b"\r\n") if h and h.split(b":", 1)[0].strip().lower() not in _HOP_BY_HOP]


def _content_length(headers: list[bytes]) -> int | None:
    """The body length a request announces: Content-Length, 0 without one, None for a chunked body."""
    length = 0
    for h in headers:
        name, _, value = h.partition(b":")
        name = name.strip().lower()
        if name == b"transfer-encoding" and b"chunked" in value.lower():
            return None
        if name == b"content-length":
            try:
                length = max(0, int(value.strip()))
            except ValueError:
                return 0
    return length


async def _relay_head(u_reader: asyncio.StreamReader, c_writer: asyncio.StreamWriter) -> bool:
    """Pass the upstream response head on with ``Connection: close`` (interim 1xx heads as they are, at most
    MAX_INTERIM_HEADS of them); False when the upstream side sent no well-formed head."""
    interim = 0
    while True:
        try:
            head = await u_reader.readuntil(b"\r\n\r\n")
        except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, ConnectionError, OSError):
            return False
        status, _, rest = head.partition(b"\r\n")
        code = status.split(b" ", 2)[1] if status.count(b" ") >= 1 else b""
        if code.startswith(b"1") and code != b"101":
            interim += 1
            if interim > MAX_INTERIM_HEADS:
                return False
            c_writer.write(head)
            try:
                await c_writer.drain()  # at the client's pace: unread heads must not pile up here
            except (ConnectionError, OSError):
                return False
            continue
        c_writer.write(status + b"\r\n" + b"".join(h + b"\r\n" for h in _end_to_end(rest))
                       + b"Connection: close\r\nProxy-Connection: close\r\n\r\n")
        return True


def _origin(scheme: str, host: str, port: int) -> str:
    h = f"[{host}]" if ":" in host else host
    return f"{scheme}://{h}" if _DEFAULT_PORTS.get(scheme) == port else f"{scheme}://{h}:{port}"


class ContextProxy:
    """A forward proxy for one BrowserContext, on 127.0.0.1 (an ephemeral port), in the worker's event loop.

    It serves CONNECT (https, wss, ws) and absolute-form plain-http requests; it judges each with the policy,
    resolves names itself (or through ``hosts``, a name -> address map used instead of DNS), connects to
    the address it checked, and pipes bytes. A refused request gets a 403 (a page naming the rule, for plain
    http) and ``on_refused(url, rule)``. A plain-http request goes upstream with ``Connection: close``, only its
    own body follows it, its response goes back with ``Connection: close`` (whatever the server said), and the
    client side is closed when the upstream side closes: a kept-alive connection never carries a request to a
    host that was not checked for it.
    """

    def __init__(self, policy: NetPolicy, on_refused: Callable[[str, str], None] | None = None,
                 hosts: dict[str, str] | None = None, connect_timeout_s: float = 10.0,
                 on_unreachable: Callable[[str, str], None] | None = None,
                 upstream: ProxyPool | None = None, rules: RequestRules | None = None) -> None:
        self.policy = policy
        self.rules = rules  # ads and trackers refused before anything else (browserpool.request_rules)
        self.blocked_by_rules = 0
        self.on_refused = on_refused
        # Upstream proxies (browserpool.upstream): every connection is a CONNECT tunnel through this context's
        # proxy to the checked address; None: connect directly.
        self.upstream = upstream
        self.via: UpstreamProxy | None = None
        # Called with (url, "dns: ..." | "connect: ..." | "timeout: ...") when a host cannot be reached: the
        # browser only sees a failed tunnel or a 502, the page's observation says which.
        self.on_unreachable = on_unreachable
        self.hosts = {_norm_host(k): v for k, v in (hosts or {}).items()}
        self.connect_timeout_s = connect_timeout_s
        self._lookups = asyncio.Semaphore(DNS_LOOKUPS_PER_CONTEXT)
        self.origins: set[str] = set()  # every origin a load went to (its storage is cleared between episodes)
        self.requests = 0
        self.refused = 0
        self._server: asyncio.Server | None = None
        self._conns: set[asyncio.StreamWriter] = set()
        self.port = 0

    @property
    def server(self) -> str:
        """The proxy's address as Chromium takes it (``http://127.0.0.1:PORT``)."""
        return f"http://127.0.0.1:{self.port}"

    async def start(self) -> None:
        """Listen on 127.0.0.1 (a free port)."""
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0, limit=MAX_HEAD_BYTES)
        self.port = self._server.sockets[0].getsockname()[1]

    def close_connections(self) -> None:
        """Drop every open connection (between episodes: no tunnel or socket outlives its episode)."""
        for w in list(self._conns):
            w.transport.abort()
        self._conns.clear()

    async def close(self) -> None:
        """Stop listening and drop every connection."""
        if self._server is not None:
            self._server.close()
            self.close_connections()
            with contextlib.suppress(Exception):
                async with asyncio.timeout(2):
                    await self._server.wait_closed()
            self._server = None

    # --- internals --------------------------------------------------------------------------------------
    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._conns.add(writer)
        upstream: asyncio.StreamWriter | None = None
        try:
            try:
                async with asyncio.timeout(HEAD_TIMEOUT_S):
                    head = await reader.readuntil(b"\r\n\r\n")
            except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, TimeoutError, ConnectionError):
                return
            line, _, rest = head.partition(b"\r\n")
            try:
                method, target, _version = line.decode("latin-1").split(" ")
            except ValueError:
                writer.write(_response("400 Bad Request", "bad request line"))
                return
            self.requests += 1
            if method == "CONNECT":
                upstream = await self._connect(reader, writer, target)
            else:
                upstream = await self._forward(reader, writer, method, target, rest)
        except (ConnectionError, OSError):
            pass
        finally:
            self._conns.discard(writer)
            if upstream is not None:
                upstream.transport.abort()
            with contextlib.suppress(Exception):
                if not writer.is_closing():
                    await writer.drain()
                writer.close()

    async def _connect(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                       target: str) -> asyncio.StreamWriter | None:
        try:
            host, port = _split_host_port(target)
        except ValueError:
            host, port = "", None
        if not host or port is None:
            writer.write(_response("400 Bad Request", "CONNECT needs host:port"))
            return None
        host = _norm_host(host)
        up = await self._open(writer, host, port, None, f"{host}:{port}", tunnel=True)
        if up is None:
            return None
        up_reader, up_writer = up
        self.origins.add(_origin("https", host, port))
        writer.write(b"HTTP/1.1 200 Connection Established\r\n\r\n")
        await self._pipe(reader, writer, up_reader, up_writer)
        return up_writer

    async def _forward(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, method: str,
                       target: str, rest: bytes) -> asyncio.StreamWriter | None:
        try:
            parts = urlsplit(target)
            host, port = parts.hostname or "", parts.port or 80
            ok = parts.scheme.lower() == "http" and bool(host)
        except ValueError:
            ok = False
        if not ok:
            writer.write(_response("400 Bad Request", "only absolute http:// URLs and CONNECT are served"))
            return None
        host = _norm_host(host)
        up = await self._open(writer, host, port, target, target, tunnel=False)
        if up is None:
            return None
        up_reader, up_writer = up
        self.origins.add(_origin("http", host, port))
        path = target[target.find("/", 7):] if "/" in target[7:] else "/"
        headers = _end_to_end(rest)
        up_writer.write(f"{method} {path} HTTP/1.1\r\n".encode("latin-1") + b"".join(h + b"\r\n" for h in headers)
                        + b"Connection: close\r\n\r\n")
        # Only this request's body goes upstream: a client that sent another request on the same connection would
        # otherwise reach this host with it, whatever host it named.
        length = _content_length(headers)
        await self._pipe(reader, writer, up_reader, up_writer, body_bytes=length, relay_head=True)
        return up_writer

    async def _open(self, writer: asyncio.StreamWriter, host: str, port: int, url: str | None, shown: str,
                    tunnel: bool) -> tuple[asyncio.StreamReader, asyncio.StreamWriter] | None:
        """Judge the load and connect to the address that was checked; None (and the client answered) when
        refused or unreachable."""
        if self.rules is not None and (rule := self.rules.blocks(host)) is not None:
            # Counted, not reported one by one: an ad-heavy page makes dozens of these per load.
            self.blocked_by_rules += 1
            writer.write(_response("403 Forbidden", f"blocked by the request rules ({html.escape(rule)})"))
            return None
        verdict = self.policy.precheck(host, port, url, tunnel)
        addrs: list[IPAddress] = []
        if verdict is None:
            try:
                addrs = await self._resolve(host, port)
            except (OSError, TimeoutError, ValueError) as exc:
                self._unreachable(shown, f"{'timeout' if isinstance(exc, TimeoutError) else 'dns'}: "
                                         f"cannot resolve {host}: {exc}")
                writer.write(_response("502 Bad Gateway", f"cannot resolve {html.escape(host)}: "
                                                          f"{html.escape(str(exc))}"))
                return None
            verdict = self.policy.check(host, port, addrs, url, tunnel)
        elif verdict.allowed:
            addrs = [ipaddress.ip_address(host)]
        if not verdict.allowed:
            self.refused += 1
            if self.on_refused is not None:
                self.on_refused(shown, verdict.rule)
            body = _REFUSED_PAGE.format(url=html.escape(shown[:500]), rule=html.escape(verdict.rule))
            writer.write(_response("403 Forbidden", body))
            return None
        error: Exception | None = None
        for addr in addrs:
            try:
                async with asyncio.timeout(self.connect_timeout_s):
                    return await self.open_upstream(addr, port)
            except (OSError, TimeoutError) as exc:
                error = exc
        self._unreachable(shown, f"{'timeout' if isinstance(error, TimeoutError) else 'connect'}: "
                                 f"cannot connect to {shown[:200]}: {error}")
        writer.write(_response("502 Bad Gateway", f"cannot connect to {html.escape(shown[:500])}: "
                                                  f"{html.escape(str(error))}"))
        return None

    def _unreachable(self, shown: str, detail: str) -> None:
        if self.on_unreachable is not None:
            self.on_unreachable(shown, detail)

    async def open_upstream(self, addr: IPAddress, port: int) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        """Connect to a checked address (an IP, never a name: no second resolution), through the context's upstream
        proxy when there is one."""
        if self.upstream is not None:
            reader, writer, self.via = await self.upstream.tunnel(str(addr), port, self.via)
            return reader, writer
        return await asyncio.open_connection(str(addr), port, limit=_PIPE_CHUNK)

    async def _resolve(self, host: str, port: int) -> list[IPAddress]:
        mapped = self.hosts.get(host)
        if mapped is not None:
            return [ipaddress.ip_address(a.strip()) for a in mapped.split(",")]
        async with asyncio.timeout(self.connect_timeout_s):
            await self._lookups.acquire()
            # The slot is this lookup's until the resolver is done with it, not until this wait ends.
            lookup = asyncio.ensure_future(self._getaddrinfo(host, port))
            lookup.add_done_callback(self._lookup_done)
            infos = await asyncio.shield(lookup)
        out: list[IPAddress] = []
        for *_, sockaddr in infos:
            addr = ipaddress.ip_address(str(sockaddr[0]).split("%", 1)[0])
            if addr not in out:
                out.append(addr)
        if not out:
            raise OSError(f"no address for {host}")
        return out

    async def _getaddrinfo(self, host: str, port: int) -> list[Any]:
        return await asyncio.get_running_loop().getaddrinfo(host, port, type=socket.SOCK_STREAM)

    def _lookup_done(self, lookup: asyncio.Future[Any]) -> None:
        self._lookups.release()
        if not lookup.cancelled():
            lookup.exception()  # retrieved: an abandoned lookup's failure is nobody's to report

    async def _pipe(self, c_reader: asyncio.StreamReader, c_writer: asyncio.StreamWriter,
                    u_reader: asyncio.StreamReader, u_writer: asyncio.StreamWriter, body_bytes: int | None = None,
                    relay_head: bool = False) -> None:
        """Copy bytes both ways until the upstream side closes (then the client side is closed too).

        ``body_bytes``: forward at most this many bytes from the client (None: all of them, a tunnel or a
        chunked body). ``relay_head``: the upstream side starts with an HTTP response head, passed on with
        ``Connection: close`` (so that the client never sends another request on this connection, even when
        the server would keep it alive)."""
        async def copy(src: asyncio.StreamReader, dst: asyncio.StreamWriter, limit: int | None) -> None:
            try:
                while limit is None or limit > 0:
                    data = await src.read(_PIPE_CHUNK if limit is None else min(_PIPE_CHUNK, limit))
                    if not data:
                        break
                    if limit is not None:
                        limit -= len(data)
                    dst.write(data)
                    await dst.drain()
                if limit is None and dst.can_write_eof():
                    dst.write_eof()
            except (ConnectionError, OSError):
                pass

        up = asyncio.ensure_future(copy(c_reader, u_writer, body_bytes))
        try:
            if relay_head and not await _relay_head(u_reader, c_writer):
                return
            await copy(u_reader, c_writer, None)
        finally:
            up.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await up


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


def bypass_list(exempt: Iterable[str]) -> str:
    """Chromium's proxy bypass list for a context: only the engine's own ``host:port`` entries, and
    ``<-loopback>`` first, which removes Chromium's implicit bypass of loopback hosts (and keeps Playwright
    from adding its own)."""
    return ",".join(["<-loopback>", *exempt])

