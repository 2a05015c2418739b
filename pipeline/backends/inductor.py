"""torch.compile with Inductor, set up by exactly one of mode, options or a named template."""

from __future__ import annotations

from typing import Any, Dict, Mapping, Optional

import torch
from torch import nn

from pipeline.backends.base import Backend

MODES = ("default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")
# Modes that record CUDA graphs: they need a CUDA device.
GRAPH_MODES = ("reduce-overhead", "max-autotune")


def exclusive_setting(name: str, cfg: Mapping[str, Any]) -> Optional[str]:
    """Which of mode / options / template is set; two or more is an error naming them."""
    given = [key for key in ("mode", "options", "template") if cfg.get(key) not in (None, {}, "")]
    if len(given) > 1:
        raise ValueError(
            f"backend {name!r} sets {' and '.join(given)}; they are mutually exclusive. "
            f"Keep one: mode for a preset, options for a dict of Inductor options, template for a named option set"
        )
    return given[0] if given else None


class InductorBackend(Backend):
    kind = "inductor"

    @classmethod
    def check_config(cls, name: str, cfg: Mapping[str, Any]) -> None:
        super().check_config(name, cfg)
        exclusive_setting(name, cfg)
        mode = cfg.get("mode")
        if mode is not None and mode not in MODES:
            raise ValueError(f"backend {name!r}: unknown Inductor mode {mode!r}; use one of {list(MODES)}")

    def unsupported_reason(self, device: torch.device) -> Optional[str]:
        if self.cfg.get("mode") in GRAPH_MODES and device.type != "cuda":
            return f"mode={self.cfg['mode']} records CUDA graphs and needs a CUDA device, not {device.type}"
        return None

    def compile_kwargs(self) -> Dict[str, Any]:
        """Arguments for torch.compile; options go per compile, never into global Inductor config."""
        kwargs: Dict[str, Any] = {"backend": "inductor", "fullgraph": bool(self.cfg.get("fullgraph")),
                                  "dynamic": self.cfg.get("dynamic")}
        if self.cfg.get("options"):
            kwargs["options"] = dict(self.cfg["options"])
        elif self.cfg.get("mode"):
            kwargs["mode"] = self.cfg["mode"]
        return kwargs

    def _build(self, model: nn.Module, sample: Dict[str, torch.Tensor], batch_sizes: list) -> None:
        self._fn = torch.compile(model, **self.compile_kwargs())
        with self.autocast():
            self._fn(**sample)  # compile now, so build_seconds holds the compile time
