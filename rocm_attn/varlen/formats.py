"""``qkv_format`` ("thd", "bshd", "sbhd") and ``attn_mask_type`` (Transformer Engine's names)
of :func:`rocm_attn.attention` and :func:`rocm_attn.attn_with_cp`: both work on THD
internally; a bshd / sbhd tensor is a THD one whose sequence ``i`` fills rows
``[i*s, (i+1)*s)`` (sbhd through one transposed copy), valid tokens a prefix of every row."""

from __future__ import annotations

import warnings
from typing import Optional, Tuple

import torch

from ..reference import MASK_TYPES, normalize_mask_type, top_left

__all__ = ["QKV_FORMATS", "check_format", "to_thd", "from_thd", "lse_from_thd",
           "batch_cu_seqlens", "resolve_mask_type", "causal_top_left", "lengths_equal"]

QKV_FORMATS = ("thd", "bshd", "sbhd")


def check_format(qkv_format, q, k, v) -> None:
    if qkv_format not in QKV_FORMATS:
        raise ValueError(f"qkv_format must be one of {QKV_FORMATS}, got {qkv_format!r}")
    if qkv_format == "thd":
        return
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor) or t.dim() != 4:
            shape = tuple(t.shape) if isinstance(t, torch.Tensor) else type(t).__name__
            raise ValueError(f"{name} must be [{', '.join(qkv_format)}] for qkv_format="
                             f"{qkv_format!r}, got {shape}")
    bdim = 0 if qkv_format == "bshd" else 1
    if not (q.shape[bdim] == k.shape[bdim] == v.shape[bdim]):
        raise ValueError(f"q, k, v must share the batch size (dim {bdim} of {qkv_format}), got "
                         f"{q.shape[bdim]}, {k.shape[bdim]}, {v.shape[bdim]}")


def dims(x: torch.Tensor, qkv_format: str) -> Tuple[int, int]:
    """``(b, s)`` of a bshd / sbhd tensor."""
    return (x.shape[0], x.shape[1]) if qkv_format == "bshd" else (x.shape[1], x.shape[0])


def to_thd(x: torch.Tensor, qkv_format: str) -> torch.Tensor:
    """``[b*s, h, d]``: a view of a contiguous bshd tensor, a copy for sbhd."""
    if qkv_format == "thd":
        return x
    if qkv_format == "sbhd":
        x = x.transpose(0, 1)
    return x.reshape(x.shape[0] * x.shape[1], x.shape[2], x.shape[3])


def from_thd(y: torch.Tensor, qkv_format: str, b: int, s: int) -> torch.Tensor:
    """Inverse of :func:`to_thd` for an output ``[b*s, h, d]``."""
    if qkv_format == "thd":
        return y
    y = y.reshape(b, s, y.shape[1], y.shape[2])
    return y if qkv_format == "bshd" else y.transpose(0, 1).contiguous()


def lse_from_thd(lse: torch.Tensor, qkv_format: str, b: int, s: int) -> torch.Tensor:
    """LSE ``[h, b*s]`` -> ``[b, h, s]`` (bshd and sbhd)."""
    if qkv_format == "thd":
        return lse
    return lse.reshape(lse.shape[0], b, s).transpose(0, 1)


def batch_cu_seqlens(side: str, cu: Optional[torch.Tensor], padded: Optional[torch.Tensor],
                     b: int, s: int, device) -> Tuple[torch.Tensor, torch.Tensor]:
    """``(cu_seqlens, cu_seqlens_padded)`` of a bshd / sbhd side: sequence ``i`` in rows
    ``[i*s, (i+1)*s)``; ``cu`` (int32 ``[b+1]``, optional) gives its valid tokens (a prefix,
    the padding mask types), else all ``s`` are valid."""
    if padded is not None:
        raise ValueError(f"cu_seqlens_{side}_padded is for qkv_format='thd'; bshd / sbhd rows are "
                         f"the padded layout (pass cu_seqlens_{side} for valid lengths)")
    slots = torch.arange(b + 1, device=device, dtype=torch.int32) * s
    return (slots if cu is None else cu), slots


def resolve_mask_type(attn_mask_type: Optional[str], causal: Optional[bool],
                      default: str) -> str:
    """The call's mask type (Transformer Engine's names). ``causal`` is the deprecated bool
    alias of :func:`rocm_attn.attention`: True is bottom-right aligned
    (``"causal_bottom_right"``), False ``"no_mask"``."""
    if causal is not None:
        if not isinstance(causal, bool):
            raise ValueError(f"causal must be a bool, got {causal!r}")
        alias = "causal_bottom_right" if causal else "no_mask"
        warnings.warn(
            f"attention(causal={causal}) is deprecated: pass attn_mask_type={alias!r}. causal=True "
            "is bottom-right aligned (query i of n_q sees keys j <= i + n_kv - n_q), which "
            "Transformer Engine calls 'causal_bottom_right'; its 'causal' is top-left aligned",
            DeprecationWarning, stacklevel=3)
        if attn_mask_type is not None and attn_mask_type != alias:
            raise ValueError(f"causal={causal} and attn_mask_type={attn_mask_type!r} disagree; "
                             "pass attn_mask_type only")
        return alias
    if attn_mask_type is None:
        return default
    if not isinstance(attn_mask_type, str) or attn_mask_type not in MASK_TYPES:
        raise ValueError(f"attn_mask_type must be one of {sorted(MASK_TYPES)}, got "
                         f"{attn_mask_type!r}")
    return attn_mask_type


def causal_top_left(attn_mask_type: str) -> bool:
    """Causal and top-left aligned ("causal", "padding_causal")."""
    return normalize_mask_type(attn_mask_type) and top_left(attn_mask_type)


def lengths_equal(cu_q: torch.Tensor, cu_kv: torch.Tensor, by_value: bool) -> bool:
    """Whether every sequence has as many queries as keys, known on the host without a sync:
    the same tensor, or equal values when they are read anyway (``by_value``). Where this
    holds, top-left and bottom-right masks are the same mask."""
    if cu_q is cu_kv:
        return True
    return by_value and torch.equal(cu_q.detach().cpu(), cu_kv.detach().cpu())
