"""Benchmark the THD kernels (rocm_attn.thd, backend="kernel") against their floor and two anchors.

For each case and helper: the kernel's device time (graph replay of back-to-back calls, see
bench_common.py; the eager per-call time next to it), rotating over input sets whose total
exceeds L2, the floor (fewest bytes the helper must move over the
device-to-device copy bandwidth measured in this same run), % of floor, % of a plain
device-to-device copy of the same bytes (same launch and ramp costs: the realistic ceiling at
these sizes), and the speed-up over
  idx    the same data movement in torch with the index precomputed (index_select /
         index_copy_ with an index built outside the timed region; merges with no index: "-")
  torch  the torch path of rocm_attn.thd (backend="torch"), index computation included.
step_chain: partition, read_half, merge_second_half_ and grad_correction_ back to back, as the
helpers of one ring step follow each other (floor: the sum of their bytes).
Cases: b=16 sequences x s=4096 tokens for cp 2/4/8, and 64 sequences of random lengths
128..8192 (cp 4); h=16, d=64, bf16 (LSE float32 [h, t]); rank 1's shard where one is needed.

Usage: python tools/bench_thd.py [--json out.json] [--cases name,...] [--reps 30]
"""

from __future__ import annotations

import argparse
import json
import math
import random
import sys
from pathlib import Path

import torch

from rocm_attn import thd  # noqa: E402
from .common import copy_bandwidth, eager_fallbacks, eager_ms, rotating, time_ms  # noqa: E402
from .gpu import require_gpu
from .plot import bar_chart, check_plot_arg
from .progress import progress

H, D, DTYPE = 16, 64, torch.bfloat16
RANK = 1
CASES = {
    "b16_s4096_cp2": dict(b=16, s=4096, cp=2),
    "b16_s4096_cp4": dict(b=16, s=4096, cp=4),
    "b16_s4096_cp8": dict(b=16, s=4096, cp=8),
    "var64_cp4": dict(b=64, lo=128, hi=8192, cp=4),
}
L2_ROTATION_BYTES = 512 * 2**20
MAX_SETS = 64
KW = dict(validate=False)
# the helpers step_chain runs back to back (helpers() builds their calls on one input set)
CHAIN_STEPS = ("partition", "read_half", "merge_second_half_", "grad_correction_")


def cu_of(lens, device="cuda"):
    out = [0]
    for n in lens:
        out.append(out[-1] + n)
    return torch.tensor(out, dtype=torch.int32, device=device)


def layout(spec, seed):
    """Global padded lengths, cu_seqlens_padded, local cu and local valid-token lengths."""
    cp = spec["cp"]
    rng = random.Random(seed)
    if "s" in spec:
        lens = [spec["s"]] * spec["b"]
    else:
        lens = [rng.randint(spec["lo"], spec["hi"]) for _ in range(spec["b"])]
    plens = [-(-n // (2 * cp)) * (2 * cp) for n in lens]
    loc = [p // cp for p in plens]
    # per-step outputs of a rank are packed over its valid tokens; the accumulator is padded
    valid = [max(n - rng.randint(0, 2 * cp - 1), 0) if "lo" in spec else n for n in loc]
    return dict(cp=cp, plens=plens, cu_p=cu_of(plens), total=sum(plens), cu_loc=cu_of(loc),
                t_loc=sum(loc), cu_valid=cu_of(valid), n_valid=sum(valid))


def helpers(L):
    """name -> (make(gen) -> inputs dict, kernel(x), idx anchor(x) or None, torch(x), bytes)."""
    cp, T, t = L["cp"], L["total"], L["t_loc"]
    cu_p, cu_loc, cu_v = L["cu_p"], L["cu_loc"], L["cu_valid"]
    row = H * D * 2
    dev = "cuda"

    def rnd(*shape, dtype=DTYPE, gen=None, scale=1.0):
        return (torch.randn(*shape, device=dev, generator=gen) * scale).to(dtype)

    idx_part = thd.partitioned_indices(cu_p, cp, RANK, T, backend="torch")
    idx_sharded = torch.cat([thd.partitioned_indices(cu_p, cp, r, T, backend="torch")
                             for r in range(cp)])
    # the torch paths' index maps, read off the public helpers applied to row numbers
    idx_contig = thd.reorder_to_contiguous(torch.arange(T, device=dev), cu_p, cp,
                                           backend="torch")
    idx_half = thd.read_half(torch.arange(t, device=dev), cu_loc, "second", backend="torch")
    src_of_dst = thd.copy_valid_tokens(torch.full((t,), -1, device=dev),
                                       torch.arange(L["n_valid"], device=dev), cu_v, cu_loc,
                                       None, backend="torch")
    dst_idx = (src_of_dst >= 0).nonzero().squeeze(1)
    src_idx = src_of_dst[dst_idx]

    def merge_idx(x):
        o, l_ = thd.merge_partial(x["out"].index_select(0, idx_half),
                                  x["lse"].index_select(1, idx_half), x["os"], x["ls"],
                                  backend="torch", **KW)
        x["out"].index_copy_(0, idx_half, o)
        x["lse"].index_copy_(1, idx_half, l_)

    def grad_idx(x):
        x["g"].index_copy_(0, idx_half, x["g"].index_select(0, idx_half) + x["gs"])

    def chain_make(g):
        return dict(x=rnd(T, H, D, gen=g), out=rnd(t, H, D, gen=g),
                    lse=rnd(H, t, dtype=torch.float32, gen=g), os=rnd(t // 2, H, D, gen=g),
                    ls=rnd(H, t // 2, dtype=torch.float32, gen=g), g=rnd(t, H, D, gen=g),
                    gs=rnd(t // 2, H, D, gen=g))

    def chain(backend):
        # the helpers of one ring step, each after a different kernel (as in attn_with_cp)
        def run(x):
            thd.partition(x["x"], cu_p, cp, RANK, backend=backend, **KW)
            thd.read_half(x["out"], cu_loc, "second", backend=backend, **KW)
            thd.merge_partial(x["out"], x["lse"], x["os"], x["ls"], cu_loc, True, inplace=True,
                              backend=backend, **KW)
            thd.grad_correction(x["g"], x["gs"], cu_loc, "none", "add", inplace=True,
                                backend=backend, **KW)
        return run

    def chain_idx(x):
        x["x"].index_select(0, idx_part)
        x["out"].index_select(0, idx_half)
        merge_idx(x)
        grad_idx(x)

    entries = {
        "partition": (
            lambda g: dict(x=rnd(T, H, D, gen=g)),
            lambda x: thd.partition(x["x"], cu_p, cp, RANK, backend="kernel", **KW),
            lambda x: x["x"].index_select(0, idx_part),
            lambda x: thd.partition(x["x"], cu_p, cp, RANK, backend="torch", **KW),
            2 * t * row),
        "reorder_to_contiguous": (
            lambda g: dict(x=rnd(T, H, D, gen=g)),
            lambda x: thd.reorder_to_contiguous(x["x"], cu_p, cp, backend="kernel", **KW),
            lambda x: x["x"].index_select(0, idx_contig),
            lambda x: thd.reorder_to_contiguous(x["x"], cu_p, cp, backend="torch", **KW),
            2 * T * row),
        "reorder_to_rank_sharded": (
            lambda g: dict(x=rnd(T, H, D, gen=g)),
            lambda x: thd.reorder_to_rank_sharded(x["x"], cu_p, cp, backend="kernel", **KW),
            lambda x: x["x"].index_select(0, idx_sharded),
            lambda x: thd.reorder_to_rank_sharded(x["x"], cu_p, cp, backend="torch", **KW),
            2 * T * row),
        "read_half": (
            lambda g: dict(x=rnd(t, H, D, gen=g)),
            lambda x: thd.read_half(x["x"], cu_loc, "second", backend="kernel", **KW),
            lambda x: x["x"].index_select(0, idx_half),
            lambda x: thd.read_half(x["x"], cu_loc, "second", backend="torch", **KW),
            2 * (t // 2) * row),
        "read_half_lse": (
            lambda g: dict(x=rnd(H, t, dtype=torch.float32, gen=g)),
            lambda x: thd.read_half(x["x"], cu_loc, "second", dim=-1, backend="kernel", **KW),
            lambda x: x["x"].index_select(1, idx_half),
            lambda x: thd.read_half(x["x"], cu_loc, "second", dim=-1, backend="torch", **KW),
            2 * (t // 2) * H * 4),
        "copy_valid_tokens": (
            lambda g: dict(dst=rnd(t, H, D, gen=g), src=rnd(L["n_valid"], H, D, gen=g)),
            lambda x: thd.copy_valid_tokens(x["dst"], x["src"], cu_v, cu_loc, backend="kernel",
                                            **KW),
            lambda x: x["dst"].index_copy_(0, dst_idx, x["src"].index_select(0, src_idx)),
            lambda x: thd.copy_valid_tokens(x["dst"], x["src"], cu_v, cu_loc, backend="torch",
                                            **KW),
            2 * L["n_valid"] * row),
        "merge_partial": (
            lambda g: dict(out=rnd(t, H, D, gen=g), lse=rnd(H, t, dtype=torch.float32, gen=g),
                           os=rnd(t, H, D, gen=g), ls=rnd(H, t, dtype=torch.float32, gen=g)),
            lambda x: thd.merge_partial(x["out"], x["lse"], x["os"], x["ls"], backend="kernel",
                                        **KW),
            None,
            lambda x: thd.merge_partial(x["out"], x["lse"], x["os"], x["ls"], backend="torch",
                                        **KW),
            3 * t * row + 3 * H * t * 4),
        "merge_second_half_": (
            lambda g: dict(out=rnd(t, H, D, gen=g), lse=rnd(H, t, dtype=torch.float32, gen=g),
                           os=rnd(t // 2, H, D, gen=g),
                           ls=rnd(H, t // 2, dtype=torch.float32, gen=g)),
            lambda x: thd.merge_partial(x["out"], x["lse"], x["os"], x["ls"], cu_loc, True,
                                        inplace=True, backend="kernel", **KW),
            merge_idx,
            lambda x: thd.merge_partial(x["out"], x["lse"], x["os"], x["ls"], cu_loc, True,
                                        inplace=True, backend="torch", **KW),
            3 * (t // 2) * row + 3 * H * (t // 2) * 4),
        "lse_correction": (
            lambda g: dict(lse=rnd(H, t, dtype=torch.float32, gen=g),
                           ls=rnd(H, t, dtype=torch.float32, gen=g)),
            lambda x: thd.lse_correction(x["lse"], x["ls"], backend="kernel", **KW),
            None,
            lambda x: thd.lse_correction(x["lse"], x["ls"], backend="torch", **KW),
            3 * H * t * 4),
        "out_correction_fp32acc_": (
            lambda g: dict(acc=rnd(t, H, D, dtype=torch.float32, gen=g), os=rnd(t, H, D, gen=g),
                           lse=rnd(H, t, dtype=torch.float32, gen=g),
                           ls=rnd(H, t, dtype=torch.float32, gen=g)),
            lambda x: thd.out_correction(x["acc"], x["os"], x["lse"], x["ls"], inplace=True,
                                         backend="kernel", **KW),
            None,
            lambda x: thd.out_correction(x["acc"], x["os"], x["lse"], x["ls"], inplace=True,
                                         backend="torch", **KW),
            2 * t * H * D * 4 + t * row + 2 * H * t * 4),
        "grad_correction_": (
            lambda g: dict(g=rnd(t, H, D, gen=g), gs=rnd(t // 2, H, D, gen=g)),
            lambda x: thd.grad_correction(x["g"], x["gs"], cu_loc, "none", "add", inplace=True,
                                          backend="kernel", **KW),
            grad_idx,
            lambda x: thd.grad_correction(x["g"], x["gs"], cu_loc, "none", "add", inplace=True,
                                          backend="torch", **KW),
            3 * (t // 2) * row),
    }
    entries["step_chain"] = (chain_make, chain("kernel"), chain_idx, chain("torch"),
                             sum(entries[name][4] for name in CHAIN_STEPS))
    return entries


def bench_case(name, spec, bw, reps, seed):
    L = layout(spec, seed)
    gen = torch.Generator(device="cuda").manual_seed(seed)
    rows = []
    for helper, (make, kern, idx, tor, nbytes) in helpers(L).items():
        probe = make(gen)
        set_bytes = sum(v.numel() * v.element_size() for v in probe.values())
        n_sets = min(MAX_SETS, max(2, math.ceil(L2_ROTATION_BYTES / set_bytes)))
        sets = [probe] + [make(gen) for _ in range(n_sets - 1)]
        t = time_ms(rotating([lambda x=x: kern(x) for x in sets]), reps, name=helper)
        t_eager = eager_ms(rotating([lambda x=x: kern(x) for x in sets]), reps)
        floor = nbytes / bw * 1e3
        # a plain device-to-device copy of the same bytes (same launch and ramp costs)
        n_copy = max(nbytes // 2, 1)
        bufs = [(torch.empty(n_copy, dtype=torch.uint8, device="cuda"),
                 torch.empty(n_copy, dtype=torch.uint8, device="cuda"))
                for _ in range(min(n_sets, max(2, math.ceil(L2_ROTATION_BYTES / n_copy))))]
        t_copy = time_ms(rotating([lambda b=b: b[1].copy_(b[0]) for b in bufs]), reps,
                         name="copy")
        del bufs
        row = {"case": name, "helper": helper, "cp": L["cp"], "tokens": L["total"],
               "local_tokens": L["t_loc"], "input_sets": n_sets, "bytes": nbytes, "ms": t, "eager_ms": t_eager,
               "floor_ms": floor, "pct_floor": 100 * floor / t, "gbps": nbytes / (t * 1e-3) / 1e9,
               "same_bytes_copy_ms": t_copy, "pct_copy": 100 * t_copy / t}
        for aname, fn in (("idx", idx), ("torch", tor)):
            if fn is None:
                row[aname] = None
                continue
            ta = time_ms(rotating([lambda x=x: fn(x) for x in sets]), max(5, reps // 3),
                         name=f"{helper}/{aname}")
            row[aname] = {"ms": ta, "speedup": ta / t}
        rows.append(row)
        del sets, probe
        torch.cuda.empty_cache()
    return rows


def plot_report(report: dict, path: Path) -> Path:
    """PNG of % of floor: one group of bars per helper, one bar per case."""
    rows = report["rows"]
    helpers_ = list(dict.fromkeys(r["helper"] for r in rows))
    cases = list(dict.fromkeys(r["case"] for r in rows))
    pct = {(r["case"], r["helper"]): r["pct_floor"] for r in rows}
    return bar_chart(path, helpers_, {c: [pct.get((c, h)) for h in helpers_] for c in cases},
                     f"rocm_attn.thd, {report['device']}, h={report['h']} d={report['d']}, "
                     f"{report['dtype']}", "% of floor (bytes / copy bandwidth)")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--json", type=Path)
    parser.add_argument("--cases", default=",".join(CASES))
    parser.add_argument("--reps", type=int, default=30)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--plot", type=Path,
                        help="write a PNG of %% of floor per case (needs matplotlib)")
    parser.add_argument("--no-progress", action="store_true", help="no progress line on stderr")
    args = parser.parse_args(argv)
    check_plot_arg(parser, args.plot)
    if not require_gpu("thd"):
        return 1
    if not thd.HAS_KERNELS:
        print("rocm-attn bench thd: the extension is loaded but has no THD kernels; rebuild it "
              "from this source tree (python3 -m pip install --no-build-isolation -e .)",
              file=sys.stderr)
        return 1
    bw = copy_bandwidth()
    rows = []
    for name in progress(args.cases.split(","), "thd", not args.no_progress):
        rows += bench_case(name, CASES[name], bw, args.reps, args.seed)
    from rocm_attn import _C  # loaded: thd.HAS_KERNELS

    overlapped = bool(_C.overlapped_launch())
    report = {"device": torch.cuda.get_device_name(), "torch": torch.__version__,
              "overlapped_launch": overlapped,
              "copy_bandwidth_GBps": bw / 1e9, "h": H, "d": D, "dtype": str(DTYPE), "rank": RANK,
              "clock": "device (graph replay of back-to-back calls); eager_ms: one call, host "
                       "dispatch included", "eager_fallbacks": eager_fallbacks(), "rows": rows}
    if args.json:
        args.json.write_text(json.dumps(report, indent=1))
    print(f"\n{report['device']}  copy bandwidth {bw / 1e9:.0f} GB/s  h={H} d={D} bf16  "
          f"(x idx: vs torch with a precomputed index; x torch: vs backend='torch')")
    print("ms: device time (graph replay); eager: one call incl. host dispatch; launches "
          + ("overlapped (programmatic dependent launch)" if overlapped else "plain"))
    print(f"{'case':14s} {'helper':24s} {'ms':>8s} {'eager':>7s} {'GB/s':>6s} {'%floor':>6s} "
          f"{'%copy':>6s} {'x idx':>6s} {'x torch':>7s}")
    for r in rows:
        sp = lambda a: f"{a['speedup']:.1f}x" if a else "-"  # noqa: E731
        print(f"{r['case']:14s} {r['helper']:24s} {r['ms']:8.4f} {r['eager_ms']:7.3f} "
              f"{r['gbps']:6.0f} "
              f"{r['pct_floor']:5.0f}% {r['pct_copy']:5.0f}% {sp(r['idx']):>6s} "
              f"{sp(r['torch']):>7s}")
    if args.plot:
        print(f"plot: {plot_report(report, args.plot)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
