"""Models the config tree can name, built with random weights (nothing downloads), and sample inputs."""

from __future__ import annotations

from typing import Any, Dict, Mapping, Sequence

import torch
from torch import nn

DTYPES: Dict[str, torch.dtype] = {
    "float32": torch.float32,
    "float16": torch.float16,
    "bfloat16": torch.bfloat16,
    "float64": torch.float64,
    "int64": torch.int64,
    "int32": torch.int32,
    "bool": torch.bool,
}
# How sample inputs are drawn: normal floats, integers in [0, high), all ones, or padding masks.
FILLS = ("randn", "randint", "ones", "mask")


def dtype_of(name: str) -> torch.dtype:
    """Map a config dtype name to torch, with an error listing the names we know."""
    try:
        return DTYPES[name]
    except KeyError:
        raise ValueError(f"unknown dtype {name!r}; use one of {sorted(DTYPES)}") from None


class MLP(nn.Module):
    """``depth`` blocks of Linear(width, width) + ReLU: the launch-bound default model."""

    def __init__(self, width: int = 256, depth: int = 24) -> None:
        super().__init__()
        self.layers = nn.Sequential(*[m for _ in range(depth) for m in (nn.Linear(width, width), nn.ReLU())])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.layers(x)


class HFLogits(nn.Module):
    """A transformers model built from its config (random weights) that returns plain logits."""

    def __init__(self, config_class: str, model_class: str, **config_kwargs: Any) -> None:
        super().__init__()
        import transformers

        config = getattr(transformers, config_class)(**config_kwargs)
        self.inner = getattr(transformers, model_class)(config)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        return self.inner(input_ids=input_ids, attention_mask=attention_mask).logits


def vision_transformer(arch: str = "vit_b_16", **kwargs: Any) -> nn.Module:
    """A torchvision ViT with random weights. torchvision zero-initialises the classification head,
    which makes every output 0 and every backend indistinguishable from eager, so the head is drawn
    at random (normal, std 0.02, as the encoder's linear layers are)."""
    import torchvision

    model = getattr(torchvision.models, arch)(weights=None, **kwargs)
    nn.init.normal_(model.heads.head.weight, std=0.02)
    return model


def padding_mask(shape: Sequence[int], gen: torch.Generator) -> torch.Tensor:
    """Ones then zeros along the last dimension, as a tokenizer pads a batch: each sample keeps a
    random length of at least half of it."""
    n = shape[-1]
    keep = torch.randint((n + 1) // 2, n + 1, tuple(shape[:-1]), generator=gen)
    return torch.arange(n) < keep.unsqueeze(-1)


def make_inputs(inputs: Mapping[str, Any], batch_size: int, device: torch.device, seed: int = 0) -> Dict[str, torch.Tensor]:
    """Sample inputs for one batch size, deterministic in ``seed`` so every backend sees the same data.
    Each input's batch lies in its ``batch_dim`` (the first by default)."""
    if batch_size < 1:
        raise ValueError(f"batch size must be at least 1, got {batch_size}")
    gen = torch.Generator().manual_seed(seed * 100_003 + batch_size)
    out: Dict[str, torch.Tensor] = {}
    for name, spec in inputs.items():
        shape = (batch_size, *spec["shape"])
        dtype = dtype_of(spec["dtype"])
        fill = spec.get("fill", "randn")
        if fill == "randn":
            t = torch.randn(shape, generator=gen, dtype=torch.float32).to(dtype)
        elif fill == "randint":
            t = torch.randint(0, int(spec.get("high", 2)), shape, generator=gen, dtype=dtype)
        elif fill == "ones":
            t = torch.ones(shape, dtype=dtype)
        elif fill == "mask":
            t = padding_mask(shape, gen).to(dtype)
        else:
            raise ValueError(f"input {name!r}: unknown fill {fill!r}; use one of {list(FILLS)}")
        out[name] = t.movedim(0, int(spec.get("batch_dim", 0))).contiguous().to(device)
    return out
