"""Issue 36's raw cases, each one line: full disks, lengths a model cannot take, examples that claim gigabytes,
booleans that are not booleans, a store locked at the first touch, and a second Ctrl-C during the first's cleanup.

Full disks are real: a small tmpfs (mounting needs root; elsewhere those cases skip with the reason), filled
with bytes or, where a check of free space must pass first, with files (its inodes)."""

from __future__ import annotations

import resource
import sqlite3
import subprocess
import sys
import time

import pytest
import torch
import transformers

import pipeline
from conftest import ROOT, TINY, tmpfs
from mlflow_helpers import clean_env, init_store
from pipeline import disks
from pipeline.compile import cache as compile_cache
from pipeline.api import compose_config
from pipeline.preflight.checks import check_config
from pipeline.errors import ConfigError
from pipeline.record.tracker import MlflowTracker
from pipeline.route import checkpoint
from pipeline.preflight.prepare import prepare
from pipeline.runner import build_context
from stages import capture

EAGER = [*TINY, "backends=[eager]", "reference=false"]


def cli(*args: str, timeout: int = 300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "pipeline", *args], cwd=ROOT, env=clean_env(), capture_output=True,
                          text=True, timeout=timeout)


def one_line_error(proc: subprocess.CompletedProcess, code: int) -> str:
    assert proc.returncode == code, proc.stderr[-3000:]
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    return errors[0]


# --- full disks -----------------------------------------------------------------------------------------------


def test_a_run_directory_without_room_is_refused_before_any_work(tmp_path):
    with tmpfs(tmp_path / "disk", "size=1m") as disk:
        line = one_line_error(cli(*EAGER, f"hydra.run.dir={disk / 'run'}"), 2)
    assert "KiB free, less than the 64.0 MiB a run needs there" in line and str(disk) in line


def test_a_run_directory_that_fills_up_during_the_run_is_one_line_and_leaves_no_temporary_file(tmp_path):
    # Bytes enough for the check, but room for only a few files: the run's own writes fill it.
    with tmpfs(tmp_path / "disk", "size=100m,nr_inodes=12") as disk:
        line = one_line_error(cli(*EAGER, f"hydra.run.dir={disk / 'run'}"), 1)
        left = sorted(p.name for p in (disk / "run").iterdir())
    assert f"the disk holding it {disk / 'run'} is full (no room for another file" in line
    assert f"resume={disk / 'run'} continues the run" in line
    assert not [name for name in left if ".tmp" in name], left


def test_a_compile_cache_that_fills_up_fails_the_candidate_naming_the_disk(tmp_path):
    cfg = compose_config([*TINY, "backends=[eager,inductor]", "stages=[capture]", "compile_cache.workers=0"])
    prepared = prepare(cfg)  # checked with room to spare; the disk fills up after the checks
    with tmpfs(tmp_path / "disk", "size=1m") as disk:
        (disk / "filler").write_bytes(b"\0" * 980_000)
        cache = {"dir": str(disk / "cache"), "enabled": True}
        with compile_cache.active(cache):
            cfg.compile_cache.dir = cache["dir"]
            ctx = build_context(cfg, tmp_path / "run", prepared)
            capture.run(ctx)
        left = [p for p in (disk / "cache").rglob("*.tmp")]
    outcome = ctx.outcomes["inductor"]
    assert outcome.status == "failed" and outcome.reason.startswith(f"the disk holding compile_cache.dir {disk}")
    assert "is full" in outcome.reason and ctx.outcomes["eager"].status == "ok" and not left


def test_a_compile_cache_without_room_is_refused_before_any_work(tmp_path):
    with tmpfs(tmp_path / "disk", "size=1m") as disk, pytest.raises(ConfigError, match="less than the 64.0 MiB"):
        check_config(compose_config([*TINY, f"compile_cache.dir={disk / 'cache'}"]))


# --- lengths --------------------------------------------------------------------------------------------------


def test_lengths_beyond_the_models_positions_are_refused_before_capture_through_the_api(tmp_path):
    config = transformers.BertConfig(hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64,
                                     vocab_size=100, max_position_embeddings=64)
    model = transformers.BertModel(config).eval()
    rows = {"input_ids": torch.randint(0, 100, (4, 32)), "attention_mask": torch.ones(4, 32, dtype=torch.long)}
    with pytest.raises(ConfigError, match="eager fails at length 128 .*max_position_embeddings=64: tune lengths up "
                                          "to 64") as caught:
        pipeline.tune(model, rows, overrides=["device=cpu", "backends=[eager]", "reference=false", "profile=quick", "tracking=off",
                                              "model.batch_sizes=[1,2]"], run_dir=tmp_path / "run",
                      seq_dims={"input_ids": 1, "attention_mask": 1}, seq_lens=[16, 128])
    assert "\n" not in str(caught.value) and not (tmp_path / "run" / "capture.json").exists()


def test_a_length_dimension_on_a_feature_axis_is_refused_before_capture_on_the_command_line(tmp_path):
    line = one_line_error(cli(*EAGER, "model.inputs.x.seq_dim=1", "model.seq_lens=[4,8]",
                              f"hydra.run.dir={tmp_path / 'run'}"), 2)
    assert "eager fails at length 4" in line and "such as features (model.inputs.<name>.seq_dim" in line


# --- examples that claim more than they hold ------------------------------------------------------------------


def test_examples_of_a_few_stored_bytes_that_claim_12_gb_run_without_allocating_them(tmp_path):
    claimed = torch.zeros(1).expand(200_000_000, 16)  # 12.8 GB as rows, 4 bytes stored
    torch.save({"x": claimed}, tmp_path / "huge.pt")
    assert (tmp_path / "huge.pt").stat().st_size < 4096
    before = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    proc = cli(*EAGER, f"model.examples={tmp_path / 'huge.pt'}", f"hydra.run.dir={tmp_path / 'run'}")
    assert proc.returncode == 0, proc.stderr[-3000:]
    peak_gib = max(before, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss) / 2**20  # ru_maxrss: KiB
    assert peak_gib < 4, peak_gib  # the run held a batch of rows at a time, never the claimed 12.8 GB


# --- booleans -------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("override", ["backends.eager.cast_weights=yes", "compile_cache.shared=on",
                                      "validate.allow_unverified=1", "backends.eager.autocast_enabled='true'"])
def test_a_boolean_key_given_anything_but_true_or_false_is_one_line(override):
    with pytest.raises(ConfigError, match="is not a boolean; write true or false") as caught:
        check_config(compose_config([*EAGER, override]))
    assert override.split("=")[0].lstrip("+").split(".")[-1] in str(caught.value)


def test_a_checkpoint_whose_backend_holds_a_string_for_a_boolean_is_refused(tmp_path):
    tuned = pipeline.tune(torch.nn.Linear(4, 2), torch.randn(2, 4), run_dir=tmp_path / "run",
                          overrides=["backends=[eager]", "reference=false", "profile=quick", "tracking=off", "model.batch_sizes=[1,2]",
                                     "stages=[capture,profile,route]"])
    path = pipeline.save(tuned, tmp_path / "m.tweak")
    payload = checkpoint.read(path)
    payload["backends"]["eager"]["cast_weights"] = "yes"
    checkpoint.write(payload, path)
    with pytest.raises(checkpoint.CheckpointError, match="cast_weights='yes' is not a boolean"):
        pipeline.load(path, torch.nn.Linear(4, 2))


# --- a store locked at the first touch, a second Ctrl-C ------------------------------------------------------------


def test_a_store_another_program_holds_locked_when_the_run_opens_it_is_given_up_on_not_a_crash(tmp_path):
    db = tmp_path / "mlflow.db"
    init_store(db)
    holder = sqlite3.connect(db, isolation_level=None, check_same_thread=False)
    holder.execute("BEGIN EXCLUSIVE")  # as another program writing with SQLite's own lock, not tweakpipe's
    from mlflow.tracking import MlflowClient  # noqa: F401 -- imported before the clock starts

    try:
        started = time.monotonic()
        tracker = MlflowTracker({"uri": f"sqlite:///{db}", "experiment": "locked", "max_wait_s": 1.0})
        tracker.start("run", {"a": 1}, {})
        tracker.log_metrics({"m": 1.0})
        tracker.finish("FINISHED")
        waited = time.monotonic() - started
    finally:
        holder.execute("ROLLBACK")
        holder.close()
    assert tracker.lost is not None and tracker.run_id is None
    # given up on after about its 1 s, not after the read-only checks' own waits (30 s before they were bounded)
    assert waited < 10, waited


SECOND_SIGNAL = """
import os, signal, sys, time
from pipeline import stops
try:
    with stops.stoppable():
        try:
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(5)
        finally:  # the cleanup the first Ctrl-C runs; the second one arrives in the middle of it
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(0.5)
            print("cleanup finished", flush=True)
except KeyboardInterrupt:
    print("stopped once", flush=True)
"""


def test_a_second_ctrl_c_during_the_first_ones_cleanup_is_absorbed_without_a_traceback():
    proc = subprocess.run([sys.executable, "-c", SECOND_SIGNAL], cwd=ROOT, env=clean_env(), capture_output=True,
                          text=True, timeout=60)
    assert proc.stdout.split() == ["cleanup", "finished", "stopped", "once"], (proc.stdout, proc.stderr)
    assert "Traceback" not in proc.stderr and "Exception ignored" not in proc.stderr, proc.stderr


def test_disks_recognises_a_full_disk_in_a_chain_of_errors():
    try:
        try:
            raise OSError(28, "No space left on device")
        except OSError as inner:
            raise RuntimeError("C++ compile failed") from inner
    except RuntimeError as outer:
        assert disks.is_full(outer)
    assert not disks.is_full(RuntimeError("mat1 and mat2 shapes cannot be multiplied"))
