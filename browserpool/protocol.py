"""Typed messages between the engine (ROUTER) and browser workers (DEALER): msgspec structs over msgpack.

Every message travels as one msgpack array ``[tag, field1, field2, ...]`` (msgspec's array-like tagged
structs); each struct below lists its fields in wire order. Decoding validates every field's type and bound,
so a peer that sends garbage, a message of another shape or values of the wrong types gets a
:class:`ProtocolError`, never a half-built message. A reply's body stays raw until the pool knows which
operation it answers; then it is decoded into its own type (:func:`decode_observation`).

Screenshots never travel here as bytes when shared memory is available: a reply carries a :class:`FrameRef`
to a slot in the worker's ring (see ``shm.py``).

Bump ``PROTOCOL_VERSION`` whenever a field changes; a Hello of another version is refused.
"""

from __future__ import annotations

import re
from enum import StrEnum
from typing import Annotated, Any, ClassVar, Literal

import msgspec

# 2: typed structs (msgspec), Observation.events, Heartbeat.draining and browser_pid, Welcome.net.
# 3: Heartbeat.browser_pss.
# 4: Observation.elements_cut (and an open's som_elements argument, which an older worker would ignore).
# 5: a Request carries one typed operation (Open, Act, Observe, Locate, Evaluate, Close) instead of op + args.
# 6: accessibility trees (Open.axtree, Observe.axtree, Observation.axtree and axtree_cut, BrowserAction.node).
# 7: DOM snapshots (Open.dom, Observe.dom, Observation.dom and dom_cut).
# 8: recorded and replayed traffic (Open.traffic, Observation.traffic).
# 9: ErrorKind.CAPTURE (a screenshot Chromium refused on every try).
PROTOCOL_VERSION = 9

# Bounds on what a peer may send: a worker id names files and log lines; a page's texts are bounded by the
# message size cap (MAX_MESSAGE_BYTES) as a whole.
WorkerId = Annotated[str, msgspec.Meta(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_.:-]+$")]
ShortText = Annotated[str, msgspec.Meta(max_length=256)]
Count = Annotated[int, msgspec.Meta(ge=0, le=2**31)]
ByteCount = Annotated[int, msgspec.Meta(ge=0, le=2**50)]
# [id, tag, text, x, y, w, h]: see Observation.elements.
Element = Annotated[list[int | float | str], msgspec.Meta(min_length=7, max_length=7)]

# The largest message either side accepts (ZeroMQ drops bigger ones before they reach Python: MAXMSGSIZE).
# An inline JPEG of a 1280x768 viewport is ~100-400 KB; a Set-of-Marks element list a few hundred KB at most.
MAX_MESSAGE_BYTES = 16 << 20
# The most screenshot slots a worker's ring may announce (Hello.slot_count).
MAX_SLOTS = 4096
# The longest error message a Reply carries (the worker cuts longer ones: error_text).
MAX_ERROR_CHARS = 4096
ErrorText = Annotated[str, msgspec.Meta(max_length=MAX_ERROR_CHARS)]
# A connection to a socket the engine binds must finish ZeroMQ's handshake (with CURVE's, when on) within this
# (ZMQ_HANDSHAKE_IVL; ZeroMQ's default is 30 s): a real peer needs a few round trips, and each connection a
# peer leaves silent holds one of the engine process's file descriptors until then.
HANDSHAKE_TIMEOUT_MS = 10_000


class BrowserAction(msgspec.Struct, omit_defaults=True, forbid_unknown_fields=True):
    """One browser-level operation, in CSS pixels of the viewport.

    kinds: click, hover, type, key, scroll, wait, go_back, go_forward, navigate, select.
    ``selector`` may replace (x, y) for click/hover/type/select: the worker clicks the element's centre and
    reports the point it used, so records always hold plain coordinates. ``node`` may too: an element's id in the
    accessibility tree (:class:`AXNode`), which the worker first scrolls into view; with ``key`` it focuses the
    element before the keys are pressed.
    ``select`` picks the option whose label or value equals ``text`` (case-insensitive, trimmed) in the
    <select> at (x, y), also inside same-origin iframes and open shadow roots; refused when there is no
    <select> there or no such option.
    """

    kind: str
    x: float | None = None
    y: float | None = None
    selector: str | None = None
    node: Annotated[int, msgspec.Meta(ge=1, le=2**31)] | None = None
    text: str | None = None
    clear: bool = True
    enter: bool = True
    keys: str | None = None
    direction: str | None = None
    amount: int | None = None
    url: str | None = None
    seconds: float | None = None

    def to_wire(self) -> dict[str, Any]:
        """The action as a plain dict of its set fields (as it travels inside an :class:`Act`)."""
        return msgspec.to_builtins(self)

    @classmethod
    def from_wire(cls, d: Any) -> BrowserAction:
        """Validate a dict of plain data; raises ProtocolError when it is not an action."""
        try:
            return msgspec.convert(d, cls)
        except msgspec.ValidationError as exc:
            raise ProtocolError(f"invalid action: {exc}") from exc


class FrameRef(msgspec.Struct, array_like=True, frozen=True, forbid_unknown_fields=True):
    """Where a JPEG screenshot lies: a slot of the worker's shared-memory ring."""

    slot: Count
    generation: Count
    nbytes: Count


class PageEvent(msgspec.Struct, array_like=True, forbid_unknown_fields=True):
    """Something the page did besides the action, reported with the next observation.

    kinds: ``refused`` (a load the network policy or scheme check refused; ``detail`` names the rule),
    ``popup`` (a new tab or window: adopted as the episode's page or closed), ``download`` (refused),
    ``filechooser`` (cancelled), ``dialog`` (dismissed), ``permission`` (denied), ``closed`` (the page closed its
    own tab: reopened at its URL).
    """

    kind: str
    url: str = ""
    detail: str = ""


class AXNode(msgspec.Struct, array_like=True, forbid_unknown_fields=True):
    """One node of a page's accessibility tree (``browserpool/axtree.py``), in depth-first order.

    ``id``: the element's id, which actions accept (``BrowserAction.node``; 0 for a node that is no element);
    ``depth``: its depth among the kept nodes; ``states``: ``focused``, ``disabled``... and ``name=value`` ones
    (``checked=true``, ``expanded=false``, ``url=...``)."""

    id: Count
    depth: Count
    role: ShortText
    name: str
    value: str = ""
    states: list[str] = msgspec.field(default_factory=list)


class DOMNode(msgspec.Struct, array_like=True, forbid_unknown_fields=True):
    """One element of a page's DOM snapshot (``browserpool/domsnapshot.py``), in document order.

    ``id``: the element's backend node id (its id in the accessibility tree too; actions accept it); ``parent``:
    its parent element's (0: none); ``x``, ``y``, ``w``, ``h``: its box in viewport CSS px; ``visibility``: the
    part of the box inside the viewport, 0 to 1 (0 when hidden by ``visibility`` or ``opacity``); ``clickable``:
    Chromium marks it so (a click listener, a link, a form control)."""

    id: Count
    parent: Count
    tag: ShortText
    x: float
    y: float
    w: float
    h: float
    visibility: float
    clickable: bool = False


TrafficMode = Literal["record", "replay"]
MissPolicy = Literal["404", "live"]  # what a replayed request the archive lacks gets


class TrafficSpec(msgspec.Struct, array_like=True, forbid_unknown_fields=True):
    """An episode whose tab's traffic is recorded into, or replayed from, an archive (``browserpool/traffic.py``).

    ``path``: the archive's file (written when the episode closes; read when it opens); ``miss``: a replayed request
    the archive lacks gets a 404 or goes to the live site; ``seed``: the pages' random numbers (recording; a replay
    takes the archive's); ``snapshot``: a recording also writes what the start page loaded to this file once the
    episode has opened (a group's members replay it)."""

    mode: TrafficMode
    path: Annotated[str, msgspec.Meta(min_length=1, max_length=4096)]
    miss: MissPolicy = "404"
    seed: Annotated[int, msgspec.Meta(ge=0, le=2**32 - 1)] = 0
    snapshot: Annotated[str, msgspec.Meta(max_length=4096)] | None = None
    # A replay's (recorded origin, origin now) of a site that moved (the engine's own sites get a new port per run):
    # requests to the origin now are looked up under the recorded one, redirects to it sent to the one now.
    rebase: tuple[Annotated[str, msgspec.Meta(max_length=512)], Annotated[str, msgspec.Meta(max_length=512)]] | None \
        = None


class TrafficStats(msgspec.Struct, array_like=True, forbid_unknown_fields=True):
    """What an episode's recorded or replayed traffic did since its previous observation: responses recorded,
    requests answered from the archive, requests it lacked (misses) and the first of their URLs."""

    recorded: Count = 0
    served: Count = 0
    misses: Count = 0
    miss_urls: list[str] = msgspec.field(default_factory=list)


class SettleState(StrEnum):
    """How the page stood when an observation was taken (``Observation.settle``)."""

    QUIET = "quiet"  # navigation over and the DOM and network quiet for quiet_ms: settled
    BUSY = "busy"  # loaded, but never quiet within idle_cap_ms (animations, polling): observed as it was
    TIMEOUT = "timeout"  # the operation's cap (settle_timeout_s / open_timeout_s) ran out first
    SKIPPED = "skipped"  # no wait was asked for (the server's commands that only read the page)


class Observation(msgspec.Struct, array_like=True, forbid_unknown_fields=True):
    """What the worker saw after an operation (the body of an open's or act's Reply)."""

    url: str
    title: str
    settled: bool
    settle: SettleState
    width: Count
    height: Count
    frame: FrameRef | None = None
    frame_bytes: bytes | None = None  # inline JPEG when no slot was free or shm is unavailable
    timings_ms: dict[str, float] = msgspec.field(default_factory=dict)
    point: tuple[float, float] | None = None  # where a click/type actually landed (CSS px)
    note: str | None = None  # non-fatal problem with the action (e.g. a refused URL)
    # Set-of-Marks episodes only: the visible interactive elements, [id, tag, text, x, y, w, h] each
    # (ids 1..N in document order, boxes in viewport CSS px, clipped to the viewport); the frame then
    # shows them as numbered boxes. None when the episode was not opened in SoM mode.
    elements: list[Element] | None = None
    # The JSON result of the episode's probe expression (``open(..., probe_js=...)``), evaluated after the
    # settle of every observation: a page's own view of its state (e.g. MiniWoB's reward and done flag).
    # None when the episode has no probe; ``{"error": message}`` when the expression threw.
    probe: Any = None
    # Fraction of (1/4-scale) pixels that differ from this episode's previous screenshot (the raw captures,
    # before any marks are drawn), computed by the worker so the engine's single thread need not decode
    # frames: 0.0 only when the captures are byte-identical, at least 1e-6 when they differ at all. None for an
    # episode's first screenshot, or when the comparison failed.
    change: float | None = None
    # What the page did besides the action since the previous observation (refused loads, popups,
    # downloads, file choosers, dialogs); None when nothing happened.
    events: list[PageEvent] | None = None
    # The HTTP status of the document's main response (Navigation Timing's responseStatus); None when the
    # document has none (about:blank, a browser error page, a document written by script).
    status: int | None = None
    # The browser's net error for the navigation the operation started ("net::ERR_CERT_AUTHORITY_INVALID", ...);
    # None when the document loaded (whatever its HTTP status) or the operation did not navigate.
    load_error: str | None = None
    # A rate-limited start page's Retry-After header, as sent (capped): asked only of an open answered with 429.
    retry_after: str | None = None
    # Why the Set-of-Marks pass stopped before the page's last element: "count" (at its cap: the open's
    # som_elements or the worker's own) or "time" (its time budget); None when it listed them all.
    elements_cut: str | None = None
    # The page's accessibility tree, for episodes opened with axtree (None otherwise), and whether it was cut at
    # the worker's cap (WorkerConfig.axtree_max_nodes).
    axtree: list[AXNode] | None = None
    axtree_cut: bool = False
    # The page's elements with their boxes and visibility, for episodes opened with dom (None otherwise), and
    # whether they were cut at the worker's cap (WorkerConfig.dom_max_nodes).
    dom: list[DOMNode] | None = None
    dom_cut: bool = False
    # Episodes opened with traffic: what their recording or replay did since the previous observation.
    traffic: TrafficStats | None = None


# --- messages -----------------------------------------------------------------------------------

class Message(msgspec.Struct, array_like=True, tag_field="tag", forbid_unknown_fields=True):
    """Base of all wire messages: an array ``[tag, fields...]``."""

    TAG: ClassVar[str]


class Hello(Message, tag="hello"):
    """Worker -> engine, once connected and its browser is up. ``pid``, ``hostname`` and ``browser_pid``
    are the worker's own view of its host: the engine uses them only for workers it started itself."""

    TAG: ClassVar[str] = "hello"
    worker_id: WorkerId
    pid: Count
    hostname: ShortText
    browser_pid: Count
    browser_version: ShortText
    shm_name: ShortText | None
    slot_count: Annotated[int, msgspec.Meta(ge=0, le=MAX_SLOTS)]
    slot_size: Annotated[int, msgspec.Meta(ge=0, le=MAX_MESSAGE_BYTES)]
    protocol: int = PROTOCOL_VERSION


class NetSettings(msgspec.Struct, array_like=True, forbid_unknown_fields=True):
    """The network policy for pages (see ``netpolicy.py``): a worker's own (``WorkerConfig.net``), and the
    engine's, sent to every worker that joins, so that a worker started by hand on another host applies the same
    rules as the engine's own workers.

    Every load of a context goes through a proxy in the worker that refuses metadata, link-local and (unless
    ``allow_private_network``) loopback and private addresses; ``enabled`` False turns the proxy off."""

    enabled: bool = True
    allow_private_network: bool = False
    allow: list[str] = msgspec.field(default_factory=list)
    deny: list[str] = msgspec.field(default_factory=list)
    exempt: list[str] = msgspec.field(default_factory=list)  # the engine's own sites, HOST:PORT (they bypass it)
    # name -> address(es, comma-separated) used instead of DNS (tests make fake hosts on 127.x with it)
    hosts: dict[str, str] = msgspec.field(default_factory=dict)


class Welcome(Message, tag="welcome"):
    """Engine -> worker: accepted; ``use_shm`` False when the engine cannot map the worker's ring; ``net``: the
    network policy the worker's pages follow."""

    TAG: ClassVar[str] = "welcome"
    use_shm: bool
    net: NetSettings | None = None


class Heartbeat(Message, tag="heartbeat"):
    """Worker -> engine, periodically."""

    TAG: ClassVar[str] = "heartbeat"
    worker_id: WorkerId
    contexts: Count
    inflight: Count
    draining: bool = False  # the worker wants no new episodes (e.g. it will recycle its browser when idle)
    browser_pid: Count = 0  # the worker's current Chromium (it changes when the browser is recycled)
    # The PSS of that Chromium's process tree at the worker's last memory check (bytes; 0: none yet). Read by the
    # worker, which watches it anyway: the engine need not read /proc itself, and hears from remote hosts too.
    browser_pss: ByteCount = 0


# --- operations: what a Request asks of one episode's page, one struct each ------------------------

class ErrorKind(StrEnum):
    """The failure class a Reply carries (a worker that sends another is a peer sending garbage)."""

    REFUSED = "refused"  # the operation was refused (bad scheme, unknown op)
    HUNG = "hung"  # the page stopped responding; its context was discarded
    NO_EPISODE = "no_episode"  # the episode has no page on this worker
    BROWSER = "browser"  # the browser crashed or disconnected
    TOO_LARGE = "too_large"  # the reply would exceed MAX_MESSAGE_BYTES (a page's huge value): not sent
    PAGE_MEMORY = "page_memory"  # the page's renderer grew past page_memory_mib and was ended; its context discarded
    CAPTURE = "capture"  # Chromium refused the screenshot on every try (WorkerConfig.capture_retries)
    INTERNAL = "internal"


ERR_REFUSED = ErrorKind.REFUSED
ERR_HUNG = ErrorKind.HUNG
ERR_NO_EPISODE = ErrorKind.NO_EPISODE
ERR_BROWSER = ErrorKind.BROWSER
ERR_TOO_LARGE = ErrorKind.TOO_LARGE
ERR_PAGE_MEMORY = ErrorKind.PAGE_MEMORY
ERR_CAPTURE = ErrorKind.CAPTURE
ERR_INTERNAL = ErrorKind.INTERNAL


class Op(StrEnum):
    """The operations a Request carries (each one's struct below has this tag)."""

    OPEN = "open"
    ACT = "act"
    OBSERVE = "observe"
    LOCATE = "locate"
    EVALUATE = "evaluate"
    CLOSE = "close"


ImageFormat = Literal["jpeg", "png"]


class Operation(msgspec.Struct, array_like=True, tag_field="op", forbid_unknown_fields=True):
    """The base of the operation structs (a tagged union on the wire: ``[op, field1, ...]``)."""

    @property
    def op(self) -> Op:
        tag = self.__struct_config__.tag
        assert isinstance(tag, str)  # every operation struct is tagged with its Op's value
        return Op(tag)


class Open(Operation, tag=Op.OPEN.value):
    """Open a page for the episode at ``url`` (see :meth:`browserpool.pool.BrowserSession.open`)."""

    url: str
    som: bool = False  # Set-of-Marks mode for the whole episode
    som_elements: Count = 0  # the most elements it lists and draws (0: the worker's own cap)
    axtree: bool = False  # every observation carries the page's accessibility tree
    dom: bool = False  # every observation carries the page's DOM snapshot
    traffic: TrafficSpec | None = None  # record or replay the episode's traffic
    setup_js: str | None = None  # run once after the first load
    probe_js: str | None = None  # evaluated after every observation's settle
    shot: bool = True  # False: no screenshot


class Act(Operation, tag=Op.ACT.value):
    """Carry out one action and observe the settled page."""

    action: BrowserAction
    shot: bool = True


class Observe(Operation, tag=Op.OBSERVE.value):
    """Observe the page without an action."""

    som: bool | None = None  # None: the episode's mode
    format: ImageFormat = "jpeg"
    axtree: bool | None = None  # None: the episode's mode
    dom: bool | None = None  # None: the episode's mode


class Locate(Operation, tag=Op.LOCATE.value):
    """Where a CSS selector's first visible match is in the viewport."""

    selector: str


class Evaluate(Operation, tag=Op.EVALUATE.value):
    """Evaluate JavaScript expressions in the page."""

    exprs: list[str]


class Close(Operation, tag=Op.CLOSE.value):
    """Give the episode's context back to the worker."""


AnyOperation = Open | Act | Observe | Locate | Evaluate | Close


class Request(Message, tag="req"):
    """Engine -> worker: one operation on one episode's page.

    ``release`` returns screenshot slots ([slot, generation] pairs) the engine is done with; every
    request carries them, so no message of its own is needed.
    """

    TAG: ClassVar[str] = "req"
    req_id: Count
    episode_id: str
    operation: AnyOperation
    release: list[tuple[Count, Count]] = msgspec.field(default_factory=list)

    @property
    def op(self) -> Op:
        return self.operation.op


class Reply(Message, tag="rep"):
    """Worker -> engine: the answer to one Request. ``error_kind`` names the failure class.

    ``body`` is what the operation returns: an Observation for open/act, plain data for locate/evaluate.
    Decoded messages carry it as ``msgspec.Raw`` until the pool decodes it for the op it asked for."""

    TAG: ClassVar[str] = "rep"
    req_id: Count
    ok: bool
    body: Any = None
    error: ErrorText | None = None
    error_kind: ErrorKind | None = None


class Shutdown(Message, tag="shutdown"):
    """Engine -> worker: close the browser and exit."""

    TAG: ClassVar[str] = "shutdown"


_TYPES: dict[str, type[Message]] = {
    cls.TAG: cls for cls in (Hello, Welcome, Heartbeat, Request, Reply, Shutdown)
}


class _RawReply(Message, tag="rep"):
    """Reply as the engine decodes it: the body left undecoded (see decode_observation)."""

    req_id: Count
    ok: bool
    body: msgspec.Raw = msgspec.Raw(b"\xc0")
    error: ErrorText | None = None
    error_kind: ErrorKind | None = None


def error_text(message: str) -> str:
    """``message`` as a Reply's error: cut to :data:`MAX_ERROR_CHARS` (a page's exception or a model's key name can
    make any length, and a longer error would make the whole reply undecodable for the engine)."""
    return message if len(message) <= MAX_ERROR_CHARS else message[:MAX_ERROR_CHARS - 1] + "\u2026"


class ProtocolError(ValueError):
    """A message that cannot be decoded (not msgpack, unknown tag, wrong shape or field types)."""


_encoder = msgspec.msgpack.Encoder()
# What each side may receive.
_from_worker = msgspec.msgpack.Decoder(Hello | Heartbeat | _RawReply)
_from_engine = msgspec.msgpack.Decoder(Welcome | Request | Shutdown)
_any = msgspec.msgpack.Decoder(Hello | Welcome | Heartbeat | Request | Reply | Shutdown)
_observation = msgspec.msgpack.Decoder(Observation)


def encode(msg: Message) -> bytes:
    """Serialise a message to bytes. A page's text may hold a lone UTF-16 surrogate (a JavaScript string can;
    UTF-8 cannot): such a message is sent with U+FFFD in its place, the rest unchanged."""
    try:
        return _encoder.encode(msg)
    except UnicodeEncodeError:
        return _encoder.encode(_scrub(msgspec.to_builtins(msg, builtin_types=(bytes, bytearray, memoryview))))


_SURROGATE = re.compile("[\ud800-\udfff]")


def _scrub(value: Any) -> Any:
    """``value`` (plain data) with every lone surrogate replaced by U+FFFD."""
    if isinstance(value, str):
        return _SURROGATE.sub("\ufffd", value)
    if isinstance(value, list):
        return [_scrub(v) for v in value]
    if isinstance(value, dict):
        return {_scrub(k): _scrub(v) for k, v in value.items()}
    return value


def decode(data: bytes | memoryview) -> Message:
    """Parse any message produced by :func:`encode`; raises ProtocolError on anything else."""
    return _decode(_any, data)


def decode_from_worker(data: bytes | memoryview) -> Hello | Heartbeat | Reply:
    """What the engine accepts from a worker; a Reply's body stays raw (``msgspec.Raw``)."""
    msg = _decode(_from_worker, data)
    if isinstance(msg, _RawReply):
        return Reply(msg.req_id, msg.ok, msg.body, msg.error, msg.error_kind)
    return msg


def decode_from_engine(data: bytes | memoryview) -> Welcome | Request | Shutdown:
    """What a worker accepts from the engine."""
    return _decode(_from_engine, data)


def decode_observation(body: Any) -> Observation:
    """An open's or act's reply body as an Observation (validated); raises ProtocolError."""
    if isinstance(body, Observation):
        return body
    if isinstance(body, msgspec.Raw):
        return _decode(_observation, body)
    try:
        return msgspec.convert(body, Observation)
    except msgspec.ValidationError as exc:
        raise ProtocolError(f"invalid observation: {exc}") from exc


def decode_body(body: Any) -> Any:
    """A reply body of plain data (locate, evaluate) as Python objects."""
    if isinstance(body, msgspec.Raw):
        return _decode(msgspec.msgpack.Decoder(), body)
    return body


def _decode(decoder: msgspec.msgpack.Decoder, data: Any) -> Any:
    try:
        return decoder.decode(data)
    # ValueError: invalid UTF-8 in a string, among others; RecursionError: arrays nested too deep (a message of
    # 100 kB can nest 100,000 deep, and even a Raw field is walked to be skipped).
    except (msgspec.MsgspecError, ValueError, RecursionError) as exc:
        raise ProtocolError(f"undecodable message: {exc}") from exc


