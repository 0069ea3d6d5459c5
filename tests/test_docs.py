"""Every relative link in the README and docs/ names a file that exists and, after '#', a heading in it.

The docs cross-link dated sections by their headings' anchors; a renamed heading breaks them silently.
"""

import functools
import re
import unicodedata
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
FENCE = re.compile(r"^```.*?^```", re.DOTALL | re.MULTILINE)


def slug(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, letters, digits, '-' and '_' kept, spaces as '-'."""
    kept = (c for c in heading.strip().lower()
            if c in "-_ " or unicodedata.category(c)[0] in "LN")
    return "".join(kept).replace(" ", "-")


@functools.cache
def prose(page: Path) -> str:
    """The page without its fenced code blocks, where '#' lines and brackets are code, not Markdown."""
    return FENCE.sub("", page.read_text())


@functools.cache
def anchors(page: Path) -> set[str]:
    seen: dict[str, int] = {}
    out = set()
    for line in prose(page).splitlines():
        if match := re.match(r"#{1,6} (.+)", line):
            base = slug(match.group(1))
            n = seen.get(base, 0)
            seen[base] = n + 1
            out.add(base if n == 0 else f"{base}-{n}")
    return out


def test_slug_follows_githubs_rule():
    assert slug("`make train` at 863a714, after the day's review fixes (2026-12-01, evening)") == (
        "make-train-at-863a714-after-the-days-review-fixes-2026-12-01-evening")
    assert slug("B = 32 prompts × G = 8, −15%") == "b--32-prompts--g--8-15"


def test_every_relative_link_and_anchor_resolves():
    broken = []
    for page in PAGES:
        for target in LINK.findall(prose(page)):
            if re.match(r"[a-z]+:", target):
                continue  # http(s), mailto: not checked offline
            path, _, anchor = target.partition("#")
            linked = (page.parent / path).resolve() if path else page
            if not linked.exists():
                broken.append(f"{page.name}: {target} (no file {path})")
            elif anchor and linked.suffix == ".md" and anchor not in anchors(linked):
                broken.append(f"{page.name}: {target} (no heading with that anchor in {linked.name})")
    assert not broken, "\n".join(broken)
