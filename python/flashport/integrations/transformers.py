"""flashport as an attention implementation of Hugging Face transformers.

    import flashport.integrations.transformers as fp_hf
    fp_hf.register()                                   # once per process
    model = AutoModelForCausalLM.from_config(cfg, attn_implementation="flashport")
    model.set_attn_implementation("flashport")         # or switch an existing model

`register(name)` puts `attention_forward` into transformers' attention registry (`AttentionInterface`) and,
where the installed transformers builds masks per implementation (`AttentionMaskInterface`), gives the name
the mask builder of transformers' own flash-attn path: attention then receives either no mask or a 2-D
(batch, kv_len) padding mask, never a dense 4-D mask.

What `attention_forward` covers (query/key/value arrive as (batch, heads, seqlen, head_dim), the output
leaves as (batch, seqlen, heads, head_dim), like transformers' sdpa and flash-attn functions):
- causal from the `is_causal` keyword, else `module.is_causal`; flashport aligns causal masks bottom-right
  (flash-attn >= 2.1), which is what a KV cache needs when seqlen_q < seqlen_k;
- GQA/MQA natively (no repeat_kv), `scaling`, `softcap` (Gemma-2), `sliding_window` (Mistral, Gemma-2),
  dropout in training only;
- padding: a 2-D padding mask, or a 4-D boolean / additive mask that is exactly a causal (or sliding-window)
  mask with padding, is unpadded into flashport's varlen call and the output padded back (zeros at padded
  queries); packed sequences via `cu_seq_lens_q/k` + `max_length_q/k`, or via `position_ids` that restart
  (batch 1, no mask), run varlen directly. Any other 4-D mask raises a FlashportError naming attention_mask.
Not covered (FlashportError naming the argument): attention sinks (`s_aux`), additive position biases.
"""

from __future__ import annotations

from .. import FlashportError, flash_attn_func, flash_attn_varlen_func
from .._common import error


class MissingFeatureError(FlashportError, ImportError):
    """transformers, or a feature of it that the integration needs, is not installed. Both a FlashportError
    (like every flashport error) and an ImportError (what callers probing optional features catch)."""


def _missing(feature: str, message: str) -> MissingFeatureError:
    exc = MissingFeatureError(f"{feature}: {message}")
    exc.argument = feature
    return exc


# ---------------------------------------------------------------------------------------------
# Registration.


def register(name: str = "flashport") -> str:
    """Register flashport under `name` with transformers; returns the name. Idempotent."""
    try:
        import transformers
    except ImportError as e:
        raise _missing("transformers", "is not installed (pip install transformers)") from e
    registry = getattr(transformers, "AttentionInterface", None)
    if registry is None or not hasattr(registry, "register"):
        raise _missing("transformers.AttentionInterface",
                       f"transformers {transformers.__version__} has no attention registry (it came with 4.48); "
                       "upgrade transformers")
    registry.register(name, attention_forward)
    # Without a mask builder for the name, transformers >= 4.53 builds no mask at all for it (it assumes a
    # backend that needs none) and padding would be silently ignored. The flash-attn builder hands over the
    # 2-D padding mask, or None when nothing is padded. Before 4.53 models build 4-D masks themselves,
    # which attention_forward reads.
    masks = getattr(transformers, "AttentionMaskInterface", None)
    if masks is not None:
        from transformers.masking_utils import flash_attention_mask

        masks.register(name, flash_attention_mask)
    if "flash" in name:
        _teach_flash_loader(name)
    return name


def _teach_flash_loader(name: str) -> None:
    """transformers takes every implementation whose name contains "flash" for a flash-attn build
    (`utils.generic.is_flash_attention_requested` is a substring test), and when a model is built for one it
    preloads that build's functions by name (`modeling_flash_attention_utils.lazy_import_flash_attention`),
    which raises for a name it does not know, so `from_pretrained(..., attn_implementation="flashport")` would
    fail. flashport has flash-attn's API, so the loader is taught to return flashport's functions for this
    name; every other name goes to the original loader."""
    try:
        from transformers import modeling_flash_attention_utils as fa_utils
    except ImportError:
        return
    loader = getattr(fa_utils, "_lazy_imports", None)
    if loader is None:  # a transformers without name-based preloading: nothing to teach
        return
    names = getattr(loader, "flashport_names", None)
    if names is None:
        original = loader

        def loader(implementation, *args, **kwargs):
            if implementation in loader.flashport_names:
                import flashport

                return (flashport.flash_attn_func, flashport.flash_attn_varlen_func, flashport.flash_attn_with_kvcache,
                        getattr(fa_utils, "_pad_input", None), getattr(fa_utils, "_unpad_input", None))
            return original(implementation, *args, **kwargs)

        loader.flashport_names = names = set()
        fa_utils._lazy_imports = loader
    names.add(name)


# ---------------------------------------------------------------------------------------------
# The attention function.


def attention_forward(module, query, key, value, attention_mask, scaling=None, dropout=0.0, sliding_window=None,
                      softcap=None, **kwargs):
    """transformers' attention-function contract: query (b, hq, sq, d), key/value (b, hk, sk, d), hq % hk == 0;
    returns (attn_output (b, sq, hq, d), None). See the module docstring for what is covered."""
    for unsupported, what in (("s_aux", "attention sinks"), ("position_bias", "additive position biases")):
        if kwargs.get(unsupported) is not None:
            raise error(unsupported, f"{what} are not supported by flashport; use attn_implementation='eager'")
    q, k, v = (x.transpose(1, 2) for x in (query, key, value))  # flash layout (b, s, h, d), a view
    is_causal = kwargs.get("is_causal")
    if is_causal is None:
        is_causal = getattr(module, "is_causal", True)
    opts = dict(dropout_p=dropout if getattr(module, "training", False) else 0.0, softmax_scale=scaling,
                causal=bool(is_causal), softcap=float(softcap or 0.0),
                window_size=_window(sliding_window, k.shape[1]))

    if attention_mask is not None:
        if attention_mask.dim() == 2:
            return _padded(q, k, v, attention_mask.bool(), opts), None
        if attention_mask.dim() == 4:
            return _padded_4d(q, k, v, attention_mask, opts), None
        raise error("attention_mask", f"expected a 2-D (batch, kv_len) padding mask or a 4-D mask, got shape "
                                      f"{tuple(attention_mask.shape)}")

    cu_q, cu_k = kwargs.get("cu_seq_lens_q"), kwargs.get("cu_seq_lens_k")
    if cu_q is None or cu_k is None:
        cu_q = cu_k = _packed_cu_seqlens(kwargs.get("position_ids"), q)
    if cu_q is not None:  # packed: the batch's tokens are one stream of sequences
        longest = lambda cu: int((cu[1:] - cu[:-1]).max())
        max_q, max_k = kwargs.get("max_length_q"), kwargs.get("max_length_k")
        max_q = longest(cu_q) if max_q is None else max_q
        max_k = longest(cu_k) if max_k is None else max_k
        b, sq, h, _ = q.shape
        flat = lambda x: x.reshape(-1, *x.shape[2:])
        out = flash_attn_varlen_func(flat(q), flat(k), flat(v), _int32(cu_q), _int32(cu_k), max_q, max_k, **opts)
        return out.view(b, sq, h, out.shape[-1]), None
    return flash_attn_func(q, k, v, **opts), None


def _window(sliding_window, kv_len: int) -> tuple[int, int]:
    """transformers' flash-attn convention: a window of `sliding_window` tokens is (sliding_window - 1) each
    side (causal clamps the right side to 0), so query i sees keys i - sliding_window < j <= i, the same
    keys as its eager/sdpa masks; no window when every key fits in it."""
    if sliding_window is None or kv_len <= sliding_window:
        return (-1, -1)
    return (sliding_window - 1, sliding_window - 1)


def _int32(x):
    import torch

    return x.to(torch.int32)


def _packed_cu_seqlens(position_ids, q):
    """cu_seqlens of sequences packed into one row (batch 1) by restarting position_ids, or None when the row
    is one sequence. Reads the ids on the host (a sync), as transformers' flash-attn path does."""
    import torch

    if position_ids is None or q.shape[0] != 1 or q.shape[1] <= 1 or position_ids.shape[-1] != q.shape[1]:
        return None
    pos = position_ids.reshape(-1)
    starts = torch.nonzero(pos[1:] != pos[:-1] + 1).flatten() + 1
    if starts.numel() == 0:
        return None
    ends = torch.tensor([0, pos.numel()], device=pos.device)
    return torch.cat([ends[:1], starts, ends[1:]]).to(torch.int32)


# ---------------------------------------------------------------------------------------------
# Padding masks: unpad into varlen, pad back.


def _padded(q, k, v, keep, opts):
    """keep: bool (b, L), True at real tokens. Queries are the last sq positions of each row (sq == L at
    prefill, 1 when decoding), as in transformers' flash-attn path."""
    keys = _match_mask_length(k, v, keep.shape[1])
    return _varlen(q, *keys, keep[:, -q.shape[1]:], keep, opts)


def _match_mask_length(k, v, mask_len: int):
    """A static cache hands over keys for all its slots; the mask covers only the filled ones."""
    if k.shape[1] < mask_len:
        raise error("attention_mask", f"covers {mask_len} keys but there are only {k.shape[1]}")
    return k[:, :mask_len], v[:, :mask_len]


def _varlen(q, k, v, q_keep, k_keep, opts):
    import torch
    import torch.nn.functional as F

    b, sq, h, _ = q.shape
    idx_q, idx_k = (torch.nonzero(m.reshape(-1)).flatten() for m in (q_keep, k_keep))
    lens_q, lens_k = (m.sum(1, dtype=torch.int32) for m in (q_keep, k_keep))
    cu_q, cu_k = (F.pad(torch.cumsum(n, 0, dtype=torch.int32), (1, 0)) for n in (lens_q, lens_k))
    flat = lambda x, idx: x.reshape(-1, *x.shape[2:])[idx]
    out = flash_attn_varlen_func(flat(q, idx_q), flat(k, idx_k), flat(v, idx_k), cu_q, cu_k,
                                 int(lens_q.max()), int(lens_k.max()), **opts)
    full = out.new_zeros(b * sq, h, out.shape[-1]).index_copy(0, idx_q, out)  # out of place: autograd-safe
    return full.view(b, sq, h, out.shape[-1])


def _padded_4d(q, k, v, mask, opts):
    """A 4-D mask (b or 1, heads or 1, sq, L), boolean (True = attend) or additive (0 = attend, very negative
    = blocked), runs varlen when it is exactly what varlen computes for the padding it implies: the real tokens
    are the keys that some query attends, queries are the last sq of them, and the causal / window rule holds
    among them. Rows of padded queries are not compared (a causal mask lets a right-padded query see the real
    keys; its output is padding either way and comes back as zeros). Anything else (per-head masks, biases,
    holes) cannot be expressed and raises."""
    import torch

    if mask.dtype == torch.bool:
        allowed = mask
    else:
        allowed = mask > torch.finfo(mask.dtype).min / 2
        if torch.any(allowed & (mask != 0)):
            raise error("attention_mask", "holds additive biases other than 0 and -inf; flashport cannot apply "
                                          "them (use attn_implementation='eager' or 'sdpa')")
    if allowed.shape[1] > 1 and not torch.equal(allowed, allowed[:, :1].expand_as(allowed)):
        raise error("attention_mask", "differs between heads; flashport takes one mask for all heads")
    b, sq = q.shape[:2]
    allowed = allowed[:, 0].expand(b, -1, -1)
    if allowed.shape[1] != sq:
        raise error("attention_mask", f"has {allowed.shape[1]} query rows for {sq} queries")
    k, v = _match_mask_length(k, v, allowed.shape[2])
    k_keep = allowed.any(1)
    q_keep = k_keep[:, -sq:]
    want = _varlen_pattern(q_keep, k_keep, opts["causal"], opts["window_size"])
    if not torch.equal(allowed & q_keep[:, :, None], want):
        raise error("attention_mask", "is not a causal / sliding-window mask with padding, the only masks "
                                      "flashport runs (pass a 2-D padding mask, or use attn_implementation='eager' "
                                      "or 'sdpa' for arbitrary masks)")
    return _varlen(q, k, v, q_keep, k_keep, opts)


def _varlen_pattern(q_keep, k_keep, causal: bool, window):
    """The (b, sq, L) mask that a varlen call over the kept tokens applies, in padded coordinates: among the
    kept tokens, ranks with the causal diagonal aligned bottom-right and the window around it."""
    rank_q = q_keep.cumsum(1) - 1
    rank_k = k_keep.cumsum(1) - 1
    diag = rank_q + (k_keep.sum(1, keepdim=True) - q_keep.sum(1, keepdim=True))  # key rank on the diagonal
    left, right = window
    right = 0 if causal else right
    rel = rank_k[:, None, :] - diag[:, :, None]  # key rank minus the diagonal's, per (query, key)
    ok = q_keep[:, :, None] & k_keep[:, None, :]
    if right >= 0:
        ok = ok & (rel <= right)
    if left >= 0:
        ok = ok & (rel >= -left)
    return ok
