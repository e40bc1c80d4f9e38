"""The run report (``webgym-engine view``): built from a real run of the bundled sites and checked in the
project's headless Chromium through Playwright; plus a synthetic 10,000-episode run for size."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio
from click.testing import CliRunner
from playwright.async_api import Browser, Page, async_playwright

from browserpool.config import CHROMIUM_FLAGS, DEFAULT_CHROMIUM
from engine.store.run_dir import read_records
from viewer.cli import serve, view
from viewer.report import CHUNK, build_report, index_row, summarize
from viewer.screenshot import export_screenshots

pytestmark = pytest.mark.asyncio(loop_scope="session")

MARKED = ("left_click", "type", "hover", "select")  # actions drawn as a circle at their point
SOM_ELEMENTS = [[1, "a", "Home", 10, 20, 100, 30], [2, "button", "Search", 640, 400, 80, 24]]  # CSS px



@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def real_run(tmp_path_factory: pytest.TempPathFactory, engine_run: Path) -> Path:
    """A real run: scripted episodes (successes), then the same run resumed with the random policy for a few
    more (failures, scrolls, typing), plus two records edited into an error and a judge-pending one."""
    run_dir = Path(shutil.copytree(engine_run, tmp_path_factory.mktemp("viewer") / "run"))
    # What these policies never produce, edited into copies of real records (real steps and screenshots):
    # an error with a parse error and SoM elements, a pending judgement, and a judged episode with evidence.
    records = read_records(run_dir)
    longest = max(records, key=lambda r: len(r["steps"]))
    extra = []
    for status, sample in (("error", 90), ("judge_pending", 91), ("judge_pending", 92)):
        r = json.loads(json.dumps(longest))
        r.update(status=status, sample=sample, episode_id=f"{r['task']['task_id']}#{sample}", reward=None,
                 error={"kind": "browser_timeout", "message": "synthetic"} if status == "error" else None)
        if status == "error":
            r["steps"][0].update(parse_error="no <tool_call> in the reply", elements=SOM_ELEMENTS)
        extra.append(r)
    with open(run_dir / "episodes.jsonl", "a") as f:
        f.write("".join(json.dumps(r) + "\n" for r in extra))
    shots = [s["screenshot"] for s in longest["steps"]]
    evidence = {"judge": {"model": "judge-model", "prompt_version": "v1"}, "screenshots": shots,
                "keypoint": {"kept": shots[-2:], "over_cap": [],
                             "verdicts": [{"ref": ref, "relevant": i >= len(shots) - 2, "reason": f"verdict {i}"}
                                          for i, ref in enumerate(shots)]},
                "hallucination": {"supported": True, "reason": "the answer is on the page"},
                "facts": [{"group": "1", "fact": "f", "passed": True, "reason": "fact seen"}], "calls": []}
    judgement = {"episode_id": extra[2]["episode_id"], "judged_at": 1.0,
                 "reward": {"value": 1.0, "source": "judge", "reason": "all facts met", "facts": [],
                            "evidence": evidence}}
    (run_dir / "judgements.jsonl").write_text(json.dumps(judgement) + "\n")
    return run_dir


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def browser() -> AsyncIterator[Browser]:
    async with async_playwright() as p:
        b = await p.chromium.launch(executable_path=DEFAULT_CHROMIUM, args=CHROMIUM_FLAGS)
        yield b
        await b.close()


class Watched:
    """A page whose console errors, uncaught exceptions, failed requests and HTTP errors are collected."""

    def __init__(self, page: Page) -> None:
        self.page = page
        self.problems: list[str] = []
        page.on("console", lambda m: self.problems.append(f"console: {m.text}") if m.type == "error" else None)
        page.on("pageerror", lambda e: self.problems.append(f"pageerror: {e}"))
        page.on("requestfailed", lambda r: self.problems.append(f"failed: {r.url} {r.failure}"))
        page.on("response", lambda r: self.problems.append(f"HTTP {r.status}: {r.url}") if r.status >= 400 else None)


@pytest_asyncio.fixture(loop_scope="session")
async def page(browser: Browser) -> AsyncIterator[Watched]:
    context = await browser.new_context(viewport={"width": 1400, "height": 900})
    watched = Watched(await context.new_page())
    yield watched
    await context.close()
    assert not watched.problems, watched.problems


async def open_index(page: Page, index: Path) -> None:
    await page.goto(index.as_uri())
    await page.wait_for_selector("body[data-loaded='1']")


async def column(page: Page, i: int) -> list[str]:
    return await page.eval_on_selector_all(f"#episodes tbody tr td:nth-child({i})",
                                           "tds => tds.map(t => t.textContent)")


async def test_index_lists_filters_and_sorts_every_episode(real_run: Path, page: Watched) -> None:
    records = read_records(real_run)
    index = build_report(real_run)
    statuses = [r["status"] for r in records]
    assert {"success", "failure", "error", "judge_pending"} <= set(statuses), statuses
    assert records[-1]["reward"]["source"] == "judge"  # the verdict in judgements.jsonl is merged in
    p = page.page
    await open_index(p, index)
    assert [int(n) for n in await column(p, 1)] == list(range(len(records)))
    assert await column(p, 2) == [r["task"]["task_name"] for r in records]
    summary = summarize(records)
    figures = dict(await p.eval_on_selector_all(
        "#summary tr", "rs => rs.map(r => [r.cells[0].textContent, r.cells[1].textContent])"))
    assert figures["episodes"] == str(len(records)) and figures["succeeded"] == str(summary["succeeded"])
    assert figures["failed"] == str(summary["failed"]) and figures["errors"] == "1" and figures["judge pending"] == "1"
    assert await p.locator("#chart rect.bar").count() == len({r["task"]["difficulty"] for r in records})

    for status in ("success", "failure", "error", "judge_pending"):
        await p.select_option("#f-status", status)
        expected = [str(n) for n, s in enumerate(statuses) if s == status]
        assert await column(p, 1) == expected, status
        assert await p.text_content("#count") == f"{len(expected)} of {len(records)} episodes"
    await p.select_option("#f-status", "")
    site = (await column(p, 3))[0]
    await p.select_option("#f-site", site)
    assert set(await column(p, 3)) == {site} and len(await column(p, 1)) == (await column(p, 3)).count(site)
    await p.select_option("#f-site", "")
    base = json.loads((real_run / "manifest.json").read_text())["config"]["sites_base_url"]
    rows = [index_row(n, r, base) for n, r in enumerate(records)]
    for needle in (records[1]["task"]["task_name"].split()[-2], records[-3]["episode_id"], "synthetic"):
        await p.fill("#f-text", needle)
        expected = [str(r["n"]) for r in rows
                    if needle.lower() in " ".join([r["task"], r["id"], r["reason"], r["error"], r["site"]]).lower()]
        assert expected and await column(p, 1) == expected, needle
    await p.fill("#f-text", "")

    await p.click("#episodes th[data-key='steps']")
    steps = [int(s) for s in await column(p, 8)]
    assert steps == sorted(steps) and len(steps) == len(records)
    await p.click("#episodes th[data-key='steps']")
    assert [int(s) for s in await column(p, 8)] == sorted(steps, reverse=True)

    # Every link on the index points at a page that exists, and the first one opens its episode.
    hrefs = await p.eval_on_selector_all("#episodes a", "as => as.map(a => a.href)")
    assert len(hrefs) == len(records)
    assert all(Path(h.split("#")[0].removeprefix("file://")).exists() for h in hrefs)
    assert all((index.parent / "data" / f"ep-{h.split('#')[1]}.js").exists() for h in hrefs)


async def test_episode_pages_show_each_step_with_its_marker(real_run: Path, page: Watched) -> None:
    records = read_records(real_run)
    index = build_report(real_run)
    p = page.page
    await open_index(p, index)
    await p.click("#episodes tbody tr:first-child a")  # a real link from the index
    await p.wait_for_selector("body[data-loaded='0']")
    marked = scrolled = judged = 0
    for n, r in enumerate(records):
        if n:
            await p.goto(index.with_name("episode.html").as_uri() + f"#{n}")
            await p.wait_for_selector(f"body[data-loaded='{n}']")
        await p.evaluate("Promise.all([...document.images].map(i => i.decode().catch(() => 0)))")
        assert await p.text_content("h1") == r["task"]["task_name"]
        assert await p.locator(".step").count() - await p.locator(".step.final").count() == len(r["steps"])
        bad = await p.eval_on_selector_all("img", "is => is.filter(i => !i.naturalWidth).map(i => i.src)")
        assert not bad
        for i, step in enumerate(r["steps"]):
            sec = p.locator(f"#step-{i}")
            img = sec.locator(".frame img")
            assert (await img.get_attribute("src")) == "../" + step["screenshot"]
            assert await img.evaluate("i => i.naturalWidth") > 0
            name = step["action"]["name"]
            if name in MARKED and step.get("point"):
                marked += 1
                await check_marker(sec, step)
            elif name == "scroll":
                scrolled += 1
                arrow = sec.locator("path.marker.scroll")
                assert await arrow.get_attribute("data-direction") == step["action"].get("direction", "down")
            else:
                assert await sec.locator("circle.marker").count() == 0
            if step.get("parse_error"):
                assert step["parse_error"] in await sec.locator(".parse-error").text_content()
            if step.get("elements"):  # SoM boxes at the elements' CSS px (scale 1)
                boxes = await sec.locator("rect.som").evaluate_all(
                    "rs => rs.map(r => ['x', 'y', 'width', 'height'].map(k => +r.getAttribute(k)))")
                assert boxes == [e[3:] for e in step["elements"]]
        evidence = (r.get("reward") or {}).get("evidence")
        if evidence:  # the judge's kept screenshots and each verdict
            kept = await p.eval_on_selector_all("#evidence figure.kept img", "is => is.map(i => i.getAttribute('src'))")
            assert kept == ["../" + ref for ref in evidence["keypoint"]["kept"]]
            text = await p.text_content("#evidence")
            assert all(v["reason"] in text for v in evidence["keypoint"]["verdicts"]) and "fact seen" in text
            judged += 1
    assert marked >= 5, "the run should have clicks and typing to check"
    assert judged == 1 and any(s.get("parse_error") for r in records for s in r["steps"])
    # Keyboard: j moves between steps, n and p between episodes.
    await p.goto(index.with_name("episode.html").as_uri() + "#0")
    await p.wait_for_selector("body[data-loaded='0']")
    longest = max(range(len(records)), key=lambda n: len(records[n]["steps"]))
    await p.goto(index.with_name("episode.html").as_uri() + f"#{longest}")
    await p.wait_for_selector(f"body[data-loaded='{longest}']")
    await p.keyboard.press("j")
    await p.keyboard.press("j")
    assert await p.get_attribute(".step.current", "id") == "step-1"
    await p.keyboard.press("k")
    assert await p.get_attribute(".step.current", "id") == "step-0"
    await p.keyboard.press("n")
    await p.wait_for_selector(f"body[data-loaded='{longest + 1}']")
    await p.keyboard.press("p")
    await p.wait_for_selector(f"body[data-loaded='{longest}']")


async def check_marker(sec: Any, step: dict[str, Any]) -> None:
    """The circle sits at the recorded point: in SVG units (screenshot px) and on screen over the image."""
    x, y = step["point"]
    circle = sec.locator("circle.marker")
    assert await circle.count() == 1
    cx, cy = float(await circle.get_attribute("cx")), float(await circle.get_attribute("cy"))
    scale = 1280 / 1280  # screenshot width / viewport width: the run's screenshots are 1280 px for 1280 CSS px
    assert (cx, cy) == pytest.approx((x * scale, y * scale), abs=1e-6)
    img_box = await sec.locator(".frame img").bounding_box()
    c_box = await circle.bounding_box()
    natural = await sec.locator(".frame img").evaluate("i => [i.naturalWidth, i.naturalHeight]")
    assert img_box and c_box and natural == [1280, 768]
    on_x = (c_box["x"] + c_box["width"] / 2 - img_box["x"]) * natural[0] / img_box["width"]
    on_y = (c_box["y"] + c_box["height"] / 2 - img_box["y"]) * natural[1] / img_box["height"]
    assert abs(on_x - x * scale) < 2 and abs(on_y - y * scale) < 2, (on_x, on_y, x, y)
    if step["action"]["name"] == "type":
        assert json.dumps(step["action"].get("text", "")) in await sec.locator("svg text.label").first.text_content()


async def test_rebuild_on_a_growing_run_is_idempotent(real_run: Path, tmp_path: Path) -> None:
    """A run that is still going: the report shows what is finished, and a rebuild adds the rest."""
    partial = tmp_path / "partial"
    partial.mkdir()
    (partial / "frames").symlink_to(real_run / "frames")
    shutil.copy(real_run / "manifest.json", partial)
    lines = (real_run / "episodes.jsonl").read_text().splitlines()
    (partial / "episodes.jsonl").write_text("\n".join(lines[:3]) + "\n" + lines[3][:40])  # a torn last line
    build_report(partial)
    data = partial / "report" / "data"
    assert sorted(p.name for p in data.glob("ep-*.js")) == ["ep-0.js", "ep-1.js", "ep-2.js"]
    before = {p.name: p.stat().st_mtime_ns for p in data.iterdir()}
    time.sleep(0.01)
    (partial / "episodes.jsonl").write_text("\n".join(lines[:5]) + "\n")
    build_report(partial)
    assert len(list(data.glob("ep-*.js"))) == 5
    assert all(data.joinpath(f"ep-{n}.js").stat().st_mtime_ns == before[f"ep-{n}.js"] for n in range(3))
    assert "\"total\":5" in (data / "summary.js").read_text()


async def test_cli_prints_the_report_path(real_run: Path) -> None:
    result = CliRunner().invoke(view, [str(real_run)])
    assert result.exit_code == 0, result.output
    assert Path(result.output.strip()) == real_run / "report" / "index.html"
    server = serve(real_run, 0)  # --serve: the run directory over HTTP on 127.0.0.1
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        base = f"http://127.0.0.1:{server.server_address[1]}"
        with urllib.request.urlopen(f"{base}/report/index.html", timeout=10) as resp:
            assert resp.status == 200 and b"app.js" in resp.read()
        shot = read_records(real_run)[0]["steps"][0]["screenshot"]
        with urllib.request.urlopen(f"{base}/{shot}", timeout=10) as resp:
            assert resp.read() == (real_run / shot).read_bytes()  # the frames as stored, not re-encoded
        # Nothing for a web page of another site (a site that points its name at 127.0.0.1 could read the run),
        # and no file that a link leads to out of the run directory.
        outside = real_run.parent / "outside.txt"
        outside.write_text("not the run's")
        (real_run / "frames" / "link.txt").symlink_to(outside)
        for path, headers, status in ((shot, {"Host": "evil.example"}, 403),
                                      (shot, {"Sec-Fetch-Site": "cross-site"}, 403), ("frames/link.txt", {}, 404)):
            with pytest.raises(urllib.error.HTTPError) as refused:
                urllib.request.urlopen(urllib.request.Request(f"{base}/{path}", headers=headers), timeout=10)
            assert refused.value.code == status, (path, headers)
    finally:
        server.shutdown()
        server.server_close()
    proc = subprocess.run([sys.executable, "-m", "viewer.cli", "--help"], capture_output=True, text=True, timeout=30)
    assert proc.returncode == 0 and "--serve" in proc.stdout


async def test_readme_screenshots_export(real_run: Path, tmp_path: Path) -> None:
    paths = await export_screenshots(real_run, tmp_path)
    assert all(p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" for p in paths)


def synthetic_run(run_dir: Path, frames_from: Path, episodes: int) -> None:
    """A run directory of ``episodes`` records written directly, three steps each, reusing three real frames."""
    shots = sorted(frames_from.glob("frames/*/*.jpg"))[:3]
    (run_dir / "frames" / "shared").mkdir(parents=True)
    for i, s in enumerate(shots):
        shutil.copy(s, run_dir / "frames" / "shared" / f"{i:03d}.jpg")
    statuses = ("success", "failure", "success", "error")
    with open(run_dir / "episodes.jsonl", "w") as f:
        for n in range(episodes):
            status = statuses[n % 4]
            steps = [{"step": i, "url": f"http://example.test/{n}/{i}", "title": f"page {i}",
                      "screenshot": f"frames/shared/{i:03d}.jpg", "settled": True,
                      "action": {"name": "left_click", "x": 100 + i, "y": 200 + n % 300},
                      "action_text": f"left_click at ({100 + i}, {200 + n % 300})", "point": [100 + i, 200 + n % 300],
                      "page_changed": True, "result": {"settle": "quiet"},
                      "timings_ms": {"policy_ms": 5.0, "action_ms": 20.0, "step_ms": 30.0 + n % 50}}
                     for i in range(len(shots))]
            rec = {"episode_id": f"t{n % 250}#{n // 250}", "sample": n // 250, "status": status,
                   "task": {"task_id": f"t{n % 250}", "task_name": f"synthetic task number {n}",
                            "website": f"http://site{n % 5}.test/", "difficulty": 1 + n % 3, "evaluator_reference": []},
                   "reward": None if status == "error" else {"value": float(status == "success"), "source": "program",
                                                             "reason": "synthetic", "facts": []},
                   "error": {"kind": "internal", "message": "synthetic"} if status == "error" else None,
                   "steps": steps, "final": None, "started_at": 1000.0 + n, "duration_s": 3.0}
            f.write(json.dumps(rec) + "\n")


@pytest.mark.wallclock
async def test_ten_thousand_episodes_build_and_load_fast(real_run: Path, tmp_path: Path, page: Watched) -> None:
    run_dir = tmp_path / "big"
    synthetic_run(run_dir, real_run, 10_000)
    t = time.perf_counter()
    index = build_report(run_dir)
    build_s = time.perf_counter() - t
    assert len(list((index.parent / "data").glob("index-*.js"))) == 10_000 // CHUNK
    p = page.page
    t = time.perf_counter()
    await open_index(p, index)
    load_s = time.perf_counter() - t
    assert await p.locator("#episodes tbody tr").count() == 100  # one page of the table
    assert await p.text_content("#count") == "10000 of 10000 episodes"
    await p.select_option("#f-status", "error")
    assert await p.text_content("#count") == "2500 of 10000 episodes"
    await p.click("#next")
    assert (await column(p, 1))[0] == str(4 * 100 + 3)  # page 2 of the errors starts at the 101st (n = 403)
    await p.fill("#f-text", "number 9999")
    assert await column(p, 1) == ["9999"]
    await p.goto(index.with_name("episode.html").as_uri() + "#9999")
    await p.wait_for_selector("body[data-loaded='9999']")
    assert await p.locator(".step circle.marker").count() == 3
    print(f"\n10,000 episodes: report built in {build_s:.2f} s, index loaded in {load_s:.2f} s")
    assert build_s < 30 and load_s < 5
