"""Argument checks of an attention call over THD tensors, shared by the one-device
:func:`rocm_attn.attention` and :func:`rocm_attn.attn_with_cp` (host values only: no sync)."""

from __future__ import annotations

import torch

from .._checks import check_cu, check_same_b, check_softmax_scale, is_int

__all__ = ["DTYPES", "check_qkv", "check_seq_args"]

DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)


def check_qkv(q, k, v, op: str, layout: str) -> None:
    """ValueErrors for q / k / v that are not THD tensors of one dtype and device with
    matching head dims and a GQA head ratio (shared by attn_with_cp and attention)."""
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor):
            raise ValueError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
        if t.dim() != 3:
            raise ValueError(f"{name} must be [tokens, heads, head_dim] ({layout}), got "
                             f"shape {tuple(t.shape)}")
        if t.dtype not in DTYPES:
            raise ValueError(f"{name} has dtype {t.dtype}; {op} takes float16, bfloat16, "
                             "float32, float64")
    if not (q.dtype == k.dtype == v.dtype):
        raise ValueError(f"q, k, v must share a dtype, got {q.dtype}, {k.dtype}, {v.dtype}")
    if not (q.device == k.device == v.device):
        raise ValueError(f"q, k, v must be on one device, got {q.device}, {k.device}, {v.device}")
    if k.shape != v.shape:
        raise ValueError(f"k and v must have the same shape, got {tuple(k.shape)} and "
                         f"{tuple(v.shape)}")
    if q.shape[2] != k.shape[2]:
        raise ValueError(f"head dims differ: q has {q.shape[2]}, k/v have {k.shape[2]}")
    h_q, h_kv = q.shape[1], k.shape[1]
    if h_kv == 0 or h_q % h_kv:
        raise ValueError(f"h_q ({h_q}) must be a multiple of h_kv ({h_kv}) (GQA / MQA)")


def check_seq_args(q, cu_seqlens_q, cu_seqlens_kv, cu_seqlens_q_padded, cu_seqlens_kv_padded,
                   max_seqlen_q, max_seqlen_kv, softmax_scale) -> float:
    """ValueErrors for the cu_seqlens (int32 [b+1] on q's device, one b for all), the host
    max_seqlen bounds and softmax_scale; returns the scale (1/sqrt(d) when None). Shared by
    attn_with_cp and attention."""
    dev = q.device
    for name, t in (("cu_seqlens_q", cu_seqlens_q), ("cu_seqlens_kv", cu_seqlens_kv),
                    ("cu_seqlens_q_padded", cu_seqlens_q_padded),
                    ("cu_seqlens_kv_padded", cu_seqlens_kv_padded)):
        if t is not None:
            check_cu(name, t, dev, device_of="the device of q")
            check_same_b(name, t, "cu_seqlens_q", cu_seqlens_q)
    for name, m in (("max_seqlen_q", max_seqlen_q), ("max_seqlen_kv", max_seqlen_kv)):
        if not is_int(m) or m < 0:
            raise ValueError(f"{name} must be an int >= 0, got {m!r}")
    return check_softmax_scale(softmax_scale, q.shape[2])
