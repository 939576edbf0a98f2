"""flashport.distributed (ring attention) on the CPU: gloo process groups of 2 and 4 spawned processes.

Every rank builds the same random global inputs (seeded from the test seed), takes its shard, runs the
ring forward and backward, and checks its rows of out and of dq / dk / dv against the float64 naive
reference by SPEC's accuracy rule (2x / 3x the same-precision baseline's error + 1e-5). The cases of one
world size run in one spawned group (imports dominate the cost); each case is reported as its own test.
"""

import datetime
import importlib.util
import json
import os
import sys
import tempfile
import traceback

import pytest

torch = pytest.importorskip("torch")
dist = pytest.importorskip("torch.distributed")
if not dist.is_available() or not dist.is_gloo_available():
    pytest.skip("torch.distributed with gloo is not available", allow_module_level=True)

import torch.multiprocessing as mp  # noqa: E402


# name: options. n: global sequence length; lens: varlen global sequence lengths (packed, batch 1).
CASES_2 = {
    "zigzag_causal_gqa_d59": dict(b=2, n=148, hq=6, hk=2, d=59, causal=True),
    "zigzag_full_softcap_bf16": dict(b=1, n=200, hq=4, hk=4, d=64, softcap=5.0, dtype="bfloat16"),
    "zigzag_causal_window": dict(b=1, n=148, hq=2, hk=1, d=32, causal=True, window=(45, -1)),
    "zigzag_window_both_sides": dict(b=1, n=132, hq=2, hk=2, d=40, window=(20, 7)),
    "contiguous_causal": dict(b=1, n=122, hq=3, hk=1, d=48, causal=True, layout="contiguous"),
    "varlen_causal_empty_seq": dict(lens=[52, 0, 20, 84], hq=4, hk=2, d=32, causal=True),
    "varlen_full_gqa_bf16": dict(lens=[36, 60], hq=6, hk=3, d=64, dtype="bfloat16"),
    "refusals": dict(refusals=True),
}
CASES_4 = {
    "zigzag_causal_window_gqa": dict(b=1, n=8 * 23, hq=4, hk=2, d=59, causal=True, window=(30, -1)),
    "varlen_causal": dict(lens=[8 * 9, 8 * 4], hq=2, hk=1, d=64, causal=True),
}


def _check(got, ref, base, factor, what):
    from reference import check_rule

    check_rule(got, ref, base, factor=factor, what=what)


def _dense_case(rank, world, opts, gen):
    import flashport.distributed as fd
    from reference import attention_ref

    dtype = getattr(torch, opts.get("dtype", "float32"))
    b, n, hq, hk, d = opts["b"], opts["n"], opts["hq"], opts["hk"], opts["d"]
    causal, window, softcap = opts.get("causal", False), opts.get("window", (-1, -1)), opts.get("softcap", 0.0)
    layout = opts.get("layout", "zigzag")
    q = torch.randn(b, n, hq, d, generator=gen).to(dtype)
    k, v = (torch.randn(b, n, hk, d, generator=gen).to(dtype) for _ in range(2))
    dout = torch.randn(b, n, hq, d, generator=gen).to(dtype)
    if layout == "zigzag":
        shard = lambda x: fd.zigzag_shard(x, 1)
    else:
        shard = lambda x: x.chunk(world, 1)[rank].contiguous()
    ql, kl, vl = (shard(x).requires_grad_() for x in (q, k, v))
    out = fd.ring_flash_attn_func(ql, kl, vl, causal=causal, window_size=window, softcap=softcap, layout=layout)
    assert out.shape == ql.shape and out.dtype == dtype
    out.backward(shard(dout))

    kw = dict(causal=causal, window=window, softcap=softcap)
    q64, k64, v64 = (x.double().requires_grad_() for x in (q, k, v))
    ref = attention_ref(q64, k64, v64, **kw)[0]
    ref_g = torch.autograd.grad(ref, (q64, k64, v64), dout.double())
    qb, kb, vb = (x.clone().requires_grad_() for x in (q, k, v))
    base = attention_ref(qb, kb, vb, upcast=False, **kw)[0]
    base_g = torch.autograd.grad(base, (qb, kb, vb), dout)
    _check(out, shard(ref), shard(base), 2.0, "out")
    for name, got, r, bs in zip(("dq", "dk", "dv"), (ql.grad, kl.grad, vl.grad), ref_g, base_g):
        assert got.dtype == dtype, name
        _check(got, shard(r), shard(bs), 3.0, name)
    if layout == "zigzag":  # the unshard helper restores the global order
        assert torch.equal(fd.zigzag_unshard(shard(q), 1), q)


def _gathered(x):
    shards = [torch.empty_like(x) for _ in range(dist.get_world_size())]
    dist.all_gather(shards, x.contiguous())
    return shards


def _varlen_case(rank, world, opts, gen):
    import flashport.distributed as fd
    from reference import varlen_ref

    dtype = getattr(torch, opts.get("dtype", "float32"))
    lens, hq, hk, d, causal = opts["lens"], opts["hq"], opts["hk"], opts["d"], opts.get("causal", False)
    cu = torch.tensor([0] + lens).cumsum(0).to(torch.int32)
    total = int(cu[-1])
    q = torch.randn(total, hq, d, generator=gen).to(dtype)
    k, v = (torch.randn(total, hk, d, generator=gen).to(dtype) for _ in range(2))
    dout = torch.randn(total, hq, d, generator=gen).to(dtype)
    shard = lambda x: fd.zigzag_shard_varlen(x, cu)[0]
    cu_l = fd.zigzag_shard_varlen(q, cu)[1]
    ql, kl, vl = (shard(x).requires_grad_() for x in (q, k, v))
    out, lse, _ = fd.ring_flash_attn_varlen_func(ql, kl, vl, cu_l, int(cu_l.diff().max()), causal=causal,
                                                 return_attn_probs=True)
    assert lse.shape == (hq, ql.shape[0])
    out.backward(shard(dout))

    q64, k64, v64 = (x.double().requires_grad_() for x in (q, k, v))
    ref, ref_lse = varlen_ref(q64, k64, v64, cu, cu, causal=causal)
    ref_g = torch.autograd.grad(ref, (q64, k64, v64), dout.double())
    qb, kb, vb = (x.clone().requires_grad_() for x in (q, k, v))
    base = varlen_ref(qb, kb, vb, cu, cu, causal=causal, upcast=False)[0]
    base_g = torch.autograd.grad(base, (qb, kb, vb), dout)
    _check(out, shard(ref), shard(base), 2.0, "out")
    lse_ref = fd.zigzag_shard_varlen(ref_lse.t().contiguous(), cu)[0].t()
    torch.testing.assert_close(lse, lse_ref.float(), atol=1e-4 if dtype == torch.float32 else 5e-2, rtol=0)
    for name, got, r, bs in zip(("dq", "dk", "dv"), (ql.grad, kl.grad, vl.grad), ref_g, base_g):
        _check(got, shard(r), shard(bs), 3.0, name)
    whole = fd.zigzag_unshard_varlen_list(_gathered(out.detach()), cu_l)
    torch.testing.assert_close(shard(whole), out.detach(), atol=0, rtol=0)


def _refusals(rank, world, opts, gen):
    import flashport
    import flashport.distributed as fd

    q = torch.randn(1, 6, 2, 16)

    def refused(argument, fn):
        with pytest.raises(ValueError) as info:
            fn()
        assert isinstance(info.value, flashport.FlashportError)
        assert str(info.value).startswith(argument + ":"), str(info.value)

    # A global length not divisible by 2 * world size: the helper and the function name the argument.
    refused("x", lambda: fd.zigzag_shard(torch.randn(1, 4 * world + 2, 2, 16), 1))
    refused("q", lambda: fd.ring_flash_attn_func(q[:, :5], q[:, :5], q[:, :5]))
    uneven = torch.tensor([0, 4, 10], dtype=torch.int32)
    refused("cu_seqlens", lambda: fd.zigzag_shard_varlen(torch.randn(10, 2, 16), uneven))
    odd = torch.tensor([0, 4, 7], dtype=torch.int32)
    refused("cu_seqlens", lambda: fd.ring_flash_attn_varlen_func(q[0, :7], q[0, :7], q[0, :7], odd, 4))
    refused("dropout_p", lambda: fd.ring_flash_attn_func(q, q, q, dropout_p=0.1))
    refused("alibi_slopes", lambda: fd.ring_flash_attn_func(q, q, q, alibi_slopes=torch.ones(2)))
    refused("k", lambda: fd.ring_flash_attn_func(q, q[:, :4], q[:, :4]))
    refused("layout", lambda: fd.ring_flash_attn_func(q, q, q, layout="striped"))
    even = torch.tensor([0, 4, 6], dtype=torch.int32)
    refused("window_size", lambda: fd.ring_flash_attn_varlen_func(q[0], q[0], q[0], even, 4, window_size=(3, 0)))
    refused("seqlen", lambda: fd.zigzag_indices(10, 0, world))


def _worker(rank, world, init, seed, cases, tmp):
    torch.set_num_threads(1)
    results = {}
    # A bounded timeout: a rank stuck in the ring (mismatched calls) fails the run instead of hanging it.
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=120))
    try:
        for i, (name, opts) in enumerate(cases):
            gen = torch.Generator().manual_seed(seed + i)
            try:
                if opts.get("refusals"):
                    _refusals(rank, world, opts, gen)
                elif "lens" in opts:
                    _varlen_case(rank, world, opts, gen)
                else:
                    _dense_case(rank, world, opts, gen)
                results[f"{name}/{rank}"] = ""
            except Exception:  # reported per case; the other ranks' ring calls must still line up
                results[f"{name}/{rank}"] = traceback.format_exc()
            dist.barrier()
    finally:
        dist.destroy_process_group()
        with open(os.path.join(tmp, f"rank{rank}.json"), "w") as f:
            json.dump(results, f)


def _run_group(world, cases, seed):
    """Runs the cases in `world` processes; {case name: failure text, '' when it passed}. The processes
    fork from a forkserver that imported torch and flashport once (a spawn per rank would import torch
    per rank: most of the cost on 2 cores); it is started with this process's sys.path, so the children
    import this module, reference.py and the same flashport."""
    mp.set_forkserver_preload(["torch", "torch.distributed", "flashport.distributed", "reference"])
    with tempfile.TemporaryDirectory() as tmp:
        init = "file://" + os.path.join(tmp, "rendezvous")
        mp.start_processes(_worker, args=(world, init, seed, list(cases.items()), tmp), nprocs=world, join=True,
                           start_method="forkserver")
        results = {}
        for r in range(world):
            with open(os.path.join(tmp, f"rank{r}.json")) as f:
                results.update(json.load(f))
    out = {}
    for name in cases:
        texts = [f"rank {r}:\n{results[f'{name}/{r}']}" for r in range(world) if results.get(f"{name}/{r}", "missing")]
        out[name] = "\n".join(texts)
    return out


@pytest.fixture(scope="module")
def results_2():
    from conftest import SESSION_SEED

    return _run_group(2, CASES_2, SESSION_SEED)


@pytest.fixture(scope="module")
def results_4():
    from conftest import SESSION_SEED

    return _run_group(4, CASES_4, SESSION_SEED + 1)


@pytest.mark.parametrize("case", CASES_2)
def test_ring_2_ranks(results_2, case):
    assert not results_2[case], results_2[case]


@pytest.mark.parametrize("case", CASES_4)
def test_ring_4_ranks(results_4, case):
    assert not results_4[case], results_4[case]


def test_plan_coalesces_causal_zigzag():
    """The causal zigzag ring makes one flashport call per step (chunks r and 2W-1-r): the whole shard
    causal at step 0, all queries against the first key chunk from earlier ranks, the second query chunk
    against all keys from later ranks."""
    from flashport.distributed import _ring

    w, c = 4, 10
    chunks = lambda r: [(r * c, c), ((2 * w - 1 - r) * c, c)]
    for r in range(w):
        for s in range(w):
            src = (r - s) % w
            calls = _ring.plan_step(chunks(r), chunks(src), None, 0, s == 0)
            expected = (_ring.Call(None, None, (-1, 0)) if s == 0 else _ring.Call(None, 0, (-1, -1)) if src < r
                        else _ring.Call(1, None, (-1, -1)))
            assert calls == [expected], (r, s, calls)


def test_ring_bench_runs_on_cpu(tmp_path):
    """bench/ring_bench.py at a tiny size on 2 CPU ranks: one row per length, with finite timings."""
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "bench", "ring_bench.py")
    spec = importlib.util.spec_from_file_location("ring_bench", path)
    bench = importlib.util.module_from_spec(spec)
    sys.modules["ring_bench"] = bench  # the ranks unpickle their entry point by module name
    spec.loader.exec_module(bench)
    sys.path.insert(0, os.path.dirname(path))
    try:
        out = tmp_path / "rows.jsonl"
        rows = bench.main(["--device", "cpu", "--world", "2", "--seqlens", "128", "--heads", "2", "--kv-heads", "1",
                           "--head-dim", "16", "--warmup", "0", "--iters", "1", "--out", str(out)])
    finally:
        sys.path.remove(os.path.dirname(path))
        del sys.modules["ring_bench"]
    assert [r["seqlen"] for r in rows] == [128] and len(out.read_text().splitlines()) == 1
    assert all(rows[0][key] > 0 for key in ("ring_s", "compute_s", "comm_s", "single_s", "tokens_per_s"))
