"""Host-argument checks shared by every op family (THD helpers, reference, one-device attention,
context parallelism, small-seq, the nn module): one definition each, so that one mistake gets
one message whichever entry point it reaches.

Every check reads host values only (types, dtypes, devices, shapes, Python ints): no device
value is read, so none of them synchronises, and all of them run under torch.compile.
"""

from __future__ import annotations

import math
from typing import Optional, Tuple

import torch

__all__ = ["is_int", "check_int", "check_cu", "check_same_b", "check_window",
           "check_chunk_size", "check_softmax_scale", "FLOAT32_MAX"]

# Largest finite float32: every kernel (and the torch path for 16/32-bit inputs) applies
# softmax_scale in float32, so a larger scale would be inf there.
FLOAT32_MAX = float(torch.finfo(torch.float32).max)


def is_int(v) -> bool:
    """A Python int that is not a bool (``True`` is an int to Python, never a size here)."""
    return isinstance(v, int) and not isinstance(v, bool)


def check_int(name: str, v, lo: int = 0) -> int:
    """``v`` as an int ``>= lo``, else a ValueError naming ``name``."""
    if not is_int(v) or v < lo:
        raise ValueError(f"{name} must be an int >= {lo}, got {v!r}")
    return int(v)


def check_cu(name: str, cu, device: Optional[torch.device] = None,
             device_of: str = "the data") -> None:
    """``cu`` is a cu_seqlens tensor: int32, 1-D, ``b+1 >= 1`` entries, on ``device`` when one
    is given (``device_of`` says whose device that is, for the message)."""
    if not isinstance(cu, torch.Tensor):
        raise ValueError(f"{name} must be an int32 torch.Tensor [b+1], got {type(cu).__name__}")
    if cu.dtype != torch.int32:
        raise ValueError(f"{name} must have dtype torch.int32, got {cu.dtype}")
    if cu.dim() != 1 or cu.numel() < 1:
        raise ValueError(f"{name} must be 1-D with b+1 >= 1 entries, got shape {tuple(cu.shape)}")
    if device is not None and cu.device != device:
        raise ValueError(f"{name} must be on {device} ({device_of}), got {cu.device}")


def check_same_b(name: str, cu: torch.Tensor, ref_name: str, ref: torch.Tensor) -> None:
    """``cu`` describes as many sequences as ``ref`` (both cu_seqlens tensors)."""
    if cu.numel() != ref.numel():
        raise ValueError(
            f"{name} must have b+1 = {ref.numel()} entries like {ref_name}, got {cu.numel()}"
        )


def check_window(window_size) -> Tuple[int, int]:
    """A sliding window ``(left, right)`` of ints ``>= -1`` (``-1`` = unbounded; None = no
    window), as a tuple of ints."""
    if window_size is None:
        return (-1, -1)
    if (not isinstance(window_size, (tuple, list)) or len(window_size) != 2
            or not all(is_int(w) and w >= -1 for w in window_size)):
        raise ValueError("window_size must be a pair of ints (left, right), each >= -1 "
                         f"(-1 = unbounded), got {window_size!r}")
    return int(window_size[0]), int(window_size[1])


def check_chunk_size(chunk_size, allow_none: bool = True) -> Optional[int]:
    """A chunked-attention chunk size: a positive int, or None (no chunking) when allowed."""
    if chunk_size is None and allow_none:
        return None
    if not is_int(chunk_size) or chunk_size <= 0:
        raise ValueError(f"chunk_size must be {'None or ' if allow_none else ''}a positive int, "
                         f"got {chunk_size!r}")
    return int(chunk_size)


def check_softmax_scale(softmax_scale, head_dim: int) -> float:
    """The softmax scale of an attention call: ``1 / sqrt(head_dim)`` for None (1.0 for an empty
    head dim), else a real number finite in float32, any sign (zero gives uniform weights, a
    negative scale favours the least similar keys). nan, inf and ``|scale| > 3.4e38`` would turn
    every score non-finite, so they raise instead of returning NaN."""
    if softmax_scale is None:
        return 1.0 / math.sqrt(head_dim) if head_dim > 0 else 1.0
    if isinstance(softmax_scale, bool) or not isinstance(softmax_scale, (int, float)):
        raise ValueError(
            f"softmax_scale must be a float or None, got {type(softmax_scale).__name__}")
    try:
        finite = math.isfinite(softmax_scale) and abs(float(softmax_scale)) <= FLOAT32_MAX
    except OverflowError:  # an int beyond the float range
        finite = False
    if not finite:
        raise ValueError(
            f"softmax_scale must be finite in float32 (|softmax_scale| <= {FLOAT32_MAX:.4g}; the "
            f"kernels apply it in float32), got {softmax_scale!r}")
    return float(softmax_scale)
