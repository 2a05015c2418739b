"""What the command line tells a newcomer: a one-page ``--help``, and the closest keys for a misspelt one."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch
from hydra.errors import ConfigCompositionException

from conftest import CONF, ROOT
from pipeline.preflight.checks import added_keys, check_config
from pipeline.config.errors import explain_unknown_key
from pipeline.errors import ConfigError


@pytest.mark.parametrize("override, hint", [
    ("profile.budget_m=5", "unknown key profile.budget_m; closest: profile.budget_ms"),
    ("model.inputs.x.shpe=[3]", "unknown key model.inputs.x.shpe; closest: model.inputs.x.shape"),
    ("route.accuracy_budget.metrc=cosine",
     "unknown key route.accuracy_budget.metrc; closest: route.accuracy_budget.metric"),
    ("validate.xyz=1", "unknown key validate.xyz; validate has extra_batch_sizes, check_reload, "),
])
def test_a_misspelt_key_is_answered_with_the_closest_valid_keys(compose_cfg, override, hint):
    with pytest.raises(ConfigCompositionException) as caught:
        compose_cfg([override])
    message = explain_unknown_key(caught.value)
    assert message is not None and message.startswith(hint), message
    assert "+" not in message and "\n" not in message


def test_the_api_says_the_same_in_one_line():
    import pipeline

    with pytest.raises(ConfigError, match=r"^unknown key profile\.budget_m; closest: profile\.budget_ms"):
        pipeline.tune(torch.nn.Linear(4, 2), torch.randn(2, 4), overrides=["profile.budget_m=5"])


def test_a_wrong_value_is_not_taken_for_an_unknown_key(compose_cfg):
    with pytest.raises(ConfigCompositionException) as caught:
        compose_cfg(["profile.min_samples=many"])
    assert explain_unknown_key(caught.value) is None  # Hydra's own words say what is wrong there


def test_a_key_added_with_a_plus_where_the_schema_has_none_is_refused(compose_cfg, tmp_path):
    cfg = compose_cfg(["+profile.budget_m=5", "tracking=off"])
    with pytest.raises(ConfigError, match=r"^unknown key profile\.budget_m; closest: profile\.budget_ms\b.* \(a \+ adds"):
        check_config(cfg, tmp_path / "run")
    assert not (tmp_path / "run").exists()
    # Where a section takes any key (Inductor options, a transformers config), a + is what adds one.
    cfg = compose_cfg(["+backends.inductor.options.max_autotune=true", "backends.inductor.mode=null", "model=hf",
                       "model.hf.model_class=BertModel", "+model.hf.config={num_hidden_layers: 1}"])
    assert list(added_keys(cfg)) == []


def run_cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "pipeline", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=120)


@pytest.mark.slow
def test_the_command_line_answers_a_misspelt_key_in_one_line(tmp_path):
    proc = run_cli("profile.budget_m=5", "tracking=off", f"hydra.run.dir={tmp_path}/run")
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1, proc.stderr
    assert proc.stderr.startswith("error: unknown key profile.budget_m; closest: profile.budget_ms"), proc.stderr
    assert "To append" not in proc.stderr and not (tmp_path / "run").exists()


@pytest.mark.slow
def test_help_is_one_page_with_every_group_and_where_to_go_next():
    proc = run_cli("--help")
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert len(lines) < 50, proc.stdout  # not the composed config (`--cfg job` prints that)
    assert "warmup_ms" not in proc.stdout
    groups = sorted(d.name for d in CONF.iterdir() if d.is_dir() and d.name != "hydra" and any(d.glob("*.yaml")))
    for group in groups:  # one line per group, listing its options
        (line,) = [line for line in lines if line.startswith(f"{group}: ")]
        assert all(f" {p.stem}" in line for p in (CONF / group).glob("*.yaml")), line
    for pointer in ("-m, --multirun", "--config-dir", "tweakpipe templates", "tweakpipe report",
                    "resume=", "device=", "model.batch_sizes=", "tracking=off"):
        assert pointer in proc.stdout, pointer
