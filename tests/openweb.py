"""A local "open web" for tests: several websites on one loopback HTTP server, told apart by their host name.

The browser workers map the names to 127.0.0.1 (``WorkerConfig.net.hosts``, used by the network proxy instead of
DNS), so a page at ``http://shop.test:PORT/`` is another site than ``http://news.test:PORT/`` for the engine's
domain limits and blocklist, as live websites are. Hosts whose name says what they do:

- ``blocked.test``: every page is HTTP 403 with an "Access denied" page (a site that blocks agents);
- ``limited.test``: HTTP 429 with ``Retry-After: 120`` (a rate limiter);
- ``challenge.test``: HTTP 200 with a bot-wall challenge page ("Just a moment...");
- any other name: a plain page titled with the host's name, answered after ``delay_s`` (so that episodes of
  several sites overlap in time). On every host ``/missing`` is a 404, ``/broken`` a 500, ``/download`` a file
  sent as an attachment, ``/consent`` a page behind a OneTrust-style cookie wall, ``/with-ads`` a page that
  pulls scripts from ``ads.test`` and pixels from ``tracker.test``, ``/redirect`` a 302 chain through
  ``tracker.test`` back to ``/landed``, ``/slow-scripts`` a page whose third-party script never finishes, and
  ``/new-tab?to=URL``, ``/popup?to=URL``, ``/popup-onload?to=URL`` pages whose top half is a ``target=_blank``
  link, a button that opens a new window, and nothing (the page opens a window as it loads) respectively;
  ``/changing`` (and ``/changing-next``, ``/changing-unseen``) a page that differs on every load, and
  ``/framed?src=URL`` a page that shows ``URL`` in an iframe (another host's page: a cross-site frame).

The same pages are served over HTTPS on :attr:`OpenWeb.tls_port` with a self-signed certificate (made with
``openssl`` when the server starts) that no browser trusts: a TLS error, as a site with a broken certificate
gives; and on :attr:`OpenWeb.trusted_tls_port` with another one that a browser trusts when told to (Chromium's
``--ignore-certificate-errors-spki-list=`` with :attr:`OpenWeb.trusted_spki`: tests only). ``gone.invalid``
resolves nowhere (RFC 6761) and ``closed.test`` maps to a loopback port nobody listens on.

Every page request is counted per host (:attr:`OpenWeb.hits`; favicons are not pages), with its time
(:attr:`OpenWeb.hit_times`, ``time.monotonic()``).
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import html
import json
import socket
import ssl
import subprocess
import tempfile
import threading
import time
from collections import Counter, defaultdict
from pathlib import Path
from typing import Self

from aiohttp import web

from browserpool.protocol import NetSettings

HOSTS = ("shop.test", "news.test", "wiki.test", "travel.test", "blocked.test", "limited.test", "challenge.test",
         "secure.test", "closed.test", "ads.test", "tracker.test")


class _ThreadServer:
    """A server on an event loop of its own thread: ``with`` starts it (``_start``) and stops it (``_stop``)."""

    def __init__(self) -> None:
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name=type(self).__name__, daemon=True)

    def __enter__(self) -> Self:
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self._start(), self._loop).result(10)
        return self

    def __exit__(self, *exc: object) -> None:
        asyncio.run_coroutine_threadsafe(self._stop(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(5)

    async def _start(self) -> None:
        raise NotImplementedError

    async def _stop(self) -> None:
        raise NotImplementedError


class OpenWeb(_ThreadServer):
    """The server (``with OpenWeb() as web: web.url("shop.test")``)."""

    def __init__(self, delay_s: float = 0.3) -> None:
        super().__init__()
        self.delay_s = delay_s
        self.hits: Counter[str] = Counter()
        self.hit_times: defaultdict[str, list[float]] = defaultdict(list)
        self.user_agents: list[str] = []  # of every page request
        self.port = 0
        self.tls_port = 0
        self.trusted_tls_port = 0
        self.trusted_spki = ""  # base64 SHA-256 of the trusted certificate's public key
        self.closed_port = _free_port()  # nothing listens there
        self._tmp = tempfile.TemporaryDirectory(prefix="openweb-")
        self._runner: web.AppRunner | None = None

    def url(self, host: str, path: str = "/") -> str:
        return f"http://{host}:{self.port}{path}"

    @property
    def net_hosts(self) -> dict[str, str]:
        """The worker's name -> address map for these sites."""
        return dict.fromkeys(HOSTS, "127.0.0.1")

    @property
    def net(self) -> NetSettings:
        """A worker's network settings that let its pages reach these sites."""
        return NetSettings(allow_private_network=True, hosts=self.net_hosts)

    def __exit__(self, *exc: object) -> None:
        super().__exit__(*exc)
        self._tmp.cleanup()

    async def _start(self) -> None:
        app = web.Application()
        app.router.add_get("/{tail:.*}", self._page)  # HEAD too: a rate limiter answers it alike
        # A handler that never answers (/hang.js) must not hold up the shutdown.
        self._runner = web.AppRunner(app, access_log=None, handler_cancellation=True, shutdown_timeout=0.1)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        self.port = self._runner.addresses[0][1]
        for name in ("untrusted", "trusted"):
            tls = web.TCPSite(self._runner, "127.0.0.1", 0, ssl_context=self._self_signed(name))
            await tls.start()
        self.tls_port, self.trusted_tls_port = (a[1] for a in self._runner.addresses[1:3])
        self.trusted_spki = self._spki(Path(self._tmp.name) / "trusted-cert.pem")

    def _self_signed(self, name: str) -> ssl.SSLContext:
        cert, key = Path(self._tmp.name) / f"{name}-cert.pem", Path(self._tmp.name) / f"{name}-key.pem"
        subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key), "-out",
                        str(cert), "-days", "1", "-subj", "/CN=secure.test",
                        "-addext", "subjectAltName=DNS:secure.test"], check=True, capture_output=True)
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        context.load_cert_chain(cert, key)
        return context

    @staticmethod
    def _spki(cert: Path) -> str:
        """The certificate's public key hash as Chromium's SPKI list takes it."""
        key = subprocess.run(["openssl", "x509", "-in", str(cert), "-pubkey", "-noout"], check=True,
                             capture_output=True).stdout
        der = subprocess.run(["openssl", "pkey", "-pubin", "-outform", "der"], input=key, check=True,
                             capture_output=True).stdout
        return base64.b64encode(hashlib.sha256(der).digest()).decode("ascii")

    async def _stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()

    async def _page(self, request: web.Request) -> web.Response:
        host = (request.host or "").split(":")[0]
        if request.path == "/favicon.ico":  # the browser's own request, not a page load
            return web.Response(status=404)
        if request.method == "GET":
            self.hits[host] += 1
            self.hit_times[host].append(time.monotonic())
        if request.path == "/missing":
            return _html(404, "Not found", "No such page.")
        if request.path == "/broken":
            return _html(500, "Server error", "Something broke.")
        self.user_agents.append(request.headers.get("User-Agent", ""))
        if request.path == "/consent":  # a OneTrust-style cookie wall in front of the page
            wall = ('<div id="onetrust-banner-sdk" style="position:fixed;inset:0;background:#fff">We use cookies.'
                    '<button id="onetrust-reject-all-handler" onclick="this.parentNode.remove();'
                    "document.title='rejected'\">Reject all</button>"
                    '<button id="onetrust-accept-btn-handler" onclick="this.parentNode.remove();'
                    "document.title='accepted'\">Accept</button></div>")
            return web.Response(text=f"<!doctype html><title>walled</title><h1>News</h1>{wall}",
                                content_type="text/html")
        if request.path == "/redirect":  # a 30x chain through a tracker, as ad and e-mail links go
            raise web.HTTPFound(self.url("tracker.test", "/click?to=" + self.url(host, "/landed")))
        if request.path == "/click" and host == "tracker.test":
            raise web.HTTPFound(request.query.get("to", "/"))
        if request.path == "/hang.js":  # a third-party script that never finishes loading
            await asyncio.sleep(3600)
        if request.path == "/slow-scripts":
            script = f'<script async src="{self.url("ads.test", "/hang.js")}"></script>'
            return web.Response(text=f"<!doctype html><title>{host}</title><h1>Slow</h1>{script}",
                                content_type="text/html")
        if request.path in _OPENERS:  # a new tab, a popup on a click, a popup as the page loads
            to = json.dumps(request.query.get("to", ""))
            return web.Response(text=f"<!doctype html><title>{host}</title>{_OPENERS[request.path](to)}",
                                content_type="text/html")
        if request.path == "/with-ads":  # a page that pulls third-party ads and a tracker
            third = "".join(f'<script src="{self.url("ads.test", f"/ad{i}.js")}"></script>'
                            f'<img src="{self.url("tracker.test", f"/px{i}.gif")}">' for i in range(5))
            return web.Response(text=f"<!doctype html><title>{host}</title><h1>News</h1>{third}",
                                content_type="text/html")
        if host in ("ads.test", "tracker.test"):
            return web.Response(text="/* an ad */", content_type="application/javascript")
        if request.path == "/framed":  # another site's page in a frame, as an embedded ad or widget
            src = html.escape(request.query.get("src", ""))
            return web.Response(text=f"<!doctype html><title>framed</title><h1>Framing {host}</h1>"
                                     f"<iframe src=\"{src}\" width=600 height=500></iframe>",
                                content_type="text/html")
        if request.path.startswith("/changing"):
            return _changing(request.path, self.hits[host])
        if request.path == "/download":
            return web.Response(body=b"%PDF-1.4 not really", content_type="application/octet-stream",
                                headers={"Content-Disposition": 'attachment; filename="report.pdf"'})
        if host == "blocked.test":
            return _html(403, "Access denied", "You do not have permission to access this site.")
        if host == "limited.test":
            return _html(429, "Too many requests", "Slow down.", {"Retry-After": "120"})
        if host == "challenge.test":
            return _html(200, "Just a moment...", "Checking your browser before accessing the site.")
        await asyncio.sleep(self.delay_s)
        return _html(200, host, f"Welcome to {host}.")


_TOP_HALF = "display:block;width:100%;height:384px;margin:0;font-size:40px"
# A click on an anchor that is not in the document opens a real new window: the in-page shim that keeps links and
# window.open in the tab never sees it (the popups that get past it, which the worker adopts or closes).
_DETACHED_OPEN = "const a = document.createElement('a'); a.href = {to}; a.target = '_blank'; a.click();"
_OPENERS = {  # path -> the page's body, given the target URL as a JavaScript string
    "/new-tab": lambda to: f'<a id="go" target="_blank" style="{_TOP_HALF}">Open</a>'
                           f"<script>document.getElementById('go').href = {to}</script>",
    "/popup": lambda to: f'<button style="{_TOP_HALF}" onclick="{html.escape(_DETACHED_OPEN.format(to=to))}">'
                         "Open</button>",
    "/popup-onload": lambda to: f"<h1>Opener</h1><script>{_DETACHED_OPEN.format(to=to)}</script>",
}


def _changing(path: str, hits: int) -> web.Response:
    """A page that differs on every load: the server's count and time, the page's clock and a random ad, a number
    it fetches and an image drawn anew each time (replayed traffic must make them hold still)."""
    if path == "/changing.json":
        return web.json_response({"n": hits, "t": time.time()})
    if path == "/changing.svg":
        hue = int(time.time() * 1000) % 360
        return web.Response(text=f'<svg xmlns="http://www.w3.org/2000/svg" width="120" height="60">'
                                 f'<rect width="120" height="60" fill="hsl({hue},80%,50%)"/></svg>',
                            content_type="image/svg+xml")
    script = ("document.getElementById('clock').textContent = new Date().toISOString() + ' ' + Date.now();"
              "const colors = ['red', 'green', 'blue', 'orange', 'purple'];"
              "document.getElementById('ad').style.background = colors[Math.floor(Math.random() * colors.length)];"
              "fetch('/changing.json').then(r => r.json()).then(d => {"
              "document.getElementById('fetched').textContent = 'fetched ' + d.n + ' at ' + d.t; });")
    body = (f"<!doctype html><title>changing</title><h1>Load {hits}</h1><p>Server time {time.time()}</p>"
            "<p id='clock'></p><div id='ad' style='width:300px;height:80px'></div><p id='fetched'></p>"
            "<img src='/changing.svg' width='120' height='60'>"
            "<p><a id='next' href='/changing-next'>next</a> <a id='unseen' href='/changing-unseen'>unseen</a></p>"
            f"<script>{script}</script>")
    return web.Response(text=body, content_type="text/html", headers={"Cache-Control": "no-store"})


def _html(status: int, title: str, text: str, headers: dict[str, str] | None = None) -> web.Response:
    body = f"<!doctype html><title>{title}</title><h1>{title}</h1><p>{text}</p>"
    return web.Response(status=status, text=body, content_type="text/html", headers=headers)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class UpstreamTestProxy(_ThreadServer):
    """A stand-in for a proxy provider's proxy: CONNECT tunnels only, Basic credentials required, tunnels counted
    (:attr:`tunnels`). Runs in its own thread, like :class:`OpenWeb`."""

    def __init__(self, user: str, password: str) -> None:
        super().__init__()
        self.expected = "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode("ascii")
        self.tunnels = 0
        self.refused = 0
        self.port = 0
        self._server: asyncio.Server | None = None

    async def _start(self) -> None:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]

    async def _stop(self) -> None:
        if self._server is not None:
            self._server.close()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            head = (await reader.readuntil(b"\r\n\r\n")).decode("latin-1")
            line, *headers = head.split("\r\n")
            auth = next((h.split(":", 1)[1].strip() for h in headers if h.lower().startswith("proxy-authorization:")),
                        None)
            method, target, _ = line.split(" ")
            if method != "CONNECT" or auth != self.expected:
                self.refused += 1
                writer.write(b"HTTP/1.1 407 Proxy Authentication Required\r\nContent-Length: 0\r\n\r\n")
                return
            host, _, port = target.rpartition(":")
            up_reader, up_writer = await asyncio.open_connection(host.strip("[]"), int(port))
            self.tunnels += 1
            writer.write(b"HTTP/1.1 200 Connection Established\r\n\r\n")

            async def copy(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
                while data := await src.read(65536):
                    dst.write(data)
                    await dst.drain()
                dst.close()

            await asyncio.gather(copy(reader, up_writer), copy(up_reader, writer), return_exceptions=True)
        except (OSError, ValueError, asyncio.IncompleteReadError):
            pass
        finally:
            writer.close()
