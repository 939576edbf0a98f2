"""A small GPT-style workload written against flash-attn 2.x's Python API. The only line that differs
from its flash-attn version is the import: `import flashport as flash_attn` for `import flash_attn`.
Trains a step with GQA + dropout, packs variable-length sequences, then decodes with a rotary KV cache
and checks the decoded outputs against full causal attention over the same tokens."""

import torch

import flashport as flash_attn

device = "cuda" if torch.cuda.is_available() else "cpu"
dtype = torch.bfloat16 if device == "cuda" else torch.float32
tol = 3e-2 if dtype == torch.bfloat16 else 1e-4
torch.manual_seed(0)


class CausalSelfAttention(torch.nn.Module):
    def __init__(self, dim, n_heads, n_kv_heads, dropout):
        super().__init__()
        self.n_heads, self.n_kv_heads, self.head_dim, self.dropout = n_heads, n_kv_heads, dim // n_heads, dropout
        self.wq = torch.nn.Linear(dim, dim, bias=False)
        self.wkv = torch.nn.Linear(dim, 2 * n_kv_heads * self.head_dim, bias=False)
        self.wo = torch.nn.Linear(dim, dim, bias=False)

    def forward(self, x, cu_seqlens=None, max_seqlen=None):
        b, s, _ = x.shape
        q = self.wq(x).view(b, s, self.n_heads, self.head_dim)
        kv = self.wkv(x).view(b, s, 2, self.n_kv_heads, self.head_dim)
        p = self.dropout if self.training else 0.0
        if cu_seqlens is None:
            y = flash_attn.flash_attn_kvpacked_func(q, kv, dropout_p=p, causal=True)
        else:
            y = flash_attn.flash_attn_varlen_kvpacked_func(
                q.view(-1, self.n_heads, self.head_dim), kv.view(-1, 2, self.n_kv_heads, self.head_dim),
                cu_seqlens, cu_seqlens, max_seqlen, max_seqlen, dropout_p=p, causal=True)
            y = y.view(b, s, self.n_heads, self.head_dim)
        return self.wo(y.reshape(b, s, -1))


def train_step():
    model = CausalSelfAttention(128, 8, 2, dropout=0.1).to(device, dtype)
    opt = torch.optim.SGD(model.parameters(), lr=1e-2)
    x = torch.randn(2, 64, 128, device=device, dtype=dtype)
    loss = model(x).float().pow(2).mean()
    loss.backward()
    assert all(torch.isfinite(p.grad).all() for p in model.parameters())
    opt.step()
    model.eval()
    with torch.no_grad():  # packing two sequences per row gives the same result as separate rows
        cu = torch.tensor([0, 40, 64, 100, 128], dtype=torch.int32, device=device)
        packed = model(x, cu_seqlens=cu, max_seqlen=40)
        alone = model(x[:1, :40])
        assert (packed[:1, :40] - alone).abs().max().item() < tol


def varlen_equals_padded():
    lens = [17, 1, 30]
    cu = torch.tensor([0, 17, 18, 48], dtype=torch.int32, device=device)
    qkv = torch.randn(sum(lens), 3, 4, 64, device=device, dtype=dtype)
    out = flash_attn.flash_attn_varlen_qkvpacked_func(qkv, cu, max(lens), causal=True, window_size=(8, 0))
    for i, n in enumerate(lens):
        one = flash_attn.flash_attn_qkvpacked_func(qkv[cu[i] : cu[i + 1]][None], causal=True, window_size=(8, 0))
        assert (out[cu[i] : cu[i + 1]] - one[0]).abs().max().item() < tol


def rotate_half_neox(x, cos, sin):
    r = cos.shape[-1] * 2
    x1, x2 = x[..., : r // 2], x[..., r // 2 : r]
    c, s = cos[:, None, :], sin[:, None, :]
    return torch.cat([x1 * c - x2 * s, x2 * c + x1 * s, x[..., r:]], dim=-1)


def decode_with_kv_cache():
    b, n_heads, n_kv, hd, prompt, steps, max_len = 2, 8, 2, 64, 12, 6, 32
    inv_freq = 1.0 / (10000 ** (torch.arange(0, hd, 2, device=device).float() / hd))
    angles = torch.outer(torch.arange(max_len, device=device).float(), inv_freq)
    cos, sin = angles.cos().to(dtype), angles.sin().to(dtype)
    k_cache = torch.zeros(b, max_len, n_kv, hd, device=device, dtype=dtype)
    v_cache = torch.zeros_like(k_cache)
    total = prompt + steps
    q_all = torch.randn(b, total, n_heads, hd, device=device, dtype=dtype)
    k_all = torch.randn(b, total, n_kv, hd, device=device, dtype=dtype)
    v_all = torch.randn(b, total, n_kv, hd, device=device, dtype=dtype)
    # Prefill the prompt, then one token at a time.
    outs = [flash_attn.flash_attn_with_kvcache(q_all[:, :prompt], k_cache, v_cache, k_all[:, :prompt],
                                               v_all[:, :prompt], rotary_cos=cos, rotary_sin=sin, cache_seqlens=0,
                                               causal=True, rotary_interleaved=False)]
    cache_seqlens = torch.full((b,), prompt, dtype=torch.int32, device=device)
    for t in range(prompt, total):
        out, lse = flash_attn.flash_attn_with_kvcache(
            q_all[:, t : t + 1], k_cache, v_cache, k_all[:, t : t + 1], v_all[:, t : t + 1], rotary_cos=cos,
            rotary_sin=sin, cache_seqlens=cache_seqlens, causal=True, rotary_interleaved=False,
            return_softmax_lse=True)
        outs.append(out)
        cache_seqlens += 1
    decoded = torch.cat(outs, dim=1)
    pos_cos, pos_sin = cos[:total], sin[:total]
    q_rot = rotate_half_neox(q_all.float(), pos_cos.float(), pos_sin.float()).to(dtype)
    k_rot = rotate_half_neox(k_all.float(), pos_cos.float(), pos_sin.float()).to(dtype)
    full = flash_attn.flash_attn_func(q_rot, k_rot, v_all, causal=True)
    assert (decoded - full).abs().max().item() < tol
    assert (k_cache[:, :total] - k_rot).abs().max().item() < tol


def attention_probs_and_alibi():
    q, k, v = (torch.randn(1, 10, 4, 32, device=device, dtype=dtype) for _ in range(3))
    slopes = torch.tensor([0.5, 0.25, 0.125, 0.0625], device=device)
    out, lse, _ = flash_attn.flash_attn_func(q, k, v, causal=True, alibi_slopes=slopes, return_attn_probs=True)
    assert out.shape == (1, 10, 4, 32) and lse.shape == (1, 4, 10)


if __name__ == "__main__":
    train_step()
    varlen_equals_padded()
    decode_with_kv_cache()
    attention_probs_and_alibi()
    print(f"flash_attn_script: OK on {device}")
