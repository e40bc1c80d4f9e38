"""How long the README's test command takes: ``make test``, timed phase by phase, by default on a fresh clone.

By default it clones the committed code into a temporary folder and runs the README's two steps there, as a new
user would: ``make setup`` (the virtual environment, torch, the package and its C extension, with a pip cache of its
own, empty; the apt packages are checked, and installed only when missing), then ``make test``. The clone
is removed afterwards, so this also shows that the committed files alone install everything the tests need.
``--here`` runs ``make test`` in this checkout instead (its setup a no-op).

``make test`` builds the frameworks' environments (``.venv-verl``, ``.venv-areal``, ``.venv-vllm``, ``.venv-openenv``;
with a uv cache of its own, empty, on a fresh clone) and runs the veRL and AReaL adapters' tests in them, the engine's
tests against a vLLM server and OpenEnv's client against the engine beside the import-layering and type checks (all
at once), then the tests in ``TEST_PROCS`` processes, then the timing tests alone; each pytest phase writes a JUnit
report (``TEST_REPORT``), from which come the test counts, each phase's time and every test file's time (``files``,
slowest first: ``tests/conftest.py`` starts the files in that order).

    python -m bench.test_time [--here] [--procs 2] [--json docs/benchmarks/test_time.json]
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import tempfile
import time
import xml.etree.ElementTree as ET
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.report import row, write_result
from bench.suite import ROOT, machine_facts

# The Makefile's names for its pytest runs, in order.
PHASES = ("parallel", "wallclock", "verl", "areal", "vllm", "openenv")
# Those run first, at once: the veRL and AReaL adapters' tests in their frameworks' environments, the engine against
# a vLLM server run from its own environment, and OpenEnv's own client.
FRAMEWORK_PHASES = ("verl", "areal", "vllm", "openenv")
BUDGET_S = 10 * 60  # the suite must stay under 10 minutes on 2 cores (the main environment's setup excluded)
SLOWEST = 8  # test files named in the notes


@dataclass
class PhaseReport:
    """One pytest run's JUnit report: its counts, its own duration and the time of each test file."""

    tests: int
    failures: int
    errors: int
    skipped: int
    seconds: float
    file_seconds: dict[str, float]

    @property
    def passed(self) -> int:
        return self.tests - self.failures - self.errors - self.skipped


def read_junit(path: Path) -> PhaseReport:
    """A pytest JUnit XML report (one ``testsuite``, or several under ``testsuites``), summed."""
    root = ET.parse(path).getroot()
    suites = [root] if root.tag == "testsuite" else root.findall("testsuite")
    if not suites:
        raise ValueError(f"{path}: no testsuite element")
    files: dict[str, float] = defaultdict(float)
    for case in root.iter("testcase"):
        # classname is the module's dotted path, then any test class: tests.test_env.TestStep -> tests/test_env.py
        parts = (case.get("classname") or "?").split(".")
        module = next((i for i, p in enumerate(parts) if p.startswith("test_")), len(parts) - 1)
        files["/".join(parts[:module + 1]) + ".py"] += float(case.get("time") or 0.0)

    def total(attr: str) -> int:
        return sum(int(s.get(attr) or 0) for s in suites)

    return PhaseReport(tests=total("tests"), failures=total("failures"), errors=total("errors"),
                       skipped=total("skipped"), seconds=sum(float(s.get("time") or 0.0) for s in suites),
                       file_seconds=dict(files))


def timed(cmd: Sequence[str], cwd: Path, log: Path, env: dict[str, str] | None = None) -> tuple[float, int]:
    """Run ``cmd`` in ``cwd`` with its output appended to ``log``; (wall seconds, exit status)."""
    t0 = time.perf_counter()
    with log.open("ab") as out:
        rc = subprocess.run(list(cmd), cwd=cwd, env=env, stdout=out, stderr=subprocess.STDOUT,
                            check=False).returncode
    return time.perf_counter() - t0, rc


def measure(checkout: Path, procs: int, work: Path, setup: bool) -> dict[str, Any]:
    """``make setup`` (when ``setup``) then ``make test`` in ``checkout``; the figures, the phases and every
    file's time. Raises RuntimeError when a step fails (its output is in ``work/make.log``)."""
    log = work / "make.log"
    out: dict[str, Any] = {}
    env = None
    if setup:
        # Package caches of their own, empty: nothing is taken from earlier installs on this machine.
        env = {**os.environ, "PIP_CACHE_DIR": str(work / "pip-cache"), "UV_CACHE_DIR": str(work / "uv-cache")}
        out["setup_s"], rc = timed(["make", "setup"], checkout, log, env)
        if rc:
            raise RuntimeError(f"make setup failed ({rc}); see {log}")
    prefix = work / "report"
    out["test_s"], rc = timed(["make", "test", f"TEST_PROCS={procs}", f"TEST_REPORT={prefix}"], checkout, log, env)
    if rc:
        raise RuntimeError(f"make test failed ({rc}); see {log}")
    out["phases"] = {name: read_junit(Path(f"{prefix}-{name}.xml")) for name in PHASES}
    return out


def result(measured: dict[str, Any], procs: int, fresh: bool) -> dict[str, Any]:
    """The stored result (less the machine facts): the summary rows, each phase's counts and every file's time."""
    phases: dict[str, PhaseReport] = measured["phases"]
    par, wall = phases["parallel"], phases["wallclock"]
    frameworks = [phases[name] for name in FRAMEWORK_PHASES]
    files: dict[str, float] = defaultdict(float)
    for phase in phases.values():
        for name, seconds in phase.file_seconds.items():
            files[name] += seconds
    failed = sum(p.failures + p.errors for p in phases.values())
    summary = []
    if "setup_s" in measured:
        summary.append(row("install on a fresh clone (make setup with an empty pip cache, the apt packages "
                           "already present)", measured["setup_s"], "s"))
    summary += [
        row("make test, from start to end", measured["test_s"], "s", f"<= {BUDGET_S}", measured["test_s"] <= BUDGET_S),
        # They run at once, beside the type check: the longest one is what they take.
        row("first the veRL, AReaL, vLLM and OpenEnv tests, each framework in its own environment, at once",
            max(p.seconds for p in frameworks), "s"),
        row(f"the tests in {procs} processes", par.seconds, "s"),
        row("then the timing tests alone", wall.seconds, "s"),
        row("tests passed", sum(p.passed for p in phases.values()), "tests"),
        row("tests skipped", sum(p.skipped for p in phases.values()), "tests"),
        row("tests failed", failed, "tests", "<= 0", failed == 0),
    ]
    ordered = sorted(files.items(), key=lambda kv: -kv[1])
    slowest = ordered[:SLOWEST]
    return {
        "config": {"procs": procs, "fresh_clone": fresh, "command": f"make test TEST_PROCS={procs}"},
        "summary": summary,
        "phases": {name: {"tests": p.tests, "passed": p.passed, "skipped": p.skipped,
                          "failed": p.failures + p.errors, "seconds": round(p.seconds, 1)}
                   for name, p in phases.items()},
        "files": [{"file": name, "seconds": round(seconds, 1)} for name, seconds in ordered],
        "notes": ["The slowest test files (the time of their tests, summed over the phases): "
                  + ", ".join(f"{name} {seconds:.0f} s" for name, seconds in slowest) + "."],
    }


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--here", action="store_true", help="run make test in this checkout, not in a fresh clone")
    ap.add_argument("--procs", type=int, default=2, help="TEST_PROCS: pytest processes of the first phase")
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args(argv)
    machine = machine_facts()
    with tempfile.TemporaryDirectory(prefix="bench-test-time-") as tmp:
        work = Path(tmp)
        if args.here:
            checkout = ROOT
        else:
            checkout = work / "clone"
            subprocess.run(["git", "clone", "--quiet", str(ROOT), str(checkout)], check=True)
        try:
            measured = measure(checkout, args.procs, work, setup=not args.here)
        except RuntimeError:
            # The clone goes with the temporary folder: its log is kept where it can still be read.
            kept = Path(tempfile.gettempdir()) / f"test_time-{time.strftime('%Y%m%d-%H%M%S')}.log"
            shutil.copyfile(work / "make.log", kept)
            print((work / "make.log").read_text(errors="replace")[-6000:])
            print(f"the whole log: {kept}")
            raise
    data = result(measured, args.procs, not args.here)
    for r in data["summary"]:
        print(f"{r['figure']}: {r['value']:g} {r['unit']}")
    if args.json:  # the machine as it was at the start, not after the tests' load
        write_result(args.json, "test_time", data["config"], data["summary"], [], data["notes"], machine=machine,
                     phases=data["phases"], files=data["files"])


if __name__ == "__main__":
    main()
