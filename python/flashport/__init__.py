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

__all__ = [
    "FlashportError",
    "available_backends",
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
