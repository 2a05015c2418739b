"""Probe (issue 56, 2026-12-06): what a runtime's leftovers bill the callable timed after it in the profile's
interleaved rounds, and whether blocks of calls of one callable per visit (settling calls untimed, then timed ones)
remove it. resnet18 at 64x64, THREADS threads each (2 by default), eager, ONNX Runtime (spinning as the pipeline sets
it: off where the cores hold fewer than twice its threads) and OpenVINO (LATENCY hint, f32), each alone, together as
the profile times them, and together in blocks (settle, timed) of (1, 1), (0, 3), (1, 2), (1, 4).

On the 2-core development machine (REPS=2, medians in ms): together, every runtime read slower than alone at batch 1
(ONNX Runtime 3.61-3.77 against 2.59-3.37, OpenVINO 3.62-3.89 against 2.54-3.32, eager 8.62-9.50 against 7.88-8.05)
and OpenVINO and eager at batch 8 (16.4-17.7 against 15.2-15.4; 22.2-22.9 against 20.4-21.0); blocks brought the
batch-8 cells back within 1-4% of alone, but at batch 1 no block size did so in both repetitions (ONNX Runtime
2.73-3.87 whatever the block): this host cannot tell which fix holds.

On the device host's 16 cores (``THREADS=4 REPS=3 python bench/probes/settle_probe.py``, 2026-12-06, call BA):
together, ONNX Runtime read 48-70% slower than alone at batch 1 (2.13-2.82 against 1.33-1.91 ms) and 15-20% at 8,
OpenVINO up to 57% and eager up to 33%, which put ONNX Runtime behind OpenVINO in a repetition where alone it was
16% ahead; one settling call and 4 timed ones a visit read 0.83-1.27x alone in every cell, within the repetitions'
own spread. The profile now visits that way on the CPU (``profile.cpu_settle_calls``, ``cpu_timed_calls``)."""
import os, sys, tempfile
sys.path.insert(0, str(__import__("pathlib").Path(__file__).resolve().parents[2]))
import onnxruntime, openvino, torch, torchvision
from pipeline.backends.onnxruntime import spins
from pipeline.measure import interleaved as il
THREADS = int(os.environ.get("THREADS", "2"))
torch.manual_seed(0); torch.set_num_threads(THREADS)
m = torchvision.models.resnet18().eval(); x = torch.randn(2, 3, 64, 64)
p = os.path.join(tempfile.mkdtemp(), "m.onnx")
ep = torch.export.export(m, (x,), dynamic_shapes=({0: torch.export.Dim.DYNAMIC},))
torch.onnx.export(ep, (), dynamo=True, input_names=["x"]).save(p)
o = onnxruntime.SessionOptions(); o.intra_op_num_threads = THREADS; o.inter_op_num_threads = 1
o.add_session_config_entry("session.intra_op.allow_spinning", "1" if spins(None, THREADS) else "0")
sess = onnxruntime.InferenceSession(p, o, providers=["CPUExecutionProvider"])
conv = openvino.convert_model(ep, input=[openvino.PartialShape([-1, 3, 64, 64])])
ov = openvino.Core().compile_model(conv, "CPU", {"INFERENCE_NUM_THREADS": THREADS, "PERFORMANCE_HINT": "LATENCY",
                                                 "INFERENCE_PRECISION_HINT": "f32"})
req = ov.create_infer_request()
cpu = torch.device("cpu")
for rep in range(int(os.environ.get("REPS", "2"))):
    for bs in (1, 8):
        xi = torch.randn(bs, 3, 64, 64); arr = xi.numpy()
        fns = {"onnxruntime": lambda: sess.run(None, {"x": arr}),
               "openvino": lambda: req.infer([arr], share_inputs=True, share_outputs=False)}
        def eager():
            with torch.inference_mode():
                return m(xi)
        fns["eager"] = eager
        med = lambda d: {k: round(v.summary()["median_ms"], 2) for k, v in d.items()}
        visits = lambda settle, timed: {"cpu_settle_calls": settle, "cpu_timed_calls": timed}
        alone = {}
        for k, f in fns.items():
            alone.update(med(il.measure_interleaved({k: f}, cpu, visits(0, 1))))
        together = med(il.measure_interleaved(fns, cpu, visits(0, 1)))  # one timed call a visit: the profile before
        print(f"rep {rep} bs {bs}: alone {alone}\n   together {together}", flush=True)
        for settle, timed in ((1, 1), (0, 3), (1, 2), (1, 4)):
            print(f"   settle {settle} timed {timed}: {med(il.measure_interleaved(fns, cpu, visits(settle, timed)))}",
                  flush=True)
