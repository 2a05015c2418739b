"""Trust in compiled artifacts, held by the user: a local signing key, as Jupyter trusts the notebooks a user ran.

A ``.tweak`` checkpoint never runs code when loaded. Compiled artifacts do (Inductor's caches are
read with pickle and hold compiled kernels), so they are used only when trusted: signed with this
user's own secret key (an HMAC-SHA256, the key made on first use in the user's tweakpipe directory and
readable by the user alone; a key that another user owns or could read, an empty one, or one in a directory
others may write is refused, since whoever holds it can sign in the user's name), so what this user built on
this machine loads fast with no flag; or when the caller says so. ``tweakpipe trust FILE.tweak``
(``pipeline.cli``) signs a checkpoint's artifacts after the user has checked where they came from.

The key lives in ``$TWEAKPIPE_HOME`` (default ``~/.cache/tweakpipe``), file ``trust.key``.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import secrets
from pathlib import Path
import stat
from typing import Optional, Tuple

from pipeline import private
from pipeline.errors import ConfigError

KEY_FILE = "trust.key"
KEY_BYTES = 32


class KeyRefused(ConfigError):
    """The signing key (or tweakpipe's directory) is not this user's alone: nothing is signed or trusted with it."""


def home() -> Path:
    """tweakpipe's per-user directory: ``$TWEAKPIPE_HOME``, else ``$XDG_CACHE_HOME/tweakpipe``, else ``~/.cache/tweakpipe``."""
    if os.environ.get("TWEAKPIPE_HOME"):
        return Path(os.environ["TWEAKPIPE_HOME"]).expanduser().absolute()
    cache = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(cache).expanduser().absolute() / "tweakpipe"


def key_path() -> Path:
    return home() / KEY_FILE


def home_problem() -> Optional[str]:
    """Why tweakpipe's directory cannot hold this user's key (not a directory, not writable, or not private), or
    None. It is made (0700) where missing."""
    where = home()
    if where.exists() and not where.is_dir():
        return f"tweakpipe's directory {where} is a file; set TWEAKPIPE_HOME to a directory of your own"
    problem = private.problem(where, "tweakpipe's directory")
    if problem:
        return f"{problem}; set TWEAKPIPE_HOME to a directory only you can write (e.g. mkdir -m 700 ~/.tweakpipe)"
    try:
        private.make_dir(where)
    except OSError as exc:
        return f"tweakpipe's directory {where} cannot be made ({exc.strerror or exc}); set TWEAKPIPE_HOME to a writable one"
    if not os.access(where, os.W_OK | os.X_OK):
        return f"tweakpipe's directory {where} is not writable; set TWEAKPIPE_HOME to a writable one"
    return None


def key_problem(path: Path) -> Optional[str]:
    """Why the key at ``path`` is not one this user alone holds (a regular file of this user's, mode 0600, at least
    KEY_BYTES bytes), or None."""
    try:
        st = path.lstat()
    except OSError as exc:
        return f"the trust key {path} cannot be read ({exc.strerror or exc})"
    fix = f"delete it (rm -r {path}) so a new one is made, or set TWEAKPIPE_HOME to a directory of your own"
    if not stat.S_ISREG(st.st_mode):
        kind = "a symbolic link" if stat.S_ISLNK(st.st_mode) else "a directory" if stat.S_ISDIR(st.st_mode) else \
            "not a regular file"
        return f"the trust key {path} is {kind}; {fix}"
    if st.st_uid != os.geteuid():
        return (f"the trust key {path} belongs to {private.owner_name(st.st_uid)}, not to you, so they can sign in your "
                f"name; {fix}")
    if stat.S_IMODE(st.st_mode) & 0o077:
        return (f"the trust key {path} is readable or writable by others (mode {stat.S_IMODE(st.st_mode):04o}), so "
                f"they can sign in your name; chmod 600 {path} if no one else has read it, else {fix}")
    if st.st_size < KEY_BYTES:
        return f"the trust key {path} holds {st.st_size} bytes, fewer than {KEY_BYTES}; {fix}"
    if not os.access(path, os.R_OK):
        return f"the trust key {path} cannot be read (permission denied); chmod 600 {path}"
    return None


def problem(create: bool = True) -> Optional[str]:
    """Why this user has no usable signing key, or None: the directory and the key checked (the key made first
    where it is missing and ``create``). A run that will sign asks before any work; a load, before trusting."""
    why = home_problem() if create or home().exists() else None
    if why:
        return why
    path = key_path()
    if not path.exists() and not path.is_symlink():
        if not create:
            return f"you have no trust key yet ({path})"
        try:
            _make_key(path)
        except OSError as exc:
            return f"the trust key {path} cannot be made ({exc.strerror or exc}); set TWEAKPIPE_HOME to a writable directory"
    return key_problem(path)


def _make_key(path: Path) -> None:
    """A new random key at ``path``, readable by this user alone; another process may make one meanwhile: the
    first key stays."""
    tmp = path.with_name(f"{KEY_FILE}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(secrets.token_bytes(KEY_BYTES))
        os.link(tmp, path)
    except FileExistsError:
        pass
    finally:
        tmp.unlink(missing_ok=True)


def user_key(create: bool = True) -> bytes:
    """This user's signing key, made on first use (readable by the user alone); :class:`KeyRefused` naming the fix
    where it is missing (and not ``create``) or is not the user's alone."""
    why = problem(create)
    if why:
        raise KeyRefused(why)
    return key_path().read_bytes()


def signature(data: bytes, key: Optional[bytes] = None) -> str:
    """The hex HMAC-SHA256 of ``data`` under ``key`` (this user's, by default)."""
    return hmac.new(key if key is not None else user_key(), data, hashlib.sha256).hexdigest()


def signed_by_user(data: bytes, recorded: str) -> Tuple[bool, str]:
    """Whether ``recorded`` is this user's signature of ``data`` (a constant-time comparison), and where it cannot
    be, why not (no key, or a key that is not this user's alone)."""
    why = problem(create=False)
    if why:
        return False, why
    return hmac.compare_digest(signature(data, key_path().read_bytes()), recorded), ""
