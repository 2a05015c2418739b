"""Small real models with known quirks, for tests that need a backend to fail for a real reason."""

import torch
from torch import nn


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
