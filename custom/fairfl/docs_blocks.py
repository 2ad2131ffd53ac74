"""The generated blocks of README.md and docs/ (`fairfl update-readme`): a block between `<!-- generated from
PATH[#Section] -->` and `<!-- end generated -->` holds that section of a benchmark output, rewritten from it."""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path

from fairfl.jobconfig import JOBS

CHECKOUT = JOBS.parent  # the fairfl checkout: README.md, docs/, jobs/

GENERATED = re.compile(
    r"^(<!-- generated from (?P<source>[^\n]+?) -->\n)(?P<body>.*?)^(<!-- end generated -->)$", re.S | re.M
)
LINK = re.compile(r"(!?\[[^\]]*\]\()(?!https?:|/|#)([^)]+)\)")


def section(markdown: str, title: str | None) -> str:
    """The part of `markdown` under the heading `title` (up to the next heading of the same or a higher level),
    or all of it for None."""
    if not title:
        return markdown
    lines = markdown.splitlines()
    for i, line in enumerate(lines):
        level = len(line) - len(line.lstrip("#"))
        if level and line[level:].strip() == title:
            end = next(
                (
                    j
                    for j in range(i + 1, len(lines))
                    if lines[j].startswith("#") and len(lines[j]) - len(lines[j].lstrip("#")) <= level
                ),
                len(lines),
            )
            return "\n".join(lines[i + 1 : end]).strip("\n") + "\n"
    raise ValueError(f"no section {title!r}")


def generated_block(source: str, base: Path) -> str:
    """The text of one generated block: the section of a benchmark output (`path#Section title`, path relative to
    `base`, the folder of the file holding the block), headings moved two levels down, relative links rewritten
    to be relative to `base`."""
    path, _, title = source.partition("#")
    file = base / path
    try:
        text = section(file.read_text(), title.replace("%20", " ") or None)
    except (OSError, ValueError) as e:
        raise ValueError(f"block {source} (its path is relative to the file holding it): {e}") from e
    folder = os.path.relpath(file.parent, base)
    text = LINK.sub(lambda m: f"{m.group(1)}{os.path.normpath(os.path.join(folder, m.group(2)))})", text)
    return re.sub(r"^(#+) ", lambda m: "#" * min(6, len(m.group(1)) + 2) + " ", text, flags=re.M)


def documentation_files(root=CHECKOUT) -> list[Path]:
    """README.md and every docs/**/*.md under `root`: the files whose generated blocks `fairfl update-readme` keeps
    and whose links the tests check."""
    root = Path(root)
    return [root / "README.md", *sorted((root / "docs").rglob("*.md"))]


def update_generated_blocks(markdown, check: bool = False) -> list[str]:
    """Rewrite every `<!-- generated from PATH[#Section] -->` ... `<!-- end generated -->` block of a Markdown file
    from its source; returns the sources whose text changed (with check=True the file is left as it is)."""
    markdown = Path(markdown)
    text = markdown.read_text()
    stale = []

    def replace(match):
        try:
            body = generated_block(match.group("source"), markdown.parent)
        except ValueError as e:
            raise ValueError(f"{markdown}: {e}") from e
        if body != match.group("body"):
            stale.append(match.group("source"))
        return match.group(1) + body + match.group(4)

    new = GENERATED.sub(replace, text)
    if stale and not check:
        markdown.write_text(new)
    return stale


def update_readme_command(args) -> int:
    files = args.files or documentation_files()
    try:
        stale = {str(file): update_generated_blocks(file, check=args.check) for file in files}
    except (ValueError, OSError) as e:
        print(f"fairfl update-readme: {e}", file=sys.stderr)
        return 1
    for file, sources in stale.items():
        if args.check and sources:
            print(f"{file}: out of date with {', '.join(sources)}; run `fairfl update-readme`", file=sys.stderr)
        else:
            print(f"{file}: {'updated ' + ', '.join(sources) if sources else 'up to date'}")
    return 1 if args.check and any(stale.values()) else 0
