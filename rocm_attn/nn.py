"""Modules built on the ops: drop-in pieces for recommendation models."""

from __future__ import annotations

import logging
import warnings
from typing import List, Optional, Tuple

import torch
from torch import nn

from ._checks import is_int
from . import _ext, errors
from .jagged import target_attention_inputs
from .small_seq import KERNEL_DTYPES, KERNEL_HEAD_DIMS, fused_attn_small_seq

log = logging.getLogger("rocm_attn")

OFFSET_DTYPES = (torch.int32, torch.int64)


def _nested_caches_max_seqlen() -> bool:
    """Whether jagged nested tensors cache their longest component (torch 2.5 and later; 2.4's
    have no such attribute, and its dynamo cannot trace a hasattr on a tensor)."""
    try:
        from torch.nested._internal.nested_tensor import NestedTensor
    except ImportError:
        return False
    return hasattr(NestedTensor, "_maybe_max_seqlen")


_NESTED_MAX_SEQLEN = _nested_caches_max_seqlen()

# Reasons an export has already been warned about (warn once per reason and process).
_export_warned: set = set()


class TargetAttention(nn.Module):
    """Target attention: candidate items attend to their user's behaviour history.

    Two call forms (see :meth:`forward`):

    * **one candidate per user** (a batch of (user, candidate) pairs): ``candidate [b, e]``,
      history of ``b`` users;
    * **a ranking request** (many candidates per user): ``candidate [n_cand, e]`` with
      ``candidate_offsets [users+1]``; every candidate of user ``u`` (rows
      ``candidate_offsets[u] .. candidate_offsets[u+1]-1``) attends to user ``u``'s history,
      which is given once per user and projected once per user (not once per candidate).

    Histories come padded (``[users, s, e_kv]`` plus ``seqlens [users]``), packed
    (``[total, e_kv]`` plus ``cu_seqlens [users+1]``, or plus lengths only, ``lengths
    [users]``), as a ``torch.nested`` jagged tensor (``layout=torch.jagged``, ``[users, j,
    e_kv]``) or as a torchrec ``JaggedTensor`` (values with offsets or lengths); values and
    offsets are used without a copy. Offsets and lengths are int32 or int64 (FBGEMM's int64
    offsets as they are). The attention is one
    :func:`rocm_attn.fused_attn_small_seq` call (GPU kernels where present, torch path
    elsewhere).

    Parameters
    ----------
    embed_dim : width of the candidate embedding (and of the output).
    num_heads : query heads.
    head_dim : per-head width (default ``embed_dim // num_heads``).
    num_kv_heads : key/value heads for GQA/MQA (default ``num_heads``).
    kv_embed_dim : width of the history embeddings (default ``embed_dim``).
    bias : bias in the projections.
    max_seqlen_kv : default host bound (an int >= 1) on every user's history length, or None
        (the default) to take it from each call (see :meth:`forward`, "Bounds"). The op uses
        it to pick a path and size its work. A history longer than the bound is a contract
        violation, not truncated: its candidates' outputs are NaN and the error is counted
        (``rocm_attn.check_errors()`` raises naming the bound; env ``ROCM_ATTN_VALIDATE=1``
        raises at the call, for every history form). Truncate upstream (torchrec and FBGEMM
        pipelines cap sequence features in the input pipeline); a padded history is truncated
        for free with ``history[:, :n], seqlens.clamp(max=n)``.
    max_candidates : default host bound on the candidates of one user in a request, or None
        (the default) to take it from each call.
    backend : ``"auto"``, ``"kernel"`` or ``"torch"`` (see ``fused_attn_small_seq``).

    The key and value projections are one fused linear layer; k and v are strided views of
    its output, which the op reads without a copy.
    """

    def __init__(self, embed_dim: int, num_heads: int, head_dim: Optional[int] = None,
                 num_kv_heads: Optional[int] = None, kv_embed_dim: Optional[int] = None,
                 bias: bool = True, max_seqlen_kv: Optional[int] = None, backend: str = "auto",
                 device=None, dtype=None, *, max_candidates: Optional[int] = None) -> None:
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
        for name, value in (("max_seqlen_kv", max_seqlen_kv), ("max_candidates", max_candidates)):
            if value is not None:
                _check_size(name, value)
        if backend not in ("auto", "kernel", "torch"):
            raise ValueError(f"backend must be 'auto', 'kernel' or 'torch', got {backend!r}")
        factory = {"device": device, "dtype": dtype}
        self.num_heads, self.num_kv_heads, self.head_dim = num_heads, num_kv_heads, head_dim
        self.embed_dim, self.kv_embed_dim = embed_dim, kv_embed_dim or embed_dim
        self.max_seqlen_kv, self.max_candidates, self.backend = (max_seqlen_kv, max_candidates,
                                                                 backend)
        self.q_proj = nn.Linear(embed_dim, num_heads * head_dim, bias=bias, **factory)
        self.kv_proj = nn.Linear(self.kv_embed_dim, 2 * num_kv_heads * head_dim,
                                 bias=bias, **factory)
        self.out_proj = nn.Linear(num_heads * head_dim, embed_dim, bias=bias, **factory)

    def forward(self, candidate: torch.Tensor, history: torch.Tensor, *,
                seqlens: Optional[torch.Tensor] = None,
                cu_seqlens: Optional[torch.Tensor] = None,
                candidate_offsets: Optional[torch.Tensor] = None,
                max_seqlen_kv: Optional[int] = None,
                max_candidates: Optional[int] = None,
                lengths: Optional[torch.Tensor] = None) -> torch.Tensor:
        """Attend each candidate to its user's history; returns ``[rows of candidate, embed_dim]``.

        History (one of):

        * padded: ``history [users, s, e_kv]`` with ``seqlens [users]``;
        * packed: ``history [total, e_kv]`` with ``cu_seqlens [users+1]``;
        * nested: ``history`` a ``torch.nested`` tensor with ``layout=torch.jagged``,
          ``[users, j, e_kv]`` (neither seqlens nor cu_seqlens).

        Candidates:

        * ``candidate_offsets=None``: ``candidate [b, e]``, one candidate per user
          (``users == b``);
        * ``candidate_offsets [users+1]``: ``candidate [n_cand, e]``, the candidates of a
          request, user ``u``'s being rows ``candidate_offsets[u] .. candidate_offsets[u+1]-1``
          (zero candidates allowed). Every candidate row belongs to a user:
          ``candidate_offsets[0] == 0`` and ``candidate_offsets[users] == n_cand``; rows outside
          every user are a broken contract (see below).

        Offsets and lengths are int32 or int64, 1-D and contiguous, on the module's device.

        Bounds: ``max_seqlen_kv`` (every user's history length) and ``max_candidates`` (every
        user's candidates in a request) are host ints that size the op's work. Each comes from
        this call's argument, else the constructor's, else the data:

        * a padded history's bound is its width ``s`` (a shape: no read);
        * otherwise eager calls read the offsets once on the host (one device sync on a GPU,
          logged at DEBUG) and take the largest length, so a bound never gives NaN by default;
        * torch.compile, torch.export, ONNX export and CUDA-graph capture cannot read values:
          there a missing bound raises ValueError; pass it to the constructor or to forward;
        * meta and fake tensors take the bound their shapes allow (history rows, candidate
          rows): nothing is read.

        A user past a bound it was given, or (request) a candidate row outside every user (the
        rows before ``candidate_offsets[0]`` and from ``candidate_offsets[users]`` on, counted
        as a broken contract of the first and the last user), gets NaN and is counted
        (``rocm_attn.check_errors()``; env ``ROCM_ATTN_VALIDATE=1`` raises at the call). When
        the bounds come from the data, the offsets are on the host anyway, and rows outside
        every user raise ValueError at the call.

        Jagged inputs (rocm_attn/jagged.py; torchrec is never imported): ``history`` a torchrec
        ``JaggedTensor`` (values ``[total, e_kv]`` with offsets or lengths); packed rows
        ``[total, e_kv]`` with ``lengths [users]`` instead of cu_seqlens; ``candidate`` a
        ``JaggedTensor`` of a request's candidates (its offsets are ``candidate_offsets``).
        """
        candidate, history, seqlens, cu_seqlens, candidate_offsets = target_attention_inputs(
            candidate, history, seqlens, cu_seqlens, lengths, candidate_offsets)
        nested = isinstance(history, torch.Tensor) and history.is_nested
        if nested:
            if seqlens is not None or cu_seqlens is not None:
                raise ValueError("a nested history carries its own offsets: pass neither seqlens "
                                 "nor cu_seqlens with it")
        elif (seqlens is None) == (cu_seqlens is None):
            raise ValueError("pass exactly one of seqlens (padded history) or cu_seqlens "
                             "(packed history), or a nested (layout=torch.jagged) history")
        if candidate_offsets is None and max_candidates is not None:
            raise ValueError("max_candidates bounds the candidates per user of a request: pass "
                             "it with candidate_offsets")
        users = self._check_inputs(candidate, history, seqlens, cu_seqlens, candidate_offsets,
                                   nested)
        for name, value in (("max_seqlen_kv", max_seqlen_kv), ("max_candidates", max_candidates)):
            if value is not None:
                _check_size(name, value)
        _warn_if_exporting_without_kernels(self, candidate)
        max_kv_cached = history._maybe_max_seqlen if nested and _NESTED_MAX_SEQLEN else None
        if nested:
            history, cu_seqlens = _nested_parts(history)
        max_seqlen_kv, max_candidates = self._bounds(
            candidate, history, seqlens, cu_seqlens, candidate_offsets, users,
            max_seqlen_kv, max_candidates, max_kv_cached)
        # NOTE: the module flags padded users past the bound and candidate rows outside every
        # user after the op has run; under validate it raises for them at the call too
        validating = candidate_offsets is not None and errors.validate_mode(None)
        if validating:
            errors.set_aside_errors()
        if candidate_offsets is None:
            return self._one_candidate_per_user(candidate, history, seqlens, cu_seqlens,
                                                max_seqlen_kv)
        out = self._request(candidate, history, seqlens, cu_seqlens, candidate_offsets,
                            max_seqlen_kv, max_candidates, users)
        if validating:
            errors.check_call_errors()
        return out

    def _bounds(self, candidate, history, seqlens, cu_seqlens, candidate_offsets, users: int,
                max_seqlen_kv, max_candidates, max_kv_cached) -> Tuple[int, Optional[int]]:
        """(max_seqlen_kv, max_candidates or None) of this call: the argument, else the
        constructor's value, else from the data (forward's docstring, "Bounds")."""
        if max_seqlen_kv is None:
            max_seqlen_kv = self.max_seqlen_kv
        if max_seqlen_kv is None and seqlens is not None and is_int(history.shape[1]):
            max_seqlen_kv = max(history.shape[1], 1)  # the padded width: no read
        if max_seqlen_kv is None and is_int(max_kv_cached):
            max_seqlen_kv = max(max_kv_cached, 1)  # a nested tensor's cached max: no read
        request = candidate_offsets is not None
        if request and max_candidates is None:
            max_candidates = self.max_candidates
        read: List[Tuple[str, torch.Tensor]] = []
        if max_seqlen_kv is None:
            read.append(("max_seqlen_kv", cu_seqlens))
        if request and (max_candidates is None or read):
            read.append(("max_candidates", candidate_offsets))
        if not read:
            return max_seqlen_kv, max_candidates
        names = [name for name, _ in read if name != "max_candidates" or max_candidates is None]
        if errors.holds_no_values(candidate) or errors.holds_no_values(history):
            # shape probing: the bounds every value could meet (history rows, candidate rows)
            if max_seqlen_kv is None:
                max_seqlen_kv = max(history.shape[0], 1)
            if request and max_candidates is None:
                max_candidates = max(candidate.shape[0], 1)
            return max_seqlen_kv, max_candidates
        if _tracing():
            raise ValueError(
                f"TargetAttention: {' and '.join(names)} must be given while torch.compile, "
                f"torch.export or ONNX export traces the module or a CUDA graph is captured (the "
                f"bound from the data takes a host read of the offsets): pass "
                f"{', '.join(n + '=' for n in names)} to the constructor or to forward")
        # one host read of every offset tensor needed (a single device sync on a GPU)
        values = torch.cat([t.reshape(-1).long() for _, t in read]).tolist()
        at = 0
        for name, t in read:
            offs = values[at:at + t.numel()]
            at += t.numel()
            longest = max((b - a for a, b in zip(offs, offs[1:])), default=0)
            if name == "max_seqlen_kv":
                max_seqlen_kv = max(longest, 1)
                continue
            n = candidate.shape[0]
            if offs[0] != 0 or offs[-1] != n:
                raise ValueError(
                    f"candidate_offsets must cover every candidate row: start at 0 and end at "
                    f"n_cand = {n}, got {offs[0]} .. {offs[-1]} (rows outside every user would "
                    f"have no history)")
            if max_candidates is None:
                max_candidates = max(longest, 1)
        log.debug("TargetAttention: %s from the data (one host read): max_seqlen_kv=%d, "
                  "max_candidates=%s; pass them to forward or the constructor to skip the read",
                  " and ".join(names), max_seqlen_kv, max_candidates)
        return max_seqlen_kv, max_candidates

    def _one_candidate_per_user(self, candidate, history, seqlens, cu_seqlens, max_seqlen_kv):
        """candidate [b, e]: one query per segment (the op's q = 1 form)."""
        b = candidate.shape[0]
        h, hk, d = self.num_heads, self.num_kv_heads, self.head_dim
        q = self.q_proj(candidate).view(b, h, d)
        kv = self.kv_proj(history)
        if seqlens is not None:
            kv = kv.view(b, history.shape[1], 2, hk, d)
            out = fused_attn_small_seq(
                q.unsqueeze(1), kv[:, :, 0], kv[:, :, 1], max_seqlen_kv=max_seqlen_kv,
                qkv_layout="bshd_bshd_bshd", seqlens_kv=seqlens, backend=self.backend)
        else:
            kv = kv.view(history.shape[0], 2, hk, d)
            cu_q = torch.arange(b + 1, dtype=cu_seqlens.dtype, device=candidate.device)
            out = fused_attn_small_seq(
                q, kv[:, 0], kv[:, 1], cu_q, cu_seqlens, max_seqlen_kv=max_seqlen_kv,
                backend=self.backend)
        return self.out_proj(out.reshape(b, h * d))

    def _request(self, candidate, history, seqlens, cu_seqlens, candidate_offsets,
                 max_seqlen_kv, max_candidates, users):
        """candidate [n_cand, e] with candidate_offsets: every candidate of a user is a query
        of that user's segment; the history is projected once per user."""
        n = candidate.shape[0]
        h, hk, d = self.num_heads, self.num_kv_heads, self.head_dim
        bad_users = None
        if seqlens is not None:
            history, cu_seqlens, bad_users = _padded_to_packed(history, seqlens, max_seqlen_kv)
        q = self.q_proj(candidate).view(n, h, d)
        kv = self.kv_proj(history).view(history.shape[0], 2, hk, d)
        # NOTE: a bound of at least 2: the op reads max_seqlen_q == 1 as its one-query form
        # (q holds exactly one row per segment), and a request's users may have 0 candidates.
        bound = max(max_candidates, 2)
        out = fused_attn_small_seq(
            q, kv[:, 0], kv[:, 1], candidate_offsets, cu_seqlens, max_seqlen_q=bound,
            max_seqlen_kv=max_seqlen_kv, backend=self.backend)
        out = _flag_users(out, bad_users, candidate_offsets, users)
        return self.out_proj(out.reshape(n, h * d))

    def _check_inputs(self, candidate, history, seqlens, cu_seqlens, candidate_offsets,
                      nested) -> int:
        """Shapes, dtypes and devices against the module (ValueError naming the argument);
        returns the number of users. Host metadata only: no tensor value is read, so this
        costs no device sync."""
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
        if candidate.is_nested:
            raise ValueError("candidate must be a dense [n_cand, embed_dim] tensor; give a "
                             "request's candidates as rows with candidate_offsets")
        if candidate.dim() != 2 or candidate.shape[1] != self.embed_dim:
            raise ValueError(f"candidate must be [b, embed_dim={self.embed_dim}], got "
                             f"{tuple(candidate.shape)}")
        request = candidate_offsets is not None
        if nested:
            if history.layout != torch.jagged:
                raise ValueError(f"a nested history must have layout=torch.jagged, got "
                                 f"{history.layout}")
            if (history.dim() != 3 or history._ragged_idx != 1
                    or history.shape[-1] != self.kv_embed_dim):
                raise ValueError(f"nested history must be [users, j, kv_embed_dim="
                                 f"{self.kv_embed_dim}] with the jagged dim 1, got "
                                 f"{tuple(history.shape)} (jagged dim {history._ragged_idx})")
            if history._lengths is not None:
                raise ValueError("nested history has holes (lengths() is set): call "
                                 "history.contiguous() first")
            users = history.shape[0]
        else:
            padded = seqlens is not None
            rank, doc = (3, "[users, s, kv_embed_dim]") if padded else (2, "[total, kv_embed_dim]")
            if history.dim() != rank or history.shape[-1] != self.kv_embed_dim:
                raise ValueError(f"{'padded' if padded else 'packed'} history must be {doc} with "
                                 f"kv_embed_dim={self.kv_embed_dim}, got {tuple(history.shape)}")
            if padded:
                users = history.shape[0]
                if not request and users != candidate.shape[0]:
                    raise ValueError(f"history batch {users} must equal candidate batch "
                                     f"{candidate.shape[0]} (one candidate per user), or pass "
                                     f"candidate_offsets [users+1] for a request")
                _check_offsets("seqlens", seqlens, users, weight.device, "users")
            else:
                if not isinstance(cu_seqlens, torch.Tensor) or cu_seqlens.dim() != 1:
                    _check_offsets("cu_seqlens", cu_seqlens, None, weight.device, "users + 1")
                users = cu_seqlens.shape[0] - 1
                _check_offsets("cu_seqlens", cu_seqlens, users + 1, weight.device, "users + 1")
        if request:
            _check_offsets("candidate_offsets", candidate_offsets, users + 1, weight.device,
                           "users + 1")
        elif users != candidate.shape[0]:
            what = "history batch" if nested or seqlens is not None else "cu_seqlens"
            raise ValueError(
                f"{what} has {users} users but candidate has {candidate.shape[0]} rows: one "
                f"candidate per user, or pass candidate_offsets [users+1] for a request of many "
                f"candidates per user")
        return users


def _nested_parts(history: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
    """A jagged nested history as (values [total, e_kv], offsets int64 [users+1]): views of
    its own storage, no copy."""
    return history.values(), history.offsets()


def _padded_to_packed(history: torch.Tensor, seqlens: torch.Tensor, bound: int):
    """A padded history ``[users, s, e]`` as packed rows, without a host sync.

    Keeps the first ``w = min(s, bound)`` columns (a length above ``w`` breaks the contract
    either way). Valid rows go to the front, user by user, at ``cu[u] + j``; padding rows
    fill the tail, so the result has the static shape ``[users * w, e]``. A user whose length
    is outside ``0..w`` gets zero rows here and is returned in ``bad`` (the caller flags it).
    Returns (packed ``[users * w, e]``, cu_seqlens int64 ``[users+1]``, bad bool ``[users]``).
    """
    users, s, e = history.shape
    w = min(s, bound)
    lens = seqlens.long()
    bad = (lens < 0) | (lens > w)
    lens = torch.where(bad, torch.zeros_like(lens), lens)
    cu = torch.nn.functional.pad(lens.cumsum(0), (1, 0))
    col = torch.arange(w, device=history.device).unsqueeze(0)
    start, lens2 = cu[:-1].unsqueeze(1), lens.unsqueeze(1)
    # padding rows before user u: u * w - cu[u]; they follow all cu[users] valid rows
    pad_start = cu[-1] + torch.arange(users, device=history.device).unsqueeze(1) * w - start
    dest = torch.where(col < lens2, start + col, pad_start + col - lens2).reshape(-1)
    # source row of each packed row: the inverse of the permutation dest
    src = torch.empty_like(dest).scatter_(0, dest, torch.arange(dest.numel(),
                                                                device=history.device))
    packed = history[:, :w].reshape(users * w, e).index_select(0, src)
    return packed, cu, bad


def _flag_users(out: torch.Tensor, bad_users: Optional[torch.Tensor],
                candidate_offsets: torch.Tensor, users: int) -> torch.Tensor:
    """NaN for the candidate rows of users in ``bad_users`` (None: none) and for the rows
    outside every user (before ``candidate_offsets[0]``, from ``candidate_offsets[users]`` on:
    counted as bad users 0 and ``users - 1``, whose offsets are wrong), and count them in the
    error state (as the op does for its own contract), without a host sync."""
    n = out.shape[0]
    offsets = candidate_offsets.long()
    rows = torch.arange(n, device=out.device)
    outside = (rows < offsets[0]) | (rows >= offsets[users])
    if users:
        # rows outside every user: the first user's start or the last user's end is wrong
        user = torch.arange(users, device=out.device)
        counted = (((user == 0) & (offsets[0] != 0))
                   | ((user == users - 1) & (offsets[users] != n)))
        if bad_users is not None:
            counted = counted | bad_users
    else:
        # no user at all: every candidate row is outside, one broken contract
        counted = outside.any().view(1)
    errors.record_torch_path_errors(counted)
    # NOTE: no early return for n == 0: under torch.export n may be a data-dependent size,
    # and every op below is empty-safe
    nan_rows = outside
    if users and bad_users is not None:
        # user of each candidate row: the number of users u >= 1 whose rows start at or before it
        starts = torch.zeros(n + 1, dtype=torch.long, device=out.device)
        starts = starts.scatter_add(0, offsets[1:users].clamp(0, n),
                                    torch.ones(users - 1, dtype=torch.long, device=out.device))
        row_user = starts.cumsum(0)[:n].clamp(max=users - 1)
        nan_rows = nan_rows | bad_users[row_user]
    nan_rows = nan_rows.view(n, *([1] * (out.dim() - 1)))
    return torch.where(nan_rows, out.new_full((), float("nan")), out)


def _tracing() -> bool:
    """Whether values cannot be read on the host now: torch.compile or torch.export tracing,
    the legacy ONNX exporter, or a CUDA graph being captured."""
    if torch.compiler.is_compiling() or errors.exporting():
        return True
    return torch.cuda.is_available() and torch.cuda.is_current_stream_capturing()


def _kernel_gaps(module: TargetAttention, candidate: torch.Tensor) -> Optional[str]:
    """Why an exported program of ``module`` cannot call the compiled kernels (None if it
    can): read from the build and the inputs' device, dtype and head dim only."""
    if module.backend == "torch":
        return None  # asked for the torch path: nothing to warn about
    if not _ext.HAS_EXTENSION:
        return f"this install has no compiled kernels ({_ext.extension_error()})"
    if candidate.device.type != "cuda":
        return f"the inputs are on {candidate.device} (the kernels run on CUDA and ROCm GPUs)"
    dtype = module.q_proj.weight.dtype
    if dtype not in KERNEL_DTYPES or module.head_dim not in KERNEL_HEAD_DIMS:
        return f"no kernel variant for {dtype}, head dim {module.head_dim}"
    return None


def _warn_if_exporting_without_kernels(module: TargetAttention, candidate) -> None:
    """While torch.export / ONNX export traces the module: warn (once per reason) when the
    exported program will run the torch path instead of the kernels."""
    if not errors.exporting():
        return
    why = _kernel_gaps(module, candidate)
    if why is None or why in _export_warned:
        return
    _export_warned.add(why)
    warnings.warn(
        f"rocm_attn TargetAttention is being exported without the compiled kernels: {why}. The "
        f"exported program runs the torch path (same results, slower). Export on a GPU machine "
        f"with the kernels built, with the model and inputs on the GPU, to export the kernels.",
        stacklevel=3)


def _check_offsets(name: str, t, numel: Optional[int], device: torch.device, what: str) -> None:
    """A 1-D int32/int64 contiguous tensor of ``numel`` entries on ``device``."""
    if (not isinstance(t, torch.Tensor) or t.is_nested or t.dtype not in OFFSET_DTYPES
            or t.dim() != 1 or (numel is not None and t.shape[0] != numel)):
        got = (f"{t.dtype} {tuple(t.shape)}" if isinstance(t, torch.Tensor) and not t.is_nested
               else type(t).__name__)
        count = f"{numel} entries ({what})" if numel is not None else f"{what} entries"
        raise ValueError(f"{name} must be a 1-D int32 or int64 tensor of {count}, got {got}")
    if t.device != device:
        raise ValueError(f"{name} is on {t.device}, the module on {device}")
    if not t.is_contiguous():
        raise ValueError(f"{name} must be contiguous (the op indexes it directly), got strides "
                         f"{t.stride()}")


def _check_size(name: str, value) -> None:
    if not is_int(value) or value < 1:
        raise ValueError(f"{name} must be a positive int, got {value!r}")
