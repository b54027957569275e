"""Ranking-model inference with rocm_attn.nn.TargetAttention, against the same model on SDPA.

A small DIN-style ranker (Deep Interest Network: the candidate item attends to the user's
recent items, and an MLP scores the candidate with that "interest" vector) runs two workloads:

  batch    (user, candidate) pairs, one candidate per user, histories of 1..16 items (padded);
  request  a ranking request: --users users x --candidates candidates each, histories of
           1..200 items. rocm_attn takes the histories packed with int64 offsets (as jagged
           tensors carry them), once per user: TargetAttention(candidate_offsets=...) projects
           each history once and every candidate of the user attends to it.

Two copies of the model share every weight and differ only in how the attention is computed:

  rocm_attn  rocm_attn.nn.TargetAttention -> fused_attn_small_seq (GPU kernels, or the torch
             path on a CPU)
  sdpa       F.scaled_dot_product_attention on padded [b, h, s, d] keys with a padding mask (the
             request: queries [users, h, candidates, d] against the user's padded history)

Each runs in three modes, when the machine supports them: eager under torch.inference_mode,
replayed from a captured CUDA/HIP graph (GPU only), and under torch.compile (needs a working
C++ compiler on a CPU, Triton on a GPU; a failure is reported, not fatal). Prints candidates
scored per second per mode, and the largest logit difference between the two models; exits
nonzero when they disagree.

Usage:
  python3 examples/recsys_inference.py                 # GPU if present, else a small CPU run
  python3 examples/recsys_inference.py --device cpu --batch 256 --no-compile
  python3 examples/recsys_inference.py --users 64 --candidates 512   # the request's size
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

HISTORY = 16  # longest history of the batch of pairs (the bound of the one-query kernels)
REQUEST_HISTORY = 200  # longest history of the ranking request


class SDPATargetAttention(TargetAttention):
    """TargetAttention's parameters with the attention done by F.scaled_dot_product_attention.

    The baseline a recommendation model would use without rocm_attn: padded histories and a
    boolean mask. Same projections (and state_dict) as TargetAttention, so weights load 1:1.
    """

    def forward(self, candidate: torch.Tensor, history: torch.Tensor, *,
                seqlens: Optional[torch.Tensor] = None,
                cu_seqlens: Optional[torch.Tensor] = None,
                candidate_offsets: Optional[torch.Tensor] = None,
                max_candidates: Optional[int] = None) -> torch.Tensor:
        """Padded histories only; a request's users must all have the same number of
        candidates (candidate rows [users * c, e], user-major)."""
        if seqlens is None or cu_seqlens is not None:
            raise ValueError("this baseline takes padded histories: pass seqlens")
        b, s, _ = history.shape
        c = candidate.shape[0] // b  # candidates per user (1: the batch of pairs)
        h, hk, d = self.num_heads, self.num_kv_heads, self.head_dim
        q = self.q_proj(candidate).view(b, c, h, d).transpose(1, 2)
        kv = self.kv_proj(history).view(b, s, 2, hk, d)
        # [b, s, hk, d] -> [b, h, s, d]: each kv head serves h // hk query heads (GQA)
        k, v = (kv[:, :, i].transpose(1, 2).repeat_interleave(h // hk, dim=1) for i in (0, 1))
        mask = (torch.arange(s, device=history.device) < seqlens.unsqueeze(1)).view(b, 1, 1, s)
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        return self.out_proj(out.transpose(1, 2).reshape(b * c, h * d))


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
        return self.head(cand, self.attention(cand, hist, seqlens=seqlens))

    def head(self, cand: torch.Tensor, interest: torch.Tensor) -> torch.Tensor:
        """The click logit of each candidate from its embedding and its interest vector."""
        features = torch.cat([cand, interest, cand * interest, cand - interest], dim=-1)
        return self.mlp(features).squeeze(-1)


class RequestRanker(nn.Module):
    """A DINRanker scoring a ranking request: many candidates per user, each user's history
    given once. rocm_attn takes it packed (rows + int64 offsets) and projects it once per
    user; the SDPA baseline takes it padded."""

    def __init__(self, ranker: DINRanker, candidates: int) -> None:
        super().__init__()
        self.ranker, self.candidates = ranker, candidates

    def forward(self, candidate_ids, candidate_offsets, history_ids, cu_seqlens, padded_ids,
                seqlens) -> torch.Tensor:
        """candidate_ids [users * candidates], candidate_offsets int64 [users+1], history_ids
        [total] with cu_seqlens int64 [users+1]; the same histories padded: padded_ids
        [users, 200] (0 = padding) with seqlens [users] -> logits [users * candidates]."""
        r = self.ranker
        cand = r.item_embedding(candidate_ids)
        if isinstance(r.attention, SDPATargetAttention):
            interest = r.attention(cand, r.item_embedding(padded_ids), seqlens=seqlens,
                                   candidate_offsets=candidate_offsets)
        else:
            interest = r.attention(cand, r.item_embedding(history_ids), cu_seqlens=cu_seqlens,
                                   candidate_offsets=candidate_offsets,
                                   max_candidates=self.candidates)
        return r.head(cand, interest)


def build_models(num_items: int, embed_dim: int, device: torch.device,
                 dtype: torch.dtype, history: int = HISTORY) -> Dict[str, DINRanker]:
    """The rocm_attn model and the SDPA model, with identical weights; ``history`` is the
    attention's bound on history length."""
    torch.manual_seed(0)
    kw = dict(num_heads=4, num_kv_heads=2, head_dim=64, max_seqlen_kv=history)
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


def make_request(users: int, candidates: int, num_items: int, device: torch.device,
                 seed: int = 1):
    """A request's inputs for RequestRanker: candidates, offsets, histories of
    1..REQUEST_HISTORY items packed (int64 offsets) and padded."""
    gen = torch.Generator().manual_seed(seed)
    seqlens = torch.randint(1, REQUEST_HISTORY + 1, (users,), generator=gen)
    padded = torch.randint(1, num_items, (users, REQUEST_HISTORY), generator=gen)
    padded *= torch.arange(REQUEST_HISTORY) < seqlens.unsqueeze(1)
    packed = padded[torch.arange(REQUEST_HISTORY) < seqlens.unsqueeze(1)]  # row-major: user order
    cu_seqlens = F.pad(seqlens.cumsum(0), (1, 0))
    candidate_ids = torch.randint(1, num_items, (users * candidates,), generator=gen)
    offsets = torch.arange(users + 1) * candidates
    inputs = (candidate_ids, offsets, packed, cu_seqlens, padded, seqlens)
    return tuple(t.to(device) for t in inputs)


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
    parser.add_argument("--users", type=int,
                        help="users of the ranking request (default 64 on a GPU, 8 on a CPU)")
    parser.add_argument("--candidates", type=int,
                        help="candidates per user of the request (default 512 GPU, 64 CPU)")
    args = parser.parse_args(argv)
    for name in ("users", "candidates"):
        value = getattr(args, name)
        if value is not None and value < 1:
            parser.error(f"--{name} must be >= 1, got {value}")

    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    gpu = device.type == "cuda"
    dtype = getattr(torch, args.dtype) if args.dtype else (torch.bfloat16 if gpu else torch.float32)
    batch = args.batch or (30720 if gpu else 512)
    iters = args.iters or (50 if gpu else 3)
    num_items, embed_dim = (100_000 if gpu else 10_000), 256

    users = args.users or (64 if gpu else 8)
    candidates = args.candidates or (512 if gpu else 64)

    name = torch.cuda.get_device_name(device) if gpu else "cpu"
    print(f"DIN-style ranker: embed {embed_dim}, 4 heads / 2 kv heads of 64, {str(dtype)[6:]} "
          f"on {name}")
    modes = ["eager", "graph"] + ([] if args.no_compile else ["compile"])
    models = build_models(num_items, embed_dim, device, dtype)
    print(f"\nbatch: {batch} (user, candidate) pairs, padded histories of 1..{HISTORY} items")
    worst = run_table(models, make_batch(batch, num_items, device), batch, modes, device, iters,
                      args.compile_backend)
    request_models = {m: RequestRanker(ranker, candidates) for m, ranker in
                      build_models(num_items, embed_dim, device, dtype, REQUEST_HISTORY).items()}
    print(f"\nrequest: {users} users x {candidates} candidates, histories of 1..{REQUEST_HISTORY}"
          f" items (rocm_attn: packed, projected once per user; sdpa: padded + mask)")
    worst = max(worst, run_table(request_models, make_request(users, candidates, num_items,
                                                              device),
                                 users * candidates, modes, device, iters, args.compile_backend))
    # the two models differ only in attention arithmetic: a few ulps of the dtype on logits
    tol = 1e-3 if dtype == torch.float32 else 5e-2
    ok = worst <= tol  # False for NaN
    print(f"\ncheck: max |logit difference| rocm_attn vs sdpa = {worst:.2e} (tolerance "
          f"{tol:.0e}): {'PASS' if ok else 'FAIL'}")
    return 0 if ok else 1


def run_table(models: Dict[str, nn.Module], inputs, items: int, modes: List[str],
              device: torch.device, iters: int, compile_backend: str) -> float:
    """Print candidates/s of both models in every mode; returns the largest logit difference
    between them (nan when one was NaN)."""
    labels = {"eager": "eager (inference_mode)", "graph": "CUDA/HIP graph replay",
              "compile": f"torch.compile ({compile_backend})"}
    print(f"{'mode':28s} {'rocm_attn':>16s} {'sdpa':>16s} {'speed-up':>9s}   candidates/s")
    worst = 0.0
    with torch.inference_mode():
        for mode in modes:
            results = {m: run_mode(mode, model, inputs, device, iters, compile_backend)
                       for m, model in models.items()}
            cells = [f"{items / (ms * 1e-3):16,.0f}" if ms else f"{'-':>16s}"
                     for ms, _, _ in results.values()]
            (ms_a, out_a, _), (ms_b, out_b, _) = results["rocm_attn"], results["sdpa"]
            speedup = f"{ms_b / ms_a:8.2f}x" if ms_a and ms_b else f"{'-':>9s}"
            notes = {note for _, _, note in results.values() if note}
            notes = (notes.pop() if len(notes) == 1 and all(r[2] for r in results.values())
                     else "; ".join(f"{m} {r[2]}" for m, r in results.items() if r[2]))
            print(f"{labels[mode]:28s} {cells[0]} {cells[1]} {speedup}   {notes}".rstrip())
            if out_a is not None and out_b is not None:
                diff = (out_a - out_b).abs().max().item() if out_a.numel() else 0.0
                worst = diff if diff != diff else max(worst, diff)  # NaN stays NaN
    return worst


if __name__ == "__main__":
    sys.exit(main())
