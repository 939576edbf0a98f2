"""torch integration: opcheck on every custom op, torch.compile(fullgraph=True), merge_states, streams,
and argument errors (ValueError naming the argument)."""

import math

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import flashport  # noqa: E402
from flashport import _torch_fp8, _torch_ops  # noqa: E402
from reference import attention_ref, work_dtype  # noqa: E402


def fwd_args(q, k, v, *, dropout=False, varlen=None, return_softmax=False):
    cu_q = cu_k = None
    max_q, max_k = q.shape[1], k.shape[1]
    if varlen is not None:
        cu_q = cu_k = varlen
        max_q = max_k = int((varlen[1:] - varlen[:-1]).max())
    rng = torch.tensor([123456789, 42], dtype=torch.int64) if dropout else None
    return (q, k, v, cu_q, cu_k, None, None, None, None, None, None, rng, max_q, max_k, q.shape[-1] ** -0.5, True,
            -1, -1, 0.0, 0.2 if dropout else 0.0, False, return_softmax, None)


@pytest.mark.parametrize("variant", ["dense", "dropout", "probs", "varlen"])
def test_opcheck_fwd(device, variant):
    if variant == "varlen":
        cu = torch.tensor([0, 3, 3, 10], dtype=torch.int32, device=device)
        q, k, v = (torch.randn(10, 2, 16, dtype=work_dtype(device), device=device, requires_grad=True) for _ in range(3))
        args = fwd_args(q, k, v, varlen=cu)
    else:
        q, k, v = (torch.randn(2, 7, 2, 16, dtype=work_dtype(device), device=device, requires_grad=True) for _ in range(3))
        args = fwd_args(q, k, v, dropout=variant == "dropout", return_softmax=variant == "probs")
    torch.library.opcheck(_torch_ops.fwd, args)


def test_opcheck_fwd_impl_bwd_kvcache_merge(device):
    q, k, v = (torch.randn(2, 7, 2, 16, dtype=work_dtype(device), device=device) for _ in range(3))
    out, lse, _ = _torch_ops.fwd(*fwd_args(q, k, v))
    torch.library.opcheck(_torch_ops.fwd_impl, fwd_args(q, k, v))  # what compiled graphs call
    bwd_args = (torch.randn_like(out), q, k, v, out, lse, None, None, None, None, None, None, 7, 7, 0.25, True, -1, -1,
                0.0, 0.0, False)
    torch.library.opcheck(_torch_ops.bwd, bwd_args)
    k_cache, v_cache = (torch.randn(2, 12, 2, 16, dtype=q.dtype, device=device) for _ in range(2))
    seqlens = torch.tensor([3, 5], dtype=torch.int32, device=device)
    kv_args = (q[:, :2], k_cache, v_cache, k[:, :2], v[:, :2], None, None, seqlens, None, None, None, None, None, None,
               None, 0.25, True, -1, -1, 0.0, True, 0)
    torch.library.opcheck(_torch_ops.fwd_kvcache, kv_args)
    torch.library.opcheck(_torch_ops.merge_states, (out, lse, out.clone(), lse - 1.0))


def test_opcheck_dense_ops(device):
    """flashport::fwd_dense / bwd_dense, the slim ops compiled graphs call for a plain dense call."""
    q, k, v = (torch.randn(2, 7, 2, 16, dtype=work_dtype(device), device=device) for _ in range(3))
    torch.library.opcheck(_torch_ops.fwd_dense, (q, k, v, 0.25, True, 3, 0, 5.0))
    out, lse = _torch_ops.fwd_dense(q, k, v, 0.25, True, 3, 0, 5.0)
    torch.library.opcheck(_torch_ops.bwd_dense, (torch.randn_like(out), q, k, v, out, lse, 0.25, True, 3, 0, 5.0, True))
    # flashport::fwd's dense call (max_seqlen 0: what flash_attn_func passes) decomposes into them.
    q.requires_grad_()
    args = fwd_args(q, k, v)
    torch.library.opcheck(_torch_ops.fwd, args[:12] + (0, 0) + args[14:])


def _graph_ops(fn, q, k, v):
    """The flashport ops the compiled forward and backward graphs of fn(q, k, v) call, fn's output there
    and its gradients for q, k, v (random output gradient; the backward graph is compiled on first use)."""
    from functorch.compile import make_boxed_func
    from torch._dynamo.backends.common import aot_autograd

    seen = set()

    def record(gm, example_inputs):
        seen.update(str(n.target) for n in gm.graph.nodes if str(n.target).startswith("flashport."))
        return make_boxed_func(gm.forward)

    compiled = torch.compile(fn, fullgraph=True, backend=aot_autograd(fw_compiler=record, bw_compiler=record))
    out = compiled(q, k, v)
    return seen, out, torch.autograd.grad(out, (q, k, v), torch.randn_like(out))


@pytest.mark.parametrize("deterministic", [False, True])
def test_compiled_dense_call_uses_slim_ops(device, deterministic):
    """A compiled plain dense call runs flashport::fwd_dense and bwd_dense (8 and 12 boxed arguments
    instead of fwd_impl's 23 and bwd's 21), and they give what the general ops give, bit for bit."""
    q, k, v = (torch.randn(2, 9, 4, 32, dtype=work_dtype(device), device=device, requires_grad=True) for _ in range(3))
    k2, v2 = k[:, :, :2].detach().requires_grad_(), v[:, :, :2].detach().requires_grad_()  # GQA 4/2

    def dense(q, k, v):
        return flashport.flash_attn_func(q, k, v, causal=True, window_size=(5, 0), softcap=7.0,
                                         deterministic=deterministic)

    torch.manual_seed(1)
    seen, out, grads = _graph_ops(dense, q, k2, v2)
    torch.manual_seed(1)
    dout = torch.randn_like(out)
    assert seen == {"flashport.fwd_dense.default", "flashport.bwd_dense.default"}
    args = (q, k2, v2, None, None, None, None, None, None, None, None, None, 0, 0, 32**-0.5, True, 5, 0, 7.0, 0.0,
            deterministic, False, None)
    with torch.no_grad():
        want_out, want_lse, _ = _torch_ops.fwd_impl(*args)
        want = _torch_ops.bwd(dout, q, k2, v2, want_out, want_lse, None, None, None, None, None, None, *args[12:21])
        got_out, got_lse = _torch_ops.fwd_dense(q, k2, v2, 32**-0.5, True, 5, 0, 7.0)
    assert torch.equal(out, want_out) and torch.equal(got_out, want_out) and torch.equal(got_lse, want_lse)
    for got, ref in zip(grads, want):
        assert torch.equal(got, ref)

    # Anything else keeps the general ops: varlen, alibi.
    flat = lambda t: t.reshape(-1, t.shape[2], t.shape[3])
    cu = torch.tensor([0, 9, 18], dtype=torch.int32, device=device)
    varlen = lambda q, k, v: flashport.flash_attn_varlen_func(flat(q), flat(k), flat(v), cu, cu, 9, 9)
    assert _graph_ops(varlen, q, k, v)[0] == {"flashport.fwd_impl.default", "flashport.bwd.default"}
    slopes = torch.rand(4, dtype=torch.float32, device=device)
    alibi = lambda q, k, v: flashport.flash_attn_func(q, k, v, alibi_slopes=slopes)
    assert _graph_ops(alibi, q, k, v)[0] == {"flashport.fwd_impl.default", "flashport.bwd.default"}
    # The probabilities are a forward output only: the backward is the plain dense one.
    probs = lambda q, k, v: flashport.flash_attn_func(q, k, v, return_attn_probs=True)[0]
    fwd_op = "flashport.fwd_impl.default" if device == "cpu" else "flashport.fwd_dense.default"
    assert _graph_ops(probs, q, k, v)[0] == {fwd_op, "flashport.bwd_dense.default"}


def test_ops_on_meta_tensors():
    """The registered ops give shapes on meta tensors (their fake kernels), as custom ops do."""
    q = torch.randn(2, 7, 2, 16, device="meta", requires_grad=True)
    out, lse, s_dmask = _torch_ops.fwd(*fwd_args(q, q, q))
    assert out.shape == q.shape and out.is_meta and lse.shape == (2, 2, 7) and s_dmask.shape == (0,)
    (dq,) = torch.autograd.grad(out, (q,), torch.ones_like(out))
    assert dq.shape == q.shape and dq.is_meta


def test_opcheck_fp8(device):
    q, k, v = (torch.randn(2, 7, 2, 16, dtype=work_dtype(device), device=device) for _ in range(3))
    fp8_args = (q.requires_grad_(), k, v, None, None, None, None, None, 7, 7, 0.25, False, -1, -1, 0.0, 0.0, False,
                False, torch.float8_e4m3fn)
    torch.library.opcheck(_torch_fp8.fwd_fp8, fp8_args)


def attn_step(q, k, v, cu):
    """A small model step mixing dense, varlen and packed calls, for torch.compile (which traces the packed
    call through the unpacked op; eagerly it writes one packed gradient)."""
    dense = flashport.flash_attn_func(q, k, v, causal=True, softcap=20.0)
    flat = lambda t: t.reshape(-1, t.shape[2], t.shape[3])
    varlen = flashport.flash_attn_varlen_func(flat(q), flat(k), flat(v), cu, cu, q.shape[1], q.shape[1],
                                              window_size=(3, 3))
    packed = flashport.flash_attn_qkvpacked_func(torch.stack((q, k, v), 2), causal=True)
    return dense.sum() + varlen.float().sum() + (packed.float() * packed.float()).sum()


def test_compile_fullgraph_aot_eager(device):
    q, k, v = (torch.randn(2, 9, 2, 40, dtype=work_dtype(device), device=device, requires_grad=True)
               for _ in range(3))
    cu = torch.tensor([0, 9, 18], dtype=torch.int32, device=device)
    compiled = torch.compile(attn_step, fullgraph=True, backend="aot_eager")
    got = torch.autograd.grad(compiled(q, k, v, cu), (q, k, v))
    want = torch.autograd.grad(attn_step(q, k, v, cu), (q, k, v))
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b)


def test_compile_dropout_and_kvcache(device):
    q = torch.randn(1, 8, 2, 32, dtype=work_dtype(device), device=device, requires_grad=True)

    def drop(q):
        return flashport.flash_attn_func(q, q, q, dropout_p=0.3)

    compiled = torch.compile(drop, fullgraph=True, backend="aot_eager")
    torch.manual_seed(3)
    a = compiled(q)
    torch.manual_seed(3)
    b = drop(q)
    torch.testing.assert_close(a, b)
    k_cache = torch.zeros(1, 16, 2, 32, dtype=q.dtype, device=device)
    v_cache = torch.zeros(1, 16, 2, 32, dtype=q.dtype, device=device)
    new = torch.randn(1, 1, 2, 32, dtype=q.dtype, device=device)

    def decode(q, k_cache, v_cache, new, n):
        return flashport.flash_attn_with_kvcache(q, k_cache, v_cache, new, new, cache_seqlens=n, causal=True)

    out = torch.compile(decode, fullgraph=True, backend="aot_eager")(q[:, :1].detach(), k_cache, v_cache, new, 4)
    assert torch.equal(k_cache[:, 4], new[:, 0]) and torch.equal(v_cache[:, 4], new[:, 0])
    assert out.shape == (1, 1, 2, 32)


@pytest.mark.slow
@pytest.mark.filterwarnings("ignore:dynamo_pgo force disabled")
def test_compile_inductor():
    q, k, v = (torch.randn(1, 16, 2, 64, requires_grad=True) for _ in range(3))
    fn = lambda q, k, v: (flashport.flash_attn_func(q, k, v, causal=True) * 2).sum()
    # Compile afresh: inductor's on-disk caches key on the traced graph, not on what flashport's ops do,
    # so another flashport version's artifact (in the shared cache directory) could stand in for this one.
    with torch._inductor.config.patch(force_disable_caches=True):
        got = torch.autograd.grad(torch.compile(fn, fullgraph=True, backend="inductor")(q, k, v), (q, k, v))
    want = torch.autograd.grad(fn(q, k, v), (q, k, v))
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b)


def test_merge_states(device):
    b, sq, sk, h, d, split = 2, 11, 30, 3, 32, 13
    dtype = work_dtype(device)
    tol = 1e-5 if dtype == torch.float32 else 2e-3
    q = torch.randn(b, sq, h, d, dtype=dtype, device=device)
    k, v = torch.randn(b, sk, h, d, dtype=dtype, device=device), torch.randn(b, sk, h, d, dtype=dtype, device=device)
    out_a, lse_a, _ = flashport.flash_attn_func(q, k[:, :split], v[:, :split], return_attn_probs=True)
    out_b, lse_b, _ = flashport.flash_attn_func(q, k[:, split:], v[:, split:], return_attn_probs=True)
    out, lse = flashport.merge_states(out_a, lse_a, out_b, lse_b)
    full, lse_full, _ = flashport.flash_attn_func(q, k, v, return_attn_probs=True)
    torch.testing.assert_close(out, full, atol=tol, rtol=tol)
    torch.testing.assert_close(lse, lse_full, atol=1e-5, rtol=1e-5)
    # A part with no keys (lse -inf) leaves the other part unchanged; both empty gives 0 and -inf.
    empty = torch.full_like(lse_a, -math.inf)
    out, lse = flashport.merge_states(out_a, lse_a, torch.zeros_like(out_b), empty)
    torch.testing.assert_close(out, out_a)
    out, lse = flashport.merge_states(out_a, empty, out_b, empty)
    assert torch.all(out == 0) and torch.all(torch.isinf(lse))
    np_out, np_lse = flashport.merge_states(*(t.cpu().numpy() for t in (out_a, lse_a, out_b, lse_b)))
    assert isinstance(np_out, np.ndarray) and np.allclose(np_out, full.float().cpu().numpy(), atol=tol)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_current_stream():
    q, k, v = (torch.randn(2, 64, 4, 64, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    want = flashport.flash_attn_func(q, k, v, causal=True)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            got = flashport.flash_attn_func(q, k, v, causal=True)
    torch.cuda.current_stream().wait_stream(side)
    assert torch.equal(got, want)


def test_cpu_and_gpu_agree_when_available():
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA device")
    q, k, v = (torch.randn(1, 37, 2, 64, dtype=torch.float16) for _ in range(3))
    cpu = flashport.flash_attn_func(q, k, v, causal=True)
    gpu = flashport.flash_attn_func(q.cuda(), k.cuda(), v.cuda(), causal=True).cpu()
    ref, _ = attention_ref(q, k, v, causal=True)
    assert (gpu.double() - ref).abs().max() <= 2 * (cpu.double() - ref).abs().max() + 2e-3


def expect_error(argument, fn, *args, **kwargs):
    with pytest.raises(ValueError) as info:
        fn(*args, **kwargs)
    assert isinstance(info.value, flashport.FlashportError)
    assert info.value.argument == argument, str(info.value)
    assert str(info.value).startswith(argument + ":"), str(info.value)


def test_bad_inputs_name_the_argument():
    q = torch.randn(1, 5, 4, 32)
    kv = torch.randn(1, 5, 3, 32)
    fa = flashport.flash_attn_func
    expect_error("q", fa, q[0], q, q)
    expect_error("k", fa, q, kv, kv)  # 4 query heads, 3 kv heads
    expect_error("k", fa, q, q.numpy(), q)
    expect_error("q", fa, [1.0], q, q)
    expect_error("v", fa, q, q, q.half())
    expect_error("window_size", fa, q, q, q, window_size=(3,))
    expect_error("window_size", fa, q, q, q, window_size=(-2, 0))
    expect_error("dropout_p", fa, q, q, q, dropout_p=1.0)
    expect_error("softcap", fa, q, q, q, softcap=-1.0)
    expect_error("alibi_slopes", fa, q, q, q, alibi_slopes=torch.ones(3))
    expect_error("alibi_slopes", fa, q, q, q, alibi_slopes=torch.ones(4, dtype=torch.float64))
    lens = torch.tensor([0, 2, 5], dtype=torch.int32)
    flat = q[0]
    fv = flashport.flash_attn_varlen_func
    expect_error("cu_seqlens_q", fv, flat, flat, flat, lens.long(), lens, 3, 3)
    expect_error("cu_seqlens_q", fv, flat, flat, flat, torch.tensor([0, 2, 4], dtype=torch.int32), lens, 3, 3)
    expect_error("max_seqlen_q", fv, flat, flat, flat, lens, lens, 2, 3)
    cache = torch.zeros(1, 8, 4, 32)
    kvc = flashport.flash_attn_with_kvcache
    expect_error("cache_seqlens", kvc, q[:, :1], cache, cache, q[:, :1], q[:, :1], cache_seqlens=8)
    expect_error("cache_batch_idx", kvc, q[:, :1], cache, cache, cache_seqlens=2,
                 cache_batch_idx=torch.tensor([3], dtype=torch.int32))
    expect_error("out_b", flashport.merge_states, q, torch.zeros(1, 4, 5), q[:, :2], torch.zeros(1, 4, 5))


def test_unsupported_device_is_named():
    q = torch.randn(1, 4, 2, 16)
    expect_error("k", flashport.flash_attn_func, q, q.to("meta"), q)


def test_eager_path_skips_the_custom_op_and_matches_it(device, monkeypatch):
    """Eager calls run the op's implementation without the custom-op dispatcher, with the same outputs
    and gradients as the registered op (which torch.compile sees)."""
    dtype = work_dtype(device)
    q, k, v = (torch.randn(2, 33, 4, 40, dtype=dtype, device=device, requires_grad=True) for _ in range(3))
    g = torch.randn(2, 33, 4, 40, dtype=dtype, device=device)
    want = flashport.flash_attn_func(q, k, v, causal=True, softcap=15.0)
    want_grads = torch.autograd.grad(want, (q, k, v), g)

    def refuse(*args, **kwargs):
        raise AssertionError("the eager path went through the custom op")

    monkeypatch.setattr(_torch_ops, "fwd", refuse)
    monkeypatch.setattr(_torch_ops, "bwd", refuse)
    got = flashport.flash_attn_func(q, k, v, causal=True, softcap=15.0)
    assert got.grad_fn is not None and type(got.grad_fn).__name__.startswith("_Attention")
    got_grads = torch.autograd.grad(got, (q, k, v), g)
    monkeypatch.undo()
    # The registered op with its autograd formula, called directly.
    op_out = _torch_ops.fwd(*fwd_args(q, k, v))[0]
    torch.testing.assert_close(got, want, atol=0, rtol=0)
    for a, b in zip(got_grads, want_grads):
        torch.testing.assert_close(a, b, atol=0, rtol=0)
    plain = flashport.flash_attn_func(q, k, v, causal=True)
    torch.testing.assert_close(op_out, plain, atol=0, rtol=0)
    with torch.no_grad():
        assert flashport.flash_attn_func(q, k, v, causal=True).grad_fn is None


def test_backward_without_an_output_gradient(device):
    """Gradients are not materialised: when no gradient reaches out, backward gives none to q, k, v
    (like SDPA) instead of running on zeros."""

    class DropGrad(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            return x.clone()

        @staticmethod
        def backward(ctx, grad):
            return None

    q, k, v = (torch.randn(1, 5, 2, 16, dtype=work_dtype(device), device=device, requires_grad=True) for _ in range(3))
    out = flashport.flash_attn_func(q, k, v, causal=True)
    (DropGrad.apply(out).sum() + q.sum()).backward()
    assert torch.equal(q.grad, torch.ones_like(q)) and k.grad is None and v.grad is None


def test_low_level_call_reads_grad_tensors_and_parameters(device):
    """The binding reads torch tensors from their attributes: tensors that require grad, nn.Parameter,
    strided views (offset data pointers) and positional arguments all reach C++ unchanged."""
    dtype = work_dtype(device)
    base = torch.randn(1, 9, 6, 32, dtype=dtype, device=device)
    q = torch.nn.Parameter(base[:, :, :2])  # a view: head stride 32, row stride 192
    k = base[:, :, 2:4].clone().requires_grad_()
    v = base[:, :, 4:].clone()
    out = torch.full((1, 9, 2, 32), float("nan"), dtype=dtype, device=device)
    lse = torch.full((1, 2, 9), float("nan"), device=device)
    flashport.ops.forward(q, k, v, out, lse, None, None, None, None, 0, 0, None, None, True)
    ref, _ = attention_ref(q.detach().cpu(), k.detach().cpu(), v.cpu(), causal=True)
    assert (out.double().cpu() - ref).abs().max() < (2e-2 if dtype != torch.float32 else 1e-5)
    assert not torch.isnan(lse).any()
