import copy, time, sys, types, torch
from torch import nn
import torch._dynamo

REGIONAL = {}
def regional_class(cls):
    if cls not in REGIONAL:
        REGIONAL[cls] = type(cls.__name__, (cls,), {"forward": torch.compiler.nested_compile_region(cls.forward),
                                                     "__module__": cls.__module__})
    return REGIONAL[cls]

def repeated(container):
    kids = list(container.children())
    counts = {}
    for k in kids:
        if any(True for _ in k.children()):
            counts[type(k)] = counts.get(type(k), 0) + 1
    return {c for c, n in counts.items() if n >= 2}

def regional_view(m):
    reps = repeated(m)
    c = copy.copy(m)
    c._modules = dict(m._modules)
    changed = False
    for name, child in m._modules.items():
        if child is None: continue
        if type(child) in reps:
            cc = copy.copy(child); cc.__class__ = regional_class(type(child)); c._modules[name] = cc; changed = True
        else:
            sub, ch = regional_view(child)
            if ch: c._modules[name] = sub; changed = True
    return (c if changed else m), changed

def run(model, x, label):
    model = model.eval()
    with torch.no_grad():
        ref = model(**x)
    for regional in (False, True):
        torch._dynamo.reset()
        m = regional_view(model)[0] if regional else model
        f = torch.compile(m, dynamic=None)
        t = time.perf_counter()
        with torch.no_grad():
            out = f(**x)
        dt = time.perf_counter() - t
        o = out[0] if isinstance(out, tuple) else getattr(out, "last_hidden_state", out)
        r = ref[0] if isinstance(ref, tuple) else getattr(ref, "last_hidden_state", ref)
        print(label, "regional" if regional else "full", f"compile {dt:.1f}s", "maxdiff", (o - r).abs().max().item(), flush=True)

import torchvision, transformers
which = sys.argv[1:]
if "gpt2" in which:
    cfg = transformers.GPT2Config(n_layer=4, n_embd=128, n_head=4)
    run(transformers.GPT2Model(cfg), {"input_ids": torch.randint(0, 1000, (2, 16))}, "gpt2")
if "vit" in which:
    run(torchvision.models.VisionTransformer(image_size=32, patch_size=8, num_layers=4, num_heads=2, hidden_dim=64, mlp_dim=128), {"x": torch.randn(2, 3, 32, 32)}, "vit")
if "resnet" in which:
    run(torchvision.models.resnet18(), {"x": torch.randn(2, 3, 64, 64)}, "resnet18")
if "bert" in which:
    cfg = transformers.BertConfig(num_hidden_layers=4, hidden_size=128, num_attention_heads=4, intermediate_size=256)
    run(transformers.BertModel(cfg), {"input_ids": torch.randint(0, 1000, (2, 16)), "attention_mask": torch.ones(2, 16, dtype=torch.long)}, "bert")
