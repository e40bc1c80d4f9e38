"""Resource bounds, on real runs: the episode wall-clock cap, the policy-call cap, caps on page texts in
records and prompts, renderer memory (a heavy context is not reused, a heavy browser is recycled), and
credentials in URLs masked in the run directory.

Most tests drive the engine against a worker that runs in this process (a pool that waits for a hand-started
worker), so they can look at the worker itself afterwards: which contexts it kept, which episodes are live.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import pytest_asyncio

from browserpool.config import WorkerConfig
from browserpool.page import TITLE_CHARS
from browserpool.pool import BrowserOpError, BrowserPool
from browserpool.protocol import ERR_TOO_LARGE, BrowserAction
from browserpool.renderer_watch import ProcessTree, private_resident_bytes
from browserpool.worker import BrowserWorker
from engine.agent.model_api import ChatRequest, Generation, LanguageModel
from engine.agent.policy_api import Policy
from engine.agent.prompts import AgentConfig
from engine.clients.runner import plan_episodes, run
from engine.core.config import RunConfig
from engine.core.core import EngineCore
from engine.rewards.judge import JudgeConfig
from engine.store.run_dir import RunStore, read_records
from engine.store.stats import RunStats
from engine.tasks.loading import load_tasks
from engine.web.bounds import ELLIPSIS, PageLimits
from policy.agent_policy import AgentPolicy
from policy.registry import BackendConfig, make_policy
from tests.chat_test_server import ChatTestServer
from tests.conftest import inproc_pool, open_session, subset

pytestmark = pytest.mark.asyncio(loop_scope="session")

HEAP_CAP_MIB = 32  # the heap-hog page keeps ~48 MB alive; a plain page uses 2-3 MB
PAGE_CAP_MIB = 256  # the memory-hog page writes 64 MiB every 100 ms up to 1.5 GB; a fresh renderer holds ~15 MiB


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def inproc(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[tuple[BrowserWorker, BrowserPool]]:
    """(worker, pool): one BrowserWorker running in this event loop (context heap cap 32 MiB), serving a pool."""
    cfg = WorkerConfig(endpoint="", worker_id="inproc", context_memory_mib=HEAP_CAP_MIB)
    async with inproc_pool(f"ipc://{tmp_path_factory.mktemp('ipc')}/pool.sock", cfg) as wp:
        yield wp


def task_file(tmp_path: Path, *tasks: dict[str, Any]) -> Path:
    path = tmp_path / "tasks.jsonl"
    path.write_text("".join(json.dumps(t) + "\n" for t in tasks))
    return path


def a_task(task_id: str, website: str, max_steps: int = 3, solution: list | None = None,
           check: dict | None = None) -> dict[str, Any]:
    t: dict[str, Any] = {
        "task_id": task_id, "task_name": "look at the page", "website": website, "difficulty": 1,
        "max_steps": max_steps,
        "evaluator_reference": [{"id": 1, "description": "d", "facts": ["f"],
                                 "checks": [check or {"kind": "answer", "contains": "done"}]}]}
    if solution is not None:
        t["reference_solution"] = solution
    return t


async def run_on(pool: BrowserPool, cfg: RunConfig, policy: Policy, base_url: str, run_dir: Path
                 ) -> tuple[RunStats, list[dict[str, Any]]]:
    """Run every task of ``cfg.tasks`` once through an engine core on ``pool``; returns (stats, records)."""
    store = RunStore(run_dir)
    core = EngineCore(cfg, pool=pool, store=store)
    await core.start()
    try:
        stats = await core.run_plan(policy, plan_episodes(load_tasks(cfg.tasks, base_url), None, set()))
    finally:
        await core.close()
        store.close()
    return stats, read_records(run_dir)


def assert_released(worker: BrowserWorker, pool: BrowserPool) -> None:
    """No episode is live on either side, and the worker's contexts are idle (handed back, not leaked)."""
    assert worker.episodes == {}
    assert all(not h.episodes for h in pool.workers.values())


# --- the episode's wall-clock cap -----------------------------------------------------------------------------

@pytest.mark.wallclock
async def test_an_episode_past_its_wall_clock_cap_ends_with_one_timeout_record(
        inproc, tmp_path: Path, fixture_url: Callable[[str], str], site_server: str) -> None:
    worker, pool = inproc
    waits = [{"action": "wait", "seconds": 2.0} for _ in range(6)]
    slow = a_task("slow", fixture_url("click.html"), max_steps=10,
                  solution=[*waits, {"action": "answer", "text": "done"}])
    fast = a_task("fast", fixture_url("click.html"), solution=[{"action": "answer", "text": "done"}])
    cfg = RunConfig(tasks=str(task_file(tmp_path, slow, fast)), concurrency=2, workers=1, retry_lost=3,
                    episode_timeout_s=2.5)
    t0 = time.monotonic()
    stats, records = await run_on(pool, cfg, make_policy("scripted"), site_server, tmp_path / "run")
    elapsed = time.monotonic() - t0
    by_id = {r["task"]["task_id"]: r for r in records}
    assert len(records) == 2 and stats.summary()["lost"] == 0
    assert by_id["fast"]["status"] == "success"
    rec = by_id["slow"]
    assert rec["status"] == "error" and rec["error"]["kind"] == "episode_timeout"
    assert "2.5 s" in rec["error"]["message"] and rec["attempts"] == 1  # never retried
    assert len(rec["steps"]) < 2
    assert elapsed < 8, elapsed  # the slow episode alone needs 12 s
    assert_released(worker, pool)
    # The context went back to the worker and serves the next episode.
    async with open_session(pool, fixture_url("click.html")) as (_s, obs, _f):
        assert obs.settle == "quiet"


async def test_no_wall_clock_cap_when_off(inproc, tmp_path: Path, fixture_url: Callable[[str], str],
                                          site_server: str) -> None:
    _, pool = inproc
    task = a_task("waits", fixture_url("click.html"),
                  solution=[{"action": "wait", "seconds": 1.0}, {"action": "answer", "text": "done"}])
    cfg = RunConfig(tasks=str(task_file(tmp_path, task)), concurrency=1, workers=1, episode_timeout_s=0)
    assert cfg.episode_timeout_s is None
    _, [rec] = await run_on(pool, cfg, make_policy("scripted"), site_server, tmp_path / "run")
    assert rec["status"] == "success"


# --- the policy-call cap ----------------------------------------------------------------------------------------

class NeverAnswersTestModel(LanguageModel):
    """A test stand-in for a model server that takes requests and never answers them."""

    name = "never-answers-test"

    def __init__(self) -> None:
        self.started = 0

    async def generate(self, request: ChatRequest) -> Generation:
        self.started += 1
        await asyncio.Event().wait()
        raise AssertionError("unreachable")


@pytest.mark.wallclock
async def test_a_policy_that_never_answers_costs_its_episode_only_the_cap(
        inproc, tmp_path: Path, fixture_url: Callable[[str], str], site_server: str) -> None:
    worker, pool = inproc
    model = NeverAnswersTestModel()
    async with ChatTestServer(model, served_model_name="m") as server:
        # The backend's own timeout and retries would take minutes; the step cap ends it in 1.5 s.
        policy = make_policy("openai", backend=BackendConfig(model="m", base_url=server.base_url, timeout_s=60.0))
        cfg = RunConfig(tasks=str(task_file(tmp_path, a_task("hangs", fixture_url("click.html")))),
                        concurrency=1, workers=1, policy_step_timeout_s=1.5)
        t0 = time.monotonic()
        _, [rec] = await run_on(pool, cfg, policy, site_server, tmp_path / "run")
        elapsed = time.monotonic() - t0
        assert len(server.received) == 1  # the request did reach the server
    assert rec["status"] == "error" and rec["error"]["kind"] == "policy_timeout"
    assert "1.5 s" in rec["error"]["message"] and rec["steps"] == [] and rec["attempts"] == 1
    assert 1.4 < elapsed < 8, elapsed
    assert model.started == 1
    assert_released(worker, pool)


class ArraysTestModel(LanguageModel):
    """A test stand-in for an in-process backend that hands back its token ids and log-probabilities as numpy
    arrays; for a task whose id says ``ids``, a string for the ids, and for one that says ``text``, a reply whose
    text is not a string (both: a backend's bug)."""

    name = "arrays-test"

    async def generate(self, request: ChatRequest) -> Generation:
        text: Any = ('<tool_call>{"name": "computer_use", "arguments": {"action": "answer", "text": "done"}}'
                     "</tool_call>")
        ids: Any = "7 8 9" if "ids" in request.request_id else np.array([7, 8, 9])
        if "text" in request.request_id:
            text = [text]
        return Generation(text, token_ids=ids, logprobs=np.array([-0.5, -0.25, -0.125]), policy_version=np.int64(2))


async def test_a_backends_arrays_are_recorded_as_numbers_and_a_malformed_reply_is_a_policy_error(
        inproc, tmp_path: Path, fixture_url: Callable[[str], str], site_server: str) -> None:
    # Written as text, a numpy value made the run directory unreadable, and so would a string for the ids; a reply
    # text that is not a string failed the episode as the engine's own error (internal).
    _, pool = inproc
    page = fixture_url("click.html")
    tasks = task_file(tmp_path, a_task("arrays", page), a_task("bad-ids", page), a_task("bad-text", page))
    cfg = RunConfig(tasks=str(tasks), concurrency=3, workers=1)
    _, records = await run_on(pool, cfg, AgentPolicy(ArraysTestModel(), AgentConfig()), site_server,
                              tmp_path / "run")
    by_task = {r["task"]["task_id"]: r for r in records}
    [step] = by_task["arrays"]["steps"]
    assert (step["token_ids"], step["logprobs"], step["policy_version"]) == ([7, 8, 9], [-0.5, -0.25, -0.125], 2)
    assert by_task["arrays"]["status"] == "success"
    for task_id, message in (("bad-ids", "token_ids must be a list of numbers, not str"),
                             ("bad-text", "returned a list as the reply's text")):
        error = by_task[task_id]["error"]
        assert by_task[task_id]["status"] == "error" and error["kind"] == "policy", error
        assert message in error["message"], error


# --- caps on page texts -----------------------------------------------------------------------------------------

async def test_huge_titles_and_element_lists_are_capped_in_records_and_prompts(
        inproc, tmp_path: Path, fixture_url: Callable[[str], str], site_server: str) -> None:
    _, pool = inproc
    limits = PageLimits(element_text_chars=20)  # the worker itself cuts element names at 80 characters
    policy = make_policy("simulated", agent=AgentConfig(interaction="som"), backend=BackendConfig(sim_speed=1000))
    tasks = task_file(tmp_path, a_task("huge", fixture_url("huge_texts.html")))
    cfg = RunConfig(tasks=str(tasks), concurrency=1, workers=1, page_limits=limits)
    _, [rec] = await run_on(pool, cfg, policy, site_server, tmp_path / "run")
    assert rec["status"] in ("success", "failure"), rec["error"]
    step = rec["steps"][0]
    assert step["truncated"] == ["element_text", "elements", "title", "url"]
    assert len(step["title"]) == limits.title_chars and step["title"].endswith(ELLIPSIS)
    assert len(step["url"]) == limits.url_chars and step["url"].startswith(fixture_url("huge_texts.html?q=xxx"))
    assert len(step["elements"]) == limits.elements
    # The worker listed (and drew) only as many as the engine keeps: no box on the frame without its line.
    assert "the pass stopped at its cap of 300;" in (step["note"] or ""), step["note"]
    assert [e[0] for e in step["elements"]] == list(range(1, limits.elements + 1))  # the first ones, in order
    assert all(len(e[2]) <= limits.element_text_chars for e in step["elements"])
    # The prompt was built from the same capped observation: one line per kept element, short names.
    texts = [p["text"] for m in step["messages"] if isinstance(m["content"], list)
             for p in m["content"] if p.get("type") == "text"]
    [listing] = [t for t in texts if t.startswith("Interactive elements")]
    lines = listing.splitlines()[1:]
    assert len(lines) == limits.elements and lines[-1].startswith(f"id: {limits.elements},")
    assert all(len(line) < 60 for line in lines)
    # Nothing of the 100 kB title or of the 5,000 names got through anywhere in the record.
    line = (tmp_path / "run" / "episodes.jsonl").read_text()
    leaked = "T" * (limits.title_chars + 1) in line or "x" * limits.url_chars in line  # (no pytest diff of 1 MB)
    assert not leaked
    per_step = len(line) / len(rec["steps"])
    # Capped: 300 elements in the record and in each of up to 5 prompt rounds (~80 kB a step); uncapped the
    # 5,000 elements alone would be over 1 MB a step.
    assert per_step < 150_000, per_step
    assert "title" in rec["final"]["truncated"]  # the last observation was capped as well


async def test_a_page_value_too_large_or_not_utf8_gets_an_answer_and_the_worker_carries_on(
        inproc, fixture_url: Callable[[str], str]) -> None:
    # Unsent, a reply over the message cap, or one that cannot be encoded, would leave the request to time out.
    worker, pool = inproc
    assert worker.ring is not None
    free = worker.ring.free_slots
    async with open_session(pool, fixture_url("huge_values.html")) as (session, obs, _frame):
        assert len(obs.title) == TITLE_CHARS and obs.title.startswith("\ufffdTTT")
        t0 = time.monotonic()
        with pytest.raises(BrowserOpError) as err:
            await session.evaluate(["window.huge()"])
        assert err.value.kind == ERR_TOO_LARGE and time.monotonic() - t0 < 10
        assert await session.evaluate(["document.title.length"]) == [10_000_001]  # the same episode goes on
    session = await pool.lease("huge-probe")
    try:
        with pytest.raises(BrowserOpError) as err:  # an observation too large: its screenshot's slot is freed
            await session.open(fixture_url("huge_values.html"), probe_js="window.huge()")
        assert err.value.kind == ERR_TOO_LARGE
    finally:
        await session.close()
    assert worker.ring.free_slots == free
    assert_released(worker, pool)


async def test_an_observation_abandoned_before_its_reply_gives_its_screenshot_slot_back(
        inproc, fixture_url: Callable[[str], str]) -> None:
    # A cancelled or timed-out request's reply still comes, with a screenshot in a slot of the worker's ring that
    # only the engine can release: left unreleased, each one would take a slot for good.
    worker, pool = inproc
    assert worker.ring is not None
    [handle] = pool.workers.values()
    async with open_session(pool, fixture_url("click.html")) as (session, _obs, frame):
        frame.release()
        await session.evaluate(["1"])  # carries the release
        free = worker.ring.free_slots
        for request in (lambda: session.act(BrowserAction("wait", seconds=0.3)), lambda: session.observe()) * 3:
            pending = asyncio.ensure_future(request())
            while not handle.futures:  # sent
                await asyncio.sleep(0.005)
            pending.cancel()
            with pytest.raises(asyncio.CancelledError):
                await pending
        deadline = time.monotonic() + 20
        while handle.abandoned and time.monotonic() < deadline:  # until the six late replies are in
            await asyncio.sleep(0.02)
        assert not handle.abandoned
        await session.evaluate(["1"])  # carries the releases
        assert worker.ring.free_slots == free
    assert_released(worker, pool)


# --- renderer memory ----------------------------------------------------------------------------------------------

async def test_a_context_over_the_heap_cap_is_replaced_not_reused(
        inproc, fixture_url: Callable[[str], str]) -> None:
    worker, pool = inproc
    # Start from a fresh context: an idle one may still hold what an earlier test's page allocated (a renderer
    # keeps it across a reset: what this cap is for).
    while worker.idle:
        await worker._drop_context(worker.idle.pop())
    discarded = worker.contexts_over_memory
    contexts, over = [], []
    for page in ["click.html", "click.html", "heap_hog.html", "click.html"]:
        async with open_session(pool, fixture_url(page)) as (s, obs, _f):
            assert obs.settle == "quiet"
            contexts.append(worker.episodes[s.episode_id].slot.context)
        over.append(worker.contexts_over_memory - discarded)
    light, again, hog, after = contexts
    assert again is light  # a light page's context is reused
    assert hog is light  # the hog got the reused context too ...
    assert after is not hog  # ... which was discarded after its episode: the next one gets a fresh context
    # Counted as each episode closed. Not the last one's: a renderer process (and its one V8 heap) may host pages of
    # several contexts, so under load the fresh context's page can land in the hog's process and read its heap.
    assert over[:3] == [0, 0, 1]
    assert hog not in [slot.context for slot in worker.idle]


class TreeMemory:
    """Samples the private resident memory of a process tree every 10 ms in a thread: its first reading and its
    peak (bytes)."""

    def __init__(self, root_pid: int) -> None:
        self.tree = ProcessTree(root_pid)
        self.first = self.peak = self._read()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)

    def _read(self) -> int:
        self.tree.refresh()
        return sum(private_resident_bytes(pid) for pid in self.tree.members)

    def _sample(self) -> None:
        while not self._stop.wait(0.01):
            self.peak = max(self.peak, self._read())

    def __enter__(self) -> TreeMemory:
        self._thread.start()
        return self

    def __exit__(self, *_exc: object) -> None:
        self._stop.set()
        self._thread.join()


@pytest_asyncio.fixture(loop_scope="session")
async def page_capped(tmp_path: Path) -> AsyncIterator[tuple[BrowserWorker, BrowserPool]]:
    """(worker, pool): a worker in this event loop whose renderers are held to PAGE_CAP_MIB while they run."""
    cfg = WorkerConfig(endpoint="", worker_id="page-capped", page_memory_mib=PAGE_CAP_MIB)
    async with inproc_pool(f"ipc://{tmp_path}/pool.sock", cfg) as wp:
        yield wp


async def test_a_page_eating_memory_is_ended_at_its_cap_and_the_next_episode_completes(
        page_capped, tmp_path: Path, fixture_url: Callable[[str], str], site_server: str) -> None:
    worker, pool = page_capped
    # Left alone, the hog's renderer grows by 1.5 GB in 2.4 s from 3 s after its load; the policy waits 8 s on it.
    hog = a_task("hog", fixture_url("memory_hog.html"), max_steps=10,
                 solution=[*[{"action": "wait", "seconds": 1.0}] * 8, {"action": "answer", "text": "done"}])
    # Beside it, an episode in its own context that outlives the hog's; after them, one more.
    neighbour = a_task("neighbour", fixture_url("click.html"), max_steps=6,
                       solution=[*[{"action": "wait", "seconds": 1.0}] * 3, {"action": "answer", "text": "done"}])
    after = a_task("after", fixture_url("click.html"), solution=[{"action": "answer", "text": "done"}])
    cfg = RunConfig(tasks=str(task_file(tmp_path, hog, neighbour, after)), concurrency=2, workers=1)
    pool.cfg.start_timeout_s = 10  # if the browser dies (below), an episode left without a worker ends within this
    with TreeMemory(worker._chromium_pid) as memory:
        stats, records = await run_on(pool, cfg, make_policy("scripted"), site_server, tmp_path / "run")
    by_id = {r["task"]["task_id"]: r for r in records}
    assert len(records) == 3 and stats.summary()["lost"] == 0
    growth = memory.peak - memory.first
    assert growth <= (PAGE_CAP_MIB + 128) << 20, f"the browser's tree grew by {growth / 2**20:.0f} MiB"
    assert worker.renderer_watch is not None and len(worker.renderer_watch.kills) == 1
    rec = by_id["hog"]
    if worker.browser_lost:
        # The cap acted (above); then Chromium's browser process itself died, under load, at the kill or as the
        # killed page's context closed (a null dereference in chromium-headless-shell: docs/security.md). Every
        # episode still ended with one record, the hog's an error (its kill's, or its lost browser's); that the
        # browser lives on, asserted next, is then Chromium's to break, not the engine's.
        assert rec["status"] == "error" and rec["error"]["kind"] in ("page_memory", "worker_lost"), rec["error"]
        pytest.xfail("Chromium's browser process died after the watch ended its renderer")
    assert rec["status"] == "error" and rec["error"]["kind"] == "page_memory", rec["error"]
    assert f"over the {PAGE_CAP_MIB} MiB page cap" in rec["error"]["message"]
    # The browser lived on: the episode beside the hog's went on, and the next one ran on this worker.
    assert [by_id[t]["status"] for t in ("neighbour", "after")] == ["success"] * 2, [r["error"] for r in records]
    assert_released(worker, pool)


async def test_a_browser_over_its_memory_cap_is_recycled_between_episodes(tmp_path: Path, sites: str) -> None:
    tasks = subset(tmp_path, per_site=1, max_len=4)
    # Checked every 0.1 s, the browser is over its cap before the first episode ends, so episodes are left for the
    # recycled browser. At 1 s this run (8 short episodes, ~2 s) could end first, the recycle cut by the shutdown.
    cfg = RunConfig(tasks=str(tasks), output_dir=str(tmp_path / "runs"), concurrency=2, workers=1, episodes=8,
                    worker=WorkerConfig(endpoint="", browser_memory_mib=1, memory_check_s=0.1))
    stats, run_dir = await asyncio.wait_for(run(cfg, make_policy("scripted"), sites), 240)
    records = read_records(run_dir)
    assert len(records) == 8 and stats.summary()["lost"] == 0
    assert {r["status"] for r in records} == {"success"}, [r["error"] for r in records if r["error"]]
    log = (run_dir / "workers.log").read_text()
    assert "draining, then recycling it" in log
    assert "browser recycled" in log
    assert "browser recycle failed" not in log


# --- credentials in URLs --------------------------------------------------------------------------------------------

SECRETS = ["s3cr3tPW", "tok-abc-123", "sk-judge-999", "sk-env-777", "b4seP4ss"]


async def test_credentials_in_urls_never_reach_the_run_directory(
        tmp_path: Path, site_server: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", "sk-env-777")
    host = site_server.split("://", 1)[1]
    website = f"http://alice:s3cr3tPW@{host}/fixtures/click.html?token=tok-abc-123&page=1"
    # The page must get the real token: the check reads it from the page (length 11), never naming it.
    check = {"kind": "js", "expr": "new URLSearchParams(location.search).get('token').length === 11"}
    tasks = task_file(tmp_path, a_task("secret", website, max_steps=2, check=check,
                                       solution=[{"action": "answer", "text": "done"}]))
    cfg = RunConfig(tasks=str(tasks), output_dir=str(tmp_path / "runs"), concurrency=1, workers=1, reward="program")
    # What the command line records beside the config: the model backend's and the judge's settings.
    manifest = {"backend": asdict(BackendConfig(base_url="http://bob:b4seP4ss@127.0.0.1:9/v1?api_key=sk-judge-999")),
                "judge": asdict(JudgeConfig(base_url="http://127.0.0.1:9/v1?key=sk-judge-999"))}
    stats, run_dir = await run(cfg, make_policy("scripted"), site_server, manifest=manifest)
    [rec] = read_records(run_dir)
    assert rec["status"] == "success", rec  # the engine navigated with the real URL
    assert rec["task"]["website"] == f"http://***@{host}/fixtures/click.html?token=***&page=1"
    assert "token=***" in rec["steps"][0]["url"] and "page=1" in rec["steps"][0]["url"]
    for name in ["episodes.jsonl", "manifest.json"]:
        text = (run_dir / name).read_text()
        for secret in SECRETS:
            assert secret not in text, (name, secret)
    manifest = json.loads((run_dir / "manifest.json").read_text())
    assert manifest["config"]["backend"]["base_url"] == "http://***@127.0.0.1:9/v1?api_key=***"
    assert manifest["config"]["backend"]["api_key_env"] == "OPENAI_API_KEY"


async def test_error_messages_have_their_urls_masked(inproc, tmp_path: Path, site_server: str) -> None:
    _, pool = inproc
    # A scheme the worker refuses: the open fails with an error message that quotes the URL.
    website = "file:///etc/hostname?token=tok-abc-123"
    cfg = RunConfig(tasks=str(task_file(tmp_path, a_task("bad", website))), concurrency=1, workers=1)
    _, [rec] = await run_on(pool, cfg, make_policy("scripted"), site_server, tmp_path / "run")
    assert rec["status"] == "error"
    assert "tok-abc-123" not in json.dumps(rec)
    assert "file:///etc/hostname?token=***" in rec["error"]["message"]
