"""Small real models with known quirks, for tests that need a backend to fail for a real reason."""

import os
from pathlib import Path

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


class BufferedMLP(nn.Module):
    """A tiny MLP with buffers beside its weights (a BatchNorm's running statistics and its counter), so a
    test sees buffers kept as well as weights. ``branch=True`` adds a data-dependent Python branch
    (``.item()`` in an ``if``), which ``torch.export`` refuses: the exported backends cannot be built."""

    def __init__(self, width: int = 16, branch: bool = False) -> None:
        super().__init__()
        self.a, self.norm, self.b = nn.Linear(width, width), nn.BatchNorm1d(width), nn.Linear(width, width)
        self.branch = branch

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.norm(self.a(x))
        if self.branch and h.sum().item() > 0:
            h = h.relu()
        return self.b(h)


def buffered_mlp(seed: int, branch: bool = False) -> BufferedMLP:
    """A :class:`BufferedMLP` in eval mode whose weights and buffers all depend on ``seed``."""
    torch.manual_seed(seed)
    model = BufferedMLP(branch=branch).eval()
    with torch.no_grad():
        model.norm.running_mean.normal_()
        model.norm.running_var.uniform_(0.5, 2.0)
        model.norm.num_batches_tracked.fill_(seed)
    return model


class PrintingMLP(nn.Module):
    """A tiny MLP whose ``forward`` prints: a graph break Dynamo leaves the model's own frame to compile."""

    def __init__(self, width: int = 16) -> None:
        super().__init__()
        self.a = nn.Linear(width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        print("forward")
        return self.a(x)


class InterruptedInCallback(nn.Module):
    """A tiny MLP that sends its own process SIGINT from inside a weakref callback at its ``at``-th call: a
    Ctrl-C landing where Python swallows exceptions ("Exception ignored in ...")."""

    calls = 0

    def __init__(self, at: int = 30) -> None:
        super().__init__()
        self.lin, self.at = nn.Linear(16, 16), at

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        InterruptedInCallback.calls += 1
        if InterruptedInCallback.calls == self.at:
            import os
            import signal
            import weakref

            class Doomed:
                pass

            def callback(ref: weakref.ref) -> None:
                os.kill(os.getpid(), signal.SIGINT)
                for _ in range(100_000):  # the handler runs here, inside the callback
                    pass

            doomed = Doomed()
            ref = weakref.ref(doomed, callback)  # noqa: F841 -- kept alive until the callback has run
            del doomed
        return self.lin(x)


class WritesIntoItsInput(nn.Module):
    """A tiny MLP whose ``forward`` adds to its input in place."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(16, 16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x.add_(1.0)
        return self.lin(x)


class CountsItsCalls(nn.Module):
    """A tiny MLP whose output grows with the number of times it was called (a buffer counts them)."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(16, 16)
        self.register_buffer("calls", torch.zeros(()))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        return self.lin(x) * self.calls


class ResidualBlock(nn.Module):
    """Linear-ReLU-Linear with a skip: the block :class:`StackedBlocks` repeats."""

    def __init__(self, width: int) -> None:
        super().__init__()
        self.a, self.b = nn.Linear(width, width), nn.Linear(width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.b(torch.relu(self.a(x)))


class StackedBlocks(nn.Module):
    """A stem, ``depth`` identical residual blocks and a head: a model of repeated blocks, as transformers are, at
    the size of a test (input (batch, 16))."""

    def __init__(self, width: int = 16, depth: int = 4) -> None:
        super().__init__()
        self.stem, self.head = nn.Linear(16, width), nn.Linear(width, 4)
        self.blocks = nn.ModuleList(ResidualBlock(width) for _ in range(depth))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.stem(x)
        for block in self.blocks:
            h = block(h)
        return self.head(h)


class SlowAtReducedPrecision(nn.Module):
    """A tiny MLP that does many times its work whenever it computes in a reduced precision (autocast, or cast
    weights), leaving its outputs unchanged: a model whose bf16 candidates are slower than fp32 by construction."""

    def __init__(self, width: int = 16, extra: int = 200) -> None:
        super().__init__()
        self.a, self.b, self.extra = nn.Linear(width, width), nn.Linear(width, width), extra

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.relu(self.a(x))
        if h.dtype != torch.float32:
            for _ in range(self.extra):
                h = h + 0 * torch.tanh(h)
        return self.b(h)


def compile_workers_of(pid: int) -> list:
    """The compile worker processes (``pipeline.compile.worker``) started by process ``pid``."""
    found = []
    for entry in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            argv = entry.read_bytes().split(b"\0")
        except OSError:
            continue
        if any(b"'pipeline.compile.worker'" in arg for arg in argv) and argv[-2:-1] == [str(pid).encode()]:
            found.append(int(entry.parent.name))
    return found


class CrowdedByWorkers(nn.Module):
    """A tiny MLP that, in the process that made it, runs out of device memory while that process has compile
    workers: what a run's candidates met on the H200 while a worker recorded DistilBERT's graphs (67 GiB). Traced
    by Dynamo it is the plain MLP (the check is Python the compiled program does not hold)."""

    def __init__(self, width: int = 16) -> None:
        super().__init__()
        self.a, self.b, self.owner = nn.Linear(width, width), nn.Linear(width, width), os.getpid()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not torch.compiler.is_compiling() and os.getpid() == self.owner and compile_workers_of(self.owner):
            raise torch.OutOfMemoryError("CUDA out of memory (a compile worker holds the device's memory)")
        return self.b(torch.relu(self.a(x)))
