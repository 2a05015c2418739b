"""bench/tune_scale.py on a CPU (issue 38), so that its GPU call cannot fail for a silly reason: a script with no main
guard tunes cold (its top level runs once, its worker's programs are hits; here with the worker's standalone programs,
``--overrides``), then the full tune, and both routes are timed against each other; a second call with --continue keeps what the first measured."""

from __future__ import annotations

import json

import pytest

from bench import tune_scale


@pytest.mark.slow
def test_the_smoke_run_tunes_from_a_script_once_compares_with_the_full_route_and_continues(tmp_path):
    argv = ["--out", str(tmp_path / "out"), "--tag", "cpu", "--device", "cpu", "--smoke", "--full",
            "--runs", str(tmp_path / "runs"), "--overrides", "compile_cache.standalone=true"]
    tune_scale.main(argv)
    text = (tmp_path / "out" / "tune-scale-cpu.json").read_text()
    assert str(tmp_path) not in text  # no machine paths: the command says RUNS, checkpoints are under it
    result = json.loads(text)
    summary = result["summary"]["tiny_mlp"]
    assert summary["top_level_runs"] == 1 and summary["worker_misses"] == 0
    assert summary["cold_s"] > 0 and summary["auto_vs_full"] > 0
    row = result["rows"]["tiny_mlp"]
    assert row["cold"]["candidates"]["inductor"]["ahead_s"] > 0  # its one worker compiled it first
    # --overrides reach the cold tune alone: its worker's standalone program ran untraced; the full tune traced
    assert row["cold"]["candidates"]["inductor"]["trace_s"] == 0 < row["full"]["candidates"]["inductor"]["trace_s"]
    assert [c["batch_size"] for c in row["versus"]["cells"]] == [1, 8]
    tune_scale.main([*argv, "--continue"])  # nothing left to run: the first call's steps are kept as they were
    again = json.loads((tmp_path / "out" / "tune-scale-cpu.json").read_text())
    assert again["rows"]["tiny_mlp"]["cold"] == row["cold"] and again["commands"] == [result["command"]]

    # calls joined: a model keeps the row of the last call that tuned it cold; one a call never reached stays empty
    later = {**again, "command": "python bench/tune_scale.py --tag later", "commands": [],
             "rows": {"tiny_mlp": {"not_run": ["cold"]}, "other": {"cold": {"tune_call_s": 1.0}}}}
    (tmp_path / "later.json").write_text(json.dumps(later))
    tune_scale.main(["--out", str(tmp_path / "joined"), "--tag", "joined", "--combine",
                     str(tmp_path / "out" / "tune-scale-cpu.json"), str(tmp_path / "later.json")])
    joined = json.loads((tmp_path / "joined" / "tune-scale-joined.json").read_text())
    assert joined["rows"]["tiny_mlp"]["cold"] == row["cold"] and joined["summary"]["other"]["cold_s"] == 1.0
    assert joined["command"].split(" ; ") == [result["command"], again["command"], later["command"]]


def test_a_tunes_output_reaches_its_log_while_it_runs(tmp_path):
    """A device call that runs out of time kills the bench mid-tune: what the tune said so far must already be in its
    log (it was written only at the end, and a killed ResNet-50 tune left nothing)."""
    import sys
    import threading
    import time

    from bench.common import tune_process

    log, said = tmp_path / "tune.log", "capture 1/9 eager; 0 s elapsed"
    script = f"import sys, time; print({said!r}, flush=True); time.sleep(3); print('bad', file=sys.stderr); sys.exit(2)"
    failed = []
    runner = threading.Thread(target=lambda: failed.append(pytest.raises(RuntimeError, tune_process, [
        sys.executable, "-c", script], tmp_path, {}, log, tmp_path, "the tune")))
    runner.start()
    deadline = time.monotonic() + 2.5
    while time.monotonic() < deadline and said not in (log.read_text() if log.exists() else ""):
        time.sleep(0.05)
    assert said in log.read_text() and runner.is_alive()  # there before the tune ended
    runner.join()
    assert "the tune failed (2)" in str(failed[0].value) and "bad" in str(failed[0].value)
