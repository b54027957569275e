"""``rocm_attn.attention``: varlen (THD) attention on one device with causal, sliding-window and
chunked masks and padding between sequences, differentiable.

The engine :func:`rocm_attn.attn_with_cp` runs per step, called once: the sequences are
aligned rectangles (:mod:`rocm_attn.varlen.bands`), so one call of the per-step backend serves
them, with the user's window as is and chunking as one sub-sequence per chunk (flash-attention
has no chunk argument). ``torch_flash`` on CUDA / ROCm (fp16 / bf16), ``reference`` anywhere.
"""

from __future__ import annotations

from typing import Optional, Sequence, Tuple, Union

import torch

from .._checks import check_chunk_size, check_window
from ..errors import validate_mode
from ..second_derivative import no_second_derivative
from .backends import accum_dtype, resolve_backend
from .bands import MaskSpec, Segment
from .checks import check_qkv, check_seq_args
from .meta import StepMeta
from .pieces import whole_sequence_meta

__all__ = ["attention"]


class _VarlenAttnFunc(torch.autograd.Function):
    """One backend call forward, its backward backward (the contract of varlen/backends.py)."""

    @staticmethod
    def forward(ctx, q, k, v, meta: StepMeta, backend, scale: float):
        out, lse = backend.forward(q, k, v, meta, scale)
        out = out.to(q.dtype)
        lse = lse.to(accum_dtype(q.dtype))
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.meta, ctx.backend, ctx.scale = meta, backend, scale
        ctx.set_materialize_grads(False)
        return out, lse

    @staticmethod
    def backward(ctx, dout, dlse):
        q, k, v, out, lse = ctx.saved_tensors
        if dout is None:
            dout = torch.zeros_like(out)
        with torch.no_grad():
            dq, dk, dv = ctx.backend.backward(dout, q, k, v, out, lse, dlse, ctx.meta,
                                              ctx.scale)
        grads = (dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype))
        return (*no_second_derivative("attention", grads, (q, k, v)), None, None, None)


def _check_values(side: str, cu: torch.Tensor, starts: Optional[torch.Tensor], rows: int,
                  max_seqlen: int) -> None:
    """Host checks of the cu_seqlens values (they synchronise: CPU tensors or validate)."""
    c = cu.long().cpu()
    lens = c[1:] - c[:-1]
    if int(c[0]) != 0 or bool((lens < 0).any()):
        raise ValueError(f"cu_seqlens_{side} must start at 0 and be non-decreasing")
    if lens.numel() and int(lens.max()) > max_seqlen:
        raise ValueError(f"max_seqlen_{side} = {max_seqlen} but sequence "
                         f"{int(torch.argmax(lens))} has {int(lens.max())} tokens")
    if starts is None:
        if int(c[-1]) > rows:
            raise ValueError(f"cu_seqlens_{side} ends at {int(c[-1])} but the {side} tensor has "
                             f"{rows} tokens")
        return
    p = starts.long().cpu()
    slots = p[1:] - p[:-1]
    bad = torch.nonzero((lens > slots) | (p[:-1] < 0))
    if bad.numel():
        i = int(bad[0, 0])
        raise ValueError(f"cu_seqlens_{side}_padded: sequence {i} has {int(lens[i])} valid "
                         f"tokens but a padded slot [{int(p[i])}, {int(p[i + 1])})")
    if int(p[-1]) > rows:
        raise ValueError(f"cu_seqlens_{side}_padded ends at {int(p[-1])} but the {side} tensor "
                         f"has {rows} tokens")


def attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    cu_seqlens_kv: torch.Tensor,
    max_seqlen_q: int,
    max_seqlen_kv: int,
    *,
    causal: bool = False,
    window_size: Sequence[int] = (-1, -1),
    chunk_size: Optional[int] = None,
    softmax_scale: Optional[float] = None,
    return_lse: bool = False,
    backend: str = "auto",
    cu_seqlens_q_padded: Optional[torch.Tensor] = None,
    cu_seqlens_kv_padded: Optional[torch.Tensor] = None,
    validate: Optional[bool] = None,
) -> Union[torch.Tensor, Tuple[torch.Tensor, torch.Tensor]]:
    """Varlen attention over THD sequences on one device (no context parallelism).

    Parameters
    ----------
    q : torch.Tensor
        ``[t_q, h_q, d]``; float16 / bfloat16 / float32 / float64; any strides.
    k, v : torch.Tensor
        ``[t_kv, h_kv, d]``, ``h_q % h_kv == 0`` (GQA / MQA).
    cu_seqlens_q, cu_seqlens_kv : torch.Tensor
        int32 ``[b+1]`` on q's device: valid tokens per sequence.
    max_seqlen_q, max_seqlen_kv : int
        Host upper bounds of the valid lengths.
    causal : bool
        Causal mask, bottom-right aligned (query ``i`` of ``n_q`` sits at kv position
        ``p = i + n_kv - n_q`` and sees keys ``j <= p``).
    window_size : (int, int)
        Sliding window ``(left, right)``, ``-1`` = unbounded: ``p - left <= j <= p + right``
        (flash-attention semantics), intersected with the causal mask.
    chunk_size : int, optional
        Chunked attention (Llama-4): ``j // chunk_size == p // chunk_size``, chunks from the
        start of every kv sequence; combines with ``causal`` and ``window_size``.
    softmax_scale : float, optional
        Default ``1 / sqrt(d)``.
    return_lse : bool
        Also return the LSE (differentiable).
    backend : str
        ``"auto"`` (``torch_flash`` for CUDA / ROCm fp16 / bf16 with ``d % 8 == 0``, ``d <= 256``,
        else ``reference``), ``"torch_flash"`` or ``"reference"``.
    cu_seqlens_q_padded, cu_seqlens_kv_padded : torch.Tensor, optional
        int32 ``[b+1]``: where every sequence starts (padding between sequences). Valid tokens
        of sequence ``i`` are ``[cu_padded[i], cu_padded[i] + n_i)``; other rows are never read,
        get zero outputs and gradients and ``-inf`` LSE.
    validate : bool, optional
        Check the cu_seqlens values on the host (synchronises); default: CPU tensors only, or
        env ``ROCM_ATTN_VALIDATE=1``.

    Returns
    -------
    out : torch.Tensor
        ``[t_q, h_q, d]`` in q's dtype; zero at padding rows and rows that see no key.
    lse : torch.Tensor
        With ``return_lse``: ``[h_q, t_q]`` natural log, float32 (float64 for float64 inputs),
        ``-inf`` at padding rows and rows that see no key.

    Raises
    ------
    ValueError
        Bad arguments (the message names the argument), ``backend="torch_flash"`` for inputs
        it cannot serve.
    """
    check_qkv(q, k, v, "attention", "THD")
    if not isinstance(causal, bool):
        raise ValueError(f"causal must be a bool, got {causal!r}")
    window = check_window(window_size)
    check_chunk_size(chunk_size)
    dev = q.device
    softmax_scale = check_seq_args(q, cu_seqlens_q, cu_seqlens_kv, cu_seqlens_q_padded,
                                   cu_seqlens_kv_padded, max_seqlen_q, max_seqlen_kv,
                                   softmax_scale)
    step_backend = resolve_backend(backend, q)
    # NOTE: the CPU default reads values on the host, free in eager but a data-dependent guard
    # under torch.compile, so a compiled default call skips it (as on a GPU)
    if validate_mode(validate) or (validate is None and dev.type == "cpu"
                                   and not torch.compiler.is_compiling()):
        _check_values("q", cu_seqlens_q, cu_seqlens_q_padded, q.shape[0], max_seqlen_q)
        _check_values("kv", cu_seqlens_kv, cu_seqlens_kv_padded, k.shape[0], max_seqlen_kv)

    args = (cu_seqlens_q, cu_seqlens_kv, cu_seqlens_q_padded, cu_seqlens_kv_padded,
            max_seqlen_q, max_seqlen_kv, causal, window[0], window[1], chunk_size,
            float(softmax_scale), step_backend.name)
    if torch.compiler.is_compiling():
        out, lse = _attention_fwd(q, k, v, *args)
    else:
        out, lse = _VarlenAttnFunc.apply(q, k, v, _meta(q, k, *args[:10]), step_backend,
                                         float(softmax_scale))
    return (out, lse) if return_lse else out


def _meta(q, k, cu_q, cu_kv, cu_q_p, cu_kv_p, max_q, max_kv, causal, left, right,
          chunk_size) -> StepMeta:
    """The one step of ``attention``: whole sequences (aligned rectangles)."""
    n_q = (cu_q[1:] - cu_q[:-1]).long()
    n_kv = (cu_kv[1:] - cu_kv[:-1]).long()
    start_q = (cu_q if cu_q_p is None else cu_q_p)[:-1].long()
    start_kv = (cu_kv if cu_kv_p is None else cu_kv_p)[:-1].long()
    return whole_sequence_meta(
        MaskSpec.make(causal, (left, right), chunk_size), Segment(n_kv - n_q, n_q, start_q),
        Segment(torch.zeros_like(n_kv), n_kv, start_kv), max_q, max_kv, q.shape[0], k.shape[0],
        "attention")


# Under torch.compile the call is one opaque op pair (forward, backward) with fake impls: the
# step metadata and the reference backend read cu_seqlens values on the host, which a traced
# graph cannot do (data-dependent guards), while inside an op they run eagerly. Eager calls
# keep the autograd.Function above (no custom-op dispatch on the hot path); both run the same
# backend calls, so results are identical.
# The schemas are spelled out: torch 2.4 cannot infer them from this module's postponed (string)
# annotations.
_ARGS_AFTER_QKV = ("Tensor cu_q, Tensor cu_kv, Tensor? cu_q_p, Tensor? cu_kv_p, SymInt max_q, "
                   "SymInt max_kv, bool causal, SymInt left, SymInt right, SymInt? chunk_size, "
                   "float scale, str backend")


@torch.library.custom_op("rocm_attn_torch_path::attention_fwd", mutates_args=(),
                         schema=f"(Tensor q, Tensor k, Tensor v, {_ARGS_AFTER_QKV}) "
                                "-> (Tensor, Tensor)")
def _attention_fwd(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu_q: torch.Tensor,
                   cu_kv: torch.Tensor, cu_q_p: Optional[torch.Tensor],
                   cu_kv_p: Optional[torch.Tensor], max_q: int, max_kv: int, causal: bool,
                   left: int, right: int, chunk_size: Optional[int], scale: float,
                   backend: str) -> Tuple[torch.Tensor, torch.Tensor]:
    meta = _meta(q, k, cu_q, cu_kv, cu_q_p, cu_kv_p, max_q, max_kv, causal, left, right,
                 chunk_size)
    out, lse = resolve_backend(backend, q).forward(q, k, v, meta, scale)
    return out.to(q.dtype).contiguous(), lse.to(accum_dtype(q.dtype)).contiguous()


@_attention_fwd.register_fake
def _attention_fwd_fake(q, k, v, cu_q, cu_kv, cu_q_p, cu_kv_p, max_q, max_kv, causal, left,
                        right, chunk_size, scale, backend):
    return (torch.empty_like(q, memory_format=torch.contiguous_format),
            q.new_empty((q.shape[1], q.shape[0]), dtype=accum_dtype(q.dtype)))


@torch.library.custom_op("rocm_attn_torch_path::attention_bwd", mutates_args=(),
                         schema="(Tensor dout, Tensor? dlse, Tensor q, Tensor k, Tensor v, "
                                f"Tensor out, Tensor lse, {_ARGS_AFTER_QKV}) "
                                "-> (Tensor, Tensor, Tensor)")
def _attention_bwd(dout: torch.Tensor, dlse: Optional[torch.Tensor], q: torch.Tensor,
                   k: torch.Tensor, v: torch.Tensor, out: torch.Tensor, lse: torch.Tensor,
                   cu_q: torch.Tensor, cu_kv: torch.Tensor, cu_q_p: Optional[torch.Tensor],
                   cu_kv_p: Optional[torch.Tensor], max_q: int, max_kv: int, causal: bool,
                   left: int, right: int, chunk_size: Optional[int], scale: float,
                   backend: str) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    meta = _meta(q, k, cu_q, cu_kv, cu_q_p, cu_kv_p, max_q, max_kv, causal, left, right,
                 chunk_size)
    # NOTE: an op body runs with the autograd dispatch keys excluded, and the reference
    # backend's backward is autograd on a recomputation: let autograd record again in here
    # (the autocast exclusions stay)
    exclude = torch._C._dispatch_tls_local_exclude_set()
    keep = torch._C.DispatchKeySet(torch._C.DispatchKey.Undefined)  # empty
    for name in dir(torch._C.DispatchKey):
        if name.startswith("Autocast") and exclude.has(getattr(torch._C.DispatchKey, name)):
            keep = keep.add(getattr(torch._C.DispatchKey, name))
    with torch._C._ForceDispatchKeyGuard(torch._C._dispatch_tls_local_include_set(), keep):
        dq, dk, dv = resolve_backend(backend, q).backward(dout, q, k, v, out, lse, dlse, meta,
                                                          scale)
    return dq.to(q.dtype).contiguous(), dk.to(k.dtype).contiguous(), dv.to(v.dtype).contiguous()


@_attention_bwd.register_fake
def _attention_bwd_fake(dout, dlse, q, k, v, out, lse, *rest):
    return tuple(torch.empty_like(t, memory_format=torch.contiguous_format) for t in (q, k, v))


def _attention_setup(ctx, inputs, output):
    q, k, v, *rest = inputs
    ctx.save_for_backward(q, k, v, *output)
    ctx.rest = rest


def _attention_backward(ctx, dout, dlse):
    q, k, v, out, lse = ctx.saved_tensors
    if dout is None:
        dout = torch.zeros_like(out)
    with torch.no_grad():
        grads = _attention_bwd(dout, dlse, q, k, v, out, lse, *ctx.rest)
    return (*no_second_derivative("attention", grads, (q, k, v)),) + (None,) * len(ctx.rest)


_attention_fwd.register_autograd(_attention_backward, setup_context=_attention_setup)
