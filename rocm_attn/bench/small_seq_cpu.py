"""CPU rows of ``rocm-attn bench small-seq --device cpu``: the torch path's inference forward
(fp32, no gradient, its own gather/padding included) against what a user could run instead on
the same inputs, in the same run:

  sdpa_mask   F.scaled_dot_product_attention on padded K/V ([b, h, s, d]) with a key mask
  sdpa_fixed  the same without a mask (padded K/V as if every history were full: a lower bound
              for ragged histories, the same computation for fixed ones)
  einsum      einsum / masked softmax / einsum on the padded K/V

The anchors get their padded K/V built outside the timed region. Wall clock, best of --reps
calls; with --threads 1 also the calling thread's CPU time (steadier on a shared machine).

Bound rows (``bound_*``): one request with tight host bounds (the data's own largest counts,
as TargetAttention derives them) and with a generous one (every user's candidate bound set to
the number of candidate rows, a server's ``max_candidates=8192``), inference forward and a
training step (forward and backward); ratio = generous / tight (target <= 1.5: the torch path's
work follows the rows and pairs that exist, not segments x bound).
"""

from __future__ import annotations

import math
import time
from typing import Dict

import torch
import torch.nn.functional as F

import rocm_attn

# name: (segments b, queries per segment, h, d, history: int (fixed) or (lo, hi) uniform)
CPU_CASES = {
    "q1_b2048_h4_d64_kv1-16": (2048, 1, 4, 64, (1, 16)),
    "q1_b2048_h4_d64_kv16": (2048, 1, 4, 64, 16),
    "q1_b30720_h8_d128_kv1-16": (30720, 1, 8, 128, (1, 16)),
    "q1_b30720_h8_d128_kv16": (30720, 1, 8, 128, 16),
    "rank_u64_c512_h4_d64_kv1-200": (64, 512, 4, 64, (1, 200)),
    "rank_u64_c512_h4_d64_kv200": (64, 512, 4, 64, 200),
}
# name: (users, candidates per user, h, d, history (lo, hi) uniform, generous max_seqlen_q)
BOUND_CASES = {
    "bound_u2000_c1_h4_d32_kv1-20_q2000": (2000, 1, 4, 32, (1, 20), 2000),
    "bound_u8_c64_h4_d32_kv1-100_q8192": (8, 64, 4, 32, (1, 100), 8192),
}
DEFAULT_CPU_CASES = ("q1_b2048_h4_d64_kv1-16", "q1_b2048_h4_d64_kv16",
                     "rank_u64_c512_h4_d64_kv1-200", "rank_u64_c512_h4_d64_kv200",
                     *BOUND_CASES)


def make_cpu_inputs(b, nq, h, d, kv, gen) -> Dict[str, object]:
    if isinstance(kv, tuple):
        lens = torch.randint(kv[0], kv[1] + 1, (b,), generator=gen)
        max_kv = kv[1]
    else:
        lens = torch.full((b,), kv)
        max_kv = kv
    cu_kv = torch.zeros(b + 1, dtype=torch.int64)
    cu_kv[1:] = torch.cumsum(lens, 0)
    total = int(cu_kv[-1])
    q = torch.randn(b * nq, h, d, generator=gen)
    k = torch.randn(total, h, d, generator=gen)
    v = torch.randn(total, h, d, generator=gen)
    cu_q = torch.arange(b + 1, dtype=torch.int64) * nq
    if nq == 1:  # one query per segment: today's int32 contract
        cu_q, cu_kv = cu_q.to(torch.int32), cu_kv.to(torch.int32)
    rows = (cu_kv[:-1].long().unsqueeze(1) + torch.arange(max_kv)).clamp(max=total - 1)
    kp = k[rows].transpose(1, 2).contiguous()  # [b, h, s, d]
    vp = v[rows].transpose(1, 2).contiguous()
    mask = (torch.arange(max_kv).unsqueeze(0) < lens.unsqueeze(1))[:, None, None, :]
    qb = q.view(b, nq, h, d).transpose(1, 2)  # [b, h, nq, d]
    return dict(q=q, k=k, v=v, cu_q=cu_q, cu_kv=cu_kv, nq=nq, max_kv=max_kv, qb=qb, kp=kp,
                vp=vp, mask=mask, total=total)


def cpu_fns(x):
    scale = 1.0 / math.sqrt(x["q"].shape[-1])

    def ours():
        return rocm_attn.fused_attn_small_seq(x["q"], x["k"], x["v"], x["cu_q"], x["cu_kv"],
                                              x["nq"], x["max_kv"])

    def sdpa_mask():
        return F.scaled_dot_product_attention(x["qb"], x["kp"], x["vp"], attn_mask=x["mask"])

    def sdpa_fixed():
        return F.scaled_dot_product_attention(x["qb"], x["kp"], x["vp"])

    def einsum():
        s = torch.einsum("bhqd,bhsd->bhqs", x["qb"], x["kp"]) * scale
        s = s.masked_fill(~x["mask"], float("-inf"))
        return torch.einsum("bhqs,bhsd->bhqd", torch.softmax(s, -1), x["vp"])

    return {"ours": ours, "sdpa_mask": sdpa_mask, "sdpa_fixed": sdpa_fixed, "einsum": einsum}


def bench_cpu_case(name, spec, reps: int, seed: int, thread_clock: bool) -> dict:
    b, nq, h, d, kv = spec
    gen = torch.Generator().manual_seed(seed)
    x = make_cpu_inputs(b, nq, h, d, kv, gen)
    fns = cpu_fns(x)
    wall: Dict[str, list] = {n: [] for n in fns}
    cpu: Dict[str, list] = {n: [] for n in fns}
    with torch.no_grad():
        for fn in fns.values():
            fn()  # warm-up
        # the same numbers as the masked anchor (the check of the rows' meaning)
        ours = fns["ours"]().view(b, nq, h, d)
        ref = fns["sdpa_mask"]().transpose(1, 2)
        max_diff = (ours - ref).abs().max().item()
        for _ in range(reps):  # interleaved: a slow moment of a shared machine hits all alike
            for n, fn in fns.items():
                t0, c0 = time.perf_counter(), time.thread_time()
                fn()
                wall[n].append(time.perf_counter() - t0)
                cpu[n].append(time.thread_time() - c0)
    row = {"case": name, "b": b, "queries": nq, "h": h, "d": d, "kv": kv,
           "total_kv": x["total"], "threads": torch.get_num_threads(),
           "max_abs_diff_vs_sdpa_mask": max_diff,
           "wall_ms": {n: 1e3 * min(t) for n, t in wall.items()}}
    if thread_clock:
        row["thread_cpu_ms"] = {n: 1e3 * min(t) for n, t in cpu.items()}
    for clock in ("wall_ms", "thread_cpu_ms"):
        if clock in row:
            t = row[clock]
            best = min(v for n, v in t.items() if n != "ours")
            row[clock.replace("_ms", "_ratio_vs_best")] = t["ours"] / best
    return row


def print_cpu_rows(rows) -> None:
    print(f"\nCPU, fp32, inference forward; threads {rows[0]['threads']}; best of the reps; "
          "ratio = ours / best anchor (target <= 1.5)")
    for clock in ("wall_ms", "thread_cpu_ms"):
        if clock not in rows[0]:
            continue
        print(f"[{clock}]")
        print(f"{'case':32s} {'ours':>9s} {'sdpa_mask':>9s} {'sdpa_fixed':>10s} {'einsum':>9s}"
              f" {'ratio':>6s}")
        for r in rows:
            t = r[clock]
            ratio = r[clock.replace("_ms", "_ratio_vs_best")]
            print(f"{r['case']:32s} {t['ours']:9.1f} {t['sdpa_mask']:9.1f} "
                  f"{t['sdpa_fixed']:10.1f} {t['einsum']:9.1f} {ratio:6.2f}")


def bench_bound_case(name, spec, reps: int, seed: int, thread_clock: bool) -> dict:
    """Tight against generous bounds on one request (module docstring, bound rows)."""
    users, cands, h, d, kv, loose_q = spec
    gen = torch.Generator().manual_seed(seed)
    lens = torch.randint(kv[0], kv[1] + 1, (users,), generator=gen)
    cu_q = torch.arange(users + 1, dtype=torch.int64) * cands
    cu_kv = torch.nn.functional.pad(lens.cumsum(0), (1, 0))
    q = torch.randn(users * cands, h, d, generator=gen)
    k = torch.randn(int(cu_kv[-1]), h, d, generator=gen)
    v = torch.randn(int(cu_kv[-1]), h, d, generator=gen)
    max_kv = int(lens.max())
    # NOTE: a bound of at least 2, as TargetAttention passes (1 is the one-query form)
    bounds = {"tight": max(cands, 2), "generous": loose_q}

    def step(max_q, train):
        leaves = [t.detach().requires_grad_(train) for t in (q, k, v)]
        with torch.set_grad_enabled(train):
            out = rocm_attn.fused_attn_small_seq(*leaves, cu_q, cu_kv, max_q, max_kv)
            if train:
                out.sum().backward()
        return out

    fns = {f"{mode}_{b}": (lambda b=b, mode=mode: step(bounds[b], mode == "train"))
           for mode in ("infer", "train") for b in bounds}
    wall: Dict[str, list] = {n: [] for n in fns}
    cpu: Dict[str, list] = {n: [] for n in fns}
    for fn in fns.values():
        fn()  # warm-up
    diff = (step(bounds["tight"], False) - step(bounds["generous"], False)).abs().max().item()
    for _ in range(reps):
        for n, fn in fns.items():
            t0, c0 = time.perf_counter(), time.thread_time()
            fn()
            wall[n].append(time.perf_counter() - t0)
            cpu[n].append(time.thread_time() - c0)
    row = {"case": name, "users": users, "candidates": cands, "h": h, "d": d, "kv": kv,
           "max_seqlen_kv": max_kv, "tight_max_seqlen_q": bounds["tight"],
           "generous_max_seqlen_q": loose_q, "threads": torch.get_num_threads(),
           "max_abs_diff_generous_vs_tight": diff,
           "wall_ms": {n: 1e3 * min(t) for n, t in wall.items()}}
    if thread_clock:
        row["thread_cpu_ms"] = {n: 1e3 * min(t) for n, t in cpu.items()}
    for clock in ("wall_ms", "thread_cpu_ms"):
        if clock in row:
            t = row[clock]
            row[clock.replace("_ms", "_ratio")] = {
                mode: t[f"{mode}_generous"] / t[f"{mode}_tight"] for mode in ("infer", "train")}
    return row


def print_bound_rows(rows) -> None:
    print(f"\nCPU, fp32, tight vs generous max_seqlen_q; threads {rows[0]['threads']}; best of "
          "the reps; ratio = generous / tight (target <= 1.5)")
    for clock in ("wall_ms", "thread_cpu_ms"):
        if clock not in rows[0]:
            continue
        print(f"[{clock}]")
        print(f"{'case':36s} {'infer':>8s} {'generous':>9s} {'ratio':>6s} {'train':>8s} "
              f"{'generous':>9s} {'ratio':>6s}")
        for r in rows:
            t, ratio = r[clock], r[clock.replace("_ms", "_ratio")]
            print(f"{r['case']:36s} {t['infer_tight']:8.1f} {t['infer_generous']:9.1f} "
                  f"{ratio['infer']:6.2f} {t['train_tight']:8.1f} {t['train_generous']:9.1f} "
                  f"{ratio['train']:6.2f}")
