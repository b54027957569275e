"""Benchmark fused_attn_small_seq against its floor and the anchors a user could pick instead.

For each case: time of the kernel (forward, and forward+backward), the floor (fewest bytes the
op must move over the device-to-device copy bandwidth measured in this same run), % of floor,
and the speed-up over anchors measured side by side in this run:
  sdpa     F.scaled_dot_product_attention on padded [b, h, s, d] tensors with a padding mask
  varlen   torch.nn.attention.varlen.varlen_attn on the THD tensors (where this torch has it)
  unfused  einsum / masked softmax / einsum on padded tensors (the torch path of this package)
Times of this package's op are device times (graph replays of back-to-back calls,
bench/common.py; eager where a call cannot be captured, reported); anchors are timed eagerly
(one call at a time, host dispatch included: a small bias for the anchor's slower side only at
the smallest case); inputs rotate over several sets so that the
working set exceeds L2. GQA cases (h_q > h_kv) also time the general kernel in the same run
(tuning small_seq_mma=0, column "general"), so the matrix-unit forward's gain is read off one
run. Writes JSON with --json; prints a table last.

--ranking times the ranking grid instead (many candidates per user, histories 16..1024,
rocm_attn/bench/small_seq_ranking.py); --ranking --ragged times request batches whose users'
candidate counts and history lengths are drawn per user, every column on one clock
(rocm_attn/bench/small_seq_ragged.py); --device cpu times the torch path's CPU inference
against SDPA and einsum (rocm_attn/bench/small_seq_cpu.py; no GPU needed).

Usage: python tools/bench_small_seq.py [--json out.json] [--cases name,...] [--batch 30720]
       [--no-anchors] [--ab NAME=VALUE ...] [--ranking [--ragged [--clock C]]]
       [--device cpu [--threads N]]
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

import rocm_attn  # noqa: E402
from .common import (copy_bandwidth, eager_fallbacks, eager_ms, matmul_throughput,  # noqa: E402
                     rotating, time_ms, with_tuning)
from .gpu import require_gpu
from .plot import bar_chart, check_plot_arg
from .progress import progress
from .small_seq_cpu import (BOUND_CASES, CPU_CASES, DEFAULT_CPU_CASES, bench_bound_case,
                            bench_cpu_case, print_bound_rows, print_cpu_rows)
from .small_seq_ranking import bench_rank_row, grid_rows, parse_row_name, print_rank_rows

# name: (h_q, h_kv, d, kv) where kv is an int (every segment) or (lo, hi) uniform
CASES = {
    "h8_d128_kv16": (8, 8, 128, 16),
    "h8_d128_kv8": (8, 8, 128, 8),
    "h8_d128_kv2-16": (8, 8, 128, (2, 16)),
    "h4_d256_kv16": (4, 4, 256, 16),
    "h2_d512_kv16": (2, 2, 512, 16),
    "h1_d128_kv4": (1, 1, 128, 4),
    "gqa_h8_hkv2_d128_kv16": (8, 2, 128, 16),
    "h8_d64_kv16": (8, 8, 64, 16),
    # GQA on the matrix-unit forward: group 8 and 16 (two 8-head passes on NVIDIA), kv8, d64/256
    "gqa_h8_hkv1_d128_kv16": (8, 1, 128, 16),
    "gqa_h16_hkv1_d128_kv16": (16, 1, 128, 16),
    "gqa_h8_hkv2_d128_kv8": (8, 2, 128, 8),
    "gqa_h8_hkv2_d64_kv16": (8, 2, 64, 16),
    "gqa_h8_hkv2_d256_kv16": (8, 2, 256, 16),
}
L2_ROTATION_BYTES = 512 * 2**20
DEFAULT_BATCH = 30720
CPU_REPS = 5
# The modes of this suite, and the mode-specific flags each reads (argparse dest -> modes);
# --json, --cases, --seed and --no-progress apply to all four.
MODE_NAMES = {"grid": "the GPU case grid", "ranking": "--ranking (GPU)",
              "ragged": "--ranking --ragged (GPU)", "cpu": "--device cpu"}
MODE_FLAGS = {
    "batch": ("grid",),
    "dtype": ("grid", "ranking"),
    "no_anchors": ("grid", "ranking", "ragged"),
    "ab": ("grid", "ranking", "ragged"),
    "max_logit": ("grid", "ranking"),
    "plot": ("grid",),
    "fwd_only": ("ranking", "ragged"),
    "ragged": ("ragged",),
    "list": ("ragged",),
    "clock": ("ragged",),
    "threads": ("cpu",),
    "reps": ("cpu",),
}
# Timed single calls behind every eager median. NOTE: 10 left the median of the smallest case
# (h1 d128 kv4, 40-50 us a call, host-bound) 15-25% apart between runs on one H200 machine.
EAGER_REPS = 30


def make_inputs(batch, h_q, h_kv, d, kv, dtype, gen):
    if isinstance(kv, tuple):
        lens = torch.randint(kv[0], kv[1] + 1, (batch,), generator=gen, dtype=torch.int32)
        max_kv = kv[1]
    else:
        lens = torch.full((batch,), kv, dtype=torch.int32)
        max_kv = kv
    cu_kv = torch.zeros(batch + 1, dtype=torch.int32)
    cu_kv[1:] = torch.cumsum(lens, 0)
    total = int(cu_kv[-1])
    dev = "cuda"
    q = torch.randn(batch, h_q, d, generator=gen).to(dev, dtype)
    k = torch.randn(total, h_kv, d, generator=gen).to(dev, dtype)
    v = torch.randn(total, h_kv, d, generator=gen).to(dev, dtype)
    cu_q = torch.arange(batch + 1, dtype=torch.int32, device=dev)
    # padded copies for the anchors (built outside the timed region)
    rows = (cu_kv[:-1].long().unsqueeze(1) + torch.arange(max_kv)).clamp(max=total - 1).to(dev)
    mask = (torch.arange(max_kv).unsqueeze(0) < lens.unsqueeze(1)).to(dev)  # [b, s]
    group = h_q // h_kv
    kp = k[rows].repeat_interleave(group, dim=2)  # [b, s, h_q, d]
    vp = v[rows].repeat_interleave(group, dim=2)
    return dict(q=q, k=k, v=v, cu_q=cu_q, cu_kv=cu_kv.to(dev), lens=lens.to(dev), max_kv=max_kv,
                total=total, kp=kp, vp=vp, mask=mask)


def floor_bytes(batch, h_q, h_kv, d, total, elem=2):
    q = batch * h_q * d * elem
    kv = total * h_kv * d * elem
    lse = batch * h_q * 4
    fwd = q + 2 * kv + q + lse  # read q, k, v; write o, lse
    bwd = (q + 2 * kv + q + q + lse) + (q + 2 * kv)  # read q, k, v, o, dO, lse; write dq, dk, dv
    return fwd, fwd + bwd


def ours(x, backward, max_logit=False):
    def fwd():
        res = rocm_attn.fused_attn_small_seq(x["q"], x["k"], x["v"], x["cu_q"], x["cu_kv"], 1,
                                             x["max_kv"], backend="kernel",
                                             return_max_logit=max_logit)
        return res[0] if max_logit else res

    if not backward:
        return fwd
    return _with_backward(fwd, (x["q"], x["k"], x["v"]))


def sdpa(x, backward):
    qb = x["q"].unsqueeze(2)  # [b, h, 1, d]
    kb = x["kp"].transpose(1, 2)  # [b, h, s, d]
    vb = x["vp"].transpose(1, 2)
    mask = x["mask"][:, None, None, :]

    def fwd():
        return F.scaled_dot_product_attention(qb, kb, vb, attn_mask=mask)

    return _with_backward(fwd, (qb, kb, vb)) if backward else fwd


def unfused(x, backward):
    scale = 1.0 / math.sqrt(x["q"].shape[-1])
    neg = torch.finfo(torch.float32).min

    def fwd():
        s = torch.einsum("bhd,bshd->bhs", x["q"].float(), x["kp"].float()) * scale
        s = s.masked_fill(~x["mask"][:, None, :], neg)
        p = torch.softmax(s, dim=-1)
        return torch.einsum("bhs,bshd->bhd", p, x["vp"].float()).to(x["q"].dtype)

    return _with_backward(fwd, (x["q"], x["kp"], x["vp"])) if backward else fwd


def varlen(x, backward):
    from torch.nn.attention.varlen import varlen_attn  # raises where this torch lacks it

    kr = x["k"].repeat_interleave(x["q"].shape[1] // x["k"].shape[1], dim=1)
    vr = x["v"].repeat_interleave(x["q"].shape[1] // x["v"].shape[1], dim=1)

    def fwd():
        return varlen_attn(x["q"], kr, vr, x["cu_q"], x["cu_kv"], 1, x["max_kv"])

    return _with_backward(fwd, (x["q"], kr, vr)) if backward else fwd


def _with_backward(fwd, leaves):
    leaves = [t.requires_grad_() for t in leaves]
    probe = fwd()
    dout = torch.randn_like(probe)

    def step():
        out = fwd()
        torch.autograd.grad(out, leaves, dout)

    return step


ANCHORS = {"sdpa": sdpa, "varlen": varlen, "unfused": unfused}


def bench_case(name, spec, batch, dtype, bw, seed, anchors=True, ab=(), max_logit=False):
    h_q, h_kv, d, kv = spec
    gen = torch.Generator().manual_seed(seed)
    probe = make_inputs(batch, h_q, h_kv, d, kv, dtype, gen)
    set_bytes = 2 * probe["total"] * h_kv * d * 2 + 2 * probe["kp"].numel() * 2
    n_sets = max(1, math.ceil(L2_ROTATION_BYTES / set_bytes))
    sets = [probe] + [make_inputs(batch, h_q, h_kv, d, kv, dtype, gen) for _ in range(n_sets - 1)]
    fwd_bytes, fb_bytes = floor_bytes(batch, h_q, h_kv, d, probe["total"])
    row = {"case": name, "batch": batch, "h_q": h_q, "h_kv": h_kv, "d": d, "kv": kv,
           "total_kv": probe["total"], "dtype": str(dtype), "input_sets": n_sets}
    for mode, backward, nbytes in (("fwd", False, fwd_bytes), ("fwdbwd", True, fb_bytes)):
        t = time_ms(rotating([ours(x, backward) for x in sets]), name=f"{name}/{mode}")
        t_eager = eager_ms(rotating([ours(x, backward) for x in sets]), reps=EAGER_REPS)
        floor = nbytes / bw * 1e3
        row[mode] = {"ms": t, "eager_ms": t_eager, "floor_ms": floor, "pct_floor": 100 * floor / t,
                     "gbps": nbytes / (t * 1e-3) / 1e9, "anchors": {}}
        if h_q // h_kv >= 2:  # the general kernel on the same inputs, for the A/B
            tg = with_tuning("small_seq_mma=0", lambda: time_ms(
                rotating([ours(x, backward) for x in sets]), name=f"{name}/{mode}/general"))
            row[mode]["general_ms"] = tg
            row[mode]["general_pct_floor"] = 100 * floor / tg
        for setting in ab:  # --ab VAR=VALUE: ours again on the same inputs with a switch set
            ta = with_tuning(setting, lambda: time_ms(
                rotating([ours(x, backward) for x in sets]), name=f"{name}/{mode}/{setting}"))
            row[mode].setdefault("ab", {})[setting] = {"ms": ta, "pct_floor": 100 * floor / ta}
        if max_logit:  # --max-logit: ours with return_max_logit=True on the same inputs
            tm = time_ms(rotating([ours(x, backward, True) for x in sets]),
                         name=f"{name}/{mode}/max_logit")
            row[mode]["max_logit"] = {"ms": tm, "cost_pct": 100 * (tm - t) / t}
        for aname, make in (ANCHORS.items() if anchors else ()):
            try:
                # NOTE: anchors are timed eagerly (one call, host dispatch included; they run
                # 0.2-25 ms): capturing them failed for some (SDPA backward) and each failed
                # capture stranded GPU memory until the sweep ran out.
                ta = eager_ms(rotating([make(x, backward) for x in sets]), reps=EAGER_REPS,
                              warmup=2)
                row[mode]["anchors"][aname] = {"ms": ta, "speedup": ta / t}
            except Exception as exc:  # an anchor this torch lacks is reported, not fatal
                row[mode]["anchors"][aname] = {"error": f"{type(exc).__name__}: {str(exc)[:200]}"}
        ok = [a["ms"] for a in row[mode]["anchors"].values() if "ms" in a]
        row[mode]["best_anchor_ms"] = min(ok) if ok else None
        row[mode]["speedup_vs_best"] = min(ok) / t if ok else None
        # the same comparison on one clock: ours timed eagerly too (host dispatch included)
        row[mode]["speedup_vs_best_eager"] = min(ok) / t_eager if ok else None
    del sets, probe
    torch.cuda.empty_cache()
    return row


def plot_report(report: dict, path: Path) -> Path:
    """PNG of % of floor per case, forward and forward+backward."""
    rows = report["rows"]
    return bar_chart(path, [r["case"] for r in rows],
                     {m: [r[m]["pct_floor"] for r in rows] for m in ("fwd", "fwdbwd")},
                     f"fused_attn_small_seq, {report['device']}, {rows[0]['dtype']}, "
                     f"B={rows[0]['batch']}", "% of floor (bytes / copy bandwidth)")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--json", type=Path)
    parser.add_argument("--cases", default=",".join(CASES))
    parser.add_argument("--batch", type=int, help="GPU case grid: segments per case (default "
                        f"{DEFAULT_BATCH})")
    parser.add_argument("--dtype", choices=["bfloat16", "float16"],
                        help="GPU: kernel dtype (default bfloat16; the CPU rows are float32)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--no-anchors", action="store_true", help="time only our kernels (quick A/B runs)")
    parser.add_argument("--ab", action="append", default=[], metavar="NAME=VALUE",
                        help="also time our op with this launch tuning value set (a "
                             "rocm_attn.tuning name or its ROCM_ATTN_* variable), on the same "
                             "inputs (repeatable; several values of one run joined by '+', "
                             "e.g. small_seq_pipe=0+small_seq_mma=0)")
    parser.add_argument("--max-logit", action="store_true",
                        help="also time our call with return_max_logit=True on the same inputs "
                             "(fwd and fwd+bwd) and print its cost over the plain call")
    parser.add_argument("--plot", type=Path,
                        help="write a PNG of %% of floor per case (needs matplotlib)")
    parser.add_argument("--no-progress", action="store_true", help="no progress line on stderr")
    parser.add_argument("--device", choices=["cuda", "cpu"], default="cuda",
                        help="cpu: the torch path's CPU inference against SDPA and einsum "
                             f"(cases {', '.join([*CPU_CASES, *BOUND_CASES])}; default "
                             f"{', '.join(DEFAULT_CPU_CASES)})")
    parser.add_argument("--threads", type=int, help="CPU: torch intra-op threads (1 also "
                        "reports the calling thread's CPU time)")
    parser.add_argument("--reps", type=int, help=f"CPU: timed calls per case (default {CPU_REPS})")
    parser.add_argument("--fwd-only", action="store_true",
                        help="--ranking: time the forward only (quick A/B runs)")
    parser.add_argument("--ranking", action="store_true",
                        help="GPU: the ranking grid (users x candidates x history x h_kv, "
                             "fixed and ragged; long one-query histories)")
    parser.add_argument("--ragged", action="store_true",
                        help="with --ranking: ragged request batches (per-user candidate counts "
                             "and history lengths drawn from seeded distributions; --cases takes "
                             "their row names; each row names its dtype, --dtype is unused)")
    parser.add_argument("--list", action="store_true",
                        help="--ragged: print the rows (drawn sizes, floors at H200 rates, "
                             "padded bytes) and exit; no GPU needed")
    parser.add_argument("--clock", choices=["auto", "graph", "eager"],
                        help="--ragged: auto times a row's columns by graph replay where all of "
                             "them capture, else all eagerly; graph / eager force one clock")
    args = parser.parse_args(argv)
    _check_mode_flags(parser, args)
    check_plot_arg(parser, args.plot)
    args.batch = args.batch or DEFAULT_BATCH
    args.dtype = args.dtype or "bfloat16"
    args.reps = args.reps or CPU_REPS
    if args.list:
        from .small_seq_ragged import list_rows

        return list_rows(None if args.cases == ",".join(CASES) else args.cases, args.seed)
    if args.device == "cpu":
        return _main_cpu(args)
    if not require_gpu("small-seq", cpu_alternative="rocm-attn bench small-seq --device cpu"):
        return 1
    if args.ragged:
        from .small_seq_ragged import main_ragged

        if args.cases == ",".join(CASES):
            args.cases = None  # the default: every ragged row
        args.clock = args.clock or "auto"
        return main_ragged(args, sys.argv[1:] if argv is None else argv)
    if args.ranking:
        return _main_ranking(args)
    dtype = getattr(torch, args.dtype)
    bw = copy_bandwidth()
    rows = []
    report = {"device": torch.cuda.get_device_name(), "torch": torch.__version__,
              "copy_bandwidth_GBps": bw / 1e9,
              "clock": "ours: device (graph replay of back-to-back calls); eager_ms and the "
                       "anchors: one call at a time, host dispatch included", "rows": rows}
    for name in progress(args.cases.split(","), "small-seq", not args.no_progress):
        rows.append(bench_case(name, CASES[name], args.batch, dtype, bw, args.seed,
                               anchors=not args.no_anchors, ab=args.ab,
                               max_logit=args.max_logit))
        report["eager_fallbacks"] = eager_fallbacks()
        if args.json:  # after every case: a sweep cut short still leaves its finished rows
            args.json.write_text(json.dumps(report, indent=1))
    print(f"\n{report['device']}  copy bandwidth {bw / 1e9:.0f} GB/s  {args.dtype}  B={args.batch}")
    print("times: device (graph replay); eager: one forward call incl. host dispatch")
    print("general: the general kernel's fwd ms and % floor (GQA cases; matrix units off)")
    print("x best: best anchor / ours (device time); x eager: the same with ours timed eagerly")
    print(f"{'case':24s} {'fwd ms':>8s} {'eager':>7s} {'%floor':>6s} {'x best':>7s} {'x eager':>7s} "
          f"{'general':>14s} {'fwd+bwd ms':>10s} {'%floor':>6s} {'x best':>7s} {'x eager':>7s}"
          f"  anchors fwd (ms)")
    for r in rows:
        f, fb = r["fwd"], r["fwdbwd"]
        anchors = " ".join(f"{k}={a['ms']:.3f}" if "ms" in a else f"{k}=n/a" for k, a in f["anchors"].items())
        sp = lambda m, k="speedup_vs_best": f"{m[k]:.1f}x" if m.get(k) else "-"  # noqa: E731
        se = lambda m: sp(m, "speedup_vs_best_eager")  # noqa: E731
        gen = f"{f['general_ms']:.3f} {f['general_pct_floor']:3.0f}%" if "general_ms" in f else "-"
        print(f"{r['case']:24s} {f['ms']:8.3f} {f['eager_ms']:7.3f} {f['pct_floor']:5.0f}% "
              f"{sp(f):>7s} {se(f):>7s} {gen:>14s} {fb['ms']:10.3f} {fb['pct_floor']:5.0f}% "
              f"{sp(fb):>7s} {se(fb):>7s}  {anchors}")
    if args.max_logit:
        print("\nreturn_max_logit: fwd ms (cost) / fwd+bwd ms (cost), over the plain call")
        for r in rows:
            f, fb = r["fwd"]["max_logit"], r["fwdbwd"]["max_logit"]
            print(f"{r['case']:24s} {f['ms']:.3f} ({f['cost_pct']:+.1f}%)   "
                  f"{fb['ms']:.3f} ({fb['cost_pct']:+.1f}%)")
    for setting in args.ab:
        print(f"\nA/B {setting}: fwd ms (% floor) / fwd+bwd ms (% floor), default first")
        for r in rows:
            f, fb = r["fwd"], r["fwdbwd"]
            a, ab_ = f["ab"][setting], fb["ab"][setting]
            print(f"{r['case']:24s} {f['ms']:.3f} ({f['pct_floor']:3.0f}%) -> {a['ms']:.3f} "
                  f"({a['pct_floor']:3.0f}%)   {fb['ms']:.3f} ({fb['pct_floor']:3.0f}%) -> "
                  f"{ab_['ms']:.3f} ({ab_['pct_floor']:3.0f}%)")
    if args.plot:
        print(f"plot: {plot_report(report, args.plot)}")
    return 0


def _mode(args) -> str:
    if args.device == "cpu":
        return "cpu"
    if args.ranking:
        return "ragged" if args.ragged else "ranking"
    return "grid"


def _check_mode_flags(parser: argparse.ArgumentParser, args) -> None:
    """A flag the chosen mode does not read is a usage error (exit 2), never silently dropped:
    each mode's flags are listed in MODE_FLAGS."""
    mode = _mode(args)
    if args.ranking and args.device == "cpu":
        parser.error("--ranking times the GPU kernels; with --device cpu the rows are "
                     f"{', '.join(CPU_CASES)} (choose with --cases)")
    for dest, modes in MODE_FLAGS.items():
        value = getattr(args, dest)
        if value in (None, False, []) or mode in modes:
            continue
        flag = "--" + dest.replace("_", "-")
        used = " and ".join(MODE_NAMES[m] for m in modes)
        parser.error(f"{flag} is not used by {MODE_NAMES[mode]}; it applies to {used}")


def _main_cpu(args) -> int:
    if args.threads:
        torch.set_num_threads(args.threads)
    names = args.cases.split(",") if args.cases != ",".join(CASES) else list(DEFAULT_CPU_CASES)
    unknown = [n for n in names if n not in CPU_CASES and n not in BOUND_CASES]
    if unknown:
        print(f"unknown CPU cases {unknown}; choose from "
              f"{', '.join([*CPU_CASES, *BOUND_CASES])}", file=sys.stderr)
        return 2
    rows = []
    report = {"device": "cpu", "torch": torch.__version__, "threads": torch.get_num_threads(),
              "clock": "wall clock (and thread CPU time with --threads 1), best of --reps",
              "rows": rows}
    for name in progress(names, "small-seq cpu", not args.no_progress):
        if name in BOUND_CASES:
            rows.append(bench_bound_case(name, BOUND_CASES[name], args.reps, args.seed,
                                         torch.get_num_threads() == 1))
        else:
            rows.append(bench_cpu_case(name, CPU_CASES[name], args.reps, args.seed,
                                       torch.get_num_threads() == 1))
        if args.json:
            args.json.write_text(json.dumps(report, indent=1))
    cpu_rows = [r for r in rows if r["case"] in CPU_CASES]
    bound_rows = [r for r in rows if r["case"] in BOUND_CASES]
    if cpu_rows:
        print_cpu_rows(cpu_rows)
    if bound_rows:
        print_bound_rows(bound_rows)
    return 0


def _main_ranking(args) -> int:
    dtype = getattr(torch, args.dtype)
    bw = copy_bandwidth()
    mm = matmul_throughput(dtype)
    rows = []
    report = {"device": torch.cuda.get_device_name(), "torch": torch.__version__,
              "copy_bandwidth_GBps": bw / 1e9, "matmul_TFLOPs": mm / 1e12, "rows": rows,
              "clock": "ours: device (graph replay); anchors: eager, host dispatch included"}
    grid = grid_rows()
    if args.cases != ",".join(CASES):  # --cases: ranking row names (row_name), any sizes
        wanted = args.cases.split(",")
        unknown = [n for n in wanted if parse_row_name(n) is None]
        if unknown:
            print(f"unknown ranking rows {unknown} (spelled like u256_c128_kv64f_hkv8_d128)",
                  file=sys.stderr)
            return 2
        grid = [parse_row_name(n) for n in wanted]
    for r in progress(grid, "small-seq ranking", not args.no_progress):
        rows.append(bench_rank_row(r, bw, dtype, args.seed, anchors=not args.no_anchors,
                                   ab=args.ab, fwd_only=args.fwd_only, matmul_flops=mm,
                                   max_logit=args.max_logit))
        report["eager_fallbacks"] = eager_fallbacks()
        if args.json:
            args.json.write_text(json.dumps(report, indent=1))
    print_rank_rows(rows, report["device"], bw, mm)
    return 0


if __name__ == "__main__":
    sys.exit(main())
