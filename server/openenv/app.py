"""The OpenEnv server's HTTP side: OpenEnv's routes on aiohttp, as a client of one engine core.

- ``GET /ws``: the session channel (:mod:`server.openenv.wire`), one :class:`OpenEnvSession` per connection,
  ``capacity`` at once (one more gets ``CAPACITY_REACHED`` and is closed at once). The server pings every
  ``heartbeat_s`` (a client thinking over a long generation stays connected; one that does not answer a ping is
  gone) and closes a session silent for ``idle_timeout_s``.
- ``POST /reset``, ``POST /step``, ``GET /state``: OpenEnv's stateless HTTP routes. As OpenEnv defines them, each
  request gets a fresh environment, closed when it is answered: a reset starts an episode, answers its first
  observation and ends it (recorded as ``abandoned``); a step has no episode to act in (409, after the action's
  validation: 422 as OpenEnv); a state is a fresh environment's. Episodes live on ``/ws``.
- ``GET /health``, ``GET /schema`` (the server's vocabulary), ``GET /metadata``, and OpenEnv's task routes
  (``/list_environments``, ``/{env}/splits``, ``/{env}/tasks``, ``/{env}/num_tasks``, ``/{env}/task``,
  ``/{env}/task_range``) over the server's task list as one split, ``train``.

Every route but ``/health`` takes the server's key (``Authorization: Bearer KEY`` or ``x-api-key``) when it has one.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import logging
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import msgspec
from aiohttp import WSMsgType, web

from engine._version import __version__
from engine.core.core import EngineCore
from engine.store.records import RecordErrorKind
from engine.tasks.schema import Task
from server.openenv.config import OpenEnvConfig
from server.openenv.sessions import OpenEnvSession, TaskPicker
from server.openenv.vocabularies import ResetOptions, SessionState, vocabulary
from server.openenv.wire import ErrorCode, WireError, error_frame, observation_frame, read_message, state_frame

log = logging.getLogger("webgym_engine.openenv")

ENV_NAME = "webgym_engine"  # the environment's name in OpenEnv's task routes
SPLIT = "train"  # the server's tasks, as OpenEnv's task routes see them
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


class OpenEnvServer:
    """OpenEnv's protocol over one engine core (module docstring). ``await start()``, then ``await close()``."""

    def __init__(self, core: EngineCore, tasks: Sequence[Task], cfg: OpenEnvConfig) -> None:
        self.core = core
        self.cfg = cfg
        self.picker = TaskPicker(tasks)
        self.sessions: set[OpenEnvSession] = set()
        self.app = web.Application(client_max_size=cfg.max_body_bytes, middlewares=[self._auth])
        self.app.add_routes([
            web.get("/ws", self.ws), web.get("/health", self.health), web.get("/schema", self.schema),
            web.get("/metadata", self.metadata), web.post("/reset", self.http_reset), web.post("/step", self.http_step),
            web.get("/state", self.http_state), web.get("/list_environments", self.list_environments),
            web.get("/{env}/splits", self.splits), web.post("/{env}/tasks", self.task_list),
            web.post("/{env}/num_tasks", self.num_tasks), web.post("/{env}/task", self.task),
            web.post("/{env}/task_range", self.task_range)])
        self._runner: web.AppRunner | None = None
        self.url = ""

    async def start(self) -> str:
        """Listen (the core must be started); returns the server's URL."""
        self._runner = web.AppRunner(self.app, access_log=None, handle_signals=False)
        await self._runner.setup()
        site = web.TCPSite(self._runner, self.cfg.host, self.cfg.port)
        await site.start()
        port = self._runner.addresses[0][1]
        host = f"[{self.cfg.host}]" if ":" in self.cfg.host else self.cfg.host
        self.url = f"http://{host}:{port}"
        return self.url

    async def close(self) -> None:
        """End every session's episode (``abandoned``: the server stopped) and stop listening."""
        await asyncio.gather(*(s.end(RecordErrorKind.ABANDONED, "the server stopped before the episode ended")
                               for s in list(self.sessions)))
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    # --- the session channel ----------------------------------------------------------------------------------
    async def ws(self, request: web.Request) -> web.StreamResponse:
        # aiohttp's own frame limit sits above the server's, so that a message past the server's limit gets
        # OpenEnv's error reply rather than a dropped connection. Pings are the server's own (_keep_alive): it
        # answers the client's and times the client's answers itself.
        ws = web.WebSocketResponse(autoping=False, max_msg_size=4 * self.cfg.max_message_bytes)
        await ws.prepare(request)
        if len(self.sessions) >= self.cfg.capacity:
            active = len(self.sessions)
            await self._send(ws, error_frame(
                ErrorCode.CAPACITY_REACHED, f"Server at capacity: {active}/{self.cfg.capacity} sessions active. "
                "Cannot accept new connections.", active_sessions=active, max_sessions=self.cfg.capacity))
            await ws.close()
            return ws
        session = OpenEnvSession(self.core, self.picker, self.cfg)
        self.sessions.add(session)
        alive = _Liveness()
        pings = asyncio.ensure_future(self._keep_alive(ws, alive))
        try:
            await self._converse(ws, session, alive)
        finally:
            pings.cancel()
            self.sessions.discard(session)
            # A session that ends without the client's close: its episode, if one runs, is the client's loss.
            await session.end(RecordErrorKind.CLIENT_GONE, "the client's connection closed before the episode ended")
            await ws.close()
        return ws

    async def _keep_alive(self, ws: web.WebSocketResponse, alive: _Liveness) -> None:
        """A ping every ``heartbeat_s``; a client that has not answered the last one by the next is gone. A pong is
        read only while the conversation waits for a message, so a ping counts as unanswered only if it has waited
        for one since before the ping went out (not while a step ran)."""
        loop = asyncio.get_running_loop()
        while not ws.closed:
            sent = loop.time()
            try:
                await ws.ping()
            except (ConnectionError, RuntimeError):
                break
            await asyncio.sleep(self.cfg.heartbeat_s)
            if alive.pong < sent and alive.listening_since is not None and alive.listening_since <= sent:
                break
        await ws.close()  # the conversation's receive() ends with it

    async def _converse(self, ws: web.WebSocketResponse, session: OpenEnvSession, alive: _Liveness) -> None:
        """One reply per client message, in order, until the client closes, goes away or falls silent."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.cfg.idle_timeout_s
        while True:
            alive.listening_since = loop.time()
            try:
                msg = await ws.receive(timeout=max(0.0, deadline - loop.time()))
            except TimeoutError:  # told first: ending the episode (its record written) may take a while
                await self._send(ws, error_frame(ErrorCode.SESSION_ERROR, f"the session was idle for "
                                                 f"{self.cfg.idle_timeout_s:g} s and is closed"))
                await session.end(RecordErrorKind.CLIENT_IDLE,
                                  f"the client sent nothing for {self.cfg.idle_timeout_s:g} s")
                return
            alive.listening_since = None
            if msg.type is WSMsgType.PING:
                await ws.pong(msg.data)
                continue
            if msg.type is WSMsgType.PONG:
                alive.pong = loop.time()
                continue
            if msg.type not in (WSMsgType.TEXT, WSMsgType.BINARY):
                return  # closed, closing or broken: the caller records the episode as the client's loss
            deadline = loop.time() + self.cfg.idle_timeout_s
            try:
                kind, data = read_message(msg.data, self.cfg.max_message_bytes)
                if kind == "close":
                    await session.end()
                    return
                reply = await self._answer(session, kind, data)
            except WireError as exc:
                reply = exc.frame()
            except Exception as exc:  # an engine error while acting: the client hears of it, the session goes on
                log.exception("OpenEnv session: %s failed", msg.data[:100])
                reply = error_frame(ErrorCode.EXECUTION_ERROR, f"{type(exc).__name__}: {exc}")
            if not await self._send(ws, reply):
                return

    @staticmethod
    async def _answer(session: OpenEnvSession, kind: str, data: dict[str, Any] | None) -> bytes:
        if kind == "reset":
            return observation_frame(await session.reset(data))
        if kind == "step":
            assert data is not None
            return observation_frame(await session.step(data))
        return state_frame(session.state())

    @staticmethod
    async def _send(ws: web.WebSocketResponse, frame: bytes) -> bool:
        """Send a text frame; False if the client is gone."""
        try:
            await ws.send_str(frame.decode())
        except (ConnectionError, RuntimeError):
            return False
        return True

    # --- the stateless HTTP routes ----------------------------------------------------------------------------
    async def http_reset(self, request: web.Request) -> web.StreamResponse:
        body = await _json_body(request)
        if len(self.sessions) >= self.cfg.capacity:
            raise web.HTTPServiceUnavailable(text=_detail(f"Server at capacity: {len(self.sessions)}/"
                                                          f"{self.cfg.capacity} sessions active"),
                                             content_type="application/json")
        session = OpenEnvSession(self.core, self.picker, self.cfg)
        self.sessions.add(session)
        try:
            result = await session.reset(body)
        except WireError as exc:
            raise _http_error(exc) from None
        finally:
            self.sessions.discard(session)
            await session.end(RecordErrorKind.ABANDONED, "an HTTP reset: OpenEnv's HTTP routes close their "
                                                         "environment after each request (episodes live on /ws)")
        return web.json_response(result, dumps=_dumps)

    async def http_step(self, request: web.Request) -> web.StreamResponse:
        body = await _json_body(request)
        if not isinstance(body.get("action"), dict):
            raise web.HTTPUnprocessableEntity(text=_detail([{"type": "missing", "loc": ["body", "action"],
                                                             "msg": "Field required"}]),
                                              content_type="application/json")
        try:
            vocabulary(ResetOptions(), self.cfg.vocabulary, self.cfg.screenshot).action(body["action"])
        except WireError as exc:
            raise _http_error(exc) from None
        raise web.HTTPConflict(text=_detail("no episode: OpenEnv's HTTP /step acts in a fresh environment, closed "
                                            "after the request; run episodes on the /ws session channel"),
                               content_type="application/json")

    async def http_state(self, _request: web.Request) -> web.StreamResponse:
        return web.json_response(vocabulary(ResetOptions(), self.cfg.vocabulary, self.cfg.screenshot)
                                 .state(SessionState()))

    # --- descriptions -----------------------------------------------------------------------------------------
    async def health(self, _request: web.Request) -> web.StreamResponse:
        return web.json_response({"status": "healthy"})

    async def schema(self, _request: web.Request) -> web.StreamResponse:
        return web.json_response(vocabulary(ResetOptions(), self.cfg.vocabulary, self.cfg.screenshot).schemas())

    async def metadata(self, _request: web.Request) -> web.StreamResponse:
        return web.json_response({
            "name": ENV_NAME, "description": f"webgym-engine's browsers: {len(self.picker.tasks)} web tasks, "
            f"{self.cfg.vocabulary} actions and observations", "readme_content": None, "version": __version__,
            "author": None, "documentation_url": None})

    # --- OpenEnv's task routes ------------------------------------------------------------------------------------
    async def list_environments(self, _request: web.Request) -> web.StreamResponse:
        return web.json_response([ENV_NAME])

    async def splits(self, request: web.Request) -> web.StreamResponse:
        _check_env(request)
        return web.json_response([{"name": SPLIT, "type": SPLIT}])

    async def task_list(self, request: web.Request) -> web.StreamResponse:
        await _split_of(request)
        return web.json_response({"tasks": [t.to_record() for t in self.picker.tasks], "env_name": ENV_NAME})

    async def num_tasks(self, request: web.Request) -> web.StreamResponse:
        await _split_of(request)
        return web.json_response({"num_tasks": len(self.picker.tasks)})

    async def task(self, request: web.Request) -> web.StreamResponse:
        body = await _split_of(request)
        index = body.get("index")
        if not isinstance(index, int) or isinstance(index, bool):
            raise web.HTTPUnprocessableEntity(text=_detail("index: an integer is required"),
                                              content_type="application/json")
        if not 0 <= index < len(self.picker.tasks):
            raise web.HTTPBadRequest(text=_detail("Invalid task index"), content_type="application/json")
        return web.json_response({"task": self.picker.tasks[index].to_record()})

    async def task_range(self, request: web.Request) -> web.StreamResponse:
        body = await _split_of(request)
        start, stop = body.get("start"), body.get("stop")
        if any(v is not None and (not isinstance(v, int) or isinstance(v, bool)) for v in (start, stop)):
            raise web.HTTPUnprocessableEntity(text=_detail("start and stop: integers or null"),
                                              content_type="application/json")
        return web.json_response({"tasks": [t.to_record() for t in self.picker.tasks[start:stop]]})

    # --- the key ---------------------------------------------------------------------------------------------------
    @web.middleware
    async def _auth(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        key = self.cfg.api_key
        if key is not None and request.path != "/health":
            given = request.headers.get("x-api-key") or request.headers.get("Authorization", "").removeprefix("Bearer ")
            if not hmac.compare_digest(given.encode(), key.encode()):
                raise web.HTTPUnauthorized(text=_detail("a valid API key is required (Authorization: Bearer KEY)"),
                                           content_type="application/json")
        return await handler(request)


class _Liveness:
    """When the client last answered a ping, and since when the conversation listens (the event loop's clock)."""

    def __init__(self) -> None:
        self.pong = 0.0
        self.listening_since: float | None = None  # since when the conversation waits for a message


def _dumps(value: Any) -> str:
    return msgspec.json.encode(value).decode()


def _detail(detail: Any) -> str:
    return _dumps({"detail": detail})


def _http_error(exc: WireError) -> web.HTTPException:
    """A session's error as HTTP: a validation error 422 with its errors (as OpenEnv's FastAPI routes), else 500."""
    if exc.code is ErrorCode.VALIDATION_ERROR:
        return web.HTTPUnprocessableEntity(text=_detail(exc.extra.get("errors", str(exc))),
                                           content_type="application/json")
    return web.HTTPInternalServerError(text=_detail(str(exc)), content_type="application/json")


async def _json_body(request: web.Request) -> dict[str, Any]:
    """The request's JSON object (an empty body: ``{}``); 422 for anything else."""
    raw = await request.read()
    if not raw.strip():
        return {}
    with contextlib.suppress(msgspec.DecodeError):
        body = msgspec.json.decode(raw)
        if isinstance(body, dict):
            return body
    raise web.HTTPUnprocessableEntity(text=_detail("the body must be a JSON object"), content_type="application/json")


def _check_env(request: web.Request) -> None:
    name = request.match_info["env"]
    if name.lower() != ENV_NAME:
        raise web.HTTPNotFound(text=_detail(f"unknown environment '{name}'"), content_type="application/json")


async def _split_of(request: web.Request) -> dict[str, Any]:
    """A task route's body, its environment and its split checked."""
    _check_env(request)
    body = await _json_body(request)
    if body.get("split") != SPLIT:
        raise web.HTTPNotFound(text=_detail(f"unknown split {body.get('split')!r}: the server has {SPLIT!r}"),
                               content_type="application/json")
    return body
