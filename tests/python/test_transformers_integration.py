"""flashport.integrations.transformers: tiny randomly initialised Llama / Mistral / Gemma-2 models run with
attn_implementation="flashport" against the same weights on transformers' sdpa (eager where sdpa lacks the
feature: softcap): logits and parameter gradients, unpadded and with left/right padding, explicit 4-D masks,
packed sequences, and cached generation."""

import sys

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

import flashport  # noqa: E402
from flashport.integrations import transformers as fp_hf  # noqa: E402

from conftest import devices  # noqa: E402

NAME = fp_hf.register()
SEQ, BATCH = 32, 3

# (device, dtype, tolerance relative to the reference's largest magnitude). CUDA kernels are fp16/bf16 only.
CASES = [("cpu", torch.float32, 2e-4)] + [("cuda", torch.bfloat16, 3e-2) for d in devices() if d == "cuda"]
CASE_IDS = [f"{d}-{str(t)[6:]}" for d, t, _ in CASES]


def config(arch):
    common = dict(vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, head_dim=16, max_position_embeddings=64, initializer_range=0.1,
                  pad_token_id=0)
    if arch == "llama":
        return transformers.LlamaConfig(**common)
    if arch == "mistral":  # window smaller than the sequence, so it masks something
        return transformers.MistralConfig(sliding_window=8, **common)
    # Gemma-2 alternates sliding-window and full layers; a small logit softcap so tanh bends the scores.
    return transformers.Gemma2Config(sliding_window=8, attn_logit_softcapping=2.0, final_logit_softcapping=None,
                                     query_pre_attn_scalar=16, **common)


def reference_impl(arch):
    return "eager" if arch == "gemma2" else "sdpa"  # transformers' sdpa raises on softcap


def models(arch, device, dtype, seed):
    torch.manual_seed(seed)
    # One config each: from_config keeps the object it is given and sets the implementation on it.
    ref = transformers.AutoModelForCausalLM.from_config(config(arch), attn_implementation=reference_impl(arch))
    ours = transformers.AutoModelForCausalLM.from_config(config(arch), attn_implementation=NAME)
    ours.load_state_dict(ref.state_dict())
    assert ours.config._attn_implementation == NAME and ref.config._attn_implementation == reference_impl(arch)
    return [m.to(device=device, dtype=dtype).eval() for m in (ref, ours)]


def padding_mask(device):
    """Row 0 full, row 1 left-padded by 5, row 2 right-padded by 7."""
    mask = torch.ones(BATCH, SEQ, dtype=torch.long, device=device)
    mask[1, :5] = 0
    mask[2, SEQ - 7:] = 0
    return mask


def run(model, ids, keep, weights, **kw):
    """Logits at the kept positions, and every parameter's gradient of a fixed random projection of them
    (indexing, not multiplying by the mask, so whatever a reference puts at padded rows stays out)."""
    model.zero_grad(set_to_none=True)
    logits = model(input_ids=ids, **kw).logits[keep]
    (logits.float() * weights).sum().backward()
    return logits.detach().float(), {n: p.grad.float() for n, p in model.named_parameters() if p.grad is not None}


def assert_close(ours, ref, tol, what):
    scale = ref.abs().max().clamp_min(1e-6)
    err = ((ours - ref).abs().max() / scale).item()
    assert err <= tol, f"{what}: max |ours - ref| / max |ref| = {err:.2e} > {tol:.0e}"


def compare(arch, device, dtype, tol, seed, masked):
    ref, ours = models(arch, device, dtype, seed)
    ids = torch.randint(1, 128, (BATCH, SEQ), device=device)
    mask = padding_mask(device) if masked else None
    keep = mask.bool() if masked else torch.ones(BATCH, SEQ, dtype=torch.bool, device=device)
    weights = torch.randn(int(keep.sum()), 128, device=device)
    kw = dict(attention_mask=mask) if masked else {}
    ref_logits, ref_grads = run(ref, ids, keep, weights, **kw)
    logits, grads = run(ours, ids, keep, weights, **kw)
    assert torch.isfinite(logits).all()
    assert_close(logits, ref_logits, tol, "logits")
    assert grads.keys() == ref_grads.keys() and len(grads) > 0
    for name, g in grads.items():
        assert_close(g, ref_grads[name], 2 * tol, f"grad {name}")
    return ref, ids, kw, keep, ref_logits


@pytest.mark.parametrize("case", CASES, ids=CASE_IDS)
@pytest.mark.parametrize("arch", ["llama", "mistral", "gemma2"])
@pytest.mark.parametrize("masked", [False, True], ids=["dense", "padded"])
def test_matches_reference(arch, case, masked, _seed):
    device, dtype, tol = case
    ref, ids, kw, keep, ref_logits = compare(arch, device, dtype, tol, _seed, masked)
    if arch == "llama" or dtype != torch.float32:
        return
    # The feature under test must matter here, or the comparison above proves nothing about it.
    feature = "sliding_window" if arch == "mistral" else "attn_logit_softcapping"
    setattr(ref.config, feature, None)
    for layer in ref.model.layers:  # Gemma-2 copies both onto each attention module
        for attr in ("sliding_window", "attn_logit_softcapping"):
            if getattr(layer.self_attn, attr, None) is not None and attr == feature:
                setattr(layer.self_attn, attr, None)
    with torch.no_grad():
        without = ref(input_ids=ids, **kw).logits[keep].float()
    assert (without - ref_logits).abs().max() > 100 * tol * ref_logits.abs().max(), f"{feature} changes nothing"


def four_d_mask(mask, dtype=torch.bool):
    """Causal + padding as a 4-D (b, 1, s, s) mask, boolean (True = attend) or additive."""
    s = mask.shape[1]
    allowed = torch.tril(torch.ones(s, s, dtype=torch.bool, device=mask.device))[None] & mask.bool()[:, None, :]
    allowed = allowed[:, None]
    if dtype == torch.bool:
        return allowed
    return torch.zeros(allowed.shape, dtype=dtype, device=mask.device).masked_fill(~allowed, torch.finfo(dtype).min)


@pytest.mark.parametrize("mask_dtype", [torch.bool, torch.float32], ids=["bool", "additive"])
def test_4d_causal_padding_mask(mask_dtype, _seed):
    ref, ours = models("llama", "cpu", torch.float32, _seed)
    ids = torch.randint(1, 128, (BATCH, SEQ))
    mask = padding_mask("cpu")
    keep = mask.bool()
    with torch.no_grad():
        want = ref(input_ids=ids, attention_mask=mask).logits[keep]
        got = ours(input_ids=ids, attention_mask=four_d_mask(mask, mask_dtype)).logits[keep]
    assert_close(got, want, 2e-4, "logits")


def test_arbitrary_4d_mask_raises(_seed):
    _, ours = models("llama", "cpu", torch.float32, _seed)
    ids = torch.randint(1, 128, (BATCH, SEQ))
    holes = four_d_mask(torch.ones(BATCH, SEQ, dtype=torch.long)).clone()
    holes[:, :, SEQ - 1, 3] = False  # one key hidden from one query only: no padding pattern does that
    with pytest.raises(flashport.FlashportError, match="attention_mask") as exc:
        ours(input_ids=ids, attention_mask=holes)
    assert exc.value.argument == "attention_mask"
    bias = four_d_mask(torch.ones(BATCH, SEQ, dtype=torch.long), torch.float32) + 0.5
    with pytest.raises(flashport.FlashportError, match="attention_mask: holds additive biases"):
        ours(input_ids=ids, attention_mask=bias)


@pytest.mark.parametrize("told_by", ["position_ids", "cu_seq_lens"])
def test_packed_sequences(told_by, _seed):
    """Two sequences packed into one row, told apart by restarting position_ids or by cu_seq_lens_q/k (what
    transformers' padding-free data collator passes), equal each run alone."""
    ref, ours = models("llama", "cpu", torch.float32, _seed)
    a, b = torch.randint(1, 128, (1, 20)), torch.randint(1, 128, (1, 12))
    pos = torch.cat([torch.arange(20), torch.arange(12)])[None]
    kw = dict(position_ids=pos)
    if told_by == "cu_seq_lens":
        cu = torch.tensor([0, 20, 32], dtype=torch.int32)
        kw.update(cu_seq_lens_q=cu, cu_seq_lens_k=cu, max_length_q=20, max_length_k=20)
    with torch.no_grad():
        packed = ours(input_ids=torch.cat([a, b], 1), **kw).logits
        alone = torch.cat([ref(input_ids=a).logits, ref(input_ids=b).logits], 1)
    assert_close(packed, alone, 2e-4, "packed logits")


@pytest.mark.parametrize("case", CASES, ids=CASE_IDS)
@pytest.mark.parametrize("arch", ["llama", "mistral"])
def test_generate_with_cache(arch, case, _seed):
    """Prefill with left padding, then decode one query per step against the KV cache (causal aligned
    bottom-right; Llama's full cache keeps the padding mask in every step, Mistral's sliding-window cache
    drops it once the padding leaves the window): each step's logits match the reference's for as long as
    both have produced the same tokens (a bf16 near-tie in the argmax may fork them; fp32 must not)."""
    device, dtype, tol = case
    ref, ours = models(arch, device, dtype, _seed)
    prompt = 12
    ids = torch.randint(1, 128, (2, prompt), device=device)
    mask = torch.ones_like(ids)
    mask[1, :4] = 0
    kw = dict(attention_mask=mask, max_new_tokens=6, do_sample=False, pad_token_id=0, output_logits=True,
              return_dict_in_generate=True)
    with torch.no_grad():
        want, got = ref.generate(ids, **kw), ours.generate(ids, **kw)
    assert got.sequences.shape == want.sequences.shape
    same = (got.sequences[:, prompt:] == want.sequences[:, prompt:]).all(0).tolist() + [False]
    if dtype == torch.float32:
        assert all(same[:-1]), f"greedy tokens differ: {got.sequences} vs {want.sequences}"
    fork = same.index(False)  # the first step whose token differs still had the same inputs
    for step in range(min(fork + 1, len(got.logits))):
        assert_close(got.logits[step].float(), want.logits[step].float(), tol, f"logits of decode step {step}")


def test_register_needs_attention_interface(monkeypatch):
    # As if an older transformers. sys.modules' entry, not the module imported above: transformers' lazy
    # module can replace itself there once models are built.
    monkeypatch.setattr(sys.modules["transformers"], "AttentionInterface", None)
    with pytest.raises(ImportError, match="transformers.AttentionInterface") as exc:
        fp_hf.register("flashport-test")
    assert isinstance(exc.value, flashport.FlashportError)
    assert exc.value.argument == "transformers.AttentionInterface"


def test_unsupported_features_are_named():
    q = torch.randn(1, 4, 8, 16)
    with pytest.raises(flashport.FlashportError, match="s_aux"):
        fp_hf.attention_forward(torch.nn.Module(), q, q, q, None, s_aux=torch.zeros(4))
