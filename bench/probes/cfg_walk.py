"""Where the run's config goes (issue 55's walk): the functions of tweakpipe that hold it during a run, and the calls
that climb back up the house's floors to reach one.

A CPU run of the tiny MLP (eager and Inductor, route and validate, tracking to a fresh SQLite store) is traced
(``sys.setprofile``): a *stay* is a function of ``pipeline`` or ``stages`` entered with the run's config, or one of
its sections, among its arguments or locals at entry (``cfg``, ``rcfg``, ``ctx.cfg``, ...), counted once per
function; a *climb* is a call into such a function from a module on a lower floor than its own (the floors of
``[tool.importlinter]``'s layers contract in ``pyproject.toml``: a callback or a hook handed down). Printed per
package, so the recorder's share shows, with the functions that build, decide or save a route (``pipeline.compile``,
``pipeline.route``, ``pipeline.backends``) run with a recorder's frame on the stack. Run from the repository root::

    python bench/probes/cfg_walk.py
"""

from __future__ import annotations

import collections
import sys
import tempfile
import tomllib
from pathlib import Path
from typing import Any, Dict, List, Set, Tuple

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))


def floors() -> List[List[str]]:
    """The layers contract's floors, top first: each a list of module prefixes."""
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]["contracts"]
    layers = next(c["layers"] for c in config if c["type"] == "layers")
    return [[m.strip() for m in layer.replace("|", ":").split(":")] for layer in layers]


def floor_of(module: str, levels: List[List[str]]) -> int:
    """The floor of ``module`` (0: the top), or -1 where no floor names it."""
    for i, layer in enumerate(levels):
        if any(module == m or module.startswith(m + ".") for m in layer):
            return i
    return -1


def nodes_of(cfg: Any) -> Set[int]:
    """The ids of the config and every section in it."""
    from omegaconf import DictConfig, ListConfig

    seen, todo = set(), [cfg]
    while todo:
        node = todo.pop()
        seen.add(id(node))
        if isinstance(node, DictConfig):
            todo += [node._get_node(k) for k in node.keys() if isinstance(node._get_node(k), (DictConfig, ListConfig))]
    return seen


BUILDING = ("pipeline.compile", "pipeline.route", "pipeline.backends")  # what builds, decides and saves a route


def under_recorder(frame: Any) -> bool:
    """Whether a frame of ``pipeline.record`` is on the stack below ``frame``."""
    frame = frame.f_back
    while frame is not None:
        if frame.f_globals.get("__name__", "").startswith("pipeline.record"):
            return True
        frame = frame.f_back
    return False


def walk() -> Tuple[Dict[str, Set[str]], List[Tuple[str, str]], Set[str]]:
    from pipeline.api import compose_config
    from pipeline import runner

    with tempfile.TemporaryDirectory() as tmp:
        cfg = compose_config(["model=tiny_mlp", "profile=quick", "backends=[eager,inductor]", "reference=false",
                              "tracking=sqlite", f"tracking.uri=sqlite:///{tmp}/mlflow.db", "compile_cache.workers=0"])
        ids, levels = nodes_of(cfg), floors()
        stays: Dict[str, Set[str]] = collections.defaultdict(set)
        climbs: List[Tuple[str, str]] = []
        recorder_builds: Set[str] = set()  # functions that build, decide or save a route, run by the recorder

        def holds(frame: Any) -> bool:
            for value in frame.f_locals.values():
                if id(value) in ids or id(getattr(value, "cfg", None)) in ids:
                    return True
            return False

        def profile(frame: Any, event: str, arg: Any) -> None:
            if event != "call":
                return
            module = frame.f_globals.get("__name__", "")
            if module.startswith(BUILDING) and under_recorder(frame):
                recorder_builds.add(f"{module}.{frame.f_code.co_qualname}")
            if not (module.startswith("pipeline") or module.startswith("stages")) or not holds(frame):
                return
            name = f"{module}.{frame.f_code.co_qualname}"
            if name not in stays[module]:
                stays[module].add(name)
                caller = frame.f_back.f_globals.get("__name__", "") if frame.f_back else ""
                if floor_of(caller, levels) > floor_of(module, levels) >= 0:
                    climbs.append((caller, name))

        sys.setprofile(profile)
        try:
            runner.run(cfg, Path(tmp) / "run")
        finally:
            sys.setprofile(None)
    return stays, climbs, recorder_builds


def main() -> None:
    stays, climbs, recorder_builds = walk()
    by_package = collections.Counter()
    for module, names in stays.items():
        by_package[".".join(module.split(".")[:2])] += len(names)
    total = sum(by_package.values())
    print(f"stays: {total} functions hold the run's config; climbs back up: {len(climbs)}")
    for package, n in by_package.most_common():
        print(f"  {package:24s} {n}")
    for caller, callee in climbs:
        print(f"  climb: {caller} -> {callee}")
    packages = collections.Counter(".".join(name.split(".")[:2]) for name in recorder_builds)
    print(f"functions of {', '.join(BUILDING)} the recorder runs: {len(recorder_builds)} "
          f"({', '.join(f'{p} {n}' for p, n in packages.most_common())})")
    for name in sorted(recorder_builds):
        print(f"  under the recorder: {name}")


if __name__ == "__main__":
    main()
