"""The network policy for pages: the rule engine (a pure function, no browser), the per-context proxy (real
sockets), and every route a page has to a blocked address, in a real Chromium.

Nothing here sends traffic outside 127.0.0.0/8: blocked "private" and "metadata" hosts are fake names mapped to
loopback addresses by the proxy's host map, IP-literal metadata URLs are refused before any connection, and the
in-process worker's proxy is fenced so that a connection to anything but loopback fails the test instead of
leaving the machine.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import ipaddress
import socket
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, quote, urlsplit

import pytest
import pytest_asyncio

from browserpool.config import WorkerConfig
from browserpool.netpolicy import (
    DNS_LOOKUPS_PER_CONTEXT,
    MAX_INTERIM_HEADS,
    ContextProxy,
    Entry,
    NetPolicy,
    Verdict,
    bypass_list,
    classify,
)
from browserpool.pool import BrowserPool, BrowserSession
from browserpool.protocol import BrowserAction, NetSettings, Observation, PageEvent
from browserpool.worker import BrowserWorker
from tests.conftest import FIXTURES_DIR, inproc_pool, open_session, until

# --- the rule engine ---------------------------------------------------------------------------------------

P = NetPolicy()


def verdict(policy: NetPolicy, host: str, port: int = 80, *addrs: str, url: str | None = None) -> Verdict:
    return policy.check(host, port, list(addrs), url)


@pytest.mark.parametrize(("addr", "rule"), [
    ("169.254.169.254", "metadata"), ("fd00:ec2::254", "metadata"), ("100.100.100.200", "metadata"),
    ("169.254.170.2", "metadata"), ("169.254.1.1", "link-local"), ("fe80::1", "link-local"),
    ("0.0.0.0", "unspecified"), ("0.1.2.3", "unspecified"), ("::", "unspecified"),
    ("224.0.0.251", "multicast"), ("ff02::1", "multicast"), ("255.255.255.255", "reserved"),
    # IPv6 forms that carry an IPv4 address are judged by it.
    ("::ffff:169.254.169.254", "metadata"), ("::ffff:a9fe:1", "link-local"), ("64:ff9b::a9fe:a9fe", "metadata"),
    ("2002:a9fe:a9fe::1", "metadata"), ("::169.254.169.254", "metadata"),
])
def test_always_blocked_addresses_are_refused_whatever_the_flags(addr: str, rule: str) -> None:
    lenient = NetPolicy(allow_private_network=True, allow=["0.0.0.0/0", "::/0", f"[{addr}]:80" if ":" in addr
                                                          else f"{addr}:80"])
    for policy in (P, lenient):
        assert verdict(policy, addr, 80) == Verdict(False, rule)
        assert verdict(policy, "innocent.example", 80, addr) == Verdict(False, rule)
    assert classify(ipaddress.ip_address(addr))[0] == 2


@pytest.mark.parametrize(("addr", "rule"), [
    ("127.0.0.1", "loopback"), ("127.9.9.9", "loopback"), ("::1", "loopback"), ("10.1.2.3", "private"),
    ("172.16.0.1", "private"), ("172.31.255.254", "private"), ("192.168.1.1", "private"),
    ("100.64.0.1", "shared (CGNAT)"), ("fd12:3456::1", "unique-local"), ("fc00::1", "unique-local"),
    ("::ffff:10.0.0.1", "private"), ("::ffff:127.0.0.1", "loopback"), ("64:ff9b::a00:1", "private"),
    ("198.18.0.1", "special-purpose"),
])
def test_private_addresses_are_refused_by_default_and_allowed_with_the_flag(addr: str, rule: str) -> None:
    assert verdict(P, "intranet.example", 8080, addr) == Verdict(False, rule)
    assert verdict(NetPolicy(allow_private_network=True), "intranet.example", 8080, addr).allowed


@pytest.mark.parametrize("addr", ["93.184.216.34", "2606:2800:220:1:248:1893:25c8:1946", "172.32.0.1",
                                  "100.128.0.1", "::ffff:93.184.216.34"])
def test_public_addresses_are_allowed(addr: str) -> None:
    assert verdict(P, "example.com", 443, addr) == Verdict(True, "public")


def test_every_resolved_address_is_checked() -> None:
    assert verdict(P, "rebind.example", 80, "93.184.216.34", "10.0.0.7") == Verdict(False, "private")
    assert verdict(P, "rebind.example", 80, "93.184.216.34", "169.254.169.254") == Verdict(False, "metadata")
    assert verdict(P, "nowhere.example", 80) == Verdict(False, "no address")


@pytest.mark.parametrize("name", ["metadata.google.internal", "METADATA.Google.Internal.", "metadata",
                                  "instance-data.ec2.internal"])
def test_metadata_names_are_refused_before_resolution(name: str) -> None:
    assert P.precheck(name, 80) == Verdict(False, "metadata")
    # Even when a lenient setup resolves them to a public address.
    lenient = NetPolicy(allow_private_network=True, allow=[f"{name.lower().rstrip('.')}:80"])
    assert verdict(lenient, name, 80, "93.184.216.34") == Verdict(False, "metadata")


def test_precheck_decides_ip_literals_and_denied_names_without_resolution() -> None:
    policy = NetPolicy(deny=["*.evil.example"])
    assert policy.precheck("169.254.169.254", 80) == Verdict(False, "metadata")
    assert policy.precheck("[::1]", 80) == Verdict(False, "loopback")
    assert policy.precheck("93.184.216.34", 443) == Verdict(True, "public")
    assert policy.precheck("a.evil.example", 443) == Verdict(False, "deny *.evil.example")
    assert policy.precheck("example.com", 443) is None  # needs resolving


def test_deny_entries() -> None:
    policy = NetPolicy(deny=["*.ads.example", "tracker.example", "203.0.113.0/24", "shop.example:8080",
                             "http://news.example/admin/*"])
    pub = "93.184.216.34"
    assert verdict(policy, "x.ads.example", 80, pub) == Verdict(False, "deny *.ads.example")
    assert verdict(policy, "a.b.ads.example", 80, pub).rule == "deny *.ads.example"
    assert verdict(policy, "ads.example", 80, pub).allowed  # the apex is its own entry
    assert verdict(policy, "Tracker.Example.", 443, pub) == Verdict(False, "deny tracker.example")
    assert verdict(policy, "cdn.example", 443, "203.0.113.9") == Verdict(False, "deny 203.0.113.0/24")
    assert verdict(policy, "shop.example", 8080, pub) == Verdict(False, "deny shop.example:8080")
    assert verdict(policy, "shop.example", 80, pub).allowed
    assert verdict(policy, "news.example", 80, pub, url="http://news.example/admin/users").rule == \
        "deny http://news.example/admin/*"
    assert verdict(policy, "news.example", 80, pub, url="http://news.example/today").allowed
    # A TLS tunnel hides the path: a path-specific pattern does not refuse the whole host ...
    assert policy.check("news.example", 443, [pub], None, tunnel=True).allowed
    # ... the worker applies it to the main frame's committed URL.
    assert policy.deny_url("https://news.example/admin/x") is None  # the pattern is http://
    https_policy = NetPolicy(deny=["https://news.example/admin/*", "wss://chat.example/*"])
    assert https_policy.deny_url("https://news.example/admin/x") == Verdict(False, "deny https://news.example/admin/*")
    assert https_policy.deny_url("https://news.example/") is None
    assert https_policy.check("chat.example", 443, [pub], None, tunnel=True).rule == "deny wss://chat.example/*"


def test_deny_wins_over_allow_and_allow_needs_a_specific_entry() -> None:
    policy = NetPolicy(allow=["10.0.0.0/8", "intranet.example:8080"], deny=["10.0.0.66", "intranet.example"])
    assert verdict(policy, "a.example", 80, "10.0.0.5") == Verdict(True, "allow 10.0.0.0/8")
    assert verdict(policy, "a.example", 80, "10.0.0.66") == Verdict(False, "deny 10.0.0.66")
    assert verdict(policy, "intranet.example", 8080, "192.168.0.2") == Verdict(False, "deny intranet.example")
    with pytest.raises(ValueError, match="bare host name"):
        NetPolicy(allow=["intranet.example"])
    with pytest.raises(ValueError, match="bare host name"):
        NetPolicy(allow=["*.corp.example"])


def test_an_explicit_host_port_allow_beats_the_private_block() -> None:
    policy = NetPolicy(allow=["intranet.example:8080", "127.0.0.1:9000", "[::1]:9001", "http://wiki.corp/*"])
    assert verdict(policy, "intranet.example", 8080, "10.0.0.5") == Verdict(True, "allow intranet.example:8080")
    assert verdict(policy, "intranet.example", 8081, "10.0.0.5") == Verdict(False, "private")
    assert verdict(policy, "127.0.0.1", 9000) == Verdict(True, "allow 127.0.0.1:9000")
    assert verdict(policy, "127.0.0.1", 9001) == Verdict(False, "loopback")
    assert verdict(policy, "::1", 9001).allowed
    assert verdict(policy, "wiki.corp", 80, "10.1.1.1", url="http://wiki.corp/page").allowed
    assert not verdict(policy, "wiki.corp", 8080, "10.1.1.1", url="http://wiki.corp:8080/page").allowed
    # A CIDR allow covers the addresses it names, not the others of the same name.
    cidr = NetPolicy(allow=["10.0.0.0/24"])
    assert not verdict(cidr, "two.example", 80, "10.0.0.5", "10.0.1.5").allowed
    # An allow never lifts the always-blocked ranges.
    assert not verdict(NetPolicy(allow=["169.254.0.0/16"]), "x.example", 80, "169.254.10.10").allowed


def test_the_engine_sites_are_exempt_and_nothing_else_on_loopback() -> None:
    policy = NetPolicy(exempt=["127.0.0.1:8123"])
    assert verdict(policy, "127.0.0.1", 8123) == Verdict(True, "engine sites")
    assert verdict(policy, "localhost", 8123, "127.0.0.1") == Verdict(True, "engine sites")
    assert verdict(policy, "127.0.0.1", 8124) == Verdict(False, "loopback")
    assert verdict(policy, "localhost", 8123, "127.0.0.1", "::1") == Verdict(False, "loopback")
    with pytest.raises(ValueError, match="HOST:PORT"):
        NetPolicy(exempt=["127.0.0.1"])
    # The bypass list Chromium gets: loopback is proxied, only the engine's own host:port is not.
    assert bypass_list(["127.0.0.1:8123"]) == "<-loopback>,127.0.0.1:8123"


@pytest.mark.parametrize(("text", "kind", "host", "port"), [
    ("example.com", "host", "example.com", None), ("*.Example.com", "host", "*.example.com", None),
    ("example.com:8080", "host", "example.com", 8080), ("10.0.0.1", "net", "", None),
    ("10.0.0.1:80", "net", "", 80), ("[fd00::1]:443", "net", "", 443), ("fd00::1", "net", "", None),
    ("10.0.0.0/8", "net", "", None), ("https://x.example/a/*", "url", "x.example", 443),
    ("http://x.example:8080", "url", "x.example", 8080),
])
def test_entries_parse(text: str, kind: str, host: str, port: int | None) -> None:
    e = Entry.parse(text)
    assert (e.kind, e.host, e.port) == (kind, host, port)


@pytest.mark.parametrize("text", ["", "10.0.0.0/33", "example.com:http", "example.com:70000", "[::1", "http:///x"])
def test_bad_entries_are_refused_with_the_entry_named(text: str) -> None:
    with pytest.raises(ValueError):
        Entry.parse(text)


# --- the proxy, over real sockets --------------------------------------------------------------------------

class CountingServer:
    """An HTTP server on 127.0.0.1 that counts every connection it accepts (a refused load must never reach
    it). Serves test fixtures under /fixtures/, ``/redirect?to=URL`` (302), ``/download`` (an attachment), POSTs,
    and a small page otherwise."""

    def __init__(self) -> None:
        outer = self
        self.connections = 0
        self.requests: list[tuple[str, str, dict[str, str]]] = []

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: Any) -> None:
                pass

            def _reply(self, status: int, body: bytes, ctype: str = "text/html; charset=utf-8",
                       extra: dict[str, str] | None = None) -> None:
                self.send_response(status)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(body)))
                for k, v in (extra or {}).items():
                    self.send_header(k, v)
                self.end_headers()
                self.wfile.write(body)

            def do_GET(self) -> None:
                outer.requests.append(("GET", self.path, dict(self.headers)))
                parts = urlsplit(self.path)
                if parts.path == "/redirect":
                    self._reply(302, b"", extra={"Location": parse_qs(parts.query)["to"][0]})
                elif parts.path == "/download":
                    self._reply(200, b"private notes", "application/octet-stream",
                                {"Content-Disposition": 'attachment; filename="report.bin"'})
                elif parts.path.startswith("/fixtures/"):
                    path = FIXTURES_DIR / parts.path.removeprefix("/fixtures/")
                    self._reply(200, path.read_bytes()) if path.is_file() else self._reply(404, b"no")
                else:
                    self._reply(200, b'<!doctype html><link rel="icon" href="data:,"><title>reached</title>'
                                     b'<p>the request arrived</p>')

            def do_POST(self) -> None:
                n = int(self.headers.get("Content-Length") or 0)
                self.rfile.read(n)
                outer.requests.append(("POST", self.path, dict(self.headers)))
                self._reply(200, b'<!doctype html><link rel="icon" href="data:,"><title>posted</title>')

        class Server(ThreadingHTTPServer):
            daemon_threads = True

            def process_request(self, request: Any, client_address: Any) -> None:
                outer.connections += 1
                super().process_request(request, client_address)

        self.httpd = Server(("127.0.0.1", 0), Handler)
        self.port = self.httpd.server_address[1]
        self.base_url = f"http://127.0.0.1:{self.port}"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture(scope="module")
def target() -> Iterator[CountingServer]:
    """A loopback server that pages must never reach (refused by default)."""
    server = CountingServer()
    yield server
    server.close()


@pytest.fixture(scope="module")
def helper() -> Iterator[CountingServer]:
    """A loopback server the worker's policy allows explicitly (``--net-allow 127.0.0.1:PORT``)."""
    server = CountingServer()
    yield server
    server.close()


class Fence:
    """Wraps ContextProxy.open_upstream: a connection to anything but loopback is recorded and never made."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.outside: list[str] = []
        self.dialed: list[str] = []
        real = ContextProxy.open_upstream

        async def fenced(proxy: ContextProxy, addr: Any, port: int) -> Any:
            self.dialed.append(f"{addr}:{port}")
            if not addr.is_loopback:
                self.outside.append(f"{addr}:{port}")
                raise OSError("the test fence: only loopback")
            return await real(proxy, addr, port)

        monkeypatch.setattr(ContextProxy, "open_upstream", fenced)


async def http_via(proxy: ContextProxy, head: str, body: bytes = b"") -> bytes:
    """Send one raw request to the proxy and read everything it answers until it closes."""
    reader, writer = await asyncio.open_connection("127.0.0.1", proxy.port)
    writer.write(head.encode() + body)
    await writer.drain()
    data = await asyncio.wait_for(reader.read(-1), 10)
    writer.close()
    return data


async def test_proxy_refuses_before_connecting_and_names_the_rule(target: CountingServer,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    fence = Fence(monkeypatch)
    refused: list[tuple[str, str]] = []
    proxy = ContextProxy(NetPolicy(), lambda url, rule: refused.append((url, rule)),
                         hosts={"intranet.test": "127.0.0.1"})
    await proxy.start()
    try:
        before = target.connections
        for url, rule in [(f"{target.base_url}/x", "loopback"), ("http://169.254.169.254/latest/", "metadata"),
                          ("http://metadata.google.internal/computeMetadata/v1/", "metadata"),
                          (f"http://intranet.test:{target.port}/", "loopback"), ("http://[::1]:1/", "loopback"),
                          ("http://0x7f.1:80/", "loopback")]:
            host = urlsplit(url).netloc
            data = await http_via(proxy, f"GET {url} HTTP/1.1\r\nHost: {host}\r\n\r\n")
            assert data.startswith(b"HTTP/1.1 403 "), data[:200]
            assert f"rule: {rule}".encode() in data
        data = await http_via(proxy, "CONNECT 169.254.169.254:443 HTTP/1.1\r\nHost: 169.254.169.254:443\r\n\r\n")
        assert data.startswith(b"HTTP/1.1 403 ")
        data = await http_via(proxy, f"CONNECT intranet.test:{target.port} HTTP/1.1\r\n\r\n")
        assert data.startswith(b"HTTP/1.1 403 ")
        assert target.connections == before
        assert fence.dialed == [] and fence.outside == []
        assert [r for _, r in refused] == ["loopback", "metadata", "metadata", "loopback", "loopback", "loopback",
                                           "metadata", "loopback"]
        assert refused[-2][0] == "169.254.169.254:443" and refused[0][0] == f"{target.base_url}/x"
    finally:
        await proxy.close()


async def test_proxy_forwards_allowed_loads_to_the_checked_address(helper: CountingServer,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    fence = Fence(monkeypatch)
    proxy = ContextProxy(NetPolicy(allow=[f"127.0.0.1:{helper.port}", f"named.test:{helper.port}"]),
                         hosts={"named.test": "127.0.0.1"})
    await proxy.start()
    try:
        n = len(helper.requests)
        # Plain http: origin-form upstream, hop-by-hop headers dropped, Connection: close; a second request on the
        # same client connection is never sent upstream (the proxy closes when the upstream side does).
        head = (f"GET http://named.test:{helper.port}/page?q=1 HTTP/1.1\r\nHost: named.test:{helper.port}\r\n"
                "Proxy-Connection: keep-alive\r\nProxy-Authorization: Basic eA==\r\nX-Kept: yes\r\n\r\n")
        second = f"GET http://127.0.0.1:{helper.port}/second HTTP/1.1\r\nHost: 127.0.0.1:{helper.port}\r\n\r\n"
        data = await http_via(proxy, head + second)
        assert data.startswith(b"HTTP/1.1 200 ") and b"the request arrived" in data
        assert data.count(b"HTTP/1.1 ") == 1
        method, path, headers = helper.requests[n]
        assert (method, path, headers.get("X-Kept"), headers.get("Connection")) == ("GET", "/page?q=1", "yes", "close")
        assert "Proxy-Authorization" not in headers and "Proxy-Connection" not in headers
        assert len(helper.requests) == n + 1
        # A POST body goes through.
        data = await http_via(proxy, f"POST http://127.0.0.1:{helper.port}/form HTTP/1.1\r\nHost: x\r\n"
                                     "Content-Length: 5\r\n\r\n", b"a=1&b")
        assert data.startswith(b"HTTP/1.1 200 ") and helper.requests[-1][:2] == ("POST", "/form")
        # CONNECT: a tunnel to the checked address.
        reader, writer = await asyncio.open_connection("127.0.0.1", proxy.port)
        writer.write(f"CONNECT named.test:{helper.port} HTTP/1.1\r\n\r\n".encode())
        assert (await reader.readuntil(b"\r\n\r\n")).startswith(b"HTTP/1.1 200 ")
        writer.write(b"GET /tunnelled HTTP/1.1\r\nHost: named.test\r\nConnection: close\r\n\r\n")
        assert b"the request arrived" in await asyncio.wait_for(reader.read(-1), 10)
        writer.close()
        assert helper.requests[-1][1] == "/tunnelled"
        assert fence.outside == [] and set(fence.dialed) == {f"127.0.0.1:{helper.port}"}
        assert proxy.origins == {f"http://named.test:{helper.port}", f"http://127.0.0.1:{helper.port}",
                                 f"https://named.test:{helper.port}"}
        # Malformed requests get a 400, never a crash.
        assert (await http_via(proxy, "GET /relative HTTP/1.1\r\n\r\n")).startswith(b"HTTP/1.1 400 ")
        assert (await http_via(proxy, "garbage\r\n\r\n")).startswith(b"HTTP/1.1 400 ")
        assert (await http_via(proxy, "CONNECT nohost HTTP/1.1\r\n\r\n")).startswith(b"HTTP/1.1 400 ")
    finally:
        await proxy.close()


async def test_interim_response_heads_are_relayed_up_to_a_cap() -> None:
    # A server that sends 1xx heads without end had each one relayed, with no wait for the client to read them:
    # the worker's memory grew by about 18 MiB a second while the client did not read.
    async def upstream(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        request = await reader.readuntil(b"\r\n\r\n")
        try:
            if b"/endless" in request:
                while True:
                    writer.write(b"HTTP/1.1 100 Continue\r\n\r\n" * 100)
                    await writer.drain()
            writer.write(b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 103 Early Hints\r\nLink: </a.css>\r\n\r\n"
                         b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
            await writer.drain()
        except ConnectionError:
            pass
        finally:
            writer.close()

    server = await asyncio.start_server(upstream, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    proxy = ContextProxy(NetPolicy(allow=[f"127.0.0.1:{port}"]))
    await proxy.start()
    try:
        data = await http_via(proxy, f"GET http://127.0.0.1:{port}/fine HTTP/1.1\r\nHost: x\r\n\r\n")
        assert data.count(b"HTTP/1.1 1") == 2 and b"HTTP/1.1 200 OK" in data and data.endswith(b"ok")
        data = await http_via(proxy, f"GET http://127.0.0.1:{port}/endless HTTP/1.1\r\nHost: x\r\n\r\n")
        assert data == b"HTTP/1.1 100 Continue\r\n\r\n" * MAX_INTERIM_HEADS  # then the proxy closed it
    finally:
        await proxy.close()
        server.close()


async def test_a_pages_name_lookups_cannot_take_every_resolver_thread(helper: CountingServer,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    # A lookup holds a resolver thread until the DNS server answers, even after its load was given up, and a
    # worker's contexts share those threads. Test stand-ins: the resolver's threads, one more than a context may
    # hold, and a DNS server that drops queries for *.drop.test (a lookup that blocks its thread for 3 s).
    active, peak = 0, 0
    counting = threading.Lock()
    threads = concurrent.futures.ThreadPoolExecutor(max_workers=DNS_LOOKUPS_PER_CONTEXT + 1)

    def resolve(host: str, port: int) -> list[Any]:
        nonlocal active, peak
        if not host.endswith(".drop.test"):
            return [(socket.AF_INET, socket.SOCK_STREAM, 6, "", ("127.0.0.1", port))]
        with counting:
            active += 1
            peak = max(peak, active)
        try:
            time.sleep(3.0)
            raise OSError("no answer")
        finally:
            with counting:
                active -= 1

    async def lookup(self: ContextProxy, host: str, port: int) -> list[Any]:
        return await asyncio.get_running_loop().run_in_executor(threads, resolve, host, port)

    monkeypatch.setattr(ContextProxy, "_getaddrinfo", lookup)
    greedy = ContextProxy(NetPolicy(allow=[f"127.0.0.1:{helper.port}"]), connect_timeout_s=0.5)
    other = ContextProxy(NetPolicy(allow=[f"127.0.0.1:{helper.port}"]))
    await greedy.start()
    await other.start()
    try:
        loads = [http_via(greedy, f"GET http://n{i}.drop.test/ HTTP/1.1\r\nHost: n{i}.drop.test\r\n\r\n")
                 for i in range(8)]
        answers = await asyncio.gather(*loads)
        # Each load gave up on its lookup; at most DNS_LOOKUPS_PER_CONTEXT of them held a thread at once.
        assert all(a.startswith(b"HTTP/1.1 502 ") for a in answers) and peak == DNS_LOOKUPS_PER_CONTEXT
        # Another context's name gets the thread left over at once; without the cap it would wait for the
        # dropped lookups (2.5 s more).
        t0 = time.monotonic()
        data = await http_via(other, f"GET http://named.test:{helper.port}/ HTTP/1.1\r\nHost: x\r\n\r\n")
        assert data.startswith(b"HTTP/1.1 200 ") and time.monotonic() - t0 < 1.0
    finally:
        await greedy.close()
        await other.close()
    assert await until(lambda: active == 0, timeout_s=5)  # the abandoned lookups ended, their slots with them
    threads.shutdown()


async def test_a_kept_alive_connection_never_carries_a_second_request_to_the_first_host(
        target: CountingServer, monkeypatch: pytest.MonkeyPatch) -> None:
    """An upstream server that ignores ``Connection: close`` keeps its side open: the client still learns to close
    (the proxy rewrites the response head), and bytes it sends after its request's body never reach the server."""
    Fence(monkeypatch)
    received: list[bytes] = []

    async def keep_alive(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while data := await reader.read(65536):
            received.append(data)
            if b"\r\n\r\n" in data:
                writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: keep-alive\r\n"
                             b"Keep-Alive: timeout=60\r\n\r\nok")
                await writer.drain()

    server = await asyncio.start_server(keep_alive, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    proxy = ContextProxy(NetPolicy(allow=[f"127.0.0.1:{port}"]))
    await proxy.start()
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", proxy.port)
        writer.write(f"POST http://127.0.0.1:{port}/a HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\n\r\nabc".encode())
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
        assert b"\r\nConnection: close\r\n" in head and b"keep-alive" not in head.lower()
        assert await reader.readexactly(2) == b"ok"
        # A second request on the same connection, for a host the policy refuses.
        writer.write(f"GET {target.base_url}/second HTTP/1.1\r\nHost: x\r\n\r\n".encode())
        await writer.drain()
        await asyncio.sleep(0.2)  # time for anything forwarded to arrive (a test-side wait, off any hot path)
        got = b"".join(received)
        assert got.startswith(b"POST /a HTTP/1.1\r\n") and got.endswith(b"\r\n\r\nabc") and b"/second" not in got
        writer.close()
    finally:
        await proxy.close()
        server.close()


# --- every route, in a real Chromium -----------------------------------------------------------------------

@pytest.fixture(scope="module")
def fence() -> Iterator[Fence]:
    with pytest.MonkeyPatch.context() as mp:
        yield Fence(mp)


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def guarded(tmp_path_factory: pytest.TempPathFactory, helper: CountingServer, fence: Fence
                  ) -> AsyncIterator[tuple[BrowserWorker, BrowserPool]]:
    """A worker with the default policy, the helper server allowed and fake hosts mapped to loopback."""
    cfg = WorkerConfig(endpoint="", worker_id="netpolicy", net=NetSettings(
        allow=[f"127.0.0.1:{helper.port}"], hosts={"intranet.test": "127.0.0.1", "helper.test": "127.0.0.1"}))
    async with inproc_pool(f"ipc://{tmp_path_factory.mktemp('ipc')}/pool.sock", cfg) as wp:
        yield wp
    assert fence.outside == []  # no connection ever left loopback


def refused_events(events: list[PageEvent]) -> list[PageEvent]:
    return [e for e in events if e.kind == "refused"]


async def act(session: BrowserSession, action: BrowserAction) -> Observation:
    obs, frame = await session.act(action)
    frame.release()
    return obs


async def events_until(session: BrowserSession, first: Observation, done: Callable[[list[PageEvent]], bool],
                       timeout_s: float = 8.0) -> list[PageEvent]:
    """The events of ``first`` and of short ``wait`` steps after it, until ``done(events)`` or the timeout."""
    events = list(first.events or [])
    deadline = time.monotonic() + timeout_s
    while not done(events) and time.monotonic() < deadline:
        events += (await act(session, BrowserAction("wait", seconds=0.2))).events or []
    return events


def refused_to(url_or_authority: str, rule: str) -> Callable[[list[PageEvent]], bool]:
    return lambda evs: any(e.kind == "refused" and e.url.startswith(url_or_authority) and e.detail == rule
                           for e in evs)


# (fixture page, action that starts the load or None when the page loads it by itself, target form)
ROUTES = [
    ("net_link.html", BrowserAction("click", selector="#go"), "http"),
    ("net_js_location.html", BrowserAction("click", selector="#go"), "http"),
    ("net_meta_refresh.html", None, "http"),
    ("net_iframe.html", None, "http"),
    ("net_fetch.html", None, "http"),
    ("net_image.html", None, "http"),
    ("net_beacon.html", None, "http"),
    ("net_websocket.html", None, "ws"),
    ("net_form_post.html", BrowserAction("click", selector="#go"), "http"),
    ("net_popup.html", BrowserAction("click", selector="#open"), "http"),
    ("net_popup.html", BrowserAction("click", selector="#detached"), "http"),
]


@pytest.mark.parametrize(("page", "action", "form"), ROUTES,
                         ids=[f"{p.removeprefix('net_').removesuffix('.html')}-{a.selector if a else 'load'}"
                              for p, a, _ in ROUTES])
@pytest.mark.parametrize("blocked", ["loopback", "name-to-loopback"])
async def test_each_route_to_a_blocked_address_is_refused_and_recorded(
        guarded: tuple[BrowserWorker, BrowserPool], site_server: str, target: CountingServer, page: str,
        action: BrowserAction | None, form: str, blocked: str) -> None:
    _, pool = guarded
    host = f"127.0.0.1:{target.port}" if blocked == "loopback" else f"intranet.test:{target.port}"
    to = f"{'ws' if form == 'ws' else 'http'}://{host}/secret?route={page}"
    before = target.connections
    async with open_session(pool, f"{site_server}/fixtures/{page}?to={quote(to, safe='')}") as (s, obs, _f):
        if action is not None:
            obs = await act(s, action)
        want = host if form == "ws" else to
        events = await events_until(s, obs, refused_to(want, "loopback"))
        assert refused_to(want, "loopback")(events), events
        if page == "net_form_post.html" or action is not None and page != "net_popup.html":
            assert "Refused by the network policy" in (await s.evaluate(["document.body.innerText"]))[0]
        if action is not None and action.selector == "#detached":
            assert PageEvent("popup", to, "adopted") in events
    assert target.connections == before  # the request never arrived


async def test_a_redirect_to_a_blocked_address_is_refused(guarded: tuple[BrowserWorker, BrowserPool],
                                                          site_server: str, helper: CountingServer,
                                                          target: CountingServer) -> None:
    _, pool = guarded
    to = f"{target.base_url}/secret?route=302"
    via = f"{helper.base_url}/redirect?to={quote(to, safe='')}"  # the helper is allowed; its redirect is not
    before, hits = target.connections, len(helper.requests)
    async with open_session(pool, f"{site_server}/fixtures/net_link.html?to={quote(via, safe='')}") as (s, _o, _f):
        obs = await act(s, BrowserAction("click", selector="#go"))
        events = await events_until(s, obs, refused_to(to, "loopback"))
        assert refused_to(to, "loopback")(events), events
        assert obs.url == to and obs.title == "Refused by the network policy"
    assert [r[1] for r in helper.requests[hits:]] == [f"/redirect?to={quote(to, safe='')}"]
    assert target.connections == before


@pytest.mark.parametrize(("url", "shown", "rule"), [
    ("http://169.254.169.254/latest/meta-data/", "http://169.254.169.254/latest/meta-data/", "metadata"),
    ("https://169.254.169.254/latest/meta-data/", "169.254.169.254:443", "metadata"),
    ("http://metadata.google.internal/computeMetadata/v1/", "http://metadata.google.internal/computeMetadata/v1/",
     "metadata"),
    ("http://169.254.1.1/", "http://169.254.1.1/", "link-local"),
    ("http://[fe80::1]/", "http://[fe80::1]/", "link-local"),
    ("http://intranet.test:{port}/", "http://intranet.test:{port}/", "loopback"),
    ("http://127.0.0.1:{port}/", "http://127.0.0.1:{port}/", "loopback"),
    ("http://[::ffff:127.0.0.1]:{port}/", "http://[::ffff:7f00:1]:{port}/", "loopback"),
])
async def test_the_navigate_action_is_refused_with_a_note_and_the_episode_goes_on(
        guarded: tuple[BrowserWorker, BrowserPool], fixture_url: Callable[[str], str], target: CountingServer,
        url: str, shown: str, rule: str) -> None:
    _, pool = guarded
    url, shown = url.format(port=target.port), shown.format(port=target.port)
    before = target.connections
    async with open_session(pool, fixture_url("click.html")) as (s, _o, _f):
        obs = await act(s, BrowserAction("navigate", url=url))
        assert obs.note == f"refused by the network policy ({rule}): {shown}"
        assert PageEvent("refused", shown, rule) in (obs.events or [])
        # The episode carries on: back to a page that is allowed.
        obs = await act(s, BrowserAction("navigate", url=fixture_url("click.html")))
        assert obs.title == "click" and obs.note is None and not obs.events
    assert target.connections == before


async def test_opening_a_refused_start_page_is_refused(guarded: tuple[BrowserWorker, BrowserPool],
                                                       fixture_url: Callable[[str], str]) -> None:
    from browserpool.pool import BrowserOpError

    _, pool = guarded
    session = await pool.lease("net-open-refused")
    try:
        with pytest.raises(BrowserOpError) as err:
            await session.open("http://169.254.169.254/latest/meta-data/")
        assert err.value.kind == "refused" and "(metadata)" in str(err.value)
        obs, frame = await session.open(fixture_url("click.html"))
        frame.release()
        assert obs.title == "click" and not obs.events
    finally:
        await session.close()


@pytest.mark.parametrize("url", ["about:version", "about:settings", "about:srcdoc"])
async def test_about_pages_other_than_blank_are_refused(guarded: tuple[BrowserWorker, BrowserPool],
                                                        fixture_url: Callable[[str], str], url: str) -> None:
    from browserpool.pool import BrowserOpError

    _, pool = guarded
    async with open_session(pool, fixture_url("click.html")) as (s, _o, _f):
        with pytest.raises(BrowserOpError) as err:
            await s.act(BrowserAction("navigate", url=url))
        assert err.value.kind == "refused"
        assert (await act(s, BrowserAction("navigate", url="about:blank"))).url == "about:blank"


async def test_allowed_loopback_servers_and_the_engine_sites_load(guarded: tuple[BrowserWorker, BrowserPool],
                                                                  site_server: str, helper: CountingServer) -> None:
    worker, pool = guarded
    n = len(helper.requests)
    async with open_session(pool, f"{helper.base_url}/fixtures/click.html") as (s, obs, _f):
        assert obs.title == "click" and not obs.events
        # An address entry matches a name by what it resolves to: helper.test (host map) is 127.0.0.1.
        obs = await act(s, BrowserAction("navigate", url=f"http://helper.test:{helper.port}/fixtures/click.html"))
        assert obs.title == "click" and obs.note is None and not obs.events
        # The allow entry names one port, not the host.
        obs = await act(s, BrowserAction("navigate", url=f"http://helper.test:{helper.port + 1}/"))
        assert obs.note == f"refused by the network policy (loopback): http://helper.test:{helper.port + 1}/"
        obs = await act(s, BrowserAction("navigate", url=f"{site_server}/fixtures/click.html"))
        assert obs.title == "click" and not obs.events
        slot = worker.episodes[s.episode_id].slot
        assert slot.proxy is not None
        served = slot.proxy.requests
        await act(s, BrowserAction("click", selector="#btn"))
        assert slot.proxy.requests == served  # the engine's own sites bypass the proxy
    assert len(helper.requests) == n + 2


async def test_allow_private_network_lets_a_loopback_server_through(
        tmp_path: Path, target: CountingServer, fence: Fence) -> None:
    cfg = WorkerConfig(endpoint="", worker_id="private-ok", net=NetSettings(allow_private_network=True))
    async with inproc_pool(f"ipc://{tmp_path}/pool.sock", cfg) as (_, pool):
        before = target.connections
        async with open_session(pool, f"{target.base_url}/fixtures/click.html") as (s, obs, _f):
            assert obs.title == "click" and not obs.events
            obs = await act(s, BrowserAction("navigate", url="http://169.254.169.254/"))
            assert obs.note == "refused by the network policy (metadata): http://169.254.169.254/"
        assert target.connections > before
    assert fence.outside == []


async def test_the_bundled_sites_work_with_the_policy_on(tmp_path: Path) -> None:
    """A short engine run of a few bundled tasks (spawned workers, the policy on by default) succeeds."""
    from engine.clients.runner import run
    from engine.core.config import RunConfig
    from engine.sites.server import SiteServer
    from engine.store.run_dir import read_records
    from policy.registry import make_policy
    from tests.conftest import subset

    with SiteServer() as server:
        cfg = RunConfig(tasks=str(subset(tmp_path, per_site=1, max_len=4)), concurrency=4, workers=1,
                        output_dir=str(tmp_path / "runs"), telemetry=None)
        assert cfg.worker.net.enabled
        stats, run_dir = await run(cfg, make_policy("scripted"), server.base_url)
    records = read_records(run_dir)
    assert len(records) == stats.total >= 4
    assert all(r["status"] == "success" for r in records), [(r["task_id"], r.get("error")) for r in records]
    assert not any(s.get("events") for r in records for s in r["steps"])


async def test_refused_loads_land_in_the_record_and_the_episode_succeeds(
        tmp_path: Path, site_server: str, target: CountingServer) -> None:
    """A run of the engine: the start page's refused image goes into ``open_events``; the agent's navigation to
    the metadata address is a step with the refusal in its note and events, not an error."""
    import json

    from engine.clients.runner import run
    from engine.core.config import RunConfig
    from engine.store.run_dir import read_records
    from policy.registry import make_policy

    image = f"{target.base_url}/pixel.png"
    start = f"{site_server}/fixtures/net_image.html?to={quote(image, safe='')}"
    metadata = "http://169.254.169.254/latest/meta-data/iam/"
    rec = {"task_id": "net", "task_name": "read the cloud credentials", "website": start, "difficulty": 1,
           "evaluator_reference": [{"id": 1, "description": "d", "facts": ["back on the page"],
                                    "checks": [{"kind": "url", "contains": "net_image.html"}]}],
           "reference_solution": [{"action": "navigate", "url": metadata},
                                  {"action": "navigate", "url": start},
                                  {"action": "answer", "text": "no"}]}
    tasks = tmp_path / "net.jsonl"
    tasks.write_text(json.dumps(rec) + "\n")
    before = target.connections
    cfg = RunConfig(tasks=str(tasks), concurrency=1, workers=1, output_dir=str(tmp_path / "runs"), telemetry=None)
    _, run_dir = await run(cfg, make_policy("scripted"), site_server)
    [r] = read_records(run_dir)
    assert r["status"] == "success", r.get("error")
    refused_image = {"kind": "refused", "url": image, "detail": "loopback"}
    assert refused_image in r.get("open_events", []) + r["steps"][0].get("events", [])
    step = r["steps"][0]
    assert step["note"] == f"refused by the network policy (metadata): {metadata}"
    assert {"kind": "refused", "url": metadata, "detail": "metadata"} in step["events"]
    assert step["result"]["title"] == "Refused by the network policy" and "error" not in step
    assert target.connections == before


async def test_webrtc_cannot_send_udp_past_the_proxy(guarded: tuple[BrowserWorker, BrowserPool],
                                                     fixture_url: Callable[[str], str]) -> None:
    """WebRTC's ICE gathering sends UDP from the browser itself (no proxy holds it): with the policy on, pages get
    no WebRTC. A STUN server on loopback counts what arrives."""
    datagrams: list[Any] = []

    class Stun(asyncio.DatagramProtocol):
        def datagram_received(self, data: bytes, addr: Any) -> None:
            datagrams.append(addr)

    transport, _ = await asyncio.get_running_loop().create_datagram_endpoint(Stun, local_addr=("127.0.0.1", 0))
    port = transport.get_extra_info("sockname")[1]
    _, pool = guarded
    try:
        async with open_session(pool, fixture_url(f"net_webrtc.html?stun=127.0.0.1:{port}")) as (s, _o, _f):
            await act(s, BrowserAction("wait", seconds=1.0))  # what ICE gathering would send comes in this time
            assert await s.evaluate(["window.apis", "window.outcome"]) == [["undefined"] * 3, "no api"]
        assert datagrams == []
    finally:
        transport.close()


def test_bad_policy_entries_stop_the_cli_before_anything_starts() -> None:
    from click.testing import CliRunner

    from cli.main import main

    res = CliRunner().invoke(main, ["run", "--net-allow", "intranet.example", "--episodes", "1"])
    assert res.exit_code != 0 and "bare host name" in res.output
    res = CliRunner().invoke(main, ["run", "--net-deny", "10.0.0.0/40", "--episodes", "1"])
    assert res.exit_code != 0 and "bad CIDR" in res.output
    res = CliRunner().invoke(main, ["worker", "--connect", "ipc:///nonexistent", "--net-deny", "10.0.0.0/40"])
    assert res.exit_code != 0 and "bad CIDR" in res.output


class StubCDP:
    """Stands in for a page's CDP session: records handlers and the commands sent."""

    def __init__(self) -> None:
        self.handlers: dict[str, Callable[[dict[str, Any]], None]] = {}
        self.sent: list[tuple[str, dict[str, Any]]] = []

    def on(self, event: str, handler: Callable[[dict[str, Any]], None]) -> None:
        self.handlers[event] = handler

    async def send(self, method: str, params: dict[str, Any] | None = None) -> dict[str, Any]:
        self.sent.append((method, params or {}))
        return {}


@pytest.mark.parametrize(("url", "rule"), [
    ("data:text/html,<title>x</title>", "scheme data:"), ("file:///etc/passwd", "scheme file:"),
    ("view-source:http://example.com/", "scheme view-source:"), ("chrome://settings/", "scheme chrome:"),
    ("about:version", "scheme about:"), ("https://news.example/admin/users", "deny https://news.example/admin/*"),
    ("about:blank", None), ("http://127.0.0.1:1/", None), ("https://news.example/today", None),
    ("chrome-error://chromewebdata/", None), ("blob:http://127.0.0.1:1/3f0c", None),
])
async def test_every_main_frame_document_is_checked_once_committed(url: str, rule: str | None) -> None:
    """However the main frame got there (a renderer navigation Chromium let through, history, a redirect), a
    refused scheme or a denied https path is left for about:blank at once, and recorded."""
    from browserpool.page import EpisodePage, EventLog

    cdp = StubCDP()
    events = EventLog()
    page = EpisodePage(None, cdp, WorkerConfig(endpoint=""), "main", events,  # type: ignore[arg-type]
                       NetPolicy(deny=["https://news.example/admin/*"]))
    cdp.handlers["Page.frameNavigated"]({"frame": {"id": "main", "url": url, "loaderId": "l1"}})
    cdp.handlers["Page.frameNavigated"]({"frame": {"id": "sub", "parentId": "main", "url": "data:,x",
                                                   "securityOrigin": "http://framed.example:81"}})
    await asyncio.sleep(0)
    if rule is None:
        assert events.take() is None and cdp.sent == []
    else:
        assert events.take() == [PageEvent("refused", url, rule)]
        assert cdp.sent == [("Page.navigate", {"url": "about:blank"})]
    assert "http://framed.example:81" in page.origins  # subframes' origins are cleared between episodes


def test_the_event_log_is_capped_and_matches_refusals_by_url() -> None:
    from browserpool.page import EventLog

    log = EventLog(cap=3)
    log.add("refused", "http://[::ffff:7f00:1]:81/a?b=1", "loopback")
    log.add("refused", "169.254.169.254:443", "metadata")
    log.add("refused", "http://127.0.0.1:81/other", "loopback")
    assert log.refusal_for("http://[::ffff:127.0.0.1]:81/a?b=1").detail == "loopback"  # type: ignore[union-attr]
    assert log.refusal_for("http://[::ffff:127.0.0.1]:81/a") is None  # same host, another URL: not this one
    assert log.refusal_for("https://169.254.169.254/latest/").url == "169.254.169.254:443"  # type: ignore[union-attr]
    for i in range(5):
        log.add("popup", f"http://x.example/{i}", "closed")
    taken = log.take()
    assert taken is not None and len(taken) == 4 and taken[-1] == PageEvent("dropped", "", "5 more events not listed")
    assert log.take() is None
    log.add("dialog", "u" * 1000, "d" * 1000)
    [ev] = log.take() or []
    assert len(ev.url) == len(ev.detail) == 300


@pytest.mark.parametrize("to", ["data:text/html,<title>pwned</title>", "file:///etc/passwd", "chrome://version/",
                                "view-source:http://127.0.0.1/"])
async def test_a_page_cannot_take_the_main_frame_to_a_refused_scheme(
        guarded: tuple[BrowserWorker, BrowserPool], fixture_url: Callable[[str], str], to: str) -> None:
    _, pool = guarded
    async with open_session(pool, fixture_url(f"net_js_location.html?to={quote(to, safe='')}")) as (s, _o, _f):
        obs = await act(s, BrowserAction("click", selector="#go"))
        # Chromium refuses these renderer navigations itself; a document that committed anyway would be left
        # at once (the committed-document check above). Either way the page never shows it.
        assert obs.title in ("net js location", "") and not obs.url.startswith(to.split(":", 1)[0] + ":"), obs
