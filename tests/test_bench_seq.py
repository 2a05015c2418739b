"""bench/seq.py on a CPU (issue 31), so that its GPU call cannot fail for a silly reason: its GPU configs compose and
pass every check, its smoke run writes the summary the H200 table reports, and split calls join."""

from __future__ import annotations

import argparse
import json
import sys

import pytest
import torch

from bench import seq
from pipeline import inputs as model_inputs
from pipeline.api import compose_config
from pipeline.preflight.checks import candidates_of, check_config

# A QA head with token types (the most inputs of seq.MODELS): the bench's path end to end, its peers compiled on the
# CPU (about 30 s a model); every model's GPU config is composed and checked above.
SMOKE_MODELS = ["BertForQuestionAnswering"]


def gpu_args(tmp_path, **kw) -> argparse.Namespace:
    """The arguments of the default (H200) call, with the device this machine has."""
    return argparse.Namespace(**{"smoke": False, "device": "cuda" if torch.cuda.is_available() else "cpu",
                                 "backends": seq.BACKENDS, "profile": "quick", "tag": "h200", "runs": tmp_path,
                                 "per_length": False, **kw})


@pytest.mark.parametrize("model", seq.MODELS)
def test_the_gpu_calls_configs_compose_and_pass_the_checks(model, tmp_path):
    cfg = compose_config(seq.overrides(model, gpu_args(tmp_path)))
    model_inputs.complete(cfg)
    model_inputs.at_longest(cfg)
    check_config(cfg)
    assert list(cfg.model.seq_lens) == seq.LENGTHS and list(cfg.model.batch_sizes) == seq.SIZES
    lengths = {n: s.seq_dim for n, s in cfg.model.inputs.items()}
    assert lengths["input_ids"] == lengths["attention_mask"] == 1, lengths
    assert all(s.shape == [max(seq.LENGTHS)] for n, s in cfg.model.inputs.items() if s.seq_dim is not None)
    candidates = candidates_of(cfg)
    assert list(candidates) == seq.BACKENDS  # inductor with the length dynamic only (no per-length twin)
    assert all(c.precision == "bf16" and c.casts_weights for c in candidates.values())
    assert list(cfg.backends.graph_inductor.grid) == seq.SIZES
    twins = candidates_of(compose_config(seq.overrides(model, gpu_args(tmp_path, per_length=True))))
    assert "inductor.per_length" in twins


def bench(monkeypatch, *argv):
    monkeypatch.setattr(sys, "argv", ["bench/seq.py", *argv])
    seq.main()


@pytest.fixture(scope="module")
def smoke(tmp_path_factory):
    out = tmp_path_factory.mktemp("seq")
    with pytest.MonkeyPatch.context() as monkeypatch:
        bench(monkeypatch, "--out", str(out), "--tag", "cpu", "--device", "cpu", "--smoke", "--runs", str(out / "runs"),
              "--models", *SMOKE_MODELS)
    return out, json.loads((out / "seq-cpu.json").read_text())


@pytest.mark.slow
def test_the_smoke_run_writes_the_summary_of_the_h200_table(smoke):
    out, result = smoke
    s = result["summary"]
    assert set(s) >= {"models", "cells", "geomean_speedup_over_best_peer", "worst_auto_over_eager"}
    assert s["models"] == len(SMOKE_MODELS) and s["cells"] == len(SMOKE_MODELS) * 4 and s["validation_ok"]
    assert s["peer_fallbacks"] == {} and s["failed_models"] == []  # every peer call ran its compiled program
    cells = [c for r in result["rows"] for c in r["cells"]]
    assert {(c["batch_size"], c["seq_len"]) for c in cells} == {
        (b, n) for b in seq.SMOKE_SIZES for n in seq.SMOKE_LENGTHS}
    for c in cells:
        assert set(c["timed"]) == {"auto", "exact", "padded", "eager"}
        assert all(t["samples"] for t in c["timed"].values())
        best = min(c["timed"][p]["median_ms"] for p in seq.PEERS)
        assert c["speedup_over_best_peer"] == pytest.approx(best / c["timed"]["auto"]["median_ms"])
        assert all(score > 0.99 for score in c["scores"].values()), c["scores"]  # bf16 against fp32 eager
    assert s["worst_auto_over_eager"] == pytest.approx(max(c["auto_over_eager"] for c in cells))
    text = (out / "seq-cpu.md").read_text()
    assert "| length \\ batch | 1 | 2 |" in text and "| BertForQuestionAnswering | 2 | 16 | eager |" in text


@pytest.mark.slow
def test_a_call_cut_by_its_budget_names_what_it_left_and_joins_with_the_call_that_ran_it(smoke, monkeypatch):
    out, ran = smoke
    bench(monkeypatch, "--out", str(out), "--tag", "cpu-cut", "--device", "cpu", "--smoke", "--budget-s", "-1",
          "--runs", str(out / "runs"), "--models", "T5EncoderModel", *SMOKE_MODELS)
    cut = json.loads((out / "seq-cpu-cut.json").read_text())
    assert cut["summary"]["not_run"] == ["T5EncoderModel", *SMOKE_MODELS] and cut["summary"]["cells"] == 0
    bench(monkeypatch, "--combine", str(out / "seq-cpu-cut.json"), str(out / "seq-cpu.json"), "--out", str(out),
          "--tag", "cpu-joined")
    joined = json.loads((out / "seq-cpu-joined.json").read_text())
    assert joined["summary"]["not_run"] == ["T5EncoderModel"] and joined["summary"]["cells"] == ran["summary"]["cells"]
    assert [r["model"] for r in joined["rows"]] == ["BertForQuestionAnswering", "T5EncoderModel"]
