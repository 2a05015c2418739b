"""Every number measures the code it names: one compiled program per backend, several models per
process, and the user's model left exactly as it was."""

from __future__ import annotations

import copy
import json

import pytest
import torch
from torch import nn

import pipeline
from conftest import TINY
from models_for_tests import PrintingMLP
from pipeline.backends.program import Program, RecompileLimitHit
from pipeline.runner import run

CPU = torch.device("cpu")


class EagerProbe:
    """Counts calls of a model's Python ``forward`` made outside compiled code: compiled code never
    runs a traced hook, and ``torch.compiler.is_compiling()`` is false only outside it."""

    def __init__(self) -> None:
        self.calls = 0

    def __call__(self, module: nn.Module, args: tuple, kwargs: dict) -> None:
        if not torch.compiler.is_compiling():
            self.calls += 1


def probed(model: nn.Module) -> EagerProbe:
    probe = EagerProbe()
    model.register_forward_pre_hook(probe, with_kwargs=True)
    return probe


class MLP(nn.Module):
    def __init__(self, width: int = 16) -> None:
        super().__init__()
        self.a, self.b = nn.Linear(width, width), nn.Linear(width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.b(self.a(x).relu())


class SmallCNN(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv, self.head = nn.Conv2d(3, 8, 3, padding=1), nn.Linear(8, 5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.conv(x).relu().mean((2, 3)))


class CallCounter(nn.Module):
    """A stateful model: a buffer counts its calls."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 4)
        self.register_buffer("calls", torch.zeros((), dtype=torch.int64))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        return self.lin(x)


def test_every_inductor_backend_serves_compiled_code_at_every_tuned_size(compose_cfg, tmp_path, capfd):
    sizes = [1, 2, 3, 4, 8]
    model = MLP().eval()
    probe = probed(model)
    cfg = compose_cfg([*TINY, "backends=inductor_all", f"model.batch_sizes={sizes}", "model.inputs.x.shape=[16]",
                       "route=one_backend", "route.backend=inductor_freezing", "profile.screen=false"])
    ctx = run(cfg, tmp_path, model=model)  # no screen: every backend stays built, each is called below
    inductor = [n for n, o in ctx.outcomes.items() if o.kind == "inductor" and o.status == "ok"]
    assert len(inductor) >= 6 and "inductor_freezing" in inductor  # every CPU-capable Inductor backend
    capture = json.loads((tmp_path / "capture.json").read_text())
    with torch.inference_mode():
        for name in inductor:
            assert capture[name]["compile"]["graphs"] >= 1 and capture[name]["compile"]["eager_calls"] == 0, name
            for bs in sizes:
                before = probe.calls
                ctx.backends[name](x=torch.randn(bs, 16))
                assert probe.calls == before, f"{name} ran the model eagerly at batch size {bs}"
        for bs in sizes:  # the routed model, and the checkpoint it loads from, serve compiled code too
            before = probe.calls
            ctx.routed(torch.randn(bs, 16))
            assert probe.calls == before, bs
    assert "recompile_limit" not in capfd.readouterr().err


def test_backends_with_the_same_options_compile_separately():
    model = MLP().eval()
    programs = [Program(model, f"inductor_{i}", {"backend": "inductor"}, CPU) for i in range(3)]
    with torch.inference_mode():
        for program in programs:
            with program.watched():
                program(x=torch.randn(2, 16))
    assert [p.evidence.graphs for p in programs] == [1, 1, 1]  # none reused another's compiled code


def test_a_program_does_not_inherit_the_sizes_an_earlier_program_of_its_name_has_seen():
    """Dynamo's automatic-dynamic history is kept per code file, line and name: a program named as an earlier one
    (the same backend of another model or run, a reload) compiled its first call with a dynamic batch. Each program
    compiles as in a fresh process: static at its first size, and again (dynamic) at a second."""
    settings = {"backend": "inductor", "fullgraph": False, "dynamic": None}
    earlier = Program(MLP().eval(), "inductor", settings, CPU)
    with torch.inference_mode(), earlier.watched():
        for rows in (2, 3, 5):  # the batch seen to change: dynamic from here on, for this program
            earlier(x=torch.randn(rows, 16))
    later = Program(MLP().eval(), "inductor", settings, CPU)
    with torch.inference_mode(), later.watched():
        later(x=torch.randn(4, 16))
        later(x=torch.randn(6, 16))
    assert later.evidence.graphs == 2, later.evidence  # one graph only: the first was already dynamic


def test_programs_of_equal_settings_each_compile_what_a_graph_break_leaves(capfd):
    """After a graph break the model's own ``forward`` is compiled on a code object every program shares;
    a second program with equal settings (a backend and its reload) must compile its own graph there, not
    borrow the first's and read as running eagerly."""
    model = PrintingMLP().eval()
    x = torch.randn(3, 16)
    for copy_ in (model, copy.deepcopy(model)):
        program = Program(copy_, "inductor", {"backend": "inductor", "fullgraph": False, "dynamic": None}, CPU)
        with torch.inference_mode(), program.watched():
            torch.testing.assert_close(program(x=x), model(x))
        assert program.evidence.graphs >= 1 and program.fallback_reason() is None, program.evidence


@pytest.mark.slow
def test_a_model_with_a_graph_break_validates_after_its_reload(tmp_path, capfd):
    """Capture sees what validate sees: the reloaded backend compiles its own graphs too."""
    tuned = pipeline.tune(PrintingMLP().eval(), torch.randn(4, 16), run_dir=tmp_path, overrides=[
        "backends=[eager,inductor]", "profile=quick", "tracking=off", "model.batch_sizes=[1,4]",
        "route=one_backend", "route.backend=inductor", "validate.extra_batch_sizes=[2]"])
    assert list(tuned.backends) == ["inductor"]
    validation = json.loads((tmp_path / "validation.json").read_text())
    assert validation["ok"] and validation["fallbacks"] == {}


def test_a_program_that_falls_back_to_eager_is_caught():
    model = MLP().eval()
    strict = Program(model, "strict", {"backend": "inductor", "dynamic": False}, CPU)
    loose = Program(model, "loose", {"backend": "inductor", "dynamic": False}, CPU)
    with torch._dynamo.config.patch(recompile_limit=1), torch.inference_mode():
        with pytest.raises(RecompileLimitHit, match=r"strict: Dynamo hit its recompile limit.*tune fewer sizes"):
            with strict.watched():
                strict(x=torch.randn(1, 16))
                strict(x=torch.randn(2, 16))  # a second static shape: past the limit of 1
        loose(x=torch.randn(1, 16))
        loose(x=torch.randn(2, 16))  # unwatched: Dynamo runs the frame eagerly, and the entry counts it
    assert "ran the model eagerly" in loose.fallback_reason()
    assert loose.evidence.eager_calls == 1


def test_models_tuned_one_after_another_in_one_process_keep_serving(tmp_path):
    overrides = [*TINY[1:], "backends=[eager,inductor,inductor_freezing]", "model.batch_sizes=[1,3,8]"]
    first, second, again = MLP().eval(), SmallCNN().eval(), MLP().eval()
    examples = [torch.randn(4, 16), torch.randn(4, 3, 8, 8), torch.randn(4, 16)]
    tuned = [pipeline.tune(m, x, overrides=overrides, run_dir=tmp_path / str(i))
             for i, (m, x) in enumerate(zip([first, second, again], examples))]
    with torch.inference_mode():
        for model, module, x in zip([first, second, again], tuned, examples):
            for bs in (1, 2, 3, 8, 9):
                rows = x[torch.arange(bs) % len(x)]
                torch.testing.assert_close(module(rows), model(rows), rtol=1e-4, atol=1e-5)
    for i in range(3):
        capture = json.loads((tmp_path / str(i) / "capture.json").read_text())
        assert {n: o["status"] for n, o in capture.items()} == dict.fromkeys(capture, "ok")
        assert all(capture[n]["compile"]["graphs"] >= 1 for n in ("inductor", "inductor_freezing"))


def test_tune_leaves_the_users_model_exactly_as_it_was(tmp_path):
    model = CallCounter()  # in training mode, on purpose
    before = {k: v.clone() for k, v in model.state_dict().items()}
    tuned = pipeline.tune(model, torch.randn(3, 4), overrides=[*TINY[1:], "backends=[eager,inductor]",
                                                               "model.batch_sizes=[1,4]"], run_dir=tmp_path)
    assert model.training and int(model.calls) == 0
    for key, value in model.state_dict().items():
        assert torch.equal(value, before[key]), key
    stored = pipeline.route.checkpoint.read(tmp_path / "model.tweak")["state_dict"]
    assert int(stored["calls"]) == 0  # the state handed in, not the count after thousands of timed calls
    assert int(tuned.record.model.calls) == 0  # the served copy starts from it too


@pytest.mark.gpu
def test_reduce_overhead_programs_own_their_cuda_graph_trees():
    from torch._inductor import cudagraph_trees

    model = MLP().cuda().eval()
    device = torch.device("cuda")
    programs = [Program(model, f"ro_{i}", {"backend": "inductor", "mode": "reduce-overhead"}, device, True)
                for i in range(2)]
    x = torch.randn(4, 16, device=device)
    with torch.inference_mode():
        for _ in range(3):  # warm-up runs, then recording, then replay
            for program in programs:
                torch.compiler.cudagraph_mark_step_begin()
                torch.testing.assert_close(program(x=x).clone(), model(x))
    index = torch.cuda.current_device()
    managers = [p._trees[index].tree_manager for p in programs]
    assert all(m is not None for m in managers) and managers[0] is not managers[1]
    shared = cudagraph_trees.get_obj(cudagraph_trees.local, "tree_manager_containers").get(index)
    assert shared is None or shared.tree_manager not in managers


@pytest.mark.gpu
def test_an_hf_model_with_autocast_then_a_vision_model_in_one_gpu_process(tmp_path):
    transformers = pytest.importorskip("transformers")
    from pipeline.measure.compare import judge

    config = transformers.BertConfig(hidden_size=64, num_hidden_layers=2, num_attention_heads=2,
                                     intermediate_size=128, vocab_size=100)
    bert = transformers.BertForQuestionAnswering(config).eval()
    ids = torch.randint(0, 100, (4, 32))
    tokens = {"input_ids": ids, "attention_mask": torch.ones_like(ids)}
    gpu_all = ["eager", "inductor", "graph", "graph_inductor", "inductor_reduce_overhead"]
    common = ["device=cuda", f"backends=[{','.join(gpu_all)}]", "profile=quick", "tracking=off",
              "model.batch_sizes=[1,8]"]
    bf16 = [f"backends.{b}.autocast_enabled=true" for b in gpu_all]
    cnn = SmallCNN().eval()
    image = torch.randn(4, 3, 16, 16)
    tuned_bert = pipeline.tune(bert, tokens, overrides=common + bf16, run_dir=tmp_path / "bert")
    tuned_cnn = pipeline.tune(cnn, image, overrides=common, run_dir=tmp_path / "cnn")
    for run_dir in ("bert", "cnn"):
        capture = json.loads((tmp_path / run_dir / "capture.json").read_text())
        assert {n: o["status"] for n, o in capture.items()} == dict.fromkeys(gpu_all, "ok"), capture
    bert, cnn = bert.cuda(), cnn.cuda()
    with torch.inference_mode():  # both still serve, and serve right, once both are tuned
        for bs in (1, 3, 8, 11):
            rows = {k: v[torch.arange(bs) % 4].cuda() for k, v in tokens.items()}
            assert judge(tuned_bert(**rows), bert(**rows), torch.bfloat16).ok
            x = image[torch.arange(bs) % 4].cuda()
            assert judge(tuned_cnn(x), cnn(x)).ok

