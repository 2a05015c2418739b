"""Quantized precisions: torchao's recipes, chosen by an allow-listed name, applied to a copy of the model.

``int8_weight_only`` is torchao's ``Int8WeightOnlyConfig`` (int8 weights, one scale per output channel),
``int8_dynamic`` its ``Int8DynamicActivationInt8WeightConfig`` (int8 weights, and activations quantized
to int8 per token at every call), ``fp8`` its ``Float8DynamicActivationFloat8WeightConfig`` with row-wise
scales (float8 e4m3 weights and activations; CUDA compute capability >= 8.9). Each runs on a bf16 copy
of the model (:class:`~pipeline.backends.precision.ReducedPrecision` with cast weights), whose
``nn.Linear`` layers it quantizes, only those large enough to gain (torchao's row-wise filter,
:func:`large_enough`) as the precision list sets them: torchao's kernels are made for bf16
activations, and row-wise fp8 takes bf16 weights only. The user's model is never touched.

A name maps to one fixed config here, so a checkpoint stores the model's fp32 weights and the name
alone, and ``load`` quantizes the same weights again to the same tensors: no torchao object is ever
pickled, and a name not listed here is refused (``rules.check``). ``set_inductor_config=False``:
torchao would otherwise change the process-wide Inductor config, which options never touch here.
torchao is the optional extra ``.[quant]``; without it these candidates are skipped, naming it.
"""

from __future__ import annotations

from typing import Any, Callable, Dict, Optional

import torch
from torch import nn

from pipeline.config.precisions import Quantized

# recipe -> the precision its quantized weights are stored in (route.json's ``weights``); one per Quantized
RECIPES: Dict[Quantized, str] = {"int8_weight_only": "int8", "int8_dynamic": "int8", "fp8": "fp8"}
BASE_DTYPE = "bfloat16"  # what everything but the quantized matmuls computes in
EXTRA = "quant"
FP8_CAPABILITY = (8, 9)  # float8 tensor-core matmuls: Ada, Hopper and later
# torchao's row-wise filter: a Linear gains from int8 or fp8 only above these sizes (measured on the H200: fp8
# 1.08x over bf16 on ViT-L/16, slower on every ViT-B and BERT-base Linear, which all fall below them).
MIN_IN_FEATURES = 1024
MIN_OUT_FEATURES = 2048


def large_enough(module: nn.Module, fqn: str = "") -> bool:
    """Whether torchao's row-wise filter admits ``module``: a Linear of more than MIN_IN_FEATURES inputs and
    MIN_OUT_FEATURES outputs (``quantize_``'s ``filter_fn``)."""
    return (isinstance(module, nn.Linear) and module.in_features > MIN_IN_FEATURES
            and module.out_features > MIN_OUT_FEATURES)


def _configs() -> Dict[Quantized, Callable[[], Any]]:
    """recipe -> a new torchao config; imports torchao (ImportError without it)."""
    from torchao.quantization import (Float8DynamicActivationFloat8WeightConfig,
                                      Int8DynamicActivationInt8WeightConfig, Int8WeightOnlyConfig, PerRow)

    return {"int8_weight_only": lambda: Int8WeightOnlyConfig(set_inductor_config=False),
            "int8_dynamic": lambda: Int8DynamicActivationInt8WeightConfig(set_inductor_config=False),
            "fp8": lambda: Float8DynamicActivationFloat8WeightConfig(granularity=PerRow(), set_inductor_config=False)}


def unsupported_reason(recipe: Quantized, device: torch.device) -> Optional[str]:
    """Why ``recipe`` cannot run on ``device``: torchao missing, no float8 matmuls, no bf16; None if it can."""
    try:
        _configs()
    except ImportError as exc:
        return (f"{recipe} quantizes with torchao, which cannot be imported ({exc}); install it with "
                f"pip install -e '.[{EXTRA}]'")
    if recipe == "fp8":
        if device.type != "cuda":
            return (f"fp8 needs float8 matmuls: a CUDA GPU of compute capability >= "
                    f"{'.'.join(map(str, FP8_CAPABILITY))} (Ada, Hopper); {device.type} has none")
        capability = torch.cuda.get_device_capability(device)
        if capability < FP8_CAPABILITY:
            return (f"fp8 needs CUDA compute capability >= {'.'.join(map(str, FP8_CAPABILITY))}; "
                    f"{torch.cuda.get_device_name(device)} has {'.'.join(map(str, capability))}")
    if device.type == "cuda" and not torch.cuda.is_bf16_supported():
        return f"{recipe} runs a bf16 copy of the model; {torch.cuda.get_device_name(device)} has no bf16 support"
    return None


def quantize(model: nn.Module, recipe: Quantized, large_only: bool = False) -> int:
    """Quantize ``model`` (a copy: in place) by ``recipe``, its large Linears alone where ``large_only``
    (:func:`large_enough`); returns how many layers torchao quantized."""
    from torchao.quantization import quantize_
    from torchao.utils import TorchAOBaseTensor

    quantize_(model, _configs()[recipe](), filter_fn=large_enough if large_only else None)
    return sum(isinstance(getattr(m, "weight", None), TorchAOBaseTensor) for m in model.modules())


def nothing_quantized(recipe: Quantized, model: nn.Module, large_only: bool = False) -> str:
    """The reason a candidate whose model has no layer ``recipe`` quantizes is skipped."""
    linears = [m for m in model.modules() if isinstance(m, nn.Linear)]
    if large_only and linears:
        big = max(linears, key=lambda m: m.in_features * m.out_features)
        return (f"{recipe}: none of the model's {len(linears)} Linear layers is large enough to gain from it "
                f"(torchao's row-wise filter: more than {MIN_IN_FEATURES} input and {MIN_OUT_FEATURES} output "
                f"features; the largest here takes {big.in_features} to {big.out_features}), so this candidate "
                f"would repeat bf16, only slower")
    shapes = " whose in and out features are multiples of 16" if recipe == "fp8" else ""
    return (f"{recipe}: torchao quantized none of the model's layers (it quantizes nn.Linear layers{shapes}), "
            f"so this candidate would repeat bf16")
