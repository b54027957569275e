"""``rocm_attn.attention``: varlen (THD) attention on one device with causal, sliding-window and
chunked masks and padding between sequences, differentiable.

The engine :func:`rocm_attn.attn_with_cp` runs per step, called once: the sequences are
aligned rectangles (:mod:`rocm_attn.varlen.bands`), so one call of the per-step backend serves
them, with the user's window as is and chunking as one sub-sequence per chunk (flash-attention
has no chunk argument). ``torch_flash`` on CUDA / ROCm (fp16 / bf16), ``reference`` anywhere.
"""

from __future__ import annotations

from typing import List, Optional, Sequence, Tuple, Union

import torch

from .._checks import check_chunk_size, check_window
from ..errors import validate_mode
from ..second_derivative import no_second_derivative
from .backends import accum_dtype, resolve_backend
from . import formats
from .bands import MaskSpec, Segment
from .calls import backward_calls, forward_calls
from .checks import check_qkv, check_seq_args
from .max_logit import call_max_logit, combine
from .meta import StepMeta
from .pieces import whole_sequence_metas

__all__ = ["attention"]


class _VarlenAttnFunc(torch.autograd.Function):
    """One backend call forward, its backward backward (the contract of varlen/backends.py)."""

    @staticmethod
    def forward(ctx, q, k, v, metas, backend, scale: float):
        out, lse = forward_calls(q, k, v, metas, backend, scale)
        out = out.to(q.dtype)
        lse = lse.to(accum_dtype(q.dtype))
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.meta, ctx.backend, ctx.scale = metas, backend, scale
        ctx.set_materialize_grads(False)
        return out, lse

    @staticmethod
    def backward(ctx, dout, dlse):
        q, k, v, out, lse = ctx.saved_tensors
        if dout is None:
            dout = torch.zeros_like(out)
        with torch.no_grad():
            dq, dk, dv = backward_calls(dout, q, k, v, out, lse, dlse, ctx.meta, ctx.backend,
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
    cu_seqlens_q: Optional[torch.Tensor] = None,
    cu_seqlens_kv: Optional[torch.Tensor] = None,
    max_seqlen_q: Optional[int] = None,
    max_seqlen_kv: Optional[int] = None,
    *,
    attn_mask_type: Optional[str] = None,
    causal: Optional[bool] = None,
    window_size: Sequence[int] = (-1, -1),
    chunk_size: Optional[int] = None,
    softmax_scale: Optional[float] = None,
    return_lse: bool = False,
    return_max_logit: bool = False,
    qkv_format: str = "thd",
    backend: str = "auto",
    cu_seqlens_q_padded: Optional[torch.Tensor] = None,
    cu_seqlens_kv_padded: Optional[torch.Tensor] = None,
    validate: Optional[bool] = None,
) -> Union[torch.Tensor, Tuple[torch.Tensor, ...]]:
    """Varlen attention on one device (no context parallelism), THD, BSHD or SBHD.

    Parameters
    ----------
    q : torch.Tensor
        ``qkv_format="thd"``: ``[t_q, h_q, d]``; ``"bshd"``: ``[b, s_q, h_q, d]``; ``"sbhd"``:
        ``[s_q, b, h_q, d]``. float16 / bfloat16 / float32 / float64; any strides.
    k, v : torch.Tensor
        ``[t_kv, h_kv, d]`` (or ``[b, s_kv, h_kv, d]`` / ``[s_kv, b, h_kv, d]``),
        ``h_q % h_kv == 0`` (GQA / MQA).
    cu_seqlens_q, cu_seqlens_kv : torch.Tensor
        int32 ``[b+1]`` on q's device: valid tokens per sequence. Required for THD; for bshd /
        sbhd optional (valid lengths, a prefix of every row; default: all ``s`` tokens).
    max_seqlen_q, max_seqlen_kv : int
        Host upper bounds of the valid lengths. Required for THD; bshd / sbhd: default ``s``.
    attn_mask_type : str
        Transformer Engine's mask types (default ``"no_mask"``): ``"no_mask"`` / ``"padding"``
        (all keys), ``"causal"`` / ``"padding_causal"`` (top-left aligned: query ``i`` sees
        keys ``j <= i``), ``"causal_bottom_right"`` / ``"padding_causal_bottom_right"``
        (query ``i`` of ``n_q`` sits at kv position ``p = i + n_kv - n_q`` and sees
        ``j <= p``). The padding variants equal their base: lengths come from cu_seqlens.
        ``docs/cp.md`` draws the masks.
    causal : bool, optional
        Deprecated alias (DeprecationWarning): ``True`` is ``"causal_bottom_right"``,
        ``False`` ``"no_mask"``.
    window_size : (int, int)
        Sliding window ``(left, right)``, ``-1`` = unbounded, as Transformer Engine's: query at
        ``p`` (aligned as the mask type says; bottom-right for the non-causal types) sees
        ``p - left <= j <= p + right``, intersected with the causal mask.
    chunk_size : int, optional
        Chunked attention (Llama-4): ``j // chunk_size == p // chunk_size``, chunks from the
        start of every kv sequence; combines with the mask type and ``window_size``.
    softmax_scale : float, optional
        Default ``1 / sqrt(d)``.
    return_lse : bool
        Also return the LSE (differentiable).
    return_max_logit : bool
        Also return, last, the per-head maximum of the scaled logits ``softmax_scale * q.k``
        over the pairs the mask allows: float32 ``[h_q]`` (``-inf`` for a head with none),
        not differentiable, no host sync. ``torch_flash``: the flash call once more at
        ``softmax_scale * 2^16``, read from its LSE (over by at most
        ``ln(max_seqlen_kv) / 2^16`` plus float32 rounding; ``+inf`` past ``|max logit|``
        ~11,000); ``reference``: an exact blocked pass (``rocm_attn.varlen.max_logit``).
    qkv_format : str
        ``"thd"`` (default), ``"bshd"`` or ``"sbhd"``.
    backend : str
        ``"auto"`` (``torch_flash`` for CUDA / ROCm fp16 / bf16 with ``d % 8 == 0``, ``d <= 256``,
        else ``reference``), ``"torch_flash"`` or ``"reference"``.
    cu_seqlens_q_padded, cu_seqlens_kv_padded : torch.Tensor, optional
        THD only. int32 ``[b+1]``: where every sequence starts (padding between sequences).
        Valid tokens of sequence ``i`` are ``[cu_padded[i], cu_padded[i] + n_i)``; other rows
        are never read, get zero outputs and gradients and ``-inf`` LSE.
    validate : bool, optional
        Check the cu_seqlens values on the host (synchronises); default: CPU tensors only, or
        env ``ROCM_ATTN_VALIDATE=1``.

    Returns
    -------
    out : torch.Tensor
        q's shape and dtype; zero at padding rows and rows that see no key.
    lse : torch.Tensor
        With ``return_lse``: THD ``[h_q, t_q]``, bshd / sbhd ``[b, h_q, s_q]``; natural log,
        float32 (float64 for float64 inputs), ``-inf`` at padding rows and rows that see no key.
    max_logit : torch.Tensor
        With ``return_max_logit``: float32 ``[h_q]``, last.

    Raises
    ------
    ValueError
        Bad arguments (the message names the argument), ``backend="torch_flash"`` for inputs
        it cannot serve.
    """
    mask_type = formats.resolve_mask_type(attn_mask_type, causal, "no_mask")
    formats.check_format(qkv_format, q, k, v)
    if qkv_format != "thd":
        b, s_q = formats.dims(q, qkv_format)
        s_kv = formats.dims(k, qkv_format)[1]
        cu_seqlens_q, cu_seqlens_q_padded = formats.batch_cu_seqlens(
            "q", cu_seqlens_q, cu_seqlens_q_padded, b, s_q, q.device)
        cu_seqlens_kv, cu_seqlens_kv_padded = formats.batch_cu_seqlens(
            "kv", cu_seqlens_kv, cu_seqlens_kv_padded, b, s_kv, q.device)
        max_seqlen_q = s_q if max_seqlen_q is None else max_seqlen_q
        max_seqlen_kv = s_kv if max_seqlen_kv is None else max_seqlen_kv
        q, k, v = (formats.to_thd(x, qkv_format) for x in (q, k, v))
    for name, val in (("cu_seqlens_q", cu_seqlens_q), ("cu_seqlens_kv", cu_seqlens_kv),
                      ("max_seqlen_q", max_seqlen_q), ("max_seqlen_kv", max_seqlen_kv)):
        if val is None:
            raise ValueError(f"{name} is required for qkv_format='thd'")
    check_qkv(q, k, v, "attention", "THD")
    window = check_window(window_size)
    check_chunk_size(chunk_size)
    dev = q.device
    softmax_scale = check_seq_args(q, cu_seqlens_q, cu_seqlens_kv, cu_seqlens_q_padded,
                                   cu_seqlens_kv_padded, max_seqlen_q, max_seqlen_kv,
                                   softmax_scale)
    step_backend = resolve_backend(backend, q)
    # NOTE: the CPU default reads values on the host, free in eager but a data-dependent guard
    # under torch.compile, so a compiled default call skips it (as on a GPU)
    by_value = validate_mode(validate) or (validate is None and dev.type == "cpu"
                                           and not torch.compiler.is_compiling())
    if by_value:
        _check_values("q", cu_seqlens_q, cu_seqlens_q_padded, q.shape[0], max_seqlen_q)
        _check_values("kv", cu_seqlens_kv, cu_seqlens_kv_padded, k.shape[0], max_seqlen_kv)
    causal_mask = bool(formats.MASK_TYPES[mask_type])
    equal = formats.lengths_equal(cu_seqlens_q, cu_seqlens_kv, by_value)
    # a top-left mask is a bottom-right one where every sequence has as many queries as keys
    tl = formats.causal_top_left(mask_type) and not equal
    # the exact max_logit pass stops causal blocks at the diagonal where every call has as many
    # queries as keys: equal lengths, or top-left (its causal pieces start both together)
    square = equal or tl

    args = (cu_seqlens_q, cu_seqlens_kv, cu_seqlens_q_padded, cu_seqlens_kv_padded,
            max_seqlen_q, max_seqlen_kv, causal_mask, tl, window[0], window[1], chunk_size,
            float(softmax_scale), step_backend.name)
    if torch.compiler.is_compiling():
        out, lse = _attention_fwd(q, k, v, *args)
        # not differentiable: detached inputs keep the op out of the autograd graph (an op
        # output that required grad would need a backward formula)
        max_logit = (_attention_max_logit(q.detach(), k.detach(), *args, square)
                     if return_max_logit else None)
    else:
        metas = _metas(q, k, *args[:11])
        out, lse = _VarlenAttnFunc.apply(q, k, v, metas, step_backend, float(softmax_scale))
        max_logit = None
        if return_max_logit:
            with torch.no_grad():
                for meta in metas:
                    max_logit = combine(max_logit, call_max_logit(
                        step_backend, q, k, meta, float(softmax_scale), square))
    if qkv_format != "thd":
        out = formats.from_thd(out, qkv_format, b, s_q)
        lse = formats.lse_from_thd(lse, qkv_format, b, s_q)
    result = (out,) + ((lse,) if return_lse else ()) + ((max_logit,) if return_max_logit else ())
    return result[0] if len(result) == 1 else result


def _metas(q, k, cu_q, cu_kv, cu_q_p, cu_kv_p, max_q, max_kv, causal, top_left, left, right,
           chunk_size) -> List[StepMeta]:
    """The calls of ``attention``: whole sequences (bottom-right: one aligned rectangle, one
    call; top-left with different lengths: the pieces of ``pieces.top_left_pairs``)."""
    n_q = (cu_q[1:] - cu_q[:-1]).long()
    n_kv = (cu_kv[1:] - cu_kv[:-1]).long()
    start_q = (cu_q if cu_q_p is None else cu_q_p)[:-1].long()
    start_kv = (cu_kv if cu_kv_p is None else cu_kv_p)[:-1].long()
    q_pos = torch.zeros_like(n_q) if top_left else n_kv - n_q
    return whole_sequence_metas(
        MaskSpec.make(causal, (left, right), chunk_size), Segment(q_pos, n_q, start_q),
        Segment(torch.zeros_like(n_kv), n_kv, start_kv), max_q, max_kv, q.shape[0], k.shape[0],
        "attention", top_left)


# Under torch.compile the call is one opaque op pair (forward, backward) with fake impls: the
# step metadata and the reference backend read cu_seqlens values on the host, which a traced
# graph cannot do (data-dependent guards), while inside an op they run eagerly. Eager calls
# keep the autograd.Function above (no custom-op dispatch on the hot path); both run the same
# backend calls, so results are identical.
# The schemas are spelled out: torch 2.4 cannot infer them from this module's postponed (string)
# annotations.
_ARGS_AFTER_QKV = ("Tensor cu_q, Tensor cu_kv, Tensor? cu_q_p, Tensor? cu_kv_p, SymInt max_q, "
                   "SymInt max_kv, bool causal, bool top_left, SymInt left, SymInt right, "
                   "SymInt? chunk_size, float scale, str backend")


@torch.library.custom_op("rocm_attn_torch_path::attention_fwd", mutates_args=(),
                         schema=f"(Tensor q, Tensor k, Tensor v, {_ARGS_AFTER_QKV}) "
                                "-> (Tensor, Tensor)")
def _attention_fwd(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu_q: torch.Tensor,
                   cu_kv: torch.Tensor, cu_q_p: Optional[torch.Tensor],
                   cu_kv_p: Optional[torch.Tensor], max_q: int, max_kv: int, causal: bool,
                   top_left: bool, left: int, right: int, chunk_size: Optional[int],
                   scale: float, backend: str) -> Tuple[torch.Tensor, torch.Tensor]:
    metas = _metas(q, k, cu_q, cu_kv, cu_q_p, cu_kv_p, max_q, max_kv, causal, top_left, left,
                   right, chunk_size)
    out, lse = forward_calls(q, k, v, metas, resolve_backend(backend, q), scale)
    return out.to(q.dtype).contiguous(), lse.to(accum_dtype(q.dtype)).contiguous()


@_attention_fwd.register_fake
def _attention_fwd_fake(q, k, v, cu_q, cu_kv, cu_q_p, cu_kv_p, max_q, max_kv, causal, top_left,
                        left, right, chunk_size, scale, backend):
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
                   top_left: bool, left: int, right: int, chunk_size: Optional[int],
                   scale: float, backend: str) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    metas = _metas(q, k, cu_q, cu_kv, cu_q_p, cu_kv_p, max_q, max_kv, causal, top_left, left,
                   right, chunk_size)
    # NOTE: an op body runs with the autograd dispatch keys excluded, and the reference
    # backend's backward is autograd on a recomputation: let autograd record again in here
    # (the autocast exclusions stay)
    exclude = torch._C._dispatch_tls_local_exclude_set()
    keep = torch._C.DispatchKeySet(torch._C.DispatchKey.Undefined)  # empty
    for name in dir(torch._C.DispatchKey):
        if name.startswith("Autocast") and exclude.has(getattr(torch._C.DispatchKey, name)):
            keep = keep.add(getattr(torch._C.DispatchKey, name))
    with torch._C._ForceDispatchKeyGuard(torch._C._dispatch_tls_local_include_set(), keep):
        dq, dk, dv = backward_calls(dout, q, k, v, out, lse, dlse, metas,
                                    resolve_backend(backend, q), scale)
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


@torch.library.custom_op("rocm_attn_torch_path::attention_max_logit", mutates_args=(),
                         schema=f"(Tensor q, Tensor k, {_ARGS_AFTER_QKV}, bool square) "
                                "-> Tensor")
def _attention_max_logit(q: torch.Tensor, k: torch.Tensor, cu_q: torch.Tensor,
                         cu_kv: torch.Tensor, cu_q_p: Optional[torch.Tensor],
                         cu_kv_p: Optional[torch.Tensor], max_q: int, max_kv: int, causal: bool,
                         top_left: bool, left: int, right: int, chunk_size: Optional[int],
                         scale: float, backend: str, square: bool) -> torch.Tensor:
    best = None
    step_backend = resolve_backend(backend, q)
    for meta in _metas(q, k, cu_q, cu_kv, cu_q_p, cu_kv_p, max_q, max_kv, causal, top_left,
                       left, right, chunk_size):
        best = combine(best, call_max_logit(step_backend, q, k, meta, scale, square))
    return best


@_attention_max_logit.register_fake
def _attention_max_logit_fake(q, k, *rest):
    return q.new_empty((q.shape[1],), dtype=torch.float32)
