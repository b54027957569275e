"""Each GPU kernel of one ragged-request row, ours beside torch's anchors, from torch's profiler.

Usage: python3 tools/diag/ragged_row_profile.py ROW [bwd] [calls] [NAME=VALUE ...]
ROW is a ragged row name (``rocm-attn bench small-seq --ranking --ragged --list`` prints them,
e.g. ``u128_c100-300_k1000-4000_h8kv2_d128_bf16``), its lengths drawn as the benchmark draws
them (seed 0). Columns profiled: ours (``fused_attn_small_seq``), ``flash_varlen`` (forward
only) and ``varlen_attn``; ``bwd`` adds the backward to each. NAME=VALUE: launch tuning values
for our calls (rocm_attn.tuning names, e.g. small_seq_flash_route=0). ``calls``: only our column,
called three times with no profiler, for Nsight Compute to pick one launch of:

    ncu --section WarpStateStats --section Occupancy -k regex:tiled --launch-skip 2 \
        --launch-count 1 python3 tools/diag/ragged_row_profile.py ROW calls

It answers where a column's time goes (which kernels, how many launches, what share each
takes), e.g. what the flash route adds to flash's own kernels. Needs a CUDA GPU.
"""
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # this source tree's package
import rocm_attn  # noqa: E402
from rocm_attn.bench import ragged_rows, small_seq_ragged  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from ranking_row_call import kernel_times  # noqa: E402  (the same per-kernel table)


def profile(step, reps: int = 3):
    for _ in range(2):
        step()
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        for _ in range(reps):
            step()
        torch.cuda.synchronize()
    return [(name, t / reps, n / reps) for name, t, n in kernel_times(prof)]


def main(argv):
    if not argv:
        sys.exit(__doc__)
    row = ragged_rows.parse_row(argv[0])
    backward = "bwd" in argv[1:]
    tuning = {a.split("=", 1)[0]: int(a.split("=", 1)[1]) for a in argv[1:] if "=" in a}
    n = ragged_rows.draw_lengths(row, 0)
    x = small_seq_ragged.make_set(row, n, "cuda", 0)
    cols = {"ours": small_seq_ragged.ours_column(row, n, x, backward)}
    for name, col in small_seq_ragged.anchor_columns(row, n, x, "not profiled", backward).items():
        if name in ("flash_varlen", "varlen_attn") and not isinstance(col, str):
            cols[name] = col
    if "calls" in argv[1:]:
        step = cols["ours"].step(backward)
        with rocm_attn.tuning.override(**tuning):
            for _ in range(3):
                step()
        torch.cuda.synchronize()
        return
    print(f"{row.name}{' fwd+bwd' if backward else ' fwd'} on {torch.cuda.get_device_name()}: "
          f"{n.total_q} queries, {n.total_kv} keys, max {n.max_q} x {n.max_kv}")
    for name, col in cols.items():
        if name == "ours":
            with rocm_attn.tuning.override(**tuning):
                rows = profile(col.step(backward))
        else:
            rows = profile(col.step(backward))
        whole = sum(t for _, t, _ in rows)
        print(f"\n{name}: {whole:.1f} us of kernels per call")
        for kname, t, launches in rows:
            print(f"{t:10.1f} us {100 * t / whole:5.1f}%  x{launches:g}  {kname[:140]}")


if __name__ == "__main__":
    main(sys.argv[1:])
