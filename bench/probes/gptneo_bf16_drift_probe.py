# Issue 56 probe: is GPT-Neo's refusal in the suite (call BM: eager.bf16 at cosine 0.9729 against fp32 eager, under
# route.accuracy_budget's 0.999) the model's own bf16 drift rather than a compile's? Its default config (24 layers of
# 2048, random weights), one sample of 128 tokens, logits under bf16 autocast and with bf16 weights against fp32, on
# the CPU (2026-12-06, torch 2.14.1: 0.9707 and 0.9707; about 6 s a forward on 2 cores, 6 GB of memory):
#     python bench/probes/gptneo_bf16_drift_probe.py
import copy
import torch
from transformers import GPTNeoConfig, GPTNeoForCausalLM


def cosine(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.double().flatten(), b.double().flatten()
    return float(a @ b / (a.norm() * b.norm()))


torch.manual_seed(0)
model = GPTNeoForCausalLM(GPTNeoConfig()).eval()
ids = torch.randint(0, model.config.vocab_size, (1, 128))
with torch.no_grad():
    fp32 = model(input_ids=ids, use_cache=False).logits
    with torch.autocast("cpu", dtype=torch.bfloat16):
        autocast = model(input_ids=ids, use_cache=False).logits
    bf16_weights = copy.deepcopy(model).to(torch.bfloat16)(input_ids=ids, use_cache=False).logits
print("bf16 autocast logits cosine against fp32:", round(cosine(autocast.float(), fp32), 4))
print("bf16 weights logits cosine against fp32:", round(cosine(bf16_weights.float(), fp32), 4))
