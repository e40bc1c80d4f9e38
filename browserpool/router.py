"""The engine's ROUTER socket on the event loop, read in batches through its file descriptor.

``zmq.asyncio`` gives every receive and every send a future, a poll of the socket's events and callbacks on the
loop; at a few thousand messages per second that machinery cost the engine's loop more than the messages themselves.
This socket sends at once (a ROUTER never blocks: a peer past its high-water mark loses the message, as ZeroMQ
documents) and receives whatever is queued in one go.

ZeroMQ's descriptor says only that the socket's state may have changed, and any operation on the socket can take
that signal (a send that finds a message waiting, for one). So the reader receives until ``EAGAIN`` before it waits,
and a send wakes a waiting reader to look again.
"""

from __future__ import annotations

import asyncio
from typing import cast

import zmq

from browserpool.protocol import HANDSHAKE_TIMEOUT_MS

# Messages handed over per batch: the loop runs the tasks they woke before the next batch is read.
BATCH = 256
# Plain ints: flags as enums cost an enum operation per call.
_NOBLOCK = int(zmq.NOBLOCK)
_MORE = int(zmq.SNDMORE | zmq.NOBLOCK)


class RouterSocket:
    """One ROUTER socket of a ``zmq.Context``; every method runs on the event loop's thread."""

    def __init__(self, ctx: zmq.Context, max_message_bytes: int) -> None:
        self.sock: zmq.Socket = zmq.Socket(ctx, zmq.ROUTER)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.setsockopt(zmq.MAXMSGSIZE, max_message_bytes)  # bigger messages never reach Python
        self.sock.setsockopt(zmq.HANDSHAKE_IVL, HANDSHAKE_TIMEOUT_MS)
        # Fixed for the socket's life; ``sock.FD`` is a getsockopt call. (pyzmq types every option's value as
        # ``int | bytes``; FD is an int.)
        self._fd = cast(int, self.sock.getsockopt(zmq.FD))
        self._waiter: asyncio.Future[None] | None = None
        self._reading: asyncio.AbstractEventLoop | None = None  # the loop watching the descriptor, while one does

    def bind(self, endpoint: str) -> str:
        """Bind to ``endpoint``; the address bound (a tcp port chosen by the system, an ipc path)."""
        self.sock.bind(endpoint)
        return cast(bytes, self.sock.getsockopt(zmq.LAST_ENDPOINT)).decode()  # a bytes option (see __init__)

    def send(self, identity: bytes, payload: bytes) -> None:
        """Send ``payload`` to the peer ``identity`` (dropped by ZeroMQ when that peer is gone); raises
        ``zmq.ZMQError`` only when the socket itself is closed or broken."""
        self.sock.send(identity, _MORE)
        self.sock.send(payload, _NOBLOCK)  # copied: messages to workers are small
        self._wake()  # the send may have taken the descriptor's signal of a message that came meanwhile

    async def recv_batch(self) -> list[list[zmq.Frame]]:
        """The messages queued now (at most :data:`BATCH`), each as its frames (the peer's identity first); waits
        for one when none is. Yields to the loop once first, so that the tasks the last batch woke run."""
        await asyncio.sleep(0)
        while True:
            batch: list[list[zmq.Frame]] = []
            recv = self.sock.recv
            try:
                while len(batch) < BATCH:
                    # Frames, not bytes: a peer's CURVE key travels in their metadata.
                    frames = [recv(_NOBLOCK, copy=False)]
                    while frames[-1].more:
                        frames.append(recv(_NOBLOCK, copy=False))
                    batch.append(frames)
            except zmq.Again:
                pass
            if batch:
                return batch
            await self._readable()

    async def _readable(self) -> None:
        """Wait until the descriptor signals or a send asks for another look."""
        loop = asyncio.get_running_loop()
        self._waiter = loop.create_future()
        loop.add_reader(self._fd, self._wake)
        self._reading = loop
        try:
            await self._waiter
        finally:
            self._waiter = None
            self._stop_reading()

    def _stop_reading(self) -> None:
        if self._reading is not None:
            self._reading.remove_reader(self._fd)
            self._reading = None

    def _wake(self) -> None:
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)

    def close(self) -> None:
        """Close the socket (messages not yet sent are dropped); a reader waiting on it is woken."""
        if self.sock.closed:
            return
        self._stop_reading()
        self._wake()
        self.sock.close(0)
