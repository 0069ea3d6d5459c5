"""Every relative link in the README and docs/ names a file that exists and, after '#', a heading in it (a renamed
heading breaks its links silently); and the pages name no local path of a build machine and no issue number.
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


LOCAL_PATH = re.compile(r"(?<![\w.~$-])/(?:work|home|root|tmp|Users|mnt|scratch|private|var/folders)/")
TRACKER_REF = re.compile(r"\bissues?\s+#?\d+|\bPR\s+#?\d+|(?<![\w(/&#])#\d+(?![\w-])", re.IGNORECASE)


def leaks(text: str) -> list[str]:
    """Absolute paths of a build machine's own files (not system paths such as /usr/games/stockfish) and
    references to a tracker's issues, each with its line: the pages speak of the project only."""
    found = []
    for number, line in enumerate(text.splitlines(), 1):
        found += [f"line {number}: {m.group(0)!r}" for rx in (LOCAL_PATH, TRACKER_REF) for m in rx.finditer(line)]
    return found


def test_leaks_finds_local_paths_and_issue_numbers_not_system_paths_or_anchors():
    assert len(leaks("git clone -q /mnt/ci/repo r\n/home/me/x, `/tmp/run`, /Users/a/b, /root/.cache/x")) == 5
    assert len(leaks("Issue 18's targets\nissue #19\nfixed in #18.\nPR 7")) == 4
    assert leaks("Stockfish at /usr/games/stockfish, `/proc/cpuinfo`, /dev/null, runs/tmp/x, $HOME/tmp/y") == []
    assert leaks("[a](results.md#32-prompts) [b](#18-steps) C# &#123; 2 #s") == []


def test_pages_name_no_local_path_and_no_issue_number():
    found = [f"{page.name} {leak}" for page in PAGES for leak in leaks(page.read_text())]
    assert not found, "\n".join(found)
