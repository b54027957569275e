"""Host-argument checks shared by every op family (THD helpers, reference, one-device attention,
context parallelism, small-seq, the nn module): one definition each, so that one mistake gets
one message whichever entry point it reaches.

Every check reads host values only (types, dtypes, devices, shapes, Python ints): no device
value is read, so none of them synchronises, and all of them run under torch.compile.
"""

from __future__ import annotations

from typing import Optional, Tuple

import torch

__all__ = ["is_int", "check_int", "check_cu", "check_same_b", "check_window",
           "check_chunk_size"]


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
