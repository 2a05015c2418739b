"""Probe (issue 56's CPU table): is the ONNX Runtime session a checkpoint load opens built differently from the
tune's own session of the same graph, and does it cost time? On a 16-core host (threads 4, resnet18 at 64x64) the
tune's profile read 8.68 ms at batch 8, the loaded route 8.48 and the table's fresh backend 7.12 (at 3: 2.90 / 2.94 /
4.08); sessions built the same way agree within 1.04-1.12 there (``ort_session_probe.py``).

In one process it builds the backend as a tune does (``OnnxRuntimeBackend``: export, a session at the configured
level, the optimised graph kept) and opens that graph as a load does (``OnnxModel.runner``: the saved bytes,
optimisation off), then:

1. compares the two sessions: their options and config entries; the saved graph's nodes, and that graph optimised
   again at the tune's level; the nodes each session runs by name and op (ONNX Runtime's own profile of a twin of
   each, built the same way);
2. times them call for call, the order rotating each turn, at batch 1, 3 and 8 (each round's median, several rounds),
   with a second tune-built session as the control for how much two identical sessions differ here.

Found on the shared 2-core development machine (2026-12-06, onnxruntime 1.32.0, torch 2.14.1, threads 2, other
workers' runs beside it): the sessions differ only in graph_optimization_level (all | disable); the saved graph is
the 25 nodes the tune's session runs (20 NCHWc convolutions, a NCHWc max pool, a reorder, ReduceMean, Reshape, Gemm),
node for node, and optimising it again at ``all`` changes nothing; prepacking happens in both, at session
initialisation, gated by ``session_state.disable_prepacking`` alone (unset in both), not by the level. Timed in
five runs, the loaded session's median ratio to the tune's was 0.94-1.08 at every size (one cell 1.34, where the twin
read 1.34 too), the twin's 0.86-1.04, the checkpoint's own session 0.99-1.07 (four runs): no difference beyond two
identical sessions'.

Run from the repository root: ``PYTHONPATH=$PWD python bench/probes/ort_loaded_session_probe.py [model.tweak]``
(THREADS in the environment sets torch's and the sessions' threads, 2 by default; ROUNDS and CALLS the timing).
Given the checkpoint of a run that routed ONNX Runtime for resnet18 at 64x64 (``python -m pipeline model=resnet18
'model.inputs.x.shape=[3,64,64]' device=cpu 'backends=[eager,onnxruntime]' threads=2 ...``), its weights are loaded
first and its own loaded session joins the timing."""
import collections
import json
import os
import statistics
import sys
import tempfile
import time

import onnx
import onnxruntime
import torch
import torchvision

import pipeline
from pipeline.backends import create
from pipeline.backends.candidate import Candidate
from pipeline.backends.exported import export
from pipeline.backends.onnxruntime import session_options
from pipeline.compile.runtimes import OnnxModel

THREADS = int(os.environ.get("THREADS", 2))
ROUNDS, CALLS = int(os.environ.get("ROUNDS", 5)), int(os.environ.get("CALLS", 40))
SIZES = [1, 3, 8]
ENTRIES = ["session.intra_op.allow_spinning", "session.inter_op.allow_spinning", "session_state.disable_prepacking",
           "session.set_denormal_as_zero", "session.use_env_allocators", "session.disable_cpu_ep_fallback"]

torch.manual_seed(0)
torch.set_num_threads(THREADS)
model = torchvision.models.resnet18().eval()
served = pipeline.load(sys.argv[1], model, trust_compiled=True) if len(sys.argv) > 1 else None
sample = {"x": torch.randn(8, 3, 64, 64)}


def tune_backend():
    backend = create(Candidate.of("onnxruntime", {"kind": "onnxruntime", "threads": THREADS}))
    backend.build(model, sample, torch.device("cpu"), SIZES, exact_sizes=SIZES)
    return backend


tuned = tune_backend()
saved = tuned.serialized()
manifest = {"inputs": [{"name": "x"}], "threads": THREADS}
sessions = {"tune": tuned.runner, "tune twin": tune_backend().runner,
            "loaded": OnnxModel().runner(saved, manifest, THREADS)}
if served is not None:
    sessions["checkpoint"] = served.backends["onnxruntime"].runner


def options(session):
    o = session.get_session_options()
    fields = ["intra_op_num_threads", "inter_op_num_threads", "graph_optimization_level", "execution_mode",
              "enable_cpu_mem_arena", "enable_mem_pattern", "enable_mem_reuse", "use_per_session_threads"]
    return {**{f: str(getattr(o, f)) for f in fields}, **{e: entry(o, e) for e in ENTRIES}}


def entry(o, key):
    try:
        return o.get_session_config_entry(key)
    except RuntimeError:  # not set
        return "unset"


print(f"onnxruntime {onnxruntime.__version__}, torch {torch.__version__}, threads {THREADS}, cores {os.cpu_count()}")
print("\n1. options (tune | loaded), differences only:")
ot, ol = options(sessions["tune"].session), options(sessions["loaded"].session)
for key in ot:
    if ot[key] != ol[key]:
        print(f"  {key}: {ot[key]} | {ol[key]}")
print(f"  (the same in both: {', '.join(f'{k} {v}' for k, v in ot.items() if ol[k] == v)})")
if served is not None:
    oc = options(sessions["checkpoint"].session)
    print(f"  the checkpoint's session differs from the loaded one in: {[k for k in oc if oc[k] != ol[k]]}")


def ops(graph):
    return collections.Counter(f"{n.domain + ':' if n.domain else ''}{n.op_type}" for n in graph.node)


def profiled(source, level):
    """What a session over ``source`` at ``level`` runs: its nodes by name (op type, and the summed kernel ms at batch
    8), from ONNX Runtime's own profile of 20 calls."""
    o = session_options(THREADS, level)
    o.enable_profiling = True
    o.profile_file_prefix = os.path.join(tempfile.mkdtemp(), "p")
    s = onnxruntime.InferenceSession(source, o, providers=["CPUExecutionProvider"])
    feed = {"x": torch.randn(8, 3, 64, 64).numpy()}
    for _ in range(20):
        s.run(None, feed)
    with open(s.end_profiling()) as f:
        events = [e for e in json.load(f) if e.get("cat") == "Node" and e["name"].endswith("_kernel_time")]
    nodes = {e["name"].removesuffix("_kernel_time"): e["args"]["op_name"] for e in events}
    ms = collections.Counter()
    for e in events:
        ms[e["args"]["op_name"]] += e["dur"] / 20 / 1e3
    return nodes, ms


folder = tempfile.mkdtemp()
raw = os.path.join(folder, "model.onnx")
torch.onnx.export(export(model, sample), (), dynamo=True, input_names=["x"], verbose=False).save(raw)
graph = onnx.load_from_string(saved).graph
print(f"\n   saved graph: {len(graph.node)} nodes {dict(ops(graph))}")
again = session_options(THREADS, "all")  # the saved graph opened at the tune's level: is anything left to optimise?
again.optimized_model_filepath = os.path.join(folder, "again.onnx")
onnxruntime.InferenceSession(saved, again, providers=["CPUExecutionProvider"])
print(f"   saved graph optimised again at 'all': {dict(ops(onnx.load(again.optimized_model_filepath).graph))}")
run_tune, ms_tune = profiled(raw, "all")
run_load, ms_load = profiled(saved, "disable")
print(f"   tune's session runs   {len(run_tune)} nodes {dict(collections.Counter(run_tune.values()))}")
print(f"   loaded session runs   {len(run_load)} nodes {dict(collections.Counter(run_load.values()))}")
print(f"   the same nodes by name and op: {run_tune == run_load}")
print("   kernel ms at batch 8 by op, tune | loaded: "
      + ", ".join(f"{k} {ms_tune.get(k, 0):.2f}|{ms_load.get(k, 0):.2f}" for k in sorted(set(ms_tune) | set(ms_load))))

print(f"\n2. timing, call for call in turn (the order rotates each turn), {ROUNDS} rounds of {CALLS} calls each: each "
      f"round's median ms, then each session's ratio to the tune's session round by round (median, min-max)")
inputs = {bs: [torch.randn(bs, 3, 64, 64)] for bs in SIZES}
names = list(sessions)
for bs in SIZES:
    for run in sessions.values():
        for _ in range(5):
            run(inputs[bs])
    per = {name: [] for name in names}
    for _ in range(ROUNDS):
        times = {name: [] for name in names}
        for turn in range(CALLS):
            for name in names[turn % len(names):] + names[:turn % len(names)]:
                start = time.perf_counter()
                sessions[name](inputs[bs])
                times[name].append(time.perf_counter() - start)
        for name in names:
            per[name].append(statistics.median(times[name]) * 1e3)
    print(f"  bs {bs}: " + "  ".join(f"{name} {statistics.median(v):.2f}" for name, v in per.items()))
    for name in names[1:]:
        ratios = [a / b for a, b in zip(per[name], per["tune"])]
        print(f"        {name:>10} / tune: x{statistics.median(ratios):.3f} ({min(ratios):.3f}-{max(ratios):.3f})",
              flush=True)
