"""Issue 53's raw cases in what a run relies on around it, each one line naming the cause and the fix: a Redis that
does not speak TLS, a Redis entry someone replaced, MLflow stores that cannot be written or are locked mid-run, and
a full temporary directory.

Everything is real: a redis-server on a free port, a SQLite store held by another process, a small tmpfs (mounting
needs root; elsewhere those cases skip with the reason)."""

from __future__ import annotations

import base64
import json
import pickle

import pytest

from conftest import TINY
from pipeline.api import compose_config
from pipeline.compile import remote_entry
from pipeline.errors import ConfigError
from pipeline.preflight.checks import check_config
from pipeline.runner import run
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


@pytest.fixture
def own_home(tmp_path, monkeypatch):
    """The test's own tweakpipe directory and default Inductor cache."""
    monkeypatch.setenv("TWEAKPIPE_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor_default"))


def test_a_replaced_redis_entry_is_named_passed_over_and_compiled_again(tmp_path, own_home, caplog):
    import redis

    with redis_server() as server:
        remote = f"compile_cache.remote=redis://127.0.0.1:{server.port}"
        capture = [*TINY, "backends=[eager,inductor]", "stages=[capture]", "compile_cache.workers=0", remote]
        run(compose_config([*capture, f"compile_cache.dir={tmp_path / 'a'}"]), tmp_path / "first")
        client = redis.Redis(port=server.port)
        keys = sorted(k.decode() for k in client.keys("pt2:*"))
        assert any("fx-graph" in k for k in keys) and any("autograd" in k for k in keys), keys
        for key in keys:  # someone else's values: a pickled dict where a program was, and bytes that are not JSON
            junk = {"data": base64.b64encode(pickle.dumps({"not": "a program"})).decode()}
            client.set(key, json.dumps(junk) if "fx-graph" in key else b"\x80\x04garbage")
        with caplog.at_level("WARNING", logger="pipeline.compile.cache"):
            ctx = run(compose_config([*capture, f"compile_cache.dir={tmp_path / 'b'}"]), tmp_path / "second")
        warned = [r.getMessage() for r in caplog.records if "not a valid Inductor cache entry" in r.getMessage()]
        replaced = {key: remote_entry.problem(key, client.get(key)) for key in keys}
    outcome = ctx.outcomes["inductor"]
    assert outcome.status == "ok", outcome.reason  # the compile went on as a miss, with the program compiled here
    assert warned and all("\n" not in line for line in warned), warned
    assert all(f"the remote cache at Redis 127.0.0.1:{server.port}" in line for line in warned), warned
    assert {key for key in keys if any(key in line for line in warned)} == set(keys), (keys, warned)
    assert all("redis-cli -h 127.0.0.1 -p" in line and "compile_cache.remote" in line for line in warned), warned
    assert not any(replaced.values()), replaced  # the fresh compiles' entries took the bad ones' places
