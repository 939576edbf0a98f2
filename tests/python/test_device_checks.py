"""Device checks: index tensors in GPU memory are checked by a kernel queued before each call's own, and a
bad value surfaces as the named FlashportError at flashport.check() or at the next call on that GPU,
without checked mode and without a synchronisation inside the call. Also: calls captured in a CUDA graph
replay correctly, and a bad index written between replays is reported the same way."""

import os
import subprocess
import sys

import pytest

torch = pytest.importorskip("torch")
if not torch.cuda.is_available():
    pytest.skip("needs a CUDA device", allow_module_level=True)

import flashport  # noqa: E402

DEV, BF16 = "cuda", torch.bfloat16


def paged_decode_inputs():
    q = torch.randn(1, 1, 4, 64, device=DEV, dtype=BF16)
    new = torch.randn(1, 1, 2, 64, device=DEV, dtype=BF16)
    k_cache, v_cache = (torch.randn(8, 16, 2, 64, device=DEV, dtype=BF16) for _ in range(2))
    table = torch.arange(4, dtype=torch.int32, device=DEV).reshape(1, 4)  # 4 pages of 16: 64 tokens
    return q, new, k_cache, v_cache, table


def raised_by_check():
    with pytest.raises(flashport.FlashportError) as info:
        flashport.check()
    return info.value


def test_flash_attn_2709_reported_through_the_device():
    """flash-attn's #2709 (cache_seqlens plus the appended token exceed the block table's pages): the
    call itself returns (the kernels clamp), flashport.check() raises the error checked mode would."""
    q, new, k_cache, v_cache, table = paged_decode_inputs()
    full = torch.tensor([64], dtype=torch.int32, device=DEV)
    assert not flashport.checked_mode()
    flashport.flash_attn_with_kvcache(q, k_cache, v_cache, new, new, cache_seqlens=full, block_table=table)
    err = raised_by_check()
    assert err.argument == "cache_seqlens", str(err)
    assert "entry 0 = 64" in str(err) and "block_table" in str(err) and "cuda:" in str(err), str(err)
    flashport.check()  # reported once: the record is clear again
    ok = torch.tensor([10], dtype=torch.int32, device=DEV)
    out = flashport.flash_attn_with_kvcache(q, k_cache, v_cache, new, new, cache_seqlens=ok, block_table=table)
    flashport.check()
    assert torch.isfinite(out).all()


def test_next_call_raises():
    """Without flashport.check(), the next call on the GPU raises the recorded fault instead of running."""
    q, _, k_cache, v_cache, table = paged_decode_inputs()
    seqlens = torch.tensor([40], dtype=torch.int32, device=DEV)
    bad_table = table.clone()
    bad_table[0, 1] = 99  # a page past the pool of 8, inside the 40 tokens used
    flashport.flash_attn_with_kvcache(q, k_cache, v_cache, cache_seqlens=seqlens, block_table=bad_table)
    torch.cuda.synchronize()
    with pytest.raises(flashport.FlashportError) as info:
        flashport.flash_attn_func(q, k_cache[:1], v_cache[:1])
    assert info.value.argument == "block_table" and "[0, 1] = 99" in str(info.value), str(info.value)
    # Entries past the pages a sequence uses are never read: padding there is not a fault.
    padded = table.clone()
    padded[0, 3] = -1
    flashport.flash_attn_with_kvcache(q, k_cache, v_cache, cache_seqlens=seqlens, block_table=padded)
    flashport.check()


def test_long_block_tables_checked_in_chunks():
    """A long table is checked in chunks of 256 entries spread over the grid: a bad entry far into the
    table of a later sequence is found, the lowest bad column of its chunk is the one named, and entries
    past the pages a sequence uses are still not read."""
    pages, page = 1500, 1
    q = torch.randn(3, 1, 4, 64, device=DEV, dtype=BF16)
    k_cache, v_cache = (torch.randn(pages, page, 2, 64, device=DEV, dtype=BF16) for _ in range(2))
    table = torch.stack([torch.randperm(pages, device=DEV) for _ in range(3)]).to(torch.int32)[:, :1200].contiguous()
    seqlens = torch.tensor([1200, 1100, 900], dtype=torch.int32, device=DEV)
    flashport.flash_attn_with_kvcache(q, k_cache, v_cache, cache_seqlens=seqlens, block_table=table)
    flashport.check()
    bad = table.clone()
    bad[1, 1000], bad[1, 990] = -3, pages  # chunk 768..1023 of sequence 1: column 990 is the lowest
    bad[2, 950] = -1  # past sequence 2's 900 tokens: never read, not a fault
    flashport.flash_attn_with_kvcache(q, k_cache, v_cache, cache_seqlens=seqlens, block_table=bad)
    err = raised_by_check()
    assert err.argument == "block_table" and f"[1, 990] = {pages}" in str(err), str(err)
    bad[1, 990], bad[1, 1000] = 0, 0
    flashport.flash_attn_with_kvcache(q, k_cache, v_cache, cache_seqlens=seqlens, block_table=bad)
    flashport.check()


@pytest.mark.parametrize("which", ["cache_seqlens", "cache_batch_idx", "cache_leftpad"])
def test_dense_decode_faults_named(which):
    """A decode step over a dense cache (no block table) checks its indices inside the decode kernel rather
    than in a kernel of their own: the faults are named the same way."""
    q = torch.randn(2, 1, 8, 64, device=DEV, dtype=BF16)
    new = torch.randn(2, 1, 2, 64, device=DEV, dtype=BF16)
    k_cache, v_cache = (torch.randn(3, 100, 2, 64, device=DEV, dtype=BF16) for _ in range(2))
    seqlens = torch.tensor([40, 99], dtype=torch.int32, device=DEV)
    kwargs = {"cache_batch_idx": torch.tensor([2, 0], dtype=torch.int32, device=DEV)}
    if which == "cache_seqlens":
        seqlens[1] = 100  # plus the new token: 101 > 100
    elif which == "cache_batch_idx":
        kwargs["cache_batch_idx"][0] = 3  # 3 cache rows
    else:
        kwargs["cache_leftpad"] = torch.tensor([0, 120], dtype=torch.int32, device=DEV)  # past the 100 tokens
    out = flashport.flash_attn_with_kvcache(q, k_cache, v_cache, new, new, cache_seqlens=seqlens, **kwargs)
    err = raised_by_check()
    assert err.argument == which, str(err)
    assert torch.isfinite(out).all()
    seqlens[1], kwargs["cache_batch_idx"][0] = 99, 2
    kwargs.pop("cache_leftpad", None)
    flashport.flash_attn_with_kvcache(q, k_cache, v_cache, new, new, cache_seqlens=seqlens, **kwargs)
    flashport.check()


@pytest.mark.parametrize("which", ["cu_seqlens_q", "cu_seqlens_k", "paged_cu_seqlens_k", "seqused_k"])
def test_varlen_faults_named(which):
    h, d = 4, 64
    cu_q = torch.tensor([0, 5, 9], dtype=torch.int32, device=DEV)
    cu_k = torch.tensor([0, 6, 12], dtype=torch.int32, device=DEV)
    q = torch.randn(9, h, d, device=DEV, dtype=BF16)
    k, v = (torch.randn(12, h, d, device=DEV, dtype=BF16) for _ in range(2))
    kwargs = {}
    if which == "cu_seqlens_q":
        cu_q = torch.tensor([0, 5, 8], dtype=torch.int32, device=DEV)  # ends before the 9 queries
    elif which == "cu_seqlens_k":
        cu_k = torch.tensor([0, 7, 5], dtype=torch.int32, device=DEV)  # decreasing
    elif which == "paged_cu_seqlens_k":
        cu_k = torch.tensor([0, -5, 7], dtype=torch.int32, device=DEV)  # the hardening issue's heap corruption
        k, v = (torch.randn(8, 16, h, d, device=DEV, dtype=BF16) for _ in range(2))
        kwargs["block_table"] = torch.arange(4, dtype=torch.int32, device=DEV).reshape(1, 4).expand(2, 4).contiguous()
    else:
        kwargs["seqused_k"] = torch.tensor([3, 7], dtype=torch.int32, device=DEV)  # 7 > 6 keys of sequence 1
    flashport.flash_attn_varlen_func(q, k, v, cu_q, cu_k, 5, 12, **kwargs)
    err = raised_by_check()
    expected = {"paged_cu_seqlens_k": "cu_seqlens_k"}.get(which, which)
    assert err.argument == expected, str(err)


def test_checked_mode_skips_the_device_check():
    """Checked mode validates on the host; no fault is left for later."""
    q, new, k_cache, v_cache, table = paged_decode_inputs()
    full = torch.tensor([64], dtype=torch.int32, device=DEV)
    flashport.set_checked(True)
    try:
        with pytest.raises(flashport.FlashportError):
            flashport.flash_attn_with_kvcache(q, k_cache, v_cache, new, new, cache_seqlens=full, block_table=table)
    finally:
        flashport.set_checked(False)
    flashport.check()


def test_device_checks_can_be_turned_off():
    code = (
        "import torch, flashport\n"
        "q = torch.randn(1, 1, 4, 64, device='cuda', dtype=torch.bfloat16)\n"
        "kc = torch.randn(8, 16, 2, 64, device='cuda', dtype=torch.bfloat16)\n"
        "t = torch.tensor([[0, 99, 2, 3]], dtype=torch.int32, device='cuda')\n"
        "s = torch.tensor([40], dtype=torch.int32, device='cuda')\n"
        "flashport.flash_attn_with_kvcache(q, kc, kc, cache_seqlens=s, block_table=t)\n"
        "flashport.check()\n"
        "print('unreported')\n"
    )
    env = dict(os.environ, FLASHPORT_DEVICE_CHECKS="0")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 0 and "unreported" in done.stdout, done.stderr[-2000:]
    env["FLASHPORT_DEVICE_CHECKS"] = "maybe"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode != 0 and "FLASHPORT_DEVICE_CHECKS" in done.stderr, done.stderr[-2000:]


def test_cuda_graph_capture_and_replay():
    """Forward, varlen and kv-cache decode captured in one CUDA graph replay to the eager results; an
    invalid cache_seqlens written between replays is reported by flashport.check()."""
    torch.manual_seed(0)
    q = torch.randn(2, 64, 4, 64, device=DEV, dtype=BF16)
    k, v = (torch.randn(2, 96, 2, 64, device=DEV, dtype=BF16) for _ in range(2))
    cu = torch.tensor([0, 64, 128], dtype=torch.int32, device=DEV)
    qd, new, k_cache, v_cache, table = paged_decode_inputs()
    seqlens = torch.tensor([20], dtype=torch.int32, device=DEV)

    def step():
        a = flashport.flash_attn_func(q, k, v, causal=True)
        b = flashport.flash_attn_varlen_func(q.flatten(0, 1), q.flatten(0, 1)[:, :2], q.flatten(0, 1)[:, :2],
                                             cu, cu, 64, 64)
        c = flashport.flash_attn_with_kvcache(qd, k_cache, v_cache, cache_seqlens=seqlens, block_table=table)
        return a, b, c

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        eager = step()  # warm-up: kernels compiled and loaded outside the capture
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = step()
    graph.replay()
    torch.cuda.synchronize()
    for got, want in zip(captured, eager):
        torch.testing.assert_close(got, want, atol=0, rtol=0)
    flashport.check()
    seqlens.fill_(65)  # past the 64 tokens the table holds
    graph.replay()
    err = raised_by_check()
    assert err.argument == "cache_seqlens", str(err)
    seqlens.fill_(20)
    graph.replay()
    torch.cuda.synchronize()
    flashport.check()
    torch.testing.assert_close(captured[2], eager[2], atol=0, rtol=0)
