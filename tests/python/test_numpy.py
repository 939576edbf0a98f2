"""The numpy path (no torch needed): forward, varlen, kvcache, merge, dropout, low-level ops over DLPack."""

import subprocess
import sys

import numpy as np
import pytest

import flashport
from flashport import ops


def naive(q, k, v, causal=False, scale=None):
    """float64 attention of dense numpy (b, s, h, d) inputs, bottom-right causal."""
    q, k, v = (x.astype(np.float64) for x in (q, k, v))
    g = q.shape[2] // k.shape[2]
    k, v = np.repeat(k, g, axis=2), np.repeat(v, g, axis=2)
    s = np.einsum("bihd,bjhd->bhij", q, k) * (q.shape[-1] ** -0.5 if scale is None else scale)
    sq, sk = q.shape[1], k.shape[1]
    if causal:
        s = np.where(np.arange(sk)[None] <= np.arange(sq)[:, None] + sk - sq, s, -np.inf)
    m = np.max(s, -1, keepdims=True, initial=-np.inf)
    m = np.where(np.isinf(m), 0, m)
    e = np.exp(s - m)
    z = e.sum(-1, keepdims=True)
    p = e / np.where(z == 0, 1, z)
    lse = np.where(z[..., 0] == 0, -np.inf, np.log(z[..., 0]) + m[..., 0])
    return np.einsum("bhij,bjhd->bihd", p, v), lse, p


def randn(*shape, dtype=np.float32):
    return np.random.standard_normal(shape).astype(dtype)


def test_import_without_torch():
    code = ("import sys; sys.modules['torch'] = None\n"
            "import numpy as np, flashport\n"
            "q = np.random.standard_normal((1, 4, 2, 16)).astype(np.float32)\n"
            "out = flashport.flash_attn_func(q, q, q, causal=True)\n"
            "assert isinstance(out, np.ndarray) and out.shape == q.shape\n"
            "assert sys.modules['torch'] is None\n")
    subprocess.run([sys.executable, "-c", code], check=True)


@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64], ids=str)
@pytest.mark.parametrize("causal", [False, True])
def test_forward(dtype, causal):
    q, k, v = randn(2, 113, 4, 59, dtype=dtype), randn(2, 203, 2, 59, dtype=dtype), randn(2, 203, 2, 59, dtype=dtype)
    out, lse, probs = flashport.flash_attn_func(q, k, v, causal=causal, return_attn_probs=True)
    assert isinstance(out, np.ndarray) and out.dtype == dtype and out.shape == q.shape
    ref, lse_ref, p_ref = naive(q, k, v, causal)
    tol = {np.float16: 2e-3, np.float32: 1e-5, np.float64: 1e-7}[dtype]  # the core keeps the scale in fp32
    np.testing.assert_allclose(out.astype(np.float64), ref, atol=tol, rtol=0)
    np.testing.assert_allclose(lse, lse_ref, atol=1e-4)
    np.testing.assert_allclose(probs, p_ref, atol=1e-5)


def test_read_only_and_strided_inputs():
    qkv = randn(1, 7, 3, 2, 32)
    qkv.flags.writeable = False
    out = flashport.flash_attn_qkvpacked_func(qkv)  # q/k/v are strided views of read-only memory
    ref, _, _ = naive(qkv[:, :, 0], qkv[:, :, 1], qkv[:, :, 2])
    np.testing.assert_allclose(out, ref, atol=1e-5)
    read_only_out = np.zeros((1, 7, 2, 32), np.float32)
    read_only_out.flags.writeable = False
    with pytest.raises(ValueError, match="out"):
        ops.forward(qkv[:, :, 0], qkv[:, :, 1], qkv[:, :, 2], read_only_out)


def test_varlen_and_dropout_seed():
    lens = [4, 0, 9]
    cu = np.cumsum([0] + lens).astype(np.int32)
    q, k, v = (randn(sum(lens), 2, 16) for _ in range(3))
    out = flashport.flash_attn_varlen_func(q, k, v, cu, cu, 9, 9, causal=True)
    for b in range(len(lens)):
        rows = slice(cu[b], cu[b + 1])
        ref, _, _ = naive(q[rows][None], k[rows][None], v[rows][None], causal=True)
        np.testing.assert_allclose(out[rows], ref[0], atol=1e-5)
    np.random.seed(5)
    a = flashport.flash_attn_varlen_func(q, k, v, cu, cu, 9, 9, dropout_p=0.5)
    np.random.seed(5)
    b = flashport.flash_attn_varlen_func(q, k, v, cu, cu, 9, 9, dropout_p=0.5)
    np.testing.assert_array_equal(a, b)
    assert not np.array_equal(a, out)


def test_kvcache_in_place():
    k_cache, v_cache = np.zeros((2, 10, 1, 40), np.float32), np.zeros((2, 10, 1, 40), np.float32)
    k_cache[:, :3], v_cache[:, :3] = randn(2, 3, 1, 40), randn(2, 3, 1, 40)
    q, k, v = randn(2, 1, 2, 40), randn(2, 1, 1, 40), randn(2, 1, 1, 40)
    out, lse = flashport.flash_attn_with_kvcache(q, k_cache, v_cache, k, v, cache_seqlens=3, causal=True,
                                                 return_softmax_lse=True)
    np.testing.assert_array_equal(k_cache[:, 3], k[:, 0])
    np.testing.assert_array_equal(v_cache[:, 3], v[:, 0])
    ref, lse_ref, _ = naive(q, k_cache[:, :4], v_cache[:, :4], causal=True)
    np.testing.assert_allclose(out, ref, atol=1e-5)
    np.testing.assert_allclose(lse, lse_ref, atol=1e-5)


def test_kvcache_head_dim_padding_writes_back():
    """Head dim 20 is padded to 24 internally; the caller's cache must still receive the new tokens."""
    k_cache, v_cache = randn(1, 6, 1, 20), randn(1, 6, 1, 20)
    q, k, v = randn(1, 2, 1, 20), randn(1, 2, 1, 20), randn(1, 2, 1, 20)
    out = flashport.flash_attn_with_kvcache(q, k_cache, v_cache, k, v, cache_seqlens=np.array([1], np.int32),
                                           causal=True)
    np.testing.assert_array_equal(k_cache[:, 1:3], k)
    ref, _, _ = naive(q, k_cache[:, :3], v_cache[:, :3], causal=True)
    np.testing.assert_allclose(out, ref, atol=1e-5)


def test_cast_rounding():
    x = np.array([1.0, 1.0 + 2**-8, 1.0 + 3 * 2**-8, 448.0, 1000.0, -2**-9, 0.0], np.float32)
    bf16 = np.empty(x.shape, np.uint16)
    ops.cast(x, (bf16, "bfloat16"))
    back = np.empty(x.shape, np.float32)
    ops.cast((bf16, "bfloat16"), back)
    np.testing.assert_array_equal(back[:3], [1.0, 1.0, 1.0 + 2**-6])  # ties to even
    fp8 = np.empty(x.shape, np.uint8)
    ops.cast(x, (fp8, "float8_e4m3fn"))
    ops.cast((fp8, "float8_e4m3fn"), back)
    np.testing.assert_array_equal(back, [1.0, 1.0, 1.0, 448.0, 448.0, -2**-9, 0.0])  # saturating


class DLPackOnly:
    """A foreign tensor type that only speaks DLPack (as cupy or jax arrays do)."""

    def __init__(self, array):
        self._array = array

    def __dlpack__(self, **kwargs):
        return self._array.__dlpack__(**kwargs)

    def __dlpack_device__(self):
        return self._array.__dlpack_device__()


def test_generic_dlpack_producer():
    q, k, v = randn(1, 5, 2, 16), randn(1, 6, 2, 16), randn(1, 6, 2, 16)
    out = np.zeros((1, 5, 2, 16), np.float32)
    lse = np.zeros((1, 2, 5), np.float32)
    ops.forward(DLPackOnly(q), DLPackOnly(k), DLPackOnly(v), DLPackOnly(out), lse=lse, causal=True)
    ref, lse_ref, _ = naive(q, k, v, causal=True)
    np.testing.assert_allclose(out, ref, atol=1e-5)
    assert ops.inspect(DLPackOnly(q[:, ::2]))[:4] == ("float32", (1, 3, 2, 16), (160, 64, 16, 1), ("cpu", 0))
    assert ops.dlpack_stream(0) == 1 and ops.dlpack_stream(1234) == 1234


def test_reference_and_baseline_impls():
    q, k, v = (randn(1, 33, 2, 64, dtype=np.float16) for _ in range(3))
    outs = {}
    for impl in ("reference", "baseline", "automatic"):
        outs[impl] = np.zeros((1, 33, 2, 64), np.float16)
        ops.forward(q, k, v, outs[impl], causal=True, impl=impl)
    ref, _, _ = naive(q, k, v, causal=True)
    err = {name: np.abs(o.astype(np.float64) - ref).max() for name, o in outs.items()}
    assert err["reference"] <= err["baseline"] + 1e-6
    assert err["automatic"] <= 2 * err["baseline"] + 1e-5


def test_numpy_errors_name_the_argument():
    q = randn(1, 4, 2, 16)
    with pytest.raises(flashport.FlashportError, match="^k:") as info:
        flashport.flash_attn_func(q, [1.0], q)
    assert info.value.argument == "k"
    with pytest.raises(ValueError, match="^v:"):
        flashport.flash_attn_func(q, q, q.astype(np.float64))
    with pytest.raises(ValueError, match="^impl:"):
        ops.forward(q, q, q, np.zeros_like(q), impl="fastest")
    with pytest.raises(ValueError, match="^q:"):
        flashport.flash_attn_func(q.astype(np.complex64), q, q)
