"""Where the monitor's messages come from: a running engine's telemetry socket, or a recorded file.

:class:`SocketFeed` finds the engine (a run directory's ``telemetry.json``, the latest run under the output
directory, or an endpoint given outright), subscribes, and hands every decoded message to a callback. It
waits for an engine that is not up yet, and re-attaches when the engine restarts or a newer run starts.
:class:`ReplayFeed` plays a recorded feed (a msgpack stream of messages, as ``--record`` writes it).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import BinaryIO, Protocol, cast

import msgpack
import msgspec
import zmq
import zmq.asyncio

from browserpool.auth import ClientKeys
from engine.telemetry.publisher import ENDPOINT_FILE
from engine.telemetry.wire import EndpointInfo, TelemetryFormatError, TelemetryMessage, convert, decode, encode

Apply = Callable[[TelemetryMessage], None]
Status = Callable[[str], None]
STALE_S = 5.0  # no message for this long while attached: say so


class Source(Protocol):
    """A feed the monitor app runs: calls ``apply`` with each message and ``status`` with a state line."""

    async def run(self, apply: Apply, status: Status) -> None: ...


def read_endpoint(run_dir: Path) -> EndpointInfo | None:
    """The run directory's ``telemetry.json``; None if not there (yet), or not what an engine writes."""
    try:
        return msgspec.json.decode((run_dir / ENDPOINT_FILE).read_bytes(), type=EndpointInfo)
    except (OSError, msgspec.DecodeError):
        return None


def latest_run(output_dir: Path) -> Path | None:
    """The run directory under ``output_dir`` whose engine started its telemetry last."""
    best: tuple[float, Path] | None = None
    with contextlib.suppress(OSError):
        for f in output_dir.glob(f"*/{ENDPOINT_FILE}"):
            with contextlib.suppress(OSError):
                key = (f.stat().st_mtime, f.parent)
                if best is None or key > best:
                    best = key
    return best[1] if best else None


class SocketFeed:
    """Subscribe to an engine's telemetry.

    ``endpoint``: connect there (the engine may start later). ``run_dir``: the endpoint from its
    ``telemetry.json`` (waits until it appears). Neither: the latest run under ``output_dir``, following newer
    runs as they start. ``record``: also append every raw message to this file. ``keys``: CURVE keys for an
    engine whose telemetry is on tcp with authentication.
    """

    def __init__(self, run_dir: str | Path | None = None, endpoint: str | None = None,
                 output_dir: str | Path = "runs", record: str | Path | None = None, poll_s: float = 0.5,
                 keys: ClientKeys | None = None) -> None:
        self.keys = keys
        self.run_dir = Path(run_dir) if run_dir else None
        self.endpoint = endpoint
        self.output_dir = Path(output_dir)
        self.record = Path(record) if record else None
        self.poll_s = poll_s
        self.received = 0
        self.bad = 0  # messages that were not telemetry of this format: dropped
        self._ctx = zmq.asyncio.Context()

    async def _find(self, status: Status, current: tuple[Path, EndpointInfo] | None
                    ) -> tuple[Path | None, EndpointInfo]:
        """Wait for an engine to attach to: (run directory, its telemetry.json)."""
        shown = False
        while True:
            run_dir = self.run_dir or latest_run(self.output_dir)
            info = read_endpoint(run_dir) if run_dir else None
            if run_dir is not None and info is not None and (current is None or (run_dir, info) != current):
                return run_dir, info
            if not shown:
                where = self.run_dir or f"{self.output_dir}/"
                status(f"waiting for an engine ({where})")
                shown = True
            await asyncio.sleep(self.poll_s)

    async def run(self, apply: Apply, status: Status) -> None:
        """Receive until cancelled."""
        out: BinaryIO | None = self.record.open("ab") if self.record else None
        try:
            if self.endpoint:
                await self._attach(self.endpoint, None, apply, status, out)
                return
            current: tuple[Path, EndpointInfo] | None = None
            while True:
                run_dir, info = await self._find(status, current)
                assert run_dir is not None
                current = (run_dir, info)
                await self._attach(info.endpoint, run_dir, apply, status, out, info)
        finally:
            if out:
                out.close()
            self._ctx.destroy(linger=0)

    async def _attach(self, endpoint: str, run_dir: Path | None, apply: Apply, status: Status,
                      out: BinaryIO | None, info: EndpointInfo | None = None) -> None:
        """Receive from one endpoint; return when another engine or run should be followed instead."""
        sock = self._ctx.socket(zmq.SUB)
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt(zmq.RCVHWM, 10000)
        sock.setsockopt(zmq.RECONNECT_IVL, 200)  # an engine that starts later is found within 0.2 s
        sock.setsockopt(zmq.SUBSCRIBE, b"")
        if self.keys is not None and endpoint.startswith("tcp://"):
            self.keys.apply(sock)
        sock.connect(endpoint)
        name = run_dir.name if run_dir else endpoint
        status(f"connecting to {endpoint}" + (" (the run has ended)" if info and info.ended_at else ""))
        last = time.monotonic()
        ended = False
        stale_shown = False
        bad_note = ""
        try:
            while True:
                if await sock.poll(int(self.poll_s * 1000)):
                    # Drain whatever is queued before giving the loop back: a burst costs one wake-up.
                    while cast(int, sock.getsockopt(zmq.EVENTS)) & zmq.POLLIN:  # an int option (pyzmq: int | bytes)
                        raw = await sock.recv()  # ready: zmq.asyncio hands back a future that is already done
                        self.received += 1
                        try:
                            msg = decode(raw)
                        except TelemetryFormatError as exc:
                            # Someone else's socket, or a garbled message: counted and shown, never applied or
                            # recorded (a recording plays back).
                            self.bad += 1
                            bad_note = f"; dropped {self.bad} bad message{'s' * (self.bad > 1)} (last: {exc})"
                            stale_shown = True  # the state line is redrawn with the note
                            continue
                        if out is not None:
                            out.write(raw)
                        apply(msg)
                        ended = msg.kind == "end"
                    if stale_shown or self.received == 1 or ended:
                        status(("the run has ended" if ended else "attached") + bad_note)
                        stale_shown = False
                    last = time.monotonic()
                    continue
                if self.endpoint is None:
                    # Switch when a newer run (or a restart of this one, --resume) has its telemetry up.
                    newer = self.run_dir or latest_run(self.output_dir)
                    newer_info = read_endpoint(newer) if newer else None
                    if newer_info is not None and (newer, newer_info) != (run_dir, info) \
                            and not newer_info.ended_at:
                        return
                if not stale_shown and not ended and time.monotonic() - last > STALE_S:
                    status(f"no data from {name} for {STALE_S:.0f} s (engine gone or not started)")
                    stale_shown = True
        finally:
            sock.close(0)


def read_messages(path: str | Path) -> list[TelemetryMessage]:
    """The messages of a recorded feed (a msgpack stream); TelemetryFormatError names the first bad one."""
    out: list[TelemetryMessage] = []
    with open(path, "rb") as f:
        try:
            for obj in msgpack.Unpacker(f, raw=False, strict_map_key=False):
                out.append(convert(obj))
        except (ValueError, msgpack.UnpackException) as exc:
            raise TelemetryFormatError(f"{path}: message {len(out) + 1}: {exc}") from None
    return out


def write_messages(path: str | Path, messages: Iterable[TelemetryMessage]) -> int:
    """Record messages as a msgpack stream; returns how many."""
    n = 0
    with open(path, "wb") as f:
        for m in messages:
            f.write(encode(m))
            n += 1
    return n


class ReplayFeed:
    """Play recorded messages; ``speed`` None: all at once (tests), else in real time divided by ``speed``."""

    def __init__(self, messages: str | Path | list[TelemetryMessage], speed: float | None = None) -> None:
        self.messages = read_messages(messages) if isinstance(messages, str | Path) else messages
        self.speed = speed

    async def run(self, apply: Apply, status: Status) -> None:
        """Apply every message, then idle until cancelled."""
        status(f"replay of {len(self.messages)} messages")
        prev: float | None = None
        for m in self.messages:
            if self.speed and prev is not None:
                await asyncio.sleep(max(0.0, (m.t - prev) / self.speed))
            prev = m.t
            apply(m)
        status("replay finished")
        await asyncio.Event().wait()
