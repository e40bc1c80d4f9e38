"""The command line as a user runs it (a real subprocess)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from engine.store.stats import SUMMARY_KEYS
from tests.conftest import subset


def cli(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "cli.main", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=300)


def test_malformed_task_file_is_refused_before_anything_starts(tmp_path: Path) -> None:
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"task_id": "a", "task_name": "x", "website": "example.com"}\n'
                   '{"task_id": "b", "task_name": "y", "website": "example.com", "difficulty": "many"}\n')
    res = cli("run", "--tasks", str(bad), "--output", str(tmp_path / "runs"), cwd=tmp_path)
    assert res.returncode != 0
    assert f"{bad}, line 2: field 'difficulty'" in res.stderr
    assert not (tmp_path / "runs").exists()  # no run directory, no browser


def test_run_writes_summary_json_with_the_documented_keys(tmp_path: Path) -> None:
    tasks = subset(tmp_path, per_site=1, max_len=4)
    summary = tmp_path / "summary.json"
    res = cli("run", "--tasks", str(tasks), "--workers", "1", "--concurrency", "4", "--output",
              str(tmp_path / "runs"), "--summary-json", str(summary), cwd=tmp_path)
    assert res.returncode == 0, res.stderr[-2000:]
    data = json.loads(summary.read_text())
    assert set(SUMMARY_KEYS) <= set(data)
    n = len(tasks.read_text().splitlines())
    assert data["episodes"] == data["succeeded"] == n and data["lost"] == 0 and data["errors"] == 0
    # PSS splits shared pages among the processes that map them (another test's Chromium too), so only a floor:
    # a real browser tree, counted in MiB.
    assert data["steps"] > 0 and data["steps_per_s"] > 0 and data["peak_browser_pss_mib"] > 5
    assert "run summary" in res.stderr and "steps/s" in res.stderr  # the table
    [run_dir] = (tmp_path / "runs").iterdir()
    assert len((run_dir / "episodes.jsonl").read_text().splitlines()) == n


def test_run_warns_at_start_of_tasks_nothing_can_reward_and_counts_them_unrewarded(tmp_path: Path) -> None:
    # Before, such a run said nothing and reported its episodes as failures (0% success).
    checked = json.loads(subset(tmp_path, per_site=1, max_len=4).read_text().splitlines()[0])
    unchecked = {**checked, "task_id": "no-checks",
                 "evaluator_reference": [{"id": 1, "description": "d", "facts": ["the answer names a product"]}]}
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text(json.dumps(checked) + "\n" + json.dumps(unchecked) + "\n")
    summary = tmp_path / "summary.json"
    res = cli("run", "--tasks", str(tasks), "--workers", "1", "--concurrency", "2", "--output",
              str(tmp_path / "runs"), "--summary-json", str(summary), cwd=tmp_path)  # stderr is not a terminal
    assert res.returncode == 0, res.stderr[-2000:]
    [warning] = [line for line in res.stderr.splitlines() if line.startswith("warning:")]  # one line, unwrapped
    assert "1 of 2 tasks cannot be rewarded" in warning and "no judge configured" in warning
    assert "--judge-base-url" in warning and "unrewarded" in warning
    assert res.stderr.index(warning) < res.stderr.index("run directory:")  # said before the run starts
    data = json.loads(summary.read_text())
    assert (data["succeeded"], data["failed"], data["unrewarded"], data["success_rate"]) == (1, 0, 1, 1.0)
    assert "unrewarded" in res.stderr.split("run summary")[1]  # the table has the row


def test_resume_needs_a_run_directory(tmp_path: Path) -> None:
    res = cli("run", "--resume", str(tmp_path), cwd=tmp_path)
    assert res.returncode != 0 and "not a run directory" in res.stderr


def test_the_command_line_starts_without_the_benchmarks() -> None:
    # A fresh interpreter: the benchmark suite is imported by `webgym-engine bench` alone, not by the CLI's start.
    probe = ("import sys, click, cli.main\n"
             "assert not [m for m in sys.modules if m == 'bench' or m.startswith('bench.')], 'bench imported'\n"
             "cmd = cli.main.main.get_command(click.Context(cli.main.main), 'bench')\n"
             "assert cmd is not None and cmd.name == 'bench' and 'bench.cli' in sys.modules\n")
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
