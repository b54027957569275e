"""What a benchmark needs before it starts: GPUs, and for the kernel suites the extension.

Benchmarks time GPU kernels with device events; there is nothing meaningful to run on a CPU,
so each suite checks first and exits with a message naming what is missing and the fix.
"""

from __future__ import annotations

import sys
from typing import Optional

import torch


def gpu_problem(gpus: int = 1, kernels: bool = True,
                cpu_alternative: Optional[str] = None) -> Optional[str]:
    """Why a benchmark cannot run here (None when it can); ``cpu_alternative`` is the command
    that runs the same suite on a CPU, where it has a CPU mode."""
    found = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if found == 0:
        build = ("a CPU-only build" if torch.version.cuda is None and torch.version.hip is None
                 else "a GPU build, but no device is visible")
        return (f"benchmarks need a GPU (CUDA or ROCm); torch {torch.__version__} is {build}. "
                "Run them on an MI300/MI200 or H100/H200 machine with a GPU build of torch, "
                "after building the kernels (docs/install.md: GPU build). On a CPU machine "
                + (f"time the CPU path with `{cpu_alternative}`, or run " if cpu_alternative
                   else "use ")
                + "`rocm-attn demo` or `rocm-attn selftest` instead.")
    if found < gpus:
        return f"this benchmark needs {gpus} GPUs, found {found}; pass a smaller --cp"
    if kernels:
        from .. import _ext

        if not _ext.HAS_EXTENSION:
            return (f"the compiled kernels are not loaded ({_ext.extension_error()}). Build them "
                    "against this GPU torch: `python3 -m pip install --no-build-isolation -e .` "
                    "(needs nvcc for a CUDA torch, hipcc for a ROCm torch); `rocm-attn info` "
                    "shows what is built.")
    return None


def require_gpu(suite: str, gpus: int = 1, kernels: bool = True,
                cpu_alternative: Optional[str] = None) -> bool:
    """Print the problem to stderr and return False when the benchmark cannot run here."""
    problem = gpu_problem(gpus, kernels, cpu_alternative)
    if problem:
        print(f"rocm-attn bench {suite}: {problem}", file=sys.stderr)
        return False
    return True
