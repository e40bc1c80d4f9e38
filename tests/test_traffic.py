"""Recorded and replayed page traffic: a page that changes on every load (a server counter, a clock, a random ad, a
fetched number) looks the same in every replay of the same actions, HTTPS included; a request the archive lacks is
a recorded miss; a broken archive is a clear error; a run records each episode's traffic and a replay of it loads
nothing from the network; a GRPO group's members start from their first member's snapshot.

Real Chromium on the tests' local open web (tests/openweb.py: named hosts over HTTP and trusted HTTPS).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import pytest_asyncio

from browserpool.pool import BrowserOpError, BrowserPool
from browserpool.pool_errors import WorkerLost
from browserpool.protocol import BrowserAction, Observation, TrafficSpec
from browserpool.traffic import Archive, TrafficError, request_key
from engine.agent.actions import AgentAction
from engine.agent.policy_api import Policy, PolicyReply, PolicyRequest
from engine.clients.runner import run
from engine.core.config import RunConfig
from engine.core.core import EngineCore
from engine.episode.context import RolloutContext
from engine.episode.rollout import Rollout
from engine.episode.traffic_plan import TrafficPlan, TrafficSettings
from engine.store.run_dir import RunStore, read_records
from engine.store.stats import RunStats
from engine.tasks.loading import parse_task
from server.app import BrowserServer, ServerConfig
from tests.conftest import openweb_pool
from tests.omnibox_client import OmniboxClient
from tests.openweb import OpenWeb

pytestmark = pytest.mark.asyncio(loop_scope="module")
_ids = iter(range(10**6))


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def pool(openweb: OpenWeb) -> AsyncIterator[BrowserPool]:
    async with openweb_pool(openweb) as p:
        yield p


async def episode(pool: BrowserPool, url: str, traffic: TrafficSpec | None, click_link: str | None = None
                  ) -> list[tuple[Observation, bytes]]:
    """Open ``url`` (recording or replaying), click the link ``click_link`` if given, close: the observations and
    their screenshots."""
    session = await pool.lease(f"traffic-{next(_ids)}")
    seen = []
    try:
        obs, frame = await session.open(url, traffic=traffic)
        with frame:
            seen.append((obs, bytes(frame.view)))
        if click_link is not None:
            obs, frame = await session.act(BrowserAction("click", selector=f"a#{click_link}"))
            with frame:
                seen.append((obs, bytes(frame.view)))
    finally:
        await session.close()
    return seen


@pytest.mark.parametrize("scheme", ["http", "https"])
async def test_a_changing_page_replays_byte_identical_and_a_miss_is_recorded(
        pool: BrowserPool, openweb: OpenWeb, tmp_path: Path, scheme: str) -> None:
    url = (openweb.url("shop.test", "/changing") if scheme == "http"
           else f"https://secure.test:{openweb.trusted_tls_port}/changing")
    live = [await episode(pool, url, None) for _ in range(2)]
    assert live[0][0][1] != live[1][0][1]  # live, the page differs on every load
    path = str(tmp_path / f"{scheme}.traffic")
    hits = openweb.hits.copy()
    recording = await episode(pool, url, TrafficSpec(mode="record", path=path, seed=7), click_link="next")
    assert recording[0][0].traffic is not None and recording[0][0].traffic.recorded >= 3  # page, json, image
    archive = Archive.read(path)
    assert archive.seed == 7 and request_key("GET", url, None) in archive.entries
    served = openweb.hits.copy()
    replays = [await episode(pool, url, TrafficSpec(mode="replay", path=path), click_link="next") for _ in range(3)]
    assert openweb.hits == served and served != hits  # the replays asked nothing of the server
    for replay in replays:
        assert [shot for _, shot in replay] == [shot for _, shot in replays[0]]
        assert all(obs.traffic is not None and obs.traffic.misses == 0 for obs, _ in replay)
    assert [shot for _, shot in replays[0]] == [shot for _, shot in recording]  # and as the recording saw it
    # A link the recording never followed: a 404 from the archive, named in the observation.
    missed = await episode(pool, url, TrafficSpec(mode="replay", path=path), click_link="unseen")
    obs = missed[1][0]
    assert obs.traffic is not None and obs.traffic.misses >= 1 and any("unseen" in u for u in obs.traffic.miss_urls)
    assert obs.status == 404 and openweb.hits == served
    # miss="live": the same link goes to the site.
    await episode(pool, url, TrafficSpec(mode="replay", path=path, miss="live"), click_link="unseen")
    assert openweb.hits != served


async def test_a_cross_site_frames_loads_are_recorded_and_replayed(pool: BrowserPool, openweb: OpenWeb,
                                                                   tmp_path: Path) -> None:
    # The workers' headless shell keeps a cross-site iframe in the tab's renderer: its loads pass the tab's own
    # interception (the full Chromium isolates it in a renderer of its own: docs/repeatable.md).
    url = openweb.url("shop.test", "/framed?src=" + openweb.url("news.test", "/changing"))
    path = str(tmp_path / "framed.traffic")
    recording = await episode(pool, url, TrafficSpec(mode="record", path=path, seed=3))
    assert request_key("GET", openweb.url("news.test", "/changing.json"), None) in Archive.read(path).entries
    hits = openweb.hits.copy()
    replays = [await episode(pool, url, TrafficSpec(mode="replay", path=path)) for _ in range(3)]
    assert openweb.hits == hits  # neither site was asked anything
    assert all(obs.traffic is not None and obs.traffic.misses == 0 for r in replays for obs, _ in r)
    assert {r[0][1] for r in replays} == {recording[0][1]}  # the framed page, byte-identical


async def test_a_redirect_chain_replays_to_where_it_landed(pool: BrowserPool, openweb: OpenWeb,
                                                          tmp_path: Path) -> None:
    # shop.test/redirect -> 302 to tracker.test/click -> 302 to shop.test/landed, as an ad's or e-mail's link goes.
    url = openweb.url("shop.test", "/redirect")
    path = str(tmp_path / "redirect.traffic")
    [(recorded, shot)] = await episode(pool, url, TrafficSpec(mode="record", path=path))
    assert recorded.url == openweb.url("shop.test", "/landed")
    statuses = [r.status for rs in Archive.read(path).entries.values() for r in rs]
    assert sorted(statuses) == [200, 302, 302]
    hits = openweb.hits.copy()
    [(replayed, replayed_shot)] = await episode(pool, url, TrafficSpec(mode="replay", path=path))
    assert (replayed.url, replayed_shot) == (recorded.url, shot) and openweb.hits == hits
    assert replayed.traffic is not None and (replayed.traffic.served, replayed.traffic.misses) == (3, 0)


async def test_a_missing_or_broken_archive_is_a_clear_error(pool: BrowserPool, openweb: OpenWeb,
                                                            tmp_path: Path) -> None:
    broken = tmp_path / "broken.traffic"
    broken.write_bytes(b"\x78\x9c not zlib at all")
    for path, why in ((tmp_path / "none.traffic", "no traffic archive"), (broken, "corrupt traffic archive")):
        with pytest.raises(BrowserOpError, match=why):
            await episode(pool, openweb.url("shop.test", "/changing"), TrafficSpec(mode="replay", path=str(path)))
    with pytest.raises(TrafficError, match="version"):
        Archive.from_bytes(__import__("zlib").compress(__import__("msgpack").packb({"version": 99})))
    # An archive whose response the browser refuses (no HTTP status, a header name with a line break): the load
    # fails at once, as a page the network could not load, and nothing waits for it.
    url = openweb.url("shop.test", "/changing")
    hostile = Archive()
    hostile.add(request_key("GET", url, None), 42, [("X-Bad\nName", "v")], b"<h1>x</h1>")
    hostile.write(str(tmp_path / "hostile.traffic"))
    [(obs, _)] = await episode(pool, url, TrafficSpec(mode="replay", path=str(tmp_path / "hostile.traffic")))
    assert obs.load_error is not None and obs.timings_ms.get("settle_ms", 0) < 5000, obs
    # The pool still serves episodes.
    assert (await episode(pool, openweb.url("shop.test", "/changing"), None))[0][0].status == 200


# --- runs ---------------------------------------------------------------------------------------------------------

class ClickNextPolicy(Policy):
    """Clicks the page's "next" link (at its place on /changing), then answers."""

    name = "click-next"

    async def act(self, request: PolicyRequest) -> PolicyReply:
        if request.step == 0:
            return PolicyReply(AgentAction("left_click", x=24, y=371), text="click next")
        return PolicyReply(AgentAction("answer", text="done"), text="answer")


def run_config(tmp_path: Path, openweb: OpenWeb, name: str, samples: int = 1, **kw: object) -> RunConfig:
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text("".join(json.dumps({"task_id": f"t{i}", "task_name": "Read the page.", "difficulty": 1,
                                         "website": openweb.url(host, "/changing")}) + "\n"
                             for i, host in enumerate(("shop.test", "news.test"))))
    cfg = RunConfig(tasks=str(tasks), output_dir=str(tmp_path / name), workers=1, telemetry=None, reward="program",
                    episodes=2 * samples, **kw)  # type: ignore[arg-type]
    cfg.worker.net = openweb.net
    return cfg


def shots(run_dir: Path) -> dict[str, list[bytes]]:
    """Each episode's screenshots, by episode id."""
    return {r["episode_id"]: [(run_dir / s["screenshot"]).read_bytes() for s in r["steps"]]
            for r in read_records(run_dir)}


async def test_a_run_records_each_episode_and_a_replay_of_it_asks_nothing_of_the_sites(
        tmp_path: Path, openweb: OpenWeb, pool: BrowserPool) -> None:
    _, recorded = await run(run_config(tmp_path, openweb, "rec", record_traffic=True), ClickNextPolicy(), None,
                            pool=pool)
    records = read_records(recorded)
    assert len(records) == 2 and all(r["traffic"]["mode"] == "record" for r in records)
    assert all((recorded / r["traffic"]["archive"]).is_file() for r in records)
    assert all(r["steps"][0]["traffic"]["recorded"] >= 3 for r in records)  # the next page's loads
    hits = openweb.hits.copy()
    replays = []
    for i in range(2):
        _, replayed = await run(run_config(tmp_path, openweb, f"rep{i}", replay_traffic=str(recorded)),
                                ClickNextPolicy(), None, pool=pool)
        replays.append(shots(replayed))
        for r in read_records(replayed):
            assert r["traffic"]["mode"] == "replay" and r["traffic"]["open"]["misses"] == 0
            assert r["steps"][0]["traffic"]["misses"] == 0 and r["steps"][0]["traffic"]["served"] >= 3
    assert openweb.hits == hits  # nothing was asked of the sites
    assert replays[0] == replays[1] == shots(recorded)
    # A task the recording did not run: an error record that says so.
    cfg = run_config(tmp_path, openweb, "none", replay_traffic=str(tmp_path / "rep0"))
    _, missing = await run(cfg, ClickNextPolicy(), None, pool=pool)
    assert {r["error"]["kind"] for r in read_records(missing)} == {"traffic_missing"}


async def test_a_grpo_groups_members_start_from_their_first_members_snapshot(tmp_path: Path, openweb: OpenWeb,
                                                                            pool: BrowserPool) -> None:
    hits = openweb.hits.copy()
    cfg = run_config(tmp_path, openweb, "group", samples=3, traffic_group=3, concurrency=6)
    _, run_dir = await run(cfg, ClickNextPolicy(), None, pool=pool)
    records = read_records(run_dir)
    assert len(records) == 6
    by_task: dict[str, list[dict]] = {}
    for r in records:
        by_task.setdefault(r["task"]["task_id"], []).append(r)
    seen = shots(run_dir)
    for members in by_task.values():
        leaders = [r for r in members if r["traffic"]["mode"] == "record"]
        assert len(leaders) == 1 and (run_dir / leaders[0]["traffic"]["group_start"]).is_file()
        others = [r for r in members if r is not leaders[0]]
        assert [r["traffic"]["mode"] for r in others] == ["replay", "replay"]
        starts = {seen[r["episode_id"]][0] for r in members}
        assert len(starts) == 1  # one start page for the whole group
        # What the members' clicks load beyond the snapshot comes from the sites (traffic_group replays with live
        # misses): they differ.
        assert all(r["steps"][0]["traffic"]["misses"] >= 1 for r in others)
    # The sites saw each group's start once (page, image, data), its leader's click (the next page and its image
    # and data) and each other member's next page (its image and data are the snapshot's: the same URLs).
    loads = sum(openweb.hits[h] - hits[h] for h in ("shop.test", "news.test"))
    assert loads == 2 * 3 + 2 * 3 + 4 * 1


async def served_pages(cfg: RunConfig, url: str, pool: BrowserPool) -> tuple[Path, list[str]]:
    """Serve one engine core on ``pool``; lease 1 visits ``url`` and its next page, reading each page's text."""
    async with EngineCore(cfg, pool=pool) as core:
        server = BrowserServer(core, ServerConfig(port=0, capacity=2))
        await server.start()
        try:
            async with OmniboxClient(server.url) as client:
                lease = await client.get()
                texts = []
                for page in (url, url.replace("/changing", "/changing-next")):
                    await client.execute(lease, "visit_page", {"url": page})
                    texts.append((await client.execute(lease, "get_webpage_text", {"n_lines": 20}))["text"])
                await client.reset(lease)
        finally:
            await server.close()
        assert core.run_dir is not None
        return core.run_dir, texts


async def test_serve_records_a_leases_traffic_and_replays_it(tmp_path: Path, openweb: OpenWeb,
                                                             pool: BrowserPool) -> None:
    cfg = run_config(tmp_path, openweb, "serve-rec", record_traffic=True, episode_timeout_s=None)
    url = openweb.url("shop.test", "/changing")
    recorded, texts = await served_pages(cfg, url, pool)
    assert (recorded / "traffic" / "lease-1_0.traffic").is_file()
    hits = openweb.hits.copy()
    cfg = run_config(tmp_path, openweb, "serve-rep", replay_traffic=str(recorded), episode_timeout_s=None)
    _, replayed = await served_pages(cfg, url, pool)
    assert replayed == texts and openweb.hits == hits  # the same pages, nothing asked of the site


class _NoBrowserPool:
    """Stands in for the browser pool where no browser can be had: every lease fails as a lost worker's would, so
    a group's first member never opens its start page."""

    async def lease(self, episode_id: str) -> None:
        raise WorkerLost(f"stand-in pool: no worker for {episode_id}")


async def test_a_group_whose_first_member_never_opens_runs_the_others_live(tmp_path: Path) -> None:
    task = parse_task({"task_id": "g", "task_name": "Read the page.", "difficulty": 1,
                       "website": "http://shop.test/"}, tmp_path / "tasks.jsonl", "line 1")
    store = RunStore(tmp_path / "run")
    plan = TrafficPlan(TrafficSettings(group=3), store.dir)
    ctx = RolloutContext(pool=_NoBrowserPool(), policy=ClickNextPolicy(),  # type: ignore[arg-type]
                         policy_slots=asyncio.Semaphore(1), store=store, stats=RunStats(), traffic=plan)
    try:
        # Before, the members waited for the start page for ever (or until their episode's cap).
        records = await asyncio.wait_for(asyncio.gather(*(Rollout(task, i, ctx).run() for i in range(3))), 30)
    finally:
        store.close()
    assert [r["error"]["kind"] for r in records] == ["worker_lost"] * 3  # type: ignore[index]
    assert records[0]["traffic"]["mode"] == "record"
    assert [r["traffic"] for r in records[1:]] == [
        {"mode": "live", "why": "its group's first member did not open"}] * 2
