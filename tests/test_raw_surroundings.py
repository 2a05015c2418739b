"""Issue 53's raw cases in what a run relies on around it, each one line naming the cause and the fix: a Redis that
does not speak TLS, a Redis entry someone replaced, MLflow stores that cannot be written or are locked mid-run, and
a full temporary directory.

Everything is real: a redis-server on a free port, a SQLite store held by another process, a small tmpfs (mounting
needs root; elsewhere those cases skip with the reason)."""

from __future__ import annotations

import base64
import contextlib
import json
import pickle
import sqlite3
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Iterator

import pytest

from conftest import ROOT, TINY, read_only, tmpfs
from mlflow_helpers import clean_env, copy_store, init_store
from pipeline.api import compose_config
from pipeline.compile import remote_entry
from pipeline.errors import ConfigError
from pipeline.preflight.checks import check_config
from pipeline.preflight.prepare import prepare
from pipeline.record.store import check_store
from pipeline.runner import build_context, run
from redis_helpers import redis_server
from stages import capture


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
        # Inductor's entries at least (AOTAutograd's too where its cache takes this graph: in the full suite's worker
        # processes it sometimes does not, after other tests' compiles)
        assert any("fx-graph" in k for k in keys), keys
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


# --- MLflow stores ----------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    db = tmp_path_factory.mktemp("template") / "mlflow.db"
    init_store(db)
    return db


@pytest.mark.parametrize("existing", [False, True], ids=["new-store", "existing-store"])
def test_a_tracking_folder_that_cannot_be_written_is_one_line_naming_the_fix(tmp_path, template, existing):
    folder = tmp_path / "tracking"
    uri = copy_store(template, folder) if existing else f"sqlite:///{folder / 'mlflow.db'}"
    folder.mkdir(exist_ok=True)
    with read_only(folder), pytest.raises(ConfigError) as caught:
        check_store(uri)
    message = str(caught.value)
    assert "\n" not in message and f"cannot write in {folder}" in message, message
    assert "make it writable, or point tracking.uri at a new file" in message, message


def test_a_store_whose_lock_file_another_user_left_unwritable_is_refused_before_any_work(tmp_path, template):
    uri = copy_store(template, tmp_path)
    lock = tmp_path / "mlflow.db.lock"  # made by another user's run: theirs, mode 0644
    lock.touch()
    with read_only(lock), pytest.raises(ConfigError) as caught:
        check_store(uri)  # a run then opened it for writing: PermissionError, a traceback
    message = str(caught.value)
    assert "\n" not in message and f"{lock} cannot be written" in message, message
    assert "every process that writes this store takes it" in message and "tracking.uri" in message, message


LOCKED_MID_RUN = """
import sys, time
from pipeline.record.tracker import MlflowTracker
tracker = MlflowTracker({"uri": sys.argv[1], "experiment": "locked", "max_wait_s": 1.0})
tracker.start("run", {}, {})
print("started", flush=True)
sys.stdin.readline()  # another program holds the database now
start = time.monotonic()
tracker.log_metrics({"a": 1.0})
print(f"waited {time.monotonic() - start:.1f}", flush=True)
"""


@pytest.mark.parametrize("holder_takes", ["BEGIN EXCLUSIVE", "BEGIN; SELECT count(*) FROM runs"],
                         ids=["a-writer", "a-long-reader"])
def test_a_store_another_program_locks_mid_run_is_given_up_in_one_line_after_its_wait(tmp_path, template,
                                                                                      holder_takes):
    uri = copy_store(template, tmp_path)
    proc = subprocess.Popen([sys.executable, "-c", LOCKED_MID_RUN, uri], cwd=ROOT, env=clean_env(), text=True,
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert proc.stdout.readline().strip() == "started"
    holder = sqlite3.connect(tmp_path / "mlflow.db", isolation_level=None)
    for statement in holder_takes.split("; "):  # SQLite's own lock, as another program takes it (not tweakpipe's)
        holder.execute(statement).fetchall()
    try:
        out, err = proc.communicate("\n", timeout=180)
    finally:
        holder.execute("ROLLBACK")
        holder.close()
    assert proc.returncode == 0, err
    assert "Traceback" not in err and "SQLAlchemy database error" not in err, err[-3000:]
    assert err.count("stayed locked") == 1, err[-3000:]
    waited = float(out.split("waited ")[1])
    assert waited < 10, waited  # its 1 s wait and the backoff, not MLflow's own 20 s busy timeout per attempt


# --- a full temporary directory -------------------------------------------------------------------------------------


@contextlib.contextmanager
def full_tmpdir(where: Path) -> Iterator[Path]:
    """``$TMPDIR`` (and Python's temporary directory) on a 1 MiB tmpfs with a few KiB left, for the block."""
    with tmpfs(where, "size=1m") as disk, pytest.MonkeyPatch.context() as patch:
        (disk / "filler").write_bytes(b"\0" * 1_016_000)
        patch.setenv("TMPDIR", str(disk))
        patch.setattr(tempfile, "tempdir", str(disk))
        yield disk


def test_a_full_tmpdir_is_refused_before_any_work_naming_it(tmp_path):
    with full_tmpdir(tmp_path / "tmpdir") as disk, pytest.raises(ConfigError) as caught:
        check_config(compose_config([*TINY, "backends=[eager]"]))
    message = str(caught.value)
    assert "\n" not in message and f"the temporary directory (TMPDIR) {disk} has" in message, message
    assert "free space there or point TMPDIR at another disk" in message, message


def test_a_tmpdir_filling_up_during_the_run_fails_the_candidate_naming_it_not_the_compile_cache(tmp_path, own_home):
    cfg = compose_config([*TINY, "backends=[eager,inductor]", "reference=false", "stages=[capture]",
                          "compile_cache.workers=0", f"compile_cache.dir={tmp_path / 'cache'}"])
    prepared = prepare(cfg)  # checked with room to spare; the temporary directory fills up after the checks
    with full_tmpdir(tmp_path / "tmpdir") as disk:
        ctx = build_context(cfg, tmp_path / "run", prepared)
        capture.run(ctx)
    outcome = ctx.outcomes["inductor"]  # the C++ compiler's files go to TMPDIR, its output to the compile cache
    assert outcome.status == "failed" and "\n" not in outcome.reason, outcome.reason
    named = f"the disk holding the temporary directory (TMPDIR) {disk} is full"
    assert outcome.reason.startswith(named), outcome.reason
    assert "point TMPDIR at another disk" in outcome.reason and ctx.outcomes["eager"].status == "ok"
