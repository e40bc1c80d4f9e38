"""The HTTP side of the browser server: the Omniboxes endpoints on aiohttp, as a client of one engine core.

Endpoints, parameters, status codes and JSON field names follow the original's master (docs/server.md has the
table): ``POST /get``, ``POST /reset``, ``GET /screenshot``, ``POST /execute``, ``GET /metadata``, ``GET /probe``,
``GET /info``; every one behind the ``x-api-key`` header when the server has a key. Bad input of any kind gets a
4xx with a JSON body that says what was wrong; a lease whose browser died or that expired gets a 410; nothing a
request sends reaches more than its own lease.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import json
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, cast

from aiohttp import web

from browserpool.pool import BrowserOpError, WorkerLost
from browserpool.protocol import ERR_BROWSER, ERR_HUNG, ERR_NO_EPISODE, ImageFormat
from engine import json_input
from engine.core.core import EngineCore
from engine.web.local_only import web_page_refusal
from server.commands import COMMANDS, CommandError, action_record, capture, decode_args
from server.leases import Lease, LeaseError, LeaseTable

log = logging.getLogger("webgym_engine.server")

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
_LOST_KINDS = (ERR_HUNG, ERR_NO_EPISODE, ERR_BROWSER)  # the lease's page is gone with these
_FORMATS = {"jpeg": "image/jpeg", "png": "image/png"}


@dataclass
class ServerConfig:
    """How the server listens and what it hands out."""

    host: str = "127.0.0.1"
    port: int = 7000
    api_key: str | None = None  # the x-api-key every request must carry; None: no check (loopback use)
    capacity: int = 32  # leases at once
    lifetime_max_mins: int = 60  # the largest lifetime_mins /get accepts (the original's --lifetime_max)
    record: bool = False  # write every lease as a record with its screenshots into the run directory
    screenshot_format: str = "jpeg"  # /screenshot's format unless the request asks (format=png)
    max_body_bytes: int = 1 << 20  # larger request bodies get a 413
    expiry_check_s: float = 5.0
    lease_wait_s: float = 5.0  # how long /get waits for a browser worker with room before its 503
    # A connection that has not sent a whole request head this long after it opened, or after its last answer,
    # is closed; a request body must arrive within body_deadline_s (else a 408). Slow or silent clients hold no
    # sockets or handlers (aiohttp's own idle limit is an hour).
    head_deadline_s: float = 30.0
    body_deadline_s: float = 30.0
    # Connections open at once; one more gets a 503 and is closed at once. Without a cap, a peer that opens
    # connections could use up the engine process's file descriptors, which its store and sockets need too.
    max_connections: int = 1024


class BrowserServer:
    """The Omniboxes API over one engine core (module docstring). ``await start()``, then ``await close()``."""

    def __init__(self, core: EngineCore, cfg: ServerConfig) -> None:
        self.core = core
        self.cfg = cfg
        self.leases = LeaseTable(core, cfg.capacity, lifetime_max_mins=cfg.lifetime_max_mins, record=cfg.record,
                                 lease_wait_s=cfg.lease_wait_s)
        self.app = web.Application(client_max_size=cfg.max_body_bytes,
                                   middlewares=[self._errors, self._programs_only, self._auth])
        self.app.add_routes([
            web.post("/get", self.get), web.post("/reset", self.reset), web.get("/screenshot", self.screenshot),
            web.post("/execute", self.execute), web.get("/metadata", self.metadata), web.get("/probe", self.probe),
            web.get("/info", self.info)])
        self._runner: web.AppRunner | None = None
        self._listener: asyncio.Server | None = None
        self._expiry: asyncio.Task[None] | None = None
        self.url = ""

    async def start(self) -> str:
        """Listen (the core must be started); returns the server's URL."""
        # aiohttp's keep-alive timer starts when a connection opens and closes it while no request is parsed yet:
        # the deadline for a request head.
        self._runner = web.AppRunner(self.app, access_log=None, handle_signals=False,
                                     keepalive_timeout=self.cfg.head_deadline_s)
        await self._runner.setup()
        # Our own listener rather than aiohttp's TCPSite: it counts the connections before handing one to aiohttp.
        # (A connection counts once aiohttp has it, a loop turn after it is accepted: a burst of connects can pass
        # the cap by at most the listen backlog, 100.)
        handlers, cap = self._runner.server, self.cfg.max_connections
        assert handlers is not None

        def protocol() -> asyncio.BaseProtocol:
            return handlers() if len(handlers.connections) < cap else _TooManyConnections()

        self._listener = await asyncio.get_running_loop().create_server(protocol, self.cfg.host, self.cfg.port)
        port = self._listener.sockets[0].getsockname()[1]
        host = f"[{self.cfg.host}]" if ":" in self.cfg.host else self.cfg.host
        self.url = f"http://{host}:{port}"
        self._expiry = asyncio.ensure_future(self.leases.expire_forever(self.cfg.expiry_check_s))
        return self.url

    async def close(self) -> None:
        """Stop listening and release every lease (each gets its record)."""
        if self._expiry is not None:
            self._expiry.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._expiry
        if self._listener is not None:
            self._listener.close()
        if self._runner is not None:
            await self._runner.cleanup()  # closes the connections still open
            self._runner = None
        if self._listener is not None:
            await self._listener.wait_closed()
            self._listener = None
        await self.leases.close()

    # --- middleware ---------------------------------------------------------------------------------------
    @web.middleware
    async def _errors(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        """Every failure as the original's bodies: ``{"detail": ...}`` for refusals, ``{"status": "error",
        "message": ...}`` for a command the browser failed; a fault of the server's own a plain-text 500."""
        try:
            return await handler(request)
        except LeaseError as exc:
            response = web.json_response({"detail": exc.detail}, status=exc.status)
            if exc.status == 408:  # the rest of a late body would be read as the next request
                response.force_close()
            return response
        except CommandError as exc:
            return web.json_response({"status": "error", "message": f"Failed to execute command: {exc}"[:2000]},
                                     status=400)
        except web.HTTPException as exc:  # aiohttp's own: 404, 405, 413 (a body over max_body_bytes)...
            if exc.status < 400:
                raise
            detail = exc.text if exc.status == 413 else exc.reason  # 413: the limit and the size
            return web.json_response({"detail": detail}, status=exc.status)
        except Exception:
            log.exception("error in %s %s", request.method, request.path)
            return web.Response(status=500, text="Internal Server Error")

    @web.middleware
    async def _programs_only(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        """Refuse what a web page in a browser on this machine could send (engine.web.local_only): a page of any site
        could take every lease; one that points its own name at 127.0.0.1 could drive the browsers."""
        refusal = web_page_refusal(request.headers, self.cfg.host, self.url)
        if refusal is not None:
            raise LeaseError(403, f"{refusal}: this API is for programs")
        return await handler(request)

    @web.middleware
    async def _auth(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        key = self.cfg.api_key
        if key:
            given = request.headers.get("x-api-key")
            if not given:
                raise LeaseError(401, "API Key is missing")
            if not hmac.compare_digest(given.encode(), key.encode()):
                raise LeaseError(401, "Invalid API Key.")
        return await handler(request)

    # --- endpoints --------------------------------------------------------------------------------------
    async def get(self, request: web.Request) -> web.Response:
        """``POST /get?lifetime_mins=N``: a new lease on a blank page."""
        lifetime = _int_query(request, "lifetime_mins", 60)
        lease = await self.leases.acquire(lifetime)
        return web.json_response({"instance_id": lease.instance_id, "node": lease.node})

    async def reset(self, request: web.Request) -> web.Response:
        """``POST /reset``: the lease ends, its context is cleared and goes back to the pool."""
        instance_id = _query(request, "instance_id")
        try:
            lease = self.leases.find(instance_id, _query(request, "node"))
        except LeaseError as exc:
            if exc.status == 410 or exc.detail.startswith("Invalid instance UUID"):
                # An ended or unknown lease: the text WebGym's client reads as "already released".
                raise LeaseError(400, f"Invalid instance UUID: {instance_id[:80]} (not in use or already "
                                      "released)") from None
            raise
        async with lease.lock:
            await self.leases.release(lease)
        return web.json_response({"status": "success"})

    async def screenshot(self, request: web.Request) -> web.Response:
        """``GET /screenshot``: the viewport now, JPEG (or ``format=png``); numbered boxes with
        ``interaction_mode=set_of_marks`` (the default, as the original's)."""
        lease = self._lease(request)
        som = request.query.get("interaction_mode", "set_of_marks") == "set_of_marks"
        fmt = request.query.get("format", self.cfg.screenshot_format)
        if fmt not in _FORMATS:
            raise LeaseError(400, f"format must be jpeg or png, not {fmt[:20]!r}")

        # One of _FORMATS' keys (checked just above), which are the ImageFormats.
        image = await self._on_lease(lease, lambda: capture(lease, som, cast("ImageFormat", fmt)))
        return web.Response(body=image, content_type=_FORMATS[fmt])

    async def execute(self, request: web.Request) -> web.Response:
        """``POST /execute``: one command, ``{"instance_id", "node", "<command>": {args}}``."""
        try:
            async with asyncio.timeout(self.cfg.body_deadline_s):
                body = await request.json(loads=json_input.loads)
        except TimeoutError:
            raise LeaseError(408, f"The request body did not arrive within {self.cfg.body_deadline_s:g} s") from None
        except ValueError:  # bad JSON or UTF-8, a number too long, nesting too deep
            raise LeaseError(400, "The body is not JSON") from None
        if not isinstance(body, dict):
            raise LeaseError(400, "The body must be a JSON object")
        instance_id, node = body.get("instance_id"), body.get("node")
        if not isinstance(instance_id, str) or not isinstance(node, str):
            missing = [k for k, v in (("instance_id", instance_id), ("node", node)) if not isinstance(v, str)]
            raise LeaseError(422, f"{', '.join(missing)} must be given as strings")
        names = [k for k in body if k not in ("instance_id", "node")]
        if len(names) != 1:
            raise LeaseError(400, f"Exactly one command per request, not {len(names)} ({', '.join(names)[:200]})")
        name = names[0]
        command = COMMANDS.get(name)
        if command is None:
            raise LeaseError(400, f"Unsupported command: {name[:80]}")
        args = decode_args(command, body[name])
        lease = self.leases.find(instance_id, node)
        t0 = time.perf_counter()
        error: str | None = None
        try:
            result = await self._on_lease(lease, lambda: command.run(lease, args))
        except (CommandError, LeaseError) as exc:
            error = str(exc)
            raise
        finally:
            # Not when the command ended the lease: that has its record already.
            if self.leases.leases.get(lease.instance_id) is lease:
                self._note_command(lease, name, args, body[name], round((time.perf_counter() - t0) * 1000, 2), error)
        return web.json_response(result)

    async def metadata(self, request: web.Request) -> web.Response:
        """``GET /metadata``: the viewport's size (plus the page's title and URL, which AsyncWebRL reads)."""
        lease = self._lease(request)
        w = self.core.pool.cfg.worker
        return web.json_response({"width": w.viewport_width, "height": w.viewport_height, "title": lease.title,
                                  "url": lease.url})

    async def probe(self, request: web.Request) -> web.Response:
        """``GET /probe``: whether the lease's page answers."""
        lease = self._lease(request)

        async def probe() -> None:
            await lease.ready()
            await lease.session.evaluate(["1"])

        try:
            await self._on_lease(lease, probe)
        except LeaseError as exc:
            if exc.status != 410:
                raise
            return web.json_response({"status": "error", "message": "Probe failed"}, status=500)
        return web.json_response({"status": "success", "message": "Probe successful"})

    async def info(self, _request: web.Request) -> web.Response:
        """``GET /info``: capacity, availability and leases per browser worker (a node each)."""
        return web.json_response(self.leases.info())

    # --- internals --------------------------------------------------------------------------------------
    @staticmethod
    def _note_command(lease: Lease, name: str, args: Any, raw: Any, ms: float, error: str | None) -> None:
        """Into the lease's record: an action as a step, an information command as a count and a time."""
        if COMMANDS[name].action:
            timings = {"step_ms": ms, **lease.result.get("timings", {})}
            lease.recorder.step(action_record(name, args), _describe(name, raw), timings, lease.result, error)
            lease.result = {}
        else:
            lease.recorder.query(name, ms)

    def _lease(self, request: web.Request) -> Lease:
        return self.leases.find(_query(request, "instance_id"), _query(request, "node"))

    async def _on_lease(self, lease: Lease, op: Callable[[], Awaitable[Any]]) -> Any:
        """Run ``op`` on the lease, one at a time; a browser that died or a page that hung ends the lease (410)."""
        async with lease.lock:
            try:
                return await op()
            except WorkerLost as exc:
                await self.leases.lost(lease, str(exc))
                raise LeaseError(410, f"Instance {lease.instance_id} was lost: {exc}; lease a new one with /get"
                                 ) from None
            except BrowserOpError as exc:
                if exc.kind in _LOST_KINDS:
                    await self.leases.lost(lease, str(exc))
                    raise LeaseError(410, f"Instance {lease.instance_id} was lost: {exc}; lease a new one with "
                                          "/get") from None
                raise CommandError(str(exc)) from None
            finally:
                lease.last_used = time.monotonic()


class _TooManyConnections(asyncio.Protocol):
    """A connection over ``max_connections``: a 503 and closed, so that its descriptor is free again at once."""

    BODY = b'{"detail": "too many connections to the server"}'
    ANSWER = (b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\n"
              b"Content-Length: %d\r\nConnection: close\r\n\r\n%s" % (len(BODY), BODY))

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        stream = cast(asyncio.Transport, transport)  # uvloop's transports are not asyncio's classes
        stream.write(self.ANSWER)
        stream.close()


def _query(request: web.Request, name: str) -> str:
    value = request.query.get(name)
    if value is None:
        raise LeaseError(422, f"query parameter {name!r} is required")
    return value


def _int_query(request: web.Request, name: str, default: int) -> int:
    value = request.query.get(name)
    if value is None:
        return default
    try:
        return int(value)
    except ValueError:
        raise LeaseError(422, f"query parameter {name!r} must be an integer, not {value[:40]!r}") from None


def _describe(name: str, args: Any) -> str:
    """A command in one line for the records and the monitor."""
    text = json.dumps(args, separators=(",", ":"), ensure_ascii=False) if args else ""
    return f"{name} {text[:200]}".strip()
