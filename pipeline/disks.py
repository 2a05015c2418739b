"""A full disk, named as such: where it is, how much is free, and what to do, in one line.

A run writes to three places that can fill up: its run directory (cells, tables, the checkpoint), the
compile cache (Inductor's generated code and kernels) and the temporary directory (``$TMPDIR``: the C++
compiler's files, exported and packaged programs). Any of them failing shows up far from its cause (a
C++ compile error, tracebacks from whatever wrote last), so each is checked for room before any work
(:func:`space_problem`), every file tweakpipe writes goes through :func:`write_atomic` (which leaves no
temporary file behind and names the path), a failure anywhere is recognised by :func:`is_full`, and
:func:`full_reason` names the full one of the places it may have been.
"""

from __future__ import annotations

import errno
import os
import shutil
import tempfile
from pathlib import Path
from typing import Optional, Tuple, Union

# Room a run needs before it starts, in each of its run directory and its compile cache (a checkpoint of a
# large model needs more; that write still fails in one line).
MIN_FREE = 64 * 2**20
FULL = (errno.ENOSPC, getattr(errno, "EDQUOT", errno.ENOSPC))


class DiskFull(OSError):
    """A write ran out of disk space (or files, or quota); its message names the disk, the path and the fix."""

    def __str__(self) -> str:
        return str(self.strerror)


def is_full(exc: BaseException) -> bool:
    """Whether ``exc``, or anything it was raised from, is a disk (or quota) running out."""
    seen = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        if isinstance(exc, OSError) and exc.errno in FULL or "No space left on device" in str(exc):
            return True
        exc = exc.__cause__ or exc.__context__
    return False


def existing(path: Path) -> Path:
    """``path``, or its nearest ancestor that exists."""
    path = Path(path).absolute()
    while not path.exists() and path != path.parent:
        path = path.parent
    return path


def free_bytes(path: Path) -> int:
    return shutil.disk_usage(existing(path)).free


def size(n: float) -> str:
    for unit in ("bytes", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "bytes" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"


def full_message(path: Path, what: str, setting: Optional[str] = None) -> str:
    """The disk holding ``path`` (``what``: the run directory, compile_cache.dir) is full, how full, the fix (point
    ``setting``, else ``what``, elsewhere)."""
    where = existing(path)
    usage, stats = shutil.disk_usage(where), os.statvfs(where)
    left = (f"no room for another file: all {stats.f_files} inodes are used, {size(usage.free)} free"
            if stats.f_files and not stats.f_favail else f"{size(usage.free)} free of {size(usage.total)}")
    return (f"the disk holding {what} {path} is full ({left}); free space there or point {setting or what} at "
            f"another disk")


def space_problem(path: Path, what: str, need: int = MIN_FREE, setting: Optional[str] = None) -> Optional[str]:
    """Why ``path`` lacks the room a run needs (``need`` bytes free on its disk), or None."""
    free = free_bytes(path)
    if free >= need:
        return None
    return (f"the disk holding {what} {path} has {size(free)} free, less than the {size(need)} a run needs there; "
            f"free space there or point {setting or what} at another disk")


TEMP_SETTING = "TMPDIR"


def temp_place() -> Tuple[str, Path]:
    """The temporary directory, named as a message names it: ``$TMPDIR`` where set (the C++ compiler and other
    programs a run starts write there, even where Python found it full and took another), else Python's."""
    if os.environ.get(TEMP_SETTING):
        return f"the temporary directory ({TEMP_SETTING})", Path(os.environ[TEMP_SETTING]).absolute()
    return "the temporary directory", Path(tempfile.gettempdir())


def temp_problem() -> Optional[str]:
    """Why the temporary directory lacks the room a run needs, or None."""
    what, path = temp_place()
    return space_problem(path, what, setting=TEMP_SETTING)


def room(path: Path) -> int:
    """Bytes free on the disk holding ``path``; none where it has no inode left for another file."""
    stats = os.statvfs(existing(path))
    return 0 if stats.f_files and not stats.f_favail else free_bytes(path)


def full_reason(path: Path, what: str) -> str:
    """:func:`full_message` for a write that ran out of room while writing to ``path`` (``what``: the run directory,
    compile_cache.dir) or to the temporary directory: it names the temporary directory where that disk is the one
    with less than :data:`MIN_FREE` left and less room than ``path``'s. A full disk's error seldom names the file,
    and a compile that fails on a full ``$TMPDIR`` was writing its output to the compile cache."""
    temp_what, temp = temp_place()
    if room(temp) < min(MIN_FREE, room(path)):
        return full_message(temp, temp_what, TEMP_SETTING)
    return full_message(path, what)


def write_atomic(path: Path, data: Union[str, bytes], what: str = "file") -> Path:
    """Write ``data`` (text as UTF-8) to ``path`` through a temporary file beside it, so a reader never sees half of it; a failed
    write (a full disk, a read-only directory) removes the temporary file and raises an OSError naming ``what``,
    the path and the fix."""
    path, data = Path(path), data.encode() if isinstance(data, str) else data
    tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with tmp.open("wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except OSError as exc:
        tmp.unlink(missing_ok=True)
        if is_full(exc):
            raise DiskFull(exc.errno, f"could not write the {what} {path} ({size(len(data))}): "
                                      f"{full_message(path.parent, 'it')}") from None
        raise OSError(exc.errno, f"could not write the {what} {path} ({size(len(data))}): {exc.strerror or exc}; "
                                 f"free space there or pick a writable directory") from None
    return path


def sweep_temporaries(root: Path) -> None:
    """Remove the temporary files this process left under ``root`` (Inductor's atomic writes, ``.<pid>.*.tmp``,
    cut short by a full disk)."""
    for tmp in Path(root).rglob(f".{os.getpid()}.*.tmp"):
        tmp.unlink(missing_ok=True)
