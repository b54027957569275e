"""Benchmark attn_with_cp scaling on the GPUs of one host, against one GPU on the full batch.

A global THD batch (default 128K tokens in 16 sequences of random lengths, h_q=32, h_kv=8,
d=128, bf16, causal) is sharded dual-chunk over `cp` ranks (one process per GPU, NCCL). For
each comm type: forward and forward+backward time (CUDA events, median over repetitions, the
slowest rank), against single-GPU flash attention (`aten._flash_attention_forward/_backward`
varlen) on the whole batch in the same run. Speed-up = single / cp time; scaling efficiency =
speed-up / cp.

Mask cases (``--masks``): ``causal``; ``swa4096``: causal sliding window (4096, 0); ``chunk8192``:
causal chunked attention, chunks of 8192 (Llama-4 style). For the masked cases the table adds
the work skipped (visible (query, key) pairs of causal over those of the case) next to the time
ratio against the causal ring of the same comm type: a windowed ring should gain roughly the
work it skips on long sequences (e.g. ``--seqs 1``).

Communication hidden (columns ``hid``): one extra traced call per case and mode; the share of
communication kernel time with a compute kernel running beside it, summed over all ranks
(``rocm_attn/bench/overlap.py`` says how and what it cannot see). ``--no-comm-hidden`` skips it. The single-GPU anchor of a masked case is
``rocm_attn.attention`` (torch_flash) on the whole batch. ``attn_with_cp`` gets
``min_seqlen = min(lengths)`` so that p2p skips ring steps the mask cannot reach.

``--max-logit`` adds the forward with ``return_max_logit=True`` per case (its extra pass's
overhead over the forward) and ``rocm_attn.attention``'s causal forward on one GPU on the whole
batch with and without it.

Usage: python tools/bench_cp.py [--cp 2] [--tokens 131072] [--seqs 16] [--equal-lengths]
       [--masks causal,swa4096,chunk8192] [--max-logit] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import sys
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

import rocm_attn  # noqa: E402
from .common import eager_ms  # noqa: E402
from .gpu import require_gpu  # noqa: E402
from .overlap import comm_times, kernel_summary, traced_kernels  # noqa: E402
from .plot import bar_chart, check_plot_arg  # noqa: E402
from .progress import progress  # noqa: E402

COMM_TYPES = ("p2p", "all_gather", "a2a")
# mask case -> (window_size, chunk_size), all causal
MASKS = {"causal": ((-1, -1), None), "swa4096": ((4096, 0), None), "chunk8192": ((-1, -1), 8192)}


def visible_pairs(lens: list[int], window: tuple[int, int], chunk) -> int:
    """(query, key) pairs a causal mask with this window / chunking lets through (host)."""
    total = 0
    for n in lens:
        for start in range(0, n, chunk or max(n, 1)):
            m = min(chunk or n, n - start)  # a chunk attends causally inside itself
            if window[0] < 0 or window[0] + 1 >= m:
                total += m * (m + 1) // 2
            else:
                w = window[0] + 1  # keys per query once the window is full
                total += w * (w + 1) // 2 + (m - w) * w
    return total


def seq_lengths(tokens: int, n: int, multiple: int, seed: int) -> list[int]:
    """n random lengths, each a positive multiple of `multiple`, summing to `tokens`."""
    g = torch.Generator().manual_seed(seed)
    units = tokens // multiple
    cuts = sorted(torch.randperm(units - 1, generator=g)[: n - 1].add(1).tolist())
    bounds = [0] + cuts + [units]
    return [(b - a) * multiple for a, b in zip(bounds, bounds[1:])]


def equal_lengths(tokens: int, n: int, multiple: int) -> list[int]:
    """n equal lengths, each a multiple of `multiple`, summing to `tokens`."""
    each = tokens // n // multiple * multiple
    if each <= 0 or each * n != tokens:
        raise ValueError(f"--equal-lengths: {tokens} tokens do not split into {n} sequences of "
                         f"a multiple of {multiple} tokens")
    return [each] * n


def timed(fn, reps: int, warmup: int = 3) -> float:
    """Median ms of fn over reps, each rep fenced by a barrier; the slowest rank's value."""
    # no time-based settling: every rank must make the same number of collective calls
    t = torch.tensor([eager_ms(fn, reps, warmup, before_each=dist.barrier, settle=False)],
                     device="cuda")
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return float(t)


def hidden_share(kernels) -> dict:
    """Communication ms (summed over ranks) of one traced call's kernels and the share hidden
    by compute."""
    t = torch.tensor(comm_times(kernels), dtype=torch.float64, device="cuda")
    dist.all_reduce(t)
    comm, exposed = t.tolist()
    return {"comm_ms_all_ranks": comm, "exposed_ms_all_ranks": exposed,
            "hidden": 1.0 - exposed / comm if comm > 0 else None}


def single_gpu_masked(q, k, v, cu, max_len, window, chunk, backward: bool):
    """rocm_attn.attention (torch_flash) on the full batch on one GPU: the masked anchor."""
    leaves = [t.detach().clone().requires_grad_(backward) for t in (q, k, v)]

    def fwd():
        return rocm_attn.attention(*leaves, cu, cu, max_len, max_len, attn_mask_type="causal",
                                   window_size=window, chunk_size=chunk, backend="torch_flash")

    if not backward:
        return lambda: fwd().detach()
    dout = torch.randn_like(q)
    return lambda: torch.autograd.grad(fwd(), leaves, dout)


def single_gpu(q, k, v, cu, max_len, scale, backward: bool):
    """Flash attention on the full batch on one GPU (the anchor)."""
    def fwd():
        return torch.ops.aten._flash_attention_forward(
            q, k, v, cu, cu, max_len, max_len, 0.0, True, False, scale=scale)

    if not backward:
        return lambda: fwd()
    out, lse, _, _, _ = fwd()
    dout = torch.randn_like(out)

    def step():
        o, l, _, _, _ = fwd()
        torch.ops.aten._flash_attention_backward(
            dout, q, k, v, o, l, cu, cu, max_len, max_len, 0.0, True,
            torch.zeros(2, dtype=torch.uint64, device=q.device), torch.empty(0, device=q.device),
            scale=scale)

    return step


def worker(rank: int, world: int, port: int, args, out_path: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.cuda.set_device(rank)
    dist.init_process_group("nccl", rank=rank, world_size=world)
    cp, dev, dtype = world, torch.device("cuda", rank), torch.bfloat16
    lens = (equal_lengths(args.tokens, args.seqs, 2 * cp) if args.equal_lengths
            else seq_lengths(args.tokens, args.seqs, 2 * cp, args.seed))
    cu = torch.tensor([0] + torch.tensor(lens).cumsum(0).tolist(), dtype=torch.int32, device=dev)
    g = torch.Generator(device="cpu").manual_seed(args.seed)
    q = torch.randn(args.tokens, args.heads_q, args.head_dim, generator=g).to(dev, dtype)
    k = torch.randn(args.tokens, args.heads_kv, args.head_dim, generator=g).to(dev, dtype)
    v = torch.randn(args.tokens, args.heads_kv, args.head_dim, generator=g).to(dev, dtype)
    scale = args.head_dim ** -0.5
    max_len = max(lens)
    report = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "cp": cp,
              "tokens": args.tokens, "seqs": lens, "h_q": args.heads_q, "h_kv": args.heads_kv,
              "d": args.head_dim, "dtype": "bfloat16", "masks": args.masks, "rows": []}

    # anchor: every rank times the single-GPU run on its own GPU; the slowest counts
    base = {m: timed(single_gpu(q, k, v, cu, max_len, scale, m == "fwdbwd"), args.reps)
            for m in ("fwd", "fwdbwd")}
    report["single_gpu_ms"] = base
    if args.max_logit:  # rocm_attn.attention (torch_flash) forward with and without max_logit
        ml = {}
        for with_ml in (False, True):
            def attn_fwd(with_ml=with_ml):
                res = rocm_attn.attention(q, k, v, cu, cu, max_len, max_len,
                                          attn_mask_type="causal", backend="torch_flash",
                                          return_max_logit=with_ml)
                return (res[0] if with_ml else res).detach()
            with torch.no_grad():
                ml["fwd_max_logit" if with_ml else "fwd"] = timed(attn_fwd, args.reps)
        ml["overhead"] = ml["fwd_max_logit"] / ml["fwd"] - 1
        report["single_gpu_attention_max_logit_ms"] = ml

    group = dist.group.WORLD
    local = [rocm_attn.shard_for_cp(t, cu, cp, rank).contiguous() for t in (q, k, v)]
    causal_pairs = visible_pairs(lens, (-1, -1), None)
    cases = [(mask, comm) for mask in args.masks for comm in args.comms]
    anchors = {"causal": base}
    for mask, comm in progress(cases, f"cp={cp}", rank == 0 and not args.no_progress):
        window, chunk = MASKS[mask]
        if mask not in anchors:
            anchors[mask] = {m: timed(single_gpu_masked(q, k, v, cu, max_len, window, chunk,
                                                        m == "fwdbwd"), args.reps)
                             for m in ("fwd", "fwdbwd")}
            report.setdefault("single_gpu_masked_ms", {})[mask] = anchors[mask]
        anchor = anchors[mask]
        ql, kl, vl = (t.detach().clone().requires_grad_() for t in local)

        def fwd(ql=ql, kl=kl, vl=vl, comm=comm, window=window, chunk=chunk):
            return rocm_attn.attn_with_cp(ql, kl, vl, cu, cu, max_len, max_len, group,
                                          cp_comm_type=comm, attn_mask_type="causal",
                                          window_size=window, chunk_size=chunk,
                                          cu_seqlens_q_padded=cu, cu_seqlens_kv_padded=cu,
                                          min_seqlen=min(lens))

        dout = torch.randn_like(local[0])

        def fwdbwd(fwd=fwd, leaves=(ql, kl, vl), dout=dout):
            torch.autograd.grad(fwd(), leaves, dout)

        row = {"comm": comm, "mask": mask,
               "work_skipped": causal_pairs / visible_pairs(lens, window, chunk)}
        for mode, fn in (("fwd", lambda fwd=fwd: fwd().detach()), ("fwdbwd", fwdbwd)):
            with torch.no_grad() if mode == "fwd" else torch.enable_grad():
                t = timed(fn, args.reps)
                row[mode] = {"ms": t, "speedup": anchor[mode] / t,
                             "efficiency": anchor[mode] / t / cp}
                if args.no_comm_hidden and not args.profile:
                    continue
                # one traced call serves both; every rank runs it (it communicates)
                kernels = traced_kernels(fn, dist.barrier)
                if not args.no_comm_hidden:
                    row[mode].update(hidden_share(kernels))
                if args.profile and rank == 0:
                    print(f"--- {mask} {comm} {mode}: kernels of one call, rank 0 ---\n"
                          f"{kernel_summary(kernels, args.profile)}", flush=True)
        if args.max_logit:  # the forward with return_max_logit: its extra pass's cost
            def fwd_ml(ql=ql, kl=kl, vl=vl, comm=comm, window=window, chunk=chunk):
                return rocm_attn.attn_with_cp(
                    ql, kl, vl, cu, cu, max_len, max_len, group, cp_comm_type=comm,
                    attn_mask_type="causal", window_size=window, chunk_size=chunk,
                    cu_seqlens_q_padded=cu, cu_seqlens_kv_padded=cu, min_seqlen=min(lens),
                    return_max_logit=True)[0].detach()
            with torch.no_grad():
                t = timed(fwd_ml, args.reps)
            row["fwd_max_logit"] = {"ms": t, "overhead": t / row["fwd"]["ms"] - 1}
        report["rows"].append(row)
    if rank == 0:
        Path(out_path).write_text(json.dumps(report, indent=1))
    dist.destroy_process_group()


def plot_report(report: dict, path: Path) -> Path:
    """PNG of scaling efficiency (speed-up over one GPU / cp) per comm type; 100% = ideal."""
    rows = report["rows"]
    return bar_chart(path, [f"{row['comm']} {row['mask']}" for row in rows],
                     {m: [100 * row[m]["efficiency"] for row in rows] for m in ("fwd", "fwdbwd")},
                     f"attn_with_cp, {report['device']} x{report['cp']}, {report['tokens']} "
                     f"tokens", "scaling efficiency, % (speed-up / cp)")


def _pct(x) -> str:
    return "   -" if x is None else f"{100 * x:3.0f}%"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cp", type=int, default=2)
    parser.add_argument("--tokens", type=int, default=128 * 1024)
    parser.add_argument("--seqs", type=int, default=16)
    parser.add_argument("--heads-q", type=int, default=32)
    parser.add_argument("--heads-kv", type=int, default=8)
    parser.add_argument("--head-dim", type=int, default=128)
    parser.add_argument("--reps", type=int, default=10)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--masks", type=lambda x: x.split(","), default=["causal"],
                        help=f"comma-separated mask cases of {sorted(MASKS)}")
    parser.add_argument("--json", type=Path, default=Path("build/bench_cp.json"))
    parser.add_argument("--plot", type=Path,
                        help="write a PNG of scaling efficiency per comm type (needs matplotlib)")
    parser.add_argument("--no-progress", action="store_true", help="no progress line on stderr")
    parser.add_argument("--max-logit", action="store_true",
                        help="also time the forward with return_max_logit=True (row "
                             "fwd_max_logit: ms and overhead over fwd) and rocm_attn.attention's "
                             "causal forward on one GPU with and without it")
    parser.add_argument("--equal-lengths", action="store_true",
                        help="--seqs sequences of tokens / seqs tokens each instead of random "
                             "lengths")
    parser.add_argument("--comms", type=lambda x: x.split(","), default=list(COMM_TYPES),
                        help=f"comma-separated comm types of {list(COMM_TYPES)}")
    parser.add_argument("--profile", type=int, default=0, metavar="N",
                        help="print the N GPU kernels of one traced call per case (rank 0)")
    parser.add_argument("--no-comm-hidden", action="store_true",
                        help="skip the traced call per case that measures communication hidden")
    args = parser.parse_args(argv)
    check_plot_arg(parser, args.plot)
    bad = [m for m in args.masks if m not in MASKS]
    if bad:
        parser.error(f"--masks: unknown case(s) {bad}; choose from {sorted(MASKS)}")
    bad = [c for c in args.comms if c not in COMM_TYPES]
    if bad:
        parser.error(f"--comms: unknown comm type(s) {bad}; choose from {list(COMM_TYPES)}")
    if not require_gpu("cp", gpus=args.cp, kernels=False):  # per-step attention is torch's flash
        return 1
    os.environ.setdefault("NCCL_NVLS_ENABLE", "0")  # keep NVLink multicast off (shared hosts)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    args.json.parent.mkdir(parents=True, exist_ok=True)
    mp.spawn(worker, args=(args.cp, port, args, str(args.json)), nprocs=args.cp, join=True)
    r = json.loads(args.json.read_text())
    b = r["single_gpu_ms"]
    print(f"\n{r['device']} x{r['cp']}  {r['tokens']} tokens in {len(r['seqs'])} seqs  "
          f"h_q={r['h_q']} h_kv={r['h_kv']} d={r['d']} bf16 causal")
    print(f"single GPU: fwd {b['fwd']:.2f} ms  fwd+bwd {b['fwdbwd']:.2f} ms")
    ml = r.get("single_gpu_attention_max_logit_ms")
    if ml:
        print(f"single GPU rocm_attn.attention causal fwd {ml['fwd']:.2f} ms, with "
              f"return_max_logit {ml['fwd_max_logit']:.2f} ms: max_logit overhead "
              f"{100 * ml['overhead']:.1f}%")
    for mask, a in r.get("single_gpu_masked_ms", {}).items():
        print(f"single GPU {mask}: fwd {a['fwd']:.2f} ms  fwd+bwd {a['fwdbwd']:.2f} ms")
    causal = {row["comm"]: row for row in r["rows"] if row["mask"] == "causal"}
    print(f"{'mask':9s} {'comm':11s} {'fwd ms':>8s} {'speedup':>8s} {'eff':>5s} {'hid':>4s} "
          f"{'fwd+bwd ms':>10s} {'speedup':>8s} {'eff':>5s} {'hid':>4s} {'work/':>6s} "
          f"{'t_causal/t':>10s}")
    for row in r["rows"]:
        f, fb = row["fwd"], row["fwdbwd"]
        ref = causal.get(row["comm"])
        gain = (f"{ref['fwd']['ms'] / f['ms']:4.1f}/{ref['fwdbwd']['ms'] / fb['ms']:4.1f}"
                if ref and row["mask"] != "causal" else "")
        print(f"{row['mask']:9s} {row['comm']:11s} {f['ms']:8.2f} {f['speedup']:7.2f}x "
              f"{100 * f['efficiency']:4.0f}% {_pct(f.get('hidden'))} {fb['ms']:10.2f} "
              f"{fb['speedup']:7.2f}x {100 * fb['efficiency']:4.0f}% {_pct(fb.get('hidden'))} "
              f"{row['work_skipped']:5.1f}x {gain:>10s}")
    for row in r["rows"]:
        if "fwd_max_logit" in row:
            x = row["fwd_max_logit"]
            print(f"max_logit {row['mask']:9s} {row['comm']:11s} fwd {x['ms']:8.2f} ms, "
                  f"overhead {100 * x['overhead']:.1f}% over fwd {row['fwd']['ms']:.2f} ms")
    if args.plot:
        print(f"plot: {plot_report(r, args.plot)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
