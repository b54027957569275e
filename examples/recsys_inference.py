"""Ranking-model inference with rocm_attn.nn.TargetAttention, against the same model on SDPA.

A small DIN-style ranker (Deep Interest Network: the candidate item attends to the user's
recent items, and an MLP scores the candidate with that "interest" vector) scores a batch of
candidates, each against a user history of 1..16 items. Two copies of the model share every
weight and differ only in how the attention is computed:

  rocm_attn  rocm_attn.nn.TargetAttention -> fused_attn_small_seq (GPU kernels, or the torch
             path on a CPU)
  sdpa       F.scaled_dot_product_attention on padded [b, h, 16, d] keys with a padding mask

Each runs in three modes, when the machine supports them: eager under torch.inference_mode,
replayed from a captured CUDA/HIP graph (GPU only), and under torch.compile (needs a working
C++ compiler on a CPU, Triton on a GPU; a failure is reported, not fatal). Prints candidates
scored per second per mode, and the largest logit difference between the two models; exits
nonzero when they disagree.

Usage:
  python3 examples/recsys_inference.py                 # GPU if present, else a small CPU run
  python3 examples/recsys_inference.py --device cpu --batch 256 --no-compile
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from typing import Callable, Dict, List, Optional, Tuple

import torch
import torch.nn.functional as F
from torch import nn

from rocm_attn.nn import TargetAttention

HISTORY = 16  # longest user history the ranker looks at (the op's bound)


class SDPATargetAttention(TargetAttention):
    """TargetAttention's parameters with the attention done by F.scaled_dot_product_attention.

    The baseline a recommendation model would use without rocm_attn: padded histories and a
    boolean mask. Same projections (and state_dict) as TargetAttention, so weights load 1:1.
    """

    def forward(self, candidate: torch.Tensor, history: torch.Tensor, *,
                seqlens: Optional[torch.Tensor] = None,
                cu_seqlens: Optional[torch.Tensor] = None) -> torch.Tensor:
        if seqlens is None or cu_seqlens is not None:
            raise ValueError("this baseline takes padded histories: pass seqlens")
        b, s, _ = history.shape
        h, hk, d = self.num_heads, self.num_kv_heads, self.head_dim
        q = self.q_proj(candidate).view(b, h, 1, d)
        kv = self.kv_proj(history).view(b, s, 2, hk, d)
        # [b, s, hk, d] -> [b, h, s, d]: each kv head serves h // hk query heads (GQA)
        k, v = (kv[:, :, i].transpose(1, 2).repeat_interleave(h // hk, dim=1) for i in (0, 1))
        mask = (torch.arange(s, device=history.device) < seqlens.unsqueeze(1)).view(b, 1, 1, s)
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        return self.out_proj(out.reshape(b, h * d))


class DINRanker(nn.Module):
    """Item embeddings -> target attention over the history -> MLP -> click logit."""

    def __init__(self, attention: TargetAttention, num_items: int, embed_dim: int,
                 hidden: Tuple[int, ...] = (256, 128)) -> None:
        super().__init__()
        self.item_embedding = nn.Embedding(num_items, embed_dim, padding_idx=0)
        self.attention = attention
        layers: List[nn.Module] = []
        width = 4 * embed_dim  # candidate, interest, their product and difference (DIN)
        for size in hidden:
            layers += [nn.Linear(width, size), nn.ReLU()]
            width = size
        layers.append(nn.Linear(width, 1))
        self.mlp = nn.Sequential(*layers)

    def forward(self, candidate_ids: torch.Tensor, history_ids: torch.Tensor,
                seqlens: torch.Tensor) -> torch.Tensor:
        """candidate_ids [b], history_ids [b, 16] (0 = padding), seqlens int32 [b] -> logits [b]."""
        cand = self.item_embedding(candidate_ids)
        hist = self.item_embedding(history_ids)
        interest = self.attention(cand, hist, seqlens=seqlens)
        features = torch.cat([cand, interest, cand * interest, cand - interest], dim=-1)
        return self.mlp(features).squeeze(-1)


def build_models(num_items: int, embed_dim: int, device: torch.device,
                 dtype: torch.dtype) -> Dict[str, DINRanker]:
    """The rocm_attn model and the SDPA model, with identical weights."""
    torch.manual_seed(0)
    kw = dict(num_heads=4, num_kv_heads=2, head_dim=64, max_seqlen_kv=HISTORY)
    ours = DINRanker(TargetAttention(embed_dim, **kw), num_items, embed_dim)
    baseline = DINRanker(SDPATargetAttention(embed_dim, **kw), num_items, embed_dim)
    baseline.load_state_dict(ours.state_dict())
    return {name: m.to(device, dtype).eval() for name, m in (("rocm_attn", ours),
                                                              ("sdpa", baseline))}


def make_batch(batch: int, num_items: int, device: torch.device, seed: int = 0):
    """Candidate ids, padded history ids (0 past each history's end), lengths 1..16."""
    gen = torch.Generator().manual_seed(seed)
    seqlens = torch.randint(1, HISTORY + 1, (batch,), generator=gen, dtype=torch.int32)
    history = torch.randint(1, num_items, (batch, HISTORY), generator=gen)
    history *= torch.arange(HISTORY) < seqlens.unsqueeze(1)
    candidates = torch.randint(1, num_items, (batch,), generator=gen)
    return candidates.to(device), history.to(device), seqlens.to(device)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def median_ms(fn: Callable[[], object], iters: int, device: torch.device) -> float:
    """Median wall-clock ms per call over ``iters`` calls, after three warm-up calls."""
    for _ in range(3):
        fn()
    times = []
    for _ in range(iters):
        _sync(device)
        start = time.perf_counter()
        fn()
        _sync(device)
        times.append((time.perf_counter() - start) * 1e3)
    return statistics.median(times)


def graph_runner(model: nn.Module, inputs, device: torch.device) -> Callable[[], torch.Tensor]:
    """Capture one forward in a CUDA/HIP graph; the returned call replays it (static inputs)."""
    side = torch.cuda.Stream(device)
    side.wait_stream(torch.cuda.current_stream(device))
    with torch.cuda.stream(side):  # warm-up off the capture stream, as graph capture needs
        for _ in range(3):
            model(*inputs)
    torch.cuda.current_stream(device).wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = model(*inputs)

    def replay() -> torch.Tensor:
        graph.replay()
        return out

    return replay


def run_mode(mode: str, model: nn.Module, inputs, device: torch.device, iters: int,
             compile_backend: str) -> Tuple[Optional[float], Optional[torch.Tensor], str]:
    """(ms per batch, logits, note) of one model in one mode; ms None with the reason if skipped."""
    try:
        if mode == "eager":
            fn = lambda: model(*inputs)  # noqa: E731
        elif mode == "graph":
            if device.type != "cuda":
                return None, None, "skipped: CUDA/HIP graphs need a GPU"
            fn = graph_runner(model, inputs, device)
        else:
            compiled = torch.compile(model, backend=compile_backend, fullgraph=True)
            fn = lambda: compiled(*inputs)  # noqa: E731
        ms = median_ms(fn, iters, device)
        return ms, fn().float().clone(), ""
    except Exception as exc:  # a mode this machine cannot run is reported, not fatal
        hint = ""
        if mode == "compile" and device.type == "cpu":
            hint = " (torch.compile on a CPU needs a working C++ compiler; or pass --no-compile)"
        first = str(exc).strip().splitlines()[0][:160] if str(exc).strip() else ""
        return None, None, f"failed: {type(exc).__name__}: {first}{hint}"


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", help="cuda or cpu (default: cuda when present)")
    parser.add_argument("--batch", type=int,
                        help="candidates per batch (default 30720 on a GPU, 512 on a CPU)")
    parser.add_argument("--iters", type=int, help="timed batches per mode (default 50 GPU, 3 CPU)")
    parser.add_argument("--dtype", choices=["bfloat16", "float16", "float32"],
                        help="default bfloat16 on GPU, float32 on CPU")
    parser.add_argument("--no-compile", action="store_true", help="skip the torch.compile mode")
    parser.add_argument("--compile-backend", default="inductor",
                        help="torch.compile backend (default inductor; 'eager' only traces)")
    args = parser.parse_args(argv)

    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    gpu = device.type == "cuda"
    dtype = getattr(torch, args.dtype) if args.dtype else (torch.bfloat16 if gpu else torch.float32)
    batch = args.batch or (30720 if gpu else 512)
    iters = args.iters or (50 if gpu else 3)
    num_items, embed_dim = (100_000 if gpu else 10_000), 256

    models = build_models(num_items, embed_dim, device, dtype)
    inputs = make_batch(batch, num_items, device)
    name = torch.cuda.get_device_name(device) if gpu else "cpu"
    print(f"DIN-style ranker: {batch} candidates x histories of 1..{HISTORY} items, embed "
          f"{embed_dim}, 4 heads / 2 kv heads of 64, {str(dtype)[6:]} on {name}")
    modes = ["eager", "graph"] + ([] if args.no_compile else ["compile"])
    labels = {"eager": "eager (inference_mode)", "graph": "CUDA/HIP graph replay",
              "compile": f"torch.compile ({args.compile_backend})"}
    print(f"{'mode':28s} {'rocm_attn':>16s} {'sdpa':>16s} {'speed-up':>9s}   candidates/s")
    worst = 0.0
    with torch.inference_mode():
        for mode in modes:
            results = {m: run_mode(mode, model, inputs, device, iters, args.compile_backend)
                       for m, model in models.items()}
            cells = [f"{batch / (ms * 1e-3):16,.0f}" if ms else f"{'-':>16s}"
                     for ms, _, _ in results.values()]
            (ms_a, out_a, _), (ms_b, out_b, _) = results["rocm_attn"], results["sdpa"]
            speedup = f"{ms_b / ms_a:8.2f}x" if ms_a and ms_b else f"{'-':>9s}"
            notes = {note for _, _, note in results.values() if note}
            notes = (notes.pop() if len(notes) == 1 and all(r[2] for r in results.values())
                     else "; ".join(f"{m} {r[2]}" for m, r in results.items() if r[2]))
            print(f"{labels[mode]:28s} {cells[0]} {cells[1]} {speedup}   {notes}".rstrip())
            if out_a is not None and out_b is not None:
                worst = max(worst, (out_a - out_b).abs().max().item())
    # the two models differ only in attention arithmetic: a few ulps of the dtype on logits
    tol = 1e-3 if dtype == torch.float32 else 5e-2
    ok = worst <= tol  # False for NaN
    print(f"check: max |logit difference| rocm_attn vs sdpa = {worst:.2e} (tolerance {tol:.0e}): "
          f"{'PASS' if ok else 'FAIL'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
