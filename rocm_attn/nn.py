"""Modules built on the ops: drop-in pieces for recommendation models."""

from __future__ import annotations

from typing import Optional

import torch
from torch import nn

from ._checks import is_int
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
        _check_size("embed_dim", embed_dim)
        _check_size("num_heads", num_heads)
        for name, value in (("head_dim", head_dim), ("num_kv_heads", num_kv_heads),
                            ("kv_embed_dim", kv_embed_dim)):
            if value is not None:  # None means the default; 0 is an error, not "unset"
                _check_size(name, value)
        if head_dim is None:
            head_dim = embed_dim // num_heads
            if head_dim == 0:
                raise ValueError(f"head_dim defaults to embed_dim // num_heads = {embed_dim} // "
                                 f"{num_heads} = 0: pass head_dim, or num_heads <= embed_dim")
        num_kv_heads = num_heads if num_kv_heads is None else num_kv_heads
        if num_heads % num_kv_heads:
            raise ValueError(f"num_heads ({num_heads}) must be a multiple of num_kv_heads "
                             f"({num_kv_heads})")
        if not is_int(max_seqlen_kv) or not (
                1 <= max_seqlen_kv <= MAX_SEQLEN_KV):
            raise ValueError(f"max_seqlen_kv must be an int in 1..{MAX_SEQLEN_KV}, got "
                             f"{max_seqlen_kv!r}")
        if backend not in ("auto", "kernel", "torch"):
            raise ValueError(f"backend must be 'auto', 'kernel' or 'torch', got {backend!r}")
        factory = {"device": device, "dtype": dtype}
        self.num_heads, self.num_kv_heads, self.head_dim = num_heads, num_kv_heads, head_dim
        self.embed_dim, self.kv_embed_dim = embed_dim, kv_embed_dim or embed_dim
        self.max_seqlen_kv, self.backend = max_seqlen_kv, backend
        self.q_proj = nn.Linear(embed_dim, num_heads * head_dim, bias=bias, **factory)
        self.kv_proj = nn.Linear(self.kv_embed_dim, 2 * num_kv_heads * head_dim,
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
        self._check_inputs(candidate, history, seqlens, cu_seqlens)
        b = candidate.shape[0]
        h, hk, d = self.num_heads, self.num_kv_heads, self.head_dim
        q = self.q_proj(candidate).view(b, h, d)
        kv = self.kv_proj(history)
        if seqlens is not None:
            kv = kv.view(b, history.shape[1], 2, hk, d)
            out = fused_attn_small_seq(
                q.unsqueeze(1), kv[:, :, 0], kv[:, :, 1], max_seqlen_kv=self.max_seqlen_kv,
                qkv_layout="bshd_bshd_bshd", seqlens_kv=seqlens, backend=self.backend)
        else:
            kv = kv.view(history.shape[0], 2, hk, d)
            cu_q = torch.arange(b + 1, dtype=torch.int32, device=candidate.device)
            out = fused_attn_small_seq(
                q, kv[:, 0], kv[:, 1], cu_q, cu_seqlens, max_seqlen_kv=self.max_seqlen_kv,
                backend=self.backend)
        return self.out_proj(out.reshape(b, h * d))

    def _check_inputs(self, candidate, history, seqlens, cu_seqlens) -> None:
        """Shapes, dtypes and devices against the module (ValueError naming the argument).
        Host metadata only: no tensor value is read, so this costs no device sync."""
        weight = self.q_proj.weight
        for name, t in (("candidate", candidate), ("history", history)):
            if not isinstance(t, torch.Tensor):
                raise ValueError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
            # under autocast the projections pick their own dtype
            if t.dtype != weight.dtype and not torch.is_autocast_enabled(t.device.type):
                raise ValueError(f"{name} dtype {t.dtype} differs from the module's "
                                 f"{weight.dtype} (convert the input or the module)")
            if t.device != weight.device:
                raise ValueError(f"{name} is on {t.device}, the module on {weight.device}")
        if candidate.dim() != 2 or candidate.shape[1] != self.embed_dim:
            raise ValueError(f"candidate must be [b, embed_dim={self.embed_dim}], got "
                             f"{tuple(candidate.shape)}")
        b = candidate.shape[0]
        padded = seqlens is not None
        rank, doc = (3, "[b, s, kv_embed_dim]") if padded else (2, "[total, kv_embed_dim]")
        if history.dim() != rank or history.shape[-1] != self.kv_embed_dim:
            raise ValueError(f"{'padded' if padded else 'packed'} history must be {doc} with "
                             f"kv_embed_dim={self.kv_embed_dim}, got {tuple(history.shape)}")
        if padded and history.shape[0] != b:
            raise ValueError(f"history batch {history.shape[0]} must equal candidate batch {b}")
        name, index, n = (("seqlens", seqlens, b) if padded else ("cu_seqlens", cu_seqlens, b + 1))
        if (not isinstance(index, torch.Tensor) or index.dtype != torch.int32 or index.dim() != 1
                or index.shape[0] != n):
            what = (f"{index.dtype} {tuple(index.shape)}" if isinstance(index, torch.Tensor)
                    else type(index).__name__)
            raise ValueError(f"{name} must be a 1-D int32 tensor of {n} entries (candidate batch "
                             f"{b}{' + 1' if not padded else ''}), got {what}")


def _check_size(name: str, value) -> None:
    if not is_int(value) or value < 1:
        raise ValueError(f"{name} must be a positive int, got {value!r}")
