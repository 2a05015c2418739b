"""Sequence length as a second routed dimension (issue 31): padding proved per backend, the (batch range x length
range) table, serving at untuned lengths, the checkpoint's table, and a length above the largest refused."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Dict

import pytest
import torch
from torch import nn

import pipeline
from pipeline.api import compose_config
from pipeline.backends import create
from pipeline.errors import ConfigError
from pipeline.measure.compare import judge
from pipeline.record.recorder import Recorder
from pipeline.route import checkpoint
from pipeline.route.checkpoint import CheckpointError
from pipeline.route.policy import Range
from pipeline.route.served import RoutedModule, TuneRecord
from pipeline.route.table import Tile, backend_at, choose_table
from pipeline.runner import run
from pipeline.seqlen import SeqDims, between, cells, declared, padding_probes, probe_lengths, spec_at
from pipeline.backends.candidate import Candidate

CPU = torch.device("cpu")
TINY_BERT = ["model=hf", "model.hf.model_class=BertForQuestionAnswering",
             "+model.hf.config={num_hidden_layers: 1, hidden_size: 32, num_attention_heads: 2, "
             "intermediate_size: 64, vocab_size: 500}", "device=cpu", "profile=quick"]


# --- the dimension: lengths, probes, padding and cutting -------------------------------------------------------

def test_probes_pad_the_most_within_each_band_and_validate_checks_its_middle():
    assert padding_probes([16, 64]) == {16: 8, 64: 17}  # the first band's middle; then one above the tuned length below
    assert padding_probes([1, 2, 8]) == {8: 3}  # 1 and 2 have no untuned length below them
    assert between([16, 64]) == [8, 40]
    assert probe_lengths([16, 64, 128]) == (16, 64) and probe_lengths([32]) == (31, 32) and probe_lengths([1]) == ()
    assert cells([4, 1], [64, 16]) == [(1, 16), (1, 64), (4, 16), (4, 64)] and cells([4, 1], []) == [1, 4]


def test_inputs_are_padded_with_their_own_pad_values_and_outputs_cut_back_along_their_length():
    spec = {"input_ids": {"shape": [64], "dtype": "int64", "seq_dim": 1, "pad": 7},
            "attention_mask": {"shape": [64], "dtype": "int64", "seq_dim": 1, "pad": 0},
            "scale": {"shape": [3], "dtype": "float32"}}
    seq = SeqDims.of(spec, [16, 64], {"output.start": 1, "output.pooled": None})
    assert seq.target(40) == 64 and seq.target(16) == 16 and seq.target(65) is None
    inputs = {"input_ids": torch.ones(3, 40, dtype=torch.long), "attention_mask": torch.ones(3, 40, dtype=torch.long),
              "scale": torch.ones(3, 3)}
    padded = seq.resized(inputs, 64)
    assert padded["input_ids"].shape == (3, 64) and padded["input_ids"][:, 40:].eq(7).all()
    assert padded["attention_mask"][:, 40:].eq(0).all() and padded["scale"] is inputs["scale"]
    assert seq.length(padded) == 64 and seq.resized(padded, 16)["input_ids"].is_contiguous()
    out = seq.cut({"start": torch.zeros(3, 64), "pooled": torch.zeros(3, 5)}, 40)
    assert out["start"].shape == (3, 40) and out["pooled"].shape == (3, 5)
    assert spec_at(spec, 16)["input_ids"]["shape"] == [16] and spec_at(spec, 16)["scale"]["shape"] == [3]
    # Without tuned lengths a run holds its inputs as it always did: no seq_dim, no pad.
    assert declared(spec, [])["input_ids"] == {"shape": [64], "dtype": "int64"}
    assert declared(spec, [16])["scale"] == {"shape": [3], "dtype": "float32"}


def test_metric_names_and_csv_rows_carry_the_length_only_where_lengths_are_tuned():
    from pipeline.measure.measurement import Measurement
    from pipeline.record.recorder import profile_row
    from pipeline.route.figures import cell_key as key_of

    m = Measurement()
    m.windows.append([1.0, 1.1, 0.9])
    assert set(Recorder.cell_metrics("eager", (4, 64), m)) == {
        f"{fig}/eager/bs4/len64" for fig in ("latency_ms", "latency_lo_ms", "latency_hi_ms", "throughput", "noisy",
                                              "contended")}
    assert "latency_ms/eager/bs4" in Recorder.cell_metrics("eager", 4, m)
    row = profile_row("eager", (4, 64), m)
    assert (row["batch_size"], row["seq_len"]) == (4, 64) and key_of(row) == (4, 64)
    assert "seq_len" not in profile_row("eager", 4, m) and key_of(profile_row("eager", 4, m)) == 4


# --- the table: the router's rule per length, bands, exact lengths ----------------------------------------------

PROFILE2 = {  # ms; graph wins small batches at both lengths, inductor large ones
    "eager": {(1, 16): 2.0, (8, 16): 4.0, (1, 64): 3.0, (8, 64): 9.0},
    "inductor": {(1, 16): 1.5, (8, 16): 1.5, (1, 64): 2.5, (8, 64): 4.0},
    "graph": {(1, 16): 0.5, (8, 16): 2.1, (1, 64): 0.8, (8, 64): 5.2},
}
ORDER = ["eager", "inductor", "graph"]


def test_bands_merge_where_every_owner_pads_and_untuned_lengths_go_to_the_tuned_length_above():
    table = choose_table(PROFILE2, ORDER, [16, 64], "router", 0.10, any_length=set(ORDER))
    assert table == [Tile(1, 64, 1, 1, "graph"), Tile(1, 64, 2, None, "inductor")]
    assert backend_at(table, 1, 40) == "graph" and backend_at(table, 3, 40) == "inductor"
    assert backend_at(table, 1, 65) is None  # no length above the largest tuned one


def test_a_band_whose_owner_cannot_pad_goes_to_backends_that_run_any_length_on_the_same_measurements():
    # graph's padding failed: it keeps the tuned lengths; below each, inductor (which runs any length) serves
    table = choose_table(PROFILE2, ORDER, [16, 64], "router", 0.10, any_length={"eager", "inductor"})
    assert table == [Tile(1, 15, 1, None, "inductor"), Tile(16, 16, 1, 1, "graph"), Tile(16, 16, 2, None, "inductor"),
                     Tile(17, 63, 1, None, "inductor"), Tile(64, 64, 1, 1, "graph"), Tile(64, 64, 2, None, "inductor")]
    # nothing may serve untuned lengths: they are refused, the tuned ones served
    only_tuned = choose_table(PROFILE2, ["graph"], [16, 64], "router", 0.10, any_length=set())
    assert only_tuned == [Tile(16, 16, 1, None, "graph"), Tile(64, 64, 1, None, "graph")]
    assert backend_at(only_tuned, 1, 40) is None


def test_no_cell_of_the_table_is_served_slower_than_eager():
    profile = {"eager": {(1, 16): 1.0, (1, 64): 2.0}, "graph": {(1, 16): 1.5, (1, 64): 1.0}}
    table = choose_table(profile, ["eager", "graph"], [16, 64], "router", 0.10, any_length={"eager", "graph"},
                         baseline="eager")
    assert backend_at(table, 1, 16) == "eager" and backend_at(table, 1, 64) == "graph"


def test_one_backend_strategies_serve_every_length_only_where_that_backend_may():
    assert choose_table(PROFILE2, ORDER, [16, 64], "one_backend", 0.1, {"eager"}, backend="graph") == [
        Tile(16, 16, 1, None, "graph"), Tile(64, 64, 1, None, "graph")]
    assert choose_table(PROFILE2, ORDER, [16, 64], "first_wins", 0.1, {"eager"}) == [Tile(1, 64, 1, None, "eager")]
    assert choose_table(PROFILE2, ORDER, [16, 64], "highest_throughput", 0.1, set(ORDER))[0].backend == "inductor"


# --- checkpoints of a table ------------------------------------------------------------------------------------

class Tokens(nn.Module):
    """Token embeddings and a linear head per position, with an attention-like mask: padding is invisible."""

    def __init__(self) -> None:
        super().__init__()
        self.emb, self.head = nn.Embedding(50, 8), nn.Linear(8, 2)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        return self.head(self.emb(input_ids)) * attention_mask.unsqueeze(-1)


SPEC = {"input_ids": {"shape": [16], "dtype": "int64", "fill": "randint", "high": 50, "seq_dim": 1, "pad": 0},
        "attention_mask": {"shape": [16], "dtype": "int64", "fill": "mask", "seq_dim": 1, "pad": 0}}


@pytest.fixture
def table_ckpt(tmp_path) -> Path:
    """An honest eager checkpoint of a table over lengths 8 and 16, eager's padding proved."""
    torch.manual_seed(0)
    model = Tokens().eval()
    seq = SeqDims.of(SPEC, [8, 16], {"output": 1})
    backend = create(Candidate.of("eager", {"kind": "eager"}))
    backend.build(model, {}, CPU, [1, 2, 3])
    record = TuneRecord("tokens", model, SPEC, [1, 3], CPU, seq=seq, padded=["eager"])
    routed = RoutedModule({"eager": backend}, [Tile(1, 16, 1, None, "eager")], record)
    return checkpoint.save(routed, tmp_path / "t.tweak")


def test_a_table_checkpoint_serves_untuned_lengths_padded_and_refuses_one_above_the_largest(table_ckpt):
    payload = checkpoint.read(table_ckpt)
    assert payload["format"] == checkpoint.FORMAT == 8 and payload["seq"]["lengths"] == [8, 16]
    torch.manual_seed(1)
    model = Tokens().eval()
    served = pipeline.load(table_ckpt, model)
    ids, mask = torch.randint(0, 50, (2, 12)), torch.ones(2, 12, dtype=torch.long)
    with torch.inference_mode():
        out = served(input_ids=ids, attention_mask=mask)
        assert out.shape == (2, 12, 2) and judge(out, model(input_ids=ids, attention_mask=mask)).ok
    assert served.served_at(2, 12)[1].args[1:] == (16, 12)  # padded to 16, cut back to 12
    with pytest.raises(ValueError) as refused:
        served(input_ids=torch.zeros(2, 17, dtype=torch.long), attention_mask=torch.ones(2, 17, dtype=torch.long))
    assert "above the largest tuned length 16" in str(refused.value) and "\n" not in str(refused.value)
    with pytest.raises(ValueError, match="disagree on the length"):
        served(input_ids=torch.zeros(2, 9, dtype=torch.long), attention_mask=torch.ones(2, 10, dtype=torch.long))


@pytest.mark.parametrize("edit, named", [
    (lambda p: p["route"].__setitem__(0, {**p["route"][0], "len_lo": 9}), "no band holding the tuned length 8"),
    (lambda p: p["route"].append({**p["route"][0], "len_lo": 10}), "overlap at length 10"),
    (lambda p: p["route"].__setitem__(0, {**p["route"][0], "len_hi": 17}), "not within 1..16"),
    (lambda p: p["seq"].__setitem__("lengths", [16, 8]), "ascending"),
    (lambda p: p["seq"].__setitem__("padded", ["graph"]), "seq.padded must list backends"),
    (lambda p: p["route"][0].pop("len_lo"), "must hold exactly len_lo, len_hi, lo, hi and backend"),
])
def test_a_table_outside_the_format_is_refused_before_the_model_is_touched(table_ckpt, edit, named):
    payload = checkpoint.read(table_ckpt)
    edit(payload)
    checkpoint.write(payload, table_ckpt)
    model = Tokens().eval()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    with pytest.raises(CheckpointError, match=named):
        pipeline.load(table_ckpt, model)
    assert all(torch.equal(v, model.state_dict()[k]) for k, v in before.items())


def test_untuned_lengths_may_go_only_to_a_backend_that_pads_or_runs_any_length(table_ckpt):
    payload = checkpoint.read(table_ckpt)
    payload["backends"]["graph"] = {"name": "graph", "kind": "graph"}
    payload["route"] = [{"len_lo": 1, "len_hi": 16, "lo": 1, "hi": None, "backend": "graph"}]
    checkpoint.write(payload, table_ckpt)
    with pytest.raises(CheckpointError, match="backend 'graph' neither pads"):
        pipeline.load(table_ckpt, Tokens().eval())


@pytest.mark.parametrize("kind", ["openvino", "onnxruntime"])
def test_the_exported_runtimes_run_every_length_with_both_dimensions_dynamic(kind):
    from pipeline.batching import BatchDims
    from pipeline.models import make_inputs

    backend = create(Candidate.of(kind, {"kind": kind}))
    reason = backend.unsupported_reason(CPU)
    if reason:
        pytest.skip(reason)
    torch.manual_seed(0)
    model = Tokens().eval()
    seq = SeqDims.of(SPEC, [8, 16], {"output": 1})
    backend.build(model, make_inputs(SPEC, 3, CPU), CPU, [1, 2, 3], [1, 3], BatchDims.of(SPEC, {"output": 0}, seq))
    assert backend.any_length
    for bs, length in [(1, 8), (3, 16), (2, 11), (5, 3)]:
        inputs = seq.resized(make_inputs(SPEC, bs, CPU, seed=1), length)
        with torch.inference_mode():
            assert judge(backend(**inputs), model(**inputs)).ok, (bs, length)


# --- config -----------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("overrides, named", [
    (["model=tiny_mlp", "model.seq_lens=[8,16]"], "needs an input with a length dimension"),
    (["model=bert_tiny", "model.seq_lens=[8,8]"], "without repeats"),
    (["model=bert_tiny", "model.seq_lens=[0,8]"], "is not a sequence length"),
    (["model=bert_tiny", "model.seq_lens=[8]", "model.inputs.input_ids.seq_dim=0"], "other than its batch_dim 0"),
    (["model=bert_tiny", "model.seq_lens=[8]", "model.inputs.input_ids.seq_dim=1",
      "backends.graph.max_graphs=0", "backends=[eager,graph]"], "max_graphs=0"),
])
def test_lengths_that_cannot_be_tuned_are_one_line_before_any_work(tmp_path, overrides, named):
    cfg = compose_config([*overrides, "tracking=off", "device=cpu"])
    with pytest.raises(ConfigError, match=named) as refused:
        run(cfg, tmp_path / "run")
    assert "\n" not in str(refused.value) and not (tmp_path / "run").exists()


def test_an_inductor_backend_competes_with_the_length_dynamic_and_per_length():
    from pipeline.preflight.checks import candidates_of

    cfg = compose_config(["model=bert_tiny", "backends=[eager,inductor,graph_inductor]", "model.seq_lens=[8,16]"])
    names = candidates_of(cfg)
    assert list(names) == ["eager", "inductor", "inductor.per_length", "graph_inductor", "reference_max_autotune",
                           "reference_max_autotune.per_length"]  # the max-autotune reference peer splits too
    assert names["inductor"].settings.per_length is False and names["inductor.per_length"].settings.per_length is True
    assert "inductor.per_length" not in candidates_of(compose_config(["model=bert_tiny", "backends=[eager,inductor]"]))
    assert create(names["inductor"]).any_length and not create(names["inductor.per_length"]).any_length


def test_a_checkpoint_may_hold_a_per_length_candidate():
    """``<candidate>.per_length`` says what it runs, so the payload check takes it (it refused the name before); a
    name that says per length where the settings do not, or another precision, is still refused."""
    from pipeline.route.payload import backend_problem

    assert backend_problem("inductor.per_length", {"kind": "inductor", "per_length": True}) is None
    assert backend_problem("inductor.bf16.per_length", {"kind": "inductor", "precision": "bf16", "per_length": True}
                           ) is None
    assert "named for another precision" in backend_problem("inductor.per_length", {"kind": "inductor",
                                                                                     "per_length": False})
    assert "named for another precision" in backend_problem("inductor.fp16.per_length", {
        "kind": "inductor", "precision": "bf16", "per_length": True})


# --- end to end: the "Done when" --------------------------------------------------------------------------

def test_a_tiny_bert_tuned_at_two_lengths_serves_an_untuned_pair_padded_also_after_reload(tmp_path):
    cfg = compose_config([*TINY_BERT, "model.seq_lens=[16,64]", "model.batch_sizes=[1,4]", "backends=[eager,inductor]",
                          "backends.inductor.per_length=false", "reference=false",  # its per-length twin: the next test
                          "validate.extra_batch_sizes=[3]", "tracking=sqlite",
                          f"tracking.uri=sqlite:///{tmp_path / 'mlflow.db'}"])
    ctx = run(cfg, tmp_path / "run")
    assert ctx.validation["ok"]
    rows = ctx.validation["rows"]
    assert {(r["check"], r["batch_size"], r["seq_len"]) for r in rows if r["padded"]} >= {
        ("routed", 3, 40), ("reloaded", 3, 40)}  # untuned pairs, padded, checked after reload too
    capture = json.loads((tmp_path / "run" / "capture.json").read_text())
    assert {n: o["padding"] for n, o in capture.items()} == {"eager": "ok", "inductor": "ok"}
    assert capture["inductor"]["any_length"] and capture["eager"]["graphs"] == 0
    route = json.loads((tmp_path / "run" / "route.json").read_text())
    assert route["seq_lens"] == [16, 64] and "ranges" not in route
    assert {(t["len_lo"], t["len_hi"]) for t in route["table"]} <= {(1, 16), (17, 64), (1, 64), (1, 15), (16, 16),
                                                                     (17, 63), (64, 64)}
    assert set(route["profile_medians_ms"]["eager"]) == {"16", "64"}
    header = (tmp_path / "run" / "profile.csv").read_text().splitlines()[0].split(",")
    assert header[:3] == ["backend", "batch_size", "seq_len"]

    # (3, 40): padded to 64 by its owner, cut back, equal to eager at length 40; after a reload too
    eager = ctx.model
    inputs = ctx.input_sources(seed_offset=5)[0][1]((3, 40))
    served = pipeline.load(ctx.checkpoint_path, eager)
    for module in (ctx.routed, served):
        lock, call = module.served_at(3, 40)
        assert call.args[1:] == (64, 40), "an untuned length is padded to the tuned length above it"
        with torch.inference_mode():
            out, expected = module(**inputs), eager(**inputs)
        assert out.start_logits.shape == (3, 40) and judge(out, expected).ok
    with pytest.raises(ValueError) as refused:
        served(**ctx.input_sources()[0][1]((3, 65)))
    assert str(refused.value).startswith("input 'input_ids' has length 65, above the largest tuned length 64")
    assert "\n" not in str(refused.value)

    # MLflow: latency_ms/<backend>/bs<N>/len<L>; the report's rows per length and its heatmap
    from mlflow.tracking import MlflowClient

    from pipeline.record import report

    client = MlflowClient(tracking_uri=f"sqlite:///{tmp_path / 'mlflow.db'}")
    (found,) = client.search_runs([client.get_experiment_by_name("tweakpipe").experiment_id])
    assert {"latency_ms/eager/bs1/len16", "latency_ms/inductor/bs4/len64"} <= set(found.data.metrics)
    table = report.build([found])
    assert {"eager len=16", "auto len=64"} <= {r.backend for r in table.rows} and table.sizes == [1, 4]
    assert "| length \\ batch | 1 | 4 |" in report.markdown(table) and "x |" in report.markdown(table)


class MeanOfTokens(nn.Module):
    """Token embeddings averaged over the whole sequence, with no mask: every pad token moves the mean."""

    def __init__(self) -> None:
        super().__init__()
        self.emb, self.head = nn.Embedding(40, 8), nn.Linear(8, 3)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.head(self.emb(input_ids).mean(1))


def test_a_model_whose_outputs_change_under_padding_is_served_at_exact_lengths_only(tmp_path):
    torch.manual_seed(0)
    model = MeanOfTokens().eval()
    ids = torch.randint(1, 40, (6, 16))
    tuned = pipeline.tune(model, {"input_ids": ids}, seq_dims={"input_ids": 1}, seq_lens=[8, 16],
                          overrides=["backends=[eager,inductor]", "profile=quick", "tracking=off", "device=cpu",
                                     "model.batch_sizes=[1,4]", "compile_cache.workers=1", "reference=false"],
                          run_dir=tmp_path / "run")
    capture = json.loads((tmp_path / "run" / "capture.json").read_text())
    assert set(capture) == {"eager", "inductor", "inductor.per_length"}  # Inductor competes both ways
    assert capture["inductor"]["any_length"] and not capture["inductor.per_length"]["any_length"]
    for name, outcome in capture.items():  # every candidate fails padding, with the reason
        assert outcome["status"] == "ok", name
        assert outcome["padding"].startswith("outputs of padded calls, cut back, differ from eager's"), name
        assert "length 9 padded to 16" in outcome["padding"]
    assert tuned.record.padded == []
    for check in (tuned, pipeline.load(tmp_path / "run" / "model.tweak", model)):
        for bs, length in [(3, 12), (1, 5), (4, 16)]:
            lock, call = check.served_at(bs, length)
            assert call.any_length or length in (8, 16)  # untuned lengths run unpadded
            x = torch.randint(1, 40, (bs, length))
            with torch.inference_mode():
                assert judge(check(input_ids=x), model(input_ids=x)).ok


def test_a_format_5_checkpoint_without_lengths_still_loads(tmp_path):
    """Files written before lengths (format 5: no seq, backends without per_length or the graph caps) load as before."""
    torch.manual_seed(0)
    model = nn.Linear(4, 2).eval()
    backend = create(Candidate.of("eager", {"kind": "eager"}))
    backend.build(model, {}, CPU, [1, 2])
    record = TuneRecord("linear", model, {"input": {"shape": [4], "dtype": "float32"}}, [1, 2], CPU)
    path = checkpoint.save(RoutedModule({"eager": backend}, [Range(1, None, "eager")], record), tmp_path / "m.tweak")
    payload = checkpoint.read(path)
    assert "seq" not in payload and payload["inputs"] == {"input": {"shape": [4], "dtype": "float32"}}
    data = checkpoint.write({**payload, "format": 5}, path).read_bytes()
    path.write_bytes(data.replace(f"TWEAKPIPE-CHECKPOINT {checkpoint.FORMAT}\n".encode(), b"TWEAKPIPE-CHECKPOINT 5\n"))
    served = pipeline.load(path, model)
    x = torch.randn(3, 4)
    with torch.inference_mode():
        assert torch.equal(served(x), model(x))


def test_precision_candidates_are_proved_and_routed_per_cell_too(tmp_path):
    """The table routes over the precision list's candidates (each held to the budget and proved under padding)."""
    torch.manual_seed(0)
    model = Tokens().eval()
    ids, mask = torch.randint(0, 50, (4, 16)), torch.ones(4, 16, dtype=torch.long)
    tuned = pipeline.tune(model, {"input_ids": ids, "attention_mask": mask}, seq_dims={"input_ids": 1,
                          "attention_mask": 1}, seq_lens=[8, 16],
                          overrides=["backends=[eager]", "reference=false", "precision=[fp32,bf16]", "profile=quick", "tracking=off",
                                     "device=cpu", "model.batch_sizes=[1,4]", "validate.extra_batch_sizes=[2]"],
                          run_dir=tmp_path / "run")
    route = json.loads((tmp_path / "run" / "route.json").read_text())
    assert {c["backend"]: c["padding"] for c in route["candidates"]} == {
        "eager": "ok", "eager.bf16": "ok", "eager.bf16-weights": "ok"}
    assert all({"precision", "weights", "len_lo", "len_hi"} <= set(t) for t in route["table"])
    assert sorted(tuned.record.padded) == sorted({t["backend"] for t in route["table"]})
    x = {"input_ids": torch.randint(0, 50, (3, 11)), "attention_mask": torch.ones(3, 11, dtype=torch.long)}
    with torch.inference_mode():
        assert tuned(**x).shape == (3, 11, 2)
