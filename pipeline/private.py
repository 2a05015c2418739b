"""Paths only this user can write: the trust boundary of everything that is later run as code.

Inductor imports the generated modules and unpickles the entries it finds in its cache directory, and
tweakpipe's signing key vouches for whatever it signs. Whoever can write such a place (or swap it: write
the directory above it) can run code in this user's runs. A place is private when it and every directory
above it are owned by this user (or root) and writable by nobody else; a directory above it that others
may write must be sticky (``/tmp``), so that no one else can rename or replace what this user made there.
Read access does not matter here, only who can write.
"""

from __future__ import annotations

import os
import pwd
import stat
from pathlib import Path
from typing import Optional

# Group or others may write: the bits that let another user plant or replace a file.
OTHERS_WRITE = stat.S_IWGRP | stat.S_IWOTH


def owner_name(uid: int) -> str:
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return f"uid {uid}"


def _ancestors(path: Path) -> list:
    """The directories above ``path`` (absolute, not resolved) and above its resolved form, nearest first."""
    seen, out = set(), []
    for chain in (path.parents, path.resolve().parents):
        for parent in chain:
            if parent not in seen:
                seen.add(parent)
                out.append(parent)
    return out


def problem(path: Path, what: str) -> Optional[str]:
    """Why someone other than this user could write ``path`` or swap it (named ``what`` in the answer), or None.

    ``path`` itself must be owned by this user and writable by nobody else; the directories above it must be
    owned by this user or root and writable by nobody else unless sticky. A ``path`` that does not exist yet
    is judged by the directories above it (it will be made private)."""
    path = Path(path).expanduser().absolute()
    me = os.geteuid()
    if path.exists() or path.is_symlink():
        st = path.stat() if path.exists() else path.lstat()
        if st.st_uid != me:
            return f"{what} {path} belongs to {owner_name(st.st_uid)}, not to you ({owner_name(me)})"
        if st.st_mode & OTHERS_WRITE:
            return f"{what} {path} is writable by {_who(st.st_mode)} (mode {stat.S_IMODE(st.st_mode):04o})"
    for parent in _ancestors(path):
        if not parent.exists():
            continue
        st = parent.stat()
        if st.st_uid not in (me, 0):
            return f"{what} {path} lies in {parent}, which belongs to {owner_name(st.st_uid)}"
        if st.st_mode & OTHERS_WRITE and not st.st_mode & stat.S_ISVTX:
            return (f"{what} {path} lies in {parent}, which {_who(st.st_mode)} may write "
                    f"(mode {stat.S_IMODE(st.st_mode):04o}, not sticky), so they could replace it")
    return None


def _who(mode: int) -> str:
    return " and ".join(w for w, bit in (("its group", stat.S_IWGRP), ("others", stat.S_IWOTH)) if mode & bit)


def make_dir(path: Path) -> Path:
    """``path`` as a directory, made readable and writable by this user alone where it is new (0700); an existing
    one is left as it is (:func:`problem` judges it)."""
    path = Path(path).expanduser().absolute()
    if not path.is_dir():
        path.parent.mkdir(parents=True, exist_ok=True)
        try:
            path.mkdir(mode=0o700)
        except FileExistsError:
            pass  # made meanwhile, by another process of this run or sweep
    return path
