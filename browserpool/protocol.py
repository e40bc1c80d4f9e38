"""Typed messages between the engine (ROUTER) and browser workers (DEALER), encoded with msgpack.

Every message travels as one msgpack array ``[tag, field1, field2, ...]``; each dataclass below lists
its fields in wire order. Screenshots never travel here as bytes when shared memory is available: a
reply carries a :class:`FrameRef` to a slot in the worker's ring (see ``shm.py``).
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any, ClassVar

import msgpack

PROTOCOL_VERSION = 1


@dataclass(slots=True)
class BrowserAction:
    """One browser-level operation, in CSS pixels of the viewport.

    kinds: click, hover, type, key, scroll, wait, go_back, navigate, select.
    ``selector`` may replace (x, y) for click/hover/type/select: the worker clicks the element's centre and
    reports the point it used, so records always hold plain coordinates.
    ``select`` picks the option whose label or value equals ``text`` (case-insensitive, trimmed) in the
    <select> at (x, y), also inside same-origin iframes and open shadow roots; refused when there is no
    <select> there or no such option.
    """

    kind: str
    x: float | None = None
    y: float | None = None
    selector: str | None = None
    text: str | None = None
    clear: bool = True
    enter: bool = True
    keys: str | None = None
    direction: str | None = None
    amount: int | None = None
    url: str | None = None
    seconds: float | None = None

    def to_wire(self) -> dict[str, Any]:
        return {name: v for name in _ACTION_FIELDS if (v := getattr(self, name)) is not None}

    @classmethod
    def from_wire(cls, d: dict[str, Any]) -> BrowserAction:
        return cls(**d)


_ACTION_FIELDS = tuple(f.name for f in fields(BrowserAction))


@dataclass(slots=True)
class FrameRef:
    """Where a JPEG screenshot lies: a slot of the worker's shared-memory ring."""

    slot: int
    generation: int
    nbytes: int


@dataclass(slots=True)
class Observation:
    """What the worker saw after an operation."""

    url: str
    title: str
    settled: bool
    settle: str  # quiet | busy | timeout | hung | skipped
    width: int
    height: int
    frame: FrameRef | None = None
    frame_bytes: bytes | None = None  # inline JPEG when no slot was free or shm is unavailable
    timings_ms: dict[str, float] = field(default_factory=dict)
    point: tuple[float, float] | None = None  # where a click/type actually landed (CSS px)
    note: str | None = None  # non-fatal problem with the action (e.g. a refused URL)
    # Set-of-Marks episodes only: the visible interactive elements, [id, tag, text, x, y, w, h] each
    # (ids 1..N in document order, boxes in viewport CSS px, clipped to the viewport); the frame then
    # shows them as numbered boxes. None when the episode was not opened in SoM mode.
    elements: list[list[Any]] | None = None
    # The JSON result of the episode's probe expression (``open(..., probe_js=...)``), evaluated after the
    # settle of every observation: a page's own view of its state (e.g. MiniWoB's reward and done flag).
    # None when the episode has no probe; ``{"error": message}`` when the expression threw.
    probe: Any = None
    # Fraction of (1/4-scale) pixels that differ from this episode's previous screenshot (the raw captures,
    # before any marks are drawn), computed by the worker so the engine's single thread need not decode
    # frames. None for an episode's first screenshot, or when the comparison failed.
    change: float | None = None

    def to_wire(self) -> list[Any]:
        frame = [self.frame.slot, self.frame.generation, self.frame.nbytes] if self.frame else None
        return [self.url, self.title, self.settled, self.settle, self.width, self.height, frame,
                self.frame_bytes, self.timings_ms, self.point, self.note, self.elements, self.probe, self.change]

    @classmethod
    def from_wire(cls, w: list[Any]) -> Observation:
        # Older, shorter observations (11 fields: before ``elements``; 12: before ``probe``; 13: before
        # ``change``) read as ones without those fields.
        url, title, settled, settle, width, height, frame, frame_bytes, timings, point, note, *rest = w
        rest += [None] * (3 - len(rest))
        return cls(url, title, settled, settle, width, height,
                   FrameRef(*frame) if frame else None, frame_bytes, timings,
                   tuple(point) if point else None, note, rest[0], rest[1], rest[2])


# --- messages -----------------------------------------------------------------------------------

class Message:
    """Base of all wire messages; subclasses set TAG and are dataclasses."""

    TAG: ClassVar[str]


@dataclass(slots=True)
class Hello(Message):
    """Worker -> engine, once connected and its browser is up."""

    TAG: ClassVar[str] = "hello"
    worker_id: str
    pid: int
    hostname: str
    browser_pid: int
    browser_version: str
    shm_name: str | None
    slot_count: int
    slot_size: int
    protocol: int = PROTOCOL_VERSION


@dataclass(slots=True)
class Welcome(Message):
    """Engine -> worker: accepted; ``use_shm`` False when the engine cannot map the worker's ring."""

    TAG: ClassVar[str] = "welcome"
    use_shm: bool


@dataclass(slots=True)
class Heartbeat(Message):
    """Worker -> engine, periodically."""

    TAG: ClassVar[str] = "heartbeat"
    worker_id: str
    contexts: int
    inflight: int


@dataclass(slots=True)
class Request(Message):
    """Engine -> worker: one operation on one episode's page.

    ops: open (url; som: Set-of-Marks mode, setup_js, probe_js: each sent only when set), act (action),
    locate (selector), evaluate (exprs), close.
    ``release`` returns screenshot slots ([slot, generation] pairs) the engine is done with; every
    request carries them, so no message of its own is needed.
    """

    TAG: ClassVar[str] = "req"
    req_id: int
    op: str
    episode_id: str
    args: dict[str, Any] = field(default_factory=dict)
    release: list[list[int]] = field(default_factory=list)


@dataclass(slots=True)
class Reply(Message):
    """Worker -> engine: the answer to one Request. ``error_kind`` names the failure class."""

    TAG: ClassVar[str] = "rep"
    req_id: int
    ok: bool
    body: Any = None
    error: str | None = None
    error_kind: str | None = None


@dataclass(slots=True)
class Shutdown(Message):
    """Engine -> worker: close the browser and exit."""

    TAG: ClassVar[str] = "shutdown"


_TYPES: dict[str, type] = {
    cls.TAG: cls for cls in (Hello, Welcome, Heartbeat, Request, Reply, Shutdown)
}
_FIELDS: dict[type, tuple[str, ...]] = {cls: tuple(f.name for f in fields(cls)) for cls in _TYPES.values()}


class ProtocolError(ValueError):
    """A message that cannot be decoded."""


def encode(msg: Message) -> bytes:
    """Serialise a message to bytes."""
    cls = type(msg)
    return msgpack.packb([cls.TAG, *(getattr(msg, name) for name in _FIELDS[cls])], use_bin_type=True)


def decode(data: bytes | memoryview) -> Message:
    """Parse bytes produced by :func:`encode`; raises ProtocolError on anything else."""
    try:
        tag, *values = msgpack.unpackb(data, raw=False, use_list=True)
        cls = _TYPES[tag]
        return cls(*values)
    except (ValueError, TypeError, KeyError, msgpack.UnpackException) as exc:
        raise ProtocolError(f"undecodable message: {exc}") from exc


# Error kinds a Reply may carry.
ERR_REFUSED = "refused"  # the operation was refused (bad scheme, unknown op)
ERR_HUNG = "hung"  # the page stopped responding; its context was discarded
ERR_NO_EPISODE = "no_episode"  # the episode has no page on this worker
ERR_BROWSER = "browser"  # the browser crashed or disconnected
ERR_INTERNAL = "internal"
