"""Compiled artifacts beside a checkpoint (issue 28): a load that compiles nothing, under a trust the user holds.

Every case loads a real Inductor route of a real model on the CPU. Artifacts are used only when signed with the
user's own key (``TWEAKPIPE_HOME`` points each test at its own) or when the caller trusts them, and every check
runs before a byte of them is unpickled."""

from __future__ import annotations

import importlib
import json
import os
import pickle
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import pipeline
from conftest import ROOT, SUITE_CACHE, TINY, tweakpipe_home
from mlflow_helpers import clean_env
from pipeline.compile import cache as compile_cache
from pipeline.api import compose_config
from pipeline.models import MLP
from pipeline.compile import artifacts as compiled
from pipeline.compile import loads
from pipeline.route import checkpoint
from pipeline.runner import run

# The mega-cache path: route.aot=false (tests/test_ahead_of_time.py holds the programs built ahead of time).
ROUTE = [*TINY, "backends=[eager,inductor]", "route=one_backend", "route.backend=inductor", "route.aot=false"]


@pytest.fixture(scope="module")
def tuned(tmp_path_factory):
    """A tuned Inductor route and its checkpoint, signed with the key of its own TWEAKPIPE_HOME."""
    folder = tmp_path_factory.mktemp("artifacts")
    home = folder / "home"
    with tweakpipe_home(home):
        ctx = run(compose_config([*ROUTE, f"compile_cache.dir={SUITE_CACHE}"]), folder / "run")
    return ctx, ctx.checkpoint_path, home


@pytest.fixture
def copy(tuned, tmp_path, monkeypatch):
    """The checkpoint and its artifacts copied, loaded as the tuning user (its key), into an empty Inductor cache."""
    _, path, home = tuned
    monkeypatch.setenv("TWEAKPIPE_HOME", str(home))
    for source in (path, compiled.path_for(path)):
        shutil.copy(source, tmp_path / source.name)
    with compile_cache.active({"dir": str(tmp_path / "empty_cache"), "enabled": True}):
        yield tmp_path / path.name


def loaded(path: Path, **kwargs):
    model = MLP(width=16, depth=2).eval()
    return pipeline.load(path, model, **kwargs)


def served_equal(served, ctx) -> None:
    for bs in (1, 3, 8, 9):
        x = torch.randn(bs, 16)
        assert torch.equal(served(x), ctx.routed(x)), bs  # the same program, the same weights: the same bits


def test_the_checkpoint_records_its_signed_artifacts_and_validate_reloads_them(tuned):
    ctx, path, home = tuned
    record = checkpoint.read(path)["compiled"]
    assert record["backends"] == ["inductor"] and record["built_for"]["torch"] == torch.__version__
    assert compiled.path_for(path).stat().st_size == record["bytes"] + len(compiled.MAGIC) + len("hmac-sha256:\n") + 64
    key = home / "trust.key"
    assert stat.S_IMODE(key.stat().st_mode) == 0o600  # the user's secret, readable by the user alone
    reload = ctx.validation["reload"]
    assert reload["artifacts"] == "used" and reload["backends"]["inductor"]["cache_misses"] == 0


def test_trusted_artifacts_load_into_an_empty_cache_without_compiling(tuned, copy):
    served = loaded(copy)
    report = served.load_report
    assert report.artifacts == "used"
    assert report.backends["inductor"].cache_misses == 0 and report.backends["inductor"].cache_hits >= 1
    assert served.load_seconds >= report.read_s
    served_equal(served, tuned[0])


def test_a_fresh_process_on_a_clean_machine_loads_them_without_compiling(tmp_path):
    # Tuned in a fresh process too, so that no state an earlier test left in this one enters the programs' keys.
    home, run_dir = tmp_path / "home", tmp_path / "run"
    overrides = [*ROUTE, f"compile_cache.dir={SUITE_CACHE}"]
    tune = ("from pathlib import Path; from pipeline.api import compose_config; from pipeline.runner import run; "
            f"run(compose_config({overrides!r}), Path({str(run_dir)!r}))")
    proc = subprocess.run([sys.executable, "-c", tune], cwd=ROOT, env={**clean_env(), "TWEAKPIPE_HOME": str(home)},
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    path = run_dir / "model.tweak"
    script = ("import json, pipeline, torch; from pipeline.models import MLP; "
              f"s = pipeline.load({str(path)!r}, MLP(width=16, depth=2).eval()); "
              "print(json.dumps(s.load_report.to_dict()))")
    clean = tmp_path / "clean"
    env = {**clean_env(), "TWEAKPIPE_HOME": str(home), "TORCHINDUCTOR_CACHE_DIR": str(clean)}
    proc = subprocess.run([sys.executable, "-c", script], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    assert report["artifacts"] == "used" and report["backends"]["inductor"]["cache_misses"] == 0
    # Not even a C++ kernel was built: every kernel library in the load's own cache is one the artifacts carried
    # (the rest are Inductor's probes of this CPU's instruction sets, each marked .load_ok: once per machine).
    record = checkpoint.read(path)["compiled"]
    carried = compiled._contents(compiled._read(compiled.path_for(path), record["bytes"])[1], record["backends"]).files
    # the load's own folder: the newest of this file's (the tune's reload check made one too)
    scope = max((home / loads.LOADS).glob(f"{record['sha256'][:16]}-*"), key=lambda p: p.stat().st_mtime)
    kernels = {p.relative_to(scope).as_posix(): p.read_bytes() for p in scope.rglob("*.so")
               if not p.with_name(p.name + ".load_ok").exists()}
    assert carried and kernels == carried
    # and none of it entered the cache other loads and tunes read
    assert not [p for p in clean.rglob("*") if p.suffix in (".so", ".py", ".pkl") or "fxgraph" in p.parts]


def ignored_then_refused(path: Path, why: str, caplog) -> None:
    """Artifacts ``path`` should not use: ignored with one INFO line and rebuilt; refused where demanded."""
    with caplog.at_level("INFO", logger="pipeline.route.checkpoint"):
        served = loaded(path)
    assert served.load_report.artifacts.startswith("ignored") and why in served.load_report.artifacts
    assert served.load_report.backends["inductor"].cache_misses >= 1  # compiled again
    assert any(why in r.getMessage() and r.levelname == "INFO" for r in caplog.records)
    with pytest.raises(compiled.ArtifactsRefused, match=why):
        loaded(path, trust_compiled=True)


def test_a_flipped_byte_falls_back_or_is_refused(tuned, copy, caplog):
    target = compiled.path_for(copy)
    data = bytearray(target.read_bytes())
    data[-10] ^= 0xFF
    target.write_bytes(bytes(data))
    ignored_then_refused(copy, "changed after the checkpoint was written", caplog)
    served_equal(loaded(copy), tuned[0])  # rebuilt, it still serves the right outputs


def test_a_foreign_signature_or_none_falls_back(tuned, copy, tmp_path, monkeypatch, caplog):
    monkeypatch.setenv("TWEAKPIPE_HOME", str(tmp_path / "another_user"))
    with caplog.at_level("INFO", logger="pipeline.route.checkpoint"):
        served = loaded(copy)
    assert "not signed with your key" in served.load_report.artifacts
    assert "tweakpipe trust" in served.load_report.artifacts  # the way to trust it, once its origin is checked
    (said,) = [r.getMessage() for r in caplog.records if r.levelname == "INFO"]  # one line per load, saying why
    assert said.startswith(f"loaded {copy} in ") and f", route {served.extra_repr()}; compiled artifacts not used" \
        in said and f"`tweakpipe trust {copy}`" in said, said
    served = loaded(copy, trust_compiled=True)  # the caller vouches for it: used
    assert served.load_report.artifacts == "used" and served.load_report.backends["inductor"].cache_misses == 0


def test_a_wrong_torch_version_recorded_falls_back(tuned, copy, caplog):
    payload = checkpoint.read(copy)
    payload["compiled"]["built_for"]["torch"] = "2.0.0"
    checkpoint.write(payload, copy)  # whoever edits the file can rewrite its checksum too
    ignored_then_refused(copy, "built for another setup: torch '2.0.0'", caplog)


def test_trust_signs_a_file_after_checking_it_is_the_one_the_checkpoint_records(tuned, copy, tmp_path):
    other = tmp_path / "another_user"
    env = {**clean_env(), "TWEAKPIPE_HOME": str(other)}
    proc = subprocess.run([sys.executable, "-m", "pipeline.cli", "trust", str(copy)], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and "trusted" in proc.stdout, proc.stderr
    os.environ["TWEAKPIPE_HOME"] = str(other)  # restored by the copy fixture's monkeypatch
    assert loaded(copy).load_report.artifacts == "used"
    target = compiled.path_for(copy)
    target.write_bytes(target.read_bytes() + b"x")
    proc = subprocess.run([sys.executable, "-m", "pipeline.cli", "trust", str(copy)], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and "nothing was signed" in proc.stderr


class WritesAFile:
    """Unpickling this creates ``path``: what an artifact that runs code on load could do."""

    def __init__(self, path: str) -> None:
        self.path = path

    def __reduce__(self):
        return (open, (self.path, "w"))


def test_no_code_from_an_artifact_runs_before_every_check_passed(tuned, copy, tmp_path, monkeypatch):
    marker = tmp_path / "pwned"
    blob = pickle.dumps(WritesAFile(str(marker)))
    body = json.dumps({"backends": {"inductor": len(blob)}, "files": {}}).encode() + b"\n" + blob
    payload = checkpoint.read(copy)
    payload["compiled"].update(sha256=__import__("hashlib").sha256(body).hexdigest(), bytes=len(body))
    checkpoint.write(payload, copy)  # the attacker rewrites the checkpoint's record and checksum too
    target = compiled.path_for(copy)
    for signature in (compiled.UNSIGNED, "0" * 64):  # unsigned, or signed with a key that is not the user's
        target.write_bytes(compiled.MAGIC + f"hmac-sha256:{signature}\n".encode() + body)
        served = loaded(copy)
        assert served.load_report.artifacts.startswith("ignored") and not marker.exists()
    monkeypatch.setenv("TWEAKPIPE_HOME", str(tmp_path / "attacker"))  # signed with another user's key
    checkpoint.sign(copy)
    monkeypatch.setenv("TWEAKPIPE_HOME", str(tuned[2]))
    assert loaded(copy).load_report.artifacts.startswith("ignored") and not marker.exists()


def test_an_artifact_naming_a_path_outside_the_cache_is_refused_before_anything_is_written(tuned, copy, tmp_path):
    record = checkpoint.read(copy)["compiled"]
    body = compiled._read(compiled.path_for(copy), record["bytes"])[1]
    head, _, rest = body.partition(b"\n")
    header = json.loads(head)
    path = next(iter(header["files"]))
    header["files"] = {f"../../{Path(p).name}": size for p, size in header["files"].items()}
    forged = json.dumps(header).encode() + b"\n" + rest
    payload = checkpoint.read(copy)
    payload["compiled"].update(sha256=__import__("hashlib").sha256(forged).hexdigest(), bytes=len(forged))
    checkpoint.write(payload, copy)
    compiled.path_for(copy).write_bytes(compiled.MAGIC + f"hmac-sha256:{compiled.trust.signature(forged)}\n".encode()
                                        + forged)  # signed by the user, as a careless `tweakpipe trust` would
    served = loaded(copy)
    assert "names files outside the cache directory" in served.load_report.artifacts
    root = tmp_path / "empty_cache"  # the cache the copy fixture loads into; the forged paths climb two above it
    assert not (root.parent.parent / Path(path).name).exists() and not (root.parent / Path(path).name).exists()


def test_recording_a_build_leaves_what_the_process_recorded_before_as_it_was():
    """A load records too (its builds are the tune's): the user's own recording of their compiles, for their
    torch.compiler.save_cache_artifacts(), is put back after, not cleared."""
    from torch.compiler._cache import CacheArtifactManager

    importlib.import_module("torch._inductor.runtime.autotune_cache")  # registers an artifact type to record
    CacheArtifactManager.clear()
    CacheArtifactManager.record_artifact("autotune", "ab/users.best_config", {"XBLOCK": 128})
    with compiled.recorded(True) as rec:
        CacheArtifactManager.record_artifact("autotune", "cd/ours.best_config", {"XBLOCK": 64})
    assert rec.data  # ours, as torch serialises them
    users = {kind: [a.key for a in found] for kind, found in CacheArtifactManager._new_cache_artifacts.items()}
    assert users == {"autotune": ["ab/users.best_config"]}, users
    CacheArtifactManager.clear()
