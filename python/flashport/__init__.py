"""flashport: exact attention (FlashAttention-class) with flash-attn's Python API.

Works on torch tensors (CPU and CUDA; autograd, torch.compile) and on host numpy arrays. torch is
imported only when a torch tensor is first passed in (or right away when torch is already imported).
"""

import sys as _sys

from . import ops
from ._C import FlashportError, available_backends, checked_mode
from ._C import set_checked_mode as set_checked
from ._C import version as _version
from .interface import (
    flash_attn_func,
    flash_attn_fp8_func,
    flash_attn_kvpacked_func,
    flash_attn_qkvpacked_fp8_func,
    flash_attn_qkvpacked_func,
    flash_attn_varlen_fp8_func,
    flash_attn_varlen_func,
    flash_attn_varlen_kvpacked_func,
    flash_attn_varlen_qkvpacked_fp8_func,
    flash_attn_varlen_qkvpacked_func,
    flash_attn_with_kvcache,
    merge_states,
    scaled_dot_product_attention,
)

__version__ = _version()


def check(device=None):
    """Wait for the GPU and raise any index fault its device checks recorded (a FlashportError
    naming the argument, as host validation would). Calls with index tensors in GPU memory
    (cu_seqlens_*, seqused_k, cache_seqlens, cache_batch_idx, cache_leftpad, block_table) queue a
    small check kernel; its findings surface at the next flashport call on that GPU, or here.
    Synchronises: use it in tests or at the end of a step. `device`: None (torch's current CUDA
    device), an index, "cuda:N" or a torch.device. Does nothing for the CPU, whose indices are
    validated before every call."""
    from . import _C

    text = "cuda" if device is None else f"cuda:{device}" if isinstance(device, int) else str(device)
    if not text.startswith("cuda"):
        return
    if ":" in text:
        suffix = text.split(":", 1)[1]
        if not suffix.isdigit():
            raise ValueError(f"device: expected None, an int, 'cuda:N' or a torch.device, got {device!r}")
        index = int(suffix)
    else:  # the current device, as torch means it
        torch = _sys.modules.get("torch")
        if torch is None or not torch.cuda.is_available():
            return
        index = torch.cuda.current_device()
    _C.check_cuda_device(index)


__all__ = [
    "FlashportError",
    "available_backends",
    "check",
    "checked_mode",
    "flash_attn_func",
    "flash_attn_fp8_func",
    "flash_attn_kvpacked_func",
    "flash_attn_qkvpacked_fp8_func",
    "flash_attn_qkvpacked_func",
    "flash_attn_varlen_fp8_func",
    "flash_attn_varlen_func",
    "flash_attn_varlen_kvpacked_func",
    "flash_attn_varlen_qkvpacked_fp8_func",
    "flash_attn_varlen_qkvpacked_func",
    "flash_attn_with_kvcache",
    "merge_states",
    "ops",
    "scaled_dot_product_attention",
    "set_checked",
]

# Register the torch custom ops now if torch is already loaded, so the first call never happens
# inside a torch.compile trace.
if _sys.modules.get("torch") is not None:
    from .interface import _torch

    _torch()
