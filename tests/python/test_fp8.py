"""FP8: FA3-style descales on fp8 inputs, and the dynamic-quantisation *_fp8_func entry points. Errors are
measured against the float64 result of the same quantised inputs (SPEC: relative to the bf16 result)."""

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import flashport  # noqa: E402
from reference import attention_ref, check_rule, varlen_ref  # noqa: E402

E4M3 = torch.float8_e4m3fn


def quantize_ref(x, hk, cu=None, fp8=E4M3, fp8_max=448.0):
    """The test's own per-(sequence, kv head) amax quantiser: (dequantised float64 values, fp8, descale)."""
    xf = x.detach().cpu().double()
    if cu is None:
        groups = [xf[b] for b in range(x.shape[0])]
    else:
        groups = [xf[int(cu[b]) : int(cu[b + 1])] for b in range(len(cu) - 1)]
    descale = torch.ones(len(groups), hk, dtype=torch.float32)
    for b, g in enumerate(groups):
        for h in range(hk):
            heads = g.reshape(g.shape[0], hk, x.shape[-2] // hk, g.shape[-1])[:, h]
            amax = heads.abs().max().item() if heads.numel() else 0.0
            descale[b, h] = amax / fp8_max if amax > 0 else 1.0
    token_scale = descale if cu is None else descale[torch.searchsorted(cu[1:].long(), torch.arange(x.shape[0]), right=True)]
    shape = (x.shape[0], 1, hk, 1, 1) if cu is None else (x.shape[0], hk, 1, 1)
    grouped = x.detach().cpu().float().reshape(x.shape[:-2] + (hk, -1, x.shape[-1]) if cu is not None else
                                               (x.shape[0], x.shape[1], hk, -1, x.shape[-1]))
    x8 = (grouped / token_scale.reshape(shape)).reshape(x.shape).to(fp8)
    deq = (x8.double().reshape(grouped.shape) * token_scale.double().reshape(shape)).reshape(x.shape)
    return deq, x8, descale


def factor(device):
    # GPU fp8 kernels may round P to fp8 as well, which the bf16 baseline does not.
    return 2.0 if device == "cpu" else 8.0


@pytest.mark.parametrize("fp8", [torch.float8_e4m3fn, torch.float8_e5m2], ids=str)
def test_fa3_descales(device, fp8):
    b, sq, sk, hq, hk, d = 2, 17, 29, 4, 2, 64
    fp8_max = 448.0 if fp8 == torch.float8_e4m3fn else 57344.0
    q, k, v = torch.randn(b, sq, hq, d), torch.randn(b, sk, hk, d), torch.randn(b, sk, hk, d)
    (qd, q8, sq_), (kd, k8, sk_), (vd, v8, sv_) = (quantize_ref(x, hk, fp8=fp8, fp8_max=fp8_max) for x in (q, k, v))
    to = lambda t: t.to(device)
    out = flashport.flash_attn_func(to(q8), to(k8), to(v8), causal=True, q_descale=to(sq_), k_descale=to(sk_),
                                    v_descale=to(sv_))
    assert out.dtype == torch.bfloat16 and out.shape == (b, sq, hq, d)
    ref, _ = attention_ref(qd, kd, vd, causal=True)
    base, _ = attention_ref(qd.bfloat16(), kd.bfloat16(), vd.bfloat16(), causal=True, upcast=False)
    check_rule(out, ref, base, factor(device))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32], ids=str)
def test_flash_attn_fp8_func(device, dtype):
    b, sq, sk, hq, hk, d = 2, 23, 31, 6, 2, 64
    q = torch.randn(b, sq, hq, d, dtype=dtype, device=device) * 3
    k, v = (torch.randn(b, sk, hk, d, dtype=dtype, device=device) for _ in range(2))
    dout = torch.randn(b, sq, hq, d, dtype=dtype, device=device)
    leaves = [x.clone().requires_grad_() for x in (q, k, v)]
    out = flashport.flash_attn_fp8_func(*leaves, causal=True)
    assert out.dtype == dtype and out.shape == q.shape
    got = torch.autograd.grad(out, leaves, dout)
    deq = [quantize_ref(x, hk)[0].requires_grad_() for x in (q, k, v)]
    ref = attention_ref(*deq, causal=True)[0]
    ref_grads = torch.autograd.grad(ref, deq, dout.cpu().double())
    # SPEC measures fp8 attention against the bf16 result on the dequantised inputs, whatever the input
    # dtype: the fp8 kernels compute P in bf16 (the CUDA portable one does), so a float16 baseline would
    # ask for more than the contract (on the H200 the float16 output measured 5x its own baseline's
    # error at the median over 40 seeds, 30x at worst).
    low = [x.detach().bfloat16().requires_grad_() for x in deq]
    base = attention_ref(*low, causal=True, upcast=False)[0]
    base_grads = torch.autograd.grad(base, low, dout.cpu().bfloat16())
    check_rule(out, ref, base, factor(device))
    # The backward differentiates at the dequantised inputs rounded to `dtype`, with out and LSE from the
    # fp8 forward (which used fp8 values times fp32 descales): one rounding more than the baseline's own
    # consistent forward. With 3x the gradients failed on about one seed in eight on the CPU (dv in bf16
    # at 3.06x, dk in float32, where both errors are summation-order noise); 5x failed on none of 60. On
    # the H200 (bf16, 40 seeds) the worst ratios were dq 5.4, dk 6.1, dv 4.4: the GPU backward rounds P
    # and dS to the input dtype where the CPU keeps fp32, so the GPU takes the forward's factor 8.
    grad_factor = 5.0 if device == "cpu" else 8.0
    for g, r, bg, n in zip(got, ref_grads, base_grads, ("dq", "dk", "dv")):
        assert g.dtype == dtype
        check_rule(g, r, bg, grad_factor, what=n)


def test_varlen_fp8_funcs(device):
    lens = [9, 0, 14, 3]
    cu = torch.tensor([0] + lens).cumsum(0).to(torch.int32)
    hq, hk, d = 4, 2, 32
    q = torch.randn(sum(lens), hq, d, dtype=torch.bfloat16)
    k, v = (torch.randn(sum(lens), hk, d, dtype=torch.bfloat16) for _ in range(2))
    out = flashport.flash_attn_varlen_fp8_func(q.to(device), k.to(device), v.to(device), cu.to(device),
                                               cu.to(device), max(lens), max(lens), causal=True)
    deq = [quantize_ref(x, hk, cu)[0] for x in (q, k, v)]
    ref, _ = varlen_ref(*deq, cu, cu, causal=True)
    base, _ = varlen_ref(*(x.bfloat16() for x in deq), cu, cu, causal=True, upcast=False)
    check_rule(out, ref, base, factor(device))
    # Packed: one cu_seqlens, every head count equal.
    qkv = torch.randn(sum(lens), 3, hk, d, dtype=torch.bfloat16, device=device, requires_grad=True)
    out = flashport.flash_attn_varlen_qkvpacked_fp8_func(qkv, cu.to(device), max(lens))
    out.sum().backward()
    assert qkv.grad.shape == qkv.shape and torch.isfinite(qkv.grad).all()


@pytest.mark.parametrize("varlen", [False, True])
def test_quantisation_matches_the_reference_bitwise(device, varlen):
    """The device quantiser gives the reference's descales and fp8 bytes exactly. (torch's CUDA division
    by a Python scalar multiplies by the reciprocal: descales one ulp off flipped fp8 rounding ties, and
    test_varlen_fp8_funcs failed in about 5% of runs on the H200.)"""
    from flashport import _torch_fp8

    hk = 2
    for _ in range(20):
        cu = torch.tensor([0, 9, 9, 23, 26], dtype=torch.int32) if varlen else None
        x = (torch.randn(26, 4, 32) if varlen else torch.randn(3, 11, 4, 32)).bfloat16()
        x8, descale = _torch_fp8.quantize(x.to(device), hk, None if cu is None else cu.to(device), E4M3)
        _, ref8, ref_descale = quantize_ref(x, hk, cu)
        assert torch.equal(descale.cpu(), ref_descale)
        assert torch.equal(x8.cpu().view(torch.uint8), ref8.view(torch.uint8))


def test_qkvpacked_fp8(device):
    qkv = torch.randn(2, 11, 3, 2, 40, dtype=torch.bfloat16, device=device)
    out = flashport.flash_attn_qkvpacked_fp8_func(qkv, causal=True)
    same = flashport.flash_attn_fp8_func(qkv[:, :, 0], qkv[:, :, 1], qkv[:, :, 2], causal=True)
    assert torch.equal(out, same)


def test_numpy_fp8_matches_torch():
    rng = np.random.default_rng()
    q, k, v = (rng.standard_normal((2, 13, 2, 32)).astype(np.float32) for _ in range(3))
    out_np = flashport.flash_attn_fp8_func(q, k, v, causal=True)
    out_t = flashport.flash_attn_fp8_func(*(torch.from_numpy(x) for x in (q, k, v)), causal=True)
    assert isinstance(out_np, np.ndarray) and out_np.dtype == np.float32
    np.testing.assert_array_equal(out_np, out_t.numpy())


@pytest.mark.parametrize("varlen", [False, True])
def test_quantize_numpy_and_torch_share_the_scale_rule(varlen):
    """One scale rule (_common.fp8_descale): an all-zero group and a group whose amax / fp8_max underflows
    both get descale 1 (finite fp8 data), identically in the numpy and torch paths."""
    from flashport import _numpy_path, _torch_fp8

    rng = np.random.default_rng(3)
    x = rng.standard_normal((2, 5, 4, 8)).astype(np.float32)
    x[0, :, 0:2] = 0.0
    x[1, :, 2:4] = 1e-44  # subnormal: 1e-44 / 448 is 0 in fp32
    cu = None
    if varlen:
        x = x.reshape(10, 4, 8)
        cu = np.array([0, 5, 10], np.int32)
    (data, name), descale = _numpy_path.quantize(x, 2, cu)
    x8, descale_t = _torch_fp8.quantize(torch.from_numpy(x), 2, None if cu is None else torch.from_numpy(cu), E4M3)
    np.testing.assert_array_equal(descale, descale_t.numpy())
    np.testing.assert_array_equal(data, x8.view(torch.uint8).numpy())
    assert descale[0, 0] == 1.0 and descale[1, 1] == 1.0
    assert np.isfinite(x8.float().numpy()).all()


def test_fp8_descales_need_fp8_inputs():
    q = torch.randn(1, 4, 2, 32)
    with pytest.raises(ValueError, match="q_descale"):
        flashport.flash_attn_func(q, q, q, q_descale=torch.ones(1, 2))
