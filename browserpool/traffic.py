"""Page traffic recorded and replayed: every response an episode's tab received, kept in a compact archive, and
served again in place of the network, so that an episode can be repeated on a web that holds still.

Where: inside the browser, on the tab's own CDP session (the ``Fetch`` domain), not in the worker's proxy. The
browser sees HTTPS decrypted, so HTTPS pages are recorded and replayed with no certificate authority of the
engine's and no TLS to terminate; a replayed response is answered before any socket is opened (``Fetch.
fulfillRequest``), so a replayed load costs no network and no proxy. Recording pauses each response once to read
its body (``Fetch.getResponseBody``); replay answers each request from memory.

What is kept (:class:`Archive`): per request, its method, URL and a digest of its body (a form's POST), the
responses in the order they came (a URL polled five times has five), each with its status, headers and body;
bodies by digest, stored once. On disk: msgpack, zlib-compressed. In replay a request is answered with the next
response recorded for it (the last one again once they run out); one the archive lacks is a *miss*: a 404 page
(``miss="404"``) or the live site (``miss="live"``), counted and named in the next observation.

Time and randomness: in both modes every document of the tab sees ``Date`` (and ``Date.now``), ``performance.now``,
``Math.random`` and ``crypto.getRandomValues`` as a function of the episode's seed and start time (a clock that
moves one millisecond per reading), so a page that renders the time or a random pick renders the same in every
replay and in the recording itself. Timers still fire on the real clock.

Not covered: service workers and out-of-process iframes have sessions of their own: their loads are neither
recorded nor answered (in replay they go to the network, through the worker's proxy as always). The workers'
headless shell keeps cross-site iframes in the tab's renderer, so they are covered; a browser that isolates sites
(the full Chromium) does not. WebSockets and server-sent streams are not recorded; state a page changes on its
server (a POST) is replayed as the response it got, not redone.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import hashlib
import os
import zlib
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgpack
from playwright.async_api import CDPSession
from playwright.async_api import Error as PlaywrightError

from browserpool.protocol import TrafficSpec, TrafficStats

ARCHIVE_VERSION = 1
MAX_ARCHIVE_BYTES = 512 * 2**20  # an archive file larger than this is refused (compressed size)
MAX_MISS_URLS = 20  # miss URLs named per observation (all are counted)
# Response headers that describe the bytes on the wire, not the body the browser handed over (already decoded):
# not kept, since a replayed body is sent as it is.
_WIRE_HEADERS = frozenset({"content-encoding", "content-length", "transfer-encoding", "connection", "keep-alive"})
_MISS_BODY = base64.b64encode(b"not in the recorded traffic").decode()


class TrafficError(Exception):
    """An archive that cannot be read (missing, too large, corrupt, of another version)."""


def request_key(method: str, url: str, post_data: str | None) -> str:
    """What a recorded response is filed under: the method, the URL (without its fragment) and the body's digest."""
    url = url.split("#", 1)[0]
    digest = hashlib.sha256(post_data.encode("utf-8", "surrogatepass")).hexdigest()[:16] if post_data else ""
    return f"{method.upper()} {url} {digest}"


@dataclass
class RecordedResponse:
    status: int
    headers: list[tuple[str, str]]
    body: str  # the body's digest (a key of Archive.bodies)


@dataclass
class Archive:
    """The traffic of one episode (see the module docstring)."""

    seed: int = 0
    start_ms: int = 0  # the episode's clock at its start (ms since the epoch), as recorded
    entries: dict[str, list[RecordedResponse]] = field(default_factory=dict)
    bodies: dict[str, bytes] = field(default_factory=dict)
    _served: dict[str, int] = field(default_factory=dict)  # replay: responses served per key

    def add(self, key: str, status: int, headers: list[tuple[str, str]], body: bytes) -> None:
        digest = hashlib.sha256(body).hexdigest()[:32]
        self.bodies.setdefault(digest, body)
        self.entries.setdefault(key, []).append(RecordedResponse(status, headers, digest))

    def next_response(self, key: str) -> tuple[RecordedResponse, bytes] | None:
        """The next response recorded for ``key`` (the last one again once they run out), or None: a miss."""
        responses = self.entries.get(key)
        if not responses:
            return None
        index = self._served.get(key, 0)
        self._served[key] = index + 1
        response = responses[min(index, len(responses) - 1)]
        return response, self.bodies.get(response.body, b"")

    @property
    def responses(self) -> int:
        return sum(len(r) for r in self.entries.values())

    def packed(self) -> bytes:
        """The archive as it is now, serialized (fast: msgpack's C code; what :func:`write_packed` compresses)."""
        data = {"version": ARCHIVE_VERSION, "seed": self.seed, "start_ms": self.start_ms,
                "entries": {k: [[r.status, [list(h) for h in r.headers], r.body] for r in v]
                            for k, v in self.entries.items()},
                "bodies": self.bodies}
        return msgpack.packb(data, use_bin_type=True)

    def to_bytes(self) -> bytes:
        return zlib.compress(self.packed(), 6)

    @classmethod
    def from_bytes(cls, blob: bytes) -> Archive:
        """An archive from its file's bytes; raises TrafficError when they are not one."""
        try:
            data = msgpack.unpackb(zlib.decompressobj().decompress(blob, MAX_ARCHIVE_BYTES * 4), raw=False,
                                   strict_map_key=False)
            if not isinstance(data, dict) or data.get("version") != ARCHIVE_VERSION:
                raise TrafficError(f"not a traffic archive of version {ARCHIVE_VERSION}")
            archive = cls(seed=int(data["seed"]), start_ms=int(data["start_ms"]),
                          bodies={str(k): bytes(v) for k, v in data["bodies"].items()})
            for key, responses in data["entries"].items():
                archive.entries[str(key)] = [RecordedResponse(int(s), [(str(n), str(v)) for n, v in h], str(b))
                                             for s, h, b in responses]
        except TrafficError:
            raise
        except (zlib.error, ValueError, TypeError, KeyError, AttributeError, msgpack.UnpackException) as exc:
            raise TrafficError(f"a corrupt traffic archive: {exc}") from exc
        return archive

    def write(self, path: str) -> int:
        """Writes the archive to ``path`` (atomically: a reader sees the old file or the new one); returns its size."""
        return write_packed(path, self.packed())

    @classmethod
    def read(cls, path: str) -> Archive:
        try:
            size = os.path.getsize(path)
            if size > MAX_ARCHIVE_BYTES:
                raise TrafficError(f"the traffic archive {path} is {size} bytes, more than {MAX_ARCHIVE_BYTES}")
            return cls.from_bytes(Path(path).read_bytes())
        except OSError as exc:
            raise TrafficError(f"no traffic archive at {path}: {exc.strerror or exc}") from exc


def write_packed(path: str, packed: bytes) -> int:
    """Compresses a :meth:`Archive.packed` archive and writes it to ``path`` atomically; returns the file's size.
    Blocking: the worker runs it in a thread."""
    blob = zlib.compress(packed, 6)
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(f".{target.name}.{os.getpid()}.tmp")
    tmp.write_bytes(blob)
    os.replace(tmp, target)
    return len(blob)


def clock_script(seed: int, start_ms: int) -> str:
    """The script every document of a recorded or replayed episode runs first (see the module docstring)."""
    return _CLOCK_JS.replace("__SEED__", str(seed & 0xFFFFFFFF)).replace("__START__", str(int(start_ms)))


# A seeded generator (mulberry32) for Math.random and crypto.getRandomValues; a clock that starts at the episode's
# start and moves one millisecond per reading, for Date and performance.now.
_CLOCK_JS = """(() => {
  let state = __SEED__ >>> 0;
  const next = () => {
    state = (state + 0x6D2B79F5) | 0;
    let t = Math.imul(state ^ (state >>> 15), 1 | state);
    t = (t + Math.imul(t ^ (t >>> 7), 61 | t)) ^ t;
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
  Math.random = next;
  if (globalThis.crypto && crypto.getRandomValues) {
    crypto.getRandomValues = (array) => {
      const bytes = new Uint8Array(array.buffer, array.byteOffset, array.byteLength);
      for (let i = 0; i < bytes.length; i++) bytes[i] = Math.floor(next() * 256);
      return array;
    };
  }
  const start = __START__;
  let ticks = 0;
  const now = () => start + ticks++;
  const RealDate = Date;
  function FixedDate(...args) {
    if (!new.target) return new RealDate(now()).toString();
    return args.length ? new RealDate(...args) : new RealDate(now());
  }
  FixedDate.prototype = RealDate.prototype;
  FixedDate.now = now;
  FixedDate.parse = RealDate.parse;
  FixedDate.UTC = RealDate.UTC;
  Object.defineProperty(RealDate.prototype, "constructor", {value: FixedDate, configurable: true, writable: true});
  globalThis.Date = FixedDate;
  if (globalThis.performance) {
    let perfTicks = 0;
    performance.now = () => perfTicks++;
  }
})();"""


@dataclass
class TrafficCounts:
    """What the episode's traffic did since the last observation."""

    served: int = 0  # replay: requests answered from the archive
    recorded: int = 0  # record: responses kept
    misses: int = 0
    miss_urls: list[str] = field(default_factory=list)

    def take(self) -> TrafficStats:
        """The counts so far, as an observation reports them; the next ones start from zero."""
        out = TrafficStats(recorded=self.recorded, served=self.served, misses=self.misses, miss_urls=self.miss_urls)
        self.served = self.recorded = self.misses = 0
        self.miss_urls = []
        return out


class EpisodeTraffic:
    """One episode's recording or replay on its tab's CDP session (see the module docstring)."""

    def __init__(self, spec: TrafficSpec, archive: Archive, on_error: Callable[[str], None] | None = None) -> None:
        self.spec = spec
        self.archive = archive
        self.counts = TrafficCounts()
        self._on_error = on_error
        self._cdp: CDPSession | None = None
        self._script: str | None = None
        self._tasks: set[asyncio.Task[None]] = set()

    @classmethod
    def start(cls, spec: TrafficSpec, now_ms: int) -> EpisodeTraffic:
        """A recording (its clock starts now) or a replay (the archive's own seed and clock); raises TrafficError
        when a replay's archive cannot be read."""
        if spec.mode == "replay":
            return cls(spec, Archive.read(spec.path))
        return cls(spec, Archive(seed=spec.seed, start_ms=now_ms))

    async def attach(self, cdp: CDPSession) -> None:
        """Intercepts the tab's loads and installs the clock (before the episode's first navigation; again on a tab
        that replaced a closed one)."""
        self._cdp = cdp
        cdp.on("Fetch.requestPaused", self._on_paused)
        stage = "Response" if self.spec.mode == "record" else "Request"
        await cdp.send("Fetch.enable", {"patterns": [{"urlPattern": "*", "requestStage": stage}]})
        added = await cdp.send("Page.addScriptToEvaluateOnNewDocument",
                               {"source": clock_script(self.archive.seed, self.archive.start_ms)})
        self._script = added.get("identifier")
        # Nothing from the HTTP cache: every load of the episode is one the archive records or answers.
        await cdp.send("Network.setCacheDisabled", {"cacheDisabled": True})

    async def detach(self) -> None:
        """Stops intercepting (the episode ended), after the answers under way."""
        cdp, self._cdp = self._cdp, None
        if cdp is None:
            return
        cdp.remove_listener("Fetch.requestPaused", self._on_paused)
        if self._tasks:
            await asyncio.wait(self._tasks, timeout=5)
        try:
            await cdp.send("Fetch.disable")
            await cdp.send("Network.setCacheDisabled", {"cacheDisabled": False})
            if self._script is not None:
                await cdp.send("Page.removeScriptToEvaluateOnNewDocument", {"identifier": self._script})
        except PlaywrightError:
            pass  # the tab is gone: nothing left to stop

    async def save(self, path: str | None = None) -> int:
        """Writes what was recorded so far (to ``path``, default the spec's), compressed in a thread; returns the
        file's size."""
        return await asyncio.to_thread(write_packed, path or self.spec.path, self.archive.packed())

    # --- the interception ------------------------------------------------------------------------------------
    def _on_paused(self, event: dict[str, Any]) -> None:
        task = asyncio.get_running_loop().create_task(self._answer(event))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _answer(self, event: dict[str, Any]) -> None:
        cdp = self._cdp
        request_id = event.get("requestId")
        if cdp is None or not isinstance(request_id, str):
            return
        request = event.get("request") or {}
        key = request_key(str(request.get("method", "GET")), str(request.get("url", "")), request.get("postData"))
        try:
            if self.spec.mode == "record":
                await self._record(cdp, request_id, key, event)
            else:
                await self._replay(cdp, request_id, key, str(request.get("url", "")))
        except PlaywrightError as exc:
            # The request went away meanwhile (its frame navigated, the tab closed), or the browser refused the
            # answer (an archive's status or header it does not take): failed, so that no load waits for ever.
            with contextlib.suppress(PlaywrightError):
                await cdp.send("Fetch.failRequest", {"requestId": request_id, "errorReason": "Failed"})
            if self._on_error is not None:
                self._on_error(str(exc).splitlines()[0][:200])

    async def _record(self, cdp: CDPSession, request_id: str, key: str, event: dict[str, Any]) -> None:
        status = event.get("responseStatusCode")
        if type(status) is int and event.get("responseErrorReason") is None:
            headers = [(str(h.get("name", "")), str(h.get("value", ""))) for h in event.get("responseHeaders") or []
                       if str(h.get("name", "")).lower() not in _WIRE_HEADERS]
            body = b""
            if not 300 <= status < 400 and status not in (204, 304):
                try:
                    got = await cdp.send("Fetch.getResponseBody", {"requestId": request_id})
                    raw = got.get("body", "")
                    body = base64.b64decode(raw) if got.get("base64Encoded") else raw.encode("utf-8")
                except PlaywrightError:
                    body = b""  # a body the browser did not keep (a stream): the response without it
            self.archive.add(key, status, headers, body)
            self.counts.recorded += 1
        await cdp.send("Fetch.continueRequest", {"requestId": request_id})

    async def _replay(self, cdp: CDPSession, request_id: str, key: str, url: str) -> None:
        rebase = self.spec.rebase
        if rebase is not None:  # a site that moved since the recording: looked up where it was
            key = key.replace(f" {rebase[1]}", f" {rebase[0]}", 1)
        found = self.archive.next_response(key)
        if found is None:
            self.counts.misses += 1
            if len(self.counts.miss_urls) < MAX_MISS_URLS:
                self.counts.miss_urls.append(url[:512])
            if self.spec.miss == "live":
                await cdp.send("Fetch.continueRequest", {"requestId": request_id})
            else:
                await cdp.send("Fetch.fulfillRequest", {
                    "requestId": request_id, "responseCode": 404, "body": _MISS_BODY,
                    "responseHeaders": [{"name": "Content-Type", "value": "text/plain"}]})
            return
        response, body = found
        self.counts.served += 1
        headers = response.headers
        if rebase is not None:  # a redirect to the site where it was goes to where it is
            headers = [(n, v.replace(rebase[0], rebase[1], 1) if n.lower() == "location" else v) for n, v in headers]
        await cdp.send("Fetch.fulfillRequest", {
            "requestId": request_id, "responseCode": response.status,
            "responseHeaders": [{"name": n, "value": v} for n, v in headers],
            "body": base64.b64encode(body).decode()})
