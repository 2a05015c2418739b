"""A full disk, named as such: where it is, how much is free, and what to do, in one line.

A run writes to two places that can fill up: its run directory (cells, tables, the checkpoint) and the
compile cache (Inductor's generated code and kernels). Either failing shows up far from its cause (a
C++ compile error, tracebacks from whatever wrote last), so both are checked for room before any work
(:func:`space_problem`), every file tweakpipe writes goes through :func:`write_atomic` (which leaves no
temporary file behind and names the path), and a failure anywhere is recognised by :func:`is_full`.
"""

from __future__ import annotations

import errno
import os
import shutil
from pathlib import Path
from typing import Optional, Union

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


def full_message(path: Path, what: str) -> str:
    """The disk holding ``path`` (``what``: the run directory, compile_cache.dir) is full, how full, the fix."""
    where = existing(path)
    usage, stats = shutil.disk_usage(where), os.statvfs(where)
    left = (f"no room for another file: all {stats.f_files} inodes are used, {size(usage.free)} free"
            if stats.f_files and not stats.f_favail else f"{size(usage.free)} free of {size(usage.total)}")
    return f"the disk holding {what} {path} is full ({left}); free space there or point {what} at another disk"


def space_problem(path: Path, what: str, need: int = MIN_FREE) -> Optional[str]:
    """Why ``path`` lacks the room a run needs (``need`` bytes free on its disk), or None."""
    free = free_bytes(path)
    if free >= need:
        return None
    return (f"the disk holding {what} {path} has {size(free)} free, less than the {size(need)} a run needs there; "
            f"free space there or point {what} at another disk")


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
