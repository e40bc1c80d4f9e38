"""A null browser worker: a benchmark stand-in (named as such) that speaks the worker protocol with no browser.

It connects to an engine like a worker started by hand (``--listen``), sends its Hello, writes every screenshot
into its shared-memory ring as a real worker does, and answers each request at once: ``open``, ``act`` and
``observe`` with an Observation of a pre-encoded JPEG (two alternating frames, so steps register a change),
``close`` with nothing. What is left to measure is the engine process alone: messaging, scheduling, the policy's
prompt and parse, the store. It never runs a page: it must not be used for anything but measuring the engine.

    python -m bench.null_worker --endpoint ipc:///tmp/engine.sock --id n0
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import numpy as np
import uvloop
import zmq
import zmq.asyncio

from browserpool import protocol as P
from browserpool.instance import Instance
from browserpool.shm import SlotRing
from engine import _imgcodec as codec

WIDTH, HEIGHT = 1280, 768
# The pages' address: local, so the engine applies no per-site limits; nothing is ever loaded from it.
PAGE_URL = "http://127.0.0.1:9/page/"


def frames(quality: int = 80) -> list[bytes]:
    """Two JPEG screenshots of a page-like image (bands of text-like noise), differing in one region."""
    rng = np.random.default_rng(0)
    img = np.full((HEIGHT, WIDTH, 3), 245, dtype=np.uint8)
    for top in range(40, HEIGHT - 40, 60):  # lines of "text"
        img[top:top + 14, 60:WIDTH - 200] = rng.integers(0, 120, size=(14, WIDTH - 260, 1), dtype=np.uint8)
    other = img.copy()
    other[100:300, 900:1200] = (30, 90, 200)  # a panel that comes and goes
    return [codec.encode(a, quality) for a in (img, other)]


class NullWorker:
    """One connection to the engine, answering every request with a frame from the ring (or inline)."""

    def __init__(self, endpoint: str, worker_id: str, slot_count: int = 1024, slot_size: int = 160 << 10) -> None:
        self.endpoint = endpoint
        self.worker_id = worker_id
        self.jpegs = frames()
        self.ring = SlotRing(slot_count, slot_size, Instance.current().new_shm_name(worker_id))
        self.use_shm = True
        self.served = 0
        self._open: dict[str, int] = {}  # episode -> steps so far (which frame comes next)
        self._ctx = zmq.asyncio.Context()
        self._sock = self._ctx.socket(zmq.DEALER)
        self._sock.setsockopt(zmq.LINGER, 0)

    async def run(self) -> None:
        """Serve until the engine says shut down."""
        self._sock.connect(self.endpoint)
        await self._send(P.Hello(self.worker_id, os.getpid(), socket.gethostname(), 0, "null (benchmark stand-in)",
                                 self.ring.name, self.ring.slot_count, self.ring.slot_size))
        beat = asyncio.create_task(self._heartbeat())
        try:
            while True:
                msg = P.decode_from_engine(await self._sock.recv())
                if isinstance(msg, P.Request):
                    for slot, gen in msg.release:
                        self.ring.release(slot, gen)
                    await self._send(P.Reply(msg.req_id, True, self._answer(msg)))
                    self.served += 1
                elif isinstance(msg, P.Welcome):
                    self.use_shm = msg.use_shm
                elif isinstance(msg, P.Shutdown):
                    return
        finally:
            beat.cancel()
            self.ring.close()
            self._sock.close(0)
            self._ctx.destroy(linger=0)

    def _answer(self, req: P.Request) -> Any:
        operation = req.operation
        if isinstance(operation, P.Close):
            self._open.pop(req.episode_id, None)
            return None
        if isinstance(operation, P.Evaluate):
            return [None] * len(operation.exprs)
        if isinstance(operation, P.Locate):
            return {}
        step = self._open.get(req.episode_id, -1) + 1
        self._open[req.episode_id] = step
        jpeg = self.jpegs[step % 2]
        ref = self.ring.write(jpeg) if self.use_shm else None
        url = operation.url if isinstance(operation, P.Open) else f"{PAGE_URL}{step}"
        return P.Observation(url=url, title="null page", settled=True, settle=P.SettleState.QUIET, width=WIDTH,
                             height=HEIGHT, frame=ref, frame_bytes=None if ref else jpeg,
                             change=None if step == 0 else 0.05, status=200)

    async def _heartbeat(self) -> None:
        parent = os.getppid()
        while True:
            if os.getppid() != parent:  # the benchmark that started it is gone: so is its engine
                raise SystemExit(0)
            await self._send(P.Heartbeat(self.worker_id, len(self._open), 0))
            await asyncio.sleep(1.0)

    async def _send(self, msg: P.Message) -> None:
        await self._sock.send(P.encode(msg), copy=False)


@contextlib.contextmanager
def null_workers(endpoint: str, count: int, slots: int) -> Iterator[list[subprocess.Popen[bytes]]]:
    """``count`` null workers in processes of their own, joining the engine that listens on ``endpoint``; at the
    end each is given 5 s to leave with its engine, then terminated (it unlinks its ring as it goes)."""
    procs = [subprocess.Popen([sys.executable, "-m", "bench.null_worker", "--endpoint", endpoint, "--id", f"n{i}",
                               "--slots", str(slots)], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL) for i in range(count)]
    try:
        yield procs
    finally:
        for p in procs:
            with contextlib.suppress(subprocess.TimeoutExpired):
                p.wait(5)
            if p.poll() is None:
                p.terminate()  # a worker the engine never took
                with contextlib.suppress(subprocess.TimeoutExpired):
                    p.wait(5)
            if p.poll() is None:
                p.kill()


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--endpoint", required=True)
    ap.add_argument("--id", default="n0")
    ap.add_argument("--slots", type=int, default=1024, help="screenshot slots (one per episode it serves at once)")
    args = ap.parse_args(argv)
    worker = NullWorker(args.endpoint, args.id, slot_count=args.slots)

    def interrupt(*_: object) -> None:
        raise KeyboardInterrupt  # unwinds run(): its ring is unlinked

    signal.signal(signal.SIGTERM, interrupt)
    with contextlib.suppress(KeyboardInterrupt):
        uvloop.run(worker.run())


if __name__ == "__main__":
    main()
