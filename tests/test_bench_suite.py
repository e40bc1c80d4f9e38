"""The benchmark suite (``webgym-engine bench``) at its tiny scale: every suite runs for real (browsers, the
engine, the simulated policy, the codec, the monitor hook) for a few seconds, so that none can rot unnoticed.
These tests check the results' structure (files, keys, machine facts, plots, summary rows), never speed."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from bench import ceiling
from bench.cli import bench
from bench.publish import publish, summary_markdown
from bench.suite import SUITE_NAMES, Figure, SuiteResult, git_revision, plot_series, write_suite
from bench.suites.overhead import PHASE_NAMES
from bench.suites.policy import gpu_unavailable_reason

ROOT = Path(__file__).resolve().parent.parent
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
FIGURE_KEYS = {"label", "unit", "median", "min", "max", "values", "n", "goal", "met"}
MACHINE_KEYS = {"cores", "memory_gib", "chromium", "python", "libraries", "git_revision", "os", "gpu"}


@pytest.fixture(scope="module")
def results(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    """``webgym-engine bench all --tiny`` once (one process, one site server) for every test of this file."""
    out = tmp_path_factory.mktemp("bench") / "results"
    res = CliRunner().invoke(bench, ["all", "--tiny", "--out", str(out)], catch_exceptions=False)
    assert res.exit_code == 0, res.output
    return out, res.output


def load(out: Path, suite: str) -> dict[str, Any]:
    data = json.loads((out / f"{suite}.json").read_text())
    assert data["suite"] == suite and data["scale"] == "tiny"
    assert set(data["machine"]) >= MACHINE_KEYS, data["machine"].keys()
    assert data["machine"]["cores"] >= 1 and data["machine"]["memory_gib"] > 0
    assert "error" not in data["config"], data["config"]["error"]
    for key, fig in data["figures"].items():
        assert set(fig) >= FIGURE_KEYS, key
        if fig["n"]:
            assert fig["min"] <= fig["median"] <= fig["max"], key
    for plot in data["plots"]:
        assert (out / plot).read_bytes()[:8] == PNG_MAGIC, plot
    if not data["skipped"]:
        assert data["plots"], f"{suite} made no plot"
    return data


def test_every_suite_wrote_its_files_and_the_summary(results: tuple[Path, str]) -> None:
    out, output = results
    for suite in SUITE_NAMES:
        assert (out / f"{suite}.json").is_file(), suite
    summary = (out / "summary.md").read_text()
    assert "| figure | value | goal | met |" in summary
    rows = json.loads((out / "summary.json").read_text())["rows"]
    assert {r["suite"] for r in rows} == set(SUITE_NAMES)
    assert "value (median [min-max])" in output  # the printed table
    assert "results:" in output


def test_ceiling(results: tuple[Path, str]) -> None:
    out, _ = results
    data = load(out, "ceiling")
    figs = data["figures"]
    for key in ("light.c2.bare_steps_per_s", "light.c2.engine_steps_per_s", "light.c2.ratio",
                "light.c2.engine_cpu_ms_per_step", "light.c2.step_p95_ms"):
        assert figs[key]["n"] == 1, key
    bare, eng = figs["light.c2.bare_steps_per_s"]["median"], figs["light.c2.engine_steps_per_s"]["median"]
    assert bare > 0 and eng > 0  # both loops stepped in their window
    # The ratio is of the two measured (each figure stored to 4 decimals).
    assert figs["light.c2.ratio"]["median"] == pytest.approx(eng / bare, rel=1e-3)
    engine = data["runs"][0]["engine"]
    assert engine["error_detail"] == [] and engine["errors"] == 0  # an error would be listed with its message
    assert data["config"]["page_profiles"]["light"]
    assert "| light c2: engine / bare loop |" in (out / "summary.md").read_text()



async def test_the_ceiling_engine_run_says_what_ended_an_error_episode(site_server: str) -> None:
    # A start page with a challenge page's title: the episode ends as an error ("blocked") at once.
    eng = await ceiling.engine_run(site_server, 1, 1, 0.2, 80, pages=["/fixtures/challenge_title.html"])
    assert eng["errors"] == 1 and eng["stepping"] == 1  # the ended episode counted as ready: no wait
    (err,) = eng["error_detail"]
    assert err["kind"] == "blocked" and "challenge page" in err["message"], err
    assert err["website"].endswith("/fixtures/challenge_title.html") and err["steps"] == 0

def test_async(results: tuple[Path, str]) -> None:
    out, _ = results
    data = load(out, "async")
    figs = data["figures"]
    for mode in ("async", "sync"):
        for what in ("steps_per_s", "episodes_per_min", "makespan_s", "machine_cpu_busy", "step_p50_ms",
                     "predicted_makespan_s"):
            assert f"c2.{mode}.{what}" in figs, (mode, what)
        # Each mode's steps/s is its steps over its makespan.
        steps, makespan = data["runs"][0][mode]["steps"], figs[f"c2.{mode}.makespan_s"]["median"]
        assert figs[f"c2.{mode}.steps_per_s"]["median"] == pytest.approx(steps / makespan, rel=0.05), mode
        # Both modes do exactly the work the seeded policy drew: every episode, the same steps.
        assert figs[f"c2.{mode}.work_mismatches"]["median"] == 0, mode
    # The ratio is of the two makespans, and the measured / predicted figure of the two ratios.
    ratio = figs["c2.ratio"]["median"]
    assert ratio == pytest.approx(figs["c2.sync.makespan_s"]["median"] / figs["c2.async.makespan_s"]["median"],
                                  rel=1e-3)
    assert figs["c2.ratio_of_prediction"]["median"] == pytest.approx(ratio / figs["c2.predicted_ratio"]["median"],
                                                                     rel=1e-3)
    assert "c2.gap_pct" in figs
    assert data["config"]["tasks"] > 100  # the bundled tasks
    run = data["runs"][0]
    assert run["async"]["mode"] == "async" and run["sync"]["mode"] == "sync"
    assert run["async"]["episodes"] == run["sync"]["episodes"] == run["work"]["episodes"] == 4
    assert run["async"]["steps"] == run["sync"]["steps"] == run["work"]["steps"]
    rows = data["summary"]  # the headline rows the publisher renders
    assert rows and all(set(r) == {"figure", "value", "unit", "goal", "met"} for r in rows)
    assert any("predicted" in r["figure"] for r in rows)


def test_async_live(results: tuple[Path, str]) -> None:
    # At the tests' scale the suite runs on the plain bundled sites (tests/test_page_latency.py tests its server).
    out, _ = results
    data = load(out, "async_live")
    assert data["config"]["pages"] == "local"
    figs = data["figures"]
    assert figs["c2.async.work_mismatches"]["median"] == figs["c2.sync.work_mismatches"]["median"] == 0
    ratio = figs["c2.ratio"]["median"]
    assert ratio == pytest.approx(figs["c2.sync.makespan_s"]["median"] / figs["c2.async.makespan_s"]["median"],
                                  rel=1e-3)
    assert figs["c2.ratio_of_prediction"]["median"] == pytest.approx(ratio / figs["c2.predicted_ratio"]["median"],
                                                                     rel=1e-3)
    assert set(data["plots"]) == {"async-live.png", "async-live-ratio.png", "async-live-cpu.png"}
    assert any("predicted" in r["figure"] for r in data["summary"])


def test_scaling(results: tuple[Path, str]) -> None:
    out, _ = results
    data = load(out, "scaling")
    figs = data["figures"]
    for profile in ("light", "heavy"):
        for what in ("steps_per_s", "step_p95_ms", "pss_per_rollout_mib", "engine_cpu_ms_per_step"):
            assert f"{profile}.c2.{what}" in figs, (profile, what)
        # A browser and its two contexts, shared by two rollouts: tens to hundreds of MiB each, never nothing.
        assert 5 <= figs[f"{profile}.c2.pss_per_rollout_mib"]["median"] <= 2048, profile
        assert figs[f"{profile}.max_concurrency"]["median"] == 2
        assert data["config"]["stopped"][profile]["reason"]
    heavy = data["config"]["page_profiles"]["heavy"]
    page = next(iter(heavy.values()))
    assert 3000 <= page["dom_nodes"] <= 6500 and page["distinct_images"] >= 60, page


def test_overhead(results: tuple[Path, str]) -> None:
    out, _ = results
    data = load(out, "overhead")
    figs = data["figures"]
    assert figs["cpu_ms_per_step"]["goal"] == "<= 2 ms"
    for phase in PHASE_NAMES:
        assert f"phase.{phase.replace(' ', '_')}" in figs, phase
    total = sum(figs[f"phase.{p.replace(' ', '_')}"]["median"] for p in PHASE_NAMES)
    assert total == pytest.approx(figs["cpu_ms_per_step"]["median"], rel=0.02, abs=0.01)
    # The monitor measured through bench/monitor.py: a window without and one with it attached, both stepping, and
    # the slowdown computed from the two.
    without, with_ = figs["monitor.without_steps_per_s"]["median"], figs["monitor.with_steps_per_s"]["median"]
    assert without > 0 and with_ > 0, (without, with_)
    assert figs["monitor.slowdown_pct"]["median"] == pytest.approx(100 * (1 - with_ / without), rel=1e-3, abs=1e-3)
    assert figs["monitor.slowdown_pct"]["goal"] == "<= 3 %"


def test_codec(results: tuple[Path, str]) -> None:
    out, _ = results
    data = load(out, "codec")
    figs = data["figures"]
    for key in ("decode.imgcodec_ms", "decode.pillow_ms", "frame_diff.imgcodec_ms"):
        assert figs[key]["median"] > 0, key
    # The speed-up is of the two decoders' times, as measured in each repeat.
    row = data["runs"][0]["median_ms"]["decode"]
    assert figs["decode.speedup_vs_pillow"]["median"] == pytest.approx(row["pillow"] / row["imgcodec"], rel=1e-3)
    assert data["config"]["screenshots"] == 2


def test_policy(results: tuple[Path, str]) -> None:
    out, _ = results
    data = load(out, "policy")
    reason = gpu_unavailable_reason()
    if reason is not None:
        assert data["skipped"] == reason and not data["figures"]
        assert "(skipped)" in (out / "summary.md").read_text() or "Skipped:" in (out / "summary.md").read_text()
    else:
        assert data["skipped"] is None
        assert data["figures"]["c1.requests_per_s"]["median"] > 0


def test_figure_and_summary() -> None:
    f = Figure("x", "ratio", "", (">=", 0.85), [0.9, 0.8, 1.0])
    assert (f.median, f.met, f.value_text(), f.goal_text()) == (0.9, True, "0.900 [0.800-1]", ">= 0.850")
    assert Figure("y", "cpu", "ms", ("<=", 2.0), [2.5]).met is False
    assert Figure("z", "none").to_dict()["median"] is None
    res = SuiteResult("demo", "tiny", 1)
    res.add("a", "figure a", 1.5, "ms", ("<=", 2.0))
    text = summary_markdown([res], {"cores": 2, "libraries": {}})
    assert "| figure a | 1.50 ms | <= 2 ms | yes |" in text


def test_publish_writes_the_docs_page(tmp_path: Path) -> None:
    out, docs = tmp_path / "results", tmp_path / "docs"
    out.mkdir()
    res = SuiteResult("demo", "tiny", 1)
    res.add("a", "figure a", 0.9, "", (">=", 0.85))
    plot_series(out / "demo.png", "demo", "x", "y", {"a": ([8], [res.figures["a"]])})
    res.plots.append("demo.png")
    machine = {"cores": 2, "libraries": {}}
    write_suite(out, res, machine)
    page = publish(out, docs, [res]).read_text()
    assert "| figure a | 0.900 | >= 0.850 | yes |" in page and "(benchmarks/demo.png)" in page
    assert (docs / "benchmarks" / "demo.png").read_bytes()[:8] == PNG_MAGIC
    assert (docs / "benchmarks" / "demo.json").exists()


def test_module_entry_point() -> None:
    out = subprocess.run([sys.executable, "-m", "bench.cli", "--help"], cwd=ROOT, capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 0 and "ceiling" in out.stdout and "--quick" in out.stdout


def test_the_revision_stamp_is_dirty_for_changed_code_not_for_changed_docs(tmp_path: Path,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("WEBGYM_CODE_REVISION", raising=False)

    def git(*args: str) -> str:
        return subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", *args], cwd=tmp_path,
                              check=True, capture_output=True, text=True).stdout.strip()

    (tmp_path / "docs" / "benchmarks").mkdir(parents=True)
    files = {"engine.py": "x = 1\n", "README.md": "# r\n", "docs/benchmarks/chaos.json": "{}\n"}
    for name, text in files.items():
        (tmp_path / name).write_text(text)
    git("init", "-q")
    git("add", ".")
    git("commit", "-qm", "c")
    head = git("rev-parse", "--short", "HEAD")
    assert git_revision(tmp_path) == head
    (tmp_path / "docs/benchmarks/chaos.json").write_text('{"a": 1}\n')  # a benchmark's own output
    (tmp_path / "README.md").write_text("# r2\n")
    assert git_revision(tmp_path) == head
    (tmp_path / "engine.py").write_text("x = 2\n")
    assert git_revision(tmp_path) == f"{head}-dirty"
