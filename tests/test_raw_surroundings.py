"""Issue 53's raw cases in what a run relies on around it, each one line naming the cause and the fix: a Redis that
does not speak TLS, a Redis entry someone replaced, MLflow stores that cannot be written or are locked mid-run, and
a full temporary directory.

Everything is real: a redis-server on a free port, a SQLite store held by another process, a small tmpfs (mounting
needs root; elsewhere those cases skip with the reason)."""

from __future__ import annotations

import pytest

from conftest import TINY
from pipeline.api import compose_config
from pipeline.errors import ConfigError
from pipeline.preflight.checks import check_config
from redis_helpers import redis_server


# --- Redis ----------------------------------------------------------------------------------------------------


def test_rediss_to_a_plain_redis_says_the_server_does_not_speak_tls():
    with redis_server() as server:
        with pytest.raises(ConfigError) as caught:
            check_config(compose_config([*TINY, f"compile_cache.remote=rediss://127.0.0.1:{server.port}"]))
    message = str(caught.value)
    assert "\n" not in message and "stalled" not in message, message
    assert f"the Redis at 127.0.0.1:{server.port} does not speak TLS" in message, message
    assert f"use redis://127.0.0.1:{server.port}" in message and "tls-port" in message, message
