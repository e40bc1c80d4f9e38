"""Every relative link of the README and of the pages in docs/ names a file that exists, and every #anchor one of
that page's headings (GitHub's anchors: lower case, punctuation dropped, spaces as hyphens)."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
HEADING = re.compile(r"^#{1,6} (.+)$", re.MULTILINE)


def anchors(page: Path) -> set[str]:
    text = re.sub(r"```.*?```", "", page.read_text(encoding="utf-8"), flags=re.DOTALL)
    out = set()
    for title in HEADING.findall(text):
        slug = re.sub(r"[^\w\- ]", "", title.strip().lower().replace("`", "")).replace(" ", "-")
        out.add(slug)
    return out


def broken_links(page: Path) -> list[str]:
    text = re.sub(r"```.*?```", "", page.read_text(encoding="utf-8"), flags=re.DOTALL)
    broken = []
    for target in LINK.findall(text):
        if re.match(r"[a-z]+:", target):  # http:, https:, mailto:
            continue
        path, _, anchor = target.partition("#")
        dest = (page.parent / path).resolve() if path else page
        if not dest.exists():
            broken.append(f"{target}: no such file")
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
            broken.append(f"{target}: no such heading")
    return broken


def test_the_docs_links_resolve() -> None:
    pages = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
    broken = {str(p.relative_to(ROOT)): b for p in pages if (b := broken_links(p))}
    assert not broken, broken
