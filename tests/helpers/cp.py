"""Context-parallel test helpers: problem construction, the comparison against the float64
reference, and a process-group stand-in (used by test_cp.py, test_cp_masks.py,
test_cp_ring_schedule.py and test_attention.py, and by their spawned workers)."""

from __future__ import annotations

from typing import Optional

import torch

F64 = torch.float64


def cu_of(lens) -> torch.Tensor:
    """int32 cu_seqlens of a list of lengths."""
    c = [0]
    for n in lens:
        c.append(c[-1] + n)
    return torch.tensor(c, dtype=torch.int32)


def rand_poisoned(gen, shape, valid, dtype):
    """Random rows where ``valid`` (bool over dim 0), NaN elsewhere, in ``dtype``."""
    x = torch.randn(shape, generator=gen, dtype=F64)
    x[~valid] = float("nan")  # poison: padding and slack rows must never be read
    return x.to(dtype)


def compare(name: str, got: torch.Tensor, want: torch.Tensor, tol: float) -> Optional[str]:
    """Why ``got`` differs from the reference ``want`` (None: within ``tol * max(1, |want|)``,
    same infinities, no NaN)."""
    got = got.to(F64)
    want = want.to(F64)
    if got.shape != want.shape:
        return f"{name}: shape {tuple(got.shape)} != reference {tuple(want.shape)}"
    nan = torch.isnan(got)
    if nan.any():
        return f"{name}: {int(nan.sum())} NaN values"
    inf_g, inf_w = torch.isinf(got), torch.isinf(want)
    if not torch.equal(inf_g, inf_w) or not torch.equal(got[inf_g], want[inf_w]):
        return f"{name}: infinite entries differ from the reference"
    fin = ~inf_w
    if not fin.any():
        return None
    err = (got[fin] - want[fin]).abs().max().item()
    scale = max(1.0, want[fin].abs().max().item())
    if err > tol * scale:
        return f"{name}: max abs error {err:.3e} > {tol:.1e} * {scale:.3g}"
    return None


class FakeGroup:
    """size()/rank() only: attn_with_cp checks arguments before any communication."""

    def __init__(self, size: int, rank: int = 0):
        self._size, self._rank = size, rank

    def size(self):
        return self._size

    def rank(self):
        return self._rank


def why_no_flash() -> Optional[str]:
    """Why torch_flash cannot run here (None: a GPU with aten's flash attention)."""
    if not torch.cuda.is_available():
        return "no CUDA/ROCm GPU"
    if not hasattr(torch.ops.aten, "_flash_attention_forward"):
        return "this torch build has no aten._flash_attention_forward"
    return None
