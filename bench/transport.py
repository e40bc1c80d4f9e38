"""CURVE vs plain tcp: what authentication and encryption of the worker socket cost, measured in one run.

Two measurements, each alternating plain and CURVE over the repeats so that both see the same machine state:
  * browser steps: a pool with one spawned worker on loopback tcp, frames inline in the replies (as a worker on
    another host sends them), N sessions looping click + settle + JPEG screenshot on the bundled sites;
    steps/s over a window after a warm-up;
  * transport only: a ROUTER and a DEALER on loopback tcp echoing a 150 KB payload (a screenshot's size),
    round trips/s and MB/s; no browser, so the cost of CURVE's encryption is all there is to see.

    python -m bench.transport [--seconds 10] [--repeats 3] [--concurrency 8] [--json PATH]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import statistics
import time
from typing import Any, cast

import zmq
import zmq.asyncio

from browserpool.auth import ClientKeys, CurveGuard, ServerKeys
from browserpool.pool import BrowserPool, PoolConfig
from browserpool.protocol import BrowserAction
from engine.sites.server import SiteServer

PAGES = ["/shop/", "/wiki/", "/travel/", "/forum/"]
CLICK = (1275.0, 384.0)  # an inert corner of every bundled page
PAYLOAD = 150_000


def _server_keys() -> ServerKeys:
    public, secret = zmq.curve_keypair()
    return ServerKeys(public, secret)


async def browser_steps(base: str, curve: bool, concurrency: int, seconds: float, warmup: float = 3.0
                        ) -> dict[str, Any]:
    """Steps/s of ``concurrency`` sessions through one spawned worker on loopback tcp."""
    cfg = PoolConfig(workers=1, listen="tcp://127.0.0.1:0", shared_memory=False,
                     server_keys=_server_keys() if curve else None, insecure=not curve)
    pool = BrowserPool(cfg)
    await pool.start()
    steps = 0
    counting = False
    stop = asyncio.Event()

    async def loop(i: int) -> None:
        # Each loop ends after the step it is in (no cancellation mid-request), then closes its session.
        nonlocal steps
        session = await pool.lease(f"b{i}")
        try:
            _, frame = await session.open(base + PAGES[i % len(PAGES)])
            frame.release()
            while not stop.is_set():
                _, frame = await session.act(BrowserAction("click", x=CLICK[0], y=CLICK[1]))
                frame.release()
                steps += counting
        finally:
            await session.close()

    tasks = [asyncio.ensure_future(loop(i)) for i in range(concurrency)]
    try:
        await asyncio.sleep(warmup)
        counting = True
        t0 = time.perf_counter()
        await asyncio.sleep(seconds)
        elapsed = time.perf_counter() - t0
        done = steps
        stop.set()
        await asyncio.wait_for(asyncio.gather(*tasks), 120)
    finally:
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await pool.close()
    return {"steps_per_s": round(done / elapsed, 2), "steps": done}


async def echo(curve: bool, seconds: float, in_flight: int = 8) -> dict[str, Any]:
    """Round trips/s of a PAYLOAD-byte message between a ROUTER and a DEALER on loopback tcp."""
    ctx = zmq.asyncio.Context()
    server = ctx.socket(zmq.ROUTER)
    client = ctx.socket(zmq.DEALER)
    guard = None
    if curve:
        keys = _server_keys()
        client_keys = ClientKeys.ephemeral(keys.public)
        keys.allowed.add(client_keys.public)
        guard = CurveGuard(ctx, keys)
        guard.start()
        keys.apply(server)
        client_keys.apply(client)
    for s in (server, client):
        s.setsockopt(zmq.LINGER, 0)
    server.bind("tcp://127.0.0.1:0")
    client.connect(cast(bytes, server.getsockopt(zmq.LAST_ENDPOINT)).decode())  # a bytes option (pyzmq: int | bytes)
    payload = b"\xab" * PAYLOAD
    trips = 0

    async def serve() -> None:
        while True:
            await server.send_multipart(await server.recv_multipart(copy=False), copy=False)

    async def drive() -> None:
        nonlocal trips
        for _ in range(in_flight):
            await client.send(payload, copy=False)
        while True:
            await client.recv(copy=False)
            trips += 1
            await client.send(payload, copy=False)

    tasks = [asyncio.ensure_future(serve()), asyncio.ensure_future(drive())]
    try:
        await asyncio.sleep(0.5)  # handshake and warm-up
        start, t0 = trips, time.perf_counter()
        await asyncio.sleep(seconds)
        n, elapsed = trips - start, time.perf_counter() - t0
    finally:
        for t in tasks:
            t.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await t
        server.close(0)
        client.close(0)
        if guard is not None:
            guard.stop()
        ctx.term()
    return {"round_trips_per_s": round(n / elapsed, 1), "mb_per_s": round(2 * n * PAYLOAD / elapsed / 1e6, 1)}


def _median(runs: list[dict[str, Any]], key: str) -> float:
    return round(statistics.median(r[key] for r in runs), 2)


async def main_async(args: argparse.Namespace) -> dict[str, Any]:
    runs: dict[str, dict[str, list[dict[str, Any]]]] = {"browser": {"plain": [], "curve": []},
                                                         "echo": {"plain": [], "curve": []}}
    with SiteServer() as sites:
        for i in range(args.repeats):
            order = ("plain", "curve") if i % 2 == 0 else ("curve", "plain")
            for mode in order:
                runs["browser"][mode].append(await browser_steps(sites.base_url, mode == "curve",
                                                                 args.concurrency, args.seconds))
                runs["echo"][mode].append(await echo(mode == "curve", min(args.seconds, 5.0)))
    plain_steps = _median(runs["browser"]["plain"], "steps_per_s")
    curve_steps = _median(runs["browser"]["curve"], "steps_per_s")
    plain_echo = _median(runs["echo"]["plain"], "round_trips_per_s")
    curve_echo = _median(runs["echo"]["curve"], "round_trips_per_s")
    return {
        "concurrency": args.concurrency, "seconds": args.seconds, "repeats": args.repeats, "payload_bytes": PAYLOAD,
        "browser_steps_per_s": {"plain": plain_steps, "curve": curve_steps,
                                "curve_over_plain": round(curve_steps / plain_steps, 3) if plain_steps else None},
        "echo_round_trips_per_s": {"plain": plain_echo, "curve": curve_echo,
                                   "curve_over_plain": round(curve_echo / plain_echo, 3) if plain_echo else None},
        "echo_mb_per_s": {"plain": _median(runs["echo"]["plain"], "mb_per_s"),
                          "curve": _median(runs["echo"]["curve"], "mb_per_s")},
        "runs": runs,
    }


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seconds", type=float, default=10.0, help="measurement window per run")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--concurrency", type=int, default=8, help="browser sessions")
    ap.add_argument("--json", default=None, help="also write the results here")
    args = ap.parse_args(argv)
    import uvloop

    result = uvloop.run(main_async(args))
    text = json.dumps({k: v for k, v in result.items() if k != "runs"}, indent=2)
    print(text)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=2)


if __name__ == "__main__":
    main()
