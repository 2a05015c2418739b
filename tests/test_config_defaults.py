"""One source of truth: every default lives in a schema dataclass, and the YAML says only what differs.

Every option of every group is composed and compared with its schema, so a YAML value and a
dataclass default can never silently disagree; and each backend kind refuses the other kinds' keys.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any, Dict, List, Tuple

import pytest
from hydra.errors import ConfigCompositionException
from omegaconf import OmegaConf

from conftest import CONF, TINY
from pipeline import backends
from pipeline.backends import graph_plan
from pipeline.config import backend_schema, flags
from pipeline.preflight.checks import check_config
from pipeline.config.errors import one_line
from pipeline.errors import ConfigError
from pipeline.config.schema import SCHEMAS
from pipeline.backends.candidate import Candidate

PRESET_GROUPS = ["profile", "route", "validate", "tracking"]  # groups whose options are presets of one schema


def body(path: Path) -> Dict[str, Any]:
    """A YAML file's own keys, without its defaults list."""
    raw = OmegaConf.to_container(OmegaConf.load(path))
    return {k: v for k, v in (raw or {}).items() if k != "defaults"}


def schema_defaults(schema: type) -> Dict[str, Any]:
    return OmegaConf.to_container(OmegaConf.structured(flags.loose(schema)))  # as Hydra composes it


def options(group: str) -> List[Path]:
    return sorted((CONF / group).glob("*.yaml"))


def backend_files() -> List[Path]:
    """The shipped backend files (the others in conf/backends are named sets)."""
    return [p for p in options("backends") if "kind" in body(p)]


def default_option(group: str) -> str:
    defaults = OmegaConf.to_container(OmegaConf.load(CONF / "config.yaml").defaults)
    return next(d[group] for d in defaults if isinstance(d, dict) and group in d)


@pytest.mark.parametrize("group", PRESET_GROUPS)
def test_the_default_preset_is_the_dataclass(compose_cfg, group: str) -> None:
    assert body(CONF / group / f"{default_option(group)}.yaml") == {}
    composed = OmegaConf.to_container(compose_cfg([])[group], resolve=True)
    assert composed == dataclasses.asdict(SCHEMAS[group]())


@pytest.mark.parametrize("path", [p for g in PRESET_GROUPS + ["model"] for p in options(g)], ids=lambda p: p.stem)
def test_every_option_says_only_what_differs_from_its_schema(compose_cfg, path: Path) -> None:
    group, own = path.parent.name, body(path)
    defaults = schema_defaults(SCHEMAS[group])
    assert set(own) <= set(defaults), f"keys the schema lacks: {set(own) - set(defaults)}"
    if group != "model":  # a model's keys have no defaults to restate
        assert [k for k in own if own[k] == defaults[k]] == [], "keys that restate the schema's default"
    extra = ["route.backend=eager"] if path.stem == "one_backend" else []
    composed = compose_cfg([f"{group}={path.stem}", *extra])[group]
    expected = OmegaConf.merge(OmegaConf.structured(SCHEMAS[group]), own, {"backend": "eager"} if extra else {})
    assert OmegaConf.to_container(composed) == OmegaConf.to_container(expected)


@pytest.mark.parametrize("path", backend_files(), ids=lambda p: p.stem)
def test_every_backend_file_extends_its_kinds_schema_and_says_only_what_differs(compose_cfg, path: Path) -> None:
    own = body(path)
    kind = own["kind"]
    assert f"/schema_backend_{kind}@_here_" in OmegaConf.load(path).defaults
    defaults = schema_defaults(backend_schema.KINDS[kind])
    assert set(own) <= set(defaults)
    assert [k for k in own if k != "kind" and own[k] == defaults[k]] == []
    composed = compose_cfg([f"backends=[{path.stem}]"]).backends[path.stem]
    assert OmegaConf.get_type(composed) is flags.loose(backend_schema.KINDS[kind])  # booleans held as written
    assert OmegaConf.to_container(composed) == {**defaults, **own}
    assert backends.create(Candidate.of(path.stem, composed)).describe()["kind"] == kind


def test_every_kind_has_a_schema_and_an_implementation() -> None:
    assert set(backend_schema.KINDS) == set(backends.KINDS)
    assert graph_plan.DEFAULT_CAP == backend_schema.GraphSettings().max_recorded_batch_size


@pytest.mark.parametrize("kind", sorted(backend_schema.KINDS))
def test_a_candidates_settings_are_values_no_room_can_edit(kind: str) -> None:
    """Issue 55: settings were a mutable dict any room could change under the others; a variant is a new one."""
    candidate = Candidate.of(f"my_{kind}", {"kind": kind})
    with pytest.raises(dataclasses.FrozenInstanceError):
        candidate.settings.precision = "bf16"  # type: ignore[misc]
    variant = dataclasses.replace(candidate, settings=dataclasses.replace(candidate.settings, precision="bf16"))
    assert (candidate.precision, variant.settings.precision) == ("fp32", "bf16")


def test_a_candidates_options_and_grid_cannot_be_edited_either_and_leave_as_plain_data() -> None:
    """Issue 55: a frozen dataclass whose options dict any room can still change is not frozen."""
    given = {"kind": "graph", "compile_with_inductor": True, "options": {"max_autotune": False}, "grid": [1, 2, 8]}
    candidate = Candidate.of("mine", given)
    with pytest.raises(TypeError):
        candidate.settings.options["max_autotune"] = True  # type: ignore[index]
    with pytest.raises(AttributeError):
        candidate.settings.grid.append(16)  # type: ignore[union-attr]
    given["options"]["max_autotune"] = True  # the caller's dict is not the candidate's
    assert candidate.settings.options == {"max_autotune": False} and candidate.settings.grid == (1, 2, 8)
    stored = candidate.config()
    assert type(stored["options"]) is dict and type(stored["grid"]) is list  # what a checkpoint and a worker get
    assert Candidate.stored("mine", {"name": "mine", **stored}) == candidate  # and what comes back from them
    stored["options"]["max_autotune"] = True
    assert candidate.settings.options == {"max_autotune": False}


def foreign_keys() -> List[Tuple[str, str, Any]]:
    """(kind, key, a valid value) for every key some other kind has and this kind lacks."""
    values = {key: value for schema in backend_schema.KINDS.values() for key, value in schema_defaults(schema).items()}
    return [(kind, key, values[key]) for kind in backend_schema.KINDS for key in values
            if key not in backend_schema.keys(kind)]


# A shipped backend file of each kind (a new kind ships one too).
SHIPPED_OF_KIND = {body(p)["kind"]: p.stem for p in reversed(backend_files())}


@pytest.mark.parametrize("kind,key,value", foreign_keys(), ids=lambda v: str(v))
def test_each_kind_refuses_the_other_kinds_keys_in_one_line(compose_cfg, kind: str, key: str, value: Any) -> None:
    name = SHIPPED_OF_KIND[kind]
    literal = "null" if value is None else str(value).lower() if isinstance(value, bool) else str(value)
    override = f"backends.{name}.{key}={literal}"
    with pytest.raises(ConfigCompositionException) as err:  # the shipped file is typed by its kind's schema
        compose_cfg([*TINY, f"backends=[{name}]", override])
    assert f"Key '{key}' not in '{backend_schema.KINDS[kind].__name__}'" in one_line(err.value)
    cfg = compose_cfg([*TINY, f"backends=[{name}]", f"+{override}"])  # forced in: the early checks refuse it
    with pytest.raises(ConfigError) as err:
        check_config(cfg)
    message = str(err.value)
    assert "\n" not in message
    assert message.startswith(f"backend {name!r} (kind {kind}) sets {key!r}, which {kind} backends do not take")


def test_a_user_backend_file_without_the_schema_is_held_to_it_early(compose_cfg, tmp_path: Path) -> None:
    (tmp_path / "backends").mkdir()
    (tmp_path / "backends" / "mine.yaml").write_text(
        "# @package backends.mine\nkind: inductor\ntemplate: freezing\nmax_recorded_batch_size: 64\n")
    cfg = compose_cfg([*TINY, "backends=[mine]", f"hydra.searchpath=[file://{tmp_path}]"])
    with pytest.raises(ConfigError, match=r"^backend 'mine' \(kind inductor\) sets 'max_recorded_batch_size', which "
                                          r"inductor backends do not take \(a setting of graph backends\)"):
        check_config(cfg)
