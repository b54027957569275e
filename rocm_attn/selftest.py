"""Self-test: run each op on small random inputs against a float64 reference on whatever device
is present, and print what ran where.

Ops: fused_attn_small_seq (forward and gradients), nn.TargetAttention, the THD helpers (layout
round trip, merge of partial attention results), attn_with_cp (every comm type, one rank).
Inputs are fresh on every run; a failing line prints its seed.
"""

from __future__ import annotations

import copy
import time
from dataclasses import dataclass
from typing import Callable, Dict, List, Optional

import torch

from . import _ext, build_info, thd
from .nn import TargetAttention
from .reference import reference_attention, reference_small_seq
from .small_seq import fused_attn_small_seq


@dataclass
class Check:
    op: str
    backend: str
    detail: str  # dtype, shape: what distinguishes this line
    errors: Dict[str, float]  # relative errors vs float64, by output
    tol: float
    seed: int
    skipped: Optional[str] = None  # why it did not run

    @property
    def passed(self) -> bool:
        if self.skipped is not None:
            return True
        return all(e == e and e <= self.tol for e in self.errors.values())  # e == e: not NaN


def _rel_err(x: torch.Tensor, ref: torch.Tensor) -> float:
    x, ref = x.double().cpu(), ref.double().cpu()  # results may live on the GPU, references not
    return ((x - ref).norm() / ref.norm().clamp_min(1e-30)).item()


def _tol(dtype: torch.dtype) -> float:
    # fp32: far under 1e-3 but input-dependent (cancellation in a segment); 1e-4 still catches
    # any indexing or masking error, which lands near 1. 16-bit: a few ulps of bf16.
    return 1e-4 if dtype == torch.float32 else 2e-2


def _fresh_seed() -> int:
    return int(time.time_ns() % 2**31)


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).replace("torch.", "")


def _randn(gen: torch.Generator, *shape) -> torch.Tensor:
    return torch.randn(*shape, generator=gen)


# ---------------------------------------------------------------------------- small-seq op


def _small_seq(device, dtype, d: int, kernel: bool) -> Check:
    seed, batch, h_q, h_kv, max_kv = _fresh_seed(), 257, 4, 2, 16
    gen = torch.Generator().manual_seed(seed)
    lens = torch.randint(0, max_kv + 1, (batch,), generator=gen, dtype=torch.int32)
    cu_kv = torch.zeros(batch + 1, dtype=torch.int32)
    cu_kv[1:] = torch.cumsum(lens, 0)
    total = int(cu_kv[-1])
    q, k, v = (_randn(gen, n, h, d).to(device, dtype).requires_grad_()
               for n, h in ((batch, h_q), (total, h_kv), (total, h_kv)))
    cu_q = torch.arange(batch + 1, dtype=torch.int32).to(device)
    cu_kv = cu_kv.to(device)
    backend = "kernel" if kernel else "torch"
    out = fused_attn_small_seq(q, k, v, cu_q, cu_kv, 1, max_kv, backend=backend, validate="sync")
    dout = torch.randn_like(out)
    grads = torch.autograd.grad(out, (q, k, v), dout)
    # reference on the padded layout, float64
    rows = (cu_kv[:-1].long().unsqueeze(1) + torch.arange(max_kv, device=device)).clamp(
        max=max(total - 1, 0))
    qr, kr, vr = (t.detach().double().requires_grad_() for t in (q, k, v))
    ref, _, _ = reference_small_seq(qr, kr[rows], vr[rows], lens.to(device))
    ref_grads = torch.autograd.grad(ref, (qr, kr, vr), dout.double())
    errors = {"out": _rel_err(out, ref)}
    errors.update({n: _rel_err(g, r) for n, g, r in zip(("dq", "dk", "dv"), grads, ref_grads)})
    return Check("fused_attn_small_seq", backend, f"{_dtype_name(dtype)} d={d}", errors,
                 _tol(dtype), seed)


def _target_attention(device, dtype, kernel: bool) -> Check:
    seed, b, s, e = _fresh_seed(), 193, 16, 256
    gen = torch.Generator().manual_seed(seed)
    torch.manual_seed(seed)
    backend = "kernel" if kernel else "torch"
    layer = TargetAttention(e, num_heads=4, num_kv_heads=2, head_dim=64, backend=backend,
                            device=device, dtype=dtype)
    candidate = _randn(gen, b, e).to(device, dtype)
    history = _randn(gen, b, s, e).to(device, dtype)
    seqlens = torch.randint(1, s + 1, (b,), generator=gen, dtype=torch.int32).to(device)
    with torch.no_grad():
        out = layer(candidate, history, seqlens=seqlens)
        ref_layer = copy.deepcopy(layer).double()
        ref_layer.backend = "torch"
        ref = ref_layer(candidate.double(), history.double(), seqlens=seqlens)
    return Check("nn.TargetAttention", backend, f"{_dtype_name(dtype)} e={e} h=4/2",
                 {"out": _rel_err(out, ref)}, _tol(dtype), seed)


# ---------------------------------------------------------------------------- THD helpers


def _thd_layouts(device, dtype) -> Check:
    """pad_for_cp, partition on every rank, reorder back: the identity, exactly."""
    seed, cp = _fresh_seed(), 2
    gen = torch.Generator().manual_seed(seed)
    lens = torch.randint(1, 40, (7,), generator=gen)
    cu = torch.nn.functional.pad(lens.cumsum(0), (1, 0)).to(torch.int32).to(device)
    x = _randn(gen, int(lens.sum()), 3, 16).to(device, dtype)
    padded, cu_padded = thd.pad_for_cp(x, cu, cp)
    shards = [thd.partition(padded, cu_padded, cp, r) for r in range(cp)]
    back = thd.reorder_to_contiguous(torch.cat(shards), cu_padded, cp)
    resharded = thd.reorder_to_rank_sharded(back, cu_padded, cp)
    errors = {"reorder(partition)": _rel_err(back, padded),
              "reorder_to_rank_sharded": _rel_err(resharded, torch.cat(shards))}
    return Check("thd layouts", _thd_backend(device), f"{_dtype_name(dtype)} cp={cp}", errors,
                 0.0, seed)


def _partial_attention(q, k, v):
    """Dense attention of every query row over one key set: out [t, h, d], lse [h, t]."""
    scores = torch.einsum("thd,nhd->htn", q.double(), k.double()) / q.shape[-1] ** 0.5
    lse = torch.logsumexp(scores, dim=-1)
    out = torch.einsum("htn,nhd->thd", torch.softmax(scores, dim=-1), v.double())
    return out, lse


def _thd_merge(device, dtype) -> Check:
    """Merging attention over two key sets equals attention over their union."""
    seed, t, h, d = _fresh_seed(), 301, 4, 64
    gen = torch.Generator().manual_seed(seed)
    q = _randn(gen, t, h, d)
    k, v = _randn(gen, 24, h, d), _randn(gen, 24, h, d)
    out_a, lse_a = _partial_attention(q, k[:10], v[:10])
    out_b, lse_b = _partial_attention(q, k[10:], v[10:])
    full, full_lse = _partial_attention(q, k, v)

    def dev(o):
        return o.to(device, dtype)

    out, lse = thd.merge_partial(dev(out_a), lse_a.float().to(device), dev(out_b),
                                 lse_b.float().to(device))
    return Check("thd.merge_partial", _thd_backend(device), f"{_dtype_name(dtype)} d={d}",
                 {"out": _rel_err(out, full), "lse": _rel_err(lse, full_lse)}, _tol(dtype), seed)


def _thd_backend(device) -> str:
    return "kernel" if device.type == "cuda" and thd.HAS_KERNELS else "torch"


# ---------------------------------------------------------------------------- attn_with_cp


def _one_rank_group(device):
    """A process group of this process alone (CP of size 1), or None if one exists already."""
    import torch.distributed as dist

    if not dist.is_available() or dist.is_initialized():
        return None
    backend = "nccl" if device.type == "cuda" else "gloo"
    dist.init_process_group(backend, store=dist.HashStore(), rank=0, world_size=1)
    return dist.group.WORLD


def _attn_with_cp(device, dtype, group, comm: str) -> Check:
    from .cp import attn_with_cp

    seed, h_q, h_kv, d = _fresh_seed(), 4, 2, 64
    gen = torch.Generator().manual_seed(seed)
    lens = 2 * torch.randint(1, 9, (3,), generator=gen)  # multiples of 2*cp
    cu = torch.nn.functional.pad(lens.cumsum(0), (1, 0)).to(torch.int32).to(device)
    total, max_len = int(lens.sum()), int(lens.max())
    q, k, v = (_randn(gen, total, h, d).to(device, dtype).requires_grad_()
               for h in (h_q, h_kv, h_kv))
    out = attn_with_cp(q, k, v, cu, cu, max_len, max_len, group, cp_comm_type=comm,
                       attn_mask_type="causal", cu_seqlens_q_padded=cu,
                       cu_seqlens_kv_padded=cu)
    dout = torch.randn_like(out)
    grads = torch.autograd.grad(out, (q, k, v), dout)
    qr, kr, vr = (t.detach().double().requires_grad_() for t in (q, k, v))
    ref, _ = reference_attention(qr, kr, vr, cu, cu, "causal")
    ref_grads = torch.autograd.grad(ref, (qr, kr, vr), dout.double())
    errors = {"out": _rel_err(out, ref)}
    errors.update({n: _rel_err(g, r) for n, g, r in zip(("dq", "dk", "dv"), grads, ref_grads)})
    return Check("attn_with_cp", f"{comm}, cp=1", f"{_dtype_name(dtype)} causal d={d}", errors,
                 _tol(dtype), seed)


def _cp_checks(device, dtype) -> List[Check]:
    import torch.distributed as dist

    try:
        group = _one_rank_group(device)
    except Exception as exc:  # no usable process-group backend here: report, do not fail
        return [Check("attn_with_cp", "-", "", {}, 0.0, 0,
                      skipped=f"no 1-rank process group ({type(exc).__name__}: {exc})")]
    if group is None:
        return [Check("attn_with_cp", "-", "", {}, 0.0, 0,
                      skipped="torch.distributed is already initialised (or unavailable)")]
    try:
        return [_attn_with_cp(device, dtype, group, comm) for comm in ("p2p", "all_gather", "a2a")]
    finally:
        dist.destroy_process_group()


# ---------------------------------------------------------------------------- driver


def _plan(device: torch.device) -> List[Callable[[], List[Check]]]:
    """The checks for this device: kernels and 16-bit dtypes on a GPU, fp32 + bf16 on a CPU."""
    gpu = device.type == "cuda"
    kernel = _ext.kernels_usable(torch.empty(0, device=device))
    dtypes = (torch.bfloat16, torch.float16) if gpu else (torch.float32, torch.bfloat16)
    plan: List[Callable[[], List[Check]]] = []
    for dtype in dtypes:
        for d in (64, 128):
            plan.append(lambda dtype=dtype, d=d: [_small_seq(device, dtype, d, kernel)])
    plan.append(lambda: [_target_attention(device, dtypes[0], kernel)])
    plan.append(lambda: [_thd_layouts(device, dtypes[0])])
    plan.append(lambda: [_thd_merge(device, dtypes[0])])
    plan.append(lambda: _cp_checks(device, dtypes[0]))
    return plan


def _line(c: Check, device: torch.device) -> str:
    if c.skipped:
        return f"  SKIP  {c.op:22s} {c.skipped}"
    detail = " ".join(f"{k}={v:.1e}" for k, v in c.errors.items())
    return (f"  {'PASS' if c.passed else 'FAIL'}  {c.op:22s} {c.backend:16s} on {device.type:4s} "
            f"{c.detail:22s} rel.err vs reference: {detail}"
            + ("" if c.passed else f"  (tolerance {c.tol:.0e}, seed {c.seed})"))


def run(verbose: bool = True) -> bool:
    """Run the self-test; returns True when every check passed."""
    info = build_info()
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if verbose:
        print(f"rocm_attn {info['version']}  torch {info['torch']}  "
              f"build backend: {info['backend']}  extension loaded: {info['extension_loaded']}  device: {info['gpu'] or 'cpu'}")
    ok = True
    for make in _plan(device):
        for check in make():
            ok &= check.passed
            if verbose:
                print(_line(check, device), flush=True)
    if verbose:
        print("selftest", "passed" if ok else "FAILED")
    return ok
