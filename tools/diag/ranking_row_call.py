"""Three calls of fused_attn_small_seq on one ranking row, for a profiler to pick one launch of.

Usage: python3 tools/diag/ranking_row_call.py USERS CANDIDATES HISTORY KV_HEADS [r] [bwd]
(d 128, 8 q heads, bf16; ``r``: ragged histories of 1..HISTORY keys; ``bwd``: each call also
runs the backward). For example, the warpgroup forward on 4096 users x 128 candidates x 256
keys with 2 kv heads:

    ncu --set full -k regex:warpgroup --launch-skip 2 --launch-count 1 -o wg \\
        python3 tools/diag/ranking_row_call.py 4096 128 256 2

Needs a GPU build of the extension.
"""
import sys

import torch

import rocm_attn


def main(argv):
    users, cands, hist, h_kv = (int(x) for x in argv[:4])
    ragged = "r" in argv[4:]
    backward = "bwd" in argv[4:]
    d, h_q, dev = 128, 8, "cuda"
    gen = torch.Generator(device=dev).manual_seed(0)
    lens = (torch.randint(1, hist + 1, (users,), device=dev, generator=gen) if ragged
            else torch.full((users,), hist, device=dev))
    cu_kv = torch.zeros(users + 1, dtype=torch.int32, device=dev)
    cu_kv[1:] = torch.cumsum(lens, 0)
    cu_q = torch.arange(0, users * cands + 1, cands, dtype=torch.int32, device=dev)
    total_kv = int(cu_kv[-1])
    q = torch.randn(users * cands, h_q, d, device=dev, dtype=torch.bfloat16,
                    requires_grad=backward)
    k = torch.randn(total_kv, h_kv, d, device=dev, dtype=torch.bfloat16, requires_grad=backward)
    v = torch.randn(total_kv, h_kv, d, device=dev, dtype=torch.bfloat16, requires_grad=backward)
    for _ in range(3):
        out = rocm_attn.fused_attn_small_seq(q, k, v, cu_q, cu_kv, max_seqlen_q=cands,
                                             max_seqlen_kv=hist)
        if backward:
            out.backward(torch.randn_like(out))
    torch.cuda.synchronize()


if __name__ == "__main__":
    main(sys.argv[1:])
