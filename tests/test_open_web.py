"""Websites as first-class, on a local open web (tests/openweb.py: several host names on one loopback server):
per-domain limits on concurrent episodes, the blocklist fed by block pages, skipped tasks with their records,
the main document's HTTP status in every step, and the blocklist command."""

from __future__ import annotations

import asyncio
import json
import random
import time
from collections import Counter, defaultdict
from collections.abc import Iterator
from email.utils import formatdate
from pathlib import Path
from urllib.parse import quote

import pytest
from click.testing import CliRunner

from browserpool.config import CHROMIUM_FLAGS, WorkerConfig
from browserpool.request_rules import RequestRules
from browserpool.upstream import parse_proxy
from cli.tasks import tasks as tasks_cli
from engine.agent.actions import AgentAction
from engine.agent.model_api import ChatRequest, Generation, LanguageModel
from engine.agent.policy_api import Policy, PolicyReply, PolicyRequest
from engine.clients.runner import run
from engine.core.config import RunConfig
from engine.core.core import EngineCore
from engine.core.site_guard import SiteGuard
from engine.rewards.judge import JudgeConfig
from engine.store.run_dir import read_records
from engine.tasks.loading import load_tasks
from engine.web.blocklist import Blocklist, block_reason, retry_after_s
from engine.web.domains import DomainPacer, DomainQueue, domain_of, is_local
from policy.registry import make_judge
from tests.chat_test_server import ChatTestServer
from tests.conftest import SharedPools, SmallDisk
from tests.openweb import OpenWeb, UpstreamTestProxy


class AnswerPolicy(Policy):
    """Answers at once: an episode is its start page and one step."""

    name = "answer"

    async def act(self, request: PolicyRequest) -> PolicyReply:
        return PolicyReply(AgentAction("answer", text="done"), text="answer")


@pytest.fixture(scope="module")
def openweb() -> Iterator[OpenWeb]:
    with OpenWeb() as server:
        yield server


def task(i: int, url: str) -> dict:
    return {"task_id": f"t{i:03d}", "task_name": "Read the page.", "website": url, "difficulty": 1}


def write_tasks(path: Path, tasks: list[dict]) -> Path:
    path.write_text("".join(json.dumps(t) + "\n" for t in tasks))
    return path


def config(tmp_path: Path, tasks: Path, openweb: OpenWeb, **kw: object) -> RunConfig:
    worker = WorkerConfig(endpoint="", net=openweb.net)
    return RunConfig(tasks=str(tasks), output_dir=str(tmp_path / "runs"), workers=1, worker=worker, telemetry=None,
                     reward="program", **kw)  # type: ignore[arg-type]


def max_overlap(intervals: list[tuple[float, float]]) -> int:
    events = sorted([(start, 1) for start, _ in intervals] + [(end, -1) for _, end in intervals])
    running = peak = 0
    for _, delta in events:
        running += delta
        peak = max(peak, running)
    return peak


@pytest.mark.asyncio(loop_scope="session")
async def test_no_site_gets_more_episodes_at_once_than_its_limit(tmp_path: Path, openweb: OpenWeb,
                                                                  pools: SharedPools) -> None:
    hosts = ("shop.test", "news.test", "wiki.test", "travel.test")
    tasks = write_tasks(tmp_path / "tasks.jsonl", [task(i, openweb.url(hosts[i % 4], f"/p{i}")) for i in range(64)])
    cfg = config(tmp_path, tasks, openweb, concurrency=32, domain_limit=8)
    stats, run_dir = await run(cfg, AnswerPolicy(), None, pool=await pools.for_run(cfg))
    records = read_records(run_dir)
    assert len(records) == 64 and not [r for r in records if r["status"] == "error"]
    by_host: dict[str, list[tuple[float, float]]] = defaultdict(list)
    for r in records:
        by_host[domain_of(r["task"]["website"])].append((r["started_at"], r["started_at"] + r["duration_s"]))
        assert r["steps"][0]["http_status"] == 200
    peaks = {host: max_overlap(spans) for host, spans in by_host.items()}
    # Measured from the records: never more than 8 on a site at once, and the 32 slots were shared out.
    assert set(peaks) == set(hosts) and max(peaks.values()) <= 8, peaks
    assert min(peaks.values()) >= 4, peaks


@pytest.mark.asyncio(loop_scope="session")
async def test_block_pages_put_their_site_on_the_blocklist_and_its_tasks_are_skipped(
        tmp_path: Path, openweb: OpenWeb, pools: SharedPools) -> None:
    plan = ["blocked.test"] * 3 + ["limited.test"] * 2 + ["challenge.test"] * 2 + ["shop.test"] * 2
    tasks = write_tasks(tmp_path / "tasks.jsonl", [task(i, openweb.url(h, f"/p{i}")) for i, h in enumerate(plan)])
    hits_before = openweb.hits.copy()
    # One episode per site at a time: the first one on a site meets its block page before the next one starts.
    cfg = config(tmp_path, tasks, openweb, concurrency=4, domain_limit=1)
    stats, run_dir = await run(cfg, AnswerPolicy(), None, pool=await pools.for_run(cfg))
    records = read_records(run_dir)
    assert len(records) == len(plan)
    outcome: dict[str, Counter[str]] = defaultdict(Counter)
    for r in records:
        outcome[domain_of(r["task"]["website"])][(r["error"] or {}).get("kind", r["status"])] += 1
        if r["error"] is not None and r["error"]["kind"] in ("blocked", "blocked_domain"):
            # Blocked, not an error (before: status error) and no reward: the site refused the agent.
            assert r["status"] == "blocked" and r["reward"] is None, r
    summary = stats.summary()
    assert (summary["blocked"], summary["errors"], summary["unrewarded"]) == (7, 0, 2)  # shop.test: no checks
    assert outcome["blocked.test"] == {"blocked": 1, "blocked_domain": 2}
    assert outcome["limited.test"] == {"blocked": 1, "blocked_domain": 1}
    assert outcome["challenge.test"] == {"blocked": 1, "blocked_domain": 1}
    assert "blocked" not in outcome["shop.test"] and "blocked_domain" not in outcome["shop.test"]
    # A skipped task never loaded its site; the record says why.
    assert openweb.hits["blocked.test"] - hits_before["blocked.test"] == 1
    skipped = next(r for r in records if (r["error"] or {}).get("kind") == "blocked_domain")
    assert "on the blocklist until" in skipped["error"]["message"]
    blocklist = Blocklist(run_dir / "blocklist.json")
    reasons = {e.domain: e.reason for e in blocklist.entries()}
    assert set(reasons) == {"blocked.test", "limited.test", "challenge.test"}
    assert reasons["blocked.test"].startswith("HTTP 403") and reasons["limited.test"].startswith("HTTP 429")
    # The rate limiter said when to come back (Retry-After: 120): its site is skipped that long, not 12 hours.
    span = {e.domain: e.until - e.added for e in blocklist.entries()}
    assert span["limited.test"] == pytest.approx(120, abs=1) and span["blocked.test"] == pytest.approx(12 * 3600)
    assert "Retry-After 120 s" in reasons["limited.test"]

    cli = CliRunner()
    shown = cli.invoke(tasks_cli, ["blocklist", str(run_dir)])
    assert shown.exit_code == 0 and "blocked.test" in shown.output and "limited.test" in shown.output
    cleared = cli.invoke(tasks_cli, ["blocklist", str(run_dir), "--clear", "blocked.test"])
    assert cleared.exit_code == 0 and "removed 1 entry" in cleared.output
    assert {e.domain for e in Blocklist(run_dir / "blocklist.json").entries()} == {"limited.test", "challenge.test"}


class BlockingJudgeTestModel(LanguageModel):
    """A test stand-in for a judge model that sees a block page in every episode."""

    name = "blocking-judge-test"

    async def generate(self, request: ChatRequest) -> Generation:
        return Generation("A login wall the agent cannot pass.\nVERDICT: YES", finish_reason="stop")


@pytest.mark.asyncio(loop_scope="session")
async def test_the_judges_blocked_verdict_ends_blocked_and_puts_the_site_on_the_blocklist(
        tmp_path: Path, openweb: OpenWeb, pools: SharedPools) -> None:
    judged = {**task(0, openweb.url("news.test", "/p0")),
              "evaluator_reference": [{"id": 1, "description": "d", "facts": ["the answer names the headline"]}]}
    tasks = write_tasks(tmp_path / "tasks.jsonl", [judged])
    async with ChatTestServer(BlockingJudgeTestModel(), served_model_name="judge") as server:
        judge = make_judge(JudgeConfig(base_url=server.base_url, model="judge", backoff_s=0.01))
        cfg = config(tmp_path, tasks, openweb, concurrency=1)
        cfg.reward = "auto"  # the task has no checks: the judge rewards it
        stats, run_dir = await run(cfg, AnswerPolicy(), None, judge=judge, pool=await pools.for_run(cfg))
    [record] = read_records(run_dir)
    # Before, a reward of 0.0 and status failure: a trainer trained on it.
    assert record["status"] == "blocked" and record["reward"]["value"] is None and record["reward"]["blocked"]
    assert record["error"]["kind"] == "judge_blocked" and stats.summary()["blocked"] == 1
    [entry] = Blocklist(run_dir / "blocklist.json").entries()
    assert (entry.domain, entry.source) == ("news.test", "judge")


@pytest.mark.asyncio(loop_scope="session")
async def test_failed_loads_are_observations_the_episode_goes_on_with(tmp_path: Path, openweb: OpenWeb) -> None:
    cases = {  # start page -> the outcome its step must record
        openweb.url("gone.invalid"): "dns",
        f"http://closed.test:{openweb.closed_port}/": "connect",
        f"https://secure.test:{openweb.tls_port}/": "tls",
        openweb.url("shop.test", "/missing"): "http_error",
        openweb.url("shop.test", "/broken"): "http_error",
        openweb.url("shop.test", "/download"): "download",
    }
    tasks = write_tasks(tmp_path / "tasks.jsonl", [task(i, url) for i, url in enumerate(cases)])
    cfg = config(tmp_path, tasks, openweb, concurrency=6)
    cfg.worker.open_backoff_s = 0.05  # the start page's retries, quickly
    broken_before = openweb.hits["shop.test"]
    _, run_dir = await run(cfg, AnswerPolicy(), None)
    records = {r["task"]["website"]: r for r in read_records(run_dir)}
    assert len(records) == len(cases)
    for url, kind in cases.items():
        r = records[url]
        # Not an engine error: the episode went on, the policy saw the browser's page, the step says what it was.
        assert r["status"] != "error" and r["steps"], (url, r["error"])
        load = r["steps"][0].get("load")
        assert load is not None and load["kind"] == kind, (url, load)
    assert records[openweb.url("shop.test", "/missing")]["steps"][0]["load"]["status"] == 404
    assert records[f"https://secure.test:{openweb.tls_port}/"]["steps"][0]["load"]["error"].startswith("net::ERR_CERT")
    # Transient failures of a start page were tried again (twice), final ones were not.
    assert records[openweb.url("shop.test", "/broken")]["steps"][0]["load"]["status"] == 500
    assert openweb.hits["shop.test"] - broken_before == 1 + 3 + 1  # missing once, broken 3 times, download once


@pytest.mark.asyncio(loop_scope="session")
async def test_an_https_site_with_a_trusted_certificate_loads(
        tmp_path: Path, openweb: OpenWeb) -> None:
    url = f"https://secure.test:{openweb.trusted_tls_port}/"
    tasks = write_tasks(tmp_path / "tasks.jsonl", [task(0, url)])
    cfg = config(tmp_path, tasks, openweb, concurrency=1)
    cfg.worker.chromium_flags = [*CHROMIUM_FLAGS, f"--ignore-certificate-errors-spki-list={openweb.trusted_spki}"]
    before = openweb.hits["secure.test"]
    _, run_dir = await run(cfg, AnswerPolicy(), None)
    [record] = read_records(run_dir)
    step = record["steps"][0]
    assert step["url"] == url and step["title"] == "secure.test" and step["http_status"] == 200, step
    assert "load" not in step and openweb.hits["secure.test"] == before + 1


@pytest.mark.asyncio(loop_scope="session")
async def test_pages_go_through_an_upstream_proxy_with_named_credentials(
        tmp_path: Path, openweb: OpenWeb, monkeypatch: pytest.MonkeyPatch) -> None:
    password = "s3cret-proxy-pass-7781"
    monkeypatch.setenv("WEBGYM_TEST_PROXY_USER", "agent")
    monkeypatch.setenv("WEBGYM_TEST_PROXY_PASS", password)  # a name the workers' environment would drop
    with UpstreamTestProxy("agent", password) as proxy:
        tasks = write_tasks(tmp_path / "tasks.jsonl", [task(i, openweb.url("news.test", f"/p{i}")) for i in range(3)])
        cfg = config(tmp_path, tasks, openweb, concurrency=3)
        # The first proxy is down: the contexts set it aside and go through the second.
        cfg.worker.proxies = [f"http://127.0.0.1:{openweb.closed_port}",
                              f"http://$WEBGYM_TEST_PROXY_USER:$WEBGYM_TEST_PROXY_PASS@127.0.0.1:{proxy.port}"]
        _, run_dir = await run(cfg, AnswerPolicy(), None)
    records = read_records(run_dir)
    assert len(records) == 3 and all(r["steps"][0].get("http_status") == 200 for r in records), records[0]
    assert proxy.tunnels >= 3 and proxy.refused == 0
    # The credentials are named, never written: not in the manifest, the logs or the records.
    for path in run_dir.rglob("*"):
        if path.is_file() and path.suffix in (".json", ".jsonl", ".log", ".txt"):
            assert password not in path.read_text(errors="replace"), path


@pytest.mark.asyncio(loop_scope="session")
async def test_request_rules_refuse_ads_and_trackers_in_the_worker(tmp_path: Path, openweb: OpenWeb) -> None:
    rules = tmp_path / "rules.txt"
    rules.write_text("! EasyList domain rules\n||ads.test^$third-party\n##.ad-banner\n"
                     "# a hosts file line\n0.0.0.0 tracker.test\n")
    tasks = write_tasks(tmp_path / "tasks.jsonl", [task(0, openweb.url("news.test", "/with-ads"))])
    before = openweb.hits.copy()
    cfg = config(tmp_path, tasks, openweb, concurrency=1)
    cfg.worker.request_rules = [str(rules)]
    _, run_dir = await run(cfg, AnswerPolicy(), None)
    [record] = read_records(run_dir)
    assert record["status"] != "error" and record["steps"][0]["http_status"] == 200
    assert openweb.hits["news.test"] - before["news.test"] == 1  # the page itself loaded
    assert openweb.hits["ads.test"] == before["ads.test"] and openweb.hits["tracker.test"] == before["tracker.test"]


@pytest.mark.asyncio(loop_scope="session")
@pytest.mark.parametrize("consent", ["off", "reject"])
async def test_a_consent_wall_is_answered_only_when_asked_and_the_record_says_so(
        tmp_path: Path, openweb: OpenWeb, consent: str) -> None:
    tasks = write_tasks(tmp_path / "tasks.jsonl", [task(0, openweb.url("news.test", "/consent"))])
    cfg = config(tmp_path, tasks, openweb, concurrency=1)
    cfg.worker.consent = consent
    cfg.worker.user_agent = "webgym-engine-test/1.0"
    _, run_dir = await run(cfg, AnswerPolicy(), None)
    [record] = read_records(run_dir)
    events = [e for e in record.get("open_events") or [] if e["kind"] == "consent"]
    if consent == "off":  # the model sees the wall, as a person would
        assert record["steps"][0]["title"] == "walled" and not events
    else:
        assert record["steps"][0]["title"] == "rejected"
        assert events and events[0]["detail"] == "reject: OneTrust: #onetrust-reject-all-handler"
    assert openweb.user_agents[-1] == "webgym-engine-test/1.0"


def test_request_rules_read_hosts_files_and_easylist_domain_rules() -> None:
    rules = RequestRules()
    rules.add_lines(["0.0.0.0 ads.example", "127.0.0.1 localhost", "||tracker.example^", "||cdn.example^$third-party",
                     "||page.example^$domain=news.example", "/banner/*", "##.ad", "@@||ok.example^", "plain.example"])
    assert rules.blocks("ads.example") == "ads.example" and rules.blocks("x.y.tracker.example") == "tracker.example"
    assert rules.blocks("cdn.example") and rules.blocks("plain.example")
    assert rules.blocks("page.example") is None and rules.blocks("localhost") is None
    assert rules.blocks("example") is None and rules.blocks("notads.example") is None
    assert rules.ignored == 4  # the rules it does not apply are counted, not guessed at


def test_proxy_urls_name_their_credentials() -> None:
    env = {"U": "agent", "P": "pw"}
    assert parse_proxy("http://$U:$P@proxy.example:3128", env).authorization == "Basic YWdlbnQ6cHc="
    assert parse_proxy("http://proxy.example:3128", env).authorization is None
    with pytest.raises(ValueError, match="never write them out"):
        parse_proxy("http://agent:pw@proxy.example:3128", env)
    with pytest.raises(ValueError, match="not set"):
        parse_proxy("http://$U:$MISSING@proxy.example:3128", env)
    with pytest.raises(ValueError, match="HOST:PORT"):
        parse_proxy("socks5://proxy.example:1080", env)


@pytest.mark.wallclock
@pytest.mark.asyncio(loop_scope="session")
async def test_a_redirect_chain_and_a_script_that_never_loads_end_in_usable_pages(
        tmp_path: Path, openweb: OpenWeb) -> None:
    redirect, slow = openweb.url("shop.test", "/redirect"), openweb.url("news.test", "/slow-scripts")
    tasks = write_tasks(tmp_path / "tasks.jsonl", [task(0, redirect), task(1, slow)])
    cfg = config(tmp_path, tasks, openweb, concurrency=2)
    cfg.worker.open_timeout_s = cfg.worker.settle_timeout_s = 3.0  # the hanging script: nothing waits longer
    _, run_dir = await run(cfg, AnswerPolicy(), None)
    records = {r["task"]["website"]: r for r in read_records(run_dir)}
    landed = records[redirect]["steps"][0]
    # Through the tracker and back: the page the policy saw is where the chain ended.
    assert landed["url"] == openweb.url("shop.test", "/landed") and landed["http_status"] == 200
    hung = records[slow]
    assert hung["status"] != "error" and hung["steps"][0]["title"] == "news.test"  # the document is usable
    assert hung["duration_s"] < 30  # capped by the settle timeout, not the script


class ClickPolicy(Policy):
    """Clicks the middle of the start page's top half (where the opener pages put their link or button), then
    answers."""

    name = "click"

    async def act(self, request: PolicyRequest) -> PolicyReply:
        if request.step == 0:
            return PolicyReply(AgentAction("left_click", x=640, y=150), text="click")
        return PolicyReply(AgentAction("answer", text="done"), text="answer")


@pytest.mark.asyncio(loop_scope="session")
async def test_new_tabs_and_popups_to_other_sites_stay_in_the_episodes_tab(tmp_path: Path, openweb: OpenWeb,
                                                                           pools: SharedPools) -> None:
    opened = {path: openweb.url(host, "/opened") for path, host in
              (("/new-tab", "news.test"), ("/popup", "wiki.test"), ("/popup-onload", "travel.test"))}
    starts = {path: openweb.url("shop.test", f"{path}?to={quote(to, safe='')}") for path, to in opened.items()}
    tasks = write_tasks(tmp_path / "tasks.jsonl", [task(i, url) for i, url in enumerate(starts.values())])
    cfg = config(tmp_path, tasks, openweb, concurrency=3)
    _, run_dir = await run(cfg, ClickPolicy(), None, pool=await pools.for_run(cfg))
    records = {r["task"]["website"]: r for r in read_records(run_dir)}
    assert len(records) == 3 and all(r["status"] != "error" for r in records.values())

    def after_click(path: str) -> dict:
        return records[starts[path]]["steps"][0]

    # A target=_blank link opens in the episode's tab, as the original has it.
    assert after_click("/new-tab")["result"]["url"] == opened["/new-tab"]
    # A window the click opened becomes the episode's page; the step says so.
    popup = after_click("/popup")
    assert popup["result"]["url"] == opened["/popup"]
    assert {"kind": "popup", "url": opened["/popup"], "detail": "adopted"} in popup["events"]
    # A window the page opened by itself is closed: the tab stays where it was, the record says what was closed.
    onload = records[starts["/popup-onload"]]
    events = (onload.get("open_events") or []) + (onload["steps"][0].get("events") or [])
    assert {"kind": "popup", "url": opened["/popup-onload"], "detail": "closed"} in events
    assert onload["steps"][0]["url"] == starts["/popup-onload"]


@pytest.mark.asyncio(loop_scope="session")
async def test_actions_on_one_site_keep_to_its_rate(tmp_path: Path, openweb: OpenWeb,
                                                    monkeypatch: pytest.MonkeyPatch, pools: SharedPools) -> None:
    # When the engine sends each action to the site (the moment its pacer lets it go): the limit is the engine's.
    sent: list[float] = []
    paced = SiteGuard.pace

    async def spy(guard: SiteGuard, url: str) -> float:
        waited = await paced(guard, url)
        if domain_of(url) == "wiki.test":
            sent.append(time.monotonic())
        return waited

    monkeypatch.setattr(SiteGuard, "pace", spy)
    before = len(openweb.hit_times["wiki.test"])
    tasks = write_tasks(tmp_path / "tasks.jsonl", [task(i, openweb.url("wiki.test", f"/r{i}")) for i in range(12)])
    cfg = config(tmp_path, tasks, openweb, concurrency=8, domain_limit=8, domain_rate=4.0)
    _, run_dir = await run(cfg, AnswerPolicy(), None, pool=await pools.for_run(cfg))
    records = read_records(run_dir)
    assert len(records) == 12 and all(r["status"] != "error" for r in records)
    assert len(sent) == 12  # the opens (an answer sends nothing to the site)
    # At most a burst of 4 plus 4 per second in any span of the sends (a timer may fire a millisecond early), while
    # 8 episodes could have loaded at once.
    for i, t0 in enumerate(sent):
        for j in range(i + 1, len(sent)):
            assert j - i + 1 <= 4 + 4 * (sent[j] - t0 + 0.002), (i, j, sent[j] - t0)
    assert sent[-1] - sent[0] >= (12 - 4) / 4 - 0.01
    # The site: every load came after the action that caused it, so by any moment it had no more loads than the
    # engine had sent (a slow browser may bunch them later, never bring them forward).
    hits = openweb.hit_times["wiki.test"][before:]
    assert len(hits) == 12
    assert all(h >= s for h, s in zip(sorted(hits), sent, strict=True)), (hits, sent)
    assert any(r["timings_ms"].get("pace_ms") for r in records)  # a wait is in its record


def test_local_sites_are_the_users_own_and_have_no_limits() -> None:
    for url in ("http://127.0.0.1:8000/a", "http://localhost:3000/", "http://10.1.2.3/", "http://[::1]:80/",
                "http://192.168.0.7/shop", "http://app.localhost/"):
        assert is_local(url), url
    for url in ("https://shop.test/", "https://8.8.8.8/", "https://example.com/", "not a url", "http://[bad/"):
        assert not is_local(url), url


def test_the_pacer_lets_a_burst_through_then_spaces_actions() -> None:
    pacer = DomainPacer(rate=4.0)
    assert [pacer.delay("a.test", now=10.0) for _ in range(6)] == [0.0, 0.0, 0.0, 0.0, 0.25, 0.5]
    assert pacer.delay("b.test", now=10.0) == 0.0  # sites do not share a budget
    assert pacer.delay("a.test", now=20.0) == 0.0  # an idle site gets its burst back
    assert DomainPacer(rate=0).delay("a.test") == 0.0 and DomainPacer(rate=0.5).delay("c.test", now=0.0) == 0.0
    with pytest.raises(ValueError):
        DomainPacer(rate=-1)


def test_retry_after_is_read_in_both_forms_and_kept_within_bounds() -> None:
    now = 1_800_000_000.0
    assert retry_after_s("120") == 120.0
    assert retry_after_s("5") == 60.0  # at least a minute
    assert retry_after_s("9" * 400) == 7 * 86400.0  # a huge number is a week, not an overflow
    assert retry_after_s(formatdate(now + 3600, usegmt=True), now=now) == pytest.approx(3600)
    for junk in (None, "", "soon", "-5", "1e9", "Wed, 99 Foo 2026"):
        assert retry_after_s(junk, now=now) is None, junk


def test_block_pages_are_told_from_ordinary_ones() -> None:
    assert block_reason(403, "Forbidden") == "HTTP 403 on the start page"
    assert block_reason(429, "") == "HTTP 429 on the start page"
    assert block_reason(200, "Attention Required! | Cloudflare") is not None
    assert block_reason(200, "Welcome to the shop") is None
    assert block_reason(None, "") is None and block_reason(404, "Not found") is None


@pytest.mark.asyncio(loop_scope="session")
async def test_a_shared_blocklist_broken_mid_run_or_unwritable_stops_no_episode(
        tmp_path: Path, openweb: OpenWeb, small_disk: SmallDisk, caplog: pytest.LogCaptureFixture,
        pools: SharedPools) -> None:
    # Before, a shared blocklist that another process or a hand edit broke mid-run raised in every runner that next
    # checked a site, and each such runner died: the run waited for records that never came. One that could not be
    # written (a full disk) did the same.
    plan = ["blocked.test"] * 3 + ["shop.test"] * 3
    tasks = write_tasks(tmp_path / "tasks.jsonl", [task(i, openweb.url(h, f"/p{i}")) for i, h in enumerate(plan)])
    shared = tmp_path / "shared" / "blocklist.json"
    shared.parent.mkdir()
    shared.write_text('{"domains": {}}\n')

    def break_it(_core: EngineCore, _run_dir: Path) -> None:
        shared.write_text("{not json")

    cfg = config(tmp_path, tasks, openweb, concurrency=4, domain_limit=1, blocklist=str(shared))
    _, run_dir = await asyncio.wait_for(run(cfg, AnswerPolicy(), None, on_start=break_it,
                                                 pool=await pools.for_run(cfg)), 120)
    kinds = Counter((r["error"] or {}).get("kind", r["status"]) for r in read_records(run_dir))
    assert sum(kinds.values()) == len(plan) and kinds["blocked"] == 1 and kinds["blocked_domain"] == 2, kinds
    assert any("not a blocklist file" in r.getMessage() for r in caplog.records)

    small_disk.fill()
    full = small_disk.path / "blocklist.json"  # a blocklist on a disk with no room left
    cfg = config(tmp_path / "again", tasks, openweb, concurrency=4, domain_limit=1, blocklist=str(full))
    _, run_dir = await asyncio.wait_for(run(cfg, AnswerPolicy(), None, pool=await pools.for_run(cfg)), 120)
    kinds = Counter((r["error"] or {}).get("kind", r["status"]) for r in read_records(run_dir))
    assert kinds["blocked"] == 1 and kinds["blocked_domain"] == 2, kinds  # the entry held in memory
    assert any("could not be written" in r.getMessage() for r in caplog.records)


def test_blocklist_entries_expire_and_survive_a_restart(tmp_path: Path) -> None:
    path = tmp_path / "shared" / "blocklist.json"
    now = time.time()
    first = Blocklist(path, ttl_s=3600)
    first.add("shop.test", "HTTP 403 on the start page", "page", now=now)
    again = Blocklist(path, ttl_s=3600)  # another run reading the shared file
    assert again.blocked("shop.test", now=now + 3599) is not None
    assert again.blocked("shop.test", now=now + 3601) is None
    assert again.blocked("news.test", now=now) is None
    path.write_text("not json")
    with pytest.raises(ValueError, match="not a blocklist file"):
        Blocklist(path)


@pytest.mark.asyncio(loop_scope="session")
async def test_a_thousand_tasks_over_fifty_sites_keep_every_limit_and_skip_blocked_sites(tmp_path: Path) -> None:
    """The WebGym-schema loader, the blocklist and the domain queue together, as the engine's runners use them
    (EngineCore._runner: take an episode, skip it when its site is blocked, run it, then free its site's slot)."""
    rng = random.Random(7)
    domains = [f"site{i:02d}.example" for i in range(50)]
    # One site in five tasks: from the first wave of runners on, more of its tasks are ready than its cap allows.
    rows = [task(i, f"https://{'www.' if i % 3 == 0 else ''}{'busy.example' if i % 5 == 0 else rng.choice(domains)}"
                    f"/item/{i}") for i in range(1000)]
    loaded = load_tasks(write_tasks(tmp_path / "tasks.jsonl", rows))
    blocklist = Blocklist(tmp_path / "blocklist.json")
    for d in domains[:5]:
        blocklist.add(d, "HTTP 403 on the start page", "page")
    queue: DomainQueue = DomainQueue(lambda t: domain_of(t.website), limit=8)
    queue.extend(loaded)
    running: Counter[str] = Counter()
    peak: Counter[str] = Counter()
    started: list[str] = []
    skipped: list[str] = []

    all_in = asyncio.Event()

    async def runner() -> None:  # as the engine's: forever, until cancelled
        while True:
            t = await queue.get()
            domain = domain_of(t.website)
            try:
                if blocklist.blocked(domain):
                    skipped.append(domain)
                    continue
                running[domain] += 1
                peak[domain] = max(peak[domain], running[domain])
                started.append(domain)
                await asyncio.sleep(rng.random() * 0.002)
                running[domain] -= 1
            finally:
                queue.done(t)
                if len(started) + len(skipped) == len(loaded):
                    all_in.set()

    runners = [asyncio.ensure_future(runner()) for _ in range(64)]
    try:
        await asyncio.wait_for(all_in.wait(), 60)
    finally:
        for r in runners:
            r.cancel()
        await asyncio.gather(*runners, return_exceptions=True)
    assert len(started) + len(skipped) == 1000
    assert max(peak.values()) <= 8 and max(queue.peak.values()) <= 8
    assert not set(started) & set(domains[:5]) and set(skipped) == set(domains[:5])
    assert peak["busy.example"] == 8  # the cap, not the queue, held them back
