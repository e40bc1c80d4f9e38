"""The monitor: telemetry publisher, model, feeds, the Textual app (Pilot and snapshot tests on a recorded,
deterministic feed), and a real engine watched over its real telemetry socket."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path
from typing import Any

import msgpack
import pytest
import zmq
import zmq.asyncio

from browserpool.pool import BrowserPool
from engine.clients.runner import run
from engine.core.config import RunConfig
from engine.episode.status import EpisodeStatus, Op, State
from engine.store.stats import RunStats
from engine.telemetry.publisher import ENDPOINT_FILE, KEEP_FINISHED, TelemetryPublisher, ipc_endpoint, resolve_endpoint
from engine.telemetry.wire import Details, EndpointInfo, TelemetryMessage, decode, encode
from policy.registry import make_policy
from tests.conftest import FIXTURES_DIR, subset, until
from tui.app import MonitorApp
from tui.cli import run_with_tui
from tui.feed import ReplayFeed, SocketFeed, latest_run, read_endpoint, read_messages
from tui.model import MonitorModel
from tui.sim import simulated_feed
from tui.widgets import CELL_W, CellGrid, DetailPane, sparkline

FEED = FIXTURES_DIR / "monitor_feed.msgpack"  # python -c "...write_messages(FEED, simulated_feed(40, 12.0, seed=7))"
SNAP_SIZE = (132, 42)


@pytest.fixture(scope="module")
def feed() -> list[TelemetryMessage]:
    return read_messages(FEED)


def model_of(messages: list[TelemetryMessage]) -> MonitorModel:
    m = MonitorModel()
    for msg in messages:
        m.apply(msg)
    return m


# --- the recorded feed --------------------------------------------------------------------------------
def test_recorded_feed_is_what_the_simulation_produces(feed: list[TelemetryMessage]) -> None:
    # The fixture is the simulation's output; regenerating it gives the same bytes (deterministic).
    again = simulated_feed(40, 12.0, seed=7)
    assert b"".join(encode(m) for m in again) == FEED.read_bytes()
    assert again == feed
    assert feed[0].kind == "snapshot" and len(feed[0].cells) == 40
    assert [m.seq for m in feed] == list(range(len(feed)))


# --- model --------------------------------------------------------------------------------------------
def test_model_applies_snapshot_then_deltas(feed: list[TelemetryMessage]) -> None:
    m = model_of(feed[:1])
    assert len(m.cells) == 40 and all(c.state == "N" for c in m.cells.values())
    assert m.cells["sim-0003#0"].task_id == "sim-0003"
    m = model_of(feed)
    counts = m.counts()
    assert counts["F"] + counts["X"] > 20 and sum(counts.values()) == 40
    done = [c for c in m.cells.values() if c.state == "F"]
    assert all(c.reward in (0.0, 1.0) for c in done)
    c = done[0]
    assert {"task", "url", "action", "thought", "screenshot", "timings"} <= set(c.details)
    assert m.agg.done == counts["F"] + counts["X"] and m.gaps == 0


def test_model_delta_updates_only_named_cells() -> None:
    m = MonitorModel()
    m.apply(TelemetryMessage(1, "snapshot", 0, 0.0, "r", tasks={"a#0": "a", "b#0": "b"},
                             cells={"a#0": ("N", "", 0, None), "b#0": ("N", "", 0, None)}))
    v = m.version
    m.apply(TelemetryMessage(1, "delta", 1, 0.1, "r", cells={"a#0": ("R", "a", 3, None)},
                             details={"a#0": Details(url="http://x/", action="click")}))
    assert m.version > v
    assert (m.cells["a#0"].state, m.cells["a#0"].op, m.cells["a#0"].step) == ("R", "a", 3)
    assert m.cells["a#0"].text == "3a" and m.cells["b#0"].text == "N "
    m.apply(TelemetryMessage(1, "delta", 4, 0.4, "r", cells={"a#0": ("F", "", 5, 1.0)},
                             details={"a#0": Details(action="answer")}))
    assert m.cells["a#0"].details == {"url": "http://x/", "action": "answer"}  # fields merge
    assert m.cells["a#0"].style_key == "F1" and m.gaps == 2
    m.apply(TelemetryMessage(1, "end", 5, 0.5, "r"))
    assert m.ended
    m.apply(TelemetryMessage(1, "snapshot", 0, 0.6, "other", cells={"z#0": ("W", "", 0, None)}))
    assert list(m.cells) == ["z#0"] and not m.ended  # another run: start over


def test_model_filter_and_search(feed: list[TelemetryMessage]) -> None:
    m = model_of(feed[:40])
    states = {c.state for c in m.cells.values()}
    assert len(states) >= 3
    m.state_filter = "R"
    assert m.visible() and all(c.state == "R" for c in m.visible())
    m.state_filter = None
    m.search = "SIM-001"
    assert [c.task_id for c in m.visible()] == [f"sim-001{i}" for i in range(10)]
    m.search, m.state_filter = "sim-0012", "N"
    assert all(c.task_id == "sim-0012" and c.state == "N" for c in m.visible())


# --- publisher ----------------------------------------------------------------------------------------
def test_publisher_sends_dirty_cells_and_changed_details_only() -> None:
    now = [0.0]
    pub = TelemetryPublisher(None, None, clock=lambda: now[0], wall=lambda: 100.0 + now[0])
    pub.stats = RunStats(started_at=0.0, total=3)
    pub.add_episodes([("t1#0", "t1"), ("t2#0", "t2"), ("t3#0", "t3")])
    first = pub.message()
    assert first is not None and first.kind == "snapshot" and set(first.cells) == {"t1#0", "t2#0", "t3#0"}
    assert first.tasks["t2#0"] == "t2" and first.agg is not None
    now[0] = 0.1
    assert pub.message() is None  # nothing changed, no aggregate due
    st = EpisodeStatus("t2#0", "t2", state=State.RUNNING, op=Op.MODEL, step=2, url="http://a/", action="click")
    pub.on_status(st)
    msg = pub.message()
    assert msg is not None and msg.kind == "delta" and msg.cells == {"t2#0": ("R", "a", 2, None)}
    assert msg.details == {"t2#0": Details(url="http://a/", action="click")} and msg.agg is None
    st.op = Op.EXECUTE
    pub.on_status(st)
    now[0] = 0.6
    msg = pub.message()
    assert msg is not None and not msg.details and msg.agg is not None  # only the op changed
    assert msg.agg.ops == {"e": 1} and msg.agg.states == {"N": 2, "R": 1}
    # A status object the publisher had not seen (the engine's own) replaces the planned placeholder.
    other = EpisodeStatus("t9#0", "t9", state=State.WAITING)
    pub.on_status(other)
    msg = pub.message()
    assert msg is not None and msg.tasks == {"t9#0": "t9"} and msg.cells["t9#0"][0] == "W"
    now[0] = 2.7
    msg = pub.message()
    assert msg is not None and msg.kind == "snapshot" and len(msg.cells) == 4


def test_publisher_keeps_only_the_cells_of_long_finished_episodes() -> None:
    # A long run: a monitor attaching late still sees every cell, but the publisher holds whole statuses only for
    # the episodes in flight and the last KEEP_FINISHED finished ones (a status per episode is ~1 KiB kept forever).
    pub = TelemetryPublisher(None, None, clock=lambda: 0.0, wall=lambda: 0.0)
    n = KEEP_FINISHED + 100
    pub.add_episodes([(f"e{i}#0", f"e{i}") for i in range(n + 1)])
    ended = []
    for i in range(n):
        st = EpisodeStatus(f"e{i}#0", f"e{i}", state=State.RUNNING, op=Op.MODEL, step=3, url="http://a/")
        pub.on_status(st)
        st.state, st.op, st.reward = (State.FAILED, Op.NONE, None) if i % 5 == 0 else (State.FINISHED, Op.NONE, 1.0)
        pub.on_status(st)
        ended.append(st)
        pub.message("delta")  # each end is sent before it may be settled
    assert len(pub.statuses) == KEEP_FINISHED and f"e{n - 1}#0" in pub.statuses and "e0#0" not in pub.statuses
    # Settled episodes that ended the same way share one cell: a dictionary entry each, not a tuple each.
    assert pub.cell("e0#0") is pub.cell("e5#0") and pub.cell("e1#0") is pub.cell("e2#0") != pub.cell("e0#0")
    snap = pub.message("snapshot", full_details=True)
    assert snap is not None and len(snap.cells) == n + 1 and snap.agg is not None
    assert snap.cells["e0#0"] == ("X", "", 3, None) and snap.cells["e1#0"] == ("F", "", 3, 1.0)
    assert snap.cells[f"e{n}#0"] == ("N", "", 0, None)
    assert "e1#0" not in snap.details and snap.details[f"e{n - 1}#0"].url == "http://a/"
    assert snap.agg.states == {"X": n // 5 + 1, "F": n - n // 5 - 1, "N": 1} and snap.agg.total == n + 1
    # A late change (the judge's verdict) of a settled episode is sent, and its status is kept again.
    ended[1].reward = 0.0
    pub.on_status(ended[1])
    msg = pub.message("delta")
    assert msg is not None and msg.cells == {"e1#0": ("F", "", 3, 0.0)}
    assert len(pub.statuses) == KEEP_FINISHED and "e1#0" in pub.statuses
    # The same episode under a new status that is live again is never settled while it runs.
    again = EpisodeStatus(f"e{n - 1}#0", f"e{n - 1}", state=State.RUNNING, op=Op.MODEL)
    pub.on_status(again)
    for i in range(KEEP_FINISHED):
        pub.on_status(EpisodeStatus(f"x{i}#0", f"x{i}", state=State.FINISHED, reward=0.0))
    pub.message("delta")
    assert pub.statuses[f"e{n - 1}#0"] is again and pub.cell(f"e{n - 1}#0") == ("R", "a", 0, None)


async def test_publisher_without_monitor_remembers_no_changes(tmp_path: Path) -> None:
    pub = TelemetryPublisher(f"ipc://{tmp_path}/t.sock", tmp_path)
    pub.add_episodes([(f"e{i}#0", f"e{i}") for i in range(KEEP_FINISHED + 10)])
    for i in range(KEEP_FINISHED + 10):
        pub.on_status(EpisodeStatus(f"e{i}#0", f"e{i}", state=State.FINISHED, reward=1.0))
    pub.tick()
    assert not pub._dirty and not pub._unannounced and len(pub.statuses) == KEEP_FINISHED
    await pub.close()


def test_endpoints(tmp_path: Path) -> None:
    assert resolve_endpoint("ipc", tmp_path) == f"ipc://{tmp_path.resolve()}/telemetry.sock"
    assert resolve_endpoint("tcp://127.0.0.1:*", tmp_path) == "tcp://127.0.0.1:*"
    deep = tmp_path / ("d" * 120)
    assert ipc_endpoint(deep).startswith("ipc:///tmp/webgym-telemetry-")  # sun_path is short
    with pytest.raises(ValueError):
        resolve_endpoint("udp://x", tmp_path)
    # What the monitor finds in a run directory: only what an engine writes is an endpoint (before, "[]" was taken,
    # and the monitor stopped on a TypeError).
    for text in ('[]', '{"endpoint": 5, "pid": 1, "started_at": 0}', '{"endpoint": "ipc:///x"', ''):
        (tmp_path / ENDPOINT_FILE).write_text(text)
        assert read_endpoint(tmp_path) is None, text
    (tmp_path / ENDPOINT_FILE).write_text('{"endpoint": "ipc:///x", "pid": 7, "started_at": 1.5}')
    assert read_endpoint(tmp_path) == EndpointInfo("ipc:///x", 7, 1.5)


@pytest.mark.wallclock
async def test_publisher_without_subscriber_builds_nothing_and_never_blocks(tmp_path: Path) -> None:
    pub = TelemetryPublisher("tcp://127.0.0.1:*", tmp_path, hwm=2, insecure=True)
    info = json.loads((tmp_path / ENDPOINT_FILE).read_text())
    assert info["endpoint"].startswith("tcp://127.0.0.1:") and info["pid"] > 0
    pub.add_episodes([(f"e{i}#0", f"e{i}") for i in range(50)])
    for _ in range(20):
        pub.tick()
    assert pub.sent == 0 and not pub.subscribed
    # A subscriber that never reads: the engine side keeps going (HWM reached, messages dropped).
    ctx = zmq.Context()
    sub = ctx.socket(zmq.SUB)
    sub.setsockopt(zmq.RCVHWM, 1)
    sub.setsockopt(zmq.SUBSCRIBE, b"")
    sub.connect(info["endpoint"])
    deadline = time.monotonic() + 5
    while not pub.subscribed and time.monotonic() < deadline:
        pub.tick()
        await asyncio.sleep(0.02)
    assert pub.subscribed
    t0 = time.monotonic()
    statuses = [EpisodeStatus(f"e{i}#0", f"e{i}") for i in range(50)]
    for i in range(2000):
        st = statuses[i % 50]
        st.step = i
        pub.on_status(st)
        pub.tick()
    assert time.monotonic() - t0 < 5.0 and pub.sent > 0
    first = decode(sub.recv())
    assert first.kind == "snapshot" and len(first.cells) == 50
    sub.close(0)
    ctx.term()
    await pub.close()
    assert "ended_at" in json.loads((tmp_path / ENDPOINT_FILE).read_text())


# Each is dropped and counted, never applied: bytes that are not msgpack, msgpack that is not a map, a message of
# another format version, a cell of the wrong shape, a figure the statistics pane cannot draw (NaN, infinite, <0), a
# text longer than any the engine sends.
GOOD = TelemetryMessage(1, "delta", 1, 1.0, "r", cells={"a#0": ("R", "s", 1, None)})
BAD = [b"\xc1", msgpack.packb([1, 2]), encode(TelemetryMessage(2, "delta", 2, 1.0, "r")),
       msgpack.packb({"v": 1, "kind": "delta", "seq": 2, "t": 1.0, "run": "r", "cells": {"a#0": "zz"}}),
       msgpack.packb({"v": 1, "kind": "delta", "seq": 2, "t": 1.0, "run": "r", "agg": {"spark": [float("nan")]}}),
       msgpack.packb({"v": 1, "kind": "delta", "seq": 2, "t": 1.0, "run": "r", "agg": {"eta_s": float("inf")}}),
       msgpack.packb({"v": 1, "kind": "delta", "seq": 2, "t": 1.0, "run": "r",
                      "details": {"a#0": {"thought": "x" * 100_000}}}),  # the engine cuts a text to 800 characters
       msgpack.packb({"v": 1, "kind": "delta", "seq": 2, "t": 1.0, "run": "r", "agg": {"done": -1}})]


async def test_the_monitor_drops_bad_messages_and_goes_on(tmp_path: Path) -> None:
    """A monitor attached to a socket it does not control (``--connect``): before, the first message that was not
    telemetry stopped the app with a traceback. Its recording keeps only the messages it applied."""
    ctx = zmq.asyncio.Context()
    pub = ctx.socket(zmq.PUB)
    endpoint = f"ipc://{tmp_path}/t.sock"
    pub.bind(endpoint)
    feed = SocketFeed(endpoint=endpoint, poll_s=0.05, record=tmp_path / "feed.msgpack")
    app = MonitorApp(feed)
    try:
        async with app.run_test(size=SNAP_SIZE) as pilot:
            for _ in range(200):  # a PUB socket drops what it sends before the subscription has arrived
                await pub.send(encode(GOOD))
                await pilot.pause(0.02)
                if app.model.messages:
                    break
            for raw in BAD:
                await pub.send(raw)
            await pub.send(encode(TelemetryMessage(1, "delta", 2, 2.0, "r", cells={"a#0": ("F", "", 3, 1.0)})))
            for _ in range(200):
                await pilot.pause(0.02)
                if app.model.cells["a#0"].state == "F":
                    break
            app.refresh_view(force=True)
            await pilot.pause()
            assert app.is_running and app.model.cells["a#0"].step == 3 and app.model.gaps == 0
            assert feed.bad == len(BAD)
            assert f"dropped {len(BAD)} bad messages (last: Expected `int` >= 0" in app.status
    finally:
        pub.close(0)
        ctx.destroy(0)
    # What was applied, and only that: it plays back. (The feed closes its file as its cancelled worker ends.)
    path = tmp_path / "feed.msgpack"
    assert await until(lambda: len(read_messages(path)) == app.model.messages)
    assert read_messages(path)[-1].cells == {"a#0": ("F", "", 3, 1.0)}


def test_a_broken_recording_names_its_first_bad_message(tmp_path: Path) -> None:
    path = tmp_path / "feed.msgpack"
    path.write_bytes(encode(GOOD) + encode(GOOD) + BAD[3])
    with pytest.raises(ValueError, match=r"message 3: Expected `array`, got `str` - at `\$.cells\[...\]`"):
        read_messages(path)


# --- the app: Pilot tests on the recorded feed -----------------------------------------------------------
async def started(app: MonitorApp, pilot: Any, n: int) -> None:
    """Wait until the replay has applied ``n`` messages, then draw."""
    for _ in range(200):
        if app.model.messages >= n and app.status == "replay finished":
            break
        await pilot.pause(0.01)
    app.refresh_view(force=True)
    await pilot.pause()


async def test_pilot_select_shows_details(feed: list[TelemetryMessage]) -> None:
    app = MonitorApp(ReplayFeed(feed[:60]))
    async with app.run_test(size=SNAP_SIZE) as pilot:
        await started(app, pilot, 60)
        grid = app.query_one(CellGrid)
        assert len(grid.cells) == 40 and grid.columns == grid.scrollable_content_region.width // CELL_W
        await pilot.press("right")  # the first move selects the first cell
        await pilot.press("right", "right", "down")
        eid = grid.cells[2 + grid.columns].episode_id if grid.columns < 40 else grid.cells[2].episode_id
        assert grid.selected == eid
        cell = app.model.cells[eid]
        text = app.query_one(DetailPane).content.plain  # type: ignore[union-attr]
        d = cell.details
        for value in (eid, d["task"], d["url"], d["screenshot"]):
            assert value in text
        if "action" in d:
            assert d["action"] in text and d["thought"] in text and "policy" in text
        # A click selects the cell under the pointer.
        await pilot.click(CellGrid, offset=(CELL_W * 5 + 1, 0))
        assert grid.selected == grid.cells[5].episode_id
        assert grid.cells[5].episode_id in app.query_one(DetailPane).content.plain  # type: ignore[union-attr]


async def test_pilot_filter_search_pause_quit(feed: list[TelemetryMessage]) -> None:
    app = MonitorApp(ReplayFeed(feed[:60]))
    async with app.run_test(size=SNAP_SIZE) as pilot:
        await started(app, pilot, 60)
        grid = app.query_one(CellGrid)
        await pilot.press("f")
        assert app.model.state_filter == "N" and all(c.state == "N" for c in grid.cells)
        await pilot.press("f", "f")
        assert app.model.state_filter == "R" and grid.cells and all(c.state == "R" for c in grid.cells)
        assert "filter: running" in app.sub_title
        await pilot.press("escape")
        assert app.model.state_filter is None and len(grid.cells) == 40
        await pilot.press("slash", *"sim-0021", "enter")
        assert [c.task_id for c in grid.cells] == ["sim-0021"] and grid.selected == "sim-0021#0"
        assert "search: sim-0021" in app.sub_title
        await pilot.press("escape")
        assert len(grid.cells) == 40
        # Pause: new messages change the model, not the view, until resumed.
        await pilot.press("p")
        assert app.paused and "PAUSED" in app.sub_title
        before = [(c.episode_id, c.state, c.op) for c in grid.cells]
        for msg in feed[60:100]:
            app.model.apply(msg)
        app.refresh_view()
        await pilot.pause()
        assert [(c.episode_id, c.state, c.op) for c in grid.cells] == before
        await pilot.press("p")
        assert not app.paused and [(c.episode_id, c.state, c.op) for c in grid.cells] != before
        await pilot.press("q")
    assert app.return_code == 0


@pytest.mark.wallclock
async def test_grid_reflows_and_stays_cheap_at_1024_cells() -> None:
    msgs = simulated_feed(1024, 3.0, seed=1, op_s=0.1)
    app = MonitorApp(ReplayFeed(msgs))
    async with app.run_test(size=(100, 40)) as pilot:
        await started(app, pilot, len(msgs))
        grid = app.query_one(CellGrid)
        assert len(grid.cells) == 1024
        cols = grid.columns
        assert grid.virtual_size.height == -(-1024 // cols)
        t0 = time.perf_counter()
        for y in range(grid.size.height):
            grid.render_line(y)
        assert time.perf_counter() - t0 < 0.25  # one full grid frame: a few ms (generous bound for loaded CI)
        await pilot.press("end")  # more rows than fit: the grid scrolls to the selection
        assert grid.selected == grid.cells[-1].episode_id and grid.scroll_offset.y > 0
        await pilot.resize_terminal(200, 40)
        await pilot.pause()
        assert grid.columns > cols and grid.virtual_size.height == -(-1024 // grid.columns)


def test_sparkline() -> None:
    assert sparkline([]) == "" and sparkline([0, 1, 2, 4]) == "▁▃▅█" and len(sparkline(list(range(99)), 30)) == 30


# --- snapshot tests -------------------------------------------------------------------------------------------
def _snap_app(messages: list[TelemetryMessage]) -> tuple[MonitorApp, Any]:
    app = MonitorApp(ReplayFeed(messages))

    async def run_before(pilot: Any) -> None:
        await started(app, pilot, len(messages))
    return app, run_before


def test_snapshot_overview_with_selection(snap_compare: Any, feed: list[TelemetryMessage]) -> None:
    app, before = _snap_app(feed[:60])
    assert snap_compare(app, terminal_size=SNAP_SIZE, run_before=before, press=["right", "right", "down"])


def test_snapshot_filter_running(snap_compare: Any, feed: list[TelemetryMessage]) -> None:
    app, before = _snap_app(feed[:60])
    assert snap_compare(app, terminal_size=SNAP_SIZE, run_before=before, press=["f", "f", "f"])


def test_snapshot_end_of_run(snap_compare: Any, feed: list[TelemetryMessage]) -> None:
    app, before = _snap_app(feed)
    assert snap_compare(app, terminal_size=(100, 34), run_before=before)


# --- a real engine, watched over its real socket -------------------------------------------------------------
@pytest.mark.timeout(90)
async def test_real_engine_cells_change_over_the_socket(tmp_path: Path, sites: str, pool: BrowserPool) -> None:
    tasks = subset(tmp_path, per_site=2)
    n = len(tasks.read_text().splitlines())
    out = tmp_path / "runs"
    out.mkdir()
    model = MonitorModel()
    history: dict[str, list[str]] = {}

    def apply(msg: TelemetryMessage) -> None:
        model.apply(msg)
        for eid, cell in model.cells.items():
            h = history.setdefault(eid, [])
            if not h or h[-1] != cell.state:
                h.append(cell.state)

    # The monitor starts first (no run yet under the output directory): it waits, then attaches.
    feed = SocketFeed(output_dir=out, poll_s=0.1)
    statuses: list[str] = []
    watcher = asyncio.ensure_future(feed.run(apply, statuses.append))
    assert await until(lambda: bool(statuses))
    assert statuses[0].startswith("waiting for an engine")
    cfg = RunConfig(tasks=str(tasks), output_dir=str(out), concurrency=4, workers=1)
    stats, run_dir = await run(cfg, make_policy("scripted"), sites, pool=pool)
    assert await until(lambda: model.ended), "the monitor never saw the run's end"
    watcher.cancel()
    await asyncio.gather(watcher, return_exceptions=True)
    assert latest_run(out) == run_dir and json.loads((run_dir / ENDPOINT_FILE).read_text())["endpoint"]
    assert feed.received > 0 and feed.bad == 0 and model.ended and model.run == run_dir.name
    assert len(model.cells) == n and model.counts()["F"] == n == stats.summary()["succeeded"]
    for eid, h in history.items():
        assert h[0] in "NWR" and h[-1] == "F" and "R" in h, (eid, h)
    assert any(h[0] == "N" for h in history.values())
    cell = next(iter(model.cells.values()))
    assert cell.reward == 1.0 and cell.details.get("screenshot", "").startswith("frames/")
    assert model.agg.done == n and model.agg.steps == stats.steps
    assert {"action", "settle", "screenshot", "model"} <= set(model.agg.phases)


@pytest.mark.timeout(90)
async def test_detach_and_reattach_to_a_running_engine(tmp_path: Path, sites: str) -> None:
    tasks = subset(tmp_path, per_site=3, max_len=12)
    cfg = RunConfig(tasks=str(tasks), output_dir=str(tmp_path / "runs"), concurrency=2, workers=1,
                    telemetry="tcp://127.0.0.1:*", insecure=True)
    engine = asyncio.ensure_future(run(cfg, make_policy("scripted"), sites))
    ctx = zmq.asyncio.Context()
    try:
        run_dir: Path | None = None
        while run_dir is None or not (run_dir / ENDPOINT_FILE).exists():  # the core never writes cfg back
            await asyncio.sleep(0.05)
            run_dir = latest_run(tmp_path / "runs") if (tmp_path / "runs").exists() else None
        endpoint = json.loads((run_dir / ENDPOINT_FILE).read_text())["endpoint"]
        assert endpoint.startswith("tcp://127.0.0.1:")
        seen: list[set[str]] = []
        for _ in range(2):  # attach, detach, attach again: each time a full snapshot comes first
            sub = ctx.socket(zmq.SUB)
            sub.setsockopt(zmq.SUBSCRIBE, b"")
            sub.connect(endpoint)
            first = decode(await asyncio.wait_for(sub.recv(), 10))
            assert first.kind == "snapshot" and len(first.cells) == len(first.tasks)
            seen.append({c[0] for c in first.cells.values()})
            sub.close(0)
            await asyncio.sleep(0.5)
        assert not engine.done()
    finally:
        stats, _ = await engine
        ctx.destroy(0)
    assert stats.summary()["lost"] == 0


@pytest.mark.timeout(90)
async def test_run_with_tui_in_process(tmp_path: Path, sites: str) -> None:
    tasks = subset(tmp_path, per_site=1)
    run_dir = tmp_path / "runs" / "run-tui"
    run_dir.mkdir(parents=True)
    cfg = RunConfig(tasks=str(tasks), output_dir=str(tmp_path / "runs"), run_dir=str(run_dir), concurrency=4,
                    workers=1)
    stats, out = await run_with_tui(run(cfg, make_policy("scripted"), sites), run_dir, stay=False, headless=True)
    assert out == run_dir and stats.summary()["succeeded"] == len(tasks.read_text().splitlines())
