"""The attention list (issue 56): every PyTorch backend competes once more per forced scaled_dot_product_attention
kernel (``<candidate>.sdpa-<kernel>``), the reference peers as the user writes them; a kernel that cannot take the
model's calls, or a model that calls no SDPA, excludes the candidate with the reason; the kernel survives the
checkpoint. On the CPU PyTorch has the flash and math kernels: the runs use eager only, so each takes seconds."""

from __future__ import annotations

import json
import logging
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from conftest import SUITE_CACHE, TINY
from pipeline.backends import Candidate, attention, precision
from pipeline.compile import ahead
from pipeline.config.attention import parse_list
from pipeline.errors import ConfigError
from pipeline.preflight.checks import candidates_of
from pipeline.route import checkpoint
from pipeline.runner import run

CPU = torch.device("cpu")
BERT = ["model=bert_tiny", "profile=quick", "tracking=off", "reference=false", "backends=[eager]",
        "model.batch_sizes=[1,4]"]


class Attends(nn.Module):
    """One self-attention through F.scaled_dot_product_attention."""

    def __init__(self) -> None:
        super().__init__()
        self.qkv = nn.Linear(32, 96)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q, k, v = self.qkv(x).view(x.shape[0], x.shape[1], 3, 2, 16).permute(2, 0, 3, 1, 4)
        return F.scaled_dot_product_attention(q, k, v).flatten(1)


class OutOfMemory(Attends):
    """Attends, then runs out of device memory (as a large batch's next op would)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        super().forward(x)
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 1.86 GiB.")


def flash_calls(module: nn.Module, **inputs: torch.Tensor) -> int:
    """How many times a call of ``module`` runs the CPU's FlashAttention kernel (the profiler's aten events)."""
    with torch.inference_mode(), torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        module(**inputs)
    return sum(e.name.startswith("aten::_scaled_dot_product_flash_attention") for e in prof.events())


def test_each_pytorch_backend_competes_once_more_per_kernel_and_the_references_as_written(compose_cfg):
    made = candidates_of(compose_cfg(["backends=cpu", "precision=[fp32,bf16]", "attention=[default,math]"]), CPU)
    assert [n for n in made if "sdpa" in n] == [
        "eager.sdpa-math", "inductor.sdpa-math", "eager.bf16.sdpa-math", "inductor.bf16.sdpa-math",
        "eager.bf16-weights.sdpa-math", "inductor.bf16-weights.sdpa-math"]  # no runtime's, no reference peer's
    assert {n for n in made if n.startswith("reference")} == {"reference_max_autotune",
                                                              "reference_max_autotune.bf16-weights"}
    forced = made["inductor.bf16-weights.sdpa-math"]
    assert forced.attention == "math" and forced.precision == "bf16" and forced.casts_weights
    assert forced.numerics == "bf16-weights.sdpa-math"  # the precision-first screen keeps kernels apart
    assert made["inductor"].reference == "default" and forced.reference == "" == made["inductor.sdpa-math"].reference
    assert made["inductor"].attention is None and made["inductor"].numerics == "fp32"
    assert all(precision.name_problem(c) is None for c in made.values())
    # a compile worker's job is the program: a forced kernel is another one, never shared with PyTorch's choice
    assert ahead.program_key(made["inductor"]) != ahead.program_key(made["inductor.sdpa-math"])


def test_the_kernel_is_forced_inside_the_call_and_a_kernel_or_model_that_cannot_is_named():
    model, x = Attends().eval(), torch.randn(2, 8, 32)
    assert flash_calls(model, x=x) == 1  # PyTorch's own choice on the CPU
    assert flash_calls(attention.AttentionKernel(model, "math"), x=x) == 0
    assert attention.problem(model, {"x": x}, "math") is None and attention.problem(model, {"x": x}, "flash") is None
    assert attention.calls(model, {"x": x}) == 1 and attention.calls(nn.Linear(32, 4), {"input": x}) == 0
    plain = nn.Sequential(nn.Linear(32, 4))
    assert "calls no torch.nn.functional.scaled_dot_product_attention" in attention.problem(plain, {"input": x}, "math")
    with pytest.raises(torch.OutOfMemoryError):  # the device's memory, not the kernel (DistilBERT at 256 on the H100)
        attention.problem(OutOfMemory(), {"x": x}, "math")
    on_cpu = Candidate.of("eager", {"kind": "eager", "attention": "cudnn"}).unsupported_reason(CPU)
    assert on_cpu == "attention kernel cudnn runs on CUDA alone; on cpu PyTorch has ['flash', 'math']"


@pytest.mark.parametrize("values, says", [
    (["default", "fast"],
     "attention 'fast' is unknown; use some of ['default', 'flash', 'efficient', 'cudnn', 'math']"),
    ([], "attention=[] names no attention kernel"),
    (["math", "math"], "attention lists math more than once")])
def test_an_attention_list_mistake_is_one_line(values, says):
    with pytest.raises(ConfigError) as err:
        parse_list(values)
    assert says in str(err.value) and "\n" not in str(err.value)


def test_a_forced_kernel_is_measured_routed_and_kept_by_the_checkpoint(compose_cfg, tmp_path):
    cfg = compose_cfg([*BERT, "attention=[default,math,cudnn]", "route=one_backend", "route.backend=eager.sdpa-math"])
    ctx = run(cfg, tmp_path)
    route = json.loads((tmp_path / "route.json").read_text())
    assert route["excluded"]["eager.sdpa-cudnn"].startswith("skipped: attention kernel cudnn runs on CUDA alone")
    assert set(route["profile_medians_ms"]) >= {"eager", "eager.sdpa-math"}
    assert [r["backend"] for r in route["ranges"]] == ["eager.sdpa-math"] and ctx.validation["ok"]
    loaded = checkpoint.load(ctx.checkpoint_path, ctx.model)
    inputs = ctx.input_sources()[0][1](4)
    assert flash_calls(ctx.model, **inputs) > 0 and flash_calls(loaded, **inputs) == 0  # math, also after reload
    with torch.inference_mode():
        torch.testing.assert_close(loaded(**inputs), ctx.model(**inputs), rtol=1e-4, atol=1e-5)


def test_a_model_that_calls_no_attention_gets_no_forced_candidate_built_and_the_run_goes_on(compose_cfg, tmp_path,
                                                                                          caplog):
    cfg = compose_cfg([*TINY, "backends=[eager,inductor]", "reference=false", "attention=[default,math]",
                       "compile_cache.workers=1"])
    with caplog.at_level(logging.INFO):
        ctx = run(cfg, tmp_path)
    route = json.loads((tmp_path / "route.json").read_text())
    for name in ("eager.sdpa-math", "inductor.sdpa-math"):
        assert "calls no torch.nn.functional.scaled_dot_product_attention" in route["excluded"][name]
    # known before any compile job: the worker compiles inductor's program alone
    assert "compile 1 program(s) for 1 candidate(s): inductor " in caplog.text
    assert {r["backend"] for r in route["ranges"]} <= {"eager", "inductor"} and ctx.validation["ok"]


def test_a_forced_kernels_inductor_program_is_built_standalone_by_its_worker_and_runs_untraced(compose_cfg, tmp_path,
                                                                                              caplog):
    """The kernel's context sits inside the forward; traced there, Dynamo's graph keeps it as calls that Inductor's
    standalone form cannot save (on the H100 every forced candidate's worker build failed with "TypeError: 'NoneType'
    object is not callable" and capture traced it again). Held around the trace and the compile instead, the worker's
    program is saved, loaded by capture with no trace, and answers as the model does."""
    cfg = compose_cfg([*BERT, "backends=[inductor]", "attention=[math]", "stages=[capture]",
                       "compile_cache.workers=1", "compile_cache.standalone=true", f"compile_cache.dir={SUITE_CACHE}"])
    with caplog.at_level(logging.INFO):
        ctx = run(cfg, tmp_path)
    assert "capture: inductor.sdpa-math runs the standalone program its worker built" in caplog.text, caplog.text[-3000:]
    outcome = ctx.outcomes["inductor.sdpa-math"]
    assert outcome.status == "ok" and outcome.within_budget and outcome.cost.trace_s == 0, outcome.reason
    assert ctx.backends["inductor.sdpa-math"].program is None  # no Dynamo program in the run's process
