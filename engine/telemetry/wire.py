"""The telemetry wire format: what the engine's publisher sends and a monitor reads, one typed struct per part.

One msgpack map per ZeroMQ message (see :mod:`engine.telemetry.publisher` for when each kind is sent)::

    {"v": 1, "kind": "delta" | "snapshot" | "end", "seq": n, "t": unix time, "run": run dir name,
     "cells":   {episode_id: [state, op, step, reward]},      # dirty cells; all of them in a snapshot
     "tasks":   {episode_id: task_id},                       # snapshots, and cells announced for the first time
     "details": {episode_id: {field: value}},                # only fields that changed since last sent
     "agg":     {...}}                                       # a few times a second, and in every snapshot

A monitor may be attached to an engine it does not control (``--endpoint``): :func:`decode` checks every
message against these types, so a garbled, truncated or hostile one is a :class:`TelemetryFormatError` the
monitor counts and drops, never an exception inside its drawing code. The figures a pane formats are finite
and not negative. Fields a newer engine adds are ignored.
"""

from __future__ import annotations

from typing import Annotated, Literal

import msgspec
from msgspec import UNSET, UnsetType

FORMAT_VERSION = 1
MAX_TEXT = 800  # a detail's text is cut to this (and "…"): the monitor shows a few lines

Count = Annotated[int, msgspec.Meta(ge=0)]
# Finite and not negative: what the monitor formats and scales (a NaN or an infinity would break a sparkline).
Figure = Annotated[float, msgspec.Meta(ge=0, le=1e15)]
Cell = tuple[str, str, Count, float | None]  # state letter, operation letter, step, reward (None: not yet)
DetailText = Annotated[str, msgspec.Meta(max_length=MAX_TEXT + 1)]


class WorkerRow(msgspec.Struct, frozen=True):
    """One browser worker as the pool sees it."""

    id: str
    alive: bool
    episodes: Count
    ops: Count  # operations in flight
    waiting: Count  # operations queued for it
    opens: Count  # episode opens in flight
    pss: Count | None = None  # its browser's memory in bytes; None: no reading yet


class Queues(msgspec.Struct, frozen=True):
    """What is in flight and what waits, per resource."""

    policy_in_use: Count = 0
    policy_cap: Count = 0
    policy_waiting: Count = 0
    browser_in_flight: Count = 0
    browser_waiting: Count = 0
    lease_waiting: Count = 0
    judge_pending: Count = 0


class Outcomes(msgspec.Struct, frozen=True):
    """Finished episodes by record status (:data:`engine.store.records.STATUSES`), each counted apart. A map on the
    wire, as before it was typed: a monitor of either kind reads an engine of the other."""

    success: Count = 0
    failure: Count = 0
    unrewarded: Count = 0  # nothing could score it
    blocked: Count = 0  # the site refused the agent
    error: Count = 0
    judge_pending: Count = 0  # waiting for the judge (or the judge failed)


class Aggregate(msgspec.Struct, frozen=True):
    """The statistics pane's figures (a few times a second, and in every snapshot)."""

    states: dict[str, Count] = {}  # episodes per state letter
    ops: dict[str, Count] = {}  # running episodes per operation letter
    total: Count = 0
    done: Count = 0
    steps: Count = 0
    outcomes: Outcomes = Outcomes()
    success_rate: Figure = 0.0  # of the rewarded episodes (success + failure)
    steps_per_s: Figure = 0.0  # over the last ~10 s
    episodes_per_min: Figure = 0.0
    spark: list[Figure] = []  # steps/s history
    phases: dict[str, tuple[Figure, Figure, Count]] = {}  # name: (p50 ms, p95 ms, samples)
    queues: Queues = Queues()
    workers: list[WorkerRow] = []
    pss_total: Count = 0  # the live browsers' memory in bytes
    peak_pss: Count = 0
    restarts: Count = 0
    elapsed_s: Figure = 0.0
    eta_s: Figure | None = None  # None: unknown


class Details(msgspec.Struct, omit_defaults=True, frozen=True):
    """A rollout's details: only the fields that changed since they were last sent (the others are unset)."""

    task: DetailText | UnsetType = UNSET
    url: DetailText | UnsetType = UNSET
    title: DetailText | UnsetType = UNSET
    action: DetailText | UnsetType = UNSET
    thought: DetailText | UnsetType = UNSET
    screenshot: DetailText | UnsetType = UNSET  # path in the run directory
    timings: dict[str, Figure] | UnsetType = UNSET  # of the last completed step, ms
    error: DetailText | UnsetType = UNSET

    def fields(self) -> dict[str, object]:
        """The fields that are set."""
        return {f: v for f in self.__struct_fields__ if (v := getattr(self, f)) is not UNSET}


class TelemetryMessage(msgspec.Struct, omit_defaults=True, frozen=True):
    """One message of the feed."""

    v: int
    kind: Literal["delta", "snapshot", "end"]
    seq: Count
    t: Figure  # unix time
    run: str  # the run directory's name
    cells: dict[str, Cell] = {}
    tasks: dict[str, str] = {}  # episode id: task id
    details: dict[str, Details] = {}
    agg: Aggregate | None = None


class EndpointInfo(msgspec.Struct, omit_defaults=True, frozen=True):
    """A run directory's ``telemetry.json``: where its engine publishes, and since when."""

    endpoint: str
    pid: int
    started_at: float
    ended_at: float | None = None  # the engine closed its telemetry


class TelemetryFormatError(ValueError):
    """Bytes that are not a telemetry message of this format."""


_encoder = msgspec.msgpack.Encoder()
_decoder = msgspec.msgpack.Decoder(TelemetryMessage)


def encode(msg: TelemetryMessage) -> bytes:
    """msgpack bytes of a message."""
    return _encoder.encode(msg)


def decode(raw: bytes) -> TelemetryMessage:
    """One message from its msgpack bytes; TelemetryFormatError for anything else."""
    try:
        msg = _decoder.decode(raw)
    except msgspec.DecodeError as exc:
        raise TelemetryFormatError(str(exc)) from None
    return _checked(msg)


def convert(obj: object) -> TelemetryMessage:
    """One message from its decoded msgpack value (a map); TelemetryFormatError for anything else."""
    try:
        msg = msgspec.convert(obj, TelemetryMessage)
    except msgspec.ValidationError as exc:
        raise TelemetryFormatError(str(exc)) from None
    return _checked(msg)


def _checked(msg: TelemetryMessage) -> TelemetryMessage:
    if msg.v != FORMAT_VERSION:
        raise TelemetryFormatError(f"format version {msg.v}; this monitor reads version {FORMAT_VERSION}")
    return msg
