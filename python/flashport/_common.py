"""Framework-neutral helpers shared by the numpy and torch paths: argument checks, shapes, fp8 limits."""

from __future__ import annotations

import numbers

from ._C import FlashportError

# Largest finite value of each fp8 format (what dynamic quantisation scales amax to).
FP8_MAX = {"float8_e4m3fn": 448.0, "float8_e4m3fnuz": 240.0, "float8_e5m2": 57344.0}

SUPPORTED_DEVICES = ("cpu", "cuda")

# Dynamic fp8 quantisation, written once for the numpy and torch paths (each passes its own `where`).


def fp8_groups(shape, nheads_k: int, varlen: bool):
    """How dynamic fp8 quantisation groups x, one scale per (sequence, kv head): the shape splitting the
    heads into (kv head, query heads of its group), and the axes the amax reduces. Dense (b, s, h, d):
    over tokens, group and channels. Varlen (total, h, d): per token over group and channels (the caller
    then takes the maximum per sequence)."""
    if varlen:
        total, h, d = shape
        return (total, nheads_k, h // nheads_k, d), (2, 3)
    b, s, h, d = shape
    return (b, s, nheads_k, h // nheads_k, d), (1, 3, 4)


def fp8_descale(amax, fp8_name: str, where, full_like):
    """The descale (x ~= fp8 * descale) from a group's amax: amax / fp8_max, and 1 where that is 0 (an
    all-zero group, or an amax so small the quotient underflows), so x / descale stays finite.

    The quotient is correctly rounded on every device: the divisor is an array (`full_like`), because
    torch's CUDA division by a Python scalar multiplies by its reciprocal, one ulp off in about half the
    groups. x / descale then lands on the other side of an fp8 rounding tie for some elements (ties are
    common: bf16 values over an fp8 maximum of 7 x 64 are short fractions), so the same inputs quantised
    on the CPU and on the GPU differed by one fp8 step (6-12%) in a few elements."""
    descale = amax / full_like(amax, FP8_MAX[fp8_name])
    return where(descale == 0, 1.0, descale)



# Ranges of the C++ arguments: int32 lengths and counts, int64 sizes, fp32 scalars, head dims.
INT32_MAX = 2**31 - 1
INT64_MAX = 2**63 - 1
FLT_MAX = 3.4028234663852886e38
FLT_MIN = 1.1754943508222875e-38  # smallest normal float32
HEAD_DIM_MAX = 256


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
    if type(window_size) is tuple and len(window_size) == 2:  # the common case: a pair of ints in range
        left, right = window_size
        if type(left) is int and type(right) is int and -1 <= left <= INT64_MAX and -1 <= right <= INT64_MAX:
            return left, (0 if causal else right)
    try:
        left, right = window_size
        left, right = int(left), int(right)
    except (TypeError, ValueError, OverflowError):
        raise error("window_size", f"expected a pair (left, right), got {window_size!r}") from None
    for value, side in ((left, "left"), (right, "right")):
        if value < -1 or value > INT64_MAX:
            raise error("window_size", f"{side} must be in [-1, {INT64_MAX}] (-1 = unbounded), got {value}")
    return left, (0 if causal else right)


def check_float(value, name: str, lo: float | None = None, hi: float | None = None, hi_open: bool = False) -> float:
    """A float argument the kernels use as fp32: finite, 0 or a normal float32 magnitude (beyond FLT_MAX it
    becomes inf, below FLT_MIN a subnormal or 0: NaN or silently different answers), within [lo, hi]."""
    if (type(value) is float and (value == 0.0 or FLT_MIN <= abs(value) <= FLT_MAX) and (lo is None or value >= lo)
            and (hi is None or (value < hi if hi_open else value <= hi))):
        return value  # the common case, without the numbers ABC checks (every call passes here)
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise error(name, f"expected a number, got {type(value).__name__}")
    try:
        value = float(value)
    except OverflowError:  # an int beyond float64
        value = float("inf")
    if not (value == 0.0 or FLT_MIN <= abs(value) <= FLT_MAX):
        raise error(name, f"must be finite and fit float32: 0 or a magnitude in [{FLT_MIN:.9g}, {FLT_MAX:.9g}], "
                          f"got {value:.9g}")
    if lo is not None and value < lo:
        raise error(name, f"must be >= {lo}, got {value}")
    if hi is not None and (value >= hi if hi_open else value > hi):
        raise error(name, f"must be {'<' if hi_open else '<='} {hi}, got {value}")
    return value


def check_head_dim(x, name: str) -> None:
    """The head dim (last extent) of x before padding lies in [1, HEAD_DIM_MAX]. Checked here because the
    core sees padded sizes (257 would be reported as 264). Objects without a shape are left to later checks."""
    shape = getattr(x, "shape", None)
    if shape is not None and len(shape) >= 1:
        d = shape[-1]
        if type(d) is not int or not 1 <= d <= HEAD_DIM_MAX:  # the common case needs no call
            check_int(d, name, 1, HEAD_DIM_MAX, what="head dim")


def softmax_scale(scale, head_dim: int) -> float:
    """flash-attn's default 1/sqrt(head dim), from the head dim before any padding."""
    check_int(head_dim, "q", 1, HEAD_DIM_MAX, what="head dim")
    if scale is None:
        return head_dim**-0.5
    return check_float(scale, "softmax_scale")


def padded(head_dim: int) -> int:
    """flash-attn pads head dims to a multiple of 8 (zeros do not change q.k or P@V)."""
    return (head_dim + 7) // 8 * 8


def check_int(value, name: str, lo: int | None = None, hi: int = INT64_MAX, what: str = "") -> int:
    """An int argument in [lo, hi] (hi: INT64_MAX for sizes, INT32_MAX where C++ takes an int); 0-d integer
    tensors/arrays are read (max_seqlen is often one), and torch.SymInt (dynamic shapes under torch.compile)
    passes through. `what` names the quantity when it is not the argument itself ("head dim" of q)."""
    if type(value) is int and (lo is None or value >= lo) and value <= hi:
        return value  # the common case, without the numbers ABC checks (every call passes here)
    if type(value).__name__ == "SymInt":
        return value
    if getattr(value, "ndim", None) == 0 and hasattr(value, "item"):
        value = value.item()
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise error(name, f"expected an int, got {type(value).__name__}")
    value = int(value)
    subject = f"{what} must be" if what else "must be"
    if lo is not None and value < lo:
        raise error(name, f"{subject} >= {lo}, got {value}")
    if value > hi:
        kind = {INT32_MAX: " (int32)", INT64_MAX: " (int64)"}.get(hi, "")
        raise error(name, f"{subject} <= {hi}{kind}, got {value}")
    return value


def split_rng_state(seed: int, offset: int) -> tuple[int, int]:
    """Signed int64 (torch tensors hold int64) -> the unsigned 64-bit seed and 32-bit Philox offset."""
    return int(seed) & 0xFFFFFFFFFFFFFFFF, int(offset) & 0xFFFFFFFF
