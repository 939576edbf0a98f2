"""Smallest Python-on-GPU call: a crash here is a binding/JIT problem, not a kernel one."""
import faulthandler
import sys

faulthandler.enable()
import torch

import flashport

print("backends:", flashport._C.available_backends() if hasattr(flashport._C, "available_backends") else "?", flush=True)
q, k, v = (torch.randn(1, 64, 2, 64, device="cuda", dtype=torch.bfloat16) for _ in range(3))
print("calling flash_attn_func", flush=True)
out = flashport.flash_attn_func(q, k, v, causal=True)
torch.cuda.synchronize()
ref = torch.nn.functional.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                                       is_causal=True).transpose(1, 2)
print("max err", (out.float() - ref.float()).abs().max().item(), flush=True)
sys.exit(0)
