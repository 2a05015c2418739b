"""Clearer words for Hydra's own errors, and the command-line tools' way out (:func:`fail`).

The user's mistakes are :class:`pipeline.errors.ConfigError`, raised by every config check
(``pipeline.preflight.checks``); ``python -m pipeline`` prints its one-line message and exits 2.

Hydra lists the available options when a single group choice is unknown (``model=resnet1800``),
but not for a list choice (``backends=[eager,indcutor]``). This names the unknown entries and
lists what exists, from the same config directories Hydra searched. A misspelt key
(``profile.budget_m=5``) gets the closest keys its section has, not Hydra's hint to add it with ``+``; a new key of a
section that takes any (``model.build.hidden=32``: your model's arguments) gets that hint.
"""

from __future__ import annotations

from pipeline.config import SHIPPED_CONF
import dataclasses
import difflib
import re
import sys
from pathlib import Path
from typing import Iterable, List, NoReturn, Optional, Sequence

from omegaconf import OmegaConf

from pipeline.redact import redacted

DEFAULT_CONF = SHIPPED_CONF
_CHOICE = re.compile(r"^[+~]*(?P<group>[\w/]+)=\[?(?P<values>[^\]=]*)\]?$")
# Lines of Hydra's and OmegaConf's reports that locate rather than explain.
_LOCATING = ("full_key:", "reference_type=", "object_type=", "provider=")


def fail(message: str, code: int = 2) -> NoReturn:
    """One line on stderr and an exit code: 2 for a user's mistake (the command-line tools' way out). A URL's
    password in it (an override the line quotes) is shown as ``***``, as in every record (``pipeline.redact``)."""
    print(f"error: {redacted(message)}", file=sys.stderr)
    raise SystemExit(code)


def one_line(exc: BaseException) -> str:
    """Hydra's multi-line composition error, and the OmegaConf error behind it, as one line."""
    text = f"{exc}\n{exc.__cause__ or ''}".split("Config search path:")[0]
    lines = [line.strip() for line in text.splitlines()]
    kept = [line for line in dict.fromkeys(lines) if line and not line.startswith(_LOCATING)]
    return "; ".join(kept).replace(":; ", ": ")


def group_options(group: str, config_dirs: Iterable[Path]) -> List[str]:
    """Config names available in ``group`` across ``config_dirs``."""
    names = {p.stem for d in config_dirs for p in (Path(d) / group).glob("*.yaml")}
    return sorted(names)


def config_dirs_from_argv(argv: Sequence[str]) -> List[Path]:
    """The shipped conf dir plus any ``--config-dir``/``-cd`` a user passed."""
    dirs = [DEFAULT_CONF]
    for i, arg in enumerate(argv):
        if arg in ("--config-dir", "-cd") and i + 1 < len(argv):
            dirs.append(Path(argv[i + 1]))
        elif arg.startswith("--config-dir="):
            dirs.append(Path(arg.split("=", 1)[1]))
    return dirs


def explain_unknown_choices(overrides: Sequence[str], config_dirs: Iterable[Path]) -> Optional[str]:
    """A message naming every chosen option that no config dir holds, or None if all exist."""
    dirs = list(config_dirs)
    problems = []
    for override in overrides:
        match = _CHOICE.match(override.strip())
        # hydra/* groups also hold configs that installed plugins ship (hydra/launcher=joblib): not ours to judge.
        if not match or match["group"].startswith("hydra/") or not (Path(dirs[0]) / match["group"]).is_dir():
            continue
        available = group_options(match["group"], dirs)
        values = [v.strip() for v in match["values"].split(",") if v.strip() and v.strip() != "null"]
        unknown = [v for v in values if v not in available]
        if unknown:
            problems.append(f"unknown {match['group']} {', '.join(map(repr, unknown))}; "
                            f"available: {', '.join(available)}")
    return "\n".join(problems) or None


def unknown_key(full_key: str, valid: Iterable[str]) -> str:
    """``unknown key a.b_c; closest: a.b_cd`` (or every key of the section where none is close), one line."""
    section, _, key = full_key.rpartition(".")
    valid = [k for k in valid if k != "hydra" or section]
    close = difflib.get_close_matches(key, valid, n=3, cutoff=0.6)
    where = f"{section}." if section else ""
    hint = (f"closest: {', '.join(where + k for k in close)}" if close else
            f"{section or 'the top level'} has {', '.join(valid)}")
    return f"unknown key {full_key}; {hint}"


def explain_unknown_key(exc: BaseException) -> Optional[str]:
    """:func:`unknown_key` for Hydra's "Could not override" of a key its schema lacks, else None."""
    cause = exc.__cause__
    node, key = getattr(cause, "parent_node", None), getattr(cause, "key", None)
    full_key = getattr(cause, "full_key", None)
    if not full_key or not isinstance(key, str) or not hasattr(node, "keys") or key in node:
        return None
    from pipeline.config.schema import Config

    fields, section = {f.name: f for f in dataclasses.fields(Config)}, str(full_key).rpartition(".")[0]
    if section in fields and fields[section].default is not dataclasses.MISSING:  # below a plain value
        close = difflib.get_close_matches(str(full_key).replace(".", "_"), list(fields), n=1, cutoff=0.8)
        hint = f"; closest: {close[0]}" if close else ""  # perhaps a top-level key of both words (reference_modes)
        return f"unknown key {full_key}; {section} is a value, not a section{hint}"
    if not dataclasses.is_dataclass(OmegaConf.get_type(node)):  # a section that takes any key: a + adds one
        return f"{full_key} is not in {section} yet; add it with a +: +{full_key}=..."
    return unknown_key(str(full_key), [str(k) for k in node.keys()])


def composition_problem(exc: BaseException, overrides: Sequence[str], config_dirs: Iterable[Path]) -> str:
    """Hydra's failure to compose ``overrides`` (a command line, or one sweep job's) in one line: the unknown
    choices with what ``config_dirs`` hold, else the closest keys to a misspelt one, else Hydra's own words."""
    return explain_unknown_choices(overrides, config_dirs) or explain_unknown_key(exc) or one_line(exc)
