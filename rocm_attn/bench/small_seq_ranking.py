"""Ranking rows of ``rocm-attn bench small-seq --ranking``: many candidates (queries) per user
(segment) over the user's history, as a ranking server runs target attention (GPU, bf16).

Per row (users x candidates x history, fixed or ragged, h_q / h_kv, d), in one run:
  floor       bytes the op must move (q + out + K/V once per user, only the valid keys of a
              ragged history; the backward adds dout, out, dq, dK, dV and another read of q,
              K, V) over the device-to-device copy bandwidth measured in this run
  matrix floor  the FLOP of the op's fewest matrix products (each candidate's scores and
              P . V over the user's valid keys; the backward adds dP, dV, dK, dQ and the scores
              again, flash-attention's count: 7 products in all) over the dense matrix-product
              throughput measured in this run (common.matmul_throughput)
  roof        the larger of the two floors: no kernel can beat it (% roof = roof / ours)
  ours        fused_attn_small_seq (THD, cu_seqlens): forward, forward+backward (device time,
              graph replay; eager where capture fails, reported)
  anchors     SDPA fixed-length ([users, h, candidates, d] vs [users, h, history, d], no mask:
              for a ragged row it reads the padding as keys), SDPA with a key mask, the
              package's varlen attention (rocm_attn.attention, flash underneath), torch's
              flash varlen kernel called directly (aten._flash_attention_forward on the THD
              tensors and offsets, GQA native), and the one-query op with the history repeated
              once per candidate (history <= 16, where the repeated K/V fit in memory); eager
              (one call at a time, host included)
Then % of floor and the speed-up over the best anchor. Long-history rows (one query, 64..1024
keys, 4096 and 30720 users) follow the grid.
"""

from __future__ import annotations

import math
import re
from typing import Dict, List, Optional

import torch
import torch.nn.functional as F

import rocm_attn
from .common import eager_ms, graph_ms, rotating, time_ms, with_tuning

# The issue's grid: users x candidates x history x fixed/ragged x h_kv (h_q 8, d 128).
USERS = (256, 4096)
CANDIDATES = (1, 16, 128, 512)
HISTORIES = (16, 64, 256)
KV_HEADS = (8, 2)
H_Q = 8
# Repeating the history per candidate is an anchor only below this many bytes of K/V.
REPEAT_LIMIT_BYTES = 8 * 2**30
# Bytes the rotating input sets of a small row add up to (beyond an H100/H200 L2).
ROTATION_BYTES = 256 * 2**20
# Rows whose K + V exceed this are left out: with the anchors' padded copies and the gradients
# they would not fit an 80 GB card (30720 users x 1024 keys x 8 kv heads is 128 GiB of K + V).
MAX_KV_BYTES = 16 * 2**30
# Eager reps for anchors; graph replays for ours (common.time_ms): ~2 s per row keeps the whole
# grid under 4 minutes on an H100.
ANCHOR_REPS = 10


def grid_rows() -> List[dict]:
    rows = []
    for users in USERS:
        for cands in CANDIDATES:
            for hist in HISTORIES:
                for ragged in (False, True):
                    for h_kv in KV_HEADS:
                        rows.append(dict(users=users, cands=cands, hist=hist, ragged=ragged,
                                         h_kv=h_kv, d=128))
    rows.append(dict(users=256, cands=128, hist=64, ragged=False, h_kv=8, d=256))
    for users in (4096, 30720):
        for hist in (64, 256, 1024):
            for ragged in (False, True):
                for h_kv in (8, 2):
                    row = dict(users=users, cands=1, hist=hist, ragged=ragged, h_kv=h_kv, d=128)
                    if _kv_bytes(row) <= MAX_KV_BYTES and row not in rows:
                        rows.append(row)
    return rows


def _kv_bytes(r: dict) -> int:
    """Bytes of K and V at the full history length (bf16): the anchors' padded copies and the
    backward's dK / dV take as much again each."""
    return 2 * r["users"] * r["hist"] * r["h_kv"] * r["d"] * 2


def row_name(r: dict) -> str:
    return (f"u{r['users']}_c{r['cands']}_kv{r['hist']}{'r' if r['ragged'] else 'f'}"
            f"_hkv{r['h_kv']}_d{r['d']}")


_ROW_NAME = re.compile(r"u(\d+)_c(\d+)_kv(\d+)([fr])_hkv(\d+)_d(\d+)")


def parse_row_name(name: str) -> Optional[dict]:
    """The row a :func:`row_name` spells (any sizes, not only the grid's), or None."""
    m = _ROW_NAME.fullmatch(name)
    if m is None:
        return None
    users, cands, hist, kind, h_kv, d = m.groups()
    return dict(users=int(users), cands=int(cands), hist=int(hist), ragged=kind == "r",
                h_kv=int(h_kv), d=int(d))


def make_rank_inputs(r: dict, dtype, device, gen) -> dict:
    """One input set; lengths from the CPU generator ``gen``, values drawn on the device."""
    users, cands, hist, h_kv, d = r["users"], r["cands"], r["hist"], r["h_kv"], r["d"]
    if r["ragged"]:
        lens = torch.randint(1, hist + 1, (users,), generator=gen)
    else:
        lens = torch.full((users,), hist)
    cu_kv = torch.zeros(users + 1, dtype=torch.int32)
    cu_kv[1:] = torch.cumsum(lens, 0)
    total_kv = int(cu_kv[-1])
    q = torch.randn(users * cands, H_Q, d, device=device, dtype=dtype)
    k = torch.randn(total_kv, h_kv, d, device=device, dtype=dtype)
    v = torch.randn(total_kv, h_kv, d, device=device, dtype=dtype)
    cu_q = (torch.arange(users + 1, dtype=torch.int32) * cands).to(device)
    return dict(q=q, k=k, v=v, cu_q=cu_q, cu_kv=cu_kv.to(device), lens=lens.to(device),
                users=users, cands=cands, hist=hist, total_kv=total_kv, h_kv=h_kv)


# Matrix products of the fewest a call needs per (candidate, q head, valid key): the forward's
# scores and P . V; forward+backward adds the backward's dP, dV, dK and dQ and its scores again
# (recomputed from the saved LSE rather than stored: P would be rows x keys more bytes).
FWD_PRODUCTS = 2
FWD_BWD_PRODUCTS = 7


def matrix_flops(x: dict, d: int):
    """FLOP of one product over every (candidate, q head, valid key) pair of an input set (a
    multiply-add = 2 FLOP over the head dim), times the forward's and forward+backward's product
    counts: (forward, forward+backward)."""
    per_product = 2.0 * x["cands"] * x["total_kv"] * H_Q * d
    return FWD_PRODUCTS * per_product, FWD_BWD_PRODUCTS * per_product


def floor_bytes(x: dict, elem: int = 2):
    qb = x["q"].numel() * elem
    kvb = 2 * x["k"].numel() * elem
    fwd = qb + qb + kvb  # read q, K, V; write out
    bwd = (qb + kvb + qb + qb) + (qb + kvb)  # read q, K, V, out, dout; write dq, dK, dV
    return fwd, fwd + bwd


def _ours(x, backward: bool, max_logit: bool = False):
    """Our call on input set x; ``max_logit``: with return_max_logit=True (its out is what the
    backward differentiates)."""
    def fwd():
        res = rocm_attn.fused_attn_small_seq(x["q"], x["k"], x["v"], x["cu_q"], x["cu_kv"],
                                             x["cands"], x["hist"], return_max_logit=max_logit)
        return res[0] if max_logit else res

    return _with_backward(fwd, (x["q"], x["k"], x["v"])) if backward else fwd


def _padded(x):
    """[users, h_q, cands, d] queries and [users, h_q, hist, d] keys/values (GQA expanded),
    with the key mask [users, 1, 1, hist]."""
    users, cands, hist = x["users"], x["cands"], x["hist"]
    group = H_Q // x["h_kv"]
    rows = (x["cu_kv"][:-1].long().unsqueeze(1)
            + torch.arange(hist, device=x["q"].device)).clamp(max=x["total_kv"] - 1)
    kp = x["k"][rows].repeat_interleave(group, dim=2).transpose(1, 2).contiguous()
    vp = x["v"][rows].repeat_interleave(group, dim=2).transpose(1, 2).contiguous()
    qb = x["q"].view(users, cands, H_Q, -1).transpose(1, 2).contiguous()
    mask = (torch.arange(hist, device=qb.device).unsqueeze(0)
            < x["lens"].unsqueeze(1))[:, None, None, :]
    return qb, kp, vp, mask


def _anchors(x, backward: bool) -> Dict[str, object]:
    qb, kp, vp, mask = _padded(x)

    def sdpa_fixed():
        return F.scaled_dot_product_attention(qb, kp, vp)

    def sdpa_mask():
        return F.scaled_dot_product_attention(qb, kp, vp, attn_mask=mask)

    def varlen():
        return rocm_attn.attention(x["q"], x["k"], x["v"], x["cu_q"], x["cu_kv"], x["cands"],
                                   x["hist"])

    def flash_varlen():
        return torch.ops.aten._flash_attention_forward(
            x["q"], x["k"], x["v"], x["cu_q"], x["cu_kv"], x["cands"], x["hist"], 0.0, False,
            False)[0]

    fns = {"sdpa_fixed": (sdpa_fixed, (qb, kp, vp)), "sdpa_mask": (sdpa_mask, (qb, kp, vp)),
           "varlen": (varlen, (x["q"], x["k"], x["v"])),
           "flash_varlen": (flash_varlen, (x["q"], x["k"], x["v"]))}
    rep_bytes = x["users"] * x["cands"] * x["hist"] * 2 * x["k"].shape[1] * x["k"].shape[2] * 2
    if x["hist"] <= 16 and x["cands"] > 1 and rep_bytes <= REPEAT_LIMIT_BYTES:
        idx = torch.repeat_interleave(torch.arange(x["users"], device=qb.device), x["cands"])
        lens = x["lens"][idx]
        cu = torch.zeros(lens.numel() + 1, dtype=torch.int32, device=qb.device)
        cu[1:] = torch.cumsum(lens, 0)
        rows = torch.repeat_interleave(x["cu_kv"][:-1].long()[idx], lens) + (
            torch.arange(int(cu[-1]), device=qb.device)
            - torch.repeat_interleave(cu[:-1].long(), lens))
        kr, vr = x["k"][rows], x["v"][rows]
        cu_q1 = torch.arange(lens.numel() + 1, dtype=torch.int32, device=qb.device)

        def repeated():
            return rocm_attn.fused_attn_small_seq(x["q"], kr, vr, cu_q1, cu, 1, x["hist"])

        fns["q1_repeated"] = (repeated, (x["q"], kr, vr))
    return {n: (_with_backward(f, leaves) if backward else f) for n, (f, leaves) in fns.items()}


def _with_backward(fwd, leaves):
    leaves = [t.requires_grad_() for t in leaves]
    probe = fwd()
    dout = torch.randn_like(probe)

    def step():
        torch.autograd.grad(fwd(), leaves, dout)

    return step


def _path_of(r: dict, backward: bool) -> str:
    """Which implementation serves our op on this row (logged too, at INFO)."""
    from .. import ops, small_seq, small_seq_flash

    if r["cands"] == 1 and r["hist"] <= small_seq.MAX_SEQLEN_KV:
        return "one-query kernels"
    long_history = r["hist"] > small_seq.KERNEL_MAX_SEQLEN_KV
    if (small_seq_flash.route_problem() is None
            and small_seq_flash.route_selects(r["d"], r["cands"], r["hist"], backward,
                                              long_history, group=H_Q // r["h_kv"])):
        return "flash route (torch's flash varlen kernels, contract kernels)"
    if long_history:
        return "rocm_attn.attention (history beyond the tiled kernels)"
    return "tiled kernels" if ops.HAS_TILED_OPS else "torch path (this build has no tiled kernels)"


def _device_ms(fn, floor_ms: float, name: str) -> float:
    """Device time per call by graph replay (fewer calls per graph for long calls, so that the
    whole grid stays within minutes); eager where capture fails (common.time_ms reports it)."""
    if floor_ms > 0.2:
        try:
            return graph_ms(fn, reps=5, warmup=2, calls=max(5, getattr(fn, "num_sets", 1)))
        except Exception:  # noqa: BLE001  (time_ms retries and reports the fallback)
            pass
    return time_ms(fn, reps=9, warmup=2, name=name)


def bench_rank_row(r: dict, bw: float, dtype, seed: int, anchors: bool = True, ab=(),
                   fwd_only: bool = False, matmul_flops: float = 0.0,
                   max_logit: bool = False) -> dict:
    """One row timed (see the module's docstring); `matmul_flops` (FLOP/s, this run's
    common.matmul_throughput) adds the matrix floor and % roof, left out where it is 0;
    `max_logit` times ours again with return_max_logit=True on the same inputs (its cost)."""
    gen = torch.Generator().manual_seed(seed)
    torch.manual_seed(seed)
    probe = make_rank_inputs(r, dtype, "cuda", gen)
    fwd_bytes, fb_bytes = floor_bytes(probe)
    fwd_flops, fb_flops = matrix_flops(probe, r["d"])
    # input sets rotate so that the working set exceeds L2 (small rows only)
    n_sets = min(8, max(1, math.ceil(ROTATION_BYTES / max(fwd_bytes, 1))))
    sets = [probe] + [make_rank_inputs(r, dtype, "cuda", gen) for _ in range(n_sets - 1)]
    out = dict(r, case=row_name(r), total_kv=probe["total_kv"], input_sets=n_sets)
    modes = (("fwd", False, fwd_bytes, fwd_flops), ("fwdbwd", True, fb_bytes, fb_flops))
    for mode, backward, nbytes, flops in modes[:1] if fwd_only else modes:
        floor = nbytes / bw * 1e3
        res: Dict[str, object] = {"floor_ms": floor, "anchors": {}, "path": _path_of(r, backward)}
        if matmul_flops > 0:
            res["matrix_floor_ms"] = flops / matmul_flops * 1e3
        t = None
        try:
            t = _device_ms(rotating([_ours(x, backward) for x in sets]), floor,
                           f"{out['case']}/{mode}")
            res.update(ms=t, pct_floor=100 * floor / t)
            if matmul_flops > 0:
                res["pct_roof"] = 100 * max(floor, res["matrix_floor_ms"]) / t
        except Exception as exc:  # e.g. a build without the tiled kernels
            res["error"] = f"{type(exc).__name__}: {str(exc)[:200]}"
        for setting in ab:  # ours again on the same inputs with a launch tuning value set
            ta = with_tuning(setting, lambda: _device_ms(
                rotating([_ours(x, backward) for x in sets]), floor, f"{out['case']}/{mode}"))
            res.setdefault("ab", {})[setting] = {"ms": ta, "pct_floor": 100 * floor / ta}
        if max_logit and t:
            tm = _device_ms(rotating([_ours(x, backward, True) for x in sets]), floor,
                            f"{out['case']}/{mode}/max_logit")
            res["max_logit"] = {"ms": tm, "cost_pct": 100 * (tm - t) / t}
        try:
            per_set = [_anchors(x, backward) for x in sets[:2]] if anchors else []
            names = list(per_set[0]) if per_set else []
        except Exception as exc:  # noqa: BLE001
            per_set, names = [], []
            res["anchors"]["setup"] = {"error": f"{type(exc).__name__}: {str(exc)[:200]}"}
        for name in names:
            try:
                ta = eager_ms(rotating([a[name] for a in per_set]), reps=ANCHOR_REPS, warmup=2)
                res["anchors"][name] = {"ms": ta, "pct_floor": 100 * floor / ta}
            except Exception as exc:  # noqa: BLE001  (an anchor this torch lacks)
                res["anchors"][name] = {"error": f"{type(exc).__name__}: {str(exc)[:200]}"}
        del per_set
        ok = [a["ms"] for a in res["anchors"].values() if "ms" in a]
        res["best_anchor_ms"] = min(ok) if ok else None
        res["speedup_vs_best"] = min(ok) / t if ok and t else None
        out[mode] = res
    del sets, probe
    torch.cuda.empty_cache()
    return out


# Short names of _path_of's answers for the table's path column.
_PATH_CODES = {"one-query kernels": "1q", "tiled kernels": "tiled",
               "flash route (torch's flash varlen kernels, contract kernels)": "flash",
               "rocm_attn.attention (history beyond the tiled kernels)": "varlen"}


def _path_code(m: dict) -> str:
    return _PATH_CODES.get(m.get("path", ""), "torch") if m.get("path") else "-"


def print_rank_rows(rows, device: str, bw: float, matmul_flops: float = 0.0) -> None:
    mm = f"  matrix products {matmul_flops / 1e12:.0f} TFLOP/s" if matmul_flops else ""
    print(f"\n{device}  copy bandwidth {bw / 1e9:.0f} GB/s{mm}  bf16  h_q {H_Q}: ranking rows "
          "(ours: device time; anchors: eager; %rf: % of the roof, the larger of the byte and "
          "matrix floors)")
    paths = sorted({r[m]["path"] for r in rows for m in ("fwd", "fwdbwd") if m in r})
    print("ours served by (path: fwd/fwd+bwd): "
          + "; ".join(f"{_PATH_CODES.get(p, 'torch')} = {p}" for p in paths))
    print(f"{'case':28s} {'path':>11s} {'floor us':>8s} {'fwd us':>8s} {'%fl':>4s} {'%rf':>4s} "
          f"{'x best':>6s} {'fb us':>8s} {'%fl':>4s} {'%rf':>4s} {'x best':>6s}  "
          "anchors fwd us (% floor)")
    for r in rows:
        f, fb = r["fwd"], r.get("fwdbwd", {"anchors": {}})
        anchors = " ".join(
            f"{n}={a['ms'] * 1e3:.0f}({a['pct_floor']:.0f}%)" if "ms" in a else f"{n}=n/a"
            for n, a in f["anchors"].items())

        def cell(m, key, fmt, scale=1.0):
            v: Optional[float] = m.get(key)
            return format(v * scale, fmt) if v is not None else "-"

        path = f"{_path_code(f)}/{_path_code(fb)}"
        print(f"{r['case']:28s} {path:>11s} {f['floor_ms'] * 1e3:8.0f} "
              f"{cell(f, 'ms', '.0f', 1e3):>8s} "
              f"{cell(f, 'pct_floor', '.0f'):>4s} {cell(f, 'pct_roof', '.0f'):>4s} "
              f"{cell(f, 'speedup_vs_best', '.2f'):>6s} "
              f"{cell(fb, 'ms', '.0f', 1e3):>8s} {cell(fb, 'pct_floor', '.0f'):>4s} "
              f"{cell(fb, 'pct_roof', '.0f'):>4s} {cell(fb, 'speedup_vs_best', '.2f'):>6s}"
              f"  {anchors}")
        if "max_logit" in f:
            b = fb.get("max_logit")
            back = (f", fwd+bwd {b['ms'] * 1e3:.0f} us ({b['cost_pct']:+.1f}%)" if b else "")
            print(f"{'':28s} return_max_logit: fwd {f['max_logit']['ms'] * 1e3:.0f} us "
                  f"({f['max_logit']['cost_pct']:+.1f}%){back}")
        for setting, a in f.get("ab", {}).items():
            b = fb.get("ab", {}).get(setting)
            back = f", fwd+bwd {b['ms'] * 1e3:.0f} us ({b['pct_floor']:.0f}%)" if b else ""
            print(f"{'':28s} {setting}: fwd {a['ms'] * 1e3:.0f} us ({a['pct_floor']:.0f}%){back}")
