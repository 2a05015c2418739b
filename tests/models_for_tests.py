"""Small real models with known quirks, for tests that need a backend to fail for a real reason."""

import torch
from torch import nn

from pipeline.models import MLP


class GraphBreakMLP(nn.Module):
    """A tiny MLP whose data-dependent Python branch breaks the graph, so ``fullgraph=True`` fails."""

    def __init__(self, width: int = 16) -> None:
        super().__init__()
        self.a = nn.Linear(width, width)
        self.b = nn.Linear(width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.a(x)
        if h.sum().item() > 0:  # .item() in control flow: a graph break
            h = h.relu()
        return self.b(h)


class ThreadCountingMLP(MLP):
    """The MLP, remembering torch's thread count at every call: a test sees the threads eager ran with."""

    seen: list = []

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        ThreadCountingMLP.seen.append(torch.get_num_threads())
        return super().forward(x)


def hf_model(config_class: str, model_class: str, **config_kwargs) -> nn.Module:
    """A transformers model from its config (random weights) returning its own ModelOutput: named tensors."""
    import transformers

    return getattr(transformers, model_class)(getattr(transformers, config_class)(**config_kwargs))
