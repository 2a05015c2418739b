"""The table benches' budget (``bench/common.within_budget``): a model starts only where it would end within
``--budget-s``, judged by the seconds it took in an earlier table when one is given (a model the lane's slowest
so far said would fit, then cut off by the call's own limit, cost a whole call's device time)."""

from __future__ import annotations

import argparse
import json
import time

import pytest

from bench.common import budget_arguments, within_budget


def test_a_model_starts_only_where_the_seconds_it_took_before_fit_and_each_row_records_its_own(tmp_path):
    earlier = tmp_path / "suite-earlier.json"
    earlier.write_text(json.dumps({"rows": [{"model": "slow", "bench_seconds": 300.0},
                                            {"model": "quick", "bench_seconds": 1.0},
                                            {"model": "old", "tune_seconds": 500.0}]}))  # before bench_seconds
    ran = []
    one = within_budget(argparse.Namespace(budget_s=100.0, expect_from=[earlier]),
                        lambda model: ran.append(model) or {"model": model})
    rows = [one(model) for model in ("quick", "slow", "old")]
    assert ran == ["quick", "old"]  # an old row's tune seconds say nothing of the bench's own
    assert rows[1] == {"model": "slow", "not_run": "0 s in, and slow took 300 s in --expect-from: past --budget-s 100"}
    assert all(0 <= row["bench_seconds"] < 100 for row in (rows[0], rows[2]))


def test_without_an_earlier_table_the_slowest_model_so_far_decides():
    def bench_model(model: str) -> dict:
        time.sleep(0.3)
        return {"model": model}

    one = within_budget(argparse.Namespace(budget_s=0.5, expect_from=[]), bench_model)
    first, second = one("a"), one("b")
    assert first["bench_seconds"] >= 0.3 and "not_run" not in first
    assert "the slowest model so far took" in second["not_run"] and "bench_seconds" not in second


def test_an_earlier_table_that_is_missing_or_not_a_table_is_a_one_line_usage_error(tmp_path, capsys):
    parser = argparse.ArgumentParser(prog="suite.py")
    budget_arguments(parser)
    not_a_table = tmp_path / "notes.json"
    not_a_table.write_text(json.dumps({"model": "resnet50"}))
    for wrong, says in ((tmp_path / "missing.json", "not a readable JSON table"), (not_a_table, "'rows' list")):
        with pytest.raises(SystemExit) as stop:
            parser.parse_args(["--expect-from", str(wrong)])
        assert stop.value.code == 2
        error = capsys.readouterr().err
        assert f"argument --expect-from: {wrong}" in error and says in error and "Traceback" not in error
    table = tmp_path / "suite.json"
    table.write_text(json.dumps({"rows": []}))
    assert parser.parse_args(["--expect-from", str(table)]).expect_from == [table]
