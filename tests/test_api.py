"""The Python API: tune a user's own model in-process, save it, load it; input specs from example tensors."""

from __future__ import annotations

import subprocess
import sys

import mlflow
import pytest
import torch
from torch import nn

import pipeline
from conftest import ROOT
from pipeline.api import input_spec


class TwoInputs(nn.Module):
    """A model that is not in conf/model: a float input and token ids."""

    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(8, 4)
        self.emb = nn.Embedding(10, 4)

    def forward(self, features: torch.Tensor, token_ids: torch.Tensor, scale: float = 1.0) -> torch.Tensor:
        return (self.proj(features) + self.emb(token_ids).sum(1)) * scale


def example(batch: int = 2):
    """Features and token ids; the ids reach 9, so the spec draws ids in [0, 10)."""
    return torch.randn(batch, 8), torch.arange(batch * 5).reshape(batch, 5) % 10


def test_input_spec_names_positional_examples_after_forward_parameters():
    assert input_spec(TwoInputs(), example()) == {
        "features": {"shape": [8], "dtype": "float32", "fill": "randn"},
        "token_ids": {"shape": [5], "dtype": "int64", "fill": "randint", "high": 10},
    }


def test_input_spec_from_a_dict_a_tensor_and_masks():
    mask = torch.ones(3, 7, dtype=torch.int64)
    spec = input_spec(TwoInputs(), {"features": torch.randn(3, 8), "token_ids": mask})
    assert spec["token_ids"] == {"shape": [7], "dtype": "int64", "fill": "ones"}
    assert input_spec(nn.Linear(4, 2), torch.randn(5, 4)) == {"input": {"shape": [4], "dtype": "float32", "fill": "randn"}}


def test_input_spec_errors_name_the_problem():
    features, ids = example()
    with pytest.raises(ValueError, match="disagree on the batch size"):
        input_spec(TwoInputs(), (features, ids[:1]))
    with pytest.raises(TypeError, match=r"has shape \(\), with no batch dimension 0"):
        input_spec(nn.Linear(4, 2), torch.tensor(1.0))
    with pytest.raises(TypeError, match="dtype torch.complex64"):
        input_spec(nn.Linear(4, 2), torch.zeros(2, 4, dtype=torch.complex64))
    with pytest.raises(TypeError, match="cannot name 2 positional inputs"):
        input_spec(nn.Linear(4, 2), example())
    with pytest.raises(TypeError, match=r"needs \['token_ids'\]"):
        input_spec(TwoInputs(), {"features": features})


def test_tune_save_load_a_users_own_model(tmp_path):
    model = TwoInputs()
    db = tmp_path / "mlflow.db"
    tuned = pipeline.tune(model, example(), run_dir=tmp_path / "run", overrides=[
        "backends=[eager]", "reference=false", "profile=quick", f"tracking.uri=sqlite:///{db}", "model.batch_sizes=[1,4]"])
    run_dir = tmp_path / "run"
    for name in ("config.yaml", "capture.json", "profile.csv", "route.json", "validation.json", "model.tweak"):
        assert (run_dir / name).is_file(), name
    config = (run_dir / "config.yaml").read_text()
    assert "name: TwoInputs" in config and "token_ids" in config and "test_api.TwoInputs" in config

    features, ids = example(6)
    with torch.inference_mode():
        expected = model(features, ids)
        torch.testing.assert_close(tuned(features, ids), expected)
        torch.testing.assert_close(tuned(features=features, token_ids=ids), expected)

    loaded = pipeline.load(pipeline.save(tuned, tmp_path / "two.tweak"), TwoInputs())
    with torch.inference_mode():
        torch.testing.assert_close(loaded(features, ids), expected)

    client = mlflow.MlflowClient(tracking_uri=f"sqlite:///{db}")
    (run,) = client.search_runs([client.get_experiment_by_name("tweakpipe").experiment_id])
    assert "model.tweak" in {a.path for a in client.list_artifacts(run.info.run_id)}


def test_tune_defaults_to_outputs_api_and_respects_model_name(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    overrides = ["backends=[eager]", "reference=false", "profile=quick", "tracking=off", "model.batch_sizes=[2]", "model.name=mine",
                 "validate.check_reload=false"]
    pipeline.tune(nn.Linear(4, 2), torch.randn(2, 4), overrides=overrides)
    pipeline.tune(nn.Linear(4, 2), torch.randn(2, 4), overrides=overrides)
    runs = sorted(p.name for p in (tmp_path / "outputs" / "api").iterdir())
    assert len(runs) == 2 and all(r.endswith("_mine") or "_mine-" in r for r in runs)
    assert all((tmp_path / "outputs" / "api" / r / "model.tweak").is_file() for r in runs)


def test_tune_needs_the_route_stage():
    with pytest.raises(ValueError, match="stages must include route"):
        pipeline.tune(nn.Linear(4, 2), torch.randn(2, 4), overrides=["stages=[capture,profile]", "tracking=off"])


def test_import_pipeline_stays_light():
    code = "import sys, pipeline; assert not {'torch', 'hydra', 'mlflow'} & set(sys.modules); print(pipeline.__all__)"
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "['load', 'load_logged_model', 'save', 'tune']"


def test_tuned_module_rejects_shapes_it_was_not_tuned_for(tmp_path):
    tuned = pipeline.tune(TwoInputs(), example(), overrides=["backends=[eager]", "reference=false", "profile=quick", "tracking=off",
                                                            "model.batch_sizes=[1,2]"], run_dir=tmp_path)
    features, ids = example(3)
    assert tuned(features, ids).shape == (3, 4)
    with pytest.raises(ValueError, match="per-sample shape \\(9,\\), but this model was tuned for \\(8,\\)"):
        tuned(torch.randn(3, 9), ids)
    with pytest.raises(ValueError, match="inputs disagree on the batch size"):
        tuned(features, ids[:2])
    with pytest.raises(TypeError, match="missing \\['token_ids'\\]"):
        tuned(features)
