"""Every bad input gets a FlashportError (a ValueError) whose message starts with the argument and says why;
inputs at the edges (huge windows, empty tensors, decode without new keys) compute the right answer.

REJECTED mirrors the table of docs/REJECTED_INPUTS.md row by row (test_table_matches_the_doc keeps them in
step); rows Python cannot reach are covered by tests/core/test_validation.cpp.
"""

import pathlib
import re

import numpy as np
import pytest

import flashport
from conftest import requires_torch, torch

DOC = pathlib.Path(__file__).resolve().parents[2] / "docs" / "REJECTED_INPUTS.md"
fa = flashport.flash_attn_func
varlen = flashport.flash_attn_varlen_func
kvcache = flashport.flash_attn_with_kvcache


def randn(*shape, dtype=np.float32):
    return np.random.standard_normal(shape).astype(dtype)


def dense(b=2, sq=5, sk=7, hq=4, hk=2, d=16, dv=None):
    return randn(b, sq, hq, d), randn(b, sk, hk, d), randn(b, sk, hk, dv or d)


def packed(cu_q=(0, 4, 4, 10), cu_k=(0, 6, 6, 12), max_q=6, max_k=6, **kw):
    """flash_attn_varlen_func over packed q (cu_q[-1], 2, 16), k/v (cu_k[-1], 2, 16)."""
    cu_q, cu_k = np.array(cu_q, np.int32), np.array(cu_k, np.int32)
    q, k, v = randn(int(cu_q[-1]), 2, 16), randn(max(int(cu_k[-1]), 0), 2, 16), randn(max(int(cu_k[-1]), 0), 2, 16)
    return varlen(q, k, v, cu_q, cu_k, max_q, max_k, **kw)


def paged(cu_k, max_k=12, table=(0, 1, 2, 3, 2, 1), **kw):
    """Varlen q (9, 2, 16) over 4 pages of 4 slots with a (2, 3) block table (the heap-corruption case)."""
    q, pages_k, pages_v = randn(9, 2, 16), randn(4, 4, 2, 16), randn(4, 4, 2, 16)
    bt = np.array(table, np.int32).reshape(2, 3)
    return varlen(q, pages_k, pages_v, np.array([0, 5, 9], np.int32), np.array(cu_k, np.int32), 5, max_k,
                  block_table=bt, **kw)


def decode(seqlens=(3, 5), s_new=2, q=None, k_cache=None, v_cache=None, k=None, **kw):
    """A decode step: q (2, 1, 4, 16) over dense caches (2, 8, 2, 16), appending s_new tokens."""
    k_cache = randn(2, 8, 2, 16) if k_cache is None else k_cache
    v_cache = randn(2, 8, 2, 16) if v_cache is None else v_cache
    q = randn(2, 1, 4, 16) if q is None else q
    new = (randn(2, s_new, 2, 16) if k is None else k, randn(2, s_new, 2, 16)) if s_new else (None, None)
    lens = np.array(seqlens, np.int32) if isinstance(seqlens, tuple) else seqlens
    return kvcache(q, k_cache, v_cache, *new, cache_seqlens=lens, **kw)


def q_inside_v_cache():
    v_cache = randn(2, 8, 2, 16)
    q = v_cache.reshape(-1)[: 2 * 4 * 16].reshape(2, 1, 4, 16)
    return decode(q=q, v_cache=v_cache)


def k_new_inside_v_cache():
    v_cache = randn(2, 8, 2, 16)
    return decode(k=v_cache.reshape(-1)[: 2 * 2 * 2 * 16].reshape(2, 2, 2, 16), v_cache=v_cache)


def torch_decode(**kw):
    q, kc, vc = (torch.randn(2, n, h, 16) for n, h in ((1, 4), (8, 2), (8, 2)))
    return kvcache(q, kc, vc, **kw)


# (id, call, argument, message fragment): one row of docs/REJECTED_INPUTS.md each.
REJECTED = [
    ("cu_seqlens_k-paged-negative-length", lambda: paged([0, -5, 7]), "cu_seqlens_k", "must be non-decreasing"),
    ("cu_seqlens_k-paged-decreasing", lambda: paged([0, 10, 4]), "cu_seqlens_k", "got 10 then 4 at index 2"),
    ("cu_seqlens_q-decreasing", lambda: packed(cu_q=(0, 6, 4, 10)), "cu_seqlens_q", "must be non-decreasing"),
    ("cu_seqlens_q-start", lambda: packed(cu_q=(1, 4, 6, 10)), "cu_seqlens_q", "must start at 0"),
    ("cu_seqlens_k-end", lambda: varlen(randn(10, 2, 16), randn(12, 2, 16), randn(12, 2, 16),
                                        np.array([0, 4, 10], np.int32), np.array([0, 6, 11], np.int32), 6, 6),
     "cu_seqlens_k", "must end at the total token count 12"),
    ("max_seqlen_q-bound", lambda: packed(max_q=5), "max_seqlen_q", "is an upper bound of the lengths"),
    ("max_seqlen_k-paged-bound", lambda: paged([0, 3, 12], max_k=13), "max_seqlen_k",
     "must be in [0, max_blocks_per_seq * page_size = 12]"),
    ("max_seqlen_q-negative", lambda: packed(max_q=-1), "max_seqlen_q", "must be >= 0, got -1"),
    ("max_seqlen_q-int32", lambda: packed(max_q=2**31), "max_seqlen_q", "(sequence lengths are int32)"),
    ("max_seqlen_k-int64", lambda: packed(max_k=2**63), "max_seqlen_k", "must be <= 9223372036854775807 (int64)"),
    ("seqused_k-range", lambda: packed(seqused_k=np.array([3, 0, 7], np.int32)), "seqused_k",
     "entry 2 = 7 is outside [0, 6]"),
    ("block_table-page-past-pool", lambda: paged([0, 5, 12], table=(0, 1, 2, 3, 4, 1)), "block_table",
     "entry [1, 1] = 4 is outside [0, num_blocks = 4)"),
    ("window_size-below-minus-one", lambda: fa(*dense(), window_size=(-2, 0)), "window_size",
     "left must be in [-1, 9223372036854775807]"),
    ("window_size-beyond-int64", lambda: fa(*dense(), window_size=(0, 2**63)), "window_size",
     "right must be in [-1, 9223372036854775807]"),
    ("window_size-not-a-pair", lambda: fa(*dense(), window_size=5), "window_size", "expected a pair (left, right)"),
    ("softmax_scale-overflow", lambda: fa(*dense(), softmax_scale=1e39), "softmax_scale", "fit float32"),
    ("softmax_scale-underflow", lambda: fa(*dense(), softmax_scale=1e-300), "softmax_scale", "fit float32"),
    ("softmax_scale-nan", lambda: fa(*dense(), softmax_scale=float("nan")), "softmax_scale", "must be finite"),
    ("softcap-overflow", lambda: fa(*dense(), softcap=1e39), "softcap", "fit float32"),
    ("softcap-underflow", lambda: fa(*dense(), softcap=1e-300), "softcap", "fit float32"),
    ("softcap-negative", lambda: fa(*dense(), softcap=-1.0), "softcap", "must be >= 0.0"),
    ("dropout_p-one", lambda: fa(*dense(), dropout_p=1.0), "dropout_p", "must be < 1.0"),
    ("dropout_p-underflow", lambda: fa(*dense(), dropout_p=1e-300), "dropout_p", "fit float32"),
    ("q-head-dim-zero", lambda: fa(*dense(d=0)), "q", "head dim must be >= 1, got 0"),
    ("q-head-dim-257", lambda: fa(*dense(d=257)), "q", "head dim must be <= 256, got 257"),
    ("v-head-dim-257", lambda: fa(*dense(dv=257)), "v", "head dim must be <= 256, got 257"),
    ("v_cache-head-dim-257", lambda: kvcache(randn(1, 1, 2, 16), randn(1, 4, 2, 16), randn(1, 4, 2, 257)),
     "v_cache", "head dim must be <= 256, got 257"),
    ("q-negative-stride", lambda: fa(randn(1, 4, 2, 16)[:, ::-1], randn(1, 4, 2, 16), randn(1, 4, 2, 16)), "q",
     "negative extents or strides are not supported"),
    ("cu_seqlens_q-contiguous", lambda: varlen(randn(10, 2, 16), randn(12, 2, 16), randn(12, 2, 16),
                                               np.array([0, 9, 4, 9, 10, 9], np.int32)[::2],
                                               np.array([0, 6, 12], np.int32), 6, 6),
     "cu_seqlens_q", "must be contiguous"),
    ("k-paged-page-size-zero", lambda: varlen(randn(9, 2, 16), randn(4, 0, 2, 16), randn(4, 0, 2, 16),
                                              np.array([0, 5, 9], np.int32), np.array([0, 0, 0], np.int32), 5, 0,
                                              block_table=np.zeros((2, 3), np.int32)), "k", "page size must be >= 1"),
    ("k-heads-divide", lambda: fa(*dense(hq=6, hk=4)), "k", "must divide the number of query heads"),
    ("v-dtype", lambda: fa(randn(1, 3, 2, 16), randn(1, 3, 2, 16), randn(1, 3, 2, 16, dtype=np.float64)), "v",
     "expected dtype float32, got float64"),
    ("cache_seqlens-int-int32", lambda: decode(seqlens=2**31), "cache_seqlens", "must be <= 2147483647 (int32)"),
    ("cache_seqlens-int-negative", lambda: decode(seqlens=-1), "cache_seqlens", "must be >= 0, got -1"),
    ("cache_seqlens-negative-entry", lambda: decode(seqlens=(-3, 5)), "cache_seqlens", "entry 0 = -3 must be >= 0"),
    ("cache_seqlens-capacity", lambda: decode(seqlens=(3, 7)), "cache_seqlens",
     "entry 1 = 7 plus 2 new tokens exceeds the cache capacity 8"),
    ("cache_seqlens-required", lambda: decode(seqlens=None), "cache_seqlens", "is required when appending k/v"),
    ("rotary_cos-positions", lambda: decode(rotary_cos=randn(6, 4), rotary_sin=randn(6, 4)), "rotary_cos",
     "has 6 positions, sequence 1 needs 7"),
    ("cache_batch_idx-range", lambda: decode(cache_batch_idx=np.array([0, 2], np.int32)), "cache_batch_idx",
     "entry 1 = 2 is outside [0, 2)"),
    ("cache_leftpad-range", lambda: decode(cache_leftpad=np.array([0, 8], np.int32)), "cache_leftpad",
     "entry 1 = 8 is outside [0, 7]"),
    ("num_splits-int32", lambda: decode(num_splits=2**31), "num_splits", "must be <= 2147483647 (int32)"),
    ("num_splits-bound", lambda: decode(num_splits=129), "num_splits", "must be in [0, 128]"),
    ("num_splits-negative", lambda: decode(num_splits=-1), "num_splits", "must be >= 0"),
    ("v_cache-overlaps-q", q_inside_v_cache, "v_cache", "memory overlaps q"),
    ("v_cache-overlaps-k_new", k_new_inside_v_cache, "v_cache", "memory overlaps k_new"),
    ("k-v-together", lambda: kvcache(randn(2, 1, 4, 16), randn(2, 8, 2, 16), randn(2, 8, 2, 16),
                                     randn(2, 1, 2, 16), cache_seqlens=1), "v_new", "must be given together"),
    ("torch-cache_seqlens-int32", lambda: torch_decode(cache_seqlens=2**31), "cache_seqlens",
     "must be <= 2147483647 (int32)"),
    ("torch-num_splits-int32", lambda: torch_decode(num_splits=2**31), "num_splits", "must be <= 2147483647 (int32)"),
    ("torch-q-head-dim-zero", lambda: fa(*(torch.randn(1, 2, 2, 0) for _ in range(3))), "q",
     "head dim must be >= 1, got 0"),
]


@pytest.mark.parametrize("case, call, argument, fragment", REJECTED, ids=[r[0] for r in REJECTED])
def test_rejected(case, call, argument, fragment):
    if case.startswith("torch-") and torch is None:
        pytest.skip("torch is not installed")
    with pytest.raises(flashport.FlashportError) as info:
        call()
    message = str(info.value)
    assert message.startswith(f"{argument}:"), message
    assert fragment in message, f"{message!r} lacks {fragment!r}"


def test_table_matches_the_doc():
    ids = re.findall(r"`py:([\w.-]+)`", DOC.read_text())
    assert sorted(ids) == sorted(r[0] for r in REJECTED)


# ---------------------------------------------------------------------------------------------
# Edge inputs that have an answer.

if torch is not None:
    import reference


def _ref(q, k, v, **kw):
    t = lambda x: torch.from_numpy(np.ascontiguousarray(x))
    out, lse = reference.attention_ref(t(q), t(k), t(v), **kw)
    base, _ = reference.attention_ref(t(q), t(k), t(v), upcast=False, **kw)
    return out, lse, base


@requires_torch
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("seqlens", ["array", "int", None])
def test_numpy_kvcache_without_new_keys(causal, seqlens):
    q, k_cache, v_cache = randn(2, 3, 4, 16), randn(2, 10, 2, 16), randn(2, 10, 2, 16)
    lens = {"array": np.array([4, 9], np.int32), "int": 6, None: None}[seqlens]
    before = k_cache.copy(), v_cache.copy()
    out, lse = kvcache(q, k_cache, v_cache, cache_seqlens=lens, causal=causal, return_softmax_lse=True)
    used = np.broadcast_to(10 if lens is None else lens, (2,))
    for b in range(2):
        n = int(used[b])
        ref, ref_lse, base = _ref(q[b : b + 1], k_cache[b : b + 1, :n], v_cache[b : b + 1, :n], causal=causal)
        reference.check_rule(torch.from_numpy(out[b : b + 1]), ref, base)
        np.testing.assert_allclose(lse[b : b + 1], ref_lse.numpy(), rtol=1e-5, atol=1e-5)
    assert all(np.array_equal(a, c) for a, c in zip(before, (k_cache, v_cache)))


def test_numpy_read_only_cache_without_new_keys():
    """A broadcast (read-only, stride-0) cache is an input when nothing is appended: it gives the answer
    of the same cache materialised; appending into it is refused with a message naming it."""
    q, row = randn(2, 1, 4, 16), randn(1, 8, 2, 16)
    shared = np.broadcast_to(row, (2, 8, 2, 16))
    got = kvcache(q, shared, shared, cache_seqlens=np.array([5, 8], np.int32))
    want = kvcache(q, shared.copy(), shared.copy(), cache_seqlens=np.array([5, 8], np.int32))
    np.testing.assert_array_equal(got, want)
    new = randn(2, 1, 2, 16)
    with pytest.raises(flashport.FlashportError) as info:
        kvcache(q, shared, shared, new, new, cache_seqlens=np.array([5, 6], np.int32))
    assert info.value.argument == "k_cache", str(info.value)


@requires_torch
@pytest.mark.parametrize("window", [(-1, 2**63 - 1), (2**63 - 1, -1), (2**63 - 1, 2**63 - 1)])
@pytest.mark.parametrize("framework", ["numpy", "torch"])
def test_huge_window_is_unbounded(window, framework):
    q, k, v = dense(sq=6, sk=9)
    if framework == "torch":
        q, k, v = (torch.from_numpy(x) for x in (q, k, v))
    got = fa(q, k, v, window_size=window)
    unbounded = fa(q, k, v, window_size=(-1, -1))
    as_np = lambda x: x.numpy() if framework == "torch" else x
    np.testing.assert_array_equal(as_np(got), as_np(unbounded))
    ref, _, base = _ref(as_np(q), as_np(k), as_np(v))
    reference.check_rule(torch.from_numpy(as_np(got)), ref, base)


@requires_torch
@pytest.mark.parametrize("shape", [dict(sq=0), dict(sk=0), dict(b=0), dict(sq=0, sk=0)])
@pytest.mark.parametrize("framework", ["numpy", "torch"])
def test_empty_inputs(shape, framework):
    q, k, v = dense(**shape)
    if framework == "torch":
        q, k, v = (torch.from_numpy(x) for x in (q, k, v))
    out, lse, _ = fa(q, k, v, return_attn_probs=True)
    as_np = lambda x: x.numpy() if framework == "torch" else x
    assert out.shape == q.shape and lse.shape == (q.shape[0], q.shape[2], q.shape[1])
    ref, ref_lse, base = _ref(as_np(q), as_np(k), as_np(v))
    reference.check_rule(torch.from_numpy(as_np(out)), ref, base)
    np.testing.assert_array_equal(as_np(lse), ref_lse.numpy())  # -inf where there are no keys


@requires_torch
def test_empty_varlen_and_decode():
    q, k, v = randn(0, 2, 16), randn(0, 2, 16), randn(0, 2, 16)
    cu = np.zeros(3, np.int32)
    out = varlen(q, k, v, cu, cu, 0, 0)
    assert out.shape == (0, 2, 16)
    out, lse = kvcache(randn(2, 1, 4, 16), randn(2, 8, 2, 16), randn(2, 8, 2, 16), cache_seqlens=0,
                       return_softmax_lse=True)
    assert not out.any() and np.all(lse == -np.inf)


@pytest.mark.skipif(torch is None or not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("b,sq,sk", [(2, 0, 5), (2, 3, 0), (0, 3, 5)])
def test_empty_inputs_cuda(b, sq, sk):
    """Empty tensors on a GPU (torch gives them null pointers) give empty outputs, or 0 and LSE -inf for
    queries without keys; a varlen batch of empty sequences too."""
    make = lambda s, h: torch.randn(b, s, h, 64, device="cuda", dtype=torch.float16)
    q, k, v = make(sq, 4), make(sk, 2), make(sk, 2)
    out, lse, _ = fa(q, k, v, return_attn_probs=True)
    assert out.shape == q.shape and lse.shape == (b, 4, sq)
    if sk == 0:
        assert not out.any() and torch.isinf(lse).all()
    cu = torch.zeros(3, dtype=torch.int32, device="cuda")
    flat = torch.randn(0, 4, 64, device="cuda", dtype=torch.float16)
    assert varlen(flat, flat, flat, cu, cu, 0, 0).shape == (0, 4, 64)


@pytest.mark.skipif(torch is None or not torch.cuda.is_available(), reason="needs a CUDA device")
def test_checked_mode_names_bad_device_indices():
    """flash-attn's #2709: a paged cache whose cache_seqlens plus the appended tokens exceed what the
    block table holds. GPU index tensors are clamped by the kernels unless checked mode copies them to
    the host, where they get the same named errors as host tensors."""
    dev, bf16 = "cuda", torch.bfloat16
    q, new = torch.randn(1, 1, 4, 64, device=dev, dtype=bf16), torch.randn(1, 1, 2, 64, device=dev, dtype=bf16)
    k_cache, v_cache = (torch.randn(8, 16, 2, 64, device=dev, dtype=bf16) for _ in range(2))
    table = torch.arange(4, dtype=torch.int32, device=dev).reshape(1, 4)  # 4 pages of 16: 64 tokens
    full = torch.tensor([64], dtype=torch.int32, device=dev)
    assert not flashport.checked_mode()
    flashport.set_checked(True)
    try:
        with pytest.raises(flashport.FlashportError) as info:
            kvcache(q, k_cache, v_cache, new, new, cache_seqlens=full, block_table=table)
        assert info.value.argument == "cache_seqlens" and "block_table" in str(info.value), str(info.value)
        bad_table = table.clone()
        bad_table[0, 1] = 99
        with pytest.raises(flashport.FlashportError) as info:
            kvcache(q, k_cache, v_cache, cache_seqlens=full, block_table=bad_table)
        assert info.value.argument == "block_table", str(info.value)
        cu_k = torch.tensor([0, -5, 7], dtype=torch.int32, device=dev)  # decreasing, with pages
        qv = torch.randn(9, 4, 64, device=dev, dtype=bf16)
        cu_q = torch.tensor([0, 5, 9], dtype=torch.int32, device=dev)
        with pytest.raises(flashport.FlashportError) as info:
            flashport.flash_attn_varlen_func(qv, k_cache, v_cache, cu_q, cu_k, 5, 12,
                                             block_table=table.expand(2, 4).contiguous())
        assert info.value.argument == "cu_seqlens_k", str(info.value)
    finally:
        flashport.set_checked(False)
    # Unchecked, the same call is answered (the kernels clamp) without a synchronisation.
    out = kvcache(q, k_cache, v_cache, cache_seqlens=full, block_table=table)
    assert out.shape == q.shape and torch.isfinite(out).all()


def test_check_names_a_bad_device():
    """flashport.check: a device it cannot parse is a ValueError naming `device`; the CPU has nothing to check."""
    with pytest.raises(ValueError, match="^device: "):
        flashport.check("cuda:x")
    flashport.check("cpu")
