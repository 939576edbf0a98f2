"""Tensors of more than 2^31 elements on the GPU (64-bit offsets in every kernel): forward and backward
of b 4096 x s 1040 x 8 heads x d 64 (2.18e9 bf16 elements per tensor, ~35 GB in all), checked against the
CPU oracle on sampled sequences, the last ones lying past element 2^31. Opt-in (FLASHPORT_HUGE=1):
it needs a GPU with ~48 GB free and about a minute."""

import os

import pytest

torch = pytest.importorskip("torch")

import flashport  # noqa: E402
from reference import attention_ref, check_rule  # noqa: E402

pytestmark = pytest.mark.skipif(
    os.environ.get("FLASHPORT_HUGE") != "1" or not torch.cuda.is_available(),
    reason="opt-in (FLASHPORT_HUGE=1) and needs a CUDA device with ~48 GB free")


@pytest.mark.parametrize("causal", [True])
def test_more_than_2_pow_31_elements(causal):
    b, s, h, d = 4096, 1040, 8, 64
    assert b * s * h * d > 2**31
    gen = torch.Generator(device="cuda").manual_seed(1)
    make = lambda: torch.randn(b, s, h, d, device="cuda", dtype=torch.bfloat16, generator=gen)
    q, k, v = make().requires_grad_(), make().requires_grad_(), make().requires_grad_()
    out = flashport.flash_attn_func(q, k, v, causal=causal)
    dout = make()
    dq, dk, dv = torch.autograd.grad(out, (q, k, v), dout)
    # Sequences before and after element 2^31 (sequence 2016 starts at 2016 * s * h * d > 2^31).
    for i in (0, b // 2, b - 2, b - 1):
        qi, ki, vi, di = (t[i : i + 1].detach().cpu().requires_grad_() for t in (q, k, v, dout))
        ref, _ = attention_ref(qi, ki, vi, causal=causal)
        base, _ = attention_ref(qi, ki, vi, causal=causal, upcast=False)
        check_rule(out[i : i + 1], ref, base, 3.0, what=f"out[{i}]")
        ref_grads = torch.autograd.grad(ref, (qi, ki, vi), di.double())
        base_grads = torch.autograd.grad(base, (qi, ki, vi), di)
        for name, got, r, bg in zip(("dq", "dk", "dv"), (dq, dk, dv), ref_grads, base_grads):
            check_rule(got[i : i + 1], r, bg, 4.0, what=f"{name}[{i}]")
