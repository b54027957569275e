"""Three calls of fused_attn_small_seq on one ranking row, for a profiler to pick one launch of.

Usage: python3 tools/diag/ranking_row_call.py ROW [bwd]
ROW is a row name of the ranking bench (``u4096_c128_kv256f_hkv2_d128``: users, candidates,
history with ``f`` fixed or ``r`` ragged 1..history keys, kv heads, head dim; 8 q heads, bf16),
its inputs drawn as the bench draws them; ``bwd``: each call also runs the backward. For
example, the warpgroup forward on 4096 users x 128 candidates x 256 keys with 2 kv heads:

    ncu --set full -k regex:warpgroup --launch-skip 2 --launch-count 1 -o wg \\
        python3 tools/diag/ranking_row_call.py u4096_c128_kv256f_hkv2_d128

Needs a GPU build of the extension.
"""
import sys

import torch

import rocm_attn
from rocm_attn.bench.small_seq_ranking import make_rank_inputs, parse_row_name


def main(argv):
    row = parse_row_name(argv[0])
    if row is None:
        sys.exit(f"not a ranking row name: {argv[0]!r} (e.g. u4096_c128_kv256f_hkv2_d128)")
    backward = "bwd" in argv[1:]
    x = make_rank_inputs(row, torch.bfloat16, "cuda", torch.Generator().manual_seed(0))
    q, k, v = (x[n].requires_grad_(backward) for n in ("q", "k", "v"))
    for _ in range(3):
        out = rocm_attn.fused_attn_small_seq(q, k, v, x["cu_q"], x["cu_kv"],
                                             max_seqlen_q=x["cands"], max_seqlen_kv=x["hist"])
        if backward:
            out.backward(torch.randn_like(out))
    torch.cuda.synchronize()


if __name__ == "__main__":
    main(sys.argv[1:])
