"""Models named by their library, built with random weights (nothing downloads): ``model=hf`` for any
transformers model class, ``model=timm`` for any timm model. Each library is an optional extra;
its inputs are derived from the model itself (``pipeline.inputs``)."""

from __future__ import annotations

import difflib
import importlib
from types import ModuleType
from typing import Iterable

from pipeline.errors import ConfigError


def require(module: str, extra: str, who: str) -> ModuleType:
    """The library ``who`` needs, or a one-line error naming the extra that installs it."""
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        raise ConfigError(f"{who} needs the {module} package, which is not installed ({exc}); "
                          f"install it with pip install -e '.[{extra}]'") from None


def close_to(name: str, names: Iterable[str]) -> str:
    """``; close: a, b`` for the names most like ``name``, or '' where none is."""
    close = difflib.get_close_matches(name, list(names), n=4, cutoff=0.6)
    return f"; close: {', '.join(close)}" if close else ""
