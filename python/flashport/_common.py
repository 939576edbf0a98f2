"""Framework-neutral helpers shared by the numpy and torch paths: argument checks, shapes, fp8 limits."""

from __future__ import annotations

import numbers

from ._C import FlashportError

# Largest finite value of each fp8 format (what dynamic quantisation scales amax to).
FP8_MAX = {"float8_e4m3fn": 448.0, "float8_e4m3fnuz": 240.0, "float8_e5m2": 57344.0}

SUPPORTED_DEVICES = ("cpu", "cuda")


def error(argument: str, message: str) -> FlashportError:
    """A FlashportError (ValueError) whose message starts with the argument name, like the C++ core's."""
    exc = FlashportError(f"{argument}: {message}")
    exc.argument = argument
    return exc


def check_ndim(x, ndim: int, name: str, layout: str) -> None:
    if x.ndim != ndim:
        raise error(name, f"expected {ndim} dimensions {layout}, got shape {tuple(x.shape)}")


def window(window_size, causal: bool) -> tuple[int, int]:
    """(left, right) from flash-attn's window_size; -1 means unbounded. Causal forces right = 0."""
    try:
        left, right = window_size
        left, right = int(left), int(right)
    except (TypeError, ValueError):
        raise error("window_size", f"expected a pair (left, right), got {window_size!r}") from None
    for value, side in ((left, "left"), (right, "right")):
        if value < -1:
            raise error("window_size", f"{side} must be >= -1 (-1 = unbounded), got {value}")
    return left, (0 if causal else right)


def check_float(value, name: str, lo: float | None = None, hi: float | None = None, hi_open: bool = False) -> float:
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise error(name, f"expected a number, got {type(value).__name__}")
    value = float(value)
    if lo is not None and value < lo:
        raise error(name, f"must be >= {lo}, got {value}")
    if hi is not None and (value >= hi if hi_open else value > hi):
        raise error(name, f"must be {'<' if hi_open else '<='} {hi}, got {value}")
    return value


def softmax_scale(scale, head_dim: int) -> float:
    """flash-attn's default 1/sqrt(head dim), from the head dim before any padding."""
    if scale is None:
        return head_dim**-0.5
    return check_float(scale, "softmax_scale")


def padded(head_dim: int) -> int:
    """flash-attn pads head dims to a multiple of 8 (zeros do not change q.k or P@V)."""
    return (head_dim + 7) // 8 * 8


def check_int(value, name: str, lo: int | None = None) -> int:
    """An int argument; 0-d integer tensors/arrays are read (max_seqlen is often one), and torch.SymInt
    (dynamic shapes under torch.compile) passes through."""
    if type(value).__name__ == "SymInt":
        return value
    if getattr(value, "ndim", None) == 0 and hasattr(value, "item"):
        value = value.item()
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise error(name, f"expected an int, got {type(value).__name__}")
    value = int(value)
    if lo is not None and value < lo:
        raise error(name, f"must be >= {lo}, got {value}")
    return value


def split_rng_state(seed: int, offset: int) -> tuple[int, int]:
    """Signed int64 (torch tensors hold int64) -> the unsigned 64-bit seed and 32-bit Philox offset."""
    return int(seed) & 0xFFFFFFFFFFFFFFFF, int(offset) & 0xFFFFFFFF
