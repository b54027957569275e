"""`rocm-attn demo`: recommendation-model inference through TargetAttention.

A ranking model scores candidate items against each user's recent behaviour history: the
candidate embedding attends to the history embeddings. The demo runs that layer under
``torch.inference_mode``, on the compiled kernels when this install has them for the device,
on the torch path otherwise (the CPU path), in two shapes:

* the batch: (user, candidate) pairs, one candidate per user, histories of 1..16 items
  (padded ``[b, 16, e]`` with lengths);
* a ranking request: many candidates per user (``candidate_offsets``), histories of 1..200
  items given once per user (packed rows with int64 offsets, as jagged tensors carry them) and
  projected once per user; every candidate of a user attends to that user's history.

For each it prints

* throughput: candidates scored per second (median time over ``iters`` runs);
* the check: the largest relative error over candidates, ``max_i |y_i - r_i| / |r_i|``, of
  the output against the same module with the same weights in float64 (attention computed by
  the float64 reference). The command exits nonzero when either is above the dtype's
  tolerance.

Sizes: on a GPU 30720 pairs and a request of 64 users x 512 candidates in bfloat16; on a CPU
2048 pairs and 8 users x 64 candidates in float32, so the demo finishes in seconds on two
cores.
"""

from __future__ import annotations

import copy
import statistics
import time
from dataclasses import dataclass
from typing import List, Optional, Tuple

import torch

from . import _ext, ops
from ._checks import is_int
from .nn import TargetAttention
from .small_seq import KERNEL_DTYPES, KERNEL_HEAD_DIMS, TILED_HEAD_DIMS

# Per-candidate relative error allowed against float64. The output goes through three
# linear layers and the attention in the working dtype: a few ulps of that dtype, with
# room for the worst of tens of thousands of rows.
TOLERANCE = {torch.float32: 1e-4, torch.float16: 1e-2, torch.bfloat16: 3e-2}


@dataclass
class DemoConfig:
    device: torch.device
    dtype: torch.dtype
    batch: int
    iters: int
    embed_dim: int = 256
    num_heads: int = 4
    num_kv_heads: int = 2
    head_dim: int = 64
    max_history: int = 16
    seed: int = 0
    backend: str = "auto"
    users: int = 8  # the request: users, candidates per user, longest history
    candidates: int = 64
    request_history: int = 200


@dataclass
class DemoResult:
    attention: str  # what served the attention, in words
    ms_per_batch: float
    items_per_s: float
    max_rel_err: float
    tolerance: float
    mean_history: float

    @property
    def passed(self) -> bool:
        return self.max_rel_err <= self.tolerance  # False for NaN too


@dataclass
class DemoRun:
    """The batch and the request."""
    batch: DemoResult
    request: DemoResult

    @property
    def passed(self) -> bool:
        return self.batch.passed and self.request.passed


def default_config(device: Optional[str] = None, batch: Optional[int] = None,
                   dtype: Optional[str] = None, iters: Optional[int] = None, seed: int = 0,
                   backend: str = "auto", users: Optional[int] = None,
                   candidates: Optional[int] = None) -> DemoConfig:
    """Production-sized batch and request in bf16 on a GPU; small fp32 ones on a CPU. None
    picks the default; 0 or a negative batch / iters / users / candidates is an error, not the
    default."""
    for name, value in (("batch", batch), ("iters", iters), ("users", users),
                        ("candidates", candidates)):
        if value is not None and (not is_int(value) or value < 1):
            raise ValueError(f"{name} must be a positive int or None, got {value!r}")
    if backend not in ("auto", "kernel", "torch"):
        raise ValueError(f"backend must be 'auto', 'kernel' or 'torch', got {backend!r}")
    try:
        dev = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    except RuntimeError as exc:
        raise ValueError(f"device: {exc}") from None
    gpu = dev.type == "cuda"
    return DemoConfig(
        device=dev,
        dtype=getattr(torch, dtype) if dtype else (torch.bfloat16 if gpu else torch.float32),
        batch=batch if batch is not None else (30720 if gpu else 2048),
        iters=iters if iters is not None else (20 if gpu else 5),
        seed=seed,
        backend=backend,
        users=users if users is not None else (64 if gpu else 8),
        candidates=candidates if candidates is not None else (512 if gpu else 64),
    )


def cannot_run(cfg: DemoConfig) -> Optional[str]:
    """Why this machine cannot run cfg, in one line (None when it can)."""
    if cfg.device.type not in ("cpu", "cuda"):
        return f"device {cfg.device} is not supported (cpu, cuda or cuda:N)"
    if cfg.device.type == "cuda":
        if not torch.cuda.is_available():
            return (f"device {cfg.device} asked for, but torch sees no GPU (torch "
                    f"{torch.__version__}); use --device cpu")
        count = torch.cuda.device_count()
        if cfg.device.index is not None and cfg.device.index >= count:
            return f"device {cfg.device} asked for, but torch sees {count} GPU(s)"
    if cfg.backend == "kernel":
        if cfg.device.type != "cuda":
            return ("--backend kernel needs a GPU: the compiled kernels run on CUDA and ROCm "
                    "GPUs (--backend auto or torch runs the CPU path)")
        if not _ext.HAS_EXTENSION:
            return f"--backend kernel: no compiled kernels: {_ext.extension_error()}"
        if cfg.dtype not in KERNEL_DTYPES or cfg.head_dim not in KERNEL_HEAD_DIMS:
            return (f"--backend kernel: no kernel variant for {cfg.dtype}, head dim "
                    f"{cfg.head_dim} (kernels: float16, bfloat16)")
        if not ops.HAS_TILED_OPS or cfg.head_dim not in TILED_HEAD_DIMS:
            return ("--backend kernel: the ranking request needs the tiled small-seq kernels, "
                    f"which this build lacks for head dim {cfg.head_dim} (--backend auto runs "
                    "it on the torch path)")
    return None


def make_batch(cfg: DemoConfig) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """candidate ``[b, e]``, padded history ``[b, max_history, e]``, seqlens int32 ``[b]``.

    Drawn on the CPU from the seed, then moved: the same batch on every device.
    """
    gen = torch.Generator().manual_seed(cfg.seed)
    b, s, e = cfg.batch, cfg.max_history, cfg.embed_dim
    seqlens = torch.randint(1, s + 1, (b,), generator=gen, dtype=torch.int32)
    candidate = torch.randn(b, e, generator=gen)
    history = torch.randn(b, s, e, generator=gen)
    history *= (torch.arange(s) < seqlens.unsqueeze(1)).unsqueeze(-1)  # padding rows are zero
    move = dict(device=cfg.device)
    return (candidate.to(dtype=cfg.dtype, **move), history.to(dtype=cfg.dtype, **move),
            seqlens.to(**move))


def make_request(cfg: DemoConfig):
    """A ranking request: candidate ``[users * candidates, e]``, candidate_offsets int64
    ``[users+1]``, packed history rows ``[total, e]`` with cu_seqlens int64 ``[users+1]``
    (lengths 1..request_history), drawn on the CPU from the seed, then moved."""
    gen = torch.Generator().manual_seed(cfg.seed + 1)
    u, n, e = cfg.users, cfg.candidates, cfg.embed_dim
    lengths = torch.randint(1, cfg.request_history + 1, (u,), generator=gen)
    candidate = torch.randn(u * n, e, generator=gen)
    history = torch.randn(int(lengths.sum()), e, generator=gen)
    offsets = torch.arange(u + 1) * n
    cu_seqlens = torch.nn.functional.pad(lengths.cumsum(0), (1, 0))
    move = dict(device=cfg.device)
    return (candidate.to(dtype=cfg.dtype, **move), history.to(dtype=cfg.dtype, **move),
            offsets.to(**move), cu_seqlens.to(**move), lengths)


def pick_backend(cfg: DemoConfig) -> Tuple[str, str]:
    """(backend argument for the module, description) for ``cfg.backend == "auto"``."""
    if cfg.backend != "auto":
        return cfg.backend, f"backend={cfg.backend!r} as asked"
    if cfg.device.type != "cuda":
        return "torch", "torch path (CPU; the compiled kernels run on GPUs)"
    if not _ext.HAS_EXTENSION:
        return "torch", f"torch path on the GPU: {_ext.extension_error()}"
    if cfg.dtype not in KERNEL_DTYPES or cfg.head_dim not in KERNEL_HEAD_DIMS:
        return "torch", f"torch path ({cfg.dtype}, head dim {cfg.head_dim}: no kernel variant)"
    return "kernel", "compiled kernels (fused_attn_small_seq)"


def pick_request_backend(cfg: DemoConfig) -> Tuple[str, str]:
    """(backend argument, description) for the request: many queries per segment and
    histories past 16 take the tiled kernels, which a build may lack."""
    backend, attention = pick_backend(cfg)
    if cfg.backend != "auto" or backend != "kernel":
        return backend, attention
    if not ops.HAS_TILED_OPS:
        return "torch", "torch path on the GPU: this build has no tiled small-seq kernels"
    if cfg.head_dim not in TILED_HEAD_DIMS:
        return "torch", f"torch path (head dim {cfg.head_dim}: no tiled kernel variant)"
    return "kernel", "compiled tiled kernels (fused_attn_small_seq, many queries per segment)"


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _time_batches(fn, iters: int, device: torch.device) -> List[float]:
    """Wall-clock ms of each of ``iters`` calls, after two warm-up calls."""
    for _ in range(2):
        fn()
    times = []
    for _ in range(iters):
        _sync(device)
        start = time.perf_counter()
        fn()
        _sync(device)
        times.append((time.perf_counter() - start) * 1e3)
    return times


def max_relative_error(out: torch.Tensor, ref: torch.Tensor) -> float:
    """``max_i |out_i - ref_i| / |ref_i|`` over rows (candidates), in float64."""
    diff = (out.double() - ref).norm(dim=-1)
    return (diff / ref.norm(dim=-1).clamp_min(1e-30)).max().item()


def _timed_and_checked(layer: TargetAttention, inputs: tuple, kwargs: dict, cfg: DemoConfig,
                       attention: str, items: int, mean_history: float) -> DemoResult:
    """Time ``layer(*inputs, **kwargs)``, check it against the float64 copy of the layer."""
    with torch.inference_mode():
        times = _time_batches(lambda: layer(*inputs, **kwargs), cfg.iters, cfg.device)
        out = layer(*inputs, **kwargs)
        ref_layer = copy.deepcopy(layer).to(torch.float64)
        ref_layer.backend = "torch"  # float64 inputs: the float64 reference attention
        ref = ref_layer(*(t.double() if t.is_floating_point() else t for t in inputs), **kwargs)
    ms = statistics.median(times)
    return DemoResult(attention=attention, ms_per_batch=ms, items_per_s=items / (ms * 1e-3),
                      max_rel_err=max_relative_error(out, ref), tolerance=TOLERANCE[cfg.dtype],
                      mean_history=mean_history)


def run(cfg: DemoConfig) -> DemoRun:
    """Build the layer, time the batch and the request, check both against float64."""
    torch.manual_seed(cfg.seed)
    backend, attention = pick_backend(cfg)
    layer = TargetAttention(cfg.embed_dim, cfg.num_heads, head_dim=cfg.head_dim,
                            num_kv_heads=cfg.num_kv_heads, max_seqlen_kv=cfg.max_history,
                            backend=backend, device=cfg.device, dtype=cfg.dtype).eval()
    candidate, history, seqlens = make_batch(cfg)
    batch = _timed_and_checked(layer, (candidate, history), dict(seqlens=seqlens), cfg,
                               attention, cfg.batch, seqlens.double().mean().item())
    # The request's layer: the same weights, the longer histories' bound.
    backend, attention = pick_request_backend(cfg)
    request_layer = TargetAttention(cfg.embed_dim, cfg.num_heads, head_dim=cfg.head_dim,
                                    num_kv_heads=cfg.num_kv_heads,
                                    max_seqlen_kv=cfg.request_history, backend=backend,
                                    device=cfg.device, dtype=cfg.dtype).eval()
    request_layer.load_state_dict(layer.state_dict())
    candidate, rows, offsets, cu_seqlens, lengths = make_request(cfg)
    request = _timed_and_checked(
        request_layer, (candidate, rows),
        dict(cu_seqlens=cu_seqlens, candidate_offsets=offsets, max_candidates=cfg.candidates),
        cfg, attention, cfg.users * cfg.candidates, lengths.double().mean().item())
    return DemoRun(batch=batch, request=request)


def _lines(res: DemoResult, what: str, iters: int) -> List[str]:
    return [
        f"    attention   {res.attention}",
        f"    throughput  {res.items_per_s:,.0f} candidates/s ({res.ms_per_batch:.3f} ms per "
        f"{what}, median of {iters})",
        f"    check       max relative error vs float64 reference {res.max_rel_err:.2e} "
        f"(tolerance {res.tolerance:.0e}): {'PASS' if res.passed else 'FAIL'}",
    ]


def report(cfg: DemoConfig, res: DemoRun) -> str:
    device = torch.cuda.get_device_name(cfg.device) if cfg.device.type == "cuda" else "cpu"
    dtype = str(cfg.dtype).replace("torch.", "")
    return "\n".join([
        "rocm-attn demo: target attention of a ranking model, inference",
        f"  model       TargetAttention(embed {cfg.embed_dim}, {cfg.num_heads} heads, "
        f"{cfg.num_kv_heads} kv heads, head dim {cfg.head_dim}), {dtype} on {device}, "
        f"torch.inference_mode",
        f"  batch       {cfg.batch} (user, candidate) pairs, one candidate per user, padded "
        f"histories of 1..{cfg.max_history} items (mean {res.batch.mean_history:.1f})",
        *_lines(res.batch, "batch", cfg.iters),
        f"  request     {cfg.users} users x {cfg.candidates} candidates, packed histories of "
        f"1..{cfg.request_history} items (mean {res.request.mean_history:.1f}), each projected "
        f"once per user",
        *_lines(res.request, "request", cfg.iters),
    ])


def run_and_report(cfg: DemoConfig) -> int:
    """Run cfg, print the report; 0 when the check passed."""
    res = run(cfg)
    print(report(cfg, res))
    return 0 if res.passed else 1


def main(device: Optional[str] = None, batch: Optional[int] = None, dtype: Optional[str] = None,
         iters: Optional[int] = None, seed: int = 0, backend: str = "auto",
         users: Optional[int] = None, candidates: Optional[int] = None) -> int:
    """The demo with the command line's arguments. A value that is wrong anywhere raises
    ValueError; one that this machine cannot run (a GPU it lacks, kernels it has not) too."""
    cfg = default_config(device, batch, dtype, iters, seed, backend, users, candidates)
    problem = cannot_run(cfg)
    if problem:
        raise ValueError(problem)
    return run_and_report(cfg)
