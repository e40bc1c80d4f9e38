"""``webgym-engine serve``: the Omniboxes API on a real engine core (Chromium workers, shared memory, aiohttp),
driven by a client written from the API's reference (tests/omnibox_client.py), over real HTTP."""

from __future__ import annotations

import asyncio
import io
import os
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio
from PIL import Image

from browserpool.pool import BrowserPool
from engine.core.config import RunConfig
from engine.core.core import EngineCore
from engine.episode.status import State
from engine.store.run_dir import read_records
from server.app import BrowserServer, ServerConfig
from tests.conftest import SharedPools, SmallDisk, until
from tests.omnibox_client import OmniboxClient, OmniboxError
from viewer.report import build_report

KEY = "test-key-4f1c"


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def served(tmp_path_factory: pytest.TempPathFactory, pools: SharedPools
                 ) -> AsyncIterator[tuple[EngineCore, BrowserServer]]:
    """One engine core with two browser workers behind a recording server (capacity 40, a fast expiry sweep)."""
    out = tmp_path_factory.mktemp("serve")
    cfg = RunConfig(concurrency=40, workers=2, output_dir=str(out), telemetry=None, episode_timeout_s=None)
    async with EngineCore(cfg, pool=await pools.for_run(cfg)) as core:
        server = BrowserServer(core, ServerConfig(port=0, capacity=40, record=True, expiry_check_s=0.1))
        await server.start()
        try:
            yield core, server
        finally:
            await server.close()


@pytest_asyncio.fixture(loop_scope="session")
async def client(served: tuple[EngineCore, BrowserServer]) -> AsyncIterator[OmniboxClient]:
    async with OmniboxClient(served[1].url) as c:
        yield c


def _image(body: bytes) -> Image.Image:
    img = Image.open(io.BytesIO(body))
    img.load()
    return img


async def _text(client: OmniboxClient, lease: dict[str, str]) -> str:
    return (await client.execute(lease, "get_webpage_text", {"n_lines": 50}))["text"]


async def test_an_episode_in_coordinates_mode(client: OmniboxClient, fixture_url: Callable[[str], str]) -> None:
    lease = await client.get(lifetime_mins=45)
    assert set(lease) == {"instance_id", "node"} and "/" not in lease["instance_id"]
    assert await client.metadata(lease) == {"width": 1280, "height": 768, "title": "", "url": "about:blank"}
    assert await client.execute(lease, "visit_page", {"url": fixture_url("click.html")}) == {"status": "success"}
    meta = await client.execute(lease, "get_page_metadata")
    assert meta["title"] == "click" and meta["url"] == fixture_url("click.html")
    body, ctype = await client.screenshot(lease, "coordinates")
    assert ctype.startswith("image/jpeg") and body[:2] == b"\xff\xd8"
    assert _image(body).size == (1280, 768)
    again, _ = await client.screenshot(lease, "coordinates")
    assert again == body  # an unchanged page gives the same bytes (AsyncWebRL compares consecutive steps)
    assert await client.execute(lease, "click_coords", {"x": 150, "y": 120}) == {"status": "success"}
    assert "clicked 1" in await _text(client, lease)
    clicked, _ = await client.screenshot(lease, "coordinates")
    assert clicked != body

    await client.execute(lease, "visit_page", {"url": fixture_url("form.html")})
    await client.execute(lease, "fill_coords", {"x": 100, "y": 18, "value": "hello", "press_enter": True,
                                                "delete_existing": True})
    meta = await client.execute(lease, "get_page_metadata")
    assert meta["title"] == "echo" and meta["url"].endswith("/_test/echo?q=hello")  # typed over, then submitted
    assert await client.execute(lease, "back") == {"status": "success"}
    assert (await client.execute(lease, "get_page_metadata"))["url"] == fixture_url("form.html")
    await client.execute(lease, "fill_coords", {"x": 100, "y": 18, "value": "more", "press_enter": False})
    assert (await client.execute(lease, "get_page_metadata"))["url"] == fixture_url("form.html")  # no Enter

    await client.execute(lease, "visit_page", {"url": fixture_url("scroll.html")})
    top, _ = await client.screenshot(lease, "coordinates")
    await client.execute(lease, "page_down", {"full_page": True})
    assert (await client.screenshot(lease, "coordinates"))[0] != top
    await client.execute(lease, "page_up", {"full_page": True})
    assert (await client.screenshot(lease, "coordinates"))[0] == top

    await client.execute(lease, "visit_page", {"url": fixture_url("keys.html")})
    assert await client.execute(lease, "keypress", {"keys": ["shift", "a"]}) == {"status": "success"}
    assert await client.execute(lease, "tab_and_enter") == {"status": "success"}
    t0 = time.monotonic()
    assert await client.execute(lease, "sleep", {"duration": 0.3}) == {"status": "success"}
    assert time.monotonic() - t0 >= 0.3
    assert await client.probe(lease) == {"status": "success", "message": "Probe successful"}
    assert await client.reset(lease) == {"status": "success"}
    # A second reset of the same lease: the text WebGym reads as "already released".
    with pytest.raises(OmniboxError) as err:
        await client.reset(lease)
    assert err.value.status == 400 and "Invalid instance UUID" in err.value.body["detail"]


async def test_set_of_marks_ids_are_the_same_in_screenshots_rects_and_clicks(
        client: OmniboxClient, fixture_url: Callable[[str], str]) -> None:
    lease = await client.get()
    assert await client.execute(lease, "get_screenshot_info") == {"error": "No screenshot info available"}
    await client.execute(lease, "visit_page", {"url": fixture_url("click.html")})
    plain, _ = await client.screenshot(lease, "coordinates")
    marked, ctype = await client.screenshot(lease, "set_of_marks")
    assert ctype.startswith("image/jpeg") and marked != plain and _image(marked).size == (1280, 768)
    info = await client.execute(lease, "get_screenshot_info")
    assert info["visible_rects"] == ["1"] and info["id_mapping"] == {"1": "1"}
    region = info["interactive_regions"]["1"]
    assert region["tag_name"] == "button" and region["aria_name"] == "Click me"
    assert region["rects"] == [{"x": 100, "y": 100, "width": 200, "height": 60, "top": 100, "right": 300,
                                "bottom": 160, "left": 100}]
    rects = await client.execute(lease, "get_interactive_rects")
    assert rects == info["interactive_regions"]
    await client.execute(lease, "click_id", {"id": "1"})
    await client.execute(lease, "click_id", {"id": 1})  # a number works too
    assert "clicked 2" in await _text(client, lease)
    with pytest.raises(OmniboxError) as err:
        await client.execute(lease, "click_id", {"id": "7"})
    assert err.value.status == 400 and "No element '7'" in err.value.body["detail"]

    await client.execute(lease, "visit_page", {"url": fixture_url("form.html")})
    await client.screenshot(lease, "set_of_marks")
    info = await client.execute(lease, "get_screenshot_info")
    names = {i: r["tag_name"] for i, r in info["interactive_regions"].items()}
    assert sorted(names.values()) == ["input", "input"]
    first = min(names, key=int)
    await client.execute(lease, "hover_id", {"id": first})
    await client.execute(lease, "fill_id", {"id": first, "value": "marks", "delete_existing": True})
    assert (await client.execute(lease, "get_page_metadata"))["url"].endswith("/_test/echo?q=marks")
    png, ctype = await client.screenshot(lease, "set_of_marks", format="png")
    assert ctype.startswith("image/png") and png[:8] == b"\x89PNG\r\n\x1a\n" and _image(png).size == (1280, 768)
    await client.reset(lease)


async def test_the_accessibility_tree_and_actions_on_its_ids(served: tuple[EngineCore, BrowserServer],
                                                               client: OmniboxClient,
                                                               fixture_url: Callable[[str], str]) -> None:
    lease = await client.get()
    await client.execute(lease, "visit_page", {"url": fixture_url("form.html")})
    tree = await client.execute(lease, "get_accessibility_tree")
    assert tree["cut"] is False and tree["axtree"].startswith("[") and "textbox" in tree["axtree"]
    field = next(n for n in tree["nodes"] if n[2] == "textbox" and n[4] == "old text")
    assert f"[{field[0]}] textbox ''" in tree["axtree"]
    # The DOM snapshot: the same element under the same id, with its box.
    dom = await client.execute(lease, "get_dom_snapshot")
    assert dom["cut"] is False and dom["columns"][:3] == ["id", "parent", "tag"]
    box = next(row for row in dom["dom"] if row[0] == field[0])
    assert box[2] == "input" and box[5] > 0 and box[6] > 0 and box[7] == 1 and box[8] is True
    await client.execute(lease, "fill_node", {"id": field[0], "value": "tree"})
    await client.execute(lease, "press_node", {"id": field[0], "keys": ["Enter"]})
    assert (await client.execute(lease, "get_page_metadata"))["url"].endswith("/_test/echo?q=tree")
    await client.execute(lease, "visit_page", {"url": fixture_url("select.html")})
    nodes = (await client.execute(lease, "get_accessibility_tree"))["nodes"]
    fruit = next(n for n in nodes if n[2] == "combobox")
    await client.execute(lease, "select_node", {"id": fruit[0], "value": "Cherry"})
    assert "picked cherry" in await _text(client, lease)
    with pytest.raises(OmniboxError) as err:
        await client.execute(lease, "click_node", {"id": 999999})
    assert err.value.status == 400 and "element 999999" in err.value.body["message"]
    await client.reset(lease)
    # The lease's record: each step keeps the tree and the snapshot its client read before it, and only those.
    record = next(r for r in read_records(served[0].run_dir)  # type: ignore[arg-type]
                  if lease["instance_id"] in r["task"]["task_name"])
    names = [s["action"]["name"] for s in record["steps"]]
    assert names == ["visit_page", "fill_node", "press_node", "visit_page", "select_node", "click_node"]
    filled, pressed, selected = record["steps"][1], record["steps"][2], record["steps"][4]
    assert filled["axtree"] == tree["axtree"] and filled["dom"] == dom["dom"]
    assert "axtree" not in pressed and "dom" not in pressed
    assert "combobox" in selected["axtree"] and "dom" not in selected


async def test_select_scroll_and_text_commands(client: OmniboxClient, fixture_url: Callable[[str], str]) -> None:
    lease = await client.get()
    await client.execute(lease, "visit_page", {"url": fixture_url("select.html")})
    rects = await client.execute(lease, "get_interactive_rects")
    select_id = next(i for i, r in rects.items() if r["tag_name"] == "select")
    assert await client.execute(lease, "select_option", {"id": select_id, "value": "Cherry"}) == {"status": "success"}
    assert "picked cherry" in await _text(client, lease)
    await client.execute(lease, "visit_page", {"url": fixture_url("scroll.html")})
    before, _ = await client.screenshot(lease, "coordinates")
    await client.execute(lease, "hover_and_scroll_coords", {"x": 100, "y": 100, "direction": "down"})
    assert (await client.screenshot(lease, "coordinates"))[0] != before
    assert (await client.execute(lease, "get_webpage_text", {"n_lines": 1}))["text"] == "inner content"
    await client.reset(lease)


async def test_32_concurrent_clients_run_their_episodes(served: tuple[EngineCore, BrowserServer],
                                                        fixture_url: Callable[[str], str]) -> None:
    url = served[1].url

    async def episode(i: int) -> int:
        async with OmniboxClient(url) as c:
            lease = await c.get()
            await c.execute(lease, "visit_page", {"url": fixture_url("click.html")})
            for _ in range(2):
                await c.execute(lease, "click_coords", {"x": 150, "y": 120})
                body, _ = await c.screenshot(lease, "coordinates")
                assert body[:2] == b"\xff\xd8"
            text = (await c.execute(lease, "get_webpage_text"))["text"]
            await c.reset(lease)
            return int(text.split("clicked ")[1].split()[0])

    clicks = await asyncio.wait_for(asyncio.gather(*(episode(i) for i in range(32))), 180)
    assert clicks == [2] * 32  # each lease its own page: no click landed in another's
    async with OmniboxClient(url) as c:
        info = await c.info()
    assert info["in_use"] == [] and info["available"] == 40 == sum(n["capacity"] for n in info["nodes"])


async def test_bad_input_gets_a_clear_4xx_and_harms_no_other_lease(
        served: tuple[EngineCore, BrowserServer], client: OmniboxClient, fixture_url: Callable[[str], str]) -> None:
    good = await client.get()
    await client.execute(good, "visit_page", {"url": fixture_url("click.html")})
    lease = await client.get()
    cases: list[tuple[str, str, dict[str, Any], int, str]] = [
        ("POST", "/execute", {"json": {**lease, "instance_id": "nope:1", "back": {}}}, 400, "Invalid instance UUID"),
        ("POST", "/execute", {"json": {**lease, "node": "w999", "back": {}}}, 400, "Node w999 is not found"),
        ("POST", "/execute", {"json": {**lease, "fly": {}}}, 400, "Unsupported command: fly"),
        ("POST", "/execute", {"json": {**lease, "back": {}, "sleep": {}}}, 400, "Exactly one command"),
        ("POST", "/execute", {"json": {**lease}}, 400, "Exactly one command"),
        ("POST", "/execute", {"json": {**lease, "click_coords": {"x": 1}}}, 400, "missing required field `y`"),
        ("POST", "/execute", {"json": {**lease, "click_coords": {"x": "a", "y": 1}}}, 400, "Expected `float`"),
        ("POST", "/execute", {"json": {**lease, "back": {"extra": 1}}}, 400, "unknown field `extra`"),
        ("POST", "/execute", {"json": {**lease, "visit_page": {"url": "example.com"}}}, 400, "relative"),
        ("POST", "/execute", {"json": {**lease, "keypress": {"keys": ["NoSuchKey"]}}}, 400, "unknown key"),
        ("POST", "/execute", {"json": {**lease, "sleep": {"duration": 1e9}}}, 400, "duration"),
        # Before: a 500 (an int msgpack cannot carry: OverflowError), and a click at NaN that the browser refused.
        ("POST", "/execute", {"json": {**lease, "page_down": {"amount": 10**30}}}, 400, "Invalid arguments"),
        ("POST", "/execute", {"json": {**lease, "click_coords": {"x": float("nan"), "y": 1}}}, 400, "finite"),
        ("POST", "/execute", {"json": {**lease, "scroll_id": {"id": "1", "direction": "left"}}}, 400, "direction"),
        ("POST", "/execute", {"json": {"back": {}}}, 422, "instance_id, node"),
        ("POST", "/execute", {"json": [1, 2]}, 400, "JSON object"),
        ("POST", "/execute", {"data": b"\xff{not json"}, 400, "not JSON"),
        # Before, these two were 500s: RecursionError and ValueError (a number of more than 4,300 digits).
        ("POST", "/execute", {"data": b"[" * 100_000 + b"]" * 100_000}, 400, "not JSON"),
        ("POST", "/execute", {"data": b'{"back": ' + b"9" * 5000 + b"}"}, 400, "not JSON"),
        ("POST", "/execute", {"data": b"x" * (2 << 20)}, 413, "Maximum request body size"),
        ("GET", "/screenshot", {"params": {"node": lease["node"]}}, 422, "instance_id"),
        ("GET", "/screenshot", {"params": {**lease, "format": "gif"}}, 400, "format must be jpeg or png"),
        ("GET", "/metadata", {"params": {**lease, "node": "elsewhere"}}, 400, "Node elsewhere is not found"),
        ("POST", "/get", {"params": {"lifetime_mins": "soon"}}, 422, "must be an integer"),
        ("POST", "/get", {"params": {"lifetime_mins": 120}}, 503, "No available nodes with capacity"),
        ("GET", "/nowhere", {}, 404, "Not Found"),
        ("DELETE", "/get", {}, 405, "Method Not Allowed"),
    ]
    for method, path, kw, status, text in cases:
        got, body, ctype = await client.request(method, path, **kw)
        assert (got, ctype.split(";")[0]) == (status, "application/json"), (path, kw, got, body)
        assert text in str(body.get("detail") or body.get("message")), (path, kw, body)
    # Nothing else was touched: both leases still work.
    assert await client.execute(good, "click_coords", {"x": 150, "y": 120}) == {"status": "success"}
    assert "clicked 1" in await _text(client, good)
    assert (await client.screenshot(lease, "coordinates"))[0][:2] == b"\xff\xd8"
    await client.reset(good)
    await client.reset(lease)


async def test_requests_a_web_page_could_send_are_refused(served: tuple[EngineCore, BrowserServer],
                                                          client: OmniboxClient) -> None:
    # Before, any site open in a browser on this machine could take every lease with no-cors POSTs to loopback, and
    # one that pointed its own name at 127.0.0.1 could drive the browsers and read their screenshots.
    table = served[1].leases
    before = len(table.leases)
    for headers in ({"Origin": "http://evil.example", "Sec-Fetch-Site": "cross-site"},
                    {"Sec-Fetch-Site": "same-site"}, {"Origin": "null"},
                    {"Host": "evil.example:7000", "Sec-Fetch-Site": "same-origin"}):
        got, body, _ = await client.request("POST", "/get", params={"lifetime_mins": 5}, headers=headers)
        assert got == 403 and ("web pages" in body["detail"] or "loopback" in body["detail"]), (headers, body)
    assert len(table.leases) == before
    # Programs, and a browser's own navigation to the server (Sec-Fetch-Site: none), are served as before.
    for headers in ({}, {"Host": "localhost:7000"}, {"Sec-Fetch-Site": "none"}):
        got, body, _ = await client.request("GET", "/info", headers=headers)
        assert got == 200, (headers, body)


async def test_a_full_server_answers_503_and_an_unused_lease_expires(
        served: tuple[EngineCore, BrowserServer], client: OmniboxClient) -> None:
    table = served[1].leases
    held = [await client.get() for _ in range(table.capacity - len(table.leases))]
    with pytest.raises(OmniboxError) as err:
        await client.get()
    assert err.value.status == 503 and "capacity" in str(err.value)  # WebGym's retry keywords match
    for lease in held:
        await client.reset(lease)
    short = await client.get(lifetime_mins=0)  # expires at the next sweep once unused
    deadline = time.monotonic() + 10
    while short["instance_id"] in (await client.info())["in_use"] and time.monotonic() < deadline:
        await asyncio.sleep(0.1)
    got, body, _ = await client.request("POST", "/execute", json={**short, "back": {}})
    assert got == 410 and "expired" in body["detail"]
    got, body, _ = await client.request("POST", "/reset", params=short)
    assert got == 400 and "Invalid instance UUID" in body["detail"]


async def test_leases_are_recorded_and_shown_as_cells(served: tuple[EngineCore, BrowserServer],
                                                      client: OmniboxClient, fixture_url: Callable[[str], str]) -> None:
    core = served[0]
    seen: list[tuple[str, State]] = []
    core.on_status(lambda st: seen.append((st.task, st.state)))
    lease = await client.get()
    await client.execute(lease, "visit_page", {"url": fixture_url("click.html")})
    await client.screenshot(lease, "coordinates")
    await client.execute(lease, "click_coords", {"x": 150, "y": 120})
    await client.execute(lease, "get_page_metadata")  # not a step
    await client.reset(lease)
    cell = [state for task, state in seen if lease["instance_id"] in task]
    assert cell[0] is State.WAITING and State.RUNNING in cell and cell[-1] is State.FINISHED
    record = next(r for r in read_records(core.run_dir)  # type: ignore[arg-type]
                  if lease["instance_id"] in r["task"]["task_name"])
    assert record["policy"] == "http-client" and record["status"] == "unrewarded"  # its client rewards it
    assert record["task"]["website"] == fixture_url("click.html")
    assert [s["action"]["name"] for s in record["steps"]] == ["visit_page", "click_coords"]
    assert record["timings_ms"]["get_page_metadata_n"] == 1 and record["timings_ms"]["get_page_metadata_ms"] > 0
    click = record["steps"][1]
    assert click["action"]["x"] == 150 and click["point"] == [150.0, 120.0] and click["timings_ms"]["step_ms"] > 0
    assert (Path(core.run_dir) / click["screenshot"]).read_bytes()[:2] == b"\xff\xd8"  # type: ignore[arg-type]
    # The viewer reads server traffic as it reads a run: the lease's episode page lists its commands.
    index = build_report(core.run_dir)  # type: ignore[arg-type]
    pages = [p.read_text() for p in (index.parent / "data").glob("ep-*.js")]
    assert any(lease["instance_id"] in page and "click_coords" in page for page in pages)


async def test_the_api_key_is_checked_when_the_server_has_one(served: tuple[EngineCore, BrowserServer]) -> None:
    server = BrowserServer(served[0], ServerConfig(port=0, api_key=KEY, capacity=2))
    url = await server.start()
    try:
        async with OmniboxClient(url) as anonymous, OmniboxClient(url, api_key="wrong") as wrong, \
                OmniboxClient(url, api_key=KEY) as right:
            assert (await anonymous.request("GET", "/info"))[:2] == (401, {"detail": "API Key is missing"})
            assert (await wrong.request("POST", "/get"))[:2] == (401, {"detail": "Invalid API Key."})
            lease = await right.get()
            assert (await wrong.request("GET", "/metadata", params=lease))[0] == 401
            await right.reset(lease)
    finally:
        await server.close()


async def test_a_browser_worker_killed_mid_lease_gives_a_clear_error_and_the_next_get_works(
        served: tuple[EngineCore, BrowserServer], client: OmniboxClient, fixture_url: Callable[[str], str]) -> None:
    core = served[0]
    lease = await client.get()
    await client.execute(lease, "visit_page", {"url": fixture_url("click.html")})
    proc = core.pool.workers[lease["node"]].proc
    assert proc is not None
    proc.kill()
    await proc.wait()
    got, body, _ = await client.request("POST", "/execute", json={**lease, "click_coords": {"x": 1, "y": 1}})
    assert got == 410 and "was lost" in body["detail"] and "/get" in body["detail"]
    fresh = await client.get()
    await client.execute(fresh, "visit_page", {"url": fixture_url("click.html")})
    assert (await client.screenshot(fresh, "coordinates"))[0][:2] == b"\xff\xd8"
    await client.reset(fresh)
    assert lease["instance_id"] not in (await client.info())["in_use"]
    lost = next(r for r in read_records(core.run_dir) if lease["instance_id"] in r["task"]["task_name"])  # type: ignore[arg-type]
    assert lost["status"] == "error" and lost["error"]["kind"] == "worker_lost"


def test_serve_refuses_an_unset_key_variable_and_warns_on_a_public_address_without_a_key(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k != "NO_SUCH_KEY_VAR"}
    cmd = [sys.executable, "-m", "cli", "serve", "--port", "0", "--workers", "1", "--telemetry", "off",
           "--output", str(tmp_path)]
    res = subprocess.run([*cmd, "--api-key-env", "NO_SUCH_KEY_VAR"], capture_output=True, text=True, env=env,
                         timeout=60, stdin=subprocess.DEVNULL)
    assert res.returncode != 0 and "NO_SUCH_KEY_VAR: the variable is not set" in res.stderr
    env.pop("CPU_CLUSTER_TOKEN", None)
    proc = subprocess.Popen([*cmd, "--host", "0.0.0.0"], stderr=subprocess.PIPE, stdout=subprocess.DEVNULL,
                            stdin=subprocess.DEVNULL, text=True, env=env)
    try:
        assert proc.stderr is not None
        lines = [proc.stderr.readline() for _ in range(2)]
        assert "WARNING: serving on 0.0.0.0 without an API key" in lines[0]
    finally:
        proc.terminate()
        proc.wait(30)


def test_the_benchmark_summary_compares_the_sides_and_the_original() -> None:
    import argparse

    from bench.omnibox import summarize

    def window(side: str, n: int, rate: float, mib: float) -> dict[str, Any]:
        return {"side": side, "clients": n, "steps_per_s": rate, "pss_mib_per_slot": mib,
                "latency_ms": {"click_coords": {"p50": 1.0, "p95": 2.0, "n": 3}}}

    windows = [window("http", 8, 30.0, 70.0), window("engine", 8, 31.0, 71.0), window("engine", 8, 33.0, 70.0),
               window("http", 8, 34.0, 80.0)]
    args = argparse.Namespace(clients=[8], workers=2, window=20.0, repeats=2, pages="plain", steps=10)
    r = summarize(args, windows)["results"]["8"]
    assert (r["http_steps_per_s"], r["engine_steps_per_s"], r["http_over_engine"]) == (32.0, 32.0, 1.0)
    # Against the original's own figures at 8 instances (bench/peers/omniboxes.json): one run, 3.92 steps/s.
    assert r["original_steps_per_s"] == [3.92, 3.92] and r["x_original"] == [8.2, 8.2]  # 32 / 3.92
    assert r["original_mib_per_instance"] == round(286 + 3700 / 8)
    assert r["memory_fraction_of_original"] == round(75 / (286 + 3700 / 8), 3)


async def test_a_client_that_sends_its_request_slowly_holds_no_connection(served: tuple[EngineCore,
                                                                                         BrowserServer]) -> None:
    # Before, a connection that sent half a request head, or a head and part of its body, was held for an hour (the
    # aiohttp default); anyone who could reach the port could hold sockets and handlers without end.
    server = BrowserServer(served[0], ServerConfig(port=0, capacity=2, head_deadline_s=1.0, body_deadline_s=1.0))
    url = await server.start()
    host, port = url.removeprefix("http://").split(":")
    try:
        reader, writer = await asyncio.open_connection(host, int(port))
        writer.write(b"POST /execute HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: applic")
        t0 = time.monotonic()
        assert await asyncio.wait_for(reader.read(), 10) == b""  # closed, with nothing said
        assert time.monotonic() - t0 < 5
        writer.close()

        reader, writer = await asyncio.open_connection(host, int(port))
        writer.write(b"POST /execute HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 100\r\n\r\n{\"instance_id\"")
        t0 = time.monotonic()
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
        assert head.startswith(b"HTTP/1.1 408") and b"Connection: close" in head and time.monotonic() - t0 < 5
        length = int(head.split(b"Content-Length: ")[1].split(b"\r\n")[0])
        assert b"did not arrive within 1 s" in await reader.readexactly(length)
        writer.close()

        # A client that sends its request whole is served as before, on the same server.
        async with OmniboxClient(url) as c:
            assert (await c.info())["available"] == 2
    finally:
        await server.close()


async def test_a_full_disk_ends_recording_and_the_leases_are_still_served(
        tmp_path: Path, small_disk: SmallDisk, fixture_url: Callable[[str], str], pool: BrowserPool) -> None:
    # Before, a screenshot that could not be stored for the record answered the client with a 500.
    small_disk.resize("128k")
    cfg = RunConfig(concurrency=2, workers=1, output_dir=str(small_disk.path / "runs"), telemetry=None)
    async with EngineCore(cfg, pool=pool) as core:
        server = BrowserServer(core, ServerConfig(port=0, capacity=2, record=True))
        try:
            async with OmniboxClient(await server.start()) as client:
                lease = await client.get()
                await client.execute(lease, "visit_page", {"url": fixture_url("click.html")})
                for _ in range(40):  # more than 128 KiB of screenshots
                    image, _ = await client.screenshot(lease, "coordinates")
                    assert image[:2] == b"\xff\xd8"
                assert core.store.failure is not None and "No space left" in str(core.store.failure)
                assert await client.execute(lease, "click_coords", {"x": 150, "y": 120}) == {"status": "success"}
                await client.reset(lease)
                second = await client.get()  # a new lease, not recorded
                assert (await client.screenshot(second, "coordinates"))[0][:2] == b"\xff\xd8"
                await client.reset(second)
        finally:
            await server.close()


def open_connections(server: BrowserServer) -> int:
    """The connections aiohttp holds open for ``server`` now."""
    assert server._runner is not None and server._runner.server is not None
    return len(server._runner.server.connections)


async def test_connections_past_the_cap_get_a_503_and_are_closed(served: tuple[EngineCore, BrowserServer]) -> None:
    # Before, every connection was kept: anyone who could reach the port could open connections until the engine
    # process ran out of file descriptors, and then it could write no screenshot, record or socket.
    server = BrowserServer(served[0], ServerConfig(port=0, capacity=2, max_connections=8))
    url = await server.start()
    host, port = url.removeprefix("http://").split(":")
    held: list[asyncio.StreamWriter] = []
    try:
        for _ in range(8):  # silent connections, up to the cap
            held.append((await asyncio.open_connection(host, int(port)))[1])
        assert await until(lambda: open_connections(server) == 8)
        reader, writer = await asyncio.open_connection(host, int(port))
        answer = await asyncio.wait_for(reader.read(), 10)  # the whole answer, then the server closes
        assert answer.startswith(b"HTTP/1.1 503") and b"too many connections" in answer
        writer.close()
        for w in held[:2]:  # room again once connections close
            w.close()
            await w.wait_closed()
        assert await until(lambda: open_connections(server) == 6)
        async with OmniboxClient(url) as c:
            assert (await c.info())["available"] == 2
    finally:
        for w in held:
            w.close()
        await server.close()
