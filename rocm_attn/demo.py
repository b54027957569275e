"""`rocm-attn demo`: one recommendation-model inference batch through TargetAttention.

A ranking model scores candidate items against each user's recent behaviour history (1..16
items): the candidate embedding attends to the history embeddings. This runs that layer on
one batch under ``torch.inference_mode``, on the compiled kernels when this install has them
for the device, on the torch path otherwise (the CPU path), and prints

* throughput: candidates scored per second (median batch time over ``iters`` batches);
* the check: the largest relative error over candidates, ``max_i |y_i - r_i| / |r_i|``, of
  the output against the same module with the same weights in float64 (attention computed by
  the float64 reference). The command exits nonzero when it is above the dtype's tolerance.

Sizes: on a GPU 30720 candidates in bfloat16 (a production-sized batch); on a CPU 2048
candidates in float32, so the demo finishes in seconds on two cores.
"""

from __future__ import annotations

import copy
import statistics
import time
from dataclasses import dataclass
from typing import List, Optional, Tuple

import torch

from . import _ext
from ._checks import is_int
from .nn import TargetAttention
from .small_seq import KERNEL_DTYPES, KERNEL_HEAD_DIMS

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


def default_config(device: Optional[str] = None, batch: Optional[int] = None,
                   dtype: Optional[str] = None, iters: Optional[int] = None, seed: int = 0,
                   backend: str = "auto") -> DemoConfig:
    """Production-sized batch in bf16 on a GPU; a small fp32 batch on a CPU. None picks the
    default; 0 or a negative batch / iters is an error, not the default."""
    for name, value in (("batch", batch), ("iters", iters)):
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


def run(cfg: DemoConfig) -> DemoResult:
    """Build the layer, time the batch, check it against float64."""
    torch.manual_seed(cfg.seed)
    backend, attention = pick_backend(cfg)
    layer = TargetAttention(cfg.embed_dim, cfg.num_heads, head_dim=cfg.head_dim,
                            num_kv_heads=cfg.num_kv_heads, max_seqlen_kv=cfg.max_history,
                            backend=backend, device=cfg.device, dtype=cfg.dtype).eval()
    candidate, history, seqlens = make_batch(cfg)
    with torch.inference_mode():
        times = _time_batches(lambda: layer(candidate, history, seqlens=seqlens), cfg.iters,
                              cfg.device)
        out = layer(candidate, history, seqlens=seqlens)
        ref_layer = copy.deepcopy(layer).to(torch.float64)
        ref_layer.backend = "torch"  # float64 inputs: the float64 reference attention
        ref = ref_layer(candidate.double(), history.double(), seqlens=seqlens)
    ms = statistics.median(times)
    return DemoResult(attention=attention, ms_per_batch=ms, items_per_s=cfg.batch / (ms * 1e-3),
                      max_rel_err=max_relative_error(out, ref), tolerance=TOLERANCE[cfg.dtype],
                      mean_history=seqlens.double().mean().item())


def report(cfg: DemoConfig, res: DemoResult) -> str:
    device = torch.cuda.get_device_name(cfg.device) if cfg.device.type == "cuda" else "cpu"
    dtype = str(cfg.dtype).replace("torch.", "")
    return "\n".join([
        "rocm-attn demo: target attention of a ranking model, one inference batch",
        f"  model       TargetAttention(embed {cfg.embed_dim}, {cfg.num_heads} heads, "
        f"{cfg.num_kv_heads} kv heads, head dim {cfg.head_dim}) under torch.inference_mode",
        f"  batch       {cfg.batch} candidates, histories of 1..{cfg.max_history} items "
        f"(mean {res.mean_history:.1f}), {dtype} on {device}",
        f"  attention   {res.attention}",
        f"  throughput  {res.items_per_s:,.0f} candidates/s ({res.ms_per_batch:.3f} ms per "
        f"batch, median of {cfg.iters})",
        f"  check       max relative error vs float64 reference {res.max_rel_err:.2e} "
        f"(tolerance {res.tolerance:.0e}): {'PASS' if res.passed else 'FAIL'}",
    ])


def run_and_report(cfg: DemoConfig) -> int:
    """Run cfg, print the report; 0 when the check passed."""
    res = run(cfg)
    print(report(cfg, res))
    return 0 if res.passed else 1


def main(device: Optional[str] = None, batch: Optional[int] = None, dtype: Optional[str] = None,
         iters: Optional[int] = None, seed: int = 0, backend: str = "auto") -> int:
    """The demo with the command line's arguments. A value that is wrong anywhere raises
    ValueError; one that this machine cannot run (a GPU it lacks, kernels it has not) too."""
    cfg = default_config(device, batch, dtype, iters, seed, backend)
    problem = cannot_run(cfg)
    if problem:
        raise ValueError(problem)
    return run_and_report(cfg)
