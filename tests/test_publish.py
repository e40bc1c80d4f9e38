"""Publishing figures (``bench.publish``): the README's figure blocks and docs/benchmarks.md are what the stored
results in docs/benchmarks/ render to, so a hand-typed figure or a result stored without publishing fails here.
No benchmark runs and no browsers: rendering stored JSON only."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench.publish import load_store, main, publish, replace_blocks, stale_pages
from bench.readme_figures import render_block, wrap
from bench.render import FigureError, benchmarks_page
from bench.suite import SuiteResult, num_text, write_suite

ROOT = Path(__file__).resolve().parent.parent

SOAK = {
    "summary": [
        {"figure": "episodes without an error", "value": 0.9985, "unit": "", "goal": ">= 0.999", "met": False},
        {"figure": "engine RSS growth per hour", "value": 12.5, "unit": "MiB", "goal": None, "met": None},
    ],
    "plots": ["soak.png"],
    "notes": ["one note"],
}


def docs_with(tmp_path: Path, **stored: dict) -> Path:
    """A docs directory whose docs/benchmarks/ holds ``stored`` (stem -> JSON)."""
    docs = tmp_path / "docs"
    (docs / "benchmarks").mkdir(parents=True)
    for name, data in stored.items():
        (docs / "benchmarks" / f"{name}.json").write_text(json.dumps(data))
    return docs


def test_the_repository_pages_are_the_stored_results_rendered() -> None:
    stale = stale_pages(ROOT / "docs", ROOT / "README.md")
    assert not stale, f"{sorted(map(str, stale))} differ from docs/benchmarks/: run `python -m bench.publish`"


def test_a_summary_json_renders_its_rows_notes_and_plots(tmp_path: Path) -> None:
    docs = docs_with(tmp_path, soak=SOAK)
    page = stale_pages(docs, None)[docs / "benchmarks.md"]
    assert page == benchmarks_page({"soak": SOAK})
    assert "## soak" in page and "[benchmarks/soak.json](benchmarks/soak.json)" in page
    assert "| episodes without an error | 0.999 | >= 0.999 | **no** |" in page
    assert "| engine RSS growth per hour | 12.5 MiB |  |  |" in page
    assert "| soak | episodes without an error | 0.999 | >= 0.999 | **no** |" in page  # in the goals table
    assert "- one note" in page and "![soak.png](benchmarks/soak.png)" in page
    readme = "Soak:\n<!-- figures: summary:soak -->\n<!-- /figures -->\n"
    assert replace_blocks(readme, {"soak": SOAK}) == (
        "Soak:\n<!-- figures: summary:soak -->\n"
        "- **episodes without an error**: 0.999 (goal >= 0.999: missed)\n"
        "- **engine RSS growth per hour**: 12.5 MiB\n"
        "<!-- /figures -->\n")
    # Stored beside the others, it also gets a line in the README's "At a glance" without code of its own: its
    # rows with a goal alone (the others are in docs/benchmarks.md).
    store = {**load_store(ROOT / "docs" / "benchmarks"), "soak": SOAK}
    glance = " ".join(render_block("at-a-glance", store).split())  # as read, whatever the line breaks
    assert ("- **soak** ([docs/benchmarks/soak.json](docs/benchmarks/soak.json)): episodes without an error 0.999 "
            "(goal >= 0.999: missed).") in glance
    assert "engine RSS growth per hour" not in glance


def test_text_outside_the_markers_is_kept_and_a_hand_typed_figure_inside_fails_the_check(tmp_path: Path) -> None:
    docs = docs_with(tmp_path, soak=SOAK)
    readme = tmp_path / "README.md"
    outside = "# Title\n\nThe engine does 9,999 steps/s (typed by hand).\n\n"
    readme.write_text(outside + "<!-- figures: summary:soak -->\n- **episodes without an error**: 1.00\n"
                      "<!-- /figures -->\n\nThe end: 42 MiB.\n")
    args = ["--docs", str(docs), "--readme", str(readme)]
    assert main([*args, "--check"]) == 1
    assert main(args) == 0
    text = readme.read_text()
    assert text.startswith(outside) and text.endswith("<!-- /figures -->\n\nThe end: 42 MiB.\n")
    assert "0.999 (goal >= 0.999: missed)" in text and ": 1.00\n" not in text
    assert main([*args, "--check"]) == 0


def test_broken_markers_and_unknown_blocks_are_errors() -> None:
    for text in ("<!-- figures: summary:soak -->\nno end\n", "<!-- /figures -->\n",
                 "<!-- figures: summary:soak -->\n<!-- figures: summary:soak -->\n<!-- /figures -->\n",
                 "<!-- figures: no-such-block -->\n<!-- /figures -->\n",
                 "<!-- figures: summary:absent -->\n<!-- /figures -->\n"):
        with pytest.raises(FigureError):
            replace_blocks(text, {"soak": SOAK})
    assert replace_blocks("`<!-- figures: x -->` in a sentence\n", {}) == "`<!-- figures: x -->` in a sentence\n"


def test_a_skipped_suite_keeps_the_stored_figures(tmp_path: Path) -> None:
    docs = docs_with(tmp_path)
    out = tmp_path / "results"
    measured = SuiteResult("policy", "full", 1)
    measured.add("c1.requests_per_s", "c1: requests/s", 0.5, "req/s")
    write_suite(docs / "benchmarks", measured, {"gpu": {"name": "a GPU", "count": 1}})
    skipped = SuiteResult("policy", "full", 1, skipped="no CUDA GPU")
    write_suite(out, skipped, {"gpu": None})
    page = publish(out, docs, [skipped]).read_text()
    assert json.loads((docs / "benchmarks" / "policy.json").read_text())["figures"]
    assert "| c1: requests/s | 0.500 req/s |" in page and "Skipped" not in page


def test_wrapping_never_starts_a_line_with_block_syntax() -> None:
    line = "- **figure**: " + " ".join(["word"] * 40) + " goal >= 5 x, - 1. # + * | done"
    lines = wrap(line, width=30).splitlines()
    assert " ".join(x.strip() for x in lines) == line
    assert all(len(x) <= 30 or " " not in x.strip() for x in lines)
    assert all(not x.strip().startswith((">", "- ", "1.", "#", "+", "*", "|")) for x in lines[1:])


def test_a_table_row_is_never_wrapped() -> None:
    row = "| " + " | ".join(["a long cell of many words"] * 12) + " |"
    assert wrap(row, width=30) == row


def test_the_suite_goals_block_is_one_table_with_every_goal_and_long_rows_stay_whole() -> None:
    store = load_store(ROOT / "docs" / "benchmarks")
    block = render_block("suite-goals", store)
    rows = [line for line in block.splitlines() if line.startswith("| ") and "---" not in line][1:]
    with_goal = [f for d in store.values() if "figures" in d and not d.get("skipped")
                 for f in d["figures"].values() if f.get("goal")]
    assert len(rows) == len(with_goal) > 0
    assert all(row.endswith(" |") for row in rows)  # never wrapped, however long
    assert "overhead: code" in " ".join(block.split())
    with pytest.raises(FigureError, match="no suite figure with a goal"):
        render_block("suite-goals", {"soak": SOAK})


def test_the_async_levels_block_has_a_row_per_level_from_the_stored_figures() -> None:
    store = load_store(ROOT / "docs" / "benchmarks")
    data = store["async"]
    block = render_block("async-levels", store)
    rows = [line for line in block.splitlines() if line.startswith("| ") and "---" not in line][1:]
    levels = sorted({int(k.split(".")[0][1:]) for k in data["figures"] if k.endswith(".ratio")})
    assert [int(r.split(" | ")[0][2:]) for r in rows] == levels and levels
    n = levels[0]
    ratio = data["figures"][f"c{n}.ratio"]
    assert f"{num_text(ratio['median'])}x [{num_text(ratio['min'])}-{num_text(ratio['max'])}]" in rows[0]
    assert f"Medians of {data['repeats']} repeats" in block
    with pytest.raises(FigureError):
        render_block("async-levels", {"soak": SOAK})


def test_the_test_time_figures_come_from_a_real_pytest_junit_report(tmp_path: Path) -> None:
    """``bench.test_time`` reads what pytest itself wrote: counts and each file's time, summed over test classes."""
    import subprocess
    import sys

    from bench.test_time import PhaseReport, read_junit, result

    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / "test_mixed.py").write_text(
        "import time, pytest\n"
        "def test_passes():\n    time.sleep(0.2)\n"
        "def test_fails():\n    assert False\n"
        "@pytest.mark.skip(reason='not here')\ndef test_skipped():\n    pass\n"
        "class TestGroup:\n    def test_passes_too(self):\n        time.sleep(0.2)\n")
    report = tmp_path / "report.xml"
    subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-o", "addopts=",
                    f"--junitxml={report}", "tests/test_mixed.py"], cwd=tmp_path, capture_output=True, check=False)
    phase = read_junit(report)
    assert (phase.tests, phase.failures, phase.skipped, phase.passed) == (4, 1, 1, 2)
    assert list(phase.file_seconds) == ["tests/test_mixed.py"]
    assert phase.file_seconds["tests/test_mixed.py"] >= 0.4 and phase.seconds >= 0.4

    quick = PhaseReport(tests=3, failures=0, errors=0, skipped=0, seconds=2.0, file_seconds={"tests/test_t.py": 2.0})
    verl = PhaseReport(tests=3, failures=0, errors=0, skipped=0, seconds=8.0, file_seconds={"tests/f/test_v.py": 8.0})
    areal = PhaseReport(tests=3, failures=0, errors=0, skipped=0, seconds=20.0,
                        file_seconds={"tests/f/test_a.py": 20.0})
    vllm = PhaseReport(tests=3, failures=0, errors=0, skipped=0, seconds=12.0, file_seconds={"tests/f/test_l.py": 12.0})
    openenv = PhaseReport(tests=1, failures=0, errors=0, skipped=0, seconds=5.0,
                          file_seconds={"tests/f/test_o.py": 5.0})
    data = result({"setup_s": 200.0, "test_s": 1000.0,
                   "phases": {"parallel": phase, "wallclock": quick, "verl": verl, "areal": areal, "vllm": vllm,
                              "openenv": openenv}}, 2, True)
    rows = {r["figure"]: r for r in data["summary"]}
    assert rows["make test, from start to end"]["met"] is False  # over the 10-minute budget
    assert rows["tests failed"]["value"] == 1 and rows["tests failed"]["met"] is False
    assert rows["tests passed"]["value"] == 15
    # The four run at once: the longest is what they add.
    first = "first the veRL, AReaL, vLLM and OpenEnv tests, each framework in its own environment, at once"
    assert rows[first]["value"] == 20.0
    assert [f["file"] for f in data["files"]] == ["tests/f/test_a.py", "tests/f/test_l.py", "tests/f/test_v.py",
                                                  "tests/f/test_o.py", "tests/test_t.py", "tests/test_mixed.py"]
    text = render_block("test-time", {"test_time": {**data, "machine": {"cores": 2, "git_revision": "abc1234"}}})
    assert "1,000 s on a fresh clone of code abc1234, after 200 s of install (" in text.replace("\n", " ")
    assert "15 tests passed, 1 failed and 1 skipped" in text.replace("\n", " ")
    assert ("first 20 s for the veRL, AReaL, vLLM and OpenEnv tests in their own environments (at once, beside the "
            "type check), then") in text.replace("\n", " ")
