"""Interpolations the config tree uses for run directories that no two runs share.

``${tweakpipe.pid:}`` is this process's id: two runs started in the same second (the timestamp's
resolution) are two processes, so their directories differ. ``${tweakpipe.resume_or:A,B}`` is
``A`` when set (``resume=<run dir>`` continues in that directory), else ``B``.
"""

from __future__ import annotations

import os
from typing import Any

from omegaconf import OmegaConf


def resume_or(resume: Any, fresh: Any) -> Any:
    return resume or fresh


def register_resolvers() -> None:
    """Register the resolvers once per process (Hydra composes with them before any run starts)."""
    if not OmegaConf.has_resolver("tweakpipe.pid"):
        OmegaConf.register_new_resolver("tweakpipe.pid", os.getpid, use_cache=True)
    if not OmegaConf.has_resolver("tweakpipe.resume_or"):
        OmegaConf.register_new_resolver("tweakpipe.resume_or", resume_or)
