"""Credentials in URLs, redacted wherever a run writes: the one rule for every record it leaves.

A password may come in a URL (``compile_cache.remote=redis://:PASSWORD@host:port``, a tracking server at
``http://user:PASSWORD@host``), and Hydra, MLflow and a log keep whatever they are given: the command line's
overrides, the composed config, tags, params, messages. Whoever can read the store or the run directory could
then write the cache, which runs code in everyone's runs. So everything a run writes (``config.yaml``,
``run.json``, MLflow params and tags, the log, Hydra's ``.hydra/`` files and ``multirun.yaml``) passes through
:func:`redacted`: each URL's password, and the value of a query parameter named like a secret (``?password=``,
``&token=``), becomes ``***``; so does a user name given alone (``https://TOKEN@host``), since services take an
access token in that place and no rule tells a name from a token (a user name beside a password is kept: it names
an account, it does not open it). The run itself still uses the real URL; a resumed run, reading the redacted one
from ``config.yaml``, takes the password from the environment (``$TWEAKPIPE_REDIS_PASSWORD``, MLflow's
``$MLFLOW_TRACKING_PASSWORD``).
"""

from __future__ import annotations

import logging
import re
from typing import Any, Mapping, Optional

REDACTED = "***"
# scheme://[user]:password@ -- the password runs to the authority's last "@", as urllib.parse splits it; a sweep
# job's overrides come escaped by Hydra (redis\://\:password@...).
_SCHEME = r"[A-Za-z][A-Za-z0-9+.-]*\\?://"
_USERINFO = re.compile(rf"(?P<head>{_SCHEME}[^\s/?#:]*):(?P<secret>[^\s/?#]+)@")
# scheme://name@ with no password: the name may be a token (https://TOKEN@host), so all of it goes.
_USER_ONLY = re.compile(rf"(?P<head>{_SCHEME})[^\s/?#:@]+@")
# ?password=... or &token=...: a query value named like a secret.
_QUERY = re.compile(r"(?P<head>[?&;][\w.-]*(?:pass|pwd|token|secret|api[_-]?key|access[_-]?key|auth|signature)"
                    r"[\w.-]*=)(?P<secret>[^&#\s]+)", re.IGNORECASE)


def _text(text: str) -> str:
    text = _USER_ONLY.sub(rf"\g<head>{REDACTED}@", _USERINFO.sub(rf"\g<head>:{REDACTED}@", text))
    return _QUERY.sub(rf"\g<head>{REDACTED}", text)


def redacted(value: Any) -> Any:
    """``value`` with the credentials of every URL in it replaced by ``***``: a string (an override, a log line, a
    file's text), or every string inside a mapping or a list (a config, tags, params), as a new container; anything
    else as it is."""
    if isinstance(value, str):
        return _text(value)
    if isinstance(value, Mapping):
        return {redacted(key): redacted(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(redacted(item) for item in value)
    return value


class RedactingFormatter(logging.Formatter):
    """A log handler's formatter whose every line (message, arguments, traceback) comes out :func:`redacted`."""

    def __init__(self, inner: Optional[logging.Formatter] = None) -> None:
        super().__init__()
        self.inner = inner or logging.Formatter()

    def format(self, record: logging.LogRecord) -> str:
        return redacted(self.inner.format(record))


def redact_log(handler: logging.Handler) -> None:
    """Make ``handler`` write its lines :func:`redacted` from now on (once: a handler already so is left)."""
    if not isinstance(handler.formatter, RedactingFormatter):
        handler.setFormatter(RedactingFormatter(handler.formatter))
