"""Models named by their library: model=hf (any transformers class) and model=timm, from the command line."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch
import yaml

from conftest import ROOT
from pipeline import runner
from pipeline.api import compose_config
from pipeline.config import SHIPPED_CONF
from pipeline.errors import ConfigError
from pipeline.inputs import complete
from pipeline.zoo import hf

TINY_BERT = "+model.hf.config={num_hidden_layers: 2, hidden_size: 32, num_attention_heads: 2, intermediate_size: 64}"


def run_cli(tmp_path, *overrides: str) -> dict:
    """``python -m pipeline`` in a subprocess, eager only and quick; the run's resolved config."""
    proc = subprocess.run([sys.executable, "-m", "pipeline", *overrides, "profile=quick", "tracking=off",
                           "backends=[eager]", "reference=false", "model.batch_sizes=[1,2]", "validate.extra_batch_sizes=[3]",
                           f"hydra.run.dir={tmp_path}"],
                          cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert json.loads((tmp_path / "validation.json").read_text())["ok"]
    return yaml.safe_load((tmp_path / "config.yaml").read_text())


@pytest.mark.slow
def test_the_command_line_tunes_any_transformers_model_class(tmp_path):
    cfg = run_cli(tmp_path, "model=hf", "model.hf.model_class=BertForQuestionAnswering", TINY_BERT,
                  "model.hf.seq_len=16")
    assert cfg["model"]["name"] == "BertForQuestionAnswering"
    inputs = cfg["model"]["inputs"]
    assert inputs["input_ids"]["high"] == 30522 and inputs["attention_mask"]["fill"] == "mask"
    assert inputs["token_type_ids"]["high"] == 2 and inputs["input_ids"]["shape"] == [16]
    tensors = json.loads((tmp_path / "capture.json").read_text())["eager"]["tensors"]
    assert tensors > 0  # start and end logits compared, by name


@pytest.mark.slow
def test_the_command_line_tunes_any_timm_model(tmp_path):
    cfg = run_cli(tmp_path, "model=timm", "model.timm.name=resnet10t", "model.inputs.x.shape=[3,32,32]")
    assert cfg["model"]["name"] == "resnet10t" and cfg["model"]["inputs"]["x"]["shape"] == [3, 32, 32]


def derived(*overrides: str) -> dict:
    """model=hf's inputs, derived from the model class, as name -> (per-sample shape, fill)."""
    cfg = compose_config(["model=hf", *overrides])
    complete(cfg)
    return {name: (list(spec.shape), spec.fill) for name, spec in cfg.model.inputs.items()}


def test_transformers_inputs_come_from_the_models_signature_and_config():
    assert derived("model.hf.model_class=GPT2LMHeadModel", "model.hf.seq_len=8") == {
        "input_ids": ([8], "randint"), "attention_mask": ([8], "mask")}  # GPT-2 embeds no token types
    assert "decoder_input_ids" in derived("model.hf.model_class=T5ForConditionalGeneration")
    assert derived("model.hf.model_class=ViTForImageClassification", "+model.hf.config={image_size: 64}") == {
        "pixel_values": ([3, 64, 64], "randn")}
    assert derived("model.hf.model_class=models.whisper.modeling_whisper.WhisperEncoder") == {
        "input_features": ([80, 3000], "randn")}
    assert derived("model.hf.model_class=Wav2Vec2Model", "model.hf.samples=4000") == {"input_values": ([4000], "randn")}


def test_transformers_outputs_stay_model_outputs_and_caches_stay_off_unless_asked():
    spec = {"model_class": "GPT2LMHeadModel", "config": {"n_layer": 1, "n_embd": 16, "n_head": 2}}
    ids = torch.randint(0, 100, (2, 5))
    with torch.inference_mode():
        plain = hf.build(spec).eval()(input_ids=ids)
        cached = hf.build({**spec, "use_cache": True}).eval()(input_ids=ids)
    assert type(plain).__name__ == "CausalLMOutputWithCrossAttentions" and "past_key_values" not in plain
    assert cached.past_key_values is not None


@pytest.mark.parametrize("overrides, named", [
    (["model.hf.model_class=BertForQuestionAnswerin"], "no such class; close: BertForQuestionAnswering"),
    (["model.hf.model_class=BertConfig"], "is not a transformers model class"),
    (["+model.hf.config={num_hidden_layerz: 2}"], "BertConfig has no 'num_hidden_layerz'; close: num_hidden_layers"),
])
def test_a_wrong_transformers_model_is_named_in_one_line(overrides, named):
    with pytest.raises(ConfigError, match=named):
        derived(*overrides)


def test_a_wrong_timm_name_and_a_missing_library_are_named_in_one_line(tmp_path, monkeypatch):
    with pytest.raises(ConfigError, match="model.timm.name=resnet1o: timm .* has no such model; close: resnet18"):
        runner.run(compose_config(["model=timm", "model.timm.name=resnet1o", "tracking=off"]), tmp_path / "a")
    monkeypatch.setitem(sys.modules, "timm", None)  # as if the extra were not installed
    with pytest.raises(ConfigError, match=r"model=timm needs the timm package.*pip install -e '\.\[timm\]'"):
        runner.run(compose_config(["model=timm", "tracking=off"]), tmp_path / "b")
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()


def test_the_hf_suite_sweeps_six_full_size_models_in_bf16_on_every_gpu_backend():
    cfg = compose_config(["experiment=hf_suite"])
    suite = yaml.safe_load((SHIPPED_CONF / "experiment" / "hf_suite.yaml").read_text())
    classes = suite["hydra"]["sweeper"]["params"]["model.hf.model_class"].split(",")
    assert len(classes) >= 6 and {"BertForQuestionAnswering", "ElectraForQuestionAnswering"} <= set(classes)
    assert list(cfg.backends) == ["eager", "inductor", "graph", "graph_inductor", "graph_inductor_regional",
                                  "inductor_reduce_overhead"]
    assert all(b.autocast_enabled and b.autocast_dtype == "bfloat16" for b in cfg.backends.values())
    assert list(cfg.model.batch_sizes) == [1, 8, 32, 128] and cfg.model.hf.config == {}  # full size
    for name in classes:
        assert derived("experiment=hf_suite", f"model.hf.model_class={name}")  # every model's inputs derive
    assert derived("experiment=hf_suite")["input_ids"] == ([128], "randint")
