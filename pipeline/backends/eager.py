"""Plain eager PyTorch: the reference, and the baseline the routed model must never lose to."""

from __future__ import annotations

from typing import Dict

import torch
from torch import nn

from pipeline.backends.base import Backend


class EagerBackend(Backend):
    kind = "eager"

    def _build(self, model: nn.Module, sample: Dict[str, torch.Tensor], batch_sizes: list) -> None:
        self._fn = model
