"""The model's ``_target_`` imported before the run makes anything, so that bringing your own model
(``model.build._target_=my_pkg.MyModel``) fails in one line naming what could not be imported and how to make
it importable, instead of Hydra's traceback from the first build after the run directory and the MLflow run
exist.

Importing the target is what building the model would do first; a module that imports fine but lacks the name
gets the closest names it has. Its arguments (``model.build``'s other keys) are bound to its signature, so that a
misspelt, left-over or missing one is named with the parameters it takes, not raised from inside the build. Where
the import fails and torchvision does not work with the installed torch (``pipeline.preflight.versions``), that is
what the line names: the user's module is rarely the culprit then.
"""

from __future__ import annotations

import difflib
import importlib
import inspect
from types import ModuleType
from typing import Any, Mapping, Optional, Tuple

from pipeline.config.errors import one_line
from pipeline.config.own_model import TARGET_KEY as KEY
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


def located(target: str, key: str = KEY) -> Tuple[Any, Optional[str]]:
    """``target`` (a dotted path: ``package.module.Class``) located as Hydra locates it, or None and why not, in one
    line naming the fix."""
    parts = target.split(".")
    if not target or not all(parts):
        return None, f"{key}={target!r} is not a dotted path; e.g. {key}=my_pkg.MyModel"
    obj, error = imported(parts[0])
    if obj is None:
        found = f"no module {parts[0]!r} can be imported from here" if error is None else error
        return None, f"{key}={target}: {found}; {INSTALL}"
    for i, part in enumerate(parts[1:], start=1):
        owner_name = ".".join(parts[:i])
        if hasattr(obj, part):
            obj = getattr(obj, part)
            continue
        if not isinstance(obj, ModuleType):
            return None, f"{key}={target}: {attribute_problem(obj, owner_name, part)}"
        sub, error = imported(f"{owner_name}.{part}")
        if sub is None:
            return None, f"{key}={target}: {error or attribute_problem(obj, owner_name, part)}"
        obj = sub
    if not callable(obj):
        return None, f"{key}={target} is a {type(obj).__name__}, not a class or function that builds the model"
    return obj, None


def target_problem(target: str, key: str = KEY) -> Optional[str]:
    """Why ``target`` cannot be located (:func:`located`), or None."""
    return located(target, key)[1]


def arguments_problem(builder: Any, build: Mapping[str, Any]) -> Optional[str]:
    """Why ``model.build``'s arguments do not fit the signature of ``builder`` (its ``_target_``), in one line naming
    the parameters it takes, or None (also where it has no signature to read: its build will say). Hydra's own keys
    (``_target_``, ``_args_``, ``_partial_``, ...) are not arguments."""
    try:
        signature = inspect.signature(builder)
    except (TypeError, ValueError):
        return None
    kwargs = {k: v for k, v in build.items() if not (k.startswith("_") and k.endswith("_"))}
    bind = signature.bind_partial if build.get("_partial_") else signature.bind
    try:
        bind(*build.get("_args_", ()), **kwargs)
    except TypeError as exc:
        named = [p.name for p in signature.parameters.values() if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]
        takes = f"it takes {', '.join(named)}" if named else "it takes no named arguments"
        given = ", ".join(kwargs) or "none"
        return (f"model.build does not fit {build['_target_']}: {exc} (arguments given: {given}; {takes}); give its "
                f"arguments with +model.build.NAME=VALUE and drop others with ~model.build.NAME")
    return None


def model_problem(build: Mapping[str, Any]) -> Optional[str]:
    """Why ``model.build`` cannot build the model: its ``_target_`` cannot be located (:func:`located`) or its
    arguments do not fit it (:func:`arguments_problem`); a torchvision that does not work with this torch is named
    instead, where the import fails or the target is torchvision's own."""
    target = str(build.get("_target_", ""))
    builder, problem = located(target)
    if problem or target.split(".")[0] == "torchvision":
        problem = versions.torchvision_problem() or problem
    return problem or arguments_problem(builder, build)
