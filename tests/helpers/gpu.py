"""Shared pieces of the GPU test files: why a file skips, and a poisoned allocator."""

from typing import Optional

import pytest
import torch

import rocm_attn


def why_no_kernels(thd_ops: bool = False) -> Optional[str]:
    """Why this machine cannot run the compiled kernels (None when it can)."""
    if not torch.cuda.is_available():
        return "no CUDA/ROCm GPU"
    if not rocm_attn._ext.HAS_EXTENSION:
        return f"compiled extension not loaded: {rocm_attn._ext.extension_error()}"
    if thd_ops and not rocm_attn.thd.HAS_KERNELS:
        return "the compiled extension has no THD ops (rebuild)"
    return None


def gpu_marks(thd_ops: bool = False) -> list:
    """A GPU test file's pytestmark: marked gpu, skipped with the reason where it cannot run."""
    why = why_no_kernels(thd_ops)
    return [pytest.mark.gpu, pytest.mark.skipif(why is not None, reason=str(why))]


def poison_allocator(device):
    """Fill the caching allocator's free blocks with 0xFF bytes (NaN for every float dtype), so
    that the next torch.empty calls return NaN memory.

    First a fixed set of blocks (large pool: > 1 MiB requests; small pool: <= 1 MiB, 2 MiB
    segments), reused from one call to the next; then one tensor per remaining free block of
    the cache (exact sizes, so best-fit hands out those very blocks), which poisons what earlier
    tests left behind. Where a request splits a larger block and the device has no room for the
    next one, the blocks taken so far are poisoned and the rest left: on a full device (a long
    GPU session fills the cache) the poison is partial rather than an out-of-memory error.
    Everything is freed again before returning; the cache does not grow."""
    blocks = [torch.empty(n << 20, dtype=torch.uint8, device=device) for n in (256, 64, 16, 4)]
    blocks += [torch.empty(512 << 10, dtype=torch.uint8, device=device) for _ in range(32)]
    blocks += [torch.empty(16 << 10, dtype=torch.uint8, device=device) for _ in range(64)]
    if device.type == "cuda":
        free = [blk["size"] for seg in torch.cuda.memory_snapshot()
                if seg.get("device", device.index) == device.index
                for blk in seg["blocks"] if blk["state"] == "inactive"]
        for n in sorted(free, reverse=True):
            try:
                blocks.append(torch.empty(n, dtype=torch.uint8, device=device))
            except torch.OutOfMemoryError:
                break
    for blk in blocks:
        blk.fill_(0xFF)
    del blocks
