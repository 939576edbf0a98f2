"""Forward accuracy of the torch path against a float64 torch reference (SPEC's accuracy rule): dense,
packed, varlen with empty sequences, paged K/V, awkward shapes and every score option."""

import pytest

torch = pytest.importorskip("torch")

import flashport  # noqa: E402
from reference import attention_ref, check_rule, varlen_ref, visible, work_dtype  # noqa: E402

DTYPES = [torch.float16, torch.bfloat16, torch.float32]
# (batch, seqlen_q, seqlen_k, nheads, nheads_k, headdim)
SHAPES = [
    (1, 1, 1, 1, 1, 64),
    (2, 113, 203, 2, 1, 40),
    (1, 203, 113, 2, 2, 59),
    (2, 17, 17, 7, 1, 64),
    (1, 33, 65, 4, 2, 128),
]
OPTIONS = {
    "plain": {},
    "causal": {"causal": True},
    "window": {"window_size": (5, 3)},
    "softcap_causal": {"softcap": 10.0, "causal": True},
    "alibi": {"alibi": True},
}


def rand(*shape, dtype, device):
    return torch.randn(*shape, dtype=dtype, device=device)


def ref_kwargs(opts):
    return {k: v for k, v in opts.items() if k in ("causal", "softcap")} | (
        {"window": opts["window_size"]} if "window_size" in opts else {})


def check_lse(lse, lse_ref, lse_base):
    lse, lse_ref = lse.cpu(), lse_ref.cpu()
    assert torch.equal(torch.isinf(lse), torch.isinf(lse_ref)), "lse: -inf rows differ"
    finite = ~torch.isinf(lse_ref)
    check_rule(lse[finite], lse_ref[finite].double(), lse_base.cpu()[finite].double(), what="lse")


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("opt", OPTIONS, ids=str)
def test_flash_attn_func(device, dtype, shape, opt):
    b, sq, sk, hq, hk, d = shape
    q, k, v = rand(b, sq, hq, d, dtype=dtype, device=device), rand(b, sk, hk, d, dtype=dtype, device=device), \
        rand(b, sk, hk, d, dtype=dtype, device=device)
    opts = dict(OPTIONS[opt])
    alibi = None
    if opts.pop("alibi", False):
        alibi = torch.rand(b, hq, device=device) * 0.3 if b > 1 else torch.rand(hq, device=device) * 0.3
    out, lse, _ = flashport.flash_attn_func(q, k, v, alibi_slopes=alibi, return_attn_probs=True, **opts)
    assert out.shape == (b, sq, hq, d) and out.dtype == dtype and out.device == q.device
    assert lse.shape == (b, hq, sq) and lse.dtype == torch.float32
    kw = ref_kwargs(opts) | {"alibi": None if alibi is None else alibi.cpu()}
    ref, lse_ref = attention_ref(q.cpu(), k.cpu(), v.cpu(), **kw)
    base, lse_base = attention_ref(q.cpu(), k.cpu(), v.cpu(), upcast=False, **kw)
    check_rule(out, ref, base)
    check_lse(lse, lse_ref, lse_base)


def test_head_dim_padding_and_scale(device):
    """Head dims that are not a multiple of 8 are padded, and the default scale uses the original dim."""
    q, k, v = (rand(2, 9, 3, 59, dtype=work_dtype(device), device=device) for _ in range(3))
    for scale in (None, 0.3):
        out = flashport.flash_attn_func(q, k, v, softmax_scale=scale)
        assert out.shape == (2, 9, 3, 59)
        cpu = [x.cpu() for x in (q, k, v)]
        check_rule(out, attention_ref(*cpu, scale=scale)[0], attention_ref(*cpu, scale=scale, upcast=False)[0])


def test_return_attn_probs_cpu():
    q, k, v = (rand(1, 6, 2, 16, dtype=torch.float32, device="cpu") for _ in range(3))
    out, lse, s_dmask = flashport.flash_attn_func(q, k, v, causal=True, return_attn_probs=True)
    assert s_dmask.shape == (1, 2, 6, 6) and s_dmask.dtype == torch.float32
    scores = torch.einsum("bihd,bjhd->bhij", q.double(), k.double()) / 4
    probs = torch.softmax(scores.masked_fill(~visible(6, 6, True), float("-inf")), -1)
    assert (s_dmask.double() - probs).abs().max() < 1e-6


def test_packed_variants(device):
    b, s, h, d = 2, 21, 4, 32
    qkv = rand(b, s, 3, h, d, dtype=torch.bfloat16, device=device)
    out = flashport.flash_attn_qkvpacked_func(qkv, causal=True)
    same = flashport.flash_attn_func(qkv[:, :, 0], qkv[:, :, 1], qkv[:, :, 2], causal=True)
    assert torch.equal(out, same)
    q = rand(b, s, h, d, dtype=torch.bfloat16, device=device)
    kv = rand(b, 30, 2, 2, d, dtype=torch.bfloat16, device=device)
    out = flashport.flash_attn_kvpacked_func(q, kv, window_size=(4, 0))
    assert torch.equal(out, flashport.flash_attn_func(q, kv[:, :, 0], kv[:, :, 1], window_size=(4, 0)))


def cu(lengths, device):
    c = torch.zeros(len(lengths) + 1, dtype=torch.int32)
    c[1:] = torch.tensor(lengths).cumsum(0)
    return c.to(device)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
@pytest.mark.parametrize("causal", [False, True])
def test_varlen_with_empty_sequences(device, dtype, causal):
    lens_q, lens_k = [3, 0, 17, 2, 1], [5, 0, 9, 0, 23]  # an empty pair, and queries with no keys
    hq, hk, d = 6, 2, 40
    cq, ck = cu(lens_q, device), cu(lens_k, device)
    q = rand(sum(lens_q), hq, d, dtype=dtype, device=device)
    k, v = (rand(sum(lens_k), hk, d, dtype=dtype, device=device) for _ in range(2))
    alibi = torch.rand(len(lens_q), hq, device=device) * 0.2
    out, lse, _ = flashport.flash_attn_varlen_func(q, k, v, cq, ck, max(lens_q), max(lens_k), causal=causal,
                                                   alibi_slopes=alibi, return_attn_probs=True)
    assert out.shape == (sum(lens_q), hq, d) and lse.shape == (hq, sum(lens_q))
    kw = {"causal": causal, "alibi": alibi.cpu()}
    ref, lse_ref = varlen_ref(q.cpu(), k.cpu(), v.cpu(), cq.cpu(), ck.cpu(), **kw)
    base, lse_base = varlen_ref(q.cpu(), k.cpu(), v.cpu(), cq.cpu(), ck.cpu(), upcast=False, **kw)
    check_rule(out, ref, base)
    check_lse(lse, lse_ref, lse_base)
    rows_without_keys = slice(sum(lens_q[:3]), sum(lens_q[:4]))
    assert torch.all(out[rows_without_keys] == 0) and torch.all(torch.isinf(lse[:, rows_without_keys]))


def test_varlen_packed_variants(device):
    lens = [7, 1, 12]
    c = cu(lens, device)
    qkv = rand(sum(lens), 3, 4, 64, dtype=torch.float16, device=device)
    out = flashport.flash_attn_varlen_qkvpacked_func(qkv, c, max(lens), causal=True)
    same = flashport.flash_attn_varlen_func(qkv[:, 0], qkv[:, 1], qkv[:, 2], c, c, max(lens), max(lens), causal=True)
    assert torch.equal(out, same)
    kv = qkv[:, 1:]
    out = flashport.flash_attn_varlen_kvpacked_func(qkv[:, 0], kv, c, c, max(lens), max(lens))
    assert torch.equal(out, flashport.flash_attn_varlen_func(qkv[:, 0], kv[:, 0], kv[:, 1], c, c, max(lens), max(lens)))


@pytest.mark.parametrize("page_size", [1, 3, 16])
def test_paged_kv(device, page_size):
    lens_q, lens_k = [4, 1, 9], [10, 33, 0]
    hq, hk, d = 4, 2, 64
    max_blocks = -(-max(lens_k) // page_size)
    num_blocks = len(lens_k) * max_blocks + 2
    k_pages = rand(num_blocks, page_size, hk, d, dtype=torch.bfloat16, device=device)
    v_pages = rand(num_blocks, page_size, hk, d, dtype=torch.bfloat16, device=device)
    block_table = torch.randperm(num_blocks)[: len(lens_k) * max_blocks].reshape(len(lens_k), max_blocks)
    block_table = block_table.to(torch.int32).to(device)
    cq, ck = cu(lens_q, device), cu(lens_k, device)
    q = rand(sum(lens_q), hq, d, dtype=torch.bfloat16, device=device)
    out = flashport.flash_attn_varlen_func(q, k_pages, v_pages, cq, ck, max(lens_q), max(lens_k), causal=True,
                                           block_table=block_table)
    # Gather each sequence's keys from its pages into packed (total_k, hk, d).
    gather = lambda pages: torch.cat([pages.cpu()[block_table[b].cpu().long()].reshape(-1, hk, d)[: lens_k[b]]
                                      for b in range(len(lens_k))])
    k, v = gather(k_pages), gather(v_pages)
    ref, _ = varlen_ref(q.cpu(), k, v, cq.cpu(), ck.cpu(), causal=True)
    base, _ = varlen_ref(q.cpu(), k, v, cq.cpu(), ck.cpu(), causal=True, upcast=False)
    check_rule(out, ref, base)


def test_seqused_k(device):
    lens = [6, 9]
    used = torch.tensor([4, 0], dtype=torch.int32, device=device)
    c = cu(lens, device)
    q, k, v = (rand(sum(lens), 2, 32, dtype=work_dtype(device), device=device) for _ in range(3))
    out = flashport.flash_attn_varlen_func(q, k, v, c, c, max(lens), max(lens), seqused_k=used)
    args = (q[:6].cpu()[None], k[:4].cpu()[None], v[:4].cpu()[None])
    check_rule(out[:6], attention_ref(*args)[0][0], attention_ref(*args, upcast=False)[0][0])
    assert torch.all(out[6:] == 0)


def test_sdpa_layout(device):
    dtype = work_dtype(device)
    q = rand(2, 4, 19, 32, dtype=dtype, device=device)
    k, v = rand(2, 2, 11, 32, dtype=dtype, device=device), rand(2, 2, 11, 32, dtype=dtype, device=device)
    for causal in (False, True):
        out = flashport.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=True)
        want = torch.nn.functional.scaled_dot_product_attention(
            q.cpu().double(), k.cpu().double().repeat_interleave(2, 1), v.cpu().double().repeat_interleave(2, 1),
            is_causal=causal)
        assert out.shape == q.shape and (out.cpu() - want).abs().max() < (1e-5 if device == "cpu" else 2e-3)
    with pytest.raises(ValueError, match="enable_gqa"):
        flashport.scaled_dot_product_attention(q, k, v)


@pytest.mark.parametrize("where", ["q", "k", "v"])
@pytest.mark.parametrize("value", [float("nan"), float("inf")])
def test_non_finite_inputs_propagate(device, where, value):
    """docs/SPEC.md: a NaN reaches every row that reads it (q row i: that row; k or v row j: every query
    that sees key j), an Inf likewise where it does not merely mask a key; never another head or sequence."""
    b, sq, sk, h, d = 2, 37, 45, 3, 32
    q, k, v = (torch.randn(b, s, h, d, dtype=work_dtype(device), device=device) for s in (sq, sk, sk))
    row = 20 if where == "q" else 30  # a query row, or a key row seen by queries 22.. under causal
    {"q": q, "k": k, "v": v}[where][1, row, 2, 5] = value
    out, lse, _ = flashport.flash_attn_func(q, k, v, causal=True, window_size=(4, 0), return_attn_probs=True)
    bad = ~torch.isfinite(out).all(-1)  # (b, sq, h)
    sees = visible(sq, sk, True, (4, 0))[:, row]  # queries that see key `row`
    reads = torch.zeros(sq, dtype=torch.bool)
    if where == "q":
        reads[row] = True
    else:
        reads |= sees
    # An Inf in q or k makes scores of either sign, and a -inf score is a masked key: only NaN must show.
    if value != value or where == "v":
        assert bad[1, :, 2].cpu()[reads].all(), "a row that reads the value stayed finite"
    if where != "v":  # v: a masked P of 0 times NaN may reach other rows of this head (as in SDPA)
        assert not bad[1, :, 2].cpu()[~reads].any(), "a row that does not read the value became non-finite"
    assert not bad[0].any() and not bad[1, :, :2].any(), "another sequence or head became non-finite"
