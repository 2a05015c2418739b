"""The raw evidence behind bench/results is one archive per measurement date (issue 55): the folder tracks at most 20
files, and every path into it that a tracked file names is a tracked file there or a member of an archive, so no
README, docstring or result points at evidence that is gone."""

from __future__ import annotations

import fnmatch
import re
import subprocess
import tarfile
from typing import Dict, List

from conftest import ROOT

RAW = "bench/results/raw"
# A path into the folder: from the repository root anywhere, from bench/results/ in its Markdown (the README's
# `raw/...`). Not a path inside another path, nor one after a commit's `SHA:` (an older tree, as `git show` reads it).
FROM_ROOT = re.compile(r"(?<![\w/.:-])bench/results/raw/([\w.{},*/-]*[\w*}/])")
FROM_RESULTS = re.compile(r"(?<![\w/.:-])raw/([\w.{},*/-]*[\w*}/])")


def tracked() -> List[str]:
    """The repository's tracked files, as git lists them."""
    listing = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, text=True, check=True)
    return [path for path in listing.stdout.split("\0") if path]


def members(files: List[str]) -> Dict[str, List[str]]:
    """Each archive's member files, which all lie under the folder named as the archive (its date)."""
    found = {}
    for path in files:
        if path.startswith(RAW + "/") and path.endswith(".tar.xz"):
            date = path[len(RAW) + 1:-len(".tar.xz")]
            with tarfile.open(ROOT / path, "r:xz") as archive:
                found[date] = [m.name for m in archive.getmembers() if m.isfile()]
            assert found[date] and all(name.startswith(date + "/") for name in found[date]), (path, found[date][:5])
    return found


def expand(pattern: str) -> List[str]:
    """``a{b,c}d`` as the shell expands it: ``abd``, ``acd``."""
    braces = re.search(r"\{([^{}]*)\}", pattern)
    if not braces:
        return [pattern]
    return [whole for choice in braces.group(1).split(",")
            for whole in expand(pattern[:braces.start()] + choice + pattern[braces.end():])]


def resolves(rest: str, files: List[str], archived: List[str], record: bool) -> bool:
    """Whether every expansion of ``raw/REST`` is a tracked file (or folder) there or an archive member (``DATE/NAME``);
    a bench's JSON record names a file where it lay when the bench ran (``raw/NAME``): a member by that name."""
    def found(pattern: str, names: List[str]) -> bool:
        return any(fnmatch.fnmatchcase(name, pattern) or name.startswith(pattern.rstrip("/") + "/") for name in names)

    return all(found(f"{RAW}/{path}", files) or found(path, archived) or (record and found(f"*/{path}", archived))
               for path in expand(rest))


def test_the_raw_folder_tracks_at_most_twenty_files():
    inside = [path for path in tracked() if path.startswith(RAW + "/")]
    assert len(inside) <= 20, f"{RAW} tracks {len(inside)} files; put raw evidence into its date's archive"


def test_every_path_into_the_raw_folder_names_a_file_or_an_archive_member():
    files = tracked()
    archived = [name for names in members(files).values() for name in names]
    assert len(archived) == len(set(name.split("/", 1)[1] for name in archived)), "a file name in two archives"
    dangling, seen = [], 0
    for path in files:
        if path.endswith((".xz", ".gz", ".tgz", ".png")):
            continue
        data = (ROOT / path).read_bytes()
        if b"\0" in data:
            continue
        text = data.decode("utf-8", "replace")
        patterns = [FROM_ROOT] + ([FROM_RESULTS] if path.startswith("bench/results/") and path.endswith(".md") else [])
        record = path.startswith("bench/results/") and path.endswith(".json")
        for pattern in patterns:
            for match in pattern.finditer(text):
                seen += 1
                if not resolves(match.group(1), files, archived, record):
                    dangling.append(f"{path}: {match.group(0)}")
    assert seen > 100, f"only {seen} paths into {RAW} found: the patterns no longer read bench/results/README.md"
    assert not dangling, "paths to raw evidence that is in no file and no archive:\n" + "\n".join(dangling)
