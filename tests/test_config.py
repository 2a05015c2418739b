"""Every config group composes; bad input fails early with a message that names the fix."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch
from hydra.errors import ConfigCompositionException, MissingConfigException
from omegaconf.errors import ValidationError

from conftest import CONF, TINY
from pipeline.config.errors import explain_unknown_choices
from pipeline.errors import ConfigError
from pipeline.inputs import complete
from pipeline.preflight.checks import check_config
from pipeline.runner import run

GROUPS = ["model", "backends", "profile", "route", "validate", "tracking"]
# model=hf and model=timm are named after the model they build by default, and derive its inputs.
LIBRARY_MODELS = {"hf": "BertForQuestionAnswering", "timm": "resnet18"}


def options(group: str) -> list:
    return sorted(p.stem for p in (CONF / group).glob("*.yaml"))


def given(option: str, folder: Path) -> list:
    """What an option leaves to the command line: ``model=custom``'s target and examples."""
    if option != "custom":
        return []
    torch.save({"x": torch.randn(2, 16)}, folder / "x.pt")
    return ["model.build._target_=pipeline.models.MLP", "+model.build.width=16", f"model.examples={folder / 'x.pt'}"]


@pytest.mark.parametrize("group,option", [(g, o) for g in GROUPS for o in options(g)])
def test_every_group_option_composes(compose_cfg, group, option, tmp_path):
    extra = ["route.backend=eager"] if option == "one_backend" else given(option, tmp_path)
    cfg = compose_cfg([f"{group}={option}", *extra])
    assert cfg[group] is not None
    if group == "model":
        complete(cfg)
        assert cfg.model.name == LIBRARY_MODELS.get(option, option) and cfg.model.batch_sizes and cfg.model.inputs
    if group == "backends":
        assert cfg.backends and all("kind" in b for b in cfg.backends.values())
        check_config(cfg)


def test_every_model_declares_inputs_and_batch_sizes(compose_cfg, tmp_path):
    for name in options("model"):
        cfg = compose_cfg([f"model={name}", *given(name, tmp_path)])
        complete(cfg)
        assert all(list(spec.shape) for spec in cfg.model.inputs.values())
        assert all(b >= 1 for b in cfg.model.batch_sizes)


def test_backends_are_picked_by_name(compose_cfg):
    cfg = compose_cfg(["backends=[eager,inductor]"])
    assert list(cfg.backends) == ["eager", "inductor"]
    assert list(compose_cfg(["backends=[eager]", "reference=false"]).backends) == ["eager"]


def test_default_device_is_auto_and_mlp_is_default(compose_cfg):
    cfg = compose_cfg([])
    assert cfg.device == "auto" and cfg.model.name == "mlp"
    assert cfg.tracking.uri == "sqlite:///outputs/mlflow.db"


def test_unknown_model_lists_what_exists(compose_cfg):
    with pytest.raises(MissingConfigException) as err:
        compose_cfg(["model=resnet1800"])
    assert "resnet18" in str(err.value) and "model" in str(err.value)


def test_unknown_backend_in_a_list_is_named_with_what_exists(compose_cfg):
    with pytest.raises(MissingConfigException):
        compose_cfg(["backends=[eager,indcutor]"])
    hint = explain_unknown_choices(["backends=[eager,indcutor]", "model=mlp"], [CONF])
    assert hint.startswith("unknown backends 'indcutor'; available:") and "inductor" in hint
    assert explain_unknown_choices(["backends=[eager,inductor]", "profile=quick"], [CONF]) is None


def test_typo_in_a_key_fails_at_composition(compose_cfg):
    with pytest.raises(ConfigCompositionException) as err:
        compose_cfg(["profile.warmup_msec=3"])
    assert "Key 'warmup_msec' not in 'ProfileConfig'" in str(err.value.__cause__)


def test_typo_in_a_users_backend_file_fails_at_composition_or_in_the_early_checks(compose_cfg, tmp_path):
    (tmp_path / "backends").mkdir()
    typed = "defaults:\n  - /schema_backend_inductor@_here_\n"
    (tmp_path / "backends" / "typed.yaml").write_text(f"# @package backends.typed\n{typed}fulgraph: true\n")
    (tmp_path / "backends" / "plain.yaml").write_text("# @package backends.plain\nkind: inductor\nfulgraph: true\n")
    searchpath = f"hydra.searchpath=[file://{tmp_path}]"
    with pytest.raises(ConfigCompositionException) as err:  # a file extending its kind's schema: at composition
        compose_cfg(["backends=[typed]", searchpath])
    assert "Key 'fulgraph' not in 'InductorSettings'" in str(err.value)
    cfg = compose_cfg(["backends=[plain]", searchpath])  # a file that only names its kind: in the early checks
    with pytest.raises(ConfigError, match=r"^backend 'plain' \(kind inductor\) sets 'fulgraph', which inductor backends "
                                          r"do not take \(no backend kind has it\); inductor keys: kind, description"):
        check_config(cfg)


def test_wrong_type_fails_at_composition(compose_cfg):
    with pytest.raises(ConfigCompositionException) as err:
        compose_cfg(["profile.min_samples=many"])
    assert isinstance(err.value.__cause__, ValidationError)


def test_mode_plus_options_fails_naming_both(compose_cfg):
    cfg = compose_cfg(["backends=[inductor]", "+backends.inductor.options.max_autotune=true"])
    with pytest.raises(ValueError, match="mode and options"):
        check_config(cfg)


@pytest.mark.parametrize("sizes", ["[0,4]", "[-1]", "[]"])
def test_nonpositive_batch_sizes_are_rejected(compose_cfg, sizes):
    cfg = compose_cfg([*TINY, f"model.batch_sizes={sizes}"])
    with pytest.raises(ConfigError, match=r"model\.batch_sizes.*e\.g\. model\.batch_sizes=\[1,8,64\]"):
        check_config(cfg)


def test_unknown_stage_and_missing_prerequisite(compose_cfg):
    with pytest.raises(ValueError, match="unknown stage 'tune'"):
        check_config(compose_cfg([*TINY, "stages=[capture,tune]"]))
    with pytest.raises(ValueError, match="needs \\['profile'\\]"):
        check_config(compose_cfg([*TINY, "stages=[capture,route]"]))


@pytest.mark.skipif(__import__("torch").cuda.is_available(), reason="this machine has CUDA")
def test_cuda_without_cuda_fails_before_any_work(compose_cfg, tmp_path):
    cfg = compose_cfg([*TINY, "device=cuda"])
    with pytest.raises(ConfigError, match="sees no cuda device; use device=auto or device=cpu"):
        run(cfg, tmp_path / "run")
    assert not (tmp_path / "run" / "capture.json").exists()


def test_plain_file_store_is_refused(compose_cfg, tmp_path):
    cfg = compose_cfg([*TINY, "tracking=sqlite", f"tracking.uri=file://{tmp_path}/mlruns"])
    with pytest.raises(ValueError, match="plain-file store"):
        run(cfg, tmp_path / "run")


def test_plugin_launchers_are_not_called_unknown():
    assert explain_unknown_choices(["hydra/launcher=joblib", "model=mlp"], [CONF]) is None


def test_one_backend_must_name_a_selected_backend(compose_cfg):
    cfg = compose_cfg([*TINY, "backends=[eager]", "reference=false", "route=one_backend", "route.backend=inductor"])
    with pytest.raises(ValueError, match="route.backend=inductor is not among the selected backends"):
        check_config(cfg)
    with pytest.raises(ValueError, match="needs the backend to deploy: route.backend=<name>"):
        check_config(compose_cfg([*TINY, "backends=[eager]", "reference=false", "route=one_backend"]))


@pytest.mark.parametrize("overrides,name", [
    (["model.build._target_=models_for_tests.ThreadCountingMLP"], "ThreadCountingMLP"),  # your model, not mlp
    (["model.build._target_=models_for_tests.ThreadCountingMLP", "model.name=mine"], "mine"),
    (["model=tiny_mlp"], "tiny_mlp"),
])
def test_the_run_directory_is_named_after_the_users_model(overrides, name):
    from hydra import compose, initialize_config_dir

    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        cfg = compose(config_name="config", overrides=overrides, return_hydra_config=True)
    assert cfg.hydra.run.dir.endswith(f"_{name}_{os.getpid()}"), cfg.hydra.run.dir
