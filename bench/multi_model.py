"""Several models tuned one after another in one process, then every tuned model served again.

``pipeline.tune`` of BertForQuestionAnswering and ElectraForQuestionAnswering (bf16 autocast on
every backend, ``backends=gpu_all``, batch sizes 1 8 32 128 at sequence length 128) and of
torchvision models, in one process, as a notebook or service would. Once all are tuned, each is
called again at tuned, padded and chunked batch sizes and compared with its own eager model.
Writes ``multi-model-<tag>.json`` with ``{"models": [...], "all_ok": ...}``.

    python bench/multi_model.py --out OUT --tag h200
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any, Callable, Dict, List, Tuple

import torch
from torch import nn

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import pipeline  # noqa: E402
from bench.common import command_line  # noqa: E402
from pipeline import devices  # noqa: E402
from pipeline.measure import compare  # noqa: E402

SEQ = 128
HF_SIZES = [1, 8, 32, 128]
VISION_SIZES = [1, 8, 32]
BACKENDS = ["eager", "inductor", "graph", "graph_inductor", "inductor_reduce_overhead"]


def hf_qa(model_class: str, config_class: str) -> Tuple[nn.Module, Dict[str, torch.Tensor]]:
    """A full-size transformers QA model from its default config (random weights) and token inputs."""
    import transformers

    config = getattr(transformers, config_class)()
    model = getattr(transformers, model_class)(config).eval()
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(0, config.vocab_size, (8, SEQ), generator=gen)
    mask = torch.ones(8, SEQ, dtype=torch.long)
    mask[::2, SEQ // 2:] = 0  # half the rows padded
    return model, {"input_ids": ids, "attention_mask": mask, "token_type_ids": torch.zeros_like(ids)}


def vision(arch: str) -> Tuple[nn.Module, Dict[str, torch.Tensor]]:
    import torchvision

    return getattr(torchvision.models, arch)(weights=None).eval(), {"x": torch.randn(8, 3, 224, 224)}


MODELS: Dict[str, Tuple[Callable[[], Tuple[nn.Module, Dict[str, torch.Tensor]]], str, List[int]]] = {
    "bert_qa": (lambda: hf_qa("BertForQuestionAnswering", "BertConfig"), "bfloat16", HF_SIZES),
    "electra_qa": (lambda: hf_qa("ElectraForQuestionAnswering", "ElectraConfig"), "bfloat16", HF_SIZES),
    "resnet18": (lambda: vision("resnet18"), "", VISION_SIZES),
    "mobilenet_v3_small": (lambda: vision("mobilenet_v3_small"), "", VISION_SIZES),
}


def overrides(sizes: List[int], autocast: str, args: argparse.Namespace, store: Path) -> List[str]:
    backends = args.backends
    ov = [f"device={args.device}", f"backends=[{','.join(backends)}]", f"profile={args.profile}",
          f"model.batch_sizes=[{','.join(map(str, sizes))}]", f"tracking.uri=sqlite:///{store}"]
    if autocast:
        ov += [f"backends.{b}.{key}" for b in backends for key in ("autocast_enabled=true", f"autocast_dtype={autocast}")]
    return ov


def rows_of(example: Dict[str, torch.Tensor], batch: int, device: torch.device) -> Dict[str, torch.Tensor]:
    """``batch`` rows cycled from the example batch."""
    return {k: v[torch.arange(batch) % v.shape[0]].to(device) for k, v in example.items()}


def check_again(model: nn.Module, tuned: nn.Module, example: Dict[str, torch.Tensor], sizes: List[int],
                autocast: str, device: torch.device) -> List[Dict[str, Any]]:
    """The tuned model against its eager model at tuned, padded and chunked sizes."""
    dtype = getattr(torch, autocast) if autocast else None
    checks = []
    with torch.inference_mode():
        for bs in sorted(set(sizes) | {2, 5, max(sizes) + 3}):
            inputs = rows_of(example, bs, device)
            verdict = compare.judge(tuned(**inputs), model(**inputs), dtype)
            checks.append({"batch_size": bs, "max_rel_error": verdict.error, "tolerance": compare.tolerance(dtype),
                           "tensors": verdict.tensors, "ok": verdict.ok, "reason": verdict.reason})
    return checks


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--tag", default="h200")
    parser.add_argument("--models", nargs="+", default=["bert_qa", "electra_qa", "resnet18"], choices=sorted(MODELS))
    parser.add_argument("--profile", default="quick")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--backends", nargs="+", default=BACKENDS)
    args = parser.parse_args()
    device = torch.device(args.device)
    args.out.mkdir(parents=True, exist_ok=True)
    scratch = Path(tempfile.mkdtemp(prefix="multi-model-"))
    tuned: Dict[str, Tuple[nn.Module, nn.Module, Dict[str, torch.Tensor], List[int], str]] = {}
    rows: List[Dict[str, Any]] = []
    for name in args.models:
        build, autocast, sizes = MODELS[name]
        model, example = build()
        row: Dict[str, Any] = {"model": name, "autocast": autocast or "none", "batch_sizes": sizes}
        start = time.perf_counter()
        try:
            module = pipeline.tune(model, example, overrides=overrides(sizes, autocast, args, scratch / "mlflow.db"),
                                   run_dir=scratch / name)
            row["tune_seconds"] = time.perf_counter() - start
            row["route"] = module.extra_repr()
            row["capture"] = json.loads((scratch / name / "capture.json").read_text())
            tuned[name] = (model.to(device), module, example, sizes, autocast)
        except Exception as exc:  # reported, and the next model still runs: that is the point of the bench
            row["error"] = "".join(traceback.format_exception_only(type(exc), exc)).strip()[-3000:]
            print(traceback.format_exc(), file=sys.stderr)
        rows.append(row)
        print(f"== {name}: {row.get('route', row.get('error'))}", flush=True)
    for row in rows:  # every tuned model once all are tuned: nothing a later tune did broke it
        if row["model"] in tuned:
            model, module, example, sizes, autocast = tuned[row["model"]]
            row["checks_after_all_tuned"] = check_again(model, module, example, sizes, autocast, device)
            row["ok"] = all(c["ok"] for c in row["checks_after_all_tuned"])
        else:
            row["ok"] = False
    result = {"device": devices.name(device), "torch": torch.__version__,
              "python": platform.python_version(), "command": command_line(),
              "models": rows, "all_ok": all(r["ok"] for r in rows)}
    path = args.out / f"multi-model-{args.tag}.json"
    path.write_text(json.dumps(result, indent=2, default=str))
    print(json.dumps({r["model"]: {"ok": r["ok"], "route": r.get("route"), "tune_s": r.get("tune_seconds")}
                      for r in rows}, indent=1))
    print(f"all_ok={result['all_ok']} -> {path}")


if __name__ == "__main__":
    main()
