"""The forward proxy that holds every load of a BrowserContext to the network policy (``netpolicy.py``): one per
context, on 127.0.0.1, in the worker's event loop; it judges each request, resolves names itself and connects to
the address it checked (see :class:`ContextProxy`)."""

from __future__ import annotations

import asyncio
import contextlib
import html
import ipaddress
import socket
from collections.abc import Callable
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from browserpool.net_addresses import _DEFAULT_PORTS, IPAddress, _norm_host, _split_host_port
from browserpool.request_rules import RequestRules
from browserpool.upstream import ProxyPool, UpstreamProxy

if TYPE_CHECKING:
    from browserpool.netpolicy import NetPolicy

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

