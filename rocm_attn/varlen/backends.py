"""Per-step attention backends: what computes one attention call of the engine, for
:func:`rocm_attn.attention` (one call) and every step of :func:`rocm_attn.attn_with_cp`.

A backend computes one :class:`~rocm_attn.varlen.meta.StepMeta` step: a varlen attention whose
sub-sequences start at ``cu_seqlens_*_padded`` rows of the step's tensors with
``cu_seqlens_*`` valid rows each (padding rows never read), and its backward.

Interface (:class:`StepBackend`)
--------------------------------
``forward(q, k, v, meta, scale) -> (out, lse)``
    ``out [t_q, h_q, d]`` (zero at rows outside every sub-sequence and rows with no allowed
    key), ``lse [h_q, t_q]`` float32 (float64 for float64 inputs), ``-inf`` at those rows.
    ``out`` may be in the input dtype or wider: the caller merges into an fp32/fp64 accumulator.
``backward(dout, q, k, v, out, lse, dlse, meta, scale) -> (dq, dk, dv)``
    ``out`` / ``lse`` are the **final** (all steps merged) output and LSE restricted to the
    step's q rows, ``dout`` / ``dlse`` their cotangents (``dlse`` may be None). The result is
    this step's exact contribution to the gradients: with ``P = exp(S - lse_final)`` restricted
    to the step's keys, ``dS = P * (dO V^T - rowdot(dO, O) + dlse)`` (the flash-attention
    backward; summing it over the steps gives the gradient of the whole attention).

Backends
--------
* ``reference``: pure torch on any device (:func:`rocm_attn.reference.reference_attention`,
  computed in float32, float64 for float64 inputs). Its backward recomputes the step with
  autograd and calls ``torch.autograd.grad`` on ``(out_step, lse_step)`` with the cotangents
  ``w * dO`` and ``w * (dlse + rowdot(dO, out_step - out))``, ``w = exp(lse_step - lse)``: by
  the chain rule through the online-softmax merge this equals the flash-style ``dS`` above.
* ``torch_flash``: ``aten._flash_attention_forward`` / ``_backward`` (varlen) on CUDA / ROCm,
  fp16 / bf16, head dim <= 256. **Untested in this repository's CPU CI**: it needs a GPU.

Steps with ``meta.packed_kv_rows`` set (windows, chunking: kv ranges may overlap) run on
packed buffers (:mod:`~rocm_attn.varlen.packed`): ``forward_packed(q_p, k_p, v_p, meta, scale)``
and ``backward_packed(dout_p, q_p, k_p, v_p, out_p, lse_p, dlse_p, meta, scale)`` take and
return packed rows (sub-sequence ``i`` at rows ``[cu[i], cu[i+1])``; rows past ``cu[-1]`` may
come back as junk). Callers merge those straight into their accumulators;
``forward`` / ``backward`` on such a step gather, call them and scatter back.
* ``auto``: ``torch_flash`` for CUDA/ROCm fp16/bf16 inputs with ``d <= 256`` and ``d % 8 == 0``
  when this torch's flash attention passes the start-up check (:func:`flash_support_problem`:
  varlen, windows and GQA on a tiny step against the reference, once per device and dtype),
  else ``reference``; the choice is logged (logger ``rocm_attn.cp``), a failed check at
  WARNING with its reason. ``backend="torch_flash"`` on a torch that fails the check raises
  ``ValueError`` before any step runs.
"""

from __future__ import annotations

import logging
from typing import Optional, Tuple

import torch

from .. import thd
from .._logging import log_choice
from ..reference import reference_attention
from . import packed
from .meta import StepMeta

__all__ = ["BACKENDS", "StepBackend", "ReferenceBackend", "TorchFlashBackend", "resolve_backend",
           "flash_support_problem", "accum_dtype"]

BACKENDS = ("auto", "reference", "torch_flash")

_log = logging.getLogger("rocm_attn.cp")
NEG_INF = float("-inf")


def accum_dtype(dtype: torch.dtype) -> torch.dtype:
    """Accumulation dtype of CP outputs, LSE and gradients: float64 for float64, else float32."""
    return torch.float64 if dtype == torch.float64 else torch.float32


class StepBackend:
    """Base class: see the module docstring for the contract."""

    name = "base"

    def forward(self, q, k, v, meta: StepMeta, softmax_scale: float
                ) -> Tuple[torch.Tensor, torch.Tensor]:
        raise NotImplementedError

    def backward(self, dout, q, k, v, out, lse, dlse: Optional[torch.Tensor], meta: StepMeta,
                 softmax_scale: float) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        raise NotImplementedError

    def forward_packed(self, q_p, k_p, v_p, meta: StepMeta, softmax_scale: float
                       ) -> Tuple[torch.Tensor, torch.Tensor]:
        raise NotImplementedError

    def backward_packed(self, dout_p, q_p, k_p, v_p, out_p, lse_p, dlse_p, meta: StepMeta,
                        softmax_scale: float):
        raise NotImplementedError

    def _general_forward(self, q, k, v, meta: StepMeta, softmax_scale: float):
        """``forward`` of a packed-contract step: gather, attend, scatter back."""
        mq, mkv = packed.step_rows(meta, q.shape[0], k.shape[0])
        out_p, lse_p = self.forward_packed(
            packed.gather_packed(q, mq), packed.gather_packed(k, mkv),
            packed.gather_packed(v, mkv), meta, softmax_scale)
        return (packed.scatter_packed(out_p, mq, 0.0),
                packed.scatter_packed(lse_p, mq, NEG_INF, dim=-1))

    def _general_backward(self, dout, q, k, v, out, lse, dlse, meta: StepMeta,
                          softmax_scale: float):
        """``backward`` of a packed-contract step: gather, differentiate, scatter(-add)."""
        cdt = accum_dtype(q.dtype)
        shapes = ((q.shape[0] + 1,) + tuple(q.shape[1:]), (k.shape[0] + 1,) + tuple(k.shape[1:]))
        dq = q.new_zeros(shapes[0], dtype=cdt)
        dk, dv = (k.new_zeros(shapes[1], dtype=cdt) for _ in range(2))
        packed.backward_into(dq, dk, dv, self, dout, q, k, v, out, lse, dlse, meta,
                             softmax_scale)
        return dq[:-1], dk[:-1], dv[:-1]


def _reference_mask(meta: StepMeta) -> str:
    """A step's mask under its reference name: a step's ``"causal"`` is flash's (bottom-right
    aligned), which the reference calls ``"causal_bottom_right"``."""
    return "causal_bottom_right" if meta.attn_mask_type == "causal" else meta.attn_mask_type


class ReferenceBackend(StepBackend):
    """Pure torch per-step attention (the CPU path). Gradients by autograd on a recomputation."""

    name = "reference"

    @staticmethod
    def _attend(q, k, v, meta: StepMeta, softmax_scale: float):
        cdt = accum_dtype(q.dtype)
        # inputs converted first so that the output stays in cdt (rounded once, by the caller)
        return reference_attention(
            q.to(cdt), k.to(cdt), v.to(cdt), meta.cu_seqlens_q, meta.cu_seqlens_kv,
            attn_mask_type=_reference_mask(meta), window_size=meta.window_size,
            softmax_scale=softmax_scale, cu_seqlens_q_padded=meta.cu_seqlens_q_padded,
            cu_seqlens_kv_padded=meta.cu_seqlens_kv_padded, compute_dtype=cdt)

    @staticmethod
    def _attend_packed(q_p, k_p, v_p, meta: StepMeta, softmax_scale: float):
        cdt = accum_dtype(q_p.dtype)
        return reference_attention(
            q_p.to(cdt), k_p.to(cdt), v_p.to(cdt), meta.cu_seqlens_q, meta.cu_seqlens_kv,
            attn_mask_type=_reference_mask(meta), window_size=meta.window_size,
            softmax_scale=softmax_scale, compute_dtype=cdt)

    def forward(self, q, k, v, meta, softmax_scale):
        if meta.packed_kv_rows is not None:
            return self._general_forward(q, k, v, meta, softmax_scale)
        return self._attend(q, k, v, meta, softmax_scale)

    def forward_packed(self, q_p, k_p, v_p, meta, softmax_scale):
        return self._attend_packed(q_p, k_p, v_p, meta, softmax_scale)

    def backward(self, dout, q, k, v, out, lse, dlse, meta, softmax_scale):
        if meta.packed_kv_rows is not None:
            return self._general_backward(dout, q, k, v, out, lse, dlse, meta, softmax_scale)
        return _autograd_step_grads(self._attend, dout, q, k, v, out, lse, dlse, meta,
                                    softmax_scale)

    def backward_packed(self, dout_p, q_p, k_p, v_p, out_p, lse_p, dlse_p, meta, softmax_scale):
        return _autograd_step_grads(self._attend_packed, dout_p, q_p, k_p, v_p, out_p, lse_p,
                                    dlse_p, meta, softmax_scale)


def _autograd_step_grads(attend, dout, q, k, v, out, lse, dlse, meta: StepMeta,
                         softmax_scale: float):
    """This step's exact share of the gradients: recompute the step with autograd and pull
    ``(w * dO, w * (dlse + rowdot(dO, out_step - out)))``, ``w = exp(lse_step - lse)`` (the
    chain rule through the online-softmax merge), through it."""
    cdt = accum_dtype(q.dtype)
    qc = q.detach().to(cdt).requires_grad_(True)
    kc = k.detach().to(cdt).requires_grad_(True)
    vc = v.detach().to(cdt).requires_grad_(True)
    with torch.enable_grad():
        o_s, l_s = attend(qc, kc, vc, meta, softmax_scale)
    if not (o_s.requires_grad or l_s.requires_grad):  # no sub-sequence had a key
        return tuple(torch.zeros_like(x) for x in (qc, kc, vc))
    ls = l_s.detach()
    lse_c = lse.to(ls.dtype)
    # weight of this step in the merged result; 0 where the step saw no key
    w = torch.where(ls == NEG_INF, torch.zeros_like(ls),
                    torch.exp(ls - torch.where(lse_c == NEG_INF, ls, lse_c)))
    do = dout.to(cdt)
    d_o = do * w.t().unsqueeze(-1)
    d_l = (do * (o_s.detach() - out.to(cdt))).sum(-1).t()
    if dlse is not None:
        d_l = d_l + dlse.to(cdt)
    d_l = torch.where(w > 0, w * d_l, torch.zeros_like(d_l))
    grads = torch.autograd.grad((o_s, l_s), (qc, kc, vc), (d_o, d_l.to(l_s.dtype)),
                                allow_unused=True)
    return tuple(torch.zeros_like(x) if g is None else g for g, x in zip(grads, (qc, kc, vc)))


def _pack(x: torch.Tensor, cu: torch.Tensor, cu_padded: torch.Tensor, dim: int = 0):
    """Padded layout -> packed (valid rows first, in order), same number of rows."""
    dst = torch.zeros_like(x, memory_format=torch.contiguous_format)
    return thd.copy_valid_tokens(dst, x, cu, None, cu_padded, dim=dim)


def _unpack(x: torch.Tensor, cu: torch.Tensor, cu_padded: torch.Tensor, fill: float,
            dim: int = 0):
    dst = torch.empty_like(x, memory_format=torch.contiguous_format)
    return thd.copy_valid_tokens(dst, x, cu, cu_padded, None, dim=dim, fill=fill)


class TorchFlashBackend(StepBackend):
    """``aten._flash_attention_forward`` / ``_backward`` varlen (CUDA / ROCm builds of torch).

    UNTESTED ON CPU: this repository's CI has no GPU; validate with the GPU checks before
    relying on it. The kernels have no ``seqused_q`` and read sub-sequences back to back, so
    the step's valid rows are packed first (``thd.copy_valid_tokens``) and the results
    unpacked (padding rows: zero output, ``-inf`` LSE, zero gradients). Rows with no key, for
    which some flash builds write LSE ``+inf``, are mapped to ``-inf`` / zero output. The LSE
    cotangent has no slot in the flash backward: when one is given, a second backward call
    with ``V = 0`` adds its exact contribution (see :meth:`backward`).
    """

    name = "torch_flash"

    @staticmethod
    def _is_causal(meta: StepMeta) -> bool:
        return meta.attn_mask_type == "causal"

    @staticmethod
    def _max_seqlens(meta: StepMeta) -> Tuple[int, int]:
        """Host bounds passed to the kernels, adjusted for two quirks of the aten wrapper:

        * ``max_seqlen_q == 1`` with GQA and no window switches to a path that assumes one
          query per sub-sequence and no varlen q; our packed buffers have slack rows, so
          pass at least 2 (a looser bound only grows the grid).
        * a window ``(left >= 0, -1)`` without causal becomes ``(left, max_seqlen_k)`` inside
          the wrapper, i.e. query ``i`` sees keys up to ``i + sk - sq + max_seqlen_k``: that
          is "unbounded" only when ``max_seqlen_k >= sq - 1``, so raise it to ``max_seqlen_q``
          (the ``rev`` pieces of windowed steps have ``sk <= sq``).
        """
        max_q, max_k = max(2, meta.max_seqlen_q), meta.max_seqlen_kv
        left, right = meta.window_size
        if left >= 0 and right < 0 and not TorchFlashBackend._is_causal(meta):
            max_k = max(max_k, max_q)
        return max_q, max_k

    direct = True  # reads sub-sequences in place (StepMeta.direct): forward/backward_direct

    def forward_direct(self, q, k, v, meta, softmax_scale):
        """Flash on the whole step tensors with :class:`~rocm_attn.varlen.meta.DirectCall`'s
        dummy sub-sequences: no packing copies. Valid only at the rows ``meta.direct`` covers
        (the caller merges those by index); LSE ``-inf`` where a covered row saw no key."""
        dc = meta.direct
        out, lse = self._flash_call(q.contiguous(), k.contiguous(), v.contiguous(), meta,
                                    softmax_scale, (dc.cu_q, dc.cu_kv))
        return out, lse.masked_fill_(lse == float("inf"), NEG_INF)

    def backward_direct(self, dout, q, k, v, out, lse, dlse, meta, softmax_scale):
        """Gradients of a :class:`~rocm_attn.varlen.meta.DirectCall` step on the whole tensors
        (``out`` / ``lse`` / ``dout`` / ``dlse`` the final ones); valid at covered rows only."""
        dc = meta.direct
        dt = q.dtype
        return self._packed_bwd(dout.to(dt).contiguous(), q.contiguous(), k.contiguous(),
                                v.contiguous(), out.to(dt).contiguous(), lse.float(),
                                None if dlse is None else dlse.float(), meta, softmax_scale,
                                (dc.cu_q, dc.cu_kv))

    def _flash_call(self, q, k, v, meta, softmax_scale, cu=None):
        """The aten flash forward with the meta's mask (and ``cu`` = ``(cu_q, cu_kv)`` instead
        of the meta's cu_seqlens): raw ``(out, lse float32)``."""
        max_q, max_k = self._max_seqlens(meta)
        cu_q, cu_kv = cu if cu is not None else (meta.cu_seqlens_q, meta.cu_seqlens_kv)
        out, lse, _, _, _ = _aten_flash()[0](
            q, k, v, cu_q, cu_kv, max_q, max_k, 0.0, self._is_causal(meta), False,
            scale=softmax_scale, window_size_left=meta.window_size[0],
            window_size_right=meta.window_size[1])
        return out, lse.float()

    def _flash_fwd(self, q_p, k_p, v_p, meta, softmax_scale):
        out_p, lse_p = self._flash_call(q_p, k_p, v_p, meta, softmax_scale)
        lse_p = torch.where(torch.isfinite(lse_p), lse_p, torch.full_like(lse_p, NEG_INF))
        out_p = out_p.masked_fill((lse_p == NEG_INF).t().unsqueeze(-1), 0)
        return out_p, lse_p

    def forward(self, q, k, v, meta, softmax_scale):
        if meta.packed_kv_rows is not None:
            return self._general_forward(q, k, v, meta, softmax_scale)
        qp = _pack(q, meta.cu_seqlens_q, meta.cu_seqlens_q_padded)
        kp = _pack(k, meta.cu_seqlens_kv, meta.cu_seqlens_kv_padded)
        vp = _pack(v, meta.cu_seqlens_kv, meta.cu_seqlens_kv_padded)
        out_p, lse_p = self._flash_fwd(qp, kp, vp, meta, softmax_scale)
        out = _unpack(out_p, meta.cu_seqlens_q, meta.cu_seqlens_q_padded, 0.0)
        lse = _unpack(lse_p, meta.cu_seqlens_q, meta.cu_seqlens_q_padded, NEG_INF, dim=-1)
        return out, lse

    def _flash_bwd(self, dout_p, q_p, k_p, v_p, out_p, lse_p, meta, softmax_scale, cu=None):
        max_q, max_k = self._max_seqlens(meta)
        cu_q, cu_kv = cu if cu is not None else (meta.cu_seqlens_q, meta.cu_seqlens_kv)
        return _aten_flash()[1](
            dout_p, q_p, k_p, v_p, out_p, lse_p, cu_q, cu_kv,
            max_q, max_k, 0.0, self._is_causal(meta),
            torch.zeros(2, dtype=torch.uint64, device=q_p.device),
            torch.empty(0, device=q_p.device), scale=softmax_scale,
            window_size_left=meta.window_size[0], window_size_right=meta.window_size[1])

    def _packed_bwd(self, dout_p, q_p, k_p, v_p, out_p, lse_p, dlse_p, meta, softmax_scale,
                    cu=None):
        """Flash backward on packed buffers (or, with ``cu``, on whole tensors addressed by
        those cu_seqlens), plus the LSE cotangent's term."""
        # flash convention for rows without keys: +inf, so that exp(S - lse) = 0
        lse_p = torch.where(lse_p == NEG_INF, torch.full_like(lse_p, float("inf")), lse_p)
        dq_p, dk_p, dv_p = self._flash_bwd(dout_p, q_p, k_p, v_p, out_p, lse_p, meta,
                                           softmax_scale, cu)
        if dlse_p is not None:
            # The LSE cotangent adds dS = dlse * P. The flash backward computes
            # dS = P * (dO V^T - rowdot(dO, O)): with V = 0, dO = e_0 and O = -dlse * e_0 that
            # is exactly dlse * P (dV of this call is discarded). dlse is rounded to q.dtype.
            e0 = torch.zeros_like(q_p)
            e0[..., 0] = 1
            o_l = torch.zeros_like(q_p)
            o_l[..., 0] = -dlse_p.t().to(q_p.dtype)
            dq_l, dk_l, _ = self._flash_bwd(e0, q_p, k_p, torch.zeros_like(k_p), o_l, lse_p,
                                            meta, softmax_scale, cu)
            dq_p = dq_p + dq_l
            dk_p = dk_p + dk_l
        return dq_p, dk_p, dv_p

    def packed_lse(self, q, k, meta, softmax_scale):
        """Raw float32 LSE ``[h_q, rows]`` of the step on packed buffers: sub-sequence ``i`` at
        rows ``[cu_seqlens_q[i], cu_seqlens_q[i+1])``; other rows, and rows with no key
        (``+inf`` or ``-inf`` by build), are the caller's to mask. The sharpened max_logit
        pass (:mod:`~rocm_attn.varlen.max_logit`) reads only this. The kernels have no
        LSE-only mode and need V of q's head dim, but the LSE does not depend on V: K serves
        as V (no V copy), the output is discarded."""
        if meta.packed_kv_rows is not None:
            mq, mkv = packed.step_rows(meta, q.shape[0], k.shape[0])
            q_p, k_p = packed.gather_packed(q, mq), packed.gather_packed(k, mkv)
        else:
            q_p = _pack(q, meta.cu_seqlens_q, meta.cu_seqlens_q_padded)
            k_p = _pack(k, meta.cu_seqlens_kv, meta.cu_seqlens_kv_padded)
        k_p = k_p.contiguous()
        return self._flash_call(q_p.contiguous(), k_p, k_p, meta, softmax_scale)[1]

    def forward_packed(self, q_p, k_p, v_p, meta, softmax_scale):
        return self._flash_fwd(q_p.contiguous(), k_p.contiguous(), v_p.contiguous(), meta,
                               softmax_scale)

    def backward_packed(self, dout_p, q_p, k_p, v_p, out_p, lse_p, dlse_p, meta, softmax_scale):
        dt = q_p.dtype
        return self._packed_bwd(
            dout_p.to(dt).contiguous(), q_p.contiguous(), k_p.contiguous(), v_p.contiguous(),
            out_p.to(dt).contiguous(), lse_p.float(),
            None if dlse_p is None else dlse_p.float(), meta, softmax_scale)

    def backward(self, dout, q, k, v, out, lse, dlse, meta, softmax_scale):
        if meta.packed_kv_rows is not None:
            return self._general_backward(dout, q, k, v, out, lse, dlse, meta, softmax_scale)
        cq, cqp = meta.cu_seqlens_q, meta.cu_seqlens_q_padded
        ckv, ckvp = meta.cu_seqlens_kv, meta.cu_seqlens_kv_padded
        lse_p = _pack(lse.float(), cq, cqp, dim=-1)
        dlse_p = None if dlse is None else _pack(dlse.float(), cq, cqp, dim=-1)
        dq_p, dk_p, dv_p = self._packed_bwd(
            _pack(dout.to(q.dtype), cq, cqp), _pack(q, cq, cqp), _pack(k, ckv, ckvp),
            _pack(v, ckv, ckvp), _pack(out.to(q.dtype), cq, cqp), lse_p, dlse_p, meta,
            softmax_scale)
        return (_unpack(dq_p, cq, cqp, 0.0), _unpack(dk_p, ckv, ckvp, 0.0),
                _unpack(dv_p, ckv, ckvp, 0.0))


def _aten_flash():
    """``(forward, backward)`` flash ops; tests substitute a CPU emulator of the aten wrapper
    (tests/helpers/flash_emulator.py) to run this backend's packing and window logic without a
    GPU."""
    return torch.ops.aten._flash_attention_forward, torch.ops.aten._flash_attention_backward


def aten_flash_ops():
    """``(forward, backward)``: torch's flash varlen ops for other families of the package (the
    small-seq flash route), through :func:`_aten_flash`, the slot tests substitute."""
    return _aten_flash()


def flash_problem(q: torch.Tensor) -> Optional[str]:
    """Why torch's flash varlen kernels cannot serve inputs like ``q`` (None: they can), for
    other families of the package; see :func:`_flash_problem`."""
    return _flash_problem(q)


def _input_problem(q: torch.Tensor) -> Optional[str]:
    """Why torch_flash cannot serve inputs like ``q`` on any torch (None: it can)."""
    if not q.is_cuda:
        return f"tensors on {q.device} (torch_flash needs a CUDA or ROCm GPU)"
    if q.dtype not in (torch.float16, torch.bfloat16):
        return f"dtype {q.dtype} (torch_flash: float16, bfloat16)"
    d = q.shape[-1]
    if d > 256 or d % 8:
        return f"head dim {d} (torch_flash: a multiple of 8, at most 256)"
    return None


def _flash_problem(q: torch.Tensor) -> Optional[str]:
    """Why torch_flash cannot serve these inputs (None: it can): the inputs, then whether this
    torch's flash attention does what the backend needs (:func:`flash_support_problem`)."""
    return _input_problem(q) or flash_support_problem(q.device, q.dtype)


# What the backend passes to aten._flash_attention_forward / _backward beyond the basic varlen
# arguments; torch builds whose schema lacks one of them cannot serve any step.
_NEEDED_ARGS = {"forward": ("cum_seq_q", "cum_seq_k", "scale", "window_size_left",
                            "window_size_right"),
                "backward": ("cum_seq_q", "cum_seq_k", "scale", "window_size_left",
                             "window_size_right")}
_SUPPORT: dict = {}  # (device, dtype) -> None or the reason torch_flash is unusable there


def _schema_problem() -> Optional[str]:
    ops = torch.ops.aten
    for kind, name in (("forward", "_flash_attention_forward"),
                       ("backward", "_flash_attention_backward")):
        if not hasattr(ops, name):
            return f"torch {torch.__version__} has no aten.{name}"
        have = {a.name for a in getattr(ops, name).default._schema.arguments}
        missing = [a for a in _NEEDED_ARGS[kind] if a not in have]
        if missing:
            return (f"torch {torch.__version__}'s aten.{name} has no {', '.join(missing)} "
                    "argument(s)")
    return None


def _probe(device: torch.device, dtype: torch.dtype) -> Optional[str]:
    """Run the backend's own forward and backward calls once on a tiny step that needs
    everything it relies on (varlen with two sub-sequences of different lengths, a sliding
    window with causal masking, GQA 4:2, head dim 64) and compare them with the float64
    reference. Returns why torch_flash is unusable here, None when it works."""
    import types

    why = _schema_problem()
    if why:
        return why
    gen = torch.Generator(device="cpu").manual_seed(0)
    lens = (3, 6)
    cu = torch.tensor([0, lens[0], sum(lens)], dtype=torch.int32, device=device)
    t, h_q, h_kv, d = sum(lens), 4, 2, 64
    q, k, v, dout = (torch.randn(t, h, d, generator=gen).to(device=device, dtype=dtype)
                     for h in (h_q, h_kv, h_kv, h_q))
    meta = types.SimpleNamespace(cu_seqlens_q=cu, cu_seqlens_kv=cu, max_seqlen_q=max(lens),
                                 max_seqlen_kv=max(lens), attn_mask_type="causal",
                                 window_size=(2, 0))
    scale = d ** -0.5
    flash = TorchFlashBackend()
    try:
        out, lse = flash._flash_fwd(q, k, v, meta, scale)
        dq, dk, dv = flash._packed_bwd(dout, q, k, v, out, lse, None, meta, scale)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
    except Exception as exc:  # noqa: BLE001  (any failure means: do not use it)
        first = (str(exc).strip().splitlines() or [""])[0][:200]
        return (f"torch {torch.__version__}'s flash attention failed on a varlen + window + "
                f"GQA step ({type(exc).__name__}: {first})")
    # the float64 reference's gradients need autograd also when the call that probes runs under
    # torch.inference_mode (its tensors would record no graph, and the probe would raise)
    with torch.inference_mode(False), torch.enable_grad():
        ref = [x.detach().to(torch.float64, copy=True).requires_grad_(True) for x in (q, k, v)]
        r_out, _ = reference_attention(*ref, cu, cu, attn_mask_type="causal_bottom_right",
                                       window_size=(2, 0), softmax_scale=scale,
                                       compute_dtype=torch.float64)
        grads = torch.autograd.grad(r_out, ref, dout.to(torch.float64, copy=True))
    for name, got, want in zip(("out", "dq", "dk", "dv"), (out, dq, dk, dv), (r_out, *grads)):
        got = got.double()
        err = (got - want.detach()).abs().max().item() / max(want.abs().max().item(), 1e-6)
        if not err < 0.05:  # bf16 rounding is ~1e-2; a dropped window or head map is ~1
            return (f"torch {torch.__version__}'s flash attention gives wrong {name} on a varlen "
                    f"+ window + GQA step (relative error {err:.2g})")
    return None


def flash_support_problem(device: torch.device, dtype: torch.dtype) -> Optional[str]:
    """Why this torch's flash attention cannot serve torch_flash steps on ``device`` in
    ``dtype`` (None: it can), checked once per device and dtype before any step runs.

    Older builds (ROCm ones in particular) lack varlen flash, the window arguments or GQA, or
    accept them and compute something else; :func:`_probe` finds out on a tiny step. Under
    torch.compile or CUDA graph capture nothing is probed (no launches or syncs may happen
    there): the answer of an earlier eager call is used, else torch_flash is assumed to work.
    """
    key = (str(device), dtype)
    if key in _SUPPORT:
        return _SUPPORT[key]
    if torch.compiler.is_compiling() or (
            device.type == "cuda" and torch.cuda.is_current_stream_capturing()):
        return None
    why = _SUPPORT[key] = _probe(device, dtype)
    if why:
        _log.warning("attn_with_cp / attention: torch_flash is unusable on %s for %s, the "
                     "reference backend serves those calls: %s", device, dtype, why)
    return why


def resolve_backend(backend: str, q: torch.Tensor) -> StepBackend:
    """Backend object for ``backend`` (one of :data:`BACKENDS`) and these inputs.

    Raises
    ------
    ValueError
        Unknown name, or ``"torch_flash"`` asked for inputs it cannot serve.
    """
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}")
    if backend == "reference":
        return ReferenceBackend()
    why = _flash_problem(q)
    if backend == "torch_flash":
        if why:
            raise ValueError(f"backend='torch_flash' cannot serve this call: {why}")
        return TorchFlashBackend()
    if why:
        log_choice(_log, ("cp", "reference", why), "attn_with_cp: backend auto -> reference (%s)",
                   why)
        return ReferenceBackend()
    log_choice(_log, ("cp", "torch_flash"), "attn_with_cp: backend auto -> torch_flash")
    return TorchFlashBackend()
