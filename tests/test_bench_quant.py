"""bench/quant.py on a CPU (issue 32), so that its GPU call cannot fail for a silly reason: its GPU configs compose and
pass every check, its smoke run writes the summary the H200 table reports, and split calls join."""

from __future__ import annotations

import argparse
import importlib.util
import json
import sys

import pytest
import torch

from bench import quant
from pipeline import inputs as model_inputs
from pipeline.api import compose_config
from pipeline.backends import quantize
from pipeline.preflight.checks import check_config
from pipeline.route.checkpoint import version_of

needs_torchao = pytest.mark.skipif(importlib.util.find_spec("torchao") is None,
                                   reason="torchao is the optional extra .[quant]")


def gpu_args(tmp_path):
    """The arguments of the default (H200) call, with the device this machine has."""
    return argparse.Namespace(smoke=False, device="cuda" if torch.cuda.is_available() else "cpu",
                              backends=quant.BACKENDS, precisions=quant.PRECISIONS, profile="quick", tag="h200",
                              runs=tmp_path)


@pytest.mark.parametrize("model", quant.MODELS)
def test_the_gpu_calls_configs_compose_and_pass_the_checks(model, tmp_path):
    cfg = compose_config(quant.overrides(model, gpu_args(tmp_path)))
    model_inputs.complete(cfg)
    check_config(cfg)
    assert list(cfg.precision) == quant.PRECISIONS and list(cfg.backends) == quant.BACKENDS
    sizes = list(cfg.model.batch_sizes)
    assert sizes == (quant.HF_SIZES if model == quant.BERT else quant.SEED_SIZES)
    assert all(list(cfg.backends[b].grid) == sizes for b in quant.BACKENDS)
    assert set(quant.MATMUL_BOUND.get(model, ())) <= set(sizes)
    assert not any(b.get("autocast_enabled") for b in cfg.backends.values())  # precision is the routed choice


def test_the_table_is_the_seed_tables_cells_and_bert_qa_against_a_list_without_the_recipes():
    assert set(quant.RESTRICTED) < set(quant.PRECISIONS) and not set(quant.RESTRICTED) & set(quantize.RECIPES)
    assert set(quant.PRECISIONS) - set(quant.RESTRICTED) == {"fp8", "int8_weight_only"}
    assert set(quant.TABLE_ORDER) == set(quant.MODELS) == {*quant.SEED_MODELS, quant.BERT}
    assert len(quant.SEED_MODELS) * len(quant.SEED_SIZES) == 25  # the seed cells


def bench(monkeypatch, *argv):
    monkeypatch.setattr(sys, "argv", ["bench/quant.py", *argv])
    quant.main()


@pytest.fixture(scope="module")
def smoke(tmp_path_factory):
    out = tmp_path_factory.mktemp("quant")
    with pytest.MonkeyPatch.context() as monkeypatch:
        bench(monkeypatch, "--out", str(out), "--tag", "cpu", "--device", "cpu", "--smoke",
              "--runs", str(out / "runs"))
    return out, json.loads((out / "quant-cpu.json").read_text())


@pytest.mark.slow
@needs_torchao
def test_the_smoke_run_writes_the_summary_of_the_h200_table(smoke):
    out, result = smoke
    rows = {r["model"]: r for r in result["rows"]}
    assert set(rows) == set(quant.SMOKE_MODELS) and result["torchao"] == version_of("torchao")
    s = result["summary"]
    assert s["cells"] == len(quant.SMOKE_MODELS) * len(quant.SMOKE_SIZES) == sum(s["cells_by_precision"].values())
    assert s["budget_violations"] == sum(not c["within_budget"] for r in rows.values() for c in r["cells"]) == 0
    bound = [c for c in rows[quant.BERT]["cells"] if c["matmul_bound"]]
    assert [c["batch_size"] for c in bound] == list(quant.SMOKE_MATMUL_BOUND[quant.BERT])
    assert s["matmul_bound_speedup_over_bf16_route"] == pytest.approx(bound[0]["speedup_over_bf16_route"])
    for row in rows.values():
        restricted = [c for c in row["candidates"] if c["precision"] in quant.RESTRICTED]
        assert {r["backend"] for r in row["bf16_route_route"]} <= {c["backend"] for c in restricted}
        recipes = {c["precision"]: c for c in row["quantized_candidates"]}
        assert set(recipes) == {"fp8", "int8_weight_only"}
        assert recipes["fp8"]["status"] == "skipped" and "compute capability" in recipes["fp8"]["reason"]
        assert recipes["int8_weight_only"]["status"] == "ok" and recipes["int8_weight_only"]["profile_medians_ms"]
        for c in row["cells"]:
            assert c["auto"]["samples"] and c["bf16_route"]["samples"]  # timed in the same rounds
            assert c["speedup_over_bf16_route"] == pytest.approx(c["bf16_route"]["median_ms"] / c["auto"]["median_ms"])
    assert "| BertForQuestionAnswering | 3* |" in (out / "quant-cpu.md").read_text()


@pytest.mark.slow
@needs_torchao
def test_a_call_cut_by_its_budget_names_what_it_left_and_joins_with_the_call_that_ran_it(smoke, monkeypatch):
    out, ran = smoke
    bench(monkeypatch, "--out", str(out), "--tag", "cpu-cut", "--device", "cpu", "--smoke", "--budget-s", "-1",
          "--runs", str(out / "runs"))
    cut = json.loads((out / "quant-cpu-cut.json").read_text())
    assert cut["summary"]["not_run"] == quant.SMOKE_MODELS and cut["summary"]["cells"] == 0
    bench(monkeypatch, "--combine", str(out / "quant-cpu-cut.json"), str(out / "quant-cpu.json"), "--out", str(out),
          "--tag", "cpu-joined")
    joined = json.loads((out / "quant-cpu-joined.json").read_text())
    assert joined["summary"]["not_run"] == [] and joined["summary"]["cells"] == ran["summary"]["cells"]
    assert [r["model"] for r in joined["rows"]] == [quant.BERT, "tiny_mlp"]  # the table's order, unlisted models last
