"""Inductor templates and modes: composition, early option errors, the search path, a CPU run."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf, open_dict

from conftest import CONF, ROOT, TINY
from pipeline import backends
from pipeline.config import templates
from pipeline.measure.compare import tolerance
from pipeline.preflight.checks import check_config
from pipeline.runner import run
from pipeline.config.backend_schema import LOOSE_KINDS
from pipeline.backends.candidate import Candidate

SHIPPED_TEMPLATES = {
    "triton": {"cpp_wrapper": False},
    "cpp_wrapper": {"cpp_wrapper": True},
    "cudagraphs": {"triton.cudagraphs": True},
    "max_autotune": {"max_autotune": True, "max_autotune_gemm": True,
                     "coordinate_descent_tuning": True, "epilogue_fusion": True},
    "freezing": {"freezing": True},
    # max_autotune_gemm: the TMA flag is only read by max-autotune GEMM templates.
    "tma": {"triton.enable_persistent_tma_matmul": True, "max_autotune_gemm": True},
}
MODE_BACKENDS = {"inductor": "default", "inductor_reduce_overhead": "reduce-overhead",
                 "inductor_max_autotune": "max-autotune",
                 "inductor_max_autotune_no_cudagraphs": "max-autotune-no-cudagraphs"}
TEMPLATE_BACKENDS = {"inductor_triton": "triton", "inductor_cpp_wrapper": "cpp_wrapper",
                     "inductor_cudagraphs": "cudagraphs", "inductor_max_autotune_template": "max_autotune",
                     "inductor_freezing": "freezing", "inductor_tma": "tma"}
CPU_SKIPPED = ("inductor_cudagraphs", "inductor_tma", "inductor_reduce_overhead", "inductor_max_autotune")


def backend_cfg(compose_cfg, name: str, *overrides: str) -> dict:
    cfg = compose_cfg([*TINY, f"backends=[{name}]", *overrides])
    return OmegaConf.to_container(cfg.backends[name], resolve=True)


def test_shipped_templates_hold_the_documented_options() -> None:
    assert templates.names() == sorted(SHIPPED_TEMPLATES)
    for name, options in SHIPPED_TEMPLATES.items():
        t = templates.load(name)
        assert t.options == options and t.description, name


@pytest.mark.parametrize("name", sorted({**MODE_BACKENDS, **TEMPLATE_BACKENDS}))
def test_every_shipped_backend_composes_and_resolves(compose_cfg, name: str) -> None:
    backend = backends.create(Candidate.of(name, backend_cfg(compose_cfg, name)))
    if name in MODE_BACKENDS:
        assert backend.compile_kwargs()["mode"] == MODE_BACKENDS[name]
    else:
        assert backend.compile_kwargs()["options"] == SHIPPED_TEMPLATES[TEMPLATE_BACKENDS[name]]


def test_inductor_all_set_names_every_backend(compose_cfg) -> None:
    cfg = compose_cfg([*TINY, "backends=inductor_all"])
    assert set(cfg.backends) == {"eager", *MODE_BACKENDS, *TEMPLATE_BACKENDS, "inductor_regional"}
    check_config(cfg)


@pytest.mark.parametrize("overrides, keys", [
    (["backends.inductor.template=freezing"], "mode and template"),
    (["backends.inductor.mode=null", "backends.inductor.template=freezing",
      "+backends.inductor.options={freezing:true}"], "options and template"),
    (["+backends.inductor.options={freezing:true}"], "mode and options"),
])
def test_conflicting_settings_fail_at_composition(compose_cfg, overrides, keys) -> None:
    cfg = compose_cfg([*TINY, "backends=[eager,inductor]", *overrides])
    with pytest.raises(ValueError, match=f"sets {keys}; they are mutually exclusive"):
        check_config(cfg)


def test_unknown_option_fails_before_any_work_with_closest_names(compose_cfg, tmp_path: Path) -> None:
    cfg = compose_cfg([*TINY, "backends=[eager,inductor]", "backends.inductor.mode=null",
                       "+backends.inductor.options={max_autotun:true,triton:{cudagraph:true}}"])
    with pytest.raises(ValueError) as err:
        run(cfg, tmp_path / "run")
    msg = str(err.value)
    assert "'max_autotun'" in msg and "max_autotune" in msg
    assert "'triton.cudagraph'" in msg and "triton.cudagraphs" in msg
    assert not (tmp_path / "run").exists()  # failed before the run directory, model or compile


def test_wrong_option_type_fails_early(compose_cfg) -> None:
    cfg = compose_cfg([*TINY, "backends=[inductor]", "backends.inductor.mode=null",
                       "+backends.inductor.options={freezing:'yes',cpu_backend:cuda}"])
    with pytest.raises(ValueError, match=r"freezing='yes' is str, torch expects bool.*cpu_backend='cuda' is not one of"):
        check_config(cfg)


def test_unknown_mode_and_template_fail_early(compose_cfg) -> None:
    cfg = compose_cfg([*TINY, "backends=[inductor]", "backends.inductor.mode=fastest"])
    with pytest.raises(ValueError, match="unknown Inductor mode 'fastest'"):
        check_config(cfg)
    cfg = compose_cfg([*TINY, "backends=[inductor]", "backends.inductor.mode=null", "backends.inductor.template=nope"])
    with pytest.raises(ValueError, match=r"template 'nope' not found.*'freezing'"):
        check_config(cfg)


def write_template(root: Path, name: str, body: str) -> None:
    (root / "inductor_template").mkdir(parents=True, exist_ok=True)
    (root / "inductor_template" / f"{name}.yaml").write_text(body)


def test_user_templates_come_first_on_the_search_path(tmp_path: Path) -> None:
    write_template(tmp_path, "mine", "description: my set\noptions:\n  triton:\n    max_tiles: 3\n")
    write_template(tmp_path, "freezing", "description: shadowed\noptions:\n  freezing: false\n")
    path = [str(tmp_path), templates.SHIPPED]
    assert templates.load("mine", path).options == {"triton": {"max_tiles": 3}}
    assert templates.load("freezing", path).description == "shadowed"
    assert templates.load("freezing").description != "shadowed"  # the default path is untouched
    assert {"mine", "triton"} <= set(templates.names(path))


def test_malformed_template_names_its_file(tmp_path: Path) -> None:
    write_template(tmp_path, "loose", "description: options at the top\nfreezing: true\n")
    with pytest.raises(ValueError, match=r"'loose' \(file://.*loose.yaml\) must hold.*unexpected keys \['freezing'\]"):
        templates.load("loose", [str(tmp_path)])


def test_listing_command_is_fast_and_shows_user_files(tmp_path: Path) -> None:
    write_template(tmp_path, "mine", "description: my own option set\noptions:\n  freezing: true\n")
    out = subprocess.run([sys.executable, "-c", "import sys; from pipeline.config.templates import main; "
                          "main(sys.argv[1:]); assert 'torch' not in sys.modules", "--config-dir", str(tmp_path)],
                         cwd=ROOT, capture_output=True, text=True, timeout=60, check=True).stdout
    for name in [*MODE_BACKENDS, *TEMPLATE_BACKENDS, *SHIPPED_TEMPLATES, "inductor_all"]:
        assert f"  {name} " in out, name
    assert "my own option set" in out and "mode=reduce-overhead" in out and "template=freezing" in out


def test_device_notes() -> None:
    from pipeline.config import inductor_options as io

    cpu, cuda, xpu = torch.device("cpu"), torch.device("cuda"), torch.device("xpu")  # no device needed
    assert set(io.ineffective(SHIPPED_TEMPLATES["max_autotune"], cpu)) == {"coordinate_descent_tuning"}
    assert set(io.ineffective({"cpp.simdlen": 8, "cpp_wrapper": True}, cuda)) == {"cpp.simdlen"}
    assert "max_autotune_gemm" in io.ineffective({"triton.enable_persistent_tma_matmul": True}, xpu)[
        "triton.enable_persistent_tma_matmul"]
    assert io.ineffective(SHIPPED_TEMPLATES["tma"], xpu) == {}
    assert io.pinned(SHIPPED_TEMPLATES["triton"]) == ["cpp_wrapper"]
    assert io.unsupported_reason({"triton.cudagraphs": True}, cpu).startswith("triton.cudagraphs=True, which records")
    assert io.unsupported_reason({"triton.cudagraphs": True}, cuda) is None


def test_describe_carries_resolved_options(compose_cfg) -> None:
    backend = backends.create(Candidate.of("inductor_freezing", backend_cfg(compose_cfg, "inductor_freezing")))
    described = backend.describe()
    assert described["template"] is None and described["options"] == {"freezing": True}
    assert "[template freezing]" in described["description"]
    # A checkpoint rebuilds from this dict alone: no template lookup, the same torch.compile call.
    rebuilt = backends.create(Candidate.of("inductor_freezing", {k: v for k, v in described.items() if k != "name"}))
    assert rebuilt.compile_kwargs() == backend.compile_kwargs()


@pytest.fixture(scope="module")
def cpu_run(tmp_path_factory):
    """One pipeline run on CPU through the CPU-capable templates; the rest must be skipped."""
    names = ["eager", "inductor_triton", "inductor_freezing", "inductor_max_autotune_template", *CPU_SKIPPED]
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        cfg = compose(config_name="config", overrides=[
            *TINY, "model.batch_sizes=[1,2]", f"backends=[{','.join(names)}]", "validate.extra_batch_sizes=[]",
            # Deploy the freezing backend so validate reloads it from the checkpoint (describe()).
            "route=one_backend", "route.backend=inductor_freezing",
            "profile.screen=false"])  # every backend stays built: the tests call each one
    with open_dict(cfg.backends):  # autocast rides on any backend; here a template backend in bf16
        cfg.backends.inductor_triton_bf16 = OmegaConf.merge(OmegaConf.structured(LOOSE_KINDS["inductor"]), {
            "template": "triton", "autocast_enabled": True, "autocast_dtype": "bfloat16"})
    before = torch._inductor.config.get_config_copy()
    portable = torch._inductor.config.save_config_portable()
    ctx = run(cfg, tmp_path_factory.mktemp("templates_run"))
    return ctx, before, portable


def test_global_inductor_config_unchanged_by_a_run(cpu_run) -> None:
    ctx, before, portable = cpu_run
    assert ctx.outcomes["inductor_freezing"].status == "ok"
    after = torch._inductor.config.get_config_copy()
    assert {k for k in before if before[k] != after[k]} == set()
    assert torch._inductor.config.save_config_portable() == portable


def test_cpu_templates_run_and_match_eager(cpu_run) -> None:
    ctx = cpu_run[0]
    for name in ("inductor_triton", "inductor_freezing", "inductor_max_autotune_template"):
        outcome = ctx.outcomes[name]
        assert outcome.status == "ok", (name, outcome.reason)
        assert outcome.max_rel_error <= outcome.tolerance == tolerance(None)
    assert ctx.validation["ok"]
    reloaded = [r for r in ctx.validation["rows"] if r["check"] == "reloaded"]
    assert reloaded and {r["backend"] for r in reloaded} == {"inductor_freezing"}


def test_cuda_only_settings_are_skipped_on_cpu_with_reasons(cpu_run) -> None:
    ctx = cpu_run[0]
    expected = {"inductor_cudagraphs": "template 'cudagraphs' sets triton.cudagraphs=True",
                "inductor_tma": "template 'tma' sets triton.enable_persistent_tma_matmul=True",
                "inductor_reduce_overhead": "mode=reduce-overhead sets triton.cudagraphs=True",
                "inductor_max_autotune": "mode=max-autotune sets triton.cudagraphs=True"}
    for name, start in expected.items():
        outcome = ctx.outcomes[name]
        assert outcome.status == "skipped" and outcome.reason.startswith(start), (name, outcome.reason)
        assert "not cpu" in outcome.reason
    recorded = json.loads((ctx.run_dir / "capture.json").read_text())
    assert recorded["inductor_tma"]["status"] == "skipped"


def test_autocast_bf16_backend_passes_capture_with_the_looser_tolerance(cpu_run) -> None:
    ctx = cpu_run[0]
    outcome = ctx.outcomes["inductor_triton_bf16"]
    assert outcome.status == "ok", outcome.reason
    assert outcome.tolerance == tolerance(torch.bfloat16) > tolerance(None)
    assert 0 < outcome.max_rel_error <= outcome.tolerance  # it did compute in bf16
    backend = ctx.backends["inductor_triton_bf16"]
    assert backend.candidate.compute_dtype == torch.bfloat16
    assert backend(x=torch.randn(2, 16)).dtype == torch.bfloat16


def user_config_dir(root: Path) -> Path:
    """A user config directory with its own backend and template, as a user would check in."""
    write_template(root, "graphs_and_tuning", "description: user set\noptions:\n"
                   "  triton.cudagraphs: true\n  max_autotune: true\n")
    (root / "backends").mkdir(parents=True, exist_ok=True)
    (root / "backends" / "mine.yaml").write_text(
        "# @package backends.mine\nkind: inductor\ndescription: user backend\ntemplate: graphs_and_tuning\n")
    return root


@pytest.mark.slow
@pytest.mark.parametrize("how", ["--config-dir", "hydra.searchpath"])
def test_user_template_from_config_dir_reaches_the_run(tmp_path: Path, how: str) -> None:
    conf = user_config_dir(tmp_path / "user_conf")
    where = ["--config-dir", str(conf)] if how == "--config-dir" else [f"hydra.searchpath=[file://{conf}]"]
    run_dir = tmp_path / "run"
    subprocess.run([sys.executable, "-m", "pipeline", *where, *TINY, "stages=[capture]", "backends=[eager,mine]",
                    f"hydra.run.dir={run_dir}", "device=cpu"], cwd=ROOT, check=True, timeout=300,
                   capture_output=True, text=True)
    capture = json.loads((run_dir / "capture.json").read_text())
    assert capture["mine"]["status"] == "skipped"
    assert capture["mine"]["reason"].startswith("template 'graphs_and_tuning' sets triton.cudagraphs=True")


@pytest.mark.parametrize("cfg, replays", [
    ({"kind": "eager"}, False), ({"kind": "inductor"}, False),
    ({"kind": "inductor", "mode": "max-autotune-no-cudagraphs"}, False),
    ({"kind": "inductor", "mode": "reduce-overhead"}, True), ({"kind": "inductor", "mode": "max-autotune"}, True),
    ({"kind": "inductor", "template": "cudagraphs"}, True),
    ({"kind": "inductor", "options": {"triton.cudagraphs": True}}, True),
    ({"kind": "graph"}, True), ({"kind": "graph", "compile_with_inductor": True}, True),
])
def test_each_backend_says_whether_its_calls_replay_device_graphs(cfg, replays) -> None:
    # The profile's device-time cross-check captures only backends that answer False.
    assert backends.create(Candidate.of("b", cfg)).records_cuda_graphs is replays


@pytest.mark.gpu
def test_cuda_graph_templates_clone_outputs_on_cuda() -> None:
    from pipeline.models import MLP

    device = torch.device("cuda")
    model = MLP(16, 2).eval().to(device)
    for name, cfg in [("inductor_cudagraphs", {"kind": "inductor", "template": "cudagraphs"}),
                      ("inductor_reduce_overhead", {"kind": "inductor", "mode": "reduce-overhead"})]:
        torch._dynamo.reset()
        backend = backends.create(Candidate.of(name, cfg))
        assert backend.unsupported_reason(device) is None and backend.records_cuda_graphs
        x1, x2 = torch.randn(4, 16, device=device), torch.randn(4, 16, device=device)
        backend.build(model, {"x": x1}, device, [4])
        y1 = backend(x=x1)
        y2 = backend(x=x2)  # a replay that would overwrite y1 without the clone
        with torch.inference_mode():
            torch.testing.assert_close(y1, model(x1), rtol=5e-3, atol=5e-3)
            torch.testing.assert_close(y2, model(x2), rtol=5e-3, atol=5e-3)
