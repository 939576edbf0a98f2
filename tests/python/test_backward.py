"""Gradients against float64 torch autograd through the naive reference (3x rule), dropout masks against
an independent Philox, dropout reproducibility from torch's generator, and deterministic backward."""

import pytest

torch = pytest.importorskip("torch")

import flashport  # noqa: E402
from flashport import _torch_path  # noqa: E402
from reference import attention_ref, check_rule, dropout_keep, philox4x32_10, varlen_ref, work_dtype  # noqa: E402

CASES = {
    # name: (batch, seqlen_q, seqlen_k, nheads, nheads_k, headdim, options)
    "plain_d59": (2, 13, 29, 2, 1, 59, {}),
    "causal_sq_gt_sk": (1, 41, 23, 4, 2, 64, {"causal": True}),
    "window_softcap": (2, 33, 33, 2, 2, 40, {"window_size": (7, 2), "softcap": 5.0}),
    "gqa7_alibi": (1, 17, 9, 7, 1, 32, {"alibi": True, "causal": True}),
    "seqlen1": (3, 1, 1, 2, 2, 64, {}),
}


def grads(fn, inputs, dout):
    inputs = [x.detach().requires_grad_() for x in inputs]
    out = fn(*inputs)
    return out, torch.autograd.grad(out, inputs, dout)


def check_grads(got, ref, base, names=("dq", "dk", "dv")):
    for g, r, b, n in zip(got, ref, base, names):
        assert g.dtype == b.dtype, n
        check_rule(g, r, b, factor=3.0, what=n)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32], ids=str)
@pytest.mark.parametrize("case", CASES, ids=str)
def test_gradients(device, dtype, case):
    b, sq, sk, hq, hk, d, opts = CASES[case]
    opts = dict(opts)
    alibi = torch.rand(hq) * 0.3 if opts.pop("alibi", False) else None
    q = torch.randn(b, sq, hq, d, dtype=dtype, device=device)
    k, v = (torch.randn(b, sk, hk, d, dtype=dtype, device=device) for _ in range(2))
    dout = torch.randn(b, sq, hq, d, dtype=dtype, device=device)
    fa_alibi = None if alibi is None else alibi.to(device)
    out, got = grads(lambda q, k, v: flashport.flash_attn_func(q, k, v, alibi_slopes=fa_alibi, **opts), (q, k, v), dout)
    assert [g.shape for g in got] == [q.shape, k.shape, v.shape]
    kw = {"causal": opts.get("causal", False), "window": opts.get("window_size", (-1, -1)),
          "softcap": opts.get("softcap", 0.0), "alibi": alibi}
    cpu = [x.cpu() for x in (q, k, v)]
    _, ref = grads(lambda q, k, v: attention_ref(q, k, v, **kw)[0], [x.double() for x in cpu], dout.cpu().double())
    _, base = grads(lambda q, k, v: attention_ref(q, k, v, upcast=False, **kw)[0], cpu, dout.cpu())
    check_grads(got, ref, base)


def test_varlen_gradients_with_empty_sequences(device):
    lens_q, lens_k = [5, 0, 11, 3], [8, 0, 4, 0]
    cq = torch.tensor([0] + lens_q, dtype=torch.int32).cumsum(0, dtype=torch.int32).to(device)
    ck = torch.tensor([0] + lens_k, dtype=torch.int32).cumsum(0, dtype=torch.int32).to(device)
    q = torch.randn(sum(lens_q), 4, 32, dtype=torch.bfloat16, device=device)
    k, v = (torch.randn(sum(lens_k), 2, 32, dtype=torch.bfloat16, device=device) for _ in range(2))
    dout = torch.randn_like(q)
    fn = lambda q, k, v: flashport.flash_attn_varlen_func(q, k, v, cq, ck, max(lens_q), max(lens_k), causal=True)
    _, got = grads(fn, (q, k, v), dout)
    cpu = [x.cpu() for x in (q, k, v)]
    rfn = lambda up: lambda q, k, v: varlen_ref(q, k, v, cq.cpu(), ck.cpu(), causal=True, upcast=up)[0]
    _, ref = grads(rfn(True), [x.double() for x in cpu], dout.cpu().double())
    _, base = grads(rfn(False), cpu, dout.cpu())
    check_grads(got, ref, base)


def test_qkvpacked_gradient(device):
    qkv = torch.randn(2, 9, 3, 2, 24, dtype=work_dtype(device), device=device)
    dout = torch.randn(2, 9, 2, 24, dtype=qkv.dtype, device=device)
    _, (g,) = grads(lambda x: flashport.flash_attn_qkvpacked_func(x, causal=True), [qkv], dout)
    assert g.shape == qkv.shape
    packed_ref = lambda up: lambda x: attention_ref(x[:, :, 0], x[:, :, 1], x[:, :, 2], causal=True, upcast=up)[0]
    _, (g_ref,) = grads(packed_ref(True), [qkv.cpu().double()], dout.cpu().double())
    _, (g_base,) = grads(packed_ref(False), [qkv.cpu()], dout.cpu())
    check_rule(g, g_ref, g_base, factor=3.0, what="dqkv")


def _packed_call(kind, x, q, cu, lens, dropout):
    """One of flash-attn's four packed functions on packed x (and q for kv), causal, with dropout."""
    kw = {"causal": True, "dropout_p": dropout, "deterministic": True}
    if kind == "qkv":
        return flashport.flash_attn_qkvpacked_func(x, **kw)
    if kind == "kv":
        return flashport.flash_attn_kvpacked_func(q, x, **kw)
    if kind == "varlen_qkv":
        return flashport.flash_attn_varlen_qkvpacked_func(x, cu, max(lens), **kw)
    return flashport.flash_attn_varlen_kvpacked_func(q, x, cu, cu, max(lens), max(lens), **kw)


@pytest.mark.parametrize("kind", ["qkv", "kv", "varlen_qkv", "varlen_kv"])
@pytest.mark.parametrize("d", [64, 59])
def test_packed_gradient_written_in_place(device, kind, d):
    """The packed functions' backward writes one packed gradient (no stacking of dq, dk, dv where the
    head dim needs no padding) with the same bits as the unpacked call on the same slices: GQA 3:1 for
    kv, varlen with an empty sequence, dropout from the same seed, deterministic on the GPU."""
    dtype = work_dtype(device)
    lens = [7, 0, 12]
    cu = torch.tensor([0, 7, 7, 19], dtype=torch.int32, device=device)
    varlen = kind.startswith("varlen")
    lead = (sum(lens),) if varlen else (2, 11)
    count, hk = (3, 2) if kind.endswith("qkv") else (2, 1)
    x = torch.randn(*lead, count, hk, d, dtype=dtype, device=device)
    q = torch.randn(*lead, 3 * hk if count == 2 else hk, d, dtype=dtype, device=device)
    dout = torch.randn(*lead, q.shape[-2], d, dtype=dtype, device=device)
    inputs = [x] if count == 3 else [x, q]

    def run(packed_call):
        leaves = [t.detach().requires_grad_() for t in inputs]
        torch.manual_seed(7)  # the same dropout mask both ways
        out = packed_call(*leaves)
        return out, torch.autograd.grad(out, leaves, dout)

    out, got = run(lambda x, q=None: _packed_call(kind, x, q, cu, lens, 0.25))
    assert (type(out.grad_fn).__name__ == "_AttentionPackedBackward") == (d % 8 == 0), type(out.grad_fn).__name__

    def unpacked(x, q=None):  # the same call on the slices, through flash_attn_func / flash_attn_varlen_func
        axis = 1 if varlen else 2
        parts = list(x.unbind(axis))
        qq, k, v = parts if count == 3 else [q] + parts
        kw = {"causal": True, "dropout_p": 0.25, "deterministic": True}
        if varlen:
            return flashport.flash_attn_varlen_func(qq, k, v, cu, cu, max(lens), max(lens), **kw)
        return flashport.flash_attn_func(qq, k, v, **kw)

    ref_out, want = run(unpacked)
    assert torch.equal(out, ref_out)
    for g, w in zip(got, want):
        assert g.shape == w.shape and torch.equal(g, w)


def _fused_views(kind, x, b, s, h, d):
    """q, k, v as a model takes them from one fused projection's output y = x * 1 (b, s, 3 h d) (or
    views that must not count as tiling it)."""
    y = x * 1.0
    w = h * d
    if kind == "split":  # nanoGPT / GPT-2: y.split(width, dim=2), each viewed as heads
        return [t.view(b, s, h, d) for t in y.split(w, dim=2)]
    if kind == "unbind":
        return list(y.view(b, s, 3, h, d).unbind(2))
    if kind == "k_q_v":  # the projection's rows hold k, q, v in that order
        k, q, v = (t.view(b, s, h, d) for t in y.split(w, dim=2))
        return [q, k, v]
    if kind == "same":  # self-attention of one tensor: all three the same view
        q = y[..., :w].view(b, s, h, d)
        return [q, q, q]
    if kind == "overlap":  # k starts half a head into q
        strided = lambda off: y.as_strided((b, s, h, d), (s * 3 * w, 3 * w, d, 1), y.storage_offset() + off)
        return [strided(0), strided(d // 2), strided(2 * w)]
    if kind == "no_grad_q":  # q viewed under no_grad: no gradient may reach y through it
        with torch.no_grad():
            q = y[..., :w].view(b, s, h, d)
        return [q] + [t.view(b, s, h, d) for t in y.split(w, dim=2)[1:]]
    if kind in ("hooked_k", "retained_v"):  # someone watches one view's own gradient
        q, k, v = (t.view(b, s, h, d) for t in y.split(w, dim=2))
        k.register_hook(lambda g: g * 2) if kind == "hooked_k" else v.retain_grad()
        return [q, k, v]
    if kind == "partial":  # a fourth slice (say an MLP's) beside q, k, v in the same projection
        z = torch.cat([y, y[..., :w]], dim=2)
        return [t.view(b, s, h, d) for t in z.split(w, dim=2)[:3]]
    raise ValueError(kind)


@pytest.mark.parametrize("kind", ["split", "unbind", "k_q_v", "same", "overlap", "no_grad_q", "hooked_k", "retained_v",
                                  "partial"])
def test_fused_projection_views_share_one_gradient(device, kind):
    """flash_attn_func on views q, k, v that tile one tensor (packed_base) writes their gradients into one
    gradient of it, with the same bits as the call on copies of them; views that overlap or leave part of
    the tensor uncovered take the unpacked path (autograd sums or stacks), with the same result."""
    b, s, h, d = 2, 11, 3, 32
    dtype = work_dtype(device)
    x = torch.randn(b, s, 3 * h * d, dtype=dtype, device=device)
    dout = torch.randn(b, s, h, d, dtype=dtype, device=device)

    def run(copy):
        leaf = x.detach().requires_grad_()
        q, k, v = _fused_views(kind, leaf, b, s, h, d)
        if copy:
            q, k, v = q.contiguous(), k.contiguous(), v.contiguous()
        out = flashport.flash_attn_func(q, k, v, causal=True, deterministic=True)
        return out, torch.autograd.grad(out, leaf, dout)[0]

    out, got = run(copy=False)
    tiles = kind in ("split", "unbind", "k_q_v")
    assert (type(out.grad_fn).__name__ == "_AttentionPackedBackward") == tiles, type(out.grad_fn).__name__
    ref_out, want = run(copy=True)
    assert torch.equal(out, ref_out)
    if tiles:
        assert torch.equal(got, want)
    else:  # autograd adds the views' gradients in its own order (q = k = v: three into one), so in fp16
        # (CUDA) its sums may round differently: a few ulps of the largest gradient, not a wrong one (an H100
        # gave 10 of 6,336 elements one fp16 ulp apart, 4.9e-4 at magnitude ~0.5); float32 (CPU) as before
        if dtype == torch.float32:
            torch.testing.assert_close(got, want)
        else:
            torch.testing.assert_close(got, want, rtol=0, atol=4 * torch.finfo(dtype).eps * want.abs().max().item())


def test_philox_known_answers():
    """The test's own Philox against SPEC's known answers (so the mask oracle can be trusted)."""
    vectors = [((0, 0, 0, 0), (0, 0), (0x6627E8D5, 0xE169C58D, 0xBC57AC4C, 0x9B00DBD8)),
               ((0xFFFFFFFF,) * 4, (0xFFFFFFFF,) * 2, (0x408F276D, 0x41C83B0E, 0xA20BC7C6, 0x6D5451FD)),
               ((0x243F6A88, 0x85A308D3, 0x13198A2E, 0x03707344), (0xA4093822, 0x299F31D0),
                (0xD16CFE09, 0x94FDCCEB, 0x5001E420, 0x24126EA1))]
    for counter, key, want in vectors:
        assert tuple(int(w) for w in philox4x32_10(*counter, *key)) == want


def drawn_rng_state(seed):
    """The (seed, offset) the wrapper will draw after torch.manual_seed(seed)."""
    torch.manual_seed(seed)
    state = _torch_path.draw_rng_state(0.5)
    torch.manual_seed(seed)
    return int(state[0]), int(state[1])


def keep_mask(seed, offset, p, b, hq, sq, sk):
    return torch.stack([torch.from_numpy(dropout_keep(seed, offset, p, i, hq, sq, sk)) for i in range(b)])


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=str)
def test_dropout_matches_philox_mask(device, dtype):
    b, sq, sk, hq, hk, d, p = 2, 19, 37, 4, 2, 32, 0.3
    q = torch.randn(b, sq, hq, d, dtype=dtype, device=device)
    k, v = (torch.randn(b, sk, hk, d, dtype=dtype, device=device) for _ in range(2))
    dout = torch.randn_like(q)
    seed, offset = drawn_rng_state(1234)
    keep = keep_mask(seed, offset, p, b, hq, sq, sk)
    fn = lambda q, k, v: flashport.flash_attn_func(q, k, v, dropout_p=p, causal=True)
    out, got = grads(fn, (q, k, v), dout)
    if device == "cpu":  # S_dmask: probabilities, negated where dropped
        torch.manual_seed(1234)
        _, _, s_dmask = flashport.flash_attn_func(q, k, v, dropout_p=p, causal=True, return_attn_probs=True)
        assert torch.equal(s_dmask >= 0, keep | (s_dmask == 0)), "S_dmask sign pattern != Philox keep mask"
    kw = {"causal": True, "keep": keep, "dropout_p": p}
    cpu = [x.cpu() for x in (q, k, v)]
    ref_out, ref = grads(lambda q, k, v: attention_ref(q, k, v, **kw)[0], [x.double() for x in cpu], dout.cpu().double())
    base_out, base = grads(lambda q, k, v: attention_ref(q, k, v, upcast=False, **kw)[0], cpu, dout.cpu())
    check_rule(out, ref_out, base_out)
    check_grads(got, ref, base)


def test_dropout_reproducible_from_torch_seed(device):
    q = torch.randn(1, 16, 2, 32, dtype=work_dtype(device), device=device)
    torch.manual_seed(7)
    a = flashport.flash_attn_func(q, q, q, dropout_p=0.5)
    b = flashport.flash_attn_func(q, q, q, dropout_p=0.5)
    torch.manual_seed(7)
    c = flashport.flash_attn_func(q, q, q, dropout_p=0.5)
    assert torch.equal(a, c) and not torch.equal(a, b)


def test_varlen_dropout_mask(device):
    lens = [5, 0, 12]
    c = torch.tensor([0, 5, 5, 17], dtype=torch.int32, device=device)
    p, hq = 0.25, 2
    q, k, v = (torch.randn(sum(lens), hq, 16, dtype=work_dtype(device), device=device) for _ in range(3))
    seed, offset = drawn_rng_state(99)
    out = flashport.flash_attn_varlen_func(q, k, v, c, c, 12, 12, dropout_p=p)
    keeps = [torch.from_numpy(dropout_keep(seed, offset, p, i, hq, n, n)) for i, n in enumerate(lens)]
    ref, _ = varlen_ref(q.cpu(), k.cpu(), v.cpu(), c.cpu(), c.cpu(), keeps=keeps, dropout_p=p)
    base, _ = varlen_ref(q.cpu(), k.cpu(), v.cpu(), c.cpu(), c.cpu(), keeps=keeps, dropout_p=p, upcast=False)
    check_rule(out, ref, base)


def test_deterministic_backward(device):
    q = torch.randn(2, 31, 4, 64, dtype=torch.bfloat16, device=device, requires_grad=True)
    k = torch.randn(2, 47, 2, 64, dtype=torch.bfloat16, device=device, requires_grad=True)
    v = torch.randn(2, 47, 2, 64, dtype=torch.bfloat16, device=device, requires_grad=True)
    dout = torch.randn(2, 31, 4, 64, dtype=torch.bfloat16, device=device)
    runs = []
    for _ in range(2):
        out = flashport.flash_attn_func(q, k, v, causal=True, deterministic=True)
        runs.append(torch.autograd.grad(out, (q, k, v), dout))
    for a, b in zip(*runs):
        assert torch.equal(a, b)
