"""Each stage on a tiny model, in-process; failing backends are excluded with their reason."""

from __future__ import annotations

import csv
import json

import pytest
import torch

import pipeline
from conftest import TINY
from pipeline.context import BackendOutcome
from pipeline.runner import run
from stages.capture import memory_holders
from stages.route import RouteNotConfident


def read_csv(path):
    with path.open() as f:
        return list(csv.DictReader(f))


def test_capture_and_profile_only(compose_cfg, tmp_path):
    cfg = compose_cfg([*TINY, "backends=[eager]", "reference=false", "stages=[capture,profile]", "model.batch_sizes=[1,4]"])
    ctx = run(cfg, tmp_path)
    capture = json.loads((tmp_path / "capture.json").read_text())
    assert capture["eager"]["status"] == "ok" and capture["eager"]["max_rel_error"] == 0.0
    assert ctx.backends["eager"].exact_sizes == [1, 4]  # the tuned sizes, which graph backends record exactly
    rows = read_csv(tmp_path / "profile.csv")
    assert [(r["backend"], int(r["batch_size"])) for r in rows] == [("eager", 1), ("eager", 4)]
    for r in rows:
        assert float(r["p10_ms"]) <= float(r["median_ms"]) <= float(r["p90_ms"])
        assert int(r["samples"]) >= cfg.profile.min_samples
    assert not (tmp_path / "route.json").exists() and ctx.routed is None


def test_all_stages_with_eager_and_a_mismatching_backend(compose_cfg, tmp_path):
    # A user's own backend file: bf16 autocast, held to a tolerance far below bf16 rounding.
    user_conf = tmp_path / "conf"
    (user_conf / "backends").mkdir(parents=True)
    (user_conf / "backends" / "eager_bf16.yaml").write_text(
        "# @package backends.eager_bf16\nkind: eager\nautocast_enabled: true\nautocast_dtype: bfloat16\n")
    cfg = compose_cfg([*TINY, "backends=[eager,eager_bf16]", f"hydra.searchpath=[file://{user_conf}]",
                       "validate.tolerance_scale=1e-6"])
    ctx = run(cfg, tmp_path)
    capture = json.loads((tmp_path / "capture.json").read_text())
    assert capture["eager_bf16"]["status"] == "failed"
    assert "output differs from eager" in capture["eager_bf16"]["reason"]
    assert "eager_bf16" not in ctx.profile
    route = json.loads((tmp_path / "route.json").read_text())
    assert route["ranges"] == [{"lo": 1, "hi": None, "backend": "eager", "precision": "fp32", "weights": "fp32"}]
    assert "eager_bf16" in route["excluded"]
    assert route["never_slower_than"] == "eager"  # the first eager-kind backend is the baseline
    validation = json.loads((tmp_path / "validation.json").read_text())
    assert validation["ok"] and {r["batch_size"] for r in validation["rows"]} >= {1, 2, 3, 5, 8, 9, 100}


def test_route_json_says_which_noisy_cells_the_route_rests_on_and_require_confident_refuses_it(compose_cfg, tmp_path):
    # A spread limit no real samples meet flags every cell noisy; one no samples exceed flags none.
    noisy = [*TINY, "backends=[eager]", "reference=false", "model.batch_sizes=[1,4]", "profile.noise_threshold=1e-9"]
    ctx = run(compose_cfg(noisy), tmp_path / "shipped")
    route = json.loads((tmp_path / "shipped" / "route.json").read_text())
    assert route["rests_on"] == [{"backend": "eager", "batch_size": 1}, {"backend": "eager", "batch_size": 4}]
    assert [(c["backend"], c["batch_size"]) for c in route["noisy_cells"]] == [("eager", 1), ("eager", 4)]
    assert all(c["reason"] for c in route["noisy_cells"]) and route["rests_on_noisy"] is True
    lo, hi = route["profile_intervals_ms"]["eager"]["1"]
    assert lo <= route["profile_medians_ms"]["eager"]["1"] <= hi
    assert ctx.validation["ok"] and (tmp_path / "shipped" / "model.tweak").is_file()  # shipped, flagged

    with pytest.raises(RouteNotConfident, match=r"rests on 2 cell\(s\) .*\(eager bs=1, eager bs=4; .*"
                                                r"profile=thorough, or set route.require_confident=false"):
        run(compose_cfg([*noisy, "route.require_confident=true"]), tmp_path / "refused")
    assert json.loads((tmp_path / "refused" / "route.json").read_text())["rests_on_noisy"] is True
    assert not (tmp_path / "refused" / "model.tweak").exists() and not (tmp_path / "refused" / "validation.json").exists()

    calm = [*TINY, "backends=[eager]", "reference=false", "model.batch_sizes=[1,4]", "profile.noise_threshold=1e9",
            "profile.rel_precision=1e9", "route.require_confident=true"]
    ctx = run(compose_cfg(calm), tmp_path / "confident")
    route = json.loads((tmp_path / "confident" / "route.json").read_text())
    assert route["noisy_cells"] == [] and route["rests_on_noisy"] is False and ctx.validation["ok"]


def test_a_backend_that_crashes_is_excluded_and_the_run_goes_on(compose_cfg, tmp_path):
    cfg = compose_cfg([*TINY, "backends=[eager,inductor]", "reference=false", "model.build._target_=models_for_tests.GraphBreakMLP",
                       "~model.build.depth", "backends.inductor.fullgraph=true", "model.batch_sizes=[2]"])
    ctx = run(cfg, tmp_path)
    assert ctx.outcomes["inductor"].status == "failed"
    assert ctx.outcomes["inductor"].reason  # the compiler's own message, recorded
    assert list(ctx.profile) == ["eager"] and ctx.validation["ok"]


def test_every_backend_failing_stops_with_a_clear_error(compose_cfg, tmp_path):
    cfg = compose_cfg([*TINY, "backends=[inductor]", "reference=false", "model.build._target_=models_for_tests.GraphBreakMLP",
                       "~model.build.depth", "backends.inductor.fullgraph=true", "model.batch_sizes=[2]"])
    with pytest.raises(RuntimeError, match="no backend survived"):
        run(cfg, tmp_path)
    assert json.loads((tmp_path / "capture.json").read_text())["inductor"]["status"] == "failed"


def test_a_model_whose_output_proves_nothing_is_unverified_and_routed_only_when_allowed(compose_cfg, tmp_path):
    # No layers and inputs of all ones: eager answers 1.0 everywhere at every seed, as would a wrong backend.
    base = [*TINY, "backends=[eager]", "reference=false", "model.build.depth=0", "model.inputs.x.fill=ones", "model.batch_sizes=[1,4]"]
    with pytest.raises(RuntimeError, match=r"unverified: eager \(validate.allow_unverified=true.*or tune on inputs on "
                                           r"which its output varies: model.examples="):
        run(compose_cfg(base), tmp_path / "refused")
    capture = json.loads((tmp_path / "refused" / "capture.json").read_text())
    assert capture["eager"]["status"] == "unverified"
    assert "constant within the tolerance (1 to 1)" in capture["eager"]["reason"]
    ctx = run(compose_cfg([*base, "validate.allow_unverified=true"]), tmp_path / "allowed")
    assert json.loads((tmp_path / "allowed" / "route.json").read_text())["unverified"] == ["eager"]
    assert ctx.validation["ok"] and {r["status"] for r in ctx.validation["rows"]} == {"uninformative"}


def test_gpt2_is_checked_on_its_cache_too(tmp_path):
    transformers = pytest.importorskip("transformers")
    transformers.logging.set_verbosity_error()
    torch.manual_seed(0)
    model = transformers.GPT2LMHeadModel(transformers.GPT2Config(n_layer=2, n_embd=32, n_head=2, vocab_size=100))
    pipeline.tune(model, {"input_ids": torch.randint(0, 100, (2, 8))}, run_dir=tmp_path,
                  overrides=["backends=[eager]", "reference=false", "profile=quick", "tracking=off", "model.batch_sizes=[1,2]",
                             "validate.extra_batch_sizes=[]"])
    capture = json.loads((tmp_path / "capture.json").read_text())
    assert capture["eager"]["status"] == "ok"
    assert capture["eager"]["tensors"] == 2 * 5  # two batch sizes x (logits + keys and values of 2 layers)
    validation = json.loads((tmp_path / "validation.json").read_text())
    assert {r["tensors"] for r in validation["rows"]} == {5}


def test_an_out_of_memory_failure_ends_with_what_the_candidates_built_before_it_hold():
    """On an H100 a candidate failed for want of 2.5 GiB with 76 GiB held by the ten built before it (DistilBERT at
    batch 256): the reason names the largest holders and what leaves room, not only the allocator's words."""
    gib = 2**30
    kept = [BackendOutcome("eager.bf16", "eager"), BackendOutcome("reference.bf16", "inductor", held_bytes=9 * gib),
            BackendOutcome("graph.bf16", "graph", held_bytes=int(6.6 * gib)),
            *[BackendOutcome(f"graph_{i}", "graph", held_bytes=(i + 1) * gib) for i in range(4)]]
    said = memory_holders(kept)
    assert said.startswith("; the candidates built before it hold 25.6 GiB of device memory (reference.bf16 9.0 GiB, "
                           "graph.bf16 6.6 GiB, graph_3 4.0 GiB, graph_2 3.0 GiB and 2 more)"), said
    assert "backends.<graph backend>.max_pool_mb" in said and "model.batch_sizes" in said
    assert memory_holders([BackendOutcome("eager", "eager")]) == ""  # the CPU: torch counts nothing to name
