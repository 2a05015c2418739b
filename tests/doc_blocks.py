"""A docs page's code as it is written there, for tests that run what the docs say: a section's files (a fenced
block whose first line is a comment naming its path, ``# mypkg/model.py``) and its commands (the lines of its
``bash`` blocks, comments dropped)."""

from __future__ import annotations

import re
import shlex
import sys
from pathlib import Path
from typing import Dict, List, Tuple

FENCE = re.compile(r"^```(\w*)\n(.*?)^```", re.S | re.M)
PATH_COMMENT = re.compile(r"^# ([\w./-]+\.\w+)\s*$")


def section(page: Path, heading: str) -> str:
    """The text under ``heading`` (a whole line, ``## Title``) up to the next heading, of any level (a ``#`` line
    inside a fenced block is code, not a heading)."""
    lines = page.read_text().splitlines(keepends=True)
    start = lines.index(f"{heading}\n")
    fenced, out = False, []
    for line in lines[start + 1:]:
        if line.startswith("```"):
            fenced = not fenced
        elif not fenced and re.match(r"#+ ", line):
            break
        out.append(line)
    return "".join(out)


def blocks(text: str) -> List[Tuple[str, str]]:
    """Each fenced block of ``text``: (its language, its content)."""
    return [(m[1], m[2]) for m in FENCE.finditer(text)]


def files(text: str) -> Dict[str, str]:
    """Path -> content of every block whose first line names its path."""
    named = {}
    for _, content in blocks(text):
        first = PATH_COMMENT.match(content.splitlines()[0]) if content.strip() else None
        if first:
            named[first[1]] = content
    return named


def lines(text: str) -> List[str]:
    """The command lines of the ``bash`` blocks, in order."""
    return [line for lang, content in blocks(text) if lang == "bash" for line in content.splitlines() if line.strip()]


def commands(text: str) -> List[List[str]]:
    """The commands of the ``bash`` blocks as argument lists, in order; ``python`` is this interpreter."""
    argvs = [shlex.split(line, comments=True) for line in lines(text)]
    return [[sys.executable if a[0] == "python" else a[0], *a[1:]] for a in argvs if a]


def write_files(text: str, folder: Path) -> List[Path]:
    """The files ``text`` names, written under ``folder``."""
    written = []
    for name, content in files(text).items():
        path = folder / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(content)
        written.append(path)
    return written
