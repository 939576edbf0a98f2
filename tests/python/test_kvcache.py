"""flash_attn_with_kvcache against a float64 reference: in-place append, rotary (GPT-J and NeoX), int or
tensor cache_seqlens, cache_batch_idx, cache_leftpad, paged caches and padded head dims."""

import pytest

torch = pytest.importorskip("torch")

import flashport  # noqa: E402
from reference import attention_ref, check_rule  # noqa: E402


def rotate(x, cos, sin, pos, interleaved):
    """x (s, h, d) rotated at positions pos (s,) by the first 2 * cos.shape[1] channels, in float64."""
    x = x.double().clone()
    r = cos.shape[1] * 2
    c, s = cos.double()[pos][:, None, :], sin.double()[pos][:, None, :]
    if interleaved:
        x0, x1 = x[..., 0:r:2].clone(), x[..., 1:r:2].clone()
        x[..., 0:r:2], x[..., 1:r:2] = x0 * c - x1 * s, x1 * c + x0 * s
    else:
        x0, x1 = x[..., : r // 2].clone(), x[..., r // 2 : r].clone()
        x[..., : r // 2], x[..., r // 2 : r] = x0 * c - x1 * s, x1 * c + x0 * s
    return x


def kvcache_ref(q, k_cache, v_cache, k, v, cos, sin, seqlens, batch_idx, leftpad, causal, window, interleaved,
                softcap=0.0):
    """(expected k_cache, v_cache (float64), out, baseline out) on a dense (rows, capacity, hk, d) cache."""
    dtype = q.dtype
    k_exp, v_exp = k_cache.double().clone(), v_cache.double().clone()
    b, sq = q.shape[:2]
    s_new = 0 if k is None else k.shape[1]
    refs, bases = [], []
    for i in range(b):
        row, start = int(batch_idx[i]), int(seqlens[i])
        if k is not None:
            pos = torch.arange(start, start + s_new)
            k_i = rotate(k[i], cos, sin, pos, interleaved) if cos is not None else k[i].double()
            k_exp[row, start : start + s_new] = k_i
            v_exp[row, start : start + s_new] = v[i].double()
        q_i = q[i]
        if cos is not None:
            per_token = causal or window != (-1, -1)
            pos = torch.arange(start, start + sq) if per_token else torch.full((sq,), start)
            q_i = rotate(q_i, cos, sin, pos, interleaved).to(dtype)
        lo, hi = int(leftpad[i]), start + s_new
        keys, vals = k_exp[row, lo:hi].to(dtype), v_exp[row, lo:hi].to(dtype)  # stored in the cache dtype
        kw = {"causal": causal, "window": window, "softcap": softcap}
        refs.append(attention_ref(q_i[None], keys[None], vals[None], **kw)[0][0])
        bases.append(attention_ref(q_i[None], keys[None], vals[None], upcast=False, **kw)[0][0])
    return k_exp, v_exp, torch.stack(refs), torch.stack(bases)


def rotary_tables(max_pos, rot, dtype, device):
    angle = torch.rand(max_pos, rot // 2, dtype=torch.float64) * 6.28
    return angle.cos().to(dtype).to(device), angle.sin().to(dtype).to(device)


CASES = {
    # name: (batch, sq, s_new, capacity, nheads, nheads_k, d, rotary_dim, interleaved, causal, window, extras)
    "rotary_gptj_causal": (2, 3, 3, 40, 4, 2, 64, 32, True, True, (-1, -1), {}),
    "rotary_neox_noncausal": (3, 2, 2, 33, 2, 1, 64, 64, False, False, (-1, -1), {}),
    "rotary_local": (2, 4, 4, 30, 2, 2, 32, 16, True, False, (6, 0), {}),
    "append_no_rotary_gqa7": (2, 1, 1, 17, 7, 1, 40, 0, True, True, (-1, -1), {"softcap": 8.0}),
    "no_append": (2, 5, 0, 21, 2, 2, 64, 0, True, True, (-1, -1), {}),
    "batch_idx": (2, 2, 2, 25, 2, 2, 64, 16, False, True, (-1, -1), {"batch_idx": True}),
    "leftpad": (3, 2, 2, 26, 2, 1, 64, 0, True, True, (-1, -1), {"leftpad": True}),
    "head_dim_59": (2, 2, 3, 19, 2, 2, 59, 32, True, True, (-1, -1), {}),
    "int_seqlens": (2, 1, 1, 12, 2, 2, 64, 0, True, False, (-1, -1), {"int_seqlens": True}),
}


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
@pytest.mark.parametrize("case", CASES, ids=str)
def test_kvcache(device, dtype, case):
    b, sq, s_new, cap, hq, hk, d, rot, interleaved, causal, window, extras = CASES[case]
    rows = b + 2 if extras.get("batch_idx") else b
    k_cache = torch.randn(rows, cap, hk, d, dtype=dtype, device=device)
    v_cache = torch.randn(rows, cap, hk, d, dtype=dtype, device=device)
    q = torch.randn(b, sq, hq, d, dtype=dtype, device=device)
    k = torch.randn(b, s_new, hk, d, dtype=dtype, device=device) if s_new else None
    v = torch.randn(b, s_new, hk, d, dtype=dtype, device=device) if s_new else None
    if extras.get("int_seqlens"):
        seqlens_arg = cap - s_new - 3
        seqlens = torch.full((b,), seqlens_arg, dtype=torch.int32)
    else:
        seqlens = torch.randint(0, cap - max(s_new, sq) + 1, (b,), dtype=torch.int32)
        seqlens_arg = seqlens.to(device)
    batch_idx = torch.randperm(rows)[:b].to(torch.int32) if extras.get("batch_idx") else torch.arange(b, dtype=torch.int32)
    leftpad = torch.zeros(b, dtype=torch.int32)
    if extras.get("leftpad"):
        leftpad = torch.stack([torch.randint(0, int(s) + 1, ()) for s in seqlens]).to(torch.int32)
    cos, sin = rotary_tables(cap + sq, rot, dtype, device) if rot else (None, None)
    k_exp, v_exp, ref, base = kvcache_ref(q.cpu(), k_cache.cpu(), v_cache.cpu(), None if k is None else k.cpu(),
                                          None if v is None else v.cpu(), None if cos is None else cos.cpu(),
                                          None if sin is None else sin.cpu(), seqlens, batch_idx, leftpad, causal,
                                          window, interleaved, extras.get("softcap", 0.0))
    out, lse = flashport.flash_attn_with_kvcache(
        q, k_cache, v_cache, k, v, rotary_cos=cos, rotary_sin=sin, cache_seqlens=seqlens_arg,
        cache_batch_idx=batch_idx.to(device) if extras.get("batch_idx") else None,
        cache_leftpad=leftpad.to(device) if extras.get("leftpad") else None, causal=causal, window_size=window,
        softcap=extras.get("softcap", 0.0), rotary_interleaved=interleaved, return_softmax_lse=True)
    assert out.shape == (b, sq, hq, d) and lse.shape == (b, hq, sq)
    # The cache holds the rotated new keys, rounded once to the cache dtype; nothing else changed.
    ulp = 2.0 ** (-7 if dtype == torch.bfloat16 else -10)
    assert (k_cache.cpu().double() - k_exp).abs().max() <= 4 * ulp * (k_exp.abs().max() + 1)
    assert torch.equal(v_cache.cpu(), v_exp.to(dtype))
    check_rule(out, ref, base)


@pytest.mark.parametrize("page_size", [5, 16])
def test_kvcache_paged(device, page_size):
    dtype, b, sq, hq, hk, d, rot, cap = torch.bfloat16, 3, 1, 4, 2, 64, 32, 40
    blocks_per_seq = -(-cap // page_size)
    num_blocks = b * blocks_per_seq + 3
    block_table = torch.randperm(num_blocks)[: b * blocks_per_seq].reshape(b, blocks_per_seq).to(torch.int32)
    k_pages = torch.randn(num_blocks, page_size, hk, d, dtype=dtype)
    v_pages = torch.randn(num_blocks, page_size, hk, d, dtype=dtype)
    logical = lambda pages: pages[block_table.long()].reshape(b, -1, hk, d)[:, :cap]  # (b, cap, hk, d)
    seqlens = torch.randint(0, cap - sq, (b,), dtype=torch.int32)
    q, k, v = (torch.randn(b, sq, n, d, dtype=dtype) for n in (hq, hk, hk))
    cos, sin = rotary_tables(cap + 1, rot, dtype, "cpu")
    k_exp, v_exp, ref, base = kvcache_ref(q, logical(k_pages), logical(v_pages), k, v, cos, sin, seqlens,
                                          torch.arange(b), torch.zeros(b, dtype=torch.int32), True, (-1, -1), True)
    kp, vp = k_pages.to(device), v_pages.to(device)
    out = flashport.flash_attn_with_kvcache(q.to(device), kp, vp, k.to(device), v.to(device), cos.to(device),
                                            sin.to(device), seqlens.to(device), block_table=block_table.to(device),
                                            causal=True)
    check_rule(out, ref, base)
    assert torch.equal(logical(vp.cpu()), v_exp.to(dtype))
    assert (logical(kp.cpu()).double() - k_exp).abs().max() <= 4 * 2.0**-7 * (k_exp.abs().max() + 1)


DECODE_PAGES = {"dense": 0, "paged1": 1, "paged16": 16, "paged256": 256}


@pytest.mark.parametrize("isa", ["", "avx2", "base"], ids=lambda s: s or "auto")
@pytest.mark.parametrize("layout", DECODE_PAGES)
@pytest.mark.parametrize("heads", [(28, 4), (32, 8), (8, 1)], ids=["gqa7", "gqa4", "mqa"])
@pytest.mark.parametrize("sq", [1, 3])
def test_kvcache_decode_cpu(monkeypatch, sq, heads, layout, isa):
    """The CPU decode kernel (one token, or three with an append: speculative decoding) with cache_seqlens
    0, 1 and full capacity, dense (with left pad) or paged caches, each FLASHPORT_CPU_ISA cap."""
    if isa:
        monkeypatch.setenv("FLASHPORT_CPU_ISA", isa)
    hq, hk = heads
    page = DECODE_PAGES[layout]
    dtype = torch.float32 if layout == "paged16" else torch.bfloat16
    b, d, cap = 3, 64, 520
    append = sq > 1
    s_new = sq if append else 0
    seqlens = torch.tensor([0, 1, cap - s_new], dtype=torch.int32)
    q = torch.randn(b, sq, hq, d, dtype=dtype)
    k = torch.randn(b, s_new, hk, d, dtype=dtype) if append else None
    v = torch.randn(b, s_new, hk, d, dtype=dtype) if append else None
    causal, window, softcap = sq > 1, ((40, 0) if layout == "dense" else (-1, -1)), (5.0 if hk == 1 else 0.0)
    kw = dict(cache_seqlens=seqlens, causal=causal, window_size=window, softcap=softcap, return_softmax_lse=True)
    if page:
        per_seq = -(-cap // page)
        num_blocks = b * per_seq + 3
        block_table = torch.randperm(num_blocks)[: b * per_seq].reshape(b, per_seq).to(torch.int32)
        k_pages = torch.randn(num_blocks, page, hk, d, dtype=dtype)
        v_pages = torch.randn(num_blocks, page, hk, d, dtype=dtype)
        logical = lambda pages: pages[block_table.long()].reshape(b, -1, hk, d)[:, :cap]  # noqa: E731
        leftpad = torch.zeros(b, dtype=torch.int32)
        _, _, ref, base = kvcache_ref(q, logical(k_pages), logical(v_pages), k, v, None, None, seqlens,
                                      torch.arange(b), leftpad, causal, window, True, softcap)
        out, lse = flashport.flash_attn_with_kvcache(q, k_pages, v_pages, k, v, block_table=block_table, **kw)
    else:
        k_cache = torch.randn(b, cap, hk, d, dtype=dtype)
        v_cache = torch.randn(b, cap, hk, d, dtype=dtype)
        leftpad = torch.stack([torch.randint(0, int(s) + s_new + 1, ()) for s in seqlens]).to(torch.int32)
        _, _, ref, base = kvcache_ref(q, k_cache, v_cache, k, v, None, None, seqlens, torch.arange(b), leftpad,
                                      causal, window, True, softcap)
        out, lse = flashport.flash_attn_with_kvcache(q, k_cache, v_cache, k, v, cache_leftpad=leftpad, **kw)
    assert out.shape == (b, sq, hq, d) and lse.shape == (b, hq, sq)
    assert torch.isfinite(out).all()
    check_rule(out, ref, base)
    # An empty cache without an append has no key: LSE -inf.
    if not append:
        assert torch.isneginf(lse[0]).all() and (out[0] == 0).all()
