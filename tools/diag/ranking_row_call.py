"""Three calls of fused_attn_small_seq on one ranking row, for a profiler to pick one launch of.

Usage: python3 tools/diag/ranking_row_call.py ROW [bwd] [times] [NAME=VALUE ...]
ROW is a row name of the ranking bench (``u4096_c128_kv256f_hkv2_d128``: users, candidates,
history with ``f`` fixed or ``r`` ragged 1..history keys, kv heads, head dim; 8 q heads, bf16),
its inputs drawn as the bench draws them; ``bwd``: each call also runs the backward. For
example, the warpgroup forward on 4096 users x 128 candidates x 256 keys with 2 kv heads:

    ncu --set full -k regex:warpgroup --launch-skip 2 --launch-count 1 -o wg \\
        python3 tools/diag/ranking_row_call.py u4096_c128_kv256f_hkv2_d128

``times``: the last call runs under torch's profiler, and each GPU kernel's device time is
printed (which kernels a call launches and what share of it each takes, e.g. the backward's
Delta pass, dQ and dK / dV kernels). NAME=VALUE: launch tuning values for the calls
(rocm_attn.tuning names, e.g. small_seq_tiled_bwd_two_tile=0).

Needs a GPU build of the extension.
"""
import sys
from collections import defaultdict
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # this source tree's package
import rocm_attn  # noqa: E402
from rocm_attn.bench.small_seq_ranking import make_rank_inputs, parse_row_name  # noqa: E402


def kernel_times(prof):
    """(name, device us, launches) per GPU kernel of a profile, longest first."""
    total, count = defaultdict(float), defaultdict(int)
    for e in prof.events():
        if e.device_type == torch.autograd.DeviceType.CUDA:
            total[e.name] += e.device_time_total
            count[e.name] += 1
    return sorted(((n, total[n], count[n]) for n in total), key=lambda r: -r[1])


def main(argv):
    row = parse_row_name(argv[0])
    if row is None:
        sys.exit(f"not a ranking row name: {argv[0]!r} (e.g. u4096_c128_kv256f_hkv2_d128)")
    backward = "bwd" in argv[1:]
    times = "times" in argv[1:]
    tuning = dict(a.split("=", 1) for a in argv[1:] if "=" in a)
    x = make_rank_inputs(row, torch.bfloat16, "cuda", torch.Generator().manual_seed(0))
    q, k, v = (x[n].requires_grad_(backward) for n in ("q", "k", "v"))
    dout = None

    def call():
        nonlocal dout
        out = rocm_attn.fused_attn_small_seq(q, k, v, x["cu_q"], x["cu_kv"],
                                             max_seqlen_q=x["cands"], max_seqlen_kv=x["hist"])
        if backward:
            dout = torch.randn_like(out) if dout is None else dout
            torch.autograd.grad(out, (q, k, v), dout)  # no .grad to accumulate into

    with rocm_attn.tuning.override(**{n: int(val) for n, val in tuning.items()}):
        for _ in range(2):
            call()
        torch.cuda.synchronize()
        if not times:
            call()
            torch.cuda.synchronize()
            return
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
            call()
            torch.cuda.synchronize()
    rows = kernel_times(prof)
    whole = sum(t for _, t, _ in rows)
    print(f"{argv[0]}{' fwd+bwd' if backward else ' fwd'}: {whole:.0f} us of kernels "
          f"({torch.cuda.get_device_name()})")
    for name, t, n in rows:
        print(f"{t:10.0f} us {100 * t / whole:5.1f}%  x{n}  {name[:150]}")


if __name__ == "__main__":
    main(sys.argv[1:])
