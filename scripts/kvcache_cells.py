"""The chunked-prefill cell that scripts/paged_prefill_probe.py times and scripts/ncu_summary.py profiles:
a chunk of queries (the cache's last ones, causal bottom-right) against a kv cache of `context` tokens,
dense with cache_seqlens or in shuffled pages. Heavy imports stay inside the functions, so the FLOP count
is usable without torch."""


def visible_pairs(chunk, context):
    """Query-key pairs a bottom-right causal chunk of `chunk` queries sees over `context` keys."""
    return sum(context - chunk + i + 1 for i in range(chunk))


def heads(d):
    """Query and kv heads of a cell at head dim d: 2048 / d query heads, a quarter of them kv heads."""
    return 2048 // d, 2048 // d // 4


def make_inputs(b, chunk, context, d, page, device="cuda"):
    """(q, k_cache, v_cache, cache_seqlens, block_table) in bf16; page 0: a dense cache, no table."""
    import torch

    hq, hk = heads(d)
    q = torch.randn(b, chunk, hq, d, device=device, dtype=torch.bfloat16)
    seqlens = torch.full((b,), context, device=device, dtype=torch.int32)
    if page == 0:
        k = torch.randn(b, context, hk, d, device=device, dtype=torch.bfloat16)
        return q, k, torch.randn_like(k), seqlens, None
    per_seq = -(-context // page)
    k = torch.randn(b * per_seq, page, hk, d, device=device, dtype=torch.bfloat16)
    table = torch.randperm(b * per_seq, device=device, dtype=torch.int32).view(b, per_seq)
    return q, k, torch.randn_like(k), seqlens, table
