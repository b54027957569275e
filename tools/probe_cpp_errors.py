"""Probe: a C++ TORCH_CHECK in the extension must surface as a Python RuntimeError."""
import torch

import rocm_attn  # noqa: F401

q = torch.randn(4, 2, 64, device="cuda", dtype=torch.bfloat16)
k = torch.randn(8, 2, 64, device="cuda", dtype=torch.bfloat16)
cu = torch.arange(5, dtype=torch.int32, device="cuda")
try:
    torch.ops.rocm_attn.small_seq_fwd(q, k, k, cu, cu.to(torch.int64), None, 4, 1.0, False)
    print("probe: no error raised (BUG)")
except RuntimeError as exc:
    print("probe: RuntimeError raised as expected:", str(exc).splitlines()[0][:120])
