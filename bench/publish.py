"""``python -m bench.publish [--check]``: the documentation's figures, rendered from the stored results.

Reads only the JSON files in ``docs/benchmarks/`` (no benchmark runs) and writes:

- ``docs/benchmarks.md``: every stored figure (:func:`bench.render.benchmarks_page`);
- the figure blocks of ``README.md`` and of any page in ``docs/`` that has one: the lines between
  ``<!-- figures: NAME -->`` and ``<!-- /figures -->`` are replaced with :func:`bench.readme_figures.render_block`'s
  text, and nothing outside the markers changes.

``--check`` writes nothing and exits 1 when a page differs from what the stored results render to (a hand-typed
figure, or results stored without publishing). ``webgym-engine bench SUITE... --publish docs`` calls :func:`publish`:
the run's results are copied into ``docs/benchmarks/`` first, then rendered with the same code.
"""

from __future__ import annotations

import argparse
import difflib
import json
import posixpath
import re
import shutil
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from bench.readme_figures import render_block
from bench.render import FigureError, Store, benchmarks_page, results_summary
from bench.suite import ROOT, SuiteResult, summary_rows

OPEN = re.compile(r"<!-- figures: (?P<name>\S+) -->")
CLOSE = "<!-- /figures -->"
LINK = re.compile(r"\]\((?P<target>docs/[^)\s]*)\)")  # a Markdown link into docs/, as a block writes it
PAGE = "benchmarks.md"  # generated whole, in the docs directory
STORE = "benchmarks"  # the stored results, a folder of the docs directory


def load_store(folder: Path) -> Store:
    """Every JSON file in ``folder`` by stem."""
    return {p.stem: json.loads(p.read_text(encoding="utf-8")) for p in sorted(folder.glob("*.json"))}


def rebase_links(text: str, folder: str) -> str:
    """``text`` (a block, its links written from the project's root) with every link into ``docs/`` made relative
    to ``folder``, the page's folder from the root (``""`` for the README, ``"docs"`` for a page in docs/)."""
    if not folder:
        return text
    return LINK.sub(lambda m: f"]({posixpath.relpath(m['target'], folder)})", text)


def replace_blocks(text: str, store: Store, folder: str = "") -> str:
    """``text`` with every figure block rendered again from ``store``, its links made relative to ``folder`` (the
    page's folder from the project's root, see :func:`rebase_links`); the lines outside the markers are kept as
    they are. A marker line is one that holds the marker alone."""
    out: list[str] = []
    lines = text.splitlines(keepends=True)
    i = 0
    while i < len(lines):
        line = lines[i]
        opening = OPEN.fullmatch(line.strip())
        if line.strip() == CLOSE:
            raise FigureError(f"line {i + 1}: {CLOSE} without an opening marker")
        out.append(line)
        i += 1
        if not opening:
            continue
        end = i
        while end < len(lines) and lines[end].strip() != CLOSE:
            if OPEN.fullmatch(lines[end].strip()):
                raise FigureError(f"line {end + 1}: a figure block opens inside {opening['name']!r}")
            end += 1
        if end == len(lines):
            raise FigureError(f"the figure block {opening['name']!r} (line {i}) has no {CLOSE}")
        out.append(rebase_links(render_block(opening["name"], store), folder))
        out.append(lines[end])
        i = end + 1
    return "".join(out)


def rendered_pages(docs: Path, readme: Path | None) -> dict[Path, str]:
    """What ``docs/benchmarks.md`` and every page with a figure block (``readme`` and the pages in ``docs``) render
    to from ``docs/benchmarks/``."""
    store = load_store(docs / STORE)
    pages = {docs / PAGE: benchmarks_page(store)}
    for page in [readme, *sorted(docs.glob("*.md"))]:
        if page is None or not page.exists() or page == docs / PAGE:
            continue
        text = page.read_text(encoding="utf-8")
        if any(OPEN.fullmatch(line.strip()) for line in text.splitlines()):
            pages[page] = replace_blocks(text, store, "" if page == readme else docs.name)
    return pages


def stale_pages(docs: Path, readme: Path | None) -> dict[Path, str]:
    """The pages whose text differs from what the stored results render to, with that text."""
    return {p: text for p, text in rendered_pages(docs, readme).items()
            if not p.exists() or p.read_text(encoding="utf-8") != text}


def write_pages(docs: Path, readme: Path | None) -> list[Path]:
    """Render every page from the stored results; returns the pages that changed."""
    changed = stale_pages(docs, readme)
    for page, text in changed.items():
        page.write_text(text, encoding="utf-8")
    return list(changed)


def _has_figures(path: Path) -> bool:
    try:
        return bool(json.loads(path.read_text(encoding="utf-8")).get("figures"))
    except (OSError, ValueError):
        return False


def publish(out: Path, docs: Path, results: Sequence[SuiteResult]) -> Path:
    """After a run: copy its results (``<suite>.json``, plots, the overhead suite's py-spy sample) from ``out`` into
    ``DOCS/benchmarks/``, then render ``DOCS/benchmarks.md`` and the figure blocks (of ``DOCS/../README.md`` when
    it exists) from everything stored there. Returns the path of ``benchmarks.md``."""
    store = docs / STORE
    store.mkdir(parents=True, exist_ok=True)
    for r in results:
        target = store / f"{r.suite}.json"
        if r.skipped and _has_figures(target):  # e.g. a GPU run's stored figures outlive a run without a GPU
            print(f"[publish] {r.suite}: skipped in this run ({r.skipped}); the stored figures are kept", flush=True)
            continue
        for p in r.plots:
            shutil.copy2(out / p, store / p)
        shutil.copy2(out / f"{r.suite}.json", target)
    for profile in out.glob("engine-pyspy-0.txt"):  # the overhead suite's py-spy sample (first repeat)
        shutil.copy2(profile, store / profile.name)
    readme = docs.resolve().parent / "README.md"
    write_pages(docs, readme if readme.exists() else None)
    return docs / PAGE


def summary_markdown(results: Sequence[SuiteResult], machine: dict[str, Any]) -> str:
    """A results directory's ``summary.md`` for ``results``."""
    return results_summary([r.to_dict(machine) for r in results])


def write_summary(out: Path, results: Sequence[SuiteResult], machine: dict[str, Any], scale: str) -> Path:
    """``summary.md`` and ``summary.json`` in a results directory ``out``."""
    out.mkdir(parents=True, exist_ok=True)
    (out / "summary.json").write_text(json.dumps({"scale": scale, "machine": machine,
                                                  "rows": summary_rows(results)}, indent=2) + "\n")
    path = out / "summary.md"
    path.write_text(summary_markdown(results, machine), encoding="utf-8")
    return path


def main(argv: list[str] | None = None) -> int:
    """Command line: render (or ``--check``) the pages; 0 when they are up to date, 1 when ``--check`` finds a
    stale page, 2 when a cited figure is not stored."""
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--docs", type=Path, default=ROOT / "docs", help="the docs directory (default: docs/)")
    ap.add_argument("--readme", type=Path, default=ROOT / "README.md", help="the README (default: README.md)")
    ap.add_argument("--check", action="store_true", help="write nothing; exit 1 when a page differs")
    args = ap.parse_args(argv)
    try:
        if not args.check:
            changed = write_pages(args.docs, args.readme)
            print("\n".join(f"wrote {p}" for p in changed) or "up to date")
            return 0
        stale = stale_pages(args.docs, args.readme)
    except FigureError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    for page, text in stale.items():
        old = page.read_text(encoding="utf-8").splitlines() if page.exists() else []
        diff = list(difflib.unified_diff(old, text.splitlines(), str(page), "rendered", lineterm="", n=1))
        print("\n".join(diff[:60] + ([f"... ({len(diff) - 60} more lines)"] if len(diff) > 60 else [])))
    if stale:
        print(f"stale: {', '.join(map(str, stale))} (run `python -m bench.publish`)", file=sys.stderr)
    return 1 if stale else 0


if __name__ == "__main__":
    sys.exit(main())
