"""Where the host time of one eager fused_attn_small_seq call goes (GPU machine).

The small cases (h1 d128 kv4: a 25 us kernel) are bound by host work when called eagerly, so
this times each piece of the Python path and the autograd round trip on the host clock, and
prints torch.profiler's CPU table of one forward+backward step. Diagnostic only: the
benchmark of record is tools/bench_small_seq.py.

Usage: python tools/profile_small_seq_host.py [--batch 30720] [--calls 2000]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402

import rocm_attn  # noqa: E402
from rocm_attn import errors, ops, small_seq  # noqa: E402
from rocm_attn.bench.small_seq import make_inputs  # noqa: E402


def host_us(fn, calls):
    """Mean host time per call in us (the GPU is drained every 200 calls, untimed)."""
    for _ in range(20):
        fn()
    torch.cuda.synchronize()
    total = 0.0
    done = 0
    while done < calls:
        n = min(200, calls - done)
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        total += time.perf_counter() - t0
        torch.cuda.synchronize()
        done += n
    return 1e6 * total / calls


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--batch", type=int, default=30720)
    ap.add_argument("--calls", type=int, default=2000)
    args = ap.parse_args(argv)
    x = make_inputs(args.batch, 1, 1, 128, 4, torch.bfloat16, torch.Generator().manual_seed(0))
    q, k, v, cu_q, cu_kv = x["q"], x["k"], x["v"], x["cu_q"], x["cu_kv"]
    scale = 128 ** -0.5
    op = torch.ops.rocm_attn.small_seq_fwd.default
    qg, kg, vg = (t.detach().clone().requires_grad_() for t in (q, k, v))
    dout = torch.randn_like(q)

    def step():
        out = rocm_attn.fused_attn_small_seq(qg, kg, vg, cu_q, cu_kv, 1, 4)
        torch.autograd.grad(out, (qg, kg, vg), dout)

    x2 = torch.randn(1024, device="cuda", requires_grad=True)
    g2 = torch.ones(1024, device="cuda")

    def engine_only():
        torch.autograd.grad(x2 * 2, (x2,), g2)

    plan, backward_plan = ops._plans(q, k, 4)
    out_ref, lse_ref, _ = op(q, k, v, cu_q, cu_kv, None, 4, scale, False, plan, backward_plan)

    def bwd_below_autograd():
        with torch._C._AutoDispatchBelowAutograd():
            torch.ops.rocm_attn.small_seq_bwd.default(dout, q, k, v, out_ref, lse_ref, None,
                                                      cu_q, cu_kv, None, 4, scale,
                                                      backward_plan)

    def below_autograd():
        with torch._C._AutoDispatchBelowAutograd():
            op(q, k, v, cu_q, cu_kv, None, 4, scale, False, plan, backward_plan)

    pieces = {
        "fused_attn_small_seq fwd (public API)": lambda: rocm_attn.fused_attn_small_seq(
            q, k, v, cu_q, cu_kv, 1, 4),
        "  _validate": lambda: small_seq._validate(q, k, v, cu_q, cu_kv, None, 1, 4, None,
                                                   "thd_thd_thd"),
        "  _use_kernel": lambda: small_seq._use_kernel(q, k, v, "auto"),
        "  errors.validate_mode": lambda: errors.validate_mode(None),
        "  ops.small_seq_forward": lambda: ops.small_seq_forward(q, k, v, cu_q, cu_kv, None, 4,
                                                                 scale, False),
        "  op below autograd": below_autograd,
        "  ops._plans (cached plan)": lambda: ops._plans(q, k, 4),
        "  op through dispatch": lambda: op(q, k, v, cu_q, cu_kv, None, 4, scale, False, plan,
                                            backward_plan),
        "fwd with grad (autograd node)": lambda: rocm_attn.fused_attn_small_seq(
            qg, kg, vg, cu_q, cu_kv, 1, 4),
        "fwd + autograd.grad": step,
        "autograd.grad of x * 2 (engine alone)": engine_only,
        "bwd op below autograd": bwd_below_autograd,
        "torch.empty x3 (allocator)": lambda: [torch.empty_like(q) for _ in range(3)],
    }
    print(f"{'piece':40s} {'host us/call':>12s}")
    for name, fn in pieces.items():
        print(f"{name:40s} {host_us(fn, args.calls):12.1f}", flush=True)

    from torch.profiler import ProfilerActivity, profile
    for _ in range(20):
        step()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(50):
            step()
        torch.cuda.synchronize()
    print(prof.key_averages().table(sort_by="cpu_time_total", row_limit=25))
    return 0


if __name__ == "__main__":
    sys.exit(main())
