"""Probe (issue 56, 2026-12-06): what an ONNX Runtime session whose threads spin between calls costs the backend
timed after it. resnet18 at 64x64, 2 threads each, measured by the profile's own interleaving
(``measure_interleaved``) together and alone, with the session's spinning on (ONNX Runtime's default) and off. On the
2-core development machine: eager read 18.32 ms beside a spinning session and 7.11 alone at batch 1 (50.32 against
20.08 at 8), 8.39 against 6.49 with spinning off; the session itself 2.18 / 2.62 ms alone, spinning on / off.

Run from the repository root: ``python bench/probes/spinning_probe.py``."""
import os
import sys
import tempfile

sys.path.insert(0, str(__import__("pathlib").Path(__file__).resolve().parents[2]))
import onnxruntime, torch, torchvision
from pipeline.measure.interleaved import measure_interleaved
torch.manual_seed(0); torch.set_num_threads(2)
m = torchvision.models.resnet18().eval(); x = torch.randn(2, 3, 64, 64)
p = os.path.join(tempfile.mkdtemp(), "m.onnx")
ep = torch.export.export(m, (x,), dynamic_shapes=({0: torch.export.Dim.DYNAMIC},))
torch.onnx.export(ep, (), dynamo=True, input_names=["x"]).save(p)
def sess(spin):
    o = onnxruntime.SessionOptions(); o.intra_op_num_threads = 2; o.inter_op_num_threads = 1
    o.add_session_config_entry("session.intra_op.allow_spinning", "1" if spin else "0")
    return onnxruntime.InferenceSession(p, o, providers=["CPUExecutionProvider"])
cpu = torch.device("cpu")
for bs in (1, 8):
    xi = torch.randn(bs, 3, 64, 64); feed = {"x": xi.numpy()}
    for spin in (True, False):
        s = sess(spin)
        ort = lambda: s.run(None, feed)
        def eager():
            with torch.inference_mode():
                return m(xi)
        both = measure_interleaved({"onnxruntime": ort, "eager": eager}, cpu, {})
        alone_o = measure_interleaved({"onnxruntime": ort}, cpu, {})
        alone_e = measure_interleaved({"eager": eager}, cpu, {})
        f = lambda d, k: f"{d[k].summary()['median_ms']:.2f}"
        print(f"bs {bs} spinning {spin}: together onnxruntime {f(both,'onnxruntime')} eager {f(both,'eager')}; "
              f"alone onnxruntime {f(alone_o,'onnxruntime')} eager {f(alone_e,'eager')}", flush=True)
