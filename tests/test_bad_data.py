"""Bad data and models, found as soon as they can be: example files, batch dimensions, sequence lengths, a model
eager cannot be the reference for, NaN on the user's own rows, an accuracy budget nothing meets. Each is one
line naming the problem and the fix; none is a traceback or a run that measured for nothing."""

from __future__ import annotations

import json
import math
import re
import subprocess
import sys

import pytest
import torch

import pipeline
from conftest import ROOT, TINY
from mlflow_helpers import clean_env
from pipeline import inputs as model_inputs
from pipeline.preflight.checks import advice
from pipeline.errors import ConfigError, RunFailed
from pipeline.runner import run


def one_line_naming(message: str, *patterns: str) -> None:
    assert "\n" not in message.strip(), message
    for pattern in patterns:
        assert re.search(pattern, message), f"{pattern!r} not in: {message}"


# ---- example files and batch dimensions ----------------------------------------------------------------------

EXAMPLE_FILES = {  # id: (what the file holds, what the message names)
    "no-rows": ({"x": torch.empty(0, 16)}, r"example input 'x' has shape \(0, 16\): no rows along its batch dimension 0"),
    "empty-dict": ({}, r"holds an empty dict; save a dict of input name -> tensor, torch\.save"),
    "int-keys": ({1: torch.randn(2, 16)}, r"holds a dict keyed by ints, not input names; save a dict"),
    "a-list": ([torch.randn(2, 16)], r"holds a list; save a dict of input name"),
}


@pytest.mark.parametrize("case", list(EXAMPLE_FILES))
def test_an_examples_file_that_holds_no_usable_rows_is_named_before_any_work(compose_cfg, tmp_path, case):
    data, named = EXAMPLE_FILES[case]
    path = tmp_path / "examples.pt"
    torch.save(data, path)
    cfg = compose_cfg([*TINY, "backends=[eager]", "reference=false", f"model.examples={path}"])
    with pytest.raises(ConfigError) as err:
        model_inputs.complete(cfg)
    one_line_naming(str(err.value), rf"model\.examples={re.escape(str(path))}", named)


def test_batch_dims_that_are_not_ints_are_named(tmp_path):
    with pytest.raises(TypeError) as err:
        pipeline.tune(torch.nn.Linear(16, 4), {"input": torch.randn(3, 2, 16)}, batch_dims={"input": "1"},
                      run_dir=tmp_path, overrides=["tracking=off"])
    one_line_naming(str(err.value), r"batch_dims\['input'\]='1' is a str; a batch dimension is an int, "
                                    r"e\.g\. batch_dims=\{'input': 1\}")


def test_overrides_given_as_one_string_are_named(tmp_path):
    with pytest.raises(TypeError) as err:
        pipeline.tune(torch.nn.Linear(16, 4), torch.randn(3, 16), overrides="profile=quick", run_dir=tmp_path)
    one_line_naming(str(err.value), r"overrides='profile=quick' is a string; pass a list of overrides, "
                                    r"e\.g\. overrides=\['profile=quick'\]")
    assert not tmp_path.exists() or not list(tmp_path.iterdir())


def test_a_sequence_longer_than_the_model_embeds_is_named(compose_cfg):
    pytest.importorskip("transformers")
    cfg = compose_cfg(["model=hf", "model.hf.model_class=BertModel", "backends=[eager]", "reference=false", "tracking=off",
                       "+model.hf.config={num_hidden_layers: 1, hidden_size: 32, num_attention_heads: 2, "
                       "intermediate_size: 64, max_position_embeddings: 64}", "model.hf.seq_len=128"])
    with pytest.raises(ConfigError) as err:
        model_inputs.complete(cfg)
    one_line_naming(str(err.value), r"model\.hf\.seq_len=128: BertModel embeds at most 64 positions "
                                    r"\(max_position_embeddings\); use model\.hf\.seq_len=64, or give the model more: "
                                    r"'\+model\.hf\.config=\{max_position_embeddings: 128\}'")


# ---- a model eager cannot be the reference for: said before anything is built ---------------------------------

EAGER_CASES = {  # id: (overrides, what the message names)
    "batch-dim-misfit": (["model.inputs.x.batch_dim=1"],
                         r"eager fails on random inputs of seed 0 at batch size 2 \(RuntimeError: mat1 and mat2 shapes "
                         r"cannot be multiplied.*the inputs are x: \(16, batch\) float32: check each input's per-sample "
                         r"shape, dtype and batch dimension"),
    "writes-into-its-input": (["model.build._target_=models_for_tests.WritesIntoItsInput", "~model.build.width",
                               "~model.build.depth"],
                              r"the model writes into its input 'x' \(an in-place op on it in forward\).*copy it first "
                              r"in forward \(x = x\.clone\(\)\)"),
    "counts-its-calls": (["model.build._target_=models_for_tests.CountsItsCalls", "~model.build.width",
                          "~model.build.depth"],
                         r"the model answers the same inputs differently from one call to the next \(.*\): its output "
                         r"depends on state its calls change"),
}


@pytest.mark.parametrize("case", list(EAGER_CASES))
def test_a_model_eager_cannot_be_the_reference_for_is_named_before_any_backend_is_built(compose_cfg, tmp_path, case):
    extra, named = EAGER_CASES[case]
    cfg = compose_cfg([*TINY, "backends=[eager,inductor]", *extra])
    with pytest.raises(ConfigError) as err:
        run(cfg, tmp_path)
    one_line_naming(str(err.value), named)
    assert not (tmp_path / "capture.json").exists() and not (tmp_path / "config.yaml").exists()


@pytest.mark.slow
def test_the_command_line_names_a_misfit_batch_dim_in_one_line_and_leaves_no_run_directory(tmp_path):
    run_dir = tmp_path / "run"
    proc = subprocess.run([sys.executable, "-m", "pipeline", *TINY, "backends=[eager]", "reference=false", "model.inputs.x.batch_dim=1",
                           f"hydra.run.dir={run_dir}"], cwd=ROOT, env=clean_env(), capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 2 and "Traceback" not in proc.stdout + proc.stderr, proc.stderr[-3000:]
    assert proc.stderr.startswith("error: eager fails on") and proc.stderr.count("\n") == 1, proc.stderr
    assert not run_dir.exists()


# ---- NaN on the user's own rows is never passed without saying so ---------------------------------------------


def test_nan_on_the_users_own_rows_is_unverified_not_hidden_behind_random_inputs(tmp_path):
    nan = torch.full((4, 16), math.nan)
    with pytest.raises(RunFailed) as err:
        pipeline.tune(torch.nn.Linear(16, 4), nan, run_dir=tmp_path / "refused",
                      overrides=["backends=[eager]", "reference=false", "profile=quick", "tracking=off", "model.batch_sizes=[1,2]"])
    one_line_naming(str(err.value), r"capture: no backend survived; unverified: eager \(validate\.allow_unverified=true",
                    r"eager's output holds NaN or inf, so it cannot be checked")
    capture = json.loads((tmp_path / "refused" / "capture.json").read_text())
    assert capture["eager"]["status"] == "unverified"

    tuned = pipeline.tune(torch.nn.Linear(16, 4), nan, run_dir=tmp_path / "allowed",
                          overrides=["backends=[eager]", "reference=false", "profile=quick", "tracking=off", "model.batch_sizes=[1,2]",
                                     "validate.allow_unverified=true"])
    assert tuned is not None  # let in on purpose: and every check says it proved nothing
    rows = json.loads((tmp_path / "allowed" / "validation.json").read_text())["rows"]
    assert rows and all(r["status"] == "uninformative" and "NaN" in r["reason"] for r in rows)


# ---- the accuracy budget: nothing meets it, or it means nothing -------------------------------------------------


def test_a_budget_no_candidate_meets_fails_right_after_capture(compose_cfg, tmp_path):
    cfg = compose_cfg([*TINY, "backends=[eager]", "reference=false", "precision=[bf16]", "route.accuracy_budget.metric=max_rel_error",
                       "route.accuracy_budget.bound=1e-9"])
    with pytest.raises(ConfigError) as err:
        run(cfg, tmp_path)
    one_line_naming(str(err.value), r"no candidate meets route\.accuracy_budget \(max_rel_error <= 1e-09 against fp32 "
                                    r"eager\): the closest is eager\.bf16(-weights)? at max_rel_error [\d.e-]+; loosen "
                                    r"the bound \(route\.accuracy_budget\.bound=[\d.e-]+ admits it\) or add fp32")
    assert (tmp_path / "capture.json").is_file() and not (tmp_path / "profile.csv").exists()  # nothing timed in vain


def test_a_precision_list_without_fp32_and_a_bound_of_0_get_a_word(compose_cfg):
    lines = advice(compose_cfg([*TINY, "backends=[eager]", "reference=false", "precision=[bf16]", "route.accuracy_budget.bound=0"]))
    assert len(lines) == 2 and all("\n" not in line for line in lines)
    assert re.search(r"precision=\['bf16'\] has no fp32: no candidate runs the model as written.*"
                     r"'precision=\[fp32,bf16\]' keeps fp32 in the race", lines[0])
    assert re.search(r"route\.accuracy_budget\.bound=0 admits every candidate whose cosine is >= 0: almost any output; "
                     r"the default is cosine >= 0\.999", lines[1])
    exact = advice(compose_cfg([*TINY, "route.accuracy_budget.metric=max_rel_error", "route.accuracy_budget.bound=0"]))
    assert exact == ["route.accuracy_budget.bound=0 admits only outputs equal to fp32 eager's, so no reduced precision "
                     "will serve; the default is max_rel_error <= 0.01"]
    assert advice(compose_cfg([*TINY])) == []
