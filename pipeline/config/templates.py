"""Named Inductor templates, found on Hydra's config search path, and the listing command.

A template is ``inductor_template/<name>.yaml`` holding ``description`` and ``options`` (a group
of ``torch._inductor.config`` options). It is looked up on the same search path Hydra composes
from, so a file in a user's ``--config-dir`` or ``hydra.searchpath`` directory is found, and one
there shadows a shipped template of the same name. Each search-path entry is read through Hydra's
public config-source plugins (``hydra.plugins.config_source``, found by ``Plugins.discover``):
composing would need Hydra's global state, which a running app already holds, and would not say
which file a template came from.

``tweakpipe templates [--config-dir DIR]`` (:func:`main`) lists backends, backend sets and templates,
one line each. It needs neither torch nor a GPU.
"""

from __future__ import annotations

from pipeline.config import SHIPPED_CONF
import argparse
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence

from hydra.core.hydra_config import HydraConfig
from hydra.core.object_type import ObjectType
from hydra.core.plugins import Plugins
from hydra.plugins.config_source import ConfigResult, ConfigSource
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


class Sources:
    """Config sources in search-path order (directories or ``file://``/``pkg://`` URLs); the first that
    has a config wins, as in Hydra's own composition."""

    def __init__(self, paths: Optional[Sequence[str]] = None) -> None:
        kinds = {cls.scheme(): cls for cls in Plugins.instance().discover(ConfigSource)}
        urls = [_as_url(entry) for entry in (search_path() if paths is None else paths)]
        self.sources: List[ConfigSource] = [kinds[url.split("://", 1)[0]](provider="tweakpipe", path=url)
                                            for url in urls]

    def options(self, group: str) -> List[str]:
        """Every config name in ``group`` on the search path."""
        return sorted({name for src in self.sources if src.available() and src.is_group(group)
                       for name in src.list(group, ObjectType.CONFIG)})

    def load(self, group: str, name: str) -> Optional[ConfigResult]:
        """The config ``group/name`` from the first source that has it, or None."""
        for src in self.sources:
            if src.available() and src.is_config(f"{group}/{name}"):
                return src.load_config(f"{group}/{name}")
        return None

    def where(self) -> List[str]:
        return [src.path for src in self.sources]


def names(paths: Optional[Sequence[str]] = None) -> List[str]:
    """Every template name on the search path."""
    return Sources(paths).options(GROUP)


def load(name: str, paths: Optional[Sequence[str]] = None) -> Template:
    """The template ``name`` from the first search-path entry that has it; a clear error otherwise."""
    sources = Sources(paths)
    found = sources.load(GROUP, name)
    if found is None:
        raise ValueError(
            f"Inductor template {name!r} not found: no {GROUP}/{name}.yaml on the config search path "
            f"{sources.where()}. Available: {sources.options(GROUP)}. Add the file to conf/{GROUP}/ or to a "
            f"directory passed with --config-dir / hydra.searchpath"
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
    sources = Sources(paths)
    backends, sets = [], []
    for name in sources.options(BACKENDS):
        found = sources.load(BACKENDS, name)
        cfg = found.config if found is not None else OmegaConf.create()
        if "kind" in cfg:
            backends.append(f"  {name:38s} {cfg.kind:11s} {_setting(cfg):32s} {cfg.get('description', '')}")
        else:
            sets.append(f"  {name:38s} {', '.join(map(str, cfg.get('defaults', [])))}")
    templates = []
    for name in sources.options(GROUP):
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


def main(argv: Optional[Sequence[str]] = None, prog: str = "tweakpipe templates") -> None:
    parser = argparse.ArgumentParser(prog=prog, description=__doc__.split("\n")[0])
    parser.add_argument("--config-dir", action="append", default=[],
                        help="a user config directory searched before the shipped conf/ (repeatable)")
    args = parser.parse_args(argv)
    print(listing([*args.config_dir, SHIPPED]))

