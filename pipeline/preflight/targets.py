"""The model's ``_target_`` imported before the run makes anything, so that bringing your own model
(``model.build._target_=my_pkg.MyModel``) fails in one line naming what could not be imported and how to make
it importable, instead of Hydra's traceback from the first build after the run directory and the MLflow run
exist.

Importing the target is what building the model would do first; a module that imports fine but lacks the name
gets the closest names it has. Where the import fails and torchvision does not work with the installed torch
(``pipeline.preflight.versions``), that is what the line names: the user's module is rarely the culprit then.
"""

from __future__ import annotations

import difflib
import importlib
from types import ModuleType
from typing import Any, Optional, Tuple

from pipeline.config.errors import one_line
from pipeline.config.resolvers import TARGET_KEY as KEY
from pipeline.preflight import versions

INSTALL = ("put the folder that holds it on the path (PYTHONPATH=/path/to/folder python -m pipeline ...) or "
           "install your package (pip install -e /path/to/your/project)")


def imported(module: str) -> Tuple[Optional[ModuleType], Optional[str]]:
    """``module`` imported, or None and why not. A module that is not there at all gives ``(None, None)``;
    one that is there but fails (a missing dependency, an error in it) gives its error in one line."""
    try:
        return importlib.import_module(module), None
    except ModuleNotFoundError as exc:
        if exc.name is not None and (module == exc.name or module.startswith(f"{exc.name}.")):
            return None, None  # the module itself (or a package above it) is not on the path
        return None, f"importing {module} failed: {type(exc).__name__}: {one_line(exc)}"
    except Exception as exc:  # noqa: BLE001 -- whatever the user's module raised while importing
        return None, f"importing {module} failed: {type(exc).__name__}: {one_line(exc)[:300]}"


def attribute_problem(owner: Any, owner_name: str, name: str) -> str:
    close = difflib.get_close_matches(name, [n for n in dir(owner) if not n.startswith("_")], n=3)
    hint = f"; closest: {', '.join(f'{owner_name}.{c}' for c in close)}" if close else ""
    return f"{owner_name} has no {name!r}{hint}"


def target_problem(target: str, key: str = KEY) -> Optional[str]:
    """Why ``target`` (a dotted path: ``package.module.Class``) cannot be located as Hydra locates it, in one line
    naming the fix, or None."""
    parts = target.split(".")
    if not target or not all(parts):
        return f"{key}={target!r} is not a dotted path; e.g. {key}=my_pkg.MyModel"
    obj, error = imported(parts[0])
    if obj is None:
        found = f"no module {parts[0]!r} can be imported from here" if error is None else error
        return f"{key}={target}: {found}; {INSTALL}"
    for i, part in enumerate(parts[1:], start=1):
        owner_name = ".".join(parts[:i])
        if hasattr(obj, part):
            obj = getattr(obj, part)
            continue
        if not isinstance(obj, ModuleType):
            return f"{key}={target}: {attribute_problem(obj, owner_name, part)}"
        sub, error = imported(f"{owner_name}.{part}")
        if sub is None:
            return f"{key}={target}: {error or attribute_problem(obj, owner_name, part)}"
        obj = sub
    if not callable(obj):
        return f"{key}={target} is a {type(obj).__name__}, not a class or function that builds the model"
    return None


def model_problem(target: str) -> Optional[str]:
    """:func:`target_problem`, except that a torchvision that does not work with this torch is named instead, where
    the import fails or the target is torchvision's own."""
    problem = target_problem(target)
    if problem or target.split(".")[0] == "torchvision":
        return versions.torchvision_problem() or problem
    return None

