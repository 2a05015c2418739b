"""Probe (issue 56's CPU table, after call AR of 2026-12-05): ONNX Runtime sessions of one graph differ by 1.2-1.4x at
some batch sizes (resnet18 at 3: 2.90 / 4.08 / 2.94 ms; at 8: 8.68 / 7.12 / 8.48 across the tune's, the table's and
the loaded session). Is it the session (thread placement), spinning threads of idle sessions, or the interleaving?

Six sessions over one exported graph, 4 threads each (THREADS in the environment), first beside eager PyTorch,
then timed interleaved round-robin at 1, 3, 8, 17 in three variants: spinning on (ORT's default), spinning off,
and spinning off with each session's threads pinned to its own cores. A session's median per size across three
rounds shows whether a session keeps its speed (placement) or not.

Run on a host of 16 or more cores from the repository root: ``CUDA_VISIBLE_DEVICES= python
bench/probes/ort_session_probe.py``."""
import os
import statistics
import sys
import tempfile
import time

import onnxruntime
import torch
import torchvision

torch.manual_seed(0)
torch.set_num_threads(int(os.environ.get("THREADS", 4)))
model = torchvision.models.resnet18().eval()
x = torch.randn(2, 3, 64, 64)
folder = tempfile.mkdtemp()
path = os.path.join(folder, "m.onnx")
program = torch.export.export(model, (x,), dynamic_shapes=({0: torch.export.Dim.DYNAMIC},))
torch.onnx.export(program, (), dynamo=True, input_names=["x"], verbose=False).save(path)
SIZES = [1, 3, 8, 17]
inputs = {bs: torch.randn(bs, 3, 64, 64).numpy() for bs in SIZES}
cores = os.cpu_count()


def session(spin: bool, pin: int = -1):
    o = onnxruntime.SessionOptions()
    o.intra_op_num_threads = int(os.environ.get("THREADS", 4))
    o.inter_op_num_threads = 1
    o.graph_optimization_level = onnxruntime.GraphOptimizationLevel.ORT_ENABLE_ALL
    o.add_session_config_entry("session.intra_op.allow_spinning", "1" if spin else "0")
    if pin >= 0:  # three worker threads (the caller is the fourth), each on one core of this session's four
        o.add_session_config_entry("session.intra_op_thread_affinities",
                                   ";".join(str(pin * 4 + 2 + i) for i in range(3)))  # 1-based logical processors
    return onnxruntime.InferenceSession(path, o, providers=["CPUExecutionProvider"])


def window(s, bs, n):
    feed = {"x": inputs[bs]}
    for _ in range(3):
        s.run(None, feed)
    t = []
    for _ in range(n):
        a = time.perf_counter(); s.run(None, feed); t.append(time.perf_counter() - a)
    return statistics.median(t) * 1e3


def variant(name, sessions, rounds=3, n=20):
    per = {i: {bs: [] for bs in SIZES} for i in range(len(sessions))}
    t0 = time.perf_counter()
    for _ in range(rounds):
        for bs in SIZES:
            for i, s in enumerate(sessions):
                per[i][bs].append(window(s, bs, n))
    print(f"\n{name} ({time.perf_counter() - t0:.0f} s): median ms per session (rounds' min-max)")
    for bs in SIZES:
        meds = [statistics.median(per[i][bs]) for i in per]
        cells = " ".join(f"{statistics.median(per[i][bs]):6.2f}({min(per[i][bs]):.2f}-{max(per[i][bs]):.2f})"
                         for i in per)
        print(f"  bs {bs:>2}: spread {max(meds) / min(meds):.2f}  {cells}")
    sys.stdout.flush()


def beside_torch(spin: bool, n: int = 30) -> None:
    """One session and the model in eager PyTorch (4 threads each), alone and call for call in turn: what each
    one's spinning threads cost the other (on the 2-core development machine, 2 threads each, eager right after an
    ONNX Runtime call took 18.7 ms with ONNX Runtime's spinning on, 7.5 with it off, 6.0 alone)."""
    s = session(spin)
    for bs in SIZES:
        x = torch.from_numpy(inputs[bs])
        feed = {"x": inputs[bs]}
        alone, eager, ort_after, eager_after = [], [], [], []
        with torch.inference_mode():
            for _ in range(5):
                s.run(None, feed), model(x)
            for _ in range(n):
                a = time.perf_counter(); s.run(None, feed); alone.append(time.perf_counter() - a)
            for _ in range(n):
                a = time.perf_counter(); model(x); eager.append(time.perf_counter() - a)
            for _ in range(n):
                a = time.perf_counter(); s.run(None, feed); b = time.perf_counter(); model(x); c = time.perf_counter()
                ort_after.append(b - a), eager_after.append(c - b)
        ms = lambda v: f"{statistics.median(v) * 1e3:6.2f}"  # noqa: E731
        print(f"  spinning {'on ' if spin else 'off'} bs {bs:>2}: onnxruntime alone {ms(alone)}, after eager "
              f"{ms(ort_after)}; eager alone {ms(eager)}, after onnxruntime {ms(eager_after)}", flush=True)


print("cores", cores, "ort", onnxruntime.__version__)
print("\nbeside eager PyTorch (ms, medians)")
for spin in (True, False):
    beside_torch(spin)
variant("spinning on (default)", [session(True) for _ in range(6)])
variant("spinning off", [session(False) for _ in range(6)])
for i in range(3):  # each session alone in the process: is the spread between sessions, even with no other alive?
    variant(f"spinning on, session {i} alone", [session(True)], rounds=2, n=20)
if cores >= 16:  # four sessions, one per four cores
    variant("spinning off, pinned", [session(False, pin=i) for i in range(4)])
