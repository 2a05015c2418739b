"""The graph backend on a real device (CUDA, or XPU with XPUGraph): outputs match eager, padded,
chunked, with several inputs; outputs survive later calls; the shared pool costs little more than
the largest graph alone. Run on the GPU machine: ``pytest -m gpu tests/test_graph_gpu.py``."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch
from omegaconf import OmegaConf
from torch import nn

from pipeline import backends as backend_registry
from pipeline import runner
from pipeline.backends import graph_plan
from pipeline.backends import Backend
from pipeline.measure.compare import combine, judge
import pipeline
from pipeline.batching import BatchDims, output_batch_dims
from pipeline.models import MLP, make_inputs
from pipeline.backends.candidate import Candidate
from pipeline.api import compose_config
from pipeline.compile import ahead as compile_ahead
from pipeline.compile.build import BuildSpec
from conftest import TINY
from models_for_tests import CellGRU, StackedBlocks, sequence_first

pytestmark = pytest.mark.gpu

GRAPH = {"kind": "graph"}
GRAPH_INDUCTOR = {"kind": "graph", "compile_with_inductor": True}
SIZES = (1, 3, 8, 17, 64, 300)  # 300 is above the largest graph (64): chunked


@pytest.fixture(scope="module")
def device() -> torch.device:
    if torch.cuda.is_available():
        return torch.device("cuda")
    if not hasattr(torch.xpu, "XPUGraph"):
        pytest.skip(f"torch {torch.__version__} has no torch.xpu.XPUGraph")
    return torch.device("xpu")


class SmallConv(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(),
                                  nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(8, 10))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.body(x)


class TwoInputs(nn.Module):
    """input_ids + attention_mask, returning a dict: a pooled output and a per-token one."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(50, 16)
        self.proj = nn.Linear(16, 4)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> dict:
        hidden = self.embed(input_ids) * attention_mask.unsqueeze(-1).float()
        pooled = hidden.sum(1) / attention_mask.sum(1, keepdim=True).clamp(min=1)
        return {"logits": self.proj(pooled), "hidden": hidden}


class WideHead(nn.Module):
    """Wide outputs, as a language model's head has: the recorded graphs' outputs dwarf the weights."""

    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 1 << 14))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.body(x)


MODELS = {
    "mlp": (lambda: MLP(width=64, depth=4), {"x": {"shape": [64], "dtype": "float32"}}),
    "conv": (SmallConv, {"x": {"shape": [3, 16, 16], "dtype": "float32"}}),
    "two_inputs": (TwoInputs, {"input_ids": {"shape": [6], "dtype": "int64", "fill": "randint", "high": 50},
                               "attention_mask": {"shape": [6], "dtype": "int64", "fill": "randint", "high": 2}}),
}


def built(cfg: dict, model: nn.Module, spec: dict, device: torch.device, batch_sizes) -> Backend:
    backend = backend_registry.create(Candidate.of("g", cfg))
    backend.build(model, make_inputs(spec, max(batch_sizes), device), device, list(batch_sizes))
    return backend


def make_model(name: str, device: torch.device):
    torch.manual_seed(0)
    factory, spec = MODELS[name]
    return factory().eval().to(device), spec


@pytest.mark.parametrize("cfg", [GRAPH, GRAPH_INDUCTOR], ids=["graph", "graph_inductor"])
@pytest.mark.parametrize("model_name", list(MODELS))
def test_outputs_match_eager_padded_and_chunked(cfg, model_name, device):
    torch._dynamo.reset()
    model, spec = make_model(model_name, device)
    backend = built(cfg, model, spec, device, range(1, 65))
    stats = backend.stats()
    assert stats["recorded_sizes"] == graph_plan.grid(64) and stats["pool_bytes"] > 0
    if cfg is GRAPH_INDUCTOR:
        assert 1 <= stats["compiles"] <= 3, stats  # a dynamic batch dimension, not one compile per size
    assert combine(backend.self_check(model, make_inputs(spec, 64, device))).ok
    for bs in SIZES:
        inputs = make_inputs(spec, bs, device, seed=1)
        with torch.inference_mode():
            expected = model(**inputs)
        out = backend(**inputs)
        assert judge(out, expected).ok, f"batch {bs}"
        if model_name == "two_inputs" and bs == 17:  # padded through the 24 graph with zeros
            for buf in backend._static[None].values():  # keyed by length: None without tuned lengths
                assert buf[17:24].eq(0).all()


class MasksOnTheHost(nn.Module):
    """GPT-Neo's attention, in small: a mask value made as a CPU tensor and copied to the device in the forward."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(16, 16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.lin(x)
        return torch.where(y > 0, y, torch.tensor(-1e4, dtype=y.dtype).to(y.device))


def test_a_forward_copying_from_the_host_fails_graph_with_the_way_out_and_graph_inductor_records_it(device):
    """GPT-Neo's graph candidates failed with torch's words alone (call BP); they now say the cause and the way out,
    which graph_inductor takes (its program holds the mask value as a constant)."""
    if device.type != "cuda":
        pytest.skip("torch's words checked here are CUDA's")
    torch._dynamo.reset()
    torch.manual_seed(0)
    model, x = MasksOnTheHost().eval().to(device), torch.randn(8, 16, device=device)
    with pytest.raises(RuntimeError, match=r"Cannot copy between CPU and CUDA.*works on the host.*graph_inductor"):
        backend_registry.create(Candidate.of("g", GRAPH)).build(model, {"x": x}, device, [1, 8])
    recorded = backend_registry.create(Candidate.of("gi", GRAPH_INDUCTOR))
    recorded.build(model, {"x": x}, device, [1, 8])
    with torch.inference_mode():
        assert judge(recorded(x=x), model(x)).ok


@pytest.mark.parametrize("cfg", [GRAPH, GRAPH_INDUCTOR], ids=["graph", "graph_inductor"])
def test_tuned_sizes_are_recorded_exactly(cfg, device):
    torch._dynamo.reset()
    model, spec = make_model("two_inputs", device)
    backend = backend_registry.create(Candidate.of("g", cfg))
    backend.build(model, make_inputs(spec, 64, device), device, range(1, 65), exact_sizes=[1, 3, 8, 17, 64])
    stats = backend.stats()
    assert stats["recorded_sizes"] == sorted(graph_plan.grid(64) + [3, 17])
    if cfg is GRAPH_INDUCTOR:
        assert 1 <= stats["compiles"] <= 3, stats  # the extra sizes are the same dynamic graph
    assert combine(backend.self_check(model, make_inputs(spec, 64, device))).ok
    for bs in (3, 17, 18):
        inputs = make_inputs(spec, bs, device, seed=1)
        with torch.inference_mode():
            expected = model(**inputs)
        assert judge(backend(**inputs), expected).ok, f"batch {bs}"
    assert backend._pad[17] == 17 and backend._pad[18] == 24


@pytest.mark.parametrize("cfg", [GRAPH, GRAPH_INDUCTOR], ids=["graph", "graph_inductor"])
def test_a_tuned_size_above_the_cap_is_served_by_one_recorded_graph(cfg, device):
    """The cap bounds the grid, not the tuned sizes: a tuned 300 past a cap of 64 replays once, not in chunks."""
    torch._dynamo.reset()
    model, spec = make_model("mlp", device)
    backend = backend_registry.create(Candidate.of("g", {**cfg, "max_recorded_batch_size": 64}))
    backend.build(model, make_inputs(spec, 300, device), device, range(1, 301), exact_sizes=[1, 64, 300])
    assert backend.stats()["recorded_sizes"] == graph_plan.grid(64) + [300]
    replays, replay = [], backend._replay
    backend._replay = lambda inputs, start, rows, size, *rest: (replays.append(size),
                                                                replay(inputs, start, rows, size, *rest))[1]
    for bs in (300, 200):  # tuned; untuned past the cap, padded to the tuned graph that routes it
        replays.clear()
        inputs = make_inputs(spec, bs, device, seed=1)
        with torch.inference_mode():
            expected = model(**inputs)
        assert judge(backend(**inputs), expected).ok, f"batch {bs}"
        assert replays == [300], (bs, replays)


def test_outputs_survive_a_later_call_unless_clone_outputs_is_false(device):
    model, spec = make_model("mlp", device)
    first, second = make_inputs(spec, 8, device, seed=1), make_inputs(spec, 8, device, seed=2)
    with torch.inference_mode():
        expected = model(**first)
    cloned = built(GRAPH, model, spec, device, [8])
    y1 = cloned(**first)
    cloned(**second)
    assert judge(y1, expected).ok

    zero_copy = built({**GRAPH, "clone_outputs": False}, model, spec, device, [8])
    y1 = zero_copy(**first)
    assert judge(y1, expected).ok
    y2 = zero_copy(**second)
    assert y1.data_ptr() == y2.data_ptr() and torch.equal(y1, y2)  # overwritten, as documented


class Wide(nn.Module):
    """Large intermediates, small outputs: the pool holds activations, which graphs can share."""

    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.Linear(64, 4096), nn.ReLU(), nn.Linear(4096, 4096), nn.ReLU(), nn.Linear(4096, 8))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.body(x)


def test_pool_of_all_graphs_costs_little_more_than_the_largest_alone(device):
    torch.manual_seed(0)
    model, spec = Wide().eval().to(device), {"x": {"shape": [64], "dtype": "float32"}}
    built(GRAPH, model, spec, device, [8])  # first capture on this stream sets up one-off workspaces
    alone = built(GRAPH, model, spec, device, [256]).stats()
    every = built(GRAPH, model, spec, device, range(1, 257)).stats()
    assert alone["graphs"] == 1 and every["graphs"] == 35
    assert every["pool_bytes"] <= 1.25 * alone["pool_bytes"] + 16 * 2**20, (alone, every)


class Vocabulary(nn.Module):
    """Large outputs (a language model's logits: 256 KB a row), small intermediates."""

    def __init__(self) -> None:
        super().__init__()
        self.head = nn.Linear(64, 65536)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(x)


def test_graphs_share_their_outputs_memory_and_every_size_still_answers_as_eager(device):
    """35 graphs up to 256 rows kept every graph's outputs: 16.5 times the largest graph's (DistilBERT's logits at
    batch 256: every graph candidate out of memory on the H100). Cloned at every call, they now share it, and calls
    that alternate between sizes (each replay overwriting what another graph wrote) still answer as eager."""
    torch.manual_seed(0)
    model, spec = Vocabulary().eval().to(device), {"x": {"shape": [64], "dtype": "float32"}}
    built(GRAPH, model, spec, device, [8])  # first capture on this stream sets up one-off workspaces
    alone = built(GRAPH, model, spec, device, [256]).stats()
    backend = built(GRAPH, model, spec, device, range(1, 257))
    every = backend.stats()
    assert every["graphs"] == 35 and every["pool_bytes"] <= 1.5 * alone["pool_bytes"] + 16 * 2**20, (alone, every)
    with torch.inference_mode():
        for bs in (256, 8, 250, 1, 256, 17):
            x = torch.randn(bs, 64, device=device)
            assert judge(backend(x=x), model(x)).ok, bs
    kept = built({**GRAPH, "clone_outputs": False}, model, spec, device, range(1, 257)).stats()
    assert kept["pool_bytes"] > 8 * alone["pool_bytes"], (alone, kept)  # views handed out keep their own memory


def test_pipeline_run_with_graph_backends(compose_cfg, tmp_path, device):
    torch._dynamo.reset()
    cfg = compose_cfg(TINY + ["backends=[eager,graph,graph_inductor]", f"device={device.type}"])
    ctx = runner.run(cfg, tmp_path)
    statuses = {n: o.status for n, o in ctx.outcomes.items()}
    assert {"eager", "graph", "graph_inductor"} <= statuses.keys() and set(statuses.values()) == {"ok"}, statuses
    assert ctx.validation["ok"]


def test_a_graph_candidates_worker_builds_its_standalone_program_alone_and_capture_records_it(compose_cfg, tmp_path,
                                                                                             device):
    """The worker builds graph_inductor's standalone program by its Inductor side alone (no device graphs recorded
    there); capture loads it with no trace, records its graphs over it and the route answers as eager."""
    torch._dynamo.reset()
    cfg = compose_cfg(TINY + ["backends=[eager,graph_inductor]", f"device={device.type}", "compile_cache.workers=1",
                              f"compile_cache.dir={tmp_path / 'cache'}"])
    ctx = runner.run(cfg, tmp_path / "run")
    built = ctx.outcomes["graph_inductor"]
    assert built.status == "ok", built.reason
    assert built.cost.ahead_s > 0 and built.cost.ahead_compiled >= 1 and built.cost.trace_s == 0, built.cost
    assert ctx.validation["ok"]


def test_max_autotune_kernels_recorded_as_device_graphs_are_checked_profiled_and_served(compose_cfg, tmp_path, device):
    """graph_inductor_max_autotune (conf/backends): a max-autotune-no-cudagraphs program under graph_inductor's graphs,
    through a whole run, its route validated against eager."""
    torch._dynamo.reset()
    cfg = compose_cfg(TINY + ["backends=[eager,graph_inductor,graph_inductor_max_autotune]", f"device={device.type}"])
    ctx = runner.run(cfg, tmp_path)
    statuses = {n: o.status for n, o in ctx.outcomes.items()}
    assert statuses.get("graph_inductor_max_autotune") == "ok", statuses
    assert ctx.outcomes["graph_inductor"].held_bytes > 0  # its static buffers and graph pool, counted
    assert ctx.validation["ok"]


@pytest.mark.parametrize("cfg", [GRAPH, GRAPH_INDUCTOR], ids=["graph", "graph_inductor"])
def test_a_sequence_first_model_is_padded_and_chunked_along_its_batch_dimension(cfg, device):
    torch._dynamo.reset()
    torch.manual_seed(0)
    model = CellGRU().eval().to(device)
    at = lambda bs: {"x": sequence_first(bs).to(device)}  # noqa: E731
    dims = BatchDims({"x": 1}, output_batch_dims(model, at))
    assert dims.outputs == {"output[0]": 1, "output[1]": 1}
    backend = backend_registry.create(Candidate.of("g", cfg))
    backend.build(model, at(64), device, range(1, 65), batch_dims=dims)
    assert combine(backend.self_check(model, at(64))).ok
    for bs in SIZES:
        with torch.inference_mode():
            expected = model(**at(bs))
        assert judge(backend(**at(bs)), expected).ok, f"batch {bs}"
    backend(**at(17))  # padded through the 24 graph: its rows 17..23 are zeros, in dimension 1
    assert backend._static[None]["x"][:, 17:24].eq(0).all()


def test_tune_serves_a_sequence_first_model_through_the_graph_backends(tmp_path, device):
    torch._dynamo.reset()
    model = CellGRU().eval()
    tuned = pipeline.tune(model, sequence_first(8), batch_dims={"x": 1}, run_dir=tmp_path, overrides=[
        f"device={device.type}", "backends=[eager,graph,graph_inductor]", "profile=quick", "tracking=off",
        "model.batch_sizes=[1,4,8]"])
    statuses = {n: o["status"] for n, o in json.loads((tmp_path / "capture.json").read_text()).items()}
    assert {"eager", "graph", "graph_inductor"} <= statuses.keys() and set(statuses.values()) == {"ok"}, statuses
    model.to(device)
    with torch.inference_mode():
        for bs in (1, 3, 9, 40):
            x = sequence_first(bs).to(device)
            assert judge(tuned(x), model(x)).ok, f"batch {bs}"


LENGTH_SPEC = {"input_ids": {"shape": [32], "dtype": "int64", "fill": "randint", "high": 50, "seq_dim": 1, "pad": 0},
               "attention_mask": {"shape": [32], "dtype": "int64", "fill": "mask", "seq_dim": 1, "pad": 0}}


@pytest.mark.parametrize("cfg", [GRAPH, GRAPH_INDUCTOR, {**GRAPH_INDUCTOR, "per_length": True}],
                         ids=["graph", "graph_inductor", "graph_inductor_per_length"])
def test_graphs_are_recorded_over_the_batch_grid_at_every_tuned_length_in_one_pool(cfg, device):
    """Issue 31: (batch grid x tuned lengths) graphs, counted in stats (capture.json's graphs and pool_mb); a call
    at a recorded length pads its batch as before; an untuned length is refused (the routed model pads it)."""
    from pipeline.seqlen import SeqDims

    torch._dynamo.reset()
    torch.manual_seed(0)
    model = TwoInputs().eval().to(device)
    seq = SeqDims.of(LENGTH_SPEC, [8, 32], {"output.logits": None, "output.hidden": 1})
    dims = BatchDims.of(LENGTH_SPEC, {"output.logits": 0, "output.hidden": 0}, seq)
    backend = backend_registry.create(Candidate.of("g", cfg))
    backend.build(model, make_inputs(LENGTH_SPEC, 8, device), device, range(1, 9), [1, 8], dims)
    stats = backend.stats()
    assert stats["graphs"] == 2 * len(graph_plan.grid(8)) and stats["recorded_lengths"] == [8, 32]
    assert combine(backend.self_check(model, make_inputs(LENGTH_SPEC, 8, device))).ok
    for bs in (1, 3, 8, 11):
        for length in (8, 32):
            inputs = seq.resized(make_inputs(LENGTH_SPEC, bs, device, seed=2), length)
            with torch.inference_mode():
                assert judge(backend(**inputs), model(**inputs)).ok, (bs, length)
    with pytest.raises(ValueError, match="recorded at lengths \\[8, 32\\], not 20"):
        backend(**seq.resized(make_inputs(LENGTH_SPEC, 2, device), 20))
    capped = backend_registry.create(Candidate.of("g", {**cfg, "max_graphs": 3}))
    with pytest.raises(RuntimeError, match="make 8 graphs, above max_graphs=3"):
        capped.build(model, make_inputs(LENGTH_SPEC, 8, device), device, range(1, 9), [1, 8], dims)
    small_pool = backend_registry.create(Candidate.of("g", {**cfg, "max_pool_mb": 1e-6}))
    with pytest.raises(RuntimeError, match="above max_pool_mb=1e-06"):
        small_pool.build(model, make_inputs(LENGTH_SPEC, 8, device), device, range(1, 9), [1, 8], dims)


def test_a_compile_worker_gives_a_candidates_device_memory_back_after_its_job(tmp_path, device, monkeypatch):
    """A worker that kept each candidate's graphs and outputs reserved left the run's own graph candidates out of
    memory (DistilBERT's masked-LM head on the H200); once a job ends, the worker holds little beyond the model."""
    tests = str(Path(__file__).parent)  # the worker imports WideHead from this module
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [tests, os.environ.get("PYTHONPATH")])))
    torch.manual_seed(0)
    model = WideHead().eval().to(device)
    sizes = [1, 256]
    cells = {bs: {"x": torch.randn(bs, 64, device=device)} for bs in sizes}
    dims = output_batch_dims(model, lambda bs: {"x": torch.randn(bs, 64, device=device)})
    spec = BuildSpec(model, cells[256], device, range(1, 257), sizes, BatchDims(inputs={"x": 0}, outputs=dims))
    cache = compose_config([*TINY, f"compile_cache.dir={tmp_path / 'cache'}"]).compile_cache
    with compile_ahead.started({"graph_inductor": Candidate.of("graph_inductor", GRAPH_INDUCTOR)}, spec, cells, None,
                               OmegaConf.to_container(cache, resolve=True), 1) as ahead:
        done = ahead.wait("graph_inductor")
    assert done is not None and "error" not in done, done
    weights = sum(p.numel() * p.element_size() for p in model.parameters())
    outputs_held = sum(graph_plan.grid(256)) * (1 << 14) * 4  # what its recorded graphs' outputs alone took
    assert done["reserved_after_bytes"] <= 2 * weights + (64 << 20) < outputs_held, done


def test_a_regional_program_recorded_as_device_graphs_answers_as_eager(device):
    """graph_inductor_regional: the repeated blocks compiled once, then graphs recorded over the grid as usual."""
    torch._dynamo.reset()
    torch.manual_seed(0)
    model, spec = StackedBlocks(width=64, depth=6).eval().to(device), {"x": {"shape": [16], "dtype": "float32"}}
    backend = built({**GRAPH_INDUCTOR, "regional": True}, model, spec, device, range(1, 65))
    stats = backend.stats()
    assert stats["recorded_sizes"] == graph_plan.grid(64) and 1 <= stats["compiles"] <= 3, stats
    assert combine(backend.self_check(model, make_inputs(spec, 64, device))).ok
    for bs in SIZES:
        inputs = make_inputs(spec, bs, device, seed=1)
        with torch.inference_mode():
            expected = model(**inputs)
        assert judge(backend(**inputs), expected).ok, f"batch {bs}"
    assert backend.fallback_reason() is None
