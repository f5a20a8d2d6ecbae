"""The repository stands on its own (issue 31): no Markdown or Python file points at the
workspace files simgraph started from, which a clone does not have, and every relative link
in the Markdown files (README.md, docs/, the READMEs beside the code) reaches a file of the
repository — and, for ``file.md#anchor``, a heading of that file."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# The files searched for references outside the repository.
CHECKED = (".md", ".py", ".yaml", ".yml", ".toml")
# References to the workspace outside the repository: its design note, its Ray notes and its
# copies of the papers. docs/design.md and docs/ray-notes.md replace them; papers are cited
# by title and arXiv id. (Written so that this file does not match itself.)
OUTSIDE = re.compile(r"\.\./shared/|\bshared/(?:DESIGN|RAY-NOTES|papers)\b"
                     r"|\bDESIGN\.md\b|\bRAY-NOTES\.md\b")
LINK = re.compile(r"!?\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")  # [text](target)
HTML = re.compile(r"<(?:img|a)\b[^>]*?\b(?:src|href)=\"([^\"]+)\"")
FENCE = re.compile(r"^(```|~~~).*?^\1", re.S | re.M)
CODE = re.compile(r"`[^`\n]*`")


def repo_files(suffixes: tuple[str, ...]) -> list[Path]:
    """The repository's files (tracked, or new and not ignored) with one of ``suffixes``;
    without git (an unpacked archive), every such file outside hidden and ignored folders."""
    try:
        listed = subprocess.run(
            ["git", "ls-files", "--cached", "--others", "--exclude-standard", "-z"],
            cwd=ROOT, capture_output=True, check=True).stdout.decode().split("\0")
        paths = [ROOT / p for p in listed if p]
    except (OSError, subprocess.CalledProcessError):
        paths = [p for p in ROOT.rglob("*") if not any(
            part.startswith(".") or part.endswith(".egg-info") or part == "__pycache__"
            for part in p.relative_to(ROOT).parts)]
    return sorted(p for p in paths if p.suffix in suffixes and p.is_file())


def _prose(text: str) -> str:
    """Markdown without code blocks and inline code (examples there are not links)."""
    return CODE.sub("", FENCE.sub("", text))


def anchors(md: Path) -> set[str]:
    """GitHub's anchors of a Markdown file's headings: lower case, punctuation dropped (word
    characters, hyphens and spaces kept), spaces to hyphens; a repeated one gets -1, -2, …"""
    seen: dict[str, int] = {}
    out = set()
    for line in FENCE.sub("", md.read_text(encoding="utf-8")).splitlines():
        m = re.match(r"#{1,6}\s+(.*?)\s*#*\s*$", line)
        if not m:
            continue
        slug = re.sub(r"[^\w\- ]", "", m.group(1).strip().lower()).replace(" ", "-")
        n = seen.get(slug, 0)
        seen[slug] = n + 1
        out.add(slug if n == 0 else f"{slug}-{n}")
    return out


def broken_links(md: Path, root: Path = ROOT) -> list[str]:
    """``md``'s relative links (Markdown and HTML ``src`` / ``href``) whose file is not in the
    repository at ``root``, or whose ``#anchor`` is not a heading of its Markdown file."""
    text = _prose(md.read_text(encoding="utf-8"))
    bad = []
    for target in LINK.findall(text) + HTML.findall(text):
        if re.match(r"[a-z][a-z0-9+.-]*:", target, re.I):  # http(s)://, mailto:, …
            continue
        path, _, anchor = target.partition("#")
        dest = (md.parent / path).resolve() if path else md
        if not dest.is_relative_to(root) or not dest.exists():
            bad.append(f"{target} (no such file in the repository)")
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
            bad.append(f"{target} (no heading #{anchor} in {dest.relative_to(root)})")
    return bad


def test_no_file_points_outside_the_repository() -> None:
    files = repo_files(CHECKED)
    assert any(p.name == "README.md" for p in files) and any(p.suffix == ".py" for p in files)
    found = [f"{p.relative_to(ROOT)}:{n}: {line.strip()}"
             for p in files
             for n, line in enumerate(p.read_text(encoding="utf-8").splitlines(), 1)
             if OUTSIDE.search(line)]
    assert not found, ("files refer to paths outside the repository (point to docs/design.md "
                       "or docs/ray-notes.md instead):\n" + "\n".join(found))


def test_every_relative_link_in_the_markdown_files_resolves() -> None:
    docs = repo_files((".md",))
    assert ROOT / "README.md" in docs and ROOT / "docs" / "design.md" in docs
    bad = [f"{md.relative_to(ROOT)}: {b}" for md in docs for b in broken_links(md)]
    assert not bad, "broken links:\n" + "\n".join(bad)


def test_the_link_checks_catch_what_they_should(tmp_path: Path) -> None:
    """The checks themselves: an outside reference, a missing file, a missing anchor; code
    spans, URLs and good links pass."""
    assert OUTSIDE.search("see ../" + "shared/" + "DESIGN" + ".md")
    assert OUTSIDE.search("(RAY-" + "NOTES.md)") and not OUTSIDE.search("docs/ray-notes.md")
    assert not OUTSIDE.search("--base-dir /shared/simgraph")  # a path on a cluster, not ours
    md = ROOT / "docs" / "design.md"
    text = md.read_text(encoding="utf-8")
    assert "[ray-notes.md](ray-notes.md)" in text and not broken_links(md)
    root = tmp_path.resolve()
    (root / "docs").mkdir()
    (root / "docs" / "design.md").write_text("# Layout\n```\n# not a heading\n```\n")
    (root / "outside.md").write_text("# Outside\n")
    fake = root / "docs" / "page.md"
    fake.write_text("# A title\n[ok](design.md#layout) [self](#a-title) [up](../outside.md) "
                    "[web](https://example.org/x.md) `[code](nowhere.md)`\n"
                    "```\n[block](nowhere.md)\n```\n"
                    "[gone](nowhere.md) [anchor](design.md#not-a-heading) "
                    "<img src=\"img/none.png\">\n", encoding="utf-8")
    assert broken_links(fake, root) == [
        "nowhere.md (no such file in the repository)",
        "design.md#not-a-heading (no heading #not-a-heading in docs/design.md)",
        "img/none.png (no such file in the repository)"]
    assert broken_links(fake, root / "docs") == [  # a repository that is docs/ alone
        "../outside.md (no such file in the repository)",
        "nowhere.md (no such file in the repository)",
        "design.md#not-a-heading (no heading #not-a-heading in design.md)",
        "img/none.png (no such file in the repository)"]
