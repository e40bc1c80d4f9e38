"""MiniWoB++ through the whole engine: the package's pages on the site server, episodes started, seeded and
scored by the pages' own JavaScript, the scripted solutions and the random policy.

The random policy over *all* 130 tasks is ``python -m bench.miniwob_random``; here it runs on a subset.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path

import pytest
import pytest_asyncio

from browserpool.pool import BrowserOpError, BrowserPool
from browserpool.protocol import ERR_REFUSED, BrowserAction
from engine.clients.runner import run
from engine.core.builders import pool_config
from engine.core.config import RunConfig
from engine.sites.server import SiteServer
from engine.store.run_dir import read_records
from engine.tasks.loading import load_tasks
from engine.tasks.miniwob import (
    PROBE_JS,
    SETUP_JS,
    load_miniwob_tasks,
    miniwob_mount,
    parse_spec,
    task_names,
    write_miniwob_tasks,
)
from engine.tasks.schema import PAGE_FIELDS, PageHooks
from policy.miniwob_scripted import SOLVED_TASKS
from policy.registry import make_policy
from tests.conftest import started_pool

on_session_loop = pytest.mark.asyncio(loop_scope="session")

# A spread of task families (forms, widgets, drag/draw, canvas, timing, iframes-free layouts) for the random
# policy; the whole list is the benchmark's job.
RANDOM_SUBSET = (
    "ascending-numbers", "bisect-angle", "book-flight", "button-delay", "choose-date", "circle-center",
    "click-collapsible", "click-color", "click-menu", "click-pie", "click-scroll-list", "click-shape",
    "copy-paste", "count-shape", "drag-box", "drag-items", "email-inbox", "enter-date", "enter-time",
    "find-word", "grid-coordinate", "guess-number", "highlight-text", "hot-cold", "navigate-tree",
    "search-engine", "simon-says", "social-media", "terminal", "text-editor", "use-autocomplete", "use-slider",
)


@pytest.fixture(scope="module")
def miniwob_sites() -> Iterator[str]:
    with SiteServer(mounts=miniwob_mount()) as server:
        yield server.base_url


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def pool(miniwob_sites: str) -> AsyncIterator[BrowserPool]:
    """One worker for this module's runs, started after the MiniWoB++ site server: its pages are the engine's own
    sites, exempt from the network policy."""
    async with started_pool(pool_config(config(Path(), Path()), None)) as p:
        yield p


def config(tmp_path: Path, tasks: Path, **kw: object) -> RunConfig:
    kw.setdefault("concurrency", 6)
    kw.setdefault("workers", 1)
    return RunConfig(tasks=str(tasks), output_dir=str(tmp_path / "runs"), **kw)  # type: ignore[arg-type]


def test_task_source_selects_builds_and_writes_tasks(tmp_path: Path) -> None:
    names = task_names()
    assert len(names) >= 100 and "click-button" in names and parse_spec("miniwob") == names
    assert parse_spec("miniwob:enter-text, click-button,enter-text") == ["enter-text", "click-button"]
    with pytest.raises(ValueError, match="no-such-task"):
        parse_spec("miniwob:click-button,no-such-task")
    with pytest.raises(ValueError):
        parse_spec("tasks.jsonl")
    (task,) = load_miniwob_tasks("miniwob:click-button", "http://127.0.0.1:8123/")
    assert task.website == "http://127.0.0.1:8123/miniwob/miniwob/click-button.html"
    assert task.page == PageHooks(setup=SETUP_JS, probe=PROBE_JS, reward_from_page=True) and task.extra == {}
    assert {k: task.to_record()[k] for k in PAGE_FIELDS} == {"setup_js": SETUP_JS, "probe_js": PROBE_JS,
                                                             "reward_source": "page"}
    assert (miniwob_mount()["/miniwob"] / "core" / "core.js").is_file()
    # A task file (what a run from a file reads) gives the same tasks.
    loaded = load_tasks(write_miniwob_tasks(tmp_path / "m.jsonl", "miniwob:click-button,enter-text"),
                        "http://127.0.0.1:8123")
    assert loaded[0] == task and loaded[1].subdomain == "enter-text"


@on_session_loop
async def test_setup_script_and_probe_on_a_plain_page(pool: BrowserPool, fixture_url: Callable[[str], str]) -> None:
    """The generic plumbing: setup runs before the first screenshot, the probe after every observation."""
    setup = "document.getElementById('out').textContent = 'set up'; window.n = 0;"
    probe = "({out: document.getElementById('out').textContent, clicks: window.clicks.length, n: ++window.n})"
    session = await pool.lease("miniwob-plumbing-1")
    try:
        obs, frame = await session.open(fixture_url("click.html"), setup_js=setup, probe_js=probe)
        frame.release()
        assert obs.probe == {"out": "set up", "clicks": 0, "n": 1} and "setup_ms" in obs.timings_ms
        obs, frame = await session.act(BrowserAction("click", x=200, y=130))
        frame.release()
        assert obs.probe == {"out": "clicked 1", "clicks": 1, "n": 2} and "probe_ms" in obs.timings_ms
    finally:
        await session.close()
    session = await pool.lease("miniwob-plumbing-2")
    try:  # a probe that throws reports the error; a setup that throws refuses the open
        obs, frame = await session.open(fixture_url("click.html"), probe_js="no_such_name.x")
        frame.release()
        assert "no_such_name" in obs.probe["error"]
        with pytest.raises(BrowserOpError) as err:
            await session.open(fixture_url("click.html"), setup_js="throw new Error('boom')")
        assert err.value.kind == ERR_REFUSED and "boom" in str(err.value)
        obs, frame = await session.open(fixture_url("click.html"))
        frame.release()
        assert obs.probe is None  # a plain open has no probe
    finally:
        await session.close()


@on_session_loop
async def test_scripted_solutions_reach_reward_1(tmp_path: Path, miniwob_sites: str, pool: BrowserPool) -> None:
    spec = "miniwob:" + ",".join(SOLVED_TASKS)
    samples = 3  # three episodes per task, each with its own seed (the episode id)
    tasks = write_miniwob_tasks(tmp_path / "solved.jsonl", spec)
    stats, run_dir = await run(config(tmp_path, tasks, episodes=samples * len(SOLVED_TASKS)),
                               make_policy("miniwob-scripted"), miniwob_sites, pool=pool)
    records = read_records(run_dir)
    assert len(records) == samples * len(SOLVED_TASKS) >= 30 and stats.summary()["lost"] == 0
    failed = {r["episode_id"]: (r["reward"] or r["error"]) for r in records if r["status"] != "success"}
    assert not failed
    for r in records:
        reward = r["reward"]
        assert reward["value"] == 1.0 and reward["source"] == "page"
        assert [f["fact"] for f in reward["facts"]] == ["the page's own reward"] and reward["facts"][0]["passed"]
        assert "raw reward 1" in reward["reason"]
        # The instruction the page generated replaced the placeholder; the episode ended when the page said so.
        assert not r["task"]["task_name"].startswith("MiniWoB++ task")
        assert r["steps"][-1]["probe"]["done"] is True and r["steps"][-1]["action"]["name"] != "answer"
        assert all(not s["probe"]["done"] for s in r["steps"][:-1])
    by_task: dict[str, set[str]] = {}
    for r in records:
        by_task.setdefault(r["task"]["task_id"], set()).add(r["task"]["task_name"])
    # Different seeds give different problems (tasks whose text never varies aside).
    assert sum(len(v) > 1 for v in by_task.values()) >= 8


@on_session_loop
async def test_episodes_are_reproducible_from_their_seed(tmp_path: Path, miniwob_sites: str, pool: BrowserPool) -> None:
    tasks = write_miniwob_tasks(tmp_path / "t.jsonl", "miniwob:click-checkboxes,login-user,choose-list")
    texts = []
    for i in range(2):
        _, run_dir = await run(config(tmp_path / str(i), tasks, episodes=6), make_policy("miniwob-scripted"),
                               miniwob_sites, pool=pool)
        texts.append({r["episode_id"]: r["task"]["task_name"] for r in read_records(run_dir)})
    assert texts[0] == texts[1] and len(set(texts[0].values())) >= 4


@on_session_loop
async def test_random_policy_ends_every_episode_with_a_record(
        tmp_path: Path, miniwob_sites: str, pool: BrowserPool) -> None:
    tasks = write_miniwob_tasks(tmp_path / "random.jsonl", "miniwob:" + ",".join(RANDOM_SUBSET))
    # Four steps each: enough for the pages to end some episodes, and every kind of ending to show up.
    stats, run_dir = await run(config(tmp_path, tasks, concurrency=12, seed=5, step_caps=(4, 4, 4)),
                               make_policy("random", seed=5), miniwob_sites, pool=pool)
    records = read_records(run_dir)
    assert len(records) == len(RANDOM_SUBSET) and stats.summary()["lost"] == 0
    assert not {r["episode_id"]: r["error"] for r in records if r["status"] == "error"}
    for r in records:
        assert r["reward"]["source"] == "page" and r["reward"]["value"] in (0.0, 1.0)
        assert 1 <= len(r["steps"]) <= 4
        ended_by_page = any(isinstance(s.get("probe"), dict) and s["probe"].get("done") for s in r["steps"])
        assert ended_by_page or len(r["steps"]) == 4 or r["steps"][-1]["action"]["name"] == "answer"
