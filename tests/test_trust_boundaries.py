"""Code from other hands never runs (issue 36): the compile caches, Redis and the trust key as trust boundaries.

Every case runs real Inductor compiles of a real model on the CPU. "Another user" is played by ``chown`` to
``nobody`` (root can; elsewhere those cases skip with the reason), and "someone who can write the cache" by
appending a line to the generated modules Inductor imports on a cache hit."""

from __future__ import annotations

import os
import pwd
import socket
import stat
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Dict

import pytest
import torch

import pipeline
from conftest import ROOT, TINY, tweakpipe_home
from mlflow_helpers import clean_env
from pipeline import private, trust
from pipeline.compile import cache as compile_cache
from pipeline.api import compose_config
from pipeline.preflight.checks import check_config
from pipeline.errors import ConfigError
from pipeline.models import MLP
from pipeline.compile import artifacts as compiled
from pipeline.compile import loads
from pipeline.runner import run
from redis_helpers import redis_server

ROUTE = [*TINY, "backends=[eager,inductor]", "route=one_backend", "route.backend=inductor", "compile_cache.workers=0"]


def other_uid() -> int:
    """A uid that is not this process's, to own files as another user would; skips where files cannot be given away."""
    if os.geteuid() != 0:
        pytest.skip("giving a file to another user needs root (chown)")
    return pwd.getpwnam("nobody").pw_uid


@pytest.fixture(autouse=True)
def own_home(tmp_path, monkeypatch):
    """Each test its own tweakpipe directory (its key) and its own default Inductor cache."""
    monkeypatch.setenv("TWEAKPIPE_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor_default"))


def planted(cache: Path, marker: Path) -> int:
    """Append a line that writes ``marker`` to every generated module in ``cache`` (they keep working); how many."""
    modules = [p for p in cache.rglob("*.py")]
    for module in modules:
        with module.open("a") as f:
            f.write(f"\nopen({str(marker)!r}, 'a').write('ran\\n')\n")
    return len(modules)


def tree(root: Path) -> Dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


# --- the local cache ------------------------------------------------------------------------------------------


def test_a_new_cache_directory_is_private(tmp_path):
    with compile_cache.active({"dir": str(tmp_path / "new" / "cache"), "enabled": True}) as where:
        assert stat.S_IMODE(where.stat().st_mode) == 0o700


def test_a_cache_others_may_write_or_another_user_owns_is_refused_before_any_work(tmp_path):
    cache = tmp_path / "cache"
    cache.mkdir(mode=0o700)
    cache.chmod(0o777)
    with pytest.raises(ConfigError, match=r"writable by its group and others .*compile_cache.shared=true") as caught:
        check_config(compose_config([*TINY, f"compile_cache.dir={cache}"]), tmp_path / "run")
    assert "\n" not in str(caught.value) and "can run code in your runs" in str(caught.value)
    check_config(compose_config([*TINY, f"compile_cache.dir={cache}", "compile_cache.shared=true"]))
    cache.chmod(0o700)
    os.chown(cache, other_uid(), -1)
    with pytest.raises(ConfigError, match="belongs to nobody, not to you"):
        check_config(compose_config([*TINY, f"compile_cache.dir={cache}"]))


def test_a_cache_in_a_directory_others_may_write_is_refused_unless_it_is_sticky(tmp_path):
    parent = tmp_path / "open"
    parent.mkdir()
    parent.chmod(0o777)  # anyone may rename our cache away and put theirs in its place
    with pytest.raises(ConfigError, match="which its group and others may write .*not sticky"):
        check_config(compose_config([*TINY, f"compile_cache.dir={parent / 'cache'}"]))
    parent.chmod(0o1777)  # as /tmp: only the owner of an entry may rename it
    check_config(compose_config([*TINY, f"compile_cache.dir={parent / 'cache'}"]))


def test_inductors_own_directory_is_checked_when_the_cache_is_off(tmp_path, monkeypatch):
    # With compile_cache.enabled=false Inductor still writes every generated module to its directory before
    # importing it (a module already there is imported as it is).
    ambient = tmp_path / "ambient"
    ambient.mkdir()
    ambient.chmod(0o777)
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(ambient))
    with pytest.raises(ConfigError, match="Inductor's cache directory"):
        check_config(compose_config([*TINY, "compile_cache.enabled=false"]))


@pytest.fixture(scope="module")
def poisoned(tmp_path_factory):
    """A cache an Inductor route was tuned into, its generated modules then planted with a line, made world-writable."""
    folder = tmp_path_factory.mktemp("poisoned")
    with tweakpipe_home(folder / "victim_home"):
        run(compose_config([*ROUTE, f"compile_cache.dir={folder / 'cache'}", "stages=[capture]"]), folder / "first")
    marker = folder / "PLANTED_CODE_RAN"
    assert planted(folder / "cache", marker) >= 1
    (folder / "cache").chmod(0o777)
    return folder, marker


def test_a_planted_line_in_a_cache_that_is_not_private_never_runs_in_a_default_run(poisoned, tmp_path):
    folder, marker = poisoned
    with pytest.raises(ConfigError, match="compile_cache.shared=true"):
        run(compose_config([*ROUTE, f"compile_cache.dir={folder / 'cache'}"]), tmp_path / "run")
    assert not marker.exists() and not (tmp_path / "run").exists()


def test_a_shared_cache_is_the_users_choice_and_its_artifacts_are_never_signed(poisoned, tmp_path, caplog):
    folder, marker = poisoned
    with caplog.at_level("WARNING", logger="pipeline.compile.artifacts"):
        ctx = run(compose_config([*ROUTE, f"compile_cache.dir={folder / 'cache'}", "compile_cache.shared=true"]),
                  tmp_path / "run")
    assert marker.exists()  # the plant was real: with shared=true, the user trusted whoever wrote there
    artifacts = compiled.path_for(ctx.checkpoint_path)
    assert artifacts.read_bytes().splitlines()[1] == b"hmac-sha256:" + compiled.UNSIGNED.encode()
    warned = [r.getMessage() for r in caplog.records if "written unsigned" in r.getMessage()]
    assert len(warned) == 1 and "shared compile_cache.dir" in warned[0] and "tweakpipe trust" in warned[0]
    marker.unlink()
    served = pipeline.load(ctx.checkpoint_path, MLP(width=16, depth=2).eval())  # default trust: not used
    assert served.load_report.artifacts.startswith("ignored: model.tweak.compiled is unsigned")
    assert not marker.exists()  # and the load compiled in a cache of its own, not the poisoned one


# --- loads ----------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def unsigned_route(tmp_path_factory):
    """An Inductor route whose artifacts are unsigned (as one received from someone else would be)."""
    folder = tmp_path_factory.mktemp("unsigned")
    with tweakpipe_home(folder / "author_home"):
        # Inductor's cache entries only (route.aot=false): the artifacts a load installs into a cache
        ctx = run(compose_config([*ROUTE, f"compile_cache.dir={folder / 'cache'}", "route.aot=false"]), folder / "run")
    return ctx.checkpoint_path


def test_a_trusted_load_leaves_the_shared_cache_byte_for_byte_as_it_was(unsigned_route, tmp_path, monkeypatch):
    shared = tmp_path / "inductor_default"
    with compile_cache.active({"dir": str(shared), "enabled": True}):
        torch.compile(lambda x: torch.tanh(x) + 1)(torch.randn(3, 5))  # the cache holds something of its own
    before = tree(shared)
    assert before
    served = pipeline.load(unsigned_route, MLP(width=16, depth=2).eval(), trust_compiled=True)
    assert served.load_report.artifacts == "used" and served.load_report.backends["inductor"].cache_misses == 0
    assert tree(shared) == before
    digest = pipeline.route.checkpoint.read(unsigned_route)["compiled"]["sha256"]
    folders = list(loads.root().glob(f"{digest[:16]}-*"))
    assert len(folders) == 1 and tree(folders[0])  # the entries went to the load's own cache
    # A later load that does not trust them finds none of them: it compiles.
    again = pipeline.load(unsigned_route, MLP(width=16, depth=2).eval(), trust_compiled=False)
    assert again.load_report.backends["inductor"].cache_misses >= 1


def test_a_module_loaded_from_artifacts_the_user_did_not_sign_saves_them_unsigned(unsigned_route, tmp_path):
    served = pipeline.load(unsigned_route, MLP(width=16, depth=2).eval(), trust_compiled=True)
    target = pipeline.save(served, tmp_path / "again.tweak", aot=False)
    assert compiled.path_for(target).read_bytes().splitlines()[1] == b"hmac-sha256:" + compiled.UNSIGNED.encode()
    # With its program built ahead of time here (this process's own compile), the file still carries the entries
    # the load took from the unsigned artifacts: still unsigned.
    target = pipeline.save(served, tmp_path / "ahead.tweak")
    assert served.aot["inductor"]["used"]
    assert compiled.path_for(target).read_bytes().splitlines()[1] == b"hmac-sha256:" + compiled.UNSIGNED.encode()


# --- the key --------------------------------------------------------------------------------------------------


def key_refused(tmp_path: Path, match: str) -> None:
    """A run that will sign is refused in one line before any work; a load ignores artifacts, saying why."""
    with pytest.raises(ConfigError, match=match) as caught:
        check_config(compose_config(ROUTE), tmp_path / "run")
    assert "\n" not in str(caught.value)
    assert trust.signed_by_user(b"data", "0" * 64) == (False, trust.problem(create=False))
    proc = subprocess.run([sys.executable, "-m", "pipeline.cli", "trust", str(tmp_path / "x.tweak")], cwd=ROOT,
                          env={**clean_env(), "TWEAKPIPE_HOME": os.environ["TWEAKPIPE_HOME"]}, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 2


def test_a_key_others_can_read_is_refused_with_the_chmod_that_fixes_it(tmp_path):
    trust.user_key()
    trust.key_path().chmod(0o644)
    key_refused(tmp_path, r"readable or writable by others \(mode 0644\).*chmod 600")
    trust.key_path().chmod(0o600)
    check_config(compose_config(ROUTE), tmp_path / "run")


def test_an_empty_key_a_key_that_is_a_directory_or_a_link_is_refused(tmp_path):
    home = trust.home()
    home.mkdir(mode=0o700)
    fd = os.open(home / "trust.key", os.O_CREAT | os.O_WRONLY, 0o600)
    os.close(fd)
    key_refused(tmp_path, "holds 0 bytes, fewer than 32")
    (home / "trust.key").unlink()
    (home / "trust.key").mkdir()
    key_refused(tmp_path, "is a directory")
    (home / "trust.key").rmdir()
    elsewhere = tmp_path / "elsewhere.key"
    elsewhere.write_bytes(os.urandom(32))
    elsewhere.chmod(0o600)
    (home / "trust.key").symlink_to(elsewhere)
    key_refused(tmp_path, "is a symbolic link")


def test_a_key_another_user_made_first_is_refused(tmp_path):
    trust.user_key()
    os.chown(trust.key_path(), other_uid(), -1)
    key_refused(tmp_path, "belongs to nobody, not to you, so they can sign in your name")


def test_a_tweakpipe_home_that_others_may_write_is_a_file_or_is_read_only_is_refused_before_capture(tmp_path,
                                                                                                  monkeypatch):
    shared = tmp_path / "shared_home"
    shared.mkdir()
    shared.chmod(0o777)
    monkeypatch.setenv("TWEAKPIPE_HOME", str(shared))
    key_refused(tmp_path, "writable by its group and others")
    afile = tmp_path / "afile"
    afile.write_text("")
    monkeypatch.setenv("TWEAKPIPE_HOME", str(afile))
    key_refused(tmp_path, "is a file; set TWEAKPIPE_HOME")
    check_config(compose_config([*ROUTE, "stages=[capture,profile]"]))  # a run that will not sign needs no key


def test_a_load_with_a_key_others_can_read_falls_back_to_rebuilding(unsigned_route, tmp_path, caplog):
    os.environ["TWEAKPIPE_HOME"] = str(unsigned_route.parent.parent / "author_home")  # the author's key signed it
    pipeline.route.checkpoint.sign(unsigned_route)
    assert pipeline.load(unsigned_route, MLP(width=16, depth=2).eval()).load_report.artifacts == "used"
    trust.key_path().chmod(0o640)
    try:
        with caplog.at_level("INFO", logger="pipeline.route.checkpoint"):
            served = pipeline.load(unsigned_route, MLP(width=16, depth=2).eval())
    finally:
        trust.key_path().chmod(0o600)
    assert served.load_report.artifacts.startswith("ignored") and "chmod 600" in served.load_report.artifacts


# --- Redis ----------------------------------------------------------------------------------------------------


def test_a_password_protected_redis_works_with_its_password_and_names_authentication_without_it(tmp_path,
                                                                                                 monkeypatch):
    with redis_server(password="s3cret") as server:
        good = f"redis://:s3cret@127.0.0.1:{server.port}"
        check_config(compose_config([*TINY, f"compile_cache.remote={good}"]))
        for url in (f"redis://:wrong@127.0.0.1:{server.port}", f"redis://127.0.0.1:{server.port}"):
            with pytest.raises(ConfigError, match="refused the credentials") as caught:
                check_config(compose_config([*TINY, f"compile_cache.remote={url}"]))
            assert "wrong" not in str(caught.value) and "TWEAKPIPE_REDIS_PASSWORD" in str(caught.value)
        monkeypatch.setenv(compile_cache.PASSWORD_ENV, "s3cret")
        check_config(compose_config([*TINY, f"compile_cache.remote=redis://127.0.0.1:{server.port}"]))
        monkeypatch.delenv(compile_cache.PASSWORD_ENV)
        capture = [*ROUTE, "stages=[capture]", f"compile_cache.remote={good}"]
        first = run(compose_config([*capture, f"compile_cache.dir={tmp_path / 'a'}"]), tmp_path / "first")
        second = run(compose_config([*capture, f"compile_cache.dir={tmp_path / 'b'}"]), tmp_path / "second")
        assert first.outcomes["inductor"].cost.cache_misses >= 1
        assert second.outcomes["inductor"].cost.cache_hits >= 1  # another machine's programs, through Redis
        saved = (tmp_path / "first" / "config.yaml").read_text()
        assert "s3cret" not in saved and f"redis://:***@127.0.0.1:{server.port}" in saved


def test_a_remote_cache_writes_its_artifacts_unsigned(tmp_path, caplog):
    with redis_server() as server, caplog.at_level("WARNING", logger="pipeline.compile.artifacts"):
        ctx = run(compose_config([*ROUTE, f"compile_cache.dir={tmp_path / 'cache'}",
                                  f"compile_cache.remote=redis://127.0.0.1:{server.port}"]), tmp_path / "run")
    assert compiled.path_for(ctx.checkpoint_path).read_bytes().splitlines()[1].endswith(b":" + b"none")
    assert any("the remote cache redis://127.0.0.1" in r.getMessage() for r in caplog.records)


@pytest.fixture
def silent_server():
    """A TCP port that accepts connections and never answers: a stalled server."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(16)
    held = []
    stop = threading.Event()

    def accept() -> None:
        listener.settimeout(0.2)
        while not stop.is_set():
            try:
                held.append(listener.accept()[0])
            except OSError:
                continue

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    yield listener.getsockname()[1]
    stop.set()
    thread.join()
    for conn in held:
        conn.close()
    listener.close()


def test_a_stalled_redis_is_named_before_any_work(silent_server):
    start = time.monotonic()
    with pytest.raises(ConfigError, match="Redis at 127.0.0.1:.* stalled: no answer within 2 s"):
        check_config(compose_config([*TINY, f"compile_cache.remote=redis://127.0.0.1:{silent_server}"]))
    assert time.monotonic() - start < 10


def test_a_redis_that_stalls_during_a_compile_costs_one_timeout_and_one_warning_then_compiles_locally(tmp_path,
                                                                                                     caplog):
    pytest.importorskip("redis")
    with redis_server() as server:
        cache = {"dir": str(tmp_path / "cache"), "enabled": True, "remote": f"redis://127.0.0.1:{server.port}"}
        with compile_cache.active(cache), caplog.at_level("WARNING", logger="pipeline.compile.cache"):
            os.kill(server.pid, 19)  # SIGSTOP: the server hangs mid-run
            start = time.monotonic()
            out = torch.compile(lambda x: torch.sigmoid(x) * 3)(torch.randn(4, 4))
            elapsed = time.monotonic() - start
    assert out.shape == (4, 4)
    warned = [r.getMessage() for r in caplog.records if "Redis" in r.getMessage()]
    assert len(warned) == 1 and "stalled: no answer within 5 s" in warned[0] and "compiles locally" in warned[0]
    assert elapsed < 60, elapsed  # one timeout, not one per lookup: the remote is given up for the process
    compile_cache._REMOTE_FAILED.clear()


def test_private_judges_the_path_and_every_directory_above_it(tmp_path):
    assert private.problem(tmp_path / "missing" / "deeper", "x") is None
    (tmp_path / "g").mkdir()
    (tmp_path / "g").chmod(0o770)
    assert "writable by its group" in private.problem(tmp_path / "g", "x")
    assert "lies in" in private.problem(tmp_path / "g" / "sub", "x")


def test_load_caches_are_pruned_to_the_most_recently_used(tmp_path):
    root = tmp_path / "loads"
    for i in range(loads.KEEP + 4):
        (root / f"cache{i:02d}").mkdir(parents=True)
        os.utime(root / f"cache{i:02d}", (1000 + i, 1000 + i))
    loads.prune(root)
    kept = sorted(p.name for p in root.iterdir())
    assert kept == [f"cache{i:02d}" for i in range(4, loads.KEEP + 4)]
