"""What a run's cells and outcomes measured, so that ``resume=`` reuses them only for the same thing.

A resumed run takes its config from the run directory's ``config.yaml``, but a config names a model
rather than being one: an edited file, a changed model class or other example data would have the
cells of one model reused as another's profile. The fingerprint holds what the measurements depend
on: the model's structure, its weights' shapes and dtypes, the inputs (their spec and a digest of
the example rows), the device, the competing backends' configs and the torch version. The recorder
writes it into ``run.json`` when a run starts; a resume whose fingerprint differs is refused,
naming what changed.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any, Dict, Mapping, Optional

import torch

from pipeline import devices

PARTS = {"model": "the model's structure", "weights": "the model's weights (shapes and dtypes)",
         "inputs": "the inputs (spec and example rows)", "device": "the device", "backends": "the backends' configs",
         "torch": "the torch version"}


def digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def examples_digest(examples: Mapping[str, torch.Tensor]) -> str:
    """A digest of the user's example rows: each tensor's shape, dtype, strides and offset, and the bytes of the
    storage it views. Never the rows laid out in full: a stored tensor of a few bytes may view gigabytes (an
    expanded one), which the run itself only ever takes a batch of."""
    h = hashlib.sha256()
    for name, t in sorted(examples.items()):
        t = t.detach()
        h.update(f"{name}{tuple(t.shape)}{t.dtype}{t.stride()}{t.storage_offset()}".encode())
        raw = torch.empty(0, dtype=torch.uint8, device=t.device).set_(t.untyped_storage())
        if raw.numel():
            h.update(memoryview(raw.cpu().numpy()))
    return h.hexdigest()[:16]


def fingerprint(ctx: Any) -> Dict[str, Any]:
    """The fingerprint of a run context (:class:`pipeline.context.RunContext`), as plain data."""
    return {
        "model": digest(repr(ctx.model)),
        "weights": {k: [list(v.shape), str(v.dtype)] for k, v in ctx.model.state_dict().items()
                    if isinstance(v, torch.Tensor)},
        "inputs": {"spec": json.loads(json.dumps(ctx.inputs)), "examples": examples_digest(ctx.examples)},
        "device": {"type": ctx.device.type, "name": devices.name(ctx.device)},
        "backends": json.loads(json.dumps({name: c.config() for name, c in ctx.candidates.items()})),
        "torch": torch.__version__,
    }


def first_difference(then: Any, now: Any) -> str:
    """Where two parts differ, in a few words: the first weight whose shape changed, say."""
    if isinstance(then, dict) and isinstance(now, dict):
        for key in [*then, *(k for k in now if k not in then)]:
            if then.get(key) != now.get(key):
                return f"{key}: {json.dumps(then.get(key))[:80]} then, {json.dumps(now.get(key))[:80]} now"
    return f"{json.dumps(then)[:80]} then, {json.dumps(now)[:80]} now"


def mismatch(then: Mapping[str, Any], now: Mapping[str, Any]) -> Optional[str]:
    """What differs between the fingerprint a run started with and today's, or None."""
    for part, words in PARTS.items():
        if then.get(part) != now.get(part):
            return f"{words} changed ({first_difference(then.get(part), now.get(part))})"
    return None
