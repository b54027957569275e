"""Modules built on the ops: drop-in pieces for recommendation models."""

from __future__ import annotations

from typing import Optional

import torch
from torch import nn

from .small_seq import MAX_SEQLEN_KV, fused_attn_small_seq


class TargetAttention(nn.Module):
    """Target attention: a candidate item attends to its user's short behaviour history.

    The candidate embedding is the single query of its segment; the history items (up to 16)
    are the keys and values. Histories come padded (``[b, s, e]`` plus ``seqlens [b]``) or
    packed (``[total, e]`` plus ``cu_seqlens [b+1]``). The attention itself is
    :func:`rocm_attn.fused_attn_small_seq` (GPU kernels where present, torch path elsewhere).

    Parameters
    ----------
    embed_dim : width of the candidate embedding (and of the output).
    num_heads : query heads.
    head_dim : per-head width (default ``embed_dim // num_heads``).
    num_kv_heads : key/value heads for GQA/MQA (default ``num_heads``).
    kv_embed_dim : width of the history embeddings (default ``embed_dim``).
    bias : bias in the projections.
    max_seqlen_kv : bound on history length (1..16), passed to the op.
    backend : ``"auto"``, ``"kernel"`` or ``"torch"`` (see ``fused_attn_small_seq``).

    The key and value projections are one fused linear layer; k and v are strided views of
    its output, which the op reads without a copy.
    """

    def __init__(self, embed_dim: int, num_heads: int, head_dim: Optional[int] = None,
                 num_kv_heads: Optional[int] = None, kv_embed_dim: Optional[int] = None,
                 bias: bool = True, max_seqlen_kv: int = MAX_SEQLEN_KV, backend: str = "auto",
                 device=None, dtype=None) -> None:
        super().__init__()
        head_dim = head_dim or embed_dim // num_heads
        num_kv_heads = num_kv_heads or num_heads
        if head_dim <= 0 or num_heads <= 0 or num_heads % num_kv_heads:
            raise ValueError(
                f"need head_dim > 0 and num_heads ({num_heads}) a multiple of num_kv_heads "
                f"({num_kv_heads})")
        if not 1 <= max_seqlen_kv <= MAX_SEQLEN_KV:
            raise ValueError(f"max_seqlen_kv must be in 1..{MAX_SEQLEN_KV}, got {max_seqlen_kv}")
        factory = {"device": device, "dtype": dtype}
        self.num_heads, self.num_kv_heads, self.head_dim = num_heads, num_kv_heads, head_dim
        self.max_seqlen_kv, self.backend = max_seqlen_kv, backend
        self.q_proj = nn.Linear(embed_dim, num_heads * head_dim, bias=bias, **factory)
        self.kv_proj = nn.Linear(kv_embed_dim or embed_dim, 2 * num_kv_heads * head_dim,
                                 bias=bias, **factory)
        self.out_proj = nn.Linear(num_heads * head_dim, embed_dim, bias=bias, **factory)

    def forward(self, candidate: torch.Tensor, history: torch.Tensor, *,
                seqlens: Optional[torch.Tensor] = None,
                cu_seqlens: Optional[torch.Tensor] = None) -> torch.Tensor:
        """Score ``candidate [b, e]`` against ``history``; returns ``[b, embed_dim]``.

        Padded history: ``history [b, s, e_kv]`` with ``seqlens`` int32 ``[b]``. Packed
        history: ``history [total, e_kv]`` with ``cu_seqlens`` int32 ``[b+1]``.
        """
        if (seqlens is None) == (cu_seqlens is None):
            raise ValueError("pass exactly one of seqlens (padded history) or cu_seqlens (packed)")
        b = candidate.shape[0]
        h, hk, d = self.num_heads, self.num_kv_heads, self.head_dim
        q = self.q_proj(candidate).view(b, h, d)
        kv = self.kv_proj(history)
        if seqlens is not None:
            if history.dim() != 3:
                raise ValueError(f"padded history must be [b, s, e], got {tuple(history.shape)}")
            kv = kv.view(b, history.shape[1], 2, hk, d)
            out = fused_attn_small_seq(
                q.unsqueeze(1), kv[:, :, 0], kv[:, :, 1], max_seqlen_kv=self.max_seqlen_kv,
                qkv_layout="bshd_bshd_bshd", seqlens_kv=seqlens, backend=self.backend)
        else:
            if history.dim() != 2:
                raise ValueError(f"packed history must be [total, e], got {tuple(history.shape)}")
            kv = kv.view(history.shape[0], 2, hk, d)
            cu_q = torch.arange(b + 1, dtype=torch.int32, device=candidate.device)
            out = fused_attn_small_seq(
                q, kv[:, 0], kv[:, 1], cu_q, cu_seqlens, max_seqlen_kv=self.max_seqlen_kv,
                backend=self.backend)
        return self.out_proj(out.reshape(b, h * d))
