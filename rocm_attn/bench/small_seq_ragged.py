"""Ragged request batches: ``rocm-attn bench small-seq --ranking --ragged`` (GPU).

Each row (rocm_attn/bench/ragged_rows.py) is a batch of users whose candidate counts and
history lengths are drawn per user (the ranking issue's eight batches, and batches drawn from
uniform, log-normal and Zipf-like distributions), with its heads, head dim and dtype. Per row,
forward and forward+backward, in one run:

  floor     the larger of the bytes floor (q, out and each history's K / V once; the backward
            adds dout, out, dq, dK, dV and another read of q, K, V: the ranking grid's count)
            over the copy bandwidth, and the matrix floor (the fewest products' FLOP) over the
            matrix-product rate of the row's dtype, both measured in this run
  ours      rocm_attn.fused_attn_small_seq on the THD tensors and offsets
  anchors   flash_varlen    torch.ops.aten._flash_attention_forward with cu_seqlens (forward
                            only: it has no autograd), GQA native
            varlen_attn     torch.nn.attention.varlen.varlen_attn, with autograd (GQA native
                            where this torch takes enable_gqa, else K / V repeated per group
                            outside the timing); absent from older torch: reported, not fatal
            sdpa_cudnn      F.scaled_dot_product_attention on padded tensors with a key mask,
                            asked for CUDNN_ATTENTION only (n/a where cuDNN refuses the inputs)
            sdpa_efficient  the same asked for EFFICIENT_ATTENTION only (the kernel SDPA takes
                            for a masked call where cuDNN does not)
            Padding, the mask and the GQA expansion are built before the timing. The padded
            columns are left out where their tensors would not fit beside the THD ones.

Every column of a row and mode is timed on the same clock: all by graph replay when each of
them captures, otherwise all eagerly (one call between two events, host dispatch included);
the row's ``clock`` says which (``--clock graph|eager`` forces one). Input sets rotate so that
the working set exceeds L2. Each column's output (and our and varlen_attn's gradients) is
checked against a float64 oracle on a few users of the row (ragged_check.py); a failed check of
ours makes the run exit 1.
"""

from __future__ import annotations

import gc
import inspect
import json
import logging
import math
import re
import sys
import time
import warnings
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import torch
import torch.nn.functional as F

import rocm_attn

from . import ragged_check
from .common import copy_bandwidth, eager_ms, graph_ms, matmul_throughput, with_tuning
from .progress import progress
from .ragged_rows import (
    ROWS,
    Lengths,
    Row,
    draw_lengths,
    floors,
    padded_bytes,
    parse_row,
    row_seed,
    sample_users,
)

# The SDPA columns: each asks sdpa_kernel for one backend.
SDPA_COLUMNS = (("sdpa_cudnn", "CUDNN_ATTENTION"), ("sdpa_efficient", "EFFICIENT_ATTENTION"))
FWD_ANCHORS = ("flash_varlen", "varlen_attn", "sdpa_cudnn", "sdpa_efficient")
FWD_BWD_ANCHORS = ("varlen_attn", "sdpa_cudnn", "sdpa_efficient")
MODES = (("fwd", False), ("fwdbwd", True))
# Bytes the rotating input sets of a row add up to at least (beyond an H100 / H200 L2), and the
# most sets.
ROTATION_BYTES = 256 * 2**20
MAX_SETS = 4
# The padded columns run where their tensors (every set's) take at most this share of the
# device's free memory after the THD inputs are made.
PADDED_FREE_SHARE = 0.5
# Users of a row the float64 oracle checks.
CHECK_USERS = 4
# Timing: graph replays (calls per graph: more for short calls, so the replay's own launch is
# amortised) or eager calls, each after common's settling.
GRAPH_REPS = 5
EAGER_REPS = 10
SHORT_MS = 0.2


def make_set(row: Row, n: Lengths, device, seed: int) -> dict:
    """One input set: THD q, K, V and dout of the row's drawn lengths, values from ``seed``."""
    gen = torch.Generator(device=device).manual_seed(seed)
    dt = row.torch_dtype

    def randn(*shape):
        return torch.randn(*shape, generator=gen, device=device, dtype=dt)

    cu_q, cu_kv = n.offsets()
    return dict(q=randn(n.total_q, row.h_q, row.d), k=randn(n.total_kv, row.h_kv, row.d),
                v=randn(n.total_kv, row.h_kv, row.d), dout=randn(n.total_q, row.h_q, row.d),
                cu_q=cu_q.to(device), cu_kv=cu_kv.to(device), cu_q_cpu=cu_q, cu_kv_cpu=cu_kv)


def _pad_heads_first(t: torch.Tensor, counts: torch.Tensor, cu: torch.Tensor, width: int,
                     repeat: int = 1) -> torch.Tensor:
    """THD ``[total, h, d]`` -> ``[users, h * repeat, width, d]`` (each head repeated ``repeat``
    times, as GQA expands), zeros past each user's count; written in place, no padded copy."""
    users = counts.numel()
    dev = t.device
    user = torch.repeat_interleave(torch.arange(users), counts).to(dev)
    pos = (torch.arange(t.shape[0]) - torch.repeat_interleave(cu[:-1].long(), counts)).to(dev)
    if repeat > 1:
        t = t.repeat_interleave(repeat, dim=1)
    out = t.new_zeros(users, t.shape[1], width, t.shape[2])
    out[user, :, pos] = t  # advanced indices around a slice: the indexed view is [total, h, d]
    return out


def padded_set(row: Row, n: Lengths, x: dict) -> dict:
    """The set as SDPA takes it: ``[users, h_q, max_q, d]`` queries and dout, ``[users, h_q,
    max_kv, d]`` keys / values (GQA expanded), a bool key mask ``[users, 1, 1, max_kv]``."""
    group = row.h_q // row.h_kv
    cu_q, cu_kv = x["cu_q_cpu"], x["cu_kv_cpu"]
    mask = (torch.arange(n.max_kv).unsqueeze(0) < n.keys.unsqueeze(1))[:, None, None, :]
    return dict(q=_pad_heads_first(x["q"], n.cands, cu_q, n.max_q),
                dout=_pad_heads_first(x["dout"], n.cands, cu_q, n.max_q),
                k=_pad_heads_first(x["k"], n.keys, cu_kv, n.max_kv, group),
                v=_pad_heads_first(x["v"], n.keys, cu_kv, n.max_kv, group),
                mask=mask.to(x["q"].device))


class Column:
    """One timed column on one input set: ``fwd()`` returns the output; ``leaves`` are the
    tensors the backward differentiates; ``dout`` its upstream gradient; ``layout`` "thd" where
    output and gradients are the THD tensors' (the float64 check reads them as such)."""

    def __init__(self, fwd: Callable[[], torch.Tensor], leaves: Sequence[torch.Tensor],
                 dout: torch.Tensor, layout: str = "thd"):
        self.fwd, self.leaves, self.dout, self.layout = fwd, list(leaves), dout, layout

    def step(self, backward: bool) -> Callable[[], object]:
        if not backward:
            return self.fwd

        def fwd_bwd():
            return torch.autograd.grad(self.fwd(), self.leaves, self.dout)

        return fwd_bwd


def _leaves(backward: bool, *ts: torch.Tensor) -> List[torch.Tensor]:
    """The tensors a column reads: detached views sharing storage, differentiable leaves for
    forward+backward (so that a forward column is never called with requires_grad inputs,
    which can change the path a call takes)."""
    return [t.detach().requires_grad_(backward) for t in ts]


def ours_column(row: Row, n: Lengths, x: dict, backward: bool) -> Column:
    q, k, v = _leaves(backward, x["q"], x["k"], x["v"])

    def fwd():
        return rocm_attn.fused_attn_small_seq(q, k, v, cu_seqlens_q=x["cu_q"],
                                              cu_seqlens_kv=x["cu_kv"], max_seqlen_q=n.max_q,
                                              max_seqlen_kv=n.max_kv)

    return Column(fwd, (q, k, v), x["dout"])


# The prefix of an A/B column's name: ours with launch tuning values set (--ab).
AB_PREFIX = "ab "


def ab_column(row: Row, n: Lengths, x: dict, backward: bool, setting: str) -> Column:
    """Ours with the launch tuning ``setting`` (NAME=VALUE[+NAME=VALUE]) set around every call,
    so that a graph captures the plan it picks; timed on the row's clock beside ours and
    checked as ours is."""
    col = ours_column(row, n, x, backward)
    plain = col.fwd
    col.fwd = lambda: with_tuning(setting, plain)
    return col


def flash_varlen_forward(q, k, v, cu_q, cu_kv, max_q: int, max_kv: int) -> torch.Tensor:
    """torch's flash varlen forward on THD tensors and int32 offsets (GQA native)."""
    return torch.ops.aten._flash_attention_forward(q, k, v, cu_q, cu_kv, max_q, max_kv, 0.0,
                                                   False, False)[0]


def varlen_attn_fn():
    """torch.nn.attention.varlen.varlen_attn and whether it takes ``enable_gqa``; raises where
    this torch has no varlen_attn."""
    try:
        from torch.nn.attention.varlen import varlen_attn
    except ImportError as exc:
        raise RuntimeError(f"torch {torch.__version__} has no "
                           "torch.nn.attention.varlen.varlen_attn") from exc
    return varlen_attn, "enable_gqa" in inspect.signature(varlen_attn).parameters


def anchor_columns(row: Row, n: Lengths, x: dict, padded: Optional[dict],
                   backward: bool) -> Dict[str, object]:
    """Each anchor's Column, or the reason it is not run (a string)."""
    cols: Dict[str, object] = {}
    group = row.h_q // row.h_kv
    if not backward:
        fq, fk, fv = _leaves(False, x["q"], x["k"], x["v"])
        cols["flash_varlen"] = Column(lambda: flash_varlen_forward(
            fq, fk, fv, x["cu_q"], x["cu_kv"], n.max_q, n.max_kv), (fq, fk, fv), x["dout"])
    try:
        varlen_attn, takes_gqa = varlen_attn_fn()
        kk, vv = x["k"], x["v"]
        kw, layout = {}, "thd"
        if group > 1 and takes_gqa:
            kw["enable_gqa"] = True
        elif group > 1:  # an older varlen_attn: heads repeated outside the timing
            kk, vv = kk.repeat_interleave(group, dim=1), vv.repeat_interleave(group, dim=1)
            layout = "thd, kv heads repeated"  # its dK / dV are per q head: not checked
        q, k, v = _leaves(backward, x["q"], kk, vv)
        cols["varlen_attn"] = Column(lambda: varlen_attn(q, k, v, x["cu_q"], x["cu_kv"], n.max_q,
                                                         n.max_kv, **kw), (q, k, v), x["dout"],
                                     layout=layout)
    except RuntimeError as exc:
        cols["varlen_attn"] = str(exc)
    from torch.nn.attention import SDPBackend, sdpa_kernel

    for name, backend_name in SDPA_COLUMNS:
        backend = getattr(SDPBackend, backend_name)
        if isinstance(padded, str):
            cols[name] = padded
            continue
        qp, kp, vp = _leaves(backward, padded["q"], padded["k"], padded["v"])

        def fwd(qp=qp, kp=kp, vp=vp, backend=backend):
            with sdpa_kernel([backend]):
                return F.scaled_dot_product_attention(qp, kp, vp, attn_mask=padded["mask"])

        cols[name] = Column(fwd, (qp, kp, vp), padded["dout"], layout="padded")
    return cols


def sdpa_default(padded: dict, backward: bool) -> str:
    """The backend SDPA picks by itself for the padded set (sdpa_kernel unrestricted), e.g.
    "CUDNN_ATTENTION": which SDPA column a caller who names none gets."""
    from torch.nn.attention import SDPBackend

    q, k, v = _leaves(backward, padded["q"], padded["k"], padded["v"])
    try:
        return SDPBackend(torch._fused_sdp_choice(q, k, v, padded["mask"], 0.0, False)).name
    except Exception as exc:  # noqa: BLE001  (a private function: may change between releases)
        return f"? ({type(exc).__name__})"


def _release(collect: bool = False) -> None:
    """Hands freed blocks back to the device; ``collect`` first collects reference cycles (a
    failed capture's frames hold its graph and memory pool)."""
    if collect:
        gc.collect()
    if torch.cuda.is_available():
        torch.cuda.synchronize()
        torch.cuda.empty_cache()


def device_name() -> str:
    return torch.cuda.get_device_name()


def free_bytes(device) -> int:
    """Free memory of the device (bytes)."""
    return torch.cuda.mem_get_info(device)[0]


# Columns (per mode) that failed a graph capture in this process: later rows of the mode go to
# the eager clock at once rather than failing the capture again.
_incapturable: Dict[str, set] = {"fwd": set(), "fwdbwd": set()}


def time_columns(steps: Dict[str, Callable[[], object]], clock: str, mode: str, short: bool,
                 calls: int) -> Tuple[str, Dict[str, dict]]:
    """Times every step on one clock: ("graph" | "eager", {name: {"ms"} or {"error"}}).

    clock "auto": graph replay when every step captures, else all eagerly; "graph": graph
    replay, a step that does not capture gets an error; "eager": all eagerly."""
    results: Dict[str, dict] = {}
    if clock == "auto" and _incapturable[mode] & set(steps):
        clock = "eager"
    if clock in ("auto", "graph"):
        calls = max(calls, 20 if short else 5)
        failed = None
        for name, step in steps.items():
            oom = False
            try:
                results[name] = {"ms": graph_ms(step, reps=GRAPH_REPS, warmup=2, calls=calls)}
            except torch.OutOfMemoryError as exc:  # the column's size, not its capture
                results[name] = {"error": f"OutOfMemoryError: {str(exc)[:160]}"}
                oom = True
            except Exception as exc:  # noqa: BLE001  (a capture this step does not allow)
                failed = (name, f"{type(exc).__name__}: {str(exc)[:160]}")
            if oom:
                _release(collect=True)
            if failed:
                # NOTE: released outside the except block, so that the failed capture's frames
                # (its graph and memory pool) are gone first (common.time_ms)
                _release(collect=True)
                if clock == "graph":
                    results[failed[0]] = {"error": f"not capturable: {failed[1]}"}
                    failed = None
                    continue
                _incapturable[mode].add(failed[0])
                print(f"note: {mode} {failed[0]} not capturable ({failed[1]}): the row's "
                      f"columns are timed eagerly", file=sys.stderr)
                break
        if not failed:
            return "graph", results
        results = {}
    for name, step in steps.items():
        try:
            results[name] = {"ms": eager_ms(step, reps=EAGER_REPS, warmup=2)}
        except Exception as exc:  # noqa: BLE001  (e.g. out of memory: the column, not the run)
            results[name] = {"error": f"{type(exc).__name__}: {str(exc)[:200]}"}
            _release(collect=True)
    return "eager", results


def rotating_steps(cols_per_set: List[Dict[str, object]], backward: bool) -> Dict[str, Callable]:
    """Per column a callable that cycles over the sets' steps (defeats L2 reuse)."""
    steps = {}
    for name, col in cols_per_set[0].items():
        if not isinstance(col, Column):
            continue
        fns = [c[name].step(backward) for c in cols_per_set]
        state = {"i": 0}

        def call(fns=fns, state=state):
            fn = fns[state["i"] % len(fns)]
            state["i"] += 1
            return fn()

        call.column = name  # for a reader of the steps (tests)
        steps[name] = call
    return steps


_PATH_CODE = [(re.compile(r"flash route"), "flash"),
              (re.compile(r"rocm_attn\.attention"), "varlen"),
              (re.compile(r"compiled ([\w-]+) kernels"), None),
              (re.compile(r"torch path"), "torch")]


def path_code(messages: Sequence[str]) -> str:
    """The short name of the path that served our call, from its log messages ("flash",
    "varlen", "tiled", "one-query", "torch", or the message itself where none matches)."""
    for msg in messages:
        for pattern, code in _PATH_CODE:
            m = pattern.search(msg)
            if m:
                return code or m.group(1)
    return messages[-1][:60] if messages else "?"


class _Collect(logging.Handler):
    def __init__(self):
        super().__init__(logging.DEBUG)
        self.messages: List[str] = []

    def emit(self, record):
        self.messages.append(record.getMessage())


def probe_with_path(col: Column, backward: bool):
    """One untimed call of our column: its result (output, or (output, grads)) and the path
    that served it, read from rocm_attn's log (every call logs its choice at DEBUG)."""
    logger = logging.getLogger("rocm_attn")
    handler, level = _Collect(), logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.DEBUG)
    try:
        result = probe(col, backward)
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)
    return result, path_code(handler.messages)


def probe(col: Column, backward: bool):
    """One untimed call: the output, or (output, grads) for forward+backward."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # SDPA's notes on why a backend was not used
        out = col.fwd()
        if not backward:
            return out.detach()
        return out.detach(), torch.autograd.grad(out, col.leaves, col.dout)


def _oracle(row: Row, n: Lengths, x: dict, users: List[int], backward: bool) -> dict:
    refs = {}
    for u in users:
        rq, rk = ragged_check.user_slices(x["cu_q_cpu"], x["cu_kv_cpu"], u)
        refs[u] = ragged_check.oracle_user(x["q"][rq], x["k"][rk], x["v"][rk],
                                           x["dout"][rq] if backward else None)
    return refs


def bench_row(row: Row, bw: float, matmul: Dict[str, float], seed: int, anchors: bool = True,
              fwd_only: bool = False, clock: str = "auto", device: str = "cuda",
              ab: Sequence[str] = ()) -> dict:
    """One row, both modes (see the module's docstring); ``matmul`` maps a row dtype to this
    run's matrix-product rate (FLOP/s); ``ab``: tuning settings whose A/B columns (ours with
    the setting) are timed beside ours, reported under the mode's "ab" (not anchors)."""
    n = draw_lengths(row, seed)
    base = row_seed(row, seed)
    fwd_floor, fb_floor = floors(row, n, bw, matmul[row.dtype])
    fwd_bytes = fwd_floor.bytes_ms * 1e-3 * bw
    n_sets = min(MAX_SETS, max(1, math.ceil(ROTATION_BYTES / max(fwd_bytes, 1))))
    sets = [make_set(row, n, device, base + i) for i in range(n_sets)]
    users = sample_users(n, CHECK_USERS, torch.Generator().manual_seed(base))
    out = {"case": row.name, "label": row.label, "ragged": row.cands.ragged or row.keys.ragged,
           "users": row.users, "h_q": row.h_q,
           "h_kv": row.h_kv, "heads": row.heads, "d": row.d, "dtype": row.dtype,
           "total_q": n.total_q, "total_kv": n.total_kv, "max_q": n.max_q, "max_kv": n.max_kv,
           "pairs": n.pairs, "input_sets": n_sets, "checked_users": users}
    modes = MODES[:1] if fwd_only else MODES
    for (mode, backward), floor in zip(modes, (fwd_floor, fb_floor)):
        need = padded_bytes(row, n, backward) * n_sets
        free = free_bytes(device)
        padded = [None] * n_sets
        if not anchors:
            pass
        elif need > PADDED_FREE_SHARE * free:
            padded = [f"skipped: padded tensors {need / 2**30:.1f} GiB, free {free / 2**30:.1f}"
                      " GiB"] * n_sets
        else:
            padded = [padded_set(row, n, x) for x in sets]
        cols = []
        for x, p in zip(sets, padded):
            c = {"ours": ours_column(row, n, x, backward)}
            c.update({AB_PREFIX + a: ab_column(row, n, x, backward, a) for a in ab})
            if anchors:
                c.update(anchor_columns(row, n, x, p, backward))
            cols.append(c)
        res: Dict[str, object] = {"floor_ms": floor.ms, "bytes_floor_ms": floor.bytes_ms,
                                  "matrix_floor_ms": floor.matrix_ms, "bound": floor.bound}
        if isinstance(padded[0], dict):
            res["sdpa_default"] = sdpa_default(padded[0], backward)
        # one untimed call of each column on set 0: its errors, our path, the check
        refs = _oracle(row, n, sets[0], users, backward)
        columns: Dict[str, dict] = {name: {} for name in cols[0]}
        outs, grads = {}, {}
        for name, col in cols[0].items():
            if not isinstance(col, Column):
                columns[name] = {"error": col}
                continue
            try:
                if name == "ours":
                    result, res["path"] = probe_with_path(col, backward)
                elif name.startswith(AB_PREFIX):
                    result, columns[name]["path"] = probe_with_path(col, backward)
                else:
                    result = probe(col, backward)
            except Exception as exc:  # noqa: BLE001  (a column this torch or input refuses)
                columns[name] = {"error": f"{type(exc).__name__}: {str(exc)[:200]}"}
                for c in cols:
                    c[name] = columns[name]["error"]
                continue
            outs[name] = result[0] if backward else result
            if backward and col.layout == "thd":
                grads[name] = result[1]
            del result
        ref_out = {u: r[0] for u, r in refs.items()}
        check = ragged_check.check_outputs(outs, ref_out, sets[0]["cu_q_cpu"], n.cands,
                                           row.torch_dtype)
        for name, g in grads.items():
            check[name]["grads"] = ragged_check.check_grads(
                g, {u: r[1:] for u, r in refs.items()}, sets[0]["cu_q_cpu"],
                sets[0]["cu_kv_cpu"], row.torch_dtype)
            check[name]["ok"] = check[name]["ok"] and check[name]["grads"]["ok"]
        del outs, grads, refs
        _release()
        steps = rotating_steps(cols, backward)
        res["clock"], timed = time_columns(steps, clock, mode, floor.ms < SHORT_MS, n_sets)
        for name, t in timed.items():
            columns.setdefault(name, {}).update(t)
        for name, c in check.items():
            columns[name]["check"] = c
        res["columns"] = columns
        ours = columns.get("ours", {})
        if "ms" in ours:
            res["ms"] = ours["ms"]
            res["pct_floor"] = 100 * floor.ms / ours["ms"]
            timed_anchors = {a: c["ms"] for a, c in columns.items()
                             if a != "ours" and not a.startswith(AB_PREFIX) and "ms" in c}
            res["ab"] = {a[len(AB_PREFIX):]: {"ms": c["ms"], "x_ours": ours["ms"] / c["ms"],
                                              "path": c.get("path", "?")}
                         for a, c in columns.items() if a.startswith(AB_PREFIX) and "ms" in c}
            res["speedup"] = {a: ms / ours["ms"] for a, ms in timed_anchors.items()}
            if timed_anchors:
                best = min(timed_anchors, key=timed_anchors.get)
                res.update(best_anchor=best, best_anchor_ms=timed_anchors[best],
                           speedup_vs_best=timed_anchors[best] / ours["ms"])
        out[mode] = res
        del cols, steps, padded
        _release()
    del sets
    _release()
    return out


def checks_failed(row: dict) -> List[str]:
    """``mode/column`` of each failed check in a row's result."""
    return [f"{mode}/{name}" for mode, _ in MODES for name, c in
            (row.get(mode) or {}).get("columns", {}).items()
            if "check" in c and not c["check"]["ok"]]


def _mark(m: dict, name: str) -> str:
    """"!" after a column whose float64 check failed."""
    c = m["columns"].get(name, {})
    return "!" if "check" in c and not c["check"]["ok"] else ""


def _x_cell(m: dict, name: str) -> str:
    if name not in m.get("speedup", {}):
        return "n/a"
    return f"{m['speedup'][name]:.2f}{_mark(m, name)}"


def print_rows(report: dict) -> None:
    rows = report["rows"]
    mm = ", ".join(f"{k} {v:.0f}" for k, v in report["matmul_TFLOPs"].items())
    print(f"\n{report['device']}  torch {report['torch']}  copy bandwidth "
          f"{report['copy_bandwidth_GBps']:.0f} GB/s  matrix products {mm} TFLOP/s")
    print("floor: the larger of bytes / copy bandwidth and products / matrix rate (b / m: which); "
          "clock: graph = every column graph-replayed, eager = every column one call at a time; "
          "x NAME: NAME's time / ours; !: a failed float64 check")
    for mode, title, names in (("fwd", "forward", FWD_ANCHORS),
                               ("fwdbwd", "forward+backward", FWD_BWD_ANCHORS)):
        if not any(mode in r for r in rows):
            continue
        print(f"\n{title}")
        head = "".join(f" {'x ' + a:>16s}" for a in names)
        print(f"{'row':58s} {'path':>9s} {'clock':>5s} {'floor us':>10s} {'ours us':>9s} "
              f"{'%floor':>6s}{head} {'x best':>7s}  sdpa picks")
        for r in rows:
            m = r.get(mode)
            if not m:
                continue
            xs = "".join(f" {_x_cell(m, a):>16s}" for a in names)
            ours = f"{m['ms'] * 1e3:.1f}{_mark(m, 'ours')}" if "ms" in m else "error"
            pct = f"{m['pct_floor']:.0f}%" if "pct_floor" in m else "-"
            best = f"{m['speedup_vs_best']:.2f}" if m.get("speedup_vs_best") else "-"
            floor = f"{m['floor_ms'] * 1e3:.1f} {m['bound'][0]}"
            print(f"{r['case']:58s} {m.get('path', '-'):>9s} {m['clock']:>5s} {floor:>10s} "
                  f"{ours:>9s} {pct:>6s}{xs} {best:>7s}  {m.get('sdpa_default', '-')}")
    print_ab(rows)
    for r in rows:
        if "error" in r:
            print(f"{r['case']}: failed: {r['error']}")
    errors = sorted({f"{name}: {c['error']}" for r in rows for mode, _ in MODES
                     for name, c in (r.get(mode) or {}).get("columns", {}).items()
                     if "error" in c})
    if errors:
        print("\nn/a columns: " + "; ".join(errors))


def print_ab(rows: Sequence[dict]) -> None:
    """--ab: per mode and row, ours and each setting's time on the same inputs and clock, and
    ours / setting (over 1: the setting is faster)."""
    settings = sorted({a for r in rows for m, _ in MODES for a in (r.get(m) or {}).get("ab", {})})
    if not settings:
        return
    for mode, title in (("fwd", "forward"), ("fwdbwd", "forward+backward")):
        print(f"\nA/B, {title} (us; x: ours / the setting's; path of each)")
        print(f"{'row':58s} {'ours':>16s}" + "".join(f" {s[-30:]:>30s}" for s in settings))
        for r in rows:
            m = r.get(mode) or {}
            if "ms" not in m:
                continue
            cells = []
            for s in settings:
                a = m.get("ab", {}).get(s)
                cells.append(f" {a['ms'] * 1e3:13.1f} {a['x_ours']:5.3f}x {a['path']:>8s}"
                             if a else f" {'-':>30s}")
            print(f"{r['case']:58s} {m['ms'] * 1e3:8.1f} {m.get('path', '-'):>7s}" + "".join(cells))


def parse_cases(text: Optional[str]) -> List[Row]:
    """--cases: comma-separated row names (ragged_rows.Row.name), any sizes; None: ROWS."""
    if not text:
        return list(ROWS)
    return [parse_row(name) for name in text.split(",")]


# Nominal H200 rates for --list's floors (the run measures its own).
LIST_COPY_BYTES_PER_S = 4.2e12
LIST_MATMUL_FLOP_PER_S = 680e12


def list_rows(cases: Optional[str], seed: int = 0) -> int:
    """--list: each row's drawn sizes, floors at nominal H200 rates and the padded anchors'
    bytes, on the CPU (what a run will cost before it is made)."""
    try:
        rows = parse_cases(cases)
    except ValueError as exc:
        print(f"rocm-attn bench small-seq --ragged: {exc}", file=sys.stderr)
        return 2
    print(f"{'row':58s} {'heads':>5s} {'cands':>7s} {'keys':>8s} {'max q/kv':>10s} "
          f"{'fwd floor us':>13s} {'fwd+bwd':>9s} {'padded GiB':>10s}  what")
    for row in rows:
        n = draw_lengths(row, seed)
        fwd, fb = floors(row, n, LIST_COPY_BYTES_PER_S, LIST_MATMUL_FLOP_PER_S)
        print(f"{row.name:58s} {row.heads:>5s} {n.total_q:7d} {n.total_kv:8d} "
              f"{f'{n.max_q}/{n.max_kv}':>10s} {fwd.ms * 1e3:11.0f} {fwd.bound[0]} "
              f"{fb.ms * 1e3:7.0f} {fb.bound[0]} {padded_bytes(row, n, True) / 2**30:10.1f}  "
              f"{row.label}")
    return 0


def run(rows: Sequence[Row], seed: int = 0, anchors: bool = True, fwd_only: bool = False,
        clock: str = "auto", json_path=None, show_progress: bool = True,
        command: str = "", ab: Sequence[str] = ()) -> dict:
    """Times ``rows`` and returns the report (written to ``json_path`` after every row)."""
    bw = copy_bandwidth()
    matmul = {name: matmul_throughput(dt) for name, dt in (("bf16", torch.bfloat16),
                                                          ("fp16", torch.float16))
              if any(r.dtype == name for r in rows)}
    report = {"device": device_name(), "torch": torch.__version__,
              "copy_bandwidth_GBps": bw / 1e9,
              "matmul_TFLOPs": {k: v / 1e12 for k, v in matmul.items()}, "seed": seed,
              "clock": "per row and mode: graph = every column graph-replayed (all captured), "
                       "eager = every column one call at a time between events",
              "command": command or command_line([]),
              "date": time.strftime("%Y-%m-%d", time.gmtime()), "rows": []}
    for row in progress(list(rows), "small-seq ragged", show_progress):
        try:
            result = bench_row(row, bw, matmul, seed, anchors=anchors, fwd_only=fwd_only,
                               clock=clock, ab=ab)
        except Exception as exc:  # noqa: BLE001  (a row that fails is reported; the run goes on)
            result = {"case": row.name, "label": row.label,
                      "error": f"{type(exc).__name__}: {str(exc)[:300]}"}
            print(f"note: {row.name} failed: {result['error']}", file=sys.stderr)
        if "error" in result:
            _release(collect=True)
        report["rows"].append(result)
        if json_path:  # after every row: a run cut short still leaves its finished rows
            json_path.write_text(json.dumps(report, indent=1))
    return report


def command_line(argv: Sequence[str]) -> str:
    """The run's command as the docs quote it: the suite's flags without ``--json PATH`` (a path
    of the machine that ran it)."""
    words, skip = [], False
    for word in argv:
        if skip:
            skip = False
        elif word == "--json":
            skip = True
        elif not word.startswith("--json="):
            words.append(word)
    return " ".join(["rocm-attn bench small-seq"] + words)


def main_ragged(args, argv: Sequence[str] = ()) -> int:
    """``--ranking --ragged`` of rocm_attn/bench/small_seq.py (its parsed arguments and the
    flags they came from)."""
    try:
        rows = parse_cases(args.cases)
    except ValueError as exc:
        print(f"rocm-attn bench small-seq --ragged: {exc}", file=sys.stderr)
        return 2
    report = run(rows, args.seed, anchors=not args.no_anchors, fwd_only=args.fwd_only,
                 clock=args.clock, json_path=args.json, show_progress=not args.no_progress,
                 command=command_line(argv), ab=args.ab)
    print_rows(report)
    failed = [f"{r['case']} {c}" for r in report["rows"] for c in checks_failed(r)]
    if failed:
        print("\nfailed float64 checks: " + ", ".join(failed), file=sys.stderr)
    ours = [c for c in failed if c.endswith("/ours") or f"/{AB_PREFIX}" in c]
    return 1 if ours else 0
