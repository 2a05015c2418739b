"""Probe for issue 39's GPU part (next device session): a program loaded with no Dynamo trace on torch 2.11, where
AOTInductor's CUDA runtime faults (aot-h200-runner.log). The model's Dynamo graph (batch dimension dynamic, weights
lifted as graph inputs) is compiled by ``torch._inductor.standalone_compile(..., aot=True)`` (a bundled
AOTAutograd entry: Inductor's Python wrapper and its kernels, no FX-graph cache needed) and saved; a fresh process
loads it with ``CompiledArtifact.load`` and calls it with the weights bound by name and the batch size as the
symbolic input: no Dynamo frame is traced (``dynamo_frames`` 0). On the 2-core CPU machine (torch 2.14): MLP saved
in 3.1 s, loaded in 3.4 s, outputs equal at batch 1, 5 and 64.

    python bench/results/raw/standalone_probe.py save resnet50 cuda OUT   # then, in a fresh process:
    python bench/results/raw/standalone_probe.py load resnet50 cuda OUT
"""
import json
import os
import sys
import time

t0 = time.perf_counter()
import torch  # noqa: E402

import_s = time.perf_counter() - t0
mode, name, device, folder = sys.argv[1], sys.argv[2], torch.device(sys.argv[3]), sys.argv[4]
SIZES = (1, 5, 64)


def model_and_inputs():
    """The model as a graph backend compiles it on the GPU (bf16 weights, channels-last images), random weights."""
    torch.manual_seed(0)
    if name == "mlp":
        model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 8))
        shape, fmt = (32,), torch.contiguous_format
    else:
        import torchvision
        model, shape, fmt = torchvision.models.resnet50(), (3, 224, 224), torch.channels_last
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    model = model.eval().to(device, dtype).to(memory_format=fmt)
    return model, {bs: torch.randn(bs, *shape, device=device, dtype=dtype).contiguous(memory_format=fmt)
                   for bs in SIZES}


model, inputs = model_and_inputs()
named = {**dict(model.named_parameters()), **dict(model.named_buffers())}
path = os.path.join(folder, f"{name}-{device.type}.bin")
if mode == "save":
    captured = {}

    def backend(gm, example_inputs):
        captured["gm"], captured["inputs"] = gm, list(example_inputs)
        return gm.forward

    x = inputs[64]
    torch._dynamo.mark_dynamic(x, 0)
    with torch.inference_mode():
        torch.compile(model, backend=backend, fullgraph=True)(x)
    by_id = {id(t): n for n, t in named.items()}
    order = [by_id[id(t)] if id(t) in by_id else "<input>" if t is x else "<batch>" for t in captured["inputs"]]
    start = time.perf_counter()
    with torch.inference_mode():
        artifact = torch._inductor.standalone_compile(captured["gm"], captured["inputs"], dynamic_shapes="from_graph",
                                                      aot=True)
    compile_s = time.perf_counter() - start
    os.makedirs(folder, exist_ok=True)
    artifact.save(path=path, format="binary")
    with open(path + ".order.json", "w") as f:
        json.dump(order, f)
    print(json.dumps({"mode": mode, "torch": torch.__version__, "compile_s": round(compile_s, 2), "args": order[:2]
                      + ["..."] + [o for o in order if o.startswith("<")], "bytes": os.path.getsize(path)}))
else:
    with open(path + ".order.json") as f:
        order = json.load(f)
    start = time.perf_counter()
    artifact = torch._inductor.CompiledArtifact.load(path=path, format="binary")
    load_s, calls = time.perf_counter() - start, {}
    with torch.inference_mode():
        for bs, x in inputs.items():
            start = time.perf_counter()
            out = artifact(*[x if n == "<input>" else bs if n == "<batch>" else named[n] for n in order])
            out = out[0] if isinstance(out, (list, tuple)) else out
            if device.type == "cuda":
                torch.cuda.synchronize()
            ref = model(x)
            error = ((out.float() - ref.float()).abs().max() / ref.float().abs().max()).item()
            calls[bs] = {"first_call_s": round(time.perf_counter() - start, 3), "max_rel_error": error}
    from torch._dynamo.utils import counters
    print(json.dumps({"mode": mode, "torch": torch.__version__, "import_torch_s": round(import_s, 2),
                      "load_s": round(load_s, 2), "calls": calls, "dynamo_frames": sum(counters["frames"].values()),
                      "from_start_s": round(time.perf_counter() - t0, 2)}))
