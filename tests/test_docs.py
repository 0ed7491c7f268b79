"""The README is a front page and the guides live in docs/*.md (issue #35): the README stays
short, every page is linked from it, and every relative link and anchor in these pages resolves
(files and folders in the repository; anchors by GitHub's heading slugs)."""

from __future__ import annotations

import re
from pathlib import Path
from urllib.parse import unquote

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
PAGES = sorted((ROOT / "docs").glob("*.md"))
MAX_README_LINES = 250

FENCE = re.compile(r"^ {0,3}(`{3,}|~{3,})")
HEADING = re.compile(r"^ {0,3}(#{1,6})(?:[ \t]+(.*?))?(?:[ \t]+#+)?[ \t]*$")
INLINE_CODE = re.compile(r"(`+)(.+?)\1", re.S)
LINK = re.compile(r"!?\[((?:[^\[\]]|\[[^\[\]]*\])*)\]"  # [text] or ![alt], then (target "title")
                  r"\(\s*(<[^>]*>|[^\s()]+)(?:\s+\"[^\"]*\")?\s*\)")
REFERENCE = re.compile(r"^ {0,3}\[[^\]]+\]:\s*(\S+)", re.M)
IMG_SRC = re.compile(r"<img\b[^>]*\bsrc\s*=\s*[\"']([^\"']+)[\"']", re.I)
EXTERNAL = re.compile(r"^[a-z][a-z0-9+.-]*:", re.I)  # http:, https:, mailto:, ...


def prose(text: str) -> str:
    """The text without fenced code blocks (their lines blanked, so line numbers hold)."""
    out, fence = [], None
    for line in text.split("\n"):
        match = FENCE.match(line)
        if fence is None and match:
            fence = match.group(1)
            out.append("")
        elif fence is not None:
            if match and match.group(1)[0] == fence[0] and len(match.group(1)) >= len(fence):
                fence = None
            out.append("")
        else:
            out.append(line)
    return "\n".join(out)


def slugify(heading: str) -> str:
    """GitHub's anchor of a heading's text (github-slugger): the rendered text, lowercased,
    without punctuation other than '-' and '_', each space a '-'."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link's text only
    text = re.sub(r"<[^>]+>", "", text)  # HTML tags
    text = INLINE_CODE.sub(lambda m: m.group(2), text)
    return re.sub(r"[^\w\- ]", "", text.strip().lower()).replace(" ", "-")


def anchors(text: str) -> set[str]:
    """Every heading's anchor, a repeated one with GitHub's -1, -2, ... suffixes."""
    seen: dict[str, int] = {}
    result = set()
    for line in prose(text).split("\n"):
        match = HEADING.match(line)
        if not match:
            continue
        slug = original = slugify(match.group(2) or "")
        while slug in seen:
            seen[original] += 1
            slug = f"{original}-{seen[original]}"
        seen[slug] = 0
        result.add(slug)
    return result


def link_targets(text: str) -> list[str]:
    """The targets of Markdown links and images, reference definitions and <img src>, outside
    code (fenced blocks and inline code spans)."""
    text = INLINE_CODE.sub(lambda m: "`" + "x" * len(m.group(2)) + "`", prose(text))
    targets = [m.group(2).strip("<>") for m in LINK.finditer(text)]
    targets += REFERENCE.findall(text) + IMG_SRC.findall(text)
    return targets


def broken_links(page: Path, root: Path = ROOT) -> list[str]:
    """What is wrong with each relative link of a page: a path that is not there (or outside
    the repository), an anchor no heading of its page has."""
    problems = []
    for target in link_targets(page.read_text()):
        if EXTERNAL.match(target):
            continue
        path_part, _, anchor = target.partition("#")
        path = (page.parent / unquote(path_part)).resolve() if path_part else page
        where = f"{page.relative_to(root)}: ({target})"
        if not path.is_relative_to(root.resolve()):
            problems.append(f"{where} leaves the repository")
        elif not path.exists():
            problems.append(f"{where} names nothing: {path.relative_to(root.resolve())}")
        elif anchor:
            if path.suffix != ".md" or not path.is_file():
                problems.append(f"{where} has an anchor but is not a Markdown file")
            elif unquote(anchor) not in anchors(path.read_text()):
                problems.append(f"{where}: no heading of {path.name} has the anchor #{anchor}")
    return problems


def test_the_readme_is_a_front_page():
    lines = README.read_text().splitlines()
    assert len(lines) <= MAX_README_LINES, (
        f"README.md has {len(lines)} lines (at most {MAX_README_LINES}): move the detail into "
        "a page under docs/ and link it from the README's Guides")


def test_there_are_guides():
    assert len(PAGES) >= 5, [p.name for p in PAGES]


@pytest.mark.parametrize("page", [README, *PAGES], ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_and_anchor_resolves(page):
    assert broken_links(page) == []


def test_every_guide_is_linked_from_the_readme():
    linked = {(README.parent / unquote(t.partition("#")[0])).resolve()
              for t in link_targets(README.read_text()) if not EXTERNAL.match(t)}
    missing = [p.name for p in PAGES if p.resolve() not in linked]
    assert missing == [], f"docs pages the README does not link: {missing}"


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_every_guide_has_a_title_and_a_way_back(page):
    lines = page.read_text().splitlines()
    assert lines and re.match(r"# \S", lines[0]), f"{page.name} must start with a '# Title'"
    head = "\n".join(lines[:5])
    assert any(t.partition("#")[0] == "../README.md" for t in link_targets(head)), (
        f"{page.name} must link back to the README near its top")


# the checker itself: it must be able to fail


def test_slugs_follow_github():
    assert slugify("On a GPU (one NVIDIA H200)") == "on-a-gpu-one-nvidia-h200"
    assert slugify("The real model in the main job: `attnlab demo --budget-minutes 45`") == (
        "the-real-model-in-the-main-job-attnlab-demo---budget-minutes-45")
    assert slugify("SEA with fixed-size bins (`sea_pages`) and its estimators") == (
        "sea-with-fixed-size-bins-sea_pages-and-its-estimators")
    assert slugify("The page selectors' serving engine (issue #34)") == (
        "the-page-selectors-serving-engine-issue-34")
    assert slugify("See [the guide](docs/x.md) → now") == "see-the-guide--now"
    text = "# Notes\n## Notes\n```\n# not a heading\n```\n## Notes\n## Notes 1\n"
    assert anchors(text) == {"notes", "notes-1", "notes-2", "notes-1-1"}


def test_the_checker_finds_broken_links(tmp_path):
    (tmp_path / "docs" / "results" / "run").mkdir(parents=True)
    (tmp_path / "docs" / "results" / "run" / "plot.png").write_bytes(b"")
    (tmp_path / "docs" / "guide.md").write_text("# Guide\n\n## A part: `x`\n\n## A part: `x`\n")
    page = tmp_path / "README.md"
    page.write_text(
        "# Front\n\n## Guides\n\n"
        "[ok](docs/guide.md) [ok](docs/guide.md#a-part-x-1) [ok](#guides) "
        "[ok](docs/results/run/) ![ok](docs/results/run/plot.png) [ok](https://example.org/#x)\n"
        '<img src="docs/results/run/plot.png">\n'
        "`[not a link](nowhere.md)`\n```\n[not a link](nowhere.md)\n```\n"
        "[bad](docs/guid.md) [bad](docs/guide.md#a-part-x-2) [bad](#guide)\n"
        '![bad](docs/results/run/plot.svg) <img src="results/run/plot.png"> [bad](../outside.md)\n'
        "[bad, over two\nlines](docs/results/other/)\n")
    problems = broken_links(page, tmp_path)
    assert len(problems) == 7, problems
    for target in ("docs/guid.md", "#a-part-x-2", "#guide)", "plot.svg", "results/run/plot.png)",
                   "../outside.md", "docs/results/other/"):
        assert any(target in p for p in problems), (target, problems)
