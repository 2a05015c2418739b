"""The folders a load installs trusted compiled artifacts into: owned like the signing key.

A load with trusted artifacts (``pipeline.compile.artifacts``) writes native code (Inductor's cache entries, C++
libraries, programs built ahead of time) to disk and then runs it. A signature vouches for the bytes it covers, not
for the file a loader later opens: whoever can write the folder in between (make it first, swap a file in, plant a
library at a path the install would keep, or a link that sends a write elsewhere) decides what runs. So:

- ``loads/`` lies in tweakpipe's own directory (``pipeline.trust.home``, which must be private), is made 0700, and
  is refused, with the reason in one line (the load then rebuilds its backends), where it is a symbolic link,
  belongs to someone else or is writable by others;
- every load installs into a fresh folder of its own (``mkdtemp``: made 0700 by this process, empty, named by
  nobody else), never into one an earlier process made, so nothing planted there before is ever kept or loaded;
- every file is created new (``O_EXCL``, ``O_NOFOLLOW``): a write never follows a link and never replaces a file;
- what a loader opens is checked against the signed bytes once it is on disk (:func:`verified`), right before
  the loader opens it.

The folders of the last :data:`KEEP` loads are kept (a served process may still read from its own); older ones are
removed.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import os
import shutil
import stat
import tempfile
from pathlib import Path
from typing import Iterator, Optional

from pipeline import disks, private, trust

LOADS = "loads"  # under tweakpipe's directory
KEEP = 16  # load folders kept, most recently made first


class Refused(OSError):
    """``loads/`` cannot hold a load's native code: its message names why and the fix (the load rebuilds)."""

    def __str__(self) -> str:
        return str(self.strerror)


def root() -> Path:
    return trust.home() / LOADS


def problem() -> Optional[str]:
    """Why ``loads/`` may not hold a load's native code, or None: tweakpipe's directory must be private
    (``pipeline.trust.home_problem``), and ``loads/`` a real directory of this user's that nobody else may write."""
    why = trust.home_problem()
    if why:
        return why
    where = root()
    try:
        st = where.lstat()
    except FileNotFoundError:
        return None
    except OSError as exc:
        return f"tweakpipe's load folder {where} cannot be read ({exc.strerror or exc}); {fix(where)}"
    if stat.S_ISLNK(st.st_mode):
        return f"tweakpipe's load folder {where} is a symbolic link (to {os.readlink(where)}); {fix(where)}"
    if not stat.S_ISDIR(st.st_mode):
        return f"tweakpipe's load folder {where} is not a directory; {fix(where)}"
    if st.st_uid != os.geteuid():
        return f"tweakpipe's load folder {where} belongs to {private.owner_name(st.st_uid)}, not to you; {fix(where)}"
    if st.st_mode & private.OTHERS_WRITE:
        return (f"tweakpipe's load folder {where} is writable by others (mode {stat.S_IMODE(st.st_mode):04o}); "
                f"{fix(where)}")
    return None


def fix(where: Path) -> str:
    return f"remove it (rm -r {where}: tweakpipe makes a private one) or set TWEAKPIPE_HOME to a directory of your own"


def failure(exc: OSError, where: Path) -> str:
    """``exc``, raised while a load's folder was made or filled, as the one line a load says: the disk, or the
    permission, and the fix."""
    if isinstance(exc, Refused):
        return str(exc)
    if disks.is_full(exc):
        return disks.full_message(where, "tweakpipe's load folder")
    if exc.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
        return (f"tweakpipe's load folder {where} is not writable ({exc.strerror}); make it writable or set "
                f"TWEAKPIPE_HOME to a directory of your own")
    return f"tweakpipe's load folder {where} could not be written ({type(exc).__name__}: {exc})"


@contextlib.contextmanager
def fresh(label: str) -> Iterator[Path]:
    """A new, empty folder of this process's own under ``loads/`` (0700), ``label`` in its name; the oldest folders
    beyond :data:`KEEP` are removed. Raises :class:`Refused` (``loads/`` is not private) or the OSError that made
    it fail (a full disk, no permission): :func:`failure` words either."""
    why = problem()
    if why:
        raise Refused(errno.EPERM, why)
    base = root()
    with contextlib.suppress(FileExistsError):
        base.mkdir(mode=0o700)
    why = problem()  # made meanwhile by someone else, or a link put in its place
    if why:
        raise Refused(errno.EPERM, why)
    where = Path(tempfile.mkdtemp(prefix=f"{label[:32]}-", dir=base))
    prune(base)
    yield where


def prune(base: Path, keep: int = KEEP) -> None:
    """Remove all but the ``keep`` most recently made load folders under ``base`` (real directories only: a link
    is never followed)."""
    folders = [p for p in base.iterdir() if stat.S_ISDIR(p.lstat().st_mode)]
    for stale in sorted(folders, key=lambda p: p.lstat().st_mtime, reverse=True)[keep:]:
        shutil.rmtree(stale, ignore_errors=True)


def create(path: Path, data: bytes) -> Path:
    """``data`` in a new file at ``path`` (0600), its folders made as needed: never through a link, never over a file
    that is there already (FileExistsError)."""
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0), 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(data)
    return path


def verified(path: Path, digest: str) -> Path:
    """``path``, once it holds exactly the bytes of SHA-256 ``digest`` as a regular file of this user's; ValueError
    names what differs. What a loader opens is checked after it was installed, not before."""
    st = path.lstat()
    if not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid():
        raise ValueError(f"{path} is no longer the file the load wrote (a link, or someone else's)")
    if hashlib.sha256(path.read_bytes()).hexdigest() != digest:
        raise ValueError(f"{path} no longer holds the signed program (its SHA-256 changed after it was written)")
    return path
