"""Trust in compiled artifacts, held by the user: a local signing key, as Jupyter trusts the notebooks a user ran.

A ``.tweak`` checkpoint never runs code when loaded. Compiled artifacts do (Inductor's caches are
read with pickle and hold compiled kernels), so they are used only when trusted: signed with this
user's own secret key (an HMAC-SHA256, the key made on first use in the user's tweakpipe directory and
readable by the user alone), so what this user built on this machine loads fast with no flag; or
when the caller says so. ``tweakpipe trust FILE.tweak`` (``pipeline.cli``) signs a checkpoint's artifacts after
the user has checked where they came from.

The key lives in ``$TWEAKPIPE_HOME`` (default ``~/.cache/tweakpipe``), file ``trust.key``.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import secrets
from pathlib import Path
from typing import Optional

KEY_FILE = "trust.key"
KEY_BYTES = 32


def home() -> Path:
    """tweakpipe's per-user directory: ``$TWEAKPIPE_HOME``, else ``$XDG_CACHE_HOME/tweakpipe``, else ``~/.cache/tweakpipe``."""
    if os.environ.get("TWEAKPIPE_HOME"):
        return Path(os.environ["TWEAKPIPE_HOME"]).expanduser()
    cache = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(cache).expanduser() / "tweakpipe"


def user_key(create: bool = True) -> Optional[bytes]:
    """This user's signing key, made on first use (readable by the user alone); None if absent and not created."""
    path = home() / KEY_FILE
    if path.is_file():
        return path.read_bytes()
    if not create:
        return None
    path.parent.mkdir(parents=True, exist_ok=True)
    key = secrets.token_bytes(KEY_BYTES)
    tmp = path.with_name(f"{KEY_FILE}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(key)
    try:
        os.link(tmp, path)  # another process may have made one meanwhile: the first key stays
    except FileExistsError:
        pass
    finally:
        tmp.unlink()
    return path.read_bytes()


def signature(data: bytes, key: Optional[bytes] = None) -> str:
    """The hex HMAC-SHA256 of ``data`` under ``key`` (this user's, by default)."""
    return hmac.new(key if key is not None else user_key(), data, hashlib.sha256).hexdigest()


def signed_by_user(data: bytes, recorded: str) -> bool:
    """Whether ``recorded`` is this user's signature of ``data`` (a constant-time comparison; no key: no)."""
    key = user_key(create=False)
    return key is not None and hmac.compare_digest(signature(data, key), recorded)
