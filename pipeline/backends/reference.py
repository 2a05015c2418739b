"""The reference peer: what the user would write by hand instead of tuning, timed beside the candidates.

The router's promise is that each batch size goes to the fastest thing on offer; the honest check of that
promise is the copy a user compiles themselves: ``torch.compile(model, mode="reduce-overhead")`` on a GPU
(Inductor's kernels replayed as CUDA graphs), ``torch.compile(model)`` elsewhere, at every precision the run
tunes. It competes as a regular candidate (it serves where it wins), is kept through the screen so every
tuned cell has its number, and the route stage reports auto against it (``pipeline.route.versus``). Where a
backend of the run already is that compile (``inductor`` on a CPU), that backend plays the reference and
nothing is built twice. ``reference=false`` leaves it out.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Dict, Mapping, Tuple

from pipeline.config import backend_schema
from pipeline.errors import ConfigError

NAME = "reference"


def mode_for(device_type: str) -> str:
    """reduce-overhead where torch.compile records CUDA graphs (CUDA only), default elsewhere."""
    return "reduce-overhead" if device_type == "cuda" else "default"


def peer_config(device_type: str) -> Dict[str, Any]:
    """The reference's backend config on ``device_type``."""
    mode = mode_for(device_type)
    return {"kind": "inductor", "mode": mode,
            "description": f'reference: torch.compile(model, mode="{mode}"), as a user writes it by hand'}


def same_program(name: str, cfg: Mapping[str, Any], peer: Mapping[str, Any]) -> bool:
    """Whether backend ``name`` (``cfg``) compiles exactly what the reference would: its kind's settings equal,
    description aside."""
    if cfg.get("kind") != peer["kind"]:
        return False
    mine, theirs = backend_schema.settings(name, cfg), backend_schema.settings(NAME, peer)
    return dataclasses.replace(mine, description="") == dataclasses.replace(theirs, description="")


def with_reference(backends: Mapping[str, Mapping[str, Any]], device_type: str) -> Tuple[Dict[str, Any], str]:
    """The run's backends with the reference among them, and the name of the backend that plays it: one of the
    run's own where it compiles the same program, else the added ``reference`` (last, in config order)."""
    peer = peer_config(device_type)
    out = {str(n): dict(cfg) for n, cfg in backends.items()}
    same = next((n for n, cfg in out.items() if same_program(n, cfg, peer)), None)
    if same is not None:
        return out, same
    if NAME in out:
        raise ConfigError(f"a backend is named {NAME!r}, the name of the reference peer (torch.compile as a user "
                         f"writes it); rename it, or set reference=false")
    out[NAME] = peer
    return out, NAME
