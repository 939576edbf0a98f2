"""torch ops over flashport._C (flashport::fwd, fwd_impl, bwd, fwd_dense, bwd_dense, fwd_kvcache, merge_states,
fwd_fp8).

Each op has a fake (meta) implementation, so torch.compile(fullgraph=True) traces through it; fwd and
fwd_fp8 have autograd formulas that call flashport's backward (for fwd: the autograd.Function _Attention,
which tracing puts around fwd_impl and bwd). Outputs are allocated here with torch and handed to C++
zero-copy; CUDA work runs on torch's current stream of the tensors' device.

Eager calls skip the dispatcher (its Python layers cost several hundred microseconds per call with
autograd): `call_fwd` / `call_kvcache` / `call_merge` run the same implementation functions (`run_fwd`,
`run_bwd`, ...) directly, under _Attention when gradients are needed, and use the registered ops only
while something traces (torch.compile, export, fake or functional tensors, dispatch modes, functorch
transforms). One body per op either way.
"""

from typing import Optional, Tuple

import torch
from torch import Tensor

from . import _C
from ._common import FP8_MAX, error, padded, split_rng_state

_FP8_DTYPES = {getattr(torch, name): name for name in FP8_MAX if hasattr(torch, name)}
_F32, _CONTIGUOUS = torch.float32, torch.contiguous_format


def is_fp8(dtype: torch.dtype) -> bool:
    return dtype in _FP8_DTYPES


def check_device(x: Optional[Tensor], name: str) -> None:
    """Clear error for tensors flashport cannot reach (mps, xpu, meta outside tracing, ...)."""
    if x is not None and x.device.type not in ("cpu", "cuda"):
        raise error(name, f"is on device '{x.device}', which flashport does not support (cpu and cuda are)")


# torch's tensor types and dtypes, so the binding reads torch tensors from their attributes instead of
# exporting a DLPack capsule per tensor (which also needed a detach() for tensors that require grad).
_C.register_torch(torch.Tensor, torch.nn.Parameter,
                  {getattr(torch, name): name for name in ("float64", "float32", "float16", "bfloat16", "int32",
                                                           "int64", *FP8_MAX) if hasattr(torch, name)},
                  rocm=bool(getattr(torch.version, "hip", None)))

_raw_stream = getattr(torch._C, "_cuda_getCurrentRawStream", None)


def _stream(x: Tensor) -> int:
    """The raw cudaStream_t of torch's current stream on x's device (0 on the CPU). torch's default
    stream reports 0, the legacy default stream's null handle, which is what the C++ API takes. The C++
    side takes its CUDA context from the tensors' device, so no device guard is needed here."""
    if not x.is_cuda:
        return 0
    if _raw_stream is not None:  # a C function; torch.cuda.current_stream builds a Stream object
        return _raw_stream(x.get_device())
    return torch.cuda.current_stream(x.device).cuda_stream


def _tracing(x: Tensor) -> bool:
    """True when the registered custom ops must be used: torch.compile / export tracing, tensor
    subclasses (fake, functional, DTensor, ...), torch dispatch modes, functorch transforms."""
    return (type(x) not in _PLAIN or torch.compiler.is_compiling() or _dispatch_modes() > 0
            or _functorch_layer() is not None)


_PLAIN = (torch.Tensor, torch.nn.Parameter)
_dispatch_modes = torch._C._len_torch_dispatch_stack
_functorch_layer = torch._C._functorch.peek_interpreter_stack


def _contig(x: Optional[Tensor]) -> Optional[Tensor]:
    """x with a unit-stride last dimension (a copy only when it has none)."""
    if x is None or x.is_contiguous():  # the common case in one call (dim() and stride(-1) took two)
        return x
    return x.contiguous() if x.dim() and x.stride(-1) != 1 and x.size(-1) > 1 else x


def _rng(rng_state: Optional[Tensor]) -> Tuple[int, int]:
    if rng_state is None:
        return 0, 0
    seed, offset = rng_state.tolist()  # a host tensor: no device sync
    return split_rng_state(seed, offset)


def _lse_shape(q: Tensor, varlen: bool):
    return (q.shape[1], q.shape[0]) if varlen else (q.shape[0], q.shape[2], q.shape[1])


def _out_dtype(q: Tensor, out_dtype: Optional[torch.dtype]) -> torch.dtype:
    if out_dtype is not None:
        return out_dtype
    return torch.bfloat16 if is_fp8(q.dtype) else q.dtype


def _s_dmask_shape(q, k, block_table, varlen, return_softmax):
    """fp32 (b, hq, sq, sk) probabilities from the CPU reference, else an empty placeholder."""
    if not return_softmax or varlen or q.device.type != "cpu":
        return (0,)
    sk = k.shape[1] * (block_table.shape[1] if block_table is not None else 1)
    return (q.shape[0], q.shape[2], q.shape[1], sk)


# ---------------------------------------------------------------------------------------------
# Forward / backward.


def _forward(q, k, v, cu_seqlens_q, cu_seqlens_k, seqused_k, block_table, alibi_slopes, q_descale, k_descale,
             v_descale, rng_state, max_seqlen_q, max_seqlen_k, softmax_scale, causal, window_left, window_right,
             softcap, dropout_p, deterministic, return_softmax, out_dtype):
    """run_fwd's body: (out, softmax_lse, S_dmask), S_dmask None where nothing computes it. Every eager
    call runs this, so it allocates with the cheapest torch calls (empty_like, new_empty) and calls the
    binding positionally; callers that drop S_dmask (call_out) skip run_fwd's empty placeholder."""
    q, k, v = _contig(q), _contig(k), _contig(v)
    shape = q.shape
    if cu_seqlens_q is None:
        lse = q.new_empty((shape[0], shape[2], shape[1]), dtype=_F32)
    else:
        lse = q.new_empty((shape[1], shape[0]), dtype=_F32)
    if out_dtype is None and v.shape[-1] == shape[-1] and q.dtype not in _FP8_DTYPES:
        out = torch.empty_like(q, memory_format=_CONTIGUOUS)
    else:
        out = q.new_empty(shape[:-1] + (v.shape[-1],), dtype=_out_dtype(q, out_dtype))
    s_dmask = None
    if return_softmax and cu_seqlens_q is None and q.is_cpu:
        s_dmask = q.new_empty(_s_dmask_shape(q, k, block_table, False, True), dtype=_F32)
    seed, offset = _rng(rng_state)
    _C.forward(q, k, v, out, lse, s_dmask, cu_seqlens_q, cu_seqlens_k, seqused_k, max_seqlen_q, max_seqlen_k,
               block_table, softmax_scale, causal, window_left, window_right, softcap, alibi_slopes, dropout_p, seed,
               offset, q_descale, k_descale, v_descale, _stream(q))
    return out, lse, s_dmask


def run_fwd(*inputs):
    """flashport::fwd's implementation: (out, softmax_lse, S_dmask) from the op's 23 inputs (_FWD_SCHEMA;
    rng_state is a host int64 (seed, offset) pair, None: no dropout). S_dmask is an empty placeholder
    where nothing computes it (the schema returns a tensor)."""
    out, lse, s_dmask = _forward(*inputs)
    return out, lse, (s_dmask if s_dmask is not None else lse.new_empty((0,)))


def _fwd_fake(q, k, v, cu_seqlens_q, cu_seqlens_k, seqused_k, block_table, alibi_slopes, q_descale, k_descale,
              v_descale, rng_state, max_seqlen_q, max_seqlen_k, softmax_scale, causal, window_left, window_right,
              softcap, dropout_p, deterministic, return_softmax, out_dtype):
    varlen = cu_seqlens_q is not None
    out = q.new_empty(q.shape[:-1] + (v.shape[-1],), dtype=_out_dtype(q, out_dtype))
    lse = q.new_empty(_lse_shape(q, varlen), dtype=torch.float32)
    s_dmask = q.new_empty(_s_dmask_shape(q, k, block_table, varlen, return_softmax), dtype=torch.float32)
    return out, lse, s_dmask


def run_bwd(dout, q, k, v, out, softmax_lse, cu_seqlens_q, cu_seqlens_k, seqused_k, block_table, alibi_slopes,
            rng_state, max_seqlen_q, max_seqlen_k, softmax_scale, causal, window_left, window_right, softcap,
            dropout_p, deterministic):
    """flashport::bwd's implementation: (dq, dk, dv) in the dtypes of q, k, v (contiguous)."""
    q, k, v = _contig(q), _contig(k), _contig(v)
    dq = torch.empty_like(q, memory_format=_CONTIGUOUS)
    dk = torch.empty_like(k, memory_format=_CONTIGUOUS)
    dv = torch.empty_like(v, memory_format=_CONTIGUOUS)
    _backward_into(dq, dk, dv, dout, q, k, v, out, softmax_lse, cu_seqlens_q, cu_seqlens_k, seqused_k, block_table,
                   alibi_slopes, rng_state, max_seqlen_q, max_seqlen_k, softmax_scale, causal, window_left,
                   window_right, softcap, dropout_p, deterministic)
    return dq, dk, dv


def _backward_into(dq, dk, dv, dout, q, k, v, out, softmax_lse, cu_seqlens_q, cu_seqlens_k, seqused_k, block_table,
                   alibi_slopes, rng_state, max_seqlen_q, max_seqlen_k, softmax_scale, causal, window_left,
                   window_right, softcap, dropout_p, deterministic):
    """run_bwd into caller-allocated gradients (unit last stride; slices of one packed gradient may
    interleave)."""
    dout, q, k, v, out = _contig(dout), _contig(q), _contig(k), _contig(v), _contig(out)
    seed, offset = _rng(rng_state)
    _C.backward(dout, q, k, v, out, softmax_lse, dq, dk, dv, cu_seqlens_q, cu_seqlens_k, seqused_k, max_seqlen_q,
                max_seqlen_k, block_table, softmax_scale, causal, window_left, window_right, softcap, alibi_slopes,
                dropout_p, seed, offset, deterministic, _stream(q))


def _bwd_fake(dout, q, k, v, out, softmax_lse, *args):
    return tuple(t.new_empty(t.shape) for t in (q, k, v))


def run_fwd_dense(q, k, v, softmax_scale, causal, window_left, window_right, softcap):
    """flashport::fwd_dense's implementation: run_fwd's (out, softmax_lse) for a plain dense call (no
    optional tensor, max_seqlen 0, no dropout, no probabilities, the default output dtype)."""
    out, lse, _ = _forward(q, k, v, None, None, None, None, None, None, None, None, None, 0, 0, softmax_scale, causal,
                           window_left, window_right, softcap, 0.0, False, False, None)
    return out, lse


def _fwd_dense_fake(q, k, v, softmax_scale, causal, window_left, window_right, softcap):
    out, lse, _ = _fwd_fake(q, k, v, None, None, None, None, None, None, None, None, None, 0, 0, softmax_scale, causal,
                            window_left, window_right, softcap, 0.0, False, False, None)
    return out, lse


def run_bwd_dense(dout, q, k, v, out, softmax_lse, softmax_scale, causal, window_left, window_right, softcap,
                  deterministic):
    """flashport::bwd_dense's implementation: run_bwd for the backward of a run_fwd_dense call."""
    return run_bwd(dout, q, k, v, out, softmax_lse, None, None, None, None, None, None, 0, 0, softmax_scale, causal,
                   window_left, window_right, softcap, 0.0, deterministic)


def _dense(q: Tensor, rest) -> bool:
    """Whether flashport::fwd's inputs (q, then rest: those after v) are a plain dense call, which
    fwd_dense / bwd_dense compute with 8 and 12 inputs where fwd_impl / bwd box 23 and 21 (a compiled
    graph pays per boxed argument on every run). Only read while tracing, so the comparisons of possibly
    symbolic scalars are trace-time guards."""
    return (rest[0] is None and rest[1] is None and rest[2] is None and rest[3] is None and rest[4] is None
            and rest[5] is None and rest[6] is None and rest[7] is None and rest[8] is None and rest[19] is None
            and not rest[18] and rest[9] == 0 and rest[10] == 0 and rest[16] == 0.0 and q.dtype not in _FP8_DTYPES)


def _save(ctx, q, k, v, rest, out, lse):
    """flashport::fwd's autograd context: the tensors backward reads (saved, so in-place changes to them
    are caught; the optional ones only when one is given, as saving costs per tensor), the scalars it
    passes on, and no zero-filled gradients for the outputs that have none (lse and S_dmask never get
    one: materialising them cost two torch.zeros per backward)."""
    ctx.set_materialize_grads(False)
    # rest = the op's inputs after v: cu_seqlens_q, cu_seqlens_k, seqused_k, block_table, alibi_slopes,
    # q_descale, k_descale, v_descale, rng_state, then max_seqlen_q ... deterministic, return_softmax, out_dtype.
    if (rest[0] is None and rest[1] is None and rest[2] is None and rest[3] is None and rest[4] is None
            and rest[8] is None):
        ctx.save_for_backward(q, k, v, out, lse)
    else:
        ctx.save_for_backward(q, k, v, out, lse, rest[0], rest[1], rest[2], rest[3], rest[4], rest[8])
    # fp8 inputs have no backward (None marks them); else bwd's scalars, max_seqlen_q ... deterministic.
    ctx.params = rest[9:18] if rest[5] is None and q.dtype not in _FP8_DTYPES else None


def _grads(ctx, dout):
    """(dq, dk, dv) of flashport::fwd for the gradient dout of its first output."""
    if ctx.params is None:
        raise error("q", "fp8 inputs have no backward here; use the *_fp8_func entry points, which quantise "
                         "high-precision inputs and differentiate through the dequantised values")
    if dout is None:  # no gradient reached out (grads are not materialised)
        return None, None, None
    saved, p = ctx.saved_tensors, ctx.params
    direct = _direct(dout)
    if len(saved) == 5:
        q, k, v, out, lse = saved
        if not direct and p[0] == 0 and p[1] == 0 and p[7] == 0.0:  # _dense's call (see _save's params)
            return bwd_dense(dout, q, k, v, out, lse, p[2], p[3], p[4], p[5], p[6], p[8])
        return (run_bwd if direct else bwd)(dout, q, k, v, out, lse, None, None, None, None, None, None, *p)
    return (run_bwd if direct else bwd)(dout, *saved, *p)


def _direct(x: Tensor) -> bool:
    """Whether _Attention may call run_fwd / run_bwd itself: plain CPU or CUDA tensors, nothing tracing.
    Else the ops flashport::fwd_impl / bwd (tracing; meta tensors get their fake kernels)."""
    return (x.is_cuda or x.is_cpu) and not _tracing(x)


class _Attention(torch.autograd.Function):
    """flashport::fwd with its autograd formula. Eager calls apply it to plain tensors (run_fwd and
    run_bwd directly, no dispatcher); the registered op flashport::fwd applies it while tracing, over
    the ops flashport::fwd_dense and bwd_dense for a plain dense call (_dense), else flashport::fwd_impl
    and flashport::bwd. Takes (q, k, v, the other inputs as one tuple): apply() costs per argument, and
    only q, k, v have gradients."""

    @staticmethod
    def forward(ctx, q, k, v, rest):
        if _direct(q):
            out, lse, s_dmask = output = run_fwd(q, k, v, *rest)
        elif _dense(q, rest):
            out, lse = fwd_dense(q, k, v, rest[11], rest[12], rest[13], rest[14], rest[15])
            s_dmask = lse.new_empty((0,))  # run_fwd's placeholder
            output = out, lse, s_dmask
        else:
            out, lse, s_dmask = output = fwd_impl(q, k, v, *rest)
        _save(ctx, q, k, v, rest, out, lse)
        ctx.mark_non_differentiable(lse, s_dmask)
        return output

    @staticmethod
    def backward(ctx, dout, dlse, ds_dmask):
        dq, dk, dv = _grads(ctx, dout)
        return dq, dk, dv, None


class _AttentionOut(torch.autograd.Function):
    """_Attention for eager callers that want `out` alone (flash_attn_func without return_attn_probs, the
    common call): call_out has checked that the tensors are plain and nothing traces, so forward runs
    _forward itself (no second check, no S_dmask placeholder) and returns one output (no
    non-differentiable outputs to mark; lse is saved as an intermediate). Same context and backward."""

    @staticmethod
    def forward(ctx, q, k, v, rest):
        out, lse, _ = _forward(q, k, v, *rest)
        _save(ctx, q, k, v, rest, out, lse)
        return out

    @staticmethod
    def backward(ctx, dout):
        dq, dk, dv = _grads(ctx, dout)
        return dq, dk, dv, None


def _slices(packed: Tensor, layout):
    """The operands `packed` holds: its slices along the axis `layout`, or, for a tuple of (size, stride,
    offset from packed's first element) per operand, those views of a contiguous `packed`."""
    if type(layout) is int:
        return packed.unbind(layout)
    first = packed.storage_offset()
    return [packed.as_strided(size, stride, first + offset) for size, stride, offset in layout]


class _AttentionPacked(torch.autograd.Function):
    """_AttentionOut whose q, k, v (or k, v beside q) are slices of one tensor `packed` (_slices: flash-attn's
    packed layouts, or three views tiling a fused projection's output, packed_base). Backward writes the
    slices' gradients straight into one packed gradient, as flash-attn's packed functions do, where
    autograd through the slicing would stack three separate gradients: a copy of the whole packed tensor
    per call (about 27 us per layer of GPT-2 small at 8 x 1024 tokens). Eager and plain tensors only
    (call_out_packed); tracing takes the unpacked op."""

    @staticmethod
    def forward(ctx, q, packed, layout, rest):
        parts = _slices(packed, layout)
        q, k, v = parts if q is None else (q, *parts)
        out, lse, _ = _forward(q, k, v, *rest)
        _save(ctx, q, k, v, rest, out, lse)
        ctx.packing = layout, len(parts), packed.shape
        return out

    @staticmethod
    def backward(ctx, dout):
        layout, count, shape = ctx.packing
        if dout is None or not _direct(dout):  # nothing to write, or a traced backward: the op's gradients
            grads = _grads(ctx, dout)
            if dout is None:
                return None, None, None, None
            if type(layout) is int:
                dpacked = torch.stack(grads[3 - count:], layout)
            else:  # the views tile packed whole (packed_base)
                dpacked = grads[0].new_empty(shape)
                for part, grad in zip(_slices(dpacked, layout), grads):
                    part.copy_(grad)
            return (grads[0] if count == 2 else None), dpacked, None, None
        saved, p = ctx.saved_tensors, ctx.params
        q, k = saved[0], saved[1]
        dpacked = k.new_empty(shape)  # contiguous, like the packed tensors _slices takes views of
        grads = _slices(dpacked, layout)
        dq = grads[0] if count == 3 else torch.empty_like(q, memory_format=_CONTIGUOUS)
        dk, dv = grads[count - 2], grads[count - 1]
        if len(saved) == 5:
            _backward_into(dq, dk, dv, dout, *saved, None, None, None, None, None, None, *p)
        else:
            _backward_into(dq, dk, dv, dout, *saved, *p)
        return (dq if count == 2 else None), dpacked, None, None


def packed_base(q: Tensor, k: Tensor, v: Tensor):
    """(base, layout) when q, k and v are views of one layout, each passing its gradient to base, that
    tile a contiguous tensor, each element in exactly one (a fused qkv projection split three ways, as GPT-2 and nanoGPT
    do: its rows hold q's, k's and v's heads side by side), with layout _slices' (size, stride, offset)
    per view; else None. Exact for what it accepts: every view contiguous over its innermost dimensions
    (E elements), every other stride a multiple of the smallest of them (the period P), the views'
    offsets modulo P at least E apart (so no two meet), no view overlapping itself, all inside base, and
    three views' elements as many as base's."""
    base = q._base
    # Each view's gradient must reach base through its view chain (a view made under no_grad requires a
    # gradient but has no grad_fn: autograd keeps its gradient to itself), and nobody may be watching the
    # views' own gradients (hooks, retain_grad), which the packed gradient never forms.
    if (base is None or k._base is not base or v._base is not base or q.grad_fn is None or k.grad_fn is None
            or v.grad_fn is None):
        return None
    if (q._backward_hooks or k._backward_hooks or v._backward_hooks or q.retains_grad or k.retains_grad
            or v.retains_grad):
        return None
    shape, stride = q.shape, q.stride()
    if (k.shape != shape or v.shape != shape or k.stride() != stride or v.stride() != stride
            or 3 * q.numel() != base.numel() or not base.is_contiguous()):
        return None
    if stride[-1] != 1:  # the gradients' slices must take the channel stride 1 the kernels need
        return None
    dims = sorted((s, n) for s, n in zip(stride, shape) if n > 1)
    inner, i = 1, 0  # elements of the contiguous innermost block
    while i < len(dims) and dims[i][0] == inner:
        inner *= dims[i][1]
        i += 1
    reach = inner - 1  # largest offset in the view
    period = dims[i][0] if i < len(dims) else base.numel() + inner
    for s, n in dims[i:]:
        if s % period or s <= reach:
            return None
        reach += (n - 1) * s
    first = base.storage_offset()
    offsets = [x.storage_offset() - first for x in (q, k, v)]
    if min(offsets) < 0 or max(offsets) + reach >= base.numel():
        return None
    r = sorted(o % period for o in offsets)
    if r[1] - r[0] < inner or r[2] - r[1] < inner or r[0] + period - r[2] < inner:
        return None
    return base, tuple((shape, stride, o) for o in offsets)


# The eager calls apply their Function through torch's C entry point: torch versions whose
# Function.apply is a Python classmethod (2.11 among them) spend a few microseconds there on setup_context
# binding, a functorch check and unwrapping dead functorch wrappers. The eager path only runs with no
# functorch transform active (_tracing), and unwraps q, k, v itself where that wrapper would have.
_PY_APPLY = isinstance(torch.autograd.Function.__dict__.get("apply"), classmethod)
_unwrap_if_dead = torch._C._functorch.unwrap_if_dead
_apply_all = super(torch.autograd.Function, _Attention).apply
_apply_out = super(torch.autograd.Function, _AttentionOut).apply
_apply_packed = super(torch.autograd.Function, _AttentionPacked).apply


def call_fwd(*inputs):
    """flashport::fwd(*inputs) for a caller: the registered op while tracing, else the eager twin (with
    autograd only when an input needs a gradient)."""
    q, k, v = inputs[0], inputs[1], inputs[2]
    if _tracing(q):
        return fwd(*inputs)
    if _grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad):
        if _PY_APPLY:
            q, k, v = _unwrap_if_dead(q), _unwrap_if_dead(k), _unwrap_if_dead(v)
        return _apply_all(q, k, v, inputs[3:])
    return run_fwd(*inputs)


def call_out(*inputs):
    """flashport::fwd(*inputs)[0]: call_fwd for callers that drop softmax_lse and S_dmask."""
    q, k, v = inputs[0], inputs[1], inputs[2]
    if _tracing(q):
        return fwd(*inputs)[0]
    if _grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad):
        if _PY_APPLY:
            q, k, v = _unwrap_if_dead(q), _unwrap_if_dead(k), _unwrap_if_dead(v)
        return _apply_out(q, k, v, inputs[3:])
    return _forward(*inputs)[0]


def call_out_packed(packed, axis, *inputs):
    """call_out(*inputs) where inputs' q, k, v are the slices of `packed` along `axis` (qkv), or k, v are
    (kv), or, for packed None, where packed_base finds them tiling one tensor: eagerly, with a gradient
    wanted and 16-bit inputs, through _AttentionPacked (one packed gradient, no stacking copy); otherwise
    exactly call_out."""
    q = inputs[0]
    if not _grad_enabled() or q.dtype in _FP8_DTYPES or _tracing(q):
        return call_out(*inputs)
    if packed is None:
        found = packed_base(q, inputs[1], inputs[2])
        if found is None or _tracing(found[0]):
            return call_out(*inputs)
        packed, layout, own_q = found[0], found[1], None
    else:
        if not packed.requires_grad or _tracing(packed):
            return call_out(*inputs)
        layout, own_q = axis, (None if packed.shape[axis] == 3 else q)
    if _PY_APPLY:
        packed = _unwrap_if_dead(packed)
        own_q = own_q if own_q is None else _unwrap_if_dead(own_q)
    return _apply_packed(own_q, packed, layout, inputs[3:])


_grad_enabled = torch.is_grad_enabled


def _fwd_composite(*inputs):
    """flashport::fwd's kernel (CompositeImplicitAutograd): _Attention over flashport::fwd_impl."""
    return _Attention.apply(inputs[0], inputs[1], inputs[2], inputs[3:])


# The registered ops, defined with torch.library.Library rather than torch.library.custom_op: a compiled
# graph calls the op it traced at every run, and custom_op puts two Python kernels on that path (its
# autograd wrapper, which only redispatches when no gradient is recorded, and a backend wrapper
# with an aliasing check), each costing about as much as run_fwd's own Python. Here:
# - flashport::fwd is CompositeImplicitAutograd: tracing decomposes it into _Attention, whose forward
#   is flashport::fwd_impl and whose backward is flashport::bwd; opcheck and torch.compile see fwd.
# - flashport::fwd_impl and flashport::bwd are what compiled graphs call: run_fwd / run_bwd as their
#   CPU and CUDA kernels, a fake implementation, and no Python autograd kernel (the dispatcher's own
#   fallback passes them through; their gradients are _Attention's business).
# - flashport::fwd_dense and flashport::bwd_dense are the same for a plain dense call, the common one:
#   the dispatcher boxes every argument into the Python kernel and back on every run (about 0.35 us
#   each on the CPU), and for that call 15 of fwd_impl's 23 are None or zero. Their kernels are
#   run_fwd's and run_bwd's bodies with those constants; the S_dmask placeholder moves into the graph,
#   which drops it when unused.
_lib = torch.library.Library("flashport", "FRAGMENT")
_PT2 = (torch.Tag.pt2_compliant_tag,)
_FWD_SCHEMA = ("(Tensor q, Tensor k, Tensor v, Tensor? cu_seqlens_q, Tensor? cu_seqlens_k, Tensor? seqused_k, "
               "Tensor? block_table, Tensor? alibi_slopes, Tensor? q_descale, Tensor? k_descale, "
               "Tensor? v_descale, Tensor? rng_state, SymInt max_seqlen_q, SymInt max_seqlen_k, "
               "float softmax_scale, bool causal, SymInt window_left, SymInt window_right, float softcap, "
               "float dropout_p, bool deterministic, bool return_softmax, ScalarType? out_dtype) "
               "-> (Tensor, Tensor, Tensor)")
_lib.define("fwd" + _FWD_SCHEMA, tags=_PT2)
_lib.define("fwd_impl" + _FWD_SCHEMA, tags=_PT2)
_lib.define("bwd(Tensor dout, Tensor q, Tensor k, Tensor v, Tensor out, Tensor softmax_lse, "
            "Tensor? cu_seqlens_q, Tensor? cu_seqlens_k, Tensor? seqused_k, Tensor? block_table, "
            "Tensor? alibi_slopes, Tensor? rng_state, SymInt max_seqlen_q, SymInt max_seqlen_k, "
            "float softmax_scale, bool causal, SymInt window_left, SymInt window_right, float softcap, "
            "float dropout_p, bool deterministic) -> (Tensor, Tensor, Tensor)", tags=_PT2)
_lib.define("fwd_dense(Tensor q, Tensor k, Tensor v, float softmax_scale, bool causal, SymInt window_left, "
            "SymInt window_right, float softcap) -> (Tensor, Tensor)", tags=_PT2)
_lib.define("bwd_dense(Tensor dout, Tensor q, Tensor k, Tensor v, Tensor out, Tensor softmax_lse, "
            "float softmax_scale, bool causal, SymInt window_left, SymInt window_right, float softcap, "
            "bool deterministic) -> (Tensor, Tensor, Tensor)", tags=_PT2)
_lib.impl("fwd", _fwd_composite, "CompositeImplicitAutograd")
for _key in ("CPU", "CUDA"):
    _lib.impl("fwd_impl", run_fwd, _key)
    _lib.impl("bwd", run_bwd, _key)
    _lib.impl("fwd_dense", run_fwd_dense, _key)
    _lib.impl("bwd_dense", run_bwd_dense, _key)
torch.library.register_fake("flashport::fwd_impl", _fwd_fake, lib=_lib)
torch.library.register_fake("flashport::bwd", _bwd_fake, lib=_lib)
torch.library.register_fake("flashport::fwd_dense", _fwd_dense_fake, lib=_lib)
torch.library.register_fake("flashport::bwd_dense", _bwd_fake, lib=_lib)
fwd = torch.ops.flashport.fwd.default
fwd_impl = torch.ops.flashport.fwd_impl.default
bwd = torch.ops.flashport.bwd.default
fwd_dense = torch.ops.flashport.fwd_dense.default
bwd_dense = torch.ops.flashport.bwd_dense.default


# ---------------------------------------------------------------------------------------------
# KV cache and merge (no autograd, like flash-attn).


def run_kvcache(q, k_cache, v_cache, k, v, rotary_cos, rotary_sin, cache_seqlens, cache_batch_idx, cache_leftpad,
                block_table, alibi_slopes, q_descale, k_descale, v_descale, softmax_scale, causal, window_left,
                window_right, softcap, rotary_interleaved, num_splits):
    """flashport::fwd_kvcache's implementation: (out, softmax_lse) after appending k/v into the caches in
    place. Head dims that are not a multiple of 8 are zero-padded like flash-attn: the padded caches are
    copies, written back after."""
    q, k, v = _contig(q), _contig(k), _contig(v)
    d, dv = q.shape[-1], v_cache.shape[-1]
    pad = lambda t: t if t is None or t.shape[-1] % 8 == 0 else torch.nn.functional.pad(t, (0, padded(t.shape[-1]) - t.shape[-1]))
    q_w, k_w, v_w, kc_w, vc_w = pad(q), pad(k), pad(v), pad(k_cache), pad(v_cache)
    out = torch.empty(q.shape[:-1] + (vc_w.shape[-1],), dtype=_out_dtype(q, None), device=q.device)
    lse = torch.empty(_lse_shape(q, False), dtype=torch.float32, device=q.device)
    _C.forward_kvcache(q_w, kc_w, vc_w, out, lse, k_w, v_w, cache_seqlens, cache_batch_idx, cache_leftpad,
                       block_table, rotary_cos, rotary_sin, rotary_interleaved, num_splits, softmax_scale, causal,
                       window_left, window_right, softcap, alibi_slopes, q_descale, k_descale, v_descale, _stream(q))
    if k is not None and kc_w is not k_cache:
        k_cache.copy_(kc_w[..., : k_cache.shape[-1]])
    if v is not None and vc_w is not v_cache:
        v_cache.copy_(vc_w[..., : v_cache.shape[-1]])
    return (out[..., :dv].contiguous() if out.shape[-1] != dv else out), lse


@torch.library.custom_op("flashport::fwd_kvcache", mutates_args=("k_cache", "v_cache"))
def fwd_kvcache(
    q: Tensor, k_cache: Tensor, v_cache: Tensor, k: Optional[Tensor], v: Optional[Tensor],
    rotary_cos: Optional[Tensor], rotary_sin: Optional[Tensor], cache_seqlens: Optional[Tensor],
    cache_batch_idx: Optional[Tensor], cache_leftpad: Optional[Tensor], block_table: Optional[Tensor],
    alibi_slopes: Optional[Tensor], q_descale: Optional[Tensor], k_descale: Optional[Tensor],
    v_descale: Optional[Tensor], softmax_scale: float, causal: bool, window_left: int, window_right: int,
    softcap: float, rotary_interleaved: bool, num_splits: int,
) -> Tuple[Tensor, Tensor]:
    """(out, softmax_lse) after appending k/v into the caches in place (see run_kvcache)."""
    return run_kvcache(q, k_cache, v_cache, k, v, rotary_cos, rotary_sin, cache_seqlens, cache_batch_idx,
                       cache_leftpad, block_table, alibi_slopes, q_descale, k_descale, v_descale, softmax_scale,
                       causal, window_left, window_right, softcap, rotary_interleaved, num_splits)


@fwd_kvcache.register_fake
def _fwd_kvcache_fake(q, k_cache, v_cache, *args):
    out = q.new_empty(q.shape[:-1] + (v_cache.shape[-1],), dtype=_out_dtype(q, None))
    return out, q.new_empty(_lse_shape(q, False), dtype=torch.float32)


@torch.library.custom_op("flashport::merge_states", mutates_args=())
def merge_states(out_a: Tensor, lse_a: Tensor, out_b: Tensor, lse_b: Tensor) -> Tuple[Tensor, Tensor]:
    """(out, lse) of two partial attentions over disjoint key sets, merged by their log-sum-exp."""
    return run_merge(out_a, lse_a, out_b, lse_b)


def run_merge(out_a, lse_a, out_b, lse_b):
    out = torch.empty(out_a.shape, dtype=out_a.dtype, device=out_a.device)
    lse = torch.empty(lse_a.shape, dtype=torch.float32, device=lse_a.device)
    _C.merge_states(_contig(out_a), lse_a, _contig(out_b), lse_b, out, lse, _stream(out_a))
    return out, lse


@merge_states.register_fake
def _merge_states_fake(out_a, lse_a, out_b, lse_b):
    return out_a.new_empty(out_a.shape), lse_a.new_empty(lse_a.shape, dtype=torch.float32)


def call_kvcache(*inputs):
    """flashport::fwd_kvcache(*inputs): the registered op while tracing, else its implementation."""
    return fwd_kvcache(*inputs) if _tracing(inputs[0]) else run_kvcache(*inputs)


def call_merge(*inputs):
    """flashport::merge_states(*inputs): the registered op while tracing, else its implementation."""
    return merge_states(*inputs) if _tracing(inputs[0]) else run_merge(*inputs)
