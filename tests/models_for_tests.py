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


class CellGRU(nn.Module):
    """A sequence-first GRU stepped cell by cell: input (time, batch, 5); outputs every step's projection
    (time, batch, 3) and the last hidden state (1, batch, 6). Dynamo compiles it whole, where it leaves an
    ``nn.GRU`` to eager (``torch._dynamo.config.allow_rnn`` is off)."""

    def __init__(self) -> None:
        super().__init__()
        self.cell, self.head = nn.GRUCell(5, 6), nn.Linear(6, 3)

    def forward(self, x: torch.Tensor):
        h, steps = x.new_zeros(x.shape[1], 6), []
        for step in x:
            h = self.cell(step, h)
            steps.append(h)
        return self.head(torch.stack(steps)), h.unsqueeze(0)


def sequence_first(batch: int, steps: int = 3) -> torch.Tensor:
    """(time, batch, 5) inputs for :class:`CellGRU` and ``nn.GRU(5, ...)``, the same for the same batch size."""
    return torch.randn(steps, batch, 5, generator=torch.Generator().manual_seed(batch))

