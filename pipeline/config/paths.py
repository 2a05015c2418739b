"""Whether a run can write where it is told to, asked before any work and leaving nothing behind."""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Optional


def writable_problem(directory: Path) -> Optional[str]:
    """Why files cannot be written in ``directory`` (created if missing), or None.

    Permission bits do not answer this (root ignores them, a read-only mount does not), so an
    anonymous temporary file is made in the directory, or in its nearest existing ancestor.
    """
    existing = Path(directory).absolute()
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    if not existing.is_dir():
        return f"{existing} is a file, so the directory {directory} cannot be made"
    try:
        with tempfile.TemporaryFile(dir=existing):
            pass
    except OSError as exc:
        return f"cannot write in {existing} ({exc.strerror or exc})"
    return None
