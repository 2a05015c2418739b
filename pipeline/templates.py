"""Named Inductor templates, found on Hydra's config search path, and the listing command.

A template is ``inductor_template/<name>.yaml`` holding ``description`` and ``options`` (a group
of ``torch._inductor.config`` options). It is looked up on the same search path Hydra composes
from, so a file in a user's ``--config-dir`` or ``hydra.searchpath`` directory is found, and one
there shadows a shipped template of the same name.

``python -m pipeline.templates [--config-dir DIR]`` lists backends, backend sets and templates,
one line each. It needs neither torch nor a GPU.
"""

from __future__ import annotations

from pipeline.config import SHIPPED_CONF
import argparse
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence

from hydra._internal.config_repository import ConfigRepository
from hydra._internal.config_search_path_impl import ConfigSearchPathImpl
from hydra.core.hydra_config import HydraConfig
from hydra.core.object_type import ObjectType
from hydra.core.plugins import Plugins
from omegaconf import DictConfig, OmegaConf

GROUP = "inductor_template"
BACKENDS = "backends"
SHIPPED = "file://" + str(SHIPPED_CONF)
TEMPLATE_KEYS = {"description", "options"}


@dataclass(frozen=True)
class Template:
    """One named option set and where it was found."""

    name: str
    description: str
    options: Dict[str, Any]
    source: str


def search_path() -> List[str]:
    """Config sources in Hydra's order: inside a Hydra app, the job's own (its config dir,
    ``--config-dir``, ``hydra.searchpath``); the shipped ``conf/`` always comes last."""
    sources: List[str] = []
    if HydraConfig.initialized():
        for src in HydraConfig.get().runtime.config_sources:
            if src.schema in ("file", "pkg"):
                sources.append(f"{src.schema}://{src.path}")
    return list(dict.fromkeys(sources + [SHIPPED]))


def _as_url(entry: str) -> str:
    return entry if "://" in entry else "file://" + str(Path(entry).resolve())


def repository(paths: Optional[Sequence[str]] = None) -> ConfigRepository:
    """Hydra's config repository over ``paths`` (directories or ``file://``/``pkg://`` URLs), first wins."""
    Plugins.instance()  # registers Hydra's config sources (file://, pkg://)
    csp = ConfigSearchPathImpl()
    for i, entry in enumerate(search_path() if paths is None else paths):
        csp.append(provider=f"tweakpipe-{i}", path=_as_url(entry))
    return ConfigRepository(csp)


def names(paths: Optional[Sequence[str]] = None) -> List[str]:
    """Every template name on the search path."""
    return sorted(repository(paths).get_group_options(GROUP, ObjectType.CONFIG))


def load(name: str, paths: Optional[Sequence[str]] = None) -> Template:
    """The template ``name`` from the first search-path entry that has it; a clear error otherwise."""
    repo = repository(paths)
    found = repo.load_config(f"{GROUP}/{name}")
    if found is None:
        available = sorted(repo.get_group_options(GROUP, ObjectType.CONFIG))
        where = [s.path for s in repo.get_sources()]
        raise ValueError(
            f"Inductor template {name!r} not found: no {GROUP}/{name}.yaml on the config search path {where}. "
            f"Available: {available}. Add the file to conf/{GROUP}/ or to a directory passed with "
            f"--config-dir / hydra.searchpath"
        )
    body = found.config
    source = f"{found.path}/{GROUP}/{name}.yaml"
    extra = set(body) - TEMPLATE_KEYS if isinstance(body, DictConfig) else set()
    options = body.get("options") if isinstance(body, DictConfig) else None
    if extra or not isinstance(options, DictConfig) or not options:
        raise ValueError(
            f"Inductor template {name!r} ({source}) must hold 'description: one line' and a non-empty "
            f"'options:' mapping of torch._inductor.config names, and nothing else"
            + (f"; unexpected keys {sorted(extra)}" if extra else "")
        )
    return Template(name=name, description=str(body.get("description", "")),
                    options=OmegaConf.to_container(options, resolve=True), source=source)


def _setting(cfg: DictConfig) -> str:
    for key in ("template", "mode", "options"):
        value = cfg.get(key)
        if value not in (None, "", {}):
            return f"{key}={OmegaConf.to_container(value) if key == 'options' else value}"
    return ""


def listing(paths: Optional[Sequence[str]] = None) -> str:
    """Backends, backend sets and templates on the search path, one line each."""
    repo = repository(paths)
    backends, sets = [], []
    for name in sorted(repo.get_group_options(BACKENDS, ObjectType.CONFIG)):
        found = repo.load_config(f"{BACKENDS}/{name}")
        cfg = found.config if found is not None else OmegaConf.create()
        if "kind" in cfg:
            backends.append(f"  {name:38s} {cfg.kind:9s} {_setting(cfg):34s} {cfg.get('description', '')}")
        else:
            members = ", ".join(getattr(d, "path", "?") for d in found.defaults_list or [])
            sets.append(f"  {name:38s} {members}")
    templates = []
    for name in sorted(repo.get_group_options(GROUP, ObjectType.CONFIG)):
        try:
            t = load(name, paths)
            templates.append(f"  {name:20s} {t.description}  [{', '.join(t.options)}]")
        except ValueError as exc:
            templates.append(f"  {name:20s} INVALID: {exc}")
    return "\n".join([
        "Backends (pick with 'backends=[eager,inductor_freezing]'):", *backends, "",
        "Backend sets (pick with 'backends=NAME'):", *sets, "",
        f"Inductor templates (use with 'template: NAME' in a backend, files {GROUP}/NAME.yaml):", *templates,
    ])


def main(argv: Optional[Sequence[str]] = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m pipeline.templates", description=__doc__.split("\n")[0])
    parser.add_argument("--config-dir", action="append", default=[],
                        help="a user config directory searched before the shipped conf/ (repeatable)")
    args = parser.parse_args(argv)
    print(listing([*args.config_dir, SHIPPED]))


if __name__ == "__main__":
    main()
