"""Recorded and replayed page traffic: a page that changes on every load (a server counter, a clock, a random ad, a
fetched number) looks the same in every replay of the same actions, HTTPS included; a request the archive lacks is
a recorded miss; a broken archive is a clear error; a run records each episode's traffic and a replay of it loads
nothing from the network; a GRPO group's members start from their first member's snapshot.

Real Chromium on the tests' local open web (tests/openweb.py: named hosts over HTTP and trusted HTTPS).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import pytest_asyncio

from browserpool.config import CHROMIUM_FLAGS
from browserpool.pool import BrowserOpError, BrowserPool, PoolConfig
from browserpool.protocol import BrowserAction, NetSettings, Observation, TrafficSpec
from browserpool.traffic import Archive, TrafficError, request_key
from tests.conftest import started_pool
from tests.openweb import OpenWeb

pytestmark = pytest.mark.asyncio(loop_scope="module")
_ids = iter(range(10**6))


@pytest.fixture(scope="module")
def openweb() -> OpenWeb:
    with OpenWeb(delay_s=0.0) as web:
        yield web


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def pool(openweb: OpenWeb) -> AsyncIterator[BrowserPool]:
    cfg = PoolConfig(workers=1)
    cfg.worker.net = NetSettings(allow_private_network=True, hosts=openweb.net_hosts)
    cfg.worker.chromium_flags = [*CHROMIUM_FLAGS, f"--ignore-certificate-errors-spki-list={openweb.trusted_spki}"]
    async with started_pool(cfg) as p:
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


async def test_a_missing_or_broken_archive_is_a_clear_error(pool: BrowserPool, openweb: OpenWeb,
                                                            tmp_path: Path) -> None:
    broken = tmp_path / "broken.traffic"
    broken.write_bytes(b"\x78\x9c not zlib at all")
    for path, why in ((tmp_path / "none.traffic", "no traffic archive"), (broken, "corrupt traffic archive")):
        with pytest.raises(BrowserOpError, match=why):
            await episode(pool, openweb.url("shop.test", "/changing"), TrafficSpec(mode="replay", path=str(path)))
    with pytest.raises(TrafficError, match="version"):
        Archive.from_bytes(__import__("zlib").compress(__import__("msgpack").packb({"version": 99})))
    # The pool still serves episodes.
    assert (await episode(pool, openweb.url("shop.test", "/changing"), None))[0][0].status == 200
