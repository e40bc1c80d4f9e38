"""``webgym-engine openenv``'s server (server/openenv/): OpenEnv's session channel and routes on the engine's core,
over real sockets, with real Chromium behind every session.

The clients here speak OpenEnv's wire format with aiohttp's WebSocket client, frame by frame, so that every error
path can be driven; tests/frameworks/test_openenv.py runs the ``openenv`` package's own client against the same
server.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from browserpool.pool import BrowserPool
from engine.core.config import RunConfig
from engine.core.core import EngineCore
from engine.store.run_dir import read_records
from engine.tasks.loading import load_tasks
from engine.tasks.schema import BUNDLED_TASKS
from server.openenv.app import ENV_NAME, OpenEnvServer
from server.openenv.config import OpenEnvConfig

Frame = dict[str, Any]
MAX_MESSAGE = 100 << 20  # OpenEnv's client takes messages of up to 100 MiB (BrowserGym's screenshots run to 14 MB)


class Served:
    """A started server and where its records go."""

    def __init__(self, server: OpenEnvServer, core: EngineCore) -> None:
        self.server, self.core = server, core
        self.ws_url = server.url.replace("http", "ws", 1) + "/ws"

    def records(self) -> list[dict[str, Any]]:
        assert self.core.run_dir is not None
        return read_records(self.core.run_dir)


@contextlib.asynccontextmanager
async def serving(tmp_path: Path, site_server: str, pool: BrowserPool, **settings: Any) -> AsyncIterator[Served]:
    cfg = RunConfig(output_dir=str(tmp_path / "runs"), concurrency=8, workers=1, telemetry=None,
                    episode_timeout_s=None, policy_step_timeout_s=None)
    async with EngineCore(cfg, pool=pool) as core:
        server = OpenEnvServer(core, load_tasks(BUNDLED_TASKS, site_server), OpenEnvConfig(port=0, **settings))
        await server.start()
        try:
            yield Served(server, core)
        finally:
            await server.close()


async def ask(ws: aiohttp.ClientWebSocketResponse, message: Any) -> Frame:
    """Send one frame (a dict as JSON, a str as it is) and read the reply."""
    await ws.send_str(message if isinstance(message, str) else json.dumps(message))
    reply = await asyncio.wait_for(ws.receive(), 60)
    while reply.type in (aiohttp.WSMsgType.PING, aiohttp.WSMsgType.PONG):  # a client that answers no ping sees them
        reply = await asyncio.wait_for(ws.receive(), 60)
    assert reply.type is aiohttp.WSMsgType.TEXT, reply
    frame: Frame = json.loads(reply.data)
    return frame


async def test_a_browsergym_client_solves_a_task_and_its_episode_is_recorded(tmp_path: Path, site_server: str,
                                                                              pool: BrowserPool) -> None:
    async with serving(tmp_path, site_server, pool) as served, aiohttp.ClientSession() as http, \
            http.ws_connect(served.ws_url, max_msg_size=MAX_MESSAGE) as ws:
        first = await ask(ws, {"type": "reset", "data": {"task_name": "shop-001", "seed": 3}})
        assert first["type"] == "observation", first
        data = first["data"]
        assert (data["reward"], data["done"]) == (0.0, False)
        obs = data["observation"]
        # BrowserGym's fields, its screenshot as rows of [r, g, b] integers of the viewport.
        assert list(obs) == ["metadata", "text", "url", "screenshot", "goal", "axtree_txt", "pruned_html", "error",
                             "last_action_error"]
        assert len(obs["screenshot"][0][0]) == 3 and len(obs["screenshot"]) < len(obs["screenshot"][0])
        assert all(0 <= c <= 255 for c in obs["screenshot"][0][0])
        assert obs["url"].endswith("/shop/") and "promo code" in obs["goal"]
        assert obs["axtree_txt"] == obs["text"] and "[" in obs["axtree_txt"]
        assert obs["metadata"]["task_id"] == "shop-001"
        state = await ask(ws, {"type": "state"})
        assert state["type"] == "state" and state["data"]["step_count"] == 0
        assert state["data"]["task_id"] == "shop-001" and state["data"]["goal"] == obs["goal"]
        noop = await ask(ws, {"type": "step", "data": {"action_str": "noop()", "metadata": {}}})
        assert noop["data"]["done"] is False and noop["data"]["observation"]["last_action_error"] is False
        unreadable = await ask(ws, {"type": "step", "data": {"action_str": "click('99999')"}})
        assert unreadable["data"]["observation"]["last_action_error"] is True
        assert "99999" in unreadable["data"]["observation"]["error"]
        done = await ask(ws, {"type": "step", "data": {"action_str": "send_msg_to_user('SPRING10')"}})
        assert (done["data"]["reward"], done["data"]["done"]) == (1.0, True), done["data"]["observation"]["error"]
        state = await ask(ws, {"type": "state"})
        assert state["data"]["step_count"] == 3 and state["data"]["cum_reward"] == 1.0
        await ws.send_str(json.dumps({"type": "close"}))
        assert (await ws.receive()).type in (aiohttp.WSMsgType.CLOSE, aiohttp.WSMsgType.CLOSED)
    (record,) = served.records()
    assert record["status"] == "success" and record["task"]["task_id"] == "shop-001" and len(record["steps"]) == 3


async def test_the_engine_vocabulary_reads_model_replies_and_sends_jpeg(tmp_path: Path, site_server: str,
                                                                         pool: BrowserPool) -> None:
    async with serving(tmp_path, site_server, pool, vocabulary="browsergym") as served, \
            aiohttp.ClientSession() as http, http.ws_connect(served.ws_url, max_msg_size=MAX_MESSAGE) as ws:
        first = await ask(ws, {"type": "reset", "data": {"vocabulary": "engine", "task_id": "shop-002"}})
        obs = first["data"]["observation"]
        assert base64.b64decode(obs["screenshot_jpeg"])[:2] == b"\xff\xd8"
        assert obs["width"] > obs["height"] > 0 and obs["axtree"] and obs["url"].endswith("/shop/")
        reply = ('Action: look\n<tool_call>\n{"name": "computer_use", "arguments": {"action": "scroll", '
                 '"direction": "down"}}\n</tool_call>')
        scrolled = await ask(ws, {"type": "step", "data": {"reply": reply}})
        assert scrolled["data"]["observation"]["outcome"] == {
            "action": {"name": "scroll", "direction": "down"}, "parse_error": None, "status": None, "error": None}
        garbled = await ask(ws, {"type": "step", "data": {"reply": "I would scroll, I think"}})
        assert garbled["data"]["observation"]["outcome"]["parse_error"] == "no <tool_call> in reply"
        both = await ask(ws, {"type": "step", "data": {"reply": reply, "action": {"name": "wait"}}})
        assert both["data"]["code"] == "VALIDATION_ERROR"
        answered = await ask(ws, {"type": "step", "data": {"action": {"name": "answer", "text": "WELCOME5"}}})
        assert (answered["data"]["reward"], answered["data"]["done"]) == (1.0, True)
        assert answered["data"]["observation"]["outcome"]["status"] == "success"
        # A second episode on the same session: the next task in turn, the server's vocabulary again.
        again = await ask(ws, {"type": "reset"})
        assert "screenshot" in again["data"]["observation"] and again["type"] == "observation"
    records = served.records()
    assert sorted(r["status"] for r in records) == ["error", "success"]
    gone = next(r for r in records if r["status"] == "error")
    assert gone["error"]["kind"] == "client_gone"  # the second episode: the client went away with it open


async def test_hostile_frames_get_openenv_error_codes_and_the_session_goes_on(tmp_path: Path, site_server: str,
                                                                             pool: BrowserPool) -> None:
    async with serving(tmp_path, site_server, pool, max_message_bytes=4096) as served, \
            aiohttp.ClientSession() as http, http.ws_connect(served.ws_url, max_msg_size=MAX_MESSAGE) as ws:
        codes = {}
        frames: list[tuple[str, Any]] = [
            ("not json", "{not json"), ("not an object", "[1, 2]"), ("unknown type", {"type": "ping"}),
            ("no type", {"data": {}}), ("extra key", {"type": "state", "id": 1}),
            ("step before reset", {"type": "step", "data": {"action_str": "noop()"}}),
            ("step without data", {"type": "step"}),
            ("oversized", {"type": "reset", "data": {"pad": "x" * 10_000}}),
            ("bad reset option", {"type": "reset", "data": {"task_index": "first"}}),
            ("unknown task", {"type": "reset", "data": {"task_id": "no-such-task"}})]
        for name, message in frames:
            reply = await ask(ws, message)
            assert reply["type"] == "error", (name, reply)
            codes[name] = reply["data"]["code"]
        assert codes == {"not json": "INVALID_JSON", "not an object": "VALIDATION_ERROR",
                         "unknown type": "UNKNOWN_TYPE", "no type": "UNKNOWN_TYPE", "extra key": "VALIDATION_ERROR",
                         "step before reset": "EXECUTION_ERROR", "step without data": "VALIDATION_ERROR",
                         "oversized": "VALIDATION_ERROR", "bad reset option": "VALIDATION_ERROR",
                         "unknown task": "VALIDATION_ERROR"}
        first = await ask(ws, {"type": "reset", "data": {"task_index": 0, "screenshot": "none", "typo": 1}})
        assert first["data"]["observation"]["screenshot"] is None
        assert first["data"]["observation"]["metadata"]["ignored"] == ["typo"]  # dropped, as OpenEnv drops them
        bad = await ask(ws, {"type": "step", "data": {"action": "click('3')"}})
        assert bad["data"]["code"] == "VALIDATION_ERROR"
        assert {e["type"] for e in bad["data"]["errors"]} <= {"missing", "extra_forbidden"}
        ok = await ask(ws, {"type": "step", "data": {"action_str": "noop()"}})
        assert ok["type"] == "observation"  # the session survived all of the above
    (record,) = served.records()
    assert record["error"]["kind"] == "client_gone"


async def test_a_full_server_refuses_at_once(tmp_path: Path, site_server: str, pool: BrowserPool) -> None:
    async with serving(tmp_path, site_server, pool, capacity=2) as served, aiohttp.ClientSession() as http, \
            http.ws_connect(served.ws_url, max_msg_size=MAX_MESSAGE) as first, \
            http.ws_connect(served.ws_url, max_msg_size=MAX_MESSAGE) as second:
        assert (await ask(first, {"type": "reset", "data": {"task_index": 0}}))["type"] == "observation"
        assert (await ask(second, {"type": "state"}))["type"] == "state"
        async with http.ws_connect(served.ws_url, max_msg_size=MAX_MESSAGE) as third:
            refused = await asyncio.wait_for(third.receive(), 10)
            assert json.loads(refused.data)["data"] == {
                "message": "Server at capacity: 2/2 sessions active. Cannot accept new connections.",
                "code": "CAPACITY_REACHED", "active_sessions": 2, "max_sessions": 2}
            assert (await asyncio.wait_for(third.receive(), 10)).type in (aiohttp.WSMsgType.CLOSE,
                                                                         aiohttp.WSMsgType.CLOSED)
        assert (await ask(second, {"type": "state"}))["type"] == "state"  # the others go on


async def test_an_idle_client_is_told_and_its_episode_recorded_so(tmp_path: Path, site_server: str,
                                                                 pool: BrowserPool) -> None:
    async with serving(tmp_path, site_server, pool, idle_timeout_s=2.0) as served, aiohttp.ClientSession() as http, \
            http.ws_connect(served.ws_url, max_msg_size=MAX_MESSAGE) as idle:
        assert (await ask(idle, {"type": "reset", "data": {"task_index": 0}}))["type"] == "observation"
        told = await asyncio.wait_for(idle.receive(), 60)  # idle past 2 s: told, then closed
        assert json.loads(told.data)["data"]["code"] == "SESSION_ERROR"
        assert (await asyncio.wait_for(idle.receive(), 60)).type in (aiohttp.WSMsgType.CLOSE, aiohttp.WSMsgType.CLOSED)
    (record,) = served.records()
    # Not a task failure: never trained on as reward 0.
    assert (record["status"], record["error"]["kind"]) == ("error", "client_idle")


async def test_a_client_that_answers_no_ping_is_dropped_and_its_episode_recorded(tmp_path: Path, site_server: str,
                                                                                 pool: BrowserPool) -> None:
    async with serving(tmp_path, site_server, pool, heartbeat_s=0.5) as served, aiohttp.ClientSession() as http:
        deaf = await http.ws_connect(served.ws_url, max_msg_size=MAX_MESSAGE, autoping=False)
        await deaf.send_str(json.dumps({"type": "reset", "data": {"task_index": 1}}))
        deadline = asyncio.get_running_loop().time() + 20
        while not served.records() and asyncio.get_running_loop().time() < deadline:
            await asyncio.sleep(0.1)
        assert not served.server.sessions
        await deaf.close()
    (record,) = served.records()
    assert (record["status"], record["error"]["kind"]) == ("error", "client_gone")


async def test_pings_keep_a_quiet_client_that_answers_them(tmp_path: Path, site_server: str,
                                                          pool: BrowserPool) -> None:
    async with serving(tmp_path, site_server, pool, heartbeat_s=0.5) as served, aiohttp.ClientSession() as http, \
            http.ws_connect(served.ws_url, max_msg_size=MAX_MESSAGE, autoping=False) as ws:
        assert (await ask(ws, {"type": "reset", "data": {"task_index": 0}}))["type"] == "observation"
        # A long generation: the client sends nothing for 3 s and answers the server's pings (as OpenEnv's client,
        # whose websockets connection answers them on its own).
        loop = asyncio.get_running_loop()
        end, pings = loop.time() + 3.0, 0
        while (left := end - loop.time()) > 0:
            with contextlib.suppress(TimeoutError):
                msg = await ws.receive(timeout=left)
                assert msg.type is aiohttp.WSMsgType.PING, msg
                await ws.pong(msg.data)
                pings += 1
        assert pings >= 4
        assert (await ask(ws, {"type": "step", "data": {"action_str": "noop()"}}))["type"] == "observation"


async def test_http_routes_follow_openenv_and_a_key_guards_them(tmp_path: Path, site_server: str,
                                                                pool: BrowserPool) -> None:
    async with serving(tmp_path, site_server, pool, api_key="sesame") as served, aiohttp.ClientSession() as http:
        url, key = served.server.url, {"Authorization": "Bearer sesame"}
        async with http.get(f"{url}/health") as r:
            assert (r.status, await r.json()) == (200, {"status": "healthy"})
        async with http.get(f"{url}/schema") as r:
            assert r.status == 401
        with pytest.raises(aiohttp.WSServerHandshakeError):
            await http.ws_connect(served.ws_url, max_msg_size=MAX_MESSAGE)
        async with http.get(f"{url}/schema", headers=key) as r:
            schema = await r.json()
            assert set(schema) == {"action", "observation", "state", "reset_observation"}
            assert "action_str" in json.dumps(schema["action"])
        async with http.get(f"{url}/metadata", headers=key) as r:
            assert (await r.json())["name"] == ENV_NAME
        async with http.post(f"{url}/reset", headers=key, json={"task_index": 0, "screenshot": "jpeg"}) as r:
            reset = await r.json()
            assert r.status == 200 and reset["done"] is False
            assert base64.b64decode(reset["observation"]["metadata"]["screenshot_jpeg"])[:2] == b"\xff\xd8"
        async with http.post(f"{url}/step", headers=key, json={"action": {"nope": 1}}) as r:
            assert r.status == 422
        async with http.post(f"{url}/step", headers=key, json={"action": {"action_str": "noop()"}}) as r:
            assert r.status == 409 and "/ws" in (await r.json())["detail"]
        async with http.get(f"{url}/state", headers=key) as r:
            assert (await r.json())["step_count"] == 0
        async with http.post(f"{url}/{ENV_NAME}/num_tasks", headers=key, json={"split": "train"}) as r:
            count = (await r.json())["num_tasks"]
            assert count == len(served.server.picker.tasks)
        async with http.post(f"{url}/{ENV_NAME}/task", headers=key, json={"split": "train", "index": count}) as r:
            assert r.status == 400
        async with http.post(f"{url}/{ENV_NAME}/task_range", headers=key,
                             json={"split": "train", "start": 1, "stop": 3}) as r:
            assert [t["task_id"] for t in (await r.json())["tasks"]] == [
                t.task_id for t in served.server.picker.tasks[1:3]]
        async with http.post(f"{url}/other/num_tasks", headers=key, json={"split": "train"}) as r:
            assert r.status == 404
        async with http.ws_connect(served.ws_url, max_msg_size=MAX_MESSAGE, headers=key) as ws:
            assert (await ask(ws, {"type": "state"}))["type"] == "state"
    (record,) = served.records()  # the HTTP reset's episode: started, answered, ended
    assert record["error"]["kind"] == "abandoned"
